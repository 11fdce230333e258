/*
 * What the helper processes of the GPU-ordering tests on the fake CUDA
 * driver share (chan_order_peer.c, chan_close_peer.c): a created stream
 * of device 0 with its primary context current, and a 1-D byte tensor on
 * device 0. Included only where GPUIPC_HAVE_CUDA.
 */
#ifndef GPUIPC_TEST_CU_PEER_H
#define GPUIPC_TEST_CU_PEER_H

#include "test.h"

#include "cuda/cuda.h"

#include <stdint.h>
#include <string.h>

#define CU_OK(fn, ...) ASSERT_OK(GPUIPC_CU(fn, __VA_ARGS__))

/* A created, non-blocking stream of device 0, its primary context current. */
static inline CUstream cu_stream_make(void)
{
  ASSERT_OK(gpuipc_driver_status(NULL));
  CUcontext ctx;
  CU_OK(cuDevicePrimaryCtxRetain, &ctx, 0);
  CU_OK(cuCtxSetCurrent, ctx);
  CUstream s;
  CU_OK(cuStreamCreate, &s, CU_STREAM_NON_BLOCKING);
  return s;
}

/* @t: @n bytes at @p on device 0 (in @buf, or NULL); @shape: its storage. */
static inline void cu_bytes_tensor(gpuipc_tensor_t *t, int64_t *shape,
                                   void *p, size_t n, gpuipc_buf_t *buf)
{
  memset(t, 0, sizeof(*t));
  shape[0] = (int64_t)n;
  t->dl.data = p;
  t->dl.device.device_type = GPUIPC_DL_CUDA;
  t->dl.device.device_id = 0;
  t->dl.ndim = 1;
  t->dl.dtype = (gpuipc_dl_dtype_t){GPUIPC_DL_UINT, 8, 1};
  t->dl.shape = shape;
  t->buf = buf;
}

#endif
