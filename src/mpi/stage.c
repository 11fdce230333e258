/*
 * Copies between host and GPU memory for the MPI path of channels: through
 * libgpuipc (gpuipc_memcpy, in the device's primary context), so that the
 * driver is loaded once, by the library.
 */

#include "mpi/mpi_int.h"

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

int gpuipc__mpi_cuda_aware(void)
{
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return 0;
#endif
}

int gpuipc__mpi_copy(int device, void *dst, const void *src, size_t n,
                     void *stream)
{
  int rc = gpuipc_memcpy(dst, src, n, device, stream);
  return rc != 0 ? gpuipc__mpi_fail_gpuipc(rc) : 0;
}

int gpuipc__mpi_stream_sync(int device, void *stream)
{
  int rc = gpuipc_stream_sync(device, stream);
  return rc != 0 ? gpuipc__mpi_fail_gpuipc(rc) : 0;
}
