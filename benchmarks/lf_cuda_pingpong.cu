// The GPU ping-pong of benchmarks/cuda_ipc_pingpong.cu (its handoff and gpu_pingpong cases),
// with the hand-off and the cross-process synchronisation going through two lava-flow channels
// instead of CUDA IPC handles and events, so that the two programs can be run side by side. The
// program forks: the parent is A, the child B; each creates its CUDA context, lf_context and
// channels only after the fork (none of them survives one).
//
// Channels "<tag>-a2b" (A produces) and "<tag>-b2a" (B produces) busy-poll and are strict_gpu: a
// channel that cannot share a timeline semaphore, or would stage GPU buffers through host memory,
// fails at creation instead of measuring something else. Each process imports its producer
// channel's ready semaphore into CUDA to signal it, and its consumer channel's to wait on it.
// Round values v grow by one per round over the whole run: timeline values never go back.
//
// Cases, per size (4 KiB, 64 KiB, 1 MiB, 16 MiB, 64 MiB unless --sizes says otherwise):
//   lf_handoff       A signals a2b's semaphore to v from its stream and sends its GPU buffer X
//                    (lf_alloc, imported into CUDA once) with lf_send_buffer_after(v); B receives
//                    it, finds its CUDA import of X's arena, waits for v in its stream, signals
//                    b2a's semaphore to v and answers with 8 bytes of its own GPU buffer
//                    (lf_send_buffer_after(v)); A waits for v in its stream. No kernels and no
//                    host synchronisation: the hand-off alone. Half round trip p50/p99; signal_us:
//                    A's signal call; wait_us and buffer_us: B's wait call, and its
//                    lf_message_buffer + lf_buffer_describe + import lookup.
//   lf_gpu_pingpong  the same with the work: A fills X before it signals, B sums X into the
//                    round's slot of its buffer before it signals, and A's next fill waits on the
//                    GPU for B's signal. As in cuda_ipc_pingpong's gpu_pingpong, p50/p99 has A
//                    synchronise its stream at the end of each round trip; pipelined: the same
//                    loop without host synchronisation, total time / iterations / 2
//                    (pipe_p50/pipe_p99: that loop's rounds one by one). B checks every round's sum
//                    afterwards, so a missing GPU-side wait shows up as a failure, not a number.
// Before A rewrites X it waits for lava-flow's completion of X's previous send. B releases each
// message as soon as its work is queued: A's next fill waits on the GPU for B's sum anyway.
//
// Build and run (one GPU: --device picks the CUDA device, lava-flow opens the Vulkan device
// with the same UUID):
//   nvcc -O2 -I<prefix>/include -L<prefix>/lib -Xlinker -rpath=<prefix>/lib -llava_flow
//        -o lf_cuda_pingpong benchmarks/lf_cuda_pingpong.cu
//   ./lf_cuda_pingpong [--quick] [--sizes 4096,1048576] [--device N]
// Output: table lines, plus one `JSON {...}` line per row for scripts (grep '^JSON ').
// --quick halves the iteration counts. Exits non-zero on any failure, in either process. No
// wait is unbounded: lava-flow waits time out after 30 s, a watchdog ends a process stuck for
// longer (a GPU wait for a value never signalled), and the parent takes the child with it.
#include <lava_flow.h>

#include <cuda_runtime.h>

#include <signal.h>
#include <sys/prctl.h>
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
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "pingpong_common.cuh"

static const char *g_role = "main";
static pid_t g_child = -1;  // set in the parent only

static const int kTimeoutS = 30;                              // the longest either side waits for the other
static const int64_t kTimeoutNs = int64_t(kTimeoutS) * 1000000000;
static const unsigned kWatchdogS = 120;                       // no phase of the run takes this long
static const size_t kSlot = sizeof(unsigned long long);       // one round's sum in B's buffer

[[noreturn]] static void fail(const char *format, ...) {
    std::fflush(stdout);
    std::fprintf(stderr, "lf_cuda_pingpong [%s]: FAIL ", g_role);
    va_list args;
    va_start(args, format);
    std::vfprintf(stderr, format, args);
    va_end(args);
    std::fputc('\n', stderr);
    std::fflush(stderr);
    if (g_child > 0) {
        // The child may be blocked in a GPU wait that will never end now.
        kill(g_child, SIGKILL);
        waitpid(g_child, nullptr, 0);
    }
    _exit(1);  // no atexit teardown of a CUDA context or channel in an unknown state
}

