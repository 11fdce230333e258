/*
 * Block batches on real GPUs (skipped without one): 1024 blocks of 256,
 * 224 and 192 KiB scattered in two LEGACY "layers" of GPU 0, sent as one
 * message each (3 batches on a channel of depth 2) to a receiver on GPU 1
 * (GPU 0 when there is one, or GPU 1 cannot reach GPU 0), which lands
 * them in scattered slots of its own buffer with one batched copy and
 * checks every byte (tests/helpers/chan_blocks_peer.c). The same ends run
 * on the fake driver in tests/channel_blocks.c, which also counts the
 * batched copies.
 */
#include "test.h"

#include <stdio.h>

int main(void)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  test_require_gpus(1);
  int rdev = 0;
  if (gpuipc_device_count() >= 2) {
    gpuipc_p2p_t p2p = {.size = sizeof(p2p)};
    if (gpuipc_topo_p2p(1, 0, &p2p) == 0 && p2p.access)
      rdev = 1;
  }
  printf("GPU 0 -> GPU %d: 3 batches of 1024 blocks of up to 256 KiB\n",
         rdev);
  const char *rd = rdev == 1 ? "1" : "0";
  const char *sargs[] = {"send", "chan-blocks-gpu", "blocks", "gpu", "3",
                         "-", "262144", "0", NULL};
  const char *rargs[] = {"recv", "chan-blocks-gpu", "blocks", "gpu", "3",
                         "any", "262144", rd, NULL};
  pid_t r = test_spawn("chan_blocks_peer", rargs, NULL);
  pid_t s = test_spawn("chan_blocks_peer", sargs, NULL);
  int rs = test_wait(s, 240000), rr = test_wait(r, 240000);
  if (rs != 0 || rr != 0)
    TFAIL("sender exited %d, receiver %d", rs, rr);
  return 0;
}
