/*
 * mpi_channel_bench: the MPI path of gpuipc_mpi_channel_open next to what a
 * user would write by hand for the same buffers, 4 KiB to 256 MiB, HOST
 * memory and (with a GPU on both ranks) device memory. Two ranks on two
 * "machines":
 *   mpirun -np 2 --bind-to none sh -c \
 *     'GPUIPC_NODE_ID=$OMPI_COMM_WORLD_RANK exec build/bench/mpi_channel_bench'
 * An argument sets the channel's depth (default 16, at most WARMUP): how
 * many messages the sender may have in flight, so how far its staging
 * copies run ahead of the receiver.
 * Rank 0 sends ITERS messages of one buffer (after WARMUP), rank 1 takes
 * each with gpuipc_mpi_channel_recv_into into a buffer of the same kind; the time
 * runs from a barrier to rank 1's last byte (a 1-byte reply). The baseline:
 *  - HOST memory, or device memory when MPIX_Query_cuda_support() says MPI
 *    takes device pointers: MPI_Send / MPI_Recv of the buffers themselves;
 *  - device memory otherwise: the whole buffer copied to pinned host memory
 *    (gpuipc_memcpy), MPI_Send; MPI_Recv into pinned host memory, copied to
 *    the device; one step after the other, as one writes it by hand.
 * "ratio" is channel / baseline bandwidth. Rank 1's bytes are checked
 * against the pattern rank 0 sent after each run (both), so that no speed
 * is reported for wrong bytes.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpuipc_mpi.h"

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

/* Messages before the clock starts: the channel's depth, so that every
 * message slot has its staging buffer (pinned once, then reused). */
#define WARMUP 16

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

/* The end of a timed run: rank 1's last byte is in, told to rank 0 by a
 * one-byte reply. Returns the seconds since @t0. */
