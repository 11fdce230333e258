/*
 * Umpire's DeviceIpcAllocator example on gpuipc: in each scope (all ranks of
 * a machine, or those of one GPU) the scope's rank 0 allocates 1024 floats
 * and fills them with its rank; every rank then reads the second value.
 * No MPI_Barrier before reading: the filler creates the segment, fills it
 * and publishes it (gpuipc_segment_publish, ordered after its copy); the
 * readers open it with GPUIPC_WAIT, which returns only once it is
 * published, so nobody can see it half-written.
 * Every rank releases the segment as soon as it has read it, the filler
 * too: LEGACY and POOL memory lives in the filler's process, which keeps
 * it for the others until the segment is unlinked and released by all.
 * That memory still goes with the filler's process, so for those two kinds
 * one barrier comes at the end: the filler leaves once everyone has read.
 *
 *   mpirun -np 4 umpire_mpi [node|device] [auto|host|vmm|legacy|pool]
 *
 * With GPUs each rank uses GPU (local rank % GPUs), made current the way an
 * application would (cudaSetDevice; here the driver's primary context,
 * loaded at run time): the DEVICE scope goes by the current GPU. Copies to
 * and from GPU memory go through gpuipc_memcpy.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "gpuipc_mpi.h"

#define COUNT 1024

/* The driver calls that make a GPU current. */
static struct {
  int (*init)(unsigned);
  int (*device_get)(int *, int);
  int (*primary_retain)(void **, int);
  int (*set_current)(void *);
} cu;

static int cuda_load(void)
{
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h)
    return -1;
#define SYM(field, name) *(void **)&cu.field = dlsym(h, name)
  SYM(init, "cuInit");
  SYM(device_get, "cuDeviceGet");
  SYM(primary_retain, "cuDevicePrimaryCtxRetain");
  SYM(set_current, "cuCtxSetCurrent");
#undef SYM
  if (!cu.init || !cu.device_get || !cu.primary_retain || !cu.set_current ||
      cu.init(0) != 0)
    return -1;
  return 0;
}

/* Make @ordinal's primary context current on this thread. */
static int cuda_use(int ordinal)
{
  int dev;
  void *ctx;
  if (cu.device_get(&dev, ordinal) || cu.primary_retain(&ctx, dev) ||
      cu.set_current(ctx))
    return -1;
  return 0;
}

/*
 * Copy between host memory and @buf, wherever @buf lives (for an imported
 * GPU buffer, on the local GPU it was opened for). Returns 0 or a gpuipc
 * code.
 */
static int copy_in(gpuipc_buf_t *buf, const void *src, size_t n)
{
  int dev = gpuipc_buf_kind(buf) == GPUIPC_KIND_HOST ? -1
                                                     : gpuipc_buf_device(buf);
  return gpuipc_memcpy(gpuipc_buf_ptr(buf), src, n, dev, NULL);
}

static int copy_out(void *dst, gpuipc_buf_t *buf, size_t off, size_t n)
{
  int dev = gpuipc_buf_kind(buf) == GPUIPC_KIND_HOST ? -1
                                                     : gpuipc_buf_device(buf);
  return gpuipc_memcpy(dst, (char *)gpuipc_buf_ptr(buf) + off, n, dev, NULL);
}

static int parse_kind(const char *s, gpuipc_kind_t *out)
{
  /* The kinds are 0, 1, 2, ... (GPUIPC_KIND_MAP); past the last, "?". */
  for (int k = GPUIPC_KIND_AUTO;
       strcmp(gpuipc_kind_name((gpuipc_kind_t)k), "?") != 0; k++)
    if (strcmp(s, gpuipc_kind_name((gpuipc_kind_t)k)) == 0) {
      *out = (gpuipc_kind_t)k;
      return 0;
    }
  return -1;
}

#define CHECK(call)                                                            \
  do {                                                                         \
    int rc_ = (call);                                                          \
    if (rc_ != 0) {                                                            \
      fprintf(stderr, "rank %d: %s: %s (%s)\n", rank, #call,                   \
              gpuipc_strerror(rc_), gpuipc_mpi_last_error());                  \
      MPI_Abort(MPI_COMM_WORLD, 1);                                            \
    }                                                                          \
  } while (0)

