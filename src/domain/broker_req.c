/*
 * A member's requests to the broker, one handler each: OPEN and UNLINK
 * (served or parked by broker_seg.c), PUBLISH, READY, ABANDON, RELEASE,
 * DISOWN, LIST and REPUBLISH (a member's holds brought to a new broker).
 * broker_conn.c hands each decoded request of a member here; what may be
 * published is checked by broker_check.c, and every change of a segment's
 * state goes through gpuipc__bk_seg_set_state (broker_journal.c). See
 * broker_int.h for the other broker files.
 */
#include "domain/broker_int.h"
#include "os/os.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The park request @m (OPEN or UNLINK) of segment @name would wait in. */
static void park_of(struct park *p, const struct gpuipc__msg *m,
                    const char *name, uint64_t deadline)
{
  memset(p, 0, sizeof(*p));
  p->type = m->type;
  p->req = m->req;
  snprintf(p->name, sizeof(p->name), "%s", name);
  p->deadline = deadline;
}

static void on_open(struct gpuipc__broker *b, struct gpuipc__conn *c,
                    const struct gpuipc__msg *m)
{
  struct park p;
  uint32_t ms = m->u.open.timeout_ms;
  park_of(&p, m, m->u.open.name,
          ms == GPUIPC__WAIT_FOREVER
              ? UINT64_MAX
              : gpuipc__now_ns() + (uint64_t)ms * 1000000u);
  p.flags = m->u.open.flags;
  p.kind = m->u.open.kind;
  p.size = m->u.open.size;
  if ((p.flags & GPUIPC_EXCL) && !(p.flags & GPUIPC_CREATE)) {
    gpuipc__bk_send_error(b, c, m->req, -EINVAL,
                          "GPUIPC_EXCL needs GPUIPC_CREATE");
    return;
  }
  gpuipc__bk_dispatch_open(b, c, &p);
}

static void on_unlink(struct gpuipc__broker *b, struct gpuipc__conn *c,
                      const struct gpuipc__msg *m)
{
  struct park p;
  park_of(&p, m, m->u.unlink.name, UINT64_MAX);
  p.id = m->u.unlink.id;
  gpuipc__bk_dispatch_unlink(b, c, &p);
}

/*
 * Make @s published (or filling, as @w says) with @w's record and @fd
 * (taken). The record keeps its id and its name: the name is what indexes
 * it, and a peer's word must not move it to another bucket. A filling @s
 * gets no creator here: the caller names it (fill_by).
 */
static void publish_into(struct gpuipc__broker *b, struct gpuipc__seg *s,
                         const struct gpuipc__seg_wire *w, int *fd,
                         uint32_t pid)
{
  uint8_t state = !s->named                         ? GPUIPC__SEG_UNLINKED
                  : w->state == GPUIPC__SEG_FILLING ? GPUIPC__SEG_FILLING
                                                    : GPUIPC__SEG_PUBLISHED;
  struct gpuipc__seg_wire rec = *w;
  rec.id = s->w.id;
  memcpy(rec.name, s->w.name, sizeof(rec.name));
  rec.state = s->w.state; /* changed below, and journaled */
  s->w = rec;
  if (s->creator != NULL)
    s->creator->nreserved--;
  s->creator = NULL;
  s->creator_pid = pid;
  gpuipc__reg_set_fd(&b->reg, s, *fd);
  *fd = -1;
  gpuipc__bk_seg_set_state(b, s, state);
}

/*
 * Refuse @c's PUBLISH of @w: its descriptor, or memory that is not its own
 * to keep. A reservation it held for the name goes too, so that whoever
 * waits for the name may create it.
 */
