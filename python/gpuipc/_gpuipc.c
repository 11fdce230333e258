/*
 * _gpuipc - the C half of the gpuipc Python package: thin functions over
 * include/gpuipc.h, written against CPython's limited API (one binary for
 * every CPython >= 3.9). Objects of the library travel to Python as
 * capsules holding a "box" (the pointer, cleared when closed explicitly);
 * the classes live in the pure Python layer (gpuipc/_core.py).
 *
 * Errors: a negative code raises the exception that the Python layer's
 * factory (_set_error_factory) makes from (code, name, sentence).
 * Blocking calls release the GIL.
 */
#define Py_LIMITED_API 0x03090000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpuipc.h"
/* The library is linked in whole: its private interface is ours too. */
#include "core/private.h"

#define EXPORT __attribute__((visibility("default")))

static PyObject *error_factory; /* callable(code, name, sentence) -> exc */

/* ---- errors ------------------------------------------------------------ */

static PyObject *raise_code(int code)
{
  const char *detail = gpuipc_last_error();
  if (detail == NULL || detail[0] == '\0')
    detail = gpuipc_strerror(code);
  if (error_factory == NULL) {
    PyErr_Format(PyExc_RuntimeError, "%s: %s", gpuipc_err_name(code), detail);
    return NULL;
  }
  PyObject *exc = PyObject_CallFunction(error_factory, "iss", code,
                                        gpuipc_err_name(code), detail);
  if (exc == NULL)
    return NULL;
  PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
  Py_DECREF(exc);
  return NULL;
}

static PyObject *py_set_error_factory(PyObject *self, PyObject *fn)
{
  Py_XDECREF(error_factory);
  Py_INCREF(fn);
  error_factory = fn;
  Py_RETURN_NONE;
}

/* ---- boxes: library objects as capsules -------------------------------- */

typedef struct box {
  void *p;
} box_t;

static const char BUF[] = "gpuipc.buf", DOM[] = "gpuipc.domain",
                  CHAN[] = "gpuipc.channel", VIEW[] = "gpuipc.view",
                  EVENT[] = "gpuipc.event";

static void box_destroy(PyObject *cap)
{
  const char *name = PyCapsule_GetName(cap);
  box_t *b = PyCapsule_GetPointer(cap, name);
  if (b == NULL) {
    PyErr_Clear();
    return;
  }
  void *p = b->p;
  b->p = NULL;
  free(b);
  if (p == NULL)
    return;
  Py_BEGIN_ALLOW_THREADS
  if (name == BUF)
    gpuipc_buf_release(p);
  else if (name == DOM)
    gpuipc_domain_leave(p);
  else if (name == CHAN)
    gpuipc_channel_close(p);
  else if (name == VIEW)
    gpuipc_tensor_release(p, NULL);
  else if (name == EVENT)
    gpuipc_event_release(p);
  Py_END_ALLOW_THREADS
}

static PyObject *box_new(const char *name, void *p)
{
  box_t *b = malloc(sizeof(*b));
  if (b == NULL)
    return PyErr_NoMemory();
  b->p = p;
  PyObject *cap = PyCapsule_New(b, name, box_destroy);
  if (cap == NULL)
    free(b);
  return cap;
}

/* The object in capsule @cap of type @name; NULL with an exception when
 * it is not one or was closed. */
static void *unbox(PyObject *cap, const char *name)
{
  box_t *b = PyCapsule_GetPointer(cap, name);
  if (b == NULL)
    return NULL;
  if (b->p == NULL) {
    PyErr_SetString(PyExc_ValueError, "the gpuipc object is closed");
    return NULL;
  }
  return b->p;
}

/* Take the object out of its box (the caller now owns it). */
static void *unbox_take(PyObject *cap, const char *name)
{
  void *p = unbox(cap, name);
  if (p != NULL)
    ((box_t *)PyCapsule_GetPointer(cap, name))->p = NULL;
  return p;
}

/* Close the boxed object now; 0 or the library's code. */
static PyObject *py_close(PyObject *self, PyObject *args)
{
  PyObject *cap;
  PyObject *stream_obj = NULL;
  if (!PyArg_ParseTuple(args, "O|O", &cap, &stream_obj))
    return NULL;
  const char *name = PyCapsule_GetName(cap);
  if (name == NULL)
    return NULL;
  box_t *b = PyCapsule_GetPointer(cap, name);
  if (b == NULL)
    return NULL;
  void *p = b->p, *stream = NULL;
  if (stream_obj != NULL && stream_obj != Py_None)
    stream = PyLong_AsVoidPtr(stream_obj);
  if (PyErr_Occurred())
    return NULL;
  b->p = NULL;
  if (p == NULL)
    Py_RETURN_NONE;
  int rc = 0;
  Py_BEGIN_ALLOW_THREADS
  if (name == BUF)
    rc = gpuipc_buf_release(p);
  else if (name == DOM)
    rc = gpuipc_domain_leave(p);
  else if (name == CHAN)
    rc = gpuipc_channel_close(p);
  else if (name == VIEW)
    rc = gpuipc_tensor_release(p, stream);
  else if (name == EVENT)
    rc = gpuipc_event_release(p);
  Py_END_ALLOW_THREADS
  if (rc < 0)
    return raise_code(rc);
  Py_RETURN_NONE;
}

static void *opt_ptr(PyObject *o)
{
  if (o == NULL || o == Py_None)
    return NULL;
  return PyLong_AsVoidPtr(o);
}

/* ---- library, driver, devices, topology -------------------------------- */

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

