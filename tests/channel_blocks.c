/*
 * Block batches (gpuipc_channel_send_blocks, gpuipc_channel_recv_blocks)
 * between two real processes (tests/helpers/chan_blocks_peer.c says what
 * each end checks):
 *
 *   - host: HOST buffers, 1024 blocks of 3 to 4 KiB scattered in two
 *     8 MiB "layers", received into a random permutation of the slots of
 *     another buffer, 6 batches on a channel of depth 2 (the sender waits
 *     for room, and rewrites a block only once the batch that used it is
 *     free); every byte is checked; one message and one descriptor a
 *     batch; each buffer introduced once. Both ends first check every
 *     refusal of bad input (nothing sent or taken), and the receiver that
 *     a tensor and a batch refuse the wrong receive call and stay.
 *   - gpu: the same with LEGACY buffers of the fake CUDA driver's device 0,
 *     a created stream and the legacy default stream by turns: one launch
 *     of gpuipc's block kernel per batch, its list in pinned memory (the
 *     fake counts them, and refuses a list it cannot read), every byte
 *     checked after the stream;
 *   - gpu-batch: the fake without kernel launches: one cuMemcpyBatchAsync
 *     per batch (on the legacy stream, on gpuipc's own stream);
 *   - gpu-loop: the fake without either: the copies one by one, the same
 *     bytes;
 *   - paged (host and gpu, kernel): a paged cache's blocks, whole slots of
 *     one buffer on both sides: the list's slots form, into slots;
 *   - in flight: batches in flight are bounded by the depth, not by the
 *     host staging slots (a list of up to about 1300 blocks lies in its
 *     record slot's part of the list area); a larger list takes a staging
 *     slot, and waits for one;
 *   - lies: a sender that writes a block list breaking one rule
 *     (chan_blocks_peer lie): GPUIPC_E_PROTO with a sentence naming it, for
 *     good.
 */
#include "test.h"

#include <stdlib.h>
#include <string.h>

#define BATCHES "6"

static void pair(const char *domain, const char *kind, const char *copies)
{
  const char *rargs[] = {"recv", domain, "blocks", kind, BATCHES, copies,
                         NULL};
  const char *sargs[] = {"send", domain, "blocks", kind, BATCHES, NULL};
  pid_t r = test_spawn("chan_blocks_peer", rargs, NULL);
  pid_t s = test_spawn("chan_blocks_peer", sargs, NULL);
  int rs = test_wait(s, 120000), rr = test_wait(r, 120000);
  if (rs != 0 || rr != 0)
    TFAIL("%s: sender exited %d, receiver %d", kind, rs, rr);
}

/* Receive a batch of @n blocks of @bytes into @buf, checking each. */
static void take(gpuipc_channel_t *rx, gpuipc_buf_t *buf, size_t n,
                 uint64_t bytes, uint64_t seed)
{
  gpuipc_block_t *d = malloc(n * sizeof(*d));
  ASSERT_TRUE(d != NULL);
  for (size_t i = 0; i < n; i++)
    d[i] = (gpuipc_block_t){buf, (n - 1 - i) * bytes, bytes};
  ASSERT_OK(gpuipc_channel_recv_blocks(rx, d, n, NULL, 30000));
  for (size_t i = 0; i < n; i++)
    ASSERT_EQ_U(test_check((uint8_t *)gpuipc_buf_ptr(buf) + d[i].offset,
                           bytes, seed + i), (size_t)-1);
  free(d);
}

