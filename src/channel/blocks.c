/*
 * Channels: block batches (gpuipc_channel_send_blocks,
 * gpuipc_channel_recv_blocks). A KV cache moves as hundreds to thousands
 * of blocks of a few large buffers; a batch is one message of the
 * channel's: one descriptor, one record slot, one ticket, one release.
 *
 * Sending. The blocks are checked before anything is taken (each inside
 * its buffer, not empty, one kind and device). The block list (wire/
 * blocks.c: the buffers by key, the blocks by buffer index, offset and
 * length) is written into the part of the sender's list area (host
 * memory, GPUIPC__CHAN_LIST_BYTES a record slot) that belongs to the
 * message's record slot, so it is recycled with it; a list larger than a
 * part (more than about 1300 blocks) goes into a host staging slot or a
 * large stage instead, which the message holds until it is free (send.c's
 * tx_rec_free). The receiver maps that memory like any buffer; the
 * descriptor (GPUIPC__DESC_BLOCKS) names where the list lies. Each
 * buffer new to the receiver goes over the socket, the list's after the
 * descriptor's own, in the list's order; one evicted to make room, or a
 * queued one, is forgotten by the entry that needs the room. The message
 * holds a reference to each buffer and is ordered after the stream as
 * gpuipc_channel_send orders one (send.c's gpuipc__chan_tx_post).
 *
 * Receiving. With the descriptor (recv.c's rx_fetch) the list is taken
 * and checked (blocks_rx.c); the blocks wait in rx.pblocks until
 * gpuipc_channel_recv_blocks copies them (one launch of gpuipc's block
 * kernel between GPU memories, else one cuMemcpyBatchAsync, or memcpy
 * between host buffers) on the caller's stream after the sender's work,
 * and releases the message after the copies, with no host wait: the
 * kernel writes the release word itself once every source byte is read
 * (the last of its thread blocks to finish, as recv_into's copy kernel
 * does); after the driver's copies a stream of gpuipc's own writes it. A paged
 * cache's blocks (one buffer, one size, at multiples of it) travel in the
 * list's slots form: a u32 slot a block.
 */
#include "channel/channel.h"
#include "core/exact.h"
#include "cuda/cuda.h"
#include "mem/mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ----- checking a side's blocks ----- */

/* The distinct buffers of a side's blocks, and where each block's is. */
struct blocks_plan {
  gpuipc_buf_t *bufs[GPUIPC_CHANNEL_BLOCK_BUFS_MAX];
  uint32_t nbufs;
  uint32_t *idx; /* [n]: block i lies in bufs[idx[i]] (NULL: not wanted);
                  * in the slots form (paged), block i's slot */
  bool host;
  int dev;
  /* Destinations (overlap_check): every block in dst[0]'s buffer, this
   * many bytes, at a multiple of it (a paged cache's); 0: not so. */
  uint64_t uniform;
  /* Sources: checked by paged_plan, idx[] holding the slots. */
  bool paged;
};

/* "HOST memory" or "GPU memory of device D", into @buf. */
static void where(char *buf, size_t cap, bool host, int dev)
{
  if (host)
    snprintf(buf, cap, "HOST memory");
  else
    snprintf(buf, cap, "GPU memory of device %d", dev);
}

/* Buffer @buf of block @i (@what, as blocks_check): HOST, or on the
 * device of the side's first block, as that one is. -EINVAL. */
static int buf_check(const char *who, const char *what, struct blocks_plan *p,
                     const gpuipc_buf_t *buf, size_t i)
{
  bool host = gpuipc_buf_kind(buf) == GPUIPC_KIND_HOST;
  int dev = host ? -1 : gpuipc_buf_device(buf);
  if (i == 0) {
    p->host = host;
    p->dev = dev;
  } else if (host != p->host || dev != p->dev) {
    char here[40], first[40];
    where(here, sizeof(here), host, dev);
    where(first, sizeof(first), p->host, p->dev);
    return gpuipc__err(-EINVAL, "%s: %s %zu lies in %s, %s 0 in %s: one "
                       "batch is all HOST or all on one device", who, what,
                       i, here, what, first);
  }
  return 0;
}

/* The index of @buf among @p's buffers, added when new; -1 when there is
 * no room. */
