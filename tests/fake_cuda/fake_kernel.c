/*
 * The fake CUDA driver's modules and launches: it runs no device code, but
 * knows gpuipc's kernels by name (src/cuda/kernel.c), and the three of
 * `gpuipc bench` (tools/bench_kernels.cu). cuModuleLoadData
 * takes PTX text (a NUL-terminated image that declares .version and
 * .target) and remembers which kernels it declares (".entry NAME(");
 * cuModuleGetFunction finds one of them; cuLaunchKernel of
 * gpuipc_copy_word checks the launch as the kernel declares it (a 1-D
 * grid of 1-D blocks of at most 256 threads, no shared memory, eight
 * parameters: 16-byte aligned destination and source, the count of
 * 16-byte units, a tail of 0..15 bytes, a 4-byte aligned counter, an
 * 8-byte aligned word, its value, and 0 or 1 for the system-scope fence)
 * and queues what the kernel does: the copy, then the word
 * (fake_stream_copy_word). Launches are counted
 * (fake_cuda_kernel_launches), those with the fence also apart
 * (fake_cuda_stage_launches: a sender's staging copies). gpuipc_copy_blocks (a 1-D grid of 1-D
 * blocks of at most 512 threads, no shared memory asked, five parameters:
 * an 8-byte aligned list in registered host memory, its count of copies,
 * a counter, a word (0: none) and its value) reads its list at the launch
 * and queues each copy in stream order, the last with the word as the
 * copy kernel's (fake_cuda_block_launches counts the launches, and
 * refuses one whose list is not registered memory); FAKE_CUDA_BLOCKS_SKIP=1 makes it
 * leave out the last copy of each list, a broken kernel for the checks of
 * its callers to catch. The bench's kernels are checked
 * as they are declared (one block of 1,024 threads, no shared memory,
 * 4-byte aligned pointers) and do their work on the host memory that
 * stands for device memory, queued in their stream's order
 * (fake_stream_call):
 * gpuipc_bench_write writes word k = v + k; gpuipc_bench_answer counts
 * the words of its input that are not v + k in tally[0], writes each + 1,
 * and counts itself in tally[1]; gpuipc_bench_check counts the words that
 * are not v + k + 1 and itself (fake_cuda_bench_launches counts them
 * all). Also cuMemsetD8 (synchronous, on the bytes at once).
 */
#include "fake_cuda_int.h"

enum { F_COPY_WORD, F_COPY_BLOCKS, F_WRITE, F_ANSWER, F_CHECK, F_COUNT };
static const char *const fn_names[F_COUNT] = {
    "gpuipc_copy_word", "gpuipc_copy_blocks", "gpuipc_bench_write",
    "gpuipc_bench_answer", "gpuipc_bench_check"};
#define BENCH_WORDS 1024 /* the bench kernels' block, and tensor */

struct CUmod_st {
  unsigned entries; /* bit F_*: the module declares that kernel */
};

struct CUfunc_st {
  int which; /* F_* */
};

static struct CUfunc_st fns[F_COUNT] = {
    {F_COPY_WORD}, {F_COPY_BLOCKS}, {F_WRITE}, {F_ANSWER}, {F_CHECK}};
static atomic_int launches, stage_launches, block_launches, bench_launches;

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
  /* A module for each set of kernels declared (nothing to allocate,
   * nothing to leak: gpuipc and the bench never unload theirs). */
  static struct CUmod_st kinds[1 << F_COUNT];
  unsigned entries = 0;
  for (int i = 0; i < F_COUNT; i++) {
    char decl[64];
    snprintf(decl, sizeof(decl), ".entry %s(", fn_names[i]);
    entries |= (strstr(text, decl) != NULL) << i;
  }
  kinds[entries].entries = entries;
  *mod = &kinds[entries];
  return CUDA_SUCCESS;
}

