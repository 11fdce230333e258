/*
 * Tensor utilities shared by the channel calls: a tensor's place in its
 * buffer, its size in bytes, its layout (gpuipc_tensor_layout, which the
 * MPI channel uses too). The dtype and layout rules themselves are in
 * desc.c.
 */
#include "channel/channel.h"
#include "mem/mem.h"
#include "wire/wire.h"

/*
 * The byte offset of @t's first element in its buffer @t->buf, whose
 * memory the data pointer must point into. -EINVAL naming @who.
 */
int gpuipc__tensor_buf_offset(const char *who, const gpuipc_tensor_t *t,
                              uint64_t *offset)
{
  const gpuipc_dl_tensor_t *dl = &t->dl;
  uintptr_t base = (uintptr_t)gpuipc_buf_ptr(t->buf);
  uintptr_t p = (uintptr_t)dl->data;
  uint64_t size = gpuipc_buf_size(t->buf);
  if (p < base || p - base > size)
    return gpuipc__err(-EINVAL, "%s: data pointer %p lies outside the "
                       "buffer [%p, +%llu)", who, dl->data, (void *)base,
                       (unsigned long long)size);
  if (__builtin_add_overflow((uint64_t)(p - base), dl->byte_offset, offset))
    return gpuipc__err(-EINVAL, "%s: byte offset %llu overflows", who,
                       (unsigned long long)dl->byte_offset);
  return 0;
}

uint64_t gpuipc_tensor_nbytes(const gpuipc_tensor_t *t)
{
  if (t == NULL || t->dl.ndim < 0 || t->dl.ndim > GPUIPC_TENSOR_MAX_DIMS ||
      (t->dl.ndim > 0 && t->dl.shape == NULL))
    return 0;
  uint64_t n = gpuipc__layout_count(t->dl.ndim, t->dl.shape), b;
  if (__builtin_mul_overflow(n, (uint64_t)gpuipc__dtype_size(t->dl.dtype), &b))
    return UINT64_MAX;
  return b;
}

int gpuipc_tensor_layout(const gpuipc_tensor_t *t, gpuipc_tensor_layout_t *out)
{
  static const char who[] = "gpuipc_tensor_layout";
  if (t == NULL || out == NULL)
    return gpuipc__err(-EINVAL, "%s: NULL %s", who,
                       t == NULL ? "tensor" : "out");
  if (out->size < sizeof(*out))
    return gpuipc__err(-EINVAL, "%s: out->size %zu < %zu", who, out->size,
                       sizeof(*out));
  const gpuipc_dl_tensor_t *dl = &t->dl;
  if (dl->ndim < 0 || dl->ndim > GPUIPC_TENSOR_MAX_DIMS)
    return gpuipc__err(-EINVAL, "%s: ndim %d is outside 0..%d", who,
                       dl->ndim, GPUIPC_TENSOR_MAX_DIMS);
  if (dl->data == NULL)
    return gpuipc__err(-EINVAL, "%s: data is NULL", who);
  uint64_t offset = dl->byte_offset, size = GPUIPC_SIZE_MAX_ABSURD;
  int rc;
  if (t->buf != NULL) {
    size = gpuipc_buf_size(t->buf);
    rc = gpuipc__tensor_buf_offset(who, t, &offset);
    if (rc != 0)
      return rc;
  }
  uint64_t span = 0;
  rc = gpuipc__layout_check(-EINVAL, who, dl->dtype, dl->ndim, dl->shape,
                                dl->strides, offset, size, &span);
  if (rc != 0)
    return rc;
  /* The lowest byte: the offset less what negative strides reach back. */
  uint64_t back = 0;
  if (span > 0 && dl->strides != NULL) {
    size_t esize = gpuipc__dtype_size(dl->dtype);
    for (int i = 0; i < dl->ndim; i++)
      if (dl->strides[i] < 0)
        back += (uint64_t)(dl->shape[i] - 1) * (uint64_t)-dl->strides[i] *
                esize;
  }
  out->first = offset - back;
  out->span = span;
  out->nbytes = gpuipc_tensor_nbytes(t);
  out->contiguous = gpuipc__layout_compact(dl->ndim, dl->shape, dl->strides);
  return 0;
}
