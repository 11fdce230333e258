/*
 * The fake CUDA driver's copies, streams and events, interprocess events
 * included (fake_cuda_int.h lists its files).
 */
#include "fake_cuda_int.h"

/* ---- copies, streams and events ------------------------------------------
 *
 * "Device memory" is host memory: a CUdeviceptr is a host address. A copy
 * queued with cuMemcpyAsync is not made at once: it waits, in order, in
 * its stream's queue until something shows it done. An event recorded on
 * a stream marks the work queued there before it; cuEventQuery answers
 * CUDA_ERROR_NOT_READY until that work is done, and does it (every copy
 * up to the mark, in order) on its FAKE_CUDA_COPY_LAG-th query since the
 * record (default 1: the first) once FAKE_CUDA_COPY_LAG_US microseconds
 * have passed since the record (default 0). cuStreamQuery does the same
 * for all the stream's work, counting its queries since the last work
 * queued. cuEventSynchronize, cuStreamSynchronize and cuMemcpy do the
 * work at once. So code that reads a copy's destination, or writes its
 * source, before an event or a synchronisation said the copy is over sees
 * the old bytes, or has the new ones copied: as on a GPU whose copies lag.
 *
 * Streams: NULL and CU_STREAM_LEGACY are the legacy stream of the current
 * context, CU_STREAM_PER_THREAD the calling thread's stream of the current
 * context (each made on first use); cuStreamCreate makes others, which
 * belong to the context current then. (The legacy stream's implicit
 * synchronisation with blocking streams is not modelled.)
 *
 * cuStreamWaitEvent queues a wait: the stream's later work is done only
 * after the event's work. An interprocess event keeps its state in a
 * shared page (its generation: records so far, and the generation done);
 * another process opens it through the pid and fd numbers in its
 * CUipcEventHandle. A process waiting for another's event asks that
 * process to do the work by ringing its doorbell (a shared page the
 * exporter's service thread sleeps on, by futex): a query counts as a
 * query there (the exporter applies its own FAKE_CUDA_COPY_LAG), a
 * synchronisation asks for the work at once and sleeps until it is done.
 * cuEventRecord and cuStreamWaitEvent calls are counted
 * (fake_cuda_events_recorded, fake_cuda_stream_waits).
 *
 * Stream memory operations: cuStreamWriteValue64 queues a write of a
 * 64-bit word, done in its stream's order like a copy; a stream with such
 * a write queued runs by itself, as a GPU does (the service thread does
 * its work up to the write within 100 us of FAKE_CUDA_COPY_LAG_US having
 * passed since it was queued), since another process may be reading the
 * word rather than waiting on an event. cuStreamWaitValue64 (GEQ only)
 * queues a wait for a word to reach a value: the stream's later work is
 * done only after it; a synchronisation polls the word. Both are counted
 * (fake_cuda_word_writes, fake_cuda_word_waits), writes also per stream
 * (fake_cuda_word_writes_on). A stream whose next work is a wait for
 * another stream of this process followed by writes (gpuipc's own stream
 * writing a word after the caller's work) does those writes as soon as
 * the other stream's work up to the wait is done, however that came
 * about, as a GPU would.
 *
 * The bench's kernels (fake_kernel.c) are queued as calls (OP_CALL) of
 * a function that does their work, in the stream's order like a copy.
 *
 * gpuipc's copy kernel (fake_kernel.c) is queued as a copy followed by a
 * write of its word, which runs by itself as above; the copy checks that
 * the kernel's counter is 0 when it starts, as the kernel needs
 * (fake_cuda_kernel_faults counts those that were not).
 *
 * CUDA leaves any use of an opened event undefined once its exporter
 * destroyed it (on an H100 a stream wait on one waits for ever). The
 * exporter's cuEventDestroy marks the shared page; opening, querying,
 * synchronising or waiting on it after that is counted
 * (fake_cuda_dead_event_uses) and fails with CUDA_ERROR_INVALID_HANDLE.
 * (A wait queued before the destroy is done as usual.)
 *
 * One lock over all of it.
 */
enum op_kind {
  OP_COPY,
  OP_WAIT_LOCAL,
  OP_WAIT_REMOTE,
  OP_WRITE,
  OP_WAIT_WORD,
  OP_CALL
};

struct fake_stream;
struct ipc_page;

struct stream_op {
  enum op_kind kind;
  uint8_t *dst; /* OP_COPY */
  const uint8_t *src;
  size_t n;
  _Atomic uint32_t *count; /* OP_COPY of the copy kernel: its counter */
  struct fake_stream *ws; /* OP_WAIT_LOCAL: until ws->done >= wmark */
  uint64_t wmark;
  struct ipc_page *page; /* OP_WAIT_REMOTE: until page->done >= gen */
  struct ipc_page *bell;
  uint32_t gen;
  /* OP_WRITE: *word = value; OP_WAIT_WORD: until *word >= value. */
  _Atomic uint64_t *word;
  uint64_t value;
  int64_t at_ns; /* OP_WRITE: when it was queued */
  void (*call)(const uint64_t a[4]); /* OP_CALL: call(a) */
  uint64_t a[4];
};

#define FAKE_STREAMS 32

enum stream_kind { ST_LEGACY = 1, ST_PER_THREAD, ST_CREATED };

