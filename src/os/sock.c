/*
 * Unix SOCK_SEQPACKET sockets: one message per call, with descriptors
 * beside it (SCM_RIGHTS). Every call is non-blocking underneath
 * (MSG_DONTWAIT, a non-blocking listener) and waits in poll() against a
 * monotonic deadline, so timeouts hold across EINTR and the descriptors
 * handed out stay ordinary blocking sockets for callers that poll them.
 */
#include "os/os.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* Control buffer big enough for the most descriptors a message may carry. */
union fd_ctl {
  struct cmsghdr align;
  char buf[CMSG_SPACE(sizeof(int) * GPUIPC_FDS_MAX)];
};

/*
 * Wait until @fd is ready for @events or @deadline passes. 0 when ready
 * (or in error/hang-up, which the next call reports), -ETIMEDOUT, or
 * -errno. Records no sentence: callers name the operation.
 */
static int wait_fd(int fd, short events, uint64_t deadline)
{
  for (;;) {
    struct pollfd p = {.fd = fd, .events = events};
    int ms = gpuipc__ms_left(deadline);
    int r = poll(&p, 1, ms);
    if (r > 0) {
      if (p.revents & POLLNVAL)
        return -EBADF;
      return 0;
    }
    if (r == 0) {
      if (gpuipc__ms_left(deadline) == 0)
        return -ETIMEDOUT;
      continue; /* woke early: poll rounds, the deadline decides */
    }
    if (errno != EINTR)
      return -errno;
  }
}

/* The soft open-file limit, for sentences about EMFILE. */
static unsigned long long nofile_limit(void)
{
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
    return 0;
  return (unsigned long long)rl.rlim_cur;
}

/*
 * A socket address for @path, which may be longer than sun_path (107
 * bytes): then its directory is opened (O_PATH, into @*dirfd, which the
 * caller closes after bind or connect) and the address is
 * "/proc/self/fd/N/NAME", which reaches the same file without a long
 * path and without chdir (which would be process-wide, not thread-safe).
 * Only NAME must be short.
 */
static int fill_addr(const char *call, const char *path,
                     struct sockaddr_un *sa, socklen_t *len, int *dirfd)
{
  *dirfd = -1;
  if (path == NULL)
    return gpuipc__err(-EINVAL, "%s: path is NULL", call);
  size_t n = strlen(path);
  if (n == 0)
    return gpuipc__err(-EINVAL, "%s: path is empty", call);
  memset(sa, 0, sizeof(*sa));
  sa->sun_family = AF_UNIX;
  if (n < sizeof(sa->sun_path)) {
    memcpy(sa->sun_path, path, n + 1);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
    return 0;
  }
  const char *slash = strrchr(path, '/');
  const char *name = slash != NULL ? slash + 1 : path;
  size_t dn = slash == NULL ? 0 : slash == path ? 1 : (size_t)(slash - path);
  char dir[PATH_MAX];
  int m = -1;
  if (dn > 0 && dn < sizeof(dir) && name[0] != '\0') {
    memcpy(dir, path, dn);
    dir[dn] = '\0';
    *dirfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (*dirfd < 0)
      return gpuipc__err_errno(errno, "%s: open directory %s of socket %s",
                               call, dir, name);
    m = snprintf(sa->sun_path, sizeof(sa->sun_path), "/proc/self/fd/%d/%s",
                 *dirfd, name);
  }
  if (m < 0 || (size_t)m >= sizeof(sa->sun_path)) {
    if (*dirfd >= 0)
      close(*dirfd);
    *dirfd = -1;
    return gpuipc__err(-ENAMETOOLONG,
                       "%s: socket path %s is %zu bytes long and its last "
                       "component %s too: a Unix socket path holds at most "
                       "%zu bytes",
                       call, path, n, name, sizeof(sa->sun_path) - 1);
  }
  *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + (size_t)m + 1);
  return 0;
}

