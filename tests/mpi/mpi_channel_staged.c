/*
 * The MPI path's staged GPU messages, on a CPU: gpuipc loads the fake CUDA
 * driver (GPUIPC_CUDA_LIB), whose "device memory" is host memory and whose
 * copies lag (FAKE_CUDA_COPY_LAG_US: a copy is done only when an event
 * recorded after it is queried that long after, or on a synchronisation).
 * Ranks 2k and 2k+1, on two "machines" (node_id.sh), send each other
 * tensors of device type CUDA with no gpuipc buffer (buf NULL: memory
 * gpuipc did not allocate, so the sender stages it through pinned host
 * memory, chunk by chunk) and take them with gpuipc_mpi_recv_into into
 * CUDA-typed destinations with buf NULL (so the receiver lands each chunk
 * in its ring of staging chunks and copies it out on the stream). With
 * GPUIPC_MPI_CHUNK_KB=4 the messages are of one byte, one chunk less a
 * byte, exactly one chunk, one more byte, exactly the ring (16 chunks),
 * the ring and one chunk, and up to 1025 chunks, then many of sizes drawn
 * in turn. Every byte and the order are checked; the source of each send
 * is overwritten as soon as gpuipc_mpi_send returns (it must have been
 * copied out by then); and the fake must have made exactly one copy per
 * chunk and answered "not ready" at least once, so the copies did lag.
 * gpuipc_mpi_recv (views) is left out: its buffers on the device are
 * gpuipc allocations, which the fake driver cannot make.
 */
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

static gpuipc_tensor_t cuda_tensor(void *p, int64_t *shape)
{
  gpuipc_tensor_t t = {.dl = {.data = p,
                              .device = {GPUIPC_DL_CUDA, 0},
                              .ndim = 1,
                              .dtype = {GPUIPC_DL_UINT, 8, 1},
                              .shape = shape}};
  return t; /* buf NULL: not gpuipc's memory */
}

/* @n messages out (direction @dir); returns the chunks sent. */
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
    ASSERT_OK(gpuipc_mpi_send(ch, &t, NULL, 0, NULL));
    /* Every chunk was copied out before the call returned. */
    memset(src, 0xa5, bytes);
    chunks += chunks_of(bytes);
  }
  return chunks;
}

/* @n messages in (direction @dir), checked; returns the chunks taken. */
static uint64_t recv_all(gpuipc_mpi_channel_t *ch, int dir, int n,
                         uint8_t *dst)
{
  uint64_t chunks = 0;
  for (int k = 0; k < n; k++) {
    uint64_t bytes = msg_bytes(k);
    memset(dst, 0x5a, bytes);
    int64_t shape = (int64_t)bytes;
    gpuipc_tensor_t t = cuda_tensor(dst, &shape);
    ASSERT_OK(gpuipc_mpi_recv_into(ch, &t, NULL, -1));
    for (uint64_t i = 0; i < bytes; i++)
      if (dst[i] != pattern(dir, k, i))
        TFAIL("direction %d, message %d of %llu bytes: byte %llu (chunk "
              "%llu) is 0x%02x, expected 0x%02x", dir, k,
              (unsigned long long)bytes, (unsigned long long)i,
              (unsigned long long)(i / CHUNK), dst[i], pattern(dir, k, i));
    chunks += chunks_of(bytes);
  }
  return chunks;
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

static bool mpi_cuda_aware(void)
{
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
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

  gpuipc_mpi_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open_mpi(MPI_COMM_WORLD, rank ^ 1, 9, NULL, &ch));
  ASSERT_TRUE(gpuipc_mpi_channel_shm(ch) == NULL);
  uint8_t *mem = malloc(MAXBYTES);
  ASSERT_TRUE(mem != NULL);
  uint64_t sent, taken;
  if (rank % 2 == 0) {
    sent = send_all(ch, 0, NMSG, mem);
    taken = recv_all(ch, 1, NMSG / 2, mem);
  } else {
    taken = recv_all(ch, 0, NMSG, mem);
    sent = send_all(ch, 1, NMSG / 2, mem);
  }
  ASSERT_OK(gpuipc_mpi_channel_close(ch));
  free(mem);

  /* One copy per chunk out of the staged sends, and one per chunk into
   * the destinations unless MPI wrote there itself; and they lagged. */
  bool aware = mpi_cuda_aware();
  uint64_t want = sent + (aware ? 0 : taken);
  ASSERT_EQ_U((uint64_t)fake_count("fake_cuda_copies_done"), want);
  ASSERT_TRUE(fake_count("fake_cuda_not_ready") > 0);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0)
    printf("mpi_channel_staged: %d + %d messages a pair checked%s\n", NMSG,
           NMSG / 2, aware ? " (CUDA-aware MPI: no receive ring)" : "");
  MPI_Finalize();
  return 0;
}
