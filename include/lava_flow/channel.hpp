// lava-flow C++17 wrapper, channels: lf::ChannelConfig, lf::Producer and lf::Consumer,
// their lf::Loan and lf::Message, lf::Peer and lf::Transport.
// One part of lava_flow.hpp, which includes them all and says how the wrapper works: include
// that.
#ifndef LAVA_FLOW_CHANNEL_HPP
#define LAVA_FLOW_CHANNEL_HPP

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "error.hpp"
#include "location.hpp"
#include "memory.hpp"

namespace lf {

/// Waits: a duration, or `lf::forever`. Zero fails at once (LF_ERR_WOULD_BLOCK) where a wait
/// would be needed.
using Timeout = std::chrono::nanoseconds;
inline constexpr Timeout forever{-1};

/// How a channel end waits: the `LF_WAIT_*` values.
enum class WaitStrategy : std::uint32_t {
    BusyPoll = LF_WAIT_BUSY_POLL,
    SpinThenBlock = LF_WAIT_SPIN_THEN_BLOCK,
    Block = LF_WAIT_BLOCK,
};

/// How many processes share a channel: the `LF_CHANNEL_*` values. Every end names the same.
enum class ChannelKind : std::uint32_t {
    /// One producer, one consumer. The default.
    Pair = LF_CHANNEL_PAIR,
    /// Up to `max_peers` producers, one consumer: order and exactly-once per producer, the
    /// producers served in turn; Message::producer says whose a message is.
    FanIn = LF_CHANNEL_FAN_IN,
    /// One producer, up to `max_peers` consumers: each message to every consumer attached when
    /// it was sent, a buffer by reference shared by all and complete once every one of them
    /// released it; Producer::peers lists the consumers.
    FanOut = LF_CHANNEL_FAN_OUT,
};

/// Channel options: lf_channel_config_init's values (spin-then-block, 256 messages, a 16 MiB
/// pool, a 10 s rendezvous, a pair of 8 peers at most), to change with the setters, which chain:
/// `lf::ChannelConfig().capacity(64).pool_size(8 << 20)`.
class ChannelConfig {
public:
    ChannelConfig() noexcept { lf_channel_config_init(&raw_, sizeof raw_); }

    ChannelConfig& wait_strategy(WaitStrategy strategy) noexcept {
        raw_.wait_strategy = static_cast<lf_wait_strategy>(strategy);
        return *this;
    }
    /// Spin time before sleeping, for WaitStrategy::SpinThenBlock.
    ChannelConfig& spin(Timeout time) noexcept {
        raw_.spin_ns = time.count() < 0 ? 0 : static_cast<std::uint64_t>(time.count());
        return *this;
    }
    /// Messages in flight at most, a power of two (the producer's value rules).
    ChannelConfig& capacity(std::uint32_t messages) noexcept {
        raw_.capacity = messages;
        return *this;
    }
    /// The shared payload pool in bytes, also the largest message (the producer's value rules).
    ChannelConfig& pool_size(std::uint64_t bytes) noexcept {
        raw_.pool_size = bytes;
        return *this;
    }
    /// How long creating an end waits for the other; `lf::forever` for ever.
    ChannelConfig& rendezvous_timeout(Timeout time) noexcept {
        raw_.rendezvous_timeout_ns = time.count();
        return *this;
    }
    /// Whether `send` of bytes inside a lava-flow buffer sends them by reference (the default).
    ChannelConfig& auto_zero_copy(bool on) noexcept {
        raw_.auto_zero_copy = on ? 1 : 0;
        return *this;
    }
    /// Fail creation where GPU buffers could not go by reference with GPU-side synchronisation.
    ChannelConfig& strict_gpu(bool on) noexcept {
        raw_.strict_gpu = on ? 1 : 0;
        return *this;
    }
    /// The consumer signals the released semaphore (Producer::released_semaphore).
    ChannelConfig& released_semaphore(bool on) noexcept {
        raw_.released_semaphore = on ? 1 : 0;
        return *this;
    }
    /// Fault the shared pool in when the channel is made (the default).
    ChannelConfig& prefault(bool on) noexcept {
        raw_.prefault = on ? 1 : 0;
        return *this;
    }
    /// A pair (the default), a fan-in or a fan-out; every end of a channel names the same.
    ChannelConfig& kind(ChannelKind kind) noexcept {
        raw_.kind = static_cast<lf_channel_kind>(kind);
        return *this;
    }
    /// A fan-in's most producers (the consumer's value rules), or a fan-out's most consumers:
    /// 1 to LF_MAX_PEERS (64); 8 by default. A pair ignores it.
    ChannelConfig& max_peers(std::uint32_t peers) noexcept {
        raw_.max_peers = peers;
        return *this;
    }
    /// Fan-out only: a consumer that keeps the producer waiting for room longer than this is
    /// detached; `lf::forever` (the default) lets a slow consumer hold the producer back. Set
    /// on another kind, creating an end fails with LF_ERR_INVALID_ARGUMENT.
    ChannelConfig& slow_consumer_timeout(Timeout time) noexcept {
        raw_.slow_consumer_timeout_ns = time.count();
        return *this;
    }

