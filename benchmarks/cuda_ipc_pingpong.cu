// The plain CUDA IPC baseline for lava-flow's GPU channels: what users do today to hand GPU
// buffers between two processes on one GPU, measured on the same machine on the same day.
// No lava-flow here. The program forks: the parent is producer A, the child consumer B; each
// sets up CUDA only after the fork (a CUDA context does not survive fork), and they talk over
// a socketpair made before it.
//
// Cases, per size (4 KiB, 64 KiB, 1 MiB, 16 MiB, 64 MiB unless --sizes says otherwise):
//   handoff       host-side hand-off only. A records its interprocess event and writes
//                 (buffer index, size) to the socket; B cudaStreamWaitEvent()s on the event it
//                 opened once and replies. A cycles through 4 buffers; each buffer's
//                 cudaIpcMemHandle travels once, with its first message (in the warm-up), and
//                 B caches the pointer it opened. Half round trip p50/p99.
//   gpu_pingpong  GPU work ordered across the processes on the GPU: A fills X and records eA,
//                 B waits on eA in its stream, sums X, records eB; A waits on eB before its
//                 next fill. Synchronous rows: A synchronises its stream on eB at the end of
//                 each round trip (half round trip p50/p99). pipelined_us: the same loop with
//                 no host synchronisation, total time / iterations / 2. B checks every sum
//                 afterwards, so a missing GPU-side wait shows up as a failure, not a number.
//   gpu_local     reference: the same fill + sum kernels in one process on one stream,
//                 synchronised each iteration, halved.
//   open_cost     the first cudaIpcOpenMemHandle of a fresh buffer (and its close), mean over
//                 20 buffers; A's cudaIpcGetMemHandle too.
//   copy          B copies the imported buffer into its own cudaMalloc buffer
//                 (cudaMemcpyAsync D2D, 20 reps timed with events), and A does the same copy
//                 between two of its own buffers: GB/s of bytes copied, and the ratio.
// Every exported buffer is its own cudaMalloc rounded up to 2 MiB: IPC handles name whole
// allocations, and small cudaMallocs may be carved from one block, which a peer can open only
// once (the CUDA programming guide's advice for IPC).
//
// Build and run (one GPU; CUDA_VISIBLE_DEVICES or --device pick it):
//   nvcc -O2 -o cuda_ipc_pingpong benchmarks/cuda_ipc_pingpong.cu
//   ./cuda_ipc_pingpong [--quick] [--sizes 4096,1048576] [--device N]
// Output: table lines, plus one `JSON {...}` line per row for scripts (grep '^JSON ').
// --quick halves the iteration counts. Exits non-zero on any failure, in either process.
//
// With and without MPS, no code difference. Start the daemon before the run, stop it after:
//   CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog nvidia-cuda-mps-control -d
//   CUDA_MPS_PIPE_DIRECTORY=/tmp/mps ./cuda_ipc_pingpong        (clients must see the same pipe dir)
//   echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps nvidia-cuda-mps-control
#include <cuda_runtime.h>

#include <errno.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "pingpong_common.cuh"

static const char *g_role = "main";
static int g_sock = -1;
static pid_t g_child = -1;  // set in the parent only

static const int kTimeoutS = 30;          // the longest either side waits for the other
static const uint32_t kSlots = 4;         // buffers A cycles through in `handoff`
static const size_t kGranule = 2u << 20;  // CUDA's allocation granularity

[[noreturn]] static void fail(const char *format, ...) {
    std::fflush(stdout);
    std::fprintf(stderr, "cuda_ipc_pingpong [%s]: FAIL ", g_role);
    va_list args;
    va_start(args, format);
    std::vfprintf(stderr, format, args);
    va_end(args);
    std::fputc('\n', stderr);
    std::fflush(stderr);
    if (g_child > 0) {
        close(g_sock);  // the child sees EOF and exits
        reap(g_child, 5000);
    }
    _exit(1);  // no atexit teardown of a CUDA context in an unknown state
}

