/*
 * _gpuipc_find.c - the gpuipc buffer that holds an array's memory,
 * found by the library (gpuipc_buf_find: its index of every buffer this
 * process allocated or imported, kept as they come and go, which a C
 * library of the same process shares). The send paths ask here whether
 * memory lies in a buffer (sent without a copy) or not (staged); the
 * Python layer asks through buf_find. See _gpuipc.h.
 */
#include "_gpuipc.h"

#include <stdint.h>

/* Whether buffer @b's memory is of DLPack device type @type: HOST memory
 * is the CPU's (pinned or not), the other kinds CUDA's. */
static bool of_type(const gpuipc_buf_t *b, int type)
{
  bool host = gpuipc_buf_kind(b) == GPUIPC_KIND_HOST;
  if (type == GPUIPC_DL_CPU || type == GPUIPC_DL_CUDA_HOST)
    return host;
  return type == GPUIPC_DL_CUDA && !host;
}

gpuipc_buf_t *gpuipc__py_find(int type, uintptr_t lo, size_t bytes)
{
  gpuipc_buf_t *b;
  if (lo == 0 || gpuipc_buf_find((const void *)lo, bytes, &b, NULL) != 0)
    return NULL;
  if (of_type(b, type))
    return b;
  gpuipc_buf_release(b);
  return NULL;
}

/* buf_find(device_type, lo, hi) -> a buffer box (a reference of its own)
 * whose memory holds bytes [lo, hi) of that device type, or None. */
static PyObject *py_buf_find(PyObject *self, PyObject *args)
{
  int type;
  unsigned long long lo, hi;
  if (!PyArg_ParseTuple(args, "iKK", &type, &lo, &hi))
    return NULL;
  if (hi < lo) {
    PyErr_SetString(PyExc_ValueError, "buf_find: hi below lo");
    return NULL;
  }
  gpuipc_buf_t *b = gpuipc__py_find(type, (uintptr_t)lo, (size_t)(hi - lo));
  if (b == NULL)
    Py_RETURN_NONE;
  return gpuipc__py_box(0, gpuipc__py_BUF, b);
}

PyMethodDef gpuipc__py_find_methods[] = {
    GPUIPC__PY_FN(buf_find, METH_VARARGS), GPUIPC__PY_END};
