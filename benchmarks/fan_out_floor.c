/* What it costs this machine to hand one message to N spinning readers, with nothing of
 * lava-flow in between: the floor under a fan-out's hand-off.
 *
 * One writer process on core 0 and N reader processes on the next cores. Per round the writer
 * publishes message k, every reader spins until it sees k and then stores k into an
 * acknowledgement line of its own, and the writer spins until it has seen every reader's
 * acknowledgement (polling them all at once): the hand-off, as lf-bench's fan-out measures it
 * (send, every consumer's release, the completion seen), less the channel. Layouts of the
 * message:
 *   lines           a line per reader, each reader spinning on its own (lava-flow's fan-out: a
 *                   ring per consumer), written one after the other
 *   lines+prefetchw the same, with a prefetch for writing of every reader's line first
 *   lines+fence     the same, each line's store sequentially consistent (a full fence: what a
 *                   sender that fences every message pays, where membarrier is not available)
 *   lines+stores    the same, with 48 stores to the writer's own cached memory after each line
 *                   (a sender's bookkeeping per reader: they queue behind the line's store)
 *   lines+nt        the same, written with non-temporal stores (no line fetched for the store)
 *   shared          one line that every reader spins on (a bell carrying the message)
 *   shared+cldemote the same, the writer demoting the line to the shared L3 once written
 *                   (CLDEMOTE; a NOP where the processor lacks it)
 * For each layout and N, the hand-off's p50 and its ratio to the same layout's N = 1 (the pair):
 * what a fan-out to N can cost at least, beside its pair, whatever lava-flow does. Layouts are
 * interleaved round by round; the summary gives each one's median over the rounds.
 *
 *   cc -O2 benchmarks/fan_out_floor.c -o fan_out_floor && ./fan_out_floor [max_readers [rounds]]
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ITERS 20000
#define WARMUP 2000
#define MAX_READERS 15
#define MAX_ROUNDS 16

enum layout { LINES, LINES_PREFETCHW, LINES_FENCE, LINES_WORK, LINES_NT, SHARED, SHARED_DEMOTE, NLAYOUTS };
static const char *names[NLAYOUTS] = {"lines", "lines+prefetchw", "lines+fence", "lines+stores", "lines+nt",
                                      "shared", "shared+cldemote"};
/* What a sender does besides the message's own stores, per reader: this many stores to its own
 * (cached) memory between one reader's line and the next's. */
#define WORK_STORES 48
static volatile uint64_t scratch[WORK_STORES * 8];

struct line {
    _Alignas(128) _Atomic uint64_t word;
    uint64_t payload[7];
};

struct shared {
    struct line msg[MAX_READERS];
    struct line bell;
    struct line ack[MAX_READERS];
    _Alignas(128) _Atomic int go;
};

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void pin(int core) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(core, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
        perror("sched_setaffinity");
        exit(1);
    }
}

static void cldemote(const void *p) {
    /* CLDEMOTE m8 (NP 0F 1C /0), [rax]: a hint NOP on processors without it. */
    __asm__ volatile(".byte 0x0f, 0x1c, 0x00" ::"a"(p) : "memory");
}

static void reader(struct shared *s, int me, enum layout layout) {
    _Atomic uint64_t *watch = (layout == SHARED || layout == SHARED_DEMOTE) ? &s->bell.word : &s->msg[me].word;
    for (uint64_t k = 1; k <= ITERS + WARMUP; k++) {
        while (atomic_load_explicit(watch, memory_order_acquire) != k) _mm_pause();
        atomic_store_explicit(&s->ack[me].word, k, memory_order_release);
    }
}

