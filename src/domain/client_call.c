/*
 * A member's requests to its broker: each waits in the domain's table of
 * pending requests (by request id) until the reader thread
 * (client_reader.c) hands it its reply, the connection drops, or time
 * runs out; a request whose caller gave up is remembered as an orphan, so
 * that its late reply is undone. Posts (no reply) go on the current
 * connection or on the one a caller names. The state is in member.h.
 */
#include "domain/member.h"
#include "os/os.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Bound on a fire-and-forget send. */
#define POST_MS 2000

bool gpuipc__dom_stale(const gpuipc_domain_t *d)
{
  return d->fork_gen != gpuipc__fork_gen();
}

int gpuipc__dom_stale_err(const gpuipc_domain_t *d, const char *what)
{
  return gpuipc__err(GPUIPC_E_CLOSED, "%s: domain %s was joined by the "
                     "parent of this process (before fork()); join it anew",
                     what, d->name);
}

int gpuipc__dom_timeout(const gpuipc_domain_t *d)
{
  return d->timeout_ms;
}

uint64_t gpuipc__dom_gen(gpuipc_domain_t *d)
{
  pthread_mutex_lock(&d->mu);
  uint64_t g = d->gen;
  pthread_mutex_unlock(&d->mu);
  return g;
}

void gpuipc__dom_saw_id(gpuipc_domain_t *d, uint64_t id)
{
  /* No broker hands out such an id, and every HELLO carrying it would be
   * refused as malformed: this member could never reconnect. */
  if (id > GPUIPC__ID_MAX)
    return;
  uint64_t cur = atomic_load(&d->max_id);
  while (id > cur && !atomic_compare_exchange_weak(&d->max_id, &cur, id))
    ;
}

/* Wait on the domain's condition until @deadline; false when it passed. */
static bool cv_wait(struct gpuipc_domain *d, uint64_t deadline)
{
  if (deadline == UINT64_MAX) {
    pthread_cond_wait(&d->cv, &d->mu);
    return true;
  }
  uint64_t now = gpuipc__now_ns();
  if (now >= deadline)
    return false;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec +
               (deadline - now);
  ts.tv_sec = (time_t)(t / 1000000000ull);
  ts.tv_nsec = (long)(t % 1000000000ull);
  pthread_cond_timedwait(&d->cv, &d->mu, &ts);
  return true;
}

void gpuipc__dom_pending_unlink(struct gpuipc_domain *d, struct pending *p)
{
  for (struct pending **pp = &d->pending; *pp != NULL; pp = &(*pp)->next) {
    if (*pp == p) {
      *pp = p->next;
      return;
    }
  }
}

/* The caller of request @req gave up waiting (d->mu held). */
static void remember_orphan(struct gpuipc_domain *d, uint32_t req,
                            uint16_t type)
{
  struct orphan *o = malloc(sizeof(*o));
  if (o == NULL)
    return; /* its reply will not be undone: what it did stays counted */
  o->req = req;
  o->type = type;
  o->next = d->orphans;
  d->orphans = o;
  if (++d->norphans > ORPHANS_MAX) {
    struct orphan **pp = &d->orphans;
    while ((*pp)->next != NULL)
      pp = &(*pp)->next;
    free(*pp);
    *pp = NULL;
    d->norphans--;
  }
}

uint16_t gpuipc__dom_orphan_take(struct gpuipc_domain *d, uint32_t req)
{
  for (struct orphan **pp = &d->orphans; *pp != NULL; pp = &(*pp)->next) {
    struct orphan *o = *pp;
    if (o->req == req) {
      uint16_t type = o->type;
      *pp = o->next;
      free(o);
      d->norphans--;
      return type;
    }
  }
  return 0;
}

void gpuipc__dom_orphans_forget(struct gpuipc_domain *d)
{
  while (d->orphans != NULL) {
    struct orphan *o = d->orphans;
    d->orphans = o->next;
    free(o);
  }
  d->norphans = 0;
}

