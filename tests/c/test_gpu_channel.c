/* GPU buffers through a channel, through the C API, between two real processes that share
 * one GPU (lavapipe in CI).
 *
 *   test_gpu_channel                 forks: the child is the producer, the parent the consumer
 *   test_gpu_channel producer NAME   one role only (run the other in a second process)
 *   test_gpu_channel consumer NAME
 *
 * Each process makes its own lf_context (default config: the GPU opened if there is one) after
 * the fork. The producer sends, in one order, ROUNDS times: bytes (lf_send, copied), a region
 * of a DEVICE_LOCAL buffer, of a HOST_VISIBLE buffer (lf_send_buffer, by reference through the
 * "vulkan_ipc" route) and of a CPU buffer (by reference through shm); then rewrites a
 * DEVICE_LOCAL region once its message is complete and sends it again. The consumer checks the
 * order, the flags, and every payload: GPU ones through lf_message_buffer + lf_buffer_read, a GPU
 * copy into a buffer of its own (lf_buffer_copy), the host address where there is one; it
 * exports the lent buffer, checks that lf_free of it is refused and that the same handle is lent
 * twice, and that after lf_release the message and its buffer are gone. Bad input on both sides;
 * lf_release_on_gpu refused, saying why, where the producer has no released semaphore;
 * the ready semaphore (LF_ERR_UNSUPPORTED on a driver that cannot share semaphores, such as
 * lavapipe; an fd on one that can) agrees with the transport's reason text. No fd leaks on the
 * consumer, the runtime dir empty afterwards.
 *
 * Without a Vulkan device it prints why and exits 77 (skipped), unless LF_REQUIRE_VULKAN=1.
 * Plain C11; prints each failed check and returns non-zero. Valgrind-clean (it follows the fork). */
#define _GNU_SOURCE
#include <lava_flow.h>

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures = 0;

#include "check.h"

#define SECOND 1000000000LL
#define SKIPPED 77
/* Each round sends one message of each kind; each GPU and CPU buffer has one region per round. */
#define ROUNDS 4u
#define KINDS 4u
#define REGION 65536u
/* The rounds' messages, then the rewritten DEVICE_LOCAL region. */
#define TOTAL (ROUNDS * KINDS + 1u)

enum kind { BYTES, DEVICE_LOCAL, HOST_VISIBLE, CPU_BUFFER };

static enum kind kind_of(uint64_t seq) { return seq == TOTAL - 1 ? DEVICE_LOCAL : (enum kind)(seq % KINDS); }

static const char *kind_name(enum kind k) {
    static const char *const names[] = {"bytes", "DEVICE_LOCAL", "HOST_VISIBLE", "CPU buffer"};
    return names[k];
}

static lf_memory_kind location_of(enum kind k) {
    return k == DEVICE_LOCAL ? LF_MEMORY_GPU_DEVICE_LOCAL : k == HOST_VISIBLE ? LF_MEMORY_GPU_HOST_VISIBLE : LF_MEMORY_CPU_STANDARD;
}

/* Message `seq`: 8-byte sequence, 8-byte checksum, payload; bytes messages up to 4000 bytes
 * (inline and pool), buffer messages up to a region. */
static size_t length_of(uint64_t seq) {
    size_t most = kind_of(seq) == BYTES ? 4000u : REGION;
    return 16 + (size_t)(seq * 7919u % (most - 16));
}

/* Where message `seq` lies in its buffer: the rewritten one reuses round 0's region. */
static size_t offset_of(uint64_t seq) { return seq == TOTAL - 1 ? 0 : (size_t)(seq / KINDS) * REGION; }

static uint64_t checksum(const unsigned char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static void build(unsigned char *buf, uint64_t seq, size_t n) {
    for (size_t i = 16; i < n; i++) buf[i] = (unsigned char)(seq * 31 + i * 7);
    uint64_t sum = checksum(buf + 16, n - 16);
    memcpy(buf, &seq, 8);
    memcpy(buf + 8, &sum, 8);
}

static int holds(const unsigned char *p, size_t n, uint64_t seq) {
    uint64_t got_seq, got_sum;
    if (n != length_of(seq)) return 0;
    memcpy(&got_seq, p, 8);
    memcpy(&got_sum, p + 8, 8);
    return got_seq == seq && got_sum == checksum(p + 16, n - 16);
}

static lf_context *context = NULL;

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
        printf("test_gpu_channel: %s skipped: no Vulkan device (%s)\n", who, why);
    }
    lf_context_free(context);
    context = NULL;
    return NULL;
}

