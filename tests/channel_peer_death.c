/*
 * Peer death. A sender killed with SIGKILL: the receiver's next call says
 * GPUIPC_E_PEER_GONE, and the HOST views it still holds stay readable with
 * the right bytes. A receiver blocked in gpuipc_channel_recv, and a sender blocked
 * by flow control, are woken by the peer's death with GPUIPC_E_PEER_GONE.
 */
#include "helpers/chan_common.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static gpuipc_domain_t *dom;

static void killed_sender(void)
{
  const char *args[] = {"send-hold", "chan-death", "hold", "3", NULL};
  pid_t pid = test_spawn("chan_peer", args, NULL);
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, "hold", NULL, &ch));
  gpuipc_tensor_t *v[3];
  for (int i = 0; i < 3; i++) {
    ASSERT_OK(gpuipc_channel_recv(ch, &v[i], NULL, 30000));
    const char *why = chan_msg_check((uint64_t)i + 1, 0, v[i]);
    if (why != NULL)
      TFAIL("%s", why);
  }
  ASSERT_OK(kill(pid, SIGKILL));
  ASSERT_EQ(test_wait(pid, 30000), 128 + SIGKILL);

  gpuipc_tensor_t *w = NULL;
  ASSERT_RC(gpuipc_channel_recv(ch, &w, NULL, 0), GPUIPC_E_PEER_GONE);
  ASSERT_RC(gpuipc_channel_recv(ch, &w, NULL, -1), GPUIPC_E_PEER_GONE);
  ASSERT_TRUE(w == NULL);
  ASSERT_RC(gpuipc_channel_send(ch, v[0], NULL, 0, NULL), GPUIPC_E_PEER_GONE);
  gpuipc_channel_info_t info = {.size = sizeof(info)};
  ASSERT_OK(gpuipc_channel_info(ch, &info));
  ASSERT_EQ(info.peer_gone, 1);
  ASSERT_EQ(info.views, 3);
  /* The memory outlives its exporter: every byte still there. */
  for (int i = 0; i < 3; i++) {
    const char *why = chan_msg_check((uint64_t)i + 1, 0, v[i]);
    if (why != NULL)
      TFAIL("after the sender died: %s", why);
    ASSERT_RC(gpuipc_tensor_release(v[i], NULL), GPUIPC_E_PEER_GONE);
  }
  ASSERT_OK(gpuipc_channel_info(ch, &info));
  ASSERT_EQ(info.views, 0);
  ASSERT_OK(gpuipc_channel_close(ch));
}

static void blocked_receiver(void)
{
  const char *args[] = {"send-die", "chan-death", "die", "1", "200", NULL};
  pid_t pid = test_spawn("chan_peer", args, NULL);
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, "die", NULL, &ch));
  gpuipc_tensor_t *v;
  ASSERT_OK(gpuipc_channel_recv(ch, &v, NULL, 30000));
  ASSERT_TRUE(chan_msg_check(1, 0, v) == NULL);
  ASSERT_OK(gpuipc_tensor_release(v, NULL));
  /* Blocks until the sender kills itself. */
  ASSERT_RC(gpuipc_channel_recv(ch, &v, NULL, -1), GPUIPC_E_PEER_GONE);
  ASSERT_EQ(test_wait(pid, 30000), 128 + SIGKILL);
  ASSERT_OK(gpuipc_channel_close(ch));
}

static void blocked_sender(void)
{
  const char *args[] = {"recv-die", "chan-death", "rdie", "200", NULL};
  pid_t pid = test_spawn("chan_peer", args, NULL);
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.depth = 2;
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, "rdie", &o, &ch));
  gpuipc_buf_t *buf;
  ASSERT_OK(gpuipc_buf_alloc(CHAN_SLOT * CHAN_SLOTS, GPUIPC_KIND_HOST, -1, 0,
                             &buf));
  struct chan_msg m;
  gpuipc_tensor_t t;
  int rc = 0;
  uint64_t i;
  for (i = 1; i <= 3 && rc == 0; i++) {
    chan_msg_make(i, 0, (uint8_t *)gpuipc_buf_ptr(buf) + i * CHAN_SLOT, buf,
                  &m, &t);
    rc = gpuipc_channel_send(ch, &t, NULL, 0, NULL);
  }
  /* The third send waits for a release that never comes. */
  ASSERT_RC(rc, GPUIPC_E_PEER_GONE);
  ASSERT_EQ(i, 4);
  ASSERT_EQ(test_wait(pid, 30000), 128 + SIGKILL);
  ASSERT_RC(gpuipc_channel_send_done(ch, 1, -1), GPUIPC_E_PEER_GONE);
  ASSERT_OK(gpuipc_channel_close(ch));
  gpuipc_buf_release(buf);
}

int main(void)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  ASSERT_OK(gpuipc_domain_join("chan-death", NULL, &dom));
  killed_sender();
  blocked_receiver();
  blocked_sender();
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
