/*
 * gpuipc_share_copy with a member stopped (SIGSTOP) while it holds a
 * claim: the others take the claim over once the timeout has passed,
 * mark it FAILED and finish with every byte right. Continued (SIGCONT),
 * the stopped member's call returns -ETIMEDOUT, naming the chunk it held
 * -- never 0 with wrong bytes. The last survivor unlinks the round's
 * names without waiting for the stopped one; its segments go once all
 * left.
 */
#include "test.h"
#include "helpers/share_peer.h"

#include <sys/wait.h>

#define NSURV 2

int main(void)
{
  gpuipc_buf_t *v[SHARE_NSRC];
  gpuipc_domain_t *dom = share_begin(v);
  struct sreader k, s[NSURV];
  sreader_start(&k, "share", "v1", 1, "st", "claimed:2:stop", 0, "own",
                SHARE_TIMEOUT_MS);
  sreader_expect(&k, "ready");
  for (int i = 0; i < NSURV; i++) {
    sreader_start(&s[i], "share", "v1", 1, "st", "", 1, "own",
                  SHARE_TIMEOUT_MS);
    sreader_expect(&s[i], "ready");
  }
  sreader_send(&k, "go\n");
  sreader_expect(&k, "joined");
  int status;
  ASSERT_EQ(waitpid(k.pid, &status, WUNTRACED), k.pid);
  ASSERT_TRUE(WIFSTOPPED(status));
  test_stamp("the member holding its second claim is stopped");
  sreaders_go(s, NSURV);
  struct sresult done[NSURV];
  sreaders_out(s, NSURV, done);
  ASSERT_GE(done[0].reclaimed + done[1].reclaimed, 1); /* its claim, taken
                                                           over */
  sreaders_end_ok(s, NSURV);
  /* A failed member, stopped for ever maybe, keeps no name of the round:
   * the last survivor unlinked them (the stopped one holds its maps). */
  ASSERT_EQ(share_segments_in(dom, "st", true), 0);
  test_stamp("the survivors finished; the stopped member continues");
  ASSERT_EQ(kill(k.pid, SIGCONT), 0);
  struct sresult r;
  sreader_result(&k, &r);
  ASSERT_EQ(r.rc, -ETIMEDOUT);
  printf("the stopped member: %s\n", r.msg);
  if (strstr(r.msg, "marked this member FAILED") == NULL ||
      strstr(r.msg, "taken over: ") == NULL)
    TFAIL("the stopped member's error does not name its chunks: %s", r.msg);
  ASSERT_EQ(sreader_end(&k), 0);
  share_wait_none(dom, "st");
  share_end(dom, v);
  return 0;
}
