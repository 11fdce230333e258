/*
 * A child made by fork() must not keep the domain's descriptors: holding
 * the broker's lock and listener it would wedge the domain after its
 * parent dies (the lock never frees, connections queue unanswered), and
 * holding the broker's or a member's connections it would hide the
 * parent's death from the other side. Linux has no close-on-fork flag, so
 * a pthread_atfork child handler closes, right after fork, every
 * descriptor that is a socket bound or connected to a domain socket of the
 * runtime directory, or a domain's lock file. It uses system calls only
 * (the child of a threaded process may call nothing else safely).
 *
 * A domain does not survive fork(): the child joins anew if it needs one.
 * Whoever finds a domain's files (gpuipc__dom_paths, at the end) installs
 * these handlers, so no domain descriptor exists before them.
 */
#include "domain/domain.h"

#include "mem/mem.h"

#include <dirent.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static bool installed;
static _Atomic uint64_t fork_gen;
static char run_dir[PATH_MAX];
static size_t run_dir_len;

static bool ends_with(const char *s, size_t len, const char *suffix)
{
  size_t n = strlen(suffix);
  return len >= n && memcmp(s + len - n, suffix, n) == 0;
}

/* Whether @path (of @len bytes) is RUNDIR/NAME@suffix. */
static bool in_run_dir(const char *path, size_t len, const char *suffix)
{
  return len > run_dir_len + 1 && memcmp(path, run_dir, run_dir_len) == 0 &&
         path[run_dir_len] == '/' &&
         memchr(path + run_dir_len + 1, '/', len - run_dir_len - 1) == NULL &&
         ends_with(path, len, suffix);
}

/*
 * Whether @path (of @len bytes) is "/proc/self/fd/N/NAME.sock" naming a
 * socket of the runtime directory: how a socket whose full path is longer
 * than sun_path is bound (src/os/sock.c), so only then (N is a descriptor
 * of whichever process bound it).
 */
static bool in_run_dir_by_fd(const char *path, size_t len)
{
  static const char pre[] = "/proc/self/fd/";
  size_t i = sizeof(pre) - 1;
  if (len <= i || memcmp(path, pre, i) != 0)
    return false;
  size_t digits = i;
  while (i < len && path[i] >= '0' && path[i] <= '9')
    i++;
  if (i == digits || i >= len || path[i] != '/')
    return false;
  const char *name = path + i + 1;
  size_t n = len - i - 1;
  return n > 0 && memchr(name, '/', n) == NULL && ends_with(name, n, ".sock") &&
         run_dir_len + 1 + n >= sizeof(((struct sockaddr_un *)0)->sun_path);
}

static bool domain_socket(int fd)
{
  struct sockaddr_un sa;
  for (int peer = 0; peer < 2; peer++) {
    socklen_t len = sizeof(sa);
    memset(&sa, 0, sizeof(sa));
    int rc = peer ? getpeername(fd, (struct sockaddr *)&sa, &len)
                  : getsockname(fd, (struct sockaddr *)&sa, &len);
    if (rc != 0 || sa.sun_family != AF_UNIX ||
        len <= offsetof(struct sockaddr_un, sun_path))
      continue;
    size_t n = strnlen(sa.sun_path, len - offsetof(struct sockaddr_un,
                                                   sun_path));
    if (in_run_dir(sa.sun_path, n, ".sock") ||
        in_run_dir_by_fd(sa.sun_path, n))
      return true;
  }
  return false;
}

static bool domain_lock(int fd)
{
  char link[64], path[PATH_MAX];
  /* "/proc/self/fd/N" without snprintf. */
  char digits[16];
  int nd = 0;
  for (unsigned v = (unsigned)fd; nd == 0 || v != 0; v /= 10)
    digits[nd++] = (char)('0' + v % 10);
  memcpy(link, "/proc/self/fd/", 14);
  for (int i = 0; i < nd; i++)
    link[14 + i] = digits[nd - 1 - i];
  link[14 + nd] = '\0';
  ssize_t n = readlink(link, path, sizeof(path));
  return n > 0 && (size_t)n < sizeof(path) &&
         in_run_dir(path, (size_t)n, ".lock");
}

