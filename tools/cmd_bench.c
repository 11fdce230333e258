/*
 * gpuipc bench: measure this machine. For each GPU and each ordered pair of
 * GPUs, a channel's 4 KiB round trip and its copy bandwidth by size, next to
 * the driver's own copy (cuMemcpyAsync on one GPU, cuMemcpyPeerAsync between
 * two, peer access on) in the same run, the two alternated run by run and
 * compared by their medians; then a round trip with kernels in the loop
 * beside its floors (bench_kloop.c); then block batches of a paged cache
 * beside a message a block and the driver's batched copy (bench_blocks.c).
 * Without a GPU (or with --kind host) HOST buffers against memcpy, and no
 * kernel row.
 *
 * The command starts itself again as the receiving process (`gpuipc bench
 * --peer DOMAIN STREAM`, through /proc/self/exe), in a domain of its own.
 * The two talk over a control channel of HOST tensors: the producer sends
 * an order (open a data channel, receive N views, receive N copies, end),
 * the receiver carries it out and answers with a HOST tensor of its own:
 * 0, or the error it met. Bandwidth orders carry the byte the producer
 * filled its buffer with, and the receiver checks its copy's first and last
 * bytes against it, every run.
 *
 * This file: the arguments, the control channel, the receiving process and
 * the producer's runs, each path's rows listed in bench_rows (a new row is
 * one function there); bench.h lists the others (measuring and the
 * baselines: bench_measure.c; the kernel round trip: bench_kloop.c; the
 * block batches: bench_blocks.c; the report: bench_report.c).
 */
#include "bench.h"
#include "core/core.h" /* gpuipc__err, GPUIPC__KIND_LAST */
#include "core/private.h" /* gpuipc__stream_sync */

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define STR(x) #x
#define XSTR(x) STR(x)

/* " auto host vmm ...": the kinds' names, from gpuipc.h's GPUIPC_KIND_MAP. */
#define KIND_WORD(name, value, str, desc) " " str

static const char bench_usage[] =
    "usage: gpuipc bench [--json] [--quick] [--kind KIND] [--stream STREAM]\n"
    "                    [--max-bytes N] [--devices LIST] [--runs N]\n"
    "\n"
    "Measure channels on this machine, for each GPU and each ordered pair of\n"
    "GPUs: the 4 KiB round trip (send -> recv -> release -> the sender sees\n"
    "its buffer free) and the copy bandwidth (gpuipc_channel_recv_into) from 4 KiB\n"
    "up, next to cuMemcpyAsync (one GPU) or cuMemcpyPeerAsync (two GPUs,\n"
    "peer access on) run by this process on the same buffers: runs of the\n"
    "two alternated, the ratio of their medians. Then a 4 KiB round trip\n"
    "with kernels in the loop (a kernel writes the tensor, the receiver's\n"
    "kernel checks it and answers, a kernel checks the answer) beside its\n"
    "floors: the same kernels in one process ordered by events\n"
    "(kloop_one_process), and two processes ordered by stream value waits\n"
    "on shared pinned words (kloop_floor_word); gpuipc's row on --stream,\n"
    "the floors on created streams. Then blocks of a paged cache: 1,024\n"
    "blocks of 16 and of 256 KiB (fewer where --max-bytes does not hold a\n"
    "cache of 4 times as many) from scattered places of one cache into\n"
    "scattered places of another, timed until the sender's messages are\n"
    "free, median of --runs rounds: one block batch (blocks_gpuipc:\n"
    "send_blocks, recv_blocks), one message a block (blocks_per_message:\n"
    "send, recv_into), and the floors in this process (blocks_floor:\n"
    "cuMemcpyBatchAsync on a created stream, memcpy on the host;\n"
    "blocks_floor_kernel: one launch of gpuipc's block kernel).\n"
    "Without a GPU: HOST buffers against memcpy, no kernel rows. A second\n"
    "process (this command, started again) is the receiver; it checks the\n"
    "bytes of every size and block it receives and every word the kernels\n"
    "pass.\n"
    "\n"
    "  --json          one JSON document (schema 1) instead of the tables\n"
    "  --quick         fewer messages, sizes up to 64 MiB\n"
    "  --kind KIND     one of" GPUIPC_KIND_MAP(KIND_WORD) "\n"
    "                  (default auto); a kind that is not available here\n"
    "                  fails (exit 1) with why\n"
    "  --stream S      null (default: the legacy default stream, what\n"
    "                  PyTorch uses), legacy, per-thread, or created (a\n"
    "                  non-blocking stream of each process's own)\n"
    "  --max-bytes N   largest size (default 1 GiB, 64 MiB with --quick),\n"
    "                  and the largest cache of the block rows\n"
    "  --devices LIST  comma-separated ordinals (default: every GPU)\n"
    "  --runs N        alternated runs of each copy size, each side, 5 ..\n"
    "                  " XSTR(MAX_RUNS) " (default 5), and rounds of each block\n"
    "                  row\n"
    "\n"
    "A progress line goes to stderr while it runs, when stderr is a terminal.\n";



