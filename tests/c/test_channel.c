/* Layer 2 channels through the C API, between two real processes.
 *
 *   test_channel                 forks: the child is the producer, the parent the consumer
 *   test_channel producer NAME   one role only (run the other in a second process)
 *   test_channel consumer NAME
 *
 * Exchanges 100,000 messages of varying sizes (copy sends and loans) with sequence numbers
 * and checksums, then buffer sends of regions of an lf_alloc buffer (by reference: the
 * consumer sees LF_MESSAGE_ZERO_COPY), an lf_send of bytes inside that buffer (by reference
 * by itself) and of heap memory (copied); uses the pollable fd, checks completion, bad input
 * of every kind, and that the runtime dir is empty afterwards. Plain C11; prints each failed check and returns
 * non-zero. Valgrind-clean (it follows the fork). */
#define _GNU_SOURCE
#include <lava_flow.h>

#include <dirent.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures = 0;

#include "check.h"

#define MESSAGES 100000u
#define SECOND 1000000000LL
/* Buffer sends: this many regions of REGION bytes of one buffer. */
#define BUFFER_MESSAGES 64u
#define REGION 16384u

/* Message `seq`: 8-byte sequence, 8-byte checksum, payload. Sizes: mostly inline, some pool. */
static size_t size_of(uint64_t seq) {
    if (seq % 100 == 0) return 16 + (size_t)(seq * 7919 % 200000);
    return 16 + (size_t)(seq * 13 % 100);
}

