/*
 * The other end of tests/channel_poll.c: chan_poll_peer MODE ARGS...
 *
 *   burst DOMAIN N M SEED GATEFD
 *       open channels p0..p3; send N messages (chan_common.h's message i)
 *       on each, in bursts of 1..8 on a random channel at random moments,
 *       each from a slot of a HOST buffer that is reused only once its
 *       message is free; meanwhile receive, check and release the M
 *       messages the peer sends on p0 and p1 (polling, never through
 *       gpuipc_channel_fd); then wait until every message of ours is
 *       free, and for a byte on GATEFD (or to be killed).
 *   liar DOMAIN NAME WHAT TIMEOUT_MS
 *       open NAME with a hello that carries WHAT instead of the eventfd
 *       (pipe: a pipe; blocking: an eventfd without O_NONBLOCK); print
 *       what the open returned and exit 0.
 *
 * Exit 0 when everything checked out; 1 with a message otherwise.
 */
#include "channel/channel.h"
#include "helpers/chan_common.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define NCH 4

static uint64_t rng;

static uint32_t rnd(uint32_t n)
{
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)((rng >> 33) % n);
}

struct out {
  gpuipc_channel_t *ch;
  gpuipc_buf_t *buf;
  uint64_t sent;
  uint64_t got; /* of the peer's (p0 and p1) */
};

static void send_one(struct out *o, int c)
{
  uint64_t i = ++o->sent;
  if (i > CHAN_SLOTS) /* the slot's previous message must be free */
    ASSERT_OK(gpuipc_channel_send_done(o->ch, i - CHAN_SLOTS, 30000));
  struct chan_msg m;
  gpuipc_tensor_t t;
  uint8_t *p = (uint8_t *)gpuipc_buf_ptr(o->buf) + (i % CHAN_SLOTS) * CHAN_SLOT;
  chan_msg_make(i, 0, p, o->buf, &m, &t);
  uint64_t ticket;
  ASSERT_OK(gpuipc_channel_send(o->ch, &t, NULL, 0, &ticket));
  if (ticket != i)
    TFAIL("p%d: ticket %llu for message %llu", c, (unsigned long long)ticket,
          (unsigned long long)i);
}

/* Receive what is there (@timeout_ms 0) or one message (else). */
static void take(struct out *o, int c, int timeout_ms)
{
  for (;;) {
    gpuipc_tensor_t *v;
    int rc = gpuipc_channel_recv(o->ch, &v, NULL, timeout_ms);
    if (rc == -EAGAIN && timeout_ms == 0)
      return;
    if (rc != 0)
      TFAIL_GPUIPC("p%d: recv of message %llu: %s", c,
                   (unsigned long long)o->got + 1, gpuipc_err_name(rc));
    const char *why = chan_msg_check(++o->got, 0, v);
    if (why != NULL)
      TFAIL("p%d: %s", c, why);
    ASSERT_OK(gpuipc_tensor_release(v, NULL));
    if (timeout_ms != 0)
      return;
  }
}

static int burst(char **argv)
{
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join(argv[0], NULL, &dom));
  uint64_t n = (uint64_t)chan_arg(argv[1]), m = (uint64_t)chan_arg(argv[2]);
  rng = (uint64_t)chan_arg(argv[3]);
  int gate = (int)chan_arg(argv[4]);
  struct out o[NCH];
  for (int c = 0; c < NCH; c++) {
    char name[8];
    snprintf(name, sizeof(name), "p%d", c);
    memset(&o[c], 0, sizeof(o[c]));
    ASSERT_OK(gpuipc_channel_open(dom, name, NULL, &o[c].ch));
    ASSERT_OK(gpuipc_buf_alloc(CHAN_SLOT * CHAN_SLOTS, GPUIPC_KIND_HOST, -1,
                               0, &o[c].buf));
  }
  for (;;) {
    int c = (int)rnd(NCH), left = 0;
    for (int k = 0; k < NCH; k++)
      left += o[k].sent < n;
    if (left == 0)
      break;
    if (o[c].sent == n)
      continue;
    for (uint32_t b = 1 + rnd(8); b > 0 && o[c].sent < n; b--)
      send_one(&o[c], c);
    take(&o[0], 0, 0);
    take(&o[1], 1, 0);
    uint32_t r = rnd(4);
    if (r > 0) /* now and then at once, else after up to 3 ms */
      usleep(rnd(1000 * r));
  }
  for (int c = 0; c < 2; c++)
    while (o[c].got < m)
      take(&o[c], c, 30000);
  for (int c = 0; c < NCH; c++)
    for (uint64_t t = n > CHAN_SLOTS ? n - CHAN_SLOTS + 1 : 1; t <= n; t++)
      ASSERT_OK(gpuipc_channel_send_done(o[c].ch, t, 30000));
  /* Nothing more to take: the peer has sent all it sends. */
  for (int c = 0; c < 2; c++) {
    gpuipc_tensor_t *v;
    ASSERT_RC(gpuipc_channel_recv(o[c].ch, &v, NULL, 0), -EAGAIN);
  }
  char x;
  if (read(gate, &x, 1) != 1)
    TFAIL("gate: the test went away");
  for (int c = 0; c < NCH; c++) {
    ASSERT_OK(gpuipc_channel_close(o[c].ch));
    gpuipc_buf_release(o[c].buf);
  }
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}

static int liar(char **argv)
{
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join(argv[0], NULL, &dom));
  int fd, p[2] = {-1, -1};
  if (strcmp(argv[2], "pipe") == 0) {
    ASSERT_OK(pipe2(p, O_CLOEXEC | O_NONBLOCK));
    fd = p[0];
  } else if (strcmp(argv[2], "blocking") == 0) {
    fd = eventfd(0, EFD_CLOEXEC);
    ASSERT_GE(fd, 0);
  } else {
    TFAIL("liar: what is %s?", argv[2]);
  }
  gpuipc__chan_test_hello_fd(fd);
  gpuipc_channel_opts_t o = {.size = sizeof(o),
                             .timeout_ms = (int)chan_arg(argv[3])};
  gpuipc_channel_t *ch = NULL;
  int rc = gpuipc_channel_open(dom, argv[1], &o, &ch);
  printf("liar %s: open returned %s\n", argv[2], gpuipc_err_name(rc));
  if (rc == 0)
    ASSERT_OK(gpuipc_channel_close(ch));
  close(fd);
  if (p[1] >= 0)
    close(p[1]);
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc == 7 && strcmp(argv[1], "burst") == 0)
    return burst(argv + 2);
  if (argc == 6 && strcmp(argv[1], "liar") == 0)
    return liar(argv + 2);
  TFAIL("usage: chan_poll_peer burst DOMAIN N M SEED GATEFD | "
        "liar DOMAIN NAME pipe|blocking TIMEOUT_MS");
}
