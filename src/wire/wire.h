/*
 * src/wire: little-endian encoding with bounds checks, and every decoder
 * of bytes that come from another process: the handle record (handle.c),
 * the header of a client-broker message (msghdr.c; the bodies are described
 * in src/domain/proto.c) and a channel's records (desc.c, desc.h).
 * Decoders check every field and say which one was wrong.
 */
#ifndef GPUIPC_WIRE_H
#define GPUIPC_WIRE_H

#include "core/core.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/*
 * Integers are little-endian on the wire whatever the host's byte order.
 * Neither buffer allocates; both are plain structs on the caller's stack and
 * are not shared between threads.
 */

/*
 * A bounded writer: the first overflow sets @err and later puts do nothing
 * (a put that does not fit writes none of its bytes). @p may be NULL only
 * when @cap is 0.
 */
struct gpuipc__wbuf {
  uint8_t *p;
  size_t cap, len;
  int err; /* 0, -ENOSPC, or -EINVAL (put_str of NULL or > 65535 bytes) */
};
/*
 * A bounded reader: the first overrun or malformed string sets @err, and
 * every later get returns 0 (get_bytes zero-fills, get_str gives "") even if
 * it would have fitted, so a decoder can read all its fields and check @err
 * once at the end (gpuipc__rbuf_finish).
 */
struct gpuipc__rbuf {
  const uint8_t *p;
  size_t len, pos;
  int err; /* 0 or GPUIPC_E_PROTO */
  size_t err_pos;      /* where the first error was seen */
  const char *err_why; /* static phrase: "truncated", ... */
};

void gpuipc__wbuf_init(struct gpuipc__wbuf *w, void *p, size_t cap);
/* Room for @n more bytes? Sets -ENOSPC (once) when not. */
void gpuipc__wbuf_full(struct gpuipc__wbuf *w);
static inline bool gpuipc__wbuf_room(struct gpuipc__wbuf *w, size_t n)
{
  if (w->err != 0)
    return false;
  if (n > w->cap - w->len) {
    gpuipc__wbuf_full(w);
    return false;
  }
  return true;
}

/*
 * An @n-byte (1, 2, 4 or 8) little-endian integer. Inline, as the reader's: a block
 * list is thousands of them, written on every batch (and the byte loop
 * compiles to one store).
 */
static inline void gpuipc__put_le(struct gpuipc__wbuf *w, uint64_t v, size_t n)
{
  if (!gpuipc__wbuf_room(w, n))
    return;
  uint8_t *d = w->p + w->len; /* a local: the stores cannot touch *w */
  /* Straight-line byte stores, which the compiler merges into one. */
  switch (n) {
  case 8:
    d[7] = (uint8_t)(v >> 56);
    d[6] = (uint8_t)(v >> 48);
    d[5] = (uint8_t)(v >> 40);
    d[4] = (uint8_t)(v >> 32);
    /* fall through */
  case 4:
    d[3] = (uint8_t)(v >> 24);
    d[2] = (uint8_t)(v >> 16);
    /* fall through */
  case 2:
    d[1] = (uint8_t)(v >> 8);
    /* fall through */
  default:
    d[0] = (uint8_t)v;
  }
  w->len += n;
}

static inline void gpuipc__put_u8(struct gpuipc__wbuf *w, uint8_t v)
{
  gpuipc__put_le(w, v, 1);
}

static inline void gpuipc__put_u16(struct gpuipc__wbuf *w, uint16_t v)
{
  gpuipc__put_le(w, v, 2);
}

static inline void gpuipc__put_u32(struct gpuipc__wbuf *w, uint32_t v)
{
  gpuipc__put_le(w, v, 4);
}

static inline void gpuipc__put_u64(struct gpuipc__wbuf *w, uint64_t v)
{
  gpuipc__put_le(w, v, 8);
}
void gpuipc__put_bytes(struct gpuipc__wbuf *w, const void *src, size_t n);
/* A string as u16 length + bytes (no NUL). */
void gpuipc__put_str(struct gpuipc__wbuf *w, const char *s);

void gpuipc__rbuf_init(struct gpuipc__rbuf *r, const void *p, size_t len);
/* Record the first error of @r (@why: a static phrase) at its position. */
void gpuipc__rbuf_fail(struct gpuipc__rbuf *r, const char *why);

/* Are @n more bytes there? Sets the error (once) when not. */
static inline bool gpuipc__rbuf_have(struct gpuipc__rbuf *r, size_t n)
{
  if (r->err != 0)
    return false;
  if (n > r->len - r->pos) {
    gpuipc__rbuf_fail(r, "truncated");
    return false;
  }
  return true;
}

/*
 * An @n-byte (1, 2, 4 or 8) little-endian integer, or 0 with r->err set. Inline:
 * a channel's descriptor is a score of fields read on every message.
 */
