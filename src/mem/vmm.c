/*
 * The VMM kind: cuMemCreate'd physical memory, shared as a POSIX file
 * descriptor (and created with fabric handles too where a probe shows they
 * work). Each process maps it into an address range of its own: reserve,
 * map, set access. The memory lives while any process holds the fd, a
 * handle or a mapping.
 */
#include "cuda/peer.h"
#include "mem/gpu.h"
#include "os/os.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if GPUIPC_HAVE_CUDA

#define MAX_DEV 64

struct vmm {
  CUmemGenericAllocationHandle mh; /* our reference to the memory */
  CUdeviceptr va;                  /* the reservation, mapped whole */
  size_t map_size;                 /* bytes reserved and mapped */
};

/* ----- fabric handles: probed once per device ----- */

static pthread_mutex_t fabric_lock = PTHREAD_MUTEX_INITIALIZER;
static int fabric_rc[MAX_DEV];       /* 0 usable, else the reason's code */
static bool fabric_known[MAX_DEV];
static char fabric_why[MAX_DEV][200];

static void prop_init(CUmemAllocationProp *prop, const struct gpuipc__dev *d,
                      CUmemAllocationHandleType types)
{
  memset(prop, 0, sizeof(*prop));
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = d->cu_dev;
  prop->requestedHandleTypes = types;
}

/* Allocation granularity of device @d (the device table's, else asked). */
static int granularity(const struct gpuipc__dev *d, size_t *out)
{
  if (d->info.granularity != 0) {
    *out = (size_t)d->info.granularity;
    return 0;
  }
  CUmemAllocationProp prop;
  prop_init(&prop, d, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  size_t g = 0;
  int rc = GPUIPC_CU(cuMemGetAllocationGranularity, &g, &prop,
                     CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (rc == 0 && (g == 0 || (g & (g - 1)) != 0))
    rc = gpuipc__err(GPUIPC_E_CUDA, "cuMemGetAllocationGranularity: %zu is "
                     "not a power of two", g);
  if (rc == 0)
    *out = g;
  return rc;
}

/* Caller holds fabric_lock. */
static void fabric_probe(int ordinal)
{
  const struct gpuipc__dev *d = gpuipc__dev_get(ordinal);
  char *why = fabric_why[ordinal];
  size_t cap = sizeof(fabric_why[ordinal]);
  fabric_known[ordinal] = true;
  if (!d->info.fabric) {
    fabric_rc[ordinal] = GPUIPC_E_UNSUPPORTED;
    snprintf(why, cap, "fabric handles not supported by GPU %d (%s)",
             ordinal, d->info.uuid_str);
    return;
  }
  size_t g;
  if (granularity(d, &g) != 0) {
    fabric_rc[ordinal] = GPUIPC_E_UNSUPPORTED;
    snprintf(why, cap, "fabric probe on GPU %d: %s", ordinal,
             gpuipc_last_error());
    return;
  }
  CUmemAllocationProp prop;
  prop_init(&prop, d, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR |
                          CU_MEM_HANDLE_TYPE_FABRIC);
  CUmemGenericAllocationHandle mh;
  CUresult r = gpuipc__cu.cuMemCreate(&mh, g, &prop, 0);
  if (r == CUDA_SUCCESS) {
    gpuipc__cu.cuMemRelease(mh);
    fabric_rc[ordinal] = 0;
    snprintf(why, cap, "fabric handles usable on GPU %d", ordinal);
    GPUIPC_LOG_I("vmm: %s", why);
    return;
  }
  const char *name = NULL;
  gpuipc__cu.cuGetErrorName(r, &name);
  if (r == CUDA_ERROR_NOT_PERMITTED) {
    fabric_rc[ordinal] = GPUIPC_E_DENIED;
    snprintf(why, cap, "fabric handles not permitted on GPU %d: cuMemCreate "
             "said CUDA_ERROR_NOT_PERMITTED (no IMEX channel); using POSIX "
             "file descriptors", ordinal);
  } else {
    fabric_rc[ordinal] = GPUIPC_E_UNSUPPORTED;
    snprintf(why, cap, "fabric handles not usable on GPU %d: cuMemCreate "
             "said %s; using POSIX file descriptors", ordinal,
             name != NULL ? name : "an unknown error");
  }
  GPUIPC_LOG_I("vmm: %s", why);
}

/* 0 when fabric handles work on @ordinal, else the code (with sentence). */
static int fabric_check(int ordinal, bool with_sentence)
{
  if (ordinal >= MAX_DEV)
    return with_sentence ? gpuipc__err(GPUIPC_E_UNSUPPORTED,
                                       "fabric probe: device %d is past the "
                                       "%d this build tracks", ordinal,
                                       MAX_DEV)
                         : GPUIPC_E_UNSUPPORTED;
  pthread_mutex_lock(&fabric_lock);
  if (!fabric_known[ordinal])
    fabric_probe(ordinal);
  int rc = fabric_rc[ordinal];
  char why[sizeof(fabric_why[0])];
  memcpy(why, fabric_why[ordinal], sizeof(why));
  pthread_mutex_unlock(&fabric_lock);
  if (rc != 0 && with_sentence)
    return gpuipc__err(rc, "%s", why);
  return rc;
}

int gpuipc_fabric_status(int device)
{
  int rc = gpuipc__dev_check(device, "gpuipc_fabric_status");
  if (rc != 0)
    return rc;
  if (gpuipc__cu.cuMemCreate == NULL)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED, "the driver lacks cuMemCreate");
  struct gpuipc__ctx_saved saved;
  rc = gpuipc__ctx_enter(device, &saved);
  if (rc != 0)
    return rc;
  rc = fabric_check(device, true);
  gpuipc__ctx_leave(&saved);
  return rc;
}

/* ----- the kind ----- */

static int vmm_usable(const char *who)
{
  if (gpuipc__cu.cuMemCreate == NULL || gpuipc__cu.cuMemMap == NULL ||
      gpuipc__cu.cuMemExportToShareableHandle == NULL ||
      gpuipc__cu.cuMemImportFromShareableHandle == NULL)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED, "%s: the driver lacks the "
                       "virtual memory management calls", who);
  return 0;
}

