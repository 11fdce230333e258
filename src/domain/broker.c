/*
 * The broker: one thread (or `gpuipc serve`'s main thread) polling its
 * listener, its members and a wake-up pipe. It never blocks on a member:
 * replies that do not fit in a member's socket wait in a bounded outbox,
 * and a member that lets its outbox overflow is disconnected. A member whose
 * message fails to decode is disconnected; nobody else notices.
 */
#include "domain/domain.h"
#include "os/os.h"
#include "wire/wire.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

/* A member's outbox may hold this much before the member is dropped. */
#define OUTBOX_MAX_MSGS 4096
#define OUTBOX_MAX_BYTES (4u << 20)
/* Messages read from one member before looking at the others. */
#define READ_BURST 64
/* Bound on each blocking send of a hand-over, and on waiting for its ack. */
#define HANDOFF_SEND_MS 2000
#define HANDOFF_ACK_MS 5000
/* Bound on a candidate's answer to the offer to take the domain over. */
#define HANDOFF_OFFER_MS 1000
#define ALLOW_MAX 64
/* Requests one member may have waiting at once. */
#define PARKS_MAX 1024
/* Names one member may have reserved (CREATE_IT, not published) at once. */
#define RESERVED_MAX 1024
/*
 * Connections at once when GPUIPC_MAX_MEMBERS does not say; never more than
 * half of what the open-file limit leaves beyond NOFILE_MARGIN (the other
 * half is for the segments' descriptors). Beyond, new ones are refused.
 */
#define CONNS_MAX 4096
#define NOFILE_MARGIN 32
/* One warning of a kind this often at most (the others are counted). */
#define WARN_EVERY_NS (10ull * 1000000000ull)
/* How long the listener rests after accept failed for want of resources. */
#define ACCEPT_REST_MS 100
/* How long a new connection may take to say HELLO (or read a refusal). */
#define HELLO_MS 5000

struct out_msg {
  struct out_msg *next;
  size_t len;
  int nfds;
  int fds[2];
  uint8_t data[];
};

enum conn_state {
  CONN_NEW,     /* accepted, waiting for HELLO */
  CONN_READY,   /* a member */
  CONN_CLOSING, /* refused: answered; dropped once the member hangs up */
};

struct gpuipc__conn {
  struct gpuipc__conn *next;
  int fd;
  enum conn_state state;
  bool doomed; /* to be dropped at the end of this round */
  bool shut;   /* CONN_CLOSING: answer sent, our end shut for writing */
  bool counted; /* in its uid's count */
  struct gpuipc__cred cred;
  uint32_t hello_flags;
  uint64_t token;
  uint64_t seq; /* accept order */
  uint32_t nparks; /* its requests waiting */
  uint32_t nreserved; /* names it reserved, not published yet */
  uint64_t deadline;  /* CONN_NEW, CONN_CLOSING: dropped after this */
  struct out_msg *out_head, *out_tail;
  size_t out_msgs, out_bytes;
};

/* A request waiting for an event: a publication, a name, the clock. */
struct park {
  struct park *next;
  struct gpuipc__conn *conn;
  uint16_t type; /* OPEN or UNLINK */
  uint32_t req;
  char name[GPUIPC__NAME_MAX + 1];
  uint32_t flags;
  uint8_t kind;
  uint64_t size;
  uint64_t id; /* UNLINK: only while the name names this segment (0: any) */
  uint64_t deadline;
  bool recovery; /* parked only until the recovery window ends */
};

/* A warning said at most once every WARN_EVERY_NS. */
struct warn_gate {
  uint64_t next;   /* not before */
  uint64_t missed; /* not said since the last one */
};

/* Connections of one uid. */
struct uid_count {
  uint32_t uid, n;
};

struct gpuipc__broker {
  char name[GPUIPC__NAME_MAX + 1];
  struct gpuipc__dom_paths paths;
  int lock_fd, listen_fd;
  int wake[2];  /* written to stop the thread */
  int stop_fd;  /* the fd whose readability stops the loop */
  pthread_t thread;
  bool threaded;
  uint64_t epoch, next_id;
  uint64_t owner_token;
  uint64_t jlen, jrecs; /* the journal's length and record count */
  bool jfailed;         /* a journal write failed (said once) */
  struct gpuipc__registry reg;
  enum gpuipc__recovery recovery;
  uint64_t recovery_end; /* 0 once the window closed */
  bool rejoined;         /* a member of the last broker came back */
  struct gpuipc__conn *conns;
  size_t nconns;
  uint64_t conn_seq;
  /* Connection limits (conn_limits_init) and what they count. */
  size_t conns_max, conns_max_uid;
  unsigned long long nofile; /* the soft open-file limit at start */
  int spare_fd;              /* given up to answer a connection at EMFILE */
  uint64_t accept_rest;      /* listener not polled before (0: polled) */
  struct uid_count *uids;
  size_t nuids, capuids;
  struct warn_gate warn_refused, warn_accept;
  struct park *parks;
  pid_t pid;
  uid_t uid;
  uint32_t allow_uids[ALLOW_MAX], allow_gids[ALLOW_MAX];
  int nallow_uids, nallow_gids;
  struct pollfd *pfds;
  struct gpuipc__conn **pconns;
  size_t pcap;
  uint8_t rbuf[GPUIPC_MSG_MAX];
  struct gpuipc__msg in, out;
};

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

static uint64_t random_u64(void)
{
  uint64_t v = 0;
  while (v == 0) {
    gpuipc__random(&v, sizeof(v));
  }
  return v;
}

/* Ids start from the wall clock in microseconds, so a broker that starts
 * after a crash (with what survivors remember) continues above old ids. */
static uint64_t clock_id(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u + 1;
}

static void parse_list(const char *s, uint32_t *out, int *n)
{
  *n = 0;
  while (s != NULL && *s != '\0' && *n < ALLOW_MAX) {
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (end != s)
      out[(*n)++] = (uint32_t)v;
    s = end;
    while (*s != '\0' && (*s < '0' || *s > '9'))
      s++;
  }
}

static bool in_list(const uint32_t *l, int n, uint32_t v)
{
  for (int i = 0; i < n; i++)
    if (l[i] == v)
      return true;
  return false;
}

/* Whether a supplementary group of @pid is in the allow list. */
static bool groups_allowed(struct gpuipc__broker *b, pid_t pid)
{
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "re");
  if (f == NULL)
    return false;
  char line[1024];
  bool ok = false;
  while (fgets(line, sizeof(line), f) != NULL) {
    if (strncmp(line, "Groups:", 7) != 0)
      continue;
    uint32_t g[ALLOW_MAX];
    int n;
    parse_list(line + 7, g, &n);
    for (int i = 0; i < n && !ok; i++)
      ok = in_list(b->allow_gids, b->nallow_gids, g[i]);
    break;
  }
  fclose(f);
  return ok;
}

static bool peer_allowed(struct gpuipc__broker *b,
                         const struct gpuipc__cred *c)
{
  if (c->uid == b->uid)
    return true;
  if (in_list(b->allow_uids, b->nallow_uids, c->uid))
    return true;
  if (b->nallow_gids == 0)
    return false;
  if (in_list(b->allow_gids, b->nallow_gids, c->gid))
    return true;
  return groups_allowed(b, c->pid);
}

/* ------------------------------------------------------------------------ */
/* Sending                                                                  */
/* ------------------------------------------------------------------------ */

static bool would_block(int rc)
{
  return rc == -ETIMEDOUT || rc == -EAGAIN || rc == -EWOULDBLOCK;
}

static void outbox_free(struct gpuipc__conn *c)
{
  struct out_msg *o = c->out_head;
  while (o != NULL) {
    struct out_msg *next = o->next;
    for (int i = 0; i < o->nfds; i++)
      gpuipc__fd_close(&o->fds[i]);
    free(o);
    o = next;
  }
  c->out_head = c->out_tail = NULL;
  c->out_msgs = c->out_bytes = 0;
}

/* Send what waits in @c's outbox; stop when the socket is full. */
static void conn_flush(struct gpuipc__conn *c)
{
  while (c->out_head != NULL && !c->doomed) {
    struct out_msg *o = c->out_head;
    int rc = gpuipc__sock_send(c->fd, o->data, o->len, o->fds, o->nfds, 0);
    if (would_block(rc))
      return;
    if (rc != 0) {
      c->doomed = true;
      return;
    }
    c->out_head = o->next;
    if (c->out_head == NULL)
      c->out_tail = NULL;
    c->out_msgs--;
    c->out_bytes -= o->len;
    for (int i = 0; i < o->nfds; i++)
      gpuipc__fd_close(&o->fds[i]);
    free(o);
  }
}

/* Queue a copy of an encoded message (and dups of its fds). */
static void outbox_add(struct gpuipc__conn *c, const void *data, size_t len,
                       const int *fds, int nfds)
{
  if (c->out_msgs >= OUTBOX_MAX_MSGS || c->out_bytes + len > OUTBOX_MAX_BYTES) {
    GPUIPC_LOG_W("broker: member pid %d does not read its replies; "
                 "disconnecting it",
                 (int)c->cred.pid);
    c->doomed = true;
    return;
  }
  struct out_msg *o = malloc(sizeof(*o) + len);
  if (o == NULL) {
    c->doomed = true;
    return;
  }
  o->next = NULL;
  o->len = len;
  o->nfds = 0;
  for (int i = 0; i < nfds; i++) {
    if (gpuipc__fd_dup(fds[i], &o->fds[i]) != 0) {
      for (int j = 0; j < i; j++)
        gpuipc__fd_close(&o->fds[j]);
      free(o);
      c->doomed = true;
      return;
    }
    o->nfds++;
  }
  memcpy(o->data, data, len);
  if (c->out_tail != NULL)
    c->out_tail->next = o;
  else
    c->out_head = o;
  c->out_tail = o;
  c->out_msgs++;
  c->out_bytes += len;
}

