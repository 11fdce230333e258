/*
 * What the GPU tests share: starting the CUDA C helper processes, and
 * reading and writing device memory from the test through the driver that
 * gpuipc loaded.
 */
#ifndef GPUIPC_TEST_GPU_TEST_H
#define GPUIPC_TEST_GPU_TEST_H

#include "cuda/cuda.h"
#include "helpers/gpu_proto.h"
#include "helpers/seg_peer.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GPU_PROC_TIMEOUT_MS 120000

/* Skip unless the CUDA C helper @name was built (it needs nvcc). */
static inline void gpu_require_helper(const char *name)
{
  if (access(test_helper_path(name), X_OK) != 0)
    SKIP("the CUDA C helper %s was not built (no nvcc at configure time)",
         name);
}

/*
 * A GPU test's main() begins: stdout unbuffered, skipped without @ngpus
 * GPUs or CUDA C helper @helper, domain @domain joined (its broker here).
 */
static inline gpuipc_domain_t *gpu_test_begin(int ngpus, const char *helper,
                                              const char *domain)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  test_require_gpus(ngpus);
  gpu_require_helper(helper);
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join(domain, NULL, &dom));
  return dom;
}

/*
 * Start helper @helper as the sender (@sargs) and the receiver (@rargs) of
 * a channel; both must exit 0 (the receiver is waited for first).
 */
static inline void gpu_run_pair(const char *helper, const char *const *sargs,
                                const char *const *rargs)
{
  pid_t s = test_spawn(helper, sargs, NULL);
  pid_t r = test_spawn(helper, rargs, NULL);
  ASSERT_EQ(test_wait(r, GPU_PROC_TIMEOUT_MS), 0);
  ASSERT_EQ(test_wait(s, GPU_PROC_TIMEOUT_MS), 0);
}

static inline const char *gpu_fmt_int(char *buf, size_t cap, long long v)
{
  snprintf(buf, cap, "%lld", v);
  return buf;
}

/*
 * Run "gpu_peer export KIND EXP_DEV SIZE SEED <sock> MODE COUNT" and
 * "gpu_peer import IMP_DEV <sock> EXTRA..." joined by a socket pair, with
 * CUDA_VISIBLE_DEVICES=@imp_cvd for the importer when not NULL. Both must
 * exit 0. The exporter is waited for first.
 */
static inline void gpu_pair(const char *kind, int exp_dev, int imp_dev,
                            size_t size, uint64_t seed, const char *mode,
                            int count, const char *imp_cvd,
                            const char *const *extra)
{
  int sv[2];
  ASSERT_OK(gpuipc__sock_pair(sv));
  char d1[16], d2[16], sz[32], sd[32], s0[16], s1[16], cnt[16];
  const char *eargs[] = {"export", kind, gpu_fmt_int(d1, sizeof(d1), exp_dev),
                         gpu_fmt_int(sz, sizeof(sz), (long long)size),
                         gpu_fmt_int(sd, sizeof(sd), (long long)seed),
                         gpu_fmt_int(s0, sizeof(s0), sv[0]), mode,
                         gpu_fmt_int(cnt, sizeof(cnt), count), NULL};
  const char *iargs[16] = {"import", gpu_fmt_int(d2, sizeof(d2), imp_dev),
                           gpu_fmt_int(s1, sizeof(s1), sv[1])};
  int n = 3;
  for (; extra != NULL && *extra != NULL && n < 15; extra++)
    iargs[n++] = *extra;
  iargs[n] = NULL;
  int keep0[] = {sv[0], -1}, keep1[] = {sv[1], -1};
  printf("--- %s: exporter on GPU %d, importer on GPU %d%s%s\n", kind,
         exp_dev, imp_dev, imp_cvd != NULL ? ", CUDA_VISIBLE_DEVICES=" : "",
         imp_cvd != NULL ? imp_cvd : "");
  pid_t e = test_spawn("gpu_peer", eargs, keep0);
  if (imp_cvd != NULL)
    setenv("CUDA_VISIBLE_DEVICES", imp_cvd, 1);
  pid_t i = test_spawn("gpu_peer", iargs, keep1);
  if (imp_cvd != NULL)
    unsetenv("CUDA_VISIBLE_DEVICES");
  close(sv[0]);
  close(sv[1]);
  int est = test_wait(e, GPU_PROC_TIMEOUT_MS);
  int ist = test_wait(i, GPU_PROC_TIMEOUT_MS);
  ASSERT_EQ(est, 0);
  ASSERT_EQ(ist, 0);
}

/*
 * Start "gpu_peer export KIND DEV SIZE SEED <sock> exit", take the handle
 * it sends (with its fd) and wait until it has exited.
 */
