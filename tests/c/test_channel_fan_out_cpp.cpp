// Fan-out channels through the C++ wrapper (lava_flow.hpp), between real processes: this process
// is the producer, the consumers are children. Built twice, as test_channel_fan_in_cpp is: with
// exceptions, and with -fno-exceptions (the lf::nothrow forms only).
//
//   test_channel_fan_out_cpp                        the producer; starts the consumers
//   test_channel_fan_out_cpp consumer NAME COUNT    receives COUNT numbered messages in order,
//                            [BUFFER]               then (BUFFER 1) holds the buffer by
//                                                   reference until a byte comes on its stdin
//   test_channel_fan_out_cpp slow NAME              receives only after its stdin closes
//   test_channel_fan_out_cpp full NAME              a consumer of the full fan-out: refused
//
// Checks ChannelKind::FanOut with max_peers and slow_consumer_timeout, Producer::peers (the
// consumers' slots with their pids; a consumer's peers() is its producer, under the slot the
// producer lists that consumer in), send_buffer shared by
// three consumers and complete (is_completed, wait_completed, completed) only after the last
// release, a slow consumer detached (its recv's LF_ERR_PEER_GONE says "detached", last_gone()
// stays empty: a fan-out consumer has one producer), and a full fan-out refused with
// LF_ERR_INVALID_STATE naming max_peers. The runtime dir is left empty.
#include <lava_flow.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

static int failures = 0;

#include "check.h"

using namespace std::chrono_literals;

constexpr std::uint32_t CONSUMERS = 3;
constexpr std::uint64_t MESSAGES = 2000;
constexpr std::size_t BUFFER_SIZE = std::size_t{1} << 20;
constexpr lf::Timeout WAIT = 30s;

#define EXPECT_OK(expr) expect_ok(__FILE__, __LINE__, #expr, (expr))
#define EXPECT_ERROR(expr, status, needle) expect_error(__FILE__, __LINE__, #expr, (expr), (status), (needle))

template <typename T>
static bool expect_ok(const char* file, int line, const char* what, const lf::Expected<T>& result) {
    if (result) return true;
    std::fprintf(stderr, "%s:%d: %s failed: %s: %s\n", file, line, what, result.error().status_name(),
                 result.error().what());
    failures++;
    return false;
}

template <typename T>
static void expect_error(const char* file, int line, const char* what, const lf::Expected<T>& result,
                         lf_status status, const char* needle) {
    if (result.has_value()) {
        std::fprintf(stderr, "%s:%d: %s succeeded, expected %s\n", file, line, what, lf_status_str(status));
        failures++;
    } else if (result.status() != status || std::strstr(result.error().what(), needle) == nullptr) {
        std::fprintf(stderr, "%s:%d: %s failed with %s (%s), expected %s with \"%s\"\n", file, line, what,
                     result.error().status_name(), result.error().what(), lf_status_str(status), needle);
        failures++;
    }
}

// A small pool (the buffer goes by reference, outside it): each consumer maps the pool in whole
// while the producer waits for its answer, which must come within 2 s on a loaded machine.
static lf::ChannelConfig fan_out(std::uint32_t max_peers) {
    return lf::ChannelConfig()
        .kind(lf::ChannelKind::FanOut)
        .max_peers(max_peers)
        .capacity(64)
        .pool_size(1 << 20)
        .rendezvous_timeout(WAIT);
}

static lf::ChannelConfig bounded() { return fan_out(2).capacity(4).slow_consumer_timeout(2s); }

static lf::Expected<lf::Context> make_context() {
    lf_context_config c{};
    lf_context_config_init(&c, sizeof c);
    c.gpu_policy = LF_GPU_DISABLED;
    return lf::Context::create(lf::nothrow, &c);
}

static std::uint8_t buffer_byte(std::size_t i) { return static_cast<std::uint8_t>(i * 131u + 7u); }

// Tells the producer (our stdout, a pipe) how far we are.
static void say(const char* word) {
    std::printf("%s\n", word);
    std::fflush(stdout);
}

// --- The consumers ---------------------------------------------------------------------------

