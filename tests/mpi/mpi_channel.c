/*
 * gpuipc_mpi_channel_open under mpirun with 4 ranks: ranks 2k and 2k+1
 * share a channel. argv[1] says which path it must take: "shm" (one
 * machine) or "mpi" (started through node_id.sh: rank % 2 is the
 * "machine", so every pair spans two). The even rank sends NMSG tensors of
 * varying sizes, contiguous and strided, staged (buf NULL) and from HOST
 * buffers of its own; the odd rank takes them with gpuipc_mpi_channel_recv (views)
 * and gpuipc_mpi_channel_recv_into and checks every byte and the order. Also: flow
 * control (depth messages, then -EAGAIN until releases), a mismatched
 * recv_into leaving the message first in line, invalid tensors rejected
 * before anything is sent, a message back, and GPUIPC_E_PEER_GONE once
 * the sender closed and everything was received. With a GPU, device
 * tensors cross too (gpu_part); without one on every rank that part is
 * left out with a line saying so.
 * With argv[2] "timeouts" (and GPUIPC_TIMEOUT_MS=300 from CTest) only
 * timeouts_part runs: every call's timeout follows gpuipc.h's rule.
 */
#include "gpuipc_mpi.h"
#include "test.h"

#include <mpi.h>
#include <stdbool.h>
#include <unistd.h>

#define NMSG 10000
#define DEPTH 8
#define MAXBYTES (1u << 20)

static uint8_t pattern(uint64_t seq, uint64_t i)
{
  uint64_t x = seq * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return (uint8_t)(x ^ (x >> 17));
}

/* Message k: its size in bytes (contiguous) and whether it is strided. */
static uint64_t msg_bytes(int k)
{
  if (k % 1000 == 999)
    return MAXBYTES; /* a large one now and then */
  return (uint64_t)((k * 7919u) % 65536u) + 1;
}

static bool msg_strided(int k)
{
  return k % 4 == 3;
}

/* Strided: a 2-D uint32 view, @rows x @cols of a rows x (cols + 3)
 * buffer, starting at column 1. */
static void strided_shape(int k, int64_t *rows, int64_t *cols)
{
  *rows = 1 + k % 37;
  *cols = 1 + (k * 13) % 101;
}

static void bad_tensors(gpuipc_mpi_channel_t *ch, gpuipc_buf_t *buf)
{
  int64_t shape[9] = {4, 4, 1, 1, 1, 1, 1, 1, 1};
  gpuipc_tensor_t t = {.dl = {.data = gpuipc_buf_ptr(buf),
                              .device = {GPUIPC_DL_CPU, 0},
                              .ndim = 9,
                              .dtype = {GPUIPC_DL_UINT, 8, 1},
                              .shape = shape},
                       .buf = buf};
  ASSERT_RC(gpuipc_mpi_channel_send(ch, &t, NULL, 0, NULL), -EINVAL);
  t.dl.ndim = 2;
  t.dl.dtype.bits = 12;
  ASSERT_RC(gpuipc_mpi_channel_send(ch, &t, NULL, 0, NULL), -EINVAL);
  t.dl.dtype.bits = 8;
  shape[0] = -1;
  ASSERT_RC(gpuipc_mpi_channel_send(ch, &t, NULL, 0, NULL), -EINVAL);
  shape[0] = 4;
  t.dl.byte_offset = gpuipc_buf_size(buf) - 8; /* 16 bytes from there */
  ASSERT_RC(gpuipc_mpi_channel_send(ch, &t, NULL, 0, NULL), -EINVAL);
  t.dl.byte_offset = 0;
  int64_t strides[2] = {-4, 1};
  t.dl.strides = strides;
  ASSERT_RC(gpuipc_mpi_channel_send(ch, &t, NULL, 0, NULL), -EINVAL);
  t.dl.strides = NULL;
  t.dl.data = (uint8_t *)gpuipc_buf_ptr(buf) + gpuipc_buf_size(buf) + 64;
  ASSERT_RC(gpuipc_mpi_channel_send(ch, &t, NULL, 0, NULL), -EINVAL);
  /* Memory gpuipc did not allocate must be contiguous. */
  uint8_t mem[64];
  int64_t st2[2] = {8, 1};
  t.dl.data = mem;
  t.dl.strides = st2;
  t.buf = NULL;
  ASSERT_RC(gpuipc_mpi_channel_send(ch, &t, NULL, 0, NULL), -EINVAL);
  ASSERT_RC(gpuipc_mpi_channel_send(ch, NULL, NULL, 0, NULL), -EINVAL);
  ASSERT_RC(gpuipc_mpi_channel_send(ch, &t, NULL, 0x80, NULL), -EINVAL);
}

