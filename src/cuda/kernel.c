/*
 * gpuipc's device code: two kernels. gpuipc_copy_blocks copies a block
 * batch (a thread block a copy, the list read from pinned host memory)
 * and, given a word, writes the batch's release there as the other does.
 * gpuipc_copy_word copies a channel message into the
 * receiver's memory and, once every block has read its part of the
 * sender's buffer, writes the message's release word. One launch per
 * message (2.9 to 4 us of CPU on an H200) instead of a copy and a stream
 * memory operation (3.9 to 5 us and 1 us, and a pause of the stream
 * between them: 0.8 to 2 us of GPU time a message).
 *
 * The kernel ships as PTX text (below), compiled by the driver on first use
 * in each device's primary context and cached by it (CUDA_CACHE_PATH). Its
 * source is src/cuda/copy_kernel.cu; the PTX is what
 * `nvcc -ptx -arch=compute_75` makes of it, with the header lowered to PTX
 * ISA 6.0 / sm_60, which any driver gpuipc supports can compile (the body
 * uses no newer instruction). tests/kernel_ptx.py compiles the source and
 * checks that the two agree. One grid-stride loop copies 16 bytes a thread,
 * four at a time, block 0 copies the tail bytes, then every block counts
 * itself; the last writes @value to @word.
 *
 * Each block's loads of @src have completed when it passes the barrier
 * (their values were stored), so the last block to count itself knows the
 * whole buffer has been read: the word it writes tells the sender it may
 * reuse the buffer. The writes to @dst are the receiver's and are ordered
 * by its stream like any kernel's. The counter is back at 0 (and that is
 * visible on the device: the fence) before the word lets anyone start the
 * next launch that uses it. A release needs no fence at system scope: the
 * word orders nothing the sender reads (measured on an H200: a
 * __threadfence_system there cost 0.8 us of GPU time a launch).
 *
 * The same kernel stages a sender's message (@sys set): it copies the
 * caller's tensor into a staging slot and writes the message's ready word,
 * which another process's stream (or host) waits on before it reads the
 * slot, maybe from another GPU. That word must follow every byte written,
 * as seen from anywhere: each block fences at system scope before it
 * counts itself, and the last one again (when there are others) before the
 * word. One launch instead of a copy and a stream memory operation.
 */
#include "cuda/cuda.h"

#include <pthread.h>
#include <stdlib.h>

#if GPUIPC_HAVE_CUDA

