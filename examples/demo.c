/*
 * demo: two processes share a named segment and send a tensor.
 *
 * The first process joins a fresh domain (and so hosts its broker), creates
 * the segment "greeting", writes into it and publishes it, then starts a
 * second process
 * (itself, with an argument) that joins the same domain by name, opens the
 * segment, checks every byte and writes an answer back. Then the two meet on
 * the channel "tensors": the writer sends a 4x8 float tensor without copying
 * it, the reader checks every element and gives the view back, and the
 * writer sees its buffer free again. No handle, no file descriptor and no
 * socket appear in this code: the domain and the channel carry them.
 *
 * The segment is HOST memory (a memfd), so the demo runs on any Linux
 * machine; GPU memory is shared the same way with another kind
 * (opts.kind = GPUIPC_KIND_VMM, a device ordinal, and the stream that
 * wrote it given to gpuipc_segment_publish).
 */
#include <gpuipc.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define SIZE (1u << 20)
#define ROWS 4
#define COLS 8

static int fail(const char *what, int rc)
{
  fprintf(stderr, "demo: %s: %s: %s\n", what, gpuipc_err_name(rc),
          gpuipc_last_error());
  return 1;
}

static unsigned char pattern(size_t i)
{
  return (unsigned char)(i * 7 + 3);
}

static int reader(const char *domain)
{
  gpuipc_domain_t *dom;
  int rc = gpuipc_domain_join(domain, NULL, &dom);
  if (rc != 0)
    return fail("join", rc);
  gpuipc_buf_t *seg;
  /* WAIT: returns once the writer has filled and published it. */
  gpuipc_segment_opts_t opts = GPUIPC_SEGMENT_OPTS_INIT;
  opts.flags = GPUIPC_WAIT;
  rc = gpuipc_segment_open(dom, "greeting", &opts, &seg);
  if (rc != 0)
    return fail("open greeting", rc);
  const unsigned char *p = gpuipc_buf_ptr(seg);
  size_t n = gpuipc_buf_size(seg);
  for (size_t i = 64; i < n; i++)
    if (p[i] != pattern(i)) {
      fprintf(stderr, "demo: byte %zu is %u, expected %u\n", i, p[i],
              pattern(i));
      return 1;
    }
  printf("[reader pid %d] opened \"greeting\" (%zu bytes): \"%s\"; all %zu "
         "bytes after it are right\n",
         (int)getpid(), n, (const char *)p, n - 64);
  snprintf((char *)gpuipc_buf_ptr(seg) + 32, 32, "hello from pid %d",
           (int)getpid());
  gpuipc_buf_release(seg);

  gpuipc_channel_t *ch;
  rc = gpuipc_channel_open(dom, "tensors", NULL, &ch);
  if (rc != 0)
    return fail("open channel", rc);
  gpuipc_tensor_t *view;
  rc = gpuipc_channel_recv(ch, &view, NULL, 10000);
  if (rc != 0)
    return fail("recv", rc);
  const gpuipc_dl_tensor_t *t = &view->dl;
  if (t->ndim != 2 || t->shape[0] != ROWS || t->shape[1] != COLS ||
      t->dtype.code != GPUIPC_DL_FLOAT || t->dtype.bits != 32) {
    fprintf(stderr, "demo: the tensor arrived with the wrong layout\n");
    return 1;
  }
  const float *x = (const float *)((const char *)t->data + t->byte_offset);
  for (int r = 0; r < ROWS; r++)
    for (int c = 0; c < COLS; c++)
      if (x[r * t->strides[0] + c * t->strides[1]] != (float)(r * 100 + c)) {
        fprintf(stderr, "demo: element [%d][%d] is wrong\n", r, c);
        return 1;
      }
  printf("[reader pid %d] received a %dx%d float32 tensor on channel "
         "\"tensors\" (a view of the writer's memory): every element right\n",
         (int)getpid(), ROWS, COLS);
  gpuipc_tensor_release(view, NULL);
  gpuipc_channel_close(ch);
  gpuipc_domain_leave(dom);
  return 0;
}