static int run_consumer(const std::string& name, std::uint64_t count, bool buffer) {
    auto context = make_context();
    if (!EXPECT_OK(context)) return 1;
    auto created = lf::Consumer::create(lf::nothrow, *context, name, fan_out(CONSUMERS));
    if (!EXPECT_OK(created)) return 1;
    lf::Consumer in = std::move(*created);
    say("attached");
    // Its one peer is the producer, in the slot the producer lists this consumer in: said to the
    // producer, which checks it.
    auto peers = in.peers(lf::nothrow);
    if (EXPECT_OK(peers) && !(peers->size() == 1 && (*peers)[0].slot < CONSUMERS &&
                              (*peers)[0].state == lf::PeerState::Alive &&
                              (*peers)[0].pid == static_cast<std::uint32_t>(getppid()) && (*peers)[0].route == "shm")) {
        std::fprintf(stderr, "consumer %d: its producer (pid %d) should be its one peer, alive, through shm:\n",
                     static_cast<int>(getpid()), static_cast<int>(getppid()));
        for (const lf::Peer& p : *peers)
            std::fprintf(stderr, "  slot %u: state %u, pid %u, route %s\n", p.slot, static_cast<unsigned>(p.state), p.pid,
                         p.route.c_str());
        failures++;
    }
    say(("slot " + std::to_string(peers && !peers->empty() ? (*peers)[0].slot : LF_MAX_PEERS)).c_str());
    for (std::uint64_t i = 0; i < count && failures == 0; i++) {
        auto m = in.recv(lf::nothrow, WAIT);
        if (!EXPECT_OK(m)) return 1;
        std::uint64_t got = ~std::uint64_t{0};
        CHECK(m->size() == sizeof got && m->sequence() == i && !m->zero_copy() && m->producer() == 0);
        if (m->size() == sizeof got) std::memcpy(&got, m->data(), sizeof got);
        CHECK(got == i);
    }
    if (buffer && failures == 0) {
        auto m = in.recv(lf::nothrow, WAIT);
        if (!EXPECT_OK(m)) return 1;
        CHECK(m->size() == BUFFER_SIZE && m->sequence() == count && m->zero_copy());
        if (m->size() == BUFFER_SIZE) {
            std::size_t i = 0;
            CHECK(std::all_of(m->begin(), m->end(), [&i](std::byte b) { return b == std::byte{buffer_byte(i++)}; }));
        }
        say("holding");
        char byte;
        CHECK(read(0, &byte, 1) == 1);
        EXPECT_OK(m->release(lf::nothrow));
        say("released");
    }
    // Then the producer's end; a fan-out consumer has one producer, no slot to name.
    EXPECT_ERROR(in.recv(lf::nothrow, WAIT), LF_ERR_PEER_GONE, "");
    CHECK(!in.last_gone());
    return failures != 0;
}

static int run_slow(const std::string& name) {
    auto context = make_context();
    if (!EXPECT_OK(context)) return 1;
    auto created = lf::Consumer::create(lf::nothrow, *context, name, bounded());
    if (!EXPECT_OK(created)) return 1;
    lf::Consumer in = std::move(*created);
    say("attached");
    char byte;
    while (read(0, &byte, 1) > 0) {
    }
    // Detached meanwhile: what it had comes first, in order, then its end, saying why.
    std::uint64_t got = 0;
    for (;;) {
        auto m = in.recv(lf::nothrow, WAIT);
        if (!m) {
            EXPECT_ERROR(m, LF_ERR_PEER_GONE, "detached");
            break;
        }
        CHECK(m->sequence() == got);
        got++;
    }
    CHECK(got <= 4);  // its ring's capacity
    CHECK(!in.last_gone());
    return failures != 0;
}

static int run_full(const std::string& name) {
    auto context = make_context();
    if (!EXPECT_OK(context)) return 1;
    EXPECT_ERROR(lf::Consumer::create(lf::nothrow, *context, name, fan_out(2)), LF_ERR_INVALID_STATE, "max_peers = 2");
#if LAVA_FLOW_EXCEPTIONS
    try {
        lf::Consumer refused(*context, name, fan_out(2));
        CHECK(!"a consumer of a full fan-out was accepted");
    } catch (const lf::Error& e) {
        CHECK(e.status() == LF_ERR_INVALID_STATE && std::strstr(e.what(), "is full") != nullptr);
    }
#endif
    return failures != 0;
}

// --- The producer ----------------------------------------------------------------------------

struct Child {
    pid_t pid = -1;
    int in = -1;           // its stdin's write end
    FILE* out = nullptr;   // its stdout's read end

    // The child's next line must be `word`.
    void expect_line(const char* word) {
        char line[64] = "";
        if (out == nullptr || std::fgets(line, sizeof line, out) == nullptr) line[0] = '\0';
        line[std::strcspn(line, "\n")] = '\0';
        if (std::strcmp(line, word) != 0) {
            std::fprintf(stderr, "child %d said \"%s\", expected \"%s\"\n", static_cast<int>(pid), line, word);
            failures++;
        }
    }
    // Closes its stdin and waits for it; it must exit 0.
    void finish() {
        int status = 0;
        close(in);
        CHECK(waitpid(pid, &status, 0) == pid);
        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
            std::fprintf(stderr, "child %d ended with status %#x\n", static_cast<int>(pid), status);
            failures++;
        }
        if (out != nullptr) std::fclose(out);
    }
};

