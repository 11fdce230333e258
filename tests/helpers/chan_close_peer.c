/*
 * chan_close_peer: the two ends of tests/channel_close_events.c, on the
 * fake CUDA driver (GPUIPC_CUDA_LIB), which fails any use of an event
 * after its exporter destroyed it and counts such uses:
 *
 *   chan_close_peer send|recv DOMAIN FLAGDIR
 *
 * Channel "first" — the sender closes first: it writes three 64 KiB
 * LEGACY buffers on its stream (copies still pending), sends each (an
 * event each), closes the channel at once and says so (FLAGDIR/sent).
 * Only then does the receiver take the three messages, as views and with
 * recv_into, and check every byte; the next recv says GPUIPC_E_PEER_GONE.
 *
 * Channel "second" — the receiver closes first: it reads the one message
 * on its stream (pending), releases it there (a release event), closes
 * the channel at once, checks the bytes it read and says so
 * (FLAGDIR/released). Only then does the sender ask whether the message is
 * free and make its stream wait for the release.
 *
 * Each end ends with no use of a destroyed event (the fake's count) and
 * waits for the other's last word (FLAGDIR/done-*) before it lets its
 * memory go.
 */
#include "test.h"

#include "cuda/cuda.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#if GPUIPC_HAVE_CUDA

#include "helpers/cu_peer.h"

#define BYTES ((size_t)64 << 10)
#define MSGS 3

static const char *flagdir;

static void flag_set(const char *name)
{
  char p[4096];
  snprintf(p, sizeof(p), "%s/%s", flagdir, name);
  FILE *f = fopen(p, "w");
  ASSERT_TRUE(f != NULL);
  fclose(f);
}

static void flag_wait(const char *name)
{
  char p[4096];
  snprintf(p, sizeof(p), "%s/%s", flagdir, name);
  struct stat st;
  for (int i = 0; stat(p, &st) != 0; i++) {
    if (i == 6000)
      TFAIL("%s never came", name);
    usleep(10000);
  }
}

/* Write pattern @seed into @dev on @s (pending). */
static void write_async(void *dev, uint8_t *host, uint64_t seed, CUstream s)
{
  test_fill(host, BYTES, seed);
  CU_OK(cuMemcpyAsync, (CUdeviceptr)dev, (CUdeviceptr)host, BYTES, s);
}

static void expect(const uint8_t *host, uint64_t seed, const char *what)
{
  size_t bad = test_check(host, BYTES, seed);
  if (bad != (size_t)-1)
    TFAIL("%s: byte %zu is %u, pattern %llu says %u", what, bad, host[bad],
          (unsigned long long)seed, test_pattern(seed, bad));
}

static void sender(gpuipc_domain_t *dom, CUstream s)
{
  gpuipc_buf_t *buf[MSGS + 1];
  uint8_t *host[MSGS + 1];
  int64_t shape[1];
  gpuipc_tensor_t t;
  for (int i = 0; i <= MSGS; i++) {
    ASSERT_OK(gpuipc_buf_alloc(BYTES, GPUIPC_KIND_LEGACY, 0, 0, &buf[i]));
    host[i] = malloc(BYTES);
    ASSERT_TRUE(host[i] != NULL);
  }
  gpuipc_channel_t *ch = cu_chan_open(dom, "first", true);
  for (int i = 0; i < MSGS; i++) {
    write_async(gpuipc_buf_ptr(buf[i]), host[i], (uint64_t)i + 1, s);
    cu_bytes_tensor(&t, shape, gpuipc_buf_ptr(buf[i]), BYTES, buf[i]);
    ASSERT_OK(gpuipc_channel_send(ch, &t, s, 0, NULL));
  }
  ASSERT_OK(gpuipc_channel_close(ch)); /* its events: complete, then gone */
  flag_set("sent");

  ch = cu_chan_open(dom, "second", true);
  write_async(gpuipc_buf_ptr(buf[MSGS]), host[MSGS], 99, s);
  CU_OK(cuStreamSynchronize, s);
  cu_bytes_tensor(&t, shape, gpuipc_buf_ptr(buf[MSGS]), BYTES, buf[MSGS]);
  uint64_t ticket;
  ASSERT_OK(gpuipc_channel_send(ch, &t, s, 0, &ticket));
  flag_wait("released");
  ASSERT_OK(gpuipc_channel_send_done(ch, ticket, 30000));
  ASSERT_OK(gpuipc_channel_send_wait(ch, ticket, s, 30000));
  CU_OK(cuStreamSynchronize, s);
  ASSERT_OK(gpuipc_channel_close(ch));
  ASSERT_EQ(cu_fake_count("fake_cuda_dead_event_uses"), 0);
  printf("send: both channels closed, no destroyed event used\n");
  flag_set("done-send");
  flag_wait("done-recv");
  for (int i = 0; i <= MSGS; i++) {
    ASSERT_OK(gpuipc_buf_release(buf[i]));
    free(host[i]);
  }
}