/* Send a ROWSxCOLS float tensor held in a HOST buffer and wait until the
 * reader has given it back. */
static int send_tensor(gpuipc_domain_t *dom)
{
  gpuipc_buf_t *buf;
  int rc = gpuipc_buf_alloc(ROWS * COLS * sizeof(float), GPUIPC_KIND_HOST, -1,
                            0, &buf);
  if (rc != 0)
    return fail("alloc tensor", rc);
  float *x = gpuipc_buf_ptr(buf);
  for (int r = 0; r < ROWS; r++)
    for (int c = 0; c < COLS; c++)
      x[r * COLS + c] = (float)(r * 100 + c);
  int64_t shape[2] = {ROWS, COLS};
  gpuipc_tensor_t t = {
      .dl = {.data = x,
             .device = {GPUIPC_DL_CPU, 0},
             .ndim = 2,
             .dtype = {GPUIPC_DL_FLOAT, 32, 1},
             .shape = shape},
      .buf = buf,
  };
  gpuipc_channel_t *ch;
  rc = gpuipc_channel_open(dom, "tensors", NULL, &ch);
  if (rc != 0)
    return fail("open channel", rc);
  uint64_t ticket;
  rc = gpuipc_channel_send(ch, &t, NULL, 0, &ticket);
  if (rc != 0)
    return fail("send", rc);
  rc = gpuipc_channel_send_done(ch, ticket, 10000);
  if (rc != 0)
    return fail("wait for the release", rc);
  printf("[writer pid %d] sent a %dx%d float32 tensor; the reader gave the "
         "buffer back\n",
         (int)getpid(), ROWS, COLS);
  gpuipc_channel_close(ch);
  gpuipc_buf_release(buf);
  return 0;
}

int main(int argc, char **argv)
{
  if (argc == 3 && strcmp(argv[1], "--reader") == 0)
    return reader(argv[2]);

  char domain[32];
  snprintf(domain, sizeof(domain), "demo-%d", (int)getpid());
  gpuipc_domain_t *dom;
  int rc = gpuipc_domain_join(domain, NULL, &dom);
  if (rc != 0)
    return fail("join", rc);
  gpuipc_domain_info_t info = {.size = sizeof(info)};
  gpuipc_domain_info(dom, &info);
  printf("[writer pid %d] joined domain \"%s\"%s\n", (int)getpid(), domain,
         info.hosts_broker ? " and hosts its broker" : "");

  gpuipc_buf_t *seg;
  gpuipc_segment_opts_t opts = GPUIPC_SEGMENT_OPTS_INIT;
  opts.bytes = SIZE;
  opts.kind = GPUIPC_KIND_HOST;
  opts.flags = GPUIPC_CREATE;
  rc = gpuipc_segment_open(dom, "greeting", &opts, &seg);
  if (rc != 0)
    return fail("create greeting", rc);
  unsigned char *p = gpuipc_buf_ptr(seg);
  snprintf((char *)p, 32, "hello from pid %d", (int)getpid());
  for (size_t i = 64; i < SIZE; i++)
    p[i] = pattern(i);
  /* Nobody else sees it before this. */
  rc = gpuipc_segment_publish(seg, NULL);
  if (rc != 0)
    return fail("publish greeting", rc);
  printf("[writer pid %d] created \"greeting\" (%s, %u bytes), wrote and "
         "published it\n",
         (int)getpid(), gpuipc_kind_name(gpuipc_buf_kind(seg)), SIZE);

  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    execl("/proc/self/exe", argv[0], "--reader", domain, (char *)NULL);
    _exit(127);
  }
  if (send_tensor(dom) != 0)
    return 1;
  int st;
  waitpid(pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "demo: the reader failed\n");
    return 1;
  }
  printf("[writer pid %d] the reader answered in the same memory: \"%s\"\n",
         (int)getpid(), (const char *)p + 32);
  gpuipc_segment_unlink(dom, "greeting");
  gpuipc_buf_release(seg);
  gpuipc_domain_leave(dom);
  printf("demo: ok\n");
  return 0;
}
