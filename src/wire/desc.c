/*
 * Descriptor, release and buffer records of a channel (src/channel sends
 * and receives them): little-endian, written with the src/wire encoders,
 * decoded strictly. The receiving end decodes what the peer wrote into
 * shared memory, so every field is checked before it is used; the dtype and
 * layout checks at the top serve that decoder and the senders' own checks.
 *
 * type: GPUIPC__DESC_TENSOR, or GPUIPC__DESC_BLOCKS, a block batch whose
 * "tensor" is its block list (1-D uint8; wire/blocks.c).
 *
 * Descriptor (at most GPUIPC__CHAN_DESC_BYTES):
 *   u32 magic "GCHD"  u16 version  u16 type  u16 length  u16 slot
 *   u32 flags  u64 seq  u64 buf_key  u64 buf_size  u64 forget_key
 *   u32 ev_key  u64 offset  i32 dev_type  i32 dev_id
 *   u8 dtype.code  u8 dtype.bits  u16 dtype.lanes  u32 ndim
 *   i64 shape[ndim]  i64 strides[ndim]
 *   [event handle, GPUIPC_EVENT_HANDLE_PACKED_SIZE bytes, with NEW_EVENT]
 *
 * Release (at most GPUIPC__CHAN_REL_BYTES):
 *   u32 magic "GCHR"  u16 length  u16 slot  u32 flags  u32 ev_key
 *   u64 seq  [event handle with NEW_EVENT]
 *
 * slot: the sender's record slot of the message (below
 * GPUIPC_CHANNEL_DEPTH_MAX), which the release echoes; the two ends index
 * what each message uses (events, release words) by it, so that a message
 * held long costs its slot alone (src/channel/send.c).
 *
 * Buffer message (on the socket, with the buffer's fd for fd kinds):
 *   u32 magic "GCHB"  u16 version  u16 reserved  u64 key
 *   packed handle (GPUIPC_HANDLE_PACKED_SIZE bytes)
 */
#include "wire/desc.h"
#include "wire/wire.h"

#include <stdio.h>
#include <string.h>

#define DESC_FIXED 76 /* bytes before the shape array */

size_t gpuipc__dtype_size(gpuipc_dl_dtype_t dt)
{
  bool ok;
  switch (dt.code) {
  case GPUIPC_DL_INT:
  case GPUIPC_DL_UINT:
    ok = dt.bits == 8 || dt.bits == 16 || dt.bits == 32 || dt.bits == 64;
    break;
  case GPUIPC_DL_FLOAT:
    ok = dt.bits == 16 || dt.bits == 32 || dt.bits == 64;
    break;
  case GPUIPC_DL_BFLOAT:
    ok = dt.bits == 16;
    break;
  case GPUIPC_DL_COMPLEX:
    ok = dt.bits == 64 || dt.bits == 128;
    break;
  case GPUIPC_DL_BOOL:
    ok = dt.bits == 8;
    break;
  default:
    ok = dt.code >= GPUIPC_DL_FLOAT8_FIRST &&
         dt.code <= GPUIPC_DL_FLOAT8_LAST && dt.bits == 8;
    break;
  }
  if (!ok || dt.lanes == 0)
    return 0;
  return (size_t)(dt.bits / 8) * dt.lanes;
}

uint64_t gpuipc__layout_count(int ndim, const int64_t *shape)
{
  uint64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] <= 0)
      return 0;
    if (__builtin_mul_overflow(n, (uint64_t)shape[i], &n))
      return UINT64_MAX;
  }
  return n;
}

bool gpuipc__layout_compact(int ndim, const int64_t *shape,
                            const int64_t *strides)
{
  if (strides == NULL)
    return true;
  int64_t want = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    /* A dimension of extent 1 may carry any stride. */
    if (shape[i] != 1 && strides[i] != want)
      return false;
    if (__builtin_mul_overflow(want, shape[i], &want))
      return false;
  }
  return true;
}