/* Send @m to @c without blocking: directly, or through the outbox. */
static void conn_send(struct gpuipc__conn *c, const struct gpuipc__msg *m,
                      const int *fds, int nfds)
{
  if (c->doomed)
    return;
  uint8_t buf[GPUIPC__MSG_BUF];
  int len = gpuipc__msg_encode(m, buf, sizeof(buf));
  if (len < 0) { /* a bug in the broker: say so, drop the member */
    GPUIPC_LOG_E("broker: cannot encode %s: %s", gpuipc__msg_name(m->type),
                 gpuipc_last_error());
    c->doomed = true;
    return;
  }
  if (c->out_head == NULL) {
    int rc = gpuipc__sock_send(c->fd, buf, (size_t)len, fds, nfds, 0);
    if (rc == 0)
      return;
    if (!would_block(rc)) {
      c->doomed = true;
      return;
    }
  }
  outbox_add(c, buf, (size_t)len, fds, nfds);
}

static void send_error(struct gpuipc__broker *b, struct gpuipc__conn *c,
                       uint32_t req, int code, const char *fmt, ...)
    GPUIPC__PRINTF(5, 6);

static void send_error(struct gpuipc__broker *b, struct gpuipc__conn *c,
                       uint32_t req, int code, const char *fmt, ...)
{
  struct gpuipc__msg *m = &b->out;
  memset(&m->u.error, 0, sizeof(m->u.error));
  m->type = GPUIPC_MSG_ERROR;
  m->req = req;
  m->u.error.code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m->u.error.text, sizeof(m->u.error.text), fmt, ap);
  va_end(ap);
  conn_send(c, m, NULL, 0);
}

static void send_id(struct gpuipc__broker *b, struct gpuipc__conn *c,
                    uint16_t type, uint32_t req, uint64_t id)
{
  struct gpuipc__msg *m = &b->out;
  m->type = type;
  m->req = req;
  m->u.ok.id = id; /* ok, create_it and unlinked share the layout */
  conn_send(c, m, NULL, 0);
}

/* Send segment @s as a HANDLE reply (with its fd) and count the hold. */
static void grant(struct gpuipc__broker *b, struct gpuipc__conn *c,
                  uint32_t req, struct gpuipc__seg *s)
{
  if (gpuipc__reg_hold(s, c, (uint32_t)c->cred.pid, 1) != 0) {
    send_error(b, c, req, -ENOMEM, "broker out of memory");
    return;
  }
  struct gpuipc__msg *m = &b->out;
  m->type = GPUIPC_MSG_HANDLE;
  m->req = req;
  m->u.handle.seg = s->w;
  int nfds = s->fd >= 0 ? 1 : 0;
  conn_send(c, m, &s->fd, nfds);
}

/* ------------------------------------------------------------------------ */
/* The journal of names                                                     */
/* ------------------------------------------------------------------------ */

/*
 * The broker keeps, in the domain's lock file, a journal of the names it
 * publishes and removes: "P id size kind name" (published), "L id size kind
 * name" (lost), "F id size kind name" (being filled: after a crash the
 * name is free unless its creator re-publishes it), "U id" (the name
 * went). Every broker holds that file (its
 * descriptor is the lock, and moves with a hand-over), so a broker elected
 * after a crash reads which names the dead one had: those that no survivor
 * re-publishes are reported lost. A domain that ends cleanly empties it.
 */
#define JOURNAL_MAX (64u << 20)

static void journal_write(struct gpuipc__broker *b, const char *rec, int len)
{
  if (len <= 0)
    return;
  ssize_t n = pwrite(b->lock_fd, rec, (size_t)len, (off_t)b->jlen);
  if (n == len) {
    b->jlen += (uint64_t)len;
    b->jrecs++;
    return;
  }
  if (!b->jfailed)
    GPUIPC_LOG_W("broker %s: cannot write the name journal in %s: %s; "
                 "after a crash, lost segments may read as absent",
                 b->name, b->paths.lock, n < 0 ? strerror(errno) : "short");
  b->jfailed = true;
}

static void journal_rec(struct gpuipc__broker *b, const struct gpuipc__seg *s)
{
  char rec[128];
  int len = snprintf(rec, sizeof(rec), "%c %llu %llu %u %s\n",
                     s->w.state == GPUIPC__SEG_LOST      ? 'L'
                     : s->w.state == GPUIPC__SEG_FILLING ? 'F'
                                                         : 'P',
                     (unsigned long long)s->w.id,
                     (unsigned long long)s->w.size, s->w.kind, s->w.name);
  journal_write(b, rec, len);
}

/* Rewrite the journal from the registry. */
static void journal_compact(struct gpuipc__broker *b)
{
  if (ftruncate(b->lock_fd, 0) != 0 && !b->jfailed) {
    GPUIPC_LOG_W("broker %s: cannot truncate %s: %s", b->name, b->paths.lock,
                 strerror(errno));
    b->jfailed = true;
  }
  b->jlen = b->jrecs = 0;
  for (struct gpuipc__seg *s = b->reg.head; s != NULL; s = s->next)
    if (s->named && (s->w.state == GPUIPC__SEG_PUBLISHED ||
                     s->w.state == GPUIPC__SEG_FILLING ||
                     s->w.state == GPUIPC__SEG_LOST))
      journal_rec(b, s);
}

static void journal_maybe_compact(struct gpuipc__broker *b)
{
  if (b->jrecs > 2 * b->reg.named + 1024)
    journal_compact(b);
}

/* @s is published (or being filled, or lost) under its name. */
static void journal_put(struct gpuipc__broker *b, const struct gpuipc__seg *s)
{
  if (!s->named)
    return;
  journal_rec(b, s);
  journal_maybe_compact(b);
}

/* Segment @id no longer has a name. */
static void journal_drop(struct gpuipc__broker *b, uint64_t id)
{
  char rec[32];
  int len = snprintf(rec, sizeof(rec), "U %llu\n", (unsigned long long)id);
  journal_write(b, rec, len);
  journal_maybe_compact(b);
}

static void learn_id(struct gpuipc__broker *b, uint64_t id)
{
  if (id <= GPUIPC__ID_MAX && id >= b->next_id)
    b->next_id = id + 1;
}

/* A new segment id: never 0, never above GPUIPC__ID_MAX, never in use. */
static uint64_t take_id(struct gpuipc__broker *b)
{
  for (;;) {
    if (b->next_id == 0 || b->next_id > GPUIPC__ID_MAX)
      b->next_id = 1;
    uint64_t id = b->next_id++;
    if (gpuipc__reg_by_id(&b->reg, id) == NULL)
      return id;
  }
}

/* Apply one journal line to the registry (of tombstones). */
static void journal_apply(struct gpuipc__broker *b, char *line)
{
  char op;
  unsigned long long id, size = 0;
  unsigned kind = 0;
  char name[GPUIPC__NAME_MAX + 2];
  struct gpuipc__seg *s;
  if (sscanf(line, "%c %llu", &op, &id) != 2 || id == 0)
    return;
  if (op == 'U') {
    s = gpuipc__reg_by_id(&b->reg, id);
    if (s != NULL)
      gpuipc__reg_remove(&b->reg, s);
    return;
  }
  if (id > GPUIPC__ID_MAX || (op != 'P' && op != 'L' && op != 'F') ||
      sscanf(line, "%c %llu %llu %u %64s", &op, &id, &size, &kind, name) != 5 ||
      size == 0 || size > GPUIPC_SIZE_MAX_ABSURD || kind < GPUIPC_KIND_HOST ||
      kind > GPUIPC_KIND_POOL || gpuipc__name_check(name, "journal name") != 0)
    return;
  if ((s = gpuipc__reg_by_id(&b->reg, id)) != NULL)
    gpuipc__reg_remove(&b->reg, s);
  if ((s = gpuipc__reg_by_name(&b->reg, name)) != NULL)
    gpuipc__reg_remove(&b->reg, s);
  learn_id(b, id);
  if (op == 'F')
    return; /* never published: nothing of it is lost */
  if (gpuipc__reg_add(&b->reg, name, id, &s) != 0)
    return;
  s->w.state = GPUIPC__SEG_LOST;
  s->w.size = size;
  s->w.kind = (uint8_t)kind;
}

/* After a crash: every name the dead broker had is lost until re-published. */
static void journal_load(struct gpuipc__broker *b)
{
  struct stat st;
  if (fstat(b->lock_fd, &st) != 0 || st.st_size <= 0)
    return;
  size_t len = (size_t)st.st_size < JOURNAL_MAX ? (size_t)st.st_size
                                                : JOURNAL_MAX;
  char *buf = malloc(len + 1);
  if (buf == NULL)
    return;
  ssize_t n = pread(b->lock_fd, buf, len, 0);
  if (n > 0) {
    buf[n] = '\0';
    char *line = buf;
    for (char *nl; (nl = strchr(line, '\n')) != NULL; line = nl + 1) {
      *nl = '\0'; /* a torn last line (no newline) is ignored */
      journal_apply(b, line);
    }
  }
  free(buf);
  GPUIPC_LOG_I("broker %s: the journal names %zu segments of the last broker",
               b->name, b->reg.count);
}

/* ------------------------------------------------------------------------ */
/* Segment life                                                             */
/* ------------------------------------------------------------------------ */

static bool recovering(const struct gpuipc__broker *b)
{
  return b->recovery_end != 0;
}

static bool creator_held(const struct gpuipc__seg *s)
{
  return (s->w.flags & GPUIPC__SEGF_CREATOR_HELD) != 0;
}

/* Published @s has no memory any more: its name reads as lost. */
static void lose(struct gpuipc__broker *b, struct gpuipc__seg *s,
                 const char *why)
{
  GPUIPC_LOG_I("broker %s: segment %s (id %llu) %s: lost", b->name,
               s->w.name, (unsigned long long)s->w.id, why);
  s->w.state = GPUIPC__SEG_LOST;
  s->w.has_handle = false;
  s->w.htype = 0;
  gpuipc__reg_set_fd(&b->reg, s, -1);
  journal_put(b, s);
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
static void redispatch(struct gpuipc__broker *b, const char *name);

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
  journal_drop(b, s->w.id);
  gpuipc__reg_remove(&b->reg, s);
  redispatch(b, name);
}

