/*
 * src/mem: what the GPU kinds (vmm.c, legacy.c, pool.c) share, in gpu.c,
 * and the few calls the kinds offer their neighbours beyond their
 * gpuipc__kind_ops tables (at the end, each marked with its file).
 */
#ifndef GPUIPC_MEM_GPU_H
#define GPUIPC_MEM_GPU_H

#include "cuda/cuda.h"
#include "mem/mem.h"

#include <stdbool.h>
#include <stdint.h>

/*
 * Legacy IPC shares whole blocks of this size: a LEGACY buffer is rounded
 * up to it and must start on it.
 */
#define GPUIPC__LEGACY_BLOCK ((size_t)2 << 20)

/* @x rounded up to a multiple of @align (a power of two); 0 on overflow. */
static inline size_t gpuipc__round_up(size_t x, size_t align)
{
  size_t r = (x + align - 1) & ~(align - 1);
  return r < x ? 0 : r;
}

/*
 * The devices of an import: @owner, the local ordinal of the GPU the
 * handle names (by UUID); @access, the one that will use the mapping
 * (@requested, or @owner when @requested is -1), checked for P2P reach.
 */
int gpuipc__gpu_import_devices(const gpuipc_handle_t *h, int requested,
                               const char *who, int *owner, int *access);

/* Whether @h was exported by this very process. */
bool gpuipc__handle_is_self(const gpuipc_handle_t *h);

/*
 * Whether the process (@boot_id, @pidns, @pid) is known to have exited:
 * same boot and pid namespace as ours and kill(pid, 0) finds nobody.
 */
bool gpuipc__exporter_gone(const uint8_t boot_id[16], uint64_t pidns,
                           uint32_t pid);
/*
 * The same by kill(pid, 0) alone: a few hundred nanoseconds, but an exited
 * process not yet reaped by its parent still counts as alive.
 */
bool gpuipc__exporter_gone_fast(const uint8_t boot_id[16], uint64_t pidns,
                                uint32_t pid);

#if GPUIPC_HAVE_CUDA
/* Read-write access for local device @device, for cuMemSetAccess. */
void gpuipc__rw_access(CUmemAccessDesc *a, int device);

/* The CUDA error in a CUresult, for the few callers that branch on it. */
int gpuipc__cu_oom(CUresult r, const char *what, size_t size, int device);

/* cuPointerGetAttribute(@a) of @p into @out; @name says which, on error. */
int gpuipc__ptr_attr(void *out, CUpointer_attribute a, CUdeviceptr p,
                     const char *name);
#endif

/* ----- offered by the kinds themselves ----- */

/*
 * pool.c: POOL import statistics for tests: pools imported from other
 * processes since the start, and imported pools alive now.
 */
void gpuipc__pool_stats(uint64_t *imported, uint64_t *live);

#if GPUIPC_HAVE_CUDA
/* vmm.c: the VMM allocation granularity of local device @device. */
int gpuipc__vmm_granularity(int device, size_t *out);
#endif

#endif