    const lf_channel_config& raw() const noexcept { return raw_; }
    lf_channel_config& raw() noexcept { return raw_; }

private:
    lf_channel_config raw_{};
};

/// What a channel end reports on its transports: their name ("shm", "shm+vulkan_ipc") and the
/// reason for each route.
struct Transport {
    std::string name;
    std::string reason;
};

/// Whether a slot at the other end of a channel has a process: the `LF_PEER_*` values.
enum class PeerState : std::uint32_t {
    /// Nobody holds the slot: a new peer may take it.
    Free = LF_PEER_FREE,
    /// The peer is attached.
    Alive = LF_PEER_ALIVE,
    /// The peer closed its end or died; its last messages may still wait (the slot is free
    /// once its LF_ERR_PEER_GONE has been returned).
    Gone = LF_PEER_GONE,
};

/// One slot at the other end of a channel (`peers()` of either end).
struct Peer {
    /// 0 on a pair channel; 0 to `max_peers - 1` for a fan-in's producers (Message::producer) and
    /// a fan-out's consumers (on a fan-out consumer, its producer under this consumer's slot).
    std::uint32_t slot = 0;
    PeerState state = PeerState::Free;
    /// The peer's process id on its host; 0 for a free slot or a peer on another host.
    std::uint32_t pid = 0;
    /// The peer's MPI rank where MPI reaches it.
    std::optional<std::int32_t> rank;
    /// The peer's host (empty for a free slot).
    std::string host;
    /// The transport its messages take ("shm", "mpi"); empty for a free slot.
    std::string route;
};

/// Room in the channel's shared memory lent by Producer::loan: write up to `size()` bytes at
/// `data()`, then `publish`. A loan neither published nor cancelled is given back by its
/// destructor. Move-only; must not outlive its Producer.
class Loan {
public:
    Loan() noexcept = default;
    Loan(Loan&& other) noexcept : channel_(std::exchange(other.channel_, nullptr)), raw_(std::exchange(other.raw_, {})) {}
    Loan& operator=(Loan&& other) noexcept {
        if (this != &other) {
            give_back();
            channel_ = std::exchange(other.channel_, nullptr);
            raw_ = std::exchange(other.raw_, {});
        }
        return *this;
    }
    Loan(const Loan&) = delete;
    Loan& operator=(const Loan&) = delete;
    ~Loan() { give_back(); }

    void* data() const noexcept { return raw_.data; }
    std::size_t size() const noexcept { return raw_.len; }
    /// Whether the loan is still outstanding (not published, cancelled or moved from).
    bool active() const noexcept { return channel_ != nullptr; }

