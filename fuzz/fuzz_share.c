/*
 * libFuzzer target for what a share member reads from a round table that
 * others write (src/share): a table found by name and mapped from its own
 * header (gpuipc__share_table_map_found), and the member's choice of a
 * parent from the members' words (gpuipc__share_parent).
 *
 * Input: one byte of choices, then records of 12 bytes (u32 offset, u64
 * value) that poke words anywhere in a zeroed 160 KiB table. With the low
 * bit of the choices set, the header is first made a valid one (magic,
 * layout, chunk and extent counts from the next bytes), so that the pokes
 * reach the members' words behind it; with bit 5, every member the pokes
 * gave a pid is made this live process (pid and start time), so that
 * parents can be chosen at all.
 *
 * Properties checked on every input:
 *  - map_found either refuses (GPUIPC_E_MISMATCH) or maps every part
 *    inside the buffer;
 *  - a parent is -2, -1, or another slot that is LIVE and SERVER, not
 *    LEAVING, LEFT or FAILED, with a ticket of 1..64, below the member's
 *    own when the member is a server;
 *  - nothing reads outside the buffer (ASan).
 *
 * Seeds: none committed; the fuzzer starts from nothing.
 */
#include "share/share.h"
#include "os/os.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TABLE ((size_t)160 << 10)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static gpuipc_buf_t *table_buf(void)
{
  static gpuipc_buf_t *b;
  if (b == NULL && gpuipc_buf_alloc(TABLE, GPUIPC_KIND_HOST, -1, 0, &b) != 0)
    abort();
  return b;
}

static uint64_t rd(const uint8_t *p, int n)
{
  uint64_t v = 0;
  for (int i = 0; i < n; i++)
    v |= (uint64_t)p[i] << (8 * i);
  return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size < 3)
    return 0;
  gpuipc_buf_t *b = table_buf();
  uint8_t *base = gpuipc_buf_ptr(b);
  memset(base, 0, TABLE);
  uint8_t how = data[0];
  if (how & 1) {
    struct share_hdr *h = (struct share_hdr *)base;
    atomic_store(&h->magic, GPUIPC__SHARE_MAGIC);
    h->layout = GPUIPC__SHARE_LAYOUT;
    h->nchunks = data[1];
    h->nextents = data[2] % 8;
  }
  for (size_t at = 3; at + 12 <= size; at += 12) {
    uint32_t off = (uint32_t)rd(data + at, 4) % (TABLE - 8);
    uint64_t v = rd(data + at + 4, 8);
    memcpy(base + (off & ~7u), &v, 8);
  }
  if (how & 0x20) { /* members the pokes made: this live process */
    static uint64_t st;
    if (st == 0 && gpuipc__pid_start_time(getpid(), &st) != 0)
      abort();
    struct share_member *m = (struct share_member *)(base + 4096);
    for (int s = 0; s < GPUIPC__SHARE_MEMBERS; s++)
      if (atomic_load(&m[s].pid) != 0) {
        atomic_store(&m[s].pid, (uint32_t)getpid());
        m[s].start_time = st;
      }
  }
  struct share_table t;
  int rc = gpuipc__share_table_map_found(&t, b);
  if (rc != 0) {
    if (rc != GPUIPC_E_MISMATCH)
      abort();
    return 0;
  }
  uint8_t *end = base + TABLE;
  if ((uint8_t *)(t.chunks + t.nchunks) > end ||
      (uint8_t *)(t.exts + (size_t)GPUIPC__SHARE_MEMBERS * t.nextents) > end)
    abort();
  struct share_call c;
  memset(&c, 0, sizeof(c));
  c.t = &t;
  c.me = (how >> 1) % GPUIPC__SHARE_MEMBERS;
  c.server = (how >> 7) & 1;
  c.ticket = atomic_load(&t.members[c.me].ticket);
  c.timeout_ms = (how & 0x40) ? -1 : 0;
  c.pwait_slot = -1;
  int p = gpuipc__share_parent(&c, gpuipc__now_ns());
  if (p == -1 || p == -2)
    return 0;
  if (p < 0 || p >= GPUIPC__SHARE_MEMBERS || p == c.me)
    abort();
  uint32_t f = atomic_load(&t.members[p].flags);
  uint32_t tk = atomic_load(&t.members[p].ticket);
  if ((f & (GPUIPC__SM_LIVE | GPUIPC__SM_SERVER)) !=
          (GPUIPC__SM_LIVE | GPUIPC__SM_SERVER) ||
      (f & (GPUIPC__SM_LEAVING | GPUIPC__SM_LEFT | GPUIPC__SM_FAILED)) ||
      tk == 0 || tk > GPUIPC__SHARE_MEMBERS || (c.server && tk >= c.ticket))
    abort();
  return 0;
}
