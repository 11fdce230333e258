/*
 * gpuipc_share_copy with opts.next_round: the next round's table opened
 * ahead, after a call, by a thread of the library (src/share/ahead.c).
 *
 *  - Three readers name a2 as they copy a1: a1's table goes, a2's is
 *    opened ahead (held by the three); their a2 calls take it (every byte
 *    right, one chain) and name a3.
 *  - A round other than the one named: the table opened ahead stays
 *    unused, the call opens its own; readers that leave let go of what
 *    was opened ahead, and the next creator's sweep unlinks those tables
 *    (no member ever joined them). That creator names a next round: the
 *    sweep, and the unlinking of its own round's table (it is the last
 *    out), are done on the thread that opens the next round's.
 *  - In this process: a table opened ahead for another layout is not
 *    taken (the call copies alone from the publisher: the name's table is
 *    of another size); a bad next_round is refused before anything; a
 *    domain left right after a call waits for the thread still opening
 *    the next round's table (ASan sees a thread left to use it).
 */
#include "test.h"
#include "helpers/share_peer.h"
#include "share/share.h"

#define N 3

static int ahead_of(struct sreader *r)
{
  int lends, opens, ahead;
  sreader_kept(r, &lends, &opens, &ahead);
  return ahead;
}

/* Every member joined, its table opened ahead or not as @ahead says;
 * exactly one copied every chunk from the publisher, every other from a
 * peer. */
static void one_chain(const struct sresult *r, int n, int ahead)
{
  int heads = 0;
  for (int i = 0; i < n; i++) {
    ASSERT_EQ(r[i].ahead, ahead);
    ASSERT_EQ(r[i].joined, 1);
    heads += r[i].pub == share_nchunks();
  }
  if (heads != 1)
    for (int i = 0; i < n; i++)
      if (r[i].passed != 0)
        return; /* a member passed over: two heads may share the claims */
  ASSERT_EQ(heads, 1);
}

static void readers(gpuipc_domain_t *dom)
{
  struct sreader r[N];
  struct sresult a[N];
  for (int i = 0; i < N; i++) {
    sreader_start(&r[i], "share", "v1", 1, "a1", "", 1, "own",
                  SHARE_TIMEOUT_MS);
    sreader_expect(&r[i], "ready");
  }
  test_stamp("a1, naming a2: nothing was opened ahead yet");
  sreaders_in_order(r, N, "a1", "a2", true, a);
  for (int i = 0; i < N; i++)
    ASSERT_EQ(a[i].ahead, 0);
  share_wait_holders(dom, "a2.share", N); /* each reader's thread opened it */
  share_wait_none(dom, "a1.");            /* and let go of a1's */
  for (int i = 0; i < N; i++)
    ASSERT_EQ(ahead_of(&r[i]), 1);

  test_stamp("a2, naming a3: the table opened ahead is taken");
  sreaders_in_order(r, N, "a2", "a3", false, a);
  one_chain(a, N, 1);
  share_wait_holders(dom, "a3.share", N);
  share_wait_none(dom, "a2.");

  test_stamp("a4 instead of a3 (naming a5): a3's stays unused");
  sreaders_in_order(r, N, "a4", "a5", false, a);
  one_chain(a, N, 0);
  share_wait_holders(dom, "a5.share", N);
  ASSERT_EQ(share_holders(dom, "a3.share"), N);
  for (int i = 0; i < N; i++)
    ASSERT_EQ(ahead_of(&r[i]), 2);

  test_stamp("the readers leave: a3's and a5's tables are held by nobody; "
             "the next creator sweeps them (naming a8: on the thread that "
             "opens a8's, which also unlinks a7's)");
  sreaders_end_ok(r, N);
  share_wait_holders(dom, "a3.share", 0);
  share_wait_holders(dom, "a5.share", 0);
  struct sreader last;
  struct sresult res;
  sreader_start(&last, "share", "v1", 1, "a7", "", 0, "own",
                SHARE_TIMEOUT_MS);
  sreader_expect(&last, "ready");
  sreader_send(&last, "next a8\n");
  sreader_send(&last, "go\n");
  sreader_result(&last, &res);
  sresult_check_ok(&res, 0);
  share_wait_none(dom, "a3.");
  share_wait_none(dom, "a5.");
  share_wait_none(dom, "a7.");
  share_wait_holders(dom, "a8.share", 1);
  ASSERT_EQ(sreader_end(&last), 0);
}