/* ------------------------------------------------------------------------ */
/* Control channel: orders one way, answers the other                       */
/* ------------------------------------------------------------------------ */


static int ctl_init(struct ctl *c, gpuipc_domain_t *dom)
{
  memset(c, 0, sizeof(*c));
  int rc = gpuipc_buf_alloc(CTL_SLOTS * 64, GPUIPC_KIND_HOST, -1, 0, &c->buf);
  if (rc != 0)
    return rc;
  gpuipc_channel_opts_t o = {.size = sizeof(o), .timeout_ms = WAIT_MS,
                             .send_timeout_ms = WAIT_MS};
  rc = gpuipc_channel_open(dom, "bench-ctl", &o, &c->ch);
  if (rc != 0) {
    gpuipc_buf_release(c->buf);
    c->buf = NULL;
  }
  return rc;
}

static void ctl_fini(struct ctl *c)
{
  if (c->ch != NULL)
    gpuipc_channel_close(c->ch);
  if (c->buf != NULL)
    gpuipc_buf_release(c->buf);
}

/* Send four numbers. */
int bench_ctl_send(struct ctl *c, const int64_t v[4])
{
  int slot = c->next++ % CTL_SLOTS;
  int rc = 0;
  if (c->tickets[slot] != 0)
    rc = gpuipc_channel_send_done(c->ch, c->tickets[slot], WAIT_MS);
  if (rc != 0)
    return rc;
  uint8_t *p = (uint8_t *)gpuipc_buf_ptr(c->buf) + slot * 64;
  memcpy(p, v, 4 * sizeof(int64_t));
  struct tens x;
  tens_init(&x, c->buf, gpuipc_buf_ptr(c->buf), -1, 4 * sizeof(int64_t));
  x.t.dl.byte_offset = (uint64_t)slot * 64;
  return gpuipc_channel_send(c->ch, &x.t, NULL, 0, &c->tickets[slot]);
}

/* Receive four numbers. */
int bench_ctl_recv(struct ctl *c, int64_t v[4])
{
  gpuipc_tensor_t *t;
  int rc = gpuipc_channel_recv(c->ch, &t, NULL, 4 * WAIT_MS);
  if (rc != 0)
    return rc;
  if (gpuipc_tensor_nbytes(t) != 4 * sizeof(int64_t))
    rc = GPUIPC_E_PROTO;
  else
    memcpy(v, (const uint8_t *)t->dl.data + t->dl.byte_offset,
           4 * sizeof(int64_t));
  gpuipc_tensor_release(t, NULL);
  return rc;
}

/* The receiver's answer @ans[0] as a status: 0, or its error code with a
 * sentence here (the receiver's own is on its stderr). */
int bench_answer(const int64_t ans[4])
{
  if (ans[0] == 0)
    return 0;
  int rc = (int)ans[0];
  return gpuipc__err(rc, "bench: the receiving process failed: %s (its "
                     "message is above)", gpuipc_err_name(rc));
}

/* An order and its answer: 0, or the receiver's error code. */
static int ctl_order(struct ctl *c, int64_t op, int64_t a, int64_t b,
                     int64_t d)
{
  int64_t v[4] = {op, a, b, d}, ans[4];
  int rc = bench_ctl_send(c, v);
  if (rc == 0)
    rc = bench_ctl_recv(c, ans);
  return rc != 0 ? rc : bench_answer(ans);
}

