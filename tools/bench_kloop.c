/*
 * gpuipc bench, the kernel-in-the-loop round trip (bench/kloop_bench.cu's
 * rows, in the CLI): for each GPU and each ordered pair, a kernel on the
 * producer's stream writes a 4 KiB tensor (word k = v + k); it is sent;
 * the receiver's kernel checks it and writes its answer (each word + 1)
 * into a tensor of its own, which is sent back and checked by the
 * producer's kernel; the producer's host waits for its stream. The
 * kernels count the wrong words and their own launches (bench_kernels.c),
 * and both sides check the counts and their last tensor after the run.
 * Three rows, each timed on the producer's host from the first launch to
 * the end of its stream:
 *
 *   kloop_gpuipc       gpuipc channels both ways (the receiver is the
 *                      other process): send on the stream, receive a view
 *                      on the stream, release it on the stream after the
 *                      reading kernel; before a kernel rewrites its tensor,
 *                      gpuipc_channel_send_wait on the stream orders it
 *                      after the other side's last read. Buffers of
 *                      --kind, streams of --stream.
 *   kloop_one_process  the floor with no second process: the same kernels
 *                      in this process on two created streams (one per
 *                      GPU, peer access on), ordered with events.
 *   kloop_floor_word   the floor of two processes without gpuipc on the
 *                      path: each side's tensor mapped in the other (set
 *                      up through a channel, untimed), a counter per
 *                      direction in shared pinned host memory that the
 *                      host spins on to learn that the other side queued
 *                      its work, and the GPU ordering done with
 *                      cuStreamWriteValue64 / cuStreamWaitValue64 on words
 *                      in that memory. Created streams.
 */
#include "bench.h"
#include "core/core.h"    /* gpuipc__err */
#include "core/private.h" /* gpuipc__stream_sync */
#include "cuda/cuda.h"    /* gpuipc__word_dev, gpuipc__stream_word_* */
#include "mem/mem.h"      /* gpuipc__host_pin */

#include <errno.h>
#include <stdlib.h>

#define KLOOP_BYTES (KLOOP_WORDS * 4)

static long kloop_count(const struct prod *p)
{
  return p->o->quick ? 300 : 2000;
}

static long kloop_warm(const struct prod *p)
{
  return p->o->quick ? 50 : 100;
}

/* The value of round trip @i (from 1). */
static uint32_t kv(long i)
{
  return (uint32_t)i * 4096u;
}

static void row_add(struct prod *p, const struct pair *pr, const char *row,
                    double *t, int n)
{
  struct kloop_row *r = &p->r.kloop[p->r.nkloop++];
  r->src = pr->src;
  r->dst = pr->dst;
  r->row = row;
  r->n = n;
  bench_stats(t, n, &r->median, &r->p99);
}

/* The kernels' @tally on @dev: no wrong word, @launches launches. */
static int tally_check(int dev, const uint32_t *tally, long launches,
                       const char *who)
{
  uint32_t t[2];
  int rc = bench_dev_read(dev, t, tally, sizeof(t));
  if (rc == 0 && (t[0] != 0 || t[1] != (uint32_t)launches))
    rc = gpuipc__err(-EBADMSG, "bench: %s: %u wrong words, %u of %ld "
                     "kernels ran", who, t[0], t[1], launches);
  return rc;
}

