/*
 * The segments' state machine, as the broker runs it: when a name is
 * reserved (CREATING), unlinked, lost, freed or free again; what a keeper
 * (a creator that holds its memory) leaving does; what a connection that
 * went leaves behind; and the requests (OPEN, UNLINK) that wait -- parked
 * -- for a name to be published or freed, for their deadline, or for the
 * recovery window after a crash to close. Each change of state itself is
 * made (and journaled) by gpuipc__bk_seg_set_state (broker_journal.c);
 * the member's requests that drive it are in broker_req.c. See
 * broker_int.h for the other broker files.
 */
#include "domain/broker_int.h"
#include "os/os.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Requests one member may have waiting at once. */
#define PARKS_MAX 1024
/* Names one member may have reserved (CREATE_IT, not published) at once. */
#define RESERVED_MAX 1024

/* Published @s has no memory any more: its name reads as lost. */
static void lose(struct gpuipc__broker *b, struct gpuipc__seg *s,
                 const char *why)
{
  GPUIPC_LOG_I("broker %s: segment %s (id %llu) %s: lost", b->name,
               s->w.name, (unsigned long long)s->w.id, why);
  s->w.has_handle = false;
  s->w.htype = 0;
  gpuipc__reg_set_fd(&b->reg, s, -1);
  gpuipc__bk_seg_set_state(b, s, GPUIPC__SEG_LOST);
}

/*
 * Filling @s lost its creator (it left, released it, or did not come back
 * after a failover) before it was published: the name is free again, and
 * the requests waiting for it are served anew.
 */
static void unfill(struct gpuipc__broker *b, struct gpuipc__seg *s)
{
  char name[GPUIPC__NAME_MAX + 1];
  snprintf(name, sizeof(name), "%s", s->w.name);
  GPUIPC_LOG_I("broker %s: segment %s (id %llu) went before it was "
               "published; the name is free again", b->name, name,
               (unsigned long long)s->w.id);
  if (s->creator != NULL)
    s->creator->nreserved--;
  gpuipc__bk_seg_forget(b, s);
  gpuipc__bk_redispatch(b, name);
}

/*
 * A segment nobody holds any more (not while holders may still re-join):
 * unlinked, it is freed, and a creator keeping its memory is told to let
 * go of it. Published, it stays while its memory is kept: by the broker's
 * descriptor, or by its creator (LEGACY, fabric, a POOL allocation: those
 * travel without a descriptor that keeps the memory). Nothing keeping it,
 * its name now reads as lost. Filling (only its creator holds it), the
 * name is free again.
 */
void gpuipc__bk_maybe_free(struct gpuipc__broker *b, struct gpuipc__seg *s)
{
  if (s->nholders != 0 || gpuipc__bk_recovering(b))
    return;
  if (s->w.state == GPUIPC__SEG_FILLING) {
    unfill(b, s);
  } else if (s->w.state == GPUIPC__SEG_UNLINKED) {
    if (s->keeper != NULL) {
      GPUIPC_LOG_D("broker %s: segment %s (id %llu): pid %u may free it",
                   b->name, s->w.name, (unsigned long long)s->w.id,
                   (unsigned)s->keeper->cred.pid);
      gpuipc__bk_send_id(b, s->keeper, GPUIPC_MSG_LET_GO, 0, s->w.id);
    }
    GPUIPC_LOG_D("broker %s: segment %s (id %llu) freed", b->name, s->w.name,
                 (unsigned long long)s->w.id);
    gpuipc__reg_remove(&b->reg, s);
  } else if (s->w.state == GPUIPC__SEG_PUBLISHED && s->keeper == NULL &&
             (s->fd < 0 || gpuipc__bk_creator_held(s))) {
    lose(b, s, "has no holder and nothing keeps its memory");
  }
}

/*
 * The creator that kept @s's memory let go of it or left: the memory goes
 * with that process, so a published @s is lost at once (its holders learn
 * it from gpuipc_buf_alive or their next import); an unlinked one goes
 * with its last holder. May free @s.
 */
void gpuipc__bk_keeper_gone(struct gpuipc__broker *b, struct gpuipc__seg *s)
{
  s->keeper = NULL;
  if (gpuipc__bk_recovering(b))
    return; /* end_recovery decides */
  if (s->w.state == GPUIPC__SEG_PUBLISHED)
    lose(b, s, "went with its creator, which kept its memory");
  else
    gpuipc__bk_maybe_free(b, s);
}

