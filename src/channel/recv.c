/*
 * Channels: the receiving side (gpuipc_channel_recv, _recv_into,
 * gpuipc_tensor_release): descriptors taken from the ring and checked,
 * buffers imported from the socket, releases published back to the
 * sender. The layout of the rings is in channel.h, the sending side in
 * send.c.
 */
#include "channel/channel.h"
#include "channel/tensor.h"
#include "cuda/cuda.h"
#include "mem/mem.h"
#include "os/os.h"
#include "wire/wire.h"

#include <stdlib.h>
#include <string.h>

/* The largest recv_into copy from another GPU's memory that gpuipc's copy
 * kernel makes (reading over the link) rather than the copy engine: on two
 * H200s the two were within their spread at 256 KiB (49-51 GB/s against
 * 46-72), and at 1 MiB the engine made 179-181 GB/s, the kernel 137-142. */
#define CROSS_KERNEL_MAX ((uint64_t)256 << 10)

static int rx_broken(struct gpuipc_channel *ch, int rc)
{
  return gpuipc__chan_break(ch, rc);
}

/*
 * Read the buffer message for @d from the socket and import it. The sender
 * queued it before publishing @d, so it is read without waiting.
 */
static int rx_import(struct gpuipc_channel *ch, const struct gpuipc__desc *d,
                     const char *who)
{
  return gpuipc__chan_rx_import(ch, d->seq, d->buf_key, who);
}

/* Make the next message pending (taken from the ring, checked, mapped). */
static int rx_fetch(struct gpuipc_channel *ch, uint64_t deadline)
{
  struct gpuipc__rx *rx = &ch->rx;
  if (rx->pending)
    return 0;
  int rc = gpuipc__chan_broken(ch, false);
  if (rc != 0)
    return rc;
  uint32_t h = atomic_load_explicit(&ch->rxd->head, memory_order_acquire);
  if (h == rx->tail) {
    rc = gpuipc__chan_wait(ch, &ch->rxd->head, rx->tail,
                           &ch->rxd->recv_sleep, deadline, &rx->wait_ns);
    if (rc == -EAGAIN) {
      gpuipc__chan_arm(ch);
      return gpuipc__err(-EAGAIN, "channel %s: no message", ch->name);
    }
    if (rc == -ETIMEDOUT)
      return gpuipc__err(-ETIMEDOUT, "channel %s: no message in time",
                         ch->name);
    if (rc != 0)
      return rc;
    h = atomic_load_explicit(&ch->rxd->head, memory_order_acquire);
  }
  const char *who = ch->who;
  if (h - rx->tail > GPUIPC__CHAN_DEPTH_MAX)
    return rx_broken(ch, gpuipc__err(GPUIPC_E_PROTO, "%s: %u descriptors "
                                     "published, more than the ring holds",
                                     who, h - rx->tail));
  uint8_t slot[GPUIPC__CHAN_DESC_BYTES];
  memcpy(slot, gpuipc__chan_desc_slot(ch->rx_ring, rx->tail), sizeof(slot));
  rx->tail++;
  atomic_store_explicit(&ch->poll_rx_tail, rx->tail, memory_order_relaxed);
  struct gpuipc__desc *d = &rx->pdesc;
  rc = gpuipc__desc_decode(slot, sizeof(slot), d, who);
  if (rc != 0)
    return rx_broken(ch, rc);
  if (d->seq != rx->expect_seq)
    return rx_broken(ch, gpuipc__err(GPUIPC_E_PROTO, "%s: message %llu "
                                     "arrived where %llu was due", who,
                                     (unsigned long long)d->seq,
                                     (unsigned long long)rx->expect_seq));
  rx->expect_seq++;
  if (d->slot >= rx->depth)
    return rx_broken(ch, gpuipc__err(GPUIPC_E_PROTO, "%s: message %llu in "
                                     "record slot %u, beyond the sender's "
                                     "depth %u", who,
                                     (unsigned long long)d->seq, d->slot,
                                     rx->depth));
  if (d->flags & GPUIPC__DESC_FORGET) {
    rc = gpuipc__chan_rx_forget(ch, d->seq, d->forget_key, who);
    if (rc != 0)
      return rx_broken(ch, rc);
  }
  if (d->flags & GPUIPC__DESC_NEW_BUF) {
    rc = rx_import(ch, d, who);
    if (rc != 0)
      return rx_broken(ch, rc);
  }
  gpuipc_buf_t *b = gpuipc__chan_rx_buf(ch, d->buf_key);
  if (b == NULL)
    return rx_broken(ch, gpuipc__err(GPUIPC_E_PROTO, "%s: message %llu uses "
                                     "buffer key %llu, which was never sent",
                                     who, (unsigned long long)d->seq,
                                     (unsigned long long)d->buf_key));
  /* Check the layout against the memory as mapped here, not as claimed. */
  rc = gpuipc__layout_check(GPUIPC_E_PROTO, who, d->dtype, d->ndim, d->shape,
                            d->strides, d->offset, gpuipc_buf_size(b), NULL);
  if (rc == 0 && d->type == GPUIPC__DESC_BLOCKS)
    rc = gpuipc__chan_blocks_fetch(ch, b);
  if (rc != 0)
    return rx_broken(ch, rc);
  rx->pbuf = b;
  rx->pending = true;
  return 0;
}

