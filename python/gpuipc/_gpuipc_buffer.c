/*
 * _gpuipc_buffer.c - gpuipc._gpuipc's functions for domains, buffers and
 * the named segments of a domain: joining, allocating, exporting and
 * importing (gpuipc handles, and CUDA IPC handles or fds made elsewhere),
 * and the segment calls. Buffers travel as "gpuipc.buf" boxes, domains as
 * "gpuipc.domain" boxes (_gpuipc.c). The Python classes are in
 * gpuipc/_buffer.py and gpuipc/_domain.py. See _gpuipc.h.
 */
#include "_gpuipc.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

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
  GPUIPC__PY_NOGIL(rc = gpuipc_domain_join(name, &o, &dom));
  return gpuipc__py_box(rc, gpuipc__py_DOM, dom);
}

static PyObject *py_domain_info(PyObject *self, PyObject *cap)
{
  gpuipc_domain_t *dom = gpuipc__py_unbox(cap, gpuipc__py_DOM);
  if (dom == NULL)
    return NULL;
  gpuipc_domain_info_t in = {.size = sizeof(in)};
  int rc;
  GPUIPC__PY_NOGIL(rc = gpuipc_domain_info(dom, &in));
  if (rc < 0)
    return gpuipc__py_raise(rc);
  return Py_BuildValue("{s:s,s:i,s:O,s:K,s:i,s:i,s:i}", "name", in.name,
                       "broker_pid", in.broker_pid, "hosts_broker",
                       in.hosts_broker ? Py_True : Py_False, "epoch",
                       (unsigned long long)in.epoch, "members", in.members,
                       "segments", in.segments, "broker_fds", in.broker_fds);
}

/* ---- buffers ----------------------------------------------------------- */

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
  GPUIPC__PY_NOGIL(rc = gpuipc_buf_alloc((size_t)size, (gpuipc_kind_t)kind,
                                         device, 0, &buf));
  return gpuipc__py_box(rc, gpuipc__py_BUF, buf);
}

/* (ptr, size, kind, device, alive) of a buffer. */
static PyObject *py_buf_info(PyObject *self, PyObject *cap)
{
  gpuipc_buf_t *buf = gpuipc__py_unbox(cap, gpuipc__py_BUF);
  if (buf == NULL)
    return NULL;
  return Py_BuildValue("(Nnii)", PyLong_FromVoidPtr(gpuipc_buf_ptr(buf)),
                       (Py_ssize_t)gpuipc_buf_size(buf),
                       (int)gpuipc_buf_kind(buf), gpuipc_buf_device(buf));
}

static PyObject *py_buf_alive(PyObject *self, PyObject *cap)
{
  gpuipc_buf_t *buf = gpuipc__py_unbox(cap, gpuipc__py_BUF);
  if (buf == NULL)
    return NULL;
  int rc = gpuipc_buf_alive(buf);
  if (rc == GPUIPC_E_PEER_GONE)
    Py_RETURN_FALSE;
  if (rc < 0)
    return gpuipc__py_raise(rc);
  Py_RETURN_TRUE;
}

/* (packed handle bytes, fd or -1): the caller owns the fd. */
static PyObject *py_buf_export(PyObject *self, PyObject *cap)
{
  gpuipc_buf_t *buf = gpuipc__py_unbox(cap, gpuipc__py_BUF);
  if (buf == NULL)
    return NULL;
  gpuipc_handle_t h;
  int rc = gpuipc_buf_export(buf, &h);
  if (rc < 0)
    return gpuipc__py_raise(rc);
  char packed[GPUIPC_HANDLE_PACKED_SIZE];
  rc = gpuipc_handle_pack(&h, packed, sizeof(packed));
  if (rc < 0) {
    if (h.fd >= 0)
      close(h.fd);
    return gpuipc__py_raise(rc);
  }
  return Py_BuildValue("(y#i)", packed, (Py_ssize_t)rc, h.fd);
}

/* A box for the buffer that handle @h (made by the caller, @rc its
 * status) maps on @device. */
