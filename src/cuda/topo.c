/*
 * Topology: devices by UUID, the peer-to-peer matrix, peer access.
 */
#include "cuda/peer.h"

#include <stdatomic.h>
#include <string.h>

const char *gpuipc_link_name(gpuipc_link_t link)
{
  switch (link) {
  case GPUIPC_LINK_SELF:
    return "X";
  case GPUIPC_LINK_NVLINK:
    return "NV";
  case GPUIPC_LINK_PIX:
    return "PIX";
  case GPUIPC_LINK_PXB:
    return "PXB";
  case GPUIPC_LINK_PHB:
    return "PHB";
  case GPUIPC_LINK_NODE:
    return "NODE";
  case GPUIPC_LINK_SYS:
    return "SYS";
  default:
    return "?";
  }
}

int gpuipc_topo_nvml(void)
{
  return gpuipc__nvml_load();
}

int gpuipc__dev_check(int ordinal, const char *who)
{
  int rc = gpuipc__cuda_load();
  if (rc != 0)
    return rc;
  int n = gpuipc__dev_count();
  if (ordinal < 0 || ordinal >= n)
    return gpuipc__err(-ERANGE, "%s: device %d is not visible (%d device%s)",
                       who, ordinal, n, n == 1 ? "" : "s");
  return 0;
}

#if GPUIPC_HAVE_CUDA

#define MAX_DEV 64

/* 0 not asked yet, 1 yes, 2 no. */
static _Atomic unsigned char can_access[MAX_DEV][MAX_DEV];
static _Atomic unsigned char peer_on[MAX_DEV][MAX_DEV];

int gpuipc__p2p_check(int src, int dst, const char *who)
{
  if (src == dst)
    return 0;
  const struct gpuipc__dev *s = gpuipc__dev_get(src);
  const struct gpuipc__dev *d = gpuipc__dev_get(dst);
  if (s == NULL || d == NULL || src >= MAX_DEV || dst >= MAX_DEV)
    return gpuipc__err(-ERANGE, "%s: device %d or %d is not visible", who,
                       src, dst);
  unsigned char v = atomic_load_explicit(&can_access[src][dst],
                                         memory_order_relaxed);
  if (v == 0) {
    if (gpuipc__cu.cuDeviceCanAccessPeer == NULL)
      return gpuipc__err(GPUIPC_E_UNSUPPORTED,
                         "%s: the driver lacks cuDeviceCanAccessPeer", who);
    int can = 0;
    int rc = GPUIPC_CU(cuDeviceCanAccessPeer, &can, s->cu_dev, d->cu_dev);
    if (rc != 0)
      return rc;
    v = can ? 1 : 2;
    atomic_store_explicit(&can_access[src][dst], v, memory_order_relaxed);
  }
  if (v == 2)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED,
                       "%s: GPU %d (%s) cannot access memory on GPU %d (%s): "
                       "no peer-to-peer path between them",
                       who, src, s->info.uuid_str, dst, d->info.uuid_str);
  return 0;
}

static int p2p_attr(CUdevice_P2PAttribute attr, const struct gpuipc__dev *s,
                    const struct gpuipc__dev *d, int *out)
{
  int v = 0;
  int rc = GPUIPC_CU(cuDeviceGetP2PAttribute, &v, attr, s->cu_dev, d->cu_dev);
  if (rc == 0)
    *out = v;
  return rc;
}

int gpuipc_topo_p2p(int src, int dst, gpuipc_p2p_t *out)
{
  if (out == NULL || out->size < sizeof(gpuipc_p2p_t))
    return gpuipc__err(-EINVAL, "gpuipc_topo_p2p: out is NULL or its size "
                                "is not sizeof(gpuipc_p2p_t)");
  int rc = gpuipc__dev_check(src, "gpuipc_topo_p2p");
  if (rc == 0)
    rc = gpuipc__dev_check(dst, "gpuipc_topo_p2p");
  if (rc != 0)
    return rc;
  const struct gpuipc__dev *s = gpuipc__dev_get(src);
  const struct gpuipc__dev *d = gpuipc__dev_get(dst);
  gpuipc_p2p_t r;
  memset(&r, 0, sizeof(r));
  r.size = sizeof(r);
  r.link = GPUIPC_LINK_UNKNOWN;
  r.nvlinks = -1;
  if (src == dst) {
    r.access = 1;
    r.native_atomics = 1;
    r.cuda_arrays = 1;
    r.link = GPUIPC_LINK_SELF;
    r.nvlinks = 0;
    *out = r;
    return 0;
  }
  if (gpuipc__cu.cuDeviceGetP2PAttribute == NULL)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED,
                       "gpuipc_topo_p2p: the driver lacks "
                       "cuDeviceGetP2PAttribute");
  rc = p2p_attr(CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, s, d, &r.access);
  if (rc == 0)
    rc = p2p_attr(CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK, s, d,
                  &r.perf_rank);
  if (rc == 0)
    rc = p2p_attr(CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED, s, d,
                  &r.native_atomics);
  if (rc == 0)
    rc = p2p_attr(CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED, s, d,
                  &r.cuda_arrays);
  if (rc != 0)
    return rc;
  gpuipc_link_t link;
  int n;
  if (gpuipc__nvml_link(s, d, &link, &n) == 0) {
    r.link = link;
    r.nvlinks = n;
  }
  *out = r;
  return 0;
}

