/*
 * The public buffer API, the registry of live buffers and the import cache.
 *
 * Every buffer this process allocated or imported is in one hash table keyed
 * by its identity: the exporting process (boot id, pid namespace, pid,
 * random nonce) and the export id that process never reuses. An import whose
 * identity is already there returns that buffer with one more reference and
 * makes no system or driver call; an import of this process's own export
 * finds the original buffer the same way. A buffer being imported sits in
 * the table as a placeholder so that concurrent imports of the same export
 * wait for one mapping instead of making two.
 *
 * Every mapped buffer is also in the index by address (index.c), under the
 * same lock: gpuipc_buf_find looks there.
 *
 * A kind is reached only through its gpuipc__kind_ops table (mem.h): the
 * calls here check what all kinds share and leave the rest to the kind.
 */
#include "mem/mem.h"

#include "cuda/cuda.h"
#include "mem/index.h"
#include "cuda/peer.h"
#include "os/os.h"
#include "wire/wire.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define REG_BUCKETS 1024u

struct registry {
  pthread_mutex_t lock;
  pthread_cond_t ready; /* a placeholder became ready or went away */
  struct gpuipc_buf *bucket[REG_BUCKETS];
  uint64_t hits, misses, live, kept;
};

static struct registry reg = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .ready = PTHREAD_COND_INITIALIZER,
};

/* gpuipc__buf_on_watched_last's function. */
static _Atomic(void (*)(void)) watched_last_fn;

static void reg_fork_prepare(void)
{
  pthread_mutex_lock(&reg.lock);
}

static void reg_fork_release(void)
{
  pthread_mutex_unlock(&reg.lock);
}

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void fork_install(void)
{
  (void)pthread_atfork(reg_fork_prepare, reg_fork_release, reg_fork_release);
}

void gpuipc__buf_fork_install(void)
{
  pthread_once(&fork_once, fork_install);
}

/* Export ids start at 1 and are never reused by this process. */
static atomic_uint_fast64_t next_export_id = 1;

/*
 * refs == 0 marks a buffer nobody may take now: a placeholder whose import
 * is in progress, or one whose release hook is deciding its fate -- unless
 * it is kept, then an import takes it back.
 */
#define PLACEHOLDER_REFS 0

static unsigned bucket_of(uint64_t nonce, uint64_t export_id)
{
  uint64_t x = nonce ^ (export_id * 0x9e3779b97f4a7c15ull);
  x ^= x >> 29;
  return (unsigned)(x % REG_BUCKETS);
}

static bool same_identity(const struct gpuipc_buf *b, const gpuipc_handle_t *h)
{
  return b->export_id == h->export_id && b->nonce == h->nonce &&
         b->pid == h->pid && b->pidns == h->pidns &&
         memcmp(b->boot_id, h->boot_id, sizeof(b->boot_id)) == 0;
}

/* Caller holds reg.lock. */
static struct gpuipc_buf *reg_find(const gpuipc_handle_t *h)
{
  struct gpuipc_buf *b = reg.bucket[bucket_of(h->nonce, h->export_id)];
  for (; b != NULL; b = b->next)
    if (same_identity(b, h))
      return b;
  return NULL;
}

/* Caller holds reg.lock. */
static void reg_insert(struct gpuipc_buf *b)
{
  unsigned i = bucket_of(b->nonce, b->export_id);
  b->next = reg.bucket[i];
  reg.bucket[i] = b;
  reg.live++;
}

/* Caller holds reg.lock. Nothing for a buffer not registered (an alias). */
static void reg_remove(struct gpuipc_buf *b)
{
  struct gpuipc_buf **pp = &reg.bucket[bucket_of(b->nonce, b->export_id)];
  for (; *pp != NULL; pp = &(*pp)->next) {
    if (*pp == b) {
      *pp = b->next;
      reg.live--;
      gpuipc__index_remove(b);
      return;
    }
  }
}

