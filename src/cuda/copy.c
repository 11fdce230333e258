/* Copies and stream waits in a device's primary context. */
#include "cuda/cuda.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static int device_check(int device, const char *who)
{
  int rc = gpuipc__cuda_load();
  if (rc != 0)
    return rc;
  if (device < 0 || device >= gpuipc__dev_count())
    return gpuipc__err(-EINVAL, "%s: device %d is not one of the %d visible",
                       who, device, gpuipc__dev_count());
  return 0;
}

/*
 * Queue @count copies on @stream in order (the driver's device-to-device
 * copy with GPUIPC_MEMCPY_DEVICE); with @wait, wait for them and what was
 * queued before them too. Every argument is checked first. Copies of 0
 * bytes are skipped: when all are, nothing is queued or waited for. (Not
 * gpuipc__stream_copy_batch: its cuMemcpyBatchAsync promises no order
 * between the copies, and moved 16 KiB blocks at 14 GB/s on an H100.)
 */
static int copies(void *const *dst, const void *const *src, const size_t *n,
                  size_t count, int device, void *stream, unsigned flags,
                  bool wait, const char *who)
{
  if (flags & ~(unsigned)GPUIPC_MEMCPY_DEVICE)
    return gpuipc__err(-EINVAL, "%s: unknown flags 0x%x", who,
                       flags & ~(unsigned)GPUIPC_MEMCPY_DEVICE);
  if (count > 0 && (dst == NULL || src == NULL || n == NULL))
    return gpuipc__err(-EINVAL, "%s: %s is NULL with %zu copies", who,
                       dst == NULL ? "dst" : src == NULL ? "src" : "n",
                       count);
  size_t work = 0;
  for (size_t i = 0; i < count; i++) {
    if (n[i] > 0 && (dst[i] == NULL || src[i] == NULL)) {
      const char *what = dst[i] == NULL ? "dst" : "src";
      if (count == 1)
        return gpuipc__err(-EINVAL, "%s: %s is NULL", who, what);
      return gpuipc__err(-EINVAL, "%s: copy %zu of %zu: %s is NULL", who, i,
                         count, what);
    }
    work += n[i] > 0;
  }
  if (device == -1) {
    for (size_t i = 0; i < count; i++)
      if (n[i] > 0)
        memmove(dst[i], src[i], n[i]);
    return 0;
  }
  int rc = device_check(device, who);
  if (rc != 0 || work == 0)
    return rc;
#if GPUIPC_HAVE_CUDA
  struct gpuipc__ctx_saved saved;
  rc = gpuipc__ctx_enter(device, &saved);
  if (rc != 0)
    return rc;
  for (size_t i = 0; i < count && rc == 0; i++) {
    if (n[i] == 0)
      continue;
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)dst[i];
    CUdeviceptr s = (CUdeviceptr)(uintptr_t)src[i];
    if ((flags & GPUIPC_MEMCPY_DEVICE) &&
        gpuipc__cu.cuMemcpyDtoDAsync != NULL)
      rc = GPUIPC_CU(cuMemcpyDtoDAsync, d, s, n[i], (CUstream)stream);
    else
      rc = GPUIPC_CU(cuMemcpyAsync, d, s, n[i], (CUstream)stream);
    if (rc != 0 && count > 1) {
      char why[256];
      snprintf(why, sizeof(why), "%s", gpuipc_last_error());
      gpuipc__err(rc, "%s: copy %zu of %zu (%zu bytes): %s", who, i, count,
                  n[i], why);
    }
  }
  if (rc == 0 && wait)
    rc = GPUIPC_CU(cuStreamSynchronize, (CUstream)stream);
  gpuipc__ctx_leave(&saved);
  return rc;
#else
  (void)stream;
  (void)wait;
  return rc;
#endif
}

int gpuipc_memcpy(void *dst, const void *src, size_t n, int device,
                  void *stream)
{
  return copies(&dst, &src, &n, 1, device, stream, 0, true, "gpuipc_memcpy");
}

int gpuipc_memcpy_batch(void *const *dst, const void *const *src,
                        const size_t *n, size_t count, int device,
                        void *stream, unsigned flags)
{
  return copies(dst, src, n, count, device, stream, flags, false,
                "gpuipc_memcpy_batch");
}

int gpuipc__memcpy_async(void *dst, const void *src, size_t n, int device,
                         void *stream)
{
  return copies(&dst, &src, &n, 1, device, stream, 0, false,
                "gpuipc__memcpy_async");
}

/* NULL and CU_STREAM_LEGACY ((void *)1) name the same stream. */
static void *stream_norm(void *s)
{
  return s == (void *)1 ? NULL : s;
}

