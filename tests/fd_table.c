/*
 * The descriptor table grown ahead (src/os/fdtable.c), in a process with
 * threads, as every process using gpuipc is. Each case runs in a child
 * that execs this test, after the descriptors it would inherit are
 * closed: its table starts small, as a new program's does.
 *
 *   - ahead: HOST buffers made one after another (a memfd each) leave the
 *     table, once the library's thread is done, at least twice as large
 *     as the highest descriptor (Linux alone, doubling on need, leaves it
 *     at the next power of two); every descriptor made is still open, the
 *     growths' own closed, and all close with the buffers.
 *     Growths tried (the library's count): one, not one a descriptor.
 *     Then a child of fork(), whose table Linux sizes by what it
 *     inherits, makes more: its table grows ahead too.
 *   - join: a domain's join, before any buffer, leaves the table at 1024
 *     slots once the thread is done (one growth), the growth's own
 *     descriptor closed.
 *   - limit: in a process whose soft RLIMIT_NOFILE is 200, 150 buffers
 *     are made; the table grows to the limit at most: once it is there,
 *     later descriptors start no growth; past the limit a clear error
 *     (-EMFILE). Then the program raises its soft limit (to 4096, or the
 *     hard one), and 300 buffers more leave the table at least twice the
 *     highest descriptor again, with one growth more (Linux alone: 512).
 *     Nothing leaks.
 */
#include "os/os.h"
#include "test.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define NBUFS 150

static void *idle(void *arg)
{
  (void)arg;
  for (;;)
    pause();
  return NULL;
}

/* The table's size: /proc/self/status's FDSize. */
static long fd_size(void)
{
  FILE *f = fopen("/proc/self/status", "re");
  ASSERT_TRUE(f != NULL);
  char line[256];
  long n = -1;
  while (fgets(line, sizeof(line), f) != NULL)
    if (sscanf(line, "FDSize: %ld", &n) == 1)
      break;
  fclose(f);
  ASSERT_GT(n, 0);
  return n;
}

/* The highest descriptor open now. */
static int fd_highest(void)
{
  int hi = -1;
  for (int fd = 0; fd < (int)fd_size(); fd++)
    if (fcntl(fd, F_GETFD) >= 0)
      hi = fd;
  return hi;
}

/* A child of fork() gets a table sized by the descriptors it inherits
 * (256 slots for ours), not the parent's 1024: its own new ones, below
 * the parent's next growth (256), must grow it all the same. */
static void forked(void)
{
  fflush(stdout);
  pid_t c = fork();
  ASSERT_TRUE(c >= 0);
  if (c == 0) {
    enum { MORE = 80 };
    long size0 = fd_size();
    gpuipc_buf_t *b[MORE];
    for (int i = 0; i < MORE; i++)
      ASSERT_OK(gpuipc_buf_alloc(4096, GPUIPC_KIND_HOST, -1, 0, &b[i]));
    test_fd_table_settle();
    int hi = fd_highest();
    long size = fd_size();
    printf("forked: table %ld, then %d buffers more, highest descriptor %d, "
           "table %ld\n", size0, MORE, hi, size);
    ASSERT_LT(hi, 256);
    ASSERT_GE(size, 2L * (hi + 1));
    for (int i = 0; i < MORE; i++)
      gpuipc_buf_release(b[i]);
    fflush(stdout);
    _exit(0);
  }
  int st = test_wait(c, 60000);
  if (st != 0)
    TFAIL("forked: the child exited %d", st);
}

static void ahead(void)
{
  int open0 = test_count_fds(0);
  ASSERT_LT(fd_highest(), 16);
  gpuipc_buf_t *b[NBUFS];
  for (int i = 0; i < NBUFS; i++)
    ASSERT_OK(gpuipc_buf_alloc(4096, GPUIPC_KIND_HOST, -1, 0, &b[i]));
  unsigned passes = test_fd_table_settle();
  int hi = fd_highest();
  long size = fd_size();
  printf("ahead: %d buffers, highest descriptor %d, table %ld, %u growths\n",
         NBUFS, hi, size, passes);
  ASSERT_GE(hi, NBUFS);
  ASSERT_GE(size, 2L * (hi + 1));
  ASSERT_GE(passes, 1);
  /* 1024 slots for the 16th descriptor; the next growth would be for
   * the 256th: one, not one a descriptor. */
  ASSERT_EQ(passes, 1);
  ASSERT_EQ(test_count_fds(0), open0 + NBUFS);
  forked();
  for (int i = 0; i < NBUFS; i++)
    gpuipc_buf_release(b[i]);
  ASSERT_EQ(test_count_fds(0), open0);
}

