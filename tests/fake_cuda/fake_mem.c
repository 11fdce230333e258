/*
 * The fake CUDA driver's device memory (fake_cuda_int.h lists its files):
 * LEGACY-style allocations shared between processes by IPC handles.
 */
#include "fake_cuda_int.h"

/* ---- device memory --------------------------------------------------------
 *
 * cuMemAlloc hands out 2 MiB-aligned memory (the size rounded up to 2 MiB,
 * as gpuipc's LEGACY kind asks) that is a shared mapping of a memfd of its
 * own, remembered so that cuMemGetAddressRange and cuMemFree know it.
 * cuIpcGetMemHandle writes the allocating pid and the memfd's number in
 * the handle; cuIpcOpenMemHandle in another process opens
 * /proc/PID/fd/N and maps the same pages, so two processes share it as
 * they would share GPU memory. The memory dies with its allocator (the fd
 * goes with it), as legacy IPC memory does.
 */
#define FAKE_ALLOCS 256

static pthread_mutex_t alloc_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  uintptr_t base;
  size_t size;
  int fd;      /* the memfd of our own allocation; -1 for an opening */
  bool opened; /* mapped by cuIpcOpenMemHandle */
  uint64_t serial; /* of our own allocation: the allocations before it */
} allocs[FAKE_ALLOCS];
static uint64_t alloc_serial; /* alloc_lock */

void fake_ipc_put(char reserved[64], const struct ipc_bytes *b)
{
  memset(reserved, 0, 64);
  memcpy(reserved, b, sizeof(*b));
  reserved[63] = 0x5a; /* never all zero */
}

int fake_fd_of(uint32_t pid, int32_t fd)
{
  char path[64];
  snprintf(path, sizeof(path), "/proc/%u/fd/%d", pid, fd);
  return open(path, O_RDWR | O_CLOEXEC);
}

void *fake_map_fd(int fd, size_t n)
{
  void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? NULL : p;
}

static CUresult alloc_remember(uintptr_t base, size_t size, int fd)
{
  CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&alloc_lock);
  for (int i = 0; i < FAKE_ALLOCS; i++)
    if (allocs[i].base == 0) {
      allocs[i].base = base;
      allocs[i].size = size;
      allocs[i].fd = fd;
      allocs[i].opened = fd < 0;
      allocs[i].serial = ++alloc_serial;
      r = CUDA_SUCCESS;
      break;
    }
  pthread_mutex_unlock(&alloc_lock);
  return r;
}

/* A shared mapping of a fresh memfd of @size bytes at a multiple of
 * @align; NULL on failure. */
static void *memfd_map_aligned(size_t size, size_t align, int *fd_out)
{
  int fd = memfd_create("fake_cuda_mem", MFD_CLOEXEC);
  if (fd < 0)
    return NULL;
  if (ftruncate(fd, (off_t)size) != 0)
    goto close_fd;
  uint8_t *r = mmap(NULL, size + align, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED)
    goto close_fd;
  uintptr_t a = ((uintptr_t)r + align - 1) / align * align;
  void *m = mmap((void *)a, size, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_FIXED, fd, 0);
  if (m == MAP_FAILED) {
    munmap(r, size + align);
    goto close_fd;
  }
  if (a > (uintptr_t)r)
    munmap(r, a - (uintptr_t)r);
  if ((uintptr_t)r + align > a)
    munmap((void *)(a + size), (uintptr_t)r + align - a);
  *fd_out = fd;
  return m;

close_fd:
  close(fd);
  return NULL;
}

FAKE_HIDDEN CUresult fake_cuMemAlloc(CUdeviceptr *p, size_t n)
{
  NEED_INIT();
  if (fake_current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (p == NULL || n == 0)
    return CUDA_ERROR_INVALID_VALUE;
  const size_t block = (size_t)2 << 20;
  size_t size = (n + block - 1) / block * block;
  int fd;
  void *m = memfd_map_aligned(size, block, &fd);
  if (m == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult r = alloc_remember((uintptr_t)m, size, fd);
  if (r != CUDA_SUCCESS) {
    munmap(m, size);
    close(fd);
  } else {
    *p = (CUdeviceptr)(uintptr_t)m;
  }
  return r;
}

/* Forget the allocation (@opened: an opening) at @p and unmap it. */
static CUresult alloc_drop(CUdeviceptr p, bool opened)
{
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&alloc_lock);
  for (int i = 0; i < FAKE_ALLOCS; i++)
    if (allocs[i].base != 0 && allocs[i].base == (uintptr_t)p &&
        allocs[i].opened == opened) {
      munmap((void *)allocs[i].base, allocs[i].size);
      if (allocs[i].fd >= 0)
        close(allocs[i].fd);
      allocs[i].base = 0;
      r = CUDA_SUCCESS;
    }
  pthread_mutex_unlock(&alloc_lock);
  return r;
}

FAKE_HIDDEN CUresult fake_cuMemFree(CUdeviceptr p)
{
  NEED_INIT();
  return alloc_drop(p, false);
}

FAKE_HIDDEN CUresult fake_cuMemGetAddressRange(CUdeviceptr *base, size_t *size,
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

FAKE_HIDDEN CUresult fake_cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
  NEED_INIT();
  if (h == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  struct ipc_bytes b = {FAKE_MEM_MAGIC, (uint32_t)getpid(), -1, -1, 0, 0};
  pthread_mutex_lock(&alloc_lock);
  for (int i = 0; i < FAKE_ALLOCS; i++)
    if (allocs[i].base != 0 && allocs[i].base == (uintptr_t)p &&
        !allocs[i].opened) {
      b.fd = allocs[i].fd;
      b.size = allocs[i].size;
      b.serial = allocs[i].serial;
      r = CUDA_SUCCESS;
    }
  pthread_mutex_unlock(&alloc_lock);
  if (r == CUDA_SUCCESS)
    fake_ipc_put(h->reserved, &b);
  return r;
}

FAKE_HIDDEN CUresult fake_cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h,
                                        unsigned int flags)
{
  NEED_INIT();
  if (fake_current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  struct ipc_bytes b;
  memcpy(&b, h.reserved, sizeof(b));
  if (p == NULL || b.magic != FAKE_MEM_MAGIC ||
      (flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
    return CUDA_ERROR_INVALID_VALUE;
  if (b.pid == (uint32_t)getpid()) /* as the driver: not one's own */
    return CUDA_ERROR_INVALID_CONTEXT;
  int fd = fake_fd_of(b.pid, b.fd);
  if (fd < 0)
    return CUDA_ERROR_INVALID_HANDLE;
  void *m = fake_map_fd(fd, (size_t)b.size);
  close(fd);
  if (m == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult r = alloc_remember((uintptr_t)m, (size_t)b.size, -1);
  if (r != CUDA_SUCCESS)
    munmap(m, (size_t)b.size);
  else
    *p = (CUdeviceptr)(uintptr_t)m;
  return r;
}

FAKE_HIDDEN CUresult fake_cuIpcCloseMemHandle(CUdeviceptr p)
{
  NEED_INIT();
  return alloc_drop(p, true);
}

