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
  struct test_lines lines;
};

static inline void peer_start(struct peer *p)
{
  p->pid = test_spawn_piped("seg_peer", NULL, &p->in, &p->out);
  p->lines.len = 0;
}

/* The next reply line (without newline); fails the test on EOF/timeout. */
static inline const char *peer_read(struct peer *p, int timeout_ms)
{
  const char *l = test_lines_next(&p->lines, p->out, p->pid, timeout_ms);
  if (l == NULL)
    TFAIL("peer %d closed its reply pipe (exited?)", (int)p->pid);
  return l;
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
