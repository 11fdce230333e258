/*
 * The sending side of the point-to-point path (p2p.c says how it works):
 * gpuipc_mpi_channel_send, _send_done, _send_wait and _progress, and the
 * releases that come back from the peer.
 */
#include <errno.h>
#include <sched.h>
#include <string.h>

#include "mpi/mpi_chan.h"

#define PIPE_SHIFT_MIN 20  /* staged chunks: 1 MiB .. */
#define PIPE_SHIFT_MAX 22  /* .. 4 MiB */
#define PIPE_CHUNKS 4      /* a staged message in this many chunks at least */

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

int gpuipc__mpi_tx_poll(struct gpuipc_mpi_channel *ch)
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
      return gpuipc__mpi_err(mrc, "MPI_Test of a release");
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
      return gpuipc__mpi_err(mrc, "MPI_Irecv of a release");
  }
  for (uint32_t i = 0; i < ch->depth; i++) {
    struct slot *s = &ch->slots[i];
    if (s->seq == 0)
      continue;
    if (s->nreq > 0) {
      int flag = 0;
      int mrc = MPI_Testall(s->nreq, s->req, &flag, MPI_STATUSES_IGNORE);
      if (mrc != MPI_SUCCESS)
        return gpuipc__mpi_err(mrc, "MPI_Testall of a message's sends");
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
 * MiB) is rare. Else a new one. tx_lock held, after
 * gpuipc__mpi_tx_poll.
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
    return gpuipc__mpi_stage_fit(&s->stage, n);
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
    return gpuipc__mpi_err(mrc, "MPI_Isend of a descriptor");
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
    return tx_break(ch, gpuipc__mpi_err(mrc, "MPI_Isend of a tensor's bytes"));
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
    return s->nreq > 0
               ? tx_break(ch, gpuipc__mpi_err(mrc, "MPI_Test of a tensor's "
                                                   "sends"))
               : gpuipc__mpi_err(mrc, "MPI_Iprobe");
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
  gpuipc__mpi_ev_fit(ch->tx_ev, &ch->tx_ev_dev, dev);
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
      rc = gpuipc__mpi_stage_copy(dev, to + off, from + off, len, stream,
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
    (void)gpuipc__stream_sync(dev, stream);
  if (s->nreq > 0)
    tx_break(ch, rc);
  return rc;
}

int gpuipc__mpi_p2p_send(struct gpuipc_mpi_channel *ch,
                         const gpuipc_tensor_t *t, void *stream,
                         unsigned flags, uint64_t *ticket)
{
  static const char who[] = "gpuipc_mpi_channel_send";
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
  int64_t deadline = deadline_of(ch->send_timeout_ms);
  for (;;) {
    rc = gpuipc__mpi_tx_poll(ch);
    if (rc < 0)
      goto unlock;
    if (ch->tx_gone) {
      rc = gpuipc__mpi_fail(GPUIPC_E_PEER_GONE, "%s: the peer has closed "
                            "its end", who);
      goto unlock;
    }
    if (ch->in_flight < ch->depth)
      break;
    if ((flags & GPUIPC_SEND_NONBLOCK) || ch->send_timeout_ms == 0) {
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
    rc = gpuipc__mpi_tx_poll(ch);
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

int gpuipc__mpi_p2p_send_done(struct gpuipc_mpi_channel *ch, uint64_t ticket,
                              int timeout_ms)
{
  return tx_wait_free(ch, ticket, timeout_ms, "gpuipc_mpi_channel_send_done");
}

int gpuipc__mpi_p2p_send_wait(struct gpuipc_mpi_channel *ch, uint64_t ticket,
                              void *stream, int timeout_ms)
{
  /* The receiver's work on the bytes ended before its release was sent:
   * nothing is left for @stream to wait for. */
  return tx_wait_free(ch, ticket, timeout_ms, "gpuipc_mpi_channel_send_wait");
}

int gpuipc__mpi_p2p_progress(struct gpuipc_mpi_channel *ch)
{
  pthread_mutex_lock(&ch->tx_lock);
  int rc = gpuipc__mpi_tx_poll(ch);
  pthread_mutex_unlock(&ch->tx_lock);
  return rc;
}
