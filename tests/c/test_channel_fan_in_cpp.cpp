// Fan-in channels through the C++ wrapper (lava_flow.hpp), between real processes. Built twice,
// as test_channel_cpp is: with exceptions, and with -fno-exceptions (the lf::nothrow forms only).
//
//   test_channel_fan_in_cpp                        the consumer; starts the other processes
//   test_channel_fan_in_cpp producer NAME COUNT    a fan-in producer of COUNT numbered messages;
//                                                  holds its slot until its stdin closes
//   test_channel_fan_in_cpp full NAME              a producer of the full fan-in: must be refused
//   test_channel_fan_in_cpp pair NAME              a pair producer of one message
//
// Checks ChannelConfig's kind, max_peers and slow_consumer_timeout (defaults, and bad values
// refused with their messages), Message::producer (each producer's order per slot),
// Consumer::peers (two alive producers with their pids, then free slots), a full fan-in refused
// with LF_ERR_INVALID_STATE, and Consumer::last_gone: empty before any end, the slot of each
// LF_ERR_PEER_GONE (from the throwing form too, where there are exceptions), and empty for a
// pair channel's end. The runtime dir is left empty.
#include <lava_flow.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static int failures = 0;

#include "check.h"

using namespace std::chrono_literals;

constexpr std::uint32_t PRODUCERS = 2;
constexpr std::uint64_t MESSAGES = 5000;
constexpr lf::Timeout WAIT = 30s;

struct Numbered {
    std::uint64_t number;
    std::uint64_t pid;
};

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

static lf::ChannelConfig fan_in() {
    return lf::ChannelConfig().kind(lf::ChannelKind::FanIn).max_peers(PRODUCERS).capacity(64).rendezvous_timeout(WAIT);
}

static lf::Expected<lf::Context> make_context() {
    lf_context_config c{};
    lf_context_config_init(&c, sizeof c);
    c.gpu_policy = LF_GPU_DISABLED;
    return lf::Context::create(lf::nothrow, &c);
}

// --- The other processes -------------------------------------------------------------------------

static int run_producer(const std::string& name, std::uint64_t count) {
    auto context = make_context();
    if (!EXPECT_OK(context)) return 1;
    auto out = lf::Producer::create(lf::nothrow, *context, name, fan_in());
    if (!EXPECT_OK(out)) return 1;
    for (std::uint64_t i = 0; i < count; i++) {
        const Numbered m{i, static_cast<std::uint64_t>(getpid())};
        auto sent = out->send(lf::nothrow, &m, sizeof m, WAIT);
        if (!EXPECT_OK(sent)) return 1;
        CHECK(*sent == i);
    }
    char byte;
    while (read(0, &byte, 1) > 0) {
    }
    return failures != 0;
}

static int run_full(const std::string& name) {
    auto context = make_context();
    if (!EXPECT_OK(context)) return 1;
    EXPECT_ERROR(lf::Producer::create(lf::nothrow, *context, name, fan_in()), LF_ERR_INVALID_STATE, "max_peers = 2");
#if LAVA_FLOW_EXCEPTIONS
    try {
        lf::Producer refused(*context, name, fan_in());
        CHECK(!"a producer of a full fan-in was accepted");
    } catch (const lf::Error& e) {
        CHECK(e.status() == LF_ERR_INVALID_STATE && std::strstr(e.what(), "is full") != nullptr);
    }
#endif
    return failures != 0;
}

static int run_pair(const std::string& name) {
    auto context = make_context();
    if (!EXPECT_OK(context)) return 1;
    auto out = lf::Producer::create(lf::nothrow, *context, name, lf::ChannelConfig().rendezvous_timeout(WAIT));
    if (!EXPECT_OK(out)) return 1;
    EXPECT_OK(out->send(lf::nothrow, "pair", 4, WAIT));
    return failures != 0;
}

// --- The consumer ------------------------------------------------------------------------------

// Starts `self role name [count]` with `in` as its stdin (-1: /dev/null).
static pid_t start(const char* self, const char* role, const std::string& name, std::uint64_t count, int in) {
    const std::string n = std::to_string(count);
    std::fflush(nullptr);
    pid_t child = fork();
    if (child == 0) {
        int fd = in >= 0 ? in : open("/dev/null", O_RDONLY);
        if (fd < 0 || dup2(fd, 0) < 0) _exit(126);
        execl(self, self, role, name.c_str(), n.c_str(), static_cast<char*>(nullptr));
        _exit(127);
    }
    CHECK(child > 0);
    return child;
}