static int plan_buf(struct blocks_plan *p, gpuipc_buf_t *buf)
{
  for (uint32_t j = 0; j < p->nbufs; j++)
    if (p->bufs[j] == buf)
      return (int)j;
  if (p->nbufs == GPUIPC_CHANNEL_BLOCK_BUFS_MAX)
    return -1;
  p->bufs[p->nbufs] = buf;
  return (int)p->nbufs++;
}

/* Why block @i (@what), in a buffer of @size bytes, is bad: empty, or
 * reaching outside it. Out of blocks_check's loop, which only finds it. */
static int __attribute__((cold, noinline))
block_bad(const char *who, const char *what, const gpuipc_block_t *b,
          size_t i, uint64_t size)
{
  if (b->bytes == 0)
    return gpuipc__err(-EINVAL, "%s: %s %zu is empty (0 bytes)", who, what,
                       i);
  return gpuipc__err(-EINVAL, "%s: %s %zu (offset %llu, %llu bytes) "
                     "reaches outside its %llu-byte buffer", who, what, i,
                     (unsigned long long)b->offset,
                     (unsigned long long)b->bytes, (unsigned long long)size);
}

/*
 * Check @n blocks of one side (@what names them in sentences): each in a
 * buffer, not empty, inside it; all HOST or all on one device. Fill @p
 * (its idx[] when not NULL). -EINVAL naming the first bad one. A buffer
 * is looked at when it differs from the previous block's: the blocks of a
 * paged cache cost a few instructions each.
 */
static int blocks_check(const char *who, const char *what,
                        const gpuipc_block_t *blocks, size_t n,
                        struct blocks_plan *p)
{
  if (n == 0 || n > GPUIPC_CHANNEL_BLOCKS_MAX)
    return gpuipc__err(-EINVAL, "%s: %zu blocks (1..%d)", who, n,
                       GPUIPC_CHANNEL_BLOCKS_MAX);
  p->nbufs = 0;
  const gpuipc_buf_t *seen = NULL; /* the previous block's, checked */
  uint64_t size = 0;
  uint32_t at = 0;
  for (size_t i = 0; i < n; i++) {
    const gpuipc_block_t *b = &blocks[i];
    if (GPUIPC__UNLIKELY(b->buf != seen)) {
      if (b->buf == NULL)
        return gpuipc__err(-EINVAL, "%s: %s %zu has a NULL buffer", who,
                           what, i);
      int rc = buf_check(who, what, p, b->buf, i);
      if (rc != 0)
        return rc;
      seen = b->buf;
      size = gpuipc_buf_size(seen);
      int k = p->idx != NULL ? plan_buf(p, b->buf) : 0;
      if (k < 0)
        return gpuipc__err(-EINVAL, "%s: %s %zu: the blocks lie in more "
                           "than %d buffers", who, what, i,
                           GPUIPC_CHANNEL_BLOCK_BUFS_MAX);
      at = (uint32_t)k;
    }
    /* Inside: not empty, and no further than size - offset (no overflow). */
    if (GPUIPC__UNLIKELY(b->bytes - 1 >= size || b->offset > size - b->bytes))
      return block_bad(who, what, b, i, size);
    if (p->idx != NULL)
      p->idx[i] = at;
  }
  return 0;
}

/*
 * Whether the @n blocks are a paged cache's, checked and their slots taken
 * in one pass: every block in blocks[0]'s buffer, of blocks[0]'s size (not
 * 0), at a multiple of it, wholly inside, its slot number below 2^32.
 * With y = (offset >> s) * inv, "y < the buffer's whole slots" holds just
 * when offset is a multiple inside the buffer and its slot is y (the
 * whole slots are at most exact_div's max: its two tests in one). Such a
 * batch's list takes the slots form, a sixth of the bytes. Fills @p
 * (idx[] the slots, paged); @p->idx is not NULL, so 0 < @n <= the most a
 * batch holds. false: not such a batch, or a bad block, which
 * blocks_check then names.
 */