struct fake_stream {
  enum stream_kind kind; /* 0: unused */
  CUcontext ctx;
  const void *thread; /* ST_PER_THREAD: whose */
  struct stream_op *ops; /* not yet done: ops[start..len) */
  size_t start, len, cap;
  uint64_t queued, done; /* work queued and done, ever */
  int queries;           /* cuStreamQuery calls since work was queued */
  struct timespec at;    /* when work was last queued */
  int word_writes;       /* cuStreamWriteValue64 calls on it */
  bool running;          /* in stream_run now (writers_run leaves it) */
};

/* A shared page: an interprocess event's state, or a doorbell. */
struct ipc_page {
  _Atomic uint32_t gen;      /* records so far; the bell: rings */
  _Atomic uint32_t done;     /* the generation whose work is done */
  _Atomic uint32_t queries;  /* by other processes, since the record */
  _Atomic uint32_t sync_req; /* a generation someone waits on */
  _Atomic int64_t at_ns;     /* CLOCK_MONOTONIC of the record */
  _Atomic uint32_t destroyed; /* by its exporter */
};
#define PAGE 4096

struct CUevent_st {
  unsigned flags;
  struct fake_stream *s; /* NULL: never recorded (complete) */
  uint64_t mark;         /* s->queued when recorded */
  int queries;           /* since the record */
  struct timespec at;    /* of the record */
  /* Interprocess: */
  struct ipc_page *page; /* shared state; NULL for a local event */
  struct ipc_page *bell; /* opened: the exporter's doorbell */
  int page_fd;           /* ours: the page's memfd */
  bool opened;           /* by cuIpcOpenEventHandle */
  uint32_t gen;          /* ours: generation of the last record */
  struct CUevent_st *next; /* our interprocess events */
};

static pthread_mutex_t work_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fake_stream streams[FAKE_STREAMS];
static struct CUevent_st *ipc_events; /* ours, interprocess */
static struct ipc_page *bell;         /* ours */
static int bell_fd = -1;
static atomic_int copies_done;
static atomic_int not_ready;
static atomic_int events_recorded;
static atomic_int stream_waits;
static atomic_int dead_event_uses;
static atomic_int writes_pending; /* OP_WRITEs queued, not yet done */
static atomic_int kernel_faults;  /* copy kernels run with a counter not 0 */
static __thread char thread_anchor; /* its address names the thread */

/* Whether opened event @ev's exporter destroyed it (counted: a use). */
static bool dead_use(const struct CUevent_st *ev)
{
  if (!ev->opened || atomic_load(&ev->page->destroyed) == 0)
    return false;
  atomic_fetch_add(&dead_event_uses, 1);
  return true;
}

static bool is_special(CUstream h)
{
  return h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD;
}

/* The stream @h means now, a default one made on first use; NULL when
 * there is no such stream, or no current context for a default one.
 * work_lock held. */
static struct fake_stream *stream_of(CUstream h)
{
  if (!is_special(h)) {
    for (int i = 0; i < FAKE_STREAMS; i++)
      if (streams[i].kind == ST_CREATED && h == (CUstream)&streams[i])
        return &streams[i];
    return NULL;
  }
  if (fake_current == NULL)
    return NULL;
  enum stream_kind k = h == CU_STREAM_PER_THREAD ? ST_PER_THREAD : ST_LEGACY;
  const void *t = k == ST_PER_THREAD ? &thread_anchor : NULL;
  struct fake_stream *fresh = NULL;
  for (int i = 0; i < FAKE_STREAMS; i++) {
    struct fake_stream *s = &streams[i];
    if (s->kind == k && s->ctx == fake_current && s->thread == t)
      return s;
    if (s->kind == 0 && fresh == NULL)
      fresh = s;
  }
  if (fresh != NULL) {
    fresh->kind = k;
    fresh->ctx = fake_current;
    fresh->thread = t;
  }
  return fresh;
}

static CUresult stream_error(CUstream h)
{
  return is_special(h) && fake_current == NULL ? CUDA_ERROR_INVALID_CONTEXT
                                          : CUDA_ERROR_INVALID_HANDLE;
}

static long futex(_Atomic uint32_t *a, int op, uint32_t v,
                  const struct timespec *ts)
{
  return syscall(SYS_futex, (uint32_t *)a, op, v, ts, NULL, 0);
}

static bool gen_done(struct ipc_page *p, uint32_t gen)
{
  return (int32_t)(atomic_load(&p->done) - gen) >= 0;
}

/* Tell the exporter of @page (whose doorbell is @b) that someone waits. */
static void ring(struct ipc_page *b)
{
  atomic_fetch_add(&b->gen, 1);
  futex(&b->gen, FUTEX_WAKE, INT32_MAX, NULL);
}

/* Mark done our interprocess events whose work @s has done. */
static void publish(struct fake_stream *s)
{
  for (struct CUevent_st *e = ipc_events; e != NULL; e = e->next)
    if (e->s == s && s->done >= e->mark && !gen_done(e->page, e->gen)) {
      atomic_store(&e->page->done, e->gen);
      futex(&e->page->done, FUTEX_WAKE, INT32_MAX, NULL);
    }
}

static void writers_run(struct fake_stream *s);

/*
 * Do the work of @s up to number @mark, in order, as far as it can go: a
 * wait for another process's event that is not done stops it (*@blocked
 * says which). work_lock held.
 */
