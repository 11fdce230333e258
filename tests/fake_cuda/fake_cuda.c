/*
 * A fake CUDA driver (see fake_cuda.h). What the loader and the device
 * table use is implemented, and host registration, LEGACY device memory
 * (cuMemAlloc), copies, streams and events over host memory posing as
 * device memory; every other entry
 * point resolves to a function that answers CUDA_ERROR_NOT_SUPPORTED and
 * must never be called by the tests that use this library.
 */
#include <cuda.h>

#include "fake_cuda.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct CUctx_st {
  int dev;
};

static struct CUctx_st primary_ctx[FAKE_CUDA_MAX_DEV] = {{0}, {1}};
static atomic_int retains[FAKE_CUDA_MAX_DEV];
static atomic_int initialized;
static atomic_int before_init;
static atomic_int set_current_calls;
static __thread CUcontext current;

static int env_int(const char *name, int def)
{
  const char *v = getenv(name);
  return v != NULL && v[0] != '\0' ? atoi(v) : def;
}

static int version(void)
{
  return env_int("FAKE_CUDA_VERSION", 13000);
}

static int ndev(void)
{
  int n = env_int("FAKE_CUDA_NDEV", FAKE_CUDA_MAX_DEV);
  return n < 0 ? 0 : n > FAKE_CUDA_MAX_DEV ? FAKE_CUDA_MAX_DEV : n;
}

/* Entry points other than cuInit and the version/error queries need it. */
#define NEED_INIT()                                                            \
  do {                                                                         \
    if (!atomic_load(&initialized)) {                                          \
      atomic_fetch_add(&before_init, 1);                                       \
      return CUDA_ERROR_NOT_INITIALIZED;                                       \
    }                                                                          \
  } while (0)
#define NEED_DEV(d)                                                            \
  do {                                                                         \
    if ((d) < 0 || (d) >= ndev())                                              \
      return CUDA_ERROR_INVALID_DEVICE;                                        \
  } while (0)

static CUresult fake_cuInit(unsigned int flags)
{
  if (flags != 0)
    return CUDA_ERROR_INVALID_VALUE;
  int r = env_int("FAKE_CUDA_INIT", 0);
  if (r != 0)
    return (CUresult)r;
  atomic_store(&initialized, 1);
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
  case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED:
    *v = d0;
    break;
  case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    *v = 1;
    break;
  case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES:
    *v = d0 ? FAKE_CUDA_POOL_TYPES0 : FAKE_CUDA_POOL_TYPES1;
    break;
  default:
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

static CUresult fake_cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
  NEED_INIT();
  NEED_DEV(dev);
  atomic_fetch_add(&retains[dev], 1);
  *ctx = &primary_ctx[dev];
  return CUDA_SUCCESS;
}

static CUresult fake_cuDevicePrimaryCtxRelease(CUdevice dev)
{
  NEED_INIT();
  NEED_DEV(dev);
  atomic_fetch_sub(&retains[dev], 1);
  return CUDA_SUCCESS;
}

static CUresult fake_cuCtxGetCurrent(CUcontext *ctx)
{
  NEED_INIT();
  *ctx = current;
  return CUDA_SUCCESS;
}

static CUresult fake_cuCtxSetCurrent(CUcontext ctx)
{
  NEED_INIT();
  atomic_fetch_add(&set_current_calls, 1);
  if (ctx != NULL && ctx != &primary_ctx[0] && ctx != &primary_ctx[1])
    return CUDA_ERROR_INVALID_CONTEXT;
  current = ctx;
  return CUDA_SUCCESS;
}

static CUresult fake_cuCtxGetDevice(CUdevice *dev)
{
  NEED_INIT();
  if (current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  *dev = current->dev;
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
  if (prop->location.id != 0) /* device 1 has no VMM */
    return CUDA_ERROR_NOT_SUPPORTED;
  if (prop->requestedHandleTypes &
      ~(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_FABRIC))
    return CUDA_ERROR_INVALID_VALUE;
  *g = FAKE_CUDA_GRANULARITY;
  return CUDA_SUCCESS;
}

/* Host registration: accepted, after FAKE_CUDA_REGISTER_MS (a driver
 * starting up takes that long on its first real call). */
static atomic_int registered;

static CUresult fake_cuMemHostRegister(void *p, size_t n, unsigned int flags)
{
  NEED_INIT();
  if (p == NULL || n == 0 ||
      (flags & ~(unsigned)(CU_MEMHOSTREGISTER_PORTABLE |
                           CU_MEMHOSTREGISTER_DEVICEMAP)))
    return CUDA_ERROR_INVALID_VALUE;
  if (current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  int ms = env_int("FAKE_CUDA_REGISTER_MS", 0);
  if (ms > 0) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0)
      ;
  }
  atomic_fetch_add(&registered, 1);
  return CUDA_SUCCESS;
}

