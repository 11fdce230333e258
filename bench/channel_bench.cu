/*
 * channel_bench: gpuipc channels between two processes, next to
 * cudaMemcpyPeerAsync / cudaMemcpyAsync run in the producer process in the
 * same run.
 *
 *   channel_bench PDEV CDEV [--quick] [--latency]
 *   channel_bench PDEV CDEV [--quick] --streams [null|legacy|perthread|created]
 *
 * The producer (this process, GPU PDEV) starts the consumer (this program
 * again, GPU CDEV) and steers it through the channel itself: before each
 * step it sends a small HOST "control" tensor {op, bytes, count}.
 *
 *   latency   4 KiB tensor: send -> recv -> release -> the sender sees it
 *             released (gpuipc_channel_send_wait: host-side, stream-ordered), and
 *             the same until the buffer is free on the GPU too
 *             (gpuipc_channel_send_done); the same with a kernel writing the tensor
 *             just before each send (the stream is busy, so events travel
 *             both ways); a HOST-kind round trip; a ping-pong of two
 *             one-way messages (one way = half of it).
 *   bandwidth 4 KiB .. 1 GiB, copy mode (gpuipc_channel_recv_into into the
 *             consumer's own memory on its stream) and zero-copy (view +
 *             cudaMemcpyAsync by the consumer + release). The producer sends
 *             the same VMM buffer `count` times and stops the clock when the
 *             last message's buffer is free (its copy has completed).
 *   baseline  the same sizes and counts with cudaMemcpyPeerAsync (PDEV !=
 *             CDEV, peer access enabled) or cudaMemcpyAsync (same GPU) in
 *             the producer process.
 *   --streams only the 4 KiB round trip (send -> recv -> release ->
 *             gpuipc_channel_send_wait) with both ends passing the stream handle
 *             named (all four when none is): NULL, cudaStreamLegacy,
 *             cudaStreamPerThread, a created non-blocking stream; each idle
 *             (row <where>_gpu_rt_<handle>) and with a 4 KiB device copy
 *             queued on the stream before each send (<where>_gpu_rt_
 *             <handle>_copy: the message carries an event); and, as that
 *             row's floor, the same copy in this one process with the host
 *             polling the stream until it is done (<where>_copy_wait_
 *             <handle>: what any round trip that must see the copy
 *             complete costs at least, on this machine); and as programs
 *             run: a kernel writes the tensor before each send, the
 *             receiver's kernel reads it before the release
 *             (<where>_gpu_rt_<handle>_kernels).
 *
 * Output: "RESULT ..." lines for channel_vs_baselines.py, and a readable
 * line for each.
 */
#include <gpuipc.h>

#include "bench_cuda.h"
#include "bench_tens.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <vector>

#define OP_END 0
#define OP_LAT 1      /* recv view, release on the stream */
#define OP_PINGPONG 2 /* recv view, release, send our own tensor back */
#define OP_BW_COPY 3  /* recv_into */
#define OP_BW_VIEW 4  /* recv view, cudaMemcpyAsync, release */
#define OP_LAT_HOST 5 /* as OP_LAT for HOST tensors */
#define OP_ONEWAY 6   /* as OP_LAT, timed here against the sender's clock */
#define OP_LAT_READ 7 /* recv view, a kernel reads it, release on the stream */

#define MAX_BYTES ((size_t)1 << 30)
#define LAT_BYTES 4096

/* The stream handles both ends may pass (--streams); the control message
 * says which. */
#define H_NULL 0
#define H_LEGACY 1
#define H_PERTHREAD 2
#define H_CREATED 3
static const char *const handle_names[] = {"null", "legacy", "perthread",
                                           "created"};

/* Handle @h, with @own for H_CREATED. */
static cudaStream_t handle_stream(int h, cudaStream_t own)
{
  switch (h) {
  case H_NULL:
    return (cudaStream_t)0;
  case H_LEGACY:
    return cudaStreamLegacy;
  case H_PERTHREAD:
    return cudaStreamPerThread;
  default:
    return own;
  }
}

