/*
 * Stale files of the runtime directory: what processes that died left.
 *
 *  - A channel socket, chan-HEX.sock, is stale when nobody listens on it
 *    (not listed as listening in /proc/net/unix, and connect says
 *    ECONNREFUSED). A socket is bound before it listens, so
 *    listeners hold .prune.lock shared from bind to listen
 *    (gpuipc__rundir_listen) and the pruner holds it exclusively while it
 *    tests and removes: a socket just bound never reads as stale.
 *  - A domain's NAME.sock and NAME.lock are stale when nobody holds the
 *    lock (no broker, none being elected). The pruner removes them while
 *    it holds the lock; whoever opened the lock file before it went away
 *    sees so after taking the lock (gpuipc__flock_open) and opens it anew.
 *
 * A chan-HEX.sock beside a chan-HEX.lock is a domain's, not a channel's.
 */
#include "os/os.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define GUARD ".prune.lock"
#define CHAN_PREFIX "chan-"
#define SOCK_SUFFIX ".sock"
#define LOCK_SUFFIX ".lock"

/* Open DIR/.prune.lock and flock it with @op (LOCK_SH or LOCK_EX). */
static int guard_lock(const char *dir, int op, int *out_fd)
{
  char path[PATH_MAX];
  int n = snprintf(path, sizeof(path), "%s/" GUARD, dir);
  if (n < 0 || (size_t)n >= sizeof(path))
    return gpuipc__err(-ENAMETOOLONG, "%s/" GUARD ": path too long", dir);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return gpuipc__err_errno(errno, "open %s", path);
  while (flock(fd, op) != 0) {
    if (errno == EINTR)
      continue;
    int rc = gpuipc__err_errno(errno, "flock %s", path);
    close(fd);
    return rc;
  }
  *out_fd = fd;
  return 0;
}

int gpuipc__rundir_listen(const char *path, int backlog, int *out_fd)
{
  char dir[PATH_MAX];
  const char *slash = path != NULL ? strrchr(path, '/') : NULL;
  if (slash == NULL || slash == path || (size_t)(slash - path) >= sizeof(dir))
    return gpuipc__err(-EINVAL, "gpuipc__rundir_listen: %s is not a path in "
                       "a directory", path != NULL ? path : "(null)");
  memcpy(dir, path, (size_t)(slash - path));
  dir[slash - path] = '\0';
  /* Who makes a socket clears those that killed owners left. */
  int n = gpuipc__rundir_prune(dir, GPUIPC__PRUNE_CHANNELS, NULL, NULL);
  if (n > 0)
    GPUIPC_LOG_I("removed %d stale channel socket%s from %s", n,
                 n == 1 ? "" : "s", dir);
  int guard;
  int rc = guard_lock(dir, LOCK_SH, &guard);
  if (rc != 0)
    return rc;
  rc = gpuipc__sock_listen(path, backlog, out_fd);
  close(guard);
  return rc;
}

static bool ends_with(const char *s, const char *suffix)
{
  size_t n = strlen(s), m = strlen(suffix);
  return n > m && strcmp(s + n - m, suffix) == 0;
}

/* @name with its suffix (of @cut bytes) replaced by @suffix, into @out. */
static bool swap_suffix(const char *name, size_t cut, const char *suffix,
                        char out[NAME_MAX + 1])
{
  size_t n = strlen(name) - cut;
  if (n + strlen(suffix) > NAME_MAX)
    return false;
  memcpy(out, name, n);
  strcpy(out + n, suffix);
  return true;
}

