/*
 * The MPI path's GPU messages, on a CPU: gpuipc loads the fake CUDA driver
 * (GPUIPC_CUDA_LIB), whose "device memory" is host memory and whose copies
 * lag (FAKE_CUDA_COPY_LAG_US: a copy is done only when an event recorded
 * after it is queried that long after, or on a synchronisation). Ranks 2k
 * and 2k+1, on two "machines" (node_id.sh), send each other tensors of
 * device type CUDA. With GPUIPC_MPI_CHUNK_KB=4 the messages are of one
 * byte, one chunk less a byte, exactly one chunk, one more byte, exactly
 * the ring (16 chunks), the ring and one chunk, and up to 1025 chunks,
 * then many of sizes drawn in turn. Three rounds:
 *  1. memory gpuipc did not allocate (buf NULL), both ways, taken with
 *     gpuipc_mpi_channel_recv_into into CUDA-typed destinations with buf NULL; the
 *     source is overwritten as soon as gpuipc_mpi_channel_send returns (it must
 *     have been staged by then), and a lagging copy of junk into the
 *     destination is queued on the stream before each receive (the bytes
 *     received must land after it);
 *  2. LEGACY buffers of gpuipc's (the fake's cuMemAlloc), each filled by a
 *     lagging copy queued on the stream just before the send, so the
 *     sender must order its reads after the work queued before the send;
 *     three take turns, each rewritten only after gpuipc_mpi_channel_send_done
 *     said its last message is free; taken as views (gpuipc_mpi_channel_recv:
 *     buffers of the receiver's, on its "GPU").
 * Argument "staged" (MPI not CUDA-aware, as Debian's Open MPI): staged
 * GPU memory goes through pinned host memory, chunk by chunk, both ends.
 * Argument "aware" (GPUIPC_MPI_CUDA_AWARE=1): MPI is handed the "device"
 * pointers of gpuipc buffers and of destinations, and only memory gpuipc
 * did not allocate is staged when sent. Every byte and the order are
 * checked; the fake must have made exactly the copies expected (one per
 * staged chunk on either end, one per fill) and, staged, answered "not
 * ready" at least once, so the copies did lag.
 * Argument "bad-setting" (GPUIPC_MPI_CUDA_AWARE=maybe): opening fails on
 * both ranks with -EINVAL and a sentence naming the setting.
 */
#include "core/private.h"
#include "gpuipc_mpi.h"
#include "test.h"

#include <dlfcn.h>
#include <mpi.h>
#include <stdbool.h>

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#define CHUNK 4096u /* GPUIPC_MPI_CHUNK_KB=4 */
#define RING 16u    /* receives (and staging chunks) in flight */
#define NMSG 240    /* from the even rank; half as many back */
#define MAXBYTES ((4u << 20) + 3)

static const uint64_t fixed[] = {
    1, CHUNK - 1, CHUNK, CHUNK + 1,                 /* one chunk, about */
    RING * CHUNK, RING * CHUNK + 1,                 /* the ring, about */
    (RING + 1) * CHUNK, (RING + 1) * CHUNK - 1,     /* the ring and one */
    2 * RING * CHUNK + 5, 1u << 20, MAXBYTES,       /* many times the ring */
    3, (RING - 1) * CHUNK};
#define NFIXED ((int)(sizeof(fixed) / sizeof(fixed[0])))

static uint8_t pattern(int dir, int k, uint64_t i)
{
  uint64_t x = ((uint64_t)dir << 40 | (uint64_t)k) * 0x9E3779B97F4A7C15ull +
               i * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return (uint8_t)(x ^ (x >> 17));
}

/* Message k's size: the fixed ones first, then drawn in turn, one in 40
 * a large one (hundreds of chunks: many times the ring). */
static uint64_t msg_bytes(int k)
{
  if (k < NFIXED)
    return fixed[k];
  if (k % 40 == 39)
    return (1u << 20) + (uint64_t)k * 37u;
  return (uint64_t)((k * 7919u) % (40u * CHUNK)) + 1;
}

static uint64_t chunks_of(uint64_t n)
{
  return (n + CHUNK - 1) / CHUNK;
}

static bool aware; /* "aware": MPI takes device pointers */
static uint8_t junk[MAXBYTES];

static gpuipc_tensor_t cuda_tensor(void *p, int64_t *shape)
{
  gpuipc_tensor_t t = {.dl = {.data = p,
                              .device = {GPUIPC_DL_CUDA, 0},
                              .ndim = 1,
                              .dtype = {GPUIPC_DL_UINT, 8, 1},
                              .shape = shape}};
  return t; /* buf NULL: not gpuipc's memory */
}

