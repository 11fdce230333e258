/*
 * Unix SOCK_SEQPACKET sockets: messages with descriptors between processes,
 * refusal of what does not fit (without leaking a descriptor), a receiver
 * with no descriptor free (EMFILE, not "too many descriptors"), timeouts,
 * EINTR, a peer that goes away, connect errors and peer credentials.
 */
#include "test.h"

#include "os/os.h"

#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define TIMEOUT_MS 20000

static char rundir[PATH_MAX];

static uint64_t fnv1a(const uint8_t *p, size_t n)
{
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++)
    h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

static void assert_cloexec(int fd)
{
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
}

static pid_t spawn_with_fd(const char *mode, int fd, const char *extra)
{
  char fdarg[16];
  snprintf(fdarg, sizeof(fdarg), "%d", fd);
  const char *args[] = {mode, fdarg, extra, NULL};
  int keep[] = {fd, -1};
  return test_spawn("os_sock_peer", args, keep);
}

/* A memfd, a pipe and an eventfd cross to another process and work there. */
static void pass_three_fds(void)
{
  const size_t size = 3 * 4096 + 77;
  const unsigned seed = 11;
  int before = test_count_fds(0);

  int sv[2];
  ASSERT_OK(gpuipc__sock_pair(sv));
  assert_cloexec(sv[0]);
  assert_cloexec(sv[1]);

  int mfd;
  ASSERT_OK(gpuipc__memfd_create("socket-test", size, &mfd));
  uint8_t *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
  ASSERT_TRUE(p != MAP_FAILED);
  test_fill(p, size, seed);
  uint64_t want = fnv1a(p, size);
  munmap(p, size);
  int pfd[2];
  ASSERT_EQ(pipe2(pfd, O_CLOEXEC), 0);
  int efd = eventfd(0, EFD_CLOEXEC);
  ASSERT_GE(efd, 0);

  pid_t pid = spawn_with_fd("recv3", sv[1], NULL);
  close(sv[1]);

  char msg[64];
  int len = snprintf(msg, sizeof(msg), "memfd %zu %u", size, seed);
  int fds[3] = {mfd, pfd[1], efd};
  ASSERT_OK(gpuipc__sock_send(sv[0], msg, (size_t)len + 1, fds, 3,
                              TIMEOUT_MS));
  /* Sending does not take the caller's descriptors. */
  for (int i = 0; i < 3; i++)
    assert_cloexec(fds[i]);
  close(pfd[1]); /* the helper's copy is the last writer now */

  char reply[8] = {0};
  ASSERT_EQ(gpuipc__sock_recv(sv[0], reply, sizeof(reply), NULL, NULL,
                              TIMEOUT_MS), 5);
  ASSERT_STREQ(reply, "done");

  char line[64] = {0};
  size_t got = 0;
  for (;;) {
    ssize_t n = read(pfd[0], line + got, sizeof(line) - 1 - got);
    if (n < 0 && errno == EINTR)
      continue;
    ASSERT_GE(n, 0);
    if (n == 0)
      break;
    got += (size_t)n;
  }
  char expect[64];
  snprintf(expect, sizeof(expect), "sum %016llx\n", (unsigned long long)want);
  ASSERT_STREQ(line, expect);
  uint64_t v = 0;
  ASSERT_EQ(read(efd, &v, sizeof(v)), sizeof(v));
  ASSERT_EQ_U(v, 7);

  ASSERT_EQ(test_wait(pid, TIMEOUT_MS), 0);
  close(pfd[0]);
  close(efd);
  close(mfd);
  close(sv[0]);
  ASSERT_EQ(test_count_fds(0), before);
}

static void open_n(int *fds, int n)
{
  for (int i = 0; i < n; i++) {
    fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fds[i], 0);
  }
}

static void close_n(int *fds, int n)
{
  for (int i = 0; i < n; i++)
    close(fds[i]);
}

/* Send @count descriptors in one message, bypassing gpuipc's own limit. */
static void raw_send_fds(int sock, const int *fds, int count)
{
  char ctl[CMSG_SPACE(sizeof(int) * 64)];
  memset(ctl, 0, sizeof(ctl));
  struct iovec iov = {.iov_base = "raw", .iov_len = 4};
  size_t bytes = sizeof(int) * (size_t)count;
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
                       .msg_controllen = CMSG_SPACE(bytes)};
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(bytes);
  memcpy(CMSG_DATA(c), fds, bytes);
  ASSERT_EQ(sendmsg(sock, &msg, MSG_NOSIGNAL), 4);
}

