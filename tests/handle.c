/*
 * gpuipc_handle_pack / gpuipc_handle_unpack: the exact layout, round trips
 * of every kind and handle type, every field broken one at a time, every
 * single-bit flip, every truncation, and the seed corpus of the fuzzer.
 */
#include "test.h"
#include "wire/wire.h"

#include <dirent.h>

#define REC GPUIPC_HANDLE_PACKED_SIZE
#define SENTINEL 0xaa

static const struct {
  gpuipc_kind_t kind;
  gpuipc_handle_type_t type;
} combos[] = {
    {GPUIPC_KIND_HOST, GPUIPC_HT_POSIX_FD},
    {GPUIPC_KIND_VMM, GPUIPC_HT_POSIX_FD},
    {GPUIPC_KIND_VMM, GPUIPC_HT_FABRIC},
    {GPUIPC_KIND_LEGACY, GPUIPC_HT_LEGACY},
    {GPUIPC_KIND_POOL, GPUIPC_HT_POOL},
};
#define NCOMBOS (sizeof(combos) / sizeof(combos[0]))

/* A valid handle of @kind/@type whose fields all differ with @seed. */
static gpuipc_handle_t make_handle(gpuipc_kind_t kind,
                                   gpuipc_handle_type_t type, uint64_t seed)
{
  gpuipc_handle_t h;
  memset(&h, 0, sizeof(h));
  h.version = GPUIPC_HANDLE_VERSION;
  h.kind = kind;
  h.type = type;
  h.alloc_size = (seed % 7 + 1) * (2u << 20);
  h.size = h.alloc_size - 4096 * (seed % 5) - seed % 3;
  h.offset = seed % 3;
  if (kind != GPUIPC_KIND_HOST)
    for (int i = 0; i < 16; i++)
      h.device_uuid[i] = test_pattern(seed, (size_t)i) | 1;
  h.export_id = 0x0102030405060708ull + seed;
  for (int i = 0; i < 16; i++)
    h.boot_id[i] = test_pattern(seed + 1, (size_t)i);
  h.pid = (uint32_t)(1000 + seed);
  h.pidns = 0xeffffffcull + seed;
  h.nonce = 0xa1b2c3d4e5f60718ull ^ (seed * 0x9e3779b97f4a7c15ull);
  if (type != GPUIPC_HT_POSIX_FD)
    for (int i = 0; i < GPUIPC_HANDLE_BYTES; i++)
      h.bytes[i] = test_pattern(seed + 2, (size_t)i);
  h.fd = 42;
  return h;
}

/*
 * Every kind of gpuipc.h's GPUIPC_KIND_MAP but AUTO (a request) has a
 * handle type whose handles validate, and combos[] (what the round trip
 * packs) has it; AUTO and the value after the last kind have none.
 */
static void test_every_kind(void)
{
  const struct test_kind *list = test_kinds;
  const size_t n = TEST_KINDS;
  for (size_t i = 0; i <= n; i++) {
    gpuipc_kind_t k = i < n ? list[i].kind : (gpuipc_kind_t)n;
    const char *name = i < n ? list[i].name : "after the last";
    int valid = 0;
    for (int t = GPUIPC_HT_POSIX_FD; t <= GPUIPC_HT_POOL; t++) {
      gpuipc_handle_t h = make_handle(k, (gpuipc_handle_type_t)t, 3);
      valid += gpuipc__handle_validate(&h, "t") == 0;
    }
    size_t packed = 0;
    for (size_t c = 0; c < NCOMBOS; c++)
      packed += combos[c].kind == k;
    bool handle_kind = i < n && k != GPUIPC_KIND_AUTO;
    if (handle_kind && (valid == 0 || packed == 0))
      TFAIL("kind %s: %d handle types validate, combos[] has %zu", name,
            valid, packed);
    if (!handle_kind && valid != 0)
      TFAIL("kind %s: %d handle types validate", name, valid);
  }
}

