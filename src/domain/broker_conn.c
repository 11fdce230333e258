/*
 * The broker's connections: accepting them under the caps (in all, per
 * uid, below the open-file limit, and at EMFILE), who may join (the
 * broker's uid, GPUIPC_ALLOW_UIDS / GPUIPC_ALLOW_GIDS), HELLO, reading a
 * member's messages and handing its requests to broker_req.c, and dropping
 * a connection (reap) with what it held (broker_seg.c). A member whose
 * message fails to decode is disconnected; nobody else notices. What is
 * sent goes through broker_send.c. See broker_int.h for the other broker
 * files.
 */
#include "domain/broker_int.h"
#include "os/os.h"
#include "wire/wire.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

/* Messages read from one member before looking at the others. */
#define READ_BURST 64
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
  b->fds_other = -1;
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

/* Count the descriptors the process holds besides its connections (the
 * new one, not yet counted in b->nconns, included in neither). */
static void fds_count(struct gpuipc__broker *b)
{
  long open_now = gpuipc__fds_open(0);
  long held = open_now - (long)b->nconns - 1;
  b->fds_other = open_now < 0 ? -1 : held < 0 ? 0 : held;
  b->fds_at = gpuipc__now_ns();
  b->fds_age = 0;
}

/* Half of what @limit leaves beyond @other descriptors and the margin. */
static size_t room_of(rlim_t limit, long other)
{
  unsigned long long used = (unsigned long long)other + NOFILE_MARGIN;
  return limit > used ? (size_t)(limit - used) / 2 : 0;
}

/*
 * Connections the process has descriptors for now: half of what its
 * open-file limit leaves beyond the descriptors it holds for everything
 * else (a CUDA driver's dozens, the segments the broker keeps) and
 * NOFILE_MARGIN. The broker shares its process with a member, which may
 * open descriptors at any time, so this is asked for each new connection.
 * Counting them (/proc/self/fd) costs a pass over all of them: the count
 * is kept for FDS_KEEP_NS and FDS_KEEP_CONNS connections, but taken again
 * before one is let in within FDS_NEAR of the cap, so that only refusals
 * (a flood of them, say) go by a recent count. *@other: the count used.
 */
#define FDS_KEEP_NS 100000000ull
#define FDS_KEEP_CONNS 64
#define FDS_NEAR 16
static size_t conns_room(struct gpuipc__broker *b, long *other)
{
  struct rlimit rl;
  *other = -1;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
    return SIZE_MAX;
  bool fresh = b->fds_other < 0 || ++b->fds_age >= FDS_KEEP_CONNS ||
               gpuipc__now_ns() - b->fds_at >= FDS_KEEP_NS;
  if (fresh)
    fds_count(b);
  if (b->fds_other < 0)
    return SIZE_MAX;
  size_t room = room_of(rl.rlim_cur, b->fds_other);
  if (!fresh && b->nconns < room && b->nconns + FDS_NEAR >= room) {
    fds_count(b); /* about to let one in near the cap: count again */
    if (b->fds_other < 0)
      return SIZE_MAX;
    room = room_of(rl.rlim_cur, b->fds_other);
  }
  *other = b->fds_other;
  return room;
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
  long other;
  size_t room = conns_room(b, &other);
  if (b->nconns >= room) {
    refuse(b, fd, cred->pid, -EUSERS,
           "domain %s has %zu connections, the most its broker (pid %d) "
           "has descriptors for now (GPUIPC_MAX_MEMBERS; at most half of "
           "what its open-file limit leaves beyond the %ld descriptors it "
           "holds otherwise and %d more); try again when members have left",
           b->name, b->nconns, (int)b->pid, other, NOFILE_MARGIN);
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
    struct rlimit rl; /* now: the member sharing the process may change it */
    unsigned long long lim =
        getrlimit(RLIMIT_NOFILE, &rl) == 0 ? (unsigned long long)rl.rlim_cur
                                           : b->nofile;
    refuse(b, fd, cred.pid, -EMFILE,
           "the broker of domain %s (pid %d) has no descriptor free (EMFILE: "
           "its process is at its open-file limit %llu); try again later",
           b->name, (int)b->pid, lim);
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
  if (gpuipc__bk_would_block(rc) || rc == -ECONNABORTED || rc == -EINTR)
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

void gpuipc__bk_accept_all(struct gpuipc__broker *b)
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
      gpuipc__bk_send(c, o, NULL, 0);
      c->state = CONN_CLOSING;
    }
    c->next = b->conns;
    b->conns = c;
    b->nconns++;
  }
}

