/* The public buffer API in one process: allocation, accessors, export,
 * import (self, cached, taking the fd), release, and every argument
 * check. */
#include "test.h"

#include "mem/mem.h"
#include "os/os.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

static void check_bad_arguments(void)
{
  gpuipc_buf_t *b = (gpuipc_buf_t *)0x1;
  ASSERT_RC(gpuipc_buf_alloc(4096, GPUIPC_KIND_HOST, -1, 0, NULL), -EINVAL);
  ASSERT_RC(gpuipc_buf_alloc(0, GPUIPC_KIND_HOST, -1, 0, &b), -EINVAL);
  ASSERT_ERR_MENTIONS("size is 0");
  ASSERT_RC(gpuipc_buf_alloc((size_t)1 << 62, GPUIPC_KIND_HOST, -1, 0, &b),
            -EFBIG);
  ASSERT_RC(gpuipc_buf_alloc(4096, (gpuipc_kind_t)99, -1, 0, &b), -EINVAL);
  ASSERT_ERR_MENTIONS("kind 99");
  ASSERT_RC(gpuipc_buf_alloc(4096, GPUIPC_KIND_HOST, -1, 0x10, &b), -EINVAL);
  ASSERT_PTR_EQ(b, (gpuipc_buf_t *)0x1); /* untouched on failure */

  ASSERT_PTR_EQ(gpuipc_buf_ptr(NULL), NULL);
  ASSERT_EQ(gpuipc_buf_size(NULL), 0);
  ASSERT_EQ(gpuipc_buf_device(NULL), -1);
  ASSERT_RC(gpuipc_buf_release(NULL), -EINVAL);

  gpuipc_handle_t h;
  ASSERT_RC(gpuipc_buf_export(NULL, &h), -EINVAL);
  ASSERT_RC(gpuipc_buf_import(NULL, -1, 0, &b), -EINVAL);
  memset(&h, 0, sizeof(h));
  ASSERT_RC(gpuipc_buf_import(&h, -1, 0, &b), GPUIPC_E_BADHANDLE);
}

/* Without a GPU the CUDA kinds say so and AUTO falls back to HOST. */
static void check_kinds(void)
{
  ASSERT_OK(gpuipc_kind_available(GPUIPC_KIND_HOST));
  ASSERT_STREQ(gpuipc_kind_name(GPUIPC_KIND_LEGACY), "legacy");
  if (gpuipc_driver_status(NULL) != 0) {
    gpuipc_buf_t *b;
    int rc = gpuipc_buf_alloc(4096, GPUIPC_KIND_VMM, 0, 0, &b);
    ASSERT_TRUE(rc == GPUIPC_E_UNSUPPORTED || rc == GPUIPC_E_NODRIVER ||
                rc == GPUIPC_E_NODEVICE);
    ASSERT_TRUE(strlen(gpuipc_last_error()) > 0);
    ASSERT_OK(gpuipc_buf_alloc(4096, GPUIPC_KIND_AUTO, -1, 0, &b));
    ASSERT_EQ(gpuipc_buf_kind(b), GPUIPC_KIND_HOST);
    ASSERT_OK(gpuipc_buf_release(b));
  }
}

/*
 * Every kind of gpuipc.h's GPUIPC_KIND_MAP is known wherever kinds are
 * derived from it: the value of its place, its name, a kind that
 * gpuipc_kind_available takes, ops of its own (every kind but AUTO where
 * the build has the CUDA header, HOST always). The value after the last
 * is no kind.
 */
static void check_kind_list(void)
{
  const struct test_kind *list = test_kinds;
  const size_t n = TEST_KINDS;
  ASSERT_EQ(n, GPUIPC__KIND_COUNT);
  for (size_t i = 0; i < n; i++) {
    gpuipc_kind_t k = list[i].kind;
    const char *name = list[i].name;
    if ((size_t)k != i)
      TFAIL("kind %s has value %d at place %zu", name, (int)k, i);
    if (strcmp(gpuipc_kind_name(k), name) != 0)
      TFAIL("kind %s is named \"%s\"", name, gpuipc_kind_name(k));
    for (size_t j = 0; j < i; j++)
      if (strcmp(list[j].name, name) == 0)
        TFAIL("two kinds are named \"%s\"", name);
    if (gpuipc_kind_available(k) == -EINVAL)
      TFAIL_GPUIPC("gpuipc_kind_available(%s) says it is no kind", name);
    const struct gpuipc__kind_ops *ops = gpuipc__kind_ops(k);
    bool want_ops = k == GPUIPC_KIND_HOST ||
                    (k != GPUIPC_KIND_AUTO && GPUIPC_HAVE_CUDA);
    if (want_ops && (ops == NULL || ops->kind != k))
      TFAIL("kind %s has %s", name, ops == NULL ? "no ops" : "another's ops");
    if (k == GPUIPC_KIND_AUTO && ops != NULL)
      TFAIL("AUTO, a request, has ops");
  }

  gpuipc_kind_t after = (gpuipc_kind_t)n;
  ASSERT_STREQ(gpuipc_kind_name(after), "?");
  ASSERT_RC(gpuipc_kind_available(after), -EINVAL);
  ASSERT_PTR_EQ(gpuipc__kind_ops(after), NULL);
  gpuipc_buf_t *b = NULL;
  ASSERT_RC(gpuipc_buf_alloc(4096, after, -1, 0, &b), -EINVAL);
  ASSERT_RC(gpuipc_buf_alloc(4096, (gpuipc_kind_t)-1, -1, 0, &b), -EINVAL);
  ASSERT_PTR_EQ(b, NULL);
}

