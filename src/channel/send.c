/*
 * Channels: the sending side (gpuipc_channel_send, _send_done, _send_wait,
 * _on_release, _progress), its flow control and staging, and the test
 * hooks that write raw descriptors.
 *
 * Data path. Each direction has a descriptor ring and a release ring in
 * the segment, single producer and single consumer each. Message s of a
 * direction is the s-th descriptor (s = 1, 2, ...); the sender keeps a
 * record of it in a free record slot until it is free, so at most depth
 * messages are in flight, and the rings (GPUIPC__CHAN_DEPTH_MAX slots)
 * never overflow (a descriptor not taken, or a release not taken in, is
 * a message in flight).
 *
 * Out of order. A message is free once the receiver released it and its
 * GPU work on it is done (release word or event), whatever became of the
 * messages before it: its record slot, its staging slot or large stage go
 * back at once. So a receiver that holds one view costs the sender that
 * message's record slot (and its staging slot or large stage), not the
 * channel; the descriptor carries the record slot, and the receiver keys
 * the message's release event and release word by it. The records in
 * flight are also kept in a list in sending order, which gives the oldest
 * one (gpuipc_channel_info) and finds a ticket.
 * A buffer's handle and fd go over the socket just before the first
 * descriptor that uses it (flag NEW_BUF): sendmsg has queued the message
 * at the receiver before the descriptor is published, so the receiver
 * reads it without waiting, and a NEW_BUF whose message is not there is a
 * broken peer (GPUIPC_E_PROTO at once). The sender remembers the 256
 * buffers the receiver holds and tells it to forget the least recently
 * used one when it needs room.
 */
#include "channel/channel.h"
#include "cuda/cuda.h"
#include "mem/mem.h"
#include "os/os.h"
#include "wire/wire.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

#define BUFMSG_TIMEOUT_MS 5000 /* a sender's wait for room on the socket */
#define PEER_LOOK_NS 1000000ull /* how often a send polls for a hang-up */
#define POLL_YIELD_NS 2000000ull /* a wait for GPU work yields, then naps */

/* Sending side                                                             */
/* ------------------------------------------------------------------------ */

/* The record slot of @r. */
static uint32_t tx_slot(const struct gpuipc__tx *tx,
                        const struct gpuipc__tx_rec *r)
{
  return (uint32_t)(r - tx->recs);
}

uint64_t gpuipc__chan_tx_oldest(const struct gpuipc__tx *tx)
{
  return tx->first == GPUIPC__CHAN_NO_SLOT ? 0 : tx->recs[tx->first].seq;
}

/* The record of message @seq while it is in flight, else NULL (free, or
 * never sent). The list is in sending order: the walk ends at a later one. */
static struct gpuipc__tx_rec *tx_find(struct gpuipc__tx *tx, uint64_t seq)
{
  for (uint32_t i = tx->first; i != GPUIPC__CHAN_NO_SLOT;
       i = tx->recs[i].next) {
    if (tx->recs[i].seq >= seq)
      return tx->recs[i].seq == seq ? &tx->recs[i] : NULL;
  }
  return NULL;
}

/* Put the record in slot @i, just filled, at the end of the list. */
static void tx_link(struct gpuipc__tx *tx, uint32_t i)
{
  struct gpuipc__tx_rec *r = &tx->recs[i];
  r->prev = tx->last;
  r->next = GPUIPC__CHAN_NO_SLOT;
  if (tx->last != GPUIPC__CHAN_NO_SLOT)
    tx->recs[tx->last].next = i;
  else
    tx->first = i;
  tx->last = i;
}

static void tx_unlink(struct gpuipc__tx *tx, struct gpuipc__tx_rec *r)
{
  if (r->prev != GPUIPC__CHAN_NO_SLOT)
    tx->recs[r->prev].next = r->next;
  else
    tx->first = r->next;
  if (r->next != GPUIPC__CHAN_NO_SLOT)
    tx->recs[r->next].prev = r->prev;
  else
    tx->last = r->prev;
}

static void tx_rec_free(struct gpuipc_channel *ch, struct gpuipc__tx_rec *r)
{
  if (r->buf != NULL)
    gpuipc_buf_release(r->buf);
  for (uint32_t i = 0; i < r->nmore; i++)
    gpuipc_buf_release(r->more[i]);
  free(r->more);
  if (r->stage >= 0 && ch->tx.stage != NULL) {
    struct gpuipc__stage *s = &ch->tx.stage[r->stage];
    if (r->large >= 0)
      s->large[r->large].busy = false;
    else if (r->slot >= 0)
      s->busy &= ~(1ull << r->slot);
  }
  memset(r, 0, sizeof(*r));
  r->stage = -1;
  r->slot = -1;
  r->large = -1;
}

