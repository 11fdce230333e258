/*
 * Handles for memory that another CUDA program shared by itself:
 * gpuipc_handle_from_cuda_ipc (a cudaIpcMemHandle_t as CuPy gives it, or
 * PyTorch's storage._share_cuda_() form of it) and
 * gpuipc_handle_from_cuda_fd (a cuMem POSIX file descriptor). The handle
 * made is an ordinary one: gpuipc_buf_import maps it, the import cache
 * keeps it, gpuipc_handle_pack carries it. And the other way,
 * gpuipc_buf_export_foreign: a handle for device memory gpuipc did not
 * allocate, made here up to the kind of the memory, then by that kind's
 * export_foreign (legacy.c, vmm.c) through its gpuipc__kind_ops table.
 *
 * Identity (what the import cache keys on). A legacy handle names a block
 * of its exporter, which we know by pid; the exporter's own nonce is
 * unknown, so the nonce is derived from the process's start time (pid and
 * start time name one process for the whole boot) and the export id from
 * the handle's bytes, offset and size. The same tensor received twice
 * thus maps once, and tensors of one block share one driver opening (the
 * LEGACY kind counts openings by the handle's bytes). The derived export
 * id is a hash: a hit is only trusted when the buffer it finds was opened
 * from the same bytes at the same offset (the kind's same_export). A
 * descriptor carries no identity the driver would vouch for (every
 * exported descriptor of one allocation is a new file), so each
 * gpuipc_handle_from_cuda_fd gets a new export id of this process: the
 * handle imported twice maps once; two handles never share a mapping.
 */
#include "mem/gpu.h"
#include "cuda/peer.h"
#include "os/os.h"
#include "wire/wire.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#define PID_MAX 4194304 /* PID_MAX_LIMIT on 64-bit Linux */
/* Export ids of handles made from a foreign legacy handle: top bits 11. */
#define IPC_ID_SPACE (3ull << 62)

/* PyTorch's _share_cuda_ prefix: format version 2, 'c' for cudaMalloc. */
#define TORCH_PREFIX_LEN 2
#define TORCH_VERSION 0x02
#define TORCH_CUDA_MALLOC 'c'
#define TORCH_EXPANDABLE 'e'

/* splitmix64's finaliser. */
static uint64_t mix64(uint64_t x)
{
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static uint64_t ipc_export_id(const uint8_t *bytes, uint64_t offset,
                              uint64_t size)
{
  uint64_t x = 0xcbf29ce484222325ull; /* FNV-1a over the bytes */
  for (int i = 0; i < GPUIPC_HANDLE_BYTES; i++)
    x = (x ^ bytes[i]) * 0x100000001b3ull;
  x = mix64(x ^ mix64(offset ^ mix64(size)));
  return IPC_ID_SPACE | (x & ~IPC_ID_SPACE) | 1;
}

static bool all_zero(const uint8_t *p, size_t n)
{
  uint8_t acc = 0;
  for (size_t i = 0; i < n; i++)
    acc |= p[i];
  return acc == 0;
}

/* The 64 handle bytes of @bytes (64, or PyTorch's 66), or an error. */
static int ipc_bytes(const uint8_t *bytes, size_t len, const char *who,
                     const uint8_t **out)
{
  /*
   * PyTorch's expandable-segment handles are b'\x02e', a 24-byte header
   * and a descriptor number (or a 64-byte fabric handle) per piece: any
   * length but 64, which is a cudaIpcMemHandle whatever its bytes.
   */
  if (len >= TORCH_PREFIX_LEN && len != GPUIPC_HANDLE_BYTES &&
      bytes[0] == TORCH_VERSION && bytes[1] == TORCH_EXPANDABLE)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED, "%s: b'\\x02e' is a PyTorch "
                       "expandable-segment handle, whose memory is file "
                       "descriptors of the exporting process: import one "
                       "of them with gpuipc_handle_from_cuda_fd (Python: "
                       "gpuipc.torch.from_torch does)", who);
  if (len == GPUIPC_HANDLE_BYTES + TORCH_PREFIX_LEN) {
    if (bytes[0] != TORCH_VERSION)
      return gpuipc__err(GPUIPC_E_BADHANDLE, "%s: a 66-byte handle starts "
                         "with PyTorch's format version 2 (0x02), not 0x%02x",
                         who, bytes[0]);
    if (bytes[1] != TORCH_CUDA_MALLOC)
      return gpuipc__err(GPUIPC_E_BADHANDLE, "%s: a 66-byte handle is "
                         "b'\\x02c' and a cudaIpcMemHandle; its type byte is "
                         "0x%02x", who, bytes[1]);
    bytes += TORCH_PREFIX_LEN;
  } else if (len != GPUIPC_HANDLE_BYTES) {
    return gpuipc__err(-EINVAL, "%s: len %zu: a cudaIpcMemHandle is 64 bytes "
                       "(66 with the b'\\x02c' of PyTorch's _share_cuda_)",
                       who, len);
  }
  if (all_zero(bytes, GPUIPC_HANDLE_BYTES))
    return gpuipc__err(GPUIPC_E_BADHANDLE, "%s: the cudaIpcMemHandle is all "
                       "zero", who);
  *out = bytes;
  return 0;
}