int main(int argc, char **argv)
{
  MPI_Init(&argc, &argv);
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);

  gpuipc_mpi_scope_t scope = GPUIPC_MPI_SCOPE_NODE;
  if (argc > 1 && strcmp(argv[1], "device") == 0)
    scope = GPUIPC_MPI_SCOPE_DEVICE;
  gpuipc_kind_t kind = GPUIPC_KIND_AUTO;
  if (argc > 2 && parse_kind(argv[2], &kind) != 0) {
    fprintf(stderr, "unknown kind %s\n", argv[2]);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }

  /* With GPUs, this rank's GPU is current before choosing the scope. */
  int device = -1;
  int ngpus = gpuipc_driver_status(NULL) == 0 ? gpuipc_device_count() : 0;
  if (ngpus > 0 && kind != GPUIPC_KIND_HOST) {
    MPI_Comm local;
    int local_rank;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank,
                        MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &local_rank);
    MPI_Comm_free(&local);
    device = local_rank % ngpus;
    if (cuda_load() || cuda_use(device)) {
      fprintf(stderr, "rank %d: cannot use GPU %d\n", rank, device);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  } else if (kind == GPUIPC_KIND_AUTO) {
    kind = GPUIPC_KIND_HOST;
  }

  gpuipc_domain_t *dom;
  CHECK(gpuipc_mpi_domain_join(MPI_COMM_WORLD, scope, &dom));
  MPI_Comm scope_comm;
  CHECK(gpuipc_mpi_scope_comm(MPI_COMM_WORLD, scope, &scope_comm));
  int scope_rank;
  MPI_Comm_rank(scope_comm, &scope_rank);

  const size_t size = COUNT * sizeof(float);
  gpuipc_segment_opts_t opts = GPUIPC_SEGMENT_OPTS_INIT;
  opts.bytes = size;
  opts.kind = kind;
  opts.device = device;
  opts.timeout_ms = GPUIPC_TIMEOUT_FOREVER; /* the filler may be slow */
  gpuipc_buf_t *data;
  if (scope_rank == 0) {
    /* Only the scope's rank 0 allocates; it fills, then publishes. */
    opts.flags = GPUIPC_CREATE | GPUIPC_EXCL;
    CHECK(gpuipc_segment_open(dom, "device_ipc_allocator", &opts, &data));
    float host[COUNT];
    for (int i = 0; i < COUNT; i++)
      host[i] = (float)rank;
    CHECK(copy_in(data, host, size)); /* synchronous: done on return */
    CHECK(gpuipc_segment_publish(data, NULL));
  } else {
    /* Everyone else imports once rank 0 has filled and published it. */
    opts.flags = GPUIPC_WAIT;
    CHECK(gpuipc_segment_open(dom, "device_ipc_allocator", &opts, &data));
  }
  printf("Rank %d: got %s memory at %p\n", rank,
         gpuipc_kind_name(gpuipc_buf_kind(data)), gpuipc_buf_ptr(data));

  float value;
  CHECK(copy_out(&value, data, sizeof(float), sizeof(float)));
  printf("Rank %d: second value is %g\n", rank, (double)value);

  /* Done with it: the filler's memory stays for those still reading. */
  gpuipc_kind_t got = gpuipc_buf_kind(data);
  gpuipc_buf_release(data);
  /*
   * HOST and VMM memory outlives its creator (the broker holds its fd), so
   * nobody waits for anybody: the segments go with the domain when its last
   * member leaves. LEGACY and POOL memory goes with the filler's process:
   * it unlinks and leaves only once every rank of its scope has read. This
   * barrier is about that lifetime alone, not about the fill -> read
   * order, which the publication gives.
   */
  if (got == GPUIPC_KIND_LEGACY || got == GPUIPC_KIND_POOL) {
    MPI_Barrier(scope_comm);
    if (scope_rank == 0) {
      CHECK(gpuipc_segment_unlink(dom, "device_ipc_allocator"));
    }
  }
  gpuipc_domain_leave(dom);
  MPI_Comm_free(&scope_comm);
  MPI_Finalize();
  return 0;
}
