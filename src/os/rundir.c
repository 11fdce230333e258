/*
 * The private runtime directory that holds domain sockets and lock files.
 * Whoever can write in it can impersonate a broker, so it must be ours,
 * a real directory, and writable by nobody else.
 */
#include "os/os.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* mkdir that accepts an existing entry (checked afterwards by lstat). */
static int mkdir_one(const char *path, mode_t mode)
{
  if (mkdir(path, mode) == 0 || errno == EEXIST)
    return 0;
  return gpuipc__err_errno(errno, "mkdir %s", path);
}

/* Create the missing parents of @path (mode 0755), like mkdir -p. */
static int mkdir_parents(const char *path)
{
  char buf[PATH_MAX];
  size_t n = strlen(path);
  memcpy(buf, path, n + 1);
  /* Skip the leading '/', stop before the last component. */
  for (size_t i = 1; i < n; i++) {
    if (buf[i] != '/')
      continue;
    buf[i] = '\0';
    int rc = mkdir_one(buf, 0755);
    buf[i] = '/';
    if (rc < 0)
      return rc;
  }
  return 0;
}

static int check_dir(const char *path)
{
  struct stat st;
  if (lstat(path, &st) < 0)
    return gpuipc__err_errno(errno, "lstat of runtime directory %s", path);
  if (S_ISLNK(st.st_mode))
    return gpuipc__err(GPUIPC_E_DENIED,
                       "runtime directory %s is a symbolic link; refusing to "
                       "follow it", path);
  if (!S_ISDIR(st.st_mode))
    return gpuipc__err(GPUIPC_E_DENIED,
                       "runtime directory %s is not a directory (mode 0%o)",
                       path, (unsigned)st.st_mode);
  uid_t me = geteuid();
  if (st.st_uid != me)
    return gpuipc__err(GPUIPC_E_DENIED,
                       "runtime directory %s is owned by uid %u, not by this "
                       "process's uid %u", path, (unsigned)st.st_uid,
                       (unsigned)me);
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    return gpuipc__err(GPUIPC_E_DENIED,
                       "runtime directory %s has mode 0%03o: it must not be "
                       "group- or world-writable (chmod 0700 it)", path,
                       (unsigned)(st.st_mode & 07777));
  return 0;
}

int gpuipc__runtime_dir(char *out, size_t cap)
{
  char path[PATH_MAX];
  int n, rc;

  if (out == NULL || cap == 0)
    return gpuipc__err(-EINVAL, "gpuipc__runtime_dir: no output buffer");

  const char *dir = gpuipc__cfg_str(GPUIPC_CFG_DIR);
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  if (dir[0] != '\0') {
    if (dir[0] != '/')
      return gpuipc__err(-EINVAL, "GPUIPC_DIR=%s is not an absolute path",
                         dir);
    n = snprintf(path, sizeof(path), "%s", dir);
    /* Trailing slashes would make lstat follow a symbolic link. */
    while (n > 1 && path[n - 1] == '/')
      path[--n] = '\0';
  } else if (xdg != NULL && xdg[0] == '/') { /* relative: ignored (XDG) */
    n = snprintf(path, sizeof(path), "%s/gpuipc", xdg);
  } else {
    n = snprintf(path, sizeof(path), "/tmp/gpuipc-%u", (unsigned)geteuid());
  }
  if (n < 0 || (size_t)n >= sizeof(path))
    return gpuipc__err(-ENAMETOOLONG, "runtime directory path is longer than "
                                      "%d bytes", PATH_MAX - 1);
  if ((size_t)n >= cap)
    return gpuipc__err(-ENAMETOOLONG, "runtime directory %s needs %d bytes, "
                                      "the buffer holds %zu", path, n + 1, cap);

  /* Only an explicit GPUIPC_DIR gets its parents made for it. */
  if (dir[0] != '\0') {
    rc = mkdir_parents(path);
    if (rc < 0)
      return rc;
  }
  rc = mkdir_one(path, 0700);
  if (rc < 0)
    return rc;
  rc = check_dir(path);
  if (rc < 0)
    return rc;
  memcpy(out, path, (size_t)n + 1);
  return 0;
}
