/*
 * blocks_bench: a paged cache's blocks from one process to another, in
 * one block batch (gpuipc_channel_send_blocks / _recv_blocks), beside one
 * message a block and the floors of one process, in one run.
 *
 *   blocks_bench ADEV BDEV [--n N] [--sizes KIB,KIB,...] [--iters I]
 *                [--spin]
 *
 * Side A (this process, GPU ADEV) holds a 4 GiB cache (a VMM buffer)
 * whose 32-bit words are a hash of their index; side B (this program
 * again, GPU BDEV) a 4 GiB cache of its own. Each round moves N blocks
 * (1,024 by default) of each size (16 and 256 KiB by default) from
 * scattered places of A's cache (a random choice of distinct blocks) to
 * scattered places of B's (another), and is timed from A's first call
 * until the last block's message is free at A (B's copies completed:
 * gpuipc_channel_send_done). Rows:
 *
 *   batch        one gpuipc_channel_send_blocks, one recv_blocks;
 *   per_message  one gpuipc_channel_send of a block at a time, received
 *                with gpuipc_channel_recv_into into its destination;
 *   floor_batch  one process, peer access on: one cuMemcpyBatchAsync of
 *                the N copies;
 *   floor_kernel one process: one launch of a gather-scatter kernel (a
 *                thread block a block, 16-byte loads over the peer
 *                mapping).
 *
 * B waits in recv_blocks (timeout -1), as a receiver that expects a batch
 * does: its checks of the destination blocks are done by the time the
 * batch comes. With --spin it calls with timeout 0 until one is there
 * instead, and prints the median time of the call that found it (and of
 * B's stream from before that call until after its copies), A's
 * send_blocks call's too.
 *
 * B checks every word of every destination block after the last round of
 * each gpuipc row (its cache zeroed before the row), and the floors are
 * checked likewise; a wrong word stops the program (exit 1).
 * Output: "RESULT blocks <row> <KiB> median_us GB/s" and a readable line.
 */
#include <gpuipc.h>

#include "bench_cuda.h"
#include "bench_tens.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <vector>

#define CACHE ((size_t)4 << 30)

__host__ __device__ static inline uint32_t word_of(uint64_t i)
{
  uint32_t x = (uint32_t)i * 2654435761u ^ (uint32_t)(i >> 32);
  return x ^ (x >> 15);
}

__global__ static void k_fill(uint32_t *p, uint64_t nwords)
{
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
       i < nwords; i += (uint64_t)gridDim.x * blockDim.x)
    p[i] = word_of(i);
}

/* Block k of the destination holds source block src[k]'s words. */
__global__ static void k_check(const uint32_t *cache, const uint32_t *src,
                               const uint32_t *dst, uint64_t words,
                               unsigned long long *bad)
{
  uint64_t k = blockIdx.x;
  const uint32_t *d = cache + dst[k] * words;
  unsigned long long b = 0;
  for (uint64_t j = threadIdx.x; j < words; j += blockDim.x)
    b += d[j] != word_of(src[k] * words + j);
  if (b)
    atomicAdd(bad, b);
}

/* The floor kernel: thread block k copies block k. */
__global__ static void k_gather(uint4 *dcache, const uint4 *scache,
                                const uint32_t *src, const uint32_t *dst,
                                uint64_t n16)
{
  uint64_t k = blockIdx.x;
  uint4 *d = dcache + dst[k] * n16;
  const uint4 *s = scache + src[k] * n16;
  for (uint64_t j = threadIdx.x; j < n16; j += blockDim.x)
    d[j] = s[j];
}

/* The blocks of a round: @n distinct indices out of @nblocks, from @seed. */
static std::vector<uint32_t> pick(size_t n, size_t nblocks, uint64_t seed)
{
  std::vector<uint32_t> all(nblocks);
  for (size_t i = 0; i < nblocks; i++)
    all[i] = (uint32_t)i;
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (size_t i = 0; i < n; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    size_t j = i + (size_t)((x >> 33) % (nblocks - i));
    std::swap(all[i], all[j]);
  }
  all.resize(n);
  return all;
}

