/*
 * The device table: every visible device, read once when the driver loads
 * and never changed afterwards (except each device's primary context, which
 * ctx.c retains on first use).
 */
#include "cuda/cuda.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Written once by gpuipc__dev_table_read, inside the loader's pthread_once;
 * read only after it. */
static struct gpuipc__dev *devs;
static int ndev;

/* Callers must fill at least everything up to the UUID string. */
#define INFO_MIN_SIZE                                                          \
  (offsetof(gpuipc_device_info_t, uuid_str) +                                  \
   sizeof(((gpuipc_device_info_t *)0)->uuid_str))

void gpuipc__uuid_str(const uint8_t uuid[16], char out[41])
{
  static const char hex[] = "0123456789abcdef";
  char *p = out;
  memcpy(p, "GPU-", 4);
  p += 4;
  for (int i = 0; i < 16; i++) {
    if (i == 4 || i == 6 || i == 8 || i == 10)
      *p++ = '-';
    *p++ = hex[uuid[i] >> 4];
    *p++ = hex[uuid[i] & 0xf];
  }
  *p = '\0';
}

int gpuipc_uuid_str(const uint8_t uuid[16], char out[41])
{
  if (uuid == NULL || out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_uuid_str: NULL %s",
                       uuid == NULL ? "uuid" : "out");
  gpuipc__uuid_str(uuid, out);
  return 0;
}

#if GPUIPC_HAVE_CUDA

/* An attribute that only describes a feature: 0 when the driver cannot say
 * (an older driver does not know the newer attributes). */
static int feature_attr(CUdevice dev, int ordinal, CUdevice_attribute attr,
                        const char *what)
{
  int v = 0;
  CUresult r = gpuipc__cu.cuDeviceGetAttribute(&v, attr, dev);
  if (r != CUDA_SUCCESS) {
    GPUIPC_LOG_D("device %d: cuDeviceGetAttribute(%s) failed (%d): taken as 0",
                 ordinal, what, (int)r);
    return 0;
  }
  return v;
}

static uint64_t vmm_granularity(CUdevice dev, int ordinal)
{
  if (gpuipc__cu.cuMemGetAllocationGranularity == NULL)
    return 0;
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof(prop));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = (int)dev;
  size_t g = 0;
  CUresult r = gpuipc__cu.cuMemGetAllocationGranularity(
      &g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r != CUDA_SUCCESS) {
    GPUIPC_LOG_D("device %d: cuMemGetAllocationGranularity failed (%d)",
                 ordinal, (int)r);
    return 0;
  }
  return g;
}

/* A query the table cannot do without: on failure, say which and stop. */
#define DEV_CALL(fn, ...)                                                      \
  do {                                                                         \
    if (GPUIPC_CU(fn, __VA_ARGS__) != 0) {                                     \
      gpuipc__why(why, cap, "device %d: %s", ordinal, gpuipc_last_error());    \
      return GPUIPC_E_NODRIVER;                                                \
    }                                                                          \
  } while (0)

