/*
 * gpuipc bench, the device side of the kernel-in-the-loop rows
 * (bench_kloop.c runs them): three small kernels shipped as PTX text,
 * loaded with cuModuleLoadData in each device's primary context and
 * launched with cuLaunchKernel through gpuipc's driver table, as
 * src/cuda/kernel.c does with the library's copy kernel; device memory and
 * events for the rows. The source is tools/bench_kernels.cu (which says
 * what each kernel does); the PTX is what `nvcc -ptx -arch=compute_75`
 * makes of it, the header lowered to PTX ISA 6.0 / sm_60 (the body uses no
 * newer instruction); tests/kernel_ptx.py checks that the two agree.
 */
#include "bench.h"
#include "cuda/cuda.h"

#include <pthread.h>

#if GPUIPC_HAVE_CUDA

static const char bench_ptx[] =
    ".version 6.0\n"
    ".target sm_60\n"
    ".address_size 64\n"
    "\n"
    " // .globl gpuipc_bench_write\n"
    "\n"
    ".visible .entry gpuipc_bench_write(\n"
    " .param .u64 gpuipc_bench_write_param_0,\n"
    " .param .u32 gpuipc_bench_write_param_1\n"
    ")\n"
    ".maxntid 1024, 1, 1\n"
    "{\n"
    " .reg .b32  %r<4>;\n"
    " .reg .b64  %rd<5>;\n"
    "\n"
    " ld.param.u64  %rd1, [gpuipc_bench_write_param_0];\n"
    " ld.param.u32  %r1, [gpuipc_bench_write_param_1];\n"
    " cvta.to.global.u64  %rd2, %rd1;\n"
    " mov.u32  %r2, %tid.x;\n"
    " add.s32  %r3, %r2, %r1;\n"
    " mul.wide.u32  %rd3, %r2, 4;\n"
    " add.s64  %rd4, %rd2, %rd3;\n"
    " st.global.u32  [%rd4], %r3;\n"
    " ret;\n"
    "\n"
    "}\n"
    " // .globl gpuipc_bench_answer\n"
    ".visible .entry gpuipc_bench_answer(\n"
    " .param .u64 gpuipc_bench_answer_param_0,\n"
    " .param .u64 gpuipc_bench_answer_param_1,\n"
    " .param .u32 gpuipc_bench_answer_param_2,\n"
    " .param .u64 gpuipc_bench_answer_param_3\n"
    ")\n"
    ".maxntid 1024, 1, 1\n"
    "{\n"
    " .reg .pred  %p<3>;\n"
    " .reg .b32  %r<9>;\n"
    " .reg .b64  %rd<13>;\n"
    "\n"
    " ld.param.u64  %rd4, [gpuipc_bench_answer_param_0];\n"
    " ld.param.u64  %rd3, [gpuipc_bench_answer_param_1];\n"
    " ld.param.u32  %r2, [gpuipc_bench_answer_param_2];\n"
    " ld.param.u64  %rd5, [gpuipc_bench_answer_param_3];\n"
    " cvta.to.global.u64  %rd1, %rd5;\n"
    " mov.u32  %r3, %tid.x;\n"
    " cvt.u64.u32  %rd2, %r3;\n"
    " cvta.to.global.u64  %rd6, %rd4;\n"
    " mul.wide.u32  %rd7, %r3, 4;\n"
    " add.s64  %rd8, %rd6, %rd7;\n"
    " add.s32  %r4, %r3, %r2;\n"
    " ld.global.u32  %r1, [%rd8];\n"
    " setp.eq.s32  %p1, %r1, %r4;\n"
    " @%p1 bra  $L__BB1_2;\n"
    "\n"
    " atom.global.add.u32  %r5, [%rd1], 1;\n"
    "\n"
    "$L__BB1_2:\n"
    " cvt.u32.u64  %r6, %rd2;\n"
    " cvta.to.global.u64  %rd9, %rd3;\n"
    " shl.b64  %rd10, %rd2, 2;\n"
    " add.s64  %rd11, %rd9, %rd10;\n"
    " add.s32  %r7, %r1, 1;\n"
    " st.global.u32  [%rd11], %r7;\n"
    " setp.ne.s32  %p2, %r6, 0;\n"
    " @%p2 bra  $L__BB1_4;\n"
    "\n"
    " add.s64  %rd12, %rd1, 4;\n"
    " atom.global.add.u32  %r8, [%rd12], 1;\n"
    "\n"
    "$L__BB1_4:\n"
    " ret;\n"
    "\n"
    "}\n"
    " // .globl gpuipc_bench_check\n"
    ".visible .entry gpuipc_bench_check(\n"
    " .param .u64 gpuipc_bench_check_param_0,\n"
    " .param .u32 gpuipc_bench_check_param_1,\n"
    " .param .u64 gpuipc_bench_check_param_2\n"
    ")\n"
    ".maxntid 1024, 1, 1\n"
    "{\n"
    " .reg .pred  %p<3>;\n"
    " .reg .b32  %r<8>;\n"
    " .reg .b64  %rd<8>;\n"
    "\n"
    " ld.param.u64  %rd2, [gpuipc_bench_check_param_0];\n"
    " ld.param.u32  %r2, [gpuipc_bench_check_param_1];\n"
    " ld.param.u64  %rd3, [gpuipc_bench_check_param_2];\n"
    " cvta.to.global.u64  %rd1, %rd3;\n"
    " mov.u32  %r1, %tid.x;\n"
    " cvta.to.global.u64  %rd4, %rd2;\n"
    " mul.wide.u32  %rd5, %r1, 4;\n"
    " add.s64  %rd6, %rd4, %rd5;\n"
    " add.s32  %r3, %r1, %r2;\n"
    " add.s32  %r4, %r3, 1;\n"
    " ld.global.u32  %r5, [%rd6];\n"
    " setp.eq.s32  %p1, %r5, %r4;\n"
    " @%p1 bra  $L__BB2_2;\n"
    "\n"
    " atom.global.add.u32  %r6, [%rd1], 1;\n"
    "\n"
    "$L__BB2_2:\n"
    " setp.ne.s32  %p2, %r1, 0;\n"
    " @%p2 bra  $L__BB2_4;\n"
    "\n"
    " add.s64  %rd7, %rd1, 4;\n"
    " atom.global.add.u32  %r7, [%rd7], 1;\n"
    "\n"
    "$L__BB2_4:\n"
    " ret;\n"
    "\n"
    "}\n";

