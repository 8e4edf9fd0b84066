/* CUDA memory the application allocated (cuMemAlloc), sent by reference through a channel to
 * another process, through the C API: the consumer (the parent) reads the producer's bytes
 * through lf_message_cuda_ptr (cuMemcpyDtoH), overwrites them and releases the message; the
 * producer (the forked child), once lf_wait_completed returns, reads the consumer's bytes in its
 * own allocation. The message has no host pointer, lf_message_buffer is refused, and
 * lf_message_cuda_ptr of a host message says what it is. The channel's transport names
 * cuda_ipc. Its contexts have no GPU, so it shares no ready semaphore: lf_send_buffer_after of
 * the CUDA memory is refused, naming the way out.
 *
 * Then stream-ordered, on a channel whose contexts open CUDA device 0's GPU with Vulkan (skipped
 * where there is none): the producer queues cuMemsetD8Async and the signal of the channel's ready
 * semaphore on a stream held back by a host function, and lf_send_buffer_after returns while
 * the stream is still held; the consumer's stream waits for lf_message.ready_value on the GPU
 * (its copy is still pending while the producer's stream is held), and once the consumer lets
 * the producer's stream go on (a byte through a pipe), it reads the producer's bytes.
 *
 * libcuda.so.1 is loaded with dlopen after the fork (no CUDA at build time, CUDA initialised in
 * each process on its own). Without a CUDA driver or device it prints why and exits 77
 * (skipped). Plain C11. */
#define _GNU_SOURCE
#include <lava_flow.h>

#include <dirent.h>
#include <dlfcn.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures = 0;

#include "check.h"

#define SECOND 1000000000LL
#define SKIPPED 77
#define SIZE (1u << 20)
#define OFFSET 4096u
#define SENT 65536u

typedef int cu_result;
typedef unsigned long long cu_deviceptr;
typedef cu_result (*cu_init_fn)(unsigned int);
typedef cu_result (*cu_device_get_count_fn)(int *);
typedef cu_result (*cu_device_get_fn)(int *, int);
typedef cu_result (*cu_primary_ctx_retain_fn)(void **, int);
typedef cu_result (*cu_ctx_set_current_fn)(void *);
typedef cu_result (*cu_mem_alloc_fn)(cu_deviceptr *, size_t);
typedef cu_result (*cu_mem_free_fn)(cu_deviceptr);
typedef cu_result (*cu_memset_d8_fn)(cu_deviceptr, unsigned char, size_t);
typedef cu_result (*cu_memcpy_dtoh_fn)(void *, cu_deviceptr, size_t);
typedef cu_result (*cu_ctx_synchronize_fn)(void);
typedef void *cu_stream;
typedef void *cu_semaphore;

#define CUDA_ERROR_NOT_READY 600
#define TIMELINE_SEMAPHORE_FD 9

/* CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC, _SIGNAL_PARAMS and _WAIT_PARAMS as cuda.h lays them out. */
typedef struct {
    int type;
    union {
        int fd;
        struct {
            void *handle;
            const void *name;
        } win32;
        const void *nv_sci_sync;
    } handle;
    unsigned int flags;
    unsigned int reserved[16];
} cu_semaphore_desc;

typedef struct {
    struct {
        unsigned long long fence_value;
        unsigned long long nv_sci_sync;
        unsigned long long keyed_mutex_key;
        unsigned int reserved[12];
    } params;
    unsigned int flags;
    unsigned int reserved[16];
} cu_signal_params;

typedef struct {
    struct {
        unsigned long long fence_value;
        unsigned long long nv_sci_sync;
        struct {
            unsigned long long key;
            unsigned int timeout_ms;
        } keyed_mutex;
        unsigned int reserved[10];
    } params;
    unsigned int flags;
    unsigned int reserved[16];
} cu_wait_params;

_Static_assert(sizeof(cu_semaphore_desc) == 96, "CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC");
_Static_assert(sizeof(cu_signal_params) == 144, "CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS");
_Static_assert(sizeof(cu_wait_params) == 144, "CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS");

