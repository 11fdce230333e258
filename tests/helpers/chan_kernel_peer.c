/*
 * chan_kernel_peer: the two ends of the sizes part of
 * tests/channel_copy_kernel.c, on the fake CUDA driver:
 *
 *   chan_kernel_peer send|stage DOMAIN CHANNEL KERNEL_MAX
 *   chan_kernel_peer recv DOMAIN CHANNEL KERNEL_MAX [staged]
 *
 * The sender sends, from a LEGACY buffer of device 0, messages of odd and
 * even sizes (1 byte to 1 MiB + 3) at source offsets 0, 16 and 1, each
 * filled with its own pattern; the receiver lands each with
 * gpuipc_channel_recv_into at destination offsets 0, 32 and 3 of a LEGACY
 * buffer whose other bytes are 0xee, and checks every byte of the message
 * and that the bytes around it are untouched. A copy whose ends are both
 * 16-byte aligned and at most KERNEL_MAX bytes
 * (GPUIPC_CHAN_COPY_KERNEL_KB, as the test set it) must be one launch of
 * the copy kernel; every other copy a copy and a word written after it;
 * the receiver counts both in the fake.
 *
 * "stage" sends the same messages from memory gpuipc did not allocate
 * (cuMemAlloc), which each send stages through the channel's slots, its
 * bytes written on the sender's stream just before (a copy the fake
 * leaves pending): the staging copy must come after that write, and the
 * receiver's copy after the staging copy. A staged message whose source
 * is 16-byte aligned and at most KERNEL_MAX bytes must be one launch of
 * the copy kernel with its system-scope fence, which writes the ready
 * word itself; every other one a copy and a ready word written after it;
 * the sender counts both. Its receiver ("staged") reads from a staging
 * slot, aligned whatever the source's offset.
 */
#include "test.h"

#include "cuda/cuda.h"

#include <stdbool.h>
#include <stdint.h>

#if GPUIPC_HAVE_CUDA

#include "helpers/cu_peer.h"

#define BUF_BYTES ((size_t)4 << 20)
#define GUARD 64

static const size_t sizes[] = {1,     15,        16,        17,   4097,
                               65536, 65536 + 3, (1 << 20), (1 << 20) + 3};
static const size_t src_off[] = {0, 16, 1};
static const size_t dst_off[] = {0, 32, 3};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
#define NOFFS 3

/* The sender, from a LEGACY buffer; @staged: from cuMemAlloc memory,
 * which every send stages, each message's bytes written on @s just before
 * it (the staging launches and the words counted). */
static void sender(gpuipc_channel_t *ch, CUstream s, size_t kernel_max,
                   bool staged)
{
  gpuipc_buf_t *buf = NULL;
  CUdeviceptr dev;
  if (staged) {
    CU_OK(cuMemAlloc, &dev, BUF_BYTES);
  } else {
    ASSERT_OK(gpuipc_buf_alloc(BUF_BYTES, GPUIPC_KIND_LEGACY, 0, 0, &buf));
    dev = (CUdeviceptr)(uintptr_t)gpuipc_buf_ptr(buf);
  }
  uint8_t *host = malloc(BUF_BYTES);
  ASSERT_TRUE(host != NULL);
  int k0 = cu_fake_count("fake_cuda_stage_launches");
  int w0 = cu_fake_count("fake_cuda_word_writes");
  int want_k = 0, want_w = 0;
  uint64_t id = 0, ticket = 0;
  for (size_t i = 0; i < NSIZES; i++)
    for (size_t o = 0; o < NOFFS; o++) {
      id++;
      /* The last message's bytes are read before these are written. */
      if (ticket != 0)
        ASSERT_OK(gpuipc_channel_send_done(ch, ticket, 30000));
      test_fill(host, sizes[i], id);
      if (staged)
        CU_OK(cuMemcpyAsync, dev + src_off[o], (CUdeviceptr)host, sizes[i],
              s);
      else
        CU_OK(cuMemcpy, dev + src_off[o], (CUdeviceptr)host, sizes[i]);
      int64_t shape[1];
      gpuipc_tensor_t t;
      cu_bytes_tensor(&t, shape, (void *)(uintptr_t)(dev + src_off[o]),
                      sizes[i], buf);
      ASSERT_OK(gpuipc_channel_send(ch, &t, s, 0, &ticket));
      if (src_off[o] % 16 == 0 && sizes[i] <= kernel_max)
        want_k++;
      else
        want_w++;
    }
  ASSERT_OK(gpuipc_channel_send_done(ch, ticket, 30000));
  if (staged) {
    int k = cu_fake_count("fake_cuda_stage_launches") - k0;
    int w = cu_fake_count("fake_cuda_word_writes") - w0;
    printf("send: %llu staged messages, kernel up to %zu bytes: %d staging "
           "launches (want %d), %d ready words written after a copy (want "
           "%d)\n", (unsigned long long)id, kernel_max, k, want_k, w,
           want_w);
    ASSERT_EQ(k, want_k);
    ASSERT_EQ(w, want_w);
    CU_OK(cuMemFree, dev);
  } else {
    ASSERT_OK(gpuipc_buf_release(buf));
  }
  free(host);
}

