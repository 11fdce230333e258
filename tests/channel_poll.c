/*
 * gpuipc_channel_fd: one epoll loop serves four channels.
 *
 * A child (chan_poll_peer burst) sends bursts of HOST tensors on random
 * channels at random moments; the parent waits only in epoll_wait over
 * the four channel fds, receives with timeout 0 until -EAGAIN, checks
 * every byte and the order per channel, and releases. It also sends on
 * two channels and learns of their releases through the same fds
 * (gpuipc_channel_progress). A lost wake-up shows as epoll_wait waiting
 * 10 s, which fails naming the channels still short. Then: drained, the
 * fds are not readable; the child never asked for an fd, so the parent
 * wrote no eventfd of its; killed, the child makes every fd readable and
 * recv says GPUIPC_E_PEER_GONE.
 *
 * Within one process, step by step: a message published between a look
 * that found nothing and the arming (a test hook), or whose wake-up a
 * later call drained, still leaves the fd readable; releases wake it too.
 *
 * The hellos of the rendezvous: a peer whose hello carries a pipe, or a
 * blocking eventfd, fails the open with GPUIPC_E_PROTO, whichever end it
 * is; a peer of the first channel protocol, GPUIPC_E_VERSION.
 */
#include "channel/channel.h"
#include "helpers/chan_common.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#define NCH 4
#define N_FROM_CHILD 300 /* per channel */
#define N_TO_CHILD 200   /* on p0 and p1 */
#define WAIT_MS 10000

static gpuipc_domain_t *dom;

struct chan {
  gpuipc_channel_t *ch;
  int fd;
  uint64_t got;   /* messages received from the child */
  gpuipc_buf_t *buf;
  uint64_t sent;  /* messages sent to the child (p0, p1) */
  uint64_t freed; /* releases taken in (by a send or a progress) */
};

static void on_release(gpuipc_channel_t *ch, uint64_t ticket, void *user)
{
  struct chan *c = user;
  (void)ch;
  if (ticket != c->freed + 1)
    TFAIL("release of message %llu after %llu", (unsigned long long)ticket,
          (unsigned long long)c->freed);
  c->freed = ticket;
}

static bool chan_done(const struct chan *c, int i)
{
  return c->got == N_FROM_CHILD && (i >= 2 || c->freed == N_TO_CHILD);
}

/* Send what the free slots and the depth allow, without waiting. */
static void send_some(struct chan *c)
{
  while (c->sent < N_TO_CHILD && c->sent + 1 <= c->freed + CHAN_SLOTS) {
    uint64_t i = c->sent + 1;
    struct chan_msg m;
    gpuipc_tensor_t t;
    uint8_t *p = (uint8_t *)gpuipc_buf_ptr(c->buf) + (i % CHAN_SLOTS) * CHAN_SLOT;
    chan_msg_make(i, 0, p, c->buf, &m, &t);
    int rc = gpuipc_channel_send(c->ch, &t, NULL, GPUIPC_SEND_NONBLOCK, NULL);
    if (rc == -EAGAIN)
      return;
    ASSERT_OK(rc);
    c->sent = i;
  }
}

/* What the loop does for a ready channel: receive until -EAGAIN, progress. */
static void serve(struct chan *c, int i)
{
  for (;;) {
    gpuipc_tensor_t *v;
    int rc = gpuipc_channel_recv(c->ch, &v, NULL, 0);
    if (rc == -EAGAIN)
      break;
    if (rc != 0)
      TFAIL_GPUIPC("p%d: recv after %llu messages: %s", i,
                   (unsigned long long)c->got, gpuipc_err_name(rc));
    const char *why = chan_msg_check(++c->got, 0, v);
    if (why != NULL)
      TFAIL("p%d: %s", i, why);
    ASSERT_OK(gpuipc_tensor_release(v, NULL));
  }
  int n = gpuipc_channel_progress(c->ch);
  if (n < 0)
    TFAIL_GPUIPC("p%d: progress: %s", i, gpuipc_err_name(n));
}

static void short_channels(const struct chan *c, char *out, size_t cap)
{
  out[0] = '\0';
  for (int i = 0; i < NCH; i++)
    if (!chan_done(&c[i], i)) {
      size_t k = strlen(out);
      snprintf(out + k, cap - k, " p%d (received %llu/%d, sent %llu/%d, "
               "released %llu)", i, (unsigned long long)c[i].got,
               N_FROM_CHILD, (unsigned long long)c[i].sent,
               i < 2 ? N_TO_CHILD : 0, (unsigned long long)c[i].freed);
    }
}

