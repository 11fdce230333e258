/*
 * A sender that dies before its GPU work wrote a message's ready word
 * does not leave the receiver's stream waiting for ever: the guard thread
 * sees the peer hang up, marks the channel gone and writes the word the
 * stream waits for (src/channel/guard.c). Two chan_guard_peer processes
 * on the fake CUDA driver, whose queued copy and word stay pending for 10
 * minutes; the receiver kills the sender and then synchronises its
 * stream, which would never return without the guard.
 */
#include "helpers/fake_lag.h"

#include <signal.h>
#include <unistd.h>

int main(void)
{
  gpuipc_domain_t *dom = fake_lag_begin("chan-guard");
  setenv("FAKE_CUDA_COPY_LAG_US", "600000000", 1);
  setenv("GPUIPC_CHAN_READY_WORDS", "1", 1);
  const char *rargs[] = {"recv", "chan-guard", "g", NULL};
  const char *sargs[] = {"send", "chan-guard", "g", NULL};
  pid_t r = test_spawn("chan_guard_peer", rargs, NULL);
  pid_t s = test_spawn("chan_guard_peer", sargs, NULL);
  int rr = test_wait(r, 60000);
  int rs = test_wait(s, 5000);
  ASSERT_EQ(rr, 0);
  /* Killed by the receiver (test_wait: 128 + the signal). */
  ASSERT_EQ(rs, 128 + SIGKILL);
  ASSERT_OK(gpuipc_domain_leave(dom));
  printf("the receiver's stream went on after its sender died\n");
  return 0;
}