static uint64_t checksum(const unsigned char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static void build_len(unsigned char *buf, uint64_t seq, size_t n) {
    for (size_t i = 16; i < n; i++) buf[i] = (unsigned char)(seq * 31 + i * 7);
    uint64_t sum = checksum(buf + 16, n - 16);
    memcpy(buf, &seq, 8);
    memcpy(buf + 8, &sum, 8);
}

static void build(unsigned char *buf, uint64_t seq) { build_len(buf, seq, size_of(seq)); }

static int verify_len(const lf_message *m, uint64_t seq, size_t n) {
    uint64_t got_seq, got_sum;
    if (m->len != n || m->sequence != seq) return 0;
    memcpy(&got_seq, m->data, 8);
    memcpy(&got_sum, (const unsigned char *)m->data + 8, 8);
    return got_seq == seq && got_sum == checksum((const unsigned char *)m->data + 16, m->len - 16);
}

static int verify(const lf_message *m, uint64_t seq) { return verify_len(m, seq, size_of(seq)); }

/* The length of buffer message `seq`: over 112 bytes, so that it goes by reference (shorter
 * ranges are copied into the message). */
static size_t region_len(uint64_t seq) { return 113 + (size_t)(seq * 977 % (REGION - 113)); }

static lf_context *context = NULL;

static lf_channel *open_channel(const char *name, lf_role role) {
    lf_location *here = NULL;
    lf_channel *channel = NULL;
    lf_channel_config config;
    EXPECT(lf_channel_config_init(&config, sizeof config), LF_OK);
    config.wait_strategy = LF_WAIT_SPIN_THEN_BLOCK;
    config.spin_ns = 20000;
    config.capacity = 64;
    config.rendezvous_timeout_ns = 30 * SECOND;
    lf_context_config context_config;
    lf_context_config_init(&context_config, sizeof context_config);
    context_config.gpu_policy = LF_GPU_DISABLED;
    EXPECT(lf_context_create(&context_config, &context), LF_OK);
    EXPECT(lf_location_detect(&here), LF_OK);
    EXPECT(lf_channel_create(NULL, name, role, here, here, &config, &channel), LF_ERR_NULL_POINTER);
    EXPECT(lf_channel_create(context, name, role, here, here, &config, &channel), LF_OK);
    lf_location_free(here);
    return channel;
}

/* Buffer sends: regions of one lf_alloc buffer by reference, then lf_send of bytes inside it
 * (by reference by itself) and of heap memory (copied). */
static void send_buffers(lf_channel *ch, unsigned char *heap) {
    lf_buffer *buffer = NULL, *registered = NULL;
    unsigned char *base = NULL;
    void *ptr = NULL;
    uint64_t seq = 0;
    /* The regions, then room for the lf_send below: bytes of a message in flight are not
     * rewritten. */
    EXPECT(lf_alloc(context, (BUFFER_MESSAGES + 1) * REGION, LF_MEMORY_CPU_STANDARD, LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffer), LF_OK);
    EXPECT(lf_buffer_ptr(buffer, &ptr), LF_OK);
    base = ptr;
    if (base == NULL) return;
    for (uint64_t i = 0; i < BUFFER_MESSAGES; i++) {
        uint64_t want = MESSAGES + i;
        build_len(base + i * REGION, want, region_len(want));
        EXPECT(lf_send_buffer(ch, buffer, i * REGION, region_len(want), 30 * SECOND, &seq), LF_OK);
        CHECK(seq == want);
    }
    /* Bytes inside the buffer go by reference by themselves; heap bytes are copied. */
    build_len(base + BUFFER_MESSAGES * REGION + 100, MESSAGES + BUFFER_MESSAGES, 5000);
    EXPECT(lf_send(ch, base + BUFFER_MESSAGES * REGION + 100, 5000, 30 * SECOND, &seq), LF_OK);
    build_len(heap, MESSAGES + BUFFER_MESSAGES + 1, 5000);
    EXPECT(lf_send(ch, heap, 5000, 30 * SECOND, &seq), LF_OK);
    /* Bad input: NULL buffer, a range outside it, registered user memory. */
    EXPECT(lf_send_buffer(ch, NULL, 0, 8, -1, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_send_buffer(ch, buffer, (BUFFER_MESSAGES + 1) * REGION - 4, 8, -1, NULL), LF_ERR_INVALID_ARGUMENT);
    EXPECT(lf_send_buffer(ch, buffer, 0, 0, -1, NULL), LF_ERR_INVALID_ARGUMENT);
    EXPECT(lf_register(context, heap, 4096, &registered), LF_OK);
    EXPECT(lf_send_buffer(ch, registered, 0, 8, -1, NULL), LF_ERR_UNSUPPORTED);
    EXPECT(lf_deregister(context, registered), LF_OK);
    /* The buffer may be freed once every message pointing into it is complete. */
    EXPECT(lf_wait_completed(ch, seq, 30 * SECOND), LF_OK);
    /* Messages never sent are refused, the last sequence number a 64-bit counter holds too. */
    EXPECT(lf_wait_completed(ch, seq + 1, 0), LF_ERR_INVALID_ARGUMENT);
    EXPECT(lf_wait_completed(ch, UINT64_MAX - 1, 0), LF_ERR_INVALID_ARGUMENT);
    EXPECT(lf_wait_completed(ch, UINT64_MAX, 0), LF_ERR_INVALID_ARGUMENT);
    lf_free(buffer);
}

static void receive_buffers(lf_channel *ch, uint64_t seq) {
    lf_message m;
    for (uint64_t i = 0; i < BUFFER_MESSAGES; i++, seq++) {
        EXPECT(lf_recv(ch, 30 * SECOND, &m), LF_OK);
        CHECK(verify_len(&m, seq, region_len(seq)));
        CHECK(m.flags == LF_MESSAGE_ZERO_COPY);
        EXPECT(lf_release(ch, &m), LF_OK);
    }
    EXPECT(lf_recv(ch, 30 * SECOND, &m), LF_OK);
    CHECK(verify_len(&m, seq++, 5000));
    CHECK(m.flags == LF_MESSAGE_ZERO_COPY);
    EXPECT(lf_release(ch, &m), LF_OK);
    EXPECT(lf_recv(ch, 30 * SECOND, &m), LF_OK);
    CHECK(verify_len(&m, seq, 5000));
    CHECK(m.flags == 0);
    EXPECT(lf_release(ch, &m), LF_OK);
}

static int run_producer(const char *name) {
    lf_channel *ch = open_channel(name, LF_ROLE_PRODUCER);
    unsigned char *buf = malloc(256 * 1024);
    uint64_t seq = 0, done = 0;
    const char *transport = NULL, *reason = NULL;
    lf_loan_region loan;
    if (ch == NULL || buf == NULL) return 1;

    EXPECT(lf_channel_transport(ch, &transport, &reason), LF_OK);
    CHECK(transport != NULL && strcmp(transport, "shm") == 0);
    CHECK(reason != NULL && strstr(reason, "scope local") != NULL);

    /* Bad input: NULL data, zero length, receiving on a producer, forged loan. */
    EXPECT(lf_send(ch, NULL, 8, -1, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_send(ch, buf, 0, -1, NULL), LF_ERR_INVALID_ARGUMENT);
    EXPECT(lf_try_recv(ch, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_publish(ch, NULL, 1, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_send(NULL, buf, 8, -1, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_send((lf_channel *)buf, buf, 8, -1, NULL), LF_ERR_BAD_HANDLE);

    for (uint64_t i = 0; i < MESSAGES; i++) {
        uint64_t got = UINT64_MAX;
        if (i % 2 == 0) {
            build(buf, i);
            EXPECT(lf_send(ch, buf, size_of(i), 30 * SECOND, &got), LF_OK);
        } else {
            EXPECT(lf_loan(ch, size_of(i), 30 * SECOND, &loan), LF_OK);
            build(loan.data, i);
            EXPECT(lf_publish(ch, &loan, size_of(i), &got), LF_OK);
            EXPECT(lf_publish(ch, &loan, size_of(i), NULL), LF_ERR_INVALID_STATE);
        }
        CHECK(got == i);
        if (failures > 10) return 1;
    }
    seq = MESSAGES - 1;
    EXPECT(lf_wait_completed(ch, seq, 30 * SECOND), LF_OK);
    EXPECT(lf_completed(ch, &done), LF_OK);
    CHECK(done == MESSAGES);
    send_buffers(ch, buf);
    /* A cancelled loan sends nothing. */
    EXPECT(lf_loan(ch, 64, 0, &loan), LF_OK);
    EXPECT(lf_loan_cancel(ch, &loan), LF_OK);
    free(buf);
    lf_channel_free(ch);
    lf_channel_free(NULL);
    lf_context_free(context);
    return failures != 0;
}

static int run_consumer(const char *name) {
    lf_channel *ch = open_channel(name, LF_ROLE_CONSUMER);
    lf_message m, held;
    int fd = -1;
    uint64_t seq = 0;
    if (ch == NULL) return 1;

    EXPECT(lf_send(ch, "x", 1, -1, NULL), LF_ERR_INVALID_STATE);
    EXPECT(lf_channel_fd(ch, &fd), LF_OK);
    CHECK(fd >= 0);

    /* The first half through the pollable fd, the rest with blocking receives. */
    while (seq < MESSAGES / 2 && failures == 0) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        CHECK(poll(&p, 1, 30000) == 1);
        for (;;) {
            lf_status s = lf_try_recv(ch, &m);
            if (s == LF_ERR_WOULD_BLOCK) break;
            EXPECT(s, LF_OK);
            if (s != LF_OK) break;
            CHECK(verify(&m, seq));
            EXPECT(lf_release(ch, &m), LF_OK);
            seq++;
        }
    }
    /* Views may be released out of order; space is reclaimed in order, so a view held
     * while `capacity` more messages pass would stall the producer: hold it for 20. */
    EXPECT(lf_recv(ch, 30 * SECOND, &held), LF_OK);
    CHECK(verify(&held, seq));
    seq++;
    while (seq < MESSAGES && failures == 0) {
        EXPECT(lf_recv(ch, 30 * SECOND, &m), LF_OK);
        CHECK(verify(&m, seq));
        EXPECT(lf_release(ch, &m), LF_OK);
        seq++;
        if (seq == held.sequence + 20) {
            lf_message forged = held;
            forged.len += 1;
            EXPECT(lf_release(ch, &forged), LF_ERR_INVALID_STATE);
            EXPECT(lf_release(ch, &held), LF_OK);
            EXPECT(lf_release(ch, &held), LF_ERR_INVALID_STATE);
        }
    }
    /* Released views are refused. */
    EXPECT(lf_release(ch, &m), LF_ERR_INVALID_STATE);
    EXPECT(lf_release(ch, NULL), LF_ERR_NULL_POINTER);
    receive_buffers(ch, MESSAGES);
    /* The producer closes after its last message is released. */
    EXPECT(lf_recv(ch, 30 * SECOND, &m), LF_ERR_PEER_GONE);
    lf_channel_free(ch);
    EXPECT(lf_recv(ch, 0, &m), LF_ERR_BAD_HANDLE);
    lf_context_free(context);
    return failures != 0;
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
    char dir[] = "/tmp/lf-c-channel-XXXXXX";
    char name[64];
    int status = 0;
    pid_t child;

    if (argc == 3 && strcmp(argv[1], "producer") == 0) return run_producer(argv[2]);
    if (argc == 3 && strcmp(argv[1], "consumer") == 0) return run_consumer(argv[2]);
    if (argc != 1) {
        fprintf(stderr, "usage: %s [producer|consumer NAME]\n", argv[0]);
        return 2;
    }
    /* A private runtime dir (mkdtemp makes it 0700), checked empty at the end. */
    if (mkdtemp(dir) == NULL) return 1;
    setenv("LF_RUNTIME_DIR", dir, 1);
    snprintf(name, sizeof name, "c-test-%d", (int)getpid());
    fflush(NULL);
    child = fork();
    if (child == 0) _exit(run_producer(name));
    CHECK(child > 0);
    if (run_consumer(name) != 0) fprintf(stderr, "consumer failed\n");
    CHECK(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(dir_is_empty(dir));
    rmdir(dir);
    if (failures == 0) printf("test_channel: OK\n");
    return failures != 0;
}
