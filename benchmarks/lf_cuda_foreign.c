/* CUDA memory the application allocated (a framework's tensor) handed to another process by
 * reference through lava-flow's cuda_ipc route, beside plain CUDA IPC in the same program and
 * run. The program forks: the parent is producer A, the child consumer B; each loads the CUDA
 * driver (dlopen, through cuda_driver_api.h: no CUDA toolkit needed to build) and makes device
 * 0's primary context current only after the fork (a CUDA context does not survive one), then
 * creates its lf_context and channels. A socketpair made before the fork carries the control messages
 * (which case comes next, and the whole CUDA IPC baseline); the lava-flow cases send nothing
 * but their own messages on the channels.
 *
 * Channels "<tag>-a2b" (A produces) and "<tag>-b2a" (B produces) busy-poll. The contexts open no
 * Vulkan device (LF_GPU_DISABLED): this route needs none, and strict_gpu concerns lava-flow's own
 * GPU buffers, which these channels never carry. Instead A checks that the channel's transport
 * names cuda_ipc and fails otherwise, so that no row measures another route.
 *
 * Cases, per size (4 KiB, 64 KiB, 1 MiB, 16 MiB unless --sizes says otherwise); every buffer
 * is its own allocation rounded up to 2 MiB, as cuda_ipc_pingpong's are. Before the warm-up A
 * fills each buffer with its own pattern (cuMemsetD32), and B reads the first and last word of
 * each buffer back once (cuMemcpyDtoH, in the warm-up) and checks them.
 *   cuda_ipc_handoff    the baseline, cuda_ipc_pingpong's `handoff` with the driver API. A
 *                       cycles through 4 cuMemAlloc buffers: cuEventRecord of its interprocess
 *                       event on its stream, then (buffer index, size) written to the socket,
 *                       with the buffer's cuIpcGetMemHandle on its first message (warm-up); B
 *                       opens each handle once (cuIpcOpenMemHandle, cached), cuStreamWaitEvent()s
 *                       on A's event (opened once) and replies on the socket. No completion:
 *                       A learns nothing about B's use of the buffer beyond the reply.
 *   lf_foreign_handoff  A cycles through 4 cuMemAlloc buffers, each registered once
 *                       (lf_register): it waits for lava-flow's completion of the buffer's
 *                       previous send (lf_wait_completed) and sends it (lf_send_buffer) on a2b;
 *                       B receives it (lf_recv; the allocation is opened once, on its first
 *                       message, and cached), takes lf_message_cuda_ptr, releases it and answers
 *                       8 bytes on b2a (lf_send); A receives and releases the answer. The route
 *                       synchronises on the host (the memory is complete when sent): no event.
 *   lf_vmm_handoff      the same with CUDA VMM memory as PyTorch's expandable segments make it:
 *                       one address reservation, 4 pieces (cuMemCreate with POSIX fd handles,
 *                       2 MiB granularity) mapped one after another with read-write access; each
 *                       piece is a buffer. Skipped where the device lacks fd-shareable VMM.
 *   lf_pool_handoff     the same with memory of a CUDA memory pool that exports POSIX fds
 *                       (cuMemPoolCreate with POSIX fd handle types, cuMemAllocFromPoolAsync: what
 *                       cudaMallocAsync makes from such a pool), 4 allocations of one pool. The
 *                       consumer imports an allocation while it holds a message into it and frees
 *                       the import at the release (CUDA has importers free first), so every
 *                       hand-off here pays an import and a free.
 *   Rows: half round trip p50/p99 over the timed iterations, and send_us: p50 of A's
 *   cuEventRecord (baseline) or lf_wait_completed + lf_send_buffer (lava-flow) calls.
 *   cuda_ipc_first      the first hand-off of a fresh buffer: A cuMemAllocs and fills one
 *                       (untimed), then cuIpcGetMemHandle and sends it with its message; B opens
 *                       it and replies at once, then checks it and closes it (close_us); A frees
 *                       it once B has closed it.
 *   lf_foreign_first    A cuMemAllocs and fills one (untimed), then lf_register and
 *   lf_vmm_first        lf_send_buffer (the export: a legacy IPC handle, a VMM piece's fd, or
 *   lf_pool_first       the pool's fd and the allocation's export data);
 *                       B's lf_recv opens it (the import), it takes lf_message_cuda_ptr and
 *                       answers at once, then checks it and releases it; A waits for the
 *                       completion, deregisters and frees.
 *   Rows, over 20 allocations per size: total (mean and p50): from the export's start to the
 *   answer back at A; ready_us: from the export's start to B holding the pointer (one way; the
 *   two processes read the same CLOCK_MONOTONIC); export_us: A's calls (register and send, or get
 *   handle and socket send); close_us: B's cuIpcCloseMemHandle.
 * At the end: lava-flow / CUDA IPC per size, p50 for the hand-offs, mean for the first ones.
 * Targets: a hand-off at most 0.5x CUDA IPC's under MPS. Run it with and without MPS.
 *
 * Build and run (one GPU; CUDA_VISIBLE_DEVICES picks it):
 *   cc -O2 -I<prefix>/include benchmarks/lf_cuda_foreign.c -L<prefix>/lib -llava_flow -ldl
 *      -Wl,-rpath,<prefix>/lib -o lf_cuda_foreign
 *   ./lf_cuda_foreign [--quick] [--sizes 4096,1048576]
 * Output: table lines, plus one `JSON {...}` line per row for scripts (grep '^JSON ').
 * --quick halves the iteration counts. Exits 77 without a CUDA driver or device, and non-zero on
 * any failure, in either process. No wait is unbounded: lava-flow waits and socket reads time out
 * after 30 s, a watchdog ends a process stuck for longer, and the parent takes the child with it.
 * Plain C11. */
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
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SKIPPED 77
#define TIMEOUT_S 30 /* the longest either side waits for the other */
#define TIMEOUT_NS ((int64_t)TIMEOUT_S * 1000000000)
#define WATCHDOG_S 120 /* no phase of the run takes this long */
#define SLOTS 4u       /* buffers A cycles through in a hand-off case */
#define GRANULE ((size_t)2 << 20)
#define MAX_SIZES 16

