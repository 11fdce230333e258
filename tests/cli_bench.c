/*
 * `gpuipc bench`: a real run of the tool (it starts itself again as the
 * receiving process, which checks the bytes of every size it receives),
 * in JSON: the schema version, one latency row, one bandwidth row per size
 * with positive figures and the baseline named, each of 5 alternated runs
 * a side; bad arguments are usage errors. HOST buffers everywhere (and no
 * kernel round trip); on the fake CUDA driver's GPU 0 (LEGACY buffers),
 * the kernel-in-the-loop rows too, whose kernels the fake runs on its
 * "device memory" and both processes check word by word; with a GPU, the
 * GPU rows. Every path has the block rows (a batch, a message a block,
 * the driver's batched copy) for 16 KiB blocks, 4 a round under
 * --max-bytes 256 KiB, and where the kernels run (the paths with kernel
 * rows) the floor of gpuipc's block kernel; every byte of them checked:
 * on the fake driver, a block kernel that
 * leaves a block out (FAKE_CUDA_BLOCKS_SKIP) fails the run, and says
 * which block.
 */
#include "gpu_test.h"

#include <stdio.h>

#ifdef GPUIPC_CLI
/* Run `ENV gpuipc bench ARGS`, returning its exit status and its stdout. */
static int run_cli(const char *env, const char *args, char *out, size_t cap)
{
  char cmd[1024];
  snprintf(cmd, sizeof(cmd), "%s %s bench %s", env, GPUIPC_CLI, args);
  return test_popen(cmd, out, cap);
}

/* How many times @needle occurs in @s. */
static int count(const char *s, const char *needle)
{
  int n = 0;
  for (const char *p = strstr(s, needle); p != NULL;
       p = strstr(p + 1, needle))
    n++;
  return n;
}

/* Every "KEY": NUMBER in @s is > 0; returns how many there were. */
static int positive(const char *s, const char *key)
{
  char pat[64];
  snprintf(pat, sizeof(pat), "\"%s\": ", key);
  int n = 0;
  for (const char *p = strstr(s, pat); p != NULL; p = strstr(p + 1, pat)) {
    double v = strtod(p + strlen(pat), NULL);
    if (!(v > 0)) {
      fprintf(stderr, "%s is %g in:\n%s\n", key, v, s);
      ASSERT_TRUE(v > 0);
    }
    n++;
  }
  return n;
}

/* A JSON run with sizes 4, 16, 64 and 256 KiB per path; between @kmin
 * and @kmax paths have the kernel round trip and its floors (between two
 * GPUs without peer access it is left out). */
static void check_json(const char *env, const char *args, int paths,
                       const char *baseline, int kmin, int kmax)
{
  static char out[1 << 18];
  char all[256];
  snprintf(all, sizeof(all), "--quick --json --max-bytes 262144 %s", args);
  ASSERT_EQ(run_cli(env, all, out, sizeof(out)), 0);
  ASSERT_TRUE(strstr(out, "\"schema\": 1") != NULL);
  ASSERT_EQ(positive(out, "gpuipc_gbs"), 4 * paths);
  ASSERT_EQ(positive(out, "baseline_gbs"), 4 * paths);
  ASSERT_EQ(positive(out, "ratio"), 4 * paths);
  ASSERT_EQ(count(out, "\"bytes\": 262144"), paths);
  ASSERT_TRUE(strstr(out, baseline) != NULL);
  /* Paths with the kernel rows (below), and the block rows: three a path
   * and, where the kernels run, the kernel floor. */
  int rows = count(out, "\"row\": \"kloop_gpuipc\"");
  int brows = 3 * paths + rows;
  /* Five runs a side, alternated (tests/cli_json.py checks the order). */
  ASSERT_EQ(count(out, "\"runs\": 5"), 1 + 4 * paths + brows);
  ASSERT_EQ(positive(out, "gpuipc_gbs_min"), 4 * paths);
  ASSERT_EQ(positive(out, "baseline_gbs_max"), 4 * paths);
  ASSERT_EQ(count(out, "\"gpuipc_gbs_runs\": ["), 4 * paths);
  ASSERT_EQ(count(out, "\"baseline_gbs_runs\": ["), 4 * paths);
  /* The kernels' rows: gpuipc's and its two floors, every word checked
   * by both processes (a wrong one fails the run). */
  if (rows < kmin || rows > kmax)
    TFAIL("%d paths with a kernel round trip, not %d .. %d:\n%s", rows, kmin,
          kmax, out);
  ASSERT_EQ(count(out, "\"row\": \"kloop_one_process\""), rows);
  ASSERT_EQ(count(out, "\"row\": \"kloop_floor_word\""), rows);
  ASSERT_EQ(positive(out, "ratio_one_process"), rows);
  ASSERT_EQ(positive(out, "ratio_floor_word"), rows);
  ASSERT_EQ(positive(out, "median_us"), paths + 3 * rows + brows);
  ASSERT_EQ(positive(out, "p99_us"), paths + 3 * rows);
  /* The blocks: 16 KiB only (a cache of 4 x 256 KiB blocks exceeds
   * --max-bytes), 4 a round; gpuipc's row with its ratios; the kernel
   * floor where the kernels run. */
  ASSERT_EQ(count(out, "\"row\": \"blocks_gpuipc\""), paths);
  ASSERT_EQ(count(out, "\"row\": \"blocks_per_message\""), paths);
  ASSERT_EQ(count(out, "\"row\": \"blocks_floor\""), paths);
  ASSERT_EQ(count(out, "\"row\": \"blocks_floor_kernel\""), rows);
  ASSERT_EQ(count(out, "\"block_bytes\": 16384"), brows);
  ASSERT_EQ(count(out, "\"block_bytes\""), brows);
  ASSERT_EQ(count(out, "\"n\": 4,"), brows);
  ASSERT_EQ(positive(out, "gbs"), brows);
  ASSERT_EQ(positive(out, "min_us"), brows);
  ASSERT_EQ(positive(out, "max_us"), brows);
  ASSERT_EQ(positive(out, "ratio_floor"), paths);
  ASSERT_EQ(positive(out, "ratio_floor_kernel"), rows);
  ASSERT_EQ(positive(out, "ratio_per_message"), paths);
}
#endif