int gpuipc__stream_order(int device, void *after, void *before)
{
  if (stream_norm(after) == stream_norm(before))
    return 0;
#if GPUIPC_HAVE_CUDA
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(device, &saved);
  if (rc != 0)
    return rc;
  CUstream b = (CUstream)before;
  if (gpuipc__cu.cuStreamQuery != NULL &&
      gpuipc__cu.cuStreamQuery(b) == CUDA_SUCCESS)
    goto leave_ctx; /* nothing of @before's left to wait for */
  CUevent ev;
  GPUIPC_CU_GOTO(rc, leave_ctx, cuEventCreate, &ev, CU_EVENT_DISABLE_TIMING);
  GPUIPC_CU_GOTO(rc, destroy_ev, cuEventRecord, ev, b);
  rc = GPUIPC_CU(cuStreamWaitEvent, (CUstream)after, ev, 0);
destroy_ev:
  gpuipc__cu.cuEventDestroy(ev); /* freed once the wait is done with it */
leave_ctx:
  gpuipc__ctx_leave(&saved);
  return rc;
#else
  (void)device;
  return 0;
#endif
}

int gpuipc__stream_sync(int device, void *stream)
{
  int rc = device_check(device, "gpuipc__stream_sync");
  if (rc != 0)
    return rc;
#if GPUIPC_HAVE_CUDA
  struct gpuipc__ctx_saved saved;
  rc = gpuipc__ctx_enter(device, &saved);
  if (rc != 0)
    return rc;
  rc = GPUIPC_CU(cuStreamSynchronize, (CUstream)stream);
  gpuipc__ctx_leave(&saved);
  return rc;
#else
  (void)stream;
  return rc;
#endif
}

#if GPUIPC_HAVE_CUDA && CUDA_VERSION >= 12080
/* One batched call: every copy after the stream's earlier work. */
static int copy_batch(void *const *dst, const void *const *src,
                      const size_t *n, size_t count, void *stream)
{
  CUmemcpyAttributes attr;
  memset(&attr, 0, sizeof(attr));
  attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  size_t attr_idx = 0;
  /* The driver takes arrays it does not write; its prototype is not const. */
  CUdeviceptr *d = (CUdeviceptr *)(uintptr_t)dst;
  CUdeviceptr *s = (CUdeviceptr *)(uintptr_t)src;
  size_t *sizes = (size_t *)(uintptr_t)n;
  _Static_assert(sizeof(CUdeviceptr) == sizeof(void *),
                 "device pointers are host pointers' size");
#if CUDA_VERSION >= 13000
  return GPUIPC_CU(cuMemcpyBatchAsync, d, s, sizes, count, &attr, &attr_idx,
                   1, (CUstream)stream);
#else
  size_t fail = 0;
  return GPUIPC_CU(cuMemcpyBatchAsync, d, s, sizes, count, &attr, &attr_idx,
                   1, &fail, (CUstream)stream);
#endif
}

struct batch_arg {
  void *const *dst;
  const void *const *src;
  const size_t *n;
  size_t count;
};

static int batch_fn(void *stream, void *arg)
{
  const struct batch_arg *b = arg;
  return copy_batch(b->dst, b->src, b->n, b->count, stream);
}
#endif

int gpuipc__stream_copy_batch(int dev, void *const *dst,
                              const void *const *src, const size_t *n,
                              size_t count, void *stream)
{
#if GPUIPC_HAVE_CUDA
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(dev, &saved);
  if (rc != 0)
    return rc;
#if CUDA_VERSION >= 12080
  if (gpuipc__cu.cuMemcpyBatchAsync != NULL && count > 0) {
    struct batch_arg b = {dst, src, n, count};
    /* The legacy default stream (what PyTorch uses) the batch call
     * refuses: it runs on a stream of gpuipc's own, between two events. */
    if (stream != NULL && stream != (void *)CU_STREAM_LEGACY)
      rc = batch_fn(stream, &b);
    else
      rc = gpuipc__stream_aside_run(dev, stream, batch_fn, &b);
    if (rc == 0) {
      gpuipc__ctx_leave(&saved);
      return 0;
    }
    /* A batch is checked before it is queued (the failure index of 12.8
     * is where that check stopped): copy one by one, which also says
     * which copy fails, if one does. */
    GPUIPC_LOG_D("cuMemcpyBatchAsync of %zu copies refused (%s): one by one",
                 count, gpuipc_last_error());
    rc = 0;
  }
#endif
  for (size_t i = 0; i < count && rc == 0; i++)
    rc = GPUIPC_CU(cuMemcpyAsync, (CUdeviceptr)(uintptr_t)dst[i],
                   (CUdeviceptr)(uintptr_t)src[i], n[i], (CUstream)stream);
  gpuipc__ctx_leave(&saved);
  return rc;
#else
  (void)dev;
  (void)dst;
  (void)src;
  (void)n;
  (void)count;
  (void)stream;
  return gpuipc__err(GPUIPC_E_UNSUPPORTED, "channel: this build has no CUDA "
                     "support for device copies");
#endif
}
