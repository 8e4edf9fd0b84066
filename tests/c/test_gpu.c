/* Layer 1 GPU memory through the C API: the device report, each GPU location allocated,
 * written, read and copied, export to a child process (forked, then re-executed so that it
 * opens Vulkan afresh) that imports, checks and writes back, the visible CPU fallback,
 * GPU-pinned registrations, no fd leaks over many export/import cycles, and bad input.
 *
 * Without a Vulkan device the GPU parts are skipped (the fallback parts still run), unless
 * LF_REQUIRE_VULKAN=1. Plain C11; prints each failed check and returns non-zero. */
#define _GNU_SOURCE
#include <lava_flow.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures = 0;

#include "check.h"

enum { BIG = 100000, SMALL = 5000 };

static void pattern(unsigned char *out, size_t size, unsigned seed) {
    for (size_t i = 0; i < size; i++) out[i] = (unsigned char)(i * 31u ^ seed * 7u);
}

/* Whether the buffer holds pattern `seed`, read through lf_buffer_read. */
static int holds(const lf_buffer *buffer, size_t size, unsigned seed) {
    unsigned char *want = malloc(size), *got = malloc(size);
    int same = want != NULL && got != NULL && lf_buffer_read(buffer, 0, got, size) == LF_OK;
    if (same) {
        pattern(want, size, seed);
        same = memcmp(want, got, size) == 0;
    }
    free(want);
    free(got);
    return same;
}

static void fill(lf_buffer *buffer, size_t size, unsigned seed) {
    unsigned char *data = malloc(size);
    pattern(data, size, seed);
    EXPECT(lf_buffer_write(buffer, 0, data, size), LF_OK);
    free(data);
}

static void print_uuid(const char *label, const uint8_t uuid[16]) {
    printf("%s ", label);
    for (int i = 0; i < 16; i++) printf("%02x%s", uuid[i], i == 3 || i == 5 || i == 7 || i == 9 ? "-" : "");
    printf("\n");
}

static void report_device(lf_context *context) {
    lf_device_info info = {.struct_size = sizeof info};
    EXPECT(lf_context_device_info(context, &info), LF_OK);
    printf("device %u: %s (type %u, vendor 0x%04x), driver %s %s\n", info.index, info.name, info.device_type,
           info.vendor_id, info.driver_name, info.driver_info);
    print_uuid("  deviceUUID", info.device_uuid);
    print_uuid("  driverUUID", info.driver_uuid);
    for (uint32_t i = 0; i < info.heap_count; i++)
        printf("  heap %u: %llu bytes%s\n", i, (unsigned long long)info.heap_sizes[i],
               info.heap_flags[i] & 1 ? " DEVICE_LOCAL" : "");
    CHECK(info.name[0] != '\0' && info.heap_count >= 1 && info.heap_sizes[0] > 0);
    CHECK((info.features & LF_DEVICE_EXPORT_OPAQUE_FD) != 0);
    /* A newer header's larger struct: filled as far as this library knows, zeros after that up
     * to its struct_size, nothing beyond. */
    struct {
        lf_device_info info;
        uint64_t newer[2];
    } wide;
    memset(&wide, 0xab, sizeof wide);
    wide.info.struct_size = sizeof wide.info + 8;
    EXPECT(lf_context_device_info(context, &wide.info), LF_OK);
    CHECK(wide.info.struct_size == sizeof wide.info + 8 && strcmp(wide.info.name, info.name) == 0);
    CHECK(wide.newer[0] == 0 && wide.newer[1] == 0xababababababababull);
}

