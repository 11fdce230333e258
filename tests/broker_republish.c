/*
 * What a member re-publishes after a broker change is checked against what
 * the broker has under that id: a record of another name, kind or size, or
 * another member's reservation, is refused (the member is disconnected),
 * and the broker's tables stay whole. A lost segment whose memory its
 * creator held comes back only with its creator (outside the recovery
 * window after a crash), as what it was.
 */
#include "test.h"
#include "helpers/raw_proto.h"

static gpuipc_domain_t *dom;

static void publish_legacy(int fd, const char *name, uint64_t id)
{
  struct gpuipc__msg m;
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_PUBLISH;
  m.req = 3;
  m.u.publish.seg = raw_legacy_seg(name, id, 4096, GPUIPC__SEG_PUBLISHED);
  raw_send(fd, &m, NULL, 0);
  raw_expect(fd, &m, GPUIPC_MSG_OK);
  ASSERT_EQ_U(m.u.ok.id, id);
}

/* A LEGACY record of this process's, whose memory it holds. */
static struct gpuipc__seg_wire own_legacy_seg(const char *name, uint64_t id,
                                              uint64_t size)
{
  struct gpuipc__seg_wire w = raw_legacy_seg(name, id, size,
                                             GPUIPC__SEG_PUBLISHED);
  const struct gpuipc__proc_id *me = gpuipc__proc_self();
  gpuipc_handle_t h;
  ASSERT_OK(gpuipc_handle_unpack(w.handle, sizeof(w.handle), &h));
  memcpy(h.boot_id, me->boot_id, sizeof(h.boot_id));
  h.pid = me->pid;
  h.pidns = me->pidns;
  h.nonce = me->nonce;
  ASSERT_TRUE(gpuipc_handle_pack(&h, w.handle, sizeof(w.handle)) > 0);
  w.flags = GPUIPC__SEGF_CREATOR_HELD;
  return w;
}

static uint64_t reserve(int fd, const char *name)
{
  struct gpuipc__msg r;
  ASSERT_EQ(raw_open(fd, name, GPUIPC_CREATE, GPUIPC_KIND_LEGACY, 4096, &r),
            GPUIPC_MSG_CREATE_IT);
  return r.u.create_it.id;
}

static int state_of(const char *name)
{
  gpuipc_segment_info_t s = {.size = sizeof(s)};
  int rc = gpuipc_segment_stat(dom, name, &s);
  return rc == 0 ? (int)s.state : rc;
}

/* Another name under a reserved id: refused; the reservation stays. */
static void other_name(void)
{
  int a = raw_connect("rp");
  raw_hello(a);
  uint64_t id = reserve(a, "aaa");
  int b = raw_connect("rp");
  raw_hello_rejoin(b);
  struct gpuipc__seg_wire w = raw_legacy_seg("bbb", id, 4096,
                                             GPUIPC__SEG_PUBLISHED);
  raw_republish(b, &w, 1);
  raw_expect_hangup(b, "re-publication under another name");
  ASSERT_EQ(state_of("bbb"), -ENOENT);
  ASSERT_EQ(state_of("aaa"), GPUIPC_SEG_CREATING);
  publish_legacy(a, "aaa", id);
  ASSERT_EQ(state_of("aaa"), GPUIPC_SEG_PUBLISHED);
  /* What the proof of concept went on to do: nothing is left dangling. */
  w.state = GPUIPC__SEG_UNLINKED;
  b = raw_connect("rp");
  raw_hello_rejoin(b);
  raw_republish(b, &w, 1);
  raw_expect_hangup(b, "unlinked re-publication under another name");
  close(a);
  for (int tries = 0; tries < 3000 && state_of("aaa") ==
                                          GPUIPC_SEG_PUBLISHED; tries++)
    usleep(10000);
  ASSERT_EQ(state_of("aaa"), GPUIPC_SEG_LOST);
  ASSERT_OK(gpuipc_segment_unlink(dom, "aaa"));
  ASSERT_EQ(state_of("aaa"), -ENOENT);
}

