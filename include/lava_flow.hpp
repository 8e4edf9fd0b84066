// lava-flow C++17 wrapper: header-only, built on the C API in lava_flow.h alone.
//
// - Handles are move-only RAII types; their destructors call the C `_free` functions.
// - Failures throw lf::Error, which carries the lf_status and lava-flow's message.
// - Everything is in namespace `lf`.
#ifndef LAVA_FLOW_HPP
#define LAVA_FLOW_HPP

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "lava_flow.h"

namespace lf {

/// A failed lava-flow call: `status()` is the class of failure, `what()` the detail.
class Error : public std::runtime_error {
public:
    Error(lf_status status, const std::string& message)
        : std::runtime_error(message), status_(status) {}
    lf_status status() const noexcept { return status_; }

private:
    lf_status status_;
};

namespace detail {

/// Throws lf::Error for any status but LF_OK, with the calling thread's last error message.
inline void check(lf_status status) {
    if (status != LF_OK) {
        throw Error(status, lf_last_error_message());
    }
}

/// A unique_ptr whose deleter is a C `_free` function.
template <typename T, void (*Free)(T*)>
struct Deleter {
    void operator()(T* p) const noexcept { Free(p); }
};
template <typename T, void (*Free)(T*)>
using Owned = std::unique_ptr<T, Deleter<T, Free>>;

inline std::optional<std::uint32_t> optional_id(std::int64_t id) {
    if (id == LF_UNSET) return std::nullopt;
    return static_cast<std::uint32_t>(id);
}

inline std::int64_t id_or_unset(std::optional<std::uint32_t> id) {
    return id ? static_cast<std::int64_t>(*id) : LF_UNSET;
}

}  // namespace detail

/// The library's runtime version, "MAJOR.MINOR.PATCH".
inline std::string version() { return lf_version(); }

enum class Scope : std::uint32_t { Local = LF_SCOPE_LOCAL, Remote = LF_SCOPE_REMOTE };

inline const char* to_string(Scope scope) noexcept {
    return lf_scope_str(static_cast<std::uint32_t>(scope));
}

/// Where a process runs: hostname, NUMA node and GPU index.
class Location {
public:
    /// This process's location.
    static Location detect() {
        lf_location* raw = nullptr;
        detail::check(lf_location_detect(&raw));
        return Location(raw);
    }

    /// A location built by hand.
    static Location create(const std::string& hostname,
                           std::optional<std::uint32_t> node_id = std::nullopt,
                           std::optional<std::uint32_t> device_id = std::nullopt) {
        lf_location* raw = nullptr;
        detail::check(lf_location_new(hostname.c_str(), detail::id_or_unset(node_id),
                                      detail::id_or_unset(device_id), &raw));
        return Location(raw);
    }

    /// The location of process `name` in a JSON config file.
    static Location from_config(const std::string& path, const std::string& name) {
        lf_location* raw = nullptr;
        detail::check(lf_location_from_config(path.c_str(), name.c_str(), &raw));
        return Location(raw);
    }

    std::string hostname() const {
        const char* out = nullptr;
        detail::check(lf_location_hostname(get(), &out));
        return out;
    }

    std::optional<std::uint32_t> node_id() const {
        std::int64_t out = LF_UNSET;
        detail::check(lf_location_node_id(get(), &out));
        return detail::optional_id(out);
    }

    std::optional<std::uint32_t> device_id() const {
        std::int64_t out = LF_UNSET;
        detail::check(lf_location_device_id(get(), &out));
        return detail::optional_id(out);
    }

    /// Whether `peer` runs on this location's host.
    Scope scope_to(const Location& peer) const {
        lf_scope out = LF_SCOPE_LOCAL;
        detail::check(lf_scope_detect(get(), peer.get(), &out));
        return static_cast<Scope>(out);
    }

    const lf_location* get() const noexcept { return handle_.get(); }

private:
    explicit Location(lf_location* raw) : handle_(raw) {}
    detail::Owned<lf_location, lf_location_free> handle_;
};

}  // namespace lf

#endif  // LAVA_FLOW_HPP
