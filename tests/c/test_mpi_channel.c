/* Channels through the C API under mpirun, with the peers' locations from MPI discovery:
 *
 *   test_mpi_channel pair   two ranks on different "hosts" (LF_HOST_ID per app context): a
 *                           channel over MPI; copies (inline and chunked), loans and buffer
 *                           sends in one order, exactly once; completion, also of a message
 *                           the consumer released before it stopped calling lava-flow; a
 *                           receive timeout; the producer's close seen as LF_ERR_PEER_GONE.
 *                           The application initialises and finalizes MPI itself
 *                           (MPI_THREAD_MULTIPLE).
 *   test_mpi_channel million  10^6 small messages from one "host" to another, each checked.
 *   test_mpi_channel ring   four ranks, two per "host": rank r produces to rank r+1 (mod 4),
 *                           so two channels stay on one host (shm) and two cross hosts (mpi),
 *                           with the same code; each report says which. lava-flow initialises
 *                           MPI.
 *   test_mpi_channel fan-in four ranks on two "hosts" (a, a, b, b): rank 0 consumes a fan-in
 *                           whose producers are rank 1 over shared memory and ranks 2 and 3 over
 *                           MPI; each producer's messages in its order under one slot;
 *                           lf_channel_peers says each slot's route, rank and host; rank 3 ends
 *                           early and its LF_ERR_PEER_GONE names its slot while the others go on.
 *
 * Every rank checks what it sees and exits non-zero on any failure, so mpirun fails. */
#define _GNU_SOURCE /* readlink, for check.h's descriptor count */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;
#include "check.h"

#define SECOND 1000000000LL

static int world_rank = -1;

/* Message `seq`: mostly small, some above the inline limit, a few chunked (2 MiB). */
static size_t size_of(uint64_t seq) {
    if (seq % 500 == 499) return 2u << 20;
    if (seq % 10 == 9) return 70000;
    return 8 + (size_t)(seq * 13 % 200);
}

static void fill(unsigned char *p, size_t len, uint64_t seq) {
    memcpy(p, &seq, 8);
    for (size_t i = 8; i < len; i++) p[i] = (unsigned char)(seq + i);
}

static int check_message(const lf_message *m, uint64_t seq) {
    if (m->len != size_of(seq) || m->sequence != seq) return 0;
    const unsigned char *p = m->data;
    uint64_t got;
    memcpy(&got, p, 8);
    if (got != seq) return 0;
    for (size_t i = 8; i < m->len; i++)
        if (p[i] != (unsigned char)(seq + i)) return 0;
    return 1;
}

static lf_channel *open_channel(lf_context *ctx, lf_mpi *mpi, const char *name, lf_role role, int32_t peer) {
    lf_location *mine = NULL, *theirs = NULL;
    lf_channel *ch = NULL;
    EXPECT(lf_mpi_location(mpi, world_rank, &mine), LF_OK);
    EXPECT(lf_mpi_location(mpi, peer, &theirs), LF_OK);
    lf_channel_config cfg;
    EXPECT(lf_channel_config_init(&cfg, sizeof cfg), LF_OK);
    cfg.rendezvous_timeout_ns = 60 * SECOND;
    cfg.capacity = 32;
    EXPECT(lf_channel_create(ctx, name, role, mine, theirs, &cfg, &ch), LF_OK);
    lf_location_free(mine);
    lf_location_free(theirs);
    return ch;
}

static const char *transport_of(lf_channel *ch) {
    const char *name = NULL, *reason = NULL;
    EXPECT(lf_channel_transport(ch, &name, &reason), LF_OK);
    printf("[rank %d] transport %s: %s\n", world_rank, name ? name : "?", reason ? reason : "?");
    return name ? name : "";
}

