/*
 * The copy loop of one member. It has the chunks in order, each turn as
 * many as it can: a member with a parent (chain.c) copies a chunk from
 * the parent's lent destination once the parent's prefix word covers it;
 * the head of the chain claims the chunk and copies it from the
 * publisher, and its done word follows the copy (a chunk someone else
 * claimed it copies from the claimer once done, or takes over once the
 * claim is stale: its member gone, left, failed, a word that names
 * nobody, or no done word within the timeout of when this member first
 * saw the claim). After each chunk its prefix word follows. A parent
 * whose prefix stands still through the timeout, or that cannot serve a
 * chunk, is left behind: the next one up the chain, or the publisher,
 * takes its place. When a turn does nothing, the host naps: 20 us while
 * copies run or for the first 100 ms of a wait, then longer each time up
 * to a millisecond; so do the waits after the loop (settle, linger,
 * drain).
 *
 * Movers: with device -1 (HOST memory on both sides) the CPU copies and
 * a release store writes the words; with a GPU the copies go on the
 * caller's stream in chunk order, and each chunk's words
 * (cuStreamWriteValue64 into the pinned table) on a stream of gpuipc's
 * own once the copy has landed (words_flush).
 *
 * A copy from a peer is numbered: this member writes the number into its
 * rseq word for that server before it looks whether the server still
 * serves, and writes it into its rdone word after the copy. A server that
 * leaves first says so (LEAVING), then waits until every reader's rdone
 * reached the rseq it wrote for it (gpuipc__share_drain): no copy from its
 * memory is in flight when its call returns it to its caller.
 */
#include "share/share.h"
#include "cuda/cuda.h"
#include "os/os.h"

#include <stdio.h>
#include <string.h>

static _Atomic(gpuipc__share_hook_fn) hook_fn;
static void *_Atomic hook_arg;
static _Thread_local struct gpuipc__share_stats last_stats;

void gpuipc__share_test_hook(gpuipc__share_hook_fn fn, void *arg)
{
  atomic_store(&hook_arg, arg);
  atomic_store(&hook_fn, fn);
}

void gpuipc__share_step(enum gpuipc__share_step step, long chunk)
{
  gpuipc__share_hook_fn fn = atomic_load(&hook_fn);
  if (fn != NULL)
    fn(step, chunk, atomic_load(&hook_arg));
}

void gpuipc__share_test_stats(struct gpuipc__share_stats *out)
{
  *out = last_stats;
}

void gpuipc__share_stats_set(const struct gpuipc__share_stats *st)
{
  last_stats = *st;
}

/* ----- movers ----- */

static int mv_copy(struct share_call *c, void *dst, const void *src,
                   size_t n, long chunk)
{
  if (c->device >= 0)
    return gpuipc__stream_copy_async(c->device, dst, src, n, c->stream,
                                     false);
  if (chunk >= 0 && atomic_load(&hook_fn) != NULL) {
    /* Tests stop a member half way through a copy. */
    memcpy(dst, src, n / 2);
    gpuipc__share_step(GPUIPC__SHARE_MIDCOPY, chunk);
    memcpy((uint8_t *)dst + n / 2, (const uint8_t *)src + n / 2, n - n / 2);
    return 0;
  }
  memcpy(dst, src, n);
  return 0;
}

/*
 * A GPU member's words go to a stream of gpuipc's own that waits for the
 * caller's stream (an event): written on the caller's stream, each word
 * paused its copy engine between two chunks (with a system-wide fence),
 * 2 to 3 us a word. They are written in the order they were queued, all
 * after the copies queued before them.
 */
static int words_flush(struct share_call *c)
{
  int n = c->npend;
  if (n == 0)
    return 0;
  c->npend = 0;
  return gpuipc__stream_words_write_after(c->device, c->stream, n,
                                          c->pend_addr, c->pend_val);
}

