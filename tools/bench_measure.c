/*
 * gpuipc bench, measuring (cmd_bench.c runs the measurements; bench_report.c
 * prints them): the clock and statistics, and the driver for streams,
 * fills, checks and the baselines -- cuMemcpyAsync on one GPU,
 * cuMemcpyPeerAsync between two, memcpy on the host -- run in the same
 * process on the same buffers. The driver is the library's loader
 * (src/cuda), the one reason this command reaches inside the library.
 */
#include "bench.h"
#include "cuda/cuda.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

double bench_now_us(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Sorts @v; its median and 99th percentile. */
void bench_stats(double *v, int n, double *median, double *p99)
{
  qsort(v, (size_t)n, sizeof(*v), cmp_double);
  *median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  int k = (99 * n + 99) / 100 - 1; /* ceil(0.99 n) - 1 */
  *p99 = v[k < 0 ? 0 : k];
}

/* The smallest and largest of @n values. */
void bench_span(const double *v, int n, double *lo, double *hi)
{
  *lo = *hi = n > 0 ? v[0] : 0;
  for (int i = 1; i < n; i++) {
    *lo = v[i] < *lo ? v[i] : *lo;
    *hi = v[i] > *hi ? v[i] : *hi;
  }
}

#if GPUIPC_HAVE_CUDA
/* The stream of @mode on device @dev; NULL on failure (then `null`). */
void *bench_stream_make(enum stream_mode mode, int dev)
{
  switch (mode) {
  case ST_LEGACY:
    return (void *)CU_STREAM_LEGACY;
  case ST_PER_THREAD:
    return (void *)CU_STREAM_PER_THREAD;
  case ST_CREATED: {
    struct gpuipc__ctx_saved saved;
    CUstream s = NULL;
    if (gpuipc__ctx_enter(dev, &saved) != 0)
      return NULL;
    if (GPUIPC_CU(cuStreamCreate, &s, CU_STREAM_NON_BLOCKING) != 0)
      s = NULL;
    gpuipc__ctx_leave(&saved);
    return s;
  }
  default:
    return NULL;
  }
}

void bench_stream_free(enum stream_mode mode, int dev, void *s)
{
  if (mode != ST_CREATED || s == NULL)
    return;
  struct gpuipc__ctx_saved saved;
  if (gpuipc__ctx_enter(dev, &saved) == 0) {
    gpuipc__cu.cuStreamDestroy((CUstream)s);
    gpuipc__ctx_leave(&saved);
  }
}

/* cuMemsetD8 of @n bytes of device @dev memory, synchronously. */
static int dev_fill(int dev, void *p, uint8_t v, size_t n)
{
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(dev, &saved);
  if (rc == 0) {
    rc = GPUIPC_CU(cuMemsetD8, (CUdeviceptr)(uintptr_t)p, v, n);
    if (rc == 0)
      rc = GPUIPC_CU(cuCtxSynchronize);
    gpuipc__ctx_leave(&saved);
  }
  return rc;
}

/*
 * Between GPUs, the copy the hardware does: with peer access on, as every
 * program that copies between GPUs enables it (without it the driver
 * stages through host memory, at a tenth of NVLink's rate). Where the
 * pair has no peer access the staged copy is what this machine offers,
 * and it stays the baseline; the report says which it was.
 */
int bench_peer_on(int src, int dst)
{
  return gpuipc_peer_enable(src, dst) == 0 &&
         gpuipc_peer_enable(dst, src) == 0;
}

/*
 * @count copies of @n bytes from @src (device @sdev) to @dst (device
 * @ddev) on @stream of @sdev, one to warm up first: cuMemcpyAsync on one
 * GPU, cuMemcpyPeerAsync between two (bench_peer_on has run). Microseconds
 * for the @count, or < 0.
 */
static double dev_copies(int sdev, int ddev, void *dst, const void *src,
                         size_t n, long count, void *stream)
{
  const struct gpuipc__dev *sd = gpuipc__dev_get(sdev);
  const struct gpuipc__dev *dd = gpuipc__dev_get(ddev);
  struct gpuipc__ctx_saved saved, other;
  if (sd == NULL || dd == NULL || gpuipc__ctx_enter(ddev, &other) != 0)
    return -1;
  gpuipc__ctx_leave(&other); /* retains @ddev's primary context */
  if (gpuipc__ctx_enter(sdev, &saved) != 0)
    return -1;
  CUcontext sc = __atomic_load_n(&sd->primary, __ATOMIC_ACQUIRE);
  CUcontext dc = __atomic_load_n(&dd->primary, __ATOMIC_ACQUIRE);
  double t0 = 0, us = -1;
  int rc = 0;
  for (long i = -1; i < count && rc == 0; i++) {
    if (i == 0) {
      rc = GPUIPC_CU(cuStreamSynchronize, (CUstream)stream);
      t0 = bench_now_us();
    }
    if (rc == 0 && sdev == ddev)
      rc = GPUIPC_CU(cuMemcpyAsync, (CUdeviceptr)(uintptr_t)dst,
                     (CUdeviceptr)(uintptr_t)src, n, (CUstream)stream);
    else if (rc == 0)
      rc = GPUIPC_CU(cuMemcpyPeerAsync, (CUdeviceptr)(uintptr_t)dst, dc,
                     (CUdeviceptr)(uintptr_t)src, sc, n, (CUstream)stream);
  }
  if (rc == 0)
    rc = GPUIPC_CU(cuStreamSynchronize, (CUstream)stream);
  if (rc == 0)
    us = bench_now_us() - t0;
  gpuipc__ctx_leave(&saved);
  return us;
}

/* Bytes [0, n) of device memory @p into @out. */
int bench_dev_read(int dev, void *out, const void *p, size_t n)
{
  return gpuipc_memcpy(out, p, n, dev, NULL);
}
#else
int bench_peer_on(int src, int dst)
{
  return 0;
}

void *bench_stream_make(enum stream_mode mode, int dev)
{
  return NULL;
}

void bench_stream_free(enum stream_mode mode, int dev, void *s)
{
}

static int dev_fill(int dev, void *p, uint8_t v, size_t n)
{
  return GPUIPC_E_UNSUPPORTED;
}

static double dev_copies(int sdev, int ddev, void *dst, const void *src,
                         size_t n, long count, void *stream)
{
  return -1;
}

int bench_dev_read(int dev, void *out, const void *p, size_t n)
{
  return GPUIPC_E_UNSUPPORTED;
}
#endif

int bench_fill(int dev, void *p, uint8_t v, size_t n)
{
  if (dev < 0) {
    memset(p, v, n);
    return 0;
  }
  return dev_fill(dev, p, v, n);
}

/* The byte a producer fills @bytes with. */
uint8_t bench_pattern(size_t bytes)
{
  return (uint8_t)(0xa5 ^ (unsigned)__builtin_ctzll(bytes));
}

/* The baseline for @bytes x @count: the driver's copy, or memcpy. */
double bench_base_us(int src, int dst, void *to, const void *from,
                     size_t bytes, long count, void *stream)
{
  if (src >= 0)
    return dev_copies(src, dst, to, from, bytes, count, stream);
  memcpy(to, from, bytes); /* warm-up */
  double t0 = bench_now_us();
  for (long i = 0; i < count; i++) {
    memcpy(to, from, bytes);
    __asm__ volatile("" : : "r"(to) : "memory");
  }
  return bench_now_us() - t0;
}
