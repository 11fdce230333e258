/*
 * The process hosting the broker leaves cleanly while others hold
 * segments: the broker hands its registry, descriptors, lock and listener
 * to another member, and nothing is lost -- not even a segment that no
 * remaining process holds (the broker's descriptor moved with it). Then
 * the new host leaves as well, and the domain moves once more; finally the
 * last member leaves and the domain ends. A successor that goes away in
 * the middle of a hand-over is replaced by the next member.
 */
#include "test.h"
#include "helpers/seg_peer.h"

#include "domain/domain.h"
#include "os/os.h"

/*
 * The successor chosen first goes away in the middle of the hand-over
 * (here: a raw member that accepts the offer, reads it all and hangs up
 * without acknowledging): the broker hands the domain to the next member
 * instead.
 */
static void successor_gone(void)
{
  struct peer host, next;
  peer_start(&host);
  PEER_OK(&host, "join ho2");
  PEER_OK(&host, "open x 4096 c");
  PEER_OK(&host, "fill x 21");
  PEER_OK(&host, "release x"); /* only the broker holds it now */
  struct gpuipc__dom_paths paths;
  ASSERT_OK(gpuipc__dom_paths("ho2", &paths));
  int fd;
  ASSERT_OK(gpuipc__sock_connect(paths.sock, 5000, &fd));
  struct gpuipc__msg m = {.type = GPUIPC_MSG_HELLO, .req = 1};
  m.u.hello.pid = (uint32_t)getpid();
  m.u.hello.token = 99;
  ASSERT_OK(gpuipc__proto_send(fd, &m, NULL, 0, 5000));
  static uint8_t in[GPUIPC_MSG_MAX];
  int nfds = 0;
  ASSERT_GT(gpuipc__sock_recv(fd, in, sizeof(in), NULL, &nfds, 5000), 0);
  peer_start(&next); /* joins after the raw member: second in line */
  PEER_OK(&next, "join ho2");

  peer_send(&host, "leave");
  int got = 0;
  nfds = 0; /* take the offer: the hand-over comes */
  ssize_t len = gpuipc__sock_recv(fd, in, sizeof(in), NULL, &nfds, 10000);
  ASSERT_GT(len, 0);
  ASSERT_OK(gpuipc__msg_decode(in, (size_t)len, 0, &m));
  ASSERT_EQ(m.type, GPUIPC_MSG_HANDOFF_OFFER);
  struct gpuipc__msg acc = {.type = GPUIPC_MSG_HANDOFF_ACCEPT};
  acc.u.handoff_accept.count = m.u.handoff_offer.count;
  ASSERT_OK(gpuipc__proto_send(fd, &acc, NULL, 0, 5000));
  for (;;) { /* read the hand-over, keep nothing, say nothing */
    int fds[GPUIPC_FDS_MAX];
    nfds = GPUIPC_FDS_MAX;
    ssize_t n = gpuipc__sock_recv(fd, in, sizeof(in), fds, &nfds, 10000);
    ASSERT_GT(n, 0);
    for (int i = 0; i < nfds; i++)
      close(fds[i]);
    ASSERT_OK(gpuipc__msg_decode(in, (size_t)n, nfds, &m));
    got++;
    if (m.type == GPUIPC_MSG_HANDOFF_END)
      break;
  }
  ASSERT_EQ(got, 3); /* BEGIN, the one segment, END */
  close(fd);
  ASSERT_TRUE(strncmp(peer_read(&host, PEER_REPLY_MS), "ok", 2) == 0);
  peer_finish(&host);
  struct peer_info in2;
  peer_info(&next, &in2);
  ASSERT_EQ(in2.broker_pid, next.pid);
  PEER_OK(&next, "open x 4096 -");
  PEER_OK(&next, "check x 21");
  PEER_OK(&next, "leave");
  peer_finish(&next);
}

