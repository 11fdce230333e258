/*
 * gpuipc bench: what its files share. cmd_bench.c parses the arguments,
 * runs the producer and the receiving process (the same command, started
 * again), their control channel and the rows of each path (bench_rows
 * there: a row is one function); bench_measure.c is the clock,
 * statistics, the driver and the copy baselines; bench_kloop.c the
 * kernel-in-the-loop round trip and its floors, bench_kernels.c their
 * kernels (PTX of bench_kernels.cu) and device plumbing; bench_blocks.c
 * the block batches of a paged cache and their floor; bench_report.c
 * prints the results. bench/bench_tens.h is the tensor both benchmarks
 * send.
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
/* Alternated runs of each copy size: gpuipc's, then the baseline's, ... */
#define DEF_RUNS 5
#define MAX_RUNS 32
/* The kernel-in-the-loop tensor: 1,024 words, one block of the kernels. */
#define KLOOP_WORDS 1024
#define KLOOP_ROWS 3 /* gpuipc and its two floors */
/* Block batches: at most BLOCKS_N blocks a round, out of a cache of
 * BLOCKS_SPREAD times as many slots each side. */
#define BLOCKS_N 1024
#define BLOCKS_SPREAD 4

enum op {
  OP_OPEN = 1, /* src, dst, kind: open the data channel */
  OP_LAT = 2,
  OP_BW = 3,
  OP_CLOSE = 4,
  OP_END = 5,
  OP_KLOOP = 6, /* src, round trips: the kernel-in-the-loop row */
  OP_KWORD = 7, /* src, round trips: its two-process floor */
  OP_BLOCKS = 8, /* block bytes, n, rounds: block batches */
  OP_BLOCKS_MSG = 9, /* block bytes, n, rounds: a message a block */
};

enum stream_mode { ST_NULL, ST_LEGACY, ST_PER_THREAD, ST_CREATED };
extern const char *const bench_stream_names[]; /* by enum stream_mode */

