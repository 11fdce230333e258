/*
 * _gpuipc_tensor.c - gpuipc._gpuipc's tensors: the description tuple in
 * which a tensor crosses between Python and C (parsed here for the
 * channel's calls, _gpuipc_channel.c), DLPack capsules taken from a
 * producer and made for a consumer, and the views a channel receives
 * ("gpuipc.view" boxes, _gpuipc.c). The Python side is gpuipc/_tensor.py.
 * See _gpuipc.h.
 */
#include "_gpuipc.h"

#include <stdlib.h>
#include <string.h>

/* ---- tensor descriptions ----------------------------------------------- */

/*
 * A tensor crosses into C as a tuple
 *   (data, device_type, device_id, (code, bits, lanes), shape, strides|None,
 *    byte_offset)
 * with shape and strides (in elements) as tuples of ints.
 */
int gpuipc__py_read_int64s(PyObject *seq, int64_t *out, int cap,
                           const char *what)
{
  Py_ssize_t n = PyObject_Length(seq);
  if (n < 0)
    return -1;
  if (n > cap) {
    PyErr_Format(PyExc_ValueError, "%s has %zd dimensions; at most %d", what,
                 n, cap);
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *o = PySequence_GetItem(seq, i);
    if (o == NULL)
      return -1;
    out[i] = PyLong_AsLongLong(o);
    Py_DECREF(o);
    if (out[i] == -1 && PyErr_Occurred())
      return -1;
  }
  return (int)n;
}

/* Description tuple @tup as DLTensor @dl, whose shape and strides go to
 * @shape and @strides (@cap dimensions at most); 0 or -1 with an
 * exception. */
static int parse_dl(PyObject *tup, gpuipc_dl_tensor_t *dl, int64_t *shape,
                    int64_t *strides, int cap)
{
  PyObject *data, *shape_obj, *strides_obj;
  int dtype_code, bits, lanes;
  unsigned long long off;
  if (!PyArg_ParseTuple(tup, "Oii(iii)OOK;tensor description", &data,
                        &dl->device.device_type, &dl->device.device_id,
                        &dtype_code, &bits, &lanes, &shape_obj, &strides_obj,
                        &off))
    return -1;
  dl->data = PyLong_AsVoidPtr(data);
  if (PyErr_Occurred())
    return -1;
  dl->dtype.code = (uint8_t)dtype_code;
  dl->dtype.bits = (uint8_t)bits;
  dl->dtype.lanes = (uint16_t)lanes;
  int nd = gpuipc__py_read_int64s(shape_obj, shape, cap, "shape");
  if (nd < 0)
    return -1;
  dl->ndim = nd;
  dl->shape = shape;
  if (strides_obj != Py_None) {
    int ns = gpuipc__py_read_int64s(strides_obj, strides, cap, "strides");
    if (ns < 0)
      return -1;
    if (ns != nd) {
      PyErr_SetString(PyExc_ValueError, "strides and shape differ in length");
      return -1;
    }
    dl->strides = strides;
  }
  dl->byte_offset = off;
  return 0;
}

int gpuipc__py_parse_desc(PyObject *tup, gpuipc__py_desc_t *d)
{
  memset(d, 0, sizeof(*d));
  return parse_dl(tup, &d->t.dl, d->shape, d->strides,
                  GPUIPC_TENSOR_MAX_DIMS);
}

int gpuipc__py_desc(PyObject *o, void *out)
{
  return gpuipc__py_parse_desc(o, out) == 0;
}

static PyObject *int64s(const int64_t *v, int n)
{
  PyObject *t = PyTuple_New(n);
  for (int i = 0; t != NULL && i < n; i++) {
    PyObject *x = PyLong_FromLongLong(v[i]);
    if (x == NULL || PyTuple_SetItem(t, i, x) < 0) {
      Py_DECREF(t);
      return NULL;
    }
  }
  return t;
}