static int park(struct gpuipc__broker *b, struct gpuipc__conn *c,
                const struct park *p, bool for_recovery)
{
  if (c->nparks >= PARKS_MAX) {
    gpuipc__bk_send_error(b, c, p->req, -EAGAIN,
                          "pid %d has %d requests waiting already",
                          (int)c->cred.pid, PARKS_MAX);
    return -EAGAIN;
  }
  struct park *n = malloc(sizeof(*n));
  if (n == NULL) {
    gpuipc__bk_send_error(b, c, p->req, -ENOMEM, "broker out of memory");
    return -ENOMEM;
  }
  *n = *p;
  n->conn = c;
  n->recovery = for_recovery;
  gpuipc__bk_park_add(&b->parks, n);
  return 0;
}

static void reserve(struct gpuipc__broker *b, struct gpuipc__conn *c,
                    const struct park *p)
{
  struct gpuipc__seg *s;
  if (c->nreserved >= RESERVED_MAX) {
    gpuipc__bk_send_error(
        b, c, p->req, -EAGAIN,
        "pid %d has %d names reserved and not published already",
        (int)c->cred.pid, RESERVED_MAX);
    return;
  }
  if (gpuipc__reg_add(&b->reg, p->name, gpuipc__bk_take_id(b), &s) != 0) {
    gpuipc__bk_send_error(b, c, p->req, -ENOMEM, "broker out of memory");
    return;
  }
  c->nreserved++;
  s->w.size = p->size;
  s->w.kind = p->kind != GPUIPC_KIND_AUTO ? p->kind : GPUIPC_KIND_HOST;
  s->creator = c;
  s->creator_pid = (uint32_t)c->cred.pid;
  gpuipc__bk_seg_set_state(b, s, GPUIPC__SEG_CREATING);
  gpuipc__bk_send_id(b, c, GPUIPC_MSG_CREATE_IT, p->req, s->w.id);
}

/* Send segment @s as a HANDLE reply (with its fd) and count the hold. */
static void grant(struct gpuipc__broker *b, struct gpuipc__conn *c,
                  uint32_t req, struct gpuipc__seg *s)
{
  if (gpuipc__reg_hold(s, c, (uint32_t)c->cred.pid, 1) != 0) {
    gpuipc__bk_send_error(b, c, req, -ENOMEM, "broker out of memory");
    return;
  }
  struct gpuipc__msg *m = &b->out;
  m->type = GPUIPC_MSG_HANDLE;
  m->req = req;
  m->u.handle.seg = s->w;
  int nfds = s->fd >= 0 ? 1 : 0;
  gpuipc__bk_send(c, m, &s->fd, nfds);
}