    /// Publishes the first `size` bytes (1 to `size()`) as the next message: its sequence
    /// number. On failure the loan stays outstanding.
    Expected<std::uint64_t> publish(nothrow_t, std::size_t size) noexcept {
        if (channel_ == nullptr) return inactive();
        std::uint64_t sequence = 0;
        if (lf_status s = lf_publish(channel_, &raw_, size, &sequence); s != LF_OK) return detail::failure(s);
        channel_ = nullptr;
        raw_ = {};
        return sequence;
    }
    /// Publishes the whole loan.
    Expected<std::uint64_t> publish(nothrow_t) noexcept { return publish(nothrow, raw_.len); }
    /// Gives the loan back: nothing is sent.
    Expected<void> cancel(nothrow_t) noexcept {
        if (channel_ == nullptr) return inactive();
        lf_status s = lf_loan_cancel(channel_, &raw_);
        channel_ = nullptr;
        raw_ = {};
        return detail::done(s);
    }

#if LAVA_FLOW_EXCEPTIONS
    std::uint64_t publish(std::size_t size) { return publish(nothrow, size).value(); }
    std::uint64_t publish() { return publish(nothrow).value(); }
    void cancel() { cancel(nothrow).value(); }
#endif

    const lf_loan_region& raw() const noexcept { return raw_; }

private:
    friend class Producer;
    Loan(lf_channel* channel, const lf_loan_region& raw) noexcept : channel_(channel), raw_(raw) {}
    static Error inactive() {
        return Error(LF_ERR_INVALID_STATE, "this loan is not outstanding (already published, cancelled or moved from)");
    }
    void give_back() noexcept {
        if (channel_ != nullptr) (void)lf_loan_cancel(channel_, &raw_);
        channel_ = nullptr;
    }
    lf_channel* channel_ = nullptr;
    lf_loan_region raw_{};
};

/// Where a received message of CUDA memory lies in this process: its CUDA device address, and
/// this process's ordinal of the device that holds it.
struct CudaPointer {
    std::uint64_t address = 0;
    int device = 0;
};

/// A received message: `size()` bytes at `data()`, a view into shared memory (or the producer's
/// own buffer) readable until the message is released, by `release` or by the destructor.
/// Move-only; must not outlive its Consumer. Released and moved-from messages are empty.
class Message {
public:
    Message() noexcept = default;
    Message(Message&& other) noexcept : channel_(std::exchange(other.channel_, nullptr)), raw_(std::exchange(other.raw_, {})) {}
    Message& operator=(Message&& other) noexcept {
        if (this != &other) {
            let_go();
            channel_ = std::exchange(other.channel_, nullptr);
            raw_ = std::exchange(other.raw_, {});
        }
        return *this;
    }
    Message(const Message&) = delete;
    Message& operator=(const Message&) = delete;
    ~Message() { let_go(); }

    const void* data() const noexcept { return raw_.data; }
    std::size_t size() const noexcept { return raw_.len; }
    const std::byte* begin() const noexcept { return static_cast<const std::byte*>(raw_.data); }
    const std::byte* end() const noexcept { return begin() + raw_.len; }
    /// The message's sequence number (0, 1, 2, ... per producer).
    std::uint64_t sequence() const noexcept { return raw_.sequence; }
    /// The slot of the fan-in producer that sent it (see Consumer::peers); 0 on a pair channel
    /// and a fan-out.
    std::uint32_t producer() const noexcept { return raw_.producer; }
    /// LF_MESSAGE_ZERO_COPY, LF_MESSAGE_GPU (with LF_MESSAGE_CUDA), or 0.
    std::uint32_t flags() const noexcept { return raw_.flags; }
    /// The bytes lie in the producer's own buffer: nothing was copied.
    bool zero_copy() const noexcept { return (raw_.flags & LF_MESSAGE_ZERO_COPY) != 0; }
    /// The payload is GPU memory of the producer's: `buffer()` lends it.
    bool gpu() const noexcept { return (raw_.flags & LF_MESSAGE_GPU) != 0; }
    /// The payload is CUDA device memory of the producer's: `cuda_ptr()` gives its address;
    /// `data()` is null.
    bool cuda() const noexcept { return (raw_.flags & LF_MESSAGE_CUDA) != 0; }
    /// For GPU messages, the ready semaphore's value at which the payload is in place (0: now).
    std::uint64_t ready_value() const noexcept { return raw_.ready_value; }
    /// Whether the message is still held (not released or moved from).
    bool held() const noexcept { return channel_ != nullptr; }