// A CUDA stream wait for a value the peer never signals blocks forever, and no CUDA call
// takes a timeout: the watchdog ends the process instead.
static void on_watchdog(int) {
    static const char head[] = "lf_cuda_pingpong [";
    static const char tail[] = "]: FAIL no progress for 120 s (a GPU wait for a value never signalled?)\n";
    ssize_t ignored = write(2, head, sizeof head - 1);
    ignored = write(2, g_role, strlen(g_role));
    ignored = write(2, tail, sizeof tail - 1);
    (void)ignored;
    if (g_child > 0) kill(g_child, SIGKILL);
    _exit(1);
}

static void progress() { alarm(kWatchdogS); }

#define CUDA_CHECK(call)                                                                          \
    do {                                                                                          \
        cudaError_t error_ = (call);                                                              \
        if (error_ != cudaSuccess) fail("%s: %s", #call, cudaGetErrorString(error_));             \
    } while (0)

#define LF_CHECK(call)                                                                            \
    do {                                                                                          \
        lf_status status_ = (call);                                                               \
        if (status_ != LF_OK) fail("%s: %s: %s", #call, lf_status_str(status_), lf_last_error_message()); \
    } while (0)

// ---- kernels: 32-bit words, grid-stride (as in cuda_ipc_pingpong) ----

// ---- options ----

struct Options {
    bool quick = false;
    int device = 0;
    std::vector<size_t> sizes{4096, 65536, 1u << 20, 16u << 20, 64u << 20};
    int handoff_warm = 200, handoff_iters = 2000;
    int gpu_warm = 20, gpu_iters = 400;
    // Rounds per size, so slots in B's buffer: each round answers with its own slot.
    size_t rounds() const {
        return std::max(size_t(handoff_warm) + size_t(handoff_iters), size_t(gpu_warm) + 2 * size_t(gpu_iters));
    }
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
    }
    return o;
}

static std::string json_escape(const char *s) {
    std::string out;
    for (; s && *s; s++) {
        unsigned char c = static_cast<unsigned char>(*s);
        if (c == '"' || c == '\\') {
            out += '\\';
            out += char(c);
        } else if (c < 0x20) {
            char esc[8];
            std::snprintf(esc, sizeof esc, "\\u%04x", c);
            out += esc;
        } else {
            out += char(c);
        }
    }
    return out;
}

// ---- CUDA and lava-flow set-up, the same in both processes ----

struct Gpu {
    int device;
    int sms;
    cudaStream_t stream;
    cudaDeviceProp prop;
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
    CUDA_CHECK(cudaGetDeviceProperties(&g.prop, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&g.sms, cudaDevAttrMultiProcessorCount, device));
    int timeline = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&timeline, cudaDevAttrTimelineSemaphoreInteropSupported, device));
    if (!timeline) fail("CUDA device %d cannot import timeline semaphores", device);
    CUDA_CHECK(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
    return g;
}

// lava-flow on the Vulkan device that is this CUDA device (NVIDIA gives both the same UUID),
// without any CPU fallback.
static lf_context *context_setup(const Gpu &g) {
    lf_context_config config{};
    lf_context_config_init(&config, sizeof config);
    config.gpu_policy = LF_GPU_REQUIRED;
    config.strict_gpu = 1;
    config.gpu_device_select = LF_GPU_DEVICE_UUID;
    std::memcpy(config.gpu_device_uuid, g.prop.uuid.bytes, sizeof config.gpu_device_uuid);
    lf_context *context = nullptr;
    LF_CHECK(lf_context_create(&config, &context));
    lf_device_info info{};
    info.struct_size = sizeof info;
    LF_CHECK(lf_context_device_info(context, &info));
    if (std::memcmp(info.device_uuid, g.prop.uuid.bytes, 16) != 0)
        fail("lava-flow opened Vulkan device %u (%s), not CUDA device %d's", info.index, info.name, g.device);
    return context;
}

// A process's two ends. A creates its producer first and B its consumer first, so that both
// rendezvous on a2b before either waits on b2a.
struct Ends {
    lf_channel *tx = nullptr, *rx = nullptr;
    cudaExternalSemaphore_t signal = nullptr;  // tx's ready semaphore: this process's work signals it
    cudaExternalSemaphore_t wait = nullptr;    // rx's ready semaphore: the peer's work signals it
};

