/*
 * The other process of tests/host_share.c.
 *   host_peer import-check-write FD : receive a handle + fd on socket FD,
 *       import, check pattern 1 on every byte, write pattern 2, reply "ok",
 *       wait for "bye", release.
 *   host_peer export-and-exit FD SIZE : allocate SIZE bytes, write pattern 3,
 *       send the handle + fd on socket FD, release and exit.
 * Exit status 0 on success; anything else names the failed step on stderr.
 */
#include "test.h"

#include "os/os.h"

#include <unistd.h>

#define TIMEOUT_MS 20000

static int import_check_write(int sock)
{
  uint8_t packed[GPUIPC_HANDLE_PACKED_SIZE];
  int fd = -1, nfds = 1;
  ssize_t n = gpuipc__sock_recv(sock, packed, sizeof(packed), &fd, &nfds,
                                TIMEOUT_MS);
  ASSERT_EQ(n, sizeof(packed));
  ASSERT_EQ(nfds, 1);
  gpuipc_handle_t h;
  ASSERT_OK(gpuipc_handle_unpack(packed, sizeof(packed), &h));
  ASSERT_EQ(h.pid, getppid());
  h.fd = fd;
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_buf_import(&h, -1, 0, &b));
  close(fd);
  size_t size = gpuipc_buf_size(b);
  ASSERT_EQ_U(size, h.size);
  size_t bad = test_check(gpuipc_buf_ptr(b), size, 1);
  if (bad != (size_t)-1)
    TFAIL("byte %zu of %zu differs from what the exporter wrote", bad, size);
  test_fill(gpuipc_buf_ptr(b), size, 2);
  ASSERT_OK(gpuipc__sock_send(sock, "ok", 2, NULL, 0, TIMEOUT_MS));
  char bye[8];
  ASSERT_EQ(gpuipc__sock_recv(sock, bye, sizeof(bye), NULL, NULL, TIMEOUT_MS),
            3);
  ASSERT_OK(gpuipc_buf_release(b));
  return 0;
}

static int export_and_exit(int sock, size_t size)
{
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_buf_alloc(size, GPUIPC_KIND_HOST, -1, 0, &b));
  test_fill(gpuipc_buf_ptr(b), size, 3);
  gpuipc_handle_t h;
  ASSERT_OK(gpuipc_buf_export(b, &h));
  uint8_t packed[GPUIPC_HANDLE_PACKED_SIZE];
  ASSERT_EQ(gpuipc_handle_pack(&h, packed, sizeof(packed)), sizeof(packed));
  ASSERT_OK(gpuipc__sock_send(sock, packed, sizeof(packed), &h.fd, 1,
                              TIMEOUT_MS));
  close(h.fd);
  ASSERT_OK(gpuipc_buf_release(b));
  return 0;
}

int main(int argc, char **argv)
{
  if (argc >= 3 && strcmp(argv[1], "import-check-write") == 0)
    return import_check_write(atoi(argv[2]));
  if (argc >= 4 && strcmp(argv[1], "export-and-exit") == 0)
    return export_and_exit(atoi(argv[2]), strtoull(argv[3], NULL, 10));
  fprintf(stderr, "usage: host_peer import-check-write FD | "
                  "export-and-exit FD SIZE\n");
  return 2;
}
