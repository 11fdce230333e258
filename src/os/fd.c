/* Descriptors: sealed memfds, duplicates, flock-held lock files, and how
 * many this process has open. */
#include "os/os.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <unistd.h>

int gpuipc__memfd_create(const char *name, size_t size, int *out_fd)
{
  int rc;

  if (out_fd == NULL)
    return gpuipc__err(-EINVAL, "gpuipc__memfd_create: out_fd is NULL");
  if (name == NULL)
    name = "gpuipc";
  if (size == 0)
    return gpuipc__err(-EINVAL, "memfd %s: size 0; a buffer needs at least "
                                "one byte", name);
  if (size > (size_t)INT64_MAX)
    return gpuipc__err(-EFBIG, "memfd %s: size %zu exceeds the largest file "
                               "size (%lld)", name, size, (long long)INT64_MAX);
  /*
   * A memfd is sparse: ftruncate accepts sizes no machine can back, and
   * the first touch past what memory and swap hold would kill the process.
   * Refuse those sizes here, where the caller can still hear about it.
   */
  struct sysinfo si;
  if (sysinfo(&si) == 0) {
    unsigned __int128 cap =
        ((unsigned __int128)si.totalram + si.totalswap) * si.mem_unit;
    if ((unsigned __int128)size > cap)
      return gpuipc__err(-ENOMEM, "memfd %s: %zu bytes exceed this machine's "
                                  "memory and swap (%llu bytes)",
                         name, size, (unsigned long long)cap);
  }

  int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    return gpuipc__err_errno(errno, "memfd_create(\"%s\")", name);
  gpuipc__fd_table_ahead(fd);
  if (ftruncate(fd, (off_t)size) < 0) {
    rc = gpuipc__err_errno(errno, "ftruncate of memfd %s to %zu bytes", name,
                           size);
    goto close_fd;
  }
  if (fcntl(fd, F_ADD_SEALS, GPUIPC__MEMFD_SEALS) < 0) {
    rc = gpuipc__err_errno(errno, "fcntl(F_ADD_SEALS) on memfd %s", name);
    goto close_fd;
  }
  *out_fd = fd;
  return 0;

close_fd:
  close(fd);
  return rc;
}

static const char *file_type(mode_t m)
{
  switch (m & S_IFMT) {
  case S_IFREG:
    return "a regular file";
  case S_IFDIR:
    return "a directory";
  case S_IFIFO:
    return "a pipe";
  case S_IFSOCK:
    return "a socket";
  case S_IFCHR:
    return "a character device";
  case S_IFBLK:
    return "a block device";
  case S_IFLNK:
    return "a symbolic link";
  }
  return "of an unknown file type";
}

int gpuipc__memfd_check(int fd, size_t min_size, size_t *size_out)
{
  struct stat st;
  if (fstat(fd, &st) < 0)
    return gpuipc__err_errno(errno, "memfd check: fstat of descriptor %d", fd);
  if (!S_ISREG(st.st_mode))
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "descriptor %d is %s, not a memfd", fd,
                       file_type(st.st_mode));
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0)
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "descriptor %d is a regular file, not a memfd "
                       "(F_GET_SEALS: %s)", fd, strerrordesc_np(errno));
  if (!(seals & F_SEAL_SHRINK))
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "memfd %d is not sealed against shrinking (seals "
                       "0x%x): its size cannot be trusted", fd, seals);
  if (st.st_size < 0 || (uint64_t)st.st_size < (uint64_t)min_size)
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "memfd %d holds %lld bytes, fewer than the %zu "
                       "required", fd, (long long)st.st_size, min_size);
  if (size_out != NULL)
    *size_out = (size_t)st.st_size;
  return 0;
}

int gpuipc__fd_dup(int fd, int *out_fd)
{
  if (out_fd == NULL)
    return gpuipc__err(-EINVAL, "gpuipc__fd_dup: out_fd is NULL");
  int d = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (d < 0)
    return gpuipc__err_errno(errno, "fcntl(F_DUPFD_CLOEXEC) of descriptor %d",
                             fd);
  gpuipc__fd_table_ahead(d);
  *out_fd = d;
  return 0;
}

int gpuipc__fd_keep(int fd, const char *who)
{
  if (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0)
    return gpuipc__err_errno(errno, "%s: fcntl(F_SETFD, FD_CLOEXEC) of "
                             "descriptor %d", who, fd);
  gpuipc__fd_table_ahead(fd);
  return 0;
}

void gpuipc__fd_close(int *fd)
{
  if (fd == NULL || *fd < 0)
    return;
  /* On Linux the descriptor is released even when close says EINTR. */
  close(*fd);
  *fd = -1;
}

/* Whether @path (not followed) is the file open as @fd. */
static bool same_file(int fd, const char *path)
{
  struct stat a, b;
  return fstat(fd, &a) == 0 && lstat(path, &b) == 0 && a.st_ino == b.st_ino &&
         a.st_dev == b.st_dev;
}

int gpuipc__flock_open(const char *path, int timeout_ms, int *out_fd)
{
  int rc;

  if (path == NULL || out_fd == NULL)
    return gpuipc__err(-EINVAL, "gpuipc__flock_open: path %p, out_fd %p",
                       (const void *)path, (void *)out_fd);
  uint64_t deadline = gpuipc__deadline(timeout_ms);
reopen:;
  /* O_NOFOLLOW: a lock file is never a link someone planted. */
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return gpuipc__err_errno(errno, "open lock file %s", path);

  unsigned delay_us = 500;
  for (;;) {
    /* Without a deadline, let the kernel wait for us. */
    int op = timeout_ms < 0 ? LOCK_EX : LOCK_EX | LOCK_NB;
    if (flock(fd, op) == 0)
      break;
    int e = errno;
    if (e == EINTR)
      continue;
    if (e != EWOULDBLOCK) {
      rc = gpuipc__err_errno(e, "flock(LOCK_EX) on %s", path);
      goto close_fd;
    }
    if (timeout_ms == 0) {
      rc = gpuipc__err(-EWOULDBLOCK, "lock %s is held by another process",
                       path);
      goto close_fd;
    }
    int ms = gpuipc__ms_left(deadline);
    if (ms == 0) {
      rc = gpuipc__err(-ETIMEDOUT, "lock %s is still held by another process "
                                   "after %d ms", path, timeout_ms);
      goto close_fd;
    }
    unsigned us = delay_us;
    if (ms > 0 && (unsigned)ms * 1000u < us)
      us = (unsigned)ms * 1000u;
    gpuipc__sleep_us(us);
    delay_us = delay_us * 2 > 10000 ? 10000 : delay_us * 2;
  }
  /*
   * A stale lock file is removed by whoever holds it (gpuipc ls --prune):
   * the one we locked may no longer be the one at @path.
   */
  if (!same_file(fd, path)) {
    close(fd);
    goto reopen;
  }
  *out_fd = fd;
  return 0;

close_fd:
  close(fd);
  return rc;
}

long gpuipc__dir_entries(const char *path, long most)
{
  DIR *d = opendir(path);
  if (d == NULL)
    return -1;
  long n = 0;
  struct dirent *e;
  while (n < most && (e = readdir(d)) != NULL)
    if (e->d_name[0] != '.')
      n++;
  closedir(d);
  return n;
}

long gpuipc__fds_open(pid_t pid)
{
  char path[64];
  if (pid == 0)
    snprintf(path, sizeof(path), "/proc/self/fd");
  else
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
  long n = gpuipc__dir_entries(path, LONG_MAX);
  /* Not the directory's own descriptor. */
  return n < 0 ? -1 : pid == 0 ? n - 1 : n;
}