static inline void gpu_export_and_exit(const char *kind, int dev, size_t size,
                                       uint64_t seed, gpuipc_handle_t *h)
{
  int sv[2];
  ASSERT_OK(gpuipc__sock_pair(sv));
  char d[16], sz[32], sd[32], s0[16];
  const char *args[] = {"export", kind, gpu_fmt_int(d, sizeof(d), dev),
                        gpu_fmt_int(sz, sizeof(sz), (long long)size),
                        gpu_fmt_int(sd, sizeof(sd), (long long)seed),
                        gpu_fmt_int(s0, sizeof(s0), sv[0]), "exit", "1",
                        NULL};
  int keep[] = {sv[0], -1};
  pid_t e = test_spawn("gpu_peer", args, keep);
  close(sv[0]);
  uint64_t got_seed = 0;
  proto_recv_handle(sv[1], h, &got_seed, NULL);
  ASSERT_EQ_U(got_seed, seed);
  ASSERT_EQ(test_wait(e, GPU_PROC_TIMEOUT_MS), 0);
  close(sv[1]);
}

/*
 * Start "gpu_peer import DEV <sock> EXTRA..." and return its pid; the test
 * talks to it through *@sock (the other end of the pair).
 */
static inline pid_t gpu_start_importer(int dev, const char *const *extra,
                                       int *sock)
{
  int sv[2];
  ASSERT_OK(gpuipc__sock_pair(sv));
  char d[16], s1[16];
  const char *args[16] = {"import", gpu_fmt_int(d, sizeof(d), dev),
                          gpu_fmt_int(s1, sizeof(s1), sv[1])};
  int n = 3;
  for (; extra != NULL && *extra != NULL && n < 15; extra++)
    args[n++] = *extra;
  args[n] = NULL;
  int keep[] = {sv[1], -1};
  pid_t p = test_spawn("gpu_peer", args, keep);
  close(sv[1]);
  *sock = sv[0];
  return p;
}

#if GPUIPC_HAVE_CUDA
/* Copy between host and device memory on local device @dev. */
static inline void gpu_copy(int dev, void *dst, const void *src, size_t n,
                            bool to_device)
{
  struct gpuipc__ctx_saved saved;
  ASSERT_OK(gpuipc__ctx_enter(dev, &saved));
  int rc = to_device
               ? GPUIPC_CU(cuMemcpyHtoD, (CUdeviceptr)(uintptr_t)dst, src, n)
               : GPUIPC_CU(cuMemcpyDtoH, dst, (CUdeviceptr)(uintptr_t)src, n);
  gpuipc__ctx_leave(&saved);
  ASSERT_OK(rc);
}

/* Fill @n device bytes at @p with pattern @seed (through the host). */
static inline void gpu_fill_host(int dev, void *p, size_t n, uint64_t seed)
{
  uint8_t *tmp = (uint8_t *)malloc(n);
  ASSERT_TRUE(tmp != NULL);
  test_fill(tmp, n, seed);
  gpu_copy(dev, p, tmp, n, true);
  free(tmp);
}

/* Check that @n device bytes at @p hold pattern @seed. */
static inline void gpu_expect(int dev, const void *p, size_t n, uint64_t seed)
{
  uint8_t *tmp = (uint8_t *)malloc(n);
  ASSERT_TRUE(tmp != NULL);
  gpu_copy(dev, tmp, p, n, false);
  size_t bad = test_check(tmp, n, seed);
  if (bad != (size_t)-1)
    TFAIL("device byte %zu of %zu is 0x%02x, pattern %llu says 0x%02x", bad,
          n, tmp[bad], (unsigned long long)seed, test_pattern(seed, bad));
  free(tmp);
}
#endif /* GPUIPC_HAVE_CUDA */

/* The reply of seg_peer's "live": LIVE KEPT. */
static inline void gpu_peer_live(struct peer *p, int live, int kept)
{
  const char *r = peer_cmd(p, "live");
  int l = -1, k = -1;
  if (sscanf(r, "ok %d %d", &l, &k) != 2)
    TFAIL("peer %d: live: %s", (int)p->pid, r);
  ASSERT_EQ(l, live);
  ASSERT_EQ(k, kept);
}

/*
 * Umpire's pattern with named segments, across processes and GPUs: a
 * creator on local GPU @cdev makes a @kind segment in domain @domain (which
 * this process joins first, to host the broker), fills it through the
 * driver and releases it at once. Afterwards two processes open it on
 * @odev and one on @cdev, and read the creator's bytes the way a program
 * does: cuMemcpyDtoH in the primary context of gpuipc_buf_device, which
 * must be the device each opened it for.
 * Memory its creator holds (LEGACY, POOL) must stay in the creator after
 * its release: kept until the segment is unlinked and released by all,
 * then freed (its registry empties). With @creator_exits (LEGACY) the
 * creator exits instead while the others hold it: they must hear
 * GPUIPC_E_PEER_GONE from gpuipc_buf_alive, and new opens GPUIPC_E_LOST.
 * VMM memory lives in descriptors: the creator frees its part at once.
 */