/* The data channel from @src to @dst: "bench-0-1", "bench-host". */
static void chan_name(int src, int dst, char *buf, size_t cap)
{
  if (src < 0)
    snprintf(buf, cap, "bench-host");
  else
    snprintf(buf, cap, "bench-%d-%d", src, dst);
}

/* ------------------------------------------------------------------------ */
/* The receiving process                                                    */
/* ------------------------------------------------------------------------ */

static int peer_open(struct peer *p, int src, int dst, gpuipc_kind_t kind)
{
  char name[32];
  chan_name(src, dst, name, sizeof(name));
  gpuipc_channel_opts_t o = {.size = sizeof(o), .timeout_ms = WAIT_MS,
                             .send_timeout_ms = WAIT_MS,
                             .device = dst, .device_set = dst >= 0};
  int rc = gpuipc_channel_open(p->dom, name, &o, &p->data);
  if (rc != 0)
    return rc;
  p->dev = dst;
  p->kind = kind;
  p->stream = dst >= 0 ? bench_stream_make(p->mode, dst) : NULL;
  return 0;
}

static void peer_close(struct peer *p)
{
  if (p->data != NULL)
    gpuipc_channel_close(p->data);
  p->data = NULL;
  if (p->dev >= 0)
    bench_stream_free(p->mode, p->dev, p->stream);
  p->stream = NULL;
  if (p->dst != NULL)
    gpuipc_buf_release(p->dst);
  p->dst = NULL;
}

static int peer_views(struct peer *p, long count)
{
  for (long i = 0; i < count; i++) {
    gpuipc_tensor_t *v;
    int rc = gpuipc_channel_recv(p->data, &v, p->stream, WAIT_MS);
    if (rc == 0)
      rc = gpuipc_tensor_release(v, p->stream);
    if (rc != 0)
      return rc;
  }
  return 0;
}

/* The first and last 64 bytes of @bytes at @q hold @want. */
static int peer_check(struct peer *p, const uint8_t *q, size_t bytes,
                      uint8_t want)
{
  uint8_t head[64], tail[64];
  size_t k = bytes < 64 ? bytes : 64;
  int rc = 0;
  if (p->dev < 0) {
    memcpy(head, q, k);
    memcpy(tail, q + bytes - k, k);
  } else {
    rc = bench_dev_read(p->dev, head, q, k);
    if (rc == 0)
      rc = bench_dev_read(p->dev, tail, q + bytes - k, k);
  }
  for (size_t i = 0; rc == 0 && i < k; i++)
    if (head[i] != want || tail[i] != want)
      rc = gpuipc__err(-EBADMSG, "bench: a copy of %zu bytes holds %#x "
                       "... %#x where %#x was sent", bytes, head[i], tail[i],
                       want);
  return rc;
}

static int peer_copies(struct peer *p, size_t bytes, long count, uint8_t want)
{
  int rc = 0;
  if (p->dst == NULL || gpuipc_buf_size(p->dst) < bytes) {
    if (p->dst != NULL)
      gpuipc_buf_release(p->dst);
    p->dst = NULL;
    gpuipc_kind_t k = p->dev < 0 ? GPUIPC_KIND_HOST : p->kind;
    rc = gpuipc_buf_alloc(bytes, k, p->dev, 0, &p->dst);
    if (rc != 0)
      return rc;
  }
  struct tens into;
  tens_init(&into, p->dst, gpuipc_buf_ptr(p->dst), p->dev, bytes);
  for (long i = 0; rc == 0 && i < count; i++)
    rc = gpuipc_channel_recv_into(p->data, &into.t, p->stream, WAIT_MS);
  if (rc == 0 && p->dev >= 0)
    rc = gpuipc__stream_sync(p->dev, p->stream);
  if (rc == 0)
    rc = peer_check(p, gpuipc_buf_ptr(p->dst), bytes, want);
  return rc;
}

