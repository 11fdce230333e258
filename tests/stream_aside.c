/*
 * A word written after a caller's stream's work (gpuipc__stream_word_write
 * _after: a release word) is written by a stream of gpuipc's own that
 * waits for that work, one per caller's stream: a stream held up (here a
 * wait for a word nobody has written yet) holds up its own words only.
 * On the fake CUDA driver (its streams run by themselves when a write is
 * queued, tests/fake_cuda/fake_stream.c), in this process:
 *   - stream X waits for word Z; a word after X's work and one after Y's
 *     are asked for: Y's lands while X waits (with one stream of gpuipc's
 *     own for both, it would wait behind X's), X's does not; once Z is
 *     written, X's lands;
 *   - ten streams, each waiting for a word of its own, each with a word
 *     after it (past the eight streams of gpuipc's own: some share one):
 *     as the waits are released in reverse order, no word lands before
 *     its stream's wait is over, and every one lands in the end.
 */
#include "test.h"

#include "cuda/cuda.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef FAKE_CUDA_FULL
#include "helpers/cu_peer.h"

#define NS 10

/* Words in one registered page: the device addresses of @n of them. */
static _Atomic uint64_t *words_make(int n, uint64_t *dev)
{
  _Atomic uint64_t *w = aligned_alloc(4096, 4096);
  ASSERT_TRUE(w != NULL);
  memset((void *)w, 0, 4096);
  CU_OK(cuMemHostRegister, (void *)w, 4096, CU_MEMHOSTREGISTER_DEVICEMAP);
  for (int i = 0; i < n; i++)
    ASSERT_OK(gpuipc__word_dev(0, (void *)&w[i], &dev[i]));
  return w;
}

/* Wait (10 s at most) until word @w is @v. */
static void until(_Atomic uint64_t *w, uint64_t v, const char *what)
{
  for (int i = 0; i < 10000 && atomic_load(w) != v; i++)
    usleep(1000);
  if (atomic_load(w) != v)
    TFAIL("%s: still %llu after 10 s", what,
          (unsigned long long)atomic_load(w));
}

int main(void)
{
  setenv("GPUIPC_CUDA_LIB", FAKE_CUDA_FULL, 1);
  CUstream x = cu_stream_make(), y;
  CU_OK(cuStreamCreate, &y, CU_STREAM_NON_BLOCKING);
  uint64_t a[3];
  _Atomic uint64_t *w = words_make(3, a); /* Z, X's word, Y's word */
  ASSERT_OK(gpuipc__stream_word_wait(0, x, a[0], 1));
  ASSERT_OK(gpuipc__stream_word_write_after(0, x, a[1], 7));
  ASSERT_OK(gpuipc__stream_word_write_after(0, y, a[2], 9));
  until(&w[2], 9, "the word after an idle stream, beside a waiting one");
  ASSERT_EQ_U(atomic_load(&w[1]), 0);
  atomic_store(&w[0], 1);
  until(&w[1], 7, "the word after the stream whose wait is over");
  printf("a word after a waiting stream did not hold up another's\n");

  CUstream s[NS];
  uint64_t b[2 * NS];
  _Atomic uint64_t *v = words_make(2 * NS, b); /* waits, then words after */
  for (int i = 0; i < NS; i++) {
    CU_OK(cuStreamCreate, &s[i], CU_STREAM_NON_BLOCKING);
    ASSERT_OK(gpuipc__stream_word_wait(0, s[i], b[i], 1));
    ASSERT_OK(gpuipc__stream_word_write_after(0, s[i], b[NS + i],
                                              100 + (uint64_t)i));
  }
  /* One shared with a stream still waiting waits behind it. */
  for (int i = NS - 1; i >= 0; i--) {
    usleep(2000); /* the fake's streams look every 100 us */
    for (int j = 0; j <= i; j++)
      if (atomic_load(&v[NS + j]) != 0)
        TFAIL("stream %d's word landed before its wait was over", j);
    atomic_store(&v[i], 1);
  }
  for (int i = 0; i < NS; i++)
    until(&v[NS + i], 100 + (uint64_t)i, "a word after a shared stream");
  printf("%d streams: every word after its own stream's work\n", NS);
  return 0;
}
#else
int main(void)
{
  SKIP("built without the CUDA headers: no fake CUDA driver");
}
#endif