static int mv_word(struct share_call *c, _Atomic uint64_t *w, uint64_t v)
{
  if (c->device < 0) {
    atomic_store_explicit(w, v, memory_order_release);
    return 0;
  }
  if (c->npend == (int)(sizeof(c->pend_val) / sizeof(c->pend_val[0]))) {
    int rc = words_flush(c);
    if (rc != 0)
      return rc;
  }
  c->pend_addr[c->npend] = c->words + (uint64_t)((uint8_t *)w - c->t->base);
  c->pend_val[c->npend++] = v;
  return 0;
}

/* ----- naps ----- */

unsigned gpuipc__share_nap_next(unsigned us, uint64_t waited_ns, bool busy)
{
  unsigned most = busy || waited_ns < GPUIPC__SHARE_EAGER_NS
                      ? GPUIPC__SHARE_NAP_US
                      : GPUIPC__SHARE_NAP_MAX_US;
  return us >= most / 2 ? most : us * 2;
}

void gpuipc__share_nap(struct share_nap *w, bool busy)
{
  if (w->since == 0)
    w->since = gpuipc__now_ns();
  gpuipc__sleep_us(w->us);
  w->us = gpuipc__share_nap_next(w->us, gpuipc__now_ns() - w->since, busy);
}

void gpuipc__share_nap_reset(struct share_nap *w)
{
  w->us = GPUIPC__SHARE_NAP_US;
  w->since = 0;
}

/* ----- one chunk ----- */

static uint8_t *dst_of(const struct share_call *c, long i)
{
  const struct share_piece *p = &c->l->pieces[i];
  const gpuipc_share_extent_t *e = &c->l->ext[p->ext];
  return (uint8_t *)gpuipc_buf_ptr(e->dst) + e->dst_off + p->off;
}

static const uint8_t *pub_of(const struct share_call *c, long i)
{
  const struct share_piece *p = &c->l->pieces[i];
  const gpuipc_share_extent_t *e = &c->l->ext[p->ext];
  return (const uint8_t *)gpuipc_buf_ptr(e->src) + e->src_off + p->off;
}

static void got(struct share_call *c, long i, int peer_slot)
{
  bool peer = peer_slot >= 0;
  if (!c->have[i])
    c->missing--; /* a chunk had again (a claim word a liar zeroed) is
                     not counted twice */
  c->have[i] = 1;
  c->from[i] = (int8_t)peer_slot;
  if (peer) {
    c->st.from_peer++;
    c->st.sources |= 1ull << peer_slot;
  }
  else
    c->st.from_pub++;
  if (c->t != NULL)
    atomic_fetch_add_explicit(peer ? &c->t->members[c->me].from_peer
                                   : &c->t->members[c->me].from_pub,
                              1, memory_order_relaxed);
}

static int from_pub(struct share_call *c, long i, long hook_chunk)
{
  int rc = mv_copy(c, dst_of(c, i), pub_of(c, i), c->l->pieces[i].bytes,
                   hook_chunk);
  if (rc == 0)
    got(c, i, -1);
  return rc;
}

/* Copy claimed chunk @i from the publisher; its done word follows. */
static int own_claim(struct share_call *c, long i, uint64_t word)
{
  c->own[i] = word;
  gpuipc__share_step(GPUIPC__SHARE_CLAIMED, i);
  int rc = from_pub(c, i, i);
  if (rc == 0)
    rc = mv_word(c, &c->t->chunks[i].done, word);
  if (rc == 0)
    gpuipc__share_step(GPUIPC__SHARE_DONE, i);
  if (rc == 0 && c->device >= 0) { /* landed once its done word is there */
    c->inflight[(c->in0 + c->nin++) % GPUIPC__SHARE_RING] = i;
    c->in_bytes += c->l->pieces[i].bytes;
  }
  return rc;
}

/* Forget the own claims whose copy has landed (their done word is there)
 * or that another member took over; how many are left in flight. */
