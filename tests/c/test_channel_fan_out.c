/* A fan-out channel through the C API, between real processes: this process is the producer,
 * the consumers are children (this program again, with a role).
 *
 *   test_channel_fan_out                          the producer; starts the consumers
 *   test_channel_fan_out consumer NAME COUNT      receives COUNT numbered messages in order and,
 *                                                 with BUFFER set, the buffer by reference,
 *                        [BUFFER]                 which it holds until a byte comes on its stdin
 *   test_channel_fan_out victim NAME              attaches, never receives, waits to be killed
 *   test_channel_fan_out slow NAME                attaches, receives only after its stdin closes
 *   test_channel_fan_out full NAME                a consumer of the full fan-out: must be refused
 *
 * Broadcast: four consumers each get every message in order (their sequence numbers from 0),
 * lf_channel_peers on the producer lists them with their pids, and a 1 MiB buffer sent by
 * reference is one memory for all four, not complete until the last of them released it.
 * Death: kill -9 of one consumer while the producer waits for its room; the producer goes on
 * and the three others get every message. Slowness: with slow_consumer_timeout_ns at 2 s, a
 * consumer that stops reading is detached; it later reads what it had, then LF_ERR_PEER_GONE
 * saying "detached". Full: a third consumer of a fan-out of max_peers 2 is refused with
 * LF_ERR_INVALID_STATE naming max_peers. The runtime dir is left empty. */
#define _GNU_SOURCE
#include <lava_flow.h>

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int failures = 0;

#include "check.h"

#define CONSUMERS 4u
#define MESSAGES 20000u
#define BUFFER_SIZE ((size_t)1 << 20)
#define SECOND 1000000000LL
#define MS 1000000LL

static lf_context *context = NULL;

static lf_status open_end(const char *name, lf_role role, uint32_t max_peers, uint32_t capacity,
                          int64_t slow_consumer_timeout_ns, lf_channel **out) {
    lf_location *here = NULL;
    lf_channel_config config;
    lf_status st;
    EXPECT(lf_channel_config_init(&config, sizeof config), LF_OK);
    config.kind = LF_CHANNEL_FAN_OUT;
    config.max_peers = max_peers;
    config.wait_strategy = LF_WAIT_SPIN_THEN_BLOCK;
    config.spin_ns = 20000;
    config.capacity = capacity;
    /* Small (the buffer goes by reference, outside it): each consumer maps the pool in whole
     * while the producer waits for its answer, which must come within 2 s on a loaded machine. */
    config.pool_size = 1 << 20;
    config.rendezvous_timeout_ns = 30 * SECOND;
    config.slow_consumer_timeout_ns = slow_consumer_timeout_ns;
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

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000 * 1000};
    nanosleep(&t, NULL);
}

static uint8_t buffer_byte(size_t i) { return (uint8_t)(i * 131u + 7u); }

/* Tells the parent (our stdout, a pipe) how far we are. */
static void say(const char *word) {
    printf("%s\n", word);
    fflush(stdout);
}

/* --- The consumers ------------------------------------------------------------------------ */