static void each_location(lf_context *context) {
    const lf_memory_kind locations[] = {LF_MEMORY_GPU_DEVICE_LOCAL, LF_MEMORY_GPU_HOST_VISIBLE};
    lf_buffer *cpu = NULL;
    EXPECT(lf_alloc(context, BIG, LF_MEMORY_CPU_STANDARD, LF_UNSET, LF_HUGEPAGE_DEFAULT, &cpu), LF_OK);
    for (size_t i = 0; i < 2; i++) {
        lf_buffer *gpu = NULL, *other = NULL;
        lf_memory_kind location = 0;
        const char *reason = "unset";
        EXPECT(lf_alloc(context, BIG, locations[i], LF_UNSET, LF_HUGEPAGE_DEFAULT, &gpu), LF_OK);
        EXPECT(lf_alloc(context, BIG, locations[1 - i], LF_UNSET, LF_HUGEPAGE_DEFAULT, &other), LF_OK);
        if (gpu == NULL || other == NULL) continue;
        EXPECT(lf_buffer_location(gpu, &location), LF_OK);
        EXPECT(lf_buffer_fallback_reason(gpu, &reason), LF_OK);
        CHECK(location == locations[i] && reason == NULL);
        fill(gpu, BIG, (unsigned)i + 1);
        CHECK(holds(gpu, BIG, (unsigned)i + 1));
        void *ptr = NULL;
        lf_status mapped = lf_buffer_ptr(gpu, &ptr);
        CHECK(mapped == LF_OK || mapped == LF_ERR_INVALID_STATE); /* mappable or saying why not */
        if (locations[i] == LF_MEMORY_GPU_HOST_VISIBLE) CHECK(mapped == LF_OK && ptr != NULL);
        /* GPU -> GPU on the device, GPU -> CPU and CPU -> GPU through the host. */
        EXPECT(lf_buffer_copy(context, other, 0, gpu, 0, BIG), LF_OK);
        CHECK(holds(other, BIG, (unsigned)i + 1));
        EXPECT(lf_buffer_copy(context, cpu, 0, other, 0, BIG), LF_OK);
        CHECK(holds(cpu, BIG, (unsigned)i + 1));
        fill(cpu, BIG, 40);
        EXPECT(lf_buffer_copy(context, gpu, 0, cpu, 0, BIG), LF_OK);
        CHECK(holds(gpu, BIG, 40));
        /* Wrong offsets and sizes. */
        unsigned char byte = 0;
        EXPECT(lf_buffer_write(gpu, BIG, &byte, 1), LF_ERR_INVALID_ARGUMENT);
        EXPECT_MESSAGE("outside buffer");
        EXPECT(lf_buffer_read(gpu, SIZE_MAX, &byte, 1), LF_ERR_INVALID_ARGUMENT);
        EXPECT(lf_buffer_copy(context, gpu, 1, other, 0, BIG), LF_ERR_INVALID_ARGUMENT);
        EXPECT(lf_buffer_copy(context, gpu, 0, gpu, 8, 64), LF_ERR_INVALID_ARGUMENT);
        EXPECT_MESSAGE("overlap");
        lf_free(other);
        lf_free(gpu);
    }
    lf_free(cpu);
    /* Freed GPU memory goes back on request: at least the spare pooled arena, then nothing. */
    uint64_t given_back = 0;
    EXPECT(lf_context_trim(NULL, &given_back), LF_ERR_NULL_POINTER);
    EXPECT(lf_context_trim(context, &given_back), LF_OK);
    CHECK(given_back > 0);
    EXPECT(lf_context_trim(context, &given_back), LF_OK);
    CHECK(given_back == 0);
    EXPECT(lf_context_trim(context, NULL), LF_OK);
}

/* The child (re-executed): imports what the parent sends, checks it, writes back, acks. */
static int importer(int socket) {
    lf_context *context = NULL;
    lf_device_info info = {.struct_size = sizeof info};
    lf_export exports[2];
    lf_buffer *imported[2] = {NULL, NULL};
    const size_t sizes[2] = {BIG, SMALL};
    if (lf_context_create(NULL, &context) != LF_OK || lf_context_device_info(context, &info) != LF_OK) return 10;
    for (int i = 0; i < 2; i++) {
        if (lf_export_recv(socket, &exports[i]) != LF_OK) return 11;
        if (memcmp(exports[i].device_uuid, info.device_uuid, 16) != 0) return 12;
        if (lf_import(context, &exports[i], &imported[i]) != LF_OK) {
            fprintf(stderr, "child: lf_import: %s\n", lf_last_error_message());
            return 13;
        }
        lf_origin origin = 0;
        lf_memory_kind location = 0;
        if (lf_buffer_origin(imported[i], &origin) != LF_OK || origin != LF_ORIGIN_IMPORTED) return 14;
        if (lf_buffer_location(imported[i], &location) != LF_OK || location != exports[i].location) return 15;
        if (!holds(imported[i], sizes[i], 1 + (unsigned)i)) return 16;
        fill(imported[i], sizes[i], 11 + (unsigned)i);
    }
    char ack = 1;
    if (write(socket, &ack, 1) != 1) return 17;
    for (int i = 0; i < 2; i++) lf_free(imported[i]);
    lf_context_free(context);
    return failures == 0 ? 0 : 18;
}