#if GPUIPC_HAVE_CUDA
#define CUDA_OPS(ops) (&(ops))
#else
#define CUDA_OPS(ops) NULL /* built without the CUDA header */
#endif

/*
 * The kinds' ops: a case for every kind of gpuipc.h's GPUIPC_KIND_MAP and
 * no default, so that the compiler (-Wswitch) asks for the ops of a kind
 * added there (tests/buf.c checks the answers).
 */
const struct gpuipc__kind_ops *gpuipc__kind_ops(gpuipc_kind_t kind)
{
  switch (kind) {
  case GPUIPC_KIND_AUTO:
    return NULL; /* a request, resolved by kind_resolve */
  case GPUIPC_KIND_HOST:
    return &gpuipc__host_ops;
  case GPUIPC_KIND_VMM:
    return CUDA_OPS(gpuipc__vmm_ops);
  case GPUIPC_KIND_LEGACY:
    return CUDA_OPS(gpuipc__legacy_ops);
  case GPUIPC_KIND_POOL:
    return CUDA_OPS(gpuipc__pool_ops);
  }
  return NULL;
}

/*
 * AUTO: VMM when a GPU can do it, else HOST. For visible device @device
 * (-1: none named), VMM when that device can do it, else LEGACY when it
 * can (a GPU without POSIX-descriptor VMM beside one with it).
 */
static gpuipc_kind_t kind_resolve(gpuipc_kind_t kind, int device)
{
  if (kind != GPUIPC_KIND_AUTO)
    return kind;
  const struct gpuipc__kind_ops *vmm = gpuipc__kind_ops(GPUIPC_KIND_VMM);
  if (vmm == NULL || vmm->available() != 0)
    return GPUIPC_KIND_HOST;
  const struct gpuipc__dev *d =
      device >= 0 && device < gpuipc__dev_count() ? gpuipc__dev_get(device)
                                                  : NULL;
  if (d == NULL || (d->info.vmm && d->info.posix_fd))
    return GPUIPC_KIND_VMM;
  const struct gpuipc__kind_ops *legacy =
      gpuipc__kind_ops(GPUIPC_KIND_LEGACY);
  if (legacy != NULL && d->info.unified_addressing &&
      legacy->available() == 0)
    return GPUIPC_KIND_LEGACY;
  return GPUIPC_KIND_VMM; /* which says why this device cannot */
}

static int kind_check(gpuipc_kind_t kind, const char *who)
{
  const struct gpuipc__kind_ops *ops = gpuipc__kind_ops(kind);
  if (ops == NULL)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED,
                       "%s: kind %s is not available in this build of gpuipc",
                       who, gpuipc_kind_name(kind));
  return ops->available();
}

int gpuipc_kind_available(gpuipc_kind_t kind)
{
  if (!gpuipc__kind_valid(kind))
    return gpuipc__err(-EINVAL, "gpuipc_kind_available: unknown kind %d",
                       (int)kind);
  return kind_check(kind_resolve(kind, -1), "gpuipc_kind_available");
}

static void set_identity_self(struct gpuipc_buf *b)
{
  const struct gpuipc__proc_id *me = gpuipc__proc_self();
  memcpy(b->boot_id, me->boot_id, sizeof(b->boot_id));
  b->pid = me->pid;
  b->pidns = me->pidns;
  b->nonce = me->nonce;
  b->export_id = atomic_fetch_add(&next_export_id, 1);
}

