/*
 * The block list of a block batch (a descriptor of type
 * GPUIPC__DESC_BLOCKS names it: the sender's host staging slot that holds
 * it, and its length). Little-endian, decoded strictly: the receiver
 * copies it out of the sender's memory first, then checks every field
 * before any is used.
 *
 *   u32 magic "GCHK"  u16 version (GPUIPC__DESC_VERSION)  u16 form
 *   u64 seq (the message's)  u32 nbufs  u32 nblocks
 *   nbufs x  { u64 key  u64 size  u64 forget_key  u32 flags  u32 reserved }
 * then, form FULL (0):
 *   nblocks x { u32 buf  u32 reserved  u64 offset  u64 bytes }
 * or, form SLOTS (1: one buffer, blocks of one size at multiples of it,
 * as a paged cache's are; 4 bytes a block instead of 24, which the two
 * processes' caches pass between them on every batch):
 *   u64 bytes  nblocks x { u32 slot }   (block i: offset slot * bytes)
 *
 * A buffer's flags: NEW (its buffer message is on the socket: the NEW
 * ones' messages follow the descriptor's own, in this order), FORGET
 * (drop forget_key before it: the sender evicted that one to make room).
 */
#include "wire/desc.h"
#include "wire/wire.h"

#include <stdlib.h>
#include <string.h>

static void put_bufs(struct gpuipc__wbuf *w, uint32_t nbufs,
                     const struct gpuipc__blist_buf *bufs)
{
  for (uint32_t i = 0; i < nbufs; i++) {
    gpuipc__put_u64(w, bufs[i].key);
    gpuipc__put_u64(w, bufs[i].size);
    gpuipc__put_u64(w, bufs[i].forget_key);
    gpuipc__put_u32(w, bufs[i].flags);
    gpuipc__put_u32(w, 0);
  }
}

void gpuipc__blist_put_head(void *dst, uint64_t seq, uint32_t nbufs,
                            uint32_t nblocks,
                            const struct gpuipc__blist_buf *bufs)
{
  struct gpuipc__wbuf w;
  gpuipc__wbuf_init(&w, dst, gpuipc__blist_bytes(nbufs, 0));
  gpuipc__put_u32(&w, GPUIPC__BLIST_MAGIC);
  gpuipc__put_u16(&w, GPUIPC__DESC_VERSION);
  gpuipc__put_u16(&w, GPUIPC__BLIST_FULL);
  gpuipc__put_u64(&w, seq);
  gpuipc__put_u32(&w, nbufs);
  gpuipc__put_u32(&w, nblocks);
  put_bufs(&w, nbufs, bufs);
}

void gpuipc__blist_put_slots_head(void *dst, uint64_t seq, uint32_t nblocks,
                                  const struct gpuipc__blist_buf *buf,
                                  uint64_t bytes)
{
  struct gpuipc__wbuf w;
  gpuipc__wbuf_init(&w, dst, gpuipc__blist_slots_bytes(0));
  gpuipc__put_u32(&w, GPUIPC__BLIST_MAGIC);
  gpuipc__put_u16(&w, GPUIPC__DESC_VERSION);
  gpuipc__put_u16(&w, GPUIPC__BLIST_SLOTS);
  gpuipc__put_u64(&w, seq);
  gpuipc__put_u32(&w, 1);
  gpuipc__put_u32(&w, nblocks);
  put_bufs(&w, 1, buf);
  gpuipc__put_u64(&w, bytes);
}

void gpuipc__blist_put_block(void *dst, uint32_t nbufs, uint32_t i,
                             const struct gpuipc__blist_block *b)
{
  struct gpuipc__wbuf w;
  gpuipc__wbuf_init(&w,
                    (uint8_t *)dst + gpuipc__blist_bytes(nbufs, i),
                    GPUIPC__BLIST_BLOCK_BYTES);
  gpuipc__put_u32(&w, b->buf);
  gpuipc__put_u32(&w, 0);
  gpuipc__put_u64(&w, b->offset);
  gpuipc__put_u64(&w, b->bytes);
}

void gpuipc__blist_free(struct gpuipc__blist *l)
{
  free(l->blocks);
  free(l->slots);
  l->blocks = NULL;
  l->slots = NULL;
  l->nblocks = 0;
}

