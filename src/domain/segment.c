/*
 * Named segments, member side.
 *
 * The process keeps one table of the segment buffers it holds: for each
 * buffer, the domains (and segment ids) that granted it and how many opens
 * each granted. The broker counts the same per connection. A buffer's
 * last-release hook tells every granting broker (RELEASE with that count),
 * so the broker's count drops to zero exactly when the process lets go.
 * After a broker failover the table is what the member re-publishes.
 *
 * Memory held by its creator (LEGACY and fabric memory, a POOL allocation:
 * no descriptor keeps it alive elsewhere) outlives the creator's own last
 * release: the hook keeps the buffer (gpuipc__buf_keep) while the hold of
 * the publishing domain is marked "keeper", until that domain's broker says
 * LET_GO (the segment was unlinked and nobody holds it). Leaving the domain
 * asks the broker (DISOWN): with nobody else holding it the memory goes at
 * once, otherwise it stays until the process exits, so that no holder ever
 * reads freed memory while the creator lives.
 */
#include "domain/domain.h"
#include "os/os.h"
#include "wire/wire.h"
#include "mem/mem.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#define SEG_BUCKETS 4096u

/* One domain's grant of a buffer. */
struct seg_hold {
  struct seg_hold *next;           /* the entry's holds */
  struct seg_hold *id_next;        /* by_id chain */
  struct seg_hold *dom_prev, *dom_next; /* its seg_dom's holds */
  struct seg_entry *entry;         /* the buffer it is a hold of */
  gpuipc_domain_t *dom;
  uint64_t id;
  uint32_t grants; /* opens the broker counted for this process */
  bool unlinked;
  bool keeper;     /* we created it and keep its memory for the domain */
  bool creator;    /* we allocated it for the domain */
  bool filling;    /* ... and have not published it yet */
  char name[GPUIPC__NAME_MAX + 1];
  uint64_t size;
  uint8_t kind;
  uint8_t flags;   /* GPUIPC__SEGF_* */
  uint8_t uuid[16];
  /* The event its creator's writes were recorded on, as published. */
  bool has_event;
  uint8_t event[GPUIPC_EVENT_HANDLE_PACKED_SIZE];
  gpuipc_event_t *ev; /* creator: that event, alive while we hold it */
};

struct seg_entry {
  struct seg_entry *next;
  gpuipc_buf_t *buf;
  struct seg_hold *holds;
  /* Keep the memory until the process exits: its domain went, others
   * still held it. */
  bool forever;
};

/* The holds through one domain (what re-publishing and leaving walk). */
struct seg_dom {
  struct seg_dom *next;
  gpuipc_domain_t *dom;
  struct seg_hold *holds; /* dom_next chain */
};

static pthread_mutex_t seg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct seg_entry *entries[SEG_BUCKETS]; /* by buffer */
static struct seg_hold *by_id[SEG_BUCKETS];    /* by (domain, id) */
static struct seg_dom *seg_doms;               /* the domains holding any */
/* Tests: publish every segment created here as held by its creator. */
static atomic_bool test_creator_held;

void gpuipc__seg_test_creator_held(bool on)
{
  atomic_store(&test_creator_held, on);
}

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
static struct seg_hold *holds_of(const gpuipc_domain_t *d)
{
  struct seg_dom *sd = seg_dom_find(d);
  return sd != NULL ? sd->holds : NULL;
}

/*
 * Free @h (indexed, or not yet: entry NULL). A creator's event goes with it, once complete: an opener that
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

static struct seg_entry *entry_find(const gpuipc_buf_t *buf)
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

void gpuipc__seg_fork_lock(void)
{
  pthread_mutex_lock(&seg_mu);
}


static void post_release(gpuipc_domain_t *d, uint64_t id, uint32_t count)
{
  struct gpuipc__msg m;
  m.type = GPUIPC_MSG_RELEASE;
  m.u.release.id = id;
  m.u.release.count = count;
  (void)gpuipc__dom_post(d, &m, NULL, 0);
}

static void post_abandon(gpuipc_domain_t *d, uint64_t id)
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

void gpuipc__seg_fork_unlock(void)
{
  pthread_mutex_unlock(&seg_mu);
}

/*
 * In a child made by fork(): the threads sending or re-publishing are the
 * parent's, and so are the domains they send to.
 */