int gpuipc__layout_check(int code, const char *who, gpuipc_dl_dtype_t dt,
                         int64_t ndim, const int64_t *shape,
                         const int64_t *strides, uint64_t offset,
                         uint64_t size, uint64_t *span)
{
  if (ndim < 0 || ndim > GPUIPC_TENSOR_MAX_DIMS)
    return gpuipc__err(code, "%s: ndim %lld is outside 0..%d", who,
                       (long long)ndim, GPUIPC_TENSOR_MAX_DIMS);
  size_t esize = gpuipc__dtype_size(dt);
  if (esize == 0)
    return gpuipc__err(code, "%s: unknown or unsupported dtype (code %u, "
                       "bits %u, lanes %u)", who, dt.code, dt.bits,
                       dt.lanes);
  if (ndim > 0 && shape == NULL)
    return gpuipc__err(code, "%s: shape is NULL with ndim %lld", who,
                       (long long)ndim);
  if (offset > size)
    return gpuipc__err(code, "%s: byte offset %llu lies outside the "
                       "%llu-byte buffer", who, (unsigned long long)offset,
                       (unsigned long long)size);
  bool empty = false;
  for (int64_t i = 0; i < ndim; i++) {
    if (shape[i] < 0 || shape[i] > ((int64_t)1 << 48))
      return gpuipc__err(code, "%s: shape[%lld] is %lld", who, (long long)i,
                         (long long)shape[i]);
    if (shape[i] == 0)
      empty = true;
  }
  if (empty) {
    if (span != NULL)
      *span = 0;
    return 0;
  }
  /* Lowest and one past the highest byte, in 128 bits: no overflow. */
  __int128 lo = (__int128)offset, hi = (__int128)offset + (__int128)esize;
  __int128 compact = 1;
  for (int64_t i = ndim - 1; i >= 0; i--) {
    __int128 st = strides != NULL ? (__int128)strides[i] : compact;
    if (strides != NULL &&
        (strides[i] > ((int64_t)1 << 48) || strides[i] < -((int64_t)1 << 48)))
      return gpuipc__err(code, "%s: strides[%lld] is %lld", who,
                         (long long)i, (long long)strides[i]);
    __int128 reach = (__int128)(shape[i] - 1) * st * (__int128)esize;
    if (reach < 0)
      lo += reach;
    else
      hi += reach;
    if (strides == NULL) {
      compact *= shape[i];
      if (compact > ((__int128)1 << 64))
        return gpuipc__err(code, "%s: %lld dimensions of these extents "
                           "hold more than 2^64 elements", who,
                           (long long)ndim);
    }
  }
  if (lo < 0)
    return gpuipc__err(code, "%s: strides reach %lld bytes before the start "
                       "of the buffer (byte offset %llu)", who,
                       (long long)-lo, (unsigned long long)offset);
  if (hi > (__int128)size)
    return gpuipc__err(code, "%s: shape, strides and byte offset %llu reach "
                       "byte %llu, outside the %llu-byte buffer", who,
                       (unsigned long long)offset,
                       (unsigned long long)(hi > (__int128)UINT64_MAX
                                                ? UINT64_MAX
                                                : (uint64_t)hi),
                       (unsigned long long)size);
  if (span != NULL)
    *span = (uint64_t)(hi - lo);
  return 0;
}

/* ----- descriptors ----- */

int gpuipc__desc_encode(const struct gpuipc__desc *d, void *dst, size_t cap)
{
  struct gpuipc__wbuf w;
  gpuipc__wbuf_init(&w, dst, cap);
  uint32_t n = d->ndim < GPUIPC_TENSOR_MAX_DIMS ? d->ndim
                                                : GPUIPC_TENSOR_MAX_DIMS;
  size_t len = DESC_FIXED + 16 * (size_t)n +
               ((d->flags & GPUIPC__DESC_NEW_EVENT)
                    ? GPUIPC_EVENT_HANDLE_PACKED_SIZE
                    : 0);
  gpuipc__put_u32(&w, GPUIPC__DESC_MAGIC);
  gpuipc__put_u16(&w, GPUIPC__DESC_VERSION);
  gpuipc__put_u16(&w, d->type);
  gpuipc__put_u16(&w, (uint16_t)len);
  gpuipc__put_u16(&w, d->slot);
  gpuipc__put_u32(&w, d->flags);
  gpuipc__put_u64(&w, d->seq);
  gpuipc__put_u64(&w, d->buf_key);
  gpuipc__put_u64(&w, d->buf_size);
  gpuipc__put_u64(&w, d->forget_key);
  gpuipc__put_u32(&w, d->ev_key);
  gpuipc__put_u64(&w, d->offset);
  gpuipc__put_u32(&w, (uint32_t)d->dev_type);
  gpuipc__put_u32(&w, (uint32_t)d->dev_id);
  gpuipc__put_u8(&w, d->dtype.code);
  gpuipc__put_u8(&w, d->dtype.bits);
  gpuipc__put_u16(&w, d->dtype.lanes);
  gpuipc__put_u32(&w, d->ndim);
  for (uint32_t i = 0; i < n; i++)
    gpuipc__put_u64(&w, (uint64_t)d->shape[i]);
  for (uint32_t i = 0; i < n; i++)
    gpuipc__put_u64(&w, (uint64_t)d->strides[i]);
  if (d->flags & GPUIPC__DESC_NEW_EVENT)
    gpuipc__put_bytes(&w, d->ev_handle, sizeof(d->ev_handle));
  int rc = gpuipc__wbuf_finish(&w, "descriptor");
  return rc != 0 ? rc : (int)w.len;
}

