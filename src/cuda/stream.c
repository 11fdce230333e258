/*
 * Stream glue for the channels: which device a stream belongs to, whether
 * it is idle, making it wait for an event (polling briefly first), a copy
 * queued on it, and words written or waited for on it; with the stubs of a
 * build without CUDA. Declared in cuda.h.
 */
#include "cuda/cuda.h"
#include "os/os.h"

#include <pthread.h>
#include <stdbool.h>

#if GPUIPC_HAVE_CUDA
/*
 * The local ordinal whose primary context @stream belongs to; @fallback
 * for a default stream (NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD: that
 * of the primary context of the device that uses the data, whatever
 * context is current) or when the driver cannot say. A stream of another
 * context gives its device, and the event calls then refuse it with a
 * sentence.
 */
int gpuipc__stream_dev(void *stream, int fallback)
{
  /* A created stream means CUDA is in use: load it for gpuipc too (HOST
   * work alone may not have). */
  if (gpuipc__stream_is_default(stream) || gpuipc__cuda_load() != 0 ||
      gpuipc__cu.cuStreamGetCtx == NULL)
    return fallback;
  CUcontext sc = NULL;
  if (gpuipc__cu.cuStreamGetCtx((CUstream)stream, &sc) != CUDA_SUCCESS ||
      sc == NULL)
    return fallback;
  int n = gpuipc__dev_count();
  for (int i = 0; i < n; i++)
    if (__atomic_load_n(&gpuipc__dev_get(i)->primary, __ATOMIC_ACQUIRE) ==
        sc)
      return i;
  /* A context gpuipc has not retained: ask it for its device. */
  CUcontext cur = NULL;
  CUdevice cd;
  int dev = fallback;
  if (gpuipc__cu.cuCtxGetCurrent(&cur) != CUDA_SUCCESS)
    return fallback;
  if (gpuipc__cu.cuCtxSetCurrent(sc) == CUDA_SUCCESS &&
      gpuipc__cu.cuCtxGetDevice(&cd) == CUDA_SUCCESS) {
    int i = gpuipc__dev_ordinal(cd);
    dev = i >= 0 ? i : fallback;
  }
  gpuipc__cu.cuCtxSetCurrent(cur);
  return dev;
}

/*
 * Make @stream (a default stream: that of the event's device) wait for
 * @ev, unless its last record has completed already or completes
 * within @poll_ns: then the stream gets nothing to wait for and stays
 * idle, so that a release after it needs no event either.
 */
int gpuipc__stream_wait_event(gpuipc_event_t *ev, void *stream,
                              uint64_t poll_ns)
{
  int q = gpuipc_event_query(ev);
  if (q == -EAGAIN && poll_ns > 0) {
    uint64_t end = gpuipc__now_ns() + poll_ns;
    while (q == -EAGAIN && gpuipc__now_ns() < end)
      q = gpuipc_event_query(ev);
  }
  if (q == 0)
    return 0;
  if (q != -EAGAIN)
    return q;
  return gpuipc_event_wait(ev, stream);
}

/*
 * Whether everything queued on @stream (a stream of device @dev) has
 * completed. Then a message or a release needs no event: what it orders
 * after is done already, and the peer has nothing to wait for. Asked in
 * the device's primary context, where a default stream (NULL, legacy,
 * per-thread: the calling thread's) is the one the event calls use.
 */
bool gpuipc__stream_idle(int dev, void *stream)
{
  if (dev < 0 || gpuipc__cu.cuStreamQuery == NULL)
    return false;
  struct gpuipc__ctx_saved saved;
  if (gpuipc__ctx_enter(dev, &saved) != 0)
    return false;
  CUresult r = gpuipc__cu.cuStreamQuery((CUstream)stream);
  gpuipc__ctx_leave(&saved);
  return r == CUDA_SUCCESS;
}

int gpuipc__stream_copy_async(int dev, void *dst, const void *src, size_t n,
                              void *stream, bool d2d)
{
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(dev, &saved);
  if (rc != 0)
    return rc;
  CUdeviceptr d = (CUdeviceptr)(uintptr_t)dst, s = (CUdeviceptr)(uintptr_t)src;
  if (d2d && gpuipc__cu.cuMemcpyDtoDAsync != NULL)
    rc = GPUIPC_CU(cuMemcpyDtoDAsync, d, s, n, (CUstream)stream);
  else
    rc = GPUIPC_CU(cuMemcpyAsync, d, s, n, (CUstream)stream);
  gpuipc__ctx_leave(&saved);
  return rc;
}

