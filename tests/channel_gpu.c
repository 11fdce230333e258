/*
 * Channels on the GPU: "the receiver waits for the sender's event". Two
 * chan_gpu processes per case: the sender queues a 50 ms spin kernel and a
 * kernel writing the round's pattern, and sends the buffer at once; the
 * receiver copies it (copy mode and views, alternately) on its own stream
 * and must see the pattern in every byte. For VMM, LEGACY and POOL
 * buffers, cudaMalloc memory (staged), and across two GPUs when there are
 * two: 8 MiB (the copy engine copies) and, across GPUs, 4,100 bytes and
 * 256 KiB, which gpuipc's copy kernel copies (from the sender's memory,
 * or from its stage when staged). tests/channel_gpu_order.c checks the
 * same waits on the fake CUDA driver, on every machine.
 */
#include "gpu_test.h"

#include <unistd.h>

#define BIG ((size_t)8 << 20)

static void one_opt(const char *kind, int sdev, int rdev, size_t bytes,
                    const char *opt)
{
  char name[80], sd[16], rd[16], nb[32];
  snprintf(name, sizeof(name), "g-%s-%d-%d-%zu%s", kind, sdev, rdev, bytes,
           opt != NULL ? opt : "");
  snprintf(sd, sizeof(sd), "%d", sdev);
  snprintf(rd, sizeof(rd), "%d", rdev);
  snprintf(nb, sizeof(nb), "%zu", bytes);
  printf("--- %s, %zu bytes: sender on GPU %d, receiver on GPU %d%s%s\n",
         kind, bytes, sdev, rdev, opt != NULL ? ", " : "",
         opt != NULL ? opt : "");
  const char *sargs[] = {"send", "chan-gpu", name, kind, sd, "4", nb, NULL};
  const char *rargs[] = {"recv", "chan-gpu", name, rd, "4", nb, opt, NULL};
  gpu_run_pair("chan_gpu", sargs, rargs);
}

static void one(const char *kind, int sdev, int rdev, size_t bytes)
{
  one_opt(kind, sdev, rdev, bytes, NULL);
}

int main(void)
{
  gpuipc_domain_t *dom = gpu_test_begin(1, "chan_gpu", "chan-gpu");
  static const struct {
    const char *name;
    gpuipc_kind_t kind;
  } kinds[] = {{"vmm", GPUIPC_KIND_VMM},
               {"legacy", GPUIPC_KIND_LEGACY},
               {"pool", GPUIPC_KIND_POOL},
               {"foreign", GPUIPC_KIND_AUTO}};
  int ran = 0;
  for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
    if (gpuipc_kind_available(kinds[i].kind) != 0) {
      printf("--- %s: not available here (%s)\n", kinds[i].name,
             gpuipc_last_error());
      continue;
    }
    one(kinds[i].name, 0, 0, BIG);
    ran++;
  }
  ASSERT_GT(ran, 0);
  if (gpuipc_device_count() >= 2) {
    gpuipc_p2p_t p2p = {.size = sizeof(p2p)};
    if (gpuipc_topo_p2p(1, 0, &p2p) == 0 && p2p.access) {
      one("vmm", 0, 1, BIG);
      one("foreign", 1, 0, BIG);
      /* Small enough for the copy kernel across GPUs: a length that is
       * no multiple of 16, and the largest the kernel takes. */
      one("vmm", 0, 1, 4100);
      one("foreign", 1, 0, (size_t)256 << 10);
      /* A channel opened without a device maps for the sender's GPU:
       * recv_into memory of another GPU copies from there. */
      one_opt("vmm", 0, 1, BIG, "nodev");
      one_opt("foreign", 1, 0, BIG, "nodev");
      one_opt("vmm", 1, 0, 4100, "nodev");
    } else {
      printf("--- across GPUs: GPU 1 cannot reach GPU 0\n");
    }
  }
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
