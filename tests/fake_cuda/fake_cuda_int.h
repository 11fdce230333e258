/*
 * What the files of the fake CUDA driver share (fake_cuda.h says what the
 * fake is, for the tests): the initialisation state and contexts, the
 * settings read from the environment, the bytes of its IPC handles, and
 * the entry points each file implements, which fake_cuda.c's table hands
 * out through cuGetProcAddress.
 *   fake_cuda.c    init, devices, contexts, host registration, the table
 *   fake_mem.c     device memory and its IPC (cuMemAlloc, cuIpc*MemHandle)
 *   fake_stream.c  copies, streams and events (interprocess ones too)
 *   fake_kernel.c  modules and launches (gpuipc's copy kernel, the
 *                  bench's kernels), cuMemsetD8
 * Nothing here is exported: the library reaches the fake through
 * cuGetProcAddress, the tests through fake_cuda.h's counters.
 */
#ifndef GPUIPC_FAKE_CUDA_INT_H
#define GPUIPC_FAKE_CUDA_INT_H

#define _GNU_SOURCE /* memfd_create */
#include <cuda.h>

#include "fake_cuda.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define FAKE_HIDDEN __attribute__((visibility("hidden")))

struct CUctx_st {
  int dev;
};

FAKE_HIDDEN extern struct CUctx_st fake_primary_ctx[FAKE_CUDA_MAX_DEV];
FAKE_HIDDEN extern atomic_int fake_initialized;
FAKE_HIDDEN extern atomic_int fake_before_init;
FAKE_HIDDEN extern __thread CUcontext fake_current;

static inline int env_int(const char *name, int def)
{
  const char *v = getenv(name);
  return v != NULL && v[0] != '\0' ? atoi(v) : def;
}

static inline int version(void)
{
  return env_int("FAKE_CUDA_VERSION", 13000);
}

static inline int ndev(void)
{
  int n = env_int("FAKE_CUDA_NDEV", FAKE_CUDA_MAX_DEV);
  return n < 0 ? 0 : n > FAKE_CUDA_MAX_DEV ? FAKE_CUDA_MAX_DEV : n;
}

/* Entry points other than cuInit and the version/error queries need it. */
#define NEED_INIT()                                                            \
  do {                                                                         \
    if (!atomic_load(&fake_initialized)) {                                     \
      atomic_fetch_add(&fake_before_init, 1);                                  \
      return CUDA_ERROR_NOT_INITIALIZED;                                       \
    }                                                                          \
  } while (0)
#define NEED_DEV(d)                                                            \
  do {                                                                         \
    if ((d) < 0 || (d) >= ndev())                                              \
      return CUDA_ERROR_INVALID_DEVICE;                                        \
  } while (0)

/* ----- fake_mem.c: the bytes of an IPC handle, shared with events ----- */
#define FAKE_MEM_MAGIC 0x484d4b46u /* "FKMH" */
#define FAKE_EV_MAGIC 0x56454b46u  /* "FKEV" */

/* What a CUipcMemHandle / CUipcEventHandle of this fake says. */
struct ipc_bytes {
  uint32_t magic;
  uint32_t pid;
  int32_t fd, fd2;
  uint64_t size;
  /* Memory: the allocation's number in its process, so that a handle of
   * memory allocated where freed memory was (its fd's number reused)
   * differs from the old one's, as a driver's handles do. */
  uint64_t serial;
};
FAKE_HIDDEN void fake_ipc_put(char reserved[64], const struct ipc_bytes *b);
/* Open another process's fd @fd as this process's own (close-on-exec). */
FAKE_HIDDEN int fake_fd_of(uint32_t pid, int32_t fd);
FAKE_HIDDEN void *fake_map_fd(int fd, size_t n);

/* The entry points (cuda.h's prototypes, checked by fake_cuda.c's table). */
FAKE_HIDDEN CUresult fake_cuMemAlloc(CUdeviceptr *p, size_t n);
FAKE_HIDDEN CUresult fake_cuMemFree(CUdeviceptr p);
FAKE_HIDDEN CUresult fake_cuMemGetAddressRange(CUdeviceptr *base, size_t *size,
                                               CUdeviceptr p);
FAKE_HIDDEN CUresult fake_cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p);
FAKE_HIDDEN CUresult fake_cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h,
                                             unsigned int flags);
