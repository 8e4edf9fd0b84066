/* GPU buffers by reference on a fan-in channel, through the C API, between real processes
 * that share one GPU (lavapipe in CI).
 *
 *   test_gpu_channel_fan_in                     the consumer; starts the producers
 *   test_gpu_channel_fan_in producer NAME ID    sends ROUNDS GPU buffers with bytes between
 *
 * Two producers each send, in turn, a region of a DEVICE_LOCAL buffer (lf_send_buffer, by
 * reference through the "vulkan_ipc" route) and a copy (lf_send). The consumer checks each
 * message's producer slot, that slot's order, and every GPU payload through lf_message_buffer
 * + lf_buffer_read (the producer's id in its bytes: each slot's buffers come from its own
 * producer), holding one GPU message of each producer while it receives the other's and
 * releasing them out of order (lf_release_on_gpu refused: pair channels only). On a fan-in
 * lf_channel_ready_semaphore is refused, naming
 * lf_channel_producer_ready_semaphore, which answers per slot (LF_ERR_UNSUPPORTED on a driver
 * that cannot share semaphores, such as lavapipe; an fd on one that can). Each producer's end
 * is one LF_ERR_PEER_GONE naming its slot; the runtime dir is left empty.
 *
 * Without a Vulkan device it prints why and exits 77 (skipped), unless LF_REQUIRE_VULKAN=1. */
#define _GNU_SOURCE
#include <lava_flow.h>

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures = 0;

#include "check.h"

#define SECOND 1000000000LL
#define SKIPPED 77
#define PRODUCERS 2u
#define ROUNDS 8u
#define REGION 4096u
/* Each round: a GPU buffer, then a copy. */
#define PER_PRODUCER (2u * ROUNDS)

static lf_context *context = NULL;

/* Message `seq` of producer `id`: the id, the sequence number, then bytes derived from both. */
static size_t length_of(uint64_t seq) { return seq % 2 == 0 ? 256 + (size_t)(seq * 131 % (REGION - 256)) : 64; }

static void build(unsigned char *buf, uint64_t id, uint64_t seq) {
    size_t n = length_of(seq);
    memcpy(buf, &id, 8);
    memcpy(buf + 8, &seq, 8);
    for (size_t i = 16; i < n; i++) buf[i] = (unsigned char)(id * 101 + seq * 31 + i * 7);
}

/* The producer id the bytes name, or UINT64_MAX where they are not message `seq` of it. */
static uint64_t producer_of(const unsigned char *p, size_t n, uint64_t seq) {
    unsigned char want[REGION];
    uint64_t id;
    if (n != length_of(seq)) return UINT64_MAX;
    memcpy(&id, p, 8);
    build(want, id, seq);
    return memcmp(p, want, n) == 0 ? id : UINT64_MAX;
}

/* This process's context with its GPU, or NULL (skip) when there is none. */
static lf_context *gpu_context(const char *who) {
    const char *why = NULL;
    if (lf_context_create(NULL, &context) != LF_OK) {
        fprintf(stderr, "%s: lf_context_create: %s\n", who, lf_last_error_message());
        failures++;
        return NULL;
    }
    EXPECT(lf_context_gpu_unavailable_reason(context, &why), LF_OK);
    if (why == NULL) return context;
    const char *require = getenv("LF_REQUIRE_VULKAN");
    if (require != NULL && strcmp(require, "1") == 0) {
        fprintf(stderr, "%s: LF_REQUIRE_VULKAN=1 but there is no Vulkan device: %s\n", who, why);
        failures++;
    } else {
        printf("test_gpu_channel_fan_in: %s skipped: no Vulkan device (%s)\n", who, why);
    }
    lf_context_free(context);
    context = NULL;
    return NULL;
}