static int run_consumer(const char *name, uint64_t count, int buffer) {
    lf_channel *ch = NULL;
    lf_message m;
    char byte;
    if (!open_context()) return 1;
    EXPECT(open_end(name, LF_ROLE_CONSUMER, CONSUMERS, 64, -1, &ch), LF_OK);
    if (ch == NULL) return 1;
    say("attached");
    /* Every message, in order: the producer waited for all of us before its first. */
    for (uint64_t i = 0; i < count && failures == 0; i++) {
        uint64_t got = UINT64_MAX;
        EXPECT(lf_recv(ch, 30 * SECOND, &m), LF_OK);
        if (failures != 0) break;
        CHECK(m.len == sizeof got && m.sequence == i && !(m.flags & LF_MESSAGE_ZERO_COPY));
        if (m.len == sizeof got) memcpy(&got, m.data, sizeof got);
        if (got != i) {
            fprintf(stderr, "consumer %d: message %llu where %llu was due\n", (int)getpid(), (unsigned long long)got,
                    (unsigned long long)i);
            failures++;
        }
        EXPECT(lf_release(ch, &m), LF_OK);
    }
    if (buffer && failures == 0) {
        /* The buffer by reference: the producer's memory, mapped here, held until we are told. */
        EXPECT(lf_recv(ch, 30 * SECOND, &m), LF_OK);
        CHECK(m.len == BUFFER_SIZE && m.sequence == count && (m.flags & LF_MESSAGE_ZERO_COPY));
        if (m.len == BUFFER_SIZE) {
            const uint8_t *bytes = m.data;
            size_t bad = 0;
            for (size_t i = 0; i < BUFFER_SIZE; i++) bad += bytes[i] != buffer_byte(i);
            CHECK(bad == 0);
        }
        say("holding");
        CHECK(read(0, &byte, 1) == 1);
        EXPECT(lf_release(ch, &m), LF_OK);
        say("released");
    }
    /* Then the producer's end. */
    EXPECT(lf_recv(ch, 30 * SECOND, &m), LF_ERR_PEER_GONE);
    lf_channel_free(ch);
    lf_context_free(context);
    return failures != 0;
}

static int run_victim(const char *name) {
    lf_channel *ch = NULL;
    char byte;
    if (!open_context()) return 1;
    EXPECT(open_end(name, LF_ROLE_CONSUMER, CONSUMERS, 8, -1, &ch), LF_OK);
    say("attached");
    /* Never receives: its ring fills, and the producer waits for its room until it is killed. */
    while (read(0, &byte, 1) > 0) {
    }
    return 1; /* only SIGKILL should end it */
}

static int run_slow(const char *name) {
    lf_channel *ch = NULL;
    lf_message m;
    lf_status st;
    uint64_t got = 0;
    char byte;
    if (!open_context()) return 1;
    EXPECT(open_end(name, LF_ROLE_CONSUMER, 2, 4, 2 * SECOND, &ch), LF_OK);
    if (ch == NULL) return 1;
    say("attached");
    while (read(0, &byte, 1) > 0) {
    }
    /* Detached meanwhile: what it had comes first, in order, then its end, saying why. */
    while ((st = lf_recv(ch, 30 * SECOND, &m)) == LF_OK) {
        uint64_t number = UINT64_MAX;
        CHECK(m.len == sizeof number && m.sequence == got);
        if (m.len == sizeof number) memcpy(&number, m.data, sizeof number);
        CHECK(number == got);
        got++;
        EXPECT(lf_release(ch, &m), LF_OK);
    }
    EXPECT(st, LF_ERR_PEER_GONE);
    EXPECT_MESSAGE("detached");
    CHECK(got <= 4); /* its ring's capacity */
    lf_channel_free(ch);
    lf_context_free(context);
    return failures != 0;
}

static int run_full(const char *name) {
    lf_channel *ch = NULL;
    if (!open_context()) return 1;
    EXPECT(open_end(name, LF_ROLE_CONSUMER, 2, 64, -1, &ch), LF_ERR_INVALID_STATE);
    EXPECT_MESSAGE("is full");
    EXPECT_MESSAGE("max_peers = 2");
    CHECK(ch == NULL);
    lf_context_free(context);
    return failures != 0;
}

/* --- The producer ------------------------------------------------------------------------- */

typedef struct {
    pid_t pid;
    int in;  /* its stdin's write end */
    FILE *out; /* its stdout's read end */
} child;

/* Starts `self ROLE NAME [COUNT [BUFFER]]` with pipes for its stdin and stdout. */
static child start(const char *self, const char *role, const char *name, unsigned count, int buffer) {
    char n[32], b[8];
    int in[2], out[2];
    child c = {-1, -1, NULL};
    snprintf(n, sizeof n, "%u", count);
    snprintf(b, sizeof b, "%d", buffer);
    CHECK(pipe2(in, O_CLOEXEC) == 0 && pipe2(out, O_CLOEXEC) == 0);
    fflush(NULL);
    c.pid = fork();
    if (c.pid == 0) {
        /* dup2 clears close-on-exec on the copies. */
        if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0) _exit(126);
        /* A fresh process: the parent has the library's threads. */
        execl(self, self, role, name, n, b, (char *)NULL);
        _exit(127);
    }
    CHECK(c.pid > 0);
    close(in[0]);
    close(out[1]);
    c.in = in[1];
    c.out = fdopen(out[0], "r");
    return c;
}

