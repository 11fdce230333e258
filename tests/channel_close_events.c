/*
 * A channel end that closes destroys its CUDA events; CUDA leaves any use
 * of an imported event undefined after that (on an H100 a stream made to
 * wait on one waits for ever). Checked on the fake CUDA driver, which
 * fails such uses and counts them: a sender that closes right after its
 * sends, its copies still pending, and a receiver that closes right after
 * releasing a view it still reads; the other end, coming later, gets every
 * byte (tests/helpers/chan_close_peer.c says how) and never touches a
 * destroyed event. Queued copies complete on the third query of an event
 * recorded after them, so a closing end finds them done by asking.
 */
#include "helpers/fake_lag.h"

#include <sys/stat.h>
#include <unistd.h>

int main(void)
{
  gpuipc_domain_t *dom = fake_lag_begin("chan-close-ev");
  setenv("FAKE_CUDA_COPY_LAG", "3", 1);
  char dir[4096];
  const char *run = getenv("GPUIPC_DIR"); /* ctest gives each test one */
  snprintf(dir, sizeof(dir), "%s/chan-close-flags", run ? run : "/tmp");
  ASSERT_TRUE(mkdir(dir, 0700) == 0 || errno == EEXIST);
  char p[4200];
  const char *names[] = {"sent", "released", "done-send", "done-recv"};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
    unlink(p);
  }
  const char *rargs[] = {"recv", "chan-close-ev", dir, NULL};
  const char *sargs[] = {"send", "chan-close-ev", dir, NULL};
  pid_t r = test_spawn("chan_close_peer", rargs, NULL);
  pid_t s = test_spawn("chan_close_peer", sargs, NULL);
  int rs = test_wait(s, 60000), rr = test_wait(r, 60000);
  if (rs != 0 || rr != 0)
    TFAIL("sender exited %d, receiver %d", rs, rr);
  ASSERT_OK(gpuipc_domain_leave(dom));
  printf("both orders of close: every byte, no destroyed event used\n");
  return 0;
}
