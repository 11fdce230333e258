/*
 * Exact division by one divisor, many times: whether @x is a multiple of
 * @d, and @x / @d, with a mask, a shift, a multiply and a compare instead
 * of a division (tens of cycles each; a batch of a thousand blocks made
 * them most of its host time). @d = 2^s * o with o odd: @x is a multiple
 * of @d when its low s bits are zero and (x >> s) * inv(o) mod 2^64 is at
 * most (2^64 - 1) / o, and that product is then the quotient (Granlund
 * and Montgomery, "Division by Invariant Integers using Multiplication",
 * PLDI 1994, section 9).
 */
#ifndef GPUIPC_CORE_EXACT_H
#define GPUIPC_CORE_EXACT_H

#include <stdbool.h>
#include <stdint.h>

struct gpuipc__exact {
  uint64_t inv; /* the odd part's inverse modulo 2^64 */
  uint64_t max; /* the largest quotient: (2^64 - 1) / the odd part */
  unsigned shift;
};

/* For divisor @d, which must not be 0. */
static inline void gpuipc__exact_init(struct gpuipc__exact *e, uint64_t d)
{
  e->shift = (unsigned)__builtin_ctzll(d);
  uint64_t odd = d >> e->shift, inv = odd; /* right in 3 bits: o * o = 1 mod 8 */
  for (int i = 0; i < 5; i++)
    inv *= 2 - odd * inv; /* Newton: the right bits double, to 96 */
  e->inv = inv;
  e->max = UINT64_MAX / odd;
}

/* Whether @x is a multiple of the divisor; then *@q = @x / divisor. */
static inline bool gpuipc__exact_div(const struct gpuipc__exact *e,
                                     uint64_t x, uint64_t *q)
{
  if (x & ((UINT64_C(1) << e->shift) - 1))
    return false;
  uint64_t y = (x >> e->shift) * e->inv;
  if (y > e->max)
    return false;
  *q = y;
  return true;
}

#endif