static void refuse_publish(struct gpuipc__broker *b, struct gpuipc__conn *c,
                           const struct gpuipc__msg *m, int code,
                           const char *why)
{
  const struct gpuipc__seg_wire *w = &m->u.publish.seg;
  GPUIPC_LOG_W("broker %s: refused pid %d's publication of %s: %s", b->name,
               (int)c->cred.pid, w->name, why);
  gpuipc__bk_send_error(b, c, m->req, code,
                        "segment %s: publication refused: %s", w->name, why);
  struct gpuipc__seg *s = gpuipc__reg_by_name(&b->reg, w->name);
  if (s == NULL || s->w.state != GPUIPC__SEG_CREATING || s->creator != c ||
      s->w.id != w->id)
    return;
  char name[GPUIPC__NAME_MAX + 1];
  snprintf(name, sizeof(name), "%s", s->w.name);
  c->nreserved--;
  gpuipc__reg_remove(&b->reg, s);
  gpuipc__bk_redispatch(b, name);
}

/* Filling @s is @c's to publish (READY) or to free by going. */
static void fill_by(struct gpuipc__seg *s, struct gpuipc__conn *c)
{
  s->creator = c;
  s->creator_pid = (uint32_t)c->cred.pid;
  c->nreserved++;
  s->keeper = NULL; /* a keeper keeps published memory: not yet */
}

static void on_publish(struct gpuipc__broker *b, struct gpuipc__conn *c,
                       const struct gpuipc__msg *m, int *fd)
{
  const struct gpuipc__seg_wire *w = &m->u.publish.seg;
  uint32_t pid = (uint32_t)c->cred.pid;
  char why[GPUIPC__TEXT_MAX + 1];
  int rc = gpuipc__bk_publish_check(c, w, *fd, why, sizeof(why));
  if (rc != 0) {
    refuse_publish(b, c, m, rc, why);
    return;
  }
  struct gpuipc__seg *s = gpuipc__reg_by_name(&b->reg, w->name);
  if (s != NULL && s->w.state == GPUIPC__SEG_CREATING) {
    if (s->creator != c || s->w.id != w->id) {
      gpuipc__bk_send_error(b, c, m->req, -EEXIST,
                            "segment %s is being created by pid %u", w->name,
                            s->creator_pid);
      return;
    }
    if (s->w.size != w->size) {
      gpuipc__bk_send_error(
          b, c, m->req, GPUIPC_E_MISMATCH,
          "segment %s was reserved with %llu bytes, published with "
          "%llu",
          w->name, (unsigned long long)s->w.size, (unsigned long long)w->size);
      return;
    }
  } else if (s != NULL && s->w.state == GPUIPC__SEG_PUBLISHED) {
    /* A creator repeating a publication the last broker accepted. */
    if (memcmp(s->w.handle, w->handle, sizeof(w->handle)) != 0) {
      gpuipc__bk_send_error(b, c, m->req, -EEXIST,
                            "segment %s was created by pid %u meanwhile",
                            w->name, s->creator_pid);
      return;
    }
    if (!gpuipc__bk_is_exporter(c, w)) { /* then it is not its creator either */
      gpuipc__bk_send_error(
          b, c, m->req, GPUIPC_E_DENIED,
          "segment %s (id %llu) is published already, by pid %u; "
          "pid %u may not publish it again",
          w->name, (unsigned long long)s->w.id, gpuipc__bk_exporter_pid(w),
          pid);
      return;
    }
    if (gpuipc__reg_hold(s, c, pid, 1) != 0) {
      gpuipc__bk_send_error(b, c, m->req, -ENOMEM, "broker out of memory");
      return;
    }
    if (gpuipc__bk_creator_held(s))
      s->keeper = c;
    gpuipc__bk_send_id(b, c, GPUIPC_MSG_OK, m->req, s->w.id);
    return;
  } else if (s != NULL && s->w.state == GPUIPC__SEG_FILLING) {
    gpuipc__bk_send_error(b, c, m->req, -EEXIST,
                          "segment %s is being filled by pid %u", w->name,
                          s->creator_pid);
    return;
  } else {
    /* No reservation (the broker changed since CREATE_IT): take it anew. */
    if (s != NULL) /* LOST */
      gpuipc__bk_seg_forget(b, s);
    if (gpuipc__reg_add(&b->reg, w->name, gpuipc__bk_take_id(b), &s) != 0) {
      gpuipc__bk_send_error(b, c, m->req, -ENOMEM, "broker out of memory");
      return;
    }
  }
  publish_into(b, s, w, fd, pid);
  if (s->w.state == GPUIPC__SEG_FILLING)
    fill_by(s, c);
  else if (gpuipc__bk_creator_held(s))
    s->keeper = c;
  if (gpuipc__reg_hold(s, c, pid, 1) != 0) {
    gpuipc__bk_send_error(b, c, m->req, -ENOMEM, "broker out of memory");
    return;
  }
  GPUIPC_LOG_D("broker %s: pid %u %s %s (id %llu, %llu bytes)", b->name,
               pid, s->w.state == GPUIPC__SEG_FILLING ? "fills" : "published",
               s->w.name, (unsigned long long)s->w.id,
               (unsigned long long)s->w.size);
  gpuipc__bk_send_id(b, c, GPUIPC_MSG_OK, m->req, s->w.id);
  if (s->w.state != GPUIPC__SEG_FILLING)
    gpuipc__bk_redispatch(b, s->w.name);
}

