/*
 * _gpuipc_send.c - Channel.send in one call into the extension:
 * channel_send_any reads the array in C (a plain torch tensor's attributes,
 * _gpuipc_torch.c; numpy's array interface; else DLPack), resolves the
 * stream (PyTorch's current one for a CUDA tensor sent with none), finds
 * the gpuipc buffer its bytes lie in by address (gpuipc_buf_find: sent
 * without a copy; elsewhere: staged), sends, and keeps what a GPU send
 * still reads in the channel's dict until its ticket is done. What it does
 * not read (a bfloat16 or masked array, the CUDA array interface alone,
 * the buffer protocol) it leaves to describe() (gpuipc/_tensor.py) and
 * the Python path, which raise the same errors they always did. See
 * _gpuipc.h.
 */
#include "_gpuipc.h"

#include <errno.h>
#include <string.h>

/* An array read: its description, and what keeps its memory alive (a
 * reference of our own). */
typedef struct read {
  gpuipc__py_desc_t d;
  PyObject *keep;
} read_t;

/* ---- streams ------------------------------------------------------------ */

/* torch._C._cuda_getCurrentRawStream, once PyTorch's CUDA is initialised
 * (it stays so) and has it: a stream is then one call away. */
static PyObject *raw_stream_fn;

/* PyTorch's current stream on @device as an integer (0: none, or torch not
 * in use with CUDA), as _common._torch_stream says; -1 with an exception. */
static int torch_stream(int device, void **out)
{
  *out = NULL;
  PyObject *s = NULL;
  if (raw_stream_fn != NULL) {
    PyObject *dev = PyLong_FromLong(device);
    s = dev != NULL ? PyObject_CallFunctionObjArgs(raw_stream_fn, dev, NULL) : NULL;
    Py_XDECREF(dev);
    if (s == NULL)
      return -1;
    *out = PyLong_AsVoidPtr(s);
    Py_DECREF(s);
    return PyErr_Occurred() ? -1 : 0;
  }
  PyObject *mods = PySys_GetObject("modules"); /* borrowed */
  PyObject *torch = mods != NULL ? PyDict_GetItemString(mods, "torch") : NULL;
  if (torch == NULL || torch == Py_None)
    return 0;
  PyObject *cuda = PyObject_GetAttrString(torch, "cuda");
  PyObject *init = cuda != NULL ? PyObject_CallMethod(cuda, "is_initialized",
                                                      NULL)
                                : NULL;
  int on = init != NULL ? PyObject_IsTrue(init) : -1;
  Py_XDECREF(init);
  if (on == 1) {
    PyObject *c = PyObject_GetAttrString(torch, "_C");
    PyObject *f =
        c != NULL ? PyObject_GetAttrString(c, "_cuda_getCurrentRawStream")
                  : NULL;
    Py_XDECREF(c);
    if (f != NULL) {
      s = PyObject_CallFunction(f, "i", device);
      if (s != NULL && raw_stream_fn == NULL)
        raw_stream_fn = f; /* kept for the life of the module */
      else
        Py_DECREF(f);
    } else { /* a PyTorch without it */
      PyErr_Clear();
      PyObject *cs = PyObject_CallMethod(cuda, "current_stream", "i", device);
      s = cs != NULL ? PyObject_GetAttrString(cs, "cuda_stream") : NULL;
      Py_XDECREF(cs);
    }
  }
  Py_XDECREF(cuda);
  if (on < 0 || (on == 1 && s == NULL))
    return -1;
  if (s != NULL) {
    *out = PyLong_AsVoidPtr(s);
    Py_DECREF(s);
    if (PyErr_Occurred())
      return -1;
  }
  return 0;
}

/* Stream @s (None, an int, or an object with .cuda_stream, .ptr or
 * .handle) as the library takes it, as _common._stream does; None on a
 * CUDA array is PyTorch's current stream of @device. 0, or -1 with an
 * exception. */
