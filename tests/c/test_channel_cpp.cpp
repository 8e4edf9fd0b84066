// Channels through the C++ wrapper (lava_flow.hpp), between two real processes. Built twice:
// test_channel_cpp with exceptions, test_channel_cpp_noexcept with -fno-exceptions, where only
// the lf::nothrow forms exist and Expected::value() of an error aborts with the message.
//
//   test_channel_cpp                 forks: the child is the producer, the parent the consumer
//   test_channel_cpp producer NAME   one role only (run the other in a second process)
//   test_channel_cpp consumer NAME
//
// Channel NAME carries the data (producer -> consumer), NAME.reply the consumer's answers.
// Phases, in order:
//   0. bad input, as Expected errors with status and message: channel names, configs, sends,
//      loans; an empty channel (try_recv: LF_ERR_WOULD_BLOCK, recv: LF_ERR_TIMEOUT).
//   1. send/recv: MESSAGES messages, copy sends and loans (published whole or in part, moved,
//      dropped unpublished, cancelled), each with its sequence number and a checksum; the
//      consumer takes half through the pollable fd, and holds some in a vector for a while.
//   2. Message RAII: a message the consumer holds is not complete for the producer; once the
//      consumer drops it (a moved-to Message going out of scope) it is.
//   3. buffer sends: regions of an lf::Buffer by reference (zero copy), each region rewritten
//      only once its previous message is complete (wait_completed); bytes inside the buffer
//      sent by reference by send(); a short range copied.
//   4. three more messages, through the throwing forms where there are exceptions (errors
//      caught as lf::Error), so that either role of either build works with the other.
//   5. the producer closes: the consumer's recv gives LF_ERR_PEER_GONE.
// Also checks, at compile time, which forms exist in each build, and that Expected::value() of
// an error throws the lf::Error or, without exceptions, aborts printing status and message.
// Prints each failed check and returns non-zero.
#include <lava_flow.hpp>

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

static int failures = 0;

#include "check.h"

#if defined(LF_TEST_NO_EXCEPTIONS) && (defined(__cpp_exceptions) || LAVA_FLOW_EXCEPTIONS)
#error "test_channel_cpp_noexcept must be compiled with -fno-exceptions"
#endif
#if !defined(LF_TEST_NO_EXCEPTIONS) && !LAVA_FLOW_EXCEPTIONS
#error "test_channel_cpp must be compiled with exceptions"
#endif

using namespace std::chrono_literals;

// --- What each build declares -----------------------------------------------------------------

template <typename, typename = void>
struct has_nothrow_send : std::false_type {};
template <typename T>
struct has_nothrow_send<T, std::void_t<decltype(std::declval<T&>().send(lf::nothrow, std::declval<const void*>(), std::size_t{}))>>
    : std::true_type {};
template <typename, typename = void>
struct has_nothrow_recv : std::false_type {};
template <typename T>
struct has_nothrow_recv<T, std::void_t<decltype(std::declval<T&>().recv(lf::nothrow))>> : std::true_type {};
template <typename, typename = void>
struct has_throwing_send : std::false_type {};
template <typename T>
struct has_throwing_send<T, std::void_t<decltype(std::declval<T&>().send(std::declval<const void*>(), std::size_t{}))>>
    : std::true_type {};
template <typename, typename = void>
struct has_throwing_recv : std::false_type {};
template <typename T>
struct has_throwing_recv<T, std::void_t<decltype(std::declval<T&>().recv())>> : std::true_type {};
template <typename, typename = void>
struct has_throwing_detect : std::false_type {};
template <typename T>
struct has_throwing_detect<T, std::void_t<decltype(T::detect())>> : std::true_type {};
template <typename, typename = void>
struct has_throwing_release : std::false_type {};
template <typename T>
struct has_throwing_release<T, std::void_t<decltype(std::declval<T&>().release())>> : std::true_type {};

constexpr bool kExceptions = LAVA_FLOW_EXCEPTIONS != 0;

