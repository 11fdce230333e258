/*
 * Channels: open (options, the segment, the rendezvous of rendezvous.c,
 * the ring pointers), close and information. The two sides live in
 * send.c and recv.c, which gpuipc_channel_close asks to let go
 * of what they hold; a channel is freed with its last reference (the
 * user's, and one per received view).
 */
#include "channel/channel.h"
#include "cuda/cuda.h"
#include "domain/domain.h"
#include "mem/mem.h"
#include "os/os.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEGMENT_PREFIX "chan."
#define STAGE_SLOTS_DEFAULT 4
#define STAGE_SLOT_BYTES_DEFAULT ((size_t)4 << 20)
#define STAGE_LARGE_BYTES_DEFAULT ((size_t)1 << 30)

static int name_check(const char *name)
{
  size_t n = strlen(name);
  if (n == 0 || n > GPUIPC_CHANNEL_NAME_MAX)
    return gpuipc__err(-EINVAL, "gpuipc_channel_open: channel name \"%.80s\" "
                       "must have 1 to %d characters", name,
                       GPUIPC_CHANNEL_NAME_MAX);
  if (name[0] == '.')
    return gpuipc__err(-EINVAL, "gpuipc_channel_open: channel name \"%s\" "
                       "must not start with '.'", name);
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
      return gpuipc__err(-EINVAL, "gpuipc_channel_open: channel name \"%s\" "
                         "has '%c' at %zu; allowed: A-Z a-z 0-9 . _ -",
                         name, c, i);
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Options                                                                  */
/* ------------------------------------------------------------------------ */

static int opts_read(const gpuipc_channel_opts_t *o, gpuipc_domain_t *dom,
                     struct gpuipc__chan_cfg *c)
{
  static const char who[] = "gpuipc_channel_open";
  gpuipc_channel_opts_t v = GPUIPC_CHANNEL_OPTS_INIT;
  if (o != NULL) {
    int rc = gpuipc__size_check(o->size, "gpuipc_channel_open: opts");
    if (rc != 0)
      return rc;
    /* An older, smaller struct: the fields it lacks take their defaults. */
    gpuipc__opts_read(&v, sizeof(v), o, o->size);
    if (v.flags != 0)
      return gpuipc__err(-EINVAL, "%s: opts->flags 0x%x (must be 0)", who,
                         v.flags);
  }
  c->dom_timeout_ms = gpuipc__dom_timeout(dom);
  int rc = gpuipc__timeout_resolve(who, "opts->timeout_ms", v.timeout_ms,
                                   c->dom_timeout_ms, &c->timeout_ms);
  if (rc == 0)
    rc = gpuipc__timeout_resolve(who, "opts->send_timeout_ms",
                                 v.send_timeout_ms, c->dom_timeout_ms,
                                 &c->send_timeout_ms);
  if (rc != 0)
    return rc;
  c->depth = v.depth != 0 ? v.depth : GPUIPC__CHAN_DEPTH_DEFAULT;
  if (c->depth > GPUIPC__CHAN_DEPTH_MAX || (c->depth & (c->depth - 1)) != 0)
    return gpuipc__err(-EINVAL, "%s: depth %u is not a power of two in "
                       "1..%d", who, c->depth, GPUIPC__CHAN_DEPTH_MAX);
  c->device = v.device_set ? v.device : -1;
  if (c->device < -1)
    return gpuipc__err(-EINVAL, "%s: device %d", who, c->device);
  c->stage_slots = v.stage_slots != 0 ? v.stage_slots : STAGE_SLOTS_DEFAULT;
  if (c->stage_slots > 64)
    return gpuipc__err(-EINVAL, "%s: stage_slots %u exceeds 64", who,
                       c->stage_slots);
  c->stage_slot_bytes = v.stage_slot_bytes != 0 ? v.stage_slot_bytes
                                                : STAGE_SLOT_BYTES_DEFAULT;
  if (c->stage_slot_bytes > ((size_t)1 << 40) / c->stage_slots)
    return gpuipc__err(-EINVAL, "%s: stage_slot_bytes %zu is too large", who,
                       c->stage_slot_bytes);
  c->stage_slot_bytes = (c->stage_slot_bytes + 255) & ~(size_t)255;
  c->stage_large_bytes = v.stage_large_bytes != 0 ? v.stage_large_bytes
                                                  : STAGE_LARGE_BYTES_DEFAULT;
  return 0;
}

static int chan_setup(struct gpuipc_channel *ch,
                      const struct gpuipc__chan_cfg *c)
{
  struct gpuipc__chan_shm *shm = ch->shm;
  int e = ch->end;
  uint32_t peer_depth = shm->dir[1 - e].depth;
  if (peer_depth == 0 || peer_depth > GPUIPC__CHAN_DEPTH_MAX ||
      (peer_depth & (peer_depth - 1)) != 0)
    return gpuipc__err(GPUIPC_E_PROTO, "gpuipc_channel_open: channel %s: "
                       "the peer's depth %u is not a power of two in 1..%d",
                       ch->name, peer_depth, GPUIPC__CHAN_DEPTH_MAX);
  snprintf(ch->who, sizeof(ch->who), "channel %s (peer pid %d)", ch->name,
           (int)ch->peer_pid);
  ch->txd = &shm->dir[e];
  ch->rxd = &shm->dir[1 - e];
  ch->tx_ring = ch->base + GPUIPC__CHAN_DESC_OFF(e);
  ch->rx_ring = ch->base + GPUIPC__CHAN_DESC_OFF(1 - e);
  ch->tx_rel = ch->base + GPUIPC__CHAN_REL_OFF(e);
  ch->rx_rel = ch->base + GPUIPC__CHAN_REL_OFF(1 - e);
  ch->tx_words = (_Atomic uint64_t *)(ch->base + GPUIPC__CHAN_WORD_OFF(e));
  ch->rx_words = (_Atomic uint64_t *)(ch->base + GPUIPC__CHAN_WORD_OFF(1 - e));
  ch->tx_ready = (_Atomic uint64_t *)(ch->base + GPUIPC__CHAN_READY_OFF(e));
  ch->rx_ready = (_Atomic uint64_t *)(ch->base + GPUIPC__CHAN_READY_OFF(1 - e));
  ch->tx.depth = c->depth;
  ch->tx.next_seq = 1;
  ch->tx.next_key = 1;
  ch->tx.recs = calloc(c->depth, sizeof(*ch->tx.recs));
  ch->tx.free_slots = calloc(c->depth, sizeof(*ch->tx.free_slots));
  ch->rx.depth = peer_depth;
  ch->rx.expect_seq = 1;
  ch->rx.kernel_max =
      (uint64_t)gpuipc__cfg_long(GPUIPC_CFG_CHAN_COPY_KERNEL_KB, 16384) * 1024;
  ch->spin_ns =
      (uint64_t)gpuipc__cfg_long(GPUIPC_CFG_CHAN_SPIN_US, 2000) * 1000;
  if (ch->tx.recs == NULL || ch->tx.free_slots == NULL)
    return gpuipc__err(-ENOMEM, "gpuipc_channel_open: out of memory");
  /* Slot 0 is taken first. */
  for (uint32_t i = 0; i < c->depth; i++)
    ch->tx.free_slots[i] = c->depth - 1 - i;
  ch->tx.nfree = c->depth;
  ch->tx.first = ch->tx.last = GPUIPC__CHAN_NO_SLOT;
  return 0;
}

int gpuipc_channel_open(gpuipc_domain_t *dom, const char *name,
                        const gpuipc_channel_opts_t *opts,
                        gpuipc_channel_t **out)
{
  if (dom == NULL || name == NULL || out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_channel_open: NULL %s",
                       dom == NULL ? "domain" : name == NULL ? "name" : "out");
  int rc = name_check(name);
  if (rc != 0)
    return rc;
  struct gpuipc__chan_cfg c;
  rc = opts_read(opts, dom, &c);
  if (rc != 0)
    return rc;
  char segname[GPUIPC_NAME_MAX + 1];
  snprintf(segname, sizeof(segname), SEGMENT_PREFIX "%s", name);

  struct gpuipc_channel *ch = calloc(1, sizeof(*ch));
  if (ch == NULL)
    return gpuipc__err(-ENOMEM, "gpuipc_channel_open: out of memory");
  atomic_init(&ch->refs, 1);
  snprintf(ch->name, sizeof(ch->name), "%s", name);
  ch->sock = -1;
  ch->peer_pidfd = -1;
  ch->fork_gen = gpuipc__fork_gen();
  rc = gpuipc__chan_poll_init(ch);
  if (rc != 0)
    goto free_ch;
  ch->device = c.device;
  ch->send_timeout_ms = c.send_timeout_ms;
  ch->dom_timeout_ms = c.dom_timeout_ms;
  ch->stage_slots = c.stage_slots;
  ch->stage_slot_bytes = c.stage_slot_bytes;
  ch->stage_large_bytes = c.stage_large_bytes;
  pthread_mutex_init(&ch->tx.lock, NULL);
  pthread_mutex_init(&ch->rx.lock, NULL);
  pthread_mutex_init(&ch->rx.rel_lock, NULL);
  pthread_mutex_init(&ch->rx.seen_lock, NULL);

  /* The timeout is for the other end. The segment's mapping starts no
   * CUDA, but registers with a context this process has (mem/host.c):
   * finding one, which loads the driver for gpuipc when another part of
   * the process has loaded it, is local work and comes first. */
  (void)gpuipc__ctx_in_use();
  uint64_t deadline = gpuipc__deadline(c.timeout_ms);
  for (;;) {
    gpuipc_buf_t *seg = NULL;
    /* Scratch: the rendezvous inside it starts from the zeroes of a new
     * memfd and orders itself. */
    gpuipc_segment_opts_t so = GPUIPC_SEGMENT_OPTS_INIT;
    so.bytes = GPUIPC__CHAN_SEG_BYTES;
    so.kind = GPUIPC_KIND_HOST;
    so.flags = GPUIPC_CREATE | GPUIPC_SCRATCH;
    /* The open's own wait, not the domain's: a segment the other opener
     * is still creating (its first HOST buffer may start CUDA) is part of
     * waiting for that opener. */
    so.timeout_ms = gpuipc__ms_left(deadline);
    rc = gpuipc_segment_open(dom, segname, &so, &seg);
    if (rc == -ETIMEDOUT) {
      char why[256];
      snprintf(why, sizeof(why), "%s", gpuipc_last_error());
      rc = gpuipc__err(-ETIMEDOUT, "gpuipc_channel_open: channel %s: no "
                       "peer in time (%s)", name, why);
    }
    if (rc != 0)
      goto free_ch;
    if (gpuipc_buf_kind(seg) != GPUIPC_KIND_HOST ||
        gpuipc_buf_size(seg) < GPUIPC__CHAN_SEG_BYTES) {
      gpuipc_buf_release(seg);
      rc = gpuipc__err(GPUIPC_E_MISMATCH, "gpuipc_channel_open: segment %s "
                       "exists and is not a channel's", segname);
      goto free_ch;
    }
    ch->seg = seg;
    ch->base = gpuipc_buf_ptr(seg);
    ch->shm = (struct gpuipc__chan_shm *)ch->base;
    gpuipc__chan_hook(name, GPUIPC__CHAN_HOOK_MAPPED);
    rc = gpuipc__chan_rendezvous(ch, dom, segname, &c, deadline);
    if (rc == GPUIPC__CHAN_PAIR_DONE)
      break;
    ch->seg = NULL;
    ch->shm = NULL;
    ch->base = NULL;
    gpuipc_buf_release(seg);
    if (rc < 0)
      goto free_ch;
    if (gpuipc__chan_past(deadline)) {
      rc = gpuipc__err(-ETIMEDOUT, "gpuipc_channel_open: channel %s: no "
                       "peer in time", name);
      goto free_ch;
    }
    gpuipc__sleep_us(1000);
  }
  rc = chan_setup(ch, &c);
  if (rc != 0)
    goto free_ch;
  GPUIPC_LOG_D("channel %s: end %d, peer pid %d, depth %u/%u", name,
               ch->end, (int)ch->peer_pid, ch->tx.depth, ch->rx.depth);
  *out = ch;
  return 0;

free_ch:
  /* The only reference: closes and frees what there is. */
  gpuipc__chan_unref(ch);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Closing, information, test hooks                                         */
/* ------------------------------------------------------------------------ */

/*
 * gpuipc_channel_close in a child made by fork(), of its parent's channel:
 * free this process's memory and descriptors, tell the peer nothing. The
 * locks may have been held at fork() by threads of the parent; no thread
 * of this process holds them (every other call on @ch fails before it
 * takes one). The socket was closed at fork() (src/domain/fork.c); its
 * number may be another descriptor's now.
 */
static void close_stale(struct gpuipc_channel *ch)
{
  pthread_mutex_init(&ch->tx.lock, NULL);
  pthread_mutex_init(&ch->rx.lock, NULL);
  pthread_mutex_init(&ch->rx.rel_lock, NULL);
  pthread_mutex_init(&ch->rx.seen_lock, NULL);
  atomic_store(&ch->closing, 1); /* a view released later tells nobody */
  ch->sock = -1;
  gpuipc__fd_close(&ch->peer_pidfd); /* inherited: our own copy */
  ch->rx.guarded = false; /* the parent's guard: this process has none */
  gpuipc__chan_poll_close(ch); /* our copies of the eventfds */
  gpuipc__chan_tx_close(ch);
  gpuipc__chan_rx_close(ch);
  gpuipc__chan_unref(ch);
}

int gpuipc_channel_close(gpuipc_channel_t *ch)
{
  if (ch == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_channel_close: NULL channel");
  if (gpuipc__chan_stale(ch)) {
    close_stale(ch);
    return 0;
  }
  pthread_mutex_lock(&ch->rx.rel_lock);
  atomic_store(&ch->closing, 1);
  pthread_mutex_unlock(&ch->rx.rel_lock);
  if (ch->shm != NULL) {
    atomic_store(&ch->shm->closed[ch->end], 1);
    gpuipc__chan_poke(ch); /* a peer waiting on its fd learns of it */
    for (int d = 0; d < 2; d++) {
      gpuipc__futex_wake((uint32_t *)&ch->shm->dir[d].head, INT_MAX);
      gpuipc__futex_wake((uint32_t *)&ch->shm->dir[d].rel_head, INT_MAX);
    }
  }
  gpuipc__chan_settle(ch); /* before our events are destroyed */
  gpuipc__chan_guard_remove(ch); /* before the socket goes */
  gpuipc__fd_close(&ch->sock);
  gpuipc__fd_close(&ch->peer_pidfd);
  gpuipc__chan_poll_close(ch);

  gpuipc__chan_tx_close(ch);
  gpuipc__chan_rx_close(ch);
  gpuipc__chan_unref(ch);
  return 0;
}

int gpuipc_channel_info(gpuipc_channel_t *ch, gpuipc_channel_info_t *out)
{
  if (ch == NULL || out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_channel_info: NULL %s",
                       ch == NULL ? "channel" : "out");
  if (gpuipc__chan_stale(ch))
    return gpuipc__chan_stale_err(ch, "gpuipc_channel_info");
  gpuipc_channel_info_t i;
  memset(&i, 0, sizeof(i));
  i.size = out->size;
  snprintf(i.name, sizeof(i.name), "%s", ch->name);
  i.end = ch->end;
  i.peer_pid = (int)ch->peer_pid;
  pthread_mutex_lock(&ch->tx.lock);
  (void)gpuipc__chan_tx_recycle(ch); /* count no message that is free */
  i.depth = ch->tx.depth;
  i.sent = ch->tx.sent;
  i.in_flight = ch->tx.depth - ch->tx.nfree;
  i.oldest_in_flight = gpuipc__chan_tx_oldest(&ch->tx);
  i.buffers_sent = ch->tx.bufs_sent;
  pthread_mutex_unlock(&ch->tx.lock);
  pthread_mutex_lock(&ch->rx.lock);
  i.peer_depth = ch->rx.depth;
  i.received = ch->rx.received;
  i.buffers_imported = ch->rx.bufs_imported;
  i.buffers_mapped = (uint64_t)ch->rx.nbufs;
  pthread_mutex_unlock(&ch->rx.lock);
  i.views = atomic_load(&ch->rx.views);
  i.peer_gone = atomic_load(&ch->broken) == GPUIPC_E_PEER_GONE;
  memcpy(out, &i, out->size < sizeof(i) ? out->size : sizeof(i));
  return 0;
}