/*
 * Make @stream (of local device @dev) wait for the sender's work on the
 * pending message: its event, when it carries one, opened for @dev.
 */
static int rx_ready(struct gpuipc_channel *ch, int dev, void *stream)
{
  struct gpuipc__rx *rx = &ch->rx;
  struct gpuipc__desc *d = &rx->pdesc;
  if (d->flags & GPUIPC__DESC_WORD)
    return gpuipc__chan_ready_wait(ch, dev, stream, rx->pbuf);
  if (!(d->flags & GPUIPC__DESC_EVENT))
    return 0;
  int rc = gpuipc__chan_peer_ev_enter(ch, ch->who);
  if (rc == 1)
    return 0; /* the sender closed, its work complete */
  if (rc != 0)
    return rc;
  gpuipc_event_t *ev;
  rc = gpuipc__chan_event_peer(
      &rx->evs, &rx->nevs, &rx->capevs, d->ev_key,
      (d->flags & GPUIPC__DESC_NEW_EVENT) ? d->ev_handle : NULL, dev, ch->who,
      &ev);
  if (rc == 0)
    d->flags &= ~GPUIPC__DESC_NEW_EVENT; /* imported: a retry looks it up */
  else if (rc == GPUIPC_E_PROTO)
    rx_broken(ch, rc);
  if (rc == 0)
    rc = gpuipc__stream_wait_event(ev, stream, gpuipc__chan_ev_poll_ns());
  gpuipc__chan_peer_ev_leave(ch);
  return rc;
}

/*
 * The next message, pending, within @timeout_ms (the channel calls' rule):
 * 0 with the receive lock held; else its code, the lock not held.
 */
static int rx_take(struct gpuipc_channel *ch, const char *who, int timeout_ms)
{
  if (gpuipc__chan_stale(ch))
    return gpuipc__chan_stale_err(ch, who);
  uint64_t deadline;
  int rc = gpuipc__chan_deadline(ch, who, timeout_ms, &deadline);
  if (rc != 0)
    return rc;
  pthread_mutex_lock(&ch->rx.lock);
  rc = rx_fetch(ch, deadline);
  if (rc != 0)
    pthread_mutex_unlock(&ch->rx.lock);
  return rc;
}

int gpuipc__chan_rx_take(struct gpuipc_channel *ch, const char *who,
                         int timeout_ms)
{
  return rx_take(ch, who, timeout_ms);
}

