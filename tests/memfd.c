/*
 * Sealed memfds: creation, the seals holding, and the check that tells a
 * sealed memfd from every other kind of descriptor.
 */
#include "test.h"

#include "os/os.h"

#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static void round_trip(void)
{
  const size_t size = 8192;
  int fd;
  ASSERT_OK(gpuipc__memfd_create("memfd-test", size, &fd));
  ASSERT_EQ(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);

  size_t got = 0;
  ASSERT_OK(gpuipc__memfd_check(fd, 0, &got));
  ASSERT_EQ_U(got, size);
  got = 0;
  ASSERT_OK(gpuipc__memfd_check(fd, size, &got));
  ASSERT_EQ_U(got, size);
  ASSERT_OK(gpuipc__memfd_check(fd, 1, NULL));

  /* Bytes written through one mapping are read through another. */
  uint8_t *w = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_TRUE(w != MAP_FAILED);
  test_fill(w, size, 5);
  uint8_t *r = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_TRUE(r != MAP_FAILED);
  ASSERT_EQ_U(test_check(r, size, 5), (size_t)-1);
  munmap(r, size);
  munmap(w, size);

  /* Sealed: the size is fixed and no seal can be removed or added. */
  int seals = fcntl(fd, F_GET_SEALS);
  ASSERT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  errno = 0;
  ASSERT_EQ(ftruncate(fd, size * 2), -1);
  ASSERT_EQ(errno, EPERM);
  errno = 0;
  ASSERT_EQ(ftruncate(fd, size / 2), -1);
  ASSERT_EQ(errno, EPERM);
  errno = 0;
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1);
  ASSERT_EQ(errno, EPERM);
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  ASSERT_EQ(st.st_size, size);

  /* Too small for what the caller needs. */
  got = 77;
  ASSERT_RC(gpuipc__memfd_check(fd, size + 1, &got), GPUIPC_E_BADHANDLE);
  ASSERT_ERR_MENTIONS("holds 8192 bytes, fewer than the 8193 required");
  ASSERT_EQ_U(got, 77);
  close(fd);

  /* A size that is not a page multiple is kept exactly. */
  ASSERT_OK(gpuipc__memfd_create(NULL, 5000, &fd));
  ASSERT_OK(gpuipc__memfd_check(fd, 5000, &got));
  ASSERT_EQ_U(got, 5000);
  close(fd);
}

static void rejects(int fd, const char *needle)
{
  size_t got = 77;
  ASSERT_RC(gpuipc__memfd_check(fd, 0, &got), GPUIPC_E_BADHANDLE);
  ASSERT_ERR_MENTIONS(needle);
  ASSERT_EQ_U(got, 77);
}

static void check_rejects_impostors(void)
{
  char path[PATH_MAX];
  ASSERT_OK(gpuipc__runtime_dir(path, sizeof(path)));
  strcat(path, "/memfd-test-file");
  int file = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(file, 0);
  ASSERT_EQ(ftruncate(file, 8192), 0);
  rejects(file, "is a regular file, not a memfd");
  close(file);
  unlink(path);

  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  rejects(p[0], "is a pipe, not a memfd");
  close(p[0]);
  close(p[1]);

  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  rejects(sv[0], "is a socket, not a memfd");
  close(sv[0]);
  close(sv[1]);

  int dev = open("/dev/null", O_RDWR | O_CLOEXEC);
  rejects(dev, "is a character device, not a memfd");
  close(dev);

  int dir = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  rejects(dir, "is a directory, not a memfd");
  close(dir);

  /* memfds whose size is not sealed: without sealing, and sealable but
   * never sealed. */
  int m = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(m, 0);
  ASSERT_EQ(ftruncate(m, 8192), 0);
  rejects(m, "not sealed against shrinking");
  close(m);
  m = memfd_create("sealable", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(m, 0);
  ASSERT_EQ(ftruncate(m, 8192), 0);
  rejects(m, "not sealed against shrinking");
  /* Sealed against growing only is still not enough. */
  ASSERT_EQ(fcntl(m, F_ADD_SEALS, F_SEAL_GROW), 0);
  rejects(m, "not sealed against shrinking");
  ASSERT_EQ(fcntl(m, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  ASSERT_OK(gpuipc__memfd_check(m, 8192, NULL));
  close(m);

  /* Not a descriptor at all. */
  ASSERT_RC(gpuipc__memfd_check(-1, 0, NULL), -EBADF);
}

static void sizes_refused(void)
{
  int before = test_count_fds(0);
  int fd = -1;
  ASSERT_RC(gpuipc__memfd_create("zero", 0, &fd), -EINVAL);
  ASSERT_ERR_MENTIONS("size 0");

  int rc = gpuipc__memfd_create("absurd", (size_t)1 << 62, &fd);
  ASSERT_LT(rc, 0);
  ASSERT_LT(-4096, rc); /* an errno, not a gpuipc code */
  ASSERT_ERR_MENTIONS("absurd");
  printf("1<<62 bytes: %s (%s)\n", gpuipc_err_name(rc), gpuipc_last_error());

  ASSERT_RC(gpuipc__memfd_create("too-big", SIZE_MAX, &fd), -EFBIG);
  ASSERT_RC(gpuipc__memfd_create("x", 4096, NULL), -EINVAL);
  ASSERT_EQ(fd, -1);
  ASSERT_EQ(test_count_fds(0), before);
}

static void dup_and_close(void)
{
  int fd;
  ASSERT_OK(gpuipc__memfd_create("dup", 4096, &fd));
  int d = -1;
  ASSERT_OK(gpuipc__fd_dup(fd, &d));
  ASSERT_GE(d, 3);
  ASSERT_NE(d, fd);
  ASSERT_EQ(fcntl(d, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  /* The same open file: a seal check through one holds for the other. */
  ASSERT_OK(gpuipc__memfd_check(d, 4096, NULL));
  gpuipc__fd_close(&d);
  ASSERT_EQ(d, -1);
  gpuipc__fd_close(&d); /* closing -1 does nothing */
  ASSERT_EQ(d, -1);
  int stale = fd;
  gpuipc__fd_close(&fd);
  ASSERT_EQ(fcntl(stale, F_GETFD), -1);
  ASSERT_RC(gpuipc__fd_dup(stale, &d), -EBADF);
  ASSERT_EQ(d, -1);
  ASSERT_RC(gpuipc__fd_dup(0, NULL), -EINVAL);
}

int main(void)
{
  round_trip();
  check_rejects_impostors();
  sizes_refused();
  dup_and_close();
  printf("memfd: ok\n");
  return 0;
}
