/*
 * kloop_bench: a kernel-written round trip between two processes, through
 * gpuipc and through the floor without it, in one run.
 *
 *   kloop_bench ADEV BDEV [--iters N] [--rows LIST]
 *
 * Side A (this process, GPU ADEV) starts side B (this program again, GPU
 * BDEV). Each round trip i: A's kernel writes a 4 KiB tensor (1,024 words
 * v + k); it goes to B; B's kernel reads it, checks it and writes its
 * answer (each word + 1) into a tensor of its own; that comes back; A's
 * kernel checks the answer; A's host waits for its stream. Every side
 * queues its work on a created stream and learns of the other's message
 * on the host, as a receiver does. The rows (--rows, comma-separated;
 * all by default):
 *
 *   floor_word   no gpuipc: CUDA IPC mappings of each side's cudaMalloc
 *                tensor, a counter in shared host memory per direction
 *                that the host spins on to learn that the message was
 *                queued, and the GPU ordering done with
 *                cuStreamWriteValue64 / cuStreamWaitValue64 on words in
 *                that shared (pinned) memory;
 *   floor_event  the same with interprocess events (record, stream wait);
 *   one_process  the same kernels in one process on two streams (one per
 *                GPU, peer access on), ordered with events: what the work
 *                costs with no second process at all;
 *   gpuipc       gpuipc channels both ways: each side's tensor is a VMM
 *                buffer of its own, sent with gpuipc_channel_send on the
 *                stream, received as a view on the stream, released on
 *                the stream after the reading kernel; before a kernel
 *                rewrites its tensor, gpuipc_channel_send_wait on the
 *                stream orders it after the peer's last read;
 *   gpuipc_staged  the same, the tensors plain cudaMalloc memory: each
 *                send stages them (a copy on the stream).
 *
 * The gpuipc rows take GPUIPC_CHAN_READY_WORDS from the environment (0:
 * messages ordered by interprocess events rather than ready words), and
 * print where A's host spends a round trip.
 *
 * Output: per row "RESULT kloop <row> median_us p99_us iters" and a
 * readable line; a wrong byte anywhere stops the program (exit 1).
 */
#include <gpuipc.h>

#include "bench_cuda.h"
#include "bench_tens.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <vector>

#define WORDS 1024
#define BYTES (WORDS * 4)
/* Round trips left out of the figures: first imports, event opens. */
#define WARM 100

/* ---- kernels: the same in every row ---- */

__global__ static void k_write(uint32_t *p, uint32_t v)
{
  p[threadIdx.x] = v + threadIdx.x;
}

/* B: check A's tensor, write the answer. */
__global__ static void k_answer(const uint32_t *in, uint32_t *out, uint32_t v,
                                uint32_t *bad)
{
  uint32_t x = in[threadIdx.x];
  if (x != v + threadIdx.x)
    atomicAdd(bad, 1);
  out[threadIdx.x] = x + 1;
}

/* A: check B's answer. */
__global__ static void k_check(const uint32_t *in, uint32_t v, uint32_t *bad)
{
  if (in[threadIdx.x] != v + threadIdx.x + 1)
    atomicAdd(bad, 1);
}

/* ---- what both processes share: one page of host memory ---- */

struct shared {
  volatile uint64_t qa, qb;   /* round trips queued by A, by B (host) */
  volatile int a_ready;       /* A has put its handles here */
  volatile int b_ready;       /* B has opened A's handles and set up */
  volatile int row;           /* the row B is to run */
  cudaIpcMemHandle_t ma, mb;  /* the floors' tensors */
  cudaIpcEventHandle_t ea, eb;
  alignas(64) uint64_t wa;    /* written by A's stream, waited on by B's */
  alignas(64) uint64_t wb;    /* and the other way */
};

static struct shared *g;

static void spin_until(volatile uint64_t *q, uint64_t v)
{
  while (__atomic_load_n(q, __ATOMIC_ACQUIRE) < v)
    ;
}

