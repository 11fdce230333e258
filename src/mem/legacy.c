/*
 * The LEGACY kind: cuMemAlloc rounded up to whole 2 MiB blocks, shared by
 * cuIpcGetMemHandle / cuIpcOpenMemHandle (what PyTorch, CuPy and the CUDA
 * samples speak). A legacy handle shares the whole block it points into,
 * so each buffer is a block-aligned allocation of its own. Its memory dies
 * with the allocating process.
 *
 * Importers open each legacy handle once per process, whatever the driver
 * does on a second open (some return the same pointer, older ones fail):
 * the openings are counted here.
 */
#include "cuda/peer.h"
#include "mem/gpu.h"
#include "os/os.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if GPUIPC_HAVE_CUDA

/* A legacy handle this process has opened. */
struct legacy_open {
  struct legacy_open *next;
  uint64_t hash;                    /* of the key, compared first */
  uint8_t key[GPUIPC_HANDLE_BYTES]; /* the CUipcMemHandle */
  CUdeviceptr base;
  size_t size; /* of the block, as the driver reports it after the open */
  int device; /* whose context opened it */
  long refs;  /* buffers using it, under opens_lock */
};

struct legacy {
  CUdeviceptr base;          /* the allocation (ours) or the opening */
  struct legacy_open *open;  /* NULL for our own allocation */
  CUipcMemHandle ipc;
};

/*
 * The openings by key, in buckets: a first import looks up a key no
 * bucket holds, and a process importing a PyTorch model's blocks holds
 * hundreds; one list walked whole cost a cache miss an opening.
 */
#define OPEN_BUCKETS 256
static pthread_mutex_t opens_lock = PTHREAD_MUTEX_INITIALIZER;
static struct legacy_open *opens[OPEN_BUCKETS];

/* FNV-1a over the handle's 64-bit words, then folded. */
static uint64_t key_hash(const uint8_t *k)
{
  uint64_t x = 0xcbf29ce484222325ull;
  for (int i = 0; i < GPUIPC_HANDLE_BYTES; i += 8) {
    uint64_t w;
    memcpy(&w, k + i, 8);
    x = (x ^ w) * 0x100000001b3ull;
  }
  return x ^ (x >> 29) ^ (x >> 47);
}

static struct legacy_open **bucket(uint64_t hash)
{
  return &opens[hash % OPEN_BUCKETS];
}

static int legacy_usable(const char *who)
{
  if (gpuipc__cu.cuIpcGetMemHandle == NULL ||
      gpuipc__cu.cuIpcOpenMemHandle == NULL ||
      gpuipc__cu.cuIpcCloseMemHandle == NULL)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED, "%s: the driver lacks legacy "
                       "IPC (cuIpcGetMemHandle)", who);
  return 0;
}

static int legacy_available(void)
{
  int rc = gpuipc__cuda_load();
  if (rc == 0)
    rc = legacy_usable("LEGACY kind");
  if (rc != 0)
    return rc;
  int n = gpuipc__dev_count();
  for (int i = 0; i < n; i++)
    if (gpuipc__dev_get(i)->info.unified_addressing)
      return 0;
  return gpuipc__err(GPUIPC_E_UNSUPPORTED, "LEGACY kind: legacy IPC needs "
                     "unified addressing, which no visible device has");
}

static int legacy_alloc(struct gpuipc_buf *b)
{
  static const char who[] = "LEGACY alloc";
  int rc = gpuipc__dev_check(b->device, who);
  if (rc == 0)
    rc = legacy_usable(who);
  if (rc != 0)
    return rc;
  size_t size = gpuipc__round_up(b->size, GPUIPC__LEGACY_BLOCK);
  if (size == 0)
    return gpuipc__err(-EFBIG, "%s: %zu bytes cannot be rounded up to 2 MiB",
                       who, b->size);
  struct legacy *l = calloc(1, sizeof(*l));
  if (l == NULL)
    return gpuipc__err(-ENOMEM, "%s: out of memory", who);
  struct gpuipc__ctx_saved saved;
  rc = gpuipc__ctx_enter(b->device, &saved);
  if (rc != 0)
    goto free_l;
  rc = gpuipc__cu_oom(gpuipc__cu.cuMemAlloc(&l->base, size), "cuMemAlloc",
                      size, b->device);
  if (rc != 0)
    goto leave_ctx;
  /* The handle must reveal nothing but this buffer: a block of its own. */
  CUdeviceptr rbase = 0;
  size_t rsize = 0;
  GPUIPC_CU_GOTO(rc, free_mem, cuMemGetAddressRange, &rbase, &rsize, l->base);
  if (rbase != l->base || rsize != size ||
      l->base % GPUIPC__LEGACY_BLOCK != 0) {
    rc = gpuipc__err(GPUIPC_E_UNSUPPORTED,
                     "%s: cuMemAlloc(%zu) gave [0x%llx, +%zu), not a "
                     "2 MiB-aligned allocation of its own: a legacy handle "
                     "to it could share other allocations' bytes", who, size,
                     (unsigned long long)rbase, rsize);
    goto free_mem;
  }
  GPUIPC_CU_GOTO(rc, free_mem, cuIpcGetMemHandle, &l->ipc, l->base);
  gpuipc__ctx_leave(&saved);

  b->ptr = (void *)(uintptr_t)l->base;
  b->alloc_size = size;
  b->offset = 0;
  b->fd = -1;
  memcpy(b->uuid, gpuipc__dev_get(b->device)->info.uuid, 16);
  b->priv = l;
  return 0;

free_mem:
  gpuipc__cu.cuMemFree(l->base);
leave_ctx:
  gpuipc__ctx_leave(&saved);
free_l:
  free(l);
  return rc;
}

