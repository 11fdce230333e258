/*
 * gpuipc_share_copy and gpuipc_segment_copy_shared refuse bad arguments
 * with -EINVAL and a sentence naming what is wrong, before anything is
 * created (the broker lists no segment of the round afterwards); good
 * ones copy every byte, alone, and leave nothing behind but the standing
 * lend of their destination.
 */
#include "test.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static gpuipc_domain_t *dom;

/* The call must fail with -EINVAL, saying @needle, and create nothing. */
#define ASSERT_BAD(call, needle)                                               \
  do {                                                                         \
    ASSERT_RC(call, -EINVAL);                                                  \
    ASSERT_ERR_MENTIONS(needle);                                               \
    ASSERT_EQ(nsegments(), base);                                              \
  } while (0)

static int nsegments(void)
{
  int n = gpuipc_segment_list(dom, NULL, 0);
  if (n < 0)
    TFAIL_GPUIPC("gpuipc_segment_list returned %d", n);
  return n;
}

static gpuipc_buf_t *host(size_t n)
{
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_buf_alloc(n, GPUIPC_KIND_HOST, -1, 0, &b));
  return b;
}

int main(void)
{
  ASSERT_OK(gpuipc_domain_join("share", NULL, &dom));
  gpuipc_segment_opts_t so = GPUIPC_SEGMENT_OPTS_INIT;
  so.bytes = 1 << 20;
  so.kind = GPUIPC_KIND_HOST;
  so.flags = GPUIPC_CREATE;
  gpuipc_buf_t *src, *dst = host(1 << 20), *other = host(4096);
  ASSERT_OK(gpuipc_segment_open(dom, "pub", &so, &src));
  uint8_t *s = gpuipc_buf_ptr(src);
  for (size_t i = 0; i < (1 << 20); i++)
    s[i] = (uint8_t)(i * 7 + 3);
  ASSERT_OK(gpuipc_segment_publish(src, NULL));
  int base = nsegments();

  gpuipc_share_extent_t e[2] = {{src, 0, dst, 0, 300000},
                                {src, 500000, dst, 400000, 70000}};
  gpuipc_share_opts_t o = GPUIPC_SHARE_OPTS_INIT;
  o.chunk_bytes = 64 << 10;

  ASSERT_BAD(gpuipc_share_copy(NULL, "r", e, 2, NULL, &o), "dom is NULL");
  ASSERT_BAD(gpuipc_share_copy(dom, NULL, e, 2, NULL, &o), "round is NULL");
  ASSERT_BAD(gpuipc_share_copy(dom, "r", NULL, 2, NULL, &o), "ext is NULL");
  ASSERT_BAD(gpuipc_share_copy(dom, "r", e, 0, NULL, &o), "n 0");
  ASSERT_BAD(gpuipc_share_copy(dom, "r", e, -1, NULL, &o), "n -1");
  ASSERT_BAD(gpuipc_share_copy(dom, "r", e, 4097, NULL, &o), "n 4097");
  ASSERT_BAD(gpuipc_share_copy(dom, "a/b", e, 2, NULL, &o), "round name");
  ASSERT_BAD(gpuipc_share_copy(dom, "", e, 2, NULL, &o), "round name");
  ASSERT_BAD(gpuipc_share_copy(dom, ".r", e, 2, NULL, &o), "round name");
  char longname[GPUIPC_SHARE_ROUND_MAX + 2];
  memset(longname, 'x', sizeof(longname) - 1);
  longname[sizeof(longname) - 1] = '\0';
  ASSERT_BAD(gpuipc_share_copy(dom, longname, e, 2, NULL, &o),
             "longer than 48");

  gpuipc_share_extent_t b[2] = {e[0], e[1]};
  b[1].src = NULL;
  ASSERT_BAD(gpuipc_share_copy(dom, "r", b, 2, NULL, &o), "extent 1: src");
  b[1] = e[1];
  b[1].dst = NULL;
  ASSERT_BAD(gpuipc_share_copy(dom, "r", b, 2, NULL, &o), "extent 1: dst");
  b[1] = e[1];
  b[1].src_off = (1 << 20) - 69999;
  ASSERT_BAD(gpuipc_share_copy(dom, "r", b, 2, NULL, &o), "src offset");
  b[1].src_off = SIZE_MAX;
  ASSERT_BAD(gpuipc_share_copy(dom, "r", b, 2, NULL, &o), "src offset");
  b[1] = e[1];
  b[1].dst = other;
  ASSERT_BAD(gpuipc_share_copy(dom, "r", b, 2, NULL, &o), "dst offset");
  b[1] = e[1];
  b[1].dst_off = 299999; /* one byte over extent 0's */
  ASSERT_BAD(gpuipc_share_copy(dom, "r", b, 2, NULL, &o),
             "extents 0 and 1 overlap");

  gpuipc_share_opts_t bo = o;
  bo.chunk_bytes = 1000;
  ASSERT_BAD(gpuipc_share_copy(dom, "r", e, 2, NULL, &bo),
             "not a multiple of 4096");
  /* 257 extents of 1 MiB in 4 KiB chunks: 65792 chunks, above 65536 (the
   * 257 MiB of HOST memory are never touched). */
  gpuipc_buf_t *big = host((size_t)257 << 20);
  gpuipc_share_extent_t *many = calloc(257, sizeof(*many));
  for (int i = 0; i < 257; i++)
    many[i] = (gpuipc_share_extent_t){src, 0, big, (size_t)i << 20, 1 << 20};
  bo = o;
  bo.chunk_bytes = 4096;
  ASSERT_BAD(gpuipc_share_copy(dom, "r", many, 257, NULL, &bo),
             "65792 chunks");
  free(many);
  gpuipc_buf_release(big);
  bo = o;
  bo.size = 0;
  ASSERT_BAD(gpuipc_share_copy(dom, "r", e, 2, NULL, &bo), "size 0");
  bo = o;
  bo.flags = 0x10;
  ASSERT_BAD(gpuipc_share_copy(dom, "r", e, 2, NULL, &bo), "unknown flags");
  bo = o;
  bo.timeout_ms = -7;
  ASSERT_BAD(gpuipc_share_copy(dom, "r", e, 2, NULL, &bo), "timeout_ms -7");
  bo = o;
  bo.stats_size = 12;
  ASSERT_BAD(gpuipc_share_copy(dom, "r", e, 2, NULL, &bo), "stats_size 12");
  bo.stats_size = sizeof(gpuipc_share_stats_t) + 8;
  ASSERT_BAD(gpuipc_share_copy(dom, "r", e, 2, NULL, &bo), "stats_size");

  ASSERT_BAD(gpuipc_segment_copy_shared(dom, NULL, 0, dst, 0, 10, NULL, &o),
             "seg is NULL");
  ASSERT_BAD(gpuipc_segment_copy_shared(dom, other, 0, dst, 0, 10, NULL, &o),
             "no segment");

  /* Good calls: alone, every byte, nothing left behind but dst's standing
   * lend (tests/share_cache.c), the same for both. */
  gpuipc_share_extent_t g[3] = {e[0], e[1], {src, 9, dst, 900000, 0}};
  ASSERT_OK(gpuipc_share_copy(dom, "r", g, 3, NULL, &o));
  const uint8_t *d = gpuipc_buf_ptr(dst);
  for (size_t i = 0; i < 300000; i++)
    ASSERT_EQ(d[i], s[i]);
  for (size_t i = 0; i < 70000; i++)
    ASSERT_EQ(d[400000 + i], s[500000 + i]);
  ASSERT_EQ(nsegments(), base + 1);
  memset(gpuipc_buf_ptr(dst), 0, 1 << 20);
  ASSERT_OK(gpuipc_segment_copy_shared(dom, src, 4096, dst, 8, 500000, NULL,
                                       NULL));
  for (size_t i = 0; i < 500000; i++)
    ASSERT_EQ(d[8 + i], s[4096 + i]);
  ASSERT_EQ(nsegments(), base + 1);

  /* The stats: whole with GPUIPC_SHARE_OPTS_INIT; a caller of the first
   * version (its opts without stats_size, or 0 there) gets the first
   * version's fields and not a byte past them. */
  gpuipc_share_stats_t st;
  gpuipc_share_opts_t so2 = o;
  so2.stats = &st;
  memset(&st, 0xab, sizeof(st));
  ASSERT_OK(gpuipc_share_copy(dom, "r", g, 3, NULL, &so2));
  ASSERT_EQ(st.joined, 1);
  ASSERT_EQ_U(st.chunks, 7);
  ASSERT_EQ_U(st.from_publisher, 7);
  ASSERT_EQ_U(st.recopied, 0);
  ASSERT_EQ(st.lent, 0); /* dst stayed lent from the call before */
  ASSERT_EQ(st.opened, 0);
  ASSERT_TRUE(st.ahead == 0 || st.ahead == 1);
  size_t first = offsetof(gpuipc_share_stats_t, recopied);
  for (size_t sz = 0; sz < 2; sz++) {
    gpuipc_share_opts_t old = so2;
    if (sz == 0)
      old.size = offsetof(gpuipc_share_opts_t, stats_size);
    else
      old.stats_size = 0;
    memset(&st, 0xab, sizeof(st));
    ASSERT_OK(gpuipc_share_copy(dom, "r", g, 3, NULL, &old));
    ASSERT_EQ_U(st.chunks, 7);
    const uint8_t *past = (const uint8_t *)&st + first;
    for (size_t i = 0; i < sizeof(st) - first; i++)
      ASSERT_EQ(past[i], 0xab);
  }

  gpuipc_buf_release(other);
  gpuipc_buf_release(dst);
  gpuipc_buf_release(src);
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
