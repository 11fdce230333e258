/*
 * gpuipc_share_copy with a member killed (SIGKILL): before it claims,
 * after it claims and before its copy, half way through a copy, after it
 * marked chunks done, while the others copy from it, and as the others
 * start. The survivors get every byte right and return
 * 0 (a dead member's claims are taken over at once: even with no timeout
 * at all, its process is seen gone); only the killed one
 * fails; the broker lists none of the round's segments once all are gone.
 * A round whose members were all killed is closed and unlinked by the
 * next round's creator; a live one is not.
 */
#include "test.h"
#include "helpers/share_peer.h"

#define NSURV 2

static void survivors(struct sreader *s, const char *round, int timeout_ms)
{
  for (int i = 0; i < NSURV; i++) {
    sreader_start(&s[i], "share", "v1", 1, round, "", 1, "own", timeout_ms);
    sreader_expect(&s[i], "ready");
  }
}

/* Let the survivors (which have joined) leave once both have all, and
 * check what each got and that it exited 0. */
static void survivors_done(struct sreader *s)
{
  struct sresult r[NSURV];
  sreaders_out(s, NSURV, r);
  sreaders_end_ok(s, NSURV);
}

/*
 * Run the survivors, both in one round (neither leaves before the other
 * joined); how many claims they took over, between them.
 */
static unsigned long long survivors_check(struct sreader *s)
{
  unsigned long long reclaimed = 0;
  sreaders_go(s, NSURV);
  struct sresult r[NSURV];
  sreaders_out(s, NSURV, r);
  for (int i = 0; i < NSURV; i++) {
    ASSERT_EQ(r[i].joined, 1);
    reclaimed += r[i].reclaimed;
  }
  sreaders_end_ok(s, NSURV);
  return reclaimed;
}

/*
 * The killed member dies at @hook before the survivors start: they join
 * its round and take over the @claims claims it made (done or not). With
 * a survivors' @timeout_ms of GPUIPC_TIMEOUT_FOREVER only seeing that its
 * process is gone lets them go on.
 */
static void killed_before(gpuipc_domain_t *dom, const char *hook,
                          const char *round, unsigned long long claims,
                          int timeout_ms)
{
  test_stamp("%s: the member is killed at %s", round, hook);
  struct sreader k, s[NSURV];
  sreader_start(&k, "share", "v1", 1, round, hook, 0, "own",
                SHARE_TIMEOUT_MS);
  sreader_expect(&k, "ready");
  survivors(s, round, timeout_ms);
  sreader_send(&k, "go\n");
  ASSERT_EQ(sreader_end(&k), 128 + SIGKILL);
  ASSERT_EQ_U(survivors_check(s), claims);
  share_wait_none(dom, round);
}

/* The others copy from a member that has every chunk; it is killed. */
static void killed_serving(gpuipc_domain_t *dom)
{
  test_stamp("k5: killed while the others copy from it");
  struct sreader k, s[NSURV];
  sreader_start(&k, "share", "v1", 1, "k5", "", 1, "own", SHARE_TIMEOUT_MS);
  sreader_expect(&k, "ready");
  sreader_send(&k, "go\n");
  sreader_expect(&k, "joined");
  sreader_expect(&k, "leave");
  survivors(s, "k5", SHARE_TIMEOUT_MS);
  for (int i = 0; i < NSURV; i++)
    sreader_send(&s[i], "go\n");
  for (int i = 0; i < NSURV; i++)
    sreader_expect(&s[i], "joined");
  kill(k.pid, SIGKILL);
  ASSERT_EQ(sreader_end(&k), 128 + SIGKILL);
  survivors_done(s);
  share_wait_none(dom, "k5");
}

/*
 * One is killed as the others start: it has claimed (and likely copied
 * and is serving) when the survivors go, and dies under them. It never
 * leaves the round on its own (a gate it is never let out of): left to
 * itself, it could copy every chunk and close the round before the
 * survivors open its table, and a survivor that opened it then would
 * find the round over and copy alone.
 */
