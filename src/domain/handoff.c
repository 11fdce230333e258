/*
 * The hand-over of a domain from a broker that stops to a member that
 * takes it on (see domain.h for the whole exchange), both halves:
 *
 *  - the leaving broker's (broker.c's shutdown calls it): choose the
 *    oldest member of its own uid that may host, OFFER it the domain, and only once it
 *    ACCEPTs send it the lock and listener (BEGIN), every segment with its
 *    descriptor (SEG) and END, then wait for its ACK;
 *  - the member's (client.c's reader thread feeds it the messages): check
 *    and collect what arrives into a registry, whole at END (the member
 *    then starts a broker with it, hosts it, and answers ACK).
 *
 * What each half sends and counts is here, in one place, so the two agree.
 * See broker_int.h for the other broker files.
 */
#include "domain/broker_int.h"
#include "os/os.h"
#include "wire/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bound on each blocking send of a hand-over, and on waiting for its ack. */
#define HANDOFF_SEND_MS 2000
#define HANDOFF_ACK_MS 5000
/* Bound on a candidate's answer to the offer to take the domain over. */
#define HANDOFF_OFFER_MS 1000

/* ------------------------------------------------------------------------ */
/* The leaving broker                                                       */
/* ------------------------------------------------------------------------ */

/*
 * Whether @c may take the domain over from this broker. Only a member of
 * the broker's own uid: the domain's lock, listener and every segment's
 * descriptor go to the successor, and a broker of another uid would admit
 * members by its own uid and allow lists, refusing the owner's (a member
 * let in by GPUIPC_ALLOW_UIDS / _GIDS only uses the domain).
 */
static bool may_succeed(const struct gpuipc__broker *b,
                        const struct gpuipc__conn *c)
{
  return !c->doomed && c->state == CONN_READY &&
         !(c->hello_flags & GPUIPC__HELLO_NO_BROKER) &&
         c->token != b->owner_token && c->cred.uid == b->uid;
}

bool gpuipc__bk_successor_ready(const struct gpuipc__broker *b)
{
  for (const struct gpuipc__conn *c = b->conns; c != NULL; c = c->next)
    if (may_succeed(b, c))
      return true;
  return false;
}

/*
 * Wait up to @ms for @c's message of @type (HANDOFF_ACCEPT or
 * HANDOFF_ACK) carrying @count: 0 when it came, < 0 when the connection
 * ended first (or the count differs), 1 when nothing came in time.
 */
static int handoff_wait(struct gpuipc__broker *b, struct gpuipc__conn *c,
                        uint16_t type, uint32_t count, int ms)
{
  uint64_t deadline = gpuipc__deadline(ms);
  for (;;) {
    int fds[GPUIPC_FDS_MAX];
    int nfds = GPUIPC_FDS_MAX;
    ssize_t len = gpuipc__sock_recv(c->fd, b->rbuf, sizeof(b->rbuf), fds,
                                    &nfds, gpuipc__ms_left(deadline));
    if (len == -ETIMEDOUT)
      return 1;
    if (len < 0)
      return (int)len;
    for (int i = 0; i < nfds; i++)
      gpuipc__fd_close(&fds[i]);
    /* Requests it sent before it knew are dropped: they will be retried. */
    if (gpuipc__msg_decode(b->rbuf, (size_t)len, nfds, &b->in) == 0 &&
        b->in.type == type)
      return b->in.u.handoff_ack.count == count
                 ? 0
                 : gpuipc__err(GPUIPC_E_PROTO, "hand-over of %u segments "
                               "answered with %s of %u", count,
                               gpuipc__msg_name(type),
                               b->in.u.handoff_ack.count);
  }
}

/* The members besides @succ that may take the domain over: once it has,
 * they reconnect to it. */
static uint32_t members_back(const struct gpuipc__broker *b,
                             const struct gpuipc__conn *succ)
{
  uint32_t n = 0;
  for (const struct gpuipc__conn *c = b->conns; c != NULL; c = c->next)
    n += c != succ && may_succeed(b, c);
  return n;
}

static uint32_t handoff_count(const struct gpuipc__broker *b)
{
  uint32_t count = 0;
  for (const struct gpuipc__seg *s = b->reg.head; s != NULL; s = s->next)
    count += s->w.state != GPUIPC__SEG_CREATING;
  return count;
}