#define CUDA_CHECK(call)                                                                          \
    do {                                                                                          \
        cudaError_t error_ = (call);                                                              \
        if (error_ != cudaSuccess) fail("%s: %s", #call, cudaGetErrorString(error_));             \
    } while (0)

static size_t rounded(size_t n) { return (n + kGranule - 1) / kGranule * kGranule; }

// ---- the socket protocol: A asks, B answers every request with OP_ACK ----

enum : uint32_t {
    OP_HELLO = 1,   // + A's event handle; the reply carries B's event handle
    OP_HANDOFF,     // wait on A's event; reply a = ns the wait call took
    OP_PING,        // wait on A's event, sum slot `index` into result `a`, record B's event
    OP_RESET,       // zero results [0, a)
    OP_VERIFY,      // check results [0, a): result k == size/4 * (k + 1); reply a = first bad, b = count bad
    OP_CLOSE,       // synchronise, close every opened slot
    OP_OPEN_TIMED,  // + a memory handle: open and close it; reply a = open ns, b = close ns
    OP_COPY,        // copy slot `index` into a fresh buffer `a` times; reply a = ps per copy; bytes are `b`
    OP_QUIT,
    OP_ACK,
};
static const uint32_t HAS_HANDLE = 1;  // a cudaIpcMemHandle_t for slot `index` follows

struct Msg {
    uint32_t op, index, flags, reserved;
    uint64_t size, a, b;
};

static void send_all(const void *data, size_t n) {
    const char *p = static_cast<const char *>(data);
    while (n > 0) {
        ssize_t w = send(g_sock, p, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            fail("send: %s", std::strerror(errno));
        }
        p += w;
        n -= size_t(w);
    }
}

static void recv_all(void *data, size_t n) {
    char *p = static_cast<char *>(data);
    while (n > 0) {
        ssize_t r = recv(g_sock, p, n, 0);
        if (r == 0) fail("the peer closed the socket (its error, if any, is above)");
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) fail("no word from the peer for %d s", kTimeoutS);
            fail("recv: %s", std::strerror(errno));
        }
        p += r;
        n -= size_t(r);
    }
}

static Msg msg(uint32_t op, uint32_t index = 0, uint64_t size = 0, uint64_t a = 0, uint64_t b = 0) {
    Msg m{};
    m.op = op;
    m.index = index;
    m.size = size;
    m.a = a;
    m.b = b;
    return m;
}

static Msg await_ack() {
    Msg r;
    recv_all(&r, sizeof r);
    if (r.op != OP_ACK) fail("expected an ACK, got op %u", r.op);
    return r;
}

static Msg request(const Msg &m, const void *payload = nullptr, size_t n = 0) {
    send_all(&m, sizeof m);
    if (n > 0) send_all(payload, n);
    return await_ack();
}

// ---- kernels: 32-bit words, grid-stride ----

struct Gpu {
    int device;
    int sms;
    cudaStream_t stream;
    unsigned grid(size_t words) const {
        size_t blocks = (words + kThreads - 1) / kThreads;
        return unsigned(std::max<size_t>(1, std::min<size_t>(blocks, size_t(sms) * 8)));
    }
};

static Gpu gpu_setup(int device) {
    Gpu g{};
    g.device = device;
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaFree(nullptr));  // create the context now, outside any timed loop
    CUDA_CHECK(cudaDeviceGetAttribute(&g.sms, cudaDevAttrMultiProcessorCount, device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
    return g;
}

// Mean time of `reps` D2D copies on `stream`, after one untimed copy, in nanoseconds.
static double time_copies_ns(void *dst, const void *src, size_t n, int reps, cudaStream_t stream) {
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream));
    CUDA_CHECK(cudaEventRecord(start, stream));
    for (int r = 0; r < reps; r++) CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream));
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    return double(ms) * 1e6 / reps;
}