static void stream_run(struct fake_stream *s, uint64_t mark,
                       struct stream_op *blocked)
{
  bool outer = !s->running;
  s->running = true;
  while (s->done < mark && s->start < s->len) {
    struct stream_op *op = &s->ops[s->start];
    if (op->kind == OP_WAIT_LOCAL) {
      stream_run(op->ws, op->wmark, blocked);
      if (op->ws->done < op->wmark)
        break;
    } else if (op->kind == OP_WAIT_REMOTE) {
      if (!gen_done(op->page, op->gen)) {
        *blocked = *op;
        break;
      }
    } else if (op->kind == OP_WAIT_WORD) {
      if (atomic_load(op->word) < op->value) {
        *blocked = *op;
        break;
      }
    } else if (op->kind == OP_WRITE) {
      atomic_store(op->word, op->value);
    } else if (op->kind == OP_CALL) {
      op->call(op->a);
    } else {
      if (op->count != NULL && atomic_load(op->count) != 0)
        atomic_fetch_add(&kernel_faults, 1);
      if (op->n > 0)
        memmove(op->dst, op->src, op->n);
      atomic_fetch_add(&copies_done, 1);
    }
    s->start++;
    s->done++;
  }
  if (s->start == s->len)
    s->start = s->len = 0;
  if (outer)
    s->running = false;
  publish(s);
  writers_run(s);
}

/* The streams whose next work is a wait on @s that @s has now passed,
 * followed by writes: do the wait and the writes. work_lock held. */
static void writers_run(struct fake_stream *s)
{
  for (int i = 0; i < FAKE_STREAMS; i++) {
    struct fake_stream *t = &streams[i];
    if (t == s || t->kind == 0 || t->running || t->start >= t->len)
      continue;
    const struct stream_op *w = &t->ops[t->start];
    if (w->kind != OP_WAIT_LOCAL || w->ws != s || s->done < w->wmark ||
        t->start + 1 >= t->len || t->ops[t->start + 1].kind != OP_WRITE)
      continue;
    do {
      if (t->ops[t->start].kind == OP_WRITE)
        atomic_store(t->ops[t->start].word, t->ops[t->start].value);
      t->start++;
      t->done++;
    } while (t->start < t->len && t->ops[t->start].kind == OP_WRITE);
    if (t->start == t->len)
      t->start = t->len = 0;
    publish(t);
  }
}

/* Lazily, as a query does: a remote wait in the way counts as a query of
 * that event. work_lock held. */
static void stream_poke(struct fake_stream *s, uint64_t mark)
{
  struct stream_op blocked = {.page = NULL};
  stream_run(s, mark, &blocked);
  if (blocked.page != NULL) {
    atomic_fetch_add(&blocked.page->queries, 1);
    ring(blocked.bell);
  }
}

static void all_run(void)
{
  for (int i = 0; i < FAKE_STREAMS; i++)
    if (streams[i].kind != 0)
      stream_poke(&streams[i], streams[i].queued);
}

/* Ask for generation @gen of @page (exporter's doorbell @b) and sleep
 * until it is done, at most 60 s. */
static CUresult remote_sync(struct ipc_page *page, struct ipc_page *b,
                            uint32_t gen)
{
  for (int i = 0; i < 600 && !gen_done(page, gen); i++) {
    uint32_t req = atomic_load(&page->sync_req);
    while ((int32_t)(gen - req) > 0 &&
           !atomic_compare_exchange_weak(&page->sync_req, &req, gen))
      ;
    ring(b);
    uint32_t d = atomic_load(&page->done);
    struct timespec ts = {0, 100 * 1000000};
    if ((int32_t)(d - gen) < 0)
      futex(&page->done, FUTEX_WAIT, d, &ts);
  }
  return gen_done(page, gen) ? CUDA_SUCCESS : CUDA_ERROR_LAUNCH_TIMEOUT;
}

/* Wait (without the lock) until the word @op waits for has its value,
 * at most 60 s: another process's stream writes it. */