int main(void)
{
#ifdef GPUIPC_CLI
  static char out[1 << 16];
  ASSERT_EQ(run_cli("", "--kind nope 2>&1", out, sizeof(out)), 2);
  ASSERT_TRUE(strstr(out, "unknown kind") != NULL);
  ASSERT_EQ(run_cli("", "--max-bytes 12 2>&1", out, sizeof(out)), 2);
  ASSERT_EQ(run_cli("", "--stream sideways 2>&1", out, sizeof(out)), 2);
  /* A kind asked for by name that is not here: a failure that says so,
   * never a run of HOST buffers in its place. */
  ASSERT_EQ(run_cli("GPUIPC_NO_CUDA=1", "--quick --max-bytes 4096 --kind vmm "
                    "2>&1", out, sizeof(out)), 1);
  if (strstr(out, "kind vmm is not available") == NULL)
    TFAIL("bench --kind vmm without a driver said:\n%s", out);
  ASSERT_EQ(run_cli("", "--runs 4 2>&1", out, sizeof(out)), 2);
  ASSERT_TRUE(strstr(out, "--runs wants 5 .. 32") != NULL);
  /* HOST buffers against memcpy: one path. */
  check_json("GPUIPC_NO_CUDA=1", "", 1, "\"baseline\": \"memcpy\"", 0,
             0);
#ifdef FAKE_CUDA_FULL
  /* The fake driver's GPU 0 (its GPU 1 has no interprocess events). */
  check_json("GPUIPC_CUDA_LIB=" FAKE_CUDA_FULL " FAKE_CUDA_NDEV=1",
             "--kind legacy", 1, "\"baseline\": \"cuMemcpyAsync\"", 1, 1);
  ASSERT_EQ(run_cli("GPUIPC_CUDA_LIB=" FAKE_CUDA_FULL " FAKE_CUDA_NDEV=1",
                    "--quick --max-bytes 4096 --kind legacy", out,
                    sizeof(out)), 0);
  ASSERT_TRUE(strstr(out, "kernels in the loop") != NULL);
  ASSERT_TRUE(strstr(out, "kloop_one_process") != NULL);
  /* The receiver checks every byte of every block: a block kernel that
   * leaves the last block of each batch out fails the run. */
  ASSERT_EQ(run_cli("GPUIPC_CUDA_LIB=" FAKE_CUDA_FULL " FAKE_CUDA_NDEV=1 "
                    "FAKE_CUDA_BLOCKS_SKIP=1", "--quick --max-bytes 262144 "
                    "--kind legacy 2>&1", out, sizeof(out)), 1);
  if (strstr(out, "blocks_gpuipc, the receiver: block 3 (16384 bytes) "
                  "holds 0") == NULL)
    TFAIL("bench with a block kernel that skips a block said:\n%s", out);
#endif
  /* The tables. */
  ASSERT_EQ(run_cli("GPUIPC_NO_CUDA=1", "--quick --max-bytes 65536", out,
                    sizeof(out)), 0);
  ASSERT_TRUE(strstr(out, "round trip") != NULL);
  ASSERT_TRUE(strstr(out, "4 KiB") != NULL);
  ASSERT_TRUE(strstr(out, "Blocks of a paged cache") != NULL);
  if (gpuipc_device_count() <= 0) {
    printf("no GPU: the HOST rows are the whole test\n");
    return 0;
  }
  /* Every ordered pair of GPUs, against the driver's copies. */
  int n = gpuipc_device_count();
  check_json("", "", n * n, "\"baseline\": \"cuMemcpyAsync\"", n, n * n);
  return 0;
#else
  printf("skipped: the gpuipc CLI is not built\n");
  return 77;
#endif
}