static bool paged_plan(const char *who, const gpuipc_block_t *blocks,
                       size_t n, struct blocks_plan *p)
{
  gpuipc_buf_t *buf = blocks[0].buf;
  uint64_t b = blocks[0].bytes;
  if (buf == NULL || b == 0)
    return false;
  uint64_t slots = gpuipc_buf_size(buf) / b;
  if (slots > (uint64_t)UINT32_MAX + 1)
    slots = (uint64_t)UINT32_MAX + 1; /* a slot number fits 32 bits */
  struct gpuipc__exact e;
  gpuipc__exact_init(&e, b);
  uint64_t low = (UINT64_C(1) << e.shift) - 1;
  uint64_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    const gpuipc_block_t *k = &blocks[i];
    uint64_t y = (k->offset >> e.shift) * e.inv;
    bad |= (uint64_t)(k->buf != buf) | (k->bytes ^ b) | (k->offset & low) |
           (uint64_t)(y >= slots);
    p->idx[i] = (uint32_t)y;
  }
  if (bad != 0)
    return false;
  p->nbufs = 1;
  p->bufs[0] = buf;
  p->paged = true;
  return buf_check(who, "block", p, buf, 0) == 0; /* block 0: never fails */
}

/* ----- sending ----- */

/*
 * The list's buffers: each one's key for the receiver, its buffer message
 * sent when it is new (after the descriptor's own), with a key to forget
 * where room was made for it. *@on_socket: a buffer message went out.
 */
static int send_keys(struct gpuipc_channel *ch, const struct blocks_plan *p,
                     struct gpuipc__blist_buf *out, bool *on_socket)
{
  struct gpuipc__tx *tx = &ch->tx;
  int queued = 0; /* queued keys to forget that entries carry */
  for (uint32_t i = 0; i < p->nbufs; i++) {
    bool is_new;
    struct gpuipc__blist_buf *e = &out[i];
    memset(e, 0, sizeof(*e));
    int rc = gpuipc__chan_tx_key(ch, p->bufs[i], &e->key, &e->forget_key,
                                 &is_new);
    if (rc != 0)
      return rc;
    e->size = gpuipc_buf_size(p->bufs[i]);
    if (!is_new)
      continue;
    *on_socket = true;
    e->flags = GPUIPC__BLIST_NEW;
    /* Each new buffer makes room: its own eviction or a queued key. */
    if (e->forget_key == 0 && queued < tx->nforget)
      e->forget_key = tx->forget[queued++];
    if (e->forget_key != 0)
      e->flags |= GPUIPC__BLIST_FORGET;
  }
  tx->nforget -= queued;
  memmove(tx->forget, tx->forget + queued,
          (size_t)tx->nforget * sizeof(uint64_t));
  return 0;
}

/* The list's length: in the slots form (a paged batch), or the full one. */
static size_t list_len(const struct blocks_plan *p, uint32_t n)
{
  return p->paged ? gpuipc__blist_slots_bytes(n)
                  : gpuipc__blist_bytes(p->nbufs, n);
}

/* Write the list of message @seq at @dst (a paged batch's: the slots
 * form). */
static void list_write(uint8_t *dst, uint64_t seq, const struct blocks_plan *p,
                       const struct gpuipc__blist_buf *bufs,
                       const gpuipc_block_t *blocks, uint32_t n)
{
  if (p->paged) {
    uint64_t b = blocks[0].bytes;
    gpuipc__blist_put_slots_head(dst, seq, n, bufs, b);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    /* The wire's u32s are this host's: the slots as they are. */
    memcpy(dst + gpuipc__blist_slots_bytes(0), p->idx, n * sizeof(*p->idx));
#else
    for (uint32_t i = 0; i < n; i++)
      gpuipc__blist_put_slot(dst, i, p->idx[i]);
#endif
    return;
  }
  gpuipc__blist_put_head(dst, seq, p->nbufs, n, bufs);
  for (uint32_t i = 0; i < n; i++) {
    struct gpuipc__blist_block b = {.buf = p->idx[i],
                                    .offset = blocks[i].offset,
                                    .bytes = blocks[i].bytes};
    gpuipc__blist_put_block(dst, p->nbufs, i, &b);
  }
}

/* The list area (made at the first batch): depth parts of
 * GPUIPC__CHAN_LIST_BYTES, one a record slot. */
