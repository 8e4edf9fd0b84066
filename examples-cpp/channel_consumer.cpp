// The consumer half of the two-process channel demo (see channel_demo.hpp), with the
// non-throwing API: every call takes lf::nothrow and returns an lf::Expected, checked here.
// Built with -fno-exceptions.
//   lf_channel_consumer_cpp NAME
// Start a producer (lf_channel_producer_cpp NAME, or the C one) too, in either order.
//
// Phase 5, GPU buffers (see channel_producer.cpp): the producer's marker says whether GPU
// buffers follow; each is checked byte by byte, read through Message::buffer when it came by
// reference (Message::gpu), from the message's bytes when the producer staged it.
#include "channel_demo.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

// Whether `result` failed; if so, says so as the C demo does.
template <typename T>
static bool failed(const lf::Expected<T>& result, const char* call) {
    if (result) return false;
    std::fprintf(stderr, "consumer: %s failed: %s\n  %s\n", call, result.error().status_name(), result.error().what());
    return true;
}

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s CHANNEL-NAME\n", argv[0]);
        return 2;
    }
    const std::string name = argv[1];
    // The defaults: the GPU opened where there is one, so that GPU buffers come by reference.
    auto context = lf::Context::create(lf::nothrow);
    if (failed(context, "lf::Context::create")) return 1;
    auto in = lf::Consumer::create(lf::nothrow, *context, name, demo::config());
    if (failed(in, "lf::Consumer::create")) return 1;
    auto out = lf::Producer::create(lf::nothrow, *context, name + ".reply", demo::config());
    if (failed(out, "lf::Producer::create")) return 1;
    const auto transport = in->transport(lf::nothrow);
    if (failed(transport, "transport")) return 1;
    std::printf("consumer: transport %s (%s)\n", transport->name.c_str(), transport->reason.c_str());

    // 1. verify: order, length and checksum of every message.
    std::uint64_t bytes = 0;
    for (std::uint64_t i = 0; i < demo::kMessages; i++) {
        const auto m = in->recv(lf::nothrow, demo::kTimeout);
        if (failed(m, "recv")) return 1;
        demo::Header h{};
        std::memcpy(&h, m->data(), sizeof h);
        const auto* payload = static_cast<const std::uint8_t*>(m->data()) + 16;
        if (m->size() != demo::length(i) || h.sequence != i || m->sequence() != i ||
            h.checksum != demo::checksum(payload, m->size() - 16)) {
            std::fprintf(stderr, "consumer: message %llu is wrong (len %zu, header seq %llu, channel seq %llu)\n",
                         static_cast<unsigned long long>(i), m->size(), static_cast<unsigned long long>(h.sequence),
                         static_cast<unsigned long long>(m->sequence()));
            return 1;
        }
        bytes += m->size();
    }  // each message is released as it goes out of scope
    std::printf("consumer: verified %d messages (%.1f MiB): in order, none lost or repeated, checksums match\n",
                static_cast<int>(demo::kMessages), static_cast<double>(bytes) / (1 << 20));

    // 2. latency: echo each ping.
    for (std::uint64_t i = 0; i < demo::kPings; i++) {
        const auto ping = in->recv(lf::nothrow, demo::kTimeout);
        if (failed(ping, "recv")) return 1;
        if (failed(out->send(lf::nothrow, ping->data(), ping->size(), demo::kTimeout), "send")) return 1;
    }

    // 3. bandwidth (copied into the channel) and 4. buffer sends (by reference): read every
    // byte of every bulk message.
    for (int phase = 3; phase <= 4; phase++) {
        std::uint64_t sum = 0, expected = 0;
        double t0 = 0;
        for (std::uint64_t i = 0; i < demo::kBulk; i++) {
            const auto m = in->recv(lf::nothrow, demo::kTimeout);
            if (failed(m, "recv")) return 1;
            if (i == 0) t0 = demo::now_ns();
            if (m->zero_copy() != (phase == 4)) {
                std::fprintf(stderr, "consumer: phase %d message %llu has flags %u\n", phase,
                             static_cast<unsigned long long>(i), m->flags());
                return 1;
            }
            const auto* words = static_cast<const std::uint64_t*>(m->data());
            for (std::size_t w = 0; w < m->size() / 8; w++) sum += words[w];
            expected += (i & 0xff) * 0x0101010101010101ull * (demo::kBulkSize / 8);
        }
        const double seconds = (demo::now_ns() - t0) / 1e9;
        if (sum != expected) {
            std::fprintf(stderr, "consumer: bulk data corrupted in phase %d\n", phase);
            return 1;
        }
        std::printf("consumer: %s (1 MiB messages, every byte written and read): %.2f GB/s\n",
                    phase == 3 ? "bandwidth, written into the channel" : "bandwidth, buffer sends by reference",
                    static_cast<double>(demo::kBulk - 1) * demo::kBulkSize / seconds / 1e9);
    }

    // 5. GPU buffers: the marker, then as many 1 MiB buffers as it says.
    std::string marker;
    {
        const auto m = in->recv(lf::nothrow, demo::kTimeout);
        if (failed(m, "recv")) return 1;
        const auto* text = static_cast<const char*>(m->data());
        marker.assign(text, std::find(text, text + m->size(), '\0'));
    }
    int count = 0, offset = 0;
    if (marker.compare(0, 7, "no GPU ") == 0) {
        std::printf("consumer: GPU buffers skipped: the producer has no Vulkan device (%s)\n", marker.c_str() + 7);
    } else if (std::sscanf(marker.c_str(), "GPU %d %n", &count, &offset) == 1 && count > 0 && offset > 0) {
        const char* how = marker.c_str() + offset;
        std::vector<std::uint8_t> copy(demo::kBulkSize);
        int by_reference = 0;
        for (std::uint64_t i = 0; i < static_cast<std::uint64_t>(count); i++) {
            const auto m = in->recv(lf::nothrow, demo::kTimeout);
            if (failed(m, "recv")) return 1;
            const auto* p = static_cast<const std::uint8_t*>(m->data());
            if (m->gpu()) {
                // A GPU buffer of the producer's, imported here: read it through the buffer the
                // message lends (its memory need not be mapped in this process).
                const auto buffer = m->buffer(lf::nothrow);
                if (failed(buffer, "Message::buffer")) return 1;
                if (failed(buffer->read(lf::nothrow, 0, copy.data(), std::min(m->size(), demo::kBulkSize)), "read"))
                    return 1;
                p = copy.data();
                by_reference++;
            }
            std::size_t at = 0;
            if (m->size() == demo::kBulkSize)
                while (at < demo::kBulkSize && p[at] == demo::byte(i, at)) at++;
            if (m->size() != demo::kBulkSize || at != demo::kBulkSize) {
                std::fprintf(stderr, "consumer: GPU buffer %llu is wrong (len %zu, flags %u, first bad byte at %zu)\n",
                             static_cast<unsigned long long>(i), m->size(), m->flags(), at);
                return 1;
            }
        }
        const auto now = in->transport(lf::nothrow);
        if (failed(now, "transport")) return 1;
        if (by_reference == count) {
            std::printf("consumer: verified %d GPU buffers (1 MiB each) by reference through %s (%s)\n", count,
                        now->name.c_str(), how);
        } else if (by_reference == 0) {
            std::printf("consumer: verified %d GPU buffers (1 MiB each), staged by the producer, not by reference (%s)\n",
                        count, how);
        } else {
            std::fprintf(stderr, "consumer: %d of %d GPU buffers came by reference, the others staged\n", by_reference,
                         count);
            return 1;
        }
    } else {
        std::fprintf(stderr, "consumer: unexpected phase 5 marker \"%s\"\n", marker.c_str());
        return 1;
    }

    const std::uint64_t done = 1;
    if (failed(out->send(lf::nothrow, &done, sizeof done, demo::kTimeout), "send")) return 1;
    std::printf("consumer: done\n");
    return 0;
}
