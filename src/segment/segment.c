/*
 * Named segments, member side: gpuipc_segment_open (create or map), publish,
 * unlink, list and stat. What this process holds is counted in the segment
 * table (seg_table.c); memory its creator keeps is seg_keep.c's. This file
 * registers both with each domain it sends a request through (the listener
 * below), so that client.c calls neither.
 */
#include "core/private.h"
#include "cuda/cuda.h"
#include "segment/seg_table.h"
#include "os/os.h"
#include "wire/wire.h"
#include "mem/mem.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

/* Tests: publish every segment created here as held by its creator. */
static atomic_bool test_creator_held;

void gpuipc__seg_test_creator_held(bool on)
{
  atomic_store(&test_creator_held, on);
}

static _Atomic(gpuipc__seg_leave_fn) leave_hook;

void gpuipc__seg_on_leave(gpuipc__seg_leave_fn fn)
{
  atomic_store(&leave_hook, fn);
}

static void seg_leave(gpuipc_domain_t *d)
{
  gpuipc__seg_leave_fn fn = atomic_load(&leave_hook);
  if (fn != NULL)
    fn(d); /* the connection is still up: it may unlink what it lent */
  gpuipc__seg_disown_domain(d);
  gpuipc__seg_forget_domain(d);
}

/* How a domain reaches the segment table (registered before any request). */
static const struct gpuipc__dom_listener seg_listener = {
    .on_reconnect = gpuipc__seg_republish,
    .on_unlinked = gpuipc__seg_unlinked,
    .on_let_go = gpuipc__seg_let_go,
    .on_orphan = gpuipc__seg_orphan,
    .on_leave = seg_leave,
};

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
  gpuipc__seg_fork_install();
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

/* The gpuipc_buf_alloc / _import flags of an open's @flags. */
static unsigned buf_flags(unsigned flags)
{
  return flags & GPUIPC_UNPINNED ? GPUIPC_BUF_UNPINNED : 0;
}

