/*
 * The other end of the channel tests: chan_peer MODE DOMAIN CHANNEL ARGS...
 *
 *   recv-order N         receive N views, check each against message i
 *   recv-slow N GATEFD   wait for a byte on GATEFD, then as recv-order,
 *                        pausing now and then
 *   recv-after N GATEFD  wait for a byte on GATEFD, receive N views in
 *                        order, then find the sender gone (it died)
 *   recv-into N          receive N messages with gpuipc_channel_recv_into; message
 *                        5 first into a destination of the wrong shape
 *   recv-die MS          open, receive nothing, kill itself after MS ms
 *   echo N               receive N views and send each back (zero-copy)
 *   echo-gpu N           as echo, for views on CUDA device 0 (read on the
 *                        host: on the fake CUDA driver only); nothing of
 *                        CUDA started before the first receive
 *   send-hold N          send N messages from a HOST buffer, then wait to
 *                        be killed
 *   send-die N MS        send N messages, kill itself MS ms later
 *   pair                 send our pid, receive the peer's, compare it with
 *                        what the channel says
 *   pair-cuda            as pair, CUDA started before the open (device
 *                        0's primary context, where a driver is), as in
 *                        a GPU program
 *   pair-host            as pair, then check that the CUDA driver
 *                        (GPUIPC_CUDA_LIB) was never loaded: HOST messages
 *                        start no CUDA
 *   open-wait            open and wait (to be killed while waiting)
 *   pair-late GO MAPPED  as pair, but once the channel's segment is mapped
 *                        write a byte to fd MAPPED and wait for one on fd
 *                        GO before looking at it
 *   pair-die             as pair, but as end A die (SIGKILL) once the
 *                        segment is marked PAIRED, before its name is
 *                        unlinked
 *
 * Exit 0 when everything checked out; 1 with a message otherwise.
 */
#include "channel/channel.h"
#include "helpers/chan_common.h"

#include <signal.h>
#include <unistd.h>

static gpuipc_domain_t *dom;
static int late_go = -1, late_mapped = -1;

static void late_hook(const char *name, int where)
{
  (void)name;
  if (where != GPUIPC__CHAN_HOOK_MAPPED || late_go < 0)
    return;
  char c = 'm';
  ASSERT_EQ(write(late_mapped, &c, 1), 1);
  ASSERT_EQ(read(late_go, &c, 1), 1);
  late_go = -1; /* only the first mapping waits */
}

static void die_hook(const char *name, int where)
{
  (void)name;
  if (where == GPUIPC__CHAN_HOOK_PAIRED)
    kill(getpid(), SIGKILL);
}

static gpuipc_channel_t *open_ch(const char *name, int timeout_ms)
{
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.timeout_ms = timeout_ms;
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, name, &o, &ch));
  return ch;
}

/* Then @end (-EAGAIN, or GPUIPC_E_PEER_GONE when the sender died). */
static void recv_order(gpuipc_channel_t *ch, long n, int gate, int end)
{
  if (gate >= 0) {
    char c;
    ASSERT_EQ(read(gate, &c, 1), 1);
  }
  for (long i = 1; i <= n; i++) {
    gpuipc_tensor_t *v;
    ASSERT_OK(gpuipc_channel_recv(ch, &v, NULL, 30000));
    const char *why = chan_msg_check((uint64_t)i, 0, v);
    if (why != NULL)
      TFAIL("%s", why);
    ASSERT_OK(gpuipc_tensor_release(v, NULL));
    if (gate >= 0 && i % 97 == 0)
      usleep(1000); /* a slow receiver */
  }
  gpuipc_tensor_t *v;
  ASSERT_RC(gpuipc_channel_recv(ch, &v, NULL, 0), end);
}

