/*
 * The naps of a shared copy's waits (src/share/copy.c): a member waiting
 * for a chunk, for its own copies to land (settle), for the members that
 * still copy from it (linger) or for their copies from its memory (drain)
 * looks again every 20 us while copies run and for the first 100 ms of a
 * wait, and only then naps longer, up to 1 ms. A wait that doubled its
 * nap from the start looked again 1 ms late after a few milliseconds of
 * copies, and each such wait added that to a sync of about ten.
 */
#include "test.h"
#include "os/os.h"
#include "share/share.h"

#define EAGER GPUIPC__SHARE_EAGER_NS

int main(void)
{
  /* Young waits and busy ones stay at the short nap. */
  ASSERT_EQ(gpuipc__share_nap_next(20, 0, false), 20);
  ASSERT_EQ(gpuipc__share_nap_next(20, EAGER - 1, false), 20);
  ASSERT_EQ(gpuipc__share_nap_next(20, 10 * EAGER, true), 20);
  /* A long nap comes back down once copies run again. */
  ASSERT_EQ(gpuipc__share_nap_next(1000, 10 * EAGER, true), 20);
  ASSERT_EQ(gpuipc__share_nap_next(1000, 0, false), 20);

  /* Past the eager time: doubling, up to the longest, and no further. */
  unsigned want[] = {40, 80, 160, 320, 640, 1000, 1000};
  unsigned us = GPUIPC__SHARE_NAP_US;
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
    us = gpuipc__share_nap_next(us, EAGER, false);
    ASSERT_EQ(us, want[i]);
  }

  /* A wait's own clock: short naps until the eager time has passed (the
   * test clock moves on at once), then longer ones. */
  struct share_nap w = GPUIPC__SHARE_NAP_INIT;
  for (int i = 0; i < 50; i++) {
    gpuipc__share_nap(&w, false);
    ASSERT_EQ(w.us, GPUIPC__SHARE_NAP_US);
  }
  ASSERT_TRUE(w.since != 0);
  gpuipc__test_hook_clock_skip_ms((unsigned)(EAGER / 1000000));
  gpuipc__share_nap(&w, false);
  ASSERT_EQ(w.us, 40);
  gpuipc__share_nap(&w, false);
  ASSERT_EQ(w.us, 80);
  gpuipc__share_nap(&w, true);
  ASSERT_EQ(w.us, GPUIPC__SHARE_NAP_US);
  /* Progress starts the wait over. */
  gpuipc__share_nap(&w, false);
  ASSERT_EQ(w.us, 40);
  gpuipc__share_nap_reset(&w);
  ASSERT_EQ(w.us, GPUIPC__SHARE_NAP_US);
  ASSERT_EQ_U(w.since, 0);
  gpuipc__share_nap(&w, false);
  ASSERT_EQ(w.us, GPUIPC__SHARE_NAP_US);
  return 0;
}
