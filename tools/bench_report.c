/*
 * gpuipc bench, the report: the tables, or one JSON document (schema 1),
 * of what cmd_bench.c measured.
 */
#include "bench.h"

#include <stdio.h>

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

void bench_print_tables(const struct prod *p)
{
  char path[32], b[32];
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
  printf("\nCopy bandwidth (gpuipc_channel_recv_into), GB/s (10^9 B/s)\n");
  printf("  %-12s %9s %6s %10s %18s %6s\n", "path", "size", "msgs", "gpuipc",
         "baseline", "ratio");
  for (int i = 0; i < p->r.nbw; i++) {
    const struct bw_row *r = &p->r.bw[i];
    printf("  %-12s %9s %6ld %10.2f %9.2f %-8s %6.2f\n",
           bench_path_name(r->src, r->dst, path, 32),
           cli_bytes(r->bytes, b, 32), r->count, r->gbs, r->base_gbs,
           baseline_name(r->src, r->dst), r->gbs / r->base_gbs);
  }
}

void bench_print_json(const struct prod *p)
{
  struct cli_json j;
  cli_json_init(&j, stdout);
  cli_json_obj(&j, NULL);
  cli_json_str(&j, "version", gpuipc_version());
  cli_json_str(&j, "kind", gpuipc_kind_name(p->o->kind));
  cli_json_str(&j, "stream", bench_stream_names[p->o->stream]);
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
  for (int i = 0; i < p->r.nbw; i++) {
    const struct bw_row *r = &p->r.bw[i];
    cli_json_obj(&j, NULL);
    cli_json_int(&j, "src", r->src);
    cli_json_int(&j, "dst", r->dst);
    cli_json_uint(&j, "bytes", r->bytes);
    cli_json_int(&j, "messages", r->count);
    cli_json_double(&j, "gpuipc_gbs", r->gbs);
    cli_json_str(&j, "baseline", baseline_name(r->src, r->dst));
    cli_json_double(&j, "baseline_gbs", r->base_gbs);
    cli_json_double(&j, "ratio", r->gbs / r->base_gbs);
    cli_json_end(&j);
  }
  cli_json_end(&j);
  cli_json_end(&j);
  cli_json_finish(&j);
}