static void export_to_another_process(lf_context *context, const char *self) {
    int pair[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, pair) == 0);
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        /* A fresh process image: Vulkan drivers are not fork-safe once initialised. */
        char fd[16];
        snprintf(fd, sizeof fd, "%d", pair[1]);
        close(pair[0]);
        /* argv[0], not /proc/self/exe: under valgrind the latter is valgrind itself. */
        execlp(self, self, "importer", fd, (char *)NULL);
        _exit(99);
    }
    close(pair[1]);
    const lf_memory_kind locations[2] = {LF_MEMORY_GPU_DEVICE_LOCAL, LF_MEMORY_GPU_HOST_VISIBLE};
    const size_t sizes[2] = {BIG, SMALL};
    lf_buffer *buffers[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        lf_export export;
        EXPECT(lf_alloc(context, sizes[i], locations[i], LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffers[i]), LF_OK);
        if (buffers[i] == NULL) break;
        fill(buffers[i], sizes[i], 1 + (unsigned)i);
        check_describe(buffers[i]);
        EXPECT(lf_buffer_export(buffers[i], &export), LF_OK);
        CHECK(export.magic == LF_EXPORT_MAGIC && export.version == LF_EXPORT_VERSION);
        CHECK(export.location == locations[i] && export.size == sizes[i] && export.handle_type == 1);
        CHECK(export.offset + export.size <= export.arena_size);
        EXPECT(lf_export_send(pair[0], &export), LF_OK);
        close(export.fd);
    }
    char ack = 0;
    CHECK(read(pair[0], &ack, 1) == 1 && ack == 1);
    for (int i = 0; i < 2; i++) CHECK(buffers[i] != NULL && holds(buffers[i], sizes[i], 11 + (unsigned)i));
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fprintf(stderr, "importer child failed with status %d\n", status), failures++;
    close(pair[0]);
    for (int i = 0; i < 2; i++) lf_free(buffers[i]);
}

static void no_leaks_over_many_cycles(lf_context *exporter) {
    lf_context *importer_context = NULL;
    EXPECT(lf_context_create(NULL, &importer_context), LF_OK);
    int before = -1;
    for (int i = 0; i < 310; i++) {
        if (i == 10) before = open_fd_count();
        lf_buffer *buffer = NULL, *imported = NULL;
        lf_export export;
        lf_memory_kind location = i % 2 ? LF_MEMORY_GPU_HOST_VISIBLE : LF_MEMORY_GPU_DEVICE_LOCAL;
        if (lf_alloc(exporter, 64 + (size_t)i * 13, location, LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffer) != LF_OK ||
            lf_buffer_export(buffer, &export) != LF_OK) {
            CHECK(!"alloc and export");
            break;
        }
        lf_export foreign = export;
        foreign.fd = dup(export.fd);
        foreign.driver_uuid[5] ^= 0x10;
        EXPECT(lf_import(importer_context, &foreign, &imported), LF_ERR_UNSUPPORTED);
        CHECK(!fd_is_open(foreign.fd));
        EXPECT(lf_import(importer_context, &export, &imported), LF_OK);
        lf_free(imported);
        lf_free(buffer);
    }
    CHECK(open_fd_count() == before);
    lf_context_free(importer_context);
}

static void pinned_registrations(lf_context *context) {
    lf_buffer *pinned = NULL;
    uint32_t flags = 0;
    const char *missing = NULL;
    EXPECT(lf_alloc(context, 4096, LF_MEMORY_CPU_GPU_PINNED, LF_UNSET, LF_HUGEPAGE_DEFAULT, &pinned), LF_OK);
    EXPECT(lf_buffer_registrations(pinned, &flags), LF_OK);
    EXPECT(lf_buffer_registration_failures(pinned, &missing), LF_OK);
    printf("GPU-pinned: vulkan %s, cuda %s; missing: %s\n", flags & LF_REGISTRATION_VULKAN ? "yes" : "no",
           flags & LF_REGISTRATION_CUDA ? "yes" : "no", missing ? missing : "nothing");
    CHECK((flags & (LF_REGISTRATION_VULKAN | LF_REGISTRATION_CUDA)) == flags);
    CHECK((flags == (LF_REGISTRATION_VULKAN | LF_REGISTRATION_CUDA)) == (missing == NULL));
    lf_free(pinned);
}

static void fallback_and_strict(void) {
    lf_context_config config;
    lf_context_config_init(&config, sizeof config);
    config.gpu_policy = LF_GPU_DISABLED;
    lf_context *context = NULL, *strict = NULL;
    lf_buffer *buffer = NULL;
    lf_memory_kind location = 0;
    const char *reason = NULL;
    EXPECT(lf_context_create(&config, &context), LF_OK);
    EXPECT(lf_alloc(context, 1000, LF_MEMORY_GPU_DEVICE_LOCAL, LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffer), LF_OK);
    EXPECT(lf_buffer_location(buffer, &location), LF_OK);
    EXPECT(lf_buffer_fallback_reason(buffer, &reason), LF_OK);
    CHECK(location == LF_MEMORY_CPU_STANDARD && reason != NULL && strstr(reason, "disables the GPU") != NULL);
    fill(buffer, 1000, 5);
    CHECK(holds(buffer, 1000, 5));
    lf_device_info info = {.struct_size = sizeof info};
    EXPECT(lf_context_device_info(context, &info), LF_ERR_UNSUPPORTED);
    lf_free(buffer);

    config.strict_gpu = 1;
    EXPECT(lf_context_create(&config, &strict), LF_OK);
    buffer = NULL;
    EXPECT(lf_alloc(strict, 1000, LF_MEMORY_GPU_HOST_VISIBLE, LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffer), LF_ERR_UNSUPPORTED);
    EXPECT_MESSAGE("strict_gpu");
    CHECK(buffer == NULL);
    lf_context_free(strict);
    lf_context_free(context);
}