/* The tensor at @p on @dev holds word k = @v + k + @add. */
static int words_check(int dev, const uint32_t *p, uint32_t v, uint32_t add,
                       const char *who)
{
  uint32_t w[KLOOP_WORDS];
  int rc = bench_dev_read(dev, w, p, sizeof(w));
  for (uint32_t k = 0; rc == 0 && k < KLOOP_WORDS; k++)
    if (w[k] != v + k + add)
      rc = gpuipc__err(-EBADMSG, "bench: %s: word %u is %u, not %u", who, k,
                       w[k], v + k + add);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* One side of a two-process row: its tensor, tally and channel             */
/* ------------------------------------------------------------------------ */

struct kside {
  int dev;
  gpuipc_buf_t *buf;
  uint32_t *mine;
  uint32_t *tally;
  struct tens x;
  gpuipc_channel_t *ch;
};

/* Channel @what-@src-@dst, whose views are mapped for @k->dev. */
static int kside_open(gpuipc_domain_t *dom, const char *what, int src,
                      int dst, gpuipc_kind_t kind, struct kside *k)
{
  char name[48];
  snprintf(name, sizeof(name), "bench-%s-%d-%d", what, src, dst);
  gpuipc_channel_opts_t o = {.size = sizeof(o), .timeout_ms = WAIT_MS,
                             .send_timeout_ms = WAIT_MS, .device = k->dev,
                             .device_set = 1};
  int rc = gpuipc_buf_alloc(KLOOP_BYTES, kind, k->dev, 0, &k->buf);
  if (rc != 0)
    return rc;
  k->mine = gpuipc_buf_ptr(k->buf);
  tens_init(&k->x, k->buf, k->mine, k->dev, KLOOP_BYTES);
  rc = bench_dev_alloc(k->dev, 2 * sizeof(uint32_t), (void **)&k->tally);
  if (rc == 0)
    rc = gpuipc_channel_open(dom, name, &o, &k->ch);
  return rc;
}

static void kside_close(struct kside *k)
{
  if (k->ch != NULL)
    gpuipc_channel_close(k->ch);
  bench_dev_free(k->dev, k->tally);
  if (k->buf != NULL)
    gpuipc_buf_release(k->buf);
}

/* A received view's words; NULL unless it is a 4 KiB tensor. */
static const uint32_t *view_words(const gpuipc_tensor_t *v)
{
  if (gpuipc_tensor_nbytes(v) != KLOOP_BYTES)
    return NULL;
  return (const uint32_t *)((const uint8_t *)v->dl.data + v->dl.byte_offset);
}

static int recv_words(gpuipc_channel_t *ch, void *stream, gpuipc_tensor_t **in,
                      const uint32_t **words)
{
  int rc = gpuipc_channel_recv(ch, in, stream, WAIT_MS);
  if (rc != 0)
    return rc;
  *words = view_words(*in);
  if (*words == NULL)
    return gpuipc__err(GPUIPC_E_PROTO, "bench: a kernel round trip "
                       "received %zu bytes", gpuipc_tensor_nbytes(*in));
  return 0;
}

/* ------------------------------------------------------------------------ */
/* kloop_gpuipc                                                             */
/* ------------------------------------------------------------------------ */

/* The producer's round trip @v on @pr->stream. */
static int prod_trip(const struct pair *pr, struct kside *k, uint64_t *ticket,
                     uint32_t v)
{
  int rc = 0;
  if (*ticket != 0)
    rc = gpuipc_channel_send_wait(k->ch, *ticket, pr->stream, WAIT_MS);
  if (rc == 0)
    rc = bench_k_write(pr->src, pr->stream, k->mine, v);
  if (rc == 0)
    rc = gpuipc_channel_send(k->ch, &k->x.t, pr->stream, 0, ticket);
  gpuipc_tensor_t *in = NULL;
  const uint32_t *answer = NULL;
  if (rc == 0)
    rc = recv_words(k->ch, pr->stream, &in, &answer);
  if (rc == 0)
    rc = bench_k_check(pr->src, pr->stream, answer, v, k->tally);
  if (in != NULL) {
    int rc2 = gpuipc_tensor_release(in, pr->stream);
    rc = rc != 0 ? rc : rc2;
  }
  if (rc == 0)
    rc = gpuipc__stream_sync(pr->src, pr->stream);
  return rc;
}

static int kloop_gpuipc(struct prod *p, const struct pair *pr, double *t,
                        long n, long warm)
{
  int64_t order[4] = {OP_KLOOP, pr->src, n + warm, 0}, ans[4] = {0};
  struct kside k = {.dev = pr->src};
  int rc = bench_ctl_send(&p->ctl, order);
  if (rc == 0)
    rc = kside_open(p->dom, "k", pr->src, pr->dst, p->o->kind, &k);
  uint64_t ticket = 0;
  for (long i = 1; rc == 0 && i <= n + warm; i++) {
    double t0 = bench_now_us();
    rc = prod_trip(pr, &k, &ticket, kv(i));
    if (i > warm)
      t[i - warm - 1] = bench_now_us() - t0;
  }
  if (rc == 0 && ticket != 0)
    rc = gpuipc_channel_send_done(k.ch, ticket, WAIT_MS);
  if (rc == 0)
    rc = tally_check(pr->src, k.tally, n + warm, "kloop_gpuipc, the "
                     "producer's checks");
  if (rc == 0)
    rc = words_check(pr->src, k.mine, kv(n + warm), 0, "kloop_gpuipc, the "
                     "producer's tensor");
  if (rc == 0)
    rc = bench_ctl_recv(&p->ctl, ans);
  kside_close(&k);
  return rc != 0 ? rc : bench_answer(ans);
}

/* The receiver's round trip @v on its stream. */
static int peer_trip(struct peer *p, struct kside *k, uint64_t *ticket,
                     uint32_t v)
{
  gpuipc_tensor_t *in = NULL;
  const uint32_t *words = NULL;
  int rc = recv_words(k->ch, p->stream, &in, &words);
  if (rc == 0 && *ticket != 0)
    rc = gpuipc_channel_send_wait(k->ch, *ticket, p->stream, WAIT_MS);
  if (rc == 0)
    rc = bench_k_answer(p->dev, p->stream, words, k->mine, v, k->tally);
  if (in != NULL) {
    int rc2 = gpuipc_tensor_release(in, p->stream);
    rc = rc != 0 ? rc : rc2;
  }
  if (rc == 0)
    rc = gpuipc_channel_send(k->ch, &k->x.t, p->stream, 0, ticket);
  return rc;
}

int bench_kloop_peer(struct peer *p, int src, long iters)
{
  struct kside k = {.dev = p->dev};
  int rc = p->dev < 0 ? GPUIPC_E_PROTO : 0;
  if (rc == 0)
    rc = kside_open(p->dom, "k", src, p->dev, p->kind, &k);
  uint64_t ticket = 0;
  for (long i = 1; rc == 0 && i <= iters; i++)
    rc = peer_trip(p, &k, &ticket, kv(i));
  if (rc == 0 && ticket != 0)
    rc = gpuipc_channel_send_done(k.ch, ticket, WAIT_MS);
  if (rc == 0)
    rc = gpuipc__stream_sync(p->dev, p->stream);
  if (rc == 0)
    rc = tally_check(p->dev, k.tally, iters, "kloop_gpuipc, the receiver's "
                     "checks");
  if (rc == 0)
    rc = words_check(p->dev, k.mine, kv(iters), 1, "kloop_gpuipc, the "
                     "receiver's answer");
  kside_close(&k);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* kloop_one_process                                                        */
/* ------------------------------------------------------------------------ */

struct onep {
  int src, dst;
  void *sa, *sb;       /* created streams of src and dst */
  uint32_t *a, *b;     /* the tensors, on src and dst */
  uint32_t *ta, *tb;   /* tallies */
  void *ea, *eb;       /* events of src and dst */
};

static int onep_open(struct onep *o)
{
  if (o->src != o->dst && !bench_peer_on(o->src, o->dst))
    return gpuipc__err(GPUIPC_E_UNSUPPORTED, "bench: no peer access "
                       "between GPU %d and GPU %d", o->src, o->dst);
  o->sa = bench_stream_make(ST_CREATED, o->src);
  o->sb = bench_stream_make(ST_CREATED, o->dst);
  if (o->sa == NULL || o->sb == NULL)
    return gpuipc__err(GPUIPC_E_CUDA, "bench: no stream: %s",
                       gpuipc_last_error());
  int rc = bench_dev_alloc(o->src, KLOOP_BYTES, (void **)&o->a);
  if (rc == 0)
    rc = bench_dev_alloc(o->dst, KLOOP_BYTES, (void **)&o->b);
  if (rc == 0)
    rc = bench_dev_alloc(o->src, 8, (void **)&o->ta);
  if (rc == 0)
    rc = bench_dev_alloc(o->dst, 8, (void **)&o->tb);
  if (rc == 0)
    rc = bench_ev_make(o->src, &o->ea);
  if (rc == 0)
    rc = bench_ev_make(o->dst, &o->eb);
  return rc;
}

static void onep_close(struct onep *o)
{
  bench_ev_free(o->dst, o->eb);
  bench_ev_free(o->src, o->ea);
  bench_dev_free(o->dst, o->tb);
  bench_dev_free(o->src, o->ta);
  bench_dev_free(o->dst, o->b);
  bench_dev_free(o->src, o->a);
  bench_stream_free(ST_CREATED, o->dst, o->sb);
  bench_stream_free(ST_CREATED, o->src, o->sa);
}

static int onep_trip(struct onep *o, uint32_t v)
{
  int rc = bench_k_write(o->src, o->sa, o->a, v);
  if (rc == 0)
    rc = bench_ev_record(o->src, o->ea, o->sa);
  if (rc == 0)
    rc = bench_ev_wait(o->dst, o->sb, o->ea);
  if (rc == 0)
    rc = bench_k_answer(o->dst, o->sb, o->a, o->b, v, o->tb);
  if (rc == 0)
    rc = bench_ev_record(o->dst, o->eb, o->sb);
  if (rc == 0)
    rc = bench_ev_wait(o->src, o->sa, o->eb);
  if (rc == 0)
    rc = bench_k_check(o->src, o->sa, o->b, v, o->ta);
  if (rc == 0)
    rc = gpuipc__stream_sync(o->src, o->sa);
  return rc;
}

static int kloop_one(const struct pair *pr, double *t, long n, long warm)
{
  struct onep o = {.src = pr->src, .dst = pr->dst};
  int rc = onep_open(&o);
  for (long i = 1; rc == 0 && i <= n + warm; i++) {
    double t0 = bench_now_us();
    rc = onep_trip(&o, kv(i));
    if (i > warm)
      t[i - warm - 1] = bench_now_us() - t0;
  }
  if (rc == 0)
    rc = tally_check(o.dst, o.tb, n + warm, "kloop_one_process, the "
                     "answers' checks");
  if (rc == 0)
    rc = tally_check(o.src, o.ta, n + warm, "kloop_one_process, the "
                     "producer's checks");
  if (rc == 0)
    rc = words_check(o.dst, o.b, kv(n + warm), 1, "kloop_one_process, the "
                     "answer");
  onep_close(&o);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* kloop_floor_word                                                         */
/* ------------------------------------------------------------------------ */

/* The shared page: a counter each way that the host spins on, a word each
 * way that the streams write and wait on; 64 bytes apart. */
enum { Q_PROD, Q_PEER, W_PROD, W_PEER, PAGE_WORDS };

/* One side's mappings: the shared page and the other side's tensor, held
 * as views for the run; the words' device addresses for its GPU. */
struct wside {
  struct kside k;
  void *stream;   /* created */
  gpuipc_buf_t *page_buf; /* the producer's */
  gpuipc_tensor_t *page_view, *theirs_view; /* the receiver's */
  volatile uint64_t *page;
  const uint32_t *theirs;
  uint64_t wdev[PAGE_WORDS]; /* device addresses of W_PROD, W_PEER */
};

static volatile uint64_t *page_word(struct wside *w, int i)
{
  return w->page + i * 8;
}

/* The words' device addresses for this side's GPU (the page pinned). */
static int wside_words(struct wside *w, gpuipc_buf_t *page)
{
  int rc = gpuipc__host_pin(page, w->k.dev);
  for (int i = W_PROD; rc == 0 && i <= W_PEER; i++)
    rc = gpuipc__word_dev(w->k.dev, (void *)page_word(w, i), &w->wdev[i]);
  return rc;
}

/* Spin until the other side's host counter @i reaches @v, at most
 * WAIT_MS (the other process may have failed). */
static int spin_until(struct wside *w, int i, uint64_t v)
{
  double give_up = 0;
  for (unsigned n = 1;
       __atomic_load_n(page_word(w, i), __ATOMIC_ACQUIRE) < v; n++) {
    if (n % 4096 != 0)
      continue;
    double now = bench_now_us();
    if (give_up == 0)
      give_up = now + WAIT_MS * 1e3;
    else if (now > give_up)
      return gpuipc__err(-ETIMEDOUT, "bench: kloop_floor_word: the other "
                         "process queued nothing within %d ms", WAIT_MS);
  }
  return 0;
}

static void wside_close(struct wside *w)
{
  if (w->theirs_view != NULL)
    gpuipc_tensor_release(w->theirs_view, NULL);
  if (w->page_view != NULL)
    gpuipc_tensor_release(w->page_view, NULL);
  bench_stream_free(ST_CREATED, w->k.dev, w->stream);
  kside_close(&w->k);
  if (w->page_buf != NULL)
    gpuipc_buf_release(w->page_buf);
}

/* The producer: sends the page and its tensor, receives the other's. */
static int wprod_open(struct prod *p, const struct pair *pr, struct wside *w)
{
  w->k.dev = pr->src;
  int rc = kside_open(p->dom, "w", pr->src, pr->dst, p->o->kind, &w->k);
  if (rc == 0)
    rc = gpuipc_buf_alloc(4096, GPUIPC_KIND_HOST, -1, 0, &w->page_buf);
  if (rc != 0)
    return rc;
  w->page = gpuipc_buf_ptr(w->page_buf);
  struct tens pg;
  tens_init(&pg, w->page_buf, (void *)w->page, -1, 4096);
  uint64_t tk;
  rc = wside_words(w, w->page_buf);
  if (rc == 0)
    rc = gpuipc_channel_send(w->k.ch, &pg.t, NULL, 0, &tk);
  if (rc == 0)
    rc = gpuipc_channel_send(w->k.ch, &w->k.x.t, NULL, 0, &tk);
  if (rc == 0)
    rc = recv_words(w->k.ch, NULL, &w->theirs_view, &w->theirs);
  w->stream = rc == 0 ? bench_stream_make(ST_CREATED, pr->src) : NULL;
  return rc != 0 ? rc : w->stream == NULL ? GPUIPC_E_CUDA : 0;
}

/* The receiver: the other way round. */
static int wpeer_open(struct peer *p, int src, struct wside *w)
{
  w->k.dev = p->dev;
  int rc = kside_open(p->dom, "w", src, p->dev, p->kind, &w->k);
  if (rc == 0)
    rc = gpuipc_channel_recv(w->k.ch, &w->page_view, NULL, WAIT_MS);
  if (rc == 0 && gpuipc_tensor_nbytes(w->page_view) != 4096)
    rc = gpuipc__err(GPUIPC_E_PROTO, "bench: the shared page is not 4 KiB");
  if (rc != 0)
    return rc;
  w->page = (volatile uint64_t *)((uint8_t *)w->page_view->dl.data +
                                  w->page_view->dl.byte_offset);
  rc = wside_words(w, w->page_view->buf);
  if (rc == 0)
    rc = recv_words(w->k.ch, NULL, &w->theirs_view, &w->theirs);
  uint64_t tk;
  if (rc == 0)
    rc = gpuipc_channel_send(w->k.ch, &w->k.x.t, NULL, 0, &tk);
  w->stream = rc == 0 ? bench_stream_make(ST_CREATED, p->dev) : NULL;
  return rc != 0 ? rc : w->stream == NULL ? GPUIPC_E_CUDA : 0;
}

static int wprod_trip(struct wside *w, long i)
{
  int dev = w->k.dev;
  int rc = bench_k_write(dev, w->stream, w->k.mine, kv(i));
  if (rc == 0)
    rc = gpuipc__stream_word_write(dev, w->stream, w->wdev[W_PROD],
                                   (uint64_t)i);
  if (rc != 0)
    return rc;
  __atomic_store_n(page_word(w, Q_PROD), (uint64_t)i, __ATOMIC_RELEASE);
  rc = spin_until(w, Q_PEER, (uint64_t)i);
  if (rc == 0)
    rc = gpuipc__stream_word_wait(dev, w->stream, w->wdev[W_PEER],
                                  (uint64_t)i);
  if (rc == 0)
    rc = bench_k_check(dev, w->stream, w->theirs, kv(i), w->k.tally);
  if (rc == 0)
    rc = gpuipc__stream_sync(dev, w->stream);
  return rc;
}

static int wpeer_trip(struct wside *w, long i)
{
  int dev = w->k.dev;
  int rc = spin_until(w, Q_PROD, (uint64_t)i);
  if (rc == 0)
    rc = gpuipc__stream_word_wait(dev, w->stream, w->wdev[W_PROD],
                                  (uint64_t)i);
  if (rc == 0)
    rc = bench_k_answer(dev, w->stream, w->theirs, w->k.mine, kv(i),
                        w->k.tally);
  if (rc == 0)
    rc = gpuipc__stream_word_write(dev, w->stream, w->wdev[W_PEER],
                                   (uint64_t)i);
  if (rc == 0)
    __atomic_store_n(page_word(w, Q_PEER), (uint64_t)i, __ATOMIC_RELEASE);
  return rc;
}

static int kloop_word(struct prod *p, const struct pair *pr, double *t,
                      long n, long warm)
{
  int64_t order[4] = {OP_KWORD, pr->src, n + warm, 0}, ans[4] = {0};
  struct wside w = {.k.dev = pr->src};
  int rc = bench_ctl_send(&p->ctl, order);
  if (rc == 0)
    rc = wprod_open(p, pr, &w);
  for (long i = 1; rc == 0 && i <= n + warm; i++) {
    double t0 = bench_now_us();
    rc = wprod_trip(&w, i);
    if (i > warm)
      t[i - warm - 1] = bench_now_us() - t0;
  }
  if (rc == 0)
    rc = tally_check(pr->src, w.k.tally, n + warm, "kloop_floor_word, the "
                     "producer's checks");
  if (rc == 0)
    rc = bench_ctl_recv(&p->ctl, ans);
  wside_close(&w);
  return rc != 0 ? rc : bench_answer(ans);
}

int bench_kword_peer(struct peer *p, int src, long iters)
{
  struct wside w = {.k.dev = p->dev};
  int rc = p->dev < 0 ? GPUIPC_E_PROTO : wpeer_open(p, src, &w);
  for (long i = 1; rc == 0 && i <= iters; i++)
    rc = wpeer_trip(&w, i);
  if (rc == 0)
    rc = gpuipc__stream_sync(p->dev, w.stream);
  if (rc == 0)
    rc = tally_check(p->dev, w.k.tally, iters, "kloop_floor_word, the "
                     "receiver's checks");
  if (rc == 0)
    rc = words_check(p->dev, w.k.mine, kv(iters), 1, "kloop_floor_word, "
                     "the receiver's answer");
  wside_close(&w);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* The rows                                                                 */
/* ------------------------------------------------------------------------ */

/* Whether this driver launches the kernels on both GPUs and, between two,
 * they reach each other's memory; if not, the rows are left out and the
 * report says why. */
static int kernels_here(struct prod *p, const struct pair *pr)
{
  int rc = bench_k_ready(pr->src);
  if (rc == 0)
    rc = bench_k_ready(pr->dst);
  if (rc == 0 && pr->src != pr->dst && !bench_peer_on(pr->src, pr->dst))
    rc = gpuipc__err(GPUIPC_E_UNSUPPORTED, "GPU %d and GPU %d have no peer "
                     "access", pr->src, pr->dst);
  if (rc != 0)
    snprintf(p->r.kloop_skipped, sizeof(p->r.kloop_skipped), "%s",
             gpuipc_last_error());
  return rc == 0;
}

int bench_kloop_run(struct prod *p, const struct pair *pr)
{
  if (pr->src < 0 || !kernels_here(p, pr))
    return 0;
  bench_progress(p, "kernel round trip", pr->src, pr->dst, KLOOP_BYTES);
  long n = kloop_count(p), warm = kloop_warm(p);
  double *t = calloc((size_t)n, sizeof(*t));
  if (t == NULL)
    return -ENOMEM;
  int rc = kloop_gpuipc(p, pr, t, n, warm);
  if (rc == 0)
    row_add(p, pr, "kloop_gpuipc", t, (int)n);
  if (rc == 0)
    rc = kloop_one(pr, t, n, warm);
  if (rc == 0)
    row_add(p, pr, "kloop_one_process", t, (int)n);
  if (rc == 0)
    rc = kloop_word(p, pr, t, n, warm);
  if (rc == 0)
    row_add(p, pr, "kloop_floor_word", t, (int)n);
  free(t);
  return rc;
}