static void publish(volatile uint64_t *q, uint64_t v)
{
  __atomic_store_n(q, v, __ATOMIC_RELEASE);
}

enum { ROW_WORD, ROW_EVENT, ROW_ONE, ROW_GPUIPC, ROW_STAGED, NROWS };
static const char *const row_names[NROWS] = {
    "floor_word", "floor_event", "one_process", "gpuipc", "gpuipc_staged"};

/* The device address of a word of the shared page on the current device. */
static CUdeviceptr word_dev(uint64_t *w)
{
  void *p = NULL;
  CUDA_OK(cudaHostGetDevicePointer(&p, w, 0));
  return (CUdeviceptr)p;
}

static uint32_t bad_count(uint32_t *bad)
{
  uint32_t b = 0;
  CUDA_OK(cudaMemcpy(&b, bad, 4, cudaMemcpyDeviceToHost));
  return b;
}

/* ---- side B of the floors ---- */

static void b_floor(int row, int dev, long iters)
{
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  uint32_t *mine, *bad, *theirs;
  CUDA_OK(cudaMalloc(&mine, BYTES));
  CUDA_OK(cudaMalloc(&bad, 4));
  CUDA_OK(cudaMemset(bad, 0, 4));
  CUDA_OK(cudaIpcGetMemHandle((cudaIpcMemHandle_t *)&g->mb, mine));
  cudaEvent_t eb, ea;
  CUDA_OK(cudaEventCreateWithFlags(
      &eb, cudaEventDisableTiming | cudaEventInterprocess));
  CUDA_OK(cudaIpcGetEventHandle((cudaIpcEventHandle_t *)&g->eb, eb));
  while (__atomic_load_n(&g->a_ready, __ATOMIC_ACQUIRE) == 0)
    usleep(100);
  CUDA_OK(cudaIpcOpenMemHandle((void **)&theirs, g->ma,
                               cudaIpcMemLazyEnablePeerAccess));
  CUDA_OK(cudaIpcOpenEventHandle(&ea, g->ea));
  CUdeviceptr wa = word_dev(&g->wa), wb = word_dev(&g->wb);
  __atomic_store_n(&g->b_ready, 1, __ATOMIC_RELEASE);
  for (long i = 1; i <= iters; i++) {
    uint32_t v = (uint32_t)i * 4096u;
    spin_until(&g->qa, (uint64_t)i);
    if (row == ROW_WORD)
      CU_OK(cuStreamWaitValue64((CUstream)s, wa, (cuuint64_t)i,
                                CU_STREAM_WAIT_VALUE_GEQ));
    else
      CUDA_OK(cudaStreamWaitEvent(s, ea, 0));
    k_answer<<<1, WORDS, 0, s>>>(theirs, mine, v, bad);
    if (row == ROW_WORD)
      CU_OK(cuStreamWriteValue64((CUstream)s, wb, (cuuint64_t)i,
                                 CU_STREAM_WRITE_VALUE_DEFAULT));
    else
      CUDA_OK(cudaEventRecord(eb, s));
    publish(&g->qb, (uint64_t)i);
  }
  CUDA_OK(cudaStreamSynchronize(s));
  if (bad_count(bad) != 0) {
    fprintf(stderr, "kloop B: %u wrong words\n", bad_count(bad));
    exit(1);
  }
  CUDA_OK(cudaIpcCloseMemHandle(theirs));
}

/* ---- side A of the floors ---- */

