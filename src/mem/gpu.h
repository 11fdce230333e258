/*
 * src/mem: what the GPU kinds (vmm.c, legacy.c, pool.c) share, in gpu.c.
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

/*
 * POOL import statistics for tests: pools imported from other processes
 * since the start, and imported pools alive now.
 */
void gpuipc__pool_stats(uint64_t *imported, uint64_t *live);

#if GPUIPC_HAVE_CUDA
/* Grant local device @device read-write access to @b (gpuipc_buf_access). */
int gpuipc__vmm_access(struct gpuipc_buf *b, int device);
int gpuipc__pool_access(struct gpuipc_buf *b, int device);

/* Read-write access for local device @device, for cuMemSetAccess. */
void gpuipc__rw_access(CUmemAccessDesc *a, int device);

/*
 * A new export id for a handle made of memory gpuipc did not allocate
 * (gpuipc_buf_export_foreign, gpuipc_handle_from_cuda_fd): top bit set,
 * apart from the buffers' ids, never reused by this process.
 */
uint64_t gpuipc__foreign_export_id(void);

/* The VMM allocation granularity of local device @device. */
int gpuipc__vmm_granularity(int device, size_t *out);

/* The CUDA error in a CUresult, for the few callers that branch on it. */
int gpuipc__cu_oom(CUresult r, const char *what, size_t size, int device);
#endif

#endif
