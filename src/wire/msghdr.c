/*
 * The 16-byte header in front of every client-broker message (the bodies
 * are src/domain/proto.c's): where a message starts being untrusted bytes,
 * so it is decoded here with the other decoders of src/wire.
 *
 *   u32 magic  u16 version  u16 type  u32 request id  u32 body length
 */
#include "wire/wire.h"

void gpuipc__msghdr_put(struct gpuipc__wbuf *w, const struct gpuipc__msghdr *h)
{
  gpuipc__put_u32(w, h->magic);
  gpuipc__put_u16(w, h->version);
  gpuipc__put_u16(w, h->type);
  gpuipc__put_u32(w, h->req);
  gpuipc__put_u32(w, 0); /* body length: gpuipc__msghdr_end */
}

void gpuipc__msghdr_end(struct gpuipc__wbuf *w)
{
  if (w->err != 0 || w->len < GPUIPC__MSGHDR_BYTES)
    return;
  uint32_t body = (uint32_t)(w->len - GPUIPC__MSGHDR_BYTES);
  uint8_t *p = w->p + 12;
  p[0] = (uint8_t)body;
  p[1] = (uint8_t)(body >> 8);
  p[2] = (uint8_t)(body >> 16);
  p[3] = (uint8_t)(body >> 24);
}

int gpuipc__msghdr_decode(const void *buf, size_t len, uint32_t magic,
                          uint16_t version,
                          const char *(*type_name)(unsigned type),
                          struct gpuipc__msghdr *out)
{
  if (len < GPUIPC__MSGHDR_BYTES)
    return gpuipc__err(GPUIPC_E_PROTO, "message of %zu bytes is shorter "
                       "than its %d-byte header", len, GPUIPC__MSGHDR_BYTES);
  struct gpuipc__rbuf r;
  gpuipc__rbuf_init(&r, buf, GPUIPC__MSGHDR_BYTES);
  out->magic = gpuipc__get_u32(&r);
  out->version = gpuipc__get_u16(&r);
  out->type = gpuipc__get_u16(&r);
  out->req = gpuipc__get_u32(&r);
  out->body = gpuipc__get_u32(&r);
  if (out->magic != magic)
    return gpuipc__err(GPUIPC_E_PROTO, "message magic 0x%08x is not gpuipc's",
                       out->magic);
  if (out->version != version)
    return gpuipc__err(GPUIPC_E_VERSION,
                       "peer speaks protocol version %u, this is version %u",
                       out->version, version);
  if ((size_t)out->body != len - GPUIPC__MSGHDR_BYTES)
    return gpuipc__err(GPUIPC_E_PROTO,
                       "%s: header says %u body bytes, %zu arrived",
                       type_name(out->type), out->body,
                       len - GPUIPC__MSGHDR_BYTES);
  return 0;
}
