/*
 * The private interface of libgpuipc: functions it exports only to its own
 * companions (libgpuipc_mpi, the gpuipc CLI, the Python package, the tests
 * and benchmarks), in the version node GPUIPC_PRIVATE_1.0 of
 * src/libgpuipc.map, as glibc exports GLIBC_PRIVATE. Not installed, no
 * promise of stability: applications use include/gpuipc.h (gpuipc_memcpy
 * copies to and from GPU memory there; streams are the CUDA runtime's or
 * driver's to synchronise). The exported_symbols test checks that this
 * header, the map's private node and the library's exports are one set.
 */
#ifndef GPUIPC_PRIVATE_H
#define GPUIPC_PRIVATE_H

#include "gpuipc.h"

#include <stddef.h>

#if defined(__GNUC__)
#define GPUIPC_PRIVATE __attribute__((visibility("default")))
#else
#define GPUIPC_PRIVATE
#endif

/*
 * gpuipc__device_current - the local ordinal of the device of the CUDA
 * context current on the calling thread (as the runtime API's
 * cudaGetDevice would say once a context exists).
 * Returns the ordinal (>= 0); GPUIPC_E_NODRIVER; GPUIPC_E_NODEVICE when no
 * context is current; GPUIPC_E_CUDA.
 */
GPUIPC_PRIVATE int gpuipc__device_current(void);

/*
 * gpuipc__memcpy_async - as gpuipc_memcpy, but only queue the copy on
 * @stream and return: the copy has completed once the stream's later work
 * (an event recorded after it, gpuipc__stream_sync) says so. @src and @dst
 * must stay valid until then; pinned host memory (a HOST buffer of gpuipc)
 * lets the copy run alongside the host. With @device -1 the copy is a
 * plain memcpy, done on return.
 * Returns 0; -EINVAL; GPUIPC_E_NODRIVER; GPUIPC_E_CUDA. Thread-safe.
 */
GPUIPC_PRIVATE int gpuipc__memcpy_async(void *dst, const void *src, size_t n,
                                        int device, void *stream);

/*
 * gpuipc__stream_sync - wait until the work queued on @stream of local
 * device @device (NULL: its legacy default stream) has finished.
 * Returns 0; -EINVAL; GPUIPC_E_NODRIVER; GPUIPC_E_CUDA.
 */
GPUIPC_PRIVATE int gpuipc__stream_sync(int device, void *stream);

#endif
