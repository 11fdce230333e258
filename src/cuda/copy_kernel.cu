/*
 * The source of gpuipc's one kernel, whose PTX src/cuda/kernel.c ships as
 * text (the library never compiles CUDA C; this file is not built). The
 * PTX is what
 *
 *   nvcc -ptx -arch=compute_75 src/cuda/copy_kernel.cu
 *
 * prints, with its header lowered to `.version 6.0` / `.target sm_60` (the
 * body uses no newer instruction, so any driver gpuipc supports compiles
 * it). tests/kernel_ptx.py checks that kernel.c's PTX is that output, less
 * comments, blank lines and spacing: change this file, then the PTX, and
 * the test says whether they agree. kernel.c says what the kernel does.
 */
extern "C" __global__ void __launch_bounds__(256)
gpuipc_copy_word(uint4 *__restrict__ dst, const uint4 *__restrict__ src,
                 unsigned long long n16, unsigned int ntail,
                 unsigned int *count, unsigned long long *word,
                 unsigned long long value)
{
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x +
                         threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride],
          d = src[i + 3 * stride];
    dst[i] = a; dst[i + stride] = b;
    dst[i + 2 * stride] = c; dst[i + 3 * stride] = d;
  }
  for (; i < n16; i += stride)
    dst[i] = src[i];
  if (blockIdx.x == 0 && threadIdx.x < ntail)
    ((unsigned char *)(dst + n16))[threadIdx.x] =
        ((const unsigned char *)(src + n16))[threadIdx.x];
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(count, 1) == gridDim.x - 1) {
    atomicExch(count, 0);
    __threadfence();
    *(volatile unsigned long long *)word = value;
  }
}
