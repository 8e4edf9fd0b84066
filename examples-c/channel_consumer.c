/* The consumer half of the two-process channel demo (see channel_demo.h):
 *   lf_channel_consumer NAME
 * Start lf_channel_producer NAME too, in either order. */
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
    CHECK(demo_open(argv[1], LF_ROLE_CONSUMER, &in));
    CHECK(demo_open(reply_name, LF_ROLE_PRODUCER, &out));
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

    /* 3. bandwidth: read every byte of every bulk message. */
    uint64_t sum = 0, expected = 0;
    double t0 = 0;
    for (uint64_t i = 0; i < DEMO_BULK; i++) {
        lf_message m;
        CHECK(lf_recv(in, DEMO_TIMEOUT_NS, &m));
        if (i == 0) t0 = demo_now_ns();
        const uint64_t *words = m.data;
        for (size_t w = 0; w < m.len / 8; w++) sum += words[w];
        expected += (i & 0xff) * 0x0101010101010101ull * (DEMO_BULK_SIZE / 8);
        CHECK(lf_release(in, &m));
    }
    double seconds = (demo_now_ns() - t0) / 1e9;
    if (sum != expected) {
        fprintf(stderr, "consumer: bulk data corrupted\n");
        return 1;
    }
    printf("consumer: bandwidth (1 MiB messages, every byte written and read): %.2f GB/s\n",
           (double)(DEMO_BULK - 1) * DEMO_BULK_SIZE / seconds / 1e9);
    uint64_t done = 1;
    CHECK(lf_send(out, &done, sizeof done, DEMO_TIMEOUT_NS, NULL));

    lf_channel_free(out);
    lf_channel_free(in);
    printf("consumer: done\n");
    return 0;
}