static void in_flight(gpuipc_domain_t *dom)
{
  gpuipc_channel_opts_t ropts = GPUIPC_CHANNEL_OPTS_INIT;
  ropts.timeout_ms = 30000;
  gpuipc_channel_opts_t opts = ropts;
  opts.depth = 8;
  opts.stage_slots = 1;
  gpuipc_channel_t *tx, *rx;
  test_chan_pair(dom, "in-flight", &opts, &ropts, &tx, &rx);
  /* Blocks at 8 + 256 i: not a paged cache's, so their lists take the
   * full form (152 and 48056 bytes); at 256 i they take the slots form. */
  enum { SMALL = 4, LARGE = 2000 };
  gpuipc_buf_t *src, *dst;
  ASSERT_OK(gpuipc_buf_alloc(1 << 20, GPUIPC_KIND_HOST, -1, 0, &src));
  ASSERT_OK(gpuipc_buf_alloc(1 << 20, GPUIPC_KIND_HOST, -1, 0, &dst));
  gpuipc_block_t *b = malloc(LARGE * sizeof(*b));
  ASSERT_TRUE(b != NULL);
  uint8_t *p = gpuipc_buf_ptr(src);
  for (size_t i = 0; i < LARGE; i++) {
    b[i] = (gpuipc_block_t){src, i * 256 + 8, 16};
    test_fill(p + i * 256 + 8, 16, 100 + i);
  }
  /* Eight small batches with one staging slot: the depth is the bound. */
  for (int k = 0; k < 8; k++)
    ASSERT_OK(gpuipc_channel_send_blocks(tx, b, SMALL, NULL,
                                         GPUIPC_SEND_NONBLOCK, NULL));
  ASSERT_RC(gpuipc_channel_send_blocks(tx, b, SMALL, NULL,
                                       GPUIPC_SEND_NONBLOCK, NULL), -EAGAIN);
  ASSERT_ERR_MENTIONS("8 messages in flight");
  for (int k = 0; k < 8; k++)
    take(rx, dst, SMALL, 16, 100);
  /* A large list takes the staging slot until its message is free. */
  uint64_t t;
  ASSERT_OK(gpuipc_channel_send_blocks(tx, b, LARGE, NULL,
                                       GPUIPC_SEND_NONBLOCK, &t));
  ASSERT_RC(gpuipc_channel_send_blocks(tx, b, LARGE, NULL,
                                       GPUIPC_SEND_NONBLOCK, NULL), -EAGAIN);
  ASSERT_ERR_MENTIONS("every staging slot is in flight");
  ASSERT_OK(gpuipc_channel_send_blocks(tx, b, SMALL, NULL,
                                       GPUIPC_SEND_NONBLOCK, NULL));
  take(rx, dst, LARGE, 16, 100);
  ASSERT_OK(gpuipc_channel_send_done(tx, t, 30000));
  ASSERT_OK(gpuipc_channel_send_blocks(tx, b, LARGE, NULL,
                                       GPUIPC_SEND_NONBLOCK, NULL));
  take(rx, dst, SMALL, 16, 100);
  take(rx, dst, LARGE, 16, 100);
  /* The same blocks of a paged cache: a list a sixth the size, in its
   * record slot's part of the list area: no staging slot held, however
   * many such batches are in flight (up to the depth). */
  for (size_t i = 0; i < LARGE; i++) {
    b[i] = (gpuipc_block_t){src, i * 256, 16};
    test_fill(p + i * 256, 16, 100 + i);
  }
  uint64_t t1, t2;
  ASSERT_OK(gpuipc_channel_send_blocks(tx, b, LARGE, NULL,
                                       GPUIPC_SEND_NONBLOCK, &t1));
  ASSERT_OK(gpuipc_channel_send_blocks(tx, b, LARGE, NULL,
                                       GPUIPC_SEND_NONBLOCK, &t2));
  take(rx, dst, LARGE, 16, 100);
  take(rx, dst, LARGE, 16, 100);
  ASSERT_OK(gpuipc_channel_send_done(tx, t2, 30000));
  printf("in flight: 8 batches at depth 8 with one staging slot; a list "
         "of %d blocks holds the slot, and in the slots form none\n",
         LARGE);
  free(b);
  ASSERT_OK(gpuipc_channel_close(tx));
  ASSERT_OK(gpuipc_channel_close(rx));
  gpuipc_buf_release(src);
  gpuipc_buf_release(dst);
}

