/* The pollable fd of a channel whose producer is killed (SIGKILL), through the C API.
 *
 *   test_channel_peer_death                 the consumer; starts each round's producer
 *   test_channel_peer_death producer NAME   a producer that sends three messages and waits
 *                                           to be killed
 *
 * Twenty rounds, a fresh channel each: the consumer reads the producer's messages through
 * lf_channel_fd and lf_try_recv, kills the producer, and then calls lf_try_recv at every
 * wake-up of the fd. Each of those must answer LF_ERR_PEER_GONE, never LF_ERR_WOULD_BLOCK:
 * readable means the next lf_try_recv has something to say, and an event loop told
 * WOULD_BLOCK by a readable fd spins. The fd polls readable as soon as the kernel knows of
 * the death, which can be before the library's watcher thread has reported it. Once
 * PEER_GONE has been said, a readable fd keeps saying it. The runtime dir is left empty. */
#define _GNU_SOURCE
#include <lava_flow.h>

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures = 0;

#include "check.h"

#define ROUNDS 20
#define MESSAGES 3u
#define SECOND 1000000000LL
/* The most wake-ups one round waits through for PEER_GONE (a spinning loop, if broken). */
#define MAX_WAKES 100000

static lf_context *context = NULL;

static lf_channel *open_channel(const char *name, lf_role role, lf_wait_strategy wait) {
    lf_location *here = NULL;
    lf_channel *channel = NULL;
    lf_channel_config config;
    EXPECT(lf_channel_config_init(&config, sizeof config), LF_OK);
    config.wait_strategy = wait;
    config.spin_ns = 20000;
    config.rendezvous_timeout_ns = 30 * SECOND;
    EXPECT(lf_location_detect(&here), LF_OK);
    EXPECT(lf_channel_create(context, name, role, here, here, &config, &channel), LF_OK);
    lf_location_free(here);
    return channel;
}

static int open_context(void) {
    lf_context_config context_config;
    lf_context_config_init(&context_config, sizeof context_config);
    context_config.gpu_policy = LF_GPU_DISABLED;
    EXPECT(lf_context_create(&context_config, &context), LF_OK);
    return context != NULL;
}

static int readable(int fd, int timeout_ms) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n = poll(&p, 1, timeout_ms);
    CHECK(n >= 0);
    return n == 1;
}

static int run_producer(const char *name) {
    lf_channel *ch;
    if (!open_context()) return 1;
    ch = open_channel(name, LF_ROLE_PRODUCER, LF_WAIT_BLOCK);
    if (ch == NULL) return 1;
    for (uint64_t i = 0; i < MESSAGES; i++) EXPECT(lf_send(ch, &i, sizeof i, 30 * SECOND, NULL), LF_OK);
    if (failures != 0) return 1;
    for (;;) pause();
}

static pid_t start_producer(const char *self, const char *name) {
    pid_t child;
    fflush(NULL);
    child = fork();
    if (child == 0) {
        /* A fresh process: the parent may have threads (the library's watcher). */
        execl(self, self, "producer", name, (char *)NULL);
        _exit(127);
    }
    CHECK(child > 0);
    return child;
}

/* One round: returns how many times lf_try_recv answered WOULD_BLOCK to a wake-up of the
 * fd after the producer's death, or -1 if the round failed otherwise. */
static int round_of(const char *self, const char *name, lf_wait_strategy wait) {
    pid_t child = start_producer(self, name);
    lf_channel *ch = open_channel(name, LF_ROLE_CONSUMER, wait);
    lf_message m;
    lf_status s;
    int fd = -1, status = 0, would_block = 0, wakes = 0;
    uint64_t got = 0;
    if (ch == NULL || child <= 0) return -1;
    EXPECT(lf_channel_fd(ch, &fd), LF_OK);
    while (got < MESSAGES && failures == 0) {
        CHECK(readable(fd, 20000));
        s = lf_try_recv(ch, &m);
        if (s == LF_ERR_WOULD_BLOCK) continue;
        EXPECT(s, LF_OK);
        if (s != LF_OK) break;
        CHECK(m.len == sizeof got && memcmp(m.data, &got, sizeof got) == 0);
        EXPECT(lf_release(ch, &m), LF_OK);
        got++;
    }
    /* All read: the fd is quiet until the producer's end. */
    EXPECT(lf_try_recv(ch, &m), LF_ERR_WOULD_BLOCK);
    CHECK(kill(child, SIGKILL) == 0);
    /* Every wake-up from here on is the death's. */
    for (;;) {
        if (!readable(fd, 20000)) {
            fprintf(stderr, "%s: the producer's death never made the fd readable\n", name);
            failures++;
            break;
        }
        s = lf_try_recv(ch, &m);
        if (s == LF_ERR_PEER_GONE) break;
        if (s != LF_ERR_WOULD_BLOCK) {
            EXPECT(s, LF_ERR_PEER_GONE);
            break;
        }
        would_block++;
        if (++wakes >= MAX_WAKES) {
            fprintf(stderr, "%s: %d wake-ups and still no PEER_GONE\n", name, wakes);
            failures++;
            break;
        }
    }
    for (int i = 0; i < 3; i++)
        if (readable(fd, 0)) EXPECT(lf_try_recv(ch, &m), LF_ERR_PEER_GONE);
    CHECK(waitpid(child, &status, 0) == child);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    lf_channel_free(ch);
    return failures == 0 ? would_block : -1;
}

static int dir_is_empty(const char *path) {
    DIR *dir = opendir(path);
    struct dirent *e;
    int empty = 1;
    if (dir == NULL) return 0;
    while ((e = readdir(dir)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) empty = 0;
    closedir(dir);
    return empty;
}

int main(int argc, char **argv) {
    static const lf_wait_strategy waits[] = {LF_WAIT_BUSY_POLL, LF_WAIT_SPIN_THEN_BLOCK, LF_WAIT_BLOCK};
    char dir[] = "/tmp/lf-c-peer-death-XXXXXX";
    char self[4096];
    char name[64];
    int answers[ROUNDS] = {0}, failed = 0;
    ssize_t n;

    if (argc == 3 && strcmp(argv[1], "producer") == 0) return run_producer(argv[2]);
    if (argc != 1) {
        fprintf(stderr, "usage: %s [producer NAME]\n", argv[0]);
        return 2;
    }
    n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 1;
    self[n] = '\0';
    /* A private runtime dir (mkdtemp makes it 0700), checked empty at the end. */
    if (mkdtemp(dir) == NULL) return 1;
    setenv("LF_RUNTIME_DIR", dir, 1);
    if (!open_context()) return 1;
    for (int r = 0; r < ROUNDS && failures == 0; r++) {
        snprintf(name, sizeof name, "c-peer-death-%d-%d", (int)getpid(), r);
        answers[r] = round_of(self, name, waits[r % 3]);
        if (answers[r] != 0) failed++;
    }
    if (failed != 0) {
        fprintf(stderr, "lf_try_recv answered LF_ERR_WOULD_BLOCK after the fd woke for the producer's death in %d "
                        "of %d rounds; answers per round:",
                failed, ROUNDS);
        for (int r = 0; r < ROUNDS; r++) fprintf(stderr, " %d", answers[r]);
        fprintf(stderr, "\n");
        failures++;
    }
    lf_context_free(context);
    CHECK(dir_is_empty(dir));
    rmdir(dir);
    if (failures == 0) printf("test_channel_peer_death: OK\n");
    return failures != 0;
}