static CUresult fake_cuMemHostUnregister(void *p)
{
  NEED_INIT();
  if (p == NULL || atomic_load(&registered) == 0)
    return CUDA_ERROR_INVALID_VALUE;
  atomic_fetch_sub(&registered, 1);
  return CUDA_SUCCESS;
}

int fake_cuda_registered(void)
{
  return atomic_load(&registered);
}

/* ---- device memory --------------------------------------------------------
 *
 * cuMemAlloc hands out 2 MiB-aligned host memory (the size rounded up to
 * 2 MiB, as gpuipc's LEGACY kind asks), remembered so that
 * cuMemGetAddressRange and cuMemFree know it; cuIpcGetMemHandle describes
 * it by its address. Enough for LEGACY buffers within one process.
 */
#define FAKE_ALLOCS 256

static pthread_mutex_t alloc_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  uintptr_t base;
  size_t size;
} allocs[FAKE_ALLOCS];

static CUresult fake_cuMemAlloc(CUdeviceptr *p, size_t n)
{
  NEED_INIT();
  if (current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (p == NULL || n == 0)
    return CUDA_ERROR_INVALID_VALUE;
  const size_t block = (size_t)2 << 20;
  size_t size = (n + block - 1) / block * block;
  void *m = aligned_alloc(block, size);
  if (m == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&alloc_lock);
  for (int i = 0; i < FAKE_ALLOCS; i++)
    if (allocs[i].base == 0) {
      allocs[i].base = (uintptr_t)m;
      allocs[i].size = size;
      r = CUDA_SUCCESS;
      break;
    }
  pthread_mutex_unlock(&alloc_lock);
  if (r != CUDA_SUCCESS)
    free(m);
  else
    *p = (CUdeviceptr)(uintptr_t)m;
  return r;
}

static CUresult fake_cuMemFree(CUdeviceptr p)
{
  NEED_INIT();
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&alloc_lock);
  for (int i = 0; i < FAKE_ALLOCS; i++)
    if (allocs[i].base != 0 && allocs[i].base == (uintptr_t)p) {
      free((void *)allocs[i].base);
      allocs[i].base = 0;
      r = CUDA_SUCCESS;
    }
  pthread_mutex_unlock(&alloc_lock);
  return r;
}

static CUresult fake_cuMemGetAddressRange(CUdeviceptr *base, size_t *size,
                                          CUdeviceptr p)
{
  NEED_INIT();
  CUresult r = CUDA_ERROR_NOT_FOUND;
  pthread_mutex_lock(&alloc_lock);
  for (int i = 0; i < FAKE_ALLOCS; i++)
    if (allocs[i].base != 0 && (uintptr_t)p >= allocs[i].base &&
        (uintptr_t)p - allocs[i].base < allocs[i].size) {
      if (base != NULL)
        *base = (CUdeviceptr)allocs[i].base;
      if (size != NULL)
        *size = allocs[i].size;
      r = CUDA_SUCCESS;
    }
  pthread_mutex_unlock(&alloc_lock);
  return r;
}

static CUresult fake_cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
  NEED_INIT();
  if (h == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr base = 0;
  if (fake_cuMemGetAddressRange(&base, NULL, p) != CUDA_SUCCESS || base != p)
    return CUDA_ERROR_INVALID_VALUE;
  memset(h, 0, sizeof(*h));
  memcpy(h->reserved, &p, sizeof(p));
  return CUDA_SUCCESS;
}