static CUresult word_sync(const struct stream_op *op)
{
  for (int i = 0; i < 600000 && atomic_load(op->word) < op->value; i++) {
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
  return atomic_load(op->word) >= op->value ? CUDA_SUCCESS
                                            : CUDA_ERROR_LAUNCH_TIMEOUT;
}

/* Do the work of @s up to @mark now, waiting for other processes' events
 * on the way (without the lock). */
static CUresult stream_sync(struct fake_stream *s, uint64_t mark)
{
  for (;;) {
    struct stream_op blocked = {.page = NULL};
    pthread_mutex_lock(&work_lock);
    stream_run(s, mark, &blocked);
    bool done = s->done >= mark;
    pthread_mutex_unlock(&work_lock);
    if (done)
      return CUDA_SUCCESS;
    if (blocked.kind == OP_WAIT_WORD) {
      CUresult r = word_sync(&blocked);
      if (r != CUDA_SUCCESS)
        return r;
      continue;
    }
    if (blocked.page == NULL)
      return CUDA_ERROR_UNKNOWN; /* cannot happen */
    CUresult r = remote_sync(blocked.page, blocked.bell, blocked.gen);
    if (r != CUDA_SUCCESS)
      return r;
  }
}

static long long usec_since(const struct timespec *t)
{
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (long long)(now.tv_sec - t->tv_sec) * 1000000 +
         (now.tv_nsec - t->tv_nsec) / 1000;
}

static int64_t now_ns(void)
{
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
}

static bool lag_over(int queries, long long usec)
{
  return queries >= env_int("FAKE_CUDA_COPY_LAG", 1) &&
         usec >= env_int("FAKE_CUDA_COPY_LAG_US", 0);
}

/* ---- the service thread: does our work that other processes wait on ---- */

struct sync_job {
  struct fake_stream *s;
  uint64_t mark;
};

/* Lazy work asked for by queries is done here; what waits for a
 * synchronisation goes to @jobs. work_lock held. */
static int serve_scan(struct sync_job *jobs, int max)
{
  int n = 0;
  for (struct CUevent_st *e = ipc_events; e != NULL; e = e->next) {
    struct ipc_page *p = e->page;
    if (e->s == NULL || gen_done(p, e->gen))
      continue;
    if ((int32_t)(atomic_load(&p->sync_req) - atomic_load(&p->done)) > 0) {
      if (n < max)
        jobs[n++] = (struct sync_job){e->s, e->mark};
    } else if (lag_over((int)atomic_load(&p->queries),
                        (now_ns() - atomic_load(&p->at_ns)) / 1000)) {
      stream_poke(e->s, e->mark);
    }
  }
  return n;
}

/* Run each stream up to its last write whose lag is over; whether any
 * write is left. work_lock held. */
static bool serve_writes(void)
{
  long long lag = env_int("FAKE_CUDA_COPY_LAG_US", 0);
  int64_t now = now_ns();
  int left = 0;
  for (int i = 0; i < FAKE_STREAMS; i++) {
    struct fake_stream *s = &streams[i];
    if (s->kind == 0)
      continue;
    uint64_t mark = 0;
    for (size_t k = s->start; k < s->len; k++)
      if (s->ops[k].kind == OP_WRITE &&
          (now - s->ops[k].at_ns) / 1000 >= lag)
        mark = s->done + (k - s->start) + 1;
    if (mark != 0)
      stream_poke(s, mark);
    for (size_t k = s->start; k < s->len; k++)
      left += s->ops[k].kind == OP_WRITE;
  }
  atomic_store(&writes_pending, left);
  return left > 0;
}

static void *serve(void *arg)
{
  (void)arg;
  uint32_t seen = atomic_load(&bell->gen);
  for (;;) {
    struct timespec tick = {0, 100000};
    futex(&bell->gen, FUTEX_WAIT, seen,
          atomic_load(&writes_pending) > 0 ? &tick : NULL);
    seen = atomic_load(&bell->gen);
    struct sync_job jobs[16];
    pthread_mutex_lock(&work_lock);
    int n = serve_scan(jobs, 16);
    serve_writes();
    pthread_mutex_unlock(&work_lock);
    for (int i = 0; i < n; i++)
      stream_sync(jobs[i].s, jobs[i].mark);
    if (n == 16)
      ring(bell); /* more to look at */
  }
  return NULL;
}

static pthread_once_t serve_once = PTHREAD_ONCE_INIT;
static CUresult serve_started = CUDA_ERROR_OUT_OF_MEMORY;

static void serve_start(void)
{
  int fd = memfd_create("fake_cuda_bell", MFD_CLOEXEC);
  if (fd < 0)
    return;
  void *m = ftruncate(fd, PAGE) == 0 ? fake_map_fd(fd, PAGE) : NULL;
  pthread_t t;
  if (m == NULL) {
    close(fd);
    return;
  }
  bell = m;
  bell_fd = fd;
  if (pthread_create(&t, NULL, serve, NULL) != 0)
    return;
  pthread_detach(t);
  serve_started = CUDA_SUCCESS;
}

/* ---- entry points ---- */

/* Queue @op on the stream @h. work_lock held. */
static CUresult enqueue(CUstream h, const struct stream_op *op)
{
  struct fake_stream *s = stream_of(h);
  if (s == NULL)
    return stream_error(h);
  if (s->len == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 64;
    struct stream_op *ops = realloc(s->ops, cap * sizeof(*ops));
    if (ops == NULL)
      return CUDA_ERROR_OUT_OF_MEMORY;
    s->ops = ops;
    s->cap = cap;
  }
  s->ops[s->len++] = *op;
  s->queued++;
  s->queries = 0;
  clock_gettime(CLOCK_MONOTONIC, &s->at);
  return CUDA_SUCCESS;
}

FAKE_HIDDEN CUresult fake_cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src,
                                   size_t n, CUstream h)
{
  NEED_INIT();
  if (fake_current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (n > 0 && (dst == 0 || src == 0))
    return CUDA_ERROR_INVALID_VALUE;
  struct stream_op op = {.kind = OP_COPY,
                         .dst = (uint8_t *)(uintptr_t)dst,
                         .src = (const uint8_t *)(uintptr_t)src,
                         .n = n};
  pthread_mutex_lock(&work_lock);
  CUresult r = enqueue(h, &op);
  pthread_mutex_unlock(&work_lock);
  return r;
}

FAKE_HIDDEN CUresult fake_stream_call(CUstream h,
                                      void (*fn)(const uint64_t a[4]),
                                      const uint64_t a[4])
{
  if (fake_current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  struct stream_op op = {.kind = OP_CALL, .call = fn};
  memcpy(op.a, a, sizeof(op.a));
  pthread_mutex_lock(&work_lock);
  CUresult r = enqueue(h, &op);
  pthread_mutex_unlock(&work_lock);
  return r;
}

FAKE_HIDDEN CUresult fake_cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src,
                                        size_t n, CUstream h)
{
  return fake_cuMemcpyAsync(dst, src, n, h);
}

#if CUDA_VERSION >= 13000
static atomic_int batch_copies;

/* As the driver documents it: not on the legacy stream, one attribute
 * for all, the copies queued in order (a real batch may run them in any
 * order: none of gpuipc's overlap). */
FAKE_HIDDEN CUresult fake_cuMemcpyBatchAsync(CUdeviceptr *dsts,
                                             CUdeviceptr *srcs,
                                             size_t *sizes, size_t count,
                                             CUmemcpyAttributes *attrs,
                                             size_t *attr_idxs,
                                             size_t nattrs, CUstream h)
{
  NEED_INIT();
  if (fake_current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (h == NULL || h == CU_STREAM_LEGACY || count == 0 || dsts == NULL ||
      srcs == NULL || sizes == NULL || nattrs == 0 || nattrs > count ||
      attrs == NULL || attr_idxs == NULL || attr_idxs[0] != 0)
    return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < nattrs; i++)
    if (attrs[i].srcAccessOrder == CU_MEMCPY_SRC_ACCESS_ORDER_INVALID)
      return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; i++)
    if (sizes[i] == 0 || dsts[i] == 0 || srcs[i] == 0)
      return CUDA_ERROR_INVALID_VALUE;
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&work_lock);
  for (size_t i = 0; i < count && r == CUDA_SUCCESS; i++) {
    struct stream_op op = {.kind = OP_COPY,
                           .dst = (uint8_t *)(uintptr_t)dsts[i],
                           .src = (const uint8_t *)(uintptr_t)srcs[i],
                           .n = sizes[i]};
    r = enqueue(h, &op);
  }
  pthread_mutex_unlock(&work_lock);
  if (r == CUDA_SUCCESS)
    atomic_fetch_add(&batch_copies, 1);
  return r;
}

