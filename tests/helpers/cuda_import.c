/*
 * cuda_import: the gpuipc side of tests/gpu/torch_import.py (needs a GPU).
 *
 *   cuda_import ipc DEV HEX OFFSET SIZE PID SEED
 *       HEX: the handle of storage._share_cuda_() (66 bytes) or a
 *       cudaIpcMemHandle (64), in hex, made by process PID. Import
 *       [OFFSET, OFFSET + SIZE) of its block with
 *       gpuipc_handle_from_cuda_ipc and check every byte against
 *       pattern SEED; check the pointer is the block's base + OFFSET, that
 *       a second import maps once, that the bytes before OFFSET share the
 *       driver's opening, and that a range past the block is refused.
 *   cuda_import legacy-export DEV SIZE SEED
 *       Allocate a LEGACY buffer of SIZE bytes holding pattern SEED and
 *       print "HEX64 OFFSET SIZE" (the handle's 64 bytes, for CuPy's
 *       ipcOpenMemHandle); exit when stdin says anything (or closes).
 *   cuda_import vmm-fd DEV SIZE OFFSET SEED
 *       cuMemCreate SIZE bytes (POSIX fd handles) holding pattern SEED,
 *       export the fd and start "cuda_import fd-child DEV FD OFFSET LEN
 *       SEED" with it, which imports [OFFSET, SIZE) by
 *       gpuipc_handle_from_cuda_fd and checks every byte; a range past
 *       the allocation must fail.
 * Pattern SEED: byte i (from the start of what was shared) is
 * (i * 7 + SEED) mod 256. Exit 0 on success; 77 without a GPU.
 */
#include "cuda/cuda.h"
#include "test.h"
#include "vmm_prop.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if GPUIPC_HAVE_CUDA

static uint8_t pat(uint64_t seed, size_t i)
{
  return (uint8_t)((i * 7 + seed) & 0xff);
}

static unsigned long long num(const char *s)
{
  char *end;
  unsigned long long v = strtoull(s, &end, 0);
  if (*s == '\0' || *end != '\0')
    TFAIL("not a number: \"%s\"", s);
  return v;
}

static size_t unhex(const char *s, uint8_t *out, size_t cap)
{
  size_t n = strlen(s) / 2;
  if (strlen(s) % 2 != 0 || n > cap)
    TFAIL("bad hex handle (%zu characters)", strlen(s));
  for (size_t i = 0; i < n; i++) {
    unsigned v;
    if (sscanf(s + 2 * i, "%2x", &v) != 1)
      TFAIL("bad hex at %zu", 2 * i);
    out[i] = (uint8_t)v;
  }
  return n;
}

static void dtoh(int dev, void *dst, CUdeviceptr src, size_t n)
{
  struct gpuipc__ctx_saved saved;
  ASSERT_OK(gpuipc__ctx_enter(dev, &saved));
  ASSERT_OK(GPUIPC_CU(cuMemcpyDtoH, dst, src, n));
  gpuipc__ctx_leave(&saved);
}

/* Every byte of [p, p + n) is pattern @seed from @first; prints the count. */
static void check_bytes(int dev, const void *p, size_t n, uint64_t seed,
                        size_t first, const char *what)
{
  uint8_t *h = malloc(n);
  ASSERT_TRUE(h != NULL);
  dtoh(dev, h, (CUdeviceptr)(uintptr_t)p, n);
  size_t bad = 0, first_bad = 0;
  for (size_t i = 0; i < n; i++)
    if (h[i] != pat(seed, first + i) && bad++ == 0)
      first_bad = i;
  free(h);
  if (bad != 0)
    TFAIL("%s: %zu of %zu bytes wrong, the first at %zu", what, bad, n,
          first_bad);
  printf("%s: all %zu bytes right\n", what, n);
}

static CUdeviceptr block_base(int dev, const void *p, size_t *size)
{
  struct gpuipc__ctx_saved saved;
  ASSERT_OK(gpuipc__ctx_enter(dev, &saved));
  CUdeviceptr base = 0;
  ASSERT_OK(GPUIPC_CU(cuMemGetAddressRange, &base, size,
                      (CUdeviceptr)(uintptr_t)p));
  gpuipc__ctx_leave(&saved);
  return base;
}

