/*
 * A REPUBLISH brings back what its sender held when the broker changed; it
 * never changes what a segment is. A member that lies in one -- its own
 * memory under a published LEGACY segment's id, claiming to keep it, or
 * not saying that its creator holds it at all; the creator's identity with
 * other handle bytes; a re-publication without coming back from a broker
 * change -- is told why (an ERROR to its request), and nothing of it
 * counts. Openers still get the creator's handle and read the creator's
 * bytes, the creator stays the keeper, and the segment stays published
 * once the liar is gone.
 * A real hand-over then still brings the creator back as the keeper and a
 * reader back as a holder.
 *
 * After a crash the new broker knows from the journal which memory each
 * name had: a liar's own memory under a lost segment's id is refused even
 * while survivors may bring it back, and the survivor holding it does.
 *
 * The LEGACY segment is a seg_peer's on the fake CUDA driver (the broker
 * never touches CUDA: to it that memory is a GPU's); the liar is this
 * process, speaking the protocol by hand, with memory of its own. Built
 * without CUDA headers there is no fake driver: the LEGACY part is left
 * out.
 */
#include "test.h"
#include "helpers/raw_proto.h"
#include "helpers/seg_peer.h"

#include <sys/wait.h>

static void stop(pid_t pid)
{
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  int st;
  ASSERT_EQ(waitpid(pid, &st, WUNTRACED), pid);
  ASSERT_TRUE(WIFSTOPPED(st));
}

/*
 * A HOST segment y, held by a member that is stopped when the broker's
 * host dies. This process becomes the broker, with y a tombstone of the
 * journal; a liar re-publishes its own memory under y's id; then the
 * holder goes on, and brings y back.
 */
static void crash_liar(void)
{
  struct peer host, holder, reader;
  gpuipc_domain_t *rc;
  peer_start(&host);
  PEER_OK(&host, "join rc");
  PEER_OK(&host, "open y 4096 c");
  PEER_OK(&host, "fill y 5");
  ASSERT_OK(gpuipc_domain_join("rc", NULL, &rc));
  peer_start(&holder);
  PEER_OK(&holder, "join rc");
  PEER_OK(&holder, "open y 4096 -");
  gpuipc_segment_info_t si = {.size = sizeof(si)};
  ASSERT_OK(gpuipc_segment_stat(rc, "y", &si));
  stop(holder.pid);
  peer_kill(&host);
  gpuipc_domain_info_t di = {.size = sizeof(di)};
  ASSERT_OK(gpuipc_domain_info(rc, &di)); /* reconnected: hosting it */
  ASSERT_EQ(di.hosts_broker, 1);

  gpuipc_buf_t *mine;
  ASSERT_OK(gpuipc_buf_alloc(4096, GPUIPC_KIND_HOST, -1, 0, &mine));
  gpuipc_handle_t hm;
  ASSERT_OK(gpuipc_buf_export(mine, &hm));
  struct gpuipc__seg_wire w = raw_seg_of("y", si.id, 4096,
                                         GPUIPC__SEG_PUBLISHED, &hm);
  int fd = raw_connect("rc");
  raw_hello_rejoin(fd);
  raw_republish_as(fd, &w, 1, 0, 51, hm.fd);
  close(hm.fd);
  struct gpuipc__msg m, refusal;
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_LIST;
  m.req = 52;
  snprintf(m.u.list.name, sizeof(m.u.list.name), "y");
  raw_send(fd, &m, NULL, 0);
  if (raw_recv(fd, &refusal, NULL, NULL, 10000) != 0)
    TFAIL("lost segment: no answer: %s", gpuipc_last_error());
  if (refusal.type == GPUIPC_MSG_ERROR)
    raw_expect(fd, &m, GPUIPC_MSG_LIST_REPLY);
  close(fd);

  ASSERT_EQ(kill(holder.pid, SIGCONT), 0);
  PEER_OK(&holder, "info"); /* after its re-publications */
  peer_start(&reader);
  PEER_OK(&reader, "join rc");
  PEER_OK(&reader, "open y 4096 -");
  const char *r = peer_cmd(&reader, "check y 5");
  if (strncmp(r, "ok", 2) != 0)
    TFAIL("after a liar's re-publication, y reads: %s", r);
  PEER_OK(&reader, "leave");
  peer_finish(&reader);

  if (refusal.type != GPUIPC_MSG_ERROR || refusal.req != 51)
    TFAIL("lost segment, own memory: not refused; %s came to request %u",
          gpuipc__msg_name(refusal.type), refusal.req);
  ASSERT_EQ(refusal.u.error.code, GPUIPC_E_DENIED);
  if (strstr(refusal.u.error.text, "journal") == NULL)
    TFAIL("the refusal does not say why: %s", refusal.u.error.text);
  printf("lost segment, own memory: %s\n", refusal.u.error.text);
  ASSERT_OK(gpuipc_buf_release(mine));
  PEER_OK(&holder, "leave");
  peer_finish(&holder);
  ASSERT_OK(gpuipc_domain_leave(rc));
}