/* The 4 KiB summed by one block into *@sum: a consumer reading a tensor. */
__global__ static void read_kernel(const uint32_t *p, uint32_t *sum)
{
  uint32_t a = 0;
  for (unsigned i = threadIdx.x; i < LAT_BYTES / 4; i += blockDim.x)
    a += p[i];
  atomicAdd(sum, a);
}

/* One byte written on the GPU: makes the stream busy when the send comes. */
__global__ static void touch_kernel(uint8_t *p, uint8_t v)
{
  p[0] = v;
}

static void stats(std::vector<double> &v, double *median, double *p99)
{
  std::sort(v.begin(), v.end());
  *median = v[v.size() / 2];
  *p99 = v[std::min(v.size() - 1, v.size() * 99 / 100)];
}

static void result_lat(const char *name, std::vector<double> &v, double div);

/*
 * The producer's send time for one way, in a page both processes map: a
 * memfd the producer creates and the consumer inherits across exec
 * (--clock-fd N). Not a channel view: a view held by the consumer would
 * keep one of the producer's `depth` messages in flight for good.
 */
static volatile double *g_clock;

/* struct tens, tens_init: bench_tens.h */

/* ------------------------------------------------------------------------ */
/* Consumer                                                                 */
/* ------------------------------------------------------------------------ */