static int legacy_export(struct gpuipc_buf *b, gpuipc_handle_t *h)
{
  struct legacy *l = b->priv;
  h->type = GPUIPC_HT_LEGACY;
  _Static_assert(sizeof(l->ipc.reserved) == GPUIPC_HANDLE_BYTES,
                 "CUipcMemHandle is 64 bytes");
  memcpy(h->bytes, l->ipc.reserved, GPUIPC_HANDLE_BYTES);
  h->fd = -1;
  return 0;
}

static int gone(const gpuipc_handle_t *h, const char *who)
{
  return gpuipc__err(GPUIPC_E_PEER_GONE, "%s: the process %u that allocated "
                     "this LEGACY memory has exited, and its memory with it",
                     who, h->pid);
}

/*
 * Open @ipc in the context of local device @access into @o: its base and
 * the size of the block as the driver reports it. Caller holds opens_lock.
 */
static int open_block(struct legacy_open *o, CUipcMemHandle ipc, int access)
{
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(access, &saved);
  if (rc != 0)
    return rc;
  GPUIPC_CU_GOTO(rc, leave_ctx, cuIpcOpenMemHandle, &o->base, ipc,
                 CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  CUdeviceptr rbase = 0;
  GPUIPC_CU_GOTO(rc, close_ipc, cuMemGetAddressRange, &rbase, &o->size,
                 o->base);
  if (rbase != o->base) {
    rc = gpuipc__err(GPUIPC_E_CUDA, "LEGACY import: the driver opened the "
                     "handle at 0x%llx, inside an allocation starting at "
                     "0x%llx", (unsigned long long)o->base,
                     (unsigned long long)rbase);
    goto close_ipc;
  }
  gpuipc__ctx_leave(&saved);
  return 0;

close_ipc:
  gpuipc__cu.cuIpcCloseMemHandle(o->base);
leave_ctx:
  gpuipc__ctx_leave(&saved);
  return rc;
}

/* Drop one reference on @o; the last one closes the opening. */
static int open_put(struct legacy_open *o)
{
  pthread_mutex_lock(&opens_lock);
  bool last = --o->refs == 0;
  if (last)
    for (struct legacy_open **pp = bucket(o->hash); *pp != NULL;
         pp = &(*pp)->next)
      if (*pp == o) {
        *pp = o->next;
        break;
      }
  pthread_mutex_unlock(&opens_lock);
  if (!last)
    return 0;
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(o->device, &saved);
  if (rc == 0) {
    rc = GPUIPC_CU(cuIpcCloseMemHandle, o->base);
    gpuipc__ctx_leave(&saved);
  }
  free(o);
  return rc;
}

static int legacy_import(struct gpuipc_buf *b, const gpuipc_handle_t *h)
{
  static const char who[] = "LEGACY import";
  int rc = legacy_usable(who);
  if (rc != 0)
    return rc;
  if (h->type != GPUIPC_HT_LEGACY)
    return gpuipc__err(GPUIPC_E_BADHANDLE, "%s: handle type %d is not "
                       "LEGACY", who, (int)h->type);
  if (gpuipc__handle_is_self(h))
    return gpuipc__err(GPUIPC_E_UNSUPPORTED, "%s: a process cannot open its "
                       "own legacy handle (use the pointer it exported)",
                       who);
  /* Cheap here; a failed open below asks thoroughly. */
  if (gpuipc__exporter_gone_fast(h->boot_id, h->pidns, h->pid))
    return gone(h, who);
  int owner, access;
  rc = gpuipc__gpu_import_devices(h, b->device, who, &owner, &access);
  if (rc != 0)
    return rc;
  /*
   * The opening below may be shared with an earlier import for another
   * device; peer access makes it reachable from this one (cached).
   */
  if (access != owner) {
    rc = gpuipc_peer_enable(access, owner);
    if (rc != 0)
      return rc;
  }
  struct legacy *l = calloc(1, sizeof(*l));
  if (l == NULL)
    return gpuipc__err(-ENOMEM, "%s: out of memory", who);
  memcpy(l->ipc.reserved, h->bytes, GPUIPC_HANDLE_BYTES);

  uint64_t hash = key_hash(h->bytes);
  pthread_mutex_lock(&opens_lock);
  struct legacy_open *o;
  for (o = *bucket(hash); o != NULL; o = o->next)
    if (o->hash == hash &&
        memcmp(o->key, h->bytes, GPUIPC_HANDLE_BYTES) == 0)
      break;
  if (o != NULL) {
    o->refs++;
  } else {
    o = calloc(1, sizeof(*o));
    if (o == NULL) {
      rc = gpuipc__err(-ENOMEM, "%s: out of memory", who);
      goto unlock;
    }
    rc = open_block(o, l->ipc, access);
    if (rc != 0) {
      free(o);
      if (gpuipc__exporter_gone(h->boot_id, h->pidns, h->pid))
        rc = gone(h, who);
      goto unlock;
    }
    memcpy(o->key, h->bytes, GPUIPC_HANDLE_BYTES);
    o->hash = hash;
    o->device = access;
    o->refs = 1;
    o->next = *bucket(hash);
    *bucket(hash) = o;
  }
  pthread_mutex_unlock(&opens_lock);

  /* The handle's claims against the block the driver opened. */
  if (h->offset > o->size || h->size > o->size - h->offset) {
    rc = gpuipc__err(GPUIPC_E_BADHANDLE, "%s: offset %llu + size %llu runs "
                     "past the end of the %zu-byte block the handle opens",
                     who, (unsigned long long)h->offset,
                     (unsigned long long)h->size, o->size);
    open_put(o);
    free(l);
    return rc;
  }
  l->open = o;
  l->base = o->base;
  b->ptr = (void *)(uintptr_t)(o->base + h->offset);
  b->alloc_size = o->size;
  b->offset = (size_t)h->offset;
  b->device = access;
  memcpy(b->uuid, h->device_uuid, 16);
  b->fd = -1;
  b->priv = l;
  return 0;

unlock:
  pthread_mutex_unlock(&opens_lock);
  free(l);
  return rc;
}

static int legacy_release(struct gpuipc_buf *b)
{
  struct legacy *l = b->priv;
  if (l == NULL)
    return 0;
  int rc = 0;
  struct legacy_open *o = l->open;
  if (o == NULL) {
    struct gpuipc__ctx_saved saved;
    rc = gpuipc__ctx_enter(b->device, &saved);
    if (rc == 0) {
      rc = GPUIPC_CU(cuMemFree, l->base);
      gpuipc__ctx_leave(&saved);
    }
  } else {
    rc = open_put(o);
  }
  free(l);
  b->priv = NULL;
  return rc;
}

/*
 * A handle that claims @b's identity must name the same block and place
 * in it: identities derived from a foreign handle's bytes
 * (gpuipc_handle_from_cuda_ipc) are hashes, and a hash can collide.
 */
static int legacy_same_export(const struct gpuipc_buf *b,
                              const gpuipc_handle_t *h)
{
  const struct legacy *l = b->priv;
  if (l != NULL && b->offset == h->offset &&
      memcmp(l->ipc.reserved, h->bytes, GPUIPC_HANDLE_BYTES) == 0)
    return 0;
  return gpuipc__err(GPUIPC_E_BADHANDLE, "LEGACY import: the handle claims "
                     "export %llu of pid %u, which this process holds for "
                     "another block or offset",
                     (unsigned long long)h->export_id, h->pid);
}

/*
 * gpuipc_buf_export_foreign: the cudaMalloc allocation [base, base +
 * alloc_size) by legacy IPC. Only a whole allocation that fills whole
 * blocks of its own keeps the neighbours' bytes out of the importer's
 * reach.
 */
static int legacy_export_foreign(const struct gpuipc__foreign_range *r,
                                 gpuipc_handle_t *h)
{
  static const char who[] = "gpuipc_buf_export_foreign";
  CUdeviceptr p = (CUdeviceptr)r->ptr, base = (CUdeviceptr)r->base;
  size_t size = r->size, rsize = r->alloc_size;
  bool whole = p == base && size == rsize &&
               base % GPUIPC__LEGACY_BLOCK == 0 &&
               rsize % GPUIPC__LEGACY_BLOCK == 0;
  if (!whole && !(r->flags & GPUIPC_FOREIGN_ALLOW_WHOLEBLOCK))
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

/* gpuipc_buf_access: cuMemAlloc memory (and its IPC mappings) follow peer
 * access. */
static int legacy_access(struct gpuipc_buf *b, int device, int owner)
{
  return gpuipc_peer_enable(device, owner);
}

/* gpuipc_buf_alive: an imported block dies with the process that
 * allocated it. */
static int legacy_alive(const struct gpuipc_buf *b)
{
  if (b->imported && gpuipc__exporter_gone(b->boot_id, b->pidns, b->pid))
    return gpuipc__err(GPUIPC_E_PEER_GONE,
                       "gpuipc_buf_alive: the process %u that allocated "
                       "this LEGACY buffer has exited, and its memory with it",
                       b->pid);
  return 0;
}

const struct gpuipc__kind_ops gpuipc__legacy_ops = {
    .kind = GPUIPC_KIND_LEGACY,
    .available = legacy_available,
    .alloc = legacy_alloc,
    .export = legacy_export,
    .import = legacy_import,
    .release = legacy_release,
    .same_export = legacy_same_export,
    .access = legacy_access,
    .alive = legacy_alive,
    .export_foreign = legacy_export_foreign,
};

#endif