static void event_loop(struct chan *c, int ep)
{
  for (;;) {
    bool done = true;
    for (int i = 0; i < NCH; i++)
      done = done && chan_done(&c[i], i);
    if (done)
      return;
    send_some(&c[0]);
    send_some(&c[1]);
    struct epoll_event ev[NCH];
    int n = epoll_wait(ep, ev, NCH, WAIT_MS);
    if (n < 0 && errno == EINTR)
      continue;
    if (n == 0) {
      char why[400];
      short_channels(c, why, sizeof(why));
      TFAIL("epoll_wait: no channel readable for %d ms, still short:%s "
            "(a lost wake-up)", WAIT_MS, why);
    }
    ASSERT_GT(n, 0);
    for (int k = 0; k < n; k++)
      serve(&c[ev[k].data.u32], (int)ev[k].data.u32);
  }
}

static void bursts(void)
{
  int gate[2];
  ASSERT_OK(pipe2(gate, O_CLOEXEC));
  char gs[16], seed[32], nf[16], nt[16];
  snprintf(gs, sizeof(gs), "%d", gate[0]);
  snprintf(nf, sizeof(nf), "%d", N_FROM_CHILD);
  snprintf(nt, sizeof(nt), "%d", N_TO_CHILD);
  unsigned long long s = (unsigned long long)time(NULL) ^ (unsigned)getpid();
  snprintf(seed, sizeof(seed), "%llu", s);
  printf("burst seed %llu\n", s);
  const char *args[] = {"burst", "chan-poll", nf, nt, seed, gs, NULL};
  int keep[] = {gate[0], -1};
  pid_t pid = test_spawn("chan_poll_peer", args, keep);
  close(gate[0]);

  ASSERT_RC(gpuipc_channel_fd(NULL), -EINVAL);
  struct chan c[NCH];
  int ep = epoll_create1(EPOLL_CLOEXEC);
  ASSERT_GE(ep, 0);
  for (int i = 0; i < NCH; i++) {
    char name[8];
    snprintf(name, sizeof(name), "p%d", i);
    memset(&c[i], 0, sizeof(c[i]));
    ASSERT_OK(gpuipc_channel_open(dom, name, NULL, &c[i].ch));
    ASSERT_OK(gpuipc_buf_alloc(CHAN_SLOT * CHAN_SLOTS, GPUIPC_KIND_HOST, -1,
                               0, &c[i].buf));
    ASSERT_OK(gpuipc_channel_on_release(c[i].ch, on_release, &c[i]));
    c[i].fd = gpuipc_channel_fd(c[i].ch);
    ASSERT_GE(c[i].fd, 0);
    ASSERT_EQ(gpuipc_channel_fd(c[i].ch), c[i].fd); /* the same each time */
    ASSERT_TRUE(fcntl(c[i].fd, F_GETFD) & FD_CLOEXEC);
    struct epoll_event e = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
    ASSERT_OK(epoll_ctl(ep, EPOLL_CTL_ADD, c[i].fd, &e));
  }
  event_loop(c, ep);

  /* Drained, with the child quiet: nothing is readable. */
  for (int i = 0; i < NCH; i++)
    serve(&c[i], i);
  struct epoll_event ev[NCH];
  ASSERT_EQ(epoll_wait(ep, ev, NCH, 0), 0);
  /* The child never asked for an fd: it cost this end no eventfd write. */
  for (int i = 0; i < NCH; i++)
    ASSERT_EQ_U(gpuipc__chan_poll_kicks(c[i].ch), 0);

  /* Killed, the child makes every fd readable. */
  ASSERT_OK(kill(pid, SIGKILL));
  ASSERT_EQ(test_wait(pid, 30000), 128 + SIGKILL);
  for (int i = 0; i < NCH; i++) {
    struct pollfd p = {.fd = c[i].fd, .events = POLLIN};
    ASSERT_EQ(poll(&p, 1, WAIT_MS), 1);
    ASSERT_TRUE(p.revents & POLLIN);
    gpuipc_tensor_t *v;
    ASSERT_RC(gpuipc_channel_recv(c[i].ch, &v, NULL, 0), GPUIPC_E_PEER_GONE);
  }
  for (int i = 0; i < NCH; i++) {
    ASSERT_OK(gpuipc_channel_close(c[i].ch));
    gpuipc_buf_release(c[i].buf);
  }
  close(ep);
  close(gate[1]);
}

static bool readable(int fd)
{
  struct pollfd p = {.fd = fd, .events = POLLIN};
  int n = poll(&p, 1, 0);
  ASSERT_GE(n, 0);
  return n == 1 && (p.revents & POLLIN);
}

static gpuipc_channel_t *hook_y;
static gpuipc_buf_t *hook_buf;
static uint64_t hook_seq;