/* Another member's reservation, even under its own name: refused. */
static void takeover(void)
{
  int a = raw_connect("rp");
  raw_hello(a);
  uint64_t id = reserve(a, "ccc");
  int b = raw_connect("rp");
  raw_hello_rejoin(b);
  struct gpuipc__seg_wire w = raw_legacy_seg("ccc", id, 4096,
                                             GPUIPC__SEG_PUBLISHED);
  raw_republish(b, &w, 1);
  raw_expect_hangup(b, "re-publication of another member's reservation");
  ASSERT_EQ(state_of("ccc"), GPUIPC_SEG_CREATING);
  publish_legacy(a, "ccc", id);
  gpuipc_segment_info_t s = {.size = sizeof(s)};
  ASSERT_OK(gpuipc_segment_stat(dom, "ccc", &s));
  ASSERT_EQ(s.nholders, 1);
  ASSERT_EQ(s.holder_refs[0], 1);
  close(a);
  for (int tries = 0; tries < 3000 && state_of("ccc") ==
                                          GPUIPC_SEG_PUBLISHED; tries++)
    usleep(10000);
  ASSERT_OK(gpuipc_segment_unlink(dom, "ccc"));
}

/* A lost segment comes back only as what it was. */
static void lost_record(void)
{
  int a = raw_connect("rp");
  raw_hello(a);
  uint64_t id = reserve(a, "ddd");
  publish_legacy(a, "ddd", id);
  close(a);
  for (int tries = 0; tries < 3000 && state_of("ddd") != GPUIPC_SEG_LOST;
       tries++)
    usleep(10000);
  ASSERT_EQ(state_of("ddd"), GPUIPC_SEG_LOST);

  int b = raw_connect("rp");
  raw_hello_rejoin(b);
  struct gpuipc__seg_wire w = raw_legacy_seg("ddd", id, 8192,
                                             GPUIPC__SEG_PUBLISHED);
  raw_republish(b, &w, 1);
  raw_expect_hangup(b, "re-publication with another size");
  ASSERT_EQ(state_of("ddd"), GPUIPC_SEG_LOST);

  /* Memory its creator holds, from a member that is not its creator,
   * with no broker change to recover from: refused, still lost. */
  b = raw_connect("rp");
  raw_hello_rejoin(b);
  w = raw_legacy_seg("ddd", id, 4096, GPUIPC__SEG_PUBLISHED);
  raw_republish_as(b, &w, 2, 0, 7, -1);
  struct gpuipc__msg m;
  raw_expect(b, &m, GPUIPC_MSG_ERROR);
  ASSERT_EQ(m.req, 7);
  ASSERT_EQ(m.u.error.code, GPUIPC_E_DENIED);
  printf("lost, not its creator: %s\n", m.u.error.text);
  ASSERT_EQ(state_of("ddd"), GPUIPC_SEG_LOST);
  close(b);

  /* Its creator brings it back. */
  b = raw_connect("rp");
  raw_hello_rejoin(b);
  w = own_legacy_seg("ddd", id, 4096);
  raw_republish_as(b, &w, 2, GPUIPC__REPUB_KEEPER, 0, -1);
  /* Answered after the REPUBLISH (a connection is read in order). */
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_LIST;
  m.req = 8;
  snprintf(m.u.list.name, sizeof(m.u.list.name), "ddd");
  raw_send(b, &m, NULL, 0);
  raw_expect(b, &m, GPUIPC_MSG_LIST_REPLY);
  gpuipc_segment_info_t s = {.size = sizeof(s)};
  ASSERT_OK(gpuipc_segment_stat(dom, "ddd", &s));
  ASSERT_EQ(s.state, GPUIPC_SEG_PUBLISHED);
  ASSERT_EQ_U(s.id, id);
  ASSERT_EQ(s.nholders, 1);
  ASSERT_EQ(s.holder_refs[0], 2);
  close(b);
  ASSERT_OK(gpuipc_segment_unlink(dom, "ddd"));
}

int main(void)
{
  ASSERT_OK(gpuipc_domain_join("rp", NULL, &dom));
  other_name();
  takeover();
  lost_record();
  /* The broker is whole: names work as before. */
  gpuipc_buf_t *b;
  ASSERT_OK(test_seg_open(dom, "aaa", 4096, -1, GPUIPC_CREATE, &b));
  ASSERT_EQ(state_of("aaa"), GPUIPC_SEG_PUBLISHED);
  ASSERT_OK(gpuipc_buf_release(b));
  ASSERT_OK(gpuipc_segment_unlink(dom, "aaa"));
  ASSERT_OK(gpuipc_domain_leave(dom));
  printf("broker_republish: ok\n");
  return 0;
}
