/*
 * _gpuipc_blocks.c - Channel.send_blocks and Channel.recv_blocks: the
 * blocks of a tensor along its first dimension, picked by an index array,
 * sent or received as one block batch (gpuipc_channel_send_blocks,
 * gpuipc_channel_recv_blocks). The block array is built here from the
 * indices (an integer array in host memory read in place: numpy, a CPU
 * torch tensor, DLPack; else a list, a tuple, or anything with .tolist()),
 * so that a batch of thousands of blocks is one call into the extension.
 */
#include "_gpuipc.h"

#include <errno.h>
#include <string.h>

/* Element @i of 1-D integer array @dl (host memory) into *@v: false for
 * a uint64 past INT64_MAX (the sequence path names it). */
static bool index_at(const gpuipc_dl_tensor_t *dl, int64_t i, int64_t *v)
{
  int64_t step = dl->strides != NULL ? dl->strides[0] : 1;
  const uint8_t *p = (const uint8_t *)dl->data + dl->byte_offset +
                     i * step * (dl->dtype.bits / 8);
  bool sign = dl->dtype.code == GPUIPC_DL_INT;
  switch (dl->dtype.bits) {
  case 8:
    *v = sign ? (int64_t)*(const int8_t *)p : (int64_t)*(const uint8_t *)p;
    return true;
  case 16:
    *v = sign ? (int64_t)*(const int16_t *)p : (int64_t)*(const uint16_t *)p;
    return true;
  case 32:
    *v = sign ? (int64_t)*(const int32_t *)p : (int64_t)*(const uint32_t *)p;
    return true;
  default:
    if (sign) {
      *v = *(const int64_t *)p;
      return true;
    }
    *v = (int64_t)*(const uint64_t *)p;
    return *(const uint64_t *)p <= INT64_MAX;
  }
}

/*
 * The indices of a 1-D integer array in host memory (numpy, a CPU torch
 * tensor, anything with DLPack or the array interface), read in place as
 * Channel.send reads an array: 1 with a new PyMem array in *@out of *@n;
 * 0 for anything else (a list, a GPU tensor, floats, bools, a uint64 past
 * INT64_MAX), which the sequence path reads and judges; -1 with an
 * exception. .tolist() of 1,024 indices took 7 to 9 us, twice a batch.
 */
static int read_index_array(PyObject *idx, const char *who, int64_t **out,
                            size_t *n)
{
  if (PyList_Check(idx) || PyTuple_Check(idx))
    return 0;
  gpuipc__py_desc_t d;
  PyObject *keep = NULL;
  void *stream = NULL;
  int got = gpuipc__py_read_array(idx, Py_None, &d, &keep, &stream);
  if (got < 0 && !PyErr_ExceptionMatches(PyExc_Exception))
    return -1; /* KeyboardInterrupt, SystemExit */
  if (got <= 0) {
    PyErr_Clear(); /* the sequence path says what is wrong, if anything */
    return 0;
  }
  const gpuipc_dl_tensor_t *dl = &d.t.dl;
  int type = dl->device.device_type;
  int bits = dl->dtype.bits;
  int64_t len = dl->ndim == 1 ? dl->shape[0] : -1;
  if ((type != GPUIPC_DL_CPU && type != GPUIPC_DL_CUDA_HOST) ||
      len < 0 || dl->dtype.lanes != 1 ||
      (dl->dtype.code != GPUIPC_DL_INT && dl->dtype.code != GPUIPC_DL_UINT) ||
      (bits != 8 && bits != 16 && bits != 32 && bits != 64)) {
    Py_DECREF(keep);
    return 0;
  }
  if (len < 1 || len > GPUIPC_CHANNEL_BLOCKS_MAX) {
    Py_DECREF(keep);
    PyErr_Format(PyExc_ValueError, "%s: %lld indices (1..%d)", who,
                 (long long)len, GPUIPC_CHANNEL_BLOCKS_MAX);
    return -1;
  }
  int64_t *v = PyMem_Malloc((size_t)len * sizeof(*v));
  if (v == NULL) {
    Py_DECREF(keep);
    PyErr_NoMemory();
    return -1;
  }
  int64_t i = 0;
  while (i < len && index_at(dl, i, &v[i]))
    i++;
  Py_DECREF(keep);
  if (i < len) {
    PyMem_Free(v);
    return 0;
  }
  *out = v;
  *n = (size_t)len;
  return 1;
}