/* Take in the releases the receiver has published. Returns how many. */
static int tx_take(struct gpuipc_channel *ch)
{
  struct gpuipc__tx *tx = &ch->tx;
  const char *who = ch->who;
  int rc = gpuipc__chan_broken(ch, false);
  if (rc != 0)
    return rc;
  uint32_t h = atomic_load_explicit(&ch->txd->rel_head, memory_order_acquire);
  uint32_t avail = h - tx->rel_tail;
  if (avail == 0)
    return 0;
  if (avail > tx->depth) {
    return gpuipc__chan_break(ch, gpuipc__err(GPUIPC_E_PROTO, "%s: %u "
                              "releases published, more than the %u "
                              "messages that can be in flight", who, avail,
                              tx->depth));
  }
  int taken = 0;
  while (tx->rel_tail != h) {
    uint8_t slot[GPUIPC__CHAN_REL_BYTES];
    memcpy(slot, gpuipc__chan_rel_slot(ch->tx_rel, tx->rel_tail),
           sizeof(slot));
    struct gpuipc__rel rl;
    rc = gpuipc__rel_decode(slot, sizeof(slot), &rl, who);
    struct gpuipc__tx_rec *r = rc == 0 && rl.slot < tx->depth
                                   ? &tx->recs[rl.slot]
                                   : NULL;
    if (rc == 0 && (r == NULL || rl.seq == 0 || r->seq != rl.seq ||
                    r->released))
      rc = gpuipc__err(GPUIPC_E_PROTO, "%s: release of message %llu (record "
                       "slot %u), which is not in flight", who,
                       (unsigned long long)rl.seq, rl.slot);
    gpuipc_event_t *ev = NULL;
    /* Opened where the sender's streams most likely wait: the buffer's GPU.
     * None when the receiver closed with its work complete (settle.c). */
    if (rc == 0 && (rl.flags & GPUIPC__REL_EVENT)) {
      rc = gpuipc__chan_peer_ev_enter(ch, who);
      if (rc == 0) {
        rc = gpuipc__chan_event_peer(
            &tx->rel_evs, &tx->nrel_evs, &tx->caprel_evs, rl.ev_key,
            (rl.flags & GPUIPC__REL_NEW_EVENT) ? rl.ev_handle : NULL,
            r->buf != NULL ? gpuipc_buf_device(r->buf) : -1, who, &ev);
        gpuipc__chan_peer_ev_leave(ch);
      } else if (rc == 1) {
        rc = 0;
      }
    }
    if (rc == GPUIPC_E_PROTO)
      return gpuipc__chan_break(ch, rc);
    if (rc != 0)
      return rc;
    r->released = true;
    tx->unfree++;
    r->rel_ev = ev;
    r->rel_key = rl.ev_key;
    r->rel_word = (rl.flags & GPUIPC__REL_WORD) != 0;
    r->rel_away = (rl.flags & GPUIPC__REL_AWAY) != 0;
    tx->rel_tail++;
    taken++;
    if (tx->cb != NULL)
      tx->cb(ch, rl.seq, tx->cb_user);
  }
  atomic_store_explicit(&ch->poll_rel_tail, tx->rel_tail,
                        memory_order_relaxed);
  return taken;
}

/* Whether @r's release word has reached its message. */
static bool word_reached(struct gpuipc_channel *ch,
                         const struct gpuipc__tx_rec *r)
{
  uint64_t w = atomic_load_explicit(&ch->tx_words[tx_slot(&ch->tx, r)],
                                    memory_order_acquire);
  return (int64_t)(w - r->seq) >= 0;
}

/* Whether the receiver's work on @r's buffer is over (its release word
 * or event): 0; -EAGAIN; an error (GPUIPC_E_PEER_GONE: it closed with
 * that work unfinished). A word that arrived needs no look at the peer. */
static int rel_query(struct gpuipc_channel *ch, struct gpuipc__tx_rec *r)
{
  if (r->rel_word && word_reached(ch, r))
    r->rel_word = false;
  if (!r->rel_word && r->rel_ev == NULL)
    return 0;
  int rc = gpuipc__chan_peer_ev_enter(ch, ch->who);
  if (rc == 1) {
    r->rel_word = false; /* the receiver closed, its work complete */
    r->rel_ev = NULL;
    return 0;
  }
  if (rc != 0)
    return rc;
  if (!r->rel_word)
    rc = gpuipc_event_query(r->rel_ev);
  else if (word_reached(ch, r))
    r->rel_word = false;
  else
    rc = -EAGAIN;
  gpuipc__chan_peer_ev_leave(ch);
  return rc;
}

/* Message @r is free: its record slot, staging slot or large stage and
 * buffer reference go back. */
static void tx_retire(struct gpuipc_channel *ch, struct gpuipc__tx_rec *r)
{
  struct gpuipc__tx *tx = &ch->tx;
  tx_unlink(tx, r);
  tx_rec_free(ch, r);
  tx->unfree--;
  tx->free_slots[tx->nfree++] = tx_slot(tx, r);
  tx->freed++;
}

/* Free every released message whose buffer is free again, in any order:
 * one still held (not released) holds up none after it. */
static int tx_recycle(struct gpuipc_channel *ch)
{
  if (ch->tx.recs == NULL)
    return 0;
  struct gpuipc__tx *tx = &ch->tx;
  uint32_t left = tx->unfree;
  for (uint32_t i = tx->first; i != GPUIPC__CHAN_NO_SLOT && left > 0;) {
    struct gpuipc__tx_rec *r = &tx->recs[i];
    i = r->next;
    if (!r->released)
      continue;
    left--;
    int q = rel_query(ch, r);
    if (q == -EAGAIN)
      continue;
    if (q != 0)
      return q;
    tx_retire(ch, r);
  }
  return 0;
}

/* Take releases in and recycle; how many were taken in, or an error. */
static int tx_progress(struct gpuipc_channel *ch)
{
  int n = tx_take(ch);
  if (n < 0)
    return n;
  int rc = tx_recycle(ch);
  return rc < 0 ? rc : n;
}

enum { NAP_YIELD, NAP_SHORT, NAP_RELEASE };

/*
 * Let the send lock go for a nap (NAP_YIELD, NAP_SHORT: 20 us, NAP_RELEASE:
 * until a release arrives or @deadline) and take it back, so that another
 * thread's send, progress or ticket query does not wait behind a sleeping
 * sender. The caller looks at everything again after: another thread may
 * have sent, or taken releases in, meanwhile (tx->unlocks tells that it
 * may have).
 */
static int tx_sleep(struct gpuipc_channel *ch, int nap, uint64_t deadline)
{
  struct gpuipc__tx *tx = &ch->tx;
  uint32_t seen = tx->rel_tail;
  int rc = 0;
  tx->unlocks++;
  pthread_mutex_unlock(&tx->lock);
  if (nap == NAP_RELEASE)
    rc = gpuipc__chan_wait(ch, &ch->txd->rel_head, seen, &ch->txd->send_sleep,
                           deadline, &ch->tx.wait_ns);
  else if (nap == NAP_SHORT)
    gpuipc__sleep_us(20);
  else
    sched_yield();
  pthread_mutex_lock(&tx->lock);
  return rc;
}