static const char *g_role = "main";
static int g_sock = -1;
static pid_t g_child = -1; /* set in the parent only */

/* ---- failing, and the watchdog ---- */

static void reap(pid_t pid, int grace_ms, int *status) {
    for (int waited = 0;; waited += 10) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid) return;
        if (r < 0) {
            *status = -1;
            return;
        }
        if (waited >= grace_ms) {
            kill(pid, SIGKILL);
            waitpid(pid, status, 0);
            return;
        }
        usleep(10000);
    }
}

__attribute__((noreturn, format(printf, 1, 2))) static void fail(const char *format, ...) {
    fflush(stdout);
    fprintf(stderr, "lf_cuda_foreign [%s]: FAIL ", g_role);
    va_list args;
    va_start(args, format);
    vfprintf(stderr, format, args);
    va_end(args);
    fputc('\n', stderr);
    fflush(stderr);
    if (g_child > 0) {
        kill(g_child, SIGKILL); /* it may be spinning on a channel that will never speak again */
        waitpid(g_child, NULL, 0);
    }
    _exit(1); /* no atexit teardown of a CUDA context or channel in an unknown state */
}

static void on_watchdog(int signal_number) {
    (void)signal_number;
    static const char head[] = "lf_cuda_foreign [";
    static const char tail[] = "]: FAIL no progress for 120 s\n";
    ssize_t ignored = write(2, head, sizeof head - 1);
    ignored = write(2, g_role, strlen(g_role));
    ignored = write(2, tail, sizeof tail - 1);
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

/* The same clock in both processes: B's timestamps are comparable with A's. */
static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* ---- CUDA and lava-flow checks ---- */

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

/* Loads the driver and makes device 0's primary context current; 0 and why without. */
static int cuda_setup(char *why, size_t why_len) {
    if (!cu_load(why, why_len)) return 0;
    int device = 0;
    cu_context context = NULL;
    CU(cu.device_get(&device, 0));
    CU(cu.primary_ctx_retain(&context, device));
    CU(cu.ctx_set_current(context));
    return 1;
}

/* ---- buffers: one allocation each, of cuMemAlloc or one VMM piece ---- */

static size_t rounded(size_t n, size_t granule) { return (n + granule - 1) / granule * granule; }

/* Buffer `index`'s pattern at `size`: B checks that each message points at the buffer it names. */
static uint32_t pattern(uint64_t index, size_t size) {
    return (uint32_t)(0x9e3779b9u * (uint32_t)(index + 1)) ^ (uint32_t)(size >> 2);
}

static cu_mem_allocation_prop vmm_prop(void) {
    cu_mem_allocation_prop prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requested_handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    return prop;
}

/* What memory a case hands off: cuMemAlloc, VMM pieces, or a memory pool that exports fds. */
enum { K_LEGACY, K_VMM, K_POOL };

/* `count` buffers of `size` bytes. VMM: one reservation, `count` pieces mapped one after another.
 * Pool: `count` allocations of one pool made with POSIX fd handle types (cuMemPoolCreate,
 * cuMemAllocFromPoolAsync), as cudaMallocAsync with an IPC pool makes them. */
typedef struct {
    int kind;
    unsigned count;
    size_t piece;
    cu_deviceptr base; /* the VMM reservation */
    cu_mem_pool pool;
    cu_deviceptr ptr[SLOTS];
    cu_mem_handle handle[SLOTS];
} Buffers;

static size_t vmm_granule = GRANULE;

static Buffers buffers_alloc(int kind, unsigned count, size_t size) {
    Buffers b;
    memset(&b, 0, sizeof b);
    b.kind = kind;
    b.count = count;
    b.piece = rounded(size, kind == K_VMM ? vmm_granule : GRANULE);
    if (kind == K_LEGACY) {
        for (unsigned i = 0; i < count; i++) CU(cu.mem_alloc(&b.ptr[i], b.piece));
        return b;
    }
    if (kind == K_POOL) {
        cu_mem_pool_props props;
        memset(&props, 0, sizeof props);
        props.alloc_type = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = 0;
        CU(cu.mem_pool_create(&b.pool, &props));
        for (unsigned i = 0; i < count; i++) CU(cu.mem_alloc_from_pool_async(&b.ptr[i], b.piece, b.pool, NULL));
        CU(cu.stream_synchronize(NULL));
        return b;
    }
    cu_mem_allocation_prop prop = vmm_prop();
    cu_mem_access_desc access = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CU(cu.mem_address_reserve(&b.base, b.piece * count, 0, 0, 0));
    for (unsigned i = 0; i < count; i++) {
        b.ptr[i] = b.base + b.piece * i;
        CU(cu.mem_create(&b.handle[i], b.piece, &prop, 0));
        CU(cu.mem_map(b.ptr[i], b.piece, 0, b.handle[i], 0));
        CU(cu.mem_set_access(b.ptr[i], b.piece, &access, 1));
    }
    return b;
}

static void buffers_free(Buffers *b) {
    for (unsigned i = 0; i < b->count; i++) {
        if (b->kind == K_LEGACY) {
            CU(cu.mem_free(b->ptr[i]));
        } else if (b->kind == K_POOL) {
            CU(cu.mem_free_async(b->ptr[i], NULL));
        } else {
            CU(cu.mem_unmap(b->ptr[i], b->piece));
            CU(cu.mem_release(b->handle[i]));
        }
    }
    if (b->kind == K_VMM) CU(cu.mem_address_free(b->base, b->piece * b->count));
    if (b->kind == K_POOL) {
        CU(cu.stream_synchronize(NULL));
        CU(cu.mem_pool_destroy(b->pool));
    }
    memset(b, 0, sizeof *b);
}

static void fill(cu_deviceptr ptr, size_t size, uint32_t value) { CU(cu.memset_d32(ptr, value, size / 4)); }

/* B's check of a buffer it received: its first and last word. */
static void check_words(cu_deviceptr ptr, size_t size, uint32_t want, const char *what, uint64_t index) {
    uint32_t first = 0, last = 0;
    CU(cu.memcpy_dtoh(&first, ptr, 4));
    CU(cu.memcpy_dtoh(&last, ptr + size - 4, 4));
    if (first != want || last != want)
        fail("%s: buffer %llu of %zu bytes reads %#x..%#x, A wrote %#x: the message points at the wrong memory", what,
             (unsigned long long)index, size, first, last, want);
}

/* ---- the socket: A asks, B answers ---- */

enum {
    OP_HELLO = 1,  /* + A's event handle */
    OP_LF,         /* B serves `b` lava-flow messages of `size`; a: PHASE_*; then a second ACK */
    OP_IPC,        /* wait on A's event for slot `index`; + a memory handle with HAS_HANDLE */
    OP_IPC_CLOSE,  /* close every opened slot */
    OP_IPC_FIRST,  /* + a memory handle: open, ACK (a = ns when open), check, close */
    OP_IPC_CLOSED, /* reply a = the last close's ns */
    OP_QUIT,
    OP_ACK,
};
enum { PHASE_HANDOFF = 1, PHASE_FIRST = 2 };
#define HAS_HANDLE 1u

typedef struct {
    uint32_t op, index, flags, reserved;
    uint64_t size, a, b;
} Msg;

static void send_all(const void *data, size_t n) {
    const char *p = data;
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

static void recv_all(void *data, size_t n) {
    char *p = data;
    while (n > 0) {
        ssize_t r = recv(g_sock, p, n, 0);
        if (r == 0) fail("the peer closed the socket (its error, if any, is above)");
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) fail("no word from the peer for %d s", TIMEOUT_S);
            fail("recv: %s", strerror(errno));
        }
        p += r;
        n -= (size_t)r;
    }
}

