/*
 * What the CUDA C test helpers share: kernels, checks, and the beginning
 * and end of a sending or receiving helper.
 */
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

/* The GPU's own clock, in ns. */
__device__ static inline uint64_t gpu_now_ns(void)
{
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* Keep the stream busy for @ns: work queued after it waits that long. */
__global__ static void spin_kernel(uint64_t ns)
{
  uint64_t start = gpu_now_ns();
  while (gpu_now_ns() - start < ns)
    ;
}

/*
 * A helper's main() begins: stdout unbuffered, at least "MODE DOMAIN
 * CHANNEL ..." (else @usage, after "usage: "), domain argv[2] joined.
 */
static inline gpuipc_domain_t *gpu_helper_join(int argc, char **argv,
                                               const char *usage)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc < 6)
    TFAIL("usage: %s", usage);
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join(argv[2], NULL, &dom));
  return dom;
}

/* A new non-blocking stream on @dev, made the current device. */
static inline cudaStream_t gpu_stream_on(int dev)
{
  CUDA_OK(cudaSetDevice(dev));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

/* A receiving helper is done: its channel closed, its memory freed. */
static inline void gpu_recv_done(gpuipc_channel_t *ch, void *dst, void *host,
                                 cudaStream_t s)
{
  ASSERT_OK(gpuipc_channel_close(ch));
  CUDA_OK(cudaFree(dst));
  CUDA_OK(cudaFreeHost(host));
  CUDA_OK(cudaStreamDestroy(s));
}

#endif
