/*
 * _gpuipc_chunks.c - the pooled form of PyTorch's pluggable allocator,
 * behind gpuipc.torch.mem_pool():
 *   torch.cuda.memory.CUDAPluggableAllocator(path_of_this_module,
 *   "gpuipc_torch_pool_malloc", "gpuipc_torch_pool_free").
 * Blocks are cut from a few large gpuipc buffers ("chunks") instead of one
 * buffer each, so the hundreds of tensors of a model lie in a handful of
 * buffers: lending them costs a handful of exports (a driver's first export
 * of an allocation takes most of a millisecond whatever its size), a
 * handful of imports and descriptors in each reader. The price: a tensor of
 * the pool, sent or lent, shares its whole chunk, so the pool is for memory
 * that is shared together (a model's weights).
 *
 * Chunks grow with the pool: 64 MiB, then twice the device's largest chunk,
 * at most the cap (pool_set_chunk, default 2 GiB), or one block's size when
 * that is larger; when the device cannot give that much, the block's size. Blocks are cut first fit in 2 MiB steps (the VMM granularity), and a
 * chunk goes back to gpuipc when its last block does. A free waits for the
 * work queued on the block's stream first, so the next owner of the bytes
 * cannot race it. The library's gpuipc_buf_find finds a block's chunk, as
 * it finds every buffer. See _gpuipc.h.
 */
#include "_gpuipc.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#define EXPORT __attribute__((visibility("default")))

#define STEP ((size_t)2 << 20)
#define FIRST_CHUNK ((size_t)64 << 20)

typedef struct span {
  size_t off, len;
} span_t;

typedef struct chunk {
  gpuipc_buf_t *buf;
  uintptr_t base;
  size_t size, used;
  int device;
  span_t *free; /* by offset, never touching each other */
  size_t nfree, capfree;
} chunk_t;

typedef struct block {
  uintptr_t ptr;
  size_t len;
  chunk_t *chunk;
} block_t;

static pthread_mutex_t chunk_lock = PTHREAD_MUTEX_INITIALIZER;
static chunk_t **chunks;
static size_t nchunks, capchunks;
static block_t *blocks;
static size_t nblocks, capblocks;
static size_t chunk_cap = (size_t)2 << 30;

EXPORT void *gpuipc_torch_pool_malloc(ssize_t size, int device, void *stream);
EXPORT void gpuipc_torch_pool_free(void *ptr, ssize_t size, int device,
                                   void *stream);

/* Room for @n more than @len items of @elem bytes in *@arr. */
static int reserve(void *arr, size_t *cap, size_t len, size_t n, size_t elem)
{
  void **a = arr;
  if (len + n <= *cap)
    return 0;
  size_t ncap = *cap ? *cap * 2 : 16;
  while (ncap < len + n)
    ncap *= 2;
  void *p = realloc(*a, ncap * elem);
  if (p == NULL)
    return -1;
  *a = p;
  *cap = ncap;
  return 0;
}

/* Cut @len bytes from the first free span of @c that holds them. */
static bool take(chunk_t *c, size_t len, size_t *off)
{
  for (size_t i = 0; i < c->nfree; i++) {
    span_t *s = &c->free[i];
    if (s->len < len)
      continue;
    *off = s->off;
    s->off += len;
    s->len -= len;
    if (s->len == 0) {
      memmove(s, s + 1, (c->nfree - i - 1) * sizeof(*s));
      c->nfree--;
    }
    return true;
  }
  return false;
}

/* Give bytes [@off, @off + @len) of @c back, joined to free neighbours.
 * Without memory for one more span the bytes stay out of use. */
static void give(chunk_t *c, size_t off, size_t len)
{
  size_t i = 0;
  while (i < c->nfree && c->free[i].off < off)
    i++;
  bool prev = i > 0 && c->free[i - 1].off + c->free[i - 1].len == off;
  bool next = i < c->nfree && off + len == c->free[i].off;
  if (prev && next) {
    c->free[i - 1].len += len + c->free[i].len;
    memmove(&c->free[i], &c->free[i + 1],
            (c->nfree - i - 1) * sizeof(c->free[0]));
    c->nfree--;
  } else if (prev) {
    c->free[i - 1].len += len;
  } else if (next) {
    c->free[i].off = off;
    c->free[i].len += len;
  } else if (reserve(&c->free, &c->capfree, c->nfree, 1,
                     sizeof(c->free[0])) == 0) {
    memmove(&c->free[i + 1], &c->free[i],
            (c->nfree - i) * sizeof(c->free[0]));
    c->free[i] = (span_t){off, len};
    c->nfree++;
  }
}

/* A new chunk of @device holding at least @len bytes (under the lock). */
static chunk_t *chunk_new(size_t len, int device)
{
  size_t have = 0;
  for (size_t i = 0; i < nchunks; i++)
    if (chunks[i]->device == device && chunks[i]->size > have)
      have = chunks[i]->size;
  size_t want = have < FIRST_CHUNK ? FIRST_CHUNK : have * 2;
  if (want > chunk_cap)
    want = chunk_cap;
  if (want < len)
    want = len;
  want = (want + STEP - 1) / STEP * STEP;
  chunk_t *c = calloc(1, sizeof(*c));
  if (c == NULL || reserve(&chunks, &capchunks, nchunks, 1, sizeof(*chunks)) ||
      reserve(&c->free, &c->capfree, 0, 4, sizeof(c->free[0]))) {
    if (c != NULL)
      free(c->free);
    free(c);
    return NULL;
  }
  gpuipc_kind_t kind = (gpuipc_kind_t)gpuipc__py_alloc_kind();
  if (gpuipc_buf_alloc(want, kind, device, 0, &c->buf) < 0) {
    c->buf = NULL;
    want = len; /* the device is short: just this block */
    if (gpuipc_buf_alloc(want, kind, device, 0, &c->buf) < 0) {
      free(c->free);
      free(c);
      return NULL;
    }
  }
  c->size = want;
  c->base = (uintptr_t)gpuipc_buf_ptr(c->buf);
  c->device = device;
  c->free[0] = (span_t){0, c->size};
  c->nfree = 1;
  chunks[nchunks++] = c;
  return c;
}

