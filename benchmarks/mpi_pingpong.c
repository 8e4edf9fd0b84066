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
 * Right before and right after each size's timed round trips, the two ranks probe the spinning
 * floor (a counter bounced on one cache line of an MPI shared-memory window, as lf-bench probes
 * it), so that lf-bench can tell whether the machine's cross-core latency moved meanwhile.
 *
 * Output (rank 0): one JSON object per line and size, half round trips in ns:
 *   {"peer":"openmpi","size":64,"touch":false,"iters":5000,"p50_ns":..,"p99_ns":..,"p999_ns":..,
 *    "spin_before_p50_ns":..,"spin_after_p50_ns":..}
 * (the spin fields only where the two ranks share memory). Plain C99, with GCC's __atomic
 * builtins for the shared line.
 */
#define _POSIX_C_SOURCE 199309L
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_SIZES 64
/* Round trips of each spinning-floor probe. */
#define PROBE_ITERS 5000

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

/* One round trip's step on one rank (rank 0 sends first); `ctx` is the step's own state. */
typedef void (*step_fn)(void *ctx, int rank);

/* Runs `iters` timed round trips after a tenth as many (at least 5) untimed ones; rank 0
 * stores each round trip (ns) in `rtt`. */
static void timed(int rank, long iters, step_fn step, void *ctx, uint64_t *rtt) {
    long warm = iters / 10 > 5 ? iters / 10 : 5;
    for (long i = 0; i < warm + iters; i++) {
        uint64_t t0 = now_ns();
        step(ctx, rank);
        if (rank == 0 && i >= warm) rtt[i - warm] = now_ns() - t0;
    }
}

/* The half round trip at nearest-rank percentile q of `n` sorted round trips. */
static double at(const uint64_t *sorted, long n, double q) {
    return (double)sorted[(long)((double)(n - 1) * q + 0.5)] / 2.0;
}

static void sort(uint64_t *rtt, long n) {
    qsort(rtt, (size_t)n, sizeof(uint64_t), cmp_u64);
}

/* The ping-pong of one size: MPI_Send / MPI_Recv, touched or not. */
struct pingpong {
    size_t size;
    int touch;
    const unsigned char *private_buf;
    unsigned char *sendbuf, *recvbuf;
};

static void send_one(struct pingpong *p, int peer) {
    if (p->touch) memcpy(p->sendbuf, p->private_buf, p->size);
    MPI_Send(p->sendbuf, (int)p->size, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
}

static void recv_one(struct pingpong *p, int peer) {
    MPI_Recv(p->recvbuf, (int)p->size, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (p->touch) sink += read_all(p->recvbuf, p->size);
}

static void pingpong_step(void *ctx, int rank) {
    struct pingpong *p = ctx;
    if (rank == 0) {
        send_one(p, 1);
        recv_one(p, 1);
    } else {
        recv_one(p, 0);
        send_one(p, 0);
    }
}

/* The spinning floor inside this program: the two ranks bounce a counter on one cache line of
 * an MPI shared-memory window, as lf-bench probes it, so that lf-bench can tell whether the
 * machine's cross-core latency moved while this program ran. */
struct spin {
    MPI_Comm node;
    MPI_Win win;
    volatile uint64_t *line; /* NULL where the two ranks share no memory */
    uint64_t last;           /* the last value seen on the line; each round trip adds 2 */
};

/* The spin-wait hint Rust's std::hint::spin_loop gives lf-bench's probes (PAUSE on x86). */
static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("isb" ::: "memory");
#endif
}

static void spin_open(struct spin *s) {
    int n, r;
    MPI_Aint len;
    int disp;
    uint64_t *base = NULL;
    s->line = NULL;
    s->last = 0;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &s->node);
    MPI_Comm_size(s->node, &n);
    MPI_Comm_rank(s->node, &r);
    MPI_Win_allocate_shared(n == 2 && r == 0 ? 64 : 0, 1, MPI_INFO_NULL, s->node, &base, &s->win);
    if (n != 2) return;
    MPI_Win_shared_query(s->win, 0, &len, &disp, &base);
    if (r == 0) __atomic_store_n(base, 0, __ATOMIC_RELEASE);
    MPI_Barrier(s->node);
    s->line = base;
}

static void spin_close(struct spin *s) {
    MPI_Win_free(&s->win);
    MPI_Comm_free(&s->node);
}

static void spin_step(void *ctx, int rank) {
    struct spin *s = ctx;
    uint64_t mine = s->last + (rank == 0 ? 1 : 2), theirs = s->last + (rank == 0 ? 2 : 1);
    if (rank == 0) __atomic_store_n(s->line, mine, __ATOMIC_RELEASE);
    while (__atomic_load_n(s->line, __ATOMIC_ACQUIRE) != theirs) cpu_relax();
    if (rank != 0) __atomic_store_n(s->line, mine, __ATOMIC_RELEASE);
    s->last += 2;
}

/* A probe of the spinning floor: its p50 half round trip on rank 0 (-1 without a line). */
static double spin_probe(struct spin *s, int rank, uint64_t *rtt) {
    if (!s->line) return -1;
    timed(rank, PROBE_ITERS, spin_step, s, rtt);
    sort(rtt, PROBE_ITERS);
    return at(rtt, PROBE_ITERS, 0.5);
}

/* Prints one size's JSON line (rank 0), from its sorted round trips and the spinning-floor
 * probes around them. */
static void print_row(size_t size, int touch, const uint64_t *rtt, long n, double before, double after) {
    printf("{\"peer\":\"openmpi\",\"size\":%zu,\"touch\":%s,\"iters\":%ld,\"p50_ns\":%.1f,\"p99_ns\":%.1f,\"p999_ns\":%.1f",
           size, touch ? "true" : "false", n, at(rtt, n, 0.5), at(rtt, n, 0.99), at(rtt, n, 0.999));
    if (before >= 0 && after >= 0) printf(",\"spin_before_p50_ns\":%.1f,\"spin_after_p50_ns\":%.1f", before, after);
    printf("}\n");
    fflush(stdout);
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
    uint64_t *rtt = malloc(sizeof(uint64_t) * (size_t)max_iters), *probe_rtt = malloc(sizeof(uint64_t) * PROBE_ITERS);
    if (!private_buf || !sendbuf || !recvbuf || !rtt || !probe_rtt) {
        fprintf(stderr, "mpi_pingpong: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t i = 0; i < max; i++) private_buf[i] = (unsigned char)(i * 31 + 7);
    memset(sendbuf, 0, max);
    memset(recvbuf, 0, max);
    struct spin spin;
    spin_open(&spin);
    for (int s = 0; s < a.nsizes; s++) {
        long n = a.iters ? a.iters : default_iters(a.sizes[s], a.touch);
        struct pingpong p = {a.sizes[s], a.touch, private_buf, sendbuf, recvbuf};
        MPI_Barrier(MPI_COMM_WORLD);
        double before = spin_probe(&spin, rank, probe_rtt);
        timed(rank, n, pingpong_step, &p, rtt);
        double after = spin_probe(&spin, rank, probe_rtt);
        if (rank == 0) {
            sort(rtt, n);
            print_row(a.sizes[s], a.touch, rtt, n, before, after);
        }
    }
    spin_close(&spin);
    free(probe_rtt);
    free(rtt);
    free(recvbuf);
    free(sendbuf);
    free(private_buf);
    MPI_Finalize();
    return 0;
}
