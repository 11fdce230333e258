/*
 * The member's segment table (segment.c's, seg_keep.c's): the segment
 * buffers this process holds, and for each the domains (and segment ids)
 * that granted it and how many opens each granted. The broker counts the
 * same per connection. A buffer's last-release hook tells every granting
 * broker (RELEASE with that count), so the broker's count drops to zero
 * exactly when the process lets go. A lent buffer (opts->buf) is a segment
 * through a handle of its own (gpuipc__buf_alias): the hook of that handle
 * lets go of the segment while the lender keeps the buffer. After a broker
 * failover the table is what the member re-publishes
 * (gpuipc__seg_republish). Its lock registers with src/domain/fork.c's
 * fork registry (gpuipc__seg_fork_install), so fork.c calls nothing here.
 *
 * Each hold is found by its buffer (entries), by (domain, id) (by_id) and
 * by its domain (seg_dom): a domain's events touch only its own holds.
 * Messages decided under seg_mu go out after it is released (outgoing).
 */
#include "segment/seg_table.h"
#include "os/os.h"
#include "mem/mem.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#define SEG_BUCKETS 4096u

/* The holds through one domain (what re-publishing and leaving walk). */
struct seg_dom {
  struct seg_dom *next;
  gpuipc_domain_t *dom;
  struct seg_hold *holds; /* dom_next chain */
};

pthread_mutex_t gpuipc__seg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct seg_entry *entries[SEG_BUCKETS]; /* by buffer */
static struct seg_hold *by_id[SEG_BUCKETS];    /* by (domain, id) */
static struct seg_dom *seg_doms;               /* the domains holding any */

static size_t hash_ptr(const void *p)
{
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 32;
  return (size_t)(x & (SEG_BUCKETS - 1));
}

static size_t hash_id(const gpuipc_domain_t *d, uint64_t id)
{
  uint64_t x = (uint64_t)(uintptr_t)d ^ (id * 0x9e3779b97f4a7c15ull);
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 32;
  return (size_t)(x & (SEG_BUCKETS - 1));
}

/* ----- the hold indexes (seg_mu held) ----- */

static struct seg_dom *seg_dom_find(const gpuipc_domain_t *d)
{
  for (struct seg_dom *sd = seg_doms; sd != NULL; sd = sd->next)
    if (sd->dom == d)
      return sd;
  return NULL;
}

/* Make @h, a new hold of @e, findable by (domain, id). -ENOMEM. */
static int hold_index(struct seg_entry *e, struct seg_hold *h)
{
  struct seg_dom *sd = seg_dom_find(h->dom);
  if (sd == NULL) {
    sd = calloc(1, sizeof(*sd));
    if (sd == NULL)
      return -ENOMEM;
    sd->dom = h->dom;
    sd->next = seg_doms;
    seg_doms = sd;
  }
  h->entry = e;
  h->dom_prev = NULL;
  h->dom_next = sd->holds;
  if (sd->holds != NULL)
    sd->holds->dom_prev = h;
  sd->holds = h;
  size_t i = hash_id(h->dom, h->id);
  h->id_next = by_id[i];
  by_id[i] = h;
  return 0;
}

static void seg_dom_drop(struct seg_dom *sd)
{
  for (struct seg_dom **pp = &seg_doms; *pp != NULL; pp = &(*pp)->next)
    if (*pp == sd) {
      *pp = sd->next;
      free(sd);
      return;
    }
}

static void hold_unindex(struct seg_hold *h)
{
  for (struct seg_hold **pp = &by_id[hash_id(h->dom, h->id)]; *pp != NULL;
       pp = &(*pp)->id_next)
    if (*pp == h) {
      *pp = h->id_next;
      break;
    }
  struct seg_dom *sd = seg_dom_find(h->dom);
  if (h->dom_next != NULL)
    h->dom_next->dom_prev = h->dom_prev;
  if (h->dom_prev != NULL)
    h->dom_prev->dom_next = h->dom_next;
  else if (sd != NULL)
    sd->holds = h->dom_next;
  if (sd != NULL && sd->holds == NULL)
    seg_dom_drop(sd);
}