int gpuipc_peer_enable(int src, int dst)
{
  int rc = gpuipc__dev_check(src, "gpuipc_peer_enable");
  if (rc == 0)
    rc = gpuipc__dev_check(dst, "gpuipc_peer_enable");
  if (rc != 0)
    return rc;
  if (src == dst)
    return 0;
  if (src >= MAX_DEV || dst >= MAX_DEV)
    return gpuipc__err(-ERANGE, "gpuipc_peer_enable: at most %d devices",
                       MAX_DEV);
  if (atomic_load_explicit(&peer_on[src][dst], memory_order_acquire))
    return 0;
  rc = gpuipc__p2p_check(src, dst, "gpuipc_peer_enable");
  if (rc != 0)
    return rc;
  if (gpuipc__cu.cuCtxEnablePeerAccess == NULL)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED,
                       "gpuipc_peer_enable: the driver lacks "
                       "cuCtxEnablePeerAccess");

  /* The peer's primary context, retained by entering it once. */
  struct gpuipc__ctx_saved saved;
  rc = gpuipc__ctx_enter(dst, &saved);
  if (rc != 0)
    return rc;
  CUcontext peer = NULL;
  rc = GPUIPC_CU(cuCtxGetCurrent, &peer);
  gpuipc__ctx_leave(&saved);
  if (rc != 0)
    return rc;

  rc = gpuipc__ctx_enter(src, &saved);
  if (rc != 0)
    return rc;
  CUresult r = gpuipc__cu.cuCtxEnablePeerAccess(peer, 0);
  gpuipc__ctx_leave(&saved);
  if (r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
    r = CUDA_SUCCESS;
  if (r == CUDA_ERROR_PEER_ACCESS_UNSUPPORTED || r == CUDA_ERROR_TOO_MANY_PEERS)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED,
                       "gpuipc_peer_enable(%d -> %d): cuCtxEnablePeerAccess "
                       "refused (%s)",
                       src, dst,
                       r == CUDA_ERROR_TOO_MANY_PEERS ? "too many peers"
                                                      : "unsupported");
  rc = gpuipc__cu_check(r, "cuCtxEnablePeerAccess");
  if (rc != 0)
    return rc;
  atomic_store_explicit(&peer_on[src][dst], 1, memory_order_release);
  return 0;
}

#else /* !GPUIPC_HAVE_CUDA */

int gpuipc__p2p_check(int src, int dst, const char *who)
{
  return gpuipc__err(GPUIPC_E_UNSUPPORTED, "%s: built without CUDA", who);
}

int gpuipc_topo_p2p(int src, int dst, gpuipc_p2p_t *out)
{
  if (out == NULL || out->size < sizeof(gpuipc_p2p_t))
    return gpuipc__err(-EINVAL, "gpuipc_topo_p2p: out is NULL or its size "
                                "is not sizeof(gpuipc_p2p_t)");
  int rc = gpuipc__dev_check(src, "gpuipc_topo_p2p");
  return rc != 0 ? rc
                 : gpuipc__err(GPUIPC_E_UNSUPPORTED,
                               "gpuipc_topo_p2p: built without CUDA");
}

int gpuipc_peer_enable(int src, int dst)
{
  int rc = gpuipc__dev_check(src, "gpuipc_peer_enable");
  return rc != 0 ? rc
                 : gpuipc__err(GPUIPC_E_UNSUPPORTED,
                               "gpuipc_peer_enable: built without CUDA");
}

#endif