/* Release callback: each ticket once, none that was not sent. */
struct released {
  gpuipc_mpi_channel_t *ch;
  uint64_t sent; /* tickets 1..sent were handed out */
  uint64_t count;
  uint8_t seen[NMSG + DEPTH + 2];
};

static void on_release(gpuipc_mpi_channel_t *ch, uint64_t ticket, void *user)
{
  struct released *r = user;
  if (ch != r->ch)
    TFAIL("release callback for channel %p, not %p", (void *)ch,
          (void *)r->ch);
  if (ticket == 0 || ticket > r->sent || r->seen[ticket])
    TFAIL("release callback for ticket %llu (%llu sent, seen before: %d)",
          (unsigned long long)ticket, (unsigned long long)r->sent,
          ticket <= r->sent ? r->seen[ticket] : 0);
  r->seen[ticket] = 1;
  r->count++;
}

static void sender(gpuipc_mpi_channel_t *ch, MPI_Comm world)
{
  static struct released rel;
  rel.ch = ch;
  ASSERT_RC(gpuipc_mpi_channel_on_release(NULL, on_release, &rel), -EINVAL);
  ASSERT_OK(gpuipc_mpi_channel_on_release(ch, on_release, &rel));
  gpuipc_buf_t *bufs[DEPTH];
  uint64_t last[DEPTH] = {0};
  for (int i = 0; i < DEPTH; i++)
    ASSERT_OK(gpuipc_buf_alloc(4 * MAXBYTES, GPUIPC_KIND_HOST, -1, 0,
                               &bufs[i]));
  bad_tensors(ch, bufs[0]);
  uint8_t *scratch = malloc(MAXBYTES);
  ASSERT_TRUE(scratch != NULL);

  /* Flow control: the receiver waits at the barrier, so `depth` sends
   * go out and the next finds no room. */
  int64_t one = 16;
  for (int k = 0; k < DEPTH + 1; k++) {
    gpuipc_tensor_t t = {.dl = {.data = scratch,
                                .device = {GPUIPC_DL_CPU, 0},
                                .ndim = 1,
                                .dtype = {GPUIPC_DL_UINT, 8, 1},
                                .shape = &one}};
    memset(scratch, k, 16);
    rel.sent += k < DEPTH;
    ASSERT_RC(gpuipc_mpi_channel_send(ch, &t, NULL, GPUIPC_SEND_NONBLOCK, NULL),
              k < DEPTH ? 0 : -EAGAIN);
  }
  MPI_Barrier(world);

  for (int k = 0; k < NMSG; k++) {
    uint64_t seq = (uint64_t)k + DEPTH + 1; /* tickets so far + 1 */
    gpuipc_buf_t *b = bufs[k % DEPTH];
    /* The buffer is reused: wait for the message that had it, both ways. */
    if (last[k % DEPTH] != 0 && k % 2)
      ASSERT_OK(gpuipc_mpi_channel_send_done(ch, last[k % DEPTH], -1));
    else if (last[k % DEPTH] != 0)
      ASSERT_OK(gpuipc_mpi_channel_send_wait(ch, last[k % DEPTH], NULL, -1));
    uint8_t *p = gpuipc_buf_ptr(b);
    int64_t shape[2], strides[2];
    gpuipc_tensor_t t = {.dl = {.device = {GPUIPC_DL_CPU, 0},
                                .dtype = {GPUIPC_DL_UINT, 8, 1},
                                .shape = shape}};
    if (msg_strided(k)) {
      strided_shape(k, &shape[0], &shape[1]);
      strides[0] = shape[1] + 3;
      strides[1] = 1;
      uint32_t *e = (uint32_t *)p;
      for (int64_t r = 0; r < shape[0]; r++)
        for (int64_t c = 0; c < strides[0]; c++)
          e[r * strides[0] + c] =
              c >= 1 && c <= shape[1]
                  ? (uint32_t)(seq * 1000003u + (uint64_t)(r * shape[1] + c - 1))
                  : 0xdeadbeefu;
      t.dl.data = p;
      t.dl.byte_offset = 4;
      t.dl.ndim = 2;
      t.dl.dtype.bits = 32;
      t.dl.strides = strides;
      t.buf = b;
    } else {
      uint64_t n = msg_bytes(k);
      shape[0] = (int64_t)n;
      t.dl.ndim = 1;
      /* Half staged from plain memory, half from the buffer at an offset. */
      uint8_t *dst = k % 2 ? scratch : p + 64;
      for (uint64_t i = 0; i < n; i++)
        dst[i] = pattern(seq, i);
      if (k % 2) {
        t.dl.data = scratch;
      } else {
        t.dl.data = p + 32;
        t.dl.byte_offset = 32;
        t.buf = b;
      }
    }
    uint64_t ticket = 0;
    rel.sent++;
    ASSERT_OK(gpuipc_mpi_channel_send(ch, &t, NULL, 0, &ticket));
    ASSERT_EQ_U(ticket, seq);
    if (t.buf != NULL)
      last[k % DEPTH] = ticket;
    else if (k % 2) /* staged: the memory may change at once */
      memset(scratch, 0xa5, msg_bytes(k));
  }
  /* A message back. */
  uint64_t back[4];
  gpuipc_tensor_t into = {.dl = {.data = back,
                                 .device = {GPUIPC_DL_CPU, 0},
                                 .ndim = 1,
                                 .dtype = {GPUIPC_DL_UINT, 64, 1},
                                 .shape = (int64_t[]){4}}};
  ASSERT_OK(gpuipc_mpi_channel_recv_into(ch, &into, NULL, -1));
  for (int i = 0; i < 4; i++)
    ASSERT_EQ_U(back[i], 0x1234000ull + (uint64_t)i);
  /* Every message is free once everything was received, and each was
   * reported to the callback exactly once. */
  ASSERT_RC(gpuipc_mpi_channel_send_wait(ch, rel.sent + 1, NULL, 0), -EINVAL);
  for (uint64_t tk = 1; tk <= rel.sent; tk++)
    ASSERT_OK(gpuipc_mpi_channel_send_done(ch, tk, -1));
  ASSERT_EQ_U(rel.count, rel.sent);
  ASSERT_OK(gpuipc_mpi_channel_on_release(ch, NULL, NULL));
  ASSERT_OK(gpuipc_mpi_channel_close(ch));
  for (int i = 0; i < DEPTH; i++)
    gpuipc_buf_release(bufs[i]);
  free(scratch);
}

