/*
 * kinds_bench: what gpuipc's GPU kinds cost, against the raw driver calls,
 * in one run on one machine.
 *
 *  - first import: the raw driver calls an importer must make (VMM:
 *    cuMemImportFromShareableHandle + cuMemAddressReserve + cuMemMap +
 *    cuMemSetAccess; LEGACY: cuIpcOpenMemHandle; POOL: cuMemPoolImportPointer
 *    into an already imported pool) against gpuipc_buf_import of a handle
 *    not seen before (taking its fd, GPUIPC_BUF_TAKE_FD, as gpuipc's
 *    channels do; VMM also without, when gpuipc duplicates the fd; and
 *    VMM as gpuipc's channels and segments import, an fd close-on-exec
 *    already kept with no fcntl: kinds_take.c), interleaved, medians.
 *    Target: <= 1.05x.
 *  - cached import: gpuipc_buf_import of a handle already mapped. Target:
 *    <= 1 us.
 *  - copy bandwidth through an imported mapping, on its own GPU and from
 *    the other GPU (copy engine and kernel), against cudaMemcpyPeer between
 *    local buffers of the same GPUs. Bytes copied per second, medians.
 *
 * A second process (this program again, fork + exec) allocates and exports;
 * handles travel over a Unix socket. Each first-import row is also a line
 * "RESULT import <kind>_<same|cross> <raw us> <gpuipc us>" for
 * bench/channel_vs_baselines.py.
 *
 *   kinds_bench [--n N] [--mib M] [--iters I]
 */
#include "gpuipc.h"
#include "handle_socket.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <vector>

static const char *g_who = "kinds_bench";

