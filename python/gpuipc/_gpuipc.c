/*
 * _gpuipc - the C half of the gpuipc Python package: thin functions over
 * include/gpuipc.h, written against CPython's limited API (one binary for
 * every CPython >= 3.9). Objects of the library travel to Python as
 * capsules holding a "box" (the pointer, cleared when closed explicitly);
 * the classes live in the pure Python layer (gpuipc/_domain.py and its
 * neighbours).
 *
 * This file holds the module itself and what every other file of the
 * extension uses (declared in _gpuipc.h): errors, boxes and the argument
 * converters. The functions live by concern in _gpuipc_*.c.
 *
 * Errors: a negative code raises the exception that the Python layer's
 * factory (_set_error_factory) makes from (code, name, sentence).
 * Blocking calls release the GIL.
 */
#include "_gpuipc.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>

static PyObject *error_factory; /* callable(code, name, sentence) -> exc */

/* ---- errors ------------------------------------------------------------ */

/* The exception for library code @code with sentence @detail. */
static PyObject *raise_detail(int code, const char *detail)
{
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

PyObject *gpuipc__py_raise(int code)
{
  const char *detail = gpuipc_last_error();
  if (detail == NULL || detail[0] == '\0')
    detail = gpuipc_strerror(code);
  return raise_detail(code, detail);
}

PyObject *gpuipc__py_none(int rc)
{
  if (rc < 0)
    return gpuipc__py_raise(rc);
  Py_RETURN_NONE;
}

PyObject *gpuipc__py_long(int rc)
{
  return rc < 0 ? gpuipc__py_raise(rc) : PyLong_FromLong(rc);
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
  void *stream; /* a view's: its release, when the box goes, follows it */
  /* A view's: the DLPack capsule it was last handed over in (a strong
   * reference), until a consumer takes it (then the view is the
   * consumer's) or the box revokes it; else NULL. */
  PyObject *lent;
} box_t;

const char gpuipc__py_BUF[] = "gpuipc.buf", gpuipc__py_DOM[] = "gpuipc.domain",
           gpuipc__py_CHAN[] = "gpuipc.channel",
           gpuipc__py_VIEW[] = "gpuipc.view",
           gpuipc__py_EVENT[] = "gpuipc.event";

/* What a handed-over capsule is renamed to when its view goes back to the
 * box: no consumer takes it any more. */
static const char revoked_name[] = "gpuipc.revoked_dltensor";

/* Release @p, the object of a box of type @type (a view after the work
 * queued on @stream); called without the GIL. */
static int release_object(const char *type, void *p, void *stream)
{
  if (type == gpuipc__py_BUF)
    return gpuipc_buf_release(p);
  if (type == gpuipc__py_DOM)
    return gpuipc_domain_leave(p);
  if (type == gpuipc__py_CHAN)
    return gpuipc_channel_close(p);
  if (type == gpuipc__py_VIEW)
    return gpuipc_tensor_release(p, stream);
  if (type == gpuipc__py_EVENT)
    return gpuipc_event_release(p);
  return 0;
}

/* Settle box @b's hand-over: a consumer took the capsule (renamed it), so
 * the view is the consumer's and the box is empty; or, with @revoke, the
 * capsule no consumer took is revoked and the view stays the box's. */
static void settle(box_t *b, bool revoke)
{
  if (b->lent == NULL)
    return;
  if (!PyCapsule_IsValid(b->lent, "dltensor"))
    b->p = NULL; /* taken: its deleter releases the view */
  else if (!revoke)
    return;
  else if (PyCapsule_SetName(b->lent, revoked_name) < 0)
    PyErr_Clear(); /* never: the capsule is valid */
  Py_CLEAR(b->lent);
}

/* The box of capsule @cap (any type), settled; NULL with an exception. */
static box_t *box_of(PyObject *cap, bool revoke)
{
  const char *name = PyCapsule_GetName(cap);
  box_t *b = name != NULL ? PyCapsule_GetPointer(cap, name) : NULL;
  if (b != NULL)
    settle(b, revoke);
  return b;
}

static void box_destroy(PyObject *cap)
{
  const char *name = PyCapsule_GetName(cap);
  box_t *b = PyCapsule_GetPointer(cap, name);
  if (b == NULL) {
    PyErr_Clear();
    return;
  }
  settle(b, true);
  void *p = b->p, *stream = b->stream;
  b->p = NULL;
  free(b);
  if (p == NULL)
    return;
  GPUIPC__PY_NOGIL(release_object(name, p, stream));
}

PyObject *gpuipc__py_box(int rc, const char *type, void *p)
{
  return gpuipc__py_box_on(rc, type, p, NULL);
}

PyObject *gpuipc__py_box_on(int rc, const char *type, void *p, void *stream)
{
  if (rc < 0)
    return gpuipc__py_raise(rc);
  box_t *b = malloc(sizeof(*b));
  PyObject *cap = NULL;
  if (b == NULL)
    PyErr_NoMemory();
  else if ((cap = PyCapsule_New(b, type, box_destroy)) == NULL)
    free(b);
  else
    *b = (box_t){.p = p, .stream = stream, .lent = NULL};
  if (cap == NULL)
    release_object(type, p, stream);
  return cap;
}

/* gpuipc.Closed (a ValueError) for an object used after it was closed,
 * released or handed over; returns NULL. */
static void *raise_closed(void)
{
  raise_detail(GPUIPC_E_CLOSED,
               "the gpuipc object is closed, released or handed over");
  return NULL;
}

void *gpuipc__py_unbox(PyObject *cap, const char *type)
{
  box_t *b = PyCapsule_GetPointer(cap, type);
  if (b == NULL)
    return NULL;
  settle(b, false);
  if (b->p == NULL)
    return raise_closed();
  return b->p;
}

int gpuipc__py_box_lend(PyObject *cap, PyObject *dl)
{
  box_t *b = PyCapsule_GetPointer(cap, gpuipc__py_VIEW);
  if (b == NULL)
    return -1;
  settle(b, true); /* one hand-over at a time */
  Py_INCREF(dl);
  b->lent = dl;
  return 0;
}

/* box_held(box, revoke=False) -> whether the box still holds its object
 * (not closed, not taken by a DLPack consumer); with @revoke, a capsule
 * the view was handed over in and that no consumer took is revoked. */
static PyObject *py_box_held(PyObject *self, PyObject *args)
{
  PyObject *cap;
  int revoke = 0;
  if (!PyArg_ParseTuple(args, "O|p", &cap, &revoke))
    return NULL;
  box_t *b = box_of(cap, revoke);
  if (b == NULL)
    return NULL;
  return PyBool_FromLong(b->p != NULL);
}

/* box_stream(box, stream): the stream that the release of the boxed view,
 * when the box goes, follows. */
static PyObject *py_box_stream(PyObject *self, PyObject *args)
{
  PyObject *cap;
  void *stream;
  if (!PyArg_ParseTuple(args, "OO&", &cap, gpuipc__py_stream, &stream))
    return NULL;
  box_t *b = PyCapsule_GetPointer(cap, gpuipc__py_VIEW);
  if (b == NULL)
    return NULL;
  b->stream = stream;
  Py_RETURN_NONE;
}

/* close(box, stream=None): close the boxed object now (a view after the
 * work queued on @stream; one a DLPack consumer took is the consumer's,
 * a capsule none took is revoked); closing twice does nothing. */
static PyObject *py_close(PyObject *self, PyObject *args)
{
  PyObject *cap;
  void *stream = NULL;
  if (!PyArg_ParseTuple(args, "O|O&", &cap, gpuipc__py_stream, &stream))
    return NULL;
  box_t *b = box_of(cap, true);
  if (b == NULL)
    return NULL;
  void *p = b->p;
  b->p = NULL;
  if (p == NULL)
    Py_RETURN_NONE;
  int rc;
  GPUIPC__PY_NOGIL(rc = release_object(PyCapsule_GetName(cap), p, stream));
  return gpuipc__py_none(rc);
}

void gpuipc__py_append(PyObject **list, PyObject *item)
{
  if (item == NULL || PyList_Append(*list, item) < 0)
    Py_CLEAR(*list);
  Py_XDECREF(item);
}

/* ---- argument converters ("O&") --------------------------------------- */

static int unbox_into(PyObject *o, const char *type, void *out)
{
  void *p = gpuipc__py_unbox(o, type);
  *(void **)out = p;
  return p != NULL;
}

int gpuipc__py_domain(PyObject *o, void *out)
{
  return unbox_into(o, gpuipc__py_DOM, out);
}

int gpuipc__py_buf(PyObject *o, void *out)
{
  return unbox_into(o, gpuipc__py_BUF, out);
}

int gpuipc__py_opt_buf(PyObject *o, void *out)
{
  if (o != Py_None)
    return unbox_into(o, gpuipc__py_BUF, out);
  *(void **)out = NULL;
  return 1;
}

int gpuipc__py_channel(PyObject *o, void *out)
{
  return unbox_into(o, gpuipc__py_CHAN, out);
}

int gpuipc__py_view(PyObject *o, void *out)
{
  return unbox_into(o, gpuipc__py_VIEW, out);
}

int gpuipc__py_event(PyObject *o, void *out)
{
  return unbox_into(o, gpuipc__py_EVENT, out);
}

int gpuipc__py_stream(PyObject *o, void *out)
{
  if (o == Py_None) {
    *(void **)out = NULL;
    return 1;
  }
  return gpuipc__py_ptr(o, out);
}

int gpuipc__py_timeout(PyObject *o, void *out)
{
  int *ms = out;
  if (o == Py_None) {
    *ms = GPUIPC_TIMEOUT_FOREVER;
    return 1;
  }
  if (PyBool_Check(o)) {
    PyErr_SetString(PyExc_TypeError, "timeout: seconds or None (forever), "
                                     "not a bool");
    return 0;
  }
  double s = PyFloat_AsDouble(o);
  if (s == -1.0 && PyErr_Occurred()) {
    PyErr_Format(PyExc_TypeError, "timeout: seconds or None (forever), not "
                 "%R", o);
    return 0;
  }
  if (!(s >= 0) || !isfinite(s)) { /* negative, NaN or infinite */
    PyErr_Format(PyExc_ValueError, "timeout: None (forever) or a finite "
                 "number of seconds >= 0, not %R", o);
    return 0;
  }
  double m = s * 1000;
  if (m >= INT_MAX) {
    *ms = INT_MAX;
  } else {
    *ms = (int)m;
    if (*ms < m) /* up: never less than asked, a positive one >= 1 ms */
      (*ms)++;
  }
  return 1;
}

/* seconds_ms(seconds) -> the library's milliseconds (gpuipc__py_timeout) */
static PyObject *py_seconds_ms(PyObject *self, PyObject *o)
{
  int ms;
  return gpuipc__py_timeout(o, &ms) ? PyLong_FromLong(ms) : NULL;
}

int gpuipc__py_ptr(PyObject *o, void *out)
{
  *(void **)out = PyLong_AsVoidPtr(o);
  return !PyErr_Occurred();
}

int gpuipc__py_ticket(PyObject *o, void *out)
{
  if (!PyLong_Check(o) || PyBool_Check(o)) {
    PyErr_Format(PyExc_TypeError, "ticket: an int that send returned, not "
                 "%R", o);
    return 0;
  }
  unsigned long long t = PyLong_AsUnsignedLongLong(o);
  if (t == (unsigned long long)-1 && PyErr_Occurred()) {
    PyErr_Format(PyExc_ValueError, "ticket: %R is outside 0 .. 2**64 - 1",
                 o);
    return 0;
  }
  *(uint64_t *)out = t;
  return 1;
}

/* ---- the module -------------------------------------------------------- */

static PyMethodDef methods[] = {GPUIPC__PY_FN(set_error_factory, METH_O),
                                GPUIPC__PY_FN(close, METH_VARARGS),
                                GPUIPC__PY_FN(seconds_ms, METH_O),
                                GPUIPC__PY_FN(box_held, METH_VARARGS),
                                GPUIPC__PY_FN(box_stream, METH_VARARGS),
                                GPUIPC__PY_END};

static PyMethodDef *const file_methods[] = {
    gpuipc__py_library_methods, gpuipc__py_buffer_methods,
    gpuipc__py_tensor_methods,  gpuipc__py_channel_methods,
    gpuipc__py_event_methods,   gpuipc__py_alloc_methods,
    gpuipc__py_chunk_methods,   gpuipc__py_torch_methods,
    gpuipc__py_find_methods, gpuipc__py_send_methods,
    gpuipc__py_blocks_methods, gpuipc__py_share_methods};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gpuipc",
                                    "gpuipc's C binding (use the gpuipc "
                                    "package)",
                                    -1, methods, NULL, NULL, NULL, NULL};