void gpuipc__bk_dispatch_open(struct gpuipc__broker *b, struct gpuipc__conn *c,
                              const struct park *p)
{
  bool create = p->flags & GPUIPC_CREATE;
  bool excl = p->flags & GPUIPC_EXCL;
  bool wait = p->flags & GPUIPC_WAIT;
  struct gpuipc__seg *s = gpuipc__reg_by_name(&b->reg, p->name);

  if (gpuipc__bk_recovering(b) && b->recovery == GPUIPC__RECOVER_CRASH &&
      (s == NULL || s->w.state != GPUIPC__SEG_PUBLISHED)) {
    park(b, c, p, true); /* a survivor may still re-publish it */
    return;
  }
  if (s != NULL && s->w.state == GPUIPC__SEG_PUBLISHED) {
    if (create && excl) {
      gpuipc__bk_send_error(b, c, p->req, -EEXIST,
                            "segment %s exists (id %llu)", p->name,
                            (unsigned long long)s->w.id);
      return;
    }
    if (p->size != 0 && p->size != s->w.size) {
      gpuipc__bk_send_error(
          b, c, p->req, GPUIPC_E_MISMATCH,
          "segment %s has %llu bytes, the caller asked for %llu", p->name,
          (unsigned long long)s->w.size, (unsigned long long)p->size);
      return;
    }
    if (p->kind != GPUIPC_KIND_AUTO && p->kind != s->w.kind) {
      gpuipc__bk_send_error(b, c, p->req, GPUIPC_E_MISMATCH,
                            "segment %s is of kind %s, the caller asked for %s",
                            p->name, gpuipc_kind_name((gpuipc_kind_t)s->w.kind),
                            gpuipc_kind_name((gpuipc_kind_t)p->kind));
      return;
    }
    grant(b, c, p->req, s);
    return;
  }
  if (s != NULL && (s->w.state == GPUIPC__SEG_CREATING ||
                    s->w.state == GPUIPC__SEG_FILLING)) {
    if (create && excl) {
      gpuipc__bk_send_error(b, c, p->req, -EEXIST,
                            "segment %s is being created by pid %u", p->name,
                            s->creator_pid);
      return;
    }
    if (create || wait) {
      park(b, c, p, false);
      return;
    }
    gpuipc__bk_send_error(
        b, c, p->req, -ENOENT,
        "segment %s is being created by pid %u and not published yet", p->name,
        s->creator_pid);
    return;
  }
  if (s != NULL && s->w.state == GPUIPC__SEG_LOST) {
    if (create) {
      gpuipc__bk_seg_forget(b, s);
      reserve(b, c, p);
      return;
    }
    gpuipc__bk_send_error(
        b, c, p->req, GPUIPC_E_LOST,
        "segment %s (id %llu) of domain %s was lost: no surviving "
        "process held its memory",
        p->name, (unsigned long long)s->w.id, b->name);
    return;
  }
  /* The name is free. */
  if (create) {
    if (p->size == 0) {
      gpuipc__bk_send_error(b, c, p->req, -EINVAL,
                            "creating segment %s needs a size above 0",
                            p->name);
      return;
    }
    reserve(b, c, p);
    return;
  }
  if (wait) {
    park(b, c, p, false);
    return;
  }
  gpuipc__bk_send_error(b, c, p->req, -ENOENT, "no segment %s in domain %s",
                        p->name, b->name);
}

void gpuipc__bk_dispatch_unlink(struct gpuipc__broker *b,
                                struct gpuipc__conn *c, const struct park *p)
{
  struct gpuipc__seg *s = gpuipc__reg_by_name(&b->reg, p->name);
  if (gpuipc__bk_recovering(b) && b->recovery == GPUIPC__RECOVER_CRASH &&
      (s == NULL || s->w.state != GPUIPC__SEG_PUBLISHED)) {
    park(b, c, p, true);
    return;
  }
  if (s == NULL) {
    gpuipc__bk_send_error(b, c, p->req, -ENOENT, "no segment %s in domain %s",
                          p->name, b->name);
    return;
  }
  if (p->id != 0 && s->w.id != p->id) {
    gpuipc__bk_send_error(b, c, p->req, -ENOENT,
                          "segment %s is segment %llu now, not "
                          "%llu",
                          p->name, (unsigned long long)s->w.id,
                          (unsigned long long)p->id);
    return;
  }
  if (s->w.state == GPUIPC__SEG_CREATING ||
      s->w.state == GPUIPC__SEG_FILLING) {
    gpuipc__bk_send_error(
        b, c, p->req, -ENOENT,
        "segment %s is being created by pid %u and not published yet", p->name,
        s->creator_pid);
    return;
  }
  uint64_t id = s->w.id;
  if (s->w.state == GPUIPC__SEG_LOST) {
    gpuipc__bk_seg_forget(b, s);
  } else {
    gpuipc__bk_seg_set_state(b, s, GPUIPC__SEG_UNLINKED);
    /* Holders keep it alive; tell them, so that after a crash they
     * re-publish it as unlinked rather than resurrect the name. */
    for (uint32_t i = 0; i < s->nholders; i++)
      gpuipc__bk_send_id(b, s->holders[i].conn, GPUIPC_MSG_UNLINKED, 0, id);
    gpuipc__bk_maybe_free(b, s);
  }
  gpuipc__bk_send_id(b, c, GPUIPC_MSG_OK, p->req, id);
}

static void dispatch(struct gpuipc__broker *b, struct gpuipc__conn *c,
                     const struct park *p)
{
  if (p->type == GPUIPC_MSG_OPEN)
    gpuipc__bk_dispatch_open(b, c, p);
  else
    gpuipc__bk_dispatch_unlink(b, c, p);
}

