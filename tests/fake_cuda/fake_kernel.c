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
 * (fake_cuda_kernel_launches). Also cuMemsetD8 (synchronous, on the
 * bytes at once).
 */
#include "fake_cuda_int.h"

#define COPY_WORD "gpuipc_copy_word"

struct CUmod_st {
  bool has_copy_word;
};

struct CUfunc_st {
  int which; /* 1: gpuipc_copy_word */
};

static struct CUfunc_st copy_word_fn = {1};
static atomic_int launches;

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
  if (!mod->has_copy_word || strcmp(name, COPY_WORD) != 0)
    return CUDA_ERROR_NOT_FOUND;
  *f = &copy_word_fn;
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
