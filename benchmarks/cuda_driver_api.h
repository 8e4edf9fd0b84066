/* The few CUDA driver API calls the plain-C GPU benchmarks make (lf_cuda_foreign.c,
 * lf_cuda_peer.c), declared
 * here with the values of cuda.h (as crates/cuda/src/sys.rs has them), and loaded with dlopen:
 * no CUDA headers or toolkit are needed to build, and a machine without the driver says so
 * instead of failing to start. Where cuda.h maps a name to a `_v2` symbol, that symbol is
 * loaded, as a program compiled against cuda.h would. One translation unit includes it. */
#pragma once

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

typedef int cu_result;
typedef unsigned long long cu_deviceptr;
typedef unsigned long long cu_mem_handle;
typedef void *cu_context;
typedef void *cu_stream;
typedef void *cu_event;
typedef struct {
    char reserved[64];
} cu_ipc_mem_handle;
typedef struct {
    char reserved[64];
} cu_ipc_event_handle;
typedef struct {
    unsigned type;
    int id;
} cu_mem_location;
typedef struct {
    unsigned type;
    unsigned requested_handle_types;
    cu_mem_location location;
    void *win32_handle_meta_data;
    unsigned char compression_type, gpu_direct_rdma_capable;
    unsigned short usage;
    unsigned char reserved[4];
} cu_mem_allocation_prop;
typedef struct {
    cu_mem_location location;
    unsigned flags;
} cu_mem_access_desc;
typedef void *cu_mem_pool;
typedef struct {
    unsigned alloc_type;
    unsigned handle_types;
    cu_mem_location location;
    void *win32_security_attributes;
    size_t max_size;
    unsigned short usage;
    unsigned char reserved[54];
} cu_mem_pool_props;
_Static_assert(sizeof(cu_mem_allocation_prop) == 32 && sizeof(cu_mem_access_desc) == 12 &&
                   sizeof(cu_mem_pool_props) == 88,
               "the sizes cuda.h gives these structs on 64-bit platforms");

#define CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 102
#define CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED 103
#define CU_MEM_ALLOCATION_TYPE_PINNED 1u
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 1u
#define CU_MEM_LOCATION_TYPE_DEVICE 1u
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 3u
#define CU_MEM_ALLOC_GRANULARITY_MINIMUM 0u
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 1u
#define CU_STREAM_NON_BLOCKING 1u
#define CU_EVENT_DISABLE_TIMING 2u
#define CU_EVENT_INTERPROCESS 4u

static struct {
    cu_result (*init)(unsigned);
    cu_result (*device_get_count)(int *);
    cu_result (*device_get)(int *, int);
    cu_result (*device_get_name)(char *, int, int);
    cu_result (*device_get_attribute)(int *, int, int);
    cu_result (*driver_get_version)(int *);
    cu_result (*primary_ctx_retain)(cu_context *, int);
    cu_result (*ctx_set_current)(cu_context);
    cu_result (*ctx_synchronize)(void);
    cu_result (*get_error_string)(cu_result, const char **);
    cu_result (*mem_alloc)(cu_deviceptr *, size_t);
    cu_result (*mem_free)(cu_deviceptr);
    cu_result (*memset_d32)(cu_deviceptr, unsigned, size_t);
    cu_result (*memcpy_dtoh)(void *, cu_deviceptr, size_t);
    cu_result (*mem_get_allocation_granularity)(size_t *, const cu_mem_allocation_prop *, unsigned);
    cu_result (*mem_create)(cu_mem_handle *, size_t, const cu_mem_allocation_prop *, unsigned long long);
    cu_result (*mem_release)(cu_mem_handle);
    cu_result (*mem_address_reserve)(cu_deviceptr *, size_t, size_t, cu_deviceptr, unsigned long long);
    cu_result (*mem_address_free)(cu_deviceptr, size_t);
    cu_result (*mem_map)(cu_deviceptr, size_t, size_t, cu_mem_handle, unsigned long long);
    cu_result (*mem_unmap)(cu_deviceptr, size_t);
    cu_result (*mem_set_access)(cu_deviceptr, size_t, const cu_mem_access_desc *, size_t);
    cu_result (*ipc_get_mem_handle)(cu_ipc_mem_handle *, cu_deviceptr);
    cu_result (*ipc_open_mem_handle)(cu_deviceptr *, cu_ipc_mem_handle, unsigned);
    cu_result (*ipc_close_mem_handle)(cu_deviceptr);
    cu_result (*event_create)(cu_event *, unsigned);
    cu_result (*event_destroy)(cu_event);
    cu_result (*event_record)(cu_event, cu_stream);
    cu_result (*ipc_get_event_handle)(cu_ipc_event_handle *, cu_event);
    cu_result (*ipc_open_event_handle)(cu_event *, cu_ipc_event_handle);
    cu_result (*stream_create)(cu_stream *, unsigned);
    cu_result (*stream_destroy)(cu_stream);
    cu_result (*stream_wait_event)(cu_stream, cu_event, unsigned);
    cu_result (*stream_synchronize)(cu_stream);
    cu_result (*device_get_uuid)(unsigned char (*)[16], int);
    cu_result (*device_can_access_peer)(int *, int, int);
    cu_result (*ctx_enable_peer_access)(cu_context, unsigned);
    cu_result (*memcpy_dtod_async)(cu_deviceptr, cu_deviceptr, size_t, cu_stream);
    cu_result (*memcpy_htod_async)(cu_deviceptr, const void *, size_t, cu_stream);
    cu_result (*memcpy_peer_async)(cu_deviceptr, cu_context, cu_deviceptr, cu_context, size_t, cu_stream);
    cu_result (*mem_pool_create)(cu_mem_pool *, const cu_mem_pool_props *);
    cu_result (*mem_pool_destroy)(cu_mem_pool);
    cu_result (*mem_alloc_from_pool_async)(cu_deviceptr *, size_t, cu_mem_pool, cu_stream);
    cu_result (*mem_free_async)(cu_deviceptr, cu_stream);
} cu;