    /// The GPU buffer a GPU message carries, lent until the message is released.
    Expected<BufferView> buffer(nothrow_t) const noexcept {
        if (channel_ == nullptr) return not_held();
        const lf_buffer* out = nullptr;
        if (lf_status s = lf_message_buffer(channel_, &raw_, &out); s != LF_OK) return detail::failure(s);
        return BufferView(out);
    }
    /// A CUDA message's device address in this process (a CUdeviceptr) and this process's
    /// ordinal of the device that holds it, valid until the message is released.
    Expected<CudaPointer> cuda_ptr(nothrow_t) const noexcept {
        if (channel_ == nullptr) return not_held();
        CudaPointer out{};
        if (lf_status s = lf_message_cuda_ptr(channel_, &raw_, &out.address, &out.device); s != LF_OK) {
            return detail::failure(s);
        }
        return out;
    }
    /// Gives the message back now and leaves the producer's released semaphore to this
    /// process's GPU work (lf_release_on_gpu): the value to signal on the stream after the work
    /// that reads the buffer (0: none is due yet). Refused, and the message still held, where
    /// the channel shares no released semaphore or is a fan-in.
    Expected<std::uint64_t> release_on_gpu(nothrow_t) noexcept {
        if (channel_ == nullptr) return not_held();
        std::uint64_t value = 0;
        if (lf_status s = lf_release_on_gpu(channel_, &raw_, &value); s != LF_OK) return detail::failure(s);
        channel_ = nullptr;
        raw_ = {};
        return value;
    }
    /// Gives the message's memory back to the producer now, which sees it complete.
    Expected<void> release(nothrow_t) noexcept {
        if (channel_ == nullptr) return not_held();
        lf_status s = lf_release(channel_, &raw_);
        channel_ = nullptr;
        raw_ = {};
        return detail::done(s);
    }

#if LAVA_FLOW_EXCEPTIONS
    BufferView buffer() const { return buffer(nothrow).value(); }
    CudaPointer cuda_ptr() const { return cuda_ptr(nothrow).value(); }
    std::uint64_t release_on_gpu() { return release_on_gpu(nothrow).value(); }
    void release() { release(nothrow).value(); }
#endif

    const lf_message& raw() const noexcept { return raw_; }

private:
    friend class Consumer;
    Message(lf_channel* channel, const lf_message& raw) noexcept : channel_(channel), raw_(raw) {}
    static Error not_held() {
        return Error(LF_ERR_INVALID_STATE, "this message is not held (already released, or moved from)");
    }
    void let_go() noexcept {
        if (channel_ != nullptr) (void)lf_release(channel_, &raw_);
        channel_ = nullptr;
    }
    lf_channel* channel_ = nullptr;
    lf_message raw_{};
};

namespace detail {

/// What both ends of a channel have: the handle, the transport report, the ready semaphore.
class ChannelEnd {
public:
    Expected<Transport> transport(nothrow_t) const noexcept {
        const char* name = nullptr;
        const char* reason = nullptr;
        if (lf_status s = lf_channel_transport(get(), &name, &reason); s != LF_OK) return failure(s);
        return Transport{name, reason};
    }
    /// A new fd of the channel's ready semaphore (owned by the caller), for GPU work: see
    /// lf_channel_ready_semaphore. LF_ERR_UNSUPPORTED where the channel has none.
    Expected<int> ready_semaphore(nothrow_t) noexcept {
        int fd = -1;
        if (lf_status s = lf_channel_ready_semaphore(get(), &fd); s != LF_OK) return failure(s);
        return fd;
    }
    /// A new fd of the released semaphore (owned by the caller): see
    /// lf_channel_released_semaphore. A producer's GPU work waits on it; a consumer that
    /// releases with Message::release_on_gpu signals it. Needs ChannelConfig::released_semaphore
    /// at the producer.
    Expected<int> released_semaphore(nothrow_t) noexcept {
        int fd = -1;
        if (lf_status s = lf_channel_released_semaphore(get(), &fd); s != LF_OK) return failure(s);
        return fd;
    }

