/*
 * ring_p2p: one process drives every GPU. Peer access is enabled along the
 * ring, and GPU i's kernel writes straight into GPU (i+1) % N's buffer
 * through the pointer, over NVLink or PCIe. Every byte is then verified on
 * the GPU that owns it. With one GPU it is a ring of one.
 *
 *   ring_p2p [MiB per GPU, default 256] [iterations, default 20]
 */
#include "gpuipc.h"

#include "ring_kernels.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#define CHECK(call)                                                            \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) {                                                   \
      fprintf(stderr, "ring_p2p: %s: %s\n", #call, cudaGetErrorString(e_));   \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

#define GCHECK(call)                                                           \
  do {                                                                         \
    int r_ = (call);                                                           \
    if (r_ != 0) {                                                             \
      fprintf(stderr, "ring_p2p: %s: %s: %s\n", #call, gpuipc_err_name(r_),   \
              gpuipc_last_error());                                            \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

int main(int argc, char **argv)
{
  size_t mib = argc > 1 ? strtoull(argv[1], NULL, 0) : 256;
  int iters = argc > 2 ? atoi(argv[2]) : 20;
  if (mib == 0 || iters <= 0) {
    fprintf(stderr, "usage: ring_p2p [MiB per GPU] [iterations]\n");
    return 2;
  }
  size_t bytes = mib << 20, words = bytes / sizeof(uint4);
  if (gpuipc_driver_status(NULL) != 0) {
    fprintf(stderr, "ring_p2p: no GPU: %s\n", gpuipc_last_error());
    return 1;
  }
  int n = gpuipc_device_count();
  printf("ring_p2p: %d GPU%s, %zu MiB per GPU, %d iterations\n", n,
         n == 1 ? "" : "s", mib, iters);

  /* What the link between neighbours is, and peer access along the ring. */
  for (int i = 0; i < n; i++) {
    int next = (i + 1) % n;
    gpuipc_p2p_t p;
    p.size = sizeof(p);
    GCHECK(gpuipc_topo_p2p(i, next, &p));
    char link[32];
    if (p.link == GPUIPC_LINK_NVLINK)
      snprintf(link, sizeof(link), "NV%d", p.nvlinks);
    else
      snprintf(link, sizeof(link), "%s", gpuipc_link_name(p.link));
    printf("  GPU%d -> GPU%d: link %s, peer access %s, native atomics %s, "
           "performance rank %d\n", i, next, link, p.access ? "yes" : "NO",
           p.native_atomics ? "yes" : "no", p.perf_rank);
    if (!p.access) {
      fprintf(stderr, "ring_p2p: GPU%d cannot reach GPU%d\n", i, next);
      return 1;
    }
    GCHECK(gpuipc_peer_enable(i, next));
  }

  std::vector<void *> buf((size_t)n);
  std::vector<cudaStream_t> stream((size_t)n);
  std::vector<cudaEvent_t> start((size_t)n), stop((size_t)n);
  std::vector<unsigned long long *> bad((size_t)n);
  for (int i = 0; i < n; i++) {
    CHECK(cudaSetDevice(i));
    CHECK(cudaMalloc(&buf[(size_t)i], bytes));
    CHECK(cudaMemset(buf[(size_t)i], 0, bytes));
    CHECK(cudaMalloc((void **)&bad[(size_t)i], sizeof(unsigned long long)));
    CHECK(cudaStreamCreateWithFlags(&stream[(size_t)i],
                                    cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&start[(size_t)i]));
    CHECK(cudaEventCreate(&stop[(size_t)i]));
  }
  for (int i = 0; i < n; i++) {
    CHECK(cudaSetDevice(i));
    CHECK(cudaDeviceSynchronize());
  }

  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  unsigned blocks = (unsigned)sms * 4;

  /* Every GPU writes into its successor at once, ITERS times. */
  std::vector<std::vector<float>> ms((size_t)n);
  for (int it = 0; it <= iters; it++) {
    for (int i = 0; i < n; i++) {
      CHECK(cudaSetDevice(i));
      uint4 *dst = (uint4 *)buf[(size_t)((i + 1) % n)];
      CHECK(cudaEventRecord(start[(size_t)i], stream[(size_t)i]));
      write_ring<<<blocks, 512, 0, stream[(size_t)i]>>>(dst, words,
                                                         (unsigned)i);
      CHECK(cudaGetLastError());
      CHECK(cudaEventRecord(stop[(size_t)i], stream[(size_t)i]));
    }
    for (int i = 0; i < n; i++) {
      CHECK(cudaEventSynchronize(stop[(size_t)i]));
      float t = 0;
      CHECK(cudaEventElapsedTime(&t, start[(size_t)i], stop[(size_t)i]));
      if (it > 0) /* the first is warm-up */
        ms[(size_t)i].push_back(t);
    }
  }

  /* Each GPU checks every byte of its own buffer. */
  unsigned long long total_bad = 0;
  for (int j = 0; j < n; j++) {
    CHECK(cudaSetDevice(j));
    CHECK(cudaMemset(bad[(size_t)j], 0, sizeof(unsigned long long)));
    unsigned writer = (unsigned)((j - 1 + n) % n);
    verify_ring<<<blocks, 512>>>((const uint4 *)buf[(size_t)j], words, writer,
                                 bad[(size_t)j]);
    CHECK(cudaGetLastError());
    unsigned long long b = 0;
    CHECK(cudaMemcpy(&b, bad[(size_t)j], sizeof(b), cudaMemcpyDeviceToHost));
    total_bad += b;
    std::vector<float> &v = ms[(size_t)writer];
    std::sort(v.begin(), v.end());
    float med = v[v.size() / 2];
    printf("  GPU%u wrote %zu MiB into GPU%d's buffer by kernel: median "
           "%.3f ms, %.1f GB/s; GPU%d verified %zu bytes: %s\n",
           writer, mib, j, med, (double)bytes / (med * 1e6), j, bytes,
           b == 0 ? "all correct" : "MISMATCHES");
  }
  for (int i = 0; i < n; i++) {
    CHECK(cudaSetDevice(i));
    CHECK(cudaFree(buf[(size_t)i]));
    CHECK(cudaFree(bad[(size_t)i]));
  }
  if (total_bad != 0) {
    printf("ring_p2p: FAILED: %llu 16-byte words wrong\n", total_bad);
    return 1;
  }
  printf("ring_p2p: OK\n");
  return 0;
}