static void produce(lf_context *ctx, lf_channel *ch, uint64_t count) {
    lf_buffer *buffer = NULL;
    void *base = NULL;
    EXPECT(lf_alloc(ctx, 2u << 20, LF_MEMORY_CPU_STANDARD, -1, LF_HUGEPAGE_DEFAULT, &buffer), LF_OK);
    EXPECT(lf_buffer_ptr(buffer, &base), LF_OK);
    unsigned char *scratch = malloc(2u << 20);
    for (uint64_t seq = 0; seq < count && failures == 0; seq++) {
        size_t len = size_of(seq);
        uint64_t sent = UINT64_MAX;
        switch (seq % 3) {
        case 0:
            fill(scratch, len, seq);
            EXPECT(lf_send(ch, scratch, len, 60 * SECOND, &sent), LF_OK);
            break;
        case 1: {
            lf_loan_region loan;
            EXPECT(lf_loan(ch, len, 60 * SECOND, &loan), LF_OK);
            fill(loan.data, len, seq);
            EXPECT(lf_publish(ch, &loan, len, &sent), LF_OK);
            break;
        }
        default:
            fill(base, len, seq);
            EXPECT(lf_send_buffer(ch, buffer, 0, len, 60 * SECOND, &sent), LF_OK);
            /* The buffer is reused: wait until the consumer has released this message. */
            EXPECT(lf_wait_completed(ch, sent, 60 * SECOND), LF_OK);
            break;
        }
        CHECK(sent == seq);
    }
    EXPECT(lf_wait_completed(ch, count - 1, 60 * SECOND), LF_OK);
    /* Messages never sent are refused, the last sequence number a 64-bit counter holds too. */
    EXPECT(lf_wait_completed(ch, count, 0), LF_ERR_INVALID_ARGUMENT);
    EXPECT(lf_wait_completed(ch, UINT64_MAX, 0), LF_ERR_INVALID_ARGUMENT);
    /* Too large for the channel: refused, saying why. */
    EXPECT(lf_send(ch, scratch, (size_t)64 << 20, SECOND, NULL), LF_ERR_INVALID_ARGUMENT);
    free(scratch);
    lf_free(buffer);
}

static void consume(lf_channel *ch, uint64_t count) {
    lf_message held;
    int holding = 0;
    for (uint64_t seq = 0; seq < count && failures == 0; seq++) {
        lf_message m;
        EXPECT(lf_recv(ch, 60 * SECOND, &m), LF_OK);
        if (!check_message(&m, seq)) {
            fprintf(stderr, "[rank %d] message %llu is wrong (sequence %llu, %zu bytes)\n", world_rank,
                    (unsigned long long)seq, (unsigned long long)m.sequence, m.len);
            failures++;
        }
        /* Buffer sends of more than 112 bytes go by reference; shorter ones are copied. */
        CHECK(((m.flags & LF_MESSAGE_ZERO_COPY) != 0) == (seq % 3 == 2 && m.len > 112));
        /* Message 3k is released after 3k + 1: out of order, before the buffer send 3k + 2. */
        if (seq % 3 == 0) {
            held = m;
            holding = 1;
        } else {
            EXPECT(lf_release(ch, &m), LF_OK);
            if (holding) EXPECT(lf_release(ch, &held), LF_OK);
            holding = 0;
        }
    }
    if (holding) EXPECT(lf_release(ch, &held), LF_OK);
    /* A view released twice is refused. */
    lf_message again = held;
    EXPECT(lf_release(ch, &again), LF_ERR_INVALID_STATE);
}

