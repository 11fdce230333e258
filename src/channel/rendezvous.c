/*
 * Channels: the rendezvous of two openers on the segment "chan.NAME".
 * open.c maps the segment and calls gpuipc__chan_rendezvous once per
 * attempt; this file pairs the two ends and connects their socket.
 *
 * Rendezvous. Both openers open the HOST segment "chan.NAME" with CREATE.
 * The first to win a CAS on a_pid (0, or a dead process's pid, -> its own)
 * is end A: it lays out the rings, listens on DIR/chan-TOKEN.sock (TOKEN
 * random, written into the segment) and sets state A_READY. The next opener
 * wins a CAS on b_pid, writes its depth, connects and waits for A's word;
 * A accepts only the process whose pid (SO_PEERCRED) is b_pid. Each end's
 * hello (B's first, then A's word) carries its eventfd (poll.c), checked
 * by the other: anything else fails the open with GPUIPC_E_PROTO. A then
 * marks the segment PAIRED (before its word, so B never pairs with a
 * segment not marked), removes the socket file and unlinks the segment's
 * name, so the name pairs the next two openers afresh; the two ends keep
 * the memory mapped. A PAIRED segment is never taken over: an opener that
 * finds one (it may have mapped it just before the name was unlinked)
 * drops it and opens the name afresh; if A died before unlinking the name,
 * that opener unlinks it -- only while the name still names that segment,
 * never a newer one of the same name. Openers that lose a race, or find a
 * pair still unlinking the name, retry until their timeout.
 */
#include "channel/channel.h"
#include "domain/domain.h"
#include "segment/segment.h"
#include "os/os.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

enum { PAIRED = GPUIPC__CHAN_PAIR_DONE, RETRY = GPUIPC__CHAN_PAIR_RETRY };

#define HELLO_MAGIC 0x4f4c4548u   /* "HELO": A's word */
#define HELLO_B_MAGIC 0x424c4548u /* "HELB": B's, before it */
/* How long a B end that found A ready waits to connect and be greeted. */
#define HANDSHAKE_MS 1000

static void token_make(char out[GPUIPC__CHAN_TOKEN_LEN + 1])
{
  uint8_t r[GPUIPC__CHAN_TOKEN_LEN / 2];
  gpuipc__random(r, sizeof(r));
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < sizeof(r); i++) {
    out[2 * i] = hex[r[i] >> 4];
    out[2 * i + 1] = hex[r[i] & 15];
  }
  out[GPUIPC__CHAN_TOKEN_LEN] = '\0';
}

