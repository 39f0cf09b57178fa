/* The MPI reference of a simulation: `calls` back-to-back calls of one MPI collective, under
 * SimGrid's SMPI (built by smpicc, run by smpirun with --cfg=smpi/<collective>:<algorithm>),
 * on buffers SMPI shares between ranks (no memory per rank). Sizes are rxelab's: per peer for
 * alltoall(v), per rank for allgather, the vector for allreduce and bcast, per block for
 * reduce_scatter (bytes; the reductions add float32). Prints "time <s>": from the first
 * rank's start to the last rank's end. */
#include <mpi.h>
#include <smpi/smpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char** argv)
{
  MPI_Init(&argc, &argv);
  int p, r;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  if (argc != 4 || atol(argv[2]) < 0 || (double)atol(argv[2]) * p > 2147483647.0) {
    if (r == 0)
      fprintf(stderr, "usage: mpi_bench COLLECTIVE BYTES CALLS (BYTES x ranks below 2 GiB)\n");
    MPI_Finalize();
    return 2;
  }
  const char* op = argv[1];
  long size = atol(argv[2]);
  int calls = atoi(argv[3]);
  size_t total = (size_t)size * (size_t)p;
  char* send = SMPI_SHARED_MALLOC(total > 0 ? total : 1);
  char* recv = SMPI_SHARED_MALLOC(total > 0 ? total : 1);
  int* counts = malloc(sizeof(int) * p);
  int* displs = malloc(sizeof(int) * p);
  for (int i = 0; i < p; i++) {
    counts[i] = (int)size;
    displs[i] = (int)(size * i);
  }
  int known = 1;
  MPI_Barrier(MPI_COMM_WORLD);
  double start = MPI_Wtime();
  for (int c = 0; c < calls && known; c++) {
    if (!strcmp(op, "alltoall"))
      MPI_Alltoall(send, (int)size, MPI_BYTE, recv, (int)size, MPI_BYTE, MPI_COMM_WORLD);
    else if (!strcmp(op, "alltoallv"))
      MPI_Alltoallv(send, counts, displs, MPI_BYTE, recv, counts, displs, MPI_BYTE, MPI_COMM_WORLD);
    else if (!strcmp(op, "allgather"))
      MPI_Allgather(send, (int)size, MPI_BYTE, recv, (int)size, MPI_BYTE, MPI_COMM_WORLD);
    else if (!strcmp(op, "allreduce"))
      MPI_Allreduce(send, recv, (int)(size / 4), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    else if (!strcmp(op, "reduce_scatter"))
      MPI_Reduce_scatter_block(send, recv, (int)(size / 4), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    else if (!strcmp(op, "bcast"))
      MPI_Bcast(send, (int)size, MPI_BYTE, 0, MPI_COMM_WORLD);
    else
      known = 0;
  }
  double end = MPI_Wtime(), first, last;
  MPI_Reduce(&start, &first, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
  MPI_Reduce(&end, &last, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (r == 0) {
    if (known)
      printf("time %.9g\n", last - first);
    else
      fprintf(stderr, "mpi_bench: unknown collective %s\n", op);
  }
  SMPI_SHARED_FREE(send);
  SMPI_SHARED_FREE(recv);
  free(counts);
  free(displs);
  MPI_Finalize();
  return known ? 0 : 2;
}