int fake_cuda_batch_copies(void)
{
  return atomic_load(&batch_copies);
}
#else
int fake_cuda_batch_copies(void)
{
  return 0;
}
#endif

static atomic_int word_writes, word_waits;

/* Queue @op, then a write of @value to @addr, on @h (the write runs by
 * itself after its lag, see above). */
static CUresult enqueue_then_write(CUstream h, const struct stream_op *op,
                                   CUdeviceptr addr, uint64_t value)
{
  pthread_once(&serve_once, serve_start);
  if (serve_started != CUDA_SUCCESS)
    return serve_started;
  struct stream_op w = {.kind = OP_WRITE,
                        .word = (_Atomic uint64_t *)(uintptr_t)addr,
                        .value = value,
                        .at_ns = now_ns()};
  pthread_mutex_lock(&work_lock);
  CUresult r = op != NULL ? enqueue(h, op) : CUDA_SUCCESS;
  if (r == CUDA_SUCCESS)
    r = enqueue(h, &w); /* (a failure here leaves @op queued: no memory) */
  if (r == CUDA_SUCCESS)
    atomic_fetch_add(&writes_pending, 1);
  pthread_mutex_unlock(&work_lock);
  if (r == CUDA_SUCCESS)
    ring(bell); /* the service thread starts ticking */
  return r;
}

FAKE_HIDDEN CUresult fake_cuStreamWriteValue64(CUstream h, CUdeviceptr addr,
                                          cuuint64_t value, unsigned flags)
{
  NEED_INIT();
  if (addr == 0 || addr % 8 != 0 || flags != 0)
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = enqueue_then_write(h, NULL, addr, value);
  if (r == CUDA_SUCCESS) {
    atomic_fetch_add(&word_writes, 1);
    pthread_mutex_lock(&work_lock);
    struct fake_stream *s = stream_of(h);
    if (s != NULL)
      s->word_writes++;
    pthread_mutex_unlock(&work_lock);
  }
  return r;
}

