/*
 * Joining and leaving domains: name rules, the first member hosts the
 * broker, others connect to it, a stale socket is cleaned up, a held lock
 * without a listener makes joiners wait, and nothing leaks. (The join's
 * growth of the descriptor table: tests/fd_table.c.)
 */
#include "test.h"
#include "helpers/seg_peer.h"

#include "domain/domain.h"
#include "os/os.h"

#include <sys/socket.h>

static void check_bad_name(const char *name, const char *mention)
{
  gpuipc_domain_t *d = (gpuipc_domain_t *)0x1;
  ASSERT_RC(gpuipc_domain_join(name, NULL, &d), -EINVAL);
  ASSERT_ERR_MENTIONS(mention);
  ASSERT_PTR_EQ(d, (gpuipc_domain_t *)0x1); /* untouched on failure */
}

static void names(void)
{
  char long_name[80];
  memset(long_name, 'a', 64);
  long_name[64] = '\0';
  check_bad_name(long_name, "longer than 63");
  check_bad_name("", "empty");
  check_bad_name(".hidden", "starts with '.'");
  check_bad_name("a/b", "not allowed");
  check_bad_name("a b", "not allowed");
  check_bad_name("caf\xc3\xa9", "not allowed");
  ASSERT_RC(gpuipc_domain_join("ok", NULL, NULL), -EINVAL);
  gpuipc_domain_opts_t o = {.size = 4};
  gpuipc_domain_t *d;
  ASSERT_RC(gpuipc_domain_join("ok", &o, &d), -EINVAL);
  ASSERT_ERR_MENTIONS("size");
  o = (gpuipc_domain_opts_t){sizeof(o), 0x80, 0};
  ASSERT_RC(gpuipc_domain_join("ok", &o, &d), -EINVAL);
  ASSERT_ERR_MENTIONS("flags");
  ASSERT_RC(gpuipc_domain_leave(NULL), -EINVAL);
  /* 63 characters of every allowed kind are a good name... */
  char good[64];
  const char *alpha = "AZaz09._-";
  for (int i = 0; i < 63; i++)
    good[i] = alpha[i % 9];
  good[63] = '\0';
  ASSERT_OK(gpuipc__name_check(good, "name"));
  ASSERT_OK(gpuipc__name_check("a", "name"));
  /* ...however deep the runtime directory (a Unix socket path holds 107
   * bytes, the socket is reached through its directory). */
  ASSERT_OK(gpuipc_domain_join(good, NULL, &d));
  ASSERT_OK(gpuipc_domain_leave(d));
}

static void info(gpuipc_domain_t *d, gpuipc_domain_info_t *i)
{
  memset(i, 0, sizeof(*i));
  i->size = sizeof(*i);
  ASSERT_OK(gpuipc_domain_info(d, i));
}

static void first_hosts(void)
{
  gpuipc_domain_t *a, *b;
  gpuipc_domain_info_t i;
  ASSERT_OK(gpuipc_domain_join("j1", NULL, &a));
  info(a, &i);
  ASSERT_EQ(i.hosts_broker, 1);
  ASSERT_EQ(i.broker_pid, getpid());
  ASSERT_EQ(i.members, 1);
  ASSERT_STREQ(i.name, "j1");
  ASSERT_TRUE(i.epoch != 0);
  uint64_t epoch = i.epoch;

  /* A second member in this process is a plain client. */
  ASSERT_OK(gpuipc_domain_join("j1", NULL, &b));
  info(b, &i);
  ASSERT_EQ(i.hosts_broker, 0);
  ASSERT_EQ(i.broker_pid, getpid());
  ASSERT_EQ(i.members, 2);
  ASSERT_EQ_U(i.epoch, epoch);

  /* And one in another process. */
  struct peer p;
  peer_start(&p);
  const char *r = peer_cmd(&p, "join j1");
  ASSERT_TRUE(strncmp(r, "ok", 2) == 0);
  r = peer_cmd(&p, "info");
  int bpid, hosts, members, segs, fds;
  ASSERT_EQ(sscanf(r, "ok %d %d %d %d %d", &bpid, &hosts, &members, &segs,
                   &fds), 5);
  ASSERT_EQ(bpid, getpid());
  ASSERT_EQ(hosts, 0);
  ASSERT_EQ(members, 3);
  PEER_OK(&p, "leave");
  peer_finish(&p);
  domain_wait_members(a, 2);

  ASSERT_OK(gpuipc_domain_leave(b));
  ASSERT_OK(gpuipc_domain_leave(a));
}

