#include <stdio.h>
#include <lava_flow.h>

int main(void) {
    printf("lava-flow %s\n", lf_version());
    return 0;
}