static void assert_same_handle(const gpuipc_handle_t *a,
                               const gpuipc_handle_t *b)
{
  ASSERT_EQ_U(a->version, b->version);
  ASSERT_EQ(a->kind, b->kind);
  ASSERT_EQ(a->type, b->type);
  ASSERT_EQ_U(a->flags, b->flags);
  ASSERT_EQ_U(a->size, b->size);
  ASSERT_EQ_U(a->offset, b->offset);
  ASSERT_EQ_U(a->alloc_size, b->alloc_size);
  ASSERT_TRUE(memcmp(a->device_uuid, b->device_uuid, 16) == 0);
  ASSERT_EQ_U(a->export_id, b->export_id);
  ASSERT_TRUE(memcmp(a->boot_id, b->boot_id, 16) == 0);
  ASSERT_EQ_U(a->pid, b->pid);
  ASSERT_EQ_U(a->pidns, b->pidns);
  ASSERT_EQ_U(a->nonce, b->nonce);
  ASSERT_TRUE(memcmp(a->bytes, b->bytes, GPUIPC_HANDLE_BYTES) == 0);
}

/* Little-endian stores written here, independent of src/wire. */
static void st(uint8_t *p, size_t off, uint64_t v, int n)
{
  for (int i = 0; i < n; i++)
    p[off + (size_t)i] = (uint8_t)(v >> (8 * i));
}

static void fix_crc(uint8_t *rec)
{
  st(rec, 188, test_crc32c_ref(rec, 188), 4);
}

static void pack_ok(const gpuipc_handle_t *h, uint8_t *rec)
{
  ASSERT_EQ(gpuipc_handle_pack(h, rec, REC), REC);
}

/* Unpack must fail with @code, say @needle, and leave @out alone. */
static void unpack_fails(const void *rec, size_t len, int code,
                         const char *needle)
{
  gpuipc_handle_t out, pristine;
  memset(&out, SENTINEL, sizeof(out));
  memset(&pristine, SENTINEL, sizeof(pristine));
  ASSERT_RC(gpuipc_handle_unpack(rec, len, &out), code);
  ASSERT_TRUE(memcmp(&out, &pristine, sizeof(out)) == 0);
  if (needle != NULL)
    ASSERT_ERR_MENTIONS(needle);
}

/* Pack must fail with @code, say @needle, and leave @dst alone. */
static void pack_fails(const gpuipc_handle_t *h, int code, const char *needle)
{
  uint8_t dst[REC + 8], pristine[REC + 8];
  memset(dst, SENTINEL, sizeof(dst));
  memset(pristine, SENTINEL, sizeof(pristine));
  ASSERT_RC(gpuipc_handle_pack(h, dst, sizeof(dst)), code);
  ASSERT_TRUE(memcmp(dst, pristine, sizeof(dst)) == 0);
  if (needle != NULL)
    ASSERT_ERR_MENTIONS(needle);
}

/* The packed bytes, built here by hand from the documented layout. */
static void test_exact_layout(void)
{
  for (size_t c = 0; c < NCOMBOS; c++) {
    gpuipc_handle_t h = make_handle(combos[c].kind, combos[c].type, c + 3);
    uint8_t want[REC], got[REC + 1];
    memset(want, 0, sizeof(want));
    st(want, 0, 0x48504947u, 4);
    st(want, 4, 1, 2);
    st(want, 6, REC, 2);
    st(want, 8, (uint64_t)h.kind, 1);
    st(want, 9, (uint64_t)h.type, 1);
    st(want, 16, h.size, 8);
    st(want, 24, h.offset, 8);
    st(want, 32, h.alloc_size, 8);
    memcpy(want + 40, h.device_uuid, 16);
    st(want, 56, h.export_id, 8);
    memcpy(want + 64, h.boot_id, 16);
    st(want, 80, h.pid, 4);
    st(want, 88, h.pidns, 8);
    st(want, 96, h.nonce, 8);
    memcpy(want + 104, h.bytes, 64);
    fix_crc(want);
    ASSERT_TRUE(memcmp(want, "GIPH", 4) == 0);

    memset(got, SENTINEL, sizeof(got));
    ASSERT_EQ(gpuipc_handle_pack(&h, got, sizeof(got)), REC);
    for (size_t i = 0; i < REC; i++)
      if (got[i] != want[i])
        TFAIL("combo %zu: byte %zu is 0x%02x, layout says 0x%02x", c, i,
              got[i], want[i]);
    ASSERT_EQ(got[REC], SENTINEL); /* nothing past the record */

    /* The fd is not part of the packed form. */
    h.fd = -1;
    ASSERT_EQ(gpuipc_handle_pack(&h, got, REC), REC);
    ASSERT_TRUE(memcmp(want, got, REC) == 0);
  }
}

