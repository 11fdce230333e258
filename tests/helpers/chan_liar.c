/*
 * A peer that lies: chan_liar DOMAIN CHANNEL CASE opens the channel, sends
 * one honest message (message 1 of chan_common.h, from a 4096-byte HOST
 * buffer, which the receiver maps as buffer key 1), then writes a
 * descriptor that breaks one rule straight into the ring, bypassing every
 * check of gpuipc_channel_send. It then waits until the receiver closes.
 *
 * CASE: ndim, stride, offset, bigsize, dtype, dtype99, lanes, magic, seq,
 * key, flags, forget, bufmsg, nobufmsg (announces a new buffer and sends
 * no buffer message at all), slot (a record slot beyond the depth, 64),
 * slotmax (one beyond any depth).
 */
#include "helpers/chan_lie.h"

#include <unistd.h>

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc != 4)
    TFAIL("usage: chan_liar DOMAIN CHANNEL CASE");
  const char *c = argv[3];
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join(argv[1], NULL, &dom));
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, argv[2], NULL, &ch));
  gpuipc_buf_t *buf;
  ASSERT_OK(gpuipc_buf_alloc(4096, GPUIPC_KIND_HOST, -1, 0, &buf));
  chan_lie_first(ch, buf);

  /* An honest descriptor for message 2 (16 bytes at offset 0)... */
  struct gpuipc__desc d;
  memset(&d, 0, sizeof(d));
  d.type = GPUIPC__DESC_TENSOR;
  d.seq = gpuipc__chan_next_seq(ch);
  d.buf_key = 1;
  d.buf_size = gpuipc_buf_size(buf);
  d.dtype = (gpuipc_dl_dtype_t){GPUIPC_DL_UINT, 8, 1};
  d.ndim = 1;
  d.shape[0] = 16;
  d.strides[0] = 1;
  /* ...and the lie. */
  uint8_t bytes[GPUIPC__CHAN_DESC_BYTES];
  uint8_t bufmsg[GPUIPC__BUFMSG_BYTES];
  size_t bufmsg_len = 0;
  int fd = -1;
  if (strcmp(c, "ndim") == 0) {
    d.ndim = 9;
  } else if (strcmp(c, "stride") == 0) {
    d.strides[0] = 1000; /* 15 * 1000 + 1 bytes > 4096 */
  } else if (strcmp(c, "offset") == 0) {
    d.offset = 5000;
  } else if (strcmp(c, "bigsize") == 0) {
    /* Inside the size it claims, outside the buffer's real size. */
    d.buf_size = 1 << 20;
    d.offset = 8000;
  } else if (strcmp(c, "dtype") == 0) {
    d.dtype = (gpuipc_dl_dtype_t){3, 64, 1}; /* kDLOpaqueHandle */
  } else if (strcmp(c, "dtype99") == 0) {
    d.dtype = (gpuipc_dl_dtype_t){99, 8, 1};
  } else if (strcmp(c, "lanes") == 0) {
    d.dtype.lanes = 0;
  } else if (strcmp(c, "seq") == 0) {
    d.seq += 5;
  } else if (strcmp(c, "key") == 0) {
    d.buf_key = 77;
  } else if (strcmp(c, "flags") == 0) {
    d.flags = 0x80;
  } else if (strcmp(c, "forget") == 0) {
    d.flags = GPUIPC__DESC_FORGET;
    d.forget_key = 42;
  } else if (strcmp(c, "bufmsg") == 0) {
    /* Announces a new buffer whose message names another key. */
    d.flags = GPUIPC__DESC_NEW_BUF;
    d.buf_key = 2;
    gpuipc_handle_t h;
    ASSERT_OK(gpuipc_buf_export(buf, &h));
    int n = gpuipc__bufmsg_encode(3, &h, bufmsg, sizeof(bufmsg));
    ASSERT_GT(n, 0);
    bufmsg_len = (size_t)n;
    fd = h.fd;
  } else if (strcmp(c, "nobufmsg") == 0) {
    d.flags = GPUIPC__DESC_NEW_BUF;
    d.buf_key = 2;
  } else if (strcmp(c, "slot") == 0) {
    d.slot = 64; /* the default depth */
  } else if (strcmp(c, "slotmax") == 0) {
    d.slot = GPUIPC__CHAN_SLOT_MAX;
  } else if (strcmp(c, "magic") != 0) {
    TFAIL("unknown case %s", c);
  }
  int len = gpuipc__desc_encode(&d, bytes, sizeof(bytes));
  ASSERT_GT(len, 0);
  if (strcmp(c, "magic") == 0)
    memset(bytes, 0xa5, 8);
  ASSERT_OK(gpuipc__chan_inject(ch, bytes, (size_t)len,
                                bufmsg_len > 0 ? bufmsg : NULL, bufmsg_len,
                                fd));
  if (fd >= 0)
    close(fd);
  chan_lie_until_closed(ch);
  gpuipc_buf_release(buf);
  gpuipc_domain_leave(dom);
  return 0;
}
