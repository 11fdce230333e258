/*
 * Flow control: a receiver that does not keep up makes the sender wait or
 * fail, never lose or reorder. With depth 4 and a receiver held back by a
 * gate, four sends go through; a fifth fails at once with
 * GPUIPC_SEND_NONBLOCK (-EAGAIN) and after the send timeout without it
 * (-ETIMEDOUT), and neither leaves anything behind. Then the gate opens
 * and 3000 more messages follow through a receiver that pauses now and
 * then; it checks that every message arrives once, in order, intact.
 */
#include "helpers/chan_common.h"

#include <unistd.h>

#define N 3000
#define DEPTH 4

int main(void)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("chan-flow", NULL, &dom));
  int gate[2];
  ASSERT_OK(pipe(gate));
  char n[16], g[16];
  snprintf(n, sizeof(n), "%d", N);
  snprintf(g, sizeof(g), "%d", gate[0]);
  const char *args[] = {"recv-slow", "chan-flow", "flow", n, g, NULL};
  int keep[] = {gate[0], -1};
  pid_t pid = test_spawn("chan_peer", args, keep);
  close(gate[0]);

  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.depth = DEPTH;
  o.send_timeout_ms = 300;
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, "flow", &o, &ch));
  gpuipc_buf_t *buf;
  ASSERT_OK(gpuipc_buf_alloc(CHAN_SLOT * CHAN_SLOTS, GPUIPC_KIND_HOST, -1, 0,
                             &buf));
  uint8_t *base = gpuipc_buf_ptr(buf);
  struct chan_msg m;
  gpuipc_tensor_t t;
  uint64_t i = 1, ticket;
  for (; i <= DEPTH; i++) {
    chan_msg_make(i, 0, base + (i % CHAN_SLOTS) * CHAN_SLOT, buf, &m, &t);
    ASSERT_OK(gpuipc_channel_send(ch, &t, NULL, 0, &ticket));
  }
  chan_msg_make(i, 0, base + (i % CHAN_SLOTS) * CHAN_SLOT, buf, &m, &t);
  ASSERT_RC(gpuipc_channel_send(ch, &t, NULL, GPUIPC_SEND_NONBLOCK, NULL), -EAGAIN);
  ASSERT_ERR_MENTIONS("4 messages in flight");
  ASSERT_RC(gpuipc_channel_send(ch, &t, NULL, 0, NULL), -ETIMEDOUT);
  ASSERT_ERR_MENTIONS("none given back");
  ASSERT_RC(gpuipc_channel_send_done(ch, 1, 0), -EAGAIN);
  gpuipc_channel_info_t info = {.size = sizeof(info)};
  ASSERT_OK(gpuipc_channel_info(ch, &info));
  ASSERT_EQ(info.sent, DEPTH);
  ASSERT_EQ(info.in_flight, DEPTH);

  ASSERT_EQ(write(gate[1], "g", 1), 1);
  uint64_t waits = 0;
  for (; i <= N; i++) {
    uint8_t *p = base + (i % CHAN_SLOTS) * CHAN_SLOT;
    if (i > CHAN_SLOTS)
      ASSERT_OK(gpuipc_channel_send_done(ch, i - CHAN_SLOTS, -1));
    chan_msg_make(i, 0, p, buf, &m, &t);
    int rc;
    while ((rc = gpuipc_channel_send(ch, &t, NULL, GPUIPC_SEND_NONBLOCK, &ticket)) ==
           -EAGAIN) {
      /* Full: block until the oldest message is given back. */
      waits++;
      ASSERT_OK(gpuipc_channel_send_done(ch, i - DEPTH, -1));
    }
    ASSERT_OK(rc);
    ASSERT_EQ_U(ticket, i);
    ASSERT_OK(gpuipc_channel_info(ch, &info));
    ASSERT_LE(info.in_flight, DEPTH);
  }
  ASSERT_OK(gpuipc_channel_send_done(ch, N, -1));
  ASSERT_EQ(test_wait(pid, 120000), 0);
  printf("%d messages through depth %d; the sender waited %llu times\n", N,
         DEPTH, (unsigned long long)waits);
  ASSERT_GT(waits, 0);
  ASSERT_OK(gpuipc_channel_close(ch));
  gpuipc_buf_release(buf);
  close(gate[1]);
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
