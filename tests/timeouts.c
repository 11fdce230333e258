/*
 * One meaning of a timeout in every call that takes one (include/gpuipc.h,
 * "Timeouts"): 0 returns at once with the documented code when nothing is
 * there, GPUIPC_TIMEOUT_FOREVER waits until the peer acts,
 * GPUIPC_TIMEOUT_DEFAULT takes the domain's timeout (the domain is joined
 * with TP_DOMAIN_MS, so it ends in -ETIMEDOUT), other negative values are
 * -EINVAL; gpuipc_channel_opts_t's timeouts follow it (DEFAULT from
 * GPUIPC_CHANNEL_OPTS_INIT and beyond an older caller's size). The peer is
 * tests/helpers/timeout_peer.c, acting on commands.
 */
#include "helpers/timeout_peer.h"

#include <sched.h>
#include <stddef.h>
#include <unistd.h>

static gpuipc_domain_t *dom;
static int cmd_w = -1, ack_r = -1;
static gpuipc_buf_t *buf;

/* Have the peer do @op on channel @chan, @later_ms from now. */
static void peer_do(char op, int chan, int later_ms, uint64_t seq)
{
  struct tp_cmd c = {op, chan, later_ms, seq};
  ASSERT_EQ(write(cmd_w, &c, sizeof(c)), (ssize_t)sizeof(c));
}

/* Wait for the peer to say it has done it. */
static void peer_done(void)
{
  char k;
  ASSERT_EQ(read(ack_r, &k, 1), 1);
}

static gpuipc_channel_opts_t opts(int timeout_ms, int send_timeout_ms)
{
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.timeout_ms = timeout_ms;
  o.send_timeout_ms = send_timeout_ms;
  o.depth = 1;
  return o;
}

static int send_msg(gpuipc_channel_t *ch, uint64_t seq, uint64_t *ticket)
{
  uint8_t *base = gpuipc_buf_ptr(buf);
  struct chan_msg m;
  gpuipc_tensor_t t;
  chan_msg_make(seq, 1, base + (seq % CHAN_SLOTS) * CHAN_SLOT, buf, &m, &t);
  return gpuipc_channel_send(ch, &t, NULL, 0, ticket);
}

/* Values below GPUIPC_TIMEOUT_DEFAULT, wherever a timeout is taken. */
static void bad_values(void)
{
  gpuipc_channel_t *ch = NULL;
  gpuipc_channel_opts_t o = opts(-3, GPUIPC_TIMEOUT_DEFAULT);
  ASSERT_RC(gpuipc_channel_open(dom, "lonely", &o, &ch), -EINVAL);
  ASSERT_ERR_MENTIONS("timeout_ms -3");
  o = opts(GPUIPC_TIMEOUT_DEFAULT, -3);
  ASSERT_RC(gpuipc_channel_open(dom, "lonely", &o, &ch), -EINVAL);
  ASSERT_ERR_MENTIONS("send_timeout_ms -3");
  ASSERT_TRUE(ch == NULL);
  gpuipc_segment_opts_t so = GPUIPC_SEGMENT_OPTS_INIT;
  so.flags = GPUIPC_WAIT;
  so.timeout_ms = -3;
  gpuipc_buf_t *seg = NULL;
  ASSERT_RC(gpuipc_segment_open(dom, "nothing", &so, &seg), -EINVAL);
  gpuipc_domain_opts_t dopts = {sizeof(dopts), 0, -3};
  gpuipc_domain_t *d2 = NULL;
  ASSERT_RC(gpuipc_domain_join(TP_DOMAIN, &dopts, &d2), -EINVAL);
}

/* Nobody opens the other end (or publishes the segment). */
static void nobody_comes(void)
{
  gpuipc_channel_t *ch = NULL;
  gpuipc_channel_opts_t o = opts(0, 0);
  ASSERT_RC(gpuipc_channel_open(dom, "lonely", &o, &ch), -ETIMEDOUT);
  o = opts(GPUIPC_TIMEOUT_DEFAULT, 0);
  ASSERT_RC(gpuipc_channel_open(dom, "lonely", &o, &ch), -ETIMEDOUT);
  /* A caller older than timeout_ms: the domain's timeout, not forever. */
  o.size = offsetof(gpuipc_channel_opts_t, timeout_ms);
  o.timeout_ms = GPUIPC_TIMEOUT_FOREVER; /* past its size: not read */
  ASSERT_RC(gpuipc_channel_open(dom, "lonely", &o, &ch), -ETIMEDOUT);
  ASSERT_TRUE(ch == NULL);
  gpuipc_segment_opts_t so = GPUIPC_SEGMENT_OPTS_INIT;
  so.flags = GPUIPC_WAIT;
  gpuipc_buf_t *seg = NULL;
  ASSERT_RC(gpuipc_segment_open(dom, "nothing", &so, &seg), -ETIMEDOUT);
  so.timeout_ms = 0;
  ASSERT_RC(gpuipc_segment_open(dom, "nothing", &so, &seg), -ETIMEDOUT);
}