/* The holds of @d's segment @id: walk them with hold_next. */
static struct seg_hold *hold_first(const gpuipc_domain_t *d, uint64_t id)
{
  struct seg_hold *h = by_id[hash_id(d, id)];
  while (h != NULL && !(h->dom == d && h->id == id))
    h = h->id_next;
  return h;
}

static struct seg_hold *hold_next(struct seg_hold *h)
{
  const gpuipc_domain_t *d = h->dom;
  uint64_t id = h->id;
  for (h = h->id_next; h != NULL; h = h->id_next)
    if (h->dom == d && h->id == id)
      return h;
  return NULL;
}

/* The holds through @d, linked by dom_next (NULL: none). */
struct seg_hold *gpuipc__seg_holds_of(const gpuipc_domain_t *d)
{
  struct seg_dom *sd = seg_dom_find(d);
  return sd != NULL ? sd->holds : NULL;
}

/*
 * Free @h (indexed, or not yet: entry NULL). A creator's event goes
 * with it, once complete: an opener that
 * gets the segment later finds the event gone and its writes done.
 */
static void hold_free(struct seg_hold *h)
{
  if (h->entry != NULL)
    hold_unindex(h);
  if (h->ev != NULL) {
    (void)gpuipc_event_sync(h->ev);
    (void)gpuipc_event_release(h->ev);
  }
  free(h);
}

/* ----- the buffer table (seg_mu held) ----- */

struct seg_entry *gpuipc__seg_entry_find(const gpuipc_buf_t *buf)
{
  for (struct seg_entry *e = entries[hash_ptr(buf)]; e != NULL; e = e->next)
    if (e->buf == buf)
      return e;
  return NULL;
}

static void entry_unlink(struct seg_entry *e)
{
  for (struct seg_entry **pp = &entries[hash_ptr(e->buf)]; *pp != NULL;
       pp = &(*pp)->next) {
    if (*pp == e) {
      *pp = e->next;
      return;
    }
  }
}

static void fork_lock(struct gpuipc__fork_hook *h)
{
  (void)h;
  pthread_mutex_lock(&gpuipc__seg_mu);
}


void gpuipc__seg_post_release(gpuipc_domain_t *d, uint64_t id,
                              uint32_t count)
{
  struct gpuipc__msg m;
  m.type = GPUIPC_MSG_RELEASE;
  m.u.release.id = id;
  m.u.release.count = count;
  (void)gpuipc__dom_post(d, &m, NULL, 0);
}

void gpuipc__seg_post_abandon(gpuipc_domain_t *d, uint64_t id)
{
  struct gpuipc__msg m;
  m.type = GPUIPC_MSG_ABANDON;
  m.u.abandon.id = id;
  (void)gpuipc__dom_post(d, &m, NULL, 0);
}

/*
 * Messages decided under seg_mu and sent after it is released: a send may
 * block (a broker that does not read), and seg_mu is the whole process's.
 */
struct outgoing {
  struct outgoing *next;
  gpuipc_domain_t *dom;
  uint64_t gen;   /* the connection it is for (gpuipc__dom_post_on) */
  uint16_t type;  /* RELEASE or REPUBLISH */
  uint32_t count; /* RELEASE's count, REPUBLISH's holds */
  uint32_t flags; /* REPUBLISH's flags */
  struct gpuipc__seg_wire w; /* REPUBLISH's record; RELEASE: w.id only */
  int fd;         /* REPUBLISH's descriptor, or -1 */
};

/*
 * A domain re-publishing on a new connection: what would be sent to it
 * meanwhile waits here, and goes out on that connection before it is up.
 */
struct republishing {
  struct republishing *next;
  gpuipc_domain_t *dom;
  struct outgoing *head, **tail;
};

static struct republishing *republishing; /* seg_mu */
/* Threads sending messages decided under seg_mu (seg_mu). */
static unsigned posting;
static pthread_cond_t posted = PTHREAD_COND_INITIALIZER;

static void fork_unlock(struct gpuipc__fork_hook *h)
{
  (void)h;
  pthread_mutex_unlock(&gpuipc__seg_mu);
}