/* @offset and @size within what a handle describes (2^48 bytes). */
static int range_check(size_t offset, size_t size, const char *who)
{
  if (size == 0)
    return gpuipc__err(-EINVAL, "%s: size is 0", who);
  if (size > GPUIPC_SIZE_MAX_ABSURD || offset > GPUIPC_SIZE_MAX_ABSURD - size)
    return gpuipc__err(-EINVAL, "%s: offset %zu + size %zu is past the "
                       "2^48 bytes a handle describes", who, offset, size);
  return 0;
}

/* The driver, and @device one of its visible devices. */
static int device_check(int device, const char *who)
{
  int rc = gpuipc__cuda_load();
  if (rc != 0)
    return rc;
  if (device < 0)
    return gpuipc__err(-EINVAL, "%s: device %d: name the local ordinal of "
                       "the GPU the memory is on (gpuipc_device_by_uuid "
                       "finds it by UUID)", who, device);
  return gpuipc__dev_check(device, who);
}

/* Fill @h's common fields: the GPU, the range, this machine's identity. */
static void handle_init(gpuipc_handle_t *h, int device, size_t offset,
                        size_t size)
{
  const struct gpuipc__proc_id *me = gpuipc__proc_self();
  memset(h, 0, sizeof(*h));
  h->version = GPUIPC_HANDLE_VERSION;
  h->size = size;
  h->offset = offset;
  h->alloc_size = (uint64_t)offset + size;
  memcpy(h->device_uuid, gpuipc__dev_get(device)->info.uuid, 16);
  memcpy(h->boot_id, me->boot_id, 16);
  h->pid = me->pid;
  h->pidns = me->pidns;
  h->nonce = me->nonce;
  h->fd = -1;
}

int gpuipc_handle_from_cuda_ipc(const void *bytes, size_t len, size_t offset,
                                size_t size, int device, int exporter_pid,
                                gpuipc_handle_t *out)
{
  static const char who[] = "gpuipc_handle_from_cuda_ipc";
  if (bytes == NULL || out == NULL)
    return gpuipc__err(-EINVAL, "%s: %s is NULL", who,
                       bytes == NULL ? "bytes" : "out");
  const uint8_t *raw = NULL;
  int rc = ipc_bytes(bytes, len, who, &raw);
  if (rc == 0)
    rc = range_check(offset, size, who);
  if (rc != 0)
    return rc;
  if (exporter_pid <= 0 || exporter_pid > PID_MAX)
    return gpuipc__err(-EINVAL, "%s: exporter_pid %d is not a pid", who,
                       exporter_pid);
  if ((uint32_t)exporter_pid == gpuipc__proc_self()->pid)
    return gpuipc__err(-EINVAL, "%s: exporter_pid %d is this process, which "
                       "cannot open its own legacy handle (use its pointer)",
                       who, exporter_pid);
  rc = device_check(device, who);
  if (rc != 0)
    return rc;
  uint64_t start;
  rc = gpuipc__pid_start_time((pid_t)exporter_pid, &start);
  if (rc == -ESRCH)
    return gpuipc__err(GPUIPC_E_PEER_GONE, "%s: process %d has exited, and "
                       "the memory it shared by legacy IPC with it", who,
                       exporter_pid);
  if (rc != 0)
    return gpuipc__err(rc, "%s: cannot read when process %d started "
                       "(/proc/%d/stat): %s", who, exporter_pid, exporter_pid,
                       strerror(-rc));
  gpuipc_handle_t h;
  handle_init(&h, device, offset, size);
  h.kind = GPUIPC_KIND_LEGACY;
  h.type = GPUIPC_HT_LEGACY;
  memcpy(h.bytes, raw, GPUIPC_HANDLE_BYTES);
  h.pid = (uint32_t)exporter_pid;
  h.nonce = mix64(start ^ 0x6770756970634950ull) | 1;
  h.export_id = ipc_export_id(raw, offset, size);
  rc = gpuipc__handle_validate(&h, who);
  if (rc == 0)
    *out = h;
  return rc;
}

#if GPUIPC_HAVE_CUDA

