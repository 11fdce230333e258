/*
 * ring_ipc: one process per GPU. Rank 0 starts ranks 1..N-1 (fork + exec of
 * this program with their rank on the command line), each rank allocates a
 * gpuipc buffer on its GPU and exports it, rank 0 hands every rank the
 * handle of the next one (packed record + fd over a Unix socket), and each
 * rank maps its successor's buffer for its own GPU. Then GPU r's kernel
 * writes straight into GPU (r+1) % N's buffer, and every rank verifies
 * every byte of its own buffer. With one GPU it is a ring of one (the rank
 * imports its own export and gets its own buffer back).
 *
 *   ring_ipc [--kind vmm|legacy|pool] [--mib M] [--iters I] [--ranks N]
 */
#include "gpuipc.h"
#include "handle_socket.h"

#include "ring_kernels.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <vector>

#define CHECK(call)                                                            \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) {                                                   \
      fprintf(stderr, "ring_ipc[%d]: %s: %s\n", g_rank, #call,                 \
              cudaGetErrorString(e_));                                         \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

#define GCHECK(call)                                                           \
  do {                                                                         \
    int r_ = (call);                                                           \
    if (r_ != 0) {                                                             \
      fprintf(stderr, "ring_ipc[%d]: %s: %s: %s\n", g_rank, #call,             \
              gpuipc_err_name(r_), gpuipc_last_error());                       \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

static int g_rank = 0;

enum msg_type { M_HANDLE = 1, M_READY, M_GO, M_WROTE, M_VERIFY, M_RESULT,
                M_EXIT };

struct msg {
  uint32_t type;
  int32_t rank;
  uint64_t value; /* M_RESULT: wrong words */
  double ms;      /* M_WROTE: median kernel time */
  uint32_t len;
  uint8_t packed[GPUIPC_HANDLE_PACKED_SIZE];
};

static void send_msg(int sock, uint32_t type, const struct msg *body, int fd)
{
  struct msg m;
  if (body != NULL)
    m = *body;
  else
    memset(&m, 0, sizeof(m));
  m.type = type;
  m.rank = g_rank;
  int rc = hs_send(sock, &m, sizeof(m), fd);
  if (rc != 0) {
    fprintf(stderr, "ring_ipc[%d]: send: %s\n", g_rank, strerror(-rc));
    exit(1);
  }
}

static struct msg recv_msg(int sock, uint32_t type, int *fd)
{
  struct msg m;
  int got = -1;
  ssize_t n = hs_recv(sock, &m, sizeof(m), &got);
  if (n != (ssize_t)sizeof(m) || m.type != type) {
    fprintf(stderr, "ring_ipc[%d]: expected message %u, got %zd bytes\n",
            g_rank, type, n);
    exit(1);
  }
  if (fd != NULL)
    *fd = got;
  else if (got >= 0)
    close(got);
  return m;
}

struct opts {
  gpuipc_kind_t kind;
  size_t mib;
  int iters;
  int ranks;
};

/* One rank's GPU side. */
struct rank_state {
  int dev;
  size_t bytes;
  gpuipc_buf_t *mine, *next;
  cudaStream_t stream;
  unsigned blocks;
};

static void rank_alloc(struct rank_state *s, const struct opts *o,
                       gpuipc_handle_t *h)
{
  s->dev = g_rank;
  s->bytes = o->mib << 20;
  CHECK(cudaSetDevice(s->dev));
  CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, s->dev));
  s->blocks = (unsigned)sms * 4;
  GCHECK(gpuipc_buf_alloc(s->bytes, o->kind, s->dev, 0, &s->mine));
  CHECK(cudaMemset(gpuipc_buf_ptr(s->mine), 0, s->bytes));
  CHECK(cudaDeviceSynchronize());
  GCHECK(gpuipc_buf_export(s->mine, h));
}

/* Map the successor's buffer for this rank's GPU. */
static void rank_import(struct rank_state *s, const struct msg *m, int fd)
{
  gpuipc_handle_t h;
  GCHECK(gpuipc_handle_unpack(m->packed, m->len, &h));
  h.fd = fd;
  GCHECK(gpuipc_buf_import(&h, s->dev, 0, &s->next));
  if (fd >= 0)
    close(fd);
}

/* ITERS timed writes into the successor (one warm-up first): median ms. */
static double rank_write(struct rank_state *s, int iters)
{
  CHECK(cudaSetDevice(s->dev));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int it = 0; it <= iters; it++) {
    CHECK(cudaEventRecord(a, s->stream));
    write_ring<<<s->blocks, 512, 0, s->stream>>>(
        (uint4 *)gpuipc_buf_ptr(s->next), s->bytes / sizeof(uint4),
        (unsigned)g_rank);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(b, s->stream));
    CHECK(cudaEventSynchronize(b));
    float t = 0;
    CHECK(cudaEventElapsedTime(&t, a, b));
    if (it > 0)
      ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

