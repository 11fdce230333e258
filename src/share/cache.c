/*
 * What a member keeps across calls (docs/shared-copy.md, "Across calls"),
 * so that a sync does not lend and map anew what the last one did:
 *
 *  - standing lends: each destination buffer is lent once, as the segment
 *    "gpuipc-share.<pid>.<n>" (n counts this process's lends), and stays
 *    lent while its caller holds the buffer. Let go (unlinked while the
 *    name is still this lend's, and released) as soon as its caller
 *    released the buffer (the lend's own reference on it is the last: the
 *    registry says so, and a thread of the library lets go of it then),
 *    at the end of a call that finds it unused for
 *    GPUIPC__SHARE_KEEP_CALLS calls, and as the domain is left (a hook the
 *    segment layer calls). A rollout worker that frees its model between
 *    syncs gets the memory back without another sync.
 *  - opened peers: a peer's lent segment, by the broker's id (never reused
 *    in a domain) and the device it is mapped for, stays mapped. Let go at
 *    the end of a call once its lender is gone (its process dead or
 *    reused) or it went unused for GPUIPC__SHARE_KEEP_CALLS calls, and as
 *    the domain is left.
 *
 * A call takes a use of each entry it works with and puts it back at its
 * end; nothing in use is let go. An opened segment whose call could not
 * see its copies land (gpuipc__share_settle timed out) is never let go:
 * copies from it may still be queued.
 *
 * A crashed lender's standing names stay named, held by nobody once its
 * peers let go of it: the sweep unlinks them (sweep.c). A child made by
 * fork() forgets the parent's entries (its domain is a new one; the
 * parent's handles are not its to release).
 *
 * The lock is a leaf: nothing is called while it is held but the buffer
 * registry's reference count (and, at fork(), ahead.c's lock after it).
 * The thread that lets go of released destinations (reap) takes entries
 * off the list under it and lets go of them after; a domain's leave waits
 * for it (reaping) before the domain goes.
 * The tables opened ahead (ahead.c) go by the same tick, leave and fork.
 */
#include "share/share.h"
#include "domain/domain.h"
#include "segment/segment.h"
#include "mem/mem.h"
#include "os/os.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct share_cache_entry {
  struct share_cache_entry *next;
  gpuipc_domain_t *dom;
  bool lend;          /* a standing lend; else a peer's segment opened */
  gpuipc_buf_t *buf;  /* lend: the lent handle; open: the mapping */
  uint64_t id;        /* the broker's id of the segment */
  /* lend: the caller's buffer, as its base, pointer and size (the lend
   * holds a reference on the base: its address is not reused meanwhile) */
  const struct gpuipc_buf *base;
  const void *ptr;
  size_t size;
  uint32_t n;         /* its name's number */
  int device;         /* open: mapped for this device (-1: HOST) */
  uint32_t pid;       /* open: its lender, and when that process started */
  uint64_t start_time;
  int busy;           /* calls using it now */
  bool pinned;        /* a call could not settle: never let go */
  uint64_t used;      /* the call count when last used */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct share_cache_entry *entries;
static uint64_t calls;
static uint32_t next_n;
static pthread_once_t once = PTHREAD_ONCE_INIT;
/* The reaping thread: a job of the library's (os.h). */
static void reap(void);
static struct gpuipc__job reaper = GPUIPC__JOB_INIT(reap);
static int reaping; /* entries it took off the list and lets go of (mu) */
static pthread_cond_t reaped = PTHREAD_COND_INITIALIZER; /* reaping fell */

static void fork_prepare(struct gpuipc__fork_hook *h)
{
  (void)h;
  pthread_mutex_lock(&mu);
  gpuipc__share_ahead_fork(0);
}

static void fork_parent(struct gpuipc__fork_hook *h)
{
  (void)h;
  gpuipc__share_ahead_fork(1);
  pthread_mutex_unlock(&mu);
}