struct linux_dirent64 {
  uint64_t d_ino;
  int64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[];
};

static void child_after_fork(void)
{
  if (run_dir_len == 0)
    return;
  int dfd = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/fd",
                         O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    return;
  /* Collect first, close after: closing while listing would disturb it. */
  int victims[1024];
  int nv = 0;
  char buf[4096];
  for (;;) {
    long n = syscall(SYS_getdents64, dfd, buf, sizeof(buf));
    if (n <= 0)
      break;
    for (long off = 0; off < n;) {
      struct linux_dirent64 *e = (struct linux_dirent64 *)(buf + off);
      off += e->d_reclen;
      int fd = 0;
      const char *p = e->d_name;
      if (*p < '0' || *p > '9')
        continue;
      for (; *p >= '0' && *p <= '9'; p++)
        fd = fd * 10 + (*p - '0');
      if (fd == dfd)
        continue;
      if ((domain_socket(fd) || domain_lock(fd)) && nv < 1024)
        victims[nv++] = fd;
    }
  }
  close(dfd);
  for (int i = 0; i < nv; i++)
    close(victims[i]);
}

uint64_t gpuipc__fork_gen(void)
{
  return atomic_load(&fork_gen);
}

/* Registered objects, in the order of registration (hooks_mu). */
static pthread_mutex_t hooks_mu = PTHREAD_MUTEX_INITIALIZER;
static struct gpuipc__fork_hook *hooks, **hooks_tail = &hooks;

void gpuipc__fork_register(struct gpuipc__fork_hook *h)
{
  pthread_mutex_lock(&hooks_mu);
  h->next = NULL;
  *hooks_tail = h;
  hooks_tail = &h->next;
  pthread_mutex_unlock(&hooks_mu);
}

void gpuipc__fork_unregister(struct gpuipc__fork_hook *h)
{
  pthread_mutex_lock(&hooks_mu);
  for (struct gpuipc__fork_hook **pp = &hooks; *pp != NULL;
       pp = &(*pp)->next)
    if (*pp == h) {
      *pp = h->next;
      if (hooks_tail == &h->next)
        hooks_tail = pp;
      break;
    }
  pthread_mutex_unlock(&hooks_mu);
}

static void hooks_lock(void)
{
  pthread_mutex_lock(&hooks_mu);
  for (struct gpuipc__fork_hook *h = hooks; h != NULL; h = h->next)
    h->prepare(h);
}

static void hooks_unlock(bool child)
{
  for (struct gpuipc__fork_hook *h = hooks; h != NULL; h = h->next)
    (child ? h->child : h->parent)(h);
  pthread_mutex_unlock(&hooks_mu);
}

/*
 * The locks a child would otherwise inherit held by threads it does not
 * have: taken before fork() in their documented order (the buffer
 * registry's last: its handlers were registered first), released after.
 */
static void prepare_fork(void)
{
  gpuipc__seg_fork_lock();
  hooks_lock();
}

static void parent_after_fork(void)
{
  hooks_unlock(false);
  gpuipc__seg_fork_unlock();
}

static void child_handler(void)
{
  atomic_fetch_add(&fork_gen, 1); /* the parent's domains are not ours */
  hooks_unlock(true);
  gpuipc__seg_fork_child();
  child_after_fork();
}

void gpuipc__dom_fork_guard(const char *dir)
{
  size_t n = strlen(dir);
  pthread_mutex_lock(&mu);
  if (!installed && n > 0 && n < sizeof(run_dir)) {
    memcpy(run_dir, dir, n + 1);
    run_dir_len = n;
    gpuipc__buf_fork_install(); /* its prepare handler runs after ours */
    installed = pthread_atfork(prepare_fork, parent_after_fork,
                               child_handler) == 0;
  }
  pthread_mutex_unlock(&mu);
}

int gpuipc__dom_paths(const char *name, struct gpuipc__dom_paths *out)
{
  int rc = gpuipc__name_check(name, "domain name");
  if (rc != 0)
    return rc;
  rc = gpuipc__rundir_paths(name, out);
  if (rc != 0)
    return rc;
  gpuipc__dom_fork_guard(out->dir);
  return 0;
}
