/*
 * One end of tests/channel_streams.c, on the fake CUDA driver
 * (GPUIPC_CUDA_LIB): chan_stream_peer ROLE DOMAIN CHANNEL HANDLE MODE N CUR
 *
 *   ROLE    send: fill a 4 KiB LEGACY buffer of device 0 (a copy on the
 *           stream), send it, gpuipc_channel_send_wait on the stream, N times;
 *           recv: receive each view, copy it out on the stream and check
 *           every byte, release it on the stream.
 *   HANDLE  the stream both sides pass: null, legacy (CU_STREAM_LEGACY),
 *           per-thread (CU_STREAM_PER_THREAD) or created (cuStreamCreate,
 *           non-blocking).
 *   MODE    idle: every copy is synchronised before the channel sees the
 *           stream, so nothing needs an event or a word: none may be
 *           recorded, written or waited on. lag: a copy is left queued on
 *           the stream before each send (the data) and each release (a
 *           read of the view); with FAKE_CUDA_COPY_LAG large it is still
 *           pending, so each send has its stream write a ready word
 *           that the receiver's stream waits on (an event with
 *           GPUIPC_CHAN_READY_WORDS=0), and each release has a stream
 *           of gpuipc's own write the message's release word after an
 *           event recorded on the receiver's stream (never the
 *           receiver's stream itself: it would stall there), which the
 *           sender's stream waits on: N each. (The word lands when the
 *           receiver next synchronises its stream, for the next
 *           message, which the sender sends after queuing that wait;
 *           FAKE_CUDA_COPY_LAG_US keeps the fake from writing it
 *           earlier by itself.) A last
 *           message from host memory, which needs neither, says the
 *           sender is done. The receiver reads the right bytes only if
 *           its stream waited for the sender's copy;
 *           the sender's next fill would overwrite the view's bytes
 *           before the receiver's read if its stream did not wait.
 *   CUR     1: device 0's primary context is current on the calling thread
 *           (as in a program using the runtime API); 0: no context is.
 *
 * Prints and checks this process's count of cuEventRecord,
 * cuStreamWaitEvent, cuStreamWriteValue64 (all, and on its stream) and
 * cuStreamWaitValue64 calls.
 * Exit 0 when everything checked out.
 */
#include "core/private.h"
#include "test.h"

#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <unistd.h>

#define BYTES 4096

typedef int (*gpa_fn)(const char *, void **, int, uint64_t, int *);
typedef int (*retain_fn)(void **, int);
typedef int (*set_fn)(void *);
typedef int (*create_fn)(void **, unsigned);
typedef int (*destroy_fn)(void *);
typedef int (*count_fn)(void);

static void *fake; /* the fake driver, loaded by gpuipc */

static void *sym(const char *name)
{
  void *p = dlsym(fake, name);
  if (p == NULL)
    TFAIL("the fake driver has no %s", name);
  return p;
}

static void *entry(const char *name)
{
  gpa_fn gpa = (gpa_fn)sym("cuGetProcAddress_v2");
  void *fn = NULL;
  int st = 0;
  ASSERT_EQ(gpa(name, &fn, 12000, 0, &st), 0);
  ASSERT_TRUE(fn != NULL);
  return fn;
}

/* The stream HANDLE names; the primary context made current for CUR 1. */
static void *stream_of(const char *handle, int cur)
{
  void *ctx = NULL;
  set_fn set = (set_fn)entry("cuCtxSetCurrent");
  ASSERT_EQ(((retain_fn)entry("cuDevicePrimaryCtxRetain"))(&ctx, 0), 0);
  ASSERT_EQ(set(ctx), 0);
  void *s = NULL;
  if (strcmp(handle, "legacy") == 0)
    s = (void *)(uintptr_t)0x1; /* CU_STREAM_LEGACY */
  else if (strcmp(handle, "per-thread") == 0)
    s = (void *)(uintptr_t)0x2; /* CU_STREAM_PER_THREAD */
  else if (strcmp(handle, "created") == 0)
    ASSERT_EQ(((create_fn)entry("cuStreamCreate"))(&s, 0x1), 0);
  else if (strcmp(handle, "null") != 0)
    TFAIL("unknown stream handle %s", handle);
  if (!cur)
    ASSERT_EQ(set(NULL), 0);
  return s;
}

