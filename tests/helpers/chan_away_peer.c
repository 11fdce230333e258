/*
 * One end of tests/channel_wait_across.c, on the fake CUDA driver:
 *
 *   chan_away_peer send DOMAIN CHANNEL ROUNDS WAITS
 *   chan_away_peer recv DOMAIN CHANNEL ROUNDS RDEV
 *
 * The sender fills a 4 KiB LEGACY buffer of device 0 with a copy it
 * leaves queued on a stream of device 0, sends it from that stream and
 * calls gpuipc_channel_send_wait on it, ROUNDS times. The receiver, on a
 * stream of device RDEV, receives each view, queues a copy of it out and
 * releases it on that stream (gpuipc's own stream writes the release
 * word once the copy is done), then sleeps HOLD_MS before it
 * synchronises its stream: only then does the release word land, and the
 * receiver checks every byte it copied.
 *
 * So the word lands HOLD_MS after the sender has taken in the release.
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

static int sender(gpuipc_channel_t *ch, long n, const char *want)
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
    ASSERT_OK(gpuipc_channel_send(ch, &t, s, 0, &ticket));
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

static int receiver(gpuipc_channel_t *ch, long n, int rdev)
{
  CUstream s = cu_stream_on(rdev);
  uint8_t *dst = malloc(BYTES);
  ASSERT_TRUE(dst != NULL);
  for (long i = 1; i <= n; i++) {
    gpuipc_tensor_t *v;
    ASSERT_OK(gpuipc_channel_recv(ch, &v, s, 30000));
    ASSERT_EQ(v->dl.shape[0], BYTES);
    memset(dst, 0, BYTES);
    ASSERT_OK(gpuipc__memcpy_async(
        dst, (const uint8_t *)v->dl.data + v->dl.byte_offset, BYTES, rdev,
        s));
    ASSERT_OK(gpuipc_tensor_release(v, s));
    usleep(HOLD_MS * 1000);
    ASSERT_OK(gpuipc__stream_sync(rdev, s));
    size_t bad = test_check(dst, BYTES, (uint64_t)i);
    if (bad != (size_t)-1)
      TFAIL("message %ld: byte %zu differs (read before the sender's copy, "
            "or after its next one)", i, bad);
  }
  printf("recv on device %d: %ld messages, every byte\n", rdev, n);
  CU_OK(cuStreamDestroy, s);
  free(dst);
  return 0;
}

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc != 6)
    TFAIL("usage: chan_away_peer send|recv DOMAIN CHANNEL ROUNDS "
          "WAITS|RDEV");
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join(argv[2], NULL, &dom));
  gpuipc_channel_t *ch = cu_chan_open(dom, argv[3], false);
  long n = strtol(argv[4], NULL, 10);
  int rc;
  if (strcmp(argv[1], "send") == 0)
    rc = sender(ch, n, argv[5]);
  else
    rc = receiver(ch, n, atoi(argv[5]));
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
