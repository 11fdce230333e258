/* Shared test helpers: assertions that print both sides, skips, processes. */
#ifndef GPUIPC_TEST_H
#define GPUIPC_TEST_H

#include "gpuipc.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#define TEST_SKIP 77

/*
 * Fail the test at this line with a printf-style message. TFAIL_GPUIPC is
 * for a failure of a gpuipc call, made on this thread just before: it
 * adds gpuipc_last_error(), which says why. Any other failure (a value,
 * a byte, a peer's exit status) prints only its message: the last error
 * would be about some earlier call and mislead.
 */
#define TFAIL_AT_(last_error, ...)                                             \
  do {                                                                         \
    fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__);                      \
    fprintf(stderr, __VA_ARGS__);                                              \
    if (last_error)                                                            \
      fprintf(stderr, "\n  gpuipc_last_error(): %s", gpuipc_last_error());     \
    fprintf(stderr, "\n");                                                     \
    exit(1);                                                                   \
  } while (0)
#define TFAIL(...) TFAIL_AT_(0, __VA_ARGS__)
#define TFAIL_GPUIPC(...) TFAIL_AT_(1, __VA_ARGS__)

#define ASSERT_TRUE(c)                                                         \
  do {                                                                         \
    if (!(c))                                                                  \
      TFAIL("expected true: %s", #c);                                          \
  } while (0)

#define ASSERT_CMP_(a, op, b, fmt, type)                                       \
  do {                                                                         \
    type a_ = (type)(a);                                                       \
    type b_ = (type)(b);                                                       \
    if (!(a_ op b_))                                                           \
      TFAIL("%s %s %s: " fmt " vs " fmt, #a, #op, #b, a_, b_);                 \
  } while (0)

#define ASSERT_EQ(a, b) ASSERT_CMP_(a, ==, b, "%" PRId64, int64_t)
#define ASSERT_NE(a, b) ASSERT_CMP_(a, !=, b, "%" PRId64, int64_t)
#define ASSERT_LT(a, b) ASSERT_CMP_(a, <, b, "%" PRId64, int64_t)
#define ASSERT_LE(a, b) ASSERT_CMP_(a, <=, b, "%" PRId64, int64_t)
#define ASSERT_GT(a, b) ASSERT_CMP_(a, >, b, "%" PRId64, int64_t)
#define ASSERT_GE(a, b) ASSERT_CMP_(a, >=, b, "%" PRId64, int64_t)
#define ASSERT_EQ_U(a, b) ASSERT_CMP_(a, ==, b, "%" PRIu64, uint64_t)
#define ASSERT_PTR_NE(a, b) ASSERT_CMP_(a, !=, b, "%p", const void *)
#define ASSERT_PTR_EQ(a, b) ASSERT_CMP_(a, ==, b, "%p", const void *)

/* A gpuipc call that must return exactly @code (prints names on mismatch). */
#define ASSERT_RC(call, code)                                                  \
  do {                                                                         \
    int rc_ = (call);                                                          \
    int want_ = (code);                                                        \
    if (rc_ != want_)                                                          \
      TFAIL_GPUIPC("%s returned %d (%s), expected %d (%s)", #call, rc_,        \
            gpuipc_err_name(rc_), want_, gpuipc_err_name(want_));              \
  } while (0)
#define ASSERT_OK(call) ASSERT_RC(call, 0)

#define ASSERT_STREQ(a, b)                                                     \
  do {                                                                         \
    const char *a_ = (a), *b_ = (b);                                           \
    if (a_ == NULL || b_ == NULL || strcmp(a_, b_) != 0)                       \
      TFAIL("%s == %s: \"%s\" vs \"%s\"", #a, #b, a_ ? a_ : "(null)",          \
            b_ ? b_ : "(null)");                                               \
  } while (0)

/* The last-error sentence must mention @needle. */
#define ASSERT_ERR_MENTIONS(needle)                                            \
  do {                                                                         \
    if (strstr(gpuipc_last_error(), (needle)) == NULL)                         \
      TFAIL_GPUIPC("last_error does not mention \"%s\"", (needle));            \
  } while (0)

#define SKIP(...)                                                              \
  do {                                                                         \
    printf("SKIP: ");                                                          \
    printf(__VA_ARGS__);                                                       \
    printf("\n");                                                              \
    exit(TEST_SKIP);                                                           \
  } while (0)

/* Skip unless at least @n CUDA devices are usable. */
void test_require_gpus(int n);

/* Path of a helper program built in tests/helpers. */
const char *test_helper_path(const char *name);

/*
 * Start helper @name with argv (NULL-terminated, not including argv[0])
 * by fork+exec. @keep_fds: descriptors (-1 terminated, may be NULL) that
 * stay open in the child at the same numbers (their close-on-exec flag is
 * cleared in the child only). Returns the pid.
 */
pid_t test_spawn(const char *name, const char *const *args,
                 const int *keep_fds);

/*
 * Both ends of channel @name of @dom in this process: *@here opened with
 * @here_opts by the caller's thread, *@there with @there_opts by a thread
 * of its own at the same time (NULL options: the library's defaults).
 * Fails the test if either open fails.
 */
void test_chan_pair(gpuipc_domain_t *dom, const char *name,
                    const gpuipc_channel_opts_t *here_opts,
                    const gpuipc_channel_opts_t *there_opts,
                    gpuipc_channel_t **here, gpuipc_channel_t **there);

/*
 * Start helper @name driven through two pipes: its argv is CMD_FD REP_FD
 * (the descriptors it reads commands from and writes lines to), then
 * @more (NULL-ended, at most 10). *@in: where commands go; *@out: where
 * its lines come from (read them with test_lines_next). Returns the pid.
 */
pid_t test_spawn_piped(const char *name, const char *const *more, int *in,
                       int *out);

/* What test_lines_next keeps between lines of one descriptor. */
struct test_lines {
  char buf[4096];
  size_t len;
  char line[1024];
};

/*
 * The next line from @fd (without its newline), or NULL at EOF. Fails the
 * test, naming helper @pid, when nothing comes within @timeout_ms or a
 * line outgrows the buffer; a line longer than l->line is cut.
 */
const char *test_lines_next(struct test_lines *l, int fd, pid_t pid,
                            int timeout_ms);

/* Wait for @pid up to @timeout_ms; returns its exit status (0..255), 128+sig
 * when killed, or fails the test on timeout (after killing it). */
int test_wait(pid_t pid, int timeout_ms);

/*
 * Start CUDA where a GPU is present: load the driver and retain device 0's
 * primary context, which opens descriptors of the driver's own for the
 * life of the process (and makes later HOST buffers register at once).
 * Tests that count descriptors call this first, so that the count they
 * start from already includes them; tests whose timed waits are not about
 * a CUDA start call it before them. Without a GPU it does nothing.
 */
void test_warm_driver(void);

/* Whether this process has the CUDA driver gpuipc would load
 * (GPUIPC_CUDA_LIB, else libcuda.so.1) mapped: loaded by anyone. */
bool test_driver_loaded(void);

/* Number of open descriptors of @pid (0: self) from /proc/PID/fd. Of
 * this process, counted while no growth of the descriptor table runs
 * (fdtable.c): a growth holds a descriptor more for an instant. */
int test_count_fds(pid_t pid);

/* Until the library's descriptor table growth is idle (at most 20 s: a
 * growth is a grace period, milliseconds). The growths tried so far. */
unsigned test_fd_table_settle(void);

/*
 * Run shell command @cmd (the CLI, say): its stdout into @out (of @cap
 * bytes, NUL-terminated, the rest dropped). Returns its exit status, 128
 * when it did not exit.
 */
int test_popen(const char *cmd, char *out, size_t cap);

/* Print "[pid P at T s] MESSAGE" (T: CLOCK_MONOTONIC, one clock for every
 * process of the machine): steps whose timing a failure must show. */
void test_stamp(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The next number of xorshift64 state *@s (not 0): fixed sequences of
 * pseudo-random inputs for tests that want many. */
static inline uint64_t test_xorshift(uint64_t *s)
{
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Deterministic byte pattern: byte i of a pattern with @seed. */
static inline uint8_t test_pattern(uint64_t seed, size_t i)
{
  uint64_t x = (seed + 0x9e3779b97f4a7c15ull) ^ (i * 0xbf58476d1ce4e5b9ull);
  x ^= x >> 31;
  return (uint8_t)(x ^ (x >> 17));
}
void test_fill(void *p, size_t n, uint64_t seed);
/* Returns the index of the first mismatching byte, or (size_t)-1. */
size_t test_check(const void *p, size_t n, uint64_t seed);

/* CRC-32C bit at a time, written from the definition: the reference the
 * table-driven gpuipc__crc32c is checked against. */
static inline uint32_t test_crc32c_ref(const uint8_t *p, size_t n)
{
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < n; i++) {
    crc ^= p[i];
    for (int k = 0; k < 8; k++)
      crc = (crc & 1) ? (crc >> 1) ^ 0x82f63b78u : crc >> 1;
  }
  return ~crc;
}

/* The kind a test_seg_open creator allocates, among its flags. */
#define TEST_SEG_KIND(k) ((((unsigned)(k)) & 0xfu) << 8)

/*
 * gpuipc_segment_open with the domain's timeout and the arguments the
 * registry tests speak in: @flags may carry TEST_SEG_KIND(kind); a CREATE
 * is a scratch one (published at once), as the tests of the registry
 * want. Tests of filling and publishing call gpuipc_segment_open itself.
 */
/* gpuipc.h's GPUIPC_KIND_MAP as a table: each kind and its name. */
struct test_kind {
  gpuipc_kind_t kind;
  const char *name;
};
static const struct test_kind test_kinds[] = {
#define TEST_KIND_ROW(name, value, str, desc) {GPUIPC_KIND_##name, str},
    GPUIPC_KIND_MAP(TEST_KIND_ROW)
#undef TEST_KIND_ROW
};
#define TEST_KINDS (sizeof(test_kinds) / sizeof(test_kinds[0]))

static inline int test_seg_open(gpuipc_domain_t *dom, const char *name,
                                size_t size, int device, unsigned flags,
                                gpuipc_buf_t **out)
{
  gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
  o.bytes = size;
  o.device = device;
  o.kind = (gpuipc_kind_t)((flags >> 8) & 0xfu);
  o.flags = flags & ~0xf00u;
  if (o.flags & GPUIPC_CREATE)
    o.flags |= GPUIPC_SCRATCH;
  return gpuipc_segment_open(dom, name, &o, out);
}

#endif
