/*
 * What the CUDA C benchmarks (channel_bench, kloop_bench, blocks_bench)
 * share: a failed CUDA runtime, driver or gpuipc call ends the program
 * with where and why, and one clock.
 */
#ifndef GPUIPC_BENCH_CUDA_H
#define GPUIPC_BENCH_CUDA_H

#include <gpuipc.h>

#include <cuda.h>
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CUDA_OK(call)                                                          \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) {                                                   \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,            \
              cudaGetErrorString(e_));                                         \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

#define CU_OK(call)                                                            \
  do {                                                                         \
    CUresult r_ = (call);                                                      \
    if (r_ != CUDA_SUCCESS) {                                                  \
      const char *s_ = "?";                                                    \
      cuGetErrorName(r_, &s_);                                                 \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, s_);      \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

#define GI_OK(call)                                                            \
  do {                                                                         \
    int rc_ = (call);                                                          \
    if (rc_ != 0) {                                                            \
      fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call,       \
              gpuipc_err_name(rc_), gpuipc_last_error());                      \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

/* CLOCK_MONOTONIC in microseconds: one clock for every process. */
static inline double now_us(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

#endif
