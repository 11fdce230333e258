/*
 * VMM buffers: cuMemCreate memory shared by POSIX fd between processes
 * (the importer keeping the fd given with GPUIPC_BUF_TAKE_FD), on one GPU
 * and across two (a kernel on the importer's GPU writes straight
 * into the exporter's memory), after its creator has exited (the fd keeps
 * it), and under a CUDA_VISIBLE_DEVICES that reorders the GPUs.
 */
#include "gpu_test.h"
#include "mem/mem.h"

#include <fcntl.h>

#if GPUIPC_HAVE_CUDA

#define SIZE ((size_t)5 << 20) /* not a multiple of the 2 MiB granularity */

static void check_local(void)
{
  int frc = gpuipc_fabric_status(0);
  printf("fabric handles on GPU 0: %s\n",
         frc == 0 ? "usable" : gpuipc_last_error());
  ASSERT_TRUE(frc == 0 || frc == GPUIPC_E_DENIED ||
              frc == GPUIPC_E_UNSUPPORTED);
  ASSERT_RC(gpuipc_fabric_status(gpuipc_device_count()), -ERANGE);

  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_buf_alloc(1000, GPUIPC_KIND_VMM, 0, 0, &b));
  ASSERT_EQ(gpuipc_buf_kind(b), GPUIPC_KIND_VMM);
  ASSERT_EQ(gpuipc_buf_size(b), 1000);
  ASSERT_EQ(gpuipc_buf_device(b), 0);
  gpu_fill_host(0, gpuipc_buf_ptr(b), 1000, 7);
  gpu_expect(0, gpuipc_buf_ptr(b), 1000, 7);

  gpuipc_handle_t h;
  ASSERT_OK(gpuipc_buf_export(b, &h));
  ASSERT_EQ(h.kind, GPUIPC_KIND_VMM);
  ASSERT_EQ(h.type, GPUIPC_HT_POSIX_FD);
  ASSERT_EQ_U(h.size, 1000);
  gpuipc_device_info_t di;
  memset(&di, 0, sizeof(di));
  di.size = sizeof(di);
  ASSERT_OK(gpuipc_device_info(0, &di));
  ASSERT_GT(di.granularity, 0);
  ASSERT_EQ_U(h.alloc_size, di.granularity); /* 1000 bytes: one granule */
  ASSERT_GE(h.fd, 0);
  ASSERT_TRUE(fcntl(h.fd, F_GETFD) & FD_CLOEXEC);

  /* Our own export comes back as the same buffer. */
  gpuipc_buf_t *self;
  ASSERT_OK(gpuipc_buf_import(&h, -1, 0, &self));
  ASSERT_TRUE(self == b);
  ASSERT_OK(gpuipc_buf_release(self));

  /* The same memory under another identity: a real second mapping. */
  gpuipc_handle_t other = h;
  other.nonce ^= 0x5a5a5a5a5a5a5a5aull;
  gpuipc_buf_t *second;
  ASSERT_OK(gpuipc_buf_import(&other, -1, 0, &second));
  ASSERT_TRUE(gpuipc_buf_ptr(second) != gpuipc_buf_ptr(b));
  gpu_expect(0, gpuipc_buf_ptr(second), 1000, 7);
  gpu_fill_host(0, gpuipc_buf_ptr(second), 1000, 8);
  gpu_expect(0, gpuipc_buf_ptr(b), 1000, 8);
  /* ... which can be exported again: its fd is passed on. */
  gpuipc_handle_t again;
  ASSERT_OK(gpuipc_buf_export(second, &again));
  ASSERT_GE(again.fd, 0);
  ASSERT_EQ_U(again.nonce, other.nonce);
  close(again.fd);
  ASSERT_OK(gpuipc_buf_release(second));

  /* GPUIPC_BUF_TAKE_FD: a new mapping keeps the very fd given (close-on-
   * exec set), exports through a duplicate of it and closes it at the
   * last release. */
  gpuipc_handle_t taken = h;
  taken.nonce ^= 0x3c3c3c3c3c3c3c3cull;
  taken.fd = fcntl(h.fd, F_DUPFD, 3); /* without FD_CLOEXEC */
  ASSERT_GE(taken.fd, 0);
  gpuipc_buf_t *third;
  ASSERT_OK(gpuipc_buf_import(&taken, -1, GPUIPC_BUF_TAKE_FD, &third));
  gpu_expect(0, gpuipc_buf_ptr(third), 1000, 8);
  ASSERT_EQ(fcntl(taken.fd, F_GETFD), FD_CLOEXEC); /* open, the very fd */
  ASSERT_OK(gpuipc_buf_export(third, &again));
  ASSERT_GE(again.fd, 0);
  ASSERT_NE(again.fd, taken.fd);
  close(again.fd);
  ASSERT_OK(gpuipc_buf_release(third));
  ASSERT_EQ(fcntl(taken.fd, F_GETFD), -1); /* closed with the mapping */

  /* gpuipc's channels and segments take fds that came over its sockets,
   * close-on-exec already (GPUIPC__BUF_FD_CLOEXEC): kept as they are, no
   * fcntl on the import's path. This one, without the flag, shows it. */
  gpuipc_handle_t own = h;
  own.nonce ^= 0x6969696969696969ull;
  own.fd = fcntl(h.fd, F_DUPFD, 3); /* without FD_CLOEXEC */
  ASSERT_GE(own.fd, 0);
  gpuipc_buf_t *fourth;
  ASSERT_OK(gpuipc__buf_import(&own, -1,
                               GPUIPC_BUF_TAKE_FD | GPUIPC__BUF_FD_CLOEXEC,
                               &fourth));
  gpu_expect(0, gpuipc_buf_ptr(fourth), 1000, 8);
  ASSERT_EQ(fcntl(own.fd, F_GETFD), 0); /* open, kept as it came */
  ASSERT_OK(gpuipc_buf_release(fourth));
  ASSERT_EQ(fcntl(own.fd, F_GETFD), -1);

  /* An fd that is not CUDA memory. */
  gpuipc_handle_t bogus = other;
  bogus.nonce ^= 1;
  bogus.fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(bogus.fd, 0);
  gpuipc_buf_t *x = NULL;
  ASSERT_RC(gpuipc_buf_import(&bogus, -1, 0, &x), GPUIPC_E_BADHANDLE);
  ASSERT_ERR_MENTIONS("cuMemImportFromShareableHandle");
  /* Refused with GPUIPC_BUF_TAKE_FD: the fd stays the caller's. */
  ASSERT_RC(gpuipc_buf_import(&bogus, -1, GPUIPC_BUF_TAKE_FD, &x),
            GPUIPC_E_BADHANDLE);
  ASSERT_TRUE(fcntl(bogus.fd, F_GETFD) != -1);
  close(bogus.fd);

  /* A GPU this process cannot see. */
  gpuipc_handle_t away = other;
  away.nonce ^= 2;
  away.device_uuid[0] ^= 0xff;
  away.device_uuid[15] ^= 0xff;
  ASSERT_RC(gpuipc_buf_import(&away, -1, 0, &x), GPUIPC_E_NODEVICE);
  char uuid[48];
  snprintf(uuid, sizeof(uuid), "GPU-%02x%02x%02x%02x", away.device_uuid[0],
           away.device_uuid[1], away.device_uuid[2], away.device_uuid[3]);
  ASSERT_ERR_MENTIONS(uuid);
  printf("unknown GPU: %s\n", gpuipc_last_error());

  close(h.fd);
  ASSERT_OK(gpuipc_buf_release(b));
}