/* The ints of @idx (an integer array read in place, a sequence of ints, or
 * an object whose .tolist() is one) as a new PyMem array of *@n; NULL with
 * an exception. */
static int64_t *read_indices(PyObject *idx, const char *who, size_t *n)
{
  int64_t *fast = NULL;
  int got = read_index_array(idx, who, &fast, n);
  if (got != 0)
    return got > 0 ? fast : NULL;
  PyObject *list;
  PyObject *tolist = PyObject_GetAttrString(idx, "tolist");
  if (tolist != NULL) {
    list = PyObject_CallObject(tolist, NULL);
    Py_DECREF(tolist);
  } else {
    PyErr_Clear();
    list = PySequence_Check(idx) && !PyUnicode_Check(idx) &&
                   !PyBytes_Check(idx)
               ? PySequence_List(idx)
               : NULL;
    if (list == NULL && !PyErr_Occurred())
      PyErr_Format(PyExc_TypeError, "%s: indices must be a sequence of "
                   "ints (a list, numpy or torch integer array), not %R",
                   who, idx);
  }
  if (list == NULL)
    return NULL;
  if (!PyList_Check(list)) {
    PyErr_Format(PyExc_TypeError, "%s: indices must be a 1-D sequence of "
                 "ints, not %R", who, list);
    Py_DECREF(list);
    return NULL;
  }
  Py_ssize_t len = PyList_Size(list);
  if (len < 1 || len > GPUIPC_CHANNEL_BLOCKS_MAX) {
    PyErr_Format(PyExc_ValueError, "%s: %zd indices (1..%d)", who, len,
                 GPUIPC_CHANNEL_BLOCKS_MAX);
    Py_DECREF(list);
    return NULL;
  }
  int64_t *v = PyMem_Malloc((size_t)len * sizeof(*v));
  if (v == NULL) {
    Py_DECREF(list);
    PyErr_NoMemory();
    return NULL;
  }
  for (Py_ssize_t i = 0; i < len; i++) {
    PyObject *x = PyList_GetItem(list, i);
    if (!PyLong_Check(x) || PyBool_Check(x)) {
      PyErr_Format(PyExc_TypeError, "%s: indices[%zd] is %R, not an int",
                   who, i, x);
      break;
    }
    v[i] = PyLong_AsLongLong(x);
    if (v[i] == -1 && PyErr_Occurred())
      break;
  }
  Py_DECREF(list);
  if (PyErr_Occurred()) {
    PyMem_Free(v);
    return NULL;
  }
  *n = (size_t)len;
  return v;
}

/* @dl's blocks along its first dimension: *@rows of *@row_bytes each;
 * 0, or -1 with ValueError (no dimension, not contiguous). */
static int rows_of(const gpuipc_dl_tensor_t *dl, const char *who,
                   int64_t *rows, uint64_t *row_bytes)
{
  if (dl->ndim < 1) {
    PyErr_Format(PyExc_ValueError, "%s: the tensor has no dimension to "
                 "take blocks along", who);
    return -1;
  }
  uint64_t n = (uint64_t)dl->dtype.bits * dl->dtype.lanes / 8;
  int64_t want = 1;
  for (int i = dl->ndim - 1; i >= 0; i--) {
    if (dl->shape[i] < 0) {
      PyErr_Format(PyExc_ValueError, "%s: shape[%d] is negative", who, i);
      return -1;
    }
    if (dl->strides != NULL && dl->shape[i] != 1 && dl->strides[i] != want) {
      PyErr_Format(PyExc_ValueError, "%s: the tensor must be contiguous "
                   "(row-major): each block one range of bytes", who);
      return -1;
    }
    want *= dl->shape[i];
    if (i > 0)
      n *= (uint64_t)dl->shape[i];
  }
  *rows = dl->shape[0];
  *row_bytes = n;
  return 0;
}

