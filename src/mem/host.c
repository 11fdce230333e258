/*
 * The HOST kind: a sealed memfd mapped read-write (MAP_SHARED) in every
 * holder. Where a GPU is present the mapping is also registered with CUDA
 * (portable, device-mapped: pinned, and reachable by kernels), but never
 * by starting CUDA: at the mapping when this process has a CUDA context
 * already (unless mapped GPUIPC_BUF_UNPINNED: registering and unregistering
 * wait for the GPU's queued work), else when gpuipc first puts GPU work on
 * the buffer (gpuipc__host_pin). A process that only moves host memory
 * never loads the driver, and makes no context (hundreds of MiB of GPU
 * memory, 0.2 s to seconds of start).
 */
#include "mem/mem.h"

#include "cuda/cuda.h"
#include "os/os.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct host_priv {
  dev_t st_dev;     /* identity of the memfd, for the import cache */
  ino_t st_ino;
  void *base;       /* start of the mapping */
  size_t map_size;  /* bytes mapped */
  /* The device whose primary context registered the mapping, -1 while it
   * is not registered. Set once, under pin_lock. */
  _Atomic int reg_dev;
};

#if GPUIPC_HAVE_CUDA
/* Registrations are rare (once per mapping): one lock for all of them. */
static pthread_mutex_t pin_lock = PTHREAD_MUTEX_INITIALIZER;
#endif

static int host_available(void)
{
  return 0;
}

static size_t page_round(size_t n)
{
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  return (n + pg - 1) / pg * pg;
}

/* Register @p in @dev's primary context unless it is registered already. */
static int host_pin_dev(struct host_priv *p, int dev)
{
#if GPUIPC_HAVE_CUDA
  if (atomic_load_explicit(&p->reg_dev, memory_order_acquire) >= 0)
    return 0;
  pthread_mutex_lock(&pin_lock);
  int rc = 0;
  if (atomic_load_explicit(&p->reg_dev, memory_order_relaxed) < 0) {
    struct gpuipc__ctx_saved saved;
    rc = gpuipc__ctx_enter(dev, &saved);
    if (rc == 0) {
      rc = GPUIPC_CU(cuMemHostRegister, p->base, p->map_size,
                     CU_MEMHOSTREGISTER_PORTABLE |
                         CU_MEMHOSTREGISTER_DEVICEMAP);
      gpuipc__ctx_leave(&saved);
    }
    if (rc == 0)
      atomic_store_explicit(&p->reg_dev, dev, memory_order_release);
  }
  pthread_mutex_unlock(&pin_lock);
  return rc;
#else
  (void)p;
  (void)dev;
  return 0;
#endif
}

int gpuipc__host_pin(gpuipc_buf_t *b, int dev)
{
  if (b == NULL || b->kind != GPUIPC_KIND_HOST || dev < 0)
    return 0;
  if (b->base != NULL)
    b = b->base; /* a second handle (gpuipc__buf_alias): its base's state */
  return host_pin_dev(b->priv, dev);
}

/* At the mapping: register now if this process uses CUDA already. */
static int host_register(struct host_priv *p)
{
  int dev = gpuipc__ctx_in_use();
  return dev < 0 ? 0 : host_pin_dev(p, dev);
}

static void host_unregister(struct host_priv *p)
{
#if GPUIPC_HAVE_CUDA
  int dev = atomic_load(&p->reg_dev);
  if (dev < 0)
    return;
  struct gpuipc__ctx_saved saved;
  if (gpuipc__ctx_enter(dev, &saved) != 0)
    return;
  if (GPUIPC_CU(cuMemHostUnregister, p->base) != 0)
    GPUIPC_LOG_W("%s", gpuipc_last_error());
  gpuipc__ctx_leave(&saved);
  atomic_store(&p->reg_dev, -1);
#else
  (void)p;
#endif
}

/* Map @fd (@map_size bytes) and register it unless @unpinned; on success
 * fills @p. */
