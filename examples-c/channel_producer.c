/* The producer half of the two-process channel demo (see channel_demo.h):
 *   lf_channel_producer NAME
 * Start lf_channel_consumer NAME too, in either order. */
#include "channel_demo.h"

#define CHECK(call) do { lf_status s_ = (call); if (s_ != LF_OK) return demo_fail("producer", #call, s_); } while (0)

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s CHANNEL-NAME\n", argv[0]);
        return 2;
    }
    char reply_name[128];
    snprintf(reply_name, sizeof reply_name, "%s.reply", argv[1]);
    lf_channel *out = NULL, *in = NULL;
    CHECK(demo_open(argv[1], LF_ROLE_PRODUCER, &out));
    CHECK(demo_open(reply_name, LF_ROLE_CONSUMER, &in));
    demo_print_transport("producer", out);

    /* 1. verify: copy sends and loaned (written in place) sends, checksummed. */
    uint8_t *scratch = malloc(4096);
    if (!scratch) return 1;
    for (uint64_t i = 0; i < DEMO_MESSAGES; i++) {
        size_t len = demo_length(i);
        uint8_t *dst = scratch;
        lf_loan_region loan;
        if (i % 2) {
            CHECK(lf_loan(out, len, DEMO_TIMEOUT_NS, &loan));
            dst = loan.data;
        }
        for (size_t at = 16; at < len; at++) dst[at] = demo_byte(i, at);
        demo_header h = {i, demo_checksum(dst + 16, len - 16)};
        memcpy(dst, &h, sizeof h);
        if (i % 2) {
            CHECK(lf_publish(out, &loan, len, NULL));
        } else {
            CHECK(lf_send(out, scratch, len, DEMO_TIMEOUT_NS, NULL));
        }
    }
    printf("producer: sent %d messages of 16 B to 4 KiB (half copied, half written in place)\n", DEMO_MESSAGES);

    /* 2. latency: ping-pong of 8-byte messages. */
    double *half_rtt = malloc(sizeof(double) * DEMO_PINGS);
    if (!half_rtt) return 1;
    for (int i = 0; i < DEMO_PINGS; i++) {
        uint64_t ping = (uint64_t)i;
        lf_message pong;
        double t0 = demo_now_ns();
        CHECK(lf_send(out, &ping, sizeof ping, DEMO_TIMEOUT_NS, NULL));
        CHECK(lf_recv(in, DEMO_TIMEOUT_NS, &pong));
        half_rtt[i] = (demo_now_ns() - t0) / 2;
        uint64_t echoed;
        memcpy(&echoed, pong.data, sizeof echoed);
        CHECK(lf_release(in, &pong));
        if (echoed != ping) {
            fprintf(stderr, "producer: pong %llu for ping %llu\n", (unsigned long long)echoed, (unsigned long long)ping);
            return 1;
        }
    }
    qsort(half_rtt, DEMO_PINGS, sizeof(double), cmp_double);
    printf("producer: latency (half round trip, 8 B, %d ping-pongs): p50 %.0f ns, p99 %.0f ns\n", DEMO_PINGS,
           half_rtt[DEMO_PINGS / 2], half_rtt[DEMO_PINGS * 99 / 100]);

    /* 3. bandwidth: 1 MiB messages, every byte written in place. */
    for (uint64_t i = 0; i < DEMO_BULK; i++) {
        lf_loan_region loan;
        CHECK(lf_loan(out, DEMO_BULK_SIZE, DEMO_TIMEOUT_NS, &loan));
        memset(loan.data, (int)(i & 0xff), DEMO_BULK_SIZE);
        CHECK(lf_publish(out, &loan, DEMO_BULK_SIZE, NULL));
    }
    /* The consumer's reply says it has read everything. */
    lf_message done;
    CHECK(lf_recv(in, DEMO_TIMEOUT_NS, &done));
    CHECK(lf_release(in, &done));

    free(half_rtt);
    free(scratch);
    lf_channel_free(in);
    lf_channel_free(out);
    printf("producer: done\n");
    return 0;
}