static const char copy_ptx[] =
    ".version 6.0\n"
    ".target sm_60\n"
    ".address_size 64\n"
    "\n"
    " // .globl  gpuipc_copy_word\n"
    "\n"
    ".visible .entry gpuipc_copy_word(\n"
    " .param .u64 gpuipc_copy_word_param_0,\n"
    " .param .u64 gpuipc_copy_word_param_1,\n"
    " .param .u64 gpuipc_copy_word_param_2,\n"
    " .param .u32 gpuipc_copy_word_param_3,\n"
    " .param .u64 gpuipc_copy_word_param_4,\n"
    " .param .u64 gpuipc_copy_word_param_5,\n"
    " .param .u64 gpuipc_copy_word_param_6,\n"
    " .param .u32 gpuipc_copy_word_param_7\n"
    ")\n"
    ".maxntid 256, 1, 1\n"
    "{\n"
    " .reg .pred   %p<14>;\n"
    " .reg .b16   %rs<2>;\n"
    " .reg .b32   %r<53>;\n"
    " .reg .b64   %rd<56>;\n"
    "\n"
    "\n"
    " ld.param.u64   %rd22, [gpuipc_copy_word_param_0];\n"
    " ld.param.u64   %rd23, [gpuipc_copy_word_param_1];\n"
    " ld.param.u64   %rd19, [gpuipc_copy_word_param_2];\n"
    " ld.param.u32   %r3, [gpuipc_copy_word_param_3];\n"
    " ld.param.u64   %rd24, [gpuipc_copy_word_param_4];\n"
    " ld.param.u64   %rd20, [gpuipc_copy_word_param_5];\n"
    " ld.param.u64   %rd21, [gpuipc_copy_word_param_6];\n"
    " ld.param.u32   %r4, [gpuipc_copy_word_param_7];\n"
    " cvta.to.global.u64   %rd1, %rd24;\n"
    " cvta.to.global.u64   %rd2, %rd22;\n"
    " cvta.to.global.u64   %rd3, %rd23;\n"
    " mov.u32   %r1, %nctaid.x;\n"
    " cvt.u64.u32   %rd4, %r1;\n"
    " mov.u32   %r5, %ntid.x;\n"
    " mul.wide.u32   %rd5, %r1, %r5;\n"
    " mov.u32   %r2, %ctaid.x;\n"
    " mul.wide.u32   %rd25, %r2, %r5;\n"
    " mov.u32   %r6, %tid.x;\n"
    " cvt.u64.u32   %rd6, %r6;\n"
    " add.s64   %rd54, %rd25, %rd6;\n"
    " mul.lo.s64   %rd8, %rd5, 3;\n"
    " add.s64   %rd26, %rd54, %rd8;\n"
    " setp.ge.u64   %p1, %rd26, %rd19;\n"
    " @%p1 bra   $L__BB0_3;\n"
    "\n"
    " cvt.u64.u32   %rd27, %r5;\n"
    " mul.lo.s64   %rd28, %rd4, %rd27;\n"
    " shl.b64   %rd9, %rd28, 4;\n"
    " shl.b64   %rd29, %rd54, 4;\n"
    " add.s64   %rd53, %rd2, %rd29;\n"
    " neg.s64   %rd11, %rd28;\n"
    " shl.b64   %rd37, %rd11, 4;\n"
    "\n"
    "$L__BB0_2:\n"
    " shl.b64   %rd30, %rd54, 4;\n"
    " add.s64   %rd31, %rd3, %rd30;\n"
    " shl.b64   %rd32, %rd5, 2;\n"
    " shl.b64   %rd33, %rd5, 4;\n"
    " add.s64   %rd34, %rd31, %rd33;\n"
    " ld.global.nc.v4.u32   {%r8, %r9, %r10, %r11}, [%rd34];\n"
    " add.s64   %rd35, %rd34, %rd9;\n"
    " ld.global.nc.v4.u32   {%r16, %r17, %r18, %r19}, [%rd35];\n"
    " add.s64   %rd36, %rd35, %rd9;\n"
    " ld.global.nc.v4.u32   {%r24, %r25, %r26, %r27}, [%rd36];\n"
    " add.s64   %rd38, %rd34, %rd37;\n"
    " ld.global.nc.v4.u32   {%r32, %r33, %r34, %r35}, [%rd38];\n"
    " st.global.v4.u32   [%rd53], {%r32, %r33, %r34, %r35};\n"
    " add.s64   %rd39, %rd53, %rd9;\n"
    " st.global.v4.u32   [%rd39], {%r8, %r9, %r10, %r11};\n"
    " add.s64   %rd40, %rd39, %rd9;\n"
    " st.global.v4.u32   [%rd40], {%r16, %r17, %r18, %r19};\n"
    " add.s64   %rd41, %rd40, %rd9;\n"
    " add.s64   %rd53, %rd41, %rd9;\n"
    " st.global.v4.u32   [%rd41], {%r24, %r25, %r26, %r27};\n"
    " add.s64   %rd54, %rd32, %rd54;\n"
    " add.s64   %rd42, %rd54, %rd8;\n"
    " setp.lt.u64   %p2, %rd42, %rd19;\n"
    " @%p2 bra   $L__BB0_2;\n"
    "\n"
    "$L__BB0_3:\n"
    " setp.ge.u64   %p3, %rd54, %rd19;\n"
    " @%p3 bra   $L__BB0_5;\n"
    "\n"
    "$L__BB0_4:\n"
    " shl.b64   %rd43, %rd54, 4;\n"
    " add.s64   %rd44, %rd3, %rd43;\n"
    " add.s64   %rd45, %rd2, %rd43;\n"
    " ld.global.nc.v4.u32   {%r40, %r41, %r42, %r43}, [%rd44];\n"
    " st.global.v4.u32   [%rd45], {%r40, %r41, %r42, %r43};\n"
    " add.s64   %rd54, %rd54, %rd5;\n"
    " setp.lt.u64   %p4, %rd54, %rd19;\n"
    " @%p4 bra   $L__BB0_4;\n"
    "\n"
    "$L__BB0_5:\n"
    " cvt.u32.u64   %r48, %rd6;\n"
    " setp.ge.u32   %p5, %r48, %r3;\n"
    " setp.ne.s32   %p6, %r2, 0;\n"
    " or.pred    %p7, %p6, %p5;\n"
    " @%p7 bra   $L__BB0_7;\n"
    "\n"
    " shl.b64   %rd46, %rd19, 4;\n"
    " add.s64   %rd47, %rd3, %rd46;\n"
    " add.s64   %rd48, %rd47, %rd6;\n"
    " ld.global.nc.u8   %rs1, [%rd48];\n"
    " add.s64   %rd49, %rd2, %rd46;\n"
    " add.s64   %rd50, %rd49, %rd6;\n"
    " st.global.u8   [%rd50], %rs1;\n"
    "\n"
    "$L__BB0_7:\n"
    " bar.sync   0;\n"
    " setp.ne.s32   %p8, %r48, 0;\n"
    " @%p8 bra   $L__BB0_15;\n"
    "\n"
    " setp.eq.s32   %p9, %r4, 0;\n"
    " @%p9 bra   $L__BB0_10;\n"
    "\n"
    " membar.sys;\n"
    "\n"
    "$L__BB0_10:\n"
    " atom.global.add.u32   %r50, [%rd1], 1;\n"
    " add.s32   %r51, %r1, -1;\n"
    " setp.ne.s32   %p10, %r50, %r51;\n"
    " @%p10 bra   $L__BB0_15;\n"
    "\n"
    " atom.global.exch.b32   %r52, [%rd1], 0;\n"
    " setp.gt.u32   %p11, %r1, 1;\n"
    " setp.ne.s32   %p12, %r4, 0;\n"
    " and.pred    %p13, %p11, %p12;\n"
    " @%p13 bra   $L__BB0_13;\n"
    " bra.uni   $L__BB0_12;\n"
    "\n"
    "$L__BB0_13:\n"
    " membar.sys;\n"
    " bra.uni   $L__BB0_14;\n"
    "\n"
    "$L__BB0_12:\n"
    " membar.gl;\n"
    "\n"
    "$L__BB0_14:\n"
    " cvta.to.global.u64   %rd51, %rd20;\n"
    " st.volatile.global.u64   [%rd51], %rd21;\n"
    "\n"
    "$L__BB0_15:\n"
    " ret;\n"
    "\n"
    "}\n"
    " // .globl  gpuipc_copy_blocks\n"
    ".visible .entry gpuipc_copy_blocks(\n"
    " .param .u64 gpuipc_copy_blocks_param_0,\n"
    " .param .u32 gpuipc_copy_blocks_param_1,\n"
    " .param .u64 gpuipc_copy_blocks_param_2,\n"
    " .param .u64 gpuipc_copy_blocks_param_3,\n"
    " .param .u64 gpuipc_copy_blocks_param_4\n"
    ")\n"
    ".maxntid 512, 1, 1\n"
    "{\n"
    " .reg .pred   %p<13>;\n"
    " .reg .b16   %rs<2>;\n"
    " .reg .b32   %r<26>;\n"
    " .reg .b64   %rd<37>;\n"
    " // demoted variable\n"
    " .shared .align 8 .b8 _ZZ18gpuipc_copy_blocksE1e[24];\n"
    "\n"
    " ld.param.u64   %rd16, [gpuipc_copy_blocks_param_0];\n"
    " ld.param.u32   %r6, [gpuipc_copy_blocks_param_1];\n"
    " ld.param.u64   %rd19, [gpuipc_copy_blocks_param_2];\n"
    " ld.param.u64   %rd17, [gpuipc_copy_blocks_param_3];\n"
    " ld.param.u64   %rd18, [gpuipc_copy_blocks_param_4];\n"
    " cvta.to.global.u64   %rd1, %rd19;\n"
    " mov.u32   %r25, %ctaid.x;\n"
    " setp.lt.u32   %p1, %r25, %r6;\n"
    " @%p1 bra   $L__BB1_1;\n"
    " bra.uni   $L__BB1_12;\n"
    "\n"
    "$L__BB1_1:\n"
    " mov.u32   %r7, %tid.x;\n"
    " cvt.u64.u32   %rd2, %r7;\n"
    " shl.b32   %r8, %r7, 3;\n"
    " mov.u32   %r9, _ZZ18gpuipc_copy_blocksE1e;\n"
    " add.s32   %r2, %r9, %r8;\n"
    " mov.u32   %r10, %ntid.x;\n"
    " cvt.u64.u32   %rd3, %r10;\n"
    " mov.u32   %r3, %nctaid.x;\n"
    " cvta.to.global.u64   %rd4, %rd16;\n"
    "\n"
    "$L__BB1_2:\n"
    " cvt.u32.u64   %r11, %rd2;\n"
    " setp.gt.u32   %p2, %r11, 2;\n"
    " @%p2 bra   $L__BB1_4;\n"
    "\n"
    " mul.wide.u32   %rd20, %r25, 3;\n"
    " add.s64   %rd21, %rd20, %rd2;\n"
    " shl.b64   %rd22, %rd21, 3;\n"
    " add.s64   %rd23, %rd4, %rd22;\n"
    " ld.global.nc.u64   %rd24, [%rd23];\n"
    " st.shared.u64   [%r2], %rd24;\n"
    "\n"
    "$L__BB1_4:\n"
    " bar.sync   0;\n"
    " ld.shared.u64   %rd5, [_ZZ18gpuipc_copy_blocksE1e+16];\n"
    " ld.shared.u64   %rd6, [_ZZ18gpuipc_copy_blocksE1e];\n"
    " ld.shared.u64   %rd7, [_ZZ18gpuipc_copy_blocksE1e+8];\n"
    " or.b64    %rd26, %rd7, %rd6;\n"
    " and.b64    %rd27, %rd26, 15;\n"
    " setp.ne.s64   %p3, %rd27, 0;\n"
    " mov.u64   %rd35, 0;\n"
    " @%p3 bra   $L__BB1_9;\n"
    "\n"
    " shr.u64   %rd8, %rd5, 4;\n"
    " setp.le.u64   %p4, %rd8, %rd2;\n"
    " @%p4 bra   $L__BB1_8;\n"
    "\n"
    " mov.u64   %rd34, %rd2;\n"
    "\n"
    "$L__BB1_7:\n"
    " shl.b64   %rd28, %rd34, 4;\n"
    " add.s64   %rd29, %rd6, %rd28;\n"
    " add.s64   %rd30, %rd7, %rd28;\n"
    " ld.v4.u32   {%r12, %r13, %r14, %r15}, [%rd30];\n"
    " st.v4.u32   [%rd29], {%r12, %r13, %r14, %r15};\n"
    " add.s64   %rd34, %rd34, %rd3;\n"
    " setp.lt.u64   %p5, %rd34, %rd8;\n"
    " @%p5 bra   $L__BB1_7;\n"
    "\n"
    "$L__BB1_8:\n"
    " and.b64    %rd35, %rd5, -16;\n"
    "\n"
    "$L__BB1_9:\n"
    " add.s64   %rd36, %rd35, %rd2;\n"
    " setp.ge.u64   %p6, %rd36, %rd5;\n"
    " @%p6 bra   $L__BB1_11;\n"
    "\n"
    "$L__BB1_10:\n"
    " add.s64   %rd31, %rd7, %rd36;\n"
    " ld.u8   %rs1, [%rd31];\n"
    " add.s64   %rd32, %rd6, %rd36;\n"
    " st.u8   [%rd32], %rs1;\n"
    " add.s64   %rd36, %rd36, %rd3;\n"
    " setp.lt.u64   %p7, %rd36, %rd5;\n"
    " @%p7 bra   $L__BB1_10;\n"
    "\n"
    "$L__BB1_11:\n"
    " bar.sync   0;\n"
    " add.s32   %r25, %r25, %r3;\n"
    " setp.lt.u32   %p8, %r25, %r6;\n"
    " @%p8 bra   $L__BB1_2;\n"
    "\n"
    "$L__BB1_12:\n"
    " mov.u32   %r20, %tid.x;\n"
    " setp.ne.s32   %p9, %r20, 0;\n"
    " setp.eq.s64   %p10, %rd17, 0;\n"
    " or.pred    %p11, %p9, %p10;\n"
    " @%p11 bra   $L__BB1_15;\n"
    "\n"
    " atom.global.add.u32   %r21, [%rd1], 1;\n"
    " mov.u32   %r22, %nctaid.x;\n"
    " add.s32   %r23, %r22, -1;\n"
    " setp.ne.s32   %p12, %r21, %r23;\n"
    " @%p12 bra   $L__BB1_15;\n"
    "\n"
    " atom.global.exch.b32   %r24, [%rd1], 0;\n"
    " membar.gl;\n"
    " cvta.to.global.u64   %rd33, %rd17;\n"
    " st.volatile.global.u64   [%rd33], %rd18;\n"
    "\n"
    "$L__BB1_15:\n"
    " ret;\n"
    "\n"
    "}\n"
    "\n";