static lf_channel *open_channel(const char *name, lf_role role) {
    lf_location *here = NULL;
    lf_channel *channel = NULL;
    lf_channel_config config;
    const char *transport = NULL;
    EXPECT(lf_channel_config_init(&config, sizeof config), LF_OK);
    config.kind = LF_CHANNEL_FAN_IN;
    config.max_peers = PRODUCERS;
    config.wait_strategy = LF_WAIT_SPIN_THEN_BLOCK;
    config.spin_ns = 20000;
    config.capacity = 64;
    config.rendezvous_timeout_ns = 30 * SECOND;
    EXPECT(lf_location_detect(&here), LF_OK);
    EXPECT(lf_channel_create(context, name, role, here, here, &config, &channel), LF_OK);
    lf_location_free(here);
    if (channel != NULL) {
        EXPECT(lf_channel_transport(channel, &transport, NULL), LF_OK);
        CHECK(transport != NULL && strcmp(transport, "shm+vulkan_ipc") == 0);
    }
    return channel;
}

static int run_producer(const char *name, uint64_t id) {
    unsigned char bytes[REGION];
    lf_buffer *gpu = NULL;
    lf_channel *ch;
    if (gpu_context("producer") == NULL) return failures ? 1 : SKIPPED;
    ch = open_channel(name, LF_ROLE_PRODUCER);
    if (ch == NULL) return 1;
    /* A region per GPU message: none is rewritten while in flight. */
    EXPECT(lf_alloc(context, ROUNDS * REGION, LF_MEMORY_GPU_DEVICE_LOCAL, LF_UNSET, LF_HUGEPAGE_DEFAULT, &gpu), LF_OK);
    if (gpu == NULL) return 1;
    for (uint64_t seq = 0; seq < PER_PRODUCER && failures == 0; seq++) {
        uint64_t sent = UINT64_MAX;
        build(bytes, id, seq);
        if (seq % 2 == 0) {
            size_t at = (size_t)(seq / 2) * REGION;
            EXPECT(lf_buffer_write(gpu, at, bytes, length_of(seq)), LF_OK);
            EXPECT(lf_send_buffer(ch, gpu, at, length_of(seq), 30 * SECOND, &sent), LF_OK);
        } else {
            EXPECT(lf_send(ch, bytes, length_of(seq), 30 * SECOND, &sent), LF_OK);
        }
        CHECK(sent == seq);
    }
    EXPECT(lf_wait_completed(ch, PER_PRODUCER - 1, 30 * SECOND), LF_OK);
    lf_free(gpu);
    lf_channel_free(ch);
    lf_context_free(context);
    return failures != 0;
}

static pid_t start(const char *self, const char *name, unsigned id) {
    char arg[32];
    pid_t child;
    snprintf(arg, sizeof arg, "%u", id);
    fflush(NULL);
    child = fork();
    if (child == 0) {
        /* A fresh process: the parent has the library's threads. */
        execl(self, self, "producer", name, arg, (char *)NULL);
        _exit(127);
    }
    CHECK(child > 0);
    return child;
}

/* A GPU message's payload through its lent buffer: the producer id its bytes name. */
static uint64_t check_gpu(lf_channel *ch, const lf_message *m) {
    unsigned char bytes[REGION];
    const lf_buffer *buf = NULL;
    CHECK(m->flags == (LF_MESSAGE_ZERO_COPY | LF_MESSAGE_GPU) && m->ready_value == 0 && m->len <= REGION);
    EXPECT(lf_message_buffer(ch, m, &buf), LF_OK);
    if (buf == NULL || m->len > REGION) return UINT64_MAX;
    EXPECT(lf_buffer_read(buf, 0, bytes, m->len), LF_OK);
    return producer_of(bytes, m->len, m->sequence);
}

