/*
 * Malformed descriptors are refused at both ends.
 *
 * Sending end: gpuipc_channel_send checks the tensor before anything leaves, and
 * names the field: too many dimensions, a negative extent, strides or a
 * byte offset reaching outside the buffer, a data pointer outside it, an
 * unknown dtype, a staged tensor that is not contiguous or too large.
 *
 * Receiving end: a lying peer (chan_liar) writes bad descriptors straight
 * into the ring; gpuipc_channel_recv answers GPUIPC_E_PROTO with a sentence naming
 * what was wrong, every time after that too, and never hands out a view;
 * a send on that channel gets the same code (one sticky code a channel).
 * A descriptor announcing a new buffer whose message never came is refused
 * by a receive that does not wait (timeout 0), not waited for.
 */
#include "helpers/chan_common.h"

#include <unistd.h>

static gpuipc_domain_t *dom;

static void sender_checks(gpuipc_channel_t *ch)
{
  gpuipc_buf_t *buf;
  ASSERT_OK(gpuipc_buf_alloc(4096, GPUIPC_KIND_HOST, -1, 0, &buf));
  size_t size = gpuipc_buf_size(buf);
  uint8_t *p = gpuipc_buf_ptr(buf);
  int64_t shape[9] = {4, 4, 1, 1, 1, 1, 1, 1, 1};
  int64_t strides[9] = {4, 1, 1, 1, 1, 1, 1, 1, 1};
  gpuipc_tensor_t good = {.dl = {.data = p,
                                 .device = {GPUIPC_DL_CPU, 0},
                                 .ndim = 2,
                                 .dtype = {GPUIPC_DL_FLOAT, 32, 1},
                                 .shape = shape,
                                 .strides = strides},
                          .buf = buf};
  gpuipc_tensor_t t;

  t = good;
  t.dl.ndim = 9;
  ASSERT_RC(gpuipc_channel_send(ch, &t, NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("ndim 9");
  t = good;
  t.dl.ndim = -1;
  ASSERT_RC(gpuipc_channel_send(ch, &t, NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("ndim -1");

  int64_t neg[2] = {4, -2};
  t = good;
  t.dl.shape = neg;
  ASSERT_RC(gpuipc_channel_send(ch, &t, NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("shape[1]");

  int64_t far[2] = {4096, 1}; /* row 3 starts at byte 3 * 4096 * 4 */
  t = good;
  t.dl.strides = far;
  ASSERT_RC(gpuipc_channel_send(ch, &t, NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("outside");

  int64_t back[2] = {-4, 1}; /* reaches before the start */
  t = good;
  t.dl.strides = back;
  ASSERT_RC(gpuipc_channel_send(ch, &t, NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("before the start");
  t.dl.byte_offset = 3 * 4 * 4; /* the same strides from the last row: fine */
  ASSERT_OK(gpuipc_channel_send(ch, &t, NULL, GPUIPC_SEND_NONBLOCK, NULL));

  t = good;
  t.dl.byte_offset = size - 63; /* 64 bytes from there overrun by one */
  ASSERT_RC(gpuipc_channel_send(ch, &t, NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("outside");
  t.dl.byte_offset = size + 1;
  ASSERT_RC(gpuipc_channel_send(ch, &t, NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("byte offset");

  t = good;
  t.dl.data = p + size + 4096;
  ASSERT_RC(gpuipc_channel_send(ch, &t, NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("data pointer");

  t = good;
  t.dl.dtype = (gpuipc_dl_dtype_t){3, 64, 1};
  ASSERT_RC(gpuipc_channel_send(ch, &t, NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("dtype");
  t.dl.dtype = (gpuipc_dl_dtype_t){GPUIPC_DL_FLOAT, 8, 1};
  ASSERT_RC(gpuipc_channel_send(ch, &t, NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("dtype");
  t.dl.dtype = (gpuipc_dl_dtype_t){GPUIPC_DL_FLOAT, 32, 0};
  ASSERT_RC(gpuipc_channel_send(ch, &t, NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("lanes 0");

  /* Memory gpuipc did not allocate: staged, so contiguous, of any size
   * short of absurd. */
  uint8_t *foreign = malloc(64 << 20);
  ASSERT_TRUE(foreign != NULL);
  t = good;
  t.buf = NULL;
  t.dl.data = foreign;
  int64_t colmajor[2] = {1, 4};
  t.dl.strides = colmajor;
  ASSERT_RC(gpuipc_channel_send(ch, &t, NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("contiguous");
  int64_t absurd[2] = {(int64_t)1 << 26, (int64_t)1 << 23}; /* 2^49 bytes */
  t.dl.shape = absurd;
  t.dl.strides = NULL;
  ASSERT_RC(gpuipc_channel_send(ch, &t, NULL, 0, NULL), -EINVAL);
  ASSERT_ERR_MENTIONS("outside the");
  free(foreign);

  /* Only the one valid tensor left. */
  gpuipc_channel_info_t info = {.size = sizeof(info)};
  ASSERT_OK(gpuipc_channel_info(ch, &info));
  ASSERT_EQ(info.sent, 1);
  gpuipc_buf_release(buf);
}

static void liar(const char *name, const char *what, const char *mention)
{
  const char *args[] = {"chan-bad", name, what, NULL};
  pid_t pid = test_spawn("chan_liar", args, NULL);
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, name, NULL, &ch));
  if (strcmp(what, "ndim") == 0)
    sender_checks(ch);
  gpuipc_tensor_t *v = NULL;
  ASSERT_OK(gpuipc_channel_recv(ch, &v, NULL, 30000));
  const char *why = chan_msg_check(1, 0, v);
  if (why != NULL)
    TFAIL("%s", why);
  ASSERT_OK(gpuipc_tensor_release(v, NULL));
  v = NULL;
  int rc;
  if (strcmp(what, "nobufmsg") == 0) {
    /* Poll until the lie is published; then it is refused at once. */
    while ((rc = gpuipc_channel_recv(ch, &v, NULL, 0)) == -EAGAIN)
      usleep(1000);
  } else {
    rc = gpuipc_channel_recv(ch, &v, NULL, 30000);
  }
  ASSERT_RC(rc, GPUIPC_E_PROTO);
  printf("%-8s -> %s\n", what, gpuipc_last_error());
  ASSERT_ERR_MENTIONS(mention);
  ASSERT_TRUE(v == NULL);
  /* The channel stays refused. */
  ASSERT_RC(gpuipc_channel_recv(ch, &v, NULL, 0), GPUIPC_E_PROTO);
  /* Both ways: a channel has one sticky code, its sends get it too. */
  uint8_t byte = 7;
  int64_t one = 1;
  gpuipc_tensor_t t;
  memset(&t, 0, sizeof(t));
  t.dl.data = &byte;
  t.dl.device.device_type = GPUIPC_DL_CPU;
  t.dl.ndim = 1;
  t.dl.dtype = (gpuipc_dl_dtype_t){GPUIPC_DL_UINT, 8, 1};
  t.dl.shape = &one;
  ASSERT_RC(gpuipc_channel_send(ch, &t, NULL, GPUIPC_SEND_NONBLOCK, NULL),
            GPUIPC_E_PROTO);
  ASSERT_OK(gpuipc_channel_close(ch));
  ASSERT_EQ(test_wait(pid, 60000), 0);
}

int main(void)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  ASSERT_OK(gpuipc_domain_join("chan-bad", NULL, &dom));
  liar("bad-ndim", "ndim", "ndim 9 exceeds");
  liar("bad-stride", "stride", "outside the 4096-byte buffer");
  liar("bad-offset", "offset", "byte offset 5000");
  liar("bad-bigsize", "bigsize", "outside the 4096-byte buffer");
  liar("bad-dtype", "dtype", "unknown or unsupported dtype (code 3");
  liar("bad-dtype99", "dtype99", "unknown or unsupported dtype (code 99");
  liar("bad-lanes", "lanes", "lanes 0");
  liar("bad-magic", "magic", "magic");
  liar("bad-seq", "seq", "arrived where 2 was due");
  liar("bad-key", "key", "buffer key 77");
  liar("bad-flags", "flags", "flags 0x80");
  liar("bad-forget", "forget", "forgets buffer key 42");
  liar("bad-bufmsg", "bufmsg", "for key 3");
  liar("bad-nobufmsg", "nobufmsg", "not on the socket");
  liar("bad-slot", "slot", "record slot 64, beyond the sender's depth 64");
  liar("bad-slotmax", "slotmax", "record slot 1024 (at most 1023)");
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