/* A HOST buffer of @size bytes and its export *@h: another memfd, for
 * handles that claim a cached identity with it. */
static gpuipc_buf_t *another_memfd(size_t size, gpuipc_handle_t *h)
{
  gpuipc_buf_t *c;
  ASSERT_OK(gpuipc_buf_alloc(size, GPUIPC_KIND_HOST, -1, 0, &c));
  ASSERT_OK(gpuipc_buf_export(c, h));
  return c;
}

static void check_alloc_export_import(void)
{
  int fds_before = test_count_fds(0);
  gpuipc_buf_t *b;
  const size_t size = 3 * 4096 + 17;
  ASSERT_OK(gpuipc_buf_alloc(size, GPUIPC_KIND_HOST, -1, 0, &b));
  ASSERT_EQ(gpuipc_buf_size(b), size);
  ASSERT_EQ(gpuipc_buf_kind(b), GPUIPC_KIND_HOST);
  ASSERT_EQ(gpuipc_buf_device(b), -1);
  uint8_t *p = gpuipc_buf_ptr(b);
  ASSERT_TRUE(p != NULL);
  for (size_t i = 0; i < size; i++)
    ASSERT_EQ(p[i], 0); /* zero-filled */
  test_fill(p, size, 7);

  gpuipc_handle_t h;
  ASSERT_OK(gpuipc_buf_export(b, &h));
  ASSERT_EQ(h.kind, GPUIPC_KIND_HOST);
  ASSERT_EQ(h.type, GPUIPC_HT_POSIX_FD);
  ASSERT_EQ_U(h.size, size);
  ASSERT_EQ_U(h.alloc_size, 4 * 4096);
  ASSERT_EQ(h.pid, getpid());
  ASSERT_TRUE(h.fd >= 0);
  ASSERT_TRUE(fcntl(h.fd, F_GETFD) & FD_CLOEXEC);

  /* A process importing its own export gets its own buffer back. */
  gpuipc_buf_t *self;
  ASSERT_OK(gpuipc_buf_import(&h, -1, 0, &self));
  ASSERT_PTR_EQ(self, b);
  ASSERT_PTR_EQ(gpuipc_buf_ptr(self), p);

  /* Through bytes and back: the record survives packing. */
  uint8_t packed[GPUIPC_HANDLE_PACKED_SIZE];
  ASSERT_EQ(gpuipc_handle_pack(&h, packed, sizeof(packed)),
            GPUIPC_HANDLE_PACKED_SIZE);
  gpuipc_handle_t h2;
  ASSERT_OK(gpuipc_handle_unpack(packed, sizeof(packed), &h2));
  ASSERT_EQ(h2.fd, -1);
  h2.fd = h.fd;
  ASSERT_OK(gpuipc_buf_import(&h2, -1, 0, &self));
  ASSERT_PTR_EQ(self, b);

  /* Two more references now; the memory stays until the last goes. */
  ASSERT_OK(gpuipc_buf_release(self));
  ASSERT_OK(gpuipc_buf_release(self));
  ASSERT_EQ(test_check(p, size, 7), (size_t)-1);

  /* A handle that names a different exporter maps the fd anew, once. */
  gpuipc_handle_t other = h;
  other.nonce ^= 0x5a5a;
  other.pid = 1;
  struct gpuipc__cache_stats s0, s1;
  gpuipc__cache_stats(&s0);
  gpuipc_buf_t *m1, *m2;
  ASSERT_OK(gpuipc_buf_import(&other, -1, 0, &m1));
  ASSERT_OK(gpuipc_buf_import(&other, -1, 0, &m2));
  gpuipc__cache_stats(&s1);
  ASSERT_PTR_EQ(m1, m2);
  ASSERT_PTR_NE(gpuipc_buf_ptr(m1), p); /* a second mapping of the memfd */
  ASSERT_EQ(s1.misses - s0.misses, 1);
  ASSERT_EQ(s1.hits - s0.hits, 1);
  ASSERT_EQ(test_check(gpuipc_buf_ptr(m1), size, 7), (size_t)-1);
  /* Same memory: a write through one mapping shows in the other. */
  ((uint8_t *)gpuipc_buf_ptr(m1))[5] ^= 0xff;
  ASSERT_EQ(p[5], (uint8_t)(test_pattern(7, 5) ^ 0xff));

  /* A handle that claims a cached identity but carries another memfd is
   * refused: the cache never hands out one memory under another's name. */
  gpuipc_handle_t hc;
  gpuipc_buf_t *c = another_memfd(size, &hc);
  gpuipc_handle_t forged = other;
  forged.fd = hc.fd;
  gpuipc_buf_t *f = (gpuipc_buf_t *)0x1;
  ASSERT_RC(gpuipc_buf_import(&forged, -1, 0, &f), GPUIPC_E_BADHANDLE);
  ASSERT_ERR_MENTIONS("another memory object");
  forged = h; /* this process's own identity */
  forged.fd = hc.fd;
  ASSERT_RC(gpuipc_buf_import(&forged, -1, 0, &f), GPUIPC_E_BADHANDLE);
  ASSERT_PTR_EQ(f, (gpuipc_buf_t *)0x1);
  close(hc.fd);
  ASSERT_OK(gpuipc_buf_release(c));

  ASSERT_OK(gpuipc_buf_release(m1));
  ASSERT_OK(gpuipc_buf_release(m2));

  /* Its own export, released: the fd still holds the memory, and importing
   * the handle maps it again instead of failing. */
  ASSERT_OK(gpuipc_buf_release(b));
  gpuipc__cache_stats(&s0);
  gpuipc_buf_t *again;
  ASSERT_OK(gpuipc_buf_import(&h, -1, 0, &again));
  gpuipc__cache_stats(&s1);
  ASSERT_EQ(s1.misses - s0.misses, 1); /* mapped anew, not a stale hit */
  const uint8_t *q = gpuipc_buf_ptr(again);
  for (size_t i = 0; i < size; i++)
    ASSERT_EQ(q[i], (uint8_t)(test_pattern(7, i) ^ (i == 5 ? 0xff : 0)));
  ASSERT_OK(gpuipc_buf_release(again));
  close(h.fd);
  ASSERT_EQ(test_count_fds(0), fds_before);
}

