/*
 * A buffer this process allocated is published as a segment without a
 * copy (gpuipc_segment_opts_t.buf):
 *  - the reader in another process waits until the lender publishes, then
 *    finds the lender's bytes; what it writes, the lender reads in its own
 *    buffer (one memory, no copy either way);
 *  - the memory outlives both of the lender's references while the reader
 *    holds it (HOST);
 *  - GPUIPC_SCRATCH publishes it at once;
 *  - misuse gets -EINVAL / -EEXIST and costs the buffer nothing: no
 *    CREATE, another size, kind or device, an imported buffer, a name that
 *    exists or is being filled;
 *  - one buffer under two names: the same bytes, each name keeps them;
 *  - an options struct of the size before the field ignores what lies
 *    past it.
 * HOST kind: runs anywhere.
 */
#include "test.h"
#include "helpers/seg_peer.h"
#include "mem/mem.h"

#include <stddef.h>

#define LEND_BYTES 65536

static gpuipc_domain_t *dom;

static gpuipc_buf_t *host_buf(uint64_t seed)
{
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_buf_alloc(LEND_BYTES, GPUIPC_KIND_HOST, -1, 0, &b));
  test_fill(gpuipc_buf_ptr(b), LEND_BYTES, seed);
  return b;
}

static gpuipc_segment_opts_t lend_opts(gpuipc_buf_t *b, unsigned flags)
{
  gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
  o.flags = flags;
  o.buf = b;
  return o;
}

static uint64_t live_buffers(void)
{
  struct gpuipc__cache_stats st;
  gpuipc__cache_stats(&st);
  return st.live;
}

static gpuipc_segment_state_t state_of(const char *name)
{
  gpuipc_segment_info_t s = {.size = sizeof(s)};
  ASSERT_OK(gpuipc_segment_stat(dom, name, &s));
  return s.state;
}

static void lend_then_share_writes(void)
{
  struct peer reader;
  peer_start(&reader);
  PEER_OK(&reader, "join lend");
  gpuipc_buf_t *b = host_buf(1);
  gpuipc_segment_opts_t o = lend_opts(b, GPUIPC_CREATE);
  gpuipc_buf_t *seg;
  ASSERT_OK(gpuipc_segment_open(dom, "l1", &o, &seg));
  ASSERT_PTR_EQ(seg, b); /* the very buffer, one more reference */
  ASSERT_EQ(state_of("l1"), GPUIPC_SEG_FILLING);
  /* Filling as any creation is: the reader's wait ends at the publish. */
  peer_send(&reader, "wcheck l1 1");
  struct pollfd pf = {.fd = reader.out, .events = POLLIN};
  ASSERT_EQ(poll(&pf, 1, 100), 0);
  ASSERT_OK(gpuipc_segment_publish(seg, NULL));
  const char *r = peer_read(&reader, PEER_REPLY_MS);
  if (strcmp(r, "ok 65536") != 0)
    TFAIL("reader: %s", r);
  /* The reader writes; the lender reads it where it always had it. */
  PEER_OK(&reader, "fill l1 2");
  ASSERT_EQ_U(test_check(gpuipc_buf_ptr(b), LEND_BYTES, 2), (size_t)-1);
  test_fill(gpuipc_buf_ptr(b), LEND_BYTES, 3);
  PEER_OK(&reader, "check l1 3");

  /* Both of the lender's references go; the reader's mapping stays. */
  uint64_t live = live_buffers();
  ASSERT_OK(gpuipc_buf_release(seg));
  ASSERT_EQ_U(live_buffers(), live); /* the caller's own reference holds */
  ASSERT_OK(gpuipc_buf_release(b));
  ASSERT_EQ_U(live_buffers(), live - 1);
  PEER_OK(&reader, "check l1 3");
  ASSERT_OK(gpuipc_segment_unlink(dom, "l1"));
  PEER_OK(&reader, "check l1 3");
  PEER_OK(&reader, "release l1");
  peer_finish(&reader);
}

static void scratch_at_once(void)
{
  struct peer reader;
  peer_start(&reader);
  PEER_OK(&reader, "join lend");
  gpuipc_buf_t *b = host_buf(4), *seg;
  gpuipc_segment_opts_t o = lend_opts(b, GPUIPC_CREATE | GPUIPC_SCRATCH);
  o.bytes = LEND_BYTES; /* its size may be said */
  o.kind = GPUIPC_KIND_HOST;
  ASSERT_OK(gpuipc_segment_open(dom, "l2", &o, &seg));
  ASSERT_EQ(state_of("l2"), GPUIPC_SEG_PUBLISHED);
  PEER_EXPECT(&reader, "ok 0 65536", "fopen l2 0 -");
  PEER_OK(&reader, "check l2 4");
  ASSERT_OK(gpuipc_segment_unlink(dom, "l2"));
  ASSERT_OK(gpuipc_buf_release(seg));
  ASSERT_OK(gpuipc_buf_release(b));
  PEER_OK(&reader, "check l2 4");
  peer_finish(&reader);
}

