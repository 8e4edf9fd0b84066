/* Layer 1 CPU memory through the C API: every strategy, lookup by address, registration,
 * export to a forked child that imports and writes back, no fd leaks over many cycles, and
 * bad input of every kind. Plain C11; prints each failed check and returns non-zero.
 *
 * The contexts here leave the GPU alone (LF_GPU_DISABLED, strict): this test is about CPU
 * memory, runs under valgrind, and forks, which Vulkan drivers do not survive once
 * initialised. test_gpu.c covers the GPU. */
#define _GNU_SOURCE
#include <lava_flow.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures = 0;

#include "check.h"

/* A CPU-only context: no Vulkan, and GPU locations refused rather than falling back. */
static lf_context_config cpu_only(void) {
    lf_context_config config;
    lf_context_config_init(&config, sizeof config);
    config.gpu_policy = LF_GPU_DISABLED;
    config.strict_gpu = 1;
    return config;
}

static unsigned char pattern(size_t seed, size_t at) { return (unsigned char)(at * 31u ^ seed * 7u); }

static void fill(lf_buffer *buffer, size_t seed) {
    void *ptr = NULL;
    size_t size = 0;
    EXPECT(lf_buffer_ptr(buffer, &ptr), LF_OK);
    EXPECT(lf_buffer_size(buffer, &size), LF_OK);
    for (size_t i = 0; i < size; i++) ((unsigned char *)ptr)[i] = pattern(seed, i);
}

static int holds(const lf_buffer *buffer, size_t seed) {
    void *ptr = NULL;
    size_t size = 0;
    if (lf_buffer_ptr(buffer, &ptr) != LF_OK || lf_buffer_size(buffer, &size) != LF_OK) return 0;
    for (size_t i = 0; i < size; i++)
        if (((unsigned char *)ptr)[i] != pattern(seed, i)) return 0;
    return 1;
}

static void each_strategy(lf_context *context) {
    const lf_memory_kind locations[] = {LF_MEMORY_CPU_STANDARD, LF_MEMORY_CPU_NUMA, LF_MEMORY_CPU_GPU_PINNED};
    for (size_t i = 0; i < sizeof locations / sizeof locations[0]; i++) {
        lf_buffer *buffer = NULL;
        EXPECT(lf_alloc(context, 5000, locations[i], LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffer), LF_OK);
        if (buffer == NULL) continue;
        lf_memory_kind location = 0;
        lf_origin origin = 0;
        size_t page = 0;
        EXPECT(lf_buffer_location(buffer, &location), LF_OK);
        EXPECT(lf_buffer_origin(buffer, &origin), LF_OK);
        EXPECT(lf_buffer_page_size(buffer, &page), LF_OK);
        CHECK(location == locations[i]);
        CHECK(origin == LF_ORIGIN_ALLOCATED);
        CHECK(page == (size_t)sysconf(_SC_PAGESIZE));
        fill(buffer, i);
        CHECK(holds(buffer, i));
        lf_free(buffer);
    }
    /* Hugepages, best-effort: either really huge, or visibly standard. */
    lf_buffer *huge = NULL;
    EXPECT(lf_alloc(context, 100, LF_MEMORY_CPU_HUGEPAGE_2MB, LF_UNSET, LF_HUGEPAGE_BEST_EFFORT, &huge), LF_OK);
    if (huge != NULL) {
        lf_memory_kind location = 0;
        size_t page = 0;
        EXPECT(lf_buffer_location(huge, &location), LF_OK);
        EXPECT(lf_buffer_page_size(huge, &page), LF_OK);
        CHECK((location == LF_MEMORY_CPU_HUGEPAGE_2MB && page == 2u << 20) ||
              (location == LF_MEMORY_CPU_STANDARD && page == (size_t)sysconf(_SC_PAGESIZE)));
        fill(huge, 9);
        CHECK(holds(huge, 9));
        lf_free(huge);
    }
}

