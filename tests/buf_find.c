/*
 * gpuipc_buf_find and gpuipc_buf_retain: the index of this process's
 * buffers by address. A range is found inside a buffer and at its edges,
 * refused when it straddles an end or lies between buffers; a released
 * buffer is forgotten; a buffer imported from another process (fork+exec
 * of host_peer) is found at its own mapping; a GPU buffer too where a GPU
 * is there; many threads find, retain and release at once while others
 * allocate and release.
 */
#include "test.h"

#include "os/os.h"

#include <pthread.h>
#include <unistd.h>

#define TIMEOUT_MS 20000

/* gpuipc_buf_find(@p, @n) gives @want at @off, with a reference of its own
 * (released here). */
static void expect_found(const void *p, size_t n, gpuipc_buf_t *want,
                         size_t off)
{
  gpuipc_buf_t *got = NULL;
  size_t at = (size_t)-1;
  ASSERT_OK(gpuipc_buf_find(p, n, &got, &at));
  ASSERT_PTR_EQ(got, want);
  ASSERT_EQ(at, off);
  ASSERT_OK(gpuipc_buf_release(got));
}

static void expect_missing(const void *p, size_t n)
{
  gpuipc_buf_t *got = (gpuipc_buf_t *)0x1;
  ASSERT_RC(gpuipc_buf_find(p, n, &got, NULL), -ENOENT);
  ASSERT_PTR_EQ(got, (gpuipc_buf_t *)0x1); /* untouched */
}

static void check_bad_arguments(void)
{
  gpuipc_buf_t *b;
  int x;
  ASSERT_RC(gpuipc_buf_find(NULL, 1, &b, NULL), -EINVAL);
  ASSERT_RC(gpuipc_buf_find(&x, 1, NULL, NULL), -EINVAL);
  ASSERT_RC(gpuipc_buf_find((void *)(UINTPTR_MAX - 3), 8, &b, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("wrap");
  ASSERT_RC(gpuipc_buf_retain(NULL), -EINVAL);
  expect_missing(&x, sizeof(x)); /* memory gpuipc did not make */
  ASSERT_ERR_MENTIONS("no buffer");
}

/* Edges of one buffer of @kind on @device. */
static void check_edges(gpuipc_kind_t kind, int device)
{
  const size_t size = 3 * 4096 + 17;
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_buf_alloc(size, kind, device, 0, &b));
  char *p = gpuipc_buf_ptr(b);
  expect_found(p, size, b, 0);          /* the whole of it */
  expect_found(p, 1, b, 0);             /* its first byte */
  expect_found(p + 100, 200, b, 100);   /* inside */
  expect_found(p + size - 1, 1, b, size - 1); /* its last byte */
  expect_found(p + size, 0, b, size);   /* nothing, at its end */
  expect_found(p + 5, 0, b, 5);
  expect_missing(p + size - 1, 2);      /* straddles the end */
  expect_missing(p, size + 1);          /* one byte too many */
  expect_missing(p + size, 1);          /* just past it */
  expect_missing(p - 1, 2);             /* straddles the start */
  gpuipc_buf_t *got;
  ASSERT_OK(gpuipc_buf_find(p + 10, 10, &got, NULL)); /* offset NULL */
  ASSERT_PTR_EQ(got, b);

  /* Three references now (alloc, find, retain): each is dropped by its own
   * release, and the buffer stays findable until the last. */
  ASSERT_OK(gpuipc_buf_retain(b));
  ASSERT_OK(gpuipc_buf_release(got));
  ASSERT_OK(gpuipc_buf_release(b));
  expect_found(p, size, b, 0);
  ASSERT_OK(gpuipc_buf_release(b));
  /* Released: forgotten (HOST: its pages are unmapped; the address may be
   * reused by a later mapping, which is then that buffer's). */
  expect_missing(p, 1);
  expect_missing(p + size, 0);
}

/* Many buffers side by side: each range finds its own, none a neighbour. */
static void check_many(void)
{
  enum { N = 200 };
  gpuipc_buf_t *b[N];
  for (int i = 0; i < N; i++)
    ASSERT_OK(gpuipc_buf_alloc(4096 * (size_t)(1 + i % 3), GPUIPC_KIND_HOST,
                               -1, 0, &b[i]));
  for (int i = 0; i < N; i++) {
    char *p = gpuipc_buf_ptr(b[i]);
    size_t n = gpuipc_buf_size(b[i]);
    expect_found(p + n / 2, n / 2, b[i], n / 2);
  }
  /* Release every other one: those are forgotten, the rest still found. */
  void *gone[N];
  for (int i = 0; i < N; i += 2) {
    gone[i] = gpuipc_buf_ptr(b[i]);
    ASSERT_OK(gpuipc_buf_release(b[i]));
  }
  for (int i = 0; i < N; i++) {
    if (i % 2 == 0) {
      gpuipc_buf_t *got = NULL;
      int rc = gpuipc_buf_find(gone[i], 1, &got, NULL);
      /* A later mapping may sit there now; never the released buffer. */
      if (rc == 0) {
        ASSERT_PTR_NE(got, b[i]);
        ASSERT_OK(gpuipc_buf_release(got));
      } else {
        ASSERT_RC(rc, -ENOENT);
      }
    } else {
      expect_found(gpuipc_buf_ptr(b[i]), gpuipc_buf_size(b[i]), b[i], 0);
    }
  }
  for (int i = 1; i < N; i += 2)
    ASSERT_OK(gpuipc_buf_release(b[i]));
}

/* A buffer imported from another process is found at its own mapping. */
static void check_imported(void)
{
  const size_t size = 5000;
  int sv[2];
  ASSERT_OK(gpuipc__sock_pair(sv));
  char fdarg[16], sizearg[32];
  snprintf(fdarg, sizeof(fdarg), "%d", sv[1]);
  snprintf(sizearg, sizeof(sizearg), "%zu", size);
  const char *args[] = {"export-and-exit", fdarg, sizearg, NULL};
  int keep[] = {sv[1], -1};
  pid_t pid = test_spawn("host_peer", args, keep);
  close(sv[1]);
  uint8_t packed[GPUIPC_HANDLE_PACKED_SIZE];
  int fd = -1, nfds = 1;
  ASSERT_EQ(gpuipc__sock_recv(sv[0], packed, sizeof(packed), &fd, &nfds,
                              TIMEOUT_MS),
            sizeof(packed));
  ASSERT_EQ(test_wait(pid, TIMEOUT_MS), 0);
  close(sv[0]);
  gpuipc_handle_t h;
  ASSERT_OK(gpuipc_handle_unpack(packed, sizeof(packed), &h));
  h.fd = fd;
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_buf_import(&h, -1, 0, &b));
  close(fd);
  char *p = gpuipc_buf_ptr(b);
  expect_found(p + 1000, size - 1000, b, 1000);
  expect_missing(p + 1000, size);
  ASSERT_OK(gpuipc_buf_release(b));
  expect_missing(p, 1);
}

