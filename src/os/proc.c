/* Who this process is, whether another one lives, and futexes. */
#include "os/os.h"

#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ----- identity ----- */

static struct gpuipc__proc_id self;
static atomic_bool self_valid;   /* false again in a forked child */
static bool boot_known;          /* boot id survives fork: same machine */
static pthread_mutex_t self_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void atfork_prepare(void)
{
  pthread_mutex_lock(&self_lock);
}

static void atfork_parent(void)
{
  pthread_mutex_unlock(&self_lock);
}

static void atfork_child(void)
{
  /* The lock the prepare handler took, given back (a lock held cannot be
   * initialised again); a new pid, pidns and nonce. */
  pthread_mutex_unlock(&self_lock);
  atomic_store_explicit(&self_valid, false, memory_order_relaxed);
}

static void atfork_register(void)
{
  pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

static int hexval(char c)
{
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" -> 16 bytes; 0 or -1. */
static int parse_uuid(const char *s, uint8_t out[16])
{
  static const int dash[] = {8, 13, 18, 23};
  int b = 0, d = 0;
  for (int i = 0; i < 36; i++) {
    if (d < 4 && i == dash[d]) {
      if (s[i] != '-')
        return -1;
      d++;
      continue;
    }
    int hi = hexval(s[i]), lo = hexval(s[i + 1]);
    if (hi < 0 || lo < 0)
      return -1;
    out[b++] = (uint8_t)(hi << 4 | lo);
    i++;
  }
  return b == 16 ? 0 : -1;
}

static int read_boot_id(uint8_t out[16])
{
  char buf[64];
  int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  ssize_t n;
  do
    n = read(fd, buf, sizeof(buf) - 1);
  while (n < 0 && errno == EINTR);
  int e = errno;
  close(fd);
  if (n < 0)
    return -e;
  buf[n] = '\0';
  if (n < 36 || parse_uuid(buf, out) < 0)
    return -EINVAL;
  return 0;
}

static void self_compute(void)
{
  if (!boot_known) {
    int rc = read_boot_id(self.boot_id);
    if (rc < 0) {
      gpuipc__random(self.boot_id, sizeof(self.boot_id));
      GPUIPC_LOG_W("cannot read /proc/sys/kernel/random/boot_id (%s): using a "
                   "random boot id, so other processes will not recognise "
                   "this one as on the same boot",
                   strerrordesc_np(-rc));
    }
    boot_known = true;
  }
  self.pid = (uint32_t)getpid();
  struct stat st;
  if (stat("/proc/self/ns/pid", &st) == 0) {
    self.pidns = (uint64_t)st.st_ino;
  } else {
    GPUIPC_LOG_W("stat /proc/self/ns/pid: %s: pid namespace unknown (0)",
                 strerrordesc_np(errno));
    self.pidns = 0;
  }
  do
    gpuipc__random(&self.nonce, sizeof(self.nonce));
  while (self.nonce == 0);
}

const struct gpuipc__proc_id *gpuipc__proc_self(void)
{
  if (GPUIPC__LIKELY(atomic_load_explicit(&self_valid, memory_order_acquire)))
    return &self;
  pthread_once(&atfork_once, atfork_register);
  pthread_mutex_lock(&self_lock);
  if (!atomic_load_explicit(&self_valid, memory_order_relaxed)) {
    self_compute();
    atomic_store_explicit(&self_valid, true, memory_order_release);
  }
  pthread_mutex_unlock(&self_lock);
  return &self;
}

/* Whether process @pid has more than one thread listed: a zombie leader
 * (a main thread that called pthread_exit) whose other threads run. */
static bool threads_left(pid_t pid)
{
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
  return gpuipc__dir_entries(path, 2) > 1;
}

bool gpuipc__pid_alive(pid_t pid)
{
  if (pid <= 0)
    return false;
  if (kill(pid, 0) < 0 && errno != EPERM)
    return false; /* ESRCH */
  /* A zombie has died; only its exit status waits to be collected. */
  char path[64], buf[256];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return errno != ENOENT; /* no /proc: trust kill() */
  ssize_t n;
  do
    n = read(fd, buf, sizeof(buf) - 1);
  while (n < 0 && errno == EINTR);
  close(fd);
  if (n <= 0)
    return true;
  buf[n] = '\0';
  /* "pid (comm) S ...": comm may hold ')' and spaces; the last ')' ends it. */
  const char *p = strrchr(buf, ')');
  if (p == NULL || p[1] != ' ')
    return true;
  if (p[2] == 'X')
    return false;
  /* The state is the leader's: a process lives while any thread does. */
  return p[2] != 'Z' || threads_left(pid);
}

int gpuipc__pidfd_open(pid_t pid)
{
  if (pid <= 0)
    return -EINVAL;
#ifdef SYS_pidfd_open
  long fd = syscall(SYS_pidfd_open, pid, 0);
  return fd >= 0 ? (int)fd : -errno;
#else
  return -ENOSYS;
#endif
}

int gpuipc__pid_start_time(pid_t pid, uint64_t *out)
{
  if (pid <= 0)
    return -EINVAL;
  char path[64], buf[1024];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return errno == ENOENT ? -ESRCH : -errno;
  ssize_t n;
  do
    n = read(fd, buf, sizeof(buf) - 1);
  while (n < 0 && errno == EINTR);
  int err = n < 0 ? -errno : 0;
  close(fd);
  if (err != 0)
    return err == -ESRCH ? -ESRCH : err;
  buf[n] = '\0';
  /* "pid (comm) S f4 ... f22": the last ')' ends comm; S is field 3. */
  const char *p = strrchr(buf, ')');
  if (p == NULL || p[1] != ' ')
    return -EPROTO;
  p += 2;
  if (*p == 'Z' || *p == 'X')
    return -ESRCH;
  for (int field = 3; field < 22; field++) {
    p = strchr(p, ' ');
    if (p == NULL)
      return -EPROTO;
    p++;
  }
  char *end;
  errno = 0;
  unsigned long long t = strtoull(p, &end, 10);
  if (end == p || errno != 0 || (*end != ' ' && *end != '\n' && *end))
    return -EPROTO;
  *out = (uint64_t)t;
  return 0;
}

/* ----- futex ----- */

int gpuipc__futex_wait(uint32_t *addr, uint32_t val, int timeout_ms)
{
  if (addr == NULL || ((uintptr_t)addr & 3) != 0)
    return gpuipc__err(-EINVAL, "gpuipc__futex_wait: address %p is not a "
                                "4-byte aligned word", (void *)addr);
  /* Absolute CLOCK_MONOTONIC deadline (FUTEX_WAIT_BITSET): EINTR-safe. */
  struct timespec ts, *tsp = NULL;
  if (timeout_ms >= 0) {
    uint64_t d = gpuipc__deadline(timeout_ms);
    ts.tv_sec = (time_t)(d / 1000000000ull);
    ts.tv_nsec = (long)(d % 1000000000ull);
    tsp = &ts;
  }
  for (;;) {
    /* Not FUTEX_PRIVATE: the word lives in memory shared by processes. */
    long r = syscall(SYS_futex, addr, FUTEX_WAIT_BITSET, val, tsp, NULL,
                     FUTEX_BITSET_MATCH_ANY);
    if (r == 0)
      return 0;
    int e = errno;
    if (e == EINTR)
      continue;
    if (e == EAGAIN || e == ETIMEDOUT)
      return -e; /* expected outcomes: no sentence on the hot path */
    return gpuipc__err_errno(e, "futex wait on %p", (void *)addr);
  }
}

int gpuipc__futex_wake(uint32_t *addr, int n)
{
  if (addr == NULL || ((uintptr_t)addr & 3) != 0)
    return gpuipc__err(-EINVAL, "gpuipc__futex_wake: address %p is not a "
                                "4-byte aligned word", (void *)addr);
  if (n <= 0)
    return gpuipc__err(-EINVAL, "gpuipc__futex_wake: n %d <= 0", n);
  long r = syscall(SYS_futex, addr, FUTEX_WAKE, n, NULL, NULL, 0);
  if (r < 0)
    return gpuipc__err_errno(errno, "futex wake on %p", (void *)addr);
  return (int)r;
}
