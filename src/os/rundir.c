/*
 * The private runtime directory that holds domain sockets and lock files.
 * Whoever can write in it can impersonate a broker, so it must be ours,
 * a real directory, and writable by nobody else. gpuipc_runtime_dir, at
 * the end, is the public face of the two internal calls.
 */
#include "os/os.h"

#include <limits.h>
#include <stdbool.h>
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

/*
 * One ancestor @path of runtime directory @dir, as lstat saw it in @st.
 * Whoever may rename or replace an ancestor could swap the directory for
 * one of theirs: each must be root's or ours and writable by nobody else,
 * unless it is sticky (like /tmp: there only an entry's owner may rename
 * or remove it). A symbolic link is as safe as its owner; where it leads
 * is checked once the whole path is resolved.
 */
static int check_ancestor(const char *path, const char *dir,
                          const struct stat *st)
{
  uid_t me = geteuid();
  if (st->st_uid != 0 && st->st_uid != me)
    return gpuipc__err(GPUIPC_E_DENIED,
                       "%s, a parent of runtime directory %s, is owned by uid "
                       "%u, neither root nor this process's uid %u: its "
                       "owner could replace the directory", path, dir,
                       (unsigned)st->st_uid, (unsigned)me);
  if (S_ISLNK(st->st_mode))
    return 0;
  if (!S_ISDIR(st->st_mode))
    return gpuipc__err(GPUIPC_E_DENIED, "%s, a parent of runtime directory "
                       "%s, is not a directory", path, dir);
  if ((st->st_mode & (S_IWGRP | S_IWOTH)) && !(st->st_mode & S_ISVTX))
    return gpuipc__err(GPUIPC_E_DENIED,
                       "%s, a parent of runtime directory %s, has mode 0%03o: "
                       "writable by group or others and not sticky, so they "
                       "could replace the directory", path, dir,
                       (unsigned)(st->st_mode & 07777));
  return 0;
}

/*
 * Check every ancestor of @path (each prefix ending before a '/'), making
 * the missing ones first (0755) when @create is set. *@link tells whether
 * one of them was a symbolic link.
 */
static int check_ancestors(const char *path, bool create, bool *link)
{
  char buf[PATH_MAX];
  size_t n = strlen(path);
  memcpy(buf, path, n + 1);
  *link = false;
  for (size_t i = 0; i < n; i++) {
    if (buf[i] != '/')
      continue;
    char keep = buf[i + 1];
    buf[i + (i == 0)] = '\0'; /* "/" itself, then "/a", "/a/b", ... */
    struct stat st;
    int rc = 0;
    if (i > 0 && create)
      rc = mkdir_one(buf, 0755);
    if (rc == 0 && lstat(buf, &st) != 0)
      rc = gpuipc__err_errno(errno, "lstat %s, a parent of runtime directory "
                             "%s", buf, path);
    if (rc == 0)
      rc = check_ancestor(buf, path, &st);
    if (rc == 0 && S_ISLNK(st.st_mode))
      *link = true;
    buf[i] = '/';
    buf[i + 1] = keep;
    if (rc < 0)
      return rc;
  }
  return 0;
}

/* Where a path with a symbolic link in it leads must be as safe. */
static int check_resolved(const char *path)
{
  char real[PATH_MAX];
  if (realpath(path, real) == NULL)
    return gpuipc__err_errno(errno, "realpath of runtime directory %s", path);
  bool link;
  int rc = check_ancestors(real, false, &link);
  if (rc < 0) {
    char why[512];
    snprintf(why, sizeof(why), "%s", gpuipc_last_error());
    gpuipc__err(rc, "runtime directory %s resolves to %s: %s", path, real,
                why);
  }
  return rc;
}

/*
 * The directory itself must be ours: a real directory that nobody else
 * may write in. Someone who made it first (a squatter in /tmp) is told
 * apart from a mode we can fix ourselves, and the user is told what to do.
 */
static int check_dir(const char *path, const char *remedy)
{
  struct stat st;
  if (lstat(path, &st) < 0)
    return gpuipc__err_errno(errno, "lstat of runtime directory %s", path);
  if (S_ISLNK(st.st_mode))
    return gpuipc__err(GPUIPC_E_DENIED,
                       "runtime directory %s is a symbolic link; refusing to "
                       "follow it: %s", path, remedy);
  if (!S_ISDIR(st.st_mode))
    return gpuipc__err(GPUIPC_E_DENIED,
                       "runtime directory %s is not a directory (mode 0%o): "
                       "%s", path, (unsigned)st.st_mode, remedy);
  uid_t me = geteuid();
  if (st.st_uid != me)
    return gpuipc__err(GPUIPC_E_DENIED,
                       "runtime directory %s is owned by uid %u, not by this "
                       "process's uid %u: %s", path, (unsigned)st.st_uid,
                       (unsigned)me, remedy);
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    return gpuipc__err(GPUIPC_E_DENIED,
                       "runtime directory %s has mode 0%03o: it must not be "
                       "group- or world-writable (chmod 0700 it)", path,
                       (unsigned)(st.st_mode & 07777));
  return 0;
}