#define THREADS 256 /* the kernel's block (its .maxntid) */
#define BLOCKS_PER_SM 4

#define BLOCK_THREADS 512 /* gpuipc_copy_blocks' block (its .maxntid) */

struct kdev {
  int state; /* 0 not tried, 1 loaded, -1 cannot (atomic) */
  CUmodule mod; /* kept for the life of the process */
  CUfunction fn, fn_blocks;
  unsigned grid_max, sms;
};

static struct kdev kdevs[GPUIPC__DEV_SLOTS];
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

/* Load the kernel in @dev's primary context (current), once. */
static int kernel_load(int dev, struct kdev *k)
{
  int st = __atomic_load_n(&k->state, __ATOMIC_ACQUIRE);
  if (GPUIPC__LIKELY(st == 1))
    return 0;
  if (st < 0)
    return GPUIPC_E_UNSUPPORTED;
  pthread_mutex_lock(&load_lock);
  int rc = 0;
  st = __atomic_load_n(&k->state, __ATOMIC_RELAXED);
  if (st == 0) {
    int sms = 0;
    const struct gpuipc__dev *d = gpuipc__dev_get(dev);
    if (gpuipc__cu.cuModuleLoadData == NULL ||
        gpuipc__cu.cuModuleGetFunction == NULL ||
        gpuipc__cu.cuLaunchKernel == NULL)
      rc = gpuipc__err(GPUIPC_E_UNSUPPORTED, "the CUDA driver cannot "
                       "launch kernels");
    else if ((rc = GPUIPC_CU(cuModuleLoadData, &k->mod, copy_ptx)) == 0 &&
             (rc = GPUIPC_CU(cuModuleGetFunction, &k->fn, k->mod,
                             "gpuipc_copy_word")) == 0 &&
             (rc = GPUIPC_CU(cuModuleGetFunction, &k->fn_blocks, k->mod,
                             "gpuipc_copy_blocks")) == 0)
      rc = GPUIPC_CU(cuDeviceGetAttribute, &sms,
                     CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d->cu_dev);
    if (rc == 0 && sms <= 0)
      rc = gpuipc__err(GPUIPC_E_UNSUPPORTED, "device %d reports %d "
                       "multiprocessors", dev, sms);
    /* The module stays loaded for the life of the process, like the
     * primary context it lives in. */
    if (rc == 0) {
      k->grid_max = (unsigned)sms * BLOCKS_PER_SM;
      k->sms = (unsigned)sms;
    }
    else
      GPUIPC_LOG_I("device %d: no copy kernel, channel copies use the copy "
                   "engine: %s", dev, gpuipc_last_error());
    __atomic_store_n(&k->state, rc == 0 ? 1 : -1, __ATOMIC_RELEASE);
  } else if (st < 0) {
    rc = GPUIPC_E_UNSUPPORTED;
  }
  pthread_mutex_unlock(&load_lock);
  return rc != 0 ? GPUIPC_E_UNSUPPORTED : 0;
}

