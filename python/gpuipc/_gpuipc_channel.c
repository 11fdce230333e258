/*
 * _gpuipc_channel.c - gpuipc._gpuipc's channels: open, send (a tensor
 * description, _gpuipc_tensor.c, with the gpuipc buffer it lies in, if
 * any), the send tickets, receive (a "gpuipc.view" box) and receive into
 * memory of the caller's. Channels travel as "gpuipc.channel" boxes
 * (_gpuipc.c); the Python class is gpuipc/_channel.py. See _gpuipc.h.
 */
#include "_gpuipc.h"

#include <errno.h>
#include <string.h>

static PyObject *py_channel_open(PyObject *self, PyObject *args)
{
  gpuipc_domain_t *dom;
  const char *name;
  int timeout_ms, device, device_set, send_timeout_ms;
  unsigned depth, stage_slots;
  Py_ssize_t stage_slot_bytes;
  if (!PyArg_ParseTuple(args, "O&siIiiiIn", gpuipc__py_domain, &dom, &name,
                        &timeout_ms, &depth, &device, &device_set,
                        &send_timeout_ms, &stage_slots, &stage_slot_bytes))
    return NULL;
  gpuipc_channel_opts_t o = {.size = sizeof(o)};
  o.timeout_ms = timeout_ms;
  o.depth = depth;
  o.device = device;
  o.device_set = device_set;
  o.send_timeout_ms = send_timeout_ms;
  o.stage_slots = stage_slots;
  o.stage_slot_bytes = stage_slot_bytes < 0 ? 0 : (size_t)stage_slot_bytes;
  gpuipc_channel_t *ch = NULL;
  int rc;
  GPUIPC__PY_NOGIL(rc = gpuipc_channel_open(dom, name, &o, &ch));
  return gpuipc__py_box(rc, gpuipc__py_CHAN, ch);
}

/* channel_send(ch, buf|None, description, stream, flags) -> ticket */
static PyObject *py_channel_send(PyObject *self, PyObject *args)
{
  gpuipc_channel_t *ch;
  gpuipc_buf_t *buf;
  gpuipc__py_desc_t d;
  void *stream;
  unsigned flags;
  if (!PyArg_ParseTuple(args, "O&O&O&O&I", gpuipc__py_channel, &ch,
                        gpuipc__py_opt_buf, &buf, gpuipc__py_desc, &d,
                        gpuipc__py_stream, &stream, &flags))
    return NULL;
  d.t.buf = buf;
  uint64_t ticket = 0;
  int rc;
  GPUIPC__PY_NOGIL(rc = gpuipc_channel_send(ch, &d.t, stream, flags, &ticket));
  if (rc < 0)
    return gpuipc__py_raise(rc);
  return PyLong_FromUnsignedLongLong(ticket);
}

/* Whether host address @addr lies in a gpuipc buffer of this process. */
static bool in_buffer(uintptr_t addr)
{
  gpuipc_buf_t *b = gpuipc__py_find(GPUIPC_DL_CPU, addr, 0);
  if (b != NULL)
    gpuipc_buf_release(b);
  return b != NULL;
}

/* Send @d (its memory gpuipc's staging copies: d->t.buf is NULL) with no
 * stream: the ticket, or the exception. */
static PyObject *send_host(gpuipc_channel_t *ch, gpuipc__py_desc_t *d,
                           unsigned flags)
{
  uint64_t ticket = 0;
  int rc;
  GPUIPC__PY_NOGIL(rc = gpuipc_channel_send(ch, &d->t, NULL, flags, &ticket));
  if (rc < 0)
    return gpuipc__py_raise(rc);
  return PyLong_FromUnsignedLongLong(ticket);
}

/*
 * channel_send_view(ch, view, flags) -> ticket, or None: send on what a
 * received host view holds (staged: the view is the other process's
 * memory). None, having sent nothing: a GPU view (the Python layer sends
 * it on a stream), or one whose memory a buffer of this process may hold.
 */