    /// The processes at the other end, slot by slot: a consumer's producers (a pair channel's
    /// one, or each of a fan-in's `max_peers` slots: free, alive, or gone with messages still to
    /// read); a producer's consumers (each of a fan-out's `max_peers` slots, or a pair channel's
    /// one, whose pid is 0).
    Expected<std::vector<Peer>> peers(nothrow_t) const noexcept {
        std::unique_ptr<lf_peer[]> raw(new (std::nothrow) lf_peer[LF_MAX_PEERS]);
        if (!raw) return Error(LF_ERR_OUT_OF_MEMORY, "no memory for the list of a channel's peers");
        std::size_t count = 0;
        if (lf_status s = lf_channel_peers(get(), raw.get(), sizeof(lf_peer), LF_MAX_PEERS, &count); s != LF_OK)
            return failure(s);
        std::vector<Peer> out;
        out.reserve(count);
        for (std::size_t i = 0; i < count && i < LF_MAX_PEERS; i++) {
            const lf_peer& p = raw[i];
            Peer peer;
            peer.slot = p.slot;
            peer.state = static_cast<PeerState>(p.state);
            peer.pid = p.pid;
            if (p.rank >= 0) peer.rank = p.rank;
            peer.host = detail::bounded_string(p.host);
            peer.route = detail::bounded_string(p.route);
            out.push_back(std::move(peer));
        }
        return out;
    }
#if LAVA_FLOW_EXCEPTIONS
    Transport transport() const { return transport(nothrow).value(); }
    int ready_semaphore() { return ready_semaphore(nothrow).value(); }
    int released_semaphore() { return released_semaphore(nothrow).value(); }
    std::vector<Peer> peers() const { return peers(nothrow).value(); }
#endif

    lf_channel* get() const noexcept { return handle_.get(); }

protected:
    ChannelEnd() noexcept = default;
    explicit ChannelEnd(lf_channel* raw) noexcept : handle_(raw) {}
    ChannelEnd(ChannelEnd&&) noexcept = default;
    ChannelEnd& operator=(ChannelEnd&&) noexcept = default;
    ~ChannelEnd() = default;

    /// Opens one end: between `mine` and `peer`, or (without them) with a peer on this host.
    static Expected<lf_channel*> open(const lf_context* context, const std::string& name, lf_role role,
                                      const Location* mine, const Location* peer,
                                      const ChannelConfig& config) noexcept {
        std::optional<Location> here;
        if (mine == nullptr) {
            auto detected = Location::detect(nothrow);
            if (!detected) return detected.error();
            here.emplace(std::move(*detected));
            mine = peer = &*here;
        }
        lf_channel* raw = nullptr;
        if (lf_status s = lf_channel_create(context, name.c_str(), role, mine->get(), peer->get(), &config.raw(), &raw);
            s != LF_OK)
            return failure(s);
        return raw;
    }

private:
    Owned<lf_channel, lf_channel_free> handle_;
};

}  // namespace detail

/// The sending end of channel `name`. Either end may be created first; creation waits for the
/// other (up to the config's rendezvous timeout). Move-only; closing it (the destructor) lets
/// the consumer read what was sent, then see LF_ERR_PEER_GONE. A fan-in's producer takes the
/// lowest free slot; creating one of a fan-in whose `max_peers` slots are all taken fails with
/// LF_ERR_INVALID_STATE. A fan-out's producer waits so for its first consumer; the others attach
/// any time and receive from its next send on.
class Producer : public detail::ChannelEnd {
public:
    /// The end between this process (`mine`) and the consumer's process (`peer`): the scope
    /// between them picks the transport.
    static Expected<Producer> create(nothrow_t, const Context& context, const std::string& name,
                                     const Location& mine, const Location& peer,
                                     const ChannelConfig& config = ChannelConfig()) noexcept {
        auto raw = open(context.get(), name, LF_ROLE_PRODUCER, &mine, &peer, config);
        if (!raw) return raw.error();
        return Producer(*raw);
    }
    /// The end for a consumer on this host.
    static Expected<Producer> create(nothrow_t, const Context& context, const std::string& name,
                                     const ChannelConfig& config = ChannelConfig()) noexcept {
        auto raw = open(context.get(), name, LF_ROLE_PRODUCER, nullptr, nullptr, config);
        if (!raw) return raw.error();
        return Producer(*raw);
    }

