/*
 * Channels: large stages. A tensor whose memory gpuipc did not allocate
 * (t->buf NULL) is copied into the sender's own exported memory, and that
 * memory travels. One that fits a staging slot (stage_slot_bytes) takes a
 * slot of the area's slot buffer (send.c); a larger one is copied, with
 * one memcpy or one copy on the caller's stream, into a large stage: a
 * gpuipc buffer of its own (HOST for the host area, GPUIPC_KIND_AUTO on
 * device d), its size rounded up to 2 MiB, sent as any buffer is (its
 * handle the first time, its key after), so that the receiver gets one
 * contiguous zero-copy view, as from a slot.
 *
 * Why not chunks through the slots: the receiver's view must be
 * contiguous, so chunks would need a second copy on the receiver (half the
 * bandwidth on one GPU), and a send that blocks on the receiver in the
 * middle of a message.
 *
 * An area keeps its large stages for the next large sends: at most
 * stage_slots of them and stage_large_bytes together, except that a
 * tensor larger than that still gets a stage of its own size when the area
 * keeps no other. A send takes the smallest free stage that holds the
 * tensor; else allocates one where the limits allow, freeing free ones
 * when that makes room; else waits for a message in flight (any one) to
 * come free and looks again: a stage a held view keeps costs that stage. A freed stage leaves the table of buffers the
 * receiver holds and its key is queued to be forgotten (send.c), so that
 * the receiver unmaps it and the memory really goes.
 */
#include "channel/channel.h"
#include "mem/mem.h"

#include <stdio.h>
#include <string.h>

#define LARGE_ALIGN ((size_t)2 << 20)

/* The smallest free stage of @s that holds @span bytes, or -1. */
static int large_fit(const struct gpuipc__stage *s, uint64_t span)
{
  int best = -1;
  for (int i = 0; i < GPUIPC__CHAN_LARGE_MAX; i++) {
    const struct gpuipc__large *l = &s->large[i];
    if (l->buf == NULL || l->busy || gpuipc_buf_size(l->buf) < span)
      continue;
    if (best < 0 ||
        gpuipc_buf_size(l->buf) < gpuipc_buf_size(s->large[best].buf))
      best = i;
  }
  return best;
}

/* The largest free stage of @s (it holds less than the send needs), or -1. */
static int large_victim(const struct gpuipc__stage *s)
{
  int best = -1;
  for (int i = 0; i < GPUIPC__CHAN_LARGE_MAX; i++) {
    const struct gpuipc__large *l = &s->large[i];
    if (l->buf == NULL || l->busy)
      continue;
    if (best < 0 ||
        gpuipc_buf_size(l->buf) > gpuipc_buf_size(s->large[best].buf))
      best = i;
  }
  return best;
}

/* Stages of @s (@busy_only: in flight only) and their bytes in *@bytes. */
static uint32_t large_count(const struct gpuipc__stage *s, bool busy_only,
                            size_t *bytes)
{
  uint32_t n = 0;
  *bytes = 0;
  for (int i = 0; i < GPUIPC__CHAN_LARGE_MAX; i++)
    if (s->large[i].buf != NULL && (s->large[i].busy || !busy_only)) {
      n++;
      *bytes += gpuipc_buf_size(s->large[i].buf);
    }
  return n;
}

/* Whether @n stages of @bytes leave room for one more of @size. */
static bool large_room(const struct gpuipc_channel *ch, uint32_t n,
                       size_t bytes, size_t size)
{
  if (n == 0)
    return true; /* a tensor beyond the limit still goes, alone */
  return n < ch->stage_slots && bytes <= ch->stage_large_bytes &&
         size <= ch->stage_large_bytes - bytes;
}

/* Free stage @i of @s: the receiver is told to forget it. */
static void large_drop(struct gpuipc_channel *ch, struct gpuipc__stage *s,
                       int i)
{
  struct gpuipc__large *l = &s->large[i];
  gpuipc__chan_known_forget(&ch->tx, l->buf);
  s->large_bytes -= gpuipc_buf_size(l->buf);
  gpuipc_buf_release(l->buf);
  l->buf = NULL;
}

/* A new stage of @size bytes for @span in area @area, its index in *@idx. */
static int large_alloc(struct gpuipc_channel *ch, int area, size_t size,
                       uint64_t span, int *idx)
{
  struct gpuipc__stage *s = &ch->tx.stage[area];
  int i = 0;
  while (s->large[i].buf != NULL)
    i++; /* fewer than stage_slots <= GPUIPC__CHAN_LARGE_MAX are kept */
  gpuipc_buf_t *b;
  int rc = gpuipc_buf_alloc(size, area == 0 ? GPUIPC_KIND_HOST
                                            : GPUIPC_KIND_AUTO,
                            area - 1, 0, &b);
  if (rc != 0) {
    char why[256];
    snprintf(why, sizeof(why), "%s", gpuipc_last_error());
    return gpuipc__err(rc, "gpuipc_channel_send: channel %s: no stage of "
                       "%zu bytes for a tensor of %llu bytes (nothing was "
                       "sent): %s", ch->name, size,
                       (unsigned long long)span, why);
  }
  s->large[i].buf = b;
  s->large[i].busy = false;
  s->large_bytes += size;
  *idx = i;
  return 0;
}

int gpuipc__chan_stage_large(struct gpuipc_channel *ch, int area,
                             uint64_t span, unsigned flags, uint64_t deadline,
                             int *idx)
{
  struct gpuipc__stage *s = &ch->tx.stage[area];
  /* span <= GPUIPC_SIZE_MAX_ABSURD: rounding up cannot overflow. */
  size_t size =
      (size_t)((span + LARGE_ALIGN - 1) & ~(uint64_t)(LARGE_ALIGN - 1));
  for (;;) {
    int i = large_fit(s, span);
    if (i >= 0) {
      *idx = i;
      return 0;
    }
    size_t bytes, busy_bytes;
    uint32_t n = large_count(s, false, &bytes);
    uint32_t busy = large_count(s, true, &busy_bytes);
    if (large_room(ch, busy, busy_bytes, size)) {
      /* Free stages too small for it make room, the largest first. */
      while (!large_room(ch, n, bytes, size)) {
        large_drop(ch, s, large_victim(s));
        n = large_count(s, false, &bytes);
      }
      return large_alloc(ch, area, size, span, idx);
    }
    int rc = gpuipc__chan_tx_wait_any(ch, flags, deadline, "large stage");
    if (rc != 0)
      return rc;
  }
}

void gpuipc__chan_stage_large_free(struct gpuipc__stage *s)
{
  for (int i = 0; i < GPUIPC__CHAN_LARGE_MAX; i++)
    if (s->large[i].buf != NULL) {
      gpuipc_buf_release(s->large[i].buf);
      s->large[i].buf = NULL;
    }
  s->large_bytes = 0;
}