static int vmm_available(void)
{
  int rc = gpuipc__cuda_load();
  if (rc == 0)
    rc = vmm_usable("VMM kind");
  if (rc != 0)
    return rc;
  int n = gpuipc__dev_count();
  for (int i = 0; i < n; i++) {
    const struct gpuipc__dev *d = gpuipc__dev_get(i);
    if (d->info.vmm && d->info.posix_fd)
      return 0;
  }
  return gpuipc__err(GPUIPC_E_UNSUPPORTED, "VMM kind: no visible device "
                     "supports virtual memory management with POSIX file "
                     "descriptor handles");
}

/*
 * Reserve @size bytes aligned to @g, map v->mh there and give local device
 * @device read-write access. On success v->va and v->map_size are set.
 */
static int map_rw(struct vmm *v, size_t size, size_t g, int device)
{
  int rc;
  CUdeviceptr va = 0;
  GPUIPC_CU_GOTO(rc, out, cuMemAddressReserve, &va, size, g, 0, 0);
  GPUIPC_CU_GOTO(rc, free_va, cuMemMap, va, size, 0, v->mh, 0);
  CUmemAccessDesc a;
  gpuipc__rw_access(&a, device);
  GPUIPC_CU_GOTO(rc, unmap, cuMemSetAccess, va, size, &a, 1);
  v->va = va;
  v->map_size = size;
  return 0;

unmap:
  gpuipc__cu.cuMemUnmap(va, size);
free_va:
  gpuipc__cu.cuMemAddressFree(va, size);
out:
  return rc;
}

static int vmm_alloc(struct gpuipc_buf *b)
{
  static const char who[] = "VMM alloc";
  int rc = gpuipc__dev_check(b->device, who);
  if (rc == 0)
    rc = vmm_usable(who);
  if (rc != 0)
    return rc;
  const struct gpuipc__dev *d = gpuipc__dev_get(b->device);
  if (!d->info.vmm || !d->info.posix_fd)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED, "%s: GPU %d (%s) lacks virtual "
                       "memory management with POSIX file descriptors", who,
                       b->device, d->info.uuid_str);
  struct vmm *v = calloc(1, sizeof(*v));
  if (v == NULL)
    return gpuipc__err(-ENOMEM, "%s: out of memory", who);
  struct gpuipc__ctx_saved saved;
  rc = gpuipc__ctx_enter(b->device, &saved);
  if (rc != 0)
    goto free_v;
  size_t g;
  rc = granularity(d, &g);
  if (rc != 0)
    goto leave_ctx;
  size_t size = gpuipc__round_up(b->size, g);
  if (size == 0) {
    rc = gpuipc__err(-EFBIG, "%s: %zu bytes cannot be rounded up to the "
                     "granularity", who, b->size);
    goto leave_ctx;
  }
  CUmemAllocationHandleType types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  if (fabric_check(b->device, false) == 0)
    types |= CU_MEM_HANDLE_TYPE_FABRIC;
  CUmemAllocationProp prop;
  prop_init(&prop, d, types);
  rc = gpuipc__cu_oom(gpuipc__cu.cuMemCreate(&v->mh, size, &prop, 0),
                      "cuMemCreate", size, b->device);
  if (rc != 0)
    goto leave_ctx;
  rc = map_rw(v, size, g, b->device);
  if (rc != 0)
    goto release_mh;
  gpuipc__ctx_leave(&saved);

  b->ptr = (void *)(uintptr_t)v->va;
  b->alloc_size = size;
  b->offset = 0;
  b->fd = -1; /* an fd is made for each export */
  memcpy(b->uuid, d->info.uuid, 16);
  b->priv = v;
  return 0;