int gpuipc__word_dev(int dev, void *host, uint64_t *addr)
{
  if (gpuipc__cu.cuStreamWriteValue64 == NULL ||
      gpuipc__cu.cuStreamWaitValue64 == NULL)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED, "the CUDA driver has no "
                       "64-bit stream memory operations");
  const struct gpuipc__dev *d = gpuipc__dev_get(dev);
  int ok = 0;
  if (d == NULL ||
      gpuipc__cu.cuDeviceGetAttribute(
          &ok, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
          d->cu_dev) != CUDA_SUCCESS ||
      !ok)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED, "device %d has no 64-bit "
                       "stream memory operations", dev);
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(dev, &saved);
  if (rc != 0)
    return rc;
  CUdeviceptr p = 0;
  if (gpuipc__cu.cuMemHostGetDevicePointer(&p, host, 0) != CUDA_SUCCESS ||
      p == 0)
    rc = gpuipc__err(GPUIPC_E_UNSUPPORTED, "host memory at %p is not "
                     "registered for device %d", host, dev);
  gpuipc__ctx_leave(&saved);
  if (rc == 0)
    *addr = (uint64_t)p;
  return rc;
}

/* Queue a write of @value to @addr on @stream, or (@wait) a wait for it. */
static int word_op(int dev, void *stream, uint64_t addr, uint64_t value,
                   bool wait)
{
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(dev, &saved);
  if (rc != 0)
    return rc;
  if (wait)
    rc = GPUIPC_CU(cuStreamWaitValue64, (CUstream)stream, (CUdeviceptr)addr,
                   value, CU_STREAM_WAIT_VALUE_GEQ);
  else
    rc = GPUIPC_CU(cuStreamWriteValue64, (CUstream)stream, (CUdeviceptr)addr,
                   value, CU_STREAM_WRITE_VALUE_DEFAULT);
  gpuipc__ctx_leave(&saved);
  return rc;
}

int gpuipc__stream_word_write(int dev, void *stream, uint64_t addr,
                              uint64_t value)
{
  return word_op(dev, stream, addr, value, false);
}

int gpuipc__stream_word_wait(int dev, void *stream, uint64_t addr,
                             uint64_t value)
{
  return word_op(dev, stream, addr, value, true);
}

/*
 * Per device: streams of gpuipc's own that work after a caller's stream's
 * work (a word written after it, a batch of copies the caller's stream
 * cannot take), and the events that order the two (made on first use,
 * kept for the process). Each caller's stream gets one of its own, so
 * that a word waiting behind one stream's long kernel holds up no other
 * stream's; past ASIDES streams on a device, streams share them (by their
 * handle: in order still, only no longer independent).
 */
#define ASIDES 8

static struct aside {
  pthread_mutex_t lock;
  bool claimed;
  void *key; /* the caller's stream it was claimed for */
  CUstream s;
  CUevent ev, back;
} asides[GPUIPC__DEV_SLOTS][ASIDES] = {
    [0 ... GPUIPC__DEV_SLOTS - 1] = {
        [0 ... ASIDES - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER}}};

static pthread_mutex_t pick_lock = PTHREAD_MUTEX_INITIALIZER;

/* The aside of @stream on device @dev (claimed for it if one is free). */
static struct aside *aside_pick(int dev, void *stream)
{
  struct aside *row = asides[dev], *free_one = NULL;
  pthread_mutex_lock(&pick_lock);
  for (int i = 0; i < ASIDES; i++) {
    if (row[i].claimed && row[i].key == stream) {
      pthread_mutex_unlock(&pick_lock);
      return &row[i];
    }
    if (!row[i].claimed && free_one == NULL)
      free_one = &row[i];
  }
  if (free_one != NULL) {
    free_one->claimed = true;
    free_one->key = stream;
  }
  pthread_mutex_unlock(&pick_lock);
  if (free_one != NULL)
    return free_one;
  uintptr_t h = (uintptr_t)stream;
  h ^= h >> 17;
  return &row[(h * 0x9e3779b97f4a7c15ull >> 61) % ASIDES];
}

static int aside_get(struct aside *a)
{
  if (a->s != NULL)
    return 0;
  CUstream s;
  CUevent ev, back;
  int rc = GPUIPC_CU(cuStreamCreate, &s, CU_STREAM_NON_BLOCKING);
  if (rc != 0)
    return rc;
  rc = GPUIPC_CU(cuEventCreate, &ev, CU_EVENT_DISABLE_TIMING);
  if (rc == 0) {
    rc = GPUIPC_CU(cuEventCreate, &back, CU_EVENT_DISABLE_TIMING);
    if (rc != 0)
      gpuipc__cu.cuEventDestroy(ev);
  }
  if (rc != 0) {
    gpuipc__cu.cuStreamDestroy(s);
    return rc;
  }
  a->s = s;
  a->ev = ev;
  a->back = back;
  return 0;
}

