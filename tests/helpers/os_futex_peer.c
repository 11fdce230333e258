/*
 * The other process of tests/futex.c.
 *   os_futex_peer FD : map the memfd FD (three 32-bit words); set word 2 to
 *       say it is about to sleep, sleep on word 0 (no timeout) until it is
 *       non-zero, then set word 1 to 42 and wake whoever waits on it.
 * Exit status 0 on success; anything else names the failed step on stderr.
 */
#include "test.h"

#include "os/os.h"

#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv)
{
  if (argc != 2) {
    fprintf(stderr, "usage: os_futex_peer FD\n");
    return 2;
  }
  int fd = atoi(argv[1]);
  ASSERT_OK(gpuipc__memfd_check(fd, 4096, NULL));
  uint32_t *w = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_TRUE(w != MAP_FAILED);
  __atomic_store_n(&w[2], 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n(&w[0], __ATOMIC_SEQ_CST) == 0) {
    int rc = gpuipc__futex_wait(&w[0], 0, -1);
    ASSERT_TRUE(rc == 0 || rc == -EAGAIN);
  }
  __atomic_store_n(&w[1], 42, __ATOMIC_SEQ_CST);
  ASSERT_GE(gpuipc__futex_wake(&w[1], 1), 0);
  munmap(w, 4096);
  return 0;
}