static int peer_main(const char *domain, const char *stream)
{
  struct peer p;
  memset(&p, 0, sizeof(p));
  p.dev = -1;
  for (int m = 0; m < 4; m++)
    if (strcmp(stream, bench_stream_names[m]) == 0)
      p.mode = (enum stream_mode)m;
  int rc = gpuipc_domain_join(domain, NULL, &p.dom);
  if (rc == 0)
    rc = ctl_init(&p.ctl, p.dom);
  while (rc == 0) {
    int64_t v[4];
    rc = bench_ctl_recv(&p.ctl, v);
    if (rc != 0 || v[0] == OP_END)
      break;
    int res;
    switch (v[0]) {
    case OP_OPEN:
      res = peer_open(&p, (int)v[1], (int)v[2], (gpuipc_kind_t)v[3]);
      break;
    case OP_LAT:
      res = peer_views(&p, (long)v[2]);
      break;
    case OP_BW:
      res = peer_copies(&p, (size_t)v[1], (long)v[2], (uint8_t)v[3]);
      break;
    case OP_KLOOP:
      res = bench_kloop_peer(&p, (int)v[1], (long)v[2]);
      break;
    case OP_KWORD:
      res = bench_kword_peer(&p, (int)v[1], (long)v[2]);
      break;
    case OP_BLOCKS:
    case OP_BLOCKS_MSG:
      res = bench_blocks_peer(&p, (int)v[0], (size_t)v[1], (long)v[2],
                              (long)v[3]);
      break;
    case OP_CLOSE:
      peer_close(&p);
      res = 0;
      break;
    default:
      res = GPUIPC_E_PROTO;
    }
    if (res != 0)
      fprintf(stderr, "gpuipc bench (receiver): order %d: %s (%s)\n",
              (int)v[0], gpuipc_last_error(), gpuipc_err_name(res));
    int64_t ans[4] = {res, 0, 0, 0};
    rc = bench_ctl_send(&p.ctl, ans);
  }
  peer_close(&p);
  if (p.ctl.ch != NULL) {
    /* Let the last answer be read before the channel closes. */
    gpuipc_channel_progress(p.ctl.ch);
  }
  ctl_fini(&p.ctl);
  if (p.dom != NULL)
    gpuipc_domain_leave(p.dom);
  if (rc != 0)
    fprintf(stderr, "gpuipc bench (receiver): %s\n", gpuipc_last_error());
  return rc == 0 ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}

/* ------------------------------------------------------------------------ */
/* The producing process                                                    */
/* ------------------------------------------------------------------------ */


void bench_progress(struct prod *p, const char *what, int src, int dst,
                    size_t bytes)
{
  p->step++;
  if (!isatty(STDERR_FILENO))
    return;
  char b[32];
  char path[32];
  fprintf(stderr, "\r\033[K[%d/%d] %s %s %s", p->step, p->steps,
          bench_path_name(src, dst, path, sizeof(path)), what,
          cli_bytes(bytes, b, sizeof(b)));
  fflush(stderr);
}