/* ---- copies, streams and events ------------------------------------------
 *
 * "Device memory" is host memory: a CUdeviceptr is a host address. A copy
 * queued with cuMemcpyAsync is not made at once: it waits, in order, in
 * its stream's queue until something shows it done. An event recorded on
 * a stream marks the work queued there before it; cuEventQuery answers
 * CUDA_ERROR_NOT_READY until that work is done, and does it (every copy
 * up to the mark, in order) on its FAKE_CUDA_COPY_LAG-th query since the
 * record (default 1: the first) once FAKE_CUDA_COPY_LAG_US microseconds
 * have passed since the record (default 0). cuEventSynchronize,
 * cuStreamSynchronize and cuMemcpy do the work at once. So code that
 * reads a copy's destination, or writes its source, before an event or a
 * synchronisation said the copy is over sees the old bytes, or has the
 * new ones copied: as on a GPU whose copies lag.
 *
 * The stream is keyed by its handle and, for the NULL (legacy) stream, by
 * the current context. One lock over all of it.
 */
struct copy_op {
  uint8_t *dst;
  const uint8_t *src;
  size_t n;
};

#define FAKE_STREAMS 8

struct fake_stream {
  bool used;
  CUcontext ctx; /* NULL stream: the context it belongs to */
  CUstream handle;
  struct copy_op *ops; /* not yet done: ops[start..len) */
  size_t start, len, cap;
  uint64_t queued, done; /* copies queued and done, ever */
};

struct CUevent_st {
  unsigned flags;
  struct fake_stream *s; /* NULL: never recorded (complete) */
  uint64_t mark;         /* s->queued when recorded */
  int queries;           /* since the record */
  struct timespec at;    /* of the record */
};

static pthread_mutex_t work_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fake_stream streams[FAKE_STREAMS];
static atomic_int copies_done;
static atomic_int not_ready;

/* The stream @h means now, made on first use; NULL when the table is full
 * (the tests use the NULL stream only). work_lock held. */
static struct fake_stream *stream_of(CUstream h)
{
  CUcontext ctx = h == NULL ? current : NULL;
  struct fake_stream *fresh = NULL;
  for (int i = 0; i < FAKE_STREAMS; i++) {
    struct fake_stream *s = &streams[i];
    if (s->used && s->handle == h && s->ctx == ctx)
      return s;
    if (!s->used && fresh == NULL)
      fresh = s;
  }
  if (fresh != NULL) {
    fresh->used = true;
    fresh->ctx = ctx;
    fresh->handle = h;
  }
  return fresh;
}

/* Do the copies of @s up to number @mark. work_lock held. */
static void stream_run(struct fake_stream *s, uint64_t mark)
{
  while (s->done < mark && s->start < s->len) {
    struct copy_op *op = &s->ops[s->start++];
    if (op->n > 0)
      memmove(op->dst, op->src, op->n);
    s->done++;
    atomic_fetch_add(&copies_done, 1);
  }
  if (s->start == s->len)
    s->start = s->len = 0;
}

static void all_run(void)
{
  for (int i = 0; i < FAKE_STREAMS; i++)
    if (streams[i].used)
      stream_run(&streams[i], streams[i].queued);
}

static long long usec_since(const struct timespec *t)
{
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (long long)(now.tv_sec - t->tv_sec) * 1000000 +
         (now.tv_nsec - t->tv_nsec) / 1000;
}

static CUresult fake_cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src,
                                   size_t n, CUstream h)
{
  NEED_INIT();
  if (current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (n > 0 && (dst == 0 || src == 0))
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&work_lock);
  struct fake_stream *s = stream_of(h);
  if (s == NULL) {
    r = CUDA_ERROR_INVALID_HANDLE;
    goto unlock;
  }
  if (s->len == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 64;
    struct copy_op *ops = realloc(s->ops, cap * sizeof(*ops));
    if (ops == NULL) {
      r = CUDA_ERROR_OUT_OF_MEMORY;
      goto unlock;
    }
    s->ops = ops;
    s->cap = cap;
  }
  s->ops[s->len++] = (struct copy_op){(uint8_t *)(uintptr_t)dst,
                                      (const uint8_t *)(uintptr_t)src, n};
  s->queued++;
unlock:
  pthread_mutex_unlock(&work_lock);
  return r;
}

/* Synchronous: after the work queued before it, as on the legacy stream. */
static CUresult fake_cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
  NEED_INIT();
  if (current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (n > 0 && (dst == 0 || src == 0))
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&work_lock);
  all_run();
  if (n > 0)
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
  pthread_mutex_unlock(&work_lock);
  return CUDA_SUCCESS;
}

