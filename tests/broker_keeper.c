/*
 * Only the process whose memory a creator-held segment is may keep it. A
 * member that opened such a segment and re-publishes it as its keeper (as
 * a creator does after a broker change), or publishes its handle again, or
 * under another name, is refused: the segment keeps its creator as keeper,
 * and stays published when the would-be thief leaves.
 *
 * The logic is kind-independent, so it runs on a HOST segment that
 * seg_peer's "keep" publishes as held by its creator; the thief speaks the
 * protocol by hand, from this process.
 */
#include "test.h"
#include "helpers/raw_proto.h"
#include "helpers/seg_peer.h"

static gpuipc_domain_t *dom;

static void stat_of(const char *name, gpuipc_segment_info_t *s)
{
  memset(s, 0, sizeof(*s));
  s->size = sizeof(*s);
  ASSERT_OK(gpuipc_segment_stat(dom, name, s));
}

/* A member that opened @name: its connection, the record and descriptor. */
static int thief(const char *name, struct gpuipc__seg_wire *w, int *seg_fd)
{
  int fd = raw_connect("kp");
  raw_hello_rejoin(fd); /* as a member back from a broker change */
  struct gpuipc__msg m;
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_OPEN;
  m.req = 2;
  snprintf(m.u.open.name, sizeof(m.u.open.name), "%s", name);
  raw_send(fd, &m, NULL, 0);
  int nfds = 0;
  ASSERT_OK(raw_recv(fd, &m, seg_fd, &nfds, 10000));
  ASSERT_EQ(m.type, GPUIPC_MSG_HANDLE);
  ASSERT_EQ(nfds, 1);
  *w = m.u.handle.seg;
  ASSERT_TRUE(w->flags & GPUIPC__SEGF_CREATOR_HELD);
  return fd;
}

static void kept_by(const char *name, pid_t pid)
{
  gpuipc_segment_info_t s;
  stat_of(name, &s);
  ASSERT_EQ(s.state, GPUIPC_SEG_PUBLISHED);
  ASSERT_EQ(s.keeper_pid, (int)pid);
}

int main(void)
{
  ASSERT_OK(gpuipc_domain_join("kp", NULL, &dom));
  struct peer creator;
  peer_start(&creator);
  PEER_OK(&creator, "keep");
  PEER_OK(&creator, "join kp");
  PEER_OK(&creator, "open x 4096 c");
  PEER_OK(&creator, "fill x 7");
  kept_by("x", creator.pid);

  /* REPUBLISH with the keeper's flag: refused, the thief disconnected. */
  struct gpuipc__seg_wire w;
  int seg_fd;
  int t = thief("x", &w, &seg_fd);
  struct gpuipc__msg m;
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_REPUBLISH;
  m.u.republish.holds = 1;
  m.u.republish.flags = GPUIPC__REPUB_KEEPER;
  m.u.republish.seg = w;
  raw_send(t, &m, &seg_fd, 1);
  raw_expect_hangup(t, "a keeper's re-publication by a process that did "
                       "not export the memory");
  close(seg_fd);
  kept_by("x", creator.pid);

  /* PUBLISH of the same handle again, or under another name: denied. */
  t = thief("x", &w, &seg_fd);
  struct gpuipc__msg r;
  ASSERT_EQ(raw_publish(t, &w, seg_fd, &r), GPUIPC_MSG_ERROR);
  ASSERT_EQ(r.u.error.code, GPUIPC_E_DENIED);
  printf("publish again: %s\n", r.u.error.text);
  kept_by("x", creator.pid);
  snprintf(w.name, sizeof(w.name), "y");
  ASSERT_EQ(raw_publish(t, &w, seg_fd, &r), GPUIPC_MSG_ERROR);
  ASSERT_EQ(r.u.error.code, GPUIPC_E_DENIED);
  printf("publish as y: %s\n", r.u.error.text);
  gpuipc_segment_info_t s;
  s.size = sizeof(s);
  ASSERT_EQ(gpuipc_segment_stat(dom, "y", &s), -ENOENT);
  close(seg_fd);

  /* The thief leaves: the segment stays, with its creator's memory. */
  close(t);
  domain_wait_members(dom, 2);
  kept_by("x", creator.pid);
  struct peer reader;
  peer_start(&reader);
  PEER_OK(&reader, "join kp");
  PEER_OK(&reader, "open x 4096 -");
  PEER_OK(&reader, "check x 7");
  PEER_OK(&reader, "leave");
  peer_finish(&reader);

  PEER_OK(&creator, "release x");
  PEER_OK(&creator, "unlink x");
  PEER_OK(&creator, "leave");
  peer_finish(&creator);
  ASSERT_OK(gpuipc_domain_leave(dom));
  printf("broker_keeper: ok\n");
  return 0;
}
