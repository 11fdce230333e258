/*
 * gpuipc_share_copy and gpuipc_segment_copy_shared: the arguments
 * (checked before anything is created), joining the round (the table
 * "<round>.share", a slot, the lent destination) and leaving it (drain
 * the readers, let go of what was lent and opened; the last member out
 * closes the table and unlinks its names). Whatever keeps a member out
 * of the round -- another layout, a full table, a closed one, a table it
 * cannot map for its GPU -- makes it copy alone from the publisher.
 */
#include "share/share.h"
#include "domain/domain.h"
#include "domain/proto.h"
#include "segment/segment.h"
#include "mem/mem.h"
#include "cuda/cuda.h"
#include "os/os.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ----- arguments ----- */

struct range {
  uintptr_t start, end;
  int ext;
};

static int range_cmp(const void *a, const void *b)
{
  const struct range *x = a, *y = b;
  return x->start < y->start ? -1 : x->start > y->start;
}

/* Whether extents' destinations overlap (by address: two handles may
 * map one memory). */
static int dst_overlap(const gpuipc_share_extent_t *ext, int n)
{
  struct range *r = calloc((size_t)n, sizeof(*r));
  if (r == NULL)
    return gpuipc__err(-ENOMEM, "gpuipc_share_copy: out of memory");
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (ext[i].bytes == 0)
      continue;
    r[m].start = (uintptr_t)gpuipc_buf_ptr(ext[i].dst) + ext[i].dst_off;
    r[m].end = r[m].start + ext[i].bytes;
    r[m].ext = i;
    m++;
  }
  qsort(r, (size_t)m, sizeof(*r), range_cmp);
  int rc = 0;
  for (int i = 1; i < m && rc == 0; i++)
    if (r[i].start < r[i - 1].end)
      rc = gpuipc__err(-EINVAL, "gpuipc_share_copy: the destinations of "
                       "extents %d and %d overlap", r[i - 1].ext, r[i].ext);
  free(r);
  return rc;
}

static int range_check(int i, const char *what, const gpuipc_buf_t *b,
                       size_t off, size_t bytes)
{
  if (b == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_share_copy: extent %d: %s is NULL",
                       i, what);
  size_t size = gpuipc_buf_size(b);
  if (off > size || bytes > size - off)
    return gpuipc__err(-EINVAL, "gpuipc_share_copy: extent %d: %zu bytes at "
                       "%s offset %zu go past its %zu bytes", i, bytes, what,
                       off, size);
  return 0;
}

/* The extents, and the one device of their destinations (-1: HOST). */
static int ext_check(const gpuipc_share_extent_t *ext, int n, int *device)
{
  int dev = -2;
  for (int i = 0; i < n; i++) {
    int rc = range_check(i, "src", ext[i].src, ext[i].src_off, ext[i].bytes);
    if (rc == 0)
      rc = range_check(i, "dst", ext[i].dst, ext[i].dst_off, ext[i].bytes);
    if (rc != 0)
      return rc;
    int d = gpuipc_buf_kind(ext[i].dst) == GPUIPC_KIND_HOST
                ? -1 : gpuipc_buf_device(ext[i].dst);
    if (dev != -2 && d != dev)
      return gpuipc__err(-EINVAL, "gpuipc_share_copy: extent %d's "
                         "destination is on device %d, extent 0's on %d: "
                         "one call copies to one device (-1: HOST)", i, d,
                         dev);
    dev = d;
  }
  *device = dev;
  return dst_overlap(ext, n);
}

/* A round name (@what: which one): a segment name of at most
 * GPUIPC_SHARE_ROUND_MAX characters. */
static int round_check(const char *name, const char *what)
{
  char ctx[64];
  snprintf(ctx, sizeof(ctx), "gpuipc_share_copy: %s", what);
  int rc = gpuipc__name_check(name, ctx);
  if (rc != 0)
    return rc;
  if (strlen(name) > GPUIPC_SHARE_ROUND_MAX)
    return gpuipc__err(-EINVAL, "gpuipc_share_copy: %s \"%s\" is longer "
                       "than %d characters (its table's name adds %zu)", what,
                       name, GPUIPC_SHARE_ROUND_MAX,
                       strlen(GPUIPC__SHARE_TABLE_SUFFIX));
  return 0;
}

/* The size gpuipc_share_stats_t had first (up to passed_over); the other
 * one it has had is its whole. */
#define STATS_SIZE_1 offsetof(gpuipc_share_stats_t, recopied)

