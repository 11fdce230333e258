/*
 * Topology: the P2P matrix against the driver's own answers, NVML's link
 * type and NVLink count when it is installed, peer access, and
 * `gpuipc topo` (which must also fail cleanly without a GPU).
 */
#include "gpu_test.h"

#include <stdio.h>

#ifdef GPUIPC_CLI
/* Run `gpuipc topo ARGS`, returning its exit status and its stdout. */
static int run_cli(const char *args, char *out, size_t cap)
{
  char cmd[1024];
  snprintf(cmd, sizeof(cmd), "%s topo %s 2>&1", GPUIPC_CLI, args);
  return test_popen(cmd, out, cap);
}
#endif

static void check_cpu(void)
{
  ASSERT_STREQ(gpuipc_link_name(GPUIPC_LINK_SELF), "X");
  ASSERT_STREQ(gpuipc_link_name(GPUIPC_LINK_NVLINK), "NV");
  ASSERT_STREQ(gpuipc_link_name(GPUIPC_LINK_SYS), "SYS");
  ASSERT_STREQ(gpuipc_link_name((gpuipc_link_t)99), "?");
  gpuipc_p2p_t p;
  memset(&p, 0, sizeof(p));
  ASSERT_RC(gpuipc_topo_p2p(0, 0, NULL), -EINVAL);
  p.size = sizeof(p) - 1;
  ASSERT_RC(gpuipc_topo_p2p(0, 0, &p), -EINVAL);
}

int main(void)
{
  check_cpu();
#ifdef GPUIPC_CLI
  static char out[65536];
  if (gpuipc_driver_status(NULL) != 0) {
    /* No GPU: the tool says why and fails, in both forms. */
    ASSERT_EQ(run_cli("", out, sizeof(out)), 1);
    ASSERT_TRUE(strstr(out, "no GPU") != NULL);
    ASSERT_EQ(run_cli("--json", out, sizeof(out)), 1);
    ASSERT_TRUE(strstr(out, "\"error\"") != NULL);
  }
#endif
  test_require_gpus(1);
  int n = gpuipc_device_count();
  int nvml = gpuipc_topo_nvml();
  printf("NVML: %s\n", nvml == 0 ? "loaded" : gpuipc_last_error());

  gpuipc_p2p_t p;
  memset(&p, 0, sizeof(p));
  p.size = sizeof(p);
  ASSERT_OK(gpuipc_topo_p2p(0, 0, &p));
  ASSERT_EQ(p.access, 1);
  ASSERT_EQ(p.link, GPUIPC_LINK_SELF);
  ASSERT_RC(gpuipc_topo_p2p(0, n, &p), -ERANGE);
  ASSERT_RC(gpuipc_peer_enable(0, n), -ERANGE);
  ASSERT_OK(gpuipc_peer_enable(0, 0));

  for (int a = 0; a < n; a++)
    for (int b = 0; b < n; b++) {
      if (a == b)
        continue;
      ASSERT_OK(gpuipc_topo_p2p(a, b, &p));
#if GPUIPC_HAVE_CUDA
      int can = -1;
      ASSERT_OK(GPUIPC_CU(cuDeviceCanAccessPeer, &can,
                          gpuipc__dev_get(a)->cu_dev,
                          gpuipc__dev_get(b)->cu_dev));
      ASSERT_EQ(p.access, can);
#endif
      printf("GPU%d -> GPU%d: access %d, native atomics %d, perf rank %d, "
             "link %s, nvlinks %d\n", a, b, p.access, p.native_atomics,
             p.perf_rank, gpuipc_link_name(p.link), p.nvlinks);
      if (nvml == 0) {
        ASSERT_TRUE(p.link != GPUIPC_LINK_UNKNOWN && p.link != GPUIPC_LINK_SELF);
        if (p.link == GPUIPC_LINK_NVLINK)
          ASSERT_GT(p.nvlinks, 0);
        else
          ASSERT_EQ(p.nvlinks, 0);
      } else {
        ASSERT_EQ(p.link, GPUIPC_LINK_UNKNOWN);
        ASSERT_EQ(p.nvlinks, -1);
      }
      if (p.access) {
        ASSERT_OK(gpuipc_peer_enable(a, b));
        ASSERT_OK(gpuipc_peer_enable(a, b)); /* again: already on */
      } else {
        ASSERT_RC(gpuipc_peer_enable(a, b), GPUIPC_E_UNSUPPORTED);
      }
    }

#ifdef GPUIPC_CLI
  ASSERT_EQ(run_cli("", out, sizeof(out)), 0);
  printf("%s", out);
  ASSERT_TRUE(strstr(out, "Legend:") != NULL);
  ASSERT_TRUE(strstr(out, "GPU0") != NULL);
  ASSERT_EQ(run_cli("--json", out, sizeof(out)), 0);
  ASSERT_TRUE(strstr(out, "\"links\"") != NULL);
  ASSERT_TRUE(strstr(out, gpuipc__dev_get(0)->info.uuid_str) != NULL);
  ASSERT_EQ(run_cli("--bogus", out, sizeof(out)), 2);
#endif
  return 0;
}
