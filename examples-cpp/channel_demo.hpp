// What the two halves of the C++ channel demo (channel_producer.cpp, channel_consumer.cpp)
// share: the message format, a checksum, a clock and the channel options. The demo is the C
// one (examples-c/channel_demo.h) through the C++ wrapper: the same phases, the same messages
// and the same output, so either half works with the other language's, and
// examples-c/run_channel_demo.sh runs it:
//   1. verify:    kMessages messages of 16 B to 4 KiB, every other one written in place through
//                 an lf::Loan; each carries its sequence number and a checksum that the
//                 consumer checks, with the order.
//   2. latency:   kPings 8-byte ping-pongs; half the round trip is the one-way latency.
//   3. bandwidth: kBulk messages of kBulkSize bytes, every byte written by the producer (in
//                 place, through loans) and read by the consumer.
//   4. buffer sends: the same, but each message is a region of an lf::Buffer sent by reference
//                 (Producer::send_buffer): the consumer reads the producer's pages
//                 (Message::zero_copy), and the producer rewrites a region only once its
//                 previous message is complete (Producer::wait_completed).
//   5. GPU buffers: where the producer's context has a GPU, DEVICE_LOCAL buffers sent with
//                 send_buffer, by reference through the Vulkan IPC route when the consumer
//                 shares the GPU (Message::buffer + read there), copied through host memory
//                 otherwise; a marker message says which, or why the phase is skipped.
// The channel "<name>" carries the data, "<name>.reply" the consumer's replies.
#ifndef LAVA_FLOW_CHANNEL_DEMO_HPP
#define LAVA_FLOW_CHANNEL_DEMO_HPP

#include <lava_flow.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace demo {

using namespace std::chrono_literals;

constexpr std::uint64_t kMessages = 200000;
constexpr std::uint64_t kPings = 20000;
constexpr std::uint64_t kBulk = 2000;
constexpr std::size_t kBulkSize = std::size_t{1} << 20;
// Phase 4 cycles through this many regions of one buffer, phase 5 through as many GPU buffers.
constexpr std::size_t kRegions = 4;
constexpr std::uint64_t kGpuBuffers = 16;
constexpr lf::Timeout kTimeout = 30s;

// A verified message: header, then `len - 16` payload bytes.
struct Header {
    std::uint64_t sequence;
    std::uint64_t checksum;
};

inline std::size_t length(std::uint64_t i) { return 16 + static_cast<std::size_t>((i * 7919u) % (4096u - 16u)); }

inline std::uint8_t byte(std::uint64_t i, std::size_t at) { return static_cast<std::uint8_t>(i * 31u + at * 7u); }

// FNV-1a over the payload.
inline std::uint64_t checksum(const std::uint8_t* p, std::size_t n) {
    std::uint64_t h = 1469598103934665603ull;
    for (std::size_t k = 0; k < n; k++) h = (h ^ p[k]) * 1099511628211ull;
    return h;
}

inline double now_ns() {
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Both ends of both channels: room for several 1 MiB messages in flight.
inline lf::ChannelConfig config() { return lf::ChannelConfig().rendezvous_timeout(kTimeout).pool_size(8u << 20); }

}  // namespace demo

#endif