static int stream_of(PyObject *s, bool cuda, int device, void **out)
{
  *out = NULL;
  if (s == Py_None)
    return cuda ? torch_stream(device, out) : 0;
  if (PyLong_Check(s) && !PyBool_Check(s))
    return gpuipc__py_stream(s, out) ? 0 : -1;
  static const char *const attrs[] = {"cuda_stream", "ptr", "handle"};
  for (size_t i = 0; i < sizeof(attrs) / sizeof(attrs[0]); i++) {
    PyObject *v = PyObject_GetAttrString(s, attrs[i]);
    if (v == NULL) {
      PyErr_Clear();
      continue;
    }
    int ok = PyLong_Check(v) && !PyBool_Check(v);
    int rc = ok ? (gpuipc__py_stream(v, out) ? 0 : -1) : 1;
    Py_DECREF(v);
    if (rc <= 0)
      return rc;
  }
  PyErr_Format(PyExc_TypeError, "stream: not a stream: %R (None, an int, or "
               "an object with .cuda_stream or .ptr)", s);
  return -1;
}

int gpuipc__py_stream_on(PyObject *s, const gpuipc_dl_tensor_t *dl,
                         void **out)
{
  return stream_of(s, dl->device.device_type == GPUIPC_DL_CUDA,
                    dl->device.device_id, out);
}

/* ---- numpy's array interface ------------------------------------------- */

/* typestr @ts ("<f4") as a DLPack dtype: 1; 0 for what the Python layer
 * must judge (void types such as bfloat16, big-endian data, odd kinds). */
static int typestr_dtype(PyObject *ts, gpuipc_dl_dtype_t *out)
{
  PyObject *b = PyUnicode_Check(ts) ? PyUnicode_AsASCIIString(ts) : NULL;
  if (b == NULL) {
    PyErr_Clear();
    return 0;
  }
  const char *s = PyBytes_AsString(b);
  int code = -1, size = 0, n = 0;
  if (s != NULL && strlen(s) >= 3 && (s[0] == '<' || s[0] == '|' ||
                                      s[0] == '=')) {
    switch (s[1]) {
    case 'i': code = GPUIPC_DL_INT; break;
    case 'u': code = GPUIPC_DL_UINT; break;
    case 'f': code = GPUIPC_DL_FLOAT; break;
    case 'c': code = GPUIPC_DL_COMPLEX; break;
    case 'b': code = GPUIPC_DL_BOOL; break;
    default: break;
    }
    for (const char *p = s + 2; *p >= '0' && *p <= '9' && size < 64; p++, n++)
      size = size * 10 + (*p - '0');
    if (s[2 + n] != '\0')
      code = -1;
  }
  Py_DECREF(b);
  if (code < 0 || size <= 0 || size > 16)
    return 0;
  *out = (gpuipc_dl_dtype_t){.code = (uint8_t)code, .bits = (uint8_t)(size * 8),
                             .lanes = 1};
  return 1;
}

/* Byte strides @st (a tuple) of @nd dimensions in elements of @item bytes
 * into @out: 1; 0 when they are not whole elements or not ints. */
static int elem_strides(PyObject *st, int nd, int item, int64_t *out)
{
  if (!PyTuple_Check(st) || PyTuple_Size(st) != nd)
    return 0;
  for (int i = 0; i < nd; i++) {
    long long v = PyLong_AsLongLong(PyTuple_GetItem(st, i));
    if (v == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return 0;
    }
    if (v % item != 0)
      return 0;
    out[i] = v / item;
  }
  return 1;
}

/* @ai, an array interface dict, into @r: 1; 0 for what the Python layer
 * must judge (a mask, no data pointer, a dtype or strides it checks). */
static int read_interface(PyObject *obj, PyObject *ai, read_t *r)
{
  PyObject *mask = PyDict_GetItemString(ai, "mask");
  PyObject *data = PyDict_GetItemString(ai, "data");
  PyObject *ts = PyDict_GetItemString(ai, "typestr");
  PyObject *shape = PyDict_GetItemString(ai, "shape");
  PyObject *st = PyDict_GetItemString(ai, "strides");
  gpuipc_dl_tensor_t *dl = &r->d.t.dl;
  if ((mask != NULL && mask != Py_None) || data == NULL ||
      !PyTuple_Check(data) || PyTuple_Size(data) < 1 || ts == NULL ||
      shape == NULL || !PyTuple_Check(shape) || !typestr_dtype(ts, &dl->dtype))
    return 0;
  void *ptr = PyLong_AsVoidPtr(PyTuple_GetItem(data, 0));
  int nd = gpuipc__py_read_int64s(shape, r->d.shape, GPUIPC_TENSOR_MAX_DIMS,
                                  "shape");
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return 0;
  }
  dl->strides = NULL;
  if (st != NULL && st != Py_None) {
    if (!elem_strides(st, nd, dl->dtype.bits / 8, r->d.strides))
      return 0;
    dl->strides = r->d.strides;
  }
  dl->data = ptr;
  dl->device = (gpuipc_dl_device_t){.device_type = GPUIPC_DL_CPU};
  dl->ndim = nd;
  dl->shape = r->d.shape;
  dl->byte_offset = 0;
  Py_INCREF(obj);
  r->keep = obj;
  return 1;
}

