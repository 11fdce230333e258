/*
 * gpuipc bench, blocks of a paged cache (bench/blocks_bench.cu's rows, in
 * the CLI): for each GPU and ordered pair (and HOST), N blocks of 16 and
 * of 256 KiB (N = 1,024, or fewer where --max-bytes does not hold a cache
 * of 4 N blocks), chosen from scattered slots of a cache of 4 N blocks (a
 * fixed-seed shuffle) and moved into scattered slots of another cache of
 * 4 N (another). A round is timed from the sender's first call until the
 * last of its messages is free (gpuipc_channel_send_done); one round
 * warms up, then --runs rounds, and the row is their median. Rows:
 *
 *   blocks_gpuipc       one gpuipc_channel_send_blocks, received with one
 *                       gpuipc_channel_recv_blocks by the other process
 *                       (on --stream streams, --kind buffers);
 *   blocks_per_message  one gpuipc_channel_send a block, received with
 *                       gpuipc_channel_recv_into into its destination;
 *   blocks_floor        this process alone, between a cache of its own
 *                       on each GPU: the driver's batched copy of the
 *                       same blocks (cuMemcpyBatchAsync, through
 *                       gpuipc__stream_copy_batch) on a created stream of
 *                       the destination GPU, peer access on; on the host,
 *                       memcpy of each block;
 *   blocks_floor_kernel this process alone, between GPUs that reach each
 *                       other (or on one): one launch of gpuipc's own
 *                       block kernel (gpuipc__copy_blocks, what
 *                       recv_blocks launches), its list in pinned memory,
 *                       on the same stream; left out where the kernel
 *                       cannot be launched.
 *
 * Source slot s holds the byte slot_byte(s) throughout. The receiver
 * zeroes its cache before each row and checks every byte of every block
 * after the last round; this process checks the floor's copy likewise.
 */
#include "bench.h"
#include "core/core.h"    /* gpuipc__err */
#include "core/private.h" /* gpuipc__stream_sync */
#include "cuda/cuda.h"    /* gpuipc__stream_copy_batch */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const size_t block_sizes[] = {(size_t)16 << 10, (size_t)256 << 10};
#define NSIZES (sizeof(block_sizes) / sizeof(block_sizes[0]))

/* Blocks a round of @bytes each under @max_bytes a cache; 0: none. */
static int blocks_n(size_t bytes, size_t max_bytes)
{
  size_t n = max_bytes / bytes / BLOCKS_SPREAD;
  return n > BLOCKS_N ? BLOCKS_N : (int)n;
}

int bench_blocks_sizes(const struct bench_opts *o)
{
  int k = 0;
  for (size_t i = 0; i < NSIZES; i++)
    k += blocks_n(block_sizes[i], o->max_bytes) > 0;
  return k;
}

/* The byte every byte of source slot @s holds: never 0 (a cache is
 * zeroed before a row, so a block not copied shows). */
static uint8_t slot_byte(uint32_t s)
{
  return (uint8_t)(1 + (s * 151u + (s >> 8)) % 255);
}

/* Where a round's blocks are: @n slots of @bytes out of @n x SPREAD. */
struct blay {
  size_t bytes;
  int n;
  uint32_t src[BLOCKS_N], dst[BLOCKS_N];
};

/* @n distinct slots of @n x BLOCKS_SPREAD, shuffled from @seed. */
static void pick(uint32_t *out, int n, uint64_t seed)
{
  uint32_t all[BLOCKS_N * BLOCKS_SPREAD];
  int slots = n * BLOCKS_SPREAD;
  for (int i = 0; i < slots; i++)
    all[i] = (uint32_t)i;
  uint64_t x = seed;
  for (int i = 0; i < n; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    int j = i + (int)((x >> 33) % (uint64_t)(slots - i));
    uint32_t t = all[i];
    all[i] = all[j];
    all[j] = t;
  }
  memcpy(out, all, (size_t)n * sizeof(*out));
}

/* Both processes draw the same slots: the sources, then the destinations. */
static void blay_init(struct blay *l, size_t bytes, int n)
{
  l->bytes = bytes;
  l->n = n;
  pick(l->src, n, 1);
  pick(l->dst, n, 2);
}