static void receiver(gpuipc_domain_t *dom, CUstream s)
{
  gpuipc_buf_t *dbuf;
  ASSERT_OK(gpuipc_buf_alloc(BYTES, GPUIPC_KIND_LEGACY, 0, 0, &dbuf));
  uint8_t *host = malloc(BYTES);
  ASSERT_TRUE(host != NULL);
  int64_t shape[1];
  gpuipc_tensor_t t, *v;

  gpuipc_channel_t *ch = cu_chan_open(dom, "first", true);
  flag_wait("sent"); /* the sender has closed: its events are gone */
  for (int i = 0; i < MSGS; i++) {
    memset(host, 0, BYTES);
    if (i == 1) {
      cu_bytes_tensor(&t, shape, gpuipc_buf_ptr(dbuf), BYTES, NULL);
      ASSERT_OK(gpuipc_channel_recv_into(ch, &t, s, 30000));
      CU_OK(cuMemcpyAsync, (CUdeviceptr)host, (CUdeviceptr)gpuipc_buf_ptr(dbuf),
            BYTES, s);
    } else {
      ASSERT_OK(gpuipc_channel_recv(ch, &v, s, 30000));
      const uint8_t *p = (const uint8_t *)v->dl.data + v->dl.byte_offset;
      CU_OK(cuMemcpyAsync, (CUdeviceptr)host, (CUdeviceptr)p, BYTES, s);
      CU_OK(cuStreamSynchronize, s);
      ASSERT_OK(gpuipc_tensor_release(v, s));
    }
    CU_OK(cuStreamSynchronize, s);
    expect(host, (uint64_t)i + 1, i == 1 ? "recv_into" : "view");
  }
  ASSERT_RC(gpuipc_channel_recv(ch, &v, s, 30000), GPUIPC_E_PEER_GONE);
  ASSERT_OK(gpuipc_channel_close(ch));
  printf("recv: %d messages of a closed sender, every byte\n", MSGS);

  ch = cu_chan_open(dom, "second", true);
  memset(host, 0, BYTES);
  ASSERT_OK(gpuipc_channel_recv(ch, &v, s, 30000));
  const uint8_t *p = (const uint8_t *)v->dl.data + v->dl.byte_offset;
  CU_OK(cuMemcpyAsync, (CUdeviceptr)host, (CUdeviceptr)p, BYTES, s);
  ASSERT_OK(gpuipc_tensor_release(v, s)); /* an event: the read pends */
  ASSERT_OK(gpuipc_channel_close(ch));    /* its events: complete, gone */
  expect(host, 99, "a read released, then closed");
  flag_set("released");
  flag_wait("done-send");
  ASSERT_EQ(cu_fake_count("fake_cuda_dead_event_uses"), 0);
  printf("recv: both channels closed, no destroyed event used\n");
  flag_set("done-recv");
  ASSERT_OK(gpuipc_buf_release(dbuf));
  free(host);
}

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc != 4)
    TFAIL("usage: chan_close_peer send|recv DOMAIN FLAGDIR");
  flagdir = argv[3];
  CUstream s = cu_stream_make();
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join(argv[2], NULL, &dom));
  if (strcmp(argv[1], "send") == 0)
    sender(dom, s);
  else
    receiver(dom, s);
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