int gpuipc__chan_rx_ready(struct gpuipc_channel *ch, int dev, void *stream)
{
  return rx_ready(ch, dev, stream);
}

/* Where @dev's streams write the release word of record slot @slot: 0,
 * or GPUIPC_E_UNSUPPORTED when they cannot (no memory operations, or no
 * memory for the slots' record). rel_lock held. */
static int rx_word_addr(struct gpuipc_channel *ch, uint32_t slot, int dev,
                        uint64_t *word)
{
  struct gpuipc__rx *rx = &ch->rx;
  if (rx->word_seq == NULL)
    rx->word_seq = calloc(rx->depth, sizeof(*rx->word_seq));
  if (rx->word_seq == NULL ||
      gpuipc__chan_word_addr(&rx->words, ch->seg, ch->rx_words, dev, word) != 0)
    return GPUIPC_E_UNSUPPORTED;
  *word += (uint64_t)slot * 8;
  return 0;
}

/*
 * Publish the release of message @seq (in the sender's record slot
 * @slot), ordered after @stream (of device @dev, -1 for none) unless the
 * stream is idle: a stream of gpuipc's own writes the release word of the
 * slot once @stream's work so far is done (the sender reads the word from
 * shared memory; @stream itself goes on at once: a word written on it
 * would hold its next work up for the write, 2 to 10 us a round trip on
 * an H100), or, where the device cannot, @stream records an interprocess
 * event. @busy: the stream is known
 * not to be idle (work was just queued on it), no need to ask. @carried:
 * the word is on its way already (rx_copy queued it with the copy).
 * @mem: the message's memory (a block batch's first buffer), or NULL:
 * when a word is written from another GPU than the one it lies on, the
 * release says so (GPUIPC__REL_AWAY), and the sender's stream on that GPU
 * waits on the word at once rather than after a host poll: a wait there
 * stalls no stream of ours.
 */
static int rx_release(struct gpuipc_channel *ch, uint64_t seq, uint32_t slot,
                      int dev, const gpuipc_buf_t *mem, void *stream,
                      bool busy, bool carried)
{
  struct gpuipc__rx *rx = &ch->rx;
  int rc = 0;
  pthread_mutex_lock(&rx->rel_lock);
  if (atomic_load(&ch->closing))
    goto unlock; /* nobody to tell */
  if (atomic_load(&ch->broken) == GPUIPC_E_PEER_GONE) {
    rc = gpuipc__err(GPUIPC_E_PEER_GONE, "gpuipc_tensor_release: the sender "
                     "of channel %s is gone", ch->name);
    goto unlock;
  }
  rc = gpuipc__chan_broken(ch, false);
  if (rc != 0)
    goto unlock;
  struct gpuipc__rel rl;
  memset(&rl, 0, sizeof(rl));
  rl.seq = seq;
  rl.slot = (uint16_t)slot;
  uint8_t *sent = NULL;
  uint64_t word;
  bool after = !carried && dev >= 0 &&
               (busy || !gpuipc__stream_idle(dev, stream));
  if (carried) {
    rl.flags = GPUIPC__REL_WORD;
  } else if (after && rx_word_addr(ch, slot, dev, &word) == 0) {
    rc = gpuipc__stream_word_write_after(dev, stream, word, seq);
    if (rc != 0)
      goto unlock;
    rx->word_seq[slot] = seq;
    rl.flags = GPUIPC__REL_WORD;
  } else if (after) {
    rc = gpuipc__chan_event_record(&rx->rel_ev, &rx->rel_ev_sent, &rx->ndev,
                                   rx->depth, dev, slot, stream, &rl.ev_key,
                                   rl.ev_handle, &sent);
    if (rc != 0)
      goto unlock;
    rl.flags = GPUIPC__REL_EVENT | (sent ? GPUIPC__REL_NEW_EVENT : 0);
  }
  if ((rl.flags & GPUIPC__REL_WORD) && mem != NULL) {
    int home = gpuipc__chan_home_gpu(mem);
    if (home >= 0 && dev != home)
      rl.flags |= GPUIPC__REL_AWAY;
  }
  uint8_t *dst = gpuipc__chan_rel_slot(ch->rx_rel, rx->rel_head);
  rc = gpuipc__rel_encode(&rl, dst, GPUIPC__CHAN_REL_BYTES);
  if (rc < 0)
    goto unlock;
  rc = 0;
  rx->rel_head++;
  gpuipc__chan_publish(&ch->rxd->rel_head, rx->rel_head, &ch->rxd->send_sleep);
  gpuipc__chan_poke(ch);
  if (sent != NULL)
    *sent = 1;
unlock:
  pthread_mutex_unlock(&rx->rel_lock);
  return rc;
}

