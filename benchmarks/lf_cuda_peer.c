/* A lava-flow GPU buffer handed from a producer on GPU 0 to a consumer on GPU 1, which copies
 * it into its own memory, beside cuMemcpyPeer in one process and beside the staged route, in
 * one run. Needs two GPUs of one host with a peer path (NVLink or PCIe peer to peer).
 *
 * The program forks: the parent is the producer P, the child the consumer C. P uses Vulkan only
 * (its lf_context on the Vulkan device whose UUID is CUDA device 0's): it never loads CUDA. C
 * loads the CUDA driver (dlopen, through cuda_driver_api.h: no CUDA toolkit needed to build),
 * makes GPU 1's primary context current, opens its lf_context on GPU 1's Vulkan device, and tells
 * P GPU 0's UUID over a socketpair made before the fork, which also carries the control messages
 * (which case comes next, and C's own timings).
 *
 * Channels: "<tag>-peer" (cuda_ipc allowed: lava-flow's GPU buffers go by reference, the
 * consumer imports each arena into CUDA on GPU 0 once and reaches it from GPU 1 with peer
 * access), and "<tag>-staged" made with LF_TRANSPORTS=shm,vulkan_ipc in both processes, so that
 * cuda_ipc is not allowed and GPU buffers are staged through host memory. P checks each
 * channel's report (lf_channel_transport) and fails where it names another route.
 *
 * Cases, per size (64 MiB, 1 MiB, 4 KiB unless --sizes says otherwise); P fills one GPU buffer
 * of the size once (lf_buffer_write of a word pattern), and C checks the first and last word of
 * the first message of each case after its copy:
 *   lf_peer        P: lf_send_buffer on the peer channel, lf_wait_completed. C: lf_recv,
 *                  lf_message_cuda_ptr (GPU 0's memory), cuMemcpyPeerAsync into its own
 *                  cuMemAlloc'd memory on GPU 1 on a stream of GPU 0's context (the memory's
 *                  own device, which lava-flow let reach GPU 1's memory), cuStreamSynchronize,
 *                  lf_release. Timed at P, from the send to the completion: one hand-off and
 *                  copy. LF_PEER_COPY=pull issues the copy on a stream of GPU 1 instead
 *                  (cuMemcpyPeerAsync), LF_PEER_COPY=dtod as cuMemcpyDtoDAsync there: both
 *                  about a tenth as fast on the H200 pair.
 *   lf_staged      the same on the staged channel: C's message is host bytes, copied with
 *                  cuMemcpyHtoDAsync into the same memory.
 *   cumemcpypeer   in C alone: cuMemcpyPeerAsync of the size from a cuMemAlloc'd buffer on GPU 0
 *                  to one on GPU 1 and cuStreamSynchronize, after cuCtxEnablePeerAccess from
 *                  GPU 1's context to GPU 0's (which reports whether lava-flow had enabled it
 *                  already: lf_peer of the first size runs first).
 * Rows: p50 and p99 per hand-off and copy, and GB/s at the p50. At the end, per size: lf_peer's
 * bandwidth over cuMemcpyPeer's (the target: at least 0.9x at 64 MiB) and over the staged
 * route's.
 *
 * Build and run:
 *   cc -O2 -I<prefix>/include benchmarks/lf_cuda_peer.c -L<prefix>/lib -llava_flow -ldl
 *      -Wl,-rpath,<prefix>/lib -o lf_cuda_peer
 *   ./lf_cuda_peer [--quick] [--sizes 67108864,1048576,4096]
 * Output: table lines, plus one `JSON {...}` line per row (grep '^JSON '). Exits 77 without a
 * CUDA driver, with fewer than two GPUs or without a peer path, and non-zero on any failure, in
 * either process. Socket reads and lava-flow waits time out after 30 s, and a watchdog ends a
 * process that makes no progress for 120 s. Plain C11. */
#define _GNU_SOURCE
#include <lava_flow.h>

#include "cuda_driver_api.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SKIPPED 77
#define TIMEOUT_S 30
#define TIMEOUT_NS ((int64_t)TIMEOUT_S * 1000000000)
#define WATCHDOG_S 120
#define MAX_SIZES 8
#define CASES 3

static const char *g_role = "main";
static int g_sock = -1;
static pid_t g_child = -1;

