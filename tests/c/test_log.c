/* Logging through the C API: lf_set_log_level and lf_set_log_callback.
 *
 * Forks: the child is a channel's producer, the parent its consumer. The parent takes
 * lava-flow's log records through a callback and checks that
 *   - a bad level is refused, and records above the level set never reach the callback;
 *   - a fallback (GPU memory asked of a context without a GPU) comes at LF_LOG_WARN;
 *   - the channel's transport choice comes at LF_LOG_INFO, with its target, and user_data;
 *   - after lf_set_log_callback(NULL, NULL) records go to stderr again (stderr is redirected
 *     to a file for the check), one line `lava-flow[PID] INFO TARGET: MESSAGE`, and the
 *     callback is not called any more.
 * Plain C11; prints each failed check and returns non-zero. */
#define _GNU_SOURCE
#include <lava_flow.h>

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures = 0;

#include "check.h"

#define SECOND 1000000000LL
#define MAGIC 0x10c5eedu

/* What the callback saw. Only the parent's main thread logs in this test, but the callback
 * must be thread-safe in general: a real one would lock. */
struct seen {
    unsigned magic;
    int calls;
    int above_level; /* records more verbose than the level set */
    int level_set;   /* the level in force, to check the filter */
    int fallback_level;
    int transport_level;
    int transports; /* transport records: one per channel end */
    char transport_target[128];
    char transport_message[1024];
};

static void on_record(void *user_data, lf_log_level level, const char *target, const char *message) {
    struct seen *s = user_data;
    if (s == NULL || s->magic != MAGIC) {
        fprintf(stderr, "callback: wrong user_data %p\n", user_data);
        failures++;
        return;
    }
    s->calls++;
    if ((int)level > s->level_set || level == LF_LOG_OFF) s->above_level++;
    if (target == NULL || message == NULL || strchr(message, '\n') != NULL) {
        fprintf(stderr, "callback: bad strings\n");
        failures++;
        return;
    }
    if (strstr(message, "no Vulkan device") != NULL && s->fallback_level == -1) s->fallback_level = (int)level;
    if (strstr(message, "transport shm") != NULL) s->transports++;
    if (strstr(message, "transport shm") != NULL && s->transport_level == -1) {
        s->transport_level = (int)level;
        snprintf(s->transport_target, sizeof s->transport_target, "%s", target);
        snprintf(s->transport_message, sizeof s->transport_message, "%s", message);
    }
}

static lf_channel *open_channel(lf_context *context, const char *name, lf_role role) {
    lf_location *here = NULL;
    lf_channel *channel = NULL;
    lf_channel_config config;
    EXPECT(lf_channel_config_init(&config, sizeof config), LF_OK);
    config.capacity = 4;
    config.pool_size = 1 << 16;
    config.rendezvous_timeout_ns = 30 * SECOND;
    EXPECT(lf_location_detect(&here), LF_OK);
    EXPECT(lf_channel_create(context, name, role, here, here, &config, &channel), LF_OK);
    lf_location_free(here);
    return channel;
}

static lf_context *context_without_gpu(void) {
    lf_context *context = NULL;
    lf_context_config config;
    lf_context_config_init(&config, sizeof config);
    config.gpu_policy = LF_GPU_DISABLED;
    EXPECT(lf_context_create(&config, &context), LF_OK);
    return context;
}

/* The child: sends one message, waits for the parent's word, then closes its end. */
static int run_producer(const char *name, int go) {
    lf_context *context = context_without_gpu();
    lf_channel *ch = open_channel(context, name, LF_ROLE_PRODUCER);
    char byte;
    EXPECT(lf_send(ch, "hello", 5, 30 * SECOND, NULL), LF_OK);
    CHECK(read(go, &byte, 1) == 1);
    lf_channel_free(ch);
    lf_context_free(context);
    return failures != 0;
}

/* Reads at most `size - 1` bytes of `path` into `buf`. */
static void read_file(const char *path, char *buf, size_t size) {
    FILE *f = fopen(path, "r");
    size_t n = 0;
    if (f != NULL) {
        n = fread(buf, 1, size - 1, f);
        fclose(f);
    }
    buf[n] = '\0';
}