/* The description tuple of DLTensor @dl (strides None when absent). */
PyObject *gpuipc__py_dl_desc(const gpuipc_dl_tensor_t *dl)
{
  PyObject *shape = int64s(dl->shape, dl->ndim);
  PyObject *strides = dl->strides != NULL ? int64s(dl->strides, dl->ndim)
                                          : (Py_INCREF(Py_None), Py_None);
  if (shape == NULL || strides == NULL) {
    Py_XDECREF(shape);
    Py_XDECREF(strides);
    return NULL;
  }
  return Py_BuildValue("(Nii(iii)NNK)", PyLong_FromVoidPtr(dl->data),
                       dl->device.device_type, dl->device.device_id,
                       dl->dtype.code, dl->dtype.bits, dl->dtype.lanes, shape,
                       strides, (unsigned long long)dl->byte_offset);
}

/* ---- DLPack capsules in ------------------------------------------------ */

typedef struct dl_hold {
  void *managed;
  int versioned;
} dl_hold_t;

static void dl_hold_destroy(PyObject *cap)
{
  dl_hold_t *h = PyCapsule_GetPointer(cap, "gpuipc.dlhold");
  if (h == NULL) {
    PyErr_Clear();
    return;
  }
  if (h->versioned) {
    gpuipc_dl_managed_tensor_versioned_t *m = h->managed;
    if (m->deleter != NULL)
      m->deleter(m);
  } else {
    gpuipc_dl_managed_tensor_t *m = h->managed;
    if (m->deleter != NULL)
      m->deleter(m);
  }
  free(h);
}

PyObject *gpuipc__py_dl_take(PyObject *cap, const gpuipc_dl_tensor_t **out)
{
  int versioned = PyCapsule_IsValid(cap, "dltensor_versioned");
  if (!versioned && !PyCapsule_IsValid(cap, "dltensor")) {
    PyErr_SetString(PyExc_ValueError,
                    "not an unconsumed DLPack capsule (\"dltensor\")");
    return NULL;
  }
  void *m = PyCapsule_GetPointer(cap, versioned ? "dltensor_versioned"
                                                : "dltensor");
  const gpuipc_dl_tensor_t *dl =
      versioned ? &((gpuipc_dl_managed_tensor_versioned_t *)m)->dl_tensor
                : &((gpuipc_dl_managed_tensor_t *)m)->dl_tensor;
  if (versioned &&
      ((gpuipc_dl_managed_tensor_versioned_t *)m)->version.major != 1) {
    PyErr_SetString(PyExc_BufferError, "DLPack major version is not 1");
    return NULL;
  }
  dl_hold_t *h = malloc(sizeof(*h));
  if (h == NULL)
    return PyErr_NoMemory();
  h->managed = m;
  h->versioned = versioned;
  PyObject *hold = PyCapsule_New(h, "gpuipc.dlhold", dl_hold_destroy);
  if (hold == NULL) {
    free(h);
    return NULL;
  }
  PyCapsule_SetName(cap, versioned ? "used_dltensor_versioned"
                                   : "used_dltensor");
  *out = dl;
  return hold;
}

/*
 * dlpack_take(capsule) -> (description, holder): consume a producer's
 * DLPack capsule (renamed "used_dltensor" as the protocol asks); the
 * producer's deleter runs when the holder goes.
 */
static PyObject *py_dlpack_take(PyObject *self, PyObject *cap)
{
  const gpuipc_dl_tensor_t *dl;
  PyObject *hold = gpuipc__py_dl_take(cap, &dl);
  if (hold == NULL)
    return NULL;
  PyObject *desc = gpuipc__py_dl_desc(dl);
  if (desc == NULL) {
    Py_DECREF(hold);
    return NULL;
  }
  return Py_BuildValue("(NN)", desc, hold);
}

/* ---- DLPack capsules out ----------------------------------------------- */

static void dlpack_capsule_destroy(PyObject *cap)
{
  if (!PyCapsule_IsValid(cap, "dltensor"))
    return; /* consumed: the consumer calls the deleter */
  gpuipc_dl_managed_tensor_t *m = PyCapsule_GetPointer(cap, "dltensor");
  if (m != NULL && m->deleter != NULL)
    m->deleter(m);
}

/* A "dltensor" capsule handing @m to a consumer; @m's deleter runs now
 * when the capsule cannot be made. */