int gpuipc__copy_word(int dev, void *dst, const void *src, size_t n,
                      void *stream, uint64_t word, uint64_t value,
                      uint64_t count, bool sys)
{
  if (dev < 0 || dev >= GPUIPC__DEV_SLOTS || n == 0 || word == 0 ||
      count == 0 || ((uintptr_t)dst | (uintptr_t)src) % 16 != 0)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED, "the copy kernel does not take "
                       "this copy (device %d, %zu bytes)", dev, n);
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(dev, &saved);
  if (rc != 0)
    return rc;
  struct kdev *k = &kdevs[dev];
  rc = kernel_load(dev, k);
  if (rc == 0) {
    unsigned long long n16 = n / 16;
    unsigned int ntail = (unsigned int)(n % 16);
    unsigned long long grid = (n16 + THREADS - 1) / THREADS;
    if (grid > k->grid_max)
      grid = k->grid_max;
    if (grid == 0)
      grid = 1;
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)dst;
    CUdeviceptr s = (CUdeviceptr)(uintptr_t)src;
    CUdeviceptr c = (CUdeviceptr)count, w = (CUdeviceptr)word;
    unsigned long long v = value;
    unsigned int fence_sys = sys ? 1u : 0u;
    void *args[] = {&d, &s, &n16, &ntail, &c, &w, &v, &fence_sys};
    rc = GPUIPC_CU(cuLaunchKernel, k->fn, (unsigned)grid, 1, 1, THREADS, 1,
                   1, 0, (CUstream)stream, args, NULL);
  }
  gpuipc__ctx_leave(&saved);
  return rc;
}

