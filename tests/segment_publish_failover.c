/*
 * A segment being filled when the process hosting the broker is killed:
 * its creator re-publishes it as filling to the new broker, which keeps it
 * invisible until the creator publishes; a reader waiting for it then gets
 * the creator's bytes. A segment the dead host itself was filling is gone
 * with it: its name is free for the next creator.
 */
#include "test.h"
#include "helpers/seg_peer.h"

int main(void)
{
  struct peer host, creator, reader;
  peer_start(&host);
  PEER_OK(&host, "join pubfo");
  struct peer_info hi;
  peer_info(&host, &hi);
  ASSERT_EQ(hi.broker_pid, host.pid);
  peer_start(&creator);
  peer_start(&reader);
  PEER_OK(&creator, "join pubfo");
  PEER_OK(&reader, "join pubfo");

  PEER_EXPECT(&creator, "ok 1 65536", "fopen F 65536 c");
  PEER_OK(&creator, "fill F 1"); /* half-way, say: not published */
  PEER_EXPECT(&host, "ok 1 4096", "fopen H 4096 c");
  PEER_EXPECT(&reader, "ok filling", "stat F");
  peer_kill(&host);

  /* The survivors find the new broker; F is still being filled. */
  struct peer_info ci;
  peer_info(&creator, &ci);
  ASSERT_TRUE(ci.broker_pid != host.pid);
  PEER_EXPECT(&reader, "ok filling", "stat F");
  PEER_EXPECT(&reader, "err ENOENT", "open F 0 -");
  /* The host's own filling segment went with it. */
  PEER_EXPECT(&reader, "ok 1 4096", "fopen H 4096 c");
  PEER_OK(&reader, "release H");

  peer_send(&reader, "wcheck F 9");
  PEER_OK(&creator, "fill F 9");
  PEER_OK(&creator, "publish F");
  const char *r = peer_read(&reader, PEER_REPLY_MS);
  if (strcmp(r, "ok 65536") != 0)
    TFAIL("reader: %s", r);
  PEER_EXPECT(&reader, "ok published", "stat F");
  PEER_OK(&creator, "unlink F");
  PEER_OK(&reader, "release F");
  peer_finish(&reader);
  peer_finish(&creator);
  return 0;
}