/* The head: counts and length. */
static int head_decode(struct gpuipc__rbuf *r, size_t len, uint64_t seq,
                       struct gpuipc__blist *out, const char *who)
{
  uint32_t magic = gpuipc__get_u32(r);
  uint16_t version = gpuipc__get_u16(r);
  uint16_t form = gpuipc__get_u16(r);
  uint64_t s = gpuipc__get_u64(r);
  out->nbufs = gpuipc__get_u32(r);
  out->nblocks = gpuipc__get_u32(r);
  if (r->err != 0 || magic != GPUIPC__BLIST_MAGIC ||
      version != GPUIPC__DESC_VERSION ||
      (form != GPUIPC__BLIST_FULL && form != GPUIPC__BLIST_SLOTS))
    return gpuipc__err(GPUIPC_E_PROTO, "%s: block list of message %llu: "
                       "malformed head (%zu bytes, magic 0x%08x, version "
                       "%u, form %u)", who, (unsigned long long)seq, len,
                       magic, version, form);
  out->form = form;
  if (s != seq)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: block list of message %llu "
                       "says it is message %llu's", who,
                       (unsigned long long)seq, (unsigned long long)s);
  if (out->nbufs == 0 || out->nbufs > GPUIPC_CHANNEL_BLOCK_BUFS_MAX ||
      out->nblocks == 0 || out->nblocks > GPUIPC_CHANNEL_BLOCKS_MAX)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: block list of message %llu: %u "
                       "buffers and %u blocks (1..%d and 1..%d)", who,
                       (unsigned long long)seq, out->nbufs, out->nblocks,
                       GPUIPC_CHANNEL_BLOCK_BUFS_MAX,
                       GPUIPC_CHANNEL_BLOCKS_MAX);
  if (form == GPUIPC__BLIST_SLOTS && out->nbufs != 1)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: block list of message %llu: "
                       "the slots form with %u buffers (1)", who,
                       (unsigned long long)seq, out->nbufs);
  size_t want = form == GPUIPC__BLIST_SLOTS
                    ? gpuipc__blist_slots_bytes(out->nblocks)
                    : gpuipc__blist_bytes(out->nbufs, out->nblocks);
  if (len != want)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: block list of message %llu is "
                       "%zu bytes, not the %zu its %u buffers and %u blocks "
                       "take", who, (unsigned long long)seq, len, want,
                       out->nbufs, out->nblocks);
  return 0;
}

static int bufs_decode(struct gpuipc__rbuf *r, uint64_t seq,
                       struct gpuipc__blist *out, const char *who)
{
  for (uint32_t i = 0; i < out->nbufs; i++) {
    struct gpuipc__blist_buf *b = &out->bufs[i];
    b->key = gpuipc__get_u64(r);
    b->size = gpuipc__get_u64(r);
    b->forget_key = gpuipc__get_u64(r);
    b->flags = gpuipc__get_u32(r);
    uint32_t reserved = gpuipc__get_u32(r);
    const char *bad = NULL;
    if (b->key == 0)
      bad = "key 0";
    else if (b->size == 0 || b->size > GPUIPC_SIZE_MAX_ABSURD)
      bad = "an impossible size";
    else if ((b->flags & ~GPUIPC__BLIST_FLAGS) || reserved != 0)
      bad = "unknown flags";
    else if ((b->flags & GPUIPC__BLIST_FORGET) &&
             (b->forget_key == 0 || b->forget_key == b->key))
      bad = "a bad key to forget";
    else if (!(b->flags & GPUIPC__BLIST_FORGET) && b->forget_key != 0)
      bad = "a key to forget without the flag";
    for (uint32_t j = 0; bad == NULL && j < i; j++)
      if (out->bufs[j].key == b->key)
        bad = "the key of an earlier entry";
    if (bad != NULL)
      return gpuipc__err(GPUIPC_E_PROTO, "%s: block list of message %llu: "
                         "buffer %u (key %llu) has %s", who,
                         (unsigned long long)seq, i,
                         (unsigned long long)b->key, bad);
  }
  return 0;
}