/* Whatever does not fit is refused, every descriptor that came is closed,
 * and the next message is unaffected. */
static void refuse_what_does_not_fit(void)
{
  int sv[2];
  ASSERT_OK(gpuipc__sock_pair(sv));
  int five[5];
  open_n(five, 5);
  char buf[128];

  /* Five descriptors, room for two. */
  ASSERT_OK(gpuipc__sock_send(sv[0], "five", 5, five, 5, TIMEOUT_MS));
  int before = test_count_fds(0);
  int got[2] = {-1, -1};
  int nfds = 2;
  ASSERT_EQ(gpuipc__sock_recv(sv[1], buf, sizeof(buf), got, &nfds,
                              TIMEOUT_MS), GPUIPC_E_PROTO);
  ASSERT_ERR_MENTIONS("5 descriptor(s), room for 2");
  ASSERT_EQ(test_count_fds(0), before);
  ASSERT_EQ(nfds, 2); /* outputs untouched on failure */
  ASSERT_EQ(got[0], -1);

  /* The stream goes on: the next message arrives whole. */
  ASSERT_OK(gpuipc__sock_send(sv[0], "next", 5, five, 1, TIMEOUT_MS));
  nfds = 2;
  ASSERT_EQ(gpuipc__sock_recv(sv[1], buf, sizeof(buf), got, &nfds,
                              TIMEOUT_MS), 5);
  ASSERT_STREQ(buf, "next");
  ASSERT_EQ(nfds, 1);
  assert_cloexec(got[0]);
  close(got[0]);

  /* No room at all (nfds NULL): a message with descriptors is refused. */
  ASSERT_OK(gpuipc__sock_send(sv[0], "two", 4, five, 2, TIMEOUT_MS));
  before = test_count_fds(0);
  ASSERT_EQ(gpuipc__sock_recv(sv[1], buf, sizeof(buf), NULL, NULL,
                              TIMEOUT_MS), GPUIPC_E_PROTO);
  ASSERT_EQ(test_count_fds(0), before);

  /* More descriptors than any gpuipc message carries (MSG_CTRUNC). */
  int many[GPUIPC_FDS_MAX + 4];
  open_n(many, GPUIPC_FDS_MAX + 4);
  raw_send_fds(sv[0], many, GPUIPC_FDS_MAX + 4);
  close_n(many, GPUIPC_FDS_MAX + 4);
  before = test_count_fds(0);
  int room[GPUIPC_FDS_MAX];
  nfds = GPUIPC_FDS_MAX;
  ASSERT_EQ(gpuipc__sock_recv(sv[1], buf, sizeof(buf), room, &nfds,
                              TIMEOUT_MS), GPUIPC_E_PROTO);
  ASSERT_ERR_MENTIONS("more than 16 descriptors");
  ASSERT_EQ(test_count_fds(0), before);

  /* A message longer than the buffer (MSG_TRUNC), with descriptors. */
  char big[100];
  memset(big, 'x', sizeof(big));
  ASSERT_OK(gpuipc__sock_send(sv[0], big, sizeof(big), five, 3, TIMEOUT_MS));
  before = test_count_fds(0);
  nfds = 4;
  ASSERT_EQ(gpuipc__sock_recv(sv[1], buf, 10, room, &nfds, TIMEOUT_MS),
            GPUIPC_E_PROTO);
  ASSERT_ERR_MENTIONS("10-byte buffer");
  ASSERT_EQ(test_count_fds(0), before);
  /* Exactly the capacity fits. */
  ASSERT_OK(gpuipc__sock_send(sv[0], big, sizeof(big), NULL, 0, TIMEOUT_MS));
  ASSERT_EQ(gpuipc__sock_recv(sv[1], buf, sizeof(big), NULL, NULL,
                              TIMEOUT_MS), (ssize_t)sizeof(big));

  /* Argument checks, before anything is sent. */
  ASSERT_RC(gpuipc__sock_send(sv[0], "x", 0, NULL, 0, 0), -EINVAL);
  static char huge[GPUIPC_MSG_MAX + 1];
  ASSERT_RC(gpuipc__sock_send(sv[0], huge, sizeof(huge), NULL, 0, 0),
            -EMSGSIZE);
  ASSERT_OK(gpuipc__sock_send(sv[0], huge, GPUIPC_MSG_MAX, NULL, 0, 0));
  ASSERT_EQ(gpuipc__sock_recv(sv[1], huge, sizeof(huge), NULL, NULL,
                              TIMEOUT_MS), GPUIPC_MSG_MAX);
  ASSERT_RC(gpuipc__sock_send(sv[0], "x", 1, many, GPUIPC_FDS_MAX + 1, 0),
            -EINVAL);
  ASSERT_RC(gpuipc__sock_send(sv[0], "x", 1, NULL, 1, 0), -EINVAL);
  int bad = -1;
  ASSERT_RC(gpuipc__sock_send(sv[0], "x", 1, &bad, 1, 0), -EBADF);
  nfds = GPUIPC_FDS_MAX + 1;
  ASSERT_RC((int)gpuipc__sock_recv(sv[1], buf, sizeof(buf), room, &nfds, 0),
            -EINVAL);
  nfds = -1;
  ASSERT_RC((int)gpuipc__sock_recv(sv[1], buf, sizeof(buf), room, &nfds, 0),
            -EINVAL);
  /* Nothing was queued by the refused sends. */
  ASSERT_RC((int)gpuipc__sock_recv(sv[1], buf, sizeof(buf), NULL, NULL, 0),
            -ETIMEDOUT);

  close_n(five, 5);
  close(sv[0]);
  close(sv[1]);
}

