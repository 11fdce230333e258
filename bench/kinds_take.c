/*
 * kinds_take: the import gpuipc's channels and segments make (kinds_bench's
 * "as channels" rows): the fd taken, close-on-exec already because it came
 * over one of gpuipc's sockets, so a VMM mapping keeps it as it is. The
 * call is internal (mem/mem.h is C), hence this file.
 */
#include "mem/mem.h"

int kinds_import_taken(const gpuipc_handle_t *h, int device,
                       gpuipc_buf_t **out);

int kinds_import_taken(const gpuipc_handle_t *h, int device,
                       gpuipc_buf_t **out)
{
  return gpuipc__buf_import(h, device,
                            GPUIPC_BUF_TAKE_FD | GPUIPC__BUF_FD_CLOEXEC, out);
}