/* The socket path for @token, checking the token (the peer wrote it). */
static int sock_path(const char *token, char *out, size_t cap)
{
  char dir[PATH_MAX];
  for (int i = 0; i < GPUIPC__CHAN_TOKEN_LEN; i++) {
    char c = token[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
      return gpuipc__err(GPUIPC_E_PROTO, "gpuipc_channel_open: the socket "
                         "token in the channel segment is malformed");
  }
  int rc = gpuipc__runtime_dir(dir, sizeof(dir));
  if (rc != 0)
    return rc;
  int n = snprintf(out, cap, "%s/chan-%.*s.sock", dir,
                   GPUIPC__CHAN_TOKEN_LEN, token);
  if (n < 0 || (size_t)n >= cap)
    return gpuipc__err(-ENAMETOOLONG, "gpuipc_channel_open: socket path in "
                       "%s is too long", dir);
  return 0;
}

struct hello {
  uint32_t magic;
  uint32_t pid;
};

/*
 * Receive the peer's hello (@magic, from @pid) on @fd within @timeout_ms,
 * with its eventfd in *@efd. Returns 1 when it came, 0 when something else
 * did (a stranger's word, a hang-up, nothing in time), or GPUIPC_E_PROTO
 * when the hello came without a non-blocking eventfd.
 */
static int hello_recv(struct gpuipc_channel *ch, int fd, uint32_t magic,
                      uint32_t pid, int timeout_ms, int *efd)
{
  struct hello h;
  int fds[1] = {-1}, nfds = 1;
  ssize_t n = gpuipc__sock_recv(fd, &h, sizeof(h), fds, &nfds, timeout_ms);
  if (n < 0)
    return n == -ETIMEDOUT ? -ETIMEDOUT : 0;
  int got = nfds > 0 ? fds[0] : -1;
  if (n != (ssize_t)sizeof(h) || h.magic != magic || h.pid != pid) {
    gpuipc__fd_close(&got);
    return 0;
  }
  int rc = got < 0 ? gpuipc__err(GPUIPC_E_PROTO, "gpuipc_channel_open: "
                                 "channel %s: the peer's hello carries no "
                                 "eventfd (an older gpuipc?)", ch->name)
                   : gpuipc__chan_efd_check(got, ch->name);
  if (rc != 0) {
    gpuipc__fd_close(&got);
    return rc;
  }
  *efd = got;
  return 1;
}

/* This end is @end, talking to process @pid on @fd, whose eventfd is @efd. */
static int paired(struct gpuipc_channel *ch, int end, int fd, int efd,
                  uint32_t pid)
{
  ch->end = end;
  ch->sock = fd;
  ch->peer_efd = efd;
  ch->peer_pid = (pid_t)pid;
  /* Its exit is then one poll() away; without (old kernels), /proc. */
  int pfd = gpuipc__pidfd_open((pid_t)pid);
  ch->peer_pidfd = pfd >= 0 ? pfd : -1;
  return PAIRED;
}

static int hello_send(struct gpuipc_channel *ch, int fd, uint32_t magic)
{
  struct hello h = {magic, (uint32_t)getpid()};
  int efd = gpuipc__chan_hello_fd(ch);
  return gpuipc__sock_send(fd, &h, sizeof(h), &efd, 1, 1000);
}

static _Atomic(gpuipc__chan_hook_fn *) test_hook;

void gpuipc__chan_test_hook(gpuipc__chan_hook_fn *fn)
{
  atomic_store(&test_hook, fn);
}

void gpuipc__chan_hook(const char *name, int where)
{
  gpuipc__chan_hook_fn *fn = atomic_load(&test_hook);
  if (fn != NULL)
    fn(name, where);
}

/*
 * Unlink @segname, but only while it names the segment in ch->seg: a name
 * given meanwhile to a newer segment is left alone. @why is for the log.
 */
static void unlink_ours(struct gpuipc_channel *ch, gpuipc_domain_t *dom,
                        const char *segname, const char *why)
{
  int rc = gpuipc__segment_unlink_held(dom, segname, ch->seg);
  if (rc != 0 && rc != -ENOENT)
    GPUIPC_LOG_W("channel %s: unlinking segment %s (%s): %s", ch->name,
                 segname, why, gpuipc_last_error());
}

static int be_a(struct gpuipc_channel *ch, gpuipc_domain_t *dom,
                const char *segname, const struct gpuipc__chan_cfg *c,
                uint64_t deadline)
{
  struct gpuipc__chan_shm *shm = ch->shm;
  atomic_store(&shm->state, GPUIPC__CHAN_A_INIT);
  atomic_store(&shm->b_pid, 0);
  atomic_store(&shm->closed[0], 0);
  atomic_store(&shm->closed[1], 0);
  for (int e = 0; e < 2; e++) {
    atomic_store(&shm->settled[e], GPUIPC__CHAN_SETTLED_NOT);
    atomic_store(&shm->ev_use[e].in_use, 0);
  }
  memset((void *)shm->dir, 0, sizeof(shm->dir));
  atomic_store(&shm->poll[0].armed, 0);
  atomic_store(&shm->poll[1].armed, 0);
  shm->magic = GPUIPC__CHAN_MAGIC;
  shm->version = GPUIPC__CHAN_VERSION;
  shm->dir[0].depth = c->depth;
  char token[GPUIPC__CHAN_TOKEN_LEN + 1], path[PATH_MAX];
  int lfd = -1, fd = -1, peer_efd = -1;
  token_make(token);
  int rc = sock_path(token, path, sizeof(path));
  if (rc != 0)
    goto give_up;
  rc = gpuipc__rundir_listen(path, 4, &lfd);
  if (rc != 0)
    goto give_up;
  memcpy(shm->token, token, sizeof(token));
  atomic_store(&shm->state, GPUIPC__CHAN_A_READY);
  gpuipc__futex_wake((uint32_t *)&shm->state, INT_MAX);
  uint32_t b = 0;
  for (;;) {
    int left = gpuipc__ms_left(deadline);
    if (deadline != UINT64_MAX && left <= 0) {
      rc = gpuipc__err(-ETIMEDOUT, "gpuipc_channel_open: nobody opened "
                       "channel %s in time", ch->name);
      goto unlink_sock;
    }
    rc = gpuipc__sock_accept(lfd, left < 0 || left > 50 ? 50 : left, &fd);
    if (rc == -ETIMEDOUT) {
      b = atomic_load(&shm->b_pid);
      if (b != 0 && !gpuipc__pid_alive((pid_t)b))
        atomic_compare_exchange_strong(&shm->b_pid, &b, 0);
      continue;
    }
    if (rc != 0)
      goto unlink_sock;
    struct gpuipc__cred cred;
    b = atomic_load(&shm->b_pid);
    if (gpuipc__peer_cred(fd, &cred) != 0 || b == 0 ||
        (uint32_t)cred.pid != b) {
      gpuipc__fd_close(&fd); /* not the process that claimed end B */
      continue;
    }
    /* B says hello on connecting: a second is plenty. */
    rc = hello_recv(ch, fd, HELLO_B_MAGIC, b, 1000, &peer_efd);
    if (rc < 0 && rc != -ETIMEDOUT)
      goto close_fd;
    if (rc <= 0) {
      gpuipc__fd_close(&fd); /* B went, or never spoke: wait for another */
      continue;
    }
    atomic_store(&shm->state, GPUIPC__CHAN_PAIRED);
    if (hello_send(ch, fd, HELLO_MAGIC) != 0) {
      gpuipc__fd_close(&fd);
      gpuipc__fd_close(&peer_efd);
      atomic_store(&shm->state, GPUIPC__CHAN_A_READY); /* B never heard */
      continue;
    }
    break;
  }
  gpuipc__chan_hook(ch->name, GPUIPC__CHAN_HOOK_PAIRED);
  unlink(path);
  gpuipc__fd_close(&lfd);
  unlink_ours(ch, dom, segname, "as end A");
  return paired(ch, 0, fd, peer_efd, b);

close_fd:
  gpuipc__fd_close(&fd);
unlink_sock:
  unlink(path);
  gpuipc__fd_close(&lfd);
give_up:
  /* Let the next opener take end A at once. */
  atomic_store(&shm->state, GPUIPC__CHAN_FREE);
  atomic_store(&shm->a_pid, 0);
  return rc;
}

static int be_b(struct gpuipc_channel *ch, const struct gpuipc__chan_cfg *c,
                uint64_t deadline)
{
  struct gpuipc__chan_shm *shm = ch->shm;
  uint32_t me = (uint32_t)getpid();
  uint32_t a;
  for (;;) {
    uint32_t st = atomic_load(&shm->state);
    a = atomic_load(&shm->a_pid);
    if (a == 0 || (a != me && !gpuipc__pid_alive((pid_t)a)))
      return RETRY; /* gpuipc__chan_rendezvous() takes end A over, unless
                       PAIRED */
    if (st == GPUIPC__CHAN_A_READY)
      break;
    if (st == GPUIPC__CHAN_PAIRED)
      return RETRY; /* a pair is unlinking the name */
    int left = gpuipc__ms_left(deadline);
    if (deadline != UINT64_MAX && left <= 0)
      return gpuipc__err(-ETIMEDOUT, "gpuipc_channel_open: channel %s: "
                         "pid %u did not get ready in time", ch->name, a);
    gpuipc__futex_wait((uint32_t *)&shm->state, st,
                       left < 0 || left > 20 ? 20 : left);
  }
  if (shm->magic != GPUIPC__CHAN_MAGIC)
    return gpuipc__err(GPUIPC_E_PROTO, "gpuipc_channel_open: segment of "
                       "channel %s has magic 0x%08x", ch->name, shm->magic);
  if (shm->version != GPUIPC__CHAN_VERSION)
    return gpuipc__err(GPUIPC_E_VERSION, "gpuipc_channel_open: channel %s "
                       "speaks version %u, this library %u", ch->name,
                       shm->version, GPUIPC__CHAN_VERSION);
  uint32_t zero = 0;
  if (!atomic_compare_exchange_strong(&shm->b_pid, &zero, me))
    return RETRY;
  shm->dir[1].depth = c->depth;
  char token[GPUIPC__CHAN_TOKEN_LEN + 1], path[PATH_MAX];
  memcpy(token, shm->token, GPUIPC__CHAN_TOKEN_LEN);
  token[GPUIPC__CHAN_TOKEN_LEN] = '\0';
  int fd = -1, peer_efd = -1;
  int rc = sock_path(token, path, sizeof(path));
  if (rc != 0)
    goto unclaim;
  rc = gpuipc__sock_connect(path, HANDSHAKE_MS, &fd);
  if (rc != 0)
    goto unclaim_retry;
  if (hello_send(ch, fd, HELLO_B_MAGIC) != 0)
    goto close_retry;
  /* timeout_ms 0 waits for no peer, but lets one that was ready finish. */
  if (c->timeout_ms == 0)
    deadline = gpuipc__deadline(HANDSHAKE_MS);
  for (;;) {
    int left = gpuipc__ms_left(deadline);
    rc = hello_recv(ch, fd, HELLO_MAGIC, a, left < 0 || left > 50 ? 50 : left,
                    &peer_efd);
    if (rc == 1)
      break;
    if (rc == -ETIMEDOUT) {
      if (!gpuipc__chan_past(deadline) && gpuipc__pid_alive((pid_t)a))
        continue;
      rc = gpuipc__err(-ETIMEDOUT, "gpuipc_channel_open: channel %s: pid "
                       "%u did not accept in time", ch->name, a);
      goto close_fd;
    }
    if (rc < 0)
      goto close_fd; /* A's hello carried no eventfd */
    goto close_retry; /* refused, or a stranger's word */
  }
  return paired(ch, 1, fd, peer_efd, a);

close_retry:
  gpuipc__fd_close(&fd);
unclaim_retry:
  atomic_compare_exchange_strong(&shm->b_pid, &me, 0);
  return RETRY;
close_fd:
  gpuipc__fd_close(&fd);
unclaim:
  atomic_compare_exchange_strong(&shm->b_pid, &me, 0);
  return rc;
}

/* One attempt on the segment in ch->seg. */
int gpuipc__chan_rendezvous(struct gpuipc_channel *ch, gpuipc_domain_t *dom,
                            const char *segname,
                            const struct gpuipc__chan_cfg *c, uint64_t deadline)
{
  struct gpuipc__chan_shm *shm = ch->shm;
  uint32_t me = (uint32_t)getpid();
  uint32_t a = atomic_load(&shm->a_pid);
  bool a_gone = a == 0 || (a != me && !gpuipc__pid_alive((pid_t)a));
  /* Read after A's liveness: a dead A marks nothing PAIRED any more. */
  if (atomic_load(&shm->state) == GPUIPC__CHAN_PAIRED) {
    if (a_gone && a != 0)
      unlink_ours(ch, dom, segname, "end A died before unlinking it");
    return RETRY; /* a pair's, maybe in use: open the name afresh */
  }
  if (a_gone) {
    if (!atomic_compare_exchange_strong(&shm->a_pid, &a, me))
      return RETRY;
    return be_a(ch, dom, segname, c, deadline);
  }
  return be_b(ch, c, deadline);
}
