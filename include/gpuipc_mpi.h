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
 * gpuipc_mpi_domain_join. Collective over @comm.
 * Returns 0; -EINVAL (NULL @out, MPI_COMM_NULL, unknown scope, MPI not
 * initialised, GPUIPC_NODE_ID not a non-negative integer); -EIO when an
 * MPI call failed (the sentence names it). Like every call here, it fails
 * on every rank alike.
 */
int gpuipc_mpi_scope_comm(MPI_Comm comm, gpuipc_mpi_scope_t scope,
                          MPI_Comm *out);

/*
 * gpuipc_mpi_domain_join - join, with the ranks of @comm in the same
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
int gpuipc_mpi_domain_join(MPI_Comm comm, gpuipc_mpi_scope_t scope,
                           gpuipc_domain_t **out);

/* ---- channels between two ranks ---------------------------------------- */

/*
 * A channel between two ranks of a communicator, with the semantics of a
 * gpuipc channel (gpuipc.h, "Channels"): ordered, nothing dropped, at most
 * `depth` messages in flight per end, GPUIPC_E_PEER_GONE once the other
 * end has closed and everything it sent has been received. The functions
 * gpuipc_mpi_channel_send ... gpuipc_mpi_channel_close take the same arguments as
 * their gpuipc_ namesakes and return the same codes; they are not
 * collective (only gpuipc_mpi_channel_open is, over the two ranks).
 *
 * Two paths, chosen when the channel opens:
 *  - Shared memory, when the peer is on the same machine (the two ranks
 *    share MPI_COMM_TYPE_SHARED and GPUIPC_NODE_ID): the two join a domain
 *    of their own (named from 128 random bits, as gpuipc_mpi_domain_join)
 *    and open a gpuipc channel in it; every call passes through to it, and
 *    gpuipc_mpi_channel_shm() hands it out for the calls not mirrored here.
 *  - MPI, otherwise: descriptors, data and releases travel by MPI_Isend /
 *    MPI_Irecv on a communicator of the two ranks (MPI_Comm_create_group
 *    with @tag) whose error handler is MPI_ERRORS_RETURN. A received view
 *    is a buffer of the receiver's own, allocated by gpuipc (HOST, or on
 *    the receiving GPU: opts->device, else the current device; HOST when
 *    the receiver has no GPU) and reused once released. GPU memory is
 *    staged through pinned host memory with a host wait on the stream
 *    unless the MPI library takes device pointers (then, for buffers
 *    gpuipc allocated and for receive destinations, it gets them after a
 *    stream synchronisation). Whether it does: GPUIPC_MPI_CUDA_AWARE
 *    (read at open): "auto" (the default) asks MPIX_Query_cuda_support(),
 *    "1" says yes (an MPI that takes device pointers but cannot say so),
 *    "0" says no (stage even so); another value fails the open with
 *    -EINVAL. HOST buffers are sent from where they lie:
 *    as with gpuipc_channel_send, they must not be written until released
 *    (gpuipc_mpi_channel_send_done); t->buf NULL copies the bytes at once. A
 *    received view's strides and byte offset are the sender's, in a copy
 *    of the bytes from the lowest to the highest element. Both machines
 *    must share byte order and type sizes.
 *    MPI progresses a large message only inside MPI calls: the sending
 *    rank keeps it moving from any gpuipc_mpi call on the channel
 *    (gpuipc_mpi_channel_progress does nothing else).
 *    Staged GPU memory moves in a pipeline of 1-4 MiB chunks: the
 *    device->host copies, the MPI transfer and the host->device copies
 *    overlap (gpuipc_mpi_channel_send returns once every chunk is copied and
 *    posted). GPUIPC_MPI_CHUNK_KB (KiB, a power of two in 4..1048576,
 *    read at open) sets the chunk size of every message instead, HOST ones
 *    too (which otherwise go in 1 GiB chunks). Staged messages are copied
 *    when sent, so a deep sender stages far ahead of what MPI reads: for
 *    GPU tensors of 64 KiB to 64 MiB a depth of 2 to 4 is faster than 16
 *    (bytes copied just before MPI reads them are still in the caches).
 *
 * What each end can learn of the other: gpuipc_mpi_channel_close tells
 * the peer (so its calls return GPUIPC_E_PEER_GONE once it has received
 * what was sent). A rank that dies is another matter: Open MPI usually
 * ends the whole job when a rank dies, whatever the error handler; an MPI
 * library that reports it (MPI_ERR_PROC_FAILED, ULFM) makes the calls
 * return GPUIPC_E_PEER_GONE, and other MPI errors return -EIO with MPI's
 * sentence. Within a machine (shared memory) a death is always seen.
 *
 * Thread safety: as for gpuipc channels, one thread may send while another
 * receives, and gpuipc_mpi_tensor_release may be called from any thread,
 * provided MPI was initialised with MPI_THREAD_MULTIPLE; otherwise the
 * MPI path must be used from one thread at a time.
 */
typedef struct gpuipc_mpi_channel gpuipc_mpi_channel_t;

