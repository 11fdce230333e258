/*
 * Primary contexts: gpuipc works in each device's primary context, the one
 * the runtime API uses, so that memory it allocates and maps is usable by a
 * program written against the runtime. Each is retained once, on first
 * use, and kept for the life of the process.
 */
#include "cuda/cuda.h"

#include <pthread.h>
#include <stdio.h>

#if GPUIPC_HAVE_CUDA

static pthread_mutex_t retain_lock = PTHREAD_MUTEX_INITIALIZER;

static int primary_get(struct gpuipc__dev *d, CUcontext *out)
{
  CUcontext c = __atomic_load_n(&d->primary, __ATOMIC_ACQUIRE);
  if (GPUIPC__LIKELY(c != NULL)) {
    *out = c;
    return 0;
  }
  int rc = 0;
  pthread_mutex_lock(&retain_lock);
  c = __atomic_load_n(&d->primary, __ATOMIC_RELAXED);
  if (c == NULL) {
    rc = GPUIPC_CU(cuDevicePrimaryCtxRetain, &c, d->cu_dev);
    if (rc == 0)
      __atomic_store_n(&d->primary, c, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&retain_lock);
  if (rc != 0) {
    char why[256];
    snprintf(why, sizeof(why), "%s", gpuipc_last_error());
    return gpuipc__err(rc, "device %d: %s", d->ordinal, why);
  }
  *out = c;
  return 0;
}

int gpuipc__ctx_enter(int ordinal, struct gpuipc__ctx_saved *saved)
{
  if (saved == NULL)
    return gpuipc__err(-EINVAL, "gpuipc__ctx_enter: saved is NULL");
  int rc = gpuipc__cuda_load();
  if (rc != 0)
    return rc;
  /* The table is the loader's; only the primary field changes after load,
   * and only here, atomically. */
  struct gpuipc__dev *d = (struct gpuipc__dev *)gpuipc__dev_get(ordinal);
  if (d == NULL)
    return gpuipc__err(-ERANGE,
                       "device %d is not visible (this process "
                       "sees %d)",
                       ordinal, gpuipc__dev_count());
  CUcontext prim, cur = NULL;
  rc = primary_get(d, &prim);
  if (rc != 0)
    return rc;
  rc = GPUIPC_CU(cuCtxGetCurrent, &cur);
  if (rc != 0)
    return rc;
  if (cur != prim) {
    rc = GPUIPC_CU(cuCtxSetCurrent, prim);
    if (rc != 0)
      return rc;
  }
  saved->ctx = cur;
  saved->changed = cur != prim;
  return 0;
}

void gpuipc__ctx_leave(const struct gpuipc__ctx_saved *saved)
{
  if (saved == NULL || !saved->changed)
    return;
  if (GPUIPC_CU(cuCtxSetCurrent, (CUcontext)saved->ctx) != 0)
    GPUIPC_LOG_W("restoring the caller's CUDA context: %s",
                 gpuipc_last_error());
}

int gpuipc__ctx_in_use(void)
{
  if (!gpuipc__cuda_in_process())
    return -1;
  CUcontext cur = NULL;
  CUdevice cd;
  if (gpuipc__cu.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur != NULL &&
      gpuipc__cu.cuCtxGetDevice(&cd) == CUDA_SUCCESS) {
    int i = gpuipc__dev_ordinal(cd);
    if (i >= 0)
      return i;
  }
  int n = gpuipc__dev_count();
  for (int i = 0; i < n; i++) {
    const struct gpuipc__dev *d = gpuipc__dev_get(i);
    unsigned flags = 0;
    int active = 0;
    if (__atomic_load_n(&d->primary, __ATOMIC_ACQUIRE) != NULL ||
        (gpuipc__cu.cuDevicePrimaryCtxGetState(d->cu_dev, &flags, &active) ==
             CUDA_SUCCESS &&
         active))
      return i;
  }
  return -1;
}

#else /* !GPUIPC_HAVE_CUDA */

int gpuipc__ctx_enter(int ordinal, struct gpuipc__ctx_saved *saved)
{
  if (saved == NULL)
    return gpuipc__err(-EINVAL, "gpuipc__ctx_enter: saved is NULL");
  return gpuipc__cuda_load();
}

void gpuipc__ctx_leave(const struct gpuipc__ctx_saved *saved)
{
}

int gpuipc__ctx_in_use(void)
{
  return -1;
}

#endif /* GPUIPC_HAVE_CUDA */
