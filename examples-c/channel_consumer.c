/* The consumer half of the two-process channel demo (see channel_demo.h):
 *   lf_channel_consumer NAME
 * Start lf_channel_producer NAME too, in either order.
 *
 * After the phases of channel_demo.h comes 5. GPU buffers (see channel_producer.c): the
 * producer's marker says whether GPU buffers follow; each is checked byte by byte, read through
 * lf_message_buffer + lf_buffer_read when it came by reference (LF_MESSAGE_GPU), from the
 * message's bytes when the producer staged it. */
#include "channel_demo.h"

#define CHECK(call) do { lf_status s_ = (call); if (s_ != LF_OK) return demo_fail("consumer", #call, s_); } while (0)

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s CHANNEL-NAME\n", argv[0]);
        return 2;
    }
    char reply_name[128];
    snprintf(reply_name, sizeof reply_name, "%s.reply", argv[1]);
    lf_channel *in = NULL, *out = NULL;
    lf_context *context = NULL;
    /* The defaults: the GPU opened where there is one, so that GPU buffers come by reference. */
    CHECK(lf_context_create(NULL, &context));
    CHECK(demo_open(context, argv[1], LF_ROLE_CONSUMER, &in));
    CHECK(demo_open(context, reply_name, LF_ROLE_PRODUCER, &out));
    demo_print_transport("consumer", in);

    /* 1. verify: order, length and checksum of every message. */
    uint64_t bytes = 0;
    for (uint64_t i = 0; i < DEMO_MESSAGES; i++) {
        lf_message m;
        CHECK(lf_recv(in, DEMO_TIMEOUT_NS, &m));
        demo_header h;
        memcpy(&h, m.data, sizeof h);
        const uint8_t *payload = (const uint8_t *)m.data + 16;
        if (m.len != demo_length(i) || h.sequence != i || m.sequence != i ||
            h.checksum != demo_checksum(payload, m.len - 16)) {
            fprintf(stderr, "consumer: message %llu is wrong (len %zu, header seq %llu, channel seq %llu)\n",
                    (unsigned long long)i, m.len, (unsigned long long)h.sequence, (unsigned long long)m.sequence);
            return 1;
        }
        bytes += m.len;
        CHECK(lf_release(in, &m));
    }
    printf("consumer: verified %d messages (%.1f MiB): in order, none lost or repeated, checksums match\n",
           DEMO_MESSAGES, (double)bytes / (1 << 20));

    /* 2. latency: echo each ping. */
    for (int i = 0; i < DEMO_PINGS; i++) {
        lf_message ping;
        CHECK(lf_recv(in, DEMO_TIMEOUT_NS, &ping));
        CHECK(lf_send(out, ping.data, ping.len, DEMO_TIMEOUT_NS, NULL));
        CHECK(lf_release(in, &ping));
    }

    /* 3. bandwidth (copied into the channel) and 4. buffer sends (by reference): read every
     * byte of every bulk message. */
    for (int phase = 3; phase <= 4; phase++) {
        uint64_t sum = 0, expected = 0;
        double t0 = 0;
        for (uint64_t i = 0; i < DEMO_BULK; i++) {
            lf_message m;
            CHECK(lf_recv(in, DEMO_TIMEOUT_NS, &m));
            if (i == 0) t0 = demo_now_ns();
            if ((m.flags & LF_MESSAGE_ZERO_COPY) != (phase == 4 ? LF_MESSAGE_ZERO_COPY : 0u)) {
                fprintf(stderr, "consumer: phase %d message %llu has flags %u\n", phase, (unsigned long long)i, m.flags);
                return 1;
            }
            const uint64_t *words = m.data;
            for (size_t w = 0; w < m.len / 8; w++) sum += words[w];
            expected += (i & 0xff) * 0x0101010101010101ull * (DEMO_BULK_SIZE / 8);
            CHECK(lf_release(in, &m));
        }
        double seconds = (demo_now_ns() - t0) / 1e9;
        if (sum != expected) {
            fprintf(stderr, "consumer: bulk data corrupted in phase %d\n", phase);
            return 1;
        }
        printf("consumer: %s (1 MiB messages, every byte written and read): %.2f GB/s\n",
               phase == 3 ? "bandwidth, written into the channel" : "bandwidth, buffer sends by reference",
               (double)(DEMO_BULK - 1) * DEMO_BULK_SIZE / seconds / 1e9);
    }

    /* 5. GPU buffers: the marker, then as many 1 MiB buffers as it says. */
    lf_message m;
    char marker[1024];
    CHECK(lf_recv(in, DEMO_TIMEOUT_NS, &m));
    size_t marker_len = m.len < sizeof marker ? m.len : sizeof marker - 1;
    memcpy(marker, m.data, marker_len);
    marker[marker_len] = '\0';
    CHECK(lf_release(in, &m));
    int count = 0, offset = 0;
    if (strncmp(marker, "no GPU ", 7) == 0) {
        printf("consumer: GPU buffers skipped: the producer has no Vulkan device (%s)\n", marker + 7);
    } else if (sscanf(marker, "GPU %d %n", &count, &offset) == 1 && count > 0 && offset > 0) {
        const char *how = marker + offset;
        uint8_t *bytes = malloc(DEMO_BULK_SIZE);
        if (!bytes) return 1;
        int by_reference = 0;
        for (uint64_t i = 0; i < (uint64_t)count; i++) {
            CHECK(lf_recv(in, DEMO_TIMEOUT_NS, &m));
            const uint8_t *p = m.data;
            if (m.flags & LF_MESSAGE_GPU) {
                /* A GPU buffer of the producer's, imported here: read it through the buffer
                 * the message lends (its memory need not be mapped in this process). */
                const lf_buffer *buffer = NULL;
                CHECK(lf_message_buffer(in, &m, &buffer));
                CHECK(lf_buffer_read(buffer, 0, bytes, m.len < DEMO_BULK_SIZE ? m.len : DEMO_BULK_SIZE));
                p = bytes;
                by_reference++;
            }
            size_t at = 0;
            if (m.len == DEMO_BULK_SIZE)
                while (at < DEMO_BULK_SIZE && p[at] == demo_byte(i, at)) at++;
            if (m.len != DEMO_BULK_SIZE || at != DEMO_BULK_SIZE) {
                fprintf(stderr, "consumer: GPU buffer %llu is wrong (len %zu, flags %u, first bad byte at %zu)\n",
                        (unsigned long long)i, m.len, m.flags, at);
                return 1;
            }
            CHECK(lf_release(in, &m));
        }
        free(bytes);
        const char *transport = "?";
        CHECK(lf_channel_transport(in, &transport, NULL));
        if (by_reference == count) {
            printf("consumer: verified %d GPU buffers (1 MiB each) by reference through %s (%s)\n", count, transport, how);
        } else if (by_reference == 0) {
            printf("consumer: verified %d GPU buffers (1 MiB each), staged by the producer, not by reference (%s)\n",
                   count, how);
        } else {
            fprintf(stderr, "consumer: %d of %d GPU buffers came by reference, the others staged\n", by_reference, count);
            return 1;
        }
    } else {
        fprintf(stderr, "consumer: unexpected phase 5 marker \"%s\"\n", marker);
        return 1;
    }

    uint64_t done = 1;
    CHECK(lf_send(out, &done, sizeof done, DEMO_TIMEOUT_NS, NULL));

    lf_channel_free(out);
    lf_channel_free(in);
    lf_context_free(context);
    printf("consumer: done\n");
    return 0;
}
