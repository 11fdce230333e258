/*
 * Tensor checks shared by the two kinds of channel: this one (src/channel)
 * and the MPI one (src/mpi/channel.c). The MPI library sees only the
 * public API of libgpuipc, so what both use is inline here; the rest of
 * the tensor utilities is in tensor.c.
 */
#ifndef GPUIPC_CHANNEL_TENSOR_H
#define GPUIPC_CHANNEL_TENSOR_H

#include "gpuipc.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/*
 * Whether message @seq, of @ndim dimensions @shape and dtype @dt, can be
 * received into @dst: the same dtype and shape (strides aside). NULL when
 * it can; else @why (of @cap bytes) says how they differ.
 */
static inline const char *gpuipc__tensor_mismatch(uint64_t seq, int ndim,
                                                  gpuipc_dl_dtype_t dt,
                                                  const int64_t *shape,
                                                  const gpuipc_dl_tensor_t *dst,
                                                  char *why, size_t cap)
{
  bool same = ndim == dst->ndim && dt.code == dst->dtype.code &&
              dt.bits == dst->dtype.bits && dt.lanes == dst->dtype.lanes;
  for (int i = 0; same && i < ndim; i++)
    same = shape[i] == dst->shape[i];
  if (same)
    return NULL;
  snprintf(why, cap, "message %llu (ndim %d, dtype %u/%u/%u) does not match "
           "the destination (ndim %d, dtype %u/%u/%u) in shape or dtype; it "
           "stays first in line", (unsigned long long)seq, ndim, dt.code,
           dt.bits, dt.lanes, dst->ndim, dst->dtype.code, dst->dtype.bits,
           dst->dtype.lanes);
  return why;
}

#endif
