/*
 * A channel keeps order and bytes: 100 000 messages of changing dtype,
 * shape and strides go from this process to a chan_peer process, which
 * checks every field and every byte of each against what message i must
 * be. The sender reuses 64 slots of one HOST buffer and rewrites a slot
 * only after gpuipc_channel_send_done says the receiver gave its last message back.
 * The release callback sees every message come back, in order.
 */
#include "helpers/chan_common.h"

#include <unistd.h>

#define N 100000

/* Release callbacks come once per message, in order here. */
static uint64_t released, out_of_order;

static void on_release(gpuipc_channel_t *ch, uint64_t ticket, void *user)
{
  out_of_order += ticket != released + 1 || user != &released;
  released = ticket;
}

int main(void)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("chan-order", NULL, &dom));
  char n[32];
  snprintf(n, sizeof(n), "%d", N);
  const char *args[] = {"recv-order", "chan-order", "order", n, NULL};
  pid_t pid = test_spawn("chan_peer", args, NULL);

  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, "order", NULL, &ch));
  ASSERT_OK(gpuipc_channel_on_release(ch, on_release, &released));
  gpuipc_buf_t *buf;
  ASSERT_OK(gpuipc_buf_alloc(CHAN_SLOT * CHAN_SLOTS, GPUIPC_KIND_HOST, -1, 0,
                             &buf));
  uint64_t *tickets = calloc(N + 1, sizeof(*tickets));
  ASSERT_TRUE(tickets != NULL);
  for (uint64_t i = 1; i <= N; i++) {
    if (i > CHAN_SLOTS) /* the slot's previous message must be free */
      ASSERT_OK(gpuipc_channel_send_done(ch, tickets[i - CHAN_SLOTS], 30000));
    uint8_t *p = (uint8_t *)gpuipc_buf_ptr(buf) + (i % CHAN_SLOTS) * CHAN_SLOT;
    struct chan_msg m;
    gpuipc_tensor_t t;
    chan_msg_make(i, 0, p, buf, &m, &t);
    ASSERT_OK(gpuipc_channel_send(ch, &t, NULL, 0, &tickets[i]));
    ASSERT_EQ_U(tickets[i], i);
  }
  ASSERT_OK(gpuipc_channel_send_done(ch, tickets[N], 30000));
  ASSERT_EQ(test_wait(pid, 120000), 0);

  gpuipc_channel_info_t info = {.size = sizeof(info)};
  ASSERT_OK(gpuipc_channel_info(ch, &info));
  ASSERT_EQ(info.sent, N);
  ASSERT_EQ(info.buffers_sent, 1); /* the handle went once */
  ASSERT_OK(gpuipc_channel_progress(ch) >= 0 ? 0 : -1);
  ASSERT_OK(gpuipc_channel_info(ch, &info));
  ASSERT_EQ(info.in_flight, 0);
  ASSERT_EQ_U(released, N);
  ASSERT_EQ_U(out_of_order, 0);
  /* The ticket after the last one was never sent. */
  ASSERT_RC(gpuipc_channel_send_done(ch, N + 1, 0), -EINVAL);
  ASSERT_OK(gpuipc_channel_close(ch));
  ASSERT_OK(gpuipc_buf_release(buf));
  ASSERT_OK(gpuipc_domain_leave(dom));
  free(tickets);
  printf("%d messages in order, every byte checked\n", N);
  return 0;
}