static void check_strided(const gpuipc_tensor_t *v, int k, uint64_t seq)
{
  int64_t rows, cols;
  strided_shape(k, &rows, &cols);
  ASSERT_EQ(v->dl.ndim, 2);
  ASSERT_EQ(v->dl.dtype.bits, 32);
  ASSERT_EQ(v->dl.shape[0], rows);
  ASSERT_EQ(v->dl.shape[1], cols);
  ASSERT_TRUE(v->dl.strides != NULL);
  ASSERT_EQ(v->dl.strides[0], cols + 3);
  ASSERT_EQ(v->dl.strides[1], 1);
  const uint32_t *e =
      (const uint32_t *)((const uint8_t *)v->dl.data + v->dl.byte_offset);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++)
      if (e[r * (cols + 3) + c] != (uint32_t)(seq * 1000003u +
                                              (uint64_t)(r * cols + c)))
        TFAIL("message %d: element (%lld, %lld) is 0x%x", k, (long long)r,
              (long long)c, e[r * (cols + 3) + c]);
}

static void check_bytes(const uint8_t *p, uint64_t n, int k, uint64_t seq)
{
  for (uint64_t i = 0; i < n; i++)
    if (p[i] != pattern(seq, i))
      TFAIL("message %d: byte %llu of %llu is 0x%02x, not 0x%02x", k,
            (unsigned long long)i, (unsigned long long)n, p[i],
            pattern(seq, i));
}

