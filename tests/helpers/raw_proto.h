/*
 * Speaking the domain protocol by hand, as a member (to a real broker) or
 * as a broker (to a real member): connect, send a message, read one, and
 * segment records with or without a descriptor.
 */
#ifndef GPUIPC_TEST_RAW_PROTO_H
#define GPUIPC_TEST_RAW_PROTO_H

#include "test.h"

#include "domain/domain.h"
#include "os/os.h"
#include "wire/wire.h"

#include <unistd.h>

static inline int raw_connect(const char *domain)
{
  struct gpuipc__dom_paths p;
  ASSERT_OK(gpuipc__dom_paths(domain, &p));
  int fd;
  ASSERT_OK(gpuipc__sock_connect(p.sock, 5000, &fd));
  return fd;
}

/* Send @m with @nfds descriptors; the other side may have hung up. */
static inline int raw_send(int fd, struct gpuipc__msg *m, const int *fds,
                           int nfds)
{
  uint8_t buf[GPUIPC__MSG_BUF];
  int len = gpuipc__msg_encode(m, buf, sizeof(buf));
  if (len < 0)
    TFAIL_GPUIPC("encode %s", gpuipc__msg_name(m->type));
  int rc = gpuipc__sock_send(fd, buf, (size_t)len, fds, nfds, 5000);
  if (rc != 0 && rc != GPUIPC_E_PEER_GONE && rc != -EPIPE &&
      rc != -ECONNRESET)
    TFAIL("send %s: %s", gpuipc__msg_name(m->type), gpuipc_last_error());
  return rc;
}

/*
 * Read one message into @m within @ms: 0, GPUIPC_E_PEER_GONE when the other
 * side hung up, -ETIMEDOUT. Received descriptors go to @fds (up to 2) or
 * are closed when @fds is NULL.
 */
static inline int raw_recv(int fd, struct gpuipc__msg *m, int *fds,
                           int *nfds, int ms)
{
  uint8_t buf[GPUIPC_MSG_MAX];
  int got[GPUIPC_FDS_MAX];
  int n = GPUIPC_FDS_MAX;
  ssize_t len = gpuipc__sock_recv(fd, buf, sizeof(buf), got, &n, ms);
  if (len == -ECONNRESET)
    len = GPUIPC_E_PEER_GONE;
  if (len < 0)
    return (int)len;
  int rc = gpuipc__msg_decode(buf, (size_t)len, n, m);
  if (rc != 0)
    TFAIL("decode: %s", gpuipc_last_error());
  for (int i = 0; i < n; i++) {
    if (fds != NULL && i < 2)
      fds[i] = got[i];
    else
      close(got[i]);
  }
  if (nfds != NULL)
    *nfds = n;
  return 0;
}

/* Read the next message, which must be of @type. */
static inline void raw_expect(int fd, struct gpuipc__msg *m, uint16_t type)
{
  int rc = raw_recv(fd, m, NULL, NULL, 10000);
  if (rc != 0)
    TFAIL("waiting for %s: %s", gpuipc__msg_name(type), gpuipc_last_error());
  if (m->type != type)
    TFAIL("expected %s, got %s (%d %s)", gpuipc__msg_name(type),
          gpuipc__msg_name(m->type),
          m->type == GPUIPC_MSG_ERROR ? m->u.error.code : 0,
          m->type == GPUIPC_MSG_ERROR ? m->u.error.text : "");
}

/* Say HELLO with @flags (GPUIPC__HELLO_*) without waiting for the answer. */
static inline void raw_hello_send_flags(int fd, uint32_t flags)
{
  struct gpuipc__msg m;
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_HELLO;
  m.req = 1;
  m.u.hello.pid = (uint32_t)getpid();
  m.u.hello.flags = flags;
  m.u.hello.token = 0x5eed;
  raw_send(fd, &m, NULL, 0);
}

static inline void raw_hello_send(int fd)
{
  raw_hello_send_flags(fd, 0);
}

static inline void raw_hello(int fd)
{
  struct gpuipc__msg m;
  raw_hello_send(fd);
  raw_expect(fd, &m, GPUIPC_MSG_WELCOME);
}

/*
 * Say HELLO as a member that comes back after a broker change (the only
 * one that may re-publish) and read the welcome.
 */
static inline void raw_hello_rejoin(int fd)
{
  struct gpuipc__msg m;
  raw_hello_send_flags(fd, GPUIPC__HELLO_REJOIN);
  raw_expect(fd, &m, GPUIPC_MSG_WELCOME);
}