static void run_consumer(const char *self, const char *name) {
    pid_t producers[PRODUCERS];
    uint64_t id_of_slot[PRODUCERS] = {UINT64_MAX, UINT64_MAX}, next[PRODUCERS] = {0};
    lf_message held[PRODUCERS];
    int holding[PRODUCERS] = {0}, fd = -1;
    unsigned received = 0, ended = 0;
    lf_channel *ch = NULL;
    lf_message m;

    memset(held, 0, sizeof held);
    for (unsigned i = 0; i < PRODUCERS; i++) producers[i] = start(self, name, i + 7);
    ch = open_channel(name, LF_ROLE_CONSUMER);
    if (ch == NULL) return;

    /* Each producer has its own ready semaphore: the channel-wide call says which to use. */
    EXPECT(lf_channel_ready_semaphore(ch, &fd), LF_ERR_INVALID_STATE);
    EXPECT_MESSAGE("lf_channel_producer_ready_semaphore");
    CHECK(fd == -1);
    EXPECT(lf_channel_producer_ready_semaphore(ch, 0, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_channel_producer_ready_semaphore(NULL, 0, &fd), LF_ERR_NULL_POINTER);

    while (received < PRODUCERS * PER_PRODUCER && failures < 10) {
        uint64_t id;
        EXPECT(lf_recv(ch, 30 * SECOND, &m), LF_OK);
        if (failures != 0 || m.producer >= PRODUCERS) {
            CHECK(m.producer < PRODUCERS);
            break;
        }
        CHECK(m.sequence == next[m.producer]);
        next[m.producer]++;
        received++;
        if (m.sequence % 2 == 0) {
            lf_status s;
            id = check_gpu(ch, &m);
            s = lf_channel_producer_ready_semaphore(ch, m.producer, &fd);
            CHECK(s == LF_OK || s == LF_ERR_UNSUPPORTED);
            if (s == LF_OK) close(fd);
            fd = -1;
        } else {
            CHECK(m.flags == 0);
            id = producer_of(m.data, m.len, m.sequence);
        }
        CHECK(id == 7 || id == 8);
        /* One producer per slot, throughout. */
        if (id_of_slot[m.producer] == UINT64_MAX) id_of_slot[m.producer] = id;
        CHECK(id_of_slot[m.producer] == id);
        /* Each producer's first GPU message is held until the last message: the two slots'
         * GPU messages are held at once and released out of their order. */
        if (m.sequence == 0) {
            held[m.producer] = m;
            holding[m.producer] = 1;
        } else {
            EXPECT(lf_release(ch, &m), LF_OK);
        }
    }
    CHECK(id_of_slot[0] != id_of_slot[1]);
    for (unsigned s = PRODUCERS; s-- > 0;) {
        uint64_t value = 77;
        if (!holding[s]) continue;
        CHECK(check_gpu(ch, &held[s]) == id_of_slot[s]);
        /* A release whose signal the consumer makes on its GPU is for pair channels only. */
        EXPECT(lf_release_on_gpu(ch, &held[s], &value), LF_ERR_UNSUPPORTED);
        EXPECT_MESSAGE("fan-in");
        EXPECT_MESSAGE("lf_release");
        CHECK(value == 77);
        EXPECT(lf_release(ch, &held[s]), LF_OK);
        EXPECT(lf_release(ch, &held[s]), LF_ERR_INVALID_STATE);
    }
    while (ended < PRODUCERS && failures < 10) {
        memset(&m, 0, sizeof m);
        m.producer = UINT32_MAX;
        EXPECT(lf_recv(ch, 30 * SECOND, &m), LF_ERR_PEER_GONE);
        CHECK(m.producer < PRODUCERS && next[m.producer % PRODUCERS] == PER_PRODUCER);
        ended++;
    }
    for (unsigned i = 0; i < PRODUCERS; i++) {
        int status = 0;
        CHECK(waitpid(producers[i], &status, 0) == producers[i]);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    lf_channel_free(ch);
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
    char dir[] = "/tmp/lf-c-gpu-fan-in-XXXXXX";
    char self[4096];
    char name[64];
    ssize_t n;

    if (argc == 4 && strcmp(argv[1], "producer") == 0) return run_producer(argv[2], strtoull(argv[3], NULL, 10));
    if (argc != 1) {
        fprintf(stderr, "usage: %s [producer NAME ID]\n", argv[0]);
        return 2;
    }
    n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 1;
    self[n] = '\0';
    if (gpu_context("consumer") == NULL) return failures ? 1 : SKIPPED;
    /* A private runtime dir (mkdtemp makes it 0700), checked empty at the end. */
    if (mkdtemp(dir) == NULL) return 1;
    setenv("LF_RUNTIME_DIR", dir, 1);
    snprintf(name, sizeof name, "c-gpu-fan-in-%d", (int)getpid());
    run_consumer(self, name);
    lf_context_free(context);
    CHECK(dir_is_empty(dir));
    rmdir(dir);
    if (failures == 0) printf("test_gpu_channel_fan_in: OK\n");
    return failures != 0;
}
