/*
 * The process's descriptor table, grown before gpuipc's descriptors need
 * it.
 *
 * Linux grows a process's table (doubling) when a descriptor is made past
 * its end, and in a process with more than one thread the growth waits
 * for an RCU grace period, in the call that made the descriptor: 8-23 ms
 * measured at 256 and 512 slots. gpuipc makes a descriptor for each
 * buffer a process exports or imports (memfds, VMM and pool fds, those a
 * channel receives), so the import that crossed 256 or 512 was one to
 * stall for that long, in the middle of a transfer.
 *
 * So each new descriptor of gpuipc's is shown to gpuipc__fd_table_ahead:
 * once one reaches a quarter of the table's known size, a thread of the
 * library grows the table to eight times that descriptor (at least 1024
 * slots, at most the soft RLIMIT_NOFILE), and the grace period passes on
 * that thread. That far ahead, the growth is mostly done before new
 * descriptors reach the table's old end (imports make one every 20-60 µs
 * or more, and a grace period is 10-20 ms); a call that needs it
 * sooner waits for it (Linux has it wait), never longer than without.
 * The check on the way of a call is one load and a compare. A table
 * grown to the soft limit grows again once the program raises the limit
 * (servers raise it from the usual 1024 at start, and gpuipc may have
 * grown the table before): while capped, every 64th descriptor past a
 * quarter of the table looks at the limit. A process about to hold
 * buffers (a domain's join, CUDA's load) starts the first growth before
 * it has any (gpuipc__fd_table_early).
 *
 * The growth takes the lowest free slot at the target and closes it at
 * once: a thread of the program that dup2()s onto that very slot in
 * between would see its descriptor closed. Programs place descriptors
 * that way only at numbers they own below their own use; gpuipc's target
 * lies above every descriptor the process had. A count of /proc/self/fd
 * in that instant sees one descriptor more, and a child forked in it
 * keeps that copy (of stdin, close-on-exec) until it execs or exits.
 */
#include "os/os.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <unistd.h>

#define TABLE_MIN 64   /* every process's table holds this many (Linux) */
#define AHEAD_MIN 1024 /* the least a growth asks for */
#define LIMIT_EVERY 64 /* capped: the limit looked at again each this many */

/* A table size known to be allocated; INT_MAX: no growth is left to do
 * (no thread to be had, or a growth refused). */
static atomic_int room = TABLE_MIN;
/* The soft RLIMIT_NOFILE the last growth stopped at, 0: none. While it
 * holds, descriptors past room / 4 ask for no growth; every LIMIT_EVERY-th
 * of them looks whether the program raised its limit since. */
static atomic_int capped_at;
static atomic_uint capped_shown;
/* The highest descriptor shown. */
static atomic_int highest = -1;
static atomic_uint passes; /* growths tried, for tests */

static void grow_pass(void);
/* The growing thread: a job of the library's (os.h). */
static struct gpuipc__job grower = GPUIPC__JOB_INIT(grow_pass);

/* The soft RLIMIT_NOFILE, INT_MAX for none (or one past INT_MAX). */
static int soft_limit(void)
{
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY ||
      rl.rlim_cur > INT_MAX)
    return INT_MAX;
  return (int)rl.rlim_cur;
}

/* The slots a table must have for descriptor @fd: eight times it, a power
 * of two, at least AHEAD_MIN; capped at the soft limit (*@capped). */
static int target(int fd, bool *capped)
{
  long want = AHEAD_MIN;
  while (want < 8L * ((long)fd + 1))
    want *= 2;
  int lim = soft_limit();
  *capped = want >= lim;
  return *capped ? lim : want > INT_MAX ? INT_MAX : (int)want;
}

/* Raise room to @n (never lower it). */
static void room_raise(int n)
{
  int r = atomic_load(&room);
  while (r < n && !atomic_compare_exchange_weak(&room, &r, n))
    ;
}

/* Grow the table to @want slots: a descriptor copied to want - 1 (or the
 * first free slot after it) and closed at once. The copy is of stdin,
 * stdout or stderr where one is open, so that no descriptor more is seen
 * open while the growth waits out its grace period (a program counting
 * its descriptors would see one for that long); else of a path
 * descriptor of "/". */
static int grow(int want)
{
  if (want < 2)
    return -EINVAL;
  int src = -1, d = -1;
  for (int f = 0; f <= 2 && d < 0; f++)
    if (fcntl(f, F_GETFD) >= 0)
      d = fcntl(f, F_DUPFD_CLOEXEC, want - 1);
  if (d < 0 && errno != EMFILE && errno != EINVAL) {
    src = open("/", O_PATH | O_CLOEXEC);
    if (src < 0)
      return -errno;
    d = fcntl(src, F_DUPFD_CLOEXEC, want - 1);
    int err = errno;
    close(src);
    errno = err;
  }
  if (d < 0)
    return -errno;
  close(d);
  return 0;
}

/* Grow for the highest descriptor shown, where the last growth does not
 * cover it. */
static void grow_pass(void)
{
  int fd = atomic_load(&highest);
  if (fd < atomic_load(&room) / 4)
    return;
  bool capped;
  int want = target(fd, &capped);
  atomic_fetch_add(&passes, 1);
  /* Raised first: what asks while this pass waits out the grace period
   * is a descriptor this growth does not cover (at least twice @fd), so
   * each growth is eightfold at least. */
  room_raise(want);
  if (capped)
    atomic_store(&capped_at, want);
  int rc = want > fd + 1 ? grow(want) : 0;
  if (rc == -EMFILE || rc == -EINVAL)
    atomic_store(&capped_at, want); /* the limit fell meanwhile */
  else if (rc != 0)
    room_raise(INT_MAX); /* growth refused: stop asking */
}

/* While capped: whether the soft limit moved (looked at for every
 * LIMIT_EVERY-th descriptor shown); then capped no more. */
static bool limit_moved(int cap)
{
  if (atomic_fetch_add(&capped_shown, 1) % LIMIT_EVERY != 0 ||
      soft_limit() == cap)
    return false;
  atomic_compare_exchange_strong(&capped_at, &cap, 0);
  return true;
}

/* A child of fork() has a table of its own, sized by the descriptors it
 * inherited, and no thread of this file's. */
static void forked_child(void)
{
  atomic_store(&room, TABLE_MIN);
  atomic_store(&highest, -1);
  atomic_store(&capped_at, 0);
  atomic_store(&capped_shown, 0);
  gpuipc__job_forget(&grower);
}

static void install(void)
{
  (void)pthread_atfork(NULL, NULL, forked_child);
}

void gpuipc__fd_table_ahead(int fd)
{
  if (GPUIPC__LIKELY(fd < atomic_load_explicit(&room, memory_order_relaxed) /
                              4) ||
      fd < 0)
    return;
  int cap = atomic_load(&capped_at);
  if (cap != 0 && !limit_moved(cap))
    return;
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  (void)pthread_once(&once, install);
  int h = atomic_load(&highest);
  while (h < fd && !atomic_compare_exchange_weak(&highest, &h, fd))
    ;
  /* No thread to be had: the table grows as Linux grows it, and no later
   * descriptor pays a failed start again. */
  if (gpuipc__job_ask(&grower) != 0)
    room_raise(INT_MAX);
}

void gpuipc__fd_table_early(void)
{
  if (atomic_load(&room) == TABLE_MIN)
    gpuipc__fd_table_ahead(TABLE_MIN / 4);
}

unsigned gpuipc__fd_table_passes(bool *busy)
{
  *busy = gpuipc__job_busy(&grower);
  return atomic_load(&passes);
}
