/*
 * What the GPU kinds share: the devices of an import, exporter liveness,
 * gpuipc_buf_access, gpuipc_buf_alive and gpuipc_buf_export_foreign.
 */
#include "mem/gpu.h"
#include "cuda/peer.h"
#include "os/os.h"
#include "wire/wire.h"

#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

bool gpuipc__handle_is_self(const gpuipc_handle_t *h)
{
  const struct gpuipc__proc_id *me = gpuipc__proc_self();
  return h->nonce == me->nonce && h->pid == me->pid &&
         memcmp(h->boot_id, me->boot_id, 16) == 0;
}

bool gpuipc__exporter_gone(const uint8_t boot_id[16], uint64_t pidns,
                           uint32_t pid)
{
  const struct gpuipc__proc_id *me = gpuipc__proc_self();
  return memcmp(me->boot_id, boot_id, 16) == 0 && me->pidns == pidns &&
         !gpuipc__pid_alive((pid_t)pid);
}

bool gpuipc__exporter_gone_fast(const uint8_t boot_id[16], uint64_t pidns,
                                uint32_t pid)
{
  const struct gpuipc__proc_id *me = gpuipc__proc_self();
  return memcmp(me->boot_id, boot_id, 16) == 0 && me->pidns == pidns &&
         kill((pid_t)pid, 0) < 0 && errno == ESRCH;
}