/* ---- DLPack ------------------------------------------------------------ */

/* (device type, id) of @obj's __dlpack_device__ (CPU 0 without one). */
static int dlpack_device(PyObject *obj, int *type, int *id)
{
  *type = GPUIPC_DL_CPU;
  *id = 0;
  PyObject *dev = PyObject_CallMethod(obj, "__dlpack_device__", NULL);
  if (dev == NULL) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError))
      return -1;
    PyErr_Clear();
    return 0;
  }
  int ok = PyArg_ParseTuple(dev, "ii", type, id);
  Py_DECREF(dev);
  return ok ? 0 : -1;
}

/* @obj's DLPack capsule (its work ordered before @stream for CUDA) into
 * @r; 0, or -1 with an exception (what describe() would raise). */
static int read_dlpack(PyObject *obj, PyObject *stream_arg, read_t *r,
                       void **stream)
{
  int type, id;
  if (dlpack_device(obj, &type, &id) < 0)
    return -1;
  PyObject *cap;
  if (type == GPUIPC_DL_CUDA) {
    if (stream_of(stream_arg, true, id, stream) < 0)
      return -1;
    PyObject *meth = PyObject_GetAttrString(obj, "__dlpack__");
    PyObject *args = PyTuple_New(0);
    PyObject *kw = Py_BuildValue("{s:N}", "stream",
                                 PyLong_FromVoidPtr(*stream ? *stream
                                                            : (void *)1));
    cap = meth && args && kw ? PyObject_Call(meth, args, kw) : NULL;
    Py_XDECREF(meth);
    Py_XDECREF(args);
    Py_XDECREF(kw);
  } else {
    cap = PyObject_CallMethod(obj, "__dlpack__", NULL);
  }
  if (cap == NULL)
    return -1;
  const gpuipc_dl_tensor_t *dl;
  PyObject *hold = gpuipc__py_dl_take(cap, &dl);
  Py_DECREF(cap);
  if (hold == NULL)
    return -1;
  if (dl->ndim < 0 || dl->ndim > GPUIPC_TENSOR_MAX_DIMS) {
    Py_DECREF(hold);
    PyErr_Format(PyExc_ValueError, "shape: %d dimensions, more than the %d "
                 "gpuipc sends", (int)dl->ndim, GPUIPC_TENSOR_MAX_DIMS);
    return -1;
  }
  r->d.t.dl = *dl;
  memcpy(r->d.shape, dl->shape, (size_t)dl->ndim * sizeof(int64_t));
  r->d.t.dl.shape = r->d.shape;
  if (dl->strides != NULL) {
    memcpy(r->d.strides, dl->strides, (size_t)dl->ndim * sizeof(int64_t));
    r->d.t.dl.strides = r->d.strides;
  }
  r->keep = Py_BuildValue("(ON)", obj, hold);
  return r->keep != NULL ? 0 : -1;
}

/* ---- reading any array -------------------------------------------------- */

/* @obj read into @r, with its stream: 1; 0 when the Python layer must
 * describe it; -1 with an exception. */