static int dev_read(int ordinal, struct gpuipc__dev *d, char *why, size_t cap)
{
  gpuipc_device_info_t *in = &d->info;
  CUdevice dev;
  CUuuid uuid;
  size_t total = 0;

  DEV_CALL(cuDeviceGet, &dev, ordinal);
  d->ordinal = ordinal;
  d->cu_dev = dev;
  in->size = sizeof(*in);
  in->ordinal = ordinal;

  DEV_CALL(cuDeviceGetName, in->name, (int)sizeof(in->name), dev);
  in->name[sizeof(in->name) - 1] = '\0';

  DEV_CALL(cuDeviceGetUuid, &uuid, dev);
  memcpy(in->uuid, uuid.bytes, sizeof(in->uuid));
  gpuipc__uuid_str(in->uuid, in->uuid_str);

  /* The driver writes upper-case hex; sysfs names the device in lower case
   * (/sys/bus/pci/devices/0000:3b:00.0), and so does gpuipc. */
  DEV_CALL(cuDeviceGetPCIBusId, in->pci_bus_id, (int)sizeof(in->pci_bus_id),
           dev);
  in->pci_bus_id[sizeof(in->pci_bus_id) - 1] = '\0';
  for (char *c = in->pci_bus_id; *c != '\0'; c++)
    *c = (char)tolower((unsigned char)*c);

  DEV_CALL(cuDeviceTotalMem, &total, dev);
  in->total_mem = total;

  DEV_CALL(cuDeviceGetAttribute, &in->cc_major,
           CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  DEV_CALL(cuDeviceGetAttribute, &in->cc_minor,
           CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);

#define FEATURE(attr)                                                          \
  feature_attr(dev, ordinal, CU_DEVICE_ATTRIBUTE_##attr, #attr)
  in->vmm = FEATURE(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
  in->posix_fd = FEATURE(HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);
  in->fabric = FEATURE(HANDLE_TYPE_FABRIC_SUPPORTED);
  in->ipc_events = FEATURE(IPC_EVENT_SUPPORTED);
  in->mem_pools = FEATURE(MEMORY_POOLS_SUPPORTED);
  in->pool_handle_types =
      in->mem_pools ? FEATURE(MEMPOOL_SUPPORTED_HANDLE_TYPES) : 0;
  in->unified_addressing = FEATURE(UNIFIED_ADDRESSING);
#undef FEATURE
  in->granularity = in->vmm ? vmm_granularity(dev, ordinal) : 0;

  GPUIPC_LOG_I("device %d: %s %s %s, %llu bytes, sm_%d%d, vmm %d posix-fd %d "
               "fabric %d ipc-events %d pools %d (0x%x), granularity %llu",
               ordinal, in->uuid_str, in->name, in->pci_bus_id,
               (unsigned long long)in->total_mem, in->cc_major, in->cc_minor,
               in->vmm, in->posix_fd, in->fabric, in->ipc_events, in->mem_pools,
               (unsigned)in->pool_handle_types,
               (unsigned long long)in->granularity);
  return 0;
}
#undef DEV_CALL

int gpuipc__dev_table_read(char *why, size_t cap)
{
  int n = 0;
  CUresult r = gpuipc__cu.cuDeviceGetCount(&n);
  if (r != CUDA_SUCCESS) {
    gpuipc__cu_check(r, "cuDeviceGetCount");
    gpuipc__why(why, cap, "%s", gpuipc_last_error());
    return GPUIPC_E_NODRIVER;
  }
  if (n <= 0) {
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    gpuipc__why(why, cap, "the CUDA driver sees no device%s%s%s",
                vis != NULL ? " (CUDA_VISIBLE_DEVICES=\"" : "",
                vis != NULL ? vis : "", vis != NULL ? "\")" : "");
    return GPUIPC_E_NODEVICE;
  }
  struct gpuipc__dev *t = calloc((size_t)n, sizeof(*t));
  if (t == NULL) {
    gpuipc__why(why, cap, "no memory for a table of %d devices", n);
    return GPUIPC_E_NODRIVER;
  }
  for (int i = 0; i < n; i++) {
    int rc = dev_read(i, &t[i], why, cap);
    if (rc != 0) {
      free(t);
      return rc;
    }
  }
  devs = t;
  ndev = n;
  return 0;
}

#else /* !GPUIPC_HAVE_CUDA */

int gpuipc__dev_table_read(char *why, size_t cap)
{
  gpuipc__why(why, cap, "gpuipc was built without CUDA headers");
  return GPUIPC_E_NODRIVER;
}

#endif /* GPUIPC_HAVE_CUDA */

int gpuipc__dev_count(void)
{
  return gpuipc__cuda_load() == 0 ? ndev : 0;
}

const struct gpuipc__dev *gpuipc__dev_get(int ordinal)
{
  if (gpuipc__cuda_load() != 0 || ordinal < 0 || ordinal >= ndev)
    return NULL;
  return &devs[ordinal];
}

int gpuipc_device_count(void)
{
  return gpuipc__dev_count();
}

int gpuipc_device_info(int ordinal, gpuipc_device_info_t *out)
{
  if (out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_device_info: out is NULL");
  size_t size = out->size;
  if (size < INFO_MIN_SIZE)
    return gpuipc__err(-EINVAL,
                       "gpuipc_device_info: out->size is %zu, less than the "
                       "%zu bytes up to uuid_str (set it to "
                       "sizeof(gpuipc_device_info_t))",
                       size, (size_t)INFO_MIN_SIZE);
  int rc = gpuipc__cuda_load();
  if (rc == GPUIPC_E_NODEVICE) {
    char why[512];
    snprintf(why, sizeof(why), "%s", gpuipc_last_error());
    return gpuipc__err(-ERANGE, "gpuipc_device_info: no device %d: %s", ordinal,
                       why);
  }
  if (rc != 0)
    return rc;
  if (ordinal < 0 || ordinal >= ndev)
    return gpuipc__err(-ERANGE,
                       "gpuipc_device_info: ordinal %d is not a visible "
                       "device (this process sees %d)",
                       ordinal, ndev);
  gpuipc_device_info_t copy = devs[ordinal].info;
  copy.size = size;
  memcpy(out, &copy, size < sizeof(copy) ? size : sizeof(copy));
  return 0;
}

int gpuipc_device_by_uuid(const uint8_t uuid[16])
{
  if (uuid == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_device_by_uuid: uuid is NULL");
  int rc = gpuipc__cuda_load();
  if (rc != 0)
    return rc;
  for (int i = 0; i < ndev; i++)
    if (memcmp(devs[i].info.uuid, uuid, sizeof(devs[i].info.uuid)) == 0)
      return i;
  char s[41];
  gpuipc__uuid_str(uuid, s);
  return gpuipc__err(GPUIPC_E_NODEVICE,
                     "gpuipc_device_by_uuid: no visible device is %s (this "
                     "process sees %d; CUDA_VISIBLE_DEVICES may hide it)",
                     s, ndev);
}

#if GPUIPC_HAVE_CUDA
int gpuipc__dev_ordinal(CUdevice dev)
{
  for (int i = 0; i < gpuipc__dev_count(); i++)
    if (devs[i].cu_dev == dev)
      return i;
  return -1;
}
#endif

int gpuipc__device_current(void)
{
  int rc = gpuipc__cuda_load();
  if (rc != 0)
    return rc;
#if GPUIPC_HAVE_CUDA
  CUcontext ctx = NULL;
  rc = GPUIPC_CU(cuCtxGetCurrent, &ctx);
  if (rc != 0)
    return rc;
  if (ctx == NULL)
    return gpuipc__err(GPUIPC_E_NODEVICE, "gpuipc__device_current: no CUDA "
                                          "context is current on this thread");
  CUdevice dev;
  rc = GPUIPC_CU(cuCtxGetDevice, &dev);
  if (rc != 0)
    return rc;
  int i = gpuipc__dev_ordinal(dev);
  if (i >= 0)
    return i;
#endif
  return gpuipc__err(GPUIPC_E_NODEVICE, "gpuipc__device_current: the current "
                                        "context's device is not visible");
}