static PyObject *py_driver_status(PyObject *self, PyObject *unused)
{
  int ver = 0, rc;
  Py_BEGIN_ALLOW_THREADS
  rc = gpuipc_driver_status(&ver);
  Py_END_ALLOW_THREADS
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
  gpuipc_device_info_t d;
  memset(&d, 0, sizeof(d));
  d.size = sizeof(d);
  int rc = gpuipc_device_info(ordinal, &d);
  if (rc < 0)
    return raise_code(rc);
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
  int rc = gpuipc_device_by_uuid((const uint8_t *)uuid);
  return rc < 0 ? raise_code(rc) : PyLong_FromLong(rc);
}

static PyObject *py_device_current(PyObject *self, PyObject *unused)
{
  int rc = gpuipc__device_current();
  return rc < 0 ? raise_code(rc) : PyLong_FromLong(rc);
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
  gpuipc_p2p_t p;
  memset(&p, 0, sizeof(p));
  p.size = sizeof(p);
  int rc = gpuipc_topo_p2p(src, dst, &p);
  if (rc < 0)
    return raise_code(rc);
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
    PyObject *d = Py_BuildValue("{s:s,s:s,s:s,s:s,s:O}", "name", it.name,
                                "value", it.value, "default", it.def, "help",
                                it.help, "is_set",
                                it.is_set ? Py_True : Py_False);
    if (d == NULL || PyList_Append(list, d) < 0) {
      Py_XDECREF(d);
      Py_DECREF(list);
      return NULL;
    }
    Py_DECREF(d);
  }
  return list;
}

/* ---- domains ----------------------------------------------------------- */

static PyObject *py_domain_join(PyObject *self, PyObject *args)
{
  const char *name;
  int timeout_ms;
  unsigned flags;
  if (!PyArg_ParseTuple(args, "siI", &name, &timeout_ms, &flags))
    return NULL;
  gpuipc_domain_opts_t o = {sizeof(o), flags, timeout_ms};
  gpuipc_domain_t *dom = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = gpuipc_domain_join(name, &o, &dom);
  Py_END_ALLOW_THREADS
  if (rc < 0)
    return raise_code(rc);
  PyObject *cap = box_new(DOM, dom);
  if (cap == NULL)
    gpuipc_domain_leave(dom);
  return cap;
}

static PyObject *py_domain_info(PyObject *self, PyObject *cap)
{
  gpuipc_domain_t *dom = unbox(cap, DOM);
  if (dom == NULL)
    return NULL;
  gpuipc_domain_info_t in;
  memset(&in, 0, sizeof(in));
  in.size = sizeof(in);
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = gpuipc_domain_info(dom, &in);
  Py_END_ALLOW_THREADS
  if (rc < 0)
    return raise_code(rc);
  return Py_BuildValue("{s:s,s:i,s:O,s:K,s:i,s:i,s:i}", "name", in.name,
                       "broker_pid", in.broker_pid, "hosts_broker",
                       in.hosts_broker ? Py_True : Py_False, "epoch",
                       (unsigned long long)in.epoch, "members", in.members,
                       "segments", in.segments, "broker_fds", in.broker_fds);
}

/* ---- buffers and segments ---------------------------------------------- */

static PyObject *py_buf_alloc(PyObject *self, PyObject *args)
{
  Py_ssize_t size;
  int kind, device;
  if (!PyArg_ParseTuple(args, "nii", &size, &kind, &device))
    return NULL;
  if (size <= 0) {
    PyErr_SetString(PyExc_ValueError, "a buffer needs a size > 0");
    return NULL;
  }
  gpuipc_buf_t *buf = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = gpuipc_buf_alloc((size_t)size, (gpuipc_kind_t)kind, device, 0, &buf);
  Py_END_ALLOW_THREADS
  if (rc < 0)
    return raise_code(rc);
  PyObject *cap = box_new(BUF, buf);
  if (cap == NULL)
    gpuipc_buf_release(buf);
  return cap;
}

/* (ptr, size, kind, device, alive) of a buffer. */
static PyObject *py_buf_info(PyObject *self, PyObject *cap)
{
  gpuipc_buf_t *buf = unbox(cap, BUF);
  if (buf == NULL)
    return NULL;
  return Py_BuildValue("(Nnii)", PyLong_FromVoidPtr(gpuipc_buf_ptr(buf)),
                       (Py_ssize_t)gpuipc_buf_size(buf),
                       (int)gpuipc_buf_kind(buf), gpuipc_buf_device(buf));
}

static PyObject *py_buf_alive(PyObject *self, PyObject *cap)
{
  gpuipc_buf_t *buf = unbox(cap, BUF);
  if (buf == NULL)
    return NULL;
  int rc = gpuipc_buf_alive(buf);
  if (rc == GPUIPC_E_PEER_GONE)
    Py_RETURN_FALSE;
  if (rc < 0)
    return raise_code(rc);
  Py_RETURN_TRUE;
}

/* (packed handle bytes, fd or -1): the caller owns the fd. */
static PyObject *py_buf_export(PyObject *self, PyObject *cap)
{
  gpuipc_buf_t *buf = unbox(cap, BUF);
  if (buf == NULL)
    return NULL;
  gpuipc_handle_t h;
  int rc = gpuipc_buf_export(buf, &h);
  if (rc < 0)
    return raise_code(rc);
  char packed[GPUIPC_HANDLE_PACKED_SIZE];
  rc = gpuipc_handle_pack(&h, packed, sizeof(packed));
  if (rc < 0) {
    if (h.fd >= 0)
      close(h.fd);
    return raise_code(rc);
  }
  return Py_BuildValue("(y#i)", packed, (Py_ssize_t)rc, h.fd);
}

