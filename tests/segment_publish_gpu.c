/*
 * The publication of a GPU segment is ordered by an interprocess event:
 * for VMM, LEGACY and POOL, a creator opens a segment with GPUIPC_CREATE,
 * fills it through the driver and publishes it; a reader waiting with
 * GPUIPC_WAIT on the same GPU returns only then (its open imports the
 * event its creator recorded and makes its stream wait for it, or sees it
 * complete) and reads every byte. Needs a GPU (exit 77 without one).
 */
#include "gpu_test.h"

#if GPUIPC_HAVE_CUDA

#define SIZE ((size_t)3 << 20)

static void share(gpuipc_domain_t *dom, const char *kind, uint64_t seed)
{
  printf("--- %s: fill, publish, read on GPU 0\n", kind);
  fflush(stdout);
  struct peer c, r;
  peer_start(&c);
  peer_start(&r);
  PEER_OK(&c, "join segpubgpu");
  PEER_OK(&r, "join segpubgpu");
  char want[64];
  snprintf(want, sizeof(want), "ok 1 %zu", SIZE);
  PEER_EXPECT(&c, want, "fopen G %zu c %s 0", SIZE, kind);
  gpuipc_segment_info_t si = {.size = sizeof(si)};
  ASSERT_OK(gpuipc_segment_stat(dom, "G", &si));
  ASSERT_EQ(si.state, GPUIPC_SEG_FILLING);
  peer_send(&r, "fopen G 0 w %s 0", kind);
  PEER_OK(&c, "gfill G %llu", (unsigned long long)seed);
  struct pollfd pf = {.fd = r.out, .events = POLLIN};
  ASSERT_EQ(poll(&pf, 1, 0), 0); /* not published yet */
  PEER_OK(&c, "publish G");
  const char *rep = peer_read(&r, PEER_REPLY_MS);
  snprintf(want, sizeof(want), "ok 0 %zu", SIZE);
  if (strcmp(rep, want) != 0)
    TFAIL("reader: %s", rep);
  PEER_OK(&r, "gcheck G %llu", (unsigned long long)seed);
  ASSERT_OK(gpuipc_segment_stat(dom, "G", &si));
  ASSERT_EQ(si.state, GPUIPC_SEG_PUBLISHED);
  PEER_EXPECT(&c, "err EALREADY", "publish G");
  ASSERT_OK(gpuipc_segment_unlink(dom, "G"));
  PEER_OK(&r, "release G");
  PEER_OK(&c, "release G");
  peer_finish(&r);
  peer_finish(&c);
  printf("%s: the reader waited for the publication and read every byte\n",
         kind);
}

int main(void)
{
  test_require_gpus(1);
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("segpubgpu", NULL, &dom));
  static const struct {
    const char *name;
    gpuipc_kind_t kind;
  } kinds[] = {{"vmm", GPUIPC_KIND_VMM},
               {"legacy", GPUIPC_KIND_LEGACY},
               {"pool", GPUIPC_KIND_POOL}};
  for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
    if (gpuipc_kind_available(kinds[i].kind) != 0) {
      printf("NOTE: %s: %s\n", kinds[i].name, gpuipc_last_error());
      continue;
    }
    share(dom, kinds[i].name, 300 + i);
  }
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}

#else
GPU_TEST_NEEDS_CUDA_HEADER()
#endif