/* Descriptors that are not a gpuipc memfd are refused, and nothing leaks. */
static void check_wrong_fds(void)
{
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_buf_alloc(8192, GPUIPC_KIND_HOST, -1, 0, &b));
  gpuipc_handle_t h;
  ASSERT_OK(gpuipc_buf_export(b, &h));
  int good_fd = h.fd;
  h.nonce ^= 1; /* look like another exporter, so the fd is really used */
  int fds_before = test_count_fds(0);

  gpuipc_buf_t *out = (gpuipc_buf_t *)0x1;
  h.fd = -1;
  ASSERT_RC(gpuipc_buf_import(&h, -1, 0, &out), GPUIPC_E_BADHANDLE);
  ASSERT_ERR_MENTIONS("fd");

  char path[] = "/tmp/gpuipc-test-XXXXXX";
  int file = mkstemp(path);
  ASSERT_TRUE(file >= 0);
  unlink(path);
  ASSERT_EQ(ftruncate(file, 8192), 0);
  h.fd = file;
  ASSERT_RC(gpuipc_buf_import(&h, -1, 0, &out), GPUIPC_E_BADHANDLE);
  ASSERT_ERR_MENTIONS("regular file");
  close(file);

  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  h.fd = pipefd[0];
  ASSERT_RC(gpuipc_buf_import(&h, -1, 0, &out), GPUIPC_E_BADHANDLE);
  ASSERT_ERR_MENTIONS("pipe");
  close(pipefd[0]);
  close(pipefd[1]);

  /* A real memfd smaller than the handle claims. */
  int small;
  ASSERT_OK(gpuipc__memfd_create("small", 4096, &small));
  h.fd = small;
  ASSERT_RC(gpuipc_buf_import(&h, -1, 0, &out), GPUIPC_E_BADHANDLE);
  close(small);

  /* A handle claiming more than the memfd holds. */
  h.fd = good_fd;
  h.alloc_size = 16384;
  h.size = 16384;
  ASSERT_RC(gpuipc_buf_import(&h, -1, 0, &out), GPUIPC_E_BADHANDLE);
  ASSERT_PTR_EQ(out, (gpuipc_buf_t *)0x1);
  ASSERT_EQ(test_count_fds(0), fds_before);
  close(good_fd);
  ASSERT_OK(gpuipc_buf_release(b));
}