enum { K_WRITE, K_ANSWER, K_CHECK, K_COUNT };
static const char *const k_names[K_COUNT] = {
    "gpuipc_bench_write", "gpuipc_bench_answer", "gpuipc_bench_check"};

struct kmod {
  int state; /* 0 not tried, 1 loaded, < 0 the error it gave */
  CUmodule mod; /* kept for the life of the process */
  CUfunction fn[K_COUNT];
};

static struct kmod kmods[GPUIPC__DEV_SLOTS];
static pthread_mutex_t kmod_lock = PTHREAD_MUTEX_INITIALIZER;

/* Load the module in @dev's primary context (current), once. */
static int kmod_load(int dev)
{
  struct kmod *k = &kmods[dev];
  pthread_mutex_lock(&kmod_lock);
  int rc = k->state < 0 ? k->state : 0;
  if (k->state == 0) {
    if (gpuipc__cu.cuModuleLoadData == NULL ||
        gpuipc__cu.cuModuleGetFunction == NULL ||
        gpuipc__cu.cuLaunchKernel == NULL)
      rc = gpuipc__err(GPUIPC_E_UNSUPPORTED, "the CUDA driver cannot "
                       "launch kernels");
    else
      rc = GPUIPC_CU(cuModuleLoadData, &k->mod, bench_ptx);
    for (int i = 0; rc == 0 && i < K_COUNT; i++)
      rc = GPUIPC_CU(cuModuleGetFunction, &k->fn[i], k->mod, k_names[i]);
    k->state = rc == 0 ? 1 : rc;
  }
  pthread_mutex_unlock(&kmod_lock);
  return rc;
}

int bench_k_ready(int dev)
{
  if (dev < 0 || dev >= GPUIPC__DEV_SLOTS)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED, "bench: no kernels for device "
                       "%d", dev);
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(dev, &saved);
  if (rc != 0)
    return rc;
  rc = kmod_load(dev);
  gpuipc__ctx_leave(&saved);
  return rc;
}

/* One block of KLOOP_WORDS threads of kernel @which on @stream of @dev. */
static int launch(int dev, int which, void *stream, void **args)
{
  int rc = bench_k_ready(dev);
  struct gpuipc__ctx_saved saved;
  if (rc == 0)
    rc = gpuipc__ctx_enter(dev, &saved);
  if (rc != 0)
    return rc;
  rc = GPUIPC_CU(cuLaunchKernel, kmods[dev].fn[which], 1, 1, 1, KLOOP_WORDS,
                 1, 1, 0, (CUstream)stream, args, NULL);
  gpuipc__ctx_leave(&saved);
  return rc;
}

int bench_k_write(int dev, void *stream, uint32_t *p, uint32_t v)
{
  CUdeviceptr dp = (CUdeviceptr)(uintptr_t)p;
  void *args[] = {&dp, &v};
  return launch(dev, K_WRITE, stream, args);
}

