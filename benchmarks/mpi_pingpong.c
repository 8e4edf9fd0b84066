/* The Open MPI peer of lf-bench: an OSU-style ping-pong (MPI_Send / MPI_Recv) between two
 * ranks on one host, half round trip p50/p99/p99.9 per size, so that lava-flow and MPI's
 * shared-memory transport are compared on the same machine in the same run. lf-bench runs it
 * (--mpi-pingpong PATH); it also runs alone.
 *
 *   mpicc -std=c99 -O2 benchmarks/mpi_pingpong.c -o mpi_pingpong
 *   mpirun -np 2 --bind-to core --map-by core --mca btl self,vader ./mpi_pingpong \
 *       [--sizes 8,64,1K,64M] [--iters N] [--touch]           (as root: --allow-run-as-root)
 *
 * Plain mode touches no payload byte. --touch: before each MPI_Send the sender copies the
 * payload from a private buffer into the send buffer (memcpy), and after each MPI_Recv the
 * receiver reads every byte (summing 8-byte words), as lf-bench's touch rows do.
 *
 * Output (rank 0): one JSON object per line and size, half round trips in ns:
 *   {"peer":"openmpi","size":64,"touch":false,"iters":5000,"p50_ns":..,"p99_ns":..,"p999_ns":..}
 */
#define _POSIX_C_SOURCE 199309L
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_SIZES 64

struct args {
    size_t sizes[MAX_SIZES];
    int nsizes;
    long iters; /* 0: a default per size */
    int touch;
};

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* "64", "64K", "1M", "1G" as bytes; 0 when malformed. */
static size_t parse_size(const char *s) {
    char *end;
    unsigned long long n = strtoull(s, &end, 10);
    if (end == s) return 0;
    switch (*end) {
    case 'K': case 'k': n <<= 10; end++; break;
    case 'M': case 'm': n <<= 20; end++; break;
    case 'G': case 'g': n <<= 30; end++; break;
    default: break;
    }
    return (*end == '\0' || *end == ',') ? (size_t)n : 0;
}

static int parse_args(int argc, char **argv, struct args *a) {
    static const size_t defaults[] = {8, 64, 1024, 65536, 1 << 20};
    a->nsizes = 5;
    memcpy(a->sizes, defaults, sizeof defaults);
    a->iters = 0;
    a->touch = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--touch") == 0) {
            a->touch = 1;
        } else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
            a->iters = atol(argv[++i]);
            if (a->iters <= 0) return -1;
        } else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            const char *p = argv[++i];
            a->nsizes = 0;
            while (*p && a->nsizes < MAX_SIZES) {
                size_t s = parse_size(p);
                if (s == 0 || s > (size_t)INT32_MAX) return -1;
                a->sizes[a->nsizes++] = s;
                p = strchr(p, ',');
                if (!p) break;
                p++;
            }
        } else {
            return -1;
        }
    }
    return a->nsizes > 0 ? 0 : -1;
}

/* Round trips for a size when --iters is not given: fewer for large touched payloads. */
static long default_iters(size_t size, int touch) {
    long n = touch ? (long)((1ull << 30) / size) : 10000;
    return n < 10 ? 10 : (n > 10000 ? 10000 : n);
}

/* Reads every byte, so that a touched message really reaches the reader's core. */
static uint64_t read_all(const unsigned char *buf, size_t len) {
    uint64_t sum = 0, w;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        memcpy(&w, buf + i, 8);
        sum += w;
    }
    for (; i < len; i++) sum += buf[i];
    return sum;
}

static volatile uint64_t sink;

/* One size's ping-pong; rank 0 fills `rtt` with `iters` round trips (ns). */
static void pingpong(int rank, size_t size, long iters, int touch, const unsigned char *private_buf,
                     unsigned char *sendbuf, unsigned char *recvbuf, uint64_t *rtt) {
    long warm = iters / 10 > 5 ? iters / 10 : 5;
    int peer = 1 - rank, n = (int)size;
    for (long i = 0; i < warm + iters; i++) {
        uint64_t t0 = now_ns();
        if (rank == 0) {
            if (touch) memcpy(sendbuf, private_buf, size);
            MPI_Send(sendbuf, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
            MPI_Recv(recvbuf, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (touch) sink += read_all(recvbuf, size);
        } else {
            MPI_Recv(recvbuf, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (touch) sink += read_all(recvbuf, size);
            if (touch) memcpy(sendbuf, private_buf, size);
            MPI_Send(sendbuf, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
        }
        if (i >= warm) rtt[i - warm] = now_ns() - t0;
    }
}

/* The half round trip at nearest-rank percentile q of `n` sorted round trips. */
static double at(const uint64_t *sorted, long n, double q) {
    return (double)sorted[(long)((double)(n - 1) * q + 0.5)] / 2.0;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, nranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    struct args a;
    if (nranks != 2 || parse_args(argc, argv, &a) != 0) {
        if (rank == 0) fprintf(stderr, "usage: mpirun -np 2 mpi_pingpong [--sizes 8,64,1K,64M] [--iters N] [--touch]\n");
        MPI_Finalize();
        return 2;
    }
    size_t max = 0;
    long max_iters = 0;
    for (int s = 0; s < a.nsizes; s++) {
        long n = a.iters ? a.iters : default_iters(a.sizes[s], a.touch);
        if (a.sizes[s] > max) max = a.sizes[s];
        if (n > max_iters) max_iters = n;
    }
    unsigned char *private_buf = malloc(max), *sendbuf = malloc(max), *recvbuf = malloc(max);
    uint64_t *rtt = malloc(sizeof(uint64_t) * (size_t)max_iters);
    if (!private_buf || !sendbuf || !recvbuf || !rtt) {
        fprintf(stderr, "mpi_pingpong: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t i = 0; i < max; i++) private_buf[i] = (unsigned char)(i * 31 + 7);
    memset(sendbuf, 0, max);
    memset(recvbuf, 0, max);
    for (int s = 0; s < a.nsizes; s++) {
        long n = a.iters ? a.iters : default_iters(a.sizes[s], a.touch);
        MPI_Barrier(MPI_COMM_WORLD);
        pingpong(rank, a.sizes[s], n, a.touch, private_buf, sendbuf, recvbuf, rtt);
        if (rank == 0) {
            qsort(rtt, (size_t)n, sizeof(uint64_t), cmp_u64);
            printf("{\"peer\":\"openmpi\",\"size\":%zu,\"touch\":%s,\"iters\":%ld,\"p50_ns\":%.1f,\"p99_ns\":%.1f,\"p999_ns\":%.1f}\n",
                   a.sizes[s], a.touch ? "true" : "false", n, at(rtt, n, 0.5), at(rtt, n, 0.99), at(rtt, n, 0.999));
            fflush(stdout);
        }
    }
    free(rtt);
    free(recvbuf);
    free(sendbuf);
    free(private_buf);
    MPI_Finalize();
    return 0;
}