static int run_pair(void) {
    int provided = 0;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    lf_mpi *mpi = NULL;
    lf_context *ctx = NULL;
    EXPECT(lf_mpi_join(LF_MPI_COMM_WORLD, NULL, &mpi), LF_OK);
    EXPECT(lf_context_create(NULL, &ctx), LF_OK);
    if (mpi == NULL || ctx == NULL) return 1;
    const uint64_t count = 30000;
    if (world_rank == 0) {
        lf_channel *ch = open_channel(ctx, mpi, "pair", LF_ROLE_PRODUCER, 1);
        if (ch == NULL) return 1;
        CHECK(strcmp(transport_of(ch), "mpi") == 0);
        produce(ctx, ch, count);
        /* The consumer releases these, then waits in MPI_Barrier, calling no lava-flow
         * function: the completion comes all the same (lava-flow's own thread sends it). The
         * first takes the credit that any request of the producer's already answered may still
         * cause, so that none covers the second. */
        uint64_t quiet = UINT64_MAX;
        EXPECT(lf_send(ch, "first", 5, 60 * SECOND, NULL), LF_OK);
        EXPECT(lf_send(ch, "quiet", 5, 60 * SECOND, &quiet), LF_OK);
        EXPECT(lf_wait_completed(ch, quiet, 2 * SECOND), LF_OK);
        /* A message never sent: refused, not waited for. */
        EXPECT(lf_wait_completed(ch, quiet + 1, SECOND), LF_ERR_INVALID_ARGUMENT);
        MPI_Barrier(MPI_COMM_WORLD);
        lf_channel_free(ch);
        /* A location that did not come from MPI discovery cannot reach another host. */
        lf_location *mine = NULL, *far = NULL;
        lf_channel *none = NULL;
        EXPECT(lf_location_detect(&mine), LF_OK);
        EXPECT(lf_location_new("elsewhere", LF_UNSET, LF_UNSET, &far), LF_OK);
        lf_channel_config cfg;
        EXPECT(lf_channel_config_init(&cfg, sizeof cfg), LF_OK);
        EXPECT(lf_channel_create(ctx, "nowhere", LF_ROLE_PRODUCER, mine, far, &cfg, &none), LF_ERR_UNSUPPORTED);
        EXPECT_MESSAGE("MPI discovery");
        lf_location_free(mine);
        lf_location_free(far);
    } else {
        lf_channel *ch = open_channel(ctx, mpi, "pair", LF_ROLE_CONSUMER, 0);
        if (ch == NULL) return 1;
        CHECK(strcmp(transport_of(ch), "mpi") == 0);
        consume(ch, count);
        lf_message m;
        EXPECT(lf_recv(ch, 60 * SECOND, &m), LF_OK);
        CHECK(m.len == 5 && memcmp(m.data, "first", 5) == 0);
        EXPECT(lf_release(ch, &m), LF_OK);
        EXPECT(lf_recv(ch, 60 * SECOND, &m), LF_OK);
        CHECK(m.len == 5 && memcmp(m.data, "quiet", 5) == 0);
        EXPECT(lf_release(ch, &m), LF_OK);
        MPI_Barrier(MPI_COMM_WORLD);
        /* Then the producer closes: PEER_GONE, after a timeout or two while it finishes. */
        lf_status s;
        while ((s = lf_recv(ch, 60 * SECOND, &m)) == LF_ERR_TIMEOUT) {
        }
        EXPECT(s, LF_ERR_PEER_GONE);
        EXPECT(lf_try_recv(ch, &m), LF_ERR_PEER_GONE);
        lf_channel_free(ch);
    }
    lf_context_free(ctx);
    lf_mpi_free(mpi);
    int flag = 0;
    MPI_Finalized(&flag);
    CHECK(!flag); /* the application's MPI: lava-flow leaves it running */
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return failures ? 1 : 0;
}