int main(void)
{
  test_warm_driver(); /* count descriptors with the driver's included */
  /* This process hosts the broker first. */
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("ho", NULL, &dom));
  gpuipc_domain_info_t di = {.size = sizeof(di)};
  ASSERT_OK(gpuipc_domain_info(dom, &di));
  ASSERT_EQ(di.hosts_broker, 1);
  uint64_t epoch = di.epoch;

  struct peer a, b;
  peer_start(&a);
  peer_start(&b);
  PEER_OK(&a, "join ho");
  PEER_OK(&b, "join ho");

  /* kept: created here, held by a. orphan: created here, held by nobody. */
  gpuipc_buf_t *kept, *orphan, *gone;
  ASSERT_OK(test_seg_open(dom, "kept", 20000, -1, GPUIPC_CREATE, &kept));
  test_fill(gpuipc_buf_ptr(kept), 20000, 1);
  PEER_OK(&a, "open kept 20000 -");
  ASSERT_OK(test_seg_open(dom, "orphan", 3000, -1, GPUIPC_CREATE,
                                &orphan));
  test_fill(gpuipc_buf_ptr(orphan), 3000, 2);
  /* gone: unlinked, held by b only. */
  ASSERT_OK(test_seg_open(dom, "gone", 5000, -1, GPUIPC_CREATE, &gone));
  test_fill(gpuipc_buf_ptr(gone), 5000, 3);
  PEER_OK(&b, "open gone 0 -");
  ASSERT_OK(gpuipc_segment_unlink(dom, "gone"));
  /* bs: created and held by b. */
  PEER_OK(&b, "open bs 7000 c");
  PEER_OK(&b, "fill bs 4");
  int fds_a = peer_fds(&a), fds_b = peer_fds(&b);

  /* Leave while holding buffers: they stay mapped here. */
  ASSERT_OK(gpuipc_domain_leave(dom));
  ASSERT_EQ(test_check(gpuipc_buf_ptr(kept), 20000, 1), (size_t)-1);

  /* The oldest other member, a, hosts the broker now, with the epoch. */
  struct peer_info ia, ib;
  peer_info(&a, &ia);
  peer_info(&b, &ib);
  ASSERT_EQ(ia.broker_pid, a.pid);
  ASSERT_EQ(ia.hosts, 1);
  ASSERT_EQ(ib.broker_pid, a.pid);
  ASSERT_EQ(ia.segments, 4);
  /* The broker's descriptors moved along, gone's too (b holds it). */
  ASSERT_EQ(ia.fds, 4);
  PEER_OK(&b, "open orphan 3000 -");
  PEER_OK(&b, "check orphan 2");
  PEER_OK(&b, "open kept 0 -");
  PEER_OK(&b, "check kept 1");
  PEER_OK(&b, "check gone 3");
  PEER_EXPECT(&b, "err ENOENT", "open gone 0 -");
  PEER_OK(&a, "open bs 0 -");
  PEER_OK(&a, "check bs 4");

  /* A later member sees the same domain. */
  gpuipc_domain_t *again;
  ASSERT_OK(gpuipc_domain_join("ho", NULL, &again));
  ASSERT_OK(gpuipc_domain_info(again, &di));
  ASSERT_EQ_U(di.epoch, epoch);
  ASSERT_EQ(di.hosts_broker, 0);
  ASSERT_EQ(di.broker_pid, a.pid);
  gpuipc_segment_info_t list[8];
  for (int i = 0; i < 8; i++)
    list[i].size = sizeof(list[i]);
  ASSERT_EQ(gpuipc_segment_list(again, list, 8), 4);
  int unlinked = 0;
  for (int i = 0; i < 4; i++)
    if (list[i].state == GPUIPC_SEG_UNLINKED) {
      ASSERT_STREQ(list[i].name, "gone");
      ASSERT_EQ(list[i].nholders, 1);
      ASSERT_EQ(list[i].holder_pids[0], b.pid);
      unlinked++;
    }
  ASSERT_EQ(unlinked, 1);
  gpuipc_buf_release(kept);
  gpuipc_buf_release(orphan);
  gpuipc_buf_release(gone);

  /* The new host leaves too: the broker moves on to b (this process's
   * member joined later). */
  PEER_OK(&a, "release kept");
  PEER_OK(&a, "release bs");
  PEER_OK(&a, "leave");
  peer_finish(&a);
  peer_info(&b, &ib);
  ASSERT_EQ(ib.broker_pid, b.pid);
  ASSERT_EQ(ib.hosts, 1);
  ASSERT_EQ(ib.segments, 4);
  PEER_OK(&b, "check gone 3");
  PEER_OK(&b, "release gone"); /* its last holder: freed */
  /* ...once the new broker's window for members to re-join has closed. */
  for (int tries = 0; tries < 500; tries++) {
    peer_info(&b, &ib);
    if (ib.segments == 3)
      break;
    usleep(10000);
  }
  ASSERT_EQ(ib.segments, 3);
  gpuipc_buf_t *x;
  ASSERT_OK(test_seg_open(again, "bs", 0, -1, 0, &x));
  ASSERT_EQ(test_check(gpuipc_buf_ptr(x), 7000, 4), (size_t)-1);
  gpuipc_buf_release(x);

  /* b hosts: its descriptors are its old ones + lock, listener, wake pipe,
   * spare, one per member, one per segment, and the buffers it still holds
   * (orphan, kept, bs). */
  peer_info(&b, &ib);
  ASSERT_EQ(peer_fds(&b), fds_b - 1 /* gone */ + 2 /* orphan, kept */ + 5 +
                              ib.members + ib.fds);
  (void)fds_a;

  /* The last members leave: the domain ends, its socket goes. */
  ASSERT_OK(gpuipc_domain_leave(again));
  PEER_OK(&b, "leave");
  peer_finish(&b);
  struct gpuipc__dom_paths paths;
  ASSERT_OK(gpuipc__dom_paths("ho", &paths));
  ASSERT_EQ(access(paths.sock, F_OK), -1);

  successor_gone();
  printf("broker_handoff: ok\n");
  return 0;
}