static size_t cache_bytes(const struct blay *l)
{
  return l->bytes * (size_t)l->n * BLOCKS_SPREAD;
}

/* A cache on @dev (< 0: HOST), every byte @v (a destination). */
static int cache_make(int dev, gpuipc_kind_t kind, const struct blay *l,
                      uint8_t v, gpuipc_buf_t **out)
{
  gpuipc_kind_t k = dev < 0 ? GPUIPC_KIND_HOST : kind;
  int rc = gpuipc_buf_alloc(cache_bytes(l), k, dev, 0, out);
  if (rc == 0)
    rc = bench_fill(dev, gpuipc_buf_ptr(*out), v, cache_bytes(l));
  return rc;
}

static void blocks_list(gpuipc_block_t *b, gpuipc_buf_t *buf,
                        const uint32_t *slots, const struct blay *l)
{
  for (int k = 0; k < l->n; k++)
    b[k] = (gpuipc_block_t){buf, (uint64_t)slots[k] * l->bytes, l->bytes};
}

/* The first of @n bytes at @q that is not @v; @n if none. */
static size_t first_not(const uint8_t *q, size_t n, uint8_t v)
{
  size_t i = 0;
  while (i < n && q[i] == v)
    i++;
  return i;
}

/* Every byte of block k (slot dst[k] of the cache at @base, on @dev)
 * holds source slot src[k]'s byte. */