int gpuipc_buf_alloc(size_t size, gpuipc_kind_t kind, int device,
                     unsigned flags, gpuipc_buf_t **out)
{
  gpuipc__buf_fork_install();
  if (out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_buf_alloc: out is NULL");
  if (size == 0)
    return gpuipc__err(-EINVAL, "gpuipc_buf_alloc: size is 0");
  if (size > GPUIPC_SIZE_MAX_ABSURD)
    return gpuipc__err(-EFBIG,
                       "gpuipc_buf_alloc: size %zu exceeds the largest buffer "
                       "gpuipc describes (2^48 bytes)",
                       size);
  if (!gpuipc__kind_valid(kind))
    return gpuipc__err(-EINVAL, "gpuipc_buf_alloc: unknown kind %d",
                       (int)kind);
  if (flags & ~GPUIPC_BUF_UNPINNED)
    return gpuipc__err(-EINVAL, "gpuipc_buf_alloc: unknown flags 0x%x",
                       flags & ~GPUIPC_BUF_UNPINNED);

  kind = kind_resolve(kind, device);
  int rc = kind_check(kind, "gpuipc_buf_alloc");
  if (rc != 0)
    return rc;
  if (kind == GPUIPC_KIND_HOST) {
    device = -1;
  } else if (device < 0 || device >= gpuipc__dev_count()) {
    return gpuipc__err(-EINVAL,
                       "gpuipc_buf_alloc: device %d is not one of the %d "
                       "visible devices",
                       device, gpuipc__dev_count());
  }

  struct gpuipc_buf *b = calloc(1, sizeof(*b));
  if (b == NULL)
    return gpuipc__err(-ENOMEM, "gpuipc_buf_alloc: out of memory");
  b->ops = gpuipc__kind_ops(kind);
  b->kind = kind;
  b->size = size;
  b->device = device;
  b->fd = -1;
  b->unpinned = (flags & GPUIPC_BUF_UNPINNED) != 0;
  if (device >= 0)
    memcpy(b->uuid, gpuipc__dev_get(device)->info.uuid, sizeof(b->uuid));
  rc = b->ops->alloc(b);
  if (rc != 0)
    goto free_buf;
  set_identity_self(b);
  b->refs = 1;

  pthread_mutex_lock(&reg.lock);
  rc = gpuipc__index_add(b);
  if (rc == 0)
    reg_insert(b);
  pthread_mutex_unlock(&reg.lock);
  if (rc != 0) {
    (void)b->ops->release(b);
    rc = gpuipc__err(rc, "gpuipc_buf_alloc: out of memory");
    goto free_buf;
  }
  GPUIPC_LOG_D("allocated %s buffer of %zu bytes (export id %llu) at %p",
               gpuipc_kind_name(kind), size, (unsigned long long)b->export_id,
               b->ptr);
  *out = b;
  return 0;

free_buf:
  free(b);
  return rc;
}

void *gpuipc_buf_ptr(const gpuipc_buf_t *buf)
{
  return buf != NULL ? buf->ptr : NULL;
}

size_t gpuipc_buf_size(const gpuipc_buf_t *buf)
{
  return buf != NULL ? buf->size : 0;
}

gpuipc_kind_t gpuipc_buf_kind(const gpuipc_buf_t *buf)
{
  return buf != NULL ? buf->kind : GPUIPC_KIND_AUTO;
}

int gpuipc_buf_device(const gpuipc_buf_t *buf)
{
  return buf != NULL ? buf->device : -1;
}

/* The buffer whose kind keeps @b's memory: @b, or the base of an alias. */
static struct gpuipc_buf *buf_base(struct gpuipc_buf *b)
{
  return b->base != NULL ? b->base : b;
}

int gpuipc_buf_access(gpuipc_buf_t *buf, int device)
{
  static const char who[] = "gpuipc_buf_access";
  if (buf == NULL)
    return gpuipc__err(-EINVAL, "%s: NULL buffer", who);
  buf = buf_base(buf);
  if (buf->ops->access == NULL)
    return 0; /* HOST memory: every device reaches it */
  int rc = gpuipc__dev_check(device, who);
  if (rc != 0)
    return rc;
  if (device == buf->device)
    return 0;
  uint64_t bit = device < 64 ? (uint64_t)1 << device : 0;
  if (atomic_load_explicit(&buf->granted, memory_order_acquire) & bit)
    return 0;
  int owner = gpuipc_device_by_uuid(buf->uuid);
  if (owner < 0)
    return owner;
  rc = gpuipc__p2p_check(device, owner, who);
  if (rc == 0)
    rc = buf->ops->access(buf, device, owner);
  if (rc == 0)
    atomic_fetch_or_explicit(&buf->granted, bit, memory_order_release);
  return rc;
}

int gpuipc_buf_alive(const gpuipc_buf_t *buf)
{
  if (buf == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_buf_alive: NULL buffer");
  if (buf->base != NULL)
    buf = buf->base;
  return buf->ops->alive != NULL ? buf->ops->alive(buf) : 0;
}

int gpuipc_buf_export(gpuipc_buf_t *buf, gpuipc_handle_t *out)
{
  if (buf == NULL || out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_buf_export: %s is NULL",
                       buf == NULL ? "buf" : "out");
  buf = buf_base(buf);
  gpuipc_handle_t h;
  memset(&h, 0, sizeof(h));
  h.version = GPUIPC_HANDLE_VERSION;
  h.kind = buf->kind;
  h.size = buf->size;
  h.offset = buf->offset;
  h.alloc_size = buf->alloc_size;
  memcpy(h.device_uuid, buf->uuid, sizeof(h.device_uuid));
  h.export_id = buf->export_id;
  memcpy(h.boot_id, buf->boot_id, sizeof(h.boot_id));
  h.pid = buf->pid;
  h.pidns = buf->pidns;
  h.nonce = buf->nonce;
  h.fd = -1;
  int rc = buf->ops->export(buf, &h);
  if (rc != 0)
    return rc;
  *out = h;
  return 0;
}

/* Whether a reference to @b may be taken: it is in use, or kept. Caller
 * holds reg.lock. */
static bool takeable(const struct gpuipc_buf *b)
{
  return b->kept || b->refs != PLACEHOLDER_REFS;
}

/* One more reference to takeable @b. Caller holds reg.lock. */
static void take(struct gpuipc_buf *b)
{
  if (b->kept) { /* no reference, memory kept: take it back */
    b->kept = false;
    reg.kept--;
  }
  b->refs++;
}

/*
 * Find @h in the registry, waiting while another thread is importing it.
 * Returns the buffer with one more reference, or NULL after inserting
 * @placeholder for @h (the caller then imports and publishes it).
 */
static struct gpuipc_buf *lookup_or_reserve(const gpuipc_handle_t *h,
                                            struct gpuipc_buf *placeholder)
{
  pthread_mutex_lock(&reg.lock);
  for (;;) {
    struct gpuipc_buf *b = reg_find(h);
    if (b == NULL)
      break;
    if (takeable(b)) {
      take(b);
      reg.hits++;
      pthread_mutex_unlock(&reg.lock);
      return b;
    }
    pthread_cond_wait(&reg.ready, &reg.lock);
  }
  if (placeholder != NULL) {
    reg.misses++;
    reg_insert(placeholder);
  }
  pthread_mutex_unlock(&reg.lock);
  return NULL;
}

struct gpuipc_buf *gpuipc__buf_lookup(const gpuipc_handle_t *h)
{
  return lookup_or_reserve(h, NULL);
}

int gpuipc_buf_import(const gpuipc_handle_t *h, int device, unsigned flags,
                      gpuipc_buf_t **out)
{
  const unsigned known = GPUIPC_BUF_UNPINNED | GPUIPC_BUF_TAKE_FD;
  if (flags & ~known)
    return gpuipc__err(-EINVAL, "gpuipc_buf_import: unknown flags 0x%x",
                       flags & ~known);
  return gpuipc__buf_import(h, device, flags, out);
}

int gpuipc__buf_import(const gpuipc_handle_t *h, int device, unsigned flags,
                       gpuipc_buf_t **out)
{
  gpuipc__buf_fork_install();
  if (h == NULL || out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_buf_import: %s is NULL",
                       h == NULL ? "handle" : "out");
  int rc = gpuipc__handle_validate(h, "gpuipc_buf_import");
  if (rc != 0)
    return rc;
  /* The GPU kinds need the driver, which HOST work alone has not loaded. */
  if (h->kind != GPUIPC_KIND_HOST) {
    rc = gpuipc__cuda_load();
    if (rc != 0)
      return rc;
  }
  bool needs_fd = h->type == GPUIPC_HT_POSIX_FD || h->type == GPUIPC_HT_POOL;
  if (needs_fd && h->fd < 0)
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "gpuipc_buf_import: a %s handle needs its fd, and fd "
                       "is %d",
                       gpuipc_kind_name(h->kind), h->fd);
  /* -1 loads nothing: a HOST import must not start CUDA. */
  if (device < -1 || (device >= 0 && device >= gpuipc__dev_count()))
    return gpuipc__err(-EINVAL,
                       "gpuipc_buf_import: device %d is neither -1 nor one of "
                       "the %d visible devices",
                       device, gpuipc__dev_count());
  const struct gpuipc__kind_ops *ops = gpuipc__kind_ops(h->kind);
  if (ops == NULL)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED,
                       "gpuipc_buf_import: kind %s is not available in this "
                       "build of gpuipc",
                       gpuipc_kind_name(h->kind));
  /* Ours on success: kept by the kind (b->fd) or closed below. */
  int take = (flags & GPUIPC_BUF_TAKE_FD) && h->fd >= 0 ? h->fd : -1;

  struct gpuipc_buf *b = calloc(1, sizeof(*b));
  if (b == NULL)
    return gpuipc__err(-ENOMEM, "gpuipc_buf_import: out of memory");
  memcpy(b->boot_id, h->boot_id, sizeof(b->boot_id));
  b->pid = h->pid;
  b->pidns = h->pidns;
  b->nonce = h->nonce;
  b->export_id = h->export_id;
  b->refs = PLACEHOLDER_REFS;

  struct gpuipc_buf *hit = lookup_or_reserve(h, b);
  if (hit != NULL) {
    free(b);
    if (hit->kind != h->kind || hit->size != h->size) {
      gpuipc_buf_release(hit);
      return gpuipc__err(GPUIPC_E_BADHANDLE,
                         "gpuipc_buf_import: handle says %s of %llu bytes but "
                         "export %llu of pid %u is %s of %zu bytes",
                         gpuipc_kind_name(h->kind),
                         (unsigned long long)h->size,
                         (unsigned long long)h->export_id, h->pid,
                         gpuipc_kind_name(hit->kind), hit->size);
    }
    if (hit->ops->same_memory != NULL && h->fd >= 0) {
      rc = hit->ops->same_memory(hit, h->fd);
      if (rc != 0) {
        gpuipc_buf_release(hit);
        return rc;
      }
    }
    if (hit->ops->same_export != NULL) {
      rc = hit->ops->same_export(hit, h);
      if (rc != 0) {
        gpuipc_buf_release(hit);
        return rc;
      }
    }
    /* LEGACY memory dies with its allocator: a cached mapping of a dead
     * exporter must not be handed out (a kill(pid, 0), only for LEGACY). */
    if (hit->kind == GPUIPC_KIND_LEGACY) {
      rc = gpuipc_buf_alive(hit);
      if (rc != 0) {
        gpuipc_buf_release(hit);
        return rc;
      }
    }
    /* Mapped for another device first: this one must reach it too. */
    if (device >= 0 && device != hit->device &&
        hit->kind != GPUIPC_KIND_HOST) {
      rc = gpuipc_buf_access(hit, device);
      if (rc != 0) {
        gpuipc_buf_release(hit);
        return rc;
      }
    }
    gpuipc__fd_close(&take);
    *out = hit;
    return 0;
  }

  b->ops = ops;
  b->kind = h->kind;
  b->size = h->size;
  b->offset = h->offset;
  b->device = device;
  b->fd = -1;
  b->imported = true;
  b->unpinned = (flags & GPUIPC_BUF_UNPINNED) != 0;
  b->take_fd = take >= 0;
  b->fd_cloexec = b->take_fd && (flags & GPUIPC__BUF_FD_CLOEXEC);
  memcpy(b->uuid, h->device_uuid, sizeof(b->uuid));
  rc = ops->import(b, h);
  bool mapped = rc == 0;

  pthread_mutex_lock(&reg.lock);
  if (mapped)
    rc = gpuipc__index_add(b);
  if (rc == 0)
    b->refs = 1;
  else
    reg_remove(b);
  pthread_cond_broadcast(&reg.ready);
  pthread_mutex_unlock(&reg.lock);
  if (rc != 0) {
    if (mapped) {
      if (take >= 0 && b->fd == take)
        b->fd = -1; /* the caller's again */
      (void)ops->release(b);
      rc = gpuipc__err(rc, "gpuipc_buf_import: out of memory");
    }
    free(b);
    return rc;
  }
  if (take >= 0 && b->fd != take)
    gpuipc__fd_close(&take); /* the kind kept a duplicate, or nothing */
  GPUIPC_LOG_D("imported %s buffer of %zu bytes (export %llu of pid %u) at %p",
               gpuipc_kind_name(b->kind), b->size,
               (unsigned long long)b->export_id, b->pid, b->ptr);
  *out = b;
  return 0;
}

