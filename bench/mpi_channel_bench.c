/*
 * mpi_channel_bench: the MPI path of gpuipc_channel_open_mpi next to plain
 * MPI_Send / MPI_Recv of the same buffers, 4 KiB to 256 MiB, HOST memory
 * and (with a GPU on both ranks) device memory. Two ranks on two
 * "machines":
 *   mpirun -np 2 --bind-to none sh -c \
 *     'GPUIPC_NODE_ID=$OMPI_COMM_WORLD_RANK exec build/bench/mpi_channel_bench'
 * Rank 0 sends ITERS messages of one buffer (after WARMUP), rank 1 takes
 * each with gpuipc_mpi_recv_into into a buffer of the same kind; the time
 * runs from a barrier to rank 1's last byte (a 1-byte reply). Plain MPI
 * takes device pointers only when MPIX_Query_cuda_support() says so.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpuipc_mpi.h"

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#define WARMUP 2

static int iters_for(size_t n)
{
  size_t i = ((size_t)1 << 30) / n;
  return i < 8 ? 8 : i > 200 ? 200 : (int)i;
}

static void die(const char *what, int rc)
{
  fprintf(stderr, "%s: %s (%s)\n", what, gpuipc_err_name(rc),
          gpuipc_mpi_last_error());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

static double run_channel(gpuipc_mpi_channel_t *ch, int rank,
                          gpuipc_buf_t *buf, size_t n, int iters)
{
  int64_t shape = (int64_t)n;
  int gpu = gpuipc_buf_kind(buf) != GPUIPC_KIND_HOST;
  gpuipc_tensor_t t = {.dl = {.data = gpuipc_buf_ptr(buf),
                              .device = {gpu ? GPUIPC_DL_CUDA : GPUIPC_DL_CPU,
                                         gpu ? gpuipc_buf_device(buf) : 0},
                              .ndim = 1,
                              .dtype = {GPUIPC_DL_UINT, 8, 1},
                              .shape = &shape},
                       .buf = buf};
  char one = 0;
  double t0 = 0;
  for (int k = 0; k < WARMUP + iters; k++) {
    if (k == WARMUP) {
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
    }
    int rc = rank == 0 ? gpuipc_mpi_send(ch, &t, NULL, 0, NULL)
                       : gpuipc_mpi_recv_into(ch, &t, NULL, -1);
    if (rc != 0)
      die(rank == 0 ? "gpuipc_mpi_send" : "gpuipc_mpi_recv_into", rc);
  }
  if (rank == 1)
    MPI_Send(&one, 1, MPI_CHAR, 0, 99, MPI_COMM_WORLD);
  else
    MPI_Recv(&one, 1, MPI_CHAR, 1, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  return MPI_Wtime() - t0;
}

static double run_plain(int rank, void *p, size_t n, int iters)
{
  char one = 0;
  double t0 = 0;
  for (int k = 0; k < WARMUP + iters; k++) {
    if (k == WARMUP) {
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
    }
    for (size_t off = 0; off < n; off += (size_t)1 << 30) {
      int len = (int)(n - off < ((size_t)1 << 30) ? n - off : (size_t)1 << 30);
      if (rank == 0)
        MPI_Send((char *)p + off, len, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
      else
        MPI_Recv((char *)p + off, len, MPI_BYTE, 0, 1, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    }
  }
  if (rank == 1)
    MPI_Send(&one, 1, MPI_CHAR, 0, 99, MPI_COMM_WORLD);
  else
    MPI_Recv(&one, 1, MPI_CHAR, 1, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  return MPI_Wtime() - t0;
}

int main(int argc, char **argv)
{
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) {
    if (rank == 0)
      fprintf(stderr, "run with exactly 2 ranks\n");
    MPI_Finalize();
    return 2;
  }
  gpuipc_channel_opts_t opts = {.size = sizeof(opts), .depth = 16};
  gpuipc_mpi_channel_t *ch;
  int rc = gpuipc_channel_open_mpi(MPI_COMM_WORLD, 1 - rank, 1, &opts, &ch);
  if (rc != 0)
    die("gpuipc_channel_open_mpi", rc);
  int aware = 0;
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  aware = MPIX_Query_cuda_support() == 1;
#endif
  int gpus = gpuipc_driver_status(NULL) == 0 ? gpuipc_device_count() : 0, all;
  MPI_Allreduce(&gpus, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (rank == 0) {
    printf("# path: %s; MPI CUDA-aware: %s; GPUs on every rank: %d\n",
           gpuipc_mpi_channel_shm(ch) ? "shared memory (set GPUIPC_NODE_ID "
                                        "per rank for the MPI path)"
                                      : "MPI",
           aware ? "yes" : "no", all);
    printf("%-6s %10s %6s %14s %14s\n", "memory", "bytes", "iters",
           "channel GB/s", "MPI_Send GB/s");
  }
  for (int mem = 0; mem < (all > 0 ? 2 : 1); mem++) {
    for (size_t n = 4096; n <= ((size_t)256 << 20); n *= 4) {
      gpuipc_buf_t *buf;
      rc = gpuipc_buf_alloc(n, mem ? GPUIPC_KIND_AUTO : GPUIPC_KIND_HOST,
                            mem ? 0 : -1, 0, &buf);
      if (rc != 0)
        die("gpuipc_buf_alloc", rc);
      if (!mem)
        memset(gpuipc_buf_ptr(buf), rank + 1, n);
      int iters = iters_for(n);
      double tc = run_channel(ch, rank, buf, n, iters);
      double tp = mem && !aware ? -1 : run_plain(rank, gpuipc_buf_ptr(buf),
                                                 n, iters);
      if (rank == 0) {
        double gb = (double)n * iters / 1e9;
        if (tp < 0)
          printf("%-6s %10zu %6d %14.2f %14s\n", mem ? "device" : "host", n,
                 iters, gb / tc, "n/a (not CUDA-aware)");
        else
          printf("%-6s %10zu %6d %14.2f %14.2f\n", mem ? "device" : "host",
                 n, iters, gb / tc, gb / tp);
      }
      /* Rank 0's last sends may still be in flight: released first. */
      MPI_Barrier(MPI_COMM_WORLD);
      gpuipc_mpi_channel_progress(ch);
      gpuipc_buf_release(buf);
    }
  }
  gpuipc_mpi_channel_close(ch);
  MPI_Finalize();
  return 0;
}