/* @o's open fails with @code, says @needle, and @b is as it was. */
static void refused(gpuipc_segment_opts_t *o, const char *name, int code,
                    const char *needle)
{
  gpuipc_buf_t *b = o->buf, *seg = NULL;
  uint64_t live = live_buffers();
  ASSERT_RC(gpuipc_segment_open(dom, name, o, &seg), code);
  if (needle != NULL)
    ASSERT_ERR_MENTIONS(needle);
  ASSERT_TRUE(seg == NULL);
  ASSERT_EQ_U(live_buffers(), live);
  ASSERT_OK(gpuipc_buf_alive(b));
  gpuipc_segment_info_t s = {.size = sizeof(s)};
  if (code != -EEXIST)
    ASSERT_RC(gpuipc_segment_stat(dom, name, &s), -ENOENT);
}

static void misuse(void)
{
  struct peer other;
  peer_start(&other);
  PEER_OK(&other, "join lend");
  gpuipc_buf_t *b = host_buf(5);
  gpuipc_segment_opts_t o = lend_opts(b, 0);
  refused(&o, "m1", -EINVAL, "needs GPUIPC_CREATE");
  o = lend_opts(b, GPUIPC_WAIT);
  refused(&o, "m1", -EINVAL, "needs GPUIPC_CREATE");
  o = lend_opts(b, GPUIPC_CREATE);
  o.bytes = LEND_BYTES / 2;
  refused(&o, "m1", -EINVAL, "opts->buf has 65536");
  o = lend_opts(b, GPUIPC_CREATE);
  o.kind = GPUIPC_KIND_VMM;
  refused(&o, "m1", -EINVAL, "kind");
  o = lend_opts(b, GPUIPC_CREATE);
  o.device = 0;
  refused(&o, "m1", -EINVAL, "device 0");

  /* A name that exists, or is being filled: never opened in its place. */
  PEER_OK(&other, "fopen taken 4096 cs");
  PEER_OK(&other, "fopen filling 4096 c");
  o = lend_opts(b, GPUIPC_CREATE);
  refused(&o, "taken", -EEXIST, NULL);
  refused(&o, "filling", -EEXIST, NULL);
  ASSERT_EQ(state_of("filling"), GPUIPC_SEG_FILLING);

  /* Memory of another process is not this process's to lend. */
  gpuipc_buf_t *theirs;
  ASSERT_OK(gpuipc_segment_open(dom, "taken", NULL, &theirs));
  o = lend_opts(theirs, GPUIPC_CREATE);
  refused(&o, "m2", -EINVAL, "imported");

  /* After all that, it lends fine; and under a second name too: both
   * names are the same bytes, and each keeps them. */
  gpuipc_buf_t *seg, *seg2;
  o = lend_opts(b, GPUIPC_CREATE | GPUIPC_SCRATCH);
  ASSERT_OK(gpuipc_segment_open(dom, "m3", &o, &seg));
  ASSERT_OK(gpuipc_segment_open(dom, "m4", &o, &seg2));
  ASSERT_PTR_EQ(seg2, b);
  PEER_OK(&other, "fopen m3 0 -");
  PEER_OK(&other, "check m3 5");
  PEER_OK(&other, "fill m3 6");
  PEER_OK(&other, "fopen m4 0 -");
  PEER_OK(&other, "check m4 6");
  ASSERT_OK(gpuipc_segment_unlink(dom, "m3"));
  ASSERT_OK(gpuipc_buf_release(seg));
  ASSERT_OK(gpuipc_buf_release(seg2));
  ASSERT_OK(gpuipc_buf_release(theirs));
  ASSERT_OK(gpuipc_buf_release(b));
  PEER_OK(&other, "release m3");
  PEER_OK(&other, "check m4 6");
  ASSERT_OK(gpuipc_segment_unlink(dom, "m4"));
  PEER_OK(&other, "unlink taken");
  peer_finish(&other);
}

/* A caller built before the field: whatever lies past its struct is not
 * a buffer to lend, and the call allocates as it always did. */
static void older_struct(void)
{
  gpuipc_segment_opts_t o;
  memset(&o, 0xa5, sizeof(o));
  o.size = offsetof(gpuipc_segment_opts_t, buf);
  o.bytes = 4096;
  o.kind = GPUIPC_KIND_HOST;
  o.device = -1;
  o.flags = GPUIPC_CREATE | GPUIPC_SCRATCH;
  o.timeout_ms = GPUIPC_TIMEOUT_DEFAULT;
  o.stream = NULL;
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_segment_open(dom, "o1", &o, &b));
  ASSERT_EQ_U(gpuipc_buf_size(b), 4096);
  ASSERT_OK(gpuipc_segment_unlink(dom, "o1"));
  ASSERT_OK(gpuipc_buf_release(b));
}

int main(void)
{
  ASSERT_OK(gpuipc_domain_join("lend", NULL, &dom));
  lend_then_share_writes();
  scratch_at_once();
  misuse();
  older_struct();
  ASSERT_OK(gpuipc_domain_leave(dom));
  printf("lent buffers: shared in place, outlive the lender, misuse "
         "refused\n");
  return 0;
}
