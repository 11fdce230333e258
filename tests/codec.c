/*
 * The bounded little-endian writer and reader, and CRC-32C: exact bytes,
 * bounds, sticky errors, strings, and the error sentences.
 */
#include "test.h"
#include "wire/wire.h"

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint64_t rng(void)
{
  return test_xorshift(&rng_state);
}

static void test_crc32c(void)
{
  /* Check value and the RFC 3720 (iSCSI) B.4 vectors. */
  ASSERT_EQ_U(gpuipc__crc32c(0, "123456789", 9), 0xe3069283u);
  ASSERT_EQ_U(gpuipc__crc32c(0, NULL, 0), 0);
  uint8_t v[32];
  memset(v, 0, sizeof(v));
  ASSERT_EQ_U(gpuipc__crc32c(0, v, 32), 0x8a9136aau);
  memset(v, 0xff, sizeof(v));
  ASSERT_EQ_U(gpuipc__crc32c(0, v, 32), 0x62a8ab43u);
  for (int i = 0; i < 32; i++)
    v[i] = (uint8_t)i;
  ASSERT_EQ_U(gpuipc__crc32c(0, v, 32), 0x46dd794eu);
  for (int i = 0; i < 32; i++)
    v[i] = (uint8_t)(31 - i);
  ASSERT_EQ_U(gpuipc__crc32c(0, v, 32), 0x113fdb5cu);

  /* Against the reference on random data, and chained in two pieces. */
  uint8_t buf[600];
  for (int round = 0; round < 300; round++) {
    size_t n = rng() % sizeof(buf);
    for (size_t i = 0; i < n; i++)
      buf[i] = (uint8_t)rng();
    uint32_t want = test_crc32c_ref(buf, n);
    ASSERT_EQ_U(gpuipc__crc32c(0, buf, n), want);
    size_t cut = n ? rng() % (n + 1) : 0;
    ASSERT_EQ_U(gpuipc__crc32c(gpuipc__crc32c(0, buf, cut), buf + cut, n - cut),
                want);
  }
}

static void test_put_exact_bytes(void)
{
  uint8_t b[32];
  memset(b, 0xaa, sizeof(b));
  struct gpuipc__wbuf w;
  gpuipc__wbuf_init(&w, b, sizeof(b));
  gpuipc__put_u8(&w, 0x01);
  gpuipc__put_u16(&w, 0x0302);
  gpuipc__put_u32(&w, 0x07060504u);
  gpuipc__put_u64(&w, 0x0f0e0d0c0b0a0908ull);
  gpuipc__put_bytes(&w, "\x10\x11", 2);
  gpuipc__put_bytes(&w, NULL, 0);
  ASSERT_EQ(w.err, 0);
  ASSERT_EQ(w.len, 17);
  for (int i = 0; i < 17; i++)
    ASSERT_EQ(b[i], i + 1);
  ASSERT_EQ(b[17], 0xaa);
  ASSERT_OK(gpuipc__wbuf_finish(&w, "t"));

  struct gpuipc__rbuf r;
  gpuipc__rbuf_init(&r, b, 17);
  ASSERT_EQ_U(gpuipc__get_u8(&r), 0x01);
  ASSERT_EQ_U(gpuipc__get_u16(&r), 0x0302);
  ASSERT_EQ_U(gpuipc__get_u32(&r), 0x07060504u);
  ASSERT_EQ_U(gpuipc__get_u64(&r), 0x0f0e0d0c0b0a0908ull);
  ASSERT_EQ(gpuipc__rbuf_left(&r), 2);
  uint8_t two[2];
  gpuipc__get_bytes(&r, two, 2);
  ASSERT_EQ(two[0], 0x10);
  ASSERT_EQ(two[1], 0x11);
  ASSERT_EQ(r.err, 0);
  ASSERT_EQ(gpuipc__rbuf_left(&r), 0);
  ASSERT_OK(gpuipc__rbuf_finish(&r, "t"));

  /* Extremes. */
  gpuipc__wbuf_init(&w, b, sizeof(b));
  gpuipc__put_u64(&w, UINT64_MAX);
  gpuipc__put_u32(&w, 0x80000000u);
  gpuipc__put_u16(&w, 0xffff);
  gpuipc__rbuf_init(&r, b, w.len);
  ASSERT_EQ_U(gpuipc__get_u64(&r), UINT64_MAX);
  ASSERT_EQ_U(gpuipc__get_u32(&r), 0x80000000u);
  ASSERT_EQ_U(gpuipc__get_u16(&r), 0xffff);
  ASSERT_OK(gpuipc__rbuf_finish(&r, "t"));
}

