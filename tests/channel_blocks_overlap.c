/*
 * gpuipc_channel_recv_blocks' overlap check of a paged cache's destination
 * blocks (src/channel/blocks.c): a bitmap of the cache's slots that the
 * channel keeps from call to call, all zero between calls. On an empty
 * channel with timeout 0 every call checks and then says -EAGAIN, so the
 * answers show what the bitmap held: a repeated slot is named (the first
 * two blocks that share it) and leaves nothing behind for the next call;
 * blocks that stop being a paged cache's half-way leave nothing either;
 * a larger cache grows the bitmap; and a second caller, while the kept
 * bitmap is taken, checks with one of its own.
 */
#include "channel/channel.h"
#include "test.h"

#include <pthread.h>
#include <stdlib.h>

#define BS 4096

/* recv_blocks of slots @slots (@n of them, block size BS; a slot of -1 is
 * a block of BS / 2 bytes at 0) of @buf, on empty channel @rx. */
static int check(gpuipc_channel_t *rx, gpuipc_buf_t *buf, const long *slots,
                 size_t n)
{
  gpuipc_block_t d[16];
  ASSERT_LE(n, 16);
  for (size_t i = 0; i < n; i++)
    d[i] = slots[i] < 0 ? (gpuipc_block_t){buf, 0, BS / 2}
                        : (gpuipc_block_t){buf, (uint64_t)slots[i] * BS, BS};
  return gpuipc_channel_recv_blocks(rx, d, n, NULL, 0);
}

#define EMPTY(...)                                                             \
  do {                                                                         \
    static const long s_[] = {__VA_ARGS__};                                    \
    ASSERT_RC(check(rx, buf, s_, sizeof(s_) / sizeof(s_[0])), -EAGAIN);        \
  } while (0)
#define OVERLAP(mention, ...)                                                  \
  do {                                                                         \
    static const long s_[] = {__VA_ARGS__};                                    \
    ASSERT_RC(check(rx, buf, s_, sizeof(s_) / sizeof(s_[0])), -EINVAL);        \
    ASSERT_ERR_MENTIONS(mention);                                              \
  } while (0)

int main(void)
{
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("chan-overlap", NULL, &dom));
  gpuipc_channel_opts_t opts = GPUIPC_CHANNEL_OPTS_INIT;
  opts.timeout_ms = 30000;
  gpuipc_channel_t *rx, *tx;
  test_chan_pair(dom, "overlap", &opts, &opts, &rx, &tx);

  gpuipc_buf_t *buf, *small;
  ASSERT_OK(gpuipc_buf_alloc(256 * BS, GPUIPC_KIND_HOST, -1, 0, &small));
  ASSERT_OK(gpuipc_buf_alloc(1 << 30, GPUIPC_KIND_HOST, -1, 0, &buf));
  gpuipc_buf_t *big = buf;

  buf = small;
  EMPTY(5, 9, 7, 255);
  OVERLAP("destination blocks 0 and 2 overlap", 5, 9, 5);
  OVERLAP("destination blocks 1 and 3 overlap", 1, 2, 3, 2, 1);
  /* Nothing of those is left: the same slots, each once. */
  EMPTY(9, 5, 7, 1, 2, 3);
  /* Not a paged cache's past block 2 (a half block at 0): sorted instead,
   * and the slots set before the break are cleared. */
  EMPTY(9, 5, -1);
  OVERLAP("destination blocks 1 and 2 overlap", 9, -1, 0);
  EMPTY(9, 5, 0);

  /* A cache of 262,144 slots: the bitmap grows, and a slot past the small
   * one's is seen. */
  buf = big;
  EMPTY(262143, 5, 100000, 255, 256);
  OVERLAP("destination blocks 2 and 4 overlap", 262143, 5, 100000, 7,
          100000);
  EMPTY(100000, 262143, 5);
  buf = small;
  EMPTY(5, 9, 7, 255);

  /* Another thread holds the kept bitmap: this call takes its own. */
  struct gpuipc_channel *c = rx;
  ASSERT_EQ(pthread_mutex_lock(&c->rx.seen_lock), 0);
  OVERLAP("destination blocks 0 and 1 overlap", 3, 3);
  EMPTY(3, 4);
  ASSERT_EQ(pthread_mutex_unlock(&c->rx.seen_lock), 0);
  EMPTY(3, 4, 5, 6);
  /* The kept bitmap is all zero after all of it. */
  for (size_t w = 0; w < c->rx.seen_words; w++)
    if (c->rx.seen[w] != 0)
      TFAIL("word %zu of the kept bitmap is %llx", w,
            (unsigned long long)c->rx.seen[w]);
  ASSERT_EQ_U(c->rx.seen_words, 262144 / 64);

  ASSERT_OK(gpuipc_channel_close(tx));
  ASSERT_OK(gpuipc_channel_close(rx));
  ASSERT_OK(gpuipc_buf_release(small));
  ASSERT_OK(gpuipc_buf_release(big));
  ASSERT_OK(gpuipc_domain_leave(dom));
  printf("ok\n");
  return 0;
}