/* In this process, alone. */
static void layouts(gpuipc_domain_t *dom, gpuipc_buf_t *const *v)
{
  test_stamp("a table opened ahead for another layout is not taken");
  gpuipc_buf_t *d;
  ASSERT_OK(gpuipc_buf_alloc(1 << 20, GPUIPC_KIND_HOST, -1, 0, &d));
  gpuipc_share_extent_t e = {v[0], 0, d, 0, 1 << 20};
  gpuipc_share_opts_t o = GPUIPC_SHARE_OPTS_INIT;
  o.next_round = "b2";
  ASSERT_OK(gpuipc_share_copy(dom, "b1", &e, 1, NULL, &o));
  share_wait_holders(dom, "b2.share", 1);
  ASSERT_EQ(gpuipc__share_ahead_count(dom), 1);
  o.chunk_bytes = 4096; /* another layout: another table size */
  o.next_round = NULL;
  memset(gpuipc_buf_ptr(d), 0, 1 << 20);
  ASSERT_OK(gpuipc_share_copy(dom, "b2", &e, 1, NULL, &o));
  struct gpuipc__share_stats st;
  gpuipc__share_test_stats(&st);
  ASSERT_EQ(st.ahead, 0);
  ASSERT_EQ(st.joined, 0);
  ASSERT_EQ(gpuipc__share_ahead_count(dom), 0); /* let go */
  const uint8_t *got = gpuipc_buf_ptr(d);
  for (size_t i = 0; i < (1u << 20); i++)
    if (got[i] != share_byte(1, 0, i))
      TFAIL("byte %zu: %u, not %u", i, got[i], share_byte(1, 0, i));

  o.next_round = "no/slash";
  ASSERT_RC(gpuipc_share_copy(dom, "b3", &e, 1, NULL, &o), -EINVAL);
  ASSERT_ERR_MENTIONS("next_round");
  o.next_round = "n123456789012345678901234567890123456789012345678";
  ASSERT_RC(gpuipc_share_copy(dom, "b3", &e, 1, NULL, &o), -EINVAL);
  ASSERT_ERR_MENTIONS("longer than");
  ASSERT_EQ(share_holders(dom, "b3.share"), -1);

  test_stamp("leaving at once: the thread still at work is waited for");
  for (int i = 0; i < 20; i++) {
    gpuipc_domain_t *d2;
    ASSERT_OK(gpuipc_domain_join("share", NULL, &d2));
    gpuipc_buf_t *v2;
    char name[GPUIPC_NAME_MAX + 1], next[32];
    share_src_name(name, sizeof(name), "v1", 0);
    ASSERT_OK(gpuipc_segment_open(d2, name, NULL, &v2));
    e.src = v2;
    o = (gpuipc_share_opts_t)GPUIPC_SHARE_OPTS_INIT;
    snprintf(next, sizeof(next), "c%d", i);
    o.next_round = next;
    ASSERT_OK(gpuipc_share_copy(d2, "c", &e, 1, NULL, &o));
    ASSERT_EQ(gpuipc__share_ahead_count(d2), 1);
    gpuipc_buf_release(v2);
    ASSERT_OK(gpuipc_domain_leave(d2));
  }
  gpuipc_buf_release(d);
}

int main(void)
{
  gpuipc_buf_t *v[SHARE_NSRC];
  gpuipc_domain_t *dom = share_begin(v);
  readers(dom);
  layouts(dom, v);
  share_end(dom, v);
  return 0;
}
