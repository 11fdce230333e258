/*
 * gpu_peer: one side of a cross-process GPU buffer test.
 *
 *   gpu_peer export KIND DEV SIZE SEED SOCK MODE [COUNT]
 *     Allocates COUNT (default 1) buffers of KIND on local device DEV, fills
 *     buffer k with pattern SEED + 1000 k by a kernel, exports them and sends
 *     the handles (and fds) over the socket SOCK. MODE "exit": exit at once,
 *     leaving the memory to whoever holds it. MODE "verify": wait until the
 *     importer says it wrote pattern SEED + 1000 k + 1 into buffer k, check
 *     every byte here, answer, release, exit. MODE "verify-exit": the
 *     same, then exit without releasing (LEGACY memory must not be freed
 *     while another process has it open).
 *
 *   gpu_peer import DEV SOCK [--expect-ordinal N] [--expect-gone]
 *                            [--hold-until-gone]
 *     Receives handles, imports each on local device DEV (-1: the GPU the
 *     handle names), checks every byte, writes the next pattern straight
 *     into the mapping from a kernel on the importing device, tells the
 *     exporter and waits for its verdict. --expect-gone: the import must
 *     fail with GPUIPC_E_PEER_GONE. --hold-until-gone: after the verdict,
 *     keep the buffers until gpuipc_buf_alive reports GPUIPC_E_PEER_GONE.
 *
 * Exits 0 when every check passed, 1 (with the reason) otherwise.
 */
#include "gpu_kernels.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <vector>

extern "C" void gpuipc__pool_stats(uint64_t *imported, uint64_t *live);

/* Fill @n bytes at device pointer @p from a kernel on local device @dev. */
static void gpu_fill(int dev, void *p, size_t n, uint64_t seed)
{
  CUDA_OK(cudaSetDevice(dev));
  size_t blocks = (n + 255) / 256;
  if (blocks > 4096)
    blocks = 4096;
  fill_kernel<<<(unsigned)blocks, 256>>>((uint8_t *)p, n, seed);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
}

/*
 * Copy the buffer to the host on local device @dev (the one its mapping is
 * for) and check it holds pattern @seed.
 */
static void gpu_check(int dev, const void *p, size_t n, uint64_t seed,
                      const char *what)
{
  CUDA_OK(cudaSetDevice(dev));
  std::vector<uint8_t> host(n);
  CUDA_OK(cudaMemcpy(host.data(), p, n, cudaMemcpyDefault));
  size_t bad = test_check(host.data(), n, seed);
  if (bad != (size_t)-1)
    TFAIL("%s: byte %zu of %zu is 0x%02x, pattern %llu says 0x%02x", what,
          bad, n, host[bad], (unsigned long long)seed,
          test_pattern(seed, bad));
}

static gpuipc_kind_t parse_kind(const char *s)
{
  if (strcmp(s, "vmm") == 0)
    return GPUIPC_KIND_VMM;
  if (strcmp(s, "legacy") == 0)
    return GPUIPC_KIND_LEGACY;
  if (strcmp(s, "pool") == 0)
    return GPUIPC_KIND_POOL;
  if (strcmp(s, "host") == 0)
    return GPUIPC_KIND_HOST;
  TFAIL("unknown kind %s", s);
}

/* "GPU-2f7d26e5": the start of the device's UUID, enough to tell GPUs apart. */
static const char *uuid_of(int dev)
{
  static char out[16];
  gpuipc_device_info_t d;
  memset(&d, 0, sizeof(d));
  d.size = sizeof(d);
  if (gpuipc_device_info(dev, &d) != 0)
    return "?";
  snprintf(out, sizeof(out), "%.12s", d.uuid_str);
  return out;
}