static cudaExternalSemaphore_t import_semaphore(lf_channel *channel, const char *what) {
    int fd = -1;
    lf_status st = lf_channel_ready_semaphore(channel, &fd);
    if (st != LF_OK)
        fail("lf_channel_ready_semaphore(%s): %s: %s", what, lf_status_str(st), lf_last_error_message());
    cudaExternalSemaphoreHandleDesc desc{};
    desc.type = cudaExternalSemaphoreHandleTypeTimelineSemaphoreFd;
    desc.handle.fd = fd;
    cudaExternalSemaphore_t semaphore = nullptr;
    cudaError_t error = cudaImportExternalSemaphore(&semaphore, &desc);
    if (error != cudaSuccess) {
        close(fd);  // CUDA owns the fd only after a successful import
        fail("cudaImportExternalSemaphore(%s): %s", what, cudaGetErrorString(error));
    }
    return semaphore;
}

static Ends open_ends(lf_context *context, const char *tag, bool is_a) {
    lf_location *me = nullptr, *peer = nullptr;
    LF_CHECK(lf_location_detect(&me));
    LF_CHECK(lf_location_detect(&peer));  // the peer runs on this host too
    lf_channel_config config;
    LF_CHECK(lf_channel_config_init(&config, sizeof config));
    config.wait_strategy = LF_WAIT_BUSY_POLL;
    config.strict_gpu = 1;
    config.rendezvous_timeout_ns = kTimeoutNs;
    const std::string a2b = std::string(tag) + "-a2b", b2a = std::string(tag) + "-b2a";
    Ends e;
    if (is_a) {
        LF_CHECK(lf_channel_create(context, a2b.c_str(), LF_ROLE_PRODUCER, me, peer, &config, &e.tx));
        LF_CHECK(lf_channel_create(context, b2a.c_str(), LF_ROLE_CONSUMER, me, peer, &config, &e.rx));
    } else {
        LF_CHECK(lf_channel_create(context, a2b.c_str(), LF_ROLE_CONSUMER, me, peer, &config, &e.rx));
        LF_CHECK(lf_channel_create(context, b2a.c_str(), LF_ROLE_PRODUCER, me, peer, &config, &e.tx));
    }
    lf_location_free(peer);
    lf_location_free(me);
    e.signal = import_semaphore(e.tx, is_a ? "a2b, producer" : "b2a, producer");
    e.wait = import_semaphore(e.rx, is_a ? "b2a, consumer" : "a2b, consumer");
    return e;
}

static void close_ends(Ends &e) {
    CUDA_CHECK(cudaDestroyExternalSemaphore(e.signal));
    CUDA_CHECK(cudaDestroyExternalSemaphore(e.wait));
    lf_channel_free(e.tx);
    lf_channel_free(e.rx);
    e = Ends{};
}

// Stream-ordered: the signal happens when the stream's earlier work is done, and later work
// in the stream starts only once the wait is satisfied (the value reached, or passed).
static void signal_value(cudaExternalSemaphore_t semaphore, uint64_t value, cudaStream_t stream) {
    cudaExternalSemaphoreSignalParams params{};
    params.params.fence.value = value;
    CUDA_CHECK(cudaSignalExternalSemaphoresAsync(&semaphore, &params, 1, stream));
}

static void wait_value(cudaExternalSemaphore_t semaphore, uint64_t value, cudaStream_t stream) {
    cudaExternalSemaphoreWaitParams params{};
    params.params.fence.value = value;
    CUDA_CHECK(cudaWaitExternalSemaphoresAsync(&semaphore, &params, 1, stream));
}

// A lava-flow GPU arena imported into CUDA and mapped whole, once; buffers are offsets into it.
struct Arena {
    cudaExternalMemory_t memory = nullptr;
    unsigned char *base = nullptr;
    uint64_t size = 0;
};