static int blocks_check(int dev, const uint8_t *base, const struct blay *l,
                        const char *who)
{
  uint8_t *tmp = dev >= 0 ? malloc(l->bytes) : NULL;
  if (dev >= 0 && tmp == NULL)
    return -ENOMEM;
  int rc = 0;
  for (int k = 0; rc == 0 && k < l->n; k++) {
    const uint8_t *q = base + (size_t)l->dst[k] * l->bytes;
    if (dev >= 0) {
      rc = bench_dev_read(dev, tmp, q, l->bytes);
      q = tmp;
    }
    uint8_t want = slot_byte(l->src[k]);
    size_t i = rc == 0 ? first_not(q, l->bytes, want) : l->bytes;
    if (i < l->bytes)
      rc = gpuipc__err(-EBADMSG, "bench: %s: block %d (%zu bytes) holds "
                       "%#x at byte %zu where %#x was sent", who, k,
                       l->bytes, q[i], i, want);
  }
  free(tmp);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* The producer                                                             */
/* ------------------------------------------------------------------------ */

/* This process's side of one block size. */
struct bside {
  struct blay l;
  gpuipc_buf_t *from, *to; /* the source cache; the floor's destination */
  int peer;                /* between GPUs: peer access on (1); else 0, -1 */
  void *fstream;           /* the floor's: created, on the destination */
  uint64_t *klist;         /* the kernel floor's list; NULL: no such row */
  gpuipc_block_t blocks[BLOCKS_N];
  uint64_t tickets[BLOCKS_N];
  void *fdst[BLOCKS_N];
  const void *fsrc[BLOCKS_N];
  size_t fbytes[BLOCKS_N];
};

typedef int (*round_fn)(const struct pair *pr, struct bside *s);

/* The floor's copies: from the source cache into the other. */
static void floor_list(struct bside *s)
{
  uint8_t *to = gpuipc_buf_ptr(s->to), *from = gpuipc_buf_ptr(s->from);
  for (int k = 0; k < s->l.n; k++) {
    s->fdst[k] = to + (size_t)s->l.dst[k] * s->l.bytes;
    s->fsrc[k] = from + (size_t)s->l.src[k] * s->l.bytes;
    s->fbytes[k] = s->l.bytes;
  }
}

/* The source cache on @dev: slot k holds slot_byte(k). */
static int source_make(int dev, gpuipc_kind_t kind, const struct blay *l,
                       gpuipc_buf_t **out)
{
  gpuipc_kind_t k = dev < 0 ? GPUIPC_KIND_HOST : kind;
  int rc = gpuipc_buf_alloc(cache_bytes(l), k, dev, 0, out);
  uint8_t *base = rc == 0 ? gpuipc_buf_ptr(*out) : NULL;
  uint32_t slots = (uint32_t)l->n * BLOCKS_SPREAD;
  for (uint32_t s = 0; rc == 0 && s < slots; s++)
    rc = bench_fill(dev, base + (size_t)s * l->bytes, slot_byte(s), l->bytes);
  return rc;
}

/* The kernel floor's list (dst, src, bytes a copy), in memory the GPU
 * reads; none (no such row) where there is none to be had. */
static void klist_make(int dev, struct bside *s)
{
  size_t n = (size_t)s->l.n;
  if (gpuipc__pinned_alloc(dev, n * 3 * sizeof(uint64_t), &s->klist) != 0) {
    s->klist = NULL;
    return;
  }
  for (size_t k = 0; k < n; k++) {
    s->klist[3 * k] = (uint64_t)(uintptr_t)s->fdst[k];
    s->klist[3 * k + 1] = (uint64_t)(uintptr_t)s->fsrc[k];
    s->klist[3 * k + 2] = s->fbytes[k];
  }
}

static int bside_open(struct prod *p, const struct pair *pr, struct bside *s)
{
  int src = pr->src, dst = pr->dst;
  int rc = source_make(src, p->o->kind, &s->l, &s->from);
  if (rc == 0)
    rc = cache_make(dst, p->o->kind, &s->l, 0, &s->to);
  if (rc != 0)
    return rc;
  /* As run_bandwidth: the driver's copy at NVLink speed between GPUs. */
  s->peer = -1;
  if (src >= 0 && src != dst)
    s->peer = bench_peer_on(src, dst) && gpuipc_buf_access(s->to, src) == 0 &&
              gpuipc_buf_access(s->from, dst) == 0;
  if (dst >= 0 && (s->fstream = bench_stream_make(ST_CREATED, dst)) == NULL)
    return gpuipc__err(GPUIPC_E_CUDA, "bench: no stream on GPU %d: %s", dst,
                       gpuipc_last_error());
  blocks_list(s->blocks, s->from, s->l.src, &s->l);
  floor_list(s);
  if (dst >= 0 && s->peer != 0)
    klist_make(dst, s);
  return 0;
}

static void bside_close(const struct pair *pr, struct bside *s)
{
  if (pr->dst >= 0) {
    bench_stream_free(ST_CREATED, pr->dst, s->fstream);
    gpuipc__pinned_free(pr->dst, s->klist);
  }
  if (s->to != NULL)
    gpuipc_buf_release(s->to);
  if (s->from != NULL)
    gpuipc_buf_release(s->from);
}

static int round_batch(const struct pair *pr, struct bside *s)
{
  int rc = gpuipc_channel_send_blocks(pr->ch, s->blocks, (size_t)s->l.n,
                                      pr->stream, 0, &s->tickets[0]);
  return rc != 0 ? rc : gpuipc_channel_send_done(pr->ch, s->tickets[0],
                                                 WAIT_MS);
}

static int round_messages(const struct pair *pr, struct bside *s)
{
  uint8_t *base = gpuipc_buf_ptr(s->from);
  int rc = 0;
  for (int k = 0; rc == 0 && k < s->l.n; k++) {
    struct tens x;
    tens_init(&x, s->from, base + s->blocks[k].offset, pr->src, s->l.bytes);
    rc = gpuipc_channel_send(pr->ch, &x.t, pr->stream, 0, &s->tickets[k]);
  }
  for (int k = 0; rc == 0 && k < s->l.n; k++)
    rc = gpuipc_channel_send_done(pr->ch, s->tickets[k], WAIT_MS);
  return rc;
}

static int round_floor(const struct pair *pr, struct bside *s)
{
  if (pr->src < 0) {
    for (int k = 0; k < s->l.n; k++)
      memcpy(s->fdst[k], s->fsrc[k], s->fbytes[k]);
    __asm__ volatile("" : : : "memory");
    return 0;
  }
  int rc = gpuipc__stream_copy_batch(pr->dst, s->fdst, s->fsrc, s->fbytes,
                                     (size_t)s->l.n, s->fstream);
  return rc != 0 ? rc : gpuipc__stream_sync(pr->dst, s->fstream);
}

static int round_kernel(const struct pair *pr, struct bside *s)
{
  int rc = gpuipc__copy_blocks(pr->dst, s->klist, (unsigned)s->l.n,
                               s->fstream, 0, 0, 0);
  return rc != 0 ? rc : gpuipc__stream_sync(pr->dst, s->fstream);
}

/* One round to warm up (the first imports the buffers), then @runs timed. */
static int timed_rounds(const struct pair *pr, struct bside *s, round_fn fn,
                        int runs, double *us)
{
  int rc = 0;
  for (int r = -1; rc == 0 && r < runs; r++) {
    double t0 = bench_now_us();
    rc = fn(pr, s);
    if (r >= 0)
      us[r] = bench_now_us() - t0;
  }
  return rc;
}

/* A row through the channel: the receiver takes order @op, receives
 * every round and checks the last. */
static int row_channel(struct prod *p, const struct pair *pr, struct bside *s,
                       int op, round_fn fn, double *us)
{
  int64_t order[4] = {op, (int64_t)s->l.bytes, s->l.n, p->o->runs + 1};
  int64_t ans[4] = {0};
  int rc = bench_ctl_send(&p->ctl, order);
  if (rc == 0)
    rc = timed_rounds(pr, s, fn, p->o->runs, us);
  if (rc == 0)
    rc = bench_ctl_recv(&p->ctl, ans);
  return rc != 0 ? rc : bench_answer(ans);
}

static int row_floor(struct prod *p, const struct pair *pr, struct bside *s,
                     double *us)
{
  int rc = timed_rounds(pr, s, round_floor, p->o->runs, us);
  if (rc == 0)
    rc = blocks_check(pr->dst, gpuipc_buf_ptr(s->to), &s->l,
                      "blocks_floor, the copy");
  return rc;
}

/* The kernel floor into a zeroed cache: 1 measured, 0 left out (no
 * kernel here), or the error. */
static int row_kernel(struct prod *p, const struct pair *pr,
                      struct bside *s, double *us)
{
  if (s->klist == NULL)
    return 0;
  int rc = bench_fill(pr->dst, gpuipc_buf_ptr(s->to), 0, cache_bytes(&s->l));
  if (rc == 0)
    rc = timed_rounds(pr, s, round_kernel, p->o->runs, us);
  if (rc == GPUIPC_E_UNSUPPORTED)
    return 0;
  if (rc == 0)
    rc = blocks_check(pr->dst, gpuipc_buf_ptr(s->to), &s->l,
                      "blocks_floor_kernel, the copy");
  return rc == 0 ? 1 : rc;
}

static int row_add(struct prod *p, const struct pair *pr,
                   const struct bside *s, const char *name, const double *us)
{
  struct results *r = &p->r;
  if (r->nblocks == r->capblocks) {
    int cap = r->capblocks ? r->capblocks * 2 : 16;
    struct blocks_row *nb = realloc(r->blocks, (size_t)cap * sizeof(*nb));
    if (nb == NULL)
      return -ENOMEM;
    r->blocks = nb;
    r->capblocks = cap;
  }
  struct blocks_row *b = &r->blocks[r->nblocks++];
  *b = (struct blocks_row){.src = pr->src, .dst = pr->dst, .row = name,
                           .bytes = s->l.bytes, .n = s->l.n,
                           .runs = p->o->runs, .peer = -1};
  if (strncmp(name, "blocks_floor", 12) == 0)
    b->peer = s->peer;
  double sorted[MAX_RUNS], p99;
  memcpy(b->us, us, (size_t)b->runs * sizeof(*us));
  memcpy(sorted, us, (size_t)b->runs * sizeof(*us));
  bench_stats(sorted, b->runs, &b->median, &p99);
  return 0;
}

/* The three rows of @bytes x @n. */
static int blocks_size(struct prod *p, const struct pair *pr, size_t bytes,
                       int n)
{
  bench_progress(p, "blocks", pr->src, pr->dst, bytes);
  struct bside *s = calloc(1, sizeof(*s));
  if (s == NULL)
    return -ENOMEM;
  blay_init(&s->l, bytes, n);
  double us[MAX_RUNS];
  int rc = bside_open(p, pr, s);
  if (rc == 0)
    rc = row_channel(p, pr, s, OP_BLOCKS, round_batch, us);
  if (rc == 0)
    rc = row_add(p, pr, s, "blocks_gpuipc", us);
  if (rc == 0)
    rc = row_channel(p, pr, s, OP_BLOCKS_MSG, round_messages, us);
  if (rc == 0)
    rc = row_add(p, pr, s, "blocks_per_message", us);
  if (rc == 0)
    rc = row_floor(p, pr, s, us);
  if (rc == 0)
    rc = row_add(p, pr, s, "blocks_floor", us);
  int k = rc == 0 ? row_kernel(p, pr, s, us) : rc;
  rc = k < 0 ? k : 0;
  if (k == 1)
    rc = row_add(p, pr, s, "blocks_floor_kernel", us);
  bside_close(pr, s);
  free(s);
  return rc;
}

int bench_blocks_run(struct prod *p, const struct pair *pr)
{
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < NSIZES; i++) {
    int n = blocks_n(block_sizes[i], p->o->max_bytes);
    if (n > 0)
      rc = blocks_size(p, pr, block_sizes[i], n);
  }
  return rc;
}