FAKE_HIDDEN CUresult fake_cuIpcCloseMemHandle(CUdeviceptr p);
FAKE_HIDDEN CUresult fake_cuMemHostGetDevicePointer(CUdeviceptr *d, void *p,
                                                    unsigned int flags);
FAKE_HIDDEN CUresult fake_cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src,
                                        size_t n, CUstream h);
#if CUDA_VERSION >= 13000
FAKE_HIDDEN CUresult fake_cuMemcpyBatchAsync(CUdeviceptr *dsts,
                                             CUdeviceptr *srcs,
                                             size_t *sizes, size_t count,
                                             CUmemcpyAttributes *attrs,
                                             size_t *attr_idxs,
                                             size_t nattrs, CUstream h);
#endif
FAKE_HIDDEN CUresult fake_cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src,
                                        size_t n, CUstream h);
FAKE_HIDDEN CUresult fake_cuStreamWriteValue64(CUstream h, CUdeviceptr addr,
                                          cuuint64_t value, unsigned flags);
FAKE_HIDDEN CUresult fake_cuStreamWaitValue64(CUstream h, CUdeviceptr addr,
                                         cuuint64_t value, unsigned flags);
FAKE_HIDDEN CUresult fake_cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n);
FAKE_HIDDEN CUresult fake_cuMemcpyHtoD(CUdeviceptr dst, const void *src,
                                       size_t n);
FAKE_HIDDEN CUresult fake_cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n);
FAKE_HIDDEN CUresult fake_cuStreamCreate(CUstream *ph, unsigned int flags);
FAKE_HIDDEN CUresult fake_cuStreamDestroy(CUstream h);
FAKE_HIDDEN CUresult fake_cuStreamGetCtx(CUstream h, CUcontext *pctx);
FAKE_HIDDEN CUresult fake_cuStreamQuery(CUstream h);
FAKE_HIDDEN CUresult fake_cuStreamSynchronize(CUstream h);
FAKE_HIDDEN CUresult fake_cuCtxSynchronize(void);
FAKE_HIDDEN CUresult fake_cuStreamWaitEvent(CUstream h, CUevent ev,
                                            unsigned int flags);
FAKE_HIDDEN CUresult fake_cuEventCreate(CUevent *ev, unsigned int flags);
FAKE_HIDDEN CUresult fake_cuEventDestroy(CUevent ev);
FAKE_HIDDEN CUresult fake_cuEventRecord(CUevent ev, CUstream h);
FAKE_HIDDEN CUresult fake_cuEventQuery(CUevent ev);
FAKE_HIDDEN CUresult fake_cuEventSynchronize(CUevent ev);
FAKE_HIDDEN CUresult fake_cuIpcGetEventHandle(CUipcEventHandle *h, CUevent ev);
FAKE_HIDDEN CUresult fake_cuIpcOpenEventHandle(CUevent *ph, CUipcEventHandle h);
FAKE_HIDDEN CUresult fake_cuModuleLoadData(CUmodule *mod, const void *image);
FAKE_HIDDEN CUresult fake_cuModuleGetFunction(CUfunction *f, CUmodule mod,
                                              const char *name);
FAKE_HIDDEN CUresult fake_cuLaunchKernel(CUfunction f, unsigned gx,
                                         unsigned gy, unsigned gz,
                                         unsigned bx, unsigned by,
                                         unsigned bz, unsigned shmem,
                                         CUstream h, void **params,
                                         void **extra);
FAKE_HIDDEN CUresult fake_cuMemsetD8(CUdeviceptr p, unsigned char v, size_t n);
/* fake_stream.c, for fake_kernel.c: queue the copy kernel's work on @h
 * (the current context's stream): the copy of @n bytes, checked against
 * the counter at @count, then *@word = @value. */
FAKE_HIDDEN CUresult fake_stream_copy_word(CUstream h, CUdeviceptr dst,
                                           CUdeviceptr src, size_t n,
                                           CUdeviceptr count,
                                           CUdeviceptr word, uint64_t value);

/* fake_stream.c, for fake_kernel.c: queue a call of @fn(@a) on @h (the
 * current context's stream), done in the stream's order like a copy. */
FAKE_HIDDEN CUresult fake_stream_call(CUstream h,
                                      void (*fn)(const uint64_t a[4]),
                                      const uint64_t a[4]);

#endif