/* timeout_ms 0 pairs with an end that is already waiting: the peer opens
 * "zero-open" first; until it waits, 0 finds nobody (-ETIMEDOUT). */
static gpuipc_channel_t *zero_open(void)
{
  gpuipc_channel_opts_t o = opts(0, GPUIPC_TIMEOUT_DEFAULT);
  gpuipc_channel_t *ch = NULL;
  int rc, tries = 0;
  while ((rc = gpuipc_channel_open(dom, tp_chans[TP_ZERO_OPEN], &o, &ch)) ==
         -ETIMEDOUT) {
    tries++;
    sched_yield();
  }
  ASSERT_OK(rc);
  printf("zero-open paired after %d -ETIMEDOUT\n", tries);
  return ch;
}

static void recv_calls(gpuipc_channel_t *ch)
{
  gpuipc_tensor_t *v = NULL;
  struct chan_msg m;
  chan_msg_spec(2, 1, &m);
  uint8_t mem[CHAN_SLOT];
  gpuipc_tensor_t dst = {0};
  dst.dl.data = mem;
  dst.dl.device.device_type = GPUIPC_DL_CPU;
  dst.dl.ndim = m.ndim;
  dst.dl.dtype = m.dt;
  dst.dl.shape = m.shape;
  dst.dl.strides = m.strides;

  ASSERT_RC(gpuipc_channel_recv(ch, &v, NULL, 0), -EAGAIN);
  ASSERT_RC(gpuipc_channel_recv_into(ch, &dst, NULL, 0), -EAGAIN);
  ASSERT_RC(gpuipc_channel_recv(ch, &v, NULL, GPUIPC_TIMEOUT_DEFAULT),
            -ETIMEDOUT);
  ASSERT_RC(gpuipc_channel_recv_into(ch, &dst, NULL, GPUIPC_TIMEOUT_DEFAULT),
            -ETIMEDOUT);
  ASSERT_RC(gpuipc_channel_recv(ch, &v, NULL, -3), -EINVAL);
  ASSERT_ERR_MENTIONS("timeout_ms -3");
  ASSERT_RC(gpuipc_channel_recv_into(ch, &dst, NULL, -3), -EINVAL);
  ASSERT_ERR_MENTIONS("timeout_ms -3");
  ASSERT_TRUE(v == NULL);

  peer_do('s', TP_CALLS, TP_LATER_MS, 1);
  ASSERT_OK(gpuipc_channel_recv(ch, &v, NULL, GPUIPC_TIMEOUT_FOREVER));
  const char *why = chan_msg_check(1, 1, v);
  ASSERT_TRUE(why == NULL);
  ASSERT_OK(gpuipc_tensor_release(v, NULL));
  peer_done();

  peer_do('s', TP_CALLS, TP_LATER_MS, 2);
  ASSERT_OK(gpuipc_channel_recv_into(ch, &dst, NULL, GPUIPC_TIMEOUT_FOREVER));
  ASSERT_EQ((int64_t)test_check(mem, m.span, 2), -1);
  peer_done();
}

static void send_calls(gpuipc_channel_t *ch)
{
  uint64_t t, t2;
  ASSERT_OK(send_msg(ch, 3, &t));
  /* Depth 1 and send_timeout_ms 0: no room, and no wait for it. */
  ASSERT_RC(send_msg(ch, 4, NULL), -EAGAIN);
  ASSERT_ERR_MENTIONS("send_timeout_ms 0");
  ASSERT_RC(gpuipc_channel_send_done(ch, t, 0), -EAGAIN);
  ASSERT_RC(gpuipc_channel_send_wait(ch, t, NULL, 0), -EAGAIN);
  ASSERT_RC(gpuipc_channel_send_done(ch, t, GPUIPC_TIMEOUT_DEFAULT),
            -ETIMEDOUT);
  ASSERT_RC(gpuipc_channel_send_wait(ch, t, NULL, GPUIPC_TIMEOUT_DEFAULT),
            -ETIMEDOUT);
  ASSERT_RC(gpuipc_channel_send_done(ch, t, -3), -EINVAL);
  ASSERT_RC(gpuipc_channel_send_wait(ch, t, NULL, -3), -EINVAL);

  peer_do('r', TP_CALLS, TP_LATER_MS, 0);
  ASSERT_OK(gpuipc_channel_send_done(ch, t, GPUIPC_TIMEOUT_FOREVER));
  peer_done();
  ASSERT_OK(send_msg(ch, 4, &t2));
  peer_do('r', TP_CALLS, TP_LATER_MS, 0);
  ASSERT_OK(gpuipc_channel_send_wait(ch, t2, NULL, GPUIPC_TIMEOUT_FOREVER));
  peer_done();
}

