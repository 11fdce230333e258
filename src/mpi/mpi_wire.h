/*
 * The records of the MPI path of channels (src/mpi/p2p*.c), shared with
 * the test that speaks them by hand (tests/mpi/mpi_channel_proto.c).
 *
 * On the pair's communicator (ranks 0 and 1), three tags:
 *   TAG_DESC  descriptors (struct wire, MSG_TENSOR) and, last, MSG_CLOSE
 *   TAG_DATA  the bytes of each tensor, in chunks of 2^chunk_shift bytes
 *             (the last one shorter; the sender picks the size for each
 *             message), in the order of the descriptors (MPI does not
 *             overtake)
 *   TAG_REL   the receiver's releases (MSG_REL with the message's seq)
 *             and, last, MSG_CLOSE
 */
#ifndef GPUIPC_MPI_WIRE_H
#define GPUIPC_MPI_WIRE_H

#include <stdint.h>

#include "gpuipc.h"

enum { TAG_DESC = 1, TAG_DATA = 2, TAG_REL = 3 };
enum { MSG_TENSOR = 1, MSG_CLOSE = 2, MSG_REL = 3 };
#define WIRE_MAGIC 0x4d435047u /* "GPCM" */

/* Descriptor, release and close records (native layout: one machine
 * type on both ends). */
struct wire {
  uint32_t magic;
  uint32_t type;
  uint64_t seq;
  uint64_t nbytes; /* bytes on TAG_DATA: lowest to highest element */
  uint64_t offset; /* element 0 in those bytes */
  int32_t dev_type;
  int32_t ndim;
  gpuipc_dl_dtype_t dtype;
  uint32_t chunk_shift; /* TAG_DATA chunks of 2^chunk_shift bytes */
  int64_t shape[GPUIPC_TENSOR_MAX_DIMS];
  int64_t strides[GPUIPC_TENSOR_MAX_DIMS];
};

#endif /* GPUIPC_MPI_WIRE_H */