/*
 * In a child made by fork(): the threads sending or re-publishing are the
 * parent's, and so are the domains they send to.
 */
static void fork_child(struct gpuipc__fork_hook *h)
{
  (void)h;
  posting = 0;
  republishing = NULL;
  pthread_mutex_unlock(&gpuipc__seg_mu);
}

/* The table's lock comes first in the lock order: so does its hook. */
static struct gpuipc__fork_hook fork_hook = {
    .prepare = fork_lock,
    .parent = fork_unlock,
    .child = fork_child,
};
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void fork_register(void)
{
  gpuipc__fork_register_first(&fork_hook);
}

void gpuipc__seg_fork_install(void)
{
  pthread_once(&fork_once, fork_register);
}

static struct republishing *republishing_of(gpuipc_domain_t *d)
{
  for (struct republishing *r = republishing; r != NULL; r = r->next)
    if (r->dom == d)
      return r;
  return NULL;
}

static void out_free(struct outgoing *o)
{
  gpuipc__fd_close(&o->fd);
  free(o);
}

static struct outgoing *out_new(gpuipc_domain_t *d, uint16_t type,
                                uint32_t count)
{
  struct outgoing *o = calloc(1, sizeof(*o));
  if (o == NULL)
    return NULL;
  o->dom = d;
  o->type = type;
  o->count = count;
  o->fd = -1;
  return o;
}

static void out_msg(const struct outgoing *o, struct gpuipc__msg *m)
{
  m->type = o->type;
  m->req = 0;
  if (o->type == GPUIPC_MSG_RELEASE) {
    m->u.release.id = o->w.id;
    m->u.release.count = o->count;
  } else {
    m->u.republish.holds = o->count;
    m->u.republish.flags = o->flags;
    m->u.republish.seg = o->w;
  }
}

/* Send @o on @fd (>= 0: a connection not up yet) or on its connection. */
static void out_send(struct outgoing *o, int fd)
{
  struct gpuipc__msg m;
  out_msg(o, &m);
  int n = o->fd >= 0 ? 1 : 0;
  int rc = fd >= 0 ? gpuipc__proto_send(fd, &m, &o->fd, n, 2000)
                   : gpuipc__dom_post_on(o->dom, o->gen, &m, &o->fd, n);
  if (rc != 0 && o->type == GPUIPC_MSG_REPUBLISH)
    GPUIPC_LOG_W("cannot re-publish segment %s: %s", o->w.name,
                 gpuipc_last_error());
}

static void send_all(struct outgoing *list, int fd)
{
  while (list != NULL) {
    struct outgoing *o = list;
    list = o->next;
    out_send(o, fd);
    out_free(o);
  }
}

/*
 * Send what the caller decided under seg_mu (which it released), then let
 * a departing domain's gpuipc__seg_forget_domain go on.
 */
static void send_posted(struct outgoing *list)
{
  if (list == NULL)
    return;
  send_all(list, -1);
  pthread_mutex_lock(&gpuipc__seg_mu);
  if (--posting == 0)
    pthread_cond_broadcast(&posted);
  pthread_mutex_unlock(&gpuipc__seg_mu);
}

/*
 * Route @o (seg_mu held): into @d's queue while it re-publishes, onto
 * @list for the connection up now, or nowhere when none is (the broker of
 * the next one never learns of it: nothing to tell it).
 */
static void route(struct outgoing *o, struct outgoing **list)
{
  struct republishing *r = republishing_of(o->dom);
  if (r != NULL) {
    *r->tail = o;
    r->tail = &o->next;
    return;
  }
  o->gen = gpuipc__dom_conn_gen(o->dom);
  if (o->gen == 0) {
    out_free(o);
    return;
  }
  if (*list == NULL)
    posting++;
  o->next = *list;
  *list = o;
}

static bool entry_keeps(const struct seg_entry *e)
{
  if (e->forever)
    return true;
  for (const struct seg_hold *h = e->holds; h != NULL; h = h->next)
    if (h->keeper)
      return true;
  return false;
}

/*
 * The last reference to a segment buffer went: tell the brokers, and keep
 * the memory if this process created it for a domain that still has it.
 */
