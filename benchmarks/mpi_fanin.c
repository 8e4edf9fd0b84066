/* The Open MPI fan-in peer of lf-bench --fan-in: N ranks send to rank 0, which receives from
 * MPI_ANY_SOURCE, with the protocol of lf-bench's fan-in rows (crates/tools/src/bin/lf-bench/
 * fanin/gather.rs), so that lava-flow's fan-in and MPI's shared-memory transport are compared on
 * the same machine in the same run. lf-bench runs it (--mpi-fanin PATH); it also runs alone.
 *
 *   mpicc -std=c99 -O2 benchmarks/mpi_fanin.c -o mpi_fanin
 *   mpirun -np 9 --oversubscribe --bind-to none --mca btl self,vader ./mpi_fanin \
 *       [--size 64] [--warm 0.3] [--window 2] [--no-pin]          (as root: --allow-run-as-root)
 *
 * Rank 0 is the consumer, pinned to core 0; rank r (producer r - 1) pins itself to core
 * 1 + (r - 1) mod (cores - 1), as lf-bench places its producers. After a barrier the producers
 * send as fast as they can: each message carries the producer's counter and index (8 bytes
 * each, little-endian on x86) and private bytes after them (memcpy into the send buffer, then
 * MPI_Send). Rank 0 MPI_Recvs from MPI_ANY_SOURCE, reads every byte, checks each producer's
 * counter. MPI's eager sends would let a sender run arbitrarily far ahead (into rank 0's
 * unexpected-message queue), where a channel's producer waits for room: a sender waits for a
 * credit from rank 0 per 256 messages, at most 512 ahead (a lava-flow fan-in producer has 256
 * slots).
 *
 * Rank 0 lets the run warm up, then counts for a timed window the messages per producer and
 * the time of each block of 64 consecutive messages; then it stops the senders (through the
 * credits) and drains. Output (rank 0): one JSON object on one line:
 *   {"who":"Open MPI","producers":N,"size":64,"window_s":..,"messages":..,"msgs_per_s":..,
 *    "per_producer":[..],"per_msg_p50_ns":..,"per_msg_p99_ns":..,"blocks":..,"errors":..}
 * Plain C99.
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BLOCK 64
#define WINDOW 256
#define TAG_DATA 1
#define TAG_CREDIT 2
#define TAG_DONE 3

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static volatile uint64_t sink;

static void read_all(const unsigned char *buf, size_t len) {
    uint64_t sum = 0, w;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        memcpy(&w, buf + i, 8);
        sum += w;
    }
    for (; i < len; i++) sum += buf[i];
    sink = sum;
}

static void pin(int core) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(core, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) perror("mpi_fanin: sched_setaffinity");
}

static int cores_allowed(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
    int n = CPU_COUNT(&set);
    return n > 0 ? n : 1;
}

static void producer(int rank, size_t size) {
    unsigned char *buf = malloc(size), *private_buf = malloc(size);
    for (size_t i = 0; i < size; i++) private_buf[i] = (unsigned char)(i * 31 + 7);
    uint64_t index = (uint64_t)(rank - 1), counter = 0;
    int stop = 0, credits = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    while (!stop) {
        if (counter >= 2 * WINDOW && counter % WINDOW == 0) {
            MPI_Recv(&stop, 1, MPI_INT, 0, TAG_CREDIT, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            credits++;
            if (stop) break;
        }
        memcpy(buf, &counter, 8);
        memcpy(buf + 8, &index, 8);
        memcpy(buf + 16, private_buf + 16, size - 16);
        MPI_Send(buf, (int)size, MPI_BYTE, 0, TAG_DATA, MPI_COMM_WORLD);
        counter++;
    }
    MPI_Send(NULL, 0, MPI_BYTE, 0, TAG_DONE, MPI_COMM_WORLD);
    /* Rank 0 sends one credit per full window it received: take those not taken yet. */
    for (long left = (long)(counter / WINDOW) - credits; left > 0; left--) {
        MPI_Recv(&stop, 1, MPI_INT, 0, TAG_CREDIT, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    free(buf);
    free(private_buf);
}

static void consumer(int producers, size_t size, double warm_s, double window_s) {
    unsigned char *buf = malloc(size);
    uint64_t *next = calloc((size_t)producers, sizeof *next);
    uint64_t *received = calloc((size_t)producers, sizeof *received);
    uint64_t *counts = calloc((size_t)producers, sizeof *counts);
    size_t cap = 1 << 16, nblocks = 0;
    uint64_t *blocks = malloc(cap * sizeof *blocks);
    uint64_t errors = 0, in_block = 0;
    int phase = 0, stopping = 0, done = 0; /* phase: 0 warm, 1 timed, 2 over */
    uint64_t warm = (uint64_t)(warm_s * 1e9), window = (uint64_t)(window_s * 1e9);
    MPI_Barrier(MPI_COMM_WORLD);
    uint64_t started = now_ns(), block_start = started, window_start = started, window_end = started;
    while (done < producers) {
        MPI_Status st;
        MPI_Recv(buf, (int)size, MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
        if (st.MPI_TAG == TAG_DONE) {
            done++;
            continue;
        }
        int p = st.MPI_SOURCE - 1;
        received[p]++;
        if (received[p] % WINDOW == 0) {
            MPI_Send(&stopping, 1, MPI_INT, st.MPI_SOURCE, TAG_CREDIT, MPI_COMM_WORLD);
        }
        if (stopping) continue; /* draining */
        read_all(buf, size);
        uint64_t counter;
        memcpy(&counter, buf, 8);
        if (counter != next[p]) errors++;
        next[p] = counter + 1;
        if (phase == 1) counts[p]++;
        if (++in_block == BLOCK) {
            in_block = 0;
            uint64_t now = now_ns();
            if (phase == 0 && now - started >= warm) {
                phase = 1;
                window_start = now;
            } else if (phase == 1) {
                if (nblocks == cap) blocks = realloc(blocks, (cap *= 2) * sizeof *blocks);
                blocks[nblocks++] = now - block_start;
                if (now - window_start >= window) {
                    phase = 2;
                    window_end = now;
                    stopping = 1;
                }
            }
            block_start = now;
        }
    }
    qsort(blocks, nblocks, sizeof *blocks, cmp_u64);
    double p50 = nblocks ? (double)blocks[(size_t)((double)(nblocks - 1) * 0.5 + 0.5)] / BLOCK : 0;
    double p99 = nblocks ? (double)blocks[(size_t)((double)(nblocks - 1) * 0.99 + 0.5)] / BLOCK : 0;
    uint64_t messages = 0;
    for (int i = 0; i < producers; i++) messages += counts[i];
    double seconds = (double)(window_end - window_start) / 1e9;
    printf("{\"who\":\"Open MPI\",\"producers\":%d,\"size\":%zu,\"window_s\":%.6f,\"messages\":%llu,"
           "\"msgs_per_s\":%.1f,\"per_producer\":[",
           producers, size, seconds, (unsigned long long)messages, (double)messages / seconds);
    for (int i = 0; i < producers; i++) printf("%s%llu", i ? "," : "", (unsigned long long)counts[i]);
    printf("],\"per_msg_p50_ns\":%.2f,\"per_msg_p99_ns\":%.2f,\"blocks\":%zu,\"errors\":%llu}\n", p50, p99, nblocks,
           (unsigned long long)errors);
    fflush(stdout);
    free(buf);
    free(next);
    free(received);
    free(counts);
    free(blocks);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, ranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    size_t size = 64;
    double warm = 0.3, window = 2.0;
    int do_pin = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--size") == 0 && i + 1 < argc) {
            size = (size_t)strtoull(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--warm") == 0 && i + 1 < argc) {
            warm = atof(argv[++i]);
        } else if (strcmp(argv[i], "--window") == 0 && i + 1 < argc) {
            window = atof(argv[++i]);
        } else if (strcmp(argv[i], "--no-pin") == 0) {
            do_pin = 0;
        } else {
            if (rank == 0) fprintf(stderr, "usage: mpi_fanin [--size 64] [--warm S] [--window S] [--no-pin]\n");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (ranks < 2 || size < 16 || window <= 0 || warm < 0) {
        if (rank == 0) fprintf(stderr, "mpi_fanin: needs at least 2 ranks, --size >= 16, a positive --window\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    /* Decided before any rank pins itself: the cores all ranks start with. */
    int cores = cores_allowed();
    if (do_pin && cores >= 2) pin(rank == 0 ? 0 : 1 + (rank - 1) % (cores - 1));
    if (rank == 0) {
        consumer(ranks - 1, size, warm, window);
    } else {
        producer(rank, size);
    }
    MPI_Finalize();
    return 0;
}