static PyObject *import_handle(int rc, gpuipc_handle_t *h, int device)
{
  if (rc < 0)
    return gpuipc__py_raise(rc);
  gpuipc_buf_t *buf = NULL;
  GPUIPC__PY_NOGIL(rc = gpuipc_buf_import(h, device, 0, &buf));
  return gpuipc__py_box(rc, gpuipc__py_BUF, buf);
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
  h.fd = fd;
  return import_handle(rc, &h, device);
}

static int check_range(Py_ssize_t offset, Py_ssize_t size)
{
  if (offset >= 0 && size >= 0)
    return 0;
  PyErr_SetString(PyExc_ValueError, "offset and size must be >= 0");
  return -1;
}

/* import_cuda_ipc(bytes, offset, size, device, exporter_pid) -> buf. */
static PyObject *py_import_cuda_ipc(PyObject *self, PyObject *args)
{
  const char *bytes;
  Py_ssize_t n, offset, size;
  int device, pid;
  if (!PyArg_ParseTuple(args, "y#nnii", &bytes, &n, &offset, &size, &device,
                        &pid) ||
      check_range(offset, size) < 0)
    return NULL;
  gpuipc_handle_t h;
  int rc = gpuipc_handle_from_cuda_ipc(bytes, (size_t)n, (size_t)offset,
                                       (size_t)size, device, pid, &h);
  return import_handle(rc, &h, device);
}

/* import_cuda_fd(fd, offset, size, device) -> buf (fd borrowed). */
static PyObject *py_import_cuda_fd(PyObject *self, PyObject *args)
{
  int fd, device;
  Py_ssize_t offset, size;
  if (!PyArg_ParseTuple(args, "inni", &fd, &offset, &size, &device) ||
      check_range(offset, size) < 0)
    return NULL;
  gpuipc_handle_t h;
  int rc = gpuipc_handle_from_cuda_fd(fd, (size_t)offset, (size_t)size,
                                      device, &h);
  return import_handle(rc, &h, device);
}

/* One more reference to @buf (which the caller holds), as a new box. */
PyObject *gpuipc__py_buf_retain(gpuipc_buf_t *buf)
{
  int rc = gpuipc_buf_retain(buf);
  return gpuipc__py_box(rc, gpuipc__py_BUF, rc == 0 ? buf : NULL);
}

/* buf_retain(box) -> a new box holding one more reference to the buffer:
 * what keeps its memory mapped for an array made from it. */
static PyObject *py_buf_retain(PyObject *self, PyObject *cap)
{
  gpuipc_buf_t *buf = gpuipc__py_unbox(cap, gpuipc__py_BUF);
  if (buf == NULL)
    return NULL;
  return gpuipc__py_buf_retain(buf);
}

/* ---- segments ---------------------------------------------------------- */

static PyObject *py_segment_open(PyObject *self, PyObject *args)
{
  gpuipc_domain_t *dom;
  const char *name;
  Py_ssize_t bytes;
  int kind, device, timeout_ms;
  unsigned flags;
  void *stream;
  gpuipc_buf_t *own = NULL;
  if (!PyArg_ParseTuple(args, "O&sniiIiO&|O&", gpuipc__py_domain, &dom, &name,
                        &bytes, &kind, &device, &flags, &timeout_ms,
                        gpuipc__py_stream, &stream, gpuipc__py_opt_buf, &own))
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
  o.buf = own;
  gpuipc_buf_t *buf = NULL;
  int rc;
  GPUIPC__PY_NOGIL(rc = gpuipc_segment_open(dom, name, &o, &buf));
  return gpuipc__py_box(rc, gpuipc__py_BUF, buf);
}

static PyObject *py_segment_publish(PyObject *self, PyObject *args)
{
  gpuipc_buf_t *buf;
  void *stream;
  if (!PyArg_ParseTuple(args, "O&O&", gpuipc__py_buf, &buf, gpuipc__py_stream,
                        &stream))
    return NULL;
  int rc;
  GPUIPC__PY_NOGIL(rc = gpuipc_segment_publish(buf, stream));
  return gpuipc__py_none(rc);
}