/* 10^6 small messages streamed across hosts, each checked: order and exactly once at volume. */
static int run_million(void) {
    lf_mpi *mpi = NULL;
    lf_context *ctx = NULL;
    EXPECT(lf_mpi_join(LF_MPI_COMM_WORLD, NULL, &mpi), LF_OK);
    EXPECT(lf_context_create(NULL, &ctx), LF_OK);
    if (mpi == NULL || ctx == NULL) return 1;
    EXPECT(lf_mpi_rank(mpi, &world_rank), LF_OK);
    const uint64_t count = 1000000;
    unsigned char msg[64];
    lf_channel *ch = open_channel(ctx, mpi, "million", world_rank == 0 ? LF_ROLE_PRODUCER : LF_ROLE_CONSUMER, 1 - world_rank);
    if (ch == NULL) return 1;
    CHECK(strcmp(transport_of(ch), "mpi") == 0);
    for (uint64_t seq = 0; seq < count && failures == 0; seq++) {
        size_t len = 8 + (size_t)(seq % 56);
        if (world_rank == 0) {
            fill(msg, len, seq);
            EXPECT(lf_send(ch, msg, len, 60 * SECOND, NULL), LF_OK);
        } else {
            lf_message m;
            EXPECT(lf_recv(ch, 60 * SECOND, &m), LF_OK);
            fill(msg, len, seq);
            if (m.sequence != seq || m.len != len || memcmp(m.data, msg, len) != 0) {
                fprintf(stderr, "[rank %d] message %llu is wrong\n", world_rank, (unsigned long long)seq);
                failures++;
            }
            EXPECT(lf_release(ch, &m), LF_OK);
        }
    }
    if (world_rank == 0) EXPECT(lf_wait_completed(ch, count - 1, 60 * SECOND), LF_OK);
    lf_channel_free(ch);
    lf_context_free(ctx);
    lf_mpi_free(mpi);
    return failures ? 1 : 0;
}

static int run_ring(void) {
    lf_mpi *mpi = NULL;
    lf_context *ctx = NULL;
    EXPECT(lf_mpi_join(LF_MPI_COMM_WORLD, NULL, &mpi), LF_OK);
    EXPECT(lf_context_create(NULL, &ctx), LF_OK);
    if (mpi == NULL || ctx == NULL) return 1;
    int32_t size = 0;
    EXPECT(lf_mpi_rank(mpi, &world_rank), LF_OK);
    EXPECT(lf_mpi_size(mpi, &size), LF_OK);
    CHECK(size == 4);
    int32_t next = (world_rank + 1) % size, prev = (world_rank + size - 1) % size;
    /* Ranks 0, 1 share one host, 2, 3 the other: 0->1 and 2->3 stay local. */
    int local_out = world_rank % 2 == 0;
    char out_name[32], in_name[32];
    snprintf(out_name, sizeof out_name, "ring-%d", (int)world_rank);
    snprintf(in_name, sizeof in_name, "ring-%d", (int)prev);
    /* Producers on even ranks first, so every rendezvous has its peer waiting. */
    lf_channel *out = NULL, *in = NULL;
    if (world_rank % 2 == 0) {
        out = open_channel(ctx, mpi, out_name, LF_ROLE_PRODUCER, next);
        in = open_channel(ctx, mpi, in_name, LF_ROLE_CONSUMER, prev);
    } else {
        in = open_channel(ctx, mpi, in_name, LF_ROLE_CONSUMER, prev);
        out = open_channel(ctx, mpi, out_name, LF_ROLE_PRODUCER, next);
    }
    if (out == NULL || in == NULL) return 1;
    /* Local channels are "shm" (or "shm+vulkan_ipc" where there is a GPU), remote ones "mpi". */
    CHECK(strncmp(transport_of(out), local_out ? "shm" : "mpi", 3) == 0);
    CHECK(strncmp(transport_of(in), local_out ? "mpi" : "shm", 3) == 0);
    const uint64_t count = 2000;
    unsigned char *scratch = malloc(2u << 20);
    for (uint64_t seq = 0; seq < count && failures == 0; seq++) {
        size_t len = size_of(seq);
        fill(scratch, len, seq);
        EXPECT(lf_send(out, scratch, len, 60 * SECOND, NULL), LF_OK);
        lf_message m;
        EXPECT(lf_recv(in, 60 * SECOND, &m), LF_OK);
        CHECK(check_message(&m, seq));
        EXPECT(lf_release(in, &m), LF_OK);
    }
    free(scratch);
    lf_channel_free(out);
    lf_channel_free(in);
    lf_context_free(ctx);
    lf_mpi_free(mpi); /* lava-flow initialised MPI: this finalizes it */
    return failures ? 1 : 0;
}

