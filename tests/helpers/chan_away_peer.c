/*
 * One end of tests/channel_wait_across.c, on the fake CUDA driver:
 *
 *   chan_away_peer send DOMAIN CHANNEL ROUNDS MODE WAITS
 *   chan_away_peer recv DOMAIN CHANNEL ROUNDS MODE RDEV
 *
 * The sender fills a 4 KiB LEGACY buffer of device 0 with a copy it
 * leaves queued on a stream of device 0, sends it from that stream and
 * calls gpuipc_channel_send_wait on it, ROUNDS times. MODE tensor: the
 * receiver, on a stream of device RDEV, receives each view, queues a copy
 * of it out and releases it on that stream (gpuipc's own stream writes
 * the release word once the copy is done), then sleeps HOLD_MS before it
 * synchronises its stream: only then does the release word land, and the
 * receiver checks every byte it copied. MODE blocks: the buffer goes as
 * a block batch of its two halves, which the receiver lands swapped in a
 * LEGACY buffer of device RDEV with gpuipc_channel_recv_blocks; the copy,
 * and the release word after it, lag as the test's FAKE_CUDA_COPY_LAG_US
 * says (the fake runs a queued word write by itself), and the receiver
 * copies its buffer out and checks it after HOLD_MS likewise.
 *
 * So the word lands a few hundred ms after the sender has taken in the
 * release.
 * With GPUIPC_CHAN_EVENT_POLL_US at 1 s, a sender that polls the word
 * first sees it land and needs no stream wait; one that makes its stream
 * wait at once queues cuStreamWaitValue64. WAITS is what the sender must
 * count: "none" (its stream never waited) or "some" (at least one wait:
 * a sender held up for HOLD_MS between taking in a release and looking
 * at its word would find it landed and rightly queue nothing that
 * round). The receiver's stream on another GPU than the buffer's says so
 * in its releases (GPUIPC__REL_AWAY), and the sender waits at once; on
 * the buffer's own GPU the sender polls (a stream wait there would stall
 * behind the receiver's context on a real GPU).
 *
 * The receiver reads the right bytes only if its stream waited for the
 * sender's copy; the sender's next copy would overwrite them before the
 * receiver's read if its stream did not wait for the release word.
 */
#include "test.h"

#include "cuda/cuda.h"

#if GPUIPC_HAVE_CUDA

#include "helpers/cu_peer.h"
#include "core/private.h"

#include <unistd.h>

#define BYTES 4096
#define HOLD_MS 300

static int sender(gpuipc_channel_t *ch, long n, bool blocks,
                  const char *want)
{
  CUstream s = cu_stream_on(0);
  gpuipc_buf_t *buf;
  ASSERT_OK(gpuipc_buf_alloc(BYTES, GPUIPC_KIND_LEGACY, 0, 0, &buf));
  uint8_t *src = malloc(BYTES);
  ASSERT_TRUE(src != NULL);
  gpuipc_tensor_t t;
  int64_t shape[1];
  cu_bytes_tensor(&t, shape, gpuipc_buf_ptr(buf), BYTES, buf);
  int wt0 = cu_fake_count("fake_cuda_word_waits");
  uint64_t ticket = 0;
  for (long i = 1; i <= n; i++) {
    /* The last copy from src has run: the stream waited before it. */
    ASSERT_OK(gpuipc__stream_sync(0, s));
    test_fill(src, BYTES, (uint64_t)i);
    ASSERT_OK(gpuipc__memcpy_async(gpuipc_buf_ptr(buf), src, BYTES, 0, s));
    if (blocks) {
      gpuipc_block_t b[2] = {{buf, 0, BYTES / 2}, {buf, BYTES / 2, BYTES / 2}};
      ASSERT_OK(gpuipc_channel_send_blocks(ch, b, 2, s, 0, &ticket));
    } else {
      ASSERT_OK(gpuipc_channel_send(ch, &t, s, 0, &ticket));
    }
    ASSERT_OK(gpuipc_channel_send_wait(ch, ticket, s, 30000));
  }
  int wt = cu_fake_count("fake_cuda_word_waits") - wt0;
  ASSERT_OK(gpuipc_channel_send_done(ch, ticket, 30000));
  ASSERT_OK(gpuipc__stream_sync(0, s));
  printf("send: %d of %ld release words waited on by the stream\n", wt, n);
  if (strcmp(want, "none") == 0)
    ASSERT_EQ(wt, 0);
  else
    ASSERT_TRUE(wt >= 1 && wt <= n);
  ASSERT_OK(gpuipc_buf_release(buf));
  CU_OK(cuStreamDestroy, s);
  free(src);
  return 0;
}