/* Re-run every request parked on @name, in arrival order. */
void gpuipc__bk_redispatch(struct gpuipc__broker *b, const char *name)
{
  /* Taken out first (their counts drop): dispatch may park them again. */
  struct park *mine = gpuipc__bk_parks_take(&b->parks, name);
  while (mine != NULL) {
    struct park *p = mine;
    mine = p->next;
    if (!p->conn->doomed) {
      uint64_t now = gpuipc__now_ns();
      if (p->deadline != UINT64_MAX && now >= p->deadline)
        gpuipc__bk_send_error(b, p->conn, p->req, -ETIMEDOUT,
                              "segment %s: not published in time", p->name);
      else
        dispatch(b, p->conn, p);
    }
    free(p);
  }
}

/* Forget everything @c held, reserved or waited for. */
void gpuipc__bk_conn_drop_state(struct gpuipc__broker *b,
                                struct gpuipc__conn *c)
{
  gpuipc__bk_parks_drop_conn(&b->parks, c);
  /* Names whose reservation died: the next waiter may create them. */
  char (*freed)[GPUIPC__NAME_MAX + 1] = NULL;
  size_t nfreed = 0, capfreed = 0;
  struct gpuipc__seg *s = b->reg.head;
  while (s != NULL) {
    struct gpuipc__seg *next = s->next;
    if ((s->w.state == GPUIPC__SEG_CREATING ||
         s->w.state == GPUIPC__SEG_FILLING) && s->creator == c) {
      if (nfreed == capfreed) {
        size_t cap = capfreed ? capfreed * 2 : 4;
        void *n = realloc(freed, cap * sizeof(*freed));
        if (n != NULL) {
          freed = n;
          capfreed = cap;
        }
      }
      if (nfreed < capfreed)
        snprintf(freed[nfreed++], sizeof(freed[0]), "%s", s->w.name);
      GPUIPC_LOG_I("broker %s: pid %d left before publishing %s; the name "
                   "is free again",
                   b->name, (int)c->cred.pid, s->w.name);
      gpuipc__bk_seg_forget(b, s);
    } else {
      bool kept = s->keeper == c;
      uint32_t dropped = gpuipc__reg_drop(s, c, UINT32_MAX);
      if (kept)
        gpuipc__bk_keeper_gone(b, s); /* the creator left without letting go */
      else if (dropped != 0)
        gpuipc__bk_maybe_free(b, s);
    }
    s = next;
  }
  for (size_t i = 0; i < nfreed; i++)
    gpuipc__bk_redispatch(b, freed[i]);
  free(freed);
}

void gpuipc__bk_end_recovery(struct gpuipc__broker *b)
{
  b->recovery_end = 0;
  /*
   * After a crash that no member survived, nothing was lost to anyone:
   * the domain starts afresh (its old names are free, not lost).
   */
  bool fresh = b->recovery == GPUIPC__RECOVER_CRASH && !b->rejoined;
  struct gpuipc__seg *s = b->reg.head;
  while (s != NULL) {
    struct gpuipc__seg *next = s->next;
    if (fresh && s->w.state == GPUIPC__SEG_LOST)
      gpuipc__bk_seg_forget(b, s);
    else if (gpuipc__bk_creator_held(s) && s->keeper == NULL &&
             s->w.state == GPUIPC__SEG_PUBLISHED)
      lose(b, s, "did not come back with its creator, which kept its "
               "memory");
    else
      gpuipc__bk_maybe_free(b, s);
    s = next;
  }
  if (fresh)
    gpuipc__bk_journal_compact(b);
  GPUIPC_LOG_I("broker %s: recovery window closed: %zu segments%s", b->name,
               b->reg.count,
               fresh ? " (no member of the last broker came back)" : "");
  /* Taken out first (their counts drop): dispatch may park them again. */
  struct park *list = gpuipc__bk_parks_take(&b->parks, NULL);
  while (list != NULL) {
    struct park *p = list;
    list = p->next;
    if (!p->conn->doomed)
      dispatch(b, p->conn, p);
    free(p);
  }
}

void gpuipc__bk_expire_parks(struct gpuipc__broker *b, uint64_t now)
{
  struct park *next;
  for (struct park *p = b->parks.all.head; p != NULL; p = next) {
    next = p->all.next;
    if (p->recovery || p->deadline > now)
      continue;
    gpuipc__bk_park_unlink(&b->parks, p);
    if (p->type == GPUIPC_MSG_OPEN)
      gpuipc__bk_send_error(b, p->conn, p->req, -ETIMEDOUT,
                            "segment %s was not published in time", p->name);
    free(p);
  }
}