    /// Copies `size` bytes at `data` into the channel as the next message (by reference when
    /// they lie inside a lava-flow buffer of the context, over 112 bytes: then they must not be
    /// rewritten until the message is complete), waiting for room up to `timeout`. Returns the
    /// message's sequence number.
    Expected<std::uint64_t> send(nothrow_t, const void* data, std::size_t size, Timeout timeout = forever) noexcept {
        std::uint64_t sequence = 0;
        if (lf_status s = lf_send(get(), data, size, timeout.count(), &sequence); s != LF_OK) return detail::failure(s);
        return sequence;
    }
    /// As `send`, but LF_ERR_WOULD_BLOCK at once when the channel is full.
    Expected<std::uint64_t> try_send(nothrow_t, const void* data, std::size_t size) noexcept {
        std::uint64_t sequence = 0;
        if (lf_status s = lf_try_send(get(), data, size, &sequence); s != LF_OK) return detail::failure(s);
        return sequence;
    }
    /// Sends `size` bytes at `offset` of `buffer` by reference: the range must not be rewritten
    /// or freed until the message is complete (`wait_completed` on the returned sequence
    /// number). GPU buffers go through the channel's GPU route (see `transport`). A CPU range of
    /// at most 112 bytes is copied instead: its message is complete at once, which says nothing
    /// of the messages before it.
    Expected<std::uint64_t> send_buffer(nothrow_t, BufferView buffer, std::size_t offset, std::size_t size,
                                        Timeout timeout = forever) noexcept {
        std::uint64_t sequence = 0;
        if (lf_status s = lf_send_buffer(get(), buffer.get(), offset, size, timeout.count(), &sequence); s != LF_OK)
            return detail::failure(s);
        return sequence;
    }
    /// As `send_buffer`, for a GPU buffer or registered CUDA memory that this process's GPU
    /// work is still writing: it is in place once the ready semaphore reaches `ready_value`
    /// (see lf_send_buffer_after, which says where CUDA memory can go so).
    Expected<std::uint64_t> send_buffer_after(nothrow_t, BufferView buffer, std::size_t offset, std::size_t size,
                                              std::uint64_t ready_value, Timeout timeout = forever) noexcept {
        std::uint64_t sequence = 0;
        if (lf_status s = lf_send_buffer_after(get(), buffer.get(), offset, size, ready_value, timeout.count(), &sequence);
            s != LF_OK)
            return detail::failure(s);
        return sequence;
    }
    /// Lends `size` bytes of shared memory to write the next message in place, waiting for
    /// room up to `timeout`. One loan at a time.
    Expected<Loan> loan(nothrow_t, std::size_t size, Timeout timeout = forever) noexcept {
        lf_loan_region raw{};
        if (lf_status s = lf_loan(get(), size, timeout.count(), &raw); s != LF_OK) return detail::failure(s);
        return Loan(get(), raw);
    }
    /// How many messages the consumer has released (on a fan-out, every consumer that got them):
    /// every sequence number below it is complete.
    Expected<std::uint64_t> completed(nothrow_t) noexcept {
        std::uint64_t out = 0;
        if (lf_status s = lf_completed(get(), &out); s != LF_OK) return detail::failure(s);
        return out;
    }
    /// Whether message `sequence` is complete (released by the consumer, or by every consumer of
    /// a fan-out that got it), without waiting.
    Expected<bool> is_completed(nothrow_t, std::uint64_t sequence) noexcept {
        auto done = completed(nothrow);
        if (!done) return done.error();
        return sequence < *done;
    }
    /// Waits up to `timeout` until the consumer (on a fan-out, every consumer that got it) has
    /// released message `sequence` (LF_ERR_TIMEOUT otherwise).
    Expected<void> wait_completed(nothrow_t, std::uint64_t sequence, Timeout timeout = forever) noexcept {
        return detail::done(lf_wait_completed(get(), sequence, timeout.count()));
    }

#if LAVA_FLOW_EXCEPTIONS
    Producer(const Context& context, const std::string& name, const Location& mine, const Location& peer,
             const ChannelConfig& config = ChannelConfig())
        : Producer(create(nothrow, context, name, mine, peer, config).value()) {}
    Producer(const Context& context, const std::string& name, const ChannelConfig& config = ChannelConfig())
        : Producer(create(nothrow, context, name, config).value()) {}

