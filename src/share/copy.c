/*
 * The copy loop of one member. Each turn it looks at every chunk it still
 * misses: a chunk whose done word matches its claim and whose claimer
 * serves is copied from the claimer's lent destination; a stale claim
 * (its member gone, left, failed, a word that names nobody, or no done
 * word within the timeout of when this member first saw the claim) is
 * taken over and copied from the publisher (a non-server copies it from
 * the publisher without a claim). Then a server claims one free chunk and
 * copies it from the publisher, and its done word follows the copy. When
 * a turn does nothing, the host naps, longer each time up to a
 * millisecond.
 *
 * Movers: with device -1 (HOST memory on both sides) the CPU copies and
 * a release store writes the words; with a GPU the copies and the words
 * (cuStreamWriteValue64 into the pinned table) go on the caller's stream.
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

/* @peer: a copy from a peer (its stream), else from the publisher. */
static int mv_copy(struct share_call *c, void *dst, const void *src,
                   size_t n, long chunk, bool peer)
{
  if (c->device >= 0)
    return gpuipc__stream_copy_async(c->device, dst, src, n,
                                     c->streams[peer], false);
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

static int mv_word(struct share_call *c, _Atomic uint64_t *w, uint64_t v,
                   bool peer)
{
  if (c->device < 0) {
    atomic_store_explicit(w, v, memory_order_release);
    return 0;
  }
  uint64_t addr = c->words + (uint64_t)((uint8_t *)w - c->t->base);
  return gpuipc__stream_word_write(c->device, c->streams[peer], addr, v);
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
  if (peer)
    c->st.from_peer++;
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
                   hook_chunk, false);
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
    rc = mv_word(c, &c->t->chunks[i].done, word, false);
  if (rc == 0)
    gpuipc__share_step(GPUIPC__SHARE_DONE, i);
  if (rc == 0 && c->device >= 0) /* landed once its done word is there */
    c->inflight[(c->in0 + c->nin++) % GPUIPC__SHARE_DEPTH] = i;
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
    c->in0 = (c->in0 + 1) % GPUIPC__SHARE_DEPTH;
    c->nin--;
  }
  return c->nin;
}

/* Copies from peers queued on the GPU whose rdone word has not come. */
static uint64_t peer_flight(struct share_call *c)
{
  if (c->device < 0)
    return 0;
  uint64_t d = atomic_load(&c->t->members[c->me].rdone);
  return c->rseq - d;
}

/* Copy done chunk @i from server @slot: 1 copied, 0 it cannot serve it. */
static int from_peer(struct share_call *c, long i, int slot, uint64_t now)
{
  uint64_t s = ++c->rseq;
  struct share_member *me = &c->t->members[c->me];
  atomic_store(&me->rseq[slot], s);
  const void *src = NULL;
  if (gpuipc__share_serving(c->t, slot, c->peers, now))
    src = gpuipc__share_peer_src(c->dom, c->round, c->t, &c->po, slot, c->l,
                                 i, c->device);
  int rc = src != NULL ? mv_copy(c, dst_of(c, i), src,
                                 c->l->pieces[i].bytes, -1, true)
                       : 0;
  int wrc = mv_word(c, &me->rdone, s, true);
  if (rc == 0)
    rc = wrc;
  if (rc != 0)
    return rc;
  if (src != NULL)
    got(c, i, slot);
  return src != NULL;
}

/* ----- stale claims ----- */

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

/* A chunk nobody claimed, for a non-server: copy it from the publisher
 * once no server is left that could claim it, or none did within the
 * timeout. */
static bool free_unclaimed(struct share_call *c, long i, uint64_t now)
{
  bool server = false;
  for (int s = 0; s < GPUIPC__SHARE_MEMBERS && !server; s++)
    server = s != c->me && atomic_load(&c->t->members[s].pid) != 0 &&
             gpuipc__share_serving(c->t, s, c->peers, now);
  return !server;
}

/* ----- the loop ----- */

/* One chunk this member misses: 1 when it got it, 0 not yet. */
static int one_missing(struct share_call *c, long i, uint64_t now)
{
  struct share_chunk *ch = &c->t->chunks[i];
  uint64_t cw = atomic_load_explicit(&ch->claim, memory_order_acquire);
  if (cw == 0) {
    if (c->server)
      return 0; /* the claiming below takes it */
    if (c->seen_claim[i] != 1) {
      c->seen_claim[i] = 1; /* "free since" */
      c->seen_ns[i] = now;
    }
    bool late = c->timeout_ms >= 0 &&
                now - c->seen_ns[i] >= (uint64_t)c->timeout_ms * 1000000ull;
    if (!late && !free_unclaimed(c, i, now))
      return 0;
    int rc = from_pub(c, i, -1);
    return rc != 0 ? rc : 1;
  }
  uint64_t dw = atomic_load_explicit(&ch->done, memory_order_acquire);
  int slot = gpuipc__share_claim_slot(cw);
  bool done = false;
  if (dw == cw && slot >= 0 && slot != c->me &&
      peer_flight(c) >= GPUIPC__SHARE_DEPTH)
    return 0; /* there to copy once a copy from a peer has landed */
  if (dw == cw && slot >= 0 && slot != c->me) {
    int rc = from_peer(c, i, slot, now);
    if (rc != 0)
      return rc;
    done = true; /* done, but not to be had from there */
  }
  if (!stale(c, i, cw, done, now))
    return 0;
  uint64_t word;
  int rc;
  if (!c->server) {
    rc = from_pub(c, i, -1);
    return rc != 0 ? rc : 1;
  }
  if (!gpuipc__share_reclaim(c->t, i, cw, c->me, &word))
    return 0; /* someone else did: look again next turn */
  c->st.reclaimed++;
  rc = own_claim(c, i, word);
  return rc != 0 ? rc : 1;
}

