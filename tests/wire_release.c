/*
 * The release record (src/wire/desc.c): what a receiver writes into the
 * release ring for the sender, decoded as hostile input. Every flag
 * combination the sender acts on survives the round trip; a record that
 * asks for both an event and a word, an event handle without the event,
 * an unknown flag, an event key out of range, a record slot beyond any
 * depth, a bad magic and a short record are refused with GPUIPC_E_PROTO.
 */
#include "test.h"
#include "wire/desc.h"

#include <string.h>

static int decode(const uint8_t *b, size_t n, struct gpuipc__rel *out)
{
  return gpuipc__rel_decode(b, n, out, "test");
}

static void round_trip(uint32_t flags, uint32_t key, uint64_t seq)
{
  struct gpuipc__rel r, back;
  memset(&r, 0, sizeof(r));
  r.slot = (uint16_t)(seq % GPUIPC__CHAN_SLOT_MAX);
  r.flags = flags;
  r.ev_key = key;
  r.seq = seq;
  for (size_t i = 0; i < sizeof(r.ev_handle); i++)
    r.ev_handle[i] = (uint8_t)(i * 7 + 1);
  uint8_t b[GPUIPC__CHAN_REL_BYTES];
  int n = gpuipc__rel_encode(&r, b, sizeof(b));
  ASSERT_TRUE(n >= 24);
  ASSERT_OK(decode(b, (size_t)n, &back));
  ASSERT_EQ(back.flags, flags);
  ASSERT_EQ(back.seq, seq);
  ASSERT_EQ(back.ev_key, key);
  ASSERT_EQ(back.slot, r.slot);
  if (flags & GPUIPC__REL_NEW_EVENT)
    ASSERT_TRUE(memcmp(back.ev_handle, r.ev_handle, sizeof(r.ev_handle)) ==
                0);
}

/* A record of @flags (encoded as is, checks skipped) must be refused. */
static void refused(uint32_t flags, uint32_t key, const char *why)
{
  struct gpuipc__rel r, back;
  memset(&r, 0, sizeof(r));
  r.flags = flags;
  r.ev_key = key;
  r.seq = 5;
  uint8_t b[GPUIPC__CHAN_REL_BYTES];
  int n = gpuipc__rel_encode(&r, b, sizeof(b));
  ASSERT_TRUE(n >= 24);
  int rc = decode(b, (size_t)n, &back);
  if (rc != GPUIPC_E_PROTO)
    TFAIL("%s: decoded with %d", why, rc);
}

int main(void)
{
  round_trip(0, 0, 1);
  round_trip(GPUIPC__REL_EVENT, 3, 77);
  round_trip(GPUIPC__REL_EVENT | GPUIPC__REL_NEW_EVENT, 64, 1ull << 40);
  round_trip(GPUIPC__REL_WORD, 0, 123456789);
  round_trip(GPUIPC__REL_WORD | GPUIPC__REL_AWAY, 0, 42);

  refused(GPUIPC__REL_WORD | GPUIPC__REL_EVENT, 0, "word and event");
  refused(GPUIPC__REL_WORD | GPUIPC__REL_EVENT | GPUIPC__REL_NEW_EVENT, 0,
          "word and a new event");
  refused(GPUIPC__REL_NEW_EVENT, 0, "event handle without the event");
  refused(GPUIPC__REL_AWAY, 0, "where a word is written, without one");
  refused(GPUIPC__REL_EVENT | GPUIPC__REL_AWAY, 0, "an event written away");
  refused(0x10, 0, "unknown flag");
  refused(GPUIPC__REL_EVENT,
          GPUIPC__CHAN_EV_DEVS * GPUIPC_CHANNEL_DEPTH_MAX, "event key");

  struct gpuipc__rel r = {.flags = GPUIPC__REL_WORD, .seq = 9}, back;
  uint8_t b[GPUIPC__CHAN_REL_BYTES];
  int n = gpuipc__rel_encode(&r, b, sizeof(b));
  ASSERT_TRUE(n >= 24);
  ASSERT_RC(decode(b, 23, &back), GPUIPC_E_PROTO); /* short */
  r.slot = GPUIPC__CHAN_SLOT_MAX;
  n = gpuipc__rel_encode(&r, b, sizeof(b));
  ASSERT_TRUE(n >= 24);
  ASSERT_RC(decode(b, (size_t)n, &back), GPUIPC_E_PROTO); /* slot */
  r.slot = 0;
  n = gpuipc__rel_encode(&r, b, sizeof(b));
  b[0] ^= 1;
  ASSERT_RC(decode(b, (size_t)n, &back), GPUIPC_E_PROTO); /* magic */
  printf("release records: 5 kinds round-trip, 10 malformed refused\n");
  return 0;
}