int gpuipc__sock_pair(int out[2])
{
  if (out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc__sock_pair: out is NULL");
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
    return gpuipc__err_errno(errno, "socketpair(AF_UNIX, SOCK_SEQPACKET)");
  out[0] = sv[0];
  out[1] = sv[1];
  return 0;
}

int gpuipc__sock_listen(const char *path, int backlog, int *out_fd)
{
  struct sockaddr_un sa;
  socklen_t salen = 0;
  int rc, dirfd;

  if (out_fd == NULL)
    return gpuipc__err(-EINVAL, "gpuipc__sock_listen: out_fd is NULL");
  if (backlog < 0)
    return gpuipc__err(-EINVAL, "gpuipc__sock_listen: backlog %d < 0",
                       backlog);
  rc = fill_addr("gpuipc__sock_listen", path, &sa, &salen, &dirfd);
  if (rc < 0)
    return rc;

  /* Non-blocking so that accept after poll never blocks on a race. */
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    rc = gpuipc__err_errno(errno, "socket(AF_UNIX, SOCK_SEQPACKET) for %s",
                           path);
    goto close_dir;
  }
  int b = bind(fd, (struct sockaddr *)&sa, salen);
  int e = errno;
  if (dirfd >= 0)
    close(dirfd);
  dirfd = -1;
  if (b < 0) {
    if (e == EADDRINUSE)
      rc = gpuipc__err(-EADDRINUSE,
                       "bind %s: a file already exists at that path", path);
    else
      rc = gpuipc__err_errno(e, "bind %s", path);
    goto close_fd;
  }
  if (listen(fd, backlog) < 0) {
    rc = gpuipc__err_errno(errno, "listen on %s (backlog %d)", path, backlog);
    goto close_fd;
  }
  *out_fd = fd;
  return 0;

close_fd:
  close(fd);
close_dir:
  if (dirfd >= 0)
    close(dirfd);
  return rc;
}

int gpuipc__sock_connect(const char *path, int timeout_ms, int *out_fd)
{
  struct sockaddr_un sa;
  socklen_t salen = 0;
  int rc, dirfd;

  if (out_fd == NULL)
    return gpuipc__err(-EINVAL, "gpuipc__sock_connect: out_fd is NULL");
  rc = fill_addr("gpuipc__sock_connect", path, &sa, &salen, &dirfd);
  if (rc < 0)
    return rc;

  uint64_t deadline = gpuipc__deadline(timeout_ms);
  /*
   * Non-blocking: a Unix connect is immediate or fails, except that a full
   * backlog says EAGAIN, which we retry (backing off to 10 ms) until the
   * deadline.
   */
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    rc = gpuipc__err_errno(errno, "socket(AF_UNIX, SOCK_SEQPACKET) for %s",
                           path);
    goto close_dir;
  }
  unsigned delay_us = 100;
  for (;;) {
    if (connect(fd, (struct sockaddr *)&sa, salen) == 0)
      break;
    int e = errno;
    if (e == EINTR)
      continue;
    if (e == EISCONN) /* an interrupted attempt that completed */
      break;
    if (e == EAGAIN) {
      int ms = gpuipc__ms_left(deadline);
      if (ms == 0) {
        rc = gpuipc__err(-ETIMEDOUT,
                         "connect to %s: the listener's backlog stayed full "
                         "for %d ms",
                         path, timeout_ms);
        goto close_fd;
      }
      unsigned us = delay_us;
      if (ms > 0 && (unsigned)ms * 1000u < us)
        us = (unsigned)ms * 1000u;
      gpuipc__sleep_us(us);
      delay_us = delay_us * 2 > 10000 ? 10000 : delay_us * 2;
      continue;
    }
    if (e == ENOENT)
      rc = gpuipc__err(-ENOENT, "connect to %s: no socket there (nobody "
                                "listens)", path);
    else if (e == ECONNREFUSED)
      rc = gpuipc__err(-ECONNREFUSED, "connect to %s: nobody listens on "
                                      "that socket", path);
    else
      rc = gpuipc__err_errno(e, "connect to %s", path);
    goto close_fd;
  }

  if (dirfd >= 0)
    close(dirfd);
  dirfd = -1;
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
    rc = gpuipc__err_errno(errno, "fcntl(F_SETFL) on the socket to %s", path);
    goto close_fd;
  }
  *out_fd = fd;
  return 0;

close_fd:
  close(fd);
close_dir:
  if (dirfd >= 0)
    close(dirfd);
  return rc;
}

int gpuipc__sock_accept(int lfd, int timeout_ms, int *out_fd)
{
  if (out_fd == NULL)
    return gpuipc__err(-EINVAL, "gpuipc__sock_accept: out_fd is NULL");
  if (lfd < 0)
    return gpuipc__err(-EBADF, "gpuipc__sock_accept: socket %d", lfd);

  uint64_t deadline = gpuipc__deadline(timeout_ms);
  for (;;) {
    /* Poll first: a blocking listener would otherwise block in accept. */
    int rc = wait_fd(lfd, POLLIN, deadline);
    if (rc == -ETIMEDOUT)
      return gpuipc__err(rc, "accept on socket %d: no connection within %d ms",
                         lfd, timeout_ms);
    if (rc < 0)
      return gpuipc__err_errno(rc, "poll on listening socket %d", lfd);
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0) {
      *out_fd = fd;
      return 0;
    }
    int e = errno;
    if (e == EINTR || e == EAGAIN || e == EWOULDBLOCK || e == ECONNABORTED)
      continue;
    if (e == EMFILE)
      return gpuipc__err(-EMFILE, "accept4 on socket %d: this process has no "
                                  "descriptor free (EMFILE: at its open-file "
                                  "limit %llu)", lfd, nofile_limit());
    return gpuipc__err_errno(e, "accept4 on socket %d", lfd);
  }
}

