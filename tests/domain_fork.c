/*
 * A domain does not survive fork(), and a child made by fork() without
 * exec must not keep the domain alive in its parent's place:
 *  - a member forks, then dies: the broker sees it leave (its references
 *    go) although the child still runs;
 *  - the broker's host forks, then dies: the survivors elect a new broker
 *    although the child still runs (it must not hold the lock, the
 *    listener or the members' connections).
 */
#include "test.h"
#include "helpers/seg_peer.h"

#include <signal.h>

static pid_t peer_fork(struct peer *p)
{
  int child = 0;
  const char *r = peer_cmd(p, "fork");
  if (sscanf(r, "ok %d", &child) != 1)
    TFAIL("fork: %s", r);
  ASSERT_GT(child, 0);
  return child;
}

int main(void)
{
  /* 1. A member forks and dies. */
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("fk", NULL, &dom));
  struct peer m;
  peer_start(&m);
  PEER_OK(&m, "join fk");
  PEER_OK(&m, "open held 4096 c");
  pid_t child = peer_fork(&m);
  peer_kill(&m);
  domain_wait_members(dom, 1);
  ASSERT_EQ(kill(child, 0), 0); /* the child lives on */
  gpuipc_segment_info_t s = {.size = sizeof(s)};
  ASSERT_OK(gpuipc_segment_stat(dom, "held", &s));
  ASSERT_EQ(s.nholders, 0);
  kill(child, SIGKILL);
  ASSERT_OK(gpuipc_segment_unlink(dom, "held"));
  ASSERT_OK(gpuipc_domain_leave(dom));

  /* 2. The broker's host forks and dies. */
  struct peer host, survivor;
  peer_start(&host);
  peer_start(&survivor);
  PEER_OK(&host, "join fk2");
  PEER_OK(&survivor, "join fk2");
  PEER_OK(&host, "open data 8192 c");
  PEER_OK(&host, "fill data 6");
  PEER_OK(&survivor, "open data 0 -");
  child = peer_fork(&host);
  peer_kill(&host);
  int bpid, hosts, members, segs, fds;
  const char *r = peer_cmd(&survivor, "info");
  if (sscanf(r, "ok %d %d %d %d %d", &bpid, &hosts, &members, &segs, &fds) !=
      5)
    TFAIL("info after the host died: %s", r);
  ASSERT_EQ(bpid, survivor.pid);
  ASSERT_EQ(kill(child, 0), 0); /* it did not stand in the way */
  PEER_OK(&survivor, "check data 6");
  PEER_OK(&survivor, "release data");
  PEER_OK(&survivor, "open data 0 -");
  PEER_OK(&survivor, "check data 6");
  kill(child, SIGKILL);
  PEER_OK(&survivor, "leave");
  peer_finish(&survivor);
  printf("domain_fork: ok\n");
  return 0;
}