/* Whether block batch descriptor @d describes a list: 1-D uint8 bytes,
 * contiguous, of a length a list may have. */
static bool blocks_shape(const struct gpuipc__desc *d)
{
  return d->ndim == 1 && d->dtype.code == GPUIPC_DL_UINT &&
         d->dtype.bits == 8 && d->dtype.lanes == 1 && d->strides[0] == 1 &&
         d->shape[0] >= GPUIPC__BLIST_HEAD &&
         (uint64_t)d->shape[0] <=
             gpuipc__blist_bytes(GPUIPC_CHANNEL_BLOCK_BUFS_MAX,
                                 GPUIPC_CHANNEL_BLOCKS_MAX);
}

int gpuipc__desc_decode(const void *src, size_t len, struct gpuipc__desc *out,
                        const char *who)
{
  struct gpuipc__rbuf r;
  if (len > GPUIPC__CHAN_DESC_BYTES)
    len = GPUIPC__CHAN_DESC_BYTES;
  gpuipc__rbuf_init(&r, src, len);
  memset(out, 0, sizeof(*out));
  uint32_t magic = gpuipc__get_u32(&r);
  uint16_t version = gpuipc__get_u16(&r);
  out->type = gpuipc__get_u16(&r);
  uint16_t dlen = gpuipc__get_u16(&r);
  out->slot = gpuipc__get_u16(&r);
  if (r.err != 0)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: descriptor truncated at %zu "
                       "bytes", who, len);
  if (magic != GPUIPC__DESC_MAGIC)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: descriptor magic 0x%08x (want "
                       "0x%08x)", who, magic, GPUIPC__DESC_MAGIC);
  if (version != GPUIPC__DESC_VERSION)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: descriptor version %u (this "
                       "library speaks %u)", who, version,
                       GPUIPC__DESC_VERSION);
  if (out->type != GPUIPC__DESC_TENSOR && out->type != GPUIPC__DESC_BLOCKS)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: descriptor type %u is unknown",
                       who, out->type);
  if (dlen < DESC_FIXED || dlen > len)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: descriptor length %u is outside "
                       "%d..%zu", who, dlen, DESC_FIXED, len);
  if (out->slot >= GPUIPC__CHAN_SLOT_MAX)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: descriptor record slot %u (at "
                       "most %u)", who, out->slot, GPUIPC__CHAN_SLOT_MAX - 1);
  r.len = dlen;
  out->flags = gpuipc__get_u32(&r);
  out->seq = gpuipc__get_u64(&r);
  out->buf_key = gpuipc__get_u64(&r);
  out->buf_size = gpuipc__get_u64(&r);
  out->forget_key = gpuipc__get_u64(&r);
  out->ev_key = gpuipc__get_u32(&r);
  out->offset = gpuipc__get_u64(&r);
  out->dev_type = (int32_t)gpuipc__get_u32(&r);
  out->dev_id = (int32_t)gpuipc__get_u32(&r);
  out->dtype.code = gpuipc__get_u8(&r);
  out->dtype.bits = gpuipc__get_u8(&r);
  out->dtype.lanes = gpuipc__get_u16(&r);
  out->ndim = gpuipc__get_u32(&r);
  if (out->flags & ~GPUIPC__DESC_FLAGS)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: descriptor flags 0x%x has "
                       "unknown bits", who, out->flags);
  if (out->ndim > GPUIPC_TENSOR_MAX_DIMS)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: descriptor ndim %u exceeds the "
                       "maximum of %d dimensions", who, out->ndim,
                       GPUIPC_TENSOR_MAX_DIMS);
  for (uint32_t i = 0; i < out->ndim; i++)
    out->shape[i] = (int64_t)gpuipc__get_u64(&r);
  for (uint32_t i = 0; i < out->ndim; i++)
    out->strides[i] = (int64_t)gpuipc__get_u64(&r);
  if (out->flags & GPUIPC__DESC_NEW_EVENT)
    gpuipc__get_bytes(&r, out->ev_handle, sizeof(out->ev_handle));
  int rc = gpuipc__rbuf_finish(&r, who);
  if (rc != 0)
    return rc;
  if (out->seq == 0)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: descriptor sequence number 0",
                       who);
  if (out->buf_key == 0)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: descriptor buffer key 0", who);
  if ((out->flags & GPUIPC__DESC_FORGET) &&
      (out->forget_key == 0 || out->forget_key == out->buf_key))
    return gpuipc__err(GPUIPC_E_PROTO, "%s: descriptor forgets buffer key "
                       "%llu", who, (unsigned long long)out->forget_key);
  if ((out->flags & GPUIPC__DESC_NEW_EVENT) &&
      !(out->flags & GPUIPC__DESC_EVENT))
    return gpuipc__err(GPUIPC_E_PROTO, "%s: descriptor carries an event "
                       "without using it", who);
  if ((out->flags & GPUIPC__DESC_EVENT) && (out->flags & GPUIPC__DESC_WORD))
    return gpuipc__err(GPUIPC_E_PROTO, "%s: descriptor is ordered by both an "
                       "event and a ready word", who);
  if ((out->flags & GPUIPC__DESC_EVENT) &&
      out->ev_key >= GPUIPC__CHAN_EV_DEVS * GPUIPC_CHANNEL_DEPTH_MAX)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: descriptor event key %u is out "
                       "of range", who, out->ev_key);
  if (out->buf_size == 0 || out->buf_size > GPUIPC_SIZE_MAX_ABSURD)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: descriptor buffer size %llu",
                       who, (unsigned long long)out->buf_size);
  if (out->type == GPUIPC__DESC_BLOCKS && !blocks_shape(out))
    return gpuipc__err(GPUIPC_E_PROTO, "%s: block batch descriptor does "
                       "not describe a block list (1-D uint8, %d to %zu "
                       "bytes)", who, GPUIPC__BLIST_HEAD,
                       gpuipc__blist_bytes(GPUIPC_CHANNEL_BLOCK_BUFS_MAX,
                                           GPUIPC_CHANNEL_BLOCKS_MAX));
  return gpuipc__layout_check(GPUIPC_E_PROTO, who, out->dtype, out->ndim,
                              out->shape, out->strides, out->offset,
                              out->buf_size, NULL);
}