static void publish(struct shared *s, int n, enum layout layout, uint64_t k) {
    switch (layout) {
    case LINES_PREFETCHW:
        for (int i = 0; i < n; i++) __builtin_prefetch(&s->msg[i], 1, 3);
        /* fall through */
    case LINES:
        for (int i = 0; i < n; i++) {
            s->msg[i].payload[0] = k;
            atomic_store_explicit(&s->msg[i].word, k, memory_order_release);
        }
        break;
    case LINES_FENCE:
        for (int i = 0; i < n; i++) {
            s->msg[i].payload[0] = k;
            atomic_store_explicit(&s->msg[i].word, k, memory_order_seq_cst);
        }
        break;
    case LINES_WORK:
        for (int i = 0; i < n; i++) {
            s->msg[i].payload[0] = k;
            atomic_store_explicit(&s->msg[i].word, k, memory_order_release);
            for (int w = 0; w < WORK_STORES; w++) scratch[w * 8] = k + w;
        }
        break;
    case LINES_NT:
        for (int i = 0; i < n; i++) {
            _mm_stream_si64((long long *)&s->msg[i].payload[0], (long long)k);
            _mm_stream_si64((long long *)&s->msg[i].word, (long long)k);
        }
        _mm_sfence();
        break;
    case SHARED:
    case SHARED_DEMOTE:
        s->bell.payload[0] = k;
        atomic_store_explicit(&s->bell.word, k, memory_order_release);
        if (layout == SHARED_DEMOTE) cldemote(&s->bell);
        break;
    default:
        break;
    }
}

static int cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The hand-off's p50 (ns) for `layout` to `n` readers. */
static double run(struct shared *s, int n, enum layout layout) {
    static uint64_t samples[ITERS];
    memset(s, 0, sizeof *s);
    pid_t pids[MAX_READERS];
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            pin(1 + i);
            while (!atomic_load(&s->go)) _mm_pause();
            reader(s, i, layout);
            _exit(0);
        }
    }
    atomic_store(&s->go, 1);
    for (uint64_t k = 1; k <= ITERS + WARMUP; k++) {
        uint64_t t0 = now_ns();
        publish(s, n, layout, k);
        for (;;) {
            int all = 1;
            for (int i = 0; i < n; i++) all &= atomic_load_explicit(&s->ack[i].word, memory_order_acquire) == k;
            if (all) break;
            _mm_pause();
        }
        uint64_t t1 = now_ns();
        if (k > WARMUP) samples[k - WARMUP - 1] = t1 - t0;
    }
    for (int i = 0; i < n; i++) waitpid(pids[i], NULL, 0);
    qsort(samples, ITERS, sizeof samples[0], cmp);
    return (double)samples[ITERS / 2];
}

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int max = argc > 1 ? atoi(argv[1]) : 8;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    if (max < 1 || max > MAX_READERS || rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "usage: %s [max_readers 1..%d [rounds 1..%d]]\n", argv[0], MAX_READERS, MAX_ROUNDS);
        return 2;
    }
    if (sysconf(_SC_NPROCESSORS_ONLN) < max + 1) {
        fprintf(stderr, "%d readers and the writer need %d cores\n", max, max + 1);
        return 2;
    }
    struct shared *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    pin(0);
    int ns[] = {1, 2, 4, 8, 15};
    int counts = 0;
    while (counts < 5 && ns[counts] <= max) counts++;
    static double p50[NLAYOUTS][5][MAX_ROUNDS];
    printf("# hand-off p50 (ns) to N readers, writer on core 0, readers on cores 1..N; %d hand-offs per row\n", ITERS);
    for (int r = 0; r < rounds; r++) {
        for (int c = 0; c < counts; c++) {
            for (int l = 0; l < NLAYOUTS; l++) {
                p50[l][c][r] = run(s, ns[c], (enum layout)l);
                printf("round %d  N %2d  %-16s %7.0f ns\n", r, ns[c], names[l], p50[l][c][r]);
                fflush(stdout);
            }
        }
    }
    printf("# median over %d rounds: p50 (ns), and x its own layout at N = 1\n", rounds);
    printf("%-16s", "layout");
    for (int c = 0; c < counts; c++) printf("   N=%-2d ns    x", ns[c]);
    printf("\n");
    for (int l = 0; l < NLAYOUTS; l++) {
        double med[5];
        for (int c = 0; c < counts; c++) {
            double v[MAX_ROUNDS];
            memcpy(v, p50[l][c], sizeof(double) * rounds);
            qsort(v, rounds, sizeof v[0], cmpd);
            med[c] = v[rounds / 2];
        }
        printf("%-16s", names[l]);
        for (int c = 0; c < counts; c++) printf("  %7.0f %5.2f", med[c], med[c] / med[0]);
        printf("\n");
    }
    return 0;
}