static int in_flight(struct share_call *c)
{
  while (c->nin > 0) {
    long i = c->inflight[c->in0];
    struct share_chunk *ch = &c->t->chunks[i];
    if (atomic_load_explicit(&ch->done, memory_order_acquire) != c->own[i] &&
        atomic_load_explicit(&ch->claim, memory_order_acquire) == c->own[i])
      break;
    c->in0 = (c->in0 + 1) % GPUIPC__SHARE_RING;
    c->nin--;
    c->in_bytes -= c->l->pieces[i].bytes;
  }
  return c->nin;
}

/* Whether a GPU member's claims in flight are as many as it queues. */
static bool claims_full(struct share_call *c)
{
  return c->device >= 0 && in_flight(c) > 0 &&
         (c->nin >= GPUIPC__SHARE_RING - 1 ||
          c->in_bytes >= GPUIPC__SHARE_AHEAD);
}

/* Copies from peers queued on the GPU whose rdone word has not come. */
static uint64_t peer_flight(struct share_call *c)
{
  if (c->device < 0)
    return 0;
  uint64_t d = atomic_load(&c->t->members[c->me].rdone);
  return c->rseq - d;
}

/* Whether a GPU member's copies from peers in flight are as many as it
 * queues. */
static bool peers_full(struct share_call *c)
{
  uint64_t n = peer_flight(c);
  if (n == 0)
    return false;
  if (n >= GPUIPC__SHARE_RING - 1)
    return true;
  uint64_t d = c->rseq - n; /* the last that landed */
  return c->peer_bytes - c->peer_cum[d % GPUIPC__SHARE_RING] >=
         GPUIPC__SHARE_AHEAD;
}

/* Copy done chunk @i from server @slot: 1 copied, 0 it cannot serve it. */
static int from_peer(struct share_call *c, long i, int slot, uint64_t now)
{
  uint64_t s = ++c->rseq;
  struct share_member *me = &c->t->members[c->me];
  atomic_store(&me->rseq[slot], s);
  const void *src = NULL;
  if (gpuipc__share_serving(c->t, slot, c->peers, now))
    src = gpuipc__share_peer_src(c->dom, c->t, &c->po, slot, c->l, i,
                                 c->device);
  int rc = src != NULL ? mv_copy(c, dst_of(c, i), src,
                                 c->l->pieces[i].bytes, -1)
                       : 0;
  int wrc = mv_word(c, &me->rdone, s);
  if (src != NULL)
    c->peer_bytes += c->l->pieces[i].bytes;
  c->peer_cum[s % GPUIPC__SHARE_RING] = c->peer_bytes;
  if (rc == 0)
    rc = wrc;
  if (rc != 0)
    return rc;
  if (src != NULL)
    got(c, i, slot);
  return src != NULL;
}

/* Chunk @i is here (queued, for a GPU): the prefix word follows, once
 * the chunks before it are too. 1, or the code. */
static int had(struct share_call *c, long i)
{
  (void)i;
  while (c->next < (long)c->l->nchunks && c->have[c->next])
    c->next++;
  if ((uint64_t)c->next == c->prefix)
    return 1;
  c->prefix = (uint64_t)c->next;
  int rc = mv_word(c, &c->t->members[c->me].prefix, c->prefix);
  return rc != 0 ? rc : 1;
}

/* ----- from the parent ----- */

/* Copy from the next one up the chain from now on, or head it. */
static void pass_over(struct share_call *c, int p)
{
  c->skip[p] = 1;
  c->st.passed_over++;
}

/* Chunk @i from parent @p: 1 had, 0 not now. */
static int from_parent(struct share_call *c, long i, int p, uint64_t now)
{
  if (peers_full(c))
    return 0; /* once a copy from a peer has landed */
  uint64_t pre = atomic_load_explicit(&c->t->members[p].prefix,
                                      memory_order_acquire);
  if (pre > c->l->nchunks) {
    pass_over(c, p); /* not a prefix */
    return 0;
  }
  if (pre <= (uint64_t)i) {
    if (gpuipc__share_parent_stalled(c, p, pre, now))
      pass_over(c, p);
    return 0;
  }
  int rc = from_peer(c, i, p, now);
  if (rc == 0)
    pass_over(c, p); /* it cannot serve it */
  return rc == 1 ? had(c, i) : rc;
}

