/*
 * kill -9 at each step of a segment's life (the broker's own host is
 * broker_failover's business):
 *  - a creator killed after reserving the name, before publishing: the
 *    name goes to the next process waiting to create it; a process only
 *    waiting for it gets the new one;
 *  - a holder killed while holding: its references go;
 *  - the last holders of an unlinked segment killed: the broker frees it.
 * No descriptor leaks in the survivors or the broker.
 */
#include "test.h"
#include "helpers/seg_peer.h"

#include <stdbool.h>

static gpuipc_domain_t *dom;

static void stat_seg(const char *name, gpuipc_segment_info_t *s)
{
  memset(s, 0, sizeof(*s));
  s->size = sizeof(*s);
  ASSERT_OK(gpuipc_segment_stat(dom, name, s));
}

static bool holds(const gpuipc_segment_info_t *s, pid_t pid)
{
  for (int i = 0; i < s->nholders && i < GPUIPC_SEGMENT_HOLDERS; i++)
    if (s->holder_pids[i] == pid)
      return true;
  return false;
}

/* Wait until the broker has dropped @pid's references on @name. */
static void wait_not_holder(const char *name, pid_t pid)
{
  gpuipc_segment_info_t s;
  for (int tries = 0; tries < 3000; tries++) {
    stat_seg(name, &s);
    if (!holds(&s, pid))
      return;
    usleep(10000);
  }
  TFAIL("pid %d still holds %s", (int)pid, name);
}

int main(void)
{
  test_warm_driver(); /* count descriptors with the driver's included */
  ASSERT_OK(gpuipc_domain_join("kill", NULL, &dom));
  int base = test_count_fds(0);

  struct peer creator, taker, waiter, holder;
  peer_start(&creator);
  peer_start(&taker);
  peer_start(&waiter);
  peer_start(&holder);
  PEER_OK(&creator, "join kill");
  PEER_OK(&taker, "join kill");
  PEER_OK(&waiter, "join kill");
  PEER_OK(&holder, "join kill");
  int fds_taker = peer_fds(&taker);
  int fds_waiter = peer_fds(&waiter);

  /* 1. The creator reserves the name and dies before publishing. */
  PEER_EXPECT(&creator, "ok create_it", "reserve k1 65536");
  gpuipc_segment_info_t s;
  stat_seg("k1", &s);
  ASSERT_EQ(s.state, GPUIPC_SEG_CREATING);
  ASSERT_EQ(s.broker_fd, 0);
  peer_send(&taker, "open k1 65536 c");  /* parks: someone is creating */
  peer_send(&waiter, "open k1 0 w");     /* parks: not published yet */
  usleep(100000);
  struct pollfd pf[2] = {{.fd = taker.out, .events = POLLIN},
                         {.fd = waiter.out, .events = POLLIN}};
  ASSERT_EQ(poll(pf, 2, 0), 0); /* both still wait */
  peer_kill(&creator);
  /* The taker gets the name and allocates; the waiter gets its segment. */
  const char *r = peer_read(&taker, PEER_REPLY_MS);
  if (strncmp(r, "ok 1", 4) != 0)
    TFAIL("taker: %s", r);
  PEER_OK(&taker, "fill k1 99");
  r = peer_read(&waiter, PEER_REPLY_MS);
  if (strncmp(r, "ok 0", 4) != 0)
    TFAIL("waiter: %s", r);
  PEER_OK(&waiter, "check k1 99");
  stat_seg("k1", &s);
  ASSERT_EQ(s.state, GPUIPC_SEG_PUBLISHED);
  ASSERT_EQ(s.nholders, 2);
  ASSERT_TRUE(holds(&s, taker.pid) && holds(&s, waiter.pid));

  /* 2. A holder dies while holding: its references go, others keep theirs. */
  PEER_OK(&holder, "open k1 65536 -");
  PEER_OK(&holder, "open k1 0 -");
  PEER_OK(&holder, "check k1 99");
  stat_seg("k1", &s);
  ASSERT_EQ(s.nholders, 3);
  pid_t hpid = holder.pid;
  peer_kill(&holder);
  wait_not_holder("k1", hpid);
  stat_seg("k1", &s);
  ASSERT_EQ(s.nholders, 2);
  PEER_OK(&waiter, "check k1 99");

  /* 3. Unlinked, then its last holders die: the broker frees it. */
  gpuipc_domain_info_t di = {.size = sizeof(di)};
  ASSERT_OK(gpuipc_domain_info(dom, &di));
  ASSERT_EQ(di.broker_fds, 1);
  PEER_OK(&waiter, "unlink k1");
  ASSERT_OK(gpuipc_domain_info(dom, &di));
  ASSERT_EQ(di.segments, 1); /* held: still there */
  ASSERT_EQ(di.broker_fds, 1);
  ASSERT_EQ(peer_fds(&taker), fds_taker + 1);   /* the buffer's own fd */
  ASSERT_EQ(peer_fds(&waiter), fds_waiter + 1);
  peer_kill(&taker);
  peer_kill(&waiter);
  domain_wait_members(dom, 1);
  ASSERT_OK(gpuipc_domain_info(dom, &di));
  ASSERT_EQ(di.segments, 0);
  ASSERT_EQ(di.broker_fds, 0);

  /* The broker (this process) leaked nothing. */
  ASSERT_EQ(test_count_fds(0), base);

  /* A holder killed while another process waits to create: no effect. */
  struct peer a, b;
  peer_start(&a);
  peer_start(&b);
  PEER_OK(&a, "join kill");
  PEER_OK(&b, "join kill");
  int fds_b = peer_fds(&b);
  PEER_OK(&a, "open k2 4096 cx");
  PEER_OK(&a, "fill k2 5");
  PEER_OK(&b, "open k2 4096 c");
  PEER_OK(&b, "check k2 5");
  peer_kill(&a);
  wait_not_holder("k2", a.pid);
  PEER_OK(&b, "check k2 5"); /* memory lives on in b */
  PEER_OK(&b, "release k2");
  ASSERT_EQ(peer_fds(&b), fds_b);
  stat_seg("k2", &s);
  ASSERT_EQ(s.nholders, 0);
  ASSERT_EQ(s.state, GPUIPC_SEG_PUBLISHED); /* the broker keeps it */
  PEER_OK(&b, "open k2 0 -");
  PEER_OK(&b, "check k2 5");
  PEER_OK(&b, "unlink k2");
  PEER_OK(&b, "release k2");
  ASSERT_OK(gpuipc_domain_info(dom, &di));
  ASSERT_EQ(di.segments, 0);
  ASSERT_EQ(di.broker_fds, 0);
  ASSERT_EQ(peer_fds(&b), fds_b);
  PEER_OK(&b, "leave");
  peer_finish(&b);
  domain_wait_members(dom, 1);
  ASSERT_EQ(test_count_fds(0), base);

  ASSERT_OK(gpuipc_domain_leave(dom));
  printf("segment_kill: ok\n");
  return 0;
}