// Only a producer sends, only a consumer receives.
static_assert(has_nothrow_send<lf::Producer>::value && !has_nothrow_send<lf::Consumer>::value);
static_assert(has_nothrow_recv<lf::Consumer>::value && !has_nothrow_recv<lf::Producer>::value);
// The throwing forms exist exactly when exceptions do.
static_assert(has_throwing_send<lf::Producer>::value == kExceptions);
static_assert(has_throwing_recv<lf::Consumer>::value == kExceptions);
static_assert(has_throwing_detect<lf::Location>::value == kExceptions);
static_assert(has_throwing_release<lf::Message>::value == kExceptions);
static_assert(std::is_constructible_v<lf::Context> == kExceptions);
static_assert(std::is_constructible_v<lf::Producer, const lf::Context&, const std::string&> == kExceptions);
static_assert(std::is_constructible_v<lf::Consumer, const lf::Context&, const std::string&> == kExceptions);
// The non-throwing forms say so.
static_assert(noexcept(std::declval<lf::Producer&>().send(lf::nothrow, nullptr, 0)));
static_assert(noexcept(std::declval<lf::Consumer&>().recv(lf::nothrow)));
static_assert(noexcept(std::declval<lf::Message&>().release(lf::nothrow)));
static_assert(noexcept(std::declval<lf::Message&>().release_on_gpu(lf::nothrow)));
static_assert(noexcept(lf::Location::detect(std::nothrow)));
// Handles, messages and loans are move-only and move without throwing.
static_assert(!std::is_copy_constructible_v<lf::Message> && std::is_nothrow_move_constructible_v<lf::Message>);
static_assert(!std::is_copy_constructible_v<lf::Loan> && std::is_nothrow_move_constructible_v<lf::Loan>);
static_assert(!std::is_copy_constructible_v<lf::Producer> && std::is_nothrow_move_constructible_v<lf::Producer>);
static_assert(!std::is_copy_assignable_v<lf::Consumer> && std::is_nothrow_move_assignable_v<lf::Consumer>);
static_assert(std::is_same_v<lf::Result<int>, lf::Expected<int>>);

// --- Checks -----------------------------------------------------------------------------------

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

// A failure with `status` (both the Expected's and its Error's) whose message holds `needle`.
template <typename T>
static void expect_error(const char* file, int line, const char* what, const lf::Expected<T>& result,
                         lf_status status, const char* needle) {
    if (result.has_value()) {
        std::fprintf(stderr, "%s:%d: %s succeeded, expected %s\n", file, line, what, lf_status_str(status));
        failures++;
    } else if (result.status() != status || result.error().status() != status) {
        std::fprintf(stderr, "%s:%d: %s failed with %s, expected %s (%s)\n", file, line, what,
                     result.error().status_name(), lf_status_str(status), result.error().what());
        failures++;
    } else if (std::strstr(result.error().what(), needle) == nullptr || result.error().message() != result.error().what()) {
        std::fprintf(stderr, "%s:%d: %s: message \"%s\" lacks \"%s\"\n", file, line, what, result.error().what(), needle);
        failures++;
    }
}

// --- Messages ---------------------------------------------------------------------------------

constexpr std::uint64_t MESSAGES = 20000;
constexpr std::size_t REGION = 16384;
constexpr std::uint64_t REGIONS = 4;
constexpr std::uint64_t BUFFER_MESSAGES = 64;
constexpr lf::Timeout WAIT = 30s;

// Message `seq`: 8-byte sequence, 8-byte checksum, payload. Mostly inline sizes, some pool.
static std::size_t size_of(std::uint64_t seq) {
    if (seq % 100 == 0) return 16 + static_cast<std::size_t>(seq * 7919 % 200000);
    return 16 + static_cast<std::size_t>(seq * 13 % 100);
}

// Buffer message `seq`: over 112 bytes, so that it goes by reference.
static std::size_t region_len(std::uint64_t seq) { return 113 + static_cast<std::size_t>(seq * 977 % (REGION - 113)); }

