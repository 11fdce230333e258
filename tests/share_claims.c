/*
 * The shared copy's claim words (src/share/claims.c): a member that
 * claims a chunk, free or taken over, writes a claim word that the chunk's
 * done word does not already hold. Else a done word left there (a liar's,
 * or one from before the chunk was made free) would mark the chunk done
 * by this member before its copy, and others would copy bytes it has not
 * written yet: a liar that forged claim E and done E ^ 1 in a member's
 * name made an honest reader return 0 with wrong bytes once in about a
 * hundred runs of share_liar, when E was even and that member took the
 * claim over (E + 1).
 */
#include "test.h"
#include "share/share.h"

#define NCHUNKS 8

static struct share_chunk chunks[NCHUNKS];
static struct share_table t = {.chunks = chunks, .nchunks = NCHUNKS};

static void reset(void)
{
  for (int i = 0; i < NCHUNKS; i++) {
    atomic_store(&chunks[i].claim, 0);
    atomic_store(&chunks[i].done, 0);
  }
}

int main(void)
{
  const int me = 3;
  uint64_t w;
  /* Taken over: the forged claim names this very member (stale at once
   * to it), its done word the next epoch in this member's name. */
  for (uint64_t e = 2; e < 64; e += 2) {
    reset();
    uint64_t forged = gpuipc__share_claim_word(e, me);
    atomic_store(&chunks[5].claim, forged);
    atomic_store(&chunks[5].done, gpuipc__share_claim_word(e ^ 1, me));
    ASSERT_TRUE(gpuipc__share_reclaim(&t, 5, forged, me, &w));
    ASSERT_EQ_U(atomic_load(&chunks[5].claim), w);
    ASSERT_TRUE(w != atomic_load(&chunks[5].done));
    ASSERT_EQ(gpuipc__share_claim_slot(w), me);
  }
  /* A later epoch than both words, so that no earlier done matches. */
  reset();
  atomic_store(&chunks[1].claim, gpuipc__share_claim_word(7, 0));
  atomic_store(&chunks[1].done, gpuipc__share_claim_word(90, me));
  ASSERT_TRUE(gpuipc__share_reclaim(&t, 1, gpuipc__share_claim_word(7, 0),
                                    me, &w));
  ASSERT_TRUE(w >> 8 > 90);
  /* A claim that moved meanwhile is not taken. */
  ASSERT_TRUE(!gpuipc__share_reclaim(&t, 1, gpuipc__share_claim_word(7, 0),
                                     me, &w));
  /* A free chunk whose done word names this member at epoch 1 (made free
   * after this member's first claim of it, or forged). */
  for (int i = 0; i < NCHUNKS; i++) {
    reset();
    for (int j = 0; j < NCHUNKS; j++)
      if (j != i)
        atomic_store(&chunks[j].claim, gpuipc__share_claim_word(1, 0));
    atomic_store(&chunks[i].done, gpuipc__share_claim_word(1, me));
    for (int j = 0; j < NCHUNKS; j++) /* only the free one is taken */
      ASSERT_EQ(gpuipc__share_claim_at(&t, j, me, &w), j == i);
    ASSERT_TRUE(w != atomic_load(&chunks[i].done));
    ASSERT_EQ(gpuipc__share_claim_slot(w), me);
  }
  /* Epochs wrap below 2^56, never to 0 (a free chunk). */
  reset();
  uint64_t top = gpuipc__share_claim_word((1ull << 56) - 1, 0);
  atomic_store(&chunks[2].claim, top);
  ASSERT_TRUE(gpuipc__share_reclaim(&t, 2, top, me, &w));
  ASSERT_TRUE(w >> 8 >= 1 && w >> 8 < (1ull << 56));
  printf("claim words never equal the chunk's done word\n");
  return 0;
}