static void receiver(gpuipc_mpi_channel_t *ch, MPI_Comm world)
{
  uint8_t *dst = malloc(MAXBYTES);
  ASSERT_TRUE(dst != NULL);
  /* Hold the first `depth` views unreleased: the sender found no room. */
  MPI_Barrier(world);
  gpuipc_tensor_t *held[DEPTH];
  for (int k = 0; k < DEPTH; k++) {
    ASSERT_OK(gpuipc_mpi_channel_recv(ch, &held[k], NULL, -1));
    ASSERT_EQ(held[k]->dl.shape[0], 16);
    const uint8_t *p =
        (const uint8_t *)held[k]->dl.data + held[k]->dl.byte_offset;
    for (int i = 0; i < 16; i++)
      ASSERT_EQ(p[i], k);
  }
  ASSERT_RC(gpuipc_mpi_channel_recv(ch, &held[0], NULL, 0), -EAGAIN);
  for (int k = 0; k < DEPTH; k++)
    ASSERT_OK(gpuipc_mpi_tensor_release(held[k], NULL));

  for (int k = 0; k < NMSG; k++) {
    uint64_t seq = (uint64_t)k + DEPTH + 1;
    if (k % 500 == 250)
      usleep(20000); /* a slow receiver: the sender waits for room */
    if (msg_strided(k)) {
      gpuipc_tensor_t *v;
      ASSERT_OK(gpuipc_mpi_channel_recv(ch, &v, NULL, -1));
      check_strided(v, k, seq);
      ASSERT_OK(gpuipc_mpi_tensor_release(v, NULL));
      continue;
    }
    uint64_t n = msg_bytes(k);
    if (k % 3 == 0) {
      int64_t shape = (int64_t)n;
      gpuipc_tensor_t into = {.dl = {.data = dst,
                                     .device = {GPUIPC_DL_CPU, 0},
                                     .ndim = 1,
                                     .dtype = {GPUIPC_DL_UINT, 8, 1},
                                     .shape = &shape}};
      if (k % 999 == 0) {
        /* Wrong shape: refused, and the message stays first in line. */
        int64_t wrong = (int64_t)n + 1;
        into.dl.shape = &wrong;
        ASSERT_RC(gpuipc_mpi_channel_recv_into(ch, &into, NULL, -1), -EINVAL);
        into.dl.shape = &shape;
      }
      memset(dst, 0, n);
      ASSERT_OK(gpuipc_mpi_channel_recv_into(ch, &into, NULL, -1));
      check_bytes(dst, n, k, seq);
    } else {
      gpuipc_tensor_t *v;
      ASSERT_OK(gpuipc_mpi_channel_recv(ch, &v, NULL, -1));
      ASSERT_EQ(v->dl.ndim, 1);
      ASSERT_EQ(v->dl.shape[0], (int64_t)n);
      ASSERT_EQ(v->dl.device.device_type, GPUIPC_DL_CPU);
      ASSERT_TRUE(v->buf != NULL);
      check_bytes((const uint8_t *)v->dl.data + v->dl.byte_offset, n, k,
                  seq);
      ASSERT_OK(gpuipc_mpi_tensor_release(v, NULL));
    }
  }
  uint64_t back[4] = {0x1234000, 0x1234001, 0x1234002, 0x1234003};
  gpuipc_tensor_t t = {.dl = {.data = back,
                              .device = {GPUIPC_DL_CPU, 0},
                              .ndim = 1,
                              .dtype = {GPUIPC_DL_UINT, 64, 1},
                              .shape = (int64_t[]){4}}};
  ASSERT_OK(gpuipc_mpi_channel_send(ch, &t, NULL, 0, NULL));
  /* The sender closes once it has that: then nothing more comes. */
  gpuipc_tensor_t *v;
  ASSERT_RC(gpuipc_mpi_channel_recv(ch, &v, NULL, -1), GPUIPC_E_PEER_GONE);
  ASSERT_RC(gpuipc_mpi_channel_recv(ch, &v, NULL, 0), GPUIPC_E_PEER_GONE);
  ASSERT_OK(gpuipc_mpi_channel_close(ch));
  free(dst);
}