static void run_consumer(const char *name, int go) {
    static struct seen seen;
    lf_context *context = NULL;
    lf_channel *ch = NULL;
    lf_buffer *buffer = NULL;
    lf_message m;
    char log_path[] = "/tmp/lf-c-log-XXXXXX";
    char text[8192], prefix[64];
    int saved_stderr, log_fd, calls;

    memset(&seen, 0, sizeof seen);
    seen.magic = MAGIC;
    seen.fallback_level = seen.transport_level = -1;

    /* Bad levels are refused; LF_LOG_OFF to LF_LOG_TRACE are not. */
    EXPECT(lf_set_log_level(6), LF_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("level is 6, not an lf_log_level: use LF_LOG_OFF (0)");
    EXPECT(lf_set_log_level(LF_LOG_TRACE), LF_OK);

    /* Warnings only: the fallback comes, nothing more verbose does. */
    seen.level_set = LF_LOG_WARN;
    EXPECT(lf_set_log_level(LF_LOG_WARN), LF_OK);
    EXPECT(lf_set_log_callback(on_record, &seen), LF_OK);
    context = context_without_gpu();
    EXPECT(lf_alloc(context, 4096, LF_MEMORY_GPU_DEVICE_LOCAL, LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffer), LF_OK);
    lf_free(buffer);
    CHECK(seen.fallback_level == LF_LOG_WARN);

    /* Info: the transport choice. */
    seen.level_set = LF_LOG_INFO;
    EXPECT(lf_set_log_level(LF_LOG_INFO), LF_OK);
    ch = open_channel(context, name, LF_ROLE_CONSUMER);
    CHECK(seen.transport_level == LF_LOG_INFO);
    CHECK(strcmp(seen.transport_target, "lava_flow::channels") == 0);
    CHECK(strstr(seen.transport_message, name) != NULL && strstr(seen.transport_message, "(consumer)") != NULL);
    CHECK(seen.above_level == 0);
    EXPECT(lf_recv(ch, 30 * SECOND, &m), LF_OK);
    CHECK(m.len == 5 && memcmp(m.data, "hello", 5) == 0);
    EXPECT(lf_release(ch, &m), LF_OK);
    CHECK(seen.transports == 1);

    /* NULL: stderr again. The producer's close, logged at info, is the record to find. */
    EXPECT(lf_set_log_callback(NULL, NULL), LF_OK);
    calls = seen.calls;
    fflush(stderr);
    saved_stderr = dup(STDERR_FILENO);
    log_fd = mkstemp(log_path);
    CHECK(saved_stderr >= 0 && log_fd >= 0);
    CHECK(dup2(log_fd, STDERR_FILENO) == STDERR_FILENO);
    CHECK(write(go, "x", 1) == 1);
    EXPECT(lf_recv(ch, 30 * SECOND, &m), LF_ERR_PEER_GONE);
    fflush(stderr);
    CHECK(dup2(saved_stderr, STDERR_FILENO) == STDERR_FILENO);
    close(saved_stderr);
    close(log_fd);
    read_file(log_path, text, sizeof text);
    unlink(log_path);
    snprintf(prefix, sizeof prefix, "lava-flow[%d] INFO lava_flow::", (int)getpid());
    CHECK(strstr(text, prefix) != NULL);
    CHECK(strstr(text, "closed its end") != NULL);
    CHECK(seen.calls == calls);
    if (strstr(text, prefix) == NULL) fprintf(stderr, "stderr after the callback was removed:\n%s\n", text);

    lf_channel_free(ch);
    lf_context_free(context);
}

int main(void) {
    char dir[] = "/tmp/lf-c-log-dir-XXXXXX";
    char name[64];
    int status = 0, go[2];
    pid_t child;

    if (mkdtemp(dir) == NULL) return 1;
    setenv("LF_RUNTIME_DIR", dir, 1);
    snprintf(name, sizeof name, "c-log-%d", (int)getpid());
    if (pipe(go) != 0) return 1;
    fflush(NULL);
    child = fork();
    if (child == 0) {
        close(go[1]);
        _exit(run_producer(name, go[0]));
    }
    close(go[0]);
    CHECK(child > 0);
    run_consumer(name, go[1]);
    close(go[1]);
    CHECK(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    rmdir(dir);
    if (failures == 0) printf("test_log: OK\n");
    return failures != 0;
}
