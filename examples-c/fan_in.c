/* A fan-in channel in C: several producer processes, one consumer, on one host.
 *
 *   lf_fan_in_c consumer NAME [PRODUCERS [MESSAGES]]
 *   lf_fan_in_c producer NAME [PRODUCERS [MESSAGES]]
 *
 * Start one consumer and PRODUCERS (4 by default) producers of channel NAME, in any order
 * (run_fan_in.sh does). Each producer sends MESSAGES (100000 by default) numbered messages and
 * closes. The consumer takes them as the channel serves the producers, in turn: it checks each
 * producer's messages against its own count (`lf_message.producer` says whose a message is),
 * lists the producers with lf_channel_peers once it has heard from all of them, and ends after
 * every producer's end (LF_ERR_PEER_GONE, with `producer` set to the slot that ended). The
 * message format is the C++ example's (examples-cpp/fan_in.cpp): either side works with the
 * other's. */
#include <lava_flow.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TIMEOUT_NS (30LL * 1000 * 1000 * 1000)

/* What a producer sends: its count, and its pid so that the consumer can match the message to
 * lf_channel_peers' entry. */
typedef struct {
    uint64_t number;
    uint64_t pid;
} fan_in_message;

static int fail(const char *who, const char *call, lf_status status) {
    fprintf(stderr, "%s: %s failed: %s\n  %s\n", who, call, lf_status_str(status), lf_last_error_message());
    return 1;
}

#define CHECK(who, call) do { lf_status s_ = (call); if (s_ != LF_OK) return fail(who, #call, s_); } while (0)

/* Opens one end of fan-in channel `name`; the consumer's `max_peers` is the one that counts. */
static lf_status open_end(lf_context *context, const char *name, lf_role role, uint32_t producers, lf_channel **out) {
    lf_location *here = NULL;
    lf_status st = lf_location_detect(&here);
    if (st != LF_OK) return st;
    lf_channel_config config;
    lf_channel_config_init(&config, sizeof config);
    config.kind = LF_CHANNEL_FAN_IN;
    config.max_peers = producers;
    config.rendezvous_timeout_ns = TIMEOUT_NS;
    st = lf_channel_create(context, name, role, here, here, &config, out);
    lf_location_free(here);
    return st;
}

static int run_producer(lf_context *context, const char *name, uint32_t producers, uint64_t messages) {
    lf_channel *ch = NULL;
    CHECK("producer", open_end(context, name, LF_ROLE_PRODUCER, producers, &ch));
    for (uint64_t i = 0; i < messages; i++) {
        fan_in_message m = {i, (uint64_t)getpid()};
        uint64_t sequence = 0;
        CHECK("producer", lf_send(ch, &m, sizeof m, TIMEOUT_NS, &sequence));
        if (sequence != i) {
            fprintf(stderr, "producer %d: message %llu got sequence number %llu\n", (int)getpid(),
                    (unsigned long long)i, (unsigned long long)sequence);
            return 1;
        }
    }
    /* Closing lets the consumer read what was sent, then see this producer's end. */
    lf_channel_free(ch);
    printf("producer %d: sent %llu messages\n", (int)getpid(), (unsigned long long)messages);
    return 0;
}

static const char *state_name(lf_peer_state state) {
    switch (state) {
    case LF_PEER_FREE: return "free";
    case LF_PEER_ALIVE: return "alive";
    case LF_PEER_GONE: return "gone";
    }
    return "?";
}

/* Prints lf_channel_peers' list; each attached producer's pid must be the one its messages
 * carry (`pids`, by slot). Returns the number of slots, or -1. */
static int print_peers(lf_channel *ch, const uint64_t *pids) {
    lf_peer peers[LF_MAX_PEERS];
    size_t count = 0;
    lf_status st = lf_channel_peers(ch, peers, sizeof(lf_peer), LF_MAX_PEERS, &count);
    if (st != LF_OK) return -fail("consumer", "lf_channel_peers", st);
    for (size_t i = 0; i < count; i++) {
        const lf_peer *p = &peers[i];
        printf("  slot %u: %s", p->slot, state_name(p->state));
        if (p->state != LF_PEER_FREE) printf(", pid %u, host %s, route %s", p->pid, p->host, p->route);
        printf("\n");
        if (p->state != LF_PEER_FREE && pids != NULL && p->pid != pids[p->slot]) {
            fprintf(stderr, "consumer: slot %u is pid %u, but its messages say pid %llu\n", p->slot, p->pid,
                    (unsigned long long)pids[p->slot]);
            return -1;
        }
    }
    return (int)count;
}

