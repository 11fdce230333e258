/*
 * The round table: its layout in the HOST segment, the digest of the
 * extent layout, opening it, and the header's set-up and checks. A new table is a
 * new memfd, zero-filled: the first member to swap its magic from 0 to
 * BUSY writes the header, then the magic; the others wait for it and
 * check every field against their own layout before they join.
 */
#include "share/share.h"
#include "segment/segment.h"
#include "mem/mem.h"
#include "cuda/cuda.h"
#include "os/os.h"

#include <stdio.h>
#include <stdlib.h>

static uint64_t fnv(uint64_t h, uint64_t v)
{
  for (int i = 0; i < 8; i++) {
    h ^= (v >> (8 * i)) & 0xffu;
    h *= 0x100000001b3ull;
  }
  return h;
}

/* The layout's digest: the extents' byte counts and source offsets. */
static uint64_t digest(const gpuipc_share_extent_t *ext, int n,
                       uint64_t chunk_bytes)
{
  uint64_t h = fnv(0xcbf29ce484222325ull, (uint64_t)n);
  h = fnv(h, chunk_bytes);
  for (int i = 0; i < n; i++) {
    h = fnv(h, ext[i].bytes);
    h = fnv(h, ext[i].src_off);
  }
  return h;
}

int gpuipc__share_layout(const gpuipc_share_extent_t *ext, int n,
                         uint64_t chunk_bytes, struct share_layout *out)
{
  uint64_t total = 0;
  for (int i = 0; i < n; i++)
    total += (ext[i].bytes + chunk_bytes - 1) / chunk_bytes;
  if (total > GPUIPC__SHARE_CHUNKS_MAX)
    return gpuipc__err(-EINVAL, "gpuipc_share_copy: %llu chunks of %llu "
                       "bytes, above %u: take larger chunks",
                       (unsigned long long)total,
                       (unsigned long long)chunk_bytes,
                       GPUIPC__SHARE_CHUNKS_MAX);
  struct share_piece *p = calloc(total > 0 ? total : 1, sizeof(*p));
  if (p == NULL)
    return gpuipc__err(-ENOMEM, "gpuipc_share_copy: out of memory");
  uint32_t c = 0;
  for (int i = 0; i < n; i++)
    for (uint64_t off = 0; off < ext[i].bytes; off += chunk_bytes) {
      p[c].ext = (uint32_t)i;
      p[c].off = off;
      p[c].bytes = ext[i].bytes - off < chunk_bytes ? ext[i].bytes - off
                                                    : chunk_bytes;
      c++;
    }
  out->n = n;
  out->ext = ext;
  out->chunk_bytes = chunk_bytes;
  out->nchunks = c;
  out->pieces = p;
  out->digest = digest(ext, n, chunk_bytes);
  return 0;
}

void gpuipc__share_layout_free(struct share_layout *l)
{
  free(l->pieces);
  l->pieces = NULL;
}

static size_t members_at(void)
{
  return 4096;
}

static size_t chunks_at(void)
{
  return members_at() + GPUIPC__SHARE_MEMBERS * sizeof(struct share_member);
}

static size_t exts_at(uint32_t nchunks)
{
  return chunks_at() + (size_t)nchunks * sizeof(struct share_chunk);
}

static size_t bytes_of(uint32_t nchunks, uint32_t nextents)
{
  size_t end = exts_at(nchunks) + (size_t)GPUIPC__SHARE_MEMBERS *
                                      (size_t)nextents *
                                      sizeof(struct share_ext);
  return (end + 4095) & ~(size_t)4095;
}

void gpuipc__share_table_name(char *out, size_t cap, const char *round)
{
  snprintf(out, cap, "%s" GPUIPC__SHARE_TABLE_SUFFIX, round);
}

size_t gpuipc__share_table_bytes(const struct share_layout *l)
{
  return bytes_of(l->nchunks, (uint32_t)l->n);
}

static void parts_map(struct share_table *t, gpuipc_buf_t *buf,
                      uint32_t nchunks, uint32_t nextents)
{
  t->buf = buf;
  t->base = gpuipc_buf_ptr(buf);
  t->size = gpuipc_buf_size(buf);
  t->hdr = (struct share_hdr *)t->base;
  t->members = (struct share_member *)(t->base + members_at());
  t->chunks = (struct share_chunk *)(t->base + chunks_at());
  t->exts = (struct share_ext *)(t->base + exts_at(nchunks));
  t->nchunks = nchunks;
  t->nextents = nextents;
  t->created = false;
}

void gpuipc__share_table_map(struct share_table *t, gpuipc_buf_t *buf,
                             const struct share_layout *l)
{
  parts_map(t, buf, l->nchunks, (uint32_t)l->n);
}