static void bad_input(lf_context *context, int have_gpu) {
    lf_context_config config;
    lf_context_config_init(&config, sizeof config);
    lf_context *bad = NULL;
    config.gpu_policy = 7;
    EXPECT(lf_context_create(&config, &bad), LF_ERR_INVALID_ARGUMENT);
    EXPECT_MESSAGE("gpu_policy is 7, not an lf_gpu_policy: use LF_GPU_AUTO (0), LF_GPU_REQUIRED (1) or LF_GPU_DISABLED (2)");
    config.gpu_policy = LF_GPU_AUTO;
    config.strict_gpu = 3;
    EXPECT(lf_context_create(&config, &bad), LF_ERR_INVALID_ARGUMENT);
    config.strict_gpu = 0;
    if (have_gpu) {
        config.gpu_device_select = LF_GPU_DEVICE_INDEX;
        config.gpu_device_index = 77;
        EXPECT(lf_context_create(&config, &bad), LF_ERR_NOT_FOUND);
        EXPECT_MESSAGE("Vulkan device index 77");
        config.gpu_device_select = LF_GPU_DEVICE_UUID;
        memset(config.gpu_device_uuid, 0xab, 16);
        EXPECT(lf_context_create(&config, &bad), LF_ERR_NOT_FOUND);
        EXPECT_MESSAGE("abababab-abab");
    }
    CHECK(bad == NULL);

    lf_buffer *buffer = NULL;
    unsigned char byte = 0;
    lf_device_info info = {.struct_size = sizeof info};
    EXPECT(lf_alloc(context, 64, LF_MEMORY_GPU_DEVICE_LOCAL, LF_UNSET, LF_HUGEPAGE_DEFAULT, &buffer), LF_OK);
    EXPECT(lf_alloc(context, 64, LF_MEMORY_GPU_DEVICE_LOCAL, 0, LF_HUGEPAGE_DEFAULT, &buffer), LF_ERR_INVALID_ARGUMENT);
    EXPECT(lf_buffer_write((const lf_buffer *)context, 0, &byte, 1), LF_ERR_BAD_HANDLE);
    EXPECT(lf_context_device_info((const lf_context *)buffer, &info), LF_ERR_BAD_HANDLE);
    EXPECT(lf_buffer_copy(context, buffer, 0, NULL, 0, 1), LF_ERR_NULL_POINTER);
    EXPECT(lf_buffer_write(buffer, 0, NULL, 1), LF_ERR_NULL_POINTER);
    EXPECT(lf_buffer_read(buffer, 60, &byte, 5), LF_ERR_INVALID_ARGUMENT);
    EXPECT(lf_buffer_registrations(buffer, NULL), LF_ERR_NULL_POINTER);
    lf_export export;
    EXPECT(lf_buffer_export(buffer, &export), LF_OK);
    lf_export broken = export;
    broken.fd = dup(export.fd);
    broken.size = export.arena_size + 1;
    lf_buffer *imported = NULL;
    EXPECT(lf_import(context, &broken, &imported), LF_ERR_INVALID_ARGUMENT);
    CHECK(!fd_is_open(broken.fd) && imported == NULL);
    close(export.fd);
    lf_buffer *freed = buffer;
    lf_free(buffer);
    EXPECT(lf_buffer_write(freed, 0, &byte, 1), LF_ERR_BAD_HANDLE);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "importer") == 0) return importer(atoi(argv[2]));
    lf_context *context = NULL;
    EXPECT(lf_context_create(NULL, &context), LF_OK);
    if (context == NULL) return 1;
    const char *why = NULL;
    EXPECT(lf_context_gpu_unavailable_reason(context, &why), LF_OK);
    const char *require = getenv("LF_REQUIRE_VULKAN");
    int have_gpu = why == NULL;
    if (!have_gpu) {
        printf("SKIP the GPU parts: no Vulkan device: %s\n", why);
        if (require != NULL && strcmp(require, "1") == 0) CHECK(!"LF_REQUIRE_VULKAN=1 but no Vulkan device");
    } else {
        report_device(context);
        each_location(context);
        export_to_another_process(context, argv[0]);
        no_leaks_over_many_cycles(context);
    }
    pinned_registrations(context);
    fallback_and_strict();
    bad_input(context, have_gpu);
    lf_context_free(context);

    if (failures != 0) {
        fprintf(stderr, "test_gpu: %d check(s) failed\n", failures);
        return 1;
    }
    printf("test_gpu: all checks passed\n");
    return 0;
}
