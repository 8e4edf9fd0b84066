// A fan-in channel in C++: several producer processes, one consumer, on one host.
//
//   lf_fan_in_cpp consumer NAME [PRODUCERS [MESSAGES]]
//   lf_fan_in_cpp producer NAME [PRODUCERS [MESSAGES]]
//
// As examples-c/fan_in.c, with the same messages and output, run by the same script
// (run_fan_in.sh): PRODUCERS (4 by default) producers each send MESSAGES (100000 by default)
// numbered messages and close; the consumer checks each producer's order through
// Message::producer, lists the producers (Consumer::peers) once it has heard from all of them,
// and ends after every producer's end: recv's LF_ERR_PEER_GONE, with Consumer::last_gone naming
// the slot. The producer uses the throwing API; the consumer takes its messages with the
// lf::nothrow form, where a producer's end is a status to handle rather than an exception.
#include <lava_flow.hpp>

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace std::chrono_literals;

constexpr lf::Timeout kTimeout = 30s;

// What a producer sends: its count, and its pid so that the consumer can match the message to
// Consumer::peers' entry.
struct FanInMessage {
    std::uint64_t number;
    std::uint64_t pid;
};

lf::ChannelConfig fan_in(std::uint32_t producers) {
    // The consumer's max_peers is the one that counts.
    return lf::ChannelConfig().kind(lf::ChannelKind::FanIn).max_peers(producers).rendezvous_timeout(kTimeout);
}

lf::Context cpu_context() {
    lf_context_config config{};
    lf_context_config_init(&config, sizeof config);
    config.gpu_policy = LF_GPU_DISABLED;  // CPU messages only
    return lf::Context(&config);
}

int run_producer(const std::string& name, std::uint32_t producers, std::uint64_t messages) {
    const lf::Context context = cpu_context();
    lf::Producer out(context, name, fan_in(producers));
    const auto pid = static_cast<std::uint64_t>(getpid());
    for (std::uint64_t i = 0; i < messages; i++) {
        const FanInMessage m{i, pid};
        if (const std::uint64_t sequence = out.send(&m, sizeof m, kTimeout); sequence != i) {
            std::fprintf(stderr, "producer %llu: message %llu got sequence number %llu\n",
                         static_cast<unsigned long long>(pid), static_cast<unsigned long long>(i),
                         static_cast<unsigned long long>(sequence));
            return 1;
        }
    }
    // Closing (here, by the destructor) lets the consumer read what was sent, then see this
    // producer's end.
    std::printf("producer %llu: sent %llu messages\n", static_cast<unsigned long long>(pid),
                static_cast<unsigned long long>(messages));
    return 0;
}

const char* state_name(lf::PeerState state) {
    switch (state) {
    case lf::PeerState::Free: return "free";
    case lf::PeerState::Alive: return "alive";
    case lf::PeerState::Gone: return "gone";
    }
    return "?";
}

// Prints Consumer::peers' list; each attached producer's pid must be the one its messages carry
// (`pids`, by slot; none to check when null). Returns the number of slots, or -1.
int print_peers(const lf::Consumer& in, const std::uint64_t* pids) {
    const std::vector<lf::Peer> peers = in.peers();
    for (const lf::Peer& p : peers) {
        std::printf("  slot %u: %s", p.slot, state_name(p.state));
        if (p.state != lf::PeerState::Free) std::printf(", pid %u, host %s, route %s", p.pid, p.host.c_str(), p.route.c_str());
        std::printf("\n");
        if (p.state != lf::PeerState::Free && pids != nullptr && p.pid != pids[p.slot]) {
            std::fprintf(stderr, "consumer: slot %u is pid %u, but its messages say pid %llu\n", p.slot, p.pid,
                         static_cast<unsigned long long>(pids[p.slot]));
            return -1;
        }
    }
    return static_cast<int>(peers.size());
}