int gpuipc__chan_rx_word_for(struct gpuipc_channel *ch, uint32_t slot,
                             int dev, bool kernel, uint64_t *word,
                             uint64_t *count)
{
  struct gpuipc__rx *rx = &ch->rx;
  if (atomic_load(&ch->closing) || atomic_load(&ch->broken) != 0)
    return GPUIPC_E_UNSUPPORTED; /* the release itself says what became */
  if (rx_word_addr(ch, slot, dev, word) != 0)
    return GPUIPC_E_UNSUPPORTED;
  *count = kernel ? gpuipc__chan_kcount(&rx->kc, dev, slot) : 0;
  return 0;
}

/*
 * Queue recv_into's copy of message @seq (record slot @slot; @n > 0 bytes
 * from @src to @to) on @stream of device @dev, and with it, where it can,
 * the message's release word: between GPU memories, up to rx.kernel_max
 * bytes within one GPU and up to CROSS_KERNEL_MAX from another GPU's
 * memory (which @dev was granted access to), gpuipc's copy kernel writes
 * the word when it has read the buffer (one launch); else the copy engine
 * copies, and above those a stream of gpuipc's own writes the word after
 * it (the caller's stream does not pause for the write between two large
 * copies). Sets *@carried when the word is on its way (rx_release then
 * only publishes the release). 0, or the copy's error: then nothing was
 * queued.
 */
static int rx_copy(struct gpuipc_channel *ch, uint64_t seq, uint32_t slot,
                   int dev, void *stream, uint8_t *to, const uint8_t *src, size_t n,
                   bool d2d, bool one_gpu, bool *carried)
{
  struct gpuipc__rx *rx = &ch->rx;
  *carried = false;
  uint64_t max = one_gpu || rx->kernel_max < CROSS_KERNEL_MAX
                     ? rx->kernel_max
                     : CROSS_KERNEL_MAX;
  bool kernel = d2d && n <= max &&
                ((uintptr_t)to | (uintptr_t)src) % 16 == 0;
  bool after = d2d && n > max;
  uint64_t word = 0, count = 0;
  int rc = GPUIPC_E_UNSUPPORTED;
  pthread_mutex_lock(&rx->rel_lock);
  if ((kernel || after) &&
      gpuipc__chan_rx_word_for(ch, slot, dev, kernel, &word, &count) == 0) {
    if (kernel && count != 0)
      rc = gpuipc__copy_word(dev, to, src, n, stream, word, seq, count,
                             false);
    if (rc == GPUIPC_E_UNSUPPORTED) { /* the copy engine's copy, then */
      rc = gpuipc__stream_copy_async(dev, to, src, n, stream, d2d);
      if (rc == 0 && after &&
          gpuipc__stream_word_write_after(dev, stream, word, seq) == 0)
        *carried = true;
    } else if (rc == 0) {
      *carried = true;
    }
    if (*carried)
      rx->word_seq[slot] = seq;
  } else {
    rc = gpuipc__stream_copy_async(dev, to, src, n, stream, d2d);
  }
  pthread_mutex_unlock(&rx->rel_lock);
  return rc;
}