static void maybe_free(struct gpuipc__broker *b, struct gpuipc__seg *s)
{
  if (s->nholders != 0 || recovering(b))
    return;
  if (s->w.state == GPUIPC__SEG_FILLING) {
    unfill(b, s);
  } else if (s->w.state == GPUIPC__SEG_UNLINKED) {
    if (s->keeper != NULL) {
      GPUIPC_LOG_D("broker %s: segment %s (id %llu): pid %u may free it",
                   b->name, s->w.name, (unsigned long long)s->w.id,
                   (unsigned)s->keeper->cred.pid);
      send_id(b, s->keeper, GPUIPC_MSG_LET_GO, 0, s->w.id);
    }
    GPUIPC_LOG_D("broker %s: segment %s (id %llu) freed", b->name, s->w.name,
                 (unsigned long long)s->w.id);
    gpuipc__reg_remove(&b->reg, s);
  } else if (s->w.state == GPUIPC__SEG_PUBLISHED && s->keeper == NULL &&
             (s->fd < 0 || creator_held(s))) {
    lose(b, s, "has no holder and nothing keeps its memory");
  }
}

/*
 * The creator that kept @s's memory let go of it or left: the memory goes
 * with that process, so a published @s is lost at once (its holders learn
 * it from gpuipc_buf_alive or their next import); an unlinked one goes
 * with its last holder. May free @s.
 */
static void keeper_gone(struct gpuipc__broker *b, struct gpuipc__seg *s)
{
  s->keeper = NULL;
  if (recovering(b))
    return; /* end_recovery decides */
  if (s->w.state == GPUIPC__SEG_PUBLISHED)
    lose(b, s, "went with its creator, which kept its memory");
  else
    maybe_free(b, s);
}

static void dispatch_open(struct gpuipc__broker *b, struct gpuipc__conn *c,
                          const struct park *p);

static int park(struct gpuipc__broker *b, struct gpuipc__conn *c,
                const struct park *p, bool for_recovery)
{
  if (c->nparks >= PARKS_MAX) {
    send_error(b, c, p->req, -EAGAIN,
               "pid %d has %d requests waiting already", (int)c->cred.pid,
               PARKS_MAX);
    return -EAGAIN;
  }
  struct park *n = malloc(sizeof(*n));
  if (n == NULL) {
    send_error(b, c, p->req, -ENOMEM, "broker out of memory");
    return -ENOMEM;
  }
  *n = *p;
  n->conn = c;
  n->recovery = for_recovery;
  n->next = NULL;
  c->nparks++;
  struct park **pp = &b->parks;
  while (*pp != NULL)
    pp = &(*pp)->next;
  *pp = n;
  return 0;
}

static void park_free(struct park *p)
{
  p->conn->nparks--;
  free(p);
}

static void reserve(struct gpuipc__broker *b, struct gpuipc__conn *c,
                    const struct park *p)
{
  struct gpuipc__seg *s;
  if (c->nreserved >= RESERVED_MAX) {
    send_error(b, c, p->req, -EAGAIN,
               "pid %d has %d names reserved and not published already",
               (int)c->cred.pid, RESERVED_MAX);
    return;
  }
  if (gpuipc__reg_add(&b->reg, p->name, take_id(b), &s) != 0) {
    send_error(b, c, p->req, -ENOMEM, "broker out of memory");
    return;
  }
  c->nreserved++;
  s->w.state = GPUIPC__SEG_CREATING;
  s->w.size = p->size;
  s->w.kind = p->kind != GPUIPC_KIND_AUTO ? p->kind : GPUIPC_KIND_HOST;
  s->creator = c;
  s->creator_pid = (uint32_t)c->cred.pid;
  send_id(b, c, GPUIPC_MSG_CREATE_IT, p->req, s->w.id);
}

static void dispatch_open(struct gpuipc__broker *b, struct gpuipc__conn *c,
                          const struct park *p)
{
  bool create = p->flags & GPUIPC_CREATE;
  bool excl = p->flags & GPUIPC_EXCL;
  bool wait = p->flags & GPUIPC_WAIT;
  struct gpuipc__seg *s = gpuipc__reg_by_name(&b->reg, p->name);

  if (recovering(b) && b->recovery == GPUIPC__RECOVER_CRASH &&
      (s == NULL || s->w.state != GPUIPC__SEG_PUBLISHED)) {
    park(b, c, p, true); /* a survivor may still re-publish it */
    return;
  }
  if (s != NULL && s->w.state == GPUIPC__SEG_PUBLISHED) {
    if (create && excl) {
      send_error(b, c, p->req, -EEXIST, "segment %s exists (id %llu)",
                 p->name, (unsigned long long)s->w.id);
      return;
    }
    if (p->size != 0 && p->size != s->w.size) {
      send_error(b, c, p->req, GPUIPC_E_MISMATCH,
                 "segment %s has %llu bytes, the caller asked for %llu",
                 p->name, (unsigned long long)s->w.size,
                 (unsigned long long)p->size);
      return;
    }
    if (p->kind != GPUIPC_KIND_AUTO && p->kind != s->w.kind) {
      send_error(b, c, p->req, GPUIPC_E_MISMATCH,
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
      send_error(b, c, p->req, -EEXIST,
                 "segment %s is being created by pid %u", p->name,
                 s->creator_pid);
      return;
    }
    if (create || wait) {
      park(b, c, p, false);
      return;
    }
    send_error(b, c, p->req, -ENOENT,
               "segment %s is being created by pid %u and not published yet",
               p->name, s->creator_pid);
    return;
  }
  if (s != NULL && s->w.state == GPUIPC__SEG_LOST) {
    if (create) {
      journal_drop(b, s->w.id);
      gpuipc__reg_remove(&b->reg, s);
      reserve(b, c, p);
      return;
    }
    send_error(b, c, p->req, GPUIPC_E_LOST,
               "segment %s (id %llu) of domain %s was lost: no surviving "
               "process held its memory",
               p->name, (unsigned long long)s->w.id, b->name);
    return;
  }
  /* The name is free. */
  if (create) {
    if (p->size == 0) {
      send_error(b, c, p->req, -EINVAL,
                 "creating segment %s needs a size above 0", p->name);
      return;
    }
    reserve(b, c, p);
    return;
  }
  if (wait) {
    park(b, c, p, false);
    return;
  }
  send_error(b, c, p->req, -ENOENT, "no segment %s in domain %s", p->name,
             b->name);
}

static void dispatch_unlink(struct gpuipc__broker *b, struct gpuipc__conn *c,
                            const struct park *p)
{
  struct gpuipc__seg *s = gpuipc__reg_by_name(&b->reg, p->name);
  if (recovering(b) && b->recovery == GPUIPC__RECOVER_CRASH &&
      (s == NULL || s->w.state != GPUIPC__SEG_PUBLISHED)) {
    park(b, c, p, true);
    return;
  }
  if (s == NULL) {
    send_error(b, c, p->req, -ENOENT, "no segment %s in domain %s", p->name,
               b->name);
    return;
  }
  if (p->id != 0 && s->w.id != p->id) {
    send_error(b, c, p->req, -ENOENT, "segment %s is segment %llu now, not "
               "%llu", p->name, (unsigned long long)s->w.id,
               (unsigned long long)p->id);
    return;
  }
  if (s->w.state == GPUIPC__SEG_CREATING ||
      s->w.state == GPUIPC__SEG_FILLING) {
    send_error(b, c, p->req, -ENOENT,
               "segment %s is being created by pid %u and not published yet",
               p->name, s->creator_pid);
    return;
  }
  uint64_t id = s->w.id;
  journal_drop(b, id);
  if (s->w.state == GPUIPC__SEG_LOST) {
    gpuipc__reg_remove(&b->reg, s);
  } else {
    gpuipc__reg_unname(&b->reg, s);
    s->w.state = GPUIPC__SEG_UNLINKED;
    /* Holders keep it alive; tell them, so that after a crash they
     * re-publish it as unlinked rather than resurrect the name. */
    for (uint32_t i = 0; i < s->nholders; i++)
      send_id(b, s->holders[i].conn, GPUIPC_MSG_UNLINKED, 0, id);
    maybe_free(b, s);
  }
  send_id(b, c, GPUIPC_MSG_OK, p->req, id);
}

static void dispatch(struct gpuipc__broker *b, struct gpuipc__conn *c,
                     const struct park *p)
{
  if (p->type == GPUIPC_MSG_OPEN)
    dispatch_open(b, c, p);
  else
    dispatch_unlink(b, c, p);
}

/* Re-run every request parked on @name, in arrival order. */
static void redispatch(struct gpuipc__broker *b, const char *name)
{
  struct park *mine = NULL, **tail = &mine;
  struct park **pp = &b->parks;
  while (*pp != NULL) {
    struct park *p = *pp;
    if (!p->recovery && strcmp(p->name, name) == 0) {
      *pp = p->next;
      p->next = NULL;
      *tail = p;
      tail = &p->next;
    } else {
      pp = &p->next;
    }
  }
  while (mine != NULL) {
    struct park *p = mine;
    mine = p->next;
    p->conn->nparks--; /* before dispatch may park it again */
    if (!p->conn->doomed) {
      uint64_t now = gpuipc__now_ns();
      if (p->deadline != UINT64_MAX && now >= p->deadline)
        send_error(b, p->conn, p->req, -ETIMEDOUT,
                   "segment %s: not published in time", p->name);
      else
        dispatch(b, p->conn, p);
    }
    free(p);
  }
}

/* ------------------------------------------------------------------------ */
/* Messages                                                                 */
/* ------------------------------------------------------------------------ */

static void on_open(struct gpuipc__broker *b, struct gpuipc__conn *c,
                    const struct gpuipc__msg *m)
{
  struct park p = {0};
  p.type = GPUIPC_MSG_OPEN;
  p.req = m->req;
  snprintf(p.name, sizeof(p.name), "%s", m->u.open.name);
  p.flags = m->u.open.flags;
  p.kind = m->u.open.kind;
  p.size = m->u.open.size;
  p.deadline = m->u.open.timeout_ms == GPUIPC__WAIT_FOREVER
                   ? UINT64_MAX
                   : gpuipc__now_ns() + (uint64_t)m->u.open.timeout_ms * 1000000u;
  if ((p.flags & GPUIPC_EXCL) && !(p.flags & GPUIPC_CREATE)) {
    send_error(b, c, m->req, -EINVAL, "GPUIPC_EXCL needs GPUIPC_CREATE");
    return;
  }
  dispatch_open(b, c, &p);
}

static void on_unlink(struct gpuipc__broker *b, struct gpuipc__conn *c,
                      const struct gpuipc__msg *m)
{
  struct park p = {0};
  p.type = GPUIPC_MSG_UNLINK;
  p.req = m->req;
  snprintf(p.name, sizeof(p.name), "%s", m->u.unlink.name);
  p.id = m->u.unlink.id;
  p.deadline = UINT64_MAX;
  dispatch_unlink(b, c, &p);
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
  uint64_t id = s->w.id;
  bool named = s->named;
  char name[sizeof(s->w.name)];
  memcpy(name, s->w.name, sizeof(name));
  s->w = *w;
  s->w.id = id;
  memcpy(s->w.name, name, sizeof(name));
  s->w.state = !named                                ? GPUIPC__SEG_UNLINKED
                : w->state == GPUIPC__SEG_FILLING ? GPUIPC__SEG_FILLING
                                                  : GPUIPC__SEG_PUBLISHED;
  if (s->creator != NULL)
    s->creator->nreserved--;
  s->creator = NULL;
  s->creator_pid = pid;
  gpuipc__reg_set_fd(&b->reg, s, *fd);
  *fd = -1;
}

/* ------------------------------------------------------------------------ */
/* What a member may publish                                                */
/* ------------------------------------------------------------------------ */

/*
 * The NVIDIA driver's device number: the descriptor a VMM or pool handle
 * travels with is one of /dev/nvidiactl (the driver imports from nothing
 * else). What it exports cannot be checked without CUDA; the broker never
 * touches CUDA.
 */
#define NV_MAJOR_DEVICE 195

/*
 * Whether descriptor @fd can be what @w's handle says: a HOST memfd sealed
 * as gpuipc seals its own, of the size its importers will insist on; for
 * VMM and POOL, a descriptor of the NVIDIA driver. Else GPUIPC_E_BADHANDLE
 * with a sentence: stored, it would only fail every opener.
 */
static int check_seg_fd(const struct gpuipc__seg_wire *w, int fd)
{
  if (fd < 0)
    return 0; /* decoding made sure the handle travels without one */
  gpuipc_handle_t h;
  int rc = gpuipc_handle_unpack(w->handle, sizeof(w->handle), &h);
  if (rc != 0)
    return rc;
  if (w->kind == GPUIPC_KIND_HOST) {
    size_t actual;
    rc = gpuipc__memfd_check(fd, h.alloc_size, &actual);
    if (rc != 0)
      return rc;
    int seals = fcntl(fd, F_GET_SEALS);
    if ((seals & GPUIPC__MEMFD_SEALS) != GPUIPC__MEMFD_SEALS)
      return gpuipc__err(GPUIPC_E_BADHANDLE, "its memfd has seals 0x%x, "
                         "not the 0x%x gpuipc seals its memory with", seals,
                         GPUIPC__MEMFD_SEALS);
    if (actual != h.alloc_size)
      return gpuipc__err(GPUIPC_E_BADHANDLE, "its memfd holds %zu bytes, "
                         "its handle says %llu", actual,
                         (unsigned long long)h.alloc_size);
    return 0;
  }
  struct stat st;
  if (fstat(fd, &st) != 0)
    return gpuipc__err_errno(errno, "fstat of its descriptor");
  if (!S_ISCHR(st.st_mode) || major(st.st_rdev) != NV_MAJOR_DEVICE)
    return gpuipc__err(GPUIPC_E_BADHANDLE, "a %s handle travels with a "
                       "descriptor of the NVIDIA driver (device major %d), "
                       "not this one (mode 0%o, device %u:%u)",
                       gpuipc_kind_name((gpuipc_kind_t)w->kind),
                       NV_MAJOR_DEVICE, (unsigned)(st.st_mode & S_IFMT),
                       major(st.st_rdev), minor(st.st_rdev));
  return 0;
}

/* Whether process @pid lives in pid namespace @ns, as pid @nspid there. */
static bool pid_in_ns(pid_t pid, uint64_t ns, uint32_t nspid)
{
  char path[64];
  struct stat st;
  snprintf(path, sizeof(path), "/proc/%d/ns/pid", (int)pid);
  if (stat(path, &st) != 0 || (uint64_t)st.st_ino != ns)
    return false;
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "re");
  if (f == NULL)
    return false;
  char line[256];
  long last = -1;
  while (fgets(line, sizeof(line), f) != NULL) {
    if (strncmp(line, "NSpid:", 6) != 0)
      continue;
    for (char *p = line + 6, *end; ; p = end) {
      long v = strtol(p, &end, 10);
      if (end == p)
        break;
      last = v; /* the innermost namespace's comes last */
    }
    break;
  }
  fclose(f);
  return last >= 0 && (uint32_t)last == nspid;
}