int gpuipc__copy_blocks(int dev, const uint64_t *list, unsigned n,
                        void *stream, uint64_t count, uint64_t word,
                        uint64_t value)
{
  if (dev < 0 || dev >= GPUIPC__DEV_SLOTS || n == 0 || list == NULL ||
      (word != 0 && count == 0))
    return gpuipc__err(GPUIPC_E_UNSUPPORTED, "the block kernel does not "
                       "take this batch (device %d, %u copies)", dev, n);
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(dev, &saved);
  if (rc != 0)
    return rc;
  struct kdev *k = &kdevs[dev];
  rc = kernel_load(dev, k);
  CUdeviceptr l = 0;
  if (rc == 0 &&
      gpuipc__cu.cuMemHostGetDevicePointer(&l, (void *)list, 0) !=
          CUDA_SUCCESS)
    rc = gpuipc__err(GPUIPC_E_UNSUPPORTED, "the block list at %p is not "
                     "pinned for device %d", (const void *)list, dev);
  if (rc == 0) {
    /* As many blocks as fit the device at once (2048 threads an SM), at
     * most one a copy. */
    unsigned grid = k->sms * (2048 / BLOCK_THREADS);
    if (grid > n)
      grid = n;
    CUdeviceptr c = (CUdeviceptr)count, w = (CUdeviceptr)word;
    unsigned long long v = value;
    void *args[] = {&l, &n, &c, &w, &v};
    rc = GPUIPC_CU(cuLaunchKernel, k->fn_blocks, grid, 1, 1, BLOCK_THREADS,
                   1, 1, 0, (CUstream)stream, args, NULL);
  }
  gpuipc__ctx_leave(&saved);
  return rc;
}

