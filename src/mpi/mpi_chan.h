/*
 * Internals of the MPI channel (gpuipc_mpi_channel_*), shared by its
 * files:
 *   channel.c     the public calls: arguments, opening the pair, then the
 *                 channel's ops table
 *   shm.c         the shared-memory ops: a gpuipc channel in a domain of
 *                 the pair's own, when the two ranks share a machine
 *   p2p.c         the point-to-point ops table (MPI on the pair's
 *                 communicator, mpi_wire.h): opening, closing, and what
 *                 its two directions share
 *   p2p_send.c    its sending side, p2p_recv.c its receiving side and the
 *                 views it hands out
 * Calls go from channel.c to the ops tables (shm.c, p2p.c) and from there
 * down (p2p_send.c, p2p_recv.c, then stage.c and mpi.c), never back.
 */
#ifndef GPUIPC_MPI_CHAN_H
#define GPUIPC_MPI_CHAN_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "mpi/mpi_int.h"
#include "mpi/mpi_wire.h"

#define CHUNK_SHIFT_MIN 12 /* 4 KiB */
#define CHUNK_SHIFT_MAX 30 /* 1 GiB: MPI counts are ints */
#define CHUNKS_MAX ((uint64_t)1 << 20) /* chunks of one message */
#define CACHE_MAX 16

/* A message in flight. */
struct slot {
  uint64_t seq; /* 0: free */
  bool released;
  int nreq;
  MPI_Request *req; /* descriptor, then data chunks */
  int req_cap;
  struct wire w;
  gpuipc_buf_t *stage; /* pinned copy of staged bytes, kept for reuse */
};

struct ack {
  struct ack *next;
  MPI_Request req;
  struct wire w;
};

struct gpuipc_mpi_channel;

/*
 * What a path implements: the public call of the same name after its
 * arguments were checked (shared memory in shm.c, point-to-point in
 * p2p.c). Each returns what the public call does, its failure recorded
 * for gpuipc_mpi_last_error().
 */
struct gpuipc__mpi_chan_ops {
  /* Collective on ch->pair: the outcome agreed by both ranks. */
  int (*open)(struct gpuipc_mpi_channel *ch,
              const gpuipc_channel_opts_t *opts);
  int (*send)(struct gpuipc_mpi_channel *ch, const gpuipc_tensor_t *t,
              void *stream, unsigned flags, uint64_t *ticket);
  int (*send_done)(struct gpuipc_mpi_channel *ch, uint64_t ticket,
                   int timeout_ms);
  int (*send_wait)(struct gpuipc_mpi_channel *ch, uint64_t ticket,
                   void *stream, int timeout_ms);
  int (*on_release)(struct gpuipc_mpi_channel *ch, gpuipc_mpi_release_fn fn,
                    void *user);
  int (*progress)(struct gpuipc_mpi_channel *ch);
  int (*recv)(struct gpuipc_mpi_channel *ch, gpuipc_tensor_t **view,
              void *stream, int timeout_ms);
  int (*recv_into)(struct gpuipc_mpi_channel *ch, const gpuipc_tensor_t *dst,
                   void *stream, int timeout_ms);
  /* Undo open; the caller then drops the open channel's reference. */
  void (*close)(struct gpuipc_mpi_channel *ch);
};

extern const struct gpuipc__mpi_chan_ops gpuipc__mpi_shm_ops;
extern const struct gpuipc__mpi_chan_ops gpuipc__mpi_p2p_ops;

struct gpuipc_mpi_channel {
  const struct gpuipc__mpi_chan_ops *ops;
  /* Shared-memory path. */
  gpuipc_channel_t *shm;
  gpuipc_domain_t *dom;
  /* MPI path. */
  MPI_Comm pair;
  int peer; /* in @pair */
  uint32_t depth;
  int send_timeout_ms;  /* resolved: ms, 0 (no wait) or -1 (forever) */
  int dflt_timeout_ms;  /* GPUIPC_TIMEOUT_DEFAULT on the MPI path */
  int rx_device; /* ordinal for GPU views; -1: HOST */
  bool aware;
  unsigned chunk_shift; /* GPUIPC_MPI_CHUNK_KB; 0: built-in sizes */
  int refs;      /* the open channel and each live view (atomic) */
  int peer_closed; /* the peer's MSG_CLOSE arrived (atomic) */