#ifdef FAKE_CUDA_FULL

#define SEED 7

static gpuipc_domain_t *dom;
static struct peer host, creator, holder;
static struct gpuipc__seg_wire real; /* x as its creator published it */

static gpuipc_handle_t unpacked(const struct gpuipc__seg_wire *w)
{
  gpuipc_handle_t h;
  ASSERT_OK(gpuipc_handle_unpack(w->handle, sizeof(w->handle), &h));
  return h;
}

/* The record of x that an opener gets now. */
static struct gpuipc__seg_wire opened_record(void)
{
  int fd = raw_connect("rl");
  raw_hello(fd);
  struct gpuipc__msg r;
  if (raw_open(fd, "x", 0, GPUIPC_KIND_AUTO, 0, &r) != GPUIPC_MSG_HANDLE)
    TFAIL("OPEN x: %s %s", gpuipc__msg_name(r.type),
          r.type == GPUIPC_MSG_ERROR ? r.u.error.text : "");
  close(fd);
  return r.u.handle.seg;
}

/* x is still the creator's: its state, keeper, handle and bytes. */
static void still_the_creators(const char *after)
{
  gpuipc_segment_info_t s = {.size = sizeof(s)};
  ASSERT_OK(gpuipc_segment_stat(dom, "x", &s));
  if (s.state != GPUIPC_SEG_PUBLISHED)
    TFAIL("%s: x reads as %s", after, gpuipc_segment_state_name(s.state));
  if (s.keeper_pid != (int)creator.pid)
    TFAIL("%s: x is kept by pid %d, not by its creator, pid %d", after,
          s.keeper_pid, (int)creator.pid);
  struct gpuipc__seg_wire w = opened_record();
  if (memcmp(w.handle, real.handle, sizeof(w.handle)) != 0)
    TFAIL("%s: openers get a handle of pid %u, not the creator's (pid %d)",
          after, unpacked(&w).pid, (int)creator.pid);
  ASSERT_EQ(w.flags, real.flags);
  struct peer reader;
  peer_start(&reader);
  PEER_OK(&reader, "join rl");
  PEER_OK(&reader, "gopen x 4096 - legacy 0");
  PEER_OK(&reader, "check x %d", SEED);
  PEER_OK(&reader, "leave");
  peer_finish(&reader);
}

/*
 * Send @w (with REPUBLISH @flags) from a new connection -- @rejoin: saying
 * it comes back after a broker change -- and leave. Nothing of it may
 * count, and it must have been refused with an ERROR that says @want.
 */
static void lie(const char *what, const struct gpuipc__seg_wire *w,
                uint32_t flags, bool rejoin, const char *want)
{
  int fd = raw_connect("rl");
  if (rejoin)
    raw_hello_rejoin(fd);
  else
    raw_hello(fd);
  raw_republish_as(fd, w, 1, flags, 41, -1);
  /* The broker reads a connection in order: its answer to the REPUBLISH
   * comes before the one to this OPEN, if there is one. */
  struct gpuipc__msg m, refusal;
  raw_open_msg(&m, 42, "x", 0, GPUIPC_KIND_AUTO, 0, 1000);
  raw_send(fd, &m, NULL, 0);
  if (raw_recv(fd, &refusal, NULL, NULL, 10000) != 0)
    TFAIL("%s: no answer: %s", what, gpuipc_last_error());
  if (refusal.type == GPUIPC_MSG_ERROR) {
    raw_expect(fd, &m, GPUIPC_MSG_HANDLE);
    ASSERT_EQ(m.req, 42);
  } else {
    m = refusal;
  }
  if (m.type == GPUIPC_MSG_HANDLE &&
      memcmp(m.u.handle.seg.handle, real.handle, sizeof(real.handle)) != 0)
    TFAIL("%s: the liar opens a handle of pid %u (the creator is pid %d, "
          "the liar pid %d)", what, unpacked(&m.u.handle.seg).pid,
          (int)creator.pid, (int)getpid());
  /* The liar leaves: x stays as it was. */
  close(fd);
  domain_wait_members(dom, 4); /* host, creator, holder, us */
  still_the_creators(what);

  if (refusal.type != GPUIPC_MSG_ERROR || refusal.req != 41)
    TFAIL("%s: not refused; %s came to request %u", what,
          gpuipc__msg_name(refusal.type), refusal.req);
  ASSERT_EQ(refusal.u.error.code, GPUIPC_E_DENIED);
  if (strstr(refusal.u.error.text, want) == NULL)
    TFAIL("%s: the refusal says \"%s\", which lacks \"%s\"", what,
          refusal.u.error.text, want);
  printf("%s: %s\n", what, refusal.u.error.text);
}