void gpuipc__seg_fork_child(void)
{
  posting = 0;
  republishing = NULL;
  pthread_mutex_unlock(&seg_mu);
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
 * a departing domain's seg_forget_domain go on.
 */
static void send_posted(struct outgoing *list)
{
  if (list == NULL)
    return;
  send_all(list, -1);
  pthread_mutex_lock(&seg_mu);
  if (--posting == 0)
    pthread_cond_broadcast(&posted);
  pthread_mutex_unlock(&seg_mu);
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
  pthread_mutex_lock(&seg_mu);
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
        post_release(h->dom, h->id, h->grants); /* no memory: send now */
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
  pthread_mutex_unlock(&seg_mu);
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
static gpuipc_buf_t *hold_unkeep(struct seg_entry *e, struct seg_hold *h)
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

/* The keeper hold of segment @id in @d, with its entry, or NULL. */
static struct seg_hold *find_keeper(gpuipc_domain_t *d, uint64_t id,
                                    struct seg_entry **entry)
{
  for (struct seg_hold *h = hold_first(d, id); h != NULL; h = hold_next(h))
    if (h->keeper) {
      *entry = h->entry;
      return h;
    }
  return NULL;
}

static void seg_let_go(gpuipc_domain_t *d, uint64_t id)
{
  pthread_mutex_lock(&seg_mu);
  struct seg_entry *e;
  struct seg_hold *h = find_keeper(d, id, &e);
  gpuipc_buf_t *b = h != NULL ? hold_unkeep(e, h) : NULL;
  pthread_mutex_unlock(&seg_mu);
  if (b != NULL) {
    GPUIPC_LOG_D("segment id %llu: unlinked and held by nobody: freeing the "
                 "memory this process kept", (unsigned long long)id);
    gpuipc__buf_destroy(b);
  }
}

/* Leaving a domain: how long its DISOWNs may take in all. */
#define DISOWN_MS 2000

/*
 * Tell @d's broker that this process stops keeping segment @id's memory.
 * 0: nobody else holds it, free it; -EBUSY: others do; or the call's code.
 */
static int disown(gpuipc_domain_t *d, uint64_t id, int timeout_ms)
{
  struct gpuipc__reply *r = malloc(sizeof(*r));
  if (r == NULL)
    return gpuipc__err(-ENOMEM, "disowning segment id %llu: out of memory",
                       (unsigned long long)id);
  struct gpuipc__msg *m = &r->msg;
  memset(&m->u.disown, 0, sizeof(m->u.disown));
  m->type = GPUIPC_MSG_DISOWN;
  m->u.disown.id = id;
  int rc = gpuipc__dom_call(d, m, NULL, 0, timeout_ms, "disown", r);
  for (int i = 0; rc == 0 && i < r->nfds; i++)
    gpuipc__fd_close(&r->fds[i]);
  free(r);
  return rc;
}

/*
 * @d is being left: for each segment whose memory this process keeps for
 * @d, ask the broker (DISOWN, at most 2 s in all); free the memory when
 * nobody else holds it, else keep it until the process exits. Never waits
 * for holders.
 */
static void seg_disown_domain(gpuipc_domain_t *d)
{
  /* The parent's domain (after fork): nothing of it is this process's to
   * tell, nor its memory to free. */
  if (gpuipc__dom_stale(d))
    return;
  /* The ids this process keeps memory for in @d. */
  uint64_t *ids = NULL;
  size_t n = 0, cap = 0;
  pthread_mutex_lock(&seg_mu);
  for (struct seg_hold *h = holds_of(d); h != NULL; h = h->dom_next) {
    if (!h->keeper)
      continue;
    if (n == cap) {
      size_t nc = cap ? cap * 2 : 16;
      uint64_t *ni = realloc(ids, nc * sizeof(*ids));
      if (ni == NULL) {
        h->keeper = false; /* no memory to ask: keep it until exit */
        h->entry->forever = true;
        continue;
      }
      ids = ni;
      cap = nc;
    }
    ids[n++] = h->id;
  }
  pthread_mutex_unlock(&seg_mu);

  int ms = gpuipc__dom_timeout(d);
  uint64_t deadline = gpuipc__deadline(ms < 0 || ms > DISOWN_MS ? DISOWN_MS
                                                                : ms);
  for (size_t k = 0; k < n; k++) {
    /* 0: nobody else holds it. Anything else (held elsewhere, no broker,
     * no answer in time): keep the memory until this process exits. */
    int rc = disown(d, ids[k], gpuipc__ms_left(deadline));
    pthread_mutex_lock(&seg_mu);
    struct seg_entry *e;
    struct seg_hold *h = find_keeper(d, ids[k], &e);
    gpuipc_buf_t *b = NULL;
    if (h != NULL) {
      if (rc != 0) {
        e->forever = true;
        GPUIPC_LOG_D("segment %s (id %llu): keeping its memory until this "
                     "process exits: %s", h->name,
                     (unsigned long long)ids[k], gpuipc_last_error());
      }
      b = hold_unkeep(e, h);
    }
    pthread_mutex_unlock(&seg_mu);
    if (b != NULL)
      gpuipc__buf_destroy(b);
  }
  free(ids);
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
static void seg_republish(gpuipc_domain_t *d, int fd)
{
  struct republishing rp = {.dom = d};
  rp.tail = &rp.head;
  struct outgoing *snap = NULL, **tail = &snap;
  size_t n = 0;
  pthread_mutex_lock(&seg_mu);
  for (struct seg_hold *h = holds_of(d); h != NULL; h = h->dom_next)
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
  pthread_mutex_unlock(&seg_mu);

  send_all(snap, fd);
  /* Then what came meanwhile, until nothing did: then go up. */
  for (;;) {
    pthread_mutex_lock(&seg_mu);
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
      pthread_mutex_unlock(&seg_mu);
      break;
    }
    pthread_mutex_unlock(&seg_mu);
    send_all(queued, fd);
  }
  GPUIPC_LOG_D("re-published %zu segments", n);
}

static void seg_unlinked(gpuipc_domain_t *d, uint64_t id)
{
  pthread_mutex_lock(&seg_mu);
  for (struct seg_hold *h = hold_first(d, id); h != NULL; h = hold_next(h))
    h->unlinked = true;
  pthread_mutex_unlock(&seg_mu);
}

static void seg_orphan(gpuipc_domain_t *d, struct gpuipc__reply *r)
{
  if (r->gen != gpuipc__dom_gen(d))
    return; /* that broker is gone, and what it counted with it */
  if (r->msg.type == GPUIPC_MSG_HANDLE)
    post_release(d, r->msg.u.handle.seg.id, 1);
  else if (r->msg.type == GPUIPC_MSG_CREATE_IT)
    post_abandon(d, r->msg.u.create_it.id);
  else if (r->msg.type == GPUIPC_MSG_OK &&
           r->req_type == GPUIPC_MSG_PUBLISH)
    /* A publication that timed out went through: the broker counts its
     * creator as a holder, but the creator let its buffer go. */
    post_release(d, r->msg.u.ok.id, 1);
}

/* @d is being left: forget its holds. */
static void seg_forget_domain(gpuipc_domain_t *d)
{
  pthread_mutex_lock(&seg_mu);
  /* Messages to @d decided before: sent before @d goes. */
  while (posting != 0)
    pthread_cond_wait(&posted, &seg_mu);
  struct seg_hold *h;
  while ((h = holds_of(d)) != NULL) {
    for (struct seg_hold **pp = &h->entry->holds; *pp != NULL;
         pp = &(*pp)->next)
      if (*pp == h) {
        *pp = h->next;
        break;
      }
    hold_free(h); /* the last one frees @d's seg_dom */
  }
  pthread_mutex_unlock(&seg_mu);
}

static void seg_leave(gpuipc_domain_t *d)
{
  seg_disown_domain(d);
  seg_forget_domain(d);
}

/* How a domain reaches this file (registered before any request). */
static const struct gpuipc__dom_listener seg_listener = {
    .on_reconnect = seg_republish,
    .on_unlinked = seg_unlinked,
    .on_let_go = seg_let_go,
    .on_orphan = seg_orphan,
    .on_leave = seg_leave,
};

/*
 * Count one grant of segment @w by @d on @buf. @gen: the connection the
 * grant came on; if it dropped meanwhile and the member already
 * re-published, tell the new broker about this hold too. @creator: we
 * allocated it; published (scratch) with its memory held by its creator,
 * we keep that memory for the domain.
 */
static int record(gpuipc_domain_t *d, gpuipc_buf_t *buf,
                  const struct gpuipc__seg_wire *w, uint64_t gen, bool creator)
{
  bool filling = w->state == GPUIPC__SEG_FILLING;
  bool keeper = creator && !filling &&
                (w->flags & GPUIPC__SEGF_CREATOR_HELD) != 0;
  pthread_mutex_lock(&seg_mu);
  struct seg_entry *e = entry_find(buf);
  bool fresh = e == NULL;
  if (fresh) {
    e = calloc(1, sizeof(*e));
    if (e == NULL) {
      pthread_mutex_unlock(&seg_mu);
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
      pthread_mutex_unlock(&seg_mu);
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
      pthread_mutex_unlock(&seg_mu);
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
  pthread_mutex_unlock(&seg_mu);
  send_posted(list);
  /* Still holding our reference: the hook cannot fire before it is set. */
  if (fresh)
    gpuipc__buf_set_release_hook(buf, release_hook, e);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Opening                                                                  */
/* ------------------------------------------------------------------------ */

/* Client-side wait beyond the broker's own WAIT deadline. */
#define REPLY_MARGIN_MS 2000

int gpuipc__seg_request(gpuipc_domain_t *d, const char *name, size_t size,
                        gpuipc_kind_t kind, unsigned flags, int timeout_ms,
                        struct gpuipc__reply *out)
{
  /* Before the first request: its reply may come to nobody (on_orphan). */
  out->nfds = 0;
  int rc = gpuipc__dom_listen(d, &seg_listener);
  if (rc != 0)
    return rc;
  struct gpuipc__msg *m = &out->msg; /* reused for the reply */
  memset(&m->u.open, 0, sizeof(m->u.open));
  m->type = GPUIPC_MSG_OPEN;
  snprintf(m->u.open.name, sizeof(m->u.open.name), "%s", name);
  m->u.open.flags = flags & GPUIPC__OPEN_FLAGS;
  m->u.open.kind = (uint8_t)kind;
  m->u.open.size = size;
  m->u.open.timeout_ms =
      timeout_ms < 0 ? GPUIPC__WAIT_FOREVER : (uint32_t)timeout_ms;
  int wait_ms = timeout_ms < 0 ? -1 : timeout_ms + REPLY_MARGIN_MS;
  char what[GPUIPC__NAME_MAX + 48];
  snprintf(what, sizeof(what), "gpuipc_segment_open(%s)", name);
  rc = gpuipc__dom_call(d, m, NULL, 0, wait_ms, what, out);
  if (rc != 0)
    return rc;
  /* The two replies keep the id at different places: a HANDLE's union
   * starts with the segment's name. */
  if (out->msg.type == GPUIPC_MSG_CREATE_IT) {
    gpuipc__dom_saw_id(d, out->msg.u.create_it.id);
    return 0;
  }
  if (out->msg.type == GPUIPC_MSG_HANDLE) {
    gpuipc__dom_saw_id(d, out->msg.u.handle.seg.id);
    return 0;
  }
  for (int i = 0; i < out->nfds; i++)
    gpuipc__fd_close(&out->fds[i]);
  out->nfds = 0;
  return gpuipc__err(GPUIPC_E_PROTO, "%s: broker answered with %s", what,
                     gpuipc__msg_name(out->msg.type));
}

/* Map the segment a HANDLE reply describes. Closes the reply's fds. */
static int import_reply(struct gpuipc__reply *r, int device,
                        gpuipc_buf_t **out)
{
  const struct gpuipc__seg_wire *w = &r->msg.u.handle.seg;
  gpuipc_handle_t h;
  int rc = gpuipc_handle_unpack(w->handle, sizeof(w->handle), &h);
  if (rc == 0) {
    h.fd = r->nfds > 0 ? r->fds[0] : -1;
    rc = gpuipc_buf_import(&h, device, 0, out);
  }
  for (int i = 0; i < r->nfds; i++)
    gpuipc__fd_close(&r->fds[i]);
  r->nfds = 0;
  return rc;
}

/*
 * Hand @buf, allocated for reservation @id, to the broker: published at
 * once (@scratch) or filling, until gpuipc_segment_publish.
 */
static int publish(gpuipc_domain_t *d, const char *name, uint64_t id,
                   size_t size, gpuipc_buf_t *buf, bool scratch,
                   int timeout_ms, struct gpuipc__reply *r,
                   struct gpuipc__seg_wire *pub)
{
  gpuipc_handle_t hd;
  int rc = gpuipc_buf_export(buf, &hd);
  if (rc != 0)
    return rc;
  struct gpuipc__msg *m = &r->msg;
  memset(&m->u.publish, 0, sizeof(m->u.publish));
  m->type = GPUIPC_MSG_PUBLISH;
  struct gpuipc__seg_wire *w = &m->u.publish.seg;
  snprintf(w->name, sizeof(w->name), "%s", name);
  w->id = id;
  w->size = size;
  w->kind = (uint8_t)gpuipc_buf_kind(buf);
  w->state = scratch ? GPUIPC__SEG_PUBLISHED : GPUIPC__SEG_FILLING;
  memcpy(w->uuid, hd.device_uuid, sizeof(w->uuid));
  w->has_handle = true;
  w->htype = (uint8_t)hd.type;
  /* No descriptor keeps this memory alive: only this process does. */
  if (!gpuipc__htype_has_fd(hd.type) || hd.type == GPUIPC_HT_POOL ||
      atomic_load(&test_creator_held))
    w->flags = GPUIPC__SEGF_CREATOR_HELD;
  rc = gpuipc_handle_pack(&hd, w->handle, sizeof(w->handle));
  if (rc < 0)
    goto close_fd;
  *pub = *w;
  char what[GPUIPC__NAME_MAX + 48];
  snprintf(what, sizeof(what), "gpuipc_segment_open(%s): publish", name);
  rc = gpuipc__dom_call(d, m, &hd.fd, hd.fd >= 0 ? 1 : 0, timeout_ms, what,
                        r);
  if (rc == 0 && r->msg.type != GPUIPC_MSG_OK)
    rc = gpuipc__err(GPUIPC_E_PROTO, "%s: broker answered with %s", what,
                     gpuipc__msg_name(r->msg.type));
  if (rc == 0)
    pub->id = r->msg.u.ok.id;
close_fd:
  gpuipc__fd_close(&hd.fd);
  return rc;
}

/*
 * Make @stream wait for the event segment @w's creator recorded after its
 * writes (GPU kinds), unless it has completed already. An exporter gone
 * is not an error: it let go of the event only once its writes were done
 * (hold_free), or died, and its writes with it.
 */
static int wait_writes(const struct gpuipc__seg_wire *w, gpuipc_buf_t *buf,
                       void *stream)
{
  if (!w->has_event)
    return 0;
  gpuipc_event_handle_t eh;
  int rc = gpuipc_event_handle_unpack(w->event, sizeof(w->event), &eh);
  if (rc != 0)
    return rc;
  gpuipc_event_t *ev;
  rc = gpuipc_event_import(&eh, gpuipc_buf_device(buf), &ev);
  if (rc == GPUIPC_E_PEER_GONE)
    return 0;
  if (rc != 0)
    return rc;
  rc = gpuipc_event_query(ev);
  if (rc == -EAGAIN)
    rc = gpuipc_event_wait(ev, stream);
  (void)gpuipc_event_release(ev);
  return rc;
}

/* What one gpuipc_segment_open asks for, the caller's defaults applied. */
struct seg_opts {
  size_t size;
  gpuipc_kind_t kind;
  int device;
  unsigned flags;
  int timeout_ms; /* < 0: forever */
  void *stream;
};

/* Create @name: allocate (@own, kept across retries) and hand it over. */
static int create_it(gpuipc_domain_t *d, const char *name,
                     const struct seg_opts *o, struct gpuipc__reply *r,
                     gpuipc_buf_t **own, gpuipc_buf_t **out)
{
  uint64_t id = r->msg.u.create_it.id;
  int rc;
  if (*own == NULL) {
    /* AUTO without a device: memory every process can map. */
    gpuipc_kind_t ak = o->kind == GPUIPC_KIND_AUTO && o->device < 0
                           ? GPUIPC_KIND_HOST : o->kind;
    rc = gpuipc_buf_alloc(o->size, ak, o->device, 0, own);
    if (rc != 0) {
      post_abandon(d, id);
      return rc;
    }
  }
  struct gpuipc__seg_wire pub;
  memset(&pub, 0, sizeof(pub));
  bool scratch = (o->flags & GPUIPC_SCRATCH) != 0;
  /* The broker's answer gets the timeout from now: the allocation is
   * local work (the first one may start CUDA, hundreds of ms, or map
   * gigabytes) and must not use up the wait for the broker. */
  rc = publish(d, name, id, o->size, *own, scratch,
               o->timeout_ms < 0 || o->timeout_ms > 5000 ? 5000
                                                         : o->timeout_ms,
               r, &pub);
  if (rc == GPUIPC_E_PEER_GONE)
    return rc; /* the caller asks the next broker */
  if (rc != 0) {
    post_abandon(d, id);
    if (rc == -ETIMEDOUT && scratch &&
        (pub.flags & GPUIPC__SEGF_CREATOR_HELD)) {
      /* The publication may have gone through unanswered, and others
       * may map the memory by now: never free it under them. */
      GPUIPC_LOG_W("segment %s: publication unanswered; keeping its "
                   "memory until this process exits", name);
      *own = NULL;
    }
    return rc;
  }
  bool keeper = scratch && (pub.flags & GPUIPC__SEGF_CREATOR_HELD) != 0;
  rc = record(d, *own, &pub, r->gen, true);
  if (rc != 0) {
    post_release(d, pub.id, 1);
    if (keeper && disown(d, pub.id, 2000) != 0) {
      /* Others may map it already: never free it under them. */
      GPUIPC_LOG_W("segment %s: keeping memory nobody tracks until "
                   "this process exits", name);
      *own = NULL;
    }
    return rc;
  }
  *out = *own;
  *own = NULL;
  return 0;
}

/* Map the segment a HANDLE reply describes, ordered after its writes. */
static int open_granted(gpuipc_domain_t *d, const struct seg_opts *o,
                        struct gpuipc__reply *r, gpuipc_buf_t **out)
{
  uint64_t gen = r->gen;
  struct gpuipc__seg_wire w = r->msg.u.handle.seg;
  gpuipc_buf_t *buf;
  int rc = import_reply(r, o->device, &buf);
  if (rc != 0) {
    post_release(d, w.id, 1);
    return rc;
  }
  rc = wait_writes(&w, buf, o->stream);
  if (rc == 0)
    rc = record(d, buf, &w, gen, false);
  if (rc != 0) {
    post_release(d, w.id, 1);
    gpuipc_buf_release(buf);
    return rc;
  }
  *out = buf;
  return 0;
}

static int segment_open(gpuipc_domain_t *d, const char *name,
                        const struct seg_opts *o, gpuipc_buf_t **out)
{
  uint64_t deadline = gpuipc__deadline(o->timeout_ms);
  gpuipc_buf_t *own = NULL; /* allocated for a reservation, not published */
  struct gpuipc__reply *r = malloc(sizeof(*r));
  if (r == NULL)
    return gpuipc__err(-ENOMEM, "gpuipc_segment_open: out of memory");
  int rc;
  for (;;) {
    rc = gpuipc__seg_request(d, name, o->size, o->kind, o->flags,
                             gpuipc__ms_left(deadline), r);
    if (rc == GPUIPC_E_PEER_GONE && gpuipc__now_ns() < deadline)
      continue; /* the broker changed: ask the new one */
    if (rc != 0)
      break;
    if (r->msg.type == GPUIPC_MSG_CREATE_IT) {
      rc = create_it(d, name, o, r, &own, out);
      if (rc == GPUIPC_E_PEER_GONE && gpuipc__now_ns() < deadline)
        continue;
      break;
    }
    rc = open_granted(d, o, r, out);
    break;
  }
  /* Another creator won (or it was ours: a self-import), or it failed. */
  if (own != NULL)
    gpuipc_buf_release(own);
  free(r);
  return rc;
}

/* The caller's options: its prefix of the struct, defaults beyond it. */
static int seg_opts_read(gpuipc_domain_t *dom, const char *name,
                         const gpuipc_segment_opts_t *opts,
                         struct seg_opts *o)
{
  gpuipc_segment_opts_t u = GPUIPC_SEGMENT_OPTS_INIT;
  if (opts != NULL) {
    if (opts->size < sizeof(opts->size))
      return gpuipc__err(-EINVAL, "gpuipc_segment_open(%s): opts->size %zu "
                         "is below %zu", name, opts->size,
                         sizeof(opts->size));
    memcpy(&u, opts, opts->size < sizeof(u) ? opts->size : sizeof(u));
  }
  unsigned known = GPUIPC_CREATE | GPUIPC_EXCL | GPUIPC_WAIT | GPUIPC_SCRATCH;
  if (u.flags & ~known)
    return gpuipc__err(-EINVAL, "gpuipc_segment_open(%s): unknown flags "
                       "0x%x", name, u.flags & ~known);
  if ((unsigned)u.kind > GPUIPC_KIND_POOL)
    return gpuipc__err(-EINVAL, "gpuipc_segment_open(%s): kind %d unknown",
                       name, (int)u.kind);
  if ((u.flags & (GPUIPC_EXCL | GPUIPC_SCRATCH)) && !(u.flags & GPUIPC_CREATE))
    return gpuipc__err(-EINVAL, "gpuipc_segment_open(%s): GPUIPC_%s needs "
                       "GPUIPC_CREATE", name,
                       u.flags & GPUIPC_EXCL ? "EXCL" : "SCRATCH");
  if ((u.flags & GPUIPC_CREATE) && u.bytes == 0)
    return gpuipc__err(-EINVAL, "gpuipc_segment_open(%s): GPUIPC_CREATE "
                       "needs a size (bytes) above 0", name);
  if (u.bytes > GPUIPC_SIZE_MAX_ABSURD)
    return gpuipc__err(-EFBIG, "gpuipc_segment_open(%s): size %zu is above "
                       "2^48", name, u.bytes);
  if (u.timeout_ms < GPUIPC_TIMEOUT_DEFAULT)
    return gpuipc__err(-EINVAL, "gpuipc_segment_open(%s): timeout_ms %d",
                       name, u.timeout_ms);
  o->size = u.bytes;
  o->kind = u.kind;
  o->device = u.device;
  o->flags = u.flags;
  o->timeout_ms = u.timeout_ms == GPUIPC_TIMEOUT_DEFAULT
                      ? gpuipc__dom_timeout(dom) : u.timeout_ms;
  if (o->timeout_ms < 0)
    o->timeout_ms = -1;
  o->stream = u.stream;
  return 0;
}

int gpuipc_segment_open(gpuipc_domain_t *dom, const char *name,
                        const gpuipc_segment_opts_t *opts, gpuipc_buf_t **out)
{
  if (dom == NULL || out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_segment_open: %s is NULL",
                       dom == NULL ? "dom" : "out");
  int rc = gpuipc__name_check(name, "gpuipc_segment_open: segment name");
  if (rc != 0)
    return rc;
  struct seg_opts o = {0};
  rc = seg_opts_read(dom, name, opts, &o);
  if (rc != 0)
    return rc;
  return segment_open(dom, name, &o, out);
}

/* ------------------------------------------------------------------------ */
/* Publishing what was filled                                               */
/* ------------------------------------------------------------------------ */

/*
 * The hold of @buf this process fills (seg_mu held), or NULL with the
 * error for the caller in *@rc.
 */
static struct seg_hold *filling_hold(gpuipc_buf_t *buf, int *rc)
{
  struct seg_entry *e = entry_find(buf);
  bool created = false;
  for (struct seg_hold *h = e != NULL ? e->holds : NULL; h != NULL;
       h = h->next) {
    if (h->filling && !gpuipc__dom_stale(h->dom))
      return h;
    created |= h->creator;
  }
  *rc = created ? gpuipc__err(-EALREADY, "gpuipc_segment_publish: the "
                              "segment is published already")
                : gpuipc__err(-EINVAL, "gpuipc_segment_publish: the buffer "
                              "is no segment this process created and has "
                              "not published");
  return NULL;
}

/*
 * Order the publication after the writes queued on @stream: an event for
 * GPU kinds (*@ev, exported in @eh), a synchronised stream for HOST.
 */
static int order_writes(gpuipc_buf_t *buf, void *stream, gpuipc_event_t **ev,
                        gpuipc_event_handle_t *eh)
{
  *ev = NULL;
  if (gpuipc_buf_kind(buf) == GPUIPC_KIND_HOST) {
    if (stream == NULL)
      return 0; /* the CPU's writes are done */
    int dev = gpuipc_device_current();
    return gpuipc_stream_sync(dev >= 0 ? dev : 0, stream);
  }
  int rc = gpuipc_event_create(gpuipc_buf_device(buf), 0, ev);
  if (rc != 0)
    return rc;
  rc = gpuipc_event_record(*ev, stream);
  if (rc == 0)
    rc = gpuipc_event_export(*ev, eh);
  if (rc != 0) {
    (void)gpuipc_event_release(*ev);
    *ev = NULL;
  }
  return rc;
}

/* Send READY for @id, asking the next broker after a failover. */
static int ready(gpuipc_domain_t *d, uint64_t id, const char *name,
                 const gpuipc_event_t *ev, const gpuipc_event_handle_t *eh)
{
  struct gpuipc__reply *r = malloc(sizeof(*r));
  if (r == NULL)
    return gpuipc__err(-ENOMEM, "gpuipc_segment_publish: out of memory");
  char what[GPUIPC__NAME_MAX + 48];
  snprintf(what, sizeof(what), "gpuipc_segment_publish(%s)", name);
  uint64_t deadline = gpuipc__deadline(gpuipc__dom_timeout(d));
  bool retried = false;
  int rc;
  for (;;) {
    struct gpuipc__msg *m = &r->msg;
    memset(&m->u.ready, 0, sizeof(m->u.ready));
    m->type = GPUIPC_MSG_READY;
    m->u.ready.id = id;
    if (ev != NULL) {
      m->u.ready.has_event = true;
      rc = gpuipc_event_handle_pack(eh, m->u.ready.event,
                                    sizeof(m->u.ready.event));
      if (rc < 0)
        break;
    }
    rc = gpuipc__dom_call(d, m, NULL, 0, gpuipc__ms_left(deadline), what, r);
    if (rc == GPUIPC_E_PEER_GONE && gpuipc__now_ns() < deadline) {
      retried = true;
      continue;
    }
    break;
  }
  /* The dead broker took the first attempt and handed it over. */
  if (rc == -EALREADY && retried)
    rc = 0;
  for (int i = 0; rc == 0 && i < r->nfds; i++)
    gpuipc__fd_close(&r->fds[i]);
  free(r);
  return rc;
}

int gpuipc_segment_publish(gpuipc_buf_t *seg, void *stream)
{
  if (seg == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_segment_publish: seg is NULL");
  int rc = 0;
  pthread_mutex_lock(&seg_mu);
  struct seg_hold *h = filling_hold(seg, &rc);
  gpuipc_domain_t *d = h != NULL ? h->dom : NULL;
  uint64_t id = h != NULL ? h->id : 0;
  char name[GPUIPC__NAME_MAX + 1];
  snprintf(name, sizeof(name), "%s", h != NULL ? h->name : "");
  pthread_mutex_unlock(&seg_mu);
  if (d == NULL)
    return rc;
  gpuipc_event_t *ev;
  gpuipc_event_handle_t eh;
  rc = order_writes(seg, stream, &ev, &eh);
  if (rc == 0)
    rc = ready(d, id, name, ev, &eh);
  pthread_mutex_lock(&seg_mu);
  struct seg_entry *e = entry_find(seg);
  for (h = e != NULL ? e->holds : NULL; h != NULL; h = h->next)
    if (h->dom == d && h->id == id && h->filling)
      break;
  if (rc == 0 && h != NULL) {
    h->filling = false;
    h->keeper = (h->flags & GPUIPC__SEGF_CREATOR_HELD) != 0;
    h->has_event = ev != NULL;
    if (ev != NULL)
      gpuipc_event_handle_pack(&eh, h->event, sizeof(h->event));
    h->ev = ev;
    ev = NULL;
  }
  pthread_mutex_unlock(&seg_mu);
  if (ev != NULL)
    (void)gpuipc_event_release(ev);
  return rc;
}

/* UNLINK @name; @id non-zero: only while @name names segment @id. */
static int segment_unlink(gpuipc_domain_t *dom, const char *name, uint64_t id)
{
  struct gpuipc__reply *r = malloc(sizeof(*r));
  if (r == NULL)
    return gpuipc__err(-ENOMEM, "gpuipc_segment_unlink: out of memory");
  char what[GPUIPC__NAME_MAX + 48];
  snprintf(what, sizeof(what), "gpuipc_segment_unlink(%s)", name);
  uint64_t deadline = gpuipc__deadline(gpuipc__dom_timeout(dom));
  /* An attempt cut off by the broker's death may have unlinked the name
   * before the broker died; then the retry finds no such name, and the
   * caller's wish -- the name is gone -- has come true. */
  bool retried = false;
  int rc;
  for (;;) {
    struct gpuipc__msg *m = &r->msg;
    memset(&m->u.unlink, 0, sizeof(m->u.unlink));
    m->type = GPUIPC_MSG_UNLINK;
    snprintf(m->u.unlink.name, sizeof(m->u.unlink.name), "%s", name);
    m->u.unlink.id = id;
    rc = gpuipc__dom_call(dom, m, NULL, 0, gpuipc__ms_left(deadline), what,
                          r);
    if (rc == GPUIPC_E_PEER_GONE && gpuipc__now_ns() < deadline) {
      retried = true;
      continue;
    }
    break;
  }
  if (rc == -ENOENT && retried)
    rc = 0;
  for (int i = 0; i < r->nfds; i++)
    gpuipc__fd_close(&r->fds[i]);
  free(r);
  return rc;
}

int gpuipc_segment_unlink(gpuipc_domain_t *dom, const char *name)
{
  if (dom == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_segment_unlink: dom is NULL");
  int rc = gpuipc__name_check(name, "gpuipc_segment_unlink: segment name");
  if (rc != 0)
    return rc;
  return segment_unlink(dom, name, 0);
}

int gpuipc__segment_unlink_held(gpuipc_domain_t *dom, const char *name,
                                const gpuipc_buf_t *buf)
{
  uint64_t id = 0;
  pthread_mutex_lock(&seg_mu);
  struct seg_entry *e = entry_find(buf);
  for (struct seg_hold *h = e != NULL ? e->holds : NULL; h != NULL;
       h = h->next)
    if (h->dom == dom && strcmp(h->name, name) == 0)
      id = h->id;
  pthread_mutex_unlock(&seg_mu);
  if (id == 0)
    return gpuipc__err(-ENOENT, "gpuipc_segment_unlink(%s): this process "
                       "holds no segment of that name at %p", name,
                       (const void *)buf);
  return segment_unlink(dom, name, id);
}

/* ------------------------------------------------------------------------ */
/* Listing                                                                  */
/* ------------------------------------------------------------------------ */

const char *gpuipc_segment_state_name(gpuipc_segment_state_t st)
{
  switch (st) {
  case GPUIPC_SEG_CREATING: return "creating";
  case GPUIPC_SEG_FILLING: return "filling";
  case GPUIPC_SEG_PUBLISHED: return "published";
  case GPUIPC_SEG_UNLINKED: return "unlinked";
  case GPUIPC_SEG_LOST: return "lost";
  }
  return "?";
}

static void fill_info(gpuipc_segment_info_t *o, const struct gpuipc__list_rec *lr)
{
  size_t size = o->size;
  memset(o, 0, sizeof(*o));
  o->size = size;
  snprintf(o->name, sizeof(o->name), "%s", lr->seg.name);
  o->id = lr->seg.id;
  o->bytes = lr->seg.size;
  o->kind = (gpuipc_kind_t)lr->seg.kind;
  memcpy(o->device_uuid, lr->seg.uuid, sizeof(o->device_uuid));
  o->state = (gpuipc_segment_state_t)lr->seg.state;
  o->broker_fd = lr->broker_fd;
  o->nholders = (int)lr->nholders;
  for (uint32_t i = 0; i < lr->nlisted && i < GPUIPC_SEGMENT_HOLDERS; i++) {
    o->holder_pids[i] = (int)lr->holders[i].pid;
    o->holder_refs[i] = (int)lr->holders[i].refs;
  }
  o->creator_held = (lr->seg.flags & GPUIPC__SEGF_CREATOR_HELD) != 0;
  o->keeper_pid = (int)lr->keeper_pid;
}

/* One LIST round trip. */
static int list_page(gpuipc_domain_t *d, const char *name, uint64_t after,
                     uint32_t max, struct gpuipc__reply *r, const char *what)
{
  int rc;
  uint64_t deadline = gpuipc__deadline(gpuipc__dom_timeout(d));
  do {
    struct gpuipc__msg *m = &r->msg;
    memset(&m->u.list, 0, sizeof(m->u.list));
    m->type = GPUIPC_MSG_LIST;
    snprintf(m->u.list.name, sizeof(m->u.list.name), "%s", name);
    m->u.list.after_id = after;
    m->u.list.max = max;
    rc = gpuipc__dom_call(d, m, NULL, 0, gpuipc__ms_left(deadline), what, r);
  } while (rc == GPUIPC_E_PEER_GONE && gpuipc__now_ns() < deadline);
  for (int i = 0; i < r->nfds; i++)
    gpuipc__fd_close(&r->fds[i]);
  r->nfds = 0;
  if (rc == 0 && r->msg.type != GPUIPC_MSG_LIST_REPLY)
    rc = gpuipc__err(GPUIPC_E_PROTO, "%s: broker answered with %s", what,
                     gpuipc__msg_name(r->msg.type));
  return rc;
}

int gpuipc_segment_list(gpuipc_domain_t *dom, gpuipc_segment_info_t *out,
                       int cap)
{
  if (dom == NULL || cap < 0 || (cap > 0 && out == NULL))
    return gpuipc__err(-EINVAL, "gpuipc_segment_list: bad argument");
  for (int i = 0; i < cap; i++)
    if (out[i].size < sizeof(out[i]))
      return gpuipc__err(-EINVAL, "gpuipc_segment_list: out[%d].size %zu, "
                         "expected %zu", i, out[i].size, sizeof(out[i]));
  struct gpuipc__reply *r = malloc(sizeof(*r));
  /* Filled page by page; out[] is written only once every page came. */
  gpuipc_segment_info_t *tmp =
      cap > 0 ? calloc((size_t)cap, sizeof(*tmp)) : NULL;
  if (r == NULL || (cap > 0 && tmp == NULL)) {
    free(r);
    free(tmp);
    return gpuipc__err(-ENOMEM, "gpuipc_segment_list: out of memory");
  }
  for (int i = 0; i < cap; i++)
    tmp[i].size = sizeof(tmp[i]);
  int filled = 0, total = -1;
  uint64_t after = 0;
  int rc;
  for (;;) {
    uint32_t max = (uint32_t)(cap - filled);
    if (max > GPUIPC__LIST_RECS)
      max = GPUIPC__LIST_RECS;
    rc = list_page(dom, "", after, max, r, "gpuipc_segment_list");
    if (rc != 0)
      break;
    uint32_t count = r->msg.u.list_reply.count;
    if (count > max) {
      rc = gpuipc__err(GPUIPC_E_PROTO, "gpuipc_segment_list: asked the "
                       "broker for %u records, it sent %u", max, count);
      break;
    }
    if (total < 0)
      total = (int)r->msg.u.list_reply.segments;
    for (uint32_t i = 0; i < count; i++) {
      fill_info(&tmp[filled++], &r->msg.u.list_reply.recs[i]);
      after = r->msg.u.list_reply.recs[i].seg.id;
    }
    if (!r->msg.u.list_reply.more || filled >= cap || count == 0)
      break;
  }
  free(r);
  if (rc == 0)
    for (int i = 0; i < filled; i++) {
      size_t size = out[i].size;
      out[i] = tmp[i];
      out[i].size = size;
    }
  free(tmp);
  if (rc != 0)
    return rc;
  return total > filled ? total : filled;
}

int gpuipc_segment_stat(gpuipc_domain_t *dom, const char *name,
                        gpuipc_segment_info_t *out)
{
  if (dom == NULL || out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_segment_stat: NULL argument");
  if (out->size < sizeof(*out))
    return gpuipc__err(-EINVAL, "gpuipc_segment_stat: out->size %zu, "
                       "expected %zu", out->size, sizeof(*out));
  int rc = gpuipc__name_check(name, "gpuipc_segment_stat: segment name");
  if (rc != 0)
    return rc;
  struct gpuipc__reply *r = malloc(sizeof(*r));
  if (r == NULL)
    return gpuipc__err(-ENOMEM, "gpuipc_segment_stat: out of memory");
  char what[GPUIPC__NAME_MAX + 48];
  snprintf(what, sizeof(what), "gpuipc_segment_stat(%s)", name);
  rc = list_page(dom, name, 0, 1, r, what);
  if (rc == 0 && r->msg.u.list_reply.count != 1)
    rc = gpuipc__err(GPUIPC_E_PROTO, "%s: broker sent %u records", what,
                     r->msg.u.list_reply.count);
  if (rc == 0)
    fill_info(out, &r->msg.u.list_reply.recs[0]);
  free(r);
  return rc;
}
