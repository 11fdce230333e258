/*
 * gpu_event: one side of the interprocess event test.
 *
 *   gpu_event producer DEV SOCK
 *   gpu_event consumer DEV SOCK
 *
 * The producer shares a VMM buffer (zeroed) and an event. It runs a kernel
 * that sleeps SPIN_MS and then writes pattern 700, records its event right
 * behind it and says so. The consumer makes its stream wait for that event
 * (no host synchronisation) and copies the buffer: the copy must see the
 * pattern, which the kernel writes long after the consumer was told. Then
 * the other way round: the consumer's kernel sleeps and writes pattern 701
 * through its mapping, records its own event, and the producer's stream
 * waits for it before copying. Each process opens the other's event on
 * its own GPU, whose streams wait on it (the GPUs may differ), and the
 * producer checks that a stream of another GPU is refused.
 */
#include "gpu_kernels.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SIZE ((size_t)8 << 20)
#define SPIN_MS 400

/* spin_kernel: gpu_kernels.cuh */

/* Sleep on the GPU, then write pattern @seed, all on @s. */
static void slow_fill(cudaStream_t s, void *p, uint64_t seed)
{
  spin_kernel<<<1, 1, 0, s>>>((uint64_t)SPIN_MS * 1000000u);
  fill_kernel<<<2048, 256, 0, s>>>((uint8_t *)p, SIZE, seed);
  CUDA_OK(cudaGetLastError());
}

static int dev_of(cudaStream_t s)
{
  int d = -1;
  CUDA_OK(cudaStreamGetDevice(s, &d));
  return d;
}

/* After @ev, copy the buffer on @s and check it holds pattern @seed. */
static void wait_and_check(gpuipc_event_t *ev, cudaStream_t s, const void *p,
                           uint8_t *host, uint64_t seed, const char *who)
{
  fprintf(stderr, "%s: stream on GPU %d waits for an event opened on GPU %d\n",
          who, dev_of(s), gpuipc_event_device(ev));
  ASSERT_OK(gpuipc_event_wait(ev, (void *)s));
  CUDA_OK(cudaMemcpyAsync(host, p, SIZE, cudaMemcpyDefault, s));
  int q = gpuipc_event_query(ev);
  printf("%s: waiting on the other process's event (query: %s)\n", who,
         q == -EAGAIN ? "pending" : gpuipc_err_name(q));
  CUDA_OK(cudaStreamSynchronize(s));
  size_t bad = test_check(host, SIZE, seed);
  if (bad != (size_t)-1)
    TFAIL("%s: byte %zu is 0x%02x, pattern %llu says 0x%02x: the copy did "
          "not wait for the event", who, bad, host[bad],
          (unsigned long long)seed, test_pattern(seed, bad));
  printf("%s: after the wait the copy saw pattern %llu in all %zu bytes\n",
         who, (unsigned long long)seed, SIZE);
}