static int run_export(int argc, char **argv)
{
  if (argc < 8)
    TFAIL("usage: gpu_peer export KIND DEV SIZE SEED SOCK MODE [COUNT]");
  gpuipc_kind_t kind = parse_kind(argv[2]);
  int dev = atoi(argv[3]);
  size_t size = strtoull(argv[4], NULL, 0);
  uint64_t seed = strtoull(argv[5], NULL, 0);
  int sock = atoi(argv[6]);
  bool verify = strncmp(argv[7], "verify", 6) == 0;
  bool release = strcmp(argv[7], "verify") == 0;
  int count = argc > 8 ? atoi(argv[8]) : 1;
  std::vector<gpuipc_buf_t *> bufs((size_t)count);

  for (int k = 0; k < count; k++) {
    uint64_t s = seed + 1000u * (uint64_t)k;
    ASSERT_OK(gpuipc_buf_alloc(size, kind, dev, 0, &bufs[(size_t)k]));
    gpuipc_buf_t *b = bufs[(size_t)k];
    gpu_fill(dev, gpuipc_buf_ptr(b), size, s);
    gpuipc_handle_t h;
    ASSERT_OK(gpuipc_buf_export(b, &h));
    proto_send_handle(sock, &h, s, (uint32_t)(count - 1 - k));
    if (h.fd >= 0)
      close(h.fd);
    printf("export: pid %d, %s buffer %d, %zu bytes on GPU %d (%s), "
           "pattern %llu\n", (int)getpid(), gpuipc_kind_name(kind), k, size,
           dev, uuid_of(dev), (unsigned long long)s);
  }
  fflush(stdout);
  if (!verify) {
    printf("export: exiting without releasing\n");
    return 0;
  }
  for (int k = 0; k < count; k++) {
    uint64_t s = seed + 1000u * (uint64_t)k;
    uint64_t written = proto_recv_word(sock, TAG_WRITTEN);
    ASSERT_EQ_U(written, s + 1);
    gpu_check(dev, gpuipc_buf_ptr(bufs[(size_t)k]), size, written,
              "export: the importer's bytes");
    printf("export: buffer %d holds the importer's pattern %llu\n", k,
           (unsigned long long)written);
  }
  proto_send_word(sock, TAG_DONE, 1);
  if (!release) {
    printf("export: exiting without releasing\n");
    return 0;
  }
  for (int k = 0; k < count; k++)
    ASSERT_OK(gpuipc_buf_release(bufs[(size_t)k]));
  return 0;
}

