/*
 * DLPack conversions. gpuipc's DLPack-layout structs mirror dlpack.h's
 * (checked below, field by field, for the LP64 ABI), so a received view
 * is handed over by filling the managed struct kept inside the view and
 * giving it a deleter that releases the view.
 */
#include "channel/channel.h"

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

static void managed_deleter(gpuipc_dl_managed_tensor_t *self)
{
  if (self != NULL)
    gpuipc_tensor_release((gpuipc_tensor_t *)self->manager_ctx, NULL);
}

static void versioned_deleter(gpuipc_dl_managed_tensor_versioned_t *self)
{
  if (self != NULL)
    gpuipc_tensor_release((gpuipc_tensor_t *)self->manager_ctx, NULL);
}

int gpuipc_tensor_to_dlpack(gpuipc_tensor_t *view,
                            gpuipc_dl_managed_tensor_t **out)
{
  struct gpuipc__view *v = gpuipc__view_of(view);
  if (v == NULL || out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_tensor_to_dlpack: %s",
                       out == NULL ? "NULL out" : "not a received view");
  v->managed.dl_tensor = v->t.dl;
  v->managed.manager_ctx = &v->t;
  v->managed.deleter = managed_deleter;
  *out = &v->managed;
  return 0;
}

int gpuipc_tensor_to_dlpack_versioned(
    gpuipc_tensor_t *view, gpuipc_dl_managed_tensor_versioned_t **out)
{
  struct gpuipc__view *v = gpuipc__view_of(view);
  if (v == NULL || out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_tensor_to_dlpack_versioned: %s",
                       out == NULL ? "NULL out" : "not a received view");
  v->versioned.version.major = 1;
  v->versioned.version.minor = 0;
  v->versioned.manager_ctx = &v->t;
  v->versioned.deleter = versioned_deleter;
  v->versioned.flags = 0;
  v->versioned.dl_tensor = v->t.dl;
  *out = &v->versioned;
  return 0;
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
