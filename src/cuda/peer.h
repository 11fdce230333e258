/*
 * src/cuda: devices named by UUID, peer-to-peer reachability and NVML.
 * Used by the GPU buffer kinds, interprocess events and topology.
 */
#ifndef GPUIPC_CUDA_PEER_H
#define GPUIPC_CUDA_PEER_H

#include "cuda/cuda.h"

#include <stdint.h>

/* 0 when @ordinal is a visible device, else -ERANGE with @who's sentence. */
int gpuipc__dev_check(int ordinal, const char *who);

/*
 * Whether kernels on @src can reach memory on @dst (cuDeviceCanAccessPeer,
 * asked once per pair): 0, or GPUIPC_E_UNSUPPORTED with a sentence naming
 * both GPUs. @src == @dst is always 0.
 */
int gpuipc__p2p_check(int src, int dst, const char *who);

/*
 * NVML, loaded at run time (dlopen "libnvidia-ml.so.1") once. 0, or
 * GPUIPC_E_UNSUPPORTED with the reason (the same on every call).
 */
int gpuipc__nvml_load(void);

/*
 * How @a and @b are connected according to NVML: @link (PIX .. SYS or
 * NVLINK) and @nvlinks (active NVLinks joining them, directly or through
 * NVSwitches; 0 when none). Returns 0, or GPUIPC_E_UNSUPPORTED when NVML is
 * missing or does not know the devices.
 */
int gpuipc__nvml_link(const struct gpuipc__dev *a, const struct gpuipc__dev *b,
                      gpuipc_link_t *link, int *nvlinks);

#endif