int gpuipc__sock_send(int fd, const void *buf, size_t len, const int *fds,
                      int nfds, int timeout_ms)
{
  if (fd < 0)
    return gpuipc__err(-EBADF, "gpuipc__sock_send: socket %d", fd);
  if (buf == NULL || len == 0)
    return gpuipc__err(-EINVAL, "gpuipc__sock_send: empty message (buf %p, "
                                "len %zu)", buf, len);
  if (len > GPUIPC_MSG_MAX)
    return gpuipc__err(-EMSGSIZE, "gpuipc__sock_send: message of %zu bytes "
                                  "exceeds GPUIPC_MSG_MAX (%d)",
                       len, GPUIPC_MSG_MAX);
  if (nfds < 0 || nfds > GPUIPC_FDS_MAX)
    return gpuipc__err(-EINVAL, "gpuipc__sock_send: nfds %d not in [0, %d]",
                       nfds, GPUIPC_FDS_MAX);
  if (nfds > 0 && fds == NULL)
    return gpuipc__err(-EINVAL, "gpuipc__sock_send: nfds %d but fds is NULL",
                       nfds);
  for (int i = 0; i < nfds; i++)
    if (fds[i] < 0)
      return gpuipc__err(-EBADF, "gpuipc__sock_send: fds[%d] is %d", i,
                         fds[i]);

  union fd_ctl ctl;
  struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  if (nfds > 0) {
    size_t bytes = sizeof(int) * (size_t)nfds;
    memset(&ctl, 0, sizeof(ctl));
    msg.msg_control = ctl.buf;
    msg.msg_controllen = CMSG_SPACE(bytes);
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(bytes);
    memcpy(CMSG_DATA(c), fds, bytes);
  }

  uint64_t deadline = gpuipc__deadline(timeout_ms);
  for (;;) {
    ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      if ((size_t)n != len) /* SOCK_SEQPACKET sends all or nothing */
        return gpuipc__err(GPUIPC_E_PROTO,
                           "sendmsg on socket %d sent %zd of %zu bytes: not "
                           "a SOCK_SEQPACKET socket?",
                           fd, n, len);
      return 0;
    }
    int e = errno;
    if (e == EINTR)
      continue;
    if (e == EAGAIN || e == EWOULDBLOCK) {
      int rc = wait_fd(fd, POLLOUT, deadline);
      if (rc == -ETIMEDOUT)
        return gpuipc__err(rc, "send on socket %d: the peer did not make "
                               "room for %zu bytes within %d ms",
                           fd, len, timeout_ms);
      if (rc < 0)
        return gpuipc__err_errno(rc, "poll on socket %d", fd);
      continue;
    }
    if (e == EPIPE || e == ECONNRESET)
      return gpuipc__err(GPUIPC_E_PEER_GONE,
                         "send on socket %d: the peer has closed its end (%s)",
                         fd, strerrorname_np(e));
    return gpuipc__err_errno(e, "sendmsg on socket %d (%zu bytes, %d fds)", fd,
                             len, nfds);
  }
}

static void close_all(int *fds, int n)
{
  for (int i = 0; i < n; i++)
    close(fds[i]);
}

/*
 * Gather the descriptors of every SCM_RIGHTS header into @got (room
 * GPUIPC_FDS_MAX; any beyond that are closed and counted in *@extra).
 */
static int collect_fds(struct msghdr *msg, int *got, int *extra)
{
  int n = 0;
  *extra = 0;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c != NULL;
       c = CMSG_NXTHDR(msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
      continue;
    size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const unsigned char *p = CMSG_DATA(c);
    for (size_t i = 0; i < k; i++) {
      int f;
      memcpy(&f, p + i * sizeof(int), sizeof(int));
      if (n < GPUIPC_FDS_MAX) {
        got[n++] = f;
        gpuipc__fd_table_ahead(f);
      } else {
        close(f);
        (*extra)++;
      }
    }
  }
  return n;
}