static PyObject *import_handle(gpuipc_handle_t *h, int device)
{
  gpuipc_buf_t *buf = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = gpuipc_buf_import(h, device, 0, &buf);
  Py_END_ALLOW_THREADS
  if (rc < 0)
    return raise_code(rc);
  PyObject *cap = box_new(BUF, buf);
  if (cap == NULL)
    gpuipc_buf_release(buf);
  return cap;
}

/* buf_import(packed, fd, device): the fd is not consumed. */
static PyObject *py_buf_import(PyObject *self, PyObject *args)
{
  const char *packed;
  Py_ssize_t n;
  int fd, device;
  if (!PyArg_ParseTuple(args, "y#ii", &packed, &n, &fd, &device))
    return NULL;
  gpuipc_handle_t h;
  int rc = gpuipc_handle_unpack(packed, (size_t)n, &h);
  if (rc < 0)
    return raise_code(rc);
  h.fd = fd;
  return import_handle(&h, device);
}

/* import_cuda_ipc(bytes, offset, size, device, exporter_pid) -> buf. */
static PyObject *py_import_cuda_ipc(PyObject *self, PyObject *args)
{
  const char *bytes;
  Py_ssize_t n, offset, size;
  int device, pid;
  if (!PyArg_ParseTuple(args, "y#nnii", &bytes, &n, &offset, &size, &device,
                        &pid))
    return NULL;
  if (offset < 0 || size < 0) {
    PyErr_SetString(PyExc_ValueError, "offset and size must be >= 0");
    return NULL;
  }
  gpuipc_handle_t h;
  int rc = gpuipc_handle_from_cuda_ipc(bytes, (size_t)n, (size_t)offset,
                                       (size_t)size, device, pid, &h);
  if (rc < 0)
    return raise_code(rc);
  return import_handle(&h, device);
}

/* import_cuda_fd(fd, offset, size, device) -> buf (fd borrowed). */
static PyObject *py_import_cuda_fd(PyObject *self, PyObject *args)
{
  int fd, device;
  Py_ssize_t offset, size;
  if (!PyArg_ParseTuple(args, "inni", &fd, &offset, &size, &device))
    return NULL;
  if (offset < 0 || size < 0) {
    PyErr_SetString(PyExc_ValueError, "offset and size must be >= 0");
    return NULL;
  }
  gpuipc_handle_t h;
  int rc = gpuipc_handle_from_cuda_fd(fd, (size_t)offset, (size_t)size,
                                      device, &h);
  if (rc < 0)
    return raise_code(rc);
  return import_handle(&h, device);
}

/* One more reference to @buf, as a new box: export and import it again
 * (importing this process's own export returns the same buffer). */
static PyObject *buf_retain(gpuipc_buf_t *buf)
{
  gpuipc_handle_t h;
  int rc = gpuipc_buf_export(buf, &h);
  if (rc < 0)
    return raise_code(rc);
  gpuipc_buf_t *again = NULL;
  rc = gpuipc_buf_import(&h, gpuipc_buf_device(buf), 0, &again);
  if (h.fd >= 0)
    close(h.fd);
  if (rc < 0)
    return raise_code(rc);
  PyObject *cap = box_new(BUF, again);
  if (cap == NULL)
    gpuipc_buf_release(again);
  return cap;
}

static PyObject *py_segment_open(PyObject *self, PyObject *args)
{
  PyObject *dcap, *stream_obj;
  const char *name;
  Py_ssize_t bytes;
  int kind, device, timeout_ms;
  unsigned flags;
  if (!PyArg_ParseTuple(args, "OsniiIiO", &dcap, &name, &bytes, &kind,
                        &device, &flags, &timeout_ms, &stream_obj))
    return NULL;
  gpuipc_domain_t *dom = unbox(dcap, DOM);
  void *stream = opt_ptr(stream_obj);
  if (dom == NULL || PyErr_Occurred())
    return NULL;
  if (bytes < 0) {
    PyErr_SetString(PyExc_ValueError, "nbytes must be >= 0");
    return NULL;
  }
  gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
  o.bytes = (size_t)bytes;
  o.kind = (gpuipc_kind_t)kind;
  o.device = device;
  o.flags = flags;
  o.timeout_ms = timeout_ms;
  o.stream = stream;
  gpuipc_buf_t *buf = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = gpuipc_segment_open(dom, name, &o, &buf);
  Py_END_ALLOW_THREADS
  if (rc < 0)
    return raise_code(rc);
  PyObject *cap = box_new(BUF, buf);
  if (cap == NULL)
    gpuipc_buf_release(buf);
  return cap;
}

static PyObject *py_segment_publish(PyObject *self, PyObject *args)
{
  PyObject *cap, *stream_obj;
  if (!PyArg_ParseTuple(args, "OO", &cap, &stream_obj))
    return NULL;
  gpuipc_buf_t *buf = unbox(cap, BUF);
  void *stream = opt_ptr(stream_obj);
  if (buf == NULL || PyErr_Occurred())
    return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = gpuipc_segment_publish(buf, stream);
  Py_END_ALLOW_THREADS
  if (rc < 0)
    return raise_code(rc);
  Py_RETURN_NONE;
}

static PyObject *py_segment_unlink(PyObject *self, PyObject *args)
{
  PyObject *dcap;
  const char *name;
  if (!PyArg_ParseTuple(args, "Os", &dcap, &name))
    return NULL;
  gpuipc_domain_t *dom = unbox(dcap, DOM);
  if (dom == NULL)
    return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = gpuipc_segment_unlink(dom, name);
  Py_END_ALLOW_THREADS
  if (rc < 0)
    return raise_code(rc);
  Py_RETURN_NONE;
}