/* Wrong 16-byte words in this rank's own buffer. */
static uint64_t rank_verify(struct rank_state *s, int nranks)
{
  CHECK(cudaSetDevice(s->dev));
  unsigned long long *bad;
  CHECK(cudaMalloc((void **)&bad, sizeof(*bad)));
  CHECK(cudaMemset(bad, 0, sizeof(*bad)));
  unsigned writer = (unsigned)((g_rank - 1 + nranks) % nranks);
  verify_ring<<<s->blocks, 512>>>((const uint4 *)gpuipc_buf_ptr(s->mine),
                                  s->bytes / sizeof(uint4), writer, bad);
  CHECK(cudaGetLastError());
  unsigned long long n = 0;
  CHECK(cudaMemcpy(&n, bad, sizeof(n), cudaMemcpyDeviceToHost));
  CHECK(cudaFree(bad));
  return n;
}

static void rank_release(struct rank_state *s)
{
  GCHECK(gpuipc_buf_release(s->next));
  GCHECK(gpuipc_buf_release(s->mine));
}

static void pack_into(struct msg *m, const gpuipc_handle_t *h)
{
  memset(m, 0, sizeof(*m));
  int n = gpuipc_handle_pack(h, m->packed, sizeof(m->packed));
  if (n < 0) {
    fprintf(stderr, "ring_ipc[%d]: gpuipc_handle_pack: %s\n", g_rank,
            gpuipc_last_error());
    exit(1);
  }
  m->len = (uint32_t)n;
}

static int run_child(int sock, const struct opts *o)
{
  struct rank_state s;
  gpuipc_handle_t h;
  rank_alloc(&s, o, &h);
  struct msg m;
  pack_into(&m, &h);
  send_msg(sock, M_HANDLE, &m, h.fd);
  if (h.fd >= 0)
    close(h.fd);
  int fd;
  struct msg nm = recv_msg(sock, M_HANDLE, &fd);
  rank_import(&s, &nm, fd);
  send_msg(sock, M_READY, NULL, -1);
  recv_msg(sock, M_GO, NULL);
  memset(&m, 0, sizeof(m));
  m.ms = rank_write(&s, o->iters);
  send_msg(sock, M_WROTE, &m, -1);
  recv_msg(sock, M_VERIFY, NULL);
  memset(&m, 0, sizeof(m));
  m.value = rank_verify(&s, o->ranks);
  send_msg(sock, M_RESULT, &m, -1);
  recv_msg(sock, M_EXIT, NULL);
  rank_release(&s);
  return 0;
}