/*
 * The channels the peer opens after "zero-open", in its order, each of
 * depth 1 with the send timeout its name says.
 */
static void open_rest(gpuipc_channel_t *ch[TP_NCHANS])
{
  /* gpuipc_channel_recv & co. are called on "calls": it does not wait for
   * room. */
  gpuipc_channel_opts_t o = opts(GPUIPC_TIMEOUT_FOREVER, 0);
  ASSERT_OK(gpuipc_channel_open(dom, tp_chans[TP_CALLS], &o, &ch[TP_CALLS]));
  /* GPUIPC_CHANNEL_OPTS_INIT's send timeout: the domain's. */
  o.send_timeout_ms = ((gpuipc_channel_opts_t)GPUIPC_CHANNEL_OPTS_INIT)
                          .send_timeout_ms;
  ASSERT_OK(gpuipc_channel_open(dom, tp_chans[TP_SEND_DEFAULT], &o,
                                &ch[TP_SEND_DEFAULT]));
  o = opts(GPUIPC_TIMEOUT_FOREVER, GPUIPC_TIMEOUT_FOREVER);
  ASSERT_OK(gpuipc_channel_open(dom, tp_chans[TP_SEND_FOREVER], &o,
                                &ch[TP_SEND_FOREVER]));
  /* A caller older than send_timeout_ms: its 0 and the staging fields
   * past its size are not read; the send timeout is the domain's. */
  o = opts(GPUIPC_TIMEOUT_FOREVER, 0);
  o.stage_slots = 1000;
  o.size = offsetof(gpuipc_channel_opts_t, send_timeout_ms);
  ASSERT_OK(gpuipc_channel_open(dom, tp_chans[TP_SEND_OLD], &o,
                                &ch[TP_SEND_OLD]));
}

/* gpuipc_channel_send blocked on flow control (depth 1, one in flight). */
static void send_timeouts(gpuipc_channel_t *ch[TP_NCHANS])
{
  ASSERT_OK(send_msg(ch[TP_SEND_DEFAULT], 1, NULL));
  ASSERT_RC(send_msg(ch[TP_SEND_DEFAULT], 2, NULL), -ETIMEDOUT);
  ASSERT_ERR_MENTIONS("none given back");

  ASSERT_OK(send_msg(ch[TP_SEND_FOREVER], 1, NULL));
  peer_do('r', TP_SEND_FOREVER, TP_LATER_MS, 0);
  ASSERT_OK(send_msg(ch[TP_SEND_FOREVER], 2, NULL));
  peer_done();

  ASSERT_OK(send_msg(ch[TP_SEND_OLD], 1, NULL));
  ASSERT_RC(send_msg(ch[TP_SEND_OLD], 2, NULL), -ETIMEDOUT);
  ASSERT_ERR_MENTIONS("none given back");
}

int main(void)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  gpuipc_domain_opts_t dopts = {sizeof(dopts), 0, TP_DOMAIN_MS};
  ASSERT_OK(gpuipc_domain_join(TP_DOMAIN, &dopts, &dom));
  ASSERT_OK(gpuipc_buf_alloc(CHAN_SLOT * CHAN_SLOTS, GPUIPC_KIND_HOST, -1, 0,
                             &buf));
  bad_values();
  nobody_comes();

  int cmd[2], ack[2];
  ASSERT_OK(pipe(cmd));
  ASSERT_OK(pipe(ack));
  char c[16], a[16];
  snprintf(c, sizeof(c), "%d", cmd[0]);
  snprintf(a, sizeof(a), "%d", ack[1]);
  const char *args[] = {c, a, NULL};
  int keep[] = {cmd[0], ack[1], -1};
  pid_t pid = test_spawn("timeout_peer", args, keep);
  close(cmd[0]);
  close(ack[1]);
  cmd_w = cmd[1];
  ack_r = ack[0];

  gpuipc_channel_t *ch[TP_NCHANS];
  ch[TP_ZERO_OPEN] = zero_open();
  open_rest(ch);
  recv_calls(ch[TP_CALLS]);
  send_calls(ch[TP_CALLS]);
  send_timeouts(ch);

  peer_do('q', 0, 0, 0);
  ASSERT_EQ(test_wait(pid, 60000), 0);
  for (int i = 0; i < TP_NCHANS; i++)
    ASSERT_OK(gpuipc_channel_close(ch[i]));
  gpuipc_buf_release(buf);
  close(cmd_w);
  close(ack_r);
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
