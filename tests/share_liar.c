/*
 * gpuipc_share_copy beside a process that maps the round table and
 * writes garbage into it (tests/helpers/share_liar.c): fake members in
 * free slots, claim and done words that name nobody, free slots, fake
 * servers whose extent maps point outside any mapping, members with the
 * wrong start time or impossible flags, each placed in the chain where
 * honest members pick it as their parent and saying it has every chunk,
 * claims in honest members' names, and at last a spoilt header. The
 * honest members return 0 with every byte right (they pass over each
 * fake parent and copy from an honest one); one that comes after the
 * header was spoilt copies alone. Claims forged in the name of a member that works on are taken
 * over without failing it; a member whose claims are made free again
 * does not count its chunks twice. The round's segments are gone once all left.
 */
#include "test.h"
#include "helpers/share_peer.h"

#include <sys/wait.h>

static void liar_start(struct sreader *r, const char *round,
                       const char *forge)
{
  const char *more[] = {"share", round, forge, NULL};
  sreader_spawn(r, "share_liar", more);
}

/*
 * Claims forged in the name of a member that works on: the member that
 * waits for them takes them over after the timeout, but does not fail
 * their "claimer", which did no wrong. The scene: K claims a chunk and
 * stops; B (no timeout) copies every other chunk and waits for K's; the
 * liar claims B's chunks again in B's name; C (500 ms) takes over B's
 * forged claims and K's real one. K fails; B and C return 0. Made free
 * instead, B's chunks are claimed again (by B too, which has them): B
 * still waits for K's chunk and returns every byte.
 */
static void forged(gpuipc_domain_t *dom, const char *round, bool zero)
{
  struct sreader k, b, c, liar;
  struct sresult s;
  test_stamp("%s: B's claims %s", round, zero ? "made free" : "forged");
  sreader_start(&k, "share", "v1", 1, round, "claimed:1:stop", 0, "own",
                SHARE_TIMEOUT_MS);
  sreader_expect(&k, "ready");
  sreader_send(&k, "go\n");
  sreader_expect(&k, "joined"); /* slot 0 */
  int status;
  ASSERT_EQ(waitpid(k.pid, &status, WUNTRACED), k.pid);
  ASSERT_TRUE(WIFSTOPPED(status));
  char hook[32];
  snprintf(hook, sizeof(hook), "done:%llu:tell",
           (unsigned long long)share_nchunks() - 1);
  sreader_start(&b, "share", "v1", 1, round, hook, 0, "own",
                GPUIPC_TIMEOUT_FOREVER);
  sreader_expect(&b, "ready");
  sreader_send(&b, "go\n");
  sreader_expect(&b, "joined"); /* slot 1 */
  sreader_expect(&b, "at");     /* every chunk but K's */
  liar_start(&liar, round, zero ? "zero:1" : "forge:1");
  sreader_expect(&liar, "forged");
  sreader_start(&c, "share", "v1", 1, round, "", 0, "own", SHARE_TIMEOUT_MS);
  sreader_expect(&c, "ready");
  sreader_send(&c, "go\n");
  sreader_result(&c, &s);
  sresult_check_ok(&s, 2);
  /* Every chunk (B may beat C to K's once C marked K FAILED); made free,
   * B's are claimed anew, not taken over. */
  if (!zero)
    ASSERT_GE(s.reclaimed, share_nchunks() - 1);
  sreader_result(&b, &s);
  if (zero) { /* it copied its chunks made free again a second time */
    if (s.rc != 0 || s.bad != 0)
      TFAIL("B: rc %d, %ld wrong bytes (%s)", s.rc, s.bad, s.msg);
  } else {
    sresult_check_ok(&s, 1);
  }
  ASSERT_EQ(kill(k.pid, SIGCONT), 0);
  sreader_result(&k, &s);
  ASSERT_EQ(s.rc, -ETIMEDOUT);
  ASSERT_EQ(sreader_end(&liar), 0);
  ASSERT_EQ(sreader_end(&k), 0);
  ASSERT_EQ(sreader_end(&b), 0);
  ASSERT_EQ(sreader_end(&c), 0);
  share_wait_none(dom, round);
}

int main(void)
{
  gpuipc_buf_t *v[SHARE_NSRC];
  gpuipc_domain_t *dom = share_begin(v);
  struct sreader r[4], liar;
  for (int i = 0; i < 4; i++) {
    sreader_start(&r[i], "share", "v1", 1, "lr", "", i < 3, "own",
                  SHARE_TIMEOUT_MS);
    sreader_expect(&r[i], "ready");
  }
  /* The first member has every chunk; the liar spoils the table. */
  sreader_send(&r[0], "go\n");
  sreader_expect(&r[0], "joined");
  sreader_expect(&r[0], "leave");
  liar_start(&liar, "lr", NULL);
  sreader_expect(&liar, "lied");
  /* Two more copy while it goes on lying. */
  for (int i = 1; i < 3; i++)
    sreader_send(&r[i], "go\n");
  for (int i = 1; i < 3; i++)
    sreader_expect(&r[i], "joined");
  for (int i = 1; i < 3; i++)
    sreader_expect(&r[i], "leave");
  /* A spoilt header: the next one copies alone. */
  sreader_send(&liar, "header\n");
  sreader_expect(&liar, "header");
  sreader_send(&r[3], "go\n");
  struct sresult s;
  sreader_result(&r[3], &s);
  sresult_check_ok(&s, 3);
  ASSERT_EQ(s.joined, 0);
  ASSERT_EQ_U(s.pub, share_nchunks());
  ASSERT_EQ(sreader_end(&liar), 0);
  for (int i = 0; i < 3; i++) {
    sreader_send(&r[i], "out\n");
    sreader_result(&r[i], &s);
    sresult_check_ok(&s, i);
    ASSERT_EQ(s.joined, 1);
    /* The two that came after the lies passed over every fake parent
     * (placed before them in the chain) and copied from an honest one. */
    if (i > 0)
      ASSERT_EQ_U(s.peer, share_nchunks());
  }
  for (int i = 0; i < 4; i++)
    ASSERT_EQ(sreader_end(&r[i]), 0);
  share_wait_none(dom, "lr");
  forged(dom, "fg", false);
  forged(dom, "fz", true);
  share_end(dom, v);
  return 0;
}