// Starts `self role name count buffer` with pipes for its stdin and stdout.
static Child start(const char* self, const char* role, const std::string& name, std::uint64_t count = 0,
                   bool buffer = false) {
    const std::string n = std::to_string(count);
    int in[2], out[2];
    CHECK(pipe2(in, O_CLOEXEC) == 0 && pipe2(out, O_CLOEXEC) == 0);
    std::fflush(nullptr);
    Child c;
    c.pid = fork();
    if (c.pid == 0) {
        // dup2 clears close-on-exec on the copies.
        if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0) _exit(126);
        execl(self, self, role, name.c_str(), n.c_str(), buffer ? "1" : "0", static_cast<char*>(nullptr));
        _exit(127);
    }
    CHECK(c.pid > 0);
    close(in[0]);
    close(out[1]);
    c.in = in[1];
    c.out = fdopen(out[0], "r");
    return c;
}

// The producer's alive consumers (Producer::peers), checking every slot's fields.
static std::vector<std::uint32_t> alive_pids(const lf::Producer& out, std::uint32_t max_peers) {
    std::vector<std::uint32_t> pids;
    auto peers = out.peers(lf::nothrow);
    if (!EXPECT_OK(peers)) return pids;
    CHECK(peers->size() == max_peers);
    for (std::size_t i = 0; i < peers->size(); i++) {
        const lf::Peer& p = (*peers)[i];
        CHECK(p.slot == i && !p.rank);
        if (p.state == lf::PeerState::Alive) {
            CHECK(p.pid != 0 && p.route == "shm" && !p.host.empty());
            pids.push_back(p.pid);
        } else {
            CHECK(p.state == lf::PeerState::Free && p.pid == 0 && p.route.empty());
        }
    }
#if LAVA_FLOW_EXCEPTIONS
    CHECK(out.peers().size() == max_peers);
#endif
    return pids;
}

// Creating waited for the first consumer; waits (30 s at most) until `want` are attached.
static void wait_alive(const lf::Producer& out, std::uint32_t max_peers, std::size_t want) {
    for (int i = 0; i < 3000 && alive_pids(out, max_peers).size() < want; i++) std::this_thread::sleep_for(10ms);
    CHECK(alive_pids(out, max_peers).size() == want);
}

static void broadcast(const lf::Context& context, const char* self, const std::string& name) {
    std::vector<Child> consumers;
    for (std::uint32_t i = 0; i < CONSUMERS; i++) consumers.push_back(start(self, "consumer", name, MESSAGES, true));
    auto created = lf::Producer::create(lf::nothrow, context, name, fan_out(CONSUMERS));
    if (!EXPECT_OK(created)) return;
    std::optional<lf::Producer> producer(std::move(*created));
    lf::Producer& out = *producer;
    for (Child& c : consumers) c.expect_line("attached");
    wait_alive(out, CONSUMERS, CONSUMERS);
    // Each consumer's pid in one slot: the one its own peers() gave.
    auto peers = out.peers(lf::nothrow);
    if (!EXPECT_OK(peers)) return;
    for (Child& c : consumers) {
        std::uint32_t slots = 0;
        for (const lf::Peer& p : *peers) slots += p.pid == static_cast<std::uint32_t>(c.pid);
        CHECK(slots == 1);
        for (const lf::Peer& p : *peers)
            if (p.pid == static_cast<std::uint32_t>(c.pid)) c.expect_line(("slot " + std::to_string(p.slot)).c_str());
    }

    for (std::uint64_t i = 0; i < MESSAGES && failures == 0; i++) {
        auto sent = out.send(lf::nothrow, &i, sizeof i, WAIT);
        CHECK(sent && *sent == i);
    }
    auto buffer = context.allocate(lf::nothrow, BUFFER_SIZE);
    if (!EXPECT_OK(buffer)) return;
    auto data = buffer->data(lf::nothrow);
    if (!EXPECT_OK(data)) return;
    auto* bytes = static_cast<std::uint8_t*>(*data);
    for (std::size_t i = 0; i < BUFFER_SIZE; i++) bytes[i] = buffer_byte(i);
    auto sent = out.send_buffer(lf::nothrow, *buffer, 0, BUFFER_SIZE, WAIT);
    if (!EXPECT_OK(sent)) return;
    const std::uint64_t seq = *sent;
    CHECK(seq == MESSAGES);
    for (Child& c : consumers) c.expect_line("holding");
    // Held by at least one consumer until the last release: not complete.
    for (Child& c : consumers) {
        auto done = out.is_completed(lf::nothrow, seq);
        CHECK(done && !*done);
        EXPECT_ERROR(out.wait_completed(lf::nothrow, seq, 100ms), LF_ERR_TIMEOUT, "");
        CHECK(write(c.in, "g", 1) == 1);
        c.expect_line("released");
    }
    EXPECT_OK(out.wait_completed(lf::nothrow, seq, WAIT));
    auto done = out.is_completed(lf::nothrow, seq);
    CHECK(done && *done);
#if LAVA_FLOW_EXCEPTIONS
    CHECK(out.completed() == seq + 1);
    out.wait_completed(seq, WAIT);
#else
    auto completed = out.completed(lf::nothrow);
    CHECK(completed && *completed == seq + 1);
#endif
    producer.reset();  // closes: the consumers see its end
    for (Child& c : consumers) c.finish();
}