/* The parent's entries are its own: forgotten, never released here. */
static void fork_child(struct gpuipc__fork_hook *h)
{
  (void)h;
  gpuipc__share_ahead_fork(2);
  entries = NULL;
  /* No reaping thread here; nobody waits for one. */
  gpuipc__job_forget(&reaper);
  reaping = 0;
  pthread_cond_init(&reaped, NULL);
  pthread_mutex_unlock(&mu);
}

static struct gpuipc__fork_hook fork_hook = {
    .prepare = fork_prepare, .parent = fork_parent, .child = fork_child};

static void leave(gpuipc_domain_t *d);
static void reap_ask(void);

static void install(void)
{
  gpuipc__buf_fork_install(); /* the registry's lock is taken under ours */
  gpuipc__fork_register(&fork_hook);
  gpuipc__seg_on_leave(leave);
  gpuipc__buf_on_watched_last(reap_ask);
}

int gpuipc__share_standing_name(char *out, size_t cap, uint32_t pid,
                                uint32_t n)
{
  int w = snprintf(out, cap, GPUIPC__SHARE_STANDING "%u.%u", pid, n);
  return w < 0 || (size_t)w >= cap || w > GPUIPC_NAME_MAX ? -ENAMETOOLONG : 0;
}

/* Let go of entries taken off the list (no lock held). */
static void let_go(struct share_cache_entry *e)
{
  while (e != NULL) {
    struct share_cache_entry *next = e->next;
    if (e->lend) {
      gpuipc__buf_watch_last(e->buf, false);
      char name[GPUIPC_NAME_MAX + 1];
      if (gpuipc__share_standing_name(name, sizeof(name), (uint32_t)getpid(),
                                      e->n) == 0)
        (void)gpuipc__segment_unlink_held(e->dom, name, e->buf);
    }
    gpuipc_buf_release(e->buf);
    free(e);
    e = next;
  }
}

/* Lend @dst as standing lend number @n: its handle and id. */
static int lend_new(gpuipc_domain_t *dom, gpuipc_buf_t *dst, uint32_t n,
                    gpuipc_buf_t **out, uint64_t *id)
{
  char name[GPUIPC_NAME_MAX + 1];
  int rc = gpuipc__share_standing_name(name, sizeof(name), (uint32_t)getpid(),
                                       n);
  if (rc != 0)
    return gpuipc__err(rc, "gpuipc_share_copy: lent name too long");
  gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
  o.flags = GPUIPC_CREATE | GPUIPC_SCRATCH;
  o.buf = dst;
  rc = gpuipc_segment_open(dom, name, &o, out);
  if (rc == -EEXIST) {
    /* Left by a process that had our pid and died: ours to reuse. */
    (void)gpuipc_segment_unlink(dom, name);
    rc = gpuipc_segment_open(dom, name, &o, out);
  }
  if (rc != 0)
    return rc;
  if (gpuipc__seg_id_of(*out, dom, id) != 0) {
    (void)gpuipc__segment_unlink_held(dom, name, *out);
    gpuipc_buf_release(*out);
    return gpuipc__err(-ENOENT, "gpuipc_share_copy: lent segment %s has no "
                       "id", name);
  }
  return 0;
}

static const struct gpuipc_buf *base_of(const gpuipc_buf_t *b)
{
  return b->base != NULL ? b->base : b;
}

/*
 * Whether @e is the entry @key describes: a standing lend of the same
 * caller's buffer, or a peer's segment of the same id, device, lender and
 * name number (the lender's pid and name number are part of the key: a
 * member slot whose words name another member's segment by its id alone
 * does not get that segment).
 */
static bool same(const struct share_cache_entry *e,
                 const struct share_cache_entry *key)
{
  if (e->lend != key->lend || e->dom != key->dom)
    return false;
  return e->lend ? e->base == key->base && e->ptr == key->ptr &&
                       e->size == key->size
                 : e->id == key->id && e->device == key->device &&
                       e->pid == key->pid && e->n == key->n;
}

/* The entry @key describes, with one use of it taken; NULL if none. mu
 * held. */
static struct share_cache_entry *use(const struct share_cache_entry *key)
{
  for (struct share_cache_entry *e = entries; e != NULL; e = e->next)
    if (same(e, key)) {
      e->busy++;
      e->used = calls;
      return e;
    }
  return NULL;
}

