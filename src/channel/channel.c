/*
 * Channels: rendezvous, send, receive, release, flow control.
 *
 * Rendezvous. Both openers open the HOST segment "chan.NAME" with CREATE.
 * The first to win a CAS on a_pid (0, or a dead process's pid, -> its own)
 * is end A: it lays out the rings, listens on DIR/chan-TOKEN.sock (TOKEN
 * random, written into the segment) and sets state A_READY. The next opener
 * wins a CAS on b_pid, writes its depth, connects and waits for A's word;
 * A accepts only the process whose pid (SO_PEERCRED) is b_pid. A then
 * marks the segment PAIRED (before its word, so B never pairs with a
 * segment not marked), removes the socket file and unlinks the segment's
 * name, so the name pairs the next two openers afresh; the two ends keep
 * the memory mapped. A PAIRED segment is never taken over: an opener that
 * finds one (it may have mapped it just before the name was unlinked)
 * drops it and opens the name afresh; if A died before unlinking the name,
 * that opener unlinks it -- only while the name still names that segment,
 * never a newer one of the same name. Openers that lose a race, or find a
 * pair still unlinking the name, retry until their timeout.
 *
 * Data path. Each direction has a descriptor ring and a release ring in
 * the segment, single producer and single consumer each. Message s of a
 * direction is the s-th descriptor (s = 1, 2, ...); the sender keeps a
 * record of it at s % depth until it is free, so at most depth messages are
 * in flight, and the rings (GPUIPC__CHAN_DEPTH_MAX slots) never overflow.
 * A buffer's handle and fd go over the socket just before the first
 * descriptor that uses it (flag NEW_BUF): sendmsg has queued the message
 * at the receiver before the descriptor is published, so the receiver
 * reads it without waiting, and a NEW_BUF whose message is not there is a
 * broken peer (GPUIPC_E_PROTO at once). The sender remembers the 256
 * buffers the receiver holds and tells it to forget the least recently
 * used one when it needs room.
 *
 * Events. For GPU memory the sender records an event of its own (one per
 * device and record slot, exported once: NEW_EVENT carries the handle) on
 * its stream, and the receiver makes its stream wait for it. The receiver
 * records a release event the same way when it gives a GPU buffer back or
 * has copied out of one; the sender's record is free once that event has
 * completed. A slot's event is recorded again only for message s + depth,
 * which cannot be sent before message s is free.
 */
#include "channel/channel.h"
#include "cuda/cuda.h"
#include "domain/domain.h"
#include "mem/mem.h"
#include "os/os.h"
#include "wire/wire.h"

#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define HELLO_MAGIC 0x4f4c4548u /* "HELO" */
#define SEGMENT_PREFIX "chan."
#define STAGE_SLOTS_DEFAULT 4
#define STAGE_SLOT_BYTES_DEFAULT ((size_t)4 << 20)
#define BUFMSG_TIMEOUT_MS 5000 /* a sender's wait for room on the socket */

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

static uint64_t deadline_of(int timeout_ms)
{
  return timeout_ms == 0 ? 0 : gpuipc__deadline(timeout_ms);
}

static bool past(uint64_t deadline)
{
  return deadline != UINT64_MAX && gpuipc__now_ns() >= deadline;
}

static int name_check(const char *name)
{
  size_t n = strlen(name);
  if (n == 0 || n > GPUIPC_CHANNEL_NAME_MAX)
    return gpuipc__err(-EINVAL, "gpuipc_channel_open: channel name \"%.80s\" "
                       "must have 1 to %d characters", name,
                       GPUIPC_CHANNEL_NAME_MAX);
  if (name[0] == '.')
    return gpuipc__err(-EINVAL, "gpuipc_channel_open: channel name \"%s\" "
                       "must not start with '.'", name);
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
      return gpuipc__err(-EINVAL, "gpuipc_channel_open: channel name \"%s\" "
                         "has '%c' at %zu; allowed: A-Z a-z 0-9 . _ -",
                         name, c, i);
  }
  return 0;
}

static bool is_host_dev(int32_t t)
{
  return t == GPUIPC_DL_CPU || t == GPUIPC_DL_CUDA_HOST;
}

static int dev_count(void)
{
  int n = gpuipc_device_count();
  return n < 0 ? 0 : n > GPUIPC__CHAN_EV_DEVS ? GPUIPC__CHAN_EV_DEVS : n;
}

static void chan_unref(struct gpuipc_channel *ch);

/* ------------------------------------------------------------------------ */
/* Options                                                                  */
/* ------------------------------------------------------------------------ */

struct chan_cfg {
  int timeout_ms;
  uint32_t depth;
  int device;
  int send_timeout_ms;
  uint32_t stage_slots;
  size_t stage_slot_bytes;
};

static int opts_read(const gpuipc_channel_opts_t *o, gpuipc_domain_t *dom,
                     struct chan_cfg *c)
{
  static const char who[] = "gpuipc_channel_open";
  gpuipc_channel_opts_t v;
  memset(&v, 0, sizeof(v));
  if (o != NULL) {
    if (o->size < offsetof(gpuipc_channel_opts_t, timeout_ms))
      return gpuipc__err(-EINVAL, "%s: opts->size %zu is too small", who,
                         o->size);
    memcpy(&v, o, o->size < sizeof(v) ? o->size : sizeof(v));
    if (v.flags != 0)
      return gpuipc__err(-EINVAL, "%s: opts->flags 0x%x (must be 0)", who,
                         v.flags);
  }
  c->timeout_ms = v.timeout_ms != 0 ? v.timeout_ms : gpuipc__dom_timeout(dom);
  c->depth = v.depth != 0 ? v.depth : GPUIPC__CHAN_DEPTH_DEFAULT;
  if (c->depth > GPUIPC__CHAN_DEPTH_MAX || (c->depth & (c->depth - 1)) != 0)
    return gpuipc__err(-EINVAL, "%s: depth %u is not a power of two in "
                       "1..%d", who, c->depth, GPUIPC__CHAN_DEPTH_MAX);
  c->device = v.device_set ? v.device : -1;
  if (c->device < -1)
    return gpuipc__err(-EINVAL, "%s: device %d", who, c->device);
  if (v.send_timeout_ms < 0)
    return gpuipc__err(-EINVAL, "%s: send_timeout_ms %d (0 waits forever)",
                       who, v.send_timeout_ms);
  c->send_timeout_ms = v.send_timeout_ms;
  c->stage_slots = v.stage_slots != 0 ? v.stage_slots : STAGE_SLOTS_DEFAULT;
  if (c->stage_slots > 64)
    return gpuipc__err(-EINVAL, "%s: stage_slots %u exceeds 64", who,
                       c->stage_slots);
  c->stage_slot_bytes = v.stage_slot_bytes != 0 ? v.stage_slot_bytes
                                                : STAGE_SLOT_BYTES_DEFAULT;
  if (c->stage_slot_bytes > ((size_t)1 << 40) / c->stage_slots)
    return gpuipc__err(-EINVAL, "%s: stage_slot_bytes %zu is too large", who,
                       c->stage_slot_bytes);
  c->stage_slot_bytes = (c->stage_slot_bytes + 255) & ~(size_t)255;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Rendezvous                                                               */
/* ------------------------------------------------------------------------ */

enum { PAIRED = 0, RETRY = 1 };

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

static _Atomic(gpuipc__chan_hook_fn *) test_hook;

void gpuipc__chan_test_hook(gpuipc__chan_hook_fn *fn)
{
  atomic_store(&test_hook, fn);
}

static void hook(const char *name, int where)
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
                const char *segname, const struct chan_cfg *c,
                uint64_t deadline)
{
  struct gpuipc__chan_shm *shm = ch->shm;
  uint32_t me = (uint32_t)getpid();
  atomic_store(&shm->state, GPUIPC__CHAN_A_INIT);
  atomic_store(&shm->b_pid, 0);
  atomic_store(&shm->closed[0], 0);
  atomic_store(&shm->closed[1], 0);
  memset((void *)shm->dir, 0, sizeof(shm->dir));
  shm->magic = GPUIPC__CHAN_MAGIC;
  shm->version = GPUIPC__CHAN_VERSION;
  shm->dir[0].depth = c->depth;
  char token[GPUIPC__CHAN_TOKEN_LEN + 1], path[PATH_MAX];
  int lfd = -1, fd = -1;
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
    atomic_store(&shm->state, GPUIPC__CHAN_PAIRED);
    struct hello h = {HELLO_MAGIC, me};
    if (gpuipc__sock_send(fd, &h, sizeof(h), NULL, 0, 1000) != 0) {
      gpuipc__fd_close(&fd);
      atomic_store(&shm->state, GPUIPC__CHAN_A_READY); /* B never heard */
      continue;
    }
    break;
  }
  hook(ch->name, GPUIPC__CHAN_HOOK_PAIRED);
  unlink(path);
  gpuipc__fd_close(&lfd);
  unlink_ours(ch, dom, segname, "as end A");
  ch->end = 0;
  ch->sock = fd;
  ch->peer_pid = (pid_t)b;
  return PAIRED;

unlink_sock:
  unlink(path);
  gpuipc__fd_close(&lfd);
give_up:
  /* Let the next opener take end A at once. */
  atomic_store(&shm->state, GPUIPC__CHAN_FREE);
  atomic_store(&shm->a_pid, 0);
  return rc;
}

