/*
 * A segment is read only once its creator filled and published it:
 *  - a creator fills slowly after CREATE (half, a pause, the rest) and
 *    publishes; a GPUIPC_WAIT reader in another process returns only then
 *    and finds every byte; meanwhile the segment is "filling": a plain open
 *    gets -ENOENT, one that may not wait -ETIMEDOUT;
 *  - a creator killed before publishing frees the name: a waiting creator
 *    allocates it anew, and a waiting reader gets that creator's data;
 *  - a creator that releases its buffer before publishing frees the name;
 *  - GPUIPC_SCRATCH is visible at once;
 *  - an options struct of an older, smaller size is read only as far as
 *    its size says (the fields past it take their defaults);
 *  - gpuipc_segment_publish twice, by a non-creator, of a plain buffer:
 *    -EALREADY / -EINVAL.
 * HOST kind: runs anywhere.
 */
#include "test.h"
#include "helpers/seg_peer.h"

#include <stddef.h>

static gpuipc_domain_t *dom;

static gpuipc_segment_state_t state_of(const char *name)
{
  gpuipc_segment_info_t s = {.size = sizeof(s)};
  ASSERT_OK(gpuipc_segment_stat(dom, name, &s));
  return s.state;
}

/* @p has not answered yet. */
static void still_waits(struct peer *p)
{
  struct pollfd pf = {.fd = p->out, .events = POLLIN};
  ASSERT_EQ(poll(&pf, 1, 0), 0);
}

static void slow_fill_then_read(void)
{
  struct peer creator, reader;
  peer_start(&creator);
  peer_start(&reader);
  PEER_OK(&creator, "join pub");
  PEER_OK(&reader, "join pub");

  PEER_EXPECT(&creator, "ok 1 1048576", "fopen p1 1048576 c");
  ASSERT_EQ(state_of("p1"), GPUIPC_SEG_FILLING);
  ASSERT_STREQ(gpuipc_segment_state_name(GPUIPC_SEG_FILLING), "filling");
  /* Invisible while filling: no wait, a wait of 0 ms, a WAIT that parks. */
  gpuipc_buf_t *b;
  ASSERT_RC(gpuipc_segment_open(dom, "p1", NULL, &b), -ENOENT);
  gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
  o.flags = GPUIPC_WAIT;
  o.timeout_ms = 0;
  ASSERT_RC(gpuipc_segment_open(dom, "p1", &o, &b), -ETIMEDOUT);
  /* The reader checks every byte the moment its open returns. */
  peer_send(&reader, "wcheck p1 7");

  PEER_OK(&creator, "slowfill p1 7 100");
  still_waits(&reader);
  PEER_OK(&creator, "publish p1");
  const char *r = peer_read(&reader, PEER_REPLY_MS);
  if (strcmp(r, "ok 1048576") != 0)
    TFAIL("reader: %s", r);
  ASSERT_EQ(state_of("p1"), GPUIPC_SEG_PUBLISHED);

  /* Twice: -EALREADY; by a process that only opened it: -EINVAL. */
  PEER_EXPECT(&creator, "err EALREADY", "publish p1");
  PEER_EXPECT(&reader, "err EINVAL", "publish p1");
  PEER_OK(&creator, "unlink p1");
  peer_finish(&creator);
  peer_finish(&reader);
}

static void creator_killed(void)
{
  struct peer creator, taker, reader;
  peer_start(&creator);
  peer_start(&taker);
  peer_start(&reader);
  PEER_OK(&creator, "join pub");
  PEER_OK(&taker, "join pub");
  PEER_OK(&reader, "join pub");

  PEER_EXPECT(&creator, "ok 1 65536", "fopen k1 65536 c");
  PEER_OK(&creator, "fill k1 1"); /* filled, never published */
  peer_send(&taker, "fopen k1 65536 c"); /* parks: someone fills it */
  peer_send(&reader, "wcheck k1 2");     /* parks: not published */
  /* Whether their OPENs reach the broker before or after the kill, the
   * taker creates the name and the reader waits for its publication. */
  still_waits(&taker);
  still_waits(&reader);
  peer_kill(&creator);

  /* The taker allocates the name anew; the reader still waits for it. */
  const char *r = peer_read(&taker, PEER_REPLY_MS);
  if (strcmp(r, "ok 1 65536") != 0)
    TFAIL("taker: %s", r);
  ASSERT_EQ(state_of("k1"), GPUIPC_SEG_FILLING);
  still_waits(&reader);
  PEER_OK(&taker, "fill k1 2");
  PEER_OK(&taker, "publish k1");
  r = peer_read(&reader, PEER_REPLY_MS);
  if (strcmp(r, "ok 65536") != 0)
    TFAIL("reader: %s", r);
  PEER_OK(&taker, "unlink k1");
  peer_finish(&taker);
  peer_finish(&reader);
}