static int list_area(struct gpuipc_channel *ch)
{
  struct gpuipc__tx *tx = &ch->tx;
  if (tx->lists != NULL)
    return 0;
  return gpuipc_buf_alloc((size_t)tx->depth * GPUIPC__CHAN_LIST_BYTES,
                          GPUIPC_KIND_HOST, -1, 0, &tx->lists);
}

/*
 * Room for a batch whose list is @len bytes, and where the list goes:
 * *@lb at *@offset, in the next record slot's part of the list area, or
 * (larger than a part) in a host staging slot (*@slot) or large stage
 * (*@large), which the message holds until it is free.
 */
static int list_room(struct gpuipc_channel *ch, size_t len, unsigned flags,
                     gpuipc_buf_t **lb, uint64_t *offset, int *slot,
                     int *large)
{
  bool own = len <= GPUIPC__CHAN_LIST_BYTES;
  int rc = own ? list_area(ch) : 0;
  if (rc == 0)
    rc = gpuipc__chan_tx_reserve(ch, own ? -1 : 0, len, flags, slot, large);
  if (rc != 0)
    return rc;
  if (!own) {
    *lb = gpuipc__chan_stage_at(ch, 0, *slot, *large, offset);
    return 0;
  }
  *lb = ch->tx.lists;
  *offset = (uint64_t)gpuipc__chan_tx_next_slot(ch) * GPUIPC__CHAN_LIST_BYTES;
  return 0;
}

/* The send, send lock held: room, the list, the buffers, the post. */
static int send_locked(struct gpuipc_channel *ch, struct blocks_plan *p,
                       const gpuipc_block_t *blocks, uint32_t n, void *stream,
                       unsigned flags, uint64_t *ticket)
{
  struct gpuipc__tx *tx = &ch->tx;
  int rc = gpuipc__chan_tx_peer_check(ch);
  if (rc != 0)
    return rc;
  size_t len = list_len(p, n);
  int slot, large;
  struct gpuipc__desc d;
  memset(&d, 0, sizeof(d));
  gpuipc_buf_t *lb;
  rc = list_room(ch, len, flags, &lb, &d.offset, &slot, &large);
  if (rc != 0)
    return rc;
  d.type = GPUIPC__DESC_BLOCKS;
  d.seq = tx->next_seq;
  d.buf_size = gpuipc_buf_size(lb);
  d.dev_type = GPUIPC_DL_CPU;
  d.dtype = (gpuipc_dl_dtype_t){GPUIPC_DL_UINT, 8, 1};
  d.ndim = 1;
  d.shape[0] = (int64_t)len;
  d.strides[0] = 1;
  rc = gpuipc__chan_tx_intro(ch, lb, &d);
  if (rc != 0)
    return rc;
  bool on_socket = (d.flags & GPUIPC__DESC_NEW_BUF) != 0;
  struct gpuipc__blist_buf bufs[GPUIPC_CHANNEL_BLOCK_BUFS_MAX];
  rc = send_keys(ch, p, bufs, &on_socket);
  if (rc != 0) {
    /* A buffer message may be out already: nothing can follow it. */
    if (on_socket)
      gpuipc__chan_break(ch, rc);
    return rc;
  }
  list_write((uint8_t *)gpuipc_buf_ptr(lb) + d.offset, d.seq, p, bufs,
             blocks, n);
  struct gpuipc__tx_post post = {.hold = p->bufs, .nhold = p->nbufs,
                                 .area = slot >= 0 || large >= 0 ? 0 : -1,
                                 .slot = slot, .large = large,
                                 .ev_dev = p->host ? -1 : p->dev,
                                 .stream = stream, .on_socket = on_socket};
  return gpuipc__chan_tx_post(ch, &d, &post, ticket);
}