static int read_any(PyObject *obj, PyObject *stream_arg, read_t *r,
                    void **stream)
{
  memset(r, 0, sizeof(*r));
  int got = gpuipc__py_torch_read(obj, &r->d);
  if (got < 0)
    return -1;
  if (got == 0) {
    PyObject *ai = PyObject_GetAttrString(obj, "__array_interface__");
    if (ai == NULL) {
      if (!PyErr_ExceptionMatches(PyExc_AttributeError))
        return -1;
      PyErr_Clear();
    } else {
      got = PyDict_Check(ai) ? read_interface(obj, ai, r) : 0;
      Py_DECREF(ai);
      if (got == 0)
        return 0; /* describe() judges it, or reads it another way */
    }
  } else {
    Py_INCREF(obj);
    r->keep = obj;
  }
  if (got == 1)
    return gpuipc__py_stream_on(stream_arg, &r->d.t.dl, stream) < 0 ? -1 : 1;
  PyObject *has = PyObject_GetAttrString(obj, "__dlpack__");
  if (has == NULL) {
    PyErr_Clear();
    return 0; /* the CUDA array interface, the buffer protocol */
  }
  Py_DECREF(has);
  if (read_dlpack(obj, stream_arg, r, stream) < 0)
    return -1;
  if (r->d.t.dl.device.device_type != GPUIPC_DL_CUDA &&
      stream_of(stream_arg, false, 0, stream) < 0)
    return -1;
  return 1;
}

int gpuipc__py_read_array(PyObject *obj, PyObject *stream_arg,
                          gpuipc__py_desc_t *d, PyObject **keep,
                          void **stream)
{
  read_t r;
  int got = read_any(obj, stream_arg, &r, stream);
  if (got <= 0) {
    Py_XDECREF(r.keep);
    return got;
  }
  *d = r.d;
  /* The description points into its own arrays: point it at @d's. */
  d->t.dl.shape = d->shape;
  if (r.d.t.dl.strides != NULL)
    d->t.dl.strides = d->strides;
  *keep = r.keep;
  return 1;
}

/* The bytes [lo, hi) that tensor @dl reaches, as _common._Desc._bounds. */
void gpuipc__py_bounds(const gpuipc_dl_tensor_t *dl, uintptr_t *lo,
                       uintptr_t *hi)
{
  uintptr_t p = (uintptr_t)dl->data + dl->byte_offset;
  int64_t item = (int64_t)dl->dtype.bits * dl->dtype.lanes / 8;
  if (item < 1)
    item = 1;
  int64_t down = 0, up = 0, n = 1;
  for (int i = 0; i < dl->ndim; i++) {
    if (dl->shape[i] == 0) {
      *lo = *hi = p;
      return;
    }
    n *= dl->shape[i];
    if (dl->strides != NULL) {
      int64_t reach = (dl->shape[i] - 1) * dl->strides[i];
      if (reach < 0)
        down += reach;
      else
        up += reach;
    }
  }
  if (dl->strides == NULL) {
    *lo = p;
    *hi = p + (uintptr_t)(n * item);
  } else {
    *lo = p + (uintptr_t)(down * item);
    *hi = p + (uintptr_t)((up + 1) * item);
  }
}

/* ---- keeping what GPU sends read --------------------------------------- */

/* Let go of every entry of @keep whose ticket is below @oldest, the oldest
 * message in flight (0: none is): those messages are all free. 0, or -1. */
static int drop_before(PyObject *keep, uint64_t oldest)
{
  PyObject *gone = PyList_New(0), *k, *v;
  Py_ssize_t pos = 0;
  if (gone == NULL)
    return -1;
  while (PyDict_Next(keep, &pos, &k, &v)) {
    unsigned long long t = PyLong_AsUnsignedLongLong(k);
    if (t == (unsigned long long)-1 && PyErr_Occurred())
      PyErr_Clear(); /* no ticket of ours: the full look judges it */
    else if ((oldest == 0 || t < oldest) && PyList_Append(gone, k) < 0)
      goto fail;
  }
  for (Py_ssize_t i = 0; i < PyList_Size(gone); i++)
    if (PyDict_DelItem(keep, PyList_GetItem(gone, i)) < 0)
      goto fail;
  Py_DECREF(gone);
  return 0;
fail:
  Py_DECREF(gone);
  return -1;
}

/* Keep @what in @keep under @ticket; past 8 kept, let go of those before
 * the oldest message in flight (one look at the channel), and if more than
 * 8 are still kept (messages come free in any order: a view held keeps
 * the oldest), of every one whose message is free (as Channel._hold does;
 * the channel's locks are taken without the GIL, which a receiver of this
 * process may need to release a message). 0, or -1. */
