/*
 * The members' chain. Each member takes a ticket as it joins (1, 2, ...
 * in the order members joined) and has every chunk in order, each from
 * its *parent*: the serving server with the highest ticket below its own
 * (a non-server, which nobody copies from: the serving server with the
 * highest ticket of all). A member with no parent heads the chain: it
 * claims the chunks in order and copies them from the publisher. So each
 * byte leaves the publisher's memory once, every member's links take in
 * each byte once, and a member sends each byte on once at most: a chain
 * of copies at the speed of one link, pipelined chunk by chunk, which two
 * streams pulling shards from the publisher and from each other do not
 * reach (docs/shared-copy.md has the figures).
 *
 * A ticket is taken so that a member that holds ticket T finds every
 * lower ticket in its member's slot: the member writes the ticket it
 * hopes for into its slot, then swaps the header's count from that ticket
 * to the next; a member whose swap failed tries again with the count it
 * found. A member whose ticket is below one's own but is not LIVE yet is
 * still joining: its successor waits for it, while its process lives and
 * at most GPUIPC__SHARE_PATIENCE_MS. So does a member whose parent makes
 * no progress, before it passes that parent over: it copies from the next
 * one up the chain, or heads the chain; a member with a parent it passed
 * over, or with none, claims its chunks as the head does.
 */
#include "share/share.h"

uint32_t gpuipc__share_ticket_take(struct share_table *t, int me)
{
  struct share_member *m = &t->members[me];
  uint32_t n = atomic_load(&t->hdr->tickets);
  for (;;) {
    atomic_store(&m->ticket, n + 1);
    if (atomic_compare_exchange_weak(&t->hdr->tickets, &n, n + 1))
      return n + 1;
  }
}

/* How long a member waits on one before it: the patience, or the
 * timeout when that is shorter. */
static uint64_t patience_ns(const struct share_call *c)
{
  int ms = GPUIPC__SHARE_PATIENCE_MS;
  if (c->timeout_ms >= 0 && c->timeout_ms < ms)
    ms = c->timeout_ms;
  return (uint64_t)ms * 1000000ull;
}

/* Whether to wait for member @s, which holds a ticket below ours but is
 * not LIVE yet. */
static bool joining(struct share_call *c, int s, uint64_t now)
{
  if (gpuipc__share_gone(c->t, s, c->peers, now))
    return false;
  if (c->jwait_ns[s] == 0)
    c->jwait_ns[s] = now;
  return now - c->jwait_ns[s] < patience_ns(c);
}

int gpuipc__share_parent(struct share_call *c, uint64_t now)
{
  struct share_table *t = c->t;
  int best = -1;
  uint32_t best_ticket = 0;
  for (int s = 0; s < GPUIPC__SHARE_MEMBERS; s++) {
    if (s == c->me || c->skip[s] || atomic_load(&t->members[s].pid) == 0)
      continue;
    uint32_t tk = atomic_load(&t->members[s].ticket);
    if (tk == 0 || tk > GPUIPC__SHARE_MEMBERS)
      continue; /* none yet (it gets one above ours), or not a ticket */
    if (c->server && tk >= c->ticket)
      continue;
    uint32_t f = atomic_load(&t->members[s].flags);
    if (!(f & GPUIPC__SM_LIVE)) {
      if (c->server && !(f & (GPUIPC__SM_LEFT | GPUIPC__SM_FAILED)) &&
          !(f & ~GPUIPC__SM_KNOWN) && joining(c, s, now))
        return -2;
      continue;
    }
    if (tk > best_ticket && gpuipc__share_serving(t, s, c->peers, now)) {
      best_ticket = tk;
      best = s;
    }
  }
  return best;
}

bool gpuipc__share_parent_stalled(struct share_call *c, int p,
                                  uint64_t prefix, uint64_t now)
{
  if (c->pwait_slot != p || c->pwait_prefix != prefix) {
    c->pwait_slot = p;
    c->pwait_prefix = prefix;
    c->pwait_ns = now;
    return false;
  }
  return now - c->pwait_ns >= patience_ns(c);
}