static void test_round_trip(void)
{
  for (size_t c = 0; c < NCOMBOS; c++) {
    for (uint64_t seed = 0; seed < 20; seed++) {
      gpuipc_handle_t h = make_handle(combos[c].kind, combos[c].type, seed);
      ASSERT_OK(gpuipc__handle_validate(&h, "t"));
      uint8_t rec[REC], again[REC];
      pack_ok(&h, rec);
      gpuipc_handle_t out;
      memset(&out, SENTINEL, sizeof(out));
      ASSERT_OK(gpuipc_handle_unpack(rec, REC, &out));
      assert_same_handle(&h, &out);
      ASSERT_EQ(out.fd, -1);
      pack_ok(&out, again);
      ASSERT_TRUE(memcmp(rec, again, REC) == 0);
    }
  }
  /* Pool export data may be anything, zero included. */
  gpuipc_handle_t h = make_handle(GPUIPC_KIND_POOL, GPUIPC_HT_POOL, 1);
  memset(h.bytes, 0, sizeof(h.bytes));
  uint8_t rec[REC];
  pack_ok(&h, rec);
  gpuipc_handle_t out;
  ASSERT_OK(gpuipc_handle_unpack(rec, REC, &out));
  assert_same_handle(&h, &out);

  /* Limits that are allowed. */
  h = make_handle(GPUIPC_KIND_VMM, GPUIPC_HT_POSIX_FD, 1);
  h.size = h.alloc_size = GPUIPC_SIZE_MAX_ABSURD;
  h.offset = 0;
  h.pid = 4194304;
  h.export_id = UINT64_MAX;
  h.nonce = UINT64_MAX;
  pack_ok(&h, rec);
  ASSERT_OK(gpuipc_handle_unpack(rec, REC, &out));
  assert_same_handle(&h, &out);
  h.size = 1;
  h.offset = GPUIPC_SIZE_MAX_ABSURD - 1; /* the last byte */
  h.pid = 1;
  pack_ok(&h, rec);
  ASSERT_OK(gpuipc_handle_unpack(rec, REC, &out));
  assert_same_handle(&h, &out);
}

/*
 * One field of the packed form broken; @crc: recompute the CRC so that the
 * field's own check is what fails.
 */
struct corrupt_case {
  const char *name;
  int combo;   /* index into combos[] */
  size_t off;  /* byte offset in the record */
  int width;   /* 1, 2, 4, 8, or 0 to OR 0x01 into byte @off */
  uint64_t value;
  int crc;
  const char *needle;
};

