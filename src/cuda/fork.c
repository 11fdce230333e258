/*
 * Streams of gpuipc's own for work that must overlap within one call (the
 * shared copy's copies from the publisher and from peers): made after a
 * caller's stream, joined back into it, dropped. Declared in cuda.h; stubs
 * without CUDA.
 */
#include "cuda/cuda.h"

#if GPUIPC_HAVE_CUDA
/* @after waits for the work queued on @before so far (an event, freed
 * once the wait is done with it). Context current. */
static int order(CUstream after, CUstream before)
{
  CUevent ev;
  int rc = GPUIPC_CU(cuEventCreate, &ev, CU_EVENT_DISABLE_TIMING);
  if (rc != 0)
    return rc;
  rc = GPUIPC_CU(cuEventRecord, ev, before);
  if (rc == 0)
    rc = GPUIPC_CU(cuStreamWaitEvent, after, ev, 0);
  gpuipc__cu.cuEventDestroy(ev);
  return rc;
}

int gpuipc__stream_fork(int dev, void *stream, void *out[2])
{
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(dev, &saved);
  if (rc != 0)
    return rc;
  CUstream s[2] = {NULL, NULL};
  for (int i = 0; i < 2 && rc == 0; i++) {
    rc = GPUIPC_CU(cuStreamCreate, &s[i], CU_STREAM_NON_BLOCKING);
    if (rc == 0)
      rc = order(s[i], (CUstream)stream);
  }
  if (rc != 0)
    for (int i = 0; i < 2; i++)
      if (s[i] != NULL)
        gpuipc__cu.cuStreamDestroy(s[i]);
  gpuipc__ctx_leave(&saved);
  if (rc == 0) {
    out[0] = s[0];
    out[1] = s[1];
  }
  return rc;
}

int gpuipc__stream_join(int dev, void *stream, void *const s[2])
{
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(dev, &saved);
  if (rc != 0)
    return rc;
  for (int i = 0; i < 2 && rc == 0; i++)
    rc = order((CUstream)stream, (CUstream)s[i]);
  gpuipc__ctx_leave(&saved);
  return rc;
}

void gpuipc__stream_drop(int dev, void *const s[2])
{
  struct gpuipc__ctx_saved saved;
  if (gpuipc__ctx_enter(dev, &saved) != 0)
    return;
  for (int i = 0; i < 2; i++)
    if (s[i] != NULL)
      gpuipc__cu.cuStreamDestroy((CUstream)s[i]); /* after its work */
  gpuipc__ctx_leave(&saved);
}
#else
int gpuipc__stream_fork(int dev, void *stream, void *out[2])
{
  (void)dev;
  (void)stream;
  (void)out;
  return GPUIPC_E_UNSUPPORTED;
}

int gpuipc__stream_join(int dev, void *stream, void *const s[2])
{
  (void)dev;
  (void)stream;
  (void)s;
  return GPUIPC_E_UNSUPPORTED;
}

void gpuipc__stream_drop(int dev, void *const s[2])
{
  (void)dev;
  (void)s;
}
#endif