int gpuipc_channel_send_blocks(gpuipc_channel_t *ch,
                               const gpuipc_block_t *blocks, size_t n,
                               void *stream, unsigned flags,
                               uint64_t *ticket)
{
  static const char who[] = "gpuipc_channel_send_blocks";
  if (ch == NULL || blocks == NULL)
    return gpuipc__err(-EINVAL, "%s: NULL %s", who,
                       ch == NULL ? "channel" : "blocks");
  if (flags & ~GPUIPC_SEND_NONBLOCK)
    return gpuipc__err(-EINVAL, "%s: flags 0x%x", who, flags);
  if (gpuipc__chan_stale(ch))
    return gpuipc__chan_stale_err(ch, who);
  struct blocks_plan p;
  p.idx = n > 0 && n <= GPUIPC_CHANNEL_BLOCKS_MAX
              ? malloc(n * sizeof(*p.idx))
              : NULL;
  if (p.idx == NULL && n > 0 && n <= GPUIPC_CHANNEL_BLOCKS_MAX)
    return gpuipc__err(-ENOMEM, "%s: out of memory", who);
  p.paged = false;
  int rc = p.idx != NULL && paged_plan(who, blocks, n, &p)
               ? 0
               : blocks_check(who, "block", blocks, n, &p);
  if (rc == 0) {
    pthread_mutex_lock(&ch->tx.lock);
    rc = send_locked(ch, &p, blocks, (uint32_t)n, stream, flags, ticket);
    pthread_mutex_unlock(&ch->tx.lock);
  }
  free(p.idx);
  return rc;
}

/* ----- receiving: the copies ----- */

struct range {
  uintptr_t lo, hi;
  size_t i;
};

static int range_cmp(const void *a, const void *b)
{
  const struct range *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The slots bitmap for @words words, all zero: @ch's kept one (its lock
 * taken, *@own true), grown when short; or, while another thread holds
 * that one, a new one. NULL when out of memory. */
static uint64_t *seen_take(struct gpuipc_channel *ch, size_t words,
                           bool *own)
{
  struct gpuipc__rx *rx = &ch->rx;
  *own = pthread_mutex_trylock(&rx->seen_lock) == 0;
  if (!*own)
    return calloc(words, sizeof(uint64_t));
  if (rx->seen_words < words) {
    uint64_t *b = realloc(rx->seen, words * sizeof(*b));
    if (b == NULL) {
      pthread_mutex_unlock(&rx->seen_lock);
      *own = false;
      return NULL;
    }
    memset(b + rx->seen_words, 0, (words - rx->seen_words) * sizeof(*b));
    rx->seen = b;
    rx->seen_words = words;
  }
  return rx->seen;
}

/* Give back what seen_take gave, all zero again. */
static void seen_give(struct gpuipc_channel *ch, uint64_t *bits, bool own)
{
  if (own)
    pthread_mutex_unlock(&ch->rx.seen_lock);
  else
    free(bits);
}

/* Clear the words of @bits (@words long) that the first @n blocks' slots
 * fall in: all of them where that is about as cheap (a few words a
 * block), else those alone. */
static void seen_clear(uint64_t *bits, size_t words,
                       const struct gpuipc__exact *e,
                       const gpuipc_block_t *dst, size_t n)
{
  uint64_t k = 0;
  if (n > 0 && words <= 8 * n) {
    memset(bits, 0, words * sizeof(*bits));
    return;
  }
  for (size_t i = 0; i < n; i++) {
    (void)gpuipc__exact_div(e, dst[i].offset, &k);
    bits[k / 64] = 0;
  }
}

/* The blocks of a paged cache: one buffer, one size, each at a multiple of
 * it. Such blocks overlap only where two are the same slot: a bitmap of
 * the slots (1 MiB of bits at most, @ch's, kept between calls and all
 * zero between them: cleared after, whole when small, else only the words
 * the blocks fall in) finds that in one pass. No allocation, and no
 * clearing of a large cache's whole bitmap, on each call: an event loop
 * calls with timeout 0 again and again. 1: they are such blocks and no
 * two overlap; 0: they are not such blocks (sort); -EINVAL naming two
 * that overlap. The blocks were checked: each inside its buffer. */