static void check_bytes(const void *dev, size_t n, unsigned char want) {
    unsigned char first = 0, last = 0;
    CUDA_CHECK(cudaMemcpy(&first, dev, 1, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&last, static_cast<const char *>(dev) + n - 1, 1, cudaMemcpyDeviceToHost));
    if (first != want || last != want) fail("copied bytes are %u..%u, expected %u", first, last, want);
}

// ---- options ----

struct Options {
    bool quick = false;
    int device = 0;
    std::vector<size_t> sizes{4096, 65536, 1u << 20, 16u << 20, 64u << 20};
    int handoff_warm = 200, handoff_iters = 2000;
    int gpu_warm = 20, gpu_iters = 400;
    int open_buffers = 20, copy_reps = 20;
    size_t results() const { return size_t(gpu_warm) + 2 * size_t(gpu_iters); }
};

static void usage(const char *argv0) {
    std::fprintf(stderr, "usage: %s [--quick] [--sizes N,N,...] [--device N]\n", argv0);
    std::exit(2);
}

static Options parse(int argc, char **argv) {
    Options o;
    for (int i = 1; i < argc; i++) {
        std::string arg = argv[i];
        std::string value;
        bool has_value = false;
        size_t eq = arg.find('=');
        if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
            value = arg.substr(eq + 1);
            arg = arg.substr(0, eq);
            has_value = true;
        }
        auto next = [&]() -> std::string {
            if (has_value) return value;
            if (i + 1 >= argc) usage(argv[0]);
            return argv[++i];
        };
        if (arg == "--quick") {
            o.quick = true;
        } else if (arg == "--device") {
            o.device = std::atoi(next().c_str());
        } else if (arg == "--sizes") {
            o.sizes = parse_sizes(next());
        } else {
            usage(argv[0]);
        }
    }
    if (o.quick) {
        o.handoff_warm /= 2;
        o.handoff_iters /= 2;
        o.gpu_warm /= 2;
        o.gpu_iters /= 2;
        o.open_buffers /= 2;
        o.copy_reps /= 2;
    }
    return o;
}

// ---- consumer B: answers A's requests until OP_QUIT ----

struct Slot {
    void *ptr;
    uint64_t size;
};

static void close_slots(Slot *slots) {
    for (uint32_t s = 0; s < kSlots; s++)
        if (slots[s].ptr) {
            CUDA_CHECK(cudaIpcCloseMemHandle(slots[s].ptr));
            slots[s] = Slot{nullptr, 0};
        }
}

