/*
 * Copies between host and GPU memory for the MPI path of channels, through
 * the CUDA driver, which is opened here (libgpuipc exports no copy call).
 * Entry points come from dlsym under pthread_once; the copies run in the
 * device's primary context, the one gpuipc itself uses.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "mpi/mpi_int.h"

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

typedef int cu_result;
typedef int cu_device;
typedef void *cu_context;
typedef void *cu_stream;
typedef unsigned long long cu_ptr;

static struct {
  int ok;
  char why[200];
  cu_result (*get_error_string)(cu_result, const char **);
  cu_result (*device_get)(cu_device *, int);
  cu_result (*primary_retain)(cu_context *, cu_device);
  cu_result (*ctx_push)(cu_context);
  cu_result (*ctx_pop)(cu_context *);
  cu_result (*memcpy_async)(cu_ptr, cu_ptr, size_t, cu_stream);
  cu_result (*stream_sync)(cu_stream);
} g_cu;
static pthread_once_t g_cu_once = PTHREAD_ONCE_INIT;

static void cu_open(void)
{
  const char *lib = "libcuda.so.1";
  int n = gpuipc_config_count();
  for (int i = 0; i < n; i++) {
    gpuipc_config_item_t item;
    if (gpuipc_config_get(i, &item) == 0 &&
        strcmp(item.name, "GPUIPC_CUDA_LIB") == 0 && item.value &&
        *item.value)
      lib = item.value;
  }
  void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    const char *e = dlerror();
    snprintf(g_cu.why, sizeof(g_cu.why), "dlopen(\"%s\"): %s", lib,
             e ? e : "failed");
    return;
  }
  struct {
    const char *name;
    void **fn;
  } syms[] = {
      {"cuGetErrorString", (void **)&g_cu.get_error_string},
      {"cuDeviceGet", (void **)&g_cu.device_get},
      {"cuDevicePrimaryCtxRetain", (void **)&g_cu.primary_retain},
      {"cuCtxPushCurrent_v2", (void **)&g_cu.ctx_push},
      {"cuCtxPopCurrent_v2", (void **)&g_cu.ctx_pop},
      {"cuMemcpyAsync", (void **)&g_cu.memcpy_async},
      {"cuStreamSynchronize", (void **)&g_cu.stream_sync},
  };
  for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
    *syms[i].fn = dlsym(h, syms[i].name);
    if (*syms[i].fn == NULL) {
      snprintf(g_cu.why, sizeof(g_cu.why), "%s lacks %s", lib, syms[i].name);
      return; /* the library stays loaded: harmless */
    }
  }
  g_cu.ok = 1;
}

int gpuipc__mpi_cuda_aware(void)
{
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return 0;
#endif
}

static int cu_fail(cu_result r, const char *call, int device)
{
  const char *s = NULL;
  if (g_cu.get_error_string == NULL || g_cu.get_error_string(r, &s) != 0)
    s = NULL;
  return gpuipc__mpi_fail(GPUIPC_E_CUDA, "%s on device %d failed: %s (%d)",
                          call, device, s ? s : "unknown error", r);
}

/* Make @device's primary context current on this thread (pushed). */
static int ctx_enter(int device)
{
  int rc = gpuipc_driver_status(NULL);
  if (rc != 0)
    return gpuipc__mpi_fail_gpuipc(rc);
  pthread_once(&g_cu_once, cu_open);
  if (!g_cu.ok)
    return gpuipc__mpi_fail(GPUIPC_E_NODRIVER, "CUDA driver: %s", g_cu.why);
  cu_device dev;
  cu_context ctx;
  cu_result r = g_cu.device_get(&dev, device);
  if (r != 0)
    return cu_fail(r, "cuDeviceGet", device);
  /* gpuipc keeps the primary context retained; one more reference from
   * here is kept for the life of the process, like gpuipc's. */
  static cu_context cached[64];
  ctx = device >= 0 && device < 64
            ? __atomic_load_n(&cached[device], __ATOMIC_ACQUIRE)
            : NULL;
  if (ctx == NULL) {
    r = g_cu.primary_retain(&ctx, dev);
    if (r != 0)
      return cu_fail(r, "cuDevicePrimaryCtxRetain", device);
    if (device >= 0 && device < 64)
      __atomic_store_n(&cached[device], ctx, __ATOMIC_RELEASE);
  }
  r = g_cu.ctx_push(ctx);
  if (r != 0)
    return cu_fail(r, "cuCtxPushCurrent", device);
  return 0;
}

static void ctx_leave(void)
{
  cu_context c;
  g_cu.ctx_pop(&c);
}

int gpuipc__mpi_copy(int device, void *dst, const void *src, size_t n,
                     void *stream)
{
  int rc = ctx_enter(device);
  if (rc != 0)
    return rc;
  cu_result r = g_cu.memcpy_async((cu_ptr)(uintptr_t)dst,
                                  (cu_ptr)(uintptr_t)src, n, stream);
  if (r != 0)
    rc = cu_fail(r, "cuMemcpyAsync", device);
  else if ((r = g_cu.stream_sync(stream)) != 0)
    rc = cu_fail(r, "cuStreamSynchronize", device);
  ctx_leave();
  return rc;
}

int gpuipc__mpi_stream_sync(int device, void *stream)
{
  int rc = ctx_enter(device);
  if (rc != 0)
    return rc;
  cu_result r = g_cu.stream_sync(stream);
  if (r != 0)
    rc = cu_fail(r, "cuStreamSynchronize", device);
  ctx_leave();
  return rc;
}