FAKE_HIDDEN CUresult fake_stream_copy_word(CUstream h, CUdeviceptr dst,
                                           CUdeviceptr src, size_t n,
                                           CUdeviceptr count,
                                           CUdeviceptr word, uint64_t value)
{
  if (fake_current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  struct stream_op op = {.kind = OP_COPY,
                         .dst = (uint8_t *)(uintptr_t)dst,
                         .src = (const uint8_t *)(uintptr_t)src,
                         .n = n,
                         .count = (_Atomic uint32_t *)(uintptr_t)count};
  return enqueue_then_write(h, &op, word, value);
}

int fake_cuda_kernel_faults(void)
{
  return atomic_load(&kernel_faults);
}

FAKE_HIDDEN CUresult fake_cuStreamWaitValue64(CUstream h, CUdeviceptr addr,
                                         cuuint64_t value, unsigned flags)
{
  NEED_INIT();
  if (addr == 0 || addr % 8 != 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (flags != CU_STREAM_WAIT_VALUE_GEQ)
    return CUDA_ERROR_NOT_SUPPORTED;
  struct stream_op op = {.kind = OP_WAIT_WORD,
                         .word = (_Atomic uint64_t *)(uintptr_t)addr,
                         .value = value};
  pthread_mutex_lock(&work_lock);
  CUresult r = enqueue(h, &op);
  pthread_mutex_unlock(&work_lock);
  if (r == CUDA_SUCCESS)
    atomic_fetch_add(&word_waits, 1);
  return r;
}

int fake_cuda_word_writes(void)
{
  return atomic_load(&word_writes);
}

int fake_cuda_word_waits(void)
{
  return atomic_load(&word_waits);
}

int fake_cuda_word_writes_on(void *h)
{
  CUstream sh = (CUstream)h;
  int n = 0;
  pthread_mutex_lock(&work_lock);
  if (is_special(sh) && fake_current == NULL) {
    /* A default stream with no context current: that of every context. */
    enum stream_kind k =
        sh == CU_STREAM_PER_THREAD ? ST_PER_THREAD : ST_LEGACY;
    for (int i = 0; i < FAKE_STREAMS; i++)
      if (streams[i].kind == k &&
          (k != ST_PER_THREAD || streams[i].thread == &thread_anchor))
        n += streams[i].word_writes;
  } else {
    struct fake_stream *s = stream_of(sh);
    n = s != NULL ? s->word_writes : -1;
  }
  pthread_mutex_unlock(&work_lock);
  return n;
}

/* Synchronous: after the work queued before it, as on the legacy stream. */
FAKE_HIDDEN CUresult fake_cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
  NEED_INIT();
  if (fake_current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (n > 0 && (dst == 0 || src == 0))
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&work_lock);
  all_run();
  if (n > 0)
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
  pthread_mutex_unlock(&work_lock);
  return CUDA_SUCCESS;
}

/* cuMemcpyHtoD / cuMemcpyDtoH: after the legacy stream's work (another
 * process's included, as cuStreamSynchronize waits for it), as a
 * pageable copy is. */
static CUresult copy_after_legacy(void *dst, const void *src, size_t n)
{
  NEED_INIT();
  if (fake_current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  if (n > 0 && (dst == NULL || src == NULL))
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = fake_cuStreamSynchronize(CU_STREAM_LEGACY);
  if (r == CUDA_SUCCESS && n > 0)
    memmove(dst, src, n);
  return r;
}

FAKE_HIDDEN CUresult fake_cuMemcpyHtoD(CUdeviceptr dst, const void *src,
                                       size_t n)
{
  return copy_after_legacy((void *)(uintptr_t)dst, src, n);
}

FAKE_HIDDEN CUresult fake_cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n)
{
  return copy_after_legacy(dst, (const void *)(uintptr_t)src, n);
}

FAKE_HIDDEN CUresult fake_cuStreamCreate(CUstream *ph, unsigned int flags)
{
  NEED_INIT();
  if (ph == NULL || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
    return CUDA_ERROR_INVALID_VALUE;
  if (fake_current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&work_lock);
  for (int i = 0; i < FAKE_STREAMS; i++)
    if (streams[i].kind == 0) {
      streams[i].kind = ST_CREATED;
      streams[i].ctx = fake_current;
      streams[i].thread = NULL;
      *ph = (CUstream)&streams[i];
      r = CUDA_SUCCESS;
      break;
    }
  pthread_mutex_unlock(&work_lock);
  return r;
}

/* The work left runs first, as on a GPU (no waiting for other processes). */
FAKE_HIDDEN CUresult fake_cuStreamDestroy(CUstream h)
{
  NEED_INIT();
  if (is_special(h))
    return CUDA_ERROR_INVALID_HANDLE;
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&work_lock);
  struct fake_stream *s = stream_of(h);
  if (s != NULL) {
    stream_poke(s, s->queued);
    free(s->ops);
    memset(s, 0, sizeof(*s));
  } else {
    r = CUDA_ERROR_INVALID_HANDLE;
  }
  pthread_mutex_unlock(&work_lock);
  return r;
}

FAKE_HIDDEN CUresult fake_cuStreamGetCtx(CUstream h, CUcontext *pctx)
{
  NEED_INIT();
  if (pctx == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  if (is_special(h)) {
    if (fake_current == NULL)
      return CUDA_ERROR_INVALID_CONTEXT;
    *pctx = fake_current;
    return CUDA_SUCCESS;
  }
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&work_lock);
  struct fake_stream *s = stream_of(h);
  if (s != NULL)
    *pctx = s->ctx;
  else
    r = CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_unlock(&work_lock);
  return r;
}

FAKE_HIDDEN CUresult fake_cuStreamQuery(CUstream h)
{
  NEED_INIT();
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&work_lock);
  struct fake_stream *s = stream_of(h);
  if (s == NULL) {
    r = stream_error(h);
  } else if (s->done < s->queued) {
    if (lag_over(++s->queries, usec_since(&s->at)))
      stream_poke(s, s->queued);
    if (s->done < s->queued) {
      r = CUDA_ERROR_NOT_READY;
      atomic_fetch_add(&not_ready, 1);
    }
  }
  pthread_mutex_unlock(&work_lock);
  return r;
}

FAKE_HIDDEN CUresult fake_cuStreamSynchronize(CUstream h)
{
  NEED_INIT();
  pthread_mutex_lock(&work_lock);
  struct fake_stream *s = stream_of(h);
  uint64_t mark = s != NULL ? s->queued : 0;
  pthread_mutex_unlock(&work_lock);
  return s != NULL ? stream_sync(s, mark) : stream_error(h);
}

