/*
 * domain_bench: what a segment open costs.
 *
 *  - open + release of a segment the process does not hold: a round trip
 *    to the broker (OPEN -> HANDLE with the fd), a mapping, and on release
 *    an unmapping and a one-way RELEASE; with 1 and with 64 processes doing
 *    it at once against one broker (median and 99th percentile per pair);
 *  - open of a segment the process already holds: the same round trip, and
 *    the import cache returns the mapping it has;
 *  - for scale, gpuipc_buf_import of a held buffer (the import cache
 *    alone, no broker).
 *
 * The broker runs in this process; the measuring processes are fork+exec
 * copies of it. Not a test: it prints numbers and judges nothing.
 *
 *   domain_bench [--iters N] [--procs N,...]
 */
#include "gpuipc.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SEG_SIZE (64u << 10)

enum mode { MODE_UNHELD = 0, MODE_HELD = 1, MODE_IMPORT = 2 };

static uint64_t now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void die(const char *what, int rc)
{
  fprintf(stderr, "domain_bench: %s: %s (%s)\n", what, gpuipc_err_name(rc),
          gpuipc_last_error());
  exit(1);
}

static int cmp_u32(const void *a, const void *b)
{
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* ----- a measuring process ----- */

static int client(const char *domain, int iters, enum mode mode, int out)
{
  gpuipc_domain_t *dom;
  int rc = gpuipc_domain_join(domain, NULL, &dom);
  if (rc != 0)
    die("join", rc);
  uint32_t *lat = calloc((size_t)iters, sizeof(*lat));
  gpuipc_buf_t *held = NULL, *b;
  /* Everyone starts together: the parent publishes "go" when all joined. */
  gpuipc_segment_opts_t wait = GPUIPC_SEGMENT_OPTS_INIT;
  wait.flags = GPUIPC_WAIT;
  rc = gpuipc_segment_open(dom, "go", &wait, &b);
  if (rc != 0)
    die("wait for go", rc);
  gpuipc_buf_release(b);
  if (mode != MODE_UNHELD) {
    rc = gpuipc_segment_open(dom, "bench", NULL, &held);
    if (rc != 0)
      die("open", rc);
  }
  gpuipc_handle_t h;
  if (mode == MODE_IMPORT && (rc = gpuipc_buf_export(held, &h)) != 0)
    die("export", rc);
  for (int i = 0; i < iters; i++) {
    uint64_t t0 = now_ns();
    if (mode == MODE_IMPORT)
      rc = gpuipc_buf_import(&h, -1, 0, &b);
    else
      rc = gpuipc_segment_open(dom, "bench", NULL, &b);
    if (rc != 0)
      die("open", rc);
    ((volatile uint8_t *)gpuipc_buf_ptr(b))[i % SEG_SIZE] = 1;
    gpuipc_buf_release(b);
    lat[i] = (uint32_t)(now_ns() - t0);
  }
  if (mode == MODE_IMPORT)
    close(h.fd);
  if (held != NULL)
    gpuipc_buf_release(held);
  size_t bytes = (size_t)iters * sizeof(*lat);
  if (write(out, lat, bytes) != (ssize_t)bytes) {
    perror("domain_bench: write");
    return 1;
  }
  free(lat);
  gpuipc_domain_leave(dom);
  return 0;
}

/* ----- the parent: broker host, spawner, statistician ----- */

static const char *self;
static char domain[64];

/* Run @procs processes of @iters each in @mode; print one row. */
static void run(gpuipc_domain_t *dom, int procs, int iters, enum mode mode,
                const char *what)
{
  int p[2];
  if (pipe(p) != 0) {
    perror("pipe");
    exit(1);
  }
  pid_t *pids = calloc((size_t)procs, sizeof(*pids));
  char it[16], md[16], fd[16];
  snprintf(it, sizeof(it), "%d", iters);
  snprintf(md, sizeof(md), "%d", (int)mode);
  snprintf(fd, sizeof(fd), "%d", p[1]);
  for (int i = 0; i < procs; i++) {
    fflush(NULL);
    pids[i] = fork();
    if (pids[i] == 0) {
      close(p[0]);
      execl(self, self, "--client", domain, it, md, fd, (char *)NULL);
      _exit(127);
    }
  }
  close(p[1]);
  /* Wait until they have all joined, then let them go. */
  gpuipc_domain_info_t di = {.size = sizeof(di)};
  do {
    usleep(2000);
    if (gpuipc_domain_info(dom, &di) != 0)
      die("info", -1);
  } while (di.members < procs + 1);
  gpuipc_buf_t *go;
  uint64_t t0 = now_ns();
  /* A signal, nothing in it: published at once. */
  gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
  o.bytes = 64;
  o.flags = GPUIPC_CREATE | GPUIPC_SCRATCH;
  int rc = gpuipc_segment_open(dom, "go", &o, &go);
  if (rc != 0)
    die("go", rc);
  size_t n = (size_t)procs * (size_t)iters;
  uint32_t *lat = calloc(n, sizeof(*lat));
  size_t got = 0;
  while (got < n * sizeof(*lat)) {
    ssize_t r = read(p[0], (char *)lat + got, n * sizeof(*lat) - got);
    if (r <= 0)
      break;
    got += (size_t)r;
  }
  close(p[0]);
  double secs = (double)(now_ns() - t0) / 1e9;
  for (int i = 0; i < procs; i++) {
    int st;
    waitpid(pids[i], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "domain_bench: a measuring process failed\n");
      exit(1);
    }
  }
  gpuipc_segment_unlink(dom, "go");
  gpuipc_buf_release(go);
  n = got / sizeof(*lat);
  qsort(lat, n, sizeof(*lat), cmp_u32);
  printf("%-46s %5d %8zu %10.2f %10.2f %10.0f\n", what, procs, n,
         lat[n / 2] / 1000.0, lat[n * 99 / 100] / 1000.0, (double)n / secs);
  free(lat);
  free(pids);
}

