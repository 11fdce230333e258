/*
 * chan_hold_peer: the two ends of tests/channel_hold.c and
 * tests/channel_hold_gpu.c, a receiver that holds one view while the
 * sender goes on:
 *
 *   chan_hold_peer send DOMAIN CHANNEL MODE N HOLD GATEFD
 *   chan_hold_peer recv DOMAIN CHANNEL MODE N HOLD GATEFD
 *
 * The sender (depth HOLD_DEPTH, HOLD_STAGES staging slots and large
 * stages: fewer, so that a staged send waits for a staging slot, not for
 * room in the depth) sends N messages, then HOLD_DEPTH more;
 * the receiver checks each against message i (contiguous layouts, every
 * byte), keeps the view of message HOLD and releases every other one at
 * once. Once the first N are in, it checks the held view's bytes again:
 * no later send may have reused the memory it shows. The sender, after
 * its N sends (none may time out: the held message costs one record
 * slot, and one staging slot or large stage, not the channel), waits
 * until each message but HOLD is free, checks that HOLD is not, that
 * gpuipc_channel_info counts one message in flight and names HOLD as the
 * oldest, and writes a byte on GATEFD. The receiver then checks the held
 * view once more and releases it; the sender sees it free, nothing in
 * flight, and sends the last HOLD_DEPTH through.
 *
 * MODE says what the sender sends:
 *   zero         views of a HOST buffer of its own (zero-copy), each
 *                region rewritten only once its last message is free
 *   staged       host memory gpuipc did not allocate: copied into the
 *                HOST staging slots (HOLD_STAGES of them)
 *   large        as staged, with 256-byte slots: the larger messages go
 *                in large stages (HOLD 3 is one of them)
 *   cuda-zero    views of a LEGACY buffer of device 0 (fake CUDA driver),
 *                written on a stream
 *   cuda-staged  device memory gpuipc did not allocate (cuMemAlloc),
 *                staged through device 0's staging slots on a stream
 *                (VMM memory, or HOST memory on a device without VMM)
 * The cuda modes receive on a stream and release on it with work queued
 * (a release word or event of the message's slot).
 *
 * Exit 0 when everything checked out; 1 with a message otherwise.
 */
#include "helpers/chan_common.h"

#include "cuda/cuda.h"

#include <stdbool.h>
#include <unistd.h>

#if GPUIPC_HAVE_CUDA
#include "helpers/cu_peer.h"
#endif

#define HOLD_DEPTH 8
#define HOLD_STAGES 4
#define REGIONS 8 /* zero: message HOLD in region 0, the others in 1.. */

struct hold {
  const char *mode;
  bool cuda, staged;
  long n, hold;
  int gate;
  gpuipc_channel_t *ch;
  void *stream;
};

#if GPUIPC_HAVE_CUDA
static void *cu_stream(void)
{
  return (void *)cu_stream_make();
}

static void cu_sync(void *s)
{
  CU_OK(cuStreamSynchronize, (CUstream)s);
}

static void cu_put(void *dev, const void *host, size_t n, void *s)
{
  CU_OK(cuMemcpyAsync, (CUdeviceptr)dev, (CUdeviceptr)host, n, (CUstream)s);
}

static void *cu_alloc(size_t n)
{
  CUdeviceptr p;
  CU_OK(cuMemAlloc, &p, n);
  return (void *)p;
}
#else
static void *cu_stream(void)
{
  SKIP("built without the CUDA headers");
  return NULL;
}
static void cu_sync(void *s) { (void)s; }
static void cu_put(void *dev, const void *host, size_t n, void *s)
{
  (void)dev, (void)host, (void)n, (void)s;
}
static void *cu_alloc(size_t n)
{
  (void)n;
  return NULL;
}
#endif

static gpuipc_channel_info_t info_of(gpuipc_channel_t *ch)
{
  gpuipc_channel_info_t in = {.size = sizeof(in)};
  ASSERT_OK(gpuipc_channel_info(ch, &in));
  return in;
}

/* Where message @i is written: its own place in the staged modes (the
 * cuda copies read it later), a region of the buffer in the zero modes,
 * rewritten only once the message that last used it is free. */
