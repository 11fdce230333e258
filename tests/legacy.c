/*
 * LEGACY buffers: cuMemAlloc in whole 2 MiB blocks of their own, shared by
 * cuIpcGetMemHandle between processes on one GPU and across two; a creator
 * that dies takes the memory with it and holders learn it as
 * GPUIPC_E_PEER_GONE.
 */
#include "gpu_test.h"

#include "mem/gpu.h"

#if GPUIPC_HAVE_CUDA

#define SIZE ((size_t)3 << 20) /* rounded up to 4 MiB */

/* The allocation behind @p must be exactly [p, p + size), block-aligned. */
static void expect_own_block(void *p, size_t size)
{
  struct gpuipc__ctx_saved saved;
  ASSERT_OK(gpuipc__ctx_enter(0, &saved));
  CUdeviceptr base = 0;
  size_t rsize = 0;
  ASSERT_OK(GPUIPC_CU(cuMemGetAddressRange, &base, &rsize,
                      (CUdeviceptr)(uintptr_t)p));
  gpuipc__ctx_leave(&saved);
  ASSERT_EQ_U(base, (uintptr_t)p);
  ASSERT_EQ_U(rsize, size);
  ASSERT_EQ_U(base % GPUIPC__LEGACY_BLOCK, 0);
}

static void check_local(void)
{
  gpuipc_buf_t *small, *big;
  ASSERT_OK(gpuipc_buf_alloc(1000, GPUIPC_KIND_LEGACY, 0, 0, &small));
  ASSERT_OK(gpuipc_buf_alloc(SIZE, GPUIPC_KIND_LEGACY, 0, 0, &big));
  ASSERT_EQ(gpuipc_buf_size(small), 1000);
  expect_own_block(gpuipc_buf_ptr(small), GPUIPC__LEGACY_BLOCK);
  expect_own_block(gpuipc_buf_ptr(big), 2 * GPUIPC__LEGACY_BLOCK);

  /* A plain small allocation made now lands outside both blocks. */
  struct gpuipc__ctx_saved saved;
  ASSERT_OK(gpuipc__ctx_enter(0, &saved));
  CUdeviceptr plain = 0;
  ASSERT_OK(GPUIPC_CU(cuMemAlloc, &plain, 1000));
  gpuipc__ctx_leave(&saved);
  uintptr_t s = (uintptr_t)gpuipc_buf_ptr(small);
  uintptr_t g = (uintptr_t)gpuipc_buf_ptr(big);
  ASSERT_TRUE(plain < s || plain >= s + GPUIPC__LEGACY_BLOCK);
  ASSERT_TRUE(plain < g || plain >= g + 2 * GPUIPC__LEGACY_BLOCK);
  printf("LEGACY buffers at 0x%lx (+2 MiB) and 0x%lx (+4 MiB), a 1000-byte "
         "cuMemAlloc at 0x%llx: no block shared\n",
         (unsigned long)s, (unsigned long)g, (unsigned long long)plain);
  ASSERT_OK(gpuipc__ctx_enter(0, &saved));
  ASSERT_OK(GPUIPC_CU(cuMemFree, plain));
  gpuipc__ctx_leave(&saved);

  gpuipc_handle_t h;
  ASSERT_OK(gpuipc_buf_export(small, &h));
  ASSERT_EQ(h.kind, GPUIPC_KIND_LEGACY);
  ASSERT_EQ(h.type, GPUIPC_HT_LEGACY);
  ASSERT_EQ(h.fd, -1);
  ASSERT_EQ_U(h.alloc_size, GPUIPC__LEGACY_BLOCK);
  gpuipc_buf_t *self;
  ASSERT_OK(gpuipc_buf_import(&h, -1, 0, &self));
  ASSERT_TRUE(self == small);
  ASSERT_OK(gpuipc_buf_release(self));
  ASSERT_OK(gpuipc_buf_alive(small));
  ASSERT_RC(gpuipc_buf_alive(NULL), -EINVAL);

  ASSERT_OK(gpuipc_buf_release(small));
  ASSERT_OK(gpuipc_buf_release(big));
}

/* The creator exits before anyone imports: importing says PEER_GONE. */
static void check_import_after_death(int dev)
{
  printf("--- legacy: creator on GPU %d exits before the import\n", dev);
  gpuipc_handle_t h;
  gpu_export_and_exit("legacy", dev, SIZE, 400, &h);
  ASSERT_EQ(h.fd, -1);
  const char *const extra[] = {"--expect-gone", NULL};
  int sock;
  pid_t imp = gpu_start_importer(-1, extra, &sock);
  proto_send_handle(sock, &h, 400, 0);
  ASSERT_EQ_U(proto_recv_word(sock, TAG_GONE), 1);
  ASSERT_EQ(test_wait(imp, GPU_PROC_TIMEOUT_MS), 0);
  close(sock);
  /* And here, where nothing was mapped yet. */
  gpuipc_buf_t *b = NULL;
  ASSERT_RC(gpuipc_buf_import(&h, -1, 0, &b), GPUIPC_E_PEER_GONE);
  ASSERT_ERR_MENTIONS("exited");
}

int main(void)
{
  test_require_gpus(1);
  gpu_require_helper("gpu_peer");
  int n = gpuipc_device_count();
  check_local();

  gpu_pair("legacy", 0, 0, SIZE, 200, "verify", 1, NULL, NULL);
  check_import_after_death(0);
  /* A holder whose creator dies learns it from gpuipc_buf_alive. */
  const char *const hold[] = {"--hold-until-gone", NULL};
  gpu_pair("legacy", 0, 0, SIZE, 210, "verify-exit", 1, NULL, hold);
  /*
   * A named segment: the creator releases it and keeps the memory for
   * those who open it afterwards; it frees it after unlink and the last
   * release, or takes it along when it exits (holders: PEER_GONE).
   */
  if (n < 2) {
    gpu_segment_share("legacyseg", "legacy", 0, 0, 270, false);
    gpu_segment_share("legacyseg", "legacy", 0, 0, 275, true);
    printf("NOTE: one GPU: the cross-GPU cases need two\n");
    return 0;
  }
  gpu_pair("legacy", 1, 1, SIZE, 220, "verify", 1, NULL, NULL);
  gpu_pair("legacy", 0, 1, SIZE, 230, "verify", 1, NULL, NULL);
  gpu_pair("legacy", 1, 0, SIZE, 240, "verify", 1, NULL, NULL);
  const char *const expect1[] = {"--expect-ordinal", "1", NULL};
  gpu_pair("legacy", 0, -1, SIZE, 250, "verify", 1, "1,0", expect1);
  gpu_pair("legacy", 1, 0, SIZE, 260, "verify-exit", 1, NULL, hold);
  /* Named segments, the creator on GPU 0, the others on GPU 1 too. */
  gpu_segment_share("legacyseg", "legacy", 0, 1, 280, false);
  gpu_segment_share("legacyseg", "legacy", 0, 1, 290, true);
  return 0;
}

#else
GPU_TEST_NEEDS_CUDA_HEADER()
#endif