/* A receiver at its open-file limit gets -EMFILE and a sentence saying
 * so, loses no descriptor, and receives normally once it has room. */
static void no_descriptor_free(void)
{
  int sv[2];
  ASSERT_OK(gpuipc__sock_pair(sv));
  int three[3];
  open_n(three, 3);
  ASSERT_OK(gpuipc__sock_send(sv[0], "three", 6, three, 3, TIMEOUT_MS));
  ASSERT_OK(gpuipc__sock_send(sv[0], "again", 6, three, 3, TIMEOUT_MS));
  close_n(three, 3);
  int before = test_count_fds(0);

  struct rlimit rl, low;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
  low = rl;
  low.rlim_cur = 256;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  static int hog[256];
  int nhog = 0;
  while (nhog < 256 &&
         (hog[nhog] = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0)
    nhog++;
  ASSERT_EQ(errno, EMFILE);
  close(hog[--nhog]); /* room for one of the three */
  char buf[16];
  int got[GPUIPC_FDS_MAX], n = GPUIPC_FDS_MAX;
  ssize_t rc = gpuipc__sock_recv(sv[1], buf, sizeof(buf), got, &n, 0);
  close_n(hog, nhog);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
  ASSERT_EQ(rc, -EMFILE);
  ASSERT_ERR_MENTIONS("no descriptor free");
  ASSERT_EQ(test_count_fds(0), before);

  n = GPUIPC_FDS_MAX;
  ASSERT_EQ(gpuipc__sock_recv(sv[1], buf, sizeof(buf), got, &n, TIMEOUT_MS),
            6);
  ASSERT_EQ(n, 3);
  close_n(got, 3);
  close_n(sv, 2);
}

static void timeouts(void)
{
  int sv[2];
  ASSERT_OK(gpuipc__sock_pair(sv));
  char buf[16];
  ASSERT_RC((int)gpuipc__sock_recv(sv[0], buf, sizeof(buf), NULL, NULL, 0),
            -ETIMEDOUT);
  ASSERT_RC((int)gpuipc__sock_recv(sv[0], buf, sizeof(buf), NULL, NULL, 30),
            -ETIMEDOUT);
  ASSERT_ERR_MENTIONS("no message within 30 ms");

  /* Fill the socket until a send cannot proceed, then time out waiting. */
  static char chunk[GPUIPC_MSG_MAX];
  int rc = 0, sent = 0;
  for (int i = 0; i < 100000 && rc == 0; i++) {
    rc = gpuipc__sock_send(sv[0], chunk, sizeof(chunk), NULL, 0, 0);
    sent += rc == 0;
  }
  ASSERT_RC(rc, -ETIMEDOUT);
  ASSERT_GT(sent, 0);
  ASSERT_RC(gpuipc__sock_send(sv[0], chunk, sizeof(chunk), NULL, 0, 30),
            -ETIMEDOUT);
  /* Reading one message makes room again. */
  ASSERT_EQ(gpuipc__sock_recv(sv[1], chunk, sizeof(chunk), NULL, NULL,
                              TIMEOUT_MS), GPUIPC_MSG_MAX);
  ASSERT_OK(gpuipc__sock_send(sv[0], chunk, sizeof(chunk), NULL, 0,
                              TIMEOUT_MS));
  close(sv[0]);
  close(sv[1]);
}

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
  (void)sig;
  alarms++;
}