/*
 * Ask @c whether it takes the domain over, before anything that cannot be
 * taken back (the lock, the listener) goes to it: a member that does not
 * read its connection (stopped, stuck, hostile) never answers, and would
 * hold the lock unread in its socket. 0: it accepted; < 0: it did not, in
 * time or at all.
 */
static int handoff_offer(struct gpuipc__broker *b, struct gpuipc__conn *c)
{
  struct gpuipc__msg *o = &b->out;
  uint32_t count = handoff_count(b);
  o->type = GPUIPC_MSG_HANDOFF_OFFER;
  o->req = 0;
  o->u.handoff_offer.count = count;
  int rc = gpuipc__proto_send(c->fd, o, NULL, 0, HANDOFF_OFFER_MS);
  if (rc == 0)
    rc = handoff_wait(b, c, GPUIPC_MSG_HANDOFF_ACCEPT, count,
                      HANDOFF_OFFER_MS);
  if (rc == 1 || rc == -ETIMEDOUT)
    rc = gpuipc__err(-ETIMEDOUT, "pid %d did not accept the domain within "
                     "%d ms", (int)c->cred.pid, HANDOFF_OFFER_MS);
  return rc;
}

/*
 * Send the whole registry, the lock and the listener to @c and wait for
 * its acknowledgement. Returns as handoff_wait does.
 */
static int handoff_to(struct gpuipc__broker *b, struct gpuipc__conn *c)
{
  struct gpuipc__msg *o = &b->out;
  uint32_t count = handoff_count(b);
  o->type = GPUIPC_MSG_HANDOFF_BEGIN;
  o->req = 0;
  o->u.handoff_begin.epoch = b->epoch;
  o->u.handoff_begin.next_id = b->next_id;
  o->u.handoff_begin.count = count;
  o->u.handoff_begin.members = members_back(b, c);
  int fds[2] = {b->lock_fd, b->listen_fd};
  int rc = gpuipc__proto_send(c->fd, o, fds, 2, HANDOFF_SEND_MS);
  for (struct gpuipc__seg *s = b->reg.head; s != NULL && rc == 0;
       s = s->next) {
    if (s->w.state == GPUIPC__SEG_CREATING)
      continue;
    o->type = GPUIPC_MSG_HANDOFF_SEG;
    o->u.handoff_seg.seg = s->w;
    rc = gpuipc__proto_send(c->fd, o, &s->fd, s->fd >= 0 ? 1 : 0,
                            HANDOFF_SEND_MS);
  }
  if (rc == 0) {
    o->type = GPUIPC_MSG_HANDOFF_END;
    o->u.handoff_end.count = count;
    rc = gpuipc__proto_send(c->fd, o, NULL, 0, HANDOFF_SEND_MS);
  }
  if (rc == 0)
    rc = handoff_wait(b, c, GPUIPC_MSG_HANDOFF_ACK, count, HANDOFF_ACK_MS);
  return rc;
}

bool gpuipc__bk_try_handoff(struct gpuipc__broker *b)
{
  /* Oldest members first; a member of another process before our own. */
  for (int pass = 0; pass < 2; pass++) {
    struct gpuipc__conn *best;
    uint64_t after = 0;
    for (;;) {
      best = NULL;
      for (struct gpuipc__conn *c = b->conns; c != NULL; c = c->next) {
        if (!may_succeed(b, c) || c->seq <= after ||
            ((c->cred.pid == b->pid) != (pass == 1)))
          continue;
        if (best == NULL || c->seq < best->seq)
          best = c;
      }
      if (best == NULL)
        break;
      after = best->seq;
      /* Replies it would get die with the connection. */
      gpuipc__bk_outbox_free(best);
      int rc = handoff_offer(b, best);
      if (rc == 0)
        rc = handoff_to(b, best);
      if (rc == 0) {
        GPUIPC_LOG_I("broker %s: handed %zu segments over to pid %d",
                     b->name, b->reg.count, (int)best->cred.pid);
        return true;
      }
      if (rc == 1) {
        GPUIPC_LOG_W("broker %s: pid %d took the hand-over but did not "
                     "acknowledge it; leaving the domain to it",
                     b->name, (int)best->cred.pid);
        return true;
      }
      GPUIPC_LOG_W("broker %s: hand-over to pid %d failed: %s", b->name,
                   (int)best->cred.pid, gpuipc_last_error());
      best->doomed = true;
      /* A member that came back but answered too late may only be slow:
       * dropped, it reconnects, and is waited for again. */
      if (rc == -ETIMEDOUT && (best->hello_flags & GPUIPC__HELLO_REJOIN) &&
          b->came_back > 0)
        b->came_back--;
    }
  }
  return false;
}