static std::uint64_t checksum(const unsigned char* p, std::size_t n) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (std::size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static void build(void* out, std::uint64_t seq, std::size_t n) {
    auto* buf = static_cast<unsigned char*>(out);
    for (std::size_t i = 16; i < n; i++) buf[i] = static_cast<unsigned char>(seq * 31 + i * 7);
    std::uint64_t sum = checksum(buf + 16, n - 16);
    std::memcpy(buf, &seq, 8);
    std::memcpy(buf + 8, &sum, 8);
}

static bool verify(const lf::Message& m, std::uint64_t seq, std::size_t n) {
    std::uint64_t got_seq = 0, got_sum = 0;
    bool good = m.held() && m.size() == n && m.sequence() == seq && m.end() - m.begin() == static_cast<std::ptrdiff_t>(n);
    if (good) {
        const auto* p = static_cast<const unsigned char*>(m.data());
        std::memcpy(&got_seq, p, 8);
        std::memcpy(&got_sum, p + 8, 8);
        good = got_seq == seq && got_sum == checksum(p + 16, n - 16);
    }
    if (!good)
        std::fprintf(stderr, "message %llu is wrong: held %d, %zu bytes (expected %zu), sequence %llu, its header's %llu\n",
                     static_cast<unsigned long long>(seq), m.held(), m.size(), n,
                     static_cast<unsigned long long>(m.sequence()), static_cast<unsigned long long>(got_seq));
    return good;
}

static lf::ChannelConfig config() {
    return lf::ChannelConfig().wait_strategy(lf::WaitStrategy::SpinThenBlock).spin(20us).capacity(64).rendezvous_timeout(WAIT);
}

static lf::Expected<lf::Context> make_context() {
    lf_context_config c{};
    lf_context_config_init(&c, sizeof c);
    c.gpu_policy = LF_GPU_DISABLED;
    return lf::Context::create(lf::nothrow, &c);
}

// The replies: short strings, NUL included.
static void say(lf::Producer& out, const char* text) { EXPECT_OK(out.send(lf::nothrow, text, std::strlen(text) + 1, WAIT)); }

static bool hear(lf::Consumer& in, const char* text) {
    auto m = in.recv(lf::nothrow, WAIT);
    if (!EXPECT_OK(m)) return false;
    bool same = m->size() == std::strlen(text) + 1 && std::memcmp(m->data(), text, m->size()) == 0;
    if (!same) std::fprintf(stderr, "expected the message \"%s\"\n", text);
    CHECK(same);
    return same;
}

// Bad input at creation, on either side: reported before any rendezvous.
static void bad_creation(const lf::Context& context, const lf::Location& here) {
    EXPECT_ERROR(lf::Producer::create(lf::nothrow, context, "bad name!", here, here, config()),
                 LF_ERR_INVALID_ARGUMENT, "channel name \"bad name!\" contains ' '");
    EXPECT_ERROR(lf::Consumer::create(lf::nothrow, context, std::string(65, 'x'), config()),
                 LF_ERR_INVALID_ARGUMENT, "is 65 bytes long");
    EXPECT_ERROR(lf::Producer::create(lf::nothrow, context, "fine", config().pool_size(0)), LF_ERR_INVALID_ARGUMENT,
                 "pool_size is 0");
    lf::ChannelConfig wrong = config();
    wrong.raw().wait_strategy = static_cast<lf_wait_strategy>(9);  // as a C caller may pass
    EXPECT_ERROR(lf::Consumer::create(lf::nothrow, context, "fine", here, here, wrong), LF_ERR_INVALID_ARGUMENT,
                 "wait_strategy is 9, not an lf_wait_strategy: use LF_WAIT_BUSY_POLL (1)");
}

// --- Producer ---------------------------------------------------------------------------------

// Phase 1: copy sends and loans of every kind, all checked for their sequence numbers.
static void send_messages(lf::Producer& out) {
    std::vector<unsigned char> buf(256 * 1024);
    const int before = failures;
    for (std::uint64_t i = 0; i < MESSAGES && failures < before + 10; i++) {
        const std::size_t n = size_of(i);
        lf::Expected<std::uint64_t> sent = lf::Error(LF_ERR_INTERNAL, "not sent");
        if (i % 2 == 0) {
            build(buf.data(), i, n);
            sent = out.send(lf::nothrow, buf.data(), n, WAIT);
        } else if (i % 1000 == 1) {
            // A loan dropped unpublished is given back: a second loan is refused while one is
            // outstanding, and granted once the first is gone.
            {
                auto dropped = out.loan(lf::nothrow, 64, WAIT);
                EXPECT_OK(dropped);
                EXPECT_ERROR(out.loan(lf::nothrow, 64, WAIT), LF_ERR_INVALID_STATE, "already has a loan outstanding");
                EXPECT_ERROR(out.send(lf::nothrow, buf.data(), 8, WAIT), LF_ERR_INVALID_STATE, "loan outstanding");
            }
            // Cancelled: nothing is sent, and a cancelled loan cannot be published.
            auto cancelled = out.loan(lf::nothrow, 64, WAIT);
            if (EXPECT_OK(cancelled)) {
                EXPECT_OK(cancelled->cancel(lf::nothrow));
                CHECK(!cancelled->active());
                EXPECT_ERROR(cancelled->cancel(lf::nothrow), LF_ERR_INVALID_STATE, "not outstanding");
                EXPECT_ERROR(cancelled->publish(lf::nothrow), LF_ERR_INVALID_STATE, "not outstanding");
            }
            // Moved, then published in part after two refused lengths (the loan stays out).
            auto loan = out.loan(lf::nothrow, n + 40, WAIT);
            if (!EXPECT_OK(loan)) break;
            lf::Loan moved = std::move(*loan);
            CHECK(!loan->active() && moved.active() && moved.size() == n + 40 && moved.data() != nullptr);
            EXPECT_ERROR(moved.publish(lf::nothrow, 0), LF_ERR_INVALID_ARGUMENT, "publishing 0 bytes");
            EXPECT_ERROR(moved.publish(lf::nothrow, n + 41), LF_ERR_INVALID_ARGUMENT, "-byte loan");
            CHECK(moved.active());
            build(moved.data(), i, n);
            sent = moved.publish(lf::nothrow, n);
            CHECK(!moved.active());
            EXPECT_ERROR(moved.publish(lf::nothrow), LF_ERR_INVALID_STATE, "not outstanding");
        } else {
            auto loan = out.loan(lf::nothrow, n, WAIT);
            if (!EXPECT_OK(loan)) break;
            CHECK(loan->size() == n);
            build(loan->data(), i, n);
            sent = loan->publish(lf::nothrow);
        }
        if (EXPECT_OK(sent)) CHECK(*sent == i);
    }
    EXPECT_OK(out.wait_completed(lf::nothrow, MESSAGES - 1, WAIT));
    auto done = out.completed(lf::nothrow);
    CHECK(done && *done == MESSAGES);
    CHECK(out.is_completed(lf::nothrow, MESSAGES - 1).value_or(false));
    CHECK(!out.is_completed(lf::nothrow, MESSAGES).value_or(true));
}

// Phase 2: message `MESSAGES` is held, then dropped by the consumer.
static void watch_release(lf::Producer& out, lf::Consumer& replies) {
    const std::uint64_t held = MESSAGES;
    auto sent = out.send(lf::nothrow, "hold", 5, WAIT);
    CHECK(sent && *sent == held);
    hear(replies, "held");
    CHECK(!out.is_completed(lf::nothrow, held).value_or(true));
    EXPECT_ERROR(out.wait_completed(lf::nothrow, held, 20ms), LF_ERR_TIMEOUT, "");
    say(out, "drop");
    hear(replies, "dropped");
    EXPECT_OK(out.wait_completed(lf::nothrow, held, 10s));
    // The "drop" message is still held by the consumer.
    CHECK(!out.is_completed(lf::nothrow, held + 1).value_or(true));
    say(out, "checked");
    EXPECT_OK(out.wait_completed(lf::nothrow, held + 2, 10s));
}

// Phase 3: buffer sends by reference, regions rewritten only once complete.
static void send_buffers(lf::Producer& out, const lf::Context& context) {
    std::uint64_t seq = MESSAGES + 3;
    auto buffer = context.allocate(lf::nothrow, (REGIONS + 1) * REGION, lf::Memory::CpuStandard);
    if (!EXPECT_OK(buffer)) return;
    auto data = buffer->data(lf::nothrow);
    if (!EXPECT_OK(data)) return;
    auto* base = static_cast<unsigned char*>(*data);
    std::uint64_t sent[REGIONS] = {};
    for (std::uint64_t i = 0; i < BUFFER_MESSAGES; i++, seq++) {
        const std::uint64_t r = i % REGIONS;
        if (i >= REGIONS) EXPECT_OK(out.wait_completed(lf::nothrow, sent[r], WAIT));
        build(base + r * REGION, seq, region_len(seq));
        auto s = out.send_buffer(lf::nothrow, *buffer, r * REGION, region_len(seq), WAIT);
        if (EXPECT_OK(s)) CHECK(*s == seq);
        sent[r] = s.value_or(0);
    }
    // Bytes inside the buffer go by reference by themselves; a short range is copied.
    unsigned char* spare = base + REGIONS * REGION;
    build(spare + 100, seq, 5000);
    auto s = out.send(lf::nothrow, spare + 100, 5000, WAIT);
    CHECK(s && *s == seq++);
    const std::uint64_t last_by_reference = s.value_or(0);
    build(spare + 8000, seq, 100);
    s = out.send_buffer(lf::nothrow, buffer->view(), REGIONS * REGION + 8000, 100, WAIT);
    CHECK(s && *s == seq++);
    // Bad input.
    EXPECT_ERROR(out.send_buffer(lf::nothrow, *buffer, (REGIONS + 1) * REGION - 4, 8), LF_ERR_INVALID_ARGUMENT, "");
    EXPECT_ERROR(out.send_buffer(lf::nothrow, *buffer, 0, 0), LF_ERR_INVALID_ARGUMENT, "at least one byte");
    EXPECT_ERROR(out.send_buffer(lf::nothrow, lf::BufferView(nullptr), 0, 8), LF_ERR_NULL_POINTER, "`buffer`");
    // The buffer may go once every message pointing into it is complete. The short range was
    // copied, so its message is complete at once and says nothing of those before it: wait for
    // the last one sent by reference (the consumer releases in order).
    EXPECT_OK(out.wait_completed(lf::nothrow, last_by_reference, WAIT));
    for (std::uint64_t r = 0; r < REGIONS; r++) CHECK(out.is_completed(lf::nothrow, sent[r]).value_or(false));
}

// Phase 4: three messages (bytes, a loan, a buffer range), through the throwing forms where
// there are exceptions, else through the non-throwing ones; the same messages either way, so
// that a producer and a consumer of the two builds work together.
static void send_last(lf::Producer& out, const lf::Context& context) {
    std::uint64_t seq = MESSAGES + 3 + BUFFER_MESSAGES + 2;
#if LAVA_FLOW_EXCEPTIONS
    try {
        lf::Producer bad(context, "bad name!");
        CHECK(!"a bad channel name was accepted");
    } catch (const lf::Error& e) {
        CHECK(e.status() == LF_ERR_INVALID_ARGUMENT && std::strstr(e.what(), "channel name") != nullptr);
    }
    try {
        out.send(nullptr, 8);
        CHECK(!"NULL data was accepted");
    } catch (const lf::Error& e) {
        CHECK(e.status() == LF_ERR_NULL_POINTER && std::strstr(e.what(), "`data`") != nullptr);
    }
    try {
        CHECK(out.send("phase 4", 8, WAIT) == seq++);
        lf::Loan loan = out.loan(32, WAIT);
        std::memset(loan.data(), 'L', 32);
        CHECK(loan.publish() == seq++);
        try {
            loan.publish();
            CHECK(!"a loan was published twice");
        } catch (const lf::Error& e) {
            CHECK(e.status() == LF_ERR_INVALID_STATE);
        }
        lf::Buffer buffer = context.allocate(8192);
        std::memset(buffer.data(), 'B', 8192);
        const std::uint64_t s = out.send_buffer(buffer, 0, 4096, WAIT);
        CHECK(s == seq++);
        out.wait_completed(s, WAIT);
        CHECK(out.is_completed(s) && out.completed() == seq);
        CHECK(out.transport().name == "shm");
    } catch (const lf::Error& e) {
        std::fprintf(stderr, "producer: unexpected lf::Error %s: %s\n", e.status_name(), e.what());
        failures++;
    }
#else
    auto sent = out.send(lf::nothrow, "phase 4", 8, WAIT);
    CHECK(sent && *sent == seq++);
    auto loan = out.loan(lf::nothrow, 32, WAIT);
    if (!EXPECT_OK(loan)) return;
    std::memset(loan->data(), 'L', 32);
    sent = loan->publish(lf::nothrow);
    CHECK(sent && *sent == seq++);
    auto buffer = context.allocate(lf::nothrow, 8192);
    if (!EXPECT_OK(buffer)) return;
    std::memset(buffer->data(lf::nothrow).value_or(nullptr), 'B', 8192);
    sent = out.send_buffer(lf::nothrow, *buffer, 0, 4096, WAIT);
    CHECK(sent && *sent == seq++);
    EXPECT_OK(out.wait_completed(lf::nothrow, sent.value_or(0), WAIT));
    CHECK(out.completed(lf::nothrow).value_or(0) == seq);
#endif
}

static int run_producer(const std::string& name) {
    auto context = make_context();
    auto here = lf::Location::detect(lf::nothrow);
    if (!EXPECT_OK(context) || !EXPECT_OK(here)) return 1;
    bad_creation(*context, *here);

    auto created = lf::Producer::create(lf::nothrow, *context, name, *here, *here, config());
    if (!EXPECT_OK(created)) return 1;
    lf::Producer out = std::move(*created);
    auto replies = lf::Consumer::create(lf::nothrow, *context, name + ".reply", config());
    if (!EXPECT_OK(replies)) return 1;

    // Phase 0: the transport report, bad input, then the consumer's empty-channel checks.
    auto transport = out.transport(lf::nothrow);
    if (EXPECT_OK(transport)) {
        CHECK(transport->name == "shm");
        CHECK(transport->reason.find("scope local") != std::string::npos);
    }
    EXPECT_ERROR(out.ready_semaphore(lf::nothrow), LF_ERR_UNSUPPORTED, "");
    EXPECT_ERROR(out.send(lf::nothrow, nullptr, 8), LF_ERR_NULL_POINTER, "`data`");
    EXPECT_ERROR(out.send(lf::nothrow, "x", 0), LF_ERR_INVALID_ARGUMENT, "");
    EXPECT_ERROR(out.loan(lf::nothrow, 0), LF_ERR_INVALID_ARGUMENT, "len is 0");
    hear(*replies, "ready");

    send_messages(out);
    watch_release(out, *replies);
    send_buffers(out, *context);
    send_last(out, *context);
    hear(*replies, "done");
    return failures != 0;
}

// --- Consumer ---------------------------------------------------------------------------------

static void receive_messages(lf::Consumer& in) {
    std::uint64_t seq = 0;
    const int before = failures;
    // The first half through the pollable fd.
    auto fd = in.fd(lf::nothrow);
    if (!EXPECT_OK(fd)) return;
    while (seq < MESSAGES / 2 && failures == before) {
        pollfd p{};
        p.fd = *fd;
        p.events = POLLIN;
        CHECK(poll(&p, 1, 30000) == 1);
        for (;;) {
            auto m = in.try_recv(lf::nothrow);
            if (m.status() == LF_ERR_WOULD_BLOCK) break;
            if (!EXPECT_OK(m)) break;
            CHECK(verify(*m, seq, size_of(seq)) && m->flags() == 0);
            seq++;
        }  // each message released as it goes out of scope
    }
    // The rest with blocking receives, some released explicitly, some held for a while.
    std::vector<lf::Message> held;
    while (seq < MESSAGES && failures == before) {
        auto m = in.recv(lf::nothrow, WAIT);
        if (!EXPECT_OK(m)) return;
        CHECK(verify(*m, seq, size_of(seq)));
        if (seq % 3 == 0) {
            EXPECT_OK(m->release(lf::nothrow));
            CHECK(!m->held() && m->data() == nullptr && m->size() == 0);
            EXPECT_ERROR(m->release(lf::nothrow), LF_ERR_INVALID_STATE, "not held");
            EXPECT_ERROR(m->release_on_gpu(lf::nothrow), LF_ERR_INVALID_STATE, "not held");
        } else if (seq % 3 == 1) {
            held.push_back(std::move(*m));
            CHECK(!m->held());
            if (held.size() == 16) held.clear();
        }
        seq++;
    }
}

static void hold_and_drop(lf::Consumer& in, lf::Producer& replies) {
    auto m = in.recv(lf::nothrow, WAIT);
    if (!EXPECT_OK(m)) return;
    CHECK(m->sequence() == MESSAGES && m->size() == 5 && std::memcmp(m->data(), "hold", 5) == 0);
    EXPECT_ERROR(m->buffer(lf::nothrow), LF_ERR_INVALID_STATE, "carries no GPU buffer");
    say(replies, "held");
    auto drop = in.recv(lf::nothrow, WAIT);
    if (!EXPECT_OK(drop)) return;
    {
        lf::Message moved = std::move(*m);
        CHECK(moved.held() && !m->held());
    }  // released here
    say(replies, "dropped");
    hear(in, "checked");
}

static void receive_buffers(lf::Consumer& in) {
    std::uint64_t seq = MESSAGES + 3;
    for (std::uint64_t i = 0; i < BUFFER_MESSAGES; i++, seq++) {
        auto m = in.recv(lf::nothrow, WAIT);
        if (!EXPECT_OK(m)) return;
        CHECK(verify(*m, seq, region_len(seq)));
        CHECK(m->zero_copy() && !m->gpu() && m->flags() == LF_MESSAGE_ZERO_COPY);
    }
    auto m = in.recv(lf::nothrow, WAIT);
    if (!EXPECT_OK(m)) return;
    CHECK(verify(*m, seq++, 5000) && m->zero_copy());
    EXPECT_ERROR(m->buffer(lf::nothrow), LF_ERR_INVALID_STATE, "carries no GPU buffer");
    CHECK(!m->cuda());
    EXPECT_ERROR(m->cuda_ptr(lf::nothrow), LF_ERR_INVALID_STATE, "not CUDA memory");
    m = in.recv(lf::nothrow, WAIT);  // the previous message is released by the assignment
    if (!EXPECT_OK(m)) return;
    CHECK(verify(*m, seq, 100) && m->flags() == 0);
}

// Phase 4 (see send_last), through the throwing forms where there are exceptions.
static void receive_last(lf::Consumer& in) {
#if LAVA_FLOW_EXCEPTIONS
    try {
        lf::Message m = in.recv(WAIT);
        CHECK(m.size() == 8 && std::strcmp(static_cast<const char*>(m.data()), "phase 4") == 0);
        m.release();
        try {
            m.release();
            CHECK(!"a message was released twice");
        } catch (const lf::Error& e) {
            CHECK(e.status() == LF_ERR_INVALID_STATE && std::strstr(e.what(), "not held") != nullptr);
        }
        m = in.recv(WAIT);
        CHECK(m.size() == 32 && static_cast<const char*>(m.data())[31] == 'L' && m.flags() == 0);
        m = in.recv(WAIT);
        CHECK(m.size() == 4096 && m.zero_copy() && static_cast<const char*>(m.data())[4095] == 'B');
        CHECK(in.transport().name == "shm");
    } catch (const lf::Error& e) {
        std::fprintf(stderr, "consumer: unexpected lf::Error %s: %s\n", e.status_name(), e.what());
        failures++;
    }
#else
    auto m = in.recv(lf::nothrow, WAIT);
    if (!EXPECT_OK(m)) return;
    CHECK(m->size() == 8 && std::strcmp(static_cast<const char*>(m->data()), "phase 4") == 0);
    m = in.recv(lf::nothrow, WAIT);
    if (!EXPECT_OK(m)) return;
    CHECK(m->size() == 32 && static_cast<const char*>(m->data())[31] == 'L' && m->flags() == 0);
    m = in.recv(lf::nothrow, WAIT);
    if (!EXPECT_OK(m)) return;
    CHECK(m->size() == 4096 && m->zero_copy() && static_cast<const char*>(m->data())[4095] == 'B');
#endif
}

static int run_consumer(const std::string& name) {
    auto context = make_context();
    auto here = lf::Location::detect(lf::nothrow);
    if (!EXPECT_OK(context) || !EXPECT_OK(here)) return 1;
    bad_creation(*context, *here);

    auto in = lf::Consumer::create(lf::nothrow, *context, name, *here, *here, config());
    if (!EXPECT_OK(in)) return 1;
    auto replies = lf::Producer::create(lf::nothrow, *context, name + ".reply", config());
    if (!EXPECT_OK(replies)) return 1;

    // Phase 0: nothing is sent before "ready".
    auto transport = in->transport(lf::nothrow);
    CHECK(transport && transport->name == "shm");
    EXPECT_ERROR(in->try_recv(lf::nothrow), LF_ERR_WOULD_BLOCK, "");
    EXPECT_ERROR(in->recv(lf::nothrow, 10ms), LF_ERR_TIMEOUT, "");
    lf::Message empty;
    CHECK(!empty.held() && empty.size() == 0);
    EXPECT_ERROR(empty.release(lf::nothrow), LF_ERR_INVALID_STATE, "not held");
    say(*replies, "ready");

    receive_messages(*in);
    hold_and_drop(*in, *replies);
    receive_buffers(*in);
    receive_last(*in);
    say(*replies, "done");
    // Phase 5: the producer closes once it has heard "done".
    EXPECT_ERROR(in->recv(lf::nothrow, WAIT), LF_ERR_PEER_GONE, "");
    return failures != 0;
}

// --- Expected::value() of an error --------------------------------------------------------------

static void value_of_error() {
    auto bad = lf::Location::create(lf::nothrow, "");
    EXPECT_ERROR(bad, LF_ERR_INVALID_ARGUMENT, "hostname is empty");
    CHECK(bad.error().message() == lf_last_error_message());
    auto good = lf::Location::create(lf::nothrow, "node-a", 3u);
    CHECK(good && good.status() == LF_OK && good.error().status() == LF_OK);
    CHECK(good && good->node_id(lf::nothrow).value_or(std::nullopt) == 3u);
    lf::Expected<void> fine;
    CHECK(fine && fine.status() == LF_OK);
#if LAVA_FLOW_EXCEPTIONS
    try {
        (void)bad.value();
        CHECK(!"value() of an error returned");
    } catch (const lf::Error& e) {
        CHECK(e.status() == LF_ERR_INVALID_ARGUMENT && std::strcmp(e.what(), bad.error().what()) == 0);
    }
    try {
        lf::Location::create("");
        CHECK(!"the throwing form accepted an empty hostname");
    } catch (const lf::Error& e) {
        CHECK(e.status() == LF_ERR_INVALID_ARGUMENT && std::strstr(e.what(), "hostname is empty") != nullptr);
    }
#else
    // Without exceptions value() of an error prints the status and message, and aborts.
    int pipefd[2];
    CHECK(pipe(pipefd) == 0);
    std::fflush(nullptr);
    pid_t child = fork();
    if (child == 0) {
        dup2(pipefd[1], 2);
        close(pipefd[0]);
        close(pipefd[1]);
        (void)bad.value();
        _exit(0);
    }
    close(pipefd[1]);
    std::string said;
    char chunk[512];
    for (ssize_t n; (n = read(pipefd[0], chunk, sizeof chunk)) > 0;) said.append(chunk, static_cast<std::size_t>(n));
    close(pipefd[0]);
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    CHECK(said.find("lava-flow: LF_ERR_INVALID_ARGUMENT") != std::string::npos);
    CHECK(said.find("hostname is empty") != std::string::npos);
#endif
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
    const char* mode = kExceptions ? "exceptions" : "no exceptions";
    if (argc == 3 && std::strcmp(argv[1], "producer") == 0) return run_producer(argv[2]);
    if (argc == 3 && std::strcmp(argv[1], "consumer") == 0) return run_consumer(argv[2]);
    if (argc != 1) {
        std::fprintf(stderr, "usage: %s [producer|consumer NAME]\n", argv[0]);
        return 2;
    }
    value_of_error();
    // A private runtime dir (mkdtemp makes it 0700), checked empty at the end.
    char dir[] = "/tmp/lf-cpp-channel-XXXXXX";
    if (mkdtemp(dir) == nullptr) return 1;
    setenv("LF_RUNTIME_DIR", dir, 1);
    const std::string name = "cpp-test-" + std::to_string(getpid());
    std::fflush(nullptr);
    pid_t child = fork();
    if (child == 0) _exit(run_producer(name));
    CHECK(child > 0);
    if (run_consumer(name) != 0) std::fprintf(stderr, "consumer failed\n");
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(dir_is_empty(dir));
    rmdir(dir);
    if (failures == 0) std::printf("test_channel_cpp (%s): OK\n", mode);
    return failures != 0;
}
