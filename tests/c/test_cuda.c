/* CUDA memory the application allocated, registered through the C API.
 *
 * Everywhere: before anything loads CUDA, registering an address that is no memory is
 * LF_ERR_INVALID_ARGUMENT and the message says no CUDA driver was found; a host buffer's CUDA
 * kind is LF_CUDA_KIND_NONE. Then, where libcuda.so.1 loads (dlopen: no CUDA headers or
 * libraries at build time, the few driver functions declared here), cuMemAlloc memory is
 * registered: origin, location, kind, device, base and size, lookups by address, a second
 * registration of the same allocation, the host paths and export refused. Without CUDA it
 * prints why and exits 77 (skipped). */
#define _GNU_SOURCE
#include <lava_flow.h>

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

#include "check.h"

typedef int cu_result;
typedef unsigned long long cu_deviceptr;
typedef cu_result (*cu_init_fn)(unsigned int);
typedef cu_result (*cu_device_get_fn)(int *, int);
typedef cu_result (*cu_primary_ctx_retain_fn)(void **, int);
typedef cu_result (*cu_ctx_set_current_fn)(void *);
typedef cu_result (*cu_mem_alloc_fn)(cu_deviceptr *, size_t);
typedef cu_result (*cu_mem_free_fn)(cu_deviceptr);

