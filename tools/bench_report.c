/*
 * gpuipc bench, the report: the tables, or one JSON document (schema 1),
 * of what cmd_bench.c, bench_kloop.c and bench_blocks.c measured.
 */
#include "bench.h"

#include <stdio.h>
#include <string.h>

const char *const bench_stream_names[] = {"null", "legacy", "per-thread",
                                          "created"};

static const char *baseline_name(int src, int dst)
{
  return src < 0 ? "memcpy" : src == dst ? "cuMemcpyAsync"
                                         : "cuMemcpyPeerAsync";
}

const char *bench_path_name(int src, int dst, char *buf, size_t cap)
{
  if (src < 0)
    snprintf(buf, cap, "host");
  else
    snprintf(buf, cap, "GPU%d->GPU%d", src, dst);
  return buf;
}

static const char *peer_name(int peer)
{
  return peer < 0 ? "-" : peer ? "on" : "off";
}

/* The kloop row @name of @src -> @dst; NULL if there is none. */
static const struct kloop_row *kloop_find(const struct results *r, int src,
                                          int dst, const char *name)
{
  for (int i = 0; i < r->nkloop; i++)
    if (r->kloop[i].src == src && r->kloop[i].dst == dst &&
        strcmp(r->kloop[i].row, name) == 0)
      return &r->kloop[i];
  return NULL;
}

/* gpuipc's kloop median over @floor's of the same path; 0: no floor. */
static double kloop_ratio(const struct results *r, const struct kloop_row *g,
                          const char *floor)
{
  const struct kloop_row *f = kloop_find(r, g->src, g->dst, floor);
  return f != NULL && f->median > 0 ? g->median / f->median : 0;
}

static void bw_table(const struct prod *p)
{
  char path[32], b[32], gs[32], bs[32];
  printf("\nCopy bandwidth (gpuipc_channel_recv_into), GB/s (10^9 B/s): "
         "medians of %d runs\neach, gpuipc's and the baseline's "
         "alternated; min-max of the runs\n", p->o->runs);
  printf("  %-12s %9s %6s %9s %15s %9s %15s %-17s %4s %6s\n", "path",
         "size", "msgs", "gpuipc", "(min-max)", "baseline", "(min-max)", "",
         "peer", "ratio");
  for (int i = 0; i < p->r.nbw; i++) {
    const struct bw_row *r = &p->r.bw[i];
    double glo, ghi, blo, bhi;
    bench_span(r->gbs_run, r->runs, &glo, &ghi);
    bench_span(r->base_run, r->runs, &blo, &bhi);
    snprintf(gs, sizeof(gs), "%.2f-%.2f", glo, ghi);
    snprintf(bs, sizeof(bs), "%.2f-%.2f", blo, bhi);
    printf("  %-12s %9s %6ld %9.2f %15s %9.2f %15s %-17s %4s %6.2f\n",
           bench_path_name(r->src, r->dst, path, 32),
           cli_bytes(r->bytes, b, 32), r->count, r->gbs, gs, r->base_gbs, bs,
           baseline_name(r->src, r->dst), peer_name(r->peer),
           r->gbs / r->base_gbs);
  }
}

static void kloop_table(const struct prod *p)
{
  static const char *const names[KLOOP_ROWS] = {
      "kloop_gpuipc", "kloop_one_process", "kloop_floor_word"};
  char path[32];
  if (p->r.nkloop == 0) {
    if (p->r.kloop_skipped[0] != '\0')
      printf("\nNo round trip with kernels in the loop: %s\n",
             p->r.kloop_skipped);
    return;
  }
  if (p->r.kloop_skipped[0] != '\0')
    printf("\n(Paths left out below: %s)", p->r.kloop_skipped);
  printf("\n4 KiB round trip with kernels in the loop (write -> send -> "
         "answer -> send back\n-> check), us, median (p99); the floors: "
         "one process ordered by events,\ntwo processes ordered by stream "
         "value waits\n");
  printf("  %-12s %20s %20s %20s %7s %7s\n", "path", names[0], names[1],
         names[2], "/one", "/word");
  for (int i = 0; i < p->r.nkloop; i++) {
    const struct kloop_row *g = &p->r.kloop[i];
    if (strcmp(g->row, names[0]) != 0)
      continue;
    printf("  %-12s", bench_path_name(g->src, g->dst, path, 32));
    for (int k = 0; k < KLOOP_ROWS; k++) {
      const struct kloop_row *r = kloop_find(&p->r, g->src, g->dst, names[k]);
      char cell[40] = "-";
      if (r != NULL)
        snprintf(cell, sizeof(cell), "%.2f (%.2f)", r->median, r->p99);
      printf(" %20s", cell);
    }
    printf(" %7.2f %7.2f\n", kloop_ratio(&p->r, g, names[1]),
           kloop_ratio(&p->r, g, names[2]));
  }
}