static Msg msg(uint32_t op, uint32_t index, uint64_t size, uint64_t a, uint64_t b) {
    Msg m;
    memset(&m, 0, sizeof m);
    m.op = op;
    m.index = index;
    m.size = size;
    m.a = a;
    m.b = b;
    return m;
}

static Msg await_ack(void) {
    Msg r;
    recv_all(&r, sizeof r);
    if (r.op != OP_ACK) fail("expected an ACK, got op %u", r.op);
    return r;
}

static Msg request(Msg m, const void *payload, size_t n) {
    send_all(&m, sizeof m);
    if (n > 0) send_all(payload, n);
    return await_ack();
}

/* ---- lava-flow set-up, the same in both processes ---- */

typedef struct {
    lf_context *context;
    lf_channel *tx, *rx;
} Lf;

/* A creates its producer first and B its consumer first, so that both meet on a2b first. */
static Lf lf_setup(const char *tag, int is_a) {
    Lf lf;
    memset(&lf, 0, sizeof lf);
    lf_context_config cc;
    LF(lf_context_config_init(&cc, sizeof cc));
    cc.gpu_policy = LF_GPU_DISABLED;
    LF(lf_context_create(&cc, &lf.context));
    lf_location *here = NULL;
    LF(lf_location_detect(&here));
    lf_channel_config config;
    LF(lf_channel_config_init(&config, sizeof config));
    config.wait_strategy = LF_WAIT_BUSY_POLL;
    config.rendezvous_timeout_ns = TIMEOUT_NS;
    char a2b[96], b2a[96];
    snprintf(a2b, sizeof a2b, "%s-a2b", tag);
    snprintf(b2a, sizeof b2a, "%s-b2a", tag);
    if (is_a) {
        LF(lf_channel_create(lf.context, a2b, LF_ROLE_PRODUCER, here, here, &config, &lf.tx));
        LF(lf_channel_create(lf.context, b2a, LF_ROLE_CONSUMER, here, here, &config, &lf.rx));
    } else {
        LF(lf_channel_create(lf.context, a2b, LF_ROLE_CONSUMER, here, here, &config, &lf.rx));
        LF(lf_channel_create(lf.context, b2a, LF_ROLE_PRODUCER, here, here, &config, &lf.tx));
    }
    lf_location_free(here);
    return lf;
}

