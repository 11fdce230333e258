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
#include "core/private.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if GPUIPC_HAVE_CUDA
#include <cuda.h>

/*
 * The oldest driver gpuipc accepts (CUDA 12.0: cuGetProcAddress_v2, and
 * CUDA_VISIBLE_DEVICES honoured by the VMM and pool calls).
 */
#define GPUIPC_CU_MIN_DRIVER 12000

/*
 * Every driver entry point gpuipc uses: X(name, required, abi).
 * @name is the base name that cuGetProcAddress takes; the field in
 * gpuipc__cu gets the type of cuda.h's prototype for it (cuda.h maps many
 * names to a versioned symbol: cuMemAlloc is cuMemAlloc_v2).
 * @abi is the CUDA version whose variant of @name has that prototype,
 * never below GPUIPC_CU_MIN_DRIVER: cuGetProcAddress is asked for the
 * variant in force at that version. An entry point whose cuda.h prototype
 * was introduced after 12.0 (cuMemAdvise_v2 in 12.2, cuCtxCreate_v4 in
 * 12.5) must name that version here, and is then missing on older drivers.
 * Required ones must resolve or the driver counts as unusable
 * (GPUIPC_E_NODRIVER); optional ones are NULL when missing and the feature
 * that needs them reports GPUIPC_E_UNSUPPORTED.
 */