/*
 * The blocks idx[i] of @dl (in @buf) into a new PyMem array; NULL with
 * IndexError for an index outside 0 .. rows - 1, ValueError for a tensor
 * without blocks.
 */
static gpuipc_block_t *make_blocks(const gpuipc_dl_tensor_t *dl,
                                   gpuipc_buf_t *buf, const int64_t *idx,
                                   size_t n, const char *who)
{
  int64_t rows;
  uint64_t row_bytes;
  if (rows_of(dl, who, &rows, &row_bytes) < 0)
    return NULL;
  uintptr_t p = (uintptr_t)dl->data + dl->byte_offset;
  uintptr_t base = (uintptr_t)gpuipc_buf_ptr(buf);
  if (p < base) {
    PyErr_Format(PyExc_ValueError, "%s: the tensor starts before its "
                 "buffer", who);
    return NULL;
  }
  gpuipc_block_t *b = PyMem_Malloc(n * sizeof(*b));
  if (b == NULL) {
    PyErr_NoMemory();
    return NULL;
  }
  for (size_t i = 0; i < n; i++) {
    if (idx[i] < 0 || idx[i] >= rows) {
      PyErr_Format(PyExc_IndexError, "%s: indices[%zu] is %lld, outside "
                   "the tensor's %lld blocks (0 .. %lld)", who, i,
                   (long long)idx[i], (long long)rows, (long long)rows - 1);
      PyMem_Free(b);
      return NULL;
    }
    b[i] = (gpuipc_block_t){buf, (uint64_t)(p - base) +
                                     (uint64_t)idx[i] * row_bytes,
                            row_bytes};
  }
  return b;
}

/* @dl's gpuipc buffer (@box's, or found by address): a reference of our
 * own; NULL with ValueError when its memory lies in none. */
static gpuipc_buf_t *buf_of(PyObject *box, const gpuipc_dl_tensor_t *dl,
                            const char *who)
{
  if (box != Py_None) {
    gpuipc_buf_t *b = gpuipc__py_unbox(box, gpuipc__py_BUF);
    return b != NULL && gpuipc_buf_retain(b) == 0 ? b : NULL;
  }
  uintptr_t lo, hi;
  gpuipc__py_bounds(dl, &lo, &hi);
  gpuipc_buf_t *b = gpuipc__py_find(dl->device.device_type, lo, hi - lo);
  if (b == NULL)
    PyErr_Format(PyExc_ValueError, "%s: the tensor does not lie in a "
                 "gpuipc buffer (allocate it with gpuipc.empty, or a gpuipc "
                 "allocator)", who);
  return b;
}

/* Send the blocks @indices of @dl (in @box's buffer, None: found) on @ch:
 * the ticket, or NULL with an exception. */
static PyObject *send_blocks(gpuipc_channel_t *ch, PyObject *box,
                             const gpuipc_dl_tensor_t *dl, PyObject *indices,
                             void *stream, unsigned flags)
{
  static const char who[] = "send_blocks";
  size_t n = 0;
  int64_t *idx = read_indices(indices, who, &n);
  if (idx == NULL)
    return NULL;
  gpuipc_buf_t *buf = buf_of(box, dl, who);
  gpuipc_block_t *b = buf != NULL ? make_blocks(dl, buf, idx, n, who) : NULL;
  PyMem_Free(idx);
  if (b == NULL) {
    if (buf != NULL)
      gpuipc_buf_release(buf);
    return NULL;
  }
  uint64_t ticket = 0;
  int rc;
  GPUIPC__PY_NOGIL(rc = gpuipc_channel_send_blocks(ch, b, n, stream, flags,
                                                   &ticket));
  PyMem_Free(b);
  gpuipc_buf_release(buf); /* the message holds its own */
  if (rc < 0)
    return gpuipc__py_raise(rc);
  return PyLong_FromUnsignedLongLong(ticket);
}