/* ----- at the head: claims ----- */

/* Whether claim @cw on chunk @i (not done, or done by a member that no
 * longer serves it) is stale now; marks a claimer that stalled FAILED. */
static bool stale(struct share_call *c, long i, uint64_t cw, bool done,
                  uint64_t now)
{
  int slot = gpuipc__share_claim_slot(cw);
  if (slot < 0 || slot == c->me || done)
    return true;
  uint32_t f = atomic_load(&c->t->members[slot].flags);
  if (!(f & GPUIPC__SM_LIVE) || !(f & GPUIPC__SM_SERVER) ||
      (f & GPUIPC__SM_FAILED) || (f & ~GPUIPC__SM_KNOWN))
    return true; /* nobody, or nobody that claims */
  if (gpuipc__share_gone(c->t, slot, c->peers, now)) {
    gpuipc__share_mark_failed(c->t, slot);
    return true;
  }
  uint64_t beat = atomic_load(&c->t->members[slot].beat);
  if (c->seen_claim[i] != cw) {
    c->seen_claim[i] = cw;
    c->seen_ns[i] = now;
    c->seen_beat[i] = beat;
    return false;
  }
  if (c->timeout_ms < 0 ||
      now - c->seen_ns[i] < (uint64_t)c->timeout_ms * 1000000ull)
    return false;
  /* Taken over either way; its member failed only if it stalled (a claim
   * in its name that it never made, or a copy slower than the timeout,
   * costs it nothing: its own bytes are right). */
  if (beat == c->seen_beat[i])
    gpuipc__share_mark_failed(c->t, slot);
  return true;
}

/* Chunk @i at the head of the chain: 1 had, 0 not now. */
static int at_head(struct share_call *c, long i, uint64_t now)
{
  if (claims_full(c))
    return 0;
  struct share_chunk *ch = &c->t->chunks[i];
  uint64_t cw = atomic_load_explicit(&ch->claim, memory_order_acquire);
  uint64_t word;
  int rc;
  if (cw == 0) {
    if (!gpuipc__share_claim_at(c->t, i, c->me, &word))
      return 0; /* someone else did: look again next turn */
    rc = own_claim(c, i, word);
    return rc != 0 ? rc : had(c, i);
  }
  uint64_t dw = atomic_load_explicit(&ch->done, memory_order_acquire);
  int slot = gpuipc__share_claim_slot(cw);
  bool done = false;
  if (dw == cw && slot >= 0 && slot != c->me) {
    if (peers_full(c))
      return 0;
    rc = from_peer(c, i, slot, now);
    if (rc != 0)
      return rc == 1 ? had(c, i) : rc;
    done = true; /* done, but not to be had from there */
  }
  if (!stale(c, i, cw, done, now))
    return 0;
  if (!gpuipc__share_reclaim(c->t, i, cw, c->me, &word))
    return 0;
  c->st.reclaimed++;
  rc = own_claim(c, i, word);
  return rc != 0 ? rc : had(c, i);
}

/* ----- the loop ----- */

/* Chunk @i from parent @p (-1: none): 1 when it had it, 0 not yet. */
static int one_chunk(struct share_call *c, long i, int p, uint64_t now)
{
  if (p >= 0)
    return from_parent(c, i, p, now);
  if (c->server)
    return at_head(c, i, now);
  /* A non-server with no server to copy from: the publisher. */
  int rc = from_pub(c, i, -1);
  return rc != 0 ? rc : had(c, i);
}

/*
 * One turn: the chunks in order, as far as they can be had now; how
 * many, or the code. A member with a parent stops at the first chunk the
 * parent does not have yet; the head goes on past a chunk another member
 * claimed (claiming the free ones after it, as many as may be in
 * flight), so that a stalled claim holds up only its own chunk.
 */
