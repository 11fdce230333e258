/*
 * What the channel tests and their helper processes agree on: the layout
 * of message i (dtype, shape, strides) and the bytes it carries, so that
 * the receiving process can check every field and every byte on its own.
 */
#ifndef GPUIPC_TEST_CHAN_COMMON_H
#define GPUIPC_TEST_CHAN_COMMON_H

#include "test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Every message fits a slot of this size. */
#define CHAN_SLOT 1024
#define CHAN_SLOTS 64

struct chan_msg {
  gpuipc_dl_dtype_t dt;
  int ndim;
  int64_t shape[2];
  int64_t strides[2];
  size_t span; /* bytes from the first to one past the last element */
};

/*
 * The layout of message @i (1, 2, ...): bytes, a row-major int32 matrix,
 * or (unless @contig) a column-major uint16 matrix.
 */
static inline void chan_msg_spec(uint64_t i, int contig, struct chan_msg *m)
{
  memset(m, 0, sizeof(*m));
  int kind = (int)(i % 3);
  if (contig && kind == 2)
    kind = 1;
  if (kind == 0) {
    m->dt = (gpuipc_dl_dtype_t){GPUIPC_DL_UINT, 8, 1};
    m->ndim = 1;
    m->shape[0] = 1 + (int64_t)((i * 7919) % 1000);
    m->strides[0] = 1;
    m->span = (size_t)m->shape[0];
  } else if (kind == 1) {
    m->dt = (gpuipc_dl_dtype_t){GPUIPC_DL_INT, 32, 1};
    m->ndim = 2;
    m->shape[0] = 1 + (int64_t)(i % 5);
    m->shape[1] = 1 + (int64_t)(i % 7);
    m->strides[0] = m->shape[1];
    m->strides[1] = 1;
    m->span = (size_t)(m->shape[0] * m->shape[1] * 4);
  } else {
    m->dt = (gpuipc_dl_dtype_t){GPUIPC_DL_UINT, 16, 1};
    m->ndim = 2;
    m->shape[0] = 1 + (int64_t)(i % 4);
    m->shape[1] = 1 + (int64_t)(i % 6);
    m->strides[0] = 1;
    m->strides[1] = m->shape[0];
    m->span = (size_t)(m->shape[0] * m->shape[1] * 2);
  }
}

/* A tensor for message @i at @p (in @buf, or NULL), filled with its bytes. */
static inline void chan_msg_make(uint64_t i, int contig, void *p,
                                 gpuipc_buf_t *buf, struct chan_msg *m,
                                 gpuipc_tensor_t *t)
{
  chan_msg_spec(i, contig, m);
  test_fill(p, m->span, i);
  memset(t, 0, sizeof(*t));
  t->dl.data = p;
  t->dl.device.device_type = GPUIPC_DL_CPU;
  t->dl.ndim = m->ndim;
  t->dl.dtype = m->dt;
  t->dl.shape = m->shape;
  t->dl.strides = m->strides;
  t->buf = buf;
}

/*
 * Check a received view against message @i: dtype, shape, strides, device
 * type @dev_type and every byte (read on the host: GPU views only on the
 * fake CUDA driver, whose device memory is host memory). Returns NULL or a
 * description of the first difference.
 */
static inline const char *chan_msg_check_on(uint64_t i, int contig,
                                            const gpuipc_tensor_t *v,
                                            int dev_type)
{
  static __thread char why[160];
  struct chan_msg m;
  chan_msg_spec(i, contig, &m);
  if (v->dl.ndim != m.ndim || v->dl.dtype.code != m.dt.code ||
      v->dl.dtype.bits != m.dt.bits || v->dl.dtype.lanes != m.dt.lanes) {
    snprintf(why, sizeof(why), "message %llu: ndim %d dtype %u/%u/%u",
             (unsigned long long)i, v->dl.ndim, v->dl.dtype.code,
             v->dl.dtype.bits, v->dl.dtype.lanes);
    return why;
  }
  for (int d = 0; d < m.ndim; d++)
    if (v->dl.shape[d] != m.shape[d] || v->dl.strides == NULL ||
        v->dl.strides[d] != m.strides[d]) {
      snprintf(why, sizeof(why), "message %llu: dim %d shape %lld stride %lld",
               (unsigned long long)i, d, (long long)v->dl.shape[d],
               v->dl.strides ? (long long)v->dl.strides[d] : -1ll);
      return why;
    }
  if (v->dl.device.device_type != dev_type) {
    snprintf(why, sizeof(why), "message %llu: device type %d",
             (unsigned long long)i, v->dl.device.device_type);
    return why;
  }
  const uint8_t *p = (const uint8_t *)v->dl.data + v->dl.byte_offset;
  size_t bad = test_check(p, m.span, i);
  if (bad != (size_t)-1) {
    snprintf(why, sizeof(why), "message %llu: byte %zu of %zu differs",
             (unsigned long long)i, bad, m.span);
    return why;
  }
  return NULL;
}

/* chan_msg_check_on for a host view. */
static inline const char *chan_msg_check(uint64_t i, int contig,
                                         const gpuipc_tensor_t *v)
{
  return chan_msg_check_on(i, contig, v, GPUIPC_DL_CPU);
}

static inline long chan_arg(const char *s)
{
  return strtol(s, NULL, 0);
}

#endif
