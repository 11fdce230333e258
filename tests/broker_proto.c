/*
 * The broker survives any byte sequence from any client, and one client's
 * bad message never affects another: garbage, truncated and overlong
 * bodies, bad fields, wrong descriptor counts, messages out of order,
 * another protocol version, a client that never reads its replies, one
 * that floods the broker with waiting requests, and
 * thousands of randomly mutated valid messages. Each offender is
 * disconnected (its references dropped); a member holding a segment
 * carries on throughout. A client meeting a broker of another version gets
 * GPUIPC_E_VERSION. A segment without a descriptor is lost with its last
 * holder. Ids a member claims near 2^64 are refused.
 */
#include "test.h"
#include "helpers/raw_proto.h"
#include "helpers/seg_peer.h"

#include "domain/domain.h"
#include "os/os.h"
#include "wire/wire.h"

#include <pthread.h>

static gpuipc_domain_t *dom;
static struct gpuipc__dom_paths paths;
static uint64_t rng = 0x243f6a8885a308d3ull;

static uint32_t rnd(void)
{
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng >> 11);
}

static int broker_connect(void)
{
  int fd;
  ASSERT_OK(gpuipc__sock_connect(paths.sock, 5000, &fd));
  return fd;
}

static int encode(struct gpuipc__msg *m, uint8_t *buf)
{
  int len = gpuipc__msg_encode(m, buf, GPUIPC__MSG_BUF);
  if (len < 0)
    TFAIL("encode %s: %s", gpuipc__msg_name(m->type), gpuipc_last_error());
  return len;
}

static void send_raw(int fd, const void *buf, size_t len, const int *fds,
                     int nfds)
{
  int rc = gpuipc__sock_send(fd, buf, len, fds, nfds, 5000);
  /* The broker may have hung up already: that is fine. */
  if (rc != 0 && rc != GPUIPC_E_PEER_GONE)
    TFAIL("send: %s", gpuipc_last_error());
}

/* Read until the broker hangs up; fail if it does not. */
static void expect_hangup(int fd, const char *what)
{
  uint8_t buf[GPUIPC_MSG_MAX];
  for (int i = 0; i < 100000; i++) {
    int fds[GPUIPC_FDS_MAX];
    int nfds = GPUIPC_FDS_MAX;
    ssize_t n = gpuipc__sock_recv(fd, buf, sizeof(buf), fds, &nfds, 10000);
    for (int k = 0; k < nfds && n > 0; k++)
      close(fds[k]);
    if (n == GPUIPC_E_PEER_GONE) {
      close(fd);
      return;
    }
    if (n == -ETIMEDOUT)
      TFAIL("%s: the broker kept the connection open", what);
  }
  TFAIL("%s: the broker kept talking", what);
}

static void hello(int fd)
{
  struct gpuipc__msg m = {.type = GPUIPC_MSG_HELLO, .req = 7};
  m.u.hello.pid = (uint32_t)getpid();
  m.u.hello.token = 12345;
  uint8_t buf[GPUIPC__MSG_BUF];
  send_raw(fd, buf, (size_t)encode(&m, buf), NULL, 0);
  uint8_t in[GPUIPC_MSG_MAX];
  int nfds = 0;
  ssize_t n = gpuipc__sock_recv(fd, in, sizeof(in), NULL, &nfds, 5000);
  ASSERT_GT(n, 0);
  struct gpuipc__msg r;
  ASSERT_OK(gpuipc__msg_decode(in, (size_t)n, 0, &r));
  ASSERT_EQ(r.type, GPUIPC_MSG_WELCOME);
  ASSERT_EQ(r.req, 7);
}

/* Everything still works for well-behaved members. */
static void members_fine(struct peer *p)
{
  PEER_OK(p, "check keep 31");
  gpuipc_segment_info_t s = {.size = sizeof(s)};
  ASSERT_OK(gpuipc_segment_stat(dom, "keep", &s));
  ASSERT_EQ(s.nholders, 2);
}

static void garbage(struct peer *p)
{
  /* Random bytes instead of HELLO, and after it. */
  for (int round = 0; round < 200; round++) {
    int fd = broker_connect();
    if (round % 2)
      hello(fd);
    uint8_t junk[512];
    size_t len = 1 + rnd() % sizeof(junk);
    for (size_t i = 0; i < len; i++)
      junk[i] = (uint8_t)rnd();
    if (round % 4 == 3) { /* a valid magic and version, then junk */
      junk[0] = 0x47, junk[1] = 0x49, junk[2] = 0x50, junk[3] = 0x43;
      junk[4] = 1, junk[5] = 0;
    }
    send_raw(fd, junk, len, NULL, 0);
    expect_hangup(fd, "random bytes");
  }
  members_fine(p);
}

