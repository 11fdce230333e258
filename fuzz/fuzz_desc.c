/*
 * libFuzzer target for the channel's decoders: the descriptor a peer
 * writes into the ring (gpuipc__desc_decode), the release record
 * (gpuipc__rel_decode) and the buffer message (gpuipc__bufmsg_decode).
 * Every input goes to all three.
 *
 * Properties checked:
 *  - a decoder either accepts or returns GPUIPC_E_PROTO with a sentence;
 *  - an accepted descriptor has ndim <= GPUIPC_TENSOR_MAX_DIMS, a dtype of
 *    known size, and, when it has at most 65536 elements, every element
 *    of every index (walked one by one) lies inside [0, buf_size);
 *  - what is accepted encodes back to the same bytes and decodes again.
 *
 * Seeds: fuzz/corpus/fuzz_desc, made by fuzz/gen/gen_desc_corpus.c.
 *   cp -r fuzz/corpus/fuzz_desc /tmp/c && build-fuzz/fuzz/fuzz_desc \
 *     -max_total_time=60 /tmp/c
 */
#include "wire/desc.h"

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
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