static int run_consumer(lf_context *context, const char *name, uint32_t producers, uint64_t messages) {
    lf_channel *ch = NULL;
    uint64_t next[LF_MAX_PEERS] = {0}; /* the number each slot's next message must carry */
    uint64_t pids[LF_MAX_PEERS] = {0};
    uint32_t heard = 0, ended = 0;
    uint64_t total = 0;
    CHECK("consumer", open_end(context, name, LF_ROLE_CONSUMER, producers, &ch));
    while (ended < producers) {
        lf_message m;
        lf_status st = lf_recv(ch, TIMEOUT_NS, &m);
        if (st == LF_ERR_PEER_GONE) {
            /* One producer's end, after its last message: `m.producer` is its slot, free again. */
            if (m.producer >= producers || next[m.producer] != messages) {
                fprintf(stderr, "consumer: slot %u ended after %llu of %llu messages\n", m.producer,
                        (unsigned long long)next[m.producer], (unsigned long long)messages);
                return 1;
            }
            printf("consumer: slot %u (pid %llu) ended after its %llu messages, all in order\n", m.producer,
                   (unsigned long long)pids[m.producer], (unsigned long long)messages);
            next[m.producer] = 0;
            ended++;
            continue;
        }
        CHECK("consumer", st);
        fan_in_message got;
        if (m.len != sizeof got || m.producer >= producers) {
            fprintf(stderr, "consumer: a message of %zu bytes from slot %u\n", m.len, m.producer);
            return 1;
        }
        memcpy(&got, m.data, sizeof got);
        /* Each producer's order holds: numbers and sequence numbers count up from 0 per slot. */
        if (got.number != next[m.producer] || m.sequence != got.number ||
            (got.number > 0 && got.pid != pids[m.producer])) {
            fprintf(stderr, "consumer: slot %u sent message %llu (sequence %llu, pid %llu) where %llu was due\n",
                    m.producer, (unsigned long long)got.number, (unsigned long long)m.sequence,
                    (unsigned long long)got.pid, (unsigned long long)next[m.producer]);
            return 1;
        }
        if (got.number == 0) {
            pids[m.producer] = got.pid;
            if (++heard == producers) {
                printf("consumer: heard from all %u producers; lf_channel_peers:\n", producers);
                if (print_peers(ch, pids) != (int)producers) return 1;
            }
        }
        next[m.producer]++;
        total++;
        CHECK("consumer", lf_release(ch, &m));
    }
    printf("consumer: every producer has ended; lf_channel_peers:\n");
    if (print_peers(ch, NULL) != (int)producers) return 1;
    lf_channel_free(ch);
    printf("consumer: %llu messages from %u producers, each producer's in order\n", (unsigned long long)total,
           producers);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 5 || (strcmp(argv[1], "consumer") != 0 && strcmp(argv[1], "producer") != 0)) {
        fprintf(stderr, "usage: %s consumer|producer NAME [PRODUCERS [MESSAGES]]\n", argv[0]);
        return 2;
    }
    long producers = argc > 3 ? strtol(argv[3], NULL, 10) : 4;
    long long messages = argc > 4 ? strtoll(argv[4], NULL, 10) : 100000;
    if (producers < 1 || producers > LF_MAX_PEERS || messages < 1) {
        fprintf(stderr, "PRODUCERS must be from 1 to %d, MESSAGES at least 1\n", LF_MAX_PEERS);
        return 2;
    }
    lf_context *context = NULL;
    lf_context_config context_config;
    lf_context_config_init(&context_config, sizeof context_config);
    context_config.gpu_policy = LF_GPU_DISABLED; /* CPU messages only */
    CHECK(argv[1], lf_context_create(&context_config, &context));
    int rc = strcmp(argv[1], "consumer") == 0
                 ? run_consumer(context, argv[2], (uint32_t)producers, (uint64_t)messages)
                 : run_producer(context, argv[2], (uint32_t)producers, (uint64_t)messages);
    lf_context_free(context);
    return rc;
}