static void limit(void)
{
  struct rlimit rl;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
  ASSERT_EQ_U(rl.rlim_cur, 200);
  int open0 = test_count_fds(0);
  gpuipc_buf_t *b[NBUFS];
  for (int i = 0; i < NBUFS; i++)
    ASSERT_OK(gpuipc_buf_alloc(4096, GPUIPC_KIND_HOST, -1, 0, &b[i]));
  unsigned passes = test_fd_table_settle();
  long size = fd_size();
  printf("limit: %d buffers, table %ld, %u growths\n", NBUFS, size, passes);
  ASSERT_EQ(passes, 1); /* capped at the first: none asked after it */
  ASSERT_LE(size, 256); /* 200 slots, rounded up by Linux */
  ASSERT_EQ(test_count_fds(0), open0 + NBUFS);
  /* Up to the limit, and past it a clear error. */
  gpuipc_buf_t *more[64];
  int n = 0, rc = 0;
  while (n < 64 && (rc = gpuipc_buf_alloc(4096, GPUIPC_KIND_HOST, -1, 0,
                                          &more[n])) == 0)
    n++;
  ASSERT_EQ(rc, -EMFILE);
  ASSERT_EQ(test_fd_table_settle(), passes); /* no growth asked once capped */
  for (int i = 0; i < n; i++)
    gpuipc_buf_release(more[i]);

  /* The limit raised: the table grows ahead again. */
  enum { RAISED = 300 };
  rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > 4096
                    ? 4096
                    : rl.rlim_max;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
  static gpuipc_buf_t *r[RAISED];
  for (int i = 0; i < RAISED; i++)
    ASSERT_OK(gpuipc_buf_alloc(4096, GPUIPC_KIND_HOST, -1, 0, &r[i]));
  unsigned passes2 = test_fd_table_settle();
  int hi = fd_highest();
  size = fd_size();
  printf("limit raised to %llu: %d buffers more, highest descriptor %d, "
         "table %ld, %u growths\n", (unsigned long long)rl.rlim_cur, RAISED,
         hi, size, passes2);
  ASSERT_GE(hi, NBUFS + RAISED);
  ASSERT_GE(size, 2L * (hi + 1));
  ASSERT_EQ(passes2, passes + 1);
  for (int i = 0; i < RAISED; i++)
    gpuipc_buf_release(r[i]);
  for (int i = 0; i < NBUFS; i++)
    gpuipc_buf_release(b[i]);
  ASSERT_EQ(test_count_fds(0), open0);
}

/* A domain's join starts the first growth before any buffer: 1024 slots
 * once the thread is done, where the table held a handful. */
static void join(void)
{
  ASSERT_LT(fd_highest(), 16);
  long size0 = fd_size();
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("fd-table", NULL, &dom));
  unsigned passes = test_fd_table_settle();
  long size = fd_size();
  printf("join: table %ld, then %ld, %u growths\n", size0, size, passes);
  ASSERT_LT(size0, 1024);
  ASSERT_GE(size, 1024);
  ASSERT_EQ(passes, 1);
  errno = 0;
  ASSERT_EQ(fcntl(1023, F_GETFD), -1); /* the growth's copy was closed */
  ASSERT_EQ(errno, EBADF);
  ASSERT_LT(fd_highest(), 16);
  ASSERT_OK(gpuipc_domain_leave(dom));
}

/* This test again, as a child whose soft RLIMIT_NOFILE is @soft, running
 * @mode: its table holds the few descriptors open here. */
static void child(const char *argv0, const char *mode, rlim_t soft)
{
  pid_t c = fork();
  ASSERT_TRUE(c >= 0);
  if (c == 0) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
      _exit(3);
    rl.rlim_cur = soft;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
      _exit(3);
    execl("/proc/self/exe", argv0, mode, (char *)NULL);
    _exit(4);
  }
  int st = test_wait(c, 60000);
  if (st != 0)
    TFAIL("%s: the child exited %d", mode, st);
}

int main(int argc, char **argv)
{
  if (argc > 1) {
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, idle, NULL), 0);
    if (strcmp(argv[1], "ahead") == 0)
      ahead();
    else if (strcmp(argv[1], "join") == 0)
      join();
    else
      limit();
    return 0;
  }
  struct rlimit rl;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 1024) {
    printf("SKIP: hard RLIMIT_NOFILE %llu, under 1024\n",
           (unsigned long long)rl.rlim_max);
    return TEST_SKIP;
  }
  /* Descriptors inherited (a shell's, a runner's) would size the
   * children's tables: they go, stdin, stdout and stderr stay. */
  for (int fd = 3; fd < (int)fd_size(); fd++)
    close(fd);
  rlim_t soft = rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < 1024
                    ? 1024
                    : rl.rlim_cur;
  child(argv[0], "ahead", soft);
  child(argv[0], "join", soft);
  child(argv[0], "limit", 200);
  return 0;
}
