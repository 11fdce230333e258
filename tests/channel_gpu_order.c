/*
 * The scenarios of tests/channel_gpu.c on every machine: the receiver's
 * stream waits for the sender's event, and the sender's stream for the
 * receiver's release, checked on the fake CUDA driver with lagging copies
 * standing for the GPU's writes (tests/helpers/chan_order_peer.c says
 * which round checks what). Two chan_order_peer processes share a LEGACY
 * buffer of the fake's device 0; the receiver takes rounds with
 * gpuipc_channel_recv_into and as views, and checks every byte.
 * FAKE_CUDA_COPY_LAG is so large that a queued copy runs only when a
 * stream or event is synchronised, or another process waits for it: a
 * missing wait lets a read run before the write it depends on, or a write
 * before the read of the bytes it overwrites.
 */
#include "helpers/fake_lag.h"

#define ROUNDS "12"

int main(void)
{
  gpuipc_domain_t *dom = fake_lag_begin("chan-gpu-order");
  const char *rargs[] = {"recv", "chan-gpu-order", "order", ROUNDS, NULL};
  const char *sargs[] = {"send", "chan-gpu-order", "order", ROUNDS, NULL};
  pid_t r = test_spawn("chan_order_peer", rargs, NULL);
  pid_t s = test_spawn("chan_order_peer", sargs, NULL);
  int rs = test_wait(s, 60000), rr = test_wait(r, 60000);
  if (rs != 0 || rr != 0)
    TFAIL("sender exited %d, receiver %d", rs, rr);
  ASSERT_OK(gpuipc_domain_leave(dom));
  printf(ROUNDS " rounds of 1 MiB, copies and views: every byte after the "
         "sender's write, before its next one\n");
  return 0;
}