release_mh:
  gpuipc__cu.cuMemRelease(v->mh);
leave_ctx:
  gpuipc__ctx_leave(&saved);
free_v:
  free(v);
  return rc;
}

static int vmm_export(struct gpuipc_buf *b, gpuipc_handle_t *h)
{
  struct vmm *v = b->priv;
  int fd = -1;
  if (b->imported) {
    /* An imported handle cannot be exported again: pass on our fd. */
    if (b->fd < 0)
      return gpuipc__err(GPUIPC_E_UNSUPPORTED, "VMM export: this buffer was "
                         "imported without a file descriptor and cannot be "
                         "exported again");
    int rc = gpuipc__fd_dup(b->fd, &fd);
    if (rc != 0)
      return rc;
  } else {
    int rc = GPUIPC_CU(cuMemExportToShareableHandle, &fd, v->mh,
                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (rc != 0)
      return rc;
    rc = gpuipc__fd_keep(fd, "VMM export");
    if (rc != 0) {
      close(fd);
      return rc;
    }
  }
  h->type = GPUIPC_HT_POSIX_FD;
  memset(h->bytes, 0, sizeof(h->bytes));
  h->fd = fd;
  return 0;
}

static int vmm_import(struct gpuipc_buf *b, const gpuipc_handle_t *h)
{
  static const char who[] = "VMM import";
  int rc = vmm_usable(who);
  if (rc != 0)
    return rc;
  if (h->type != GPUIPC_HT_POSIX_FD && h->type != GPUIPC_HT_FABRIC)
    return gpuipc__err(GPUIPC_E_BADHANDLE, "%s: handle type %d is not a "
                       "POSIX fd or fabric handle", who, (int)h->type);
  if (h->type == GPUIPC_HT_POSIX_FD && h->fd < 0)
    return gpuipc__err(GPUIPC_E_BADHANDLE, "%s: the handle has no fd", who);
  int owner, access;
  rc = gpuipc__gpu_import_devices(h, b->device, who, &owner, &access);
  if (rc != 0)
    return rc;
  const struct gpuipc__dev *od = gpuipc__dev_get(owner);
  size_t g;
  rc = granularity(od, &g);
  if (rc != 0)
    return rc;
  /* Map only what the handle lets us use, from the start of the memory. */
  size_t size = gpuipc__round_up((size_t)(h->offset + h->size), g);
  if (size == 0 || size > h->alloc_size)
    return gpuipc__err(GPUIPC_E_BADHANDLE, "%s: offset %llu + size %llu "
                       "rounded to %zu exceeds the allocation's %llu bytes",
                       who, (unsigned long long)h->offset,
                       (unsigned long long)h->size, g,
                       (unsigned long long)h->alloc_size);
  struct vmm *v = calloc(1, sizeof(*v));
  if (v == NULL)
    return gpuipc__err(-ENOMEM, "%s: out of memory", who);
  /* For exporting it again: the caller's own (GPUIPC_BUF_TAKE_FD, which
   * gpuipc_buf_import hands back on failure), else a duplicate. */
  int keep_fd = -1;
  if (h->type == GPUIPC_HT_POSIX_FD && b->take_fd)
    rc = b->fd_cloexec ? 0 : gpuipc__fd_keep(h->fd, "gpuipc_buf_import");
  else if (h->type == GPUIPC_HT_POSIX_FD)
    rc = gpuipc__fd_dup(h->fd, &keep_fd);
  if (rc != 0)
    goto free_v;
  struct gpuipc__ctx_saved saved;
  rc = gpuipc__ctx_enter(access, &saved);
  if (rc != 0)
    goto close_fd;
  CUresult r;
  if (h->type == GPUIPC_HT_POSIX_FD) {
    r = gpuipc__cu.cuMemImportFromShareableHandle(
        &v->mh, (void *)(uintptr_t)h->fd,
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  } else {
    CUmemFabricHandle fh;
    memcpy(fh.data, h->bytes, sizeof(fh.data));
    r = gpuipc__cu.cuMemImportFromShareableHandle(&v->mh, &fh,
                                                  CU_MEM_HANDLE_TYPE_FABRIC);
  }
  if (r != CUDA_SUCCESS) {
    const char *name = NULL;
    gpuipc__cu.cuGetErrorName(r, &name);
    rc = gpuipc__err(GPUIPC_E_BADHANDLE,
                     "%s: cuMemImportFromShareableHandle(%s %d) said %s: not "
                     "a CUDA allocation this process can import", who,
                     h->type == GPUIPC_HT_POSIX_FD ? "fd" : "fabric handle",
                     h->type == GPUIPC_HT_POSIX_FD ? h->fd : 0,
                     name != NULL ? name : "an unknown error");
    goto leave_ctx;
  }
  rc = map_rw(v, size, g, access);
  if (rc != 0)
    goto release_mh;
  gpuipc__ctx_leave(&saved);

  b->ptr = (void *)(uintptr_t)(v->va + h->offset);
  b->alloc_size = (size_t)h->alloc_size;
  b->offset = (size_t)h->offset;
  b->device = access;
  memcpy(b->uuid, h->device_uuid, 16);
  b->fd = h->type == GPUIPC_HT_POSIX_FD && b->take_fd ? h->fd : keep_fd;
  b->priv = v;
  return 0;

release_mh:
  gpuipc__cu.cuMemRelease(v->mh);
leave_ctx:
  gpuipc__ctx_leave(&saved);
close_fd:
  gpuipc__fd_close(&keep_fd);
free_v:
  free(v);
  return rc;
}

static int vmm_release(struct gpuipc_buf *b)
{
  struct vmm *v = b->priv;
  int rc = 0, r2;
  if (v != NULL) {
    struct gpuipc__ctx_saved saved;
    bool entered = gpuipc__ctx_enter(b->device, &saved) == 0;
    rc = GPUIPC_CU(cuMemUnmap, v->va, v->map_size);
    r2 = GPUIPC_CU(cuMemAddressFree, v->va, v->map_size);
    rc = rc != 0 ? rc : r2;
    r2 = GPUIPC_CU(cuMemRelease, v->mh);
    rc = rc != 0 ? rc : r2;
    if (entered)
      gpuipc__ctx_leave(&saved);
    free(v);
    b->priv = NULL;
  }
  gpuipc__fd_close(&b->fd);
  return rc;
}

int gpuipc__vmm_granularity(int device, size_t *out)
{
  return granularity(gpuipc__dev_get(device), out);
}

/* gpuipc_buf_access: in the context of the device granted, as imports do. */
static int vmm_access(struct gpuipc_buf *b, int device, int owner)
{
  struct vmm *v = b->priv;
  CUmemAccessDesc a;
  gpuipc__rw_access(&a, device);
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(device, &saved);
  if (rc != 0)
    return rc;
  rc = GPUIPC_CU(cuMemSetAccess, v->va, v->map_size, &a, 1);
  gpuipc__ctx_leave(&saved);
  return rc;
}

/*
 * gpuipc_buf_export_foreign: the cuMemCreate allocation mapped at [base,
 * base + alloc_size), by fd.
 */
static int vmm_export_foreign(const struct gpuipc__foreign_range *r,
                              gpuipc_handle_t *h)
{
  static const char who[] = "gpuipc_buf_export_foreign";
  CUdeviceptr p = (CUdeviceptr)r->ptr, base = (CUdeviceptr)r->base;
  size_t size = r->size, rsize = r->alloc_size;
  unsigned long long types = 0;
  int rc = gpuipc__ptr_attr(&types, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
                            p, "cuPointerGetAttribute(ALLOWED_HANDLE_TYPES)");
  if (rc != 0)
    return rc;
  if (!(types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    return gpuipc__err(GPUIPC_E_UNSUPPORTED,
                       "%s: 0x%llx was created without "
                       "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (handle "
                       "types 0x%llx): it cannot be shared", who,
                       (unsigned long long)p, types);
  if ((p != base || size != rsize) &&
      !(r->flags & GPUIPC_FOREIGN_ALLOW_WHOLEBLOCK))
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
  rc = gpuipc__fd_keep(fd, who);
  if (rc != 0) {
    close(fd);
    return rc;
  }
  h->kind = GPUIPC_KIND_VMM;
  h->type = GPUIPC_HT_POSIX_FD;
  h->fd = fd;
  return 0;
}

const struct gpuipc__kind_ops gpuipc__vmm_ops = {
    .kind = GPUIPC_KIND_VMM,
    .available = vmm_available,
    .alloc = vmm_alloc,
    .export = vmm_export,
    .import = vmm_import,
    .release = vmm_release,
    .access = vmm_access,
    .export_foreign = vmm_export_foreign,
};

#else /* !GPUIPC_HAVE_CUDA */

int gpuipc_fabric_status(int device)
{
  int rc = gpuipc__dev_check(device, "gpuipc_fabric_status");
  return rc != 0 ? rc
                 : gpuipc__err(GPUIPC_E_UNSUPPORTED,
                               "gpuipc_fabric_status: built without CUDA");
}

#endif