/* ------------------------------------------------------------------------ */
/* The member taking the domain over                                        */
/* ------------------------------------------------------------------------ */

void gpuipc__handoff_discard(struct gpuipc__handoff_in *h)
{
  if (!h->active)
    return;
  gpuipc__fd_close(&h->init.lock_fd);
  gpuipc__fd_close(&h->init.listen_fd);
  if (h->init.have_reg)
    gpuipc__reg_destroy(&h->init.reg);
  memset(h, 0, sizeof(*h));
  h->init.lock_fd = h->init.listen_fd = -1;
}

void gpuipc__handoff_begin(struct gpuipc__handoff_in *h, const char *name,
                           uint64_t token, const struct gpuipc__msg *m,
                           int *fds)
{
  gpuipc__handoff_discard(h);
  struct gpuipc__broker_init *init = &h->init;
  memset(init, 0, sizeof(*init));
  if (gpuipc__reg_init(&init->reg) != 0) {
    gpuipc__fd_close(&fds[0]);
    gpuipc__fd_close(&fds[1]);
    return;
  }
  init->have_reg = true;
  snprintf(init->name, sizeof(init->name), "%s", name);
  init->lock_fd = fds[0];
  init->listen_fd = fds[1];
  fds[0] = fds[1] = -1;
  init->epoch = m->u.handoff_begin.epoch;
  init->next_id = m->u.handoff_begin.next_id;
  init->recovery = GPUIPC__RECOVER_HANDOFF;
  init->owner_token = token;
  init->members_back = m->u.handoff_begin.members;
  h->expect = m->u.handoff_begin.count;
  h->got = 0;
  h->active = true;
}

void gpuipc__handoff_seg(struct gpuipc__handoff_in *h, const char *name,
                         const struct gpuipc__msg *m, int *fds, int nfds)
{
  const struct gpuipc__seg_wire *w = &m->u.handoff_seg.seg;
  struct gpuipc__registry *reg = &h->init.reg;
  if (!h->active || gpuipc__reg_by_id(reg, w->id) != NULL ||
      (w->state != GPUIPC__SEG_UNLINKED &&
       gpuipc__reg_by_name(reg, w->name) != NULL)) {
    GPUIPC_LOG_W("domain %s: unexpected hand-over record %s", name,
                 w->name);
    return;
  }
  struct gpuipc__seg *s;
  if (gpuipc__reg_add(reg, w->name, w->id, &s) != 0) {
    gpuipc__handoff_discard(h);
    return;
  }
  s->w = *w; /* the record as the last broker had it, state and all */
  if (w->state == GPUIPC__SEG_UNLINKED)
    gpuipc__reg_unname(reg, s);
  if (nfds == 1) {
    gpuipc__reg_set_fd(reg, s, fds[0]);
    fds[0] = -1;
  }
  h->got++;
}

bool gpuipc__handoff_end(struct gpuipc__handoff_in *h, const char *name,
                         const struct gpuipc__msg *m,
                         struct gpuipc__broker_init *out)
{
  if (!h->active)
    return false;
  if (h->got != h->expect || m->u.handoff_end.count != h->expect) {
    GPUIPC_LOG_W("domain %s: hand-over announced %u segments, %u arrived; "
                 "ignoring it", name, h->expect, h->got);
    gpuipc__handoff_discard(h);
    return false;
  }
  *out = h->init;
  memset(h, 0, sizeof(*h));
  h->init.lock_fd = h->init.listen_fd = -1;
  return true;
}

void gpuipc__handoff_answer(struct gpuipc__msg *m)
{
  if (m->type == GPUIPC_MSG_HANDOFF_OFFER) {
    uint32_t count = m->u.handoff_offer.count;
    m->type = GPUIPC_MSG_HANDOFF_ACCEPT;
    m->u.handoff_accept.count = count;
  } else {
    uint32_t count = m->u.handoff_end.count;
    m->type = GPUIPC_MSG_HANDOFF_ACK;
    m->u.handoff_ack.count = count;
  }
  m->req = 0;
}