static int run_import(int argc, char **argv)
{
  if (argc < 4)
    TFAIL("usage: gpu_peer import DEV SOCK [--expect-ordinal N] "
          "[--expect-gone] [--hold-until-gone]");
  int dev = atoi(argv[2]);
  int sock = atoi(argv[3]);
  int expect_ordinal = -1;
  bool expect_gone = false, hold = false;
  for (int i = 4; i < argc; i++) {
    if (strcmp(argv[i], "--expect-ordinal") == 0 && i + 1 < argc)
      expect_ordinal = atoi(argv[++i]);
    else if (strcmp(argv[i], "--expect-gone") == 0)
      expect_gone = true;
    else if (strcmp(argv[i], "--hold-until-gone") == 0)
      hold = true;
    else
      TFAIL("unknown argument %s", argv[i]);
  }
  const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
  std::vector<gpuipc_buf_t *> bufs;
  std::vector<uint64_t> seeds;
  gpuipc_kind_t kind = GPUIPC_KIND_AUTO;
  uint32_t left = 1;
  while (left > 0) {
    gpuipc_handle_t h;
    uint64_t seed;
    proto_recv_handle(sock, &h, &seed, &left);
    kind = h.kind;
    gpuipc_buf_t *b = NULL;
    int rc = gpuipc_buf_import(&h, dev, 0, &b);
    if (expect_gone) {
      if (rc != GPUIPC_E_PEER_GONE)
        TFAIL("import of a dead exporter's %s buffer returned %d (%s), "
              "expected GPUIPC_E_PEER_GONE", gpuipc_kind_name(h.kind), rc,
              gpuipc_err_name(rc));
      printf("import: %s -> GPUIPC_E_PEER_GONE: %s\n",
             gpuipc_kind_name(h.kind), gpuipc_last_error());
      proto_send_word(sock, TAG_GONE, 1);
      return 0;
    }
    if (rc != 0)
      TFAIL_GPUIPC("gpuipc_buf_import(%s, device %d) returned %s",
            gpuipc_kind_name(h.kind), dev, gpuipc_err_name(rc));
    if (h.fd >= 0)
      close(h.fd); /* gpuipc keeps its own copy */

    /* A second import is a cache hit: the same mapping. */
    gpuipc_buf_t *again = NULL;
    ASSERT_OK(gpuipc_buf_import(&h, dev, 0, &again));
    ASSERT_TRUE(again == b);
    ASSERT_OK(gpuipc_buf_release(again));

    int on = gpuipc_buf_device(b);
    if (expect_ordinal >= 0)
      ASSERT_EQ(on, expect_ordinal);
    if (dev < 0) {
      /* Mapped onto the GPU the handle names, whatever the ordinals. */
      gpuipc_device_info_t di;
      memset(&di, 0, sizeof(di));
      di.size = sizeof(di);
      ASSERT_OK(gpuipc_device_info(on, &di));
      ASSERT_TRUE(memcmp(di.uuid, h.device_uuid, 16) == 0);
    }
    gpu_check(on, gpuipc_buf_ptr(b), h.size, seed,
              "import: the exporter's bytes");
    gpu_fill(on, gpuipc_buf_ptr(b), h.size, seed + 1);
    int owner = gpuipc_device_by_uuid(h.device_uuid);
    char where[64] = "";
    if (cvd != NULL)
      snprintf(where, sizeof(where), " [CUDA_VISIBLE_DEVICES=%s]", cvd);
    printf("import: %s, %llu bytes of pid %u on %s, mapped for local GPU "
           "%d (%s)%s: read pattern %llu; a kernel wrote %llu into it\n",
           gpuipc_kind_name(h.kind), (unsigned long long)h.size, h.pid,
           owner >= 0 ? uuid_of(owner) : "?", on, uuid_of(on), where,
           (unsigned long long)seed, (unsigned long long)seed + 1);
    proto_send_word(sock, TAG_WRITTEN, seed + 1);
    bufs.push_back(b);
    seeds.push_back(seed);
  }
  if (kind == GPUIPC_KIND_POOL) {
    uint64_t imported = 0, live = 0;
    gpuipc__pool_stats(&imported, &live);
    printf("import: %zu POOL buffers came from %llu pool import(s)\n",
           bufs.size(), (unsigned long long)imported);
    ASSERT_EQ_U(imported, 1);
    ASSERT_EQ_U(live, 1);
  }
  ASSERT_EQ_U(proto_recv_word(sock, TAG_DONE), 1);
  fflush(stdout);
  if (hold) {
    int rc = 0;
    for (int i = 0; i < 2000 && rc == 0; i++) {
      rc = gpuipc_buf_alive(bufs[0]);
      if (rc == 0)
        usleep(10000);
    }
    ASSERT_RC(rc, GPUIPC_E_PEER_GONE);
    printf("import: after the exporter exited, gpuipc_buf_alive says "
           "GPUIPC_E_PEER_GONE: %s\n", gpuipc_last_error());
    /* The driver may or may not complain when closing dead memory. */
    for (gpuipc_buf_t *b : bufs) {
      rc = gpuipc_buf_release(b);
      printf("import: released the dead mapping: %s\n", gpuipc_err_name(rc));
    }
    return 0;
  }
  for (gpuipc_buf_t *b : bufs)
    ASSERT_OK(gpuipc_buf_release(b));
  if (kind == GPUIPC_KIND_POOL) {
    uint64_t imported = 0, live = 0;
    gpuipc__pool_stats(&imported, &live);
    ASSERT_EQ_U(live, 0);
  }
  return 0;
}

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc >= 2 && strcmp(argv[1], "export") == 0)
    return run_export(argc, argv);
  if (argc >= 2 && strcmp(argv[1], "import") == 0)
    return run_import(argc, argv);
  TFAIL("usage: gpu_peer export|import ...");
}
