/*
 * A member's reader thread: it reads the connection to the broker, hands
 * each reply to the request waiting for it (client_call.c) or undoes it
 * through the listener when nobody waits, applies what the broker pushes
 * (unlinks, let-go, the hand-over's messages, whose receiving half is
 * handoff.c), and, when the connection drops, reconnects
 * (client_connect.c, electing a new broker if need be) and lets the
 * listener re-publish what this member holds. The state is in member.h.
 */
#include "domain/member.h"
#include "os/os.h"

#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Answer the hand-over message in d->rmsg (OFFER or END). */
static void ho_answer(struct gpuipc_domain *d)
{
  gpuipc__handoff_answer(&d->rmsg);
  pthread_mutex_lock(&d->send_mu);
  (void)gpuipc__proto_send(d->fd, &d->rmsg, NULL, 0, 1000);
  pthread_mutex_unlock(&d->send_mu);
}

/*
 * The broker asks whether this member takes the domain over: yes, unless
 * it is leaving. Only a member that reads its connection gets that far.
 */
static void ho_offer(struct gpuipc_domain *d)
{
  if (atomic_load(&d->leaving) || (d->flags & GPUIPC_JOIN_NO_BROKER))
    return; /* the broker asks the next member when no answer comes */
  ho_answer(d);
}

/* The hand-over ends: if it arrived whole, start and host its broker. */
static void ho_end(struct gpuipc_domain *d)
{
  struct gpuipc__broker_init init;
  struct gpuipc__broker *b;
  if (!gpuipc__handoff_end(&d->ho, d->name, &d->rmsg, &init))
    return;
  if (gpuipc__broker_start(&init, &b) != 0) {
    GPUIPC_LOG_E("domain %s: cannot start the broker handed over: %s",
                 d->name, gpuipc_last_error());
    return;
  }
  pthread_mutex_lock(&d->mu);
  struct gpuipc__broker *old = d->broker;
  d->broker = b;
  pthread_mutex_unlock(&d->mu);
  if (old != NULL)
    gpuipc__broker_stop(old);
  ho_answer(d); /* the last broker waits for this before it lets go */
  GPUIPC_LOG_I("domain %s: the broker moved to this process (pid %d)",
               d->name, (int)getpid());
}

/* Hand a reply to its waiter, or undo it when nobody waits any more. */
static void deliver(struct gpuipc_domain *d, int *fds, int nfds)
{
  pthread_mutex_lock(&d->mu);
  struct pending *p = d->pending;
  while (p != NULL && p->req != d->rmsg.req)
    p = p->next;
  if (p != NULL) {
    gpuipc__dom_pending_unlink(d, p);
    memcpy(&p->out->msg, &d->rmsg, sizeof(d->rmsg));
    for (int i = 0; i < nfds && i < 2; i++) {
      p->out->fds[i] = fds[i];
      fds[i] = -1;
    }
    p->out->nfds = nfds < 2 ? nfds : 2;
    p->out->gen = d->gen;
    p->done = 1;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    return;
  }
  uint64_t gen = d->gen;
  uint16_t type = gpuipc__dom_orphan_take(d, d->rmsg.req);
  pthread_mutex_unlock(&d->mu);
  memcpy(&d->reply.msg, &d->rmsg, sizeof(d->rmsg));
  d->reply.req_type = type;
  d->reply.nfds = 0;
  for (int i = 0; i < nfds && i < 2; i++) {
    d->reply.fds[i] = fds[i];
    fds[i] = -1;
    d->reply.nfds++;
  }
  d->reply.gen = gen;
  const struct gpuipc__dom_listener *l = atomic_load(&d->listener);
  if (l != NULL && l->on_orphan != NULL)
    l->on_orphan(d, &d->reply);
  gpuipc__dom_fds_close(d->reply.fds, d->reply.nfds);
}

static void on_push(struct gpuipc_domain *d, int *fds, int nfds)
{
  const struct gpuipc__msg *m = &d->rmsg;
  const struct gpuipc__dom_listener *l = atomic_load(&d->listener);
  switch (m->type) {
  case GPUIPC_MSG_UNLINKED:
    if (l != NULL && l->on_unlinked != NULL)
      l->on_unlinked(d, m->u.unlinked.id);
    break;
  case GPUIPC_MSG_LET_GO:
    if (l != NULL && l->on_let_go != NULL)
      l->on_let_go(d, m->u.let_go.id);
    break;
  case GPUIPC_MSG_HANDOFF_OFFER:
    ho_offer(d);
    break;
  case GPUIPC_MSG_HANDOFF_BEGIN:
    gpuipc__handoff_begin(&d->ho, d->name, d->token, m, fds);
    break;
  case GPUIPC_MSG_HANDOFF_SEG:
    gpuipc__handoff_seg(&d->ho, d->name, m, fds, nfds);
    break;
  case GPUIPC_MSG_HANDOFF_END:
    ho_end(d);
    break;
  default:
    GPUIPC_LOG_W("domain %s: the broker sent an unexpected %s", d->name,
                 gpuipc__msg_name(m->type));
  }
  gpuipc__dom_fds_close(fds, nfds);
}