/*
 * The creator of filling segment id wrote it: publish it, with the event
 * its writes were recorded on, and serve the requests waiting for it.
 */
static void on_ready(struct gpuipc__broker *b, struct gpuipc__conn *c,
                     const struct gpuipc__msg *m)
{
  uint64_t id = m->u.ready.id;
  struct gpuipc__seg *s = gpuipc__reg_by_id(&b->reg, id);
  uint32_t pid = (uint32_t)c->cred.pid;
  if (s == NULL || (s->w.state != GPUIPC__SEG_FILLING &&
                    s->w.state != GPUIPC__SEG_PUBLISHED)) {
    gpuipc__bk_send_error(b, c, m->req, -ENOENT,
                          "no segment id %llu being filled in "
                          "domain %s",
                          (unsigned long long)id, b->name);
    return;
  }
  if (s->w.state == GPUIPC__SEG_PUBLISHED) {
    /* Published by this process already (a repeat after a failover that
     * the last broker answered), or someone else's. */
    gpuipc__bk_send_error(
        b, c, m->req, s->creator_pid == pid ? -EALREADY : -EINVAL,
        "segment %s (id %llu) was published by pid %u already", s->w.name,
        (unsigned long long)id, s->creator_pid);
    return;
  }
  if (s->creator != c) {
    gpuipc__bk_send_error(b, c, m->req, -EINVAL,
                          "segment %s (id %llu) is filled by "
                          "pid %u, not by pid %u",
                          s->w.name, (unsigned long long)id, s->creator_pid,
                          pid);
    return;
  }
  s->w.has_event = m->u.ready.has_event;
  memcpy(s->w.event, m->u.ready.event, sizeof(s->w.event));
  c->nreserved--;
  s->creator = NULL;
  if (gpuipc__bk_creator_held(s))
    s->keeper = c;
  gpuipc__bk_seg_set_state(b, s, GPUIPC__SEG_PUBLISHED);
  GPUIPC_LOG_D("broker %s: pid %u published %s (id %llu)%s", b->name, pid,
               s->w.name, (unsigned long long)id,
               s->w.has_event ? ", ordered by an event" : "");
  gpuipc__bk_send_id(b, c, GPUIPC_MSG_OK, m->req, id);
  gpuipc__bk_redispatch(b, s->w.name);
}

static void on_abandon(struct gpuipc__broker *b, struct gpuipc__conn *c,
                       const struct gpuipc__msg *m)
{
  struct gpuipc__seg *s = gpuipc__reg_by_id(&b->reg, m->u.abandon.id);
  if (s == NULL || s->w.state != GPUIPC__SEG_CREATING || s->creator != c)
    return;
  c->nreserved--;
  char name[GPUIPC__NAME_MAX + 1];
  snprintf(name, sizeof(name), "%s", s->w.name);
  gpuipc__reg_remove(&b->reg, s);
  gpuipc__bk_redispatch(b, name);
}