/* Iterations of each of @procs processes: the same total work (4 x @iters
 * when several run) whatever their number, and at least 50 each. */
static int iters_each(int iters, int procs)
{
  int per = procs > 1 ? iters * 4 / procs : iters;
  return per < 50 ? 50 : per;
}

int main(int argc, char **argv)
{
  if (argc == 6 && strcmp(argv[1], "--client") == 0)
    return client(argv[2], atoi(argv[3]), (enum mode)atoi(argv[4]),
                  atoi(argv[5]));
  self = argv[0];
  int iters = 2000;
  int procs[8] = {1, 64};
  int nprocs = 2;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--procs") == 0 && i + 1 < argc) {
      nprocs = 0;
      for (char *s = strtok(argv[++i], ","); s && nprocs < 8;
           s = strtok(NULL, ","))
        procs[nprocs++] = atoi(s);
    } else {
      fprintf(stderr, "usage: domain_bench [--iters N] [--procs N,...]\n");
      return 2;
    }
  }
  /* A domain of our own, so that nothing else shares the broker. */
  snprintf(domain, sizeof(domain), "bench-%d", (int)getpid());
  gpuipc_domain_t *dom;
  int rc = gpuipc_domain_join(domain, NULL, &dom);
  if (rc != 0)
    die("join", rc);
  gpuipc_buf_t *seg;
  /* What it holds does not matter: published at once. */
  gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
  o.bytes = SEG_SIZE;
  o.kind = GPUIPC_KIND_HOST;
  o.flags = GPUIPC_CREATE | GPUIPC_SCRATCH;
  rc = gpuipc_segment_open(dom, "bench", &o, &seg);
  if (rc != 0)
    die("create", rc);
  gpuipc_buf_release(seg); /* the broker keeps it */

  printf("gpuipc %s domain_bench: %u KiB HOST segment, broker in pid %d, "
         "%ld CPUs\n", gpuipc_version(), SEG_SIZE >> 10, (int)getpid(),
         sysconf(_SC_NPROCESSORS_ONLN));
  printf("%-46s %5s %8s %10s %10s %10s\n", "operation", "procs", "samples",
         "median us", "p99 us", "total/s");
  for (int i = 0; i < nprocs; i++)
    run(dom, procs[i], iters_each(iters, procs[i]), MODE_UNHELD,
        "open + release, not held (round trip, map)");
  for (int i = 0; i < nprocs; i++)
    run(dom, procs[i], iters_each(iters, procs[i]), MODE_HELD,
        "open + release, held (cached open)");
  run(dom, 1, iters * 10, MODE_IMPORT,
      "gpuipc_buf_import + release of a held buffer");
  gpuipc_segment_unlink(dom, "bench");
  gpuipc_domain_leave(dom);
  return 0;
}
