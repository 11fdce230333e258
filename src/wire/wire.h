/*
 * src/wire: little-endian encoding with bounds checks, and the handle
 * record. Decoders check every field and say which one was wrong.
 */
#ifndef GPUIPC_WIRE_H
#define GPUIPC_WIRE_H

#include "core/core.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* A bounded writer: the first overflow sets @err and later puts do nothing. */
struct gpuipc__wbuf {
  uint8_t *p;
  size_t cap, len;
  int err; /* 0 or -ENOSPC */
};
/* A bounded reader: the first overrun sets @err, later gets return 0. */
struct gpuipc__rbuf {
  const uint8_t *p;
  size_t len, pos;
  int err; /* 0 or GPUIPC_E_PROTO */
};

void gpuipc__wbuf_init(struct gpuipc__wbuf *w, void *p, size_t cap);
void gpuipc__put_u8(struct gpuipc__wbuf *w, uint8_t v);
void gpuipc__put_u16(struct gpuipc__wbuf *w, uint16_t v);
void gpuipc__put_u32(struct gpuipc__wbuf *w, uint32_t v);
void gpuipc__put_u64(struct gpuipc__wbuf *w, uint64_t v);
void gpuipc__put_bytes(struct gpuipc__wbuf *w, const void *src, size_t n);
/* A string as u16 length + bytes (no NUL). */
void gpuipc__put_str(struct gpuipc__wbuf *w, const char *s);

void gpuipc__rbuf_init(struct gpuipc__rbuf *r, const void *p, size_t len);
uint8_t gpuipc__get_u8(struct gpuipc__rbuf *r);
uint16_t gpuipc__get_u16(struct gpuipc__rbuf *r);
uint32_t gpuipc__get_u32(struct gpuipc__rbuf *r);
uint64_t gpuipc__get_u64(struct gpuipc__rbuf *r);
void gpuipc__get_bytes(struct gpuipc__rbuf *r, void *dst, size_t n);
/*
 * A u16-length string into @dst (capacity @cap, NUL-terminated). Overlong
 * strings or strings containing NUL set r->err.
 */
void gpuipc__get_str(struct gpuipc__rbuf *r, char *dst, size_t cap);

/* CRC-32C (Castagnoli) of @n bytes. */
uint32_t gpuipc__crc32c(uint32_t crc, const void *p, size_t n);

/* Largest buffer size a handle may describe (2^48 bytes, 256 TiB). */
#define GPUIPC_SIZE_MAX_ABSURD (1ull << 48)

/*
 * Validate a handle's fields (what unpack checks beyond the encoding); used
 * by pack, unpack and import. GPUIPC_E_BADHANDLE with the field named.
 * @who prefixes the sentence ("gpuipc_handle_unpack").
 */
int gpuipc__handle_validate(const gpuipc_handle_t *h, const char *who);

#endif
