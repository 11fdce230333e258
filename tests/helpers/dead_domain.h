/* What a broker that died leaves in the runtime directory, made by hand. */
#ifndef GPUIPC_TEST_DEAD_DOMAIN_H
#define GPUIPC_TEST_DEAD_DOMAIN_H

#include "os/os.h"
#include "test.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <unistd.h>

/* A dead domain: a lock file nobody holds, a socket nobody listens on. */
static inline void dead_domain(const char *dir, const char *name)
{
  char p[PATH_MAX + 64];
  snprintf(p, sizeof(p), "%s/%s.lock", dir, name);
  int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  snprintf(p, sizeof(p), "%s/%s.sock", dir, name);
  int lfd;
  ASSERT_OK(gpuipc__sock_listen(p, 1, &lfd));
  close(lfd);
}

#endif