/*
 * Run @fn on device @dev's aside stream after the work queued on @stream;
 * with @join, @stream's later work also waits for what @fn queued.
 */
static int on_aside(int dev, void *stream, bool join,
                    int (*fn)(CUstream aside, void *arg), void *arg)
{
  if (dev < 0 || dev >= GPUIPC__DEV_SLOTS)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED, "device %d: no aside stream",
                       dev);
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(dev, &saved);
  if (rc != 0)
    return rc;
  struct aside *a = aside_pick(dev, stream);
  pthread_mutex_lock(&a->lock);
  rc = aside_get(a);
  /* An event's state is taken by the wait at once: reused next call. */
  if (rc == 0)
    rc = GPUIPC_CU(cuEventRecord, a->ev, (CUstream)stream);
  if (rc == 0)
    rc = GPUIPC_CU(cuStreamWaitEvent, a->s, a->ev, 0);
  if (rc == 0)
    rc = fn(a->s, arg);
  if (rc == 0 && join)
    rc = GPUIPC_CU(cuEventRecord, a->back, a->s);
  if (rc == 0 && join)
    rc = GPUIPC_CU(cuStreamWaitEvent, (CUstream)stream, a->back, 0);
  pthread_mutex_unlock(&a->lock);
  gpuipc__ctx_leave(&saved);
  return rc;
}

struct word_arg {
  int n;
  const uint64_t *addr, *value;
};

static int word_fn(CUstream s, void *arg)
{
  const struct word_arg *w = arg;
  int rc = 0;
  for (int i = 0; i < w->n && rc == 0; i++)
    rc = GPUIPC_CU(cuStreamWriteValue64, s, (CUdeviceptr)w->addr[i],
                   w->value[i], CU_STREAM_WRITE_VALUE_DEFAULT);
  return rc;
}

int gpuipc__stream_word_write_after(int dev, void *stream, uint64_t addr,
                                    uint64_t value)
{
  return gpuipc__stream_words_write_after(dev, stream, 1, &addr, &value);
}

int gpuipc__stream_words_write_after(int dev, void *stream, int n,
                                     const uint64_t *addr,
                                     const uint64_t *value)
{
  struct word_arg w = {n, addr, value};
  return on_aside(dev, stream, false, word_fn, &w);
}

int gpuipc__stream_aside_run(int dev, void *stream,
                             int (*fn)(void *aside, void *arg), void *arg)
{
  return on_aside(dev, stream, true, (int (*)(CUstream, void *))fn, arg);
}
#else
int gpuipc__stream_dev(void *stream, int fallback)
{
  return fallback;
}

bool gpuipc__stream_idle(int dev, void *stream)
{
  return false;
}

int gpuipc__stream_wait_event(gpuipc_event_t *ev, void *stream,
                              uint64_t poll_ns)
{
  return gpuipc_event_wait(ev, stream);
}

int gpuipc__stream_copy_async(int dev, void *dst, const void *src, size_t n,
                              void *stream, bool d2d)
{
  return gpuipc__err(GPUIPC_E_UNSUPPORTED, "channel: this build has no CUDA "
                     "support for device copies");
}

int gpuipc__word_dev(int dev, void *host, uint64_t *addr)
{
  return GPUIPC_E_UNSUPPORTED;
}

int gpuipc__stream_word_write(int dev, void *stream, uint64_t addr,
                              uint64_t value)
{
  return GPUIPC_E_UNSUPPORTED;
}

int gpuipc__stream_word_wait(int dev, void *stream, uint64_t addr,
                             uint64_t value)
{
  return GPUIPC_E_UNSUPPORTED;
}

int gpuipc__stream_word_write_after(int dev, void *stream, uint64_t addr,
                                    uint64_t value)
{
  return GPUIPC_E_UNSUPPORTED;
}

int gpuipc__stream_words_write_after(int dev, void *stream, int n,
                                     const uint64_t *addr,
                                     const uint64_t *value)
{
  return GPUIPC_E_UNSUPPORTED;
}

int gpuipc__stream_aside_run(int dev, void *stream,
                             int (*fn)(void *aside, void *arg), void *arg)
{
  return GPUIPC_E_UNSUPPORTED;
}
#endif
