/*
 * A receiver that holds one view costs the sender that message alone: with
 * depth 8 and 4 staging slots, a chan_hold_peer receiver keeps the view of
 * one message and gives every other one back at once, and the sender
 * sends ten depths of messages and more without waiting for the held one,
 * zero-copy from a HOST buffer and staged from memory gpuipc did not
 * allocate (through the staging slots, and through large stages: the held
 * one keeps one of the 4, the sends wait for the other 3). The held view's bytes stay
 * what was sent until it is released; gpuipc_channel_info counts the one
 * message in flight and names it; once released, it is free.
 * (tests/channel_hold_gpu.c: the same on a GPU of the fake CUDA driver.)
 */
#include "helpers/chan_hold.h"

int main(void)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("chan-hold", NULL, &dom));
  chan_hold_run("chan-hold", "zero", "1");
  chan_hold_run("chan-hold", "staged", "1");
  chan_hold_run("chan-hold", "large", "3");
  ASSERT_OK(gpuipc_domain_leave(dom));
  printf("a held view held up no other message (zero-copy, staged, large "
         "stages)\n");
  return 0;
}