static void find_and_register(lf_context *context) {
    lf_buffer *buffer = NULL, *found = NULL;
    void *ptr = NULL;
    size_t offset = 0;
    EXPECT(lf_alloc(context, 1000, LF_MEMORY_CPU_STANDARD, LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffer), LF_OK);
    EXPECT(lf_buffer_ptr(buffer, &ptr), LF_OK);
    EXPECT(lf_buffer_find(context, (char *)ptr + 500, &found, &offset), LF_OK);
    CHECK(found == buffer && offset == 500);
    lf_free(buffer);
    EXPECT(lf_buffer_find(context, (char *)ptr + 500, &found, NULL), LF_ERR_NOT_FOUND);

    char *user = malloc(10000);
    lf_buffer *registered = NULL;
    lf_export export;
    EXPECT(lf_register(context, user, 10000, &registered), LF_OK);
    EXPECT(lf_buffer_find(context, user + 9999, &found, &offset), LF_OK);
    CHECK(found == registered && offset == 9999);
    EXPECT(lf_register(context, user + 10, 10, &found), LF_ERR_INVALID_ARGUMENT);
    EXPECT(lf_buffer_export(registered, &export), LF_ERR_UNSUPPORTED);
    EXPECT(lf_buffer_describe(registered, &export), LF_ERR_UNSUPPORTED);
    EXPECT(lf_deregister(context, registered), LF_OK);
    EXPECT(lf_buffer_find(context, user, &found, NULL), LF_ERR_NOT_FOUND);
    free(user);
}

/* The child: imports what the parent exports, checks it, writes its answer, acknowledges. */
static int importer_child(int socket) {
    lf_context *context = NULL;
    lf_export export;
    lf_buffer *imported = NULL;
    lf_origin origin = 0;
    lf_context_config config = cpu_only();
    if (lf_context_create(&config, &context) != LF_OK) return 10;
    if (lf_export_recv(socket, &export) != LF_OK) return 11;
    if (export.exporter_pid != (uint32_t)getppid()) return 12;
    if (lf_import(context, &export, &imported) != LF_OK) return 13;
    if (lf_buffer_origin(imported, &origin) != LF_OK || origin != LF_ORIGIN_IMPORTED) return 14;
    if (!holds(imported, 1)) return 15;
    fill(imported, 2);
    char ack = 1;
    if (write(socket, &ack, 1) != 1) return 16;
    lf_free(imported);
    lf_context_free(context);
    return 0;
}

static void export_to_another_process(lf_context *context) {
    int pair[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0);
    lf_buffer *buffer = NULL;
    EXPECT(lf_alloc(context, 100000, LF_MEMORY_CPU_NUMA, LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffer), LF_OK);
    fill(buffer, 1);
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        close(pair[0]);
        _exit(importer_child(pair[1]));
    }
    close(pair[1]);
    lf_export export;
    check_describe(buffer);
    EXPECT(lf_buffer_describe(NULL, &export), LF_ERR_NULL_POINTER);
    EXPECT(lf_buffer_describe(buffer, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_buffer_export(buffer, &export), LF_OK);
    CHECK(export.magic == LF_EXPORT_MAGIC && export.size == 100000);
    EXPECT(lf_export_send(pair[0], &export), LF_OK);
    close(export.fd);
    char ack = 0;
    CHECK(read(pair[0], &ack, 1) == 1 && ack == 1);
    CHECK(holds(buffer, 2)); /* the child's writes are seen here */
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fprintf(stderr, "importer child failed with status %d\n", status), failures++;
    close(pair[0]);
    lf_free(buffer);
}

static void no_leaks_over_many_cycles(lf_context *context) {
    int before = -1;
    for (int i = 0; i < 2100; i++) {
        if (i == 100) before = open_fd_count();
        lf_buffer *buffer = NULL, *imported = NULL;
        lf_export export;
        size_t size = i % 10 == 0 ? (1u << 20) : 64u + (size_t)i % 4000u;
        if (lf_alloc(context, size, LF_MEMORY_CPU_STANDARD, LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffer) != LF_OK ||
            lf_buffer_export(buffer, &export) != LF_OK) {
            CHECK(!"alloc and export");
            break;
        }
        EXPECT(lf_import(context, &export, &imported), LF_OK);
        lf_free(imported);
        lf_free(buffer);
    }
    CHECK(open_fd_count() == before);
}

