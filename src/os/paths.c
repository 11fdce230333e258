/*
 * Where a domain lives in the runtime directory (rundir.c finds and checks
 * the directory itself): DIR/NAME.sock, where its broker listens, and
 * DIR/NAME.lock, whose flock makes the broker. The name is checked by the
 * caller (src/domain/fork.c: gpuipc__dom_paths, which also makes a child of
 * fork() close the descriptors of that directory).
 */
#include "os/os.h"

#include <stdio.h>

int gpuipc__rundir_paths(const char *name, struct gpuipc__dom_paths *out)
{
  int rc = gpuipc__runtime_dir(out->dir, sizeof(out->dir));
  if (rc != 0)
    return rc;
  int n1 = snprintf(out->sock, sizeof(out->sock), "%s/%s.sock", out->dir, name);
  int n2 = snprintf(out->lock, sizeof(out->lock), "%s/%s.lock", out->dir, name);
  if (n1 < 0 || n2 < 0 || (size_t)n1 >= sizeof(out->sock) ||
      (size_t)n2 >= sizeof(out->lock))
    return gpuipc__err(-ENAMETOOLONG, "domain %s: path %s/%s.lock is longer "
                       "than %d bytes", name, out->dir, name, PATH_MAX - 1);
  return 0;
}
