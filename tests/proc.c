/*
 * Who a process is (boot id, pid, pid namespace, nonce), across threads,
 * fork and exec; whether a process lives; monotonic deadlines.
 */
#include "test.h"

#include "os/os.h"

#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define TIMEOUT_MS 20000

static void boot_id_from_file(uint8_t out[16])
{
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
  if (f == NULL)
    SKIP("cannot read /proc/sys/kernel/random/boot_id: %s", strerror(errno));
  char s[64] = {0};
  ASSERT_TRUE(fgets(s, sizeof(s), f) != NULL);
  fclose(f);
  int b = 0;
  for (const char *p = s; *p && *p != '\n' && b < 32; p++) {
    if (*p == '-')
      continue;
    unsigned v;
    char hex[2] = {*p, 0};
    ASSERT_EQ(sscanf(hex, "%x", &v), 1);
    out[b / 2] = (uint8_t)(b % 2 ? out[b / 2] | v : v << 4);
    b++;
  }
  ASSERT_EQ(b, 32);
}

static uint64_t pidns_from_proc(void)
{
  struct stat st;
  ASSERT_EQ(stat("/proc/self/ns/pid", &st), 0);
  return st.st_ino;
}

static void identity(void)
{
  const struct gpuipc__proc_id *a = gpuipc__proc_self();
  const struct gpuipc__proc_id *b = gpuipc__proc_self();
  ASSERT_TRUE(a == b);
  ASSERT_EQ(a->pid, getpid());
  ASSERT_NE(a->nonce, 0);
  ASSERT_EQ_U(a->pidns, pidns_from_proc());
  uint8_t boot[16];
  boot_id_from_file(boot);
  ASSERT_EQ(memcmp(a->boot_id, boot, 16), 0);
}

/* A forked child is a new process: new pid and nonce, same boot and
 * namespace; the parent's identity does not change. */
static void after_fork(void)
{
  struct gpuipc__proc_id parent = *gpuipc__proc_self();
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    struct gpuipc__proc_id c = *gpuipc__proc_self();
    _exit(write(p[1], &c, sizeof(c)) == sizeof(c) ? 0 : 1);
  }
  close(p[1]);
  struct gpuipc__proc_id child;
  ASSERT_EQ(read(p[0], &child, sizeof(child)), sizeof(child));
  close(p[0]);
  ASSERT_EQ(test_wait(pid, TIMEOUT_MS), 0);
  ASSERT_EQ(child.pid, pid);
  ASSERT_NE(child.nonce, parent.nonce);
  ASSERT_NE(child.nonce, 0);
  ASSERT_EQ(memcmp(child.boot_id, parent.boot_id, 16), 0);
  ASSERT_EQ_U(child.pidns, parent.pidns);
  const struct gpuipc__proc_id *now = gpuipc__proc_self();
  ASSERT_EQ(now->pid, getpid());
  ASSERT_EQ_U(now->nonce, parent.nonce);
}

#define THREADS 8
static pthread_barrier_t barrier;

static void *ask(void *arg)
{
  pthread_barrier_wait(&barrier);
  *(uint64_t *)arg = gpuipc__proc_self()->nonce;
  return NULL;
}

/* Threads that ask at once, first in a process, all get one identity. */
static void threads_agree(void)
{
  fflush(NULL);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    pthread_t t[THREADS];
    uint64_t nonce[THREADS];
    pthread_barrier_init(&barrier, NULL, THREADS);
    for (int i = 0; i < THREADS; i++)
      if (pthread_create(&t[i], NULL, ask, &nonce[i]) != 0)
        _exit(2);
    for (int i = 0; i < THREADS; i++)
      pthread_join(t[i], NULL);
    for (int i = 0; i < THREADS; i++)
      if (nonce[i] != gpuipc__proc_self()->nonce || nonce[i] == 0)
        _exit(1);
    _exit(0);
  }
  ASSERT_EQ(test_wait(pid, TIMEOUT_MS), 0);
}

/* Another program on this machine: same boot and namespace, its own
 * pid and nonce. */