// Takes `exported.fd` in every case.
static Arena import_arena(const lf_export &exported, const void *device_uuid) {
    if (std::memcmp(exported.device_uuid, device_uuid, 16) != 0) {
        close(exported.fd);
        fail("arena %llu of process %u belongs to another GPU", static_cast<unsigned long long>(exported.arena_id),
             exported.exporter_pid);
    }
    cudaExternalMemoryHandleDesc desc{};
    desc.type = cudaExternalMemoryHandleTypeOpaqueFd;
    desc.handle.fd = exported.fd;
    desc.size = exported.arena_size;  // the whole allocation, not just the buffer
    desc.flags = (exported.gpu_flags & LF_EXPORT_GPU_DEDICATED) ? cudaExternalMemoryDedicated : 0;
    Arena a;
    cudaError_t error = cudaImportExternalMemory(&a.memory, &desc);
    if (error != cudaSuccess) {
        close(exported.fd);  // CUDA owns the fd only after a successful import
        fail("cudaImportExternalMemory (arena %llu, %llu bytes): %s",
             static_cast<unsigned long long>(exported.arena_id), static_cast<unsigned long long>(exported.arena_size),
             cudaGetErrorString(error));
    }
    cudaExternalMemoryBufferDesc buffer{};
    buffer.offset = 0;
    buffer.size = exported.arena_size;
    void *base = nullptr;
    CUDA_CHECK(cudaExternalMemoryGetMappedBuffer(&base, a.memory, &buffer));
    a.base = static_cast<unsigned char *>(base);
    a.size = exported.arena_size;
    return a;
}

static void drop_arena(Arena &a) {
    CUDA_CHECK(cudaFree(a.base));
    CUDA_CHECK(cudaDestroyExternalMemory(a.memory));
    a = Arena{};
}

// A GPU buffer of this process's, with its CUDA address.
struct OwnBuffer {
    lf_buffer *buffer = nullptr;
    Arena arena;
    unsigned char *ptr = nullptr;
};

static OwnBuffer own_buffer(lf_context *context, size_t size, const void *device_uuid) {
    OwnBuffer b;
    LF_CHECK(lf_alloc(context, size, LF_MEMORY_GPU_DEVICE_LOCAL, LF_UNSET, LF_HUGEPAGE_DEFAULT, &b.buffer));
    lf_memory_kind location{};
    LF_CHECK(lf_buffer_location(b.buffer, &location));
    if (location != LF_MEMORY_GPU_DEVICE_LOCAL) fail("a %zu-byte GPU buffer got location %u", size, location);
    lf_export exported;
    LF_CHECK(lf_buffer_export(b.buffer, &exported));
    b.arena = import_arena(exported, device_uuid);
    if (exported.offset + size > b.arena.size) fail("the buffer lies outside its arena");
    b.ptr = b.arena.base + exported.offset;
    return b;
}

static void free_own_buffer(OwnBuffer &b) {
    drop_arena(b.arena);
    lf_free(b.buffer);
    b = OwnBuffer{};
}

// ---- control messages, A to B on a2b and back on b2a, between the timed loops ----

enum : uint32_t {
    OP_BEGIN = 1,  // x[0]: 1 with kernels, 0 without; x[1]: the size. Resets B's rounds and sums
    OP_VERIFY,     // B synchronises, checks every round's sum, drops its imports. Reply: x[0] rounds,
                   // x[1] sums wrong, x[2] first wrong round, x[3] wait ns p50, x[4] buffer ns p50
    OP_QUIT,
    OP_ACK,
};
static const uint32_t kCtlMagic = 0x4c464350;  // "LFCP"

struct Ctl {
    uint32_t magic, op;
    uint64_t x[6];
};

static void send_ctl(lf_channel *channel, uint32_t op, uint64_t x0 = 0, uint64_t x1 = 0) {
    Ctl c{};
    c.magic = kCtlMagic;
    c.op = op;
    c.x[0] = x0;
    c.x[1] = x1;
    LF_CHECK(lf_send(channel, &c, sizeof c, kTimeoutNs, nullptr));
}

static Ctl ctl_of(lf_channel *channel, const lf_message &m) {
    Ctl c{};
    if ((m.flags & LF_MESSAGE_GPU) || m.len != sizeof c || !m.data)
        fail("expected a control message, got flags %u, %zu bytes", m.flags, m.len);
    std::memcpy(&c, m.data, sizeof c);
    LF_CHECK(lf_release(channel, &m));
    if (c.magic != kCtlMagic) fail("a control message with magic %#x", c.magic);
    return c;
}

static Ctl await_ack(lf_channel *channel) {
    lf_message m{};
    LF_CHECK(lf_recv(channel, kTimeoutNs, &m));
    Ctl c = ctl_of(channel, m);
    if (c.op != OP_ACK) fail("expected an ACK, got op %u", c.op);
    return c;
}

// ---- B: answers every round until A says quit ----

using ArenaKey = std::tuple<uint32_t, uint64_t, uint64_t>;  // exporter pid, token, arena id