/* tx_wait's @poll: no GPU work polled, or that of any released message. */
#define POLL_NONE UINT64_MAX
#define POLL_ANY 0

/*
 * Wait until @done(ch, arg) holds: releases are taken in between, and a
 * released message whose event or word is pending (@poll: that ticket's,
 * POLL_ANY: any one's, POLL_NONE: none) is polled. The send lock is let
 * go while it sleeps.
 */
static bool pending_event(struct gpuipc_channel *ch, uint64_t ticket);

static int tx_wait(struct gpuipc_channel *ch, uint64_t deadline,
                   bool (*done)(struct gpuipc_channel *, uint64_t),
                   uint64_t arg, uint64_t poll)
{
  uint64_t polling = 0; /* when polling a GPU event began */
  for (;;) {
    int rc = tx_progress(ch);
    if (rc < 0)
      return rc;
    if (done(ch, arg))
      return 0;
    if (poll != POLL_NONE && pending_event(ch, poll)) {
      /* The GPU still works on a released buffer: poll its event. */
      if (deadline == 0)
        return -EAGAIN;
      if (gpuipc__chan_past(deadline))
        return -ETIMEDOUT;
      /* Copies end within microseconds to milliseconds: yield first,
       * sleep after POLL_YIELD_NS (a nap oversleeps by the timer slack,
       * 50 us, which a copy of tens of microseconds would feel). */
      uint64_t now = gpuipc__now_ns();
      if (polling == 0)
        polling = now;
      tx_sleep(ch, now - polling < POLL_YIELD_NS ? NAP_YIELD : NAP_SHORT, 0);
      continue;
    }
    rc = tx_sleep(ch, NAP_RELEASE, deadline);
    if (rc != 0)
      return rc;
  }
}

static bool has_room(struct gpuipc_channel *ch, uint64_t unused)
{
  (void)unused;
  return ch->tx.nfree > 0;
}

/* Whether a message came free since ch->tx.freed was @freed. */
static bool came_free(struct gpuipc_channel *ch, uint64_t freed)
{
  return ch->tx.freed != freed;
}

static bool ticket_free(struct gpuipc_channel *ch, uint64_t ticket)
{
  struct gpuipc__tx_rec *r = tx_find(&ch->tx, ticket);
  return r == NULL || (r->released && rel_query(ch, r) == 0);
}

static bool ticket_released(struct gpuipc_channel *ch, uint64_t ticket)
{
  struct gpuipc__tx_rec *r = tx_find(&ch->tx, ticket);
  return r == NULL || r->released;
}

/* Whether waiting for @ticket (POLL_ANY: for any message) means polling
 * the GPU: a released message whose event or word is pending. After
 * tx_progress, every released message in flight is such a one. */
static bool pending_event(struct gpuipc_channel *ch, uint64_t ticket)
{
  struct gpuipc__tx *tx = &ch->tx;
  if (ticket == POLL_ANY)
    return tx->unfree > 0;
  struct gpuipc__tx_rec *r = tx_find(tx, ticket);
  return r != NULL && r->released && (r->rel_ev != NULL || r->rel_word);
}

/* When a blocked send gives up (send_timeout_ms: 0 does not wait, -1
 * waits forever). */
static uint64_t send_deadline(const struct gpuipc_channel *ch)
{
  return gpuipc__chan_deadline_of(ch->send_timeout_ms);
}

/* Room for one more message (flow control), waiting until @deadline. */
static int tx_room(struct gpuipc_channel *ch, unsigned flags,
                   uint64_t deadline)
{
  struct gpuipc__tx *tx = &ch->tx;
  int rc = tx_progress(ch);
  if (rc < 0)
    return rc;
  if (has_room(ch, 0))
    return 0;
  if (flags & GPUIPC_SEND_NONBLOCK) {
    gpuipc__chan_arm(ch);
    return gpuipc__err(-EAGAIN,
                       "gpuipc_channel_send: channel %s has %u messages in "
                       "flight, its depth (the oldest: message %llu)",
                       ch->name, tx->depth,
                       (unsigned long long)gpuipc__chan_tx_oldest(tx));
  }
  rc = tx_wait(ch, deadline, has_room, 0, POLL_ANY);
  if (rc == -EAGAIN) {
    gpuipc__chan_arm(ch);
    return gpuipc__err(-EAGAIN,
                       "gpuipc_channel_send: channel %s has %u messages in "
                       "flight, its depth (the oldest: message %llu; "
                       "send_timeout_ms 0: no wait)",
                       ch->name, tx->depth,
                       (unsigned long long)gpuipc__chan_tx_oldest(tx));
  }
  if (rc == -ETIMEDOUT)
    return gpuipc__err(-ETIMEDOUT,
                       "gpuipc_channel_send: channel %s: %u messages "
                       "in flight and none given back within %d ms (the "
                       "oldest: message %llu)",
                       ch->name, tx->depth, ch->send_timeout_ms,
                       (unsigned long long)gpuipc__chan_tx_oldest(tx));
  return rc;
}

int gpuipc__chan_tx_wait_any(struct gpuipc_channel *ch, unsigned flags,
                             uint64_t deadline, const char *what)
{
  struct gpuipc__tx *tx = &ch->tx;
  unsigned long long oldest = gpuipc__chan_tx_oldest(tx);
  if (flags & GPUIPC_SEND_NONBLOCK) {
    gpuipc__chan_arm(ch);
    return gpuipc__err(-EAGAIN, "gpuipc_channel_send: channel %s: every %s "
                       "is in flight (the oldest message: %llu)", ch->name,
                       what, oldest);
  }
  int rc = tx_wait(ch, deadline, came_free, tx->freed, POLL_ANY);
  if (rc == -EAGAIN) {
    gpuipc__chan_arm(ch);
    return gpuipc__err(-EAGAIN, "gpuipc_channel_send: channel %s: every %s "
                       "is in flight (the oldest message: %llu; "
                       "send_timeout_ms 0: no wait)", ch->name, what, oldest);
  }
  if (rc == -ETIMEDOUT)
    return gpuipc__err(-ETIMEDOUT, "gpuipc_channel_send: channel %s: no %s "
                       "came free within %d ms (the oldest message in "
                       "flight: %llu)", ch->name, what, ch->send_timeout_ms,
                       (unsigned long long)gpuipc__chan_tx_oldest(tx));
  if (rc != 0)
    return rc;
  return tx_recycle(ch);
}