static struct {
    cu_mem_alloc_fn mem_alloc;
    cu_mem_free_fn mem_free;
    cu_memset_d8_fn memset_d8;
    cu_memcpy_dtoh_fn memcpy_dtoh;
    cu_ctx_synchronize_fn synchronize;
    cu_result (*device_uuid)(unsigned char *, int);
    cu_result (*stream_create)(cu_stream *, unsigned int);
    cu_result (*stream_destroy)(cu_stream);
    cu_result (*stream_query)(cu_stream);
    cu_result (*stream_synchronize)(cu_stream);
    cu_result (*memset_d8_async)(cu_deviceptr, unsigned char, size_t, cu_stream);
    cu_result (*memcpy_dtoh_async)(void *, cu_deviceptr, size_t, cu_stream);
    cu_result (*mem_alloc_host)(void **, size_t);
    cu_result (*mem_free_host)(void *);
    cu_result (*launch_host_func)(cu_stream, void (*)(void *), void *);
    cu_result (*import_semaphore)(cu_semaphore *, const cu_semaphore_desc *);
    cu_result (*destroy_semaphore)(cu_semaphore);
    cu_result (*signal_semaphores)(const cu_semaphore *, const cu_signal_params *, unsigned int, cu_stream);
    cu_result (*wait_semaphores)(const cu_semaphore *, const cu_wait_params *, unsigned int, cu_stream);
    int device;
} cu;

/* dlsym's object pointer as a function pointer, without the cast pedantic C forbids. */
#define LOAD(into, library, name)                   \
    do {                                            \
        void *p_ = dlsym(library, name);            \
        if (p_ == NULL) return 0;                   \
        memcpy(&(into), &p_, sizeof p_);            \
    } while (0)

/* Loads and initialises CUDA with device 0's primary context current; 0 (and why) without. */
static int cuda(const char *who) {
    void *library = dlopen("libcuda.so.1", RTLD_NOW);
    if (library == NULL) {
        printf("test_cuda_channel: %s skipped: no CUDA driver (%s)\n", who, dlerror());
        return 0;
    }
    cu_init_fn init;
    cu_device_get_count_fn device_count;
    cu_device_get_fn device_get;
    cu_primary_ctx_retain_fn retain;
    cu_ctx_set_current_fn set_current;
    LOAD(init, library, "cuInit");
    LOAD(device_count, library, "cuDeviceGetCount");
    LOAD(device_get, library, "cuDeviceGet");
    LOAD(retain, library, "cuDevicePrimaryCtxRetain");
    LOAD(set_current, library, "cuCtxSetCurrent");
    LOAD(cu.mem_alloc, library, "cuMemAlloc_v2");
    LOAD(cu.mem_free, library, "cuMemFree_v2");
    LOAD(cu.memset_d8, library, "cuMemsetD8_v2");
    LOAD(cu.memcpy_dtoh, library, "cuMemcpyDtoH_v2");
    LOAD(cu.synchronize, library, "cuCtxSynchronize");
    LOAD(cu.device_uuid, library, "cuDeviceGetUuid_v2");
    LOAD(cu.stream_create, library, "cuStreamCreate");
    LOAD(cu.stream_destroy, library, "cuStreamDestroy_v2");
    LOAD(cu.stream_query, library, "cuStreamQuery");
    LOAD(cu.stream_synchronize, library, "cuStreamSynchronize");
    LOAD(cu.memset_d8_async, library, "cuMemsetD8Async");
    LOAD(cu.memcpy_dtoh_async, library, "cuMemcpyDtoHAsync_v2");
    LOAD(cu.mem_alloc_host, library, "cuMemAllocHost_v2");
    LOAD(cu.mem_free_host, library, "cuMemFreeHost");
    LOAD(cu.launch_host_func, library, "cuLaunchHostFunc");
    LOAD(cu.import_semaphore, library, "cuImportExternalSemaphore");
    LOAD(cu.destroy_semaphore, library, "cuDestroyExternalSemaphore");
    LOAD(cu.signal_semaphores, library, "cuSignalExternalSemaphoresAsync");
    LOAD(cu.wait_semaphores, library, "cuWaitExternalSemaphoresAsync");
    int count = 0, device = 0;
    void *context = NULL;
    if (init(0) != 0 || device_count(&count) != 0 || count == 0) {
        printf("test_cuda_channel: %s skipped: no CUDA driver (no device visible)\n", who);
        return 0;
    }
    if (device_get(&device, 0) != 0 || retain(&context, device) != 0 || set_current(context) != 0) return 0;
    cu.device = device;
    return 1;
}

