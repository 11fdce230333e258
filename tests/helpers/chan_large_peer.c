/*
 * The receiver of tests/channel_large.c: chan_large_peer DOMAIN GATEFD.
 *
 * Channel "large" (messages as tests/helpers/chan_large.h lists them):
 * receives messages 1 and 2 and holds both views (two large stages in
 * flight at once) until a byte arrives on GATEFD, then checks and releases
 * them; receives every other message, checks its size and every byte, and
 * releases it; after each, at most the slot buffer, LARGE_SLOTS large
 * stages and one not yet forgotten are mapped (the sender's freed stages
 * are forgotten here); after the last, exactly the slot buffer and the one
 * stage the sender keeps, and the process maps nothing else (the forgotten
 * ones were unmapped).
 * Channel "huge": a HUGE_VIEW-byte view, then a HUGE_INTO-byte message
 * taken with gpuipc_channel_recv_into; then only the stage of the second
 * is mapped (the first was forgotten after the sender's failed send).
 *
 * Exit 0 when everything checked out; 1 with a message otherwise.
 */
#include "helpers/chan_large.h"
#include "mem/mem.h"

#include <unistd.h>

static uint64_t live_bufs(void)
{
  struct gpuipc__cache_stats s;
  gpuipc__cache_stats(&s);
  return s.live;
}

static uint64_t mapped(gpuipc_channel_t *ch)
{
  gpuipc_channel_info_t info = {.size = sizeof(info)};
  ASSERT_OK(gpuipc_channel_info(ch, &info));
  return info.buffers_mapped;
}

/* Check view @v against message @i of @n bytes. */
static void view_check(const gpuipc_tensor_t *v, uint64_t i, size_t n)
{
  if (v->dl.ndim != 1 || v->dl.shape[0] != (int64_t)n ||
      v->dl.device.device_type != GPUIPC_DL_CPU)
    TFAIL("message %llu: ndim %d, %lld bytes (expected %zu), device type %d",
          (unsigned long long)i, v->dl.ndim, (long long)v->dl.shape[0], n,
          v->dl.device.device_type);
  const uint8_t *p = (const uint8_t *)v->dl.data + v->dl.byte_offset;
  size_t bad = large_check(p, n, i);
  if (bad != (size_t)-1)
    TFAIL("message %llu: byte %zu of %zu differs", (unsigned long long)i, bad,
          n);
}

static void recv_check(gpuipc_channel_t *ch, uint64_t i, size_t n)
{
  gpuipc_tensor_t *v;
  ASSERT_OK(gpuipc_channel_recv(ch, &v, NULL, 30000));
  view_check(v, i, n);
  ASSERT_OK(gpuipc_tensor_release(v, NULL));
}

static void large(gpuipc_domain_t *dom, int gate)
{
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, "large", NULL, &ch));
  uint64_t live0 = live_bufs();

  /* Two large messages in flight at once, each in a stage of its own. */
  gpuipc_tensor_t *v1, *v2;
  ASSERT_OK(gpuipc_channel_recv(ch, &v1, NULL, 30000));
  ASSERT_OK(gpuipc_channel_recv(ch, &v2, NULL, 30000));
  ASSERT_PTR_NE(v1->buf, v2->buf);
  char c;
  ASSERT_EQ(read(gate, &c, 1), 1);
  view_check(v1, 1, large_size(1));
  view_check(v2, 2, large_size(2));
  ASSERT_OK(gpuipc_tensor_release(v1, NULL));
  ASSERT_OK(gpuipc_tensor_release(v2, NULL));

  for (uint64_t i = 3; i <= LARGE_MSGS; i++) {
    recv_check(ch, i, large_size(i));
    uint64_t m = mapped(ch);
    if (m > 1 + LARGE_SLOTS + 1)
      TFAIL("after message %llu (%zu bytes): %llu buffers mapped, more than "
            "the slot buffer, %d large stages and one to forget",
            (unsigned long long)i, large_size(i), (unsigned long long)m,
            LARGE_SLOTS);
  }
  /* The slot buffer and the last stage; the rest unmapped for real. */
  ASSERT_EQ(mapped(ch), 2);
  ASSERT_EQ(live_bufs(), live0 + 2);
  ASSERT_OK(gpuipc_channel_close(ch));
}

static void huge(gpuipc_domain_t *dom)
{
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, "huge", NULL, &ch));
  uint64_t live0 = live_bufs();
  recv_check(ch, 1, HUGE_VIEW);

  uint8_t *dst = malloc(HUGE_INTO);
  ASSERT_TRUE(dst != NULL);
  memset(dst, 0, HUGE_INTO);
  int64_t shape[1];
  gpuipc_tensor_t t;
  large_tensor(&t, shape, dst, HUGE_INTO);
  ASSERT_OK(gpuipc_channel_recv_into(ch, &t, NULL, 30000));
  size_t bad = large_check(dst, HUGE_INTO, 2);
  if (bad != (size_t)-1)
    TFAIL("recv_into: byte %zu of %zu differs", bad, (size_t)HUGE_INTO);
  free(dst);
  /* The 256 MiB stage was forgotten with the second message. */
  ASSERT_EQ(mapped(ch), 1);
  ASSERT_EQ(live_bufs(), live0 + 1);
  ASSERT_OK(gpuipc_channel_close(ch));
}

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc != 3)
    TFAIL("usage: chan_large_peer DOMAIN GATEFD");
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join(argv[1], NULL, &dom));
  large(dom, (int)strtol(argv[2], NULL, 0));
  huge(dom);
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