int gpuipc_channel_recv(gpuipc_channel_t *ch, gpuipc_tensor_t **view,
                        void *stream, int timeout_ms)
{
  if (ch == NULL || view == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_channel_recv: NULL %s",
                       ch == NULL ? "channel" : "view");
  int rc = rx_take(ch, "gpuipc_channel_recv", timeout_ms);
  if (rc != 0)
    return rc;
  struct gpuipc__rx *rx = &ch->rx;
  if (rx->pdesc.type == GPUIPC__DESC_BLOCKS) {
    rc = gpuipc__chan_blocks_refuse(ch, "gpuipc_channel_recv");
    goto unlock;
  }
  rx->queued = false;
  rc = rx_ready(ch, gpuipc__stream_dev(stream, gpuipc_buf_device(rx->pbuf)),
                stream);
  if (rc != 0)
    goto unlock;
  struct gpuipc__view *v = calloc(1, sizeof(*v));
  if (v == NULL) {
    rc = gpuipc__err(-ENOMEM, "gpuipc_channel_recv: out of memory");
    goto unlock;
  }
  const struct gpuipc__desc *d = &rx->pdesc;
  gpuipc_buf_t *b = rx->pbuf;
  v->magic = GPUIPC__VIEW_MAGIC;
  v->t.dl.data = gpuipc_buf_ptr(b);
  v->t.dl.byte_offset = d->offset;
  v->t.dl.ndim = (int32_t)d->ndim;
  v->t.dl.dtype = d->dtype;
  memcpy(v->shape, d->shape, sizeof(v->shape));
  memcpy(v->strides, d->strides, sizeof(v->strides));
  v->t.dl.shape = v->shape;
  v->t.dl.strides = v->strides;
  if (gpuipc_buf_kind(b) == GPUIPC_KIND_HOST) {
    v->t.dl.device.device_type = GPUIPC_DL_CPU;
    v->device = -1;
  } else {
    v->t.dl.device.device_type = GPUIPC_DL_CUDA;
    v->t.dl.device.device_id = gpuipc_buf_device(b);
    v->device = gpuipc_buf_device(b);
  }
  gpuipc__buf_ref(b);
  v->t.buf = b;
  v->seq = d->seq;
  v->slot = d->slot;
  v->recv_stream = stream;
  v->waits = rx->queued;
  gpuipc__chan_ref(ch);
  v->ch = ch;
  rx->pending = false;
  rx->received++;
  atomic_fetch_add(&rx->views, 1);
  *view = &v->t;
unlock:
  pthread_mutex_unlock(&rx->lock);
  return rc;
}

