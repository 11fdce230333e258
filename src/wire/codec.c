/*
 * Bounded little-endian writer and reader.
 *
 * Every put and get checks its bounds before touching memory; errors are
 * sticky, so an encoder or decoder can run straight through its fields and
 * look at the error once (gpuipc__wbuf_finish, gpuipc__rbuf_finish).
 * Integers are assembled byte by byte, so the code is the same on any host
 * byte order and never makes an unaligned access.
 */
#include "wire/wire.h"

/* Longest string a u16 length prefix can describe. */
#define STR_MAX 0xffffu

/* ----- writer ----- */

void gpuipc__wbuf_init(struct gpuipc__wbuf *w, void *p, size_t cap)
{
  w->p = p;
  w->cap = p != NULL ? cap : 0;
  w->len = 0;
  w->err = 0;
}

void gpuipc__wbuf_full(struct gpuipc__wbuf *w)
{
  w->err = -ENOSPC;
}

static bool wbuf_room(struct gpuipc__wbuf *w, size_t n)
{
  return gpuipc__wbuf_room(w, n);
}

void gpuipc__put_bytes(struct gpuipc__wbuf *w, const void *src, size_t n)
{
  if (!wbuf_room(w, n))
    return;
  if (n > 0)
    memcpy(w->p + w->len, src, n);
  w->len += n;
}

void gpuipc__put_str(struct gpuipc__wbuf *w, const char *s)
{
  if (w->err != 0)
    return;
  if (s == NULL) {
    w->err = -EINVAL;
    return;
  }
  size_t n = strnlen(s, STR_MAX + 1);
  if (n > STR_MAX) {
    w->err = -EINVAL;
    return;
  }
  /* Length and bytes go in together or not at all. */
  if (!wbuf_room(w, 2 + n))
    return;
  gpuipc__put_le(w, n, 2);
  gpuipc__put_bytes(w, s, n);
}

int gpuipc__wbuf_finish(const struct gpuipc__wbuf *w, const char *who)
{
  if (w->err == 0)
    return 0;
  if (w->err == -EINVAL)
    return gpuipc__err(w->err, "%s: a string is NULL or longer than %u bytes",
                       who, STR_MAX);
  return gpuipc__err(w->err, "%s: message does not fit in %zu bytes", who,
                     w->cap);
}

/* ----- reader ----- */

void gpuipc__rbuf_init(struct gpuipc__rbuf *r, const void *p, size_t len)
{
  r->p = p;
  r->len = p != NULL ? len : 0;
  r->pos = 0;
  r->err = 0;
  r->err_pos = 0;
  r->err_why = NULL;
}

void gpuipc__rbuf_fail(struct gpuipc__rbuf *r, const char *why)
{
  if (r->err != 0)
    return;
  r->err = GPUIPC_E_PROTO;
  r->err_pos = r->pos;
  r->err_why = why;
}

void gpuipc__get_bytes(struct gpuipc__rbuf *r, void *dst, size_t n)
{
  if (!gpuipc__rbuf_have(r, n)) {
    if (n > 0)
      memset(dst, 0, n);
    return;
  }
  if (n > 0)
    memcpy(dst, r->p + r->pos, n);
  r->pos += n;
}

void gpuipc__get_str(struct gpuipc__rbuf *r, char *dst, size_t cap)
{
  size_t start = r->pos;
  size_t n = gpuipc__get_u16(r);
  if (r->err == 0) {
    const char *why = NULL;
    if (n > r->len - r->pos)
      why = "truncated string";
    else if (cap == 0 || n > cap - 1)
      why = "string too long";
    else if (memchr(r->p + r->pos, '\0', n) != NULL)
      why = "string contains NUL";
    if (why != NULL) {
      r->pos = start; /* the error points at the string's length */
      gpuipc__rbuf_fail(r, why);
    }
  }
  if (r->err != 0) {
    if (cap > 0)
      dst[0] = '\0';
    return;
  }
  memcpy(dst, r->p + r->pos, n);
  dst[n] = '\0';
  r->pos += n;
}

size_t gpuipc__rbuf_left(const struct gpuipc__rbuf *r)
{
  return r->err != 0 ? 0 : r->len - r->pos;
}

int gpuipc__rbuf_finish(const struct gpuipc__rbuf *r, const char *who)
{
  if (r->err != 0)
    return gpuipc__err(r->err, "%s: %s at byte %zu of a %zu-byte message",
                       who, r->err_why, r->err_pos, r->len);
  if (r->pos != r->len)
    return gpuipc__err(GPUIPC_E_PROTO,
                       "%s: %zu trailing bytes after a %zu-byte message", who,
                       r->len - r->pos, r->pos);
  return 0;
}
