/* What the two halves of the channel demo (channel_producer.c, channel_consumer.c) share:
 * the message format, a checksum, a clock and error reporting.
 *
 * Phases, in order, each over the channel "<name>" (producer -> consumer) and, for replies,
 * "<name>.reply" (consumer -> producer):
 *   1. verify:    DEMO_MESSAGES messages of 16 B to 4 KiB, every other one written in place
 *                 through a loan; each carries its sequence number and a checksum that the
 *                 consumer checks, with the order.
 *   2. latency:   DEMO_PINGS 8-byte ping-pongs; half the round trip is the one-way latency.
 *   3. bandwidth: DEMO_BULK messages of DEMO_BULK_SIZE bytes, every byte written by the
 *                 producer and read by the consumer (touch mode).
 *   4. buffer sends: the same, but each message is a region of a buffer from lf_alloc sent
 *                 by reference (lf_send_buffer): the consumer reads the producer's pages
 *                 (LF_MESSAGE_ZERO_COPY), and the producer rewrites a region only once its
 *                 previous message is complete (lf_wait_completed).
 *   5. GPU buffers: where the producer's context has a GPU, DEVICE_LOCAL buffers sent with
 *                 lf_send_buffer: by reference through the Vulkan IPC route when the
 *                 consumer shares the GPU (lf_message_buffer + lf_buffer_read there), copied
 *                 through host memory otherwise; a marker message says which, or why the
 *                 phase is skipped. Both processes open the GPU as lf_context_create's
 *                 defaults do (GPU if there is one). */
#ifndef LAVA_FLOW_CHANNEL_DEMO_H
#define LAVA_FLOW_CHANNEL_DEMO_H

#include <lava_flow.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEMO_MESSAGES 200000
#define DEMO_PINGS 20000
#define DEMO_BULK 2000
#define DEMO_BULK_SIZE (1u << 20)
/* Phase 4 cycles through this many regions of one buffer. */
#define DEMO_REGIONS 4
#define DEMO_TIMEOUT_NS (30LL * 1000 * 1000 * 1000)

/* A verified message: header, then `len - 16` payload bytes. */
typedef struct {
    uint64_t sequence;
    uint64_t checksum;
} demo_header;

static inline size_t demo_length(uint64_t i) { return 16 + (size_t)((i * 7919u) % (4096u - 16u)); }

static inline uint8_t demo_byte(uint64_t i, size_t at) { return (uint8_t)(i * 31u + at * 7u); }

/* FNV-1a over the payload. */
static inline uint64_t demo_checksum(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t k = 0; k < n; k++) h = (h ^ p[k]) * 1099511628211ull;
    return h;
}

static inline double demo_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static inline int demo_fail(const char *who, const char *call, lf_status status) {
    fprintf(stderr, "%s: %s failed: %s\n  %s\n", who, call, lf_status_str(status), lf_last_error_message());
    return 1;
}

/* Opens one end of a channel between this process and a peer on the same host. */
static inline lf_status demo_open(lf_context *context, const char *name, lf_role role, lf_channel **out) {
    lf_location *me = NULL;
    lf_status st = lf_location_detect(&me);
    if (st != LF_OK) return st;
    lf_channel_config config;
    lf_channel_config_init(&config, sizeof config);
    config.rendezvous_timeout_ns = DEMO_TIMEOUT_NS;
    config.pool_size = 8u << 20; /* room for several 1 MiB messages in flight */
    st = lf_channel_create(context, name, role, me, me, &config, out);
    lf_location_free(me);
    return st;
}

static inline void demo_print_transport(const char *who, lf_channel *ch) {
    const char *name = "?", *reason = "?";
    lf_channel_transport(ch, &name, &reason);
    printf("%s: transport %s (%s)\n", who, name, reason);
}

#endif
