/*
 * Copies between host and GPU memory for the MPI path of channels: through
 * libgpuipc (gpuipc_memcpy, in the device's primary context), so that the
 * driver is loaded once, by the library. The chunk size setting. And the
 * events and pinned buffers the channel's staged chunks use.
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
  int rc = gpuipc__memcpy_async(dst, src, n, device, stream);
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
  int rc = gpuipc__stream_sync(device, stream);
  return rc != 0 ? gpuipc__mpi_fail_gpuipc(rc) : 0;
}

/* ---- staging chunks of the MPI channel -----------------------------------*/

void gpuipc__mpi_ev_free(gpuipc_event_t **ev, int *ev_dev)
{
  for (int i = 0; i < NEV; i++) {
    if (ev[i] != NULL)
      gpuipc_event_release(ev[i]);
    ev[i] = NULL;
  }
  *ev_dev = -1;
}

void gpuipc__mpi_ev_fit(gpuipc_event_t **ev, int *ev_dev, int dev)
{
  if (*ev_dev == dev)
    return;
  gpuipc__mpi_ev_free(ev, ev_dev);
  *ev_dev = dev;
  for (int i = 0; i < NEV; i++) {
    if (gpuipc_event_create(dev, 0, &ev[i]) != 0) {
      gpuipc__mpi_ev_free(ev, ev_dev);
      *ev_dev = dev;
      return;
    }
  }
}

int gpuipc__mpi_stage_copy(int dev, void *to, const void *from, uint64_t len,
                           void *stream, gpuipc_event_t *ev)
{
  if (ev == NULL)
    return gpuipc__mpi_copy(dev, to, from, len, stream);
  int rc = gpuipc__mpi_copy_async(dev, to, from, len, stream);
  if (rc == 0) {
    rc = gpuipc_event_record(ev, stream);
    if (rc != 0)
      rc = gpuipc__mpi_fail_gpuipc(rc);
  }
  return rc;
}

int gpuipc__mpi_stage_fit(gpuipc_buf_t **buf, uint64_t n)
{
  if (*buf != NULL && gpuipc_buf_size(*buf) >= n)
    return 0;
  gpuipc_buf_t *b;
  int rc = gpuipc_buf_alloc(n, GPUIPC_KIND_HOST, -1, 0, &b);
  if (rc != 0)
    return gpuipc__mpi_fail_gpuipc(rc);
  if (*buf != NULL)
    gpuipc_buf_release(*buf);
  *buf = b;
  return 0;
}
