/* What a ring costs beside the spinning floor, and whether where its lines sit changes that.
 *
 * Two processes pinned to two cores play ping-pong, each message one write the other side
 * spins on, with nothing of lava-flow in between:
 *   spin          one cache line bounced both ways (lf-bench's spinning floor)
 *   ring          two rings of 256 slots of 128 bytes, a sequence word and a length per slot,
 *                 the receiver storing a tail word after each message (lf-bench's minimal ring,
 *                 the layout of lava-flow's shared-memory channels)
 *   ring+read     the same, the sender loading the next slot's word right after it publishes
 *                 (so that the line it writes next is in its cache, as the floor's always is)
 *   ring+prefetchw the same with a prefetch for writing instead of a load
 *   ring/1, ring/4, ring/16  rings of 1, 4 and 16 slots (fewer lines in turn; with one slot each
 *                 direction has a line of its own, the least two one-way channels can use)
 *   ring/64B      slots 64 bytes apart
 *   ring+completion  the ring, each sender waiting before it sends for the other side's tail
 *                 to show its previous message released (what a buffer send waits for with
 *                 lf_wait_completed before the buffer is rewritten)
 *   ring+cldemote, spin+cldemote  the ring and the floor, each writer demoting the line it has
 *                 just written to the shared L3 (CLDEMOTE; a NOP where the processor lacks it)
 * Each case runs between two probes of the floor; "x" is its p50 (and its mean) over theirs. The
 * last lines are each case's median ratio over the rounds, and its median p99.9 over its p50.
 *
 *   cc -O2 benchmarks/ring_layout.c -o ring_layout && ./ring_layout [core_a core_b [rounds]]
 *
 * A ring costing clearly more than the floor, and a variant that closes the gap, would say what
 * lava-flow's producer should do with the slot it writes next.
 */
#define _GNU_SOURCE
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

#define ITERS 200000
#define RING_BYTES (1 << 20)
#define MAX_ROUNDS 32

enum mode { SPIN, RING, RING_READ, RING_PREFETCHW, RING_COMPLETION, RING_DEMOTE, SPIN_DEMOTE, NMODES };
struct kase {
    const char *name;
    enum mode mode;
    int slots, stride;
};
static const struct kase cases[] = {
    {"ring", RING, 256, 128},          {"ring+read", RING_READ, 256, 128}, {"ring+prefetchw", RING_PREFETCHW, 256, 128},
    {"ring/1", RING, 1, 128},          {"ring/4", RING, 4, 128},          {"ring/16", RING, 16, 128},         {"ring/64B", RING, 256, 64},
    {"ring+completion", RING_COMPLETION, 256, 128},
    {"ring+cldemote", RING_DEMOTE, 256, 128},  {"spin+cldemote", SPIN_DEMOTE, 0, 0},
};
#define NCASES (sizeof cases / sizeof cases[0])

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

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void spin_until(_Atomic uint64_t *word, uint64_t value) {
    while (atomic_load_explicit(word, memory_order_acquire) != value) __builtin_ia32_pause();
}

/* CLDEMOTE: a hint that moves the line from this core's caches to the shared L3, so that the
 * next reader is served from there rather than by a snoop of this core; a NOP on processors
 * without it (its encoding lies in the reserved NOP space). */
static inline void demote(const void *p) { __asm__ volatile(".byte 0x0f, 0x1c, 0x07" ::"D"(p) : "memory"); }

static uint64_t lat[ITERS];
static int core_a = 0, core_b = 1;

/* Half round trips of one ping-pong, ns: the p50, the mean (which the clock's steps, 5-10 ns
 * on some VMs, do not round), and the p99.9 (what interrupts of the cores add: a ping-pong as long
 * as lf-bench's cases, so that the tail of the floor is seen over as long a run as theirs). */
struct result {
    double p50, mean, p999;
};