/* Every put that does not fit sets -ENOSPC, writes nothing, and sticks. */
static void test_put_overflow(void)
{
  static const size_t widths[] = {1, 2, 4, 8};
  for (size_t wi = 0; wi < 4; wi++) {
    for (size_t cap = 0; cap < 12; cap++) {
      uint8_t b[16];
      memset(b, 0xaa, sizeof(b));
      struct gpuipc__wbuf w;
      gpuipc__wbuf_init(&w, b, cap);
      size_t n = widths[wi], fits = cap / n;
      for (size_t k = 0; k < fits + 2; k++) {
        switch (n) {
        case 1: gpuipc__put_u8(&w, 0x11); break;
        case 2: gpuipc__put_u16(&w, 0x1111); break;
        case 4: gpuipc__put_u32(&w, 0x11111111u); break;
        default: gpuipc__put_u64(&w, 0x1111111111111111ull); break;
        }
      }
      ASSERT_EQ(w.err, -ENOSPC);
      ASSERT_EQ(w.len, fits * n);
      for (size_t i = 0; i < sizeof(b); i++)
        ASSERT_EQ(b[i], i < fits * n ? 0x11 : 0xaa);
      /* A later small put that would fit still does nothing. */
      gpuipc__put_bytes(&w, NULL, 0);
      ASSERT_EQ(w.len, fits * n);
    }
  }

  uint8_t b[8];
  memset(b, 0xaa, sizeof(b));
  struct gpuipc__wbuf w;
  gpuipc__wbuf_init(&w, b, 4);
  gpuipc__put_bytes(&w, "abcde", 5); /* all or nothing */
  ASSERT_EQ(w.err, -ENOSPC);
  ASSERT_EQ(w.len, 0);
  ASSERT_EQ(b[0], 0xaa);
  gpuipc__put_u8(&w, 1);
  ASSERT_EQ(w.len, 0);
  ASSERT_RC(gpuipc__wbuf_finish(&w, "encode_thing"), -ENOSPC);
  ASSERT_ERR_MENTIONS("encode_thing: ");
  ASSERT_ERR_MENTIONS("4 bytes");

  /* A NULL buffer has no room, whatever the cap says. */
  gpuipc__wbuf_init(&w, NULL, 100);
  ASSERT_EQ(w.cap, 0);
  gpuipc__put_u8(&w, 1);
  ASSERT_EQ(w.err, -ENOSPC);
}

