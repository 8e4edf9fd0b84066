// lava-flow C++17 wrapper, memory: lf::Memory, lf::Export, lf::BufferView, lf::Buffer, lf::Context.
// One part of lava_flow.hpp, which includes them all and says how the wrapper works: include
// that.
#ifndef LAVA_FLOW_MEMORY_HPP
#define LAVA_FLOW_MEMORY_HPP

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <unistd.h>

#include "error.hpp"
#include "location.hpp"

namespace lf {

/// Where memory lives: the `LF_MEMORY_*` values.
enum class Memory : std::uint32_t {
    CpuStandard = LF_MEMORY_CPU_STANDARD,
    CpuNuma = LF_MEMORY_CPU_NUMA,
    CpuHugepage2M = LF_MEMORY_CPU_HUGEPAGE_2MB,
    CpuHugepage1G = LF_MEMORY_CPU_HUGEPAGE_1GB,
    CpuGpuPinned = LF_MEMORY_CPU_GPU_PINNED,
    GpuDeviceLocal = LF_MEMORY_GPU_DEVICE_LOCAL,
    GpuHostVisible = LF_MEMORY_GPU_HOST_VISIBLE,
    /// CUDA memory the application allocated and registered (never allocated by lava-flow).
    CudaDevice = LF_MEMORY_CUDA_DEVICE,
};

/// How a buffer came to be: the `LF_ORIGIN_*` values.
enum class Origin : std::uint32_t {
    Allocated = LF_ORIGIN_ALLOCATED,
    Registered = LF_ORIGIN_REGISTERED,
    Imported = LF_ORIGIN_IMPORTED,
    /// The caller's CUDA memory, entered with `Context::register_memory`.
    Cuda = LF_ORIGIN_CUDA,
};

/// How registered CUDA memory was allocated: the `LF_CUDA_KIND_*` values.
enum class CudaKind : std::uint32_t {
    None = LF_CUDA_KIND_NONE,
    Legacy = LF_CUDA_KIND_LEGACY,
    Vmm = LF_CUDA_KIND_VMM,
    Pool = LF_CUDA_KIND_POOL,
    Managed = LF_CUDA_KIND_MANAGED,
    Other = LF_CUDA_KIND_OTHER,
};

/// A buffer on its way to another process: the descriptor and the file descriptor it owns
/// (closed by the destructor unless `Context::import` or `release` took it).
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
    Expected<void> send(nothrow_t, int socket) const noexcept {
        return detail::done(lf_export_send(socket, &raw_));
    }
    /// Receives one sent with `send`.
    static Expected<Export> receive(nothrow_t, int socket) noexcept {
        lf_export raw{};
        if (lf_status s = lf_export_recv(socket, &raw); s != LF_OK) return detail::failure(s);
        return Export(raw);
    }

#if LAVA_FLOW_EXCEPTIONS
    void send(int socket) const { send(nothrow, socket).value(); }
    static Export receive(int socket) { return receive(nothrow, socket).value(); }
#endif

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

namespace detail {

/// What every buffer answers, owned (Buffer) or lent (BufferView): `Self::get()` gives the handle.
template <typename Self>
class BufferAccess {
public:
    Expected<std::size_t> size(nothrow_t) const noexcept {
        std::size_t out = 0;
        if (lf_status s = lf_buffer_size(handle(), &out); s != LF_OK) return failure(s);
        return out;
    }
    /// The location really obtained (a GPU request without a device falls back to CPU memory
    /// unless the context is strict: `fallback_reason()` says why).
    Expected<Memory> location(nothrow_t) const noexcept {
        lf_memory_kind out{};
        if (lf_status s = lf_buffer_location(handle(), &out); s != LF_OK) return failure(s);
        return static_cast<Memory>(out);
    }
    Expected<std::size_t> page_size(nothrow_t) const noexcept {
        std::size_t out = 0;
        if (lf_status s = lf_buffer_page_size(handle(), &out); s != LF_OK) return failure(s);
        return out;
    }
    Expected<std::optional<std::string>> fallback_reason(nothrow_t) const noexcept {
        const char* out = nullptr;
        if (lf_status s = lf_buffer_fallback_reason(handle(), &out); s != LF_OK) return failure(s);
        return optional_string(out);
    }
    Expected<Origin> origin(nothrow_t) const noexcept {
        lf_origin out{};
        if (lf_status s = lf_buffer_origin(handle(), &out); s != LF_OK) return failure(s);
        return static_cast<Origin>(out);
    }
    /// How registered CUDA memory was allocated; CudaKind::None for every other buffer.
    Expected<CudaKind> cuda_kind(nothrow_t) const noexcept {
        lf_cuda_kind out{};
        if (lf_status s = lf_buffer_cuda_kind(handle(), &out, nullptr); s != LF_OK) return failure(s);
        return static_cast<CudaKind>(out);
    }
    /// The CUDA device of registered CUDA memory; std::nullopt for every other buffer.
    Expected<std::optional<int>> cuda_device(nothrow_t) const noexcept {
        lf_cuda_kind kind{};
        std::int64_t device = LF_UNSET;
        if (lf_status s = lf_buffer_cuda_kind(handle(), &kind, &device); s != LF_OK) return failure(s);
        if (device == LF_UNSET) return std::optional<int>();
        return std::optional<int>(static_cast<int>(device));
    }
    /// The host address; LF_ERR_INVALID_STATE for GPU memory the host cannot map. For
    /// registered CUDA memory, the allocation's device pointer (for CUDA, not the host).
    Expected<void*> data(nothrow_t) const noexcept {
        void* out = nullptr;
        if (lf_status s = lf_buffer_ptr(handle(), &out); s != LF_OK) return failure(s);
        return out;
    }
    /// Copies in and out of any buffer, staged through the GPU where the host cannot map it.
    Expected<void> write(nothrow_t, std::size_t offset, const void* data, std::size_t size) const noexcept {
        return done(lf_buffer_write(handle(), offset, data, size));
    }
    Expected<void> read(nothrow_t, std::size_t offset, void* out, std::size_t size) const noexcept {
        return done(lf_buffer_read(handle(), offset, out, size));
    }
    Expected<Export> export_(nothrow_t) const noexcept {
        lf_export raw{};
        if (lf_status s = lf_buffer_export(handle(), &raw); s != LF_OK) return failure(s);
        return Export(raw);
    }

#if LAVA_FLOW_EXCEPTIONS
    std::size_t size() const { return size(nothrow).value(); }
    Memory location() const { return location(nothrow).value(); }
    std::size_t page_size() const { return page_size(nothrow).value(); }
    std::optional<std::string> fallback_reason() const { return fallback_reason(nothrow).value(); }
    Origin origin() const { return origin(nothrow).value(); }
    CudaKind cuda_kind() const { return cuda_kind(nothrow).value(); }
    std::optional<int> cuda_device() const { return cuda_device(nothrow).value(); }
    void* data() const { return data(nothrow).value(); }
    void write(std::size_t offset, const void* data, std::size_t size) const {
        write(nothrow, offset, data, size).value();
    }
    void read(std::size_t offset, void* out, std::size_t size) const { read(nothrow, offset, out, size).value(); }
    Export export_() const { return export_(nothrow).value(); }
#endif

private:
    const lf_buffer* handle() const noexcept { return static_cast<const Self*>(this)->get(); }
};

}  // namespace detail

/// A buffer lava-flow lends without handing over ownership: a received GPU message's
/// (Message::buffer), or any Buffer's (a Buffer converts to one). Valid while the lender is.
class BufferView : public detail::BufferAccess<BufferView> {
public:
    explicit BufferView(const lf_buffer* raw) noexcept : raw_(raw) {}
    const lf_buffer* get() const noexcept { return raw_; }

private:
    const lf_buffer* raw_;
};

/// Memory from a Context: CPU (standard, NUMA, huge pages, pinned) or GPU.
class Buffer : public detail::BufferAccess<Buffer> {
public:
    /// The same memory as a view, to pass where a lent buffer is taken (Producer::send_buffer,
    /// Context::copy); valid while this Buffer is.
    BufferView view() const noexcept { return BufferView(get()); }
    operator BufferView() const noexcept { return view(); }

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
    /// fallback), or with `config` (start from `lf_context_config_init`).
    static Expected<Context> create(nothrow_t, const lf_context_config* config = nullptr) noexcept {
        lf_context* raw = nullptr;
        if (lf_status s = lf_context_create(config, &raw); s != LF_OK) return detail::failure(s);
        return Context(Adopt{}, raw);
    }

