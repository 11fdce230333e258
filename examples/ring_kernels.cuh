/*
 * The ring examples' kernels: GPU `writer` fills a buffer with 16-byte
 * words that depend on the writer and the index, and the owner of the
 * buffer counts the words that are not what that writer wrote.
 */
#ifndef GPUIPC_EXAMPLE_RING_KERNELS_CUH
#define GPUIPC_EXAMPLE_RING_KERNELS_CUH

#include <cuda_runtime.h>

__device__ static inline uint4 ring_word(unsigned writer, size_t i)
{
  unsigned long long x =
      (i + 1) * 0x9e3779b97f4a7c15ull ^ (writer + 1) * 0xbf58476d1ce4e5b9ull;
  return make_uint4((unsigned)x, (unsigned)(x >> 32), (unsigned)(i ^ writer),
                    0xc0ffee00u + writer);
}

__global__ static void write_ring(uint4 *dst, size_t n, unsigned writer)
{
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride)
    dst[i] = ring_word(writer, i);
}

__global__ static void verify_ring(const uint4 *p, size_t n, unsigned writer,
                                   unsigned long long *bad)
{
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    uint4 w = ring_word(writer, i), g = p[i];
    if (w.x != g.x || w.y != g.y || w.z != g.z || w.w != g.w)
      atomicAdd(bad, 1ull);
  }
}

#endif