int gpuipc_channel_recv_into(gpuipc_channel_t *ch, const gpuipc_tensor_t *dst,
                     void *stream, int timeout_ms)
{
  static const char who[] = "gpuipc_channel_recv_into";
  if (ch == NULL || dst == NULL)
    return gpuipc__err(-EINVAL, "%s: NULL %s", who,
                       ch == NULL ? "channel" : "destination");
  const gpuipc_dl_tensor_t *dl = &dst->dl;
  if (dl->data == NULL)
    return gpuipc__err(-EINVAL, "%s: destination data is NULL", who);
  int rc = gpuipc__layout_check(-EINVAL, who, dl->dtype, dl->ndim, dl->shape,
                                dl->strides, 0, GPUIPC_SIZE_MAX_ABSURD, NULL);
  if (rc != 0)
    return rc;
  if (!gpuipc__layout_compact(dl->ndim, dl->shape, dl->strides))
    return gpuipc__err(-EINVAL, "%s: the destination must be contiguous "
                       "(row-major)", who);
  if (dst->buf != NULL) {
    uintptr_t base = (uintptr_t)gpuipc_buf_ptr(dst->buf);
    uintptr_t p = (uintptr_t)dl->data + dl->byte_offset;
    uint64_t n = gpuipc__layout_count(dl->ndim, dl->shape) *
                 gpuipc__dtype_size(dl->dtype);
    if (p < base || p - base > gpuipc_buf_size(dst->buf) ||
        n > gpuipc_buf_size(dst->buf) - (p - base))
      return gpuipc__err(-EINVAL, "%s: the destination reaches outside its "
                         "buffer", who);
  }
  rc = rx_take(ch, who, timeout_ms);
  if (rc != 0)
    return rc;
  struct gpuipc__rx *rx = &ch->rx;
  const struct gpuipc__desc *d = &rx->pdesc;
  char why[200];
  if (d->type == GPUIPC__DESC_BLOCKS) {
    rc = gpuipc__chan_blocks_refuse(ch, who);
    goto unlock;
  }
  if (gpuipc__tensor_mismatch(d->seq, (int)d->ndim, d->dtype, d->shape, dl,
                              why, sizeof(why)) != NULL) {
    rc = gpuipc__err(-EINVAL, "%s: %s", who, why);
    goto unlock;
  }
  if (!gpuipc__layout_compact((int)d->ndim, d->shape, d->strides)) {
    rc = gpuipc__err(-EINVAL,
                     "%s: message %llu is not contiguous: receive "
                     "it with gpuipc_channel_recv",
                     who, (unsigned long long)d->seq);
    goto unlock;
  }
  gpuipc_buf_t *b = rx->pbuf;
  size_t n = (size_t)(gpuipc__layout_count((int)d->ndim, d->shape) *
                      gpuipc__dtype_size(d->dtype));
  const uint8_t *src = (const uint8_t *)gpuipc_buf_ptr(b) + d->offset;
  uint8_t *to = (uint8_t *)dl->data + dl->byte_offset;
  int rel_dev = -1;
  bool carried = false;
  if (gpuipc_buf_kind(b) == GPUIPC_KIND_HOST &&
      gpuipc__chan_is_host_dev(dl->device.device_type)) {
    if (n > 0)
      memcpy(to, src, n);
  } else {
    rel_dev = dl->device.device_type == GPUIPC_DL_CUDA
                  ? dl->device.device_id
                  : gpuipc_buf_device(b);
    if (rel_dev < 0) {
      rc = gpuipc__err(-EINVAL, "%s: destination device type %d", who,
                       dl->device.device_type);
      goto unlock;
    }
    rel_dev = gpuipc__stream_dev(stream, rel_dev);
    /* A HOST end mapped before this process had a CUDA context is pinned
     * now, for a DMA copy; unpinned, the driver still copies it (staged,
     * synchronously), so a failure here costs speed, not the message. */
    (void)gpuipc__host_pin(b, rel_dev);
    (void)gpuipc__host_pin(dst->buf, rel_dev);
    bool d2d = gpuipc_buf_kind(b) != GPUIPC_KIND_HOST &&
               dl->device.device_type == GPUIPC_DL_CUDA;
    /* The copy runs on the destination's GPU, whose engine must reach the
     * sender's memory: mapped for another GPU (the channel's device, or
     * the sender's), it is granted access from this one too (once). */
    if (d2d && gpuipc_buf_device(b) != rel_dev)
      rc = gpuipc_buf_access(b, rel_dev);
    if (rc == 0)
      rc = rx_ready(ch, rel_dev, stream);
    if (rc == 0 && n > 0)
      rc = rx_copy(ch, d->seq, d->slot, rel_dev, stream, to, src, n, d2d,
                   d2d && gpuipc_buf_device(b) == rel_dev, &carried);
    if (rc != 0)
      goto unlock;
  }
  uint64_t seq = d->seq;
  uint32_t slot = d->slot;
  rx->pending = false;
  rx->received++;
  rc = rx_release(ch, seq, slot, rel_dev, b, stream, n > 0 && rel_dev >= 0,
                  carried);
unlock:
  pthread_mutex_unlock(&rx->lock);
  return rc;
}

