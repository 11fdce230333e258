/*
 * Copy mode and staging: gpuipc_channel_recv_into lands each message in the
 * receiver's own memory (chan_peer recv-into checks every byte) and gives
 * the sender's buffer back without a view. Odd messages come from a HOST
 * buffer (zero-copy source), even ones from malloc'd memory, which is
 * staged through the channel's slots and never exported: the receiver
 * imports exactly two buffers in all. A destination of the wrong shape is
 * refused and the message waits for the right one.
 */
#include "helpers/chan_common.h"

#include <unistd.h>

#define N 2000

int main(void)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("chan-copy", NULL, &dom));
  char n[16];
  snprintf(n, sizeof(n), "%d", N);
  const char *args[] = {"recv-into", "chan-copy", "copy", n, NULL};
  pid_t pid = test_spawn("chan_peer", args, NULL);
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.depth = 16;
  o.stage_slots = 3;
  o.stage_slot_bytes = CHAN_SLOT;
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, "copy", &o, &ch));
  gpuipc_buf_t *buf;
  ASSERT_OK(gpuipc_buf_alloc(CHAN_SLOT * CHAN_SLOTS, GPUIPC_KIND_HOST, -1, 0,
                             &buf));
  uint8_t *foreign = malloc(CHAN_SLOT);
  ASSERT_TRUE(foreign != NULL);
  uint64_t tickets[N + 1];
  for (uint64_t i = 1; i <= N; i++) {
    struct chan_msg m;
    gpuipc_tensor_t t;
    if (i % 2) {
      if (i > CHAN_SLOTS)
        ASSERT_OK(gpuipc_channel_send_done(ch, tickets[i - CHAN_SLOTS], 30000));
      chan_msg_make(i, 1, (uint8_t *)gpuipc_buf_ptr(buf) +
                              (i % CHAN_SLOTS) * CHAN_SLOT,
                    buf, &m, &t);
    } else {
      /* Reused at once: the bytes are copied out by gpuipc_channel_send. */
      chan_msg_make(i, 1, foreign, NULL, &m, &t);
      if (i % 4 == 0)
        t.dl.strides = NULL; /* row-major either way */
    }
    ASSERT_OK(gpuipc_channel_send(ch, &t, NULL, 0, &tickets[i]));
    if (i % 2 == 0)
      memset(foreign, 0xee, CHAN_SLOT);
  }
  ASSERT_OK(gpuipc_channel_send_done(ch, N, 30000));
  ASSERT_EQ(test_wait(pid, 120000), 0);
  gpuipc_channel_info_t info = {.size = sizeof(info)};
  ASSERT_OK(gpuipc_channel_info(ch, &info));
  ASSERT_EQ(info.buffers_sent, 2);

  /* Any size is staged (tests/channel_large.c), but not an absurd one:
   * refused before anything is allocated or sent. */
  int64_t absurd[2] = {(int64_t)1 << 30, (int64_t)1 << 20}; /* 2^50 bytes */
  gpuipc_tensor_t t = {.dl = {.data = foreign,
                              .device = {GPUIPC_DL_CPU, 0},
                              .ndim = 2,
                              .dtype = {GPUIPC_DL_UINT, 8, 1},
                              .shape = absurd}};
  ASSERT_RC(gpuipc_channel_send(ch, &t, NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("outside the");
  ASSERT_OK(gpuipc_channel_info(ch, &info));
  ASSERT_EQ(info.sent, N);
  ASSERT_OK(gpuipc_channel_close(ch));
  gpuipc_buf_release(buf);
  free(foreign);
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