static void set_interval_timer(long us)
{
  struct itimerval it = {.it_interval = {0, us}, .it_value = {0, us}};
  ASSERT_EQ(setitimer(ITIMER_REAL, &it, NULL), 0);
}

/* Signals without SA_RESTART interrupt poll; timeouts still hold. */
static void survives_signals(void)
{
  struct sigaction sa = {.sa_handler = on_alarm}, old;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGALRM, &sa, &old), 0);
  int sv[2];
  ASSERT_OK(gpuipc__sock_pair(sv));
  char buf[16] = {0};

  alarms = 0;
  set_interval_timer(1000);
  ASSERT_RC((int)gpuipc__sock_recv(sv[0], buf, sizeof(buf), NULL, NULL, 100),
            -ETIMEDOUT);
  pid_t pid = spawn_with_fd("late", sv[1], "100");
  ssize_t n = gpuipc__sock_recv(sv[0], buf, sizeof(buf), NULL, NULL,
                                TIMEOUT_MS);
  set_interval_timer(0);
  ASSERT_GT(alarms, 0); /* the signals did arrive */
  ASSERT_EQ(n, 5);
  ASSERT_STREQ(buf, "late");
  ASSERT_EQ(test_wait(pid, TIMEOUT_MS), 0);
  ASSERT_EQ(sigaction(SIGALRM, &old, NULL), 0);
  close(sv[0]);
  close(sv[1]);
}

/* A peer that exits: PEER_GONE on recv and send, and no SIGPIPE. */
static void peer_goes_away(void)
{
  /* Default SIGPIPE: on kernels that raise it for SOCK_SEQPACKET (not all
   * do), a send without MSG_NOSIGNAL would kill this test. */
  ASSERT_TRUE(signal(SIGPIPE, SIG_DFL) != SIG_ERR);
  char buf[16];

  /* It exits having read nothing: ECONNRESET, then end of stream. */
  int sv[2];
  ASSERT_OK(gpuipc__sock_pair(sv));
  ASSERT_OK(gpuipc__sock_send(sv[0], "unread", 7, NULL, 0, TIMEOUT_MS));
  pid_t pid = spawn_with_fd("exit", sv[1], NULL);
  close(sv[1]);
  ASSERT_EQ(test_wait(pid, TIMEOUT_MS), 0);
  ASSERT_RC((int)gpuipc__sock_recv(sv[0], buf, sizeof(buf), NULL, NULL,
                                   TIMEOUT_MS), GPUIPC_E_PEER_GONE);
  ASSERT_RC((int)gpuipc__sock_recv(sv[0], buf, sizeof(buf), NULL, NULL,
                                   TIMEOUT_MS), GPUIPC_E_PEER_GONE);
  ASSERT_RC(gpuipc__sock_send(sv[0], "x", 1, NULL, 0, TIMEOUT_MS),
            GPUIPC_E_PEER_GONE);
  close(sv[0]);

  /* It exits with nothing pending: end of stream. */
  ASSERT_OK(gpuipc__sock_pair(sv));
  pid = spawn_with_fd("exit", sv[1], NULL);
  close(sv[1]);
  ASSERT_EQ(test_wait(pid, TIMEOUT_MS), 0);
  ASSERT_RC(gpuipc__sock_send(sv[0], "x", 1, NULL, 0, TIMEOUT_MS),
            GPUIPC_E_PEER_GONE);
  ASSERT_ERR_MENTIONS("closed its end");
  ASSERT_RC((int)gpuipc__sock_recv(sv[0], buf, sizeof(buf), NULL, NULL,
                                   TIMEOUT_MS), GPUIPC_E_PEER_GONE);
  close(sv[0]);
}

static void sock_path(char *out, size_t cap, const char *name)
{
  int n = snprintf(out, cap, "%s/%s", rundir, name);
  ASSERT_TRUE(n > 0 && (size_t)n < cap);
  unlink(out); /* left over from an earlier run */
}