static int spawn_peer(struct prod *p, const char *domain)
{
  const char *stream = bench_stream_names[p->o->stream];
  pid_t pid = fork();
  if (pid < 0)
    return -errno;
  if (pid == 0) {
    char *const argv[] = {(char *)"gpuipc", (char *)"bench", (char *)"--peer",
                          (char *)domain, (char *)stream, NULL};
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  p->peer = pid;
  return 0;
}

/* Messages of each run of @bytes. */
static long count_for(size_t bytes, int quick)
{
  size_t target = quick ? ((size_t)1 << 30) : ((size_t)8 << 30);
  long n = (long)(target / bytes);
  long cap = quick ? 500 : 4000;
  return n < 10 ? 10 : n > cap ? cap : n;
}

/* Row "latency": round trips of a 4 KiB tensor, @n timed after warm-up. */
static int run_latency(struct prod *p, const struct pair *pr)
{
  int n = p->o->quick ? 300 : 2000, warm = 100;
  int src = pr->src;
  bench_progress(p, "latency", src, pr->dst, LAT_BYTES);
  gpuipc_buf_t *b;
  gpuipc_kind_t kind = src < 0 ? GPUIPC_KIND_HOST : p->o->kind;
  int rc = gpuipc_buf_alloc(LAT_BYTES, kind, src, 0, &b);
  if (rc != 0)
    return rc;
  double *t = calloc((size_t)n, sizeof(*t));
  int64_t order[4] = {OP_LAT, LAT_BYTES, n + warm, 0};
  rc = t == NULL ? -ENOMEM : bench_ctl_send(&p->ctl, order);
  struct tens x;
  tens_init(&x, b, gpuipc_buf_ptr(b), src, LAT_BYTES);
  for (int i = 0; rc == 0 && i < n + warm; i++) {
    uint64_t tk;
    double t0 = bench_now_us();
    rc = gpuipc_channel_send(pr->ch, &x.t, pr->stream, 0, &tk);
    if (rc == 0)
      rc = gpuipc_channel_send_done(pr->ch, tk, WAIT_MS);
    if (i >= warm)
      t[i - warm] = bench_now_us() - t0;
  }
  int64_t ans[4] = {0};
  if (rc == 0)
    rc = bench_ctl_recv(&p->ctl, ans);
  if (rc == 0)
    rc = bench_answer(ans);
  if (rc == 0) {
    struct lat_row *r = &p->r.lat[p->r.nlat++];
    r->src = src;
    r->dst = pr->dst;
    r->n = n;
    bench_stats(t, n, &r->median, &r->p99);
  }
  free(t);
  gpuipc_buf_release(b);
  return rc;
}

static int bw_row_add(struct results *r, const struct bw_row *row)
{
  if (r->nbw == r->capbw) {
    int cap = r->capbw ? r->capbw * 2 : 32;
    struct bw_row *nb = realloc(r->bw, (size_t)cap * sizeof(*nb));
    if (nb == NULL)
      return -ENOMEM;
    r->bw = nb;
    r->capbw = cap;
  }
  r->bw[r->nbw++] = *row;
  return 0;
}

/* One run of gpuipc's copies: @n messages of @x (filled with @v) after one
 * to warm up, which the receiver copies and checks; microseconds. */
static int gpuipc_run(struct prod *p, const struct pair *pr, struct tens *x,
                      long n, uint8_t v, double *us)
{
  size_t bytes = gpuipc_tensor_nbytes(&x->t);
  int64_t order[4] = {OP_BW, (int64_t)bytes, n + 1, v}, ans[4] = {0};
  int rc = bench_ctl_send(&p->ctl, order);
  uint64_t tk = 0;
  if (rc == 0)
    rc = gpuipc_channel_send(pr->ch, &x->t, pr->stream, 0, &tk); /* warm-up */
  if (rc == 0)
    rc = gpuipc_channel_send_done(pr->ch, tk, WAIT_MS);
  double t0 = bench_now_us();
  for (long i = 0; rc == 0 && i < n; i++)
    rc = gpuipc_channel_send(pr->ch, &x->t, pr->stream, 0, &tk);
  if (rc == 0)
    rc = gpuipc_channel_send_done(pr->ch, tk, WAIT_MS);
  *us = bench_now_us() - t0;
  if (rc == 0)
    rc = bench_ctl_recv(&p->ctl, ans);
  return rc != 0 ? rc : bench_answer(ans);
}

/* The median of @n values (left in order). */
static double median_of(const double *v, int n)
{
  double s[MAX_RUNS], med, p99;
  memcpy(s, v, (size_t)n * sizeof(*v));
  bench_stats(s, n, &med, &p99);
  return med;
}

/* One size: runs of the channel's copies and of the baseline's,
 * alternated (gpuipc, baseline, gpuipc, ...), into @row. */
static int run_size(struct prod *p, const struct pair *pr, gpuipc_buf_t *from,
                    gpuipc_buf_t *to, struct bw_row *row)
{
  size_t bytes = row->bytes;
  long n = count_for(bytes, p->o->quick);
  uint8_t v = bench_pattern(bytes);
  int rc = bench_fill(pr->src, gpuipc_buf_ptr(from), v, bytes);
  struct tens x;
  tens_init(&x, from, gpuipc_buf_ptr(from), pr->src, bytes);
  row->count = n;
  row->runs = p->o->runs;
  for (int r = 0; rc == 0 && r < row->runs; r++) {
    double us = 0;
    row->gbs_at[r] = bench_now_us() - p->t0;
    rc = gpuipc_run(p, pr, &x, n, v, &us);
    if (rc != 0)
      return rc;
    row->base_at[r] = bench_now_us() - p->t0;
    double bus = bench_base_us(pr->src, pr->dst, gpuipc_buf_ptr(to),
                               gpuipc_buf_ptr(from), bytes, n, pr->stream);
    if (bus <= 0)
      return gpuipc__err(GPUIPC_E_CUDA, "bench: the baseline copy failed: "
                         "%s", gpuipc_last_error());
    row->gbs_run[r] = (double)bytes * n / us / 1e3;
    row->base_run[r] = (double)bytes * n / bus / 1e3;
  }
  row->gbs = median_of(row->gbs_run, row->runs);
  row->base_gbs = median_of(row->base_run, row->runs);
  return rc;
}

/* Row "bandwidth": every size from 4 KiB up. */
static int run_bandwidth(struct prod *p, const struct pair *pr)
{
  int src = pr->src, dst = pr->dst;
  gpuipc_kind_t kind = src < 0 ? GPUIPC_KIND_HOST : p->o->kind;
  gpuipc_buf_t *from = NULL, *to = NULL;
  int rc = gpuipc_buf_alloc(p->o->max_bytes, kind, src, 0, &from);
  if (rc == 0)
    rc = gpuipc_buf_alloc(p->o->max_bytes, kind, dst, 0, &to);
  /* The driver's copy between GPUs at NVLink speed: peer access, and for
   * VMM and POOL memory access granted to the other GPU per allocation
   * (cuMemSetAccess: peer access alone leaves cuMemcpyPeerAsync staging
   * through host memory, at a tenth of the rate). */
  int peer = -1;
  if (rc == 0 && src >= 0 && src != dst)
    peer = bench_peer_on(src, dst) && gpuipc_buf_access(to, src) == 0 &&
           gpuipc_buf_access(from, dst) == 0;
  for (size_t b = 4096; rc == 0 && b <= p->o->max_bytes; b *= 4) {
    bench_progress(p, "bandwidth", src, dst, b);
    struct bw_row row = {.src = src, .dst = dst, .bytes = b, .peer = peer};
    rc = run_size(p, pr, from, to, &row);
    if (rc == 0)
      rc = bw_row_add(&p->r, &row);
  }
  if (to != NULL)
    gpuipc_buf_release(to);
  if (from != NULL)
    gpuipc_buf_release(from);
  return rc;
}

/*
 * The rows of each path, in order: one function each, which measures
 * @pr and adds its results to p->r (a row that does not apply to the
 * path, such as the kernels' on the host, adds none and returns 0).
 */
static int (*const bench_rows[])(struct prod *p, const struct pair *pr) = {
    run_latency,
    run_bandwidth,
    bench_kloop_run,
    bench_blocks_run,
};

/* Open the data channel from @src to @dst at both ends. */
static int pair_open(struct prod *p, int src, int dst, gpuipc_channel_t **ch)
{
  /* Both ends open at once: the answer comes once the channel is paired. */
  int64_t order[4] = {OP_OPEN, src, dst, p->o->kind}, ans[4] = {0};
  int rc = bench_ctl_send(&p->ctl, order);
  if (rc != 0)
    return rc;
  char name[32];
  chan_name(src, dst, name, sizeof(name));
  gpuipc_channel_opts_t o = {.size = sizeof(o), .timeout_ms = WAIT_MS,
                             .send_timeout_ms = WAIT_MS};
  rc = gpuipc_channel_open(p->dom, name, &o, ch);
  int rc2 = bench_ctl_recv(&p->ctl, ans);
  if (rc == 0 && (rc2 != 0 || ans[0] != 0)) {
    gpuipc_channel_close(*ch);
    rc = rc2 != 0 ? rc2 : bench_answer(ans);
  }
  return rc;
}

/* Every row from @src to @dst (-1, -1: HOST). */
static int run_pair(struct prod *p, int src, int dst)
{
  struct pair pr = {.src = src, .dst = dst};
  int rc = pair_open(p, src, dst, &pr.ch);
  if (rc != 0)
    return rc;
  pr.stream = src >= 0 ? bench_stream_make(p->o->stream, src) : NULL;
  size_t nrows = sizeof(bench_rows) / sizeof(bench_rows[0]);
  for (size_t i = 0; rc == 0 && i < nrows; i++)
    rc = bench_rows[i](p, &pr);
  if (src >= 0)
    bench_stream_free(p->o->stream, src, pr.stream);
  gpuipc_channel_close(pr.ch);
  int rc2 = ctl_order(&p->ctl, OP_CLOSE, 0, 0, 0);
  return rc != 0 ? rc : rc2;
}

/* ------------------------------------------------------------------------ */
/* Arguments and the run                                                    */
/* ------------------------------------------------------------------------ */

static int parse_kind(const char *s, gpuipc_kind_t *out)
{
  for (int k = GPUIPC_KIND_AUTO; k <= GPUIPC__KIND_LAST; k++)
    if (strcmp(s, gpuipc_kind_name((gpuipc_kind_t)k)) == 0) {
      *out = (gpuipc_kind_t)k;
      return 0;
    }
  return -1;
}

static int parse_devices(const char *s, struct bench_opts *o)
{
  o->ndev = 0;
  while (*s != '\0') {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || v < 0 || v > 1023 || o->ndev == MAX_DEVS ||
        (*end != ',' && *end != '\0'))
      return -1;
    o->devs[o->ndev++] = (int)v;
    s = *end == ',' ? end + 1 : end;
  }
  return o->ndev > 0 ? 0 : -1;
}

