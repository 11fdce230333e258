/*
 * Every stream handle a caller may pass takes the channel's fast path: a
 * stream with nothing pending needs no interprocess event, and a stream
 * with work pending gets one that the other side's stream waits on.
 *
 * Two chan_stream_peer processes on the fake CUDA driver (GPU-kind LEGACY
 * memory really shared between them, interprocess events whose work the
 * recording process does when the other waits) send 4 KiB tensors back
 * and forth (send, recv, release, send_wait), for each of NULL,
 * CU_STREAM_LEGACY, CU_STREAM_PER_THREAD and a created stream, with and
 * without device 0's primary context current on the calling thread:
 *   idle: the streams are synchronised before each send and release: no
 *         event is recorded or waited on, on either side;
 *   lag:  a copy is left pending on the stream before each send and each
 *         release (FAKE_CUDA_COPY_LAG keeps it pending): every send
 *         has its stream write a ready word that the receiver's stream
 *         waits on (or, with GPUIPC_CHAN_READY_WORDS=0, records an event
 *         that the receiver's stream waits on), every
 *         release has the receiver's stream write a release word that the
 *         sender's stream waits on (written when the receiver next
 *         synchronises, after the sender queued that wait), and each
 *         side, on its stream,
 *         sees every byte of the other's work in order.
 * Each process counts its event records and waits and its word writes and
 * waits and checks them (tests/helpers/chan_stream_peer.c).
 */
#include "helpers/fake_lag.h"

#include <unistd.h>

#define N "16"

int main(void)
{
  /* Both peers load the fake driver; pending copies stay pending until a
   * synchronisation (no query ever completes them). */
  gpuipc_domain_t *dom = fake_lag_begin("chan-streams");
  static const char *const handles[] = {"null", "legacy", "per-thread",
                                        "created"};
  static const char *const modes[] = {"idle", "lag"};
  int runs = 0;
  for (int words = 0; words < 2; words++) {
    /* Events: words are written when a process synchronises its stream,
     * never by the fake by itself (10 minutes): see chan_stream_peer.
     * Ready words: the receiver's stream waits for the sender's, which
     * the sender's stream writes by itself 20 ms after queuing it. */
    setenv("GPUIPC_CHAN_READY_WORDS", words ? "1" : "0", 1);
    setenv("FAKE_CUDA_COPY_LAG_US", words ? "20000" : "600000000", 1);
    for (int h = 0; h < 4; h++)
      for (int m = 0; m < 2; m++)
        for (int cur = 0; cur < 2; cur++) {
          char name[64], c[2] = {(char)('0' + cur), 0};
          snprintf(name, sizeof(name), "%s-%s-%d-%d", handles[h], modes[m],
                   cur, words);
          const char *rargs[] = {"recv",   "chan-streams", name, handles[h],
                                 modes[m], N,              c,    NULL};
          const char *sargs[] = {"send",   "chan-streams", name, handles[h],
                                 modes[m], N,              c,    NULL};
          pid_t r = test_spawn("chan_stream_peer", rargs, NULL);
          pid_t s = test_spawn("chan_stream_peer", sargs, NULL);
          int rs = test_wait(s, 60000), rr = test_wait(r, 60000);
          if (rs != 0 || rr != 0)
            TFAIL("stream %s, %s, context %s, %s: sender exited %d, "
                  "receiver %d", handles[h], modes[m],
                  cur ? "current" : "not current",
                  words ? "ready words" : "events", rs, rr);
          runs++;
        }
  }
  ASSERT_OK(gpuipc_domain_leave(dom));
  printf("%d runs of " N " 4 KiB messages: every stream handle idle "
         "without events or words, pending with them (events, then ready "
         "words), every byte checked\n", runs);
  return 0;
}