static bool fd_open(int fd)
{
  return fcntl(fd, F_GETFD) != -1;
}

/*
 * GPUIPC_BUF_TAKE_FD: on success the fd is gpuipc's (a HOST mapping keeps a
 * duplicate of its own, so the one given is closed at once, on a new
 * mapping and on a cached one alike); on failure it stays the caller's,
 * open. Nothing leaks either way.
 */
static void check_take_fd(void)
{
  const size_t size = 8192;
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_buf_alloc(size, GPUIPC_KIND_HOST, -1, 0, &b));
  test_fill(gpuipc_buf_ptr(b), size, 9);
  gpuipc_handle_t h;
  ASSERT_OK(gpuipc_buf_export(b, &h));
  gpuipc_handle_t other = h;
  other.nonce ^= 0x77; /* another exporter's: really mapped */
  int fds_before = test_count_fds(0);
  gpuipc_buf_t *out = (gpuipc_buf_t *)0x1;
  ASSERT_RC(gpuipc_buf_import(&other, -1, 0x4, &out), -EINVAL);
  ASSERT_ERR_MENTIONS("0x4");
  /* gpuipc's own "the fd is close-on-exec already" is not the caller's
   * to give: a caller's fd always gets FD_CLOEXEC. */
  ASSERT_RC(gpuipc_buf_import(&other, -1,
                              GPUIPC_BUF_TAKE_FD | GPUIPC__BUF_FD_CLOEXEC,
                              &out),
            -EINVAL);
  ASSERT_ERR_MENTIONS("0x80000000");
  ASSERT_PTR_EQ(out, (gpuipc_buf_t *)0x1);

  /* Refused: the fd stays open. */
  gpuipc_handle_t big = other;
  big.fd = dup(h.fd);
  big.alloc_size = big.size = 4 * size;
  ASSERT_RC(gpuipc_buf_import(&big, -1, GPUIPC_BUF_TAKE_FD, &out),
            GPUIPC_E_BADHANDLE);
  ASSERT_PTR_EQ(out, (gpuipc_buf_t *)0x1);
  ASSERT_TRUE(fd_open(big.fd));
  close(big.fd);

  /* A new mapping: the fd given is gone, the bytes are there. */
  gpuipc_handle_t t = other;
  t.fd = dup(h.fd);
  gpuipc_buf_t *m1, *m2;
  ASSERT_OK(gpuipc_buf_import(&t, -1, GPUIPC_BUF_TAKE_FD, &m1));
  ASSERT_TRUE(!fd_open(t.fd));
  ASSERT_PTR_NE(gpuipc_buf_ptr(m1), gpuipc_buf_ptr(b));
  ASSERT_EQ(test_check(gpuipc_buf_ptr(m1), size, 9), (size_t)-1);

  /* The cached mapping: the same buffer back, the fd closed too. */
  t.fd = dup(h.fd);
  ASSERT_OK(gpuipc_buf_import(&t, -1, GPUIPC_BUF_TAKE_FD, &m2));
  ASSERT_PTR_EQ(m2, m1);
  ASSERT_TRUE(!fd_open(t.fd));

  /* The cached identity with another memfd is refused: still open. */
  gpuipc_handle_t hc;
  gpuipc_buf_t *c = another_memfd(size, &hc);
  gpuipc_handle_t forged = other;
  forged.fd = hc.fd;
  ASSERT_RC(gpuipc_buf_import(&forged, -1, GPUIPC_BUF_TAKE_FD, &out),
            GPUIPC_E_BADHANDLE);
  ASSERT_TRUE(fd_open(hc.fd));
  close(hc.fd);
  ASSERT_OK(gpuipc_buf_release(c));

  ASSERT_OK(gpuipc_buf_release(m1));
  ASSERT_OK(gpuipc_buf_release(m2));
  ASSERT_EQ(test_count_fds(0), fds_before);
  close(h.fd);
  ASSERT_OK(gpuipc_buf_release(b));
}

int main(void)
{
  test_warm_driver(); /* count descriptors with the driver's included */
  check_bad_arguments();
  check_kinds();
  check_kind_list();
  check_alloc_export_import();
  check_wrong_fds();
  check_take_fd();
  printf("buf: ok\n");
  return 0;
}