static int consumer(const Options &o) {
    g_role = "consumer B";
    Gpu g = gpu_setup(o.device);

    Msg hello;
    recv_all(&hello, sizeof hello);
    if (hello.op != OP_HELLO) fail("expected HELLO, got op %u", hello.op);
    cudaIpcEventHandle_t handle_a;
    recv_all(&handle_a, sizeof handle_a);
    cudaEvent_t event_a, event_b;
    CUDA_CHECK(cudaIpcOpenEventHandle(&event_a, handle_a));
    CUDA_CHECK(cudaEventCreateWithFlags(&event_b, cudaEventInterprocess | cudaEventDisableTiming));
    cudaIpcEventHandle_t handle_b;
    CUDA_CHECK(cudaIpcGetEventHandle(&handle_b, event_b));
    const uint64_t capacity = hello.a;
    unsigned long long *results = nullptr;
    CUDA_CHECK(cudaMalloc(&results, capacity * sizeof *results));
    Msg ack = msg(OP_ACK);
    send_all(&ack, sizeof ack);
    send_all(&handle_b, sizeof handle_b);

    Slot slots[kSlots] = {};
    auto slot = [&](const Msg &m) -> void * {
        if (m.index >= kSlots || !slots[m.index].ptr || m.size > slots[m.index].size)
            fail("op %u names slot %u (size %llu), which is not open at that size", m.op, m.index,
                 static_cast<unsigned long long>(m.size));
        return slots[m.index].ptr;
    };

    for (;;) {
        Msg m;
        recv_all(&m, sizeof m);
        if (m.flags & HAS_HANDLE) {
            if (m.index >= kSlots || slots[m.index].ptr) fail("slot %u is out of range or already open", m.index);
            cudaIpcMemHandle_t h;
            recv_all(&h, sizeof h);
            CUDA_CHECK(cudaIpcOpenMemHandle(&slots[m.index].ptr, h, cudaIpcMemLazyEnablePeerAccess));
            slots[m.index].size = m.size;
        }
        Msg r = msg(OP_ACK);
        switch (m.op) {
        case OP_HANDOFF: {
            slot(m);  // the cached pointer is what a real consumer would hand to its kernels
            double t0 = now_us();
            CUDA_CHECK(cudaStreamWaitEvent(g.stream, event_a, 0));
            r.a = uint64_t((now_us() - t0) * 1e3);
            break;
        }
        case OP_PING: {
            const uint32_t *x = static_cast<const uint32_t *>(slot(m));
            if (m.a >= capacity) fail("result index %llu out of range", static_cast<unsigned long long>(m.a));
            CUDA_CHECK(cudaStreamWaitEvent(g.stream, event_a, 0));
            size_t words = m.size / 4;
            sum_words<<<g.grid(words), kThreads, 0, g.stream>>>(x, words, results + m.a);
            CUDA_CHECK(cudaGetLastError());
            CUDA_CHECK(cudaEventRecord(event_b, g.stream));
            break;
        }
        case OP_RESET:
            if (m.a > capacity) fail("reset of %llu results, room for %llu", static_cast<unsigned long long>(m.a),
                                     static_cast<unsigned long long>(capacity));
            CUDA_CHECK(cudaMemsetAsync(results, 0, m.a * sizeof *results, g.stream));
            break;
        case OP_VERIFY: {
            if (m.a > capacity) fail("verify of %llu results, room for %llu", static_cast<unsigned long long>(m.a),
                                     static_cast<unsigned long long>(capacity));
            CUDA_CHECK(cudaStreamSynchronize(g.stream));
            std::vector<unsigned long long> host(m.a);
            CUDA_CHECK(cudaMemcpy(host.data(), results, m.a * sizeof *results, cudaMemcpyDeviceToHost));
            for (uint64_t k = 0; k < m.a; k++)
                if (host[k] != (m.size / 4) * (k + 1)) {
                    if (r.b == 0) r.a = k;
                    r.b++;
                }
            break;
        }
        case OP_CLOSE:
            CUDA_CHECK(cudaStreamSynchronize(g.stream));
            close_slots(slots);
            break;
        case OP_OPEN_TIMED: {
            cudaIpcMemHandle_t h;
            recv_all(&h, sizeof h);
            void *p = nullptr;
            double t0 = now_us();
            CUDA_CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
            double t1 = now_us();
            CUDA_CHECK(cudaIpcCloseMemHandle(p));
            double t2 = now_us();
            r.a = uint64_t((t1 - t0) * 1e3);
            r.b = uint64_t((t2 - t1) * 1e3);
            break;
        }
        case OP_COPY: {
            const void *src = slot(m);
            void *dst = nullptr;
            CUDA_CHECK(cudaMalloc(&dst, m.size));
            double ns = time_copies_ns(dst, src, m.size, int(m.a), g.stream);
            check_bytes(dst, m.size, static_cast<unsigned char>(m.b));
            CUDA_CHECK(cudaFree(dst));
            r.a = uint64_t(ns * 1e3);  // picoseconds: small copies take well under a microsecond
            break;
        }
        case OP_QUIT:
            CUDA_CHECK(cudaStreamSynchronize(g.stream));
            close_slots(slots);
            CUDA_CHECK(cudaFree(results));
            CUDA_CHECK(cudaEventDestroy(event_a));
            CUDA_CHECK(cudaEventDestroy(event_b));
            CUDA_CHECK(cudaStreamDestroy(g.stream));
            send_all(&r, sizeof r);
            return 0;
        default:
            fail("unknown op %u", m.op);
        }
        send_all(&r, sizeof r);
    }
}

