/* The software cost of one message through the C API, without a second core: a producer and
 * a consumer of one channel in this process (default config, busy-poll), each message sent,
 * received, released and (for buffer sends) waited for on this thread. Run it under
 * `valgrind --tool=callgrind` for instruction counts per message (repeatable whatever the
 * machine is doing), or plainly for ns per message.
 *
 *   cc -O2 benchmarks/msg_path_cost.c -Iinclude -Ltarget/release -llava_flow -lpthread \
 *      -o msg_path_cost && LD_LIBRARY_PATH=target/release ./msg_path_cost [iters [case]]
 *
 * (The program looks for the library's SONAME, liblava_flow.so.<ABI version>, which cargo does
 * not make: `ln -sf liblava_flow.so target/release/$(objdump -p target/release/liblava_flow.so
 * | awk '/SONAME/ {print $2}')` once, or build against an installed prefix.)
 */
#include <lava_flow.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK(call)                                                                 \
    do {                                                                            \
        lf_status s_ = (call);                                                      \
        if (s_ != LF_OK) {                                                          \
            fprintf(stderr, "%s: %s\n", #call, lf_last_error_message());            \
            exit(1);                                                                \
        }                                                                           \
    } while (0)

static lf_context *ctx;
static lf_location *here;
static lf_channel_config cfg;
static char name[64];

static void *open_consumer(void *out) {
    CHECK(lf_channel_create(ctx, name, LF_ROLE_CONSUMER, here, here, &cfg, (lf_channel **)out));
    return NULL;
}

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

enum kind { COPY, LOAN, BUFFER, BUFFER_REF };
static const char *names[] = {"lf_send (copy)", "lf_loan + lf_publish", "lf_send_buffer + lf_wait_completed",
                              "the same, 4 KiB (by reference)"};
/* Bytes per message: 8, but 4 KiB for the buffer send that goes by reference (over 112 bytes). */
static size_t size_of_kind(enum kind k) { return k == BUFFER_REF ? 4096 : 8; }

static double run(lf_channel *tx, lf_channel *rx, enum kind k, size_t size, long iters, int64_t timeout,
                  const char *src, lf_buffer *buf, char *buf_ptr) {
    double t0 = now_ns();
    for (long i = 0; i < iters; i++) {
        uint64_t seq = 0;
        switch (k) {
        case COPY:
            CHECK(lf_send(tx, src, size, timeout, &seq));
            break;
        case LOAN: {
            lf_loan_region loan;
            CHECK(lf_loan(tx, size, timeout, &loan));
            memcpy(loan.data, src, size);
            CHECK(lf_publish(tx, &loan, size, &seq));
            break;
        }
        case BUFFER:
        case BUFFER_REF:
            memcpy(buf_ptr, src, size);
            CHECK(lf_send_buffer(tx, buf, 0, size, timeout, &seq));
            break;
        }
        lf_message m;
        CHECK(lf_recv(rx, timeout, &m));
        if (((const char *)m.data)[size - 1] != src[size - 1]) abort();
        CHECK(lf_release(rx, &m));
        if (k >= BUFFER) CHECK(lf_wait_completed(tx, seq, timeout));
    }
    return (now_ns() - t0) / iters;
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 1000000;
    int only = argc > 2 ? atoi(argv[2]) : -1; /* one case, 0..7, for instruction counts */
    snprintf(name, sizeof name, "mpc%d", (int)getpid());
    CHECK(lf_context_create(NULL, &ctx));
    CHECK(lf_location_detect(&here));
    CHECK(lf_channel_config_init(&cfg, sizeof cfg));
    cfg.wait_strategy = LF_WAIT_BUSY_POLL;
    lf_channel *tx, *rx;
    pthread_t t;
    pthread_create(&t, NULL, open_consumer, &rx);
    CHECK(lf_channel_create(ctx, name, LF_ROLE_PRODUCER, here, here, &cfg, &tx));
    pthread_join(t, NULL);
    static char src[4096];
    memset(src, 7, sizeof src);
    lf_buffer *buf;
    CHECK(lf_alloc(ctx, sizeof src, LF_MEMORY_CPU_STANDARD, -1, LF_HUGEPAGE_DEFAULT, &buf));
    void *buf_ptr;
    CHECK(lf_buffer_ptr(buf, &buf_ptr));
    printf("ns per message (send, receive, release on one thread), 8 B, default config, busy-poll\n");
    for (int k = COPY; k <= BUFFER_REF; k++) {
        for (int timed = 0; timed < 2; timed++) {
            if (only >= 0 && only != k * 2 + timed) continue;
            int64_t timeout = timed ? 1000000000 : -1;
            run(tx, rx, k, size_of_kind(k), iters / 10, timeout, src, buf, buf_ptr);
            double ns = run(tx, rx, k, size_of_kind(k), iters, timeout, src, buf, buf_ptr);
            printf("  %-36s timeout %-8s %7.1f\n", names[k], timed ? "1 s" : "none", ns);
        }
    }
    lf_free(buf);
    lf_channel_free(tx);
    lf_channel_free(rx);
    lf_location_free(here);
    lf_context_free(ctx);
    return 0;
}