/* cuCtxEnablePeerAccess's answer where the context already reaches the peer. */
#define CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED 704

static const char *cu_error(cu_result rc) {
    const char *text = NULL;
    if (cu.get_error_string == NULL || cu.get_error_string(rc, &text) != 0 || text == NULL) return "unknown CUDA error";
    return text;
}


/* dlsym's object pointer as a function pointer, without the cast pedantic C forbids. */
#define LOAD(into, name)                                                                          \
    do {                                                                                          \
        void *p_ = dlsym(library, name);                                                          \
        if (p_ == NULL) {                                                                         \
            snprintf(why, why_len, "libcuda.so.1 lacks %s (a driver older than CUDA 11?)", name); \
            return 0;                                                                             \
        }                                                                                         \
        memcpy(&(into), &p_, sizeof p_);                                                          \
    } while (0)

/* Loads libcuda.so.1 and initialises it; 0 and why (in `why`) without a driver or device. */
static int cu_load(char *why, size_t why_len) {
    void *library = dlopen("libcuda.so.1", RTLD_NOW);
    if (library == NULL) {
        snprintf(why, why_len, "no CUDA driver (%s)", dlerror());
        return 0;
    }
    LOAD(cu.init, "cuInit");
    LOAD(cu.device_get_count, "cuDeviceGetCount");
    LOAD(cu.device_get, "cuDeviceGet");
    LOAD(cu.device_get_name, "cuDeviceGetName");
    LOAD(cu.device_get_attribute, "cuDeviceGetAttribute");
    LOAD(cu.driver_get_version, "cuDriverGetVersion");
    LOAD(cu.primary_ctx_retain, "cuDevicePrimaryCtxRetain");
    LOAD(cu.ctx_set_current, "cuCtxSetCurrent");
    LOAD(cu.ctx_synchronize, "cuCtxSynchronize");
    LOAD(cu.get_error_string, "cuGetErrorString");
    LOAD(cu.mem_alloc, "cuMemAlloc_v2");
    LOAD(cu.mem_free, "cuMemFree_v2");
    LOAD(cu.memset_d32, "cuMemsetD32_v2");
    LOAD(cu.memcpy_dtoh, "cuMemcpyDtoH_v2");
    LOAD(cu.mem_get_allocation_granularity, "cuMemGetAllocationGranularity");
    LOAD(cu.mem_create, "cuMemCreate");
    LOAD(cu.mem_release, "cuMemRelease");
    LOAD(cu.mem_address_reserve, "cuMemAddressReserve");
    LOAD(cu.mem_address_free, "cuMemAddressFree");
    LOAD(cu.mem_map, "cuMemMap");
    LOAD(cu.mem_unmap, "cuMemUnmap");
    LOAD(cu.mem_set_access, "cuMemSetAccess");
    LOAD(cu.ipc_get_mem_handle, "cuIpcGetMemHandle");
    LOAD(cu.ipc_open_mem_handle, "cuIpcOpenMemHandle_v2");
    LOAD(cu.ipc_close_mem_handle, "cuIpcCloseMemHandle");
    LOAD(cu.event_create, "cuEventCreate");
    LOAD(cu.event_destroy, "cuEventDestroy_v2");
    LOAD(cu.event_record, "cuEventRecord");
    LOAD(cu.ipc_get_event_handle, "cuIpcGetEventHandle");
    LOAD(cu.ipc_open_event_handle, "cuIpcOpenEventHandle");
    LOAD(cu.stream_create, "cuStreamCreate");
    LOAD(cu.stream_destroy, "cuStreamDestroy_v2");
    LOAD(cu.stream_wait_event, "cuStreamWaitEvent");
    LOAD(cu.stream_synchronize, "cuStreamSynchronize");
    LOAD(cu.device_get_uuid, "cuDeviceGetUuid_v2");
    LOAD(cu.device_can_access_peer, "cuDeviceCanAccessPeer");
    LOAD(cu.ctx_enable_peer_access, "cuCtxEnablePeerAccess");
    LOAD(cu.memcpy_dtod_async, "cuMemcpyDtoDAsync_v2");
    LOAD(cu.memcpy_htod_async, "cuMemcpyHtoDAsync_v2");
    LOAD(cu.memcpy_peer_async, "cuMemcpyPeerAsync");
    LOAD(cu.mem_pool_create, "cuMemPoolCreate");
    LOAD(cu.mem_pool_destroy, "cuMemPoolDestroy");
    LOAD(cu.mem_alloc_from_pool_async, "cuMemAllocFromPoolAsync");
    LOAD(cu.mem_free_async, "cuMemFreeAsync");
    int count = 0;
    cu_result rc = cu.init(0);
    if (rc == 0) rc = cu.device_get_count(&count);
    if (rc != 0 || count == 0) {
        snprintf(why, why_len, "no CUDA device visible (%s)", rc != 0 ? cu_error(rc) : "0 devices");
        return 0;
    }
    return 1;
}