struct bench_opts {
  int json, quick;
  int runs; /* alternated runs of each copy size */
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

/* One size: @runs runs of @count messages each side, alternated. */
struct bw_row {
  int src, dst;
  size_t bytes;
  long count; /* messages (copies) a run */
  int runs;
  int peer; /* between GPUs: peer access on (1) or not (0); else -1 */
  double gbs, base_gbs; /* medians of the runs */
  double gbs_run[MAX_RUNS], base_run[MAX_RUNS]; /* in the order run */
  double gbs_at[MAX_RUNS], base_at[MAX_RUNS]; /* starts, us into the run */
};

/* A kernel-in-the-loop round trip: "kloop_gpuipc" or a floor. */
struct kloop_row {
  int src, dst;
  const char *row;
  int n;
  double median, p99;
};

/* Rounds of a block row: "blocks_gpuipc", "blocks_per_message" or
 * "blocks_floor", @n blocks of @bytes each round. */
struct blocks_row {
  int src, dst;
  const char *row;
  size_t bytes;
  int n, runs;
  int peer; /* the floor between GPUs: peer access on (1) or not (0); -1 */
  double median;
  double us[MAX_RUNS]; /* each round, in the order run */
};

struct results {
  struct lat_row lat[MAX_DEVS * MAX_DEVS];
  int nlat;
  struct bw_row *bw;
  int nbw, capbw;
  struct kloop_row kloop[MAX_DEVS * MAX_DEVS * KLOOP_ROWS];
  int nkloop;
  char kloop_skipped[256]; /* why a path has no kloop rows (the last) */
  struct blocks_row *blocks;
  int nblocks, capblocks;
};

struct prod {
  const struct bench_opts *o;
  gpuipc_domain_t *dom;
  struct ctl ctl;
  pid_t peer;
  int steps, step; /* progress */
  double t0; /* bench_now_us() at the start */
  struct results r;
};

/* The path a row measures: the data channel from @src to @dst (HOST: -1),
 * open at both ends, and the producer's stream on @src. */
struct pair {
  int src, dst;
  gpuipc_channel_t *ch;
  void *stream;
};

/* The receiving process (cmd_bench.c carries out the orders). */
struct peer {
  gpuipc_domain_t *dom;
  struct ctl ctl;
  gpuipc_channel_t *data;
  enum stream_mode mode;
  int dev;      /* the data channel's receiving device, -1: HOST */
  gpuipc_kind_t kind; /* of the producer's buffers, for ours */
  void *stream;
  gpuipc_buf_t *dst; /* where copies land */
};

/* ----- cmd_bench.c ----- */
/* Four numbers to the other process, and from it. */
int bench_ctl_send(struct ctl *c, const int64_t v[4]);
int bench_ctl_recv(struct ctl *c, int64_t v[4]);
/* The receiver's answer @ans[0] as a status (0, or its error with a
 * sentence saying it was the receiver's). */
int bench_answer(const int64_t ans[4]);
/* The progress line: one step done, @what of @src -> @dst. */
void bench_progress(struct prod *p, const char *what, int src, int dst,
                    size_t bytes);

/* ----- bench_measure.c ----- */
double bench_now_us(void);
/* Sorts @v; its median and 99th percentile. */
void bench_stats(double *v, int n, double *median, double *p99);
/* The smallest and largest of @n values. */
void bench_span(const double *v, int n, double *lo, double *hi);
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

/* Peer access between @src and @dst, both ways: 1 on, 0 not (the pair
 * has none; then copies between them are staged by the driver). */
int bench_peer_on(int src, int dst);

/* ----- bench_kloop.c ----- */
/* The producer's kernel-in-the-loop rows for @pr (GPUs only): gpuipc's,
 * then the floors. Where this driver cannot launch the kernels, or two
 * GPUs have no peer access, the rows are left out (0) and
 * p->r.kloop_skipped says why. */
int bench_kloop_run(struct prod *p, const struct pair *pr);
/* The receiver's side of OP_KLOOP and OP_KWORD. */
int bench_kloop_peer(struct peer *p, int src, long iters);
int bench_kword_peer(struct peer *p, int src, long iters);

/* ----- bench_blocks.c ----- */
/* The producer's block rows for @pr: for each block size, a batch, a
 * message a block, and the floor. */
int bench_blocks_run(struct prod *p, const struct pair *pr);
/* The receiver's side of OP_BLOCKS and OP_BLOCKS_MSG (@op). */
int bench_blocks_peer(struct peer *p, int op, size_t bytes, long n,
                      long rounds);
/* The block sizes measured under @o->max_bytes (the progress steps). */
int bench_blocks_sizes(const struct bench_opts *o);
/* The row @name of @src -> @dst and @bytes; NULL if there is none. */
const struct blocks_row *bench_blocks_find(const struct results *r, int src,
                                           int dst, size_t bytes,
                                           const char *name);

/* ----- bench_kernels.c ----- */
/* Load the kernels on @dev (once); GPUIPC_E_UNSUPPORTED where they cannot
 * be. The launches queue one block on @stream of @dev; @tally is two
 * words of device memory: wrong words seen, launches made. */
int bench_k_ready(int dev);
int bench_k_write(int dev, void *stream, uint32_t *p, uint32_t v);
int bench_k_answer(int dev, void *stream, const uint32_t *in, uint32_t *out,
                   uint32_t v, uint32_t *tally);
int bench_k_check(int dev, void *stream, const uint32_t *in, uint32_t v,
                  uint32_t *tally);
/* Device memory of @dev, zeroed; freed with bench_dev_free. */
int bench_dev_alloc(int dev, size_t n, void **out);
void bench_dev_free(int dev, void *p);
/* An event of @dev (no timing); record it on, or make wait for it, a
 * stream of @dev. */
int bench_ev_make(int dev, void **ev);
void bench_ev_free(int dev, void *ev);
int bench_ev_record(int dev, void *ev, void *stream);
int bench_ev_wait(int dev, void *stream, void *ev);

/* ----- bench_report.c ----- */
/* "host", or "GPUs->GPUd", into @buf. */
const char *bench_path_name(int src, int dst, char *buf, size_t cap);
void bench_print_tables(const struct prod *p);
void bench_print_json(const struct prod *p);

#endif