static void lf_teardown(Lf *lf) {
    lf_channel_free(lf->tx);
    lf_channel_free(lf->rx);
    lf_context_free(lf->context);
    memset(lf, 0, sizeof *lf);
}

/* ---- consumer B ---- */

/* One lava-flow case: `count` CUDA messages of `size` bytes, each answered with 8 bytes. */
static void b_lf_phase(Lf *lf, const Msg *m) {
    const int first = m->a == PHASE_FIRST;
    const char *what = first ? "first hand-off" : "hand-off";
    for (uint64_t k = 0; k < m->b; k++) {
        lf_message in;
        LF(lf_recv(lf->rx, TIMEOUT_NS, &in));
        if ((in.flags & LF_MESSAGE_CUDA) == 0 || in.len != m->size)
            fail("%s %llu: a message of %zu bytes with flags %u, expected CUDA memory of %llu bytes", what,
                 (unsigned long long)k, in.len, in.flags, (unsigned long long)m->size);
        uint64_t ptr = 0;
        int device = -1;
        LF(lf_message_cuda_ptr(lf->rx, &in, &ptr, &device));
        if (device != 0)
            fail("%s %llu: the memory is on CUDA device %d, A's is on 0", what, (unsigned long long)k, device);
        uint64_t answer = 0;
        if (first) {
            /* Answer first: the check's copy is not part of the hand-off. */
            answer = now_ns();
            LF(lf_send(lf->tx, &answer, sizeof answer, TIMEOUT_NS, NULL));
            check_words(ptr, m->size, pattern(k, m->size), what, k);
            LF(lf_release(lf->rx, &in));
        } else {
            if (k < SLOTS) check_words(ptr, m->size, pattern(k, m->size), what, k);
            LF(lf_release(lf->rx, &in));
            LF(lf_send(lf->tx, &answer, sizeof answer, TIMEOUT_NS, NULL));
        }
    }
}

