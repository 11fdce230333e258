/*
 * Channels: the two ends' events across a close.
 *
 * An end uses the peer's interprocess events (opens them, queries them,
 * makes its streams wait on them) and the peer destroys them when it
 * closes, or when its process ends. CUDA leaves any use of an imported
 * event undefined once its exporter destroyed it; on an H100 a stream
 * made to wait on one waits for ever. So:
 *
 *   - the closing end first waits, bounded, until every event it recorded
 *     and handed to the peer has completed, then says in the header
 *     whether they all did (shm->settled[end]: DONE or UNFINISHED), then
 *     waits until the peer is not in the middle of using one
 *     (shm->ev_use[peer]), and only then destroys them;
 *   - an end about to use the peer's events says so first (ev_use[end]),
 *     then looks at shm->closed[peer]: if the peer has not closed, the
 *     events live until the use ends; if it has, the end uses none of
 *     them: DONE means each one is complete (the work it stood for is
 *     over), UNFINISHED that the work is not known to be, and the message
 *     fails with GPUIPC_E_PEER_GONE.
 *
 * The two stores and the two loads are sequentially consistent (store,
 * then load of the other word, on each side), so at least one end sees
 * the other's word: either the user sees closed[] and keeps off, or the
 * closer sees ev_use[] and waits for it to go.
 *
 * A peer that died without closing destroyed its events with no warning;
 * an end that knows it (broken is GPUIPC_E_PEER_GONE) keeps off them.
 *
 * Release words (channel.h) live in the segment, not in the peer: one
 * that has reached its message says so whatever became of the receiver.
 * The closing receiver waits for the words it asked its streams to write
 * as for its events, and DONE covers them too; a sender reads a word that
 * has not arrived under the same rules as an event (send.c). Ready words
 * (ready.c) likewise: a closing sender waits for those its streams were
 * asked to write, and DONE covers them; a closing receiver lets go of
 * its streams' waits on the peer's.
 */
#include "channel/channel.h"
#include "os/os.h"

#include <sched.h>

/* How long a closing end waits for its own events (at most). */
#define SETTLE_MAX_MS 5000
/* How long a user of the peer's events waits for the peer to settle, and
 * a closer for the peer's use under way to end. */
#define SETTLE_PEER_MS 5000

int gpuipc__chan_peer_ev_enter(struct gpuipc_channel *ch, const char *who)
{
  struct gpuipc__chan_shm *shm = ch->shm;
  int peer = 1 - ch->end;
  atomic_store(&shm->ev_use[ch->end].in_use, 1);
  if (atomic_load(&shm->closed[peer]) == 0) {
    if (atomic_load(&ch->broken) != GPUIPC_E_PEER_GONE)
      return 0;
    atomic_store(&shm->ev_use[ch->end].in_use, 0);
    return gpuipc__err(GPUIPC_E_PEER_GONE, "%s: the peer (pid %d) is gone "
                       "and its CUDA events with it", who, (int)ch->peer_pid);
  }
  atomic_store(&shm->ev_use[ch->end].in_use, 0);
  uint64_t deadline = gpuipc__now_ns() + (uint64_t)SETTLE_PEER_MS * 1000000;
  for (;;) {
    uint32_t s = atomic_load(&shm->settled[peer]);
    if (s == GPUIPC__CHAN_SETTLED_DONE)
      return 1;
    if (s != GPUIPC__CHAN_SETTLED_NOT || gpuipc__now_ns() >= deadline ||
        !gpuipc__chan_peer_alive(ch))
      return gpuipc__err(GPUIPC_E_PEER_GONE, "%s: the peer (pid %d) closed "
                         "the channel before its GPU work on the message "
                         "was known to be complete", who, (int)ch->peer_pid);
    gpuipc__sleep_us(100);
  }
}

void gpuipc__chan_peer_ev_leave(struct gpuipc_channel *ch)
{
  atomic_store(&ch->shm->ev_use[ch->end].in_use, 0);
}

/* One turn of waiting for our own GPU work: false once @deadline has
 * passed; else yield (the first 64 turns) or nap 50 us. */