static void *msg_place(struct hold *h, uint8_t *base, uint64_t *last,
                       long i)
{
  if (h->staged)
    return base + (size_t)i * CHAN_SLOT;
  int r = i == h->hold ? 0 : 1 + (int)(i % REGIONS);
  if (last[r] != 0)
    ASSERT_OK(gpuipc_channel_send_done(h->ch, last[r], 30000));
  last[r] = (uint64_t)i;
  return base + (size_t)r * CHAN_SLOT;
}

/* Message @i as a tensor @t (@host: where its bytes are made). */
static void msg_tensor(struct hold *h, gpuipc_buf_t *buf, uint8_t *dev,
                       uint8_t *host, uint64_t *last, long i,
                       struct chan_msg *m, gpuipc_tensor_t *t)
{
  if (!h->cuda) {
    void *p = msg_place(h, h->staged ? host : dev, last, i);
    chan_msg_make((uint64_t)i, 1, p, buf, m, t);
    return;
  }
  uint8_t *src = host + (size_t)i * CHAN_SLOT;
  chan_msg_make((uint64_t)i, 1, src, buf, m, t);
  void *p = msg_place(h, dev, last, i);
  cu_put(p, src, m->span, h->stream); /* pending: the send follows it */
  t->dl.data = p;
  t->dl.device.device_type = GPUIPC_DL_CUDA;
  t->dl.device.device_id = 0;
}

/* After the N: HOLD alone in flight until the receiver lets it go. */
static void send_check_held(struct hold *h)
{
  for (long i = 1; i <= h->n; i++)
    if (i != h->hold)
      ASSERT_OK(gpuipc_channel_send_done(h->ch, (uint64_t)i, 30000));
  ASSERT_RC(gpuipc_channel_send_done(h->ch, (uint64_t)h->hold, 0), -EAGAIN);
  gpuipc_channel_info_t in = info_of(h->ch);
  ASSERT_EQ_U(in.sent, (uint64_t)h->n);
  ASSERT_EQ_U(in.in_flight, 1);
  ASSERT_EQ_U(in.oldest_in_flight, (uint64_t)h->hold);
  ASSERT_EQ(write(h->gate, "g", 1), 1);
  ASSERT_OK(gpuipc_channel_send_done(h->ch, (uint64_t)h->hold, 30000));
  in = info_of(h->ch);
  ASSERT_EQ_U(in.in_flight, 0);
  ASSERT_EQ_U(in.oldest_in_flight, 0);
}

static void sender(struct hold *h)
{
  long total = h->n + HOLD_DEPTH;
  size_t bytes = (size_t)(total + 1) * CHAN_SLOT;
  gpuipc_buf_t *buf = NULL;
  uint8_t *dev = NULL, *host = malloc(bytes);
  ASSERT_TRUE(host != NULL);
  if (!h->staged) {
    ASSERT_OK(gpuipc_buf_alloc((REGIONS + 1) * CHAN_SLOT,
                               h->cuda ? GPUIPC_KIND_LEGACY : GPUIPC_KIND_HOST,
                               h->cuda ? 0 : -1, 0, &buf));
    dev = gpuipc_buf_ptr(buf);
  } else if (h->cuda) {
    dev = cu_alloc(bytes);
  }
  uint64_t last[REGIONS + 1] = {0};
  for (long i = 1; i <= total; i++) {
    if (i == h->n + 1)
      send_check_held(h);
    struct chan_msg m;
    gpuipc_tensor_t t;
    msg_tensor(h, buf, dev, host, last, i, &m, &t);
    uint64_t ticket = 0;
    int rc = gpuipc_channel_send(h->ch, &t, h->stream, 0, &ticket);
    if (rc != 0)
      TFAIL("%s: send of message %ld (view %ld held): %s (%s)", h->mode, i,
            h->hold, gpuipc_strerror(rc), gpuipc_last_error());
    ASSERT_EQ_U(ticket, (uint64_t)i);
    ASSERT_LE(info_of(h->ch).in_flight, HOLD_DEPTH);
  }
  ASSERT_OK(gpuipc_channel_send_done(h->ch, (uint64_t)total, 30000));
  if (h->cuda)
    cu_sync(h->stream);
  if (buf != NULL)
    ASSERT_OK(gpuipc_buf_release(buf));
  free(host);
  printf("%s: %ld messages through depth %d, message %ld held the while\n",
         h->mode, total, HOLD_DEPTH, h->hold);
}

/* Check view @v of message @i (read on the host: the cuda modes only on
 * the fake driver, after its stream is synchronised). */
