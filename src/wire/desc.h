/*
 * src/wire/desc: the records a channel's two ends exchange (desc.c):
 * descriptors and releases in the rings of the channel's shared segment,
 * buffer messages on its socket; and the dtype and layout checks that
 * judge a tensor from a peer (and one from a caller, src/channel and
 * src/mpi). The layout of the rings is src/channel/channel.h's.
 */
#ifndef GPUIPC_WIRE_DESC_H
#define GPUIPC_WIRE_DESC_H

#include "core/core.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A ring slot: a descriptor and a release record are at most this long. */
#define GPUIPC__CHAN_DESC_BYTES 512
#define GPUIPC__CHAN_REL_BYTES 256
/* A message's record slot (the sender's, below its depth) is below this. */
#define GPUIPC__CHAN_SLOT_MAX 1024
/* Event keys: device * GPUIPC_CHANNEL_DEPTH_MAX + slot, device below this. */
#define GPUIPC__CHAN_EV_DEVS 64

/* ----- descriptors ----- */

#define GPUIPC__DESC_MAGIC 0x44484347u /* "GCHD" */
/* What bumps it: docs/versions.md.
 * 2: descriptors of type GPUIPC__DESC_BLOCKS, whose block list
 *    (GPUIPC__BLIST_MAGIC, below) lies in the sender's host stage.
 * 3: block lists in the slots form (GPUIPC__BLIST_SLOTS): the head's
 *    reserved u16 says the form.
 * 4: releases may say GPUIPC__REL_AWAY: their word is written by a GPU
 *    other than the one the message's memory lies on. */
#define GPUIPC__DESC_VERSION 4
#define GPUIPC__DESC_TENSOR 1
/* A block batch: the "tensor" is its block list, 1-D uint8, in a buffer the
 * receiver reads from the host (the sender's host staging area). */
#define GPUIPC__DESC_BLOCKS 2

/* Descriptor flags. */
#define GPUIPC__DESC_NEW_BUF 0x1u   /* the buffer's handle is on the socket */
#define GPUIPC__DESC_EVENT 0x2u     /* wait for sender event ev_key */
#define GPUIPC__DESC_NEW_EVENT 0x4u /* ev_handle carries that event */
#define GPUIPC__DESC_FORGET 0x8u    /* drop buffer forget_key */
#define GPUIPC__DESC_STAGED 0x10u   /* the bytes are a staged copy */
#define GPUIPC__DESC_WORD 0x20u     /* wait for the slot's ready word */
#define GPUIPC__DESC_FLAGS 0x3fu

struct gpuipc__desc {
  uint16_t type;
  uint16_t slot;       /* the sender's record slot of the message */
  uint32_t flags;
  uint64_t seq;
  uint64_t buf_key;
  uint64_t buf_size;   /* the buffer's size as the sender knows it */
  uint64_t forget_key;
  uint32_t ev_key;
  uint64_t offset;     /* of the first element, in the buffer */
  int32_t dev_type, dev_id; /* the sender's view (informational) */
  gpuipc_dl_dtype_t dtype;
  uint32_t ndim;
  int64_t shape[GPUIPC_TENSOR_MAX_DIMS];
  int64_t strides[GPUIPC_TENSOR_MAX_DIMS];
  uint8_t ev_handle[GPUIPC_EVENT_HANDLE_PACKED_SIZE];
};

/*
 * Encode @d into @dst as it is, without judging the fields (a test writes
 * lies with it): ndim is written as given, with min(ndim, MAX) extents.
 * Returns the length (<= GPUIPC__CHAN_DESC_BYTES) or -ENOSPC.
 */
int gpuipc__desc_encode(const struct gpuipc__desc *d, void *dst, size_t cap);

/*
 * Decode and check a descriptor slot: magic, version, type, length, flags,
 * ndim, dtype, extents, strides and offset against buf_size, keys, the
 * event handle's presence. GPUIPC_E_PROTO with a sentence beginning with
 * @who and naming the field.
 */
