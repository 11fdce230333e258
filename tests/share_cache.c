/*
 * What a member of gpuipc_share_copy keeps across calls (docs/shared-copy.md,
 * "Across calls"): its standing lends, and the peers' lent segments it
 * opened.
 *
 *  - Three readers copy twice, joining in the same order: the second call
 *    lends nothing and opens nothing anew, and every byte is right.
 *  - A reader that released a destination and took a new one lends the new
 *    one; the old one's standing lend is gone after that call.
 *  - A lender killed: its peer lets go of its segments at its next call,
 *    and that call's table creator unlinks its standing names (nobody
 *    holds them).
 *  - Readers that leave the domain unlink their standing lends: none is
 *    left.
 *  - In this process: a destination its caller released goes at once,
 *    without another call (a thread of the library lets go of its lend:
 *    a rollout worker that frees its model between syncs gets the memory
 *    back), and one still held stays; one lent in two domains goes from
 *    both; a lend unused for GPUIPC__SHARE_KEEP_CALLS calls goes.
 */
#include "test.h"
#include "helpers/share_peer.h"
#include "share/share.h"

#define N 3

static void in_order(struct sreader *r, int n, const char *round, bool first,
                     struct sresult *res)
{
  sreaders_in_order(r, n, round, NULL, first, res);
}

static void kept(struct sreader *r, int *lends, int *opens)
{
  int ahead;
  sreader_kept(r, lends, opens, &ahead);
}

/* Whether @r copied from exactly the slot of @parent, passing none over. */
static bool from_parent(const struct sresult *r, const struct sresult *parent)
{
  return r->passed == 0 && r->sources == 1ull << parent->slot;
}

static void readers(gpuipc_domain_t *dom)
{
  struct sreader r[N];
  struct sresult a[N], b[N], c[N];
  for (int i = 0; i < N; i++) {
    sreader_start(&r[i], "share", "v1", 1, "c1", "", 1, "own",
                  SHARE_TIMEOUT_MS);
    sreader_expect(&r[i], "ready");
  }
  test_stamp("c1: three readers, each lends its %d buffers", SHARE_NDST);
  in_order(r, N, "c1", true, a);
  for (int i = 0; i < N; i++) {
    ASSERT_EQ(a[i].lent, SHARE_NDST);
    printf("c1 reader %d: slot %d, opened %d, passed %llu\n", i, a[i].slot,
           a[i].opened, a[i].passed);
  }
  ASSERT_EQ(a[0].opened, 0); /* the head reads the publisher's */
  for (int i = 1; i < N; i++)
    if (from_parent(&a[i], &a[i - 1]))
      ASSERT_GT(a[i].opened, 0);

  test_stamp("c2: the same order again: nothing lent or opened anew");
  in_order(r, N, "c2", false, b);
  for (int i = 0; i < N; i++) {
    printf("c2 reader %d: slot %d, lent %d, opened %d\n", i, b[i].slot,
           b[i].lent, b[i].opened);
    ASSERT_EQ(b[i].lent, 0);
    ASSERT_EQ_U(b[i].pub + b[i].peer, share_nchunks());
  }
  for (int i = 1; i < N; i++) /* the same parent as before: kept */
    if (from_parent(&a[i], &a[i - 1]) && from_parent(&b[i], &b[i - 1]) &&
        a[i - 1].slot == b[i - 1].slot)
      ASSERT_EQ(b[i].opened, 0);
  int lends, opens, u;
  kept(&r[1], &lends, &opens);
  ASSERT_EQ(lends, SHARE_NDST);
  ASSERT_GT(opens, 0);
  ASSERT_EQ(share_standing_of(dom, r[2].pid, &u), SHARE_NDST);

  test_stamp("c3: a reader with a new destination 0 lends it; the old "
             "lend goes");
  sreader_send(&r[2], "renew 0\n");
  sreader_expect(&r[2], "renewed");
  in_order(r, N, "c3", false, c);
  ASSERT_EQ(c[0].lent, 0);
  ASSERT_EQ(c[1].lent, 0);
  ASSERT_EQ(c[2].lent, 1);
  kept(&r[2], &lends, &opens);
  ASSERT_EQ(lends, SHARE_NDST);
  ASSERT_EQ(share_standing_of(dom, r[2].pid, &u), SHARE_NDST);

  test_stamp("c4: the head killed; its peer lets go of its segments, the "
             "sweep unlinks its names");
  kept(&r[1], &lends, &opens);
  ASSERT_GT(opens, 0); /* r[0]'s, kept since c1 */
  pid_t dead = r[0].pid;
  ASSERT_EQ(share_standing_of(dom, dead, &u), SHARE_NDST);
  gpuipc_domain_info_t info = {.size = sizeof(info)};
  ASSERT_OK(gpuipc_domain_info(dom, &info));
  int members = info.members;
  kill(dead, SIGKILL);
  ASSERT_EQ(sreader_end(&r[0]), 128 + SIGKILL);
  /* Until the broker saw it go (and dropped its holds): its names are
   * held by its peers alone now. */
  for (int i = 0; i < 60000 && info.members != members - 1; i++) {
    usleep(1000);
    ASSERT_OK(gpuipc_domain_info(dom, &info));
  }
  ASSERT_EQ(info.members, members - 1);
  ASSERT_EQ(share_standing_of(dom, dead, &u), SHARE_NDST);
  ASSERT_LT(u, SHARE_NDST); /* r[1] holds what it opened */
  in_order(&r[1], N - 1, "c4", false, c);
  ASSERT_EQ(c[0].lent + c[1].lent, 0);
  kept(&r[1], &lends, &opens);
  printf("c4: r1 keeps %d lends, %d opens; the dead reader's names: %d\n",
         lends, opens, share_standing_of(dom, dead, &u));
  ASSERT_EQ(opens, 0);
  ASSERT_EQ(share_standing_of(dom, dead, &u), 0);

  test_stamp("the readers leave: their standing lends go with them");
  sreaders_end_ok(&r[1], N - 1);
  share_wait_none(dom, GPUIPC__SHARE_STANDING);
}

