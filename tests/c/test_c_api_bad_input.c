/* Feeds the C API NULLs, bad paths, bad values and bad handles, and checks that each call
 * returns the right status with a message that names the problem, and never crashes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lava_flow.h>

static int failures = 0;

/* Checks the status and that the thread's last error message contains `needle`. */
static void expect(const char *call, lf_status got, lf_status want, const char *needle) {
    const char *msg = lf_last_error_message();
    if (got != want) {
        fprintf(stderr, "FAIL %s: got %s, want %s (message: %s)\n", call, lf_status_str(got),
                lf_status_str(want), msg);
        failures++;
    } else if (needle && !strstr(msg, needle)) {
        fprintf(stderr, "FAIL %s: message \"%s\" lacks \"%s\"\n", call, msg, needle);
        failures++;
    } else {
        printf("ok   %-48s %s\n", call, want == LF_OK ? "" : msg);
    }
}

#define EXPECT(call, want, needle) expect(#call, (call), (want), (needle))

static const char *write_file(const char *text) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/lf-bad-input-%d.json", (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f) { perror("fopen"); exit(2); }
    fputs(text, f);
    fclose(f);
    return path;
}

int main(void) {
    lf_location *loc = NULL, *other = NULL;
    const char *host = NULL;
    int64_t id = 0;
    lf_scope scope = 0;

    /* NULL pointers, in every position. */
    EXPECT(lf_location_detect(NULL), LF_ERR_NULL_POINTER, "argument `out` is NULL");
    EXPECT(lf_location_new(NULL, LF_UNSET, LF_UNSET, &loc), LF_ERR_NULL_POINTER, "`hostname`");
    EXPECT(lf_location_from_config(NULL, "a", &loc), LF_ERR_NULL_POINTER, "`path`");
    EXPECT(lf_location_from_config("/x.json", NULL, &loc), LF_ERR_NULL_POINTER, "`process_name`");
    EXPECT(lf_location_hostname(NULL, &host), LF_ERR_NULL_POINTER, "`location`");
    EXPECT(lf_location_node_id(NULL, &id), LF_ERR_NULL_POINTER, "`location`");
    EXPECT(lf_scope_detect(NULL, NULL, &scope), LF_ERR_NULL_POINTER, "`mine`");
    lf_location_free(NULL); /* accepted, no effect */

    /* Bad values. */
    EXPECT(lf_location_new("", LF_UNSET, LF_UNSET, &loc), LF_ERR_INVALID_ARGUMENT, "hostname is empty");
    EXPECT(lf_location_new("a/b", LF_UNSET, LF_UNSET, &loc), LF_ERR_INVALID_ARGUMENT, "contains '/'");
    EXPECT(lf_location_new("a..b", LF_UNSET, LF_UNSET, &loc), LF_ERR_INVALID_ARGUMENT, "empty label");
    EXPECT(lf_location_new("-a", LF_UNSET, LF_UNSET, &loc), LF_ERR_INVALID_ARGUMENT, "starts or ends with '-'");
    EXPECT(lf_location_new("h", -7, LF_UNSET, &loc), LF_ERR_INVALID_ARGUMENT, "`node_id` is -7");
    EXPECT(lf_location_new("h", 0, 1LL << 40, &loc), LF_ERR_INVALID_ARGUMENT, "`device_id`");
    EXPECT(lf_location_from_config("/x.json", "bad name!", &loc), LF_ERR_INVALID_ARGUMENT, "process name");
    if (loc != NULL) { fprintf(stderr, "FAIL: out written on failure\n"); failures++; }

    /* Bad config files: each names the file and the problem. */
    EXPECT(lf_location_from_config("/nonexistent/lf.json", "a", &loc), LF_ERR_CONFIG,
           "config file /nonexistent/lf.json: cannot read it");
    EXPECT(lf_location_from_config(write_file("{\"processes\": ["), "a", &loc), LF_ERR_CONFIG, "not valid JSON");
    EXPECT(lf_location_from_config(write_file("{\"processes\": [{\"name\": \"a\"}]}"), "a", &loc),
           LF_ERR_CONFIG, "missing field \"hostname\"");
    EXPECT(lf_location_from_config(write_file("{\"processes\": [{\"name\": \"a\", \"hostname\": 3}]}"), "a", &loc),
           LF_ERR_CONFIG, "hostname must be a string");
    EXPECT(lf_location_from_config(write_file("{\"processes\": [{\"name\": \"b\", \"hostname\": \"h\"}]}"), "a", &loc),
           LF_ERR_NOT_FOUND, "describes: b");
    remove(write_file(""));

    /* Bad handles: freed, wrong type, never created. */
    EXPECT(lf_location_new("h", LF_UNSET, LF_UNSET, &loc), LF_OK, NULL);
    EXPECT(lf_location_new("g", LF_UNSET, LF_UNSET, &other), LF_OK, NULL);
    EXPECT(lf_scope_detect(loc, other, &scope), LF_OK, NULL);
    if (scope != LF_SCOPE_REMOTE) { fprintf(stderr, "FAIL: h vs g is not remote\n"); failures++; }
    lf_location_free(other);
    EXPECT(lf_scope_detect(loc, other, &scope), LF_ERR_BAD_HANDLE, "`peer` is not a live lf_location");
    lf_location_free(other); /* double free: ignored, reported */
    if (!strstr(lf_last_error_message(), "lf_location_free")) {
        fprintf(stderr, "FAIL: double free not reported\n");
        failures++;
    }
    int not_a_handle = 42;
    EXPECT(lf_location_hostname((const lf_location *)&not_a_handle, &host), LF_ERR_BAD_HANDLE, "not a live");
    EXPECT(lf_location_node_id((const lf_location *)(uintptr_t)0x10, &id), LF_ERR_BAD_HANDLE, "not a live");
    lf_location_free(loc);

    /* Absurd sizes are refused when they are set, naming the field: a GPU arena beyond any
     * GPU, a channel pool whose rounding would wrap around (on either end, without waiting
     * for a peer). */
    lf_context *context = NULL;
    lf_context_config context_config;
    EXPECT(lf_context_config_init(&context_config, sizeof context_config), LF_OK, NULL);
    context_config.gpu_policy = LF_GPU_DISABLED;
    context_config.gpu_arena_size = 1ull << 63;
    EXPECT(lf_context_create(&context_config, &context), LF_ERR_INVALID_ARGUMENT, "gpu_arena_size 9223372036854775808");
    context_config.gpu_arena_size = 0;
    EXPECT(lf_context_create(&context_config, &context), LF_OK, NULL);
    EXPECT(lf_location_new("localhost", LF_UNSET, LF_UNSET, &loc), LF_OK, NULL);
    lf_channel_config channel_config;
    EXPECT(lf_channel_config_init(&channel_config, sizeof channel_config), LF_OK, NULL);
    channel_config.pool_size = UINT64_MAX;
    lf_channel *channel = NULL;
    EXPECT(lf_channel_create(context, "absurd-pool", LF_ROLE_PRODUCER, loc, loc, &channel_config, &channel),
           LF_ERR_INVALID_ARGUMENT, "pool_size 18446744073709551615");
    EXPECT(lf_channel_create(context, "absurd-pool", LF_ROLE_CONSUMER, loc, loc, &channel_config, &channel),
           LF_ERR_INVALID_ARGUMENT, "pool_size 18446744073709551615");
    if (channel != NULL) { fprintf(stderr, "FAIL: a channel was made with an absurd pool\n"); failures++; }
    lf_location_free(loc);
    lf_context_free(context);
    context = NULL;

    /* Growable structs: `struct_size` says how much of the struct the caller's header has. */
    lf_context_config forgot = {0};
    forgot.gpu_policy = LF_GPU_DISABLED;
    EXPECT(lf_context_create(&forgot, &context), LF_ERR_INVALID_ARGUMENT, "struct_size is 0 but other fields are set");
    lf_context_config sized;
    EXPECT(lf_context_config_init(&sized, sizeof sized), LF_OK, NULL);
    if (sized.struct_size != sizeof sized || sized.gpu_policy != LF_GPU_AUTO) {
        fprintf(stderr, "FAIL: lf_context_config_init did not give the defaults and the size\n");
        failures++;
    }
    sized.struct_size = 12;
    EXPECT(lf_context_create(&sized, &context), LF_ERR_INVALID_ARGUMENT,
           "lf_context_config.struct_size is 12, not a size of lf_context_config: set it to sizeof(lf_context_config)");
    EXPECT(lf_context_config_init(&sized, 4), LF_ERR_INVALID_ARGUMENT, "struct_size is 4");
    /* A newer header's struct: this library's, then a setting it does not know. */
    struct {
        lf_context_config config;
        uint64_t newer_setting;
    } newer;
    memset(&newer, 0xff, sizeof newer);
    EXPECT(lf_context_config_init(&newer.config, sizeof newer), LF_OK, NULL);
    if (newer.newer_setting != 0 || newer.config.struct_size != sizeof newer) {
        fprintf(stderr, "FAIL: lf_context_config_init left a newer header's field unset\n");
        failures++;
    }
    newer.config.gpu_policy = LF_GPU_DISABLED;
    EXPECT(lf_context_create(&newer.config, &context), LF_OK, NULL); /* the new setting is 0 */
    lf_context *refused = NULL;
    newer.newer_setting = 1;
    EXPECT(lf_context_create(&newer.config, &refused), LF_ERR_UNSUPPORTED, "the header is newer than the library");
    lf_channel_config small;
    EXPECT(lf_channel_config_init(&small, 8), LF_ERR_INVALID_ARGUMENT, "lf_channel_config.struct_size is 8");
    struct {
        lf_channel_config config;
        uint64_t newer_setting;
    } newer_channel;
    memset(&newer_channel, 0xff, sizeof newer_channel);
    EXPECT(lf_channel_config_init(&newer_channel.config, sizeof newer_channel), LF_OK, NULL);
    if (newer_channel.newer_setting != 0 || newer_channel.config.capacity != 256 ||
        newer_channel.config.wait_strategy != LF_WAIT_SPIN_THEN_BLOCK) {
        fprintf(stderr, "FAIL: lf_channel_config_init did not fill a newer header's struct\n");
        failures++;
    }
    /* An output struct of a size that is not one of its sizes is refused, and left untouched. */
    lf_device_info info = {.struct_size = 100, .index = 9};
    EXPECT(lf_context_device_info(context, &info), LF_ERR_INVALID_ARGUMENT, "lf_device_info.struct_size is 100");
    if (info.index != 9) { fprintf(stderr, "FAIL: lf_device_info written on failure\n"); failures++; }
    info.struct_size = sizeof info;
    EXPECT(lf_context_device_info(context, &info), LF_ERR_UNSUPPORTED, "no Vulkan device");
    lf_context_free(context);

    /* Enums from C are checked, the message naming the valid values. */
    EXPECT(lf_set_log_level((lf_log_level)17), LF_ERR_INVALID_ARGUMENT,
           "level is 17, not an lf_log_level: use LF_LOG_OFF (0), LF_LOG_ERROR (1)");

    /* Unknown enum values are safe to describe. */
    if (strcmp(lf_status_str(12345), "unknown lf_status value") != 0 || strcmp(lf_scope_str(99), "unknown") != 0) {
        fprintf(stderr, "FAIL: unknown values not described as unknown\n");
        failures++;
    }

    printf("%d failure(s)\n", failures);
    return failures == 0 ? 0 : 1;
}
