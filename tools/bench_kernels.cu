/*
 * The source of `gpuipc bench`'s kernel-in-the-loop kernels, whose PTX
 * tools/bench_kernels.c ships as text (the CLI never compiles CUDA C; this
 * file is not built). The PTX is what
 *
 *   nvcc -ptx -arch=compute_75 tools/bench_kernels.cu
 *
 * prints, with its header lowered to `.version 6.0` / `.target sm_60`, as
 * src/cuda/copy_kernel.cu's is. tests/kernel_ptx.py checks that the two
 * agree. Each runs as one block of 1,024 threads over a 4 KiB tensor of
 * 1,024 words; @tally is two words: wrong words seen, launches made.
 *
 *   gpuipc_bench_write   the producer writes word k = v + k
 *   gpuipc_bench_answer  the receiver checks them and answers word + 1
 *   gpuipc_bench_check   the producer checks the answer: v + k + 1
 */
extern "C" __global__ void __launch_bounds__(1024)
gpuipc_bench_write(unsigned int *p, unsigned int v)
{
  p[threadIdx.x] = v + threadIdx.x;
}

extern "C" __global__ void __launch_bounds__(1024)
gpuipc_bench_answer(const unsigned int *in, unsigned int *out, unsigned int v,
                    unsigned int *tally)
{
  unsigned int x = in[threadIdx.x];
  if (x != v + threadIdx.x)
    atomicAdd(&tally[0], 1);
  out[threadIdx.x] = x + 1;
  if (threadIdx.x == 0)
    atomicAdd(&tally[1], 1);
}

extern "C" __global__ void __launch_bounds__(1024)
gpuipc_bench_check(const unsigned int *in, unsigned int v, unsigned int *tally)
{
  if (in[threadIdx.x] != v + threadIdx.x + 1)
    atomicAdd(&tally[0], 1);
  if (threadIdx.x == 0)
    atomicAdd(&tally[1], 1);
}
