/*
 * libFuzzer target for the channel's decoders: the descriptor a peer
 * writes into the ring (gpuipc__desc_decode), the release record
 * (gpuipc__rel_decode), the buffer message (gpuipc__bufmsg_decode) and a
 * block batch's list, either form (gpuipc__blist_decode, for the message
 * number the list names itself). Every input goes to all four.
 *
 * Properties checked:
 *  - a decoder either accepts or returns GPUIPC_E_PROTO with a sentence;
 *  - an accepted descriptor has ndim <= GPUIPC_TENSOR_MAX_DIMS, a dtype of
 *    known size, and, when it has at most 65536 elements, every element
 *    of every index (walked one by one) lies inside [0, buf_size);
 *  - what is accepted encodes back to the same bytes and decodes again;
 *  - an accepted block list has 1..GPUIPC_CHANNEL_BLOCKS_MAX blocks, each
 *    non-empty, in one of its buffers and inside that buffer's size.
 *
 * Seeds: fuzz/corpus/fuzz_desc, made by fuzz/gen/gen_desc_corpus.c.
 *   cp -r fuzz/corpus/fuzz_desc /tmp/c && build-fuzz/fuzz/fuzz_desc \
 *     -max_total_time=60 /tmp/c
 */
#include "wire/desc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_elements(const struct gpuipc__desc *d)
{
  uint64_t n = gpuipc__layout_count((int)d->ndim, d->shape);
  size_t es = gpuipc__dtype_size(d->dtype);
  if (es == 0)
    abort();
  if (n == 0 || n > 65536)
    return;
  int64_t idx[GPUIPC_TENSOR_MAX_DIMS] = {0};
  for (uint64_t k = 0; k < n; k++) {
    __int128 off = d->offset;
    for (uint32_t i = 0; i < d->ndim; i++)
      off += (__int128)idx[i] * d->strides[i] * (__int128)es;
    if (off < 0 || off + (__int128)es > (__int128)d->buf_size)
      abort(); /* accepted, yet an element lies outside the buffer */
    for (int i = (int)d->ndim - 1; i >= 0; i--) {
      if (++idx[i] < d->shape[i])
        break;
      idx[i] = 0;
    }
  }
}

/* The block list decoder, for the message number at bytes 8..15. */
static void check_blist(const uint8_t *data, size_t size)
{
  if (size < 16)
    return;
  uint64_t seq = 0;
  for (int i = 7; i >= 0; i--)
    seq = seq << 8 | data[8 + i];
  struct gpuipc__blist l;
  int rc = gpuipc__blist_decode(data, size, seq, &l, "fuzz");
  if (rc != 0 && rc != GPUIPC_E_PROTO && rc != -ENOMEM)
    abort();
  if (rc != 0)
    return;
  if (l.nblocks == 0 || l.nblocks > GPUIPC_CHANNEL_BLOCKS_MAX ||
      l.nbufs == 0 || l.nbufs > GPUIPC_CHANNEL_BLOCK_BUFS_MAX)
    abort();
  if ((l.slots == NULL) == (l.blocks == NULL))
    abort(); /* one form or the other */
  for (uint32_t i = 0; l.blocks != NULL && i < l.nblocks; i++) {
    const struct gpuipc__blist_block *b = &l.blocks[i];
    if (b->buf >= l.nbufs || b->bytes == 0 ||
        b->offset > l.bufs[b->buf].size ||
        b->bytes > l.bufs[b->buf].size - b->offset)
      abort();
  }
  /* A slot's block lies inside the one buffer: (slot + 1) * bytes fits. */
  for (uint32_t i = 0; l.slots != NULL && i < l.nblocks; i++)
    if (l.nbufs != 1 || l.slot_bytes == 0 ||
        l.slots[i] >= l.bufs[0].size / l.slot_bytes)
      abort();
  gpuipc__blist_free(&l);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  check_blist(data, size);
  struct gpuipc__desc d, d2;
  int rc = gpuipc__desc_decode(data, size, &d, "fuzz");
  if (rc != 0 && (rc != GPUIPC_E_PROTO || gpuipc_last_error()[0] == '\0'))
    abort();
  if (rc == 0) {
    if (d.ndim > GPUIPC_TENSOR_MAX_DIMS)
      abort();
    check_elements(&d);
    uint8_t out[GPUIPC__CHAN_DESC_BYTES];
    int n = gpuipc__desc_encode(&d, out, sizeof(out));
    if (n <= 0 || (size_t)n > size || memcmp(out, data, (size_t)n) != 0)
      abort();
    if (gpuipc__desc_decode(out, (size_t)n, &d2, "fuzz") != 0 ||
        memcmp(&d, &d2, sizeof(d)) != 0)
      abort();
  }

  struct gpuipc__rel r, r2;
  rc = gpuipc__rel_decode(data, size, &r, "fuzz");
  if (rc != 0 && rc != GPUIPC_E_PROTO)
    abort();
  if (rc == 0) {
    uint8_t out[GPUIPC__CHAN_REL_BYTES];
    int n = gpuipc__rel_encode(&r, out, sizeof(out));
    if (n <= 0 || (size_t)n > size || memcmp(out, data, (size_t)n) != 0)
      abort();
    if (gpuipc__rel_decode(out, (size_t)n, &r2, "fuzz") != 0 ||
        memcmp(&r, &r2, sizeof(r)) != 0)
      abort();
  }

  uint64_t key;
  gpuipc_handle_t h;
  rc = gpuipc__bufmsg_decode(data, size, &key, &h, "fuzz");
  if (rc != 0 && rc != GPUIPC_E_PROTO)
    abort();
  if (rc == 0) {
    uint8_t out[GPUIPC__BUFMSG_BYTES];
    h.fd = -1;
    int n = gpuipc__bufmsg_encode(key, &h, out, sizeof(out));
    if (n != (int)size || memcmp(out, data, size) != 0)
      abort();
  }
  return 0;
}