static inline uint64_t gpuipc__get_le(struct gpuipc__rbuf *r, size_t n)
{
  if (!gpuipc__rbuf_have(r, n))
    return 0;
  const uint8_t *s = r->p + r->pos;
  uint64_t v = 0;
  /* Straight-line byte loads, which the compiler merges into one. */
  switch (n) {
  case 8:
    v |= (uint64_t)s[7] << 56 | (uint64_t)s[6] << 48 |
         (uint64_t)s[5] << 40 | (uint64_t)s[4] << 32;
    /* fall through */
  case 4:
    v |= (uint64_t)s[3] << 24 | (uint64_t)s[2] << 16;
    /* fall through */
  case 2:
    v |= (uint64_t)s[1] << 8;
    /* fall through */
  default:
    v |= s[0];
  }
  r->pos += n;
  return v;
}

static inline uint8_t gpuipc__get_u8(struct gpuipc__rbuf *r)
{
  return (uint8_t)gpuipc__get_le(r, 1);
}

static inline uint16_t gpuipc__get_u16(struct gpuipc__rbuf *r)
{
  return (uint16_t)gpuipc__get_le(r, 2);
}

static inline uint32_t gpuipc__get_u32(struct gpuipc__rbuf *r)
{
  return (uint32_t)gpuipc__get_le(r, 4);
}

static inline uint64_t gpuipc__get_u64(struct gpuipc__rbuf *r)
{
  return gpuipc__get_le(r, 8);
}

void gpuipc__get_bytes(struct gpuipc__rbuf *r, void *dst, size_t n);
/*
 * A u16-length string into @dst (capacity @cap, NUL-terminated). Overlong
 * strings or strings containing NUL set r->err.
 */
void gpuipc__get_str(struct gpuipc__rbuf *r, char *dst, size_t cap);

/* Bytes not yet read (0 after an error). */
size_t gpuipc__rbuf_left(const struct gpuipc__rbuf *r);

/*
 * gpuipc__rbuf_finish - end of decoding: 0 when every get succeeded and all
 * @r->len bytes were consumed; otherwise GPUIPC_E_PROTO with a sentence
 * "<who>: <why> at byte N of a M-byte message" or "<who>: K trailing bytes".
 */
int gpuipc__rbuf_finish(const struct gpuipc__rbuf *r, const char *who);

/*
 * gpuipc__wbuf_finish - end of encoding: 0 when every put fitted, else
 * @w->err with a sentence naming @who and the capacity.
 */
int gpuipc__wbuf_finish(const struct gpuipc__wbuf *w, const char *who);

/*
 * The header of a framed message (msghdr.c; the client-broker protocol in
 * src/domain/proto.h uses it): little-endian u32 magic, u16 version, u16
 * type, u32 request id, u32 body length.
 */
#define GPUIPC__MSGHDR_BYTES 16
struct gpuipc__msghdr {
  uint32_t magic;
  uint16_t version;
  uint16_t type;
  uint32_t req;
  uint32_t body; /* bytes after the header */
};

/* Write @h at the start of @w with body length 0 (@h->body is ignored). */
void gpuipc__msghdr_put(struct gpuipc__wbuf *w, const struct gpuipc__msghdr *h);
/* After the body: write its length into the header (nothing after an error). */
void gpuipc__msghdr_end(struct gpuipc__wbuf *w);
/*
 * Decode the header of the @len-byte message at @buf into @out and check it:
 * @magic, @version, and a body length that is what follows the header.
 * Returns 0; GPUIPC_E_VERSION when only the version differs (@out is filled
 * in); GPUIPC_E_PROTO with a sentence (naming the type through @type_name)
 * for anything else.
 */
int gpuipc__msghdr_decode(const void *buf, size_t len, uint32_t magic,
                          uint16_t version,
                          const char *(*type_name)(unsigned type),
                          struct gpuipc__msghdr *out);

/*
 * CRC-32C (Castagnoli) of @n bytes, continuing from @crc: pass 0 to start,
 * and crc32c(crc32c(0, a), b) == crc32c(0, a followed by b). The check value
 * of "123456789" is 0xe3069283. @p may be NULL when @n is 0.
 */
uint32_t gpuipc__crc32c(uint32_t crc, const void *p, size_t n);

/* Largest buffer size a handle may describe (2^48 bytes, 256 TiB). */
#define GPUIPC_SIZE_MAX_ABSURD (1ull << 48)

/*
 * The packed handle record (layout in handle.c and docs/handle-format.md):
 * it begins with this magic, the bytes 'G' 'I' 'P' 'H' read as a
 * little-endian u32, and ends with the CRC-32C of the bytes before
 * GPUIPC__HANDLE_CRC_OFFSET.
 */
#define GPUIPC__HANDLE_MAGIC 0x48504947u
#define GPUIPC__HANDLE_CRC_OFFSET 188

/*
 * Validate a handle's fields (what unpack checks beyond the encoding); used
 * by pack, unpack and import. GPUIPC_E_BADHANDLE with the field named
 * (-EINVAL for a NULL @h). @who prefixes the sentence
 * ("gpuipc_handle_unpack"). The fd is not looked at.
 */
int gpuipc__handle_validate(const gpuipc_handle_t *h, const char *who);

#endif