/*
 * Keep @made (lent or opened by this call, one use taken): unless another
 * thread's call kept the same meanwhile -- then that one is used and
 * @made let go. The one kept, in *@out.
 */
static void keep(struct share_cache_entry *made, struct share_kept *out)
{
  pthread_mutex_lock(&mu);
  struct share_cache_entry *e = use(made);
  made->used = calls;
  if (e == NULL) {
    made->next = entries;
    entries = made;
  }
  pthread_mutex_unlock(&mu);
  if (e != NULL)
    let_go(made);
  struct share_cache_entry *k = e != NULL ? e : made;
  *out = (struct share_kept){k, k->id, k->n, e == NULL};
}

int gpuipc__share_cache_lend(gpuipc_domain_t *dom, gpuipc_buf_t *dst,
                             struct share_kept *out)
{
  pthread_once(&once, install);
  struct share_cache_entry key = {.dom = dom, .lend = true,
                                  .base = base_of(dst), .ptr = dst->ptr,
                                  .size = dst->size};
  pthread_mutex_lock(&mu);
  struct share_cache_entry *e = use(&key);
  uint32_t n = e == NULL ? next_n++ : 0;
  pthread_mutex_unlock(&mu);
  if (e != NULL) {
    *out = (struct share_kept){e, e->id, e->n, false};
    return 0;
  }
  struct share_cache_entry *made = malloc(sizeof(*made));
  if (made == NULL)
    return gpuipc__err(-ENOMEM, "gpuipc_share_copy: out of memory");
  *made = key;
  made->n = n;
  made->device = -1;
  made->busy = 1;
  int rc = lend_new(dom, dst, n, &made->buf, &made->id);
  if (rc != 0) {
    free(made);
    return rc;
  }
  /* Watched from now on (busy meanwhile: nothing lets go of it yet). */
  gpuipc__buf_watch_last(made->buf, true);
  keep(made, out);
  return 0;
}

gpuipc_buf_t *gpuipc__share_cache_open(gpuipc_domain_t *dom, uint32_t pid,
                                       uint64_t start_time, uint32_t n,
                                       uint64_t id, int device,
                                       struct share_kept *out)
{
  pthread_once(&once, install);
  struct share_cache_entry key = {.dom = dom, .id = id, .n = n,
                                  .device = device, .pid = pid,
                                  .start_time = start_time, .busy = 1};
  pthread_mutex_lock(&mu);
  struct share_cache_entry *e = use(&key);
  pthread_mutex_unlock(&mu);
  if (e != NULL) {
    *out = (struct share_kept){e, e->id, e->n, false};
    return e->buf;
  }
  char name[GPUIPC_NAME_MAX + 1];
  gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
  o.device = device;
  gpuipc_buf_t *b = NULL;
  uint64_t got = 0;
  struct share_cache_entry *made = NULL;
  if (gpuipc__share_standing_name(name, sizeof(name), pid, n) != 0 ||
      gpuipc_segment_open(dom, name, &o, &b) != 0 ||
      gpuipc__seg_id_of(b, dom, &got) != 0 || got != id ||
      (made = malloc(sizeof(*made))) == NULL) {
    if (b != NULL)
      gpuipc_buf_release(b);
    return NULL;
  }
  *made = key;
  made->buf = b;
  keep(made, out); /* another call's: one mapping kept */
  return out->entry->buf;
}

gpuipc_buf_t *gpuipc__share_kept_buf(const struct share_kept *k)
{
  return k->entry->buf;
}

void gpuipc__share_cache_put(struct share_kept *k, bool settled)
{
  struct share_cache_entry *e = k->entry;
  if (e == NULL)
    return;
  pthread_mutex_lock(&mu);
  e->busy--;
  if (!settled && !e->lend)
    e->pinned = true;
  pthread_mutex_unlock(&mu);
  k->entry = NULL;
}

/* Take off the list the entries @want picks (given @arg): their list. mu
 * held. */
