/*
 * DLPack conversions. gpuipc's DLPack-layout structs mirror dlpack.h's
 * (checked below, field by field, for the LP64 ABI), so a received view
 * is handed over by filling the managed struct kept inside the view and
 * giving it a deleter that releases the view.
 */
#include "channel/channel.h"
#include "cuda/cuda.h"

#include <stddef.h>
#include <string.h>

/* The DLPack ABI on LP64 (dlpack.h v0.8 and v1.x). */
_Static_assert(sizeof(gpuipc_dl_device_t) == 8, "DLDevice");
_Static_assert(sizeof(gpuipc_dl_dtype_t) == 4, "DLDataType");
_Static_assert(offsetof(gpuipc_dl_tensor_t, data) == 0, "DLTensor.data");
_Static_assert(offsetof(gpuipc_dl_tensor_t, device) == 8, "DLTensor.device");
_Static_assert(offsetof(gpuipc_dl_tensor_t, ndim) == 16, "DLTensor.ndim");
_Static_assert(offsetof(gpuipc_dl_tensor_t, dtype) == 20, "DLTensor.dtype");
_Static_assert(offsetof(gpuipc_dl_tensor_t, shape) == 24, "DLTensor.shape");
_Static_assert(offsetof(gpuipc_dl_tensor_t, strides) == 32,
               "DLTensor.strides");
_Static_assert(offsetof(gpuipc_dl_tensor_t, byte_offset) == 40,
               "DLTensor.byte_offset");
_Static_assert(sizeof(gpuipc_dl_tensor_t) == 48, "DLTensor");
_Static_assert(offsetof(gpuipc_dl_managed_tensor_t, manager_ctx) == 48,
               "DLManagedTensor.manager_ctx");
_Static_assert(offsetof(gpuipc_dl_managed_tensor_t, deleter) == 56,
               "DLManagedTensor.deleter");
_Static_assert(sizeof(gpuipc_dl_managed_tensor_t) == 64, "DLManagedTensor");
_Static_assert(offsetof(gpuipc_dl_managed_tensor_versioned_t, manager_ctx) ==
                   8,
               "DLManagedTensorVersioned.manager_ctx");
_Static_assert(offsetof(gpuipc_dl_managed_tensor_versioned_t, flags) == 24,
               "DLManagedTensorVersioned.flags");
_Static_assert(offsetof(gpuipc_dl_managed_tensor_versioned_t, dl_tensor) ==
                   32,
               "DLManagedTensorVersioned.dl_tensor");
_Static_assert(sizeof(gpuipc_dl_managed_tensor_versioned_t) == 80,
               "DLManagedTensorVersioned");

void (*gpuipc__test_hook_dlpack_release)(const gpuipc_tensor_t *view,
                                         void *stream);

/* Release @t on the consumer's stream it was handed over with. */
static void release_handed(gpuipc_tensor_t *t)
{
  void *stream = gpuipc__view_of(t)->dl_stream;
  if (gpuipc__test_hook_dlpack_release != NULL)
    gpuipc__test_hook_dlpack_release(t, stream);
  gpuipc_tensor_release(t, stream);
}

static void managed_deleter(gpuipc_dl_managed_tensor_t *self)
{
  if (self != NULL)
    release_handed((gpuipc_tensor_t *)self->manager_ctx);
}

static void versioned_deleter(gpuipc_dl_managed_tensor_versioned_t *self)
{
  if (self != NULL)
    release_handed((gpuipc_tensor_t *)self->manager_ctx);
}

/*
 * The checks and the hand-over itself: the data made ready on @stream
 * (ordered after the stream it was received on), @stream kept for the
 * deleter. On failure the view stays the caller's, unchanged.
 */
static struct gpuipc__view *hand_over(gpuipc_tensor_t *view, void *stream,
                                      const void *out, const char *who,
                                      int *rc)
{
  struct gpuipc__view *v = gpuipc__view_of(view);
  if (v == NULL || out == NULL) {
    *rc = gpuipc__err(-EINVAL, "%s: %s", who,
                      out == NULL ? "NULL out" : "not a received view");
    return NULL;
  }
  if (v->device >= 0) {
    *rc = gpuipc__stream_order(v->device, stream, v->recv_stream);
    if (*rc != 0)
      return NULL;
  }
  v->dl_stream = stream;
  *rc = 0;
  return v;
}

int gpuipc_tensor_to_dlpack_stream(gpuipc_tensor_t *view, void *stream,
                                   gpuipc_dl_managed_tensor_t **out)
{
  int rc;
  struct gpuipc__view *v =
      hand_over(view, stream, out, "gpuipc_tensor_to_dlpack", &rc);
  if (v == NULL)
    return rc;
  v->managed.dl_tensor = v->t.dl;
  v->managed.manager_ctx = &v->t;
  v->managed.deleter = managed_deleter;
  *out = &v->managed;
  return 0;
}

int gpuipc_tensor_to_dlpack_versioned_stream(
    gpuipc_tensor_t *view, void *stream,
    gpuipc_dl_managed_tensor_versioned_t **out)
{
  int rc;
  struct gpuipc__view *v =
      hand_over(view, stream, out, "gpuipc_tensor_to_dlpack_versioned", &rc);
  if (v == NULL)
    return rc;
  v->versioned.version.major = 1;
  v->versioned.version.minor = 0;
  v->versioned.manager_ctx = &v->t;
  v->versioned.deleter = versioned_deleter;
  v->versioned.flags = 0;
  v->versioned.dl_tensor = v->t.dl;
  *out = &v->versioned;
  return 0;
}

int gpuipc_tensor_to_dlpack(gpuipc_tensor_t *view,
                            gpuipc_dl_managed_tensor_t **out)
{
  return gpuipc_tensor_to_dlpack_stream(view, NULL, out);
}

int gpuipc_tensor_to_dlpack_versioned(
    gpuipc_tensor_t *view, gpuipc_dl_managed_tensor_versioned_t **out)
{
  return gpuipc_tensor_to_dlpack_versioned_stream(view, NULL, out);
}

int gpuipc_tensor_from_dlpack(const gpuipc_dl_tensor_t *dl, gpuipc_buf_t *buf,
                              gpuipc_tensor_t *out)
{
  if (dl == NULL || out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_tensor_from_dlpack: NULL %s",
                       dl == NULL ? "tensor" : "out");
  if (dl->ndim < 0 || dl->ndim > GPUIPC_TENSOR_MAX_DIMS)
    return gpuipc__err(-EINVAL, "gpuipc_tensor_from_dlpack: ndim %d is "
                       "outside 0..%d", dl->ndim, GPUIPC_TENSOR_MAX_DIMS);
  out->dl = *dl;
  out->buf = buf;
  return 0;
}