int gpuipc__py_hold(gpuipc_channel_t *ch, PyObject *keep, PyObject *ticket,
                    PyObject *what)
{
  if (PyDict_SetItem(keep, ticket, what) < 0)
    return -1;
  if (PyDict_Size(keep) <= 8)
    return 0;
  gpuipc_channel_info_t info = {.size = sizeof(info)};
  int rc;
  GPUIPC__PY_NOGIL(rc = gpuipc_channel_info(ch, &info));
  if (rc == 0 && drop_before(keep, info.oldest_in_flight) < 0)
    return -1;
  if (PyDict_Size(keep) <= 8)
    return 0;
  PyObject *tickets = PyDict_Keys(keep);
  if (tickets == NULL)
    return -1;
  Py_ssize_t n = PyList_Size(tickets);
  uint64_t *v = PyMem_Malloc((size_t)n * sizeof(*v) + 1);
  if (v == NULL) {
    Py_DECREF(tickets);
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    v[i] = PyLong_AsUnsignedLongLong(PyList_GetItem(tickets, i));
    if (PyErr_Occurred()) {
      PyErr_Clear();
      v[i] = 0; /* no ticket of ours: let it go */
    }
  }
  Py_BEGIN_ALLOW_THREADS
  for (Py_ssize_t i = 0; i < n; i++)
    if (v[i] != 0 && gpuipc_channel_send_done(ch, v[i], 0) == -EAGAIN)
      v[i] = UINT64_MAX; /* still in flight */
  Py_END_ALLOW_THREADS
  for (Py_ssize_t i = 0; i < n; i++)
    if (v[i] != UINT64_MAX &&
        PyDict_DelItem(keep, PyList_GetItem(tickets, i)) < 0)
      PyErr_Clear(); /* gone already: done() took it */
  PyMem_Free(v);
  Py_DECREF(tickets);
  return 0;
}

/*
 * channel_send_any(ch, obj, stream, flags, keep) -> ticket, or
 * NotImplemented (sent nothing: @obj is for describe() and the Python
 * path). The array's memory is sent as the gpuipc buffer it lies in, else
 * staged; a CUDA array (and its DLPack holder) is kept in dict @keep under
 * its ticket until the message is free.
 */
static PyObject *py_channel_send_any(PyObject *self, PyObject *args)
{
  gpuipc_channel_t *ch;
  PyObject *obj, *stream_arg, *keep;
  unsigned flags;
  if (!PyArg_ParseTuple(args, "O&OOIO", gpuipc__py_channel, &ch, &obj,
                        &stream_arg, &flags, &keep))
    return NULL;
  if (!PyDict_Check(keep)) {
    PyErr_SetString(PyExc_TypeError, "channel_send_any: keep is not a dict");
    return NULL;
  }
  read_t r;
  void *stream = NULL;
  int got = read_any(obj, stream_arg, &r, &stream);
  if (got <= 0) {
    Py_XDECREF(r.keep);
    if (got < 0)
      return NULL;
    Py_RETURN_NOTIMPLEMENTED;
  }
  gpuipc_dl_tensor_t *dl = &r.d.t.dl;
  uintptr_t lo, hi;
  gpuipc__py_bounds(dl, &lo, &hi);
  r.d.t.buf = gpuipc__py_find(dl->device.device_type, lo, hi - lo);
  uint64_t ticket = 0;
  int rc;
  GPUIPC__PY_NOGIL(rc = gpuipc_channel_send(ch, &r.d.t, stream, flags,
                                            &ticket));
  if (r.d.t.buf != NULL)
    gpuipc_buf_release(r.d.t.buf); /* a sent message holds its own */
  if (rc < 0) {
    Py_DECREF(r.keep);
    return gpuipc__py_raise(rc);
  }
  PyObject *t = PyLong_FromUnsignedLongLong(ticket);
  if (t != NULL && dl->device.device_type == GPUIPC_DL_CUDA &&
      gpuipc__py_hold(ch, keep, t, r.keep) < 0)
    Py_CLEAR(t);
  Py_DECREF(r.keep);
  return t;
}

PyMethodDef gpuipc__py_send_methods[] = {
    GPUIPC__PY_FN(channel_send_any, METH_VARARGS), GPUIPC__PY_END};