static const struct corrupt_case corrupt_cases[] = {
    {"magic", 0, 0, 4, 0x48504948u, 1, ": magic 0x48504948 "},
    {"magic byte 3", 3, 3, 1, 'h', 1, ": magic "},
    {"version 0", 1, 4, 2, 0, 1, ": handle version 0 is invalid"},
    {"version 2", 1, 4, 2, 2, 1, "version 2 is newer than this library's 1"},
    {"version 7", 2, 4, 2, 7, 0, "version 7 is newer than this library's 1"},
    {"record length 191", 0, 6, 2, 191, 1, ": record length 191 "},
    {"record length 193", 4, 6, 2, 193, 1, ": record length 193 "},
    {"kind 0 (auto)", 0, 8, 1, 0, 1, ": kind 0 (auto) "},
    {"kind 5", 1, 8, 1, 5, 1, ": kind 5 "},
    {"kind 255", 1, 8, 1, 255, 1, ": kind 255 "},
    {"type 0", 1, 9, 1, 0, 1, ": handle type 0 "},
    {"type 5", 3, 9, 1, 5, 1, ": handle type 5 "},
    {"host with fabric", 0, 9, 1, GPUIPC_HT_FABRIC, 1,
     ": handle type 2 (fabric) is not valid for kind host"},
    {"legacy with pool", 3, 9, 1, GPUIPC_HT_POOL, 1,
     ": handle type 4 (pool) is not valid for kind legacy"},
    {"pool with posix_fd", 4, 9, 1, GPUIPC_HT_POSIX_FD, 1,
     "is not valid for kind pool"},
    {"vmm with legacy", 1, 9, 1, GPUIPC_HT_LEGACY, 1,
     "is not valid for kind vmm"},
    {"flags", 1, 10, 2, 0x8000, 1, ": flags 0x8000 "},
    {"reserved 12", 0, 12, 4, 1, 1, ": reserved bytes 12..15 "},
    {"reserved 15", 0, 15, 1, 0x80, 1, ": reserved bytes 12..15 "},
    {"size 0", 1, 16, 8, 0, 1, ": size 0 "},
    {"size 2^48+1", 1, 16, 8, (1ull << 48) + 1, 1, ": size 281474976710657 "},
    {"size > alloc_size", 1, 16, 8, (2u << 20) * 8, 1, ": alloc_size "},
    {"offset past the end", 0, 24, 8, 1ull << 40, 1, ": offset "},
    {"offset overflow", 1, 24, 8, UINT64_MAX - 100, 1, ": offset "},
    {"alloc_size 2^48+4096", 0, 32, 8, (1ull << 48) + 4096, 1, ": alloc_size "},
    {"host alloc_size not paged", 0, 32, 8, (2u << 20) * 8 + 100, 1,
     "not a multiple of 4096"},
    {"host device_uuid", 0, 40, 0, 0, 1, ": device_uuid must be all zero"},
    {"host device_uuid last", 0, 55, 0, 0, 1, ": device_uuid "},
    {"export_id 0", 2, 56, 8, 0, 1, ": export_id is 0"},
    {"pid 0", 3, 80, 4, 0, 1, ": pid 0 "},
    {"pid 4194305", 3, 80, 4, 4194305, 1, ": pid 4194305 "},
    {"pid 2^32-1", 3, 80, 4, UINT32_MAX, 1, ": pid 4294967295 "},
    {"reserved 84", 4, 84, 4, 0x10000, 1, ": reserved bytes 84..87 "},
    {"nonce 0", 4, 96, 8, 0, 1, ": nonce is 0"},
    {"posix_fd bytes", 1, 104, 0, 0, 1, ": bytes must be all zero"},
    {"host bytes", 0, 167, 0, 0, 1, ": bytes must be all zero"},
    {"reserved 168", 2, 168, 0, 0, 1, ": reserved bytes 168..187 "},
    {"reserved 187", 2, 187, 0, 0, 1, ": reserved bytes 168..187 "},
    /* Fields with no rule of their own: the CRC catches them. */
    {"boot_id", 1, 64, 0, 0, 0, ": CRC-32C mismatch"},
    {"pidns", 1, 88, 8, 7, 0, ": CRC-32C mismatch"},
    {"pool bytes", 4, 150, 0, 0, 0, ": CRC-32C mismatch"},
    {"size (no CRC fix)", 1, 16, 8, 4096, 0, ": CRC-32C mismatch"},
    {"crc", 0, 188, 4, 0, 0, ": CRC-32C mismatch"},
    {"crc byte", 4, 191, 0, 0, 0, ": CRC-32C mismatch"},
};

static void apply(uint8_t *rec, const struct corrupt_case *k)
{
  if (k->width == 0)
    rec[k->off] ^= 0x01;
  else
    st(rec, k->off, k->value, k->width);
  if (k->crc)
    fix_crc(rec);
}

