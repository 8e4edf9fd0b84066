// A fan-out channel in C++: one producer process, several consumers, on one host.
//
//   lf_fan_out_cpp producer NAME [CONSUMERS [MESSAGES]]
//   lf_fan_out_cpp consumer NAME [CONSUMERS [MESSAGES]]
//
// As examples-c/fan_out.c, with the same messages and output, run by the same script
// (run_fan_out.sh): the producer waits for CONSUMERS (4 by default) consumers and lists them
// (Producer::peers), then broadcasts MESSAGES (100000 by default) numbered messages, with a new
// version of its 1 MiB "weights" buffer before each quarter of them, sent by reference
// (send_buffer) and rewritten only once wait_completed says every consumer released the last
// version. Each consumer checks every message, in order, and each version's bytes, and ends at
// the producer's end. The producer uses the throwing API; the consumer takes its messages with
// the lf::nothrow form, where the producer's end is a status to handle rather than an exception.
#include <lava_flow.hpp>

#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;

constexpr lf::Timeout kTimeout = 30s;
constexpr std::size_t kWeightsSize = std::size_t{1} << 20;
constexpr std::uint64_t kVersions = 4;

// A numbered message; the weights are told apart by their size.
struct FanOutMessage {
    std::uint64_t number;
    std::uint64_t version;  // the weights' version it goes with
};

// Byte `i` of weights version `version`: every byte differs from its neighbours and from the
// same byte of the version before.
std::uint8_t weight_byte(std::size_t i, std::uint64_t version) {
    return static_cast<std::uint8_t>(i * 131u + version * 7u + 1u);
}

lf::ChannelConfig fan_out(std::uint32_t consumers) {
    // The producer's max_peers and pool_size are the ones that count. The numbered messages are
    // copied into a pool each consumer maps; the weights go by reference, outside it: 1 MiB is
    // plenty, and quick for a consumer to map as it attaches.
    return lf::ChannelConfig()
        .kind(lf::ChannelKind::FanOut)
        .max_peers(consumers)
        .pool_size(1 << 20)
        .rendezvous_timeout(kTimeout);
}

lf::Context cpu_context() {
    lf_context_config config{};
    lf_context_config_init(&config, sizeof config);
    config.gpu_policy = LF_GPU_DISABLED;  // CPU messages only
    return lf::Context(&config);
}

std::uint32_t alive(const std::vector<lf::Peer>& peers) {
    std::uint32_t n = 0;
    for (const lf::Peer& p : peers) n += p.state == lf::PeerState::Alive;
    return n;
}

int run_producer(const std::string& name, std::uint32_t consumers, std::uint64_t messages) {
    const lf::Context context = cpu_context();
    lf::Producer out(context, name, fan_out(consumers));
    // Creating waited for the first consumer; the others attach meanwhile, each taken up at the
    // next send: wait for all of them, so that every consumer gets every message.
    const auto deadline = std::chrono::steady_clock::now() + kTimeout;
    std::vector<lf::Peer> peers = out.peers();
    while (alive(peers) < consumers) {
        if (std::chrono::steady_clock::now() > deadline) {
            std::fprintf(stderr, "producer: only %u of %u consumers attached within 30 s\n", alive(peers), consumers);
            return 1;
        }
        std::this_thread::sleep_for(10ms);
        peers = out.peers();
    }
    std::printf("producer: %u consumers attached; lf_channel_peers:\n", consumers);
    for (const lf::Peer& p : peers) {
        if (p.state == lf::PeerState::Alive)
            std::printf("  slot %u: alive, pid %u, host %s, route %s\n", p.slot, p.pid, p.host.c_str(), p.route.c_str());
        else
            std::printf("  slot %u: %s\n", p.slot, p.state == lf::PeerState::Free ? "free" : "gone");
    }

    const lf::Buffer weights = context.allocate(kWeightsSize);
    auto* bytes = static_cast<std::uint8_t*>(weights.data());
    const std::uint64_t per_version = (messages + kVersions - 1) / kVersions;
    std::uint64_t weights_sequence = 0, last = 0, version = 0;
    for (std::uint64_t i = 0; i < messages; i++) {
        if (i % per_version == 0) {
            // Every consumer reads the weights where they lie: rewrite them only once the last
            // version is complete, that is released by every consumer that got it.
            if (version > 0) {
                out.wait_completed(weights_sequence, kTimeout);
                std::printf("producer: weights version %llu released by every consumer\n",
                            static_cast<unsigned long long>(version - 1));
            }
            for (std::size_t b = 0; b < kWeightsSize; b++) bytes[b] = weight_byte(b, version);
            weights_sequence = out.send_buffer(weights, 0, kWeightsSize, kTimeout);
            version++;
        }
        const FanOutMessage m{i, version - 1};
        last = out.send(&m, sizeof m, kTimeout);
    }
    out.wait_completed(weights_sequence, kTimeout);
    std::printf("producer: weights version %llu released by every consumer\n",
                static_cast<unsigned long long>(version - 1));
    out.wait_completed(last, kTimeout);
    std::printf("producer: sent %llu messages and %llu versions of the weights to %u consumers\n",
                static_cast<unsigned long long>(messages), static_cast<unsigned long long>(version),
                alive(out.peers()));
    // Closing (here, by the destructor) lets each consumer read what was sent, then see the
    // producer's end.
    return 0;
}