/* One ping-pong of ITERS round trips. */
static struct result run(char *mem, enum mode mode, int slots, int stride) {
    memset(mem, 0, 3 * RING_BYTES);
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        exit(1);
    }
    int ping = child != 0;
    pin(ping ? core_a : core_b);
    char *out_ring = mem + (ping ? 0 : RING_BYTES), *in_ring = mem + (ping ? RING_BYTES : 0);
    _Atomic uint64_t *tail = (_Atomic uint64_t *)(mem + 2 * RING_BYTES + (ping ? 0 : 256));
    _Atomic uint64_t *peer_tail = (_Atomic uint64_t *)(mem + 2 * RING_BYTES + (ping ? 256 : 0));
    _Atomic uint64_t *line = (_Atomic uint64_t *)(mem + 2 * RING_BYTES + 4096);
    uint64_t start = now_ns(), last = start;
    for (uint64_t k = 0; k < ITERS; k++) {
        if (mode == SPIN || mode == SPIN_DEMOTE) {
            if (ping) {
                atomic_store_explicit(line, 2 * k + 1, memory_order_release);
                if (mode == SPIN_DEMOTE) demote((const void *)line);
                spin_until(line, 2 * k + 2);
            } else {
                spin_until(line, 2 * k + 1);
                atomic_store_explicit(line, 2 * k + 2, memory_order_release);
                if (mode == SPIN_DEMOTE) demote((const void *)line);
            }
        } else {
            _Atomic uint64_t *out = (_Atomic uint64_t *)(out_ring + (k % slots) * stride);
            _Atomic uint64_t *next = (_Atomic uint64_t *)(out_ring + ((k + 1) % slots) * stride);
            _Atomic uint64_t *in = (_Atomic uint64_t *)(in_ring + (k % slots) * stride);
            for (int turn = 0; turn < 2; turn++) {
                if ((turn == 0) == (ping != 0)) { /* send */
                    if (mode == RING_COMPLETION) /* message k - 1 released by the other side */
                        while (atomic_load_explicit(peer_tail, memory_order_acquire) < k) __builtin_ia32_pause();
                    atomic_store_explicit(&out[1], 64, memory_order_relaxed);
                    atomic_store_explicit(&out[0], k + 1, memory_order_release);
                    if (mode == RING_READ) (void)atomic_load_explicit(next, memory_order_relaxed);
                    if (mode == RING_PREFETCHW) __builtin_prefetch((const void *)next, 1, 3);
                    if (mode == RING_DEMOTE) demote((const void *)out);
                } else { /* receive and release */
                    spin_until(&in[0], k + 1);
                    (void)atomic_load_explicit(&in[1], memory_order_relaxed);
                    atomic_store_explicit(tail, k + 1, memory_order_release);
                }
            }
        }
        if (ping) {
            uint64_t t = now_ns();
            lat[k] = t - last;
            last = t;
        }
    }
    if (!ping) _exit(0);
    waitpid(child, NULL, 0);
    qsort(lat, ITERS, sizeof lat[0], cmp_u64);
    return (struct result){lat[ITERS / 2] / 2.0, (last - start) / 2.0 / ITERS, lat[ITERS - ITERS / 1000] / 2.0};
}

static double median(double *v, int n) {
    double s[MAX_ROUNDS];
    memcpy(s, v, n * sizeof *v);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && s[j - 1] > s[j]; j--) {
            double t = s[j];
            s[j] = s[j - 1];
            s[j - 1] = t;
        }
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

int main(int argc, char **argv) {
    int rounds = 5;
    if (argc > 2) {
        core_a = atoi(argv[1]);
        core_b = atoi(argv[2]);
    }
    if (argc > 3) rounds = atoi(argv[3]);
    if (rounds < 1 || rounds > MAX_ROUNDS) rounds = 5;
    char *mem = mmap(NULL, 3 * RING_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    printf("# half round trips, p50/mean ns, %d round trips per case, cores %d and %d; x = p50 / the mean of the\n"
           "# spinning floor probed right before and right after the case\n",
           ITERS, core_a, core_b);
    static double ratio[NCASES][MAX_ROUNDS], ratio_mean[NCASES][MAX_ROUNDS], tail[NCASES][MAX_ROUNDS],
        spin_tail[MAX_ROUNDS];
    for (int r = 0; r < rounds; r++) {
        struct result before = run(mem, SPIN, 0, 0);
        printf("round %d: spin %.0f/%.1f", r + 1, before.p50, before.mean);
        spin_tail[r] = before.p999 / before.p50;
        for (size_t c = 0; c < NCASES; c++) {
            struct result x = run(mem, cases[c].mode, cases[c].slots, cases[c].stride);
            struct result after = run(mem, SPIN, 0, 0);
            ratio[c][r] = x.p50 / ((before.p50 + after.p50) / 2);
            ratio_mean[c][r] = x.mean / ((before.mean + after.mean) / 2);
            tail[c][r] = x.p999 / x.p50;
            printf(" | %s %.0f/%.1f (%.2fx/%.2fx) spin %.0f/%.1f", cases[c].name, x.p50, x.mean, ratio[c][r],
                   ratio_mean[c][r], after.p50, after.mean);
            before = after;
        }
        printf("\n");
    }
    printf("median x spin over %d rounds, p50/mean:", rounds);
    for (size_t c = 0; c < NCASES; c++)
        printf(" %s %.2fx/%.2fx", cases[c].name, median(ratio[c], rounds), median(ratio_mean[c], rounds));
    printf("\nmedian p99.9/p50 over %d rounds: spin %.1fx", rounds, median(spin_tail, rounds));
    for (size_t c = 0; c < NCASES; c++) printf(" %s %.1fx", cases[c].name, median(tail[c], rounds));
    printf("\n");
    return 0;
}
