/* The Open MPI baseline for lf-bench: an OSU-style ping-pong between two ranks on one host,
 * half round trip p50/p99 per size, so that lava-flow and MPI's shared-memory transport are
 * compared on the same machine on the same day.
 *
 *   mpicc -O2 benchmarks/mpi_pingpong.c -o mpi_pingpong
 *   mpirun -np 2 --bind-to core --map-by core ./mpi_pingpong        (as root: --allow-run-as-root)
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        if (rank == 0) fprintf(stderr, "run with exactly 2 ranks\n");
        MPI_Finalize();
        return 2;
    }
    const int sizes[] = {8, 64, 1024, 65536, 1 << 20};
    const int iters = 50000, warm = 1000;
    char *buf = calloc(1, 1 << 20);
    double *half = malloc(sizeof(double) * iters);
    if (rank == 0) printf("Open MPI ping-pong, half round trip (ns)\n  size       p50       p99\n");
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int n = sizes[s] >= 65536 ? iters / 10 : iters;
        for (int i = 0; i < warm + n; i++) {
            double t0 = MPI_Wtime();
            if (rank == 0) {
                MPI_Send(buf, sizes[s], MPI_CHAR, 1, 0, MPI_COMM_WORLD);
                MPI_Recv(buf, sizes[s], MPI_CHAR, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(buf, sizes[s], MPI_CHAR, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(buf, sizes[s], MPI_CHAR, 0, 0, MPI_COMM_WORLD);
            }
            if (i >= warm) half[i - warm] = (MPI_Wtime() - t0) * 1e9 / 2;
        }
        if (rank == 0) {
            qsort(half, n, sizeof(double), cmp);
            printf("  %7d  %8.0f  %8.0f\n", sizes[s], half[n / 2], half[(long)n * 99 / 100]);
        }
    }
    free(half);
    free(buf);
    MPI_Finalize();
    return 0;
}
