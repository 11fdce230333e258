/*
 * A member whose connection drops reconnects until it succeeds or leaves:
 *  - a failure that may pass (no descriptor free while it tried) does not
 *    stop it: once descriptors are free again it is back, and requests
 *    work;
 *  - a broker that refuses it (DENIED) or speaks another protocol version
 *    ends the retries: every request fails at once with that code instead
 *    of waiting for a connection that never comes.
 * The refusing broker is this test, speaking the protocol by hand.
 */
#include "test.h"
#include "helpers/raw_proto.h"
#include "helpers/seg_peer.h"

#include <pthread.h>
#include <sys/resource.h>

static int lock_fd, listen_fd;
static int drop_pipe[2];
static int refusal; /* GPUIPC_E_DENIED or GPUIPC_E_VERSION */

static int fake_accept(struct gpuipc__msg *hello)
{
  int fd;
  if (gpuipc__sock_accept(listen_fd, 20000, &fd) != 0)
    TFAIL("accept: %s", gpuipc_last_error());
  raw_expect(fd, hello, GPUIPC_MSG_HELLO);
  return fd;
}

/* Welcome the member, drop it when told, refuse its reconnection. */
static void *refusing_broker(void *arg)
{
  (void)arg;
  struct gpuipc__msg m;
  int fd = raw_accept_member(listen_fd);
  char c;
  if (read(drop_pipe[0], &c, 1) != 1)
    TFAIL("read: %s", strerror(errno));
  close(fd);
  fd = fake_accept(&m);
  uint32_t req = m.req;
  uint8_t buf[GPUIPC__MSG_BUF];
  memset(&m, 0, sizeof(m));
  if (refusal == GPUIPC_E_DENIED) {
    m.type = GPUIPC_MSG_DENIED;
    m.req = req;
    snprintf(m.u.denied.reason, sizeof(m.u.denied.reason), "go away");
  } else {
    m.type = GPUIPC_MSG_WELCOME;
    m.req = req;
    m.u.welcome.pid = 1;
    m.u.welcome.epoch = 1;
  }
  int len = gpuipc__msg_encode(&m, buf, sizeof(buf));
  ASSERT_GT(len, 0);
  if (refusal == GPUIPC_E_VERSION)
    buf[4] = GPUIPC_PROTO_VERSION + 1; /* a version to come */
  (void)gpuipc__sock_send(fd, buf, (size_t)len, NULL, 0, 5000);
  close(fd);
  return NULL;
}

static void refused(const char *name, int code)
{
  refusal = code;
  ASSERT_OK(gpuipc__broker_claim(name, &lock_fd, &listen_fd, NULL));
  ASSERT_EQ(pipe2(drop_pipe, O_CLOEXEC), 0);
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, NULL, refusing_broker, NULL), 0);
  gpuipc_domain_opts_t o = {.size = sizeof(o), .timeout_ms = 300};
  gpuipc_domain_t *d;
  ASSERT_OK(gpuipc_domain_join(name, &o, &d));
  ASSERT_EQ(write(drop_pipe[1], "x", 1), 1);
  pthread_join(t, NULL);
  /* Until it has tried, requests wait for a connection (and time out). */
  int rc = -ETIMEDOUT;
  for (int tries = 0; tries < 100 && rc == -ETIMEDOUT; tries++) {
    gpuipc_domain_info_t di = {.size = sizeof(di)};
    rc = gpuipc_domain_info(d, &di);
  }
  ASSERT_RC(rc, code);
  ASSERT_ERR_MENTIONS(code == GPUIPC_E_DENIED ? "go away" : "version 4");
  gpuipc_buf_t *b;
  ASSERT_RC(test_seg_open(d, "x", 4096, -1, GPUIPC_CREATE, &b), code);
  ASSERT_OK(gpuipc_domain_leave(d));
  close(drop_pipe[0]);
  close(drop_pipe[1]);
  close(listen_fd);
  close(lock_fd);
}

/* The broker dies while this process has no descriptor to spare. */
static void no_descriptors(void)
{
  struct rlimit rl;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
  struct peer host;
  peer_start(&host);
  PEER_OK(&host, "join emfile");
  gpuipc_domain_opts_t o = {.size = sizeof(o), .timeout_ms = 300};
  gpuipc_domain_t *d;
  ASSERT_OK(gpuipc_domain_join("emfile", &o, &d));
  gpuipc_buf_t *b;
  ASSERT_OK(test_seg_open(d, "kept", 4096, -1, GPUIPC_CREATE, &b));
  test_fill(gpuipc_buf_ptr(b), 4096, 5);

  /* Few descriptors, all taken. */
  struct rlimit low = rl;
  low.rlim_cur = 256;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  int fill[256], n = 0;
  while (n < 256 && (fill[n] = fcntl(0, F_DUPFD_CLOEXEC, 0)) >= 0)
    n++;
  ASSERT_GT(n, 0);
  ASSERT_LT(n, 256);
  peer_kill(&host); /* its pipes free two: take them too */
  while (n < 256 && (fill[n] = fcntl(0, F_DUPFD_CLOEXEC, 0)) >= 0)
    n++;
  /* The reader finds the connection gone and cannot make a new one. */
  gpuipc_domain_info_t di = {.size = sizeof(di)};
  ASSERT_RC(gpuipc_domain_info(d, &di), -ETIMEDOUT);
  usleep(300000);
  for (int i = 0; i < n; i++)
    close(fill[i]);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);

  int rc = -ETIMEDOUT;
  for (int tries = 0; tries < 100 && rc == -ETIMEDOUT; tries++) {
    memset(&di, 0, sizeof(di));
    di.size = sizeof(di);
    rc = gpuipc_domain_info(d, &di);
  }
  ASSERT_OK(rc);
  ASSERT_EQ(di.broker_pid, getpid()); /* it took the domain over */
  gpuipc_segment_info_t s = {.size = sizeof(s)};
  ASSERT_OK(gpuipc_segment_stat(d, "kept", &s));
  ASSERT_EQ(s.state, GPUIPC_SEG_PUBLISHED);
  ASSERT_EQ(s.nholders, 1);
  ASSERT_TRUE(test_check(gpuipc_buf_ptr(b), 4096, 5) == (size_t)-1);
  ASSERT_OK(gpuipc_buf_release(b));
  ASSERT_OK(gpuipc_domain_leave(d));
}

int main(void)
{
  refused("rdenied", GPUIPC_E_DENIED);
  refused("rversion", GPUIPC_E_VERSION);
  no_descriptors();
  printf("domain_reconnect: ok\n");
  return 0;
}