static int receiver(gpuipc_channel_t *ch, long n, bool blocks, int rdev)
{
  CUstream s = cu_stream_on(rdev);
  uint8_t *dst = malloc(BYTES), *want = malloc(BYTES);
  ASSERT_TRUE(dst != NULL && want != NULL);
  gpuipc_buf_t *land = NULL;
  if (blocks)
    ASSERT_OK(gpuipc_buf_alloc(BYTES, GPUIPC_KIND_LEGACY, rdev, 0, &land));
  for (long i = 1; i <= n; i++) {
    memset(dst, 0, BYTES);
    test_fill(want, BYTES, (uint64_t)i);
    if (blocks) {
      /* The halves swapped: block 0 to the second, block 1 to the first. */
      gpuipc_block_t d[2] = {{land, BYTES / 2, BYTES / 2},
                             {land, 0, BYTES / 2}};
      ASSERT_OK(gpuipc_channel_recv_blocks(ch, d, 2, s, 30000));
      ASSERT_OK(gpuipc__memcpy_async(dst, gpuipc_buf_ptr(land), BYTES, rdev,
                                     s));
      uint8_t half[BYTES / 2];
      memcpy(half, want, BYTES / 2);
      memmove(want, want + BYTES / 2, BYTES / 2);
      memcpy(want + BYTES / 2, half, BYTES / 2);
    } else {
      gpuipc_tensor_t *v;
      ASSERT_OK(gpuipc_channel_recv(ch, &v, s, 30000));
      ASSERT_EQ(v->dl.shape[0], BYTES);
      ASSERT_OK(gpuipc__memcpy_async(
          dst, (const uint8_t *)v->dl.data + v->dl.byte_offset, BYTES, rdev,
          s));
      ASSERT_OK(gpuipc_tensor_release(v, s));
    }
    usleep(HOLD_MS * 1000);
    ASSERT_OK(gpuipc__stream_sync(rdev, s));
    for (size_t k = 0; k < BYTES; k++)
      if (dst[k] != want[k])
        TFAIL("message %ld: byte %zu is %u, not %u (read before the "
              "sender's copy, or after its next one)", i, k, dst[k],
              want[k]);
  }
  printf("recv on device %d: %ld %s, every byte\n", rdev, n,
         blocks ? "block batches" : "messages");
  if (land != NULL)
    ASSERT_OK(gpuipc_buf_release(land));
  CU_OK(cuStreamDestroy, s);
  free(dst);
  free(want);
  return 0;
}

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc != 7)
    TFAIL("usage: chan_away_peer send|recv DOMAIN CHANNEL ROUNDS "
          "tensor|blocks WAITS|RDEV");
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join(argv[2], NULL, &dom));
  gpuipc_channel_t *ch = cu_chan_open(dom, argv[3], false);
  long n = strtol(argv[4], NULL, 10);
  bool blocks = strcmp(argv[5], "blocks") == 0;
  int rc;
  if (strcmp(argv[1], "send") == 0)
    rc = sender(ch, n, blocks, argv[6]);
  else
    rc = receiver(ch, n, blocks, atoi(argv[6]));
  ASSERT_OK(gpuipc_channel_close(ch));
  ASSERT_OK(gpuipc_domain_leave(dom));
  return rc;
}
#else
int main(void)
{
  SKIP("built without the CUDA headers");
}
#endif