static int opts_check(gpuipc_domain_t *dom, const gpuipc_share_opts_t *opts,
                      uint64_t *chunk_bytes, int *timeout_ms,
                      gpuipc_share_stats_t **stats, size_t *stats_size,
                      const char **next)
{
  gpuipc_share_opts_t u = GPUIPC_SHARE_OPTS_INIT;
  if (opts != NULL) {
    int rc = gpuipc__size_check(opts->size, "gpuipc_share_copy: opts");
    if (rc != 0)
      return rc;
    u.stats_size = 0; /* an older opts has none: the first version's */
    gpuipc__opts_read(&u, sizeof(u), opts, opts->size);
  }
  if (u.stats_size == 0)
    u.stats_size = STATS_SIZE_1;
  if (u.stats_size != STATS_SIZE_1 &&
      u.stats_size != sizeof(gpuipc_share_stats_t))
    return gpuipc__err(-EINVAL, "gpuipc_share_copy: opts->stats_size %zu is "
                       "not a size of gpuipc_share_stats_t (%zu or %zu)",
                       u.stats_size, (size_t)STATS_SIZE_1,
                       sizeof(gpuipc_share_stats_t));
  *stats_size = u.stats_size;
  if (u.flags != 0)
    return gpuipc__err(-EINVAL, "gpuipc_share_copy: unknown flags 0x%x",
                       u.flags);
  if (u.chunk_bytes % GPUIPC__SHARE_CHUNK_ALIGN != 0 ||
      u.chunk_bytes > GPUIPC_SIZE_MAX_ABSURD)
    return gpuipc__err(-EINVAL, "gpuipc_share_copy: chunk_bytes %zu is not "
                       "a multiple of %zu (or is above 2^48)", u.chunk_bytes,
                       GPUIPC__SHARE_CHUNK_ALIGN);
  *chunk_bytes = u.chunk_bytes != 0 ? u.chunk_bytes
                                    : GPUIPC__SHARE_CHUNK_DEFAULT;
  *stats = u.stats;
  *next = u.next_round;
  if (u.next_round != NULL) {
    int rc = round_check(u.next_round, "opts->next_round");
    if (rc != 0)
      return rc;
  }
  return gpuipc__timeout_resolve("gpuipc_share_copy", "timeout_ms",
                                 u.timeout_ms, gpuipc__dom_timeout(dom),
                                 timeout_ms);
}

static int args_check(gpuipc_domain_t *dom, const char *round,
                      const gpuipc_share_extent_t *ext, int n, int *device)
{
  if (dom == NULL || round == NULL || ext == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_share_copy: %s is NULL",
                       dom == NULL ? "dom" : round == NULL ? "round" : "ext");
  int rc = round_check(round, "round name");
  if (rc != 0)
    return rc;
  if (n <= 0 || n > GPUIPC__SHARE_EXT_MAX)
    return gpuipc__err(-EINVAL, "gpuipc_share_copy: n %d is not 1..%d", n,
                       GPUIPC__SHARE_EXT_MAX);
  return ext_check(ext, n, device);
}

/* ----- joining ----- */

/* The local GPU the memory of @b lies on (not the one it is mapped for),
 * or -1 for HOST. */
static int home_gpu(const gpuipc_buf_t *b)
{
  if (gpuipc_buf_kind(b) == GPUIPC_KIND_HOST)
    return -1;
  const struct gpuipc_buf *base = b->base != NULL ? b->base : b;
  return gpuipc_device_by_uuid(base->uuid);
}

/* The round's table: opened ahead by the last call, or now. */
static int table_open(struct share_call *c, struct share_table *t)
{
  int rc = gpuipc__share_ahead_take(c->dom, c->round, c->l, c->device, t,
                                    &c->words);
  if (rc == 0)
    c->st.ahead = 1;
  else if ((rc = gpuipc__share_table_open(c->dom, c->round, c->l, c->device,
                                          c->timeout_ms, t, &c->words)) != 0)
    return rc;
  if (!atomic_load(&t->hdr->closed))
    return 0;
  gpuipc_buf_release(t->buf);
  return gpuipc__err(-ESTALE, "gpuipc_share_copy(%s): the round is over",
                     c->round);
}

static int slot_take(struct share_table *t)
{
  uint32_t pid = (uint32_t)getpid();
  for (int s = 0; s < GPUIPC__SHARE_MEMBERS; s++) {
    uint32_t zero = 0;
    if (atomic_compare_exchange_strong(&t->members[s].pid, &zero, pid))
      return s;
  }
  return gpuipc__err(-EUSERS, "gpuipc_share_copy: the round has %d members",
                     GPUIPC__SHARE_MEMBERS);
}

