/*
 * _gpuipc_torch.c - gpuipc._gpuipc reads PyTorch tensors: what a plain
 * strided torch tensor's DLPack description would say, read from its
 * attributes in C (no capsule, no Python frame), for the channel's send
 * (_gpuipc_channel.c) and describe() (gpuipc/_tensor.py). PyTorch is
 * never imported here: it is found in sys.modules once the program has
 * imported it. See _gpuipc.h.
 */
#include "_gpuipc.h"

#include <string.h>

/* torch.Tensor, torch.strided and {torch dtype: its row of torch_dtypes},
 * set once torch is in sys.modules; the attribute names, interned. */
static PyObject *tensor_type, *strided, *dtypes;
static PyObject *s_dtype, *s_layout, *s_is_neg, *s_is_conj, *s_is_cuda,
    *s_is_cpu, *s_get_device, *s_data_ptr, *s_shape, *s_stride;

static const struct {
  const char *name;
  int code, bits;
} torch_dtypes[] = {
    {"float16", GPUIPC_DL_FLOAT, 16},    {"float32", GPUIPC_DL_FLOAT, 32},
    {"float64", GPUIPC_DL_FLOAT, 64},    {"bfloat16", GPUIPC_DL_BFLOAT, 16},
    {"int8", GPUIPC_DL_INT, 8},          {"int16", GPUIPC_DL_INT, 16},
    {"int32", GPUIPC_DL_INT, 32},        {"int64", GPUIPC_DL_INT, 64},
    {"uint8", GPUIPC_DL_UINT, 8},        {"complex64", GPUIPC_DL_COMPLEX, 64},
    {"complex128", GPUIPC_DL_COMPLEX, 128},
    {"bool", GPUIPC_DL_BOOL, 8},
};

static int intern(PyObject **s, const char *name)
{
  if (*s == NULL)
    *s = PyUnicode_InternFromString(name);
  return *s != NULL ? 0 : -1;
}

/* The attribute names, interned once. */
static int names(void)
{
  return intern(&s_dtype, "dtype") < 0 || intern(&s_layout, "layout") < 0 ||
                 intern(&s_is_neg, "is_neg") < 0 ||
                 intern(&s_is_conj, "is_conj") < 0 ||
                 intern(&s_is_cuda, "is_cuda") < 0 ||
                 intern(&s_is_cpu, "is_cpu") < 0 ||
                 intern(&s_get_device, "get_device") < 0 ||
                 intern(&s_data_ptr, "data_ptr") < 0 ||
                 intern(&s_shape, "shape") < 0 ||
                 intern(&s_stride, "stride") < 0
             ? -1
             : 0;
}

/* Learn torch's tensor type and dtypes from module @torch. */
static int learn(PyObject *torch)
{
  if (names() < 0)
    return -1;
  PyObject *type = PyObject_GetAttrString(torch, "Tensor");
  PyObject *lay = PyObject_GetAttrString(torch, "strided");
  PyObject *table = PyDict_New();
  if (type == NULL || lay == NULL || table == NULL)
    goto fail;
  for (size_t i = 0; i < sizeof(torch_dtypes) / sizeof(torch_dtypes[0]);
       i++) {
    PyObject *dt = PyObject_GetAttrString(torch, torch_dtypes[i].name);
    if (dt == NULL) { /* an older PyTorch without it */
      PyErr_Clear();
      continue;
    }
    PyObject *row = PyLong_FromSize_t(i);
    int rc = row == NULL ? -1 : PyDict_SetItem(table, dt, row);
    Py_DECREF(dt);
    Py_XDECREF(row);
    if (rc < 0)
      goto fail;
  }
  if (tensor_type != NULL) { /* another thread learnt them meanwhile */
    Py_DECREF(type);
    Py_DECREF(lay);
    Py_DECREF(table);
    return 0;
  }
  tensor_type = type;
  strided = lay;
  dtypes = table;
  return 0;
fail:
  Py_XDECREF(type);
  Py_XDECREF(lay);
  Py_XDECREF(table);
  return -1;
}

/* 1 when @o is a torch.Tensor, 0 when not (or torch was never imported),
 * -1 with an exception. */
static int is_torch(PyObject *o)
{
  if (tensor_type == NULL) {
    PyObject *torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");
    if (torch == NULL)
      return 0;
    if (learn(torch) < 0)
      return -1;
  }
  return PyObject_IsInstance(o, tensor_type);
}

/* Attribute @name of @t, or the result of calling method @name with no
 * arguments (a new reference; NULL with an exception). */