    std::uint64_t send(const void* data, std::size_t size, Timeout timeout = forever) {
        return send(nothrow, data, size, timeout).value();
    }
    std::uint64_t try_send(const void* data, std::size_t size) { return try_send(nothrow, data, size).value(); }
    std::uint64_t send_buffer(BufferView buffer, std::size_t offset, std::size_t size, Timeout timeout = forever) {
        return send_buffer(nothrow, buffer, offset, size, timeout).value();
    }
    std::uint64_t send_buffer_after(BufferView buffer, std::size_t offset, std::size_t size, std::uint64_t ready_value,
                                    Timeout timeout = forever) {
        return send_buffer_after(nothrow, buffer, offset, size, ready_value, timeout).value();
    }
    Loan loan(std::size_t size, Timeout timeout = forever) { return loan(nothrow, size, timeout).value(); }
    std::uint64_t completed() { return completed(nothrow).value(); }
    bool is_completed(std::uint64_t sequence) { return is_completed(nothrow, sequence).value(); }
    void wait_completed(std::uint64_t sequence, Timeout timeout = forever) {
        wait_completed(nothrow, sequence, timeout).value();
    }
#endif

private:
    explicit Producer(lf_channel* raw) noexcept : ChannelEnd(raw) {}
};

/// The receiving end of channel `name`. Either end may be created first; creation waits for
/// the other (up to the config's rendezvous timeout; a fan-in's consumer waits so for its first
/// producer, and the others attach any time). A consumer of a full fan-out is refused with
/// LF_ERR_INVALID_STATE. Move-only.
class Consumer : public detail::ChannelEnd {
public:
    /// The end between this process (`mine`) and the producer's process (`peer`).
    static Expected<Consumer> create(nothrow_t, const Context& context, const std::string& name,
                                     const Location& mine, const Location& peer,
                                     const ChannelConfig& config = ChannelConfig()) noexcept {
        auto raw = open(context.get(), name, LF_ROLE_CONSUMER, &mine, &peer, config);
        if (!raw) return raw.error();
        return Consumer(*raw, config);
    }
    /// The end for a producer on this host.
    static Expected<Consumer> create(nothrow_t, const Context& context, const std::string& name,
                                     const ChannelConfig& config = ChannelConfig()) noexcept {
        auto raw = open(context.get(), name, LF_ROLE_CONSUMER, nullptr, nullptr, config);
        if (!raw) return raw.error();
        return Consumer(*raw, config);
    }

