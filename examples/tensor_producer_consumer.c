/*
 * tensor_producer_consumer: two processes, one channel.
 *
 *   tensor_producer_consumer [--kind host|vmm|legacy|pool] [--device N]
 *       [--bytes N] [--count N] [--copy]
 *
 * Runs the consumer as a second process (this program again) and the
 * producer here. They join domain "example" and open channel "tensors".
 * First a latency run: one tensor at a time, send -> receive -> release
 * -> the producer sees its buffer free. Then a throughput run: the
 * producer keeps up to 16 tensors in flight from 16 slots of one buffer;
 * the consumer takes each as a view and releases it (zero-copy), or with
 * --copy lands it in its own buffer with gpuipc_channel_recv_into. The consumer
 * checks the first and last byte of every tensor (HOST buffers) and both
 * print what they measured.
 *
 * With a GPU kind the buffers are device memory and nothing touches the
 * bytes on the host: the run measures the channel and, with --copy, the
 * device copies.
 */
#include <gpuipc.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SLOTS 16

struct cfg {
  gpuipc_kind_t kind;
  int device;
  size_t bytes;
  long count;
  int copy;
};

static double now_us(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

#define CHECK(call)                                                            \
  do {                                                                         \
    int rc_ = (call);                                                          \
    if (rc_ != 0) {                                                            \
      fprintf(stderr, "%s: %s (%s)\n", #call, gpuipc_err_name(rc_),            \
              gpuipc_last_error());                                            \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void tensor_in(gpuipc_tensor_t *t, gpuipc_buf_t *buf, size_t off,
                      int64_t *shape, const struct cfg *c)
{
  memset(t, 0, sizeof(*t));
  t->buf = buf;
  t->dl.data = gpuipc_buf_ptr(buf);
  t->dl.byte_offset = off;
  t->dl.device.device_type =
      gpuipc_buf_kind(buf) == GPUIPC_KIND_HOST ? GPUIPC_DL_CPU : GPUIPC_DL_CUDA;
  t->dl.device.device_id = gpuipc_buf_kind(buf) == GPUIPC_KIND_HOST
                               ? 0
                               : gpuipc_buf_device(buf);
  t->dl.ndim = 1;
  t->dl.dtype.code = GPUIPC_DL_UINT;
  t->dl.dtype.bits = 8;
  t->dl.dtype.lanes = 1;
  shape[0] = (int64_t)c->bytes;
  t->dl.shape = shape;
}

static int producer(gpuipc_channel_t *ch, const struct cfg *c)
{
  gpuipc_buf_t *buf;
  CHECK(gpuipc_buf_alloc(c->bytes * SLOTS, c->kind, c->device, 0, &buf));
  int host = gpuipc_buf_kind(buf) == GPUIPC_KIND_HOST;
  int64_t shape[1];
  gpuipc_tensor_t t;
  uint64_t ticket;

  /* Latency: one at a time. */
  int n = 2000;
  double *lat = malloc(sizeof(double) * (size_t)n);
  for (int i = 0; i < n + 100; i++) {
    tensor_in(&t, buf, 0, shape, c);
    if (host)
      ((uint8_t *)gpuipc_buf_ptr(buf))[0] = (uint8_t)i;
    double t0 = now_us();
    CHECK(gpuipc_channel_send(ch, &t, NULL, 0, &ticket));
    CHECK(gpuipc_channel_send_done(ch, ticket, GPUIPC_TIMEOUT_FOREVER));
    if (i >= 100) /* after warming up */
      lat[i - 100] = now_us() - t0;
  }
  qsort(lat, (size_t)n, sizeof(double), cmp_double);
  printf("producer: round trip of a %zu-byte tensor: median %.2f us, p99 "
         "%.2f us\n", c->bytes, lat[n / 2], lat[n * 99 / 100]);
  free(lat);

  /* Throughput: SLOTS in flight. */
  uint64_t tickets[SLOTS] = {0};
  double t0 = now_us();
  for (long i = 0; i < c->count; i++) {
    int s = (int)(i % SLOTS);
    if (tickets[s] != 0)
      CHECK(gpuipc_channel_send_done(ch, tickets[s], GPUIPC_TIMEOUT_FOREVER));
    if (host) {
      uint8_t *p = (uint8_t *)gpuipc_buf_ptr(buf) + (size_t)s * c->bytes;
      p[0] = (uint8_t)i;
      p[c->bytes - 1] = (uint8_t)~i;
    }
    tensor_in(&t, buf, (size_t)s * c->bytes, shape, c);
    CHECK(gpuipc_channel_send(ch, &t, NULL, 0, &tickets[s]));
  }
  for (int s = 0; s < SLOTS; s++)
    if (tickets[s] != 0)
      CHECK(gpuipc_channel_send_done(ch, tickets[s], GPUIPC_TIMEOUT_FOREVER));
  double us = now_us() - t0;
  printf("producer: %ld tensors of %zu bytes in %.1f ms: %.0f tensors/s, "
         "%.2f GB/s (%s)\n", c->count, c->bytes, us / 1e3,
         c->count / (us / 1e6), (double)c->count * c->bytes / us / 1e3,
         c->copy ? "copy" : "zero-copy");
  gpuipc_buf_release(buf);
  return 0;
}

static int consumer(gpuipc_channel_t *ch, const struct cfg *c)
{
  gpuipc_buf_t *dst = NULL;
  if (c->copy)
    CHECK(gpuipc_buf_alloc(c->bytes, c->kind, c->device, 0, &dst));
  int64_t shape[1];
  gpuipc_tensor_t into;
  if (dst != NULL)
    tensor_in(&into, dst, 0, shape, c);
  long bad = 0;
  for (long i = 0; i < 2100 + c->count; i++) {
    long k = i - 2100; /* index in the throughput run */
    if (c->copy && k >= 0) {
      CHECK(gpuipc_channel_recv_into(ch, &into, NULL, GPUIPC_TIMEOUT_FOREVER));
      if (gpuipc_buf_kind(dst) == GPUIPC_KIND_HOST) {
        const uint8_t *p = gpuipc_buf_ptr(dst);
        bad += p[0] != (uint8_t)k || p[c->bytes - 1] != (uint8_t)~k;
      }
      continue;
    }
    gpuipc_tensor_t *v;
    CHECK(gpuipc_channel_recv(ch, &v, NULL, GPUIPC_TIMEOUT_FOREVER));
    if (v->dl.device.device_type == GPUIPC_DL_CPU) {
      const uint8_t *p = (const uint8_t *)v->dl.data + v->dl.byte_offset;
      if (k < 0)
        bad += p[0] != (uint8_t)i;
      else
        bad += p[0] != (uint8_t)k || p[c->bytes - 1] != (uint8_t)~k;
    }
    CHECK(gpuipc_tensor_release(v, NULL));
  }
  gpuipc_channel_info_t info = {.size = sizeof(info)};
  CHECK(gpuipc_channel_info(ch, &info));
  printf("consumer: received %llu tensors, %llu buffer(s) mapped, %ld "
         "wrong\n", (unsigned long long)info.received,
         (unsigned long long)info.buffers_imported, bad);
  if (dst != NULL)
    gpuipc_buf_release(dst);
  return bad != 0;
}

int main(int argc, char **argv)
{
  struct cfg c = {GPUIPC_KIND_HOST, -1, 4096, 200000, 0};
  int role_consumer = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--kind") == 0 && i + 1 < argc) {
      const char *k = argv[++i];
      c.kind = strcmp(k, "vmm") == 0      ? GPUIPC_KIND_VMM
               : strcmp(k, "legacy") == 0 ? GPUIPC_KIND_LEGACY
               : strcmp(k, "pool") == 0   ? GPUIPC_KIND_POOL
                                          : GPUIPC_KIND_HOST;
      if (c.device < 0 && c.kind != GPUIPC_KIND_HOST)
        c.device = 0;
    } else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
      c.device = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--bytes") == 0 && i + 1 < argc) {
      c.bytes = (size_t)strtoull(argv[++i], NULL, 0);
    } else if (strcmp(argv[i], "--count") == 0 && i + 1 < argc) {
      c.count = strtol(argv[++i], NULL, 0);
    } else if (strcmp(argv[i], "--copy") == 0) {
      c.copy = 1;
    } else if (strcmp(argv[i], "--consumer") == 0) {
      role_consumer = 1;
    } else {
      fprintf(stderr, "usage: %s [--kind host|vmm|legacy|pool] [--device N] "
              "[--bytes N] [--count N] [--copy]\n", argv[0]);
      return 2;
    }
  }
  if (c.bytes < 2 || c.count < 1) {
    fprintf(stderr, "--bytes must be >= 2 and --count >= 1\n");
    return 2;
  }
  pid_t child = -1;
  if (!role_consumer) {
    fflush(NULL);
    child = fork();
    if (child == 0) {
      /* A fresh process (no CUDA state crosses fork). */
      char **args = calloc((size_t)argc + 2, sizeof(char *));
      for (int i = 0; i < argc; i++)
        args[i] = argv[i];
      args[argc] = "--consumer";
      execv("/proc/self/exe", args);
      perror("execv");
      _exit(127);
    }
  }
  gpuipc_domain_t *dom;
  CHECK(gpuipc_domain_join("example", NULL, &dom));
  gpuipc_channel_t *ch;
  CHECK(gpuipc_channel_open(dom, "tensors", NULL, &ch));
  int rc = role_consumer ? consumer(ch, &c) : producer(ch, &c);
  CHECK(gpuipc_channel_close(ch));
  CHECK(gpuipc_domain_leave(dom));
  if (child > 0) {
    int st;
    waitpid(child, &st, 0);
    rc |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  return rc;
}
