/*
 * chan_gpu: the two GPU ends of tests/channel_gpu.c.
 *
 *   chan_gpu send DOMAIN CHANNEL KIND DEV ROUNDS BYTES
 *   chan_gpu recv DOMAIN CHANNEL DEV ROUNDS BYTES [nodev]
 *
 * The sender (KIND vmm, legacy, pool, or foreign for cudaMalloc memory,
 * which the channel stages) zeroes a buffer of BYTES, then each round runs
 * a kernel that spins SPIN_MS on the GPU and a kernel that writes pattern
 * r, both on its stream, and sends the buffer at once, without waiting
 * for either (except the last round, sent from an idle stream, which
 * needs no event at all). Before the next round it makes its stream wait until the
 * receiver has given the buffer back (gpuipc_channel_send_wait), so the next
 * pattern cannot overwrite bytes still being read.
 *
 * The receiver takes odd rounds with gpuipc_channel_recv_into (into its own
 * device buffer) and even rounds as views (gpuipc_channel_recv, then a copy of the
 * view), copies to the host on its stream and checks every byte: it can
 * only see pattern r if its stream waited for the sender's event, since
 * the message arrives long before the GPU has written the pattern.
 * With "nodev" the receiver opens its channel without a device (buffers
 * are mapped for the sender's GPU) and takes every round with
 * gpuipc_channel_recv_into into memory of its own GPU DEV: the copy then
 * needs the mapping to reach DEV too.
 *
 * BYTES picks the copy: across GPUs, up to 256 KiB (16-byte aligned ends)
 * gpuipc's copy kernel reads the sender's memory and writes the release,
 * above it the copy engine copies (tests/channel_gpu.c runs both).
 */
extern "C" {
#include "test.h"
}

#include "gpu_kernels.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SPIN_MS 50

static double ms_now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static size_t bytes_arg(const char *s)
{
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (*end != '\0' || v == 0 || v > ((size_t)1 << 30))
    TFAIL("bad BYTES %s", s);
  return (size_t)v;
}

static gpuipc_kind_t kind_of(const char *s)
{
  if (strcmp(s, "vmm") == 0)
    return GPUIPC_KIND_VMM;
  if (strcmp(s, "legacy") == 0)
    return GPUIPC_KIND_LEGACY;
  if (strcmp(s, "pool") == 0)
    return GPUIPC_KIND_POOL;
  return GPUIPC_KIND_AUTO;
}

static int do_send(gpuipc_domain_t *dom, const char *name, const char *kind,
                   int dev, int rounds, size_t bytes)
{
  cudaStream_t s = gpu_stream_on(dev);
  gpuipc_buf_t *buf = NULL;
  void *p;
  bool foreign = strcmp(kind, "foreign") == 0;
  if (foreign) {
    CUDA_OK(cudaMalloc(&p, bytes));
  } else {
    ASSERT_OK(gpuipc_buf_alloc(bytes, kind_of(kind), dev, 0, &buf));
    p = gpuipc_buf_ptr(buf);
  }
  CUDA_OK(cudaMemset(p, 0, bytes));
  CUDA_OK(cudaDeviceSynchronize());
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.timeout_ms = 60000;
  o.depth = 4;
  o.stage_slot_bytes = bytes > ((size_t)4 << 20) ? bytes : 0;
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, name, &o, &ch));
  int64_t shape[1] = {(int64_t)bytes};
  gpuipc_tensor_t t;
  memset(&t, 0, sizeof(t));
  t.dl.data = p;
  t.dl.device.device_type = GPUIPC_DL_CUDA;
  t.dl.device.device_id = dev;
  t.dl.ndim = 1;
  t.dl.dtype.code = GPUIPC_DL_UINT;
  t.dl.dtype.bits = 8;
  t.dl.dtype.lanes = 1;
  t.dl.shape = shape;
  t.buf = buf;
  uint64_t ticket = 0;
  for (int r = 1; r <= rounds; r++) {
    spin_kernel<<<1, 1, 0, s>>>((uint64_t)SPIN_MS * 1000000u);
    fill_kernel<<<1024, 256, 0, s>>>((uint8_t *)p, bytes, (uint64_t)r);
    CUDA_OK(cudaGetLastError());
    if (r == rounds) /* the last round from an idle stream: no event */
      CUDA_OK(cudaStreamSynchronize(s));
    double t0 = ms_now();
    ASSERT_OK(gpuipc_channel_send(ch, &t, (void *)s, 0, &ticket));
    printf("send %s round %d: sent %.3f ms after launching (GPU still "
           "spinning: %s)\n", kind, r, ms_now() - t0,
           cudaStreamQuery(s) == cudaErrorNotReady ? "yes" : "no");
    /* The next round's kernels run after the receiver is done. */
    ASSERT_OK(gpuipc_channel_send_wait(ch, ticket, (void *)s, 60000));
  }
  ASSERT_OK(gpuipc_channel_send_done(ch, ticket, 60000));
  CUDA_OK(cudaStreamSynchronize(s));
  ASSERT_OK(gpuipc_channel_close(ch));
  if (foreign)
    CUDA_OK(cudaFree(p));
  else
    ASSERT_OK(gpuipc_buf_release(buf));
  CUDA_OK(cudaStreamDestroy(s));
  return 0;
}

