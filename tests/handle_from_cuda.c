/*
 * Handles for memory other CUDA programs shared (gpuipc_handle_from_cuda_ipc,
 * gpuipc_handle_from_cuda_fd), on the fake driver: every argument is
 * checked before anything is filled; PyTorch's 66-byte form gives the same
 * handle as the 64 bytes inside it, other prefixes are refused; the fields
 * are filled so that the strict unpack takes the packed handle back; the
 * identity is derived from the exporter and the bytes, offset and size
 * (same ones: same identity; any one different: another); and an import
 * whose identity the cache holds for another block or offset is refused
 * rather than handed the cached mapping. Mapping the memory needs a GPU:
 * tests/gpu/torch_import.sh.
 */
#include "test.h"

#include "os/os.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#if GPUIPC_HAVE_CUDA
#include "fake_cuda/fake_cuda.h"

static const uint8_t uuid0[16] = FAKE_CUDA_UUID0;
static const uint8_t uuid1[16] = FAKE_CUDA_UUID1;

/* A child that waits for its pipe to close: a live exporter pid. */
static pid_t live_child(int *wfd)
{
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  pid_t pid = fork();
  ASSERT_TRUE(pid >= 0);
  if (pid == 0) {
    char c;
    close(p[1]);
    while (read(p[0], &c, 1) < 0)
      ;
    _exit(0);
  }
  close(p[0]);
  *wfd = p[1];
  return pid;
}

static void end_child(pid_t pid, int wfd)
{
  close(wfd);
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
}

static void raw_bytes(uint8_t raw[64], uint8_t seed)
{
  for (int i = 0; i < 64; i++)
    raw[i] = (uint8_t)(seed + i * 7);
}

/* A failed call leaves @out as it was. */
static void ipc_refused(const void *bytes, size_t len, size_t off, size_t size,
                        int dev, int pid, int code, const char *mention)
{
  gpuipc_handle_t h;
  memset(&h, 0xab, sizeof(h));
  gpuipc_handle_t before = h;
  ASSERT_RC(gpuipc_handle_from_cuda_ipc(bytes, len, off, size, dev, pid, &h),
            code);
  ASSERT_ERR_MENTIONS(mention);
  ASSERT_EQ(memcmp(&h, &before, sizeof(h)), 0);
}

static void ipc_arguments(pid_t child)
{
  uint8_t raw[64], torch[66];
  raw_bytes(raw, 1);
  torch[0] = 0x02;
  torch[1] = 'c';
  memcpy(torch + 2, raw, 64);
  gpuipc_handle_t h;
  ASSERT_RC(gpuipc_handle_from_cuda_ipc(NULL, 64, 0, 1, 0, child, &h),
            -EINVAL);
  ASSERT_RC(gpuipc_handle_from_cuda_ipc(raw, 64, 0, 1, 0, child, NULL),
            -EINVAL);
  ipc_refused(raw, 63, 0, 1, 0, child, -EINVAL, "len 63");
  ipc_refused(torch, 65, 0, 1, 0, child, -EINVAL, "len 65");
  ipc_refused(torch, 67, 0, 1, 0, child, -EINVAL, "len 67");
  uint8_t bad[66];
  memcpy(bad, torch, 66);
  bad[0] = 0x01;
  ipc_refused(bad, 66, 0, 1, 0, child, GPUIPC_E_BADHANDLE, "version 2");
  bad[0] = 0x02;
  bad[1] = 'e';
  ipc_refused(bad, 66, 0, 1, 0, child, GPUIPC_E_UNSUPPORTED,
              "expandable-segment");
  /* Real expandable handles: a 24-byte header and a 4-byte descriptor
   * number a piece (30 bytes for one piece), or 64-byte fabric handles. */
  uint8_t exp[2 + 24 + 64 * 2] = {0x02, 'e'};
  ipc_refused(exp, 30, 0, 1, 0, child, GPUIPC_E_UNSUPPORTED,
              "expandable-segment");
  ipc_refused(exp, 2 + 24 + 4 * 11, 0, 1, 0, child, GPUIPC_E_UNSUPPORTED,
              "from_torch");
  ipc_refused(exp, sizeof(exp), 0, 1, 0, child, GPUIPC_E_UNSUPPORTED,
              "gpuipc_handle_from_cuda_fd");
  ipc_refused(exp, 2, 0, 1, 0, child, GPUIPC_E_UNSUPPORTED,
              "expandable-segment");
  bad[1] = 'x';
  ipc_refused(bad, 66, 0, 1, 0, child, GPUIPC_E_BADHANDLE, "type byte");
  uint8_t zero[64] = {0};
  ipc_refused(zero, 64, 0, 1, 0, child, GPUIPC_E_BADHANDLE, "all zero");
  ipc_refused(raw, 64, 0, 0, 0, child, -EINVAL, "size is 0");
  ipc_refused(raw, 64, (size_t)1 << 48, 1, 0, child, -EINVAL, "2^48");
  ipc_refused(raw, 64, SIZE_MAX, 2, 0, child, -EINVAL, "2^48");
  ipc_refused(raw, 64, 0, 1, -1, child, -EINVAL, "device -1");
  ipc_refused(raw, 64, 0, 1, 7, child, -ERANGE, "7");
  ipc_refused(raw, 64, 0, 1, 0, 0, -EINVAL, "exporter_pid 0");
  ipc_refused(raw, 64, 0, 1, 0, -5, -EINVAL, "exporter_pid -5");
  ipc_refused(raw, 64, 0, 1, 0, 4194305, -EINVAL, "not a pid");
  ipc_refused(raw, 64, 0, 1, 0, (int)getpid(), -EINVAL, "this process");
}

