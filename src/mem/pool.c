/*
 * The POOL kind: a stream-ordered memory pool per device, created with
 * POSIX-FD handles. The pool is exported once (its fd travels with every
 * handle; a channel sends it only to peers that lack it) and each buffer by
 * cuMemPoolExportPointer's 64 bytes, which is cheap.
 *
 * Whoever holds the pool's fd can import any of its allocations given their
 * export data: sharing a pool shares it whole. Importers must free an
 * imported buffer before its exporter frees it (the driver's rule).
 *
 * Importers open each (exporter, pool) once and count the buffers using it.
 */
#include "cuda/peer.h"
#include "mem/gpu.h"
#include "os/os.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if GPUIPC_HAVE_CUDA

#define MAX_DEV 64
/* Pool allocations are rounded to this. */
#define POOL_ALIGN 512u

/* This process's pool on one device, made on first use, kept until exit. */
struct local_pool {
  CUmemoryPool pool;
  CUstream stream; /* allocations and frees are ordered here */
  int fd;          /* the pool's shareable handle */
};

/* A pool imported from another process. */
struct remote_pool {
  struct remote_pool *next;
  uint8_t boot_id[16];
  uint64_t pidns;
  uint32_t pid;
  uint64_t nonce;
  uint8_t uuid[16];
  CUmemoryPool pool;
  int fd;                 /* kept to export the buffers again */
  int owner;              /* local ordinal of the pool's device */
  uint64_t access[MAX_DEV / 64]; /* devices granted access */
  long refs;              /* buffers from it, under pools_lock */
};

struct pool_buf {
  CUdeviceptr ptr;
  struct remote_pool *remote; /* NULL for our own allocation */
};

static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
static struct local_pool local[MAX_DEV];
static bool local_ready[MAX_DEV];
static struct remote_pool *remotes;
static uint64_t remotes_imported; /* pools imported, ever */
static uint64_t remotes_live;

static int pool_usable(const char *who)
{
  if (gpuipc__cu.cuMemPoolCreate == NULL ||
      gpuipc__cu.cuMemAllocFromPoolAsync == NULL ||
      gpuipc__cu.cuMemPoolExportToShareableHandle == NULL ||
      gpuipc__cu.cuMemPoolImportFromShareableHandle == NULL ||
      gpuipc__cu.cuMemPoolExportPointer == NULL ||
      gpuipc__cu.cuMemPoolImportPointer == NULL ||
      gpuipc__cu.cuMemFreeAsync == NULL)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED, "%s: the driver lacks "
                       "shareable memory pools", who);
  return 0;
}

