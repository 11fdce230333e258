/*
 * NVML, loaded at run time: link types and NVLink counts for the topology.
 * Optional: without libnvidia-ml.so.1 the topology has the driver's P2P
 * attributes only. The few declarations used are written here, so the build
 * needs no nvml.h; they follow NVML's stable ABI (nvmlPciInfo_t as of
 * nvmlDeviceGetPciInfo_v3 and nvmlDeviceGetNvLinkRemotePciInfo_v2).
 */
#include "cuda/peer.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

typedef struct gpuipc__nvml_device *nvml_device_t;
typedef int nvml_return_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_FEATURE_ENABLED 1
#define NVML_P2P_CAPS_INDEX_NVLINK 2
#define NVML_P2P_STATUS_OK 0
#define NVML_NVLINK_DEVICE_TYPE_SWITCH 0x02
/* NVML_NVLINK_MAX_LINKS has grown over the years; ask until NVML says no. */
#define NVML_LINKS_TRY 64

/* nvmlGpuTopologyLevel_t */
#define NVML_TOPOLOGY_INTERNAL 0
#define NVML_TOPOLOGY_SINGLE 10
#define NVML_TOPOLOGY_MULTIPLE 20
#define NVML_TOPOLOGY_HOSTBRIDGE 30
#define NVML_TOPOLOGY_NODE 40
#define NVML_TOPOLOGY_SYSTEM 50

struct nvml_pci_info {
  char bus_id_legacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pci_device_id;
  unsigned int pci_subsystem_id;
  char bus_id[32];
};

static struct {
  nvml_return_t (*init)(void);
  const char *(*error_string)(nvml_return_t);
  nvml_return_t (*by_uuid)(const char *, nvml_device_t *);
  nvml_return_t (*pci_info)(nvml_device_t, struct nvml_pci_info *);
  nvml_return_t (*common_ancestor)(nvml_device_t, nvml_device_t, int *);
  nvml_return_t (*link_state)(nvml_device_t, unsigned, int *);
  nvml_return_t (*link_remote_pci)(nvml_device_t, unsigned,
                                   struct nvml_pci_info *);
  /* optional */
  nvml_return_t (*link_remote_type)(nvml_device_t, unsigned, int *);
  nvml_return_t (*p2p_status)(nvml_device_t, nvml_device_t, int, int *);
} nvml;

static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static int nvml_rc;
static char nvml_why[256];

#define NVML_FAIL(...)                                                         \
  do {                                                                         \
    snprintf(nvml_why, sizeof(nvml_why), __VA_ARGS__);                         \
    nvml_rc = GPUIPC_E_UNSUPPORTED;                                            \
  } while (0)

static void nvml_open(void)
{
  if (gpuipc__cfg_long(GPUIPC_CFG_NO_CUDA, 0) == 1) {
    NVML_FAIL("NVML not loaded: GPUIPC_NO_CUDA=1");
    return;
  }
  if (gpuipc__cfg_check(GPUIPC_CFG_NO_CUDA) != 0) {
    NVML_FAIL("NVML not loaded: %s", gpuipc_last_error());
    return;
  }
  void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    const char *e = dlerror();
    NVML_FAIL("NVML not available: dlopen(libnvidia-ml.so.1): %s",
              e != NULL ? e : "failed");
    return;
  }
  static const struct {
    const char *name;
    size_t off;
    int required;
  } syms[] = {
#define S(field, name, req) {name, offsetof(__typeof__(nvml), field), req}
      S(init, "nvmlInit_v2", 1),
      S(error_string, "nvmlErrorString", 1),
      S(by_uuid, "nvmlDeviceGetHandleByUUID", 1),
      S(pci_info, "nvmlDeviceGetPciInfo_v3", 1),
      S(common_ancestor, "nvmlDeviceGetTopologyCommonAncestor", 1),
      S(link_state, "nvmlDeviceGetNvLinkState", 1),
      S(link_remote_pci, "nvmlDeviceGetNvLinkRemotePciInfo_v2", 1),
      S(link_remote_type, "nvmlDeviceGetNvLinkRemoteDeviceType", 0),
      S(p2p_status, "nvmlDeviceGetP2PStatus", 0),
#undef S
  };
  for (size_t i = 0; i < GPUIPC__ARRAY_SIZE(syms); i++) {
    void *f = dlsym(lib, syms[i].name);
    if (f == NULL && syms[i].required) {
      NVML_FAIL("NVML too old: libnvidia-ml.so.1 lacks %s", syms[i].name);
      memset(&nvml, 0, sizeof(nvml));
      return; /* the library stays loaded: it may be loaded elsewhere */
    }
    memcpy((char *)&nvml + syms[i].off, &f, sizeof(f));
  }
  nvml_return_t r = nvml.init();
  if (r != NVML_SUCCESS) {
    NVML_FAIL("NVML not usable: nvmlInit_v2: %s", nvml.error_string(r));
    memset(&nvml, 0, sizeof(nvml));
    return;
  }
  GPUIPC_LOG_D("NVML loaded");
}

