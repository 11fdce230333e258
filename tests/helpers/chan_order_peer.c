/*
 * chan_order_peer: the two ends of tests/channel_gpu_order.c, the
 * scenarios of tests/channel_gpu.c (tests/helpers/chan_gpu.cu) against the
 * driver API, so that they run on the fake CUDA driver (GPUIPC_CUDA_LIB)
 * on every machine:
 *
 *   chan_order_peer send DOMAIN CHANNEL ROUNDS
 *   chan_order_peer recv DOMAIN CHANNEL ROUNDS [EXPECT]
 *
 * send-late and recv-late open the channel before starting CUDA (its
 * segment is mapped unregistered, as in a process that had no context
 * yet), then do the same.
 *
 * The "GPU writes" are copies queued on a created stream (cuMemcpyAsync
 * through gpuipc__cu): with FAKE_CUDA_COPY_LAG large they stay pending
 * until a synchronisation, or until the other process's stream waits on
 * an event recorded after them.
 *
 * Rounds come in threes, the first three with gpuipc_channel_recv_into,
 * the next three as views, and so on:
 *   - round A: the sender writes pattern r into its LEGACY buffer on its
 *     stream and sends at once, the write still pending; the receiver
 *     reads it on its stream (its copy of recv_into, or a copy of the view)
 *     and synchronises its stream at once: the read sees pattern r only if
 *     the stream waited for the sender's event (nothing else runs the
 *     sender's write before that read);
 *   - round B: as A, but the receiver does not synchronise: its read is
 *     still pending when
 *   - round C: the sender writes pattern r and synchronises its stream
 *     before sending (from an idle stream: no event at all). That reaches
 *     round B's read first only if the sender's stream waited for round
 *     B's release (gpuipc_channel_send_wait); otherwise round B's read
 *     sees round C's pattern. The receiver synchronises after receiving
 *     round C, and checks round B and C.
 *
 * EXPECT names how the receiver's copies (gpuipc_channel_recv_into) must
 * have released their messages, counted in the fake driver: "kernel"
 * (one launch of gpuipc's copy kernel each, no stream memory operation),
 * "after" (a copy above the kernel's size, and the word written by
 * gpuipc's own stream after an event on ours: one record and one write
 * each) or "stream" (a copy where no kernel can be launched, its word
 * written the same way). Releases of views write one word each in every
 * case, the same way. No word is ever written on our stream itself: the
 * words would hold up its next work.
 */
#include "test.h"

#include "cuda/cuda.h"

#include <stdbool.h>
#include <stdint.h>

#if GPUIPC_HAVE_CUDA

#include "helpers/cu_peer.h"

#define BYTES ((size_t)1 << 20)

/* Round @r's part in the scheme above, and whether it is a recv_into. */
enum round_kind { ROUND_A, ROUND_B, ROUND_C };
#define ROUND_KIND(r) ((enum round_kind)(((r) - 1) % 3))
#define ROUND_INTO(r) ((((r) - 1) / 3) % 2 == 0)

static void sender(gpuipc_channel_t *ch, CUstream s, int rounds)
{
  gpuipc_buf_t *buf;
  ASSERT_OK(gpuipc_buf_alloc(BYTES, GPUIPC_KIND_LEGACY, 0, 0, &buf));
  uint8_t *dev = gpuipc_buf_ptr(buf);
  uint8_t *src[2] = {malloc(BYTES), malloc(BYTES)};
  ASSERT_TRUE(src[0] != NULL && src[1] != NULL);
  int64_t shape[1];
  gpuipc_tensor_t t;
  cu_bytes_tensor(&t, shape, dev, BYTES, buf);
  uint64_t ticket = 0;
  for (int r = 1; r <= rounds; r++) {
    /* Two sources: the write of round r - 1 may still be pending. */
    uint8_t *from = src[r % 2];
    test_fill(from, BYTES, (uint64_t)r);
    CU_OK(cuMemcpyAsync, (CUdeviceptr)dev, (CUdeviceptr)from, BYTES, s);
    if (ROUND_KIND(r) == ROUND_C) /* an idle stream: no event */
      CU_OK(cuStreamSynchronize, s);
    ASSERT_OK(gpuipc_channel_send(ch, &t, s, 0, &ticket));
    /* The next round's write runs after the receiver is done. */
    ASSERT_OK(gpuipc_channel_send_wait(ch, ticket, s, 30000));
  }
  ASSERT_OK(gpuipc_channel_send_done(ch, ticket, 30000));
  CU_OK(cuStreamSynchronize, s);
  ASSERT_OK(gpuipc_buf_release(buf));
  free(src[0]);
  free(src[1]);
}

/* Queue round @r's read of what arrived into @host, on @s. */
static void recv_round(gpuipc_channel_t *ch, CUstream s, int r, void *dst,
                       uint8_t *host)
{
  if (ROUND_INTO(r)) {
    int64_t shape[1];
    gpuipc_tensor_t t;
    cu_bytes_tensor(&t, shape, dst, BYTES, NULL);
    ASSERT_OK(gpuipc_channel_recv_into(ch, &t, s, 30000));
    CU_OK(cuMemcpyAsync, (CUdeviceptr)host, (CUdeviceptr)dst, BYTES, s);
    return;
  }
  gpuipc_tensor_t *v;
  ASSERT_OK(gpuipc_channel_recv(ch, &v, s, 30000));
  ASSERT_EQ(v->dl.device.device_type, GPUIPC_DL_CUDA);
  ASSERT_EQ(v->dl.device.device_id, 0);
  ASSERT_EQ(v->dl.shape[0], (int64_t)BYTES);
  const uint8_t *p = (const uint8_t *)v->dl.data + v->dl.byte_offset;
  CU_OK(cuMemcpyAsync, (CUdeviceptr)host, (CUdeviceptr)p, BYTES, s);
  ASSERT_OK(gpuipc_tensor_release(v, s));
}

