/*
 * The receiving side of the point-to-point path (p2p.c says how it works):
 * gpuipc_mpi_channel_recv and _recv_into, and the views handed out, which
 * go back to the sender as releases. A view is known by the magic after
 * its tensor, as src/channel knows its own (gpuipc__view_of).
 */
#include <errno.h>
#include <sched.h>
#include <string.h>

#include "channel/tensor.h"
#include "mpi/mpi_chan.h"

#define MVIEW_MAGIC 0x5749564du /* "MVIW" */
#define SIZE_ABSURD ((uint64_t)1 << 48) /* bytes no message carries */

/* Check descriptor @w (@count bytes) as the next message. */
static int desc_check(struct gpuipc_mpi_channel *ch, const struct wire *w,
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

/* A view received on the MPI path: a buffer of the receiver's own. The
 * user sees .t; magic follows it. */
struct mview {
  gpuipc_tensor_t t;
  uint32_t magic;
  int64_t shape[GPUIPC_TENSOR_MAX_DIMS];
  int64_t strides[GPUIPC_TENSOR_MAX_DIMS];
  struct gpuipc_mpi_channel *ch; /* a reference */
  uint64_t seq;
};

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
      return gpuipc__mpi_err(mrc, "MPI_Test of a descriptor");
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
  int rc = desc_check(ch, &ch->desc_w, count);
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
    return gpuipc__mpi_err(mrc, "MPI_Irecv of a descriptor");
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
    int rc = gpuipc__mpi_stage_fit(&ch->rx_stage, ring < n ? ring : n);
    if (rc != 0)
      return rc; /* the message stays first in line */
    into = gpuipc_buf_ptr(ch->rx_stage);
    gpuipc__mpi_ev_fit(ev, &ch->rx_ev_dev, dev);
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
          rc = gpuipc__mpi_err(mrc, "MPI_Irecv of a tensor's bytes");
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
      rc = gpuipc__mpi_err(mrc, "MPI_Test of a tensor's bytes");
      goto fail;
    }
    if (!flag)
      continue;
    if (staged) {
      uint8_t *from = into + ((done % win) << sh);
      uint8_t *to = (uint8_t *)dst + (done << sh);
      rc = gpuipc__mpi_stage_copy(dev, to, from, chunk_len(n, sh, done),
                                  stream, async ? ev[done % win] : NULL);
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
    gpuipc__mpi_cancel(&reqs[c % win]);
  if (async)
    (void)gpuipc__stream_sync(dev, stream);
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
    return gpuipc__mpi_err(mrc, "MPI_Isend of a release");
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

int gpuipc__mpi_p2p_recv(struct gpuipc_mpi_channel *ch, gpuipc_tensor_t **view,
                         void *stream, int timeout_ms)
{
  struct mview *v = calloc(1, sizeof(*v));
  if (v == NULL)
    return gpuipc__mpi_fail(-ENOMEM, "gpuipc_mpi_channel_recv: no memory "
                            "for a view");
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
  v->magic = MVIEW_MAGIC;
  rc = rx_next(ch);
  *view = &v->t;
  v = NULL;
unlock:
  pthread_mutex_unlock(&ch->rx_lock);
  free(v);
  return rc;
}

int gpuipc__mpi_p2p_recv_into(struct gpuipc_mpi_channel *ch,
                              const gpuipc_tensor_t *dst, void *stream,
                              int timeout_ms)
{
  static const char who[] = "gpuipc_mpi_channel_recv_into";
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

bool gpuipc__mpi_is_view(const gpuipc_tensor_t *t)
{
  return ((const struct mview *)t)->magic == MVIEW_MAGIC;
}

int gpuipc__mpi_view_release(gpuipc_tensor_t *t, void *stream)
{
  struct mview *v = (struct mview *)t;
  v->magic = 0;
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