static void on_hello(struct gpuipc__broker *b, struct gpuipc__conn *c,
                     const struct gpuipc__msg *m)
{
  c->hello_flags = m->u.hello.flags;
  c->token = m->u.hello.token;
  if (m->u.hello.flags & GPUIPC__HELLO_REJOIN)
    b->rejoined = true;
  /* One of the members the last broker said would come back. */
  if ((m->u.hello.flags & (GPUIPC__HELLO_REJOIN | GPUIPC__HELLO_NO_BROKER)) ==
          GPUIPC__HELLO_REJOIN &&
      c->token != b->owner_token)
    b->came_back++;
  gpuipc__bk_learn_id(b, m->u.hello.max_id);
  c->state = CONN_READY;
  struct gpuipc__msg *o = &b->out;
  o->type = GPUIPC_MSG_WELCOME;
  o->req = m->req;
  o->u.welcome.pid = (uint32_t)b->pid;
  o->u.welcome.flags = 0;
  o->u.welcome.epoch = b->epoch;
  gpuipc__bk_send(c, o, NULL, 0);
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
  } else if (c->state == CONN_READY) {
    gpuipc__bk_request(b, c, m, fds, nfds);
  }
  for (int i = 0; i < nfds; i++)
    gpuipc__fd_close(&fds[i]);
}

void gpuipc__bk_conn_free(struct gpuipc__conn *c)
{
  gpuipc__bk_outbox_free(c);
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
void gpuipc__bk_shut_answered(struct gpuipc__broker *b)
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

/* Take the doomed connections out of the list, in its order. */
static struct gpuipc__conn *take_doomed(struct gpuipc__broker *b)
{
  struct gpuipc__conn *gone = NULL, **tail = &gone;
  struct gpuipc__conn **pp = &b->conns;
  while (*pp != NULL) {
    struct gpuipc__conn *c = *pp;
    if (!c->doomed) {
      pp = &c->next;
      continue;
    }
    *pp = c->next;
    c->next = NULL;
    *tail = c;
    tail = &c->next;
    b->nconns--;
  }
  return gone;
}

/*
 * Drop every doomed connection and what it held. Dropping that may doom
 * others (a keeper told LET_GO whose outbox is full): those go in the next
 * round, until a round finds none.
 */
void gpuipc__bk_reap(struct gpuipc__broker *b)
{
  struct gpuipc__conn *gone;
  while ((gone = take_doomed(b)) != NULL) {
    while (gone != NULL) {
      struct gpuipc__conn *c = gone;
      gone = c->next;
      uid_uncount(b, c);
      if (c->state == CONN_READY)
        GPUIPC_LOG_D("broker %s: pid %d left", b->name, (int)c->cred.pid);
      gpuipc__bk_conn_drop_state(b, c);
      gpuipc__bk_conn_free(c);
    }
  }
}

void gpuipc__bk_conn_read(struct gpuipc__broker *b, struct gpuipc__conn *c)
{
  for (int n = 0; n < READ_BURST && !c->doomed; n++) {
    int fds[GPUIPC_FDS_MAX];
    int nfds = GPUIPC_FDS_MAX;
    ssize_t len = gpuipc__sock_recv(c->fd, b->rbuf, sizeof(b->rbuf), fds,
                                    &nfds, 0);
    if (gpuipc__bk_would_block((int)len))
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
        gpuipc__bk_send_error(b, c, req, GPUIPC_E_VERSION,
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

/* Drop connections that did not say HELLO (or hang up after a refusal)
 * in time. */
void gpuipc__bk_expire_conns(struct gpuipc__broker *b, uint64_t now)
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

void gpuipc__bk_conns_init(struct gpuipc__broker *b)
{
  parse_list(gpuipc__cfg_str(GPUIPC_CFG_ALLOW_UIDS), b->allow_uids,
             &b->nallow_uids);
  parse_list(gpuipc__cfg_str(GPUIPC_CFG_ALLOW_GIDS), b->allow_gids,
             &b->nallow_gids);
  conn_limits_init(b);
}