    /// The next message, waiting up to `timeout` (LF_ERR_TIMEOUT). LF_ERR_PEER_GONE once the
    /// producer has gone and its messages are read. A fan-in serves its producers in turn, each
    /// in its order (Message::producer names the slot), and says LF_ERR_PEER_GONE once per
    /// producer that ended, after its last message: `last_gone()` then names the slot, and the
    /// others go on. With no producer attached, a fan-in's recv waits for one. A fan-out
    /// consumer detached for keeping the producer waiting (ChannelConfig::slow_consumer_timeout)
    /// gets LF_ERR_PEER_GONE, saying so, after what it had.
    Expected<Message> recv(nothrow_t, Timeout timeout = forever) noexcept {
        lf_message raw{};
        if (lf_status s = lf_recv(get(), timeout.count(), &raw); s != LF_OK) return failed(s, raw);
        return Message(get(), raw);
    }
    /// As `recv`, but LF_ERR_WOULD_BLOCK at once when no message waits.
    Expected<Message> try_recv(nothrow_t) noexcept {
        lf_message raw{};
        if (lf_status s = lf_try_recv(get(), &raw); s != LF_OK) return failed(s, raw);
        return Message(get(), raw);
    }
    /// The fan-in slot whose producer's end the last LF_ERR_PEER_GONE reported: nullopt before
    /// the first, and on a pair channel. The slot may be taken by a new producer afterwards.
    std::optional<std::uint32_t> last_gone() const noexcept { return last_gone_; }
    /// A file descriptor for poll/epoll, owned by the channel: readable while a message waits,
    /// after a producer has gone, and (fan-in) when a producer attaches. After each wake-up,
    /// `try_recv` until LF_ERR_WOULD_BLOCK.
    Expected<int> fd(nothrow_t) noexcept {
        int out = -1;
        if (lf_status s = lf_channel_fd(get(), &out); s != LF_OK) return detail::failure(s);
        return out;
    }
    /// A new fd of the ready semaphore of the producer in slot `producer` (a message's
    /// `producer()`), owned by the caller: a fan-in's producers each have their own (see
    /// lf_channel_producer_ready_semaphore). LF_ERR_UNSUPPORTED where that producer has none.
    Expected<int> producer_ready_semaphore(nothrow_t, std::uint32_t producer) noexcept {
        int out = -1;
        if (lf_status s = lf_channel_producer_ready_semaphore(get(), producer, &out); s != LF_OK)
            return detail::failure(s);
        return out;
    }

#if LAVA_FLOW_EXCEPTIONS
    Consumer(const Context& context, const std::string& name, const Location& mine, const Location& peer,
             const ChannelConfig& config = ChannelConfig())
        : Consumer(create(nothrow, context, name, mine, peer, config).value()) {}
    Consumer(const Context& context, const std::string& name, const ChannelConfig& config = ChannelConfig())
        : Consumer(create(nothrow, context, name, config).value()) {}

    Message recv(Timeout timeout = forever) { return recv(nothrow, timeout).value(); }
    Message try_recv() { return try_recv(nothrow).value(); }
    int fd() { return fd(nothrow).value(); }
    int producer_ready_semaphore(std::uint32_t producer) { return producer_ready_semaphore(nothrow, producer).value(); }
#endif

private:
    Consumer(lf_channel* raw, const ChannelConfig& config) noexcept
        : ChannelEnd(raw), fan_in_(config.raw().kind == LF_CHANNEL_FAN_IN) {}
    /// A receive's failure; on a fan-in's LF_ERR_PEER_GONE, lf_recv wrote the slot that ended.
    Error failed(lf_status status, const lf_message& raw) noexcept {
        if (status == LF_ERR_PEER_GONE && fan_in_) last_gone_ = raw.producer;
        return detail::failure(status);
    }
    bool fan_in_ = false;
    std::optional<std::uint32_t> last_gone_;
};

}  // namespace lf

#endif  // LAVA_FLOW_CHANNEL_HPP
