/*
 * A domain member: one connection to the broker and one reader thread that
 * hands replies to the threads waiting for them (by request id), applies
 * what the broker pushes, receives a broker hand-over, and reconnects --
 * electing a new broker if need be -- when the connection drops. What a
 * member holds (segments) listens through struct gpuipc__dom_listener;
 * this file calls no segment code. It is over 800 lines: the request
 * table, the reader thread and reconnection (with election) share the
 * domain's state lock and the reply table, and have not been split yet;
 * the hand-over's receiving half is in handoff.c already.
 */
#include "domain/domain.h"
#include "os/os.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Bound on one handshake attempt (a broker on its way out may not answer). */
#define HANDSHAKE_MS 2000
/* Bound on a fire-and-forget send. */
#define POST_MS 2000

/*
 * DOM_FAILED: a broker refused this member (DENIED, another protocol
 * version) on reconnecting; every request fails at once with that code.
 */
enum dom_state { DOM_DOWN, DOM_UP, DOM_FAILED, DOM_CLOSED };

/* A request whose caller gave up; its reply, if it comes, is undone. */
struct orphan {
  struct orphan *next;
  uint32_t req;
  uint16_t type;
};
/* Orphans remembered per connection; the oldest are forgotten beyond. */
#define ORPHANS_MAX 1024

struct pending {
  struct pending *next;
  uint32_t req;
  uint16_t type; /* of the request */
  int done; /* 0 waiting, 1 replied, < 0 failed with that code */
  struct gpuipc__reply *out;
};

struct gpuipc_domain {
  char name[GPUIPC__NAME_MAX + 1];
  struct gpuipc__dom_paths paths;
  unsigned flags;
  int timeout_ms;
  uint64_t token;

  pthread_mutex_t mu; /* state, gen, pending, broker, epoch */
  pthread_cond_t cv;
  enum dom_state state;
  int failed_code;                       /* DOM_FAILED: why */
  char failed_why[GPUIPC__TEXT_MAX + 1];
  uint64_t gen;
  uint32_t next_req;
  struct pending *pending;
  struct orphan *orphans; /* newest first */
  unsigned norphans;
  uint64_t epoch;
  uint32_t broker_pid;
  struct gpuipc__broker *broker; /* the broker this member hosts */
  _Atomic uint64_t max_id;
  atomic_bool leaving;
  /* Who keeps state per connection (segment.c), or NULL. */
  _Atomic(const struct gpuipc__dom_listener *) listener;

  pthread_mutex_t send_mu; /* fd, fd_gen, and sending on it */
  int fd;
  uint64_t fd_gen; /* the generation fd belongs to */

  pthread_t reader;
  bool reader_started;
  uint64_t fork_gen;                 /* gpuipc__fork_gen() when joined */
  struct gpuipc_domain *next_joined; /* joined (doms_mu) */
  int wake[2];

  struct gpuipc__handoff_in ho; /* being received (reader thread only) */
  uint8_t rbuf[GPUIPC_MSG_MAX];
  struct gpuipc__msg rmsg;
  struct gpuipc__reply reply; /* scratch for replies nobody waits for */
};

/* Every domain joined in this process, for fork(). */
static pthread_mutex_t doms_mu = PTHREAD_MUTEX_INITIALIZER;
static struct gpuipc_domain *doms;

void gpuipc__dom_fork_lock(void)
{
  pthread_mutex_lock(&doms_mu);
  for (struct gpuipc_domain *d = doms; d != NULL; d = d->next_joined)
    pthread_mutex_lock(&d->mu);
}

void gpuipc__dom_fork_unlock(void)
{
  for (struct gpuipc_domain *d = doms; d != NULL; d = d->next_joined)
    pthread_mutex_unlock(&d->mu);
  pthread_mutex_unlock(&doms_mu);
}

bool gpuipc__dom_stale(const gpuipc_domain_t *d)
{
  return d->fork_gen != gpuipc__fork_gen();
}

static void dom_list_remove(struct gpuipc_domain *d)
{
  pthread_mutex_lock(&doms_mu);
  for (struct gpuipc_domain **pp = &doms; *pp != NULL;
       pp = &(*pp)->next_joined)
    if (*pp == d) {
      *pp = d->next_joined;
      break;
    }
  pthread_mutex_unlock(&doms_mu);
}

static int stale_err(const gpuipc_domain_t *d, const char *what)
{
  return gpuipc__err(GPUIPC_E_CLOSED, "%s: domain %s was joined by the "
                     "parent of this process (before fork()); join it anew",
                     what, d->name);
}