static void test_put_str(void)
{
  uint8_t b[16];
  struct gpuipc__wbuf w;
  gpuipc__wbuf_init(&w, b, sizeof(b));
  gpuipc__put_str(&w, "");
  gpuipc__put_str(&w, "abc");
  ASSERT_EQ(w.err, 0);
  ASSERT_EQ(w.len, 7);
  ASSERT_TRUE(memcmp(b, "\0\0\3\0abc", 7) == 0);

  /* The length and the bytes go together or not at all. */
  memset(b, 0xaa, sizeof(b));
  gpuipc__wbuf_init(&w, b, 6);
  gpuipc__put_str(&w, "abcde");
  ASSERT_EQ(w.err, -ENOSPC);
  ASSERT_EQ(w.len, 0);
  ASSERT_EQ(b[0], 0xaa);

  gpuipc__wbuf_init(&w, b, sizeof(b));
  gpuipc__put_str(&w, NULL);
  ASSERT_EQ(w.err, -EINVAL);
  ASSERT_EQ(w.len, 0);
  ASSERT_RC(gpuipc__wbuf_finish(&w, "encode_name"), -EINVAL);
  ASSERT_ERR_MENTIONS("encode_name: ");
  ASSERT_ERR_MENTIONS("65535");

  /* 65535 bytes is the longest; 65536 is refused, not truncated. */
  size_t big = 70000;
  char *s = malloc(big + 1);
  uint8_t *out = malloc(big + 2);
  ASSERT_TRUE(s != NULL && out != NULL);
  memset(s, 'x', big);
  s[65535] = '\0';
  gpuipc__wbuf_init(&w, out, big + 2);
  gpuipc__put_str(&w, s);
  ASSERT_EQ(w.err, 0);
  ASSERT_EQ(w.len, 65537);
  ASSERT_EQ(out[0], 0xff);
  ASSERT_EQ(out[1], 0xff);
  struct gpuipc__rbuf r;
  char *back = malloc(65536);
  ASSERT_TRUE(back != NULL);
  gpuipc__rbuf_init(&r, out, w.len);
  gpuipc__get_str(&r, back, 65536);
  ASSERT_OK(gpuipc__rbuf_finish(&r, "t"));
  ASSERT_STREQ(back, s);

  s[65535] = 'x';
  s[65536] = '\0';
  gpuipc__wbuf_init(&w, out, big + 2);
  gpuipc__put_str(&w, s);
  ASSERT_EQ(w.err, -EINVAL);
  ASSERT_EQ(w.len, 0);
  s[big] = '\0'; /* longer still: strnlen must stop early, not wrap */
  gpuipc__wbuf_init(&w, out, big + 2);
  gpuipc__put_str(&w, s);
  ASSERT_EQ(w.err, -EINVAL);
  free(back);
  free(out);
  free(s);
}