static int do_ipc(int dev, const char *hex, size_t off, size_t size, int pid,
                  uint64_t seed)
{
  uint8_t raw[66];
  size_t len = unhex(hex, raw, sizeof(raw));
  gpuipc_handle_t h;
  ASSERT_OK(gpuipc_handle_from_cuda_ipc(raw, len, off, size, dev, pid, &h));
  gpuipc_buf_t *b, *again, *before;
  ASSERT_OK(gpuipc_buf_import(&h, -1, 0, &b));
  ASSERT_EQ_U(gpuipc_buf_size(b), size);
  size_t bsize = 0;
  CUdeviceptr base = block_base(dev, gpuipc_buf_ptr(b), &bsize);
  printf("imported %zu bytes at offset %zu of a %zu-byte block\n", size, off,
         bsize);
  ASSERT_EQ_U((uintptr_t)gpuipc_buf_ptr(b), base + off);
  check_bytes(dev, gpuipc_buf_ptr(b), size, seed, 0, "PyTorch tensor");
  ASSERT_OK(gpuipc_buf_import(&h, -1, 0, &again));
  ASSERT_PTR_EQ(again, b); /* the cache: mapped once */
  ASSERT_OK(gpuipc_buf_release(again));

  /* The bytes before it: another buffer on the same opening. */
  if (off > 0) {
    gpuipc_handle_t h0;
    ASSERT_OK(gpuipc_handle_from_cuda_ipc(raw, len, 0, off, dev, pid, &h0));
    ASSERT_NE(h0.export_id, h.export_id);
    ASSERT_OK(gpuipc_buf_import(&h0, -1, 0, &before));
    ASSERT_PTR_NE(before, b);
    ASSERT_EQ_U((uintptr_t)gpuipc_buf_ptr(before), base);
    ASSERT_OK(gpuipc_buf_release(before));
  }
  /* One byte past the block the driver opened. */
  gpuipc_handle_t past;
  ASSERT_OK(gpuipc_handle_from_cuda_ipc(raw, len, off, bsize - off + 1, dev,
                                        pid, &past));
  gpuipc_buf_t *none = NULL;
  ASSERT_RC(gpuipc_buf_import(&past, -1, 0, &none), GPUIPC_E_BADHANDLE);
  ASSERT_ERR_MENTIONS("runs past the end");
  printf("past the block: %s\n", gpuipc_last_error());
  ASSERT_OK(gpuipc_buf_release(b));
  return 0;
}

static void htod_pattern(int dev, CUdeviceptr p, size_t n, uint64_t seed)
{
  uint8_t *h = malloc(n);
  ASSERT_TRUE(h != NULL);
  for (size_t i = 0; i < n; i++)
    h[i] = pat(seed, i);
  struct gpuipc__ctx_saved saved;
  ASSERT_OK(gpuipc__ctx_enter(dev, &saved));
  ASSERT_OK(GPUIPC_CU(cuMemcpyHtoD, p, h, n));
  gpuipc__ctx_leave(&saved);
  free(h);
}

static int do_legacy_export(int dev, size_t size, uint64_t seed)
{
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_buf_alloc(size, GPUIPC_KIND_LEGACY, dev, 0, &b));
  htod_pattern(dev, (CUdeviceptr)(uintptr_t)gpuipc_buf_ptr(b), size, seed);
  gpuipc_handle_t h;
  ASSERT_OK(gpuipc_buf_export(b, &h));
  for (int i = 0; i < GPUIPC_HANDLE_BYTES; i++)
    printf("%02x", h.bytes[i]);
  printf(" %llu %llu\n", (unsigned long long)h.offset,
         (unsigned long long)h.size);
  fflush(stdout);
  char c;
  while (read(0, &c, 1) < 0)
    ;
  ASSERT_OK(gpuipc_buf_release(b));
  return 0;
}