static int consumer(gpuipc_channel_t *ch, int dev, const char *where)
{
  CUDA_OK(cudaSetDevice(dev));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void *dst;
  CUDA_OK(cudaMalloc(&dst, MAX_BYTES));
  gpuipc_buf_t *mine; /* what ping-pong sends back */
  GI_OK(gpuipc_buf_alloc(LAT_BYTES, GPUIPC_KIND_VMM, dev, 0, &mine));
  tens back;
  tens_init(&back, mine, gpuipc_buf_ptr(mine), dev, LAT_BYTES);
  for (;;) {
    gpuipc_tensor_t *c;
    GI_OK(gpuipc_channel_recv(ch, &c, NULL, -1));
    int64_t ctl[4];
    memcpy(ctl, (const uint8_t *)c->dl.data + c->dl.byte_offset, sizeof(ctl));
    GI_OK(gpuipc_tensor_release(c, NULL));
    int op = (int)ctl[0];
    size_t bytes = (size_t)ctl[1];
    long count = (long)ctl[2];
    if (op == OP_END)
      break;
    cudaStream_t s_own = s; /* the stream this op uses, then ours again */
    s = handle_stream((int)ctl[3], s_own);
    tens into;
    tens_init(&into, NULL, dst, dev, bytes);
    std::vector<double> oneway;
    std::vector<double> t_rel; /* release call times (host), latency ops */
    for (long i = 0; i < count; i++) {
      gpuipc_tensor_t *v;
      double t0, t1;
      switch (op) {
      case OP_LAT:
      case OP_LAT_HOST:
        GI_OK(gpuipc_channel_recv(ch, &v, (void *)s, -1));
        t0 = now_us();
        GI_OK(gpuipc_tensor_release(v, (void *)s));
        t1 = now_us();
        t_rel.push_back(t1 - t0);
        break;
      case OP_ONEWAY: {
        GI_OK(gpuipc_channel_recv(ch, &v, (void *)s, -1));
        double t = now_us();
        if (i >= count / 11) /* after the warm-up */
          oneway.push_back(t - *g_clock);
        GI_OK(gpuipc_tensor_release(v, (void *)s));
        break;
      }
      case OP_LAT_READ:
        GI_OK(gpuipc_channel_recv(ch, &v, (void *)s, -1));
        read_kernel<<<1, 128, 0, s>>>(
            (const uint32_t *)((const uint8_t *)v->dl.data + v->dl.byte_offset),
            (uint32_t *)dst);
        GI_OK(gpuipc_tensor_release(v, (void *)s));
        break;
      case OP_PINGPONG:
        GI_OK(gpuipc_channel_recv(ch, &v, (void *)s, -1));
        GI_OK(gpuipc_tensor_release(v, (void *)s));
        GI_OK(gpuipc_channel_send(ch, &back.t, (void *)s, 0, NULL));
        break;
      case OP_BW_COPY:
        GI_OK(gpuipc_channel_recv_into(ch, &into.t, (void *)s, -1));
        break;
      case OP_BW_VIEW:
        GI_OK(gpuipc_channel_recv(ch, &v, (void *)s, -1));
        CUDA_OK(cudaMemcpyAsync(dst,
                                (const uint8_t *)v->dl.data + v->dl.byte_offset,
                                bytes, cudaMemcpyDeviceToDevice, s));
        GI_OK(gpuipc_tensor_release(v, (void *)s));
        break;
      default:
        fprintf(stderr, "consumer: unknown op %d\n", op);
        return 1;
      }
    }
    CUDA_OK(cudaStreamSynchronize(s));
    s = s_own;
    if (op == OP_ONEWAY) {
      char name[64];
      snprintf(name, sizeof(name), "%s_gpu_oneway", where);
      result_lat(name, oneway, 1);
    }
    if (!t_rel.empty()) {
      double med, p99;
      stats(t_rel, &med, &p99);
      printf("    consumer op %d: gpuipc_tensor_release call median %.2f us, "
             "p99 %.2f us\n", op, med, p99);
    }
  }
  CUDA_OK(cudaStreamSynchronize(s));
  gpuipc_buf_release(mine);
  CUDA_OK(cudaFree(dst));
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Producer                                                                 */
/* ------------------------------------------------------------------------ */

struct prod {
  gpuipc_channel_t *ch;
  int pdev, cdev;
  cudaStream_t s;
  gpuipc_buf_t *ctl_buf; /* HOST, 64 slots of 64 bytes */
  uint64_t ctl_tickets[64];
  int ctl_next;
  gpuipc_buf_t *src; /* VMM, MAX_BYTES */
  gpuipc_buf_t *host4k;
  const char *where;
};

/* Tell the consumer what comes next, and on which stream (H_*). */
static void control_on(prod *p, int op, size_t bytes, long count, int handle)
{
  int slot = p->ctl_next++ % 64;
  if (p->ctl_tickets[slot] != 0)
    GI_OK(gpuipc_channel_send_done(p->ch, p->ctl_tickets[slot], -1));
  int64_t *c = (int64_t *)((uint8_t *)gpuipc_buf_ptr(p->ctl_buf) + slot * 64);
  c[0] = op;
  c[1] = (int64_t)bytes;
  c[2] = count;
  c[3] = handle;
  tens x;
  tens_init(&x, p->ctl_buf, gpuipc_buf_ptr(p->ctl_buf), -1, 32);
  x.t.dl.byte_offset = (uint64_t)slot * 64;
  GI_OK(gpuipc_channel_send(p->ch, &x.t, NULL, 0, &p->ctl_tickets[slot]));
}

static void control(prod *p, int op, size_t bytes, long count)
{
  control_on(p, op, bytes, count, H_CREATED);
}

static void result_lat(const char *name, std::vector<double> &v, double div)
{
  double med, p99;
  for (double &x : v)
    x /= div;
  stats(v, &med, &p99);
  printf("RESULT lat %s %.3f %.3f\n", name, med, p99);
  printf("  %-28s median %8.2f us   p99 %8.2f us\n", name, med, p99);
}

static void latency(prod *p, int n)
{
  char name[64];
  int warm = n / 10;
  std::vector<double> v;
  tens t;

  /* HOST kind: the channel alone. */
  tens_init(&t, p->host4k, gpuipc_buf_ptr(p->host4k), -1, LAT_BYTES);
  control(p, OP_LAT_HOST, LAT_BYTES, n + warm);
  for (int i = 0; i < n + warm; i++) {
    uint64_t tk;
    double t0 = now_us();
    GI_OK(gpuipc_channel_send(p->ch, &t.t, NULL, 0, &tk));
    GI_OK(gpuipc_channel_send_done(p->ch, tk, -1));
    if (i >= warm)
      v.push_back(now_us() - t0);
  }
  snprintf(name, sizeof(name), "%s_host_rt", p->where);
  result_lat(name, v, 1);

  /* VMM on the GPU: released (host sees it; the stream waits on the GPU). */
  tens_init(&t, p->src, gpuipc_buf_ptr(p->src), p->pdev, LAT_BYTES);
  v.clear();
  control(p, OP_LAT, LAT_BYTES, n + warm);
  for (int i = 0; i < n + warm; i++) {
    uint64_t tk;
    double t0 = now_us();
    GI_OK(gpuipc_channel_send(p->ch, &t.t, (void *)p->s, 0, &tk));
    GI_OK(gpuipc_channel_send_wait(p->ch, tk, (void *)p->s, -1));
    if (i >= warm)
      v.push_back(now_us() - t0);
  }
  snprintf(name, sizeof(name), "%s_gpu_rt_released", p->where);
  result_lat(name, v, 1);

  /* VMM: until the receiver's release event has completed on its GPU. */
  v.clear();
  control(p, OP_LAT, LAT_BYTES, n + warm);
  for (int i = 0; i < n + warm; i++) {
    uint64_t tk;
    double t0 = now_us();
    GI_OK(gpuipc_channel_send(p->ch, &t.t, (void *)p->s, 0, &tk));
    GI_OK(gpuipc_channel_send_done(p->ch, tk, -1));
    if (i >= warm)
      v.push_back(now_us() - t0);
  }
  snprintf(name, sizeof(name), "%s_gpu_rt_done", p->where);
  result_lat(name, v, 1);

  /*
   * A kernel writes the tensor right before each send, so the stream is
   * busy: the message carries an event, the receiver's stream waits on it,
   * and its release carries one too.
   */
  v.clear();
  std::vector<double> c_launch, c_send, c_wait;
  control(p, OP_LAT, LAT_BYTES, n + warm);
  for (int i = 0; i < n + warm; i++) {
    uint64_t tk;
    double t0 = now_us();
    touch_kernel<<<1, 1, 0, p->s>>>((uint8_t *)gpuipc_buf_ptr(p->src),
                                    (uint8_t)i);
    double t1 = now_us();
    GI_OK(gpuipc_channel_send(p->ch, &t.t, (void *)p->s, 0, &tk));
    double t2 = now_us();
    GI_OK(gpuipc_channel_send_wait(p->ch, tk, (void *)p->s, -1));
    double t3 = now_us();
    if (i >= warm) {
      v.push_back(t3 - t0);
      c_launch.push_back(t1 - t0);
      c_send.push_back(t2 - t1);
      c_wait.push_back(t3 - t2);
    }
  }
  CUDA_OK(cudaGetLastError());
  snprintf(name, sizeof(name), "%s_gpu_rt_kernel", p->where);
  result_lat(name, v, 1);
  {
    double a, b, c, x;
    stats(c_launch, &a, &x);
    stats(c_send, &b, &x);
    stats(c_wait, &c, &x);
    printf("    kernel row, medians: launch %.2f us, gpuipc_channel_send %.2f us, "
           "gpuipc_channel_send_wait %.2f us\n", a, b, c);
  }

  /*
   * One way: from the call to gpuipc_channel_send until gpuipc_channel_recv returns in the
   * receiver, which reads the send time from a HOST view it keeps (one
   * clock for both processes: CLOCK_MONOTONIC). The buffer is mapped
   * already; each message is released before the next is sent.
   */
  control(p, OP_ONEWAY, LAT_BYTES, n + warm);
  for (int i = 0; i < n + warm; i++) {
    uint64_t tk;
    *g_clock = now_us(); /* the send's store of its ring head publishes it */
    GI_OK(gpuipc_channel_send(p->ch, &t.t, (void *)p->s, 0, &tk));
    GI_OK(gpuipc_channel_send_wait(p->ch, tk, (void *)p->s, -1));
  }

  /* Ping-pong: send, the receiver releases and replies; half of it. */
  v.clear();
  control(p, OP_PINGPONG, LAT_BYTES, n + warm);
  for (int i = 0; i < n + warm; i++) {
    double t0 = now_us();
    GI_OK(gpuipc_channel_send(p->ch, &t.t, (void *)p->s, 0, NULL));
    gpuipc_tensor_t *r;
    GI_OK(gpuipc_channel_recv(p->ch, &r, (void *)p->s, -1));
    GI_OK(gpuipc_tensor_release(r, (void *)p->s));
    if (i >= warm)
      v.push_back(now_us() - t0);
  }
  snprintf(name, sizeof(name), "%s_gpu_pingpong", p->where);
  result_lat(name, v, 2);
  CUDA_OK(cudaStreamSynchronize(p->s));

  /* The same with a kernel writing the tensor before each of our sends. */
  v.clear();
  control(p, OP_PINGPONG, LAT_BYTES, n + warm);
  for (int i = 0; i < n + warm; i++) {
    double t0 = now_us();
    touch_kernel<<<1, 1, 0, p->s>>>((uint8_t *)gpuipc_buf_ptr(p->src),
                                    (uint8_t)i);
    GI_OK(gpuipc_channel_send(p->ch, &t.t, (void *)p->s, 0, NULL));
    gpuipc_tensor_t *r;
    GI_OK(gpuipc_channel_recv(p->ch, &r, (void *)p->s, -1));
    GI_OK(gpuipc_tensor_release(r, (void *)p->s));
    if (i >= warm)
      v.push_back(now_us() - t0);
  }
  snprintf(name, sizeof(name), "%s_gpu_pingpong_kernel", p->where);
  result_lat(name, v, 2);
  CUDA_OK(cudaStreamSynchronize(p->s));
}

/*
 * The 4 KiB round trip with both ends on stream handle @h: idle, then with
 * a 4 KiB device copy queued on the stream before each send (the message
 * carries an event; the release does not: the receiver's stream is idle);
 * then that copy alone, the host polling the stream until it is done; then
 * as a program would: a kernel writes the tensor before each send and the
 * receiver's kernel reads it before the release (events or words both
 * ways: each process's GPU work waits for the other's).
 */
static void stream_rows(prod *p, int n, int h)
{
  char name[64];
  int warm = n / 10;
  cudaStream_t s = handle_stream(h, p->s);
  uint8_t *base = (uint8_t *)gpuipc_buf_ptr(p->src);
  tens t;
  tens_init(&t, p->src, base, p->pdev, LAT_BYTES);
  for (int copy = 0; copy < 2; copy++) {
    std::vector<double> v;
    control_on(p, OP_LAT, LAT_BYTES, n + warm, h);
    for (int i = 0; i < n + warm; i++) {
      uint64_t tk;
      double t0 = now_us();
      if (copy)
        CUDA_OK(cudaMemcpyAsync(base, base + LAT_BYTES, LAT_BYTES,
                                cudaMemcpyDeviceToDevice, s));
      GI_OK(gpuipc_channel_send(p->ch, &t.t, (void *)s, 0, &tk));
      GI_OK(gpuipc_channel_send_wait(p->ch, tk, (void *)s, -1));
      if (i >= warm)
        v.push_back(now_us() - t0);
    }
    CUDA_OK(cudaStreamSynchronize(s));
    snprintf(name, sizeof(name), "%s_gpu_rt_%s%s", p->where, handle_names[h],
             copy ? "_copy" : "");
    result_lat(name, v, 1);
  }
  std::vector<double> v;
  for (int i = 0; i < n + warm; i++) {
    double t0 = now_us();
    CUDA_OK(cudaMemcpyAsync(base, base + LAT_BYTES, LAT_BYTES,
                            cudaMemcpyDeviceToDevice, s));
    cudaError_t e;
    while ((e = cudaStreamQuery(s)) == cudaErrorNotReady)
      ;
    CUDA_OK(e);
    if (i >= warm)
      v.push_back(now_us() - t0);
  }
  snprintf(name, sizeof(name), "%s_copy_wait_%s", p->where, handle_names[h]);
  result_lat(name, v, 1);
  v.clear();
  control_on(p, OP_LAT_READ, LAT_BYTES, n + warm, h);
  for (int i = 0; i < n + warm; i++) {
    uint64_t tk;
    double t0 = now_us();
    touch_kernel<<<1, 1, 0, s>>>(base, (uint8_t)i);
    GI_OK(gpuipc_channel_send(p->ch, &t.t, (void *)s, 0, &tk));
    GI_OK(gpuipc_channel_send_wait(p->ch, tk, (void *)s, -1));
    if (i >= warm)
      v.push_back(now_us() - t0);
  }
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaStreamSynchronize(s));
  snprintf(name, sizeof(name), "%s_gpu_rt_%s_kernels", p->where,
           handle_names[h]);
  result_lat(name, v, 1);
}