static void a_floor(int row, long iters, std::vector<double> &t,
                    uint32_t *mine, uint32_t *bad, cudaStream_t s)
{
  cudaEvent_t ea, eb;
  CUDA_OK(cudaEventCreateWithFlags(
      &ea, cudaEventDisableTiming | cudaEventInterprocess));
  CUDA_OK(cudaIpcGetEventHandle((cudaIpcEventHandle_t *)&g->ea, ea));
  CUDA_OK(cudaIpcGetMemHandle((cudaIpcMemHandle_t *)&g->ma, mine));
  __atomic_store_n(&g->a_ready, 1, __ATOMIC_RELEASE);
  while (__atomic_load_n(&g->b_ready, __ATOMIC_ACQUIRE) == 0)
    usleep(100); /* B starts CUDA: untimed */
  uint32_t *theirs;
  CUDA_OK(cudaIpcOpenMemHandle((void **)&theirs, g->mb,
                               cudaIpcMemLazyEnablePeerAccess));
  CUDA_OK(cudaIpcOpenEventHandle(&eb, g->eb));
  CUdeviceptr wa = word_dev(&g->wa), wb = word_dev(&g->wb);
  for (long i = 1; i <= iters; i++) {
    uint32_t v = (uint32_t)i * 4096u;
    double t0 = now_us();
    k_write<<<1, WORDS, 0, s>>>(mine, v);
    if (row == ROW_WORD)
      CU_OK(cuStreamWriteValue64((CUstream)s, wa, (cuuint64_t)i,
                                 CU_STREAM_WRITE_VALUE_DEFAULT));
    else
      CUDA_OK(cudaEventRecord(ea, s));
    publish(&g->qa, (uint64_t)i);
    spin_until(&g->qb, (uint64_t)i);
    if (row == ROW_WORD)
      CU_OK(cuStreamWaitValue64((CUstream)s, wb, (cuuint64_t)i,
                                CU_STREAM_WAIT_VALUE_GEQ));
    else
      CUDA_OK(cudaStreamWaitEvent(s, eb, 0));
    k_check<<<1, WORDS, 0, s>>>(theirs, v, bad);
    CUDA_OK(cudaStreamSynchronize(s));
    if (i > WARM)
      t.push_back(now_us() - t0);
  }
  CUDA_OK(cudaIpcCloseMemHandle(theirs));
}

/* ---- one process, two GPUs ---- */

static void one_process(int adev, int bdev, long iters, std::vector<double> &t)
{
  cudaStream_t sa, sb;
  uint32_t *a, *b, *bad;
  cudaEvent_t ea, eb;
  CUDA_OK(cudaSetDevice(bdev));
  CUDA_OK(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));
  CUDA_OK(cudaMalloc(&b, BYTES));
  CUDA_OK(cudaEventCreateWithFlags(&eb, cudaEventDisableTiming));
  if (adev != bdev)
    cudaDeviceEnablePeerAccess(adev, 0); /* already on: fine */
  CUDA_OK(cudaSetDevice(adev));
  if (adev != bdev)
    cudaDeviceEnablePeerAccess(bdev, 0);
  cudaGetLastError();
  CUDA_OK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
  CUDA_OK(cudaMalloc(&a, BYTES));
  CUDA_OK(cudaMalloc(&bad, 8));
  CUDA_OK(cudaMemset(bad, 0, 8));
  CUDA_OK(cudaEventCreateWithFlags(&ea, cudaEventDisableTiming));
  for (long i = 1; i <= iters; i++) {
    uint32_t v = (uint32_t)i * 4096u;
    double t0 = now_us();
    CUDA_OK(cudaSetDevice(adev));
    k_write<<<1, WORDS, 0, sa>>>(a, v);
    CUDA_OK(cudaEventRecord(ea, sa));
    CUDA_OK(cudaSetDevice(bdev));
    CUDA_OK(cudaStreamWaitEvent(sb, ea, 0));
    k_answer<<<1, WORDS, 0, sb>>>(a, b, v, bad);
    CUDA_OK(cudaEventRecord(eb, sb));
    CUDA_OK(cudaSetDevice(adev));
    CUDA_OK(cudaStreamWaitEvent(sa, eb, 0));
    k_check<<<1, WORDS, 0, sa>>>(b, v, bad + 1);
    CUDA_OK(cudaStreamSynchronize(sa));
    if (i > WARM)
      t.push_back(now_us() - t0);
  }
  uint32_t bads[2];
  CUDA_OK(cudaMemcpy(bads, bad, 8, cudaMemcpyDeviceToHost));
  if (bads[0] + bads[1] != 0) {
    fprintf(stderr, "kloop one_process: %u wrong words\n", bads[0] + bads[1]);
    exit(1);
  }
}

