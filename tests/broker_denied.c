/*
 * Access control: a process of another uid is refused by the broker
 * (SO_PEERCRED) with GPUIPC_E_DENIED, and the broker logs who it refused;
 * GPUIPC_ALLOW_UIDS and GPUIPC_ALLOW_GIDS let it in.
 *
 * The refusal tested must be the broker's, not the file system's: the
 * runtime directory is private (0700) to its owner, so the other uid gets
 * a directory of its own inside ours (ours made traversable, 0711) and a
 * hard link there to our domain's socket, writable by all. It connects,
 * and then only SO_PEERCRED stands in its way.
 *
 * The refusal must reach the member however the HELLO and the answer
 * cross: a broker that answers (late) while the HELLO waits unread in the
 * socket must not reset the connection by closing it, and a member reset
 * that way (by a broker of an older gpuipc) still reads the refusal queued
 * before the reset.
 *
 * A member that GPUIPC_ALLOW_UIDS lets in never takes the domain over.
 *
 * Needs root to change uid (the first check does not); exits 77 otherwise.
 */
#include "test.h"
#include "helpers/raw_proto.h"
#include "helpers/seg_peer.h"

#include <dirent.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define NOBODY 65534

static char root_dir[64];
static char nobody_dir[96];

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char warnings[8192];

static void log_sink(gpuipc_log_level_t level, const char *msg, void *user)
{
  (void)user;
  if (level != GPUIPC_LOG_WARN)
    return;
  pthread_mutex_lock(&log_mu);
  size_t n = strlen(warnings);
  snprintf(warnings + n, sizeof(warnings) - n, "%s\n", msg);
  pthread_mutex_unlock(&log_mu);
}

/* Make domain @dom's socket reachable from the other uid's directory. */
static void expose(const char *dom)
{
  char from[160], to[160];
  snprintf(from, sizeof(from), "%s/%s.sock", root_dir, dom);
  snprintf(to, sizeof(to), "%s/%s.sock", nobody_dir, dom);
  if (link(from, to) != 0)
    TFAIL("link %s %s: %s", from, to, strerror(errno));
  ASSERT_EQ(chmod(to, 0666), 0);
}

/* A peer of uid NOBODY whose runtime directory is nobody_dir. */
static void start_nobody(struct peer *p)
{
  peer_start(p);
  PEER_OK(p, "setenv GPUIPC_DIR %s", nobody_dir);
  const char *r = peer_cmd(p, "setuid %d", NOBODY);
  if (strncmp(r, "ok", 2) != 0) {
    kill(p->pid, SIGKILL);
    SKIP("cannot change uid: %s", r);
  }
}

/*
 * A broker as gpuipc's were before: it refuses a connection once the
 * member's HELLO has arrived, without reading it, and closes it -- which
 * resets it (ECONNRESET) with the refusal queued in front of the member.
 * The member (rude_member) is stopped meanwhile, so that it reads the
 * refusal only after the reset.
 */
static atomic_bool rude_stop;
static pid_t rude_member;

static void *rude_broker(void *arg)
{
  int lfd = *(int *)arg;
  while (!atomic_load(&rude_stop)) {
    int fd;
    if (gpuipc__sock_accept(lfd, 100, &fd) != 0)
      continue;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 10000) != 1)
      TFAIL("no HELLO arrived in 10 s");
    if (kill(rude_member, SIGSTOP) != 0)
      TFAIL("kill SIGSTOP: %s", strerror(errno));
    int st;
    if (waitpid(rude_member, &st, WUNTRACED) != rude_member ||
        !WIFSTOPPED(st))
      TFAIL("pid %d did not stop", (int)rude_member);
    struct gpuipc__msg m = {.type = GPUIPC_MSG_DENIED, .req = 1};
    snprintf(m.u.denied.reason, sizeof(m.u.denied.reason), "rude refusal");
    raw_send(fd, &m, NULL, 0);
    close(fd);
    if (kill(rude_member, SIGCONT) != 0)
      TFAIL("kill SIGCONT: %s", strerror(errno));
  }
  return NULL;
}