static void send_msg(gpuipc_channel_t *ch, gpuipc_buf_t *buf, uint64_t i)
{
  struct chan_msg m;
  gpuipc_tensor_t t;
  uint8_t *p = (uint8_t *)gpuipc_buf_ptr(buf) + (i % CHAN_SLOTS) * CHAN_SLOT;
  chan_msg_make(i, 0, p, buf, &m, &t);
  ASSERT_OK(gpuipc_channel_send(ch, &t, NULL, 0, NULL));
}

/* In the window between the look and the arming: the peer sends. */
static void send_in_window(struct gpuipc_channel *ch)
{
  (void)ch;
  gpuipc__test_hook_chan_arm = NULL;
  send_msg(hook_y, hook_buf, hook_seq);
}

static void recv_msg(gpuipc_channel_t *ch, uint64_t i)
{
  gpuipc_tensor_t *v;
  ASSERT_OK(gpuipc_channel_recv(ch, &v, NULL, 0));
  const char *why = chan_msg_check(i, 0, v);
  if (why != NULL)
    TFAIL("%s", why);
  ASSERT_OK(gpuipc_tensor_release(v, NULL));
}

static void steps(void)
{
  gpuipc_channel_t *x, *y;
  test_chan_pair(dom, "steps", NULL, NULL, &x, &y);
  gpuipc_buf_t *bx, *by;
  ASSERT_OK(gpuipc_buf_alloc(CHAN_SLOT * CHAN_SLOTS, GPUIPC_KIND_HOST, -1, 0,
                             &bx));
  ASSERT_OK(gpuipc_buf_alloc(CHAN_SLOT * CHAN_SLOTS, GPUIPC_KIND_HOST, -1, 0,
                             &by));
  int fd = gpuipc_channel_fd(x);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(readable(fd)); /* at first */
  gpuipc_tensor_t *v;
  ASSERT_RC(gpuipc_channel_recv(x, &v, NULL, 0), -EAGAIN);
  ASSERT_EQ(gpuipc_channel_progress(x), 0);
  ASSERT_TRUE(!readable(fd));

  /* A message wakes it; a progress that takes nothing (and drains the
   * eventfd) leaves it readable while the message waits. */
  send_msg(y, by, 1);
  ASSERT_TRUE(readable(fd));
  ASSERT_EQ(gpuipc_channel_progress(x), 0);
  if (!readable(fd))
    TFAIL("message 1 waits, but the fd is not readable after a progress");
  recv_msg(x, 1);
  ASSERT_RC(gpuipc_channel_recv(x, &v, NULL, 0), -EAGAIN);
  ASSERT_EQ(gpuipc_channel_progress(x), 0);
  ASSERT_TRUE(!readable(fd));

  /* Published after recv looked, before it armed (message 2's wake-up
   * disarmed x, and this recv drains it). */
  send_msg(y, by, 2);
  recv_msg(x, 2);
  hook_y = y;
  hook_buf = by;
  hook_seq = 3;
  gpuipc__test_hook_chan_arm = send_in_window;
  ASSERT_RC(gpuipc_channel_recv(x, &v, NULL, 0), -EAGAIN);
  ASSERT_TRUE(gpuipc__test_hook_chan_arm == NULL); /* it ran */
  if (!readable(fd))
    TFAIL("message 3, sent while recv armed, left the fd unreadable");
  recv_msg(x, 3);
  ASSERT_RC(gpuipc_channel_recv(x, &v, NULL, 0), -EAGAIN);
  ASSERT_EQ(gpuipc_channel_progress(x), 0);
  ASSERT_TRUE(!readable(fd));

  /* A release wakes it. */
  uint64_t ticket;
  struct chan_msg m;
  gpuipc_tensor_t tx;
  chan_msg_make(1, 0, gpuipc_buf_ptr(bx), bx, &m, &tx);
  ASSERT_OK(gpuipc_channel_send(x, &tx, NULL, 0, &ticket));
  ASSERT_RC(gpuipc_channel_send_done(x, ticket, 0), -EAGAIN);
  ASSERT_TRUE(!readable(fd));
  recv_msg(y, 1);
  ASSERT_TRUE(readable(fd));
  ASSERT_EQ(gpuipc_channel_progress(x), 1);
  ASSERT_OK(gpuipc_channel_send_done(x, ticket, 0));
  ASSERT_RC(gpuipc_channel_recv(x, &v, NULL, 0), -EAGAIN);
  ASSERT_EQ(gpuipc_channel_progress(x), 0);
  ASSERT_TRUE(!readable(fd));

  /* y never asked for an fd: x wrote none of y's; y wrote x's. */
  ASSERT_EQ_U(gpuipc__chan_poll_kicks(x), 0);
  ASSERT_GE(gpuipc__chan_poll_kicks(y), 1);
  /* A clean close makes it readable for good. */
  ASSERT_OK(gpuipc_channel_close(y));
  ASSERT_TRUE(readable(fd));
  ASSERT_RC(gpuipc_channel_recv(x, &v, NULL, 0), GPUIPC_E_PEER_GONE);
  ASSERT_TRUE(readable(fd));
  ASSERT_OK(gpuipc_channel_close(x));
  gpuipc_buf_release(bx);
  gpuipc_buf_release(by);
}