static bool release_hook(struct gpuipc_buf *b, void *arg)
{
  struct seg_entry *e = arg;
  struct outgoing *list = NULL;
  pthread_mutex_lock(&gpuipc__seg_mu);
  struct seg_hold **pp = &e->holds;
  while (*pp != NULL) {
    struct seg_hold *h = *pp;
    /* A domain of the parent (after fork) is not this process's to tell. */
    bool stale = gpuipc__dom_stale(h->dom);
    if (h->grants != 0 && !stale) {
      struct outgoing *o = out_new(h->dom, GPUIPC_MSG_RELEASE, h->grants);
      if (o != NULL) {
        o->w.id = h->id;
        route(o, &list);
      } else {
        /* no memory: send now */
        gpuipc__seg_post_release(h->dom, h->id, h->grants);
      }
    }
    h->grants = 0;
    if (h->keeper && !stale) {
      pp = &h->next;
    } else {
      *pp = h->next;
      hold_free(h);
    }
  }
  bool keep = entry_keeps(e);
  if (keep)
    gpuipc__buf_keep(b); /* @b and @e may go once seg_mu is released */
  else
    entry_unlink(e);
  pthread_mutex_unlock(&gpuipc__seg_mu);
  if (!keep)
    free(e);
  send_posted(list);
  return keep;
}

/* Forget @e (seg_mu held); its buffer was unkept or freed. */
static void entry_free(struct seg_entry *e)
{
  entry_unlink(e);
  while (e->holds != NULL) {
    struct seg_hold *h = e->holds;
    e->holds = h->next;
    hold_free(h);
  }
  free(e);
}

/*
 * @h of @e no longer keeps the memory (seg_mu held). Returns the buffer
 * to destroy (the caller does, without seg_mu) when nothing keeps it and
 * nobody uses it any more, else NULL.
 */
gpuipc_buf_t *gpuipc__seg_hold_unkeep(struct seg_entry *e,
                                      struct seg_hold *h)
{
  h->keeper = false;
  if (h->grants == 0) {
    for (struct seg_hold **pp = &e->holds; *pp != NULL; pp = &(*pp)->next)
      if (*pp == h) {
        *pp = h->next;
        hold_free(h);
        break;
      }
  }
  if (entry_keeps(e) || !gpuipc__buf_unkeep(e->buf))
    return NULL; /* still kept, or in use: its last release decides */
  gpuipc_buf_t *b = e->buf;
  entry_free(e);
  return b;
}

bool gpuipc__seg_held_through(const gpuipc_buf_t *buf,
                              const gpuipc_domain_t *d, uint64_t id)
{
  bool held = false;
  pthread_mutex_lock(&gpuipc__seg_mu);
  struct seg_entry *e = gpuipc__seg_entry_find(buf);
  for (struct seg_hold *h = e != NULL ? e->holds : NULL; h != NULL && !held;
       h = h->next)
    held = h->dom == d && h->id == id;
  pthread_mutex_unlock(&gpuipc__seg_mu);
  return held;
}

/* The keeper hold of segment @id in @d, with its entry, or NULL. */
struct seg_hold *gpuipc__seg_find_keeper(gpuipc_domain_t *d, uint64_t id,
                                         struct seg_entry **entry)
{
  for (struct seg_hold *h = hold_first(d, id); h != NULL; h = hold_next(h))
    if (h->keeper) {
      *entry = h->entry;
      return h;
    }
  return NULL;
}

/*
 * A REPUBLISH of @holds grants of @h for @buf (seg_mu held: @buf is
 * alive), exported now.
 */