/*
 * Device memory across the channel, when both ranks have a GPU (rank r
 * uses GPU r % count, so on two GPUs each pair spans both and each GPU
 * serves two ranks): HOST bytes go into the odd rank's device buffer
 * (recv_into), come back as staged device memory (buf NULL) to a device
 * view, go out again from that view and are checked in HOST memory: every
 * byte made four trips, two of them from and two into GPU memory. Each
 * side waits for its sends only after it has taken what the other sent
 * (a release needs the peer's receive).
 */
static void gpu_part(gpuipc_mpi_channel_t *ch, int even, int dev)
{
  const uint64_t n = 3u << 20;
  int64_t shape = (int64_t)n;
  gpuipc_buf_t *host;
  ASSERT_OK(gpuipc_buf_alloc(n, GPUIPC_KIND_HOST, -1, 0, &host));
  uint8_t *h = gpuipc_buf_ptr(host);
  gpuipc_tensor_t ht = {.dl = {.data = h,
                               .device = {GPUIPC_DL_CPU, 0},
                               .ndim = 1,
                               .dtype = {GPUIPC_DL_UINT, 8, 1},
                               .shape = &shape},
                        .buf = host};
  uint64_t tk, tk_host;
  if (even) {
    for (uint64_t i = 0; i < n; i++)
      h[i] = pattern(77, i);
    ASSERT_OK(gpuipc_mpi_channel_send(ch, &ht, NULL, 0, &tk_host));
    gpuipc_tensor_t *v;
    ASSERT_OK(gpuipc_mpi_channel_recv(ch, &v, NULL, -1));
    ASSERT_EQ(v->dl.device.device_type, GPUIPC_DL_CUDA);
    ASSERT_EQ(v->dl.shape[0], shape);
    ASSERT_OK(gpuipc_mpi_channel_send(ch, v, NULL, 0, &tk));
    ASSERT_OK(gpuipc_mpi_channel_send_done(ch, tk, -1));
    ASSERT_OK(gpuipc_mpi_channel_send_done(ch, tk_host, -1));
    ASSERT_OK(gpuipc_mpi_tensor_release(v, NULL));
  } else {
    gpuipc_buf_t *gbuf;
    ASSERT_OK(gpuipc_buf_alloc(n, GPUIPC_KIND_AUTO, dev, 0, &gbuf));
    gpuipc_tensor_t dt = {.dl = {.data = gpuipc_buf_ptr(gbuf),
                                 .device = {GPUIPC_DL_CUDA, dev},
                                 .ndim = 1,
                                 .dtype = {GPUIPC_DL_UINT, 8, 1},
                                 .shape = &shape},
                          .buf = gbuf};
    ASSERT_OK(gpuipc_mpi_channel_recv_into(ch, &dt, NULL, -1));
    dt.buf = NULL; /* staged: memory gpuipc did not allocate, as it were */
    ASSERT_OK(gpuipc_mpi_channel_send(ch, &dt, NULL, 0, &tk));
    memset(h, 0, n);
    ASSERT_OK(gpuipc_mpi_channel_recv_into(ch, &ht, NULL, -1));
    /* The copy into HOST memory (registered with CUDA) is queued on the
     * legacy stream, not done: a synchronous copy after it waits for it. */
    uint8_t scratch;
    ASSERT_OK(gpuipc_memcpy(&scratch, gpuipc_buf_ptr(gbuf), 1, dev, NULL));
    check_bytes(h, n, -1, 77);
    ASSERT_OK(gpuipc_mpi_channel_send_done(ch, tk, -1));
    gpuipc_buf_release(gbuf);
  }
  gpuipc_buf_release(host);
}

/*
 * GPUIPC_CHANNEL_OPTS_INIT's send timeout: a send blocked on flow control
 * (depth 1) gives up after GPUIPC_TIMEOUT_DEFAULT, GPUIPC_TIMEOUT_MS.
 */