static void bad_messages(struct peer *p)
{
  uint8_t buf[GPUIPC__MSG_BUF];
  struct gpuipc__msg m;
  int len, fd;

  /* An OPEN before HELLO. */
  fd = broker_connect();
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_OPEN;
  m.req = 1;
  snprintf(m.u.open.name, sizeof(m.u.open.name), "keep");
  len = encode(&m, buf);
  send_raw(fd, buf, (size_t)len, NULL, 0);
  expect_hangup(fd, "OPEN before HELLO");

  /* A body one byte short, one byte long, a header that lies. */
  for (int k = 0; k < 3; k++) {
    fd = broker_connect();
    hello(fd);
    len = encode(&m, buf);
    if (k == 0)
      buf[12] = (uint8_t)(buf[12] - 1), len--;
    else if (k == 1)
      buf[len++] = 0;
    else
      buf[12] = (uint8_t)(buf[12] + 5);
    send_raw(fd, buf, (size_t)len, NULL, 0);
    expect_hangup(fd, "bad body length");
  }

  /* A name with a slash, written by hand past the encoder's checks. */
  fd = broker_connect();
  hello(fd);
  len = encode(&m, buf);
  buf[GPUIPC_PROTO_HDR + 2 + 1] = '/'; /* "k/ep" */
  send_raw(fd, buf, (size_t)len, NULL, 0);
  expect_hangup(fd, "bad name");

  /* Descriptors with a message that carries none. */
  fd = broker_connect();
  hello(fd);
  len = encode(&m, buf);
  int extra[2] = {0, 1};
  send_raw(fd, buf, (size_t)len, extra, 2);
  expect_hangup(fd, "unexpected descriptors");

  /* A message only brokers send. */
  fd = broker_connect();
  hello(fd);
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_WELCOME;
  m.u.welcome.pid = 1;
  m.u.welcome.epoch = 1;
  len = encode(&m, buf);
  send_raw(fd, buf, (size_t)len, NULL, 0);
  expect_hangup(fd, "WELCOME from a member");

  /* A PUBLISH whose handle fd is missing. */
  fd = broker_connect();
  hello(fd);
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_buf_alloc(4096, GPUIPC_KIND_HOST, -1, 0, &b));
  gpuipc_handle_t h;
  ASSERT_OK(gpuipc_buf_export(b, &h));
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_PUBLISH;
  m.req = 2;
  snprintf(m.u.publish.seg.name, sizeof(m.u.publish.seg.name), "pub");
  m.u.publish.seg.id = 1;
  m.u.publish.seg.size = 4096;
  m.u.publish.seg.kind = GPUIPC_KIND_HOST;
  m.u.publish.seg.state = GPUIPC__SEG_PUBLISHED;
  m.u.publish.seg.has_handle = true;
  m.u.publish.seg.htype = (uint8_t)h.type;
  ASSERT_GT(gpuipc_handle_pack(&h, m.u.publish.seg.handle,
                               sizeof(m.u.publish.seg.handle)), 0);
  len = encode(&m, buf);
  send_raw(fd, buf, (size_t)len, NULL, 0);
  expect_hangup(fd, "PUBLISH without its fd");
  close(h.fd);
  gpuipc_buf_release(b);

  /* Another version: ERROR(VERSION), then the hang-up. */
  fd = broker_connect();
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_HELLO;
  m.req = 3;
  m.u.hello.token = 1;
  len = encode(&m, buf);
  buf[4] = GPUIPC_PROTO_VERSION + 1; /* a version to come */
  send_raw(fd, buf, (size_t)len, NULL, 0);
  uint8_t in[GPUIPC_MSG_MAX];
  int nfds = 0;
  ssize_t n = gpuipc__sock_recv(fd, in, sizeof(in), NULL, &nfds, 5000);
  ASSERT_GT(n, 0);
  struct gpuipc__msg r;
  ASSERT_OK(gpuipc__msg_decode(in, (size_t)n, 0, &r));
  ASSERT_EQ(r.type, GPUIPC_MSG_ERROR);
  ASSERT_EQ(r.req, 3);
  ASSERT_EQ(r.u.error.code, GPUIPC_E_VERSION);
  expect_hangup(fd, "another version");

  /* A holder that turns bad loses its references. */
  fd = broker_connect();
  hello(fd);
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_OPEN;
  m.req = 4;
  snprintf(m.u.open.name, sizeof(m.u.open.name), "keep");
  len = encode(&m, buf);
  send_raw(fd, buf, (size_t)len, NULL, 0);
  int fds[GPUIPC_FDS_MAX];
  nfds = GPUIPC_FDS_MAX;
  n = gpuipc__sock_recv(fd, in, sizeof(in), fds, &nfds, 5000);
  ASSERT_GT(n, 0);
  ASSERT_OK(gpuipc__msg_decode(in, (size_t)n, nfds, &r));
  ASSERT_EQ(r.type, GPUIPC_MSG_HANDLE);
  ASSERT_EQ(nfds, 1);
  close(fds[0]);
  gpuipc_segment_info_t s = {.size = sizeof(s)};
  ASSERT_OK(gpuipc_segment_stat(dom, "keep", &s));
  ASSERT_EQ(s.nholders, 3);
  send_raw(fd, "nonsense", 8, NULL, 0);
  expect_hangup(fd, "a holder's nonsense");
  members_fine(p); /* two holders again */
}