int bench_k_answer(int dev, void *stream, const uint32_t *in, uint32_t *out,
                   uint32_t v, uint32_t *tally)
{
  CUdeviceptr i = (CUdeviceptr)(uintptr_t)in, o = (CUdeviceptr)(uintptr_t)out;
  CUdeviceptr t = (CUdeviceptr)(uintptr_t)tally;
  void *args[] = {&i, &o, &v, &t};
  return launch(dev, K_ANSWER, stream, args);
}

int bench_k_check(int dev, void *stream, const uint32_t *in, uint32_t v,
                  uint32_t *tally)
{
  CUdeviceptr i = (CUdeviceptr)(uintptr_t)in;
  CUdeviceptr t = (CUdeviceptr)(uintptr_t)tally;
  void *args[] = {&i, &v, &t};
  return launch(dev, K_CHECK, stream, args);
}

int bench_dev_alloc(int dev, size_t n, void **out)
{
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(dev, &saved);
  if (rc != 0)
    return rc;
  CUdeviceptr p = 0;
  rc = GPUIPC_CU(cuMemAlloc, &p, n);
  if (rc == 0) {
    /* Zeroed before any stream's kernel runs: cuMemsetD8 may return
     * before it is done, and a non-blocking stream does not wait for it. */
    rc = GPUIPC_CU(cuMemsetD8, p, 0, n);
    if (rc == 0)
      rc = GPUIPC_CU(cuCtxSynchronize);
    if (rc != 0)
      gpuipc__cu.cuMemFree(p);
  }
  gpuipc__ctx_leave(&saved);
  if (rc == 0)
    *out = (void *)(uintptr_t)p;
  return rc;
}

void bench_dev_free(int dev, void *p)
{
  struct gpuipc__ctx_saved saved;
  if (p != NULL && gpuipc__ctx_enter(dev, &saved) == 0) {
    gpuipc__cu.cuMemFree((CUdeviceptr)(uintptr_t)p);
    gpuipc__ctx_leave(&saved);
  }
}

int bench_ev_make(int dev, void **ev)
{
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(dev, &saved);
  if (rc != 0)
    return rc;
  CUevent e = NULL;
  rc = GPUIPC_CU(cuEventCreate, &e, CU_EVENT_DISABLE_TIMING);
  gpuipc__ctx_leave(&saved);
  if (rc == 0)
    *ev = e;
  return rc;
}

void bench_ev_free(int dev, void *ev)
{
  struct gpuipc__ctx_saved saved;
  if (ev != NULL && gpuipc__ctx_enter(dev, &saved) == 0) {
    gpuipc__cu.cuEventDestroy((CUevent)ev);
    gpuipc__ctx_leave(&saved);
  }
}

int bench_ev_record(int dev, void *ev, void *stream)
{
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(dev, &saved);
  if (rc != 0)
    return rc;
  rc = GPUIPC_CU(cuEventRecord, (CUevent)ev, (CUstream)stream);
  gpuipc__ctx_leave(&saved);
  return rc;
}

int bench_ev_wait(int dev, void *stream, void *ev)
{
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(dev, &saved);
  if (rc != 0)
    return rc;
  rc = GPUIPC_CU(cuStreamWaitEvent, (CUstream)stream, (CUevent)ev, 0);
  gpuipc__ctx_leave(&saved);
  return rc;
}
#else
int bench_k_ready(int dev)
{
  return gpuipc__err(GPUIPC_E_UNSUPPORTED, "bench: built without CUDA");
}

int bench_k_write(int dev, void *stream, uint32_t *p, uint32_t v)
{
  return GPUIPC_E_UNSUPPORTED;
}

int bench_k_answer(int dev, void *stream, const uint32_t *in, uint32_t *out,
                   uint32_t v, uint32_t *tally)
{
  return GPUIPC_E_UNSUPPORTED;
}

int bench_k_check(int dev, void *stream, const uint32_t *in, uint32_t v,
                  uint32_t *tally)
{
  return GPUIPC_E_UNSUPPORTED;
}

int bench_dev_alloc(int dev, size_t n, void **out)
{
  return GPUIPC_E_UNSUPPORTED;
}

void bench_dev_free(int dev, void *p)
{
}

int bench_ev_make(int dev, void **ev)
{
  return GPUIPC_E_UNSUPPORTED;
}

void bench_ev_free(int dev, void *ev)
{
}

int bench_ev_record(int dev, void *ev, void *stream)
{
  return GPUIPC_E_UNSUPPORTED;
}

int bench_ev_wait(int dev, void *stream, void *ev)
{
  return GPUIPC_E_UNSUPPORTED;
}
#endif