/* The fan-in's messages: producer `rank`'s message `seq` is a little longer than size_of
 * says, its sequence number and rank first, then bytes derived from both. */
#define FAN_COUNT 3000u
#define FAN_EARLY 400u
/* Rank 0 tells rank 3 when it has messages of all three producers (rank 3 closes only then),
 * and ranks 1 and 2 when rank 3's end was reported (they wait for it halfway), on
 * MPI_COMM_WORLD, which lava-flow does not use: it works on a duplicate. */
#define TAG_ALL_SEEN 7
#define TAG_EARLY_END 8

static size_t fan_size_of(uint64_t seq) { return size_of(seq) + 8; }

static void fill_from(unsigned char *p, size_t len, uint32_t rank, uint64_t seq) {
    memcpy(p, &seq, 8);
    memcpy(p + 8, &rank, 4);
    for (size_t i = 12; i < len; i++) p[i] = (unsigned char)(seq + rank + i);
}

/* The sender's rank where `m` is message `seq` of it with the right bytes, else -1. */
static int32_t sender_of(const lf_message *m) {
    uint64_t seq;
    uint32_t rank;
    if (m->len < 12) return -1;
    const unsigned char *p = m->data;
    memcpy(&seq, p, 8);
    memcpy(&rank, p + 8, 4);
    if (rank < 1 || rank > 3 || m->len != fan_size_of(seq) || m->sequence != seq) return -1;
    for (size_t i = 12; i < m->len; i++)
        if (p[i] != (unsigned char)(seq + rank + i)) return -1;
    return (int32_t)rank;
}

static lf_channel *open_fan_in(lf_context *ctx, lf_mpi *mpi, lf_role role, int32_t peer) {
    lf_location *mine = NULL, *theirs = NULL;
    lf_channel *ch = NULL;
    EXPECT(lf_mpi_location(mpi, world_rank, &mine), LF_OK);
    EXPECT(lf_mpi_location(mpi, peer, &theirs), LF_OK);
    lf_channel_config cfg;
    EXPECT(lf_channel_config_init(&cfg, sizeof cfg), LF_OK);
    cfg.kind = LF_CHANNEL_FAN_IN;
    cfg.max_peers = 4;
    cfg.rendezvous_timeout_ns = 60 * SECOND;
    cfg.capacity = 32;
    EXPECT(lf_channel_create(ctx, "fan-in-hosts", role, mine, theirs, &cfg, &ch), LF_OK);
    lf_location_free(mine);
    lf_location_free(theirs);
    return ch;
}

static const char *hostname_of(lf_mpi *mpi, int32_t rank, char *out, size_t size) {
    lf_location *loc = NULL;
    const char *name = NULL;
    out[0] = '\0';
    EXPECT(lf_mpi_location(mpi, rank, &loc), LF_OK);
    if (loc != NULL && lf_location_hostname(loc, &name) == LF_OK) snprintf(out, size, "%s", name);
    lf_location_free(loc);
    return out;
}

/* What lf_channel_peers says of the slot that carries `rank`'s messages. */
static void check_peer(lf_channel *ch, lf_mpi *mpi, uint32_t slot, int32_t rank) {
    lf_peer peers[4];
    size_t count = 0;
    char host[LF_PEER_HOST_SIZE];
    EXPECT(lf_channel_peers(ch, peers, sizeof(lf_peer), 4, &count), LF_OK);
    CHECK(count == 4 && slot < 4);
    if (count != 4 || slot >= 4) return;
    const lf_peer *p = &peers[slot];
    CHECK(p->slot == slot && p->state == LF_PEER_ALIVE);
    CHECK(strcmp(p->host, hostname_of(mpi, rank, host, sizeof host)) == 0);
    if (rank == 1) {
        /* Same host: shared memory, no rank, its pid. */
        CHECK(strcmp(p->route, "shm") == 0 && p->rank == -1 && p->pid != 0);
    } else {
        /* The other host: MPI, its rank, no pid. */
        CHECK(strcmp(p->route, "mpi") == 0 && p->rank == rank && p->pid == 0);
    }
    printf("[rank 0] slot %u: rank %d, route %s, host %s\n", slot, (int)rank, p->route, p->host);
}

