/*
 * The index of this process's live buffers by address (index.h): an array
 * sorted by start address, with beside each entry the greatest end among
 * it and the entries before it, so that a look-up walks back from the last
 * start at or below the address only as far as an entry may still reach
 * the range's end -- one step when buffers do not overlap, which is the
 * rule (two mappings of one memory are the exception). Inserting and
 * removing move the entries after the place, as the registry's lock is
 * held for a few hundred nanoseconds at most for the thousands of buffers
 * a process holds. The registry's lock (buf.c) guards it all.
 */
#include "mem/index.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct entry {
  uintptr_t lo, hi;   /* the buffer's [ptr, ptr + size) */
  uintptr_t reach;    /* the greatest hi of this entry and those before */
  struct gpuipc_buf *buf;
};

static struct entry *entries;
static size_t count, cap;

static uintptr_t start_of(const struct gpuipc_buf *b)
{
  return (uintptr_t)b->ptr;
}

/* The first index whose start is above @addr. */
static size_t upper(uintptr_t addr)
{
  size_t a = 0, b = count;
  while (a < b) {
    size_t m = a + (b - a) / 2;
    if (entries[m].lo <= addr)
      a = m + 1;
    else
      b = m;
  }
  return a;
}

/* Recompute the reach of the entries from @i on. */
static void reach_from(size_t i)
{
  uintptr_t r = i > 0 ? entries[i - 1].reach : 0;
  for (; i < count; i++) {
    if (entries[i].hi > r)
      r = entries[i].hi;
    entries[i].reach = r;
  }
}

int gpuipc__index_add(struct gpuipc_buf *b)
{
  if (count == cap) {
    size_t n = cap ? 2 * cap : 64;
    struct entry *e = realloc(entries, n * sizeof(*e));
    if (e == NULL)
      return -ENOMEM;
    entries = e;
    cap = n;
  }
  uintptr_t lo = start_of(b);
  size_t i = upper(lo);
  memmove(&entries[i + 1], &entries[i], (count - i) * sizeof(*entries));
  entries[i] = (struct entry){.lo = lo, .hi = lo + b->size, .buf = b};
  count++;
  reach_from(i);
  return 0;
}

void gpuipc__index_remove(struct gpuipc_buf *b)
{
  uintptr_t lo = start_of(b);
  for (size_t i = upper(lo); i > 0 && entries[i - 1].lo == lo; i--) {
    if (entries[i - 1].buf == b) {
      memmove(&entries[i - 1], &entries[i], (count - i) * sizeof(*entries));
      count--;
      reach_from(i - 1);
      return;
    }
  }
}

struct gpuipc_buf *
gpuipc__index_find(uintptr_t lo, uintptr_t hi,
                   bool (*usable)(const struct gpuipc_buf *))
{
  for (size_t i = upper(lo); i > 0 && entries[i - 1].reach >= hi; i--) {
    const struct entry *e = &entries[i - 1];
    if (hi <= e->hi && usable(e->buf))
      return e->buf;
  }
  return NULL;
}