static lf_channel *open_channel(lf_context *context, const char *name, lf_role role) {
    lf_location *here = NULL;
    lf_channel *channel = NULL;
    lf_channel_config config;
    EXPECT(lf_channel_config_init(&config, sizeof config), LF_OK);
    config.rendezvous_timeout_ns = 30 * SECOND;
    EXPECT(lf_location_detect(&here), LF_OK);
    EXPECT(lf_channel_create(context, name, role, here, here, &config, &channel), LF_OK);
    lf_location_free(here);
    return channel;
}

static lf_context *cpu_context(void) {
    lf_context_config config;
    lf_context_config_init(&config, sizeof config);
    config.gpu_policy = LF_GPU_DISABLED;
    lf_context *context = NULL;
    EXPECT(lf_context_create(&config, &context), LF_OK);
    return context;
}

static int all(const unsigned char *p, size_t n, unsigned char value) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != value) return 0;
    return 1;
}

static int run_producer(const char *name) {
    if (!cuda("producer")) return SKIPPED;
    cu_deviceptr memory = 0;
    CHECK(cu.mem_alloc(&memory, SIZE) == 0);
    CHECK(cu.memset_d8(memory, 0xa5, SIZE) == 0 && cu.synchronize() == 0);
    lf_context *context = cpu_context();
    lf_buffer *tensor = NULL;
    EXPECT(lf_register(context, (void *)(uintptr_t)(memory + OFFSET), SENT, &tensor), LF_OK);
    lf_channel *ch = open_channel(context, name, LF_ROLE_PRODUCER);
    const char *transport = NULL, *reason = NULL;
    EXPECT(lf_channel_transport(ch, &transport, &reason), LF_OK);
    printf("producer: transport %s (%s)\n", transport ? transport : "?", reason ? reason : "?");
    CHECK(transport != NULL && strstr(transport, "cuda_ipc") != NULL);
    /* A host message first, then the CUDA memory (the buffer is the whole allocation). */
    uint64_t seq = UINT64_MAX;
    EXPECT(lf_send(ch, "host", 4, -1, NULL), LF_OK);
    /* No GPU route shares a ready semaphore on this channel: refused, and nothing is sent. */
    EXPECT(lf_send_buffer_after(ch, tensor, OFFSET, SENT, 1, 30 * SECOND, &seq), LF_ERR_UNSUPPORTED);
    EXPECT_MESSAGE("shares no ready semaphore");
    EXPECT_MESSAGE("cudaStreamSynchronize");
    EXPECT(lf_send_buffer(ch, tensor, OFFSET, SENT, 30 * SECOND, &seq), LF_OK);
    CHECK(seq == 1);
    EXPECT(lf_wait_completed(ch, seq, 30 * SECOND), LF_OK);
    unsigned char *back = malloc(SENT + 1);
    CHECK(back != NULL && cu.memcpy_dtoh(back, memory + OFFSET - 1, SENT + 1) == 0);
    CHECK(back != NULL && back[0] == 0xa5 && all(back + 1, SENT, 0x5a));
    free(back);
    lf_channel_free(ch);
    EXPECT(lf_deregister(context, tensor), LF_OK);
    lf_context_free(context);
    CHECK(cu.mem_free(memory) == 0);
    return failures != 0;
}

static int run_consumer(const char *name) {
    if (!cuda("consumer")) return SKIPPED;
    lf_context *context = cpu_context();
    lf_channel *ch = open_channel(context, name, LF_ROLE_CONSUMER);
    lf_message host, m;
    uint64_t ptr = 0;
    int device = -1;
    EXPECT(lf_recv(ch, 30 * SECOND, &host), LF_OK);
    CHECK((host.flags & LF_MESSAGE_CUDA) == 0);
    EXPECT(lf_message_cuda_ptr(ch, &host, &ptr, &device), LF_ERR_INVALID_STATE);
    EXPECT_MESSAGE("not CUDA memory");
    EXPECT(lf_release(ch, &host), LF_OK);

    EXPECT(lf_recv(ch, 30 * SECOND, &m), LF_OK);
    CHECK((m.flags & (LF_MESSAGE_GPU | LF_MESSAGE_CUDA)) == (LF_MESSAGE_GPU | LF_MESSAGE_CUDA));
    CHECK(m.data == NULL && m.len == SENT);
    const lf_buffer *lent = NULL;
    /* cudaMalloc memory has no fd: Vulkan cannot import it. */
    EXPECT(lf_message_buffer(ch, &m, &lent), LF_ERR_UNSUPPORTED);
    EXPECT_MESSAGE("lf_message_cuda_ptr");
    EXPECT(lf_message_cuda_ptr(ch, &m, NULL, &device), LF_ERR_NULL_POINTER);
    EXPECT(lf_message_cuda_ptr(ch, &m, &ptr, &device), LF_OK);
    CHECK(ptr != 0 && device == 0);
    unsigned char *bytes = malloc(SENT);
    CHECK(bytes != NULL && cu.memcpy_dtoh(bytes, ptr, SENT) == 0);
    CHECK(bytes != NULL && all(bytes, SENT, 0xa5));
    free(bytes);
    CHECK(cu.memset_d8(ptr, 0x5a, SENT) == 0 && cu.synchronize() == 0);
    EXPECT(lf_release(ch, &m), LF_OK);
    EXPECT(lf_message_cuda_ptr(ch, &m, &ptr, &device), LF_ERR_INVALID_STATE);
    EXPECT(lf_recv(ch, 30 * SECOND, &m), LF_ERR_PEER_GONE);
    lf_channel_free(ch);
    lf_context_free(context);
    return failures != 0;
}