static int be_b(struct gpuipc_channel *ch, const struct chan_cfg *c,
                uint64_t deadline)
{
  struct gpuipc__chan_shm *shm = ch->shm;
  uint32_t me = (uint32_t)getpid();
  uint32_t a;
  for (;;) {
    uint32_t st = atomic_load(&shm->state);
    a = atomic_load(&shm->a_pid);
    if (a == 0 || (a != me && !gpuipc__pid_alive((pid_t)a)))
      return RETRY; /* rendezvous() takes end A over, unless PAIRED */
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
  int fd = -1;
  int rc = sock_path(token, path, sizeof(path));
  if (rc != 0)
    goto unclaim;
  rc = gpuipc__sock_connect(path, 1000, &fd);
  if (rc != 0)
    goto unclaim_retry;
  for (;;) {
    struct hello h;
    int left = gpuipc__ms_left(deadline);
    ssize_t n = gpuipc__sock_recv(fd, &h, sizeof(h), NULL, NULL,
                                  left < 0 || left > 50 ? 50 : left);
    if (n == (ssize_t)sizeof(h) && h.magic == HELLO_MAGIC && h.pid == a)
      break;
    if (n == -ETIMEDOUT) {
      if (!past(deadline) && gpuipc__pid_alive((pid_t)a))
        continue;
      rc = gpuipc__err(-ETIMEDOUT, "gpuipc_channel_open: channel %s: pid "
                       "%u did not accept in time", ch->name, a);
      goto close_fd;
    }
    goto close_retry; /* refused, or a stranger's word */
  }
  ch->end = 1;
  ch->sock = fd;
  ch->peer_pid = (pid_t)a;
  return PAIRED;

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
static int rendezvous(struct gpuipc_channel *ch, gpuipc_domain_t *dom,
                      const char *segname, const struct chan_cfg *c,
                      uint64_t deadline)
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

static int chan_setup(struct gpuipc_channel *ch, const struct chan_cfg *c)
{
  struct gpuipc__chan_shm *shm = ch->shm;
  int e = ch->end;
  uint32_t peer_depth = shm->dir[1 - e].depth;
  if (peer_depth == 0 || peer_depth > GPUIPC__CHAN_DEPTH_MAX ||
      (peer_depth & (peer_depth - 1)) != 0)
    return gpuipc__err(GPUIPC_E_PROTO, "gpuipc_channel_open: channel %s: "
                       "the peer's depth %u is not a power of two in 1..%d",
                       ch->name, peer_depth, GPUIPC__CHAN_DEPTH_MAX);
  snprintf(ch->who, sizeof(ch->who), "channel %s (peer pid %d)", ch->name,
           (int)ch->peer_pid);
  ch->txd = &shm->dir[e];
  ch->rxd = &shm->dir[1 - e];
  ch->tx_ring = ch->base + GPUIPC__CHAN_DESC_OFF(e);
  ch->rx_ring = ch->base + GPUIPC__CHAN_DESC_OFF(1 - e);
  ch->tx_rel = ch->base + GPUIPC__CHAN_REL_OFF(e);
  ch->rx_rel = ch->base + GPUIPC__CHAN_REL_OFF(1 - e);
  ch->tx.depth = c->depth;
  ch->tx.next_seq = 1;
  ch->tx.oldest = 1;
  ch->tx.next_key = 1;
  ch->tx.recs = calloc(c->depth, sizeof(*ch->tx.recs));
  ch->rx.depth = peer_depth;
  ch->rx.expect_seq = 1;
  if (ch->tx.recs == NULL)
    return gpuipc__err(-ENOMEM, "gpuipc_channel_open: out of memory");
  return 0;
}

int gpuipc_channel_open(gpuipc_domain_t *dom, const char *name,
                        const gpuipc_channel_opts_t *opts,
                        gpuipc_channel_t **out)
{
  if (dom == NULL || name == NULL || out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_channel_open: NULL %s",
                       dom == NULL ? "domain" : name == NULL ? "name" : "out");
  int rc = name_check(name);
  if (rc != 0)
    return rc;
  struct chan_cfg c;
  rc = opts_read(opts, dom, &c);
  if (rc != 0)
    return rc;
  char segname[GPUIPC_NAME_MAX + 1];
  snprintf(segname, sizeof(segname), SEGMENT_PREFIX "%s", name);

  struct gpuipc_channel *ch = calloc(1, sizeof(*ch));
  if (ch == NULL)
    return gpuipc__err(-ENOMEM, "gpuipc_channel_open: out of memory");
  atomic_init(&ch->refs, 1);
  snprintf(ch->name, sizeof(ch->name), "%s", name);
  ch->sock = -1;
  ch->device = c.device;
  ch->send_timeout_ms = c.send_timeout_ms;
  ch->stage_slots = c.stage_slots;
  ch->stage_slot_bytes = c.stage_slot_bytes;
  pthread_mutex_init(&ch->tx.lock, NULL);
  pthread_mutex_init(&ch->rx.lock, NULL);
  pthread_mutex_init(&ch->rx.rel_lock, NULL);

  uint64_t deadline = gpuipc__deadline(c.timeout_ms);
  for (;;) {
    gpuipc_buf_t *seg = NULL;
    /* Scratch: the rendezvous inside it starts from the zeroes of a new
     * memfd and orders itself. */
    gpuipc_segment_opts_t so = GPUIPC_SEGMENT_OPTS_INIT;
    so.bytes = GPUIPC__CHAN_SEG_BYTES;
    so.kind = GPUIPC_KIND_HOST;
    so.flags = GPUIPC_CREATE | GPUIPC_SCRATCH;
    rc = gpuipc_segment_open(dom, segname, &so, &seg);
    if (rc != 0)
      goto free_ch;
    if (gpuipc_buf_kind(seg) != GPUIPC_KIND_HOST ||
        gpuipc_buf_size(seg) < GPUIPC__CHAN_SEG_BYTES) {
      gpuipc_buf_release(seg);
      rc = gpuipc__err(GPUIPC_E_MISMATCH, "gpuipc_channel_open: segment %s "
                       "exists and is not a channel's", segname);
      goto free_ch;
    }
    ch->seg = seg;
    ch->base = gpuipc_buf_ptr(seg);
    ch->shm = (struct gpuipc__chan_shm *)ch->base;
    hook(name, GPUIPC__CHAN_HOOK_MAPPED);
    rc = rendezvous(ch, dom, segname, &c, deadline);
    if (rc == PAIRED)
      break;
    ch->seg = NULL;
    ch->shm = NULL;
    ch->base = NULL;
    gpuipc_buf_release(seg);
    if (rc < 0)
      goto free_ch;
    if (past(deadline)) {
      rc = gpuipc__err(-ETIMEDOUT, "gpuipc_channel_open: channel %s: no "
                       "peer in time", name);
      goto free_ch;
    }
    gpuipc__sleep_us(1000);
  }
  rc = chan_setup(ch, &c);
  if (rc != 0)
    goto free_ch;
  GPUIPC_LOG_D("channel %s: end %d, peer pid %d, depth %u/%u", name,
               ch->end, (int)ch->peer_pid, ch->tx.depth, ch->rx.depth);
  *out = ch;
  return 0;

free_ch:
  chan_unref(ch); /* the only reference: closes and frees what there is */
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Events                                                                   */
/* ------------------------------------------------------------------------ */

/* Our event for (@dev, @slot) in @pool, created on first use. */
static int event_get(gpuipc_event_t ***pool, uint8_t **sent, int *ndev,
                     uint32_t depth, int dev, uint32_t slot,
                     gpuipc_event_t **out, bool *is_new)
{
  if (*pool == NULL) {
    int n = dev_count();
    if (n <= 0)
      return gpuipc__err(GPUIPC_E_NODEVICE, "channel: no CUDA device for an "
                         "event");
    *pool = calloc((size_t)n * depth, sizeof(**pool));
    *sent = calloc((size_t)n * depth, 1);
    if (*pool == NULL || *sent == NULL) {
      free(*pool);
      free(*sent);
      *pool = NULL;
      *sent = NULL;
      return gpuipc__err(-ENOMEM, "channel: out of memory for events");
    }
    *ndev = n;
  }
  if (dev < 0 || dev >= *ndev)
    return gpuipc__err(-ERANGE, "channel: device %d has no event slot", dev);
  size_t i = (size_t)dev * depth + slot;
  if ((*pool)[i] == NULL) {
    int rc = gpuipc_event_create(dev, 0, &(*pool)[i]);
    if (rc != 0)
      return rc;
  }
  *out = (*pool)[i];
  *is_new = !(*sent)[i];
  return 0;
}

static void event_pool_free(gpuipc_event_t **pool, uint8_t *sent, int ndev,
                            uint32_t depth)
{
  if (pool != NULL)
    for (size_t i = 0; i < (size_t)ndev * depth; i++)
      if (pool[i] != NULL)
        gpuipc_event_release(pool[i]);
  free(pool);
  free(sent);
}

static int pack_event(gpuipc_event_t *ev, uint8_t dst[GPUIPC_EVENT_HANDLE_PACKED_SIZE])
{
  gpuipc_event_handle_t h;
  int rc = gpuipc_event_export(ev, &h);
  if (rc != 0)
    return rc;
  rc = gpuipc_event_handle_pack(&h, dst, GPUIPC_EVENT_HANDLE_PACKED_SIZE);
  return rc < 0 ? rc : 0;
}

static bool same_event(const gpuipc_event_handle_t *a,
                       const gpuipc_event_handle_t *b)
{
  return a->event_id == b->event_id && a->pid == b->pid &&
         a->pidns == b->pidns && a->nonce == b->nonce &&
         memcmp(a->boot_id, b->boot_id, sizeof(a->boot_id)) == 0 &&
         memcmp(a->bytes, b->bytes, sizeof(a->bytes)) == 0;
}

/*
 * The peer's event @key from table (@tab, @n, @cap), opened for local
 * device @dev (-1: the GPU the handle names). @packed, when not NULL, is
 * the handle the peer sends with the key's first use; a key keeps its
 * event for the life of the channel (a second, different handle for it is
 * a protocol error). The event is opened on each device that asks for it,
 * once (an open costs about 200 us).
 */
static int event_peer(struct gpuipc__event **tab, int *n, int *cap,
                      uint32_t key, const uint8_t *packed, int dev,
                      const char *who, gpuipc_event_t **out)
{
  gpuipc_event_handle_t h;
  int rc, any = -1;
  if (packed != NULL) {
    rc = gpuipc_event_handle_unpack(packed, GPUIPC_EVENT_HANDLE_PACKED_SIZE,
                                    &h);
    if (rc != 0)
      return gpuipc__err(GPUIPC_E_PROTO, "%s: malformed event handle for "
                         "key %u", who, key);
  }
  for (int i = 0; i < *n; i++) {
    struct gpuipc__event *e = &(*tab)[i];
    if (e->key != key)
      continue;
    if (packed != NULL && !same_event(&e->h, &h))
      return gpuipc__err(GPUIPC_E_PROTO, "%s: event key %u was sent again "
                         "for another event", who, key);
    if (e->dev == dev || dev < 0) {
      *out = e->ev;
      return 0;
    }
    any = i;
  }
  if (packed == NULL) {
    if (any < 0)
      return gpuipc__err(GPUIPC_E_PROTO, "%s: event key %u was never sent",
                         who, key);
    h = (*tab)[any].h;
  }
  if (*n == *cap) {
    int ncap = *cap ? *cap * 2 : 16;
    if (ncap > 4 * GPUIPC__CHAN_EV_DEVS * GPUIPC__CHAN_DEPTH_MAX)
      return gpuipc__err(GPUIPC_E_PROTO, "%s: too many events", who);
    struct gpuipc__event *t = realloc(*tab, (size_t)ncap * sizeof(*t));
    if (t == NULL)
      return gpuipc__err(-ENOMEM, "%s: out of memory", who);
    *tab = t;
    *cap = ncap;
  }
  gpuipc_event_t *ev;
  rc = gpuipc_event_import(&h, dev, &ev);
  if (rc != 0)
    return rc;
  struct gpuipc__event *e = &(*tab)[(*n)++];
  e->key = key;
  e->dev = gpuipc_event_device(ev);
  e->ev = ev;
  e->h = h;
  *out = ev;
  return 0;
}

static void event_tab_free(struct gpuipc__event *tab, int n)
{
  for (int i = 0; i < n; i++)
    gpuipc_event_release(tab[i].ev);
  free(tab);
}

/* ------------------------------------------------------------------------ */
/* Sending side                                                             */
/* ------------------------------------------------------------------------ */

static void tx_rec_free(struct gpuipc_channel *ch, struct gpuipc__tx_rec *r)
{
  if (r->buf != NULL)
    gpuipc_buf_release(r->buf);
  if (r->stage >= 0 && ch->tx.stage != NULL)
    ch->tx.stage[r->stage].busy &= ~(1ull << r->slot);
  memset(r, 0, sizeof(*r));
  r->stage = -1;
  r->slot = -1;
}

/* Take in the releases the receiver has published. Returns how many. */
static int tx_take(struct gpuipc_channel *ch)
{
  struct gpuipc__tx *tx = &ch->tx;
  const char *who = ch->who;
  if (tx->err != 0)
    return gpuipc__err(tx->err, "channel %s: the peer broke the protocol "
                       "earlier", ch->name);
  uint32_t h = atomic_load_explicit(&ch->txd->rel_head, memory_order_acquire);
  uint32_t avail = h - tx->rel_tail;
  if (avail == 0)
    return 0;
  if (avail > tx->depth) {
    tx->err = GPUIPC_E_PROTO;
    return gpuipc__err(GPUIPC_E_PROTO, "%s: %u releases published, more than "
                       "the %u messages that can be in flight", who, avail,
                       tx->depth);
  }
  int taken = 0;
  while (tx->rel_tail != h) {
    uint8_t slot[GPUIPC__CHAN_REL_BYTES];
    memcpy(slot,
           ch->tx_rel + (size_t)(tx->rel_tail % GPUIPC__CHAN_DEPTH_MAX) *
                            GPUIPC__CHAN_REL_BYTES,
           sizeof(slot));
    struct gpuipc__rel rl;
    int rc = gpuipc__rel_decode(slot, sizeof(slot), &rl, who);
    struct gpuipc__tx_rec *r = &tx->recs[rl.seq % tx->depth];
    if (rc == 0 && (rl.seq < tx->oldest || rl.seq >= tx->next_seq ||
                    r->seq != rl.seq || r->released))
      rc = gpuipc__err(GPUIPC_E_PROTO, "%s: release of message %llu, which "
                       "is not in flight", who, (unsigned long long)rl.seq);
    gpuipc_event_t *ev = NULL;
    /* Opened where the sender's streams most likely wait: the buffer's GPU. */
    if (rc == 0 && (rl.flags & GPUIPC__REL_EVENT))
      rc = event_peer(&tx->rel_evs, &tx->nrel_evs, &tx->caprel_evs, rl.ev_key,
                      (rl.flags & GPUIPC__REL_NEW_EVENT) ? rl.ev_handle : NULL,
                      r->buf != NULL ? gpuipc_buf_device(r->buf) : -1, who,
                      &ev);
    if (rc != 0) {
      tx->err = rc == GPUIPC_E_PROTO ? rc : tx->err;
      return rc;
    }
    r->released = true;
    r->rel_ev = ev;
    r->rel_key = rl.ev_key;
    tx->rel_tail++;
    taken++;
    if (tx->cb != NULL)
      tx->cb(ch, rl.seq, tx->cb_user);
  }
  return taken;
}

/* Free the oldest messages whose buffers are free again. */
static int tx_recycle(struct gpuipc_channel *ch)
{
  struct gpuipc__tx *tx = &ch->tx;
  while (tx->oldest < tx->next_seq) {
    struct gpuipc__tx_rec *r = &tx->recs[tx->oldest % tx->depth];
    if (!r->released)
      break;
    if (r->rel_ev != NULL) {
      int q = gpuipc_event_query(r->rel_ev);
      if (q == -EAGAIN)
        break;
      if (q != 0)
        return q;
    }
    tx_rec_free(ch, r);
    tx->oldest++;
  }
  return 0;
}

/* Take releases in and recycle; how many were taken in, or an error. */
static int tx_progress(struct gpuipc_channel *ch)
{
  int n = tx_take(ch);
  if (n < 0)
    return n;
  int rc = tx_recycle(ch);
  return rc < 0 ? rc : n;
}

/*
 * Wait until @done(ch, arg) holds: releases are taken in between, and a
 * released message whose event is pending is polled.
 */
static bool pending_event(struct gpuipc_channel *ch, uint64_t ticket);

static int tx_wait(struct gpuipc_channel *ch, uint64_t deadline,
                   bool (*done)(struct gpuipc_channel *, uint64_t),
                   uint64_t arg, bool poll_events)
{
  uint64_t polling = 0; /* when polling a GPU event began */
  for (;;) {
    int rc = tx_progress(ch);
    if (rc < 0)
      return rc;
    if (done(ch, arg))
      return 0;
    /* A ticket of 0 stands for the oldest message in flight. */
    if (poll_events && pending_event(ch, arg != 0 ? arg : ch->tx.oldest)) {
      /* The GPU still works on a released buffer: poll its event. */
      if (deadline == 0)
        return -EAGAIN;
      if (past(deadline))
        return -ETIMEDOUT;
      /* Copies end within microseconds: yield first, sleep after 200 us. */
      uint64_t now = gpuipc__now_ns();
      if (polling == 0)
        polling = now;
      if (now - polling < 200000)
        sched_yield();
      else
        gpuipc__sleep_us(20);
      continue;
    }
    rc = gpuipc__chan_wait(ch, &ch->txd->rel_head, ch->tx.rel_tail,
                           &ch->txd->send_sleep, deadline);
    if (rc != 0)
      return rc;
  }
}

static bool has_room(struct gpuipc_channel *ch, uint64_t unused)
{
  struct gpuipc__tx *tx = &ch->tx;
  return tx->next_seq - tx->oldest < tx->depth;
}

static bool ticket_free(struct gpuipc_channel *ch, uint64_t ticket)
{
  struct gpuipc__tx *tx = &ch->tx;
  if (ticket < tx->oldest)
    return true;
  struct gpuipc__tx_rec *r = &tx->recs[ticket % tx->depth];
  return r->released &&
         (r->rel_ev == NULL || gpuipc_event_query(r->rel_ev) == 0);
}

static bool ticket_released(struct gpuipc_channel *ch, uint64_t ticket)
{
  struct gpuipc__tx *tx = &ch->tx;
  return ticket < tx->oldest || tx->recs[ticket % tx->depth].released;
}

/* Whether waiting for @ticket means polling a GPU event. */
static bool pending_event(struct gpuipc_channel *ch, uint64_t ticket)
{
  struct gpuipc__tx *tx = &ch->tx;
  if (ticket < tx->oldest || ticket >= tx->next_seq)
    return false;
  struct gpuipc__tx_rec *r = &tx->recs[ticket % tx->depth];
  return r->released && r->rel_ev != NULL;
}

/* When a blocked send gives up (send_timeout_ms; 0 waits forever). */
static uint64_t send_deadline(const struct gpuipc_channel *ch)
{
  return ch->send_timeout_ms > 0 ? gpuipc__deadline(ch->send_timeout_ms)
                                 : UINT64_MAX;
}

/* Room for one more message (flow control). */
static int tx_room(struct gpuipc_channel *ch, unsigned flags)
{
  struct gpuipc__tx *tx = &ch->tx;
  int rc = tx_progress(ch);
  if (rc < 0)
    return rc;
  if (has_room(ch, 0))
    return 0;
  if (flags & GPUIPC_SEND_NONBLOCK)
    return gpuipc__err(-EAGAIN, "gpuipc_channel_send: channel %s has %u messages in "
                       "flight, its depth", ch->name, tx->depth);
  rc = tx_wait(ch, send_deadline(ch), has_room, 0, true);
  if (rc == -ETIMEDOUT)
    return gpuipc__err(-ETIMEDOUT, "gpuipc_channel_send: channel %s: %u messages "
                       "in flight and none given back within %d ms",
                       ch->name, tx->depth, ch->send_timeout_ms);
  return rc;
}

/* A free staging slot on area @area (0: host, d + 1: device d). */
static int stage_get(struct gpuipc_channel *ch, int area, unsigned flags,
                     int *slot_out)
{
  struct gpuipc__tx *tx = &ch->tx;
  if (tx->stage == NULL) {
    int n = dev_count();
    tx->stage = calloc((size_t)n + 1, sizeof(*tx->stage));
    if (tx->stage == NULL)
      return gpuipc__err(-ENOMEM, "gpuipc_channel_send: out of memory");
    tx->ndev = n;
  }
  if (area > tx->ndev)
    return gpuipc__err(-ERANGE, "gpuipc_channel_send: device %d is not visible",
                       area - 1);
  struct gpuipc__stage *s = &tx->stage[area];
  if (s->buf == NULL) {
    int rc = gpuipc_buf_alloc(ch->stage_slots * ch->stage_slot_bytes,
                              area == 0 ? GPUIPC_KIND_HOST : GPUIPC_KIND_AUTO,
                              area - 1, 0, &s->buf);
    if (rc != 0)
      return rc;
  }
  uint64_t all = ch->stage_slots == 64 ? UINT64_MAX
                                        : (1ull << ch->stage_slots) - 1;
  uint64_t deadline = 0; /* set when the first wait begins */
  while ((s->busy & all) == all) {
    /* Every slot is in flight: wait until the oldest message is free. */
    if (flags & GPUIPC_SEND_NONBLOCK)
      return gpuipc__err(-EAGAIN, "gpuipc_channel_send: channel %s: all %u staging "
                         "slots are in flight", ch->name, ch->stage_slots);
    if (deadline == 0)
      deadline = send_deadline(ch);
    int rc = tx_wait(ch, deadline, ticket_free, tx->oldest, true);
    if (rc == -ETIMEDOUT)
      return gpuipc__err(-ETIMEDOUT, "gpuipc_channel_send: channel %s: no staging "
                         "slot came free within %d ms", ch->name,
                         ch->send_timeout_ms);
    if (rc != 0)
      return rc;
    rc = tx_recycle(ch);
    if (rc != 0)
      return rc;
  }
  int slot = __builtin_ctzll(~s->busy);
  *slot_out = slot;
  return 0;
}

/* The key the receiver knows @b by, or 0. */
static uint64_t known_find(struct gpuipc__tx *tx, const struct gpuipc_buf *b)
{
  int i = tx->last_known;
  if (i < tx->nknown && tx->known[i].export_id == b->export_id &&
      tx->known[i].nonce == b->nonce && tx->known[i].pid == b->pid) {
    tx->known[i].last_use = ++tx->clock;
    return tx->known[i].key;
  }
  for (i = 0; i < tx->nknown; i++) {
    struct gpuipc__known *k = &tx->known[i];
    if (k->export_id == b->export_id && k->nonce == b->nonce &&
        k->pid == b->pid) {
      k->last_use = ++tx->clock;
      tx->last_known = i;
      return k->key;
    }
  }
  return 0;
}

/*
 * Remember @b under a new key, evicting the least recently used entry
 * when full (its key in *@forget, else 0).
 */
static uint64_t known_add(struct gpuipc__tx *tx, const struct gpuipc_buf *b,
                          uint64_t *forget)
{
  int i = tx->nknown;
  *forget = 0;
  if (i == GPUIPC__CHAN_BUFS) {
    i = 0;
    for (int j = 1; j < tx->nknown; j++)
      if (tx->known[j].last_use < tx->known[i].last_use)
        i = j;
    *forget = tx->known[i].key;
  } else {
    tx->nknown++;
  }
  struct gpuipc__known *k = &tx->known[i];
  k->export_id = b->export_id;
  k->nonce = b->nonce;
  k->pid = b->pid;
  k->key = tx->next_key++;
  k->last_use = ++tx->clock;
  tx->last_known = i;
  return k->key;
}

/* Undo known_add when the message could not be sent. */
static void known_drop(struct gpuipc__tx *tx, uint64_t key)
{
  for (int i = 0; i < tx->nknown; i++)
    if (tx->known[i].key == key) {
      tx->known[i] = tx->known[--tx->nknown];
      tx->last_known = 0;
      return;
    }
}

/* Send @b's handle and fd to the receiver as @key. */
static int send_bufmsg(struct gpuipc_channel *ch, gpuipc_buf_t *b,
                       uint64_t key)
{
  gpuipc_handle_t h;
  int rc = gpuipc_buf_export(b, &h);
  if (rc != 0)
    return rc;
  uint8_t msg[GPUIPC__BUFMSG_BYTES];
  rc = gpuipc__bufmsg_encode(key, &h, msg, sizeof(msg));
  if (rc >= 0)
    rc = gpuipc__sock_send(ch->sock, msg, (size_t)rc, &h.fd, h.fd >= 0,
                           BUFMSG_TIMEOUT_MS);
  gpuipc__fd_close(&h.fd);
  if (rc == GPUIPC_E_PEER_GONE)
    atomic_store(&ch->gone, 1);
  return rc;
}

/*
 * The byte offset of @t's first element in its buffer @t->buf, whose
 * memory the data pointer must point into. -EINVAL naming @who.
 */
static int buf_offset(const char *who, const gpuipc_tensor_t *t,
                      uint64_t *offset)
{
  const gpuipc_dl_tensor_t *dl = &t->dl;
  uintptr_t base = (uintptr_t)gpuipc_buf_ptr(t->buf);
  uintptr_t p = (uintptr_t)dl->data;
  uint64_t size = gpuipc_buf_size(t->buf);
  if (p < base || p - base > size)
    return gpuipc__err(-EINVAL, "%s: data pointer %p lies outside the "
                       "buffer [%p, +%llu)", who, dl->data, (void *)base,
                       (unsigned long long)size);
  if (__builtin_add_overflow((uint64_t)(p - base), dl->byte_offset, offset))
    return gpuipc__err(-EINVAL, "%s: byte offset %llu overflows", who,
                       (unsigned long long)dl->byte_offset);
  return 0;
}

/* Check @t and fill the layout part of @d; the offset into its buffer. */
static int send_check(struct gpuipc_channel *ch, const gpuipc_tensor_t *t,
                      struct gpuipc__desc *d, uint64_t *span)
{
  static const char who[] = "gpuipc_channel_send";
  const gpuipc_dl_tensor_t *dl = &t->dl;
  if (dl->ndim < 0 || dl->ndim > GPUIPC_TENSOR_MAX_DIMS)
    return gpuipc__err(-EINVAL, "%s: ndim %d is outside 0..%d", who,
                       dl->ndim, GPUIPC_TENSOR_MAX_DIMS);
  if (dl->ndim > 0 && dl->shape == NULL)
    return gpuipc__err(-EINVAL, "%s: shape is NULL with ndim %d", who,
                       dl->ndim);
  if (dl->data == NULL)
    return gpuipc__err(-EINVAL, "%s: data is NULL", who);
  d->type = GPUIPC__DESC_TENSOR;
  d->ndim = (uint32_t)dl->ndim;
  d->dtype = dl->dtype;
  d->dev_type = dl->device.device_type;
  d->dev_id = dl->device.device_id;
  for (int i = 0; i < dl->ndim; i++)
    d->shape[i] = dl->shape[i];
  /* The tensor's own strides, or row-major (the staged copy is). */
  const int64_t *strides = t->buf != NULL ? dl->strides : NULL;
  int64_t compact = 1;
  for (int i = dl->ndim - 1; i >= 0; i--) {
    d->strides[i] = strides != NULL ? strides[i] : compact;
    if (dl->shape[i] > 0 && compact <= ((int64_t)1 << 56) / dl->shape[i])
      compact *= dl->shape[i];
  }
  if (t->buf != NULL) {
    int rc = buf_offset(who, t, &d->offset);
    if (rc != 0)
      return rc;
    return gpuipc__layout_check(-EINVAL, who, dl->dtype, dl->ndim, dl->shape,
                                dl->strides, d->offset,
                                gpuipc_buf_size(t->buf), span);
  }
  /* Staged: contiguous, fitting a slot. */
  int rc = gpuipc__layout_check(-EINVAL, who, dl->dtype, dl->ndim, dl->shape,
                                dl->strides, 0, GPUIPC_SIZE_MAX_ABSURD, span);
  if (rc != 0)
    return rc;
  if (!gpuipc__layout_compact(dl->ndim, dl->shape, dl->strides))
    return gpuipc__err(-EINVAL, "%s: memory gpuipc did not allocate is "
                       "staged, and must be contiguous (row-major)", who);
  if (*span > ch->stage_slot_bytes)
    return gpuipc__err(-EMSGSIZE, "%s: %llu bytes to stage exceed the "
                       "%zu-byte staging slot (stage_slot_bytes)", who,
                       (unsigned long long)*span, ch->stage_slot_bytes);
  if (!is_host_dev(dl->device.device_type) &&
      dl->device.device_type != GPUIPC_DL_CUDA)
    return gpuipc__err(-EINVAL, "%s: device type %d (CPU, CUDA or CUDA host "
                       "memory only)", who, dl->device.device_type);
  if (dl->device.device_type == GPUIPC_DL_CUDA &&
      (dl->device.device_id < 0 ||
       dl->device.device_id >= gpuipc_device_count()))
    return gpuipc__err(-EINVAL, "%s: CUDA device %d is not visible", who,
                       dl->device.device_id);
  return 0;
}

/*
 * How long to poll a peer's pending event before making a stream wait for
 * it (GPUIPC_CHAN_EVENT_POLL_US). A stream waiting on another process's
 * event on the same GPU waits for the GPU to switch between the two
 * processes' contexts (about 140 us on H200); an event that completes
 * within microseconds costs less to poll for.
 */
static uint64_t ev_poll_ns(void)
{
  long us = gpuipc__cfg_long(GPUIPC_CFG_CHAN_EVENT_POLL_US, 30);
  return (uint64_t)(us > 1000000 ? 1000000 : us) * 1000;
}

#if GPUIPC_HAVE_CUDA
/*
 * The local ordinal whose primary context @stream belongs to; @fallback
 * for a default stream (NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD: that
 * of the primary context of the device that uses the data, whatever
 * context is current) or when the driver cannot say. A stream of another
 * context gives its device, and the event calls then refuse it with a
 * sentence.
 */
static int stream_dev(void *stream, int fallback)
{
  if (gpuipc__stream_is_default(stream) ||
      gpuipc__cu.cuStreamGetCtx == NULL)
    return fallback;
  CUcontext sc = NULL;
  if (gpuipc__cu.cuStreamGetCtx((CUstream)stream, &sc) != CUDA_SUCCESS ||
      sc == NULL)
    return fallback;
  int n = gpuipc__dev_count();
  for (int i = 0; i < n; i++)
    if (__atomic_load_n(&gpuipc__dev_get(i)->primary, __ATOMIC_ACQUIRE) ==
        sc)
      return i;
  /* A context gpuipc has not retained: ask it for its device. */
  CUcontext cur = NULL;
  CUdevice cd;
  int dev = fallback;
  if (gpuipc__cu.cuCtxGetCurrent(&cur) != CUDA_SUCCESS)
    return fallback;
  if (gpuipc__cu.cuCtxSetCurrent(sc) == CUDA_SUCCESS &&
      gpuipc__cu.cuCtxGetDevice(&cd) == CUDA_SUCCESS)
    for (int i = 0; i < n; i++)
      if (gpuipc__dev_get(i)->cu_dev == cd)
        dev = i;
  gpuipc__cu.cuCtxSetCurrent(cur);
  return dev;
}

/*
 * Make @stream (a default stream: that of the event's device) wait for
 * @ev, unless its last record has completed already or completes
 * within @poll_ns: then the stream gets nothing to wait for and stays
 * idle, so that a release after it needs no event either.
 */
static int wait_on(gpuipc_event_t *ev, void *stream, uint64_t poll_ns)
{
  int q = gpuipc_event_query(ev);
  if (q == -EAGAIN && poll_ns > 0) {
    uint64_t end = gpuipc__now_ns() + poll_ns;
    while (q == -EAGAIN && gpuipc__now_ns() < end)
      q = gpuipc_event_query(ev);
  }
  if (q == 0)
    return 0;
  if (q != -EAGAIN)
    return q;
  return gpuipc_event_wait(ev, stream);
}

/*
 * Whether everything queued on @stream (a stream of device @dev) has
 * completed. Then a message or a release needs no event: what it orders
 * after is done already, and the peer has nothing to wait for. Asked in
 * the device's primary context, where a default stream (NULL, legacy,
 * per-thread: the calling thread's) is the one the event calls use.
 */
static bool stream_idle(int dev, void *stream)
{
  if (dev < 0 || gpuipc__cu.cuStreamQuery == NULL)
    return false;
  struct gpuipc__ctx_saved saved;
  if (gpuipc__ctx_enter(dev, &saved) != 0)
    return false;
  CUresult r = gpuipc__cu.cuStreamQuery((CUstream)stream);
  gpuipc__ctx_leave(&saved);
  return r == CUDA_SUCCESS;
}

static int copy_async(int dev, void *dst, const void *src, size_t n,
                      void *stream)
{
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(dev, &saved);
  if (rc != 0)
    return rc;
  rc = GPUIPC_CU(cuMemcpyAsync, (CUdeviceptr)(uintptr_t)dst,
                 (CUdeviceptr)(uintptr_t)src, n, (CUstream)stream);
  gpuipc__ctx_leave(&saved);
  return rc;
}
#else
static int stream_dev(void *stream, int fallback)
{
  return fallback;
}

static bool stream_idle(int dev, void *stream)
{
  return false;
}

static int wait_on(gpuipc_event_t *ev, void *stream, uint64_t poll_ns)
{
  return gpuipc_event_wait(ev, stream);
}

static int copy_async(int dev, void *dst, const void *src, size_t n,
                      void *stream)
{
  return gpuipc__err(GPUIPC_E_UNSUPPORTED, "channel: this build has no CUDA "
                     "support for device copies");
}
#endif

int gpuipc_channel_send(gpuipc_channel_t *ch, const gpuipc_tensor_t *t, void *stream,
                unsigned flags, uint64_t *ticket)
{
  if (ch == NULL || t == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_channel_send: NULL %s",
                       ch == NULL ? "channel" : "tensor");
  if (flags & ~GPUIPC_SEND_NONBLOCK)
    return gpuipc__err(-EINVAL, "gpuipc_channel_send: flags 0x%x", flags);
  struct gpuipc__desc d;
  memset(&d, 0, sizeof(d));
  uint64_t span = 0;
  int rc = send_check(ch, t, &d, &span);
  if (rc != 0)
    return rc;

  struct gpuipc__tx *tx = &ch->tx;
  pthread_mutex_lock(&tx->lock);
  rc = gpuipc__chan_peer_check(ch, false);
  if (rc != 0)
    goto unlock;
  rc = tx_room(ch, flags);
  if (rc != 0)
    goto unlock;
  uint64_t seq = tx->next_seq;
  gpuipc_buf_t *buf = t->buf;
  int area = -1, slot = -1, ev_dev = -1;
  if (buf == NULL) {
    const gpuipc_dl_tensor_t *dl = &t->dl;
    bool host = is_host_dev(dl->device.device_type);
    area = host ? 0 : dl->device.device_id + 1;
    rc = stage_get(ch, area, flags, &slot);
    if (rc != 0)
      goto unlock;
    buf = tx->stage[area].buf;
    d.offset = (uint64_t)slot * ch->stage_slot_bytes;
    uint8_t *dst = (uint8_t *)gpuipc_buf_ptr(buf) + d.offset;
    const uint8_t *src = (const uint8_t *)dl->data + dl->byte_offset;
    if (host) {
      if (span > 0)
        memcpy(dst, src, span);
    } else {
      ev_dev = dl->device.device_id;
      if (span > 0) {
        rc = copy_async(ev_dev, dst, src, span, stream);
        if (rc != 0)
          goto unlock;
      }
    }
    d.flags |= GPUIPC__DESC_STAGED;
  } else if (gpuipc_buf_kind(buf) != GPUIPC_KIND_HOST) {
    ev_dev = gpuipc_buf_device(buf);
  }
  d.seq = seq;
  d.buf_size = gpuipc_buf_size(buf);

  /* The buffer's handle, the first time the receiver sees it. */
  bool new_buf = false;
  d.buf_key = known_find(tx, buf);
  if (d.buf_key == 0) {
    d.buf_key = known_add(tx, buf, &d.forget_key);
    rc = send_bufmsg(ch, buf, d.buf_key);
    if (rc != 0) {
      known_drop(tx, d.buf_key);
      if (d.forget_key != 0)
        tx->err = rc; /* the evicted entry is lost: no way back */
      goto unlock;
    }
    if (d.forget_key != 0)
      d.flags |= GPUIPC__DESC_FORGET;
    d.flags |= GPUIPC__DESC_NEW_BUF;
    new_buf = true;
    tx->bufs_sent++;
  }

  /* Order the message after the sender's stream (unless it is idle). */
  uint8_t *ev_sent = NULL;
  if (ev_dev >= 0)
    ev_dev = stream_dev(stream, ev_dev);
  if (ev_dev >= 0 && !stream_idle(ev_dev, stream)) {
    uint32_t es = (uint32_t)(seq % tx->depth);
    gpuipc_event_t *ev;
    bool is_new;
    rc = event_get(&tx->ev, &tx->ev_sent, &tx->ndev, tx->depth, ev_dev, es,
                   &ev, &is_new);
    if (rc == 0 && is_new)
      rc = pack_event(ev, d.ev_handle);
    if (rc == 0)
      rc = gpuipc_event_record(ev, stream);
    if (rc != 0)
      goto broken;
    d.flags |= GPUIPC__DESC_EVENT | (is_new ? GPUIPC__DESC_NEW_EVENT : 0);
    d.ev_key = (uint32_t)ev_dev * GPUIPC__CHAN_DEPTH_MAX + es;
    if (is_new)
      ev_sent = &tx->ev_sent[(size_t)ev_dev * tx->depth + es];
  }

  struct gpuipc__tx_rec *r = &tx->recs[seq % tx->depth];
  r->seq = seq;
  r->released = false;
  r->rel_ev = NULL;
  gpuipc__buf_ref(buf);
  r->buf = buf;
  r->stage = area;
  r->slot = slot;
  if (area >= 0)
    tx->stage[area].busy |= 1ull << slot;

  uint32_t head = tx->head; /* ours: never read back from shared memory */
  uint8_t *dst = ch->tx_ring +
                 (size_t)(head % GPUIPC__CHAN_DEPTH_MAX) *
                     GPUIPC__CHAN_DESC_BYTES;
  rc = gpuipc__desc_encode(&d, dst, GPUIPC__CHAN_DESC_BYTES);
  if (rc < 0)
    goto broken;
  tx->head = head + 1;
  gpuipc__chan_publish(&ch->txd->head, tx->head, &ch->txd->recv_sleep);
  if (ev_sent != NULL)
    *ev_sent = 1;
  tx->next_seq++;
  tx->sent++;
  tx->last_key = d.buf_key;
  pthread_mutex_unlock(&tx->lock);
  if (ticket != NULL)
    *ticket = seq;
  return 0;

broken:
  /* A buffer message may be on the socket already: nothing can follow. */
  if (new_buf)
    tx->err = rc < 0 ? rc : GPUIPC_E_PROTO;
unlock:
  pthread_mutex_unlock(&tx->lock);
  return rc;
}

int gpuipc_channel_send_done(gpuipc_channel_t *ch, uint64_t ticket, int timeout_ms)
{
  if (ch == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_channel_send_done: NULL channel");
  struct gpuipc__tx *tx = &ch->tx;
  pthread_mutex_lock(&tx->lock);
  int rc = 0;
  if (ticket == 0 || ticket >= tx->next_seq) {
    rc = gpuipc__err(-EINVAL, "gpuipc_channel_send_done: ticket %llu was not sent "
                     "on channel %s", (unsigned long long)ticket, ch->name);
    goto unlock;
  }
  rc = tx_wait(ch, deadline_of(timeout_ms), ticket_free, ticket, true);
  if (rc == -EAGAIN)
    rc = gpuipc__err(-EAGAIN, "gpuipc_channel_send_done: message %llu is not free "
                     "yet", (unsigned long long)ticket);
  else if (rc == -ETIMEDOUT)
    rc = gpuipc__err(-ETIMEDOUT, "gpuipc_channel_send_done: message %llu was not "
                     "free within %d ms", (unsigned long long)ticket,
                     timeout_ms);
unlock:
  pthread_mutex_unlock(&tx->lock);
  return rc;
}

int gpuipc_channel_send_wait(gpuipc_channel_t *ch, uint64_t ticket, void *stream,
                     int timeout_ms)
{
  if (ch == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_channel_send_wait: NULL channel");
  struct gpuipc__tx *tx = &ch->tx;
  pthread_mutex_lock(&tx->lock);
  int rc = 0;
  if (ticket == 0 || ticket >= tx->next_seq) {
    rc = gpuipc__err(-EINVAL, "gpuipc_channel_send_wait: ticket %llu was not sent "
                     "on channel %s", (unsigned long long)ticket, ch->name);
    goto unlock;
  }
  rc = tx_wait(ch, deadline_of(timeout_ms), ticket_released, ticket, false);
  if (rc == 0 && ticket >= tx->oldest) {
    struct gpuipc__tx_rec *r = &tx->recs[ticket % tx->depth];
    gpuipc_event_t *ev = r->rel_ev;
    int dev = ev != NULL ? stream_dev(stream, gpuipc_event_device(ev)) : -1;
    /* The stream's device needs the event opened there. */
    if (ev != NULL && dev != gpuipc_event_device(ev))
      rc = event_peer(&tx->rel_evs, &tx->nrel_evs, &tx->caprel_evs,
                      r->rel_key, NULL, dev, ch->who, &ev);
    if (rc == 0 && ev != NULL)
      rc = wait_on(ev, stream, ev_poll_ns());
  } else if (rc == -EAGAIN) {
    rc = gpuipc__err(-EAGAIN, "gpuipc_channel_send_wait: message %llu is not "
                     "released yet", (unsigned long long)ticket);
  } else if (rc == -ETIMEDOUT) {
    rc = gpuipc__err(-ETIMEDOUT, "gpuipc_channel_send_wait: message %llu was not "
                     "released within %d ms", (unsigned long long)ticket,
                     timeout_ms);
  }
unlock:
  pthread_mutex_unlock(&tx->lock);
  return rc;
}

int gpuipc_channel_on_release(gpuipc_channel_t *ch, gpuipc_release_fn fn,
                              void *user)
{
  if (ch == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_channel_on_release: NULL channel");
  pthread_mutex_lock(&ch->tx.lock);
  ch->tx.cb = fn;
  ch->tx.cb_user = user;
  pthread_mutex_unlock(&ch->tx.lock);
  return 0;
}

int gpuipc_channel_progress(gpuipc_channel_t *ch)
{
  if (ch == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_channel_progress: NULL channel");
  pthread_mutex_lock(&ch->tx.lock);
  int rc = tx_progress(ch);
  pthread_mutex_unlock(&ch->tx.lock);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Receiving side                                                           */
/* ------------------------------------------------------------------------ */

static int rx_broken(struct gpuipc_channel *ch, int rc)
{
  ch->rx.err = rc;
  return rc;
}

static gpuipc_buf_t *rxbuf_find(struct gpuipc__rx *rx, uint64_t key, int *at)
{
  int i = rx->last_buf;
  if (i < rx->nbufs && rx->bufs[i].key == key) {
    *at = i;
    return rx->bufs[i].buf;
  }
  for (i = 0; i < rx->nbufs; i++)
    if (rx->bufs[i].key == key) {
      rx->last_buf = i;
      *at = i;
      return rx->bufs[i].buf;
    }
  return NULL;
}

/*
 * Read the buffer message for @d from the socket and import it. The sender
 * queued it before publishing @d, so it is read without waiting.
 */
static int rx_import(struct gpuipc_channel *ch, const struct gpuipc__desc *d,
                     const char *who)
{
  struct gpuipc__rx *rx = &ch->rx;
  uint8_t msg[GPUIPC__BUFMSG_BYTES + 16];
  int fds[1] = {-1}, nfds = 1, at;
  ssize_t n = gpuipc__sock_recv(ch->sock, msg, sizeof(msg), fds, &nfds, 0);
  if (n == -ETIMEDOUT)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: message %llu announced buffer "
                       "key %llu, but its buffer message is not on the "
                       "socket (a sender queues it before the descriptor)",
                       who, (unsigned long long)d->seq,
                       (unsigned long long)d->buf_key);
  if (n < 0) {
    if (n == GPUIPC_E_PEER_GONE)
      atomic_store(&ch->gone, 1);
    return gpuipc__err((int)n, "%s: message %llu announced a buffer that "
                       "did not arrive on the socket", who,
                       (unsigned long long)d->seq);
  }
  int fd = nfds > 0 ? fds[0] : -1;
  uint64_t key;
  gpuipc_handle_t h;
  int rc = gpuipc__bufmsg_decode(msg, (size_t)n, &key, &h, who);
  if (rc == 0 && key != d->buf_key)
    rc = gpuipc__err(GPUIPC_E_PROTO, "%s: buffer message for key %llu where "
                     "message %llu announced key %llu", who,
                     (unsigned long long)key, (unsigned long long)d->seq,
                     (unsigned long long)d->buf_key);
  if (rc == 0 && rxbuf_find(rx, key, &at) != NULL)
    rc = gpuipc__err(GPUIPC_E_PROTO, "%s: buffer key %llu sent twice", who,
                     (unsigned long long)key);
  bool want_fd = h.type == GPUIPC_HT_POSIX_FD || h.type == GPUIPC_HT_POOL;
  if (rc == 0 && want_fd != (fd >= 0))
    rc = gpuipc__err(GPUIPC_E_PROTO, "%s: buffer key %llu came %s a "
                     "descriptor", who, (unsigned long long)key,
                     fd >= 0 ? "with" : "without");
  if (rc == 0 && rx->nbufs == GPUIPC__CHAN_BUFS)
    rc = gpuipc__err(GPUIPC_E_PROTO, "%s: the peer sent more than %d "
                     "buffers without forgetting any", who,
                     GPUIPC__CHAN_BUFS);
  if (rc != 0) {
    gpuipc__fd_close(&fd);
    return rc;
  }
  h.fd = fd;
  gpuipc_buf_t *b;
  rc = gpuipc_buf_import(&h, h.kind == GPUIPC_KIND_HOST ? -1 : ch->device,
                         0, &b);
  gpuipc__fd_close(&fd);
  if (rc != 0)
    return rc;
  rx->bufs[rx->nbufs].key = key;
  rx->bufs[rx->nbufs].buf = b;
  rx->last_buf = rx->nbufs++;
  rx->bufs_imported++;
  return 0;
}

/* Make the next message pending (taken from the ring, checked, mapped). */
static int rx_fetch(struct gpuipc_channel *ch, uint64_t deadline)
{
  struct gpuipc__rx *rx = &ch->rx;
  if (rx->pending)
    return 0;
  if (rx->err != 0)
    return gpuipc__err(rx->err, "channel %s: the peer broke the protocol "
                       "earlier", ch->name);
  uint32_t h = atomic_load_explicit(&ch->rxd->head, memory_order_acquire);
  if (h == rx->tail) {
    int rc = gpuipc__chan_wait(ch, &ch->rxd->head, rx->tail,
                               &ch->rxd->recv_sleep, deadline);
    if (rc == -EAGAIN)
      return gpuipc__err(-EAGAIN, "channel %s: no message", ch->name);
    if (rc == -ETIMEDOUT)
      return gpuipc__err(-ETIMEDOUT, "channel %s: no message in time",
                         ch->name);
    if (rc != 0)
      return rc;
    h = atomic_load_explicit(&ch->rxd->head, memory_order_acquire);
  }
  const char *who = ch->who;
  if (h - rx->tail > GPUIPC__CHAN_DEPTH_MAX)
    return rx_broken(ch, gpuipc__err(GPUIPC_E_PROTO, "%s: %u descriptors "
                                     "published, more than the ring holds",
                                     who, h - rx->tail));
  uint8_t slot[GPUIPC__CHAN_DESC_BYTES];
  memcpy(slot,
         ch->rx_ring +
             (size_t)(rx->tail % GPUIPC__CHAN_DEPTH_MAX) *
                 GPUIPC__CHAN_DESC_BYTES,
         sizeof(slot));
  rx->tail++;
  struct gpuipc__desc *d = &rx->pdesc;
  int rc = gpuipc__desc_decode(slot, sizeof(slot), d, who);
  if (rc != 0)
    return rx_broken(ch, rc);
  if (d->seq != rx->expect_seq)
    return rx_broken(ch, gpuipc__err(GPUIPC_E_PROTO, "%s: message %llu "
                                     "arrived where %llu was due", who,
                                     (unsigned long long)d->seq,
                                     (unsigned long long)rx->expect_seq));
  rx->expect_seq++;
  int at;
  if (d->flags & GPUIPC__DESC_FORGET) {
    gpuipc_buf_t *old = rxbuf_find(rx, d->forget_key, &at);
    if (old == NULL)
      return rx_broken(ch, gpuipc__err(GPUIPC_E_PROTO, "%s: message %llu "
                                       "forgets buffer key %llu, which was "
                                       "never sent", who,
                                       (unsigned long long)d->seq,
                                       (unsigned long long)d->forget_key));
    gpuipc_buf_release(old); /* views hold references of their own */
    rx->bufs[at] = rx->bufs[--rx->nbufs];
    rx->last_buf = 0;
  }
  if (d->flags & GPUIPC__DESC_NEW_BUF) {
    rc = rx_import(ch, d, who);
    if (rc != 0)
      return rx_broken(ch, rc);
  }
  gpuipc_buf_t *b = rxbuf_find(rx, d->buf_key, &at);
  if (b == NULL)
    return rx_broken(ch, gpuipc__err(GPUIPC_E_PROTO, "%s: message %llu uses "
                                     "buffer key %llu, which was never sent",
                                     who, (unsigned long long)d->seq,
                                     (unsigned long long)d->buf_key));
  /* Check the layout against the memory as mapped here, not as claimed. */
  rc = gpuipc__layout_check(GPUIPC_E_PROTO, who, d->dtype, d->ndim, d->shape,
                            d->strides, d->offset, gpuipc_buf_size(b), NULL);
  if (rc != 0)
    return rx_broken(ch, rc);
  rx->pbuf = b;
  rx->pending = true;
  return 0;
}

/* The sender's event of the pending message, opened for @dev, or NULL. */
static int rx_event(struct gpuipc_channel *ch, int dev, gpuipc_event_t **out)
{
  struct gpuipc__rx *rx = &ch->rx;
  struct gpuipc__desc *d = &rx->pdesc;
  *out = NULL;
  if (!(d->flags & GPUIPC__DESC_EVENT))
    return 0;
  int rc = event_peer(&rx->evs, &rx->nevs, &rx->capevs, d->ev_key,
                      (d->flags & GPUIPC__DESC_NEW_EVENT) ? d->ev_handle
                                                          : NULL,
                      dev, ch->who, out);
  if (rc == 0)
    d->flags &= ~GPUIPC__DESC_NEW_EVENT; /* imported: a retry looks it up */
  else if (rc == GPUIPC_E_PROTO)
    rx_broken(ch, rc);
  return rc;
}

/*
 * Publish the release of message @seq, with an event on @stream (of device
 * @dev, -1 for none) unless the stream is idle; @busy: it is known not to
 * be (work was just queued on it), no need to ask.
 */
static int rx_release(struct gpuipc_channel *ch, uint64_t seq, int dev,
                      void *stream, bool busy)
{
  struct gpuipc__rx *rx = &ch->rx;
  int rc = 0;
  pthread_mutex_lock(&rx->rel_lock);
  if (atomic_load(&ch->closing))
    goto unlock; /* nobody to tell */
  if (atomic_load(&ch->gone)) {
    rc = gpuipc__err(GPUIPC_E_PEER_GONE, "gpuipc_tensor_release: the sender "
                     "of channel %s is gone", ch->name);
    goto unlock;
  }
  struct gpuipc__rel rl;
  memset(&rl, 0, sizeof(rl));
  rl.seq = seq;
  uint8_t *sent = NULL;
  if (dev >= 0 && (busy || !stream_idle(dev, stream))) {
    uint32_t es = (uint32_t)(seq % rx->depth);
    gpuipc_event_t *ev;
    bool is_new;
    rc = event_get(&rx->rel_ev, &rx->rel_ev_sent, &rx->ndev, rx->depth, dev,
                   es, &ev, &is_new);
    if (rc == 0 && is_new)
      rc = pack_event(ev, rl.ev_handle);
    if (rc == 0)
      rc = gpuipc_event_record(ev, stream);
    if (rc != 0)
      goto unlock;
    rl.flags = GPUIPC__REL_EVENT | (is_new ? GPUIPC__REL_NEW_EVENT : 0);
    rl.ev_key = (uint32_t)dev * GPUIPC__CHAN_DEPTH_MAX + es;
    if (is_new)
      sent = &rx->rel_ev_sent[(size_t)dev * rx->depth + es];
  }
  uint8_t *dst = ch->rx_rel + (size_t)(rx->rel_head % GPUIPC__CHAN_DEPTH_MAX) *
                                  GPUIPC__CHAN_REL_BYTES;
  rc = gpuipc__rel_encode(&rl, dst, GPUIPC__CHAN_REL_BYTES);
  if (rc < 0)
    goto unlock;
  rc = 0;
  rx->rel_head++;
  gpuipc__chan_publish(&ch->rxd->rel_head, rx->rel_head, &ch->rxd->send_sleep);
  if (sent != NULL)
    *sent = 1;
unlock:
  pthread_mutex_unlock(&rx->rel_lock);
  return rc;
}

int gpuipc_channel_recv(gpuipc_channel_t *ch, gpuipc_tensor_t **view, void *stream,
                int timeout_ms)
{
  if (ch == NULL || view == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_channel_recv: NULL %s",
                       ch == NULL ? "channel" : "view");
  struct gpuipc__rx *rx = &ch->rx;
  pthread_mutex_lock(&rx->lock);
  int rc = rx_fetch(ch, deadline_of(timeout_ms));
  if (rc != 0)
    goto unlock;
  gpuipc_event_t *ev;
  rc = rx_event(ch, stream_dev(stream, gpuipc_buf_device(rx->pbuf)), &ev);
  if (rc == 0 && ev != NULL)
    rc = wait_on(ev, stream, ev_poll_ns());
  if (rc != 0)
    goto unlock;
  struct gpuipc__view *v = calloc(1, sizeof(*v));
  if (v == NULL) {
    rc = gpuipc__err(-ENOMEM, "gpuipc_channel_recv: out of memory");
    goto unlock;
  }
  const struct gpuipc__desc *d = &rx->pdesc;
  gpuipc_buf_t *b = rx->pbuf;
  v->magic = GPUIPC__VIEW_MAGIC;
  v->t.dl.data = gpuipc_buf_ptr(b);
  v->t.dl.byte_offset = d->offset;
  v->t.dl.ndim = (int32_t)d->ndim;
  v->t.dl.dtype = d->dtype;
  memcpy(v->shape, d->shape, sizeof(v->shape));
  memcpy(v->strides, d->strides, sizeof(v->strides));
  v->t.dl.shape = v->shape;
  v->t.dl.strides = v->strides;
  if (gpuipc_buf_kind(b) == GPUIPC_KIND_HOST) {
    v->t.dl.device.device_type = GPUIPC_DL_CPU;
    v->device = -1;
  } else {
    v->t.dl.device.device_type = GPUIPC_DL_CUDA;
    v->t.dl.device.device_id = gpuipc_buf_device(b);
    v->device = gpuipc_buf_device(b);
  }
  gpuipc__buf_ref(b);
  v->t.buf = b;
  v->seq = d->seq;
  v->recv_stream = stream;
  atomic_fetch_add(&ch->refs, 1);
  v->ch = ch;
  rx->pending = false;
  rx->received++;
  atomic_fetch_add(&rx->views, 1);
  *view = &v->t;
unlock:
  pthread_mutex_unlock(&rx->lock);
  return rc;
}

int gpuipc_channel_recv_into(gpuipc_channel_t *ch, const gpuipc_tensor_t *dst,
                     void *stream, int timeout_ms)
{
  static const char who[] = "gpuipc_channel_recv_into";
  if (ch == NULL || dst == NULL)
    return gpuipc__err(-EINVAL, "%s: NULL %s", who,
                       ch == NULL ? "channel" : "destination");
  const gpuipc_dl_tensor_t *dl = &dst->dl;
  if (dl->data == NULL)
    return gpuipc__err(-EINVAL, "%s: destination data is NULL", who);
  int rc = gpuipc__layout_check(-EINVAL, who, dl->dtype, dl->ndim, dl->shape,
                                dl->strides, 0, GPUIPC_SIZE_MAX_ABSURD, NULL);
  if (rc != 0)
    return rc;
  if (!gpuipc__layout_compact(dl->ndim, dl->shape, dl->strides))
    return gpuipc__err(-EINVAL, "%s: the destination must be contiguous "
                       "(row-major)", who);
  if (dst->buf != NULL) {
    uintptr_t base = (uintptr_t)gpuipc_buf_ptr(dst->buf);
    uintptr_t p = (uintptr_t)dl->data + dl->byte_offset;
    uint64_t n = gpuipc__layout_count(dl->ndim, dl->shape) *
                 gpuipc__dtype_size(dl->dtype);
    if (p < base || p - base > gpuipc_buf_size(dst->buf) ||
        n > gpuipc_buf_size(dst->buf) - (p - base))
      return gpuipc__err(-EINVAL, "%s: the destination reaches outside its "
                         "buffer", who);
  }
  struct gpuipc__rx *rx = &ch->rx;
  pthread_mutex_lock(&rx->lock);
  rc = rx_fetch(ch, deadline_of(timeout_ms));
  if (rc != 0)
    goto unlock;
  const struct gpuipc__desc *d = &rx->pdesc;
  bool same = d->ndim == (uint32_t)dl->ndim && d->dtype.code == dl->dtype.code &&
              d->dtype.bits == dl->dtype.bits &&
              d->dtype.lanes == dl->dtype.lanes;
  for (uint32_t i = 0; same && i < d->ndim; i++)
    same = d->shape[i] == dl->shape[i];
  if (!same) {
    rc = gpuipc__err(-EINVAL, "%s: message %llu (ndim %u, dtype %u/%u/%u) "
                     "does not match the destination (ndim %d, dtype "
                     "%u/%u/%u) in shape or dtype; it stays first in line",
                     who, (unsigned long long)d->seq, d->ndim, d->dtype.code,
                     d->dtype.bits, d->dtype.lanes, dl->ndim, dl->dtype.code,
                     dl->dtype.bits, dl->dtype.lanes);
    goto unlock;
  }
  if (!gpuipc__layout_compact((int)d->ndim, d->shape, d->strides)) {
    rc = gpuipc__err(-EINVAL, "%s: message %llu is not contiguous: receive "
                     "it with gpuipc_channel_recv", who, (unsigned long long)d->seq);
    goto unlock;
  }
  gpuipc_buf_t *b = rx->pbuf;
  size_t n = (size_t)(gpuipc__layout_count((int)d->ndim, d->shape) *
                      gpuipc__dtype_size(d->dtype));
  const uint8_t *src = (const uint8_t *)gpuipc_buf_ptr(b) + d->offset;
  uint8_t *to = (uint8_t *)dl->data + dl->byte_offset;
  int rel_dev = -1;
  if (gpuipc_buf_kind(b) == GPUIPC_KIND_HOST &&
      is_host_dev(dl->device.device_type)) {
    if (n > 0)
      memcpy(to, src, n);
  } else {
    rel_dev = dl->device.device_type == GPUIPC_DL_CUDA
                  ? dl->device.device_id
                  : gpuipc_buf_device(b);
    if (rel_dev < 0) {
      rc = gpuipc__err(-EINVAL, "%s: destination device type %d", who,
                       dl->device.device_type);
      goto unlock;
    }
    rel_dev = stream_dev(stream, rel_dev);
    gpuipc_event_t *ev;
    rc = rx_event(ch, rel_dev, &ev);
    if (rc == 0 && ev != NULL)
      rc = wait_on(ev, stream, ev_poll_ns());
    if (rc == 0 && n > 0)
      rc = copy_async(rel_dev, to, src, n, stream);
    if (rc != 0)
      goto unlock;
  }
  uint64_t seq = d->seq;
  rx->pending = false;
  rx->received++;
  rc = rx_release(ch, seq, rel_dev, stream, n > 0 && rel_dev >= 0);
unlock:
  pthread_mutex_unlock(&rx->lock);
  return rc;
}

struct gpuipc__view *gpuipc__view_of(gpuipc_tensor_t *t)
{
  if (t == NULL)
    return NULL;
  struct gpuipc__view *v = (struct gpuipc__view *)t;
  return v->magic == GPUIPC__VIEW_MAGIC ? v : NULL;
}

int gpuipc_tensor_release(gpuipc_tensor_t *t, void *stream)
{
  struct gpuipc__view *v = gpuipc__view_of(t);
  if (v == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_tensor_release: not a received "
                       "view");
  struct gpuipc_channel *ch = v->ch;
  int rc = rx_release(ch, v->seq,
                      v->device >= 0 ? stream_dev(stream, v->device) : -1,
                      stream, false);
  gpuipc_buf_release(v->t.buf);
  v->magic = 0;
  free(v);
  atomic_fetch_sub(&ch->rx.views, 1);
  chan_unref(ch);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Closing, information, test hooks                                         */
/* ------------------------------------------------------------------------ */

static void chan_unref(struct gpuipc_channel *ch)
{
  if (atomic_fetch_sub(&ch->refs, 1) != 1)
    return;
  gpuipc__fd_close(&ch->sock);
  free(ch->tx.recs);
  if (ch->seg != NULL)
    gpuipc_buf_release(ch->seg);
  pthread_mutex_destroy(&ch->tx.lock);
  pthread_mutex_destroy(&ch->rx.lock);
  pthread_mutex_destroy(&ch->rx.rel_lock);
  free(ch);
}

int gpuipc_channel_close(gpuipc_channel_t *ch)
{
  if (ch == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_channel_close: NULL channel");
  pthread_mutex_lock(&ch->rx.rel_lock);
  atomic_store(&ch->closing, 1);
  pthread_mutex_unlock(&ch->rx.rel_lock);
  if (ch->shm != NULL) {
    atomic_store(&ch->shm->closed[ch->end], 1);
    for (int d = 0; d < 2; d++) {
      gpuipc__futex_wake((uint32_t *)&ch->shm->dir[d].head, INT_MAX);
      gpuipc__futex_wake((uint32_t *)&ch->shm->dir[d].rel_head, INT_MAX);
    }
  }
  gpuipc__fd_close(&ch->sock);

  struct gpuipc__tx *tx = &ch->tx;
  if (tx->recs != NULL)
    for (uint32_t i = 0; i < tx->depth; i++)
      if (tx->recs[i].seq != 0)
        tx_rec_free(ch, &tx->recs[i]);
  free(tx->recs);
  tx->recs = NULL;
  if (tx->stage != NULL) {
    for (int i = 0; i <= tx->ndev; i++)
      if (tx->stage[i].buf != NULL)
        gpuipc_buf_release(tx->stage[i].buf);
    free(tx->stage);
  }
  event_pool_free(tx->ev, tx->ev_sent, tx->ndev, tx->depth);
  event_tab_free(tx->rel_evs, tx->nrel_evs);

  struct gpuipc__rx *rx = &ch->rx;
  for (int i = 0; i < rx->nbufs; i++)
    gpuipc_buf_release(rx->bufs[i].buf);
  rx->nbufs = 0;
  event_tab_free(rx->evs, rx->nevs);
  pthread_mutex_lock(&rx->rel_lock);
  event_pool_free(rx->rel_ev, rx->rel_ev_sent, rx->ndev, rx->depth);
  rx->rel_ev = NULL;
  pthread_mutex_unlock(&rx->rel_lock);
  chan_unref(ch);
  return 0;
}

int gpuipc_channel_info(gpuipc_channel_t *ch, gpuipc_channel_info_t *out)
{
  if (ch == NULL || out == NULL ||
      out->size < offsetof(gpuipc_channel_info_t, peer_gone) + sizeof(int))
    return gpuipc__err(-EINVAL, "gpuipc_channel_info: NULL argument or "
                       "out->size too small");
  gpuipc_channel_info_t i;
  memset(&i, 0, sizeof(i));
  i.size = out->size;
  snprintf(i.name, sizeof(i.name), "%s", ch->name);
  i.end = ch->end;
  i.peer_pid = (int)ch->peer_pid;
  pthread_mutex_lock(&ch->tx.lock);
  i.depth = ch->tx.depth;
  i.sent = ch->tx.sent;
  i.in_flight = ch->tx.next_seq - ch->tx.oldest;
  i.buffers_sent = ch->tx.bufs_sent;
  pthread_mutex_unlock(&ch->tx.lock);
  pthread_mutex_lock(&ch->rx.lock);
  i.peer_depth = ch->rx.depth;
  i.received = ch->rx.received;
  i.buffers_imported = ch->rx.bufs_imported;
  pthread_mutex_unlock(&ch->rx.lock);
  i.views = atomic_load(&ch->rx.views);
  i.peer_gone = atomic_load(&ch->gone);
  memcpy(out, &i, out->size < sizeof(i) ? out->size : sizeof(i));
  return 0;
}

int gpuipc__chan_inject(struct gpuipc_channel *ch, const void *bytes,
                        size_t len, const void *bufmsg, size_t bufmsg_len,
                        int fd)
{
  if (len > GPUIPC__CHAN_DESC_BYTES)
    return -EINVAL;
  pthread_mutex_lock(&ch->tx.lock);
  int rc = 0;
  if (bufmsg != NULL)
    rc = gpuipc__sock_send(ch->sock, bufmsg, bufmsg_len, &fd, fd >= 0, 1000);
  if (rc == 0) {
    uint32_t head = ch->tx.head++;
    uint8_t *dst = ch->tx_ring + (size_t)(head % GPUIPC__CHAN_DEPTH_MAX) *
                                     GPUIPC__CHAN_DESC_BYTES;
    memset(dst, 0, GPUIPC__CHAN_DESC_BYTES);
    memcpy(dst, bytes, len);
    gpuipc__chan_publish(&ch->txd->head, ch->tx.head, &ch->txd->recv_sleep);
  }
  pthread_mutex_unlock(&ch->tx.lock);
  return rc;
}

uint64_t gpuipc__chan_last_key(struct gpuipc_channel *ch)
{
  pthread_mutex_lock(&ch->tx.lock);
  uint64_t k = ch->tx.last_key;
  pthread_mutex_unlock(&ch->tx.lock);
  return k;
}

uint64_t gpuipc__chan_next_seq(struct gpuipc_channel *ch)
{
  pthread_mutex_lock(&ch->tx.lock);
  uint64_t s = ch->tx.next_seq;
  pthread_mutex_unlock(&ch->tx.lock);
  return s;
}

uint64_t gpuipc_tensor_nbytes(const gpuipc_tensor_t *t)
{
  if (t == NULL || t->dl.ndim < 0 || t->dl.ndim > GPUIPC_TENSOR_MAX_DIMS ||
      (t->dl.ndim > 0 && t->dl.shape == NULL))
    return 0;
  uint64_t n = gpuipc__layout_count(t->dl.ndim, t->dl.shape), b;
  if (__builtin_mul_overflow(n, (uint64_t)gpuipc__dtype_size(t->dl.dtype), &b))
    return UINT64_MAX;
  return b;
}

int gpuipc_tensor_layout(const gpuipc_tensor_t *t, gpuipc_tensor_layout_t *out)
{
  static const char who[] = "gpuipc_tensor_layout";
  if (t == NULL || out == NULL)
    return gpuipc__err(-EINVAL, "%s: NULL %s", who,
                       t == NULL ? "tensor" : "out");
  if (out->size < sizeof(*out))
    return gpuipc__err(-EINVAL, "%s: out->size %zu < %zu", who, out->size,
                       sizeof(*out));
  const gpuipc_dl_tensor_t *dl = &t->dl;
  if (dl->ndim < 0 || dl->ndim > GPUIPC_TENSOR_MAX_DIMS)
    return gpuipc__err(-EINVAL, "%s: ndim %d is outside 0..%d", who,
                       dl->ndim, GPUIPC_TENSOR_MAX_DIMS);
  if (dl->data == NULL)
    return gpuipc__err(-EINVAL, "%s: data is NULL", who);
  uint64_t offset = dl->byte_offset, size = GPUIPC_SIZE_MAX_ABSURD;
  int rc;
  if (t->buf != NULL) {
    size = gpuipc_buf_size(t->buf);
    rc = buf_offset(who, t, &offset);
    if (rc != 0)
      return rc;
  }
  uint64_t span = 0;
  rc = gpuipc__layout_check(-EINVAL, who, dl->dtype, dl->ndim, dl->shape,
                                dl->strides, offset, size, &span);
  if (rc != 0)
    return rc;
  /* The lowest byte: the offset less what negative strides reach back. */
  uint64_t back = 0;
  if (span > 0 && dl->strides != NULL) {
    size_t esize = gpuipc__dtype_size(dl->dtype);
    for (int i = 0; i < dl->ndim; i++)
      if (dl->strides[i] < 0)
        back += (uint64_t)(dl->shape[i] - 1) * (uint64_t)-dl->strides[i] *
                esize;
  }
  out->first = offset - back;
  out->span = span;
  out->nbytes = gpuipc_tensor_nbytes(t);
  out->contiguous = gpuipc__layout_compact(dl->ndim, dl->shape, dl->strides);
  return 0;
}