static int parse_args(int argc, char **argv, struct bench_opts *o)
{
  const struct gpuipc_cmd *cmd = &gpuipc_cmd_bench;
  int devs_given = 0, max_given = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--json") == 0) {
      o->json = 1;
    } else if (strcmp(a, "--quick") == 0) {
      o->quick = 1;
    } else if (strcmp(a, "--kind") == 0 && v != NULL) {
      if (parse_kind(v, &o->kind) != 0)
        return cli_usage_error(cmd, "unknown kind '%s'", v);
      i++;
    } else if (strcmp(a, "--stream") == 0 && v != NULL) {
      int m = 0;
      while (m < 4 && strcmp(v, bench_stream_names[m]) != 0)
        m++;
      if (m == 4)
        return cli_usage_error(cmd, "unknown stream '%s'", v);
      o->stream = (enum stream_mode)m;
      i++;
    } else if (strcmp(a, "--max-bytes") == 0 && v != NULL) {
      char *end;
      unsigned long long n = strtoull(v, &end, 0);
      if (*end != '\0' || n < 4096 || n > ((unsigned long long)1 << 36))
        return cli_usage_error(cmd, "--max-bytes wants 4096 .. 64 GiB");
      o->max_bytes = (size_t)n;
      max_given = 1;
      i++;
    } else if (strcmp(a, "--runs") == 0 && v != NULL) {
      char *end;
      long n = strtol(v, &end, 10);
      if (*end != '\0' || n < DEF_RUNS || n > MAX_RUNS)
        return cli_usage_error(cmd, "--runs wants %d .. %d", DEF_RUNS,
                               MAX_RUNS);
      o->runs = (int)n;
      i++;
    } else if (strcmp(a, "--devices") == 0 && v != NULL) {
      if (parse_devices(v, o) != 0)
        return cli_usage_error(cmd, "bad device list '%s'", v);
      devs_given = 1;
      i++;
    } else {
      return cli_usage_error(cmd, "unexpected argument '%s'", a);
    }
  }
  if (!max_given)
    o->max_bytes = o->quick ? ((size_t)64 << 20) : ((size_t)1 << 30);
  /* A kind asked for by name is measured or refused, never swapped. */
  if (o->kind != GPUIPC_KIND_AUTO && gpuipc_kind_available(o->kind) != 0)
    return cli_fail(cmd, "kind %s is not available here: %s",
                    gpuipc_kind_name(o->kind), gpuipc_last_error());
  int n = gpuipc_device_count();
  if (o->kind == GPUIPC_KIND_HOST || n <= 0) {
    o->kind = GPUIPC_KIND_HOST;
    o->ndev = 0;
  } else if (!devs_given) {
    o->ndev = n < MAX_DEVS ? n : MAX_DEVS;
    for (int i = 0; i < o->ndev; i++)
      o->devs[i] = i;
  } else {
    for (int i = 0; i < o->ndev; i++)
      if (o->devs[i] >= n)
        return cli_usage_error(cmd, "no GPU %d here (%d visible)", o->devs[i],
                               n);
  }
  return CLI_EXIT_OK;
}

