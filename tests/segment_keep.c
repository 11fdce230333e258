/*
 * Segments whose memory lives in their creator (LEGACY, fabric, a POOL
 * allocation) outlive the creator's own last release: the creator keeps
 * the memory while the segment is published, or unlinked and still held,
 * and frees it when the broker says LET_GO (unlinked, held by nobody);
 * leaving the domain frees it only if nobody else holds it; exiting takes
 * it along and the segment reads as lost. The logic is kind-independent,
 * so it runs here on HOST segments that seg_peer's "keep" publishes as
 * held by their creator (the test hook gpuipc__seg_test_creator_held).
 * What the creator's registry holds is read from the process itself
 * ("live": buffers registered, and those kept without a reference).
 */
#include "test.h"
#include "helpers/seg_peer.h"

#include <sys/socket.h>

static gpuipc_domain_t *dom; /* this process: a member, often the broker */

static void stat_of(const char *name, gpuipc_segment_info_t *s)
{
  memset(s, 0, sizeof(*s));
  s->size = sizeof(*s);
  ASSERT_OK(gpuipc_segment_stat(dom, name, s));
}

/* The record of segment @id in the whole registry; false when absent. */
static bool find_id(uint64_t id, gpuipc_segment_info_t *out)
{
  gpuipc_segment_info_t segs[64];
  for (int i = 0; i < 64; i++)
    segs[i].size = sizeof(segs[i]);
  int n = gpuipc_segment_list(dom, segs, 64);
  ASSERT_GE(n, 0);
  for (int i = 0; i < n && i < 64; i++)
    if (segs[i].id == id) {
      *out = segs[i];
      return true;
    }
  return false;
}

/* "ok LIVE KEPT" from @p. */
static void expect_live(struct peer *p, int live, int kept)
{
  const char *r = peer_cmd(p, "live");
  int l = -1, k = -1;
  if (sscanf(r, "ok %d %d", &l, &k) != 2)
    TFAIL("live: %s", r);
  ASSERT_EQ(l, live);
  ASSERT_EQ(k, kept);
}

/* Wait until segment @name reads as @state (the broker learns of a peer's
 * exit when it reads the end of its connection, in its own time). */
static void wait_state(const char *name, gpuipc_segment_state_t state)
{
  gpuipc_segment_info_t s;
  for (int i = 0; i < 3000; i++) {
    stat_of(name, &s);
    if (s.state == state)
      return;
    usleep(2000);
  }
  TFAIL("segment %s stays %s, expected %s", name,
        gpuipc_segment_state_name(s.state), gpuipc_segment_state_name(state));
}

static void creator(struct peer *p, const char *domain)
{
  peer_start(p);
  PEER_OK(p, "join %s", domain);
  PEER_OK(p, "keep");
}

/*
 * The creator releases; another process opens the segment afterwards and
 * reads its bytes; the creator opens it again (its own buffer back); after
 * unlink and the last holder's release the creator frees the memory.
 */
static void check_deferred_release(struct peer *a, struct peer *b)
{
  PEER_EXPECT(a, "ok 1 100000", "open a 100000 c");
  PEER_OK(a, "fill a 7");
  expect_live(a, 1, 0);
  PEER_OK(a, "release a");
  expect_live(a, 1, 1); /* kept: published, nobody holds it */

  gpuipc_segment_info_t s;
  stat_of("a", &s);
  ASSERT_EQ(s.state, GPUIPC_SEG_PUBLISHED);
  ASSERT_EQ(s.nholders, 0);
  ASSERT_EQ(s.creator_held, 1);
  ASSERT_EQ(s.keeper_pid, a->pid);
  uint64_t id = s.id;

  /* Opened after the creator let go: its bytes. */
  PEER_EXPECT(b, "ok 0 100000", "open a 0 -");
  PEER_OK(b, "check a 7");
  stat_of("a", &s);
  ASSERT_EQ(s.nholders, 1);
  ASSERT_EQ(s.holder_pids[0], b->pid);
  ASSERT_EQ(s.keeper_pid, a->pid);

  /* The creator opens it again: the kept buffer, not a new mapping. */
  PEER_EXPECT(a, "ok 1 100000", "open a 0 -");
  PEER_OK(a, "check a 7");
  expect_live(a, 1, 0);
  PEER_OK(a, "release a");
  expect_live(a, 1, 1);

  /* Unlinked while b holds it: still kept. */
  ASSERT_OK(gpuipc_segment_unlink(dom, "a"));
  ASSERT_TRUE(find_id(id, &s));
  ASSERT_EQ(s.state, GPUIPC_SEG_UNLINKED);
  ASSERT_EQ(s.nholders, 1);
  ASSERT_EQ(s.keeper_pid, a->pid);
  PEER_OK(b, "check a 7");
  expect_live(a, 1, 1);

  /* The last holder lets go: the broker tells the creator, which frees. */
  PEER_OK(b, "release a");
  PEER_EXPECT(a, "ok 0 0", "waitlive 0 10000");
  ASSERT_TRUE(!find_id(id, &s));

  /* Unlinked while nobody holds it: freed at once. */
  PEER_OK(a, "open b 4096 c");
  PEER_OK(a, "release b");
  expect_live(a, 1, 1);
  ASSERT_OK(gpuipc_segment_unlink(dom, "b"));
  PEER_EXPECT(a, "ok 0 0", "waitlive 0 10000");

  /* Memory a descriptor keeps (no hook): freed at the creator's release,
   * the segment lives on in the broker's descriptor. */
  struct peer plain;
  peer_start(&plain);
  PEER_OK(&plain, "join keep");
  PEER_OK(&plain, "open c 4096 c");
  PEER_OK(&plain, "fill c 8");
  PEER_OK(&plain, "release c");
  expect_live(&plain, 0, 0);
  stat_of("c", &s);
  ASSERT_EQ(s.creator_held, 0);
  ASSERT_EQ(s.keeper_pid, 0);
  PEER_OK(b, "open c 0 -");
  PEER_OK(b, "check c 8");
  PEER_OK(b, "release c");
  ASSERT_OK(gpuipc_segment_unlink(dom, "c"));
  peer_finish(&plain);
}