static PyObject *seg_info_dict(const gpuipc_segment_info_t *s)
{
  int n = s->nholders < GPUIPC_SEGMENT_HOLDERS ? s->nholders
                                               : GPUIPC_SEGMENT_HOLDERS;
  PyObject *holders = PyList_New(0);
  for (int i = 0; holders != NULL && i < n; i++) {
    PyObject *t = Py_BuildValue("(ii)", s->holder_pids[i], s->holder_refs[i]);
    if (t == NULL || PyList_Append(holders, t) < 0) {
      Py_XDECREF(t);
      Py_CLEAR(holders);
    }
    Py_XDECREF(t);
  }
  if (holders == NULL)
    return NULL;
  return Py_BuildValue("{s:s,s:K,s:K,s:s,s:y#,s:s,s:O,s:i,s:N,s:O,s:i}",
                       "name", s->name, "id", (unsigned long long)s->id,
                       "nbytes", (unsigned long long)s->bytes, "kind",
                       gpuipc_kind_name(s->kind), "device_uuid",
                       (const char *)s->device_uuid, (Py_ssize_t)16, "state",
                       gpuipc_segment_state_name(s->state), "broker_fd",
                       s->broker_fd ? Py_True : Py_False, "nholders",
                       s->nholders, "holders", holders, "creator_held",
                       s->creator_held ? Py_True : Py_False, "keeper_pid",
                       s->keeper_pid);
}

static PyObject *py_segment_stat(PyObject *self, PyObject *args)
{
  PyObject *dcap;
  const char *name;
  if (!PyArg_ParseTuple(args, "Os", &dcap, &name))
    return NULL;
  gpuipc_domain_t *dom = unbox(dcap, DOM);
  if (dom == NULL)
    return NULL;
  gpuipc_segment_info_t s;
  memset(&s, 0, sizeof(s));
  s.size = sizeof(s);
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = gpuipc_segment_stat(dom, name, &s);
  Py_END_ALLOW_THREADS
  return rc < 0 ? raise_code(rc) : seg_info_dict(&s);
}

static PyObject *py_segment_list(PyObject *self, PyObject *dcap)
{
  gpuipc_domain_t *dom = unbox(dcap, DOM);
  if (dom == NULL)
    return NULL;
  int cap = 64, rc;
  gpuipc_segment_info_t *v = NULL;
  for (;;) {
    free(v);
    v = calloc((size_t)cap, sizeof(*v));
    if (v == NULL)
      return PyErr_NoMemory();
    for (int i = 0; i < cap; i++)
      v[i].size = sizeof(*v);
    Py_BEGIN_ALLOW_THREADS
    rc = gpuipc_segment_list(dom, v, cap);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
      free(v);
      return raise_code(rc);
    }
    if (rc <= cap)
      break;
    cap = rc + 16;
  }
  PyObject *list = PyList_New(0);
  for (int i = 0; list != NULL && i < rc; i++) {
    PyObject *d = seg_info_dict(&v[i]);
    if (d == NULL || PyList_Append(list, d) < 0)
      Py_CLEAR(list);
    Py_XDECREF(d);
  }
  free(v);
  return list;
}

/* ---- tensor descriptions ----------------------------------------------- */

/*
 * A tensor crosses into C as a tuple
 *   (data, device_type, device_id, (code, bits, lanes), shape, strides|None,
 *    byte_offset)
 * with shape and strides (in elements) as tuples of ints.
 */
typedef struct desc {
  gpuipc_tensor_t t;
  int64_t shape[GPUIPC_TENSOR_MAX_DIMS];
  int64_t strides[GPUIPC_TENSOR_MAX_DIMS];
} desc_t;

static int int64_tuple(PyObject *seq, int64_t *out, int cap, const char *what)
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
    PyObject *k = PyLong_FromSsize_t(i);
    PyObject *o = k != NULL ? PyObject_GetItem(seq, k) : NULL;
    Py_XDECREF(k);
    if (o == NULL)
      return -1;
    out[i] = PyLong_AsLongLong(o);
    Py_DECREF(o);
    if (out[i] == -1 && PyErr_Occurred())
      return -1;
  }
  return (int)n;
}