static void ipc_fields(pid_t child)
{
  const struct gpuipc__proc_id *me = gpuipc__proc_self();
  uint8_t raw[64], torch[66];
  raw_bytes(raw, 1);
  torch[0] = 0x02;
  torch[1] = 'c';
  memcpy(torch + 2, raw, 64);
  gpuipc_handle_t a, b;
  ASSERT_OK(gpuipc_handle_from_cuda_ipc(raw, 64, 4096, 1000, 1, child, &a));
  ASSERT_OK(gpuipc_handle_from_cuda_ipc(torch, 66, 4096, 1000, 1, child, &b));
  ASSERT_EQ(a.version, GPUIPC_HANDLE_VERSION);
  ASSERT_EQ(a.kind, GPUIPC_KIND_LEGACY);
  ASSERT_EQ(a.type, GPUIPC_HT_LEGACY);
  ASSERT_EQ(a.flags, 0);
  ASSERT_EQ_U(a.size, 1000);
  ASSERT_EQ_U(a.offset, 4096);
  ASSERT_EQ_U(a.alloc_size, 5096);
  ASSERT_EQ(memcmp(a.device_uuid, uuid1, 16), 0);
  ASSERT_EQ(memcmp(a.bytes, raw, 64), 0);
  ASSERT_EQ(a.pid, (uint32_t)child);
  ASSERT_EQ_U(a.pidns, me->pidns);
  ASSERT_EQ(memcmp(a.boot_id, me->boot_id, 16), 0);
  ASSERT_TRUE(a.nonce != 0 && a.nonce != me->nonce);
  ASSERT_TRUE(a.export_id != 0);
  ASSERT_EQ(a.fd, -1);
  /* The prefix is only a prefix: the same handle, byte for byte. */
  uint8_t pa[GPUIPC_HANDLE_PACKED_SIZE], pb[GPUIPC_HANDLE_PACKED_SIZE];
  ASSERT_EQ(gpuipc_handle_pack(&a, pa, sizeof(pa)), GPUIPC_HANDLE_PACKED_SIZE);
  ASSERT_EQ(gpuipc_handle_pack(&b, pb, sizeof(pb)), GPUIPC_HANDLE_PACKED_SIZE);
  ASSERT_EQ(memcmp(pa, pb, sizeof(pa)), 0);
  /* The strict unpack takes it back, field for field. */
  gpuipc_handle_t u;
  ASSERT_OK(gpuipc_handle_unpack(pa, sizeof(pa), &u));
  ASSERT_EQ(memcmp(&u, &a, sizeof(u)), 0);

  gpuipc_handle_t d0;
  ASSERT_OK(gpuipc_handle_from_cuda_ipc(raw, 64, 0, 1, 0, child, &d0));
  ASSERT_EQ(memcmp(d0.device_uuid, uuid0, 16), 0);
}

/* Same bytes, offset, size, exporter: same identity; any other: another. */
static void ipc_identity(pid_t child, pid_t other)
{
  uint8_t raw[64], raw2[64];
  raw_bytes(raw, 1);
  raw_bytes(raw2, 2);
  gpuipc_handle_t a, again, off, size, bytes, pid;
  ASSERT_OK(gpuipc_handle_from_cuda_ipc(raw, 64, 4096, 1000, 0, child, &a));
  ASSERT_OK(gpuipc_handle_from_cuda_ipc(raw, 64, 4096, 1000, 0, child,
                                        &again));
  ASSERT_OK(gpuipc_handle_from_cuda_ipc(raw, 64, 8192, 1000, 0, child, &off));
  ASSERT_OK(gpuipc_handle_from_cuda_ipc(raw, 64, 4096, 999, 0, child, &size));
  ASSERT_OK(gpuipc_handle_from_cuda_ipc(raw2, 64, 4096, 1000, 0, child,
                                        &bytes));
  ASSERT_OK(gpuipc_handle_from_cuda_ipc(raw, 64, 4096, 1000, 0, other, &pid));
  ASSERT_EQ_U(again.export_id, a.export_id);
  ASSERT_EQ_U(again.nonce, a.nonce);
  ASSERT_NE(off.export_id, a.export_id);
  ASSERT_NE(size.export_id, a.export_id);
  ASSERT_NE(bytes.export_id, a.export_id);
  ASSERT_NE(pid.pid, a.pid);
}

