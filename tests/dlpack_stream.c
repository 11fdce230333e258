/*
 * DLPack hand-over on the consumer's stream, on a GPU: a consumer on a
 * non-blocking stream reads each received tensor there and drops it (runs
 * the deleter) with its reads still queued, while the sender overwrites
 * the buffer the moment the release lets it. Handed over with
 * gpuipc_tensor_to_dlpack_stream, the consumer must read the round's
 * bytes in every one of 1000 rounds. The same with gpuipc_tensor_to_dlpack
 * (released on the legacy default stream) runs first and only reports how
 * often it read the sender's later bytes: the race the stream closes.
 */
#include "gpu_test.h"

#define ROUNDS "1000"

static void one(const char *mode)
{
  char name[32];
  snprintf(name, sizeof(name), "dl-%s", mode);
  const char *sargs[] = {"send", "dl-race", name, "0", ROUNDS, NULL};
  const char *rargs[] = {"recv", "dl-race", name, "0", ROUNDS, mode, NULL};
  gpu_run_pair("dlpack_race", sargs, rargs);
}

int main(void)
{
  gpuipc_domain_t *dom = gpu_test_begin(1, "dlpack_race", "dl-race");
  one("legacy");
  one("stream");
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
