/*
 * HOST memory is registered with CUDA (pinned) without starting CUDA: at
 * its mapping when the process has a context already, else when gpuipc
 * first puts GPU work on it. On the fake CUDA driver, which remembers
 * each registered range and maps only those:
 *   - two processes that pair over a channel and exchange HOST messages
 *     (a HOST buffer's handle crosses) never load the driver;
 *   - in this process: a buffer mapped before the driver was loaded, and
 *     one mapped with the driver loaded but no context, stay unregistered
 *     and make no context; with device 1's primary context current (a
 *     program on its second GPU), a new buffer registers at once, in that
 *     context, and device 0 gets none; an unregistered buffer is pinned
 *     on demand, once; releases unregister;
 *   - with that context current, memory mapped unpinned (GPUIPC_BUF_
 *     UNPINNED, GPUIPC_UNPINNED: a buffer, a segment this process creates,
 *     and one another process (seg_peer) created, opened here) is not
 *     registered, while the same open without the flag is; gpuipc still
 *     pins it on demand;
 *   - a process whose first CUDA work is a GPU message it receives on a
 *     channel opened without CUDA: it maps it and sends it back intact;
 *   - two processes that open a channel before they start CUDA, then
 *     send GPU messages (the GPU-ordering rounds of
 *     tests/channel_gpu_order.c): the release words in the channel's
 *     segment, mapped unregistered, are pinned at their first use, so the
 *     receiver's copies still release through gpuipc's kernel.
 */
#include "helpers/chan_common.h"
#include "helpers/fake_lag.h"
#include "helpers/seg_peer.h"

#include "cuda/cuda.h"
#include "mem/mem.h"

#include <unistd.h>

#ifdef FAKE_CUDA_FULL
#include "helpers/cu_peer.h"

static gpuipc_domain_t *dom;

/* Host ranges the fake has registered now. */
static int registered(void)
{
  return cu_fake_count("fake_cuda_registered");
}

/* Whether device @dev's streams reach @b's memory (it is registered). */
static bool mapped_for_device(gpuipc_buf_t *b, int dev)
{
  struct gpuipc__ctx_saved saved;
  ASSERT_OK(gpuipc__ctx_enter(dev, &saved));
  CUdeviceptr p = 0;
  CUresult r =
      gpuipc__cu.cuMemHostGetDevicePointer(&p, gpuipc_buf_ptr(b), 0);
  gpuipc__ctx_leave(&saved);
  return r == CUDA_SUCCESS && p == (CUdeviceptr)(uintptr_t)gpuipc_buf_ptr(b);
}

static void host_pair_loads_nothing(void)
{
  const char *args[] = {"pair-host", "host-pin", "host", NULL};
  pid_t a = test_spawn("chan_peer", args, NULL);
  pid_t b = test_spawn("chan_peer", args, NULL);
  ASSERT_EQ(test_wait(a, 60000), 0);
  ASSERT_EQ(test_wait(b, 60000), 0);
  printf("a HOST-only pair: paired, exchanged, no driver loaded\n");
}

static gpuipc_buf_t *host_buf(void)
{
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_buf_alloc(8192, GPUIPC_KIND_HOST, -1, 0, &b));
  memset(gpuipc_buf_ptr(b), 0x3c, 8192);
  return b;
}