static int overlap_slots(struct gpuipc_channel *ch, const char *who,
                         const gpuipc_block_t *dst, size_t n)
{
  uint64_t b = dst[0].bytes, k = 0;
  uint64_t slots = gpuipc_buf_size(dst[0].buf) / b;
  if (slots > ((uint64_t)8 << 20))
    return 0;
  struct gpuipc__exact e;
  gpuipc__exact_init(&e, b);
  bool own;
  size_t words = (size_t)(slots + 63) / 64;
  uint64_t *bits = seen_take(ch, words, &own);
  if (bits == NULL)
    return 0;
  bool clash = false;
  size_t i;
  for (i = 0; i < n; i++) {
    if (dst[i].buf != dst[0].buf || dst[i].bytes != b ||
        !gpuipc__exact_div(&e, dst[i].offset, &k))
      break;
    uint64_t m = (uint64_t)1 << (k % 64);
    clash |= (bits[k / 64] & m) != 0;
    bits[k / 64] |= m;
  }
  seen_clear(bits, words, &e, dst, i);
  int rc = i < n ? 0 : 1;
  /* A second look (such blocks only) names the first block whose slot
   * came before, and the one it shares it with. */
  size_t j = 0;
  for (; clash && rc == 1 && j < n; j++) {
    (void)gpuipc__exact_div(&e, dst[j].offset, &k);
    uint64_t m = (uint64_t)1 << (k % 64);
    if ((bits[k / 64] & m) == 0) {
      bits[k / 64] |= m;
      continue;
    }
    size_t f = 0;
    while (dst[f].offset != dst[j].offset)
      f++;
    rc = gpuipc__err(-EINVAL, "%s: destination blocks %zu and %zu overlap",
                     who, f, j);
  }
  seen_clear(bits, words, &e, dst, j); /* those the second look set */
  seen_give(ch, bits, own);
  return rc;
}

/* No two of the @n destination blocks share a byte: sorted by address,
 * each ends before the next begins. -EINVAL naming two that do. Sets
 * @p's uniform. */
static int overlap_check(struct gpuipc_channel *ch, const char *who,
                         const gpuipc_block_t *dst, size_t n,
                         struct blocks_plan *p)
{
  int u = overlap_slots(ch, who, dst, n);
  p->uniform = u == 1 ? dst[0].bytes : 0;
  if (u != 0)
    return u < 0 ? u : 0;
  struct range *r = malloc(n * sizeof(*r));
  if (r == NULL)
    return gpuipc__err(-ENOMEM, "%s: out of memory", who);
  for (size_t i = 0; i < n; i++) {
    r[i].lo = (uintptr_t)gpuipc_buf_ptr(dst[i].buf) + dst[i].offset;
    r[i].hi = r[i].lo + dst[i].bytes;
    r[i].i = i;
  }
  qsort(r, n, sizeof(*r), range_cmp);
  int rc = 0;
  for (size_t k = 1; k < n && rc == 0; k++)
    if (r[k].lo < r[k - 1].hi)
      rc = gpuipc__err(-EINVAL, "%s: destination blocks %zu and %zu overlap",
                       who, r[k - 1].i < r[k].i ? r[k - 1].i : r[k].i,
                       r[k - 1].i < r[k].i ? r[k].i : r[k - 1].i);
  free(r);
  return rc;
}

/* The pending message fits @dst: a block batch of @n blocks of the same
 * sizes. -EINVAL (the message stays first in line). */
static int fits(struct gpuipc_channel *ch, const char *who,
                const struct blocks_plan *dp, const gpuipc_block_t *dst,
                size_t n)
{
  const struct gpuipc__rx_blocks *pb = ch->rx.pblocks;
  unsigned long long seq = ch->rx.pdesc.seq;
  if (ch->rx.pdesc.type != GPUIPC__DESC_BLOCKS || pb == NULL)
    return gpuipc__err(-EINVAL, "%s: message %llu is a tensor, not a block "
                       "batch: receive it with gpuipc_channel_recv or "
                       "gpuipc_channel_recv_into", who, seq);
  if (n != pb->n)
    return gpuipc__err(-EINVAL, "%s: message %llu holds %u blocks, not the "
                       "%zu destination blocks given", who, seq, pb->n, n);
  /* A paged cache into a paged cache: one size each side. */
  bool one = pb->slots != NULL && dp->uniform == pb->slot_bytes;
  for (size_t i = 0; !one && i < n; i++) {
    uint64_t b = pb->slots != NULL ? pb->slot_bytes : pb->bytes[i];
    if (dst[i].bytes != b)
      return gpuipc__err(-EINVAL, "%s: block %zu of message %llu is %llu "
                         "bytes, destination block %zu is %llu", who, i, seq,
                         (unsigned long long)b, i,
                         (unsigned long long)dst[i].bytes);
  }
  return 0;
}

