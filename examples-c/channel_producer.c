/* The producer half of the two-process channel demo (see channel_demo.h):
 *   lf_channel_producer NAME
 * Start lf_channel_consumer NAME too, in either order.
 *
 * After the phases of channel_demo.h comes 5. GPU buffers: where this process's context has a
 * GPU, a marker message "GPU <count> <how>" and then DEMO_GPU_BUFFERS messages, each a 1 MiB
 * DEVICE_LOCAL buffer (one of DEMO_REGIONS, written with lf_buffer_write, rewritten only once
 * its previous message is complete) sent with lf_send_buffer: by reference through the Vulkan
 * IPC route where the consumer shares the GPU, else staged (copied through host memory). <how>
 * is this end's sentence on GPU buffers: how they are synchronised, or why they are staged.
 * Without a GPU the marker is "no GPU <why>" and nothing else follows. */
#include "channel_demo.h"

#define DEMO_GPU_BUFFERS 16

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
    lf_context *context = NULL;
    /* The defaults: the GPU opened where there is one (phase 5), CPU memory otherwise. */
    CHECK(lf_context_create(NULL, &context));
    CHECK(demo_open(context, argv[1], LF_ROLE_PRODUCER, &out));
    CHECK(demo_open(context, reply_name, LF_ROLE_CONSUMER, &in));
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

    /* 4. buffer sends: regions of one lava-flow buffer, by reference. */
    lf_buffer *buffer = NULL;
    void *base = NULL;
    uint64_t sent[DEMO_REGIONS];
    CHECK(lf_alloc(context, (size_t)DEMO_REGIONS * DEMO_BULK_SIZE, LF_MEMORY_CPU_STANDARD, LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffer));
    CHECK(lf_buffer_ptr(buffer, &base));
    for (uint64_t i = 0; i < DEMO_BULK; i++) {
        size_t region = (size_t)(i % DEMO_REGIONS);
        /* The consumer may still be reading this region's previous message. */
        if (i >= DEMO_REGIONS) CHECK(lf_wait_completed(out, sent[region], DEMO_TIMEOUT_NS));
        memset((uint8_t *)base + region * DEMO_BULK_SIZE, (int)(i & 0xff), DEMO_BULK_SIZE);
        CHECK(lf_send_buffer(out, buffer, region * DEMO_BULK_SIZE, DEMO_BULK_SIZE, DEMO_TIMEOUT_NS, &sent[region]));
    }
    /* 5. GPU buffers, where this process has a GPU; the marker tells the consumer what follows. */
    const char *no_gpu = NULL;
    char marker[1024];
    lf_buffer *gpu[DEMO_REGIONS] = {NULL};
    CHECK(lf_context_gpu_unavailable_reason(context, &no_gpu));
    if (no_gpu != NULL) {
        snprintf(marker, sizeof marker, "no GPU %s", no_gpu);
        CHECK(lf_send(out, marker, strlen(marker) + 1, DEMO_TIMEOUT_NS, NULL));
        printf("producer: GPU buffers skipped: this process has no Vulkan device (%s)\n", no_gpu);
    } else {
        /* This end's word on GPU buffers: the synchronisation sentence when they go by
         * reference, else the sentence on why they are staged. */
        const char *transport = "?", *reason = "?", *how = NULL;
        CHECK(lf_channel_transport(out, &transport, &reason));
        int by_reference = strcmp(transport, "shm+vulkan_ipc") == 0;
        if (by_reference) {
            how = strstr(reason, "host-side synchronisation");
            if (how == NULL) how = strstr(reason, "GPU-side synchronisation");
        } else {
            how = strstr(reason, "GPU buffers:");
        }
        if (how == NULL) how = reason;
        snprintf(marker, sizeof marker, "GPU %d %s", DEMO_GPU_BUFFERS, how);
        CHECK(lf_send(out, marker, strlen(marker) + 1, DEMO_TIMEOUT_NS, NULL));
        uint8_t *pattern = malloc(DEMO_BULK_SIZE);
        if (!pattern) return 1;
        for (int b = 0; b < DEMO_REGIONS; b++)
            CHECK(lf_alloc(context, DEMO_BULK_SIZE, LF_MEMORY_GPU_DEVICE_LOCAL, LF_UNSET, LF_HUGEPAGE_DEFAULT, &gpu[b]));
        for (uint64_t i = 0; i < DEMO_GPU_BUFFERS; i++) {
            size_t b = (size_t)(i % DEMO_REGIONS);
            /* By reference, the consumer may still be reading this buffer's previous message. */
            if (i >= DEMO_REGIONS) CHECK(lf_wait_completed(out, sent[b], DEMO_TIMEOUT_NS));
            for (size_t at = 0; at < DEMO_BULK_SIZE; at++) pattern[at] = demo_byte(i, at);
            CHECK(lf_buffer_write(gpu[b], 0, pattern, DEMO_BULK_SIZE));
            CHECK(lf_send_buffer(out, gpu[b], 0, DEMO_BULK_SIZE, DEMO_TIMEOUT_NS, &sent[b]));
        }
        free(pattern);
        printf("producer: sent %d GPU buffers (DEVICE_LOCAL, 1 MiB each) %s %s\n", DEMO_GPU_BUFFERS,
               by_reference ? "by reference through" : "staged through", transport);
    }

    /* The consumer's reply says it has read everything. */
    lf_message done;
    CHECK(lf_recv(in, DEMO_TIMEOUT_NS, &done));
    CHECK(lf_release(in, &done));

    lf_free(buffer); /* every message pointing into it is complete */
    for (int b = 0; b < DEMO_REGIONS; b++) lf_free(gpu[b]);
    free(half_rtt);
    free(scratch);
    lf_channel_free(in);
    lf_channel_free(out);
    lf_context_free(context);
    printf("producer: done\n");
    return 0;
}
