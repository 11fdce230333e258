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
                 unsigned long long value, unsigned int sys)
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
  if (threadIdx.x == 0) {
    if (sys)
      __threadfence_system(); /* the block's writes, before it counts */
    if (atomicAdd(count, 1) == gridDim.x - 1) {
      atomicExch(count, 0);
      if (sys && gridDim.x > 1)
        __threadfence_system(); /* every block's writes, before the word */
      else
        __threadfence();
      *(volatile unsigned long long *)word = value;
    }
  }
}

/*
 * Block batches (src/channel/blocks.c): @n copies listed in @list (dst,
 * src, bytes: three u64 a copy, in pinned host memory), thread block k
 * taking copies k, k + gridDim.x, ...: 16 bytes a thread where both ends
 * are 16-byte aligned, the rest a byte at a time. One thread reads a
 * copy's entry over the bus; the block shares it. With @word, every block
 * then counts itself in @count and the last writes @value to @word, as
 * gpuipc_copy_word does: the batch's release, once every source byte is
 * read.
 */
extern "C" __global__ void __launch_bounds__(512)
gpuipc_copy_blocks(const unsigned long long *__restrict__ list,
                   unsigned int n, unsigned int *count,
                   unsigned long long *word, unsigned long long value)
{
  __shared__ unsigned long long e[3];
  for (unsigned int k = blockIdx.x; k < n; k += gridDim.x) {
    if (threadIdx.x < 3)
      e[threadIdx.x] = list[3ull * k + threadIdx.x];
    __syncthreads();
    unsigned char *d = (unsigned char *)e[0];
    const unsigned char *s = (const unsigned char *)e[1];
    unsigned long long b = e[2], i = 0;
    if ((((unsigned long long)d | (unsigned long long)s) & 15) == 0) {
      unsigned long long n16 = b >> 4;
      for (i = threadIdx.x; i < n16; i += blockDim.x)
        ((uint4 *)d)[i] = ((const uint4 *)s)[i];
      i = n16 << 4;
    }
    for (i += threadIdx.x; i < b; i += blockDim.x)
      d[i] = s[i];
    __syncthreads();
  }
  if (word != 0 && threadIdx.x == 0 && atomicAdd(count, 1) == gridDim.x - 1) {
    atomicExch(count, 0);
    __threadfence();
    *(volatile unsigned long long *)word = value;
  }
}