static void recv_into(gpuipc_channel_t *ch, long n)
{
  uint8_t *dst = malloc(CHAN_SLOT);
  ASSERT_TRUE(dst != NULL);
  for (long i = 1; i <= n; i++) {
    struct chan_msg m;
    chan_msg_spec((uint64_t)i, 1, &m);
    gpuipc_tensor_t t;
    memset(&t, 0, sizeof(t));
    t.dl.data = dst;
    t.dl.device.device_type = GPUIPC_DL_CPU;
    t.dl.ndim = m.ndim;
    t.dl.dtype = m.dt;
    t.dl.shape = m.shape;
    if (i == 5) {
      /* The wrong shape: refused, and the message stays first in line. */
      int64_t wrong[2] = {m.shape[0] + 1, m.shape[1]};
      t.dl.shape = wrong;
      ASSERT_RC(gpuipc_channel_recv_into(ch, &t, NULL, 30000), -EINVAL);
      ASSERT_ERR_MENTIONS("stays first in line");
      t.dl.shape = m.shape;
    }
    memset(dst, 0, CHAN_SLOT);
    ASSERT_OK(gpuipc_channel_recv_into(ch, &t, NULL, 30000));
    size_t bad = test_check(dst, m.span, (uint64_t)i);
    if (bad != (size_t)-1)
      TFAIL("message %ld: byte %zu of %zu differs", i, bad, m.span);
  }
  gpuipc_channel_info_t info = {.size = sizeof(info)};
  ASSERT_OK(gpuipc_channel_info(ch, &info));
  ASSERT_EQ(info.received, n);
  /* One HOST buffer and one staging buffer: nothing else was exported. */
  ASSERT_EQ(info.buffers_imported, 2);
  free(dst);
}

static void echo(gpuipc_channel_t *ch, long n, int dev_type)
{
  for (long i = 1; i <= n; i++) {
    gpuipc_tensor_t *v;
    ASSERT_OK(gpuipc_channel_recv(ch, &v, NULL, 30000));
    const char *why = chan_msg_check_on((uint64_t)i, 0, v, dev_type);
    if (why != NULL)
      TFAIL("%s", why);
    uint64_t ticket;
    ASSERT_OK(gpuipc_channel_send(ch, v, NULL, 0, &ticket));
    ASSERT_OK(gpuipc_channel_send_done(ch, ticket, 30000));
    ASSERT_OK(gpuipc_tensor_release(v, NULL));
  }
}

/* Send messages 1..n from a HOST buffer, one slot each. */
static gpuipc_buf_t *send_n(gpuipc_channel_t *ch, long n)
{
  gpuipc_buf_t *buf;
  ASSERT_OK(gpuipc_buf_alloc(CHAN_SLOT * CHAN_SLOTS, GPUIPC_KIND_HOST, -1, 0,
                             &buf));
  for (long i = 1; i <= n; i++) {
    struct chan_msg m;
    gpuipc_tensor_t t;
    uint8_t *p = (uint8_t *)gpuipc_buf_ptr(buf) + (i % CHAN_SLOTS) * CHAN_SLOT;
    chan_msg_make((uint64_t)i, 0, p, buf, &m, &t);
    ASSERT_OK(gpuipc_channel_send(ch, &t, NULL, 0, NULL));
  }
  return buf;
}