    Expected<Buffer> allocate(nothrow_t, std::size_t size, Memory location = Memory::CpuStandard,
                              std::optional<std::uint32_t> numa_node = std::nullopt) const noexcept {
        lf_buffer* raw = nullptr;
        if (lf_status s = lf_alloc(get(), size, static_cast<lf_memory_kind>(location),
                                   detail::id_or_unset(numa_node), LF_HUGEPAGE_DEFAULT, &raw);
            s != LF_OK)
            return detail::failure(s);
        return Buffer(raw);
    }
    /// The location follows the scope between the two processes (docs/memory.md, "Automatic choice").
    Expected<Buffer> allocate_auto(nothrow_t, std::size_t size, const Location& mine,
                                   const Location& peer) const noexcept {
        lf_buffer* raw = nullptr;
        if (lf_status s = lf_alloc_auto(get(), size, mine.get(), peer.get(), &raw); s != LF_OK)
            return detail::failure(s);
        return Buffer(raw);
    }
    /// Maps (CPU) or imports (GPU) memory another process exported; takes its fd, success or not.
    Expected<Buffer> import(nothrow_t, Export&& exported) const noexcept {
        lf_export raw = exported.release();
        lf_buffer* out = nullptr;
        if (lf_status s = lf_import(get(), &raw, &out); s != LF_OK) return detail::failure(s);
        return Buffer(out);
    }
    /// Registers the caller's memory (`lf_register`): host memory, or CUDA device memory,
    /// whose whole allocation the buffer then is (`origin()` Origin::Cuda, `data()` its device
    /// pointer). The buffer's destructor ends the registration; the memory stays the caller's.
    Expected<Buffer> register_memory(nothrow_t, void* ptr, std::size_t size) const noexcept {
        lf_buffer* out = nullptr;
        if (lf_status s = lf_register(get(), ptr, size, &out); s != LF_OK) return detail::failure(s);
        return Buffer(out);
    }
    /// Copies between two buffers, on the GPU when both are this context's device memory.
    Expected<void> copy(nothrow_t, BufferView dst, std::size_t dst_offset, BufferView src,
                        std::size_t src_offset, std::size_t size) const noexcept {
        return detail::done(lf_buffer_copy(get(), dst.get(), dst_offset, src.get(), src_offset, size));
    }
    /// Why there is no GPU, or nullopt when there is one.
    Expected<std::optional<std::string>> gpu_unavailable_reason(nothrow_t) const noexcept {
        const char* out = nullptr;
        if (lf_status s = lf_context_gpu_unavailable_reason(get(), &out); s != LF_OK) return detail::failure(s);
        return detail::optional_string(out);
    }

#if LAVA_FLOW_EXCEPTIONS
    explicit Context(const lf_context_config* config = nullptr) : Context(create(nothrow, config).value()) {}

    Buffer allocate(std::size_t size, Memory location = Memory::CpuStandard,
                    std::optional<std::uint32_t> numa_node = std::nullopt) const {
        return allocate(nothrow, size, location, numa_node).value();
    }
    Buffer allocate_auto(std::size_t size, const Location& mine, const Location& peer) const {
        return allocate_auto(nothrow, size, mine, peer).value();
    }
    Buffer import(Export&& exported) const { return import(nothrow, std::move(exported)).value(); }
    Buffer register_memory(void* ptr, std::size_t size) const { return register_memory(nothrow, ptr, size).value(); }
    void copy(BufferView dst, std::size_t dst_offset, BufferView src, std::size_t src_offset,
              std::size_t size) const {
        copy(nothrow, dst, dst_offset, src, src_offset, size).value();
    }
    std::optional<std::string> gpu_unavailable_reason() const { return gpu_unavailable_reason(nothrow).value(); }
#endif

    const lf_context* get() const noexcept { return handle_.get(); }

private:
    struct Adopt {};
    Context(Adopt, lf_context* raw) noexcept : handle_(raw) {}
    detail::Owned<lf_context, lf_context_free> handle_;
};

}  // namespace lf

#endif  // LAVA_FLOW_MEMORY_HPP
