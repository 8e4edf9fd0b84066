// Ping-pong between two processes: shared futex words in a memfd mapping, against eventfds.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <unistd.h>
#include <sched.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <poll.h>

static long fx(void *w, int op, uint32_t v) { return syscall(SYS_futex, w, op, v, NULL, NULL, 0); }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
static void pin(int c) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(c, &s); sched_setaffinity(0, sizeof s, &s); }
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return x < y ? -1 : x > y; }
#define N 20000

struct shared { _Atomic uint32_t w[2][32]; };

int main(int argc, char **argv) {
    int c0 = argc > 1 ? atoi(argv[1]) : 2, c1 = argc > 2 ? atoi(argv[2]) : 6;
    int mode_private = argc > 3 ? atoi(argv[3]) : 0; // 1: MAP_ANONYMOUS|MAP_SHARED instead of memfd
    for (int round = 0; round < 3; round++) {
        // futex
        int fd = memfd_create("fx", 0); ftruncate(fd, 4096);
        struct shared *s = mode_private ? mmap(0, 4096, PROT_READ|PROT_WRITE, MAP_SHARED|MAP_ANONYMOUS, -1, 0)
                                        : mmap(0, 4096, PROT_READ|PROT_WRITE, MAP_SHARED, fd, 0);
        s->w[0][0] = 0; s->w[1][0] = 0;
        static double lat[N];
        pid_t p = fork();
        if (p == 0) {
            pin(c1);
            for (uint32_t i = 1; i <= N + 1000; i++) {
                while (atomic_load(&s->w[0][0]) != i) fx(&s->w[0][0], FUTEX_WAIT, i - 1);
                atomic_store(&s->w[1][0], i); fx(&s->w[1][0], FUTEX_WAKE, 1);
            }
            _exit(0);
        }
        pin(c0);
        for (uint32_t i = 1; i <= N + 1000; i++) {
            double t = now();
            atomic_store(&s->w[0][0], i); fx(&s->w[0][0], FUTEX_WAKE, 1);
            while (atomic_load(&s->w[1][0]) != i) fx(&s->w[1][0], FUTEX_WAIT, i - 1);
            if (i > 1000) lat[i - 1001] = (now() - t) / 2;
        }
        waitpid(p, 0, 0);
        qsort(lat, N, sizeof lat[0], cmp);
        printf("futex(%s) one-way p50 %.0f ns\n", mode_private ? "anon shared" : "memfd", lat[N / 2]);
        // eventfd
        int a = eventfd(0, 0), b = eventfd(0, 0);
        p = fork();
        if (p == 0) {
            pin(c1); uint64_t v;
            for (int i = 0; i < N + 1000; i++) { read(a, &v, 8); v = 1; write(b, &v, 8); }
            _exit(0);
        }
        for (int i = 0; i < N + 1000; i++) {
            double t = now(); uint64_t v = 1;
            write(a, &v, 8); read(b, &v, 8);
            if (i >= 1000) lat[i - 1000] = (now() - t) / 2;
        }
        waitpid(p, 0, 0);
        qsort(lat, N, sizeof lat[0], cmp);
        printf("eventfd one-way p50 %.0f ns\n", lat[N / 2]);
        close(a); close(b);
        // non-blocking eventfds, waited on with poll (a timeout of 15 ms) and drained with read
        a = eventfd(0, EFD_NONBLOCK); b = eventfd(0, EFD_NONBLOCK);
        p = fork();
        if (p == 0) {
            pin(c1); uint64_t v;
            for (int i = 0; i < N + 1000; i++) {
                struct pollfd q = { a, POLLIN, 0 };
                while (read(a, &v, 8) != 8) poll(&q, 1, 15);
                v = 1; write(b, &v, 8);
            }
            _exit(0);
        }
        for (int i = 0; i < N + 1000; i++) {
            double t = now(); uint64_t v = 1;
            write(a, &v, 8);
            struct pollfd q = { b, POLLIN, 0 };
            while (read(b, &v, 8) != 8) poll(&q, 1, 15);
            if (i >= 1000) lat[i - 1000] = (now() - t) / 2;
        }
        waitpid(p, 0, 0);
        qsort(lat, N, sizeof lat[0], cmp);
        printf("eventfd poll+read one-way p50 %.0f ns\n", lat[N / 2]);
        close(a); close(b); close(fd);
    }
    return 0;
}