/*
 * Connect (within @ms), say HELLO and read the answer (within @ms): 1 when
 * welcomed (the connection is left in *@out), else the connection is
 * closed and the result is the refusal's code (its sentence in @why),
 * -ETIMEDOUT when no answer came, GPUIPC_E_PEER_GONE when the broker hung
 * up without one, or the connect's error.
 */
static inline int raw_knock(const char *domain, int ms, int *out, char *why,
                            size_t whylen)
{
  struct gpuipc__dom_paths p;
  ASSERT_OK(gpuipc__dom_paths(domain, &p));
  int fd;
  int rc = gpuipc__sock_connect(p.sock, ms, &fd);
  if (rc != 0)
    return rc;
  raw_hello_send(fd);
  struct gpuipc__msg m;
  rc = raw_recv(fd, &m, NULL, NULL, ms);
  if (rc == GPUIPC_E_PEER_GONE) /* a reset comes before the answer */
    rc = raw_recv(fd, &m, NULL, NULL, 0);
  if (rc == 0 && m.type == GPUIPC_MSG_WELCOME) {
    *out = fd;
    return 1;
  }
  close(fd);
  if (rc != 0)
    return rc;
  if (m.type == GPUIPC_MSG_ERROR) {
    snprintf(why, whylen, "%s", m.u.error.text);
    return m.u.error.code;
  }
  if (m.type == GPUIPC_MSG_DENIED) {
    snprintf(why, whylen, "%s", m.u.denied.reason);
    return GPUIPC_E_DENIED;
  }
  TFAIL("HELLO answered with %s", gpuipc__msg_name(m.type));
}

/*
 * The broker must have hung up on @fd: a LIST sent now gets no answer but
 * the end of the connection (the broker reads a connection in order).
 */
static inline void raw_expect_hangup(int fd, const char *what)
{
  struct gpuipc__msg m;
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_LIST;
  m.req = 999;
  raw_send(fd, &m, NULL, 0);
  for (;;) {
    int rc = raw_recv(fd, &m, NULL, NULL, 10000);
    if (rc == GPUIPC_E_PEER_GONE)
      break;
    if (rc != 0)
      TFAIL("%s: %s", what, gpuipc_last_error());
    if (m.req == 999)
      TFAIL("%s: the broker kept the connection and answered", what);
  }
  close(fd);
}

/* An OPEN of @name (request @req) with @flags, @kind, @size, @timeout_ms. */
static inline void raw_open_msg(struct gpuipc__msg *m, uint32_t req,
                                const char *name, unsigned flags,
                                uint8_t kind, uint64_t size,
                                uint32_t timeout_ms)
{
  memset(m, 0, sizeof(*m));
  m->type = GPUIPC_MSG_OPEN;
  m->req = req;
  snprintf(m->u.open.name, sizeof(m->u.open.name), "%s", name);
  m->u.open.flags = flags;
  m->u.open.kind = kind;
  m->u.open.size = size;
  m->u.open.timeout_ms = timeout_ms;
}

/* OPEN @name with @flags and @size; returns the reply's type. */
static inline uint16_t raw_open(int fd, const char *name, unsigned flags,
                                uint8_t kind, uint64_t size,
                                struct gpuipc__msg *r)
{
  struct gpuipc__msg m;
  raw_open_msg(&m, 2, name, flags, kind, size, 1000);
  raw_send(fd, &m, NULL, 0);
  if (raw_recv(fd, r, NULL, NULL, 10000) != 0)
    TFAIL("OPEN %s: %s", name, gpuipc_last_error());
  return r->type;
}

/*
 * Play a broker: accept one member on @listen_fd, read its HELLO and
 * welcome it. Returns the member's connection.
 */
static inline int raw_accept_member(int listen_fd)
{
  int fd;
  if (gpuipc__sock_accept(listen_fd, 20000, &fd) != 0)
    TFAIL("accept: %s", gpuipc_last_error());
  struct gpuipc__msg m;
  raw_expect(fd, &m, GPUIPC_MSG_HELLO);
  uint32_t req = m.req;
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_WELCOME;
  m.req = req;
  m.u.welcome.pid = (uint32_t)getpid();
  m.u.welcome.epoch = 1;
  raw_send(fd, &m, NULL, 0);
  return fd;
}

