/*
 * Channels: a block batch's list, taken with its descriptor (recv.c's
 * rx_fetch calls gpuipc__chan_blocks_fetch): copied out of the sender's
 * host stage, decoded strictly (wire/blocks.c), its buffers imported or
 * forgotten in its order (rxbufs.c), every block checked against its
 * buffer as mapped here. A lie is GPUIPC_E_PROTO, and recv.c breaks the
 * channel for good. The blocks then wait in rx.pblocks for
 * gpuipc_channel_recv_blocks (blocks.c).
 */
#include "channel/channel.h"
#include "mem/mem.h"

#include <stdlib.h>
#include <string.h>

void gpuipc__chan_blocks_drop(struct gpuipc_channel *ch)
{
  struct gpuipc__rx_blocks *pb = ch->rx.pblocks;
  if (pb == NULL)
    return;
  free(pb->slots);
  free(pb->src);
  free(pb->bytes);
  free(pb);
  ch->rx.pblocks = NULL;
}

int gpuipc__chan_blocks_refuse(struct gpuipc_channel *ch, const char *who)
{
  return gpuipc__err(-EINVAL, "%s: message %llu is a block batch of %u "
                     "blocks: receive it with gpuipc_channel_recv_blocks",
                     who, (unsigned long long)ch->rx.pdesc.seq,
                     ch->rx.pblocks != NULL ? ch->rx.pblocks->n : 0);
}

/* Forget and import what the list's buffers say, in its order; then find
 * each (a key forgotten by a later entry is found by none). */
static int list_bufs(struct gpuipc_channel *ch, const struct gpuipc__blist *l,
                     struct gpuipc__rx_blocks *pb)
{
  const struct gpuipc__desc *d = &ch->rx.pdesc;
  const char *who = ch->who;
  unsigned long long seq = d->seq;
  for (uint32_t i = 0; i < l->nbufs; i++) {
    const struct gpuipc__blist_buf *e = &l->bufs[i];
    int rc = 0;
    if ((e->flags & GPUIPC__BLIST_FORGET) && e->forget_key == d->buf_key)
      return gpuipc__err(GPUIPC_E_PROTO, "%s: block list of message %llu "
                         "forgets buffer key %llu, the list's own", who, seq,
                         (unsigned long long)e->forget_key);
    if (e->flags & GPUIPC__BLIST_FORGET)
      rc = gpuipc__chan_rx_forget(ch, d->seq, e->forget_key, who);
    if (rc == 0 && (e->flags & GPUIPC__BLIST_NEW))
      rc = gpuipc__chan_rx_import(ch, d->seq, e->key, who);
    if (rc != 0)
      return rc;
  }
  for (uint32_t i = 0; i < l->nbufs; i++) {
    gpuipc_buf_t *b = gpuipc__chan_rx_buf(ch, l->bufs[i].key);
    if (b == NULL)
      return gpuipc__err(GPUIPC_E_PROTO, "%s: block list of message %llu "
                         "uses buffer key %llu, which the receiver does not "
                         "hold", who, seq,
                         (unsigned long long)l->bufs[i].key);
    bool host = gpuipc_buf_kind(b) == GPUIPC_KIND_HOST;
    int dev = host ? -1 : gpuipc_buf_device(b);
    if (i > 0 && (host != pb->host || dev != pb->dev))
      return gpuipc__err(GPUIPC_E_PROTO, "%s: block list of message %llu "
                         "mixes buffers of different kinds or devices", who,
                         seq);
    pb->host = host;
    pb->dev = dev;
    pb->bufs[i] = b;
  }
  pb->nbufs = l->nbufs;
  return 0;
}

/* The slots form's blocks, checked against their buffer as mapped here:
 * at once where it is as large as the list said (the decoder checked the
 * slots against that), else slot by slot. The slots are taken from @l. */
static int list_slots(struct gpuipc_channel *ch, struct gpuipc__blist *l,
                      struct gpuipc__rx_blocks *pb)
{
  uint64_t size = gpuipc_buf_size(pb->bufs[0]), b = l->slot_bytes;
  uint64_t nslots = size / b; /* wholly inside as mapped here */
  for (uint32_t i = 0; size < l->bufs[0].size && i < l->nblocks; i++)
    if (l->slots[i] >= nslots)
      return gpuipc__err(GPUIPC_E_PROTO, "%s: block list of message %llu: "
                         "block %u (slot %u, offset %llu, %llu bytes) "
                         "reaches outside buffer key %llu, %zu bytes as "
                         "mapped here", ch->who,
                         (unsigned long long)ch->rx.pdesc.seq, i,
                         l->slots[i],
                         (unsigned long long)l->slots[i] * b,
                         (unsigned long long)b,
                         (unsigned long long)l->bufs[0].key, (size_t)size);
  pb->slots = l->slots;
  l->slots = NULL;
  pb->slot_bytes = b;
  pb->slot_base = gpuipc_buf_ptr(pb->bufs[0]);
  pb->n = l->nblocks;
  return 0;
}