static int side_b(const Options &o, const char *tag) {
    g_role = "B";
    progress();
    Gpu g = gpu_setup(o.device);
    lf_context *context = context_setup(g);
    Ends e = open_ends(context, tag, false);

    // Each round's sum goes to its own slot, which is also what B answers with.
    const size_t slots = o.rounds();
    OwnBuffer sums = own_buffer(context, slots * kSlot, g.prop.uuid.bytes);
    unsigned long long *results = reinterpret_cast<unsigned long long *>(sums.ptr);

    std::map<ArenaKey, Arena> imports;
    std::vector<uint64_t> values;  // each round's value, which A filled
    std::vector<double> wait_ns, buffer_ns;
    values.reserve(slots);
    wait_ns.reserve(slots);
    buffer_ns.reserve(slots);
    bool kernels = false, timing = false;
    size_t size = 0;
    uint64_t last_value = 0, sent = 0;
    bool have_sent = false;

    for (;;) {
        lf_message m{};
        LF_CHECK(lf_recv(e.rx, kTimeoutNs, &m));
        if (!(m.flags & LF_MESSAGE_GPU)) {
            progress();
            Ctl c = ctl_of(e.rx, m);
            Ctl r{};
            r.magic = kCtlMagic;
            r.op = OP_ACK;
            if (c.op == OP_BEGIN) {
                kernels = c.x[0] != 0;
                timing = !kernels;  // as cuda_ipc_pingpong: the call times of the hand-off alone
                size = size_t(c.x[1]);
                // A may still hold an answer in the slots about to be zeroed.
                if (have_sent) LF_CHECK(lf_wait_completed(e.tx, sent, kTimeoutNs));
                CUDA_CHECK(cudaMemsetAsync(results, 0, slots * kSlot, g.stream));
                values.clear();
                wait_ns.clear();
                buffer_ns.clear();
            } else if (c.op == OP_VERIFY) {
                CUDA_CHECK(cudaStreamSynchronize(g.stream));
                r.x[0] = values.size();
                if (kernels) {
                    std::vector<unsigned long long> host(values.size());
                    CUDA_CHECK(cudaMemcpyAsync(host.data(), results, host.size() * kSlot, cudaMemcpyDeviceToHost,
                                               g.stream));
                    CUDA_CHECK(cudaStreamSynchronize(g.stream));
                    for (size_t k = 0; k < host.size(); k++)
                        if (host[k] != uint64_t(size / 4) * uint32_t(values[k])) {
                            if (r.x[1] == 0) r.x[2] = k;
                            r.x[1]++;
                        }
                }
                r.x[3] = uint64_t(stats(wait_ns).p50);
                r.x[4] = uint64_t(stats(buffer_ns).p50);
                // A frees its buffer next; lava-flow would let its arena go, CUDA would keep it.
                for (auto &entry : imports) drop_arena(entry.second);
                imports.clear();
            } else if (c.op == OP_QUIT) {
                // Everything settled before A hears back and closes its ends.
                CUDA_CHECK(cudaStreamSynchronize(g.stream));
                if (have_sent) LF_CHECK(lf_wait_completed(e.tx, sent, kTimeoutNs));
                LF_CHECK(lf_send(e.tx, &r, sizeof r, kTimeoutNs, nullptr));
                break;
            } else {
                fail("unknown control op %u", c.op);
            }
            LF_CHECK(lf_send(e.tx, &r, sizeof r, kTimeoutNs, nullptr));
            continue;
        }

        const uint64_t v = m.ready_value;
        if (m.len != size || v != last_value + 1 || values.size() >= slots)
            fail("round %zu: %zu bytes, ready value %llu; expected %zu bytes, value %llu", values.size(), m.len,
                 static_cast<unsigned long long>(v), size, static_cast<unsigned long long>(last_value + 1));
        last_value = v;

        // The buffer's CUDA address: one import per arena, looked up per message.
        double t0 = timing ? now_us() : 0;
        const lf_buffer *lent = nullptr;  // borrowed until lf_release: never lf_free it
        LF_CHECK(lf_message_buffer(e.rx, &m, &lent));
        // Described (no descriptor made); exported only for an arena not imported yet.
        lf_export exported;
        LF_CHECK(lf_buffer_describe(lent, &exported));
        ArenaKey key{exported.exporter_pid, exported.exporter_token, exported.arena_id};
        auto found = imports.find(key);
        if (found == imports.end()) {
            LF_CHECK(lf_buffer_export(lent, &exported));
            found = imports.emplace(key, import_arena(exported, g.prop.uuid.bytes)).first;
        }
        if (exported.offset + m.len > found->second.size)
            fail("round %zu: the message lies outside its arena", values.size());
        const uint32_t *x = reinterpret_cast<const uint32_t *>(found->second.base + exported.offset);
        double t1 = timing ? now_us() : 0;

        // Nothing of B's that follows in the stream runs before A's work reached v.
        wait_value(e.wait, v, g.stream);
        if (timing) {
            double t2 = now_us();
            buffer_ns.push_back((t1 - t0) * 1e3);
            wait_ns.push_back((t2 - t1) * 1e3);
        }
        const size_t k = values.size();
        if (kernels) {
            const size_t words = m.len / 4;
            sum_words<<<g.grid(words), kThreads, 0, g.stream>>>(x, words, results + k);
            CUDA_CHECK(cudaGetLastError());
        }
        signal_value(e.signal, v, g.stream);
        LF_CHECK(lf_send_buffer_after(e.tx, sums.buffer, k * kSlot, kSlot, v, kTimeoutNs, &sent));
        have_sent = true;
        values.push_back(v);
        LF_CHECK(lf_release(e.rx, &m));
    }

    for (auto &entry : imports) drop_arena(entry.second);
    close_ends(e);
    free_own_buffer(sums);
    lf_context_free(context);
    CUDA_CHECK(cudaStreamDestroy(g.stream));
    return 0;
}

