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
 *    past it;
 *  - the lent segment is a handle of its own: releasing it ends this
 *    process's hold of the segment at once (the broker's count, and once
 *    unlinked its entry and descriptor, go) while the caller's buffer
 *    stays; lending one buffer again and again leaves nothing behind;
 *  - others keep the memory the lender's handle let go of; memory its
 *    creator keeps (LEGACY, POOL: here HOST through the test hook) stays
 *    kept by the lent handle until the broker lets it go.
 * HOST kind: runs anywhere.
 */
#include "test.h"
#include "helpers/seg_peer.h"
#include "segment/segment.h"
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

/* Until this process's registry holds @want buffers (a LET_GO the broker
 * sends is handled by the domain's reader thread, in its own time). */
static void wait_live(uint64_t want)
{
  for (int i = 0; i < 5000 && live_buffers() != want; i++)
    usleep(2000);
  ASSERT_EQ_U(live_buffers(), want);
}

static gpuipc_domain_info_t domain_info(void)
{
  gpuipc_domain_info_t i = {.size = sizeof(i)};
  ASSERT_OK(gpuipc_domain_info(dom, &i));
  return i;
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
  /* A handle of its own on the very bytes. */
  ASSERT_PTR_NE(seg, b);
  ASSERT_PTR_EQ(gpuipc_buf_ptr(seg), gpuipc_buf_ptr(b));
  ASSERT_EQ_U(gpuipc_buf_size(seg), LEND_BYTES);
  ASSERT_EQ(gpuipc_buf_kind(seg), GPUIPC_KIND_HOST);
  ASSERT_EQ(state_of("l1"), GPUIPC_SEG_FILLING);
  /* Filling as any creation is: the reader's wait ends at the publish. */
  peer_send(&reader, "wcheck l1 1");
  struct pollfd pf = {.fd = reader.out, .events = POLLIN};
  ASSERT_EQ(poll(&pf, 1, 100), 0);
  /* The segment is the handle, not the buffer lent. */
  ASSERT_RC(gpuipc_segment_publish(b, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("no segment");
  ASSERT_EQ(state_of("l1"), GPUIPC_SEG_FILLING);
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
  ASSERT_PTR_EQ(gpuipc_buf_ptr(seg2), gpuipc_buf_ptr(b));
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

/* Lend one step of the loops below: @nth even releases before unlinking. */
static void lend_once(gpuipc_buf_t *b, int nth)
{
  gpuipc_segment_opts_t o = lend_opts(b, GPUIPC_CREATE);
  gpuipc_buf_t *seg;
  ASSERT_OK(gpuipc_segment_open(dom, "loop", &o, &seg));
  ASSERT_OK(gpuipc_segment_publish(seg, NULL));
  if (nth % 2 == 0) {
    ASSERT_OK(gpuipc_buf_release(seg));
    ASSERT_OK(gpuipc_segment_unlink(dom, "loop"));
  } else {
    ASSERT_OK(gpuipc_segment_unlink(dom, "loop"));
    ASSERT_OK(gpuipc_buf_release(seg));
  }
}

/*
 * A server lends the same buffer under a name, lets go of the segment and
 * unlinks it, again and again (@kept: as memory its creator keeps). The
 * broker -- in this process, the domain's first member -- ends with the
 * entries and descriptors it had, and so does this process; the buffer
 * is the caller's as before.
 */
static void lend_loop_leaves_nothing(bool kept)
{
  enum { LOOPS = 200 };
  gpuipc_buf_t *b = host_buf(7);
  uint64_t live = live_buffers();
  gpuipc__seg_test_creator_held(kept);
  gpuipc_domain_info_t before = domain_info();
  ASSERT_EQ(before.hosts_broker, 1);
  int fds = test_count_fds(0);
  for (int i = 0; i < LOOPS; i++)
    lend_once(b, i);
  /* RELEASE is one-way: this round trip comes back once it was read. */
  gpuipc_domain_info_t after = domain_info();
  gpuipc__seg_test_creator_held(false);
  ASSERT_EQ(after.segments, before.segments);
  ASSERT_EQ(after.broker_fds, before.broker_fds);
  ASSERT_EQ(test_count_fds(0), fds);
  gpuipc_segment_info_t s = {.size = sizeof(s)};
  ASSERT_RC(gpuipc_segment_stat(dom, "loop", &s), -ENOENT);
  /* The caller's buffer: its bytes, and one more lend of it. */
  ASSERT_EQ_U(test_check(gpuipc_buf_ptr(b), LEND_BYTES, 7), (size_t)-1);
  lend_once(b, 0);
  ASSERT_OK(gpuipc_buf_release(b));
  wait_live(live - 1);
}

/*
 * The same loop with memory of each GPU kind this machine has (none:
 * nothing to do). LEGACY and POOL memory is kept by the lent handle until
 * the broker's LET_GO; the caller's buffer outlives it all the same.
 */
static void lend_loop_gpu_kinds(void)
{
  static const gpuipc_kind_t kinds[] = {GPUIPC_KIND_VMM, GPUIPC_KIND_LEGACY,
                                        GPUIPC_KIND_POOL};
  int ran = 0;
  for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
    if (gpuipc_device_count() < 1 || gpuipc_kind_available(kinds[k]) != 0)
      continue;
    uint64_t live = live_buffers();
    gpuipc_buf_t *b;
    ASSERT_OK(gpuipc_buf_alloc(LEND_BYTES, kinds[k], 0, 0, &b));
    lend_once(b, 0); /* what the driver opens once (events) is open now */
    gpuipc_domain_info_t before = domain_info();
    int fds = test_count_fds(0);
    for (int i = 0; i < 200; i++)
      lend_once(b, i);
    gpuipc_domain_info_t after = domain_info();
    ASSERT_EQ(after.segments, before.segments);
    ASSERT_EQ(after.broker_fds, before.broker_fds);
    ASSERT_EQ(test_count_fds(0), fds);
    ASSERT_OK(gpuipc_buf_alive(b));
    ASSERT_OK(gpuipc_buf_release(b));
    wait_live(live);
    ran++;
  }
  printf("lend loop on %d GPU kinds\n", ran);
}

/*
 * This process opens a name it lent by name, as any opener does: it gets
 * a handle of its own on the lent bytes too, and its release lets go of
 * what the open took.
 */
static void own_open_is_a_handle(void)
{
  gpuipc_buf_t *b = host_buf(15), *seg, *again;
  gpuipc_domain_info_t before = domain_info();
  gpuipc_segment_opts_t o = lend_opts(b, GPUIPC_CREATE | GPUIPC_SCRATCH);
  ASSERT_OK(gpuipc_segment_open(dom, "l6", &o, &seg));
  ASSERT_OK(gpuipc_segment_open(dom, "l6", NULL, &again));
  ASSERT_PTR_NE(again, b);
  ASSERT_PTR_EQ(gpuipc_buf_ptr(again), gpuipc_buf_ptr(b));
  gpuipc_segment_info_t s = {.size = sizeof(s)};
  ASSERT_OK(gpuipc_segment_stat(dom, "l6", &s));
  ASSERT_EQ(s.holder_refs[0], 2);
  ASSERT_OK(gpuipc_buf_release(again));
  ASSERT_OK(gpuipc_buf_release(seg));
  ASSERT_OK(gpuipc_segment_unlink(dom, "l6"));
  gpuipc_domain_info_t after = domain_info();
  ASSERT_EQ(after.segments, before.segments);
  ASSERT_EQ(after.broker_fds, before.broker_fds);
  ASSERT_EQ_U(test_check(gpuipc_buf_ptr(b), LEND_BYTES, 15), (size_t)-1);
  ASSERT_OK(gpuipc_buf_release(b));
}

/*
 * The lender lets go of its segment handle before the name is unlinked:
 * the reader's mapping stays, and it is the lender's memory still (what
 * the lender writes through its own buffer, the reader reads); a later
 * opener gets the same bytes; the broker counts the two readers only.
 */
static void outlives_lender_handle(void)
{
  struct peer r1, r2;
  peer_start(&r1);
  peer_start(&r2);
  PEER_OK(&r1, "join lend");
  PEER_OK(&r2, "join lend");
  gpuipc_buf_t *b = host_buf(11), *seg;
  gpuipc_segment_opts_t o = lend_opts(b, GPUIPC_CREATE | GPUIPC_SCRATCH);
  ASSERT_OK(gpuipc_segment_open(dom, "l5", &o, &seg));
  PEER_OK(&r1, "fopen l5 0 -");
  PEER_OK(&r1, "check l5 11");
  gpuipc_segment_info_t s = {.size = sizeof(s)};
  ASSERT_OK(gpuipc_segment_stat(dom, "l5", &s));
  ASSERT_EQ(s.nholders, 2);

  ASSERT_OK(gpuipc_buf_release(seg));
  ASSERT_OK(gpuipc_segment_stat(dom, "l5", &s));
  ASSERT_EQ(s.state, GPUIPC_SEG_PUBLISHED);
  ASSERT_EQ(s.nholders, 1);
  ASSERT_EQ(s.holder_pids[0], r1.pid);
  PEER_OK(&r1, "check l5 11");
  test_fill(gpuipc_buf_ptr(b), LEND_BYTES, 12);
  PEER_OK(&r1, "check l5 12");
  PEER_OK(&r2, "fopen l5 0 -");
  PEER_OK(&r2, "check l5 12");
  PEER_OK(&r2, "fill l5 13");
  ASSERT_EQ_U(test_check(gpuipc_buf_ptr(b), LEND_BYTES, 13), (size_t)-1);
  PEER_OK(&r1, "check l5 13");

  /* Unlinked, the holders keep it; the last release frees the entry. */
  gpuipc_domain_info_t before = domain_info();
  ASSERT_OK(gpuipc_segment_unlink(dom, "l5"));
  PEER_OK(&r1, "check l5 13");
  PEER_OK(&r1, "release l5");
  PEER_OK(&r2, "check l5 13");
  PEER_OK(&r2, "release l5");
  gpuipc_domain_info_t after = domain_info();
  ASSERT_EQ(after.segments, before.segments - 1);
  ASSERT_EQ(after.broker_fds, before.broker_fds - 1);
  ASSERT_EQ_U(test_check(gpuipc_buf_ptr(b), LEND_BYTES, 13), (size_t)-1);
  ASSERT_OK(gpuipc_buf_release(b));
  peer_finish(&r1);
  peer_finish(&r2);
}

/*
 * Memory its creator keeps (LEGACY, POOL; HOST here through the test
 * hook): the lent handle keeps it, past the lender's release of both its
 * handle and its buffer, while the segment is published or held; the
 * broker's LET_GO frees it.
 */
static void kept_by_lent_handle(void)
{
  struct peer r;
  peer_start(&r);
  PEER_OK(&r, "join lend");
  uint64_t live = live_buffers();
  gpuipc_buf_t *b = host_buf(21), *seg;
  gpuipc__seg_test_creator_held(true);
  gpuipc_segment_opts_t o = lend_opts(b, GPUIPC_CREATE | GPUIPC_SCRATCH);
  ASSERT_OK(gpuipc_segment_open(dom, "k1", &o, &seg));
  gpuipc__seg_test_creator_held(false);
  ASSERT_OK(gpuipc_buf_release(seg));
  ASSERT_OK(gpuipc_buf_release(b));
  ASSERT_EQ_U(live_buffers(), live + 1); /* kept */
  gpuipc_segment_info_t s = {.size = sizeof(s)};
  ASSERT_OK(gpuipc_segment_stat(dom, "k1", &s));
  ASSERT_EQ(s.state, GPUIPC_SEG_PUBLISHED);
  ASSERT_EQ(s.nholders, 0);
  ASSERT_EQ(s.keeper_pid, (int)getpid());
  PEER_OK(&r, "fopen k1 0 -");
  PEER_OK(&r, "check k1 21");
  ASSERT_OK(gpuipc_segment_unlink(dom, "k1"));
  PEER_OK(&r, "check k1 21");
  ASSERT_EQ_U(live_buffers(), live + 1);
  PEER_OK(&r, "release k1");
  wait_live(live);
  peer_finish(&r);
}

int main(void)
{
  ASSERT_OK(gpuipc_domain_join("lend", NULL, &dom));
  lend_then_share_writes();
  scratch_at_once();
  misuse();
  older_struct();
  lend_loop_leaves_nothing(false);
  lend_loop_leaves_nothing(true);
  lend_loop_gpu_kinds();
  own_open_is_a_handle();
  outlives_lender_handle();
  kept_by_lent_handle();
  ASSERT_OK(gpuipc_domain_leave(dom));
  printf("lent buffers: shared in place, outlive the lender, misuse "
         "refused\n");
  return 0;
}