int gpuipc__chan_rx_done(struct gpuipc_channel *ch, int dev,
                         const gpuipc_buf_t *mem, void *stream, bool busy,
                         bool carried)
{
  struct gpuipc__rx *rx = &ch->rx;
  uint64_t seq = rx->pdesc.seq;
  uint32_t slot = rx->pdesc.slot;
  gpuipc__chan_blocks_drop(ch);
  rx->pending = false;
  rx->received++;
  return rx_release(ch, seq, slot, dev, mem, stream, busy, carried);
}

int gpuipc__chan_inject_release(struct gpuipc_channel *ch, const void *bytes,
                                size_t len)
{
  if (len > GPUIPC__CHAN_REL_BYTES)
    return -EINVAL;
  struct gpuipc__rx *rx = &ch->rx;
  pthread_mutex_lock(&rx->rel_lock);
  uint8_t *dst = gpuipc__chan_rel_slot(ch->rx_rel, rx->rel_head);
  memset(dst, 0, GPUIPC__CHAN_REL_BYTES);
  memcpy(dst, bytes, len);
  rx->rel_head++;
  gpuipc__chan_publish(&ch->rxd->rel_head, rx->rel_head, &ch->rxd->send_sleep);
  gpuipc__chan_poke(ch);
  pthread_mutex_unlock(&rx->rel_lock);
  return 0;
}

struct gpuipc__view *gpuipc__view_of(gpuipc_tensor_t *t)
{
  if (t == NULL)
    return NULL;
  struct gpuipc__view *v = (struct gpuipc__view *)t;
  return v->magic == GPUIPC__VIEW_MAGIC ? v : NULL;
}

int gpuipc_tensor_release(gpuipc_tensor_t *t, void *stream)
{
  struct gpuipc__view *v = gpuipc__view_of(t);
  if (v == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_tensor_release: not a received "
                       "view");
  struct gpuipc_channel *ch = v->ch;
  int rc = 0;
  /* A view of the parent's (after fork()): its release is the parent's to
   * publish; the channel's locks may be held by threads this process
   * lacks. */
  if (!gpuipc__chan_stale(ch))
    rc = rx_release(ch, v->seq, v->slot,
                    v->device >= 0 ? gpuipc__stream_dev(stream, v->device)
                                   : -1,
                    v->t.buf, stream, v->waits && stream == v->recv_stream,
                    false);
  gpuipc_buf_release(v->t.buf);
  v->magic = 0;
  free(v);
  atomic_fetch_sub(&ch->rx.views, 1);
  gpuipc__chan_unref(ch);
  return rc;
}

void gpuipc__chan_rx_close(struct gpuipc_channel *ch)
{
  struct gpuipc__rx *rx = &ch->rx;
  for (int i = 0; i < rx->nbufs; i++)
    gpuipc_buf_release(rx->bufs[i].buf);
  rx->nbufs = 0;
  gpuipc__chan_blocks_drop(ch);
  gpuipc__chan_event_tab_free(rx->evs, rx->nevs);
  pthread_mutex_lock(&rx->rel_lock);
  gpuipc__chan_event_pool_free(rx->rel_ev, rx->rel_ev_sent, rx->ndev,
                               rx->depth);
  rx->rel_ev = NULL;
  /* A counter block goes back only once every word is written: a launch
   * still running would use it (an unfinished one keeps it, unused). */
  if (gpuipc__chan_words_written(ch)) {
    gpuipc__chan_kcounters_put(&rx->kc);
    gpuipc__chan_klist_free(ch); /* else a launch may still read one */
  }
  free(rx->word_seq);
  rx->word_seq = NULL;
  pthread_mutex_unlock(&rx->rel_lock);
  free((void *)rx->ready_wait);
  rx->ready_wait = NULL;
}