static int parse_desc(PyObject *tup, desc_t *d)
{
  PyObject *data, *shape, *strides;
  int dtype_code, bits, lanes;
  unsigned long long off;
  memset(d, 0, sizeof(*d));
  if (!PyArg_ParseTuple(tup, "Oii(iii)OOK;tensor description", &data,
                        &d->t.dl.device.device_type, &d->t.dl.device.device_id,
                        &dtype_code, &bits, &lanes, &shape, &strides, &off))
    return -1;
  d->t.dl.data = PyLong_AsVoidPtr(data);
  if (PyErr_Occurred())
    return -1;
  d->t.dl.dtype.code = (uint8_t)dtype_code;
  d->t.dl.dtype.bits = (uint8_t)bits;
  d->t.dl.dtype.lanes = (uint16_t)lanes;
  int nd = int64_tuple(shape, d->shape, GPUIPC_TENSOR_MAX_DIMS, "shape");
  if (nd < 0)
    return -1;
  d->t.dl.ndim = nd;
  d->t.dl.shape = d->shape;
  if (strides != Py_None) {
    int ns = int64_tuple(strides, d->strides, GPUIPC_TENSOR_MAX_DIMS,
                         "strides");
    if (ns < 0)
      return -1;
    if (ns != nd) {
      PyErr_SetString(PyExc_ValueError, "strides and shape differ in length");
      return -1;
    }
    d->t.dl.strides = d->strides;
  }
  d->t.dl.byte_offset = off;
  return 0;
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
static PyObject *dl_desc(const gpuipc_dl_tensor_t *dl)
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

/*
 * dlpack_take(capsule) -> (description, holder): consume a producer's
 * DLPack capsule (renamed "used_dltensor" as the protocol asks); the
 * producer's deleter runs when the holder goes.
 */
static PyObject *py_dlpack_take(PyObject *self, PyObject *cap)
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
  PyObject *desc = dl_desc(dl);
  if (desc == NULL)
    return NULL;
  dl_hold_t *h = malloc(sizeof(*h));
  if (h == NULL) {
    Py_DECREF(desc);
    return PyErr_NoMemory();
  }
  h->managed = m;
  h->versioned = versioned;
  PyObject *hold = PyCapsule_New(h, "gpuipc.dlhold", dl_hold_destroy);
  if (hold == NULL) {
    free(h);
    Py_DECREF(desc);
    return NULL;
  }
  PyCapsule_SetName(cap, versioned ? "used_dltensor_versioned"
                                   : "used_dltensor");
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
  PyObject *owner, *tup, *data, *shape, *strides;
  int devtype, devid, code, bits, lanes;
  unsigned long long off;
  if (!PyArg_ParseTuple(args, "OO", &owner, &tup) ||
      !PyArg_ParseTuple(tup, "Oii(iii)OOK", &data, &devtype, &devid, &code,
                        &bits, &lanes, &shape, &strides, &off))
    return NULL;
  owned_dl_t *o = calloc(1, sizeof(*o));
  if (o == NULL)
    return PyErr_NoMemory();
  int nd = int64_tuple(shape, o->shape, 32, "shape");
  int ns = strides == Py_None ? nd : int64_tuple(strides, o->strides, 32,
                                                 "strides");
  o->m.dl_tensor.data = PyLong_AsVoidPtr(data);
  if (nd < 0 || ns != nd || PyErr_Occurred()) {
    if (!PyErr_Occurred())
      PyErr_SetString(PyExc_ValueError, "strides and shape differ in length");
    free(o);
    return NULL;
  }
  o->m.dl_tensor.device.device_type = devtype;
  o->m.dl_tensor.device.device_id = devid;
  o->m.dl_tensor.ndim = nd;
  o->m.dl_tensor.dtype.code = (uint8_t)code;
  o->m.dl_tensor.dtype.bits = (uint8_t)bits;
  o->m.dl_tensor.dtype.lanes = (uint16_t)lanes;
  o->m.dl_tensor.shape = o->shape;
  o->m.dl_tensor.strides = strides == Py_None ? NULL : o->strides;
  o->m.dl_tensor.byte_offset = off;
  o->m.manager_ctx = o;
  o->m.deleter = owned_dl_delete;
  Py_INCREF(owner);
  o->owner = owner;
  PyObject *cap = PyCapsule_New(&o->m, "dltensor", dlpack_capsule_destroy);
  if (cap == NULL) {
    Py_DECREF(owner);
    free(o);
  }
  return cap;
}

/* ---- channels ---------------------------------------------------------- */

static PyObject *py_channel_open(PyObject *self, PyObject *args)
{
  PyObject *dcap;
  const char *name;
  int timeout_ms, device, device_set, send_timeout_ms;
  unsigned depth, stage_slots;
  Py_ssize_t stage_slot_bytes;
  if (!PyArg_ParseTuple(args, "OsiIiiiIn", &dcap, &name, &timeout_ms, &depth,
                        &device, &device_set, &send_timeout_ms, &stage_slots,
                        &stage_slot_bytes))
    return NULL;
  gpuipc_domain_t *dom = unbox(dcap, DOM);
  if (dom == NULL)
    return NULL;
  gpuipc_channel_opts_t o;
  memset(&o, 0, sizeof(o));
  o.size = sizeof(o);
  o.timeout_ms = timeout_ms;
  o.depth = depth;
  o.device = device;
  o.device_set = device_set;
  o.send_timeout_ms = send_timeout_ms;
  o.stage_slots = stage_slots;
  o.stage_slot_bytes = stage_slot_bytes < 0 ? 0 : (size_t)stage_slot_bytes;
  gpuipc_channel_t *ch = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = gpuipc_channel_open(dom, name, &o, &ch);
  Py_END_ALLOW_THREADS
  if (rc < 0)
    return raise_code(rc);
  PyObject *cap = box_new(CHAN, ch);
  if (cap == NULL)
    gpuipc_channel_close(ch);
  return cap;
}

/* channel_send(ch, buf|None, description, stream, flags) -> ticket */
static PyObject *py_channel_send(PyObject *self, PyObject *args)
{
  PyObject *ccap, *bcap, *tup, *stream_obj;
  unsigned flags;
  if (!PyArg_ParseTuple(args, "OOOOI", &ccap, &bcap, &tup, &stream_obj,
                        &flags))
    return NULL;
  gpuipc_channel_t *ch = unbox(ccap, CHAN);
  if (ch == NULL)
    return NULL;
  desc_t d;
  if (parse_desc(tup, &d) < 0)
    return NULL;
  if (bcap != Py_None && (d.t.buf = unbox(bcap, BUF)) == NULL)
    return NULL;
  void *stream = opt_ptr(stream_obj);
  if (PyErr_Occurred())
    return NULL;
  uint64_t ticket = 0;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = gpuipc_channel_send(ch, &d.t, stream, flags, &ticket);
  Py_END_ALLOW_THREADS
  if (rc < 0)
    return raise_code(rc);
  return PyLong_FromUnsignedLongLong(ticket);
}

