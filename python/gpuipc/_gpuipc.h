/*
 * _gpuipc.h - what the C files of the extension gpuipc._gpuipc share.
 *
 * The module is one extension built from several files, one a concern:
 *   _gpuipc.c          the module: errors, boxes, argument converters
 *   _gpuipc_library.c  version, driver, devices, topology, settings
 *   _gpuipc_buffer.c   domains, buffers and segments
 *   _gpuipc_tensor.c   tensor descriptions, DLPack in and out, received views
 *   _gpuipc_torch.c    PyTorch tensors read in C
 *   _gpuipc_channel.c  channels
 *   _gpuipc_send.c     Channel.send in one call: any array read in C
 *   _gpuipc_blocks.c   Channel.send_blocks / recv_blocks: blocks by index
 *   _gpuipc_find.c     the buffer an array lies in (gpuipc_buf_find)
 *   _gpuipc_event.c    interprocess events and copies
 *   _gpuipc_alloc.c    PyTorch's pluggable allocator, a buffer per block
 *   _gpuipc_chunks.c   its pooled form: blocks cut from large buffers
 *   _gpuipc_share.c    copies that readers of one publication share
 * Each file but the first exports a method table that PyInit__gpuipc adds
 * to the module. Everything here is private to the extension.
 */
#ifndef GPUIPC_PY_GPUIPC_H
#define GPUIPC_PY_GPUIPC_H

#define Py_LIMITED_API 0x03090000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stdint.h>

#include "gpuipc.h"
/* The extension links the shared library and calls its public interface;
 * of the private one (GPUIPC_PRIVATE, exported for gpuipc's companions)
 * only gpuipc__device_current and gpuipc__stream_sync, which the CUDA
 * runtime would give a C user. */
#include "core/private.h"

/* ---- errors (a negative code raises the Python layer's exception) ------ */

/* Raise the exception for library code @code, with the code's name and
 * gpuipc_last_error()'s sentence; returns NULL. */
PyObject *gpuipc__py_raise(int code);
/* None, or the exception for @rc < 0. */
PyObject *gpuipc__py_none(int rc);
/* @rc as an int, or the exception for @rc < 0. */
PyObject *gpuipc__py_long(int rc);

/* ---- boxes: library objects as capsules -------------------------------- */

/* The capsule names, compared by address: a box's type. */
extern const char gpuipc__py_BUF[], gpuipc__py_DOM[], gpuipc__py_CHAN[],
    gpuipc__py_VIEW[], gpuipc__py_EVENT[];

/* A new box of type @type holding @p, or the exception for @rc < 0. The
 * box owns @p; when it cannot be made, @p is released. */
PyObject *gpuipc__py_box(int rc, const char *type, void *p);
/* gpuipc__py_box of a view whose release, when the box goes unclosed,
 * follows the work queued on @stream. */
PyObject *gpuipc__py_box_on(int rc, const char *type, void *p, void *stream);
/* The object in box @cap of type @type; NULL with an exception when it is
 * not one or was closed. */
void *gpuipc__py_unbox(PyObject *cap, const char *type);
/* Record that the view in box @cap is handed over in DLPack capsule @dl
 * (revoking an earlier capsule that no consumer took): once a consumer
 * takes @dl (renames it), the view is the consumer's and the box empty;
 * until then it stays the box's, and closing the box revokes @dl. 0, or
 * -1 with an exception. */
int gpuipc__py_box_lend(PyObject *cap, PyObject *dl);

/* PyArg_ParseTuple "O&" converters: a box of that type as its object (a
 * closed or foreign box fails), a stream (None: NULL) or an address. */
int gpuipc__py_domain(PyObject *o, void *out);
int gpuipc__py_buf(PyObject *o, void *out);
int gpuipc__py_opt_buf(PyObject *o, void *out); /* None: NULL */
int gpuipc__py_channel(PyObject *o, void *out);
int gpuipc__py_view(PyObject *o, void *out);
int gpuipc__py_event(PyObject *o, void *out);
int gpuipc__py_stream(PyObject *o, void *out);
/* A timeout in seconds (None: forever; finite, >= 0, not a bool) as the
 * library's int milliseconds (a positive one at least 1 ms). */
int gpuipc__py_timeout(PyObject *o, void *out);
int gpuipc__py_ptr(PyObject *o, void *out);
/* A send ticket: an int in 0 .. 2**64 - 1 (ValueError outside, TypeError
 * for another type or a bool). */
int gpuipc__py_ticket(PyObject *o, void *out);

/* Append @item (a new reference, or NULL after a failure, whose exception
 * stands) to list @*list, and drop @item; on failure @*list is dropped
 * and set to NULL. */
void gpuipc__py_append(PyObject **list, PyObject *item);

/* Run @stmt (a blocking library call) with the GIL released. */
#define GPUIPC__PY_NOGIL(stmt)                                                 \
  do {                                                                         \
    Py_BEGIN_ALLOW_THREADS stmt;                                               \
    Py_END_ALLOW_THREADS                                                       \
  } while (0)