/* The child's next line must be `word`. */
static void expect_line(child *c, const char *word) {
    char line[64] = "";
    if (c->out == NULL || fgets(line, sizeof line, c->out) == NULL) line[0] = '\0';
    line[strcspn(line, "\n")] = '\0';
    if (strcmp(line, word) != 0) {
        fprintf(stderr, "child %d said \"%s\", expected \"%s\"\n", (int)c->pid, line, word);
        failures++;
    }
}

/* Waits for the child; it must exit 0. */
static void finish(child *c) {
    int status = 0;
    if (c->in >= 0) close(c->in);
    CHECK(waitpid(c->pid, &status, 0) == c->pid);
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        fprintf(stderr, "child %d ended with status %#x\n", (int)c->pid, status);
        failures++;
    }
    if (c->out != NULL) fclose(c->out);
}

/* The producer's consumer slots: how many are alive; their pids into `pids` when not NULL. */
static unsigned alive(lf_channel *ch, uint32_t max_peers, pid_t *pids) {
    lf_peer peers[LF_MAX_PEERS];
    size_t count = 0;
    unsigned n = 0;
    EXPECT(lf_channel_peers(ch, peers, sizeof(lf_peer), LF_MAX_PEERS, &count), LF_OK);
    CHECK(count == max_peers);
    for (size_t i = 0; i < count && i < LF_MAX_PEERS; i++) {
        CHECK(peers[i].slot == i && peers[i].rank == -1);
        if (peers[i].state == LF_PEER_ALIVE) {
            CHECK(strcmp(peers[i].route, "shm") == 0 && peers[i].pid != 0);
            if (pids != NULL) pids[n] = (pid_t)peers[i].pid;
            n++;
        } else {
            CHECK(peers[i].state == LF_PEER_FREE && peers[i].pid == 0);
        }
    }
    return n;
}

/* Creating waited for the first consumer; waits (30 s at most) until `want` are attached. */
static void wait_alive(lf_channel *ch, uint32_t max_peers, unsigned want) {
    for (int i = 0; i < 3000 && alive(ch, max_peers, NULL) < want; i++) sleep_ms(10);
    CHECK(alive(ch, max_peers, NULL) == want);
}

static int has_pid(const pid_t *pids, unsigned n, pid_t pid) {
    for (unsigned i = 0; i < n; i++)
        if (pids[i] == pid) return 1;
    return 0;
}

static void broadcast(const char *self, const char *name) {
    child consumers[CONSUMERS];
    pid_t listed[LF_MAX_PEERS];
    lf_channel *ch = NULL;
    lf_buffer *buffer = NULL;
    uint8_t *bytes = NULL;
    uint64_t seq = 0, done = 0;

    for (unsigned i = 0; i < CONSUMERS; i++) consumers[i] = start(self, "consumer", name, MESSAGES, 1);
    EXPECT(open_end(name, LF_ROLE_PRODUCER, CONSUMERS, 64, -1, &ch), LF_OK);
    if (ch == NULL) return;
    for (unsigned i = 0; i < CONSUMERS; i++) expect_line(&consumers[i], "attached");
    wait_alive(ch, CONSUMERS, CONSUMERS);
    /* lf_channel_peers on the producer: its consumer slots, each consumer's pid once. */
    CHECK(alive(ch, CONSUMERS, listed) == CONSUMERS);
    for (unsigned i = 0; i < CONSUMERS; i++) CHECK(has_pid(listed, CONSUMERS, consumers[i].pid));

    for (uint64_t i = 0; i < MESSAGES && failures == 0; i++) {
        EXPECT(lf_send(ch, &i, sizeof i, 30 * SECOND, &seq), LF_OK);
        CHECK(seq == i);
    }
    EXPECT(lf_alloc(context, BUFFER_SIZE, LF_MEMORY_CPU_STANDARD, LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffer), LF_OK);
    EXPECT(lf_buffer_ptr(buffer, (void **)&bytes), LF_OK);
    if (bytes == NULL) return;
    for (size_t i = 0; i < BUFFER_SIZE; i++) bytes[i] = buffer_byte(i);
    EXPECT(lf_send_buffer(ch, buffer, 0, BUFFER_SIZE, 30 * SECOND, &seq), LF_OK);
    CHECK(seq == MESSAGES);
    for (unsigned i = 0; i < CONSUMERS; i++) expect_line(&consumers[i], "holding");
    /* Released by all but the last: still not complete. */
    for (unsigned i = 0; i < CONSUMERS; i++) {
        EXPECT(lf_completed(ch, &done), LF_OK);
        CHECK(done <= MESSAGES);
        EXPECT(lf_wait_completed(ch, MESSAGES, 100 * MS), LF_ERR_TIMEOUT);
        CHECK(write(consumers[i].in, "g", 1) == 1);
        expect_line(&consumers[i], "released");
    }
    /* The last release completes it (and every message before it). */
    EXPECT(lf_wait_completed(ch, MESSAGES, 30 * SECOND), LF_OK);
    EXPECT(lf_completed(ch, &done), LF_OK);
    CHECK(done == MESSAGES + 1);
    lf_channel_free(ch);
    lf_free(buffer);
    for (unsigned i = 0; i < CONSUMERS; i++) finish(&consumers[i]);
}