int gpuipc_buf_alive(const gpuipc_buf_t *buf)
{
  if (buf == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_buf_alive: NULL buffer");
  if (buf->kind == GPUIPC_KIND_LEGACY && buf->imported &&
      gpuipc__exporter_gone(buf->boot_id, buf->pidns, buf->pid))
    return gpuipc__err(GPUIPC_E_PEER_GONE,
                       "gpuipc_buf_alive: the process %u that allocated "
                       "this LEGACY buffer has exited, and its memory with it",
                       buf->pid);
  return 0;
}

int gpuipc__gpu_import_devices(const gpuipc_handle_t *h, int requested,
                               const char *who, int *owner, int *access)
{
  int o = gpuipc_device_by_uuid(h->device_uuid);
  if (o < 0)
    return o;
  int a = o;
  if (requested >= 0) {
    int rc = gpuipc__dev_check(requested, who);
    if (rc != 0)
      return rc;
    a = requested;
    rc = gpuipc__p2p_check(a, o, who);
    if (rc != 0)
      return rc;
  }
  *owner = o;
  *access = a;
  return 0;
}

#if GPUIPC_HAVE_CUDA

void gpuipc__rw_access(CUmemAccessDesc *a, int device)
{
  memset(a, 0, sizeof(*a));
  a->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a->location.id = gpuipc__dev_get(device)->cu_dev;
  a->flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

int gpuipc__cu_oom(CUresult r, const char *what, size_t size, int device)
{
  if (r == CUDA_ERROR_OUT_OF_MEMORY)
    return gpuipc__err(-ENOMEM, "%s(%zu bytes on GPU %d): out of device "
                       "memory", what, size, device);
  return gpuipc__cu_check(r, what);
}

int gpuipc_buf_access(gpuipc_buf_t *buf, int device)
{
  static const char who[] = "gpuipc_buf_access";
  if (buf == NULL)
    return gpuipc__err(-EINVAL, "%s: NULL buffer", who);
  if (buf->kind == GPUIPC_KIND_HOST)
    return 0;
  int rc = gpuipc__dev_check(device, who);
  if (rc != 0)
    return rc;
  if (device == buf->device)
    return 0;
  int owner = gpuipc_device_by_uuid(buf->uuid);
  if (owner < 0)
    return owner;
  rc = gpuipc__p2p_check(device, owner, who);
  if (rc != 0)
    return rc;
  struct gpuipc__ctx_saved saved;
  switch (buf->kind) {
  case GPUIPC_KIND_VMM:
  case GPUIPC_KIND_POOL:
    /* In the context of the device granted, as imports do. */
    rc = gpuipc__ctx_enter(device, &saved);
    if (rc != 0)
      return rc;
    rc = buf->kind == GPUIPC_KIND_VMM ? gpuipc__vmm_access(buf, device)
                                      : gpuipc__pool_access(buf, device);
    gpuipc__ctx_leave(&saved);
    return rc;
  case GPUIPC_KIND_LEGACY:
    /* cuMemAlloc memory (and its IPC mappings) follow peer access. */
    return gpuipc_peer_enable(device, owner);
  default:
    return gpuipc__err(-EINVAL, "%s: unknown kind %d", who, (int)buf->kind);
  }
}

/* ----- memory gpuipc did not allocate ----- */

static _Atomic uint64_t foreign_ids = 1;

uint64_t gpuipc__foreign_export_id(void)
{
  /* Its own id space (top bit set), apart from the buffers' export ids. */
  return (1ull << 63) | atomic_fetch_add(&foreign_ids, 1);
}

static int ptr_attr(void *out, CUpointer_attribute a, CUdeviceptr p,
                    const char *name)
{
  return gpuipc__cu_check(gpuipc__cu.cuPointerGetAttribute(out, a, p), name);
}

/*
 * Export the cudaMalloc allocation [base, base + rsize) by legacy IPC.
 * Only a whole allocation that fills whole blocks of its own keeps the
 * neighbours' bytes out of the importer's reach.
 */
static int foreign_legacy(CUdeviceptr p, size_t size, CUdeviceptr base,
                          size_t rsize, unsigned flags, gpuipc_handle_t *h)
{
  static const char who[] = "gpuipc_buf_export_foreign";
  bool whole = p == base && size == rsize &&
               base % GPUIPC__LEGACY_BLOCK == 0 &&
               rsize % GPUIPC__LEGACY_BLOCK == 0;
  if (!whole && !(flags & GPUIPC_FOREIGN_ALLOW_WHOLEBLOCK))
    return gpuipc__err(GPUIPC_E_WHOLEBLOCK,
                       "%s: [0x%llx, +%zu) lies in the cudaMalloc allocation "
                       "[0x%llx, +%zu), which %s: a legacy IPC handle would "
                       "let the importer read its whole 2 MiB block; pass "
                       "GPUIPC_FOREIGN_ALLOW_WHOLEBLOCK to accept that",
                       who, (unsigned long long)p, size,
                       (unsigned long long)base, rsize,
                       p != base || size != rsize
                           ? "the range does not cover"
                           : "does not fill whole 2 MiB blocks of its own "
                             "(small allocations share blocks)");
  if (gpuipc__cu.cuIpcGetMemHandle == NULL)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED, "%s: the driver lacks "
                       "cuIpcGetMemHandle", who);
  CUipcMemHandle ipc;
  int rc = GPUIPC_CU(cuIpcGetMemHandle, &ipc, base);
  if (rc != 0)
    return rc;
  h->kind = GPUIPC_KIND_LEGACY;
  h->type = GPUIPC_HT_LEGACY;
  _Static_assert(sizeof(ipc.reserved) == GPUIPC_HANDLE_BYTES,
                 "CUipcMemHandle is 64 bytes");
  memcpy(h->bytes, ipc.reserved, GPUIPC_HANDLE_BYTES);
  h->fd = -1;
  return 0;
}

/* Export the cuMemCreate allocation mapped at [base, base + rsize) by fd. */
static int foreign_vmm(CUdeviceptr p, size_t size, CUdeviceptr base,
                       size_t rsize, unsigned flags, gpuipc_handle_t *h)
{
  static const char who[] = "gpuipc_buf_export_foreign";
  unsigned long long types = 0;
  int rc = ptr_attr(&types, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, p,
                    "cuPointerGetAttribute(ALLOWED_HANDLE_TYPES)");
  if (rc != 0)
    return rc;
  if (!(types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    return gpuipc__err(GPUIPC_E_UNSUPPORTED,
                       "%s: 0x%llx was created without "
                       "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (handle "
                       "types 0x%llx): it cannot be shared", who,
                       (unsigned long long)p, types);
  if ((p != base || size != rsize) &&
      !(flags & GPUIPC_FOREIGN_ALLOW_WHOLEBLOCK))
    return gpuipc__err(GPUIPC_E_WHOLEBLOCK,
                       "%s: [0x%llx, +%zu) is part of the cuMemCreate "
                       "allocation [0x%llx, +%zu) and its fd would share "
                       "all of it; pass GPUIPC_FOREIGN_ALLOW_WHOLEBLOCK to "
                       "accept that", who, (unsigned long long)p, size,
                       (unsigned long long)base, rsize);
  CUmemGenericAllocationHandle mh;
  rc = GPUIPC_CU(cuMemRetainAllocationHandle, &mh, (void *)(uintptr_t)base);
  if (rc != 0)
    return rc;
  int fd = -1;
  rc = GPUIPC_CU(cuMemExportToShareableHandle, &fd, mh,
                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  gpuipc__cu.cuMemRelease(mh); /* the retain's reference */
  if (rc != 0)
    return rc;
  if (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) {
    rc = gpuipc__err_errno(errno, "%s: fcntl(FD_CLOEXEC)", who);
    close(fd);
    return rc;
  }
  h->kind = GPUIPC_KIND_VMM;
  h->type = GPUIPC_HT_POSIX_FD;
  h->fd = fd;
  return 0;
}

/* The export of [p, p + size), in the context of the memory's device. */
static int foreign_export(CUdeviceptr p, size_t size, unsigned flags,
                          gpuipc_handle_t *h)
{
  static const char who[] = "gpuipc_buf_export_foreign";
  void *ptr = (void *)(uintptr_t)p;
  CUdeviceptr base = 0;
  size_t rsize = 0;
  int rc = GPUIPC_CU(cuMemGetAddressRange, &base, &rsize, p);
  if (rc != 0)
    return rc;
  if (size > rsize - (size_t)(p - base))
    return gpuipc__err(-EINVAL, "%s: [%p, +%zu) runs past the end of its "
                       "allocation [0x%llx, +%zu)", who, ptr, size,
                       (unsigned long long)base, rsize);
  h->size = size;
  h->offset = (uint64_t)(p - base);
  h->alloc_size = rsize;
  unsigned long long legacy_ok = 0; /* a boolean of the driver's width */
  rc = ptr_attr(&legacy_ok, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                p, "cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_CAPABLE)");
  if (rc != 0)
    return rc;
  if (legacy_ok)
    return foreign_legacy(p, size, base, rsize, flags, h);
  CUmemGenericAllocationHandle probe;
  if (gpuipc__cu.cuMemRetainAllocationHandle == NULL ||
      gpuipc__cu.cuMemRetainAllocationHandle(&probe, ptr) != CUDA_SUCCESS)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED,
                       "%s: %p is neither cudaMalloc/cuMemAlloc memory nor "
                       "a cuMemCreate mapping", who, ptr);
  gpuipc__cu.cuMemRelease(probe);
  return foreign_vmm(p, size, base, rsize, flags, h);
}

int gpuipc_buf_export_foreign(void *ptr, size_t size, unsigned flags,
                              gpuipc_handle_t *out)
{
  static const char who[] = "gpuipc_buf_export_foreign";
  if (ptr == NULL || size == 0 || out == NULL ||
      (flags & ~GPUIPC_FOREIGN_ALLOW_WHOLEBLOCK) != 0)
    return gpuipc__err(-EINVAL, "%s: %s", who,
                       ptr == NULL    ? "ptr is NULL"
                       : size == 0    ? "size is 0"
                       : out == NULL  ? "out is NULL"
                                      : "unknown flags");
  int rc = gpuipc__cuda_load();
  if (rc != 0)
    return rc;
  CUdeviceptr p = (CUdeviceptr)(uintptr_t)ptr;
  unsigned int memtype = 0;
  CUresult r = gpuipc__cu.cuPointerGetAttribute(
      &memtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
  if (r != CUDA_SUCCESS || memtype != CU_MEMORYTYPE_DEVICE)
    return gpuipc__err(-EINVAL, "%s: %p is not CUDA device memory", who, ptr);
  /*
   * Stream-ordered pool memory sits in the pool's larger allocations:
   * sharing its handle would share the neighbours (share the pool).
   */
  CUmemoryPool mempool = NULL;
  r = gpuipc__cu.cuPointerGetAttribute(&mempool,
                                       CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p);
  if (r == CUDA_SUCCESS && mempool != NULL)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED,
                       "%s: %p comes from a stream-ordered memory pool, "
                       "whose memory is shared by exporting the pool (the "
                       "POOL kind), never one allocation by itself", who, ptr);
  int dev = -1;
  rc = ptr_attr(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p,
                "cuPointerGetAttribute(DEVICE_ORDINAL)");
  if (rc == 0)
    rc = gpuipc__dev_check(dev, who);
  if (rc != 0)
    return rc;
  gpuipc_handle_t h;
  memset(&h, 0, sizeof(h));
  struct gpuipc__ctx_saved saved;
  rc = gpuipc__ctx_enter(dev, &saved);
  if (rc != 0)
    return rc;
  rc = foreign_export(p, size, flags, &h);
  gpuipc__ctx_leave(&saved);
  if (rc != 0)
    return rc;

  const struct gpuipc__proc_id *me = gpuipc__proc_self();
  const struct gpuipc__dev *d = gpuipc__dev_get(dev);
  h.version = GPUIPC_HANDLE_VERSION;
  memcpy(h.device_uuid, d->info.uuid, 16);
  h.export_id = gpuipc__foreign_export_id();
  memcpy(h.boot_id, me->boot_id, 16);
  h.pid = me->pid;
  h.pidns = me->pidns;
  h.nonce = me->nonce;
  rc = gpuipc__handle_validate(&h, who);
  if (rc != 0) {
    if (h.fd >= 0)
      close(h.fd);
    return rc;
  }
  *out = h;
  return 0;
}

#else /* !GPUIPC_HAVE_CUDA */

int gpuipc_buf_access(gpuipc_buf_t *buf, int device)
{
  if (buf == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_buf_access: NULL buffer");
  if (buf->kind == GPUIPC_KIND_HOST)
    return 0;
  return gpuipc__err(GPUIPC_E_UNSUPPORTED,
                     "gpuipc_buf_access: built without CUDA");
}

int gpuipc_buf_export_foreign(void *ptr, size_t size, unsigned flags,
                              gpuipc_handle_t *out)
{
  if (ptr == NULL || size == 0 || out == NULL ||
      (flags & ~GPUIPC_FOREIGN_ALLOW_WHOLEBLOCK) != 0)
    return gpuipc__err(-EINVAL, "gpuipc_buf_export_foreign: bad argument");
  return gpuipc__err(GPUIPC_E_UNSUPPORTED,
                     "gpuipc_buf_export_foreign: built without CUDA");
}

#endif