/* The connection dropped: fail what waits, reconnect, re-publish. */
static void reconnect(struct gpuipc_domain *d)
{
  pthread_mutex_lock(&d->mu);
  if (d->state == DOM_UP)
    d->state = DOM_DOWN;
  d->gen++;
  for (struct pending *p = d->pending; p != NULL; p = p->next)
    p->done = GPUIPC_E_PEER_GONE;
  d->pending = NULL;
  gpuipc__dom_orphans_forget(d); /* that broker forgets what they did */
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);

  pthread_mutex_lock(&d->send_mu);
  gpuipc__fd_close(&d->fd);
  pthread_mutex_unlock(&d->send_mu);
  /* A hand-over that did not finish is void: its sender is gone. */
  gpuipc__handoff_discard(&d->ho);

  GPUIPC_LOG_I("domain %s: lost the broker; reconnecting", d->name);
  int fd = -1;
  unsigned backoff = 10;
  int last = 0;
  for (;;) {
    int rc = gpuipc__dom_connect(d, UINT64_MAX, true, &fd);
    if (rc == 0)
      break;
    if (atomic_load(&d->leaving))
      return;
    if (rc == GPUIPC_E_DENIED || rc == GPUIPC_E_VERSION) {
      /* No retry changes that answer: fail every request with it. */
      GPUIPC_LOG_E("domain %s: cannot reconnect: %s", d->name,
                   gpuipc_last_error());
      pthread_mutex_lock(&d->mu);
      if (d->state != DOM_CLOSED) {
        d->state = DOM_FAILED;
        d->failed_code = rc;
        snprintf(d->failed_why, sizeof(d->failed_why), "%s",
                 gpuipc_last_error());
      }
      pthread_cond_broadcast(&d->cv);
      pthread_mutex_unlock(&d->mu);
      return;
    }
    /* Anything else may pass (no descriptor free, no memory): retry. */
    if (rc != last)
      GPUIPC_LOG_W("domain %s: cannot reconnect (%s); retrying", d->name,
                   gpuipc_last_error());
    last = rc;
    struct pollfd pfd = {.fd = d->wake[0], .events = POLLIN};
    if (poll(&pfd, 1, (int)backoff) > 0 || atomic_load(&d->leaving))
      return; /* leaving */
    if (backoff < 1000)
      backoff *= 2;
  }
  /* Re-publish what we hold and go up, with no release in between. */
  const struct gpuipc__dom_listener *l = atomic_load(&d->listener);
  if (l != NULL && l->on_reconnect != NULL)
    l->on_reconnect(d, fd);
  else
    gpuipc__dom_set_up(d, fd);
}

int gpuipc__dom_listen(gpuipc_domain_t *d,
                       const struct gpuipc__dom_listener *l)
{
  const struct gpuipc__dom_listener *none = NULL;
  if (atomic_compare_exchange_strong(&d->listener, &none, l) || none == l)
    return 0;
  return gpuipc__err(-EBUSY, "domain %s: another listener is registered",
                     d->name);
}

void gpuipc__dom_set_up(gpuipc_domain_t *d, int fd)
{
  pthread_mutex_lock(&d->mu);
  pthread_mutex_lock(&d->send_mu);
  d->fd = fd;
  d->fd_gen = d->gen;
  pthread_mutex_unlock(&d->send_mu);
  if (d->state == DOM_DOWN)
    d->state = DOM_UP;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
  GPUIPC_LOG_I("domain %s: connected to the broker in pid %u", d->name,
               d->broker_pid);
}

void *gpuipc__dom_reader_main(void *arg)
{
  struct gpuipc_domain *d = arg;
  while (!atomic_load(&d->leaving)) {
    struct pollfd pfd[2] = {{.fd = d->fd, .events = POLLIN},
                            {.fd = d->wake[0], .events = POLLIN}};
    if (poll(pfd, 2, -1) < 0) {
      if (errno != EINTR)
        gpuipc__dom_sleep_ms(1);
      continue;
    }
    if (pfd[1].revents != 0)
      break;
    if (pfd[0].revents == 0)
      continue;
    int fds[GPUIPC_FDS_MAX];
    int nfds = GPUIPC_FDS_MAX;
    ssize_t len = gpuipc__sock_recv(d->fd, d->rbuf, sizeof(d->rbuf), fds,
                                    &nfds, 0);
    if (len == -ETIMEDOUT || len == -EAGAIN)
      continue;
    if (len < 0) {
      if (len != GPUIPC_E_PEER_GONE)
        GPUIPC_LOG_W("domain %s: %s", d->name, gpuipc_last_error());
      reconnect(d);
      continue;
    }
    int rc = gpuipc__msg_decode(d->rbuf, (size_t)len, nfds, &d->rmsg);
    if (rc != 0) {
      gpuipc__dom_fds_close(fds, nfds);
      GPUIPC_LOG_W("domain %s: malformed message from the broker (%s); "
                   "reconnecting", d->name, gpuipc_last_error());
      reconnect(d);
      continue;
    }
    if (d->rmsg.req != 0) {
      deliver(d, fds, nfds);
      gpuipc__dom_fds_close(fds, nfds);
    } else {
      on_push(d, fds, nfds);
    }
  }
  return NULL;
}