int run_consumer(const std::string& name, std::uint32_t producers, std::uint64_t messages) {
    const lf::Context context = cpu_context();
    lf::Consumer in(context, name, fan_in(producers));
    std::array<std::uint64_t, LF_MAX_PEERS> next{};  // the number each slot's next message must carry
    std::array<std::uint64_t, LF_MAX_PEERS> pids{};
    std::uint32_t heard = 0, ended = 0;
    std::uint64_t total = 0;
    while (ended < producers) {
        lf::Expected<lf::Message> m = in.recv(lf::nothrow, kTimeout);
        if (m.status() == LF_ERR_PEER_GONE) {
            // One producer's end, after its last message: last_gone() is its slot, free again.
            const std::uint32_t slot = in.last_gone().value_or(LF_MAX_PEERS);
            if (slot >= producers || next[slot] != messages) {
                std::fprintf(stderr, "consumer: slot %u ended after %llu of %llu messages\n", slot,
                             static_cast<unsigned long long>(slot < producers ? next[slot] : 0),
                             static_cast<unsigned long long>(messages));
                return 1;
            }
            std::printf("consumer: slot %u (pid %llu) ended after its %llu messages, all in order\n", slot,
                        static_cast<unsigned long long>(pids[slot]), static_cast<unsigned long long>(messages));
            next[slot] = 0;
            ended++;
            continue;
        }
        if (!m) {
            std::fprintf(stderr, "consumer: recv failed: %s\n  %s\n", m.error().status_name(), m.error().what());
            return 1;
        }
        const std::uint32_t slot = m->producer();
        FanInMessage got{};
        if (m->size() != sizeof got || slot >= producers) {
            std::fprintf(stderr, "consumer: a message of %zu bytes from slot %u\n", m->size(), slot);
            return 1;
        }
        std::memcpy(&got, m->data(), sizeof got);
        // Each producer's order holds: numbers and sequence numbers count up from 0 per slot.
        if (got.number != next[slot] || m->sequence() != got.number || (got.number > 0 && got.pid != pids[slot])) {
            std::fprintf(stderr, "consumer: slot %u sent message %llu (sequence %llu, pid %llu) where %llu was due\n",
                         slot, static_cast<unsigned long long>(got.number),
                         static_cast<unsigned long long>(m->sequence()), static_cast<unsigned long long>(got.pid),
                         static_cast<unsigned long long>(next[slot]));
            return 1;
        }
        if (got.number == 0) {
            pids[slot] = got.pid;
            if (++heard == producers) {
                std::printf("consumer: heard from all %u producers; lf_channel_peers:\n", producers);
                if (print_peers(in, pids.data()) != static_cast<int>(producers)) return 1;
            }
        }
        next[slot]++;
        total++;
    }  // each message released as it goes out of scope
    std::printf("consumer: every producer has ended; lf_channel_peers:\n");
    if (print_peers(in, nullptr) != static_cast<int>(producers)) return 1;
    std::printf("consumer: %llu messages from %u producers, each producer's in order\n",
                static_cast<unsigned long long>(total), producers);
    return 0;
}

}  // namespace

int main(int argc, char** argv) try {
    const std::string_view role = argc > 1 ? argv[1] : "";
    if (argc < 3 || argc > 5 || (role != "consumer" && role != "producer")) {
        std::fprintf(stderr, "usage: %s consumer|producer NAME [PRODUCERS [MESSAGES]]\n", argv[0]);
        return 2;
    }
    const long producers = argc > 3 ? std::strtol(argv[3], nullptr, 10) : 4;
    const long long messages = argc > 4 ? std::strtoll(argv[4], nullptr, 10) : 100000;
    if (producers < 1 || producers > LF_MAX_PEERS || messages < 1) {
        std::fprintf(stderr, "PRODUCERS must be from 1 to %d, MESSAGES at least 1\n", LF_MAX_PEERS);
        return 2;
    }
    return role == "consumer"
               ? run_consumer(argv[2], static_cast<std::uint32_t>(producers), static_cast<std::uint64_t>(messages))
               : run_producer(argv[2], static_cast<std::uint32_t>(producers), static_cast<std::uint64_t>(messages));
} catch (const lf::Error& e) {  // status() and what(): what went wrong and how to fix it
    std::fprintf(stderr, "%s: %s\n  %s\n", argc > 1 ? argv[1] : "fan_in", e.status_name(), e.what());
    return 1;
}