/*
 * A new export id for a handle made of memory gpuipc did not allocate
 * (gpuipc_buf_export_foreign, gpuipc_handle_from_cuda_fd): top bit set,
 * apart from the buffers' ids, never reused by this process.
 */
static uint64_t foreign_export_id(void)
{
  static _Atomic uint64_t foreign_ids = 1;
  return (1ull << 63) | atomic_fetch_add(&foreign_ids, 1);
}

int gpuipc_handle_from_cuda_fd(int fd, size_t offset, size_t size,
                               int device, gpuipc_handle_t *out)
{
  static const char who[] = "gpuipc_handle_from_cuda_fd";
  if (out == NULL)
    return gpuipc__err(-EINVAL, "%s: out is NULL", who);
  if (fd < 0 || fcntl(fd, F_GETFD) < 0)
    return gpuipc__err(-EBADF, "%s: fd %d is not an open descriptor", who,
                       fd);
  int rc = range_check(offset, size, who);
  if (rc == 0)
    rc = device_check(device, who);
  if (rc != 0)
    return rc;
  /* The importer maps whole granules from the start of the allocation. */
  size_t g;
  rc = gpuipc__vmm_granularity(device, &g);
  if (rc != 0)
    return rc;
  size_t span = gpuipc__round_up(offset + size, g);
  if (span == 0 || span > GPUIPC_SIZE_MAX_ABSURD)
    return gpuipc__err(-EINVAL, "%s: offset %zu + size %zu rounded up to "
                       "the granularity (%zu) is past 2^48 bytes", who,
                       offset, size, g);
  gpuipc_handle_t h;
  handle_init(&h, device, offset, size);
  h.kind = GPUIPC_KIND_VMM;
  h.type = GPUIPC_HT_POSIX_FD;
  h.alloc_size = span;
  h.export_id = foreign_export_id();
  rc = gpuipc__handle_validate(&h, who);
  if (rc != 0)
    return rc;
  h.fd = fd;
  *out = h;
  return 0;
}

/* ----- gpuipc_buf_export_foreign ----- */

/* The export of [p, p + size), in the context of the memory's device. */
/* The kind whose export_foreign shares the device memory at @p (> 0), or
 * a negative code. */
static int foreign_kind(CUdeviceptr p)
{
  void *ptr = (void *)(uintptr_t)p;
  unsigned long long legacy_ok = 0; /* a boolean of the driver's width */
  static const char attr[] =
      "cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_CAPABLE)";
  int rc = gpuipc__ptr_attr(
      &legacy_ok, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p, attr);
  if (rc != 0)
    return rc;
  if (legacy_ok)
    return GPUIPC_KIND_LEGACY;
  CUmemGenericAllocationHandle probe;
  if (gpuipc__cu.cuMemRetainAllocationHandle == NULL ||
      gpuipc__cu.cuMemRetainAllocationHandle(&probe, ptr) != CUDA_SUCCESS)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED,
                       "gpuipc_buf_export_foreign: %p is neither "
                       "cudaMalloc/cuMemAlloc memory nor a cuMemCreate "
                       "mapping", ptr);
  gpuipc__cu.cuMemRelease(probe);
  return GPUIPC_KIND_VMM;
}

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
  int kind = foreign_kind(p);
  if (kind < 0)
    return kind;
  const struct gpuipc__foreign_range r = {
      .ptr = p, .size = size, .base = base, .alloc_size = rsize,
      .flags = flags};
  return gpuipc__kind_ops((gpuipc_kind_t)kind)->export_foreign(&r, h);
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
  rc = gpuipc__ptr_attr(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p,
                        "cuPointerGetAttribute(DEVICE_ORDINAL)");
  if (rc == 0)
    rc = gpuipc__dev_check(dev, who);
  if (rc != 0)
    return rc;
  gpuipc_handle_t h;
  handle_init(&h, dev, 0, size);
  struct gpuipc__ctx_saved saved;
  rc = gpuipc__ctx_enter(dev, &saved);
  if (rc != 0)
    return rc;
  rc = foreign_export(p, size, flags, &h);
  gpuipc__ctx_leave(&saved);
  if (rc != 0)
    return rc;
  h.export_id = foreign_export_id();
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

int gpuipc_handle_from_cuda_fd(int fd, size_t offset, size_t size,
                               int device, gpuipc_handle_t *out)
{
  (void)offset;
  (void)device;
  if (out == NULL || fd < 0 || size == 0)
    return gpuipc__err(-EINVAL, "gpuipc_handle_from_cuda_fd: bad argument");
  return gpuipc__err(GPUIPC_E_UNSUPPORTED,
                     "gpuipc_handle_from_cuda_fd: built without CUDA");
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
