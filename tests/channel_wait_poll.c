/*
 * How long a channel end waiting for its peer polls before it sleeps
 * (src/channel/ring.c): twice its last wait where that was at most
 * GPUIPC_CHAN_SPIN_US, else 200 us, never more than the setting. The rule
 * itself, then the wait on a word of this process's memory: a writer
 * thread publishes only once the waiter has raised its sleep flag, which
 * it does only after polling, so each wait lasts at least its poll. Each
 * next wait must have polled as long as the one before asks.
 */
#include "channel/channel.h"
#include "test.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define US 1000ull
#define MS 1000000ull

static void rule(void)
{
  uint64_t cap = 2 * MS;
  ASSERT_EQ_U(gpuipc__chan_poll_ns(0, cap), 200 * US); /* first wait */
  ASSERT_EQ_U(gpuipc__chan_poll_ns(50 * US, cap), 200 * US);
  ASSERT_EQ_U(gpuipc__chan_poll_ns(700 * US, cap), 1400 * US);
  ASSERT_EQ_U(gpuipc__chan_poll_ns(1500 * US, cap), cap);
  ASSERT_EQ_U(gpuipc__chan_poll_ns(cap, cap), cap);
  /* A wait longer than the cap: the peer is not steady, back to 200 us. */
  ASSERT_EQ_U(gpuipc__chan_poll_ns(cap + 1, cap), 200 * US);
  ASSERT_EQ_U(gpuipc__chan_poll_ns(10ull * 1000 * MS, cap), 200 * US);
  /* The setting bounds the 200 us too; 0 never polls. */
  ASSERT_EQ_U(gpuipc__chan_poll_ns(0, 100 * US), 100 * US);
  ASSERT_EQ_U(gpuipc__chan_poll_ns(80 * US, 100 * US), 100 * US);
  ASSERT_EQ_U(gpuipc__chan_poll_ns(0, 0), 0);
  ASSERT_EQ_U(gpuipc__chan_poll_ns(700 * US, 0), 0);
  /* A larger setting lets longer waits count. */
  ASSERT_EQ_U(gpuipc__chan_poll_ns(3 * MS, 10 * MS), 6 * MS);
}

struct word {
  _Atomic uint32_t w, sleep;
};

/* Publishes 1 into the word once the waiter sleeps. */
static void *writer(void *arg)
{
  struct word *x = arg;
  uint64_t deadline = gpuipc__deadline(20000);
  while (atomic_load(&x->sleep) == 0) {
    if (gpuipc__ms_left(deadline) == 0) {
      fprintf(stderr, "the waiter never went to sleep\n");
      abort();
    }
    struct timespec ts = {0, 50 * 1000};
    nanosleep(&ts, NULL);
  }
  gpuipc__chan_publish(&x->w, 1, &x->sleep);
  return NULL;
}

static uint64_t wait_for_writer(struct gpuipc_channel *ch,
                                _Atomic uint64_t *last)
{
  struct word x = {0, 0};
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, NULL, writer, &x), 0);
  uint64_t t0 = gpuipc__now_ns();
  ASSERT_OK(gpuipc__chan_wait(ch, &x.w, 0, &x.sleep, gpuipc__deadline(20000),
                              last));
  uint64_t took = gpuipc__now_ns() - t0;
  ASSERT_EQ(pthread_join(t, NULL), 0);
  ASSERT_EQ(atomic_load(&x.w), 1);
  ASSERT_LE(atomic_load(last), took); /* the wait's own length */
  return atomic_load(last);
}

static void waits(void)
{
  struct gpuipc_channel *ch = calloc(1, sizeof(*ch));
  ASSERT_TRUE(ch != NULL);
  ch->shm = calloc(1, sizeof(*ch->shm));
  ASSERT_TRUE(ch->shm != NULL);
  ch->sock = -1; /* poll() skips it */
  ch->peer_pidfd = -1; /* the pid is asked */
  ch->peer_pid = getpid();
  /* A cap far above what a wait takes here, even on a loaded machine
   * (where the writer's naps stretch to milliseconds): each wait must
   * poll twice as long as the one before. */
  ch->spin_ns = 100 * MS;
  snprintf(ch->name, sizeof(ch->name), "poll-test");

  _Atomic uint64_t last = 0;
  uint64_t first = wait_for_writer(ch, &last);
  ASSERT_GE(first, 200 * US); /* polled 200 us before raising the flag */
  for (int i = 0; i < 3; i++) {
    uint64_t want = gpuipc__chan_poll_ns(atomic_load(&last), ch->spin_ns);
    uint64_t next = wait_for_writer(ch, &last);
    printf("wait %d: polled at least %llu us, took %llu us\n", i,
           (unsigned long long)(want / US), (unsigned long long)(next / US));
    ASSERT_GE(next, want);
  }

  /* A word that moved already, and a poll: no wait, nothing stored. */
  struct word x = {1, 0};
  atomic_store(&last, 12345);
  ASSERT_OK(gpuipc__chan_wait(ch, &x.w, 0, &x.sleep, gpuipc__deadline(1000),
                              &last));
  ASSERT_EQ_U(atomic_load(&last), 12345);
  ASSERT_RC(gpuipc__chan_wait(ch, &x.w, 1, &x.sleep, 0, &last), -EAGAIN);
  ASSERT_EQ_U(atomic_load(&last), 12345);

  /* A wait that times out stores its length too. */
  uint64_t t0 = gpuipc__now_ns();
  ASSERT_RC(gpuipc__chan_wait(ch, &x.w, 1, &x.sleep, gpuipc__deadline(30),
                              &last), -ETIMEDOUT);
  uint64_t took = gpuipc__now_ns() - t0;
  ASSERT_NE(atomic_load(&last), 12345);
  ASSERT_LE(atomic_load(&last), took);
  ASSERT_EQ(atomic_load(&x.sleep), 0);

  /* With the setting at 0 the waiter sleeps after its spin alone; it
   * still wakes for the writer. */
  ch->spin_ns = 0;
  (void)wait_for_writer(ch, &last);

  free(ch->shm);
  free(ch);
}

int main(void)
{
  rule();
  waits();
  printf("ok\n");
  return 0;
}