/* The record of segment @name carrying handle @h (its kind and type). */
static inline struct gpuipc__seg_wire raw_seg_of(const char *name,
                                                 uint64_t id, uint64_t size,
                                                 uint8_t state,
                                                 const gpuipc_handle_t *h)
{
  struct gpuipc__seg_wire w;
  memset(&w, 0, sizeof(w));
  snprintf(w.name, sizeof(w.name), "%s", name);
  w.id = id;
  w.size = size;
  w.kind = (uint8_t)h->kind;
  w.state = state;
  memcpy(w.uuid, h->device_uuid, 16);
  w.has_handle = true;
  w.htype = (uint8_t)h->type;
  if (gpuipc_handle_pack(h, w.handle, sizeof(w.handle)) < 0)
    TFAIL("pack: %s", gpuipc_last_error());
  return w;
}

/* A LEGACY segment record: its memory travels without a descriptor. */
static inline struct gpuipc__seg_wire raw_legacy_seg(const char *name,
                                                     uint64_t id,
                                                     uint64_t size,
                                                     uint8_t state)
{
  gpuipc_handle_t h;
  memset(&h, 0, sizeof(h));
  h.version = GPUIPC_HANDLE_VERSION;
  h.kind = GPUIPC_KIND_LEGACY;
  h.type = GPUIPC_HT_LEGACY;
  h.size = size;
  h.alloc_size = 2u << 20;
  for (int i = 0; i < 16; i++)
    h.device_uuid[i] = (uint8_t)(0x10 + i);
  h.export_id = 1;
  h.boot_id[0] = 1;
  h.pid = (uint32_t)getpid();
  h.pidns = 1;
  h.nonce = 1;
  for (int i = 0; i < GPUIPC_HANDLE_BYTES; i++)
    h.bytes[i] = (uint8_t)(i + 1);
  h.fd = -1;
  return raw_seg_of(name, id, size, state, &h);
}

/*
 * A record of @kind (HOST or VMM) whose handle travels with a descriptor:
 * @alloc_size bytes (HOST: a multiple of 4096), exported by this process.
 */
static inline struct gpuipc__seg_wire raw_fd_seg(const char *name,
                                                 uint64_t id, uint8_t kind,
                                                 uint64_t size,
                                                 uint64_t alloc_size)
{
  const struct gpuipc__proc_id *me = gpuipc__proc_self();
  gpuipc_handle_t h;
  memset(&h, 0, sizeof(h));
  h.version = GPUIPC_HANDLE_VERSION;
  h.kind = (gpuipc_kind_t)kind;
  h.type = GPUIPC_HT_POSIX_FD;
  h.size = size;
  h.alloc_size = alloc_size;
  if (kind != GPUIPC_KIND_HOST)
    for (int i = 0; i < 16; i++)
      h.device_uuid[i] = (uint8_t)(0x10 + i);
  h.export_id = id;
  memcpy(h.boot_id, me->boot_id, sizeof(h.boot_id));
  h.pid = me->pid;
  h.pidns = me->pidns;
  h.nonce = me->nonce;
  h.fd = -1;
  return raw_seg_of(name, id, size, GPUIPC__SEG_PUBLISHED, &h);
}

/* PUBLISH @w with descriptor @fd (-1: none); returns the reply's type. */
static inline uint16_t raw_publish(int fd, const struct gpuipc__seg_wire *w,
                                   int seg_fd, struct gpuipc__msg *r)
{
  struct gpuipc__msg m;
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_PUBLISH;
  m.req = 3;
  m.u.publish.seg = *w;
  raw_send(fd, &m, &seg_fd, seg_fd >= 0 ? 1 : 0);
  if (raw_recv(fd, r, NULL, NULL, 10000) != 0)
    TFAIL("PUBLISH %s: %s", w->name, gpuipc_last_error());
  return r->type;
}

/*
 * REPUBLISH @w with @holds and @flags (GPUIPC__REPUB_*) as request @req,
 * with descriptor @seg_fd (-1: none).
 */
static inline void raw_republish_as(int fd, const struct gpuipc__seg_wire *w,
                                    uint32_t holds, uint32_t flags,
                                    uint32_t req, int seg_fd)
{
  struct gpuipc__msg m;
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_REPUBLISH;
  m.req = req;
  m.u.republish.holds = holds;
  m.u.republish.flags = flags;
  m.u.republish.seg = *w;
  raw_send(fd, &m, &seg_fd, seg_fd >= 0 ? 1 : 0);
}

/* REPUBLISH @w with @holds. */
static inline void raw_republish(int fd, const struct gpuipc__seg_wire *w,
                                 uint32_t holds)
{
  raw_republish_as(fd, w, holds, 0, 0, -1);
}

#endif
