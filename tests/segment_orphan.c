/*
 * A reply that comes after its caller gave up is undone: a publication
 * that timed out but went through is released again (the creator let its
 * buffer go, so the broker must not count it as a holder). The broker is
 * this test, speaking the protocol by hand, so that it can answer late.
 */
#include "test.h"
#include "helpers/raw_proto.h"

#include <pthread.h>

static int lock_fd, listen_fd;
static uint64_t released_id;
static uint32_t released_count;
static bool abandoned;

static void *late_broker(void *arg)
{
  (void)arg;
  int fd = raw_accept_member(listen_fd);
  struct gpuipc__msg m;

  raw_expect(fd, &m, GPUIPC_MSG_OPEN);
  uint32_t req = m.req;
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_CREATE_IT;
  m.req = req;
  m.u.create_it.id = 77;
  raw_send(fd, &m, NULL, 0);

  raw_expect(fd, &m, GPUIPC_MSG_PUBLISH); /* its fd is closed */
  uint32_t publish_req = m.req;
  ASSERT_EQ_U(m.u.publish.seg.id, 77);
  /* No answer until the creator gave up and abandoned the reservation. */
  raw_expect(fd, &m, GPUIPC_MSG_ABANDON);
  ASSERT_EQ_U(m.u.abandon.id, 77);
  abandoned = true;
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_OK;
  m.req = publish_req;
  m.u.ok.id = 77;
  raw_send(fd, &m, NULL, 0);
  /* What the member sends next: the release of that publication. */
  int rc = raw_recv(fd, &m, NULL, NULL, 10000);
  if (rc == 0 && m.type == GPUIPC_MSG_RELEASE) {
    released_id = m.u.release.id;
    released_count = m.u.release.count;
  }
  close(fd);
  return NULL;
}

int main(void)
{
  ASSERT_OK(gpuipc__broker_claim("late", &lock_fd, &listen_fd, NULL));
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, NULL, late_broker, NULL), 0);
  gpuipc_domain_opts_t o = {.size = sizeof(o), .timeout_ms = 500};
  gpuipc_domain_t *d;
  ASSERT_OK(gpuipc_domain_join("late", &o, &d));
  gpuipc_buf_t *b;
  ASSERT_RC(test_seg_open(d, "slow", 4096, -1, GPUIPC_CREATE, &b),
            -ETIMEDOUT);
  pthread_join(t, NULL);
  close(listen_fd); /* nobody answers a reconnection: no need to try */
  ASSERT_TRUE(abandoned);
  ASSERT_EQ_U(released_id, 77);
  ASSERT_EQ(released_count, 1);
  ASSERT_OK(gpuipc_domain_leave(d));
  close(lock_fd);
  printf("segment_orphan: ok\n");
  return 0;
}
