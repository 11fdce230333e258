/*
 * Claims on chunks, and what a member knows of its peers. The head of
 * the chain (chain.c) claims the chunks in order. A claim is a
 * compare-and-swap of the chunk's claim word from 0 (free) to the
 * member's word (epoch << 8 | slot + 1); a stale claim is taken over by a
 * swap from the word seen to one with the epoch raised, so the late done
 * word of the old claim never matches the new one. Every word read from
 * the table is checked before it is used: a slot out of range, a member
 * that is not LIVE or whose process is gone, count as no server at all.
 */
#include "share/share.h"
#include "os/os.h"

/* How often a peer's pid is looked at while others wait on it. */
#define PID_CHECK_NS 2000000ull

static void peer_refresh(struct share_table *t, int slot,
                         struct share_peer *p, uint64_t now)
{
  struct share_member *m = &t->members[slot];
  /* A member writes its start time before it is LIVE: before that, only
   * its pid tells. */
  bool live = (atomic_load(&m->flags) & GPUIPC__SM_LIVE) != 0;
  uint32_t pid = atomic_load(&m->pid);
  if (pid != p->pid || (live && !p->have_start)) {
    p->pid = pid;
    p->have_start = live;
    p->start_time = live ? m->start_time : 0;
    p->checked_ns = 0;
    p->gone = false;
  }
  if (p->gone || now - p->checked_ns < PID_CHECK_NS)
    return;
  p->checked_ns = now;
  p->gone = gpuipc__share_pid_gone(pid, p->have_start, p->start_time);
}

bool gpuipc__share_pid_gone(uint32_t pid, bool have_start,
                            uint64_t start_time)
{
  uint64_t st = 0;
  if (pid == 0 || pid > (uint32_t)INT32_MAX || !gpuipc__pid_alive((pid_t)pid))
    return true;
  return have_start && (gpuipc__pid_start_time((pid_t)pid, &st) != 0 ||
                        st != start_time);
}

bool gpuipc__share_gone(struct share_table *t, int slot,
                        struct share_peer *peers, uint64_t now)
{
  if (slot < 0 || slot >= GPUIPC__SHARE_MEMBERS)
    return true;
  uint32_t f = atomic_load(&t->members[slot].flags);
  if ((f & GPUIPC__SM_LEFT) || (f & ~GPUIPC__SM_KNOWN))
    return true;
  peer_refresh(t, slot, &peers[slot], now);
  return peers[slot].gone;
}

bool gpuipc__share_serving(struct share_table *t, int slot,
                           struct share_peer *peers, uint64_t now)
{
  if (slot < 0 || slot >= GPUIPC__SHARE_MEMBERS)
    return false;
  uint32_t f = atomic_load(&t->members[slot].flags);
  uint32_t bad = GPUIPC__SM_LEAVING | GPUIPC__SM_LEFT | GPUIPC__SM_FAILED;
  if ((f & ~GPUIPC__SM_KNOWN) || (f & bad) ||
      (f & (GPUIPC__SM_LIVE | GPUIPC__SM_SERVER)) !=
          (GPUIPC__SM_LIVE | GPUIPC__SM_SERVER))
    return false;
  peer_refresh(t, slot, &peers[slot], now);
  return !peers[slot].gone;
}

/*
 * The claim word a member takes chunk @i with (claim @old now): an epoch
 * above both @old's and the done word's, so that no done word already
 * there (a liar's, or one from before the chunk was made free) marks the
 * chunk done by this member before its copy has landed. Below 2^56; past
 * it, 1 (never 0: a free chunk).
 */
static uint64_t next_word(struct share_table *t, long i, uint64_t old, int me)
{
  uint64_t done = atomic_load_explicit(&t->chunks[i].done,
                                       memory_order_acquire);
  uint64_t e = (old >> 8) > (done >> 8) ? old >> 8 : done >> 8;
  e = e + 1 < (1ull << 56) ? e + 1 : 1;
  uint64_t w = gpuipc__share_claim_word(e, me);
  if (w == done) /* e wrapped to 1 */
    w = gpuipc__share_claim_word(2, me);
  return w;
}

bool gpuipc__share_claim_at(struct share_table *t, long i, int me,
                            uint64_t *word)
{
  uint64_t zero = 0, w = next_word(t, i, 0, me);
  if (!atomic_compare_exchange_strong(&t->chunks[i].claim, &zero, w))
    return false;
  atomic_store_explicit(&t->chunks[i].claimed_ns, gpuipc__now_ns(),
                        memory_order_relaxed);
  *word = w;
  return true;
}

bool gpuipc__share_reclaim(struct share_table *t, long i, uint64_t old,
                           int me, uint64_t *word)
{
  uint64_t w = next_word(t, i, old, me);
  if (!atomic_compare_exchange_strong(&t->chunks[i].claim, &old, w))
    return false;
  atomic_store_explicit(&t->chunks[i].claimed_ns, gpuipc__now_ns(),
                        memory_order_relaxed);
  *word = w;
  return true;
}

bool gpuipc__share_any_live(struct share_table *t, int except,
                            struct share_peer *peers)
{
  uint64_t now = gpuipc__now_ns();
  for (int s = 0; s < GPUIPC__SHARE_MEMBERS; s++) {
    if (s == except || atomic_load(&t->members[s].pid) == 0 ||
        (atomic_load(&t->members[s].flags) & GPUIPC__SM_FAILED))
      continue;
    peers[s].checked_ns = 0; /* look at its pid now */
    if (!gpuipc__share_gone(t, s, peers, now))
      return true;
  }
  return false;
}

void gpuipc__share_mark_failed(struct share_table *t, int slot)
{
  if (slot >= 0 && slot < GPUIPC__SHARE_MEMBERS)
    atomic_fetch_or(&t->members[slot].flags, GPUIPC__SM_FAILED);
}