static int turn(struct share_call *c)
{
  uint64_t now = gpuipc__now_ns();
  int p = gpuipc__share_parent(c, now);
  if (p == -2)
    return 0; /* a member before it in the chain is joining */
  int n = 0;
  for (long i = c->next; i < (long)c->l->nchunks; i++) {
    if (c->have[i])
      continue;
    int rc = one_chunk(c, i, p, now);
    int frc = words_flush(c);
    if (rc >= 0 && frc != 0)
      rc = frc;
    if (rc < 0)
      return rc;
    if (rc == 0 && (p >= 0 || !c->server || claims_full(c)))
      break;
    n += rc;
  }
  return n;
}

static bool failed(const struct share_call *c)
{
  return (atomic_load(&c->t->members[c->me].flags) & GPUIPC__SM_FAILED) != 0;
}

int gpuipc__share_run(struct share_call *c)
{
  if (c->t == NULL)
    return gpuipc__share_alone(c);
  struct share_nap nap = GPUIPC__SHARE_NAP_INIT;
  while (c->missing > 0) {
    if (failed(c))
      return gpuipc__share_failed(c);
    gpuipc__share_beat(c->t, c->me);
    int n = turn(c);
    if (n < 0)
      return n;
    if (n > 0) {
      gpuipc__share_nap_reset(&nap);
      continue;
    }
    /* While its copies run, or early in a wait (for its parent's first
     * chunk, say: each of those lags down the chain), a member looks
     * again soon: a chunk's copy takes a few hundred microseconds. */
    gpuipc__share_nap(&nap, c->device >= 0 &&
                                (c->nin > 0 || peer_flight(c) > 0));
  }
  return 0;
}

int gpuipc__share_alone(struct share_call *c)
{
  for (long i = 0; i < (long)c->l->nchunks; i++) {
    if (c->have[i])
      continue;
    int rc = from_pub(c, i, -1);
    if (rc != 0)
      return rc;
  }
  return 0;
}

/* Whether member @s still copies: LIVE, not DONE, LEFT or FAILED, and
 * its process there. */
static bool still_copying(struct share_call *c, int s, uint64_t now)
{
  uint32_t f = atomic_load(&c->t->members[s].flags);
  uint32_t over = GPUIPC__SM_DONE | GPUIPC__SM_LEAVING | GPUIPC__SM_LEFT |
                  GPUIPC__SM_FAILED;
  if (!(f & GPUIPC__SM_LIVE) || (f & over) || (f & ~GPUIPC__SM_KNOWN))
    return false;
  return !gpuipc__share_gone(c->t, s, c->peers, now);
}

void gpuipc__share_linger(struct share_call *c)
{
  atomic_fetch_or(&c->t->members[c->me].flags, GPUIPC__SM_DONE);
  gpuipc__share_step(GPUIPC__SHARE_LEAVE, -1);
  if (!c->server)
    return;
  uint64_t deadline = gpuipc__deadline(c->timeout_ms);
  struct share_nap nap = GPUIPC__SHARE_NAP_INIT;
  for (int s = 0; s < GPUIPC__SHARE_MEMBERS; s++) {
    if (s == c->me || atomic_load(&c->t->members[s].pid) == 0)
      continue;
    while (still_copying(c, s, gpuipc__now_ns()) &&
           gpuipc__now_ns() < deadline) {
      gpuipc__share_beat(c->t, c->me);
      gpuipc__share_nap(&nap, false);
    }
  }
}

/* Whether reader @r's copies from this member have all landed. */
static bool drained(struct share_call *c, int r, uint64_t now)
{
  struct share_member *m = &c->t->members[r];
  uint64_t s = atomic_load(&m->rseq[c->me]);
  uint64_t d = atomic_load(&m->rdone);
  if ((int64_t)(d - s) >= 0)
    return true;
  return (atomic_load(&m->flags) & GPUIPC__SM_FAILED) != 0 ||
         gpuipc__share_gone(c->t, r, c->peers, now);
}

