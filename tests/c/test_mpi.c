/* lf_mpi under mpirun: joining the application's MPI or initialising it, discovery by rank and
 * by name, LF_HOST_ID groups, and bad input. One program, one scenario per run:
 *
 *   test_mpi app-init       the application initialises and finalizes MPI itself
 *   test_mpi lf-init        lava-flow initialises MPI and finalizes it with its last handle
 *   test_mpi host-groups    LF_HOST_ID is "node-a" on the first half of the ranks, "node-b"
 *                           on the second (set per app context by mpirun -x)
 *   test_mpi names          LF_PROCESS_NAME is set per app context: "trainer", "loader"
 *   test_mpi duplicate-env  LF_PROCESS_NAME is the same on every rank: every join fails
 *   test_mpi bad-host-id    LF_HOST_ID is invalid on rank 0 only: every join fails, none hangs
 *
 * Every rank checks what it sees and exits non-zero on any failure, so mpirun fails. */
#define _GNU_SOURCE /* readlink, for check.h's descriptor count */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures = 0;
#include "check.h"

static int world_rank = -1;

#define SAY(...)                                                                               \
    do {                                                                                       \
        printf("[rank %d] ", world_rank);                                                      \
        printf(__VA_ARGS__);                                                                   \
        printf("\n");                                                                          \
        fflush(stdout);                                                                        \
    } while (0)

static const char *host_id_of(const lf_location *loc) {
    const char *id = NULL;
    EXPECT(lf_location_host_id(loc, &id), LF_OK);
    return id;
}

static int same_text(const char *a, const char *b) {
    return a != NULL && b != NULL && strcmp(a, b) == 0;
}

/* What every joined world must satisfy: size, rank, names, locations. */
static void check_world(const lf_mpi *mpi, MPI_Comm comm, const char *name_format) {
    int mpi_size = 0, mpi_rank = 0;
    MPI_Comm_size(comm, &mpi_size);
    MPI_Comm_rank(comm, &mpi_rank);
    int32_t size = -1, rank = -1;
    EXPECT(lf_mpi_size(mpi, &size), LF_OK);
    EXPECT(lf_mpi_rank(mpi, &rank), LF_OK);
    CHECK(size == mpi_size);
    CHECK(rank == mpi_rank);
    int32_t tag_ub = 0;
    EXPECT(lf_mpi_tag_ub(mpi, &tag_ub), LF_OK);
    CHECK(tag_ub >= 32767);

    lf_location *here = NULL;
    EXPECT(lf_location_detect(&here), LF_OK);
    for (int32_t r = 0; r < size; r++) {
        const char *name = NULL;
        EXPECT(lf_mpi_process_name(mpi, r, &name), LF_OK);
        char want[64];
        snprintf(want, sizeof want, name_format, (int)r);
        CHECK(same_text(name, want));
        int32_t found = -1;
        EXPECT(lf_mpi_rank_of(mpi, want, &found), LF_OK);
        CHECK(found == r);

        lf_location *loc = NULL;
        EXPECT(lf_mpi_location(mpi, r, &loc), LF_OK);
        const char *host = NULL, *my_host = NULL;
        EXPECT(lf_location_hostname(loc, &host), LF_OK);
        EXPECT(lf_location_hostname(here, &my_host), LF_OK);
        /* One machine: every rank reports this hostname and this host identity. */
        CHECK(same_text(host, my_host));
        CHECK(same_text(host_id_of(loc), host_id_of(here)));
        int64_t node = -2;
        EXPECT(lf_location_node_id(loc, &node), LF_OK);
        CHECK(node >= 0);
        lf_scope scope = 0;
        EXPECT(lf_scope_detect(here, loc, &scope), LF_OK);
        CHECK(scope == LF_SCOPE_LOCAL);
        lf_location_free(loc);
    }
    lf_location_free(here);
}