static int run_hub(const struct opts *o, char *argv0)
{
  int n = o->ranks;
  std::vector<int> sock((size_t)n, -1);
  std::vector<pid_t> pid((size_t)n, -1);
  char kind[16], mib[32], iters[16], ranks[16];
  snprintf(kind, sizeof(kind), "%s", gpuipc_kind_name(o->kind));
  snprintf(mib, sizeof(mib), "%zu", o->mib);
  snprintf(iters, sizeof(iters), "%d", o->iters);
  snprintf(ranks, sizeof(ranks), "%d", n);
  for (int r = 1; r < n; r++) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
      perror("ring_ipc: socketpair");
      return 1;
    }
    char rank[16], fdstr[16];
    snprintf(rank, sizeof(rank), "%d", r);
    snprintf(fdstr, sizeof(fdstr), "%d", sv[1]);
    char *args[] = {argv0,          (char *)"--rank", rank,
                    (char *)"--fd", fdstr,            (char *)"--kind",
                    kind,           (char *)"--mib",  mib,
                    (char *)"--iters", iters,         (char *)"--ranks",
                    ranks,          NULL};
    pid[(size_t)r] = hs_spawn_self(args, sv[1]);
    close(sv[1]);
    if (pid[(size_t)r] < 0) {
      fprintf(stderr, "ring_ipc: starting rank %d: %s\n", r,
              strerror((int)-pid[(size_t)r]));
      return 1;
    }
    sock[(size_t)r] = sv[0];
  }
  printf("ring_ipc: %d rank%s (one process per GPU), %s buffers of %zu MiB, "
         "%d iterations\n", n, n == 1 ? "" : "s", kind, o->mib, o->iters);

  /* Every rank's handle, then each rank gets its successor's. */
  struct rank_state s;
  std::vector<struct msg> handle((size_t)n);
  std::vector<int> hfd((size_t)n, -1);
  gpuipc_handle_t h0;
  rank_alloc(&s, o, &h0);
  pack_into(&handle[0], &h0);
  hfd[0] = h0.fd;
  for (int r = 1; r < n; r++)
    handle[(size_t)r] = recv_msg(sock[(size_t)r], M_HANDLE, &hfd[(size_t)r]);
  for (int r = 1; r < n; r++) {
    int nx = (r + 1) % n;
    send_msg(sock[(size_t)r], M_HANDLE, &handle[(size_t)nx], hfd[(size_t)nx]);
  }
  int fd1 = hfd[(size_t)(1 % n)] >= 0 ? dup(hfd[(size_t)(1 % n)]) : -1;
  rank_import(&s, &handle[(size_t)(1 % n)], fd1);
  for (int r = 0; r < n; r++)
    if (hfd[(size_t)r] >= 0)
      close(hfd[(size_t)r]);
  for (int r = 1; r < n; r++)
    recv_msg(sock[(size_t)r], M_READY, NULL);
  printf("  every rank mapped its successor's buffer for its own GPU\n");

  for (int r = 1; r < n; r++)
    send_msg(sock[(size_t)r], M_GO, NULL, -1);
  std::vector<double> ms((size_t)n);
  ms[0] = rank_write(&s, o->iters);
  for (int r = 1; r < n; r++)
    ms[(size_t)r] = recv_msg(sock[(size_t)r], M_WROTE, NULL).ms;

  for (int r = 1; r < n; r++)
    send_msg(sock[(size_t)r], M_VERIFY, NULL, -1);
  std::vector<uint64_t> bad((size_t)n);
  bad[0] = rank_verify(&s, n);
  for (int r = 1; r < n; r++)
    bad[(size_t)r] = recv_msg(sock[(size_t)r], M_RESULT, NULL).value;

  uint64_t total_bad = 0;
  size_t bytes = o->mib << 20;
  for (int r = 0; r < n; r++) {
    int nx = (r + 1) % n;
    printf("  rank %d (GPU%d) wrote %zu MiB into rank %d's buffer (GPU%d) by "
           "kernel: median %.3f ms, %.1f GB/s; rank %d verified %zu bytes: "
           "%s\n", r, r, o->mib, nx, nx, ms[(size_t)r],
           (double)bytes / (ms[(size_t)r] * 1e6), nx, bytes,
           bad[(size_t)nx] == 0 ? "all correct" : "MISMATCHES");
    total_bad += bad[(size_t)r];
  }
  for (int r = 1; r < n; r++)
    send_msg(sock[(size_t)r], M_EXIT, NULL, -1);
  rank_release(&s);
  int failed = 0;
  for (int r = 1; r < n; r++) {
    int st = 0;
    waitpid(pid[(size_t)r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "ring_ipc: rank %d failed (status 0x%x)\n", r, st);
      failed = 1;
    }
    close(sock[(size_t)r]);
  }
  if (total_bad != 0 || failed) {
    printf("ring_ipc: FAILED: %llu 16-byte words wrong\n",
           (unsigned long long)total_bad);
    return 1;
  }
  printf("ring_ipc: OK\n");
  return 0;
}

static gpuipc_kind_t parse_kind(const char *s)
{
  if (strcmp(s, "vmm") == 0)
    return GPUIPC_KIND_VMM;
  if (strcmp(s, "legacy") == 0)
    return GPUIPC_KIND_LEGACY;
  if (strcmp(s, "pool") == 0)
    return GPUIPC_KIND_POOL;
  fprintf(stderr, "ring_ipc: unknown kind %s (vmm, legacy, pool)\n", s);
  exit(2);
}

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IOLBF, 0);
  struct opts o = {GPUIPC_KIND_VMM, 256, 20, 0};
  int fd = -1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (v == NULL) {
      fprintf(stderr, "ring_ipc: %s needs a value\n", a);
      return 2;
    }
    if (strcmp(a, "--kind") == 0)
      o.kind = parse_kind(v);
    else if (strcmp(a, "--mib") == 0)
      o.mib = strtoull(v, NULL, 0);
    else if (strcmp(a, "--iters") == 0)
      o.iters = atoi(v);
    else if (strcmp(a, "--ranks") == 0)
      o.ranks = atoi(v);
    else if (strcmp(a, "--rank") == 0)
      g_rank = atoi(v);
    else if (strcmp(a, "--fd") == 0)
      fd = atoi(v);
    else {
      fprintf(stderr, "usage: ring_ipc [--kind vmm|legacy|pool] [--mib M] "
                      "[--iters I] [--ranks N]\n");
      return 2;
    }
    i++;
  }
  if (o.mib == 0 || o.iters <= 0) {
    fprintf(stderr, "ring_ipc: --mib and --iters must be positive\n");
    return 2;
  }
  if (fd >= 0)
    return run_child(fd, &o);
  if (gpuipc_driver_status(NULL) != 0) {
    fprintf(stderr, "ring_ipc: no GPU: %s\n", gpuipc_last_error());
    return 1;
  }
  int have = gpuipc_device_count();
  if (o.ranks <= 0 || o.ranks > have)
    o.ranks = have;
  return run_hub(&o, argv[0]);
}