/* channel_send_done(ch, ticket, timeout_ms) -> bool (False: -EAGAIN). */
static PyObject *py_channel_send_done(PyObject *self, PyObject *args)
{
  PyObject *ccap;
  unsigned long long ticket;
  int timeout_ms;
  if (!PyArg_ParseTuple(args, "OKi", &ccap, &ticket, &timeout_ms))
    return NULL;
  gpuipc_channel_t *ch = unbox(ccap, CHAN);
  if (ch == NULL)
    return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = gpuipc_channel_send_done(ch, ticket, timeout_ms);
  Py_END_ALLOW_THREADS
  if (rc == -EAGAIN && timeout_ms == 0)
    Py_RETURN_FALSE;
  if (rc < 0)
    return raise_code(rc);
  Py_RETURN_TRUE;
}

static PyObject *py_channel_send_wait(PyObject *self, PyObject *args)
{
  PyObject *ccap, *stream_obj;
  unsigned long long ticket;
  int timeout_ms;
  if (!PyArg_ParseTuple(args, "OKOi", &ccap, &ticket, &stream_obj,
                        &timeout_ms))
    return NULL;
  gpuipc_channel_t *ch = unbox(ccap, CHAN);
  void *stream = opt_ptr(stream_obj);
  if (ch == NULL || PyErr_Occurred())
    return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = gpuipc_channel_send_wait(ch, ticket, stream, timeout_ms);
  Py_END_ALLOW_THREADS
  if (rc < 0)
    return raise_code(rc);
  Py_RETURN_NONE;
}

static PyObject *py_channel_progress(PyObject *self, PyObject *ccap)
{
  gpuipc_channel_t *ch = unbox(ccap, CHAN);
  if (ch == NULL)
    return NULL;
  int rc = gpuipc_channel_progress(ch);
  return rc < 0 ? raise_code(rc) : PyLong_FromLong(rc);
}

/* channel_recv(ch, stream, timeout_ms) -> view box */
static PyObject *py_channel_recv(PyObject *self, PyObject *args)
{
  PyObject *ccap, *stream_obj;
  int timeout_ms;
  if (!PyArg_ParseTuple(args, "OOi", &ccap, &stream_obj, &timeout_ms))
    return NULL;
  gpuipc_channel_t *ch = unbox(ccap, CHAN);
  void *stream = opt_ptr(stream_obj);
  if (ch == NULL || PyErr_Occurred())
    return NULL;
  gpuipc_tensor_t *view = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = gpuipc_channel_recv(ch, &view, stream, timeout_ms);
  Py_END_ALLOW_THREADS
  if (rc < 0)
    return raise_code(rc);
  PyObject *cap = box_new(VIEW, view);
  if (cap == NULL)
    gpuipc_tensor_release(view, stream);
  return cap;
}

static PyObject *py_channel_recv_into(PyObject *self, PyObject *args)
{
  PyObject *ccap, *tup, *stream_obj;
  int timeout_ms;
  if (!PyArg_ParseTuple(args, "OOOi", &ccap, &tup, &stream_obj, &timeout_ms))
    return NULL;
  gpuipc_channel_t *ch = unbox(ccap, CHAN);
  if (ch == NULL)
    return NULL;
  desc_t d;
  if (parse_desc(tup, &d) < 0)
    return NULL;
  void *stream = opt_ptr(stream_obj);
  if (PyErr_Occurred())
    return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = gpuipc_channel_recv_into(ch, &d.t, stream, timeout_ms);
  Py_END_ALLOW_THREADS
  if (rc < 0)
    return raise_code(rc);
  Py_RETURN_NONE;
}

static PyObject *py_channel_info(PyObject *self, PyObject *ccap)
{
  gpuipc_channel_t *ch = unbox(ccap, CHAN);
  if (ch == NULL)
    return NULL;
  gpuipc_channel_info_t in;
  memset(&in, 0, sizeof(in));
  in.size = sizeof(in);
  int rc = gpuipc_channel_info(ch, &in);
  if (rc < 0)
    return raise_code(rc);
  return Py_BuildValue(
      "{s:s,s:i,s:i,s:I,s:I,s:K,s:K,s:K,s:K,s:K,s:K,s:O}", "name", in.name,
      "end", in.end, "peer_pid", in.peer_pid, "depth", in.depth, "peer_depth",
      in.peer_depth, "sent", (unsigned long long)in.sent, "in_flight",
      (unsigned long long)in.in_flight, "received",
      (unsigned long long)in.received, "views", (unsigned long long)in.views,
      "buffers_sent", (unsigned long long)in.buffers_sent,
      "buffers_imported", (unsigned long long)in.buffers_imported,
      "peer_gone", in.peer_gone ? Py_True : Py_False);
}

/* view_info(view) -> (description, buffer box with one more reference) */
static PyObject *py_view_info(PyObject *self, PyObject *vcap)
{
  gpuipc_tensor_t *v = unbox(vcap, VIEW);
  if (v == NULL)
    return NULL;
  PyObject *desc = dl_desc(&v->dl);
  if (desc == NULL)
    return NULL;
  return Py_BuildValue("(NNnii)", desc, PyLong_FromVoidPtr(gpuipc_buf_ptr(v->buf)),
                       (Py_ssize_t)gpuipc_buf_size(v->buf),
                       (int)gpuipc_buf_kind(v->buf), gpuipc_buf_device(v->buf));
}

