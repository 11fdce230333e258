/*
 * Umpire's DeviceIpcAllocator flow without MPI: 8 processes open the same
 * segment with GPUIPC_CREATE; exactly one allocates it and fills it, then
 * publishes a "ready" segment that the others wait for; all read the data.
 * After unlink and release the registry is empty and the broker holds no
 * descriptor for it, and no process leaked one.
 */
#include "test.h"
#include "helpers/seg_peer.h"

#define NPEERS 8
#define SIZE (1u << 20)
#define SEED 4242

static void dom_info(gpuipc_domain_t *d, gpuipc_domain_info_t *i)
{
  memset(i, 0, sizeof(*i));
  i->size = sizeof(*i);
  ASSERT_OK(gpuipc_domain_info(d, i));
}

int main(void)
{
  test_warm_driver(); /* count descriptors with the driver's included */
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("umpire", NULL, &dom));
  gpuipc_domain_info_t di;
  dom_info(dom, &di);
  ASSERT_EQ(di.hosts_broker, 1);
  int broker_fds = test_count_fds(0);

  struct peer p[NPEERS];
  int fds[NPEERS];
  for (int i = 0; i < NPEERS; i++) {
    peer_start(&p[i]);
    PEER_OK(&p[i], "join umpire");
    const char *r = peer_cmd(&p[i], "fds");
    ASSERT_EQ(sscanf(r, "ok %d", &fds[i]), 1);
  }
  int base = test_count_fds(0); /* + 8 members, + our pipes to them */
  /* All at once: every peer asks to create the same segment. */
  for (int i = 0; i < NPEERS; i++)
    peer_send(&p[i], "open weights %u c", SIZE);
  int creator = -1;
  for (int i = 0; i < NPEERS; i++) {
    const char *r = peer_read(&p[i], PEER_REPLY_MS);
    int mine;
    size_t size;
    if (sscanf(r, "ok %d %zu", &mine, &size) != 2)
      TFAIL("peer %d: %s", i, r);
    ASSERT_GE(size, SIZE);
    if (mine) {
      if (creator >= 0)
        TFAIL("peers %d and %d both allocated the segment", creator, i);
      creator = i;
    }
  }
  ASSERT_GE(creator, 0);
  printf("peer %d (pid %d) allocated; %d imported\n", creator,
         (int)p[creator].pid, NPEERS - 1);

  /* The others wait for "ready" while the creator fills and publishes it. */
  for (int i = 0; i < NPEERS; i++)
    if (i != creator)
      peer_send(&p[i], "open weights.ready 0 w");
  PEER_OK(&p[creator], "fill weights %d", SEED);
  PEER_OK(&p[creator], "open weights.ready 64 cx");
  for (int i = 0; i < NPEERS; i++) {
    if (i == creator)
      continue;
    const char *r = peer_read(&p[i], PEER_REPLY_MS);
    if (strncmp(r, "ok 0", 4) != 0)
      TFAIL("peer %d waiting for ready: %s", i, r);
    PEER_OK(&p[i], "check weights %d", SEED);
  }

  gpuipc_segment_info_t s = {.size = sizeof(s)};
  ASSERT_OK(gpuipc_segment_stat(dom, "weights", &s));
  ASSERT_EQ(s.nholders, NPEERS);
  ASSERT_EQ(s.broker_fd, 1);
  ASSERT_EQ(s.state, GPUIPC_SEG_PUBLISHED);
  /* The broker holds one descriptor per segment. */
  ASSERT_EQ(test_count_fds(0), base + 2);

  ASSERT_OK(gpuipc_segment_unlink(dom, "weights"));
  ASSERT_OK(gpuipc_segment_unlink(dom, "weights.ready"));
  dom_info(dom, &di);
  ASSERT_EQ(di.segments, 2); /* unlinked, still held */
  for (int i = 0; i < NPEERS; i++) {
    PEER_OK(&p[i], "release weights");
    PEER_OK(&p[i], "release weights.ready");
    const char *r = peer_cmd(&p[i], "fds");
    int now;
    ASSERT_EQ(sscanf(r, "ok %d", &now), 1);
    ASSERT_EQ(now, fds[i]);
  }
  dom_info(dom, &di);
  ASSERT_EQ(di.segments, 0);
  ASSERT_EQ(di.broker_fds, 0);
  ASSERT_EQ(test_count_fds(0), base);

  for (int i = 0; i < NPEERS; i++) {
    PEER_OK(&p[i], "leave");
    peer_finish(&p[i]);
  }
  domain_wait_members(dom, 1);
  ASSERT_EQ(test_count_fds(0), broker_fds);
  ASSERT_OK(gpuipc_domain_leave(dom));
  printf("segment_umpire: ok\n");
  return 0;
}