/* 0. A member reads a refusal that came with a reset. */
static void refusal_then_reset(void)
{
  int lock, lfd;
  ASSERT_OK(gpuipc__broker_claim("rude", &lock, &lfd, NULL));
  struct peer p;
  peer_start(&p);
  rude_member = p.pid;
  PEER_OK(&p, "setenv GPUIPC_TIMEOUT_MS 5000");
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, NULL, rude_broker, &lfd), 0);
  /* nobroker or not: the broker is there and answered */
  const char *r = peer_cmd(&p, "join rude nobroker");
  if (strncmp(r, "err GPUIPC_E_DENIED", 19) != 0 ||
      strstr(r, "rude refusal") == NULL)
    TFAIL("join after a refusal and a reset: %s", r);
  r = peer_cmd(&p, "join rude");
  if (strncmp(r, "err GPUIPC_E_DENIED", 19) != 0 ||
      strstr(r, "rude refusal") == NULL)
    TFAIL("join after a refusal and a reset: %s", r);
  atomic_store(&rude_stop, true);
  pthread_join(t, NULL);
  peer_finish(&p);
  close(lfd);
  close(lock);
}

/*
 * 4. A broker that answers while the HELLO waits unread: a peer of uid
 * NOBODY hosting domain "late" in nobody_dir, stopped while we (root,
 * whom it refuses) connect and say HELLO. Once it runs again we must read
 * its refusal and then the end of the connection, not a reset.
 */
static void refusal_after_hello(void)
{
  struct peer host;
  start_nobody(&host);
  PEER_OK(&host, "join late");
  char path[160];
  snprintf(path, sizeof(path), "%s/late.sock", nobody_dir);
  ASSERT_EQ(kill(host.pid, SIGSTOP), 0);
  int st;
  ASSERT_EQ(waitpid(host.pid, &st, WUNTRACED), host.pid);
  ASSERT_TRUE(WIFSTOPPED(st));
  int fd;
  ASSERT_OK(gpuipc__sock_connect(path, 5000, &fd));
  struct gpuipc__msg m = {.type = GPUIPC_MSG_HELLO, .req = 1};
  m.u.hello.pid = (uint32_t)getpid();
  m.u.hello.token = 1;
  ASSERT_OK(raw_send(fd, &m, NULL, 0));
  ASSERT_EQ(kill(host.pid, SIGCONT), 0);
  int rc = raw_recv(fd, &m, NULL, NULL, 10000);
  if (rc != 0)
    TFAIL("reading the refusal: %s", gpuipc_last_error());
  ASSERT_EQ(m.type, GPUIPC_MSG_DENIED);
  if (strstr(m.u.denied.reason, "refuses uid 0 (broker uid 65534") == NULL)
    TFAIL("the refusal does not say which uid: %s", m.u.denied.reason);
  /* The end (EOF), not a reset: the broker did not close on our HELLO. */
  char c;
  ssize_t n = recv(fd, &c, 1, 0);
  if (n != 0)
    TFAIL("after the refusal: recv returned %zd (%s), expected the end",
          n, n < 0 ? strerror(errno) : "a message");
  close(fd);
  PEER_OK(&host, "leave");
  peer_finish(&host);
}

/* A root peer hosting domain @dom with setting @var=@val. */
static void start_host(struct peer *p, const char *dom, const char *var,
                       const char *val)
{
  peer_start(p);
  PEER_OK(p, "setenv GPUIPC_DIR %s", root_dir);
  PEER_OK(p, "setenv %s %s", var, val);
  PEER_OK(p, "join %s", dom);
  PEER_EXPECT(p, "ok", "open pub 4096 c");
  PEER_OK(p, "fill pub 9");
  expose(dom);
}