// ---- A: drives every case and prints ----

struct SideA {
    const Options &o;
    Gpu g;
    lf_context *context;
    Ends e;
    uint64_t value = 0;  // the last round's value, over the whole run
    uint64_t sent = 0;   // X's last send
    bool have_sent = false;
};

// One round trip with A's buffer `x`; the caller times it.
static void round_trip(SideA &a, const OwnBuffer &x, size_t size, bool kernels, double *signal_us = nullptr) {
    const uint64_t v = ++a.value;
    cudaStream_t stream = a.g.stream;
    // lava-flow's contract: X is not rewritten until B has released its previous send.
    if (a.have_sent) LF_CHECK(lf_wait_completed(a.e.tx, a.sent, kTimeoutNs));
    if (kernels) {
        const size_t words = size / 4;
        fill_words<<<a.g.grid(words), kThreads, 0, stream>>>(reinterpret_cast<uint32_t *>(x.ptr), words, uint32_t(v));
        CUDA_CHECK(cudaGetLastError());
    }
    double t0 = signal_us ? now_us() : 0;
    signal_value(a.e.signal, v, stream);
    if (signal_us) *signal_us = now_us() - t0;
    LF_CHECK(lf_send_buffer_after(a.e.tx, x.buffer, 0, size, v, kTimeoutNs, &a.sent));
    a.have_sent = true;

    lf_message m{};
    LF_CHECK(lf_recv(a.e.rx, kTimeoutNs, &m));
    if (!(m.flags & LF_MESSAGE_GPU) || m.len != kSlot || m.ready_value != v)
        fail("round value %llu: B answered with flags %u, %zu bytes, ready value %llu",
             static_cast<unsigned long long>(v), m.flags, m.len, static_cast<unsigned long long>(m.ready_value));
    // The next fill (and everything after it in A's stream) waits for B's work on X.
    wait_value(a.e.wait, m.ready_value, stream);
    LF_CHECK(lf_release(a.e.rx, &m));
}

// Ends a size: everything done on both GPUs, X released by B, B's sums checked.
static Ctl finish_size(SideA &a, OwnBuffer &x) {
    CUDA_CHECK(cudaStreamSynchronize(a.g.stream));
    if (a.have_sent) LF_CHECK(lf_wait_completed(a.e.tx, a.sent, kTimeoutNs));
    a.have_sent = false;
    send_ctl(a.e.tx, OP_VERIFY);
    Ctl r = await_ack(a.e.rx);
    free_own_buffer(x);
    return r;
}

