/*
 * The MPI path's wire format seen from outside: ranks 2k and 2k+1 (on two
 * "machines" through node_id.sh) share channels, but the odd rank plays
 * the other end by hand: it makes the same communicator and agreements as
 * gpuipc_mpi_channel_open and then writes records itself. The even rank, a
 * real channel end, must take a well-formed message cut into chunks of the
 * size its descriptor names (bytes checked, release sent back) and must
 * refuse with GPUIPC_E_PROTO, and a sentence naming the fault, every lie: a
 * record of the wrong size, a bad magic or type, a sequence number out of
 * turn, an unknown device type, too many dimensions, elements reaching past
 * the bytes sent, a chunk size out of range (0, as the field was before it
 * existed; 2^31; more than 2^20 chunks), and a release of a message never
 * sent. One channel per case (a refusal breaks it for good).
 */
#include "gpuipc_mpi.h"
#include "test.h"
#include "mpi/mpi_wire.h"

#include <limits.h>
#include <mpi.h>
#include <stdbool.h>

#define GOOD_BYTES 10000 /* in chunks of 4096, 4096, 1808 */

/* One agreement of gpuipc's (MPI_MINLOC of {rank, code}): this end's 0. */
static void agree_ok(MPI_Comm pair)
{
  struct {
    int who;
    int code;
  } in = {INT_MAX, 0}, out;
  ASSERT_EQ(MPI_Allreduce(&in, &out, 1, MPI_2INT, MPI_MINLOC, pair),
            MPI_SUCCESS);
  ASSERT_EQ(out.who, INT_MAX);
}

/* The fake end of gpuipc_mpi_channel_open(world, peer, tag): the same
 * collectives, in the same order, on a "machine" of its own. */
static MPI_Comm fake_open(int me, int peer, int tag)
{
  MPI_Group all, two;
  int ranks[2] = {me < peer ? me : peer, me < peer ? peer : me};
  MPI_Comm_group(MPI_COMM_WORLD, &all);
  MPI_Group_incl(all, 2, ranks, &two);
  MPI_Comm pair, shared, node;
  ASSERT_EQ(MPI_Comm_create_group(MPI_COMM_WORLD, two, tag, &pair),
            MPI_SUCCESS);
  MPI_Group_free(&all);
  MPI_Group_free(&two);
  agree_ok(pair); /* arguments */
  agree_ok(pair); /* GPUIPC_NODE_ID */
  int prank;
  MPI_Comm_rank(pair, &prank);
  MPI_Comm_split_type(pair, MPI_COMM_TYPE_SHARED, prank, MPI_INFO_NULL,
                      &shared);
  MPI_Comm_split(shared, 1000 + me, prank, &node); /* alone */
  MPI_Comm_free(&shared);
  MPI_Comm_free(&node);
  agree_ok(pair); /* the node scope */
  agree_ok(pair); /* its size */
  agree_ok(pair); /* the MPI path's receives */
  return pair;
}

static void fake_close(MPI_Comm pair)
{
  int other = 0;
  MPI_Comm_rank(pair, &other);
  other ^= 1;
  struct wire w;
  const int tags[2] = {TAG_DESC, TAG_REL};
  for (int i = 0; i < 2; i++) {
    /* The real end says it closes to both sides of ours. */
    int tag = tags[i];
    memset(&w, 0, sizeof(w));
    ASSERT_EQ(MPI_Recv(&w, (int)sizeof(w), MPI_BYTE, other, tag, pair,
                       MPI_STATUS_IGNORE), MPI_SUCCESS);
    ASSERT_EQ(w.magic, WIRE_MAGIC);
    ASSERT_EQ(w.type, MSG_CLOSE);
  }
  MPI_Comm_free(&pair);
}

static struct wire descriptor(uint64_t nbytes, uint32_t shift)
{
  struct wire w;
  memset(&w, 0, sizeof(w));
  w.magic = WIRE_MAGIC;
  w.type = MSG_TENSOR;
  w.seq = 1;
  w.nbytes = nbytes;
  w.dev_type = GPUIPC_DL_CPU;
  w.ndim = 1;
  w.dtype = (gpuipc_dl_dtype_t){GPUIPC_DL_UINT, 8, 1};
  w.chunk_shift = shift;
  w.shape[0] = (int64_t)nbytes;
  w.strides[0] = 1;
  return w;
}

/* The lies, each on a channel of its own (tags 21, 22, ...). */
enum { LIE_SIZE, LIE_MAGIC, LIE_TYPE, LIE_SEQ, LIE_DEV, LIE_NDIM, LIE_SPAN,
       LIE_SHIFT_ZERO, LIE_SHIFT_BIG, LIE_CHUNKS_MANY, LIE_RELEASE, NLIES };
static const char *const lie_words[NLIES] = {
    "bytes", "magic", "type", "seq", "device type", "ndim", "reach",
    "chunk_shift", "chunk_shift", "chunk_shift", "not in flight"};