int gpuipc__desc_decode(const void *src, size_t len, struct gpuipc__desc *out,
                        const char *who);

/* Bytes per element of @dt, 0 when gpuipc does not know the dtype. */
size_t gpuipc__dtype_size(gpuipc_dl_dtype_t dt);

/*
 * Check a layout: @ndim <= MAX, a known dtype, extents >= 0, and every
 * element reachable from @offset through @shape and @strides (in
 * elements; NULL: row-major) inside [0, @size). Fills @span (bytes from
 * the lowest to one past the highest element, 0 when empty) when not NULL.
 * Returns 0 or @code with a sentence beginning with @who.
 */
int gpuipc__layout_check(int code, const char *who, gpuipc_dl_dtype_t dt,
                         int64_t ndim, const int64_t *shape,
                         const int64_t *strides, uint64_t offset,
                         uint64_t size, uint64_t *span);

/* Whether @strides (NULL counts as such) are row-major for @shape. */
bool gpuipc__layout_compact(int ndim, const int64_t *shape,
                            const int64_t *strides);

/* Number of elements (0 if any extent is 0). */
uint64_t gpuipc__layout_count(int ndim, const int64_t *shape);

/* ----- release records ----- */

#define GPUIPC__REL_MAGIC 0x52484347u /* "GCHR" */
#define GPUIPC__REL_EVENT 0x1u        /* the sender must wait for ev_key */
#define GPUIPC__REL_NEW_EVENT 0x2u    /* ev_handle carries it */
#define GPUIPC__REL_WORD 0x4u /* or for the release word to reach seq */
/* With REL_WORD: a GPU other than the one the message's memory lies on
 * (a block batch's: its list's first buffer's) writes the word (a stream
 * there waiting on it stalls no other). */
#define GPUIPC__REL_AWAY 0x8u
#define GPUIPC__REL_FLAGS 0xfu

struct gpuipc__rel {
  uint16_t slot;       /* the message's record slot, as its descriptor said */
  uint32_t flags;
  uint64_t seq;
  uint32_t ev_key;
  uint8_t ev_handle[GPUIPC_EVENT_HANDLE_PACKED_SIZE];
};

int gpuipc__rel_encode(const struct gpuipc__rel *r, void *dst, size_t cap);
int gpuipc__rel_decode(const void *src, size_t len, struct gpuipc__rel *out,
                       const char *who);

/* ----- block lists (blocks.c) ----- */

/*
 * The list of a block batch: the buffers its blocks lie in (each by its
 * key, with the handle on the socket when NEW, after the descriptor's own
 * buffer message, in this order; FORGET: drop forget_key first) and the
 * blocks, each an index into those buffers, a byte offset and a length.
 */
#define GPUIPC__BLIST_MAGIC 0x4b484347u /* "GCHK" */
#define GPUIPC__BLIST_HEAD 24
#define GPUIPC__BLIST_BUF_BYTES 32
#define GPUIPC__BLIST_BLOCK_BYTES 24
#define GPUIPC__BLIST_NEW 0x1u
#define GPUIPC__BLIST_FORGET 0x2u
#define GPUIPC__BLIST_FLAGS 0x3u
/* The list's forms (its head's u16 after the version). */
#define GPUIPC__BLIST_FULL 0  /* each block: buffer, offset, bytes */
#define GPUIPC__BLIST_SLOTS 1 /* one buffer, one size: each block a slot */

struct gpuipc__blist_buf {
  uint64_t key;
  uint64_t size;       /* as the sender knows it */
  uint64_t forget_key; /* with GPUIPC__BLIST_FORGET */
  uint32_t flags;
};

struct gpuipc__blist_block {
  uint32_t buf; /* index into the list's buffers */
  uint64_t offset, bytes;
};

/* The encoded length of a list of @nbufs buffers and @nblocks blocks. */
static inline size_t gpuipc__blist_bytes(uint32_t nbufs, uint32_t nblocks)
{
  return GPUIPC__BLIST_HEAD + (size_t)nbufs * GPUIPC__BLIST_BUF_BYTES +
         (size_t)nblocks * GPUIPC__BLIST_BLOCK_BYTES;
}