FAKE_HIDDEN CUresult fake_cuModuleGetFunction(CUfunction *f, CUmodule mod,
                                              const char *name)
{
  NEED_INIT();
  if (f == NULL || mod == NULL || name == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  for (int i = 0; i < F_COUNT; i++)
    if ((mod->entries & (1u << i)) && strcmp(name, fn_names[i]) == 0) {
      *f = &fns[i];
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_NOT_FOUND;
}

/* gpuipc_copy_blocks: each copy of the list, queued in order on @h; with
 * a word, the last copy queued as the copy kernel's is (the copy, then
 * the word; its counter checked), or the word alone with a skipped one. */
static CUresult launch_blocks(unsigned gx, unsigned bx, unsigned shmem,
                              CUstream h, void **params, void **extra)
{
  if (gx == 0 || bx == 0 || bx > 512 || shmem != 0 || params == NULL ||
      extra != NULL)
    return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr list = *(CUdeviceptr *)params[0];
  unsigned int n = *(unsigned int *)params[1];
  CUdeviceptr count = *(CUdeviceptr *)params[2];
  CUdeviceptr word = *(CUdeviceptr *)params[3];
  uint64_t value = *(unsigned long long *)params[4];
  if (list == 0 || list % 8 != 0 || n == 0 || gx > n)
    return CUDA_ERROR_INVALID_VALUE;
  if (word != 0 && (word % 8 != 0 || count == 0 || count % 4 != 0))
    return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr back = 0;
  if (fake_cuMemHostGetDevicePointer(&back, (void *)(uintptr_t)list, 0) !=
      CUDA_SUCCESS)
    return CUDA_ERROR_ILLEGAL_ADDRESS; /* the GPU could not read it */
  const uint64_t *l = (const uint64_t *)(uintptr_t)list;
  unsigned int todo = n - (env_int("FAKE_CUDA_BLOCKS_SKIP", 0) != 0);
  for (unsigned int i = 0; i < todo; i++) {
    CUdeviceptr d = (CUdeviceptr)l[3 * i], s = (CUdeviceptr)l[3 * i + 1];
    size_t b = (size_t)l[3 * i + 2];
    CUresult r = word != 0 && i == todo - 1
                     ? fake_stream_copy_word(h, d, s, b, count, word, value)
                     : fake_cuMemcpyAsync(d, s, b, h);
    if (r != CUDA_SUCCESS)
      return r;
  }
  if (word != 0 && todo == 0) {
    CUresult r = fake_stream_copy_word(h, 0, 0, 0, count, word, value);
    if (r != CUDA_SUCCESS)
      return r;
  }
  atomic_fetch_add(&block_launches, 1);
  return CUDA_SUCCESS;
}

/* ---- the bench's kernels, on the bytes (@a: their parameters) ---- */

static uint32_t *words(uint64_t p)
{
  return (uint32_t *)(uintptr_t)p;
}

static void bench_write(const uint64_t a[4])
{
  uint32_t *p = words(a[0]), v = (uint32_t)a[1];
  for (uint32_t k = 0; k < BENCH_WORDS; k++)
    p[k] = v + k;
}

static void bench_answer(const uint64_t a[4])
{
  const uint32_t *in = words(a[0]);
  uint32_t *out = words(a[1]), v = (uint32_t)a[2], *tally = words(a[3]);
  for (uint32_t k = 0; k < BENCH_WORDS; k++) {
    uint32_t x = in[k];
    if (x != v + k)
      __atomic_fetch_add(&tally[0], 1, __ATOMIC_RELAXED);
    out[k] = x + 1;
  }
  __atomic_fetch_add(&tally[1], 1, __ATOMIC_RELAXED);
}

static void bench_check(const uint64_t a[4])
{
  const uint32_t *in = words(a[0]);
  uint32_t v = (uint32_t)a[1], *tally = words(a[2]);
  for (uint32_t k = 0; k < BENCH_WORDS; k++)
    if (in[k] != v + k + 1)
      __atomic_fetch_add(&tally[0], 1, __ATOMIC_RELAXED);
  __atomic_fetch_add(&tally[1], 1, __ATOMIC_RELAXED);
}

/* A pointer parameter: not NULL, 4-byte aligned. */
static bool ptr_ok(uint64_t p)
{
  return p != 0 && p % 4 == 0;
}

/* A launch of a bench kernel as it declares itself: one block of
 * BENCH_WORDS threads; its parameters (pointers and a 32-bit value) in
 * the order of tools/bench_kernels.cu. */
static CUresult bench_launch(int which, unsigned gx, unsigned bx,
                             CUstream h, void **params)
{
  if (gx != 1 || bx != BENCH_WORDS)
    return CUDA_ERROR_INVALID_VALUE;
  uint64_t a[4] = {0};
  void (*fn)(const uint64_t a[4]) = NULL;
  bool ok = false;
  if (which == F_WRITE) {
    a[0] = *(CUdeviceptr *)params[0];
    a[1] = *(unsigned *)params[1];
    fn = bench_write;
    ok = ptr_ok(a[0]);
  } else if (which == F_ANSWER) {
    a[0] = *(CUdeviceptr *)params[0];
    a[1] = *(CUdeviceptr *)params[1];
    a[2] = *(unsigned *)params[2];
    a[3] = *(CUdeviceptr *)params[3];
    fn = bench_answer;
    ok = ptr_ok(a[0]) && ptr_ok(a[1]) && ptr_ok(a[3]);
  } else {
    a[0] = *(CUdeviceptr *)params[0];
    a[1] = *(unsigned *)params[1];
    a[2] = *(CUdeviceptr *)params[2];
    fn = bench_check;
    ok = ptr_ok(a[0]) && ptr_ok(a[2]);
  }
  if (!ok)
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = fake_stream_call(h, fn, a);
  if (r == CUDA_SUCCESS)
    atomic_fetch_add(&bench_launches, 1);
  return r;
}

FAKE_HIDDEN CUresult fake_cuLaunchKernel(CUfunction f, unsigned gx,
                                         unsigned gy, unsigned gz,
                                         unsigned bx, unsigned by,
                                         unsigned bz, unsigned shmem,
                                         CUstream h, void **params,
                                         void **extra)
{
  NEED_INIT();
  uintptr_t fi = (uintptr_t)f, f0 = (uintptr_t)fns;
  if (fi < f0 || fi >= f0 + sizeof(fns) || (fi - f0) % sizeof(fns[0]) != 0)
    return CUDA_ERROR_INVALID_HANDLE;
  if (f->which == F_COPY_BLOCKS && gy == 1 && gz == 1 && by == 1 && bz == 1)
    return launch_blocks(gx, bx, shmem, h, params, extra);
  if (gx == 0 || gy != 1 || gz != 1 || bx == 0 || by != 1 || bz != 1 ||
      shmem != 0 || params == NULL || extra != NULL)
    return CUDA_ERROR_INVALID_VALUE;
  if (f->which != F_COPY_WORD)
    return bench_launch(f->which, gx, bx, h, params);
  if (bx > 256)
    return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr dst = *(CUdeviceptr *)params[0];
  CUdeviceptr src = *(CUdeviceptr *)params[1];
  unsigned long long n16 = *(unsigned long long *)params[2];
  unsigned int ntail = *(unsigned int *)params[3];
  CUdeviceptr count = *(CUdeviceptr *)params[4];
  CUdeviceptr word = *(CUdeviceptr *)params[5];
  unsigned long long value = *(unsigned long long *)params[6];
  unsigned int sys = *(unsigned int *)params[7];
  if (dst == 0 || src == 0 || dst % 16 != 0 || src % 16 != 0 ||
      ntail > 15 || (n16 == 0 && ntail == 0) || count == 0 ||
      count % 4 != 0 || word == 0 || word % 8 != 0 || sys > 1)
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = fake_stream_copy_word(h, dst, src, n16 * 16 + ntail, count,
                                     word, value);
  if (r == CUDA_SUCCESS)
    atomic_fetch_add(sys ? &stage_launches : &launches, 1);
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

int fake_cuda_stage_launches(void)
{
  return atomic_load(&stage_launches);
}

int fake_cuda_block_launches(void)
{
  return atomic_load(&block_launches);
}

int fake_cuda_bench_launches(void)
{
  return atomic_load(&bench_launches);
}