static void killed_among(gpuipc_domain_t *dom)
{
  test_stamp("k6: killed as the others start");
  struct sreader k, s[NSURV];
  sreader_start(&k, "share", "v1", 1, "k6", "claimed:1:tell", 1, "own",
                SHARE_TIMEOUT_MS);
  sreader_expect(&k, "ready");
  survivors(s, "k6", SHARE_TIMEOUT_MS);
  sreader_send(&k, "go\n");
  sreader_expect(&k, "joined");
  sreader_expect(&k, "at");
  for (int i = 0; i < NSURV; i++)
    sreader_send(&s[i], "go\n");
  kill(k.pid, SIGKILL);
  for (int i = 0; i < NSURV; i++)
    sreader_expect(&s[i], "joined");
  survivors_done(s);
  ASSERT_EQ(sreader_end(&k), 128 + SIGKILL);
  share_wait_none(dom, "k6");
}

/*
 * Every member of a round killed: its table and their standing lends stay
 * named (the broker keeps their memory) until the next member that
 * creates a round's table closes and unlinks them; a round a member still
 * lives in, and the lends of a member alive, are left alone.
 */
static void all_killed(gpuipc_domain_t *dom)
{
  test_stamp("k8: every member killed; the next round's creator sweeps");
  struct sreader k[2], live, next;
  int unheld;
  int lent = share_kill_two_at_claim(dom, "k8", k, &unheld);
  int left = share_segments_in(dom, "k8", true);
  ASSERT_EQ(left, 1); /* the table */
  /* Their standing lends: every destination buffer of each, held by
   * nobody once the broker saw them die. */
  ASSERT_EQ(lent, 2 * SHARE_NDST);
  ASSERT_EQ(unheld, 2 * SHARE_NDST);
  sreader_start(&live, "share", "v1", 1, "k9", "", 1, "own", SHARE_TIMEOUT_MS);
  sreader_expect(&live, "ready");
  sreader_send(&live, "go\n");
  sreader_expect(&live, "joined");
  sreader_expect(&live, "leave"); /* in its round, holding it, until "out" */
  sreader_start(&next, "share", "v1", 1, "k10", "", 0, "own",
                SHARE_TIMEOUT_MS);
  sreader_expect(&next, "ready");
  sreader_send(&next, "go\n");
  struct sresult r;
  sreader_result(&next, &r);
  sresult_check_ok(&r, 0);
  int u = 0, after = share_standing_of(dom, k[0].pid, &u) +
                    share_standing_of(dom, k[1].pid, &u);
  int live_lent = share_standing_of(dom, live.pid, &u);
  printf("k8 had %d named segments and %d standing lends; after the next "
         "round: %d and %d; k9 (live): %d, %d standing lends\n", left, lent,
         share_segments_in(dom, "k8", true), after,
         share_segments_in(dom, "k9", true), live_lent);
  ASSERT_EQ(share_segments_in(dom, "k8", true), 0);
  ASSERT_EQ(after, 0);
  ASSERT_GT(share_segments_in(dom, "k9", true), 0);
  ASSERT_EQ(live_lent, SHARE_NDST); /* held: its lender lives */
  sreader_send(&live, "out\n");
  sreader_result(&live, &r);
  sresult_check_ok(&r, 0);
  ASSERT_EQ(sreader_end(&live), 0);
  ASSERT_EQ(sreader_end(&next), 0);
  share_wait_none(dom, "k8");
  share_wait_none(dom, "k9");
  share_wait_none(dom, "k10");
}

int main(void)
{
  gpuipc_buf_t *v[SHARE_NSRC];
  gpuipc_domain_t *dom = share_begin(v);
  killed_before(dom, "joined:1:kill", "k1", 0, SHARE_TIMEOUT_MS);
  killed_before(dom, "claimed:2:kill", "k2", 2, SHARE_TIMEOUT_MS);
  killed_before(dom, "midcopy:2:kill", "k3", 2, SHARE_TIMEOUT_MS);
  killed_before(dom, "done:3:kill", "k4", 3, SHARE_TIMEOUT_MS);
  killed_before(dom, "midcopy:3:kill", "k7", 3, GPUIPC_TIMEOUT_FOREVER);
  killed_serving(dom);
  killed_among(dom);
  all_killed(dom);
  share_end(dom, v);
  return 0;
}