static void fan_in_consume(lf_channel *ch, lf_mpi *mpi) {
    const char *name = NULL, *reason = NULL;
    EXPECT(lf_channel_transport(ch, &name, &reason), LF_OK);
    CHECK(reason != NULL && strstr(reason, "takes producers over shm and mpi") != NULL);
    int32_t rank_of_slot[4] = {-1, -1, -1, -1};
    uint64_t next[4] = {0, 0, 0, 0};
    int ended[3], ends = 0, all_seen = 0;
    uint64_t after_early_end = 0;
    while (ends < 3 && failures == 0) {
        lf_message m;
        lf_status s = lf_recv(ch, 60 * SECOND, &m);
        if (s == LF_ERR_PEER_GONE) {
            /* One producer's end, naming its slot, after its last message. */
            uint32_t slot = m.producer;
            char said[16];
            snprintf(said, sizeof said, "slot %u", slot);
            EXPECT_MESSAGE(said);
            CHECK(slot < 4 && rank_of_slot[slot] > 0);
            if (slot >= 4 || rank_of_slot[slot] <= 0) break;
            int32_t rank = rank_of_slot[slot];
            CHECK(next[rank] == (rank == 3 ? FAN_EARLY : FAN_COUNT));
            CHECK(rank != 3 || ends == 0);
            printf("[rank 0] rank %d (slot %u) ended after %llu messages\n", (int)rank, slot,
                   (unsigned long long)next[rank]);
            ended[ends++] = rank;
            rank_of_slot[slot] = -1;
            lf_peer peers[4];
            size_t count = 0;
            EXPECT(lf_channel_peers(ch, peers, sizeof(lf_peer), 4, &count), LF_OK);
            CHECK(count == 4 && peers[slot].state == LF_PEER_FREE && peers[slot].route[0] == '\0');
            if (rank == 3) {
                int go = 1;
                MPI_Send(&go, 1, MPI_INT, 1, TAG_EARLY_END, MPI_COMM_WORLD);
                MPI_Send(&go, 1, MPI_INT, 2, TAG_EARLY_END, MPI_COMM_WORLD);
            }
            continue;
        }
        EXPECT(s, LF_OK);
        if (s != LF_OK) break;
        int32_t rank = sender_of(&m);
        uint32_t slot = m.producer;
        CHECK(rank > 0 && slot < 4);
        if (rank <= 0 || slot >= 4) {
            fprintf(stderr, "[rank 0] a wrong message: %zu bytes, sequence %llu, slot %u\n", m.len,
                    (unsigned long long)m.sequence, slot);
            break;
        }
        /* Each producer's messages in its order, each under its own slot. */
        CHECK(m.sequence == next[rank]);
        next[rank] = m.sequence + 1;
        if (rank_of_slot[slot] < 0) {
            rank_of_slot[slot] = rank;
            check_peer(ch, mpi, slot, rank);
        }
        CHECK(rank_of_slot[slot] == rank);
        if (ends > 0) after_early_end++;
        if (!all_seen && next[1] && next[2] && next[3] && ends == 0) {
            /* All three attached at once: one slot is left free. */
            lf_peer peers[4];
            size_t count = 0, free_slots = 0;
            all_seen = 1;
            EXPECT(lf_channel_peers(ch, peers, sizeof(lf_peer), 4, &count), LF_OK);
            for (size_t i = 0; i < count; i++) free_slots += peers[i].state == LF_PEER_FREE;
            CHECK(count == 4 && free_slots == 1);
            int go = 1;
            MPI_Send(&go, 1, MPI_INT, 3, TAG_ALL_SEEN, MPI_COMM_WORLD);
        }
        EXPECT(lf_release(ch, &m), LF_OK);
    }
    CHECK(all_seen);
    CHECK(ends == 3 && ended[0] == 3);
    /* The others went on after rank 3's end: their second halves came after it. */
    CHECK(after_early_end >= FAN_COUNT);
    lf_message m;
    EXPECT(lf_try_recv(ch, &m), LF_ERR_WOULD_BLOCK);
}