/* ----- releases ----- */

int gpuipc__rel_encode(const struct gpuipc__rel *rl, void *dst, size_t cap)
{
  struct gpuipc__wbuf w;
  gpuipc__wbuf_init(&w, dst, cap);
  size_t len = 24 + ((rl->flags & GPUIPC__REL_NEW_EVENT)
                         ? GPUIPC_EVENT_HANDLE_PACKED_SIZE
                         : 0);
  gpuipc__put_u32(&w, GPUIPC__REL_MAGIC);
  gpuipc__put_u16(&w, (uint16_t)len);
  gpuipc__put_u16(&w, rl->slot);
  gpuipc__put_u32(&w, rl->flags);
  gpuipc__put_u32(&w, rl->ev_key);
  gpuipc__put_u64(&w, rl->seq);
  if (rl->flags & GPUIPC__REL_NEW_EVENT)
    gpuipc__put_bytes(&w, rl->ev_handle, sizeof(rl->ev_handle));
  int rc = gpuipc__wbuf_finish(&w, "release record");
  return rc != 0 ? rc : (int)w.len;
}

int gpuipc__rel_decode(const void *src, size_t len, struct gpuipc__rel *out,
                       const char *who)
{
  struct gpuipc__rbuf r;
  if (len > GPUIPC__CHAN_REL_BYTES)
    len = GPUIPC__CHAN_REL_BYTES;
  gpuipc__rbuf_init(&r, src, len);
  memset(out, 0, sizeof(*out));
  uint32_t magic = gpuipc__get_u32(&r);
  uint16_t rlen = gpuipc__get_u16(&r);
  out->slot = gpuipc__get_u16(&r);
  if (r.err != 0 || magic != GPUIPC__REL_MAGIC || rlen < 24 || rlen > len ||
      out->slot >= GPUIPC__CHAN_SLOT_MAX)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: release record header is "
                       "malformed (magic 0x%08x, length %u)", who, magic,
                       rlen);
  r.len = rlen;
  out->flags = gpuipc__get_u32(&r);
  out->ev_key = gpuipc__get_u32(&r);
  out->seq = gpuipc__get_u64(&r);
  if (out->flags & ~GPUIPC__REL_FLAGS)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: release flags 0x%x has unknown "
                       "bits", who, out->flags);
  if (out->flags & GPUIPC__REL_NEW_EVENT)
    gpuipc__get_bytes(&r, out->ev_handle, sizeof(out->ev_handle));
  int rc = gpuipc__rbuf_finish(&r, who);
  if (rc != 0)
    return rc;
  if ((out->flags & GPUIPC__REL_NEW_EVENT) &&
      !(out->flags & GPUIPC__REL_EVENT))
    return gpuipc__err(GPUIPC_E_PROTO, "%s: release carries an event "
                       "without using it", who);
  if ((out->flags & GPUIPC__REL_WORD) && (out->flags & GPUIPC__REL_EVENT))
    return gpuipc__err(GPUIPC_E_PROTO, "%s: release asks for both an event "
                       "and a word", who);
  if ((out->flags & GPUIPC__REL_AWAY) && !(out->flags & GPUIPC__REL_WORD))
    return gpuipc__err(GPUIPC_E_PROTO, "%s: release says where a word is "
                       "written without one", who);
  if ((out->flags & GPUIPC__REL_EVENT) &&
      out->ev_key >= GPUIPC__CHAN_EV_DEVS * GPUIPC_CHANNEL_DEPTH_MAX)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: release event key %u is out of "
                       "range", who, out->ev_key);
  return 0;
}