/*
 * Whether @c's process exported the handle in @w: the process whose memory
 * a creator-held segment is, the only one that may keep it.
 */
static bool is_exporter(const struct gpuipc__conn *c,
                        const struct gpuipc__seg_wire *w)
{
  gpuipc_handle_t h;
  if (!w->has_handle ||
      gpuipc_handle_unpack(w->handle, sizeof(w->handle), &h) != 0)
    return false;
  const struct gpuipc__proc_id *me = gpuipc__proc_self();
  if (memcmp(h.boot_id, me->boot_id, sizeof(h.boot_id)) != 0)
    return false;
  if (h.pidns == me->pidns)
    return h.pid == (uint32_t)c->cred.pid;
  return pid_in_ns(c->cred.pid, h.pidns, h.pid);
}

/* The exporter's pid as a handle record names it (for sentences). */
static uint32_t exporter_pid(const struct gpuipc__seg_wire *w)
{
  gpuipc_handle_t h;
  if (gpuipc_handle_unpack(w->handle, sizeof(w->handle), &h) != 0)
    return 0;
  return h.pid;
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
  send_error(b, c, m->req, code, "segment %s: publication refused: %s",
             w->name, why);
  struct gpuipc__seg *s = gpuipc__reg_by_name(&b->reg, w->name);
  if (s == NULL || s->w.state != GPUIPC__SEG_CREATING || s->creator != c ||
      s->w.id != w->id)
    return;
  char name[GPUIPC__NAME_MAX + 1];
  snprintf(name, sizeof(name), "%s", s->w.name);
  c->nreserved--;
  gpuipc__reg_remove(&b->reg, s);
  redispatch(b, name);
}

/* 0, or the code refuse_publish gives (with the reason in @why). */
static int publish_check(const struct gpuipc__conn *c,
                         const struct gpuipc__seg_wire *w, int fd, char *why,
                         size_t cap)
{
  int rc = check_seg_fd(w, fd);
  if (rc != 0) {
    snprintf(why, cap, "%s", gpuipc_last_error());
    return rc;
  }
  if ((w->flags & GPUIPC__SEGF_CREATOR_HELD) && !is_exporter(c, w)) {
    snprintf(why, cap, "its memory is held by the process that exported "
             "it (pid %u), not by pid %d", exporter_pid(w), (int)c->cred.pid);
    return GPUIPC_E_DENIED;
  }
  return 0;
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
  int rc = publish_check(c, w, *fd, why, sizeof(why));
  if (rc != 0) {
    refuse_publish(b, c, m, rc, why);
    return;
  }
  struct gpuipc__seg *s = gpuipc__reg_by_name(&b->reg, w->name);
  if (s != NULL && s->w.state == GPUIPC__SEG_CREATING) {
    if (s->creator != c || s->w.id != w->id) {
      send_error(b, c, m->req, -EEXIST,
                 "segment %s is being created by pid %u", w->name,
                 s->creator_pid);
      return;
    }
    if (s->w.size != w->size) {
      send_error(b, c, m->req, GPUIPC_E_MISMATCH,
                 "segment %s was reserved with %llu bytes, published with "
                 "%llu", w->name, (unsigned long long)s->w.size,
                 (unsigned long long)w->size);
      return;
    }
  } else if (s != NULL && s->w.state == GPUIPC__SEG_PUBLISHED) {
    /* A creator repeating a publication the last broker accepted. */
    if (memcmp(s->w.handle, w->handle, sizeof(w->handle)) != 0) {
      send_error(b, c, m->req, -EEXIST,
                 "segment %s was created by pid %u meanwhile", w->name,
                 s->creator_pid);
      return;
    }
    if (!is_exporter(c, w)) { /* then it is not its creator either */
      send_error(b, c, m->req, GPUIPC_E_DENIED,
                 "segment %s (id %llu) is published already, by pid %u; "
                 "pid %u may not publish it again", w->name,
                 (unsigned long long)s->w.id, exporter_pid(w), pid);
      return;
    }
    if (gpuipc__reg_hold(s, c, pid, 1) != 0) {
      send_error(b, c, m->req, -ENOMEM, "broker out of memory");
      return;
    }
    if (creator_held(s))
      s->keeper = c;
    send_id(b, c, GPUIPC_MSG_OK, m->req, s->w.id);
    return;
  } else if (s != NULL && s->w.state == GPUIPC__SEG_FILLING) {
    send_error(b, c, m->req, -EEXIST, "segment %s is being filled by pid %u",
               w->name, s->creator_pid);
    return;
  } else {
    /* No reservation (the broker changed since CREATE_IT): take it anew. */
    if (s != NULL) { /* LOST */
      journal_drop(b, s->w.id);
      gpuipc__reg_remove(&b->reg, s);
    }
    if (gpuipc__reg_add(&b->reg, w->name, take_id(b), &s) != 0) {
      send_error(b, c, m->req, -ENOMEM, "broker out of memory");
      return;
    }
  }
  publish_into(b, s, w, fd, pid);
  journal_put(b, s);
  if (s->w.state == GPUIPC__SEG_FILLING)
    fill_by(s, c);
  else if (creator_held(s))
    s->keeper = c;
  if (gpuipc__reg_hold(s, c, pid, 1) != 0) {
    send_error(b, c, m->req, -ENOMEM, "broker out of memory");
    return;
  }
  GPUIPC_LOG_D("broker %s: pid %u %s %s (id %llu, %llu bytes)", b->name,
               pid, s->w.state == GPUIPC__SEG_FILLING ? "fills" : "published",
               s->w.name, (unsigned long long)s->w.id,
               (unsigned long long)s->w.size);
  send_id(b, c, GPUIPC_MSG_OK, m->req, s->w.id);
  if (s->w.state != GPUIPC__SEG_FILLING)
    redispatch(b, s->w.name);
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
    send_error(b, c, m->req, -ENOENT, "no segment id %llu being filled in "
               "domain %s", (unsigned long long)id, b->name);
    return;
  }
  if (s->w.state == GPUIPC__SEG_PUBLISHED) {
    /* Published by this process already (a repeat after a failover that
     * the last broker answered), or someone else's. */
    send_error(b, c, m->req, s->creator_pid == pid ? -EALREADY : -EINVAL,
               "segment %s (id %llu) was published by pid %u already",
               s->w.name, (unsigned long long)id, s->creator_pid);
    return;
  }
  if (s->creator != c) {
    send_error(b, c, m->req, -EINVAL, "segment %s (id %llu) is filled by "
               "pid %u, not by pid %u", s->w.name, (unsigned long long)id,
               s->creator_pid, pid);
    return;
  }
  s->w.state = GPUIPC__SEG_PUBLISHED;
  s->w.has_event = m->u.ready.has_event;
  memcpy(s->w.event, m->u.ready.event, sizeof(s->w.event));
  c->nreserved--;
  s->creator = NULL;
  if (creator_held(s))
    s->keeper = c;
  journal_put(b, s);
  GPUIPC_LOG_D("broker %s: pid %u published %s (id %llu)%s", b->name, pid,
               s->w.name, (unsigned long long)id,
               s->w.has_event ? ", ordered by an event" : "");
  send_id(b, c, GPUIPC_MSG_OK, m->req, id);
  redispatch(b, s->w.name);
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
  redispatch(b, name);
}

