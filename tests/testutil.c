#include "test.h"

#include "cuda/cuda.h"
#include "os/os.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
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

struct chan_opener {
  gpuipc_domain_t *dom;
  const char *name;
  const gpuipc_channel_opts_t *opts;
  gpuipc_channel_t *ch;
};

static void *chan_open_thread(void *arg)
{
  struct chan_opener *o = arg;
  ASSERT_OK(gpuipc_channel_open(o->dom, o->name, o->opts, &o->ch));
  return NULL;
}

void test_chan_pair(gpuipc_domain_t *dom, const char *name,
                    const gpuipc_channel_opts_t *here_opts,
                    const gpuipc_channel_opts_t *there_opts,
                    gpuipc_channel_t **here, gpuipc_channel_t **there)
{
  struct chan_opener o = {.dom = dom, .name = name, .opts = there_opts};
  pthread_t th;
  ASSERT_EQ(pthread_create(&th, NULL, chan_open_thread, &o), 0);
  ASSERT_OK(gpuipc_channel_open(dom, name, here_opts, here));
  ASSERT_EQ(pthread_join(th, NULL), 0);
  *there = o.ch;
}

pid_t test_spawn_piped(const char *name, const char *const *more, int *in,
                       int *out)
{
  int cmd[2], rep[2];
  if (pipe2(cmd, O_CLOEXEC) != 0 || pipe2(rep, O_CLOEXEC) != 0)
    TFAIL("pipe2: %s", strerror(errno));
  char a[16], b[16];
  snprintf(a, sizeof(a), "%d", cmd[0]);
  snprintf(b, sizeof(b), "%d", rep[1]);
  const char *args[13] = {a, b};
  for (int i = 0; more != NULL && more[i] != NULL; i++) {
    if (i == 10)
      TFAIL("test_spawn_piped(%s): more than 10 arguments", name);
    args[2 + i] = more[i];
  }
  int keep[] = {cmd[0], rep[1], -1};
  pid_t pid = test_spawn(name, args, keep);
  close(cmd[0]);
  close(rep[1]);
  *in = cmd[1];
  *out = rep[0];
  return pid;
}

const char *test_lines_next(struct test_lines *l, int fd, pid_t pid,
                            int timeout_ms)
{
  for (;;) {
    char *nl = memchr(l->buf, '\n', l->len);
    if (nl != NULL) {
      size_t n = (size_t)(nl - l->buf);
      if (n >= sizeof(l->line))
        n = sizeof(l->line) - 1;
      memcpy(l->line, l->buf, n);
      l->line[n] = '\0';
      l->len -= (size_t)(nl - l->buf) + 1;
      memmove(l->buf, nl + 1, l->len);
      return l->line;
    }
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, timeout_ms);
    if (r == 0)
      TFAIL("helper %d said nothing for %d ms", (int)pid, timeout_ms);
    if (r < 0 && errno == EINTR)
      continue;
    if (l->len >= sizeof(l->buf) - 1)
      TFAIL("helper %d: a line longer than %zu bytes", (int)pid,
            sizeof(l->buf) - 1);
    ssize_t n = read(fd, l->buf + l->len, sizeof(l->buf) - l->len - 1);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return NULL;
    l->len += (size_t)n;
  }
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

unsigned test_fd_table_settle(void)
{
  bool busy = true;
  unsigned n = 0;
  for (int i = 0; i < 20000 && busy; i++) {
    n = gpuipc__fd_table_passes(&busy);
    if (busy)
      usleep(1000);
  }
  if (busy)
    TFAIL("the descriptor table's thread still at work after 20 s");
  return n;
}

int test_count_fds(pid_t pid)
{
  for (;;) {
    /* Of this process: again if a growth ran across the count. */
    unsigned passes = pid == 0 ? test_fd_table_settle() : 0;
    long n = gpuipc__fds_open(pid);
    if (n < 0)
      TFAIL("cannot read /proc/%d/fd: %s", (int)(pid ? pid : getpid()),
            strerror(errno));
    bool busy;
    if (pid != 0 ||
        (gpuipc__fd_table_passes(&busy) == passes && !busy))
      return (int)n;
  }
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
