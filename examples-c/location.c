/* Prints where this process runs, and its scope to processes described in a config file.
 *
 *   lf_location_c [config.json] [process-name ...]
 *
 * Without arguments only this process's location and its scope to itself are printed. */
#include <stdio.h>
#include <string.h>

#include <lava_flow.h>

static int fail(const char *what, lf_status status) {
    fprintf(stderr, "%s failed: %s\n  %s\n", what, lf_status_str(status), lf_last_error_message());
    return 1;
}

static void print_location(const char *label, const lf_location *loc) {
    const char *host = NULL;
    int64_t node = LF_UNSET, device = LF_UNSET;
    lf_location_hostname(loc, &host);
    lf_location_node_id(loc, &node);
    lf_location_device_id(loc, &device);
    printf("%-10s host=%s", label, host);
    if (node != LF_UNSET) printf(" numa-node=%lld", (long long)node);
    if (device != LF_UNSET) printf(" device=%lld", (long long)device);
    printf("\n");
}

int main(int argc, char **argv) {
    if (strcmp(lf_version(), "") == 0) return 1;
    printf("lava-flow %s (header %d.%d.%d)\n", lf_version(), LAVA_FLOW_VERSION_MAJOR,
           LAVA_FLOW_VERSION_MINOR, LAVA_FLOW_VERSION_PATCH);

    lf_location *me = NULL;
    lf_status st = lf_location_detect(&me);
    if (st != LF_OK) return fail("lf_location_detect", st);
    print_location("this", me);

    lf_scope scope = 0;
    st = lf_scope_detect(me, me, &scope);
    if (st != LF_OK) return fail("lf_scope_detect", st);
    printf("scope this -> this: %s\n", lf_scope_str(scope));

    int rc = 0;
    for (int i = 2; i < argc; i++) {
        lf_location *peer = NULL;
        st = lf_location_from_config(argv[1], argv[i], &peer);
        if (st != LF_OK) {
            rc = fail("lf_location_from_config", st);
            continue;
        }
        print_location(argv[i], peer);
        st = lf_scope_detect(me, peer, &scope);
        if (st != LF_OK) {
            rc = fail("lf_scope_detect", st);
        } else {
            printf("scope this -> %s: %s\n", argv[i], lf_scope_str(scope));
        }
        lf_location_free(peer);
    }
    lf_location_free(me);
    return rc;
}
