/*
 * A GPU segment's publication carries an interprocess event only when the
 * stream it is ordered after has work pending. On the fake CUDA driver
 * (LEGACY memory on its GPU 0; FAKE_CUDA_COPY_LAG keeps a queued copy pending until
 * a synchronisation or another process's wait asks for it), this process
 * creates and fills segments and a seg_peer process reads them:
 *   - busy: the fill is queued (cuMemcpyAsync) on a created stream,
 *     then on the legacy stream (NULL), and not synchronised: the
 *     publication records one event, and the reader, whose open makes its
 *     stream wait for that event, finds every byte;
 *   - idle: the same fills synchronised before the publication: no event
 *     is recorded (no interprocess event made, so CUDA keeps no file in
 *     /dev/shm for it), and the reader finds every byte.
 */
#include "helpers/fake_lag.h"
#include "helpers/seg_peer.h"

#ifdef FAKE_CUDA_FULL
#include "helpers/cu_peer.h"

#define SIZE ((size_t)1 << 20)

static gpuipc_domain_t *dom;

/* Create segment @name (LEGACY, GPU 0), queue its fill with pattern @seed on
 * @stream, synchronise it when @idle, publish it on @stream; the events
 * this process recorded for the publication. A busy fill stays pending:
 * only a reader's wait for the event gets it done. */
static int publish(const char *name, uint64_t seed, CUstream stream,
                   bool idle)
{
  gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
  o.bytes = SIZE;
  o.flags = GPUIPC_CREATE;
  o.kind = GPUIPC_KIND_LEGACY;
  o.device = 0;
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_segment_open(dom, name, &o, &b));
  static uint8_t host[4][SIZE]; /* one a case: pending fills read them */
  uint8_t *src = host[seed % 4];
  test_fill(src, SIZE, seed);
  CU_OK(cuMemcpyAsync, (CUdeviceptr)(uintptr_t)gpuipc_buf_ptr(b),
        (CUdeviceptr)(uintptr_t)src, SIZE, stream);
  if (idle)
    CU_OK(cuStreamSynchronize, stream);
  int before = cu_fake_count("fake_cuda_events_recorded");
  ASSERT_OK(gpuipc_segment_publish(b, stream));
  int events = cu_fake_count("fake_cuda_events_recorded") - before;
  gpuipc_buf_release(b); /* the domain keeps it: published */
  return events;
}

/* The reader opens @name (waiting: its stream waits for the publication's
 * event) and checks pattern @seed (cuMemcpyDtoH, after that stream). */
static void read_back(struct peer *r, const char *name, uint64_t seed)
{
  char want[64];
  snprintf(want, sizeof(want), "ok 0 %zu", SIZE);
  PEER_EXPECT(r, want, "fopen %s 0 w legacy 0", name);
  PEER_OK(r, "gcheck %s %llu", name, (unsigned long long)seed);
  PEER_OK(r, "release %s", name);
  ASSERT_OK(gpuipc_segment_unlink(dom, name));
}

int main(void)
{
  dom = fake_lag_begin("segpubev");
  CUstream s = cu_stream_make();
  struct peer r;
  peer_start(&r);
  PEER_OK(&r, "join segpubev");
  static const struct {
    const char *name;
    bool created, idle; /* created: on s, else on the legacy stream */
  } cases[] = {{"created-busy", true, false},
               {"legacy-busy", false, false},
               {"created-idle", true, true},
               {"legacy-idle", false, true}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    uint64_t seed = 40 + i;
    int events = publish(cases[i].name, seed, cases[i].created ? s : NULL,
                         cases[i].idle);
    if (events != (cases[i].idle ? 0 : 1))
      TFAIL("%s: the publication recorded %d events (want %d)",
            cases[i].name, events, cases[i].idle ? 0 : 1);
    read_back(&r, cases[i].name, seed);
    printf("%s: %d event%s, every byte read\n", cases[i].name, events,
           events == 1 ? "" : "s");
  }
  peer_finish(&r);
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
#else
int main(void)
{
  SKIP("built without the CUDA headers: no fake CUDA driver");
}
#endif