static lf_channel *open_channel(const char *name, lf_role role) {
    lf_location *here = NULL;
    lf_channel *channel = NULL;
    lf_channel_config config;
    EXPECT(lf_channel_config_init(&config, sizeof config), LF_OK);
    CHECK(config.strict_gpu == 0);
    config.wait_strategy = LF_WAIT_SPIN_THEN_BLOCK;
    config.spin_ns = 20000;
    config.capacity = 64;
    config.rendezvous_timeout_ns = 30 * SECOND;
    EXPECT(lf_location_detect(&here), LF_OK);
    EXPECT(lf_channel_create(context, name, role, here, here, &config, &channel), LF_OK);
    lf_location_free(here);
    return channel;
}

/* The transport, which must be the GPU route; returns whether GPU buffers are synchronised on
 * the host (no shared semaphore), as the reason says; `*reason_out` (if not NULL) receives the
 * reason. */
static int check_transport(lf_channel *ch, const char *who, const char **reason_out) {
    const char *name = NULL, *reason = NULL;
    EXPECT(lf_channel_transport(ch, &name, &reason), LF_OK);
    if (reason_out != NULL) *reason_out = reason != NULL ? reason : "";
    CHECK(name != NULL && strcmp(name, "shm+vulkan_ipc") == 0);
    CHECK(reason != NULL && strstr(reason, "vulkan_ipc") != NULL);
    printf("%s: transport %s (%s)\n", who, name ? name : "?", reason ? reason : "?");
    return reason != NULL && strstr(reason, "host-side synchronisation") != NULL;
}

/* lf_channel_ready_semaphore: an fd where the channel shares a semaphore, else UNSUPPORTED
 * saying why. Returns whether there is one. */
static int check_ready_semaphore(lf_channel *ch) {
    int fd = -1;
    lf_status s = lf_channel_ready_semaphore(ch, &fd);
    CHECK(s == LF_OK || s == LF_ERR_UNSUPPORTED);
    if (s == LF_OK) {
        CHECK(fd >= 0 && fd_is_open(fd));
        if (fd >= 0) close(fd);
        return 1;
    }
    CHECK(fd == -1); /* nothing written on failure */
    EXPECT_MESSAGE("lf_channel_ready_semaphore");
    EXPECT_MESSAGE("shares no semaphore");
    return 0;
}