static void test_corrupt_fields(void)
{
  for (size_t i = 0; i < GPUIPC__ARRAY_SIZE(corrupt_cases); i++) {
    const struct corrupt_case *k = &corrupt_cases[i];
    gpuipc_handle_t h =
        make_handle(combos[k->combo].kind, combos[k->combo].type, 5);
    uint8_t rec[REC];
    pack_ok(&h, rec);
    uint8_t orig[REC];
    memcpy(orig, rec, REC);
    apply(rec, k);
    if (memcmp(rec, orig, REC) == 0)
      TFAIL("case %s changes nothing", k->name);
    gpuipc_handle_t out;
    memset(&out, SENTINEL, sizeof(out));
    int rc = gpuipc_handle_unpack(rec, REC, &out);
    if (rc != GPUIPC_E_BADHANDLE)
      TFAIL("case %s: unpack returned %d (%s)", k->name, rc,
            gpuipc_err_name(rc));
    unpack_fails(rec, REC, GPUIPC_E_BADHANDLE, "gpuipc_handle_unpack: ");
    if (k->needle != NULL && strstr(gpuipc_last_error(), k->needle) == NULL)
      TFAIL("case %s: \"%s\" does not mention \"%s\"", k->name,
            gpuipc_last_error(), k->needle);
  }

  /* A GPU handle must name its device: all of the UUID zero. */
  gpuipc_handle_t h = make_handle(GPUIPC_KIND_VMM, GPUIPC_HT_POSIX_FD, 5);
  uint8_t rec[REC];
  pack_ok(&h, rec);
  memset(rec + 40, 0, 16);
  fix_crc(rec);
  unpack_fails(rec, REC, GPUIPC_E_BADHANDLE,
               ": device_uuid is all zero for kind vmm");
  /* Legacy and fabric handles must carry bytes. */
  for (int c = 2; c <= 3; c++) {
    h = make_handle(combos[c].kind, combos[c].type, 5);
    pack_ok(&h, rec);
    memset(rec + 104, 0, 64);
    fix_crc(rec);
    unpack_fails(rec, REC, GPUIPC_E_BADHANDLE, ": bytes are all zero");
  }
}

/* The same rules hold for pack, on the struct. */
static void test_pack_rejects(void)
{
  gpuipc_handle_t base = make_handle(GPUIPC_KIND_VMM, GPUIPC_HT_POSIX_FD, 2);
  gpuipc_handle_t h;

#define PACK_BAD(stmt, needle)                                                 \
  do {                                                                         \
    h = base;                                                                  \
    stmt;                                                                      \
    pack_fails(&h, GPUIPC_E_BADHANDLE, "gpuipc_handle_pack: ");                \
    ASSERT_ERR_MENTIONS(needle);                                               \
  } while (0)

  PACK_BAD(h.version = 0, "version 0 is invalid");
  PACK_BAD(h.version = 2, "version 2 is newer");
  PACK_BAD(h.version = 0x10001, "version 65537 is newer");
  PACK_BAD(h.kind = GPUIPC_KIND_AUTO, ": kind 0 (auto) ");
  PACK_BAD(h.kind = (gpuipc_kind_t)9, ": kind 9 ");
  PACK_BAD(h.kind = (gpuipc_kind_t)-1, ": kind -1 ");
  PACK_BAD(h.type = (gpuipc_handle_type_t)0, ": handle type 0 ");
  PACK_BAD(h.type = GPUIPC_HT_POOL, ": handle type 4 (pool) ");
  PACK_BAD(h.flags = 1, ": flags 0x1 ");
  PACK_BAD(h.flags = 0x10000, ": flags 0x10000 "); /* wider than the wire */
  PACK_BAD(h.size = 0, ": size 0 ");
  PACK_BAD((h.size = (1ull << 48) + 1, h.alloc_size = h.size),
           ": size 281474976710657 ");
  PACK_BAD(h.size = h.alloc_size + 1, ": alloc_size ");
  PACK_BAD((h.offset = UINT64_MAX - 4095, h.size = 8192), ": offset ");
  PACK_BAD(h.offset = h.alloc_size - h.size + 1, ": offset ");
  PACK_BAD(h.alloc_size = UINT64_MAX, ": alloc_size ");
  PACK_BAD(memset(h.device_uuid, 0, 16), ": device_uuid ");
  PACK_BAD(h.bytes[63] = 1, ": bytes must be all zero");
  PACK_BAD(h.pid = 0, ": pid 0 ");
  PACK_BAD(h.pid = 4194305, ": pid 4194305 ");
  PACK_BAD(h.export_id = 0, ": export_id ");
  PACK_BAD(h.nonce = 0, ": nonce ");

  base = make_handle(GPUIPC_KIND_HOST, GPUIPC_HT_POSIX_FD, 2);
  PACK_BAD(h.alloc_size += 2048, "not a multiple of 4096");
  PACK_BAD(h.device_uuid[7] = 1, ": device_uuid must be all zero");
  PACK_BAD(h.type = GPUIPC_HT_FABRIC, "not valid for kind host");
  PACK_BAD(h.bytes[0] = 1, ": bytes must be all zero");
  base = make_handle(GPUIPC_KIND_LEGACY, GPUIPC_HT_LEGACY, 2);
  PACK_BAD(memset(h.bytes, 0, 64), ": bytes are all zero");
  PACK_BAD(memset(h.device_uuid, 0, 16), ": device_uuid is all zero");
  base = make_handle(GPUIPC_KIND_VMM, GPUIPC_HT_FABRIC, 2);
  PACK_BAD(memset(h.bytes, 0, 64), ": bytes are all zero");
#undef PACK_BAD
}