static void sender(gpuipc_channel_t *ch, void *stream, int lag, long n)
{
  gpuipc_buf_t *buf;
  ASSERT_OK(gpuipc_buf_alloc(BYTES, GPUIPC_KIND_LEGACY, 0, 0, &buf));
  uint8_t *dev = gpuipc_buf_ptr(buf);
  uint8_t *src = malloc(BYTES);
  ASSERT_TRUE(src != NULL);
  int64_t shape[1] = {BYTES};
  gpuipc_tensor_t t = {.dl = {.data = dev,
                              .device = {GPUIPC_DL_CUDA, 0},
                              .ndim = 1,
                              .dtype = {GPUIPC_DL_UINT, 8, 1},
                              .shape = shape},
                       .buf = buf};
  uint64_t ticket = 0;
  for (long i = 1; i <= n; i++) {
    /* The copy of message i - 1 has run: the receiver read it. */
    test_fill(src, BYTES, (uint64_t)i);
    if (lag)
      ASSERT_OK(gpuipc__memcpy_async(dev, src, BYTES, 0, stream));
    else
      ASSERT_OK(gpuipc_memcpy(dev, src, BYTES, 0, stream));
    ASSERT_OK(gpuipc_channel_send(ch, &t, stream, 0, &ticket));
    ASSERT_OK(gpuipc_channel_send_wait(ch, ticket, stream, 30000));
  }
  const char *rw = getenv("GPUIPC_CHAN_READY_WORDS");
  if (lag && (rw == NULL || strcmp(rw, "0") != 0)) {
    /* The last release's word lands by itself (20 ms): once it has, the
     * message is free, and free means out of the count in flight. */
    ASSERT_OK(gpuipc_channel_send_done(ch, ticket, 30000));
    gpuipc_channel_info_t info = {.size = sizeof(info)};
    ASSERT_OK(gpuipc_channel_info(ch, &info));
    ASSERT_EQ_U(info.in_flight, 0);
  }
  /* The last release's word is written when the receiver synchronises
   * its stream, which it does on this message (host memory: nothing for
   * either stream): our stream's wait on the word is queued by now. */
  gpuipc_buf_t *hbuf;
  ASSERT_OK(gpuipc_buf_alloc(BYTES, GPUIPC_KIND_HOST, -1, 0, &hbuf));
  gpuipc_tensor_t done = t;
  done.dl.data = gpuipc_buf_ptr(hbuf);
  done.dl.device = (gpuipc_dl_device_t){GPUIPC_DL_CPU, 0};
  done.buf = hbuf;
  uint64_t dt;
  ASSERT_OK(gpuipc_channel_send(ch, &done, NULL, 0, &dt));
  ASSERT_OK(gpuipc__stream_sync(0, stream));
  /* Closing before the receiver gave it back would leave it no one to
   * give it to. */
  ASSERT_OK(gpuipc_channel_send_done(ch, dt, 30000));
  ASSERT_OK(gpuipc_buf_release(hbuf));
  ASSERT_OK(gpuipc_buf_release(buf));
  free(src);
}

