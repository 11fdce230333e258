/*
 * The broker changes while members are busy: four processes keep opening,
 * checking and releasing a shared segment and creating and unlinking their
 * own, while the process hosting the broker is killed (kill -9) -- and, in
 * a second round, leaves cleanly. Not one of their calls fails.
 */
#include "test.h"
#include "helpers/seg_peer.h"

#include <stdbool.h>

#define NW 4

static void change_broker(const char *domain, bool crash)
{
  struct peer host, w[NW];
  peer_start(&host);
  PEER_OK(&host, "join %s", domain);
  PEER_OK(&host, "open hot 65536 c");
  PEER_OK(&host, "fill hot 33");
  for (int i = 0; i < NW; i++) {
    peer_start(&w[i]);
    PEER_OK(&w[i], "join %s", domain);
    PEER_OK(&w[i], "open hot 0 -"); /* held throughout */
  }
  for (int i = 0; i < NW; i++)
    peer_send(&w[i], "churn hot 33 2500");
  usleep(800000);
  if (crash) {
    peer_kill(&host);
  } else {
    PEER_OK(&host, "release hot");
    PEER_OK(&host, "leave");
    peer_finish(&host);
  }
  for (int i = 0; i < NW; i++) {
    const char *r = peer_read(&w[i], PEER_REPLY_MS);
    int rounds;
    if (sscanf(r, "ok %d", &rounds) != 1)
      TFAIL("worker %d, the broker's host %s: %s", i,
            crash ? "killed" : "leaving", r);
    ASSERT_GT(rounds, 0);
  }
  for (int i = 0; i < NW; i++) {
    PEER_OK(&w[i], "check hot 33");
    PEER_OK(&w[i], "leave");
    peer_finish(&w[i]);
  }
}

int main(void)
{
  change_broker("busy1", true);
  change_broker("busy2", false);
  printf("broker_busy: ok\n");
  return 0;
}