static void slow_consumer(const lf::Context& context, const char* self, const std::string& name) {
    Child slow = start(self, "slow", name);
    auto created = lf::Producer::create(lf::nothrow, context, name, bounded());
    if (!EXPECT_OK(created)) return;
    std::optional<lf::Producer> producer(std::move(*created));
    lf::Producer& out = *producer;
    slow.expect_line("attached");
    Child fast = start(self, "consumer", name, 50);
    fast.expect_line("attached");
    wait_alive(out, 2, 2);
    // The slow one's ring fills after four; two seconds later it is detached, and sends go on.
    for (std::uint64_t i = 0; i < 50 && failures == 0; i++) EXPECT_OK(out.send(lf::nothrow, &i, sizeof i, WAIT));
    EXPECT_OK(out.wait_completed(lf::nothrow, 49, WAIT));
    CHECK(alive_pids(out, 2).size() == 1);
    slow.finish();  // closing its stdin lets it read, and see why it was let go
    producer.reset();
    fast.finish();
}

static void full_fan_out(const lf::Context& context, const char* self, const std::string& name) {
    Child first = start(self, "consumer", name);
    auto created = lf::Producer::create(lf::nothrow, context, name, fan_out(2));
    if (!EXPECT_OK(created)) return;
    std::optional<lf::Producer> producer(std::move(*created));
    lf::Producer& out = *producer;
    Child second = start(self, "consumer", name);
    first.expect_line("attached");
    second.expect_line("attached");
    wait_alive(out, 2, 2);
    Child full = start(self, "full", name);
    full.finish();
    CHECK(alive_pids(out, 2).size() == 2);
    producer.reset();
    first.finish();
    second.finish();
}

static bool dir_is_empty(const char* path) {
    DIR* dir = opendir(path);
    if (dir == nullptr) return false;
    bool empty = true;
    while (dirent* e = readdir(dir))
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
            std::fprintf(stderr, "left in the runtime dir: %s\n", e->d_name);
            empty = false;
        }
    closedir(dir);
    return empty;
}

int main(int argc, char** argv) {
    if (argc >= 4 && std::strcmp(argv[1], "consumer") == 0)
        return run_consumer(argv[2], std::strtoull(argv[3], nullptr, 10), argc > 4 && std::strcmp(argv[4], "1") == 0);
    if (argc >= 3 && std::strcmp(argv[1], "slow") == 0) return run_slow(argv[2]);
    if (argc >= 3 && std::strcmp(argv[1], "full") == 0) return run_full(argv[2]);
    if (argc != 1) {
        std::fprintf(stderr, "usage: %s [consumer NAME COUNT [BUFFER] | slow NAME | full NAME]\n", argv[0]);
        return 2;
    }
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 1;
    self[n] = '\0';
    // A private runtime dir (mkdtemp makes it 0700), checked empty at the end.
    char dir[] = "/tmp/lf-cpp-fan-out-XXXXXX";
    if (mkdtemp(dir) == nullptr) return 1;
    setenv("LF_RUNTIME_DIR", dir, 1);
    signal(SIGPIPE, SIG_IGN);  // a child that died must not kill us through a pipe
    {
        auto context = make_context();
        if (!EXPECT_OK(context)) return 1;
        const std::string id = std::to_string(getpid());
        broadcast(*context, self, "cpp-fan-out-" + id);
        slow_consumer(*context, self, "cpp-fan-out-slow-" + id);
        full_fan_out(*context, self, "cpp-fan-out-full-" + id);
    }
    CHECK(dir_is_empty(dir));
    rmdir(dir);
    if (failures == 0)
        std::printf("test_channel_fan_out_cpp (%s): OK\n", LAVA_FLOW_EXCEPTIONS ? "exceptions" : "no exceptions");
    return failures != 0;
}