/* ---- gpuipc ---- */

/* Open channel @name for the row; both sides call it. */
static gpuipc_channel_t *chan(gpuipc_domain_t *dom, const char *name,
                              int dev)
{
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.device = dev; /* views mapped for our GPU: our kernels read them */
  o.device_set = 1;
  gpuipc_channel_t *ch;
  GI_OK(gpuipc_channel_open(dom, name, &o, &ch));
  return ch;
}

/* The side's tensor: a VMM buffer, or cudaMalloc memory (staged). */
static void own_tensor(bool staged, int dev, gpuipc_buf_t **buf,
                       uint32_t **p, struct tens *x)
{
  *buf = NULL;
  if (staged) {
    CUDA_OK(cudaMalloc(p, BYTES));
  } else {
    GI_OK(gpuipc_buf_alloc(BYTES, GPUIPC_KIND_VMM, dev, 0, buf));
    *p = (uint32_t *)gpuipc_buf_ptr(*buf);
  }
  tens_init(x, *buf, *p, dev, BYTES);
}

static const uint32_t *view_data(gpuipc_tensor_t *v)
{
  return (const uint32_t *)((const uint8_t *)v->dl.data + v->dl.byte_offset);
}

static void b_gpuipc(gpuipc_domain_t *dom, bool staged, int dev, long iters,
                     const char *name)
{
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  uint32_t *mine, *bad;
  gpuipc_buf_t *buf;
  struct tens x;
  own_tensor(staged, dev, &buf, &mine, &x);
  CUDA_OK(cudaMalloc(&bad, 4));
  CUDA_OK(cudaMemset(bad, 0, 4));
  gpuipc_channel_t *ch = chan(dom, name, dev);
  uint64_t ticket = 0;
  /* Where B's host spends its turn (means, us, after the warm-up): the
   * recv call that finds the message, send_wait, kernel, release, send. */
  double part[5] = {0};
  for (long i = 1; i <= iters; i++) {
    uint32_t v = (uint32_t)i * 4096u;
    gpuipc_tensor_t *in;
    double tp[6];
    int rc;
    do {
      tp[0] = now_us();
      rc = gpuipc_channel_recv(ch, &in, (void *)s, 0);
    } while (rc == -EAGAIN);
    GI_OK(rc);
    tp[1] = now_us();
    if (ticket != 0 && !staged)
      GI_OK(gpuipc_channel_send_wait(ch, ticket, (void *)s, -1));
    tp[2] = now_us();
    k_answer<<<1, WORDS, 0, s>>>(view_data(in), mine, v, bad);
    tp[3] = now_us();
    GI_OK(gpuipc_tensor_release(in, (void *)s));
    tp[4] = now_us();
    GI_OK(gpuipc_channel_send(ch, &x.t, (void *)s, 0, &ticket));
    tp[5] = now_us();
    if (i > WARM)
      for (int k = 0; k < 5; k++)
        part[k] += tp[k + 1] - tp[k];
  }
  long m = iters > WARM ? iters - WARM : 1;
  printf("  B's host, means (us): recv %.1f, send_wait %.1f, kernel %.1f, "
         "release %.1f, send %.1f\n", part[0] / m, part[1] / m, part[2] / m,
         part[3] / m, part[4] / m);
  CUDA_OK(cudaStreamSynchronize(s));
  if (bad_count(bad) != 0) {
    fprintf(stderr, "kloop B (%s): %u wrong words\n", name, bad_count(bad));
    exit(1);
  }
  GI_OK(gpuipc_channel_send_done(ch, ticket, -1));
  gpuipc_channel_close(ch);
}