static bool dev_has_pools(const struct gpuipc__dev *d)
{
  return d->info.mem_pools &&
         (d->info.pool_handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
}

static int pool_available(void)
{
  int rc = gpuipc__cuda_load();
  if (rc == 0)
    rc = pool_usable("POOL kind");
  if (rc != 0)
    return rc;
  int n = gpuipc__dev_count();
  for (int i = 0; i < n; i++)
    if (dev_has_pools(gpuipc__dev_get(i)))
      return 0;
  return gpuipc__err(GPUIPC_E_UNSUPPORTED, "POOL kind: no visible device "
                     "has memory pools with POSIX file descriptor handles");
}

/* This process's pool on @dev, created on first use. Caller in its ctx. */
static int local_pool_get(int dev, struct local_pool **out)
{
  static const char who[] = "POOL alloc";
  if (dev >= MAX_DEV)
    return gpuipc__err(-ERANGE, "%s: device %d is past the %d this build "
                       "tracks", who, dev, MAX_DEV);
  pthread_mutex_lock(&pools_lock);
  struct local_pool *lp = &local[dev];
  if (local_ready[dev]) {
    pthread_mutex_unlock(&pools_lock);
    *out = lp;
    return 0;
  }
  const struct gpuipc__dev *d = gpuipc__dev_get(dev);
  CUmemPoolProps props;
  memset(&props, 0, sizeof(props));
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = d->cu_dev;
  int rc;
  int fd = -1;
  GPUIPC_CU_GOTO(rc, unlock, cuMemPoolCreate, &lp->pool, &props);
  GPUIPC_CU_GOTO(rc, destroy_pool, cuStreamCreate, &lp->stream,
                 CU_STREAM_NON_BLOCKING);
  GPUIPC_CU_GOTO(rc, destroy_stream, cuMemPoolExportToShareableHandle, &fd,
                 lp->pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  rc = gpuipc__fd_keep(fd, who);
  if (rc != 0) {
    close(fd);
    goto destroy_stream;
  }
  lp->fd = fd;
  local_ready[dev] = true;
  pthread_mutex_unlock(&pools_lock);
  *out = lp;
  return 0;

destroy_stream:
  gpuipc__cu.cuStreamDestroy(lp->stream);
destroy_pool:
  gpuipc__cu.cuMemPoolDestroy(lp->pool);
unlock:
  pthread_mutex_unlock(&pools_lock);
  return rc;
}

static int pool_alloc(struct gpuipc_buf *b)
{
  static const char who[] = "POOL alloc";
  int rc = gpuipc__dev_check(b->device, who);
  if (rc == 0)
    rc = pool_usable(who);
  if (rc != 0)
    return rc;
  const struct gpuipc__dev *d = gpuipc__dev_get(b->device);
  if (!dev_has_pools(d))
    return gpuipc__err(GPUIPC_E_UNSUPPORTED, "%s: GPU %d (%s) lacks memory "
                       "pools with POSIX file descriptor handles", who,
                       b->device, d->info.uuid_str);
  size_t size = gpuipc__round_up(b->size, POOL_ALIGN);
  if (size == 0)
    return gpuipc__err(-EFBIG, "%s: %zu bytes is too large", who, b->size);
  struct pool_buf *pb = calloc(1, sizeof(*pb));
  if (pb == NULL)
    return gpuipc__err(-ENOMEM, "%s: out of memory", who);
  struct gpuipc__ctx_saved saved;
  rc = gpuipc__ctx_enter(b->device, &saved);
  if (rc != 0)
    goto free_pb;
  struct local_pool *lp = NULL;
  rc = local_pool_get(b->device, &lp);
  if (rc != 0)
    goto leave_ctx;
  rc = gpuipc__cu_oom(
      gpuipc__cu.cuMemAllocFromPoolAsync(&pb->ptr, size, lp->pool, lp->stream),
      "cuMemAllocFromPoolAsync", size, b->device);
  if (rc != 0)
    goto leave_ctx;
  /* Complete before anyone, here or in an importer, touches it. */
  GPUIPC_CU_GOTO(rc, free_mem, cuStreamSynchronize, lp->stream);
  gpuipc__ctx_leave(&saved);

  b->ptr = (void *)(uintptr_t)pb->ptr;
  b->alloc_size = size;
  b->offset = 0;
  b->fd = -1;
  memcpy(b->uuid, d->info.uuid, 16);
  b->priv = pb;
  return 0;

free_mem:
  gpuipc__cu.cuMemFreeAsync(pb->ptr, lp->stream);
  gpuipc__cu.cuStreamSynchronize(lp->stream);
leave_ctx:
  gpuipc__ctx_leave(&saved);
free_pb:
  free(pb);
  return rc;
}

static int pool_export(struct gpuipc_buf *b, gpuipc_handle_t *h)
{
  struct pool_buf *pb = b->priv;
  int pool_fd;
  if (pb->remote != NULL) {
    pool_fd = pb->remote->fd;
  } else {
    pthread_mutex_lock(&pools_lock);
    pool_fd = local[b->device].fd;
    pthread_mutex_unlock(&pools_lock);
  }
  CUmemPoolPtrExportData data;
  int rc = GPUIPC_CU(cuMemPoolExportPointer, &data, pb->ptr);
  if (rc != 0)
    return rc;
  int fd = -1;
  rc = gpuipc__fd_dup(pool_fd, &fd);
  if (rc != 0)
    return rc;
  h->type = GPUIPC_HT_POOL;
  _Static_assert(sizeof(data.reserved) == GPUIPC_HANDLE_BYTES,
                 "CUmemPoolPtrExportData is 64 bytes");
  memcpy(h->bytes, data.reserved, GPUIPC_HANDLE_BYTES);
  h->fd = fd;
  return 0;
}

/*
 * Let @device use @rp's memory. Imported pools start out reachable from
 * their own device only. Caller holds pools_lock.
 */
static int remote_grant(struct remote_pool *rp, int device)
{
  uint64_t bit = 1ull << (device % 64);
  if (device == rp->owner || (rp->access[device / 64] & bit))
    return 0;
  CUmemAccessDesc a;
  gpuipc__rw_access(&a, device);
  int rc = GPUIPC_CU(cuMemPoolSetAccess, rp->pool, &a, 1);
  if (rc == 0)
    rp->access[device / 64] |= bit;
  return rc;
}

/* The imported pool @h's buffer comes from, imported now if need be. */
static int remote_get(const gpuipc_handle_t *h, int owner, int access,
                      struct remote_pool **out)
{
  static const char who[] = "POOL import";
  pthread_mutex_lock(&pools_lock);
  struct remote_pool *rp;
  for (rp = remotes; rp != NULL; rp = rp->next)
    if (rp->nonce == h->nonce && rp->pid == h->pid && rp->pidns == h->pidns &&
        memcmp(rp->boot_id, h->boot_id, 16) == 0 &&
        memcmp(rp->uuid, h->device_uuid, 16) == 0)
      break;
  int rc;
  if (rp == NULL) {
    rp = calloc(1, sizeof(*rp));
    if (rp == NULL) {
      rc = gpuipc__err(-ENOMEM, "%s: out of memory", who);
      goto unlock;
    }
    rp->fd = -1;
    rc = gpuipc__fd_dup(h->fd, &rp->fd);
    if (rc != 0)
      goto free_rp;
    CUresult r = gpuipc__cu.cuMemPoolImportFromShareableHandle(
        &rp->pool, (void *)(uintptr_t)h->fd,
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (r != CUDA_SUCCESS) {
      const char *name = NULL;
      gpuipc__cu.cuGetErrorName(r, &name);
      rc = gpuipc__err(GPUIPC_E_BADHANDLE,
                       "%s: cuMemPoolImportFromShareableHandle(fd %d) said "
                       "%s: not a memory pool this process can import", who,
                       h->fd, name != NULL ? name : "an unknown error");
      goto close_fd;
    }
    memcpy(rp->boot_id, h->boot_id, 16);
    rp->pidns = h->pidns;
    rp->pid = h->pid;
    rp->nonce = h->nonce;
    memcpy(rp->uuid, h->device_uuid, 16);
    rp->owner = owner;
    rp->next = remotes;
    remotes = rp;
    remotes_imported++;
    remotes_live++;
  }
  rc = remote_grant(rp, access);
  if (rc != 0)
    goto unlock; /* the pool stays cached, with its other buffers */
  rp->refs++;
  pthread_mutex_unlock(&pools_lock);
  *out = rp;
  return 0;

close_fd:
  gpuipc__fd_close(&rp->fd);
free_rp:
  free(rp);
unlock:
  pthread_mutex_unlock(&pools_lock);
  return rc;
}

/* Drop one buffer's reference on @rp; the last one destroys the import. */
static void remote_put(struct remote_pool *rp)
{
  pthread_mutex_lock(&pools_lock);
  bool last = --rp->refs == 0;
  if (last)
    for (struct remote_pool **pp = &remotes; *pp != NULL; pp = &(*pp)->next)
      if (*pp == rp) {
        *pp = rp->next;
        remotes_live--;
        break;
      }
  pthread_mutex_unlock(&pools_lock);
  if (!last)
    return;
  gpuipc__cu.cuMemPoolDestroy(rp->pool);
  gpuipc__fd_close(&rp->fd);
  free(rp);
}

static int pool_import(struct gpuipc_buf *b, const gpuipc_handle_t *h)
{
  static const char who[] = "POOL import";
  int rc = pool_usable(who);
  if (rc != 0)
    return rc;
  if (h->type != GPUIPC_HT_POOL || h->fd < 0)
    return gpuipc__err(GPUIPC_E_BADHANDLE, "%s: %s", who,
                       h->type != GPUIPC_HT_POOL ? "handle type is not POOL"
                                                 : "the handle has no fd");
  if (gpuipc__handle_is_self(h))
    return gpuipc__err(GPUIPC_E_UNSUPPORTED, "%s: a process cannot import "
                       "its own pool", who);
  int owner, access;
  rc = gpuipc__gpu_import_devices(h, b->device, who, &owner, &access);
  if (rc != 0)
    return rc;
  struct pool_buf *pb = calloc(1, sizeof(*pb));
  if (pb == NULL)
    return gpuipc__err(-ENOMEM, "%s: out of memory", who);
  struct gpuipc__ctx_saved saved;
  rc = gpuipc__ctx_enter(access, &saved);
  if (rc != 0)
    goto free_pb;
  rc = remote_get(h, owner, access, &pb->remote);
  if (rc != 0)
    goto leave_ctx;
  CUmemPoolPtrExportData data;
  memcpy(data.reserved, h->bytes, GPUIPC_HANDLE_BYTES);
  CUresult r = gpuipc__cu.cuMemPoolImportPointer(&pb->ptr, pb->remote->pool,
                                                 &data);
  if (r != CUDA_SUCCESS) {
    const char *name = NULL;
    gpuipc__cu.cuGetErrorName(r, &name);
    if (gpuipc__exporter_gone(h->boot_id, h->pidns, h->pid))
      rc = gpuipc__err(GPUIPC_E_PEER_GONE, "%s: the process %u that "
                       "allocated this POOL buffer has exited", who, h->pid);
    else
      rc = gpuipc__err(GPUIPC_E_BADHANDLE, "%s: cuMemPoolImportPointer said "
                       "%s: the export data do not name a live allocation "
                       "of that pool", who,
                       name != NULL ? name : "an unknown error");
    goto put_pool;
  }
  gpuipc__ctx_leave(&saved);

  b->ptr = (void *)(uintptr_t)(pb->ptr + h->offset);
  b->alloc_size = (size_t)h->alloc_size;
  b->offset = (size_t)h->offset;
  b->device = access;
  memcpy(b->uuid, h->device_uuid, 16);
  b->fd = -1; /* the pool's fd is kept with the pool */
  b->priv = pb;
  return 0;

put_pool:
  remote_put(pb->remote);
leave_ctx:
  gpuipc__ctx_leave(&saved);
free_pb:
  free(pb);
  return rc;
}

static int pool_release(struct gpuipc_buf *b)
{
  struct pool_buf *pb = b->priv;
  if (pb == NULL)
    return 0;
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(b->device, &saved);
  if (rc == 0) {
    if (pb->remote != NULL) {
      rc = GPUIPC_CU(cuMemFree, pb->ptr);
    } else {
      CUstream s = local[b->device].stream; /* set once, before b existed */
      rc = GPUIPC_CU(cuMemFreeAsync, pb->ptr, s);
      if (rc == 0)
        rc = GPUIPC_CU(cuStreamSynchronize, s);
    }
    if (pb->remote != NULL)
      remote_put(pb->remote);
    gpuipc__ctx_leave(&saved);
  } else if (pb->remote != NULL) {
    remote_put(pb->remote);
  }
  free(pb);
  b->priv = NULL;
  return rc;
}

/* Let @device use the pool of @b. Caller holds pools_lock. */
static int pool_grant(struct gpuipc_buf *b, int device)
{
  struct pool_buf *pb = b->priv;
  if (pb->remote != NULL)
    return remote_grant(pb->remote, device);
  CUmemAccessDesc a;
  gpuipc__rw_access(&a, device);
  return GPUIPC_CU(cuMemPoolSetAccess, local[b->device].pool, &a, 1);
}

/* gpuipc_buf_access: in the context of the device granted, as imports do. */
static int pool_access(struct gpuipc_buf *b, int device, int owner)
{
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(device, &saved);
  if (rc != 0)
    return rc;
  pthread_mutex_lock(&pools_lock);
  rc = pool_grant(b, device);
  pthread_mutex_unlock(&pools_lock);
  gpuipc__ctx_leave(&saved);
  return rc;
}

void gpuipc__pool_stats(uint64_t *imported, uint64_t *live)
{
  pthread_mutex_lock(&pools_lock);
  *imported = remotes_imported;
  *live = remotes_live;
  pthread_mutex_unlock(&pools_lock);
}

const struct gpuipc__kind_ops gpuipc__pool_ops = {
    .kind = GPUIPC_KIND_POOL,
    .available = pool_available,
    .alloc = pool_alloc,
    .export = pool_export,
    .import = pool_import,
    .release = pool_release,
    .access = pool_access,
};

#else /* !GPUIPC_HAVE_CUDA */

void gpuipc__pool_stats(uint64_t *imported, uint64_t *live)
{
  *imported = 0;
  *live = 0;
}

#endif
