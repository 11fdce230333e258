/*
 * The host of the broker leaves while the member first in line to take the
 * domain over said HELLO and then never reads its connection again (stuck,
 * stopped, or hostile). The broker offers the domain before handing over
 * anything, passes that member over when it does not accept, and hands the
 * domain to the next one, which answers: that member hosts the broker, and
 * the domain works at once -- a new process joins and opens a segment
 * within a timeout far below what an outage would last.
 */
#include "test.h"
#include "helpers/raw_proto.h"
#include "helpers/seg_peer.h"

int main(void)
{
  struct peer host, next, third;
  peer_start(&host);
  PEER_OK(&host, "join hs");
  PEER_OK(&host, "open x 4096 c");
  PEER_OK(&host, "fill x 33");
  PEER_OK(&host, "release x"); /* only the broker holds it now */

  int silent = raw_connect("hs"); /* first in line; never reads again */
  raw_hello(silent);
  peer_start(&next); /* second in line */
  PEER_OK(&next, "join hs");

  PEER_OK(&host, "leave");
  peer_finish(&host);
  struct peer_info in;
  peer_info(&next, &in);
  ASSERT_EQ(in.broker_pid, next.pid);
  ASSERT_EQ(in.hosts, 1);

  /* Another process finds the domain working, with what it held. */
  peer_start(&third);
  PEER_OK(&third, "setenv GPUIPC_TIMEOUT_MS 3000");
  PEER_OK(&third, "join hs");
  PEER_OK(&third, "open x 4096 -");
  PEER_OK(&third, "check x 33");
  peer_info(&third, &in);
  ASSERT_EQ(in.broker_pid, next.pid);
  PEER_OK(&third, "leave");
  peer_finish(&third);
  close(silent);
  PEER_OK(&next, "leave");
  peer_finish(&next);
  printf("broker_handoff_silent: ok\n");
  return 0;
}