static void other_program(void)
{
  const struct gpuipc__proc_id *me = gpuipc__proc_self();
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  char fdarg[16];
  snprintf(fdarg, sizeof(fdarg), "%d", p[1]);
  const char *args[] = {"id", fdarg, NULL};
  int keep[] = {p[1], -1};
  pid_t pid = test_spawn("os_proc_id", args, keep);
  close(p[1]);
  char line[128] = {0};
  size_t got = 0;
  ssize_t n;
  while ((n = read(p[0], line + got, sizeof(line) - 1 - got)) > 0)
    got += (size_t)n;
  close(p[0]);
  ASSERT_EQ(test_wait(pid, TIMEOUT_MS), 0);

  char boot[33], want[33];
  unsigned long long pidns, nonce;
  unsigned opid;
  ASSERT_EQ(sscanf(line, "%32s %llu %llu %u", boot, &pidns, &nonce, &opid), 4);
  for (int i = 0; i < 16; i++)
    snprintf(want + 2 * i, 3, "%02x", me->boot_id[i]);
  ASSERT_STREQ(boot, want);
  ASSERT_EQ_U(pidns, me->pidns);
  ASSERT_EQ(opid, pid);
  ASSERT_NE(nonce, 0);
  ASSERT_NE(nonce, me->nonce);
}

static void liveness(void)
{
  ASSERT_TRUE(gpuipc__pid_alive(getpid()));
  ASSERT_TRUE(gpuipc__pid_alive(1));
  ASSERT_TRUE(!gpuipc__pid_alive(0));
  ASSERT_TRUE(!gpuipc__pid_alive(-1));

  const char *args[] = {"pause", NULL};
  pid_t pid = test_spawn("os_proc_id", args, NULL);
  ASSERT_TRUE(gpuipc__pid_alive(pid));
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  /* Dead but not yet reaped (a zombie): not alive. */
  siginfo_t si;
  ASSERT_EQ(waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT), 0);
  ASSERT_TRUE(!gpuipc__pid_alive(pid));
  ASSERT_EQ(test_wait(pid, TIMEOUT_MS), 128 + SIGKILL);
  ASSERT_TRUE(!gpuipc__pid_alive(pid));
}

/* The state /proc/PID/stat gives (its leader's), '?' unread. */
static char leader_state(pid_t pid)
{
  char path[64], buf[256];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "re");
  if (f == NULL)
    return '?';
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *p = strrchr(buf, ')');
  return p != NULL && p[1] == ' ' ? p[2] : '?';
}

/* Until the parent closes its end; then the process ends (_exit: a
 * sanitizer's own threads would outlive a return). */
static void *park(void *arg)
{
  char c;
  while (read(*(int *)arg, &c, 1) < 0 && errno == EINTR)
    ;
  _exit(0);
}

/* A process whose main thread called pthread_exit while another thread
 * runs lives: /proc shows its leader a zombie. Dead once that thread
 * ends, before it is reaped. */
static void leader_exits(void)
{
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(p[1]);
    pthread_t t;
    if (pthread_create(&t, NULL, park, &p[0]) != 0)
      _exit(2);
    pthread_exit(NULL);
  }
  close(p[0]);
  uint64_t deadline = gpuipc__deadline(TIMEOUT_MS);
  while (leader_state(pid) != 'Z') {
    if (gpuipc__ms_left(deadline) == 0)
      TFAIL("pid %d's leader never showed as a zombie", (int)pid);
    usleep(1000);
  }
  ASSERT_TRUE(gpuipc__pid_alive(pid));
  close(p[1]); /* its thread ends the process */
  siginfo_t si;
  ASSERT_EQ(waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT), 0);
  ASSERT_TRUE(!gpuipc__pid_alive(pid));
  ASSERT_EQ(test_wait(pid, TIMEOUT_MS), 0);
}

static void time_helpers(void)
{
  uint64_t a = gpuipc__now_ns(), b = gpuipc__now_ns();
  ASSERT_LE(a, b);
  ASSERT_TRUE(gpuipc__deadline(-1) == UINT64_MAX);
  ASSERT_EQ(gpuipc__ms_left(UINT64_MAX), -1);
  ASSERT_EQ(gpuipc__ms_left(gpuipc__deadline(0)), 0);
  ASSERT_EQ(gpuipc__ms_left(0), 0);
  int left = gpuipc__ms_left(gpuipc__deadline(5000));
  ASSERT_GT(left, 0);
  ASSERT_LE(left, 5000);
  uint64_t d = gpuipc__now_ns() + 3600ull * 1000000000ull;
  ASSERT_GT(gpuipc__ms_left(d), 0);
  ASSERT_LE(gpuipc__ms_left(d), 3600 * 1000);
  /* Far deadlines saturate. */
  ASSERT_EQ(gpuipc__ms_left(gpuipc__now_ns() + (uint64_t)INT_MAX * 2000000ull),
            INT_MAX);
  ASSERT_TRUE(gpuipc__deadline(INT_MAX) > gpuipc__now_ns());
}

int main(void)
{
  identity();
  after_fork();
  threads_agree();
  other_program();
  liveness();
  leader_exits();
  time_helpers();
  printf("proc: ok\n");
  return 0;
}
