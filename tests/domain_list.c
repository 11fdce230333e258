/*
 * gpuipc_segment_list trusts no broker: a page with more records than
 * asked for is a protocol error (not an overflow of the caller's array),
 * and a failure on a later page leaves the caller's array as it was. The
 * broker is this test, speaking the protocol by hand; the real one is
 * checked too.
 */
#include "test.h"
#include "helpers/raw_proto.h"

#include <pthread.h>

#define NOUT 40

static int lock_fd, listen_fd;

static void list_reply(int fd, uint32_t req, uint32_t count, bool more,
                       uint64_t first_id)
{
  struct gpuipc__msg *m = calloc(1, sizeof(*m));
  ASSERT_TRUE(m != NULL);
  m->type = GPUIPC_MSG_LIST_REPLY;
  m->req = req;
  m->u.list_reply.broker_pid = (uint32_t)getpid();
  m->u.list_reply.epoch = 1;
  m->u.list_reply.segments = 100;
  m->u.list_reply.count = count;
  m->u.list_reply.more = more;
  for (uint32_t i = 0; i < count; i++) {
    struct gpuipc__seg_wire *w = &m->u.list_reply.recs[i].seg;
    snprintf(w->name, sizeof(w->name), "seg.%u", i);
    w->id = first_id + i;
    w->size = 4096;
    w->kind = GPUIPC_KIND_HOST;
    w->state = GPUIPC__SEG_PUBLISHED;
  }
  raw_send(fd, m, NULL, 0);
  free(m);
}

/* Page by page: too many records, then a good page and a failing one. */
static void *lying_broker(void *arg)
{
  (void)arg;
  int fd = raw_accept_member(listen_fd);
  struct gpuipc__msg m;

  raw_expect(fd, &m, GPUIPC_MSG_LIST); /* asks for 4 */
  ASSERT_EQ(m.u.list.max, 4);
  list_reply(fd, m.req, GPUIPC__LIST_RECS, false, 1);

  raw_expect(fd, &m, GPUIPC_MSG_LIST); /* asks for 16 */
  ASSERT_EQ(m.u.list.max, GPUIPC__LIST_RECS);
  list_reply(fd, m.req, GPUIPC__LIST_RECS, true, 1);
  raw_expect(fd, &m, GPUIPC_MSG_LIST); /* the next page fails */
  ASSERT_EQ_U(m.u.list.after_id, GPUIPC__LIST_RECS);
  uint32_t req = m.req;
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_ERROR;
  m.req = req;
  m.u.error.code = -EIO;
  snprintf(m.u.error.text, sizeof(m.u.error.text), "page failed");
  raw_send(fd, &m, NULL, 0);

  (void)raw_recv(fd, &m, NULL, NULL, 20000); /* until the member leaves */
  close(fd);
  return NULL;
}

static void untouched(const gpuipc_segment_info_t *out, int from, int to)
{
  for (int i = from; i < to; i++) {
    ASSERT_EQ(out[i].size, sizeof(out[i]));
    ASSERT_STREQ(out[i].name, "untouched");
    ASSERT_EQ_U(out[i].id, 12345);
  }
}

static void lying(void)
{
  ASSERT_OK(gpuipc__broker_claim("lying", &lock_fd, &listen_fd, NULL));
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, NULL, lying_broker, NULL), 0);
  gpuipc_domain_t *d;
  ASSERT_OK(gpuipc_domain_join("lying", NULL, &d));
  static gpuipc_segment_info_t out[NOUT];
  for (int i = 0; i < NOUT; i++) {
    memset(&out[i], 0, sizeof(out[i]));
    out[i].size = sizeof(out[i]);
    snprintf(out[i].name, sizeof(out[i].name), "untouched");
    out[i].id = 12345;
  }
  ASSERT_RC(gpuipc_segment_list(d, out, 4), GPUIPC_E_PROTO);
  ASSERT_ERR_MENTIONS("sent 16");
  untouched(out, 0, NOUT);
  ASSERT_RC(gpuipc_segment_list(d, out, 20), -EIO);
  ASSERT_ERR_MENTIONS("page failed");
  untouched(out, 0, NOUT);
  ASSERT_OK(gpuipc_domain_leave(d));
  pthread_join(t, NULL);
  close(listen_fd);
  close(lock_fd);
}

/* A real broker, over several pages. */
static void real(void)
{
  gpuipc_domain_t *d;
  ASSERT_OK(gpuipc_domain_join("real", NULL, &d));
  gpuipc_buf_t *bufs[20];
  for (int i = 0; i < 20; i++) {
    char name[32];
    snprintf(name, sizeof(name), "r.%02d", i);
    ASSERT_OK(test_seg_open(d, name, 4096, -1, GPUIPC_CREATE,
                                  &bufs[i]));
  }
  static gpuipc_segment_info_t out[NOUT];
  for (int i = 0; i < NOUT; i++)
    out[i].size = sizeof(out[i]);
  ASSERT_EQ(gpuipc_segment_list(d, out, NOUT), 20);
  for (int i = 0; i < 20; i++) {
    char name[32];
    snprintf(name, sizeof(name), "r.%02d", i);
    ASSERT_STREQ(out[i].name, name);
    ASSERT_EQ(out[i].size, sizeof(out[i]));
  }
  ASSERT_EQ(gpuipc_segment_list(d, out, 3), 20); /* the total, 3 filled */
  ASSERT_STREQ(out[2].name, "r.02");
  for (int i = 0; i < 20; i++)
    ASSERT_OK(gpuipc_buf_release(bufs[i]));
  ASSERT_OK(gpuipc_domain_leave(d));
}

int main(void)
{
  lying();
  real();
  printf("domain_list: ok\n");
  return 0;
}