static CUresult fake_cuStreamSynchronize(CUstream h)
{
  NEED_INIT();
  if (h == NULL && current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&work_lock);
  struct fake_stream *s = stream_of(h);
  if (s != NULL)
    stream_run(s, s->queued);
  else
    r = CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_unlock(&work_lock);
  return r;
}

static CUresult fake_cuEventCreate(CUevent *ev, unsigned int flags)
{
  NEED_INIT();
  const unsigned all = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING |
                       CU_EVENT_INTERPROCESS;
  if (ev == NULL || (flags & ~all) != 0 ||
      ((flags & CU_EVENT_INTERPROCESS) &&
       !(flags & CU_EVENT_DISABLE_TIMING)))
    return CUDA_ERROR_INVALID_VALUE;
  if (current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  struct CUevent_st *e = calloc(1, sizeof(*e));
  if (e == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  e->flags = flags;
  *ev = e;
  return CUDA_SUCCESS;
}

static CUresult fake_cuEventDestroy(CUevent ev)
{
  NEED_INIT();
  if (ev == NULL)
    return CUDA_ERROR_INVALID_HANDLE;
  free(ev);
  return CUDA_SUCCESS;
}

static CUresult fake_cuEventRecord(CUevent ev, CUstream h)
{
  NEED_INIT();
  if (ev == NULL)
    return CUDA_ERROR_INVALID_HANDLE;
  if (h == NULL && current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&work_lock);
  struct fake_stream *s = stream_of(h);
  if (s != NULL) {
    ev->s = s;
    ev->mark = s->queued;
    ev->queries = 0;
    clock_gettime(CLOCK_MONOTONIC, &ev->at);
  } else {
    r = CUDA_ERROR_INVALID_HANDLE;
  }
  pthread_mutex_unlock(&work_lock);
  return r;
}

static CUresult fake_cuEventQuery(CUevent ev)
{
  NEED_INIT();
  if (ev == NULL)
    return CUDA_ERROR_INVALID_HANDLE;
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&work_lock);
  if (ev->s != NULL && ev->s->done < ev->mark) {
    ev->queries++;
    if (ev->queries >= env_int("FAKE_CUDA_COPY_LAG", 1) &&
        usec_since(&ev->at) >= env_int("FAKE_CUDA_COPY_LAG_US", 0))
      stream_run(ev->s, ev->mark);
    else
      r = CUDA_ERROR_NOT_READY;
  }
  if (r == CUDA_ERROR_NOT_READY)
    atomic_fetch_add(&not_ready, 1);
  pthread_mutex_unlock(&work_lock);
  return r;
}

static CUresult fake_cuEventSynchronize(CUevent ev)
{
  NEED_INIT();
  if (ev == NULL)
    return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&work_lock);
  if (ev->s != NULL)
    stream_run(ev->s, ev->mark);
  pthread_mutex_unlock(&work_lock);
  return CUDA_SUCCESS;
}

static CUresult fake_cuIpcGetEventHandle(CUipcEventHandle *h, CUevent ev)
{
  NEED_INIT();
  if (h == NULL || ev == NULL || !(ev->flags & CU_EVENT_INTERPROCESS))
    return CUDA_ERROR_INVALID_VALUE;
  memset(h, 0, sizeof(*h));
  memcpy(h->reserved, &ev, sizeof(ev));
  h->reserved[sizeof(h->reserved) - 1] = 0x5a; /* never all zero */
  return CUDA_SUCCESS;
}

int fake_cuda_copies_done(void)
{
  return atomic_load(&copies_done);
}

int fake_cuda_not_ready(void)
{
  return atomic_load(&not_ready);
}

/* Whatever else gpuipc asks for: present, but never to be called here. */
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
    ENTRY(cuDevicePrimaryCtxRetain),
    ENTRY(cuDevicePrimaryCtxRelease),
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
    ENTRY(cuMemcpyAsync),
    ENTRY(cuMemcpy),
    ENTRY(cuStreamSynchronize),
    ENTRY(cuEventCreate),
    ENTRY(cuEventDestroy),
    ENTRY(cuEventRecord),
    ENTRY(cuEventQuery),
    ENTRY(cuEventSynchronize),
    ENTRY(cuIpcGetEventHandle),
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
  return atomic_load(&before_init);
}

int fake_cuda_set_current_calls(void)
{
  return atomic_load(&set_current_calls);
}