// ---- producer A: drives every case and prints ----

static void run_handoff(const Options &o, const Gpu &g, cudaEvent_t event_a) {
    std::printf("\n== handoff: event record + socket message, consumer cudaStreamWaitEvent on the opened event\n"
                "   half round trip (us), %d iterations after %d warm-up, %zu sizes, %u buffers per size;\n"
                "   record_us / wait_us: p50 of A's cudaEventRecord and B's cudaStreamWaitEvent calls alone\n",
                o.handoff_iters, o.handoff_warm, o.sizes.size(), kSlots);
    std::printf("  %10s %10s %10s %10s %10s\n", "size", "p50_us", "p99_us", "record_us", "wait_us");
    for (size_t size : o.sizes) {
        void *bufs[kSlots];
        cudaIpcMemHandle_t handles[kSlots];
        for (uint32_t s = 0; s < kSlots; s++) {
            CUDA_CHECK(cudaMalloc(&bufs[s], rounded(size)));
            CUDA_CHECK(cudaIpcGetMemHandle(&handles[s], bufs[s]));
        }
        std::vector<double> half, record, wait;
        half.reserve(size_t(o.handoff_iters));
        record.reserve(size_t(o.handoff_iters));
        wait.reserve(size_t(o.handoff_iters));
        for (int k = 0; k < o.handoff_warm + o.handoff_iters; k++) {
            uint32_t s = uint32_t(k) % kSlots;
            bool first = k < int(kSlots);  // each handle travels once, in the warm-up
            Msg m = msg(OP_HANDOFF, s, size);
            m.flags = first ? HAS_HANDLE : 0;
            double t0 = now_us();
            CUDA_CHECK(cudaEventRecord(event_a, g.stream));
            double recorded = now_us();
            send_all(&m, sizeof m);
            if (first) send_all(&handles[s], sizeof handles[s]);
            Msg r = await_ack();
            double t1 = now_us();
            if (k >= o.handoff_warm) {
                half.push_back((t1 - t0) / 2);
                record.push_back(recorded - t0);
                wait.push_back(double(r.a) / 1e3);
            }
        }
        request(msg(OP_CLOSE));  // B closes its mappings before A frees the memory
        for (uint32_t s = 0; s < kSlots; s++) CUDA_CHECK(cudaFree(bufs[s]));
        Stats st = stats(half), rec = stats(record), wt = stats(wait);
        std::printf("  %10zu %10.2f %10.2f %10.2f %10.2f\n", size, st.p50, st.p99, rec.p50, wt.p50);
        std::printf("JSON {\"case\":\"handoff\",\"size\":%zu,\"iters\":%d,\"p50_us\":%.3f,\"p99_us\":%.3f,"
                    "\"record_p50_us\":%.3f,\"wait_p50_us\":%.3f}\n",
                    size, o.handoff_iters, st.p50, st.p99, rec.p50, wt.p50);
    }
}