int gpuipc__share_table_map_found(struct share_table *t, gpuipc_buf_t *buf)
{
  size_t size = gpuipc_buf_size(buf);
  if (gpuipc_buf_kind(buf) != GPUIPC_KIND_HOST || size < members_at())
    return GPUIPC_E_MISMATCH;
  const struct share_hdr *h = gpuipc_buf_ptr(buf);
  uint32_t nchunks = h->nchunks, nextents = h->nextents;
  if (atomic_load_explicit(&((struct share_hdr *)h)->magic,
                           memory_order_acquire) != GPUIPC__SHARE_MAGIC ||
      h->layout != GPUIPC__SHARE_LAYOUT || nchunks > GPUIPC__SHARE_CHUNKS_MAX ||
      nextents == 0 || nextents > GPUIPC__SHARE_EXT_MAX ||
      bytes_of(nchunks, nextents) > size)
    return GPUIPC_E_MISMATCH;
  parts_map(t, buf, nchunks, nextents);
  return 0;
}

static void header_write(struct share_table *t, const struct share_layout *l)
{
  struct share_hdr *h = t->hdr;
  h->layout = GPUIPC__SHARE_LAYOUT;
  h->digest = l->digest;
  h->chunk_bytes = l->chunk_bytes;
  h->nchunks = l->nchunks;
  h->nextents = (uint32_t)l->n;
  h->created_ns = gpuipc__now_ns();
  atomic_store_explicit(&h->magic, GPUIPC__SHARE_MAGIC, memory_order_release);
}

/* Wait for the creator's magic: 0 once it is there. */
static int magic_wait(struct share_table *t, int timeout_ms)
{
  uint64_t deadline = gpuipc__deadline(timeout_ms);
  unsigned nap = 10;
  for (;;) {
    uint32_t m = atomic_load_explicit(&t->hdr->magic, memory_order_acquire);
    if (m == GPUIPC__SHARE_MAGIC)
      return 0;
    if (m != GPUIPC__SHARE_BUSY)
      return gpuipc__err(GPUIPC_E_MISMATCH, "gpuipc_share_copy: the round "
                         "table's magic is 0x%08x, not a round table's",
                         (unsigned)m);
    if (gpuipc__now_ns() >= deadline)
      return gpuipc__err(-ETIMEDOUT, "gpuipc_share_copy: the round table's "
                         "creator did not set it up within %d ms",
                         timeout_ms);
    gpuipc__sleep_us(nap);
    nap = nap < 1000 ? nap * 2 : nap;
  }
}

int gpuipc__share_table_init(struct share_table *t,
                             const struct share_layout *l, int timeout_ms)
{
  uint32_t zero = 0;
  if (atomic_compare_exchange_strong(&t->hdr->magic, &zero,
                                     GPUIPC__SHARE_BUSY)) {
    header_write(t, l);
    t->created = true;
    return 0;
  }
  int rc = magic_wait(t, timeout_ms);
  if (rc != 0)
    return rc;
  const struct share_hdr *h = t->hdr;
  if (h->layout != GPUIPC__SHARE_LAYOUT || h->digest != l->digest ||
      h->chunk_bytes != l->chunk_bytes || h->nchunks != l->nchunks ||
      h->nextents != (uint32_t)l->n)
    return gpuipc__err(GPUIPC_E_MISMATCH, "gpuipc_share_copy: the round "
                       "table describes another layout (layout %u, digest "
                       "%016llx, %llu-byte chunks, %u chunks, %u extents; "
                       "this call: digest %016llx, %llu, %u, %d)",
                       h->layout, (unsigned long long)h->digest,
                       (unsigned long long)h->chunk_bytes, h->nchunks,
                       h->nextents, (unsigned long long)l->digest,
                       (unsigned long long)l->chunk_bytes, l->nchunks, l->n);
  return 0;
}

int gpuipc__share_table_open(gpuipc_domain_t *dom, const char *round,
                             const struct share_layout *l, int device,
                             int timeout_ms, struct share_table *t,
                             uint64_t *words)
{
  char name[GPUIPC_NAME_MAX + 1];
  gpuipc__share_table_name(name, sizeof(name), round);
  gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
  o.bytes = gpuipc__share_table_bytes(l);
  o.kind = GPUIPC_KIND_HOST;
  o.flags = GPUIPC_CREATE | GPUIPC_SCRATCH;
  o.timeout_ms = timeout_ms;
  gpuipc_buf_t *b;
  int rc = gpuipc_segment_open(dom, name, &o, &b);
  if (rc != 0)
    return rc;
  gpuipc__share_table_map(t, b, l);
  rc = gpuipc__share_table_init(t, l, timeout_ms);
  if (rc == 0 && device >= 0) {
    rc = gpuipc__host_pin(b, device);
    if (rc == 0)
      rc = gpuipc__word_dev(device, t->base, words);
  }
  if (rc != 0)
    gpuipc_buf_release(b);
  return rc;
}
