/* Copies and stream waits in a device's primary context. */
#include "cuda/cuda.h"

#include <stdbool.h>
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

/* Queue the copy on @stream; with @wait, wait for it too. */
static int copy(void *dst, const void *src, size_t n, int device,
                void *stream, bool wait, const char *who)
{
  if (n > 0 && (dst == NULL || src == NULL))
    return gpuipc__err(-EINVAL, "%s: %s is NULL", who,
                       dst == NULL ? "dst" : "src");
  if (device == -1) {
    if (n > 0)
      memmove(dst, src, n);
    return 0;
  }
  int rc = device_check(device, who);
  if (rc != 0)
    return rc;
#if GPUIPC_HAVE_CUDA
  if (n == 0)
    return 0;
  struct gpuipc__ctx_saved saved;
  rc = gpuipc__ctx_enter(device, &saved);
  if (rc != 0)
    return rc;
  CUstream s = (CUstream)stream;
  rc = GPUIPC_CU(cuMemcpyAsync, (CUdeviceptr)(uintptr_t)dst,
                 (CUdeviceptr)(uintptr_t)src, n, s);
  if (rc == 0 && wait)
    rc = GPUIPC_CU(cuStreamSynchronize, s);
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
  return copy(dst, src, n, device, stream, true, "gpuipc_memcpy");
}

int gpuipc_memcpy_async(void *dst, const void *src, size_t n, int device,
                        void *stream)
{
  return copy(dst, src, n, device, stream, false, "gpuipc_memcpy_async");
}

int gpuipc_stream_sync(int device, void *stream)
{
  int rc = device_check(device, "gpuipc_stream_sync");
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
