/*
 * A fake CUDA driver (see fake_cuda.h). What the loader and the device
 * table use is implemented, and host registration, LEGACY device memory
 * (cuMemAlloc, shared between processes by cuIpcGetMemHandle /
 * cuIpcOpenMemHandle), copies, streams and events (interprocess ones too)
 * over host memory posing as device memory; every other entry
 * point resolves to a function that answers CUDA_ERROR_NOT_SUPPORTED and
 * must never be called by the tests that use this library.
 *
 * This file: initialisation, devices, contexts, host registration, and the
 * table of entry points cuGetProcAddress hands out; device memory is
 * fake_mem.c's, copies, streams and events fake_stream.c's
 * (fake_cuda_int.h).
 */
#include "fake_cuda_int.h"

struct CUctx_st fake_primary_ctx[FAKE_CUDA_MAX_DEV] = {{0}, {1}};
atomic_int fake_initialized;
atomic_int fake_before_init;
__thread CUcontext fake_current;
static atomic_int retains[FAKE_CUDA_MAX_DEV];
static atomic_int set_current_calls;

static CUresult fake_cuInit(unsigned int flags)
{
  if (flags != 0)
    return CUDA_ERROR_INVALID_VALUE;
  int r = env_int("FAKE_CUDA_INIT", 0);
  if (r != 0)
    return (CUresult)r;
  atomic_store(&fake_initialized, 1);
  return CUDA_SUCCESS;
}