/*
 * Launch the block kernel over list @l on @stream of device @dev; where
 * the release can be a word, the launch writes it once every source byte
 * is read (*@carried), as recv_into's copy kernel does: no event, no
 * stream of gpuipc's own, no pause of @stream.
 */
static int launch(struct gpuipc_channel *ch, const uint64_t *l, int dev,
                  void *stream, bool *carried)
{
  struct gpuipc__rx *rx = &ch->rx;
  const struct gpuipc__desc *d = &rx->pdesc;
  uint64_t word = 0, count = 0;
  pthread_mutex_lock(&rx->rel_lock);
  if (gpuipc__chan_rx_word_for(ch, d->slot, dev, true, &word, &count) != 0 ||
      count == 0)
    word = count = 0;
  int rc = gpuipc__copy_blocks(dev, l, rx->pblocks->n, stream, count, word,
                               d->seq);
  if (rc == 0 && word != 0) {
    rx->word_seq[d->slot] = d->seq;
    *carried = true;
  }
  pthread_mutex_unlock(&rx->rel_lock);
  return rc;
}

/*
 * The copies of the pending batch (into @dst from the sender's blocks) as one
 * launch of gpuipc's block kernel on @stream of device @dev, its list in
 * the pinned list of the message's record slot (klist.c), the release
 * with it where it can (*@carried).
 * GPUIPC_E_UNSUPPORTED: no kernel or no pinned memory here, copy otherwise.
 */
static int copy_kernel(struct gpuipc_channel *ch, const struct blocks_plan *dp,
                       const gpuipc_block_t *dst, int dev, void *stream,
                       bool *carried)
{
  const struct gpuipc__rx_blocks *pb = ch->rx.pblocks;
  uint64_t *l = gpuipc__chan_klist(ch, ch->rx.pdesc.slot,
                                   (size_t)pb->n * 3 * sizeof(uint64_t), dev);
  if (l == NULL)
    return GPUIPC_E_UNSUPPORTED;
  if (pb->slots != NULL && dp->uniform != 0) {
    /* Both sides a paged cache's blocks: one pass, no look at buffers. */
    uint64_t db = (uint64_t)(uintptr_t)gpuipc_buf_ptr(dst[0].buf);
    uint64_t sb = (uint64_t)(uintptr_t)pb->slot_base, b = pb->slot_bytes;
    for (uint32_t i = 0; i < pb->n; i++) {
      l[3 * i] = db + dst[i].offset;
      l[3 * i + 1] = sb + (uint64_t)pb->slots[i] * b;
      l[3 * i + 2] = b;
    }
    return launch(ch, l, dev, stream, carried);
  }
  const gpuipc_buf_t *seen = NULL;
  uint64_t base = 0;
  for (uint32_t i = 0; i < pb->n; i++) {
    if (dst[i].buf != seen) {
      seen = dst[i].buf;
      base = (uint64_t)(uintptr_t)gpuipc_buf_ptr(seen);
    }
    l[3 * i] = base + dst[i].offset;
  }
  if (pb->slots != NULL) {
    uint64_t sb = (uint64_t)(uintptr_t)pb->slot_base, b = pb->slot_bytes;
    for (uint32_t i = 0; i < pb->n; i++) {
      l[3 * i + 1] = sb + (uint64_t)pb->slots[i] * b;
      l[3 * i + 2] = b;
    }
  } else {
    for (uint32_t i = 0; i < pb->n; i++) {
      l[3 * i + 1] = (uint64_t)(uintptr_t)pb->src[i];
      l[3 * i + 2] = pb->bytes[i];
    }
  }
  return launch(ch, l, dev, stream, carried);
}

/* Queue the copies on @stream of device @dev, after the sender's work
 * (*@carried: with the release word). */
