/*
 * Carrying gpuipc handles yourself: a message and at most one file
 * descriptor over a Unix SOCK_SEQPACKET socket (SCM_RIGHTS). This is all a
 * program needs to pass a gpuipc_handle_pack()ed record, with the fd that
 * travels beside it, to another process; gpuipc's domains do it for you.
 */
#ifndef GPUIPC_EXAMPLE_HANDLE_SOCKET_H
#define GPUIPC_EXAMPLE_HANDLE_SOCKET_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

/* Send @len bytes and, when @fd >= 0, the descriptor. 0 or -errno. */
static inline int hs_send(int sock, const void *msg, size_t len, int fd)
{
  struct iovec iov;
  iov.iov_base = (void *)msg;
  iov.iov_len = len;
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } ctl;
  struct msghdr mh;
  memset(&mh, 0, sizeof(mh));
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (fd >= 0) {
    memset(&ctl, 0, sizeof(ctl));
    mh.msg_control = ctl.buf;
    mh.msg_controllen = sizeof(ctl.buf);
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  for (;;) {
    ssize_t n = sendmsg(sock, &mh, MSG_NOSIGNAL);
    if (n == (ssize_t)len)
      return 0;
    if (n < 0 && errno == EINTR)
      continue;
    return n < 0 ? -errno : -EPROTO;
  }
}

/*
 * Receive one message into @msg (capacity @cap); *@fd is the descriptor
 * that came with it (close-on-exec) or -1. Returns the length, 0 when the
 * peer has closed, or -errno.
 */
static inline ssize_t hs_recv(int sock, void *msg, size_t cap, int *fd)
{
  struct iovec iov;
  iov.iov_base = msg;
  iov.iov_len = cap;
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } ctl;
  struct msghdr mh;
  memset(&mh, 0, sizeof(mh));
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = ctl.buf;
  mh.msg_controllen = sizeof(ctl.buf);
  *fd = -1;
  ssize_t n;
  do
    n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n < 0)
    return -errno;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c != NULL;
       c = CMSG_NXTHDR(&mh, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
      memcpy(fd, CMSG_DATA(c), sizeof(int));
  return n;
}

/*
 * Start this very program again as a child with @argv (fork + exec: a
 * forked process cannot use CUDA), keeping descriptor @keep_fd open in it.
 * Returns the pid or -errno.
 */
static inline pid_t hs_spawn_self(char *const argv[], int keep_fd)
{
  pid_t pid = fork();
  if (pid < 0)
    return -errno;
  if (pid == 0) {
    int fl = fcntl(keep_fd, F_GETFD);
    if (fl >= 0)
      fcntl(keep_fd, F_SETFD, fl & ~FD_CLOEXEC);
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  return pid;
}

#endif
