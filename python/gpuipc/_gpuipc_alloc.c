/*
 * _gpuipc_alloc.c - PyTorch's pluggable allocator, exported from
 * gpuipc._gpuipc for
 *   torch.cuda.memory.CUDAPluggableAllocator(path_of_this_module,
 *   "gpuipc_torch_malloc", "gpuipc_torch_free"):
 * every block PyTorch's caching allocator asks for is a gpuipc VMM buffer,
 * so a tensor in it can be sent with no copy (the library's
 * gpuipc_buf_find finds its buffer, or its chunk of the pooled form,
 * _gpuipc_chunks.c, as it finds every buffer of the process). A buffer per block shares nothing but the block: this
 * is the form for a program's whole allocator (use_allocator). The Python side is gpuipc/torch.py.
 * See _gpuipc.h.
 */
#include "_gpuipc.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>

#define EXPORT __attribute__((visibility("default")))

typedef struct alloc_entry {
  uintptr_t ptr;
  size_t size;
  gpuipc_buf_t *buf;
} alloc_entry_t;

static pthread_mutex_t alloc_lock = PTHREAD_MUTEX_INITIALIZER;
static alloc_entry_t *allocs;
static size_t nallocs, cap_allocs;
static _Atomic int alloc_kind = GPUIPC_KIND_VMM;

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

int gpuipc__py_alloc_kind(void)
{
  return alloc_kind;
}

static PyObject *py_alloc_set_kind(PyObject *self, PyObject *args)
{
  int kind;
  if (!PyArg_ParseTuple(args, "i", &kind))
    return NULL;
  alloc_kind = kind;
  Py_RETURN_NONE;
}

PyMethodDef gpuipc__py_alloc_methods[] = {
    GPUIPC__PY_FN(alloc_set_kind, METH_VARARGS),
    GPUIPC__PY_END};