static void registered_in_a_context_the_process_has(void)
{
  ASSERT_TRUE(!test_driver_loaded());
  gpuipc_buf_t *before_driver = host_buf();
  ASSERT_TRUE(!test_driver_loaded());

  ASSERT_OK(gpuipc_driver_status(NULL)); /* loaded; no context */
  gpuipc_buf_t *no_ctx = host_buf();
  ASSERT_EQ(registered(), 0);
  ASSERT_EQ(cu_fake_retains(0), 0);
  ASSERT_EQ(cu_fake_retains(1), 0);

  /* A program on its second GPU: the runtime made device 1's primary
   * context current. */
  const struct gpuipc__dev *d1 = gpuipc__dev_get(1);
  ASSERT_TRUE(d1 != NULL);
  CUcontext c1;
  ASSERT_OK(GPUIPC_CU(cuDevicePrimaryCtxRetain, &c1, d1->cu_dev));
  ASSERT_OK(GPUIPC_CU(cuCtxSetCurrent, c1));
  gpuipc_buf_t *with_ctx = host_buf();
  ASSERT_EQ(registered(), 1);
  ASSERT_EQ(cu_fake_retains(0), 0); /* nothing made on device 0 */
  ASSERT_TRUE(mapped_for_device(with_ctx, 1));
  ASSERT_TRUE(!mapped_for_device(no_ctx, 1));
  ASSERT_EQ(cu_fake_retains(0), 0);

  /* Pinned on demand, once. */
  ASSERT_OK(gpuipc__host_pin(no_ctx, 1));
  ASSERT_EQ(registered(), 2);
  ASSERT_OK(gpuipc__host_pin(no_ctx, 1));
  ASSERT_EQ(registered(), 2);
  ASSERT_TRUE(mapped_for_device(no_ctx, 1));
  ASSERT_OK(gpuipc__host_pin(before_driver, 1));
  ASSERT_EQ(registered(), 3);

  ASSERT_OK(gpuipc_buf_release(with_ctx));
  ASSERT_OK(gpuipc_buf_release(no_ctx));
  ASSERT_OK(gpuipc_buf_release(before_driver));
  ASSERT_EQ(registered(), 0);
  ASSERT_EQ(cu_fake_retains(0), 0);
  ASSERT_OK(GPUIPC_CU(cuCtxSetCurrent, NULL));
  printf("registration: none without a context; at once in device 1's; "
         "on demand once; undone at release; device 0 untouched\n");
}

/* The HOST segment @name of @dom, opened with @flags. */
static gpuipc_buf_t *seg_open(const char *name, size_t bytes, unsigned flags)
{
  gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
  o.bytes = bytes;
  o.kind = GPUIPC_KIND_HOST;
  o.flags = flags;
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_segment_open(dom, name, &o, &b));
  return b;
}

static void unpinned_stays_unregistered(void)
{
  struct peer p;
  peer_start(&p);
  PEER_OK(&p, "join host-pin cold");
  PEER_OK(&p, "open up-theirs 8192 cs");
  PEER_OK(&p, "open pinned-theirs 8192 cs");

  const struct gpuipc__dev *d1 = gpuipc__dev_get(1);
  CUcontext c1;
  ASSERT_OK(GPUIPC_CU(cuDevicePrimaryCtxRetain, &c1, d1->cu_dev));
  ASSERT_OK(GPUIPC_CU(cuCtxSetCurrent, c1));
  int r0 = registered();
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_buf_alloc(8192, GPUIPC_KIND_HOST, -1, GPUIPC_BUF_UNPINNED,
                             &b));
  gpuipc_buf_t *mine = seg_open("up-mine", 8192,
                                GPUIPC_CREATE | GPUIPC_SCRATCH |
                                    GPUIPC_UNPINNED);
  gpuipc_buf_t *theirs = seg_open("up-theirs", 0, GPUIPC_UNPINNED);
  ASSERT_EQ(registered(), r0);
  ASSERT_TRUE(!mapped_for_device(b, 1));
  ASSERT_TRUE(!mapped_for_device(theirs, 1));
  gpuipc_buf_t *pinned = seg_open("pinned-theirs", 0, 0);
  ASSERT_EQ(registered(), r0 + 1);
  ASSERT_TRUE(mapped_for_device(pinned, 1));
  /* gpuipc's own GPU work on it still pins it, once. */
  ASSERT_OK(gpuipc__host_pin(theirs, 1));
  ASSERT_EQ(registered(), r0 + 2);
  ASSERT_TRUE(mapped_for_device(theirs, 1));
  ASSERT_OK(gpuipc_buf_release(b));
  ASSERT_OK(gpuipc_buf_release(mine));
  ASSERT_OK(gpuipc_buf_release(theirs));
  ASSERT_OK(gpuipc_buf_release(pinned));
  ASSERT_EQ(registered(), r0);
  ASSERT_RC(gpuipc_buf_alloc(8192, GPUIPC_KIND_HOST, -1, 0x2, &b), -EINVAL);
  ASSERT_OK(GPUIPC_CU(cuCtxSetCurrent, NULL));
  peer_finish(&p);
  printf("unpinned: a buffer, our segment and theirs mapped with a context "
         "current and not registered; pinned on demand; the same open "
         "without the flag registered\n");
}