/* A socket file left by a dead broker does not stop the next one. */
static void stale_socket(void)
{
  struct gpuipc__dom_paths paths;
  ASSERT_OK(gpuipc__dom_paths("stale", &paths));
  int s; /* any runtime directory, however deep */
  ASSERT_OK(gpuipc__sock_listen(paths.sock, 1, &s));
  close(s); /* the file stays, nobody listens */
  ASSERT_EQ(access(paths.sock, F_OK), 0);

  gpuipc_domain_t *d;
  ASSERT_OK(gpuipc_domain_join("stale", NULL, &d));
  gpuipc_domain_info_t i;
  info(d, &i);
  ASSERT_EQ(i.hosts_broker, 1);
  ASSERT_OK(gpuipc_domain_leave(d));
  /* The last member's leave closes the domain and removes the socket. */
  ASSERT_EQ(access(paths.sock, F_OK), -1);
}

/* The lock is held but nobody listens: a joiner waits, then times out. */
static void held_lock(void)
{
  struct gpuipc__dom_paths paths;
  ASSERT_OK(gpuipc__dom_paths("busy", &paths));
  int lock;
  ASSERT_OK(gpuipc__flock_open(paths.lock, 0, &lock));
  gpuipc_domain_t *d;
  gpuipc_domain_opts_t o = {sizeof(o), 0, 300};
  ASSERT_RC(gpuipc_domain_join("busy", &o, &d), -ETIMEDOUT);
  ASSERT_ERR_MENTIONS("busy");
  close(lock);
  ASSERT_OK(gpuipc_domain_join("busy", &o, &d));
  ASSERT_OK(gpuipc_domain_leave(d));
}

/* The domain's timeout follows the segments' rule (0 as the default). */
static void timeouts(void)
{
  gpuipc_domain_t *d = (gpuipc_domain_t *)0x1;
  gpuipc_domain_opts_t o = {sizeof(o), 0, GPUIPC_TIMEOUT_DEFAULT - 1};
  ASSERT_RC(gpuipc_domain_join("tmo", &o, &d), -EINVAL);
  ASSERT_ERR_MENTIONS("timeout_ms");
  ASSERT_PTR_EQ(d, (gpuipc_domain_t *)0x1);
  gpuipc_domain_t *dflt;
  ASSERT_OK(gpuipc_domain_join("tmo", NULL, &dflt));
  ASSERT_GT(gpuipc__dom_timeout(dflt), 0);
  const int in[] = {GPUIPC_TIMEOUT_DEFAULT, 0, GPUIPC_TIMEOUT_FOREVER, 250};
  const int want[] = {gpuipc__dom_timeout(dflt), gpuipc__dom_timeout(dflt),
                      -1, 250};
  for (size_t i = 0; i < 4; i++) {
    o.timeout_ms = in[i];
    ASSERT_OK(gpuipc_domain_join("tmo", &o, &d));
    ASSERT_EQ(gpuipc__dom_timeout(d), want[i]);
    ASSERT_OK(gpuipc_domain_leave(d));
  }
  ASSERT_OK(gpuipc_domain_leave(dflt));
}

static void no_broker(void)
{
  gpuipc_domain_t *d;
  gpuipc_domain_opts_t o = {sizeof(o), GPUIPC_JOIN_NO_BROKER, 1000};
  ASSERT_RC(gpuipc_domain_join("nobody", &o, &d), -ENOENT);
  ASSERT_ERR_MENTIONS("no broker");
  gpuipc_domain_t *host;
  ASSERT_OK(gpuipc_domain_join("nobody", NULL, &host));
  ASSERT_OK(gpuipc_domain_join("nobody", &o, &d));
  gpuipc_domain_info_t i;
  info(d, &i);
  ASSERT_EQ(i.hosts_broker, 0);
  ASSERT_OK(gpuipc_domain_leave(d));
  ASSERT_OK(gpuipc_domain_leave(host));
}

int main(void)
{
  test_warm_driver(); /* count descriptors with the driver's included */
  /* Settle lazily opened descriptors (settings, runtime directory). */
  gpuipc_domain_t *warm;
  ASSERT_OK(gpuipc_domain_join("warm", NULL, &warm));
  ASSERT_OK(gpuipc_domain_leave(warm));
  int fds = test_count_fds(0);

  names();
  first_hosts();
  stale_socket();
  held_lock();
  timeouts();
  no_broker();

  ASSERT_EQ(test_count_fds(0), fds);
  printf("domain_join: ok\n");
  return 0;
}