static int do_recv(gpuipc_domain_t *dom, const char *name, int dev,
                   int rounds, size_t bytes, bool nodev)
{
  cudaStream_t s = gpu_stream_on(dev);
  void *dst;
  CUDA_OK(cudaMalloc(&dst, bytes));
  uint8_t *host;
  CUDA_OK(cudaMallocHost((void **)&host, bytes));
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.timeout_ms = 60000;
  o.device = dev;
  o.device_set = !nodev;
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, name, &o, &ch));
  int64_t shape[1] = {(int64_t)bytes};
  for (int r = 1; r <= rounds; r++) {
    memset(host, 0, bytes);
    double t0 = ms_now();
    if (r % 2 || nodev) {
      gpuipc_tensor_t t;
      memset(&t, 0, sizeof(t));
      t.dl.data = dst;
      t.dl.device.device_type = GPUIPC_DL_CUDA;
      t.dl.device.device_id = dev;
      t.dl.ndim = 1;
      t.dl.dtype.code = GPUIPC_DL_UINT;
      t.dl.dtype.bits = 8;
      t.dl.dtype.lanes = 1;
      t.dl.shape = shape;
      ASSERT_OK(gpuipc_channel_recv_into(ch, &t, (void *)s, 60000));
      CUDA_OK(cudaMemcpyAsync(host, dst, bytes, cudaMemcpyDefault, s));
    } else {
      gpuipc_tensor_t *v;
      ASSERT_OK(gpuipc_channel_recv(ch, &v, (void *)s, 60000));
      ASSERT_EQ(v->dl.device.device_type, GPUIPC_DL_CUDA);
      ASSERT_EQ(v->dl.device.device_id, dev);
      ASSERT_EQ(v->dl.shape[0], (int64_t)bytes);
      const uint8_t *src = (const uint8_t *)v->dl.data + v->dl.byte_offset;
      CUDA_OK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDefault, s));
      ASSERT_OK(gpuipc_tensor_release(v, (void *)s));
    }
    double t1 = ms_now();
    CUDA_OK(cudaStreamSynchronize(s));
    size_t bad = test_check(host, bytes, (uint64_t)r);
    printf("recv round %d (%s): received in %.3f ms, bytes after %.3f ms: "
           "%s\n", r, r % 2 ? "copy" : "view", t1 - t0, ms_now() - t0,
           bad == (size_t)-1 ? "pattern" : "WRONG");
    if (bad != (size_t)-1)
      TFAIL("round %d: byte %zu is %u, pattern says %u", r, bad, host[bad],
            test_pattern((uint64_t)r, bad));
  }
  gpu_recv_done(ch, dst, host, s);
  return 0;
}

int main(int argc, char **argv)
{
  gpuipc_domain_t *dom =
      gpu_helper_join(argc, argv, "chan_gpu send|recv DOMAIN CHANNEL ...");
  int rc;
  if (strcmp(argv[1], "send") == 0 && argc == 8)
    rc = do_send(dom, argv[3], argv[4], atoi(argv[5]), atoi(argv[6]),
                 bytes_arg(argv[7]));
  else if (strcmp(argv[1], "recv") == 0 && (argc == 7 || argc == 8))
    rc = do_recv(dom, argv[3], atoi(argv[4]), atoi(argv[5]),
                 bytes_arg(argv[6]),
                 argc == 8 && strcmp(argv[7], "nodev") == 0);
  else
    TFAIL("bad arguments");
  ASSERT_OK(gpuipc_domain_leave(dom));
  return rc;
}