/*
 * A process whose first CUDA work is a GPU message received on a channel
 * it opened with no CUDA (chan_peer echo-gpu) imports it (the import loads
 * the driver) and sends it back: our buffer comes home, every byte intact.
 */
static void gpu_message_is_the_first_cuda(void)
{
  const char *args[] = {"echo-gpu", "host-pin", "gpu-first", "3", NULL};
  pid_t e = test_spawn("chan_peer", args, NULL);
  gpuipc_channel_t *ch;
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.timeout_ms = 30000;
  ASSERT_OK(gpuipc_channel_open(dom, "gpu-first", &o, &ch));
  gpuipc_buf_t *buf;
  ASSERT_OK(gpuipc_buf_alloc(CHAN_SLOT * 4, GPUIPC_KIND_LEGACY, 0, 0, &buf));
  for (uint64_t i = 1; i <= 3; i++) {
    struct chan_msg m;
    gpuipc_tensor_t t;
    uint8_t *p = (uint8_t *)gpuipc_buf_ptr(buf) + i * CHAN_SLOT;
    chan_msg_make(i, 0, p, buf, &m, &t);
    t.dl.device.device_type = GPUIPC_DL_CUDA;
    t.dl.device.device_id = 0;
    uint64_t ticket;
    ASSERT_OK(gpuipc_channel_send(ch, &t, NULL, 0, &ticket));
    gpuipc_tensor_t *v;
    ASSERT_OK(gpuipc_channel_recv(ch, &v, NULL, 30000));
    ASSERT_TRUE(v->buf == buf); /* home: our own buffer */
    const char *why = chan_msg_check_on(i, 0, v, GPUIPC_DL_CUDA);
    if (why != NULL)
      TFAIL("%s", why);
    ASSERT_OK(gpuipc_tensor_release(v, NULL));
    ASSERT_OK(gpuipc_channel_send_done(ch, ticket, 30000));
  }
  ASSERT_EQ(test_wait(e, 60000), 0);
  ASSERT_OK(gpuipc_channel_close(ch));
  ASSERT_OK(gpuipc_buf_release(buf));
  printf("a GPU message as a process's first CUDA work: imported, echoed, "
         "every byte home\n");
}

static void words_pinned_at_first_use(void)
{
  const char *rargs[] = {"recv-late", "host-pin", "late", "12", "kernel",
                         NULL};
  const char *sargs[] = {"send-late", "host-pin", "late", "12", NULL};
  pid_t r = test_spawn("chan_order_peer", rargs, NULL);
  pid_t s = test_spawn("chan_order_peer", sargs, NULL);
  ASSERT_EQ(test_wait(s, 60000), 0);
  ASSERT_EQ(test_wait(r, 60000), 0);
  printf("a channel opened before CUDA: 12 GPU rounds, released by the "
         "kernel through its pinned words\n");
}
#endif

int main(void)
{
#ifndef FAKE_CUDA_FULL
  SKIP("built without the CUDA headers: no fake CUDA driver");
#else
  dom = fake_lag_begin("host-pin");
  host_pair_loads_nothing();
  registered_in_a_context_the_process_has();
  unpinned_stays_unregistered();
  gpu_message_is_the_first_cuda();
  words_pinned_at_first_use();
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
#endif
}
