/*
 * `gpuipc ls --prune DOMAIN` sweeps what shared copies left behind: two
 * members killed in their round leave its table and their standing lends
 * named (the broker keeps their memory while a name does); the CLI
 * unlinks those, names each, and leaves alone a round whose member lives
 * and that member's lends. A second prune finds nothing. Real processes
 * (share_peer), HOST memory.
 */
#include "test.h"
#include "helpers/share_peer.h"

#include <limits.h>

#ifdef GPUIPC_CLI
static char out[65536];

static int run_ls(const char *args)
{
  char cmd[PATH_MAX + 256];
  snprintf(cmd, sizeof(cmd), "%s ls %s 2>&1", GPUIPC_CLI, args);
  int st = test_popen(cmd, out, sizeof(out));
  printf("$ gpuipc ls %s\n%s", args, out);
  return st;
}

/* Lines of the last output that start with @start and mention @needle. */
static int lines_with(const char *start, const char *needle)
{
  int n = 0;
  for (const char *l = out; *l != '\0';) {
    const char *e = strchr(l, '\n');
    size_t len = e != NULL ? (size_t)(e - l) : strlen(l);
    char line[1024];
    snprintf(line, sizeof(line), "%.*s", (int)(len < 1023 ? len : 1023), l);
    if (strncmp(line, start, strlen(start)) == 0 && strstr(line, needle))
      n++;
    l += len + (e != NULL);
  }
  return n;
}
#endif

int main(void)
{
#ifndef GPUIPC_CLI
  SKIP("built without the gpuipc tool");
#else
  gpuipc_buf_t *v[SHARE_NSRC];
  gpuipc_domain_t *dom = share_begin(v);
  struct sreader k[2], live;
  int unheld;
  int dead_lent = share_kill_two_at_claim(dom, "p1", k, &unheld);
  ASSERT_EQ(share_segments_in(dom, "p1", true), 1); /* its table */
  ASSERT_EQ(dead_lent, 2 * SHARE_NDST);
  ASSERT_EQ(unheld, 2 * SHARE_NDST); /* nobody holds them */
  /* A member that lives, in a round of its own, holding it. */
  sreader_start(&live, "share", "v1", 1, "p2", "", 1, "own", SHARE_TIMEOUT_MS);
  sreader_expect(&live, "ready");
  sreader_send(&live, "go\n");
  sreader_expect(&live, "joined");
  sreader_expect(&live, "leave");

  ASSERT_EQ(run_ls("--prune share"), 0);
  ASSERT_EQ(lines_with("removed p1.share ", "round table"), 1);
  ASSERT_EQ(lines_with("removed gpuipc-share.", "standing lend"),
            2 * SHARE_NDST);
  ASSERT_EQ(lines_with("removed ", "p2"), 0);
  ASSERT_EQ(share_segments_in(dom, "p1", true), 0);
  ASSERT_EQ(share_standing_of(dom, k[0].pid, &unheld) +
                share_standing_of(dom, k[1].pid, &unheld),
            0);
  ASSERT_GT(share_segments_in(dom, "p2", true), 0);
  ASSERT_EQ(share_standing_of(dom, live.pid, &unheld), SHARE_NDST); /* held */

  /* Nothing left to prune; JSON says so too. */
  ASSERT_EQ(run_ls("--prune share"), 0);
  ASSERT_EQ(lines_with("nothing to prune", ""), 1);
  ASSERT_EQ(run_ls("--json --prune share"), 0);
  ASSERT_TRUE(strstr(out, "\"pruned\": []") != NULL ||
              strstr(out, "\"pruned\":[]") != NULL);

  sreader_send(&live, "out\n");
  struct sresult r;
  sreader_result(&live, &r);
  sresult_check_ok(&r, 0);
  ASSERT_EQ(sreader_end(&live), 0);
  share_wait_none(dom, "p2");
  share_end(dom, v);
  return 0;
#endif
}