/* Wait until segment @segname has an end A ready for its B. */
static void wait_end_a(const char *segname)
{
  gpuipc_buf_t *seg = NULL;
  uint32_t st = 0;
  for (int i = 0; i < 30000 && st != GPUIPC__CHAN_A_READY; i++) {
    if (seg == NULL && test_seg_open(dom, segname, 0, -1, 0, &seg) != 0)
      seg = NULL;
    if (seg != NULL)
      st = atomic_load(&((struct gpuipc__chan_shm *)gpuipc_buf_ptr(seg))->state);
    if (st != GPUIPC__CHAN_A_READY)
      usleep(1000);
  }
  ASSERT_EQ(st, GPUIPC__CHAN_A_READY);
  gpuipc_buf_release(seg);
}

static void *open_as_a(void *arg)
{
  gpuipc_channel_opts_t o = {.size = sizeof(o), .timeout_ms = 20000};
  gpuipc_channel_t *ch = NULL;
  intptr_t rc = gpuipc_channel_open(dom, (const char *)arg, &o, &ch);
  if (rc == 0)
    gpuipc_channel_close(ch);
  else
    printf("end A: %s\n", gpuipc_last_error());
  return (void *)rc;
}

/* A liar as end A (its hello carries a pipe), then as end B (a blocking
 * eventfd): the honest end's open fails with GPUIPC_E_PROTO at once. */
static void bad_hellos(void)
{
  const char *aargs[] = {"liar", "chan-poll", "lie-a", "pipe", "20000", NULL};
  pid_t liar = test_spawn("chan_poll_peer", aargs, NULL);
  wait_end_a("chan.lie-a");
  gpuipc_channel_opts_t o = {.size = sizeof(o), .timeout_ms = 20000};
  gpuipc_channel_t *ch = NULL;
  ASSERT_RC(gpuipc_channel_open(dom, "lie-a", &o, &ch), GPUIPC_E_PROTO);
  ASSERT_ERR_MENTIONS("pipe:[");
  ASSERT_TRUE(ch == NULL);
  ASSERT_EQ(test_wait(liar, 60000), 0);

  pthread_t t;
  ASSERT_OK(pthread_create(&t, NULL, open_as_a, (void *)"lie-b"));
  wait_end_a("chan.lie-b");
  /* Its own open must outlast its start (a GPU machine initialises CUDA
   * first): it ends when that passes, after A refused it. */
  const char *bargs[] = {"liar", "chan-poll", "lie-b", "blocking", "5000",
                         NULL};
  liar = test_spawn("chan_poll_peer", bargs, NULL);
  void *rc;
  ASSERT_OK(pthread_join(t, &rc));
  ASSERT_EQ((intptr_t)rc, GPUIPC_E_PROTO);
  ASSERT_EQ(test_wait(liar, 60000), 0);
}

/* An end A of the first protocol (version 1, whose hello carried no fd). */
static void old_peer(void)
{
  gpuipc_buf_t *seg;
  ASSERT_OK(test_seg_open(dom, "chan.old", GPUIPC__CHAN_SEG_BYTES, -1,
                          GPUIPC_CREATE | TEST_SEG_KIND(GPUIPC_KIND_HOST),
                          &seg));
  struct gpuipc__chan_shm *shm = gpuipc_buf_ptr(seg);
  shm->magic = GPUIPC__CHAN_MAGIC;
  shm->version = 1;
  shm->dir[0].depth = 64;
  memset(shm->token, 'a', GPUIPC__CHAN_TOKEN_LEN);
  atomic_store(&shm->a_pid, (uint32_t)getpid());
  atomic_store(&shm->state, GPUIPC__CHAN_A_READY);
  gpuipc_channel_opts_t o = {.size = sizeof(o), .timeout_ms = 2000};
  gpuipc_channel_t *ch = NULL;
  ASSERT_RC(gpuipc_channel_open(dom, "old", &o, &ch), GPUIPC_E_VERSION);
  ASSERT_ERR_MENTIONS("version 1");
  ASSERT_OK(gpuipc_segment_unlink(dom, "chan.old"));
  gpuipc_buf_release(seg);
}

int main(void)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  ASSERT_OK(gpuipc_domain_join("chan-poll", NULL, &dom));
  bursts();
  steps();
  bad_hellos();
  old_peer();
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