/*
 * What the event calls cost in one process, interprocess events next to
 * plain ones: the host time of a record, a query of a completed event and
 * a stream wait, and a kernel -> record -> wait (other stream) -> kernel
 * chain until the host sees the end.
 */
static void diag(prod *p)
{
  cudaStream_t s2;
  CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  cudaEvent_t end;
  CUDA_OK(cudaEventCreateWithFlags(&end, cudaEventDisableTiming));
  uint8_t *x = (uint8_t *)gpuipc_buf_ptr(p->src);
  for (int ipc = 0; ipc < 2; ipc++) {
    cudaEvent_t ev;
    CUDA_OK(cudaEventCreateWithFlags(
        &ev, cudaEventDisableTiming | (ipc ? cudaEventInterprocess : 0)));
    std::vector<double> rec, qry, wt, sq, chain;
    for (int i = 0; i < 2200; i++) {
      double t0 = now_us();
      CUDA_OK(cudaEventRecord(ev, p->s));
      double t1 = now_us();
      while (cudaEventQuery(ev) == cudaErrorNotReady)
        ;
      double t2 = now_us();
      CUDA_OK(cudaEventQuery(ev));
      double t3 = now_us();
      CUDA_OK(cudaStreamWaitEvent(s2, ev, 0));
      double t4 = now_us();
      (void)cudaStreamQuery(s2);
      double t5 = now_us();
      CUDA_OK(cudaStreamSynchronize(s2));
      double c0 = now_us();
      touch_kernel<<<1, 1, 0, p->s>>>(x, 1);
      CUDA_OK(cudaEventRecord(ev, p->s));
      CUDA_OK(cudaStreamWaitEvent(s2, ev, 0));
      touch_kernel<<<1, 1, 0, s2>>>(x + 1, 2);
      CUDA_OK(cudaEventRecord(end, s2));
      while (cudaEventQuery(end) == cudaErrorNotReady)
        ;
      double c1 = now_us();
      if (i >= 200) {
        rec.push_back(t1 - t0);
        qry.push_back(t3 - t2);
        wt.push_back(t4 - t3);
        sq.push_back(t5 - t4);
        chain.push_back(c1 - c0);
      }
    }
    double a, b, c, d, e, z;
    stats(rec, &a, &z);
    stats(qry, &b, &z);
    stats(wt, &c, &z);
    stats(sq, &d, &z);
    stats(chain, &e, &z);
    printf("    diag %s event, medians: record %.2f us, query (done) %.2f us, "
           "stream wait %.2f us, stream query %.2f us; kernel->event->other "
           "stream->kernel chain %.2f us\n",
           ipc ? "interprocess" : "plain", a, b, c, d, e);
    CUDA_OK(cudaEventDestroy(ev));
  }
  CUDA_OK(cudaEventDestroy(end));
  CUDA_OK(cudaStreamDestroy(s2));
}