static PyObject *py_channel_send_view(PyObject *self, PyObject *args)
{
  gpuipc_channel_t *ch;
  gpuipc_tensor_t *v;
  unsigned flags;
  if (!PyArg_ParseTuple(args, "O&O&I", gpuipc__py_channel, &ch,
                        gpuipc__py_view, &v, &flags))
    return NULL;
  if (v->dl.device.device_type != GPUIPC_DL_CPU ||
      in_buffer((uintptr_t)v->dl.data + v->dl.byte_offset))
    Py_RETURN_NONE;
  /* The description is copied: another thread may release the view
   * while the send runs without the GIL. */
  gpuipc__py_desc_t d;
  memset(&d, 0, sizeof(d));
  d.t.dl = v->dl;
  d.t.dl.data = (char *)v->dl.data + v->dl.byte_offset;
  d.t.dl.byte_offset = 0;
  int nd = v->dl.ndim;
  if (nd < 0 || nd > GPUIPC_TENSOR_MAX_DIMS) {
    PyErr_Format(PyExc_ValueError, "a view of %d dimensions", nd);
    return NULL;
  }
  memcpy(d.shape, v->dl.shape, (size_t)nd * sizeof(int64_t));
  d.t.dl.shape = d.shape;
  if (v->dl.strides != NULL) {
    memcpy(d.strides, v->dl.strides, (size_t)nd * sizeof(int64_t));
    d.t.dl.strides = d.strides;
  }
  return send_host(ch, &d, flags);
}

/* channel_send_done(ch, ticket, timeout_ms) -> bool (False: -EAGAIN). */
static PyObject *py_channel_send_done(PyObject *self, PyObject *args)
{
  gpuipc_channel_t *ch;
  uint64_t ticket;
  int timeout_ms;
  if (!PyArg_ParseTuple(args, "O&O&i", gpuipc__py_channel, &ch,
                        gpuipc__py_ticket, &ticket, &timeout_ms))
    return NULL;
  int rc;
  GPUIPC__PY_NOGIL(rc = gpuipc_channel_send_done(ch, ticket, timeout_ms));
  if (rc == -EAGAIN && timeout_ms == 0)
    Py_RETURN_FALSE;
  if (rc < 0)
    return gpuipc__py_raise(rc);
  Py_RETURN_TRUE;
}

static PyObject *py_channel_send_wait(PyObject *self, PyObject *args)
{
  gpuipc_channel_t *ch;
  uint64_t ticket;
  void *stream;
  int timeout_ms;
  if (!PyArg_ParseTuple(args, "O&O&O&i", gpuipc__py_channel, &ch,
                        gpuipc__py_ticket, &ticket, gpuipc__py_stream, &stream,
                        &timeout_ms))
    return NULL;
  int rc;
  GPUIPC__PY_NOGIL(rc = gpuipc_channel_send_wait(ch, ticket, stream,
                                                 timeout_ms));
  return gpuipc__py_none(rc);
}

static PyObject *py_channel_progress(PyObject *self, PyObject *ccap)
{
  gpuipc_channel_t *ch = gpuipc__py_unbox(ccap, gpuipc__py_CHAN);
  if (ch == NULL)
    return NULL;
  return gpuipc__py_long(gpuipc_channel_progress(ch));
}

/* channel_fd(ch) -> the descriptor an event loop waits on */
static PyObject *py_channel_fd(PyObject *self, PyObject *ccap)
{
  gpuipc_channel_t *ch = gpuipc__py_unbox(ccap, gpuipc__py_CHAN);
  if (ch == NULL)
    return NULL;
  return gpuipc__py_long(gpuipc_channel_fd(ch));
}

/* channel_recv(ch, stream, timeout) -> (view box, gpuipc__py_view_info):
 * @timeout in seconds (None: forever). */
static PyObject *py_channel_recv(PyObject *self, PyObject *args)
{
  gpuipc_channel_t *ch;
  void *stream;
  int timeout_ms;
  if (!PyArg_ParseTuple(args, "O&O&O&", gpuipc__py_channel, &ch,
                        gpuipc__py_stream, &stream, gpuipc__py_timeout,
                        &timeout_ms))
    return NULL;
  gpuipc_tensor_t *view = NULL;
  int rc;
  GPUIPC__PY_NOGIL(rc = gpuipc_channel_recv(ch, &view, stream, timeout_ms));
  PyObject *box = gpuipc__py_box_on(rc, gpuipc__py_VIEW, view, stream);
  if (box == NULL)
    return NULL;
  PyObject *info = gpuipc__py_view_info(view);
  if (info == NULL) {
    Py_DECREF(box); /* gives the view back */
    return NULL;
  }
  return Py_BuildValue("(NN)", box, info);
}

