/*
 * Writes the seed corpus of fuzz/fuzz_handle into DIR: valid packed handles
 * of every kind and handle type (valid-*), and records broken in one way
 * each (bad-*). tests/handle.c checks that every valid-* file unpacks and
 * packs back to the same bytes and that every bad-* file is refused.
 *
 * Not part of the build: every .c file directly under fuzz/ is a libFuzzer
 * target, and this one is a plain program. Build and run it from the
 * repository root:
 *   cc -std=gnu11 -Iinclude -Isrc -o /tmp/gen_handle_corpus \
 *     fuzz/gen/gen_handle_corpus.c src/wire/[a-z]*.c src/core/[a-z]*.c \
 *     -lpthread
 *   /tmp/gen_handle_corpus fuzz/corpus/fuzz_handle
 * The output is deterministic.
 */
#include "wire/wire.h"

#include <stdio.h>
#include <stdlib.h>

#define REC GPUIPC_HANDLE_PACKED_SIZE

static const char *dir;

static void put_file(const char *name, const uint8_t *p, size_t n)
{
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (f == NULL || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
    perror(path);
    exit(1);
  }
}

static uint8_t pattern(unsigned seed, unsigned i)
{
  return (uint8_t)((seed * 131u + i * 29u + 7u) ^ (i >> 2));
}

/* @odd_boot: the fuzz target's CRC-fixing selector bit (boot_id[0] & 1). */
static gpuipc_handle_t make(gpuipc_kind_t kind, gpuipc_handle_type_t type,
                            unsigned seed, int odd_boot)
{
  gpuipc_handle_t h;
  memset(&h, 0, sizeof(h));
  h.version = GPUIPC_HANDLE_VERSION;
  h.kind = kind;
  h.type = type;
  h.alloc_size = (uint64_t)(seed + 1) << 21;
  h.size = h.alloc_size - 4096 * seed;
  h.offset = 4096 * (seed / 2);
  if (kind != GPUIPC_KIND_HOST)
    for (unsigned i = 0; i < 16; i++)
      h.device_uuid[i] = pattern(seed, i) | 0x10;
  h.export_id = seed + 1;
  for (unsigned i = 0; i < 16; i++)
    h.boot_id[i] = pattern(seed + 50, i);
  h.boot_id[0] = (uint8_t)((h.boot_id[0] & ~1u) | (odd_boot ? 1 : 0));
  h.pid = 4000 + seed;
  h.pidns = 4026531836ull; /* the initial pid namespace's inode */
  h.nonce = 0x5eed000000000000ull | seed;
  if (type != GPUIPC_HT_POSIX_FD)
    for (unsigned i = 0; i < GPUIPC_HANDLE_BYTES; i++)
      h.bytes[i] = pattern(seed + 100, i);
  h.fd = -1;
  return h;
}

static void pack(const gpuipc_handle_t *h, uint8_t *rec)
{
  if (gpuipc_handle_pack(h, rec, REC) != REC) {
    fprintf(stderr, "pack: %s\n", gpuipc_last_error());
    exit(1);
  }
}

static void st(uint8_t *p, size_t off, uint64_t v, int n)
{
  for (int i = 0; i < n; i++)
    p[off + (size_t)i] = (uint8_t)(v >> (8 * i));
}

static void fix_crc(uint8_t *rec)
{
  st(rec, GPUIPC__HANDLE_CRC_OFFSET,
     gpuipc__crc32c(0, rec, GPUIPC__HANDLE_CRC_OFFSET), 4);
}

int main(int argc, char **argv)
{
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  dir = argv[1];
  static const struct {
    const char *name;
    gpuipc_kind_t kind;
    gpuipc_handle_type_t type;
  } combos[] = {
      {"host-posix_fd", GPUIPC_KIND_HOST, GPUIPC_HT_POSIX_FD},
      {"vmm-posix_fd", GPUIPC_KIND_VMM, GPUIPC_HT_POSIX_FD},
      {"vmm-fabric", GPUIPC_KIND_VMM, GPUIPC_HT_FABRIC},
      {"legacy-legacy", GPUIPC_KIND_LEGACY, GPUIPC_HT_LEGACY},
      {"pool-pool", GPUIPC_KIND_POOL, GPUIPC_HT_POOL},
  };
  uint8_t rec[2 * REC];
  char name[128];
  for (unsigned c = 0; c < sizeof(combos) / sizeof(combos[0]); c++) {
    for (unsigned k = 0; k < 2; k++) {
      gpuipc_handle_t h = make(combos[c].kind, combos[c].type, c * 2 + k, k);
      pack(&h, rec);
      snprintf(name, sizeof(name), "valid-%s-%u", combos[c].name, k);
      put_file(name, rec, REC);
    }
  }

  gpuipc_handle_t h = make(GPUIPC_KIND_VMM, GPUIPC_HT_POSIX_FD, 3, 0);
  uint8_t good[REC];
  pack(&h, good);

  put_file("bad-empty", good, 0);
  put_file("bad-truncated-191", good, REC - 1);
  put_file("bad-truncated-8", good, 8);
  memcpy(rec, good, REC);
  rec[REC] = 0;
  put_file("bad-trailing-byte", rec, REC + 1);

  /* One field broken each, with the CRC made right again. */
  static const struct {
    const char *name;
    size_t off;
    int width;
    uint64_t value;
  } bad[] = {
      {"bad-magic", 0, 4, 0x48504948u},
      {"bad-version-0", 4, 2, 0},
      {"bad-version-7", 4, 2, 7},
      {"bad-record-length", 6, 2, 191},
      {"bad-kind-auto", 8, 1, 0},
      {"bad-type-for-kind", 9, 1, GPUIPC_HT_LEGACY},
      {"bad-flags", 10, 2, 1},
      {"bad-reserved-12", 12, 4, 1},
      {"bad-size-0", 16, 8, 0},
      {"bad-size-absurd", 16, 8, (1ull << 48) + 1},
      {"bad-offset-overflow", 24, 8, UINT64_MAX - 4095},
      {"bad-alloc-size-small", 32, 8, 4096},
      {"bad-uuid-zero", 40, 8, 0},
      {"bad-export-id-0", 56, 8, 0},
      {"bad-pid-0", 80, 4, 0},
      {"bad-pid-max", 80, 4, 4194305},
      {"bad-reserved-84", 84, 4, 1},
      {"bad-nonce-0", 96, 8, 0},
      {"bad-bytes-for-posix_fd", 104, 1, 1},
      {"bad-reserved-168", 168, 1, 1},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    memcpy(rec, good, REC);
    st(rec, bad[i].off, bad[i].value, bad[i].width);
    if (bad[i].off == 40) /* the whole UUID zero, not half */
      memset(rec + 40, 0, 16);
    fix_crc(rec);
    put_file(bad[i].name, rec, REC);
  }
  memcpy(rec, good, REC);
  rec[100] ^= 0x04; /* nonce changed, CRC left stale */
  put_file("bad-crc", rec, REC);
  return 0;
}
