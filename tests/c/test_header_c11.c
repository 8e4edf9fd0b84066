/* The header compiles as strict C11 (-std=c11 -Wall -Wextra -Werror -pedantic, set in
 * CMakeLists.txt), twice included, its version macros agree with the library, and its feature
 * macros with the build (LF_EXPECT_MPI, from CMake). */
#include <lava_flow.h>
#include <lava_flow.h>

#if !defined(LAVA_FLOW_FEATURE_VULKAN) || !defined(LAVA_FLOW_FEATURE_MPI)
#error "lava_flow.h did not define the LAVA_FLOW_FEATURE_* macros (is lava_flow_features.h on the include path?)"
#endif
#if LAVA_FLOW_FEATURE_MPI != LF_EXPECT_MPI
#error "LAVA_FLOW_FEATURE_MPI disagrees with the features this build has"
#endif
#if LAVA_FLOW_FEATURE_VULKAN != 1
#error "LAVA_FLOW_FEATURE_VULKAN should be 1: the CMake build always has Vulkan"
#endif

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