int run_consumer(const std::string& name, std::uint32_t consumers, std::uint64_t messages) {
    const lf::Context context = cpu_context();
    lf::Consumer in(context, name, fan_out(consumers));
    const auto pid = static_cast<unsigned long long>(getpid());
    const std::uint64_t per_version = (messages + kVersions - 1) / kVersions;
    const std::uint64_t all_versions = (messages + per_version - 1) / per_version;
    std::uint64_t next = 0, versions = 0, received = 0;
    for (;;) {
        lf::Expected<lf::Message> m = in.recv(lf::nothrow, kTimeout);
        if (m.status() == LF_ERR_PEER_GONE) break;  // the producer's end, after its last message
        if (!m) {
            std::fprintf(stderr, "consumer %llu: recv failed: %s\n  %s\n", pid, m.error().status_name(), m.error().what());
            return 1;
        }
        // Every message, none skipped: the consumer's sequence numbers count from 0.
        if (m->sequence() != received) {
            std::fprintf(stderr, "consumer %llu: message %llu has sequence number %llu\n", pid,
                         static_cast<unsigned long long>(received), static_cast<unsigned long long>(m->sequence()));
            return 1;
        }
        received++;
        if (m->size() == kWeightsSize) {
            if (!m->zero_copy()) {
                std::fprintf(stderr, "consumer %llu: weights version %llu was copied\n", pid,
                             static_cast<unsigned long long>(versions));
                return 1;
            }
            const auto* w = static_cast<const std::uint8_t*>(m->data());
            for (std::size_t b = 0; b < kWeightsSize; b++) {
                if (w[b] != weight_byte(b, versions)) {
                    std::fprintf(stderr, "consumer %llu: byte %zu of weights version %llu is %u, not %u\n", pid, b,
                                 static_cast<unsigned long long>(versions), w[b], weight_byte(b, versions));
                    return 1;
                }
            }
            versions++;
        } else {
            FanOutMessage got{};
            if (m->size() != sizeof got) {
                std::fprintf(stderr, "consumer %llu: a message of %zu bytes\n", pid, m->size());
                return 1;
            }
            std::memcpy(&got, m->data(), sizeof got);
            if (got.number != next || versions == 0 || got.version != versions - 1) {
                std::fprintf(stderr, "consumer %llu: message %llu (weights version %llu) where %llu (version %llu) was due\n",
                             pid, static_cast<unsigned long long>(got.number),
                             static_cast<unsigned long long>(got.version), static_cast<unsigned long long>(next),
                             static_cast<unsigned long long>(versions - 1));
                return 1;
            }
            next++;
        }
    }  // each message released as it goes out of scope, which lets the producer rewrite the weights
    if (next != messages || versions != all_versions) {
        std::fprintf(stderr, "consumer %llu: the producer ended after %llu of %llu messages and %llu versions\n", pid,
                     static_cast<unsigned long long>(next), static_cast<unsigned long long>(messages),
                     static_cast<unsigned long long>(versions));
        return 1;
    }
    std::printf("consumer %llu: %llu messages in order and %llu versions of the weights, each byte checked\n", pid,
                static_cast<unsigned long long>(next), static_cast<unsigned long long>(versions));
    return 0;
}

}  // namespace

int main(int argc, char** argv) try {
    const std::string_view role = argc > 1 ? argv[1] : "";
    if (argc < 3 || argc > 5 || (role != "consumer" && role != "producer")) {
        std::fprintf(stderr, "usage: %s producer|consumer NAME [CONSUMERS [MESSAGES]]\n", argv[0]);
        return 2;
    }
    const long consumers = argc > 3 ? std::strtol(argv[3], nullptr, 10) : 4;
    const long long messages = argc > 4 ? std::strtoll(argv[4], nullptr, 10) : 100000;
    if (consumers < 1 || consumers > LF_MAX_PEERS || messages < static_cast<long long>(kVersions)) {
        std::fprintf(stderr, "CONSUMERS must be from 1 to %d, MESSAGES at least %llu\n", LF_MAX_PEERS,
                     static_cast<unsigned long long>(kVersions));
        return 2;
    }
    return role == "producer"
               ? run_producer(argv[2], static_cast<std::uint32_t>(consumers), static_cast<std::uint64_t>(messages))
               : run_consumer(argv[2], static_cast<std::uint32_t>(consumers), static_cast<std::uint64_t>(messages));
} catch (const lf::Error& e) {  // status() and what(): what went wrong and how to fix it
    std::fprintf(stderr, "%s: %s\n  %s\n", argc > 1 ? argv[1] : "fan_out", e.status_name(), e.what());
    return 1;
}
