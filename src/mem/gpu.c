/*
 * What the GPU kinds (vmm.c, legacy.c, pool.c) share: the devices of an
 * import, exporter liveness, access descriptors, driver errors and pointer
 * attributes. It calls no kind: the public calls that depend on the kind
 * (gpuipc_buf_access and gpuipc_buf_alive in buf.c,
 * gpuipc_buf_export_foreign in foreign.c) reach the kinds through their
 * gpuipc__kind_ops tables.
 */
#include "mem/gpu.h"
#include "cuda/peer.h"
#include "os/os.h"

#include <signal.h>
#include <string.h>

bool gpuipc__handle_is_self(const gpuipc_handle_t *h)
{
  const struct gpuipc__proc_id *me = gpuipc__proc_self();
  return h->nonce == me->nonce && h->pid == me->pid &&
         memcmp(h->boot_id, me->boot_id, 16) == 0;
}

bool gpuipc__exporter_gone(const uint8_t boot_id[16], uint64_t pidns,
                           uint32_t pid)
{
  const struct gpuipc__proc_id *me = gpuipc__proc_self();
  return memcmp(me->boot_id, boot_id, 16) == 0 && me->pidns == pidns &&
         !gpuipc__pid_alive((pid_t)pid);
}

bool gpuipc__exporter_gone_fast(const uint8_t boot_id[16], uint64_t pidns,
                                uint32_t pid)
{
  const struct gpuipc__proc_id *me = gpuipc__proc_self();
  return memcmp(me->boot_id, boot_id, 16) == 0 && me->pidns == pidns &&
         kill((pid_t)pid, 0) < 0 && errno == ESRCH;
}

int gpuipc__gpu_import_devices(const gpuipc_handle_t *h, int requested,
                               const char *who, int *owner, int *access)
{
  int o = gpuipc_device_by_uuid(h->device_uuid);
  if (o < 0)
    return o;
  int a = o;
  if (requested >= 0) {
    int rc = gpuipc__dev_check(requested, who);
    if (rc != 0)
      return rc;
    a = requested;
    rc = gpuipc__p2p_check(a, o, who);
    if (rc != 0)
      return rc;
  }
  *owner = o;
  *access = a;
  return 0;
}

#if GPUIPC_HAVE_CUDA

void gpuipc__rw_access(CUmemAccessDesc *a, int device)
{
  memset(a, 0, sizeof(*a));
  a->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a->location.id = gpuipc__dev_get(device)->cu_dev;
  a->flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

int gpuipc__cu_oom(CUresult r, const char *what, size_t size, int device)
{
  if (r == CUDA_ERROR_OUT_OF_MEMORY)
    return gpuipc__err(-ENOMEM, "%s(%zu bytes on GPU %d): out of device "
                       "memory", what, size, device);
  return gpuipc__cu_check(r, what);
}

int gpuipc__ptr_attr(void *out, CUpointer_attribute a, CUdeviceptr p,
                     const char *name)
{
  return gpuipc__cu_check(gpuipc__cu.cuPointerGetAttribute(out, a, p), name);
}

#endif
