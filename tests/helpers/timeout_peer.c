/*
 * The other end of tests/timeouts.c: timeout_peer CMDFD ACKFD.
 * Opens the channels of timeout_peer.h in order (GPUIPC_TIMEOUT_FOREVER),
 * then does what each command on CMDFD says and answers it on ACKFD.
 * Exit 0 when everything checked out; 1 with a message otherwise.
 */
#include "helpers/timeout_peer.h"

#include <unistd.h>

static gpuipc_channel_t *ch[TP_NCHANS];

static void later(int ms)
{
  if (ms > 0)
    usleep((useconds_t)ms * 1000);
}

static void do_send(gpuipc_channel_t *c, gpuipc_buf_t *buf, uint64_t seq)
{
  uint8_t *base = gpuipc_buf_ptr(buf);
  struct chan_msg m;
  gpuipc_tensor_t t;
  chan_msg_make(seq, 1, base + (seq % CHAN_SLOTS) * CHAN_SLOT, buf, &m, &t);
  ASSERT_OK(gpuipc_channel_send(c, &t, NULL, 0, NULL));
}

static void do_recv(gpuipc_channel_t *c)
{
  gpuipc_tensor_t *v;
  ASSERT_OK(gpuipc_channel_recv(c, &v, NULL, GPUIPC_TIMEOUT_FOREVER));
  ASSERT_OK(gpuipc_tensor_release(v, NULL));
}

int main(int argc, char **argv)
{
  ASSERT_EQ(argc, 3);
  int cmdfd = (int)chan_arg(argv[1]), ackfd = (int)chan_arg(argv[2]);
  gpuipc_domain_opts_t dopts = {sizeof(dopts), 0, GPUIPC_TIMEOUT_FOREVER};
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join(TP_DOMAIN, &dopts, &dom));
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.timeout_ms = GPUIPC_TIMEOUT_FOREVER;
  o.send_timeout_ms = GPUIPC_TIMEOUT_FOREVER;
  for (int i = 0; i < TP_NCHANS; i++)
    ASSERT_OK(gpuipc_channel_open(dom, tp_chans[i], &o, &ch[i]));
  gpuipc_buf_t *buf;
  ASSERT_OK(gpuipc_buf_alloc(CHAN_SLOT * CHAN_SLOTS, GPUIPC_KIND_HOST, -1, 0,
                             &buf));
  struct tp_cmd c;
  while (read(cmdfd, &c, sizeof(c)) == (ssize_t)sizeof(c)) {
    if (c.op == 'q')
      break;
    ASSERT_TRUE(c.chan >= 0 && c.chan < TP_NCHANS);
    later(c.later_ms);
    if (c.op == 's')
      do_send(ch[c.chan], buf, c.seq);
    else if (c.op == 'r')
      do_recv(ch[c.chan]);
    else
      ASSERT_TRUE(!"unknown command");
    ASSERT_EQ(write(ackfd, "k", 1), 1);
  }
  for (int i = 0; i < TP_NCHANS; i++)
    ASSERT_OK(gpuipc_channel_close(ch[i]));
  gpuipc_buf_release(buf);
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