/*
 * The staging areas (host, then each device), made as far as @area (0:
 * the host area alone, which loads no CUDA), and whether @area is one.
 */
static int stage_areas(struct gpuipc_channel *ch, int area)
{
  struct gpuipc__tx *tx = &ch->tx;
  if (area < tx->nstage)
    return 0;
  int n = area == 0 ? 1 : gpuipc__chan_dev_count() + 1;
  if (area >= n)
    return gpuipc__err(-ERANGE, "gpuipc_channel_send: device %d is not visible",
                       area - 1);
  struct gpuipc__stage *t = realloc(tx->stage, (size_t)n * sizeof(*t));
  if (t == NULL)
    return gpuipc__err(-ENOMEM, "gpuipc_channel_send: out of memory");
  memset(t + tx->nstage, 0, (size_t)(n - tx->nstage) * sizeof(*t));
  tx->stage = t;
  tx->nstage = n;
  return 0;
}

/*
 * A free staging slot on area @area (0: host, d + 1: device d), waiting
 * until @deadline.
 */
static int stage_get(struct gpuipc_channel *ch, int area, unsigned flags,
                     uint64_t deadline, int *slot_out)
{
  struct gpuipc__tx *tx = &ch->tx;
  struct gpuipc__stage *s = &tx->stage[area];
  if (s->buf == NULL) {
    int rc = gpuipc_buf_alloc(ch->stage_slots * ch->stage_slot_bytes,
                              area == 0 ? GPUIPC_KIND_HOST : GPUIPC_KIND_AUTO,
                              area - 1, 0, &s->buf);
    if (rc != 0)
      return rc;
  }
  uint64_t all = ch->stage_slots == 64 ? UINT64_MAX
                                        : (1ull << ch->stage_slots) - 1;
  while ((s->busy & all) == all) {
    /* Every slot is in flight: wait until a message comes free. */
    int rc = gpuipc__chan_tx_wait_any(ch, flags, deadline, "staging slot");
    if (rc != 0)
      return rc;
  }
  int slot = __builtin_ctzll(~s->busy);
  *slot_out = slot;
  return 0;
}

/*
 * Room for message @t, and when it is staged (@span bytes) a staging area
 * in *@area and a slot there in *@slot, or a large stage in *@large when
 * it is larger than a slot (else -1). A wait for either lets the send
 * lock go, and another thread may take what was found: look again until
 * a pass finds both without letting it go.
 */
static int tx_reserve(struct gpuipc_channel *ch, const gpuipc_tensor_t *t,
                      uint64_t span, unsigned flags, int *area, int *slot,
                      int *large)
{
  *area = -1;
  if (t->buf == NULL)
    *area = gpuipc__chan_is_host_dev(t->dl.device.device_type)
                ? 0
                : t->dl.device.device_id + 1;
  return gpuipc__chan_tx_reserve(ch, *area, span, flags, slot, large);
}

int gpuipc__chan_tx_reserve(struct gpuipc_channel *ch, int area,
                            uint64_t span, unsigned flags, int *slot,
                            int *large)
{
  struct gpuipc__tx *tx = &ch->tx;
  uint64_t deadline = send_deadline(ch);
  *slot = -1;
  *large = -1;
  if (area >= 0) {
    int rc = stage_areas(ch, area);
    if (rc != 0)
      return rc;
  }
  for (;;) {
    uint64_t unlocks = tx->unlocks;
    int rc = tx_room(ch, flags, deadline);
    if (rc == 0 && area >= 0 && span > ch->stage_slot_bytes)
      rc = gpuipc__chan_stage_large(ch, area, span, flags, deadline, large);
    else if (rc == 0 && area >= 0)
      rc = stage_get(ch, area, flags, deadline, slot);
    if (rc != 0 || tx->unlocks == unlocks)
      return rc;
  }
}

uint32_t gpuipc__chan_tx_next_slot(const struct gpuipc_channel *ch)
{
  return ch->tx.free_slots[ch->tx.nfree - 1];
}

gpuipc_buf_t *gpuipc__chan_stage_at(struct gpuipc_channel *ch, int area,
                                    int slot, int large, uint64_t *offset)
{
  struct gpuipc__stage *s = &ch->tx.stage[area];
  *offset = large >= 0 ? 0 : (uint64_t)slot * ch->stage_slot_bytes;
  return large >= 0 ? s->large[large].buf : s->buf;
}

/* Send @b's handle and fd to the receiver as @key. */
static int send_bufmsg(struct gpuipc_channel *ch, gpuipc_buf_t *b,
                       uint64_t key)
{
  gpuipc_handle_t h;
  int rc = gpuipc_buf_export(b, &h);
  if (rc != 0)
    return rc;
  uint8_t msg[GPUIPC__BUFMSG_BYTES];
  rc = gpuipc__bufmsg_encode(key, &h, msg, sizeof(msg));
  if (rc >= 0)
    rc = gpuipc__sock_send(ch->sock, msg, (size_t)rc, &h.fd, h.fd >= 0,
                           BUFMSG_TIMEOUT_MS);
  gpuipc__fd_close(&h.fd);
  if (rc == GPUIPC_E_PEER_GONE)
    gpuipc__chan_break(ch, rc);
  return rc;
}