/* The liar's records: x's name, id and size, other memory. */
static void lies(void)
{
  gpuipc_buf_t *mine;
  ASSERT_OK(gpuipc_buf_alloc(4096, GPUIPC_KIND_LEGACY, 0, 0, &mine));
  gpuipc_handle_t hm;
  ASSERT_OK(gpuipc_buf_export(mine, &hm));

  /* Its own memory, as the keeper: it is the exporter of that handle. */
  struct gpuipc__seg_wire w = real;
  ASSERT_TRUE(gpuipc_handle_pack(&hm, w.handle, sizeof(w.handle)) > 0);
  lie("own memory, as its keeper", &w, GPUIPC__REPUB_KEEPER, true,
      "other memory");
  /* Its own memory, not saying that a creator holds it. */
  w.flags = 0;
  lie("own memory, flags 0", &w, 0, true, "other memory");
  /* The creator's identity, its own handle bytes. */
  gpuipc_handle_t h = unpacked(&real);
  memcpy(h.bytes, hm.bytes, sizeof(h.bytes));
  w = real;
  w.flags = 0;
  ASSERT_TRUE(gpuipc_handle_pack(&h, w.handle, sizeof(w.handle)) > 0);
  lie("the creator's identity, other bytes", &w, 0, true, "other memory");
  /* The very record, from a member that did not come back to this broker
   * after a change: there is nothing for it to bring back. */
  lie("without a broker change", &real, 0, false, "broker change");
  ASSERT_OK(gpuipc_buf_release(mine));
}

/* Lies about a published LEGACY segment, then a real hand-over. */
static void legacy_liars(void)
{
  peer_start(&host);
  PEER_OK(&host, "join rl");
  ASSERT_OK(gpuipc_domain_join("rl", NULL, &dom));
  peer_start(&creator);
  PEER_OK(&creator, "join rl");
  PEER_OK(&creator, "gopen x 4096 c legacy 0");
  PEER_OK(&creator, "fill x %d", SEED);
  peer_start(&holder);
  PEER_OK(&holder, "join rl");
  PEER_OK(&holder, "gopen x 4096 - legacy 0");
  real = opened_record();
  ASSERT_EQ(unpacked(&real).pid, (uint32_t)creator.pid);
  ASSERT_TRUE(real.flags & GPUIPC__SEGF_CREATOR_HELD);
  still_the_creators("before");

  lies();

  /* A real hand-over (to this process, the oldest member): the creator
   * comes back as the keeper, the holder as a holder. Each one's next
   * request follows its re-publications on its new connection. */
  PEER_OK(&host, "leave");
  peer_finish(&host);
  PEER_OK(&creator, "info");
  PEER_OK(&holder, "info");
  gpuipc_domain_info_t di = {.size = sizeof(di)};
  ASSERT_OK(gpuipc_domain_info(dom, &di));
  ASSERT_EQ(di.hosts_broker, 1);
  gpuipc_segment_info_t s = {.size = sizeof(s)};
  ASSERT_OK(gpuipc_segment_stat(dom, "x", &s));
  ASSERT_EQ(s.nholders, 2);
  still_the_creators("after a hand-over");
  PEER_OK(&holder, "check x %d", SEED);

  PEER_OK(&holder, "leave");
  peer_finish(&holder);
  PEER_OK(&creator, "release x");
  PEER_OK(&creator, "unlink x");
  PEER_OK(&creator, "leave");
  peer_finish(&creator);
  ASSERT_OK(gpuipc_domain_leave(dom));
}

#endif

int main(void)
{
#ifdef FAKE_CUDA_FULL
  /* Before the first gpuipc call; the peers inherit it. */
  ASSERT_OK(setenv("GPUIPC_CUDA_LIB", FAKE_CUDA_FULL, 1));
#endif
  crash_liar();
#ifdef FAKE_CUDA_FULL
  legacy_liars();
#else
  printf("LEGACY lies: left out (built without CUDA headers: no fake "
         "driver)\n");
#endif
  printf("broker_republish_liar: ok\n");
  return 0;
}