/* view_to_dlpack(view, stream) -> "dltensor" capsule owning the view. */
static PyObject *py_view_to_dlpack(PyObject *self, PyObject *args)
{
  PyObject *vcap, *stream_obj;
  if (!PyArg_ParseTuple(args, "OO", &vcap, &stream_obj))
    return NULL;
  gpuipc_tensor_t *v = unbox(vcap, VIEW);
  void *stream = opt_ptr(stream_obj);
  if (v == NULL || PyErr_Occurred())
    return NULL;
  gpuipc_dl_managed_tensor_t *m = NULL;
  int rc = gpuipc_tensor_to_dlpack_stream(v, stream, &m);
  if (rc < 0)
    return raise_code(rc);
  unbox_take(vcap, VIEW); /* the capsule owns it now */
  /* Some consumers (PyTorch before 2.x, older CuPy) ignore byte_offset:
   * hand over the element's own address instead. The deleter finds the
   * view through manager_ctx, not data. */
  m->dl_tensor.data = (char *)m->dl_tensor.data + m->dl_tensor.byte_offset;
  m->dl_tensor.byte_offset = 0;
  PyObject *cap = PyCapsule_New(m, "dltensor", dlpack_capsule_destroy);
  if (cap == NULL)
    m->deleter(m);
  return cap;
}

/* ---- events ------------------------------------------------------------ */

static PyObject *py_event_create(PyObject *self, PyObject *args)
{
  int device;
  if (!PyArg_ParseTuple(args, "i", &device))
    return NULL;
  gpuipc_event_t *ev = NULL;
  int rc = gpuipc_event_create(device, 0, &ev);
  if (rc < 0)
    return raise_code(rc);
  PyObject *cap = box_new(EVENT, ev);
  if (cap == NULL)
    gpuipc_event_release(ev);
  return cap;
}

static PyObject *py_event_export(PyObject *self, PyObject *cap)
{
  gpuipc_event_t *ev = unbox(cap, EVENT);
  if (ev == NULL)
    return NULL;
  gpuipc_event_handle_t h;
  char packed[GPUIPC_EVENT_HANDLE_PACKED_SIZE];
  int rc = gpuipc_event_export(ev, &h);
  if (rc >= 0)
    rc = gpuipc_event_handle_pack(&h, packed, sizeof(packed));
  if (rc < 0)
    return raise_code(rc);
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
  if (rc < 0)
    return raise_code(rc);
  PyObject *cap = box_new(EVENT, ev);
  if (cap == NULL)
    gpuipc_event_release(ev);
  return cap;
}

/* event_op(ev, op, stream): 0 record, 1 wait, 2 query (bool), 3 sync. */
static PyObject *py_event_op(PyObject *self, PyObject *args)
{
  PyObject *cap, *stream_obj;
  int op;
  if (!PyArg_ParseTuple(args, "OiO", &cap, &op, &stream_obj))
    return NULL;
  gpuipc_event_t *ev = unbox(cap, EVENT);
  void *stream = opt_ptr(stream_obj);
  if (ev == NULL || PyErr_Occurred())
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
    return raise_code(rc);
  Py_RETURN_TRUE;
}

/* ---- copies ------------------------------------------------------------ */

static PyObject *py_memcpy(PyObject *self, PyObject *args)
{
  PyObject *dst_obj, *src_obj, *stream_obj;
  Py_ssize_t n;
  int device;
  if (!PyArg_ParseTuple(args, "OOniO", &dst_obj, &src_obj, &n, &device,
                        &stream_obj))
    return NULL;
  void *dst = PyLong_AsVoidPtr(dst_obj), *src = PyLong_AsVoidPtr(src_obj);
  void *stream = opt_ptr(stream_obj);
  if (PyErr_Occurred())
    return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = gpuipc_memcpy(dst, src, (size_t)n, device, stream);
  Py_END_ALLOW_THREADS
  if (rc < 0)
    return raise_code(rc);
  Py_RETURN_NONE;
}

/* ---- PyTorch's pluggable allocator ------------------------------------- */

/*
 * torch.cuda.memory.CUDAPluggableAllocator(path_of_this_module,
 * "gpuipc_torch_malloc", "gpuipc_torch_free"): every block PyTorch's
 * caching allocator asks for is a gpuipc VMM buffer, so a tensor in it can
 * be sent with no copy (alloc_lookup finds its buffer).
 */
typedef struct alloc_entry {
  uintptr_t ptr;
  size_t size;
  gpuipc_buf_t *buf;
} alloc_entry_t;

static pthread_mutex_t alloc_lock = PTHREAD_MUTEX_INITIALIZER;
static alloc_entry_t *allocs;
static size_t nallocs, cap_allocs;
static int alloc_kind = GPUIPC_KIND_VMM;

EXPORT void *gpuipc_torch_malloc(ssize_t size, int device, void *stream);
EXPORT void gpuipc_torch_free(void *ptr, ssize_t size, int device,
                              void *stream);

EXPORT void *gpuipc_torch_malloc(ssize_t size, int device, void *stream)
{
  gpuipc_buf_t *buf = NULL;
  if (size <= 0 ||
      gpuipc_buf_alloc((size_t)size, (gpuipc_kind_t)alloc_kind, device, 0,
                       &buf) < 0)
    return NULL;
  pthread_mutex_lock(&alloc_lock);
  if (nallocs == cap_allocs) {
    size_t ncap = cap_allocs ? cap_allocs * 2 : 64;
    alloc_entry_t *n = realloc(allocs, ncap * sizeof(*n));
    if (n == NULL) {
      pthread_mutex_unlock(&alloc_lock);
      gpuipc_buf_release(buf);
      return NULL;
    }
    allocs = n;
    cap_allocs = ncap;
  }
  allocs[nallocs].ptr = (uintptr_t)gpuipc_buf_ptr(buf);
  allocs[nallocs].size = (size_t)size;
  allocs[nallocs].buf = buf;
  nallocs++;
  pthread_mutex_unlock(&alloc_lock);
  return gpuipc_buf_ptr(buf);
}

