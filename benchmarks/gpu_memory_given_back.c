/* Does freed GPU memory go back to the driver? Allocates, writes and frees DEVICE_LOCAL buffers
 * through the C API and prints the GPU's used memory (nvidia-smi) after each step: buffers of
 * their own arena (over a quarter of the 64 MiB arena size), pooled buffers, and lf_context_trim.
 *
 *   cc -O2 benchmarks/gpu_memory_given_back.c -Iinclude -Ltarget/release -llava_flow \
 *      -o gpu_memory_given_back && LD_LIBRARY_PATH=target/release ./gpu_memory_given_back
 *
 * (With the SONAME link that benchmarks/msg_path_cost.c describes.)
 */
#include <lava_flow.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                 \
    do {                                                                            \
        lf_status s_ = (call);                                                      \
        if (s_ != LF_OK) {                                                          \
            fprintf(stderr, "%s: %s\n", #call, lf_last_error_message());            \
            exit(1);                                                                \
        }                                                                           \
    } while (0)

/* The GPU's used memory in MiB as nvidia-smi reports it, or -1 without nvidia-smi. */
static long used_mib(void) {
    FILE *p = popen("nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null", "r");
    long mib = -1;
    if (p != NULL) {
        if (fscanf(p, "%ld", &mib) != 1) mib = -1;
        pclose(p);
    }
    return mib;
}

static void step(const char *what) { printf("  %-58s %6ld MiB used\n", what, used_mib()); }

static void alloc_write(lf_context *ctx, lf_buffer **out, int n, size_t size) {
    void *bytes = malloc(size);
    memset(bytes, 7, size);
    for (int i = 0; i < n; i++) {
        CHECK(lf_alloc(ctx, size, LF_MEMORY_GPU_DEVICE_LOCAL, LF_UNSET, LF_HUGEPAGE_DEFAULT, &out[i]));
        CHECK(lf_buffer_write(out[i], 0, bytes, size));
    }
    free(bytes);
}

int main(void) {
    lf_context *ctx;
    lf_buffer *buffers[64];
    uint64_t given_back = 0;
    printf("GPU memory given back (DEVICE_LOCAL, default 64 MiB arenas)\n");
    step("before the context");
    CHECK(lf_context_create(NULL, &ctx));
    step("context created");
    alloc_write(ctx, buffers, 8, 64u << 20);
    step("8 x 64 MiB allocated and written (arenas of their own)");
    for (int i = 0; i < 8; i++) lf_free(buffers[i]);
    step("... freed");
    alloc_write(ctx, buffers, 64, 4u << 20);
    step("64 x 4 MiB allocated and written (pooled: 4 arenas)");
    for (int i = 0; i < 64; i++) lf_free(buffers[i]);
    step("... freed (one empty arena kept as the spare)");
    CHECK(lf_context_trim(ctx, &given_back));
    printf("  lf_context_trim gave back %llu MiB\n", (unsigned long long)(given_back >> 20));
    step("after lf_context_trim");
    lf_context_free(ctx);
    step("context freed");
    return 0;
}