static bool settle_turn(unsigned spins, uint64_t deadline)
{
  if (gpuipc__now_ns() >= deadline)
    return false;
  if (spins < 64)
    sched_yield();
  else
    gpuipc__sleep_us(50);
  return true;
}

/* Wait until each event of @pool the peer has (@sent) completed, or
 * @deadline; whether they all did. */
static bool pool_settle(gpuipc_event_t **pool, const uint8_t *sent, int ndev,
                        uint32_t depth, uint64_t deadline)
{
  if (pool == NULL)
    return true;
  for (size_t i = 0; i < (size_t)ndev * depth; i++) {
    if (pool[i] == NULL || !sent[i])
      continue;
    for (unsigned spins = 0;; spins++) {
      int q = gpuipc_event_query(pool[i]);
      if (q != -EAGAIN)
        break; /* complete, or an error: nothing more will come of it */
      if (!settle_turn(spins, deadline))
        return false;
    }
  }
  return true;
}

/* Whether slot @i's last release word has been written. */
static bool word_written(const struct gpuipc_channel *ch, uint32_t i)
{
  uint64_t want = ch->rx.word_seq[i];
  return want == 0 || (int64_t)(atomic_load(&ch->rx_words[i]) - want) >= 0;
}

/* Wait until each release word our streams were asked to write has been
 * written, or @deadline; whether they all were. rel_lock held. */
static bool words_settle(struct gpuipc_channel *ch, uint64_t deadline)
{
  const struct gpuipc__rx *rx = &ch->rx;
  if (rx->word_seq == NULL)
    return true;
  for (uint32_t i = 0; i < rx->depth; i++)
    for (unsigned spins = 0; !word_written(ch, i); spins++)
      if (!settle_turn(spins, deadline))
        return false;
  return true;
}

bool gpuipc__chan_words_written(const struct gpuipc_channel *ch)
{
  if (ch->rx.word_seq == NULL)
    return true;
  for (uint32_t i = 0; i < ch->rx.depth; i++)
    if (!word_written(ch, i))
      return false;
  return true;
}

void gpuipc__chan_settle(struct gpuipc_channel *ch)
{
  struct gpuipc__chan_shm *shm = ch->shm;
  if (shm == NULL)
    return;
  int peer = 1 - ch->end;
  /* A peer that is gone cannot use them. (One that closed may still have
   * a stream wait on one of them queued: it is settled all the same.) */
  if (atomic_load(&ch->broken) == GPUIPC_E_PEER_GONE &&
      atomic_load(&shm->closed[peer]) == 0)
    return;
  int ms = ch->dom_timeout_ms >= 0 && ch->dom_timeout_ms < SETTLE_MAX_MS
               ? ch->dom_timeout_ms
               : SETTLE_MAX_MS;
  uint64_t deadline = gpuipc__now_ns() + (uint64_t)ms * 1000000;
  pthread_mutex_lock(&ch->tx.lock);
  bool done = pool_settle(ch->tx.ev, ch->tx.ev_sent, ch->tx.ndev,
                          ch->tx.depth, deadline);
  done = gpuipc__chan_ready_settle(ch, deadline) && done;
  pthread_mutex_unlock(&ch->tx.lock);
  /* Our streams' waits on the peer's ready words: let go once reached,
   * or at the deadline (nobody else would write them). */
  gpuipc__chan_ready_close(ch, deadline);
  pthread_mutex_lock(&ch->rx.rel_lock);
  done = done && pool_settle(ch->rx.rel_ev, ch->rx.rel_ev_sent, ch->rx.ndev,
                             ch->rx.depth, deadline);
  done = done && words_settle(ch, deadline);
  pthread_mutex_unlock(&ch->rx.rel_lock);
  atomic_store(&shm->settled[ch->end], done ? GPUIPC__CHAN_SETTLED_DONE
                                            : GPUIPC__CHAN_SETTLED_UNFINISHED);
  /* closed[end] was stored before this: a use that began before the peer
   * could see it ends soon (one open, query or stream wait). */
  deadline = gpuipc__now_ns() + (uint64_t)SETTLE_PEER_MS * 1000000;
  while (atomic_load(&shm->ev_use[peer].in_use) != 0 &&
         gpuipc__now_ns() < deadline && gpuipc__chan_peer_alive(ch))
    sched_yield();
}
