/* The header compiles as strict C11 (-std=c11 -Wall -Wextra -Werror -pedantic, set in
 * CMakeLists.txt), twice included, and its version macros agree with the library. */
#include <lava_flow.h>
#include <lava_flow.h>

#include <stdio.h>
#include <string.h>

int main(void) {
    char expected[32];
    snprintf(expected, sizeof expected, "%d.%d.%d", LAVA_FLOW_VERSION_MAJOR, LAVA_FLOW_VERSION_MINOR,
             LAVA_FLOW_VERSION_PATCH);
    if (strcmp(expected, lf_version()) != 0) {
        fprintf(stderr, "header says %s, library says %s\n", expected, lf_version());
        return 1;
    }
    lf_status status = LF_OK;
    printf("header %s == library %s; %s\n", expected, lf_version(), lf_status_str(status));
    return 0;
}
