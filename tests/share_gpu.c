/*
 * gpuipc_share_copy into GPU memory, on the fake CUDA driver: three
 * readers with LEGACY destinations on GPU 0 copy a published HOST version.
 * The copies go on their streams, the words (cuStreamWriteValue64 into
 * the pinned table) on streams of gpuipc's own after them, none on the
 * caller's (a word there pauses its copies); each reader checks every
 * byte after its stream; between them the publisher's bytes were copied
 * once, and the round's segments are gone once they are. Then a member is
 * killed at its third claim: the others take its claims over.
 */
#include "test.h"
#include "helpers/share_peer.h"

#define NREADERS 3

#ifdef FAKE_CUDA_FULL
/* A member killed half way through its third copy: the other two finish
 * (its claims taken over), every byte right. */
static void killed(gpuipc_domain_t *dom)
{
  struct sreader k, r[2];
  sreader_start(&k, "share", "v1", 1, "g2", "claimed:3:kill", 0, "legacy",
                SHARE_TIMEOUT_MS);
  sreader_expect(&k, "ready");
  for (int i = 0; i < 2; i++) {
    sreader_start(&r[i], "share", "v1", 1, "g2", "", 1, "legacy",
                  SHARE_TIMEOUT_MS);
    sreader_expect(&r[i], "ready");
  }
  sreader_send(&k, "go\n");
  ASSERT_EQ(sreader_end(&k), 128 + SIGKILL);
  sreaders_go(r, 2);
  struct sresult s[2];
  sreaders_out(r, 2, s);
  ASSERT_EQ_U(s[0].reclaimed + s[1].reclaimed, 3);
  sreaders_end_ok(r, 2);
  share_wait_none(dom, "g2");
}
#endif

int main(void)
{
#ifndef FAKE_CUDA_FULL
  SKIP("built without the CUDA headers: no fake driver");
#else
  setenv("GPUIPC_CUDA_LIB", FAKE_CUDA_FULL, 1);
  gpuipc_buf_t *v[SHARE_NSRC];
  gpuipc_domain_t *dom = share_begin(v);
  struct sreader r[NREADERS];
  for (int i = 0; i < NREADERS; i++) {
    sreader_start(&r[i], "share", "v1", 1, "g1", "", 1, "legacy", 10000);
    sreader_expect(&r[i], "ready");
  }
  sreaders_go(r, NREADERS);
  struct sresult s[NREADERS];
  sreaders_out(r, NREADERS, s);
  unsigned long long pub = 0;
  for (int i = 0; i < NREADERS; i++) {
    ASSERT_EQ(s[i].joined, 1);
    ASSERT_EQ(s[i].server, 1);
    /* A done or prefix word a chunk at least, none on the caller's
     * stream. */
    ASSERT_GE(s[i].words, (int)share_nchunks());
    ASSERT_EQ(s[i].on_stream, 0);
    pub += s[i].pub;
  }
  ASSERT_EQ_U(pub, share_nchunks());
  sreaders_end_ok(r, NREADERS);
  share_wait_none(dom, "g1");
  killed(dom);
  share_end(dom, v);
  return 0;
#endif
}