/* The median of row @name beside @g (same path and size); 0: none. */
static double blocks_median(const struct results *r,
                            const struct blocks_row *g, const char *name)
{
  const struct blocks_row *b =
      bench_blocks_find(r, g->src, g->dst, g->bytes, name);
  return b != NULL ? b->median : 0;
}

static double blocks_gbs(const struct blocks_row *b)
{
  return (double)b->bytes * b->n / b->median / 1e3;
}

static void blocks_table(const struct prod *p)
{
  static const char *const names[] = {"blocks_gpuipc", "blocks_per_message",
                                      "blocks_floor", "blocks_floor_kernel"};
  char path[32], b[32];
  if (p->r.nblocks == 0)
    return;
  printf("\nBlocks of a paged cache, scattered into scattered places of "
         "another: us from the\nsender's first call until all is free, "
         "median of %d rounds (GB/s); the floors,\nin one process: %s%s\n",
         p->o->runs, p->o->ndev > 0 ? "cuMemcpyBatchAsync" : "memcpy",
         p->o->ndev > 0 ? ", gpuipc's block kernel" : "");
  printf("  %-12s %8s %5s %18s %18s %18s %19s %7s %7s %9s\n", "path",
         "block", "n", names[0], names[1], names[2], names[3], "/floor",
         "/kernel", "msg/batch");
  for (int i = 0; i < p->r.nblocks; i++) {
    const struct blocks_row *g = &p->r.blocks[i];
    if (strcmp(g->row, names[0]) != 0)
      continue;
    printf("  %-12s %8s %5d", bench_path_name(g->src, g->dst, path, 32),
           cli_bytes(g->bytes, b, 32), g->n);
    for (int k = 0; k < 4; k++) {
      const struct blocks_row *r =
          bench_blocks_find(&p->r, g->src, g->dst, g->bytes, names[k]);
      char cell[48] = "-";
      if (r != NULL)
        snprintf(cell, sizeof(cell), "%.1f (%.2f)", r->median, blocks_gbs(r));
      printf(" %*s", k == 3 ? 19 : 18, cell);
    }
    double fl = blocks_median(&p->r, g, names[2]);
    double kf = blocks_median(&p->r, g, names[3]);
    double msg = blocks_median(&p->r, g, names[1]);
    char rk[16] = "-";
    if (kf > 0)
      snprintf(rk, sizeof(rk), "%.2f", g->median / kf);
    printf(" %7.2f %7s %9.2f\n", fl > 0 ? g->median / fl : 0, rk,
           msg / g->median);
  }
}

void bench_print_tables(const struct prod *p)
{
  char path[32];
  printf("gpuipc bench: kind %s, stream %s\n\n",
         gpuipc_kind_name(p->o->kind), bench_stream_names[p->o->stream]);
  printf("4 KiB round trip (send -> recv -> release -> free), us\n");
  printf("  %-12s %9s %9s %7s\n", "path", "median", "p99", "n");
  for (int i = 0; i < p->r.nlat; i++) {
    const struct lat_row *r = &p->r.lat[i];
    printf("  %-12s %9.2f %9.2f %7d\n",
           bench_path_name(r->src, r->dst, path, 32), r->median, r->p99,
           r->n);
  }
  bw_table(p);
  kloop_table(p);
  blocks_table(p);
}

static void json_runs(struct cli_json *j, const char *key, const double *v,
                      int n)
{
  cli_json_arr(j, key);
  for (int i = 0; i < n; i++)
    cli_json_double(j, NULL, v[i]);
  cli_json_end(j);
}

static void json_bw_row(struct cli_json *j, const struct bw_row *r)
{
  double lo, hi;
  cli_json_obj(j, NULL);
  cli_json_int(j, "src", r->src);
  cli_json_int(j, "dst", r->dst);
  cli_json_uint(j, "bytes", r->bytes);
  cli_json_int(j, "messages", r->count);
  cli_json_int(j, "runs", r->runs);
  cli_json_double(j, "gpuipc_gbs", r->gbs);
  cli_json_str(j, "baseline", baseline_name(r->src, r->dst));
  if (r->peer >= 0)
    cli_json_bool(j, "peer_access", r->peer == 1);
  cli_json_double(j, "baseline_gbs", r->base_gbs);
  cli_json_double(j, "ratio", r->gbs / r->base_gbs);
  bench_span(r->gbs_run, r->runs, &lo, &hi);
  cli_json_double(j, "gpuipc_gbs_min", lo);
  cli_json_double(j, "gpuipc_gbs_max", hi);
  bench_span(r->base_run, r->runs, &lo, &hi);
  cli_json_double(j, "baseline_gbs_min", lo);
  cli_json_double(j, "baseline_gbs_max", hi);
  json_runs(j, "gpuipc_gbs_runs", r->gbs_run, r->runs);
  json_runs(j, "baseline_gbs_runs", r->base_run, r->runs);
  json_runs(j, "gpuipc_run_start_us", r->gbs_at, r->runs);
  json_runs(j, "baseline_run_start_us", r->base_at, r->runs);
  cli_json_end(j);
}

