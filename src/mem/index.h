/*
 * src/mem/index.h: the index of this process's live buffers by address,
 * allocated and imported, HOST and GPU alike (index.c). buf.c keeps it:
 * a buffer enters once its memory is mapped and leaves when it leaves the
 * registry; gpuipc_buf_find reads it. Every call is made with the buffer
 * registry's lock held (buf.c), which also guards the buffers' references.
 */
#ifndef GPUIPC_MEM_INDEX_H
#define GPUIPC_MEM_INDEX_H

#include "mem/mem.h"

/* Enter @b, whose ptr and size are set. 0, or -ENOMEM (then @b is not in
 * the index, and gpuipc_buf_find does not see it). */
int gpuipc__index_add(struct gpuipc_buf *b);

/* Forget @b; nothing happens when it is not in the index. */
void gpuipc__index_remove(struct gpuipc_buf *b);

/*
 * A buffer that holds all of [@lo, @hi) (@lo == @hi: @lo in the buffer or
 * at its end) and that @usable accepts, or NULL. Where buffers overlap
 * (two mappings of one memory), the one of the greatest start.
 */
struct gpuipc_buf *
gpuipc__index_find(uintptr_t lo, uintptr_t hi,
                   bool (*usable)(const struct gpuipc_buf *));

#endif