/*
 * gpuipc_mpi_channel_open - open the channel between this rank and rank
 * @peer of @comm. Collective over the two ranks: @peer calls it with this
 * rank as its peer and the same @tag; (@comm, the pair, @tag) names the
 * channel, so that two channels of one pair need two tags (0..MPI_TAG_UB).
 * @opts: as for gpuipc_channel_open (NULL: defaults; start from
 *     GPUIPC_CHANNEL_OPTS_INIT, an older smaller struct gets the defaults
 *     beyond its size); depth, send_timeout_ms and device apply to both
 *     paths, timeout_ms and the staging fields to the shared-memory one.
 *     Timeouts, here and in the calls below, follow gpuipc.h's rule
 *     ("Timeouts"); on the MPI path, which has no domain,
 *     GPUIPC_TIMEOUT_DEFAULT is the GPUIPC_TIMEOUT_MS setting.
 * @out: the channel, to be closed with gpuipc_mpi_channel_close.
 * Returns 0 on both ranks or the same code on both: -EINVAL (MPI not
 * initialised, MPI_COMM_NULL, @peer not another rank of @comm, bad @tag,
 * NULL @out, bad options, a timeout below GPUIPC_TIMEOUT_DEFAULT); -EIO (an MPI call failed); what
 * gpuipc_domain_join and gpuipc_channel_open return.
 */
int gpuipc_mpi_channel_open(MPI_Comm comm, int peer, int tag,
                            const gpuipc_channel_opts_t *opts,
                            gpuipc_mpi_channel_t **out);

/* gpuipc_mpi_channel_close - as gpuipc_channel_close. Views received stay
 * valid until released with gpuipc_mpi_tensor_release. */
int gpuipc_mpi_channel_close(gpuipc_mpi_channel_t *ch);

/* gpuipc_mpi_channel_send - as gpuipc_channel_send (tickets 1, 2, ...; same checks).
 * Tensors of any size go, as they do there. */
int gpuipc_mpi_channel_send(gpuipc_mpi_channel_t *ch, const gpuipc_tensor_t *t,
                    void *stream, unsigned flags, uint64_t *ticket);

/* gpuipc_mpi_channel_send_done - as gpuipc_channel_send_done. */
int gpuipc_mpi_channel_send_done(gpuipc_mpi_channel_t *ch, uint64_t ticket,
                         int timeout_ms);

/* gpuipc_mpi_channel_send_wait - as gpuipc_channel_send_wait. On the MPI path the
 * receiver's work on the bytes has ended before its release is sent, so
 * this waits as gpuipc_mpi_channel_send_done and @stream has nothing to wait for. */
int gpuipc_mpi_channel_send_wait(gpuipc_mpi_channel_t *ch, uint64_t ticket,
                         void *stream, int timeout_ms);

/*
 * A release callback, as gpuipc_release_fn: message @ticket was released
 * by the receiver. Called on the sending side's thread inside
 * gpuipc_mpi_channel_send, gpuipc_mpi_channel_send_done, gpuipc_mpi_channel_send_wait or
 * gpuipc_mpi_channel_progress, with the send lock held: it must not call
 * those functions on the same channel. Never called from
 * gpuipc_mpi_channel_close.
 */
typedef void (*gpuipc_mpi_release_fn)(gpuipc_mpi_channel_t *ch,
                                      uint64_t ticket, void *user);

/* gpuipc_mpi_channel_on_release - set (or clear, with NULL) the callback,
 * on either path. Returns 0 or -EINVAL (NULL @ch). */
int gpuipc_mpi_channel_on_release(gpuipc_mpi_channel_t *ch,
                                  gpuipc_mpi_release_fn fn, void *user);

/* gpuipc_mpi_channel_progress - as gpuipc_channel_progress: takes in the
 * releases that have arrived (calling the callback for each) and moves MPI
 * sends along. Returns how many were taken in, or a negative code. */
int gpuipc_mpi_channel_progress(gpuipc_mpi_channel_t *ch);

/* gpuipc_mpi_channel_recv - as gpuipc_channel_recv; release the view with
 * gpuipc_mpi_tensor_release. On the MPI path @stream orders the copy into a
 * GPU view (which has completed on return). */
int gpuipc_mpi_channel_recv(gpuipc_mpi_channel_t *ch, gpuipc_tensor_t **view,
                    void *stream, int timeout_ms);

/* gpuipc_mpi_channel_recv_into - as gpuipc_channel_recv_into (on the MPI path the copy has
 * completed on return). */
int gpuipc_mpi_channel_recv_into(gpuipc_mpi_channel_t *ch, const gpuipc_tensor_t *dst,
                         void *stream, int timeout_ms);

/* gpuipc_mpi_tensor_release - release a view from gpuipc_mpi_channel_recv (either
 * path), as gpuipc_tensor_release. */
int gpuipc_mpi_tensor_release(gpuipc_tensor_t *view, void *stream);

/* gpuipc_mpi_channel_shm - the gpuipc channel under @ch when it took the
 * shared-memory path (for gpuipc_channel_info, ...);
 * NULL on the MPI path. */
gpuipc_channel_t *gpuipc_mpi_channel_shm(gpuipc_mpi_channel_t *ch);

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