static void on_release(struct gpuipc__broker *b, struct gpuipc__conn *c,
                       const struct gpuipc__msg *m)
{
  struct gpuipc__seg *s = gpuipc__reg_by_id(&b->reg, m->u.release.id);
  if (s == NULL)
    return;
  gpuipc__reg_drop(s, c, m->u.release.count);
  maybe_free(b, s);
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
    send_id(b, c, GPUIPC_MSG_OK, m->req, id);
    return;
  }
  char name[GPUIPC__NAME_MAX + 1];
  snprintf(name, sizeof(name), "%s", s->w.name);
  uint32_t others = s->nholders - (gpuipc__reg_refs(s, c) != 0 ? 1u : 0u);
  if (s->keeper == c)
    keeper_gone(b, s); /* may free s */
  if (recovering(b))
    send_error(b, c, m->req, -EBUSY, "segment %s (id %llu): the broker of "
               "domain %s is recovering from a failover and may not know "
               "every holder yet", name, (unsigned long long)id, b->name);
  else if (others != 0)
    send_error(b, c, m->req, -EBUSY, "segment %s (id %llu) is still held "
               "by %u other process%s", name, (unsigned long long)id, others,
               others == 1 ? "" : "es");
  else
    send_id(b, c, GPUIPC_MSG_OK, m->req, id);
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
      send_error(b, c, m->req, -ENOENT, "no segment %s in domain %s",
                 m->u.list.name, b->name);
      return;
    }
    fill_list_rec(&o->u.list_reply.recs[0], s);
    o->u.list_reply.count = 1;
    conn_send(c, o, NULL, 0);
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
  conn_send(c, o, NULL, 0);
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
    redispatch(b, s->w.name);
  else if (holds == 0)
    maybe_free(b, s); /* kept by its creator alone */
}

/*
 * A re-publication brings what its sender holds: a descriptor that can be
 * the memory, and the keeper's part only from the process whose memory it
 * is. Anything else disconnects the sender (REPUBLISH has no reply).
 */
static bool republish_allowed(struct gpuipc__broker *b,
                              struct gpuipc__conn *c,
                              const struct gpuipc__seg_wire *w, int fd,
                              bool keeper)
{
  char why[GPUIPC__TEXT_MAX + 1];
  if (check_seg_fd(w, fd) != 0)
    snprintf(why, sizeof(why), "%s", gpuipc_last_error());
  else if (keeper && !is_exporter(c, w))
    snprintf(why, sizeof(why), "it claims to keep memory that pid %u "
             "exported", exporter_pid(w));
  else
    return true;
  GPUIPC_LOG_W("broker %s: pid %d re-published segment %s (id %llu): %s; "
               "disconnecting it", b->name, (int)c->cred.pid, w->name,
               (unsigned long long)w->id, why);
  c->doomed = true;
  return false;
}

/*
 * A re-publication of @s (known by its id) where either side is filling.
 * Filling on both sides (handed over without its creator's connection):
 * @c, its creator, takes it back. Filling only here: the last broker took
 * the creator's READY, so it counts as a holder. Filling by another
 * connection: not @c's, ignored.
 */
static void republish_filling(struct gpuipc__broker *b,
                              struct gpuipc__conn *c, struct gpuipc__seg *s,
                              const struct gpuipc__seg_wire *w,
                              uint32_t holds)
{
  if (s->w.state == GPUIPC__SEG_FILLING) {
    if (w->state != GPUIPC__SEG_FILLING || s->creator != NULL) {
      GPUIPC_LOG_W("broker %s: pid %u re-published segment %s (id %llu), "
                   "which pid %u fills; ignoring it", b->name,
                   (unsigned)c->cred.pid, w->name, (unsigned long long)w->id,
                   s->creator_pid);
      return;
    }
    fill_by(s, c);
  }
  republish_take(b, c, s, holds, false);
}