int gpuipc__pinned_alloc(int dev, size_t bytes, uint64_t **out)
{
  void *p = NULL;
  size_t len = (bytes + 4095) & ~(size_t)4095;
  if (gpuipc__cuda_load() != 0 || gpuipc__cu.cuMemHostRegister == NULL)
    return GPUIPC_E_UNSUPPORTED;
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(dev, &saved);
  if (rc != 0)
    return rc;
  if (posix_memalign(&p, 4096, len) != 0)
    rc = gpuipc__err(-ENOMEM, "out of memory for %zu bytes", len);
  /* Portable: every device reaches it, whichever context registered it. */
  if (rc == 0)
    rc = GPUIPC_CU(cuMemHostRegister, p, len,
                   CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
  gpuipc__ctx_leave(&saved);
  if (rc != 0) {
    free(p);
    return rc;
  }
  *out = p;
  return 0;
}

void gpuipc__pinned_free(int dev, uint64_t *p)
{
  if (p == NULL)
    return;
  struct gpuipc__ctx_saved saved;
  if (gpuipc__ctx_enter(dev, &saved) == 0) {
    gpuipc__cu.cuMemHostUnregister(p);
    gpuipc__ctx_leave(&saved);
  }
  free(p);
}

/*
 * Counters: blocks of GPUIPC__COUNTERS, cut from chunks of device memory
 * that are never given back (cuMemFree waits for the whole device), and
 * kept for the next channel when one is put back. A launch leaves its
 * counter at 0, so a block whose launches have all completed is ready
 * for reuse as it is.
 */
#define CHUNK_BLOCKS 64 /* blocks of a chunk: the bits of its map */
#define CHUNKS 64       /* chunks of a device: 4096 channels receiving */

struct cdev {
  CUdeviceptr chunk[CHUNKS];
  uint64_t used[CHUNKS];
  int nchunks;
};

static struct cdev cdevs[GPUIPC__DEV_SLOTS];
static pthread_mutex_t counter_lock = PTHREAD_MUTEX_INITIALIZER;

#define BLOCK_BYTES ((size_t)GPUIPC__COUNTERS * 4)

int gpuipc__counters_get(int dev, uint64_t *out)
{
  if (dev < 0 || dev >= GPUIPC__DEV_SLOTS)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED, "device %d: no counters", dev);
  struct cdev *c = &cdevs[dev];
  pthread_mutex_lock(&counter_lock);
  int rc = 0;
  for (int i = 0; i < c->nchunks; i++)
    if (~c->used[i] != 0) {
      int b = __builtin_ctzll(~c->used[i]);
      c->used[i] |= 1ull << b;
      *out = (uint64_t)(c->chunk[i] + (size_t)b * BLOCK_BYTES);
      goto unlock;
    }
  if (c->nchunks == CHUNKS) {
    rc = gpuipc__err(GPUIPC_E_UNSUPPORTED, "device %d: all %d counter "
                     "blocks in use", dev, CHUNKS * CHUNK_BLOCKS);
    goto unlock;
  }
  struct gpuipc__ctx_saved saved;
  rc = gpuipc__ctx_enter(dev, &saved);
  if (rc != 0)
    goto unlock;
  CUdeviceptr p = 0;
  rc = GPUIPC_CU(cuMemAlloc, &p, BLOCK_BYTES * CHUNK_BLOCKS);
  if (rc == 0) {
    rc = GPUIPC_CU(cuMemsetD8, p, 0, BLOCK_BYTES * CHUNK_BLOCKS);
    if (rc != 0)
      gpuipc__cu.cuMemFree(p);
  }
  gpuipc__ctx_leave(&saved);
  if (rc == 0) {
    c->chunk[c->nchunks] = p;
    c->used[c->nchunks++] = 1;
    *out = (uint64_t)p;
  }
unlock:
  pthread_mutex_unlock(&counter_lock);
  return rc;
}

