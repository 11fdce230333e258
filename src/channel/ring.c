/*
 * Waiting on a ring word shared with the peer. The waiter spins a little
 * (a message usually follows within microseconds), yields for a while, then
 * sleeps on a futex after raising its sleep flag; the writer publishes
 * with a sequentially consistent store and wakes only when the flag is
 * up. Between sleeps the waiter looks at the peer: a process that died
 * by kill -9 wakes nobody, so sleeps are short slices.
 *
 * How long it yields follows its last wait (gpuipc__chan_poll_ns): a
 * receiver fed a batch every 700 us, say, stays awake through the wait,
 * where a fixed 200 us would put it to sleep every time, and the wake
 * (the writer's futex call, the sleeper's return from it) would cost the
 * two sides 5 to 20 us a message.
 */
#include "channel/channel.h"
#include "os/os.h"

#include <limits.h>
#include <poll.h>
#include <sched.h>

#define SPIN_ROUNDS 2000      /* busy polls before yielding */
#define YIELD_NS 200000ull    /* then yield at least this long (if allowed) */
#define SLICE_MS 20           /* futex sleeps between peer checks */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

int gpuipc__chan_break(struct gpuipc_channel *ch, int code)
{
  int none = 0;
  atomic_compare_exchange_strong(&ch->broken, &none, code);
  return code;
}

int gpuipc__chan_broken(struct gpuipc_channel *ch, bool gone_too)
{
  int b = atomic_load(&ch->broken);
  if (b == 0 || (b == GPUIPC_E_PEER_GONE && !gone_too))
    return 0;
  if (b == GPUIPC_E_PEER_GONE)
    return gpuipc__err(b, "channel %s: the peer (pid %d) is gone", ch->name,
                       (int)ch->peer_pid);
  if (b == GPUIPC_E_PROTO)
    return gpuipc__err(b, "channel %s: the peer broke the protocol earlier",
                       ch->name);
  return gpuipc__err(b, "channel %s: out of step with its peer since an "
                     "earlier failure (%s)", ch->name, gpuipc_strerror(b));
}

int gpuipc__chan_peer_check(struct gpuipc_channel *ch, unsigned look)
{
  int rc = gpuipc__chan_broken(ch, true);
  if (rc != 0)
    return rc;
  const char *why = NULL;
  if (atomic_load_explicit(&ch->shm->closed[1 - ch->end],
                           memory_order_acquire))
    why = "closed its end";
  /* A hang-up, and the peer's exit too where its pidfd is open, in one
   * poll() (which skips a negative descriptor); the exit alone is
   * gpuipc__chan_peer_alive's. */
  bool exit_seen = false;
  if (why == NULL && (look & GPUIPC__PEER_SOCK)) {
    exit_seen = (look & GPUIPC__PEER_PID) && ch->peer_pidfd >= 0;
    struct pollfd p[2] = {
        {.fd = ch->sock, .events = 0},
        {.fd = exit_seen ? ch->peer_pidfd : -1, .events = POLLIN}};
    int n = poll(p, 2, 0);
    if (n > 0 && (p[0].revents & (POLLHUP | POLLERR | POLLNVAL)))
      why = "hung up its socket";
    else if (n > 0 && (p[1].revents & (POLLIN | POLLHUP | POLLERR)))
      why = "exited";
    exit_seen = exit_seen && n >= 0;
  }
  if (why == NULL && (look & GPUIPC__PEER_PID) && !exit_seen &&
      !gpuipc__chan_peer_alive(ch))
    why = "exited";
  if (why == NULL)
    return 0;
  gpuipc__chan_break(ch, GPUIPC_E_PEER_GONE);
  return gpuipc__err(GPUIPC_E_PEER_GONE, "channel %s: the peer (pid %d) %s",
                     ch->name, (int)ch->peer_pid, why);
}

