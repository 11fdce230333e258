/*
 * A fake CUDA driver: a shared library that gpuipc loads through
 * GPUIPC_CUDA_LIB, so that the loader, the device table and `gpuipc info`
 * are tested on machines without a GPU. What it reports is fixed here;
 * environment variables read by the library bend its behaviour:
 *   FAKE_CUDA_VERSION  driver version it claims (default 13000)
 *   FAKE_CUDA_HIDE     comma-separated entry points it does not have,
 *                      "*" for none at all
 *   FAKE_CUDA_INIT     CUresult that cuInit returns (default 0)
 *   FAKE_CUDA_NDEV     number of devices (default 2, at most 2)
 *   FAKE_CUDA_BAD_ATTR a device attribute number it refuses to answer
 *   FAKE_CUDA_VMM_DEV  the device that says it has VMM with POSIX file
 *                      descriptors (default 0; 1: device 1, and not
 *                      device 0, whose GPUIPC_KIND_AUTO memory is then
 *                      LEGACY, which the fake shares: it has no VMM entry
 *                      points in any case)
 *   FAKE_CUDA_DEV1_OPS 1: device 1 too has interprocess events and 64-bit
 *                      stream memory operations, and the two devices
 *                      reach each other (cuDeviceCanAccessPeer,
 *                      cuCtxEnablePeerAccess); default 0: only device 0
 *                      has them, and no peer access, as for an older GPU
 *                      beside a newer one
 *   FAKE_CUDA_REGISTER_MS  milliseconds cuMemHostRegister takes
 *   FAKE_CUDA_COPY_LAG     a queued copy is done on this query of an event
 *                          recorded after it (default 1), not before ...
 *   FAKE_CUDA_COPY_LAG_US  ... nor before this many microseconds since
 *                          the record (default 0); synchronising calls do
 *                          the work at once. "Device memory" is host
 *                          memory: copies are memmove, done in order per
 *                          stream (see fake_cuda.c); cuStreamQuery
 *                          counts its queries since work was last queued
 *                          the same way. LEGACY memory and interprocess
 *                          events really are shared with other processes
 *                          (memfds opened through /proc/PID/fd): a process
 *                          waiting on another's event has that process's
 *                          service thread do the work (see fake_cuda.c)
 * Built three ways: libfake_cuda_full.so (exports cuGetProcAddress_v2),
 * libfake_cuda_v1.so (only the CUDA 11 cuGetProcAddress) and
 * libfake_cuda_nogpa.so (exports no cuGetProcAddress at all).
 */
#ifndef GPUIPC_FAKE_CUDA_H
#define GPUIPC_FAKE_CUDA_H

#include <stdint.h>

#define FAKE_CUDA_MAX_DEV 2

/* Device 0: a device with every feature. */
#define FAKE_CUDA_UUID0                                                        \
  {0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77,                             \
   0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff}
#define FAKE_CUDA_UUID0_STR "GPU-00112233-4455-6677-8899-aabbccddeeff"
/* A quote, a backslash and a tab: output must escape them. */
#define FAKE_CUDA_NAME0 "Fake \"GPU\" \\ 9000\t0"
#define FAKE_CUDA_PCI0 "0000:3B:00.0" /* as the driver writes it */
#define FAKE_CUDA_PCI0_LOWER "0000:3b:00.0"
#define FAKE_CUDA_MEM0 (80ull << 30)
#define FAKE_CUDA_CC0_MAJOR 9
#define FAKE_CUDA_CC0_MINOR 0
#define FAKE_CUDA_POOL_TYPES0 0x9 /* POSIX FD + fabric */
#define FAKE_CUDA_GRANULARITY (2ull << 20)

/* Device 1: no VMM, no fabric, no IPC events; pools with FDs only. */
#define FAKE_CUDA_UUID1                                                        \
  {0xff, 0xee, 0xdd, 0xcc, 0xbb, 0xaa, 0x99, 0x88,                             \
   0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0x00}
#define FAKE_CUDA_UUID1_STR "GPU-ffeeddcc-bbaa-9988-7766-554433221100"
#define FAKE_CUDA_NAME1 "Fake GPU 1"
#define FAKE_CUDA_PCI1 "0000:AF:00.0"
#define FAKE_CUDA_PCI1_LOWER "0000:af:00.0"
#define FAKE_CUDA_MEM1 (24ull << 30)
#define FAKE_CUDA_CC1_MAJOR 8
#define FAKE_CUDA_CC1_MINOR 6
#define FAKE_CUDA_POOL_TYPES1 0x1

/* Exported besides the driver API, for tests to look inside. */
/* Primary-context retains minus releases of device @dev. */
int fake_cuda_retains(int dev);
/* Calls that needed cuInit and came before it (a real driver fails them). */
int fake_cuda_calls_before_init(void);
/* Calls of cuCtxSetCurrent so far, from any thread. */
int fake_cuda_set_current_calls(void);
/* Host ranges registered now (cuMemHostRegister minus unregisters). */
int fake_cuda_registered(void);
/* Have cuMemHostRegister call @fn (NULL: none) before it succeeds: a test
 * makes the time a driver starting up takes pass there (it moves gpuipc's
 * clock on) instead of sleeping FAKE_CUDA_REGISTER_MS. */
void fake_cuda_on_register(void (*fn)(void));
/* Queued copies done so far (each when its turn came, not when queued). */
int fake_cuda_copies_done(void);
/* Times cuEventQuery or cuStreamQuery answered CUDA_ERROR_NOT_READY. */
int fake_cuda_not_ready(void);
/* Successful cuEventRecord calls in this process so far. */
int fake_cuda_events_recorded(void);
/* Successful cuStreamWaitEvent calls in this process so far. */
int fake_cuda_stream_waits(void);
/* Successful cuMemcpyBatchAsync calls so far (0 where the fake, built
 * with headers before CUDA 13, has none). */
int fake_cuda_batch_copies(void);
/* cuStreamWriteValue64 and cuStreamWaitValue64 calls so far. */
int fake_cuda_word_writes(void);
int fake_cuda_word_waits(void);
/* cuStreamWriteValue64 calls on stream @h so far: a CUstream, or NULL,
 * CU_STREAM_LEGACY, CU_STREAM_PER_THREAD (the current context's; with no
 * context current, those of every context, summed); -1 where there is no
 * such stream. */
int fake_cuda_word_writes_on(void *h);
/* Launches of gpuipc's copy kernel so far (those without the system-scope
 * fence: a receiver's copies; with it: a sender's staging copies), and how
 * many of them ran with their counter not at 0 (the kernel would then
 * never write its word). */
int fake_cuda_kernel_launches(void);
int fake_cuda_stage_launches(void);
/* Launches of gpuipc's block kernel (gpuipc_copy_blocks) so far. */
int fake_cuda_block_launches(void);
int fake_cuda_kernel_faults(void);
/* Launches of `gpuipc bench`'s kernels so far (tools/bench_kernels.cu). */
int fake_cuda_bench_launches(void);
/* Uses of an opened event after its exporter destroyed it (undefined in
 * CUDA; the fake fails them). */
int fake_cuda_dead_event_uses(void);

#endif
