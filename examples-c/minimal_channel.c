/* A complete minimal channel in C: run `minimal_channel consumer` and
 * `minimal_channel producer` as two processes on one host (either may start first). */
#include <lava_flow.h>
#include <stdio.h>
#include <string.h>

static int fail(const char *what, lf_status st) {
    fprintf(stderr, "%s: %s: %s\n", what, lf_status_str(st), lf_last_error_message());
    return 1;
}

int main(int argc, char **argv) {
    int producer = argc > 1 && strcmp(argv[1], "producer") == 0;
    lf_context *ctx = NULL;
    lf_location *here = NULL;
    lf_channel *ch = NULL;
    lf_status st = lf_context_create(NULL, &ctx);              /* one per process */
    if (st != LF_OK) return fail("lf_context_create", st);
    st = lf_location_detect(&here);                            /* both processes on this host */
    if (st != LF_OK) return fail("lf_location_detect", st);
    st = lf_channel_create(ctx, "minimal", producer ? LF_ROLE_PRODUCER : LF_ROLE_CONSUMER,
                           here, here, NULL, &ch);             /* NULL: the default config */
    if (st != LF_OK) return fail("lf_channel_create", st);

    for (int i = 0; i < 3 && st == LF_OK; i++) {
        if (producer) {
            char text[32];
            int len = snprintf(text, sizeof text, "message %d", i);
            st = lf_send(ch, text, (size_t)len, -1, NULL);     /* copied into shared memory */
        } else {
            lf_message m;
            st = lf_recv(ch, -1, &m);                          /* -1: no timeout */
            if (st == LF_OK) {
                printf("received \"%.*s\"\n", (int)m.len, (const char *)m.data);
                st = lf_release(ch, &m);                       /* a view into shared memory */
            }
        }
    }
    if (st != LF_OK) return fail(producer ? "lf_send" : "lf_recv", st);
    lf_channel_free(ch);
    lf_location_free(here);
    lf_context_free(ctx);
    return 0;
}