#define CHECK(call)                                                            \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) {                                                   \
      fprintf(stderr, "%s: %s: %s\n", g_who, #call, cudaGetErrorString(e_));   \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

#define CU(call)                                                               \
  do {                                                                         \
    CUresult r_ = (call);                                                      \
    if (r_ != CUDA_SUCCESS) {                                                  \
      const char *s_ = NULL;                                                   \
      cuGetErrorName(r_, &s_);                                                 \
      fprintf(stderr, "%s: %s: %s\n", g_who, #call, s_ ? s_ : "?");            \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

#define GCHECK(call)                                                           \
  do {                                                                         \
    int r_ = (call);                                                           \
    if (r_ != 0) {                                                             \
      fprintf(stderr, "%s: %s: %s: %s\n", g_who, #call, gpuipc_err_name(r_),   \
              gpuipc_last_error());                                            \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

enum { M_ALLOC = 1, M_HANDLE, M_FREE, M_QUIT };

struct msg {
  uint32_t type;
  int32_t kind;  /* M_ALLOC */
  uint32_t count; /* M_ALLOC: buffers */
  uint64_t size;  /* M_ALLOC: bytes each */
  uint32_t len;
  uint8_t packed[GPUIPC_HANDLE_PACKED_SIZE];
};

static void send_msg(int sock, const struct msg *m, int fd)
{
  if (hs_send(sock, m, sizeof(*m), fd) != 0) {
    fprintf(stderr, "%s: send failed\n", g_who);
    exit(1);
  }
}

static struct msg recv_msg(int sock, uint32_t type, int *fd)
{
  struct msg m;
  int got = -1;
  ssize_t n = hs_recv(sock, &m, sizeof(m), &got);
  if (n != (ssize_t)sizeof(m) || m.type != type) {
    fprintf(stderr, "%s: expected message %u, got %zd bytes\n", g_who, type,
            n);
    exit(1);
  }
  if (fd != NULL)
    *fd = got;
  else if (got >= 0)
    close(got);
  return m;
}

static double now_us(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static double median(std::vector<double> v)
{
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

/* ----- the exporting process ----- */

static int exporter_loop(int sock)
{
  g_who = "kinds_bench exporter";
  std::vector<gpuipc_buf_t *> bufs;
  for (;;) {
    struct msg m;
    int fd = -1;
    ssize_t n = hs_recv(sock, &m, sizeof(m), &fd);
    if (n != (ssize_t)sizeof(m))
      return 1;
    if (m.type == M_QUIT)
      return 0;
    if (m.type == M_FREE) {
      for (gpuipc_buf_t *b : bufs)
        GCHECK(gpuipc_buf_release(b));
      bufs.clear();
      continue;
    }
    if (m.type != M_ALLOC)
      return 1;
    for (uint32_t i = 0; i < m.count; i++) {
      gpuipc_buf_t *b;
      GCHECK(gpuipc_buf_alloc(m.size, (gpuipc_kind_t)m.kind, 0, 0, &b));
      CHECK(cudaSetDevice(0));
      CHECK(cudaMemset(gpuipc_buf_ptr(b), (int)(i & 0xff), m.size));
      bufs.push_back(b);
    }
    CHECK(cudaDeviceSynchronize());
    for (gpuipc_buf_t *b : bufs) {
      gpuipc_handle_t h;
      GCHECK(gpuipc_buf_export(b, &h));
      struct msg r;
      memset(&r, 0, sizeof(r));
      r.type = M_HANDLE;
      int len = gpuipc_handle_pack(&h, r.packed, sizeof(r.packed));
      if (len < 0)
        GCHECK(len);
      r.len = (uint32_t)len;
      send_msg(sock, &r, h.fd);
      if (h.fd >= 0)
        close(h.fd);
    }
  }
}

/* ----- the importing process ----- */

struct peer {
  int sock;
  pid_t pid;
};

/* Ask for @count buffers of @kind, @size bytes each, on the exporter's GPU 0. */
static std::vector<gpuipc_handle_t> fetch(struct peer *p, gpuipc_kind_t kind,
                                          uint32_t count, size_t size)
{
  struct msg m;
  memset(&m, 0, sizeof(m));
  m.type = M_ALLOC;
  m.kind = kind;
  m.count = count;
  m.size = size;
  send_msg(p->sock, &m, -1);
  std::vector<gpuipc_handle_t> hs(count);
  for (uint32_t i = 0; i < count; i++) {
    int fd = -1;
    struct msg r = recv_msg(p->sock, M_HANDLE, &fd);
    GCHECK(gpuipc_handle_unpack(r.packed, r.len, &hs[i]));
    hs[i].fd = fd;
  }
  return hs;
}

static void release_remote(struct peer *p)
{
  struct msg m;
  memset(&m, 0, sizeof(m));
  m.type = M_FREE;
  send_msg(p->sock, &m, -1);
}

static CUcontext ctx_of(int dev)
{
  CHECK(cudaSetDevice(dev));
  CHECK(cudaFree(0)); /* the primary context, made current */
  CUcontext c;
  CU(cuCtxGetCurrent(&c));
  return c;
}

struct raw_map {
  CUmemGenericAllocationHandle mh;
  CUdeviceptr va;
  size_t size;
};

struct first_result {
  double raw_us, gpuipc_us;
};

/*
 * Import every handle once, alternating the raw driver calls and
 * gpuipc_buf_import (the first pair is warm-up), onto local device @dev.
 */
extern "C" int kinds_import_taken(const gpuipc_handle_t *h, int device,
                                  gpuipc_buf_t **out);

static struct first_result first_import(std::vector<gpuipc_handle_t> &hs,
                                        gpuipc_kind_t kind, int dev,
                                        unsigned flags, bool as_channel)
{
  CUcontext ctx = ctx_of(dev);
  CUdevice cudev;
  CU(cuCtxGetDevice(&cudev));
  std::vector<double> raw_t, lib_t;
  std::vector<raw_map> maps;
  std::vector<CUdeviceptr> opened;
  std::vector<gpuipc_buf_t *> bufs;
  CUmemoryPool pool = NULL;
  if (kind == GPUIPC_KIND_POOL) {
    CU(cuMemPoolImportFromShareableHandle(&pool, (void *)(uintptr_t)hs[0].fd,
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                          0));
    int owner = gpuipc_device_by_uuid(hs[0].device_uuid);
    if (owner != dev) {
      CUmemAccessDesc a;
      memset(&a, 0, sizeof(a));
      a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      a.location.id = cudev;
      a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      CU(cuMemPoolSetAccess(pool, &a, 1));
    }
  }
  for (size_t i = 0; i < hs.size(); i++) {
    gpuipc_handle_t &h = hs[i];
    CU(cuCtxSetCurrent(ctx));
    /* Pairs alternate which goes first: (raw, gpuipc), (gpuipc, raw), ... */
    bool raw = (i % 2 == 0) == ((i / 2) % 2 == 0);
    if (raw) {
      double t0 = now_us();
      if (kind == GPUIPC_KIND_VMM) {
        raw_map m;
        m.size = h.alloc_size;
        CU(cuMemImportFromShareableHandle(&m.mh, (void *)(uintptr_t)h.fd,
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        CU(cuMemAddressReserve(&m.va, m.size, 0, 0, 0));
        CU(cuMemMap(m.va, m.size, 0, m.mh, 0));
        CUmemAccessDesc a;
        memset(&a, 0, sizeof(a));
        a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        a.location.id = cudev;
        a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CU(cuMemSetAccess(m.va, m.size, &a, 1));
        maps.push_back(m);
      } else if (kind == GPUIPC_KIND_LEGACY) {
        CUipcMemHandle ipc;
        memcpy(ipc.reserved, h.bytes, sizeof(ipc.reserved));
        CUdeviceptr p;
        CU(cuIpcOpenMemHandle(&p, ipc, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
        opened.push_back(p);
      } else {
        CUmemPoolPtrExportData d;
        memcpy(d.reserved, h.bytes, sizeof(d.reserved));
        CUdeviceptr p;
        CU(cuMemPoolImportPointer(&p, pool, &d));
        opened.push_back(p);
      }
      double t1 = now_us();
      if (i >= 2)
        raw_t.push_back(t1 - t0);
    } else {
      gpuipc_buf_t *b;
      if (as_channel) /* as a channel's socket hands it over */
        fcntl(h.fd, F_SETFD, FD_CLOEXEC);
      double t0 = now_us();
      GCHECK(as_channel ? kinds_import_taken(&h, dev, &b)
                        : gpuipc_buf_import(&h, dev, flags, &b));
      double t1 = now_us();
      if (i >= 2)
        lib_t.push_back(t1 - t0);
      bufs.push_back(b);
      if (flags & GPUIPC_BUF_TAKE_FD)
        h.fd = -1; /* gpuipc's now */
    }
  }
  CU(cuCtxSetCurrent(ctx));
  for (raw_map &m : maps) {
    CU(cuMemUnmap(m.va, m.size));
    CU(cuMemAddressFree(m.va, m.size));
    CU(cuMemRelease(m.mh));
  }
  for (CUdeviceptr p : opened) {
    if (kind == GPUIPC_KIND_LEGACY)
      CU(cuIpcCloseMemHandle(p));
    else
      CU(cuMemFree(p));
  }
  if (pool != NULL)
    cuMemPoolDestroy(pool); /* the driver may share it with gpuipc's */
  for (gpuipc_buf_t *b : bufs)
    GCHECK(gpuipc_buf_release(b));
  for (gpuipc_handle_t &h : hs)
    if (h.fd >= 0)
      close(h.fd);
  return {median(raw_t), median(lib_t)};
}

/* Median of gpuipc_buf_import of a handle already mapped here. */
static double cached_import(gpuipc_handle_t &h, int iters)
{
  gpuipc_buf_t *held, *b;
  GCHECK(gpuipc_buf_import(&h, -1, 0, &held));
  std::vector<double> t;
  t.reserve((size_t)iters);
  for (int i = 0; i < iters; i++) {
    double t0 = now_us();
    int rc = gpuipc_buf_import(&h, -1, 0, &b);
    double t1 = now_us();
    GCHECK(rc);
    GCHECK(gpuipc_buf_release(b));
    t.push_back(t1 - t0);
  }
  GCHECK(gpuipc_buf_release(held));
  return median(t);
}

__global__ static void copy_kernel(uint4 *dst, const uint4 *src, size_t n)
{
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride)
    dst[i] = src[i];
}

enum copy_how { BY_MEMCPY, BY_PEER, BY_KERNEL };

/* Median GB/s of @iters copies of @n bytes on @dev's stream. */
static double copy_gbps(int dev, void *dst, int dst_dev, const void *src,
                        int src_dev, size_t n, enum copy_how how, int iters)
{
  CHECK(cudaSetDevice(dev));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  std::vector<double> gbps;
  for (int i = 0; i <= iters; i++) {
    CHECK(cudaEventRecord(a, s));
    if (how == BY_MEMCPY)
      CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, s));
    else if (how == BY_PEER)
      CHECK(cudaMemcpyPeerAsync(dst, dst_dev, src, src_dev, n, s));
    else
      copy_kernel<<<(unsigned)sms * 4, 512, 0, s>>>(
          (uint4 *)dst, (const uint4 *)src, n / sizeof(uint4));
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (i > 0)
      gbps.push_back((double)n / ((double)ms * 1e6));
  }
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  CHECK(cudaStreamDestroy(s));
  return median(gbps);
}

static const char *verdict(bool ok)
{
  return ok ? "ok" : "MISSED";
}

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IOLBF, 0);
  int n_imports = 200, iters = 20;
  size_t mib = 256;
  int fd = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--n") == 0)
      n_imports = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--mib") == 0)
      mib = strtoull(argv[i + 1], NULL, 0);
    else if (strcmp(argv[i], "--iters") == 0)
      iters = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--exporter") == 0)
      fd = atoi(argv[i + 1]);
  }
  if (fd >= 0)
    return exporter_loop(fd);
  if (n_imports < 4 || iters < 1 || mib == 0) {
    fprintf(stderr, "usage: kinds_bench [--n N>=4] [--mib M] [--iters I]\n");
    return 2;
  }
  n_imports += n_imports % 2;
  if (gpuipc_driver_status(NULL) != 0) {
    fprintf(stderr, "kinds_bench: no GPU: %s\n", gpuipc_last_error());
    return 1;
  }
  int ndev = gpuipc_device_count();
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    perror("socketpair");
    return 1;
  }
  char fdstr[16];
  snprintf(fdstr, sizeof(fdstr), "%d", sv[1]);
  char *args[] = {argv[0], (char *)"--exporter", fdstr, NULL};
  struct peer p = {sv[0], hs_spawn_self(args, sv[1])};
  close(sv[1]);
  if (p.pid < 0) {
    fprintf(stderr, "kinds_bench: cannot start the exporter\n");
    return 1;
  }
  CU(cuInit(0));
  gpuipc_device_info_t di;
  memset(&di, 0, sizeof(di));
  di.size = sizeof(di);
  GCHECK(gpuipc_device_info(0, &di));
  printf("kinds_bench: %d GPU%s (%s), exporter pid %d on GPU0, %d imports "
         "per row (half raw, half gpuipc, interleaved), medians\n", ndev,
         ndev == 1 ? "" : "s", di.name, (int)p.pid, n_imports);

  bool all_ok = true;
  printf("\n%-30s %10s %10s %9s %7s  %s\n", "first import", "raw us",
         "gpuipc us", "extra us", "ratio", "target <= 1.05");
  /* gpuipc takes the fd (GPUIPC_BUF_TAKE_FD), as its channels and
   * segments import; the "_dup" rows leave it the caller's, so gpuipc
   * keeps a duplicate (VMM, to export it again). */
  struct row {
    gpuipc_kind_t kind;
    int dev;
    unsigned flags;
    bool as_channel;
    const char *name, *tag;
  } rows[] = {
      {GPUIPC_KIND_VMM, 0, GPUIPC_BUF_TAKE_FD, false, "vmm, same GPU", ""},
      {GPUIPC_KIND_VMM, 0, 0, false, "vmm, same GPU, fd kept (dup)", "_dup"},
      {GPUIPC_KIND_VMM, 0, GPUIPC_BUF_TAKE_FD, true,
       "vmm, same GPU, as channels", "_chan"},
      {GPUIPC_KIND_VMM, 1, GPUIPC_BUF_TAKE_FD, false,
       "vmm, GPU0 memory on GPU1", ""},
      {GPUIPC_KIND_VMM, 1, 0, false, "vmm, GPU0 on GPU1, fd kept", "_dup"},
      {GPUIPC_KIND_VMM, 1, GPUIPC_BUF_TAKE_FD, true,
       "vmm, GPU0 on GPU1, as channels", "_chan"},
      {GPUIPC_KIND_LEGACY, 0, 0, false, "legacy, same GPU", ""},
      {GPUIPC_KIND_LEGACY, 1, 0, false, "legacy, GPU0 memory on GPU1", ""},
      {GPUIPC_KIND_POOL, 0, 0, false, "pool, same GPU", ""},
      {GPUIPC_KIND_POOL, 1, 0, false, "pool, GPU0 memory on GPU1", ""}};
  for (const row &r : rows) {
    if (r.dev >= ndev)
      continue;
    std::vector<gpuipc_handle_t> hs =
        fetch(&p, r.kind, (uint32_t)n_imports + 2, (size_t)2 << 20);
    struct first_result f =
        first_import(hs, r.kind, r.dev, r.flags, r.as_channel);
    release_remote(&p);
    double ratio = f.gpuipc_us / f.raw_us;
    bool ok = ratio <= 1.05;
    all_ok = all_ok && ok;
    printf("%-30s %10.2f %10.2f %9.2f %7.3f  %s\n", r.name, f.raw_us,
           f.gpuipc_us, f.gpuipc_us - f.raw_us, ratio, verdict(ok));
    printf("RESULT import %s_%s%s %.3f %.3f\n", gpuipc_kind_name(r.kind),
           r.dev == 0 ? "same" : "cross", r.tag, f.raw_us, f.gpuipc_us);
  }

  {
    std::vector<gpuipc_handle_t> hs = fetch(&p, GPUIPC_KIND_VMM, 1, 2 << 20);
    double us = cached_import(hs[0], 20000);
    close(hs[0].fd);
    release_remote(&p);
    bool ok = us <= 1.0;
    all_ok = all_ok && ok;
    printf("\n%-30s %10s %10.3f %9s %7s  target <= 1 us: %s\n",
           "cached import (vmm)", "", us, "", "", verdict(ok));
  }

  /* Copies: through the imported mapping, and cudaMemcpyPeer as baseline. */
  size_t n = mib << 20;
  std::vector<gpuipc_handle_t> hs = fetch(&p, GPUIPC_KIND_VMM, 1, n);
  gpuipc_buf_t *mapped;
  GCHECK(gpuipc_buf_import(&hs[0], 0, 0, &mapped));
  close(hs[0].fd);
  void *src0, *dst0, *dst1 = NULL;
  CHECK(cudaSetDevice(0));
  CHECK(cudaMalloc(&src0, n));
  CHECK(cudaMalloc(&dst0, n));
  CHECK(cudaMemset(src0, 1, n));
  printf("\n%-30s %10s %10s %7s  (%zu MiB, bytes copied per second)\n",
         "copy bandwidth, GB/s", "mapping", "memcpyPeer", "ratio", mib);
  double m0 = copy_gbps(0, dst0, 0, gpuipc_buf_ptr(mapped), 0, n, BY_MEMCPY,
                        iters);
  double b0 = copy_gbps(0, dst0, 0, src0, 0, n, BY_PEER, iters);
  printf("%-30s %10.1f %10.1f %7.3f\n", "same GPU, copy engine", m0, b0,
         m0 / b0);
  if (ndev >= 2) {
    GCHECK(gpuipc_buf_access(mapped, 1));
    GCHECK(gpuipc_peer_enable(1, 0));
    CHECK(cudaSetDevice(1));
    CHECK(cudaMalloc(&dst1, n));
    double m1 = copy_gbps(1, dst1, 1, gpuipc_buf_ptr(mapped), 0, n, BY_MEMCPY,
                          iters);
    double k1 = copy_gbps(1, dst1, 1, gpuipc_buf_ptr(mapped), 0, n, BY_KERNEL,
                          iters);
    double b1 = copy_gbps(1, dst1, 1, src0, 0, n, BY_PEER, iters);
    printf("%-30s %10.1f %10.1f %7.3f\n", "GPU0 -> GPU1, copy engine", m1, b1,
           m1 / b1);
    printf("%-30s %10.1f %10.1f %7.3f\n", "GPU0 -> GPU1, kernel", k1, b1,
           k1 / b1);
    CHECK(cudaFree(dst1));
  }
  CHECK(cudaSetDevice(0));
  CHECK(cudaFree(src0));
  CHECK(cudaFree(dst0));
  GCHECK(gpuipc_buf_release(mapped));
  release_remote(&p);

  struct msg q;
  memset(&q, 0, sizeof(q));
  q.type = M_QUIT;
  send_msg(p.sock, &q, -1);
  int st = 0;
  waitpid(p.pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "kinds_bench: the exporter failed (status 0x%x)\n", st);
    return 1;
  }
  printf("\nkinds_bench: %s\n", all_ok ? "all targets met" : "targets MISSED");
  return 0;
}
