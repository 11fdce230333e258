#include "test.h"

#include "cuda/cuda.h"
#include "os/os.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <limits.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void test_require_gpus(int n)
{
  int rc = gpuipc_driver_status(NULL);
  if (rc != 0)
    SKIP("needs %d GPU(s): %s (%s)", n, gpuipc_err_name(rc),
         gpuipc_last_error());
  int have = gpuipc_device_count();
  if (have < n)
    SKIP("needs %d GPU(s), this machine has %d", n, have);
}

const char *test_helper_path(const char *name)
{
  static __thread char path[PATH_MAX];
  snprintf(path, sizeof(path), "%s/%s", GPUIPC_TEST_BINDIR, name);
  return path;
}

pid_t test_spawn(const char *name, const char *const *args,
                 const int *keep_fds)
{
  const char *argv[64];
  int argc = 0;
  argv[argc++] = name;
  for (; args != NULL && args[argc - 1] != NULL && argc < 63; argc++)
    argv[argc] = args[argc - 1];
  argv[argc] = NULL;
  const char *path = test_helper_path(name);
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0)
    TFAIL("fork: %s", strerror(errno));
  if (pid == 0) {
    for (const int *f = keep_fds; f != NULL && *f >= 0; f++) {
      int fl = fcntl(*f, F_GETFD);
      if (fl >= 0)
        fcntl(*f, F_SETFD, fl & ~FD_CLOEXEC);
    }
    execv(path, (char *const *)argv);
    fprintf(stderr, "exec %s: %s\n", path, strerror(errno));
    _exit(127);
  }
  return pid;
}

int test_wait(pid_t pid, int timeout_ms)
{
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) {
      if (WIFEXITED(st))
        return WEXITSTATUS(st);
      return 128 + WTERMSIG(st);
    }
    if (r < 0)
      TFAIL("waitpid(%d): %s", (int)pid, strerror(errno));
    clock_gettime(CLOCK_MONOTONIC, &now);
    long ms = (now.tv_sec - start.tv_sec) * 1000 +
              (now.tv_nsec - start.tv_nsec) / 1000000;
    if (ms > timeout_ms) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      TFAIL("process %d did not exit within %d ms", (int)pid, timeout_ms);
    }
    usleep(2000);
  }
}

void test_warm_driver(void)
{
  struct gpuipc__ctx_saved saved;
  if (gpuipc__ctx_enter(0, &saved) == 0)
    gpuipc__ctx_leave(&saved);
}

bool test_driver_loaded(void)
{
  const char *lib = getenv("GPUIPC_CUDA_LIB");
  void *h = dlopen(lib != NULL ? lib : "libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (h == NULL)
    return false;
  dlclose(h);
  return true;
}

int test_count_fds(pid_t pid)
{
  long n = gpuipc__fds_open(pid);
  if (n < 0)
    TFAIL("cannot read /proc/%d/fd: %s", (int)(pid ? pid : getpid()),
          strerror(errno));
  return (int)n;
}

void test_fill(void *p, size_t n, uint64_t seed)
{
  uint8_t *b = p;
  for (size_t i = 0; i < n; i++)
    b[i] = test_pattern(seed, i);
}

size_t test_check(const void *p, size_t n, uint64_t seed)
{
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i] != test_pattern(seed, i))
      return i;
  return (size_t)-1;
}

int test_popen(const char *cmd, char *out, size_t cap)
{
  FILE *f = popen(cmd, "r");
  ASSERT_TRUE(f != NULL);
  size_t n = fread(out, 1, cap - 1, f);
  out[n] = '\0';
  int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

void test_stamp(const char *fmt, ...)
{
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  printf("[pid %d at %.3f s] %s\n", (int)getpid(),
         (double)gpuipc__now_ns() / 1e9, msg);
  fflush(stdout);
}