/* ---- many threads ---------------------------------------------------------
 * Finders look up ranges of buffers that stay (and must always be found)
 * while churners allocate and release others (found while held, by no
 * finder after release). */
#define FINDERS 4
#define CHURNERS 2
#define ROUNDS 2000

static gpuipc_buf_t *stay[16];

static void *finder(void *arg)
{
  unsigned seed = (unsigned)(uintptr_t)arg;
  for (int r = 0; r < ROUNDS; r++) {
    gpuipc_buf_t *b = stay[rand_r(&seed) % 16];
    char *p = gpuipc_buf_ptr(b);
    size_t n = gpuipc_buf_size(b), off = rand_r(&seed) % n;
    gpuipc_buf_t *got;
    size_t at;
    ASSERT_OK(gpuipc_buf_find(p + off, n - off, &got, &at));
    ASSERT_PTR_EQ(got, b);
    ASSERT_EQ(at, off);
    ASSERT_OK(gpuipc_buf_retain(got));
    ASSERT_OK(gpuipc_buf_release(got));
    ASSERT_OK(gpuipc_buf_release(got));
  }
  return NULL;
}

static void *churner(void *arg)
{
  (void)arg;
  for (int r = 0; r < ROUNDS / 4; r++) {
    gpuipc_buf_t *b;
    ASSERT_OK(gpuipc_buf_alloc(4096, GPUIPC_KIND_HOST, -1, 0, &b));
    expect_found(gpuipc_buf_ptr(b), 4096, b, 0);
    ASSERT_OK(gpuipc_buf_release(b));
  }
  return NULL;
}

static void check_threads(void)
{
  for (int i = 0; i < 16; i++)
    ASSERT_OK(gpuipc_buf_alloc(4096 * (size_t)(i + 1), GPUIPC_KIND_HOST, -1,
                               0, &stay[i]));
  pthread_t t[FINDERS + CHURNERS];
  for (int i = 0; i < FINDERS + CHURNERS; i++)
    ASSERT_EQ(pthread_create(&t[i], NULL, i < FINDERS ? finder : churner,
                             (void *)(uintptr_t)(i + 1)),
              0);
  for (int i = 0; i < FINDERS + CHURNERS; i++)
    ASSERT_EQ(pthread_join(t[i], NULL), 0);
  for (int i = 0; i < 16; i++) {
    void *p = gpuipc_buf_ptr(stay[i]);
    expect_found(p, gpuipc_buf_size(stay[i]), stay[i], 0);
    ASSERT_OK(gpuipc_buf_release(stay[i]));
    expect_missing(p, 1);
  }
}

int main(void)
{
  check_bad_arguments();
  check_edges(GPUIPC_KIND_HOST, -1);
  if (gpuipc_kind_available(GPUIPC_KIND_VMM) == 0) /* a GPU: its memory too */
    check_edges(GPUIPC_KIND_VMM, 0);
  check_many();
  check_imported();
  check_threads();
  printf("buf_find: ok\n");
  return 0;
}
