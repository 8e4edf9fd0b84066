/* Vulkan -> OpenCL interop through lava-flow's C API: a DEVICE_LOCAL buffer allocated and
 * written with lava-flow, exported as an opaque fd, imported into OpenCL with
 * cl_khr_external_memory_opaque_fd (clCreateBufferWithProperties), read and rewritten there,
 * and read back through lava-flow.
 *
 * Built when CMake finds OpenCL. Exits 77 (ctest: skipped) when no OpenCL platform offers the
 * extension for the Vulkan device (Mesa's rusticl and CPU platforms do not; NVIDIA's does on
 * recent drivers); non-zero on any failure. */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <CL/cl_ext.h>

#include <lava_flow.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* From cl_khr_external_memory / cl_khr_device_uuid, for older headers that lack them. */
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

#define SKIP 77

static int lf_fail(const char *call, lf_status status) {
    fprintf(stderr, "FAIL %s: %s: %s\n", call, lf_status_str(status), lf_last_error_message());
    return 1;
}
#define LF_CHECK(call) do { lf_status s_ = (call); if (s_ != LF_OK) return lf_fail(#call, s_); } while (0)
#define CL_CHECK(call) do { cl_int e_ = (call); if (e_ != CL_SUCCESS) { fprintf(stderr, "FAIL %s: OpenCL error %d\n", #call, e_); return 1; } } while (0)

static unsigned char pattern(size_t i, unsigned seed) { return (unsigned char)(i * 13u + seed); }

static int holds(const unsigned char *bytes, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++)
        if (bytes[i] != pattern(i, seed)) {
            fprintf(stderr, "byte %zu is %u, expected %u\n", i, bytes[i], pattern(i, seed));
            return 0;
        }
    return 1;
}

/* The OpenCL device with this UUID that offers opaque-fd import, if any. */
static cl_device_id find_device(const uint8_t uuid[16], cl_platform_id *platform_out) {
    cl_platform_id platforms[16];
    cl_uint n_platforms = 0;
    if (clGetPlatformIDs(16, platforms, &n_platforms) != CL_SUCCESS) return NULL;
    for (cl_uint p = 0; p < n_platforms && p < 16; p++) {
        cl_device_id devices[16];
        cl_uint n_devices = 0;
        if (clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, 16, devices, &n_devices) != CL_SUCCESS) continue;
        for (cl_uint d = 0; d < n_devices && d < 16; d++) {
            char extensions[8192] = {0};
            unsigned char device_uuid[16] = {0};
            clGetDeviceInfo(devices[d], CL_DEVICE_EXTENSIONS, sizeof extensions - 1, extensions, NULL);
            if (!strstr(extensions, "cl_khr_external_memory_opaque_fd") || !strstr(extensions, "cl_khr_device_uuid"))
                continue;
            if (clGetDeviceInfo(devices[d], CL_DEVICE_UUID_KHR, 16, device_uuid, NULL) != CL_SUCCESS) continue;
            if (memcmp(device_uuid, uuid, 16) == 0) {
                *platform_out = platforms[p];
                return devices[d];
            }
        }
    }
    return NULL;
}

int main(void) {
    lf_context_config config;
    lf_context_config_init(&config, sizeof config);
    config.gpu_policy = LF_GPU_REQUIRED;
    lf_context *context = NULL;
    LF_CHECK(lf_context_create(&config, &context));

    const size_t size = (1u << 20) + 7;
    lf_buffer *buffer = NULL;
    LF_CHECK(lf_alloc(context, size, LF_MEMORY_GPU_DEVICE_LOCAL, LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffer));
    unsigned char *bytes = malloc(size);
    if (!bytes) return 1;
    for (size_t i = 0; i < size; i++) bytes[i] = pattern(i, 1);
    LF_CHECK(lf_buffer_write(buffer, 0, bytes, size));

    lf_export exported;
    LF_CHECK(lf_buffer_export(buffer, &exported));
    cl_platform_id platform = NULL;
    cl_device_id device = find_device(exported.device_uuid, &platform);
    if (!device) {
        close(exported.fd);
        printf("SKIP: no OpenCL device with the Vulkan device's UUID offers cl_khr_external_memory_opaque_fd\n");
        return SKIP;
    }
    char name[256] = {0};
    clGetDeviceInfo(device, CL_DEVICE_NAME, sizeof name - 1, name, NULL);
    printf("PASS OpenCL device %s has the Vulkan deviceUUID and opaque-fd import\n", name);

    cl_int err = CL_SUCCESS;
    cl_context_properties context_props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)platform, 0};
    cl_context cl = clCreateContext(context_props, 1, &device, NULL, NULL, &err);
    CL_CHECK(err);
    cl_command_queue queue = clCreateCommandQueueWithProperties(cl, device, NULL, &err);
    CL_CHECK(err);

    /* The whole allocation is imported; the buffer lies at exported.offset inside it. On
     * success OpenCL owns the fd; on failure it is still ours to close. */
    cl_mem_properties props[] = {CL_EXTERNAL_MEMORY_HANDLE_OPAQUE_FD_KHR, (cl_mem_properties)exported.fd,
                                 CL_MEM_DEVICE_HANDLE_LIST_KHR, (cl_mem_properties)device,
                                 CL_MEM_DEVICE_HANDLE_LIST_END_KHR, 0};
    cl_mem memory = clCreateBufferWithProperties(cl, props, CL_MEM_READ_WRITE, exported.arena_size, NULL, &err);
    if (err != CL_SUCCESS) {
        close(exported.fd);
        fprintf(stderr, "FAIL clCreateBufferWithProperties: OpenCL error %d\n", err);
        return 1;
    }

    unsigned char *seen = malloc(size);
    if (!seen) return 1;
    CL_CHECK(clEnqueueReadBuffer(queue, memory, CL_TRUE, exported.offset, size, seen, 0, NULL, NULL));
    if (!holds(seen, size, 1)) return 1;
    printf("PASS OpenCL reads what lf_buffer_write wrote (%zu bytes)\n", size);

    for (size_t i = 0; i < size; i++) bytes[i] = pattern(i, 77);
    CL_CHECK(clEnqueueWriteBuffer(queue, memory, CL_TRUE, exported.offset, size, bytes, 0, NULL, NULL));
    CL_CHECK(clFinish(queue));
    LF_CHECK(lf_buffer_read(buffer, 0, seen, size));
    if (!holds(seen, size, 77)) return 1;
    printf("PASS lf_buffer_read reads what OpenCL wrote\n");

    clReleaseMemObject(memory);
    clReleaseCommandQueue(queue);
    clReleaseContext(cl);
    free(seen);
    free(bytes);
    lf_free(buffer);
    lf_context_free(context);
    printf("PASS opencl_import\n");
    return 0;
}