void gpuipc__share_drain(struct share_call *c)
{
  atomic_fetch_or(&c->t->members[c->me].flags, GPUIPC__SM_LEAVING);
  if (!c->server)
    return;
  uint64_t deadline = gpuipc__deadline(c->timeout_ms);
  for (int r = 0; r < GPUIPC__SHARE_MEMBERS; r++) {
    if (r == c->me || atomic_load(&c->t->members[r].pid) == 0)
      continue;
    struct share_nap nap = GPUIPC__SHARE_NAP_INIT;
    while (!drained(c, r, gpuipc__now_ns())) {
      if (gpuipc__now_ns() >= deadline) {
        /* It stalled while copying from us: its call fails, ours goes. */
        gpuipc__share_mark_failed(c->t, r);
        break;
      }
      gpuipc__share_beat(c->t, c->me);
      gpuipc__share_nap(&nap, false);
    }
  }
}

int gpuipc__share_settle(struct share_call *c)
{
  if (c->device < 0)
    return 0;
  _Atomic uint64_t *w = &c->t->members[c->me].rdone;
  uint64_t s = ++c->rseq;
  c->peer_cum[s % GPUIPC__SHARE_RING] = c->peer_bytes;
  int rc = mv_word(c, w, s);
  if (rc == 0)
    rc = words_flush(c);
  if (rc != 0)
    return rc;
  uint64_t deadline = gpuipc__deadline(c->timeout_ms);
  struct share_nap nap = GPUIPC__SHARE_NAP_INIT;
  while ((int64_t)(atomic_load(w) - s) < 0) {
    if (gpuipc__now_ns() >= deadline)
      return gpuipc__err(-ETIMEDOUT, "gpuipc_share_copy(%s): the copies "
                         "queued on the stream did not complete within %d ms",
                         c->round, c->timeout_ms);
    gpuipc__share_beat(c->t, c->me);
    gpuipc__share_nap(&nap, false);
  }
  return 0;
}

int gpuipc__share_recheck(struct share_call *c)
{
  if (c->device < 0)
    return 0;
  bool gone[GPUIPC__SHARE_MEMBERS] = {false}, looked[GPUIPC__SHARE_MEMBERS] = {
      false};
  uint64_t now = gpuipc__now_ns();
  bool again = false;
  for (long i = 0; i < (long)c->l->nchunks; i++) {
    int s = c->from[i];
    if (s < 0 || s >= GPUIPC__SHARE_MEMBERS)
      continue;
    if (!looked[s]) {
      looked[s] = true;
      c->peers[s].checked_ns = 0; /* look at its process now */
      gone[s] = gpuipc__share_gone(c->t, s, c->peers, now) &&
                !(atomic_load(&c->t->members[s].flags) & GPUIPC__SM_LEFT);
    }
    if (!gone[s])
      continue;
    int rc = from_pub(c, i, -1);
    if (rc != 0)
      return rc;
    c->st.recopied++;
    again = true;
  }
  return again ? gpuipc__share_settle(c) : 0;
}

int gpuipc__share_failed(struct share_call *c)
{
  char list[160] = "";
  size_t at = 0;
  int count = 0, listed = 0;
  for (long i = 0; i < (long)c->l->nchunks; i++) {
    uint64_t mine = c->own[i];
    if (mine == 0 || atomic_load(&c->t->chunks[i].claim) == mine)
      continue;
    count++;
    if (at < sizeof(list) - 24) {
      int w = snprintf(list + at, sizeof(list) - at, "%s%ld",
                       at > 0 ? ", " : "", i);
      at += w > 0 ? (size_t)w : 0;
      listed++;
    }
  }
  return gpuipc__err(-ETIMEDOUT, "gpuipc_share_copy(%s): a peer marked this "
                     "member FAILED (it saw it stall past that peer's "
                     "timeout, holding a claim or copying from it, or saw "
                     "it gone); %d chunk(s) it held were taken over%s%s%s",
                     c->round, count, count > 0 ? ": " : "", list,
                     count > listed ? ", ..." : "");
}