static bool exists_at(int dfd, const char *name)
{
  struct stat st;
  return fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

bool gpuipc__rundir_chan_sock(int dfd, const char *name)
{
  size_t p = strlen(CHAN_PREFIX), s = strlen(SOCK_SUFFIX), n = strlen(name);
  if (n <= p + s || strncmp(name, CHAN_PREFIX, p) != 0 ||
      !ends_with(name, SOCK_SUFFIX))
    return false;
  for (size_t i = p; i < n - s; i++)
    if (!((name[i] >= '0' && name[i] <= '9') ||
          (name[i] >= 'a' && name[i] <= 'f')))
      return false;
  char lock[NAME_MAX + 1];
  return swap_suffix(name, s, LOCK_SUFFIX, lock) && !exists_at(dfd, lock);
}

static int remove_at(int dfd, const char *dir, const char *name)
{
  if (unlinkat(dfd, name, 0) != 0 && errno != ENOENT)
    return gpuipc__err_errno(errno, "unlink %s/%s", dir, name);
  return 0;
}

struct pruner {
  const char *dir;
  int dfd;
  bool dry;
  gpuipc__stale_fn *fn;
  void *arg;
  int found;
};

static void report(struct pruner *p, const char *name, const char *why,
                   int rc)
{
  p->found++;
  if (p->fn != NULL)
    p->fn(p->arg, name, why, rc);
}

/* Whether nobody listens on socket @name (connect: ECONNREFUSED). */
static bool refused(struct pruner *p, const char *name)
{
  char path[PATH_MAX];
  int n = snprintf(path, sizeof(path), "%s/%s", p->dir, name);
  if (n < 0 || (size_t)n >= sizeof(path))
    return false;
  int fd;
  int rc = gpuipc__sock_connect(path, 0, &fd);
  if (rc == 0)
    close(fd); /* a listener: it sees a connection come and go */
  return rc == -ECONNREFUSED;
}

/*
 * The channel sockets that listen in this network namespace, by name
 * (/proc/net/unix: flag __SO_ACCEPTCON, 0x10000), as one string of
 * "/NAME/" entries; NULL when unknown. A channel end identifies the process
 * that connects to it by pid, so the pruner connects only to the sockets
 * not found here: dead ones, or ones that listen in another namespace.
 */
static char *listening_channels(void)
{
  FILE *f = fopen("/proc/net/unix", "re");
  if (f == NULL)
    return NULL;
  char *list = NULL, *line = NULL;
  size_t len = 0, cap = 0;
  ssize_t n;
  while ((n = getline(&line, &cap, f)) > 0) {
    unsigned long flags;
    char path[PATH_MAX];
    if (sscanf(line, "%*s %*s %*s %lx %*s %*s %*s %4095s", &flags, path) != 2 ||
        !(flags & 0x10000))
      continue;
    const char *name = strrchr(path, '/');
    name = name != NULL ? name + 1 : path;
    if (strncmp(name, CHAN_PREFIX, strlen(CHAN_PREFIX)) != 0)
      continue;
    size_t add = strlen(name) + 2;
    char *grown = realloc(list, len + add + 2);
    if (grown == NULL)
      break;
    list = grown;
    if (len == 0)
      list[len++] = '/';
    snprintf(list + len, add + 1, "%s/", name);
    len += add - 1;
  }
  free(line);
  fclose(f);
  if (list == NULL)
    list = strdup("/");
  return list;
}

static bool listed(const char *list, const char *name)
{
  if (list == NULL)
    return false;
  size_t n = strlen(name);
  for (const char *at = strstr(list, name); at != NULL;
       at = strstr(at + 1, name))
    if (at[-1] == '/' && at[n] == '/')
      return true;
  return false;
}

static void prune_channels(struct pruner *p, DIR *d)
{
  int guard;
  if (guard_lock(p->dir, LOCK_EX, &guard) != 0)
    return;
  char *live = listening_channels();
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!gpuipc__rundir_chan_sock(p->dfd, e->d_name) ||
        listed(live, e->d_name) || !refused(p, e->d_name))
      continue;
    int rc = p->dry ? 0 : remove_at(p->dfd, p->dir, e->d_name);
    report(p, e->d_name, "a channel socket nobody listens on", rc);
  }
  free(live);
  close(guard);
}

/*
 * Domain NAME (its lock file @lock, made if @create, its socket @sock):
 * when nobody holds the lock, its files are stale. A lock file that changed
 * under us (another pruner) is left alone.
 */
static void prune_domain(struct pruner *p, const char *lock, const char *sock,
                         bool create)
{
  int fd = openat(p->dfd, lock,
                  O_RDWR | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0),
                  0600);
  if (fd < 0)
    return;
  struct stat a, b;
  if (flock(fd, LOCK_EX | LOCK_NB) != 0 || fstat(fd, &a) != 0 ||
      fstatat(p->dfd, lock, &b, AT_SYMLINK_NOFOLLOW) != 0 ||
      a.st_ino != b.st_ino || a.st_dev != b.st_dev)
    goto close_lock;
  if (exists_at(p->dfd, sock))
    report(p, sock, "the socket of a domain without a broker",
           p->dry ? 0 : remove_at(p->dfd, p->dir, sock));
  if (!create)
    report(p, lock, "the lock file of a domain without a broker",
           p->dry ? 0 : remove_at(p->dfd, p->dir, lock));
  else
    remove_at(p->dfd, p->dir, lock); /* ours, made just now */
close_lock:
  close(fd);
}

static void prune_domains(struct pruner *p, DIR *d)
{
  struct dirent *e;
  char other[NAME_MAX + 1];
  while ((e = readdir(d)) != NULL) {
    const char *name = e->d_name;
    if (name[0] == '.')
      continue;
    if (ends_with(name, LOCK_SUFFIX)) {
      if (swap_suffix(name, strlen(LOCK_SUFFIX), SOCK_SUFFIX, other))
        prune_domain(p, name, other, false);
    } else if (ends_with(name, SOCK_SUFFIX) &&
               !gpuipc__rundir_chan_sock(p->dfd, name) &&
               swap_suffix(name, strlen(SOCK_SUFFIX), LOCK_SUFFIX, other) &&
               !exists_at(p->dfd, other)) {
      /* A socket without its lock file: nobody can be its broker. */
      if (p->dry) {
        if (refused(p, name))
          report(p, name, "the socket of a domain without a broker", 0);
      } else {
        prune_domain(p, other, name, true);
      }
    }
  }
}

int gpuipc__rundir_prune(const char *dir, unsigned flags,
                         gpuipc__stale_fn *fn, void *arg)
{
  if (dir == NULL)
    return gpuipc__err(-EINVAL, "gpuipc__rundir_prune: dir is NULL");
  DIR *d = opendir(dir);
  if (d == NULL)
    return gpuipc__err_errno(errno, "opendir %s", dir);
  struct pruner p = {dir, dirfd(d), (flags & GPUIPC__PRUNE_DRY_RUN) != 0, fn,
                     arg, 0};
  if (flags & GPUIPC__PRUNE_CHANNELS)
    prune_channels(&p, d);
  if (flags & GPUIPC__PRUNE_DOMAINS) {
    rewinddir(d);
    prune_domains(&p, d);
  }
  closedir(d);
  return p.found;
}
