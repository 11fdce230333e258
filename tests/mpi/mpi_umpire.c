/*
 * Umpire's DeviceIpcAllocator flow on gpuipc_mpi_domain_join, run under
 * mpirun: in each scope (argv[1]: "node" or "device") the scope's first
 * rank creates a HOST segment, fills it with values naming itself and
 * publishes it; every other rank opens it with GPUIPC_WAIT (no barrier:
 * the open returns once it is published) and checks every value. The ranks work out on
 * their own which ranks should share a scope (same GPUIPC_NODE_ID, same
 * GPU) and check the domains against it: one name per scope, never shared
 * with another, its broker in the scope's first rank, every rank a member.
 * Also: bad arguments and a bad GPUIPC_NODE_ID on one rank fail on all.
 */
#include "gpuipc_mpi.h"
#include "test.h"

#include <mpi.h>
#include <unistd.h>

#define NVALUES 1024
#define KEYLEN 32

/* Which scope this rank belongs to, worked out without gpuipc_mpi. */
static void scope_key(gpuipc_mpi_scope_t scope, char key[KEYLEN])
{
  const char *id = getenv("GPUIPC_NODE_ID");
  memset(key, 0, KEYLEN);
  snprintf(key, KEYLEN, "%s", id && *id ? id : "0");
  if (scope != GPUIPC_MPI_SCOPE_DEVICE)
    return;
  /* No context is current here: the rank's GPU is device 0. */
  gpuipc_device_info_t info = {.size = sizeof(info)};
  if (gpuipc_driver_status(NULL) == 0 && gpuipc_device_info(0, &info) == 0)
    snprintf(key, KEYLEN, "%s/%.8s", id && *id ? id : "0", info.uuid_str + 4);
}

static void check_errors(void)
{
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  gpuipc_domain_t *dom = NULL;
  ASSERT_RC(gpuipc_mpi_domain_join(MPI_COMM_WORLD, (gpuipc_mpi_scope_t)7,
                                   &dom), -EINVAL);
  ASSERT_TRUE(strstr(gpuipc_mpi_last_error(), "scope 7") != NULL);
  ASSERT_RC(gpuipc_mpi_domain_join(MPI_COMM_NULL, GPUIPC_MPI_SCOPE_NODE,
                                   &dom), -EINVAL);
  /* NULL @out on one rank only: every rank fails, none hangs. */
  ASSERT_RC(gpuipc_mpi_domain_join(MPI_COMM_WORLD, GPUIPC_MPI_SCOPE_NODE,
                                   rank == 1 ? NULL : &dom), -EINVAL);
  if (rank != 1)
    ASSERT_TRUE(strstr(gpuipc_mpi_last_error(), "rank 1") != NULL);
  ASSERT_TRUE(dom == NULL);
}

/*
 * Started with GPUIPC_NODE_ID="two" on rank 2 alone (settings are read once,
 * so the bad value is there from the start): every rank fails, none hangs,
 * and each says whose setting was wrong.
 */
static int check_bad_node_id(void)
{
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm c = MPI_COMM_NULL;
  ASSERT_RC(gpuipc_mpi_scope_comm(MPI_COMM_WORLD, GPUIPC_MPI_SCOPE_NODE, &c),
            -EINVAL);
  ASSERT_TRUE(c == MPI_COMM_NULL);
  if (rank == 2)
    ASSERT_TRUE(strstr(gpuipc_mpi_last_error(), "GPUIPC_NODE_ID") != NULL);
  else
    ASSERT_TRUE(strstr(gpuipc_mpi_last_error(), "rank 2") != NULL);
  MPI_Finalize();
  return 0;
}

