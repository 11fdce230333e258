/*
 * HOST buffers between real processes (fork+exec):
 *  1. we allocate, write a pattern and export; the handle and fd cross a
 *     Unix socket to a peer that imports, checks every byte and writes its
 *     own pattern; we then see the peer's bytes.
 *  2. an exporter process sends its handle and exits before we import: the
 *     fd alone keeps the memory, and every byte is still there.
 */
#include "test.h"

#include "os/os.h"

#include <sys/socket.h>
#include <unistd.h>

#define TIMEOUT_MS 20000

static void send_handle(int sock, gpuipc_buf_t *b)
{
  gpuipc_handle_t h;
  ASSERT_OK(gpuipc_buf_export(b, &h));
  uint8_t packed[GPUIPC_HANDLE_PACKED_SIZE];
  ASSERT_EQ(gpuipc_handle_pack(&h, packed, sizeof(packed)), sizeof(packed));
  ASSERT_OK(gpuipc__sock_send(sock, packed, sizeof(packed), &h.fd, 1,
                              TIMEOUT_MS));
  close(h.fd);
}

static void peer_writes_back(size_t size)
{
  int sv[2];
  ASSERT_OK(gpuipc__sock_pair(sv));
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_buf_alloc(size, GPUIPC_KIND_HOST, -1, 0, &b));
  test_fill(gpuipc_buf_ptr(b), size, 1);

  char fdarg[16];
  snprintf(fdarg, sizeof(fdarg), "%d", sv[1]);
  const char *args[] = {"import-check-write", fdarg, NULL};
  int keep[] = {sv[1], -1};
  pid_t pid = test_spawn("host_peer", args, keep);
  close(sv[1]);

  send_handle(sv[0], b);
  char reply[64];
  ssize_t n = gpuipc__sock_recv(sv[0], reply, sizeof(reply), NULL, NULL,
                                TIMEOUT_MS);
  ASSERT_GT(n, 0);
  ASSERT_TRUE(n == 2 && memcmp(reply, "ok", 2) == 0);
  /* The peer wrote pattern 2 over the whole buffer. */
  ASSERT_EQ(test_check(gpuipc_buf_ptr(b), size, 2), (size_t)-1);
  ASSERT_OK(gpuipc__sock_send(sv[0], "bye", 3, NULL, 0, TIMEOUT_MS));
  ASSERT_EQ(test_wait(pid, TIMEOUT_MS), 0);
  close(sv[0]);
  ASSERT_OK(gpuipc_buf_release(b));
}

static void exporter_exits_first(size_t size)
{
  int fds_before = test_count_fds(0);
  int sv[2];
  ASSERT_OK(gpuipc__sock_pair(sv));
  char fdarg[16], sizearg[32];
  snprintf(fdarg, sizeof(fdarg), "%d", sv[1]);
  snprintf(sizearg, sizeof(sizearg), "%zu", size);
  const char *args[] = {"export-and-exit", fdarg, sizearg, NULL};
  int keep[] = {sv[1], -1};
  pid_t pid = test_spawn("host_peer", args, keep);
  close(sv[1]);

  uint8_t packed[GPUIPC_HANDLE_PACKED_SIZE];
  int fd = -1, nfds = 1;
  ssize_t n = gpuipc__sock_recv(sv[0], packed, sizeof(packed), &fd, &nfds,
                                TIMEOUT_MS);
  ASSERT_EQ(n, sizeof(packed));
  ASSERT_EQ(nfds, 1);
  /* The exporter has released its buffer and exited before we import. */
  ASSERT_EQ(test_wait(pid, TIMEOUT_MS), 0);
  ASSERT_TRUE(!gpuipc__pid_alive(pid));

  gpuipc_handle_t h;
  ASSERT_OK(gpuipc_handle_unpack(packed, sizeof(packed), &h));
  ASSERT_EQ(h.pid, pid);
  h.fd = fd;
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_buf_import(&h, -1, 0, &b));
  close(fd); /* the import keeps its own descriptor */
  ASSERT_EQ(gpuipc_buf_size(b), size);
  ASSERT_EQ(test_check(gpuipc_buf_ptr(b), size, 3), (size_t)-1);
  ASSERT_OK(gpuipc_buf_release(b));
  close(sv[0]);
  ASSERT_EQ(test_count_fds(0), fds_before);
}

int main(void)
{
  test_warm_driver(); /* count descriptors with the driver's included */
  peer_writes_back(4096);
  peer_writes_back((size_t)8 << 20 | 123); /* 8 MiB + an odd tail */
  exporter_exits_first(1 << 20);
  exporter_exits_first(5000);
  printf("host_share: ok\n");
  return 0;
}