void gpuipc__counters_put(int dev, uint64_t p)
{
  if (dev < 0 || dev >= GPUIPC__DEV_SLOTS || p == 0)
    return;
  struct cdev *c = &cdevs[dev];
  pthread_mutex_lock(&counter_lock);
  for (int i = 0; i < c->nchunks; i++)
    if (p >= c->chunk[i] && p < c->chunk[i] + BLOCK_BYTES * CHUNK_BLOCKS)
      c->used[i] &= ~(1ull << ((p - c->chunk[i]) / BLOCK_BYTES));
  pthread_mutex_unlock(&counter_lock);
}
#else
int gpuipc__copy_word(int dev, void *dst, const void *src, size_t n,
                      void *stream, uint64_t word, uint64_t value,
                      uint64_t count, bool sys)
{
  return GPUIPC_E_UNSUPPORTED;
}

int gpuipc__counters_get(int dev, uint64_t *out)
{
  return GPUIPC_E_UNSUPPORTED;
}

int gpuipc__copy_blocks(int dev, const uint64_t *list, unsigned n,
                        void *stream, uint64_t count, uint64_t word,
                        uint64_t value)
{
  return GPUIPC_E_UNSUPPORTED;
}

int gpuipc__pinned_alloc(int dev, size_t bytes, uint64_t **out)
{
  return GPUIPC_E_UNSUPPORTED;
}

void gpuipc__pinned_free(int dev, uint64_t *p)
{
}

void gpuipc__counters_put(int dev, uint64_t p)
{
}
#endif