/* The encoded length of a list in the slots form: one buffer, the size,
 * then a u32 slot a block (a paged cache's blocks: 4 bytes, not 24). */
static inline size_t gpuipc__blist_slots_bytes(uint32_t nblocks)
{
  return GPUIPC__BLIST_HEAD + GPUIPC__BLIST_BUF_BYTES + 8 +
         (size_t)nblocks * 4;
}

/*
 * Write the head of a list of the slots form at @dst (room for
 * gpuipc__blist_slots_bytes(@nblocks)): its one buffer @buf and the
 * blocks' size @bytes; then block i's slot (its offset / @bytes) with
 * gpuipc__blist_put_slot.
 */
void gpuipc__blist_put_slots_head(void *dst, uint64_t seq, uint32_t nblocks,
                                  const struct gpuipc__blist_buf *buf,
                                  uint64_t bytes);
static inline void gpuipc__blist_put_slot(void *dst, uint32_t i,
                                          uint32_t slot)
{
  uint8_t *d = (uint8_t *)dst + gpuipc__blist_slots_bytes(i);
  d[0] = (uint8_t)slot;
  d[1] = (uint8_t)(slot >> 8);
  d[2] = (uint8_t)(slot >> 16);
  d[3] = (uint8_t)(slot >> 24);
}

/*
 * Write the list's head and buffers at @dst (room for
 * gpuipc__blist_bytes(@nbufs, @nblocks) bytes), as they are (a test
 * writes lies with it); then each block with gpuipc__blist_put_block.
 */
void gpuipc__blist_put_head(void *dst, uint64_t seq, uint32_t nbufs,
                            uint32_t nblocks,
                            const struct gpuipc__blist_buf *bufs);
void gpuipc__blist_put_block(void *dst, uint32_t nbufs, uint32_t i,
                             const struct gpuipc__blist_block *b);

/* A decoded list: the full form's blocks spelt out, the slots form's
 * slots as sent (block i: buffer 0, offset slots[i] * slot_bytes,
 * slot_bytes long); gpuipc__blist_free frees the arrays. */
struct gpuipc__blist {
  uint32_t nbufs, nblocks;
  uint16_t form;
  struct gpuipc__blist_buf bufs[GPUIPC_CHANNEL_BLOCK_BUFS_MAX];
  struct gpuipc__blist_block *blocks; /* FULL: [nblocks]; else NULL */
  uint32_t *slots;                    /* SLOTS: [nblocks]; else NULL */
  uint64_t slot_bytes;                /* SLOTS: the blocks' size */
};

/*
 * Decode and check the list of message @seq, @len bytes at @src (a copy
 * the peer cannot change): magic, version, sequence number, counts (1 ..
 * the maxima), the exact length, each buffer's key (non-zero, distinct),
 * size, flags and forget key, and each block's buffer index, length
 * (non-zero) and range (within the size the buffer's entry claims; the
 * caller checks it against the buffer as mapped). GPUIPC_E_PROTO with a
 * sentence beginning with @who and naming the entry; -ENOMEM.
 */
int gpuipc__blist_decode(const void *src, size_t len, uint64_t seq,
                         struct gpuipc__blist *out, const char *who);
void gpuipc__blist_free(struct gpuipc__blist *l);

/* ----- the buffer message on the socket ----- */

#define GPUIPC__BUFMSG_MAGIC 0x42484347u /* "GCHB" */
#define GPUIPC__BUFMSG_BYTES (16 + GPUIPC_HANDLE_PACKED_SIZE)

int gpuipc__bufmsg_encode(uint64_t key, const gpuipc_handle_t *h, void *dst,
                          size_t cap);
/* Decode; @out->fd is left -1. */
int gpuipc__bufmsg_decode(const void *src, size_t len, uint64_t *key,
                          gpuipc_handle_t *out, const char *who);

#endif