static struct outgoing *republish_out(gpuipc_domain_t *d, gpuipc_buf_t *buf,
                                      const struct seg_hold *h,
                                      uint32_t holds)
{
  struct outgoing *o = out_new(d, GPUIPC_MSG_REPUBLISH, holds);
  if (o == NULL) {
    GPUIPC_LOG_W("cannot re-publish segment %s: out of memory", h->name);
    return NULL;
  }
  if (h->keeper)
    o->flags = GPUIPC__REPUB_KEEPER;
  gpuipc_handle_t hd;
  int rc = gpuipc_buf_export(buf, &hd);
  if (rc == 0) {
    o->fd = hd.fd;
    struct gpuipc__seg_wire *w = &o->w;
    snprintf(w->name, sizeof(w->name), "%s", h->name);
    w->id = h->id;
    w->size = h->size;
    w->kind = h->kind;
    w->flags = h->flags;
    w->state = h->filling    ? GPUIPC__SEG_FILLING
               : h->unlinked ? GPUIPC__SEG_UNLINKED
                             : GPUIPC__SEG_PUBLISHED;
    w->has_event = h->has_event && !h->filling;
    memcpy(w->event, h->event, sizeof(w->event));
    memcpy(w->uuid, h->uuid, sizeof(w->uuid));
    w->has_handle = true;
    w->htype = (uint8_t)hd.type;
    rc = gpuipc_handle_pack(&hd, w->handle, sizeof(w->handle));
  }
  if (rc < 0) {
    GPUIPC_LOG_W("cannot re-publish segment %s: %s", h->name,
                 gpuipc_last_error());
    out_free(o);
    return NULL;
  }
  return o;
}

/*
 * After a reconnection (reader thread): re-publish every segment this
 * process holds through @d on the new connection @fd, then make @fd the
 * domain's connection (gpuipc__dom_set_up). The sends happen outside the
 * segment table lock; releases and late grants meanwhile are queued and
 * sent on @fd, in order, before it goes up, so that none falls in between.
 */
void gpuipc__seg_republish(gpuipc_domain_t *d, int fd)
{
  struct republishing rp = {.dom = d};
  rp.tail = &rp.head;
  struct outgoing *snap = NULL, **tail = &snap;
  size_t n = 0;
  pthread_mutex_lock(&gpuipc__seg_mu);
  for (struct seg_hold *h = gpuipc__seg_holds_of(d); h != NULL; h = h->dom_next)
    if (h->grants != 0 || h->keeper) {
      struct outgoing *o = republish_out(d, h->entry->buf, h, h->grants);
      if (o != NULL) {
        *tail = o;
        tail = &o->next;
        n++;
      }
    }
  rp.next = republishing;
  republishing = &rp;
  pthread_mutex_unlock(&gpuipc__seg_mu);

  send_all(snap, fd);
  /* Then what came meanwhile, until nothing did: then go up. */
  for (;;) {
    pthread_mutex_lock(&gpuipc__seg_mu);
    struct outgoing *queued = rp.head;
    rp.head = NULL;
    rp.tail = &rp.head;
    if (queued == NULL) {
      for (struct republishing **pp = &republishing; *pp != NULL;
           pp = &(*pp)->next)
        if (*pp == &rp) {
          *pp = rp.next;
          break;
        }
      gpuipc__dom_set_up(d, fd);
      pthread_mutex_unlock(&gpuipc__seg_mu);
      break;
    }
    pthread_mutex_unlock(&gpuipc__seg_mu);
    send_all(queued, fd);
  }
  GPUIPC_LOG_D("re-published %zu segments", n);
}

void gpuipc__seg_unlinked(gpuipc_domain_t *d, uint64_t id)
{
  pthread_mutex_lock(&gpuipc__seg_mu);
  for (struct seg_hold *h = hold_first(d, id); h != NULL; h = hold_next(h))
    h->unlinked = true;
  pthread_mutex_unlock(&gpuipc__seg_mu);
}

void gpuipc__seg_orphan(gpuipc_domain_t *d, struct gpuipc__reply *r)
{
  if (r->gen != gpuipc__dom_gen(d))
    return; /* that broker is gone, and what it counted with it */
  if (r->msg.type == GPUIPC_MSG_HANDLE)
    gpuipc__seg_post_release(d, r->msg.u.handle.seg.id, 1);
  else if (r->msg.type == GPUIPC_MSG_CREATE_IT)
    gpuipc__seg_post_abandon(d, r->msg.u.create_it.id);
  else if (r->msg.type == GPUIPC_MSG_OK &&
           r->req_type == GPUIPC_MSG_PUBLISH)
    /* A publication that timed out went through: the broker counts its
     * creator as a holder, but the creator let its buffer go. */
    gpuipc__seg_post_release(d, r->msg.u.ok.id, 1);
}

