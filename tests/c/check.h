/* What the C tests share: CHECK/EXPECT macros that count failures (and print the last error
 * message), and descriptor helpers for the leak checks. Each test defines
 * `static int failures` before including this file. */
#ifndef LF_TEST_CHECK_H
#define LF_TEST_CHECK_H

#include <lava_flow.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>

#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__, __LINE__, \
                    #cond, lf_last_error_message());                                           \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)

#define EXPECT(call, status)                                                                   \
    do {                                                                                       \
        lf_status got_ = (call);                                                               \
        if (got_ != (status)) {                                                                \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s (last error: %s)\n", __FILE__, \
                    __LINE__, #call, lf_status_str(got_), lf_status_str(status),               \
                    lf_last_error_message());                                                  \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)

#define EXPECT_MESSAGE(text) CHECK(strstr(lf_last_error_message(), (text)) != NULL)

static inline int open_fd_count(void) {
    DIR *dir = opendir("/proc/self/fd");
    int count = 0;
    if (dir == NULL) return -1;
    while (readdir(dir) != NULL) count++;
    closedir(dir);
    return count;
}

static inline int fd_is_open(int fd) { return fcntl(fd, F_GETFD) >= 0 || errno != EBADF; }

#endif