/* A buffer that is not where it was asked to be says why; one that is, says nothing. */
static void check_reason(const lf_buffer *buffer, uint32_t asked) {
    lf_memory_kind location = 0;
    const char *why = NULL;
    EXPECT(lf_buffer_location(buffer, &location), LF_OK);
    EXPECT(lf_buffer_fallback_reason(buffer, &why), LF_OK);
    if (location == asked) {
        CHECK(why == NULL);
    } else {
        CHECK(location == LF_MEMORY_CPU_STANDARD);
        CHECK(why != NULL && strstr(why, "huge pages") != NULL && strstr(why, "best-effort") != NULL);
        if (why != NULL) printf("fallback reason: %s\n", why);
    }
}

/* Best-effort huge pages, through each way of asking: lf_alloc's hugepage_policy, the context's policy,
 * and lf_alloc_auto's staging memory for a peer on another host (more 2 MiB pages than are
 * reserved, so that it falls back where hugepages are reserved too). */
static void best_effort_fallbacks_say_why(void) {
    lf_context *context = NULL;
    lf_context_config config = cpu_only();
    config.hugepage_policy = LF_HUGEPAGE_BEST_EFFORT;
    EXPECT(lf_context_create(&config, &context), LF_OK);
    if (context == NULL) return;
    lf_buffer *buffer = NULL;
    EXPECT(lf_alloc(context, 64, LF_MEMORY_CPU_HUGEPAGE_1GB, LF_UNSET, LF_HUGEPAGE_BEST_EFFORT, &buffer), LF_OK);
    if (buffer) check_reason(buffer, LF_MEMORY_CPU_HUGEPAGE_1GB);
    lf_free(buffer);
    buffer = NULL;
    EXPECT(lf_alloc(context, 64, LF_MEMORY_CPU_HUGEPAGE_1GB, LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffer), LF_OK);
    if (buffer) check_reason(buffer, LF_MEMORY_CPU_HUGEPAGE_1GB);
    lf_free(buffer);
    buffer = NULL;

    size_t free_pages = 0;
    FILE *f = fopen("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "r");
    if (f) {
        if (fscanf(f, "%zu", &free_pages) != 1) free_pages = 0;
        fclose(f);
    }
    lf_location *mine = NULL, *peer = NULL;
    EXPECT(lf_location_new("node-a", 0, LF_UNSET, &mine), LF_OK);
    EXPECT(lf_location_new("node-b", 0, LF_UNSET, &peer), LF_OK);
    lf_status st = lf_alloc_auto(context, (free_pages + 1) * (2u << 20), mine, peer, &buffer);
    CHECK(st == LF_OK || st == LF_ERR_OUT_OF_MEMORY);
    if (st == LF_OK) check_reason(buffer, LF_MEMORY_CPU_HUGEPAGE_2MB);
    lf_free(buffer);
    lf_location_free(mine);
    lf_location_free(peer);
    lf_context_free(context);
}

static void bad_input(lf_context *context) {
    lf_buffer *buffer = NULL;
    EXPECT(lf_alloc(context, 64, LF_MEMORY_CPU_STANDARD, LF_UNSET, LF_HUGEPAGE_DEFAULT, NULL), LF_ERR_NULL_POINTER);
    EXPECT(lf_alloc(NULL, 64, LF_MEMORY_CPU_STANDARD, LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffer), LF_ERR_NULL_POINTER);
    EXPECT(lf_alloc(context, 0, LF_MEMORY_CPU_STANDARD, LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffer), LF_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("size 0");
    EXPECT(lf_alloc(context, SIZE_MAX, LF_MEMORY_CPU_STANDARD, LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffer), LF_ERR_OUT_OF_MEMORY);
    EXPECT(lf_alloc(context, 64, 999, LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffer), LF_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("location is 999, not an lf_memory_kind: use LF_MEMORY_CPU_STANDARD (1)");
    EXPECT(lf_alloc(context, 64, LF_MEMORY_CPU_NUMA, 4000, LF_HUGEPAGE_DEFAULT, &buffer), LF_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("NUMA node 4000 does not exist");
    EXPECT(lf_alloc(context, 64, LF_MEMORY_CPU_STANDARD, LF_UNSET, 0x80, &buffer), LF_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("hugepage_policy is 128, not an lf_hugepage_policy: use LF_HUGEPAGE_DEFAULT (0)");
    EXPECT(lf_alloc(context, 64, LF_MEMORY_GPU_DEVICE_LOCAL, LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffer), LF_ERR_UNSUPPORTED);
    EXPECT_MESSAGE("strict_gpu");
    EXPECT(lf_alloc(context, 64, LF_MEMORY_CPU_HUGEPAGE_1GB, LF_UNSET, LF_HUGEPAGE_BEST_EFFORT, &buffer), LF_OK);
    lf_free(buffer);
    EXPECT(lf_register(context, NULL, 10, &buffer), LF_ERR_NULL_POINTER);
    EXPECT_MESSAGE("`ptr` is NULL");

    /* A freed handle is refused; a double free is ignored. */
    EXPECT(lf_alloc(context, 64, LF_MEMORY_CPU_STANDARD, LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffer), LF_OK);
    lf_free(buffer);
    size_t size = 0;
    EXPECT(lf_buffer_size(buffer, &size), LF_ERR_BAD_HANDLE);
    lf_free(buffer);
    lf_free(NULL);
    lf_context_free(NULL);

    /* Foreign and damaged exports: refused, and their fds closed. */
    lf_buffer *good = NULL, *imported = NULL;
    lf_export export;
    EXPECT(lf_alloc(context, 64, LF_MEMORY_CPU_STANDARD, LF_UNSET, LF_HUGEPAGE_DEFAULT, &good), LF_OK);
    EXPECT(lf_buffer_export(good, &export), LF_OK);
    lf_export bad = export;
    bad.fd = memfd_create("not-lava-flow", MFD_CLOEXEC);
    CHECK(ftruncate(bad.fd, (off_t)export.arena_size) == 0);
    EXPECT(lf_import(context, &bad, &imported), LF_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("not a lava-flow memory file");
    CHECK(!fd_is_open(bad.fd));
    bad = export;
    bad.fd = dup(export.fd);
    bad.magic = 0x12345678;
    EXPECT(lf_import(context, &bad, &imported), LF_ERR_INVALID_ARGUMENT);
    CHECK(!fd_is_open(bad.fd));
    bad.magic = export.magic;
    bad.fd = dup(export.fd);
    bad.size = export.arena_size + 1;
    EXPECT(lf_import(context, &bad, &imported), LF_ERR_INVALID_ARGUMENT);
    CHECK(!fd_is_open(bad.fd));
    bad = export;
    bad.fd = -1;
    EXPECT(lf_import(context, &bad, &imported), LF_ERR_INVALID_ARGUMENT);
    EXPECT(lf_import(context, NULL, &imported), LF_ERR_NULL_POINTER);
    CHECK(imported == NULL);
    EXPECT(lf_import(context, &export, &imported), LF_OK); /* the good one, at last */
    lf_free(imported);
    lf_free(good);
}

int main(void) {
    lf_context *context = NULL;
    lf_context_config config = cpu_only();
    EXPECT(lf_context_create(&config, &context), LF_OK);
    if (context == NULL) return 1;
    config.hugepage_policy = 42;
    lf_context *bad_context = NULL;
    EXPECT(lf_context_create(&config, &bad_context), LF_ERR_INVALID_ARGUMENT);

    each_strategy(context);
    find_and_register(context);
    export_to_another_process(context);
    no_leaks_over_many_cycles(context);
    bad_input(context);
    best_effort_fallbacks_say_why();
    lf_context_free(context);

    if (failures != 0) {
        fprintf(stderr, "test_memory: %d check(s) failed\n", failures);
        return 1;
    }
    printf("test_memory: all checks passed\n");
    return 0;
}
