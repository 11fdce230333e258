/*
 * Futexes on memory shared between processes: a wake from this process
 * reaches a sleeper in another (a process-private futex would not), and
 * the other way round; timeouts, value mismatches and signals.
 */
#include "test.h"

#include "os/os.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define TIMEOUT_MS 20000

static void nap(long us)
{
  struct timespec ts = {0, us * 1000};
  nanosleep(&ts, NULL);
}

/* Whether @pid's only thread sleeps in the futex system call. */
static bool sleeps_in_futex(pid_t pid)
{
  char path[64], buf[128] = {0};
  snprintf(path, sizeof(path), "/proc/%d/syscall", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n > 0)
      return atol(buf) == SYS_futex;
  }
  /* No /proc/PID/syscall here: settle for "sleeping". */
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  fd = open(path, O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  ASSERT_GT(n, 0);
  const char *p = strrchr(buf, ')');
  return p != NULL && p[1] == ' ' && p[2] == 'S';
}

static void across_processes(void)
{
  int fd;
  ASSERT_OK(gpuipc__memfd_create("futex-test", 4096, &fd));
  uint32_t *w = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_TRUE(w != MAP_FAILED);

  char fdarg[16];
  snprintf(fdarg, sizeof(fdarg), "%d", fd);
  const char *args[] = {fdarg, NULL};
  int keep[] = {fd, -1};
  pid_t pid = test_spawn("os_futex_peer", args, keep);

  /* Wait until it sleeps on word 0, so that our wake is what wakes it. */
  uint64_t deadline = gpuipc__deadline(TIMEOUT_MS);
  while (__atomic_load_n(&w[2], __ATOMIC_SEQ_CST) == 0 ||
         !sleeps_in_futex(pid)) {
    if (gpuipc__ms_left(deadline) == 0)
      TFAIL("os_futex_peer never went to sleep on the futex");
    nap(1000);
  }
  __atomic_store_n(&w[0], 1, __ATOMIC_SEQ_CST);
  ASSERT_EQ(gpuipc__futex_wake(&w[0], 1), 1); /* one sleeper, woken */

  /* It wakes us in turn. */
  while (__atomic_load_n(&w[1], __ATOMIC_SEQ_CST) != 42) {
    int rc = gpuipc__futex_wait(&w[1], 0, TIMEOUT_MS);
    ASSERT_TRUE(rc == 0 || rc == -EAGAIN);
  }
  ASSERT_EQ(test_wait(pid, TIMEOUT_MS), 0);
  munmap(w, 4096);
  close(fd);
}

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
  (void)sig;
  alarms++;
}

static void in_process(void)
{
  static uint32_t word __attribute__((aligned(8)));
  word = 5;
  ASSERT_RC(gpuipc__futex_wait(&word, 4, TIMEOUT_MS), -EAGAIN);
  ASSERT_RC(gpuipc__futex_wait(&word, 5, 0), -ETIMEDOUT);
  ASSERT_RC(gpuipc__futex_wait(&word, 5, 30), -ETIMEDOUT);
  ASSERT_EQ(gpuipc__futex_wake(&word, 1), 0); /* nobody sleeps */
  ASSERT_EQ(gpuipc__futex_wake(&word, INT32_MAX), 0);

  /* Signals (no SA_RESTART) do not cut the wait short. */
  struct sigaction sa = {.sa_handler = on_alarm}, old;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGALRM, &sa, &old), 0);
  struct itimerval it = {.it_interval = {0, 1000}, .it_value = {0, 1000}};
  ASSERT_EQ(setitimer(ITIMER_REAL, &it, NULL), 0);
  int rc = gpuipc__futex_wait(&word, 5, 100);
  struct itimerval off = {0};
  ASSERT_EQ(setitimer(ITIMER_REAL, &off, NULL), 0);
  ASSERT_RC(rc, -ETIMEDOUT);
  ASSERT_GT(alarms, 0);
  ASSERT_EQ(sigaction(SIGALRM, &old, NULL), 0);

  ASSERT_RC(gpuipc__futex_wait(NULL, 0, 0), -EINVAL);
  ASSERT_RC(gpuipc__futex_wait((uint32_t *)((char *)&word + 1), 0, 0),
            -EINVAL);
  ASSERT_ERR_MENTIONS("aligned");
  ASSERT_RC(gpuipc__futex_wake(NULL, 1), -EINVAL);
  ASSERT_RC(gpuipc__futex_wake(&word, 0), -EINVAL);
}

int main(void)
{
  in_process();
  across_processes();
  printf("futex: ok\n");
  return 0;
}