void gpuipc__buf_ref(struct gpuipc_buf *b)
{
  pthread_mutex_lock(&reg.lock);
  b->refs++;
  pthread_mutex_unlock(&reg.lock);
}

/* Whether @base is held by its watchers alone. Registry lock held. */
static bool watchers_alone(const struct gpuipc_buf *base)
{
  return base->last_watchers > 0 && base->refs <= base->last_watchers;
}

void gpuipc__buf_watch_last(const struct gpuipc_buf *b, bool on)
{
  struct gpuipc_buf *base = buf_base((struct gpuipc_buf *)b);
  pthread_mutex_lock(&reg.lock);
  base->last_watchers += on ? 1 : -1;
  pthread_mutex_unlock(&reg.lock);
}

void gpuipc__buf_on_watched_last(void (*fn)(void))
{
  atomic_store(&watched_last_fn, fn);
}

bool gpuipc__buf_watched_alone(const struct gpuipc_buf *b)
{
  const struct gpuipc_buf *base = buf_base((struct gpuipc_buf *)b);
  pthread_mutex_lock(&reg.lock);
  bool alone = watchers_alone(base);
  pthread_mutex_unlock(&reg.lock);
  return alone;
}

int gpuipc__buf_alias(struct gpuipc_buf *b, struct gpuipc_buf **out)
{
  b = buf_base(b);
  struct gpuipc_buf *a = malloc(sizeof(*a));
  if (a == NULL)
    return gpuipc__err(-ENOMEM, "out of memory for a handle on buffer %p",
                       (void *)b);
  pthread_mutex_lock(&reg.lock);
  *a = *b;
  b->refs++;
  pthread_mutex_unlock(&reg.lock);
  a->next = NULL;
  a->refs = 1;
  a->release_hook = NULL;
  a->release_arg = NULL;
  a->kept = false;
  a->last_watchers = 0;
  a->base = b;
  *out = a;
  return 0;
}

