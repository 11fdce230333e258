/*
 * A 1-D uint8 tensor of @bytes at @data in @buf (or at @data without a
 * buffer), on GPU @dev or, with @dev < 0, the host: the tensor both
 * benchmarks of channels send (bench/channel_bench.cu and `gpuipc bench`,
 * tools/cmd_bench.c). C and C++ (nvcc) alike.
 */
#ifndef GPUIPC_BENCH_TENS_H
#define GPUIPC_BENCH_TENS_H

#include <gpuipc.h>

#include <stdint.h>
#include <string.h>

struct tens {
  int64_t shape[1];
  gpuipc_tensor_t t;
};

static inline void tens_init(struct tens *x, gpuipc_buf_t *buf, void *data,
                             int dev, size_t bytes)
{
  memset(x, 0, sizeof(*x));
  x->shape[0] = (int64_t)bytes;
  x->t.buf = buf;
  x->t.dl.data = data;
  x->t.dl.device.device_type = dev >= 0 ? GPUIPC_DL_CUDA : GPUIPC_DL_CPU;
  x->t.dl.device.device_id = dev >= 0 ? dev : 0;
  x->t.dl.ndim = 1;
  x->t.dl.dtype.code = GPUIPC_DL_UINT;
  x->t.dl.dtype.bits = 8;
  x->t.dl.dtype.lanes = 1;
  x->t.dl.shape = x->shape;
}

#endif
