/*
 * Staged tensors of any size: memory gpuipc did not allocate (malloc'd
 * here) and larger than a staging slot goes through a large stage, a
 * buffer of its own, and arrives as one contiguous view. The receiver
 * (tests/helpers/chan_large_peer.c) checks every byte of every message
 * against a pattern of the byte's index and the message's number.
 *
 * Channel "large" (stage_slots 2 of 1 MiB, stage_large_bytes 16 MiB,
 * depth 8; tests/helpers/chan_large.h lists its messages):
 *   - two 3 MiB messages in flight at once, held by the receiver; a third
 *     with GPUIPC_SEND_NONBLOCK gets -EAGAIN (every large stage the limits
 *     allow is in flight) and sends nothing; sent blocking, it waits until
 *     the receiver gives one back;
 *   - slot - 1, slot and slot + 1 bytes, then growing sizes that free and
 *     replace stages; the receiver sees its mapped buffers stay bounded and
 *     at the end exactly what the sender keeps: the forgets reached it.
 * Channel "huge" (default limits):
 *   - a 256 MiB message, received as a view;
 *   - a 64 TiB one, whose stage cannot be allocated: -ENOMEM naming the
 *     size, nothing sent, and the channel goes on:
 *   - a 48 MiB + 3 message, received with gpuipc_channel_recv_into.
 */
#include "helpers/chan_large.h"

#include <unistd.h>

static uint8_t *src;

static uint64_t send_msg(gpuipc_channel_t *ch, uint64_t i, size_t n,
                         unsigned flags, int want)
{
  large_fill(src, n, i);
  int64_t shape[1];
  gpuipc_tensor_t t;
  large_tensor(&t, shape, src, n);
  uint64_t ticket = 0;
  ASSERT_RC(gpuipc_channel_send(ch, &t, NULL, flags, &ticket), want);
  /* The bytes were copied out: the source may change at once. */
  memset(src, 0xee, n);
  return ticket;
}

static uint64_t sent(gpuipc_channel_t *ch)
{
  gpuipc_channel_info_t info = {.size = sizeof(info)};
  ASSERT_OK(gpuipc_channel_info(ch, &info));
  return info.sent;
}

static void large(gpuipc_domain_t *dom, int gate)
{
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.depth = LARGE_DEPTH;
  o.stage_slots = LARGE_SLOTS;
  o.stage_slot_bytes = LARGE_SLOT;
  o.stage_large_bytes = LARGE_BYTES;
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, "large", &o, &ch));

  /* 1 and 2 in flight (the receiver holds them until the gate opens). */
  send_msg(ch, 1, large_size(1), 0, 0);
  send_msg(ch, 2, large_size(2), 0, 0);
  send_msg(ch, 3, large_size(3), GPUIPC_SEND_NONBLOCK, -EAGAIN);
  ASSERT_ERR_MENTIONS("large stage");
  ASSERT_EQ(sent(ch), 2);
  ASSERT_EQ(write(gate, "g", 1), 1);
  uint64_t t = send_msg(ch, 3, large_size(3), 0, 0);
  ASSERT_EQ_U(t, 3);
  ASSERT_OK(gpuipc_channel_send_done(ch, t, 30000));

  /* One at a time: which stage each takes is then always the same. */
  for (uint64_t i = 4; i <= LARGE_MSGS; i++) {
    t = send_msg(ch, i, large_size(i), 0, 0);
    ASSERT_OK(gpuipc_channel_send_done(ch, t, 30000));
  }
  ASSERT_EQ(sent(ch), LARGE_MSGS);
  ASSERT_OK(gpuipc_channel_close(ch));
}

static void huge(gpuipc_domain_t *dom)
{
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, "huge", NULL, &ch));
  uint64_t t = send_msg(ch, 1, HUGE_VIEW, 0, 0);
  ASSERT_OK(gpuipc_channel_send_done(ch, t, 30000));

  /* More than this machine holds: refused when its stage is allocated. */
  int64_t shape[1];
  gpuipc_tensor_t big;
  large_tensor(&big, shape, src, (size_t)1 << 46);
  ASSERT_RC(gpuipc_channel_send(ch, &big, NULL, 0, NULL), -ENOMEM);
  ASSERT_ERR_MENTIONS("70368744177664 bytes");
  ASSERT_EQ(sent(ch), 1);

  t = send_msg(ch, 2, HUGE_INTO, 0, 0);
  ASSERT_EQ_U(t, 2);
  ASSERT_OK(gpuipc_channel_send_done(ch, t, 30000));
  ASSERT_OK(gpuipc_channel_close(ch));
}

int main(void)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("chan-large", NULL, &dom));
  int gate[2];
  ASSERT_OK(pipe(gate));
  char fd[16];
  snprintf(fd, sizeof(fd), "%d", gate[0]);
  const char *args[] = {"chan-large", fd, NULL};
  const int keep[] = {gate[0], -1};
  pid_t pid = test_spawn("chan_large_peer", args, keep);
  close(gate[0]);
  src = malloc(HUGE_VIEW);
  ASSERT_TRUE(src != NULL);

  large(dom, gate[1]);
  huge(dom);

  ASSERT_EQ(test_wait(pid, 60000), 0);
  close(gate[1]);
  free(src);
  ASSERT_OK(gpuipc_domain_leave(dom));
  printf("%d messages of up to 18 MiB with stages freed and replaced, "
         "256 MiB as a view, 48 MiB into memory of the receiver's: every "
         "byte checked\n", (int)LARGE_MSGS);
  return 0;
}
