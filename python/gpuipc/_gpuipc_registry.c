/*
 * _gpuipc_registry.c - the address ranges of the gpuipc buffers this
 * process holds, as the Python layer's _Registry (_buffer.py) records them:
 * it sets and drops each range with its own entry. The C send paths
 * (channel_send_host, channel_send_view) ask here whether memory may be a
 * buffer's: when it cannot, they stage it in C at once; when it may, the
 * Python layer finds the buffer and sends it without a copy. The table is
 * the only sorted index of the ranges: _Registry.find_span looks up here
 * (registry_find) and keeps only the buffers by start. Every caller holds
 * the GIL, which guards the table.
 */
#include "_gpuipc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct range {
  int type; /* DLPack device type */
  uintptr_t lo, hi;
} range_t;

static range_t *ranges; /* sorted by (type, lo), lo unique per type */
static size_t nranges, capranges;

static int key_cmp(const range_t *r, int type, uintptr_t lo)
{
  if (r->type != type)
    return r->type < type ? -1 : 1;
  return r->lo < lo ? -1 : r->lo > lo;
}

/* The first index whose key is above (type, lo). */
static size_t upper(int type, uintptr_t lo)
{
  size_t a = 0, b = nranges;
  while (a < b) {
    size_t m = a + (b - a) / 2;
    if (key_cmp(&ranges[m], type, lo) <= 0)
      a = m + 1;
    else
      b = m;
  }
  return a;
}

/* The range of @type holding @addr (one past its end included), or NULL:
 * the one of the greatest start at or below @addr. */
static const range_t *covering(int type, uintptr_t addr)
{
  size_t i = upper(type, addr);
  if (i == 0)
    return NULL;
  const range_t *r = &ranges[i - 1];
  return r->type == type && addr <= r->hi ? r : NULL;
}

bool gpuipc__py_registered(int type, uintptr_t addr)
{
  return covering(type, addr) != NULL;
}

/* The arguments (device_type, address) of the calls below. */
static int parse_key(PyObject *args, int *type, uintptr_t *addr)
{
  unsigned long long a;
  if (!PyArg_ParseTuple(args, "iK", type, &a))
    return -1;
  *addr = (uintptr_t)a;
  return 0;
}

/* Where the range of (@type, @lo) is (true) or would go (false). */
static bool find(int type, uintptr_t lo, size_t *at)
{
  size_t i = upper(type, lo);
  bool found = i > 0 && key_cmp(&ranges[i - 1], type, lo) == 0;
  *at = found ? i - 1 : i;
  return found;
}

/* registry_set(device_type, lo, hi): record (or replace) a range. */
static PyObject *py_registry_set(PyObject *self, PyObject *args)
{
  int type;
  unsigned long long lo, hi;
  if (!PyArg_ParseTuple(args, "iKK", &type, &lo, &hi))
    return NULL;
  size_t i;
  if (find(type, (uintptr_t)lo, &i)) {
    ranges[i].hi = (uintptr_t)hi;
    Py_RETURN_NONE;
  }
  if (nranges == capranges) {
    size_t cap = capranges ? 2 * capranges : 16;
    range_t *n = realloc(ranges, cap * sizeof(*n));
    if (n == NULL)
      return PyErr_NoMemory();
    ranges = n;
    capranges = cap;
  }
  memmove(&ranges[i + 1], &ranges[i], (nranges - i) * sizeof(*ranges));
  ranges[i] = (range_t){.type = type, .lo = (uintptr_t)lo, .hi = (uintptr_t)hi};
  nranges++;
  Py_RETURN_NONE;
}

/* registry_drop(device_type, lo): forget the range starting at @lo. */
static PyObject *py_registry_drop(PyObject *self, PyObject *args)
{
  int type;
  uintptr_t lo;
  size_t i;
  if (parse_key(args, &type, &lo) < 0)
    return NULL;
  if (find(type, lo, &i)) {
    memmove(&ranges[i], &ranges[i + 1], (nranges - i - 1) * sizeof(*ranges));
    nranges--;
  }
  Py_RETURN_NONE;
}

/* registry_find(device_type, addr) -> (lo, hi) of the range holding @addr,
 * or None (_Registry.find_span's look-up). */
static PyObject *py_registry_find(PyObject *self, PyObject *args)
{
  int type;
  uintptr_t addr;
  if (parse_key(args, &type, &addr) < 0)
    return NULL;
  const range_t *r = covering(type, addr);
  if (r == NULL)
    Py_RETURN_NONE;
  return Py_BuildValue("(KK)", (unsigned long long)r->lo,
                       (unsigned long long)r->hi);
}

/* registry_covers(device_type, addr) -> bool (what the send paths ask). */
static PyObject *py_registry_covers(PyObject *self, PyObject *args)
{
  int type;
  uintptr_t addr;
  if (parse_key(args, &type, &addr) < 0)
    return NULL;
  return PyBool_FromLong(gpuipc__py_registered(type, addr));
}

PyMethodDef gpuipc__py_registry_methods[] = {
    GPUIPC__PY_FN(registry_set, METH_VARARGS),
    GPUIPC__PY_FN(registry_drop, METH_VARARGS),
    GPUIPC__PY_FN(registry_find, METH_VARARGS),
    GPUIPC__PY_FN(registry_covers, METH_VARARGS), GPUIPC__PY_END};