/* How many of process @pid's descriptors are memfds (HOST memory). */
static int memfds_of(pid_t pid)
{
  char dir[64];
  snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
  DIR *d = opendir(dir);
  if (d == NULL)
    TFAIL("opendir %s: %s", dir, strerror(errno));
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    char path[320], target[256];
    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    ssize_t len = readlink(path, target, sizeof(target) - 1);
    if (len <= 0)
      continue;
    target[len] = '\0';
    n += strncmp(target, "/memfd:", 7) == 0;
  }
  closedir(d);
  return n;
}

/* A root member of domain @dom that GPUIPC_ALLOW_UIDS lets NOBODY into. */
static void start_mate(struct peer *p, const char *dom)
{
  peer_start(p);
  PEER_OK(p, "setenv GPUIPC_DIR %s", root_dir);
  PEER_OK(p, "setenv GPUIPC_ALLOW_UIDS %d", NOBODY);
  PEER_OK(p, "join %s", dom);
}

/*
 * 5. A hand-over never goes to another uid. The host's broker lets uid
 * NOBODY in; NOBODY's member, which may host and is the oldest, is
 * connected when the host leaves. The domain goes to the root member that
 * joined after it; NOBODY's member hosts nothing and got no segment's
 * descriptor, and both go on using the domain. With no root member left
 * the domain ends as if no member were: NOBODY's member gets nothing of
 * it (it hosts a domain of its own, in its own directory).
 */
static void handoff_other_uid(void)
{
  char allow[16];
  snprintf(allow, sizeof(allow), "%d", NOBODY);
  struct peer host, nb, mate;
  start_host(&host, "hand", "GPUIPC_ALLOW_UIDS", allow);
  start_nobody(&nb);
  PEER_OK(&nb, "join hand");
  int memfds = memfds_of(nb.pid);
  start_mate(&mate, "hand");
  PEER_OK(&mate, "open pub 4096 -");
  PEER_OK(&host, "leave");
  peer_finish(&host);
  /* Each one's next request goes to the broker it reconnected to. */
  struct peer_info ni, mi;
  peer_info(&nb, &ni);
  if (ni.hosts || ni.broker_pid == nb.pid)
    TFAIL("uid %d's member (pid %d) took the domain over", NOBODY,
          (int)nb.pid);
  if (memfds_of(nb.pid) != memfds)
    TFAIL("uid %d's member (pid %d) holds %d memfds, %d before the "
          "hand-over", NOBODY, (int)nb.pid, memfds_of(nb.pid), memfds);
  peer_info(&mate, &mi);
  ASSERT_EQ(mi.hosts, 1);
  ASSERT_EQ(ni.broker_pid, (int)mate.pid);
  ASSERT_EQ(mi.segments, 1);
  PEER_OK(&mate, "check pub 9");
  struct peer late;
  start_mate(&late, "hand");
  PEER_OK(&late, "open pub 4096 -");
  PEER_OK(&late, "check pub 9");
  PEER_OK(&late, "leave");
  peer_finish(&late);
  PEER_OK(&nb, "open pub 4096 -");
  PEER_OK(&nb, "check pub 9");
  PEER_OK(&nb, "leave");
  peer_finish(&nb);
  PEER_OK(&mate, "leave");
  peer_finish(&mate);

  start_host(&host, "alone", "GPUIPC_ALLOW_UIDS", allow);
  start_nobody(&nb);
  PEER_OK(&nb, "join alone");
  memfds = memfds_of(nb.pid);
  PEER_OK(&host, "leave");
  peer_finish(&host);
  peer_info(&nb, &ni); /* its own domain, in nobody_dir */
  ASSERT_EQ(ni.hosts, 1);
  ASSERT_EQ(ni.segments, 0);
  ASSERT_EQ(memfds_of(nb.pid), memfds);
  PEER_EXPECT(&nb, "err ENOENT", "open pub 0 -");
  start_mate(&mate, "alone");
  peer_info(&mate, &mi);
  ASSERT_EQ(mi.hosts, 1);
  ASSERT_EQ(mi.members, 1);
  ASSERT_EQ(mi.segments, 0);
  PEER_OK(&mate, "leave");
  peer_finish(&mate);
  PEER_OK(&nb, "leave");
  peer_finish(&nb);
}