/* A client that sends and never reads is cut off; nobody else notices. */
static void deaf_client(struct peer *p)
{
  int fd = broker_connect();
  hello(fd);
  struct gpuipc__msg m;
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_LIST;
  m.u.list.max = GPUIPC__LIST_RECS;
  uint8_t buf[GPUIPC__MSG_BUF];
  int len = encode(&m, buf);
  int sent = 0;
  for (; sent < 200000; sent++) {
    int rc = gpuipc__sock_send(fd, buf, (size_t)len, NULL, 0, 10000);
    if (rc == GPUIPC_E_PEER_GONE)
      break;
    ASSERT_OK(rc);
  }
  ASSERT_LT(sent, 200000);
  printf("a client that did not read was cut off after %d requests\n", sent);
  expect_hangup(fd, "deaf client");
  members_fine(p);
}

/* A member may keep 1024 requests waiting; more are refused, not parked. */
static void flood_waits(struct peer *p)
{
  int fd = broker_connect();
  hello(fd);
  struct gpuipc__msg m;
  uint8_t buf[GPUIPC__MSG_BUF];
  for (int i = 0; i < 1100; i++) {
    memset(&m, 0, sizeof(m));
    m.type = GPUIPC_MSG_OPEN;
    m.req = (uint32_t)i + 1;
    snprintf(m.u.open.name, sizeof(m.u.open.name), "never.%d", i);
    m.u.open.flags = GPUIPC_WAIT;
    m.u.open.timeout_ms = GPUIPC__WAIT_FOREVER;
    send_raw(fd, buf, (size_t)encode(&m, buf), NULL, 0);
  }
  uint8_t in[GPUIPC_MSG_MAX];
  for (int i = 0; i < 1100 - 1024; i++) {
    int nfds = 0;
    ssize_t n = gpuipc__sock_recv(fd, in, sizeof(in), NULL, &nfds, 10000);
    ASSERT_GT(n, 0);
    struct gpuipc__msg r;
    ASSERT_OK(gpuipc__msg_decode(in, (size_t)n, 0, &r));
    ASSERT_EQ(r.type, GPUIPC_MSG_ERROR);
    ASSERT_EQ(r.u.error.code, -EAGAIN);
    ASSERT_GT(r.req, 1024);
  }
  members_fine(p);
  close(fd); /* its 1024 waits go with it */
}

