/* gpuipc_memcpy, gpuipc__memcpy_async and gpuipc__stream_sync: argument
 * checks and host copies everywhere; host <-> GPU buffer round trips where
 * a GPU is present. */
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

/* Host -> every GPU kind -> host, through gpuipc_memcpy alone. */
static void gpu_round_trips(void)
{
  const gpuipc_kind_t kinds[] = {GPUIPC_KIND_VMM, GPUIPC_KIND_LEGACY,
                                 GPUIPC_KIND_POOL};
  const size_t size = (3u << 20) + 5;
  uint8_t *src = malloc(size), *back = malloc(size);
  ASSERT_TRUE(src != NULL && back != NULL);
  for (int d = 0; d < gpuipc_device_count(); d++) {
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
      gpuipc_buf_t *b;
      ASSERT_OK(gpuipc_buf_alloc(size, kinds[k], d, 0, &b));
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
      ASSERT_OK(gpuipc_buf_release(b));
    }
  }
  free(src);
  free(back);
}

int main(void)
{
  host_only();
  if (gpuipc_driver_status(NULL) != 0 || gpuipc_device_count() < 1) {
    printf("memcpy: host copies ok; GPU round trips need a GPU (%s)\n",
           gpuipc_last_error());
    return 0;
  }
  gpu_round_trips();
  printf("memcpy: ok\n");
  return 0;
}
