/*
 * Copies between host and GPU memory for the MPI path of channels: through
 * libgpuipc (gpuipc_memcpy, in the device's primary context), so that the
 * driver is loaded once, by the library. And the chunk size setting.
 */

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/mpi_int.h"

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

int gpuipc__mpi_cuda_aware(bool *aware)
{
  const char *s = gpuipc__mpi_setting("GPUIPC_MPI_CUDA_AWARE");
  if (*s == '\0' || strcmp(s, "auto") == 0) {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
    *aware = MPIX_Query_cuda_support() == 1;
#else
    *aware = false;
#endif
    return 0;
  }
  if (strcmp(s, "0") == 0 || strcmp(s, "1") == 0) {
    *aware = s[0] == '1';
    return 0;
  }
  return gpuipc__mpi_fail(-EINVAL, "GPUIPC_MPI_CUDA_AWARE=\"%s\": must be "
                          "auto, 0 or 1", s);
}

int gpuipc__mpi_copy_async(int device, void *dst, const void *src, size_t n,
                           void *stream)
{
  int rc = gpuipc_memcpy_async(dst, src, n, device, stream);
  return rc != 0 ? gpuipc__mpi_fail_gpuipc(rc) : 0;
}

int gpuipc__mpi_copy(int device, void *dst, const void *src, size_t n,
                     void *stream)
{
  int rc = gpuipc_memcpy(dst, src, n, device, stream);
  return rc != 0 ? gpuipc__mpi_fail_gpuipc(rc) : 0;
}

int gpuipc__mpi_chunk_setting(unsigned *shift)
{
  const char *s = gpuipc__mpi_setting("GPUIPC_MPI_CHUNK_KB");
  if (*s == '\0') {
    *shift = 0;
    return 0;
  }
  char *end;
  errno = 0;
  unsigned long kb = strtoul(s, &end, 10);
  if (errno != 0 || *end != '\0' || *s < '0' || *s > '9' ||
      (kb != 0 && (kb < 4 || kb > 1048576 || (kb & (kb - 1)) != 0)))
    return gpuipc__mpi_fail(-EINVAL, "GPUIPC_MPI_CHUNK_KB=\"%s\": must be a "
                            "power of two from 4 to 1048576 (KiB), or 0 "
                            "for the built-in sizes", s);
  unsigned sh = 0;
  while (kb != 0 && ((unsigned long)1 << sh) < kb * 1024)
    sh++;
  *shift = sh;
  return 0;
}

int gpuipc__mpi_stream_sync(int device, void *stream)
{
  int rc = gpuipc_stream_sync(device, stream);
  return rc != 0 ? gpuipc__mpi_fail_gpuipc(rc) : 0;
}