/* A listener and a connecting process: credentials and a conversation. */
static void listen_accept_cred(void)
{
  char path[PATH_MAX];
  sock_path(path, sizeof(path), "socket-test.sock");
  int before = test_count_fds(0);
  int lfd;
  ASSERT_OK(gpuipc__sock_listen(path, 8, &lfd));
  assert_cloexec(lfd);

  char ppid[16];
  snprintf(ppid, sizeof(ppid), "%d", (int)getpid());
  const char *args[] = {"connect", path, ppid, NULL};
  pid_t pid = test_spawn("os_sock_peer", args, NULL);

  int cfd;
  ASSERT_OK(gpuipc__sock_accept(lfd, TIMEOUT_MS, &cfd));
  assert_cloexec(cfd);
  ASSERT_EQ(fcntl(cfd, F_GETFL) & O_NONBLOCK, 0);
  struct gpuipc__cred cred;
  ASSERT_OK(gpuipc__peer_cred(cfd, &cred));
  ASSERT_EQ(cred.pid, pid);
  ASSERT_EQ(cred.uid, getuid());
  ASSERT_EQ(cred.gid, getgid());

  char hello[32] = {0}, want[32];
  snprintf(want, sizeof(want), "hello %d", (int)pid);
  ASSERT_EQ(gpuipc__sock_recv(cfd, hello, sizeof(hello), NULL, NULL,
                              TIMEOUT_MS), (ssize_t)strlen(want) + 1);
  ASSERT_STREQ(hello, want);
  ASSERT_OK(gpuipc__sock_send(cfd, "bye", 4, NULL, 0, TIMEOUT_MS));
  ASSERT_EQ(test_wait(pid, TIMEOUT_MS), 0);

  /* Nobody else is coming. */
  int none = -1;
  ASSERT_RC(gpuipc__sock_accept(lfd, 20, &none), -ETIMEDOUT);
  ASSERT_EQ(none, -1);

  /* The path is taken while the socket file exists. */
  int again;
  ASSERT_RC(gpuipc__sock_listen(path, 8, &again), -EADDRINUSE);
  ASSERT_ERR_MENTIONS(path);

  close(cfd);
  close(lfd);
  /* The file outlives the listener: connecting is refused, not ENOENT. */
  int c2;
  ASSERT_RC(gpuipc__sock_connect(path, 0, &c2), -ECONNREFUSED);
  unlink(path);
  ASSERT_RC(gpuipc__sock_connect(path, 0, &c2), -ENOENT);
  ASSERT_ERR_MENTIONS(path);
  ASSERT_EQ(test_count_fds(0), before);
}

/* Listen, connect and accept at @path, then remove it. */
static void talk_at(const char *path)
{
  int lfd, cfd, afd;
  unlink(path);
  ASSERT_OK(gpuipc__sock_listen(path, 1, &lfd));
  ASSERT_OK(gpuipc__sock_connect(path, TIMEOUT_MS, &cfd));
  ASSERT_OK(gpuipc__sock_accept(lfd, TIMEOUT_MS, &afd));
  ASSERT_OK(gpuipc__sock_send(cfd, "x", 1, NULL, 0, TIMEOUT_MS));
  char c = 0;
  ASSERT_EQ(gpuipc__sock_recv(afd, &c, 1, NULL, NULL, TIMEOUT_MS), 1);
  ASSERT_EQ(c, 'x');
  close(afd);
  close(cfd);
  close(lfd);
  struct stat st;
  ASSERT_EQ(lstat(path, &st), 0); /* the file is where it was asked for */
  ASSERT_TRUE(S_ISSOCK(st.st_mode));
  ASSERT_EQ(unlink(path), 0);
}

/*
 * A Unix socket address holds 107 bytes and a terminating NUL; longer
 * paths are reached through their directory, so only a last component
 * longer than that fails.
 */