static int add_kind(PyObject *kinds, const char *name, long value)
{
  PyObject *v = PyLong_FromLong(value);
  if (v == NULL)
    return -1;
  int rc = PyDict_SetItemString(kinds, name, v);
  Py_DECREF(v);
  return rc;
}

/* KINDS: {name: value} of every kind of gpuipc.h's GPUIPC_KIND_MAP, the
 * one list the Python layer takes its kinds from (gpuipc/_common.py). */
static int add_kinds(PyObject *m)
{
  PyObject *kinds = PyDict_New();
  if (kinds == NULL)
    return -1;
  int rc = 0;
#define GPUIPC__PY_KIND(name, value, str, desc)                                \
  if (rc == 0)                                                                 \
    rc = add_kind(kinds, str, value);
  GPUIPC_KIND_MAP(GPUIPC__PY_KIND)
#undef GPUIPC__PY_KIND
  if (rc == 0)
    rc = PyModule_AddObject(m, "KINDS", kinds); /* steals it on success */
  if (rc < 0)
    Py_DECREF(kinds);
  return rc;
}

static int add_constants(PyObject *m)
{
  int rc = 0;
  rc |= PyModule_AddIntConstant(m, "TIMEOUT_FOREVER", GPUIPC_TIMEOUT_FOREVER);
  rc |= PyModule_AddIntConstant(m, "TIMEOUT_DEFAULT", GPUIPC_TIMEOUT_DEFAULT);
  rc |= PyModule_AddIntConstant(m, "CREATE", GPUIPC_CREATE);
  rc |= PyModule_AddIntConstant(m, "EXCL", GPUIPC_EXCL);
  rc |= PyModule_AddIntConstant(m, "WAIT", GPUIPC_WAIT);
  rc |= PyModule_AddIntConstant(m, "SCRATCH", GPUIPC_SCRATCH);
  rc |= PyModule_AddIntConstant(m, "UNPINNED", GPUIPC_UNPINNED);
  rc |= PyModule_AddIntConstant(m, "MEMCPY_DEVICE", GPUIPC_MEMCPY_DEVICE);
  rc |= PyModule_AddIntConstant(m, "SEND_NONBLOCK", GPUIPC_SEND_NONBLOCK);
  rc |= PyModule_AddIntConstant(m, "CHANNEL_BLOCKS_MAX",
                                GPUIPC_CHANNEL_BLOCKS_MAX);
  rc |= PyModule_AddIntConstant(m, "JOIN_NO_BROKER", GPUIPC_JOIN_NO_BROKER);
  rc |= PyModule_AddIntConstant(m, "HAVE_CUDA", GPUIPC_HAVE_CUDA);
#define GPUIPC__PY_ERR(name, code, msg)                                        \
  rc |= PyModule_AddIntConstant(m, "E_" #name, code);
  GPUIPC_ERRNO_MAP(GPUIPC__PY_ERR)
#undef GPUIPC__PY_ERR
  if (rc == 0)
    rc = add_kinds(m);
  return rc;
}

PyMODINIT_FUNC PyInit__gpuipc(void);
PyMODINIT_FUNC PyInit__gpuipc(void)
{
  PyObject *m = PyModule_Create(&module);
  if (m == NULL)
    return NULL;
  size_t n = sizeof(file_methods) / sizeof(file_methods[0]);
  for (size_t i = 0; i < n; i++)
    if (PyModule_AddFunctions(m, file_methods[i]) < 0)
      goto drop_module;
  if (add_constants(m) < 0)
    goto drop_module;
  return m;
drop_module:
  Py_DECREF(m);
  return NULL;
}