/* One turn over what is missing: how many chunks came in, or the code. */
static int turn(struct share_call *c, long *hint)
{
  uint64_t now = gpuipc__now_ns();
  int got_n = 0;
  for (long i = 0; i < (long)c->l->nchunks; i++) {
    if (c->have[i])
      continue;
    int rc = one_missing(c, i, now);
    if (rc < 0)
      return rc;
    got_n += rc;
  }
  if (!c->server || (c->device >= 0 && in_flight(c) >= GPUIPC__SHARE_DEPTH))
    return got_n;
  uint64_t word;
  long i = gpuipc__share_claim_free(c->t, c->me, *hint, &word);
  if (i >= 0) {
    int rc = own_claim(c, i, word);
    if (rc != 0)
      return rc;
    *hint = i + 1;
    got_n++;
  }
  return got_n;
}

static bool failed(const struct share_call *c)
{
  return (atomic_load(&c->t->members[c->me].flags) & GPUIPC__SM_FAILED) != 0;
}

int gpuipc__share_run(struct share_call *c)
{
  if (c->t == NULL)
    return gpuipc__share_alone(c);
  long hint = -1;
  unsigned nap = 20;
  while (c->missing > 0) {
    if (failed(c))
      return gpuipc__share_failed(c);
    gpuipc__share_beat(c->t, c->me);
    int n = turn(c, &hint);
    if (n < 0)
      return n;
    if (n > 0) {
      nap = 20;
      continue;
    }
    gpuipc__sleep_us(nap);
    /* While its copies run, a member looks again soon: a chunk's copy
     * takes a few hundred microseconds. */
    unsigned most = c->device >= 0 && (c->nin > 0 || peer_flight(c) > 0)
                        ? 20 : 1000;
    nap = nap < most ? nap * 2 : most;
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
  unsigned nap = 20;
  for (int s = 0; s < GPUIPC__SHARE_MEMBERS; s++) {
    if (s == c->me || atomic_load(&c->t->members[s].pid) == 0)
      continue;
    while (still_copying(c, s, gpuipc__now_ns()) &&
           gpuipc__now_ns() < deadline) {
      gpuipc__share_beat(c->t, c->me);
      gpuipc__sleep_us(nap);
      nap = nap < 1000 ? nap * 2 : 1000;
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
    unsigned nap = 10;
    while (!drained(c, r, gpuipc__now_ns())) {
      if (gpuipc__now_ns() >= deadline) {
        /* It stalled while copying from us: its call fails, ours goes. */
        gpuipc__share_mark_failed(c->t, r);
        break;
      }
      gpuipc__share_beat(c->t, c->me);
      gpuipc__sleep_us(nap);
      nap = nap < 1000 ? nap * 2 : 1000;
    }
  }
}

int gpuipc__share_settle(struct share_call *c)
{
  if (c->device < 0)
    return 0;
  _Atomic uint64_t *w = &c->t->members[c->me].rdone;
  uint64_t s = ++c->rseq;
  /* After both streams' work: the caller's stream waits for them, and
   * writes the word. */
  int rc = c->forked ? gpuipc__stream_join(c->device, c->stream, c->streams)
                     : 0;
  if (rc == 0)
    rc = gpuipc__stream_word_write(
        c->device, c->stream, c->words + (uint64_t)((uint8_t *)w - c->t->base),
        s);
  if (rc != 0)
    return rc;
  uint64_t deadline = gpuipc__deadline(c->timeout_ms);
  unsigned nap = 10;
  while ((int64_t)(atomic_load(w) - s) < 0) {
    if (gpuipc__now_ns() >= deadline)
      return gpuipc__err(-ETIMEDOUT, "gpuipc_share_copy(%s): the copies "
                         "queued on the stream did not complete within %d ms",
                         c->round, c->timeout_ms);
    gpuipc__share_beat(c->t, c->me);
    gpuipc__sleep_us(nap);
    nap = nap < 1000 ? nap * 2 : 1000;
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