  pthread_mutex_t tx_lock;
  gpuipc_mpi_release_fn on_release; /* or NULL */
  void *on_release_user;
  uint64_t next_seq;
  uint32_t in_flight;
  struct slot *slots;
  MPI_Request rel_req;
  struct wire rel_w;
  bool tx_gone;
  bool tx_bad_rel; /* the peer sent a release that breaks the protocol */
  bool tx_torn; /* a message was cut short after its descriptor went out:
                 * the peer waits for bytes that will not come */
  gpuipc_event_t *tx_ev[NEV]; /* staging copies, on device tx_ev_dev */
  int tx_ev_dev;

  pthread_mutex_t rx_lock;
  MPI_Request desc_req;
  struct wire desc_w;
  uint64_t rx_seq; /* the next seq expected */
  bool have;       /* desc_w holds the next message */
  bool rx_gone;
  bool rx_broken;
  gpuipc_buf_t *rx_stage; /* a ring of staging chunks */
  gpuipc_event_t *rx_ev[NEV]; /* copies out of them, on rx_ev_dev */
  int rx_ev_dev;

  pthread_mutex_t ack_lock; /* acks, cache, closed */
  struct ack *acks;
  gpuipc_buf_t *cache[CACHE_MAX];
  int ncache;
  bool closed;
};

/* ---- small things --------------------------------------------------------*/

static inline int64_t now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* -1: forever. */
static inline int64_t deadline_of(int timeout_ms)
{
  return timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
}

static inline bool expired(int64_t deadline)
{
  return deadline >= 0 && now_ms() >= deadline;
}

/* Chunks of 2^@shift bytes in @n bytes. */
static inline uint64_t chunk_count(uint64_t n, unsigned shift)
{
  return (n >> shift) + ((n & (((uint64_t)1 << shift) - 1)) != 0);
}

/* Bytes in chunk @c of a message of @n bytes in chunks of 2^@shift. */
static inline uint64_t chunk_len(uint64_t n, unsigned shift, uint64_t c)
{
  uint64_t off = c << shift, len = (uint64_t)1 << shift;
  return n - off < len ? n - off : len;
}

static inline bool is_host_type(int32_t t)
{
  return t == GPUIPC_DL_CPU || t == GPUIPC_DL_CUDA_HOST;
}

/* Drop a reference: the open channel's, or a view's. */
static inline void ch_unref(struct gpuipc_mpi_channel *ch)
{
  if (__atomic_sub_fetch(&ch->refs, 1, __ATOMIC_ACQ_REL) != 0)
    return;
  pthread_mutex_destroy(&ch->tx_lock);
  pthread_mutex_destroy(&ch->rx_lock);
  pthread_mutex_destroy(&ch->ack_lock);
  free(ch);
}

/* Set the callback of gpuipc_mpi_channel_on_release (under tx_lock). */
static inline void release_fn_set(struct gpuipc_mpi_channel *ch,
                                  gpuipc_mpi_release_fn fn, void *user)
{
  pthread_mutex_lock(&ch->tx_lock);
  ch->on_release = fn;
  ch->on_release_user = user;
  pthread_mutex_unlock(&ch->tx_lock);
}

/* ---- channel.c -----------------------------------------------------------*/

/* ---- p2p_send.c ----------------------------------------------------------*/

/* Take in the releases that arrived and retire finished messages. Returns
 * how many releases were taken in, or a negative code. tx_lock held. */
int gpuipc__mpi_tx_poll(struct gpuipc_mpi_channel *ch);
int gpuipc__mpi_p2p_send(struct gpuipc_mpi_channel *ch,
                         const gpuipc_tensor_t *t, void *stream,
                         unsigned flags, uint64_t *ticket);
int gpuipc__mpi_p2p_send_done(struct gpuipc_mpi_channel *ch, uint64_t ticket,
                              int timeout_ms);
int gpuipc__mpi_p2p_send_wait(struct gpuipc_mpi_channel *ch, uint64_t ticket,
                              void *stream, int timeout_ms);
int gpuipc__mpi_p2p_progress(struct gpuipc_mpi_channel *ch);

/* ---- p2p_recv.c ----------------------------------------------------------*/

int gpuipc__mpi_p2p_recv(struct gpuipc_mpi_channel *ch, gpuipc_tensor_t **view,
                         void *stream, int timeout_ms);
int gpuipc__mpi_p2p_recv_into(struct gpuipc_mpi_channel *ch,
                              const gpuipc_tensor_t *dst, void *stream,
                              int timeout_ms);
/* Whether @t is a view gpuipc__mpi_p2p_recv made (by the magic after it,
 * as src/channel knows its views). */
bool gpuipc__mpi_is_view(const gpuipc_tensor_t *t);
/* gpuipc_mpi_tensor_release of such a view. */
int gpuipc__mpi_view_release(gpuipc_tensor_t *t, void *stream);

#endif /* GPUIPC_MPI_CHAN_H */
