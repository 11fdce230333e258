/*
 * channel_nccl: the NCCL baseline of channel_vs_baselines.py, two
 * processes, one GPU each (rank r on GPU r).
 *
 *   channel_nccl RANK IDFILE [--quick]
 *
 * Rank 0 writes ncclGetUniqueId's bytes to IDFILE (through a rename), rank
 * 1 waits for the file. Then:
 *   - a 4 KiB ping-pong, ncclSend then ncclRecv with a stream sync each
 *     way (rank 0 prints the round trip);
 *   - streaming ncclSend -> ncclRecv from 4 KiB to 1 GiB, with the same
 *     message counts as channel_bench, after a barrier (rank 1 prints the
 *     bandwidth at which the data arrived).
 * Build: cc -O2 -std=gnu11 channel_nccl.c -I/usr/local/cuda/include
 *        -L/usr/local/cuda/lib64 -lcudart -lnccl
 */
#include <cuda_runtime.h>
#include <nccl.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_BYTES ((size_t)1 << 30)

#define CUDA_OK(call)                                                          \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) {                                                   \
      fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));              \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

#define NCCL_OK(call)                                                          \
  do {                                                                         \
    ncclResult_t r_ = (call);                                                  \
    if (r_ != ncclSuccess) {                                                   \
      fprintf(stderr, "%s: %s\n", #call, ncclGetErrorString(r_));              \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

static double now_us(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The message counts of channel_bench. */
static long count_for(size_t bytes, int quick)
{
  size_t target = quick ? ((size_t)1 << 30) : ((size_t)8 << 30);
  long n = (long)(target / bytes);
  long cap = quick ? 500 : 4000;
  if (n > cap)
    n = cap;
  return n < 10 ? 10 : n;
}

static void barrier(ncclComm_t comm, cudaStream_t s, int *flag)
{
  NCCL_OK(ncclAllReduce(flag, flag, 1, ncclInt, ncclSum, comm, s));
  CUDA_OK(cudaStreamSynchronize(s));
}

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 3) {
    fprintf(stderr, "usage: channel_nccl RANK IDFILE [--quick]\n");
    return 2;
  }
  int rank = atoi(argv[1]);
  const char *idfile = argv[2];
  int quick = argc > 3 && strcmp(argv[3], "--quick") == 0;
  ncclUniqueId id;
  if (rank == 0) {
    NCCL_OK(ncclGetUniqueId(&id));
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", idfile);
    FILE *f = fopen(tmp, "wb");
    if (f == NULL || fwrite(&id, sizeof(id), 1, f) != 1 || fclose(f) != 0 ||
        rename(tmp, idfile) != 0) {
      perror("writing the NCCL id");
      return 1;
    }
  } else {
    FILE *f = NULL;
    for (int i = 0; i < 6000 && (f = fopen(idfile, "rb")) == NULL; i++)
      usleep(10000);
    if (f == NULL || fread(&id, sizeof(id), 1, f) != 1) {
      fprintf(stderr, "rank 1: no NCCL id in %s\n", idfile);
      return 1;
    }
    fclose(f);
  }
  CUDA_OK(cudaSetDevice(rank));
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, 2, id, rank));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void *buf;
  CUDA_OK(cudaMalloc(&buf, MAX_BYTES));
  int *flag;
  CUDA_OK(cudaMalloc((void **)&flag, sizeof(int)));
  int peer = 1 - rank;

  /* Ping-pong, 4 KiB. */
  int n = quick ? 1000 : 5000, warm = n / 10;
  double *lat = malloc(sizeof(double) * (size_t)n);
  barrier(comm, s, flag);
  for (int i = 0; i < n + warm; i++) {
    double t0 = now_us();
    if (rank == 0) {
      NCCL_OK(ncclSend(buf, 4096, ncclChar, peer, comm, s));
      CUDA_OK(cudaStreamSynchronize(s));
      NCCL_OK(ncclRecv(buf, 4096, ncclChar, peer, comm, s));
      CUDA_OK(cudaStreamSynchronize(s));
    } else {
      NCCL_OK(ncclRecv(buf, 4096, ncclChar, peer, comm, s));
      CUDA_OK(cudaStreamSynchronize(s));
      NCCL_OK(ncclSend(buf, 4096, ncclChar, peer, comm, s));
      CUDA_OK(cudaStreamSynchronize(s));
    }
    if (i >= warm)
      lat[i - warm] = now_us() - t0;
  }
  if (rank == 0) {
    qsort(lat, (size_t)n, sizeof(double), cmp);
    printf("RESULT lat nccl_rt %.3f %.3f\n", lat[n / 2], lat[n * 99 / 100]);
    printf("  nccl ping-pong 4 KiB: median %.2f us, p99 %.2f us\n",
           lat[n / 2], lat[n * 99 / 100]);
  }
  free(lat);

  /* Streaming, rank 0 -> rank 1. */
  for (size_t bytes = 4096; bytes <= MAX_BYTES; bytes *= 4) {
    long m = count_for(bytes, quick);
    barrier(comm, s, flag);
    if (rank == 0)
      NCCL_OK(ncclSend(buf, bytes, ncclChar, peer, comm, s)); /* warm-up */
    else
      NCCL_OK(ncclRecv(buf, bytes, ncclChar, peer, comm, s));
    barrier(comm, s, flag);
    double t0 = now_us();
    for (long i = 0; i < m; i++) {
      if (rank == 0)
        NCCL_OK(ncclSend(buf, bytes, ncclChar, peer, comm, s));
      else
        NCCL_OK(ncclRecv(buf, bytes, ncclChar, peer, comm, s));
    }
    CUDA_OK(cudaStreamSynchronize(s));
    double us = now_us() - t0;
    if (rank == 1) {
      double gbs = (double)bytes * m / us / 1e3;
      printf("RESULT bw cross nccl %zu %.2f\n", bytes, gbs);
      printf("  nccl %10zu B x %5ld: %8.2f GB/s\n", bytes, m, gbs);
    }
  }
  barrier(comm, s, flag);
  NCCL_OK(ncclCommDestroy(comm));
  CUDA_OK(cudaFree(buf));
  return 0;
}