static void run_gpu(const Options &o, const Gpu &g, cudaEvent_t event_a, cudaEvent_t event_b) {
    std::printf("\n== gpu_pingpong: A fill -> eA -> B waits eA, sum -> eB -> A waits eB, ordered on the GPU\n"
                "   half round trip (us), A synchronises on eB each round; %d iterations after %d warm-up, %zu sizes\n"
                "   pipelined: the same without host synchronisation, per iteration / 2\n"
                "   gpu_local: fill + sum in one process on one stream, synchronised, / 2\n",
                o.gpu_iters, o.gpu_warm, o.sizes.size());
    std::printf("  %10s %10s %10s %13s %13s\n", "size", "p50_us", "p99_us", "pipelined_us", "local_p50_us");
    unsigned long long *local_result = nullptr;
    CUDA_CHECK(cudaMalloc(&local_result, sizeof *local_result));
    for (size_t size : o.sizes) {
        const size_t words = size / 4;
        const unsigned grid = g.grid(words);
        uint32_t *x = nullptr;
        CUDA_CHECK(cudaMalloc(&x, rounded(size)));
        cudaIpcMemHandle_t handle;
        CUDA_CHECK(cudaIpcGetMemHandle(&handle, x));
        request(msg(OP_RESET, 0, 0, o.results()));

        // One round: k is the round's number, k + 1 the value A fills and B's sum must see.
        uint64_t k = 0;
        auto round = [&]() {
            Msg m = msg(OP_PING, 0, size, k);
            m.flags = k == 0 ? HAS_HANDLE : 0;
            fill_words<<<grid, kThreads, 0, g.stream>>>(x, words, uint32_t(k + 1));
            CUDA_CHECK(cudaGetLastError());
            CUDA_CHECK(cudaEventRecord(event_a, g.stream));
            send_all(&m, sizeof m);
            if (m.flags & HAS_HANDLE) send_all(&handle, sizeof handle);
            await_ack();
            CUDA_CHECK(cudaStreamWaitEvent(g.stream, event_b, 0));  // the next fill waits for B's sum
            k++;
        };
        std::vector<double> half;
        half.reserve(size_t(o.gpu_iters));
        for (int i = 0; i < o.gpu_warm + o.gpu_iters; i++) {
            double t0 = now_us();
            round();
            CUDA_CHECK(cudaStreamSynchronize(g.stream));
            double t1 = now_us();
            if (i >= o.gpu_warm) half.push_back((t1 - t0) / 2);
        }
        double t0 = now_us();
        for (int i = 0; i < o.gpu_iters; i++) round();
        CUDA_CHECK(cudaStreamSynchronize(g.stream));
        double pipelined = (now_us() - t0) / o.gpu_iters / 2;

        Msg v = request(msg(OP_VERIFY, 0, size, k));
        if (v.b != 0)
            fail("gpu_pingpong %zu B: %llu of %llu sums wrong, the first at round %llu: B's kernel did not "
                 "see A's fill",
                 size, static_cast<unsigned long long>(v.b), static_cast<unsigned long long>(k),
                 static_cast<unsigned long long>(v.a));
        request(msg(OP_CLOSE));

        std::vector<double> local;
        local.reserve(size_t(o.gpu_iters));
        for (int i = 0; i < o.gpu_warm + o.gpu_iters; i++) {
            double l0 = now_us();
            fill_words<<<grid, kThreads, 0, g.stream>>>(x, words, uint32_t(i + 1));
            CUDA_CHECK(cudaGetLastError());
            CUDA_CHECK(cudaMemsetAsync(local_result, 0, sizeof *local_result, g.stream));
            sum_words<<<grid, kThreads, 0, g.stream>>>(x, words, local_result);
            CUDA_CHECK(cudaGetLastError());
            CUDA_CHECK(cudaStreamSynchronize(g.stream));
            double l1 = now_us();
            if (i >= o.gpu_warm) local.push_back((l1 - l0) / 2);
        }
        unsigned long long last = 0;
        CUDA_CHECK(cudaMemcpy(&last, local_result, sizeof last, cudaMemcpyDeviceToHost));
        if (last != words * uint64_t(o.gpu_warm + o.gpu_iters))
            fail("gpu_local %zu B: sum %llu, expected %llu", size, last,
                 static_cast<unsigned long long>(words * uint64_t(o.gpu_warm + o.gpu_iters)));
        CUDA_CHECK(cudaFree(x));

        Stats st = stats(half), lo = stats(local);
        std::printf("  %10zu %10.2f %10.2f %13.2f %13.2f\n", size, st.p50, st.p99, pipelined, lo.p50);
        std::printf("JSON {\"case\":\"gpu_pingpong\",\"size\":%zu,\"iters\":%d,\"p50_us\":%.3f,\"p99_us\":%.3f,"
                    "\"pipelined_us\":%.3f}\n",
                    size, o.gpu_iters, st.p50, st.p99, pipelined);
        std::printf("JSON {\"case\":\"gpu_local\",\"size\":%zu,\"iters\":%d,\"p50_us\":%.3f,\"p99_us\":%.3f}\n", size,
                    o.gpu_iters, lo.p50, lo.p99);
    }
    CUDA_CHECK(cudaFree(local_result));
}

