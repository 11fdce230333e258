/*
 * Channels: ready words, the receiver's stream waiting on the GPU for the
 * sender's work.
 *
 * A message sent from a stream with work pending is ordered after that
 * work. With an interprocess event, the receiver either polls the event
 * on the host (and its own work starts only once the host saw it) or
 * makes its stream wait for it. A ready word does the same with one
 * stream memory operation on each side: the sender's stream writes the
 * message's number into its record slot's word in the channel segment
 * (pinned, shared) once its work is done (cuStreamWriteValue64), and the
 * receiver's stream waits until the word reaches that number
 * (cuStreamWaitValue64, GEQ: the numbers of one slot only grow). Nothing
 * on the path waits on a host.
 *
 * On the sender's own GPU the receiver polls the word first, for as long
 * as it would poll an event (GPUIPC_CHAN_EVENT_POLL_US): a stream of
 * another process waiting there costs a switch between the two
 * processes' contexts (events.c); across GPUs it makes its stream wait
 * at once. A device that has no 64-bit stream memory operations (or a
 * segment CUDA cannot map for it) falls back: the sender records an
 * event, the receiver waits on the host.
 *
 * A sender that dies (or closes) before its stream wrote a word leaves
 * the receiver's stream waiting for ever, as nothing else would write
 * it: the receiver writes the numbers its streams wait for into the words
 * itself once it knows the sender is gone -- at its next call, at its
 * close, or through the guard (guard.c), a thread that watches the
 * sockets of channels whose streams wait. A closing sender first waits
 * (bounded) until its streams wrote every word it asked for.
 */
#include "channel/channel.h"
#include "cuda/cuda.h"
#include "mem/mem.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

/* Whether ready words are in use (GPUIPC_CHAN_READY_WORDS, default 1). */
static bool ready_on(void)
{
  return gpuipc__cfg_long(GPUIPC_CFG_CHAN_READY_WORDS, 1) != 0;
}

/* Whether word @w has reached @seq (numbers of a slot only grow). */
static bool reached(_Atomic uint64_t *w, uint64_t seq)
{
  return (int64_t)(atomic_load_explicit(w, memory_order_acquire) - seq) >= 0;
}

/* Where @dev's streams write the ready words (record slot 0's), once the
 * sender can note what each slot's word was asked to reach: 0, or
 * GPUIPC_E_UNSUPPORTED (words off, no memory, a segment @dev cannot map). */
static int ready_addr(struct gpuipc_channel *ch, int dev, uint64_t *addr)
{
  struct gpuipc__tx *tx = &ch->tx;
  if (!ready_on())
    return GPUIPC_E_UNSUPPORTED;
  if (tx->ready_seq == NULL) {
    tx->ready_seq = calloc(tx->depth, sizeof(*tx->ready_seq));
    if (tx->ready_seq == NULL)
      return GPUIPC_E_UNSUPPORTED;
  }
  if (gpuipc__chan_word_addr(&tx->ready, ch->seg, ch->tx_ready, dev, addr) !=
      0)
    return GPUIPC_E_UNSUPPORTED;
  return 0;
}

int gpuipc__chan_ready_write(struct gpuipc_channel *ch, int dev, void *stream,
                             uint32_t slot, uint64_t seq)
{
  uint64_t addr;
  if (ready_addr(ch, dev, &addr) != 0)
    return GPUIPC_E_UNSUPPORTED;
  int rc = gpuipc__stream_word_write(dev, stream, addr + (uint64_t)slot * 8,
                                     seq);
  if (rc == 0)
    ch->tx.ready_seq[slot] = seq;
  return rc;
}

int gpuipc__chan_ready_copy(struct gpuipc_channel *ch, int dev, void *stream,
                            uint32_t slot, uint64_t seq, void *dst,
                            const void *src, size_t n)
{
  uint64_t addr, count;
  if (n == 0 || n > ch->rx.kernel_max ||
      ((uintptr_t)dst | (uintptr_t)src) % 16 != 0 ||
      gpuipc__stream_dev(stream, dev) != dev ||
      ready_addr(ch, dev, &addr) != 0 || /* a device it cannot: here too */
      (count = gpuipc__chan_kcount(&ch->tx.kc, dev, slot)) == 0)
    return GPUIPC_E_UNSUPPORTED;
  int rc = gpuipc__copy_word(dev, dst, src, n, stream,
                             addr + (uint64_t)slot * 8, seq, count, true);
  if (rc == 0)
    ch->tx.ready_seq[slot] = seq;
  return rc;
}