/* The creator exits: the segment is lost, whoever holds it keeps its map. */
static void check_creator_exit(struct peer *b)
{
  struct peer a;
  creator(&a, "keep");
  PEER_OK(&a, "open x 4096 c");
  PEER_OK(&a, "fill x 9");
  PEER_OK(&a, "release x");
  PEER_OK(b, "open x 0 -");
  PEER_OK(b, "check x 9");
  PEER_OK(&a, "exit 0");
  ASSERT_EQ(test_wait(a.pid, PEER_REPLY_MS), 0);
  close(a.in);
  close(a.out);
  wait_state("x", GPUIPC_SEG_LOST);
  gpuipc_segment_info_t s;
  stat_of("x", &s);
  ASSERT_EQ(s.nholders, 1);
  ASSERT_EQ(s.keeper_pid, 0);
  ASSERT_EQ(s.broker_fd, 0);
  gpuipc_buf_t *buf;
  ASSERT_RC(test_seg_open(dom, "x", 0, -1, 0, &buf), GPUIPC_E_LOST);
  PEER_OK(b, "release x");
  stat_of("x", &s);
  ASSERT_EQ(s.state, GPUIPC_SEG_LOST);
  ASSERT_EQ(s.nholders, 0);
  /* A creator takes the name over. */
  ASSERT_OK(test_seg_open(dom, "x", 4096, -1, GPUIPC_CREATE, &buf));
  ASSERT_OK(gpuipc_buf_release(buf));
  ASSERT_OK(gpuipc_segment_unlink(dom, "x"));
}

/*
 * The creator leaves the domain: held by another process, the memory stays
 * until the creator exits (never freed under a holder); held by nobody, it
 * goes at once. Leaving waits for nobody.
 */
static void check_creator_leave(struct peer *b)
{
  struct peer a;
  creator(&a, "keep");
  PEER_OK(&a, "open y 4096 c");
  PEER_OK(&a, "fill y 10");
  PEER_OK(&a, "release y");
  PEER_OK(&a, "open z 4096 c");
  PEER_OK(&a, "release z");
  expect_live(&a, 2, 2);
  PEER_OK(b, "open y 0 -");
  PEER_OK(&a, "leave");
  expect_live(&a, 1, 1); /* z freed, y kept for b */
  PEER_OK(b, "check y 10");
  gpuipc_segment_info_t s;
  stat_of("y", &s);
  ASSERT_EQ(s.state, GPUIPC_SEG_LOST);
  ASSERT_EQ(s.nholders, 1);
  ASSERT_EQ(s.keeper_pid, 0);
  stat_of("z", &s);
  ASSERT_EQ(s.state, GPUIPC_SEG_LOST);
  ASSERT_EQ(s.nholders, 0);
  PEER_OK(b, "release y");
  expect_live(&a, 1, 1); /* no domain tells it any more: kept until exit */
  peer_finish(&a);
  ASSERT_OK(gpuipc_segment_unlink(dom, "y"));
  ASSERT_OK(gpuipc_segment_unlink(dom, "z"));
}