static PyObject *py_channel_recv_into(PyObject *self, PyObject *args)
{
  gpuipc_channel_t *ch;
  gpuipc__py_desc_t d;
  void *stream;
  int timeout_ms;
  if (!PyArg_ParseTuple(args, "O&O&O&i", gpuipc__py_channel, &ch,
                        gpuipc__py_desc, &d, gpuipc__py_stream, &stream,
                        &timeout_ms))
    return NULL;
  int rc;
  GPUIPC__PY_NOGIL(rc = gpuipc_channel_recv_into(ch, &d.t, stream,
                                                 timeout_ms));
  return gpuipc__py_none(rc);
}

/*
 * channel_recv_into_any(ch, dst, stream, timeout_ms) -> None, or
 * NotImplemented (received nothing: @dst is not a plain torch tensor, for
 * describe() and channel_recv_into): Channel.recv_into of a torch tensor
 * read in C, its stream resolved as send's.
 */
static PyObject *py_channel_recv_into_any(PyObject *self, PyObject *args)
{
  gpuipc_channel_t *ch;
  PyObject *dst, *stream_arg;
  int timeout_ms;
  if (!PyArg_ParseTuple(args, "O&OOi", gpuipc__py_channel, &ch, &dst,
                        &stream_arg, &timeout_ms))
    return NULL;
  gpuipc__py_desc_t d;
  int got = gpuipc__py_torch_read(dst, &d);
  if (got < 0)
    return NULL;
  if (got == 0)
    Py_RETURN_NOTIMPLEMENTED;
  void *stream;
  if (gpuipc__py_stream_on(stream_arg, &d.t.dl, &stream) < 0)
    return NULL;
  int rc;
  GPUIPC__PY_NOGIL(rc = gpuipc_channel_recv_into(ch, &d.t, stream,
                                                 timeout_ms));
  return gpuipc__py_none(rc);
}

static PyObject *py_channel_info(PyObject *self, PyObject *ccap)
{
  gpuipc_channel_t *ch = gpuipc__py_unbox(ccap, gpuipc__py_CHAN);
  if (ch == NULL)
    return NULL;
  gpuipc_channel_info_t in = {.size = sizeof(in)};
  int rc = gpuipc_channel_info(ch, &in);
  if (rc < 0)
    return gpuipc__py_raise(rc);
  return Py_BuildValue(
      "{s:s,s:i,s:i,s:I,s:I,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:O}", "name",
      in.name, "end", in.end, "peer_pid", in.peer_pid, "depth", in.depth,
      "peer_depth", in.peer_depth, "sent", (unsigned long long)in.sent,
      "in_flight", (unsigned long long)in.in_flight, "oldest_in_flight",
      (unsigned long long)in.oldest_in_flight, "received",
      (unsigned long long)in.received, "views", (unsigned long long)in.views,
      "buffers_sent", (unsigned long long)in.buffers_sent,
      "buffers_imported", (unsigned long long)in.buffers_imported,
      "peer_gone", in.peer_gone ? Py_True : Py_False);
}

PyMethodDef gpuipc__py_channel_methods[] = {
    GPUIPC__PY_FN(channel_open, METH_VARARGS),
    GPUIPC__PY_FN(channel_send, METH_VARARGS),
    GPUIPC__PY_FN(channel_send_view, METH_VARARGS),
    GPUIPC__PY_FN(channel_send_done, METH_VARARGS),
    GPUIPC__PY_FN(channel_send_wait, METH_VARARGS),
    GPUIPC__PY_FN(channel_progress, METH_O),
    GPUIPC__PY_FN(channel_fd, METH_O),
    GPUIPC__PY_FN(channel_recv, METH_VARARGS),
    GPUIPC__PY_FN(channel_recv_into, METH_VARARGS),
    GPUIPC__PY_FN(channel_recv_into_any, METH_VARARGS),
    GPUIPC__PY_FN(channel_info, METH_O),
    GPUIPC__PY_END};
