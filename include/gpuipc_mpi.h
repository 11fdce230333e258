/*
 * gpuipc_mpi — gpuipc domains for the ranks of an MPI communicator.
 *
 * An optional component: libgpuipc_mpi, built when CMake finds MPI, on top
 * of libgpuipc. Link both (the CMake target gpuipc::gpuipc_mpi does).
 * The conventions of gpuipc.h hold, with these additions:
 *  - Every function here is collective over @comm: all its ranks call it,
 *    in the same order, or it does not return.
 *  - A failure on any rank fails the call on every rank (each returns the
 *    same code), so that no rank is left waiting for the others.
 *  - gpuipc_mpi_last_error() gives the sentence of the last failure of a
 *    gpuipc_mpi call on this thread (the MPI call or the argument; or, when
 *    gpuipc failed, what gpuipc_last_error() said).
 *  - MPI must be initialised; the functions are as thread-safe as the MPI
 *    library's thread level makes collective calls on @comm.
 *
 * Settings (environment, read at each call):
 *  GPUIPC_NODE_ID  a testing aid. Ranks that share a machine but have
 *                  different values (non-negative integers) behave as if
 *                  they were on different machines: the NODE and DEVICE
 *                  scopes split by it in addition to shared memory. Unset
 *                  means 0.
 */
#ifndef GPUIPC_MPI_H
#define GPUIPC_MPI_H

#include <mpi.h>

#include "gpuipc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which ranks of a communicator share one domain. */
typedef enum gpuipc_mpi_scope {
  /* Ranks on one machine (MPI_Comm_split_type, MPI_COMM_TYPE_SHARED). */
  GPUIPC_MPI_SCOPE_NODE = 1,
  /*
   * Ranks on one machine using the same GPU, compared by UUID (Umpire's
   * "socket" scope). A rank's GPU is the device of the CUDA context current
   * on the calling thread (what cudaSetDevice makes current), else device
   * 0. Ranks that see no GPU at all (no driver, no device, or
   * GPUIPC_NO_CUDA=1) use the "host device": all such ranks of a machine
   * form one scope, as with GPUIPC_MPI_SCOPE_NODE.
   */
  GPUIPC_MPI_SCOPE_DEVICE = 2,
} gpuipc_mpi_scope_t;

/*
 * gpuipc_mpi_scope_comm - the communicator of the ranks of @comm that share
 * a scope with the calling rank (a new communicator; MPI_Comm_free it).
 * Ranks keep their relative order from @comm, so rank 0 of the result is
 * the scope's lowest rank of @comm: the one that hosts the broker in
 * gpuipc_domain_join_mpi. Collective over @comm.
 * Returns 0; -EINVAL (NULL @out, MPI_COMM_NULL, unknown scope, MPI not
 * initialised, GPUIPC_NODE_ID not a non-negative integer); -EIO when an
 * MPI call failed (the sentence names it). Like every call here, it fails
 * on every rank alike.
 */
int gpuipc_mpi_scope_comm(MPI_Comm comm, gpuipc_mpi_scope_t scope,
                          MPI_Comm *out);

/*
 * gpuipc_domain_join_mpi - join, with the ranks of @comm in the same
 * @scope, a domain of their own.
 * The domain's name is "mpi-" and 22 characters of [A-Za-z0-9_-]: 128
 * random bits drawn by the scope's rank 0 and broadcast, so that separate jobs, separate
 * communicators and separate calls never meet in one domain. The scope's
 * rank 0 joins first and hosts the broker; the others join after it (the
 * broker moves to another member if it leaves first, as for any domain).
 * Segments are then opened with gpuipc_segment_open as on any domain:
 * GPUIPC_WAIT lets readers wait for a writer without an MPI_Barrier.
 * @out: the domain; leave it with gpuipc_domain_leave (not collective).
 * Collective over @comm. Returns 0 on every rank, or on every rank the
 * code of the first rank (in @comm's order) that failed: -EINVAL as for
 * gpuipc_mpi_scope_comm or NULL @out; what gpuipc_domain_join returns;
 * -EIO when an MPI call failed.
 */
int gpuipc_domain_join_mpi(MPI_Comm comm, gpuipc_mpi_scope_t scope,
                           gpuipc_domain_t **out);

/*
 * gpuipc_mpi_last_error - the sentence of the last failure of a gpuipc_mpi
 * call on this thread ("" when none). Valid until the next gpuipc call on
 * this thread.
 */
const char *gpuipc_mpi_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* GPUIPC_MPI_H */
