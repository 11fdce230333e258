/*
 * POOL buffers: allocations from a per-device shareable memory pool, the
 * pool imported once per exporter however many of its buffers arrive, on
 * one GPU and across two.
 */
#include "gpu_test.h"

#include "mem/gpu.h"

#include <fcntl.h>

#if GPUIPC_HAVE_CUDA

#define SIZE ((size_t)3 << 20)

static void check_local(void)
{
  gpuipc_buf_t *a, *b;
  ASSERT_OK(gpuipc_buf_alloc(1000, GPUIPC_KIND_POOL, 0, 0, &a));
  ASSERT_OK(gpuipc_buf_alloc(1000, GPUIPC_KIND_POOL, 0, 0, &b));
  ASSERT_TRUE(gpuipc_buf_ptr(a) != gpuipc_buf_ptr(b));
  gpu_fill_host(0, gpuipc_buf_ptr(a), 1000, 11);
  gpu_fill_host(0, gpuipc_buf_ptr(b), 1000, 12);
  gpu_expect(0, gpuipc_buf_ptr(a), 1000, 11);

  gpuipc_handle_t ha, hb;
  ASSERT_OK(gpuipc_buf_export(a, &ha));
  ASSERT_OK(gpuipc_buf_export(b, &hb));
  ASSERT_EQ(ha.kind, GPUIPC_KIND_POOL);
  ASSERT_EQ(ha.type, GPUIPC_HT_POOL);
  ASSERT_GE(ha.fd, 0);
  ASSERT_TRUE(fcntl(ha.fd, F_GETFD) & FD_CLOEXEC);
  /* One pool: the export data differ, the pool behind the fds is one. */
  ASSERT_TRUE(memcmp(ha.bytes, hb.bytes, sizeof(ha.bytes)) != 0);
  gpuipc_buf_t *self;
  ASSERT_OK(gpuipc_buf_import(&ha, -1, 0, &self));
  ASSERT_TRUE(self == a);
  ASSERT_OK(gpuipc_buf_release(self));
  uint64_t imported = 0, live = 0;
  gpuipc__pool_stats(&imported, &live);
  ASSERT_EQ_U(imported, 0);
  close(ha.fd);
  close(hb.fd);
  ASSERT_OK(gpuipc_buf_release(a));
  ASSERT_OK(gpuipc_buf_release(b));
}

int main(void)
{
  test_require_gpus(1);
  gpu_require_helper("gpu_peer");
  if (gpuipc_kind_available(GPUIPC_KIND_POOL) != 0)
    SKIP("POOL kind unavailable: %s", gpuipc_last_error());
  int n = gpuipc_device_count();
  check_local();

  /* Three buffers each time: the importer must import the pool once. */
  gpu_pair("pool", 0, 0, SIZE, 500, "verify", 3, NULL, NULL);
  if (n < 2) {
    printf("NOTE: one GPU: the cross-GPU cases need two\n");
    return 0;
  }
  gpu_pair("pool", 1, 1, SIZE, 510, "verify", 3, NULL, NULL);
  gpu_pair("pool", 0, 1, SIZE, 520, "verify", 3, NULL, NULL);
  gpu_pair("pool", 1, 0, SIZE, 530, "verify", 3, NULL, NULL);
  const char *const expect1[] = {"--expect-ordinal", "1", NULL};
  gpu_pair("pool", 0, -1, SIZE, 540, "verify", 3, "1,0", expect1);
  return 0;
}

#else
GPU_TEST_NEEDS_CUDA_HEADER()
#endif