static void liar(gpuipc_domain_t *dom, const char *what, const char *mention)
{
  char name[64];
  snprintf(name, sizeof(name), "lie-%s", what);
  const char *args[] = {"lie", "chan-blocks", name, what, NULL};
  pid_t pid = test_spawn("chan_blocks_peer", args, NULL);
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.timeout_ms = 30000;
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, name, &o, &ch));
  gpuipc_tensor_t *v = NULL;
  ASSERT_OK(gpuipc_channel_recv(ch, &v, NULL, 30000));
  ASSERT_OK(gpuipc_tensor_release(v, NULL));
  gpuipc_buf_t *buf;
  ASSERT_OK(gpuipc_buf_alloc(4096, GPUIPC_KIND_HOST, -1, 0, &buf));
  gpuipc_block_t dst[2] = {{buf, 0, 1024}, {buf, 1024, 1024}};
  int rc = gpuipc_channel_recv_blocks(ch, dst, 2, NULL, 30000);
  printf("%-9s -> %s\n", what, gpuipc_last_error());
  ASSERT_RC(rc, GPUIPC_E_PROTO);
  ASSERT_ERR_MENTIONS(mention);
  /* For good, whatever is called next. */
  ASSERT_RC(gpuipc_channel_recv_blocks(ch, dst, 2, NULL, 0), GPUIPC_E_PROTO);
  ASSERT_RC(gpuipc_channel_recv(ch, &v, NULL, 0), GPUIPC_E_PROTO);
  gpuipc_buf_release(buf);
  ASSERT_OK(gpuipc_channel_close(ch));
  ASSERT_EQ(test_wait(pid, 60000), 0);
}

int main(void)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  pair("chan-blocks-host", "host", "host");
  pair("chan-blocks-hpaged", "host-paged", "host");
#ifdef FAKE_CUDA_FULL
  setenv("GPUIPC_CUDA_LIB", FAKE_CUDA_FULL, 1);
  pair("chan-blocks-gpu", "gpu", "kernel");
  pair("chan-blocks-gpaged", "gpu-paged", "kernel");
  setenv("FAKE_CUDA_HIDE", "cuLaunchKernel", 1);
  pair("chan-blocks-batch", "gpu", "batch");
  setenv("FAKE_CUDA_HIDE", "cuLaunchKernel,cuMemcpyBatchAsync", 1);
  pair("chan-blocks-loop", "gpu", "loop");
  unsetenv("FAKE_CUDA_HIDE");
  unsetenv("GPUIPC_CUDA_LIB");
#else
  printf("built without the CUDA headers: no fake driver, gpu cases not "
         "run\n");
#endif
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("chan-blocks", NULL, &dom));
  in_flight(dom);
  liar(dom, "outside", "block 1 (buffer 0, offset 65024, 1024 bytes) "
                       "reaches outside its buffer");
  liar(dom, "mapped", "reaches outside buffer key 1, 65536 bytes as mapped");
  liar(dom, "overflow", "block 1 (buffer 0, offset 18446744073709551605");
  liar(dom, "key", "buffer key 77, which the receiver does not hold");
  liar(dom, "index", "block 1 (buffer 3");
  liar(dom, "empty", "is empty");
  liar(dom, "seq", "says it is message 3's");
  liar(dom, "count", "is 104 bytes, not the 128");
  liar(dom, "dupkey", "buffer 1 (key 1) has the key of an earlier entry");
  liar(dom, "forgetown", "forgets buffer key 1, the list's own");
  liar(dom, "nobufmsg", "not on the socket");
  liar(dom, "shape", "does not describe a block list");
  liar(dom, "slot", "block 1 (buffer 0, offset 65536, 1024 bytes) reaches "
                    "outside its buffer");
  liar(dom, "slotwrap", "offset 18446744073709551615");
  liar(dom, "slotbufs", "the slots form with 2 buffers");
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