/* Kills the process `arg` points at with SIGKILL half a second from now (a thread, not a
 * forked process: a fork of this process would end with the library's threads running, which
 * valgrind reports as leaks). */
static void *kill_later(void *arg) {
    sleep_ms(500);
    kill(*(pid_t *)arg, SIGKILL);
    return NULL;
}

static void consumer_killed(const char *self, const char *name) {
    child others[CONSUMERS - 1], victim;
    lf_channel *ch = NULL;
    pthread_t killer;
    int status = 0;

    victim = start(self, "victim", name, 0, 0);
    EXPECT(open_end(name, LF_ROLE_PRODUCER, CONSUMERS, 8, -1, &ch), LF_OK);
    if (ch == NULL) return;
    expect_line(&victim, "attached");
    for (unsigned i = 0; i < CONSUMERS - 1; i++) others[i] = start(self, "consumer", name, 100, 0);
    for (unsigned i = 0; i < CONSUMERS - 1; i++) expect_line(&others[i], "attached");
    wait_alive(ch, CONSUMERS, CONSUMERS);
    /* The victim's ring (capacity 8) fills: the ninth message waits for its room. */
    for (uint64_t i = 0; i < 8; i++) EXPECT(lf_send(ch, &i, sizeof i, 30 * SECOND, NULL), LF_OK);
    {
        uint64_t ninth = 8;
        EXPECT(lf_try_send(ch, &ninth, sizeof ninth, NULL), LF_ERR_WOULD_BLOCK);
    }
    /* kill -9 while the producer is blocked in its send. */
    CHECK(pthread_create(&killer, NULL, kill_later, &victim.pid) == 0);
    for (uint64_t i = 8; i < 100 && failures == 0; i++) EXPECT(lf_send(ch, &i, sizeof i, 30 * SECOND, NULL), LF_OK);
    EXPECT(lf_wait_completed(ch, 99, 30 * SECOND), LF_OK);
    CHECK(alive(ch, CONSUMERS, NULL) == CONSUMERS - 1);
    CHECK(pthread_join(killer, NULL) == 0);
    CHECK(waitpid(victim.pid, &status, 0) == victim.pid && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    close(victim.in);
    fclose(victim.out);
    lf_channel_free(ch);
    for (unsigned i = 0; i < CONSUMERS - 1; i++) finish(&others[i]);
}

static void slow_consumer(const char *self, const char *name) {
    child slow, fast;
    lf_channel *ch = NULL;

    slow = start(self, "slow", name, 0, 0);
    EXPECT(open_end(name, LF_ROLE_PRODUCER, 2, 4, 2 * SECOND, &ch), LF_OK);
    if (ch == NULL) return;
    expect_line(&slow, "attached");
    fast = start(self, "consumer", name, 50, 0);
    expect_line(&fast, "attached");
    wait_alive(ch, 2, 2);
    /* The slow one's ring fills after four; two seconds later it is detached, and the sends
     * go on. */
    for (uint64_t i = 0; i < 50 && failures == 0; i++) EXPECT(lf_send(ch, &i, sizeof i, 30 * SECOND, NULL), LF_OK);
    EXPECT(lf_wait_completed(ch, 49, 30 * SECOND), LF_OK);
    CHECK(alive(ch, 2, NULL) == 1);
    finish(&slow); /* closing its stdin lets it read, and see why it was let go */
    lf_channel_free(ch);
    finish(&fast);
}

static void full_fan_out(const char *self, const char *name) {
    child holders[2], full;
    lf_channel *ch = NULL;
    int status = 0, waited;

    holders[0] = start(self, "consumer", name, 0, 0);
    EXPECT(open_end(name, LF_ROLE_PRODUCER, 2, 64, -1, &ch), LF_OK);
    if (ch == NULL) return;
    holders[1] = start(self, "consumer", name, 0, 0);
    for (unsigned i = 0; i < 2; i++) expect_line(&holders[i], "attached");
    wait_alive(ch, 2, 2);
    /* A third consumer is refused at once, while the producer does nothing. */
    full = start(self, "full", name, 0, 0);
    for (waited = 0; waited < 600; waited++) {
        if (waitpid(full.pid, &status, WNOHANG) == full.pid) break;
        sleep_ms(50);
    }
    CHECK(waited < 600 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(full.in);
    fclose(full.out);
    CHECK(alive(ch, 2, NULL) == 2);
    lf_channel_free(ch);
    for (unsigned i = 0; i < 2; i++) finish(&holders[i]);
}

static int dir_is_empty(const char *path) {
    DIR *dir = opendir(path);
    struct dirent *e;
    int empty = 1;
    if (dir == NULL) return 0;
    while ((e = readdir(dir)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            fprintf(stderr, "left in the runtime dir: %s\n", e->d_name);
            empty = 0;
        }
    closedir(dir);
    return empty;
}

int main(int argc, char **argv) {
    char dir[] = "/tmp/lf-c-fan-out-XXXXXX";
    char self[4096];
    char name[64];
    ssize_t n;

    if (argc >= 4 && strcmp(argv[1], "consumer") == 0)
        return run_consumer(argv[2], strtoull(argv[3], NULL, 10), argc > 4 && strcmp(argv[4], "1") == 0);
    if (argc >= 3 && strcmp(argv[1], "victim") == 0) return run_victim(argv[2]);
    if (argc >= 3 && strcmp(argv[1], "slow") == 0) return run_slow(argv[2]);
    if (argc >= 3 && strcmp(argv[1], "full") == 0) return run_full(argv[2]);
    if (argc != 1) {
        fprintf(stderr, "usage: %s [consumer NAME COUNT [BUFFER] | victim NAME | slow NAME | full NAME]\n", argv[0]);
        return 2;
    }
    n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 1;
    self[n] = '\0';
    /* A private runtime dir (mkdtemp makes it 0700), checked empty at the end. */
    if (mkdtemp(dir) == NULL) return 1;
    setenv("LF_RUNTIME_DIR", dir, 1);
    /* A child that died must not kill us through a pipe. */
    signal(SIGPIPE, SIG_IGN);
    if (!open_context()) return 1;
    snprintf(name, sizeof name, "c-fan-out-%d", (int)getpid());
    broadcast(self, name);
    snprintf(name, sizeof name, "c-fan-out-kill-%d", (int)getpid());
    consumer_killed(self, name);
    snprintf(name, sizeof name, "c-fan-out-slow-%d", (int)getpid());
    slow_consumer(self, name);
    snprintf(name, sizeof name, "c-fan-out-full-%d", (int)getpid());
    full_fan_out(self, name);
    lf_context_free(context);
    CHECK(dir_is_empty(dir));
    rmdir(dir);
    if (failures == 0) printf("test_channel_fan_out: OK\n");
    return failures != 0;
}
