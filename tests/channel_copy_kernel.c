/*
 * gpuipc_channel_recv_into within one GPU: up to GPUIPC_CHAN_COPY_KERNEL_KB
 * the copy is one launch of gpuipc's copy kernel, which writes the
 * message's release word itself; from there up (or when the kernel cannot
 * be used) the copy engine copies and the word is written after it, by
 * gpuipc's own stream waiting on an event of the caller's (or, for small
 * copies the kernel cannot take, by the caller's stream). On the fake CUDA
 * driver, with copies that lag:
 *   - the scenarios of tests/channel_gpu_order.c (the sender's stream
 *     waits for the release before overwriting what the receiver reads,
 *     every byte checked) with the copy as a kernel (1 MiB, up to 16 MiB), as
 *     the copy engine and a word written after it (GPUIPC_CHAN_COPY_
 *     KERNEL_KB=512), and with a driver that cannot launch kernels; the
 *     receiver counts launches, words and events to show which path ran;
 *   - sizes from 1 byte to 1 MiB + 3 at aligned and unaligned offsets of
 *     both ends: every byte and the bytes around it checked, each aligned
 *     copy a launch, each unaligned one a copy and a word (chan_kernel_peer);
 *   - the same sizes sent from memory gpuipc did not allocate, written on
 *     the sender's stream just before each send: each staging copy of an
 *     aligned source up to the setting is one launch of the kernel, which
 *     writes the message's ready word (no stream memory operation), each
 *     other a copy and a ready word after it; with a driver that cannot
 *     launch kernels, every one a copy and a word (chan_kernel_peer stage).
 */
#include "helpers/fake_lag.h"

#include <unistd.h>

static void run(const char *peer, const char *const *rargs,
                const char *const *sargs, const char *what)
{
  pid_t r = test_spawn(peer, rargs, NULL);
  pid_t s = test_spawn(peer, sargs, NULL);
  int rs = test_wait(s, 60000), rr = test_wait(r, 60000);
  if (rs != 0 || rr != 0)
    TFAIL("%s: sender exited %d, receiver %d", what, rs, rr);
  printf("%s: ok\n", what);
}

int main(void)
{
  gpuipc_domain_t *dom = fake_lag_begin("chan-copy-kernel");
  static const struct {
    const char *expect, *kb, *hide;
  } cfg[] = {{"kernel", NULL, NULL},
             {"after", "512", NULL},
             {"stream", NULL, "cuLaunchKernel"}};
  for (int i = 0; i < 3; i++) {
    if (cfg[i].kb != NULL)
      setenv("GPUIPC_CHAN_COPY_KERNEL_KB", cfg[i].kb, 1);
    else
      unsetenv("GPUIPC_CHAN_COPY_KERNEL_KB");
    if (cfg[i].hide != NULL)
      setenv("FAKE_CUDA_HIDE", cfg[i].hide, 1);
    else
      unsetenv("FAKE_CUDA_HIDE");
    char ch[32], what[64];
    snprintf(ch, sizeof(ch), "order-%s", cfg[i].expect);
    snprintf(what, sizeof(what), "12 rounds of 1 MiB, release %s",
             cfg[i].expect);
    const char *rargs[] = {"recv", "chan-copy-kernel", ch, "12",
                           cfg[i].expect, NULL};
    const char *sargs[] = {"send", "chan-copy-kernel", ch, "12", NULL};
    run("chan_order_peer", rargs, sargs, what);
  }
  unsetenv("FAKE_CUDA_HIDE");
  /* Sizes and offsets, the kernel up to 64 KiB and up to 16 MiB. */
  static const char *const kbs[] = {"64", "16384"};
  for (int i = 0; i < 2; i++) {
    setenv("GPUIPC_CHAN_COPY_KERNEL_KB", kbs[i], 1);
    char ch[32], max[32], what[64];
    snprintf(ch, sizeof(ch), "sizes-%s", kbs[i]);
    snprintf(max, sizeof(max), "%ld", atol(kbs[i]) * 1024);
    snprintf(what, sizeof(what), "27 sizes and offsets, kernel up to %s KiB",
             kbs[i]);
    const char *rargs[] = {"recv", "chan-copy-kernel", ch, max, NULL};
    const char *sargs[] = {"send", "chan-copy-kernel", ch, max, NULL};
    run("chan_kernel_peer", rargs, sargs, what);
  }
  /* Staged sends: the kernel up to 64 KiB, up to 16 MiB, and none; the
   * stages LEGACY memory of device 0, which the fake shares. */
  setenv("FAKE_CUDA_VMM_DEV", "1", 1);
  static const struct {
    const char *kb, *hide;
  } st[] = {{"64", NULL}, {"16384", NULL}, {"16384", "cuLaunchKernel"}};
  for (int i = 0; i < 3; i++) {
    setenv("GPUIPC_CHAN_COPY_KERNEL_KB", st[i].kb, 1);
    if (st[i].hide != NULL)
      setenv("FAKE_CUDA_HIDE", st[i].hide, 1);
    else
      unsetenv("FAKE_CUDA_HIDE");
    char ch[32], max[32], what[96];
    snprintf(ch, sizeof(ch), "staged-%d", i);
    snprintf(max, sizeof(max), "%ld",
             st[i].hide != NULL ? 0L : atol(st[i].kb) * 1024);
    snprintf(what, sizeof(what), "27 staged sizes and offsets, kernel up to "
             "%s KiB%s", st[i].kb, st[i].hide != NULL ? ", no kernels" : "");
    const char *rargs[] = {"recv", "chan-copy-kernel", ch, max, "staged",
                           NULL};
    const char *sargs[] = {"stage", "chan-copy-kernel", ch, max, NULL};
    run("chan_kernel_peer", rargs, sargs, what);
  }
  unsetenv("FAKE_CUDA_HIDE");
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