static void remove_root_dir(void)
{
  char cmd[200];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", root_dir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", root_dir);
}

int main(void)
{
  snprintf(root_dir, sizeof(root_dir), "/tmp/gpuipc-denied-XXXXXX");
  if (mkdtemp(root_dir) == NULL)
    TFAIL("mkdtemp: %s", strerror(errno));
  /* Before the first gpuipc call, which reads the settings. */
  setenv("GPUIPC_DIR", root_dir, 1);
  ASSERT_OK(gpuipc_log_set(log_sink, GPUIPC_LOG_WARN, NULL));

  refusal_then_reset();
  if (geteuid() != 0) {
    remove_root_dir();
    SKIP("changing uid needs root (running as uid %u)", (unsigned)geteuid());
  }
  ASSERT_EQ(chmod(root_dir, 0711), 0);
  snprintf(nobody_dir, sizeof(nobody_dir), "%s/nobody", root_dir);
  ASSERT_EQ(mkdir(nobody_dir, 0700), 0);
  ASSERT_EQ(chown(nobody_dir, NOBODY, NOBODY), 0);

  /* 1. Our broker, default settings: the other uid is refused. */
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("deny", NULL, &dom));
  gpuipc_buf_t *b;
  ASSERT_OK(test_seg_open(dom, "secret", 4096, -1, GPUIPC_CREATE, &b));
  expose("deny");
  struct peer nb;
  start_nobody(&nb);
  const char *r = peer_cmd(&nb, "join deny nobroker");
  if (strncmp(r, "err GPUIPC_E_DENIED", 19) != 0)
    TFAIL("join as uid %d: %s", NOBODY, r);
  if (strstr(r, "refuses uid 65534") == NULL)
    TFAIL("the refusal does not say which uid: %s", r);
  /* Without nobroker it would not try to become the broker either: the
   * broker is there and answered. */
  r = peer_cmd(&nb, "join deny");
  if (strncmp(r, "err GPUIPC_E_DENIED", 19) != 0)
    TFAIL("join as uid %d: %s", NOBODY, r);
  char who[64];
  snprintf(who, sizeof(who), "refused pid %d (uid %d", (int)nb.pid, NOBODY);
  pthread_mutex_lock(&log_mu);
  if (strstr(warnings, who) == NULL)
    TFAIL("the broker did not log \"%s\"; it logged:\n%s", who, warnings);
  pthread_mutex_unlock(&log_mu);
  gpuipc_domain_info_t di = {.size = sizeof(di)};
  ASSERT_OK(gpuipc_domain_info(dom, &di));
  ASSERT_EQ(di.members, 1);
  peer_finish(&nb);

  /* 2. A broker with GPUIPC_ALLOW_UIDS lets it in; it maps a segment. */
  struct peer host;
  start_host(&host, "allow", "GPUIPC_ALLOW_UIDS", "1,65534");
  start_nobody(&nb);
  PEER_OK(&nb, "join allow nobroker");
  PEER_OK(&nb, "open pub 4096 -");
  PEER_OK(&nb, "check pub 9");
  PEER_OK(&nb, "leave");
  peer_finish(&nb);
  PEER_OK(&host, "leave");
  peer_finish(&host);

  /* 3. And one with GPUIPC_ALLOW_GIDS, for its group. */
  start_host(&host, "allowg", "GPUIPC_ALLOW_GIDS", "65534");
  start_nobody(&nb);
  PEER_OK(&nb, "join allowg nobroker");
  PEER_OK(&nb, "open pub 0 -");
  PEER_OK(&nb, "check pub 9");
  PEER_OK(&nb, "leave");
  peer_finish(&nb);
  PEER_OK(&host, "leave");
  peer_finish(&host);

  refusal_after_hello();
  handoff_other_uid();

  ASSERT_OK(gpuipc_buf_release(b));
  ASSERT_OK(gpuipc_domain_leave(dom));
  remove_root_dir();
  printf("broker_denied: ok\n");
  return 0;
}
