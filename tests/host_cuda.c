/*
 * HOST buffers on a machine with a GPU are registered with CUDA: the device
 * reads them through their mapped device pointer. A buffer mapped while
 * the process has no CUDA context makes none (device 0's primary context
 * stays inactive) and is registered when gpuipc first needs it on the GPU
 * (gpuipc__host_pin); one mapped once the process has a context is
 * registered at once. For each, we fill it on the CPU, copy it with
 * cuMemcpy from its device-mapped address into device memory and back, and
 * compare every byte; then the other way round.
 */
#include "test.h"

#include "cuda/cuda.h"
#include "mem/mem.h"

#if GPUIPC_HAVE_CUDA
static int primary_active(void)
{
  unsigned flags;
  int active = -1;
  ASSERT_OK(GPUIPC_CU(cuDevicePrimaryCtxGetState, gpuipc__dev_get(0)->cu_dev,
                      &flags, &active));
  return active;
}

static void roundtrip(size_t size, bool before_context)
{
  gpuipc_buf_t *b;
  struct gpuipc__ctx_saved saved;
  if (before_context) {
    ASSERT_EQ(primary_active(), 0);
    ASSERT_OK(gpuipc_buf_alloc(size, GPUIPC_KIND_HOST, -1, 0, &b));
    ASSERT_EQ(primary_active(), 0); /* the HOST buffer made no context */
    ASSERT_OK(gpuipc__ctx_enter(0, &saved));
    ASSERT_OK(gpuipc__host_pin(b, 0));
  } else {
    ASSERT_OK(gpuipc__ctx_enter(0, &saved));
    ASSERT_OK(gpuipc_buf_alloc(size, GPUIPC_KIND_HOST, -1, 0, &b));
  }
  uint8_t *p = gpuipc_buf_ptr(b);
  test_fill(p, size, 11);

  CUdeviceptr mapped, dev;
  /* Fails with CUDA_ERROR_INVALID_VALUE unless the memory is registered. */
  ASSERT_OK(GPUIPC_CU(cuMemHostGetDevicePointer, &mapped, p, 0));
  ASSERT_OK(GPUIPC_CU(cuMemAlloc, &dev, size));
  ASSERT_OK(GPUIPC_CU(cuMemcpy, dev, mapped, size));
  uint8_t *back = malloc(size);
  ASSERT_TRUE(back != NULL);
  ASSERT_OK(GPUIPC_CU(cuMemcpyDtoH, back, dev, size));
  ASSERT_EQ(test_check(back, size, 11), (size_t)-1);

  /* Device to the HOST buffer: the CPU sees what the GPU wrote. */
  test_fill(back, size, 12);
  ASSERT_OK(GPUIPC_CU(cuMemcpyHtoD, dev, back, size));
  ASSERT_OK(GPUIPC_CU(cuMemcpy, mapped, dev, size));
  ASSERT_OK(GPUIPC_CU(cuCtxSynchronize));
  ASSERT_EQ(test_check(p, size, 12), (size_t)-1);

  free(back);
  ASSERT_OK(GPUIPC_CU(cuMemFree, dev));
  gpuipc__ctx_leave(&saved);
  ASSERT_OK(gpuipc_buf_release(b));
}
#endif

int main(void)
{
#if GPUIPC_HAVE_CUDA
  test_require_gpus(1);
  roundtrip(4096, true); /* first: no context yet */
  roundtrip(4096, false);
  roundtrip((size_t)64 << 20, false);
  printf("host_cuda: ok\n");
  return 0;
#else
  SKIP("built without CUDA headers");
#endif
}