/* Join the round: 0 with c->t set, or why not (the caller goes alone). */
static int join(struct share_call *c, struct share_table *t,
                struct share_lent **lent)
{
  int rc = table_open(c, t);
  if (rc != 0)
    return rc;
  int s = slot_take(t);
  if (s < 0) {
    gpuipc_buf_release(t->buf);
    return s;
  }
  struct share_member *m = &t->members[s];
  uint64_t st = 0;
  (void)gpuipc__pid_start_time(getpid(), &st);
  m->start_time = st;
  m->joined_ns = gpuipc__now_ns();
  if (atomic_load(&t->hdr->closed)) {
    atomic_store(&m->flags, GPUIPC__SM_LEFT);
    gpuipc_buf_release(t->buf);
    return -ESTALE;
  }
  c->t = t;
  c->me = s;
  c->server = gpuipc__share_lend(c->dom, t, s, c->l, lent, &c->st.lent) == 0;
  c->ticket = gpuipc__share_ticket_take(t, s);
  atomic_store_explicit(&m->flags,
                        GPUIPC__SM_LIVE | (c->server ? GPUIPC__SM_SERVER : 0),
                        memory_order_release);
  c->st.joined = 1;
  c->st.server = c->server;
  c->st.slot = s;
  gpuipc__share_step(GPUIPC__SHARE_JOINED, -1);
  return 0;
}

/* ----- leaving ----- */

/* Whether this member, the last member out, closed the round: its
 * table's name then goes (once; gpuipc__share_round_end). The members'
 * lends stand (cache.c). */
static bool close_round(struct share_call *c)
{
  uint32_t open = 0;
  return !gpuipc__share_any_live(c->t, c->me, c->peers) &&
         atomic_compare_exchange_strong(&c->t->hdr->closed, &open, 1);
}

static int leave(struct share_call *c, struct share_lent *lent, int rc)
{
  char why[512];
  int wrc = gpuipc__share_settle(c);
  if (wrc == 0 && rc == 0) {
    gpuipc__share_step(GPUIPC__SHARE_SETTLED, -1);
    wrc = gpuipc__share_recheck(c);
  }
  if (rc == 0)
    rc = wrc;
  if (rc == 0 &&
      (atomic_load(&c->t->members[c->me].flags) & GPUIPC__SM_FAILED))
    rc = gpuipc__share_failed(c);
  if (rc == 0)
    gpuipc__share_linger(c);
  /* What went wrong, kept from the calls that let go below. */
  if (rc != 0)
    snprintf(why, sizeof(why), "%s", gpuipc_last_error());
  gpuipc__share_drain(c);
  gpuipc__share_lend_end(lent);
  /* Unsettled: kept mapped, copies from there may be queued. */
  gpuipc__share_peers_close(c->po, wrc == 0, &c->st.opened);
  c->po = NULL;
  atomic_fetch_or(&c->t->members[c->me].flags, GPUIPC__SM_LEFT);
  bool closed = close_round(c);
  /* Rounds whose members all died: swept by the creator of a table. */
  bool sweep = c->t->created;
  uint64_t now = gpuipc__share_cache_tick(c->dom);
  /* The table goes, unless unsettled (its stream writes there): on the
   * thread that opens the next round's, when the caller named one. */
  if (wrc != 0 || c->next_round == NULL || rc != 0 ||
      !gpuipc__share_ahead_start(c->dom, c->next_round, c->l, c->device,
                                 c->timeout_ms, c->t->buf, c->round, closed,
                                 sweep, now))
    gpuipc__share_round_end(c->dom, c->round, c->t->buf, closed, wrc != 0,
                            sweep);
  c->t = NULL;
  return rc != 0 ? gpuipc__err(rc, "%s", why) : 0;
}

/* ----- the calls ----- */

static int call_alloc(struct share_call *c, uint32_t nchunks)
{
  size_t n = nchunks > 0 ? nchunks : 1;
  c->have = calloc(n, 1);
  c->own = calloc(n, sizeof(uint64_t));
  c->seen_claim = calloc(n, sizeof(uint64_t));
  c->seen_ns = calloc(n, sizeof(uint64_t));
  c->seen_beat = calloc(n, sizeof(uint64_t));
  c->from = malloc(n);
  if (c->from != NULL)
    memset(c->from, -1, n);
  if (c->have && c->own && c->seen_claim && c->seen_ns && c->seen_beat &&
      c->from)
    return 0;
  return gpuipc__err(-ENOMEM, "gpuipc_share_copy: out of memory");
}

