/*
 * Load: 64 processes at once each create 200 segments of their own (and
 * open each a second time, which maps nothing new), fill them, open and
 * check every byte of the 200 segments of their neighbour once it says
 * they are ready, and unlink their own once the other neighbour has read
 * them (seg_peer's "load"). Meanwhile this process, the broker's host, keeps
 * asking the broker for the domain's state: it answers throughout. At the
 * end the registry is empty and the broker holds no descriptor.
 */
#include "test.h"
#include "helpers/seg_peer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#define NPEERS 64
#define COUNT 200
#define SIZE 4096

static gpuipc_domain_t *dom;
static atomic_bool done;
static atomic_int answers, max_segments;

/* Ask the broker about the domain all along; every answer must come. */
static void *prober(void *arg)
{
  (void)arg;
  while (!atomic_load(&done)) {
    gpuipc_domain_info_t di = {.size = sizeof(di)};
    int rc = gpuipc_domain_info(dom, &di);
    if (rc != 0)
      TFAIL("the broker did not answer under load: %s", gpuipc_err_name(rc));
    atomic_fetch_add(&answers, 1);
    if (di.segments > atomic_load(&max_segments))
      atomic_store(&max_segments, di.segments);
    usleep(20000);
  }
  return NULL;
}

int main(void)
{
  test_warm_driver(); /* count descriptors with the driver's included */
  ASSERT_OK(gpuipc_domain_join("load", NULL, &dom));
  int fds = test_count_fds(0);
  static struct peer p[NPEERS];
  for (int i = 0; i < NPEERS; i++) {
    peer_start(&p[i]);
    /* 64 processes share two cores: waiting for a neighbour can take
     * longer than the default 10 s. */
    PEER_OK(&p[i], "setenv GPUIPC_TIMEOUT_MS 100000");
    peer_send(&p[i], "join load");
  }
  for (int i = 0; i < NPEERS; i++) {
    const char *r = peer_read(&p[i], PEER_REPLY_MS);
    if (strncmp(r, "ok", 2) != 0)
      TFAIL("peer %d join: %s", i, r);
  }
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, NULL, prober, NULL), 0);
  for (int i = 0; i < NPEERS; i++)
    peer_send(&p[i], "load %d %d %d %d", i, NPEERS, COUNT, SIZE);
  /* Collect the answers as they come: the first failure is the story. */
  static struct pollfd pf[NPEERS];
  for (int i = 0; i < NPEERS; i++)
    pf[i] = (struct pollfd){.fd = p[i].out, .events = POLLIN};
  for (int left = NPEERS; left > 0;) {
    int n = poll(pf, NPEERS, 110000);
    if (n <= 0)
      TFAIL("%d peers did not finish", left);
    for (int i = 0; i < NPEERS; i++) {
      if (pf[i].fd < 0 || pf[i].revents == 0)
        continue;
      const char *r = peer_read(&p[i], PEER_REPLY_MS);
      if (strcmp(r, "ok") != 0)
        TFAIL("peer %d: %s", i, r);
      pf[i].fd = -1;
      left--;
    }
  }
  atomic_store(&done, true);
  pthread_join(t, NULL);
  printf("the broker answered %d times during the load; at most %d "
         "segments at once\n",
         atomic_load(&answers), atomic_load(&max_segments));
  ASSERT_GT(atomic_load(&answers), 0);
  ASSERT_GT(atomic_load(&max_segments), NPEERS);

  gpuipc_domain_info_t di = {.size = sizeof(di)};
  ASSERT_OK(gpuipc_domain_info(dom, &di));
  ASSERT_EQ(di.members, NPEERS + 1);
  for (int i = 0; i < NPEERS; i++) {
    PEER_OK(&p[i], "leave");
    peer_finish(&p[i]);
  }
  domain_wait_members(dom, 1);
  ASSERT_OK(gpuipc_domain_info(dom, &di));
  ASSERT_EQ(di.segments, 0);
  ASSERT_EQ(di.broker_fds, 0);
  ASSERT_EQ(test_count_fds(0), fds);
  ASSERT_OK(gpuipc_domain_leave(dom));
  printf("segment_load: ok\n");
  return 0;
}