static void on_republish(struct gpuipc__broker *b, struct gpuipc__conn *c,
                         const struct gpuipc__msg *m, int *fd)
{
  const struct gpuipc__seg_wire *w = &m->u.republish.seg;
  uint32_t pid = (uint32_t)c->cred.pid;
  uint32_t holds = m->u.republish.holds;
  bool keeper = (m->u.republish.flags & GPUIPC__REPUB_KEEPER) != 0;
  if (!republish_allowed(b, c, w, *fd, keeper))
    return;
  learn_id(b, w->id);
  struct gpuipc__seg *s = gpuipc__reg_by_id(&b->reg, w->id);
  if (s != NULL) {
    /*
     * Only the segment the id names may come back under it: a record of
     * another name, kind or size, or a reservation still being created
     * (another member's), is not what this member held.
     */
    if (s->w.state == GPUIPC__SEG_CREATING ||
        strcmp(s->w.name, w->name) != 0 || s->w.kind != w->kind ||
        s->w.size != w->size) {
      GPUIPC_LOG_W("broker %s: pid %u re-published segment %s (id %llu, "
                   "kind %u, %llu bytes) but that id is %s%s (kind %u, "
                   "%llu bytes); disconnecting it",
                   b->name, pid, w->name, (unsigned long long)w->id,
                   w->kind, (unsigned long long)w->size,
                   s->w.state == GPUIPC__SEG_CREATING ? "a reservation of "
                                                      : "segment ",
                   s->w.name, s->w.kind, (unsigned long long)s->w.size);
      c->doomed = true;
      return;
    }
    if (s->w.state == GPUIPC__SEG_FILLING ||
        w->state == GPUIPC__SEG_FILLING) {
      republish_filling(b, c, s, w, holds);
      return;
    }
    /*
     * Memory its creator held comes back with the creator, or with any
     * survivor while the broker recovers (end_recovery then checks that
     * the creator came back too); a holder alone does not revive it.
     */
    bool may_bring = keeper || recovering(b) ||
                     !(w->flags & GPUIPC__SEGF_CREATOR_HELD);
    if (may_bring && (s->w.state == GPUIPC__SEG_LOST || s->fd < 0)) {
      /* A tombstone, or a record without memory: this holder brings it. */
      if (s->w.state == GPUIPC__SEG_LOST && w->state == GPUIPC__SEG_UNLINKED) {
        journal_drop(b, s->w.id);
        gpuipc__reg_unname(&b->reg, s);
      }
      publish_into(b, s, w, fd, s->creator_pid ? s->creator_pid : pid);
      journal_put(b, s);
    }
    republish_take(b, c, s, holds, keeper);
    return;
  }
  if (w->state != GPUIPC__SEG_UNLINKED) {
    struct gpuipc__seg *n = gpuipc__reg_by_name(&b->reg, w->name);
    if (n != NULL && n->w.state != GPUIPC__SEG_LOST) {
      GPUIPC_LOG_W("broker %s: pid %u re-published segment %s (id %llu) but "
                   "the name now belongs to id %llu; keeping the latter",
                   b->name, pid, w->name, (unsigned long long)w->id,
                   (unsigned long long)n->w.id);
      return;
    }
    if (n != NULL) {
      journal_drop(b, n->w.id);
      gpuipc__reg_remove(&b->reg, n);
    }
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
  journal_put(b, s);
  if (s->w.state == GPUIPC__SEG_FILLING)
    fill_by(s, c);
  GPUIPC_LOG_D("broker %s: pid %u re-published %s (id %llu)%s", b->name, pid,
               w->name, (unsigned long long)w->id,
               keeper ? ", keeping its memory" : "");
  republish_take(b, c, s, holds, keeper);
}

static void on_hello(struct gpuipc__broker *b, struct gpuipc__conn *c,
                     const struct gpuipc__msg *m)
{
  c->hello_flags = m->u.hello.flags;
  c->token = m->u.hello.token;
  if (m->u.hello.flags & GPUIPC__HELLO_REJOIN)
    b->rejoined = true;
  learn_id(b, m->u.hello.max_id);
  c->state = CONN_READY;
  struct gpuipc__msg *o = &b->out;
  o->type = GPUIPC_MSG_WELCOME;
  o->req = m->req;
  o->u.welcome.pid = (uint32_t)b->pid;
  o->u.welcome.flags = 0;
  o->u.welcome.epoch = b->epoch;
  conn_send(c, o, NULL, 0);
  GPUIPC_LOG_D("broker %s: pid %d joined%s", b->name, (int)c->cred.pid,
               (m->u.hello.flags & GPUIPC__HELLO_REJOIN) ? " again" : "");
}

/* Handle one decoded message from @c; @fds are ours to keep or close. */
static void on_message(struct gpuipc__broker *b, struct gpuipc__conn *c,
                       const struct gpuipc__msg *m, int *fds, int nfds)
{
  if (c->state == CONN_NEW) {
    if (m->type != GPUIPC_MSG_HELLO) {
      GPUIPC_LOG_W("broker %s: pid %d sent %s before HELLO; disconnecting",
                   b->name, (int)c->cred.pid, gpuipc__msg_name(m->type));
      c->doomed = true;
    } else {
      on_hello(b, c, m);
    }
    goto close_fds;
  }
  if (c->state != CONN_READY)
    goto close_fds;
  switch (m->type) {
  case GPUIPC_MSG_OPEN: on_open(b, c, m); break;
  case GPUIPC_MSG_PUBLISH: on_publish(b, c, m, nfds ? &fds[0] : &(int){-1}); break;
  case GPUIPC_MSG_ABANDON: on_abandon(b, c, m); break;
  case GPUIPC_MSG_READY: on_ready(b, c, m); break;
  case GPUIPC_MSG_RELEASE: on_release(b, c, m); break;
  case GPUIPC_MSG_DISOWN: on_disown(b, c, m); break;
  case GPUIPC_MSG_UNLINK: on_unlink(b, c, m); break;
  case GPUIPC_MSG_LIST: on_list(b, c, m); break;
  case GPUIPC_MSG_REPUBLISH:
    on_republish(b, c, m, nfds ? &fds[0] : &(int){-1});
    break;
  default:
    GPUIPC_LOG_W("broker %s: pid %d sent %s, which members do not send; "
                 "disconnecting",
                 b->name, (int)c->cred.pid, gpuipc__msg_name(m->type));
    c->doomed = true;
  }
close_fds:
  for (int i = 0; i < nfds; i++)
    gpuipc__fd_close(&fds[i]);
}

/* ------------------------------------------------------------------------ */
/* Connections                                                              */
/* ------------------------------------------------------------------------ */

/*
 * Limits. A connection holds a descriptor of the broker's process; so does
 * every segment the broker keeps. Connections are therefore bounded below
 * the open-file limit (in all, and per uid), the excess is answered with a
 * refusal and closed at once, and one spare descriptor is kept to answer
 * and close connections when the process has none left (EMFILE), instead
 * of leaving them in the listener's queue, which poll() would report
 * again and again.
 */
static void conn_limits_init(struct gpuipc__broker *b)
{
  struct rlimit rl;
  size_t budget = CONNS_MAX;
  b->nofile = 0;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    b->nofile = (unsigned long long)rl.rlim_cur;
    budget = rl.rlim_cur > NOFILE_MARGIN + 2
                 ? (size_t)(rl.rlim_cur - NOFILE_MARGIN) / 2 : 1;
  }
  long want = gpuipc__cfg_long(GPUIPC_CFG_MAX_MEMBERS, 0);
  size_t max = want > 0 ? (size_t)want : CONNS_MAX;
  if (max > budget) {
    if (want > 0)
      GPUIPC_LOG_I("broker %s: GPUIPC_MAX_MEMBERS=%ld, but the open-file "
                   "limit %llu allows %zu connections", b->name, want,
                   b->nofile, budget);
    max = budget;
  }
  b->conns_max = max;
  long per = gpuipc__cfg_long(GPUIPC_CFG_MAX_MEMBERS_PER_UID, 0);
  b->conns_max_uid = per > 0 && (size_t)per < max ? (size_t)per : max;
  b->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

/* Whether to say a warning now; *@missed: how many were not said. */
static bool warn_now(struct warn_gate *g, uint64_t *missed)
{
  uint64_t now = gpuipc__now_ns();
  if (now < g->next) {
    g->missed++;
    return false;
  }
  *missed = g->missed;
  g->missed = 0;
  g->next = now + WARN_EVERY_NS;
  return true;
}

static struct uid_count *uid_slot(struct gpuipc__broker *b, uint32_t uid,
                                  bool add)
{
  for (size_t i = 0; i < b->nuids; i++)
    if (b->uids[i].uid == uid)
      return &b->uids[i];
  if (!add)
    return NULL;
  if (b->nuids == b->capuids) {
    size_t cap = b->capuids ? 2 * b->capuids : 8;
    struct uid_count *n = realloc(b->uids, cap * sizeof(*n));
    if (n == NULL)
      return NULL;
    b->uids = n;
    b->capuids = cap;
  }
  b->uids[b->nuids] = (struct uid_count){uid, 0};
  return &b->uids[b->nuids++];
}

static void uid_uncount(struct gpuipc__broker *b, struct gpuipc__conn *c)
{
  struct uid_count *u = c->counted ? uid_slot(b, c->cred.uid, false) : NULL;
  c->counted = false;
  if (u != NULL && --u->n == 0)
    *u = b->uids[--b->nuids];
}

/*
 * Answer a connection we do not keep with an ERROR (@code, the sentence)
 * and close it. Its HELLO, if here, is read first: closing a connection
 * with a message unread would reset it, and the member would read the
 * reset before the answer.
 */
static void refuse(struct gpuipc__broker *b, int fd, pid_t pid, int code,
                   const char *fmt, ...) GPUIPC__PRINTF(5, 6);

static void refuse(struct gpuipc__broker *b, int fd, pid_t pid, int code,
                   const char *fmt, ...)
{
  struct gpuipc__msg *m = &b->out;
  memset(&m->u.error, 0, sizeof(m->u.error));
  m->type = GPUIPC_MSG_ERROR;
  m->req = 0;
  m->u.error.code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m->u.error.text, sizeof(m->u.error.text), fmt, ap);
  va_end(ap);
  uint8_t buf[GPUIPC__MSG_BUF];
  int len = gpuipc__msg_encode(m, buf, sizeof(buf));
  if (len > 0)
    (void)gpuipc__sock_send(fd, buf, (size_t)len, NULL, 0, 0);
  int fds[GPUIPC_FDS_MAX], nfds = GPUIPC_FDS_MAX;
  if (gpuipc__sock_recv(fd, b->rbuf, sizeof(b->rbuf), fds, &nfds, 0) >= 0)
    for (int i = 0; i < nfds; i++)
      gpuipc__fd_close(&fds[i]);
  gpuipc__fd_close(&fd);
  uint64_t missed;
  if (warn_now(&b->warn_refused, &missed))
    GPUIPC_LOG_W("broker %s: refused pid %d: %s (%llu more refusals not "
                 "logged in the last %llu s)", b->name, (int)pid,
                 m->u.error.text, (unsigned long long)missed,
                 WARN_EVERY_NS / 1000000000ull);
}

/* Refuse @fd (and close it) if it is one connection too many. */
static bool refused_over_cap(struct gpuipc__broker *b, int fd,
                             const struct gpuipc__cred *cred)
{
  if (b->nconns >= b->conns_max) {
    refuse(b, fd, cred->pid, -EUSERS,
           "domain %s has %zu connections, the most its broker (pid %d) "
           "takes (GPUIPC_MAX_MEMBERS; at most (open-file limit %llu - %d) "
           "/ 2); try again when members have left",
           b->name, b->nconns, (int)b->pid, b->nofile, NOFILE_MARGIN);
    return true;
  }
  struct uid_count *u = uid_slot(b, cred->uid, false);
  if (u != NULL && u->n >= b->conns_max_uid) {
    refuse(b, fd, cred->pid, -EUSERS,
           "domain %s has %u connections of uid %u, the most its broker "
           "(pid %d) takes from one uid (GPUIPC_MAX_MEMBERS_PER_UID)",
           b->name, u->n, (unsigned)cred->uid, (int)b->pid);
    return true;
  }
  return false;
}

/*
 * The process has no descriptor free: give up the spare one, accept a
 * waiting connection with it, answer and close that, take the spare back.
 * 1 when one was answered, 0 when none waited, < 0 when that cannot be
 * done (no spare).
 */
static int shed_one(struct gpuipc__broker *b)
{
  if (b->spare_fd < 0)
    b->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (b->spare_fd < 0)
    return -EMFILE;
  gpuipc__fd_close(&b->spare_fd);
  int fd;
  int rc = gpuipc__sock_accept(b->listen_fd, 0, &fd);
  if (rc == 0) {
    struct gpuipc__cred cred = {0};
    (void)gpuipc__peer_cred(fd, &cred);
    refuse(b, fd, cred.pid, -EMFILE,
           "the broker of domain %s (pid %d) has no descriptor free (EMFILE: "
           "its process is at its open-file limit %llu); try again later",
           b->name, (int)b->pid, b->nofile);
  }
  b->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (rc != 0 && rc != -EMFILE && rc != -ENFILE)
    return 0;
  return rc == 0 && b->spare_fd >= 0 ? 1 : -EMFILE;
}

/* accept() failed with @rc: shed what waits, or rest the listener a while
 * (poll would report it again at once), and say so now and then. */
static bool accept_failed(struct gpuipc__broker *b, int rc)
{
  if (would_block(rc) || rc == -ECONNABORTED || rc == -EINTR)
    return false;
  if (rc == -EMFILE || rc == -ENFILE) {
    int shed = shed_one(b);
    if (shed >= 0)
      return shed > 0; /* none left waiting: done */
  }
  b->accept_rest = gpuipc__deadline(ACCEPT_REST_MS);
  uint64_t missed;
  if (warn_now(&b->warn_accept, &missed))
    GPUIPC_LOG_W("broker %s: cannot accept connections%s: %s; %zu "
                 "connections (%llu failures not logged in the last %llu s)",
                 b->name,
                 rc == -EMFILE ? " (this process has no descriptor free)"
                 : rc == -ENFILE ? " (the system has no file free)" : "",
                 gpuipc_last_error(), b->nconns, (unsigned long long)missed,
                 WARN_EVERY_NS / 1000000000ull);
  return false;
}