static void run_handoff(SideA &a) {
    const Options &o = a.o;
    std::printf("\n== lf_handoff: semaphore signal + lf_send_buffer_after, B looks the buffer up, waits in its\n"
                "   stream, signals and answers the same way; A waits in its stream. No kernels, no host\n"
                "   synchronisation. half round trip (us), %d iterations after %d warm-up, %zu sizes;\n"
                "   p50 of A's signal call (signal_us), B's wait call (wait_us) and B's lf_message_buffer +\n"
                "   lf_buffer_describe + import lookup (buffer_us)\n",
                o.handoff_iters, o.handoff_warm, o.sizes.size());
    std::printf("  %10s %10s %10s %10s %10s %10s\n", "size", "p50_us", "p99_us", "signal_us", "wait_us", "buffer_us");
    for (size_t size : o.sizes) {
        progress();
        OwnBuffer x = own_buffer(a.context, size, a.g.prop.uuid.bytes);
        send_ctl(a.e.tx, OP_BEGIN, 0, size);
        await_ack(a.e.rx);
        std::vector<double> half, signals;
        half.reserve(size_t(o.handoff_iters));
        signals.reserve(size_t(o.handoff_iters));
        for (int i = 0; i < o.handoff_warm + o.handoff_iters; i++) {
            double signal_us = 0;
            double t0 = now_us();
            round_trip(a, x, size, false, &signal_us);
            double t1 = now_us();
            if (i >= o.handoff_warm) {
                half.push_back((t1 - t0) / 2);
                signals.push_back(signal_us);
            }
        }
        Ctl r = finish_size(a, x);
        if (r.x[0] != uint64_t(o.handoff_warm + o.handoff_iters))
            fail("lf_handoff %zu B: B saw %llu rounds, A sent %d", size, static_cast<unsigned long long>(r.x[0]),
                 o.handoff_warm + o.handoff_iters);
        Stats st = stats(half), sig = stats(signals);
        double wait_us = double(r.x[3]) / 1e3, buffer_us = double(r.x[4]) / 1e3;
        std::printf("  %10zu %10.2f %10.2f %10.2f %10.2f %10.2f\n", size, st.p50, st.p99, sig.p50, wait_us, buffer_us);
        std::printf("JSON {\"case\":\"lf_handoff\",\"size\":%zu,\"iters\":%d,\"p50_us\":%.3f,\"p99_us\":%.3f,"
                    "\"signal_p50_us\":%.3f,\"wait_p50_us\":%.3f,\"buffer_p50_us\":%.3f}\n",
                    size, o.handoff_iters, st.p50, st.p99, sig.p50, wait_us, buffer_us);
    }
}

static void run_gpu(SideA &a) {
    const Options &o = a.o;
    std::printf("\n== lf_gpu_pingpong: A fill -> signal a2b -> send X; B waits, sums X -> signal b2a -> answers;\n"
                "   A waits before its next fill, ordered on the GPU. half round trip (us), A synchronises its\n"
                "   stream each round; %d iterations after %d warm-up, %zu sizes. pipelined: the same without\n"
                "   host synchronisation, per iteration / 2 (pipe_p50/pipe_p99: its rounds one by one).\n"
                "   B checks every round's sum.\n",
                o.gpu_iters, o.gpu_warm, o.sizes.size());
    std::printf("  %10s %10s %10s %13s %10s %10s\n", "size", "p50_us", "p99_us", "pipelined_us", "pipe_p50",
                "pipe_p99");
    for (size_t size : o.sizes) {
        progress();
        OwnBuffer x = own_buffer(a.context, size, a.g.prop.uuid.bytes);
        send_ctl(a.e.tx, OP_BEGIN, 1, size);
        await_ack(a.e.rx);
        std::vector<double> half, pipe;
        half.reserve(size_t(o.gpu_iters));
        pipe.reserve(size_t(o.gpu_iters));
        for (int i = 0; i < o.gpu_warm + o.gpu_iters; i++) {
            double t0 = now_us();
            round_trip(a, x, size, true);
            CUDA_CHECK(cudaStreamSynchronize(a.g.stream));
            double t1 = now_us();
            if (i >= o.gpu_warm) half.push_back((t1 - t0) / 2);
        }
        double start = now_us();
        for (int i = 0; i < o.gpu_iters; i++) {
            double t0 = now_us();
            round_trip(a, x, size, true);
            pipe.push_back((now_us() - t0) / 2);
        }
        CUDA_CHECK(cudaStreamSynchronize(a.g.stream));
        double pipelined = (now_us() - start) / o.gpu_iters / 2;

        Ctl r = finish_size(a, x);
        const uint64_t rounds = uint64_t(o.gpu_warm) + 2 * uint64_t(o.gpu_iters);
        if (r.x[0] != rounds)
            fail("lf_gpu_pingpong %zu B: B saw %llu rounds, A sent %llu", size, static_cast<unsigned long long>(r.x[0]),
                 static_cast<unsigned long long>(rounds));
        if (r.x[1] != 0)
            fail("lf_gpu_pingpong %zu B: %llu of %llu sums wrong, the first at round %llu: B's kernel did not see "
                 "A's fill, or A's fill overwrote X under B's sum",
                 size, static_cast<unsigned long long>(r.x[1]), static_cast<unsigned long long>(rounds),
                 static_cast<unsigned long long>(r.x[2]));
        Stats st = stats(half), pp = stats(pipe);
        std::printf("  %10zu %10.2f %10.2f %13.2f %10.2f %10.2f\n", size, st.p50, st.p99, pipelined, pp.p50, pp.p99);
        std::printf("JSON {\"case\":\"lf_gpu_pingpong\",\"size\":%zu,\"iters\":%d,\"p50_us\":%.3f,\"p99_us\":%.3f,"
                    "\"pipelined_us\":%.3f,\"pipe_p50_us\":%.3f,\"pipe_p99_us\":%.3f,\"sums_checked\":%llu}\n",
                    size, o.gpu_iters, st.p50, st.p99, pipelined, pp.p50, pp.p99,
                    static_cast<unsigned long long>(rounds));
    }
}