/* Block @i of the list is bad (@why): the sentence. */
static int __attribute__((cold, noinline))
block_bad(uint64_t seq, uint32_t i, const struct gpuipc__blist_block *b,
          const char *why, const char *who)
{
  return gpuipc__err(GPUIPC_E_PROTO, "%s: block list of message %llu: "
                     "block %u (buffer %u, offset %llu, %llu bytes) %s", who,
                     (unsigned long long)seq, i, b->buf,
                     (unsigned long long)b->offset,
                     (unsigned long long)b->bytes, why);
}

/*
 * The slots form's blocks: a slot number each, which fits its buffer
 * when it is below the buffer's size / the blocks' size. The length was
 * checked (head_decode): the slots are read straight, a load, a compare
 * and a store a block.
 */
static int slots_decode(struct gpuipc__rbuf *r, uint64_t seq,
                        struct gpuipc__blist *out, const char *who)
{
  uint64_t size = gpuipc__get_u64(r);
  if (r->err != 0 || !gpuipc__rbuf_have(r, (size_t)out->nblocks * 4))
    return gpuipc__rbuf_finish(r, who);
  struct gpuipc__blist_block b = {.buf = 0, .offset = 0, .bytes = size};
  if (size == 0)
    return block_bad(seq, 0, &b, "is empty", who);
  out->slot_bytes = size;
  uint64_t nslots = out->bufs[0].size / size; /* slots wholly inside */
  const uint8_t *p = r->p + r->pos;
  for (uint32_t i = 0; i < out->nblocks; i++, p += 4) {
    uint32_t slot = (uint32_t)p[0] | (uint32_t)p[1] << 8 |
                    (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    /* slot < nslots: slot * size + size <= the buffer's size, no overflow. */
    if (GPUIPC__UNLIKELY(slot >= nslots)) {
      /* An offset past 2^64 reads as one past the buffer. */
      if (__builtin_mul_overflow((uint64_t)slot, size, &b.offset))
        b.offset = UINT64_MAX;
      return block_bad(seq, i, &b, "reaches outside its buffer", who);
    }
    out->slots[i] = slot;
  }
  r->pos += (size_t)out->nblocks * 4;
  return 0;
}

static int blocks_decode(struct gpuipc__rbuf *r, uint64_t seq,
                         struct gpuipc__blist *out, const char *who)
{
  if (out->form == GPUIPC__BLIST_SLOTS)
    return slots_decode(r, seq, out, who);
  for (uint32_t i = 0; i < out->nblocks; i++) {
    struct gpuipc__blist_block *b = &out->blocks[i];
    b->buf = gpuipc__get_u32(r);
    uint32_t reserved = gpuipc__get_u32(r);
    b->offset = gpuipc__get_u64(r);
    b->bytes = gpuipc__get_u64(r);
    uint64_t end;
    const char *bad = NULL;
    if (b->buf >= out->nbufs || reserved != 0)
      bad = "names no buffer of the list";
    else if (b->bytes == 0)
      bad = "is empty";
    else if (__builtin_add_overflow(b->offset, b->bytes, &end) ||
             end > out->bufs[b->buf].size)
      bad = "reaches outside its buffer";
    if (bad != NULL)
      return block_bad(seq, i, b, bad, who);
  }
  return 0;
}

int gpuipc__blist_decode(const void *src, size_t len, uint64_t seq,
                         struct gpuipc__blist *out, const char *who)
{
  struct gpuipc__rbuf r;
  gpuipc__rbuf_init(&r, src, len);
  memset(out, 0, sizeof(*out));
  int rc = head_decode(&r, len, seq, out, who);
  if (rc == 0)
    rc = bufs_decode(&r, seq, out, who);
  if (rc != 0) {
    out->nblocks = 0;
    return rc;
  }
  if (out->form == GPUIPC__BLIST_SLOTS)
    out->slots = malloc((size_t)out->nblocks * sizeof(*out->slots));
  else
    out->blocks = malloc((size_t)out->nblocks * sizeof(*out->blocks));
  if (out->blocks == NULL && out->slots == NULL) {
    out->nblocks = 0;
    return gpuipc__err(-ENOMEM, "%s: out of memory for %u blocks", who,
                       out->nblocks);
  }
  rc = blocks_decode(&r, seq, out, who);
  if (rc == 0)
    rc = gpuipc__rbuf_finish(&r, who);
  if (rc != 0)
    gpuipc__blist_free(out);
  return rc;
}