/* Check @t and fill the layout part of @d; the offset into its buffer. */
static int send_check(struct gpuipc_channel *ch, const gpuipc_tensor_t *t,
                      struct gpuipc__desc *d, uint64_t *span)
{
  static const char who[] = "gpuipc_channel_send";
  const gpuipc_dl_tensor_t *dl = &t->dl;
  if (dl->ndim < 0 || dl->ndim > GPUIPC_TENSOR_MAX_DIMS)
    return gpuipc__err(-EINVAL, "%s: ndim %d is outside 0..%d", who,
                       dl->ndim, GPUIPC_TENSOR_MAX_DIMS);
  if (dl->ndim > 0 && dl->shape == NULL)
    return gpuipc__err(-EINVAL, "%s: shape is NULL with ndim %d", who,
                       dl->ndim);
  if (dl->data == NULL)
    return gpuipc__err(-EINVAL, "%s: data is NULL", who);
  d->type = GPUIPC__DESC_TENSOR;
  d->ndim = (uint32_t)dl->ndim;
  d->dtype = dl->dtype;
  d->dev_type = dl->device.device_type;
  d->dev_id = dl->device.device_id;
  for (int i = 0; i < dl->ndim; i++)
    d->shape[i] = dl->shape[i];
  /* The tensor's own strides, or row-major (the staged copy is). */
  const int64_t *strides = t->buf != NULL ? dl->strides : NULL;
  int64_t compact = 1;
  for (int i = dl->ndim - 1; i >= 0; i--) {
    d->strides[i] = strides != NULL ? strides[i] : compact;
    if (dl->shape[i] > 0 && compact <= ((int64_t)1 << 56) / dl->shape[i])
      compact *= dl->shape[i];
  }
  if (t->buf != NULL) {
    int rc = gpuipc__tensor_buf_offset(who, t, &d->offset);
    if (rc != 0)
      return rc;
    return gpuipc__layout_check(-EINVAL, who, dl->dtype, dl->ndim, dl->shape,
                                dl->strides, d->offset,
                                gpuipc_buf_size(t->buf), span);
  }
  /* Staged: contiguous (any size: a slot, or a large stage of its own). */
  int rc = gpuipc__layout_check(-EINVAL, who, dl->dtype, dl->ndim, dl->shape,
                                dl->strides, 0, GPUIPC_SIZE_MAX_ABSURD, span);
  if (rc != 0)
    return rc;
  if (!gpuipc__layout_compact(dl->ndim, dl->shape, dl->strides))
    return gpuipc__err(-EINVAL, "%s: memory gpuipc did not allocate is "
                       "staged, and must be contiguous (row-major)", who);
  if (!gpuipc__chan_is_host_dev(dl->device.device_type) &&
      dl->device.device_type != GPUIPC_DL_CUDA)
    return gpuipc__err(-EINVAL, "%s: device type %d (CPU, CUDA or CUDA host "
                       "memory only)", who, dl->device.device_type);
  if (dl->device.device_type == GPUIPC_DL_CUDA &&
      (dl->device.device_id < 0 ||
       dl->device.device_id >= gpuipc_device_count()))
    return gpuipc__err(-EINVAL, "%s: CUDA device %d is not visible", who,
                       dl->device.device_id);
  return 0;
}

/*
 * Copy staged tensor @t (@span bytes) into its stage @stage (at
 * d->offset) for descriptor @d, filling @post's device and what the copy
 * queued on the stream: host memory with memcpy; device memory into a GPU
 * stage with the copy kernel writing the ready word (one launch), else
 * the copy engine (the word or an event follows in tx_post). Send lock
 * held.
 */
static int stage_copy(struct gpuipc_channel *ch, const gpuipc_tensor_t *t,
                      uint64_t span, gpuipc_buf_t *stage,
                      struct gpuipc__desc *d, struct gpuipc__tx_post *post)
{
  const gpuipc_dl_tensor_t *dl = &t->dl;
  uint8_t *dst = (uint8_t *)gpuipc_buf_ptr(stage) + d->offset;
  const uint8_t *src = (const uint8_t *)dl->data + dl->byte_offset;
  d->flags |= GPUIPC__DESC_STAGED;
  if (post->area == 0) {
    if (span > 0)
      memcpy(dst, src, span);
    return 0;
  }
  int dev = dl->device.device_id;
  post->ev_dev = dev;
  if (span == 0)
    return 0;
  /* (A HOST stage, where no GPU has VMM, need not be pinned yet.) */
  int rc = gpuipc_buf_kind(stage) == GPUIPC_KIND_HOST
               ? GPUIPC_E_UNSUPPORTED
               : gpuipc__chan_ready_copy(ch, dev, post->stream,
                                         gpuipc__chan_tx_next_slot(ch),
                                         d->seq, dst, src, span);
  if (rc == 0)
    post->ready = true;
  else if (rc == GPUIPC_E_UNSUPPORTED)
    rc = gpuipc__stream_copy_async(dev, dst, src, span, post->stream, true);
  post->busy = rc == 0;
  return rc;
}

