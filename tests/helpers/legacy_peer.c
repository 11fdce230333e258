/*
 * The exporter of tests/legacy_opens.c, on the fake CUDA driver:
 *   legacy_peer FD N : allocate N LEGACY buffers of 4 KiB on device 0,
 *       buffer i holding pattern i + 1, send their N packed handles on
 *       socket FD (a message each), then wait for "bye" and release them.
 * Exit status 0 on success; anything else names the failed step.
 */
#include "test.h"

#include "cuda/cuda.h"
#include "os/os.h"

#include <stdlib.h>

#if GPUIPC_HAVE_CUDA

#define SIZE 4096
#define TIMEOUT_MS 60000

int main(int argc, char **argv)
{
  if (argc != 3)
    TFAIL("usage: legacy_peer FD N");
  int sock = atoi(argv[1]), n = atoi(argv[2]);
  gpuipc_buf_t **bufs = calloc((size_t)n, sizeof(*bufs));
  ASSERT_TRUE(bufs != NULL);
  uint8_t bytes[SIZE];
  for (int i = 0; i < n; i++) {
    ASSERT_OK(gpuipc_buf_alloc(SIZE, GPUIPC_KIND_LEGACY, 0, 0, &bufs[i]));
    test_fill(bytes, SIZE, (uint64_t)i + 1);
    struct gpuipc__ctx_saved saved;
    ASSERT_OK(gpuipc__ctx_enter(0, &saved));
    ASSERT_OK(GPUIPC_CU(cuMemcpyHtoD,
                        (CUdeviceptr)(uintptr_t)gpuipc_buf_ptr(bufs[i]),
                        bytes, SIZE));
    gpuipc__ctx_leave(&saved);
    gpuipc_handle_t h;
    ASSERT_OK(gpuipc_buf_export(bufs[i], &h));
    uint8_t packed[GPUIPC_HANDLE_PACKED_SIZE];
    ASSERT_EQ(gpuipc_handle_pack(&h, packed, sizeof(packed)),
              sizeof(packed));
    ASSERT_OK(gpuipc__sock_send(sock, packed, sizeof(packed), NULL, 0,
                                TIMEOUT_MS));
  }
  char bye[8];
  ASSERT_EQ(gpuipc__sock_recv(sock, bye, sizeof(bye), NULL, NULL, TIMEOUT_MS),
            3);
  for (int i = 0; i < n; i++)
    ASSERT_OK(gpuipc_buf_release(bufs[i]));
  free(bufs);
  return 0;
}

#else
int main(void)
{
  SKIP("built without the CUDA headers");
}
#endif
