/*
 * What the runtime directory holds, for tools that look without joining
 * (gpuipc ls): the domains there, live or stale (gpuipc_domain_names), the
 * stale files dead processes left and their removal (gpuipc_runtime_prune,
 * over src/os/prune.c), and the name rule (gpuipc_domain_name_check, over
 * proto.c's). None of them creates the directory.
 */
#include "domain/domain.h"
#include "os/os.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int gpuipc_domain_name_check(const char *name)
{
  if (name == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_domain_name_check: name is NULL");
  return gpuipc__name_check(name, "domain name");
}

/* Whether a broker answers at DIR/NAME.sock (a connection it sees close). */
static bool live(const char *dir, const char *name)
{
  char sock[PATH_MAX];
  int fd;
  if (snprintf(sock, sizeof(sock), "%s/%s.sock", dir, name) >=
          (int)sizeof(sock) ||
      gpuipc__sock_connect(sock, 200, &fd) != 0)
    return false;
  close(fd);
  return true;
}

static int cmp_str(const void *a, const void *b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void names_free(char **names, size_t n)
{
  for (size_t i = 0; i < n; i++)
    free(names[i]);
  free(names);
}

/* The domain names of directory @d (NAME.sock, not a channel's), sorted. */
static int names_read(DIR *d, char ***out, size_t *out_n)
{
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t len = strlen(e->d_name);
    if (len <= 5 || strcmp(e->d_name + len - 5, ".sock") != 0 ||
        gpuipc__rundir_chan_sock(dirfd(d), e->d_name))
      continue;
    char *name = strndup(e->d_name, len - 5);
    if (name == NULL)
      goto no_memory;
    if (gpuipc__name_check(name, "domain") != 0) { /* not a domain's */
      free(name);
      continue;
    }
    if (n == cap) {
      size_t ncap = cap ? cap * 2 : 16;
      char **nn = realloc(names, ncap * sizeof(*names));
      if (nn == NULL) {
        free(name);
        goto no_memory;
      }
      names = nn;
      cap = ncap;
    }
    names[n++] = name;
  }
  if (n > 0)
    qsort(names, n, sizeof(*names), cmp_str);
  *out = names;
  *out_n = n;
  return 0;

no_memory:
  names_free(names, n);
  return gpuipc__err(-ENOMEM, "gpuipc_domain_names: out of memory");
}

static gpuipc_domain_entry_t *entry_at(gpuipc_domain_entry_t *out,
                                       size_t stride, int i)
{
  return (gpuipc_domain_entry_t *)((char *)out + stride * (size_t)i);
}

static int entries_check(gpuipc_domain_entry_t *out, int cap, size_t *stride)
{
  if (cap < 0 || (cap > 0 && out == NULL))
    return gpuipc__err(-EINVAL, "gpuipc_domain_names: bad argument");
  /* The caller's struct may be an older, smaller one: out[0].size apart. */
  *stride = cap > 0 ? out[0].size : sizeof(*out);
  int rc = gpuipc__size_check(*stride, "gpuipc_domain_names: out[0]");
  for (int i = 1; rc == 0 && i < cap; i++)
    if (entry_at(out, *stride, i)->size != *stride)
      rc = gpuipc__err(-EINVAL, "gpuipc_domain_names: out[%d].size %zu, "
                       "out[0].size %zu", i, entry_at(out, *stride, i)->size,
                       *stride);
  return rc;
}

int gpuipc_domain_names(gpuipc_domain_entry_t *out, int cap)
{
  size_t stride = 0;
  int rc = entries_check(out, cap, &stride);
  if (rc != 0)
    return rc;
  char dir[PATH_MAX];
  if ((rc = gpuipc__runtime_dir_find(dir, sizeof(dir))) != 0)
    return rc;
  DIR *d = opendir(dir);
  if (d == NULL)
    return gpuipc__err_errno(errno, "gpuipc_domain_names: %s", dir);
  char **names = NULL;
  size_t n = 0;
  rc = names_read(d, &names, &n);
  closedir(d);
  if (rc != 0)
    return rc;
  for (int i = 0; i < cap && (size_t)i < n; i++) {
    gpuipc_domain_entry_t e = {.size = sizeof(e)};
    snprintf(e.name, sizeof(e.name), "%s", names[i]);
    e.live = live(dir, names[i]);
    gpuipc__out_write(entry_at(out, stride, i), stride, &e, sizeof(e));
  }
  names_free(names, n);
  return (int)n;
}

int gpuipc_runtime_prune(unsigned flags, gpuipc_stale_fn *fn, void *arg)
{
  if ((flags & ~GPUIPC_PRUNE_DRY_RUN) != 0)
    return gpuipc__err(-EINVAL, "gpuipc_runtime_prune: unknown flags 0x%x",
                       flags & ~GPUIPC_PRUNE_DRY_RUN);
  char dir[PATH_MAX];
  int rc = gpuipc__runtime_dir_find(dir, sizeof(dir));
  if (rc != 0)
    return rc;
  unsigned f = GPUIPC__PRUNE_CHANNELS | GPUIPC__PRUNE_DOMAINS;
  if (flags & GPUIPC_PRUNE_DRY_RUN)
    f |= GPUIPC__PRUNE_DRY_RUN;
  return gpuipc__rundir_prune(dir, f, fn, arg);
}