/* Map the segment a HANDLE reply describes. Closes the reply's fds. */
static int import_reply(struct gpuipc__reply *r, int device, unsigned flags,
                        gpuipc_buf_t **out)
{
  const struct gpuipc__seg_wire *w = &r->msg.u.handle.seg;
  gpuipc_handle_t h;
  int rc = gpuipc_handle_unpack(w->handle, sizeof(w->handle), &h);
  if (rc == 0) {
    h.fd = r->nfds > 0 ? r->fds[0] : -1;
    /* The fd is the import's when it succeeds: kept (VMM) or closed. It
     * came with MSG_CMSG_CLOEXEC (os/sock.c). */
    rc = gpuipc__buf_import(&h, device,
                            flags | GPUIPC_BUF_TAKE_FD |
                                GPUIPC__BUF_FD_CLOEXEC,
                            out);
    if (rc == 0 && r->nfds > 0)
      r->fds[0] = -1;
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
  gpuipc_buf_t *buf; /* CREATE: publish this buffer, allocate nothing */
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
    rc = gpuipc_buf_alloc(o->size, ak, o->device, buf_flags(o->flags), own);
    if (rc != 0) {
      gpuipc__seg_post_abandon(d, id);
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
    gpuipc__seg_post_abandon(d, id);
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
  rc = gpuipc__seg_record(d, *own, &pub, r->gen, true);
  if (rc != 0) {
    gpuipc__seg_post_release(d, pub.id, 1);
    if (keeper && gpuipc__seg_disown(d, pub.id, 2000) != 0) {
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

/*
 * An open found @*buf among this process's own allocations without
 * holding segment @w through it: memory lent under @w's name (the lend has
 * a handle of its own, see segment_open). This open gets one too, so that
 * its release lets go of the segment alone, not with the lent buffer.
 */
static int own_handle(gpuipc_domain_t *d, const struct gpuipc__seg_wire *w,
                      gpuipc_buf_t **buf)
{
  if ((*buf)->imported || gpuipc__seg_held_through(*buf, d, w->id))
    return 0;
  gpuipc_buf_t *a;
  int rc = gpuipc__buf_alias(*buf, &a);
  if (rc != 0)
    return rc;
  gpuipc_buf_release(*buf); /* never the last reference: @a holds one */
  *buf = a;
  return 0;
}

/* Map the segment a HANDLE reply describes, ordered after its writes. */
static int open_granted(gpuipc_domain_t *d, const struct seg_opts *o,
                        struct gpuipc__reply *r, gpuipc_buf_t **out)
{
  uint64_t gen = r->gen;
  struct gpuipc__seg_wire w = r->msg.u.handle.seg;
  gpuipc_buf_t *buf;
  int rc = import_reply(r, o->device, buf_flags(o->flags), &buf);
  if (rc != 0) {
    gpuipc__seg_post_release(d, w.id, 1);
    return rc;
  }
  rc = own_handle(d, &w, &buf);
  if (rc == 0)
    rc = wait_writes(&w, buf, o->stream);
  if (rc == 0)
    rc = gpuipc__seg_record(d, buf, &w, gen, false);
  if (rc != 0) {
    gpuipc__seg_post_release(d, w.id, 1);
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
  /* A lent buffer: the segment gets a handle of its own, so that its
   * release lets go of the segment while the caller keeps the buffer. */
  if (o->buf != NULL && (rc = gpuipc__buf_alias(o->buf, &own)) != 0) {
    free(r);
    return rc;
  }
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

/*
 * A CREATE of existing buffer @o->buf: it must be this process's own and
 * what the other options ask for (they take its size); EXCL is implied: an
 * existing name is never opened in its place. A buffer may be a segment
 * under several names: each lend is a handle of its own on it
 * (gpuipc__buf_alias, in segment_open), with its own hold in the segment
 * table, which its last release ends.
 */
static int adopt_check(const char *name, struct seg_opts *o)
{
  const gpuipc_buf_t *b = o->buf;
  if (!(o->flags & GPUIPC_CREATE))
    return gpuipc__err(-EINVAL, "gpuipc_segment_open(%s): opts->buf needs "
                       "GPUIPC_CREATE", name);
  if (b->imported)
    return gpuipc__err(-EINVAL, "gpuipc_segment_open(%s): opts->buf is "
                       "memory of another process (imported)", name);
  if (o->size != 0 && o->size != b->size)
    return gpuipc__err(-EINVAL, "gpuipc_segment_open(%s): bytes %zu but "
                       "opts->buf has %zu", name, o->size, b->size);
  if (o->kind != GPUIPC_KIND_AUTO && o->kind != b->kind)
    return gpuipc__err(-EINVAL, "gpuipc_segment_open(%s): kind %s but "
                       "opts->buf is %s", name, gpuipc_kind_name(o->kind),
                       gpuipc_kind_name(b->kind));
  if (o->device >= 0 && o->device != b->device)
    return gpuipc__err(-EINVAL, "gpuipc_segment_open(%s): device %d but "
                       "opts->buf is on %d", name, o->device, b->device);
  o->size = b->size;
  o->kind = b->kind;
  o->device = b->device;
  o->flags |= GPUIPC_EXCL;
  return 0;
}

/* The caller's options: its prefix of the struct, defaults beyond it. */
static int seg_opts_read(gpuipc_domain_t *dom, const char *name,
                         const gpuipc_segment_opts_t *opts,
                         struct seg_opts *o)
{
  gpuipc_segment_opts_t u = GPUIPC_SEGMENT_OPTS_INIT;
  if (opts != NULL) {
    int rc = gpuipc__size_check(opts->size, "gpuipc_segment_open: opts");
    if (rc != 0)
      return rc;
    gpuipc__opts_read(&u, sizeof(u), opts, opts->size);
  }
  unsigned known = GPUIPC_CREATE | GPUIPC_EXCL | GPUIPC_WAIT |
                   GPUIPC_SCRATCH | GPUIPC_UNPINNED;
  if (u.flags & ~known)
    return gpuipc__err(-EINVAL, "gpuipc_segment_open(%s): unknown flags "
                       "0x%x", name, u.flags & ~known);
  if (!gpuipc__kind_valid(u.kind))
    return gpuipc__err(-EINVAL, "gpuipc_segment_open(%s): kind %d unknown",
                       name, (int)u.kind);
  if ((u.flags & (GPUIPC_EXCL | GPUIPC_SCRATCH)) && !(u.flags & GPUIPC_CREATE))
    return gpuipc__err(-EINVAL, "gpuipc_segment_open(%s): GPUIPC_%s needs "
                       "GPUIPC_CREATE", name,
                       u.flags & GPUIPC_EXCL ? "EXCL" : "SCRATCH");
  if ((u.flags & GPUIPC_CREATE) && u.bytes == 0 && u.buf == NULL)
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
  o->buf = u.buf;
  return o->buf != NULL ? adopt_check(name, o) : 0;
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
  struct seg_entry *e = gpuipc__seg_entry_find(buf);
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
 * Order the publication after the writes queued on @stream: for GPU kinds
 * an event (*@ev, exported in @eh) unless the stream is idle, a
 * synchronised stream for HOST. An idle stream's writes are done: the
 * openers have nothing to wait for, and this process makes no
 * interprocess event (CUDA keeps an 80 KiB file in /dev/shm for each
 * process that made one until its context is destroyed, which outlasts
 * exit()).
 */
static int order_writes(gpuipc_buf_t *buf, void *stream, gpuipc_event_t **ev,
                        gpuipc_event_handle_t *eh)
{
  *ev = NULL;
  if (gpuipc_buf_kind(buf) == GPUIPC_KIND_HOST) {
    if (stream == NULL)
      return 0; /* the CPU's writes are done */
    int dev = gpuipc__device_current();
    return gpuipc__stream_sync(dev >= 0 ? dev : 0, stream);
  }
  int dev = gpuipc_buf_device(buf);
  if (gpuipc__stream_idle(gpuipc__stream_dev(stream, dev), stream))
    return 0;
  int rc = gpuipc_event_create(dev, 0, ev);
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
  gpuipc__seg_fork_install();
  pthread_mutex_lock(&gpuipc__seg_mu);
  struct seg_hold *h = filling_hold(seg, &rc);
  gpuipc_domain_t *d = h != NULL ? h->dom : NULL;
  uint64_t id = h != NULL ? h->id : 0;
  char name[GPUIPC__NAME_MAX + 1];
  snprintf(name, sizeof(name), "%s", h != NULL ? h->name : "");
  pthread_mutex_unlock(&gpuipc__seg_mu);
  if (d == NULL)
    return rc;
  gpuipc_event_t *ev;
  gpuipc_event_handle_t eh;
  rc = order_writes(seg, stream, &ev, &eh);
  if (rc == 0)
    rc = ready(d, id, name, ev, &eh);
  pthread_mutex_lock(&gpuipc__seg_mu);
  struct seg_entry *e = gpuipc__seg_entry_find(seg);
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
  pthread_mutex_unlock(&gpuipc__seg_mu);
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
  gpuipc__seg_fork_install();
  pthread_mutex_lock(&gpuipc__seg_mu);
  struct seg_entry *e = gpuipc__seg_entry_find(buf);
  for (struct seg_hold *h = e != NULL ? e->holds : NULL; h != NULL;
       h = h->next)
    if (h->dom == dom && strcmp(h->name, name) == 0)
      id = h->id;
  pthread_mutex_unlock(&gpuipc__seg_mu);
  if (id == 0)
    return gpuipc__err(-ENOENT, "gpuipc_segment_unlink(%s): this process "
                       "holds no segment of that name at %p", name,
                       (const void *)buf);
  return segment_unlink(dom, name, id);
}

int gpuipc__seg_id_of(const gpuipc_buf_t *buf, const gpuipc_domain_t *dom,
                      uint64_t *id)
{
  int rc = -ENOENT;
  gpuipc__seg_fork_install();
  pthread_mutex_lock(&gpuipc__seg_mu);
  struct seg_entry *e = gpuipc__seg_entry_find(buf);
  for (struct seg_hold *h = e != NULL ? e->holds : NULL; h != NULL;
       h = h->next)
    if (h->dom == dom) {
      *id = h->id;
      rc = 0;
      break;
    }
  pthread_mutex_unlock(&gpuipc__seg_mu);
  return rc;
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

/* Fill the caller's @out (its prefix: out->size) from @lr. */
static void fill_info(gpuipc_segment_info_t *out,
                      const struct gpuipc__list_rec *lr)
{
  gpuipc_segment_info_t info = {.size = sizeof(info)}, *o = &info;
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
  gpuipc__out_write(out, out->size, &info, sizeof(info));
}

/* Element @i of the caller's array of @stride-byte structs. */
static gpuipc_segment_info_t *info_at(gpuipc_segment_info_t *out,
                                      size_t stride, int i)
{
  return (gpuipc_segment_info_t *)((char *)out + (size_t)i * stride);
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
  /* The caller's struct may be an older, smaller one: out[0].size apart. */
  size_t stride = cap > 0 ? out[0].size : sizeof(*out);
  int rc = gpuipc__size_check(stride, "gpuipc_segment_list: out[0]");
  if (rc != 0)
    return rc;
  for (int i = 1; i < cap; i++)
    if (info_at(out, stride, i)->size != stride)
      return gpuipc__err(-EINVAL, "gpuipc_segment_list: out[%d].size %zu, "
                         "out[0].size %zu", i, info_at(out, stride, i)->size,
                         stride);
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
    for (int i = 0; i < filled; i++)
      gpuipc__out_write(info_at(out, stride, i), stride, &tmp[i],
                        sizeof(tmp[i]));
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
  int rc = gpuipc__size_check(out->size, "gpuipc_segment_stat: out");
  if (rc != 0)
    return rc;
  rc = gpuipc__name_check(name, "gpuipc_segment_stat: segment name");
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
