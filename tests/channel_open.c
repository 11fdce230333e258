/*
 * Meeting by name. Bad names and options are refused; an opener alone
 * times out and leaves the name usable; four processes opening one name
 * make two pairs, each end seeing its own peer; an opener killed while it
 * waits is replaced by the next; and a channel carries tensors both ways:
 * a view sent back to its exporter comes home as the exporter's own
 * buffer, at the same address.
 */
#include "helpers/chan_common.h"

#include <signal.h>
#include <unistd.h>

static gpuipc_domain_t *dom;

static void refusals(void)
{
  gpuipc_channel_t *ch = NULL;
  ASSERT_RC(gpuipc_channel_open(dom, "a/b", NULL, &ch), -EINVAL);
  ASSERT_ERR_MENTIONS("allowed");
  ASSERT_RC(gpuipc_channel_open(dom, "", NULL, &ch), -EINVAL);
  ASSERT_RC(gpuipc_channel_open(dom, ".x", NULL, &ch), -EINVAL);
  char longname[GPUIPC_CHANNEL_NAME_MAX + 2];
  memset(longname, 'n', sizeof(longname) - 1);
  longname[sizeof(longname) - 1] = '\0';
  ASSERT_RC(gpuipc_channel_open(dom, longname, NULL, &ch), -EINVAL);
  gpuipc_channel_opts_t o = {.size = sizeof(o), .depth = 3};
  ASSERT_RC(gpuipc_channel_open(dom, "x", &o, &ch), -EINVAL);
  ASSERT_ERR_MENTIONS("depth 3");
  o.depth = 2048;
  ASSERT_RC(gpuipc_channel_open(dom, "x", &o, &ch), -EINVAL);
  o.depth = 0;
  o.flags = 1;
  ASSERT_RC(gpuipc_channel_open(dom, "x", &o, &ch), -EINVAL);
  ASSERT_RC(gpuipc_channel_open(NULL, "x", NULL, &ch), -EINVAL);
  ASSERT_TRUE(ch == NULL);
}

static void alone(void)
{
  gpuipc_channel_opts_t o = {.size = sizeof(o), .timeout_ms = 200};
  gpuipc_channel_t *ch = NULL;
  ASSERT_RC(gpuipc_channel_open(dom, "alone", &o, &ch), -ETIMEDOUT);
  ASSERT_TRUE(ch == NULL);
  /* The name still pairs the next two openers. */
  const char *args[] = {"pair", "chan-open", "alone", NULL};
  pid_t a = test_spawn("chan_peer", args, NULL);
  pid_t b = test_spawn("chan_peer", args, NULL);
  ASSERT_EQ(test_wait(a, 60000), 0);
  ASSERT_EQ(test_wait(b, 60000), 0);
}

static void two_pairs(void)
{
  const char *args[] = {"pair", "chan-open", "four", NULL};
  pid_t p[4];
  for (int i = 0; i < 4; i++)
    p[i] = test_spawn("chan_peer", args, NULL);
  for (int i = 0; i < 4; i++)
    ASSERT_EQ(test_wait(p[i], 60000), 0);
}

static void dead_opener(void)
{
  const char *wargs[] = {"open-wait", "chan-open", "dead", NULL};
  pid_t w = test_spawn("chan_peer", wargs, NULL);
  /* Wait until it holds the channel's segment, then kill it. */
  gpuipc_segment_info_t si = {.size = sizeof(si)};
  for (int i = 0; i < 3000; i++) {
    if (gpuipc_segment_stat(dom, "chan.dead", &si) == 0 && si.nholders > 0)
      break;
    usleep(10000);
  }
  ASSERT_GT(si.nholders, 0);
  ASSERT_EQ(si.holder_pids[0], w);
  ASSERT_OK(kill(w, SIGKILL));
  ASSERT_EQ(test_wait(w, 30000), 128 + SIGKILL);
  const char *args[] = {"pair", "chan-open", "dead", NULL};
  pid_t a = test_spawn("chan_peer", args, NULL);
  pid_t b = test_spawn("chan_peer", args, NULL);
  ASSERT_EQ(test_wait(a, 60000), 0);
  ASSERT_EQ(test_wait(b, 60000), 0);
}

static void both_ways(void)
{
  const char *args[] = {"echo", "chan-open", "echo", "50", NULL};
  pid_t pid = test_spawn("chan_peer", args, NULL);
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, "echo", NULL, &ch));
  gpuipc_buf_t *buf;
  ASSERT_OK(gpuipc_buf_alloc(CHAN_SLOT * CHAN_SLOTS, GPUIPC_KIND_HOST, -1, 0,
                             &buf));
  for (uint64_t i = 1; i <= 50; i++) {
    struct chan_msg m;
    gpuipc_tensor_t t;
    uint8_t *p = (uint8_t *)gpuipc_buf_ptr(buf) + (i % CHAN_SLOTS) * CHAN_SLOT;
    chan_msg_make(i, 0, p, buf, &m, &t);
    uint64_t ticket;
    ASSERT_OK(gpuipc_send(ch, &t, NULL, 0, &ticket));
    gpuipc_tensor_t *v;
    ASSERT_OK(gpuipc_recv(ch, &v, NULL, 30000));
    ASSERT_PTR_EQ(v->buf, buf); /* our own buffer, not a second mapping */
    ASSERT_PTR_EQ((uint8_t *)v->dl.data + v->dl.byte_offset, p);
    const char *why = chan_msg_check(i, 0, v);
    if (why != NULL)
      TFAIL("echo: %s", why);
    ASSERT_RC(gpuipc_send_done(ch, ticket, 0), -EAGAIN); /* echo holds it */
    ASSERT_OK(gpuipc_tensor_release(v, NULL));
    ASSERT_OK(gpuipc_send_done(ch, ticket, 30000));
  }
  ASSERT_EQ(test_wait(pid, 60000), 0);
  gpuipc_channel_info_t info = {.size = sizeof(info)};
  ASSERT_OK(gpuipc_channel_info(ch, &info));
  ASSERT_EQ(info.sent, 50);
  ASSERT_EQ(info.received, 50);
  ASSERT_OK(gpuipc_channel_close(ch));
  gpuipc_buf_release(buf);
}

int main(void)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  ASSERT_OK(gpuipc_domain_join("chan-open", NULL, &dom));
  refusals();
  alone();
  two_pairs();
  dead_opener();
  both_ways();
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