static int consumer(const char *tag) {
    g_role = "consumer B";
    progress();
    char why[256];
    if (!cuda_setup(why, sizeof why)) return SKIPPED; /* A says why */
    Lf lf = lf_setup(tag, 0);

    Msg hello;
    recv_all(&hello, sizeof hello);
    if (hello.op != OP_HELLO) fail("expected HELLO, got op %u", hello.op);
    cu_ipc_event_handle handle_a;
    recv_all(&handle_a, sizeof handle_a);
    cu_event event_a = NULL;
    cu_stream stream = NULL;
    CU(cu.ipc_open_event_handle(&event_a, handle_a));
    CU(cu.stream_create(&stream, CU_STREAM_NON_BLOCKING));
    Msg ack = msg(OP_ACK, 0, 0, 0, 0);
    send_all(&ack, sizeof ack);

    cu_deviceptr slots[SLOTS] = {0};
    uint64_t slot_size[SLOTS] = {0};
    uint64_t last_close_ns = 0;
    for (;;) {
        Msg m;
        recv_all(&m, sizeof m);
        if (m.op != OP_IPC) progress(); /* not a system call per measured hand-off */
        Msg r = msg(OP_ACK, 0, 0, 0, 0);
        switch (m.op) {
        case OP_LF:
            send_all(&r, sizeof r);
            b_lf_phase(&lf, &m);
            break; /* the second ACK: every message released */
        case OP_IPC:
            if (m.index >= SLOTS) fail("slot %u out of range", m.index);
            if (m.flags & HAS_HANDLE) {
                cu_ipc_mem_handle h;
                recv_all(&h, sizeof h);
                if (slots[m.index]) fail("slot %u is already open", m.index);
                CU(cu.ipc_open_mem_handle(&slots[m.index], h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
                slot_size[m.index] = m.size;
                check_words(slots[m.index], m.size, pattern(m.index, m.size), "CUDA IPC hand-off", m.index);
            }
            /* The cached pointer is what a real consumer would hand to its kernels. */
            if (!slots[m.index] || m.size > slot_size[m.index]) fail("slot %u is not open at that size", m.index);
            CU(cu.stream_wait_event(stream, event_a, 0));
            break;
        case OP_IPC_CLOSE:
            CU(cu.stream_synchronize(stream));
            for (unsigned s = 0; s < SLOTS; s++)
                if (slots[s]) {
                    CU(cu.ipc_close_mem_handle(slots[s]));
                    slots[s] = 0;
                }
            break;
        case OP_IPC_FIRST: {
            cu_ipc_mem_handle h;
            recv_all(&h, sizeof h);
            cu_deviceptr p = 0;
            CU(cu.ipc_open_mem_handle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
            r.a = now_ns();
            send_all(&r, sizeof r);
            check_words(p, m.size, pattern(m.index, m.size), "CUDA IPC first hand-off", m.index);
            uint64_t t0 = now_ns();
            CU(cu.ipc_close_mem_handle(p));
            last_close_ns = now_ns() - t0;
            continue; /* answered above */
        }
        case OP_IPC_CLOSED:
            r.a = last_close_ns;
            break;
        case OP_QUIT:
            CU(cu.stream_synchronize(stream));
            CU(cu.event_destroy(event_a));
            CU(cu.stream_destroy(stream));
            lf_teardown(&lf);
            send_all(&r, sizeof r);
            return 0;
        default:
            fail("unknown op %u", m.op);
        }
        send_all(&r, sizeof r);
    }
}

/* ---- producer A ---- */

typedef struct {
    int quick, vmm;
    size_t sizes[MAX_SIZES];
    unsigned n_sizes;
    int warm, iters, fresh;
} Options;

typedef struct {
    double p50, p99, mean;
} Stats;

static int by_value(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static Stats stats(double *v, size_t n) {
    Stats s = {0, 0, 0};
    if (n == 0) return s;
    qsort(v, n, sizeof *v, by_value);
    for (size_t i = 0; i < n; i++) s.mean += v[i];
    s.mean /= (double)n;
    s.p50 = v[n / 2];
    s.p99 = v[n * 99 / 100 < n - 1 ? n * 99 / 100 : n - 1];
    return s;
}

/* The row of each case at each size, for the ratios at the end. */
enum { C_IPC, C_FOREIGN, C_VMM, C_POOL, CASES };
static const char *const handoff_names[CASES] = {"cuda_ipc_handoff", "lf_foreign_handoff", "lf_vmm_handoff",
                                                 "lf_pool_handoff"};
static const char *const first_names[CASES] = {"cuda_ipc_first", "lf_foreign_first", "lf_vmm_first", "lf_pool_first"};
/* The case of each kind of memory lava-flow hands off. */
static const int kind_case[] = {[K_LEGACY] = C_FOREIGN, [K_VMM] = C_VMM, [K_POOL] = C_POOL};
static double handoff_p50[MAX_SIZES][CASES], first_mean[MAX_SIZES][CASES];

static double *samples(size_t n) {
    double *v = calloc(n ? n : 1, sizeof *v);
    if (v == NULL) fail("out of memory for %zu samples", n);
    return v;
}

/* lf_send_buffer, again while the consumer has not yet read earlier announcements. */
static uint64_t send_reference(lf_channel *tx, const lf_buffer *buffer, size_t len) {
    uint64_t seq = 0;
    double deadline = now_us() + TIMEOUT_S * 1e6;
    for (;;) {
        lf_status st = lf_send_buffer(tx, buffer, 0, len, TIMEOUT_NS, &seq);
        if (st == LF_OK) return seq;
        if (st != LF_ERR_WOULD_BLOCK || now_us() > deadline)
            fail("lf_send_buffer of %zu bytes of CUDA memory: %s: %s", len, lf_status_str(st), lf_last_error_message());
    }
}

/* The answer on b2a: 8 host bytes. */
static uint64_t recv_answer(lf_channel *rx) {
    lf_message in;
    uint64_t answer = 0;
    LF(lf_recv(rx, TIMEOUT_NS, &in));
    if (in.len != sizeof answer || in.data == NULL) fail("an answer of %zu bytes with flags %u", in.len, in.flags);
    memcpy(&answer, in.data, sizeof answer);
    LF(lf_release(rx, &in));
    return answer;
}

static void print_handoff(unsigned at, int c, size_t size, const Options *o, double *half, double *send_call) {
    Stats st = stats(half, (size_t)o->iters), sc = stats(send_call, (size_t)o->iters);
    handoff_p50[at][c] = st.p50;
    printf("  %-20s %10zu %10.2f %10.2f %10.2f\n", handoff_names[c], size, st.p50, st.p99, sc.p50);
    printf("JSON {\"case\":\"%s\",\"size\":%zu,\"iters\":%d,\"p50_us\":%.3f,\"p99_us\":%.3f,\"send_p50_us\":%.3f}\n",
           handoff_names[c], size, o->iters, st.p50, st.p99, sc.p50);
}

static void ipc_handoff(const Options *o, unsigned at, size_t size, cu_event event_a, cu_stream stream) {
    Buffers b = buffers_alloc(K_LEGACY, SLOTS, size);
    for (unsigned s = 0; s < SLOTS; s++) fill(b.ptr[s], size, pattern(s, size));
    CU(cu.ctx_synchronize());
    double *half = samples((size_t)o->iters), *record = samples((size_t)o->iters);
    for (int k = 0; k < o->warm + o->iters; k++) {
        uint32_t s = (uint32_t)k % SLOTS;
        int first = k < (int)SLOTS; /* each handle travels once, in the warm-up */
        cu_ipc_mem_handle h;
        memset(&h, 0, sizeof h);
        if (first) CU(cu.ipc_get_mem_handle(&h, b.ptr[s]));
        Msg m = msg(OP_IPC, s, size, 0, 0);
        m.flags = first ? HAS_HANDLE : 0;
        double t0 = now_us();
        CU(cu.event_record(event_a, stream));
        double recorded = now_us();
        send_all(&m, sizeof m);
        if (first) send_all(&h, sizeof h);
        await_ack();
        double t1 = now_us();
        if (k >= o->warm) {
            half[k - o->warm] = (t1 - t0) / 2;
            record[k - o->warm] = recorded - t0;
        }
    }
    request(msg(OP_IPC_CLOSE, 0, 0, 0, 0), NULL, 0); /* B closes its mappings before A frees */
    buffers_free(&b);
    print_handoff(at, C_IPC, size, o, half, record);
    free(half);
    free(record);
}

static void lf_handoff(const Options *o, unsigned at, size_t size, Lf *lf, int kind) {
    Buffers b = buffers_alloc(kind, SLOTS, size);
    lf_buffer *registered[SLOTS];
    for (unsigned s = 0; s < SLOTS; s++) {
        fill(b.ptr[s], size, pattern(s, size));
        LF(lf_register(lf->context, (void *)(uintptr_t)b.ptr[s], b.piece, &registered[s]));
    }
    CU(cu.ctx_synchronize()); /* the route synchronises on the host: complete when sent */
    double *half = samples((size_t)o->iters), *send_call = samples((size_t)o->iters);
    uint64_t seq[SLOTS] = {0};
    request(msg(OP_LF, 0, size, PHASE_HANDOFF, (uint64_t)(o->warm + o->iters)), NULL, 0);
    for (int k = 0; k < o->warm + o->iters; k++) {
        uint32_t s = (uint32_t)k % SLOTS;
        double t0 = now_us();
        if (k >= (int)SLOTS) LF(lf_wait_completed(lf->tx, seq[s], TIMEOUT_NS));
        seq[s] = send_reference(lf->tx, registered[s], size);
        double sent = now_us();
        recv_answer(lf->rx);
        double t1 = now_us();
        if (k >= o->warm) {
            half[k - o->warm] = (t1 - t0) / 2;
            send_call[k - o->warm] = sent - t0;
        }
    }
    await_ack(); /* B's phase is over */
    for (unsigned s = 0; s < SLOTS; s++) {
        LF(lf_wait_completed(lf->tx, seq[s], TIMEOUT_NS)); /* cuMemFree only after completion */
        LF(lf_deregister(lf->context, registered[s]));
    }
    buffers_free(&b);
    print_handoff(at, kind_case[kind], size, o, half, send_call);
    free(half);
    free(send_call);
}

typedef struct {
    double *total, *ready, *export_call, *close_call;
} FirstSamples;

static void print_first(unsigned at, int c, size_t size, const Options *o, FirstSamples *f) {
    size_t n = (size_t)o->fresh;
    Stats total = stats(f->total, n), ready = stats(f->ready, n), exported = stats(f->export_call, n),
          close_call = stats(f->close_call, n);
    first_mean[at][c] = total.mean;
    printf("  %-20s %10zu %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f\n", first_names[c], size, total.mean, total.p50,
           ready.mean, ready.p50, exported.mean, close_call.mean);
    printf("JSON {\"case\":\"%s\",\"size\":%zu,\"allocations\":%d,\"mean_us\":%.3f,\"p50_us\":%.3f,"
           "\"ready_mean_us\":%.3f,\"ready_p50_us\":%.3f,\"export_mean_us\":%.3f,\"close_mean_us\":%.3f}\n",
           first_names[c], size, o->fresh, total.mean, total.p50, ready.mean, ready.p50, exported.mean,
           close_call.mean);
}

static FirstSamples first_samples(const Options *o) {
    FirstSamples f = {samples((size_t)o->fresh), samples((size_t)o->fresh), samples((size_t)o->fresh),
                      samples((size_t)o->fresh)};
    return f;
}

static void first_free(FirstSamples *f) {
    free(f->total);
    free(f->ready);
    free(f->export_call);
    free(f->close_call);
}

static void ipc_first(const Options *o, unsigned at, size_t size) {
    FirstSamples f = first_samples(o);
    for (int i = 0; i < o->fresh; i++) {
        Buffers b = buffers_alloc(K_LEGACY, 1, size);
        fill(b.ptr[0], size, pattern((uint64_t)i, size));
        CU(cu.ctx_synchronize());
        Msg m = msg(OP_IPC_FIRST, (uint32_t)i, size, 0, 0);
        cu_ipc_mem_handle h;
        uint64_t t0 = now_ns();
        CU(cu.ipc_get_mem_handle(&h, b.ptr[0]));
        send_all(&m, sizeof m);
        send_all(&h, sizeof h);
        uint64_t exported = now_ns();
        Msg r = await_ack();
        uint64_t t1 = now_ns();
        Msg closed = request(msg(OP_IPC_CLOSED, 0, 0, 0, 0), NULL, 0);
        buffers_free(&b);
        f.total[i] = (double)(t1 - t0) / 1e3;
        f.ready[i] = ((double)r.a - (double)t0) / 1e3;
        f.export_call[i] = (double)(exported - t0) / 1e3;
        f.close_call[i] = (double)closed.a / 1e3;
    }
    print_first(at, C_IPC, size, o, &f);
    first_free(&f);
}

static void lf_first(const Options *o, unsigned at, size_t size, Lf *lf, int kind) {
    FirstSamples f = first_samples(o);
    request(msg(OP_LF, 0, size, PHASE_FIRST, (uint64_t)o->fresh), NULL, 0);
    for (int i = 0; i < o->fresh; i++) {
        Buffers b = buffers_alloc(kind, 1, size);
        fill(b.ptr[0], size, pattern((uint64_t)i, size));
        CU(cu.ctx_synchronize());
        lf_buffer *registered = NULL;
        uint64_t t0 = now_ns();
        LF(lf_register(lf->context, (void *)(uintptr_t)b.ptr[0], b.piece, &registered));
        uint64_t seq = send_reference(lf->tx, registered, size);
        uint64_t exported = now_ns();
        uint64_t ready = recv_answer(lf->rx);
        uint64_t t1 = now_ns();
        LF(lf_wait_completed(lf->tx, seq, TIMEOUT_NS));
        LF(lf_deregister(lf->context, registered));
        buffers_free(&b);
        f.total[i] = (double)(t1 - t0) / 1e3;
        f.ready[i] = ((double)ready - (double)t0) / 1e3;
        f.export_call[i] = (double)(exported - t0) / 1e3;
    }
    await_ack(); /* B's phase is over */
    print_first(at, kind_case[kind], size, o, &f);
    first_free(&f);
}

static double ratio(double lf, double ipc) { return ipc > 0 && lf > 0 ? lf / ipc : 0; }

static void print_ratios(const Options *o, int mps) {
    printf("\n== lava-flow / CUDA IPC (hand-offs: p50, target at most 0.5x under MPS; first hand-offs: mean)%s\n",
           mps ? ", MPS" : ", no MPS");
    printf("  %10s %14s %14s %14s %14s %14s %14s\n", "size", "foreign_hand", "vmm_hand", "pool_hand", "foreign_first",
           "vmm_first", "pool_first");
    for (unsigned at = 0; at < o->n_sizes; at++) {
        double fh = ratio(handoff_p50[at][C_FOREIGN], handoff_p50[at][C_IPC]);
        double vh = ratio(handoff_p50[at][C_VMM], handoff_p50[at][C_IPC]);
        double ph = ratio(handoff_p50[at][C_POOL], handoff_p50[at][C_IPC]);
        double ff = ratio(first_mean[at][C_FOREIGN], first_mean[at][C_IPC]);
        double vf = ratio(first_mean[at][C_VMM], first_mean[at][C_IPC]);
        double pf = ratio(first_mean[at][C_POOL], first_mean[at][C_IPC]);
        printf("  %10zu %14.3f %14.3f %14.3f %14.3f %14.3f %14.3f\n", o->sizes[at], fh, vh, ph, ff, vf, pf);
        printf("JSON {\"case\":\"ratio\",\"size\":%zu,\"mps\":%s,\"foreign_handoff\":%.4f,\"vmm_handoff\":%.4f,"
               "\"pool_handoff\":%.4f,\"foreign_first\":%.4f,\"vmm_first\":%.4f,\"pool_first\":%.4f}\n",
               o->sizes[at], mps ? "true" : "false", fh, vh, ph, ff, vf, pf);
    }
}

static int producer(const Options *o, const char *tag) {
    g_role = "producer A";
    progress();
    char why[256];
    if (!cuda_setup(why, sizeof why)) {
        printf("lf_cuda_foreign: skipped: %s\n", why);
        return SKIPPED;
    }
    char name[128] = "?";
    int driver = 0, vmm_supported = 0, fd_supported = 0;
    CU(cu.device_get_name(name, sizeof name, 0));
    CU(cu.driver_get_version(&driver));
    CU(cu.device_get_attribute(&vmm_supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
    CU(cu.device_get_attribute(&fd_supported, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0));
    const int vmm = vmm_supported && fd_supported;
    if (vmm) {
        cu_mem_allocation_prop prop = vmm_prop();
        size_t granule = 0;
        CU(cu.mem_get_allocation_granularity(&granule, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        if (granule > vmm_granule) vmm_granule = granule;
    }
    const char *mps = getenv("CUDA_MPS_PIPE_DIRECTORY");
    Lf lf = lf_setup(tag, 1);
    const char *transport = NULL, *reason = NULL;
    LF(lf_channel_transport(lf.tx, &transport, &reason));
    if (transport == NULL || strstr(transport, "cuda_ipc") == NULL)
        fail("channel a2b's transport is %s, not cuda_ipc: %s", transport ? transport : "?", reason ? reason : "?");
    printf("CUDA memory of the application's over lava-flow's cuda_ipc route and over plain CUDA IPC: device 0 (%s), "
           "driver API %d, %s%s\nchannel a2b: %s (%s)\n",
           name, driver, o->quick ? "quick, " : "",
           mps ? "CUDA_MPS_PIPE_DIRECTORY set" : "CUDA_MPS_PIPE_DIRECTORY unset",
           transport, reason ? reason : "");
    printf("JSON {\"case\":\"config\",\"device\":\"%s\",\"driver\":%d,\"quick\":%s,\"mps_pipe_dir\":\"%s\","
           "\"sizes\":%u,"
           "\"vmm\":%s,\"transport\":\"%s\"}\n",
           name, driver, o->quick ? "true" : "false", mps ? mps : "", o->n_sizes, vmm ? "true" : "false", transport);
    if (!vmm) printf("lf_vmm_*, lf_pool_*: skipped: device 0 has no memory with POSIX fd handles\n");

    cu_stream stream = NULL;
    cu_event event_a = NULL;
    cu_ipc_event_handle handle_a;
    CU(cu.stream_create(&stream, CU_STREAM_NON_BLOCKING));
    CU(cu.event_create(&event_a, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
    CU(cu.ipc_get_event_handle(&handle_a, event_a));
    request(msg(OP_HELLO, 0, 0, 0, 0), &handle_a, sizeof handle_a);

    printf("\n== hand-off: half round trip (us), %d iterations after %d warm-up, %u buffers per size;\n"
           "   send_us: p50 of A's cuEventRecord (cuda_ipc) or lf_wait_completed + lf_send_buffer (lf)\n",
           o->iters, o->warm, SLOTS);
    printf("  %-20s %10s %10s %10s %10s\n", "case", "size", "p50_us", "p99_us", "send_us");
    for (unsigned at = 0; at < o->n_sizes; at++) {
        progress();
        ipc_handoff(o, at, o->sizes[at], event_a, stream);
        lf_handoff(o, at, o->sizes[at], &lf, K_LEGACY);
        if (vmm) lf_handoff(o, at, o->sizes[at], &lf, K_VMM);
        if (vmm) lf_handoff(o, at, o->sizes[at], &lf, K_POOL);
    }
    printf("\n== first hand-off of a fresh allocation (us), %d allocations per size: total (mean, p50) from the\n"
           "   export's start to the answer back at A; ready: to B holding the pointer; export: A's calls;\n"
           "   close: B's cuIpcCloseMemHandle (cuda_ipc only)\n",
           o->fresh);
    printf("  %-20s %10s %10s %10s %10s %10s %10s %10s\n", "case", "size", "mean_us", "p50_us", "ready_us", "ready_p50",
           "export_us", "close_us");
    for (unsigned at = 0; at < o->n_sizes; at++) {
        progress();
        ipc_first(o, at, o->sizes[at]);
        lf_first(o, at, o->sizes[at], &lf, K_LEGACY);
        if (vmm) lf_first(o, at, o->sizes[at], &lf, K_VMM);
        if (vmm) lf_first(o, at, o->sizes[at], &lf, K_POOL);
    }
    print_ratios(o, mps != NULL);

    request(msg(OP_QUIT, 0, 0, 0, 0), NULL, 0);
    lf_teardown(&lf);
    CU(cu.event_destroy(event_a));
    CU(cu.stream_destroy(stream));
    return 0;
}

/* ---- options and main ---- */

static void usage(const char *argv0) {
    fprintf(stderr, "usage: %s [--quick] [--sizes N,N,...]\n", argv0);
    exit(2);
}

/* `--sizes 4096,1048576`: positive multiples of 4 bytes (the buffers are filled by words). */
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

static Options parse(int argc, char **argv) {
    Options o;
    memset(&o, 0, sizeof o);
    parse_sizes(&o, "4096,65536,1048576,16777216");
    o.warm = 200;
    o.iters = 2000;
    o.fresh = 20;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            o.quick = 1;
        } else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            parse_sizes(&o, argv[++i]);
        } else if (strncmp(argv[i], "--sizes=", 8) == 0) {
            parse_sizes(&o, argv[i] + 8);
        } else {
            usage(argv[0]);
        }
    }
    if (o.quick) {
        o.warm /= 2;
        o.iters /= 2;
        o.fresh /= 2;
    }
    return o;
}

int main(int argc, char **argv) {
    Options o = parse(argc, argv);
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGALRM, on_watchdog);
    char tag[64];
    snprintf(tag, sizeof tag, "lf-cuda-foreign-%d", (int)getpid());

    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) {
        perror("socketpair");
        return 1;
    }
    /* A receive timeout rather than poll(): one system call per read on the measured path. */
    struct timeval timeout = {TIMEOUT_S, 0};
    for (int i = 0; i < 2; i++)
        if (setsockopt(pair[i], SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout) != 0 ||
            setsockopt(pair[i], SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout) != 0) {
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
    reap(child, rc == SKIPPED ? 0 : TIMEOUT_S * 1000, &status);
    g_child = -1;
    if (rc == SKIPPED) return SKIPPED;
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "lf_cuda_foreign: FAIL the consumer process ended with status %d\n", status);
        return 1;
    }
    if (rc == 0) printf("\nlf_cuda_foreign: done\n");
    return rc;
}
