/*
 * Random bytes for the whole library: tokens, identities, jitter, ids.
 * One helper, so that every caller gets the same fallback when the kernel
 * gives none (it is used by proc.c, src/domain and src/channel).
 */
#include "os/os.h"

#include <errno.h>
#include <stdatomic.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* No getrandom (old kernel, seccomp): not secret, but distinct. */
static void random_fallback(uint8_t *b, size_t n)
{
  static _Atomic uint64_t calls;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
               ((uint64_t)getpid() << 40) ^ (uint64_t)(uintptr_t)&ts ^
               gpuipc__now_ns() ^
               atomic_fetch_add(&calls, 1) * 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < n; i++) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 29;
    b[i] = (uint8_t)x;
  }
}

int gpuipc__random(void *buf, size_t n)
{
  uint8_t *b = buf;
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom(b + got, n - got, 0);
    if (r > 0) {
      got += (size_t)r;
      continue;
    }
    if (r < 0 && errno == EINTR)
      continue;
    int e = r < 0 ? errno : EIO;
    random_fallback(b + got, n - got);
    return -e;
  }
  return 0;
}

uint64_t gpuipc__random_u64(void)
{
  uint64_t v = 0;
  while (v == 0)
    gpuipc__random(&v, sizeof(v));
  return v;
}