static bool exited_ok(pid_t child) {
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// The config's fields, and bad values refused on creation with their messages.
static void config_values(const lf::Context& context) {
    const lf::ChannelConfig defaults;
    CHECK(defaults.raw().kind == LF_CHANNEL_PAIR && defaults.raw().max_peers == 8);
    CHECK(defaults.raw().slow_consumer_timeout_ns < 0);
    const lf::ChannelConfig set = lf::ChannelConfig().kind(lf::ChannelKind::FanOut).max_peers(3).slow_consumer_timeout(2ms);
    CHECK(set.raw().kind == LF_CHANNEL_FAN_OUT && set.raw().max_peers == 3);
    CHECK(set.raw().slow_consumer_timeout_ns == 2000000);
    CHECK(lf::ChannelConfig(set).slow_consumer_timeout(lf::forever).raw().slow_consumer_timeout_ns == -1);

    EXPECT_ERROR(lf::Consumer::create(lf::nothrow, context, "bad", fan_in().max_peers(0)), LF_ERR_INVALID_ARGUMENT,
                 "max_peers 0 must be from 1 to 64");
    EXPECT_ERROR(lf::Producer::create(lf::nothrow, context, "bad", fan_in().max_peers(65)), LF_ERR_INVALID_ARGUMENT,
                 "max_peers 65 must be from 1 to 64");
    EXPECT_ERROR(lf::Consumer::create(lf::nothrow, context, "bad", fan_in().kind(static_cast<lf::ChannelKind>(7))),
                 LF_ERR_INVALID_ARGUMENT, "kind is 7, not an lf_channel_kind: use LF_CHANNEL_PAIR (0)");
    EXPECT_ERROR(lf::Consumer::create(lf::nothrow, context, "bad", fan_in().slow_consumer_timeout(0ns)),
                 LF_ERR_INVALID_ARGUMENT, "slow_consumer_timeout is a fan-out setting");
    EXPECT_ERROR(lf::Producer::create(lf::nothrow, context, "bad", fan_in().kind(lf::ChannelKind::Pair)
                                                                         .slow_consumer_timeout(0ns)),
                 LF_ERR_INVALID_ARGUMENT, "slow_consumer_timeout is a fan-out setting, and this channel is a pair");
}

static void expect_peers(const lf::Consumer& in, lf::PeerState state, const pid_t* by_slot) {
    auto peers = in.peers(lf::nothrow);
    if (!EXPECT_OK(peers)) return;
    CHECK(peers->size() == PRODUCERS);
    for (std::size_t i = 0; i < peers->size(); i++) {
        const lf::Peer& p = (*peers)[i];
        CHECK(p.slot == i && p.state == state && !p.rank);
        if (state == lf::PeerState::Alive)
            CHECK(by_slot != nullptr && static_cast<pid_t>(p.pid) == by_slot[i] && p.route == "shm" && !p.host.empty());
        else
            CHECK(p.pid == 0 && p.route.empty() && p.host.empty());
    }
#if LAVA_FLOW_EXCEPTIONS
    CHECK(in.peers().size() == PRODUCERS);
#endif
}

static void run_consumer(const char* self, const std::string& name) {
    auto context = make_context();
    if (!EXPECT_OK(context)) return;
    config_values(*context);

    int go[2];
    CHECK(pipe2(go, O_CLOEXEC) == 0);
    pid_t producers[PRODUCERS];
    for (pid_t& p : producers) p = start(self, "producer", name, MESSAGES, go[0]);
    close(go[0]);
    auto created = lf::Consumer::create(lf::nothrow, *context, name, fan_in());
    if (!EXPECT_OK(created)) return;
    lf::Consumer in = std::move(*created);
    CHECK(!in.last_gone());

    // Each producer's messages in its order, told apart by Message::producer.
    std::uint64_t next[PRODUCERS] = {};
    pid_t by_slot[PRODUCERS] = {};
    for (std::uint64_t got = 0; got < PRODUCERS * MESSAGES && failures == 0; got++) {
        auto m = in.recv(lf::nothrow, WAIT);
        if (!EXPECT_OK(m)) return;
        const std::uint32_t slot = m->producer();
        Numbered n{};
        CHECK(slot < PRODUCERS && m->size() == sizeof n);
        if (failures != 0) return;
        std::memcpy(&n, m->data(), sizeof n);
        if (n.number == 0) by_slot[slot] = static_cast<pid_t>(n.pid);
        CHECK(n.number == next[slot] && m->sequence() == n.number && static_cast<pid_t>(n.pid) == by_slot[slot]);
        next[slot]++;
    }
    CHECK(next[0] == MESSAGES && next[1] == MESSAGES);
    CHECK((by_slot[0] == producers[0] && by_slot[1] == producers[1]) ||
          (by_slot[0] == producers[1] && by_slot[1] == producers[0]));
    expect_peers(in, lf::PeerState::Alive, by_slot);

    // A third producer is refused; meanwhile nothing comes.
    pid_t full = start(self, "full", name, 0, -1);
    for (int i = 0; i < 600 && full != 0; i++) {
        int status = 0;
        if (waitpid(full, &status, WNOHANG) == full) {
            CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
            full = 0;
        } else {
            EXPECT_ERROR(in.recv(lf::nothrow, 50ms), LF_ERR_TIMEOUT, "");
        }
    }
    CHECK(full == 0);
    CHECK(!in.last_gone());

    // Both close: two ends, each naming its slot through last_gone().
    close(go[1]);
    for (pid_t p : producers) CHECK(exited_ok(p));
    EXPECT_ERROR(in.recv(lf::nothrow, WAIT), LF_ERR_PEER_GONE, "slot");
    const std::optional<std::uint32_t> first = in.last_gone();
    CHECK(first && *first < PRODUCERS);
#if LAVA_FLOW_EXCEPTIONS
    try {
        (void)in.recv(WAIT);
        CHECK(!"a message after the producers' ends");
    } catch (const lf::Error& e) {
        CHECK(e.status() == LF_ERR_PEER_GONE);
    }
#else
    EXPECT_ERROR(in.recv(lf::nothrow, WAIT), LF_ERR_PEER_GONE, "slot");
#endif
    CHECK(in.last_gone() && first && *in.last_gone() == 1 - *first);
    expect_peers(in, lf::PeerState::Free, nullptr);
    // A later failure of another kind leaves it as it was.
    EXPECT_ERROR(in.try_recv(lf::nothrow), LF_ERR_WOULD_BLOCK, "");
    CHECK(in.last_gone() && first && *in.last_gone() == 1 - *first);

    // A pair channel's end names no slot.
    const std::string pair = name + ".pair";
    pid_t pair_producer = start(self, "pair", pair, 0, -1);
    auto pair_in = lf::Consumer::create(lf::nothrow, *context, pair, lf::ChannelConfig().rendezvous_timeout(WAIT));
    if (EXPECT_OK(pair_in)) {
        auto m = pair_in->recv(lf::nothrow, WAIT);
        CHECK(m && m->producer() == 0 && m->size() == 4);
        EXPECT_ERROR(pair_in->recv(lf::nothrow, WAIT), LF_ERR_PEER_GONE, "");
        CHECK(!pair_in->last_gone());
        auto peers = pair_in->peers(lf::nothrow);
        CHECK(peers && peers->size() == 1 && (*peers)[0].slot == 0);
    }
    CHECK(exited_ok(pair_producer));
}

static bool dir_is_empty(const char* path) {
    DIR* dir = opendir(path);
    if (dir == nullptr) return false;
    bool empty = true;
    while (dirent* e = readdir(dir))
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) empty = false;
    closedir(dir);
    return empty;
}

int main(int argc, char** argv) {
    if (argc == 4 && std::strcmp(argv[1], "producer") == 0) return run_producer(argv[2], std::strtoull(argv[3], nullptr, 10));
    if (argc >= 3 && std::strcmp(argv[1], "full") == 0) return run_full(argv[2]);
    if (argc >= 3 && std::strcmp(argv[1], "pair") == 0) return run_pair(argv[2]);
    if (argc != 1) {
        std::fprintf(stderr, "usage: %s [producer NAME COUNT | full NAME | pair NAME]\n", argv[0]);
        return 2;
    }
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 1;
    self[n] = '\0';
    // A private runtime dir (mkdtemp makes it 0700), checked empty at the end.
    char dir[] = "/tmp/lf-cpp-fan-in-XXXXXX";
    if (mkdtemp(dir) == nullptr) return 1;
    setenv("LF_RUNTIME_DIR", dir, 1);
    run_consumer(self, "cpp-fan-in-" + std::to_string(getpid()));
    CHECK(dir_is_empty(dir));
    rmdir(dir);
    if (failures == 0) std::printf("test_channel_fan_in_cpp (%s): OK\n", LAVA_FLOW_EXCEPTIONS ? "exceptions" : "no exceptions");
    return failures != 0;
}