int gpuipc__dom_call(gpuipc_domain_t *d, struct gpuipc__msg *m,
                     const int *fds, int nfds, int timeout_ms,
                     const char *what, struct gpuipc__reply *out)
{
  uint64_t deadline = gpuipc__deadline(timeout_ms);
  struct pending p = {.out = out};
  out->nfds = 0;
  if (gpuipc__dom_stale(d))
    return gpuipc__dom_stale_err(d, what);
  pthread_mutex_lock(&d->mu);
  while (d->state == DOM_DOWN) {
    if (!cv_wait(d, deadline)) {
      pthread_mutex_unlock(&d->mu);
      return gpuipc__err(-ETIMEDOUT, "%s: domain %s has no broker "
                         "reachable", what, d->name);
    }
  }
  if (d->state == DOM_CLOSED) {
    pthread_mutex_unlock(&d->mu);
    return gpuipc__err(GPUIPC_E_CLOSED, "%s: domain %s is being left", what,
                       d->name);
  }
  if (d->state == DOM_FAILED) {
    int code = d->failed_code;
    char why[sizeof(d->failed_why)];
    memcpy(why, d->failed_why, sizeof(why));
    pthread_mutex_unlock(&d->mu);
    return gpuipc__err(code, "%s: %s", what, why);
  }
  if (++d->next_req == 0)
    d->next_req = 1;
  p.req = d->next_req;
  p.type = m->type;
  m->req = p.req;
  p.next = d->pending;
  d->pending = &p;
  uint64_t gen = d->gen;
  pthread_mutex_unlock(&d->mu);

  /*
   * Only on the connection this request was registered for: had it
   * dropped meanwhile, the caller is told so (and retries), and the
   * request must not reach the next broker behind its back.
   */
  pthread_mutex_lock(&d->send_mu);
  int rc = d->fd_gen == gen
               ? gpuipc__proto_send(d->fd, m, fds, nfds, timeout_ms)
               : GPUIPC_E_PEER_GONE;
  pthread_mutex_unlock(&d->send_mu);

  pthread_mutex_lock(&d->mu);
  if (rc == 0) {
    while (p.done == 0 && d->gen == gen && d->state != DOM_CLOSED)
      if (!cv_wait(d, deadline))
        break;
  }
  if (p.done == 0) {
    gpuipc__dom_pending_unlink(d, &p);
    if (rc == 0 && d->gen == gen && d->state == DOM_UP)
      remember_orphan(d, p.req, p.type);
  }
  bool gen_changed = d->gen != gen;
  pthread_mutex_unlock(&d->mu);

  if (p.done < 0)
    return gpuipc__err(p.done, "%s: the connection to the broker of domain "
                       "%s dropped", what, d->name);
  if (p.done == 0) {
    if (rc != 0)
      return rc == GPUIPC_E_PEER_GONE || rc == -EPIPE || rc == -ECONNRESET
                 ? gpuipc__err(GPUIPC_E_PEER_GONE, "%s: the connection to "
                               "the broker of domain %s dropped", what,
                               d->name)
                 : rc;
    if (gen_changed)
      return gpuipc__err(GPUIPC_E_PEER_GONE, "%s: the broker of domain %s "
                         "changed", what, d->name);
    return gpuipc__err(-ETIMEDOUT, "%s: no answer from the broker of domain "
                       "%s in %d ms", what, d->name, timeout_ms);
  }
  if (out->msg.type == GPUIPC_MSG_ERROR) {
    gpuipc__dom_fds_close(out->fds, out->nfds);
    out->nfds = 0;
    return gpuipc__err(out->msg.u.error.code, "%s: %s", what,
                       out->msg.u.error.text);
  }
  return 0;
}

uint64_t gpuipc__dom_conn_gen(gpuipc_domain_t *d)
{
  if (gpuipc__dom_stale(d))
    return 0;
  pthread_mutex_lock(&d->mu);
  uint64_t g = d->state == DOM_UP ? d->gen : 0;
  pthread_mutex_unlock(&d->mu);
  return g;
}

int gpuipc__dom_post_on(gpuipc_domain_t *d, uint64_t gen,
                        struct gpuipc__msg *m, const int *fds, int nfds)
{
  if (gpuipc__dom_stale(d))
    return gpuipc__dom_stale_err(d, "post");
  m->req = 0;
  pthread_mutex_lock(&d->send_mu);
  int rc = gen != 0 && d->fd_gen == gen
               ? gpuipc__proto_send(d->fd, m, fds, nfds, POST_MS)
               : gpuipc__err(GPUIPC_E_PEER_GONE, "domain %s: the connection "
                             "changed", d->name);
  pthread_mutex_unlock(&d->send_mu);
  return rc;
}

int gpuipc__dom_post(gpuipc_domain_t *d, struct gpuipc__msg *m,
                     const int *fds, int nfds)
{
  if (gpuipc__dom_stale(d))
    return gpuipc__dom_stale_err(d, "post");
  pthread_mutex_lock(&d->mu);
  bool up = d->state == DOM_UP;
  pthread_mutex_unlock(&d->mu);
  if (!up)
    return gpuipc__err(GPUIPC_E_PEER_GONE, "domain %s: no broker now",
                       d->name);
  m->req = 0;
  pthread_mutex_lock(&d->send_mu);
  int rc = gpuipc__proto_send(d->fd, m, fds, nfds, POST_MS);
  pthread_mutex_unlock(&d->send_mu);
  return rc;
}
