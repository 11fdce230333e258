/*
 * Channels between two ranks of a communicator: a gpuipc channel in a
 * domain of the pair's own when the two share a machine, else MPI
 * point-to-point on a communicator of the pair.
 *
 * MPI path: the records and tags of mpi/mpi_wire.h. Each end keeps one
 * receive posted on TAG_DESC and one on TAG_REL. A message stays in flight
 * from gpuipc_mpi_channel_send until its release came back and its MPI sends
 * completed: `depth` of them at most.
 *
 * GPU memory that MPI cannot read (not CUDA-aware, or memory gpuipc did not
 * allocate) is staged through pinned host memory in a pipeline: the sender
 * queues device->host copies of the chunks on the stream (NEV at most in
 * flight, an event after each) and posts each chunk's MPI_Isend once its
 * copy is done; the receiver keeps NEV chunk receives posted into a ring
 * of staging chunks and queues each chunk's host->device copy as it
 * arrives, reusing a staging chunk once the copy out of it is done. So the
 * copies on both ends overlap the transfer. Staged chunks are 1 to 4 MiB:
 * large enough that a chunk's fixed costs (a copy launch, an event, an MPI
 * message: tens of microseconds) stay a few per cent of its transfer,
 * small enough that filling and draining the pipeline (one chunk's copy
 * on each end) costs little; a message is cut into four at least when it
 * can be. Other messages go in 1 GiB chunks (MPI counts are ints).
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "channel/tensor.h"
#include "mpi/mpi_int.h"
#include "mpi/mpi_wire.h"

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#define CHUNK_SHIFT_MIN 12 /* 4 KiB */
#define CHUNK_SHIFT_MAX 30 /* 1 GiB: MPI counts are ints */
#define PIPE_SHIFT_MIN 20  /* staged chunks: 1 MiB .. */
#define PIPE_SHIFT_MAX 22  /* .. 4 MiB */
#define PIPE_CHUNKS 4      /* a staged message in this many chunks at least */
#define CHUNKS_MAX ((uint64_t)1 << 20) /* chunks of one message */
#define NEV 16 /* staging copies (and receives) in flight per direction */
#define CACHE_MAX 16
#define SIZE_ABSURD ((uint64_t)1 << 48)

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

