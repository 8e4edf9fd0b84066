/* A fan-out channel in C: one producer process, several consumers, on one host.
 *
 *   lf_fan_out_c producer NAME [CONSUMERS [MESSAGES]]
 *   lf_fan_out_c consumer NAME [CONSUMERS [MESSAGES]]
 *
 * Start one producer and CONSUMERS (4 by default) consumers of channel NAME, in any order
 * (run_fan_out.sh does). The producer waits until all the consumers are attached and lists
 * them (lf_channel_peers), then broadcasts MESSAGES (100000 by default) numbered messages, with
 * a new version of its "weights" (a 1 MiB lava-flow buffer) before each quarter of them. The
 * weights go by reference (lf_send_buffer): every consumer reads the same memory, and the
 * producer rewrites it only once lf_wait_completed says that every consumer released the last
 * version. Each consumer checks that it gets every message, in order, and each version's bytes,
 * then ends at the producer's end (LF_ERR_PEER_GONE). The message format is the C++ example's
 * (examples-cpp/fan_out.cpp): either side works with the other's. */
#include <lava_flow.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TIMEOUT_NS (30LL * 1000 * 1000 * 1000)
#define WEIGHTS_SIZE ((size_t)1 << 20)
#define VERSIONS 4u

/* A numbered message; the weights are told apart by their size. */
typedef struct {
    uint64_t number;
    uint64_t version; /* the weights' version it goes with */
} fan_out_message;

static int fail(const char *who, const char *call, lf_status status) {
    fprintf(stderr, "%s: %s failed: %s\n  %s\n", who, call, lf_status_str(status), lf_last_error_message());
    return 1;
}

#define CHECK(who, call) do { lf_status s_ = (call); if (s_ != LF_OK) return fail(who, #call, s_); } while (0)

/* Byte `i` of weights version `version`: every byte differs from its neighbours and from the
 * same byte of the version before. */
static uint8_t weight_byte(size_t i, uint64_t version) { return (uint8_t)(i * 131u + version * 7u + 1u); }

/* Opens one end of fan-out channel `name`; the producer's `max_peers` and `pool_size` are the ones
 * that count. */
static lf_status open_end(lf_context *context, const char *name, lf_role role, uint32_t consumers, lf_channel **out) {
    lf_location *here = NULL;
    lf_status st = lf_location_detect(&here);
    if (st != LF_OK) return st;
    lf_channel_config config;
    lf_channel_config_init(&config, sizeof config);
    config.kind = LF_CHANNEL_FAN_OUT;
    config.max_peers = consumers;
    /* The numbered messages are copied into a pool each consumer maps; the weights go by
     * reference, outside it: 1 MiB is plenty, and quick for a consumer to map as it attaches. */
    config.pool_size = 1 << 20;
    config.rendezvous_timeout_ns = TIMEOUT_NS;
    st = lf_channel_create(context, name, role, here, here, &config, out);
    lf_location_free(here);
    return st;
}

/* lf_channel_peers on the producer: its consumer slots. Prints them when `print` is set, and
 * returns how many are alive, or -1. */
static int alive_consumers(lf_channel *ch, int print) {
    lf_peer peers[LF_MAX_PEERS];
    size_t count = 0;
    int alive = 0;
    lf_status st = lf_channel_peers(ch, peers, sizeof(lf_peer), LF_MAX_PEERS, &count);
    if (st != LF_OK) return -fail("producer", "lf_channel_peers", st);
    for (size_t i = 0; i < count; i++) {
        const lf_peer *p = &peers[i];
        alive += p->state == LF_PEER_ALIVE;
        if (!print) continue;
        if (p->state == LF_PEER_ALIVE)
            printf("  slot %u: alive, pid %u, host %s, route %s\n", p->slot, p->pid, p->host, p->route);
        else
            printf("  slot %u: %s\n", p->slot, p->state == LF_PEER_FREE ? "free" : "gone");
    }
    return alive;
}