/* A context on CUDA device 0's GPU through Vulkan (its deviceUUID is CUDA's), or NULL (saying
 * why) where there is none: the channel's ready semaphore is that GPU's. */
static lf_context *gpu_context(const char *who) {
    lf_context_config config;
    lf_context_config_init(&config, sizeof config);
    config.gpu_policy = LF_GPU_REQUIRED;
    config.gpu_device_select = LF_GPU_DEVICE_UUID;
    if (cu.device_uuid(config.gpu_device_uuid, cu.device) != 0) return NULL;
    lf_context *context = NULL;
    if (lf_context_create(&config, &context) != LF_OK) {
        printf("test_cuda_channel: %s: stream-ordered part skipped: no Vulkan device on CUDA device 0 (%s)\n", who,
               lf_last_error_message());
        return NULL;
    }
    return context;
}

/* The channel's ready semaphore in CUDA (the driver takes the fd). */
static cu_semaphore import_ready(lf_channel *ch) {
    int fd = -1;
    cu_semaphore semaphore = NULL;
    EXPECT(lf_channel_ready_semaphore(ch, &fd), LF_OK);
    cu_semaphore_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.type = TIMELINE_SEMAPHORE_FD;
    desc.handle.fd = fd;
    CHECK(fd >= 0 && cu.import_semaphore(&semaphore, &desc) == 0);
    return semaphore;
}

/* The pipe through which the consumer lets the producer's held stream go on. */
static int gate[2] = {-1, -1};

/* A host function on the producer's stream: holds it until the consumer's byte (at most a
 * minute, so that a failed test does not hang). */
static void hold_stream(void *unused) {
    (void)unused;
    struct pollfd p = {.fd = gate[0], .events = POLLIN};
    char byte;
    if (poll(&p, 1, 60000) == 1 && read(gate[0], &byte, 1) == 1) return;
    fprintf(stderr, "test_cuda_channel: the consumer never let the producer's stream go on\n");
}

static int run_producer_ordered(const char *name) {
    lf_context *context = gpu_context("producer");
    if (context == NULL) return 0;
    cu_deviceptr memory = 0;
    CHECK(cu.mem_alloc(&memory, SIZE) == 0);
    CHECK(cu.memset_d8(memory, 0, SIZE) == 0 && cu.synchronize() == 0);
    lf_buffer *tensor = NULL;
    EXPECT(lf_register(context, (void *)(uintptr_t)(memory + OFFSET), SENT, &tensor), LF_OK);
    lf_channel *ch = open_channel(context, name, LF_ROLE_PRODUCER);
    const char *transport = NULL, *reason = NULL;
    EXPECT(lf_channel_transport(ch, &transport, &reason), LF_OK);
    printf("producer: transport %s (%s)\n", transport ? transport : "?", reason ? reason : "?");
    CHECK(reason != NULL && strstr(reason, "stream-ordered sends") != NULL);
    cu_semaphore semaphore = import_ready(ch);
    cu_stream stream = NULL;
    CHECK(cu.stream_create(&stream, 0) == 0);
    CHECK(cu.launch_host_func(stream, hold_stream, NULL) == 0);
    CHECK(cu.memset_d8_async(memory + OFFSET, 0xc5, SENT, stream) == 0);
    cu_signal_params signal;
    memset(&signal, 0, sizeof signal);
    signal.params.fence_value = 1;
    CHECK(cu.signal_semaphores(&semaphore, &signal, 1, stream) == 0);
    uint64_t seq = UINT64_MAX;
    EXPECT(lf_send_buffer_after(ch, tensor, OFFSET, SENT, 1, 30 * SECOND, &seq), LF_OK);
    /* Sent while the stream is held: nothing waited for it on the host. */
    CHECK(cu.stream_query(stream) == CUDA_ERROR_NOT_READY);
    EXPECT(lf_wait_completed(ch, seq, 60 * SECOND), LF_OK);
    CHECK(cu.stream_synchronize(stream) == 0);
    CHECK(cu.stream_destroy(stream) == 0 && cu.destroy_semaphore(semaphore) == 0);
    lf_channel_free(ch);
    EXPECT(lf_deregister(context, tensor), LF_OK);
    lf_context_free(context);
    CHECK(cu.mem_free(memory) == 0);
    return failures != 0;
}

