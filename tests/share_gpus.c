/*
 * gpuipc_share_copy on real GPUs (skipped without two): a version
 * published in VMM memory on GPU 0. Four readers at once: two on GPU 1,
 * one on the publisher's GPU (it copies alone: the bytes would leave GPU
 * 0 twice), one with LEGACY memory on GPU 2 (or 1); every byte right,
 * the publisher's bytes copied once between the members of the round.
 * Then the head of a chain killed after its third chunk landed (the
 * others take its claims over), and a LEGACY member killed while the
 * others copy from it (its memory goes with it: what they copied from
 * there is copied again from the publisher), once at any time and once
 * after the follower's copies from it settled. Nothing of the rounds is
 * left once all are gone.
 */
#include "test.h"
#include "helpers/share_peer.h"

#include <sys/wait.h>

static char other[16]; /* "gpu2" with three GPUs, else "gpu1" */

static void dst_of(char *out, size_t cap, const char *gpu, const char *kind)
{
  snprintf(out, cap, "%s-%s", gpu, kind);
}

static void spread(gpuipc_domain_t *dom)
{
  test_stamp("four readers: two on GPU 1, one on GPU 0, one LEGACY");
  char d3[32];
  dst_of(d3, sizeof(d3), other, "legacy");
  const char *dst[4] = {"gpu1-vmm", "gpu1-vmm", "gpu0-vmm", d3};
  struct sreader r[4];
  for (int i = 0; i < 4; i++) {
    sreader_start(&r[i], "share", "v1", 1, "s1", "", 1, dst[i], 10000);
    sreader_expect(&r[i], "ready");
  }
  for (int i = 0; i < 4; i++)
    sreader_send(&r[i], "go\n");
  unsigned long long pub = 0, passed = 0;
  struct sresult s[4];
  for (int i = 0; i < 4; i++) {
    if (i != 2) { /* the one on GPU 0 joins no round */
      sreader_expect(&r[i], "joined");
      sreader_expect(&r[i], "leave");
    }
  }
  for (int i = 0; i < 4; i++) {
    if (i != 2)
      sreader_send(&r[i], "out\n");
    sreader_result(&r[i], &s[i]);
    sresult_check_ok(&s[i], i);
    printf("reader %d (%s): joined %d, %llu from the publisher, %llu from "
           "peers\n", i, dst[i], s[i].joined, s[i].pub, s[i].peer);
    if (i != 2) {
      ASSERT_EQ(s[i].joined, 1);
      pub += s[i].pub;
      passed += s[i].passed;
    }
  }
  ASSERT_EQ(s[2].joined, 0);
  ASSERT_EQ_U(s[2].pub, share_nchunks());
  if (passed == 0)
    ASSERT_EQ_U(pub, share_nchunks());
  for (int i = 0; i < 4; i++)
    ASSERT_EQ(sreader_end(&r[i]), 0);
  share_wait_none(dom, "s1");
}

/* The head killed once its third chunk's done word is written. */
static void head_killed(gpuipc_domain_t *dom)
{
  test_stamp("the head killed after its third chunk");
  char d1[32];
  dst_of(d1, sizeof(d1), other, "vmm");
  struct sreader k, s[2];
  sreader_start(&k, "share", "v1", 1, "s2", "done:3:kill", 0, "gpu1-vmm",
                SHARE_TIMEOUT_MS);
  sreader_expect(&k, "ready");
  sreader_start(&s[0], "share", "v1", 1, "s2", "", 1, d1, SHARE_TIMEOUT_MS);
  sreader_start(&s[1], "share", "v1", 1, "s2", "", 1, "gpu1-legacy",
                SHARE_TIMEOUT_MS);
  for (int i = 0; i < 2; i++)
    sreader_expect(&s[i], "ready");
  sreader_send(&k, "go\n");
  ASSERT_EQ(sreader_end(&k), 128 + SIGKILL);
  for (int i = 0; i < 2; i++)
    sreader_send(&s[i], "go\n");
  for (int i = 0; i < 2; i++)
    sreader_expect(&s[i], "joined");
  for (int i = 0; i < 2; i++)
    sreader_expect(&s[i], "leave");
  unsigned long long reclaimed = 0;
  for (int i = 0; i < 2; i++) {
    struct sresult r;
    sreader_send(&s[i], "out\n");
    sreader_result(&s[i], &r);
    sresult_check_ok(&r, i);
    reclaimed += r.reclaimed;
  }
  ASSERT_EQ_U(reclaimed, 3);
  for (int i = 0; i < 2; i++)
    ASSERT_EQ(sreader_end(&s[i]), 0);
  share_wait_none(dom, "s2");
}

