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
#include <unistd.h>

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

/* The descriptors this process holds, less those of device nodes (/dev/...): lava-flow's are
 * memory files, sockets, pidfds, eventfds and epoll sets; a GPU driver keeps device files of its
 * own open after first use (NVIDIA's does), which are not lava-flow's to close. */
static inline int open_fd_count(void) {
    DIR *dir = opendir("/proc/self/fd");
    int count = 0;
    if (dir == NULL) return -1;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        char path[320], target[256];
        snprintf(path, sizeof path, "/proc/self/fd/%s", entry->d_name);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n > 0) {
            target[n] = '\0';
            if (strncmp(target, "/dev/", 5) == 0) continue;
        }
        count++;
    }
    closedir(dir);
    return count;
}

static inline int fd_is_open(int fd) { return fcntl(fd, F_GETFD) >= 0 || errno != EBADF; }

/* lf_buffer_describe says what lf_buffer_export says of `buffer`, with fd -1, and opens no
 * descriptor however often it is called. */
static inline void check_describe(const lf_buffer *buffer) {
    lf_export exported, described;
    memset(&described, 0xab, sizeof described);
    EXPECT(lf_buffer_export(buffer, &exported), LF_OK);
    int before = open_fd_count();
    for (int i = 0; i < 100; i++) EXPECT(lf_buffer_describe(buffer, &described), LF_OK);
    CHECK(open_fd_count() == before);
    CHECK(described.fd == -1);
    described.fd = exported.fd;
    CHECK(memcmp(&described, &exported, sizeof exported) == 0);
    close(exported.fd);
}

#endif