static void json_kloop_row(struct cli_json *j, const struct results *res,
                           const struct kloop_row *r)
{
  cli_json_obj(j, NULL);
  cli_json_int(j, "src", r->src);
  cli_json_int(j, "dst", r->dst);
  cli_json_str(j, "row", r->row);
  cli_json_int(j, "bytes", KLOOP_WORDS * 4);
  cli_json_int(j, "n", r->n);
  cli_json_double(j, "median_us", r->median);
  cli_json_double(j, "p99_us", r->p99);
  if (strcmp(r->row, "kloop_gpuipc") == 0) {
    double one = kloop_ratio(res, r, "kloop_one_process");
    double word = kloop_ratio(res, r, "kloop_floor_word");
    if (one > 0)
      cli_json_double(j, "ratio_one_process", one);
    if (word > 0)
      cli_json_double(j, "ratio_floor_word", word);
  }
  cli_json_end(j);
}

static void json_blocks_row(struct cli_json *j, const struct results *res,
                            const struct blocks_row *r)
{
  double lo, hi;
  cli_json_obj(j, NULL);
  cli_json_int(j, "src", r->src);
  cli_json_int(j, "dst", r->dst);
  cli_json_str(j, "row", r->row);
  cli_json_uint(j, "block_bytes", r->bytes);
  cli_json_int(j, "n", r->n);
  cli_json_int(j, "runs", r->runs);
  cli_json_double(j, "median_us", r->median);
  cli_json_double(j, "gbs", blocks_gbs(r));
  bench_span(r->us, r->runs, &lo, &hi);
  cli_json_double(j, "min_us", lo);
  cli_json_double(j, "max_us", hi);
  json_runs(j, "us_runs", r->us, r->runs);
  if (r->peer >= 0)
    cli_json_bool(j, "peer_access", r->peer == 1);
  if (strcmp(r->row, "blocks_gpuipc") == 0) {
    double fl = blocks_median(res, r, "blocks_floor");
    double kf = blocks_median(res, r, "blocks_floor_kernel");
    double msg = blocks_median(res, r, "blocks_per_message");
    if (fl > 0)
      cli_json_double(j, "ratio_floor", r->median / fl);
    if (kf > 0)
      cli_json_double(j, "ratio_floor_kernel", r->median / kf);
    if (msg > 0)
      cli_json_double(j, "ratio_per_message", msg / r->median);
  }
  cli_json_end(j);
}

void bench_print_json(const struct prod *p)
{
  struct cli_json j;
  cli_json_init(&j, stdout);
  cli_json_obj(&j, NULL);
  cli_json_str(&j, "version", gpuipc_version());
  cli_json_str(&j, "kind", gpuipc_kind_name(p->o->kind));
  cli_json_str(&j, "stream", bench_stream_names[p->o->stream]);
  cli_json_int(&j, "runs", p->o->runs);
  cli_json_arr(&j, "devices");
  for (int i = 0; i < p->o->ndev; i++) {
    gpuipc_device_info_t d = {.size = sizeof(d)};
    cli_json_obj(&j, NULL);
    cli_json_int(&j, "ordinal", p->o->devs[i]);
    if (gpuipc_device_info(p->o->devs[i], &d) == 0)
      cli_json_str(&j, "name", d.name);
    cli_json_end(&j);
  }
  cli_json_end(&j);
  cli_json_arr(&j, "latency");
  for (int i = 0; i < p->r.nlat; i++) {
    const struct lat_row *r = &p->r.lat[i];
    cli_json_obj(&j, NULL);
    cli_json_int(&j, "src", r->src);
    cli_json_int(&j, "dst", r->dst);
    cli_json_int(&j, "bytes", LAT_BYTES);
    cli_json_int(&j, "n", r->n);
    cli_json_double(&j, "median_us", r->median);
    cli_json_double(&j, "p99_us", r->p99);
    cli_json_end(&j);
  }
  cli_json_end(&j);
  cli_json_arr(&j, "bandwidth");
  for (int i = 0; i < p->r.nbw; i++)
    json_bw_row(&j, &p->r.bw[i]);
  cli_json_end(&j);
  cli_json_arr(&j, "kloop");
  for (int i = 0; i < p->r.nkloop; i++)
    json_kloop_row(&j, &p->r, &p->r.kloop[i]);
  cli_json_end(&j);
  if (p->r.kloop_skipped[0] != '\0')
    cli_json_str(&j, "kloop_skipped", p->r.kloop_skipped);
  cli_json_arr(&j, "blocks");
  for (int i = 0; i < p->r.nblocks; i++)
    json_blocks_row(&j, &p->r, &p->r.blocks[i]);
  cli_json_end(&j);
  cli_json_end(&j);
  cli_json_finish(&j);
}