static void on_release(struct gpuipc__broker *b, struct gpuipc__conn *c,
                       const struct gpuipc__msg *m)
{
  struct gpuipc__seg *s = gpuipc__reg_by_id(&b->reg, m->u.release.id);
  if (s == NULL)
    return;
  gpuipc__reg_drop(s, c, m->u.release.count);
  gpuipc__bk_maybe_free(b, s);
}

/*
 * The creator keeping segment id's memory leaves the domain. OK: nobody
 * else holds it, free it now; -EBUSY: others do (or may, while the broker
 * recovers), keep it until the process exits. Either way the segment no
 * longer has a keeper: published, it is lost.
 */
static void on_disown(struct gpuipc__broker *b, struct gpuipc__conn *c,
                      const struct gpuipc__msg *m)
{
  uint64_t id = m->u.disown.id;
  struct gpuipc__seg *s = gpuipc__reg_by_id(&b->reg, id);
  if (s == NULL) {
    gpuipc__bk_send_id(b, c, GPUIPC_MSG_OK, m->req, id);
    return;
  }
  char name[GPUIPC__NAME_MAX + 1];
  snprintf(name, sizeof(name), "%s", s->w.name);
  uint32_t others = s->nholders - (gpuipc__reg_refs(s, c) != 0 ? 1u : 0u);
  if (s->keeper == c)
    gpuipc__bk_keeper_gone(b, s); /* may free s */
  if (gpuipc__bk_recovering(b))
    gpuipc__bk_send_error(
        b, c, m->req, -EBUSY,
        "segment %s (id %llu): the broker of "
        "domain %s is recovering from a failover and may not know "
        "every holder yet",
        name, (unsigned long long)id, b->name);
  else if (others != 0)
    gpuipc__bk_send_error(b, c, m->req, -EBUSY,
                          "segment %s (id %llu) is still held "
                          "by %u other process%s",
                          name, (unsigned long long)id, others,
                          others == 1 ? "" : "es");
  else
    gpuipc__bk_send_id(b, c, GPUIPC_MSG_OK, m->req, id);
}

static void fill_list_rec(struct gpuipc__list_rec *lr,
                          const struct gpuipc__seg *s)
{
  lr->seg = s->w;
  lr->seg.has_handle = false;
  lr->seg.htype = 0;
  lr->seg.has_event = false;
  lr->broker_fd = s->fd >= 0;
  lr->keeper_pid = s->keeper != NULL ? (uint32_t)s->keeper->cred.pid : 0;
  lr->nholders = s->nholders;
  lr->nlisted = 0;
  for (uint32_t i = 0; i < s->nholders && i < GPUIPC__LIST_HOLDERS; i++) {
    lr->holders[i].pid = s->holders[i].pid;
    lr->holders[i].refs = s->holders[i].refs;
    lr->nlisted++;
  }
}

static void on_list(struct gpuipc__broker *b, struct gpuipc__conn *c,
                    const struct gpuipc__msg *m)
{
  struct gpuipc__msg *o = &b->out;
  o->type = GPUIPC_MSG_LIST_REPLY;
  o->req = m->req;
  o->u.list_reply.broker_pid = (uint32_t)b->pid;
  o->u.list_reply.epoch = b->epoch;
  /* A doomed connection still counts until reap() drops what it held, so
   * that members, segments and fds in one reply agree with each other. */
  o->u.list_reply.members = 0;
  for (struct gpuipc__conn *k = b->conns; k != NULL; k = k->next)
    o->u.list_reply.members += k->state == CONN_READY;
  o->u.list_reply.segments = (uint32_t)b->reg.count;
  o->u.list_reply.fds = (uint32_t)b->reg.fds;
  o->u.list_reply.more = 0;
  o->u.list_reply.count = 0;
  if (m->u.list.name[0] != '\0') {
    struct gpuipc__seg *s = gpuipc__reg_by_name(&b->reg, m->u.list.name);
    if (s == NULL) {
      gpuipc__bk_send_error(b, c, m->req, -ENOENT, "no segment %s in domain %s",
                            m->u.list.name, b->name);
      return;
    }
    fill_list_rec(&o->u.list_reply.recs[0], s);
    o->u.list_reply.count = 1;
    gpuipc__bk_send(c, o, NULL, 0);
    return;
  }
  struct gpuipc__seg *s = b->reg.head;
  if (m->u.list.after_id != 0) {
    struct gpuipc__seg *a = gpuipc__reg_by_id(&b->reg, m->u.list.after_id);
    if (a != NULL)
      s = a->next;
    else
      while (s != NULL && s->w.id <= m->u.list.after_id)
        s = s->next;
  }
  for (; s != NULL && o->u.list_reply.count < m->u.list.max; s = s->next)
    fill_list_rec(&o->u.list_reply.recs[o->u.list_reply.count++], s);
  o->u.list_reply.more = s != NULL;
  gpuipc__bk_send(c, o, NULL, 0);
}