static void pair(gpuipc_channel_t *ch)
{
  gpuipc_buf_t *buf;
  ASSERT_OK(gpuipc_buf_alloc(4096, GPUIPC_KIND_HOST, -1, 0, &buf));
  int32_t *p = gpuipc_buf_ptr(buf);
  p[0] = (int32_t)getpid();
  int64_t shape[1] = {1};
  gpuipc_tensor_t t = {.dl = {.data = p,
                              .device = {GPUIPC_DL_CPU, 0},
                              .ndim = 1,
                              .dtype = {GPUIPC_DL_INT, 32, 1},
                              .shape = shape},
                       .buf = buf};
  uint64_t ticket;
  ASSERT_OK(gpuipc_channel_send(ch, &t, NULL, 0, &ticket));
  gpuipc_tensor_t *v;
  ASSERT_OK(gpuipc_channel_recv(ch, &v, NULL, 30000));
  gpuipc_channel_info_t info = {.size = sizeof(info)};
  ASSERT_OK(gpuipc_channel_info(ch, &info));
  int32_t peer = *(int32_t *)((uint8_t *)v->dl.data + v->dl.byte_offset);
  ASSERT_EQ(peer, info.peer_pid);
  ASSERT_NE(peer, getpid());
  ASSERT_OK(gpuipc_tensor_release(v, NULL));
  ASSERT_OK(gpuipc_channel_send_done(ch, ticket, 30000));
  printf("pair: pid %d end %d peer %d\n", (int)getpid(), info.end, peer);
  gpuipc_buf_release(buf);
}

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc < 4)
    TFAIL("usage: chan_peer MODE DOMAIN CHANNEL ARGS...");
  const char *mode = argv[1];
  test_stamp("chan_peer %s %s: joining", mode, argv[3]);
  ASSERT_OK(gpuipc_domain_join(argv[2], NULL, &dom));
  test_stamp("chan_peer %s %s: joined, opening", mode, argv[3]);
  if (strcmp(mode, "open-wait") == 0) {
    gpuipc_channel_t *ch = open_ch(argv[3], 120000);
    gpuipc_channel_close(ch);
    return 0;
  }
  if (strcmp(mode, "pair-late") == 0) {
    if (argc != 6)
      TFAIL("usage: chan_peer pair-late DOMAIN CHANNEL GO MAPPED");
    late_go = (int)chan_arg(argv[4]);
    late_mapped = (int)chan_arg(argv[5]);
    gpuipc__chan_test_hook(late_hook);
    mode = "pair";
  } else if (strcmp(mode, "pair-die") == 0) {
    gpuipc__chan_test_hook(die_hook);
    mode = "pair";
  }
  bool host_only = strcmp(mode, "pair-host") == 0;
  if (host_only) {
    mode = "pair";
  } else if (strcmp(mode, "pair-cuda") == 0) {
    test_warm_driver();
    mode = "pair";
  }
  gpuipc_channel_t *ch = open_ch(argv[3], 30000);
  test_stamp("chan_peer %s %s: opened", mode, argv[3]);
  long n = argc > 4 ? chan_arg(argv[4]) : 0;
  gpuipc_buf_t *buf = NULL;
  if (strcmp(mode, "recv-order") == 0) {
    recv_order(ch, n, -1, -EAGAIN);
  } else if (strcmp(mode, "recv-slow") == 0) {
    recv_order(ch, n, (int)chan_arg(argv[5]), -EAGAIN);
  } else if (strcmp(mode, "recv-after") == 0) {
    recv_order(ch, n, (int)chan_arg(argv[5]), GPUIPC_E_PEER_GONE);
  } else if (strcmp(mode, "recv-into") == 0) {
    recv_into(ch, n);
  } else if (strcmp(mode, "recv-die") == 0) {
    usleep((useconds_t)n * 1000);
    kill(getpid(), SIGKILL);
  } else if (strcmp(mode, "echo") == 0) {
    echo(ch, n, GPUIPC_DL_CPU);
  } else if (strcmp(mode, "echo-gpu") == 0) {
    echo(ch, n, GPUIPC_DL_CUDA);
  } else if (strcmp(mode, "send-hold") == 0) {
    buf = send_n(ch, n);
    printf("sent %ld\n", n);
    for (;;)
      pause();
  } else if (strcmp(mode, "send-die") == 0) {
    buf = send_n(ch, n);
    usleep((useconds_t)chan_arg(argv[5]) * 1000);
    kill(getpid(), SIGKILL);
  } else if (strcmp(mode, "pair") == 0) {
    pair(ch);
  } else {
    TFAIL("unknown mode %s", mode);
  }
  ASSERT_OK(gpuipc_channel_close(ch));
  if (buf != NULL)
    gpuipc_buf_release(buf);
  ASSERT_OK(gpuipc_domain_leave(dom));
  if (host_only && test_driver_loaded())
    TFAIL("HOST messages loaded the CUDA driver %s", getenv("GPUIPC_CUDA_LIB"));
  return 0;
}