bool gpuipc__chan_peer_alive(const struct gpuipc_channel *ch)
{
  if (ch->peer_pidfd < 0)
    return gpuipc__pid_alive(ch->peer_pid);
  struct pollfd p = {.fd = ch->peer_pidfd, .events = POLLIN};
  int n = poll(&p, 1, 0);
  if (n < 0 || (n > 0 && (p.revents & POLLNVAL)))
    return gpuipc__pid_alive(ch->peer_pid); /* EINTR, ENOMEM */
  return n == 0;
}

void gpuipc__chan_publish(_Atomic uint32_t *word, uint32_t val,
                          _Atomic uint32_t *sleep)
{
  atomic_store(word, val); /* seq_cst: ordered before the flag's load */
  if (atomic_load(sleep))
    gpuipc__futex_wake((uint32_t *)word, INT_MAX);
}

uint64_t gpuipc__chan_poll_ns(uint64_t last_ns, uint64_t cap_ns)
{
  uint64_t w = last_ns <= cap_ns ? 2 * last_ns : 0;
  if (w < YIELD_NS)
    w = YIELD_NS;
  return w < cap_ns ? w : cap_ns;
}

/* gpuipc__chan_wait past its first look: spin, poll (*@t0: when the poll
 * began, 0 if the spin saw the word move), sleep. The clock is read only
 * once the spin is over: a message that comes within it costs no more than
 * it did without the poll rule. */
static int wait_long(struct gpuipc_channel *ch, _Atomic uint32_t *word,
                     uint32_t seen, _Atomic uint32_t *sleep,
                     uint64_t deadline, _Atomic uint64_t *last_ns,
                     uint64_t *t0)
{
  for (int i = 0; i < SPIN_ROUNDS; i++) {
    if (atomic_load_explicit(word, memory_order_acquire) != seen)
      return 0;
    cpu_relax();
  }
  uint64_t poll_ns = gpuipc__chan_poll_ns(
      atomic_load_explicit(last_ns, memory_order_relaxed), ch->spin_ns);
  *t0 = gpuipc__now_ns();
  while (gpuipc__now_ns() - *t0 < poll_ns) {
    if (atomic_load_explicit(word, memory_order_acquire) != seen)
      return 0;
    if (gpuipc__now_ns() >= deadline)
      return -ETIMEDOUT;
    sched_yield();
  }
  for (;;) {
    atomic_store(sleep, 1);
    if (atomic_load(word) != seen) {
      atomic_store_explicit(sleep, 0, memory_order_relaxed);
      return 0;
    }
    int rc = gpuipc__chan_peer_check(ch, GPUIPC__PEER_SOCK |
                                                GPUIPC__PEER_PID);
    if (rc != 0) {
      atomic_store_explicit(sleep, 0, memory_order_relaxed);
      return rc;
    }
    int left = gpuipc__ms_left(deadline);
    if (left == 0) {
      atomic_store_explicit(sleep, 0, memory_order_relaxed);
      return -ETIMEDOUT;
    }
    int ms = left < 0 || left > SLICE_MS ? SLICE_MS : left;
    gpuipc__futex_wait((uint32_t *)word, seen, ms);
    atomic_store_explicit(sleep, 0, memory_order_relaxed);
    if (atomic_load_explicit(word, memory_order_acquire) != seen)
      return 0;
  }
}

int gpuipc__chan_wait(struct gpuipc_channel *ch, _Atomic uint32_t *word,
                      uint32_t seen, _Atomic uint32_t *sleep,
                      uint64_t deadline, _Atomic uint64_t *last_ns)
{
  if (atomic_load_explicit(word, memory_order_acquire) != seen)
    return 0;
  if (deadline == 0) {
    int rc = gpuipc__chan_peer_check(ch, GPUIPC__PEER_SOCK |
                                                GPUIPC__PEER_PID);
    return rc != 0 ? rc : -EAGAIN;
  }
  uint64_t t0 = 0;
  int rc = wait_long(ch, word, seen, sleep, deadline, last_ns, &t0);
  if (rc == 0 || rc == -ETIMEDOUT)
    atomic_store_explicit(last_ns, t0 != 0 ? gpuipc__now_ns() - t0 : 0,
                          memory_order_relaxed);
  return rc;
}
