/*
 * Internals of libgpuipc_mpi shared by its files: failure sentences,
 * agreement of outcomes, scopes and domains (mpi.c), staging copies for
 * GPU memory (stage.c); the channel's own are in mpi_chan.h. Never
 * exported: the library hides every symbol not marked GPUIPC_MPI_API.
 */
#ifndef GPUIPC_MPI_INT_H
#define GPUIPC_MPI_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/private.h"
#include "gpuipc_mpi.h"

#define GPUIPC_MPI_API __attribute__((visibility("default")))

/* Record a failure sentence for gpuipc_mpi_last_error(); returns @code. */
__attribute__((format(printf, 2, 3))) int gpuipc__mpi_fail(int code,
                                                           const char *fmt,
                                                           ...);
/* A failure gpuipc described: its sentence stands. Returns @code. */
int gpuipc__mpi_fail_gpuipc(int code);
/* An MPI call failed with @mrc: -EIO with MPI's sentence. */
int gpuipc__mpi_fail_mpi(int mrc, const char *call);
/* An MPI failure between two ranks: GPUIPC_E_PEER_GONE where MPI says
 * the peer failed, else as gpuipc__mpi_fail_mpi. */
int gpuipc__mpi_err(int mrc, const char *call);
/* Cancel and complete @r, unless it is MPI_REQUEST_NULL. */
void gpuipc__mpi_cancel(MPI_Request *r);
/* The value of gpuipc setting @name (gpuipc_config_get; never NULL: ""
 * when unset). */
const char *gpuipc__mpi_setting(const char *name);
/* Start of a public call: forget which rank an earlier failure came from. */
void gpuipc__mpi_call_begin(void);
/* Every rank of @comm learns the outcome of all (lowest failing rank's). */
int gpuipc__mpi_agree(MPI_Comm comm, int rc);
/* MPI initialised and not finalized, @comm not MPI_COMM_NULL: 0, else
 * -EINVAL with a sentence. */
int gpuipc__mpi_check_comm(MPI_Comm comm);
/* The ranks of @comm sharing @scope with this one (collective, the
 * outcome agreed: @out is set on every rank or on none). */
int gpuipc__mpi_scope_comm(MPI_Comm comm, gpuipc_mpi_scope_t scope,
                           MPI_Comm *out);
/* A new domain for the ranks of @scope: named "mpi-" and 128 bits drawn
 * by rank 0 and broadcast; rank 0 joins first, then the others (not
 * agreed: the caller agrees the outcome). */
int gpuipc__mpi_join_new(MPI_Comm scope, gpuipc_domain_t **out);

/* ---- GPU memory (stage.c) ------------------------------------------------*/

#define NEV 16 /* staging copies (and receives) in flight per direction */

/*
 * Whether to hand device pointers to MPI: GPUIPC_MPI_CUDA_AWARE "1" or
 * "0", else (unset, "auto") what MPIX_Query_cuda_support says. -EINVAL
 * with a sentence for another value.
 */
int gpuipc__mpi_cuda_aware(bool *aware);
/*
 * Copy @n bytes between any two memories (unified addressing) on @stream
 * (NULL: the legacy default stream) of device @device, and wait for the
 * copy and everything queued on @stream before it. Returns 0 or
 * GPUIPC_E_NODRIVER / GPUIPC_E_CUDA with a sentence.
 */
int gpuipc__mpi_copy(int device, void *dst, const void *src, size_t n,
                     void *stream);
/* Queue that copy on @stream and return (gpuipc__memcpy_async). */
int gpuipc__mpi_copy_async(int device, void *dst, const void *src, size_t n,
                           void *stream);
/* Wait for the work queued on @stream of @device. */
int gpuipc__mpi_stream_sync(int device, void *stream);

/*
 * GPUIPC_MPI_CHUNK_KB as the log2 of a chunk size in bytes (12..30), or 0
 * when unset or 0 (the built-in sizes). -EINVAL with a sentence for a
 * value that is not a power of two in 4..1048576.
 */
int gpuipc__mpi_chunk_setting(unsigned *shift);

/* Release the events @ev[NEV]; *@ev_dev becomes -1. */
void gpuipc__mpi_ev_free(gpuipc_event_t **ev, int *ev_dev);
/*
 * Events @ev[NEV] for copies on device @dev, made once and kept (anew when
 * the device changes). Where the device cannot make them, ev[0] stays NULL
 * and the copies are waited for one by one.
 */
void gpuipc__mpi_ev_fit(gpuipc_event_t **ev, int *ev_dev, int dev);
/*
 * Copy one staged chunk on @stream of device @dev: queued, with @ev
 * recorded after it, or (@ev NULL: no events on the device) waited for.
 */
int gpuipc__mpi_stage_copy(int dev, void *to, const void *from, uint64_t len,
                           void *stream, gpuipc_event_t *ev);
/* Grow @*buf (HOST, pinned when a GPU is there) to hold @n bytes. */
int gpuipc__mpi_stage_fit(gpuipc_buf_t **buf, uint64_t n);

#endif /* GPUIPC_MPI_INT_H */
