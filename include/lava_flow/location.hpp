// lava-flow C++17 wrapper, where processes run: lf::Scope, lf::Location.
// One part of lava_flow.hpp, which includes them all and says how the wrapper works: include
// that.
#ifndef LAVA_FLOW_LOCATION_HPP
#define LAVA_FLOW_LOCATION_HPP

#include <cstdint>
#include <optional>
#include <string>

#include "error.hpp"

namespace lf {

enum class Scope : std::uint32_t { Local = LF_SCOPE_LOCAL, Remote = LF_SCOPE_REMOTE };

inline const char* to_string(Scope scope) noexcept {
    return lf_scope_str(static_cast<lf_scope>(scope));
}

/// Where a process runs: hostname, NUMA node and GPU index.
class Location {
public:
    /// This process's location.
    static Expected<Location> detect(nothrow_t) noexcept {
        lf_location* raw = nullptr;
        if (lf_status s = lf_location_detect(&raw); s != LF_OK) return detail::failure(s);
        return Location(raw);
    }

    /// A location built by hand.
    static Expected<Location> create(nothrow_t, const std::string& hostname,
                                     std::optional<std::uint32_t> node_id = std::nullopt,
                                     std::optional<std::uint32_t> device_id = std::nullopt) noexcept {
        lf_location* raw = nullptr;
        if (lf_status s = lf_location_new(hostname.c_str(), detail::id_or_unset(node_id),
                                          detail::id_or_unset(device_id), &raw);
            s != LF_OK)
            return detail::failure(s);
        return Location(raw);
    }

    /// The location of process `name` in a JSON config file.
    static Expected<Location> from_config(nothrow_t, const std::string& path, const std::string& name) noexcept {
        lf_location* raw = nullptr;
        if (lf_status s = lf_location_from_config(path.c_str(), name.c_str(), &raw); s != LF_OK)
            return detail::failure(s);
        return Location(raw);
    }

    Expected<std::string> hostname(nothrow_t) const noexcept {
        const char* out = nullptr;
        if (lf_status s = lf_location_hostname(get(), &out); s != LF_OK) return detail::failure(s);
        return std::string(out);
    }

    Expected<std::optional<std::uint32_t>> node_id(nothrow_t) const noexcept {
        std::int64_t out = LF_UNSET;
        if (lf_status s = lf_location_node_id(get(), &out); s != LF_OK) return detail::failure(s);
        return detail::optional_id(out);
    }

    Expected<std::optional<std::uint32_t>> device_id(nothrow_t) const noexcept {
        std::int64_t out = LF_UNSET;
        if (lf_status s = lf_location_device_id(get(), &out); s != LF_OK) return detail::failure(s);
        return detail::optional_id(out);
    }

    /// Whether `peer` runs on this location's host.
    Expected<Scope> scope_to(nothrow_t, const Location& peer) const noexcept {
        lf_scope out = LF_SCOPE_LOCAL;
        if (lf_status s = lf_scope_detect(get(), peer.get(), &out); s != LF_OK) return detail::failure(s);
        return static_cast<Scope>(out);
    }

#if LAVA_FLOW_EXCEPTIONS
    static Location detect() { return detect(nothrow).value(); }
    static Location create(const std::string& hostname,
                           std::optional<std::uint32_t> node_id = std::nullopt,
                           std::optional<std::uint32_t> device_id = std::nullopt) {
        return create(nothrow, hostname, node_id, device_id).value();
    }
    static Location from_config(const std::string& path, const std::string& name) {
        return from_config(nothrow, path, name).value();
    }
    std::string hostname() const { return hostname(nothrow).value(); }
    std::optional<std::uint32_t> node_id() const { return node_id(nothrow).value(); }
    std::optional<std::uint32_t> device_id() const { return device_id(nothrow).value(); }
    Scope scope_to(const Location& peer) const { return scope_to(nothrow, peer).value(); }
#endif

    const lf_location* get() const noexcept { return handle_.get(); }

private:
    explicit Location(lf_location* raw) : handle_(raw) {}
    detail::Owned<lf_location, lf_location_free> handle_;
};

}  // namespace lf

#endif  // LAVA_FLOW_LOCATION_HPP
