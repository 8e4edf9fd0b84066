/* A fan-in channel through the C API, between real processes.
 *
 *   test_channel_fan_in                           the consumer; starts the producers
 *   test_channel_fan_in producer NAME MESSAGES    sends MESSAGES numbered messages, then holds
 *                                                 its slot until its stdin closes (or it is killed)
 *   test_channel_fan_in full NAME                 a producer of the full fan-in: must be refused
 *
 * Four producers of a fan-in of max_peers 4: every message's `producer` slot keeps its own
 * order (sequence numbers and the producer's count from 0, the same pid throughout), and
 * lf_channel_peers lists the four alive with their pids. A fifth producer is refused at once
 * with LF_ERR_INVALID_STATE naming max_peers. Then three producers close and the fourth is
 * killed (SIGKILL): each end is one LF_ERR_PEER_GONE with `producer` set to that producer's
 * slot, after its last message, and the slot is free again. A late producer takes the lowest
 * free slot, its messages numbered from 0 again. The runtime dir is left empty. */
#define _GNU_SOURCE
#include <lava_flow.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures = 0;

#include "check.h"

#define PRODUCERS 4u
#define MESSAGES 20000u
#define SECOND 1000000000LL
#define KILLED 3u /* which of the producers (by start order) is killed rather than closed */

typedef struct {
    uint64_t number;
    uint64_t pid;
} fan_in_message;

static lf_context *context = NULL;

static lf_status open_end(const char *name, lf_role role, lf_channel **out) {
    lf_location *here = NULL;
    lf_channel_config config;
    lf_status st;
    EXPECT(lf_channel_config_init(&config, sizeof config), LF_OK);
    config.kind = LF_CHANNEL_FAN_IN;
    config.max_peers = PRODUCERS;
    config.wait_strategy = LF_WAIT_SPIN_THEN_BLOCK;
    config.spin_ns = 20000;
    config.capacity = 64;
    config.rendezvous_timeout_ns = 30 * SECOND;
    EXPECT(lf_location_detect(&here), LF_OK);
    st = lf_channel_create(context, name, role, here, here, &config, out);
    lf_location_free(here);
    return st;
}

static int open_context(void) {
    lf_context_config context_config;
    lf_context_config_init(&context_config, sizeof context_config);
    context_config.gpu_policy = LF_GPU_DISABLED;
    EXPECT(lf_context_create(&context_config, &context), LF_OK);
    return context != NULL;
}

static int run_producer(const char *name, uint64_t messages) {
    lf_channel *ch = NULL;
    char byte;
    if (!open_context()) return 1;
    EXPECT(open_end(name, LF_ROLE_PRODUCER, &ch), LF_OK);
    if (ch == NULL) return 1;
    for (uint64_t i = 0; i < messages && failures == 0; i++) {
        fan_in_message m = {i, (uint64_t)getpid()};
        uint64_t sequence = UINT64_MAX;
        EXPECT(lf_send(ch, &m, sizeof m, 30 * SECOND, &sequence), LF_OK);
        CHECK(sequence == i);
    }
    /* Holds the slot until the consumer says go (closes our stdin). */
    while (read(0, &byte, 1) > 0) {
    }
    lf_channel_free(ch);
    lf_context_free(context);
    return failures != 0;
}

static int run_full(const char *name) {
    lf_channel *ch = NULL;
    if (!open_context()) return 1;
    EXPECT(open_end(name, LF_ROLE_PRODUCER, &ch), LF_ERR_INVALID_STATE);
    EXPECT_MESSAGE("is full");
    EXPECT_MESSAGE("max_peers = 4");
    CHECK(ch == NULL);
    lf_channel_free(ch);
    lf_context_free(context);
    return failures != 0;
}