/* Start @k, a LEGACY member on GPU 1, in round @round: it copies every
 * chunk alone and waits at its gate, serving. */
static void legacy_at_gate(struct sreader *k, const char *round)
{
  sreader_start(k, "share", "v1", 1, round, "", 1, "gpu1-legacy",
                SHARE_TIMEOUT_MS);
  sreader_expect(k, "ready");
  sreader_send(k, "go\n");
  sreader_expect(k, "joined");
  sreader_expect(k, "leave");
}

/* A LEGACY member that has every chunk, killed as the others copy. */
static void legacy_killed(gpuipc_domain_t *dom)
{
  test_stamp("a LEGACY member killed while the others copy from it");
  char d1[32];
  dst_of(d1, sizeof(d1), other, "vmm");
  struct sreader k, s[2];
  legacy_at_gate(&k, "s3");
  sreader_start(&s[0], "share", "v1", 1, "s3", "", 1, d1, SHARE_TIMEOUT_MS);
  sreader_start(&s[1], "share", "v1", 1, "s3", "", 1, "gpu1-vmm",
                SHARE_TIMEOUT_MS);
  for (int i = 0; i < 2; i++)
    sreader_expect(&s[i], "ready");
  for (int i = 0; i < 2; i++)
    sreader_send(&s[i], "go\n");
  for (int i = 0; i < 2; i++)
    sreader_expect(&s[i], "joined");
  kill(k.pid, SIGKILL);
  ASSERT_EQ(sreader_end(&k), 128 + SIGKILL);
  for (int i = 0; i < 2; i++)
    sreader_expect(&s[i], "leave");
  for (int i = 0; i < 2; i++) {
    struct sresult r;
    sreader_send(&s[i], "out\n");
    sreader_result(&s[i], &r);
    sresult_check_ok(&r, i);
  }
  for (int i = 0; i < 2; i++)
    ASSERT_EQ(sreader_end(&s[i]), 0);
  share_wait_none(dom, "s3");
}

/*
 * A member that copied every chunk from a LEGACY member whose copies have
 * landed, stopped before it looks whether that member lives; the LEGACY
 * member killed then. Its memory went with it after the copies, but the
 * follower cannot know when: it copies every chunk again from the
 * publisher, and says so.
 */
static void legacy_killed_settled(gpuipc_domain_t *dom)
{
  test_stamp("a LEGACY member killed once a follower's copies settled");
  struct sreader k, f;
  legacy_at_gate(&k, "s4");
  char d1[32];
  dst_of(d1, sizeof(d1), other, "vmm");
  sreader_start(&f, "share", "v1", 1, "s4", "settled:1:stop", 1, d1,
                SHARE_TIMEOUT_MS);
  sreader_expect(&f, "ready");
  sreader_send(&f, "go\n");
  sreader_expect(&f, "joined");
  int st;
  ASSERT_EQ(waitpid(f.pid, &st, WUNTRACED), f.pid);
  ASSERT_TRUE(WIFSTOPPED(st));
  kill(k.pid, SIGKILL);
  ASSERT_EQ(sreader_end(&k), 128 + SIGKILL);
  ASSERT_EQ(kill(f.pid, SIGCONT), 0);
  sreader_expect(&f, "leave");
  struct sresult r;
  sreader_send(&f, "out\n");
  sreader_result(&f, &r);
  sresult_check_ok(&r, 0);
  printf("follower: %llu from the publisher, %llu from peers, %llu copied "
         "again\n", r.pub, r.peer, r.recopied);
  /* Every chunk from the dead member, and every one again. */
  ASSERT_EQ_U(r.peer, share_nchunks());
  ASSERT_EQ_U(r.recopied, share_nchunks());
  ASSERT_EQ_U(r.pub, share_nchunks());
  ASSERT_EQ(sreader_end(&f), 0);
  share_wait_none(dom, "s4");
}

int main(void)
{
  test_require_gpus(2);
  int n = gpuipc_device_count();
  snprintf(other, sizeof(other), "gpu%d", n >= 3 ? 2 : 1);
  signal(SIGPIPE, SIG_IGN);
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("share", NULL, &dom));
  gpuipc_buf_t *v[SHARE_NSRC];
  share_publish_on(dom, "v1", 1, v, GPUIPC_KIND_VMM, 0);
  spread(dom);
  head_killed(dom);
  legacy_killed(dom);
  legacy_killed_settled(dom);
  for (int i = 0; i < SHARE_NSRC; i++)
    gpuipc_buf_release(v[i]);
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