/* @n messages out (direction @dir) from memory gpuipc did not allocate;
 * returns the copies made: one per chunk, staged either way. */
static uint64_t send_all(gpuipc_mpi_channel_t *ch, int dir, int n,
                         uint8_t *src)
{
  uint64_t chunks = 0;
  for (int k = 0; k < n; k++) {
    uint64_t bytes = msg_bytes(k);
    for (uint64_t i = 0; i < bytes; i++)
      src[i] = pattern(dir, k, i);
    int64_t shape = (int64_t)bytes;
    gpuipc_tensor_t t = cuda_tensor(src, &shape);
    ASSERT_OK(gpuipc_mpi_channel_send(ch, &t, NULL, 0, NULL));
    /* Every chunk was copied out before the call returned. */
    memset(src, 0xa5, bytes);
    chunks += chunks_of(bytes);
  }
  return chunks;
}

/* @n messages in (direction @dir), checked; returns the copies made into
 * the destinations: one per chunk, unless MPI wrote there itself. */
static uint64_t recv_all(gpuipc_mpi_channel_t *ch, int dir, int n,
                         uint8_t *dst)
{
  uint64_t chunks = 0;
  for (int k = 0; k < n; k++) {
    uint64_t bytes = msg_bytes(k);
    memset(dst, 0x5a, bytes);
    /* Work on the destination queued before the receive (a lagging copy
     * of junk): the received bytes must land after it. */
    ASSERT_OK(gpuipc__memcpy_async(dst, junk, bytes, 0, NULL));
    int64_t shape = (int64_t)bytes;
    gpuipc_tensor_t t = cuda_tensor(dst, &shape);
    ASSERT_OK(gpuipc_mpi_channel_recv_into(ch, &t, NULL, -1));
    ASSERT_OK(gpuipc__stream_sync(0, NULL));
    for (uint64_t i = 0; i < bytes; i++)
      if (dst[i] != pattern(dir, k, i))
        TFAIL("direction %d, message %d of %llu bytes: byte %llu (chunk "
              "%llu) is 0x%02x, expected 0x%02x", dir, k,
              (unsigned long long)bytes, (unsigned long long)i,
              (unsigned long long)(i / CHUNK), dst[i], pattern(dir, k, i));
    chunks += chunks_of(bytes);
  }
  return (uint64_t)n + (aware ? 0 : chunks); /* the junk, the chunks */
}

#define NBUF 3

/* @n messages out (direction @dir) from LEGACY buffers, each filled by a
 * lagging copy; returns the copies made: the fills, and one per chunk
 * staged. */
static uint64_t send_buffers(gpuipc_mpi_channel_t *ch, int dir, int n)
{
  gpuipc_buf_t *buf[NBUF];
  uint8_t *host[NBUF];
  uint64_t ticket[NBUF] = {0};
  for (int b = 0; b < NBUF; b++) {
    ASSERT_OK(gpuipc_buf_alloc(MAXBYTES, GPUIPC_KIND_LEGACY, 0, 0, &buf[b]));
    host[b] = malloc(MAXBYTES);
    ASSERT_TRUE(host[b] != NULL);
  }
  uint64_t copies = 0;
  for (int k = 0; k < n; k++) {
    int b = k % NBUF;
    if (ticket[b] != 0)
      ASSERT_OK(gpuipc_mpi_channel_send_done(ch, ticket[b], -1));
    uint64_t bytes = msg_bytes(k);
    for (uint64_t i = 0; i < bytes; i++)
      host[b][i] = pattern(dir, k, i);
    /* host[b] stays as it is until the copy is known done (send_done). */
    ASSERT_OK(gpuipc__memcpy_async(gpuipc_buf_ptr(buf[b]), host[b], bytes, 0,
                                  NULL));
    int64_t shape = (int64_t)bytes;
    gpuipc_tensor_t t = cuda_tensor(gpuipc_buf_ptr(buf[b]), &shape);
    t.buf = buf[b];
    ASSERT_OK(gpuipc_mpi_channel_send(ch, &t, NULL, 0, &ticket[b]));
    copies += 1 + (aware ? 0 : chunks_of(bytes));
  }
  for (int b = 0; b < NBUF; b++) {
    if (ticket[b] != 0)
      ASSERT_OK(gpuipc_mpi_channel_send_done(ch, ticket[b], -1));
    ASSERT_OK(gpuipc_buf_release(buf[b]));
    free(host[b]);
  }
  return copies;
}

