/*
 * LEGACY openings, on the fake CUDA driver: a process that imports many
 * LEGACY buffers keeps one driver opening a block (src/mem/legacy.c's
 * table of openings, in buckets by the handle's hash). 200 buffers of
 * another process (legacy_peer): each imported once (every byte checked
 * through the driver), then through a second export of the same block
 * (another export id: the registry's miss, the table's hit), which must
 * share the first's opening (same address); then released in an order
 * that leaves some openings with one buffer and closes others, the closed
 * ones imported again (a new opening, the right bytes); then everything
 * released and imported once more, which the fake's 256 openings a
 * process allow only if every closed opening was given back.
 */
#include "test.h"

#include "helpers/fake_lag.h"

#ifdef FAKE_CUDA_FULL
#include "helpers/cu_peer.h"
#include "os/os.h"

#include <sys/socket.h>
#include <unistd.h>

#define N 200
#define SIZE 4096
#define TIMEOUT_MS 60000

/* Buffer @b holds pattern @seed, read back through the driver. */
static void expect_bytes(gpuipc_buf_t *b, uint64_t seed, int i)
{
  static uint8_t bytes[SIZE];
  struct gpuipc__ctx_saved saved;
  ASSERT_OK(gpuipc__ctx_enter(0, &saved));
  CU_OK(cuMemcpyDtoH, bytes, (CUdeviceptr)(uintptr_t)gpuipc_buf_ptr(b),
        SIZE);
  gpuipc__ctx_leave(&saved);
  size_t bad = test_check(bytes, SIZE, seed);
  if (bad != (size_t)-1)
    TFAIL("buffer %d: byte %zu is not pattern %llu's", i, bad,
          (unsigned long long)seed);
}

static gpuipc_buf_t *import(const gpuipc_handle_t *h, uint64_t seed, int i)
{
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_buf_import(h, 0, 0, &b));
  expect_bytes(b, seed, i);
  return b;
}

int main(void)
{
  gpuipc_domain_t *dom = fake_lag_begin("legacyopens");
  int sv[2];
  ASSERT_OK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv));
  char fdarg[16], narg[16];
  snprintf(fdarg, sizeof(fdarg), "%d", sv[1]);
  snprintf(narg, sizeof(narg), "%d", N);
  const char *args[] = {fdarg, narg, NULL};
  int keep[] = {sv[1], -1};
  pid_t pid = test_spawn("legacy_peer", args, keep);
  close(sv[1]);

  static gpuipc_handle_t h[N], h2[N];
  static gpuipc_buf_t *one[N], *two[N];
  for (int i = 0; i < N; i++) {
    uint8_t packed[GPUIPC_HANDLE_PACKED_SIZE];
    ASSERT_EQ(gpuipc__sock_recv(sv[0], packed, sizeof(packed), NULL, NULL,
                                TIMEOUT_MS),
              sizeof(packed));
    ASSERT_OK(gpuipc_handle_unpack(packed, sizeof(packed), &h[i]));
    ASSERT_EQ(h[i].kind, GPUIPC_KIND_LEGACY);
    h2[i] = h[i];
    h2[i].export_id += 1000000; /* the same block, another export */
  }
  for (int i = 0; i < N; i++)
    one[i] = import(&h[i], (uint64_t)i + 1, i);
  for (int i = 0; i < N; i++) {
    two[i] = import(&h2[i], (uint64_t)i + 1, i);
    if (two[i] == one[i] || gpuipc_buf_ptr(two[i]) != gpuipc_buf_ptr(one[i]))
      TFAIL("buffer %d: the second export is %s at %p, the first at %p: "
            "not one opening shared by two buffers", i,
            two[i] == one[i] ? "the same buffer" : "another buffer",
            gpuipc_buf_ptr(two[i]), gpuipc_buf_ptr(one[i]));
  }
  /* Even i: the first goes; i % 3 == 0 too: the second goes, and with it
   * the opening. Those are imported again. */
  for (int i = 0; i < N; i += 2)
    ASSERT_OK(gpuipc_buf_release(one[i]));
  for (int i = 0; i < N; i += 6)
    ASSERT_OK(gpuipc_buf_release(two[i]));
  for (int i = 0; i < N; i++) {
    if (i % 2 == 0 && i % 6 != 0)
      expect_bytes(two[i], (uint64_t)i + 1, i); /* its opening stays */
    if (i % 6 == 0)
      one[i] = import(&h[i], (uint64_t)i + 1, i);
  }
  for (int i = 0; i < N; i++) {
    if (i % 2 != 0 || i % 6 == 0)
      ASSERT_OK(gpuipc_buf_release(one[i]));
    if (i % 6 != 0)
      ASSERT_OK(gpuipc_buf_release(two[i]));
  }
  /* Every opening closed: N new ones fit the fake's 256. */
  for (int i = N - 1; i >= 0; i--)
    one[i] = import(&h2[i], (uint64_t)i + 1, i);
  for (int i = 0; i < N; i++)
    ASSERT_OK(gpuipc_buf_release(one[i]));
  printf("%d LEGACY blocks: imported, shared by a second export, closed "
         "and opened again, every byte read\n", N);

  ASSERT_OK(gpuipc__sock_send(sv[0], "bye", 3, NULL, 0, TIMEOUT_MS));
  ASSERT_EQ(test_wait(pid, TIMEOUT_MS), 0);
  close(sv[0]);
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
#else
int main(void)
{
  SKIP("built without the CUDA headers: no fake CUDA driver");
}
#endif