int gpuipc_channel_send(gpuipc_channel_t *ch, const gpuipc_tensor_t *t,
                        void *stream, unsigned flags, uint64_t *ticket)
{
  if (ch == NULL || t == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_channel_send: NULL %s",
                       ch == NULL ? "channel" : "tensor");
  if (flags & ~GPUIPC_SEND_NONBLOCK)
    return gpuipc__err(-EINVAL, "gpuipc_channel_send: flags 0x%x", flags);
  if (gpuipc__chan_stale(ch))
    return gpuipc__chan_stale_err(ch, "gpuipc_channel_send");
  struct gpuipc__desc d;
  memset(&d, 0, sizeof(d));
  uint64_t span = 0;
  int rc = send_check(ch, t, &d, &span);
  if (rc != 0)
    return rc;

  struct gpuipc__tx *tx = &ch->tx;
  pthread_mutex_lock(&tx->lock);
  rc = gpuipc__chan_tx_peer_check(ch);
  if (rc != 0)
    goto unlock;
  int area, slot, large;
  rc = tx_reserve(ch, t, span, flags, &area, &slot, &large);
  if (rc != 0)
    goto unlock;
  gpuipc_buf_t *buf = t->buf;
  struct gpuipc__tx_post post = {.hold = &buf, .nhold = 1, .area = area,
                                 .slot = slot, .large = large, .ev_dev = -1,
                                 .stream = stream};
  if (buf == NULL)
    buf = gpuipc__chan_stage_at(ch, area, slot, large, &d.offset);
  else if (gpuipc_buf_kind(buf) != GPUIPC_KIND_HOST)
    post.ev_dev = gpuipc_buf_device(buf);
  d.seq = tx->next_seq;
  d.buf_size = gpuipc_buf_size(buf);
  rc = gpuipc__chan_tx_intro(ch, buf, &d);
  if (rc != 0)
    goto unlock;
  if (t->buf == NULL) {
    /* Staged, after the stage's introduction: a ready word the copy
     * queued is never left written for a message that did not go. */
    rc = stage_copy(ch, t, span, buf, &d, &post);
    if (rc != 0) {
      if (d.flags & GPUIPC__DESC_NEW_BUF) /* no descriptor follows it */
        gpuipc__chan_break(ch, rc);
      goto unlock;
    }
  }
  rc = gpuipc__chan_tx_post(ch, &d, &post, ticket);
unlock:
  pthread_mutex_unlock(&tx->lock);
  return rc;
}

int gpuipc__chan_tx_peer_check(struct gpuipc_channel *ch)
{
  /* The socket's hang-up is looked at (a system call) at most once a
   * millisecond of sending; the close flag every time. */
  struct gpuipc__tx *tx = &ch->tx;
  uint64_t now = gpuipc__now_ns();
  bool look = now - tx->peer_looked_ns >= PEER_LOOK_NS;
  if (look)
    tx->peer_looked_ns = now;
  return gpuipc__chan_peer_check(ch, look ? GPUIPC__PEER_SOCK : 0);
}

int gpuipc__chan_tx_key(struct gpuipc_channel *ch, gpuipc_buf_t *buf,
                        uint64_t *key, uint64_t *forget, bool *is_new)
{
  struct gpuipc__tx *tx = &ch->tx;
  *forget = 0;
  *is_new = false;
  *key = gpuipc__chan_known_find(tx, buf);
  if (*key != 0)
    return 0;
  *key = gpuipc__chan_known_add(tx, buf, forget);
  int rc = send_bufmsg(ch, buf, *key);
  if (rc != 0) {
    gpuipc__chan_known_drop(tx, *key);
    if (*forget != 0)
      gpuipc__chan_break(ch, rc); /* the evicted entry is lost */
    return rc;
  }
  *is_new = true;
  tx->bufs_sent++;
  return 0;
}

int gpuipc__chan_tx_intro(struct gpuipc_channel *ch, gpuipc_buf_t *buf,
                          struct gpuipc__desc *d)
{
  bool is_new;
  uint64_t forget;
  int rc = gpuipc__chan_tx_key(ch, buf, &d->buf_key, &forget, &is_new);
  if (rc != 0 || !is_new)
    return rc;
  d->forget_key = forget;
  if (forget != 0)
    d->flags |= GPUIPC__DESC_FORGET;
  d->flags |= GPUIPC__DESC_NEW_BUF;
  return 0;
}

int gpuipc__chan_tx_post(struct gpuipc_channel *ch,
                         const struct gpuipc__desc *dp,
                         const struct gpuipc__tx_post *p, uint64_t *ticket)
{
  struct gpuipc__tx *tx = &ch->tx;
  struct gpuipc__desc d = *dp;
  uint64_t seq = d.seq;
  void *stream = p->stream;
  int ev_dev = p->ev_dev, rc;
  /* On the socket already: a failure from here on breaks the channel. */
  bool new_buf = p->on_socket || (d.flags & GPUIPC__DESC_NEW_BUF);
  gpuipc_buf_t **more = NULL;
  if (p->nhold > 1) {
    more = malloc((p->nhold - 1) * sizeof(*more));
    if (more == NULL) {
      rc = gpuipc__err(-ENOMEM, "gpuipc_channel_send: out of memory");
      goto broken;
    }
  }

  /* The record slot (tx_room left one free): taken once it is published. */
  uint32_t rs = gpuipc__chan_tx_next_slot(ch);
  d.slot = (uint16_t)rs;

  /* Order the message after the sender's stream (unless it is idle). */
  uint8_t *ev_sent = NULL;
  if (p->ready) {
    d.flags |= GPUIPC__DESC_WORD; /* the staging copy writes it */
    ev_dev = -1;
  } else if (ev_dev >= 0) {
    ev_dev = gpuipc__stream_dev(stream, ev_dev);
  }
  if (ev_dev >= 0 && (p->busy || !gpuipc__stream_idle(ev_dev, stream))) {
    /* A ready word (ready.c), or an event where the device has none. */
    rc = gpuipc__chan_ready_write(ch, ev_dev, stream, rs, seq);
    if (rc == 0) {
      d.flags |= GPUIPC__DESC_WORD;
    } else if (rc == GPUIPC_E_UNSUPPORTED) {
      rc = gpuipc__chan_event_record(&tx->ev, &tx->ev_sent, &tx->ndev,
                                     tx->depth, ev_dev, rs, stream, &d.ev_key,
                                     d.ev_handle, &ev_sent);
      if (rc != 0)
        goto broken;
      d.flags |= GPUIPC__DESC_EVENT | (ev_sent ? GPUIPC__DESC_NEW_EVENT : 0);
    } else {
      goto broken;
    }
  }

  struct gpuipc__tx_rec *r = &tx->recs[rs];
  r->seq = seq;
  r->released = false;
  r->rel_ev = NULL;
  gpuipc__buf_ref(p->hold[0]);
  r->buf = p->hold[0];
  for (uint32_t i = 1; i < p->nhold; i++) {
    gpuipc__buf_ref(p->hold[i]);
    more[i - 1] = p->hold[i];
  }
  r->more = more;
  r->nmore = p->nhold - 1;
  more = NULL;
  r->stage = p->area;
  r->slot = p->slot;
  r->large = p->large;
  if (p->large >= 0)
    tx->stage[p->area].large[p->large].busy = true;
  else if (p->area >= 0)
    tx->stage[p->area].busy |= 1ull << p->slot;
  bool forgets = gpuipc__chan_forget_queued(tx, &d);

  uint32_t head = tx->head; /* ours: never read back from shared memory */
  uint8_t *dst = gpuipc__chan_desc_slot(ch->tx_ring, head);
  rc = gpuipc__desc_encode(&d, dst, GPUIPC__CHAN_DESC_BYTES);
  if (rc < 0)
    goto broken;
  tx->head = head + 1;
  tx->nfree--;
  tx_link(tx, rs);
  gpuipc__chan_publish(&ch->txd->head, tx->head, &ch->txd->recv_sleep);
  gpuipc__chan_poke(ch);
  if (ev_sent != NULL)
    *ev_sent = 1;
  if (forgets)
    gpuipc__chan_forget_sent(tx);
  tx->next_seq++;
  tx->sent++;
  tx->last_key = d.buf_key;
  if (ticket != NULL)
    *ticket = seq;
  return 0;

broken:
  free(more);
  /* A buffer message may be on the socket already: nothing can follow. */
  if (new_buf)
    gpuipc__chan_break(ch, rc < 0 ? rc : GPUIPC_E_PROTO);
  return rc;
}