static void run_open_cost(const Options &o) {
    std::printf("\n== open_cost: first cudaIpcOpenMemHandle of a fresh buffer in B (us), mean of %d buffers per size\n",
                o.open_buffers);
    std::printf("  %10s %10s %10s %10s %10s\n", "size", "open_us", "open_max", "close_us", "get_us");
    for (size_t size : o.sizes) {
        const int n = o.open_buffers;
        std::vector<void *> bufs(size_t(n), nullptr);
        std::vector<cudaIpcMemHandle_t> handles(static_cast<size_t>(n));
        double get_us = 0, open_us = 0, open_max = 0, close_us = 0;
        for (int i = 0; i < n; i++) CUDA_CHECK(cudaMalloc(&bufs[size_t(i)], rounded(size)));
        for (int i = 0; i < n; i++) {
            double t0 = now_us();
            CUDA_CHECK(cudaIpcGetMemHandle(&handles[size_t(i)], bufs[size_t(i)]));
            get_us += now_us() - t0;
        }
        for (int i = 0; i < n; i++) {
            Msg r = request(msg(OP_OPEN_TIMED, 0, size), &handles[size_t(i)], sizeof(cudaIpcMemHandle_t));
            open_us += double(r.a) / 1e3;
            open_max = std::max(open_max, double(r.a) / 1e3);
            close_us += double(r.b) / 1e3;
        }
        for (int i = 0; i < n; i++) CUDA_CHECK(cudaFree(bufs[size_t(i)]));
        open_us /= n;
        close_us /= n;
        get_us /= n;
        std::printf("  %10zu %10.2f %10.2f %10.2f %10.2f\n", size, open_us, open_max, close_us, get_us);
        std::printf("JSON {\"case\":\"open_cost\",\"size\":%zu,\"buffers\":%d,\"open_us\":%.3f,\"open_max_us\":%.3f,"
                    "\"close_us\":%.3f,\"get_handle_us\":%.3f}\n",
                    size, n, open_us, open_max, close_us, get_us);
    }
}

static void run_copy(const Options &o, const Gpu &g) {
    std::printf("\n== copy: cudaMemcpyAsync D2D of the whole buffer, %d reps timed with events (GB/s of bytes copied)\n"
                "   imported: B copies A's buffer into its own; local: A copies between two of its own\n",
                o.copy_reps);
    std::printf("  %10s %13s %13s %8s\n", "size", "imported_GBs", "local_GBs", "ratio");
    for (size_t size : o.sizes) {
        const unsigned char byte = static_cast<unsigned char>(0x5a ^ (size >> 12));
        void *src = nullptr, *dst = nullptr;
        CUDA_CHECK(cudaMalloc(&src, rounded(size)));
        CUDA_CHECK(cudaMalloc(&dst, size));
        CUDA_CHECK(cudaMemset(src, byte, size));
        CUDA_CHECK(cudaDeviceSynchronize());
        cudaIpcMemHandle_t handle;
        CUDA_CHECK(cudaIpcGetMemHandle(&handle, src));
        Msg m = msg(OP_COPY, 0, size, uint64_t(o.copy_reps), byte);
        m.flags = HAS_HANDLE;
        Msg r = request(m, &handle, sizeof handle);
        request(msg(OP_CLOSE));
        double imported = double(size) / (double(r.a) / 1e3);  // bytes per ns = GB/s

        double ns = time_copies_ns(dst, src, size, o.copy_reps, g.stream);
        check_bytes(dst, size, byte);
        double local = double(size) / ns;
        CUDA_CHECK(cudaFree(dst));
        CUDA_CHECK(cudaFree(src));
        std::printf("  %10zu %13.2f %13.2f %8.3f\n", size, imported, local, imported / local);
        std::printf("JSON {\"case\":\"copy\",\"size\":%zu,\"reps\":%d,\"imported_gbps\":%.3f,\"local_gbps\":%.3f,"
                    "\"ratio\":%.4f}\n",
                    size, o.copy_reps, imported, local, imported / local);
    }
}

