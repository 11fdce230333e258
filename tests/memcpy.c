/* gpuipc_memcpy, gpuipc_memcpy_batch, gpuipc__memcpy_async and
 * gpuipc__stream_sync: argument checks and host copies everywhere; host
 * <-> GPU buffer round trips where a GPU is present (also run on the fake
 * driver, memcpy_fake, whose streams do their copies later). */
#include "core/private.h"
#include "test.h"

static void host_only(void)
{
  uint8_t a[4096], b[4096];
  test_fill(a, sizeof(a), 21);
  memset(b, 0, sizeof(b));
  ASSERT_OK(gpuipc_memcpy(b, a, sizeof(a), -1, NULL));
  ASSERT_EQ(test_check(b, sizeof(b), 21), (size_t)-1);
  ASSERT_OK(gpuipc_memcpy(NULL, NULL, 0, -1, NULL)); /* nothing to copy */
  ASSERT_RC(gpuipc_memcpy(NULL, a, 1, -1, NULL), -EINVAL);
  ASSERT_RC(gpuipc_memcpy(b, NULL, 1, -1, NULL), -EINVAL);
  /* The queued form: a plain copy, done on return, with device -1. */
  memset(b, 0, sizeof(b));
  ASSERT_OK(gpuipc__memcpy_async(b, a, sizeof(a), -1, NULL));
  ASSERT_EQ(test_check(b, sizeof(b), 21), (size_t)-1);
  ASSERT_OK(gpuipc__memcpy_async(NULL, NULL, 0, -1, NULL));
  ASSERT_RC(gpuipc__memcpy_async(NULL, a, 1, -1, NULL), -EINVAL);
  ASSERT_RC(gpuipc__memcpy_async(b, NULL, 1, -1, NULL), -EINVAL);
  if (gpuipc_driver_status(NULL) != 0) {
    int rc = gpuipc_memcpy(b, a, 16, 0, NULL);
    ASSERT_TRUE(rc == GPUIPC_E_NODRIVER || rc == GPUIPC_E_NODEVICE);
    rc = gpuipc__memcpy_async(b, a, 16, 0, NULL);
    ASSERT_TRUE(rc == GPUIPC_E_NODRIVER || rc == GPUIPC_E_NODEVICE);
    rc = gpuipc__stream_sync(0, NULL);
    ASSERT_TRUE(rc == GPUIPC_E_NODRIVER || rc == GPUIPC_E_NODEVICE);
  } else {
    ASSERT_RC(gpuipc_memcpy(b, a, 16, gpuipc_device_count(), NULL), -EINVAL);
    ASSERT_RC(gpuipc__memcpy_async(b, a, 16, gpuipc_device_count(), NULL),
              -EINVAL);
  }
}

/* gpuipc_memcpy_batch on the host: copies in order, zero-length ones
 * with NULL pointers, and bad arguments refused before anything is
 * copied. */
static void batch_host(void)
{
  uint8_t a[4096], b[4096];
  test_fill(a, sizeof(a), 23);
  memset(b, 0, sizeof(b));
  /* Two pieces, an empty copy with NULL pointers, and [100, 150) written
   * twice: from junk, then from a; in order, a's bytes win. */
  uint8_t junk[50];
  memset(junk, 0xee, sizeof(junk));
  void *dst[5] = {b + 3000, NULL, b + 100, b + 1000, b + 100};
  const void *src[5] = {a + 3000, NULL, junk, a + 1000, a + 100};
  size_t n[5] = {1096, 0, 50, 2000, 50};
  ASSERT_OK(gpuipc_memcpy_batch(dst, src, n, 5, -1, NULL, 0));
  memcpy(b, a, 100); /* the bytes no copy wrote */
  memcpy(b + 150, a + 150, 850);
  ASSERT_EQ(test_check(b, sizeof(b), 23), (size_t)-1);
  ASSERT_OK(gpuipc_memcpy_batch(NULL, NULL, NULL, 0, -1, NULL, 0));
  /* Copy 2 is bad: copy 0 must not have happened either. */
  memset(b, 0, sizeof(b));
  void *bd[3] = {b, b + 10, NULL};
  const void *bs[3] = {a, a + 10, a + 20};
  size_t bn[3] = {10, 10, 10};
  ASSERT_RC(gpuipc_memcpy_batch(bd, bs, bn, 3, -1, NULL, 0), -EINVAL);
  ASSERT_TRUE(strstr(gpuipc_last_error(), "copy 2 of 3") != NULL);
  ASSERT_EQ(b[0], 0);
  ASSERT_RC(gpuipc_memcpy_batch(NULL, bs, bn, 3, -1, NULL, 0), -EINVAL);
  ASSERT_RC(gpuipc_memcpy_batch(bd, NULL, bn, 3, -1, NULL, 0), -EINVAL);
  ASSERT_RC(gpuipc_memcpy_batch(bd, bs, NULL, 3, -1, NULL, 0), -EINVAL);
  bd[2] = b + 20;
  ASSERT_RC(gpuipc_memcpy_batch(bd, bs, bn, 3, -1, NULL, 0x2), -EINVAL);
  ASSERT_EQ(b[0], 0);
  if (gpuipc_driver_status(NULL) != 0) {
    int rc = gpuipc_memcpy_batch(bd, bs, bn, 3, 0, NULL, 0);
    ASSERT_TRUE(rc == GPUIPC_E_NODRIVER || rc == GPUIPC_E_NODEVICE);
  } else {
    ASSERT_RC(gpuipc_memcpy_batch(bd, bs, bn, 3, gpuipc_device_count(),
                                  NULL, 0), -EINVAL);
  }
  ASSERT_EQ(b[0], 0);
}

