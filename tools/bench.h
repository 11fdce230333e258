/*
 * gpuipc bench: what its files share. cmd_bench.c parses the arguments,
 * runs the producer and the receiving process (the same command, started
 * again) and their control channel; bench_measure.c is the clock,
 * statistics, the driver and the baselines; bench_report.c prints the
 * results. bench/bench_tens.h is the tensor both benchmarks send.
 */
#ifndef GPUIPC_TOOLS_BENCH_H
#define GPUIPC_TOOLS_BENCH_H

#include "cli.h"

#include "bench_tens.h"

#include <stdint.h>
#include <sys/types.h>

#define LAT_BYTES 4096
/* No step of a run waits longer for the other process: one that fails
 * leaves the other to time out instead of waiting forever. */
#define WAIT_MS 30000
#define CTL_SLOTS 64
#define MAX_DEVS 16

enum op { OP_OPEN = 1, OP_LAT = 2, OP_BW = 3, OP_CLOSE = 4, OP_END = 5 };

enum stream_mode { ST_NULL, ST_LEGACY, ST_PER_THREAD, ST_CREATED };
extern const char *const bench_stream_names[]; /* by enum stream_mode */

struct bench_opts {
  int json, quick;
  gpuipc_kind_t kind;
  enum stream_mode stream;
  size_t max_bytes;
  int ndev;
  int devs[MAX_DEVS];
};

/* The control channel: orders one way, answers the other (cmd_bench.c). */
struct ctl {
  gpuipc_channel_t *ch;
  gpuipc_buf_t *buf; /* HOST, CTL_SLOTS slots of 64 bytes */
  uint64_t tickets[CTL_SLOTS];
  int next;
};

/* The producing process and what it measured. */
struct lat_row {
  int src, dst;
  int n;
  double median, p99;
};

struct bw_row {
  int src, dst;
  size_t bytes;
  long count;
  double gbs, base_gbs;
};

struct results {
  struct lat_row lat[MAX_DEVS * MAX_DEVS];
  int nlat;
  struct bw_row *bw;
  int nbw, capbw;
};

struct prod {
  const struct bench_opts *o;
  gpuipc_domain_t *dom;
  struct ctl ctl;
  pid_t peer;
  int steps, step; /* progress */
  struct results r;
};

/* ----- bench_measure.c ----- */
double bench_now_us(void);
/* Sorts @v; its median and 99th percentile. */
void bench_stats(double *v, int n, double *median, double *p99);
/* The stream of @mode on device @dev; NULL on failure (then `null`). */
void *bench_stream_make(enum stream_mode mode, int dev);
void bench_stream_free(enum stream_mode mode, int dev, void *s);
/* @n bytes of @v at @p, on device @dev (< 0: the host), synchronously. */
int bench_fill(int dev, void *p, uint8_t v, size_t n);
/* Bytes [0, n) of device memory @p into @out. */
int bench_dev_read(int dev, void *out, const void *p, size_t n);
/* The byte a producer fills @bytes with. */
uint8_t bench_pattern(size_t bytes);
/* The baseline for @bytes x @count: the driver's copy, or memcpy; in us. */
double bench_base_us(int src, int dst, void *to, const void *from,
                     size_t bytes, long count, void *stream);

/* ----- bench_report.c ----- */
/* "host", or "GPUs->GPUd", into @buf. */
const char *bench_path_name(int src, int dst, char *buf, size_t cap);
void bench_print_tables(const struct prod *p);
void bench_print_json(const struct prod *p);

#endif
