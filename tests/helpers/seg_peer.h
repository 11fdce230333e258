/*
 * Driving seg_peer processes from a test: start one, send it a command
 * line, read its one-line reply.
 */
#ifndef GPUIPC_TEST_SEG_PEER_H
#define GPUIPC_TEST_SEG_PEER_H

#include "test.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/wait.h>
#include <unistd.h>

/* Longest a peer may take to answer one command. */
#define PEER_REPLY_MS 60000

struct peer {
  pid_t pid;
  int in;  /* we write commands here */
  int out; /* we read replies here */
  char buf[4096];
  size_t len;
  char line[1024];
};

static inline void peer_start(struct peer *p)
{
  int cmd[2], rep[2];
  if (pipe2(cmd, O_CLOEXEC) != 0 || pipe2(rep, O_CLOEXEC) != 0)
    TFAIL("pipe2: %s", strerror(errno));
  char a[16], b[16];
  snprintf(a, sizeof(a), "%d", cmd[0]);
  snprintf(b, sizeof(b), "%d", rep[1]);
  const char *args[] = {a, b, NULL};
  int keep[] = {cmd[0], rep[1], -1};
  p->pid = test_spawn("seg_peer", args, keep);
  close(cmd[0]);
  close(rep[1]);
  p->in = cmd[1];
  p->out = rep[0];
  p->len = 0;
}

/* The next reply line (without newline); fails the test on EOF/timeout. */
static inline const char *peer_read(struct peer *p, int timeout_ms)
{
  for (;;) {
    char *nl = memchr(p->buf, '\n', p->len);
    if (nl != NULL) {
      size_t n = (size_t)(nl - p->buf);
      if (n >= sizeof(p->line))
        n = sizeof(p->line) - 1;
      memcpy(p->line, p->buf, n);
      p->line[n] = '\0';
      p->len -= (size_t)(nl - p->buf) + 1;
      memmove(p->buf, nl + 1, p->len);
      return p->line;
    }
    struct pollfd pf = {.fd = p->out, .events = POLLIN};
    int r = poll(&pf, 1, timeout_ms);
    if (r == 0)
      TFAIL("peer %d did not answer within %d ms", (int)p->pid, timeout_ms);
    if (r < 0 && errno == EINTR)
      continue;
    if (p->len >= sizeof(p->buf) - 1)
      TFAIL("peer %d: a reply line longer than %zu bytes", (int)p->pid,
            sizeof(p->buf) - 1);
    ssize_t n = read(p->out, p->buf + p->len, sizeof(p->buf) - p->len - 1);
    if (n <= 0)
      TFAIL("peer %d closed its reply pipe (exited?)", (int)p->pid);
    p->len += (size_t)n;
  }
}

/* Write one command line to the peer. */
static inline void peer_vsend(struct peer *p, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
static inline void peer_vsend(struct peer *p, const char *fmt, va_list ap)
{
  char cmd[512];
  int n = vsnprintf(cmd, sizeof(cmd) - 1, fmt, ap);
  cmd[n++] = '\n';
  if (write(p->in, cmd, (size_t)n) != n)
    TFAIL("write to peer %d: %s", (int)p->pid, strerror(errno));
}

/* Send a command without waiting for the reply. */
static inline void peer_send(struct peer *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline void peer_send(struct peer *p, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  peer_vsend(p, fmt, ap);
  va_end(ap);
}

/* Send a command and return its reply line. */
static inline const char *peer_cmd(struct peer *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static inline const char *peer_cmd(struct peer *p, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  peer_vsend(p, fmt, ap);
  va_end(ap);
  return peer_read(p, PEER_REPLY_MS);
}

/* The reply must begin with @want ("ok", "err ENOENT", ...). */
#define PEER_EXPECT(p, want, ...)                                              \
  do {                                                                         \
    const char *r_ = peer_cmd((p), __VA_ARGS__);                               \
    if (strncmp(r_, (want), strlen(want)) != 0)                                \
      TFAIL("peer %d: expected \"%s\", got \"%s\"", (int)(p)->pid, (want),     \
            r_);                                                               \
  } while (0)
#define PEER_OK(p, ...) PEER_EXPECT(p, "ok", __VA_ARGS__)

/* Close the command pipe and wait for a clean exit. */
static inline void peer_finish(struct peer *p)
{
  close(p->in);
  int st = test_wait(p->pid, PEER_REPLY_MS);
  close(p->out);
  if (st != 0)
    TFAIL("peer %d exited with %d", (int)p->pid, st);
}

/*
 * The broker learns that a member left when it reads the end of its
 * connection, which comes in its own time: ask until @n members remain.
 */
static inline void domain_wait_members(gpuipc_domain_t *d, int n)
{
  gpuipc_domain_info_t i;
  for (int tries = 0; tries < 3000; tries++) {
    memset(&i, 0, sizeof(i));
    i.size = sizeof(i);
    ASSERT_OK(gpuipc_domain_info(d, &i));
    if (i.members == n)
      return;
    usleep(10000);
  }
  TFAIL("the domain still has %d members, expected %d", i.members, n);
}

/* The member's open descriptors ("fds" command). */
static inline int peer_fds(struct peer *p)
{
  int n = -1;
  const char *r = peer_cmd(p, "fds");
  if (sscanf(r, "ok %d", &n) != 1)
    TFAIL("fds: %s", r);
  return n;
}

/* What the member's domain says of itself ("info" command). */
struct peer_info {
  int broker_pid, hosts, members, segments, fds;
};

static inline void peer_info(struct peer *p, struct peer_info *i)
{
  const char *r = peer_cmd(p, "info");
  if (sscanf(r, "ok %d %d %d %d %d", &i->broker_pid, &i->hosts, &i->members,
             &i->segments, &i->fds) != 5)
    TFAIL("info: %s", r);
}

static inline void peer_kill(struct peer *p)
{
  kill(p->pid, SIGKILL);
  int st = test_wait(p->pid, PEER_REPLY_MS);
  close(p->in);
  close(p->out);
  ASSERT_EQ(st, 128 + SIGKILL);
}

#endif