/*
 * channel_send_blocks(ch, obj, indices, stream, flags, keep) -> ticket, or
 * NotImplemented (sent nothing: @obj is for describe() and
 * channel_send_blocks_desc). A CUDA array is kept in dict @keep under its
 * ticket until the message is free.
 */
static PyObject *py_channel_send_blocks(PyObject *self, PyObject *args)
{
  gpuipc_channel_t *ch;
  PyObject *obj, *indices, *stream_arg, *keep, *hold = NULL;
  unsigned flags;
  if (!PyArg_ParseTuple(args, "O&OOOIO", gpuipc__py_channel, &ch, &obj,
                        &indices, &stream_arg, &flags, &keep))
    return NULL;
  if (!PyDict_Check(keep)) {
    PyErr_SetString(PyExc_TypeError, "channel_send_blocks: keep is not a "
                    "dict");
    return NULL;
  }
  gpuipc__py_desc_t d;
  void *stream = NULL;
  int got = gpuipc__py_read_array(obj, stream_arg, &d, &hold, &stream);
  if (got < 0)
    return NULL;
  if (got == 0)
    Py_RETURN_NOTIMPLEMENTED;
  PyObject *t = send_blocks(ch, Py_None, &d.t.dl, indices, stream, flags);
  if (t != NULL && d.t.dl.device.device_type == GPUIPC_DL_CUDA &&
      gpuipc__py_hold(ch, keep, t, hold) < 0)
    Py_CLEAR(t);
  Py_DECREF(hold);
  return t;
}

/* channel_send_blocks_desc(ch, box, desc, indices, stream, flags) ->
 * ticket: a described tensor (box None: its buffer found by address). */
static PyObject *py_channel_send_blocks_desc(PyObject *self, PyObject *args)
{
  gpuipc_channel_t *ch;
  PyObject *box, *indices;
  gpuipc__py_desc_t d;
  void *stream;
  unsigned flags;
  if (!PyArg_ParseTuple(args, "O&OO&OO&I", gpuipc__py_channel, &ch, &box,
                        gpuipc__py_desc, &d, &indices, gpuipc__py_stream,
                        &stream, &flags))
    return NULL;
  return send_blocks(ch, box, &d.t.dl, indices, stream, flags);
}

/* channel_recv_blocks_desc(ch, box, desc, indices, stream, timeout_ms):
 * the next message, a block batch, its block k copied into block
 * indices[k] of the described tensor (box None: its buffer found). */
static PyObject *py_channel_recv_blocks_desc(PyObject *self, PyObject *args)
{
  static const char who[] = "recv_blocks";
  gpuipc_channel_t *ch;
  PyObject *box, *indices;
  gpuipc__py_desc_t d;
  void *stream;
  int ms;
  if (!PyArg_ParseTuple(args, "O&OO&OO&i", gpuipc__py_channel, &ch, &box,
                        gpuipc__py_desc, &d, &indices, gpuipc__py_stream,
                        &stream, &ms))
    return NULL;
  size_t n = 0;
  int64_t *idx = read_indices(indices, who, &n);
  if (idx == NULL)
    return NULL;
  gpuipc_buf_t *buf = buf_of(box, &d.t.dl, who);
  gpuipc_block_t *b = buf != NULL ? make_blocks(&d.t.dl, buf, idx, n, who)
                                  : NULL;
  PyMem_Free(idx);
  if (b == NULL) {
    if (buf != NULL)
      gpuipc_buf_release(buf);
    return NULL;
  }
  int rc;
  GPUIPC__PY_NOGIL(rc = gpuipc_channel_recv_blocks(ch, b, n, stream, ms));
  PyMem_Free(b);
  gpuipc_buf_release(buf);
  return gpuipc__py_none(rc);
}

PyMethodDef gpuipc__py_blocks_methods[] = {
    GPUIPC__PY_FN(channel_send_blocks, METH_VARARGS),
    GPUIPC__PY_FN(channel_send_blocks_desc, METH_VARARGS),
    GPUIPC__PY_FN(channel_recv_blocks_desc, METH_VARARGS), GPUIPC__PY_END};
