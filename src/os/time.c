/* Monotonic time and deadlines. */
#include "os/os.h"

#include <limits.h>
#include <stdatomic.h>
#include <time.h>

#define NS_PER_MS 1000000ull

/* How far tests moved this process's clock on (os.h). */
static _Atomic uint64_t skipped_ns;

void gpuipc__test_hook_clock_skip_ms(unsigned ms)
{
  atomic_fetch_add(&skipped_ns, (uint64_t)ms * NS_PER_MS);
}

uint64_t gpuipc__now_ns(void)
{
  struct timespec ts;
  /* CLOCK_MONOTONIC cannot fail with a valid pointer on Linux. */
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec +
         atomic_load_explicit(&skipped_ns, memory_order_relaxed);
}

uint64_t gpuipc__deadline(int timeout_ms)
{
  if (timeout_ms < 0)
    return UINT64_MAX;
  return gpuipc__now_ns() + (uint64_t)timeout_ms * NS_PER_MS;
}

int gpuipc__ms_left(uint64_t deadline)
{
  if (deadline == UINT64_MAX)
    return -1;
  uint64_t now = gpuipc__now_ns();
  if (now >= deadline)
    return 0;
  uint64_t ms = (deadline - now + NS_PER_MS - 1) / NS_PER_MS;
  return ms > INT_MAX ? INT_MAX : (int)ms;
}

void gpuipc__sleep_us(unsigned us)
{
  struct timespec ts = {.tv_sec = us / 1000000,
                        .tv_nsec = (long)(us % 1000000) * 1000};
  nanosleep(&ts, NULL); /* EINTR: callers re-check their deadline */
}