static long count_for(size_t bytes, int quick)
{
  size_t target = quick ? ((size_t)1 << 30) : ((size_t)8 << 30);
  long n = (long)(target / bytes);
  long cap = quick ? 500 : 4000;
  return std::max(10L, std::min(cap, n));
}

static void bandwidth(prod *p, int quick, void *base_dst)
{
  tens t;
  for (size_t bytes = 4096; bytes <= MAX_BYTES; bytes *= 4) {
    long n = count_for(bytes, quick);
    tens_init(&t, p->src, gpuipc_buf_ptr(p->src), p->pdev, bytes);
    for (int op = OP_BW_COPY; op <= OP_BW_VIEW; op++) {
      control(p, op, bytes, n + 1);
      uint64_t tk;
      GI_OK(gpuipc_channel_send(p->ch, &t.t, (void *)p->s, 0, &tk)); /* warm-up */
      GI_OK(gpuipc_channel_send_done(p->ch, tk, -1));
      double t0 = now_us();
      for (long i = 0; i < n; i++)
        GI_OK(gpuipc_channel_send(p->ch, &t.t, (void *)p->s, 0, &tk));
      GI_OK(gpuipc_channel_send_done(p->ch, tk, -1));
      double us = now_us() - t0;
      double gbs = (double)bytes * n / us / 1e3;
      const char *mode = op == OP_BW_COPY ? "copy" : "zerocopy";
      printf("RESULT bw %s %s %zu %.2f\n", p->where, mode, bytes, gbs);
      printf("  %-6s %-9s %10zu B x %5ld: %8.2f GB/s\n", p->where, mode,
             bytes, n, gbs);
    }
    /* The baseline, same sizes and counts, in this process. */
    void *src = gpuipc_buf_ptr(p->src);
    for (int w = 0; w < 2; w++) {
      long m = w == 0 ? 1 : n;
      double t0 = now_us();
      for (long i = 0; i < m; i++) {
        if (p->pdev != p->cdev)
          CUDA_OK(cudaMemcpyPeerAsync(base_dst, p->cdev, src, p->pdev, bytes,
                                      p->s));
        else
          CUDA_OK(cudaMemcpyAsync(base_dst, src, bytes,
                                  cudaMemcpyDeviceToDevice, p->s));
      }
      CUDA_OK(cudaStreamSynchronize(p->s));
      if (w == 1) {
        double gbs = (double)bytes * n / (now_us() - t0) / 1e3;
        printf("RESULT bw %s memcpy %zu %.2f\n", p->where, bytes, gbs);
        printf("  %-6s %-9s %10zu B x %5ld: %8.2f GB/s\n", p->where,
               p->pdev != p->cdev ? "peer" : "d2d", bytes, n, gbs);
      }
    }
  }
}

