// Vulkan -> CUDA interop through lava-flow's C API: a DEVICE_LOCAL buffer allocated and
// written with lava-flow, exported as an opaque fd, imported into CUDA
// (cudaImportExternalMemory + cudaExternalMemoryGetMappedBuffer), read and rewritten by a CUDA
// kernel, and read back through lava-flow. The same steps work in another process: send the
// lf_export with lf_export_send and run the CUDA half there.
//
// Built when CMake finds a CUDA compiler and toolkit; prints PASS lines and exits non-zero on
// any failure.
#include <lava_flow.h>

#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>

#define LF_CHECK(call)                                                                            \
    do {                                                                                          \
        lf_status status_ = (call);                                                               \
        if (status_ != LF_OK) {                                                                   \
            std::fprintf(stderr, "FAIL %s: %s: %s\n", #call, lf_status_str(status_),             \
                         lf_last_error_message());                                                \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)

#define CUDA_CHECK(call)                                                                          \
    do {                                                                                          \
        cudaError_t error_ = (call);                                                              \
        if (error_ != cudaSuccess) {                                                              \
            std::fprintf(stderr, "FAIL %s: %s\n", #call, cudaGetErrorString(error_));             \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)

static unsigned char expected(size_t i, unsigned seed) { return static_cast<unsigned char>(i * 13u + seed); }

__global__ void write_pattern(unsigned char *data, size_t size, unsigned seed) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < size; i += size_t(gridDim.x) * blockDim.x)
        data[i] = static_cast<unsigned char>(i * 13u + seed);
}

static bool holds(const std::vector<unsigned char> &bytes, unsigned seed) {
    for (size_t i = 0; i < bytes.size(); i++)
        if (bytes[i] != expected(i, seed)) {
            std::fprintf(stderr, "byte %zu is %u, expected %u\n", i, bytes[i], expected(i, seed));
            return false;
        }
    return true;
}

int main() {
    lf_context_config config{};
    lf_context_config_init(&config, sizeof config);
    config.gpu_policy = LF_GPU_REQUIRED;  // no CPU fallback: this example is about the GPU
    lf_context *context = nullptr;
    LF_CHECK(lf_context_create(&config, &context));
    lf_device_info info{};
    info.struct_size = sizeof info;
    LF_CHECK(lf_context_device_info(context, &info));
    std::printf("Vulkan device %u: %s (driver %s %s)\n", info.index, info.name, info.driver_name, info.driver_info);

    // A small buffer first, so that the one CUDA imports sits at a non-zero offset of its arena.
    const size_t size = (1u << 20) + 7;
    lf_buffer *pad = nullptr, *buffer = nullptr;
    LF_CHECK(lf_alloc(context, 4096, LF_MEMORY_GPU_DEVICE_LOCAL, LF_UNSET, LF_HUGEPAGE_DEFAULT, &pad));
    LF_CHECK(lf_alloc(context, size, LF_MEMORY_GPU_DEVICE_LOCAL, LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffer));
    lf_memory_kind location{};
    LF_CHECK(lf_buffer_location(buffer, &location));
    if (location != LF_MEMORY_GPU_DEVICE_LOCAL) {
        std::fprintf(stderr, "FAIL: the buffer is not device-local memory (location %u)\n", location);
        return 1;
    }
    std::vector<unsigned char> bytes(size);
    for (size_t i = 0; i < size; i++) bytes[i] = expected(i, 1);
    LF_CHECK(lf_buffer_write(buffer, 0, bytes.data(), size));

    lf_export exported;
    LF_CHECK(lf_buffer_export(buffer, &exported));
    std::printf("export: %llu bytes at offset %llu of a %llu-byte allocation, memory type %u, %s\n",
                static_cast<unsigned long long>(exported.size), static_cast<unsigned long long>(exported.offset),
                static_cast<unsigned long long>(exported.arena_size), exported.memory_type_index,
                exported.gpu_flags & LF_EXPORT_GPU_DEDICATED ? "dedicated" : "pooled");

    // The CUDA device that is the Vulkan device: their UUIDs are equal.
    int count = 0, device = -1;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    for (int d = 0; d < count && device < 0; d++) {
        cudaDeviceProp properties;
        CUDA_CHECK(cudaGetDeviceProperties(&properties, d));
        if (std::memcmp(properties.uuid.bytes, exported.device_uuid, 16) == 0) {
            device = d;
            std::printf("PASS CUDA device %d (%s) has the Vulkan deviceUUID\n", d, properties.name);
        }
    }
    if (device < 0) {
        std::fprintf(stderr, "FAIL: none of the %d CUDA devices has the Vulkan device's UUID\n", count);
        close(exported.fd);
        return 1;
    }
    CUDA_CHECK(cudaSetDevice(device));

    cudaExternalMemoryHandleDesc memory_desc{};
    memory_desc.type = cudaExternalMemoryHandleTypeOpaqueFd;
    memory_desc.handle.fd = exported.fd;
    memory_desc.size = exported.arena_size;  // the whole allocation, not just the buffer
    memory_desc.flags = (exported.gpu_flags & LF_EXPORT_GPU_DEDICATED) ? cudaExternalMemoryDedicated : 0;
    cudaExternalMemory_t memory = nullptr;
    cudaError_t imported = cudaImportExternalMemory(&memory, &memory_desc);
    if (imported != cudaSuccess) {
        close(exported.fd);  // CUDA owns the fd only after a successful import
        std::fprintf(stderr, "FAIL cudaImportExternalMemory: %s\n", cudaGetErrorString(imported));
        return 1;
    }
    cudaExternalMemoryBufferDesc buffer_desc{};
    buffer_desc.offset = exported.offset;
    buffer_desc.size = exported.size;
    void *device_ptr = nullptr;
    CUDA_CHECK(cudaExternalMemoryGetMappedBuffer(&device_ptr, memory, &buffer_desc));

    std::vector<unsigned char> seen(size);
    CUDA_CHECK(cudaMemcpy(seen.data(), device_ptr, size, cudaMemcpyDeviceToHost));
    if (!holds(seen, 1)) return 1;
    std::printf("PASS CUDA reads what lf_buffer_write wrote (%zu bytes)\n", size);

    write_pattern<<<256, 256>>>(static_cast<unsigned char *>(device_ptr), size, 77);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaDeviceSynchronize());
    LF_CHECK(lf_buffer_read(buffer, 0, seen.data(), size));
    if (!holds(seen, 77)) return 1;
    std::printf("PASS lf_buffer_read reads what the CUDA kernel wrote\n");

    CUDA_CHECK(cudaFree(device_ptr));
    CUDA_CHECK(cudaDestroyExternalMemory(memory));
    lf_free(buffer);
    lf_free(pad);
    lf_context_free(context);
    std::printf("PASS cuda_import\n");
    return 0;
}