static CUresult fake_cuDriverGetVersion(int *v)
{
  if (v == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  *v = version();
  return CUDA_SUCCESS;
}

static const struct {
  CUresult r;
  const char *name, *desc;
} errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED",
     "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE",
     "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE",
     "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT",
     "invalid device context"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED",
     "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult fake_cuGetErrorName(CUresult r, const char **s)
{
  for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
    if (errors[i].r == r) {
      *s = errors[i].name;
      return CUDA_SUCCESS;
    }
  *s = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

static CUresult fake_cuGetErrorString(CUresult r, const char **s)
{
  for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
    if (errors[i].r == r) {
      *s = errors[i].desc;
      return CUDA_SUCCESS;
    }
  *s = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

static CUresult fake_cuDeviceGetCount(int *n)
{
  NEED_INIT();
  *n = ndev();
  return CUDA_SUCCESS;
}

static CUresult fake_cuDeviceGet(CUdevice *d, int ordinal)
{
  NEED_INIT();
  NEED_DEV(ordinal);
  *d = ordinal;
  return CUDA_SUCCESS;
}

static CUresult fake_cuDeviceGetName(char *name, int len, CUdevice dev)
{
  NEED_INIT();
  NEED_DEV(dev);
  if (name == NULL || len <= 0)
    return CUDA_ERROR_INVALID_VALUE;
  snprintf(name, (size_t)len, "%s",
           dev == 0 ? FAKE_CUDA_NAME0 : FAKE_CUDA_NAME1);
  return CUDA_SUCCESS;
}

static CUresult fake_cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
  static const uint8_t u[FAKE_CUDA_MAX_DEV][16] = {FAKE_CUDA_UUID0,
                                                   FAKE_CUDA_UUID1};
  NEED_INIT();
  NEED_DEV(dev);
  memcpy(uuid->bytes, u[dev], 16);
  return CUDA_SUCCESS;
}

static CUresult fake_cuDeviceTotalMem(size_t *bytes, CUdevice dev)
{
  NEED_INIT();
  NEED_DEV(dev);
  *bytes = dev == 0 ? FAKE_CUDA_MEM0 : FAKE_CUDA_MEM1;
  return CUDA_SUCCESS;
}

static CUresult fake_cuDeviceGetPCIBusId(char *pci, int len, CUdevice dev)
{
  NEED_INIT();
  NEED_DEV(dev);
  if (pci == NULL || len < 13)
    return CUDA_ERROR_INVALID_VALUE;
  snprintf(pci, (size_t)len, "%s", dev == 0 ? FAKE_CUDA_PCI0 : FAKE_CUDA_PCI1);
  return CUDA_SUCCESS;
}

/* FAKE_CUDA_DEV1_OPS 1: device 1 is as able as device 0 (stream memory
 * operations, interprocess events, peer access). */
static bool dev1_ops(void)
{
  return env_int("FAKE_CUDA_DEV1_OPS", 0) == 1;
}

/* Peer access between the two devices only with dev1_ops (the memory is
 * host memory either way). */
static CUresult fake_cuDeviceCanAccessPeer(int *can, CUdevice dev,
                                           CUdevice peer)
{
  NEED_INIT();
  NEED_DEV(dev);
  NEED_DEV(peer);
  if (can == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  *can = dev != peer && dev1_ops();
  return CUDA_SUCCESS;
}

static CUresult fake_cuCtxEnablePeerAccess(CUcontext peer, unsigned flags)
{
  NEED_INIT();
  if (peer == NULL || flags != 0 || fake_current == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  if (peer == fake_current || !dev1_ops())
    return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
  return CUDA_SUCCESS;
}

static CUresult fake_cuDeviceGetAttribute(int *v, CUdevice_attribute a,
                                          CUdevice dev)
{
  NEED_INIT();
  NEED_DEV(dev);
  if ((int)a == env_int("FAKE_CUDA_BAD_ATTR", -1))
    return CUDA_ERROR_INVALID_VALUE;
  int d0 = dev == 0;
  switch (a) {
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
    *v = d0 ? FAKE_CUDA_CC0_MAJOR : FAKE_CUDA_CC1_MAJOR;
    break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
    *v = d0 ? FAKE_CUDA_CC0_MINOR : FAKE_CUDA_CC1_MINOR;
    break;
  case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
    *v = dev == env_int("FAKE_CUDA_VMM_DEV", 0);
    break;
  case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED:
    *v = d0;
    break;
  case CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS:
    *v = d0 || dev1_ops();
    break;
  case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    *v = 1;
    break;
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
    *v = 4;
    break;
  case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES:
    *v = d0 ? FAKE_CUDA_POOL_TYPES0 : FAKE_CUDA_POOL_TYPES1;
    break;
  default:
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

/* Sleep the milliseconds environment variable @name says (0: none). */
static void sleep_env_ms(const char *name)
{
  int ms = env_int(name, 0);
  if (ms <= 0)
    return;
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  while (nanosleep(&ts, &ts) != 0)
    ;
}

/* The first retain makes the context: FAKE_CUDA_RETAIN_MS (a CUDA start
 * beside a busy GPU suite took up to 17.9 s). */
static CUresult fake_cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
  NEED_INIT();
  NEED_DEV(dev);
  if (atomic_fetch_add(&retains[dev], 1) == 0)
    sleep_env_ms("FAKE_CUDA_RETAIN_MS");
  *ctx = &fake_primary_ctx[dev];
  return CUDA_SUCCESS;
}

static CUresult fake_cuDevicePrimaryCtxRelease(CUdevice dev)
{
  NEED_INIT();
  NEED_DEV(dev);
  atomic_fetch_sub(&retains[dev], 1);
  return CUDA_SUCCESS;
}

/* Active while retained (gpuipc never releases what it retains). */
static CUresult fake_cuDevicePrimaryCtxGetState(CUdevice dev,
                                                unsigned int *flags,
                                                int *active)
{
  NEED_INIT();
  NEED_DEV(dev);
  if (flags == NULL || active == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  *flags = 0;
  *active = atomic_load(&retains[dev]) > 0;
  return CUDA_SUCCESS;
}

static CUresult fake_cuCtxGetCurrent(CUcontext *ctx)
{
  NEED_INIT();
  *ctx = fake_current;
  return CUDA_SUCCESS;
}

static CUresult fake_cuCtxSetCurrent(CUcontext ctx)
{
  NEED_INIT();
  atomic_fetch_add(&set_current_calls, 1);
  if (ctx != NULL && ctx != &fake_primary_ctx[0] &&
      ctx != &fake_primary_ctx[1])
    return CUDA_ERROR_INVALID_CONTEXT;
  fake_current = ctx;
  return CUDA_SUCCESS;
}

static CUresult fake_cuCtxGetDevice(CUdevice *dev)
{
  NEED_INIT();
  if (fake_current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  *dev = fake_current->dev;
  return CUDA_SUCCESS;
}

static CUresult
fake_cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                   CUmemAllocationGranularity_flags option)
{
  NEED_INIT();
  if (g == NULL || prop == NULL ||
      prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
       option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
    return CUDA_ERROR_INVALID_VALUE;
  NEED_DEV(prop->location.id);
  if (prop->location.id != env_int("FAKE_CUDA_VMM_DEV", 0))
    return CUDA_ERROR_NOT_SUPPORTED; /* the other device has no VMM */
  if (prop->requestedHandleTypes &
      ~(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_FABRIC))
    return CUDA_ERROR_INVALID_VALUE;
  *g = FAKE_CUDA_GRANULARITY;
  return CUDA_SUCCESS;
}

/* Host registration: each range remembered (a real driver refuses to
 * register a range twice, and maps only what was registered), accepted
 * after FAKE_CUDA_REGISTER_MS (a driver starting up takes that long on
 * its first real call) and the test's fake_cuda_on_register function. */
#define FAKE_REGS 1024
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  uintptr_t base;
  size_t size;
} regs[FAKE_REGS];
static atomic_int registered;
static void (*_Atomic on_register)(void);

void fake_cuda_on_register(void (*fn)(void))
{
  atomic_store(&on_register, fn);
}

/* Whether @p lies in a registered range. reg_lock held. */
static bool reg_holds(uintptr_t p)
{
  for (int i = 0; i < FAKE_REGS; i++)
    if (regs[i].size != 0 && p - regs[i].base < regs[i].size)
      return true;
  return false;
}

/* Registered memory is reached at its host address (unified addressing). */
FAKE_HIDDEN CUresult fake_cuMemHostGetDevicePointer(CUdeviceptr *d, void *p,
                                               unsigned int flags)
{
  NEED_INIT();
  if (d == NULL || p == NULL || flags != 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (fake_current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&reg_lock);
  bool held = reg_holds((uintptr_t)p);
  pthread_mutex_unlock(&reg_lock);
  if (!held)
    return CUDA_ERROR_INVALID_VALUE; /* not registered */
  *d = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}

static CUresult fake_cuMemHostRegister(void *p, size_t n, unsigned int flags)
{
  NEED_INIT();
  if (p == NULL || n == 0 ||
      (flags & ~(unsigned)(CU_MEMHOSTREGISTER_PORTABLE |
                           CU_MEMHOSTREGISTER_DEVICEMAP)))
    return CUDA_ERROR_INVALID_VALUE;
  if (fake_current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  sleep_env_ms("FAKE_CUDA_REGISTER_MS");
  void (*fn)(void) = atomic_load(&on_register);
  if (fn != NULL)
    fn();
  uintptr_t b = (uintptr_t)p;
  CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&reg_lock);
  int free_slot = -1;
  for (int i = 0; i < FAKE_REGS; i++) {
    if (regs[i].size == 0) {
      if (free_slot < 0)
        free_slot = i;
    } else if (b < regs[i].base + regs[i].size && regs[i].base < b + n) {
      free_slot = -2; /* overlaps a registered range */
      r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
      break;
    }
  }
  if (free_slot >= 0) {
    regs[free_slot].base = b;
    regs[free_slot].size = n;
    atomic_fetch_add(&registered, 1);
    r = CUDA_SUCCESS;
  }
  pthread_mutex_unlock(&reg_lock);
  return r;
}

static CUresult fake_cuMemHostUnregister(void *p)
{
  NEED_INIT();
  if (p == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  pthread_mutex_lock(&reg_lock);
  for (int i = 0; i < FAKE_REGS; i++)
    if (regs[i].size != 0 && regs[i].base == (uintptr_t)p) {
      regs[i].size = 0;
      atomic_fetch_sub(&registered, 1);
      r = CUDA_SUCCESS;
      break;
    }
  pthread_mutex_unlock(&reg_lock);
  return r;
}

int fake_cuda_registered(void)
{
  return atomic_load(&registered);
}


static CUresult fake_unsupported(void)
{
  return CUDA_ERROR_NOT_SUPPORTED;
}

/*
 * The base name, and the fake checked against cuda.h's prototype for it
 * (a mismatch is a compile error: "pointer type mismatch").
 */
#define ENTRY(name)                                                            \
  {                                                                            \
#name, (void *)(1 ? fake_##name : (__typeof__(&name))0)                    \
  }

static const struct {
  const char *name;
  void *fn;
} entries[] = {
    ENTRY(cuInit),
    ENTRY(cuDriverGetVersion),
    ENTRY(cuGetErrorName),
    ENTRY(cuGetErrorString),
    ENTRY(cuDeviceGetCount),
    ENTRY(cuDeviceGet),
    ENTRY(cuDeviceGetName),
    ENTRY(cuDeviceGetUuid),
    ENTRY(cuDeviceTotalMem),
    ENTRY(cuDeviceGetPCIBusId),
    ENTRY(cuDeviceGetAttribute),
    ENTRY(cuDeviceCanAccessPeer),
    ENTRY(cuCtxEnablePeerAccess),
    ENTRY(cuDevicePrimaryCtxRetain),
    ENTRY(cuDevicePrimaryCtxRelease),
    ENTRY(cuDevicePrimaryCtxGetState),
    ENTRY(cuCtxGetCurrent),
    ENTRY(cuCtxSetCurrent),
    ENTRY(cuCtxGetDevice),
    ENTRY(cuMemGetAllocationGranularity),
    ENTRY(cuMemHostRegister),
    ENTRY(cuMemHostUnregister),
    ENTRY(cuMemAlloc),
    ENTRY(cuMemFree),
    ENTRY(cuMemGetAddressRange),
    ENTRY(cuIpcGetMemHandle),
    ENTRY(cuIpcOpenMemHandle),
    ENTRY(cuIpcCloseMemHandle),
    ENTRY(cuMemcpyAsync),
    ENTRY(cuMemcpyDtoDAsync),
#if CUDA_VERSION >= 13000
    ENTRY(cuMemcpyBatchAsync),
#endif
    ENTRY(cuStreamWriteValue64),
    ENTRY(cuStreamWaitValue64),
    ENTRY(cuMemHostGetDevicePointer),
    ENTRY(cuMemcpy),
    ENTRY(cuMemcpyHtoD),
    ENTRY(cuMemcpyDtoH),
    ENTRY(cuStreamCreate),
    ENTRY(cuStreamDestroy),
    ENTRY(cuStreamGetCtx),
    ENTRY(cuStreamQuery),
    ENTRY(cuStreamSynchronize),
    ENTRY(cuCtxSynchronize),
    ENTRY(cuStreamWaitEvent),
    ENTRY(cuEventCreate),
    ENTRY(cuEventDestroy),
    ENTRY(cuEventRecord),
    ENTRY(cuEventQuery),
    ENTRY(cuEventSynchronize),
    ENTRY(cuIpcGetEventHandle),
    ENTRY(cuIpcOpenEventHandle),
    ENTRY(cuModuleLoadData),
    ENTRY(cuModuleGetFunction),
    ENTRY(cuLaunchKernel),
    ENTRY(cuMemsetD8),
};

static int hidden(const char *symbol)
{
  const char *h = getenv("FAKE_CUDA_HIDE");
  if (h == NULL)
    return 0;
  if (strcmp(h, "*") == 0)
    return 1;
  size_t n = strlen(symbol);
  for (const char *p = h; *p != '\0';) {
    const char *end = strchr(p, ',');
    size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
    if (len == n && strncmp(p, symbol, n) == 0)
      return 1;
    p += len + (end != NULL);
  }
  return 0;
}

/* cuGetProcAddress takes base names: "cuMemAlloc", never "cuMemAlloc_v2". */
static int is_base_name(const char *s)
{
  if (strncmp(s, "cu", 2) != 0)
    return 0;
  const char *u = strrchr(s, '_');
  return u == NULL;
}

static void *lookup(const char *symbol)
{
  if (hidden(symbol) || !is_base_name(symbol))
    return NULL;
  for (size_t i = 0; i < sizeof(entries) / sizeof(entries[0]); i++)
    if (strcmp(entries[i].name, symbol) == 0)
      return entries[i].fn;
  return (void *)fake_unsupported;
}

/* As documented: a version above the driver's own is an invalid value; an
 * unknown symbol is success with a NULL pointer. */
__attribute__((unused)) static CUresult
gpa(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags,
    CUdriverProcAddressQueryResult *status)
{
  if (symbol == NULL || pfn == NULL || flags > 2)
    return CUDA_ERROR_INVALID_VALUE;
  *pfn = NULL;
  if (cuda_version > version())
    return CUDA_ERROR_INVALID_VALUE;
  void *fn = lookup(symbol);
  if (status != NULL)
    *status = fn != NULL ? CU_GET_PROC_ADDRESS_SUCCESS
                         : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  *pfn = fn;
  return CUDA_SUCCESS;
}

#if defined(FAKE_CUDA_GPA_V1)
#undef cuGetProcAddress
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version,
                          cuuint64_t flags);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version,
                          cuuint64_t flags)
{
  return gpa(symbol, pfn, cuda_version, flags, NULL);
}
#elif !defined(FAKE_CUDA_NO_GPA)
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version,
                             cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status)
{
  return gpa(symbol, pfn, cuda_version, flags, status);
}
#else
/* Something to export, so that the library is a library. */
int fake_cuda_nothing(void);
int fake_cuda_nothing(void)
{
  return 0;
}
#endif

int fake_cuda_retains(int dev)
{
  return dev >= 0 && dev < FAKE_CUDA_MAX_DEV ? atomic_load(&retains[dev]) : -1;
}

int fake_cuda_calls_before_init(void)
{
  return atomic_load(&fake_before_init);
}

int fake_cuda_set_current_calls(void)
{
  return atomic_load(&set_current_calls);
}
