/*
 * What the lying channel peers (chan_liar, chan_blocks_peer's "lie")
 * share: the honest first message that makes the receiver map their
 * buffer as key 1, and the wait for the receiver to close.
 */
#ifndef GPUIPC_TEST_CHAN_LIE_H
#define GPUIPC_TEST_CHAN_LIE_H

#include "channel/channel.h"
#include "helpers/chan_common.h"

/* Message 1 of chan_common.h from HOST buffer @buf, which the receiver
 * then knows as buffer key 1. */
static inline void chan_lie_first(gpuipc_channel_t *ch, gpuipc_buf_t *buf)
{
  struct chan_msg m;
  gpuipc_tensor_t t;
  chan_msg_make(1, 0, gpuipc_buf_ptr(buf), buf, &m, &t);
  ASSERT_OK(gpuipc_channel_send(ch, &t, NULL, 0, NULL));
  ASSERT_EQ_U(gpuipc__chan_last_key(ch), 1);
}

/* Until the receiver closes its end (taking and giving back what it
 * sends); then close this one. */
static inline void chan_lie_until_closed(gpuipc_channel_t *ch)
{
  gpuipc_tensor_t *v;
  int rc;
  while ((rc = gpuipc_channel_recv(ch, &v, NULL, 60000)) == 0)
    gpuipc_tensor_release(v, NULL);
  ASSERT_RC(rc, GPUIPC_E_PEER_GONE);
  gpuipc_channel_close(ch);
}

#endif
