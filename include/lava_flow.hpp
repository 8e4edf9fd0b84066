// lava-flow C++17 wrapper: header-only, built on the C API in lava_flow.h alone.
//
// - Handles are move-only RAII types; their destructors call the C `_free` functions.
// - Failures throw lf::Error, which carries the lf_status and lava-flow's message.
// - Everything is in namespace `lf`.
#ifndef LAVA_FLOW_HPP
#define LAVA_FLOW_HPP

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include <unistd.h>

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

/// Where memory lives: the `LF_MEMORY_*` values.
enum class Memory : std::uint32_t {
    CpuStandard = LF_MEMORY_CPU_STANDARD,
    CpuNuma = LF_MEMORY_CPU_NUMA,
    CpuHugepage2M = LF_MEMORY_CPU_HUGEPAGE_2MB,
    CpuHugepage1G = LF_MEMORY_CPU_HUGEPAGE_1GB,
    CpuGpuPinned = LF_MEMORY_CPU_GPU_PINNED,
    GpuDeviceLocal = LF_MEMORY_GPU_DEVICE_LOCAL,
    GpuHostVisible = LF_MEMORY_GPU_HOST_VISIBLE,
};

/// A buffer on its way to another process: the descriptor and the file descriptor it owns
/// (closed by the destructor unless `Context::import` or `send` consumed it).
class Export {
public:
    explicit Export(const lf_export& raw) : raw_(raw) {}
    Export(Export&& other) noexcept : raw_(other.raw_) { other.raw_.fd = -1; }
    Export& operator=(Export&& other) noexcept {
        if (this != &other) {
            reset();
            raw_ = other.raw_;
            other.raw_.fd = -1;
        }
        return *this;
    }
    Export(const Export&) = delete;
    Export& operator=(const Export&) = delete;
    ~Export() { reset(); }

    /// Sends the descriptor and its fd over a connected Unix socket (SCM_RIGHTS).
    void send(int socket) const { detail::check(lf_export_send(socket, &raw_)); }
    /// Receives one sent with `send`.
    static Export receive(int socket) {
        lf_export raw{};
        detail::check(lf_export_recv(socket, &raw));
        return Export(raw);
    }

    const lf_export& raw() const noexcept { return raw_; }
    /// Hands the descriptor (and the fd's ownership) to the caller.
    lf_export release() noexcept {
        lf_export out = raw_;
        raw_.fd = -1;
        return out;
    }

private:
    void reset() noexcept {
        if (raw_.fd >= 0) ::close(raw_.fd);
        raw_.fd = -1;
    }
    lf_export raw_;
};

/// Memory from a Context: CPU (standard, NUMA, huge pages, pinned) or GPU.
class Buffer {
public:
    std::size_t size() const {
        std::size_t out = 0;
        detail::check(lf_buffer_size(get(), &out));
        return out;
    }
    /// The location really obtained (a GPU request without a device falls back to CPU memory
    /// unless the context is strict: `fallback_reason()` says why).
    Memory location() const {
        std::uint32_t out = 0;
        detail::check(lf_buffer_location(get(), &out));
        return static_cast<Memory>(out);
    }
    std::size_t page_size() const {
        std::size_t out = 0;
        detail::check(lf_buffer_page_size(get(), &out));
        return out;
    }
    std::optional<std::string> fallback_reason() const {
        const char* out = nullptr;
        detail::check(lf_buffer_fallback_reason(get(), &out));
        if (out == nullptr) return std::nullopt;
        return std::string(out);
    }
    /// The host address; throws for GPU memory the host cannot map.
    void* data() const {
        void* out = nullptr;
        detail::check(lf_buffer_ptr(get(), &out));
        return out;
    }
    /// Copies in and out of any buffer, staged through the GPU where the host cannot map it.
    void write(std::size_t offset, const void* data, std::size_t size) const {
        detail::check(lf_buffer_write(get(), offset, data, size));
    }
    void read(std::size_t offset, void* out, std::size_t size) const {
        detail::check(lf_buffer_read(get(), offset, out, size));
    }
    Export export_() const {
        lf_export raw{};
        detail::check(lf_buffer_export(get(), &raw));
        return Export(raw);
    }

    const lf_buffer* get() const noexcept { return handle_.get(); }
    lf_buffer* get() noexcept { return handle_.get(); }

private:
    friend class Context;
    explicit Buffer(lf_buffer* raw) : handle_(raw) {}
    detail::Owned<lf_buffer, lf_free> handle_;
};

/// The per-process memory context; create one and share it.
class Context {
public:
    /// A context with the default settings (GPU if there is one, else CPU with a visible
    /// fallback), or with `config` (start from a zeroed `lf_context_config`).
    explicit Context(const lf_context_config* config = nullptr) {
        lf_context* raw = nullptr;
        detail::check(lf_context_create(config, &raw));
        handle_.reset(raw);
    }

    Buffer allocate(std::size_t size, Memory location = Memory::CpuStandard,
                    std::optional<std::uint32_t> numa_node = std::nullopt) const {
        lf_buffer* raw = nullptr;
        detail::check(lf_alloc(get(), size, static_cast<std::uint32_t>(location),
                               detail::id_or_unset(numa_node), 0, &raw));
        return Buffer(raw);
    }
    /// The location follows the scope between the two processes (see the README).
    Buffer allocate_auto(std::size_t size, const Location& mine, const Location& peer) const {
        lf_buffer* raw = nullptr;
        detail::check(lf_alloc_auto(get(), size, mine.get(), peer.get(), &raw));
        return Buffer(raw);
    }
    /// Maps (CPU) or imports (GPU) memory another process exported; consumes its fd.
    Buffer import(Export&& exported) const {
        lf_export raw = exported.release();
        lf_buffer* out = nullptr;
        detail::check(lf_import(get(), &raw, &out));
        return Buffer(out);
    }
    /// Copies between two buffers, on the GPU when both are this context's device memory.
    void copy(Buffer& dst, std::size_t dst_offset, const Buffer& src, std::size_t src_offset,
              std::size_t size) const {
        detail::check(lf_buffer_copy(get(), dst.get(), dst_offset, src.get(), src_offset, size));
    }
    /// Why there is no GPU, or nullopt when there is one.
    std::optional<std::string> gpu_unavailable_reason() const {
        const char* out = nullptr;
        detail::check(lf_context_gpu_unavailable_reason(get(), &out));
        if (out == nullptr) return std::nullopt;
        return std::string(out);
    }

    const lf_context* get() const noexcept { return handle_.get(); }

private:
    detail::Owned<lf_context, lf_context_free> handle_;
};

}  // namespace lf

#endif  // LAVA_FLOW_HPP
