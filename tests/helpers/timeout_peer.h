/*
 * What tests/timeouts.c and its peer (tests/helpers/timeout_peer.c) agree
 * on: the channels the peer opens, in this order, and the commands it
 * takes on a pipe.
 */
#ifndef GPUIPC_TEST_TIMEOUT_PEER_H
#define GPUIPC_TEST_TIMEOUT_PEER_H

#include "helpers/chan_common.h"

#define TP_DOMAIN "timeouts"
/* The test's domain timeout: what GPUIPC_TIMEOUT_DEFAULT waits. */
#define TP_DOMAIN_MS 300
/*
 * How long the peer lets pass before it acts on a "later" command: well
 * past the domain timeout, so that a call that returns 0 after it did
 * wait longer than GPUIPC_TIMEOUT_DEFAULT would have. Nothing is asserted
 * about durations: a peer that acted sooner would still pass.
 */
#define TP_LATER_MS (3 * TP_DOMAIN_MS)

/* The channels, opened by both in this order (the peer: FOREVER). */
static const char *const tp_chans[] = {"zero-open", "calls", "send-default",
                                       "send-forever", "send-old"};
enum { TP_ZERO_OPEN, TP_CALLS, TP_SEND_DEFAULT, TP_SEND_FOREVER, TP_SEND_OLD,
       TP_NCHANS };

/* A command: 's' send message @seq, 'r' receive one view and release it
 * (after @later ms), 'q' close all and exit. The peer answers each with a
 * byte once it has done it. */
struct tp_cmd {
  char op;
  int chan;
  int later_ms;
  uint64_t seq;
};

#endif