/* Wait (a minute at most) until this process keeps @want lends for @dom
 * and as many of its standing names are listed; how many it keeps then. */
static int wait_lends(gpuipc_domain_t *dom, int want)
{
  int lends, opens, u;
  for (int i = 0; i < 60000; i++) {
    gpuipc__share_cache_count(dom, &lends, &opens);
    if (lends == want && share_standing_of(dom, getpid(), &u) == want)
      break;
    usleep(1000);
  }
  return lends;
}

/* In this process, alone: a released destination's lend goes at once. */
static void released(gpuipc_domain_t *dom, gpuipc_buf_t *const *v)
{
  test_stamp("two destinations lent; the caller releases one: its lend "
             "goes without another call, the other's stays");
  gpuipc_buf_t *d[2];
  for (int i = 0; i < 2; i++)
    ASSERT_OK(gpuipc_buf_alloc(1 << 20, GPUIPC_KIND_HOST, -1, 0, &d[i]));
  gpuipc_share_extent_t e[2] = {{v[0], 0, d[0], 0, 1 << 20},
                                {v[0], 0, d[1], 0, 1 << 20}};
  ASSERT_OK(gpuipc_share_copy(dom, "g0", e, 2, NULL, NULL));
  int u, lends, opens;
  gpuipc__share_cache_count(dom, &lends, &opens);
  ASSERT_EQ(lends, 2);
  ASSERT_EQ(share_standing_of(dom, getpid(), &u), 2);
  gpuipc_buf_release(d[0]);
  ASSERT_EQ(wait_lends(dom, 1), 1);
  ASSERT_EQ(share_standing_of(dom, getpid(), &u), 1);
  usleep(20000); /* the other is held: it stays */
  ASSERT_EQ(wait_lends(dom, 1), 1);
  gpuipc_buf_release(d[1]);
  ASSERT_EQ(wait_lends(dom, 0), 0);
  ASSERT_EQ(share_standing_of(dom, getpid(), &u), 0);

  test_stamp("one destination lent in two domains: released, it goes "
             "from both");
  gpuipc_domain_t *dom2;
  gpuipc_buf_t *v2[SHARE_NSRC];
  ASSERT_OK(gpuipc_domain_join("share-two", NULL, &dom2));
  share_publish(dom2, "v1", 1, v2);
  ASSERT_OK(gpuipc_buf_alloc(1 << 20, GPUIPC_KIND_HOST, -1, 0, &d[0]));
  e[0].dst = d[0];
  ASSERT_OK(gpuipc_share_copy(dom, "g1", e, 1, NULL, NULL));
  e[0].src = v2[0];
  ASSERT_OK(gpuipc_share_copy(dom2, "g1", e, 1, NULL, NULL));
  gpuipc__share_cache_count(dom2, &lends, &opens);
  ASSERT_EQ(lends, 1);
  ASSERT_EQ(wait_lends(dom, 1), 1);
  gpuipc_buf_release(d[0]);
  ASSERT_EQ(wait_lends(dom, 0), 0);
  ASSERT_EQ(wait_lends(dom2, 0), 0);
  share_end(dom2, v2);
}

/* In this process, alone: a lend unused for KEEP_CALLS calls goes. */
static void unused(gpuipc_domain_t *dom, gpuipc_buf_t *const *v)
{
  test_stamp("a lend unused for %d calls goes", GPUIPC__SHARE_KEEP_CALLS);
  gpuipc_buf_t *d[2];
  for (int i = 0; i < 2; i++)
    ASSERT_OK(gpuipc_buf_alloc(1 << 20, GPUIPC_KIND_HOST, -1, 0, &d[i]));
  gpuipc_share_extent_t e = {v[0], 0, d[0], 0, 1 << 20};
  char round[32];
  ASSERT_OK(gpuipc_share_copy(dom, "u0", &e, 1, NULL, NULL));
  int u, lends, opens;
  ASSERT_EQ(share_standing_of(dom, getpid(), &u), 1);
  e.dst = d[1];
  for (int i = 1; i <= GPUIPC__SHARE_KEEP_CALLS; i++) {
    gpuipc__share_cache_count(dom, &lends, &opens);
    ASSERT_EQ(lends, (i == 1 ? 1 : 2)); /* d[0]'s is kept meanwhile */
    snprintf(round, sizeof(round), "u%d", i);
    ASSERT_OK(gpuipc_share_copy(dom, round, &e, 1, NULL, NULL));
  }
  gpuipc__share_cache_count(dom, &lends, &opens);
  ASSERT_EQ(lends, 1);
  ASSERT_EQ(share_standing_of(dom, getpid(), &u), 1);
  for (int i = 0; i < 2; i++)
    gpuipc_buf_release(d[i]);
}

int main(void)
{
  gpuipc_buf_t *v[SHARE_NSRC];
  gpuipc_domain_t *dom = share_begin(v);
  readers(dom);
  released(dom, v);
  unused(dom, v);
  share_end(dom, v);
  return 0;
}