/* Odd rank: a good message in three chunks, then the lies. */
static void fake_end(int me, int peer)
{
  MPI_Comm pair = fake_open(me, peer, 20);
  int other = 0;
  MPI_Comm_rank(pair, &other);
  other ^= 1;
  struct wire w = descriptor(GOOD_BYTES, 12);
  uint8_t *bytes = malloc(GOOD_BYTES);
  ASSERT_TRUE(bytes != NULL);
  for (size_t i = 0; i < GOOD_BYTES; i++)
    bytes[i] = test_pattern(77, i);
  ASSERT_EQ(MPI_Send(&w, (int)sizeof(w), MPI_BYTE, other, TAG_DESC, pair),
            MPI_SUCCESS);
  for (size_t off = 0; off < GOOD_BYTES; off += 4096) {
    int len = GOOD_BYTES - off < 4096 ? (int)(GOOD_BYTES - off) : 4096;
    ASSERT_EQ(MPI_Send(bytes + off, len, MPI_BYTE, other, TAG_DATA, pair),
              MPI_SUCCESS);
  }
  struct wire rel;
  ASSERT_EQ(MPI_Recv(&rel, (int)sizeof(rel), MPI_BYTE, other, TAG_REL, pair,
                     MPI_STATUS_IGNORE), MPI_SUCCESS);
  ASSERT_EQ(rel.magic, WIRE_MAGIC);
  ASSERT_EQ(rel.type, MSG_REL);
  ASSERT_EQ_U(rel.seq, 1);
  fake_close(pair);
  free(bytes);

  for (int k = 0; k < NLIES; k++) {
    pair = fake_open(me, peer, 21 + k);
    w = descriptor(64, 12); /* one chunk of 4 KiB at most */
    int len = (int)sizeof(w), tag = TAG_DESC;
    switch (k) {
    case LIE_SIZE: len = 10; break;
    case LIE_MAGIC: w.magic ^= 1; break;
    case LIE_TYPE: w.type = MSG_REL; break;
    case LIE_SEQ: w.seq = 2; break;
    case LIE_DEV: w.dev_type = 99; break;
    case LIE_NDIM: w.ndim = GPUIPC_TENSOR_MAX_DIMS + 1; break;
    case LIE_SPAN: w.shape[0] = 65; break; /* 65 elements in 64 bytes */
    case LIE_SHIFT_ZERO: w.chunk_shift = 0; break;
    case LIE_SHIFT_BIG: w.chunk_shift = 31; break;
    case LIE_CHUNKS_MANY: w = descriptor((uint64_t)1 << 33, 12); break;
    case LIE_RELEASE: /* to the real end's sending side */
      w.type = MSG_REL;
      w.seq = 5;
      tag = TAG_REL;
      break;
    }
    ASSERT_EQ(MPI_Send(&w, len, MPI_BYTE, other, tag, pair), MPI_SUCCESS);
    fake_close(pair);
  }
}

static void real_end(int peer)
{
  gpuipc_mpi_channel_t *ch;
  ASSERT_OK(gpuipc_mpi_channel_open(MPI_COMM_WORLD, peer, 20, NULL, &ch));
  ASSERT_TRUE(gpuipc_mpi_channel_shm(ch) == NULL);
  gpuipc_tensor_t *v;
  ASSERT_OK(gpuipc_mpi_channel_recv(ch, &v, NULL, -1));
  ASSERT_EQ(v->dl.shape[0], GOOD_BYTES);
  const uint8_t *p = (const uint8_t *)v->dl.data + v->dl.byte_offset;
  for (size_t i = 0; i < GOOD_BYTES; i++)
    if (p[i] != test_pattern(77, i))
      TFAIL("byte %zu: %u, expected %u", i, p[i], test_pattern(77, i));
  ASSERT_OK(gpuipc_mpi_tensor_release(v, NULL));
  ASSERT_OK(gpuipc_mpi_channel_close(ch));

  for (int k = 0; k < NLIES; k++) {
    ASSERT_OK(gpuipc_mpi_channel_open(MPI_COMM_WORLD, peer, 21 + k, NULL,
                                      &ch));
    if (k == LIE_RELEASE) {
      int rc;
      while ((rc = gpuipc_mpi_channel_progress(ch)) == 0)
        ;
      ASSERT_RC(rc, GPUIPC_E_PROTO);
    } else {
      ASSERT_RC(gpuipc_mpi_channel_recv(ch, &v, NULL, -1), GPUIPC_E_PROTO);
    }
    if (strstr(gpuipc_mpi_last_error(), lie_words[k]) == NULL)
      TFAIL("lie %d: \"%s\" does not mention \"%s\"", k,
            gpuipc_mpi_last_error(), lie_words[k]);
    /* Broken for good. */
    if (k == LIE_RELEASE)
      ASSERT_RC(gpuipc_mpi_channel_progress(ch), GPUIPC_E_PROTO);
    else
      ASSERT_RC(gpuipc_mpi_channel_recv(ch, &v, NULL, 0), GPUIPC_E_PROTO);
    ASSERT_OK(gpuipc_mpi_channel_close(ch));
  }
}

int main(int argc, char **argv)
{
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ASSERT_EQ(size % 2, 0);
  if (rank % 2)
    fake_end(rank, rank ^ 1);
  else
    real_end(rank ^ 1);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0)
    printf("mpi_channel_proto: ok\n");
  MPI_Finalize();
  return 0;
}