static void accept_all(struct gpuipc__broker *b)
{
  for (;;) {
    int fd;
    int rc = gpuipc__sock_accept(b->listen_fd, 0, &fd);
    if (rc != 0) {
      if (accept_failed(b, rc))
        continue;
      return;
    }
    struct gpuipc__cred cred;
    bool have_cred = gpuipc__peer_cred(fd, &cred) == 0;
    if (have_cred && refused_over_cap(b, fd, &cred))
      continue;
    struct gpuipc__conn *c = calloc(1, sizeof(*c));
    if (c == NULL) {
      gpuipc__fd_close(&fd);
      return;
    }
    c->fd = fd;
    c->seq = ++b->conn_seq;
    c->state = CONN_NEW;
    c->deadline = gpuipc__deadline(HELLO_MS);
    if (!have_cred) {
      GPUIPC_LOG_W("broker %s: %s", b->name, gpuipc_last_error());
      c->doomed = true;
    } else {
      c->cred = cred;
      struct uid_count *u = uid_slot(b, cred.uid, true);
      if (u != NULL) {
        u->n++;
        c->counted = true;
      }
    }
    if (have_cred && !peer_allowed(b, &c->cred)) {
      GPUIPC_LOG_W("broker %s: refused pid %d (uid %u, gid %u): not the "
                   "broker's uid %u nor in GPUIPC_ALLOW_UIDS / "
                   "GPUIPC_ALLOW_GIDS",
                   b->name, (int)c->cred.pid, (unsigned)c->cred.uid,
                   (unsigned)c->cred.gid, (unsigned)b->uid);
      struct gpuipc__msg *o = &b->out;
      o->type = GPUIPC_MSG_DENIED;
      o->req = 0;
      snprintf(o->u.denied.reason, sizeof(o->u.denied.reason),
               "domain %s refuses uid %u (broker uid %u; see "
               "GPUIPC_ALLOW_UIDS and GPUIPC_ALLOW_GIDS)",
               b->name, (unsigned)c->cred.uid, (unsigned)b->uid);
      conn_send(c, o, NULL, 0);
      c->state = CONN_CLOSING;
    }
    c->next = b->conns;
    b->conns = c;
    b->nconns++;
  }
}

/* Forget everything @c held, reserved or waited for. */
static void conn_drop_state(struct gpuipc__broker *b, struct gpuipc__conn *c)
{
  struct park **pp = &b->parks;
  while (*pp != NULL) {
    if ((*pp)->conn == c) {
      struct park *p = *pp;
      *pp = p->next;
      park_free(p);
    } else {
      pp = &(*pp)->next;
    }
  }
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
      if (s->w.state == GPUIPC__SEG_FILLING)
        journal_drop(b, s->w.id);
      gpuipc__reg_remove(&b->reg, s);
    } else {
      bool kept = s->keeper == c;
      uint32_t dropped = gpuipc__reg_drop(s, c, UINT32_MAX);
      if (kept)
        keeper_gone(b, s); /* the creator left without letting go */
      else if (dropped != 0)
        maybe_free(b, s);
    }
    s = next;
  }
  for (size_t i = 0; i < nfreed; i++)
    redispatch(b, freed[i]);
  free(freed);
}

static void conn_free(struct gpuipc__conn *c)
{
  outbox_free(c);
  gpuipc__fd_close(&c->fd);
  free(c);
}

/*
 * A refused connection (CONN_CLOSING) is closed by its member first, not
 * by us: closing our end while the member's HELLO waits unread in it resets
 * the connection, and the member's next read reports the reset
 * (ECONNRESET) instead of the refusal queued before it. So once the answer
 * is out, shut our end for writing -- the member reads the answer, then the
 * end -- and read and drop what it sends until it hangs up (conn_read) or
 * its deadline passes (expire_conns).
 */
static void shut_answered(struct gpuipc__broker *b)
{
  for (struct gpuipc__conn *c = b->conns; c != NULL; c = c->next) {
    if (c->state != CONN_CLOSING || c->shut || c->doomed ||
        c->out_head != NULL)
      continue;
    c->shut = true;
    if (shutdown(c->fd, SHUT_WR) != 0)
      c->doomed = true; /* the member is gone already */
  }
}

/* Drop every doomed connection (the state it left may doom no other). */
static void reap(struct gpuipc__broker *b)
{
  struct gpuipc__conn **pp = &b->conns;
  while (*pp != NULL) {
    struct gpuipc__conn *c = *pp;
    if (!c->doomed) {
      pp = &c->next;
      continue;
    }
    *pp = c->next;
    b->nconns--;
    uid_uncount(b, c);
    if (c->state == CONN_READY)
      GPUIPC_LOG_D("broker %s: pid %d left", b->name, (int)c->cred.pid);
    conn_drop_state(b, c);
    conn_free(c);
    pp = &b->conns; /* dropping state may have doomed others: restart */
  }
}

static void conn_read(struct gpuipc__broker *b, struct gpuipc__conn *c)
{
  for (int n = 0; n < READ_BURST && !c->doomed; n++) {
    int fds[GPUIPC_FDS_MAX];
    int nfds = GPUIPC_FDS_MAX;
    ssize_t len = gpuipc__sock_recv(c->fd, b->rbuf, sizeof(b->rbuf), fds,
                                    &nfds, 0);
    if (would_block((int)len))
      return;
    if (len < 0) {
      if (len != GPUIPC_E_PEER_GONE && c->state != CONN_CLOSING)
        GPUIPC_LOG_W("broker %s: pid %d: %s; disconnecting", b->name,
                     (int)c->cred.pid, gpuipc_last_error());
      c->doomed = true; /* a refused member hung up: what we waited for */
      return;
    }
    if (c->state == CONN_CLOSING) { /* refused: what it sends is dropped */
      for (int i = 0; i < nfds; i++)
        gpuipc__fd_close(&fds[i]);
      continue;
    }
    int rc = gpuipc__msg_decode(b->rbuf, (size_t)len, nfds, &b->in);
    if (rc != 0) {
      for (int i = 0; i < nfds; i++)
        gpuipc__fd_close(&fds[i]);
      GPUIPC_LOG_W("broker %s: pid %d sent a malformed message (%s); "
                   "disconnecting it",
                   b->name, (int)c->cred.pid, gpuipc_last_error());
      if (rc == GPUIPC_E_VERSION) {
        uint32_t req = b->in.req;
        send_error(b, c, req, GPUIPC_E_VERSION,
                   "broker of domain %s speaks protocol version %d",
                   b->name, GPUIPC_PROTO_VERSION);
        c->state = CONN_CLOSING;
      } else {
        c->doomed = true;
      }
      return;
    }
    on_message(b, c, &b->in, fds, nfds);
  }
}

/* ------------------------------------------------------------------------ */
/* Timers                                                                   */
/* ------------------------------------------------------------------------ */

static void end_recovery(struct gpuipc__broker *b)
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
      gpuipc__reg_remove(&b->reg, s);
    else if (creator_held(s) && s->keeper == NULL &&
             s->w.state == GPUIPC__SEG_PUBLISHED)
      lose(b, s, "did not come back with its creator, which kept its "
               "memory");
    else
      maybe_free(b, s);
    s = next;
  }
  if (fresh)
    journal_compact(b);
  GPUIPC_LOG_I("broker %s: recovery window closed: %zu segments%s", b->name,
               b->reg.count,
               fresh ? " (no member of the last broker came back)" : "");
  struct park *list = NULL, **tail = &list;
  struct park **pp = &b->parks;
  while (*pp != NULL) {
    struct park *p = *pp;
    if (p->recovery) {
      *pp = p->next;
      p->next = NULL;
      *tail = p;
      tail = &p->next;
    } else {
      pp = &p->next;
    }
  }
  while (list != NULL) {
    struct park *p = list;
    list = p->next;
    p->conn->nparks--; /* before dispatch may park it again */
    if (!p->conn->doomed)
      dispatch(b, p->conn, p);
    free(p);
  }
}

static void expire_parks(struct gpuipc__broker *b, uint64_t now)
{
  struct park **pp = &b->parks;
  while (*pp != NULL) {
    struct park *p = *pp;
    if (p->recovery || p->deadline > now) {
      pp = &p->next;
      continue;
    }
    *pp = p->next;
    if (p->type == GPUIPC_MSG_OPEN)
      send_error(b, p->conn, p->req, -ETIMEDOUT,
                 "segment %s was not published in time", p->name);
    park_free(p);
  }
}

/* Drop connections that did not say HELLO (or hang up after a refusal)
 * in time. */
static void expire_conns(struct gpuipc__broker *b, uint64_t now)
{
  for (struct gpuipc__conn *c = b->conns; c != NULL; c = c->next) {
    if (c->state == CONN_READY || c->doomed || c->deadline > now)
      continue;
    GPUIPC_LOG_W("broker %s: pid %d %s within %d ms; disconnecting it",
                 b->name, (int)c->cred.pid,
                 c->state == CONN_NEW ? "did not say HELLO"
                                      : "did not hang up after its refusal",
                 HELLO_MS);
    c->doomed = true;
  }
}

/* Poll timeout in ms until the next deadline (-1: none). */
static int next_timeout(struct gpuipc__broker *b, uint64_t now)
{
  uint64_t next = UINT64_MAX;
  if (b->recovery_end != 0)
    next = b->recovery_end;
  if (b->accept_rest != 0 && b->accept_rest < next)
    next = b->accept_rest;
  for (struct gpuipc__conn *c = b->conns; c != NULL; c = c->next)
    if (c->state != CONN_READY && !c->doomed && c->deadline < next)
      next = c->deadline;
  for (struct park *p = b->parks; p != NULL; p = p->next)
    if (!p->recovery && p->deadline < next)
      next = p->deadline;
  if (next == UINT64_MAX)
    return -1;
  if (next <= now)
    return 0;
  uint64_t ms = (next - now + 999999) / 1000000;
  return ms > 60000 ? 60000 : (int)ms;
}

/* ------------------------------------------------------------------------ */
/* The loop                                                                 */
/* ------------------------------------------------------------------------ */

static int ensure_pfds(struct gpuipc__broker *b, size_t n)
{
  if (n <= b->pcap)
    return 0;
  size_t cap = b->pcap ? b->pcap : 16;
  while (cap < n)
    cap *= 2;
  struct pollfd *p = realloc(b->pfds, cap * sizeof(*p));
  if (p == NULL)
    return -ENOMEM;
  b->pfds = p;
  struct gpuipc__conn **c = realloc(b->pconns, cap * sizeof(*c));
  if (c == NULL)
    return -ENOMEM;
  b->pconns = c;
  b->pcap = cap;
  return 0;
}

/* Whether @c may take the domain over from this broker. */
static bool may_succeed(const struct gpuipc__broker *b,
                        const struct gpuipc__conn *c)
{
  return !c->doomed && c->state == CONN_READY &&
         !(c->hello_flags & GPUIPC__HELLO_NO_BROKER) &&
         c->token != b->owner_token;
}

