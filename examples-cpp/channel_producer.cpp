// The producer half of the two-process channel demo (see channel_demo.hpp), with the throwing
// API: any failure arrives as an lf::Error, caught in main.
//   lf_channel_producer_cpp NAME
// Start a consumer (lf_channel_consumer_cpp NAME, or the C one) too, in either order.
//
// Phase 5, GPU buffers: where this process's context has a GPU, a marker message
// "GPU <count> <how>" and then kGpuBuffers messages, each a 1 MiB DEVICE_LOCAL buffer (one of
// kRegions, written with Buffer::write, rewritten only once its previous message is complete)
// sent with send_buffer: by reference through the Vulkan IPC route where the consumer shares
// the GPU, else staged (copied through host memory). <how> is this end's sentence on GPU
// buffers: how they are synchronised, or why they are staged. Without a GPU the marker is
// "no GPU <why>" and nothing else follows.
#include "channel_demo.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s CHANNEL-NAME\n", argv[0]);
        return 2;
    }
    const std::string name = argv[1];
    try {
        // The defaults: the GPU opened where there is one (phase 5), CPU memory otherwise.
        const lf::Context context;
        // Both channels link this process with one on the same host.
        lf::Producer out(context, name, demo::config());
        lf::Consumer in(context, name + ".reply", demo::config());
        const lf::Transport transport = out.transport();
        std::printf("producer: transport %s (%s)\n", transport.name.c_str(), transport.reason.c_str());

        // 1. verify: copy sends and loaned (written in place) sends, checksummed.
        std::vector<std::uint8_t> scratch(4096);
        auto fill = [](std::uint8_t* dst, std::uint64_t i, std::size_t len) {
            for (std::size_t at = 16; at < len; at++) dst[at] = demo::byte(i, at);
            const demo::Header h{i, demo::checksum(dst + 16, len - 16)};
            std::memcpy(dst, &h, sizeof h);
        };
        for (std::uint64_t i = 0; i < demo::kMessages; i++) {
            const std::size_t len = demo::length(i);
            if (i % 2) {
                lf::Loan loan = out.loan(len, demo::kTimeout);
                fill(static_cast<std::uint8_t*>(loan.data()), i, len);
                loan.publish(len);
            } else {
                fill(scratch.data(), i, len);
                out.send(scratch.data(), len, demo::kTimeout);
            }
        }
        std::printf("producer: sent %d messages of 16 B to 4 KiB (half copied, half written in place)\n",
                    static_cast<int>(demo::kMessages));

        // 2. latency: ping-pong of 8-byte messages.
        std::vector<double> half_rtt(demo::kPings);
        for (std::uint64_t i = 0; i < demo::kPings; i++) {
            const std::uint64_t ping = i;
            const double t0 = demo::now_ns();
            out.send(&ping, sizeof ping, demo::kTimeout);
            const lf::Message pong = in.recv(demo::kTimeout);
            half_rtt[i] = (demo::now_ns() - t0) / 2;
            std::uint64_t echoed = 0;
            std::memcpy(&echoed, pong.data(), sizeof echoed);
            if (echoed != ping) {
                std::fprintf(stderr, "producer: pong %llu for ping %llu\n", static_cast<unsigned long long>(echoed),
                             static_cast<unsigned long long>(ping));
                return 1;
            }
        }  // each pong is released as it goes out of scope
        std::sort(half_rtt.begin(), half_rtt.end());
        std::printf("producer: latency (half round trip, 8 B, %d ping-pongs): p50 %.0f ns, p99 %.0f ns\n",
                    static_cast<int>(demo::kPings), half_rtt[demo::kPings / 2], half_rtt[demo::kPings * 99 / 100]);

        // 3. bandwidth: 1 MiB messages, every byte written in place.
        for (std::uint64_t i = 0; i < demo::kBulk; i++) {
            lf::Loan loan = out.loan(demo::kBulkSize, demo::kTimeout);
            std::memset(loan.data(), static_cast<int>(i & 0xff), demo::kBulkSize);
            loan.publish();
        }

        // 4. buffer sends: regions of one lava-flow buffer, by reference.
        const lf::Buffer buffer = context.allocate(demo::kRegions * demo::kBulkSize, lf::Memory::CpuStandard);
        auto* base = static_cast<std::uint8_t*>(buffer.data());
        std::uint64_t sent[demo::kRegions] = {};
        for (std::uint64_t i = 0; i < demo::kBulk; i++) {
            const std::size_t region = static_cast<std::size_t>(i % demo::kRegions);
            // The consumer may still be reading this region's previous message.
            if (i >= demo::kRegions) out.wait_completed(sent[region], demo::kTimeout);
            std::memset(base + region * demo::kBulkSize, static_cast<int>(i & 0xff), demo::kBulkSize);
            sent[region] = out.send_buffer(buffer, region * demo::kBulkSize, demo::kBulkSize, demo::kTimeout);
        }

        // 5. GPU buffers, where this process has a GPU; the marker tells the consumer what follows.
        std::vector<lf::Buffer> gpu;
        if (const auto no_gpu = context.gpu_unavailable_reason()) {
            const std::string marker = "no GPU " + *no_gpu;
            out.send(marker.c_str(), marker.size() + 1, demo::kTimeout);
            std::printf("producer: GPU buffers skipped: this process has no Vulkan device (%s)\n", no_gpu->c_str());
        } else {
            // This end's word on GPU buffers: the synchronisation sentence when they go by
            // reference, else the sentence on why they are staged.
            const lf::Transport now = out.transport();
            const bool by_reference = now.name == "shm+vulkan_ipc";
            std::size_t how = std::string::npos;
            if (by_reference) {
                how = now.reason.find("host-side synchronisation");
                if (how == std::string::npos) how = now.reason.find("GPU-side synchronisation");
            } else {
                how = now.reason.find("GPU buffers:");
            }
            if (how == std::string::npos) how = 0;
            const std::string marker = "GPU " + std::to_string(demo::kGpuBuffers) + " " + now.reason.substr(how);
            out.send(marker.c_str(), marker.size() + 1, demo::kTimeout);
            std::vector<std::uint8_t> pattern(demo::kBulkSize);
            for (std::size_t b = 0; b < demo::kRegions; b++)
                gpu.push_back(context.allocate(demo::kBulkSize, lf::Memory::GpuDeviceLocal));
            for (std::uint64_t i = 0; i < demo::kGpuBuffers; i++) {
                const std::size_t b = static_cast<std::size_t>(i % demo::kRegions);
                // By reference, the consumer may still be reading this buffer's previous message.
                if (i >= demo::kRegions) out.wait_completed(sent[b], demo::kTimeout);
                for (std::size_t at = 0; at < demo::kBulkSize; at++) pattern[at] = demo::byte(i, at);
                gpu[b].write(0, pattern.data(), demo::kBulkSize);
                sent[b] = out.send_buffer(gpu[b], 0, demo::kBulkSize, demo::kTimeout);
            }
            std::printf("producer: sent %d GPU buffers (DEVICE_LOCAL, 1 MiB each) %s %s\n",
                        static_cast<int>(demo::kGpuBuffers), by_reference ? "by reference through" : "staged through",
                        now.name.c_str());
        }

        // The consumer's reply says it has read everything: every message pointing into the
        // buffers is complete, and they may go (as they do, before the channels, at the end).
        in.recv(demo::kTimeout);
    } catch (const lf::Error& e) {
        std::fprintf(stderr, "producer: failed: %s\n  %s\n", e.status_name(), e.what());
        return 1;
    }
    std::printf("producer: done\n");
    return 0;
}
