/*
 * _gpuipc_library.c - gpuipc._gpuipc's functions about the library itself
 * and the machine: version, error names, the CUDA driver, devices, buffer
 * kinds, the topology between GPUs and the GPUIPC_* settings. The Python
 * layer's module functions (gpuipc/_device.py) call these. See _gpuipc.h.
 */
#include "_gpuipc.h"

#include <dlfcn.h>
#include <string.h>

static PyObject *py_err_name(PyObject *self, PyObject *args)
{
  int code;
  if (!PyArg_ParseTuple(args, "i", &code))
    return NULL;
  return PyUnicode_FromString(gpuipc_err_name(code));
}

static PyObject *py_strerror(PyObject *self, PyObject *args)
{
  int code;
  if (!PyArg_ParseTuple(args, "i", &code))
    return NULL;
  return PyUnicode_FromString(gpuipc_strerror(code));
}

static PyObject *py_last_error(PyObject *self, PyObject *unused)
{
  return PyUnicode_FromString(gpuipc_last_error());
}

static PyObject *py_version(PyObject *self, PyObject *unused)
{
  return PyUnicode_FromString(gpuipc_version());
}

/* libgpuipc_path() -> the file of the libgpuipc this module calls (its
 * gpuipc_version's), as the dynamic loader found it. */
static PyObject *py_libgpuipc_path(PyObject *self, PyObject *unused)
{
  Dl_info info;
  if (dladdr((void *)gpuipc_version, &info) == 0 || info.dli_fname == NULL) {
    PyErr_SetString(PyExc_OSError, "dladdr: gpuipc_version lies in no "
                    "loaded object");
    return NULL;
  }
  return PyUnicode_DecodeFSDefault(info.dli_fname);
}

static PyObject *py_driver_status(PyObject *self, PyObject *unused)
{
  int ver = 0, rc;
  GPUIPC__PY_NOGIL(rc = gpuipc_driver_status(&ver));
  return Py_BuildValue("(iis)", rc, ver, rc < 0 ? gpuipc_last_error() : "");
}

static PyObject *py_device_count(PyObject *self, PyObject *unused)
{
  return PyLong_FromLong(gpuipc_device_count());
}

static PyObject *py_device_info(PyObject *self, PyObject *args)
{
  int ordinal;
  if (!PyArg_ParseTuple(args, "i", &ordinal))
    return NULL;
  gpuipc_device_info_t d = {.size = sizeof(d)};
  int rc = gpuipc_device_info(ordinal, &d);
  if (rc < 0)
    return gpuipc__py_raise(rc);
  return Py_BuildValue(
      "{s:i,s:y#,s:s,s:s,s:s,s:K,s:(ii),s:i,s:i,s:i,s:i,s:i,s:K}", "ordinal",
      d.ordinal, "uuid", (const char *)d.uuid, (Py_ssize_t)16, "uuid_str",
      d.uuid_str, "name", d.name, "pci_bus_id", d.pci_bus_id, "total_mem",
      (unsigned long long)d.total_mem, "compute_capability", d.cc_major,
      d.cc_minor, "vmm", d.vmm, "posix_fd", d.posix_fd, "fabric", d.fabric,
      "ipc_events", d.ipc_events, "mem_pools", d.mem_pools, "granularity",
      (unsigned long long)d.granularity);
}

static PyObject *py_device_by_uuid(PyObject *self, PyObject *args)
{
  const char *uuid;
  Py_ssize_t n;
  if (!PyArg_ParseTuple(args, "y#", &uuid, &n))
    return NULL;
  if (n != 16) {
    PyErr_SetString(PyExc_ValueError, "a device UUID is 16 bytes");
    return NULL;
  }
  return gpuipc__py_long(gpuipc_device_by_uuid((const uint8_t *)uuid));
}

static PyObject *py_device_current(PyObject *self, PyObject *unused)
{
  return gpuipc__py_long(gpuipc__device_current());
}

static PyObject *py_kind_available(PyObject *self, PyObject *args)
{
  int kind;
  if (!PyArg_ParseTuple(args, "i", &kind))
    return NULL;
  int rc = gpuipc_kind_available((gpuipc_kind_t)kind);
  return Py_BuildValue("(is)", rc, rc < 0 ? gpuipc_last_error() : "");
}

static PyObject *py_topo_p2p(PyObject *self, PyObject *args)
{
  int src, dst;
  if (!PyArg_ParseTuple(args, "ii", &src, &dst))
    return NULL;
  gpuipc_p2p_t p = {.size = sizeof(p)};
  int rc = gpuipc_topo_p2p(src, dst, &p);
  if (rc < 0)
    return gpuipc__py_raise(rc);
  return Py_BuildValue("{s:i,s:i,s:i,s:i,s:s,s:i}", "access", p.access,
                       "perf_rank", p.perf_rank, "native_atomics",
                       p.native_atomics, "cuda_arrays", p.cuda_arrays, "link",
                       gpuipc_link_name(p.link), "nvlinks", p.nvlinks);
}

static PyObject *py_config(PyObject *self, PyObject *unused)
{
  int n = gpuipc_config_count();
  PyObject *list = PyList_New(0);
  for (int i = 0; list != NULL && i < n; i++) {
    gpuipc_config_item_t it;
    if (gpuipc_config_get(i, &it) < 0)
      continue;
    gpuipc__py_append(&list, Py_BuildValue("{s:s,s:s,s:s,s:s,s:O}", "name",
                                           it.name, "value", it.value,
                                           "default", it.def, "help", it.help,
                                           "is_set",
                                           it.is_set ? Py_True : Py_False));
  }
  return list;
}

PyMethodDef gpuipc__py_library_methods[] = {
    GPUIPC__PY_FN(err_name, METH_VARARGS),
    GPUIPC__PY_FN(strerror, METH_VARARGS),
    GPUIPC__PY_FN(last_error, METH_NOARGS),
    GPUIPC__PY_FN(version, METH_NOARGS),
    GPUIPC__PY_FN(libgpuipc_path, METH_NOARGS),
    GPUIPC__PY_FN(driver_status, METH_NOARGS),
    GPUIPC__PY_FN(device_count, METH_NOARGS),
    GPUIPC__PY_FN(device_info, METH_VARARGS),
    GPUIPC__PY_FN(device_by_uuid, METH_VARARGS),
    GPUIPC__PY_FN(device_current, METH_NOARGS),
    GPUIPC__PY_FN(kind_available, METH_VARARGS),
    GPUIPC__PY_FN(topo_p2p, METH_VARARGS),
    GPUIPC__PY_FN(config, METH_NOARGS),
    GPUIPC__PY_END};