static void check_bad_input(lf_mpi *mpi) {
    int32_t out = 0;
    const char *text = NULL;
    lf_location *loc = NULL;
    EXPECT(lf_mpi_size(NULL, &out), LF_ERR_NULL_POINTER);
    EXPECT_MESSAGE("argument `mpi` is NULL");
    EXPECT(lf_mpi_size(mpi, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_mpi_rank(mpi, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_mpi_tag_ub(mpi, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_mpi_thread_level(mpi, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_mpi_initialized_mpi(mpi, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_mpi_topology_report(mpi, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_mpi_location(mpi, 0, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_mpi_process_name(mpi, 0, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_mpi_rank_of(mpi, NULL, &out), LF_ERR_NULL_POINTER);
    EXPECT_MESSAGE("`process_name` is NULL");

    int32_t size = 0;
    EXPECT(lf_mpi_size(mpi, &size), LF_OK);
    EXPECT(lf_mpi_location(mpi, size, &loc), LF_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("out of range");
    CHECK(loc == NULL);
    EXPECT(lf_mpi_location(mpi, -1, &loc), LF_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("negative");
    EXPECT(lf_mpi_process_name(mpi, size + 7, &text), LF_ERR_INVALID_ARGUMENT);
    CHECK(text == NULL);
    out = -5;
    EXPECT(lf_mpi_rank_of(mpi, "nobody-has-this-name", &out), LF_ERR_NOT_FOUND);
    EXPECT_MESSAGE("no process named \"nobody-has-this-name\"");
    CHECK(out == -5);
    EXPECT(lf_mpi_rank_of(mpi, "not a name", &out), LF_ERR_INVALID_ARGUMENT);

    /* Wrong-type and stale handles. */
    lf_location *here = NULL;
    EXPECT(lf_location_detect(&here), LF_OK);
    EXPECT(lf_mpi_size((const lf_mpi *)here, &out), LF_ERR_BAD_HANDLE);
    EXPECT_MESSAGE("not an lf_mpi");
    lf_location_free(here);
    EXPECT(lf_mpi_size((const lf_mpi *)(uintptr_t)0x1234, &out), LF_ERR_BAD_HANDLE);
    lf_mpi_free((lf_mpi *)(uintptr_t)0x1234); /* ignored, noted */
    EXPECT_MESSAGE("lf_mpi_free");
}

/* Joins that fail the same way on every rank before any collective. */
static void check_bad_joins(void) {
    lf_mpi *mpi = NULL;
    EXPECT(lf_mpi_join(LF_MPI_COMM_WORLD, NULL, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_mpi_join(MPI_Comm_c2f(MPI_COMM_NULL), NULL, &mpi), LF_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("names no live communicator");
    EXPECT(lf_mpi_join(987654, NULL, &mpi), LF_ERR_INVALID_ARGUMENT);
    EXPECT(lf_mpi_join((int64_t)1 << 40, NULL, &mpi), LF_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("not an MPI_Fint");
    CHECK(mpi == NULL);
}

static int app_init(void) {
    int provided = -1;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    int world_size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);

    check_bad_joins();

    /* MPI_COMM_WORLD by Fortran handle, names given. */
    char name[32];
    snprintf(name, sizeof name, "proc-%d", world_rank);
    lf_mpi *world = NULL;
    EXPECT(lf_mpi_join(MPI_Comm_c2f(MPI_COMM_WORLD), name, &world), LF_OK);
    if (world == NULL) return 1;
    check_world(world, MPI_COMM_WORLD, "proc-%d");
    bool initialised = true;
    EXPECT(lf_mpi_initialized_mpi(world, &initialised), LF_OK);
    CHECK(!initialised);
    lf_mpi_thread_support level = 99;
    EXPECT(lf_mpi_thread_level(world, &level), LF_OK);
    CHECK((int)level == provided);
    const char *report = NULL;
    EXPECT(lf_mpi_topology_report(world, &report), LF_OK);
    CHECK(same_text(report, "")); /* one machine, one identity, one shared-memory group */
    check_bad_input(world);

    /* The default communicator and default names, alongside the first world. */
    lf_mpi *by_default = NULL;
    EXPECT(lf_mpi_join(LF_MPI_COMM_WORLD, NULL, &by_default), LF_OK);
    if (by_default) check_world(by_default, MPI_COMM_WORLD, "rank%d");

    /* A sub-communicator: even and odd ranks. */
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, world_rank, &half);
    lf_mpi *sub = NULL;
    EXPECT(lf_mpi_join(MPI_Comm_c2f(half), NULL, &sub), LF_OK);
    if (sub) {
        check_world(sub, half, "rank%d");
        int32_t size = 0;
        EXPECT(lf_mpi_size(sub, &size), LF_OK);
        CHECK(size == (world_size + 1 - world_rank % 2) / 2);
    }

    /* The same name everywhere: every rank's join fails, and says which ranks clash. */
    lf_mpi *clash = NULL;
    EXPECT(lf_mpi_join(LF_MPI_COMM_WORLD, "same", &clash), LF_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("\"same\" is used by MPI ranks 0 and 1");
    CHECK(clash == NULL);

    lf_mpi_free(sub);
    lf_mpi_free(by_default);
    lf_mpi_free(world);

    /* lava-flow must not have finalized the application's MPI. */
    int finalized = 1;
    MPI_Finalized(&finalized);
    CHECK(!finalized);
    int total = 0;
    CHECK(MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, half) == MPI_SUCCESS);
    CHECK(MPI_Barrier(MPI_COMM_WORLD) == MPI_SUCCESS);
    MPI_Comm_free(&half);
    SAY("app-init: %d failure(s)", failures);
    MPI_Finalize();
    return failures != 0;
}

static int lf_init(void) {
    int initialized = 1;
    MPI_Initialized(&initialized);
    CHECK(!initialized);

    lf_mpi *first = NULL, *second = NULL;
    EXPECT(lf_mpi_join(LF_MPI_COMM_WORLD, NULL, &first), LF_OK);
    if (first == NULL) return 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    check_world(first, MPI_COMM_WORLD, "rank%d");
    bool by_lava_flow = false;
    EXPECT(lf_mpi_initialized_mpi(first, &by_lava_flow), LF_OK);
    CHECK(by_lava_flow);
    lf_mpi_thread_support level = 99;
    EXPECT(lf_mpi_thread_level(first, &level), LF_OK);
    int provided = -1;
    MPI_Query_thread(&provided);
    CHECK((int)level == provided);
    SAY("lava-flow initialised MPI, thread level %d (MPI_THREAD_MULTIPLE is %d)", (int)level,
        MPI_THREAD_MULTIPLE);
    check_bad_input(first);

    EXPECT(lf_mpi_join(LF_MPI_COMM_WORLD, NULL, &second), LF_OK);
    lf_mpi_free(first);
    /* One handle left: MPI stays up. */
    int finalized = 1;
    MPI_Finalized(&finalized);
    CHECK(!finalized);
    lf_mpi_free(second);
    /* The last handle finalized it. */
    MPI_Finalized(&finalized);
    CHECK(finalized);

    lf_mpi *again = NULL;
    EXPECT(lf_mpi_join(LF_MPI_COMM_WORLD, NULL, &again), LF_ERR_INVALID_STATE);
    EXPECT_MESSAGE("cannot be initialised twice");
    CHECK(again == NULL);
    SAY("lf-init: %d failure(s)", failures);
    return failures != 0;
}

static int host_groups(void) {
    lf_mpi *mpi = NULL;
    EXPECT(lf_mpi_join(LF_MPI_COMM_WORLD, NULL, &mpi), LF_OK);
    if (mpi == NULL) return 1;
    int32_t size = 0, rank = 0;
    EXPECT(lf_mpi_size(mpi, &size), LF_OK);
    EXPECT(lf_mpi_rank(mpi, &rank), LF_OK);
    world_rank = rank;
    CHECK(size >= 2 && size % 2 == 0);
    const char *mine = getenv("LF_HOST_ID");
    CHECK(same_text(mine, rank < size / 2 ? "node-a" : "node-b"));

    lf_location *here = NULL;
    EXPECT(lf_location_detect(&here), LF_OK); /* LF_HOST_ID applies without MPI too */
    CHECK(same_text(host_id_of(here), mine));
    for (int32_t r = 0; r < size; r++) {
        lf_location *peer = NULL;
        EXPECT(lf_mpi_location(mpi, r, &peer), LF_OK);
        if (peer == NULL) continue;
        CHECK(same_text(host_id_of(peer), r < size / 2 ? "node-a" : "node-b"));
        lf_scope scope = 0;
        EXPECT(lf_scope_detect(here, peer, &scope), LF_OK);
        int same_group = (r < size / 2) == (rank < size / 2);
        CHECK(scope == (same_group ? LF_SCOPE_LOCAL : LF_SCOPE_REMOTE));
        lf_location_free(peer);
    }
    lf_location_free(here);
    /* MPI puts all ranks in one shared-memory group: the report says so, on every rank. */
    const char *report = NULL;
    EXPECT(lf_mpi_topology_report(mpi, &report), LF_OK);
    CHECK(report != NULL && strstr(report, "host identities") && strstr(report, "LF_HOST_ID"));
    lf_mpi_free(mpi);
    SAY("host-groups: %d failure(s)", failures);
    return failures != 0;
}

static int names(void) {
    lf_mpi *mpi = NULL;
    EXPECT(lf_mpi_join(LF_MPI_COMM_WORLD, NULL, &mpi), LF_OK);
    if (mpi == NULL) return 1;
    EXPECT(lf_mpi_rank(mpi, &world_rank), LF_OK);
    int32_t trainer = -1, loader = -1;
    EXPECT(lf_mpi_rank_of(mpi, "trainer", &trainer), LF_OK);
    EXPECT(lf_mpi_rank_of(mpi, "loader", &loader), LF_OK);
    CHECK(trainer == 0 && loader == 1);
    const char *name = NULL;
    EXPECT(lf_mpi_process_name(mpi, world_rank, &name), LF_OK);
    CHECK(same_text(name, getenv("LF_PROCESS_NAME")));
    lf_mpi_free(mpi);
    SAY("names: %d failure(s)", failures);
    return failures != 0;
}

static int duplicate_env(void) {
    lf_mpi *mpi = NULL;
    EXPECT(lf_mpi_join(LF_MPI_COMM_WORLD, NULL, &mpi), LF_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("is used by MPI ranks 0 and 1");
    EXPECT_MESSAGE("LF_PROCESS_NAME");
    CHECK(mpi == NULL);
    SAY("duplicate-env: %d failure(s)", failures);
    return failures != 0;
}

static int bad_host_id(void) {
    const char *id = getenv("LF_HOST_ID");
    int mine_is_bad = id != NULL && strlen(id) > 255;
    lf_mpi *mpi = NULL;
    if (mine_is_bad) {
        EXPECT(lf_mpi_join(LF_MPI_COMM_WORLD, NULL, &mpi), LF_ERR_INVALID_ARGUMENT);
        EXPECT_MESSAGE("LF_HOST_ID");
    } else {
        EXPECT(lf_mpi_join(LF_MPI_COMM_WORLD, NULL, &mpi), LF_ERR_INVALID_STATE);
        EXPECT_MESSAGE("MPI rank(s) 0 could not describe themselves");
    }
    CHECK(mpi == NULL);
    /* The failed join left no handle, so lava-flow finalized the MPI it had started. */
    int finalized = 0;
    MPI_Finalized(&finalized);
    CHECK(finalized);
    printf("[bad-host-id] %s: %d failure(s)\n", mine_is_bad ? "invalid LF_HOST_ID" : "valid", failures);
    return failures != 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "app-init") == 0) return app_init();
    if (strcmp(mode, "lf-init") == 0) return lf_init();
    if (strcmp(mode, "host-groups") == 0) return host_groups();
    if (strcmp(mode, "names") == 0) return names();
    if (strcmp(mode, "duplicate-env") == 0) return duplicate_env();
    if (strcmp(mode, "bad-host-id") == 0) return bad_host_id();
    fprintf(stderr, "usage: %s app-init|lf-init|host-groups|names|duplicate-env|bad-host-id\n", argv[0]);
    return 2;
}