/* Valid messages with random bytes changed, each on its own connection. */
static void mutations(struct peer *p)
{
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_buf_alloc(4096, GPUIPC_KIND_HOST, -1, 0, &b));
  gpuipc_handle_t h;
  ASSERT_OK(gpuipc_buf_export(b, &h));
  struct gpuipc__msg seeds[6];
  memset(seeds, 0, sizeof(seeds));
  seeds[0].type = GPUIPC_MSG_OPEN;
  snprintf(seeds[0].u.open.name, 64, "keep");
  seeds[0].u.open.flags = GPUIPC_WAIT;
  seeds[0].u.open.timeout_ms = 10;
  seeds[1].type = GPUIPC_MSG_PUBLISH;
  struct gpuipc__seg_wire *w = &seeds[1].u.publish.seg;
  snprintf(w->name, sizeof(w->name), "mut");
  w->id = 5;
  w->size = 4096;
  w->kind = GPUIPC_KIND_HOST;
  w->state = GPUIPC__SEG_PUBLISHED;
  w->has_handle = true;
  w->htype = (uint8_t)h.type;
  ASSERT_GT(gpuipc_handle_pack(&h, w->handle, sizeof(w->handle)), 0);
  seeds[2].type = GPUIPC_MSG_RELEASE;
  seeds[2].u.release.id = 1;
  seeds[2].u.release.count = 1;
  seeds[3].type = GPUIPC_MSG_UNLINK;
  snprintf(seeds[3].u.unlink.name, 64, "nothere");
  seeds[4].type = GPUIPC_MSG_LIST;
  seeds[4].u.list.max = 3;
  seeds[5].type = GPUIPC_MSG_REPUBLISH;
  seeds[5].u.republish.holds = 1;
  seeds[5].u.republish.seg = *w;
  for (int round = 0; round < 600; round++) {
    struct gpuipc__msg *m = &seeds[round % 6];
    m->req = (uint32_t)round + 1;
    uint8_t buf[GPUIPC__MSG_BUF];
    int len = encode(m, buf);
    int flips = 1 + (int)(rnd() % 3);
    for (int f = 0; f < flips; f++)
      buf[rnd() % (uint32_t)len] ^= (uint8_t)(1u << (rnd() % 8));
    int fd = broker_connect();
    hello(fd);
    int nfds = gpuipc__msg_nfds(m);
    send_raw(fd, buf, (size_t)len, &h.fd, nfds);
    close(fd); /* whatever the broker made of it, this member goes */
  }
  close(h.fd);
  gpuipc_buf_release(b);
  members_fine(p);
  /* Whatever got published by a mutated message, its holder is gone. */
  gpuipc_segment_info_t list[64];
  for (int i = 0; i < 64; i++)
    list[i].size = sizeof(list[i]);
  int n = gpuipc_segment_list(dom, list, 64);
  ASSERT_GE(n, 1);
  for (int i = 0; i < n && i < 64; i++)
    if (strcmp(list[i].name, "keep") != 0)
      ASSERT_OK(gpuipc_segment_unlink(dom, list[i].name));
}

/*
 * A segment whose memory travels without a descriptor (LEGACY here: a
 * record only): the broker holds nothing of it, so when its last holder
 * goes its name reads as lost.
 */
static void no_descriptor(void)
{
  int fd = broker_connect();
  hello(fd);
  uint8_t buf[GPUIPC__MSG_BUF], in[GPUIPC_MSG_MAX];
  struct gpuipc__msg m, r;
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_OPEN;
  m.req = 1;
  snprintf(m.u.open.name, sizeof(m.u.open.name), "legacy");
  m.u.open.flags = GPUIPC_CREATE;
  m.u.open.kind = GPUIPC_KIND_LEGACY;
  m.u.open.size = 4096;
  send_raw(fd, buf, (size_t)encode(&m, buf), NULL, 0);
  int nfds = 0;
  ssize_t n = gpuipc__sock_recv(fd, in, sizeof(in), NULL, &nfds, 5000);
  ASSERT_GT(n, 0);
  ASSERT_OK(gpuipc__msg_decode(in, (size_t)n, 0, &r));
  ASSERT_EQ(r.type, GPUIPC_MSG_CREATE_IT);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_PUBLISH;
  m.req = 2;
  m.u.publish.seg = raw_legacy_seg("legacy", r.u.create_it.id, 4096,
                                   GPUIPC__SEG_PUBLISHED);
  send_raw(fd, buf, (size_t)encode(&m, buf), NULL, 0);
  n = gpuipc__sock_recv(fd, in, sizeof(in), NULL, &nfds, 5000);
  ASSERT_GT(n, 0);
  ASSERT_OK(gpuipc__msg_decode(in, (size_t)n, 0, &r));
  ASSERT_EQ(r.type, GPUIPC_MSG_OK);

  gpuipc_segment_info_t s = {.size = sizeof(s)};
  ASSERT_OK(gpuipc_segment_stat(dom, "legacy", &s));
  ASSERT_EQ(s.state, GPUIPC_SEG_PUBLISHED);
  ASSERT_EQ(s.kind, GPUIPC_KIND_LEGACY);
  ASSERT_EQ(s.broker_fd, 0);
  ASSERT_EQ(s.nholders, 1);
  close(fd); /* its creator goes, and its memory with it */
  for (int tries = 0; tries < 3000; tries++) {
    ASSERT_OK(gpuipc_segment_stat(dom, "legacy", &s));
    if (s.state != GPUIPC_SEG_PUBLISHED)
      break;
    usleep(10000);
  }
  ASSERT_EQ(s.state, GPUIPC_SEG_LOST);
  gpuipc_buf_t *b;
  ASSERT_RC(test_seg_open(dom, "legacy", 0, -1, 0, &b), GPUIPC_E_LOST);
  ASSERT_OK(gpuipc_segment_unlink(dom, "legacy"));
}