/* With the CRC, every single-bit error is caught, whichever check fires. */
static void test_bit_flips(void)
{
  for (size_t c = 0; c < NCOMBOS; c++) {
    gpuipc_handle_t h = make_handle(combos[c].kind, combos[c].type, 7);
    uint8_t rec[REC];
    pack_ok(&h, rec);
    for (size_t bit = 0; bit < REC * 8; bit++) {
      rec[bit / 8] ^= (uint8_t)(1u << (bit % 8));
      gpuipc_handle_t out, pristine;
      memset(&out, SENTINEL, sizeof(out));
      memset(&pristine, SENTINEL, sizeof(pristine));
      int rc = gpuipc_handle_unpack(rec, REC, &out);
      if (rc != GPUIPC_E_BADHANDLE)
        TFAIL("combo %zu bit %zu: unpack returned %d (%s)", c, bit, rc,
              gpuipc_err_name(rc));
      ASSERT_TRUE(memcmp(&out, &pristine, sizeof(out)) == 0);
      rec[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    gpuipc_handle_t out;
    ASSERT_OK(gpuipc_handle_unpack(rec, REC, &out)); /* restored */
  }
}

static void test_lengths(void)
{
  gpuipc_handle_t h = make_handle(GPUIPC_KIND_LEGACY, GPUIPC_HT_LEGACY, 9);
  uint8_t buf[2 * REC];
  memset(buf, 0, sizeof(buf));
  pack_ok(&h, buf);
  char want[64];
  for (size_t len = 0; len < REC; len++) {
    snprintf(want, sizeof(want), "truncated: %zu bytes, a handle is 192",
             len);
    unpack_fails(buf, len, GPUIPC_E_BADHANDLE, want);
  }
  unpack_fails(buf, REC + 1, GPUIPC_E_BADHANDLE,
               ": 1 trailing bytes after the 192-byte handle");
  unpack_fails(buf, 2 * REC, GPUIPC_E_BADHANDLE, ": 192 trailing bytes");

  /* A newer version is named as such whatever its length. */
  st(buf, 4, 7, 2);
  st(buf, 6, 256, 2);
  unpack_fails(buf, 256, GPUIPC_E_BADHANDLE,
               ": handle version 7 is newer than this library's 1");
  unpack_fails(buf, 100, GPUIPC_E_BADHANDLE, "version 7 is newer");
  unpack_fails(buf, 6, GPUIPC_E_BADHANDLE, "version 7 is newer");
  unpack_fails(buf, 5, GPUIPC_E_BADHANDLE, "truncated: 5 bytes");
  /* ... but only with our magic. */
  buf[0] = 'g';
  unpack_fails(buf, 256, GPUIPC_E_BADHANDLE, ": 64 trailing bytes");
}

static void test_null_args(void)
{
  gpuipc_handle_t h = make_handle(GPUIPC_KIND_HOST, GPUIPC_HT_POSIX_FD, 1);
  uint8_t rec[REC], pristine[REC];
  memset(rec, SENTINEL, sizeof(rec));
  memset(pristine, SENTINEL, sizeof(pristine));

  ASSERT_RC(gpuipc_handle_pack(NULL, rec, REC), -EINVAL);
  ASSERT_ERR_MENTIONS("gpuipc_handle_pack: handle is NULL");
  ASSERT_RC(gpuipc_handle_pack(&h, NULL, REC), -EINVAL);
  ASSERT_ERR_MENTIONS("dst is NULL");
  ASSERT_RC(gpuipc_handle_pack(NULL, NULL, 0), -EINVAL);
  ASSERT_RC(gpuipc_handle_pack(&h, rec, REC - 1), -ENOSPC);
  ASSERT_ERR_MENTIONS("cap 191 is smaller than a handle (192)");
  ASSERT_RC(gpuipc_handle_pack(&h, rec, 0), -ENOSPC);
  ASSERT_TRUE(memcmp(rec, pristine, REC) == 0);
  /* The cap is checked before the handle: an invalid one still says ENOSPC. */
  h.nonce = 0;
  ASSERT_RC(gpuipc_handle_pack(&h, rec, 10), -ENOSPC);
  h.nonce = 1;

  pack_ok(&h, rec);
  gpuipc_handle_t out;
  ASSERT_RC(gpuipc_handle_unpack(NULL, REC, &out), -EINVAL);
  ASSERT_ERR_MENTIONS("gpuipc_handle_unpack: src is NULL");
  ASSERT_RC(gpuipc_handle_unpack(rec, REC, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("out is NULL");
  ASSERT_RC(gpuipc_handle_unpack(NULL, 0, NULL), -EINVAL);
  ASSERT_RC(gpuipc__handle_validate(NULL, "x"), -EINVAL);
  ASSERT_OK(gpuipc__handle_validate(&h, NULL));
}

/*
 * The committed seed corpus of fuzz/fuzz_handle: files named valid-* unpack
 * and pack back to the same bytes; bad-* are refused. This keeps the seeds
 * in step with the format.
 */
static void test_corpus(void)
{
  char dir[4096];
  snprintf(dir, sizeof(dir), "%s/fuzz/corpus/fuzz_handle", GPUIPC_TEST_SRCDIR);
  DIR *d = opendir(dir);
  if (d == NULL)
    TFAIL("cannot open %s: %s", dir, strerror(errno));
  int nvalid = 0, nbad = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    int valid = strncmp(e->d_name, "valid-", 6) == 0;
    int bad = strncmp(e->d_name, "bad-", 4) == 0;
    if (!valid && !bad)
      continue;
    char path[8192];
    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
      TFAIL("cannot open %s: %s", path, strerror(errno));
    uint8_t buf[1024];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    gpuipc_handle_t out;
    int rc = gpuipc_handle_unpack(buf, n, &out);
    if (valid) {
      if (rc != 0)
        TFAIL("%s: %s", e->d_name, gpuipc_last_error());
      uint8_t again[REC];
      pack_ok(&out, again);
      ASSERT_EQ(n, REC);
      ASSERT_TRUE(memcmp(again, buf, REC) == 0);
      nvalid++;
    } else {
      if (rc != GPUIPC_E_BADHANDLE)
        TFAIL("%s: unpack returned %d, expected BADHANDLE", e->d_name, rc);
      nbad++;
    }
  }
  closedir(d);
  ASSERT_GE(nvalid, (int)NCOMBOS);
  ASSERT_GE(nbad, 1);
}

int main(void)
{
  test_exact_layout();
  test_round_trip();
  test_every_kind();
  test_corrupt_fields();
  test_pack_rejects();
  test_bit_flips();
  test_lengths();
  test_null_args();
  test_corpus();
  printf("handle: ok\n");
  return 0;
}