static int producer(gpuipc_channel_t *ch, int pdev, int cdev, int quick,
                    int lat_only, int streams)
{
  prod p;
  memset(&p, 0, sizeof(p));
  p.ch = ch;
  p.pdev = pdev;
  p.cdev = cdev;
  p.where = pdev == cdev ? "same" : "cross";
  CUDA_OK(cudaSetDevice(pdev));
  CUDA_OK(cudaStreamCreateWithFlags(&p.s, cudaStreamNonBlocking));
  GI_OK(gpuipc_buf_alloc(64 * 64, GPUIPC_KIND_HOST, -1, 0, &p.ctl_buf));
  GI_OK(gpuipc_buf_alloc(LAT_BYTES, GPUIPC_KIND_HOST, -1, 0, &p.host4k));
  GI_OK(gpuipc_buf_alloc(MAX_BYTES, GPUIPC_KIND_VMM, pdev, 0, &p.src));
  CUDA_OK(cudaMemset(gpuipc_buf_ptr(p.src), 1, MAX_BYTES));
  void *base_dst;
  CUDA_OK(cudaSetDevice(cdev));
  CUDA_OK(cudaMalloc(&base_dst, MAX_BYTES));
  if (pdev != cdev) {
    cudaError_t e = cudaDeviceEnablePeerAccess(pdev, 0);
    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled)
      CUDA_OK(e);
    CUDA_OK(cudaSetDevice(pdev));
    e = cudaDeviceEnablePeerAccess(cdev, 0);
    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled)
      CUDA_OK(e);
    (void)cudaGetLastError();
  }
  CUDA_OK(cudaSetDevice(pdev));
  CUDA_OK(cudaDeviceSynchronize());

  if (streams >= 0) {
    printf("4 KiB round trip by stream handle, producer GPU %d, consumer "
           "GPU %d:\n", pdev, cdev);
    for (int h = H_NULL; h <= H_CREATED; h++)
      if (streams == 4 || streams == h)
        stream_rows(&p, quick ? 2000 : 10000, h);
  } else {
    diag(&p);
    printf("latency, producer GPU %d, consumer GPU %d:\n", pdev, cdev);
    latency(&p, quick ? 2000 : 10000);
  }
  if (!lat_only && streams < 0) {
    printf("bandwidth, producer GPU %d, consumer GPU %d:\n", pdev, cdev);
    bandwidth(&p, quick, base_dst);
  }
  control(&p, OP_END, 0, 0);
  for (int i = 0; i < 64; i++)
    if (p.ctl_tickets[i] != 0)
      GI_OK(gpuipc_channel_send_done(ch, p.ctl_tickets[i], -1));
  CUDA_OK(cudaFree(base_dst));
  gpuipc_buf_release(p.src);
  gpuipc_buf_release(p.host4k);
  gpuipc_buf_release(p.ctl_buf);
  return 0;
}

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 3) {
    fprintf(stderr, "usage: channel_bench PDEV CDEV [--quick] [--latency] "
            "[--streams [null|legacy|perthread|created]]\n");
    return 2;
  }
  int pdev = atoi(argv[1]), cdev = atoi(argv[2]);
  int quick = 0, is_consumer = 0, lat_only = 0, clock_fd = -1;
  int streams = -1; /* --streams: H_* or 4 for all */
  for (int i = 3; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      quick = 1;
    } else if (strcmp(argv[i], "--streams") == 0) {
      streams = 4;
      for (int h = H_NULL; h <= H_CREATED && i + 1 < argc; h++)
        if (strcmp(argv[i + 1], handle_names[h]) == 0) {
          streams = h;
          i++;
          break;
        }
    } else if (strcmp(argv[i], "--latency") == 0) {
      lat_only = 1;
    } else if (strcmp(argv[i], "--clock-fd") == 0 && i + 1 < argc) {
      clock_fd = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--consumer") == 0) {
      is_consumer = 1;
    }
  }
  pid_t child = -1;
  char fdarg[16];
  if (!is_consumer) {
    clock_fd = memfd_create("channel-bench-clock", 0); /* kept across exec */
    if (clock_fd < 0 || ftruncate(clock_fd, 4096) != 0) {
      perror("memfd_create");
      return 1;
    }
    snprintf(fdarg, sizeof(fdarg), "%d", clock_fd);
  }
  if (clock_fd < 0) {
    fprintf(stderr, "channel_bench: --consumer needs --clock-fd\n");
    return 2;
  }
  void *cm = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, clock_fd, 0);
  if (cm == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  g_clock = (volatile double *)cm;
  if (!is_consumer) {
    fflush(NULL);
    child = fork();
    if (child == 0) {
      char **args = (char **)calloc((size_t)argc + 4, sizeof(char *));
      for (int i = 0; i < argc; i++)
        args[i] = argv[i];
      args[argc++] = (char *)"--clock-fd";
      args[argc++] = fdarg;
      args[argc] = (char *)"--consumer";
      execv("/proc/self/exe", args);
      perror("execv");
      _exit(127);
    }
  }
  char chname[64];
  snprintf(chname, sizeof(chname), "bench-%d-%d", pdev, cdev);
  gpuipc_domain_t *dom;
  GI_OK(gpuipc_domain_join("channel-bench", NULL, &dom));
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.timeout_ms = 60000;
  o.depth = 16;
  o.device = is_consumer ? cdev : pdev;
  o.device_set = 1;
  gpuipc_channel_t *ch;
  GI_OK(gpuipc_channel_open(dom, chname, &o, &ch));
  int rc = is_consumer ? consumer(ch, cdev, pdev == cdev ? "same" : "cross")
                       : producer(ch, pdev, cdev, quick, lat_only, streams);
  GI_OK(gpuipc_channel_close(ch));
  GI_OK(gpuipc_domain_leave(dom));
  if (child > 0) {
    int st;
    waitpid(child, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "channel_bench: the consumer failed\n");
      rc = 1;
    }
  }
  return rc;
}