/* Each block of the full form, checked against its buffer as mapped
 * here. */
static int list_blocks(struct gpuipc_channel *ch,
                       const struct gpuipc__blist *l,
                       struct gpuipc__rx_blocks *pb)
{
  pb->src = malloc(l->nblocks * sizeof(*pb->src));
  pb->bytes = malloc(l->nblocks * sizeof(*pb->bytes));
  if (pb->src == NULL || pb->bytes == NULL)
    return gpuipc__err(-ENOMEM, "%s: out of memory", ch->who);
  uint64_t size[GPUIPC_CHANNEL_BLOCK_BUFS_MAX];
  const uint8_t *base[GPUIPC_CHANNEL_BLOCK_BUFS_MAX];
  for (uint32_t j = 0; j < l->nbufs; j++) {
    size[j] = gpuipc_buf_size(pb->bufs[j]);
    base[j] = gpuipc_buf_ptr(pb->bufs[j]);
  }
  for (uint32_t i = 0; i < l->nblocks; i++) {
    const struct gpuipc__blist_block *b = &l->blocks[i];
    if (b->offset + b->bytes > size[b->buf]) /* no overflow: decoded */
      return gpuipc__err(GPUIPC_E_PROTO, "%s: block list of message %llu: "
                         "block %u (offset %llu, %llu bytes) reaches outside "
                         "buffer key %llu, %zu bytes as mapped here",
                         ch->who, (unsigned long long)ch->rx.pdesc.seq, i,
                         (unsigned long long)b->offset,
                         (unsigned long long)b->bytes,
                         (unsigned long long)l->bufs[b->buf].key,
                         (size_t)size[b->buf]);
    pb->src[i] = base[b->buf] + b->offset;
    pb->bytes[i] = (size_t)b->bytes;
  }
  pb->n = l->nblocks;
  return 0;
}

int gpuipc__chan_blocks_spell(struct gpuipc_channel *ch, const char *who)
{
  struct gpuipc__rx_blocks *pb = ch->rx.pblocks;
  if (pb->src != NULL)
    return 0;
  pb->src = malloc(pb->n * sizeof(*pb->src));
  pb->bytes = malloc(pb->n * sizeof(*pb->bytes));
  if (pb->src == NULL || pb->bytes == NULL) {
    free(pb->src);
    free(pb->bytes);
    pb->src = NULL;
    pb->bytes = NULL;
    return gpuipc__err(-ENOMEM, "%s: out of memory", who);
  }
  for (uint32_t i = 0; i < pb->n; i++) {
    pb->src[i] = pb->slot_base + (uint64_t)pb->slots[i] * pb->slot_bytes;
    pb->bytes[i] = (size_t)pb->slot_bytes;
  }
  return 0;
}

/* Decode the list copied out (@copy, @len bytes) into a new rx.pblocks. */
static int list_take(struct gpuipc_channel *ch, const uint8_t *copy,
                     size_t len)
{
  struct gpuipc__blist *l = malloc(sizeof(*l));
  struct gpuipc__rx_blocks *pb = calloc(1, sizeof(*pb));
  int rc = l != NULL && pb != NULL
               ? gpuipc__blist_decode(copy, len, ch->rx.pdesc.seq, l,
                                      ch->who)
               : gpuipc__err(-ENOMEM, "%s: out of memory", ch->who);
  if (rc == 0) {
    rc = list_bufs(ch, l, pb);
    if (rc == 0)
      rc = l->slots != NULL ? list_slots(ch, l, pb) : list_blocks(ch, l, pb);
    gpuipc__blist_free(l);
  }
  free(l);
  ch->rx.pblocks = pb;
  if (rc != 0)
    gpuipc__chan_blocks_drop(ch);
  return rc;
}

int gpuipc__chan_blocks_fetch(struct gpuipc_channel *ch, gpuipc_buf_t *lb)
{
  const struct gpuipc__desc *d = &ch->rx.pdesc;
  if (gpuipc_buf_kind(lb) != GPUIPC_KIND_HOST)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: block list of message %llu lies "
                       "in GPU memory (buffer key %llu), not in the sender's "
                       "host stage", ch->who, (unsigned long long)d->seq,
                       (unsigned long long)d->buf_key);
  /* The descriptor's layout was checked against the mapping: in range. */
  size_t len = (size_t)d->shape[0];
  uint8_t *copy = malloc(len);
  if (copy == NULL)
    return gpuipc__err(-ENOMEM, "%s: out of memory for a %zu-byte block "
                       "list", ch->who, len);
  /* Copied out first: the sender may write its memory while we decode. */
  memcpy(copy, (const uint8_t *)gpuipc_buf_ptr(lb) + d->offset, len);
  int rc = list_take(ch, copy, len);
  free(copy);
  return rc;
}