static void fan_in_produce(lf_channel *ch) {
    const uint64_t count = world_rank == 3 ? FAN_EARLY : FAN_COUNT;
    unsigned char *scratch = malloc((2u << 20) + 8);
    uint32_t rank = (uint32_t)world_rank;
    for (uint64_t seq = 0; seq < count && failures == 0; seq++) {
        if (seq == FAN_COUNT / 2) {
            /* Halfway: rank 3's end is reported first. */
            int go = 0;
            MPI_Recv(&go, 1, MPI_INT, 0, TAG_EARLY_END, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        }
        size_t len = fan_size_of(seq);
        uint64_t sent = UINT64_MAX;
        if (seq % 3 == 1) {
            lf_loan_region loan;
            EXPECT(lf_loan(ch, len, 60 * SECOND, &loan), LF_OK);
            fill_from(loan.data, len, rank, seq);
            EXPECT(lf_publish(ch, &loan, len, &sent), LF_OK);
        } else {
            fill_from(scratch, len, rank, seq);
            EXPECT(lf_send(ch, scratch, len, 60 * SECOND, &sent), LF_OK);
        }
        CHECK(sent == seq);
    }
    if (world_rank == 3) {
        int go = 0;
        MPI_Recv(&go, 1, MPI_INT, 0, TAG_ALL_SEEN, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    EXPECT(lf_wait_completed(ch, count - 1, 60 * SECOND), LF_OK);
    free(scratch);
}

static int run_fan_in(void) {
    int provided = 0;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    CHECK(provided == MPI_THREAD_MULTIPLE);
    lf_mpi *mpi = NULL;
    lf_context *ctx = NULL;
    int32_t size = 0;
    EXPECT(lf_mpi_join(LF_MPI_COMM_WORLD, NULL, &mpi), LF_OK);
    EXPECT(lf_context_create(NULL, &ctx), LF_OK);
    if (mpi == NULL || ctx == NULL) return 1;
    EXPECT(lf_mpi_size(mpi, &size), LF_OK);
    CHECK(size == 4);
    if (world_rank == 0) {
        /* The first producer is expected on this host; the others come over either carrier. */
        lf_channel *ch = open_fan_in(ctx, mpi, LF_ROLE_CONSUMER, 1);
        if (ch == NULL) return 1;
        fan_in_consume(ch, mpi);
        lf_channel_free(ch);
    } else {
        lf_channel *ch = open_fan_in(ctx, mpi, LF_ROLE_PRODUCER, 0);
        if (ch == NULL) return 1;
        /* Rank 1 shares host a with the consumer; ranks 2 and 3 are on host b. */
        CHECK(strncmp(transport_of(ch), world_rank == 1 ? "shm" : "mpi", 3) == 0);
        fan_in_produce(ch);
        lf_channel_free(ch);
    }
    lf_context_free(ctx);
    lf_mpi_free(mpi);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return failures ? 1 : 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    int rc;
    if (strcmp(mode, "pair") == 0) {
        rc = run_pair();
    } else if (strcmp(mode, "ring") == 0) {
        rc = run_ring();
    } else if (strcmp(mode, "million") == 0) {
        rc = run_million();
    } else if (strcmp(mode, "fan-in") == 0) {
        rc = run_fan_in();
    } else {
        fprintf(stderr, "usage: test_mpi_channel pair|ring|million|fan-in\n");
        return 2;
    }
    printf("[rank %d] %s: %s\n", world_rank, mode, rc ? "FAILED" : "passed");
    return rc;
}