static double median(std::vector<double> v)
{
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

static void report(const char *row, size_t bytes, size_t n, double us)
{
  double gbs = (double)bytes * n / (us * 1e3);
  printf("RESULT blocks %s %zu %.1f %.1f\n", row, bytes >> 10, us, gbs);
  printf("%-13s %4zu x %4zu KiB  median %10.1f us  %7.1f GB/s\n", row, n,
         bytes >> 10, us, gbs);
  fflush(stdout);
}

/* A row of per-call times: median and extremes. */
static void spread(const char *what, std::vector<double> v)
{
  std::sort(v.begin(), v.end());
  printf("  %-22s median %7.1f us  min %7.1f  max %7.1f\n", what,
         v[v.size() / 2], v.front(), v.back());
}

/* Check B's cache (device memory of the current device). */
static void check(const uint32_t *cache, const std::vector<uint32_t> &src,
                  const std::vector<uint32_t> &dst, size_t bytes,
                  const char *what)
{
  size_t n = src.size();
  uint32_t *ds, *dd;
  unsigned long long *bad, h = 0;
  CUDA_OK(cudaMalloc(&ds, n * 4));
  CUDA_OK(cudaMalloc(&dd, n * 4));
  CUDA_OK(cudaMalloc(&bad, 8));
  CUDA_OK(cudaMemcpy(ds, src.data(), n * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dd, dst.data(), n * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(bad, 0, 8));
  k_check<<<(unsigned)n, 256>>>(cache, ds, dd, bytes / 4, bad);
  CUDA_OK(cudaMemcpy(&h, bad, 8, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaFree(ds));
  CUDA_OK(cudaFree(dd));
  CUDA_OK(cudaFree(bad));
  if (h != 0) {
    fprintf(stderr, "blocks_bench %s: %llu wrong words\n", what, h);
    exit(1);
  }
}

/* ---- side B: receives I rounds of one row and size ---- */

static int side_b(int dev, const char *dname, const char *row, size_t bytes,
                  size_t n, int iters)
{
  CUDA_OK(cudaSetDevice(dev));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  gpuipc_buf_t *cache;
  GI_OK(gpuipc_buf_alloc(CACHE, GPUIPC_KIND_VMM, dev, 0, &cache));
  uint8_t *base = (uint8_t *)gpuipc_buf_ptr(cache);
  CUDA_OK(cudaMemset(base, 0, CACHE));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint32_t> src = pick(n, CACHE / bytes, 1);
  std::vector<uint32_t> dst = pick(n, CACHE / bytes, 2);
  std::vector<gpuipc_block_t> blocks(n);
  for (size_t k = 0; k < n; k++)
    blocks[k] = {cache, (uint64_t)dst[k] * bytes, bytes};
  gpuipc_domain_t *dom;
  GI_OK(gpuipc_domain_join(dname, NULL, &dom));
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.device = dev;
  o.device_set = 1;
  o.timeout_ms = 120000;
  gpuipc_channel_t *ch;
  GI_OK(gpuipc_channel_open(dom, "blocks", &o, &ch));
  bool batch = strncmp(row, "batch", 5) == 0;
  bool spin = strcmp(row, "batch_spin") == 0;
  std::vector<double> host; /* the calls' own time, once the batch is there */
  std::vector<cudaEvent_t> ev(2 * (size_t)iters);
  for (cudaEvent_t &e : ev)
    CUDA_OK(cudaEventCreate(&e));
  for (int it = 0; it < iters; it++) {
    if (batch) {
      int rc;
      double t0;
      if (spin)
        CUDA_OK(cudaEventRecord(ev[2 * it], s));
      do {
        t0 = now_us();
        rc = gpuipc_channel_recv_blocks(ch, blocks.data(), n, (void *)s,
                                        spin ? 0 : -1);
      } while (rc == -EAGAIN);
      GI_OK(rc);
      if (it > 0)
        host.push_back(now_us() - t0);
      if (spin)
        CUDA_OK(cudaEventRecord(ev[2 * it + 1], s));
      continue;
    }
    for (size_t k = 0; k < n; k++) {
      struct tens t;
      tens_init(&t, cache, base + blocks[k].offset, dev, bytes);
      GI_OK(gpuipc_channel_recv_into(ch, &t.t, (void *)s, -1));
    }
  }
  CUDA_OK(cudaStreamSynchronize(s));
  if (spin && iters > 1) {
    /* B's stream from before the call to after its copies: the wait for
     * A's work (none here), the copy, the release. */
    std::vector<double> gpu;
    for (int it = 1; it < iters; it++) {
      float ms = 0;
      CUDA_OK(cudaEventElapsedTime(&ms, ev[2 * it], ev[2 * it + 1]));
      gpu.push_back(ms * 1e3);
    }
    spread("B's recv_blocks call", host);
    spread("B's stream, the batch", gpu);
  }
  for (cudaEvent_t &e : ev)
    CUDA_OK(cudaEventDestroy(e));
  check((const uint32_t *)base, src, dst, bytes, row);
  gpuipc_channel_close(ch);
  gpuipc_buf_release(cache);
  gpuipc_domain_leave(dom);
  return 0;
}

/* ---- side A ---- */

static void gpuipc_row(const char *row, int adev, int bdev, gpuipc_buf_t *cache,
                       size_t bytes, size_t n, int iters, gpuipc_domain_t *dom,
                       const char *dname)
{
  char sdev[16], sb[32], sn[32], si[16];
  snprintf(sdev, sizeof(sdev), "%d", bdev);
  snprintf(sb, sizeof(sb), "%zu", bytes);
  snprintf(sn, sizeof(sn), "%zu", n);
  snprintf(si, sizeof(si), "%d", iters);
  pid_t pid = fork();
  if (pid == 0) {
    execl("/proc/self/exe", "blocks_bench", "--side-b", sdev, dname, row, sb,
          sn, si, (char *)NULL);
    _exit(127);
  }
  CUDA_OK(cudaSetDevice(adev));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<uint32_t> src = pick(n, CACHE / bytes, 1);
  std::vector<gpuipc_block_t> blocks(n);
  for (size_t k = 0; k < n; k++)
    blocks[k] = {cache, (uint64_t)src[k] * bytes, bytes};
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.device = adev;
  o.device_set = 1;
  o.timeout_ms = 120000;
  gpuipc_channel_t *ch;
  GI_OK(gpuipc_channel_open(dom, "blocks", &o, &ch)); /* waits for B */
  bool batch = strncmp(row, "batch", 5) == 0;
  std::vector<double> t;
  std::vector<uint64_t> tickets(n);
  std::vector<double> host; /* A's send_blocks calls */
  for (int it = 0; it < iters; it++) {
    double t0 = now_us();
    if (batch) {
      GI_OK(gpuipc_channel_send_blocks(ch, blocks.data(), n, (void *)s, 0,
                                       &tickets[0]));
      if (it > 0)
        host.push_back(now_us() - t0);
      GI_OK(gpuipc_channel_send_done(ch, tickets[0], -1));
    } else {
      uint8_t *base = (uint8_t *)gpuipc_buf_ptr(cache);
      for (size_t k = 0; k < n; k++) {
        struct tens x;
        tens_init(&x, cache, base + blocks[k].offset, adev, bytes);
        GI_OK(gpuipc_channel_send(ch, &x.t, (void *)s, 0, &tickets[k]));
      }
      for (size_t k = 0; k < n; k++)
        GI_OK(gpuipc_channel_send_done(ch, tickets[k], -1));
    }
    if (it > 0) /* the first imports the buffers */
      t.push_back(now_us() - t0);
  }
  gpuipc_channel_close(ch);
  int st = 0;
  waitpid(pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "blocks_bench %s: side B failed (%d)\n", row, st);
    exit(1);
  }
  CUDA_OK(cudaStreamDestroy(s));
  if (strcmp(row, "batch_spin") == 0 && iters > 1)
    spread("A's send_blocks call", host);
  report(row, bytes, n, median(t));
}

/* The floors, in this process: A's cache to a cache on BDEV. */
static void floors(int adev, int bdev, gpuipc_buf_t *cache, size_t bytes,
                   size_t n, int iters, uint8_t *bcache)
{
  std::vector<uint32_t> src = pick(n, CACHE / bytes, 1);
  std::vector<uint32_t> dst = pick(n, CACHE / bytes, 2);
  const uint8_t *abase = (const uint8_t *)gpuipc_buf_ptr(cache);
  CUDA_OK(cudaSetDevice(bdev));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<CUdeviceptr> d(n), sp(n);
  std::vector<size_t> sz(n, bytes);
  for (size_t k = 0; k < n; k++) {
    d[k] = (CUdeviceptr)(bcache + (size_t)dst[k] * bytes);
    sp[k] = (CUdeviceptr)(abase + (size_t)src[k] * bytes);
  }
  uint32_t *ds, *dd;
  CUDA_OK(cudaMalloc(&ds, n * 4));
  CUDA_OK(cudaMalloc(&dd, n * 4));
  CUDA_OK(cudaMemcpy(ds, src.data(), n * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dd, dst.data(), n * 4, cudaMemcpyHostToDevice));
  for (int row = 0; row < 2; row++) {
    CUDA_OK(cudaMemset(bcache, 0, CACHE));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<double> t;
    for (int it = 0; it < iters; it++) {
      double t0 = now_us();
      if (row == 0) {
        CUmemcpyAttributes attr;
        memset(&attr, 0, sizeof(attr));
        attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
        size_t idx = 0;
        CUresult r = cuMemcpyBatchAsync(d.data(), sp.data(), sz.data(), n,
                                        &attr, &idx, 1, (CUstream)s);
        if (r != CUDA_SUCCESS) {
          fprintf(stderr, "cuMemcpyBatchAsync: %d\n", (int)r);
          exit(1);
        }
      } else {
        k_gather<<<(unsigned)n, 512, 0, s>>>((uint4 *)bcache,
                                              (const uint4 *)abase, ds, dd,
                                              bytes / 16);
      }
      CUDA_OK(cudaStreamSynchronize(s));
      if (it > 0)
        t.push_back(now_us() - t0);
    }
    const char *name = row == 0 ? "floor_batch" : "floor_kernel";
    check((const uint32_t *)bcache, src, dst, bytes, name);
    report(name, bytes, n, median(t));
  }
  CUDA_OK(cudaFree(ds));
  CUDA_OK(cudaFree(dd));
  CUDA_OK(cudaStreamDestroy(s));
  CUDA_OK(cudaSetDevice(adev));
}

int main(int argc, char **argv)
{
  if (argc == 8 && strcmp(argv[1], "--side-b") == 0)
    return side_b(atoi(argv[2]), argv[3], argv[4], strtoull(argv[5], 0, 10),
                  strtoull(argv[6], 0, 10), atoi(argv[7]));
  if (argc < 3) {
    fprintf(stderr, "usage: blocks_bench ADEV BDEV [--n N] [--sizes "
                    "KIB,...] [--iters I]\n");
    return 2;
  }
  int adev = atoi(argv[1]), bdev = atoi(argv[2]);
  size_t n = 1024;
  int iters = 11;
  const char *sizes = "16,256";
  const char *batch = "batch";
  for (int i = 3; i < argc; i += 2) {
    if (strcmp(argv[i], "--spin") == 0) {
      batch = "batch_spin";
      i--;
    } else if (i + 1 >= argc) {
      break;
    } else if (strcmp(argv[i], "--n") == 0)
      n = strtoull(argv[i + 1], 0, 10);
    else if (strcmp(argv[i], "--sizes") == 0)
      sizes = argv[i + 1];
    else if (strcmp(argv[i], "--iters") == 0)
      iters = atoi(argv[i + 1]);
  }
  CUDA_OK(cudaSetDevice(adev));
  gpuipc_buf_t *cache;
  GI_OK(gpuipc_buf_alloc(CACHE, GPUIPC_KIND_VMM, adev, 0, &cache));
  k_fill<<<1024, 256>>>((uint32_t *)gpuipc_buf_ptr(cache), CACHE / 4);
  CUDA_OK(cudaDeviceSynchronize());
  /* The floors' destination on BDEV; peer access both ways. */
  uint8_t *bcache;
  CUDA_OK(cudaSetDevice(bdev));
  CUDA_OK(cudaMalloc(&bcache, CACHE));
  if (adev != bdev) {
    cudaDeviceEnablePeerAccess(adev, 0);
    GI_OK(gpuipc_buf_access(cache, bdev));
  }
  cudaGetLastError();
  CUDA_OK(cudaSetDevice(adev));
  char dname[64];
  snprintf(dname, sizeof(dname), "blocks-%d", (int)getpid());
  gpuipc_domain_t *dom;
  GI_OK(gpuipc_domain_join(dname, NULL, &dom));
  printf("blocks_bench: GPU %d -> GPU %d, %zu blocks a round, 4 GiB caches, "
         "median of %d rounds\n", adev, bdev, n, iters - 1);
  for (const char *p = sizes; p != NULL && *p; p = strchr(p, ',')) {
    p += *p == ',';
    size_t bytes = strtoull(p, NULL, 10) << 10;
    floors(adev, bdev, cache, bytes, n, iters, bcache);
    gpuipc_row(batch, adev, bdev, cache, bytes, n, iters, dom, dname);
    gpuipc_row("per_message", adev, bdev, cache, bytes, n, iters, dom, dname);
  }
  gpuipc_domain_leave(dom);
  return 0;
}
