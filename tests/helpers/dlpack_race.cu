/*
 * dlpack_race: the two GPU ends of tests/dlpack_stream.c.
 *
 *   dlpack_race send DOMAIN CHANNEL DEV ROUNDS
 *   dlpack_race recv DOMAIN CHANNEL DEV ROUNDS stream|legacy
 *
 * The sender, each round r: on its stream, a short spin and pattern r
 * into a 1 MiB buffer; send at once; make its stream wait for the
 * receiver's release (gpuipc_channel_send_wait) and overwrite the whole buffer
 * with pattern POISON right behind it -- a sender reusing its buffer the
 * moment the release allows it.
 *
 * The receiver, each round: gpuipc_channel_recv on the legacy default stream,
 * then hands the view over as DLPack to a consumer on a non-blocking
 * stream S: "stream" with gpuipc_tensor_to_dlpack_stream(view, S),
 * "legacy" with gpuipc_tensor_to_dlpack (the consumer's stream unknown).
 * The consumer spins on S, copies the tensor into its own buffer on S and
 * calls the deleter at once, as a framework does when its tensor goes
 * out of scope with work still queued. It then checks its copy: pattern r
 * in every byte. "stream" must never see anything else; "legacy" counts
 * the rounds that saw the sender's later bytes (the race the stream
 * hand-over closes) and exits 0 whatever the count.
 */
extern "C" {
#include "test.h"
}

#include "gpu_kernels.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIZE ((size_t)1 << 20)
#define POISON 0xdead
#define SEND_SPIN_US 50
#define READ_SPIN_US 300

static void tensor_1d(gpuipc_tensor_t *t, void *p, int dev, int64_t *shape)
{
  memset(t, 0, sizeof(*t));
  shape[0] = (int64_t)SIZE;
  t->dl.data = p;
  t->dl.device.device_type = GPUIPC_DL_CUDA;
  t->dl.device.device_id = dev;
  t->dl.ndim = 1;
  t->dl.dtype.code = GPUIPC_DL_UINT;
  t->dl.dtype.bits = 8;
  t->dl.dtype.lanes = 1;
  t->dl.shape = shape;
}

static gpuipc_channel_t *open_end(gpuipc_domain_t *dom, const char *name,
                                  int dev)
{
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.timeout_ms = 60000;
  o.device = dev;
  o.device_set = 1;
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, name, &o, &ch));
  return ch;
}

static int do_send(gpuipc_domain_t *dom, const char *name, int dev,
                   int rounds)
{
  cudaStream_t s = gpu_stream_on(dev);
  gpuipc_buf_t *buf;
  ASSERT_OK(gpuipc_buf_alloc(SIZE, GPUIPC_KIND_AUTO, dev, 0, &buf));
  uint8_t *p = (uint8_t *)gpuipc_buf_ptr(buf);
  gpuipc_channel_t *ch = open_end(dom, name, dev);
  int64_t shape[1];
  gpuipc_tensor_t t;
  tensor_1d(&t, p, dev, shape);
  uint64_t ticket = 0;
  for (int r = 1; r <= rounds; r++) {
    spin_kernel<<<1, 1, 0, s>>>((uint64_t)SEND_SPIN_US * 1000u);
    fill_kernel<<<256, 256, 0, s>>>(p, SIZE, (uint64_t)r);
    CUDA_OK(cudaGetLastError());
    ASSERT_OK(gpuipc_channel_send(ch, &t, (void *)s, 0, &ticket));
    ASSERT_OK(gpuipc_channel_send_wait(ch, ticket, (void *)s, 60000));
    fill_kernel<<<256, 256, 0, s>>>(p, SIZE, POISON);
    CUDA_OK(cudaGetLastError());
  }
  ASSERT_OK(gpuipc_channel_send_done(ch, ticket, 60000));
  CUDA_OK(cudaStreamSynchronize(s));
  ASSERT_OK(gpuipc_channel_close(ch));
  ASSERT_OK(gpuipc_buf_release(buf));
  CUDA_OK(cudaStreamDestroy(s));
  return 0;
}

static int do_recv(gpuipc_domain_t *dom, const char *name, int dev,
                   int rounds, bool with_stream)
{
  cudaStream_t s = gpu_stream_on(dev);
  void *dst;
  CUDA_OK(cudaMalloc(&dst, SIZE));
  uint8_t *host;
  CUDA_OK(cudaMallocHost((void **)&host, SIZE));
  gpuipc_channel_t *ch = open_end(dom, name, dev);
  int raced = 0;
  for (int r = 1; r <= rounds; r++) {
    gpuipc_tensor_t *v;
    ASSERT_OK(gpuipc_channel_recv(ch, &v, NULL, 60000));
    gpuipc_dl_managed_tensor_t *mt;
    if (with_stream)
      ASSERT_OK(gpuipc_tensor_to_dlpack_stream(v, (void *)s, &mt));
    else
      ASSERT_OK(gpuipc_tensor_to_dlpack(v, &mt));
    const uint8_t *src =
        (const uint8_t *)mt->dl_tensor.data + mt->dl_tensor.byte_offset;
    spin_kernel<<<1, 1, 0, s>>>((uint64_t)READ_SPIN_US * 1000u);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpyAsync(dst, src, SIZE, cudaMemcpyDeviceToDevice, s));
    mt->deleter(mt); /* the consumer drops the tensor, work still queued */
    CUDA_OK(cudaMemcpyAsync(host, dst, SIZE, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    size_t bad = test_check(host, SIZE, (uint64_t)r);
    if (bad == (size_t)-1)
      continue;
    raced++;
    if (with_stream)
      TFAIL("round %d: byte %zu is %u, pattern %d says %u (poison: %u)", r,
            bad, host[bad], r, test_pattern((uint64_t)r, bad),
            test_pattern(POISON, bad));
  }
  printf("recv %s: %d of %d rounds read bytes the sender wrote after the "
         "release\n", with_stream ? "to_dlpack_stream(view, S)"
                                  : "to_dlpack(view) (legacy stream)",
         raced, rounds);
  gpu_recv_done(ch, dst, host, s);
  return 0;
}

int main(int argc, char **argv)
{
  gpuipc_domain_t *dom = gpu_helper_join(
      argc, argv, "dlpack_race send|recv DOMAIN CHANNEL DEV ROUNDS [MODE]");
  int rc;
  if (strcmp(argv[1], "send") == 0 && argc == 6)
    rc = do_send(dom, argv[3], atoi(argv[4]), atoi(argv[5]));
  else if (strcmp(argv[1], "recv") == 0 && argc == 7)
    rc = do_recv(dom, argv[3], atoi(argv[4]), atoi(argv[5]),
                 strcmp(argv[6], "stream") == 0);
  else
    TFAIL("bad arguments");
  ASSERT_OK(gpuipc_domain_leave(dom));
  return rc;
}
