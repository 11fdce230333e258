/*
 * The fake CUDA driver's modules and launches: it runs no device code, but
 * knows gpuipc's one kernel by name (src/cuda/kernel.c). cuModuleLoadData
 * takes PTX text (a NUL-terminated image that declares .version and
 * .target) and remembers which kernels it declares (".entry NAME(");
 * cuModuleGetFunction finds one of them; cuLaunchKernel of
 * gpuipc_copy_word checks the launch as the kernel declares it (a 1-D
 * grid of 1-D blocks of at most 256 threads, no shared memory, seven
 * parameters: 16-byte aligned destination and source, the count of
 * 16-byte units, a tail of 0..15 bytes, a 4-byte aligned counter, an
 * 8-byte aligned word and its value) and queues what the kernel does: the
 * copy, then the word (fake_stream_copy_word). Launches are counted
 * (fake_cuda_kernel_launches). gpuipc_copy_blocks (a 1-D grid of 1-D
 * blocks of at most 512 threads, no shared memory asked, two parameters:
 * an 8-byte aligned list in registered host memory and its count of
 * copies) reads its list at the launch and queues each copy in stream
 * order (fake_cuda_block_launches counts the launches, and refuses one
 * whose list is not registered memory). Also cuMemsetD8 (synchronous, on
 * the bytes at once).
 */
#include "fake_cuda_int.h"

#define COPY_WORD "gpuipc_copy_word"
#define COPY_BLOCKS "gpuipc_copy_blocks"

struct CUmod_st {
  bool has_copy_word;
};

struct CUfunc_st {
  int which; /* 1: gpuipc_copy_word, 2: gpuipc_copy_blocks */
};

static struct CUfunc_st copy_word_fn = {1}, copy_blocks_fn = {2};
static atomic_int launches, block_launches;

FAKE_HIDDEN CUresult fake_cuModuleLoadData(CUmodule *mod, const void *image)
{
  NEED_INIT();
  if (fake_current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (mod == NULL || image == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  const char *text = image;
  if (strnlen(text, 1 << 20) == 1 << 20 || strstr(text, ".version") == NULL ||
      strstr(text, ".target") == NULL)
    return CUDA_ERROR_INVALID_IMAGE;
  /* Two kinds of module: with gpuipc's kernel or without (nothing to
   * allocate, nothing to leak: gpuipc never unloads its module). */
  static struct CUmod_st kinds[2] = {{false}, {true}};
  *mod = &kinds[strstr(text, ".entry " COPY_WORD "(") != NULL];
  return CUDA_SUCCESS;
}

FAKE_HIDDEN CUresult fake_cuModuleGetFunction(CUfunction *f, CUmodule mod,
                                              const char *name)
{
  NEED_INIT();
  if (f == NULL || mod == NULL || name == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  if (!mod->has_copy_word)
    return CUDA_ERROR_NOT_FOUND;
  if (strcmp(name, COPY_WORD) == 0)
    *f = &copy_word_fn;
  else if (strcmp(name, COPY_BLOCKS) == 0)
    *f = &copy_blocks_fn;
  else
    return CUDA_ERROR_NOT_FOUND;
  return CUDA_SUCCESS;
}

/* gpuipc_copy_blocks: each copy of the list, queued in order on @h. */
static CUresult launch_blocks(unsigned gx, unsigned bx, unsigned shmem,
                              CUstream h, void **params, void **extra)
{
  if (gx == 0 || bx == 0 || bx > 512 || shmem != 0 || params == NULL ||
      extra != NULL)
    return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr list = *(CUdeviceptr *)params[0];
  unsigned int n = *(unsigned int *)params[1];
  if (list == 0 || list % 8 != 0 || n == 0 || gx > n)
    return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr back = 0;
  if (fake_cuMemHostGetDevicePointer(&back, (void *)(uintptr_t)list, 0) !=
      CUDA_SUCCESS)
    return CUDA_ERROR_ILLEGAL_ADDRESS; /* the GPU could not read it */
  const uint64_t *l = (const uint64_t *)(uintptr_t)list;
  for (unsigned int i = 0; i < n; i++) {
    CUresult r = fake_cuMemcpyAsync((CUdeviceptr)l[3 * i],
                                    (CUdeviceptr)l[3 * i + 1],
                                    (size_t)l[3 * i + 2], h);
    if (r != CUDA_SUCCESS)
      return r;
  }
  atomic_fetch_add(&block_launches, 1);
  return CUDA_SUCCESS;
}

FAKE_HIDDEN CUresult fake_cuLaunchKernel(CUfunction f, unsigned gx,
                                         unsigned gy, unsigned gz,
                                         unsigned bx, unsigned by,
                                         unsigned bz, unsigned shmem,
                                         CUstream h, void **params,
                                         void **extra)
{
  NEED_INIT();
  if (f == &copy_blocks_fn && gy == 1 && gz == 1 && by == 1 && bz == 1)
    return launch_blocks(gx, bx, shmem, h, params, extra);
  if (f != &copy_word_fn)
    return CUDA_ERROR_INVALID_HANDLE;
  if (gx == 0 || gy != 1 || gz != 1 || bx == 0 || bx > 256 || by != 1 ||
      bz != 1 || shmem != 0 || params == NULL || extra != NULL)
    return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr dst = *(CUdeviceptr *)params[0];
  CUdeviceptr src = *(CUdeviceptr *)params[1];
  unsigned long long n16 = *(unsigned long long *)params[2];
  unsigned int ntail = *(unsigned int *)params[3];
  CUdeviceptr count = *(CUdeviceptr *)params[4];
  CUdeviceptr word = *(CUdeviceptr *)params[5];
  unsigned long long value = *(unsigned long long *)params[6];
  if (dst == 0 || src == 0 || dst % 16 != 0 || src % 16 != 0 ||
      ntail > 15 || (n16 == 0 && ntail == 0) || count == 0 ||
      count % 4 != 0 || word == 0 || word % 8 != 0)
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = fake_stream_copy_word(h, dst, src, n16 * 16 + ntail, count,
                                     word, value);
  if (r == CUDA_SUCCESS)
    atomic_fetch_add(&launches, 1);
  return r;
}

FAKE_HIDDEN CUresult fake_cuMemsetD8(CUdeviceptr p, unsigned char v, size_t n)
{
  NEED_INIT();
  if (fake_current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (p == 0)
    return CUDA_ERROR_INVALID_VALUE;
  memset((void *)(uintptr_t)p, v, n);
  return CUDA_SUCCESS;
}

int fake_cuda_kernel_launches(void)
{
  return atomic_load(&launches);
}

int fake_cuda_block_launches(void)
{
  return atomic_load(&block_launches);
}