const struct blocks_row *bench_blocks_find(const struct results *r, int src,
                                           int dst, size_t bytes,
                                           const char *name)
{
  for (int i = 0; i < r->nblocks; i++) {
    const struct blocks_row *b = &r->blocks[i];
    if (b->src == src && b->dst == dst && b->bytes == bytes &&
        strcmp(b->row, name) == 0)
      return b;
  }
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* The receiver                                                             */
/* ------------------------------------------------------------------------ */

/* The receiver's side of one row. */
struct rside {
  struct blay l;
  gpuipc_buf_t *cache;
  gpuipc_block_t blocks[BLOCKS_N];
};

/* One round of one message a block, each into its destination. */
static int recv_each(struct peer *p, const struct rside *r)
{
  uint8_t *base = gpuipc_buf_ptr(r->cache);
  int rc = 0;
  for (int k = 0; rc == 0 && k < r->l.n; k++) {
    struct tens t;
    tens_init(&t, r->cache, base + r->blocks[k].offset, p->dev, r->l.bytes);
    rc = gpuipc_channel_recv_into(p->data, &t.t, p->stream, WAIT_MS);
  }
  return rc;
}

static int peer_rounds(struct peer *p, int op, struct rside *r, long rounds)
{
  int rc = 0;
  for (long i = 0; rc == 0 && i < rounds; i++)
    rc = op == OP_BLOCKS
             ? gpuipc_channel_recv_blocks(p->data, r->blocks,
                                          (size_t)r->l.n, p->stream, WAIT_MS)
             : recv_each(p, r);
  if (rc == 0 && p->dev >= 0)
    rc = gpuipc__stream_sync(p->dev, p->stream);
  if (rc == 0)
    rc = blocks_check(p->dev, gpuipc_buf_ptr(r->cache), &r->l,
                      op == OP_BLOCKS ? "blocks_gpuipc, the receiver"
                                      : "blocks_per_message, the receiver");
  return rc;
}

int bench_blocks_peer(struct peer *p, int op, size_t bytes, long n,
                      long rounds)
{
  if (p->data == NULL || n < 1 || n > BLOCKS_N || bytes == 0 ||
      bytes > ((size_t)1 << 30) || rounds < 1)
    return gpuipc__err(GPUIPC_E_PROTO, "bench: a block order of %ld blocks "
                       "of %zu bytes, %ld rounds", n, bytes, rounds);
  struct rside *r = calloc(1, sizeof(*r));
  if (r == NULL)
    return -ENOMEM;
  blay_init(&r->l, bytes, (int)n);
  int rc = cache_make(p->dev, p->kind, &r->l, 0, &r->cache);
  if (rc == 0) {
    blocks_list(r->blocks, r->cache, r->l.dst, &r->l);
    rc = peer_rounds(p, op, r, rounds);
  }
  if (r->cache != NULL)
    gpuipc_buf_release(r->cache);
  free(r);
  return rc;
}