static PyObject *fetch(PyObject *t, PyObject *name, int method)
{
  return method ? PyObject_CallMethodObjArgs(t, name, NULL)
                : PyObject_GetAttr(t, name);
}

/* 1 when fetch() of @name is true, 0 when false, -1 with an exception. */
static int truth(PyObject *t, PyObject *name, int method)
{
  PyObject *v = fetch(t, name, method);
  if (v == NULL)
    return -1;
  int r = PyObject_IsTrue(v);
  Py_DECREF(v);
  return r;
}

/* The ints fetch() of @name gives (@what: a shape or strides) into @out:
 * how many, or -1 with an exception. */
static int read_ints(PyObject *t, PyObject *name, int method, int64_t *out,
                     const char *what)
{
  PyObject *v = fetch(t, name, method);
  if (v == NULL)
    return -1;
  int n = gpuipc__py_read_int64s(v, out, GPUIPC_TENSOR_MAX_DIMS, what);
  Py_DECREF(v);
  return n;
}

int gpuipc__py_torch_read(PyObject *t, gpuipc__py_desc_t *d)
{
  int r = is_torch(t);
  if (r <= 0)
    return r;
  memset(d, 0, sizeof(*d));
  PyObject *dt = PyObject_GetAttr(t, s_dtype);
  if (dt == NULL)
    return -1;
  PyObject *row = PyDict_GetItemWithError(dtypes, dt); /* borrowed */
  Py_DECREF(dt);
  if (row == NULL)
    return PyErr_Occurred() ? -1 : 0; /* a dtype DLPack describes its way */
  size_t i = PyLong_AsSize_t(row); /* learn() put it there: in range */
  int code = torch_dtypes[i].code;
  d->t.dl.dtype.code = (uint8_t)code;
  d->t.dl.dtype.bits = (uint8_t)torch_dtypes[i].bits;
  d->t.dl.dtype.lanes = 1;
  PyObject *lay = PyObject_GetAttr(t, s_layout);
  if (lay == NULL)
    return -1;
  Py_DECREF(lay); /* torch.strided lives as long as torch */
  if (lay != strided)
    return 0; /* sparse and other layouts */
  /* Negative and conjugate views are lazy: their bytes are not the values. */
  if ((r = truth(t, s_is_neg, 1)) != 0 ||
      (code == GPUIPC_DL_COMPLEX && (r = truth(t, s_is_conj, 1)) != 0))
    return r < 0 ? -1 : 0;
  if ((r = truth(t, s_is_cuda, 0)) < 0)
    return -1;
  if (r) {
    PyObject *dev = fetch(t, s_get_device, 1);
    if (dev == NULL)
      return -1;
    d->t.dl.device.device_type = GPUIPC_DL_CUDA;
    d->t.dl.device.device_id = (int32_t)PyLong_AsLong(dev);
    Py_DECREF(dev);
    if (PyErr_Occurred())
      return -1;
  } else {
    if ((r = truth(t, s_is_cpu, 0)) <= 0)
      return r; /* meta, MPS, ...: not memory gpuipc reaches */
    d->t.dl.device.device_type = GPUIPC_DL_CPU;
  }
  PyObject *p = fetch(t, s_data_ptr, 1);
  if (p == NULL)
    return -1;
  d->t.dl.data = PyLong_AsVoidPtr(p);
  Py_DECREF(p);
  if (PyErr_Occurred())
    return -1;
  int nd = read_ints(t, s_shape, 0, d->shape, "shape");
  int ns = nd < 0 ? -1 : read_ints(t, s_stride, 1, d->strides, "strides");
  if (ns < 0)
    return -1;
  if (ns != nd) {
    PyErr_SetString(PyExc_ValueError, "strides and shape differ in length");
    return -1;
  }
  d->t.dl.ndim = nd;
  d->t.dl.shape = d->shape;
  d->t.dl.strides = d->strides;
  return 1;
}

/* torch_desc(tensor) -> description tuple, or None when @tensor is not a
 * plain strided torch tensor in CPU or CUDA memory (DLPack describes it
 * then). */
static PyObject *py_torch_desc(PyObject *self, PyObject *t)
{
  gpuipc__py_desc_t d;
  int r = gpuipc__py_torch_read(t, &d);
  if (r < 0)
    return NULL;
  if (r == 0)
    Py_RETURN_NONE;
  return gpuipc__py_dl_desc(&d.t.dl);
}

PyMethodDef gpuipc__py_torch_methods[] = {
    GPUIPC__PY_FN(torch_desc, METH_O), GPUIPC__PY_END};
