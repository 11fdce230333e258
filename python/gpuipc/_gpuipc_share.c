/*
 * _gpuipc_share.c - copies that readers of one publication share
 * (gpuipc_share_copy, docs/shared-copy.md): the extents come as
 * addresses, and the buffers they lie in are found by the library
 * (gpuipc_buf_find), as the state dict's Reader knows its sources and
 * targets by their tensors. See _gpuipc.h.
 */
#include "_gpuipc.h"

#include <stdint.h>
#include <string.h>

/* One (src, dst, bytes) item of @ext into @e: the buffers found, with a
 * reference each (released by the caller). 0, or -1 with an exception. */
static int extent_of(PyObject *item, Py_ssize_t i, gpuipc_share_extent_t *e)
{
  unsigned long long src, dst, bytes;
  if (!PyTuple_Check(item) ||
      !PyArg_ParseTuple(item, "KKK", &src, &dst, &bytes)) {
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "share_copy: extent %zd is not a tuple "
                 "(src address, dst address, bytes)", i);
    return -1;
  }
  if (gpuipc_buf_find((const void *)(uintptr_t)src, (size_t)bytes, &e->src,
                      &e->src_off) != 0) {
    PyErr_Format(PyExc_ValueError, "share_copy: extent %zd's source "
                 "(0x%llx, %llu bytes) does not lie in a buffer of this "
                 "process", i, src, bytes);
    return -1;
  }
  if (gpuipc_buf_find((const void *)(uintptr_t)dst, (size_t)bytes, &e->dst,
                      &e->dst_off) != 0) {
    gpuipc_buf_release(e->src);
    e->src = NULL;
    PyErr_Format(PyExc_ValueError, "share_copy: extent %zd's destination "
                 "(0x%llx, %llu bytes) does not lie in a gpuipc buffer (its "
                 "tensors must be gpuipc memory: mem_pool, move_to_gpuipc)",
                 i, dst, bytes);
    return -1;
  }
  e->bytes = (size_t)bytes;
  return 0;
}

static void extents_free(gpuipc_share_extent_t *e, Py_ssize_t n)
{
  for (Py_ssize_t i = 0; i < n; i++) {
    gpuipc_buf_release(e[i].src);
    gpuipc_buf_release(e[i].dst);
  }
  PyMem_Free(e);
}

/*
 * Merge each extent into the one before it where both continue it (the
 * same source and destination buffers, each at the byte where the last
 * one ended): a model moved into gpuipc memory (one buffer, its tensors in
 * order) read into targets laid out the same way is then a few extents of
 * whole chunks instead of a chunk for every small tensor. Members whose
 * lists merge differently (targets laid out otherwise) have different
 * layouts: such a member copies alone. The number of extents left.
 */
static Py_ssize_t merge(gpuipc_share_extent_t *e, Py_ssize_t n)
{
  Py_ssize_t m = 0;
  for (Py_ssize_t i = 1; i < n; i++) {
    gpuipc_share_extent_t *last = &e[m];
    if (e[i].src == last->src && e[i].dst == last->dst &&
        e[i].src_off == last->src_off + last->bytes &&
        e[i].dst_off == last->dst_off + last->bytes) {
      last->bytes += e[i].bytes;
      gpuipc_buf_release(e[i].src);
      gpuipc_buf_release(e[i].dst);
      continue;
    }
    e[++m] = e[i];
  }
  return n > 0 ? m + 1 : 0;
}

/*
 * share_copy(domain, round, extents, stream, chunk_bytes, timeout,
 *            next_round=None) -> stats:
 * copy each (src, dst, bytes) of @extents, sharing the work with the other
 * processes that copy round @round (see gpuipc_share_copy); @next_round:
 * the round of the next call, whose table is opened ahead (a name longer
 * than GPUIPC_SHARE_ROUND_MAX is not a round: none is opened ahead).
 */
static PyObject *py_share_copy(PyObject *self, PyObject *args)
{
  gpuipc_domain_t *dom;
  const char *round;
  PyObject *list;
  void *stream;
  unsigned long long chunk;
  int ms;
  const char *next = NULL;
  if (!PyArg_ParseTuple(args, "O&sOO&KO&|z", gpuipc__py_domain, &dom, &round,
                        &list, gpuipc__py_stream, &stream, &chunk,
                        gpuipc__py_timeout, &ms, &next))
    return NULL;
  if (next != NULL && strlen(next) > GPUIPC_SHARE_ROUND_MAX)
    next = NULL;
  Py_ssize_t n = PySequence_Size(list);
  if (n < 0)
    return NULL;
  if (n == 0 || n > INT32_MAX) {
    PyErr_Format(PyExc_ValueError, "share_copy: %zd extents", n);
    return NULL;
  }
  gpuipc_share_extent_t *e = PyMem_Calloc((size_t)n, sizeof(*e));
  if (e == NULL)
    return PyErr_NoMemory();
  Py_ssize_t got = 0;
  for (; got < n; got++) {
    PyObject *item = PySequence_GetItem(list, got);
    int rc = item != NULL ? extent_of(item, got, &e[got]) : -1;
    Py_XDECREF(item);
    if (rc != 0)
      break;
  }
  if (got < n) {
    extents_free(e, got);
    return NULL;
  }
  n = merge(e, n);
  gpuipc_share_opts_t o = GPUIPC_SHARE_OPTS_INIT;
  o.chunk_bytes = (size_t)chunk;
  o.timeout_ms = ms;
  gpuipc_share_stats_t st;
  memset(&st, 0, sizeof(st));
  o.stats = &st;
  o.next_round = next;
  int rc;
  GPUIPC__PY_NOGIL(rc = gpuipc_share_copy(dom, round, e, (int)n, stream, &o));
  extents_free(e, n);
  if (rc < 0)
    return gpuipc__py_raise(rc);
  return Py_BuildValue("{s:i,s:i,s:K,s:K,s:K,s:K,s:K,s:K,s:i,s:i,s:i}",
                       "joined", st.joined, "server", st.server, "chunks",
                       (unsigned long long)st.chunks, "from_publisher",
                       (unsigned long long)st.from_publisher, "from_peers",
                       (unsigned long long)st.from_peers, "taken_over",
                       (unsigned long long)st.taken_over, "passed_over",
                       (unsigned long long)st.passed_over, "recopied",
                       (unsigned long long)st.recopied, "lent", st.lent,
                       "opened", st.opened, "ahead", st.ahead);
}

PyMethodDef gpuipc__py_share_methods[] = {
    GPUIPC__PY_FN(share_copy, METH_VARARGS), GPUIPC__PY_END};