static void receiver(gpuipc_channel_t *ch, CUstream s, size_t kernel_max,
                     bool staged)
{
  gpuipc_buf_t *dbuf;
  ASSERT_OK(gpuipc_buf_alloc(BUF_BYTES, GPUIPC_KIND_LEGACY, 0, 0, &dbuf));
  uint8_t *dev = gpuipc_buf_ptr(dbuf);
  uint8_t *host = malloc(BUF_BYTES);
  ASSERT_TRUE(host != NULL);
  int k0 = cu_fake_count("fake_cuda_kernel_launches");
  int w0 = cu_fake_count("fake_cuda_word_writes");
  int want_k = 0, want_w = 0;
  uint64_t id = 0;
  for (size_t i = 0; i < NSIZES; i++)
    for (size_t o = 0; o < NOFFS; o++) {
      id++;
      size_t n = sizes[i], at = dst_off[o];
      memset(host, 0xee, n + at + GUARD);
      CU_OK(cuMemcpy, (CUdeviceptr)dev, (CUdeviceptr)host, n + at + GUARD);
      int64_t shape[1];
      gpuipc_tensor_t t;
      cu_bytes_tensor(&t, shape, dev + at, n, dbuf);
      ASSERT_OK(gpuipc_channel_recv_into(ch, &t, s, 30000));
      bool aligned = ((staged ? 0 : src_off[o]) | at) % 16 == 0;
      if (aligned && n <= kernel_max)
        want_k++;
      else
        want_w++;
      CU_OK(cuStreamSynchronize, s);
      memset(host, 0, n + at + GUARD);
      CU_OK(cuMemcpy, (CUdeviceptr)host, (CUdeviceptr)dev, n + at + GUARD);
      size_t bad = test_check(host + at, n, id);
      if (bad != (size_t)-1)
        TFAIL("%zu bytes from offset %zu to %zu: byte %zu is %u, not %u", n,
              src_off[o], at, bad, host[at + bad], test_pattern(id, bad));
      for (size_t g = 0; g < at + GUARD; g++) {
        size_t p = g < at ? g : at + n + (g - at);
        if (host[p] != 0xee)
          TFAIL("%zu bytes to offset %zu: byte %zu outside the message "
                "changed to %u", n, at, p, host[p]);
      }
    }
  int k = cu_fake_count("fake_cuda_kernel_launches") - k0;
  int w = cu_fake_count("fake_cuda_word_writes") - w0;
  printf("recv: %llu messages, kernel up to %zu bytes: %d launches (want "
         "%d), %d words written after a copy (want %d), %d faults\n",
         (unsigned long long)id, kernel_max, k, want_k, w, want_w,
         cu_fake_count("fake_cuda_kernel_faults"));
  ASSERT_EQ(k, want_k);
  ASSERT_EQ(w, want_w);
  ASSERT_EQ(cu_fake_count("fake_cuda_kernel_faults"), 0);
  ASSERT_OK(gpuipc_buf_release(dbuf));
  free(host);
}

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  bool send = argc == 5 && strcmp(argv[1], "send") == 0;
  bool stage = argc == 5 && strcmp(argv[1], "stage") == 0;
  bool staged = argc == 6 && strcmp(argv[5], "staged") == 0;
  if (!send && !stage &&
      ((argc != 5 && !staged) || strcmp(argv[1], "recv") != 0))
    TFAIL("usage: chan_kernel_peer send|stage DOMAIN CHANNEL KERNEL_MAX | "
          "recv DOMAIN CHANNEL KERNEL_MAX [staged]");
  size_t kernel_max = (size_t)strtoull(argv[4], NULL, 0);
  CUstream s = cu_stream_make();
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join(argv[2], NULL, &dom));
  gpuipc_channel_t *ch = cu_chan_open(dom, argv[3], false);
  if (send || stage)
    sender(ch, s, kernel_max, stage);
  else
    receiver(ch, s, kernel_max, staged);
  ASSERT_OK(gpuipc_channel_close(ch));
  ASSERT_OK(gpuipc_domain_leave(dom));
  CU_OK(cuStreamDestroy, s);
  return 0;
}
#else
int main(void)
{
  SKIP("built without the CUDA headers");
}
#endif