static void recv_check(struct hold *h, const gpuipc_tensor_t *v, long i,
                       const char *when)
{
  if (h->cuda)
    cu_sync(h->stream);
  /* A staging area of device 0 is VMM memory, or HOST memory where the
   * device has no VMM (the fake). */
  int want = h->cuda ? GPUIPC_DL_CUDA : GPUIPC_DL_CPU;
  if (h->cuda && h->staged && v->dl.device.device_type == GPUIPC_DL_CPU)
    want = GPUIPC_DL_CPU;
  const char *why = chan_msg_check_on((uint64_t)i, 1, v, want);
  if (why != NULL)
    TFAIL("%s: %s (%s)", h->mode, why, when);
}

/* Release @v; in the cuda modes with work of ours on it still queued, so
 * that the release goes after it (a word, or an event). */
static void recv_release(struct hold *h, gpuipc_tensor_t *v, uint8_t *scratch)
{
  if (h->cuda && v->dl.device.device_type == GPUIPC_DL_CUDA) {
    const uint8_t *p = (const uint8_t *)v->dl.data + v->dl.byte_offset;
    cu_put(scratch, p, CHAN_SLOT / 4, h->stream);
  }
  ASSERT_OK(gpuipc_tensor_release(v, h->stream));
}

static void receiver(struct hold *h)
{
  uint8_t *scratch = h->cuda ? cu_alloc(CHAN_SLOT) : NULL;
  gpuipc_tensor_t *held = NULL;
  for (long i = 1; i <= h->n + HOLD_DEPTH; i++) {
    if (i == h->n + 1) {
      recv_check(h, held, h->hold, "after every later send");
      char c;
      ASSERT_EQ(read(h->gate, &c, 1), 1);
      recv_check(h, held, h->hold, "before its release");
      gpuipc_channel_info_t in = info_of(h->ch);
      ASSERT_EQ_U(in.views, 1);
      recv_release(h, held, scratch);
    }
    gpuipc_tensor_t *v;
    ASSERT_OK(gpuipc_channel_recv(h->ch, &v, h->stream, 30000));
    recv_check(h, v, i, "received");
    if (i == h->hold)
      held = v;
    else
      recv_release(h, v, scratch);
  }
  if (h->cuda) {
    cu_sync(h->stream);
#if GPUIPC_HAVE_CUDA
    printf("%s: the fake wrote %d release words, recorded %d events\n",
           h->mode, cu_fake_count("fake_cuda_word_writes"),
           cu_fake_count("fake_cuda_events_recorded"));
#endif
  }
  /* Stay until the sender has seen the last release (its close). */
  gpuipc_tensor_t *v;
  ASSERT_RC(gpuipc_channel_recv(h->ch, &v, h->stream, 30000),
            GPUIPC_E_PEER_GONE);
}

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc != 8)
    TFAIL("usage: chan_hold_peer send|recv DOMAIN CHANNEL MODE N HOLD "
          "GATEFD");
  struct hold h = {.mode = argv[4], .n = chan_arg(argv[5]),
                   .hold = chan_arg(argv[6]), .gate = (int)chan_arg(argv[7])};
  bool send = strcmp(argv[1], "send") == 0;
  h.cuda = strncmp(h.mode, "cuda-", 5) == 0;
  h.staged = strcmp(h.mode, "staged") == 0 || strcmp(h.mode, "large") == 0 ||
             strcmp(h.mode, "cuda-staged") == 0;
  if (h.hold < 1 || h.hold > h.n)
    TFAIL("HOLD %ld is not one of the N messages", h.hold);
  if (h.cuda)
    h.stream = cu_stream();
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join(argv[2], NULL, &dom));
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.timeout_ms = 30000;
  if (send) {
    o.depth = HOLD_DEPTH;
    o.stage_slots = HOLD_STAGES;
    /* Not a timing threshold: a send that waits for the held view
     * waits for ever. */
    o.send_timeout_ms = 10000;
    if (strcmp(h.mode, "large") == 0)
      o.stage_slot_bytes = 256;
  } else if (h.cuda) {
    o.device = 0;
    o.device_set = 1;
  }
  ASSERT_OK(gpuipc_channel_open(dom, argv[3], &o, &h.ch));
  if (send)
    sender(&h);
  else
    receiver(&h);
  ASSERT_OK(gpuipc_channel_close(h.ch));
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
