/*
 * Lock files: held by another process, we get -EWOULDBLOCK when polling
 * once and -ETIMEDOUT after a timeout; when the holder is killed the kernel
 * releases the lock and we take it; when the holder removes the file (a
 * stale domain's, pruned) a waiter locks the file that is there now, not
 * the one removed.
 */
#include "test.h"

#include "os/os.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define TIMEOUT_MS 20000

static char lock_path[PATH_MAX + 32];

/* Start the helper in @mode and return its pid; *@ready_rd gets the read
 * end of the pipe on which it says "L" once it holds the lock. */
static pid_t start_helper(const char *mode, int *ready_rd)
{
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  char fdarg[16];
  snprintf(fdarg, sizeof(fdarg), "%d", p[1]);
  const char *args[] = {mode, lock_path, fdarg, NULL};
  int keep[] = {p[1], -1};
  pid_t pid = test_spawn("os_flock_hold", args, keep);
  close(p[1]);
  *ready_rd = p[0];
  return pid;
}

static void expect_ready(int rd)
{
  struct pollfd pfd = {.fd = rd, .events = POLLIN};
  ASSERT_EQ(poll(&pfd, 1, TIMEOUT_MS), 1);
  char c = 0;
  ASSERT_EQ(read(rd, &c, 1), 1);
  ASSERT_EQ(c, 'L');
}

/* Another process holds the lock until it is killed. */
static void held_elsewhere(void)
{
  unlink(lock_path);
  int ready;
  pid_t pid = start_helper("hold", &ready);
  expect_ready(ready);
  close(ready);

  struct stat st;
  ASSERT_EQ(stat(lock_path, &st), 0);
  ASSERT_EQ(st.st_mode & 0777, 0600);

  int before = test_count_fds(0);
  int fd = -1;
  ASSERT_RC(gpuipc__flock_open(lock_path, 0, &fd), -EWOULDBLOCK);
  ASSERT_ERR_MENTIONS(lock_path);
  ASSERT_RC(gpuipc__flock_open(lock_path, 50, &fd), -ETIMEDOUT);
  ASSERT_ERR_MENTIONS("after 50 ms");
  ASSERT_EQ(fd, -1);
  ASSERT_EQ(test_count_fds(0), before);

  /* kill -9: no clean-up code runs; the kernel drops the lock. */
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_OK(gpuipc__flock_open(lock_path, TIMEOUT_MS, &fd));
  ASSERT_EQ(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  ASSERT_EQ(test_wait(pid, TIMEOUT_MS), 128 + SIGKILL);

  /* flock belongs to the open file: a second open here is refused too. */
  int again = -1;
  ASSERT_RC(gpuipc__flock_open(lock_path, 0, &again), -EWOULDBLOCK);
  gpuipc__fd_close(&fd);
  ASSERT_OK(gpuipc__flock_open(lock_path, 0, &again));
  gpuipc__fd_close(&again);
}

/* A waiter without a timeout gets the lock as soon as we let go. */
static void waiter_gets_it(void)
{
  int fd;
  ASSERT_OK(gpuipc__flock_open(lock_path, 0, &fd));
  int ready;
  pid_t pid = start_helper("wait", &ready);
  /* It cannot have the lock while we hold it. */
  struct pollfd pfd = {.fd = ready, .events = POLLIN};
  ASSERT_EQ(poll(&pfd, 1, 100), 0);
  gpuipc__fd_close(&fd);
  expect_ready(ready);
  close(ready);
  ASSERT_EQ(test_wait(pid, TIMEOUT_MS), 0);
  /* It exited, and the lock with it. */
  ASSERT_OK(gpuipc__flock_open(lock_path, 0, &fd));
  gpuipc__fd_close(&fd);
}

static void errors(void)
{
  int fd = -1;
  ASSERT_RC(gpuipc__flock_open(NULL, 0, &fd), -EINVAL);
  ASSERT_RC(gpuipc__flock_open(lock_path, 0, NULL), -EINVAL);
  ASSERT_RC(gpuipc__flock_open("/nonexistent-dir/x.lock", 0, &fd), -ENOENT);
  ASSERT_ERR_MENTIONS("/nonexistent-dir/x.lock");

  /* A symbolic link in place of the lock file is not followed. */
  char link[sizeof(lock_path) + 8];
  snprintf(link, sizeof(link), "%s.link", lock_path);
  unlink(link);
  ASSERT_EQ(symlink(lock_path, link), 0);
  ASSERT_RC(gpuipc__flock_open(link, 0, &fd), -ELOOP);
  unlink(link);
  ASSERT_EQ(fd, -1);
}

struct waiter {
  int rc, fd;
};

static void *wait_lock(void *arg)
{
  struct waiter *w = arg;
  w->rc = gpuipc__flock_open(lock_path, TIMEOUT_MS, &w->fd);
  return NULL;
}

/* The holder removes the file while another waits on it. */
static void removed_while_waiting(void)
{
  int held;
  unlink(lock_path);
  ASSERT_OK(gpuipc__flock_open(lock_path, 0, &held));
  int before = test_count_fds(0);
  struct waiter w = {1, -1};
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, NULL, wait_lock, &w), 0);
  /* Once the waiter has the old file open (it then waits on its lock). */
  for (int i = 0; i < 2000 && test_count_fds(0) == before; i++)
    usleep(1000);
  ASSERT_EQ(test_count_fds(0), before + 1);
  ASSERT_EQ(unlink(lock_path), 0);
  close(held);
  ASSERT_EQ(pthread_join(t, NULL), 0);
  ASSERT_OK(w.rc);
  struct stat a, b;
  ASSERT_EQ(fstat(w.fd, &a), 0);
  ASSERT_EQ(stat(lock_path, &b), 0); /* there, and the one locked */
  ASSERT_EQ(a.st_ino, b.st_ino);
  /* So nobody else gets it. */
  int again;
  ASSERT_RC(gpuipc__flock_open(lock_path, 0, &again), -EWOULDBLOCK);
  close(w.fd);
}

int main(void)
{
  char dir[PATH_MAX];
  ASSERT_OK(gpuipc__runtime_dir(dir, sizeof(dir)));
  snprintf(lock_path, sizeof(lock_path), "%s/flock-test.lock", dir);
  held_elsewhere();
  waiter_gets_it();
  errors();
  removed_while_waiting();
  printf("flock: ok\n");
  return 0;
}