static void default_send_part(int rank, int peer, MPI_Comm pair,
                              const gpuipc_tensor_t *tp)
{
  gpuipc_mpi_channel_t *ch = NULL;
  gpuipc_tensor_t t = *tp;
  gpuipc_channel_opts_t d = GPUIPC_CHANNEL_OPTS_INIT;
  d.depth = 1;
  ASSERT_OK(gpuipc_mpi_channel_open(MPI_COMM_WORLD, peer, 12, &d, &ch));
  if (rank % 2 == 0) {
    ASSERT_OK(gpuipc_mpi_channel_send(ch, &t, NULL, 0, NULL));
    ASSERT_RC(gpuipc_mpi_channel_send(ch, &t, NULL, 0, NULL), -ETIMEDOUT);
    MPI_Barrier(pair);
  } else {
    gpuipc_tensor_t *v = NULL;
    MPI_Barrier(pair);
    ASSERT_OK(gpuipc_mpi_channel_recv(ch, &v, NULL, GPUIPC_TIMEOUT_FOREVER));
    ASSERT_OK(gpuipc_mpi_tensor_release(v, NULL));
  }
  MPI_Barrier(pair);
  ASSERT_OK(gpuipc_mpi_channel_close(ch));
}

/*
 * Timeouts on a channel of depth 1 whose send timeout is 0: 0 does not
 * wait (-EAGAIN), GPUIPC_TIMEOUT_DEFAULT is GPUIPC_TIMEOUT_MS (300 ms
 * here: -ETIMEDOUT), GPUIPC_TIMEOUT_FOREVER waits for the peer, -3 is
 * -EINVAL. Barriers of @pair order the two ranks.
 */
static void timeouts_part(int rank, int peer, MPI_Comm pair, bool want_shm)
{
  gpuipc_mpi_channel_t *ch = NULL;
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.send_timeout_ms = -3;
  ASSERT_RC(gpuipc_mpi_channel_open(MPI_COMM_WORLD, peer, 11, &o, &ch),
            -EINVAL);
  o.send_timeout_ms = 0;
  o.depth = 1;
  o.timeout_ms = GPUIPC_TIMEOUT_FOREVER;
  ASSERT_OK(gpuipc_mpi_channel_open(MPI_COMM_WORLD, peer, 11, &o, &ch));
  ASSERT_TRUE((gpuipc_mpi_channel_shm(ch) != NULL) == want_shm);
  uint8_t mem[64];
  memset(mem, 7, sizeof(mem));
  int64_t shape[1] = {sizeof(mem)};
  gpuipc_tensor_t t = {0};
  t.dl.data = mem;
  t.dl.device.device_type = GPUIPC_DL_CPU;
  t.dl.ndim = 1;
  t.dl.dtype = (gpuipc_dl_dtype_t){GPUIPC_DL_UINT, 8, 1};
  t.dl.shape = shape;
  default_send_part(rank, peer, pair, &t);
  if (rank % 2 == 1) {
    gpuipc_tensor_t *v = NULL;
    ASSERT_RC(gpuipc_mpi_channel_recv(ch, &v, NULL, 0), -EAGAIN);
    ASSERT_RC(gpuipc_mpi_channel_recv(ch, &v, NULL, GPUIPC_TIMEOUT_DEFAULT),
              -ETIMEDOUT);
    ASSERT_RC(gpuipc_mpi_channel_recv(ch, &v, NULL, -3), -EINVAL);
    ASSERT_RC(gpuipc_mpi_channel_recv_into(ch, &t, NULL, -3), -EINVAL);
    MPI_Barrier(pair); /* the sender may send */
    MPI_Barrier(pair); /* it has sent and checked its calls */
    ASSERT_OK(gpuipc_mpi_channel_recv(ch, &v, NULL, GPUIPC_TIMEOUT_FOREVER));
    ASSERT_EQ(((uint8_t *)v->dl.data)[v->dl.byte_offset], 7);
    ASSERT_OK(gpuipc_mpi_tensor_release(v, NULL));
  } else {
    uint64_t tk;
    MPI_Barrier(pair);
    ASSERT_OK(gpuipc_mpi_channel_send(ch, &t, NULL, 0, &tk));
    ASSERT_RC(gpuipc_mpi_channel_send(ch, &t, NULL, 0, NULL), -EAGAIN);
    ASSERT_RC(gpuipc_mpi_channel_send_done(ch, tk, 0), -EAGAIN);
    ASSERT_RC(gpuipc_mpi_channel_send_done(ch, tk, GPUIPC_TIMEOUT_DEFAULT),
              -ETIMEDOUT);
    ASSERT_RC(gpuipc_mpi_channel_send_wait(ch, tk, NULL,
                                           GPUIPC_TIMEOUT_DEFAULT),
              -ETIMEDOUT);
    ASSERT_RC(gpuipc_mpi_channel_send_done(ch, tk, -3), -EINVAL);
    ASSERT_RC(gpuipc_mpi_channel_send_wait(ch, tk, NULL, -3), -EINVAL);
    MPI_Barrier(pair);
    ASSERT_OK(gpuipc_mpi_channel_send_done(ch, tk, GPUIPC_TIMEOUT_FOREVER));
  }
  MPI_Barrier(pair);
  ASSERT_OK(gpuipc_mpi_channel_close(ch));
}

