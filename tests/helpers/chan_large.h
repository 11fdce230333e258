/*
 * What tests/channel_large.c and its receiver (tests/helpers/chan_large_peer.c)
 * agree on: the messages of each phase, their sizes, and the bytes they
 * carry (a pattern of the byte's index and the message's number).
 */
#ifndef GPUIPC_TEST_CHAN_LARGE_H
#define GPUIPC_TEST_CHAN_LARGE_H

#include "test.h"

#include <stdint.h>
#include <string.h>

#define MIB ((size_t)1 << 20)

/* Channel "large": small limits, so that stages are freed and replaced. */
#define LARGE_SLOT MIB          /* stage_slot_bytes */
#define LARGE_SLOTS 2           /* stage_slots: also the large stages kept */
#define LARGE_BYTES (16 * MIB)  /* stage_large_bytes */
#define LARGE_DEPTH 8

/*
 * Its messages, in order:
 *   1, 2        3 MiB each, both in flight at once (two large stages); a
 *               third is refused with NONBLOCK (-EAGAIN), then sent as
 *   3           3 MiB, which waits until the receiver gives 1 back;
 *   4 ..        the series: slot - 1, slot, slot + 1 bytes, then growing
 *               sizes that force stages to be freed and replaced, each
 *               received and released before the next is sent;
 *   then        LARGE_DRAIN messages of 1 KiB (slots), whose descriptors
 *               carry the last keys to forget.
 */
static const size_t large_series[] = {
    LARGE_SLOT - 1, LARGE_SLOT,     LARGE_SLOT + 1, 3 * MIB,  5 * MIB,
    7 * MIB,        9 * MIB + 7,    11 * MIB,       13 * MIB, 15 * MIB,
    17 * MIB + 1};
#define LARGE_NSERIES (sizeof(large_series) / sizeof(large_series[0]))
#define LARGE_INFLIGHT 3
#define LARGE_DRAIN 2
#define LARGE_KB 1024

/* The size of message @i (1, 2, ...) of channel "large". */
static inline size_t large_size(uint64_t i)
{
  if (i <= LARGE_INFLIGHT)
    return 3 * MIB;
  if (i <= LARGE_INFLIGHT + LARGE_NSERIES)
    return large_series[i - LARGE_INFLIGHT - 1];
  return LARGE_KB;
}
#define LARGE_MSGS (LARGE_INFLIGHT + LARGE_NSERIES + LARGE_DRAIN)

/* Channel "huge": default limits. A 256 MiB view, then a recv_into. */
#define HUGE_VIEW (256 * MIB)
#define HUGE_INTO (48 * MIB + 3)

/* Byte @k of message @msg, eight at a time: word @w. */
static inline uint64_t large_word(uint64_t msg, uint64_t w)
{
  uint64_t x = (w + 1) * 0x9e3779b97f4a7c15ull ^ (msg << 40);
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  return x ^ (x >> 32);
}

static inline void large_fill(uint8_t *p, size_t n, uint64_t msg)
{
  size_t words = n / 8;
  for (size_t w = 0; w < words; w++) {
    uint64_t v = large_word(msg, w);
    memcpy(p + 8 * w, &v, 8);
  }
  uint64_t last = large_word(msg, words);
  for (size_t k = 8 * words; k < n; k++)
    p[k] = (uint8_t)(last >> (8 * (k % 8)));
}

/* The index of the first byte of @p that differs, or (size_t)-1. */
static inline size_t large_check(const uint8_t *p, size_t n, uint64_t msg)
{
  size_t words = n / 8;
  for (size_t w = 0; w < words; w++) {
    uint64_t v = large_word(msg, w), got;
    memcpy(&got, p + 8 * w, 8);
    if (got != v)
      for (size_t k = 0; k < 8; k++)
        if (p[8 * w + k] != (uint8_t)(v >> (8 * k)))
          return 8 * w + k;
  }
  uint64_t last = large_word(msg, words);
  for (size_t k = 8 * words; k < n; k++)
    if (p[k] != (uint8_t)(last >> (8 * (k % 8))))
      return k;
  return (size_t)-1;
}

/* A 1-D uint8 tensor of @n bytes at @p, memory gpuipc did not allocate. */
static inline void large_tensor(gpuipc_tensor_t *t, int64_t *shape, void *p,
                                size_t n)
{
  memset(t, 0, sizeof(*t));
  shape[0] = (int64_t)n;
  t->dl.data = p;
  t->dl.device.device_type = GPUIPC_DL_CPU;
  t->dl.ndim = 1;
  t->dl.dtype = (gpuipc_dl_dtype_t){GPUIPC_DL_UINT, 8, 1};
  t->dl.shape = shape;
}

#endif