/* Starts `self ROLE NAME [MESSAGES]` with `in` as its stdin (-1: /dev/null). */
static pid_t start(const char *self, const char *role, const char *name, unsigned messages, int in) {
    char count[32];
    pid_t child;
    snprintf(count, sizeof count, "%u", messages);
    fflush(NULL);
    child = fork();
    if (child == 0) {
        int fd = in >= 0 ? in : open("/dev/null", O_RDONLY);
        if (fd < 0 || dup2(fd, 0) < 0) _exit(126);
        /* A fresh process: the parent has the library's threads. */
        execl(self, self, role, name, count, (char *)NULL);
        _exit(127);
    }
    CHECK(child > 0);
    return child;
}

static int exited_ok(pid_t child) {
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* The next LF_ERR_PEER_GONE, with the slot it names; any message before it is a failure. */
static uint32_t next_end(lf_channel *ch) {
    lf_message m;
    memset(&m, 0, sizeof m);
    m.producer = UINT32_MAX;
    EXPECT(lf_recv(ch, 30 * SECOND, &m), LF_ERR_PEER_GONE);
    EXPECT_MESSAGE("slot");
    CHECK(m.data == NULL && m.len == 0 && m.producer < PRODUCERS);
    return m.producer;
}

static void expect_states(lf_channel *ch, lf_peer_state state, const pid_t *pids) {
    lf_peer peers[LF_MAX_PEERS];
    size_t count = 0;
    EXPECT(lf_channel_peers(ch, peers, sizeof(lf_peer), LF_MAX_PEERS, &count), LF_OK);
    CHECK(count == PRODUCERS);
    for (size_t i = 0; i < count && i < PRODUCERS; i++) {
        CHECK(peers[i].slot == i && peers[i].state == state && peers[i].rank == -1);
        if (state == LF_PEER_ALIVE) {
            CHECK(strcmp(peers[i].route, "shm") == 0 && peers[i].host[0] != '\0');
            CHECK(pids != NULL && (pid_t)peers[i].pid == pids[i]);
        } else {
            CHECK(peers[i].pid == 0 && peers[i].route[0] == '\0' && peers[i].host[0] == '\0');
        }
    }
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

static void run_consumer(const char *self, const char *name) {
    pid_t producers[PRODUCERS], by_slot[PRODUCERS] = {0}, full, late;
    uint64_t next[PRODUCERS] = {0}, received = 0;
    uint32_t ended_slots = 0;
    int go[2], hold[2];
    lf_channel *ch = NULL;
    lf_message m;

    /* The producers' stdin: closing `go`'s write end tells them to close; the one to be killed
     * waits on `hold`, kept open until it is dead. Close-on-exec keeps the pipes out of the
     * children but for their stdin. */
    CHECK(pipe2(go, O_CLOEXEC) == 0 && pipe2(hold, O_CLOEXEC) == 0);
    for (unsigned i = 0; i < PRODUCERS; i++)
        producers[i] = start(self, "producer", name, MESSAGES, i == KILLED ? hold[0] : go[0]);
    close(go[0]);
    close(hold[0]);
    EXPECT(open_end(name, LF_ROLE_CONSUMER, &ch), LF_OK);
    if (ch == NULL) return;

    /* Every message, in its producer's order. */
    while (received < (uint64_t)PRODUCERS * MESSAGES && failures == 0) {
        fan_in_message got;
        EXPECT(lf_recv(ch, 30 * SECOND, &m), LF_OK);
        if (failures != 0) break;
        CHECK(m.producer < PRODUCERS && m.len == sizeof got);
        if (failures != 0) break;
        memcpy(&got, m.data, sizeof got);
        if (got.number == 0) by_slot[m.producer] = (pid_t)got.pid;
        if (got.number != next[m.producer] || m.sequence != got.number || (pid_t)got.pid != by_slot[m.producer]) {
            fprintf(stderr, "slot %u: message %llu (sequence %llu, pid %llu) where %llu was due\n", m.producer,
                    (unsigned long long)got.number, (unsigned long long)m.sequence, (unsigned long long)got.pid,
                    (unsigned long long)next[m.producer]);
            failures++;
        }
        next[m.producer]++;
        received++;
        EXPECT(lf_release(ch, &m), LF_OK);
    }
    for (unsigned s = 0; s < PRODUCERS; s++) CHECK(next[s] == MESSAGES);
    /* Each producer is in one slot, as lf_channel_peers says. */
    for (unsigned i = 0; i < PRODUCERS; i++) {
        int slots = 0;
        for (unsigned s = 0; s < PRODUCERS; s++) slots += by_slot[s] == producers[i];
        CHECK(slots == 1);
    }
    expect_states(ch, LF_PEER_ALIVE, by_slot);

    /* A fifth producer is refused at once; the consumer keeps receiving (nothing comes). */
    full = start(self, "full", name, 0, -1);
    for (int waited = 0; waited < 600 && failures == 0; waited++) {
        int status = 0;
        pid_t done = waitpid(full, &status, WNOHANG);
        if (done == full) {
            CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
            full = 0;
            break;
        }
        EXPECT(lf_recv(ch, 50 * 1000 * 1000, &m), LF_ERR_TIMEOUT);
    }
    CHECK(full == 0);
    expect_states(ch, LF_PEER_ALIVE, by_slot);

    /* Three close, one is killed: four ends, each naming its producer's slot once. */
    close(go[1]);
    for (unsigned i = 0; i < PRODUCERS; i++)
        if (i != KILLED) CHECK(exited_ok(producers[i]));
    for (unsigned e = 0; e < PRODUCERS - 1; e++) {
        uint32_t slot = next_end(ch);
        if (slot >= PRODUCERS) break;
        CHECK(by_slot[slot] != producers[KILLED] && !(ended_slots & (1u << slot)));
        ended_slots |= 1u << slot;
    }
    CHECK(kill(producers[KILLED], SIGKILL) == 0);
    {
        int status = 0;
        uint32_t slot = next_end(ch);
        CHECK(slot < PRODUCERS && by_slot[slot] == producers[KILLED] && !(ended_slots & (1u << slot)));
        CHECK(waitpid(producers[KILLED], &status, 0) == producers[KILLED]);
        CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
        close(hold[1]);
    }
    expect_states(ch, LF_PEER_FREE, NULL);
    EXPECT(lf_try_recv(ch, &m), LF_ERR_WOULD_BLOCK);

    /* A late producer takes the lowest free slot, numbered from 0 again. */
    late = start(self, "producer", name, 3, -1);
    for (uint64_t i = 0; i < 3 && failures == 0; i++) {
        EXPECT(lf_recv(ch, 30 * SECOND, &m), LF_OK);
        CHECK(m.producer == 0 && m.sequence == i);
        EXPECT(lf_release(ch, &m), LF_OK);
    }
    CHECK(next_end(ch) == 0);
    CHECK(exited_ok(late));
    lf_channel_free(ch);
}

int main(int argc, char **argv) {
    char dir[] = "/tmp/lf-c-fan-in-XXXXXX";
    char self[4096];
    char name[64];
    ssize_t n;

    if (argc == 4 && strcmp(argv[1], "producer") == 0) return run_producer(argv[2], strtoull(argv[3], NULL, 10));
    if (argc >= 3 && strcmp(argv[1], "full") == 0) return run_full(argv[2]);
    if (argc != 1) {
        fprintf(stderr, "usage: %s [producer NAME MESSAGES | full NAME]\n", argv[0]);
        return 2;
    }
    n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 1;
    self[n] = '\0';
    /* A private runtime dir (mkdtemp makes it 0700), checked empty at the end. */
    if (mkdtemp(dir) == NULL) return 1;
    setenv("LF_RUNTIME_DIR", dir, 1);
    if (!open_context()) return 1;
    snprintf(name, sizeof name, "c-fan-in-%d", (int)getpid());
    run_consumer(self, name);
    lf_context_free(context);
    CHECK(dir_is_empty(dir));
    rmdir(dir);
    if (failures == 0) printf("test_channel_fan_in: OK\n");
    return failures != 0;
}