/* @d is being left: forget its holds. */
void gpuipc__seg_forget_domain(gpuipc_domain_t *d)
{
  pthread_mutex_lock(&gpuipc__seg_mu);
  /* Messages to @d decided before: sent before @d goes. */
  while (posting != 0)
    pthread_cond_wait(&posted, &gpuipc__seg_mu);
  struct seg_hold *h;
  while ((h = gpuipc__seg_holds_of(d)) != NULL) {
    for (struct seg_hold **pp = &h->entry->holds; *pp != NULL;
         pp = &(*pp)->next)
      if (*pp == h) {
        *pp = h->next;
        break;
      }
    hold_free(h); /* the last one frees @d's seg_dom */
  }
  pthread_mutex_unlock(&gpuipc__seg_mu);
}

/*
 * Count one grant of segment @w by @d on @buf. @gen: the connection the
 * grant came on; if it dropped meanwhile and the member already
 * re-published, tell the new broker about this hold too. @creator: we
 * allocated it; published (scratch) with its memory held by its creator,
 * we keep that memory for the domain.
 */
int gpuipc__seg_record(gpuipc_domain_t *d, gpuipc_buf_t *buf,
                       const struct gpuipc__seg_wire *w, uint64_t gen,
                       bool creator)
{
  bool filling = w->state == GPUIPC__SEG_FILLING;
  bool keeper = creator && !filling &&
                (w->flags & GPUIPC__SEGF_CREATOR_HELD) != 0;
  pthread_mutex_lock(&gpuipc__seg_mu);
  struct seg_entry *e = gpuipc__seg_entry_find(buf);
  bool fresh = e == NULL;
  if (fresh) {
    e = calloc(1, sizeof(*e));
    if (e == NULL) {
      pthread_mutex_unlock(&gpuipc__seg_mu);
      return gpuipc__err(-ENOMEM, "segment %s: out of memory", w->name);
    }
    e->buf = buf;
  }
  struct seg_hold *h = e->holds;
  while (h != NULL && !(h->dom == d && h->id == w->id))
    h = h->next;
  if (h == NULL) {
    h = calloc(1, sizeof(*h));
    if (h == NULL) {
      if (fresh)
        free(e);
      pthread_mutex_unlock(&gpuipc__seg_mu);
      return gpuipc__err(-ENOMEM, "segment %s: out of memory", w->name);
    }
    h->dom = d;
    h->id = w->id;
    snprintf(h->name, sizeof(h->name), "%s", w->name);
    h->size = w->size;
    h->kind = w->kind;
    h->flags = w->flags;
    memcpy(h->uuid, w->uuid, sizeof(h->uuid));
    h->creator = creator;
    h->filling = filling;
    h->has_event = w->has_event;
    memcpy(h->event, w->event, sizeof(h->event));
    if (hold_index(e, h) != 0) {
      free(h);
      if (fresh)
        free(e);
      pthread_mutex_unlock(&gpuipc__seg_mu);
      return gpuipc__err(-ENOMEM, "segment %s: out of memory", w->name);
    }
    h->next = e->holds;
    e->holds = h;
  }
  h->grants++;
  if (keeper)
    h->keeper = true;
  if (fresh) {
    size_t i = hash_ptr(buf);
    e->next = entries[i];
    entries[i] = e;
  }
  gpuipc__dom_saw_id(d, w->id);
  struct outgoing *list = NULL;
  if (gpuipc__dom_gen(d) != gen &&
      (republishing_of(d) != NULL || gpuipc__dom_conn_gen(d) != 0)) {
    /* Re-published already without this grant (or being re-published)?
     * Then add it; if the member has not begun re-publishing, its
     * re-publication will include it. */
    struct outgoing *o = republish_out(d, buf, h, 1);
    if (o != NULL)
      route(o, &list);
  }
  pthread_mutex_unlock(&gpuipc__seg_mu);
  send_posted(list);
  /* Still holding our reference: the hook cannot fire before it is set. */
  if (fresh)
    gpuipc__buf_set_release_hook(buf, release_hook, e);
  return 0;
}
