// Blocking wake-ups between two processes, one-way p50 of a ping-pong, in turns:
// a futex in a shared memfd (as the channels sleep today), an eventfd (blocking read: the
// benchmark's floor), and a pipe (blocking read on the read end, a non-blocking write end).
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <unistd.h>
#include <fcntl.h>
#include <sched.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#include <stdatomic.h>

static long fx(void *w, int op, uint32_t v) { return syscall(SYS_futex, w, op, v, NULL, NULL, 0); }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
static void pin(int c) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(c, &s); sched_setaffinity(0, sizeof s, &s); }
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }
#define N 20000
#define W 1000
static double lat[N];

static double report(const char *what) {
    qsort(lat, N, sizeof lat[0], cmp);
    printf("%-8s one-way p50 %6.0f ns  p99 %6.0f ns\n", what, lat[N / 2], lat[N * 99 / 100]);
    return lat[N / 2];
}

static double futex_round(int c0, int c1) {
    int fd = memfd_create("fx", 0); ftruncate(fd, 4096);
    _Atomic uint32_t *w = mmap(0, 4096, PROT_READ|PROT_WRITE, MAP_SHARED, fd, 0);
    _Atomic uint32_t *a = w, *b = w + 32;
    pid_t p = fork();
    if (p == 0) {
        pin(c1);
        for (uint32_t i = 1; i <= N + W; i++) {
            while (atomic_load(a) != i) fx(a, FUTEX_WAIT, i - 1);
            atomic_store(b, i); fx(b, FUTEX_WAKE, 1);
        }
        _exit(0);
    }
    pin(c0);
    for (uint32_t i = 1; i <= N + W; i++) {
        double t = now();
        atomic_store(a, i); fx(a, FUTEX_WAKE, 1);
        while (atomic_load(b) != i) fx(b, FUTEX_WAIT, i - 1);
        if (i > W) lat[i - W - 1] = (now() - t) / 2;
    }
    waitpid(p, 0, 0); munmap(w, 4096); close(fd);
    return report("futex");
}

static double eventfd_round(int c0, int c1) {
    int a = eventfd(0, 0), b = eventfd(0, 0);
    pid_t p = fork();
    if (p == 0) {
        pin(c1); uint64_t v;
        for (int i = 0; i < N + W; i++) { read(a, &v, 8); v = 1; write(b, &v, 8); }
        _exit(0);
    }
    pin(c0);
    for (int i = 0; i < N + W; i++) {
        double t = now(); uint64_t v = 1;
        write(a, &v, 8); read(b, &v, 8);
        if (i >= W) lat[i - W] = (now() - t) / 2;
    }
    waitpid(p, 0, 0); close(a); close(b);
    return report("eventfd");
}

static double pipe_round(int c0, int c1) {
    int a[2], b[2];
    pipe2(a, O_CLOEXEC); pipe2(b, O_CLOEXEC);
    fcntl(a[1], F_SETFL, O_NONBLOCK); fcntl(b[1], F_SETFL, O_NONBLOCK);
    pid_t p = fork();
    if (p == 0) {
        pin(c1); char v = 1;
        for (int i = 0; i < N + W; i++) { read(a[0], &v, 1); write(b[1], &v, 1); }
        _exit(0);
    }
    pin(c0);
    for (int i = 0; i < N + W; i++) {
        double t = now(); char v = 1;
        write(a[1], &v, 1); read(b[0], &v, 1);
        if (i >= W) lat[i - W] = (now() - t) / 2;
    }
    waitpid(p, 0, 0); close(a[0]); close(a[1]); close(b[0]); close(b[1]);
    return report("pipe");
}

int main(int argc, char **argv) {
    int c0 = argc > 1 ? atoi(argv[1]) : 0, c1 = argc > 2 ? atoi(argv[2]) : 1;
    int rounds = argc > 3 ? atoi(argv[3]) : 9;
    for (int r = 0; r < rounds; r++) {
        double f = futex_round(c0, c1), e = eventfd_round(c0, c1), q = pipe_round(c0, c1);
        printf("round %d: futex %.3fx, pipe %.3fx the eventfd\n", r, f / e, q / e);
        fflush(stdout);
    }
    return 0;
}