static int side_a(const Options &o, const char *tag) {
    g_role = "A";
    progress();
    SideA a{o, gpu_setup(o.device), nullptr, Ends{}};
    a.context = context_setup(a.g);
    lf_device_info info{};
    info.struct_size = sizeof info;
    LF_CHECK(lf_context_device_info(a.context, &info));
    int driver = 0, runtime = 0;
    CUDA_CHECK(cudaDriverGetVersion(&driver));
    CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
    const char *mps = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
    std::printf("lava-flow GPU ping-pong: lava-flow %s, CUDA device %d (%s, %d SMs) = Vulkan device %u (%s), "
                "driver API %d, runtime %d, %s%s\n",
                lf_version(), o.device, a.g.prop.name, a.g.sms, info.index, info.name, driver, runtime,
                o.quick ? "quick, " : "", mps ? "CUDA_MPS_PIPE_DIRECTORY set" : "CUDA_MPS_PIPE_DIRECTORY unset");

    a.e = open_ends(a.context, tag, true);
    const char *transport = nullptr, *why = nullptr;
    LF_CHECK(lf_channel_transport(a.e.tx, &transport, &why));
    std::printf("channel %s-a2b: %s (%s)\n", tag, transport, why);
    std::printf("JSON {\"case\":\"lf_config\",\"device\":\"%s\",\"driver\":%d,\"runtime\":%d,\"lava_flow\":\"%s\","
                "\"quick\":%s,\"mps_pipe_dir\":\"%s\",\"sizes\":%zu,\"transport\":\"%s\","
                "\"transport_reason\":\"%s\"}\n",
                json_escape(a.g.prop.name).c_str(), driver, runtime, json_escape(lf_version()).c_str(),
                o.quick ? "true" : "false", json_escape(mps).c_str(), o.sizes.size(), json_escape(transport).c_str(),
                json_escape(why).c_str());

    run_handoff(a);
    run_gpu(a);

    progress();
    send_ctl(a.e.tx, OP_QUIT);
    await_ack(a.e.rx);
    close_ends(a.e);
    lf_context_free(a.context);
    CUDA_CHECK(cudaStreamDestroy(a.g.stream));
    return 0;
}

int main(int argc, char **argv) {
    Options o = parse(argc, argv);
    setvbuf(stdout, nullptr, _IOLBF, 0);
    signal(SIGALRM, on_watchdog);
    char tag[32];
    std::snprintf(tag, sizeof tag, "lfcp-%d", int(getpid()));  // concurrent runs do not meet

    const pid_t parent = getpid();
    std::fflush(stdout);
    // Neither process touches CUDA, Vulkan or lava-flow before the fork: none survives one.
    pid_t child = fork();
    if (child < 0) {
        std::perror("fork");
        return 1;
    }
    if (child == 0) {
        // A parent that dies without killing us must not leave us blocked in a GPU wait.
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(1);
        std::exit(side_b(o, tag));
    }
    g_child = child;
    int rc = side_a(o, tag);
    alarm(0);
    int status = reap(child, kTimeoutS * 1000);
    g_child = -1;
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "lf_cuda_pingpong: FAIL process B ended with status %d\n", status);
        return 1;
    }
    if (rc == 0) std::printf("\nlf_cuda_pingpong: done\n");
    return rc;
}