struct gpuipc_mpi_channel {
  /* Shared-memory path. */
  gpuipc_channel_t *shm;
  gpuipc_domain_t *dom;
  /* MPI path. */
  MPI_Comm pair;
  int peer; /* in @pair */
  uint32_t depth;
  int send_timeout_ms;
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

/* A view received on the MPI path: a buffer of the receiver's own. */
struct mview {
  gpuipc_tensor_t t;
  int64_t shape[GPUIPC_TENSOR_MAX_DIMS];
  int64_t strides[GPUIPC_TENSOR_MAX_DIMS];
  struct gpuipc_mpi_channel *ch;
  uint64_t seq;
  struct mview *prev, *next;
};

/* Live MPI-path views, so that gpuipc_mpi_tensor_release tells them from
 * gpuipc's without reading past a view it does not own. */
static pthread_mutex_t g_views_lock = PTHREAD_MUTEX_INITIALIZER;
static struct mview *g_views;

/* ---- small things --------------------------------------------------------*/

static int64_t now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* -1: forever. */
static int64_t deadline_of(int timeout_ms)
{
  return timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
}

static bool expired(int64_t deadline)
{
  return deadline >= 0 && now_ms() >= deadline;
}

/* An MPI failure on the pair: a dead peer where MPI says so, else -EIO. */
static int mpi_err(int mrc, const char *call)
{
#if defined(MPIX_ERR_PROC_FAILED)
  int cls = 0;
  if (MPI_Error_class(mrc, &cls) == MPI_SUCCESS &&
      cls == MPIX_ERR_PROC_FAILED)
    return gpuipc__mpi_fail(GPUIPC_E_PEER_GONE,
                            "%s: the peer rank has failed", call);
#endif
  return gpuipc__mpi_fail_mpi(mrc, call);
}

static void ch_unref(struct gpuipc_mpi_channel *ch)
{
  if (__atomic_sub_fetch(&ch->refs, 1, __ATOMIC_ACQ_REL) != 0)
    return;
  pthread_mutex_destroy(&ch->tx_lock);
  pthread_mutex_destroy(&ch->rx_lock);
  pthread_mutex_destroy(&ch->ack_lock);
  free(ch);
}

/* Chunks of 2^@shift bytes in @n bytes. */
static uint64_t chunk_count(uint64_t n, unsigned shift)
{
  return (n >> shift) + ((n & (((uint64_t)1 << shift) - 1)) != 0);
}

/* Bytes in chunk @c of a message of @n bytes in chunks of 2^@shift. */
static uint64_t chunk_len(uint64_t n, unsigned shift, uint64_t c)
{
  uint64_t off = c << shift, len = (uint64_t)1 << shift;
  return n - off < len ? n - off : len;
}

/* The chunk size (log2) of a message of @n bytes; @staged: GPU memory
 * staged through host memory, in a pipeline. */
static unsigned chunk_shift_for(const struct gpuipc_mpi_channel *ch,
                                uint64_t n, bool staged)
{
  unsigned sh = CHUNK_SHIFT_MAX;
  if (ch->chunk_shift != 0) {
    sh = ch->chunk_shift;
  } else if (staged) {
    sh = PIPE_SHIFT_MAX;
    while (sh > PIPE_SHIFT_MIN && (n >> sh) < PIPE_CHUNKS)
      sh--;
  }
  while (sh < CHUNK_SHIFT_MAX && chunk_count(n, sh) > CHUNKS_MAX)
    sh++;
  return sh;
}

static void cancel(MPI_Request *r)
{
  if (*r == MPI_REQUEST_NULL)
    return;
  MPI_Cancel(r);
  MPI_Wait(r, MPI_STATUS_IGNORE);
}

static void ev_free(gpuipc_event_t **ev, int *ev_dev)
{
  for (int i = 0; i < NEV; i++) {
    if (ev[i] != NULL)
      gpuipc_event_release(ev[i]);
    ev[i] = NULL;
  }
  *ev_dev = -1;
}

/*
 * Events @ev[NEV] for copies on device @dev, made once and kept (anew when
 * the device changes). Where the device cannot make them, ev[0] stays NULL
 * and the copies are waited for one by one.
 */
static void ev_fit(gpuipc_event_t **ev, int *ev_dev, int dev)
{
  if (*ev_dev == dev)
    return;
  ev_free(ev, ev_dev);
  *ev_dev = dev;
  for (int i = 0; i < NEV; i++) {
    if (gpuipc_event_create(dev, 0, &ev[i]) != 0) {
      ev_free(ev, ev_dev);
      *ev_dev = dev;
      return;
    }
  }
}

/*
 * Copy one staged chunk on @stream of device @dev: queued, with @ev
 * recorded after it, or (@ev NULL: no events on the device) waited for.
 */
static int stage_copy(int dev, void *to, const void *from, uint64_t len,
                      void *stream, gpuipc_event_t *ev)
{
  if (ev == NULL)
    return gpuipc__mpi_copy(dev, to, from, len, stream);
  int rc = gpuipc__mpi_copy_async(dev, to, from, len, stream);
  if (rc == 0) {
    rc = gpuipc_event_record(ev, stream);
    if (rc != 0)
      rc = gpuipc__mpi_fail_gpuipc(rc);
  }
  return rc;
}

/* ---- opening -------------------------------------------------------------*/

static int check_opts(const gpuipc_channel_opts_t *o)
{
  if (o == NULL)
    return 0;
  if (o->size < offsetof(gpuipc_channel_opts_t, stage_slots))
    return gpuipc__mpi_fail(-EINVAL, "opts->size %zu is too small", o->size);
  if (o->flags != 0)
    return gpuipc__mpi_fail(-EINVAL, "opts->flags 0x%x: reserved, must be 0",
                            o->flags);
  if (o->depth != 0 && (o->depth > GPUIPC_CHANNEL_DEPTH_MAX ||
                        (o->depth & (o->depth - 1)) != 0))
    return gpuipc__mpi_fail(-EINVAL, "opts->depth %u is not a power of two "
                            "in 1..%d", o->depth, GPUIPC_CHANNEL_DEPTH_MAX);
  if (o->send_timeout_ms < 0)
    return gpuipc__mpi_fail(-EINVAL, "opts->send_timeout_ms %d is negative",
                            o->send_timeout_ms);
  return 0;
}

/* The communicator of the two ranks, erroring by return codes. */
static int make_pair(MPI_Comm comm, int me, int peer, int tag, MPI_Comm *out)
{
  MPI_Group all, two;
  int ranks[2] = {me < peer ? me : peer, me < peer ? peer : me};
  int mrc = MPI_Comm_group(comm, &all);
  if (mrc != MPI_SUCCESS)
    return gpuipc__mpi_fail_mpi(mrc, "MPI_Comm_group");
  mrc = MPI_Group_incl(all, 2, ranks, &two);
  MPI_Group_free(&all);
  if (mrc != MPI_SUCCESS)
    return gpuipc__mpi_fail_mpi(mrc, "MPI_Group_incl");
  MPI_Comm pair;
  mrc = MPI_Comm_create_group(comm, two, tag, &pair);
  MPI_Group_free(&two);
  if (mrc != MPI_SUCCESS)
    return gpuipc__mpi_fail_mpi(mrc, "MPI_Comm_create_group");
  mrc = MPI_Comm_set_errhandler(pair, MPI_ERRORS_RETURN);
  if (mrc != MPI_SUCCESS) {
    MPI_Comm_free(&pair);
    return gpuipc__mpi_fail_mpi(mrc, "MPI_Comm_set_errhandler");
  }
  *out = pair;
  return 0;
}

/* Shared memory: a domain of the pair's own, and channel "c" in it. */
static int open_shm(struct gpuipc_mpi_channel *ch,
                    const gpuipc_channel_opts_t *opts)
{
  int rc = gpuipc__mpi_join_new(ch->pair, &ch->dom);
  rc = gpuipc__mpi_agree(ch->pair, rc);
  if (rc != 0)
    goto leave;
  rc = gpuipc_channel_open(ch->dom, "c", opts, &ch->shm);
  if (rc != 0)
    gpuipc__mpi_fail_gpuipc(rc);
  rc = gpuipc__mpi_agree(ch->pair, rc);
  if (rc == 0)
    return 0;
  if (ch->shm)
    gpuipc_channel_close(ch->shm);
  ch->shm = NULL;
leave:
  if (ch->dom)
    gpuipc_domain_leave(ch->dom);
  ch->dom = NULL;
  return rc;
}

static int open_mpi(struct gpuipc_mpi_channel *ch,
                    const gpuipc_channel_opts_t *opts)
{
  ch->depth = opts && opts->depth ? opts->depth : 64;
  ch->send_timeout_ms = opts ? opts->send_timeout_ms : 0;
  ch->rx_device = -1;
  ch->tx_ev_dev = -1;
  ch->rx_ev_dev = -1;
  int rc = gpuipc__mpi_cuda_aware(&ch->aware);
  if (rc == 0)
    rc = gpuipc__mpi_chunk_setting(&ch->chunk_shift);
  if (rc != 0)
    return rc;
  if (gpuipc_driver_status(NULL) == 0 && gpuipc_device_count() > 0) {
    if (opts && opts->device >= 0 && (opts->device_set || opts->device > 0)) {
      ch->rx_device = opts->device;
    } else {
      int cur = gpuipc_device_current();
      ch->rx_device = cur >= 0 ? cur : 0;
    }
  }
  ch->next_seq = 1;
  ch->rx_seq = 1;
  ch->rel_req = MPI_REQUEST_NULL;
  ch->desc_req = MPI_REQUEST_NULL;
  ch->slots = calloc(ch->depth, sizeof(*ch->slots));
  if (ch->slots == NULL)
    return gpuipc__mpi_fail(-ENOMEM, "no memory for %u message slots",
                            ch->depth);
  int mrc = MPI_Irecv(&ch->rel_w, (int)sizeof(ch->rel_w), MPI_BYTE, ch->peer,
                      TAG_REL, ch->pair, &ch->rel_req);
  if (mrc == MPI_SUCCESS)
    mrc = MPI_Irecv(&ch->desc_w, (int)sizeof(ch->desc_w), MPI_BYTE, ch->peer,
                    TAG_DESC, ch->pair, &ch->desc_req);
  if (mrc != MPI_SUCCESS) {
    rc = gpuipc__mpi_fail_mpi(mrc, "MPI_Irecv");
    cancel(&ch->rel_req);
    free(ch->slots);
    ch->slots = NULL;
    return rc;
  }
  return 0;
}

GPUIPC_MPI_API int gpuipc_mpi_channel_open(MPI_Comm comm, int peer, int tag,
                                           const gpuipc_channel_opts_t *opts,
                                           gpuipc_mpi_channel_t **out)
{
  gpuipc__mpi_call_begin();
  int rc = gpuipc__mpi_check_comm(comm);
  if (rc != 0)
    return rc;
  int me, size, *ub = NULL, flag = 0;
  int mrc = MPI_Comm_rank(comm, &me);
  if (mrc == MPI_SUCCESS)
    mrc = MPI_Comm_size(comm, &size);
  if (mrc == MPI_SUCCESS)
    mrc = MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  if (mrc != MPI_SUCCESS)
    return gpuipc__mpi_fail_mpi(mrc, "MPI_Comm_rank");
  if (peer < 0 || peer >= size || peer == me)
    return gpuipc__mpi_fail(-EINVAL, "peer %d is not another rank of the "
                            "%d-rank communicator (this is rank %d)", peer,
                            size, me);
  if (tag < 0 || (flag && ub && tag > *ub))
    return gpuipc__mpi_fail(-EINVAL, "tag %d is outside 0..MPI_TAG_UB", tag);
  /* Checks that one rank alone fails are agreed on after the pair exists:
   * both then return the same code. */
  rc = out == NULL ? gpuipc__mpi_fail(-EINVAL, "out is NULL")
                   : check_opts(opts);
  struct gpuipc_mpi_channel *ch = calloc(1, sizeof(*ch));
  if (ch == NULL && rc == 0)
    rc = gpuipc__mpi_fail(-ENOMEM, "no memory for a channel");
  MPI_Comm pair;
  int prc = make_pair(comm, me, peer, tag, &pair);
  if (prc != 0) {
    free(ch);
    return prc;
  }
  rc = gpuipc__mpi_agree(pair, rc);
  if (rc != 0)
    goto free_pair;
  ch->pair = pair;
  ch->peer = me < peer ? 1 : 0;
  ch->refs = 1;
  pthread_mutex_init(&ch->tx_lock, NULL);
  pthread_mutex_init(&ch->rx_lock, NULL);
  pthread_mutex_init(&ch->ack_lock, NULL);

  MPI_Comm node;
  rc = gpuipc__mpi_scope_comm(pair, GPUIPC_MPI_SCOPE_NODE, &node);
  if (rc != 0)
    goto destroy;
  int nsize = 0;
  mrc = MPI_Comm_size(node, &nsize);
  MPI_Comm_free(&node);
  rc = mrc == MPI_SUCCESS ? 0 : gpuipc__mpi_fail_mpi(mrc, "MPI_Comm_size");
  rc = gpuipc__mpi_agree(pair, rc);
  if (rc != 0)
    goto destroy;
  if (nsize == 2) {
    rc = open_shm(ch, opts);
  } else {
    rc = gpuipc__mpi_agree(pair, open_mpi(ch, opts));
    if (rc != 0 && ch->slots != NULL) {
      /* The other rank failed: undo this one's posted receives. */
      cancel(&ch->rel_req);
      cancel(&ch->desc_req);
      free(ch->slots);
    }
  }
  if (rc != 0)
    goto destroy;
  if (ch->shm != NULL) {
    MPI_Comm_free(&ch->pair);
    ch->pair = MPI_COMM_NULL;
  }
  *out = ch;
  return 0;
destroy:
  pthread_mutex_destroy(&ch->tx_lock);
  pthread_mutex_destroy(&ch->rx_lock);
  pthread_mutex_destroy(&ch->ack_lock);
free_pair:
  MPI_Comm_free(&pair);
  free(ch);
  return rc;
}

GPUIPC_MPI_API gpuipc_channel_t *
gpuipc_mpi_channel_shm(gpuipc_mpi_channel_t *ch)
{
  return ch ? ch->shm : NULL;
}

/* ---- sending -------------------------------------------------------------*/

/* Take in the releases that arrived and retire finished messages. Returns
 * how many releases were taken in, or a negative code. tx_lock held. */
static int tx_poll(struct gpuipc_mpi_channel *ch)
{
  if (ch->tx_bad_rel)
    return gpuipc__mpi_fail(GPUIPC_E_PROTO, "the peer broke the protocol "
                            "with an earlier release; the channel is "
                            "unusable");
  if (ch->tx_torn)
    return gpuipc__mpi_fail(GPUIPC_E_PROTO, "an earlier message was cut "
                            "short after its descriptor went out; the "
                            "channel is unusable");
  int taken = 0;
  while (!ch->tx_gone) {
    int flag = 0, count = 0;
    MPI_Status st;
    int mrc = MPI_Test(&ch->rel_req, &flag, &st);
    if (mrc != MPI_SUCCESS)
      return mpi_err(mrc, "MPI_Test of a release");
    if (!flag)
      break;
    MPI_Get_count(&st, MPI_BYTE, &count);
    const struct wire *w = &ch->rel_w;
    if (count != (int)sizeof(*w) || w->magic != WIRE_MAGIC ||
        (w->type != MSG_REL && w->type != MSG_CLOSE)) {
      ch->tx_bad_rel = true;
      return gpuipc__mpi_fail(GPUIPC_E_PROTO, "a release of %d bytes, magic "
                              "0x%x, type %u: not a gpuipc release", count,
                              w->magic, w->type);
    }
    if (w->type == MSG_CLOSE) {
      ch->tx_gone = true;
      __atomic_store_n(&ch->peer_closed, 1, __ATOMIC_RELEASE);
      break;
    }
    uint32_t i;
    for (i = 0; i < ch->depth; i++)
      if (ch->slots[i].seq == w->seq && !ch->slots[i].released)
        break;
    if (w->seq == 0 || i == ch->depth) {
      ch->tx_bad_rel = true;
      return gpuipc__mpi_fail(GPUIPC_E_PROTO, "a release of message %llu, "
                              "which is not in flight",
                              (unsigned long long)w->seq);
    }
    ch->slots[i].released = true;
    taken++;
    if (ch->on_release != NULL)
      ch->on_release(ch, w->seq, ch->on_release_user);
    mrc = MPI_Irecv(&ch->rel_w, (int)sizeof(ch->rel_w), MPI_BYTE, ch->peer,
                    TAG_REL, ch->pair, &ch->rel_req);
    if (mrc != MPI_SUCCESS)
      return mpi_err(mrc, "MPI_Irecv of a release");
  }
  for (uint32_t i = 0; i < ch->depth; i++) {
    struct slot *s = &ch->slots[i];
    if (s->seq == 0)
      continue;
    if (s->nreq > 0) {
      int flag = 0;
      int mrc = MPI_Testall(s->nreq, s->req, &flag, MPI_STATUSES_IGNORE);
      if (mrc != MPI_SUCCESS)
        return mpi_err(mrc, "MPI_Testall of a message's sends");
      if (flag)
        s->nreq = 0;
    }
    if (s->released && s->nreq == 0) {
      s->seq = 0;
      ch->in_flight--;
    }
  }
  return taken;
}

static bool is_host_type(int32_t t)
{
  return t == GPUIPC_DL_CPU || t == GPUIPC_DL_CUDA_HOST;
}

/* Grow @*buf (HOST, pinned when a GPU is there) to hold @n bytes. */
static int stage_fit(gpuipc_buf_t **buf, uint64_t n)
{
  if (*buf != NULL && gpuipc_buf_size(*buf) >= n)
    return 0;
  gpuipc_buf_t *b;
  int rc = gpuipc_buf_alloc(n, GPUIPC_KIND_HOST, -1, 0, &b);
  if (rc != 0)
    return gpuipc__mpi_fail_gpuipc(rc);
  if (*buf != NULL)
    gpuipc_buf_release(*buf);
  *buf = b;
  return 0;
}

/* A failure of message @s after its descriptor went out: the peer waits
 * for bytes that will not come. Returns @rc. tx_lock held. */
static int tx_break(struct gpuipc_mpi_channel *ch, int rc)
{
  ch->tx_torn = true;
  ch->tx_gone = true;
  return rc;
}

/*
 * A staging buffer of @n bytes for slot @s: its own when large enough,
 * else that of a slot whose sends are over (free, or awaiting only its
 * release), swapped, so that pinning new memory (milliseconds for a few
 * MiB) is rare. Else a new one. tx_lock held, after tx_poll.
 */
static int tx_stage(struct gpuipc_mpi_channel *ch, struct slot *s, uint64_t n)
{
  if (s->stage != NULL && gpuipc_buf_size(s->stage) >= n)
    return 0;
  struct slot *best = NULL;
  for (uint32_t i = 0; i < ch->depth; i++) {
    struct slot *d = &ch->slots[i];
    if (d == s || d->stage == NULL || d->nreq != 0 ||
        gpuipc_buf_size(d->stage) < n)
      continue;
    if (best == NULL ||
        gpuipc_buf_size(d->stage) < gpuipc_buf_size(best->stage))
      best = d;
  }
  if (best == NULL)
    return stage_fit(&s->stage, n);
  gpuipc_buf_t *mine = s->stage;
  s->stage = best->stage;
  best->stage = mine;
  return 0;
}

/* Post the descriptor of message @s (its first request). tx_lock held. */
static int tx_desc(struct gpuipc_mpi_channel *ch, struct slot *s)
{
  int mrc = MPI_Isend(&s->w, (int)sizeof(s->w), MPI_BYTE, ch->peer, TAG_DESC,
                      ch->pair, &s->req[0]);
  if (mrc != MPI_SUCCESS)
    return mpi_err(mrc, "MPI_Isend of a descriptor");
  s->nreq = 1;
  return 0;
}

/* Post chunk @c of message @s from @from (the message's first byte) on
 * TAG_DATA, after its descriptor when @c is 0. tx_lock held. */
static int tx_chunk(struct gpuipc_mpi_channel *ch, struct slot *s,
                    const uint8_t *from, uint64_t c)
{
  const struct wire *w = &s->w;
  if (c == 0) {
    int rc = tx_desc(ch, s);
    if (rc != 0)
      return rc;
  }
  uint64_t len = chunk_len(w->nbytes, w->chunk_shift, c);
  int mrc = MPI_Isend(from + (c << w->chunk_shift), (int)len, MPI_BYTE,
                      ch->peer, TAG_DATA, ch->pair, &s->req[s->nreq]);
  if (mrc != MPI_SUCCESS)
    return tx_break(ch, mpi_err(mrc, "MPI_Isend of a tensor's bytes"));
  s->nreq++;
  return 0;
}

/* Message @s: its descriptor and every chunk of its bytes at @from (host
 * memory, or device memory for a CUDA-aware MPI). tx_lock held. */
static int tx_post(struct gpuipc_mpi_channel *ch, struct slot *s,
                   const uint8_t *from)
{
  uint64_t n = chunk_count(s->w.nbytes, s->w.chunk_shift);
  if (n == 0)
    return tx_desc(ch, s);
  for (uint64_t c = 0; c < n; c++) {
    int rc = tx_chunk(ch, s, from, c);
    if (rc != 0)
      return rc;
  }
  return 0;
}

/* MPI moves sends along only inside MPI calls: test the oldest request of
 * @s not known complete (from @*oldest on), or probe when none is left.
 * tx_lock held. */
static int tx_kick(struct gpuipc_mpi_channel *ch, struct slot *s, int *oldest)
{
  while (*oldest < s->nreq && s->req[*oldest] == MPI_REQUEST_NULL)
    (*oldest)++;
  int flag = 0, mrc;
  if (*oldest < s->nreq)
    mrc = MPI_Test(&s->req[*oldest], &flag, MPI_STATUS_IGNORE);
  else
    mrc = MPI_Iprobe(ch->peer, MPI_ANY_TAG, ch->pair, &flag,
                     MPI_STATUS_IGNORE);
  if (mrc != MPI_SUCCESS)
    return s->nreq > 0 ? tx_break(ch, mpi_err(mrc, "MPI_Test of a tensor's "
                                                   "sends"))
                       : mpi_err(mrc, "MPI_Iprobe");
  return 0;
}

/*
 * Message @s from device memory at @from (device @dev, after the work
 * queued on @stream): copied chunk by chunk into the slot's pinned staging
 * buffer, NEV copies in flight, each chunk posted as soon as its copy is
 * done (the descriptor with the first). Returns once every chunk is
 * posted. tx_lock held.
 */
static int tx_staged(struct gpuipc_mpi_channel *ch, struct slot *s, int dev,
                     const uint8_t *from, void *stream)
{
  const struct wire *w = &s->w;
  uint64_t n = chunk_count(w->nbytes, w->chunk_shift);
  int rc = tx_stage(ch, s, w->nbytes);
  if (rc != 0)
    return rc;
  ev_fit(ch->tx_ev, &ch->tx_ev_dev, dev);
  gpuipc_event_t **ev = ch->tx_ev;
  bool async = ev[0] != NULL;
  uint8_t *to = gpuipc_buf_ptr(s->stage);
  uint64_t issued = 0, posted = 0;
  int oldest = 0;
  while (posted < n) {
    /* Queue copies while events are free: synchronous ones one at a time. */
    while (issued < n && issued - posted < (async ? NEV : 1)) {
      uint64_t off = issued << w->chunk_shift;
      uint64_t len = chunk_len(w->nbytes, w->chunk_shift, issued);
      rc = stage_copy(dev, to + off, from + off, len, stream,
                      async ? ev[issued % NEV] : NULL);
      if (rc != 0)
        goto fail;
      issued++;
    }
    if (async) {
      rc = gpuipc_event_query(ev[posted % NEV]);
      if (rc == -EAGAIN) {
        rc = tx_kick(ch, s, &oldest);
        if (rc != 0)
          goto fail;
        continue;
      }
      if (rc != 0) {
        rc = gpuipc__mpi_fail_gpuipc(rc);
        goto fail;
      }
    }
    rc = tx_chunk(ch, s, to, posted);
    if (rc != 0)
      goto fail;
    posted++;
  }
  return 0;
fail:
  /* Copies still queued write into the staging buffer: let them end. */
  if (issued > posted)
    (void)gpuipc_stream_sync(dev, stream);
  if (s->nreq > 0)
    tx_break(ch, rc);
  return rc;
}

GPUIPC_MPI_API int gpuipc_mpi_channel_send(gpuipc_mpi_channel_t *ch,
                                   const gpuipc_tensor_t *t, void *stream,
                                   unsigned flags, uint64_t *ticket)
{
  static const char who[] = "gpuipc_mpi_channel_send";
  gpuipc__mpi_call_begin();
  if (ch == NULL || t == NULL)
    return gpuipc__mpi_fail(-EINVAL, "%s: NULL %s", who,
                            ch == NULL ? "channel" : "tensor");
  if (ch->shm != NULL) {
    int rc = gpuipc_channel_send(ch->shm, t, stream, flags, ticket);
    return rc ? gpuipc__mpi_fail_gpuipc(rc) : 0;
  }
  if (flags & ~GPUIPC_SEND_NONBLOCK)
    return gpuipc__mpi_fail(-EINVAL, "%s: flags 0x%x", who, flags);
  gpuipc_tensor_layout_t lay = {.size = sizeof(lay)};
  int rc = gpuipc_tensor_layout(t, &lay);
  if (rc != 0)
    return gpuipc__mpi_fail_gpuipc(rc);
  const gpuipc_dl_tensor_t *dl = &t->dl;
  bool gpu;
  int dev = -1;
  const uint8_t *base;
  uint64_t at; /* element 0 from base */
  if (t->buf != NULL) {
    gpu = gpuipc_buf_kind(t->buf) != GPUIPC_KIND_HOST;
    dev = gpuipc_buf_device(t->buf);
    base = gpuipc_buf_ptr(t->buf);
    at = (uint64_t)((const uint8_t *)dl->data - base) + dl->byte_offset;
  } else {
    if (!lay.contiguous)
      return gpuipc__mpi_fail(-EINVAL, "%s: memory gpuipc did not allocate "
                              "is staged, and must be contiguous "
                              "(row-major)", who);
    if (!is_host_type(dl->device.device_type) &&
        dl->device.device_type != GPUIPC_DL_CUDA)
      return gpuipc__mpi_fail(-EINVAL, "%s: device type %d (CPU, CUDA or "
                              "CUDA host memory only)", who,
                              dl->device.device_type);
    gpu = dl->device.device_type == GPUIPC_DL_CUDA;
    dev = dl->device.device_id;
    if (gpu && (dev < 0 || dev >= gpuipc_device_count()))
      return gpuipc__mpi_fail(-EINVAL, "%s: CUDA device %d is not visible",
                              who, dev);
    base = dl->data;
    at = dl->byte_offset;
  }

  pthread_mutex_lock(&ch->tx_lock);
  int64_t deadline = ch->send_timeout_ms > 0
                         ? deadline_of(ch->send_timeout_ms)
                         : -1;
  for (;;) {
    rc = tx_poll(ch);
    if (rc < 0)
      goto unlock;
    if (ch->tx_gone) {
      rc = gpuipc__mpi_fail(GPUIPC_E_PEER_GONE, "%s: the peer has closed "
                            "its end", who);
      goto unlock;
    }
    if (ch->in_flight < ch->depth)
      break;
    if (flags & GPUIPC_SEND_NONBLOCK) {
      rc = gpuipc__mpi_fail(-EAGAIN, "%s: %u messages in flight", who,
                            ch->depth);
      goto unlock;
    }
    if (expired(deadline)) {
      rc = gpuipc__mpi_fail(-ETIMEDOUT, "%s: no release within %d ms", who,
                            ch->send_timeout_ms);
      goto unlock;
    }
    sched_yield();
  }
  struct slot *s = NULL;
  for (uint32_t i = 0; i < ch->depth && s == NULL; i++)
    if (ch->slots[i].seq == 0)
      s = &ch->slots[i];
  /* GPU memory MPI cannot read goes through host memory, in a pipeline. */
  bool staged = lay.span > 0 && gpu && (t->buf == NULL || !ch->aware);
  struct wire *w = &s->w;
  memset(w, 0, sizeof(*w));
  w->magic = WIRE_MAGIC;
  w->type = MSG_TENSOR;
  w->seq = ch->next_seq;
  w->nbytes = lay.span;
  w->offset = at - lay.first;
  w->dev_type = gpu ? GPUIPC_DL_CUDA : GPUIPC_DL_CPU;
  w->ndim = dl->ndim;
  w->dtype = dl->dtype;
  w->chunk_shift = chunk_shift_for(ch, lay.span, staged);
  int64_t compact = 1;
  for (int i = dl->ndim - 1; i >= 0; i--) {
    w->shape[i] = dl->shape[i];
    w->strides[i] = dl->strides != NULL && t->buf != NULL ? dl->strides[i]
                                                          : compact;
    compact *= dl->shape[i] > 0 ? dl->shape[i] : 1;
  }
  int nreq = 1 + (int)chunk_count(lay.span, w->chunk_shift);
  if (s->req_cap < nreq) {
    MPI_Request *r = realloc(s->req, sizeof(*r) * (size_t)nreq);
    if (r == NULL) {
      rc = gpuipc__mpi_fail(-ENOMEM, "%s: no memory for %d requests", who,
                            nreq);
      goto unlock;
    }
    s->req = r;
    s->req_cap = nreq;
  }
  s->nreq = 0;
  const uint8_t *from = base + lay.first;
  if (staged) {
    rc = tx_staged(ch, s, dev, from, stream);
  } else {
    if (lay.span > 0 && t->buf == NULL) {
      /* Memory of the caller's, free again on return: copied. */
      rc = tx_stage(ch, s, lay.span);
      if (rc != 0)
        goto unlock;
      memcpy(gpuipc_buf_ptr(s->stage), from, lay.span);
      from = gpuipc_buf_ptr(s->stage);
    } else if (lay.span > 0 && gpu) {
      /* The MPI library reads the device memory: after the sender's work. */
      rc = gpuipc__mpi_stream_sync(dev, stream);
      if (rc != 0)
        goto unlock;
    }
    rc = tx_post(ch, s, from);
  }
  if (rc != 0)
    goto unlock;
  s->seq = ch->next_seq++;
  s->released = false;
  ch->in_flight++;
  if (ticket != NULL)
    *ticket = s->seq;
  rc = 0;
unlock:
  pthread_mutex_unlock(&ch->tx_lock);
  return rc;
}

/* Wait until message @ticket is free: released and its MPI sends done. */
static int tx_wait_free(struct gpuipc_mpi_channel *ch, uint64_t ticket,
                        int timeout_ms, const char *who)
{
  int64_t deadline = deadline_of(timeout_ms);
  int rc;
  pthread_mutex_lock(&ch->tx_lock);
  if (ticket == 0 || ticket >= ch->next_seq) {
    rc = gpuipc__mpi_fail(-EINVAL, "%s: no message %llu yet", who,
                          (unsigned long long)ticket);
    goto unlock;
  }
  for (;;) {
    rc = tx_poll(ch);
    if (rc < 0)
      goto unlock;
    bool busy = false;
    for (uint32_t i = 0; i < ch->depth; i++)
      busy |= ch->slots[i].seq == ticket;
    rc = 0;
    if (!busy)
      break;
    if (ch->tx_gone) {
      rc = gpuipc__mpi_fail(GPUIPC_E_PEER_GONE, "%s: the peer closed without "
                            "releasing message %llu", who,
                            (unsigned long long)ticket);
      break;
    }
    if (timeout_ms == 0) {
      rc = gpuipc__mpi_fail(-EAGAIN, "%s: message %llu is in flight", who,
                            (unsigned long long)ticket);
      break;
    }
    if (expired(deadline)) {
      rc = gpuipc__mpi_fail(-ETIMEDOUT, "%s: message %llu still in flight "
                            "after %d ms", who, (unsigned long long)ticket,
                            timeout_ms);
      break;
    }
    sched_yield();
  }
unlock:
  pthread_mutex_unlock(&ch->tx_lock);
  return rc;
}

GPUIPC_MPI_API int gpuipc_mpi_channel_send_done(gpuipc_mpi_channel_t *ch,
                                        uint64_t ticket, int timeout_ms)
{
  gpuipc__mpi_call_begin();
  if (ch == NULL)
    return gpuipc__mpi_fail(-EINVAL, "gpuipc_mpi_channel_send_done: NULL channel");
  if (ch->shm != NULL) {
    int rc = gpuipc_channel_send_done(ch->shm, ticket, timeout_ms);
    return rc ? gpuipc__mpi_fail_gpuipc(rc) : 0;
  }
  return tx_wait_free(ch, ticket, timeout_ms, "gpuipc_mpi_channel_send_done");
}

GPUIPC_MPI_API int gpuipc_mpi_channel_send_wait(gpuipc_mpi_channel_t *ch,
                                        uint64_t ticket, void *stream,
                                        int timeout_ms)
{
  gpuipc__mpi_call_begin();
  if (ch == NULL)
    return gpuipc__mpi_fail(-EINVAL, "gpuipc_mpi_channel_send_wait: NULL channel");
  if (ch->shm != NULL) {
    int rc = gpuipc_channel_send_wait(ch->shm, ticket, stream, timeout_ms);
    return rc ? gpuipc__mpi_fail_gpuipc(rc) : 0;
  }
  /* The receiver's work on the bytes ended before its release was sent:
   * nothing is left for @stream to wait for. */
  return tx_wait_free(ch, ticket, timeout_ms, "gpuipc_mpi_channel_send_wait");
}

/* The shared-memory path's callback, handed on with the MPI channel. */
static void shm_released(gpuipc_channel_t *shm, uint64_t ticket, void *user)
{
  struct gpuipc_mpi_channel *ch = user;
  (void)shm;
  ch->on_release(ch, ticket, ch->on_release_user);
}

GPUIPC_MPI_API int gpuipc_mpi_channel_on_release(gpuipc_mpi_channel_t *ch,
                                                 gpuipc_mpi_release_fn fn,
                                                 void *user)
{
  gpuipc__mpi_call_begin();
  if (ch == NULL)
    return gpuipc__mpi_fail(-EINVAL,
                            "gpuipc_mpi_channel_on_release: NULL channel");
  /* On the shared-memory path the callback runs under the gpuipc
   * channel's send lock, which gpuipc_channel_on_release takes: clearing
   * it there first means no call reads the fields while they change. */
  int rc = 0;
  if (ch->shm != NULL)
    rc = gpuipc_channel_on_release(ch->shm, NULL, NULL);
  pthread_mutex_lock(&ch->tx_lock);
  ch->on_release = fn;
  ch->on_release_user = user;
  pthread_mutex_unlock(&ch->tx_lock);
  if (rc == 0 && ch->shm != NULL && fn != NULL)
    rc = gpuipc_channel_on_release(ch->shm, shm_released, ch);
  return rc ? gpuipc__mpi_fail_gpuipc(rc) : 0;
}

GPUIPC_MPI_API int gpuipc_mpi_channel_progress(gpuipc_mpi_channel_t *ch)
{
  gpuipc__mpi_call_begin();
  if (ch == NULL)
    return gpuipc__mpi_fail(-EINVAL,
                            "gpuipc_mpi_channel_progress: NULL channel");
  if (ch->shm != NULL) {
    int rc = gpuipc_channel_progress(ch->shm);
    return rc < 0 ? gpuipc__mpi_fail_gpuipc(rc) : rc;
  }
  pthread_mutex_lock(&ch->tx_lock);
  int rc = tx_poll(ch);
  pthread_mutex_unlock(&ch->tx_lock);
  return rc;
}

/* ---- receiving -----------------------------------------------------------*/

/* Check descriptor @w (@count bytes) as the next message. */
static int rx_check(struct gpuipc_mpi_channel *ch, const struct wire *w,
                    int count)
{
  if (count != (int)sizeof(*w) || w->magic != WIRE_MAGIC ||
      (w->type != MSG_TENSOR && w->type != MSG_CLOSE))
    return gpuipc__mpi_fail(GPUIPC_E_PROTO, "a descriptor of %d bytes, "
                            "magic 0x%x, type %u: not a gpuipc descriptor",
                            count, w->magic, w->type);
  if (w->type == MSG_CLOSE)
    return 0;
  if (w->seq != ch->rx_seq)
    return gpuipc__mpi_fail(GPUIPC_E_PROTO, "descriptor seq %llu where %llu "
                            "was due", (unsigned long long)w->seq,
                            (unsigned long long)ch->rx_seq);
  if (w->dev_type != GPUIPC_DL_CPU && w->dev_type != GPUIPC_DL_CUDA)
    return gpuipc__mpi_fail(GPUIPC_E_PROTO, "descriptor %llu: device type "
                            "%d", (unsigned long long)w->seq, w->dev_type);
  if (w->ndim < 0 || w->ndim > GPUIPC_TENSOR_MAX_DIMS ||
      w->nbytes > SIZE_ABSURD)
    return gpuipc__mpi_fail(GPUIPC_E_PROTO, "descriptor %llu: ndim %d, "
                            "%llu bytes", (unsigned long long)w->seq,
                            w->ndim, (unsigned long long)w->nbytes);
  if (w->chunk_shift < CHUNK_SHIFT_MIN || w->chunk_shift > CHUNK_SHIFT_MAX ||
      chunk_count(w->nbytes, w->chunk_shift) > CHUNKS_MAX)
    return gpuipc__mpi_fail(GPUIPC_E_PROTO, "descriptor %llu: chunk_shift "
                            "%u for %llu bytes: chunks must be 2^%d to 2^%d "
                            "bytes, %llu of them at most",
                            (unsigned long long)w->seq, w->chunk_shift,
                            (unsigned long long)w->nbytes, CHUNK_SHIFT_MIN,
                            CHUNK_SHIFT_MAX, (unsigned long long)CHUNKS_MAX);
  gpuipc_tensor_t t;
  memset(&t, 0, sizeof(t));
  t.dl.data = (void *)w; /* any non-NULL base: offsets are checked */
  t.dl.ndim = w->ndim;
  t.dl.dtype = w->dtype;
  t.dl.shape = (int64_t *)w->shape;
  t.dl.strides = (int64_t *)w->strides;
  t.dl.byte_offset = w->offset;
  gpuipc_tensor_layout_t lay = {.size = sizeof(lay)};
  if (gpuipc_tensor_layout(&t, &lay) != 0)
    return gpuipc__mpi_fail(GPUIPC_E_PROTO, "descriptor %llu: %s",
                            (unsigned long long)w->seq, gpuipc_last_error());
  if (lay.first != 0 || lay.span != w->nbytes)
    return gpuipc__mpi_fail(GPUIPC_E_PROTO, "descriptor %llu: its elements "
                            "reach bytes %llu..+%llu of the %llu sent",
                            (unsigned long long)w->seq,
                            (unsigned long long)lay.first,
                            (unsigned long long)lay.span,
                            (unsigned long long)w->nbytes);
  return 0;
}

/* The next descriptor into ch->desc_w (ch->have). rx_lock held. */
static int rx_fetch(struct gpuipc_mpi_channel *ch, int timeout_ms)
{
  if (ch->rx_broken)
    return gpuipc__mpi_fail(GPUIPC_E_PROTO, "the channel broke on an "
                            "earlier message and is unusable");
  if (ch->have)
    return 0;
  if (ch->rx_gone)
    return gpuipc__mpi_fail(GPUIPC_E_PEER_GONE, "the peer has closed its end "
                            "and everything it sent was received");
  int64_t deadline = deadline_of(timeout_ms);
  MPI_Status st;
  for (;;) {
    int flag = 0;
    int mrc = MPI_Test(&ch->desc_req, &flag, &st);
    if (mrc != MPI_SUCCESS)
      return mpi_err(mrc, "MPI_Test of a descriptor");
    if (flag)
      break;
    if (timeout_ms == 0)
      return gpuipc__mpi_fail(-EAGAIN, "no message yet");
    if (expired(deadline))
      return gpuipc__mpi_fail(-ETIMEDOUT, "no message within %d ms",
                              timeout_ms);
    sched_yield();
  }
  int count = 0;
  MPI_Get_count(&st, MPI_BYTE, &count);
  int rc = rx_check(ch, &ch->desc_w, count);
  if (rc != 0) {
    ch->rx_broken = true;
    return rc;
  }
  if (ch->desc_w.type == MSG_CLOSE) {
    ch->rx_gone = true;
    __atomic_store_n(&ch->peer_closed, 1, __ATOMIC_RELEASE);
    return gpuipc__mpi_fail(GPUIPC_E_PEER_GONE, "the peer has closed its "
                            "end and everything it sent was received");
  }
  ch->have = true;
  return 0;
}

/* Done with the message in desc_w: wait for the next. rx_lock held. */
static int rx_next(struct gpuipc_mpi_channel *ch)
{
  ch->have = false;
  ch->rx_seq++;
  int mrc = MPI_Irecv(&ch->desc_w, (int)sizeof(ch->desc_w), MPI_BYTE,
                      ch->peer, TAG_DESC, ch->pair, &ch->desc_req);
  if (mrc != MPI_SUCCESS) {
    ch->rx_broken = true;
    return mpi_err(mrc, "MPI_Irecv of a descriptor");
  }
  return 0;
}

/*
 * The bytes of the message in desc_w into @dst (on device @dev, or host
 * when < 0), after the work queued on @stream before the call (MPI writes
 * device memory only once it is done). Up to NEV chunk receives stay
 * posted, in order. When MPI
 * cannot write to @dst they land in a ring of staging chunks in pinned
 * host memory, and each chunk's copy to @dst is queued on @stream as soon
 * as it arrived; a staging chunk takes the next receive once the copy out
 * of it is done. Returns once every copy is. A failure after the first
 * receive was posted breaks the channel: the rest of the message may be
 * on its way. rx_lock held.
 */
static int rx_data(struct gpuipc_mpi_channel *ch, void *dst, int dev,
                   void *stream)
{
  const struct wire *w = &ch->desc_w;
  uint64_t n = w->nbytes;
  if (n == 0)
    return 0;
  unsigned sh = w->chunk_shift;
  uint64_t nchunks = chunk_count(n, sh);
  uint64_t win = nchunks < NEV ? nchunks : NEV;
  bool staged = dev >= 0 && !ch->aware;
  uint8_t *into = dst;
  gpuipc_event_t **ev = ch->rx_ev;
  if (staged) {
    uint64_t ring = win << sh;
    int rc = stage_fit(&ch->rx_stage, ring < n ? ring : n);
    if (rc != 0)
      return rc; /* the message stays first in line */
    into = gpuipc_buf_ptr(ch->rx_stage);
    ev_fit(ev, &ch->rx_ev_dev, dev);
  }
  if (dev >= 0 && !staged) {
    /* MPI writes the device memory itself: after the receiver's work. */
    int rc = gpuipc__mpi_stream_sync(dev, stream);
    if (rc != 0)
      return rc; /* the message stays first in line */
  }
  bool async = staged && ev[0] != NULL;
  MPI_Request reqs[NEV];
  uint64_t posted = 0, done = 0;
  int rc = 0, mrc;
  /* Chunks [done, posted) have a receive in flight, in reqs[c % win]; the
   * others' entries are spent (MPI_REQUEST_NULL, which MPI_Test reports
   * complete at once): only those in flight are ever tested. */
  while (done < nchunks) {
    if (posted < nchunks && posted - done < win) {
      bool free_chunk = true;
      if (async && posted >= win) {
        /* The staging chunk's last copy out (chunk posted - win's) must be
         * over. While receives are in flight, a copy still running is no
         * reason to stop: the oldest receive is tested meanwhile. With
         * none in flight there is nothing to do but wait for the copy. */
        gpuipc_event_t *e = ev[posted % win];
        rc = done < posted ? gpuipc_event_query(e) : gpuipc_event_sync(e);
        if (rc != 0 && rc != -EAGAIN) {
          rc = gpuipc__mpi_fail_gpuipc(rc);
          goto fail;
        }
        free_chunk = rc == 0;
        rc = 0;
      }
      if (free_chunk) {
        uint8_t *at = staged ? into + ((posted % win) << sh)
                             : into + (posted << sh);
        mrc = MPI_Irecv(at, (int)chunk_len(n, sh, posted), MPI_BYTE,
                        ch->peer, TAG_DATA, ch->pair, &reqs[posted % win]);
        if (mrc != MPI_SUCCESS) {
          rc = mpi_err(mrc, "MPI_Irecv of a tensor's bytes");
          goto fail;
        }
        posted++;
        continue;
      }
    }
    /* Not reached with nothing in flight (the ring had room, and the
     * copy was waited for); were it, the test below would take a spent
     * request for chunk `done` and copy a stale staging chunk. */
    if (done >= posted) {
      rc = gpuipc__mpi_fail(-EIO, "message %llu: no receive in flight for "
                            "chunk %llu of %llu (%llu posted)",
                            (unsigned long long)w->seq,
                            (unsigned long long)done,
                            (unsigned long long)nchunks,
                            (unsigned long long)posted);
      goto fail;
    }
    /* The oldest chunk: waited for, unless copies may free a staging
     * chunk meanwhile. */
    int flag = 1;
    MPI_Request *r = &reqs[done % win];
    mrc = async ? MPI_Test(r, &flag, MPI_STATUS_IGNORE)
                : MPI_Wait(r, MPI_STATUS_IGNORE);
    if (mrc != MPI_SUCCESS) {
      rc = mpi_err(mrc, "MPI_Test of a tensor's bytes");
      goto fail;
    }
    if (!flag)
      continue;
    if (staged) {
      uint8_t *from = into + ((done % win) << sh);
      uint8_t *to = (uint8_t *)dst + (done << sh);
      rc = stage_copy(dev, to, from, chunk_len(n, sh, done), stream,
                      async ? ev[done % win] : NULL);
      if (rc != 0) {
        done++;
        goto fail;
      }
    }
    done++;
  }
  if (async) {
    rc = gpuipc__mpi_stream_sync(dev, stream);
    if (rc != 0)
      goto fail;
  }
  return 0;
fail:
  /* Nothing may write into the staging ring or @dst after return. */
  for (uint64_t c = done; c < posted; c++)
    cancel(&reqs[c % win]);
  if (async)
    (void)gpuipc_stream_sync(dev, stream);
  ch->rx_broken = true;
  return rc;
}

/* Tell the sender that message @seq is free. ack_lock held. */
static int send_ack(struct gpuipc_mpi_channel *ch, uint64_t seq)
{
  /* Retire acks that went out. */
  for (struct ack **pp = &ch->acks; *pp != NULL;) {
    int flag = 0;
    MPI_Test(&(*pp)->req, &flag, MPI_STATUS_IGNORE);
    if (flag) {
      struct ack *a = *pp;
      *pp = a->next;
      free(a);
    } else {
      pp = &(*pp)->next;
    }
  }
  if (__atomic_load_n(&ch->peer_closed, __ATOMIC_ACQUIRE))
    return gpuipc__mpi_fail(GPUIPC_E_PEER_GONE, "the sender has closed its "
                            "end: nothing to tell");
  struct ack *a = calloc(1, sizeof(*a));
  if (a == NULL)
    return gpuipc__mpi_fail(-ENOMEM, "no memory for a release");
  a->w.magic = WIRE_MAGIC;
  a->w.type = MSG_REL;
  a->w.seq = seq;
  int mrc = MPI_Isend(&a->w, (int)sizeof(a->w), MPI_BYTE, ch->peer, TAG_REL,
                      ch->pair, &a->req);
  if (mrc != MPI_SUCCESS) {
    free(a);
    return mpi_err(mrc, "MPI_Isend of a release");
  }
  a->next = ch->acks;
  ch->acks = a;
  return 0;
}

/* A buffer for a view: a released one of the right place and about the
 * right size, else a new one. */
static int view_buf(struct gpuipc_mpi_channel *ch, int dev, uint64_t n,
                    gpuipc_buf_t **out)
{
  if (n == 0)
    n = 1;
  pthread_mutex_lock(&ch->ack_lock);
  int best = -1;
  for (int i = 0; i < ch->ncache; i++) {
    gpuipc_buf_t *b = ch->cache[i];
    size_t sz = gpuipc_buf_size(b);
    if (gpuipc_buf_device(b) == dev && sz >= n && sz / 2 <= n &&
        (best < 0 || sz < gpuipc_buf_size(ch->cache[best])))
      best = i;
  }
  if (best >= 0) {
    *out = ch->cache[best];
    ch->cache[best] = ch->cache[--ch->ncache];
  }
  pthread_mutex_unlock(&ch->ack_lock);
  if (best >= 0)
    return 0;
  int rc = gpuipc_buf_alloc(n, dev >= 0 ? GPUIPC_KIND_AUTO : GPUIPC_KIND_HOST,
                            dev, 0, out);
  return rc ? gpuipc__mpi_fail_gpuipc(rc) : 0;
}

GPUIPC_MPI_API int gpuipc_mpi_channel_recv(gpuipc_mpi_channel_t *ch,
                                   gpuipc_tensor_t **view, void *stream,
                                   int timeout_ms)
{
  gpuipc__mpi_call_begin();
  if (ch == NULL || view == NULL)
    return gpuipc__mpi_fail(-EINVAL, "gpuipc_mpi_channel_recv: NULL %s",
                            ch == NULL ? "channel" : "view");
  if (ch->shm != NULL) {
    int rc = gpuipc_channel_recv(ch->shm, view, stream, timeout_ms);
    return rc ? gpuipc__mpi_fail_gpuipc(rc) : 0;
  }
  struct mview *v = calloc(1, sizeof(*v));
  if (v == NULL)
    return gpuipc__mpi_fail(-ENOMEM, "gpuipc_mpi_channel_recv: no memory for a view");
  pthread_mutex_lock(&ch->rx_lock);
  int rc = rx_fetch(ch, timeout_ms);
  if (rc != 0)
    goto unlock;
  const struct wire *w = &ch->desc_w;
  int dev = w->dev_type == GPUIPC_DL_CUDA ? ch->rx_device : -1;
  gpuipc_buf_t *b;
  rc = view_buf(ch, dev, w->nbytes, &b);
  if (rc != 0)
    goto unlock; /* the message stays first in line */
  rc = rx_data(ch, gpuipc_buf_ptr(b), dev, stream);
  if (rc != 0) {
    gpuipc_buf_release(b);
    goto unlock;
  }
  v->t.dl.data = gpuipc_buf_ptr(b);
  v->t.dl.device.device_type = dev >= 0 ? GPUIPC_DL_CUDA : GPUIPC_DL_CPU;
  v->t.dl.device.device_id = dev >= 0 ? dev : 0;
  v->t.dl.ndim = w->ndim;
  v->t.dl.dtype = w->dtype;
  memcpy(v->shape, w->shape, sizeof(v->shape));
  memcpy(v->strides, w->strides, sizeof(v->strides));
  v->t.dl.shape = v->shape;
  v->t.dl.strides = v->strides;
  v->t.dl.byte_offset = w->offset;
  v->t.buf = b;
  v->seq = w->seq;
  v->ch = ch;
  __atomic_add_fetch(&ch->refs, 1, __ATOMIC_ACQ_REL);
  rc = rx_next(ch);
  pthread_mutex_lock(&g_views_lock);
  v->next = g_views;
  if (g_views != NULL)
    g_views->prev = v;
  g_views = v;
  pthread_mutex_unlock(&g_views_lock);
  *view = &v->t;
  v = NULL;
unlock:
  pthread_mutex_unlock(&ch->rx_lock);
  free(v);
  return rc;
}

GPUIPC_MPI_API int gpuipc_mpi_channel_recv_into(gpuipc_mpi_channel_t *ch,
                                        const gpuipc_tensor_t *dst,
                                        void *stream, int timeout_ms)
{
  static const char who[] = "gpuipc_mpi_channel_recv_into";
  gpuipc__mpi_call_begin();
  if (ch == NULL || dst == NULL)
    return gpuipc__mpi_fail(-EINVAL, "%s: NULL %s", who,
                            ch == NULL ? "channel" : "destination");
  if (ch->shm != NULL) {
    int rc = gpuipc_channel_recv_into(ch->shm, dst, stream, timeout_ms);
    return rc ? gpuipc__mpi_fail_gpuipc(rc) : 0;
  }
  gpuipc_tensor_layout_t lay = {.size = sizeof(lay)};
  int rc = gpuipc_tensor_layout(dst, &lay);
  if (rc != 0)
    return gpuipc__mpi_fail_gpuipc(rc);
  if (!lay.contiguous)
    return gpuipc__mpi_fail(-EINVAL, "%s: the destination must be contiguous "
                            "(row-major)", who);
  const gpuipc_dl_tensor_t *dl = &dst->dl;
  int dev = -1;
  if (dst->buf != NULL)
    dev = gpuipc_buf_kind(dst->buf) != GPUIPC_KIND_HOST
              ? gpuipc_buf_device(dst->buf)
              : -1;
  else if (dl->device.device_type == GPUIPC_DL_CUDA)
    dev = dl->device.device_id;
  else if (!is_host_type(dl->device.device_type))
    return gpuipc__mpi_fail(-EINVAL, "%s: destination device type %d", who,
                            dl->device.device_type);
  pthread_mutex_lock(&ch->rx_lock);
  rc = rx_fetch(ch, timeout_ms);
  if (rc != 0)
    goto unlock;
  const struct wire *w = &ch->desc_w;
  char why[200];
  if (gpuipc__tensor_mismatch(w->seq, w->ndim, w->dtype, w->shape, dl, why,
                              sizeof(why)) != NULL) {
    rc = gpuipc__mpi_fail(-EINVAL, "%s: %s", who, why);
    goto unlock;
  }
  if (w->offset != 0 || w->nbytes != lay.nbytes) {
    rc = gpuipc__mpi_fail(-EINVAL, "%s: message %llu is not contiguous; it "
                          "stays first in line", who,
                          (unsigned long long)w->seq);
    goto unlock;
  }
  uint64_t seq = w->seq;
  uint8_t *to = (uint8_t *)dl->data + dl->byte_offset;
  rc = rx_data(ch, to, dev, stream);
  if (rc != 0)
    goto unlock;
  rc = rx_next(ch);
  pthread_mutex_lock(&ch->ack_lock);
  int arc = send_ack(ch, seq);
  pthread_mutex_unlock(&ch->ack_lock);
  /* A sender that has closed needs no release: the copy still counts. */
  if (rc == 0 && arc != 0 && arc != GPUIPC_E_PEER_GONE)
    rc = arc;
unlock:
  pthread_mutex_unlock(&ch->rx_lock);
  return rc;
}

GPUIPC_MPI_API int gpuipc_mpi_tensor_release(gpuipc_tensor_t *view,
                                             void *stream)
{
  gpuipc__mpi_call_begin();
  if (view == NULL)
    return gpuipc__mpi_fail(-EINVAL, "gpuipc_mpi_tensor_release: NULL view");
  struct mview *v;
  pthread_mutex_lock(&g_views_lock);
  for (v = g_views; v != NULL && &v->t != view; v = v->next)
    ;
  if (v != NULL) {
    if (v->prev != NULL)
      v->prev->next = v->next;
    else
      g_views = v->next;
    if (v->next != NULL)
      v->next->prev = v->prev;
  }
  pthread_mutex_unlock(&g_views_lock);
  if (v == NULL) {
    int rc = gpuipc_tensor_release(view, stream);
    return rc ? gpuipc__mpi_fail_gpuipc(rc) : 0;
  }
  struct gpuipc_mpi_channel *ch = v->ch;
  gpuipc_buf_t *b = v->t.buf;
  int rc = 0;
  /* The buffer is reused: the receiver's work on it must be over. */
  if (v->t.dl.device.device_type == GPUIPC_DL_CUDA)
    rc = gpuipc__mpi_stream_sync(v->t.dl.device.device_id, stream);
  pthread_mutex_lock(&ch->ack_lock);
  if (ch->closed) {
    gpuipc_buf_release(b);
  } else {
    int arc = send_ack(ch, v->seq);
    if (rc == 0)
      rc = arc;
    if (rc == 0 && ch->ncache < CACHE_MAX)
      ch->cache[ch->ncache++] = b;
    else
      gpuipc_buf_release(b);
  }
  pthread_mutex_unlock(&ch->ack_lock);
  ch_unref(ch);
  free(v);
  return rc;
}

/* ---- closing -------------------------------------------------------------*/

GPUIPC_MPI_API int gpuipc_mpi_channel_close(gpuipc_mpi_channel_t *ch)
{
  gpuipc__mpi_call_begin();
  if (ch == NULL)
    return gpuipc__mpi_fail(-EINVAL, "gpuipc_mpi_channel_close: NULL channel");
  if (ch->shm != NULL) {
    gpuipc_channel_close(ch->shm);
    gpuipc_domain_leave(ch->dom);
    ch_unref(ch);
    return 0;
  }
  pthread_mutex_lock(&ch->tx_lock);
  pthread_mutex_lock(&ch->rx_lock);
  pthread_mutex_lock(&ch->ack_lock);
  ch->on_release = NULL; /* as gpuipc_channel_close: no calls from here */
  /* Tell both of the peer's sides, after everything sent. */
  struct wire bye[2];
  MPI_Request breq[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  for (int i = 0; i < 2; i++) {
    memset(&bye[i], 0, sizeof(bye[i]));
    bye[i].magic = WIRE_MAGIC;
    bye[i].type = MSG_CLOSE;
    MPI_Isend(&bye[i], (int)sizeof(bye[i]), MPI_BYTE, ch->peer,
              i == 0 ? TAG_DESC : TAG_REL, ch->pair, &breq[i]);
  }
  /* Until the peer has the bytes of every message in flight, or closes:
   * MPI still reads them (the user's buffer, or a staging copy). */
  for (;;) {
    if (tx_poll(ch) < 0 || ch->tx_gone)
      break;
    bool busy = false;
    for (uint32_t i = 0; i < ch->depth; i++)
      busy |= ch->slots[i].seq != 0 && ch->slots[i].nreq > 0;
    if (!busy)
      break;
    sched_yield();
  }
  for (uint32_t i = 0; i < ch->depth; i++) {
    struct slot *s = &ch->slots[i];
    bool pending = false;
    for (int k = 0; k < s->nreq; k++) {
      int flag = 0;
      MPI_Test(&s->req[k], &flag, MPI_STATUS_IGNORE);
      if (!flag) {
        /* The peer left without taking them: MPI frees the request when
         * it can, and the staging copy must outlive it. */
        MPI_Request_free(&s->req[k]);
        pending = true;
      }
    }
    if (s->stage != NULL && !pending)
      gpuipc_buf_release(s->stage);
    free(s->req);
  }
  free(ch->slots);
  cancel(&ch->rel_req);
  cancel(&ch->desc_req);
  MPI_Waitall(2, breq, MPI_STATUSES_IGNORE);
  while (ch->acks != NULL) {
    struct ack *a = ch->acks;
    ch->acks = a->next;
    MPI_Wait(&a->req, MPI_STATUS_IGNORE);
    free(a);
  }
  for (int i = 0; i < ch->ncache; i++)
    gpuipc_buf_release(ch->cache[i]);
  ch->ncache = 0;
  if (ch->rx_stage != NULL)
    gpuipc_buf_release(ch->rx_stage);
  ev_free(ch->tx_ev, &ch->tx_ev_dev);
  ev_free(ch->rx_ev, &ch->rx_ev_dev);
  MPI_Comm_free(&ch->pair);
  ch->closed = true;
  pthread_mutex_unlock(&ch->ack_lock);
  pthread_mutex_unlock(&ch->rx_lock);
  pthread_mutex_unlock(&ch->tx_lock);
  ch_unref(ch);
  return 0;
}
