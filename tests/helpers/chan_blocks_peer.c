/*
 * chan_blocks_peer: the ends of tests/channel_blocks.c.
 *
 *   chan_blocks_peer send DOMAIN CHANNEL KIND BATCHES [- [BLK [DEV]]]
 *   chan_blocks_peer recv DOMAIN CHANNEL KIND BATCHES COPIES [BLK [DEV]]
 *   chan_blocks_peer lie DOMAIN CHANNEL CASE
 *
 * KIND: host (HOST buffers) or gpu (LEGACY buffers of device DEV, 0 unless
 * given: the fake CUDA driver's (GPUIPC_CUDA_LIB), or a real GPU's, and a
 * created stream there; the receiver takes every second batch on the
 * legacy default stream instead, which the batch call refuses and gpuipc
 * batches on a stream of its own); host-paged, gpu-paged: the same with
 * a paged cache's blocks, every block a whole slot of layer 0 (the list
 * travels in its slots form, and the destinations are slots too). BLK: the slot size, 4096 unless given (the
 * refusals, whose sentences name sizes, are checked at 4096 only).
 *
 * send: checks gpuipc_channel_send_blocks' refusals (nothing is sent),
 * then sends one staged 16-byte tensor (message 1) and BATCHES batches of
 * NBLK blocks on a channel of depth 2: batch b's block i (of size
 * blk_bytes(i)) lies in layer i % 2, at a slot of a fixed random
 * permutation of the layer's 2 * NBLK slots (batches alternate between
 * the two halves of the permutation), filled with pattern seed(b, i). A
 * half is rewritten only once the batch that used it is free
 * (gpuipc_channel_send_done): the release lets the sender reuse it. At
 * the end: BATCHES + 1 messages sent, four buffers introduced (the host
 * staging area, the list area and the two layers).
 *
 * recv: checks gpuipc_channel_recv_blocks' refusals (nothing taken), that
 * message 1 (a tensor) is refused by recv_blocks and stays, that batch 1
 * is refused by recv and recv_into and by recv_blocks with the wrong
 * count or a wrong size, and stays; then receives every batch into one
 * buffer, block i at slot pd[i] of another random permutation, and
 * checks every byte. COPIES (gpu): "kernel" (one launch of gpuipc's
 * block kernel per batch, counted by the fake), "batch" (the fake has no
 * launches: one cuMemcpyBatchAsync per batch), "loop" (neither: the
 * copies one by one) or "any" (a real driver: not counted).
 *
 * lie: sends message 1 (a tensor of a 64 KiB HOST buffer, key 1 at the
 * receiver), then writes a block list into that buffer at LIST_OFF and
 * injects a block batch descriptor for it that breaks rule CASE (see
 * lie_case); then waits for the receiver to close.
 */
#include "channel/channel.h"
#include "helpers/chan_lie.h"
#include "test.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if GPUIPC_HAVE_CUDA
#include "helpers/cu_peer.h"
#endif

#define NBLK 1024
#define BLK 4096
#define SLOTS (2 * NBLK)
#define LIST_OFF 4096

static bool gpu;
static bool paged; /* every block a slot of layer 0 */
static void *stream;
static uint64_t blk = BLK; /* a slot; BLK unless the command line says */
static int dev;            /* the GPU of kind gpu */
#define LAYER_BYTES ((size_t)SLOTS * blk)

/* Block i's size: a slot, or 7/8 or 3/4 of one (4096, 3584, 3072). */
static uint64_t blk_bytes(uint32_t i)
{
  if (paged)
    return blk;
  return blk - (i % 3) * (blk / 8);
}

static uint64_t seed(uint32_t b, uint32_t i)
{
  return (uint64_t)b * 100003u + i;
}

/* A fixed random permutation of 0..n-1 (@salt picks which). */
static void perm(uint32_t *p, uint32_t n, uint64_t salt)
{
  uint64_t x = 0x2545f4914f6cdd1dull ^ salt;
  for (uint32_t i = 0; i < n; i++)
    p[i] = i;
  for (uint32_t i = n - 1; i > 0; i--) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    uint32_t j = (uint32_t)(x % (i + 1));
    uint32_t t = p[i];
    p[i] = p[j];
    p[j] = t;
  }
}

