/* CUDA memory the application allocated (cuMemAlloc), sent by reference through a channel to
 * another process, through the C API: the consumer (the parent) reads the producer's bytes
 * through lf_message_cuda_ptr (cuMemcpyDtoH), overwrites them and releases the message; the
 * producer (the forked child), once lf_wait_completed returns, reads the consumer's bytes in its
 * own allocation. The message has no host pointer, lf_message_buffer is refused, and
 * lf_message_cuda_ptr of a host message says what it is. The channel's transport names
 * cuda_ipc.
 *
 * libcuda.so.1 is loaded with dlopen after the fork (no CUDA at build time, CUDA initialised in
 * each process on its own). Without a CUDA driver or device it prints why and exits 77
 * (skipped). Plain C11. */
#define _GNU_SOURCE
#include <lava_flow.h>

#include <dirent.h>
#include <dlfcn.h>
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

static struct {
    cu_mem_alloc_fn mem_alloc;
    cu_mem_free_fn mem_free;
    cu_memset_d8_fn memset_d8;
    cu_memcpy_dtoh_fn memcpy_dtoh;
    cu_ctx_synchronize_fn synchronize;
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
    int count = 0, device = 0;
    void *context = NULL;
    if (init(0) != 0 || device_count(&count) != 0 || count == 0) {
        printf("test_cuda_channel: %s skipped: no CUDA driver (no device visible)\n", who);
        return 0;
    }
    return device_get(&device, 0) == 0 && retain(&context, device) == 0 && set_current(context) == 0;
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
    char name[64];
    int status = 0;
    if (mkdtemp(dir) == NULL) return 1;
    setenv("LF_RUNTIME_DIR", dir, 1);
    snprintf(name, sizeof name, "c-cuda-test-%d", (int)getpid());
    fflush(NULL);
    /* Nothing of CUDA or lava-flow exists before the fork: CUDA does not survive one. */
    pid_t child = fork();
    if (child == 0) {
        int rc = run_producer(name);
        fflush(NULL);
        _exit(rc);
    }
    CHECK(child > 0);
    int consumer = run_consumer(name);
    CHECK(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == (consumer == SKIPPED ? SKIPPED : 0));
    CHECK(dir_is_empty(dir));
    rmdir(dir);
    if (failures == 0 && consumer == SKIPPED) return SKIPPED;
    if (failures == 0) printf("test_cuda_channel: passed\n");
    return failures != 0;
}
