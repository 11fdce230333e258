/*
 * gpuipc_share_copy: 1 to 6 readers of a published version (five extents
 * of two HOST segments, none a multiple of the 64 KiB chunk) copy it at
 * once. Each checks every byte it got (and that nothing outside the
 * extents was written); between them the publisher's bytes were copied
 * once: the chunks they copied from the publisher add up to the number of
 * chunks, the rest came from each other; and along a chain: unless one
 * passed over a member that fell behind, one of them copied every chunk
 * from the publisher and each other one every chunk from one member, a
 * member none of the others copied from. The round's segments are gone
 * once they are.
 */
#include "test.h"
#include "helpers/share_peer.h"

#define MAX_READERS 6

static void round_of(gpuipc_domain_t *dom, int k)
{
  char prefix[16], round[16];
  snprintf(prefix, sizeof(prefix), "v%d", k);
  snprintf(round, sizeof(round), "r%d", k);
  gpuipc_buf_t *src[SHARE_NSRC];
  share_publish(dom, prefix, (unsigned)k, src);
  struct sreader r[MAX_READERS];
  for (int i = 0; i < k; i++)
    sreader_start(&r[i], "share", prefix, (unsigned)k, round, "", 1, "own",
                  10000);
  for (int i = 0; i < k; i++)
    sreader_expect(&r[i], "ready");
  /* Nobody leaves (the gate) before all have joined: one round. */
  sreaders_go(r, k);
  struct sresult res[MAX_READERS];
  sreaders_out(r, k, res);
  unsigned long long pub = 0, peer = 0, passed = 0, served = 0;
  int heads = 0, parents = 0;
  for (int i = 0; i < k; i++) {
    const struct sresult s = res[i];
    ASSERT_EQ(s.joined, 1);
    ASSERT_EQ(s.server, 1);
    ASSERT_EQ(s.reclaimed, 0);
    pub += s.pub;
    peer += s.peer;
    passed += s.passed;
    heads += s.pub > 0;
    /* One parent each, and nobody the parent of two. */
    parents += __builtin_popcountll(s.sources) == 1 && !(served & s.sources);
    served |= s.sources;
  }
  printf("%d reader(s): %llu chunks from the publisher, %llu from peers "
         "(%llu chunks); %d copied from the publisher, %llu parent(s) "
         "passed over\n", k, pub, peer, (unsigned long long)share_nchunks(),
         heads, passed);
  if (passed == 0) {
    ASSERT_EQ(heads, 1);
    ASSERT_EQ(parents, k - 1);
  }
  ASSERT_EQ_U(pub, share_nchunks());
  ASSERT_EQ_U(peer, (uint64_t)(k - 1) * share_nchunks());
  sreaders_end_ok(r, k);
  share_wait_none(dom, round);
  for (int i = 0; i < SHARE_NSRC; i++)
    gpuipc_buf_release(src[i]);
}

int main(void)
{
  signal(SIGPIPE, SIG_IGN);
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("share", NULL, &dom));
  for (int k = 1; k <= MAX_READERS; k++)
    round_of(dom, k);
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
