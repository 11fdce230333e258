/*
 * The other process of tests/flock.c.
 *   os_flock_hold hold PATH READY_FD : take the lock on PATH (waiting up to
 *       20 s), write "L" to READY_FD, then hold it until killed.
 *   os_flock_hold wait PATH READY_FD : wait for the lock with no timeout,
 *       write "L" to READY_FD once it is ours, and exit (releasing it).
 * Exit status 0 on success; anything else names the failed step on stderr.
 */
#include "test.h"

#include "os/os.h"

#include <unistd.h>

int main(int argc, char **argv)
{
  if (argc != 4 || (strcmp(argv[1], "hold") != 0 &&
                    strcmp(argv[1], "wait") != 0)) {
    fprintf(stderr, "usage: os_flock_hold hold|wait PATH READY_FD\n");
    return 2;
  }
  bool hold = strcmp(argv[1], "hold") == 0;
  int ready = atoi(argv[3]);
  int fd;
  ASSERT_OK(gpuipc__flock_open(argv[2], hold ? 20000 : -1, &fd));
  ASSERT_EQ(write(ready, "L", 1), 1);
  close(ready);
  if (hold)
    for (;;)
      pause();
  gpuipc__fd_close(&fd);
  return 0;
}
