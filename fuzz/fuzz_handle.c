/*
 * libFuzzer target for gpuipc_handle_unpack (and gpuipc_handle_pack).
 *
 * Properties checked on every input:
 *  - unpack either succeeds or returns GPUIPC_E_BADHANDLE with a sentence
 *    naming gpuipc_handle_unpack, and leaves its output untouched;
 *  - what unpack accepts is a valid handle (gpuipc__handle_validate), has
 *    fd -1, and packs back to exactly the bytes it came from.
 *
 * Getting past the CRC. A random mutation almost never leaves the CRC-32C
 * right, so on its own the fuzzer would stop at the checksum and never reach
 * the field rules behind it. So: when the input is exactly one record (192
 * bytes) and the low bit of byte 64 is 1, the harness writes the correct CRC
 * into bytes 188..191 before unpacking. Byte 64 is the first byte of
 * boot_id, the one field unpack places no rule on, so the selector bit
 * constrains nothing the fuzzer wants to reach; with the bit 0 the input is
 * unpacked as it is, and the CRC check itself stays under test. (Byte 0
 * would not do: it belongs to the magic, whose 'G' has its low bit set, so
 * every record that passed the magic check would be re-checksummed.)
 *
 * Seeds: fuzz/corpus/fuzz_handle, made by fuzz/gen/gen_handle_corpus.c.
 * Run over a copy, so that the committed seeds stay as they are:
 *   cp -r fuzz/corpus/fuzz_handle /tmp/c && build-fuzz/fuzz/fuzz_handle \
 *     -max_total_time=60 /tmp/c
 */
#include "wire/wire.h"

#include <stdlib.h>

#define REC GPUIPC_HANDLE_PACKED_SIZE
#define SELECTOR_BYTE 64 /* boot_id[0] */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  uint8_t rec[REC];
  const uint8_t *in = data;
  if (size == REC && (data[SELECTOR_BYTE] & 1)) {
    memcpy(rec, data, REC);
    uint32_t crc = gpuipc__crc32c(0, rec, GPUIPC__HANDLE_CRC_OFFSET);
    for (int i = 0; i < 4; i++)
      rec[GPUIPC__HANDLE_CRC_OFFSET + i] = (uint8_t)(crc >> (8 * i));
    in = rec;
  }

  gpuipc_handle_t h, pristine;
  memset(&h, 0x5a, sizeof(h));
  memset(&pristine, 0x5a, sizeof(pristine));
  int rc = gpuipc_handle_unpack(in, size, &h);
  if (rc != 0) {
    if (rc != GPUIPC_E_BADHANDLE)
      abort();
    if (memcmp(&h, &pristine, sizeof(h)) != 0)
      abort(); /* output written on failure */
    if (strncmp(gpuipc_last_error(), "gpuipc_handle_unpack: ", 22) != 0)
      abort();
    return 0;
  }

  if (size != REC || h.fd != -1)
    abort();
  if (gpuipc__handle_validate(&h, "fuzz") != 0)
    abort();
  uint8_t again[REC];
  if (gpuipc_handle_pack(&h, again, sizeof(again)) != REC)
    abort();
  if (memcmp(again, in, REC) != 0)
    abort(); /* accepted bytes that do not round-trip */
  return 0;
}