void gpuipc__buf_set_release_hook(struct gpuipc_buf *b,
                                  gpuipc__release_hook_fn fn, void *arg)
{
  pthread_mutex_lock(&reg.lock);
  b->release_hook = fn;
  b->release_arg = arg;
  pthread_mutex_unlock(&reg.lock);
}

void gpuipc__buf_keep(struct gpuipc_buf *b)
{
  pthread_mutex_lock(&reg.lock);
  if (!b->kept && b->refs == 0) {
    b->kept = true;
    if (b->base == NULL) /* an alias is not registered: its base counts */
      reg.kept++;
  }
  pthread_cond_broadcast(&reg.ready); /* importers waiting may take it */
  pthread_mutex_unlock(&reg.lock);
}

bool gpuipc__buf_unkeep(struct gpuipc_buf *b)
{
  pthread_mutex_lock(&reg.lock);
  bool was = b->kept;
  if (was) {
    b->kept = false;
    if (b->base == NULL)
      reg.kept--;
    reg_remove(b);
  }
  pthread_mutex_unlock(&reg.lock);
  return was;
}

int gpuipc__buf_destroy(struct gpuipc_buf *b)
{
  if (b->base != NULL) {
    struct gpuipc_buf *base = b->base;
    free(b);
    return gpuipc_buf_release(base);
  }
  int rc = b->ops->release(b);
  GPUIPC_LOG_D("released %s buffer (export %llu of pid %u)",
               gpuipc_kind_name(b->kind), (unsigned long long)b->export_id,
               b->pid);
  free(b);
  return rc;
}