static void producer_bad_input(lf_channel *ch, lf_buffer *gpu, lf_buffer *cpu, int host_sync) {
    const size_t size = ROUNDS * REGION;
    int fd = -1;
    EXPECT(lf_send_buffer(NULL, gpu, 0, 64, -1, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_send_buffer(ch, NULL, 0, 64, -1, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_send_buffer(ch, gpu, 0, 0, -1, NULL), LF_ERR_INVALID_ARGUMENT);
    EXPECT(lf_send_buffer(ch, gpu, size - 4, 8, -1, NULL), LF_ERR_INVALID_ARGUMENT);
    EXPECT(lf_send_buffer_after(NULL, gpu, 0, 64, 1, -1, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_send_buffer_after(ch, NULL, 0, 64, 1, -1, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_send_buffer_after(ch, gpu, 0, 64, 0, -1, NULL), LF_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("lf_send_buffer");
    EXPECT(lf_send_buffer_after(ch, gpu, size - 4, 8, 1, -1, NULL), LF_ERR_INVALID_ARGUMENT);
    EXPECT(lf_send_buffer_after(ch, cpu, 0, 64, 1, -1, NULL), LF_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("CPU memory");
    /* Where nothing on the GPU is shared there is nothing to wait for. (Where a semaphore is
     * shared, a ready value would make the consumer's GPU work wait for a signal this test
     * cannot give without a GPU API of its own: not sent.) */
    if (host_sync) {
        EXPECT(lf_send_buffer_after(ch, gpu, 0, 64, 5, -1, NULL), LF_ERR_UNSUPPORTED);
        CHECK(lf_last_error_message()[0] != '\0');
    }
    EXPECT(lf_channel_ready_semaphore(NULL, &fd), LF_ERR_NULL_POINTER);
    EXPECT(lf_channel_ready_semaphore(ch, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_channel_ready_semaphore((lf_channel *)cpu, &fd), LF_ERR_BAD_HANDLE);
    CHECK(fd == -1);
    /* No released semaphore unless the config asks for one. */
    EXPECT(lf_channel_released_semaphore(NULL, &fd), LF_ERR_NULL_POINTER);
    EXPECT(lf_channel_released_semaphore(ch, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_channel_released_semaphore(ch, &fd), LF_ERR_UNSUPPORTED);
    EXPECT_MESSAGE("released semaphore");
    CHECK(fd == -1);
}

static int run_producer(const char *name) {
    lf_buffer *buffers[KINDS] = {NULL, NULL, NULL, NULL};
    unsigned char *scratch = malloc(REGION);
    uint64_t seq = UINT64_MAX, done = 0;
    if (scratch == NULL) return 1;
    if (gpu_context("producer") == NULL) {
        free(scratch);
        return failures ? 1 : SKIPPED;
    }
    lf_channel *ch = open_channel(name, LF_ROLE_PRODUCER);
    if (ch == NULL) return 1;
    const char *reason = NULL;
    int host_sync = check_transport(ch, "producer", &reason);
    int shared = check_ready_semaphore(ch);
    /* The reason and the semaphore agree: host-side synchronisation (lavapipe), or a shared
     * timeline semaphore (NVIDIA). */
    CHECK(shared == !host_sync);
    if (host_sync) EXPECT_MESSAGE("host-side synchronisation");
    if (shared) CHECK(strstr(reason, "GPU-side synchronisation through a shared timeline semaphore") != NULL);

    for (enum kind k = DEVICE_LOCAL; k <= CPU_BUFFER; k++) {
        lf_memory_kind location = 0;
        const char *fallback = "unset";
        EXPECT(lf_alloc(context, ROUNDS * REGION, location_of(k), LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffers[k]), LF_OK);
        if (buffers[k] == NULL) return 1;
        EXPECT(lf_buffer_location(buffers[k], &location), LF_OK);
        EXPECT(lf_buffer_fallback_reason(buffers[k], &fallback), LF_OK);
        CHECK(location == location_of(k) && fallback == NULL);
    }
    producer_bad_input(ch, buffers[DEVICE_LOCAL], buffers[CPU_BUFFER], host_sync);

    /* One order across every kind. Each message has its own region: none is rewritten while
     * in flight. */
    for (uint64_t want = 0; want < TOTAL; want++) {
        enum kind k = kind_of(want);
        size_t len = length_of(want), at = offset_of(want);
        seq = UINT64_MAX;
        if (want == TOTAL - 1) {
            /* Round 0's DEVICE_LOCAL region again: only once its message is complete. */
            EXPECT(lf_wait_completed(ch, DEVICE_LOCAL, 30 * SECOND), LF_OK);
        }
        if (k == CPU_BUFFER) {
            void *base = NULL;
            EXPECT(lf_buffer_ptr(buffers[k], &base), LF_OK);
            if (base == NULL) return 1;
            build((unsigned char *)base + at, want, len);
        } else {
            build(scratch, want, len);
        }
        if (k == BYTES) {
            EXPECT(lf_send(ch, scratch, len, 30 * SECOND, &seq), LF_OK);
        } else {
            if (k != CPU_BUFFER) EXPECT(lf_buffer_write(buffers[k], at, scratch, len), LF_OK);
            EXPECT(lf_send_buffer(ch, buffers[k], at, len, 30 * SECOND, &seq), LF_OK);
        }
        CHECK(seq == want);
        if (failures > 10) return 1;
    }
    EXPECT(lf_wait_completed(ch, TOTAL - 1, 30 * SECOND), LF_OK);
    EXPECT(lf_completed(ch, &done), LF_OK);
    CHECK(done == TOTAL);
    EXPECT(lf_wait_completed(NULL, 0, 0), LF_ERR_NULL_POINTER);

    /* Every message is complete: the buffers may go. */
    for (enum kind k = DEVICE_LOCAL; k <= CPU_BUFFER; k++) lf_free(buffers[k]);
    free(scratch);
    lf_channel_free(ch);
    lf_context_free(context);
    return failures != 0;
}

/* Everything about one received GPU message, which stays held. */
static void check_gpu_message(lf_channel *ch, const lf_message *m, lf_buffer *own, unsigned char *bytes) {
    enum kind k = kind_of(m->sequence);
    const lf_buffer *buf = NULL, *again = NULL;
    size_t size = 0;
    lf_memory_kind location = 0;
    lf_origin origin = 0;
    lf_export ex;

    CHECK(m->flags == (LF_MESSAGE_ZERO_COPY | LF_MESSAGE_GPU));
    CHECK(m->ready_value == 0);
    /* HOST_VISIBLE memory is mapped, DEVICE_LOCAL memory where the driver maps it. */
    if (k == HOST_VISIBLE) CHECK(m->data != NULL);
    if (m->data != NULL) CHECK(holds(m->data, m->len, m->sequence));

    EXPECT(lf_message_buffer(ch, m, &buf), LF_OK);
    CHECK(buf != NULL);
    if (buf == NULL) return;
    EXPECT(lf_message_buffer(ch, m, &again), LF_OK);
    CHECK(again == buf); /* the same handle, lent again */
    EXPECT(lf_buffer_size(buf, &size), LF_OK);
    CHECK(size == m->len);
    EXPECT(lf_buffer_location(buf, &location), LF_OK);
    CHECK(location == location_of(k));
    EXPECT(lf_buffer_origin(buf, &origin), LF_OK);
    CHECK(origin == LF_ORIGIN_IMPORTED);
    /* A received buffer is a view of the producer's arena: described without a descriptor. */
    {
        lf_export described;
        EXPECT(lf_buffer_describe(buf, &described), LF_OK);
        CHECK(described.fd == -1 && described.magic == LF_EXPORT_MAGIC && described.size == m->len);
        CHECK(described.offset + described.size <= described.arena_size && described.location == location_of(k));
    }

    /* Read through the lent buffer. */
    memset(bytes, 0, REGION);
    EXPECT(lf_buffer_read(buf, 0, bytes, m->len), LF_OK);
    CHECK(holds(bytes, m->len, m->sequence));
    /* A GPU copy into a buffer of this process, read back. */
    memset(bytes, 0, REGION);
    EXPECT(lf_buffer_write(own, 0, bytes, REGION), LF_OK);
    EXPECT(lf_buffer_copy(context, own, 0, buf, 0, m->len), LF_OK);
    EXPECT(lf_buffer_read(own, 0, bytes, m->len), LF_OK);
    CHECK(holds(bytes, m->len, m->sequence));

    /* Exported (to hand to CUDA, say): the producer's arena. */
    memset(&ex, 0, sizeof ex);
    ex.fd = -1;
    EXPECT(lf_buffer_export(buf, &ex), LF_OK);
    CHECK(ex.magic == LF_EXPORT_MAGIC && ex.version == LF_EXPORT_VERSION);
    CHECK(ex.location == location_of(k) && ex.size == m->len);
    CHECK(ex.exporter_pid != (uint32_t)getpid());
    CHECK(ex.fd >= 0 && fd_is_open(ex.fd));
    if (ex.fd >= 0) close(ex.fd);

    /* Lent, not owned: lf_free is refused (it returns nothing; the message says why) and the
     * buffer stays usable. */
    lf_free((lf_buffer *)buf);
    EXPECT_MESSAGE("lf_free");
    EXPECT_MESSAGE("lf_release the message");
    EXPECT(lf_buffer_size(buf, &size), LF_OK);
    EXPECT(lf_buffer_read(buf, 0, bytes, 16), LF_OK);
}

/* A release whose signal the consumer makes on its GPU needs the producer's released
 * semaphore, which this producer did not ask for (and which lavapipe cannot share): refused,
 * saying why, with the message still held and nothing written. */
static void release_on_gpu_refused(lf_channel *ch, const lf_message *m) {
    const lf_buffer *buf = NULL;
    lf_message forged = *m;
    uint64_t value = 12345;
    int fd = -1;
    EXPECT(lf_release_on_gpu(NULL, m, &value), LF_ERR_NULL_POINTER);
    EXPECT(lf_release_on_gpu(ch, NULL, &value), LF_ERR_NULL_POINTER);
    EXPECT(lf_release_on_gpu(ch, m, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_release_on_gpu(ch, m, &value), LF_ERR_UNSUPPORTED);
    EXPECT_MESSAGE("lf_release_on_gpu");
    EXPECT_MESSAGE("has no released semaphore");
    /* The reason: no shared semaphores (lavapipe), or the producer did not ask for one. */
    CHECK(strstr(lf_last_error_message(), "timeline semaphores") != NULL ||
          strstr(lf_last_error_message(), "did not ask for one") != NULL);
    EXPECT_MESSAGE("release it with lf_release");
    CHECK(value == 12345);
    EXPECT(lf_message_buffer(ch, m, &buf), LF_OK); /* still held */
    forged.flags = LF_MESSAGE_ZERO_COPY;
    EXPECT(lf_release_on_gpu(ch, &forged, &value), LF_ERR_INVALID_STATE);
    EXPECT_MESSAGE("not a GPU message held");
    /* Nor is there a released semaphore to import. */
    EXPECT(lf_channel_released_semaphore(ch, &fd), LF_ERR_UNSUPPORTED);
    EXPECT_MESSAGE("has no released semaphore");
    CHECK(fd == -1);
}

static void consumer_bad_input(lf_channel *ch, const lf_message *m) {
    const lf_buffer *buf = NULL;
    lf_message forged = *m;
    EXPECT(lf_message_buffer(NULL, m, &buf), LF_ERR_NULL_POINTER);
    EXPECT(lf_message_buffer(ch, NULL, &buf), LF_ERR_NULL_POINTER);
    EXPECT(lf_message_buffer(ch, m, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_message_buffer((lf_channel *)m, m, &buf), LF_ERR_BAD_HANDLE);
    CHECK(buf == NULL);
    /* Not a message this channel holds. */
    forged.sequence += 1000;
    EXPECT(lf_message_buffer(ch, &forged, &buf), LF_ERR_INVALID_STATE);
    EXPECT(lf_release(ch, &forged), LF_ERR_INVALID_STATE);
    forged = *m;
    forged.flags = LF_MESSAGE_ZERO_COPY; /* the GPU flag taken away */
    EXPECT(lf_message_buffer(ch, &forged, &buf), LF_ERR_INVALID_STATE);
    CHECK(buf == NULL);
    EXPECT(lf_send_buffer(ch, NULL, 0, 8, -1, NULL), LF_ERR_NULL_POINTER);
    release_on_gpu_refused(ch, m);
}

static int run_consumer(const char *name) {
    unsigned char *bytes = malloc(REGION);
    lf_buffer *own = NULL;
    lf_message m;
    int fds = -1;
    if (bytes == NULL) return 1;
    if (gpu_context("consumer") == NULL) {
        free(bytes);
        return failures ? 1 : SKIPPED;
    }
    EXPECT(lf_alloc(context, REGION, LF_MEMORY_GPU_DEVICE_LOCAL, LF_UNSET, LF_HUGEPAGE_DEFAULT, &own), LF_OK);
    if (own == NULL) return 1;
    fds = open_fd_count();
    lf_channel *ch = open_channel(name, LF_ROLE_CONSUMER);
    if (ch == NULL) return 1;
    int host_sync = check_transport(ch, "consumer", NULL);
    int shared = check_ready_semaphore(ch);
    /* The consumer's reason names the sync only where it says host-side; then no semaphore. */
    if (host_sync) CHECK(!shared);
    printf("consumer: ready semaphore: %s\n", shared ? "shared (an fd)" : lf_last_error_message());

    for (uint64_t seq = 0; seq < TOTAL && failures < 10; seq++) {
        int before = failures;
        enum kind k = kind_of(seq);
        const lf_buffer *buf = NULL;
        EXPECT(lf_recv(ch, 30 * SECOND, &m), LF_OK);
        CHECK(m.sequence == seq);
        CHECK(m.len == length_of(seq));
        if (m.sequence != seq) break;
        if (k == BYTES || k == CPU_BUFFER) {
            /* CPU buffer ranges of more than 112 bytes go by reference; shorter ones are copied. */
            CHECK(m.flags == (k == BYTES || m.len <= 112 ? 0u : (uint32_t)LF_MESSAGE_ZERO_COPY));
            CHECK(m.data != NULL && holds(m.data, m.len, seq));
            EXPECT(lf_message_buffer(ch, &m, &buf), LF_ERR_INVALID_STATE);
            EXPECT_MESSAGE("carries no GPU buffer");
            CHECK(buf == NULL);
            EXPECT(lf_release(ch, &m), LF_OK);
            EXPECT(lf_release(ch, &m), LF_ERR_INVALID_STATE);
            continue;
        }
        check_gpu_message(ch, &m, own, bytes);
        if (seq == 1) consumer_bad_input(ch, &m);
        EXPECT(lf_message_buffer(ch, &m, &buf), LF_OK);
        EXPECT(lf_release(ch, &m), LF_OK);
        /* Released: the message and the buffer it lent are gone. */
        {
            const lf_buffer *lent = buf;
            size_t size = 0;
            buf = NULL;
            EXPECT(lf_message_buffer(ch, &m, &buf), LF_ERR_INVALID_STATE);
            CHECK(buf == NULL);
            EXPECT(lf_release(ch, &m), LF_ERR_INVALID_STATE);
            EXPECT_MESSAGE("not held");
            EXPECT(lf_buffer_size(lent, &size), LF_ERR_BAD_HANDLE);
        }
        if (failures != before) fprintf(stderr, "consumer: in message %llu (%s)\n", (unsigned long long)seq, kind_name(k));
    }
    /* The producer closes after its last message is complete. */
    EXPECT(lf_recv(ch, 30 * SECOND, &m), LF_ERR_PEER_GONE);
    lf_channel_free(ch);
    /* The producer's arenas were imported for the channel only. */
    CHECK(open_fd_count() == fds);
    lf_free(own);
    free(bytes);
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
    char dir[] = "/tmp/lf-c-gpu-channel-XXXXXX";
    char name[64];
    int status = 0, consumer = 0;
    pid_t child;

    if (argc == 3 && strcmp(argv[1], "producer") == 0) return run_producer(argv[2]);
    if (argc == 3 && strcmp(argv[1], "consumer") == 0) return run_consumer(argv[2]);
    if (argc != 1) {
        fprintf(stderr, "usage: %s [producer|consumer NAME]\n", argv[0]);
        return 2;
    }
    /* A private runtime dir (mkdtemp makes it 0700), checked empty at the end. Nothing of
     * lava-flow exists before the fork: each process opens its GPU itself. */
    if (mkdtemp(dir) == NULL) return 1;
    setenv("LF_RUNTIME_DIR", dir, 1);
    snprintf(name, sizeof name, "c-gpu-test-%d", (int)getpid());
    fflush(NULL);
    child = fork();
    if (child == 0) {
        int rc = run_producer(name);
        fflush(NULL); /* _exit does not */
        _exit(rc);
    }
    CHECK(child > 0);
    consumer = run_consumer(name);
    if (consumer != 0 && consumer != SKIPPED) fprintf(stderr, "consumer failed\n");
    CHECK(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    /* Both skip (no GPU, the same for both), or both pass. */
    CHECK(WEXITSTATUS(status) == (consumer == SKIPPED ? SKIPPED : 0));
    CHECK(dir_is_empty(dir));
    rmdir(dir);
    if (failures == 0 && consumer == SKIPPED) return SKIPPED;
    if (failures == 0) printf("test_gpu_channel: OK\n");
    return failures != 0;
}