ssize_t gpuipc__sock_recv(int fd, void *buf, size_t cap, int *fds, int *nfds,
                          int timeout_ms)
{
  if (fd < 0)
    return gpuipc__err(-EBADF, "gpuipc__sock_recv: socket %d", fd);
  if (buf == NULL || cap == 0)
    return gpuipc__err(-EINVAL, "gpuipc__sock_recv: no buffer (buf %p, cap "
                                "%zu)", buf, cap);
  int room = 0;
  if (nfds != NULL) {
    room = *nfds;
    if (room < 0 || room > GPUIPC_FDS_MAX)
      return gpuipc__err(-EINVAL, "gpuipc__sock_recv: *nfds %d not in [0, "
                                  "%d]", room, GPUIPC_FDS_MAX);
    if (room > 0 && fds == NULL)
      return gpuipc__err(-EINVAL, "gpuipc__sock_recv: *nfds %d but fds is "
                                  "NULL", room);
  }

  uint64_t deadline = gpuipc__deadline(timeout_ms);
  for (;;) {
    /* Always the full control buffer: whatever arrives, we can close. */
    union fd_ctl ctl;
    struct iovec iov = {.iov_base = buf, .iov_len = cap};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1,
                         .msg_control = ctl.buf,
                         .msg_controllen = sizeof(ctl.buf)};
    ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      int e = errno;
      if (e == EINTR)
        continue;
      if (e == EAGAIN || e == EWOULDBLOCK) {
        int rc = wait_fd(fd, POLLIN, deadline);
        if (rc == -ETIMEDOUT)
          return gpuipc__err(rc, "recv on socket %d: no message within %d ms",
                             fd, timeout_ms);
        if (rc < 0)
          return gpuipc__err_errno(rc, "poll on socket %d", fd);
        continue;
      }
      if (e == ECONNRESET)
        return gpuipc__err(GPUIPC_E_PEER_GONE,
                           "recv on socket %d: the peer closed its end with "
                           "messages unread (ECONNRESET)", fd);
      return gpuipc__err_errno(e, "recvmsg on socket %d", fd);
    }

    int got[GPUIPC_FDS_MAX];
    int extra;
    int ngot = collect_fds(&msg, got, &extra);
    if (n == 0) {
      close_all(got, ngot);
      return gpuipc__err(GPUIPC_E_PEER_GONE,
                         "recv on socket %d: the peer has closed its end", fd);
    }
    if (msg.msg_flags & MSG_TRUNC) {
      close_all(got, ngot);
      return gpuipc__err(GPUIPC_E_PROTO,
                         "recv on socket %d: a message longer than the "
                         "%zu-byte buffer arrived; dropped it and closed its "
                         "%d descriptor(s)", fd, cap, ngot + extra);
    }
    /*
     * The control buffer holds GPUIPC_FDS_MAX descriptors: fewer with
     * MSG_CTRUNC means the kernel could not install the others here, for
     * want of a free descriptor (it stops at the first it cannot install).
     */
    if ((msg.msg_flags & MSG_CTRUNC) && extra == 0 &&
        ngot < GPUIPC_FDS_MAX) {
      close_all(got, ngot);
      return gpuipc__err(-EMFILE,
                         "recv on socket %d: this process has no descriptor "
                         "free for those a message carried (EMFILE: at its "
                         "open-file limit %llu); dropped the message and "
                         "closed the %d that arrived", fd, nofile_limit(),
                         ngot);
    }
    if ((msg.msg_flags & MSG_CTRUNC) || extra > 0) {
      close_all(got, ngot);
      return gpuipc__err(GPUIPC_E_PROTO,
                         "recv on socket %d: a message carried more than %d "
                         "descriptors; dropped it and closed the %d that "
                         "arrived", fd, GPUIPC_FDS_MAX, ngot + extra);
    }
    if (ngot > room) {
      close_all(got, ngot);
      return gpuipc__err(GPUIPC_E_PROTO,
                         "recv on socket %d: a message carried %d "
                         "descriptor(s), room for %d; dropped it and closed "
                         "them", fd, ngot, room);
    }
    if (ngot > 0)
      memcpy(fds, got, sizeof(int) * (size_t)ngot);
    if (nfds != NULL)
      *nfds = ngot;
    return n;
  }
}

int gpuipc__peer_cred(int fd, struct gpuipc__cred *out)
{
  if (out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc__peer_cred: out is NULL");
  struct ucred uc;
  socklen_t len = sizeof(uc);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0)
    return gpuipc__err_errno(errno, "getsockopt(SO_PEERCRED) on socket %d",
                             fd);
  if (len != sizeof(uc) || uc.pid == 0)
    return gpuipc__err(-ENOTCONN, "getsockopt(SO_PEERCRED) on socket %d: no "
                                  "peer credentials (not connected)", fd);
  out->pid = uc.pid;
  out->uid = uc.uid;
  out->gid = uc.gid;
  return 0;
}
