/*
 * Exact division by an invariant divisor (src/core/exact.h): for divisors
 * of every shape (1, powers of two, odd, even with an odd part, the
 * largest), multiples and non-multiples agree with % and /.
 */
#include "core/exact.h"
#include "test.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void)
{
  return test_xorshift(&rng_state);
}

static long checked;

static void one(const struct gpuipc__exact *e, uint64_t d, uint64_t x)
{
  uint64_t q = 0xdeadbeef;
  bool exact = gpuipc__exact_div(e, x, &q);
  if (exact != (x % d == 0) || (exact && q != x / d)) {
    printf("d %llu x %llu: said %d (q %llu), want %d (q %llu)\n",
           (unsigned long long)d, (unsigned long long)x, exact,
           (unsigned long long)q, x % d == 0, (unsigned long long)(x / d));
    ASSERT_TRUE(0);
  }
  checked++;
}

static void divisor(uint64_t d)
{
  struct gpuipc__exact e;
  gpuipc__exact_init(&e, d);
  uint64_t top = UINT64_MAX / d;
  for (uint64_t k = 0; k < 64 && k <= top; k++) {
    one(&e, d, k * d);          /* the first multiples */
    one(&e, d, (top - k) * d);  /* the last ones */
    if (k * d + 1 != 0)
      one(&e, d, k * d + 1);    /* just past */
    if (k > 0)
      one(&e, d, k * d - 1);    /* just before */
  }
  for (int i = 0; i < 2000; i++) {
    uint64_t x = rng();
    one(&e, d, x);
    one(&e, d, (top == UINT64_MAX ? x : x % (top + 1)) * d);
    one(&e, d, x >> (rng() % 64));
  }
}

int main(void)
{
  static const uint64_t fixed[] = {
      1, 2, 3, 5, 7, 16, 4096, 16384, 24576, 40960, 163840, 262144,
      (uint64_t)1 << 21, 3ull << 20, 0x7fffffffffffffffull,
      0x8000000000000000ull, UINT64_MAX, UINT64_MAX - 1};
  for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
    divisor(fixed[i]);
  for (int i = 0; i < 300; i++) {
    uint64_t d = rng() >> (rng() % 64);
    divisor(d != 0 ? d : 1);
  }
  printf("%ld divisions agree\n", checked);
  return 0;
}