static int count_steps(const struct bench_opts *o)
{
  int sizes = 0;
  for (size_t b = 4096; b <= o->max_bytes; b *= 4)
    sizes++;
  int pairs = o->ndev == 0 ? 1 : o->ndev * o->ndev;
  /* latency, sizes, kloop, block sizes */
  return pairs * (1 + sizes + (o->ndev > 0) + bench_blocks_sizes(o));
}

static int run_all(struct prod *p)
{
  if (p->o->ndev == 0)
    return run_pair(p, -1, -1);
  int rc = 0;
  for (int i = 0; rc == 0 && i < p->o->ndev; i++)
    for (int k = 0; rc == 0 && k < p->o->ndev; k++)
      rc = run_pair(p, p->o->devs[i], p->o->devs[k]);
  return rc;
}

static int reap(pid_t pid)
{
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR)
      return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int bench_run(int argc, char **argv)
{
  if (argc == 4 && strcmp(argv[1], "--peer") == 0)
    return peer_main(argv[2], argv[3]);
  struct bench_opts o = {.kind = GPUIPC_KIND_AUTO, .stream = ST_NULL,
                         .runs = DEF_RUNS};
  int rc = parse_args(argc, argv, &o);
  if (rc != CLI_EXIT_OK)
    return rc;
  struct prod p;
  memset(&p, 0, sizeof(p));
  p.o = &o;
  p.steps = count_steps(&o);
  p.t0 = bench_now_us();
  char domain[64];
  snprintf(domain, sizeof(domain), "bench-%d", (int)getpid());
  rc = gpuipc_domain_join(domain, NULL, &p.dom);
  if (rc == 0)
    rc = spawn_peer(&p, domain);
  if (rc == 0)
    rc = ctl_init(&p.ctl, p.dom);
  if (rc == 0)
    rc = run_all(&p);
  if (isatty(STDERR_FILENO))
    fprintf(stderr, "\r\033[K");
  int64_t end[4] = {OP_END, 0, 0, 0};
  if (p.ctl.ch != NULL && bench_ctl_send(&p.ctl, end) == 0)
    gpuipc_channel_send_done(p.ctl.ch, p.ctl.tickets[(p.ctl.next - 1) % CTL_SLOTS],
                     10000);
  char why[1024] = "";
  if (rc != 0)
    snprintf(why, sizeof(why), "%s (%s)", gpuipc_last_error(),
             gpuipc_err_name(rc));
  ctl_fini(&p.ctl);
  int peer_rc = 0;
  if (p.peer > 0) {
    if (rc != 0)
      kill(p.peer, SIGTERM);
    peer_rc = reap(p.peer);
  }
  if (p.dom != NULL)
    gpuipc_domain_leave(p.dom);
  if (rc == 0 && peer_rc != 0) {
    snprintf(why, sizeof(why), "the receiving process exited with %d",
             peer_rc);
    rc = -1;
  }
  if (rc == 0) {
    if (o.json)
      bench_print_json(&p);
    else
      bench_print_tables(&p);
  }
  free(p.r.bw);
  free(p.r.blocks);
  return rc == 0 ? CLI_EXIT_OK : cli_fail(&gpuipc_cmd_bench, "%s", why);
}

const struct gpuipc_cmd gpuipc_cmd_bench = {
    .name = "bench",
    .summary = "measure channels on this machine against the driver's copies",
    .usage = bench_usage,
    .run = bench_run,
};