#define GPUIPC_CU_FUNCS(X)                                                     \
  X(cuInit, 1, 12000)                                                          \
  X(cuDriverGetVersion, 1, 12000)                                              \
  X(cuGetErrorName, 1, 12000)                                                  \
  X(cuGetErrorString, 1, 12000)                                                \
  X(cuDeviceGetCount, 1, 12000)                                                \
  X(cuDeviceGet, 1, 12000)                                                     \
  X(cuDeviceGetName, 1, 12000)                                                 \
  X(cuDeviceGetUuid, 1, 12000)                                                 \
  X(cuDeviceTotalMem, 1, 12000)                                                \
  X(cuDeviceGetAttribute, 1, 12000)                                            \
  X(cuDeviceGetPCIBusId, 1, 12000)                                             \
  X(cuDevicePrimaryCtxRetain, 1, 12000)                                        \
  X(cuDevicePrimaryCtxRelease, 1, 12000)                                       \
  X(cuDevicePrimaryCtxGetState, 1, 12000)                                      \
  X(cuCtxGetCurrent, 1, 12000)                                                 \
  X(cuCtxSetCurrent, 1, 12000)                                                 \
  X(cuCtxGetDevice, 1, 12000)                                                  \
  X(cuCtxSynchronize, 1, 12000)                                                \
  X(cuMemAlloc, 1, 12000)                                                      \
  X(cuMemFree, 1, 12000)                                                       \
  X(cuMemcpy, 1, 12000)                                                        \
  X(cuMemcpyHtoD, 1, 12000)                                                    \
  X(cuMemcpyDtoH, 1, 12000)                                                    \
  X(cuMemcpyAsync, 1, 12000)                                                   \
  X(cuMemcpyPeerAsync, 0, 12000)                                               \
  X(cuMemcpyDtoDAsync, 0, 12000)                                               \
  X(cuMemsetD8, 1, 12000)                                                      \
  X(cuMemGetAddressRange, 1, 12000)                                            \
  X(cuMemHostRegister, 1, 12000)                                               \
  X(cuMemHostUnregister, 1, 12000)                                             \
  X(cuMemHostGetDevicePointer, 1, 12000)                                       \
  X(cuPointerGetAttribute, 1, 12000)                                           \
  X(cuStreamCreate, 1, 12000)                                                  \
  X(cuStreamDestroy, 1, 12000)                                                 \
  X(cuStreamSynchronize, 1, 12000)                                             \
  X(cuStreamWaitEvent, 1, 12000)                                               \
  X(cuStreamQuery, 0, 12000)                                                   \
  X(cuStreamWriteValue64, 0, 12000)                                            \
  X(cuStreamWaitValue64, 0, 12000)                                             \
  X(cuEventCreate, 1, 12000)                                                   \
  X(cuEventDestroy, 1, 12000)                                                  \
  X(cuEventRecord, 1, 12000)                                                   \
  X(cuEventSynchronize, 1, 12000)                                              \
  X(cuEventQuery, 1, 12000)                                                    \
  X(cuIpcGetMemHandle, 0, 12000)                                               \
  X(cuIpcOpenMemHandle, 0, 12000)                                              \
  X(cuIpcCloseMemHandle, 0, 12000)                                             \
  X(cuIpcGetEventHandle, 0, 12000)                                             \
  X(cuIpcOpenEventHandle, 0, 12000)                                            \
  X(cuMemCreate, 0, 12000)                                                     \
  X(cuMemRelease, 0, 12000)                                                    \
  X(cuMemAddressReserve, 0, 12000)                                             \
  X(cuMemAddressFree, 0, 12000)                                                \
  X(cuMemMap, 0, 12000)                                                        \
  X(cuMemUnmap, 0, 12000)                                                      \
  X(cuMemSetAccess, 0, 12000)                                                  \
  X(cuMemGetAllocationGranularity, 0, 12000)                                   \
  X(cuMemExportToShareableHandle, 0, 12000)                                    \
  X(cuMemImportFromShareableHandle, 0, 12000)                                  \
  X(cuMemRetainAllocationHandle, 0, 12000)                                     \
  X(cuMemGetAllocationPropertiesFromHandle, 0, 12000)                          \
  X(cuMemPoolCreate, 0, 12000)                                                 \
  X(cuMemPoolDestroy, 0, 12000)                                                \
  X(cuMemPoolSetAccess, 0, 12000)                                              \
  X(cuMemPoolSetAttribute, 0, 12000)                                           \
  X(cuMemPoolExportToShareableHandle, 0, 12000)                                \
  X(cuMemPoolImportFromShareableHandle, 0, 12000)                              \
  X(cuMemPoolExportPointer, 0, 12000)                                          \
  X(cuMemPoolImportPointer, 0, 12000)                                          \
  X(cuMemAllocFromPoolAsync, 0, 12000)                                         \
  X(cuMemFreeAsync, 0, 12000)                                                  \
  X(cuDeviceCanAccessPeer, 0, 12000)                                           \
  X(cuDeviceGetP2PAttribute, 0, 12000)                                         \
  X(cuCtxEnablePeerAccess, 0, 12000)                                           \
  X(cuStreamGetCtx, 0, 12000)                                                  \
  X(cuModuleLoadData, 0, 12000)                                                \
  X(cuModuleGetFunction, 0, 12000)                                             \
  X(cuLaunchKernel, 0, 12000)                                                   \
  GPUIPC_CU_BATCH(X)

/*
 * cuMemcpyBatchAsync came in CUDA 12.8; CUDA 13.0's prototype (what cuda.h
 * 13 names cuMemcpyBatchAsync_v2) drops the failure index. Asked for at
 * the version of the headers' prototype: a driver older than that has none
 * for gpuipc, which then copies block by block (gpuipc__stream_copy_batch).
 */
#if CUDA_VERSION >= 13000
#define GPUIPC_CU_BATCH(X) X(cuMemcpyBatchAsync, 0, 13000)
#elif CUDA_VERSION >= 12080
#define GPUIPC_CU_BATCH(X) X(cuMemcpyBatchAsync, 0, 12080)
#else
#define GPUIPC_CU_BATCH(X)
#endif