static void call_free(struct share_call *c)
{
  free(c->have);
  free(c->own);
  free(c->seen_claim);
  free(c->seen_ns);
  free(c->seen_beat);
  free(c->from);
}

/* Whether a GPU reader's destination is on the publisher's GPU. */
static bool on_publisher_gpu(const struct share_layout *l, int device)
{
  for (int i = 0; device >= 0 && i < l->n; i++)
    if (home_gpu(l->ext[i].src) == device)
      return true;
  return false;
}

/* The device whose streams copy: the destinations', else a source's. */
static int copy_device(const gpuipc_share_extent_t *ext, int n, int dst_dev)
{
  for (int i = 0; dst_dev < 0 && i < n; i++)
    if (gpuipc_buf_kind(ext[i].src) != GPUIPC_KIND_HOST)
      return gpuipc_buf_device(ext[i].src);
  return dst_dev;
}

static int share_run(struct share_call *c, int dst_dev)
{
  struct share_table t;
  struct share_lent *lent = NULL;
  bool pub_gpu = on_publisher_gpu(c->l, dst_dev);
  if (pub_gpu || join(c, &t, &lent) != 0) {
    c->t = NULL;
    int rc = gpuipc__share_alone(c);
    /* Kept out of this round (it was over, say), maybe not the next. */
    uint64_t now = gpuipc__share_cache_tick(c->dom);
    if (rc == 0 && !pub_gpu && c->next_round != NULL)
      (void)gpuipc__share_ahead_start(c->dom, c->next_round, c->l, c->device,
                                      c->timeout_ms, NULL, NULL, false, false,
                                      now);
    return rc;
  }
  return leave(c, lent, gpuipc__share_run(c));
}

int gpuipc_share_copy(gpuipc_domain_t *dom, const char *round,
                      const gpuipc_share_extent_t *ext, int n, void *stream,
                      const gpuipc_share_opts_t *opts)
{
  int dst_dev = -1;
  int rc = args_check(dom, round, ext, n, &dst_dev);
  uint64_t chunk_bytes = 0;
  int timeout_ms = 0;
  gpuipc_share_stats_t *stats = NULL;
  size_t stats_size = 0;
  const char *next_round = NULL;
  if (rc == 0)
    rc = opts_check(dom, opts, &chunk_bytes, &timeout_ms, &stats,
                    &stats_size, &next_round);
  if (rc != 0)
    return rc;
  struct share_layout l;
  rc = gpuipc__share_layout(ext, n, chunk_bytes, &l);
  if (rc != 0)
    return rc;
  struct share_call c = {0};
  c.dom = dom;
  c.round = round;
  c.l = &l;
  c.device = copy_device(ext, n, dst_dev);
  c.stream = stream;
  c.pwait_slot = -1;
  c.timeout_ms = timeout_ms;
  c.next_round = next_round;
  c.st.slot = -1;
  c.st.nchunks = l.nchunks;
  c.missing = l.nchunks;
  rc = call_alloc(&c, l.nchunks);
  if (rc == 0)
    rc = share_run(&c, dst_dev);
  gpuipc__share_stats_set(&c.st);
  if (stats != NULL) {
    gpuipc_share_stats_t out = {c.st.joined,      c.st.server,
                                c.st.nchunks,     c.st.from_pub,
                                c.st.from_peer,   c.st.reclaimed,
                                c.st.passed_over, c.st.recopied,
                                c.st.lent,        c.st.opened,
                                c.st.ahead};
    memcpy(stats, &out, stats_size); /* no byte past what the caller has */
  }
  call_free(&c);
  gpuipc__share_layout_free(&l);
  return rc;
}

int gpuipc_segment_copy_shared(gpuipc_domain_t *dom, gpuipc_buf_t *seg,
                               size_t src_off, gpuipc_buf_t *dst,
                               size_t dst_off, size_t bytes, void *stream,
                               const gpuipc_share_opts_t *opts)
{
  if (dom == NULL || seg == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_segment_copy_shared: %s is NULL",
                       dom == NULL ? "dom" : "seg");
  uint64_t id;
  if (gpuipc__seg_id_of(seg, dom, &id) != 0)
    return gpuipc__err(-EINVAL, "gpuipc_segment_copy_shared: seg is no "
                       "segment this process holds through dom");
  char round[GPUIPC_NAME_MAX + 1];
  snprintf(round, sizeof(round), "seg-%llx-%llx", (unsigned long long)id,
           (unsigned long long)src_off);
  gpuipc_share_extent_t e = {seg, src_off, dst, dst_off, bytes};
  return gpuipc_share_copy(dom, round, &e, 1, stream, opts);
}
