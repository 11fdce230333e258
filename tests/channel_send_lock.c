/*
 * A sender that sleeps for room does not hold the send lock: while one
 * thread is blocked in gpuipc_channel_send on a full ring (depth 1, the
 * receiver held back by a gate), another thread's NONBLOCK send returns
 * -EAGAIN and gpuipc_channel_progress returns, both while the first is
 * still blocked. Then the gate opens, the blocked send goes through and
 * the receiver (a real process) checks both messages byte for byte.
 *
 * The blocked thread is known to be asleep when it has raised the ring's
 * send_sleep flag (just before its futex wait). Its send timeout is long
 * but finite only so that a regression fails instead of hanging.
 */
#include "channel/channel.h"
#include "helpers/chan_common.h"

#include <pthread.h>
#include <sched.h>
#include <fcntl.h>
#include <unistd.h>

struct sender {
  gpuipc_channel_t *ch;
  gpuipc_tensor_t t;
  int rc;
  uint64_t ticket;
  _Atomic int returned;
};

static void *send_blocked(void *arg)
{
  struct sender *s = arg;
  s->rc = gpuipc_channel_send(s->ch, &s->t, NULL, 0, &s->ticket);
  atomic_store(&s->returned, 1);
  return NULL;
}

int main(void)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("chan-lock", NULL, &dom));
  int gate[2];
  ASSERT_OK(pipe2(gate, O_CLOEXEC)); /* the peer keeps only gate[0] */
  char g[16];
  snprintf(g, sizeof(g), "%d", gate[0]);
  const char *args[] = {"recv-slow", "chan-lock", "lock", "2", g, NULL};
  int keep[] = {gate[0], -1};
  pid_t pid = test_spawn("chan_peer", args, keep);
  close(gate[0]);

  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.depth = 1;
  o.send_timeout_ms = 5000;
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, "lock", &o, &ch));
  gpuipc_buf_t *buf;
  ASSERT_OK(gpuipc_buf_alloc(3 * CHAN_SLOT, GPUIPC_KIND_HOST, -1, 0, &buf));
  uint8_t *base = gpuipc_buf_ptr(buf);
  struct chan_msg m1, m2;
  gpuipc_tensor_t t1;
  chan_msg_make(1, 0, base, buf, &m1, &t1);
  ASSERT_OK(gpuipc_channel_send(ch, &t1, NULL, 0, NULL)); /* ring full */

  struct sender s = {.ch = ch};
  chan_msg_make(2, 0, base + CHAN_SLOT, buf, &m2, &s.t);
  pthread_t th;
  ASSERT_EQ(pthread_create(&th, NULL, send_blocked, &s), 0);
  /* Until the sender sleeps on the release ring (or gave up). */
  while (!atomic_load(&ch->txd->send_sleep) && !atomic_load(&s.returned))
    sched_yield();

  gpuipc_tensor_t t3;
  struct chan_msg m3;
  chan_msg_make(3, 0, base + 2 * CHAN_SLOT, buf, &m3, &t3);
  ASSERT_RC(gpuipc_channel_send(ch, &t3, NULL, GPUIPC_SEND_NONBLOCK, NULL),
            -EAGAIN);
  ASSERT_RC(gpuipc_channel_progress(ch), 0);
  /* Both returned while the other thread still waits for room. */
  int sender_returned = atomic_load(&s.returned);
  ASSERT_EQ(sender_returned, 0);

  ASSERT_EQ(write(gate[1], "g", 1), 1);
  ASSERT_EQ(pthread_join(th, NULL), 0);
  ASSERT_OK(s.rc);
  ASSERT_EQ_U(s.ticket, 2);
  ASSERT_OK(gpuipc_channel_send_done(ch, 2, -1));
  ASSERT_EQ(test_wait(pid, 60000), 0);
  ASSERT_OK(gpuipc_channel_close(ch));
  gpuipc_buf_release(buf);
  close(gate[1]);
  ASSERT_OK(gpuipc_domain_leave(dom));
  printf("a NONBLOCK send and progress returned while a send slept\n");
  return 0;
}