/* dlsym's object pointer as a function pointer, without the cast pedantic C forbids. */
static void *symbol(void *library, const char *name) {
    void *found = dlsym(library, name);
    if (found == NULL) fprintf(stderr, "test_cuda: libcuda.so.1 has no %s\n", name);
    return found;
}
#define LOAD(type, name, library) \
    type name##_ = NULL;          \
    do {                          \
        void *p_ = symbol(library, #name); \
        memcpy(&name##_, &p_, sizeof p_);  \
    } while (0)

static lf_context *cpu_context(void) {
    lf_context_config config;
    lf_context_config_init(&config, sizeof config);
    config.gpu_policy = LF_GPU_DISABLED;
    lf_context *context = NULL;
    EXPECT(lf_context_create(&config, &context), LF_OK);
    return context;
}

static void without_cuda(lf_context *context) {
    lf_buffer *buffer = NULL;
    EXPECT(lf_register(context, (void *)0x200, 64, &buffer), LF_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("no CUDA driver was");
    CHECK(buffer == NULL);

    unsigned char host[256];
    EXPECT(lf_register(context, host, sizeof host, &buffer), LF_OK);
    lf_cuda_kind kind = 99;
    int64_t device = 7;
    EXPECT(lf_buffer_cuda_kind(buffer, &kind, &device), LF_OK);
    CHECK(kind == LF_CUDA_KIND_NONE && device == LF_UNSET);
    EXPECT(lf_buffer_cuda_kind(buffer, NULL, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_deregister(context, buffer), LF_OK);
}

static void legacy_memory(lf_context *context, cu_mem_alloc_fn mem_alloc, cu_mem_free_fn mem_free) {
    const size_t size = 4u << 20;
    cu_deviceptr base = 0;
    if (mem_alloc(&base, size) != 0) {
        fprintf(stderr, "test_cuda: cuMemAlloc of %zu bytes failed\n", size);
        failures++;
        return;
    }
    lf_buffer *tensor = NULL;
    EXPECT(lf_register(context, (void *)(uintptr_t)(base + 4096), 4096, &tensor), LF_OK);
    if (tensor == NULL) return;
    lf_origin origin = 0;
    lf_memory_kind location = 0;
    lf_cuda_kind kind = 0;
    int64_t device = -7;
    void *ptr = NULL;
    size_t registered = 0;
    EXPECT(lf_buffer_origin(tensor, &origin), LF_OK);
    EXPECT(lf_buffer_location(tensor, &location), LF_OK);
    EXPECT(lf_buffer_cuda_kind(tensor, &kind, &device), LF_OK);
    EXPECT(lf_buffer_ptr(tensor, &ptr), LF_OK);
    EXPECT(lf_buffer_size(tensor, &registered), LF_OK);
    CHECK(origin == LF_ORIGIN_CUDA);
    CHECK(location == LF_MEMORY_CUDA_DEVICE);
    CHECK(kind == LF_CUDA_KIND_LEGACY);
    CHECK(device == 0);
    CHECK((uintptr_t)ptr == (uintptr_t)base); /* the whole allocation, from its first byte */
    CHECK(registered >= size);

    lf_buffer *found = NULL;
    size_t offset = 0;
    EXPECT(lf_buffer_find(context, (void *)(uintptr_t)(base + 100), &found, &offset), LF_OK);
    CHECK(found == tensor && offset == 100);

    /* A second tensor of the allocation: a handle of its own on the same registration. */
    lf_buffer *second = NULL;
    EXPECT(lf_register(context, (void *)(uintptr_t)(base + size - 64), 64, &second), LF_OK);
    void *second_ptr = NULL;
    EXPECT(lf_buffer_ptr(second, &second_ptr), LF_OK);
    CHECK(second != NULL && second != tensor && second_ptr == ptr);

    /* The host cannot reach it, and it cannot be exported yet (channels send it: test_cuda_channel). */
    unsigned char bytes[16];
    EXPECT(lf_buffer_read(tensor, 0, bytes, sizeof bytes), LF_ERR_INVALID_STATE);
    EXPECT_MESSAGE("cudaMemcpy");
    EXPECT(lf_buffer_write(tensor, 0, bytes, sizeof bytes), LF_ERR_INVALID_STATE);
    lf_export exported;
    EXPECT(lf_buffer_export(tensor, &exported), LF_ERR_UNSUPPORTED);
    EXPECT(lf_register(context, (void *)(uintptr_t)(base + size - 64), 128, &found), LF_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("runs past the end of the CUDA allocation");

    /* Each handle is released on its own; the registration ends with the last. */
    EXPECT(lf_deregister(context, tensor), LF_OK);
    EXPECT(lf_buffer_find(context, (void *)(uintptr_t)base, &found, NULL), LF_OK);
    CHECK(found == second);
    EXPECT(lf_deregister(context, second), LF_OK);
    EXPECT(lf_buffer_find(context, (void *)(uintptr_t)base, &found, NULL), LF_ERR_NOT_FOUND);
    CHECK(mem_free(base) == 0);
}

int main(void) {
    lf_context *context = cpu_context();
    if (context == NULL) return 1;
    without_cuda(context);

    void *library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        printf("test_cuda: skipped: no CUDA driver (%s)\n", dlerror());
        lf_context_free(context);
        return failures ? 1 : 77;
    }
    LOAD(cu_init_fn, cuInit, library);
    LOAD(cu_device_get_fn, cuDeviceGet, library);
    LOAD(cu_primary_ctx_retain_fn, cuDevicePrimaryCtxRetain, library);
    LOAD(cu_ctx_set_current_fn, cuCtxSetCurrent, library);
    LOAD(cu_mem_alloc_fn, cuMemAlloc_v2, library);
    LOAD(cu_mem_free_fn, cuMemFree_v2, library);
    if (!cuInit_ || !cuDeviceGet_ || !cuDevicePrimaryCtxRetain_ || !cuCtxSetCurrent_ || !cuMemAlloc_v2_ ||
        !cuMemFree_v2_)
        return 1;
    int device = 0;
    void *cuda_context = NULL;
    if (cuInit_(0) != 0 || cuDeviceGet_(&device, 0) != 0) {
        printf("test_cuda: skipped: no CUDA device (cuInit or cuDeviceGet failed)\n");
        lf_context_free(context);
        return failures ? 1 : 77;
    }
    if (cuDevicePrimaryCtxRetain_(&cuda_context, device) != 0 || cuCtxSetCurrent_(cuda_context) != 0) {
        fprintf(stderr, "test_cuda: device 0's primary context could not be made current\n");
        return 1;
    }
    legacy_memory(context, cuMemAlloc_v2_, cuMemFree_v2_);
    lf_context_free(context);
    if (failures) fprintf(stderr, "test_cuda: %d failures\n", failures);
    else printf("test_cuda: passed\n");
    return failures ? 1 : 0;
}