static int do_vmm_fd(int dev, size_t size, size_t off,
                     uint64_t seed)
{
  CUmemAllocationProp prop;
  vmm_prop(dev, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, &prop);
  struct gpuipc__ctx_saved saved;
  ASSERT_OK(gpuipc__ctx_enter(dev, &saved));
  size_t g = 0;
  ASSERT_OK(GPUIPC_CU(cuMemGetAllocationGranularity, &g, &prop,
                      CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  size = (size + g - 1) / g * g;
  CUmemGenericAllocationHandle mh;
  CUdeviceptr va;
  ASSERT_OK(GPUIPC_CU(cuMemCreate, &mh, size, &prop, 0));
  ASSERT_OK(GPUIPC_CU(cuMemAddressReserve, &va, size, 0, 0, 0));
  ASSERT_OK(GPUIPC_CU(cuMemMap, va, size, 0, mh, 0));
  CUmemAccessDesc a;
  memset(&a, 0, sizeof(a));
  a.location = prop.location;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_OK(GPUIPC_CU(cuMemSetAccess, va, size, &a, 1));
  int fd = -1;
  ASSERT_OK(GPUIPC_CU(cuMemExportToShareableHandle, &fd, mh,
                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  gpuipc__ctx_leave(&saved);
  htod_pattern(dev, va, size, seed);

  char sdev[16], sfd[16], soff[32], slen[32], sseed[32], ssize[32];
  snprintf(sdev, sizeof(sdev), "%d", dev);
  snprintf(sfd, sizeof(sfd), "%d", fd);
  snprintf(soff, sizeof(soff), "%zu", off);
  snprintf(slen, sizeof(slen), "%zu", size - off);
  snprintf(ssize, sizeof(ssize), "%zu", size);
  snprintf(sseed, sizeof(sseed), "%llu", (unsigned long long)seed);
  const char *args[] = {"fd-child", sdev, sfd, soff, slen, sseed, ssize, NULL};
  int keep[] = {fd, -1};
  pid_t pid = test_spawn("cuda_import", args, keep);
  close(fd);
  ASSERT_EQ(test_wait(pid, 120000), 0);
  ASSERT_OK(gpuipc__ctx_enter(dev, &saved));
  ASSERT_OK(GPUIPC_CU(cuMemUnmap, va, size));
  ASSERT_OK(GPUIPC_CU(cuMemAddressFree, va, size));
  ASSERT_OK(GPUIPC_CU(cuMemRelease, mh));
  gpuipc__ctx_leave(&saved);
  printf("vmm-fd: the child imported the fd and read every byte\n");
  return 0;
}

static int do_fd_child(int dev, int fd, size_t off, size_t len, uint64_t seed,
                       size_t total)
{
  gpuipc_handle_t h;
  ASSERT_OK(gpuipc_handle_from_cuda_fd(fd, off, len, dev, &h));
  gpuipc_buf_t *b, *again;
  ASSERT_OK(gpuipc_buf_import(&h, -1, 0, &b));
  ASSERT_OK(gpuipc_buf_import(&h, -1, 0, &again));
  ASSERT_PTR_EQ(again, b);
  ASSERT_OK(gpuipc_buf_release(again));
  close(fd); /* the buffer keeps its own */
  check_bytes(dev, gpuipc_buf_ptr(b), len, seed, off, "cuMem fd import");
  /* Re-export: the kept fd travels on. */
  gpuipc_handle_t re;
  ASSERT_OK(gpuipc_buf_export(b, &re));
  ASSERT_TRUE(re.fd >= 0);
  gpuipc_handle_t past;
  ASSERT_OK(gpuipc_handle_from_cuda_fd(re.fd, off, total - off + 1, dev,
                                       &past));
  gpuipc_buf_t *none = NULL;
  int rc = gpuipc_buf_import(&past, -1, 0, &none);
  printf("a range past the allocation: %d (%s)\n", rc, gpuipc_last_error());
  ASSERT_TRUE(rc < 0 && none == NULL);
  close(re.fd);
  ASSERT_OK(gpuipc_buf_release(b));
  return 0;
}

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2)
    TFAIL("usage: cuda_import ipc|legacy-export|vmm-fd|fd-child ...");
  test_require_gpus(1);
  const char *m = argv[1];
  if (strcmp(m, "ipc") == 0 && argc == 8)
    return do_ipc((int)num(argv[2]), argv[3], num(argv[4]), num(argv[5]),
                  (int)num(argv[6]), num(argv[7]));
  if (strcmp(m, "legacy-export") == 0 && argc == 5)
    return do_legacy_export((int)num(argv[2]), num(argv[3]), num(argv[4]));
  if (strcmp(m, "vmm-fd") == 0 && argc == 6)
    return do_vmm_fd((int)num(argv[2]), num(argv[3]), num(argv[4]),
                     num(argv[5]));
  if (strcmp(m, "fd-child") == 0 && argc == 8)
    return do_fd_child((int)num(argv[2]), (int)num(argv[3]), num(argv[4]),
                       num(argv[5]), num(argv[6]), num(argv[7]));
  TFAIL("unknown mode or argument count: %s (%d arguments)", m, argc - 1);
}

#else

int main(void)
{
  SKIP("built without CUDA");
}

#endif