static void receiver(gpuipc_channel_t *ch, void *stream, int lag, long n)
{
  uint8_t *dst = malloc(BYTES), *seen = malloc(BYTES);
  ASSERT_TRUE(dst != NULL && seen != NULL);
  for (long i = 1; i <= n; i++) {
    gpuipc_tensor_t *v;
    ASSERT_OK(gpuipc_channel_recv(ch, &v, stream, 30000));
    ASSERT_EQ(v->dl.device.device_type, GPUIPC_DL_CUDA);
    ASSERT_EQ(v->dl.device.device_id, 0);
    ASSERT_EQ(v->dl.ndim, 1);
    ASSERT_EQ(v->dl.shape[0], BYTES);
    const uint8_t *p = (const uint8_t *)v->dl.data + v->dl.byte_offset;
    memset(dst, 0, BYTES);
    /* On the stream: after the sender's copy only if it waited. */
    ASSERT_OK(gpuipc_memcpy(dst, p, BYTES, 0, stream));
    size_t bad = test_check(dst, BYTES, (uint64_t)i);
    if (bad != (size_t)-1)
      TFAIL("message %ld: byte %zu of %d differs (read before the "
            "sender's copy?)", i, bad, BYTES);
    /* The read queued before the last release ran with that sync. */
    if (lag && i > 1 && (bad = test_check(seen, BYTES, (uint64_t)i - 1)) !=
                            (size_t)-1)
      TFAIL("message %ld: byte %zu of the read queued before its release "
            "differs", i - 1, bad);
    if (lag)
      ASSERT_OK(gpuipc__memcpy_async(seen, p, BYTES, 0, stream));
    ASSERT_OK(gpuipc_tensor_release(v, stream));
  }
  /* The sender's stream waits for the last release's word, which this
   * process's stream writes (only now: the fake's writes do not run by
   * themselves within the test, FAKE_CUDA_COPY_LAG_US), once the sender
   * has queued that wait and sent the host message that says so. */
  gpuipc_tensor_t *v;
  ASSERT_OK(gpuipc_channel_recv(ch, &v, stream, 30000));
  ASSERT_EQ(v->dl.device.device_type, GPUIPC_DL_CPU);
  ASSERT_OK(gpuipc__stream_sync(0, stream));
  ASSERT_OK(gpuipc_tensor_release(v, NULL));
  ASSERT_RC(gpuipc_channel_recv(ch, &v, stream, 30000), GPUIPC_E_PEER_GONE);
  if (lag) {
    size_t bad = test_check(seen, BYTES, (uint64_t)n);
    if (bad != (size_t)-1)
      TFAIL("message %ld: byte %zu of the last read differs", n, bad);
  }
  free(dst);
  free(seen);
}

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc != 8)
    TFAIL("usage: chan_stream_peer send|recv DOMAIN CHANNEL "
          "null|legacy|per-thread|created idle|lag N 0|1");
  bool send = strcmp(argv[1], "send") == 0;
  const char *handle = argv[4];
  bool lag = strcmp(argv[5], "lag") == 0;
  long n = strtol(argv[6], NULL, 0);
  int cur = atoi(argv[7]);
  ASSERT_OK(gpuipc_driver_status(NULL));
  fake = dlopen(getenv("GPUIPC_CUDA_LIB"), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_TRUE(fake != NULL);
  void *stream = stream_of(handle, cur);

  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join(argv[2], NULL, &dom));
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.timeout_ms = 30000;
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, argv[3], &o, &ch));
  count_fn records = (count_fn)sym("fake_cuda_events_recorded");
  count_fn waits = (count_fn)sym("fake_cuda_stream_waits");
  count_fn wwrites = (count_fn)sym("fake_cuda_word_writes");
  count_fn wwaits = (count_fn)sym("fake_cuda_word_waits");
  int r0 = records(), w0 = waits(), ww0 = wwrites(), wt0 = wwaits();
  if (send)
    sender(ch, stream, lag, n);
  else
    receiver(ch, stream, lag, n);
  int r = records() - r0, w = waits() - w0;
  int ww = wwrites() - ww0, wt = wwaits() - wt0;
  int on = ((int (*)(void *))sym("fake_cuda_word_writes_on"))(stream);
  printf("%s %s %s cur=%d: %d events recorded, %d event waits, %d words "
         "written (%d on its stream), %d word waits\n", argv[1], handle,
         argv[5], cur, r, w, ww, on, wt);
  /* Releases carry words; sends carry ready words (GPUIPC_CHAN_READY_WORDS
   * unset or 1: the sender's stream writes one, the receiver's waits on
   * it), or events (0). */
  const char *rw = getenv("GPUIPC_CHAN_READY_WORDS");
  bool words = rw == NULL || strcmp(rw, "0") != 0;
  /* The receiver: an event for each release, which gpuipc's stream waits
   * on before it writes the word; with events, a wait for each send. */
  ASSERT_EQ(r, lag ? (send ? (words ? 0 : n) : n) : 0);
  ASSERT_EQ(w, lag && !send ? (words ? n : 2 * n) : 0);
  ASSERT_EQ(ww, lag ? (send ? (words ? n : 0) : n) : 0);
  /* Ready words on the sender's stream; release words never on the
   * receiver's. */
  ASSERT_EQ(on, lag && send && words ? n : 0);
  if (lag && words) {
    /* A word lands by itself 20 ms after it was queued: a wait for it
     * that comes later (a process held up that long) finds it written
     * and needs none. */
    ASSERT_TRUE(wt >= 1 && wt <= n);
  } else {
    ASSERT_EQ(wt, lag && send ? n : 0);
  }
  ASSERT_OK(gpuipc_channel_close(ch));
  ASSERT_OK(gpuipc_domain_leave(dom));
  if (strcmp(handle, "created") == 0) {
    set_fn set = (set_fn)entry("cuCtxSetCurrent");
    void *ctx = NULL;
    ASSERT_EQ(((retain_fn)entry("cuDevicePrimaryCtxRetain"))(&ctx, 0), 0);
    ASSERT_EQ(set(ctx), 0);
    ASSERT_EQ(((destroy_fn)entry("cuStreamDestroy"))(stream), 0);
  }
  return 0;
}