static void released_unpublished(void)
{
  gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
  o.bytes = 4096;
  o.kind = GPUIPC_KIND_HOST;
  o.flags = GPUIPC_CREATE;
  gpuipc_buf_t *b, *b2;
  ASSERT_OK(gpuipc_segment_open(dom, "r1", &o, &b));
  ASSERT_EQ(state_of("r1"), GPUIPC_SEG_FILLING);
  ASSERT_OK(gpuipc_buf_release(b));
  /* RELEASE is one-way: a round trip after it means the broker read it. */
  gpuipc_domain_info_t di = {.size = sizeof(di)};
  ASSERT_OK(gpuipc_domain_info(dom, &di));
  gpuipc_segment_info_t s = {.size = sizeof(s)};
  ASSERT_RC(gpuipc_segment_stat(dom, "r1", &s), -ENOENT);
  /* The name is free: EXCL creates it again. */
  o.flags = GPUIPC_CREATE | GPUIPC_EXCL;
  ASSERT_OK(gpuipc_segment_open(dom, "r1", &o, &b2));
  ASSERT_OK(gpuipc_segment_publish(b2, NULL));
  ASSERT_RC(gpuipc_segment_publish(b2, NULL), -EALREADY);
  ASSERT_OK(gpuipc_segment_unlink(dom, "r1"));
  ASSERT_OK(gpuipc_buf_release(b2));
}

static void scratch(void)
{
  struct peer other;
  peer_start(&other);
  PEER_OK(&other, "join pub");
  gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
  o.bytes = 8192;
  o.flags = GPUIPC_SCRATCH; /* without CREATE */
  gpuipc_buf_t *b;
  ASSERT_RC(gpuipc_segment_open(dom, "s1", &o, &b), -EINVAL);
  o.flags = GPUIPC_CREATE | GPUIPC_SCRATCH;
  ASSERT_OK(gpuipc_segment_open(dom, "s1", &o, &b));
  ASSERT_EQ(state_of("s1"), GPUIPC_SEG_PUBLISHED);
  PEER_EXPECT(&other, "ok 0 8192", "fopen s1 0 -"); /* no wait needed */
  ASSERT_RC(gpuipc_segment_publish(b, NULL), -EALREADY);
  ASSERT_OK(gpuipc_segment_unlink(dom, "s1"));
  ASSERT_OK(gpuipc_buf_release(b));
  peer_finish(&other);
}

/*
 * Options of an earlier, smaller struct (@size bytes) for 4096 bytes of
 * @kind: the fields past @size hold junk the library must not read.
 */
static void old_opts(gpuipc_segment_opts_t *o, size_t size,
                     gpuipc_kind_t kind, unsigned flags)
{
  memset(o, 0xa5, sizeof(*o));
  o->size = size;
  o->bytes = 4096;
  o->kind = kind;
  o->device = -1;
  o->flags = flags;
}

static void old_struct_sizes(void)
{
  gpuipc_segment_opts_t o;
  old_opts(&o, offsetof(gpuipc_segment_opts_t, stream), GPUIPC_KIND_HOST,
           GPUIPC_CREATE);
  o.timeout_ms = GPUIPC_TIMEOUT_DEFAULT;
  gpuipc_buf_t *b, *b2, *b3;
  ASSERT_OK(gpuipc_segment_open(dom, "o1", &o, &b));
  memset(gpuipc_buf_ptr(b), 3, 4096);
  ASSERT_OK(gpuipc_segment_publish(b, NULL));
  /* Only size, bytes, kind, device, flags: the timeout is the domain's. */
  old_opts(&o, offsetof(gpuipc_segment_opts_t, timeout_ms), GPUIPC_KIND_AUTO,
           GPUIPC_WAIT);
  ASSERT_OK(gpuipc_segment_open(dom, "o1", &o, &b2));
  ASSERT_TRUE(b2 == b); /* our own: the same buffer */
  /* Only the size: every default, as NULL opts are. */
  memset(&o, 0xa5, sizeof(o));
  o.size = sizeof(o.size);
  ASSERT_OK(gpuipc_segment_open(dom, "o1", &o, &b3));
  ASSERT_EQ(((unsigned char *)gpuipc_buf_ptr(b3))[4095], 3);
  o.size = sizeof(o.size) - 1;
  gpuipc_buf_t *b4;
  ASSERT_RC(gpuipc_segment_open(dom, "o1", &o, &b4), -EINVAL);
  ASSERT_OK(gpuipc_buf_release(b3));
  ASSERT_OK(gpuipc_buf_release(b2));
  /* A peer built against the older struct waits for a publication. */
  struct peer other;
  peer_start(&other);
  PEER_OK(&other, "join pub");
  PEER_EXPECT(&other, "ok 0 4096", "fopen o1 0 w auto -1 old");
  PEER_OK(&other, "release o1");
  peer_finish(&other);
  ASSERT_OK(gpuipc_segment_unlink(dom, "o1"));
  ASSERT_OK(gpuipc_buf_release(b));
}

static void publish_misuse(void)
{
  ASSERT_RC(gpuipc_segment_publish(NULL, NULL), -EINVAL);
  gpuipc_buf_t *plain;
  ASSERT_OK(gpuipc_buf_alloc(4096, GPUIPC_KIND_HOST, -1, 0, &plain));
  ASSERT_RC(gpuipc_segment_publish(plain, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("not published");
  ASSERT_OK(gpuipc_buf_release(plain));
  /* Bad options: a negative timeout that is no constant. */
  gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
  o.timeout_ms = -3;
  gpuipc_buf_t *b;
  ASSERT_RC(gpuipc_segment_open(dom, "m1", &o, &b), -EINVAL);
}

int main(void)
{
  ASSERT_OK(gpuipc_domain_join("pub", NULL, &dom));
  slow_fill_then_read();
  creator_killed();
  released_unpublished();
  scratch();
  old_struct_sizes();
  publish_misuse();
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