static int producer(int dev, int sock)
{
  cudaStream_t s = gpu_stream_on(dev);
  uint8_t *host;
  CUDA_OK(cudaMallocHost((void **)&host, SIZE));
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_buf_alloc(SIZE, GPUIPC_KIND_VMM, dev, 0, &b));
  CUDA_OK(cudaMemset(gpuipc_buf_ptr(b), 0, SIZE));
  CUDA_OK(cudaDeviceSynchronize());
  gpuipc_event_t *ev;
  ASSERT_OK(gpuipc_event_create(dev, 0, &ev));
  ASSERT_EQ(gpuipc_event_device(ev), dev);
  gpuipc_handle_t h;
  ASSERT_OK(gpuipc_buf_export(b, &h));
  proto_send_handle(sock, &h, 0, 0);
  close(h.fd);
  gpuipc_event_handle_t eh;
  ASSERT_OK(gpuipc_event_export(ev, &eh));
  proto_send_event(sock, &eh);
  /* Importing our own event gives it back. */
  gpuipc_event_t *self;
  ASSERT_OK(gpuipc_event_import(&eh, -1, &self));
  ASSERT_TRUE(self == ev);
  ASSERT_OK(gpuipc_event_release(self));

  gpuipc_event_handle_t ch;
  proto_recv_event(sock, &ch);
  gpuipc_event_t *cev;
  ASSERT_OK(gpuipc_event_import(&ch, dev, &cev));

  /* A stream of another GPU is refused, not handed to the driver. */
  if (gpuipc_device_count() > 1) {
    int other = dev == 0 ? 1 : 0;
    cudaStream_t os;
    CUDA_OK(cudaSetDevice(other));
    CUDA_OK(cudaStreamCreateWithFlags(&os, cudaStreamNonBlocking));
    ASSERT_RC(gpuipc_event_wait(ev, (void *)os), -EINVAL);
    ASSERT_ERR_MENTIONS("import the event on the device");
    ASSERT_RC(gpuipc_event_record(ev, (void *)os), -EINVAL);
    CUDA_OK(cudaStreamDestroy(os));
    CUDA_OK(cudaSetDevice(dev));
    printf("producer: a GPU %d stream is refused for the GPU %d event: %s\n",
           other, dev, gpuipc_last_error());
  }

  slow_fill(s, gpuipc_buf_ptr(b), 700);
  ASSERT_OK(gpuipc_event_record(ev, (void *)s));
  proto_send_word(sock, TAG_READY, 700);
  printf("producer: GPU %d sleeps %d ms then writes pattern 700; event "
         "recorded behind it\n", dev, SPIN_MS);

  ASSERT_EQ_U(proto_recv_word(sock, TAG_READY), 701);
  wait_and_check(cev, s, gpuipc_buf_ptr(b), host, 701, "producer");
  proto_send_word(sock, TAG_DONE, 1);
  ASSERT_EQ_U(proto_recv_word(sock, TAG_DONE), 1);
  ASSERT_OK(gpuipc_event_release(cev));
  ASSERT_OK(gpuipc_event_release(ev));
  ASSERT_OK(gpuipc_buf_release(b));
  return 0;
}

static int consumer(int dev, int sock)
{
  cudaStream_t s = gpu_stream_on(dev);
  uint8_t *host;
  CUDA_OK(cudaMallocHost((void **)&host, SIZE));
  gpuipc_handle_t h;
  uint64_t seed;
  proto_recv_handle(sock, &h, &seed, NULL);
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_buf_import(&h, dev, 0, &b));
  close(h.fd);
  gpuipc_event_handle_t eh;
  proto_recv_event(sock, &eh);
  gpuipc_event_t *pev, *again;
  ASSERT_OK(gpuipc_event_import(&eh, dev, &pev));
  ASSERT_EQ(gpuipc_event_device(pev), dev);
  ASSERT_OK(gpuipc_event_import(&eh, dev, &again)); /* cached */
  ASSERT_TRUE(again == pev);
  ASSERT_OK(gpuipc_event_release(again));

  gpuipc_event_t *ev;
  ASSERT_OK(gpuipc_event_create(dev, 0, &ev));
  gpuipc_event_handle_t ch;
  ASSERT_OK(gpuipc_event_export(ev, &ch));
  proto_send_event(sock, &ch);

  ASSERT_EQ_U(proto_recv_word(sock, TAG_READY), 700);
  wait_and_check(pev, s, gpuipc_buf_ptr(b), host, 700, "consumer");

  slow_fill(s, gpuipc_buf_ptr(b), 701);
  ASSERT_OK(gpuipc_event_record(ev, (void *)s));
  proto_send_word(sock, TAG_READY, 701);
  printf("consumer: GPU %d sleeps %d ms then writes pattern 701 into the "
         "producer's buffer; event recorded behind it\n", dev, SPIN_MS);
  ASSERT_EQ_U(proto_recv_word(sock, TAG_DONE), 1);
  proto_send_word(sock, TAG_DONE, 1);
  ASSERT_OK(gpuipc_event_release(ev));
  ASSERT_OK(gpuipc_event_release(pev));
  ASSERT_OK(gpuipc_buf_release(b));
  return 0;
}

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc != 4)
    TFAIL("usage: gpu_event producer|consumer DEV SOCK");
  int dev = atoi(argv[2]);
  int sock = atoi(argv[3]);
  if (strcmp(argv[1], "producer") == 0)
    return producer(dev, sock);
  if (strcmp(argv[1], "consumer") == 0)
    return consumer(dev, sock);
  TFAIL("unknown role %s", argv[1]);
}