/* @n views in (direction @dir), checked and released; returns the copies
 * made into them. */
static uint64_t recv_views(gpuipc_mpi_channel_t *ch, int dir, int n)
{
  uint64_t copies = 0;
  for (int k = 0; k < n; k++) {
    uint64_t bytes = msg_bytes(k);
    gpuipc_tensor_t *v;
    ASSERT_OK(gpuipc_mpi_channel_recv(ch, &v, NULL, -1));
    ASSERT_EQ(v->dl.device.device_type, GPUIPC_DL_CUDA);
    ASSERT_TRUE(v->buf != NULL && gpuipc_buf_kind(v->buf) != GPUIPC_KIND_HOST);
    ASSERT_EQ_U((uint64_t)v->dl.shape[0], bytes);
    const uint8_t *at = (const uint8_t *)v->dl.data + v->dl.byte_offset;
    for (uint64_t i = 0; i < bytes; i++)
      if (at[i] != pattern(dir, k, i))
        TFAIL("direction %d, view %d of %llu bytes: byte %llu is 0x%02x, "
              "expected 0x%02x", dir, k, (unsigned long long)bytes,
              (unsigned long long)i, at[i], pattern(dir, k, i));
    ASSERT_OK(gpuipc_mpi_tensor_release(v, NULL));
    copies += aware ? 0 : chunks_of(bytes);
  }
  return copies;
}

static int fake_count(const char *name)
{
  const char *lib = getenv("GPUIPC_CUDA_LIB");
  ASSERT_TRUE(lib != NULL);
  void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
  if (h == NULL)
    TFAIL("the fake driver %s is not loaded", lib);
  int (*fn)(void) = (int (*)(void))dlsym(h, name);
  if (fn == NULL)
    TFAIL("the fake driver has no %s", name);
  int v = fn();
  dlclose(h);
  return v;
}

int main(int argc, char **argv)
{
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ASSERT_EQ(size % 2, 0);
  /* The fake driver has two devices: every rank sees them or none does. */
  ASSERT_OK(gpuipc_driver_status(NULL));
  ASSERT_TRUE(gpuipc_device_count() > 0);
  const char *mode = argc > 1 ? argv[1] : "staged";
  memset(junk, 0x77, sizeof(junk));
  aware = strcmp(mode, "aware") == 0;

  gpuipc_mpi_channel_t *ch;
  if (strcmp(mode, "bad-setting") == 0) {
    ASSERT_RC(gpuipc_mpi_channel_open(MPI_COMM_WORLD, rank ^ 1, 9, NULL, &ch),
              -EINVAL);
    if (strstr(gpuipc_mpi_last_error(), "GPUIPC_MPI_CUDA_AWARE") == NULL)
      TFAIL("the refusal does not name the setting: %s",
            gpuipc_mpi_last_error());
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
      printf("mpi_channel_staged: GPUIPC_MPI_CUDA_AWARE=%s refused\n",
             getenv("GPUIPC_MPI_CUDA_AWARE"));
    MPI_Finalize();
    return 0;
  }
  /* Views on the fake's device 1: it claims no VMM, so they are LEGACY
   * buffers, which the fake can make. */
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.device = 1;
  o.device_set = 1;
  ASSERT_OK(gpuipc_mpi_channel_open(MPI_COMM_WORLD, rank ^ 1, 9, &o, &ch));
  ASSERT_TRUE(gpuipc_mpi_channel_shm(ch) == NULL);
  uint8_t *mem = malloc(MAXBYTES);
  ASSERT_TRUE(mem != NULL);
  uint64_t sent, taken;
  if (rank % 2 == 0) {
    sent = send_all(ch, 0, NMSG, mem);
    taken = recv_all(ch, 1, NMSG / 2, mem);
    sent += send_buffers(ch, 2, NMSG / 2);
  } else {
    taken = recv_all(ch, 0, NMSG, mem);
    sent = send_all(ch, 1, NMSG / 2, mem);
    taken += recv_views(ch, 2, NMSG / 2);
  }
  ASSERT_OK(gpuipc_mpi_channel_close(ch));
  free(mem);

  /* Exactly the copies expected, and (staged) they lagged. */
  ASSERT_EQ_U((uint64_t)fake_count("fake_cuda_copies_done"), sent + taken);
  if (!aware)
    ASSERT_TRUE(fake_count("fake_cuda_not_ready") > 0);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0)
    printf("mpi_channel_staged %s: %d + %d + %d messages a pair checked\n",
           mode, NMSG, NMSG / 2, NMSG / 2);
  MPI_Finalize();
  return 0;
}
