/*
 * A receiver that lies in its releases: chan_rel_liar DOMAIN CHANNEL CASE
 * opens the channel, receives message 1 (kept), then writes a release
 * record that breaks one rule straight into the release ring, bypassing
 * every check of gpuipc_tensor_release. It then receives (and keeps)
 * what else comes until the sender closes.
 *
 * CASE: slot (message 1's seq, another record slot), seq (message 1's
 * slot, a seq never sent), beyond (a slot beyond the sender's depth),
 * twice (message 1 released honestly, then its release again).
 */
#include "channel/channel.h"
#include "helpers/chan_common.h"

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc != 4)
    TFAIL("usage: chan_rel_liar DOMAIN CHANNEL CASE");
  const char *c = argv[3];
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join(argv[1], NULL, &dom));
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, argv[2], NULL, &ch));
  gpuipc_tensor_t *v;
  ASSERT_OK(gpuipc_channel_recv(ch, &v, NULL, 30000));
  struct gpuipc__view *view = gpuipc__view_of(v);
  struct gpuipc__rel rl;
  memset(&rl, 0, sizeof(rl));
  rl.seq = view->seq;
  rl.slot = (uint16_t)view->slot;
  if (strcmp(c, "slot") == 0) {
    rl.slot = (uint16_t)(view->slot + 1);
  } else if (strcmp(c, "seq") == 0) {
    rl.seq = 7;
  } else if (strcmp(c, "beyond") == 0) {
    rl.slot = 4; /* the sender's depth */
  } else if (strcmp(c, "twice") == 0) {
    ASSERT_OK(gpuipc_tensor_release(v, NULL));
    v = NULL;
  } else {
    TFAIL("unknown case %s", c);
  }
  uint8_t bytes[GPUIPC__CHAN_REL_BYTES];
  int len = gpuipc__rel_encode(&rl, bytes, sizeof(bytes));
  ASSERT_GT(len, 0);
  ASSERT_OK(gpuipc__chan_inject_release(ch, bytes, (size_t)len));
  /* Until the sender closes its end, keeping what else it sends (no more
   * than its depth, 4, can be in flight), then letting go of it all: a
   * kept view holds the channel, which would outlive the close. */
  gpuipc_tensor_t *kept[8];
  int nkept = 0, rc;
  while (nkept < 8 &&
         (rc = gpuipc_channel_recv(ch, &kept[nkept], NULL, 60000)) == 0)
    nkept++;
  ASSERT_LT(nkept, 8);
  ASSERT_RC(rc, GPUIPC_E_PEER_GONE);
  for (int i = 0; i < nkept; i++)
    gpuipc_tensor_release(kept[i], NULL); /* the sender is gone: freed */
  if (v != NULL)
    gpuipc_tensor_release(v, NULL);
  gpuipc_channel_close(ch);
  gpuipc_domain_leave(dom);
  return 0;
}