static void a_gpuipc(gpuipc_domain_t *dom, bool staged, int dev, long iters,
                     const char *name, std::vector<double> &t, uint32_t *bad,
                     cudaStream_t s)
{
  uint32_t *mine;
  gpuipc_buf_t *buf;
  struct tens x;
  own_tensor(staged, dev, &buf, &mine, &x);
  gpuipc_channel_t *ch = chan(dom, name, dev); /* pairs once B is up: untimed */
  uint64_t ticket = 0;
  /* Where A's host spends a round trip (means, us): send_wait, write
   * kernel, send, recv (waits for B), check kernel, release, sync. */
  double part[7] = {0};
  for (long i = 1; i <= iters; i++) {
    uint32_t v = (uint32_t)i * 4096u;
    double t0 = now_us(), tp[8];
    tp[0] = t0;
    if (ticket != 0 && !staged)
      GI_OK(gpuipc_channel_send_wait(ch, ticket, (void *)s, -1));
    tp[1] = now_us();
    k_write<<<1, WORDS, 0, s>>>(mine, v);
    tp[2] = now_us();
    GI_OK(gpuipc_channel_send(ch, &x.t, (void *)s, 0, &ticket));
    tp[3] = now_us();
    gpuipc_tensor_t *in;
    GI_OK(gpuipc_channel_recv(ch, &in, (void *)s, -1));
    tp[4] = now_us();
    k_check<<<1, WORDS, 0, s>>>(view_data(in), v, bad);
    tp[5] = now_us();
    GI_OK(gpuipc_tensor_release(in, (void *)s));
    tp[6] = now_us();
    CUDA_OK(cudaStreamSynchronize(s));
    tp[7] = now_us();
    if (i > WARM) {
      t.push_back(tp[7] - t0);
      for (int k = 0; k < 7; k++)
        part[k] += tp[k + 1] - tp[k];
    }
  }
  long m = iters > WARM ? iters - WARM : 1;
  printf("  A's host, means (us): send_wait %.1f, write kernel %.1f, send "
         "%.1f, recv %.1f, check kernel %.1f, release %.1f, sync %.1f\n",
         part[0] / m, part[1] / m, part[2] / m, part[3] / m, part[4] / m,
         part[5] / m, part[6] / m);
  GI_OK(gpuipc_channel_send_done(ch, ticket, -1));
  gpuipc_channel_close(ch);
  if (staged)
    CUDA_OK(cudaFree(mine));
  else
    gpuipc_buf_release(buf);
}

/* ---- the two sides ---- */

static int side_b(int dev, long iters, const char *dname)
{
  CUDA_OK(cudaSetDevice(dev));
  CUDA_OK(cudaFree(0));
  gpuipc_domain_t *dom;
  GI_OK(gpuipc_domain_join(dname, NULL, &dom));
  int row = __atomic_load_n(&g->row, __ATOMIC_ACQUIRE);
  char name[64];
  snprintf(name, sizeof(name), "kloop-%s", row_names[row]);
  if (row == ROW_WORD || row == ROW_EVENT)
    b_floor(row, dev, iters);
  else
    b_gpuipc(dom, row == ROW_STAGED, dev, iters, name);
  gpuipc_domain_leave(dom);
  return 0;
}

static void report(const char *row, std::vector<double> &t)
{
  std::sort(t.begin(), t.end());
  double med = t[t.size() / 2];
  double p99 = t[std::min(t.size() - 1, t.size() * 99 / 100)];
  printf("RESULT kloop %s %.2f %.2f %zu\n", row, med, p99, t.size());
  printf("%-14s median %8.2f us  p99 %8.2f us  (%zu round trips)\n", row, med,
         p99, t.size());
  fflush(stdout);
}

