// Vulkan -> OpenCL interop through the C++ wrapper, as examples-c/opencl_import.c does: a
// DEVICE_LOCAL lf::Buffer allocated and written with lava-flow, exported (lf::Export, which owns
// the opaque fd), imported into OpenCL with cl_khr_external_memory_opaque_fd
// (clCreateBufferWithProperties), read and rewritten there, and read back through lava-flow.
//
// Built when CMake finds OpenCL. Exits 77 (ctest: skipped) when no OpenCL platform offers the
// extension for the Vulkan device (Mesa's rusticl and CPU platforms do not; NVIDIA's does on
// recent drivers); non-zero on any failure.
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <CL/cl_ext.h>

#include <lava_flow.hpp>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

// From cl_khr_external_memory / cl_khr_device_uuid, for older headers that lack them.
#ifndef CL_EXTERNAL_MEMORY_HANDLE_OPAQUE_FD_KHR
#define CL_EXTERNAL_MEMORY_HANDLE_OPAQUE_FD_KHR 0x2060
#endif
#ifndef CL_MEM_DEVICE_HANDLE_LIST_KHR
#define CL_MEM_DEVICE_HANDLE_LIST_KHR 0x2051
#define CL_MEM_DEVICE_HANDLE_LIST_END_KHR 0
#endif
#ifndef CL_DEVICE_UUID_KHR
#define CL_DEVICE_UUID_KHR 0x106A
#endif

constexpr int kSkip = 77;

#define CL_CHECK(call)                                                               \
    do {                                                                             \
        cl_int e_ = (call);                                                          \
        if (e_ != CL_SUCCESS) {                                                      \
            std::fprintf(stderr, "FAIL %s: OpenCL error %d\n", #call, static_cast<int>(e_)); \
            return 1;                                                                \
        }                                                                            \
    } while (0)

// OpenCL objects, released by their destructors.
template <typename Handle, cl_int(CL_API_CALL* Release)(Handle)>
struct ClRelease {
    void operator()(Handle handle) const noexcept { Release(handle); }
};
template <typename Handle, cl_int(CL_API_CALL* Release)(Handle)>
using ClOwned = std::unique_ptr<std::remove_pointer_t<Handle>, ClRelease<Handle, Release>>;
using ClContext = ClOwned<cl_context, clReleaseContext>;
using ClQueue = ClOwned<cl_command_queue, clReleaseCommandQueue>;
using ClMemory = ClOwned<cl_mem, clReleaseMemObject>;

static unsigned char pattern(std::size_t i, unsigned seed) { return static_cast<unsigned char>(i * 13u + seed); }

static void fill(std::vector<unsigned char>& bytes, unsigned seed) {
    for (std::size_t i = 0; i < bytes.size(); i++) bytes[i] = pattern(i, seed);
}

static bool holds(const std::vector<unsigned char>& bytes, unsigned seed) {
    for (std::size_t i = 0; i < bytes.size(); i++)
        if (bytes[i] != pattern(i, seed)) {
            std::fprintf(stderr, "byte %zu is %u, expected %u\n", i, bytes[i], pattern(i, seed));
            return false;
        }
    return true;
}

// The OpenCL device with this UUID that offers opaque-fd import, if any.
static cl_device_id find_device(const std::uint8_t (&uuid)[16], cl_platform_id* platform_out) {
    cl_platform_id platforms[16];
    cl_uint n_platforms = 0;
    if (clGetPlatformIDs(16, platforms, &n_platforms) != CL_SUCCESS) return nullptr;
    for (cl_uint p = 0; p < n_platforms && p < 16; p++) {
        cl_device_id devices[16];
        cl_uint n_devices = 0;
        if (clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, 16, devices, &n_devices) != CL_SUCCESS) continue;
        for (cl_uint d = 0; d < n_devices && d < 16; d++) {
            char extensions[8192] = {};
            unsigned char device_uuid[16] = {};
            clGetDeviceInfo(devices[d], CL_DEVICE_EXTENSIONS, sizeof extensions - 1, extensions, nullptr);
            const std::string offered = extensions;
            if (offered.find("cl_khr_external_memory_opaque_fd") == std::string::npos ||
                offered.find("cl_khr_device_uuid") == std::string::npos)
                continue;
            if (clGetDeviceInfo(devices[d], CL_DEVICE_UUID_KHR, 16, device_uuid, nullptr) != CL_SUCCESS) continue;
            if (std::memcmp(device_uuid, uuid, 16) == 0) {
                *platform_out = platforms[p];
                return devices[d];
            }
        }
    }
    return nullptr;
}

