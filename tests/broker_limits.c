/*
 * What one client may take from a broker is bounded:
 *  - names reserved and not published: 1024 per member, more are refused
 *    (EAGAIN) until one is published or abandoned;
 *  - a connection that does not say HELLO is dropped after 5 s;
 *  - connections: 4096 (where the open-file limit allows as many: see
 *    broker_conns), more are refused with -EUSERS until some close.
 * The broker runs in this process; members that behave carry on.
 */
#include "test.h"
#include "helpers/raw_proto.h"
#include "helpers/seg_peer.h"

#include <sys/resource.h>

#define RESERVED_MAX 1024
#define CONNS_MAX 4096

static gpuipc_domain_t *dom;

static void reservations(void)
{
  int fd = raw_connect("limits");
  raw_hello(fd);
  struct gpuipc__msg r;
  uint64_t first = 0;
  for (int i = 0; i < RESERVED_MAX; i++) {
    char name[32];
    snprintf(name, sizeof(name), "res.%d", i);
    ASSERT_EQ(raw_open(fd, name, GPUIPC_CREATE, GPUIPC_KIND_HOST, 4096, &r),
              GPUIPC_MSG_CREATE_IT);
    if (i == 0)
      first = r.u.create_it.id;
  }
  ASSERT_EQ(raw_open(fd, "res.more", GPUIPC_CREATE, GPUIPC_KIND_HOST, 4096,
                     &r), GPUIPC_MSG_ERROR);
  ASSERT_EQ(r.u.error.code, -EAGAIN);
  /* Another member is not held back. */
  gpuipc_buf_t *b;
  ASSERT_OK(test_seg_open(dom, "other", 4096, -1, GPUIPC_CREATE, &b));
  /* One given back: one more may be reserved. */
  struct gpuipc__msg m;
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_ABANDON;
  m.u.abandon.id = first;
  raw_send(fd, &m, NULL, 0);
  ASSERT_EQ(raw_open(fd, "res.more", GPUIPC_CREATE, GPUIPC_KIND_HOST, 4096,
                     &r), GPUIPC_MSG_CREATE_IT);
  ASSERT_EQ(raw_open(fd, "res.more2", GPUIPC_CREATE, GPUIPC_KIND_HOST, 4096,
                     &r), GPUIPC_MSG_ERROR);
  close(fd); /* its reservations go with it */
  ASSERT_OK(gpuipc_buf_release(b));
  ASSERT_OK(gpuipc_segment_unlink(dom, "other"));
  gpuipc_segment_info_t s = {.size = sizeof(s)};
  for (int tries = 0; tries < 3000; tries++) {
    if (gpuipc_segment_stat(dom, "res.0", &s) == -ENOENT &&
        gpuipc_segment_stat(dom, "res.more", &s) == -ENOENT)
      break;
    usleep(10000);
  }
  ASSERT_RC(gpuipc_segment_stat(dom, "res.more", &s), -ENOENT);
}

static void silent(void)
{
  int fd = raw_connect("limits");
  struct gpuipc__msg m;
  /* Well past the broker's 5 s: the end of the connection must come. */
  ASSERT_RC(raw_recv(fd, &m, NULL, NULL, 30000), GPUIPC_E_PEER_GONE);
  close(fd);
}

/* Connect and say HELLO: whether the broker welcomed us. */
static bool try_join(int *out)
{
  char why[GPUIPC__TEXT_MAX + 1] = "";
  int rc = raw_knock("limits", 10000, out, why, sizeof(why));
  if (rc == 1)
    return true;
  if (rc != -EUSERS)
    TFAIL("HELLO answered with %d (%s)", rc, why);
  return false;
}

/* Both ends of every connection live in this process, whose limit the
 * broker reads: the members' ends count among the descriptors it holds
 * besides its connections, and half of what the limit leaves beyond those
 * is kept for segments (broker_conns). */
static struct rlimit saved_rl;
static bool room;

static void make_room(void)
{
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved_rl), 0);
  rlim_t need = 3 * CONNS_MAX + 256;
  room = saved_rl.rlim_max >= need;
  if (!room)
    return;
  struct rlimit more = saved_rl;
  more.rlim_cur = need;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &more), 0);
}

static void connections(void)
{
  if (!room) {
    printf("connections: skipped (RLIMIT_NOFILE hard limit %llu)\n",
           (unsigned long long)saved_rl.rlim_max);
    return;
  }
  static int fds[CONNS_MAX + 1];
  int n = 0;
  /* Our own member's connection is one of them. */
  while (n < CONNS_MAX + 1 && try_join(&fds[n]))
    n++;
  ASSERT_EQ(n, CONNS_MAX - 1);
  /* Members already in carry on. */
  gpuipc_domain_info_t di = {.size = sizeof(di)};
  ASSERT_OK(gpuipc_domain_info(dom, &di));
  ASSERT_EQ(di.members, CONNS_MAX);
  /* One leaves: one more may come in. */
  close(fds[--n]);
  int fd = -1;
  bool in = false;
  for (int tries = 0; tries < 3000 && !in; tries++) {
    in = try_join(&fd);
    if (!in)
      usleep(10000);
  }
  ASSERT_TRUE(in);
  close(fd);
  for (int i = 0; i < n; i++)
    close(fds[i]);
}

int main(void)
{
  make_room();
  ASSERT_OK(gpuipc_domain_join("limits", NULL, &dom));
  reservations();
  silent();
  connections();
  domain_wait_members(dom, 1);
  ASSERT_OK(gpuipc_domain_leave(dom));
  printf("broker_limits: ok\n");
  return 0;
}
