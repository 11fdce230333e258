/*
 * The broker's sending: it never blocks on a member. A reply goes out at
 * once when the member's socket takes it, else it waits in that
 * connection's bounded outbox (flushed when poll says the socket has room,
 * broker.c); a member that lets its outbox overflow is disconnected.
 * Everything the broker sends to a member goes through here; see
 * broker_int.h for the other broker files.
 */
#include "domain/broker_int.h"
#include "os/os.h"
#include "wire/wire.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A member's outbox may hold this much before the member is dropped. */
#define OUTBOX_MAX_MSGS 4096
#define OUTBOX_MAX_BYTES (4u << 20)

void gpuipc__bk_outbox_free(struct gpuipc__conn *c)
{
  struct out_msg *o = c->out_head;
  while (o != NULL) {
    struct out_msg *next = o->next;
    for (int i = 0; i < o->nfds; i++)
      gpuipc__fd_close(&o->fds[i]);
    free(o);
    o = next;
  }
  c->out_head = c->out_tail = NULL;
  c->out_msgs = c->out_bytes = 0;
}

/* Send what waits in @c's outbox; stop when the socket is full. */
void gpuipc__bk_flush(struct gpuipc__conn *c)
{
  while (c->out_head != NULL && !c->doomed) {
    struct out_msg *o = c->out_head;
    int rc = gpuipc__sock_send(c->fd, o->data, o->len, o->fds, o->nfds, 0);
    if (gpuipc__bk_would_block(rc))
      return;
    if (rc != 0) {
      c->doomed = true;
      return;
    }
    c->out_head = o->next;
    if (c->out_head == NULL)
      c->out_tail = NULL;
    c->out_msgs--;
    c->out_bytes -= o->len;
    for (int i = 0; i < o->nfds; i++)
      gpuipc__fd_close(&o->fds[i]);
    free(o);
  }
}

/* Queue a copy of an encoded message (and dups of its fds). */
static void outbox_add(struct gpuipc__conn *c, const void *data, size_t len,
                       const int *fds, int nfds)
{
  if (c->out_msgs >= OUTBOX_MAX_MSGS || c->out_bytes + len > OUTBOX_MAX_BYTES) {
    GPUIPC_LOG_W("broker: member pid %d does not read its replies; "
                 "disconnecting it",
                 (int)c->cred.pid);
    c->doomed = true;
    return;
  }
  struct out_msg *o = malloc(sizeof(*o) + len);
  if (o == NULL) {
    c->doomed = true;
    return;
  }
  o->next = NULL;
  o->len = len;
  o->nfds = 0;
  for (int i = 0; i < nfds; i++) {
    if (gpuipc__fd_dup(fds[i], &o->fds[i]) != 0) {
      for (int j = 0; j < i; j++)
        gpuipc__fd_close(&o->fds[j]);
      free(o);
      c->doomed = true;
      return;
    }
    o->nfds++;
  }
  memcpy(o->data, data, len);
  if (c->out_tail != NULL)
    c->out_tail->next = o;
  else
    c->out_head = o;
  c->out_tail = o;
  c->out_msgs++;
  c->out_bytes += len;
}

/* Send @m to @c without blocking: directly, or through the outbox. */
void gpuipc__bk_send(struct gpuipc__conn *c, const struct gpuipc__msg *m,
                     const int *fds, int nfds)
{
  if (c->doomed)
    return;
  uint8_t buf[GPUIPC__MSG_BUF];
  int len = gpuipc__msg_encode(m, buf, sizeof(buf));
  if (len < 0) { /* a bug in the broker: say so, drop the member */
    GPUIPC_LOG_E("broker: cannot encode %s: %s", gpuipc__msg_name(m->type),
                 gpuipc_last_error());
    c->doomed = true;
    return;
  }
  if (c->out_head == NULL) {
    int rc = gpuipc__sock_send(c->fd, buf, (size_t)len, fds, nfds, 0);
    if (rc == 0)
      return;
    if (!gpuipc__bk_would_block(rc)) {
      c->doomed = true;
      return;
    }
  }
  outbox_add(c, buf, (size_t)len, fds, nfds);
}

void gpuipc__bk_send_error(struct gpuipc__broker *b, struct gpuipc__conn *c,
                           uint32_t req, int code, const char *fmt, ...)
{
  struct gpuipc__msg *m = &b->out;
  memset(&m->u.error, 0, sizeof(m->u.error));
  m->type = GPUIPC_MSG_ERROR;
  m->req = req;
  m->u.error.code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m->u.error.text, sizeof(m->u.error.text), fmt, ap);
  va_end(ap);
  gpuipc__bk_send(c, m, NULL, 0);
}

void gpuipc__bk_send_id(struct gpuipc__broker *b, struct gpuipc__conn *c,
                        uint16_t type, uint32_t req, uint64_t id)
{
  struct gpuipc__msg *m = &b->out;
  m->type = type;
  m->req = req;
  m->u.ok.id = id; /* ok, create_it and unlinked share the layout */
  gpuipc__bk_send(c, m, NULL, 0);
}