int gpuipc__nvml_load(void)
{
  pthread_once(&nvml_once, nvml_open);
  if (nvml_rc != 0)
    return gpuipc__err(nvml_rc, "%s", nvml_why);
  return 0;
}

static int same_pci(const struct nvml_pci_info *x, const struct nvml_pci_info *y)
{
  return x->domain == y->domain && x->bus == y->bus && x->device == y->device;
}

/*
 * Count @d's active NVLinks: those whose far end is the GPU at @peer_pci
 * (@direct) and those that end at an NVSwitch (@switched).
 */
static void count_links(nvml_device_t d, const struct nvml_pci_info *peer_pci,
                        int *direct, int *switched)
{
  *direct = 0;
  *switched = 0;
  for (unsigned l = 0; l < NVML_LINKS_TRY; l++) {
    int active = 0;
    nvml_return_t r = nvml.link_state(d, l, &active);
    if (r == NVML_ERROR_INVALID_ARGUMENT)
      break; /* past the last link */
    if (r != NVML_SUCCESS || active != NVML_FEATURE_ENABLED)
      continue;
    int type = -1;
    if (nvml.link_remote_type != NULL &&
        nvml.link_remote_type(d, l, &type) == NVML_SUCCESS &&
        type == NVML_NVLINK_DEVICE_TYPE_SWITCH) {
      (*switched)++;
      continue;
    }
    struct nvml_pci_info far;
    memset(&far, 0, sizeof(far));
    if (nvml.link_remote_pci(d, l, &far) != NVML_SUCCESS)
      continue;
    if (same_pci(&far, peer_pci))
      (*direct)++;
  }
}

int gpuipc__nvml_link(const struct gpuipc__dev *a, const struct gpuipc__dev *b,
                      gpuipc_link_t *link, int *nvlinks)
{
  int rc = gpuipc__nvml_load();
  if (rc != 0)
    return rc;
  nvml_device_t da, db;
  nvml_return_t r = nvml.by_uuid(a->info.uuid_str, &da);
  if (r == NVML_SUCCESS)
    r = nvml.by_uuid(b->info.uuid_str, &db);
  if (r != NVML_SUCCESS)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED,
                       "nvmlDeviceGetHandleByUUID(%s / %s): %s",
                       a->info.uuid_str, b->info.uuid_str,
                       nvml.error_string(r));
  if (a == b || da == db) {
    *link = GPUIPC_LINK_SELF;
    *nvlinks = 0;
    return 0;
  }
  struct nvml_pci_info pa, pb;
  memset(&pa, 0, sizeof(pa));
  memset(&pb, 0, sizeof(pb));
  r = nvml.pci_info(da, &pa);
  if (r == NVML_SUCCESS)
    r = nvml.pci_info(db, &pb);
  if (r != NVML_SUCCESS)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED, "nvmlDeviceGetPciInfo_v3: %s",
                       nvml.error_string(r));

  int direct_a, sw_a, direct_b, sw_b;
  count_links(da, &pb, &direct_a, &sw_a);
  count_links(db, &pa, &direct_b, &sw_b);
  int n = direct_a > direct_b ? direct_a : direct_b;
  if (n == 0 && sw_a > 0 && sw_b > 0) {
    /* Both reach NVSwitches: connected if NVML says NVLink P2P works. */
    int st = NVML_P2P_STATUS_OK;
    if (nvml.p2p_status == NULL ||
        nvml.p2p_status(da, db, NVML_P2P_CAPS_INDEX_NVLINK, &st) !=
            NVML_SUCCESS ||
        st == NVML_P2P_STATUS_OK)
      n = sw_a < sw_b ? sw_a : sw_b;
  }
  *nvlinks = n;
  if (n > 0) {
    *link = GPUIPC_LINK_NVLINK;
    return 0;
  }
  int level = -1;
  r = nvml.common_ancestor(da, db, &level);
  if (r != NVML_SUCCESS)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED,
                       "nvmlDeviceGetTopologyCommonAncestor: %s",
                       nvml.error_string(r));
  switch (level) {
  case NVML_TOPOLOGY_INTERNAL:
  case NVML_TOPOLOGY_SINGLE:
    *link = GPUIPC_LINK_PIX;
    break;
  case NVML_TOPOLOGY_MULTIPLE:
    *link = GPUIPC_LINK_PXB;
    break;
  case NVML_TOPOLOGY_HOSTBRIDGE:
    *link = GPUIPC_LINK_PHB;
    break;
  case NVML_TOPOLOGY_NODE:
    *link = GPUIPC_LINK_NODE;
    break;
  default:
    *link = GPUIPC_LINK_SYS;
    break;
  }
  return 0;
}