/* Remove the channel sockets that killed channel ends left behind. */
static void prune_channels(const struct gpuipc_domain *d)
{
  int n = gpuipc__rundir_prune(d->paths.dir, GPUIPC__PRUNE_CHANNELS, NULL,
                               NULL);
  if (n > 0)
    GPUIPC_LOG_I("domain %s: removed %d stale channel socket%s from %s",
                 d->name, n, n == 1 ? "" : "s", d->paths.dir);
}

static void close_fds(int *fds, int n)
{
  for (int i = 0; i < n; i++)
    gpuipc__fd_close(&fds[i]);
}

static void sleep_ms(unsigned ms)
{
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

/* ------------------------------------------------------------------------ */
/* Joining: connect, or become the broker                                   */
/* ------------------------------------------------------------------------ */

static int handshake(struct gpuipc_domain *d, int fd, bool rejoin,
                     uint64_t deadline)
{
  struct gpuipc__msg *m = &d->rmsg;
  memset(&m->u.hello, 0, sizeof(m->u.hello));
  m->type = GPUIPC_MSG_HELLO;
  m->req = 1;
  m->u.hello.pid = (uint32_t)getpid();
  m->u.hello.flags = (rejoin ? GPUIPC__HELLO_REJOIN : 0) |
                     ((d->flags & GPUIPC_JOIN_NO_BROKER)
                          ? GPUIPC__HELLO_NO_BROKER : 0);
  m->u.hello.token = d->token;
  m->u.hello.epoch = d->epoch;
  m->u.hello.max_id = atomic_load(&d->max_id);
  /* A refused peer may find its connection closed already: read anyway,
   * the refusal waits in the socket. */
  (void)gpuipc__proto_send(fd, m, NULL, 0, HANDSHAKE_MS);
  int ms = gpuipc__ms_left(deadline);
  if (ms < 0 || ms > HANDSHAKE_MS)
    ms = HANDSHAKE_MS;
  int fds[GPUIPC_FDS_MAX];
  int nfds = GPUIPC_FDS_MAX;
  ssize_t len = gpuipc__sock_recv(fd, d->rbuf, sizeof(d->rbuf), fds, &nfds,
                                  ms);
  if (len == GPUIPC_E_PEER_GONE) {
    /*
     * A broker that closed its end with our HELLO unread (as brokers
     * before this version did when refusing) resets the connection: the
     * first read reports the reset (ECONNRESET), the next one the answer
     * queued before it -- or the end, at once, if there is none.
     */
    nfds = GPUIPC_FDS_MAX;
    len = gpuipc__sock_recv(fd, d->rbuf, sizeof(d->rbuf), fds, &nfds, 0);
  }
  if (len < 0)
    return (int)len;
  int rc = gpuipc__msg_decode(d->rbuf, (size_t)len, nfds, m);
  close_fds(fds, nfds);
  if (rc == GPUIPC_E_VERSION)
    return gpuipc__err(GPUIPC_E_VERSION,
                       "domain %s: the broker speaks protocol version %u, "
                       "this library version %d",
                       d->name, m->version, GPUIPC_PROTO_VERSION);
  if (rc != 0)
    return rc;
  switch (m->type) {
  case GPUIPC_MSG_WELCOME:
    pthread_mutex_lock(&d->mu);
    d->epoch = m->u.welcome.epoch;
    d->broker_pid = m->u.welcome.pid;
    pthread_mutex_unlock(&d->mu);
    return 0;
  case GPUIPC_MSG_DENIED:
    return gpuipc__err(GPUIPC_E_DENIED, "domain %s: the broker refused "
                       "this process: %s", d->name, m->u.denied.reason);
  case GPUIPC_MSG_ERROR:
    return gpuipc__err(m->u.error.code, "domain %s: %s", d->name,
                       m->u.error.text);
  }
  return gpuipc__err(GPUIPC_E_PROTO, "domain %s: broker answered HELLO "
                     "with %s", d->name, gpuipc__msg_name(m->type));
}

/* Claim the domain and start its broker in this process. */
static int become_broker(struct gpuipc_domain *d, bool rejoin)
{
  struct gpuipc__broker_init init;
  memset(&init, 0, sizeof(init));
  init.lock_fd = init.listen_fd = -1;
  bool stale;
  int rc = gpuipc__broker_claim(d->name, &init.lock_fd, &init.listen_fd,
                                &stale);
  if (rc != 0)
    return rc;
  snprintf(init.name, sizeof(init.name), "%s", d->name);
  pthread_mutex_lock(&d->mu);
  init.epoch = d->epoch;
  pthread_mutex_unlock(&d->mu);
  init.next_id = atomic_load(&d->max_id) + 1;
  init.owner_token = d->token;
  /*
   * A socket file left behind means the last broker died: its members
   * (this one, maybe) are about to re-publish what they hold.
   */
  init.recovery = (rejoin || stale) ? GPUIPC__RECOVER_CRASH
                                          : GPUIPC__RECOVER_NONE;
  struct gpuipc__broker *b;
  rc = gpuipc__broker_start(&init, &b);
  if (rc != 0)
    return rc;
  pthread_mutex_lock(&d->mu);
  struct gpuipc__broker *old = d->broker;
  d->broker = b;
  pthread_mutex_unlock(&d->mu);
  if (old != NULL) /* cannot happen: one lock, one broker; be safe */
    gpuipc__broker_stop(old);
  GPUIPC_LOG_I("domain %s: this process (pid %d) hosts the broker now",
               d->name, (int)getpid());
  return 0;
}

/*
 * Connect to the domain's broker, electing one if none listens, until
 * @deadline. The retries are what make elections and hand-overs safe: only
 * the holder of the lock file listens, and the kernel frees the lock of a
 * process that dies.
 */
static int dom_connect(struct gpuipc_domain *d, uint64_t deadline,
                       bool rejoin, int *out_fd)
{
  unsigned backoff = 1;
  for (;;) {
    if (atomic_load(&d->leaving))
      return gpuipc__err(GPUIPC_E_CLOSED, "domain %s: leaving", d->name);
    int fd = -1;
    int ms = gpuipc__ms_left(deadline);
    int rc = gpuipc__sock_connect(d->paths.sock,
                                  ms < 0 || ms > 1000 ? 1000 : ms, &fd);
    if (rc == 0) {
      rc = handshake(d, fd, rejoin, deadline);
      if (rc == 0) {
        *out_fd = fd;
        return 0;
      }
      gpuipc__fd_close(&fd);
      /* -EUSERS, -EMFILE: the broker is full; the caller (or the
       * reconnecting reader) decides whether to try again. */
      if (rc == GPUIPC_E_DENIED || rc == GPUIPC_E_VERSION ||
          rc == -EUSERS || rc == -EMFILE)
        return rc;
      /* Otherwise a broker on its way out: try again. */
    } else if (rc == -ENOENT || rc == -ECONNREFUSED) {
      if (!(d->flags & GPUIPC_JOIN_NO_BROKER)) {
        rc = become_broker(d, rejoin);
        if (rc == 0)
          continue; /* now connect to ourselves */
        /* The lock is held: someone else is becoming the broker. */
        if (rc != -EWOULDBLOCK)
          return rc;
      } else if (!rejoin) {
        return gpuipc__err(-ENOENT, "domain %s: no broker runs (nothing "
                           "listens at %s)", d->name, d->paths.sock);
      }
    } else if (rc != -EAGAIN && rc != -ETIMEDOUT && rc != -EINTR) {
      return rc;
    }
    if (gpuipc__now_ns() >= deadline)
      return gpuipc__err(-ETIMEDOUT, "domain %s: no broker answered in time",
                         d->name);
    uint32_t jitter;
    gpuipc__random(&jitter, sizeof(jitter));
    sleep_ms(backoff + jitter % (backoff + 1));
    if (backoff < 16)
      backoff *= 2;
  }
}

/* ------------------------------------------------------------------------ */
/* Requests                                                                 */
/* ------------------------------------------------------------------------ */

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

static void unlink_pending(struct gpuipc_domain *d, struct pending *p)
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

/* The type of orphaned request @req, forgotten now; 0 if unknown. */
static uint16_t take_orphan(struct gpuipc_domain *d, uint32_t req)
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

static void forget_orphans(struct gpuipc_domain *d)
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
    return stale_err(d, what);
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
    unlink_pending(d, &p);
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
    close_fds(out->fds, out->nfds);
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
    return stale_err(d, "post");
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
    return stale_err(d, "post");
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

/* ------------------------------------------------------------------------ */
/* The reader thread                                                        */
/* ------------------------------------------------------------------------ */

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
    unlink_pending(d, p);
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
  uint16_t type = take_orphan(d, d->rmsg.req);
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
  close_fds(d->reply.fds, d->reply.nfds);
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
  close_fds(fds, nfds);
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
  forget_orphans(d); /* that broker forgets what they did */
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
    int rc = dom_connect(d, UINT64_MAX, true, &fd);
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

static void *reader_main(void *arg)
{
  struct gpuipc_domain *d = arg;
  while (!atomic_load(&d->leaving)) {
    struct pollfd pfd[2] = {{.fd = d->fd, .events = POLLIN},
                            {.fd = d->wake[0], .events = POLLIN}};
    if (poll(pfd, 2, -1) < 0) {
      if (errno != EINTR)
        sleep_ms(1);
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
      close_fds(fds, nfds);
      GPUIPC_LOG_W("domain %s: malformed message from the broker (%s); "
                   "reconnecting", d->name, gpuipc_last_error());
      reconnect(d);
      continue;
    }
    if (d->rmsg.req != 0) {
      deliver(d, fds, nfds);
      close_fds(fds, nfds);
    } else {
      on_push(d, fds, nfds);
    }
  }
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Public                                                                   */
/* ------------------------------------------------------------------------ */

static void dom_free(struct gpuipc_domain *d)
{
  forget_orphans(d);
  gpuipc__fd_close(&d->wake[0]);
  gpuipc__fd_close(&d->wake[1]);
  gpuipc__fd_close(&d->fd);
  pthread_mutex_destroy(&d->mu);
  pthread_mutex_destroy(&d->send_mu);
  pthread_cond_destroy(&d->cv);
  free(d);
}

int gpuipc_domain_join(const char *name, const gpuipc_domain_opts_t *opts,
                       gpuipc_domain_t **out)
{
  if (out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_domain_join: out is NULL");
  int rc = gpuipc__name_check(name, "gpuipc_domain_join: domain name");
  if (rc != 0)
    return rc;
  /* The settings a member (and, after a failover, its broker) lives by. */
  static const gpuipc__cfg_t used[] = {GPUIPC_CFG_TIMEOUT_MS,
                                       GPUIPC_CFG_ALLOW_UIDS,
                                       GPUIPC_CFG_ALLOW_GIDS};
  for (size_t i = 0; i < GPUIPC__ARRAY_SIZE(used); i++)
    if ((rc = gpuipc__cfg_check(used[i])) != 0)
      return rc;
  unsigned flags = 0;
  int timeout = (int)gpuipc__cfg_long(GPUIPC_CFG_TIMEOUT_MS, 10000);
  if (opts != NULL) {
    gpuipc_domain_opts_t o = {.size = sizeof(o)};
    if ((rc = gpuipc__size_check(opts->size, "gpuipc_domain_join: opts")))
      return rc;
    gpuipc__opts_read(&o, sizeof(o), opts, opts->size);
    if (o.flags & ~GPUIPC_JOIN_NO_BROKER)
      return gpuipc__err(-EINVAL, "gpuipc_domain_join: unknown flags 0x%x",
                         o.flags & ~GPUIPC_JOIN_NO_BROKER);
    if (o.timeout_ms < GPUIPC_TIMEOUT_DEFAULT)
      return gpuipc__err(-EINVAL, "gpuipc_domain_join: timeout_ms %d (a "
                         "count of ms, GPUIPC_TIMEOUT_FOREVER or "
                         "GPUIPC_TIMEOUT_DEFAULT)", o.timeout_ms);
    flags = o.flags;
    /* 0 as GPUIPC_TIMEOUT_DEFAULT: a domain that never waits could
     * answer no request, and zeroed options must keep working. */
    if (o.timeout_ms != GPUIPC_TIMEOUT_DEFAULT && o.timeout_ms != 0)
      timeout = o.timeout_ms;
  }
  struct gpuipc_domain *d = calloc(1, sizeof(*d));
  if (d == NULL)
    return gpuipc__err(-ENOMEM, "gpuipc_domain_join: out of memory");
  d->fd = d->wake[0] = d->wake[1] = -1;
  d->ho.init.lock_fd = d->ho.init.listen_fd = -1;
  pthread_mutex_init(&d->mu, NULL);
  pthread_mutex_init(&d->send_mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&d->cv, &ca);
  pthread_condattr_destroy(&ca);
  snprintf(d->name, sizeof(d->name), "%s", name);
  d->flags = flags;
  d->timeout_ms = timeout;
  d->token = gpuipc__random_u64();
  d->gen = 1;

  rc = gpuipc__dom_paths(name, &d->paths); /* installs the fork handlers */
  if (rc != 0)
    goto free_d;
  if (!(flags & GPUIPC_JOIN_NO_BROKER)) /* a look (gpuipc ls) removes none */
    prune_channels(d);
  d->fork_gen = gpuipc__fork_gen();
  if (pipe2(d->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    rc = gpuipc__err_errno(errno, "gpuipc_domain_join: pipe2");
    goto free_d;
  }
  int fd = -1;
  rc = dom_connect(d, gpuipc__deadline(timeout), false, &fd);
  if (rc != 0)
    goto stop_broker;
  d->fd = fd;
  d->fd_gen = d->gen;
  d->state = DOM_UP;

  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  rc = pthread_create(&d->reader, NULL, reader_main, d);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    rc = gpuipc__err_errno(rc, "gpuipc_domain_join: pthread_create");
    goto stop_broker;
  }
  d->reader_started = true;
  pthread_mutex_lock(&doms_mu);
  d->next_joined = doms;
  doms = d;
  pthread_mutex_unlock(&doms_mu);
  GPUIPC_LOG_D("domain %s: joined (broker pid %u)", d->name, d->broker_pid);
  *out = d;
  return 0;

stop_broker:
  if (d->broker != NULL) {
    gpuipc__fd_close(&d->fd);
    gpuipc__broker_stop(d->broker);
  }
free_d:
  dom_free(d);
  return rc;
}

int gpuipc_domain_leave(gpuipc_domain_t *d)
{
  if (d == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_domain_leave: dom is NULL");
  const struct gpuipc__dom_listener *l = atomic_load(&d->listener);
  if (l != NULL && l->on_leave != NULL)
    l->on_leave(d);
  dom_list_remove(d);
  if (gpuipc__dom_stale(d)) {
    /*
     * The parent's: its threads are not here, and its connection and
     * broker descriptors were closed at fork() (their numbers may be
     * reused since). Free what is ours only.
     */
    gpuipc__fd_close(&d->wake[0]);
    gpuipc__fd_close(&d->wake[1]);
    forget_orphans(d);
    free(d);
    return 0;
  }
  atomic_store(&d->leaving, true);
  pthread_mutex_lock(&d->mu);
  d->state = DOM_CLOSED;
  for (struct pending *p = d->pending; p != NULL; p = p->next)
    p->done = GPUIPC_E_CLOSED;
  d->pending = NULL;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
  char c = 1;
  while (write(d->wake[1], &c, 1) < 0 && errno == EINTR)
    ;
  if (d->reader_started)
    pthread_join(d->reader, NULL);
  pthread_mutex_lock(&d->send_mu);
  gpuipc__fd_close(&d->fd);
  pthread_mutex_unlock(&d->send_mu);
  gpuipc__handoff_discard(&d->ho);
  if (d->broker != NULL)
    gpuipc__broker_stop(d->broker); /* hands the domain over */
  dom_free(d);
  return 0;
}

int gpuipc_domain_info(gpuipc_domain_t *d, gpuipc_domain_info_t *out)
{
  if (d == NULL || out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_domain_info: NULL argument");
  int rc = gpuipc__size_check(out->size, "gpuipc_domain_info: out");
  if (rc != 0)
    return rc;
  struct gpuipc__reply *r = malloc(sizeof(*r));
  if (r == NULL)
    return gpuipc__err(-ENOMEM, "gpuipc_domain_info: out of memory");
  struct gpuipc__msg *m = malloc(sizeof(*m));
  if (m == NULL) {
    free(r);
    return gpuipc__err(-ENOMEM, "gpuipc_domain_info: out of memory");
  }
  uint64_t deadline = gpuipc__deadline(d->timeout_ms);
  do { /* a broker that changed meanwhile: ask the next one */
    memset(&m->u.list, 0, sizeof(m->u.list));
    m->type = GPUIPC_MSG_LIST;
    m->u.list.max = 0;
    rc = gpuipc__dom_call(d, m, NULL, 0, gpuipc__ms_left(deadline),
                          "gpuipc_domain_info", r);
  } while (rc == GPUIPC_E_PEER_GONE && gpuipc__now_ns() < deadline);
  if (rc == 0 && r->msg.type != GPUIPC_MSG_LIST_REPLY)
    rc = gpuipc__err(GPUIPC_E_PROTO, "gpuipc_domain_info: broker answered "
                     "with %s", gpuipc__msg_name(r->msg.type));
  if (rc == 0) {
    gpuipc_domain_info_t i = {.size = sizeof(i)};
    snprintf(i.name, sizeof(i.name), "%s", d->name);
    i.broker_pid = (int)r->msg.u.list_reply.broker_pid;
    i.epoch = r->msg.u.list_reply.epoch;
    i.members = (int)r->msg.u.list_reply.members;
    i.segments = (int)r->msg.u.list_reply.segments;
    i.broker_fds = (int)r->msg.u.list_reply.fds;
    pthread_mutex_lock(&d->mu);
    i.hosts_broker = d->broker != NULL;
    pthread_mutex_unlock(&d->mu);
    gpuipc__out_write(out, out->size, &i, sizeof(i));
  }
  close_fds(r->fds, r->nfds);
  free(m);
  free(r);
  return rc;
}
