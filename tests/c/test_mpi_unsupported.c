/* Built without the mpi feature: the lf_mpi functions exist, and joining says how to get MPI. */
#define _GNU_SOURCE /* readlink, for check.h's descriptor count */
#include <stdio.h>
#include <string.h>

static int failures = 0;
#include "check.h"

int main(void) {
    lf_mpi *mpi = NULL;
    EXPECT(lf_mpi_join(LF_MPI_COMM_WORLD, NULL, &mpi), LF_ERR_UNSUPPORTED);
    EXPECT_MESSAGE("`mpi` feature");
    CHECK(mpi == NULL);
    EXPECT(lf_mpi_join(LF_MPI_COMM_WORLD, NULL, NULL), LF_ERR_NULL_POINTER);
    int32_t size = 0;
    EXPECT(lf_mpi_size(NULL, &size), LF_ERR_NULL_POINTER);
    lf_mpi_free(NULL);
    printf("test_mpi_unsupported: %d failure(s)\n", failures);
    return failures != 0;
}