static gpuipc_buf_t *alloc(size_t n)
{
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_buf_alloc(n, gpu ? GPUIPC_KIND_LEGACY : GPUIPC_KIND_HOST,
                             gpu ? dev : -1, 0, &b));
  return b;
}

static gpuipc_channel_t *chan_open(gpuipc_domain_t *dom, const char *name,
                                   uint32_t depth)
{
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.timeout_ms = 30000;
  o.depth = depth;
  if (gpu) {
    o.device = dev;
    o.device_set = 1;
  }
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, name, &o, &ch));
  return ch;
}

#if GPUIPC_HAVE_CUDA
/* A created, non-blocking stream of device @d; then no context is
 * current on this thread, as in a process that reaches the GPU through
 * gpuipc alone (gpuipc enters a context for each driver call of its
 * own: the block kernel's lists, registered with the driver, too). */
static void *stream_make(int d)
{
  ASSERT_OK(gpuipc_driver_status(NULL));
  CUcontext ctx;
  CU_OK(cuDevicePrimaryCtxRetain, &ctx, d);
  CU_OK(cuCtxSetCurrent, ctx);
  CUstream s;
  CU_OK(cuStreamCreate, &s, CU_STREAM_NON_BLOCKING);
  CU_OK(cuCtxSetCurrent, NULL);
  return s;
}
#endif

/* ----- send ----- */

