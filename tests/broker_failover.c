/*
 * kill -9 of the process hosting the broker: the survivors elect a new
 * broker among themselves, reconnect, re-publish what they hold, and carry
 * on: every segment a survivor held still opens (bytes intact, the epoch
 * kept), an unlinked one stays unlinked, and a segment no survivor held is
 * reported lost by name -- also to a process that joins afterwards. No
 * descriptor leaks in the survivors. A crash that nobody survives leaves
 * nothing lost: the next process starts the domain afresh.
 */
#include "test.h"
#include "helpers/seg_peer.h"

#include <time.h>

#define NS 3

static double now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int main(void)
{
  test_warm_driver(); /* count descriptors with the driver's included */
  struct peer host, s[NS];
  peer_start(&host);
  PEER_OK(&host, "join fo");
  struct peer_info hi;
  peer_info(&host, &hi);
  ASSERT_EQ(hi.hosts, 1);
  ASSERT_EQ(hi.broker_pid, host.pid);
  for (int i = 0; i < NS; i++) {
    peer_start(&s[i]);
    PEER_OK(&s[i], "join fo");
  }

  /* only_h: held by the host alone. nobody: published, held by nobody. */
  PEER_OK(&host, "open only_h 4096 c");
  PEER_OK(&host, "fill only_h 1");
  PEER_OK(&host, "open nobody 4096 c");
  PEER_OK(&host, "fill nobody 2");
  PEER_OK(&host, "release nobody");
  /* shared: created by the host, held by s0 too. */
  PEER_OK(&host, "open shared 8192 c");
  PEER_OK(&host, "fill shared 3");
  PEER_OK(&s[0], "open shared 0 -");
  PEER_OK(&s[0], "check shared 3");
  /* s1own: created and held by s1, opened twice. */
  PEER_OK(&s[1], "open s1own 12288 c");
  PEER_OK(&s[1], "fill s1own 4");
  PEER_OK(&s[1], "open s1own 0 -");
  /* gone: unlinked while s0 and s1 hold it. */
  PEER_OK(&s[0], "open gone 4096 c");
  PEER_OK(&s[0], "fill gone 5");
  PEER_OK(&s[1], "open gone 0 -");
  PEER_OK(&s[0], "unlink gone");
  peer_info(&host, &hi);
  ASSERT_EQ(hi.segments, 5);

  int fds[NS];
  for (int i = 0; i < NS; i++)
    fds[i] = peer_fds(&s[i]);

  double t0 = now_ms();
  peer_kill(&host);

  /* Every survivor finds the new broker, one of them. */
  struct peer_info si[NS];
  peer_info(&s[0], &si[0]);
  double t1 = now_ms();
  printf("new broker in pid %d answered %.1f ms after the kill\n",
         si[0].broker_pid, t1 - t0);
  int hosting = -1;
  for (int i = 0; i < NS; i++) {
    peer_info(&s[i], &si[i]);
    ASSERT_EQ(si[i].broker_pid, si[0].broker_pid);
    if (si[i].hosts)
      hosting = i;
  }
  ASSERT_GE(hosting, 0);
  ASSERT_EQ(si[hosting].broker_pid, s[hosting].pid);

  /* What survivors held is there, bytes intact. */
  PEER_OK(&s[2], "open shared 8192 -");
  PEER_OK(&s[2], "check shared 3");
  PEER_OK(&s[2], "open s1own 0 -");
  PEER_OK(&s[2], "check s1own 4");
  PEER_OK(&s[0], "check gone 5");
  /* Unlinked stays unlinked; what nobody held is lost, by name. */
  PEER_EXPECT(&s[2], "err ENOENT", "open gone 0 -");
  PEER_EXPECT(&s[2], "err GPUIPC_E_LOST", "open only_h 0 -");
  const char *r = peer_cmd(&s[2], "open nobody 0 w");
  if (strncmp(r, "err GPUIPC_E_LOST", 17) != 0 || strstr(r, "nobody") == NULL)
    TFAIL("open nobody: %s", r);
  r = peer_cmd(&s[2], "stat only_h");
  ASSERT_TRUE(strncmp(r, "ok lost 0 0", 11) == 0);
  r = peer_cmd(&s[2], "stat shared");
  int nh, bfd;
  char state[32];
  ASSERT_EQ(sscanf(r, "ok %31s %d %d", state, &nh, &bfd), 3);
  ASSERT_STREQ(state, "published");
  ASSERT_EQ(nh, 2); /* s0 re-published it, s2 opened it */
  ASSERT_EQ(bfd, 1);

  /* A process joining now hears the same. */
  struct peer late;
  peer_start(&late);
  PEER_OK(&late, "join fo");
  PEER_EXPECT(&late, "err GPUIPC_E_LOST", "open only_h 4096 -");
  PEER_OK(&late, "open shared 0 -");
  PEER_OK(&late, "check shared 3");
  PEER_OK(&late, "release shared");
  /* A lost name can be created anew, and unlinked. */
  PEER_EXPECT(&late, "ok 1", "open only_h 4096 c");
  PEER_OK(&late, "release only_h");
  PEER_OK(&late, "unlink only_h");
  PEER_OK(&late, "unlink nobody");
  PEER_EXPECT(&late, "err ENOENT", "open nobody 0 -");
  PEER_OK(&late, "leave");
  peer_finish(&late);

  /* No leaks: a plain survivor has what it had (s2 opened two more). */
  PEER_OK(&s[2], "release shared");
  PEER_OK(&s[2], "release s1own");
  for (int i = 0; i < NS; i++) {
    if (i == hosting)
      continue;
    ASSERT_EQ(peer_fds(&s[i]), fds[i]);
  }
  /* The new host: + lock, listener, wake pipe, spare, an accepted socket
   * per member and a descriptor per segment. */
  struct peer_info h;
  peer_info(&s[hosting], &h);
  ASSERT_EQ(peer_fds(&s[hosting]), fds[hosting] + 5 + h.members + h.fds);

  for (int i = 0; i < NS; i++) {
    PEER_OK(&s[i], "leave");
    peer_finish(&s[i]);
  }

  /*
   * A crash nobody survives: nothing was lost to anyone, and the next
   * process to join starts the domain afresh, its old names free.
   */
  struct peer solo, next;
  peer_start(&solo);
  PEER_OK(&solo, "join solo");
  PEER_OK(&solo, "open z 4096 c");
  peer_kill(&solo);
  peer_start(&next);
  PEER_OK(&next, "join solo");
  PEER_EXPECT(&next, "err ENOENT", "open z 0 -");
  PEER_EXPECT(&next, "ok 1", "open z 4096 cx");
  PEER_OK(&next, "leave");
  peer_finish(&next);
  printf("broker_failover: ok\n");
  return 0;
}