/*
 * A member claiming ids near 2^64 (HELLO max_id, REPUBLISH) is refused:
 * the broker's id counter would wrap to 0. Ids stay non-zero and distinct.
 */
static void huge_ids(struct peer *p)
{
  uint8_t buf[GPUIPC__MSG_BUF];
  struct gpuipc__msg m;
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_HELLO;
  m.req = 1;
  m.u.hello.pid = (uint32_t)getpid();
  m.u.hello.token = 4;
  int len = encode(&m, buf);
  for (int i = 0; i < 8; i++) /* max_id = UINT64_MAX - 1 */
    buf[GPUIPC_PROTO_HDR + 24 + i] = i == 0 ? 0xfe : 0xff;
  int fd = broker_connect();
  send_raw(fd, buf, (size_t)len, NULL, 0);
  expect_hangup(fd, "HELLO with max id 2^64 - 2");
  gpuipc_buf_t *a, *b;
  ASSERT_OK(test_seg_open(dom, "id.a", 4096, -1, GPUIPC_CREATE, &a));
  ASSERT_OK(test_seg_open(dom, "id.b", 4096, -1, GPUIPC_CREATE, &b));
  gpuipc_segment_info_t sa = {.size = sizeof(sa)}, sb = {.size = sizeof(sb)};
  ASSERT_OK(gpuipc_segment_stat(dom, "id.a", &sa));
  ASSERT_OK(gpuipc_segment_stat(dom, "id.b", &sb));
  ASSERT_GT(sa.id, 0);
  ASSERT_GT(sb.id, sa.id);
  ASSERT_TRUE(sb.id <= (1ull << 62));
  ASSERT_OK(gpuipc_buf_release(a));
  ASSERT_OK(gpuipc_buf_release(b));
  ASSERT_OK(gpuipc_segment_unlink(dom, "id.a"));
  ASSERT_OK(gpuipc_segment_unlink(dom, "id.b"));
  members_fine(p);
}

/* A "broker" that answers HELLO in a protocol version to come. */
static void *fake_broker(void *arg)
{
  int lfd = *(int *)arg;
  int fd;
  if (gpuipc__sock_accept(lfd, 10000, &fd) != 0)
    return NULL;
  uint8_t in[GPUIPC_MSG_MAX];
  int nfds = 0;
  (void)gpuipc__sock_recv(fd, in, sizeof(in), NULL, &nfds, 10000);
  struct gpuipc__msg m = {.type = GPUIPC_MSG_WELCOME, .req = 1};
  m.u.welcome.pid = 1;
  m.u.welcome.epoch = 1;
  uint8_t buf[GPUIPC__MSG_BUF];
  int len = gpuipc__msg_encode(&m, buf, sizeof(buf));
  buf[4] = GPUIPC_PROTO_VERSION + 1;
  (void)gpuipc__sock_send(fd, buf, (size_t)len, NULL, 0, 5000);
  close(fd);
  return NULL;
}

static void version_mismatch(void)
{
  int lock, lfd;
  ASSERT_OK(gpuipc__broker_claim("v2", &lock, &lfd, NULL));
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, NULL, fake_broker, &lfd), 0);
  gpuipc_domain_t *d;
  ASSERT_RC(gpuipc_domain_join("v2", NULL, &d), GPUIPC_E_VERSION);
  ASSERT_ERR_MENTIONS("version 4");
  pthread_join(t, NULL);
  close(lfd);
  close(lock);
}

int main(void)
{
  test_warm_driver(); /* count descriptors with the driver's included */
  ASSERT_OK(gpuipc_domain_join("proto", NULL, &dom));
  ASSERT_OK(gpuipc__dom_paths("proto", &paths));
  gpuipc_buf_t *keep;
  ASSERT_OK(test_seg_open(dom, "keep", 4096, -1, GPUIPC_CREATE, &keep));
  test_fill(gpuipc_buf_ptr(keep), 4096, 31);
  struct peer p;
  peer_start(&p);
  PEER_OK(&p, "join proto");
  PEER_OK(&p, "open keep 4096 -");
  int fds = test_count_fds(0);

  garbage(&p);
  bad_messages(&p);
  deaf_client(&p);
  flood_waits(&p);
  mutations(&p);
  no_descriptor();
  huge_ids(&p);
  version_mismatch();

  domain_wait_members(dom, 2);
  ASSERT_EQ(test_count_fds(0), fds);
  PEER_OK(&p, "leave");
  peer_finish(&p);
  ASSERT_OK(gpuipc_buf_release(keep));
  ASSERT_OK(gpuipc_domain_leave(dom));
  printf("broker_proto: ok\n");
  return 0;
}
