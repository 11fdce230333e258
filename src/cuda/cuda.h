/*
 * src/cuda: the CUDA driver, loaded at run time, and the device table.
 *
 * libcuda.so.1 (or $GPUIPC_CUDA_LIB) is dlopen()ed once under pthread_once;
 * only cuGetProcAddress comes from dlsym, every other entry point through
 * it, each marked required or optional. Nothing links against libcuda.
 *
 * Code that calls the driver includes this header and uses
 * GPUIPC_CU(call-name, args...), which turns a CUresult into GPUIPC_E_CUDA
 * and records "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
 */
#ifndef GPUIPC_CUDA_H
#define GPUIPC_CUDA_H

#include "core/core.h"

#include <stdint.h>

#if GPUIPC_HAVE_CUDA
#include <cuda.h>

/*
 * Every driver entry point gpuipc uses: X(name, required).
 * Required ones must resolve or the driver counts as unusable
 * (GPUIPC_E_NODRIVER); optional ones are NULL when missing and the feature
 * that needs them reports GPUIPC_E_UNSUPPORTED.
 */
#define GPUIPC_CU_FUNCS(X)                                                     \
  X(cuInit, 1)                                                                 \
  X(cuDriverGetVersion, 1)                                                     \
  X(cuGetErrorName, 1)                                                         \
  X(cuGetErrorString, 1)                                                       \
  X(cuDeviceGetCount, 1)                                                       \
  X(cuDeviceGet, 1)                                                            \
  X(cuDeviceGetName, 1)                                                        \
  X(cuDeviceGetUuid, 1)                                                        \
  X(cuDeviceTotalMem, 1)                                                       \
  X(cuDeviceGetAttribute, 1)                                                   \
  X(cuDeviceGetPCIBusId, 1)                                                    \
  X(cuDevicePrimaryCtxRetain, 1)                                               \
  X(cuDevicePrimaryCtxRelease, 1)                                              \
  X(cuCtxGetCurrent, 1)                                                        \
  X(cuCtxSetCurrent, 1)                                                        \
  X(cuCtxGetDevice, 1)                                                         \
  X(cuCtxSynchronize, 1)                                                       \
  X(cuMemAlloc, 1)                                                             \
  X(cuMemFree, 1)                                                              \
  X(cuMemcpy, 1)                                                               \
  X(cuMemcpyHtoD, 1)                                                           \
  X(cuMemcpyDtoH, 1)                                                           \
  X(cuMemcpyAsync, 1)                                                          \
  X(cuMemsetD8, 1)                                                             \
  X(cuMemGetAddressRange, 1)                                                   \
  X(cuMemHostRegister, 1)                                                      \
  X(cuMemHostUnregister, 1)                                                    \
  X(cuMemHostGetDevicePointer, 1)                                              \
  X(cuPointerGetAttribute, 1)                                                  \
  X(cuStreamCreate, 1)                                                         \
  X(cuStreamDestroy, 1)                                                        \
  X(cuStreamSynchronize, 1)                                                    \
  X(cuStreamWaitEvent, 1)                                                      \
  X(cuEventCreate, 1)                                                          \
  X(cuEventDestroy, 1)                                                         \
  X(cuEventRecord, 1)                                                          \
  X(cuEventSynchronize, 1)                                                     \
  X(cuEventQuery, 1)                                                           \
  X(cuIpcGetMemHandle, 0)                                                      \
  X(cuIpcOpenMemHandle, 0)                                                     \
  X(cuIpcCloseMemHandle, 0)                                                    \
  X(cuIpcGetEventHandle, 0)                                                    \
  X(cuIpcOpenEventHandle, 0)                                                   \
  X(cuMemCreate, 0)                                                            \
  X(cuMemRelease, 0)                                                           \
  X(cuMemAddressReserve, 0)                                                    \
  X(cuMemAddressFree, 0)                                                       \
  X(cuMemMap, 0)                                                               \
  X(cuMemUnmap, 0)                                                             \
  X(cuMemSetAccess, 0)                                                         \
  X(cuMemGetAllocationGranularity, 0)                                          \
  X(cuMemExportToShareableHandle, 0)                                           \
  X(cuMemImportFromShareableHandle, 0)                                         \
  X(cuMemRetainAllocationHandle, 0)                                            \
  X(cuMemGetAllocationPropertiesFromHandle, 0)                                 \
  X(cuMemPoolCreate, 0)                                                        \
  X(cuMemPoolDestroy, 0)                                                       \
  X(cuMemPoolSetAccess, 0)                                                     \
  X(cuMemPoolSetAttribute, 0)                                                  \
  X(cuMemPoolExportToShareableHandle, 0)                                       \
  X(cuMemPoolImportFromShareableHandle, 0)                                     \
  X(cuMemPoolExportPointer, 0)                                                 \
  X(cuMemPoolImportPointer, 0)                                                 \
  X(cuMemAllocFromPoolAsync, 0)                                                \
  X(cuMemFreeAsync, 0)                                                         \
  X(cuDeviceCanAccessPeer, 0)                                                  \
  X(cuDeviceGetP2PAttribute, 0)                                                \
  X(cuCtxEnablePeerAccess, 0)

/* The table of entry points; valid after gpuipc__cuda_load() returned 0. */
struct gpuipc__cu_table {
#define GPUIPC__CU_FIELD(name, req) __typeof__(&name) name;
  GPUIPC_CU_FUNCS(GPUIPC__CU_FIELD)
#undef GPUIPC__CU_FIELD
};
extern struct gpuipc__cu_table gpuipc__cu;

/*
 * Turn a CUresult into 0 or GPUIPC_E_CUDA, recording
 * "<what>: CUDA_ERROR_X (description)" for errors.
 */
int gpuipc__cu_check(CUresult r, const char *what);

/* Call entry point @fn and check: `rc = GPUIPC_CU(cuMemCreate, &h, ...)`. */
#define GPUIPC_CU(fn, ...) gpuipc__cu_check(gpuipc__cu.fn(__VA_ARGS__), #fn)

/* Call and jump to @label on failure with the status in @rc. */
#define GPUIPC_CU_GOTO(rc, label, fn, ...)                                     \
  do {                                                                         \
    (rc) = GPUIPC_CU(fn, __VA_ARGS__);                                         \
    if ((rc) != 0)                                                             \
      goto label;                                                              \
  } while (0)
#endif /* GPUIPC_HAVE_CUDA */

/*
 * Load the driver once. Returns 0, GPUIPC_E_NODRIVER or GPUIPC_E_NODEVICE
 * (the same code, and the same sentence through gpuipc__err, on every call).
 */
int gpuipc__cuda_load(void);

/* One visible device, read once at load. */
struct gpuipc__dev {
  int ordinal;
  gpuipc_device_info_t info;
#if GPUIPC_HAVE_CUDA
  CUdevice cu_dev;
  CUcontext primary; /* retained on first use (gpuipc__ctx_enter) */
#endif
};

int gpuipc__dev_count(void);               /* 0 without a driver */
const struct gpuipc__dev *gpuipc__dev_get(int ordinal); /* NULL if none */

/*
 * Make @ordinal's primary context current for the calling thread,
 * retaining it on first use; @saved receives the context that was current,
 * to be restored by gpuipc__ctx_leave. Returns 0 or a code.
 */
struct gpuipc__ctx_saved {
  void *ctx;
  int changed;
};
int gpuipc__ctx_enter(int ordinal, struct gpuipc__ctx_saved *saved);
void gpuipc__ctx_leave(const struct gpuipc__ctx_saved *saved);

#endif