static PyObject *py_segment_unlink(PyObject *self, PyObject *args)
{
  gpuipc_domain_t *dom;
  const char *name;
  if (!PyArg_ParseTuple(args, "O&s", gpuipc__py_domain, &dom, &name))
    return NULL;
  int rc;
  GPUIPC__PY_NOGIL(rc = gpuipc_segment_unlink(dom, name));
  return gpuipc__py_none(rc);
}

static PyObject *seg_info_dict(const gpuipc_segment_info_t *s)
{
  int n = s->nholders < GPUIPC_SEGMENT_HOLDERS ? s->nholders
                                               : GPUIPC_SEGMENT_HOLDERS;
  PyObject *holders = PyList_New(0);
  for (int i = 0; holders != NULL && i < n; i++)
    gpuipc__py_append(&holders, Py_BuildValue("(ii)", s->holder_pids[i],
                                              s->holder_refs[i]));
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
  gpuipc_domain_t *dom;
  const char *name;
  if (!PyArg_ParseTuple(args, "O&s", gpuipc__py_domain, &dom, &name))
    return NULL;
  gpuipc_segment_info_t s = {.size = sizeof(s)};
  int rc;
  GPUIPC__PY_NOGIL(rc = gpuipc_segment_stat(dom, name, &s));
  return rc < 0 ? gpuipc__py_raise(rc) : seg_info_dict(&s);
}

/* The segments of @dom in @*v (allocated here, grown until all fit);
 * their count, or the library's code. */
static int list_segments(gpuipc_domain_t *dom, gpuipc_segment_info_t **v)
{
  int cap = 64, rc;
  for (;;) {
    free(*v);
    *v = calloc((size_t)cap, sizeof(**v));
    if (*v == NULL)
      return -ENOMEM;
    for (int i = 0; i < cap; i++)
      (*v)[i].size = sizeof(**v);
    GPUIPC__PY_NOGIL(rc = gpuipc_segment_list(dom, *v, cap));
    if (rc < 0 || rc <= cap)
      return rc;
    cap = rc + 16;
  }
}

static PyObject *py_segment_list(PyObject *self, PyObject *dcap)
{
  gpuipc_domain_t *dom = gpuipc__py_unbox(dcap, gpuipc__py_DOM);
  if (dom == NULL)
    return NULL;
  gpuipc_segment_info_t *v = NULL;
  int rc = list_segments(dom, &v);
  if (rc == -ENOMEM && v == NULL)
    return PyErr_NoMemory();
  if (rc < 0) {
    free(v);
    return gpuipc__py_raise(rc);
  }
  PyObject *list = PyList_New(0);
  for (int i = 0; list != NULL && i < rc; i++)
    gpuipc__py_append(&list, seg_info_dict(&v[i]));
  free(v);
  return list;
}

PyMethodDef gpuipc__py_buffer_methods[] = {
    GPUIPC__PY_FN(domain_join, METH_VARARGS),
    GPUIPC__PY_FN(domain_info, METH_O),
    GPUIPC__PY_FN(buf_alloc, METH_VARARGS),
    GPUIPC__PY_FN(buf_info, METH_O),
    GPUIPC__PY_FN(buf_alive, METH_O),
    GPUIPC__PY_FN(buf_export, METH_O),
    GPUIPC__PY_FN(buf_retain, METH_O),
    GPUIPC__PY_FN(buf_import, METH_VARARGS),
    GPUIPC__PY_FN(import_cuda_ipc, METH_VARARGS),
    GPUIPC__PY_FN(import_cuda_fd, METH_VARARGS),
    GPUIPC__PY_FN(segment_open, METH_VARARGS),
    GPUIPC__PY_FN(segment_publish, METH_VARARGS),
    GPUIPC__PY_FN(segment_unlink, METH_VARARGS),
    GPUIPC__PY_FN(segment_stat, METH_VARARGS),
    GPUIPC__PY_FN(segment_list, METH_O),
    GPUIPC__PY_END};
