/*
 * libFuzzer target for the client-broker message decoder
 * (gpuipc__msg_decode, every message type) and its encoder.
 *
 * Input: byte 0 selects, the rest is the message.
 *   bits 0-1  how many descriptors "arrived" with it (0..3)
 *   bit 7     fix up the CRC of an embedded handle record (see below)
 *
 * Properties checked on every input:
 *  - decode returns 0, GPUIPC_E_PROTO or GPUIPC_E_VERSION, nothing else;
 *  - what decode accepts carries exactly the descriptors it says
 *    (gpuipc__msg_nfds), and encodes back to exactly the bytes it came
 *    from: the encoding is canonical, so nothing the broker accepts can
 *    mean two things.
 *
 * Getting past the CRC: records that carry a packed handle (PUBLISH,
 * REPUBLISH, HANDLE, HANDOFF_SEG) embed its CRC-32C, which a random
 * mutation almost never keeps right. With bit 7 of byte 0 set, the
 * harness finds the handle record where the decoder would and rewrites
 * its CRC before decoding; with the bit clear the CRC check stays under
 * test.
 *
 * Seeds: fuzz/corpus/fuzz_proto, made by fuzz/gen/gen_proto_corpus.c.
 * Run over a copy, so that the committed seeds stay as they are:
 *   cp -r fuzz/corpus/fuzz_proto /tmp/c && build-fuzz/fuzz/fuzz_proto \
 *     -max_total_time=60 /tmp/c
 */
#include "domain/proto.h"
#include "wire/wire.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Offset of the handle record in a message of @type, or 0 if none. */
static size_t handle_offset(const uint8_t *m, size_t len)
{
  if (len < GPUIPC_PROTO_HDR)
    return 0;
  unsigned type = (unsigned)m[6] | (unsigned)m[7] << 8;
  size_t off = GPUIPC_PROTO_HDR;
  if (type == GPUIPC_MSG_PUBLISH || type == GPUIPC_MSG_REPUBLISH)
    off += 4;
  else if (type != GPUIPC_MSG_HANDLE && type != GPUIPC_MSG_HANDOFF_SEG)
    return 0;
  if (off + 2 > len)
    return 0;
  size_t name = (size_t)m[off] | (size_t)m[off + 1] << 8;
  off += 2 + name + 8 + 8 + 1 + 1 + 16 + 1; /* up to has_handle */
  if (off + GPUIPC_HANDLE_PACKED_SIZE > len)
    return 0;
  return off;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size < 1)
    return 0;
  int nfds = data[0] & 3;
  bool fix_crc = data[0] & 0x80;
  size_t len = size - 1;
  uint8_t *msg = malloc(len ? len : 1);
  if (msg == NULL)
    return 0;
  memcpy(msg, data + 1, len);
  size_t h = fix_crc ? handle_offset(msg, len) : 0;
  if (h != 0) {
    uint32_t crc = gpuipc__crc32c(0, msg + h, GPUIPC__HANDLE_CRC_OFFSET);
    for (int i = 0; i < 4; i++)
      msg[h + GPUIPC__HANDLE_CRC_OFFSET + i] = (uint8_t)(crc >> (8 * i));
  }

  static struct gpuipc__msg m; /* large: not on the stack */
  int rc = gpuipc__msg_decode(msg, len, nfds, &m);
  if (rc != 0) {
    if (rc != GPUIPC_E_PROTO && rc != GPUIPC_E_VERSION)
      abort();
    free(msg);
    return 0;
  }
  if (gpuipc__msg_nfds(&m) != nfds)
    abort();
  static uint8_t again[GPUIPC__MSG_BUF];
  int n = gpuipc__msg_encode(&m, again, sizeof(again));
  if (n < 0 || (size_t)n != len || memcmp(again, msg, len) != 0)
    abort(); /* accepted bytes that do not encode back the same */
  free(msg);
  return 0;
}
