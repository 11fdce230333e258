/*
 * What the helper processes of the GPU-ordering tests on the fake CUDA
 * driver share (chan_order_peer.c, chan_close_peer.c, chan_kernel_peer.c,
 * chan_away_peer.c): a created stream of device 0 (or another) with its
 * primary context current, a
 * channel opened for them, a 1-D byte tensor on device 0, and the fake's
 * counters. Included only where GPUIPC_HAVE_CUDA; link with -ldl.
 */
#ifndef GPUIPC_TEST_CU_PEER_H
#define GPUIPC_TEST_CU_PEER_H

#include "test.h"

#include "cuda/cuda.h"

#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CU_OK(fn, ...) ASSERT_OK(GPUIPC_CU(fn, __VA_ARGS__))

/* A created, non-blocking stream of device @dev, its primary context
 * current. */
static inline CUstream cu_stream_on(int dev)
{
  ASSERT_OK(gpuipc_driver_status(NULL));
  CUcontext ctx;
  CU_OK(cuDevicePrimaryCtxRetain, &ctx, dev);
  CU_OK(cuCtxSetCurrent, ctx);
  CUstream s;
  CU_OK(cuStreamCreate, &s, CU_STREAM_NON_BLOCKING);
  return s;
}

/* The same on device 0. */
static inline CUstream cu_stream_make(void)
{
  return cu_stream_on(0);
}

/* Channel @name of @dom, 30 s timeouts; on device 0 when @dev0. */
static inline gpuipc_channel_t *cu_chan_open(gpuipc_domain_t *dom,
                                             const char *name, bool dev0)
{
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.timeout_ms = 30000;
  if (dev0) {
    o.device = 0;
    o.device_set = 1;
  }
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, name, &o, &ch));
  return ch;
}

/* The fake driver's export @name (tests/fake_cuda/fake_cuda.h); fails the
 * test when the driver loaded is not the fake. It stays loaded (gpuipc's
 * handle), so the address stays good after the dlclose. */
static inline void *cu_fake_fn(const char *name)
{
  void *fake = dlopen(getenv("GPUIPC_CUDA_LIB"), RTLD_NOW | RTLD_NOLOAD);
  void *fn = fake != NULL ? dlsym(fake, name) : NULL;
  if (fn == NULL)
    TFAIL("the CUDA driver loaded is not the fake, or has no %s", name);
  dlclose(fake);
  return fn;
}

/* The fake driver's counter @name. */
static inline int cu_fake_count(const char *name)
{
  return ((int (*)(void))cu_fake_fn(name))();
}

/* The fake driver's primary-context retains of device @dev. */
static inline int cu_fake_retains(int dev)
{
  return ((int (*)(int))cu_fake_fn("fake_cuda_retains"))(dev);
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