static inline void gpu_segment_share(const char *domain, const char *kind,
                                     int cdev, int odev, uint64_t seed,
                                     bool creator_exits)
{
  bool held = strcmp(kind, "legacy") == 0 || strcmp(kind, "pool") == 0;
  printf("--- %s segment: the creator on GPU %d releases it, then two "
         "processes on GPU %d and one on GPU %d open it%s\n", kind, cdev,
         odev, cdev, creator_exits ? "; the creator exits" : "");
  fflush(stdout);
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join(domain, NULL, &dom));
  const size_t size = 3000000;
  struct peer c, o[3];
  const int odevs[3] = {odev, odev, cdev};
  peer_start(&c);
  PEER_OK(&c, "join %s", domain);
  char want[64];
  snprintf(want, sizeof(want), "ok 1 %zu %d", size, cdev);
  PEER_EXPECT(&c, want, "gopen S %zu c %s %d", size, kind, cdev);
  PEER_OK(&c, "gfill S %llu", (unsigned long long)seed);
  PEER_OK(&c, "release S");
  gpu_peer_live(&c, held ? 1 : 0, held ? 1 : 0);

  for (int i = 0; i < 3; i++) {
    peer_start(&o[i]);
    PEER_OK(&o[i], "join %s", domain);
    snprintf(want, sizeof(want), "ok 0 %zu %d", size, odevs[i]);
    PEER_EXPECT(&o[i], want, "gopen S 0 - %s %d", kind, odevs[i]);
    PEER_OK(&o[i], "gcheck S %llu", (unsigned long long)seed);
  }
  gpuipc_segment_info_t si;
  memset(&si, 0, sizeof(si));
  si.size = sizeof(si);
  ASSERT_OK(gpuipc_segment_stat(dom, "S", &si));
  ASSERT_EQ(si.state, GPUIPC_SEG_PUBLISHED);
  ASSERT_EQ(si.nholders, 3);
  ASSERT_EQ(si.creator_held, held ? 1 : 0);
  ASSERT_EQ(si.keeper_pid, held ? (int)c.pid : 0);
  printf("%s segment: 3 processes read the bytes of pid %d, which %s\n",
         kind, (int)c.pid,
         held ? "keeps the memory after its release" : "released it");

  if (creator_exits) {
    PEER_OK(&c, "exit 0");
    ASSERT_EQ(test_wait(c.pid, PEER_REPLY_MS), 0);
    close(c.in);
    close(c.out);
    for (int i = 0; i < 3; i++) {
      const char *r = peer_cmd(&o[i], "waitgone S 20000");
      if (strncmp(r, "ok", 2) != 0)
        TFAIL("holder %d after the creator exited: %s", i, r);
      if (i == 0)
        printf("%s segment: after the creator exited, gpuipc_buf_alive: "
               "%s\n", kind, r + 3);
    }
    for (int t = 0; t < 3000; t++) {
      ASSERT_OK(gpuipc_segment_stat(dom, "S", &si));
      if (si.state == GPUIPC_SEG_LOST)
        break;
      usleep(2000);
    }
    ASSERT_EQ(si.state, GPUIPC_SEG_LOST);
    gpuipc_buf_t *b;
    ASSERT_RC(test_seg_open(dom, "S", 0, -1, 0, &b), GPUIPC_E_LOST);
    for (int i = 0; i < 3; i++) {
      /* The driver may or may not complain when closing dead memory. */
      printf("%s segment: holder %d releases the dead mapping: %s\n", kind,
             i, peer_cmd(&o[i], "release S"));
      peer_finish(&o[i]);
    }
    ASSERT_OK(gpuipc_segment_unlink(dom, "S")); /* the tombstone */
  } else {
    ASSERT_OK(gpuipc_segment_unlink(dom, "S"));
    for (int i = 0; i < 3; i++) {
      if (held)
        gpu_peer_live(&c, 1, 1);
      PEER_OK(&o[i], "release S");
      peer_finish(&o[i]);
    }
    PEER_EXPECT(&c, "ok 0 0", "waitlive 0 10000");
    printf("%s segment: unlinked and released by all: the creator freed "
           "it\n", kind);
    peer_finish(&c);
  }
  ASSERT_OK(gpuipc_domain_leave(dom));
}

/* The main() of a GPU test in a build without the CUDA header. */
#define GPU_TEST_NEEDS_CUDA_HEADER()                                           \
  int main(void)                                                               \
  {                                                                            \
    SKIP("gpuipc was built without the CUDA header: no GPU kinds");          \
  }

#endif