/*
 * Count the holds a re-publication of @s brings, take its keeper, and serve
 * the requests waiting for its name. REPUBLISH has no reply: a member whose
 * holds cannot be counted is disconnected, so that it re-publishes them all
 * again (to this broker or the next) rather than have the broker count
 * fewer than it holds. May free @s.
 */
static void republish_take(struct gpuipc__broker *b, struct gpuipc__conn *c,
                           struct gpuipc__seg *s, uint32_t holds, bool keeper)
{
  if (holds != 0 &&
      gpuipc__reg_hold(s, c, (uint32_t)c->cred.pid, holds) != 0) {
    GPUIPC_LOG_W("broker %s: cannot count the %u holds pid %d re-published "
                 "on segment %s (%s); disconnecting it",
                 b->name, holds, (int)c->cred.pid, s->w.name,
                 gpuipc_last_error());
    c->doomed = true;
    return;
  }
  if (keeper)
    s->keeper = c;
  if (s->named)
    gpuipc__bk_redispatch(b, s->w.name);
  else if (holds == 0)
    gpuipc__bk_maybe_free(b, s); /* kept by its creator alone */
}

/*
 * Refuse @c's REPUBLISH @m with @code and a sentence: the member is told
 * (an ERROR to the request, which is otherwise unanswered) and nothing it
 * sent is counted. @drop: what it sent cannot be a record of what it
 * holds (another segment's id, a descriptor that is not the memory, a
 * keeper's claim on memory it did not export): it is disconnected too, and
 * re-publishes what it holds whole, to this broker or the next.
 */
static void refuse_republish(struct gpuipc__broker *b, struct gpuipc__conn *c,
                             const struct gpuipc__msg *m, int code,
                             bool drop, const char *fmt, ...)
    GPUIPC__PRINTF(6, 7);
static void refuse_republish(struct gpuipc__broker *b, struct gpuipc__conn *c,
                             const struct gpuipc__msg *m, int code,
                             bool drop, const char *fmt, ...)
{
  const struct gpuipc__seg_wire *w = &m->u.republish.seg;
  char why[GPUIPC__TEXT_MAX + 1];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof(why), fmt, ap);
  va_end(ap);
  GPUIPC_LOG_W("broker %s: refused pid %d's re-publication of segment %s "
               "(id %llu): %s%s", b->name, (int)c->cred.pid, w->name,
               (unsigned long long)w->id, why,
               drop ? "; disconnecting it" : "");
  gpuipc__bk_send_error(b, c, m->req, code,
                        "segment %s (id %llu): re-publication refused: %s",
                        w->name, (unsigned long long)w->id, why);
  if (drop)
    c->doomed = true;
}

/*
 * A re-publication of @s (known by its id) where either side is filling.
 * Filling on both sides (handed over without its creator's connection):
 * @c, its creator -- the process that exported it -- takes it back.
 * Filling only on @c's side: the last broker took the creator's READY, so
 * @c counts as a holder. Filling here by another connection, or not @c's
 * to fill: refused.
 */