/* Which setting named the runtime directory (dir_path), for advice. */
enum dir_source { FROM_GPUIPC_DIR, FROM_XDG, FROM_TMP };

/*
 * What a user can do about a runtime directory that is not theirs: nobody
 * but its owner (or root) may remove an entry of a sticky /tmp, so the way
 * out is a directory of their own.
 */
static const char *remedy(enum dir_source src)
{
  switch (src) {
  case FROM_GPUIPC_DIR:
    return "set GPUIPC_DIR to a directory of your own";
  case FROM_XDG:
    return "remove it, or set GPUIPC_DIR to a directory of your own";
  default:
    return "remove it (its owner or root can), or set GPUIPC_DIR or "
           "XDG_RUNTIME_DIR to a directory of your own";
  }
}

/*
 * Spell @path (absolute) one way: "//" and "/./" become "/", and trailing
 * "/" and "/." go (which would make lstat follow a symbolic link). ".."
 * stays: it means something else after a symbolic link. Every process
 * then names the same directory, its sockets and lock files alike.
 */
static size_t clean_path(char *path)
{
  size_t w = 0;
  for (size_t r = 0; path[r] != '\0';) {
    if (path[r] == '/' && w > 0 && path[w - 1] == '/') {
      r++; /* a second slash */
    } else if (path[r] == '.' && w > 0 && path[w - 1] == '/' &&
               (path[r + 1] == '/' || path[r + 1] == '\0')) {
      r++; /* a "." component */
    } else {
      path[w++] = path[r++];
    }
  }
  while (w > 1 && path[w - 1] == '/')
    w--;
  path[w] = '\0';
  return w;
}

/* The runtime directory's path from the settings, into @path. */
static int dir_path(char path[PATH_MAX], enum dir_source *src)
{
  int n;
  const char *dir = gpuipc__cfg_str(GPUIPC_CFG_DIR);
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  if (dir[0] != '\0') {
    if (dir[0] != '/')
      return gpuipc__err(-EINVAL, "GPUIPC_DIR=%s is not an absolute path",
                         dir);
    *src = FROM_GPUIPC_DIR;
    n = snprintf(path, PATH_MAX, "%s", dir);
  } else if (xdg != NULL && xdg[0] == '/') { /* relative: ignored (XDG) */
    *src = FROM_XDG;
    n = snprintf(path, PATH_MAX, "%s/gpuipc", xdg);
  } else {
    *src = FROM_TMP;
    n = snprintf(path, PATH_MAX, "/tmp/gpuipc-%u", (unsigned)geteuid());
  }
  if (n < 0 || n >= PATH_MAX)
    return gpuipc__err(-ENAMETOOLONG, "runtime directory path is longer than "
                                      "%d bytes", PATH_MAX - 1);
  return (int)clean_path(path);
}

static int runtime_dir(char *out, size_t cap, bool create)
{
  char path[PATH_MAX];
  enum dir_source src = FROM_TMP;
  bool link;
  int rc;

  if (out == NULL || cap == 0)
    return gpuipc__err(-EINVAL, "gpuipc__runtime_dir: no output buffer");
  int n = dir_path(path, &src);
  if (n < 0)
    return n;
  if ((size_t)n >= cap)
    return gpuipc__err(-ENAMETOOLONG, "runtime directory %s needs %d bytes, "
                                      "the buffer holds %zu", path, n + 1, cap);

  struct stat st;
  if (!create && lstat(path, &st) != 0 && errno == ENOENT)
    return gpuipc__err(-ENOENT, "runtime directory %s does not exist", path);
  /* Only an explicit GPUIPC_DIR gets its parents made for it. */
  rc = check_ancestors(path, create && src == FROM_GPUIPC_DIR, &link);
  if (rc == 0 && create)
    rc = mkdir_one(path, 0700);
  if (rc == 0)
    rc = check_dir(path, remedy(src));
  if (rc == 0 && link)
    rc = check_resolved(path);
  if (rc < 0)
    return rc;
  memcpy(out, path, (size_t)n + 1);
  return 0;
}

int gpuipc__runtime_dir(char *out, size_t cap)
{
  return runtime_dir(out, cap, true);
}

int gpuipc__runtime_dir_find(char *out, size_t cap)
{
  return runtime_dir(out, cap, false);
}

int gpuipc_runtime_dir(char *out, size_t cap, unsigned flags)
{
  if ((flags & ~GPUIPC_RUNDIR_FIND) != 0)
    return gpuipc__err(-EINVAL, "gpuipc_runtime_dir: unknown flags 0x%x",
                       flags & ~GPUIPC_RUNDIR_FIND);
  return runtime_dir(out, cap, (flags & GPUIPC_RUNDIR_FIND) == 0);
}