static struct share_cache_entry *
take_off(bool (*want)(const struct share_cache_entry *e, const void *arg),
         const void *arg)
{
  struct share_cache_entry *out = NULL;
  for (struct share_cache_entry **pp = &entries; *pp != NULL;) {
    struct share_cache_entry *e = *pp;
    if (want(e, arg)) {
      *pp = e->next;
      e->next = out;
      out = e;
    } else {
      pp = &e->next;
    }
  }
  return out;
}

/* Whether nothing uses entry @e, and it may be let go. */
static bool idle(const struct share_cache_entry *e)
{
  return e->busy == 0 && !e->pinned;
}

/* Whether lend @e's buffer is held by lends alone now (this one, and any
 * other domain's of the same buffer): its caller let go. */
static bool released(const struct share_cache_entry *e, const void *arg)
{
  (void)arg;
  return e->lend && idle(e) && gpuipc__buf_watched_alone(e->buf);
}

struct tick_arg {
  gpuipc_domain_t *dom;
  uint64_t now;
};

/* Whether @e of the domain ticking goes: released, unused for
 * GPUIPC__SHARE_KEEP_CALLS calls, or (opened) its lender gone. */
static bool ticked_out(const struct share_cache_entry *e, const void *arg)
{
  const struct tick_arg *t = arg;
  if (e->dom != t->dom || !idle(e))
    return false;
  if (t->now - e->used > GPUIPC__SHARE_KEEP_CALLS || released(e, NULL))
    return true;
  return !e->lend &&
         gpuipc__share_pid_gone(e->pid, e->start_time != 0, e->start_time);
}

uint64_t gpuipc__share_cache_tick(gpuipc_domain_t *dom)
{
  pthread_once(&once, install);
  pthread_mutex_lock(&mu);
  struct tick_arg t = {dom, ++calls};
  struct share_cache_entry *drop = take_off(ticked_out, &t);
  pthread_mutex_unlock(&mu);
  let_go(drop);
  gpuipc__share_ahead_tick(dom, t.now);
  return t.now;
}

static bool of_domain(const struct share_cache_entry *e, const void *arg)
{
  return e->dom == arg;
}

/* ----- reaping: standing lends whose caller released the buffer ----- */

/* Let go of every standing lend whose caller released its buffer. */
static void reap(void)
{
  pthread_mutex_lock(&mu);
  struct share_cache_entry *drop = take_off(released, NULL);
  reaping++;
  pthread_mutex_unlock(&mu);
  let_go(drop);
  pthread_mutex_lock(&mu);
  reaping--;
  pthread_cond_broadcast(&reaped);
  pthread_mutex_unlock(&mu);
}

/* The registry saw a watched buffer left with its watchers' references
 * alone (any thread, no lock held): reap on a thread of the library, or
 * have the one at work look again. Without a thread, the end of the next
 * call lets go of it (gpuipc__share_cache_tick). */
static void reap_ask(void)
{
  (void)gpuipc__job_ask(&reaper);
}

/* The domain is being left: everything kept for it goes (what a call
 * could not settle stays mapped, its entry forgotten), once the reaping
 * thread let go of what it took (some may be this domain's). */
static void leave(gpuipc_domain_t *d)
{
  gpuipc__share_ahead_leave(d);
  pthread_mutex_lock(&mu);
  while (reaping > 0)
    pthread_cond_wait(&reaped, &mu);
  struct share_cache_entry *mine = take_off(of_domain, d), *drop = NULL;
  pthread_mutex_unlock(&mu);
  for (struct share_cache_entry *e = mine, *next; e != NULL; e = next) {
    next = e->next;
    if (idle(e)) {
      e->next = drop;
      drop = e;
    } else {
      free(e);
    }
  }
  let_go(drop);
}

void gpuipc__share_cache_count(gpuipc_domain_t *dom, int *lends, int *opens)
{
  *lends = *opens = 0;
  pthread_mutex_lock(&mu);
  for (struct share_cache_entry *e = entries; e != NULL; e = e->next)
    if (e->dom == dom)
      (*(e->lend ? lends : opens))++;
  pthread_mutex_unlock(&mu);
}