static void check_round(const uint8_t *host, int r)
{
  size_t bad = test_check(host, BYTES, (uint64_t)r);
  printf("recv round %d (%c, %s): %s\n", r, "ABC"[ROUND_KIND(r)],
         ROUND_INTO(r) ? "copy" : "view",
         bad == (size_t)-1 ? "pattern" : "WRONG");
  if (bad != (size_t)-1)
    TFAIL("round %d: byte %zu is %u, pattern says %u (%s)", r, bad, host[bad],
          test_pattern((uint64_t)r, bad),
          ROUND_KIND(r) == ROUND_B
              ? "the next round's write ran first: no release wait?"
              : "read before the sender's write: no wait on its event?");
}

/* Check how the @into copies and @views views were released (EXPECT). */
static void check_expect(const char *expect, int into, int views, int k0,
                         int w0, int r0, CUstream s)
{
  int k = cu_fake_count("fake_cuda_kernel_launches") - k0;
  int w = cu_fake_count("fake_cuda_word_writes") - w0;
  int r = cu_fake_count("fake_cuda_events_recorded") - r0;
  int on = ((int (*)(void *))cu_fake_fn("fake_cuda_word_writes_on"))(s);
  printf("recv (%s): %d kernel launches, %d word writes (%d on our stream), "
         "%d events recorded\n", expect, k, w, on, r);
  bool kernel = strcmp(expect, "kernel") == 0;
  bool after = strcmp(expect, "after") == 0;
  if (!kernel && !after && strcmp(expect, "stream") != 0)
    TFAIL("EXPECT %s: kernel, after or stream", expect);
  ASSERT_EQ(k, kernel ? into : 0);
  ASSERT_EQ(w, views + (kernel ? 0 : into));
  ASSERT_EQ(r, views + (kernel ? 0 : into));
  ASSERT_EQ(on, 0);
}

static void receiver(gpuipc_channel_t *ch, CUstream s, int rounds,
                     const char *expect)
{
  int k0 = 0, w0 = 0, r0 = 0; /* counted only on the fake (EXPECT) */
  if (expect != NULL) {
    k0 = cu_fake_count("fake_cuda_kernel_launches");
    w0 = cu_fake_count("fake_cuda_word_writes");
    r0 = cu_fake_count("fake_cuda_events_recorded");
  }
  gpuipc_buf_t *dbuf;
  ASSERT_OK(gpuipc_buf_alloc(BYTES, GPUIPC_KIND_LEGACY, 0, 0, &dbuf));
  uint8_t *host[2] = {malloc(BYTES), malloc(BYTES)};
  ASSERT_TRUE(host[0] != NULL && host[1] != NULL);
  for (int r = 1; r <= rounds; r++) {
    memset(host[r % 2], 0, BYTES);
    recv_round(ch, s, r, gpuipc_buf_ptr(dbuf), host[r % 2]);
    if (ROUND_KIND(r) == ROUND_B) /* round C checks its release */
      continue;
    CU_OK(cuStreamSynchronize, s);
    if (ROUND_KIND(r) == ROUND_C)
      check_round(host[(r - 1) % 2], r - 1);
    check_round(host[r % 2], r);
  }
  /* The sender's stream waits for the last release, whose work this
   * process does: stay until the sender has closed. */
  gpuipc_tensor_t *v;
  ASSERT_RC(gpuipc_channel_recv(ch, &v, s, 30000), GPUIPC_E_PEER_GONE);
  CU_OK(cuStreamSynchronize, s);
  if (expect != NULL)
    check_expect(expect, rounds / 2, rounds / 2, k0, w0, r0, s);
  ASSERT_OK(gpuipc_buf_release(dbuf));
  free(host[0]);
  free(host[1]);
}

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  if ((argc != 5 && argc != 6) || atoi(argv[4]) % 6 != 0)
    TFAIL("usage: chan_order_peer send|recv[-late] DOMAIN CHANNEL ROUNDS "
          "(6k) [EXPECT]");
  bool send = strncmp(argv[1], "send", 4) == 0;
  bool late = strstr(argv[1], "-late") != NULL;
  int rounds = atoi(argv[4]);
  CUstream s = late ? NULL : cu_stream_make();
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join(argv[2], NULL, &dom));
  gpuipc_channel_t *ch = cu_chan_open(dom, argv[3], !send && !late);
  if (late)
    s = cu_stream_make();
  if (send)
    sender(ch, s, rounds);
  else
    receiver(ch, s, rounds, argc == 6 ? argv[5] : NULL);
  ASSERT_OK(gpuipc_channel_close(ch));
  ASSERT_OK(gpuipc_domain_leave(dom));
  CU_OK(cuStreamDestroy, s);
  return 0;
}
#else
int main(void)
{
  SKIP("built without the CUDA headers");
}
#endif