/* Run @row with a fresh side B (on @bdev); returns the round trips. */
static void run_row(int row, int adev, int bdev, long iters, int fd,
                    const char *self, const char *dname, gpuipc_domain_t *dom)
{
  memset((void *)g, 0, sizeof(*g));
  g->row = row;
  std::vector<double> t;
  if (row == ROW_ONE) {
    one_process(adev, bdev, iters, t);
    report(row_names[row], t);
    return;
  }
  char sdev[16], siters[32], sfd[16];
  snprintf(sdev, sizeof(sdev), "%d", bdev);
  snprintf(siters, sizeof(siters), "%ld", iters);
  snprintf(sfd, sizeof(sfd), "%d", fd);
  pid_t pid = fork();
  if (pid == 0) {
    execl(self, self, "--side-b", sdev, siters, sfd, dname, (char *)NULL);
    _exit(127);
  }
  CUDA_OK(cudaSetDevice(adev));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  uint32_t *bad;
  CUDA_OK(cudaMalloc(&bad, 4));
  CUDA_OK(cudaMemset(bad, 0, 4));
  if (row == ROW_WORD || row == ROW_EVENT) {
    uint32_t *mine;
    CUDA_OK(cudaMalloc(&mine, BYTES));
    a_floor(row, iters, t, mine, bad, s);
    CUDA_OK(cudaFree(mine));
  } else {
    char name[64];
    snprintf(name, sizeof(name), "kloop-%s", row_names[row]);
    a_gpuipc(dom, row == ROW_STAGED, adev, iters, name, t, bad, s);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "kloop %s: side B failed (status %d)\n", row_names[row],
            st);
    exit(1);
  }
  if (bad_count(bad) != 0) {
    fprintf(stderr, "kloop A (%s): %u wrong words\n", row_names[row],
            bad_count(bad));
    exit(1);
  }
  CUDA_OK(cudaFree(bad));
  CUDA_OK(cudaStreamDestroy(s));
  report(row_names[row], t);
}

/* Whether @name is one of the comma-separated @rows (NULL: all). */
static bool row_wanted(const char *rows, const char *name)
{
  size_t n = strlen(name);
  for (const char *p = rows; p != NULL; p = strchr(p, ',')) {
    p += *p == ',';
    if (strncmp(p, name, n) == 0 && (p[n] == ',' || p[n] == 0))
      return true;
  }
  return rows == NULL;
}

static void map_shared(int fd)
{
  void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    perror("kloop: mmap");
    exit(1);
  }
  g = (struct shared *)p;
}

int main(int argc, char **argv)
{
  if (argc == 6 && strcmp(argv[1], "--side-b") == 0) {
    map_shared(atoi(argv[4]));
    CUDA_OK(cudaHostRegister((void *)g, 4096, cudaHostRegisterMapped |
                                                  cudaHostRegisterPortable));
    return side_b(atoi(argv[2]), atol(argv[3]), argv[5]);
  }
  if (argc < 3) {
    fprintf(stderr, "usage: kloop_bench ADEV BDEV [--iters N] [--rows "
                    "floor_word,floor_event,one_process,gpuipc,"
                    "gpuipc_staged]\n");
    return 2;
  }
  int adev = atoi(argv[1]), bdev = atoi(argv[2]);
  long iters = 2000 + WARM;
  const char *rows = NULL;
  for (int i = 3; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--iters") == 0)
      iters = atol(argv[i + 1]);
    else if (strcmp(argv[i], "--rows") == 0)
      rows = argv[i + 1];
  }
  int fd = memfd_create("kloop", 0); /* inherited by side B across exec */
  if (fd < 0 || ftruncate(fd, 4096) != 0) {
    perror("kloop: memfd");
    return 1;
  }
  map_shared(fd);
  CUDA_OK(cudaSetDevice(adev));
  CUDA_OK(cudaHostRegister((void *)g, 4096, cudaHostRegisterMapped |
                                                cudaHostRegisterPortable));
  char dname[64];
  snprintf(dname, sizeof(dname), "kloop-%d", (int)getpid());
  gpuipc_domain_t *dom;
  GI_OK(gpuipc_domain_join(dname, NULL, &dom));
  printf("kloop_bench: GPU %d <-> GPU %d, 4 KiB, %ld round trips a row\n",
         adev, bdev, iters);
  for (int r = 0; r < NROWS; r++)
    if (row_wanted(rows, row_names[r]))
      run_row(r, adev, bdev, iters, fd, "/proc/self/exe", dname, dom);
  gpuipc_domain_leave(dom);
  return 0;
}