static void republish_filling(struct gpuipc__broker *b,
                              struct gpuipc__conn *c,
                              const struct gpuipc__msg *m,
                              struct gpuipc__seg *s)
{
  const struct gpuipc__seg_wire *w = &m->u.republish.seg;
  if (s->w.state == GPUIPC__SEG_FILLING) {
    if (w->state != GPUIPC__SEG_FILLING || s->creator != NULL ||
        !gpuipc__bk_is_exporter(c, &s->w)) {
      refuse_republish(b, c, m, GPUIPC_E_DENIED, false,
                       "it is being filled by pid %u",
                       s->creator != NULL ? s->creator_pid
                                          : gpuipc__bk_exporter_pid(&s->w));
      return;
    }
    fill_by(s, c);
  }
  republish_take(b, c, s, m->u.republish.holds, false);
}

/*
 * A re-publication of @s, which the broker knows by @m's id. Only the
 * segment the id names comes back under it, and a record with memory
 * keeps its memory: a member re-publishing it counts its holds (and its
 * creator takes up keeping it), one whose record names other memory is
 * refused. A record without memory (lost) takes it from the member that
 * brings it -- the memory the journal says it had, if it says -- memory its
 * creator holds only from the creator, or from any survivor while the
 * broker recovers (end_recovery then checks that the creator came back
 * too). May free @s.
 */
static void republish_known(struct gpuipc__broker *b, struct gpuipc__conn *c,
                            const struct gpuipc__msg *m,
                            struct gpuipc__seg *s, int *fd)
{
  const struct gpuipc__seg_wire *w = &m->u.republish.seg;
  bool keeper = (m->u.republish.flags & GPUIPC__REPUB_KEEPER) != 0;
  char why[GPUIPC__TEXT_MAX + 1];
  /*
   * A record of another name, kind or size, or a reservation still being
   * created (another member's), is not what this member held.
   */
  if (s->w.state == GPUIPC__SEG_CREATING || strcmp(s->w.name, w->name) != 0 ||
      s->w.kind != w->kind || s->w.size != w->size) {
    refuse_republish(b, c, m, GPUIPC_E_DENIED, true,
                     "it says kind %u, %llu bytes, but that id is %s%s "
                     "(kind %u, %llu bytes)", w->kind,
                     (unsigned long long)w->size,
                     s->w.state == GPUIPC__SEG_CREATING ? "a reservation of "
                                                        : "segment ",
                     s->w.name, s->w.kind, (unsigned long long)s->w.size);
    return;
  }
  bool has_memory = s->w.state != GPUIPC__SEG_LOST && s->w.has_handle;
  if (has_memory && !gpuipc__bk_same_memory(&s->w, w, why, sizeof(why))) {
    refuse_republish(b, c, m, GPUIPC_E_DENIED, false, "%s", why);
    return;
  }
  if (s->w.state == GPUIPC__SEG_FILLING || w->state == GPUIPC__SEG_FILLING) {
    republish_filling(b, c, m, s);
    return;
  }
  if (!has_memory) {
    if (s->mem_id != 0 && gpuipc__bk_mem_id(w) != s->mem_id) {
      refuse_republish(b, c, m, GPUIPC_E_DENIED, false,
                       "other memory: not the memory the last broker's "
                       "journal says it had");
      return;
    }
    if (!keeper && !gpuipc__bk_recovering(b) &&
        gpuipc__bk_held_by_creator(w)) {
      refuse_republish(b, c, m, GPUIPC_E_DENIED, false,
                       "it is lost, and memory its creator holds comes back "
                       "only with its creator, or with any survivor while "
                       "a new broker recovers");
      return;
    }
    if (s->w.state == GPUIPC__SEG_LOST && w->state == GPUIPC__SEG_UNLINKED)
      gpuipc__bk_seg_set_state(b, s, GPUIPC__SEG_UNLINKED);
    publish_into(b, s, w, fd,
                 s->creator_pid ? s->creator_pid : (uint32_t)c->cred.pid);
  }
  republish_take(b, c, s, m->u.republish.holds, keeper);
}