EXPORT void *gpuipc_torch_pool_malloc(ssize_t size, int device, void *stream)
{
  (void)stream;
  if (size <= 0 || (size_t)size > SIZE_MAX - STEP)
    return NULL;
  size_t len = ((size_t)size + STEP - 1) / STEP * STEP, off = 0;
  void *out = NULL;
  pthread_mutex_lock(&chunk_lock);
  if (reserve(&blocks, &capblocks, nblocks, 1, sizeof(*blocks)) == 0) {
    chunk_t *c = NULL;
    for (size_t i = 0; i < nchunks && c == NULL; i++)
      if (chunks[i]->device == device && take(chunks[i], len, &off))
        c = chunks[i];
    if (c == NULL && (c = chunk_new(len, device)) != NULL)
      take(c, len, &off);
    if (c != NULL) {
      c->used += len;
      blocks[nblocks++] = (block_t){c->base + off, len, c};
      out = (void *)(c->base + off);
    }
  }
  pthread_mutex_unlock(&chunk_lock);
  return out;
}

EXPORT void gpuipc_torch_pool_free(void *ptr, ssize_t size, int device,
                                   void *stream)
{
  (void)size;
  block_t b = {0};
  pthread_mutex_lock(&chunk_lock);
  for (size_t i = 0; i < nblocks; i++) {
    if (blocks[i].ptr == (uintptr_t)ptr) {
      b = blocks[i];
      blocks[i] = blocks[--nblocks];
      break;
    }
  }
  pthread_mutex_unlock(&chunk_lock);
  if (b.chunk == NULL)
    return;
  /* Stream-ordered, as gpuipc_torch_free: kernels still queued on @stream
   * may use the block; its bytes are handed out again after them. */
  gpuipc__stream_sync(device, stream);
  chunk_t *c = b.chunk;
  gpuipc_buf_t *drop = NULL;
  pthread_mutex_lock(&chunk_lock);
  c->used -= b.len;
  give(c, b.ptr - c->base, b.len);
  if (c->used == 0) {
    for (size_t i = 0; i < nchunks; i++) {
      if (chunks[i] == c) {
        chunks[i] = chunks[--nchunks];
        break;
      }
    }
    drop = c->buf;
    free(c->free);
    free(c);
  }
  pthread_mutex_unlock(&chunk_lock);
  if (drop != NULL)
    gpuipc_buf_release(drop); /* lent segments and readers keep their own */
}

/* pool_set_chunk(bytes): the largest chunk made from now on (2 MiB steps;
 * a block larger than it still gets a chunk of its own). */
static PyObject *py_pool_set_chunk(PyObject *self, PyObject *arg)
{
  Py_ssize_t n = PyLong_AsSsize_t(arg);
  if (n == -1 && PyErr_Occurred())
    return NULL;
  if (n < (Py_ssize_t)STEP) {
    PyErr_Format(PyExc_ValueError, "chunk_bytes %zd is below one 2 MiB step",
                 n);
    return NULL;
  }
  pthread_mutex_lock(&chunk_lock);
  chunk_cap = (size_t)n / STEP * STEP;
  pthread_mutex_unlock(&chunk_lock);
  Py_RETURN_NONE;
}

/* pool_chunks() -> [(base, size, bytes in use, blocks)], for tests and
 * for seeing how a pool lies (read under the lock, built after it). */
static PyObject *py_pool_chunks(PyObject *self, PyObject *unused)
{
  typedef struct { unsigned long long base; size_t size, used, nb; } row_t;
  row_t *rows = NULL;
  size_t n = 0;
  pthread_mutex_lock(&chunk_lock);
  if (nchunks > 0 && (rows = calloc(nchunks, sizeof(*rows))) != NULL) {
    for (n = 0; n < nchunks; n++) {
      rows[n] = (row_t){chunks[n]->base, chunks[n]->size, chunks[n]->used, 0};
      for (size_t j = 0; j < nblocks; j++)
        rows[n].nb += blocks[j].chunk == chunks[n];
    }
  }
  bool short_of_memory = nchunks > 0 && rows == NULL;
  pthread_mutex_unlock(&chunk_lock);
  if (short_of_memory)
    return PyErr_NoMemory();
  PyObject *list = PyList_New(0);
  for (size_t i = 0; i < n && list != NULL; i++)
    gpuipc__py_append(&list, Py_BuildValue("(Knnn)", rows[i].base,
                                           (Py_ssize_t)rows[i].size,
                                           (Py_ssize_t)rows[i].used,
                                           (Py_ssize_t)rows[i].nb));
  free(rows);
  return list;
}

PyMethodDef gpuipc__py_chunk_methods[] = {
    GPUIPC__PY_FN(pool_set_chunk, METH_O),
    GPUIPC__PY_FN(pool_chunks, METH_NOARGS),
    GPUIPC__PY_END};