static int run_consumer_ordered(const char *name) {
    lf_context *context = gpu_context("consumer");
    if (context == NULL) return 0;
    lf_channel *ch = open_channel(context, name, LF_ROLE_CONSUMER);
    cu_semaphore semaphore = import_ready(ch);
    cu_stream stream = NULL;
    unsigned char *pinned = NULL;
    CHECK(cu.stream_create(&stream, 0) == 0);
    /* Pinned: a copy into pageable memory would wait on the host. */
    CHECK(cu.mem_alloc_host((void **)&pinned, SENT) == 0);
    lf_message m;
    uint64_t ptr = 0;
    int device = -1;
    EXPECT(lf_recv(ch, 30 * SECOND, &m), LF_OK);
    CHECK((m.flags & LF_MESSAGE_CUDA) != 0 && m.ready_value == 1);
    EXPECT(lf_message_cuda_ptr(ch, &m, &ptr, &device), LF_OK);
    cu_wait_params wait;
    memset(&wait, 0, sizeof wait);
    wait.params.fence_value = m.ready_value;
    memset(pinned, 0, SENT);
    CHECK(cu.wait_semaphores(&semaphore, &wait, 1, stream) == 0);
    CHECK(cu.memcpy_dtoh_async(pinned, ptr, SENT, stream) == 0);
    /* The producer's stream is held: the copy waits on the GPU. */
    CHECK(cu.stream_query(stream) == CUDA_ERROR_NOT_READY);
    CHECK(write(gate[1], "g", 1) == 1);
    CHECK(cu.stream_synchronize(stream) == 0);
    CHECK(all(pinned, SENT, 0xc5));
    EXPECT(lf_release(ch, &m), LF_OK);
    EXPECT(lf_recv(ch, 30 * SECOND, &m), LF_ERR_PEER_GONE);
    CHECK(cu.mem_free_host(pinned) == 0);
    CHECK(cu.stream_destroy(stream) == 0 && cu.destroy_semaphore(semaphore) == 0);
    lf_channel_free(ch);
    lf_context_free(context);
    return failures != 0;
}

static int dir_is_empty(const char *path) {
    DIR *dir = opendir(path);
    struct dirent *e;
    int empty = 1;
    if (dir == NULL) return 0;
    while ((e = readdir(dir)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) empty = 0;
    closedir(dir);
    return empty;
}

int main(void) {
    char dir[] = "/tmp/lf-c-cuda-channel-XXXXXX";
    char name[64], ordered[80];
    int status = 0;
    if (mkdtemp(dir) == NULL || pipe(gate) != 0) return 1;
    setenv("LF_RUNTIME_DIR", dir, 1);
    snprintf(name, sizeof name, "c-cuda-test-%d", (int)getpid());
    snprintf(ordered, sizeof ordered, "%s-ordered", name);
    fflush(NULL);
    /* Nothing of CUDA or lava-flow exists before the fork: CUDA does not survive one. */
    pid_t child = fork();
    if (child == 0) {
        int rc = run_producer(name);
        if (rc == 0) rc = run_producer_ordered(ordered);
        fflush(NULL);
        _exit(rc);
    }
    CHECK(child > 0);
    int consumer = run_consumer(name);
    if (consumer == 0) consumer = run_consumer_ordered(ordered);
    CHECK(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == (consumer == SKIPPED ? SKIPPED : 0));
    CHECK(dir_is_empty(dir));
    rmdir(dir);
    if (failures == 0 && consumer == SKIPPED) return SKIPPED;
    if (failures == 0) printf("test_cuda_channel: passed\n");
    return failures != 0;
}