static int host_map(int fd, size_t map_size, bool unpinned,
                    struct host_priv *p)
{
  void *base = mmap(NULL, map_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED)
    return gpuipc__err_errno(errno, "mmap of %zu bytes of a HOST buffer",
                             map_size);
  p->base = base;
  p->map_size = map_size;
  atomic_init(&p->reg_dev, -1);
  int rc = unpinned ? 0 : host_register(p);
  if (rc != 0) {
    munmap(base, map_size);
    return rc;
  }
  return 0;
}

/*
 * Map @fd (owned from here on: closed on failure) as @b's memory: @map_size
 * bytes, the buffer starting @offset bytes in.
 */
static int host_attach(struct gpuipc_buf *b, int fd, size_t map_size,
                       size_t offset)
{
  int rc;
  struct host_priv *p = calloc(1, sizeof(*p));
  if (p == NULL) {
    rc = gpuipc__err(-ENOMEM, "HOST buffer: out of memory");
    goto close_fd;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    rc = gpuipc__err_errno(errno, "fstat of a HOST buffer's memfd");
    goto free_priv;
  }
  p->st_dev = st.st_dev;
  p->st_ino = st.st_ino;
  rc = host_map(fd, map_size, b->unpinned, p);
  if (rc != 0)
    goto free_priv;
  b->ptr = (uint8_t *)p->base + offset;
  b->alloc_size = map_size;
  b->offset = offset;
  b->device = -1;
  b->fd = fd;
  b->priv = p;
  return 0;

free_priv:
  free(p);
close_fd:
  gpuipc__fd_close(&fd);
  return rc;
}

static int host_alloc(struct gpuipc_buf *b)
{
  size_t map_size = page_round(b->size);
  int fd;
  int rc = gpuipc__memfd_create("gpuipc-host", map_size, &fd);
  if (rc != 0)
    return rc;
  return host_attach(b, fd, map_size, 0);
}

static int host_export(struct gpuipc_buf *b, gpuipc_handle_t *h)
{
  int fd;
  int rc = gpuipc__fd_dup(b->fd, &fd);
  if (rc != 0)
    return rc;
  h->type = GPUIPC_HT_POSIX_FD;
  h->fd = fd;
  return 0;
}

static int host_import(struct gpuipc_buf *b, const gpuipc_handle_t *h)
{
  size_t actual;
  int rc = gpuipc__memfd_check(h->fd, h->alloc_size, &actual);
  if (rc != 0)
    return rc;
  if (actual != h->alloc_size)
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "gpuipc_buf_import: handle says the allocation is %llu "
                       "bytes but its memfd holds %zu",
                       (unsigned long long)h->alloc_size, actual);
  int fd;
  rc = gpuipc__fd_dup(h->fd, &fd);
  if (rc != 0)
    return rc;
  return host_attach(b, fd, h->alloc_size, h->offset);
}

static int host_release(struct gpuipc_buf *b)
{
  struct host_priv *p = b->priv;
  host_unregister(p);
  int rc = 0;
  if (munmap(p->base, p->map_size) != 0)
    rc = gpuipc__err_errno(errno, "munmap of a HOST buffer");
  gpuipc__fd_close(&b->fd);
  free(p);
  b->priv = NULL;
  return rc;
}

/*
 * A handle that claims the identity of a buffer this process already maps
 * must carry a descriptor of that very memfd: otherwise a peer could make
 * the import cache hand out its own memory under another export's name.
 */
static int host_same_memory(const struct gpuipc_buf *b, int fd)
{
  const struct host_priv *p = b->priv;
  struct stat st;
  if (fstat(fd, &st) != 0)
    return gpuipc__err_errno(errno, "gpuipc_buf_import: fstat of the "
                                    "handle's descriptor");
  if (st.st_dev != p->st_dev || st.st_ino != p->st_ino)
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "gpuipc_buf_import: the handle names export %llu of "
                       "pid %u, but its descriptor is another memory object",
                       (unsigned long long)b->export_id, b->pid);
  return 0;
}

const struct gpuipc__kind_ops gpuipc__host_ops = {
    .kind = GPUIPC_KIND_HOST,
    .available = host_available,
    .alloc = host_alloc,
    .export = host_export,
    .import = host_import,
    .release = host_release,
    .same_memory = host_same_memory,
};