static PyObject *dlpack_capsule(gpuipc_dl_managed_tensor_t *m)
{
  PyObject *cap = PyCapsule_New(m, "dltensor", dlpack_capsule_destroy);
  if (cap == NULL)
    m->deleter(m);
  return cap;
}

/* A DLManagedTensor over memory a Python object @owner keeps alive. */
typedef struct owned_dl {
  gpuipc_dl_managed_tensor_t m;
  int64_t shape[32];
  int64_t strides[32];
  PyObject *owner;
} owned_dl_t;

static void owned_dl_delete(gpuipc_dl_managed_tensor_t *m)
{
  owned_dl_t *o = (owned_dl_t *)m;
  PyGILState_STATE st = PyGILState_Ensure();
  Py_XDECREF(o->owner);
  PyGILState_Release(st);
  free(o);
}

/* dlpack_of(owner, description) -> "dltensor" capsule keeping @owner. */
static PyObject *py_dlpack_of(PyObject *self, PyObject *args)
{
  PyObject *owner, *tup;
  if (!PyArg_ParseTuple(args, "OO", &owner, &tup))
    return NULL;
  owned_dl_t *o = calloc(1, sizeof(*o));
  if (o == NULL)
    return PyErr_NoMemory();
  if (parse_dl(tup, &o->m.dl_tensor, o->shape, o->strides, 32) < 0) {
    free(o);
    return NULL;
  }
  o->m.manager_ctx = o;
  o->m.deleter = owned_dl_delete;
  Py_INCREF(owner);
  o->owner = owner;
  return dlpack_capsule(&o->m);
}

/* ---- received views ---------------------------------------------------- */

PyObject *gpuipc__py_view_info(const gpuipc_tensor_t *v)
{
  PyObject *desc = gpuipc__py_dl_desc(&v->dl);
  if (desc == NULL)
    return NULL;
  return Py_BuildValue("(NNnii)", desc, PyLong_FromVoidPtr(gpuipc_buf_ptr(v->buf)),
                       (Py_ssize_t)gpuipc_buf_size(v->buf),
                       (int)gpuipc_buf_kind(v->buf), gpuipc_buf_device(v->buf));
}

/*
 * view_to_dlpack(view, stream) -> "dltensor" capsule handing the view over.
 * The view stays in its box until a consumer takes the capsule (renames
 * it): one that refuses it (an unknown dtype, an error) leaves the view
 * usable, and releasing the box first revokes the capsule (see
 * gpuipc__py_box_lend).
 */
static PyObject *py_view_to_dlpack(PyObject *self, PyObject *args)
{
  PyObject *vcap;
  gpuipc_tensor_t *v;
  void *stream;
  if (!PyArg_ParseTuple(args, "OO&", &vcap, gpuipc__py_stream, &stream) ||
      (v = gpuipc__py_unbox(vcap, gpuipc__py_VIEW)) == NULL)
    return NULL;
  gpuipc_dl_managed_tensor_t *m = NULL;
  int rc = gpuipc_tensor_to_dlpack_stream(v, stream, &m);
  if (rc < 0)
    return gpuipc__py_raise(rc);
  /* Some consumers (PyTorch before 2.x, older CuPy) ignore byte_offset:
   * hand over the element's own address instead. The deleter finds the
   * view through manager_ctx, not data. */
  m->dl_tensor.data = (char *)m->dl_tensor.data + m->dl_tensor.byte_offset;
  m->dl_tensor.byte_offset = 0;
  /* No destructor: a capsule no consumer took leaves the view to its box. */
  PyObject *cap = PyCapsule_New(m, "dltensor", NULL);
  if (cap == NULL)
    return NULL;
  if (gpuipc__py_box_lend(vcap, cap) < 0) {
    Py_DECREF(cap);
    return NULL;
  }
  return cap;
}

PyMethodDef gpuipc__py_tensor_methods[] = {
    GPUIPC__PY_FN(dlpack_take, METH_O),
    GPUIPC__PY_FN(dlpack_of, METH_VARARGS),
    GPUIPC__PY_FN(view_to_dlpack, METH_VARARGS),
    GPUIPC__PY_END};