/*
 * The creator exits with the buffer still allocated; this process holds
 * nothing but the fd. A new process imports it, finds the creator's bytes
 * and writes its own, which this process then reads through a mapping of
 * its own.
 */
static void check_survives_creator(int dev)
{
  printf("--- vmm: creator on GPU %d exits, the fd alone keeps the memory\n",
         dev);
  gpuipc_handle_t h;
  gpu_export_and_exit("vmm", dev, SIZE, 300, &h);
  ASSERT_GE(h.fd, 0);
  int sock;
  pid_t imp = gpu_start_importer(-1, NULL, &sock);
  proto_send_handle(sock, &h, 300, 0);
  ASSERT_EQ_U(proto_recv_word(sock, TAG_WRITTEN), 301);
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_buf_import(&h, dev, 0, &b));
  gpu_expect(dev, gpuipc_buf_ptr(b), SIZE, 301);
  proto_send_word(sock, TAG_DONE, 1);
  ASSERT_EQ(test_wait(imp, GPU_PROC_TIMEOUT_MS), 0);
  ASSERT_OK(gpuipc_buf_release(b));
  close(h.fd);
  close(sock);
  printf("the creator's bytes and the importer's both crossed after the "
         "creator exited\n");
}

int main(void)
{
  test_require_gpus(1);
  gpu_require_helper("gpu_peer");
  int n = gpuipc_device_count();
  check_local();

  gpu_pair("vmm", 0, 0, SIZE, 100, "verify", 1, NULL, NULL);
  check_survives_creator(0);
  if (n < 2) {
    printf("NOTE: one GPU: the cross-GPU cases need two\n");
    return 0;
  }
  gpu_pair("vmm", 1, 1, SIZE, 110, "verify", 1, NULL, NULL);
  gpu_pair("vmm", 0, 1, SIZE, 120, "verify", 1, NULL, NULL);
  gpu_pair("vmm", 1, 0, SIZE, 130, "verify", 1, NULL, NULL);
  /*
   * The importer sees the GPUs the other way round: GPU 0's memory must
   * map onto its ordinal 1, found by UUID.
   */
  const char *const expect1[] = {"--expect-ordinal", "1", NULL};
  gpu_pair("vmm", 0, -1, SIZE, 140, "verify", 1, "1,0", expect1);
  const char *const expect0[] = {"--expect-ordinal", "0", NULL};
  gpu_pair("vmm", 1, -1, SIZE, 150, "verify", 1, "1,0", expect0);
  check_survives_creator(1);
  /* A named segment: the creator frees its part at once, the descriptors
   * keep the memory for those who open it afterwards, on either GPU. */
  gpu_segment_share("vmmseg", "vmm", 0, 1, 160, false);
  return 0;
}

#else
GPU_TEST_NEEDS_CUDA_HEADER()
#endif