static void path_lengths(void)
{
  struct sockaddr_un sa;
  const size_t max = sizeof(sa.sun_path) - 1;
  char path[512];
  int fd;

  int base = snprintf(path, sizeof(path), "%s/", rundir);
  if ((size_t)base + 1 <= max) {
    memset(path + base, 'p', max - (size_t)base);
    path[max] = '\0';
    talk_at(path); /* exactly 107 bytes */
    path[max] = 'p';
    path[max + 1] = '\0';
    talk_at(path); /* 108 */
  }
  /* 200 bytes of directories under the runtime directory. */
  int n = snprintf(path, sizeof(path), "%s", rundir);
  while ((size_t)n < strlen(rundir) + 200) {
    n += snprintf(path + n, sizeof(path) - (size_t)n, "/deep-dir-0123456789");
    ASSERT_TRUE(mkdir(path, 0700) == 0 || errno == EEXIST);
  }
  snprintf(path + n, sizeof(path) - (size_t)n, "/s.sock");
  printf("socket at a %zu-byte path\n", strlen(path));
  talk_at(path);

  memset(path, 'a', 300);
  path[0] = '/';
  path[300] = '\0';
  ASSERT_RC(gpuipc__sock_listen(path, 1, &fd), -ENAMETOOLONG);
  ASSERT_ERR_MENTIONS("300 bytes");
  ASSERT_RC(gpuipc__sock_connect(path, 0, &fd), -ENAMETOOLONG);
  ASSERT_ERR_MENTIONS("300 bytes");
  ASSERT_RC(gpuipc__sock_connect("", 0, &fd), -EINVAL);
  ASSERT_RC(gpuipc__sock_connect(NULL, 0, &fd), -EINVAL);
}

struct late_accept {
  int lfd;
  int accepted;
};

static void *accept_later(void *arg)
{
  struct late_accept *la = arg;
  struct timespec ts = {0, 50 * 1000000L};
  nanosleep(&ts, NULL);
  int fd;
  if (gpuipc__sock_accept(la->lfd, TIMEOUT_MS, &fd) == 0)
    la->accepted = fd;
  return NULL;
}

/* A full backlog makes connect retry until there is room or time is up. */
static void full_backlog(void)
{
  char path[PATH_MAX];
  sock_path(path, sizeof(path), "socket-backlog.sock");
  int lfd, a, b;
  ASSERT_OK(gpuipc__sock_listen(path, 0, &lfd));
  ASSERT_OK(gpuipc__sock_connect(path, 0, &a));
  ASSERT_RC(gpuipc__sock_connect(path, 0, &b), -ETIMEDOUT);
  ASSERT_ERR_MENTIONS("backlog");
  ASSERT_RC(gpuipc__sock_connect(path, 30, &b), -ETIMEDOUT);

  struct late_accept la = {.lfd = lfd, .accepted = -1};
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, NULL, accept_later, &la), 0);
  ASSERT_OK(gpuipc__sock_connect(path, TIMEOUT_MS, &b));
  ASSERT_EQ(pthread_join(t, NULL), 0);
  ASSERT_GE(la.accepted, 0);

  /* The one accepted is the first: it carries the first client's message. */
  ASSERT_OK(gpuipc__sock_send(a, "first", 6, NULL, 0, TIMEOUT_MS));
  char buf[8] = {0};
  ASSERT_EQ(gpuipc__sock_recv(la.accepted, buf, sizeof(buf), NULL, NULL,
                              TIMEOUT_MS), 6);
  ASSERT_STREQ(buf, "first");
  int c;
  ASSERT_OK(gpuipc__sock_accept(lfd, TIMEOUT_MS, &c));
  close(c);
  close(la.accepted);
  close(a);
  close(b);
  close(lfd);
  unlink(path);
}

static void peer_cred_errors(void)
{
  struct gpuipc__cred cred = {.pid = 123};
  ASSERT_RC(gpuipc__peer_cred(-1, &cred), -EBADF);
  int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_RC(gpuipc__peer_cred(fd, &cred), -ENOTSOCK);
  close(fd);
  ASSERT_EQ(cred.pid, 123);
  /* A socketpair's peer is this very process. */
  int sv[2];
  ASSERT_OK(gpuipc__sock_pair(sv));
  ASSERT_OK(gpuipc__peer_cred(sv[0], &cred));
  ASSERT_EQ(cred.pid, getpid());
  close(sv[0]);
  close(sv[1]);
}

int main(void)
{
  ASSERT_OK(gpuipc__runtime_dir(rundir, sizeof(rundir)));
  pass_three_fds();
  refuse_what_does_not_fit();
  no_descriptor_free();
  timeouts();
  survives_signals();
  peer_goes_away();
  listen_accept_cred();
  path_lengths();
  full_backlog();
  peer_cred_errors();
  printf("socket: ok\n");
  return 0;
}
