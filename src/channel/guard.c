/*
 * Channels: the guard, a thread that lets go of stream waits on the ready
 * words of a peer that went away (ready.c).
 *
 * A receiver's stream waiting on a ready word waits until the sender's
 * stream writes it. A sender that dies first never does, and the
 * receiver's GPU work behind the wait -- and any host call that waits for
 * that stream, such as a synchronisation -- would wait for ever, however
 * the receiving program is written. So while a channel's streams wait on
 * its peer's ready words, the guard (one thread per process, started on
 * the first such wait) watches the channel's socket; the peer's end of it
 * closes when the peer closes or dies. Then the guard marks the channel
 * broken (GPUIPC_E_PEER_GONE, as a call that saw the hang-up would) and
 * writes into each ready word what the channel's streams wait for.
 *
 * The thread sleeps in poll() on the watched sockets (no events asked:
 * a hang-up is always reported), waking every GUARD_TICK_MS to take in
 * the channels added meanwhile; it reads nothing from the sockets. A
 * channel leaves the watch at its close, under the lock the guard holds
 * while it touches a channel, so the guard never uses one that is gone.
 * A child made by fork() has no guard thread: its first wait starts one.
 */
#include "channel/channel.h"
#include "os/os.h"

#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#define GUARD_TICK_MS 50

static pthread_mutex_t guard_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gpuipc_channel **watched;
static int nwatched, capwatched;
static pid_t guard_pid; /* the process whose thread runs (0: none) */

void gpuipc__chan_ready_unblock(struct gpuipc_channel *ch)
{
  _Atomic uint64_t *waits = ch->rx.ready_wait;
  if (waits == NULL || ch->rx_ready == NULL)
    return;
  for (uint32_t i = 0; i < ch->rx.depth; i++) {
    uint64_t want = atomic_load(&waits[i]);
    uint64_t cur = atomic_load(&ch->rx_ready[i]);
    /* Raise the word to what is waited for; never lower it. */
    while ((int64_t)(cur - want) < 0 &&
           !atomic_compare_exchange_weak(&ch->rx_ready[i], &cur, want))
      ;
  }
}

/* The peer of @ch hung up: break it, let go of its streams' waits. Lock
 * held. */
static void guard_fire(struct gpuipc_channel *ch)
{
  gpuipc__chan_break(ch, GPUIPC_E_PEER_GONE);
  gpuipc__chan_ready_unblock(ch);
}

static void *guard_main(void *arg)
{
  (void)arg;
  struct pollfd *fds = NULL;
  int cap = 0;
  for (;;) {
    pthread_mutex_lock(&guard_lock);
    int n = nwatched;
    if (n > cap) {
      struct pollfd *f = realloc(fds, (size_t)n * sizeof(*f));
      if (f != NULL) {
        fds = f;
        cap = n;
      }
    }
    n = n < cap ? n : cap;
    for (int i = 0; i < n; i++)
      fds[i] = (struct pollfd){.fd = watched[i]->sock, .events = 0};
    pthread_mutex_unlock(&guard_lock);
    int r = poll(fds, (nfds_t)n, GUARD_TICK_MS);
    if (r <= 0)
      continue;
    pthread_mutex_lock(&guard_lock);
    for (int i = 0; i < n; i++) {
      if (fds[i].revents == 0)
        continue;
      /* The channel may have left (its descriptor number reused since):
       * look again at the one watched under that number now. */
      for (int j = 0; j < nwatched; j++) {
        struct pollfd again = {.fd = watched[j]->sock, .events = 0};
        if (watched[j]->sock == fds[i].fd && poll(&again, 1, 0) > 0) {
          guard_fire(watched[j]);
          watched[j--] = watched[--nwatched];
        }
      }
    }
    pthread_mutex_unlock(&guard_lock);
  }
  return NULL;
}

/* In a child made by fork(): no thread, nothing watched (the parent's
 * channels are the parent's), and the lock free whoever held it. */
static void guard_child(void)
{
  pthread_mutex_init(&guard_lock, NULL);
  nwatched = 0;
  guard_pid = 0;
}

static void guard_atfork(void)
{
  pthread_atfork(NULL, NULL, guard_child);
}

/* Start the thread of this process, unless it runs. Lock held. */
static int guard_start(void)
{
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, guard_atfork);
  pid_t me = getpid();
  if (guard_pid == me)
    return 0;
  int err = gpuipc__thread_start(NULL, true, guard_main, NULL);
  if (err != 0)
    return gpuipc__err(-err, "channel: cannot start the thread that watches "
                       "peers whose GPU work a stream waits for");
  guard_pid = me;
  return 0;
}

int gpuipc__chan_guard_add(struct gpuipc_channel *ch)
{
  if (ch->rx.guarded)
    return 0;
  pthread_mutex_lock(&guard_lock);
  int rc = guard_start();
  if (rc == 0 && nwatched == capwatched) {
    int ncap = capwatched ? capwatched * 2 : 16;
    struct gpuipc_channel **w = realloc(watched, (size_t)ncap * sizeof(*w));
    if (w == NULL)
      rc = gpuipc__err(-ENOMEM, "channel: out of memory");
    else {
      watched = w;
      capwatched = ncap;
    }
  }
  if (rc == 0) {
    watched[nwatched++] = ch;
    ch->rx.guarded = true;
  }
  pthread_mutex_unlock(&guard_lock);
  return rc;
}

void gpuipc__chan_guard_remove(struct gpuipc_channel *ch)
{
  if (!ch->rx.guarded)
    return;
  pthread_mutex_lock(&guard_lock);
  for (int i = 0; i < nwatched; i++)
    if (watched[i] == ch)
      watched[i--] = watched[--nwatched];
  ch->rx.guarded = false;
  pthread_mutex_unlock(&guard_lock);
}