__attribute__((noreturn, format(printf, 1, 2))) static void fail(const char *format, ...) {
    fflush(stdout);
    fprintf(stderr, "lf_cuda_peer [%s]: FAIL ", g_role);
    va_list args;
    va_start(args, format);
    vfprintf(stderr, format, args);
    va_end(args);
    fputc('\n', stderr);
    fflush(stderr);
    if (g_child > 0) {
        kill(g_child, SIGKILL);
        waitpid(g_child, NULL, 0);
    }
    _exit(1);
}

static void on_watchdog(int signal_number) {
    (void)signal_number;
    static const char text[] = "lf_cuda_peer: FAIL no progress for 120 s\n";
    ssize_t ignored = write(2, text, sizeof text - 1);
    (void)ignored;
    if (g_child > 0) kill(g_child, SIGKILL);
    _exit(1);
}

static void progress(void) { alarm(WATCHDOG_S); }

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

#define CU(call)                                                                                  \
    do {                                                                                          \
        cu_result rc_ = (call);                                                                   \
        if (rc_ != 0) fail("%s: %s (CUDA error %d)", #call, cu_error(rc_), rc_);                  \
    } while (0)

#define LF(call)                                                                                  \
    do {                                                                                          \
        lf_status status_ = (call);                                                               \
        if (status_ != LF_OK) fail("%s: %s: %s", #call, lf_status_str(status_), lf_last_error_message()); \
    } while (0)

/* ---- the socket: P asks, C answers ---- */

enum { OP_UUID = 1, OP_SKIP, OP_CASE, OP_QUIT, OP_ACK };
enum { CASE_PEER = 0, CASE_STAGED = 1, CASE_CUMEMCPYPEER = 2 };
static const char *const case_names[CASES] = {"lf_peer", "lf_staged", "cumemcpypeer"};

typedef struct {
    uint32_t op, which;
    uint64_t size, iters;
    double p50_us, p99_us;
    unsigned char uuid[16];
    char text[256];
} Msg;

static void send_msg(const Msg *m) {
    const char *p = (const char *)m;
    size_t n = sizeof *m;
    while (n > 0) {
        ssize_t w = send(g_sock, p, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            fail("send: %s", strerror(errno));
        }
        p += w;
        n -= (size_t)w;
    }
}

static Msg recv_msg(void) {
    Msg m;
    char *p = (char *)&m;
    size_t n = sizeof m;
    while (n > 0) {
        ssize_t r = recv(g_sock, p, n, 0);
        if (r == 0) fail("the peer closed the socket (its error, if any, is above)");
        if (r < 0) {
            if (errno == EINTR) continue;
            fail("recv: %s", strerror(errno));
        }
        p += r;
        n -= (size_t)r;
    }
    return m;
}

static Msg msg(uint32_t op) {
    Msg m;
    memset(&m, 0, sizeof m);
    m.op = op;
    return m;
}

/* ---- shared by both ---- */

/* Word `i` of every message of `size` bytes. */
static uint32_t word(size_t i, size_t size) { return (uint32_t)(i * 2654435761u) ^ (uint32_t)(size >> 2); }

static int by_value(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double percentile(double *v, size_t n, double p) {
    qsort(v, n, sizeof *v, by_value);
    size_t at = (size_t)(p * (double)(n - 1) + 0.5);
    return v[at < n ? at : n - 1];
}

/* How many timed iterations a size gets: about `bytes` moved, within [lo, hi]. */
static uint64_t iterations(size_t size, double bytes, uint64_t lo, uint64_t hi, int quick) {
    double n = bytes / (double)size;
    uint64_t k = n < (double)lo ? lo : n > (double)hi ? hi : (uint64_t)n;
    return quick ? (k + 1) / 2 : k;
}

/* Both ends of "<tag>-peer" then "<tag>-staged", each end creating its channels in the same order. */
static void channels(lf_context *context, const char *tag, lf_role role, size_t largest, lf_channel *out[2]) {
    lf_location *here = NULL;
    LF(lf_location_detect(&here));
    lf_channel_config config;
    LF(lf_channel_config_init(&config, sizeof config));
    config.wait_strategy = LF_WAIT_BUSY_POLL;
    config.rendezvous_timeout_ns = TIMEOUT_NS;
    config.capacity = 4;
    /* The staged route copies each message into the pool. */
    config.pool_size = largest * 2 > ((uint64_t)16 << 20) ? largest * 2 : ((uint64_t)16 << 20);
    char name[96];
    snprintf(name, sizeof name, "%s-peer", tag);
    unsetenv("LF_TRANSPORTS");
    LF(lf_channel_create(context, name, role, here, here, &config, &out[CASE_PEER]));
    snprintf(name, sizeof name, "%s-staged", tag);
    setenv("LF_TRANSPORTS", "shm,vulkan_ipc", 1);
    LF(lf_channel_create(context, name, role, here, here, &config, &out[CASE_STAGED]));
    unsetenv("LF_TRANSPORTS");
    lf_location_free(here);
}

static lf_context *context_on(const unsigned char uuid[16]) {
    lf_context_config cc;
    LF(lf_context_config_init(&cc, sizeof cc));
    cc.gpu_policy = LF_GPU_REQUIRED;
    cc.gpu_device_select = LF_GPU_DEVICE_UUID;
    memcpy(cc.gpu_device_uuid, uuid, 16);
    lf_context *context = NULL;
    LF(lf_context_create(&cc, &context));
    return context;
}

/* ---- consumer C: CUDA on GPU 1 ---- */

static cu_context g_ctx0, g_ctx1;

/* cuMemcpyPeer between two buffers of this process: p50 and p99 of copy and synchronise. */
static void peer_baseline(Msg *m, cu_stream stream, cu_deviceptr dst, int *already) {
    cu_deviceptr src = 0;
    CU(cu.ctx_set_current(g_ctx0));
    CU(cu.mem_alloc(&src, m->size));
    CU(cu.memset_d32(src, 0x5a5a5a5au, m->size / 4));
    CU(cu.ctx_synchronize());
    CU(cu.ctx_set_current(g_ctx1));
    cu_result rc = cu.ctx_enable_peer_access(g_ctx0, 0);
    if (rc == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) {
        if (*already < 0) *already = 1;
    } else if (rc == 0) {
        if (*already < 0) *already = 0;
    } else {
        fail("cuCtxEnablePeerAccess from GPU 1 to GPU 0: %s (CUDA error %d)", cu_error(rc), rc);
    }
    uint64_t warm = m->iters / 10 + 2;
    double *t = calloc(m->iters, sizeof *t);
    if (t == NULL) fail("out of memory");
    for (uint64_t i = 0; i < warm + m->iters; i++) {
        double t0 = now_us();
        CU(cu.memcpy_peer_async(dst, g_ctx1, src, g_ctx0, m->size, stream));
        CU(cu.stream_synchronize(stream));
        if (i >= warm) t[i - warm] = now_us() - t0;
        if (i % 64 == 0) progress();
    }
    m->p99_us = percentile(t, m->iters, 0.99);
    m->p50_us = percentile(t, m->iters, 0.50);
    free(t);
    CU(cu.ctx_set_current(g_ctx0));
    CU(cu.mem_free(src));
    CU(cu.ctx_set_current(g_ctx1));
}

/* Receives m->iters messages plus the warm-up on `channel`, each copied into `dst`. */
static void receive_case(lf_channel *channel, const Msg *m, cu_stream stream, cu_deviceptr dst) {
    uint64_t total = m->iters / 10 + 2 + m->iters;
    for (uint64_t i = 0; i < total; i++) {
        lf_message message;
        LF(lf_recv(channel, TIMEOUT_NS, &message));
        if (message.len != m->size) fail("a message of %zu bytes, not %llu", message.len, (unsigned long long)m->size);
        if (m->which == CASE_PEER) {
            uint64_t ptr = 0;
            int device = -1;
            LF(lf_message_cuda_ptr(channel, &message, &ptr, &device));
            if (device != 0) fail("the message is memory of CUDA device %d, not the producer's GPU 0", device);
            /* A peer copy between the two GPUs' contexts (the memory is GPU 0's, imported there);
             * LF_PEER_COPY=dtod copies it as any device address instead. */
            const char *how = getenv("LF_PEER_COPY");
            if (how != NULL && strcmp(how, "dtod") == 0) {
                CU(cu.memcpy_dtod_async(dst, ptr, m->size, stream));
            } else if (how != NULL && strcmp(how, "pull") == 0) {
                CU(cu.memcpy_peer_async(dst, g_ctx1, ptr, g_ctx0, m->size, stream));
            } else {
                /* On a stream of GPU 0's context: lava-flow enabled its peer access to GPU 1. */
                static cu_stream push = NULL;
                if (push == NULL) {
                    CU(cu.ctx_set_current(g_ctx0));
                    CU(cu.stream_create(&push, CU_STREAM_NON_BLOCKING));
                    CU(cu.ctx_set_current(g_ctx1));
                }
                CU(cu.memcpy_peer_async(dst, g_ctx1, ptr, g_ctx0, m->size, push));
                CU(cu.stream_synchronize(push));
            }
        } else {
            if (message.data == NULL) fail("a staged message without host bytes");
            CU(cu.memcpy_htod_async(dst, message.data, m->size, stream));
        }
        CU(cu.stream_synchronize(stream));
        if (i == 0) {
            uint32_t first = 0, last = 0;
            size_t words = m->size / 4;
            CU(cu.memcpy_dtoh(&first, dst, 4));
            CU(cu.memcpy_dtoh(&last, dst + (words - 1) * 4, 4));
            if (first != word(0, m->size) || last != word(words - 1, m->size))
                fail("%s, %llu bytes: the copy holds %#x...%#x, not the producer's %#x...%#x", case_names[m->which],
                     (unsigned long long)m->size, first, last, word(0, m->size), word(words - 1, m->size));
        }
        LF(lf_release(channel, &message));
        if (i % 64 == 0) progress();
    }
}

static int consumer(const char *tag) {
    g_role = "consumer";
    progress();
    char why[200];
    Msg m = msg(OP_SKIP);
    int count = 0, can = 0;
    if (!cu_load(why, sizeof why)) {
        snprintf(m.text, sizeof m.text, "%s", why);
    } else if (cu.device_get_count(&count), count < 2) {
        snprintf(m.text, sizeof m.text, "%d CUDA device(s): this benchmark needs two GPUs", count);
    } else if (cu.device_can_access_peer(&can, 1, 0), !can) {
        snprintf(m.text, sizeof m.text, "GPU 1 has no peer path to GPU 0 (cuDeviceCanAccessPeer)");
    }
    if (m.text[0] != '\0') {
        send_msg(&m);
        return SKIPPED;
    }
    unsigned char uuid0[16], uuid1[16];
    CU(cu.device_get_uuid(&uuid0, 0));
    CU(cu.device_get_uuid(&uuid1, 1));
    CU(cu.primary_ctx_retain(&g_ctx0, 0));
    CU(cu.primary_ctx_retain(&g_ctx1, 1));
    CU(cu.ctx_set_current(g_ctx1));
    m = msg(OP_UUID);
    memcpy(m.uuid, uuid0, 16);
    char name0[96] = "", name1[96] = "";
    CU(cu.device_get_name(name0, sizeof name0, 0));
    CU(cu.device_get_name(name1, sizeof name1, 1));
    snprintf(m.text, sizeof m.text, "GPU 0 %s, GPU 1 %s", name0, name1);
    send_msg(&m);
    Msg setup = recv_msg();
    if (setup.op != OP_UUID) fail("expected the largest size, got op %u", setup.op);
    lf_context *context = context_on(uuid1);
    lf_channel *ch[2];
    channels(context, tag, LF_ROLE_CONSUMER, setup.size, ch);
    cu_stream stream = NULL;
    CU(cu.stream_create(&stream, CU_STREAM_NON_BLOCKING));
    int already = -1;
    for (;;) {
        Msg c = recv_msg();
        progress();
        if (c.op == OP_QUIT) break;
        if (c.op != OP_CASE) fail("unexpected op %u", c.op);
        cu_deviceptr dst = 0;
        CU(cu.mem_alloc(&dst, c.size));
        if (c.which == CASE_CUMEMCPYPEER) {
            peer_baseline(&c, stream, dst, &already);
            snprintf(c.text, sizeof c.text, "%s",
                     already == 1 ? "peer access from GPU 1 to GPU 0 was enabled already (by lava-flow's import)"
                                  : "peer access from GPU 1 to GPU 0 enabled here");
        } else {
            receive_case(ch[c.which], &c, stream, dst);
        }
        CU(cu.mem_free(dst));
        c.op = OP_ACK;
        send_msg(&c);
    }
    CU(cu.stream_destroy(stream));
    lf_channel_free(ch[0]);
    lf_channel_free(ch[1]);
    lf_context_free(context);
    return 0;
}

/* ---- producer P: Vulkan on GPU 0, no CUDA ---- */

typedef struct {
    int quick;
    unsigned n_sizes;
    size_t sizes[MAX_SIZES];
} Options;

static void print_row(const char *name, size_t size, uint64_t iters, double p50, double p99, const char *note) {
    double gbps = p50 > 0 ? (double)size / (p50 * 1e3) : 0;
    printf("%-14s %10zu %8llu %12.2f %12.2f %10.2f  %s\n", name, size, (unsigned long long)iters, p50, p99, gbps, note);
    printf("JSON {\"case\":\"%s\",\"size\":%zu,\"iters\":%llu,\"p50_us\":%.3f,\"p99_us\":%.3f,\"gbps\":%.3f}\n", name,
           size, (unsigned long long)iters, p50, p99, gbps);
}

/* One case of hand-offs on `channel`: the buffer sent, its completion waited for, iters times. */
static double send_case(lf_channel *channel, const lf_buffer *buffer, int which, size_t size, uint64_t iters) {
    Msg c = msg(OP_CASE);
    c.which = (uint32_t)which;
    c.size = size;
    c.iters = iters;
    send_msg(&c);
    uint64_t warm = iters / 10 + 2;
    double *t = calloc(iters, sizeof *t);
    if (t == NULL) fail("out of memory");
    for (uint64_t i = 0; i < warm + iters; i++) {
        uint64_t sequence = 0;
        double t0 = now_us();
        LF(lf_send_buffer(channel, buffer, 0, size, TIMEOUT_NS, &sequence));
        LF(lf_wait_completed(channel, sequence, TIMEOUT_NS));
        if (i >= warm) t[i - warm] = now_us() - t0;
        if (i % 64 == 0) progress();
    }
    Msg ack = recv_msg();
    if (ack.op != OP_ACK) fail("expected an ACK, got op %u", ack.op);
    double p99 = percentile(t, iters, 0.99), p50 = percentile(t, iters, 0.50);
    print_row(case_names[which], size, iters, p50, p99, "");
    free(t);
    return p50;
}

static void require(lf_channel *channel, const char *words, const char *what) {
    const char *name = NULL, *reason = NULL;
    LF(lf_channel_transport(channel, &name, &reason));
    if (strstr(reason, words) == NULL) fail("the %s channel's report lacks \"%s\": %s", what, words, reason);
    printf("%s channel (%s): %s\n", what, name, reason);
}

static int producer(const Options *o, const char *tag) {
    g_role = "producer";
    progress();
    Msg hello = recv_msg();
    if (hello.op == OP_SKIP) {
        printf("lf_cuda_peer: skipped: %s\n", hello.text);
        return SKIPPED;
    }
    if (hello.op != OP_UUID) fail("expected GPU 0's UUID, got op %u", hello.op);
    printf("%s; the producer uses Vulkan only\n", hello.text);
    size_t largest = 0;
    for (unsigned i = 0; i < o->n_sizes; i++) largest = o->sizes[i] > largest ? o->sizes[i] : largest;
    Msg setup = msg(OP_UUID);
    setup.size = largest;
    send_msg(&setup);
    lf_context *context = context_on(hello.uuid);
    lf_channel *ch[2];
    channels(context, tag, LF_ROLE_PRODUCER, largest, ch);
    require(ch[CASE_PEER], "GPU buffers: cuda_ipc, by reference", "peer");
    require(ch[CASE_STAGED], "GPU buffers: staged", "staged");

    double p50[MAX_SIZES][CASES];
    printf("\n%-14s %10s %8s %12s %12s %10s\n", "case", "bytes", "iters", "p50_us", "p99_us", "GB/s@p50");
    for (unsigned at = 0; at < o->n_sizes; at++) {
        size_t size = o->sizes[at];
        lf_buffer *buffer = NULL;
        LF(lf_alloc(context, size, LF_MEMORY_GPU_DEVICE_LOCAL, -1, LF_HUGEPAGE_DEFAULT, &buffer));
        uint32_t *words = malloc(size);
        if (words == NULL) fail("out of memory");
        for (size_t i = 0; i < size / 4; i++) words[i] = word(i, size);
        LF(lf_buffer_write(buffer, 0, words, size));
        free(words);
        uint64_t fast = iterations(size, 4.0 * (1u << 30), 50, 4000, o->quick);
        uint64_t slow = iterations(size, 512.0 * (1u << 20), 10, 4000, o->quick);
        p50[at][CASE_PEER] = send_case(ch[CASE_PEER], buffer, CASE_PEER, size, fast);
        p50[at][CASE_STAGED] = send_case(ch[CASE_STAGED], buffer, CASE_STAGED, size, slow);
        Msg c = msg(OP_CASE);
        c.which = CASE_CUMEMCPYPEER;
        c.size = size;
        c.iters = fast;
        send_msg(&c);
        Msg r = recv_msg();
        if (r.op != OP_ACK) fail("expected an ACK, got op %u", r.op);
        p50[at][CASE_CUMEMCPYPEER] = r.p50_us;
        print_row(case_names[CASE_CUMEMCPYPEER], size, fast, r.p50_us, r.p99_us, r.text);
        lf_free(buffer);
    }
    printf("\n%10s %22s %22s\n", "bytes", "lf_peer/cuMemcpyPeer", "lf_peer/staged");
    for (unsigned at = 0; at < o->n_sizes; at++) {
        /* Bandwidth ratios: the inverse of the times'. */
        double vs_peer = p50[at][CASE_PEER] > 0 ? p50[at][CASE_CUMEMCPYPEER] / p50[at][CASE_PEER] : 0;
        double vs_staged = p50[at][CASE_PEER] > 0 ? p50[at][CASE_STAGED] / p50[at][CASE_PEER] : 0;
        printf("%10zu %21.3fx %21.2fx\n", o->sizes[at], vs_peer, vs_staged);
        printf("JSON {\"case\":\"ratio\",\"size\":%zu,\"lf_peer_vs_cumemcpypeer\":%.4f,\"lf_peer_vs_staged\":%.3f}\n",
               o->sizes[at], vs_peer, vs_staged);
    }
    send_msg(&(Msg){.op = OP_QUIT});
    lf_channel_free(ch[0]);
    lf_channel_free(ch[1]);
    lf_context_free(context);
    return 0;
}

/* ---- options and main ---- */

static void parse_sizes(Options *o, const char *list) {
    o->n_sizes = 0;
    for (const char *at = list;;) {
        char *end = NULL;
        unsigned long long n = strtoull(at, &end, 10);
        if (end == at || (*end != ',' && *end != '\0') || n == 0 || n % 4 != 0 || o->n_sizes == MAX_SIZES) {
            fprintf(stderr, "--sizes: '%s' is not a list of at most %d positive multiples of 4 bytes\n", list,
                    MAX_SIZES);
            exit(2);
        }
        o->sizes[o->n_sizes++] = (size_t)n;
        if (*end == '\0') return;
        at = end + 1;
    }
}

int main(int argc, char **argv) {
    Options o;
    memset(&o, 0, sizeof o);
    parse_sizes(&o, "67108864,1048576,4096");
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            o.quick = 1;
        } else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            parse_sizes(&o, argv[++i]);
        } else {
            fprintf(stderr, "usage: %s [--quick] [--sizes N,N,...]\n", argv[0]);
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGALRM, on_watchdog);
    char tag[64];
    snprintf(tag, sizeof tag, "lf-cuda-peer-%d", (int)getpid());
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) {
        perror("socketpair");
        return 1;
    }
    /* Bounded reads: a peer that died or hangs fails the run instead of stalling it. */
    struct timeval timeout = {WATCHDOG_S, 0};
    for (int i = 0; i < 2; i++)
        if (setsockopt(pair[i], SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout) != 0) {
            perror("setsockopt");
            return 1;
        }
    fflush(NULL);
    /* Nothing of CUDA or lava-flow exists before the fork: neither survives one. */
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        return 1;
    }
    if (child == 0) {
        close(pair[0]);
        g_sock = pair[1];
        int rc = consumer(tag);
        fflush(NULL);
        _exit(rc);
    }
    close(pair[1]);
    g_sock = pair[0];
    g_child = child;
    int rc = producer(&o, tag);
    close(g_sock);
    int status = 0;
    waitpid(child, &status, 0);
    g_child = -1;
    if (rc == SKIPPED) return SKIPPED;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "lf_cuda_peer: FAIL the consumer process ended with status %d\n", status);
        return 1;
    }
    if (rc == 0) printf("\nlf_cuda_peer: done\n");
    return rc;
}