int gpuipc_buf_release(gpuipc_buf_t *buf)
{
  if (buf == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_buf_release: buf is NULL");
  pthread_mutex_lock(&reg.lock);
  if (buf->refs <= 0) {
    pthread_mutex_unlock(&reg.lock);
    return gpuipc__err(-EINVAL, "gpuipc_buf_release: buffer %p has no "
                       "reference left", (void *)buf);
  }
  if (--buf->refs > 0) {
    bool watched = watchers_alone(buf);
    pthread_mutex_unlock(&reg.lock);
    void (*fn)(void) = watched ? atomic_load(&watched_last_fn) : NULL;
    if (fn != NULL)
      fn();
    return 0;
  }
  gpuipc__release_hook_fn hook = buf->release_hook;
  void *arg = buf->release_arg;
  /* With a hook, stay registered (and untakeable) while it decides. */
  if (hook == NULL)
    reg_remove(buf);
  pthread_mutex_unlock(&reg.lock);

  if (hook != NULL) {
    if (hook(buf, arg))
      return 0; /* kept: no longer ours to touch */
    pthread_mutex_lock(&reg.lock);
    reg_remove(buf);
    pthread_cond_broadcast(&reg.ready); /* importers waiting import anew */
    pthread_mutex_unlock(&reg.lock);
  }
  return gpuipc__buf_destroy(buf);
}

int gpuipc_buf_retain(gpuipc_buf_t *buf)
{
  if (buf == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_buf_retain: buf is NULL");
  pthread_mutex_lock(&reg.lock);
  bool held = buf->refs > 0;
  if (held)
    buf->refs++;
  pthread_mutex_unlock(&reg.lock);
  if (!held)
    return gpuipc__err(-EINVAL, "gpuipc_buf_retain: buffer %p has no "
                       "reference left", (void *)buf);
  return 0;
}

int gpuipc_buf_find(const void *ptr, size_t bytes, gpuipc_buf_t **out,
                    size_t *offset)
{
  if (ptr == NULL || out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_buf_find: %s is NULL",
                       ptr == NULL ? "ptr" : "out");
  uintptr_t lo = (uintptr_t)ptr;
  if (bytes > UINTPTR_MAX - lo)
    return gpuipc__err(-EINVAL, "gpuipc_buf_find: %zu bytes from %p wrap "
                       "around the address space", bytes, ptr);
  pthread_mutex_lock(&reg.lock);
  struct gpuipc_buf *b = gpuipc__index_find(lo, lo + bytes, takeable);
  if (b != NULL)
    take(b);
  pthread_mutex_unlock(&reg.lock);
  if (b == NULL)
    return gpuipc__err(-ENOENT, "gpuipc_buf_find: no buffer of this process "
                       "holds the %zu bytes at %p", bytes, ptr);
  *out = b;
  if (offset != NULL)
    *offset = (size_t)(lo - (uintptr_t)b->ptr);
  return 0;
}

void gpuipc__cache_stats(struct gpuipc__cache_stats *out)
{
  pthread_mutex_lock(&reg.lock);
  out->hits = reg.hits;
  out->misses = reg.misses;
  out->live = reg.live;
  out->kept = reg.kept;
  pthread_mutex_unlock(&reg.lock);
}
