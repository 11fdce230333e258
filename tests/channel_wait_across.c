/*
 * The sender's stream waits for a release word written on another GPU at
 * once, without a host poll first; for one written on its own GPU it
 * polls first (gpuipc_channel_send_wait). On the fake CUDA driver, with
 * chan_away_peer pairs: the sender on device 0, the receiver on device 1
 * and then on device 0, for a tensor and for a block batch. Each release
 * word lands a few hundred ms after the sender took the release in, well
 * inside a poll of 1 s
 * (GPUIPC_CHAN_EVENT_POLL_US): a sender that polls sees it land and
 * queues no stream wait; one that does not queues one
 * (cuStreamWaitValue64, counted by the fake). Every byte is checked on
 * the receiving side both ways.
 */
#include "helpers/fake_lag.h"

#define ROUNDS "3"

static void pair(const char *mode, const char *rdev, const char *waits)
{
  char name[32];
  snprintf(name, sizeof(name), "away-%s-%s", mode, rdev);
  const char *rargs[] = {"recv", "chan-away", name, ROUNDS, mode, rdev, NULL};
  const char *sargs[] = {"send", "chan-away", name, ROUNDS, mode, waits, NULL};
  pid_t r = test_spawn("chan_away_peer", rargs, NULL);
  pid_t s = test_spawn("chan_away_peer", sargs, NULL);
  int rs = test_wait(s, 60000), rr = test_wait(r, 60000);
  if (rs != 0 || rr != 0)
    TFAIL("%s, receiver on device %s: sender exited %d, receiver %d", mode,
          rdev, rs, rr);
}

int main(void)
{
  gpuipc_domain_t *dom = fake_lag_begin("chan-away");
  setenv("FAKE_CUDA_DEV1_OPS", "1", 1); /* stream waits on device 1 */
  setenv("GPUIPC_CHAN_READY_WORDS", "1", 1);
  setenv("GPUIPC_CHAN_EVENT_POLL_US", "1000000", 1);
  /* The sender's ready words land by themselves 20 ms after queued. */
  setenv("FAKE_CUDA_COPY_LAG_US", "20000", 1);
  pair("tensor", "1", "some");
  pair("tensor", "0", "none");
  /* A block batch's release word comes with its copy, which lands by
   * itself: 300 ms after it was queued. */
  setenv("FAKE_CUDA_COPY_LAG_US", "300000", 1);
  pair("blocks", "1", "some");
  pair("blocks", "0", "none");
  ASSERT_OK(gpuipc_domain_leave(dom));
  printf(ROUNDS " tensors and " ROUNDS " block batches each way: from "
         "another GPU the sender's stream waited on the release word at "
         "once; on its own GPU it polled\n");
  return 0;
}
