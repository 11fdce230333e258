/*
 * What tests/channel_hold.c and tests/channel_hold_gpu.c do for each mode:
 * start a chan_hold_peer receiver and sender on channel MODE of @dom's
 * domain, with a pipe between them for the gate, and wait for both to
 * exit 0 (chan_hold_peer.c says what each checks).
 */
#ifndef GPUIPC_TEST_CHAN_HOLD_H
#define GPUIPC_TEST_CHAN_HOLD_H

#include "test.h"

#include <stdio.h>
#include <unistd.h>

/* Messages each run sends before the held one is let go: ten depths. */
#define CHAN_HOLD_N "80"

static inline void chan_hold_run(const char *domain, const char *mode,
                                 const char *hold)
{
  int gate[2];
  ASSERT_OK(pipe(gate));
  char rfd[16], wfd[16];
  snprintf(rfd, sizeof(rfd), "%d", gate[0]);
  snprintf(wfd, sizeof(wfd), "%d", gate[1]);
  const char *rargs[] = {"recv", domain, mode, mode, CHAN_HOLD_N, hold, rfd,
                         NULL};
  const char *sargs[] = {"send", domain, mode, mode, CHAN_HOLD_N, hold, wfd,
                         NULL};
  int rkeep[] = {gate[0], -1}, skeep[] = {gate[1], -1};
  pid_t r = test_spawn("chan_hold_peer", rargs, rkeep);
  pid_t s = test_spawn("chan_hold_peer", sargs, skeep);
  close(gate[0]);
  close(gate[1]);
  int rs = test_wait(s, 120000), rr = test_wait(r, 120000);
  if (rs != 0 || rr != 0)
    TFAIL("%s: sender exited %d, receiver %d", mode, rs, rr);
}

#endif