int main(int argc, char **argv)
{
  MPI_Init(&argc, &argv);
  if (argc == 2 && strcmp(argv[1], "bad-node-id") == 0)
    return check_bad_node_id();
  if (argc != 2 || (strcmp(argv[1], "node") && strcmp(argv[1], "device")))
    TFAIL("usage: %s node|device", argv[0]);
  gpuipc_mpi_scope_t scope = strcmp(argv[1], "node") == 0
                                 ? GPUIPC_MPI_SCOPE_NODE
                                 : GPUIPC_MPI_SCOPE_DEVICE;
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ASSERT_GE(size, 4);
  check_errors();

  /* The scope each rank should be in, and its expected first rank. */
  char key[KEYLEN];
  scope_key(scope, key);
  char *keys = calloc((size_t)size, KEYLEN);
  ASSERT_TRUE(keys != NULL);
  MPI_Allgather(key, KEYLEN, MPI_CHAR, keys, KEYLEN, MPI_CHAR,
                MPI_COMM_WORLD);
  int leader = -1, members = 0;
  for (int i = 0; i < size; i++)
    if (memcmp(keys + (size_t)i * KEYLEN, key, KEYLEN) == 0) {
      if (leader < 0)
        leader = i;
      members++;
    }

  MPI_Comm sc;
  ASSERT_OK(gpuipc_mpi_scope_comm(MPI_COMM_WORLD, scope, &sc));
  int srank, ssize;
  MPI_Comm_rank(sc, &srank);
  MPI_Comm_size(sc, &ssize);
  ASSERT_EQ(ssize, members);
  ASSERT_EQ(srank == 0, rank == leader);

  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_mpi_domain_join(MPI_COMM_WORLD, scope, &dom));
  gpuipc_domain_info_t di = {.size = sizeof(di)};
  ASSERT_OK(gpuipc_domain_info(dom, &di));
  ASSERT_EQ(strncmp(di.name, "mpi-", 4), 0);
  ASSERT_EQ(strlen(di.name), 4 + 22);
  ASSERT_EQ(di.hosts_broker, rank == leader);

  /* Same name as the scope, and no other scope's. */
  char *names = calloc((size_t)size, sizeof(di.name));
  int *brokers = calloc((size_t)size, sizeof(int));
  ASSERT_TRUE(names && brokers);
  MPI_Allgather(di.name, sizeof(di.name), MPI_CHAR, names, sizeof(di.name),
                MPI_CHAR, MPI_COMM_WORLD);
  MPI_Allgather(&di.broker_pid, 1, MPI_INT, brokers, 1, MPI_INT,
                MPI_COMM_WORLD);
  for (int i = 0; i < size; i++) {
    int same = memcmp(keys + (size_t)i * KEYLEN, key, KEYLEN) == 0;
    int same_name = strcmp(names + (size_t)i * sizeof(di.name), di.name) == 0;
    if (same != same_name)
      TFAIL("rank %d (key %s, domain %s) and rank %d (key %s, domain %s)",
            rank, key, di.name, i, keys + (size_t)i * KEYLEN,
            names + (size_t)i * sizeof(di.name));
    if (same)
      ASSERT_EQ(brokers[i], brokers[rank]);
  }
  if (rank == leader)
    ASSERT_EQ(di.broker_pid, (int)getpid());

  /* Umpire's flow: the scope's first rank allocates and fills. */
  gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
  o.bytes = NVALUES * sizeof(float);
  o.kind = GPUIPC_KIND_HOST;
  o.timeout_ms = GPUIPC_TIMEOUT_FOREVER;
  gpuipc_buf_t *data;
  float *v;
  if (srank == 0) {
    o.flags = GPUIPC_CREATE | GPUIPC_EXCL;
    ASSERT_OK(gpuipc_segment_open(dom, "data", &o, &data));
    v = gpuipc_buf_ptr(data);
    for (int i = 0; i < NVALUES; i++)
      v[i] = (float)(rank * 10000 + i);
    ASSERT_OK(gpuipc_segment_publish(data, NULL));
  } else {
    o.flags = GPUIPC_WAIT;
    ASSERT_OK(gpuipc_segment_open(dom, "data", &o, &data));
    v = gpuipc_buf_ptr(data);
  }
  ASSERT_EQ(gpuipc_buf_kind(data), GPUIPC_KIND_HOST);
  for (int i = 0; i < NVALUES; i++)
    if (v[i] != (float)(leader * 10000 + i))
      TFAIL("rank %d: value %d is %g, expected %d", rank, i, (double)v[i],
            leader * 10000 + i);
  printf("rank %d (scope rank %d of %d, %s): second value is %g\n", rank,
         srank, ssize, di.name, (double)v[1]);

  /* Each domain holds its own segment, held by all its ranks. */
  MPI_Barrier(MPI_COMM_WORLD);
  gpuipc_segment_info_t seg[4];
  for (int i = 0; i < 4; i++)
    seg[i].size = sizeof(seg[i]);
  ASSERT_EQ(gpuipc_segment_list(dom, seg, 4), 1);
  ASSERT_STREQ(seg[0].name, "data");
  ASSERT_EQ(seg[0].state, GPUIPC_SEG_PUBLISHED);
  ASSERT_EQ(seg[0].nholders, members);

  MPI_Barrier(MPI_COMM_WORLD);
  ASSERT_OK(gpuipc_buf_release(data));
  ASSERT_OK(gpuipc_domain_leave(dom));
  MPI_Comm_free(&sc);
  free(names);
  free(brokers);
  free(keys);
  MPI_Finalize();
  return 0;
}
