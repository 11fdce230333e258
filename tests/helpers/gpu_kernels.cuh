/* Kernels and checks the CUDA C test helpers share. */
#ifndef GPUIPC_TEST_GPU_KERNELS_CUH
#define GPUIPC_TEST_GPU_KERNELS_CUH

#include "gpu_proto.h"

#include <cuda_runtime.h>

#define CUDA_OK(call)                                                          \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess)                                                     \
      TFAIL("%s: %s", #call, cudaGetErrorString(e_));                          \
  } while (0)

/* The same bytes as test_pattern() in test.h, computed on the GPU. */
__device__ static inline uint8_t dev_pattern(uint64_t seed, size_t i)
{
  uint64_t x = (seed + 0x9e3779b97f4a7c15ull) ^ (i * 0xbf58476d1ce4e5b9ull);
  x ^= x >> 31;
  return (uint8_t)(x ^ (x >> 17));
}

/* Byte i of @p becomes dev_pattern(seed, i). */
__global__ static void fill_kernel(uint8_t *p, size_t n, uint64_t seed)
{
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride)
    p[i] = dev_pattern(seed, i);
}

#endif