/* Every stream of the current context, as cuStreamSynchronize does each. */
FAKE_HIDDEN CUresult fake_cuCtxSynchronize(void)
{
  NEED_INIT();
  if (fake_current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  CUresult r = CUDA_SUCCESS;
  for (int i = 0; r == CUDA_SUCCESS && i < FAKE_STREAMS; i++) {
    pthread_mutex_lock(&work_lock);
    struct fake_stream *s = &streams[i];
    bool ours = s->kind != 0 && s->ctx == fake_current;
    uint64_t mark = s->queued;
    pthread_mutex_unlock(&work_lock);
    if (ours)
      r = stream_sync(s, mark);
  }
  return r;
}

FAKE_HIDDEN CUresult fake_cuStreamWaitEvent(CUstream h, CUevent ev,
                                       unsigned int flags)
{
  NEED_INIT();
  if (ev == NULL)
    return CUDA_ERROR_INVALID_HANDLE;
  if (flags != 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (dead_use(ev))
    return CUDA_ERROR_INVALID_HANDLE;
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&work_lock);
  struct stream_op op = {.kind = OP_WAIT_LOCAL};
  bool pending;
  if (ev->opened) {
    op.kind = OP_WAIT_REMOTE;
    op.page = ev->page;
    op.bell = ev->bell;
    op.gen = atomic_load(&ev->page->gen);
    pending = !gen_done(op.page, op.gen);
  } else {
    op.ws = ev->s;
    op.wmark = ev->mark;
    pending = ev->s != NULL && ev->s->done < ev->mark;
  }
  if (pending)
    r = enqueue(h, &op);
  else if (stream_of(h) == NULL)
    r = stream_error(h);
  pthread_mutex_unlock(&work_lock);
  if (r == CUDA_SUCCESS)
    atomic_fetch_add(&stream_waits, 1);
  return r;
}

FAKE_HIDDEN CUresult fake_cuEventCreate(CUevent *ev, unsigned int flags)
{
  NEED_INIT();
  const unsigned all = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING |
                       CU_EVENT_INTERPROCESS;
  if (ev == NULL || (flags & ~all) != 0 ||
      ((flags & CU_EVENT_INTERPROCESS) &&
       !(flags & CU_EVENT_DISABLE_TIMING)))
    return CUDA_ERROR_INVALID_VALUE;
  if (fake_current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  struct CUevent_st *e = calloc(1, sizeof(*e));
  if (e == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  e->flags = flags;
  e->page_fd = -1;
  if (flags & CU_EVENT_INTERPROCESS) {
    pthread_once(&serve_once, serve_start);
    e->page_fd = memfd_create("fake_cuda_event", MFD_CLOEXEC);
    if (serve_started != CUDA_SUCCESS || e->page_fd < 0 ||
        ftruncate(e->page_fd, PAGE) != 0 ||
        (e->page = fake_map_fd(e->page_fd, PAGE)) == NULL) {
      if (e->page_fd >= 0)
        close(e->page_fd);
      free(e);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&work_lock);
    e->next = ipc_events;
    ipc_events = e;
    pthread_mutex_unlock(&work_lock);
  }
  *ev = e;
  return CUDA_SUCCESS;
}

/* Whether a wait still queued on a stream names @p. work_lock held. */
static bool page_waited(const struct ipc_page *p)
{
  for (int i = 0; i < FAKE_STREAMS; i++)
    for (size_t k = streams[i].start; k < streams[i].len; k++)
      if (streams[i].ops[k].kind == OP_WAIT_REMOTE &&
          (streams[i].ops[k].page == p || streams[i].ops[k].bell == p))
        return true;
  return false;
}

/* Opened events' pages that waits still named when they were destroyed. */
#define RETIRED_MAX 256
static struct ipc_page *retired[RETIRED_MAX];
static int nretired;

/* Unmap @p now, or once no queued wait names it. work_lock held. */
static void page_retire(struct ipc_page *p)
{
  for (int i = 0; i < nretired;)
    if (!page_waited(retired[i])) {
      munmap(retired[i], PAGE);
      retired[i] = retired[--nretired];
    } else {
      i++;
    }
  if (p == NULL)
    return;
  if (!page_waited(p))
    munmap(p, PAGE);
  else if (nretired < RETIRED_MAX)
    retired[nretired++] = p;
  /* else: more than RETIRED_MAX waited on at once; left mapped */
}

/* An opened event may be destroyed with waits still queued on it (CUDA
 * frees its resources once they are done): its pages are unmapped once
 * no queued wait names them. */
FAKE_HIDDEN CUresult fake_cuEventDestroy(CUevent ev)
{
  NEED_INIT();
  if (ev == NULL)
    return CUDA_ERROR_INVALID_HANDLE;
  if (ev->opened) {
    pthread_mutex_lock(&work_lock);
    page_retire(ev->page);
    page_retire(ev->bell);
    pthread_mutex_unlock(&work_lock);
  } else if (ev->page != NULL) {
    atomic_store(&ev->page->destroyed, 1);
    pthread_mutex_lock(&work_lock);
    for (struct CUevent_st **pp = &ipc_events; *pp != NULL;
         pp = &(*pp)->next)
      if (*pp == ev) {
        *pp = ev->next;
        break;
      }
    pthread_mutex_unlock(&work_lock);
    munmap(ev->page, PAGE);
    close(ev->page_fd);
  }
  free(ev);
  return CUDA_SUCCESS;
}

FAKE_HIDDEN CUresult fake_cuEventRecord(CUevent ev, CUstream h)
{
  NEED_INIT();
  if (ev == NULL)
    return CUDA_ERROR_INVALID_HANDLE;
  if (ev->opened)
    return CUDA_ERROR_NOT_SUPPORTED; /* not needed by gpuipc */
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&work_lock);
  struct fake_stream *s = stream_of(h);
  if (s != NULL) {
    ev->s = s;
    ev->mark = s->queued;
    ev->queries = 0;
    clock_gettime(CLOCK_MONOTONIC, &ev->at);
    if (ev->page != NULL) {
      ev->gen = atomic_load(&ev->page->gen) + 1;
      atomic_store(&ev->page->queries, 0);
      atomic_store(&ev->page->at_ns, now_ns());
      atomic_store(&ev->page->gen, ev->gen);
      publish(s); /* done already when the stream is */
    }
  } else {
    r = stream_error(h);
  }
  pthread_mutex_unlock(&work_lock);
  if (r == CUDA_SUCCESS)
    atomic_fetch_add(&events_recorded, 1);
  return r;
}

FAKE_HIDDEN CUresult fake_cuEventQuery(CUevent ev)
{
  NEED_INIT();
  if (ev == NULL)
    return CUDA_ERROR_INVALID_HANDLE;
  if (dead_use(ev))
    return CUDA_ERROR_INVALID_HANDLE;
  CUresult r = CUDA_SUCCESS;
  pthread_mutex_lock(&work_lock);
  if (ev->opened) {
    if (!gen_done(ev->page, atomic_load(&ev->page->gen))) {
      atomic_fetch_add(&ev->page->queries, 1);
      ring(ev->bell);
      r = CUDA_ERROR_NOT_READY;
    }
  } else if (ev->s != NULL && ev->s->done < ev->mark) {
    ev->queries++;
    if (lag_over(ev->queries, usec_since(&ev->at)))
      stream_poke(ev->s, ev->mark);
    if (ev->s->done < ev->mark)
      r = CUDA_ERROR_NOT_READY;
  }
  if (r == CUDA_ERROR_NOT_READY)
    atomic_fetch_add(&not_ready, 1);
  pthread_mutex_unlock(&work_lock);
  return r;
}

FAKE_HIDDEN CUresult fake_cuEventSynchronize(CUevent ev)
{
  NEED_INIT();
  if (ev == NULL)
    return CUDA_ERROR_INVALID_HANDLE;
  if (dead_use(ev))
    return CUDA_ERROR_INVALID_HANDLE;
  if (ev->opened)
    return remote_sync(ev->page, ev->bell, atomic_load(&ev->page->gen));
  pthread_mutex_lock(&work_lock);
  struct fake_stream *s = ev->s;
  uint64_t mark = ev->mark;
  pthread_mutex_unlock(&work_lock);
  return s != NULL ? stream_sync(s, mark) : CUDA_SUCCESS;
}

FAKE_HIDDEN CUresult fake_cuIpcGetEventHandle(CUipcEventHandle *h, CUevent ev)
{
  NEED_INIT();
  if (h == NULL || ev == NULL || !(ev->flags & CU_EVENT_INTERPROCESS) ||
      ev->opened)
    return CUDA_ERROR_INVALID_VALUE;
  struct ipc_bytes b = {FAKE_EV_MAGIC, (uint32_t)getpid(), ev->page_fd,
                        bell_fd, PAGE, 0};
  fake_ipc_put(h->reserved, &b);
  return CUDA_SUCCESS;
}

FAKE_HIDDEN CUresult fake_cuIpcOpenEventHandle(CUevent *ph, CUipcEventHandle h)
{
  NEED_INIT();
  if (fake_current == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  struct ipc_bytes b;
  memcpy(&b, h.reserved, sizeof(b));
  if (ph == NULL || b.magic != FAKE_EV_MAGIC)
    return CUDA_ERROR_INVALID_VALUE;
  struct CUevent_st *e = calloc(1, sizeof(*e));
  if (e == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  int fd = fake_fd_of(b.pid, b.fd), fd2 = fake_fd_of(b.pid, b.fd2);
  if (fd >= 0 && fd2 >= 0) {
    e->page = fake_map_fd(fd, PAGE);
    e->bell = fake_map_fd(fd2, PAGE);
  }
  if (fd >= 0)
    close(fd);
  if (fd2 >= 0)
    close(fd2);
  e->flags = CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  e->opened = true;
  e->page_fd = -1;
  if (e->page == NULL || e->bell == NULL || dead_use(e)) {
    if (e->page != NULL)
      munmap(e->page, PAGE);
    if (e->bell != NULL)
      munmap(e->bell, PAGE);
    free(e);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  *ph = e;
  return CUDA_SUCCESS;
}

int fake_cuda_copies_done(void)
{
  return atomic_load(&copies_done);
}

int fake_cuda_not_ready(void)
{
  return atomic_load(&not_ready);
}

int fake_cuda_events_recorded(void)
{
  return atomic_load(&events_recorded);
}

int fake_cuda_stream_waits(void)
{
  return atomic_load(&stream_waits);
}

int fake_cuda_dead_event_uses(void)
{
  return atomic_load(&dead_event_uses);
}
