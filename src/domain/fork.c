/*
 * A child made by fork() must not keep the domain's descriptors: holding
 * the broker's lock and listener it would wedge the domain after its
 * parent dies (the lock never frees, connections queue unanswered), and
 * holding the broker's or a member's connections it would hide the
 * parent's death from the other side. Linux has no close-on-fork flag, so
 * a pthread_atfork child handler closes, right after fork, every
 * descriptor that is a socket bound or connected to a domain socket of the
 * runtime directory, or a domain's lock file. Both are told by identity
 * (device and inode), not by how a path is spelt: the kernel names an open
 * file by its resolved path, and a peer may have bound its socket under
 * another spelling of the same directory. It uses system calls only (the
 * child of a threaded process may call nothing else safely).
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
#include <sys/stat.h>
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

/*
 * The runtime directory as the child finds it, by identity: the path it
 * was given may be spelt differently from how another process bound its
 * socket, and the kernel names a file by its resolved path.
 */
struct run_dir_id {
  bool known;
  dev_t dev;
  ino_t ino;
};

/* Whether @path (of @len bytes) is DIR/NAME@suffix, DIR the runtime
 * directory however it is spelt. */
static bool in_run_dir(const char *path, size_t len, const char *suffix,
                       const struct run_dir_id *id)
{
  const char *slash = memrchr(path, '/', len);
  if (slash == NULL || slash == path || !ends_with(path, len, suffix) ||
      (size_t)(path + len - slash - 1) <= strlen(suffix))
    return false;
  size_t dlen = (size_t)(slash - path);
  if (dlen == run_dir_len && memcmp(path, run_dir, dlen) == 0)
    return true;
  char dir[PATH_MAX];
  struct stat st;
  if (!id->known || dlen >= sizeof(dir))
    return false;
  memcpy(dir, path, dlen);
  dir[dlen] = '\0';
  return stat(dir, &st) == 0 && st.st_dev == id->dev && st.st_ino == id->ino;
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

static bool domain_socket(int fd, const struct run_dir_id *id)
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
    if (in_run_dir(sa.sun_path, n, ".sock", id) ||
        in_run_dir_by_fd(sa.sun_path, n))
      return true;
  }
  return false;
}

/*
 * Whether @fd is the lock file DIR/NAME.lock of the runtime directory: the
 * file it has open (fstat) is the one that path names (stat). By identity,
 * not by name: the kernel gives an open file's resolved path, which the
 * runtime directory's path need not be (a symbolic link above it, "/./").
 */
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
  struct stat open_st, lock_st;
  if (fstat(fd, &open_st) != 0 || !S_ISREG(open_st.st_mode))
    return false;
  ssize_t n = readlink(link, path, sizeof(path));
  if (n <= 0 || (size_t)n >= sizeof(path))
    return false;
  const char *name = memrchr(path, '/', (size_t)n);
  size_t len = name == NULL ? 0 : (size_t)(path + n - name); /* "/NAME.lock" */
  if (len <= 1 + 5 || !ends_with(name, len, ".lock") ||
      run_dir_len + len >= sizeof(path))
    return false;
  memmove(path + run_dir_len, name, len); /* RUNDIR/NAME.lock */
  memcpy(path, run_dir, run_dir_len);
  path[run_dir_len + len] = '\0';
  return stat(path, &lock_st) == 0 && lock_st.st_dev == open_st.st_dev &&
         lock_st.st_ino == open_st.st_ino;
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
  struct run_dir_id id = {false, 0, 0};
  struct stat st;
  if (stat(run_dir, &st) == 0) {
    id.known = true;
    id.dev = st.st_dev;
    id.ino = st.st_ino;
  }
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
      if ((domain_socket(fd, &id) || domain_lock(fd)) && nv < 1024)
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

void gpuipc__fork_register_first(struct gpuipc__fork_hook *h)
{
  pthread_mutex_lock(&hooks_mu);
  h->next = hooks;
  if (hooks == NULL)
    hooks_tail = &h->next;
  hooks = h;
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
 * have: taken before fork() in their documented order (the registered
 * objects' in the list's order, the buffer registry's last: its handlers
 * were registered first), released after.
 */
static void prepare_fork(void)
{
  hooks_lock();
}

static void parent_after_fork(void)
{
  hooks_unlock(false);
}

static void child_handler(void)
{
  atomic_fetch_add(&fork_gen, 1); /* the parent's domains are not ours */
  hooks_unlock(true);
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