int main(int argc, char **argv)
{
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ASSERT_TRUE(argc == 2 || (argc == 3 && strcmp(argv[2], "timeouts") == 0));
  bool want_shm = strcmp(argv[1], "shm") == 0;
  ASSERT_EQ(size % 2, 0);
  int peer = rank ^ 1;
  if (argc == 3) {
    MPI_Comm pair;
    MPI_Comm_split(MPI_COMM_WORLD, rank / 2, rank, &pair);
    timeouts_part(rank, peer, pair, want_shm);
    MPI_Comm_free(&pair);
    MPI_Finalize();
    return 0;
  }

  gpuipc_mpi_channel_t *ch = NULL;
  /* Arguments every rank can see are wrong alone. */
  ASSERT_RC(gpuipc_mpi_channel_open(MPI_COMM_WORLD, rank, 5, NULL, &ch),
            -EINVAL);
  ASSERT_RC(gpuipc_mpi_channel_open(MPI_COMM_WORLD, size, 5, NULL, &ch),
            -EINVAL);
  ASSERT_RC(gpuipc_mpi_channel_open(MPI_COMM_WORLD, peer, -1, NULL, &ch),
            -EINVAL);
  /* NULL @out on the odd rank only: both fail. */
  ASSERT_RC(gpuipc_mpi_channel_open(MPI_COMM_WORLD, peer, 5, NULL,
                                    rank % 2 ? NULL : &ch), -EINVAL);
  ASSERT_TRUE(ch == NULL);

  gpuipc_channel_opts_t opts = GPUIPC_CHANNEL_OPTS_INIT;
  opts.depth = DEPTH;
  opts.stage_slots = DEPTH;
  ASSERT_OK(gpuipc_mpi_channel_open(MPI_COMM_WORLD, peer, 7, &opts, &ch));
  ASSERT_TRUE((gpuipc_mpi_channel_shm(ch) != NULL) == want_shm);
  MPI_Comm pairs;
  MPI_Comm_split(MPI_COMM_WORLD, rank / 2, rank, &pairs);
  if (rank % 2 == 0)
    sender(ch, pairs);
  else
    receiver(ch, pairs);

  /* Device tensors, on a second channel of the pair (tag 8). */
  int gpus = gpuipc_driver_status(NULL) == 0 ? gpuipc_device_count() : 0;
  int all = 0;
  MPI_Allreduce(&gpus, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (all > 0) {
    int dev = rank % all;
    opts.device = dev;
    opts.device_set = 1;
    ASSERT_OK(gpuipc_mpi_channel_open(MPI_COMM_WORLD, peer, 8, &opts, &ch));
    gpu_part(ch, rank % 2 == 0, dev);
    ASSERT_OK(gpuipc_mpi_channel_close(ch));
  } else if (rank == 0) {
    printf("no GPU on every rank: device tensors not tried\n");
  }
  MPI_Comm_free(&pairs);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0)
    printf("%s path: %d messages a pair checked\n", argv[1], NMSG);
  MPI_Finalize();
  return 0;
}