/* `gpuipc ls` names the process keeping a segment's memory. */
static void check_ls(struct peer *a)
{
  char cli[512];
  snprintf(cli, sizeof(cli), "%s/../tools/gpuipc", GPUIPC_TEST_BINDIR);
  if (access(cli, X_OK) != 0) {
    printf("NOTE: the gpuipc tool is not built (%s): ls not checked\n", cli);
    return;
  }
  PEER_OK(a, "open shown 4096 c");
  PEER_OK(a, "release shown");
  char want[128], out[16384];
  const char *const modes[2] = {NULL, "--json"};
  for (int m = 0; m < 2; m++) {
    int p[2];
    ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
    fflush(NULL);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      dup2(p[1], 1);
      dup2(p[1], 2);
      if (modes[m] != NULL)
        execl(cli, "gpuipc", "ls", modes[m], "keep", (char *)NULL);
      else
        execl(cli, "gpuipc", "ls", "keep", (char *)NULL);
      _exit(127);
    }
    close(p[1]);
    size_t len = 0;
    ssize_t n;
    while ((n = read(p[0], out + len, sizeof(out) - 1 - len)) > 0)
      len += (size_t)n;
    out[len] = '\0';
    close(p[0]);
    ASSERT_EQ(test_wait(pid, 30000), 0);
    if (m == 0)
      snprintf(want, sizeof(want), "memory kept by creator pid %d",
               (int)a->pid);
    else
      snprintf(want, sizeof(want), "\"keeper_pid\": %d", (int)a->pid);
    if (strstr(out, "shown") == NULL || strstr(out, want) == NULL)
      TFAIL("gpuipc ls %s does not say \"%s\": %s",
            modes[m] != NULL ? modes[m] : "", want, out);
    if (m == 1 && strstr(out, "\"creator_held\": true") == NULL)
      TFAIL("gpuipc ls --json: no creator_held: %s", out);
  }
  ASSERT_OK(gpuipc_segment_unlink(dom, "shown"));
  PEER_EXPECT(a, "ok 0 0", "waitlive 0 10000");
}

/*
 * The broker moves while a creator keeps a segment nobody holds: its
 * hosting process leaves (hand-over) or dies (election). The creator
 * re-publishes it with no open of its own, the segment stays published,
 * and a later open reads it; unlink then frees it in the creator.
 */
static void check_broker_moves(bool crash)
{
  const char *domain = crash ? "keepcrash" : "keephand";
  struct peer host, a, b;
  peer_start(&host);
  PEER_OK(&host, "join %s", domain);
  const char *r = peer_cmd(&host, "info");
  int bpid = 0;
  ASSERT_TRUE(sscanf(r, "ok %d", &bpid) == 1);
  ASSERT_EQ(bpid, host.pid);
  creator(&a, domain);
  PEER_OK(&a, "open m 8192 c");
  PEER_OK(&a, "fill m 12");
  PEER_OK(&a, "release m");
  expect_live(&a, 1, 1);
  if (crash) {
    peer_kill(&host);
  } else {
    PEER_OK(&host, "leave");
    peer_finish(&host);
  }
  peer_start(&b);
  PEER_OK(&b, "join %s", domain);
  /* Answered once the new broker has the creator's re-publication. */
  PEER_EXPECT(&b, "ok 0 8192", "open m 0 w");
  PEER_OK(&b, "check m 12");
  char state[32];
  int nh, bfd, held, keeper = 0;
  for (int i = 0; i < 3000 && keeper != a.pid; i++) {
    if (i > 0)
      usleep(2000); /* the creator re-publishes in its own time */
    r = peer_cmd(&b, "stat m");
    if (sscanf(r, "ok %31s %d %d %d %d", state, &nh, &bfd, &held, &keeper) !=
        5)
      TFAIL("stat m: %s", r);
  }
  ASSERT_STREQ(state, "published");
  ASSERT_EQ(nh, 1);
  ASSERT_EQ(held, 1);
  ASSERT_EQ(keeper, a.pid);
  expect_live(&a, 1, 1);
  PEER_OK(&b, "unlink m");
  expect_live(&a, 1, 1); /* b holds it */
  PEER_OK(&b, "release m");
  PEER_EXPECT(&a, "ok 0 0", "waitlive 0 10000");
  peer_finish(&b);
  peer_finish(&a);
}

int main(void)
{
  signal(SIGPIPE, SIG_IGN);
  ASSERT_OK(gpuipc_domain_join("keep", NULL, &dom));
  struct peer a, b;
  creator(&a, "keep");
  peer_start(&b);
  PEER_OK(&b, "join keep");

  check_deferred_release(&a, &b);
  check_creator_exit(&b);
  check_creator_leave(&b);
  check_ls(&a);

  peer_finish(&a);
  peer_finish(&b);
  gpuipc_domain_info_t di = {.size = sizeof(di)};
  ASSERT_OK(gpuipc_domain_info(dom, &di));
  ASSERT_EQ(di.broker_fds, 0);
  ASSERT_OK(gpuipc_domain_leave(dom));

  check_broker_moves(false);
  check_broker_moves(true);
  return 0;
}