static int producer(const Options &o) {
    g_role = "producer A";
    Gpu g = gpu_setup(o.device);
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, o.device));
    int driver = 0, runtime = 0;
    CUDA_CHECK(cudaDriverGetVersion(&driver));
    CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
    const char *mps = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
    std::printf("plain CUDA IPC ping-pong: device %d (%s, %d SMs), driver API %d, runtime %d, %s%s\n", o.device,
                prop.name, g.sms, driver, runtime, o.quick ? "quick, " : "",
                mps ? "CUDA_MPS_PIPE_DIRECTORY set" : "CUDA_MPS_PIPE_DIRECTORY unset");
    std::printf("JSON {\"case\":\"config\",\"device\":\"%s\",\"driver\":%d,\"runtime\":%d,\"quick\":%s,"
                "\"mps_pipe_dir\":\"%s\",\"sizes\":%zu}\n",
                prop.name, driver, runtime, o.quick ? "true" : "false", mps ? mps : "", o.sizes.size());

    cudaEvent_t event_a, event_b;
    CUDA_CHECK(cudaEventCreateWithFlags(&event_a, cudaEventInterprocess | cudaEventDisableTiming));
    cudaIpcEventHandle_t handle_a, handle_b;
    CUDA_CHECK(cudaIpcGetEventHandle(&handle_a, event_a));
    request(msg(OP_HELLO, 0, 0, o.results()), &handle_a, sizeof handle_a);
    recv_all(&handle_b, sizeof handle_b);
    CUDA_CHECK(cudaIpcOpenEventHandle(&event_b, handle_b));

    run_handoff(o, g, event_a);
    run_gpu(o, g, event_a, event_b);
    run_open_cost(o);
    run_copy(o, g);

    request(msg(OP_QUIT));
    CUDA_CHECK(cudaEventDestroy(event_b));
    CUDA_CHECK(cudaEventDestroy(event_a));
    CUDA_CHECK(cudaStreamDestroy(g.stream));
    return 0;
}

int main(int argc, char **argv) {
    Options o = parse(argc, argv);
    setvbuf(stdout, nullptr, _IOLBF, 0);

    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) {
        std::perror("socketpair");
        return 1;
    }
    // A receive timeout rather than poll(): one system call per read on the measured path.
    timeval timeout{kTimeoutS, 0};
    for (int fd : pair)
        if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout) != 0 ||
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout) != 0) {
            std::perror("setsockopt");
            return 1;
        }
    std::fflush(stdout);
    pid_t child = fork();
    if (child < 0) {
        std::perror("fork");
        return 1;
    }
    if (child == 0) {
        close(pair[0]);
        g_sock = pair[1];
        int rc = consumer(o);
        close(g_sock);
        std::exit(rc);
    }
    close(pair[1]);
    g_sock = pair[0];
    g_child = child;
    int rc = producer(o);
    close(g_sock);
    int status = reap(child, kTimeoutS * 1000);
    g_child = -1;
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "cuda_ipc_pingpong: FAIL the consumer process ended with status %d\n", status);
        return 1;
    }
    if (rc == 0) std::printf("\ncuda_ipc_pingpong: done\n");
    return rc;
}
