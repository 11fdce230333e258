/*
 * _gpuipc_event.c - gpuipc._gpuipc's interprocess CUDA events (create,
 * export, import, record/wait/query/sync) and copies between memories of
 * any kind. Events travel as "gpuipc.event" boxes (_gpuipc.c); the Python
 * class is gpuipc/_event.py. See _gpuipc.h.
 */
#include "_gpuipc.h"

#include <errno.h>

static PyObject *py_event_create(PyObject *self, PyObject *args)
{
  int device;
  if (!PyArg_ParseTuple(args, "i", &device))
    return NULL;
  gpuipc_event_t *ev = NULL;
  int rc = gpuipc_event_create(device, 0, &ev);
  return gpuipc__py_box(rc, gpuipc__py_EVENT, ev);
}

static PyObject *py_event_export(PyObject *self, PyObject *cap)
{
  gpuipc_event_t *ev = gpuipc__py_unbox(cap, gpuipc__py_EVENT);
  if (ev == NULL)
    return NULL;
  gpuipc_event_handle_t h;
  char packed[GPUIPC_EVENT_HANDLE_PACKED_SIZE];
  int rc = gpuipc_event_export(ev, &h);
  if (rc >= 0)
    rc = gpuipc_event_handle_pack(&h, packed, sizeof(packed));
  if (rc < 0)
    return gpuipc__py_raise(rc);
  return PyBytes_FromStringAndSize(packed, rc);
}

static PyObject *py_event_import(PyObject *self, PyObject *args)
{
  const char *packed;
  Py_ssize_t n;
  int device;
  if (!PyArg_ParseTuple(args, "y#i", &packed, &n, &device))
    return NULL;
  gpuipc_event_handle_t h;
  gpuipc_event_t *ev = NULL;
  int rc = gpuipc_event_handle_unpack(packed, (size_t)n, &h);
  if (rc >= 0)
    rc = gpuipc_event_import(&h, device, &ev);
  return gpuipc__py_box(rc, gpuipc__py_EVENT, ev);
}

/* event_op(ev, op, stream): 0 record, 1 wait, 2 query (bool), 3 sync. */
static PyObject *py_event_op(PyObject *self, PyObject *args)
{
  gpuipc_event_t *ev;
  int op;
  void *stream;
  if (!PyArg_ParseTuple(args, "O&iO&", gpuipc__py_event, &ev, &op,
                        gpuipc__py_stream, &stream))
    return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  switch (op) {
  case 0: rc = gpuipc_event_record(ev, stream); break;
  case 1: rc = gpuipc_event_wait(ev, stream); break;
  case 2: rc = gpuipc_event_query(ev); break;
  default: rc = gpuipc_event_sync(ev); break;
  }
  Py_END_ALLOW_THREADS
  if (op == 2 && rc == -EAGAIN)
    Py_RETURN_FALSE;
  if (rc < 0)
    return gpuipc__py_raise(rc);
  Py_RETURN_TRUE;
}

/* memcpy(dst, src, nbytes, device, stream) between addresses of any kind. */
static PyObject *py_memcpy(PyObject *self, PyObject *args)
{
  void *dst, *src, *stream;
  Py_ssize_t n;
  int device;
  if (!PyArg_ParseTuple(args, "O&O&niO&", gpuipc__py_ptr, &dst,
                        gpuipc__py_ptr, &src, &n, &device, gpuipc__py_stream,
                        &stream))
    return NULL;
  int rc;
  GPUIPC__PY_NOGIL(rc = gpuipc_memcpy(dst, src, (size_t)n, device, stream));
  return gpuipc__py_none(rc);
}

/* memcpy_batch(dsts, srcs, sizes, device, stream, flags=0): three
 * sequences of ints of one length; the copies queued, in order, on the
 * stream. */
static PyObject *py_memcpy_batch(PyObject *self, PyObject *args)
{
  PyObject *in[3];
  void *stream;
  int device;
  unsigned flags = 0;
  if (!PyArg_ParseTuple(args, "OOOiO&|I", &in[0], &in[1], &in[2], &device,
                        gpuipc__py_stream, &stream, &flags))
    return NULL;
  Py_ssize_t count = -1;
  for (int k = 0; k < 3; k++) {
    Py_ssize_t c = PySequence_Size(in[k]);
    if (c < 0)
      return NULL;
    if (count >= 0 && c != count) {
      PyErr_Format(PyExc_ValueError, "memcpy_batch: %zd destinations, %zd "
                   "sources and sizes: not one length", count, c);
      return NULL;
    }
    count = c;
  }
  void **ptr[2] = {PyMem_Calloc((size_t)count + 1, sizeof(void *)),
                   PyMem_Calloc((size_t)count + 1, sizeof(void *))};
  size_t *n = PyMem_Calloc((size_t)count + 1, sizeof(size_t));
  PyObject *ret = NULL;
  if (ptr[0] == NULL || ptr[1] == NULL || n == NULL) {
    PyErr_NoMemory();
    goto out;
  }
  for (Py_ssize_t i = 0; i < count; i++) {
    for (int k = 0; k < 3; k++) {
      PyObject *v = PySequence_GetItem(in[k], i);
      if (v == NULL)
        goto out;
      int ok;
      if (k < 2) {
        ok = gpuipc__py_ptr(v, &ptr[k][i]);
      } else {
        n[i] = PyLong_AsSize_t(v);
        ok = !(n[i] == (size_t)-1 && PyErr_Occurred());
      }
      Py_DECREF(v);
      if (!ok)
        goto out;
    }
  }
  int rc;
  GPUIPC__PY_NOGIL(rc = gpuipc_memcpy_batch(ptr[0],
                                            (const void *const *)ptr[1], n,
                                            (size_t)count, device, stream,
                                            flags));
  ret = gpuipc__py_none(rc);
out:
  PyMem_Free(ptr[0]);
  PyMem_Free(ptr[1]);
  PyMem_Free(n);
  return ret;
}

PyMethodDef gpuipc__py_event_methods[] = {
    GPUIPC__PY_FN(event_create, METH_VARARGS),
    GPUIPC__PY_FN(event_export, METH_O),
    GPUIPC__PY_FN(event_import, METH_VARARGS),
    GPUIPC__PY_FN(event_op, METH_VARARGS),
    GPUIPC__PY_FN(memcpy, METH_VARARGS),
    GPUIPC__PY_FN(memcpy_batch, METH_VARARGS),
    GPUIPC__PY_END};