static int copy_gpu(struct gpuipc_channel *ch, const struct blocks_plan *dp,
                    const gpuipc_block_t *dst, int dev, void *stream,
                    bool *carried)
{
  const struct gpuipc__rx_blocks *pb = ch->rx.pblocks;
  /* A HOST side mapped before this process had a CUDA context is pinned
   * now for DMA (unpinned, the driver still copies it, slower). */
  for (uint32_t i = 0; i < pb->nbufs; i++)
    (void)gpuipc__host_pin(pb->bufs[i], dev);
  for (size_t i = 0; dp->host && i < pb->n; i++)
    if (i == 0 || dst[i].buf != dst[i - 1].buf)
      (void)gpuipc__host_pin(dst[i].buf, dev);
  /* The copies run on @dev, which must reach the sender's memory: mapped
   * for another GPU (the channel's device, or the sender's), it is
   * granted access from this one too (once). */
  for (uint32_t i = 0; !pb->host && i < pb->nbufs; i++)
    if (gpuipc_buf_device(pb->bufs[i]) != dev) {
      int rc = gpuipc_buf_access(pb->bufs[i], dev);
      if (rc != 0)
        return rc;
    }
  int rc = gpuipc__chan_rx_ready(ch, dev, stream);
  if (rc != 0)
    return rc;
  /* Between GPU memories one launch of gpuipc's block kernel (a thread
   * block a copy); else, or where it cannot, the driver's batched copy,
   * which spends microseconds a copy. */
  if (!pb->host && !dp->host) {
    rc = copy_kernel(ch, dp, dst, dev, stream, carried);
    if (rc != GPUIPC_E_UNSUPPORTED)
      return rc;
  }
  rc = gpuipc__chan_blocks_spell(ch, "gpuipc_channel_recv_blocks");
  if (rc != 0)
    return rc;
  void **to = malloc(pb->n * sizeof(*to));
  if (to == NULL)
    return gpuipc__err(-ENOMEM, "gpuipc_channel_recv_blocks: out of memory");
  for (uint32_t i = 0; i < pb->n; i++)
    to[i] = (uint8_t *)gpuipc_buf_ptr(dst[i].buf) + dst[i].offset;
  rc = gpuipc__stream_copy_batch(dev, to, pb->src, pb->bytes, pb->n, stream);
  free(to);
  return rc;
}

/* Copy the pending batch into @dst and release it; receive lock held. */
static int recv_locked(struct gpuipc_channel *ch, const char *who,
                       const struct blocks_plan *dp,
                       const gpuipc_block_t *dst, size_t n, void *stream)
{
  int rc = fits(ch, who, dp, dst, n);
  if (rc != 0)
    return rc;
  const struct gpuipc__rx_blocks *pb = ch->rx.pblocks;
  if (pb->host && dp->host) {
    rc = gpuipc__chan_blocks_spell(ch, who);
    if (rc != 0)
      return rc;
    for (uint32_t i = 0; i < pb->n; i++)
      memcpy((uint8_t *)gpuipc_buf_ptr(dst[i].buf) + dst[i].offset,
             pb->src[i], pb->bytes[i]);
    return gpuipc__chan_rx_done(ch, -1, NULL, stream, false, false);
  }
  int dev = gpuipc__stream_dev(stream, dp->host ? pb->dev : dp->dev);
  bool carried = false;
  rc = copy_gpu(ch, dp, dst, dev, stream, &carried);
  if (rc != 0)
    return rc;
  /* The sender's record holds the list's first buffer: its GPU is the
   * one the release says whether the word is written from. */
  return gpuipc__chan_rx_done(ch, dev, pb->bufs[0], stream, true, carried);
}

int gpuipc_channel_recv_blocks(gpuipc_channel_t *ch,
                               const gpuipc_block_t *dst, size_t n,
                               void *stream, int timeout_ms)
{
  static const char who[] = "gpuipc_channel_recv_blocks";
  if (ch == NULL || dst == NULL)
    return gpuipc__err(-EINVAL, "%s: NULL %s", who,
                       ch == NULL ? "channel" : "destination blocks");
  struct blocks_plan dp;
  dp.idx = NULL;
  dp.paged = false;
  int rc = blocks_check(who, "destination block", dst, n, &dp);
  if (rc == 0)
    rc = overlap_check(ch, who, dst, n, &dp);
  if (rc != 0)
    return rc;
  rc = gpuipc__chan_rx_take(ch, who, timeout_ms);
  if (rc != 0)
    return rc;
  rc = recv_locked(ch, who, &dp, dst, n, stream);
  pthread_mutex_unlock(&ch->rx.lock);
  return rc;
}