int main() {
    try {
        lf_context_config config{};
        lf_context_config_init(&config, sizeof config);
        config.gpu_policy = LF_GPU_REQUIRED;
        const lf::Context context(&config);

        const std::size_t size = (1u << 20) + 7;
        const lf::Buffer buffer = context.allocate(size, lf::Memory::GpuDeviceLocal);
        std::vector<unsigned char> bytes(size);
        fill(bytes, 1);
        buffer.write(0, bytes.data(), size);

        // The export owns its fd until OpenCL takes it: every return before closes it.
        lf::Export exported = buffer.export_();
        const lf_export& raw = exported.raw();
        cl_platform_id platform = nullptr;
        cl_device_id device = find_device(raw.device_uuid, &platform);
        if (!device) {
            std::printf("SKIP: no OpenCL device with the Vulkan device's UUID offers cl_khr_external_memory_opaque_fd\n");
            return kSkip;
        }
        char name[256] = {};
        clGetDeviceInfo(device, CL_DEVICE_NAME, sizeof name - 1, name, nullptr);
        std::printf("PASS OpenCL device %s has the Vulkan deviceUUID and opaque-fd import\n", name);

        cl_int err = CL_SUCCESS;
        const cl_context_properties context_props[] = {CL_CONTEXT_PLATFORM, reinterpret_cast<cl_context_properties>(platform), 0};
        const ClContext cl(clCreateContext(context_props, 1, &device, nullptr, nullptr, &err));
        CL_CHECK(err);
        const ClQueue queue(clCreateCommandQueueWithProperties(cl.get(), device, nullptr, &err));
        CL_CHECK(err);

        // The whole allocation is imported; the buffer lies at raw.offset inside it. On success
        // OpenCL owns the fd, so the export lets go of it.
        const cl_mem_properties props[] = {CL_EXTERNAL_MEMORY_HANDLE_OPAQUE_FD_KHR, static_cast<cl_mem_properties>(raw.fd),
                                           CL_MEM_DEVICE_HANDLE_LIST_KHR, reinterpret_cast<cl_mem_properties>(device),
                                           CL_MEM_DEVICE_HANDLE_LIST_END_KHR, 0};
        const ClMemory memory(clCreateBufferWithProperties(cl.get(), props, CL_MEM_READ_WRITE, raw.arena_size, nullptr, &err));
        CL_CHECK(err);
        const std::size_t offset = raw.offset;
        (void)exported.release();

        std::vector<unsigned char> seen(size);
        CL_CHECK(clEnqueueReadBuffer(queue.get(), memory.get(), CL_TRUE, offset, size, seen.data(), 0, nullptr, nullptr));
        if (!holds(seen, 1)) return 1;
        std::printf("PASS OpenCL reads what lf_buffer_write wrote (%zu bytes)\n", size);

        fill(bytes, 77);
        CL_CHECK(clEnqueueWriteBuffer(queue.get(), memory.get(), CL_TRUE, offset, size, bytes.data(), 0, nullptr, nullptr));
        CL_CHECK(clFinish(queue.get()));
        buffer.read(0, seen.data(), size);
        if (!holds(seen, 77)) return 1;
        std::printf("PASS lf_buffer_read reads what OpenCL wrote\n");
    } catch (const lf::Error& e) {
        std::fprintf(stderr, "FAIL %s: %s\n", e.status_name(), e.what());
        return 1;
    }
    std::printf("PASS opencl_import\n");
    return 0;
}