int gpuipc__chan_home_gpu(const gpuipc_buf_t *b)
{
  if (gpuipc_buf_kind(b) == GPUIPC_KIND_HOST)
    return -1;
  const struct gpuipc_buf *base = b->base != NULL ? b->base : b;
  /* Not gpuipc_device_by_uuid: a GPU hidden from this process is no
   * error here, and a release or receive that goes well leaves
   * gpuipc_last_error() as it was. */
  for (int i = 0; i < gpuipc__dev_count(); i++) {
    const struct gpuipc__dev *d = gpuipc__dev_get(i);
    if (d != NULL && memcmp(d->info.uuid, base->uuid, sizeof(base->uuid)) == 0)
      return i;
  }
  return -1;
}

/* The host waits for word @w to reach @seq: the domain's timeout, the
 * peer looked at between naps. */
static int host_wait(struct gpuipc_channel *ch, _Atomic uint64_t *w,
                     uint64_t seq)
{
  uint64_t deadline = gpuipc__chan_deadline_of(ch->dom_timeout_ms);
  for (unsigned spins = 0; !reached(w, seq); spins++) {
    if (gpuipc__chan_past(deadline))
      return gpuipc__err(-ETIMEDOUT, "%s: the sender's GPU work before "
                         "message %llu did not complete within %d ms",
                         ch->who, (unsigned long long)seq, ch->dom_timeout_ms);
    if (spins < 64) {
      sched_yield();
      continue;
    }
    int rc = gpuipc__chan_peer_check(ch, GPUIPC__PEER_SOCK);
    if (rc != 0)
      return rc;
    gpuipc__sleep_us(20);
  }
  return 0;
}

int gpuipc__chan_ready_wait(struct gpuipc_channel *ch, int dev, void *stream,
                            gpuipc_buf_t *b)
{
  struct gpuipc__rx *rx = &ch->rx;
  const struct gpuipc__desc *d = &rx->pdesc;
  _Atomic uint64_t *w = &ch->rx_ready[d->slot];
  if (reached(w, d->seq))
    return 0; /* done already: the stream stays idle */
  if (gpuipc__chan_home_gpu(b) == dev) {
    uint64_t end = gpuipc__now_ns() + gpuipc__chan_ev_poll_ns();
    while (!reached(w, d->seq) && gpuipc__now_ns() < end)
      ;
    if (reached(w, d->seq))
      return 0;
  }
  if (rx->ready_wait == NULL) {
    rx->ready_wait = calloc(rx->depth, sizeof(*rx->ready_wait));
    if (rx->ready_wait == NULL)
      return host_wait(ch, w, d->seq);
  }
  uint64_t addr;
  if (gpuipc__chan_word_addr(&rx->ready, ch->seg, ch->rx_ready, dev, &addr) !=
          0 ||
      gpuipc__chan_guard_add(ch) != 0)
    return host_wait(ch, w, d->seq);
  /* Said before the wait is queued, read by the guard after it broke the
   * channel: one of the two sees the other (both sequentially consistent). */
  atomic_store(&rx->ready_wait[d->slot], d->seq);
  int rc = gpuipc__stream_word_wait(dev, stream, addr + (uint64_t)d->slot * 8,
                                    d->seq);
  rx->queued = rc == 0;
  if (atomic_load(&ch->broken) == GPUIPC_E_PEER_GONE)
    gpuipc__chan_ready_unblock(ch);
  return rc;
}

bool gpuipc__chan_ready_settle(struct gpuipc_channel *ch, uint64_t deadline)
{
  const struct gpuipc__tx *tx = &ch->tx;
  if (tx->ready_seq == NULL)
    return true;
  for (uint32_t i = 0; i < tx->depth; i++) {
    uint64_t want = tx->ready_seq[i];
    for (unsigned spins = 0; want != 0 && !reached(&ch->tx_ready[i], want);
         spins++) {
      if (gpuipc__now_ns() >= deadline)
        return false;
      if (spins < 64)
        sched_yield();
      else
        gpuipc__sleep_us(50);
    }
  }
  return true;
}

void gpuipc__chan_ready_close(struct gpuipc_channel *ch, uint64_t deadline)
{
  _Atomic uint64_t *waits = ch->rx.ready_wait;
  if (waits == NULL)
    return;
  for (uint32_t i = 0; i < ch->rx.depth; i++) {
    uint64_t want = atomic_load(&waits[i]);
    for (unsigned spins = 0; !reached(&ch->rx_ready[i], want) &&
                             gpuipc__now_ns() < deadline &&
                             atomic_load(&ch->broken) != GPUIPC_E_PEER_GONE &&
                             gpuipc__chan_peer_alive(ch);
         spins++) {
      if (spins < 64)
        sched_yield();
      else
        gpuipc__sleep_us(50);
    }
  }
  gpuipc__chan_ready_unblock(ch);
}
