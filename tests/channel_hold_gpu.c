/*
 * tests/channel_hold.c on device 0 of the fake CUDA driver: the sender
 * writes each message on a stream and sends it from a LEGACY buffer
 * (zero-copy) or from device memory gpuipc did not allocate (staged on
 * the stream into device 0's staging slots: a HOST buffer on the fake,
 * which has no VMM, as on a GPU without it); the receiver receives on a
 * stream and releases with work of its own still queued there, so that
 * each release goes with the release word (or event) of the message's
 * record slot. The receiver holds the view of message 1 and gives every
 * other one back; the sender sends ten depths and more past it.
 */
#include "helpers/chan_hold.h"

#include <stdlib.h>

int main(void)
{
#ifndef FAKE_CUDA_FULL
  SKIP("built without the CUDA headers: no fake CUDA driver");
#else
  setvbuf(stdout, NULL, _IONBF, 0);
  setenv("GPUIPC_CUDA_LIB", FAKE_CUDA_FULL, 1);
  /* Queued copies stay pending until a synchronisation or the other
   * process's wait: a release goes after work still queued. */
  setenv("FAKE_CUDA_COPY_LAG", "1000000000", 1);
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("chan-hold-gpu", NULL, &dom));
  chan_hold_run("chan-hold-gpu", "cuda-zero", "1");
  /* The fake has no VMM: device 0's staging area is then a HOST buffer
   * (GPUIPC_KIND_AUTO), filled by copies on the sender's stream. */
  setenv("FAKE_CUDA_HIDE", "cuMemCreate", 1);
  chan_hold_run("chan-hold-gpu", "cuda-staged", "1");
  ASSERT_OK(gpuipc_domain_leave(dom));
  printf("a held GPU view held up no other message (zero-copy, staged)\n");
  return 0;
#endif
}