/* Host -> every GPU kind -> host, through gpuipc_memcpy alone. */
static void gpu_round_trips(void)
{
  const gpuipc_kind_t kinds[] = {GPUIPC_KIND_VMM, GPUIPC_KIND_LEGACY,
                                 GPUIPC_KIND_POOL};
  const size_t size = (3u << 20) + 5;
  uint8_t *src = malloc(size), *back = malloc(size);
  ASSERT_TRUE(src != NULL && back != NULL);
  bool fake = getenv("GPUIPC_CUDA_LIB") != NULL;
  int done = 0;
  for (int d = 0; d < gpuipc_device_count(); d++) {
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
      gpuipc_buf_t *b;
      int arc = gpuipc_buf_alloc(size, kinds[k], d, 0, &b);
      if (arc != 0 && fake) /* the fake driver has LEGACY memory only */
        continue;
      ASSERT_OK(arc);
      test_fill(src, size, 30 + k);
      memset(back, 0, size);
      ASSERT_OK(gpuipc_memcpy(gpuipc_buf_ptr(b), src, size, d, NULL));
      ASSERT_OK(gpuipc_memcpy(back, gpuipc_buf_ptr(b), size, d, NULL));
      ASSERT_OK(gpuipc__stream_sync(d, NULL));
      ASSERT_EQ(test_check(back, size, 30 + k), (size_t)-1);
      /* Queued in halves, then one wait. */
      memset(back, 0, size);
      uint8_t *g = gpuipc_buf_ptr(b);
      size_t h = size / 2;
      ASSERT_OK(gpuipc__memcpy_async(back, g, h, d, NULL));
      ASSERT_OK(gpuipc__memcpy_async(back + h, g + h, size - h, d, NULL));
      ASSERT_OK(gpuipc__stream_sync(d, NULL));
      ASSERT_EQ(test_check(back, size, 30 + k), (size_t)-1);
      /* A batch each way: three pieces in, back in two; queued, so the
       * bytes are there only after the stream's sync. */
      void *in_d[3] = {g + h, g, g + 4096};
      const void *in_s[3] = {src + h, src, src + 4096};
      size_t in_n[3] = {size - h, 4096, h - 4096};
      ASSERT_OK(gpuipc_memcpy(g, back, 1, d, NULL)); /* garbage first */
      memset(back, 0, size);
      ASSERT_OK(gpuipc_memcpy(g + size - 1, back, 1, d, NULL));
      ASSERT_OK(gpuipc_memcpy_batch(in_d, in_s, in_n, 3, d, NULL, 0));
      void *out_d[2] = {back + h, back};
      const void *out_s[2] = {g + h, g};
      size_t out_n[2] = {size - h, h};
      ASSERT_OK(gpuipc_memcpy_batch(out_d, out_s, out_n, 2, d, NULL, 0));
      ASSERT_OK(gpuipc__stream_sync(d, NULL));
      ASSERT_EQ(test_check(back, size, 30 + k), (size_t)-1);
      /* Device to device, flagged so: into a second buffer, in halves. */
      gpuipc_buf_t *b2;
      ASSERT_OK(gpuipc_buf_alloc(size, kinds[k], d, 0, &b2));
      uint8_t *g2 = gpuipc_buf_ptr(b2);
      void *dd[2] = {g2 + h, g2};
      const void *ds[2] = {g + h, g};
      size_t dn[2] = {size - h, h};
      ASSERT_OK(gpuipc_memcpy_batch(dd, ds, dn, 2, d, NULL,
                                    GPUIPC_MEMCPY_DEVICE));
      memset(back, 0, size);
      ASSERT_OK(gpuipc_memcpy(back, g2, size, d, NULL));
      ASSERT_EQ(test_check(back, size, 30 + k), (size_t)-1);
      ASSERT_OK(gpuipc_buf_release(b2));
      ASSERT_OK(gpuipc_buf_release(b));
      done++;
    }
  }
  ASSERT_TRUE(done > 0);
  free(src);
  free(back);
}

int main(void)
{
  host_only();
  batch_host();
  if (gpuipc_driver_status(NULL) != 0 || gpuipc_device_count() < 1) {
    printf("memcpy: host copies ok; GPU round trips need a GPU (%s)\n",
           gpuipc_last_error());
    return 0;
  }
  gpu_round_trips();
  printf("memcpy: ok\n");
  return 0;
}