/*
 * Wait, with the send lock held, until @done holds for @ticket (@what:
 * "free", "released"), for gpuipc_channel_send_done and _send_wait (@who).
 */
static int ticket_wait(struct gpuipc_channel *ch, const char *who,
                       uint64_t ticket, int timeout_ms,
                       bool (*done)(struct gpuipc_channel *, uint64_t),
                       bool poll_events, const char *what)
{
  struct gpuipc__tx *tx = &ch->tx;
  unsigned long long t = ticket;
  if (ticket == 0 || ticket >= tx->next_seq)
    return gpuipc__err(-EINVAL, "%s: ticket %llu was not sent on channel %s",
                       who, t, ch->name);
  int ms = -1;
  int rc = gpuipc__timeout_resolve(who, "timeout_ms", timeout_ms,
                                   ch->dom_timeout_ms, &ms);
  if (rc != 0)
    return rc;
  rc = tx_wait(ch, gpuipc__chan_deadline_of(ms), done, ticket,
               poll_events ? ticket : POLL_NONE);
  if (rc == -EAGAIN) {
    gpuipc__chan_arm(ch);
    return gpuipc__err(-EAGAIN, "%s: message %llu is not %s yet", who, t,
                       what);
  }
  if (rc == -ETIMEDOUT)
    return gpuipc__err(-ETIMEDOUT, "%s: message %llu was not %s within %d "
                       "ms", who, t, what, ms);
  return rc;
}

