/* The program a new user writes, under mpirun: both locations from a config file, and no MPI
 * call and no lf_mpi_join of its own. Its context joins MPI by itself (lava-flow runs under an
 * MPI launcher), and the channel finds the peer named in the config through MPI discovery.
 *
 *   test_mpi_config CONFIG EXPECTED
 *
 * The process's name is LF_PROCESS_NAME ("producer" or "consumer", as the config names them).
 * EXPECTED is the transport the channel must take ("mpi" across host identities, "shm" on one),
 * or "refused": LF_MPI=off is set and the channel to another host is refused, naming LF_MPI.
 * Then an explicit lf_mpi_join of LF_MPI_COMM_WORLD returns the join the context made.
 * Every rank exits non-zero on any failure, so mpirun fails. */
#define _GNU_SOURCE /* readlink, for check.h's descriptor count */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;
#include "check.h"

#define SECOND 1000000000LL
#define MESSAGES 200u

static size_t size_of(uint64_t seq) { return seq % 100 == 99 ? (1u << 20) + 5 : 8 + (size_t)(seq * 13 % 300); }

int main(int argc, char **argv) {
    const char *me = getenv("LF_PROCESS_NAME");
    if (argc != 3 || me == NULL) {
        fprintf(stderr, "usage: LF_PROCESS_NAME=producer|consumer test_mpi_config CONFIG mpi|shm|refused\n");
        return 2;
    }
    int producer = strcmp(me, "producer") == 0;
    const char *peer_name = producer ? "consumer" : "producer";
    lf_context *ctx = NULL;
    EXPECT(lf_context_create(NULL, &ctx), LF_OK);
    lf_location *mine = NULL, *peer = NULL;
    EXPECT(lf_location_from_config(argv[1], me, &mine), LF_OK);
    EXPECT(lf_location_from_config(argv[1], peer_name, &peer), LF_OK);
    lf_channel_config cfg;
    EXPECT(lf_channel_config_init(&cfg, sizeof cfg), LF_OK);
    cfg.rendezvous_timeout_ns = 60 * SECOND;
    lf_channel *ch = NULL;
    lf_role role = producer ? LF_ROLE_PRODUCER : LF_ROLE_CONSUMER;
    if (strcmp(argv[2], "refused") == 0) {
        EXPECT(lf_channel_create(ctx, "from-config", role, mine, peer, &cfg, &ch), LF_ERR_UNSUPPORTED);
        EXPECT_MESSAGE("LF_MPI=off");
    } else if (lf_channel_create(ctx, "from-config", role, mine, peer, &cfg, &ch) != LF_OK) {
        fprintf(stderr, "[%s] lf_channel_create: %s\n", me, lf_last_error_message());
        failures++;
    } else {
        const char *transport = NULL, *reason = NULL;
        EXPECT(lf_channel_transport(ch, &transport, &reason), LF_OK);
        printf("[%s] transport %s: %s\n", me, transport, reason);
        /* "shm" may come with a route for GPU buffers ("shm+vulkan_ipc"). */
        CHECK(strncmp(transport, argv[2], strlen(argv[2])) == 0);
        unsigned char *bytes = malloc((1u << 20) + 5);
        for (uint64_t seq = 0; seq < MESSAGES && failures == 0; seq++) {
            size_t len = size_of(seq);
            if (producer) {
                for (size_t i = 0; i < len; i++) bytes[i] = (unsigned char)(seq * 7 + i);
                uint64_t sent = UINT64_MAX;
                EXPECT(lf_send(ch, bytes, len, 60 * SECOND, &sent), LF_OK);
                CHECK(sent == seq);
            } else {
                lf_message m;
                EXPECT(lf_recv(ch, 60 * SECOND, &m), LF_OK);
                CHECK(m.sequence == seq && m.len == len);
                const unsigned char *p = m.data;
                for (size_t i = 0; i < m.len && failures == 0; i++) CHECK(p[i] == (unsigned char)(seq * 7 + i));
                EXPECT(lf_release(ch, &m), LF_OK);
            }
        }
        if (producer) EXPECT(lf_wait_completed(ch, MESSAGES - 1, 60 * SECOND), LF_OK);
        free(bytes);
        lf_channel_free(ch);
        /* The join the context made, again: no collective (the ranks may get here at any time). */
        lf_mpi *mpi = NULL;
        EXPECT(lf_mpi_join(LF_MPI_COMM_WORLD, NULL, &mpi), LF_OK);
        int32_t size = 0, rank = -1, peer_rank = -1;
        bool initialised = false;
        EXPECT(lf_mpi_size(mpi, &size), LF_OK);
        EXPECT(lf_mpi_rank_of(mpi, me, &rank), LF_OK);
        EXPECT(lf_mpi_rank_of(mpi, peer_name, &peer_rank), LF_OK);
        EXPECT(lf_mpi_initialized_mpi(mpi, &initialised), LF_OK);
        CHECK(size == 2 && rank >= 0 && peer_rank == 1 - rank && initialised);
        lf_mpi *renamed = NULL;
        EXPECT(lf_mpi_join(LF_MPI_COMM_WORLD, "renamed", &renamed), LF_ERR_INVALID_STATE);
        EXPECT_MESSAGE("LF_PROCESS_NAME");
        lf_mpi_free(mpi);
    }
    lf_location_free(mine);
    lf_location_free(peer);
    lf_context_free(ctx);
    if (failures) fprintf(stderr, "[%s] %d failure(s)\n", me, failures);
    return failures ? 1 : 0;
}