/*
 * What a member held when its broker changed (it says so: HELLO_REJOIN),
 * brought back to this broker.
 */
static void on_republish(struct gpuipc__broker *b, struct gpuipc__conn *c,
                         const struct gpuipc__msg *m, int *fd)
{
  const struct gpuipc__seg_wire *w = &m->u.republish.seg;
  uint32_t pid = (uint32_t)c->cred.pid;
  bool keeper = (m->u.republish.flags & GPUIPC__REPUB_KEEPER) != 0;
  char why[GPUIPC__TEXT_MAX + 1];
  if (!(c->hello_flags & GPUIPC__HELLO_REJOIN)) {
    refuse_republish(b, c, m, GPUIPC_E_DENIED, false,
                     "pid %u joined without coming back from a broker "
                     "change: it has nothing to re-publish", pid);
    return;
  }
  int rc = gpuipc__bk_republish_check(c, w, *fd, keeper, why, sizeof(why));
  if (rc != 0) {
    refuse_republish(b, c, m, rc, true, "%s", why);
    return;
  }
  gpuipc__bk_learn_id(b, w->id);
  struct gpuipc__seg *s = gpuipc__reg_by_id(&b->reg, w->id);
  if (s != NULL) {
    republish_known(b, c, m, s, fd);
    return;
  }
  if (w->state != GPUIPC__SEG_UNLINKED) {
    struct gpuipc__seg *n = gpuipc__reg_by_name(&b->reg, w->name);
    if (n != NULL && n->w.state != GPUIPC__SEG_LOST) {
      refuse_republish(b, c, m, -EEXIST, false,
                       "the name now belongs to segment id %llu",
                       (unsigned long long)n->w.id);
      return;
    }
    if (n != NULL)
      gpuipc__bk_seg_forget(b, n);
  }
  /*
   * An unlinked segment may share its old name with a newer one: adding
   * indexes it by name for a moment, unnaming removes exactly this entry.
   */
  if (gpuipc__reg_add(&b->reg, w->name, w->id, &s) != 0)
    return;
  if (w->state == GPUIPC__SEG_UNLINKED)
    gpuipc__reg_unname(&b->reg, s);
  publish_into(b, s, w, fd, pid);
  if (s->w.state == GPUIPC__SEG_FILLING)
    fill_by(s, c);
  GPUIPC_LOG_D("broker %s: pid %u re-published %s (id %llu)%s", b->name, pid,
               w->name, (unsigned long long)w->id,
               keeper ? ", keeping its memory" : "");
  republish_take(b, c, s, m->u.republish.holds, keeper);
}

void gpuipc__bk_request(struct gpuipc__broker *b, struct gpuipc__conn *c,
                        const struct gpuipc__msg *m, int *fds, int nfds)
{
  int *fd = nfds ? &fds[0] : &(int){-1};
  switch (m->type) {
  case GPUIPC_MSG_OPEN: on_open(b, c, m); break;
  case GPUIPC_MSG_PUBLISH: on_publish(b, c, m, fd); break;
  case GPUIPC_MSG_ABANDON: on_abandon(b, c, m); break;
  case GPUIPC_MSG_READY: on_ready(b, c, m); break;
  case GPUIPC_MSG_RELEASE: on_release(b, c, m); break;
  case GPUIPC_MSG_DISOWN: on_disown(b, c, m); break;
  case GPUIPC_MSG_UNLINK: on_unlink(b, c, m); break;
  case GPUIPC_MSG_LIST: on_list(b, c, m); break;
  case GPUIPC_MSG_REPUBLISH: on_republish(b, c, m, fd); break;
  default:
    GPUIPC_LOG_W("broker %s: pid %d sent %s, which members do not send; "
                 "disconnecting",
                 b->name, (int)c->cred.pid, gpuipc__msg_name(m->type));
    c->doomed = true;
  }
}