static double run_end(int rank, double t0)
{
  char one = 0;
  if (rank == 1)
    MPI_Send(&one, 1, MPI_CHAR, 0, 99, MPI_COMM_WORLD);
  else
    MPI_Recv(&one, 1, MPI_CHAR, 1, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  return MPI_Wtime() - t0;
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
  double t0 = 0;
  for (int k = 0; k < WARMUP + iters; k++) {
    if (k == WARMUP) {
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
    }
    int rc = rank == 0 ? gpuipc_mpi_channel_send(ch, &t, NULL, 0, NULL)
                       : gpuipc_mpi_channel_recv_into(ch, &t, NULL, -1);
    if (rc != 0)
      die(rank == 0 ? "gpuipc_mpi_channel_send" : "gpuipc_mpi_channel_recv_into", rc);
  }
  return run_end(rank, t0);
}

/* The baseline: @p (device @dev, or host when < 0) by MPI_Send /
 * MPI_Recv, through @host (pinned) when @staged. */
static double run_plain(int rank, void *p, int dev, void *host, int staged,
                        size_t n, int iters)
{
  const size_t big = (size_t)1 << 30;
  void *wire = staged ? host : p;
  double t0 = 0;
  for (int k = 0; k < WARMUP + iters; k++) {
    if (k == WARMUP) {
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
    }
    int rc = 0;
    if (staged && rank == 0)
      rc = gpuipc_memcpy(host, p, n, dev, NULL);
    if (rc != 0)
      die("gpuipc_memcpy", rc);
    for (size_t off = 0; off < n; off += big) {
      int len = (int)(n - off < big ? n - off : big);
      if (rank == 0)
        MPI_Send((char *)wire + off, len, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
      else
        MPI_Recv((char *)wire + off, len, MPI_BYTE, 0, 1, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    }
    if (staged && rank == 1)
      rc = gpuipc_memcpy(p, host, n, dev, NULL);
    if (rc != 0)
      die("gpuipc_memcpy", rc);
  }
  return run_end(rank, t0);
}

/* Byte @i of the pattern for @n-byte messages: no period a chunk size
 * (a power of two) could hide a misplaced chunk behind. */
static uint8_t pattern(size_t n, size_t i)
{
  uint64_t x = ((uint64_t)i + n) * 0x9E3779B97F4A7C15ull;
  return (uint8_t)(x >> 56);
}

/* Rank 0: @buf gets the pattern; rank 1: zeros. Through @host (pinned,
 * @n bytes) for device memory. */
static void fill(int rank, gpuipc_buf_t *buf, uint8_t *host, size_t n)
{
  int gpu = gpuipc_buf_kind(buf) != GPUIPC_KIND_HOST;
  uint8_t *at = gpu ? host : gpuipc_buf_ptr(buf);
  for (size_t i = 0; i < n; i++)
    at[i] = rank == 0 ? pattern(n, i) : 0;
  int rc = gpu ? gpuipc_memcpy(gpuipc_buf_ptr(buf), host, n,
                               gpuipc_buf_device(buf), NULL)
               : 0;
  if (rc != 0)
    die("gpuipc_memcpy", rc);
}

/* Rank 1: @buf must hold the pattern. Rank 0 learns the verdict: how
 * many bytes are wrong, the first and the last. */
static void check(int rank, gpuipc_buf_t *buf, uint8_t *host, size_t n,
                  const char *what)
{
  long bad[3] = {0, -1, -1};
  if (rank == 1) {
    int gpu = gpuipc_buf_kind(buf) != GPUIPC_KIND_HOST;
    const uint8_t *at = gpuipc_buf_ptr(buf);
    if (gpu) {
      int rc = gpuipc_memcpy(host, gpuipc_buf_ptr(buf), n,
                             gpuipc_buf_device(buf), NULL);
      if (rc != 0)
        die("gpuipc_memcpy", rc);
      at = host;
    }
    for (size_t i = 0; i < n; i++)
      if (at[i] != pattern(n, i)) {
        if (bad[0]++ == 0)
          bad[1] = (long)i;
        bad[2] = (long)i;
      }
  }
  MPI_Bcast(bad, 3, MPI_LONG, 1, MPI_COMM_WORLD);
  if (bad[0] > 0) {
    if (rank == 0)
      fprintf(stderr, "%s, %zu bytes: %ld bytes are wrong on the receiver, "
              "%ld to %ld\n", what, n, bad[0], bad[1], bad[2]);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
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
  /* Each rank on a GPU of its own where there are two (as on two
   * machines): two processes copying on one GPU take turns on it. */
  int gpus = gpuipc_driver_status(NULL) == 0 ? gpuipc_device_count() : 0, all;
  MPI_Allreduce(&gpus, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  int gpu = all > 0 ? rank % all : -1;
  int depth = argc > 1 ? atoi(argv[1]) : 16;
  if (depth < 1 || depth > WARMUP) {
    if (rank == 0)
      fprintf(stderr, "depth \"%s\": 1 to %d\n", argv[1], WARMUP);
    MPI_Finalize();
    return 2;
  }
  gpuipc_channel_opts_t opts = GPUIPC_CHANNEL_OPTS_INIT;
  opts.depth = (uint32_t)depth;
  opts.device = gpu;
  opts.device_set = gpu >= 0;
  gpuipc_mpi_channel_t *ch;
  int rc = gpuipc_mpi_channel_open(MPI_COMM_WORLD, 1 - rank, 1, &opts, &ch);
  if (rc != 0)
    die("gpuipc_mpi_channel_open", rc);
  int aware = 0;
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  aware = MPIX_Query_cuda_support() == 1;
#endif
  if (rank == 0) {
    printf("# path: %s; MPI CUDA-aware: %s; GPUs on every rank: %d; "
           "depth %d\n",
           gpuipc_mpi_channel_shm(ch) ? "shared memory (set GPUIPC_NODE_ID "
                                        "per rank for the MPI path)"
                                      : "MPI",
           aware ? "yes" : "no", all, depth);
    printf("%-6s %10s %6s %13s %14s %6s  %s\n", "memory", "bytes",
           "iters", "channel GB/s", "baseline GB/s", "ratio", "baseline");
  }
  for (int mem = 0; mem < (all > 0 ? 2 : 1); mem++) {
    int staged = mem && !aware;
    for (size_t n = 4096; n <= ((size_t)256 << 20); n *= 4) {
      gpuipc_buf_t *buf, *host = NULL;
      rc = gpuipc_buf_alloc(n, mem ? GPUIPC_KIND_AUTO : GPUIPC_KIND_HOST,
                            mem ? gpu : -1, 0, &buf);
      if (rc == 0)
        rc = gpuipc_buf_alloc(n, GPUIPC_KIND_HOST, -1, 0, &host);
      if (rc != 0)
        die("gpuipc_buf_alloc", rc);
      uint8_t *h = gpuipc_buf_ptr(host);
      int iters = iters_for(n);
      fill(rank, buf, h, n);
      double tc = run_channel(ch, rank, buf, n, iters);
      check(rank, buf, h, n, "channel");
      fill(rank, buf, h, n);
      double tp = run_plain(rank, gpuipc_buf_ptr(buf), mem ? gpu : -1, h,
                            staged, n, iters);
      check(rank, buf, h, n, "baseline");
      if (rank == 0) {
        double gb = (double)n * iters / 1e9;
        printf("%-6s %10zu %6d %13.2f %14.2f %6.2f  %s\n",
               mem ? "device" : "host", n, iters, gb / tc, gb / tp,
               tp / tc,
               staged ? "copy to pinned host, MPI_Send/Recv, copy back"
                      : "MPI_Send/Recv of the buffers");
      }
      /* Rank 0's last sends may still be in flight: released first. */
      MPI_Barrier(MPI_COMM_WORLD);
      gpuipc_mpi_channel_progress(ch);
      gpuipc_buf_release(host);
      gpuipc_buf_release(buf);
    }
  }
  gpuipc_mpi_channel_close(ch);
  MPI_Finalize();
  return 0;
}
