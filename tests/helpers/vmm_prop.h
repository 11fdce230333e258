/*
 * The allocation properties of pinned VMM memory on a device, for tests
 * that call cuMemCreate themselves (memory gpuipc did not allocate).
 */
#ifndef GPUIPC_TEST_VMM_PROP_H
#define GPUIPC_TEST_VMM_PROP_H

#include "cuda/cuda.h"
#include "test.h"

#include <string.h>

#if GPUIPC_HAVE_CUDA
/* Pinned memory on local device @dev, exportable as @types. */
static inline void vmm_prop(int dev, CUmemAllocationHandleType types,
                            CUmemAllocationProp *prop)
{
  const struct gpuipc__dev *d = gpuipc__dev_get(dev);
  ASSERT_TRUE(d != NULL);
  memset(prop, 0, sizeof(*prop));
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = d->cu_dev;
  prop->requestedHandleTypes = types;
}
#endif

#endif