static int run_producer(lf_context *context, const char *name, uint32_t consumers, uint64_t messages) {
    lf_channel *ch = NULL;
    lf_buffer *weights = NULL;
    uint8_t *bytes = NULL;
    uint64_t weights_sequence = 0, last = 0, version = 0;
    const uint64_t per_version = (messages + VERSIONS - 1) / VERSIONS;
    CHECK("producer", open_end(context, name, LF_ROLE_PRODUCER, consumers, &ch));
    /* Creating waited for the first consumer; the others attach meanwhile, each taken up at the
     * next send: wait for all of them, so that every consumer gets every message. */
    for (int waited = 0;; waited++) {
        int alive = alive_consumers(ch, 0);
        if (alive < 0) return 1;
        if ((uint32_t)alive == consumers) break;
        if (waited == 3000) {
            fprintf(stderr, "producer: only %d of %u consumers attached within 30 s\n", alive, consumers);
            return 1;
        }
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    printf("producer: %u consumers attached; lf_channel_peers:\n", consumers);
    if (alive_consumers(ch, 1) < 0) return 1;

    CHECK("producer", lf_alloc(context, WEIGHTS_SIZE, LF_MEMORY_CPU_STANDARD, LF_UNSET, LF_HUGEPAGE_DEFAULT, &weights));
    CHECK("producer", lf_buffer_ptr(weights, (void **)&bytes));
    for (uint64_t i = 0; i < messages; i++) {
        if (i % per_version == 0) {
            /* Every consumer reads the weights where they lie: rewrite them only once the last
             * version is complete, that is released by every consumer that got it. */
            if (version > 0) {
                CHECK("producer", lf_wait_completed(ch, weights_sequence, TIMEOUT_NS));
                printf("producer: weights version %llu released by every consumer\n",
                       (unsigned long long)(version - 1));
            }
            for (size_t b = 0; b < WEIGHTS_SIZE; b++) bytes[b] = weight_byte(b, version);
            CHECK("producer", lf_send_buffer(ch, weights, 0, WEIGHTS_SIZE, TIMEOUT_NS, &weights_sequence));
            version++;
        }
        fan_out_message m = {i, version - 1};
        CHECK("producer", lf_send(ch, &m, sizeof m, TIMEOUT_NS, &last));
    }
    CHECK("producer", lf_wait_completed(ch, weights_sequence, TIMEOUT_NS));
    printf("producer: weights version %llu released by every consumer\n", (unsigned long long)(version - 1));
    CHECK("producer", lf_wait_completed(ch, last, TIMEOUT_NS));
    printf("producer: sent %llu messages and %llu versions of the weights to %d consumers\n",
           (unsigned long long)messages, (unsigned long long)version, alive_consumers(ch, 0));
    /* Closing lets each consumer read what was sent, then see the producer's end. */
    lf_channel_free(ch);
    lf_free(weights);
    return 0;
}

static int run_consumer(lf_context *context, const char *name, uint32_t consumers, uint64_t messages) {
    lf_channel *ch = NULL;
    uint64_t next = 0, versions = 0, received = 0;
    const uint64_t per_version = (messages + VERSIONS - 1) / VERSIONS;
    const uint64_t all_versions = (messages + per_version - 1) / per_version;
    const int pid = (int)getpid();
    CHECK("consumer", open_end(context, name, LF_ROLE_CONSUMER, consumers, &ch));
    for (;;) {
        lf_message m;
        lf_status st = lf_recv(ch, TIMEOUT_NS, &m);
        if (st == LF_ERR_PEER_GONE) break; /* the producer's end, after its last message */
        CHECK("consumer", st);
        /* Every message, none skipped: the consumer's sequence numbers count from 0. */
        if (m.sequence != received) {
            fprintf(stderr, "consumer %d: message %llu has sequence number %llu\n", pid,
                    (unsigned long long)received, (unsigned long long)m.sequence);
            return 1;
        }
        received++;
        if (m.len == WEIGHTS_SIZE) {
            const uint8_t *w = m.data;
            if (!(m.flags & LF_MESSAGE_ZERO_COPY)) {
                fprintf(stderr, "consumer %d: weights version %llu was copied\n", pid, (unsigned long long)versions);
                return 1;
            }
            for (size_t b = 0; b < WEIGHTS_SIZE; b++) {
                if (w[b] != weight_byte(b, versions)) {
                    fprintf(stderr, "consumer %d: byte %zu of weights version %llu is %u, not %u\n", pid, b,
                            (unsigned long long)versions, w[b], weight_byte(b, versions));
                    return 1;
                }
            }
            versions++;
        } else {
            fan_out_message got;
            if (m.len != sizeof got) {
                fprintf(stderr, "consumer %d: a message of %zu bytes\n", pid, m.len);
                return 1;
            }
            memcpy(&got, m.data, sizeof got);
            if (got.number != next || versions == 0 || got.version != versions - 1) {
                fprintf(stderr, "consumer %d: message %llu (weights version %llu) where %llu (version %llu) was due\n",
                        pid, (unsigned long long)got.number, (unsigned long long)got.version,
                        (unsigned long long)next, (unsigned long long)(versions - 1));
                return 1;
            }
            next++;
        }
        /* Releasing the weights lets the producer rewrite them once every consumer has. */
        CHECK("consumer", lf_release(ch, &m));
    }
    lf_channel_free(ch);
    if (next != messages || versions != all_versions) {
        fprintf(stderr, "consumer %d: the producer ended after %llu of %llu messages and %llu versions\n", pid,
                (unsigned long long)next, (unsigned long long)messages, (unsigned long long)versions);
        return 1;
    }
    printf("consumer %d: %llu messages in order and %llu versions of the weights, each byte checked\n", pid,
           (unsigned long long)next, (unsigned long long)versions);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 5 || (strcmp(argv[1], "consumer") != 0 && strcmp(argv[1], "producer") != 0)) {
        fprintf(stderr, "usage: %s producer|consumer NAME [CONSUMERS [MESSAGES]]\n", argv[0]);
        return 2;
    }
    long consumers = argc > 3 ? strtol(argv[3], NULL, 10) : 4;
    long long messages = argc > 4 ? strtoll(argv[4], NULL, 10) : 100000;
    if (consumers < 1 || consumers > LF_MAX_PEERS || messages < VERSIONS) {
        fprintf(stderr, "CONSUMERS must be from 1 to %d, MESSAGES at least %u\n", LF_MAX_PEERS, VERSIONS);
        return 2;
    }
    lf_context *context = NULL;
    lf_context_config context_config;
    lf_context_config_init(&context_config, sizeof context_config);
    context_config.gpu_policy = LF_GPU_DISABLED; /* CPU messages only */
    CHECK(argv[1], lf_context_create(&context_config, &context));
    int rc = strcmp(argv[1], "producer") == 0
                 ? run_producer(context, argv[2], (uint32_t)consumers, (uint64_t)messages)
                 : run_consumer(context, argv[2], (uint32_t)consumers, (uint64_t)messages);
    lf_context_free(context);
    return rc;
}