static void send_refusals(gpuipc_channel_t *ch, gpuipc_buf_t *layer)
{
  gpuipc_block_t b[4];
  for (int i = 0; i < 4; i++)
    b[i] = (gpuipc_block_t){layer, (uint64_t)i * BLK, BLK};
  ASSERT_RC(gpuipc_channel_send_blocks(NULL, b, 4, NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("NULL channel");
  ASSERT_RC(gpuipc_channel_send_blocks(ch, NULL, 4, NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("NULL blocks");
  ASSERT_RC(gpuipc_channel_send_blocks(ch, b, 0, NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("0 blocks");
  ASSERT_RC(gpuipc_channel_send_blocks(ch, b, GPUIPC_CHANNEL_BLOCKS_MAX + 1,
                                       NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("16385 blocks");
  ASSERT_RC(gpuipc_channel_send_blocks(ch, b, 4, NULL, 0x10, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("flags 0x10");
  b[2].buf = NULL;
  ASSERT_RC(gpuipc_channel_send_blocks(ch, b, 4, NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("block 2 has a NULL buffer");
  b[2] = (gpuipc_block_t){layer, 0, 0};
  ASSERT_RC(gpuipc_channel_send_blocks(ch, b, 4, NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("block 2 is empty");
  b[2] = (gpuipc_block_t){layer, gpuipc_buf_size(layer) - 100, 101};
  ASSERT_RC(gpuipc_channel_send_blocks(ch, b, 4, NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("block 2 (offset");
  ASSERT_ERR_MENTIONS("reaches outside");
  b[2] = (gpuipc_block_t){layer, UINT64_MAX - 10, 100}; /* wraps to 89 */
  ASSERT_RC(gpuipc_channel_send_blocks(ch, b, 4, NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("reaches outside");
  /* A paged cache's batch with one whole slot past the end, and one far
   * past it: the one-pass check of such batches refuses them too. */
  uint64_t end = gpuipc_buf_size(layer) / BLK * BLK;
  b[2] = (gpuipc_block_t){layer, end, BLK};
  ASSERT_RC(gpuipc_channel_send_blocks(ch, b, 4, NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("block 2 (offset");
  ASSERT_ERR_MENTIONS("reaches outside");
  b[2] = (gpuipc_block_t){layer, (uint64_t)BLK << 40, BLK};
  ASSERT_RC(gpuipc_channel_send_blocks(ch, b, 4, NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("reaches outside");
  /* HOST and GPU memory in one batch. */
  gpuipc_buf_t *other;
  ASSERT_OK(gpuipc_buf_alloc(BLK, GPUIPC_KIND_HOST, -1, 0, &other));
  b[2] = (gpuipc_block_t){other, 0, BLK};
  if (gpu) {
    ASSERT_RC(gpuipc_channel_send_blocks(ch, b, 4, NULL, 0, NULL), -EINVAL);
    ASSERT_ERR_MENTIONS("block 2 lies in HOST memory");
  }
  gpuipc_buf_release(other);
  /* More buffers than a batch may name. */
  gpuipc_block_t many[GPUIPC_CHANNEL_BLOCK_BUFS_MAX + 1];
  gpuipc_buf_t *bufs[GPUIPC_CHANNEL_BLOCK_BUFS_MAX + 1];
  for (int i = 0; i <= GPUIPC_CHANNEL_BLOCK_BUFS_MAX; i++) {
    ASSERT_OK(gpuipc_buf_alloc(64, GPUIPC_KIND_HOST, -1, 0, &bufs[i]));
    many[i] = (gpuipc_block_t){bufs[i], 0, 64};
  }
  if (!gpu) {
    ASSERT_RC(gpuipc_channel_send_blocks(ch, many,
                                         GPUIPC_CHANNEL_BLOCK_BUFS_MAX + 1,
                                         NULL, 0, NULL), -EINVAL);
    ASSERT_ERR_MENTIONS("more than 128 buffers");
  }
  for (int i = 0; i <= GPUIPC_CHANNEL_BLOCK_BUFS_MAX; i++)
    gpuipc_buf_release(bufs[i]);
  gpuipc_channel_info_t info = {.size = sizeof(info)};
  ASSERT_OK(gpuipc_channel_info(ch, &info));
  ASSERT_EQ_U(info.sent, 0);
  ASSERT_EQ_U(info.buffers_sent, 0);
}

/* Write batch @b's blocks into the layers (slots of half b % 2). */
static void fill(gpuipc_buf_t *const *layer, const uint32_t *ps, uint32_t b,
                 gpuipc_block_t *blocks)
{
  uint8_t *tmp = malloc(blk);
  ASSERT_TRUE(tmp != NULL);
  for (uint32_t i = 0; i < NBLK; i++) {
    gpuipc_buf_t *l = layer[paged ? 0 : i % 2];
    uint64_t off = (uint64_t)ps[(b % 2) * NBLK + i] * blk;
    blocks[i] = (gpuipc_block_t){l, off, blk_bytes(i)};
    uint8_t *dst = (uint8_t *)gpuipc_buf_ptr(l) + off;
    test_fill(tmp, blk_bytes(i), seed(b, i));
    if (gpu)
      ASSERT_OK(gpuipc_memcpy(dst, tmp, blk_bytes(i), dev, stream));
    else
      memcpy(dst, tmp, blk_bytes(i));
  }
  free(tmp);
}

static void do_send(gpuipc_domain_t *dom, const char *name, uint32_t batches)
{
  gpuipc_channel_t *ch = chan_open(dom, name, 2);
  gpuipc_buf_t *layer[2] = {alloc(LAYER_BYTES), alloc(LAYER_BYTES)};
  if (blk == BLK) /* the sentences name BLK's sizes */
    send_refusals(ch, layer[0]);
  uint8_t small[16];
  test_fill(small, sizeof(small), 1);
  int64_t shape = sizeof(small);
  gpuipc_tensor_t t = {.dl = {.data = small,
                              .device = {GPUIPC_DL_CPU, 0},
                              .ndim = 1,
                              .dtype = {GPUIPC_DL_UINT, 8, 1},
                              .shape = &shape}};
  ASSERT_OK(gpuipc_channel_send(ch, &t, NULL, 0, NULL));
  uint32_t ps[SLOTS];
  perm(ps, SLOTS, 1);
  gpuipc_block_t *blocks = malloc(NBLK * sizeof(*blocks));
  uint64_t *tickets = calloc(batches + 1, sizeof(*tickets));
  ASSERT_TRUE(blocks != NULL && tickets != NULL);
  for (uint32_t b = 1; b <= batches; b++) {
    if (b > 2) /* its half is batch b - 2's: rewritten once that is free */
      ASSERT_OK(gpuipc_channel_send_done(ch, tickets[b - 2], 30000));
    fill(layer, ps, b, blocks);
    ASSERT_OK(gpuipc_channel_send_blocks(ch, blocks, NBLK, stream, 0,
                                         &tickets[b]));
    ASSERT_EQ_U(tickets[b], b + 1);
  }
  /* Messages come free in any order: each one is waited for. */
  for (uint32_t b = 1; b <= batches; b++)
    ASSERT_OK(gpuipc_channel_send_done(ch, tickets[b], 30000));
  gpuipc_channel_info_t info = {.size = sizeof(info)};
  ASSERT_OK(gpuipc_channel_info(ch, &info));
  ASSERT_EQ_U(info.sent, batches + 1);
  ASSERT_EQ_U(info.buffers_sent, paged ? 3 : 4);
  ASSERT_EQ_U(info.in_flight, 0);
  printf("sent %u batches of %d blocks: %llu messages, %llu buffers "
         "introduced\n", batches, NBLK, (unsigned long long)info.sent,
         (unsigned long long)info.buffers_sent);
  free(blocks);
  free(tickets);
  ASSERT_OK(gpuipc_channel_close(ch));
  gpuipc_buf_release(layer[0]);
  gpuipc_buf_release(layer[1]);
}

/* ----- recv ----- */

static void recv_refusals(gpuipc_channel_t *ch, gpuipc_buf_t *dstbuf)
{
  gpuipc_block_t d[4];
  for (int i = 0; i < 4; i++)
    d[i] = (gpuipc_block_t){dstbuf, (uint64_t)i * BLK, BLK};
  ASSERT_RC(gpuipc_channel_recv_blocks(NULL, d, 4, NULL, 0), -EINVAL);
  ASSERT_ERR_MENTIONS("NULL channel");
  ASSERT_RC(gpuipc_channel_recv_blocks(ch, NULL, 4, NULL, 0), -EINVAL);
  ASSERT_ERR_MENTIONS("NULL destination blocks");
  ASSERT_RC(gpuipc_channel_recv_blocks(ch, d, 0, NULL, 0), -EINVAL);
  ASSERT_ERR_MENTIONS("0 blocks");
  ASSERT_RC(gpuipc_channel_recv_blocks(ch, d, GPUIPC_CHANNEL_BLOCKS_MAX + 1,
                                       NULL, 0), -EINVAL);
  ASSERT_ERR_MENTIONS("16385 blocks");
  d[1].buf = NULL;
  ASSERT_RC(gpuipc_channel_recv_blocks(ch, d, 4, NULL, 0), -EINVAL);
  ASSERT_ERR_MENTIONS("destination block 1 has a NULL buffer");
  d[1] = (gpuipc_block_t){dstbuf, BLK, 0};
  ASSERT_RC(gpuipc_channel_recv_blocks(ch, d, 4, NULL, 0), -EINVAL);
  ASSERT_ERR_MENTIONS("destination block 1 is empty");
  d[1] = (gpuipc_block_t){dstbuf, LAYER_BYTES - 10, 11};
  ASSERT_RC(gpuipc_channel_recv_blocks(ch, d, 4, NULL, 0), -EINVAL);
  ASSERT_ERR_MENTIONS("destination block 1 (offset");
  d[1] = (gpuipc_block_t){dstbuf, UINT64_MAX - 1, 3};
  ASSERT_RC(gpuipc_channel_recv_blocks(ch, d, 4, NULL, 0), -EINVAL);
  ASSERT_ERR_MENTIONS("reaches outside");
  /* Overlaps: one byte shared, listed out of address order. */
  d[1] = (gpuipc_block_t){dstbuf, 3 * BLK + BLK - 1, 2};
  ASSERT_RC(gpuipc_channel_recv_blocks(ch, d, 4, NULL, 0), -EINVAL);
  ASSERT_ERR_MENTIONS("destination blocks 1 and 3 overlap");
  d[1] = d[3];
  ASSERT_RC(gpuipc_channel_recv_blocks(ch, d, 4, NULL, 0), -EINVAL);
  ASSERT_ERR_MENTIONS("destination blocks 1 and 3 overlap");
  /* The same slot twice among slots many words apart (the bitmap is then
   * cleared only where the blocks fall). */
  gpuipc_block_t far[3] = {{dstbuf, 0, blk / 4},
                           {dstbuf, LAYER_BYTES / 2, blk / 4},
                           {dstbuf, 0, blk / 4}};
  ASSERT_RC(gpuipc_channel_recv_blocks(ch, far, 3, NULL, 0), -EINVAL);
  ASSERT_ERR_MENTIONS("destination blocks 0 and 2 overlap");
  /* Adjacent is fine: only the bad timeout is left to refuse. */
  d[1] = (gpuipc_block_t){dstbuf, BLK, BLK};
  ASSERT_RC(gpuipc_channel_recv_blocks(ch, d, 4, NULL, -7), -EINVAL);
  ASSERT_ERR_MENTIONS("timeout_ms");
  if (gpu) {
    gpuipc_buf_t *h;
    ASSERT_OK(gpuipc_buf_alloc(BLK, GPUIPC_KIND_HOST, -1, 0, &h));
    d[2] = (gpuipc_block_t){h, 0, BLK};
    ASSERT_RC(gpuipc_channel_recv_blocks(ch, d, 4, NULL, 0), -EINVAL);
    ASSERT_ERR_MENTIONS("destination block 2 lies in HOST memory");
    gpuipc_buf_release(h);
  }
  gpuipc_channel_info_t info = {.size = sizeof(info)};
  ASSERT_OK(gpuipc_channel_info(ch, &info));
  ASSERT_EQ_U(info.received, 0);
}

static int counter(const char *name)
{
#if GPUIPC_HAVE_CUDA
  return gpu ? cu_fake_count(name) : 0;
#else
  (void)name;
  return 0;
#endif
}

/* Check batch @b in @dstbuf (block i at @dst[i]). */
static void check_batch(gpuipc_buf_t *dstbuf, const gpuipc_block_t *dst,
                        uint32_t b, uint8_t *host)
{
  const uint8_t *p = gpuipc_buf_ptr(dstbuf);
  if (gpu) {
    ASSERT_OK(gpuipc_memcpy(host, p, LAYER_BYTES, dev, stream));
    p = host;
  }
  for (uint32_t i = 0; i < NBLK; i++) {
    size_t bad = test_check(p + dst[i].offset, dst[i].bytes, seed(b, i));
    if (bad != (size_t)-1)
      TFAIL("batch %u block %u: byte %zu of %llu differs", b, i, bad,
            (unsigned long long)dst[i].bytes);
  }
}

/* The refusals that see the message (it stays first in line). */
static void recv_wrong(gpuipc_channel_t *ch, gpuipc_block_t *dst)
{
  gpuipc_tensor_t *v = NULL;
  ASSERT_RC(gpuipc_channel_recv(ch, &v, stream, 30000), -EINVAL);
  ASSERT_ERR_MENTIONS("message 2 is a block batch of 1024 blocks");
  uint8_t byte;
  int64_t one = 1;
  gpuipc_tensor_t into = {.dl = {.data = &byte,
                                 .device = {GPUIPC_DL_CPU, 0},
                                 .ndim = 1,
                                 .dtype = {GPUIPC_DL_UINT, 8, 1},
                                 .shape = &one}};
  ASSERT_RC(gpuipc_channel_recv_into(ch, &into, stream, 30000), -EINVAL);
  ASSERT_ERR_MENTIONS("receive it with gpuipc_channel_recv_blocks");
  ASSERT_RC(gpuipc_channel_recv_blocks(ch, dst, NBLK - 1, stream, 30000),
            -EINVAL);
  ASSERT_ERR_MENTIONS("holds 1024 blocks, not the 1023");
  char want[96];
  snprintf(want, sizeof(want), "block 5 of message 2 is %llu bytes, "
           "destination block 5 is %llu", (unsigned long long)blk_bytes(5),
           (unsigned long long)blk_bytes(5) - 1);
  dst[5].bytes--;
  ASSERT_RC(gpuipc_channel_recv_blocks(ch, dst, NBLK, stream, 30000),
            -EINVAL);
  ASSERT_ERR_MENTIONS(want);
  dst[5].bytes++;
  if (paged) { /* a paged cache's destinations, of another size */
    for (uint32_t i = 0; i < NBLK; i++)
      dst[i].bytes /= 2;
    ASSERT_RC(gpuipc_channel_recv_blocks(ch, dst, NBLK, stream, 30000),
              -EINVAL);
    snprintf(want, sizeof(want), "block 0 of message 2 is %llu bytes, "
             "destination block 0 is %llu", (unsigned long long)blk,
             (unsigned long long)blk / 2);
    ASSERT_ERR_MENTIONS(want);
    for (uint32_t i = 0; i < NBLK; i++)
      dst[i].bytes *= 2;
  }
}

static void do_recv(gpuipc_domain_t *dom, const char *name, uint32_t batches,
                    const char *copies)
{
  gpuipc_channel_t *ch = chan_open(dom, name, 0);
  gpuipc_buf_t *dstbuf = alloc(LAYER_BYTES);
  uint32_t pd[SLOTS];
  perm(pd, SLOTS, 2);
  gpuipc_block_t *dst = malloc(NBLK * sizeof(*dst));
  uint8_t *host = malloc(LAYER_BYTES);
  ASSERT_TRUE(dst != NULL && host != NULL);
  for (uint32_t i = 0; i < NBLK; i++)
    dst[i] = (gpuipc_block_t){dstbuf, (uint64_t)pd[i] * blk, blk_bytes(i)};
  if (blk == BLK)
    recv_refusals(ch, dstbuf);
  /* Message 1 is a tensor: refused, and still there for recv. */
  ASSERT_RC(gpuipc_channel_recv_blocks(ch, dst, NBLK, stream, 30000),
            -EINVAL);
  ASSERT_ERR_MENTIONS("message 1 is a tensor, not a block batch");
  gpuipc_tensor_t *v = NULL;
  ASSERT_OK(gpuipc_channel_recv(ch, &v, NULL, 30000));
  ASSERT_EQ_U(test_check((uint8_t *)v->dl.data + v->dl.byte_offset, 16, 1),
              (size_t)-1);
  ASSERT_OK(gpuipc_tensor_release(v, NULL));
  if (blk == BLK)
    recv_wrong(ch, dst);
  bool fake = strcmp(copies, "any") != 0;
  int batched0 = fake ? counter("fake_cuda_batch_copies") : 0;
  int launched0 = fake ? counter("fake_cuda_block_launches") : 0;
  int recorded0 = fake ? counter("fake_cuda_events_recorded") : 0;
  int written0 = fake ? counter("fake_cuda_word_writes") : 0;
  void *created = stream;
  for (uint32_t b = 1; b <= batches; b++) {
    /* Even batches on the legacy default stream, which the batch call
     * refuses: batched all the same, on a stream of gpuipc's own. */
    stream = gpu && b % 2 == 0 ? NULL : created;
    memset(host, 0, LAYER_BYTES);
    if (gpu)
      ASSERT_OK(gpuipc_memcpy(gpuipc_buf_ptr(dstbuf), host, LAYER_BYTES, dev,
                              stream));
    else
      memset(gpuipc_buf_ptr(dstbuf), 0, LAYER_BYTES);
    ASSERT_OK(gpuipc_channel_recv_blocks(ch, dst, NBLK, stream, 30000));
    check_batch(dstbuf, dst, b, host);
  }
  stream = created;
  int batched = fake ? counter("fake_cuda_batch_copies") - batched0 : -1;
  int launched = fake ? counter("fake_cuda_block_launches") - launched0 : -1;
  int recorded = fake ? counter("fake_cuda_events_recorded") - recorded0 : -1;
  int written = fake ? counter("fake_cuda_word_writes") - written0 : -1;
  gpuipc_channel_info_t info = {.size = sizeof(info)};
  ASSERT_OK(gpuipc_channel_info(ch, &info));
  ASSERT_EQ_U(info.received, batches + 1);
  ASSERT_EQ_U(info.buffers_imported, paged ? 3 : 4);
  if (strcmp(copies, "kernel") == 0) {
    ASSERT_EQ(launched, (int)batches);
    ASSERT_EQ(batched, 0);
    /* The kernel writes each batch's release word: no event, no stream
     * memory operation of gpuipc's for it. */
    ASSERT_EQ(recorded, 0);
    ASSERT_EQ(written, 0);
  } else if (strcmp(copies, "batch") == 0) {
    ASSERT_EQ(launched, 0);
    ASSERT_EQ(batched, (int)batches);
    ASSERT_EQ(written, (int)batches); /* after the copies, gpuipc's stream */
  } else if (strcmp(copies, "loop") == 0) {
    ASSERT_EQ(launched, 0);
    ASSERT_EQ(batched, 0);
    ASSERT_EQ(written, (int)batches);
  }
  printf("received %u batches of %d blocks of up to %llu bytes, every byte "
         "checked; %d block kernel launches, %d batched copy calls, %d "
         "events recorded, %d words written by streams (-1: not counted)\n",
         batches, NBLK, (unsigned long long)blk, launched, batched, recorded,
         written);
  free(dst);
  free(host);
  ASSERT_OK(gpuipc_channel_close(ch));
  gpuipc_buf_release(dstbuf);
}

/* ----- lie ----- */

static void lie_case(const char *c, struct gpuipc__desc *d, uint8_t *list,
                     size_t *len, uint64_t seq, uint64_t size)
{
  struct gpuipc__blist_buf bufs[2] = {{.key = 1, .size = size}};
  struct gpuipc__blist_block bl[2] = {{0, 0, 1024}, {0, 1024, 1024}};
  uint32_t nbufs = 1, nblocks = 2;
  uint64_t lseq = seq;
  if (strcmp(c, "outside") == 0) {
    bl[1].offset = size - 512;
  } else if (strcmp(c, "mapped") == 0) {
    bufs[0].size = 1 << 20; /* claims more than the buffer has */
    bl[1].offset = 100000;
  } else if (strcmp(c, "overflow") == 0) {
    bl[1].offset = UINT64_MAX - 10;
  } else if (strcmp(c, "key") == 0) {
    bufs[0].key = 77;
  } else if (strcmp(c, "index") == 0) {
    bl[1].buf = 3;
  } else if (strcmp(c, "empty") == 0) {
    bl[1].bytes = 0;
  } else if (strcmp(c, "seq") == 0) {
    lseq = seq + 1;
  } else if (strcmp(c, "dupkey") == 0) {
    bufs[1] = bufs[0];
    nbufs = 2;
  } else if (strcmp(c, "forgetown") == 0) {
    bufs[1] = (struct gpuipc__blist_buf){
        .key = 2, .size = size, .forget_key = 1,
        .flags = GPUIPC__BLIST_NEW | GPUIPC__BLIST_FORGET};
    nbufs = 2;
  } else if (strcmp(c, "nobufmsg") == 0) {
    bufs[1] = (struct gpuipc__blist_buf){.key = 2, .size = size,
                                         .flags = GPUIPC__BLIST_NEW};
    nbufs = 2;
  } else if (strcmp(c, "slot") == 0 || strcmp(c, "slotwrap") == 0 ||
             strcmp(c, "slotbufs") == 0) {
    /* The slots form: slot 1 of 1024-byte blocks, then one past the
     * buffer (or whose offset wraps 2^64); or two buffers. */
    bool wrap = strcmp(c, "slotwrap") == 0;
    uint64_t bytes = wrap ? (uint64_t)1 << 40 : 1024;
    uint32_t last = wrap ? 1u << 31 : (uint32_t)(size / 1024);
    if (wrap)
      bufs[0].size = (uint64_t)1 << 41; /* claimed: block 0 fits it */
    *len = gpuipc__blist_slots_bytes(nblocks);
    gpuipc__blist_put_slots_head(list, lseq, nblocks, bufs, bytes);
    gpuipc__blist_put_slot(list, 0, wrap ? 0 : 1);
    gpuipc__blist_put_slot(list, 1, last);
    if (strcmp(c, "slotbufs") == 0)
      list[16] = 2; /* nbufs 2 in the slots form */
    d->shape[0] = (int64_t)*len;
    return;
  } else if (strcmp(c, "shape") != 0 && strcmp(c, "count") != 0) {
    TFAIL("unknown case %s", c);
  }
  *len = gpuipc__blist_bytes(nbufs, nblocks);
  gpuipc__blist_put_head(list, lseq, nbufs, nblocks, bufs);
  for (uint32_t i = 0; i < nblocks; i++)
    gpuipc__blist_put_block(list, nbufs, i, &bl[i]);
  if (strcmp(c, "count") == 0)
    list[20] = 3; /* nblocks 3, with the length of 2 */
  d->shape[0] = (int64_t)*len;
  if (strcmp(c, "shape") == 0)
    d->dtype = (gpuipc_dl_dtype_t){GPUIPC_DL_INT, 32, 1};
}

static void do_lie(gpuipc_domain_t *dom, const char *name, const char *c)
{
  gpuipc_channel_t *ch = chan_open(dom, name, 0);
  gpuipc_buf_t *buf;
  ASSERT_OK(gpuipc_buf_alloc(65536, GPUIPC_KIND_HOST, -1, 0, &buf));
  uint8_t *p = gpuipc_buf_ptr(buf);
  chan_lie_first(ch, buf); /* its bytes lie below LIST_OFF */
  struct gpuipc__desc d;
  memset(&d, 0, sizeof(d));
  d.type = GPUIPC__DESC_BLOCKS;
  d.seq = gpuipc__chan_next_seq(ch);
  d.slot = 1;
  d.buf_key = 1;
  d.buf_size = gpuipc_buf_size(buf);
  d.offset = LIST_OFF;
  d.dtype = (gpuipc_dl_dtype_t){GPUIPC_DL_UINT, 8, 1};
  d.ndim = 1;
  d.strides[0] = 1;
  size_t len;
  lie_case(c, &d, p + LIST_OFF, &len, d.seq, gpuipc_buf_size(buf));
  uint8_t bytes[GPUIPC__CHAN_DESC_BYTES];
  int n = gpuipc__desc_encode(&d, bytes, sizeof(bytes));
  ASSERT_GT(n, 0);
  ASSERT_OK(gpuipc__chan_inject(ch, bytes, (size_t)n, NULL, 0, -1));
  chan_lie_until_closed(ch);
  gpuipc_buf_release(buf);
}

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc < 5)
    TFAIL("usage: chan_blocks_peer send|recv|lie DOMAIN CHANNEL ...");
  const char *mode = argv[1];
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join(argv[2], NULL, &dom));
  if (strcmp(mode, "lie") == 0) {
    do_lie(dom, argv[3], argv[4]);
  } else {
    gpu = strncmp(argv[4], "gpu", 3) == 0;
    paged = strstr(argv[4], "-paged") != NULL;
    if (argc > 7)
      blk = strtoull(argv[7], NULL, 10);
    if (argc > 8)
      dev = atoi(argv[8]);
    if (gpu) {
#if GPUIPC_HAVE_CUDA
      stream = stream_make(dev);
#else
      TFAIL("gpu: built without CUDA");
#endif
    }
    uint32_t batches = (uint32_t)atoi(argv[5]);
    if (strcmp(mode, "send") == 0)
      do_send(dom, argv[3], batches);
    else
      do_recv(dom, argv[3], batches, argc > 6 ? argv[6] : "host");
  }
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
