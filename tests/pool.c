/*
 * POOL buffers: allocations from a per-device shareable memory pool, the
 * pool imported once per exporter however many of its buffers arrive, on
 * one GPU and across two; POOL segments, whose creator keeps the
 * allocation until every importer let go, read from the other GPU through
 * the driver by two importing processes.
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

/*
 * One process opens a POOL segment for GPU 0, then again for GPU 1: the
 * second open is the same buffer (the import cache), and GPU 1 must reach
 * it too -- the cached hit is granted access from GPU 1.
 */
static void check_cached_other_device(void)
{
  printf("--- pool: one import used from GPU 0, then opened for GPU 1\n");
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("poolcache", NULL, &dom));
  struct peer c;
  peer_start(&c);
  PEER_OK(&c, "join poolcache");
  PEER_OK(&c, "gopen P 1000000 c pool 0");
  PEER_OK(&c, "gfill P 580");
  gpuipc_buf_t *b0, *b1;
  ASSERT_OK(test_seg_open(dom, "P", 0, 0, 0, &b0));
  ASSERT_EQ(gpuipc_buf_device(b0), 0);
  gpu_expect(0, gpuipc_buf_ptr(b0), 1000000, 580);
  ASSERT_OK(test_seg_open(dom, "P", 0, 1, 0, &b1));
  ASSERT_TRUE(b1 == b0);
  ASSERT_EQ(gpuipc_buf_device(b1), 0); /* the first mapping's device */
  gpu_expect(1, gpuipc_buf_ptr(b1), 1000000, 580);
  ASSERT_OK(gpuipc_buf_release(b1));
  ASSERT_OK(gpuipc_buf_release(b0));
  ASSERT_OK(gpuipc_segment_unlink(dom, "P"));
  PEER_OK(&c, "release P");
  PEER_EXPECT(&c, "ok 0 0", "waitlive 0 10000");
  peer_finish(&c);
  ASSERT_OK(gpuipc_domain_leave(dom));
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
    gpu_segment_share("poolseg", "pool", 0, 0, 550, false);
    printf("NOTE: one GPU: the cross-GPU cases need two\n");
    return 0;
  }
  /*
   * umpire_mpi's `node pool`: the creator on GPU 0 releases its segment at
   * once; two processes on GPU 1 (and one on GPU 0) open it afterwards and
   * copy from it with cuMemcpyDtoH in GPU 1's primary context. The
   * allocation must outlive the creator's release until every importer has
   * freed its import (the driver's rule), and the pool must be reachable
   * from GPU 1 in each importer.
   */
  gpu_segment_share("poolseg", "pool", 0, 1, 560, false);
  gpu_segment_share("poolseg", "pool", 1, 0, 570, false);
  check_cached_other_device();
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