int gpuipc_channel_send_done(gpuipc_channel_t *ch, uint64_t ticket,
                             int timeout_ms)
{
  if (ch == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_channel_send_done: NULL channel");
  if (gpuipc__chan_stale(ch))
    return gpuipc__chan_stale_err(ch, "gpuipc_channel_send_done");
  pthread_mutex_lock(&ch->tx.lock);
  int rc = ticket_wait(ch, "gpuipc_channel_send_done", ticket, timeout_ms,
                       ticket_free, true, "free");
  if (rc == 0)
    (void)tx_recycle(ch); /* free is free: out of the count in flight */
  pthread_mutex_unlock(&ch->tx.lock);
  return rc;
}

int gpuipc__chan_tx_recycle(struct gpuipc_channel *ch)
{
  return tx_recycle(ch);
}

/*
 * Make @stream wait until @r's release word reaches it (send lock held):
 * nothing when it does within the poll, a stream wait on the word, or,
 * where the stream's device cannot wait on one, the host waits here until
 * the message is free (@timeout_ms as the caller's). The poll is for a
 * word another process's stream writes on the stream's own GPU, where a
 * stream waiting on it would hold the GPU from that process (a switch
 * between contexts); a word written from another GPU (GPUIPC__REL_AWAY,
 * @stream on the GPU the buffer lies on) is waited on by the stream at
 * once, and the host goes on.
 */
static int word_stream_wait(struct gpuipc_channel *ch,
                            struct gpuipc__tx_rec *r, void *stream,
                            int timeout_ms, const char *who)
{
  struct gpuipc__tx *tx = &ch->tx;
  int home = r->buf != NULL ? gpuipc_buf_device(r->buf) : -1;
  int dev = gpuipc__stream_dev(stream, home >= 0 ? home : 0);
  bool away = r->rel_away && r->buf != NULL &&
              dev == gpuipc__chan_home_gpu(r->buf);
  uint64_t end = away ? 0 : gpuipc__now_ns() + gpuipc__chan_ev_poll_ns();
  while (!word_reached(ch, r) && gpuipc__now_ns() < end)
    ; /* a load a turn: the peer is looked at once, below */
  int q = rel_query(ch, r);
  if (q != -EAGAIN)
    return q;
  uint64_t words;
  if (gpuipc__chan_word_addr(&tx->words, ch->seg, ch->tx_words, dev, &words) == 0)
    return gpuipc__stream_word_wait(dev, stream,
                                    words + (uint64_t)tx_slot(tx, r) * 8,
                                    r->seq);
  uint64_t seq = r->seq; /* r may be another message's once the lock goes */
  int ms = -1;
  int rc = gpuipc__timeout_resolve(who, "timeout_ms", timeout_ms,
                                   ch->dom_timeout_ms, &ms);
  if (rc == 0)
    rc = tx_wait(ch, gpuipc__chan_deadline_of(ms), ticket_free, seq, seq);
  if (rc == -ETIMEDOUT)
    rc = gpuipc__err(-ETIMEDOUT, "%s: message %llu was not free within %d "
                     "ms", who, (unsigned long long)seq, ms);
  return rc;
}

int gpuipc_channel_send_wait(gpuipc_channel_t *ch, uint64_t ticket,
                             void *stream, int timeout_ms)
{
  if (ch == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_channel_send_wait: NULL channel");
  if (gpuipc__chan_stale(ch))
    return gpuipc__chan_stale_err(ch, "gpuipc_channel_send_wait");
  struct gpuipc__tx *tx = &ch->tx;
  pthread_mutex_lock(&tx->lock);
  int rc = ticket_wait(ch, "gpuipc_channel_send_wait", ticket, timeout_ms,
                       ticket_released, false, "released");
  struct gpuipc__tx_rec *r = rc == 0 ? tx_find(tx, ticket) : NULL;
  if (r != NULL) {
    gpuipc_event_t *ev = r->rel_ev;
    if (r->rel_word)
      rc = word_stream_wait(ch, r, stream, timeout_ms,
                            "gpuipc_channel_send_wait");
    if (ev != NULL) {
      rc = gpuipc__chan_peer_ev_enter(ch, "gpuipc_channel_send_wait");
      if (rc == 1) {
        r->rel_ev = ev = NULL; /* the receiver closed, its work complete */
        rc = 0;
      }
    }
    if (rc == 0 && ev != NULL) {
      int dev = gpuipc__stream_dev(stream, gpuipc_event_device(ev));
      /* The stream's device needs the event opened there. */
      if (dev != gpuipc_event_device(ev))
        rc = gpuipc__chan_event_peer(&tx->rel_evs, &tx->nrel_evs,
                                     &tx->caprel_evs, r->rel_key, NULL, dev,
                                     ch->who, &ev);
      if (rc == 0)
        rc = gpuipc__stream_wait_event(ev, stream, gpuipc__chan_ev_poll_ns());
      gpuipc__chan_peer_ev_leave(ch);
    }
  }
  pthread_mutex_unlock(&tx->lock);
  return rc;
}

int gpuipc_channel_on_release(gpuipc_channel_t *ch, gpuipc_release_fn fn,
                              void *user)
{
  if (ch == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_channel_on_release: NULL channel");
  if (gpuipc__chan_stale(ch))
    return gpuipc__chan_stale_err(ch, "gpuipc_channel_on_release");
  pthread_mutex_lock(&ch->tx.lock);
  ch->tx.cb = fn;
  ch->tx.cb_user = user;
  pthread_mutex_unlock(&ch->tx.lock);
  return 0;
}

int gpuipc_channel_progress(gpuipc_channel_t *ch)
{
  if (ch == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_channel_progress: NULL channel");
  if (gpuipc__chan_stale(ch))
    return gpuipc__chan_stale_err(ch, "gpuipc_channel_progress");
  pthread_mutex_lock(&ch->tx.lock);
  int rc = tx_progress(ch);
  if (rc == 0)
    gpuipc__chan_arm(ch); /* nothing came */
  pthread_mutex_unlock(&ch->tx.lock);
  return rc;
}


void gpuipc__chan_tx_close(struct gpuipc_channel *ch)
{
  struct gpuipc__tx *tx = &ch->tx;
  if (tx->recs != NULL)
    for (uint32_t i = 0; i < tx->depth; i++)
      if (tx->recs[i].seq != 0)
        tx_rec_free(ch, &tx->recs[i]);
  free(tx->recs);
  tx->recs = NULL;
  free(tx->free_slots);
  tx->free_slots = NULL;
  if (tx->stage != NULL) {
    for (int i = 0; i < tx->nstage; i++) {
      if (tx->stage[i].buf != NULL)
        gpuipc_buf_release(tx->stage[i].buf);
      gpuipc__chan_stage_large_free(&tx->stage[i]);
    }
    free(tx->stage);
  }
  if (tx->lists != NULL)
    gpuipc_buf_release(tx->lists);
  gpuipc__chan_event_pool_free(tx->ev, tx->ev_sent, tx->ndev, tx->depth);
  gpuipc__chan_event_tab_free(tx->rel_evs, tx->nrel_evs);
  /* A counter block goes back only once every ready word is written: a
   * staging launch still running would use it (an unfinished one keeps
   * it, unused). */
  if (gpuipc__chan_ready_settle(ch, 0))
    gpuipc__chan_kcounters_put(&tx->kc);
  free(tx->ready_seq);
  tx->ready_seq = NULL;
}

int gpuipc__chan_inject(struct gpuipc_channel *ch, const void *bytes,
                        size_t len, const void *bufmsg, size_t bufmsg_len,
                        int fd)
{
  if (len > GPUIPC__CHAN_DESC_BYTES)
    return -EINVAL;
  pthread_mutex_lock(&ch->tx.lock);
  int rc = 0;
  if (bufmsg != NULL)
    rc = gpuipc__sock_send(ch->sock, bufmsg, bufmsg_len, &fd, fd >= 0, 1000);
  if (rc == 0) {
    uint32_t head = ch->tx.head++;
    uint8_t *dst = gpuipc__chan_desc_slot(ch->tx_ring, head);
    memset(dst, 0, GPUIPC__CHAN_DESC_BYTES);
    memcpy(dst, bytes, len);
    gpuipc__chan_publish(&ch->txd->head, ch->tx.head, &ch->txd->recv_sleep);
    gpuipc__chan_poke(ch);
  }
  pthread_mutex_unlock(&ch->tx.lock);
  return rc;
}

uint64_t gpuipc__chan_last_key(struct gpuipc_channel *ch)
{
  pthread_mutex_lock(&ch->tx.lock);
  uint64_t k = ch->tx.last_key;
  pthread_mutex_unlock(&ch->tx.lock);
  return k;
}

uint64_t gpuipc__chan_next_seq(struct gpuipc_channel *ch)
{
  pthread_mutex_lock(&ch->tx.lock);
  uint64_t s = ch->tx.next_seq;
  pthread_mutex_unlock(&ch->tx.lock);
  return s;
}