/* ---- shared between concerns ------------------------------------------- */

/* A tensor description tuple parsed into a gpuipc_tensor_t (the channel's
 * send and receive-into take one); see _gpuipc_tensor.c. */
typedef struct gpuipc__py_desc {
  gpuipc_tensor_t t;
  int64_t shape[GPUIPC_TENSOR_MAX_DIMS];
  int64_t strides[GPUIPC_TENSOR_MAX_DIMS];
} gpuipc__py_desc_t;

int gpuipc__py_parse_desc(PyObject *tup, gpuipc__py_desc_t *d);
/* The description tuple of DLTensor @dl (strides None when absent). */
PyObject *gpuipc__py_dl_desc(const gpuipc_dl_tensor_t *dl);
/* Consume a producer's DLPack capsule @cap (renamed "used_dltensor"): its
 * DLTensor in @out, valid while the returned holder lives (the producer's
 * deleter runs when it goes); NULL with an exception. */
PyObject *gpuipc__py_dl_take(PyObject *cap, const gpuipc_dl_tensor_t **out);
/* The ints of sequence @seq (@what, at most @cap of them) into @out: how
 * many, or -1 with an exception. */
int gpuipc__py_read_int64s(PyObject *seq, int64_t *out, int cap,
                           const char *what);

/* A plain strided torch tensor @t in CPU or CUDA memory described in @d
 * (its data, dtype, device, shape, strides; d->t.buf NULL): 1; 0 when @t is
 * something else (not a torch tensor, torch never imported, another
 * layout or dtype, a lazy negative or conjugate view); -1 with an
 * exception (_gpuipc_torch.c). */
int gpuipc__py_torch_read(PyObject *t, gpuipc__py_desc_t *d);
/* PyArg_ParseTuple "O&" converter for a description tuple. */
int gpuipc__py_desc(PyObject *o, void *out);
/* What Python keeps of received view @v (channel_recv returns it):
 * (description, buffer pointer, buffer size, kind, buffer device). */
PyObject *gpuipc__py_view_info(const gpuipc_tensor_t *v);

/* One more reference to @buf, as a new box (_gpuipc_buffer.c). */
PyObject *gpuipc__py_buf_retain(gpuipc_buf_t *buf);

/* The kind of memory the pluggable allocators take (alloc_set_kind,
 * _gpuipc_alloc.c). */
int gpuipc__py_alloc_kind(void);

/* The gpuipc buffer of this process whose memory holds the @bytes at @lo
 * of DLPack device type @type, with a reference of the caller's own, or
 * NULL (gpuipc_buf_find; _gpuipc_find.c). */
gpuipc_buf_t *gpuipc__py_find(int type, uintptr_t lo, size_t bytes);

/* Array @obj read in C as Channel.send reads it (a torch tensor, the
 * array interface, DLPack) into @d, with what keeps its memory alive in
 * *@keep (a new reference) and @stream_arg resolved into *@stream: 1; 0
 * when the Python layer must describe it (nothing kept); -1 with an
 * exception (_gpuipc_send.c). */
int gpuipc__py_read_array(PyObject *obj, PyObject *stream_arg,
                          gpuipc__py_desc_t *d, PyObject **keep,
                          void **stream);
/* Stream @s (None, an int, or an object with .cuda_stream, .ptr or
 * .handle) for tensor @dl as the library takes it; None for a CUDA tensor
 * is PyTorch's current stream of its device. 0, or -1 with an exception
 * (_gpuipc_send.c). */
int gpuipc__py_stream_on(PyObject *s, const gpuipc_dl_tensor_t *dl,
                         void **out);
/* The bytes [lo, hi) that tensor @dl reaches. */
void gpuipc__py_bounds(const gpuipc_dl_tensor_t *dl, uintptr_t *lo,
                       uintptr_t *hi);
/* Keep @what in dict @keep under @ticket until message @ticket of @ch is
 * free (what a GPU send still reads): 0, or -1 with an exception. */
int gpuipc__py_hold(gpuipc_channel_t *ch, PyObject *keep, PyObject *ticket,
                    PyObject *what);

/* The method tables of the files, added to the module at import. */
extern PyMethodDef gpuipc__py_library_methods[], gpuipc__py_buffer_methods[],
    gpuipc__py_tensor_methods[], gpuipc__py_channel_methods[],
    gpuipc__py_event_methods[], gpuipc__py_alloc_methods[],
    gpuipc__py_chunk_methods[], gpuipc__py_torch_methods[],
    gpuipc__py_find_methods[], gpuipc__py_send_methods[],
    gpuipc__py_blocks_methods[], gpuipc__py_share_methods[];

#define GPUIPC__PY_FN(name, flags) {#name, (PyCFunction)py_##name, flags, NULL}
#define GPUIPC__PY_END {NULL, NULL, 0, NULL}

#endif