/* The table of entry points; valid after gpuipc__cuda_load() returned 0. */
struct gpuipc__cu_table {
#define GPUIPC__CU_FIELD(name, req, abi) __typeof__(&name) name;
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

/*
 * NULL, CU_STREAM_LEGACY or CU_STREAM_PER_THREAD: a default stream, which
 * is the one of the context it is used in. gpuipc uses it in the primary
 * context of the device concerned (the per-thread one: the calling
 * thread's), whatever context is current, as it does for NULL.
 */
static inline int gpuipc__stream_is_default(const void *s)
{
  return s == NULL || s == (const void *)CU_STREAM_LEGACY ||
         s == (const void *)CU_STREAM_PER_THREAD;
}
#endif /* GPUIPC_HAVE_CUDA */

/*
 * Load the driver once. Returns 0, GPUIPC_E_NODRIVER or GPUIPC_E_NODEVICE
 * (the same code, and the same sentence through gpuipc__err, on every call).
 */
int gpuipc__cuda_load(void);

/*
 * Whether the driver is in this process and usable, loaded by gpuipc or by
 * anyone else (the CUDA runtime, PyTorch): then it is loaded for gpuipc
 * too (cuInit). A process that never loaded it still has not: nothing is
 * loaded to find out. Sets no error.
 */
bool gpuipc__cuda_in_process(void);

/*
 * After gpuipc__cuda_load(), whatever it returned: the driver's CUDA version
 * (13000 for 13.0), 0 when it could not be read.
 */
int gpuipc__cuda_driver_version(void);

/*
 * After gpuipc__cuda_load(): the file the driver was loaded from (as the
 * dynamic linker found it), or the configured name when it did not load.
 * Static; never NULL.
 */
const char *gpuipc__cuda_lib_path(void);

/* One visible device, read once at load. */
struct gpuipc__dev {
  int ordinal;
  gpuipc_device_info_t info;
#if GPUIPC_HAVE_CUDA
  CUdevice cu_dev;
  /* Retained on first use by gpuipc__ctx_enter, then kept for the life of
   * the process; NULL until then. Read it with __atomic_load_n. */
  CUcontext primary;
#endif
};

int gpuipc__dev_count(void);               /* 0 without a driver */
const struct gpuipc__dev *gpuipc__dev_get(int ordinal); /* NULL if none */
#if GPUIPC_HAVE_CUDA
int gpuipc__dev_ordinal(CUdevice dev); /* the visible ordinal of @dev, or -1 */
#endif

/*
 * Write @uuid as nvidia-smi does: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
 * (lower-case hex, 40 characters and a NUL).
 */
void gpuipc__uuid_str(const uint8_t uuid[16], char out[41]);

/*
 * Write a reason for a failed load into @why (truncated to @cap), for the
 * loader and gpuipc__dev_table_read.
 */
void gpuipc__why(char *why, size_t cap, const char *fmt, ...)
    GPUIPC__PRINTF(3, 4);

/*
 * Read the device table; called once by the loader after cuInit, before
 * anything can look at the table. Returns 0, or GPUIPC_E_NODEVICE /
 * GPUIPC_E_NODRIVER with the reason written to @why.
 */
int gpuipc__dev_table_read(char *why, size_t cap);

/*
 * Make @ordinal's primary context current for the calling thread,
 * retaining it on first use (once per device, for the life of the process);
 * @saved receives the context that was current, to be restored by
 * gpuipc__ctx_leave. The current context is only changed when it differs.
 * Returns 0, GPUIPC_E_NODRIVER / GPUIPC_E_NODEVICE, -ERANGE for an ordinal
 * that is not a visible device, -EINVAL for a NULL @saved, GPUIPC_E_CUDA.
 */
struct gpuipc__ctx_saved {
  void *ctx;
  int changed;
};
int gpuipc__ctx_enter(int ordinal, struct gpuipc__ctx_saved *saved);
void gpuipc__ctx_leave(const struct gpuipc__ctx_saved *saved);

/*
 * A device whose context this process has started already: that of the
 * calling thread's current context, else the first whose primary context
 * is active (retained by gpuipc or anyone else). -1 when there is none or
 * no driver in the process (gpuipc__cuda_in_process): asking starts
 * nothing. Sets no error.
 */
int gpuipc__ctx_in_use(void);

/*
 * Make stream @after wait, on the GPU, for the work queued on stream
 * @before so far (streams of local device @ordinal; NULL or (void *)1:
 * its legacy default stream). Nothing is queued when they are one stream
 * or @before has nothing pending. Returns 0, the codes of
 * gpuipc__ctx_enter, GPUIPC_E_CUDA.
 */
int gpuipc__stream_order(int ordinal, void *after, void *before);

/* ----- stream glue for the channels (stream.c) ----- */

/*
 * The local ordinal whose primary context @stream belongs to; @fallback
 * for a default stream or when the driver cannot say (and without CUDA).
 */
int gpuipc__stream_dev(void *stream, int fallback);
/*
 * Whether everything queued on @stream (of device @dev) has completed;
 * false when it cannot be told (and without CUDA).
 */
bool gpuipc__stream_idle(int dev, void *stream);
/*
 * Make @stream wait for @ev, unless @ev completes within @poll_ns. Returns
 * 0 or what the event calls return.
 */
int gpuipc__stream_wait_event(gpuipc_event_t *ev, void *stream,
                              uint64_t poll_ns);
/*
 * Queue a copy of @n bytes on @stream of device @dev (unified addressing);
 * @d2d: both ends are device memory, so the driver's device-to-device
 * copy is used (it skips the look-up of what each pointer is: 3.9 against
 * 5.2 us a call on the legacy stream of an H200).
 * Returns 0, the codes of gpuipc__ctx_enter, GPUIPC_E_CUDA;
 * GPUIPC_E_UNSUPPORTED without CUDA.
 */
int gpuipc__stream_copy_async(int dev, void *dst, const void *src, size_t n,
                              void *stream, bool d2d);
/*
 * Queue @count copies (@n[i] bytes from @src[i] to @dst[i], none
 * overlapping another's destination) on @stream of device @dev: one
 * cuMemcpyBatchAsync where the driver has it and @stream is not the legacy
 * default stream (which it refuses), else one cuMemcpyAsync a copy.
 * Returns 0, the codes of gpuipc__ctx_enter, GPUIPC_E_CUDA (naming the
 * copy); GPUIPC_E_UNSUPPORTED without CUDA. (copy.c)
 */
int gpuipc__stream_copy_batch(int dev, void *const *dst,
                              const void *const *src, const size_t *n,
                              size_t count, void *stream);

/*
 * Words: 64-bit counters in host memory registered with CUDA, which a
 * stream writes once the work queued before has completed, and another
 * process reads (or makes its own stream wait for). gpuipc__word_dev finds
 * the address device @dev's streams reach @host at: 0; GPUIPC_E_UNSUPPORTED
 * when the device or driver has no 64-bit stream memory operations, or
 * @host is not registered; the codes of gpuipc__ctx_enter.
 * gpuipc__stream_word_write queues "*@addr = @value" on @stream;
 * gpuipc__stream_word_wait makes @stream wait until *@addr >= @value
 * (64-bit, wrapping compare). Both return 0, GPUIPC_E_CUDA,
 * GPUIPC_E_UNSUPPORTED.
 */
int gpuipc__word_dev(int dev, void *host, uint64_t *addr);
int gpuipc__stream_word_write(int dev, void *stream, uint64_t addr,
                              uint64_t value);
int gpuipc__stream_word_wait(int dev, void *stream, uint64_t addr,
                             uint64_t value);
/*
 * gpuipc__stream_word_write_after: *@addr = @value once the work queued on
 * @stream so far has completed, written by a stream of gpuipc's own that
 * waits for it (an event): @stream goes on with its next work at once
 * instead of pausing for the write (0.8 to 2.5 us of GPU time each on an
 * H200), at the price of two more driver calls. Each of a device's first
 * 8 caller streams gets a stream of its own for this (later ones share
 * them). Returns 0, GPUIPC_E_CUDA, GPUIPC_E_UNSUPPORTED.
 */
int gpuipc__stream_word_write_after(int dev, void *stream, uint64_t addr,
                                    uint64_t value);
/* The same for @n words, in order, after one event. */
int gpuipc__stream_words_write_after(int dev, void *stream, int n,
                                     const uint64_t *addr,
                                     const uint64_t *value);
/*
 * gpuipc__stream_aside_run: call @fn with a stream of gpuipc's own on
 * device @dev (a CUstream) that starts after the work queued on @stream so
 * far, and make @stream's later work wait for what @fn queued there (two
 * events): for work that @stream itself cannot take, such as a batch of
 * copies on the legacy default stream. Returns @fn's return, GPUIPC_E_CUDA,
 * GPUIPC_E_UNSUPPORTED.
 */
int gpuipc__stream_aside_run(int dev, void *stream,
                             int (*fn)(void *aside, void *arg), void *arg);

/* ----- gpuipc's copy kernel (kernel.c) ----- */

/*
 * gpuipc__copy_blocks: one launch of gpuipc_copy_blocks on @stream of
 * device @dev, copying the @n copies of @list (dst, src, bytes: three u64
 * a copy), which must lie in memory from gpuipc__pinned_alloc and stay
 * there until the launch has run. With @word (a device address, not 0),
 * the launch then writes @value there once every source byte is read,
 * counting its blocks in the 4-byte counter at @count (0 when the launch
 * starts, as gpuipc__copy_word's). Returns 0, GPUIPC_E_CUDA, or
 * GPUIPC_E_UNSUPPORTED (no kernel: copy otherwise).
 */
int gpuipc__copy_blocks(int dev, const uint64_t *list, unsigned n,
                        void *stream, uint64_t count, uint64_t word,
                        uint64_t value);
/* Host memory every device reads (registered, mapped, portable), for
 * such lists, registered and unregistered in the primary context of
 * device @dev (the driver wants a context current, and the calling
 * thread may have none): 0, -ENOMEM, GPUIPC_E_CUDA, GPUIPC_E_UNSUPPORTED,
 * the codes of gpuipc__ctx_enter. */
int gpuipc__pinned_alloc(int dev, size_t bytes, uint64_t **out);
void gpuipc__pinned_free(int dev, uint64_t *p);

/* Devices that get the per-device state of the copy kernel and of the
 * words written after a stream's work; others copy and write as before. */
#define GPUIPC__DEV_SLOTS 64

/* Counters in a block (gpuipc__counters_get): one per channel slot. */
#define GPUIPC__COUNTERS 1024

/*
 * Queue on @stream (of device @dev) a copy of @n > 0 bytes from @src to
 * @dst, both device memory that @dev reaches and 16-byte aligned, by
 * gpuipc's copy kernel, which writes @value to the word at @word (a
 * device address: gpuipc__word_dev) once all of @src has been read; with
 * @sys, once all of @dst is written and visible to every device and the
 * host (a fence at system scope: the word tells another process that it
 * may read @dst). @count: a counter of a block from gpuipc__counters_get,
 * which no other launch in flight uses. Returns 0; GPUIPC_E_UNSUPPORTED when the kernel
 * does not take this copy or cannot be loaded on @dev (a driver without
 * PTX compilation: tried once, said at log level info), the caller then
 * copies otherwise; GPUIPC_E_CUDA; the codes of gpuipc__ctx_enter.
 */
int gpuipc__copy_word(int dev, void *dst, const void *src, size_t n,
                      void *stream, uint64_t word, uint64_t value,
                      uint64_t count, bool sys);
/*
 * A block of GPUIPC__COUNTERS counters at 0 in device memory of @dev
 * (0, GPUIPC_E_UNSUPPORTED, GPUIPC_E_CUDA), and giving it back once no
 * launch that uses it can still run.
 */
int gpuipc__counters_get(int dev, uint64_t *out);
void gpuipc__counters_put(int dev, uint64_t p);

#endif