static void fd_handles(void)
{
  gpuipc_handle_t h;
  int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_TRUE(fd >= 0);
  ASSERT_RC(gpuipc_handle_from_cuda_fd(fd, 0, 1, 0, NULL), -EINVAL);
  ASSERT_RC(gpuipc_handle_from_cuda_fd(-1, 0, 1, 0, &h), -EBADF);
  int closed = open("/dev/null", O_RDONLY | O_CLOEXEC);
  close(closed);
  ASSERT_RC(gpuipc_handle_from_cuda_fd(closed, 0, 1, 0, &h), -EBADF);
  ASSERT_RC(gpuipc_handle_from_cuda_fd(fd, 0, 0, 0, &h), -EINVAL);
  ASSERT_RC(gpuipc_handle_from_cuda_fd(fd, SIZE_MAX, 2, 0, &h), -EINVAL);
  ASSERT_RC(gpuipc_handle_from_cuda_fd(fd, 0, 1, -1, &h), -EINVAL);
  ASSERT_RC(gpuipc_handle_from_cuda_fd(fd, 0, 1, 9, &h), -ERANGE);

  const struct gpuipc__proc_id *me = gpuipc__proc_self();
  gpuipc_handle_t a, b;
  ASSERT_OK(gpuipc_handle_from_cuda_fd(fd, 3 << 20, 1000, 0, &a));
  ASSERT_OK(gpuipc_handle_from_cuda_fd(fd, 3 << 20, 1000, 0, &b));
  ASSERT_EQ(a.kind, GPUIPC_KIND_VMM);
  ASSERT_EQ(a.type, GPUIPC_HT_POSIX_FD);
  ASSERT_EQ(a.fd, fd); /* borrowed, not duplicated */
  ASSERT_EQ_U(a.offset, 3 << 20);
  ASSERT_EQ_U(a.size, 1000);
  ASSERT_EQ_U(a.alloc_size, 2 * FAKE_CUDA_GRANULARITY); /* whole granules */
  ASSERT_EQ(memcmp(a.device_uuid, uuid0, 16), 0);
  ASSERT_EQ(a.pid, me->pid);
  ASSERT_EQ_U(a.nonce, me->nonce);
  ASSERT_NE(a.export_id, b.export_id); /* each call maps anew */
  uint8_t p[GPUIPC_HANDLE_PACKED_SIZE];
  ASSERT_EQ(gpuipc_handle_pack(&a, p, sizeof(p)), GPUIPC_HANDLE_PACKED_SIZE);
  gpuipc_handle_t u;
  ASSERT_OK(gpuipc_handle_unpack(p, sizeof(p), &u));
  ASSERT_EQ(u.fd, -1);
  u.fd = fd;
  ASSERT_EQ(memcmp(&u, &a, sizeof(u)), 0);
  close(fd);
}

/*
 * The import cache trusts an identity only for the block and offset it
 * was mapped from: a handle that claims a held LEGACY buffer's identity
 * with other bytes or another offset is refused, never given that memory.
 */
static void cache_identity(void)
{
  gpuipc_buf_t *buf;
  ASSERT_OK(gpuipc_buf_alloc(1 << 20, GPUIPC_KIND_LEGACY, 0, 0, &buf));
  gpuipc_handle_t h;
  ASSERT_OK(gpuipc_buf_export(buf, &h));
  gpuipc_buf_t *same;
  ASSERT_OK(gpuipc_buf_import(&h, -1, 0, &same));
  ASSERT_PTR_EQ(same, buf);
  ASSERT_OK(gpuipc_buf_release(same));

  gpuipc_handle_t lie = h;
  lie.bytes[5] ^= 0x40;
  gpuipc_buf_t *got = NULL;
  ASSERT_RC(gpuipc_buf_import(&lie, -1, 0, &got), GPUIPC_E_BADHANDLE);
  ASSERT_ERR_MENTIONS("another block or offset");
  ASSERT_PTR_EQ(got, NULL);
  lie = h;
  lie.offset = 4096;
  ASSERT_RC(gpuipc_buf_import(&lie, -1, 0, &got), GPUIPC_E_BADHANDLE);
  ASSERT_PTR_EQ(got, NULL);
  ASSERT_OK(gpuipc_buf_release(buf)); /* the refusals took no reference */
}

int main(void)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  if (getenv("GPUIPC_CUDA_LIB") != NULL)
    SKIP("GPUIPC_CUDA_LIB is set: this test loads the fake driver itself");
  setenv("GPUIPC_CUDA_LIB", FAKE_CUDA_FULL, 1);
  ASSERT_EQ(gpuipc_device_count(), 2);

  int w1, w2;
  pid_t child = live_child(&w1), other = live_child(&w2);
  ipc_arguments(child);
  ipc_fields(child);
  ipc_identity(child, other);
  end_child(other, w2);
  uint8_t raw[64];
  raw_bytes(raw, 1);
  gpuipc_handle_t h;
  ASSERT_RC(gpuipc_handle_from_cuda_ipc(raw, 64, 0, 1, 0, other, &h),
            GPUIPC_E_PEER_GONE);
  ASSERT_ERR_MENTIONS("has exited");
  end_child(child, w1);

  fd_handles();
  cache_identity();
  printf("ok\n");
  return 0;
}

#else

int main(void)
{
  SKIP("built without the CUDA headers: no fake driver");
}

#endif