EXPORT void gpuipc_torch_free(void *ptr, ssize_t size, int device,
                              void *stream)
{
  gpuipc_buf_t *buf = NULL;
  pthread_mutex_lock(&alloc_lock);
  for (size_t i = 0; i < nallocs; i++) {
    if (allocs[i].ptr == (uintptr_t)ptr) {
      buf = allocs[i].buf;
      allocs[i] = allocs[--nallocs];
      break;
    }
  }
  pthread_mutex_unlock(&alloc_lock);
  if (buf != NULL) {
    /* A pluggable allocator's free is stream-ordered: PyTorch calls it as
     * soon as the tensor goes, with kernels that use the block possibly
     * still queued on @stream. Unmapping then would fault them, so the
     * stream's work ends first. (The receivers keep their own mappings.) */
    gpuipc__stream_sync(device, stream);
    gpuipc_buf_release(buf);
  }
}

/* alloc_lookup(ptr) -> buffer box holding @ptr (one more reference), or
 * None when the allocator did not make it. */
static PyObject *py_alloc_lookup(PyObject *self, PyObject *p)
{
  uintptr_t ptr = (uintptr_t)PyLong_AsVoidPtr(p);
  if (PyErr_Occurred())
    return NULL;
  gpuipc_buf_t *buf = NULL;
  pthread_mutex_lock(&alloc_lock);
  for (size_t i = 0; i < nallocs && buf == NULL; i++)
    if (ptr >= allocs[i].ptr && ptr < allocs[i].ptr + allocs[i].size)
      buf = allocs[i].buf;
  PyObject *r = NULL;
  if (buf == NULL) {
    pthread_mutex_unlock(&alloc_lock);
    Py_RETURN_NONE;
  }
  r = buf_retain(buf); /* under the lock: a free cannot race it */
  pthread_mutex_unlock(&alloc_lock);
  return r;
}

static PyObject *py_alloc_set_kind(PyObject *self, PyObject *args)
{
  int kind;
  if (!PyArg_ParseTuple(args, "i", &kind))
    return NULL;
  alloc_kind = kind;
  Py_RETURN_NONE;
}

/* ---- the module -------------------------------------------------------- */

#define M(name, flags) {#name, (PyCFunction)py_##name, flags, NULL}
static PyMethodDef methods[] = {
    M(set_error_factory, METH_O), M(err_name, METH_VARARGS),
    M(strerror, METH_VARARGS), M(last_error, METH_NOARGS),
    M(version, METH_NOARGS), M(driver_status, METH_NOARGS),
    M(device_count, METH_NOARGS), M(device_info, METH_VARARGS),
    M(device_by_uuid, METH_VARARGS), M(device_current, METH_NOARGS),
    M(kind_available, METH_VARARGS), M(topo_p2p, METH_VARARGS),
    M(config, METH_NOARGS), M(close, METH_VARARGS),
    M(domain_join, METH_VARARGS), M(domain_info, METH_O),
    M(buf_alloc, METH_VARARGS), M(buf_info, METH_O),
    M(buf_alive, METH_O), M(buf_export, METH_O),
    M(buf_import, METH_VARARGS), M(import_cuda_ipc, METH_VARARGS),
    M(import_cuda_fd, METH_VARARGS), M(segment_open, METH_VARARGS),
    M(segment_publish, METH_VARARGS), M(segment_unlink, METH_VARARGS),
    M(segment_stat, METH_VARARGS), M(segment_list, METH_O),
    M(dlpack_take, METH_O), M(dlpack_of, METH_VARARGS),
    M(channel_open, METH_VARARGS), M(channel_send, METH_VARARGS),
    M(channel_send_done, METH_VARARGS), M(channel_send_wait, METH_VARARGS),
    M(channel_progress, METH_O), M(channel_recv, METH_VARARGS),
    M(channel_recv_into, METH_VARARGS), M(channel_info, METH_O),
    M(view_info, METH_O), M(view_to_dlpack, METH_VARARGS),
    M(event_create, METH_VARARGS), M(event_export, METH_O),
    M(event_import, METH_VARARGS), M(event_op, METH_VARARGS),
    M(memcpy, METH_VARARGS), M(alloc_lookup, METH_O),
    M(alloc_set_kind, METH_VARARGS), {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gpuipc",
                                    "gpuipc's C binding (use the gpuipc "
                                    "package)",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__gpuipc(void);
PyMODINIT_FUNC PyInit__gpuipc(void)
{
  PyObject *m = PyModule_Create(&module);
  if (m == NULL)
    return NULL;
  PyModule_AddIntConstant(m, "TIMEOUT_FOREVER", GPUIPC_TIMEOUT_FOREVER);
  PyModule_AddIntConstant(m, "TIMEOUT_DEFAULT", GPUIPC_TIMEOUT_DEFAULT);
  PyModule_AddIntConstant(m, "CREATE", GPUIPC_CREATE);
  PyModule_AddIntConstant(m, "EXCL", GPUIPC_EXCL);
  PyModule_AddIntConstant(m, "WAIT", GPUIPC_WAIT);
  PyModule_AddIntConstant(m, "SCRATCH", GPUIPC_SCRATCH);
  PyModule_AddIntConstant(m, "SEND_NONBLOCK", GPUIPC_SEND_NONBLOCK);
  PyModule_AddIntConstant(m, "JOIN_NO_BROKER", GPUIPC_JOIN_NO_BROKER);
  PyModule_AddIntConstant(m, "HAVE_CUDA", GPUIPC_HAVE_CUDA);
#define GPUIPC__PY_ERR(name, code, msg) \
  PyModule_AddIntConstant(m, "E_" #name, code);
  GPUIPC_ERRNO_MAP(GPUIPC__PY_ERR)
#undef GPUIPC__PY_ERR
  return m;
}