/* ----- buffer messages ----- */

int gpuipc__bufmsg_encode(uint64_t key, const gpuipc_handle_t *h, void *dst,
                          size_t cap)
{
  if (cap < GPUIPC__BUFMSG_BYTES)
    return gpuipc__err(-ENOSPC, "buffer message: %zu bytes of room", cap);
  struct gpuipc__wbuf w;
  gpuipc__wbuf_init(&w, dst, cap);
  gpuipc__put_u32(&w, GPUIPC__BUFMSG_MAGIC);
  gpuipc__put_u16(&w, GPUIPC__DESC_VERSION);
  gpuipc__put_u16(&w, 0);
  gpuipc__put_u64(&w, key);
  int rc = gpuipc_handle_pack(h, (uint8_t *)dst + w.len, cap - w.len);
  if (rc < 0)
    return rc;
  return (int)w.len + rc;
}

int gpuipc__bufmsg_decode(const void *src, size_t len, uint64_t *key,
                          gpuipc_handle_t *out, const char *who)
{
  struct gpuipc__rbuf r;
  gpuipc__rbuf_init(&r, src, len);
  uint32_t magic = gpuipc__get_u32(&r);
  uint16_t version = gpuipc__get_u16(&r);
  uint16_t reserved = gpuipc__get_u16(&r);
  uint64_t k = gpuipc__get_u64(&r);
  if (len != GPUIPC__BUFMSG_BYTES || r.err != 0 ||
      magic != GPUIPC__BUFMSG_MAGIC || version != GPUIPC__DESC_VERSION ||
      reserved != 0 || k == 0)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: malformed buffer message (%zu "
                       "bytes, magic 0x%08x, key %llu)", who, len, magic,
                       (unsigned long long)k);
  int rc = gpuipc_handle_unpack((const uint8_t *)src + 16, len - 16, out);
  if (rc != 0) {
    char why[256];
    snprintf(why, sizeof(why), "%s", gpuipc_last_error());
    return gpuipc__err(GPUIPC_E_PROTO, "%s: buffer message: %s", who, why);
  }
  *key = k;
  return 0;
}