static bool successor_ready(const struct gpuipc__broker *b)
{
  for (const struct gpuipc__conn *c = b->conns; c != NULL; c = c->next)
    if (may_succeed(b, c))
      return true;
  return false;
}

/*
 * Serve until the stop descriptor is readable; or, @stopping (it is
 * already), until a member that may take the domain over is connected or
 * the recovery window has closed.
 */
static void loop(struct gpuipc__broker *b, bool stopping)
{
  for (;;) {
    if (stopping && (!recovering(b) || successor_ready(b)))
      return;
    if (ensure_pfds(b, b->nconns + 2) != 0) {
      usleep(1000);
      continue;
    }
    size_t n = 0;
    b->pfds[n++] = (struct pollfd){.fd = stopping ? -1 : b->stop_fd,
                                   .events = POLLIN};
    if (b->accept_rest != 0 && gpuipc__now_ns() >= b->accept_rest)
      b->accept_rest = 0;
    b->pfds[n++] = (struct pollfd){
        .fd = b->accept_rest != 0 ? -1 : b->listen_fd, .events = POLLIN};
    for (struct gpuipc__conn *c = b->conns; c != NULL; c = c->next) {
      short ev = POLLIN;
      if (c->out_head != NULL)
        ev |= POLLOUT;
      b->pconns[n] = c;
      b->pfds[n++] = (struct pollfd){.fd = c->fd, .events = ev};
    }
    int timeout = next_timeout(b, gpuipc__now_ns());
    int rc = poll(b->pfds, n, timeout);
    if (rc < 0 && errno != EINTR) {
      GPUIPC_LOG_E("broker %s: poll: %s", b->name, strerror(errno));
      usleep(1000);
    }
    if (rc > 0) {
      if (b->pfds[0].revents != 0)
        return;
      if (b->pfds[1].revents & POLLIN)
        accept_all(b);
      for (size_t i = 2; i < n; i++) {
        struct gpuipc__conn *c = b->pconns[i];
        short re = b->pfds[i].revents;
        if (re == 0 || c->doomed)
          continue;
        if (re & POLLOUT)
          conn_flush(c);
        if (re & (POLLIN | POLLHUP | POLLERR))
          conn_read(b, c);
      }
    }
    uint64_t now = gpuipc__now_ns();
    if (b->recovery_end != 0 && now >= b->recovery_end)
      end_recovery(b);
    expire_parks(b, now);
    expire_conns(b, now);
    shut_answered(b);
    reap(b);
  }
}

/* ------------------------------------------------------------------------ */
/* Hand-over and shutdown                                                   */
/* ------------------------------------------------------------------------ */

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

static bool try_handoff(struct gpuipc__broker *b)
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
      outbox_free(best); /* replies it would get die with the connection */
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
    }
  }
  return false;
}

static void broker_shutdown(struct gpuipc__broker *b)
{
  bool handed = try_handoff(b);
  /*
   * A broker that has just taken the domain over (a hand-over, or an
   * election after a crash) has no members yet when its host leaves at
   * once: they are reconnecting, and only it holds the segments'
   * descriptors. Ending the domain now would lose every segment nobody
   * maps; so serve until one of them may take the domain, or the window
   * in which they come back closes.
   */
  while (!handed && recovering(b)) {
    GPUIPC_LOG_D("broker %s: leaving before its members came back; "
                 "waiting for one to take the domain over", b->name);
    loop(b, true);
    handed = try_handoff(b);
  }
  if (!handed) {
    /* The domain ends: its names with it. */
    if (ftruncate(b->lock_fd, 0) != 0)
      GPUIPC_LOG_W("broker %s: cannot empty %s: %s", b->name, b->paths.lock,
                   strerror(errno));
    /* Unlink while still holding the lock: a new broker binds anew. */
    if (unlink(b->paths.sock) != 0 && errno != ENOENT)
      GPUIPC_LOG_W("broker %s: unlink %s: %s", b->name, b->paths.sock,
                   strerror(errno));
    GPUIPC_LOG_I("broker %s: domain closed with %zu segments", b->name,
                 b->reg.count);
  }
  while (b->conns != NULL) {
    struct gpuipc__conn *c = b->conns;
    b->conns = c->next;
    conn_free(c);
  }
  b->nconns = 0;
  while (b->parks != NULL) { /* their members are gone: no accounts */
    struct park *p = b->parks;
    b->parks = p->next;
    free(p);
  }
  gpuipc__fd_close(&b->listen_fd);
  gpuipc__fd_close(&b->lock_fd);
  gpuipc__reg_destroy(&b->reg);
}

/* ------------------------------------------------------------------------ */
/* Life cycle                                                               */
/* ------------------------------------------------------------------------ */

int gpuipc__broker_claim(const char *name, int *lock_fd, int *listen_fd,
                         bool *stale)
{
  struct gpuipc__dom_paths paths;
  int rc = gpuipc__dom_paths(name, &paths);
  if (rc != 0)
    return rc;
  int lfd = -1, sfd = -1;
  rc = gpuipc__flock_open(paths.lock, 0, &lfd);
  if (rc != 0)
    return rc;
  /* We hold the lock: any socket file is a dead broker's. */
  bool left = true;
  if (unlink(paths.sock) != 0) {
    if (errno != ENOENT) {
      rc = gpuipc__err_errno(errno, "unlink stale socket %s", paths.sock);
      goto close_lock;
    }
    left = false;
  }
  if (stale != NULL)
    *stale = left;
  rc = gpuipc__sock_listen(paths.sock, 128, &sfd);
  if (rc != 0)
    goto close_lock;
  *lock_fd = lfd;
  *listen_fd = sfd;
  return 0;
close_lock:
  gpuipc__fd_close(&lfd);
  return rc;
}

static void init_release(struct gpuipc__broker_init *init)
{
  gpuipc__fd_close(&init->lock_fd);
  gpuipc__fd_close(&init->listen_fd);
  if (init->have_reg)
    gpuipc__reg_destroy(&init->reg);
  init->have_reg = false;
}

static int broker_new(struct gpuipc__broker_init *init,
                      struct gpuipc__broker **out)
{
  struct gpuipc__broker *b = calloc(1, sizeof(*b));
  if (b == NULL) {
    init_release(init);
    return gpuipc__err(-ENOMEM, "broker: out of memory");
  }
  int rc = gpuipc__dom_paths(init->name, &b->paths);
  if (rc != 0)
    goto free_b;
  if (!init->have_reg) {
    rc = gpuipc__reg_init(&init->reg);
    if (rc != 0)
      goto free_b;
    init->have_reg = true;
  }
  if (pipe2(b->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    rc = gpuipc__err_errno(errno, "broker: pipe2");
    goto free_b;
  }
  snprintf(b->name, sizeof(b->name), "%s", init->name);
  b->lock_fd = init->lock_fd;
  b->listen_fd = init->listen_fd;
  init->lock_fd = init->listen_fd = -1;
  b->reg = init->reg;
  init->have_reg = false;
  b->epoch = init->epoch ? init->epoch : random_u64();
  b->next_id = clock_id();
  if (init->next_id > b->next_id)
    b->next_id = init->next_id;
  for (struct gpuipc__seg *s = b->reg.head; s != NULL; s = s->next)
    learn_id(b, s->w.id);
  b->owner_token = init->owner_token;
  b->recovery = init->recovery;
  if (b->recovery == GPUIPC__RECOVER_CRASH)
    journal_load(b);
  journal_compact(b); /* empty for a new domain */
  if (b->recovery != GPUIPC__RECOVER_NONE)
    b->recovery_end = gpuipc__now_ns() + GPUIPC__RECOVERY_MS * 1000000ull;
  b->pid = getpid();
  b->uid = geteuid();
  parse_list(gpuipc__cfg_str(GPUIPC_CFG_ALLOW_UIDS), b->allow_uids,
             &b->nallow_uids);
  parse_list(gpuipc__cfg_str(GPUIPC_CFG_ALLOW_GIDS), b->allow_gids,
             &b->nallow_gids);
  b->stop_fd = b->wake[0];
  conn_limits_init(b);
  GPUIPC_LOG_I("broker %s: started in pid %d (epoch %016llx, %zu segments%s)",
               b->name, (int)b->pid, (unsigned long long)b->epoch,
               b->reg.count,
               b->recovery == GPUIPC__RECOVER_CRASH     ? ", after a crash"
               : b->recovery == GPUIPC__RECOVER_HANDOFF ? ", handed over"
                                                        : "");
  *out = b;
  return 0;
free_b:
  free(b);
  init_release(init);
  return rc;
}

static void broker_free(struct gpuipc__broker *b)
{
  gpuipc__fd_close(&b->wake[0]);
  gpuipc__fd_close(&b->wake[1]);
  gpuipc__fd_close(&b->spare_fd);
  free(b->uids);
  free(b->pfds);
  free(b->pconns);
  free(b);
}

static void *broker_thread(void *arg)
{
  struct gpuipc__broker *b = arg;
  loop(b, false);
  broker_shutdown(b);
  return NULL;
}

int gpuipc__broker_start(struct gpuipc__broker_init *init,
                         struct gpuipc__broker **out)
{
  struct gpuipc__broker *b;
  int rc = broker_new(init, &b);
  if (rc != 0)
    return rc;
  /* The broker thread must not take signals meant for the program. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  rc = pthread_create(&b->thread, NULL, broker_thread, b);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    rc = gpuipc__err_errno(rc, "broker: pthread_create");
    broker_shutdown(b);
    broker_free(b);
    return rc;
  }
  b->threaded = true;
  *out = b;
  return 0;
}

void gpuipc__broker_stop(struct gpuipc__broker *b)
{
  if (b == NULL)
    return;
  char c = 1;
  while (write(b->wake[1], &c, 1) < 0 && errno == EINTR)
    ;
  if (b->threaded)
    pthread_join(b->thread, NULL);
  broker_free(b);
}

uint64_t gpuipc__broker_epoch(const struct gpuipc__broker *b)
{
  return b->epoch;
}

int gpuipc__broker_run(struct gpuipc__broker_init *init, int stop_fd)
{
  struct gpuipc__broker *b;
  int rc = broker_new(init, &b);
  if (rc != 0)
    return rc;
  b->stop_fd = stop_fd;
  loop(b, false);
  broker_shutdown(b);
  broker_free(b);
  return 0;
}