/* Reads past the end set GPUIPC_E_PROTO, return 0, and stick. */
static void test_get_overrun(void)
{
  static const uint8_t src[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  for (size_t len = 0; len <= 8; len++) {
    struct gpuipc__rbuf r;
    gpuipc__rbuf_init(&r, src, len);
    uint64_t v = gpuipc__get_u64(&r);
    if (len == 8) {
      ASSERT_EQ_U(v, 0x0807060504030201ull);
      ASSERT_EQ(r.err, 0);
      continue;
    }
    ASSERT_EQ_U(v, 0);
    ASSERT_EQ(r.err, GPUIPC_E_PROTO);
    ASSERT_EQ(r.pos, 0);
    ASSERT_EQ(gpuipc__rbuf_left(&r), 0);
    /* Sticky: a get that would fit returns 0 too. */
    if (len >= 1)
      ASSERT_EQ(gpuipc__get_u8(&r), 0);
    ASSERT_EQ(gpuipc__get_u16(&r), 0);
    ASSERT_EQ(gpuipc__get_u32(&r), 0);
    ASSERT_EQ(r.pos, 0);
    ASSERT_RC(gpuipc__rbuf_finish(&r, "decode_thing"), GPUIPC_E_PROTO);
    ASSERT_ERR_MENTIONS("decode_thing: truncated at byte 0");
  }

  struct gpuipc__rbuf r;
  gpuipc__rbuf_init(&r, src, 8);
  ASSERT_EQ(gpuipc__get_u32(&r), 0x04030201u);
  ASSERT_EQ(gpuipc__get_u16(&r), 0x0605u);
  ASSERT_EQ(gpuipc__get_u32(&r), 0); /* 2 left, 4 wanted */
  ASSERT_EQ(r.err, GPUIPC_E_PROTO);
  ASSERT_EQ(r.err_pos, 6);
  uint8_t dst[4];
  memset(dst, 0xaa, sizeof(dst));
  gpuipc__get_bytes(&r, dst, 1); /* after an error: zero-filled */
  ASSERT_EQ(dst[0], 0);
  ASSERT_EQ(dst[1], 0xaa);
  ASSERT_RC(gpuipc__rbuf_finish(&r, "decode_thing"), GPUIPC_E_PROTO);
  ASSERT_ERR_MENTIONS("truncated at byte 6 of a 8-byte message");

  gpuipc__rbuf_init(&r, src, 8);
  memset(dst, 0xaa, sizeof(dst));
  (void)gpuipc__get_u32(&r);
  (void)gpuipc__get_u16(&r);
  gpuipc__get_bytes(&r, dst, 3); /* 2 left: nothing copied, zero-filled */
  ASSERT_EQ(r.err, GPUIPC_E_PROTO);
  ASSERT_EQ(dst[0], 0);
  ASSERT_EQ(dst[2], 0);
  ASSERT_EQ(dst[3], 0xaa);

  /* Trailing bytes: every get succeeded but not everything was read. */
  gpuipc__rbuf_init(&r, src, 8);
  (void)gpuipc__get_u32(&r);
  ASSERT_EQ(r.err, 0);
  ASSERT_RC(gpuipc__rbuf_finish(&r, "decode_thing"), GPUIPC_E_PROTO);
  ASSERT_ERR_MENTIONS("4 trailing bytes");

  gpuipc__rbuf_init(&r, NULL, 5);
  ASSERT_EQ(r.len, 0);
  ASSERT_EQ(gpuipc__get_u8(&r), 0);
  ASSERT_EQ(r.err, GPUIPC_E_PROTO);
  gpuipc__rbuf_init(&r, NULL, 0);
  ASSERT_OK(gpuipc__rbuf_finish(&r, "t"));
}

static void test_get_str(void)
{
  char dst[8];
  struct gpuipc__rbuf r;

  gpuipc__rbuf_init(&r, "\3\0abc\0\0", 7);
  gpuipc__get_str(&r, dst, sizeof(dst));
  ASSERT_STREQ(dst, "abc");
  gpuipc__get_str(&r, dst, sizeof(dst));
  ASSERT_STREQ(dst, "");
  ASSERT_OK(gpuipc__rbuf_finish(&r, "t"));

  /* Exactly cap - 1 bytes fit; cap bytes do not. */
  gpuipc__rbuf_init(&r, "\7\0abcdefg", 9);
  memset(dst, 'z', sizeof(dst));
  gpuipc__get_str(&r, dst, 8);
  ASSERT_STREQ(dst, "abcdefg");
  ASSERT_OK(gpuipc__rbuf_finish(&r, "t"));
  gpuipc__rbuf_init(&r, "\7\0abcdefg", 9);
  memset(dst, 'z', sizeof(dst));
  gpuipc__get_str(&r, dst, 7);
  ASSERT_STREQ(dst, "");
  ASSERT_EQ(dst[1], 'z'); /* nothing else written */
  ASSERT_EQ(r.err, GPUIPC_E_PROTO);
  ASSERT_RC(gpuipc__rbuf_finish(&r, "decode_name"), GPUIPC_E_PROTO);
  ASSERT_ERR_MENTIONS("decode_name: string too long at byte 0");

  /* A NUL inside is refused: "ab\0c" must not become "ab". */
  gpuipc__rbuf_init(&r, "\1\0x\4\0ab\0c", 10);
  gpuipc__get_str(&r, dst, sizeof(dst));
  ASSERT_STREQ(dst, "x");
  gpuipc__get_str(&r, dst, sizeof(dst));
  ASSERT_STREQ(dst, "");
  ASSERT_EQ(r.err, GPUIPC_E_PROTO);
  ASSERT_RC(gpuipc__rbuf_finish(&r, "t"), GPUIPC_E_PROTO);
  ASSERT_ERR_MENTIONS("string contains NUL at byte 3");

  /* Length says more than there is. */
  gpuipc__rbuf_init(&r, "\5\0abc", 5);
  gpuipc__get_str(&r, dst, sizeof(dst));
  ASSERT_STREQ(dst, "");
  ASSERT_RC(gpuipc__rbuf_finish(&r, "t"), GPUIPC_E_PROTO);
  ASSERT_ERR_MENTIONS("truncated string at byte 0");

  /* No room even for the NUL. */
  gpuipc__rbuf_init(&r, "\0\0", 2);
  gpuipc__get_str(&r, dst, 0);
  ASSERT_EQ(r.err, GPUIPC_E_PROTO);

  /* Half a length. */
  gpuipc__rbuf_init(&r, "\1", 1);
  gpuipc__get_str(&r, dst, sizeof(dst));
  ASSERT_STREQ(dst, "");
  ASSERT_EQ(r.err, GPUIPC_E_PROTO);
}

/* Random sequences of puts read back by the matching gets. */
static void test_random_round_trip(void)
{
  uint8_t buf[4096];
  uint64_t vals[256];
  int ops[256];
  char strs[256][40];
  for (int round = 0; round < 200; round++) {
    int n = (int)(rng() % 256);
    struct gpuipc__wbuf w;
    gpuipc__wbuf_init(&w, buf, sizeof(buf));
    for (int i = 0; i < n; i++) {
      ops[i] = (int)(rng() % 5);
      vals[i] = rng();
      switch (ops[i]) {
      case 0: gpuipc__put_u8(&w, (uint8_t)vals[i]); break;
      case 1: gpuipc__put_u16(&w, (uint16_t)vals[i]); break;
      case 2: gpuipc__put_u32(&w, (uint32_t)vals[i]); break;
      case 3: gpuipc__put_u64(&w, vals[i]); break;
      default: {
        size_t len = vals[i] % 39;
        for (size_t k = 0; k < len; k++)
          strs[i][k] = (char)('a' + (rng() % 26));
        strs[i][len] = '\0';
        gpuipc__put_str(&w, strs[i]);
      }
      }
    }
    ASSERT_EQ(w.err, 0);
    struct gpuipc__rbuf r;
    gpuipc__rbuf_init(&r, buf, w.len);
    for (int i = 0; i < n; i++) {
      char s[40];
      switch (ops[i]) {
      case 0: ASSERT_EQ_U(gpuipc__get_u8(&r), (uint8_t)vals[i]); break;
      case 1: ASSERT_EQ_U(gpuipc__get_u16(&r), (uint16_t)vals[i]); break;
      case 2: ASSERT_EQ_U(gpuipc__get_u32(&r), (uint32_t)vals[i]); break;
      case 3: ASSERT_EQ_U(gpuipc__get_u64(&r), vals[i]); break;
      default:
        gpuipc__get_str(&r, s, sizeof(s));
        ASSERT_STREQ(s, strs[i]);
      }
    }
    ASSERT_OK(gpuipc__rbuf_finish(&r, "t"));
    /* The same bytes cut short anywhere fail somewhere, never overrun. */
    if (w.len > 0) {
      gpuipc__rbuf_init(&r, buf, rng() % w.len);
      for (int i = 0; i < n; i++) {
        char s[40];
        switch (ops[i]) {
        case 0: (void)gpuipc__get_u8(&r); break;
        case 1: (void)gpuipc__get_u16(&r); break;
        case 2: (void)gpuipc__get_u32(&r); break;
        case 3: (void)gpuipc__get_u64(&r); break;
        default: gpuipc__get_str(&r, s, sizeof(s));
        }
      }
      ASSERT_RC(gpuipc__rbuf_finish(&r, "t"), GPUIPC_E_PROTO);
    }
  }
}

int main(void)
{
  test_crc32c();
  test_put_exact_bytes();
  test_put_overflow();
  test_put_str();
  test_get_overrun();
  test_get_str();
  test_random_round_trip();
  printf("codec: ok\n");
  return 0;
}
