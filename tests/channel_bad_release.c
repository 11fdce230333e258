/*
 * Malformed releases are refused by the sender. A lying receiver
 * (chan_rel_liar) writes a release record straight into the release ring:
 * for message 1 in another record slot than its own, for a message never
 * sent in message 1's slot, in a slot beyond the sender's depth, or for
 * message 1 a second time. Each is GPUIPC_E_PROTO at the sender with a
 * sentence naming the message and the slot, and the channel stays
 * refused; nothing is freed by the lie.
 */
#include "helpers/chan_common.h"

static gpuipc_domain_t *dom;

static void liar(const char *what, const char *mention)
{
  char name[32];
  snprintf(name, sizeof(name), "rel-%s", what);
  const char *args[] = {"chan-bad-rel", name, what, NULL};
  pid_t pid = test_spawn("chan_rel_liar", args, NULL);
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.depth = 4;
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, name, &o, &ch));
  gpuipc_buf_t *buf;
  ASSERT_OK(gpuipc_buf_alloc(4096, GPUIPC_KIND_HOST, -1, 0, &buf));
  struct chan_msg m;
  gpuipc_tensor_t t;
  chan_msg_make(1, 0, gpuipc_buf_ptr(buf), buf, &m, &t);
  uint64_t ticket = 0;
  ASSERT_OK(gpuipc_channel_send(ch, &t, NULL, 0, &ticket));
  ASSERT_EQ_U(ticket, 1);
  int rc = gpuipc_channel_send_done(ch, 1, 30000);
  /* twice: the honest release may have been taken in (message 1 freed)
   * before the lie came; later sends meet it, at the latest the one that
   * finds the depth full and waits for a release (the liar keeps the
   * views of the others). */
  while (rc == 0 && strcmp(what, "twice") == 0)
    rc = gpuipc_channel_send(ch, &t, NULL, 0, NULL);
  ASSERT_RC(rc, GPUIPC_E_PROTO);
  printf("%-7s -> %s\n", what, gpuipc_last_error());
  ASSERT_ERR_MENTIONS(mention);
  ASSERT_RC(gpuipc_channel_send(ch, &t, NULL, GPUIPC_SEND_NONBLOCK, NULL),
            GPUIPC_E_PROTO);
  ASSERT_OK(gpuipc_channel_close(ch));
  gpuipc_buf_release(buf);
  ASSERT_EQ(test_wait(pid, 60000), 0);
}

int main(void)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  ASSERT_OK(gpuipc_domain_join("chan-bad-rel", NULL, &dom));
  liar("slot", "release of message 1 (record slot 1), which is not in "
               "flight");
  liar("seq", "release of message 7 (record slot 0), which is not in "
              "flight");
  liar("beyond", "release of message 1 (record slot 4), which is not in "
                 "flight");
  liar("twice", "release of message 1 (record slot 0), which is not in "
                "flight");
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
