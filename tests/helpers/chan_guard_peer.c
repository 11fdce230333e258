/*
 * One end of tests/channel_ready_guard.c, on the fake CUDA driver:
 * chan_guard_peer send|recv DOMAIN CHANNEL
 *
 *   send: fill a 4 KiB LEGACY buffer of device 0 with a copy left pending
 *         on its stream (FAKE_CUDA_COPY_LAG_US: the copy and the ready
 *         word behind it would land after 10 minutes), send it, and sleep
 *         until killed.
 *   recv: receive the view (its stream now waits on the sender's ready
 *         word), kill the sender (SIGKILL), and synchronise the stream:
 *         that returns only once someone writes the word, and nobody but
 *         the guard can -- this thread is in the synchronisation. Then
 *         the channel says GPUIPC_E_PEER_GONE and closes cleanly.
 */
#include "core/private.h"
#include "test.h"

#include <signal.h>
#include <unistd.h>

#define BYTES 4096

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc != 4)
    TFAIL("usage: chan_guard_peer send|recv DOMAIN CHANNEL");
  bool send = strcmp(argv[1], "send") == 0;
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join(argv[2], NULL, &dom));
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.timeout_ms = 30000;
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, argv[3], &o, &ch));
  if (send) {
    gpuipc_buf_t *buf;
    ASSERT_OK(gpuipc_buf_alloc(BYTES, GPUIPC_KIND_LEGACY, 0, 0, &buf));
    static uint8_t src[BYTES];
    test_fill(src, BYTES, 7);
    ASSERT_OK(gpuipc__memcpy_async(gpuipc_buf_ptr(buf), src, BYTES, 0,
                                   NULL));
    int64_t shape[1] = {BYTES};
    gpuipc_tensor_t t = {.dl = {.data = gpuipc_buf_ptr(buf),
                                .device = {GPUIPC_DL_CUDA, 0},
                                .ndim = 1,
                                .dtype = {GPUIPC_DL_UINT, 8, 1},
                                .shape = shape},
                         .buf = buf};
    ASSERT_OK(gpuipc_channel_send(ch, &t, NULL, 0, NULL));
    printf("sender: sent, the copy and its ready word pending\n");
    for (;;)
      pause(); /* the receiver kills us */
  }
  gpuipc_tensor_t *v;
  ASSERT_OK(gpuipc_channel_recv(ch, &v, NULL, 30000));
  gpuipc_channel_info_t info = {.size = sizeof(info)};
  ASSERT_OK(gpuipc_channel_info(ch, &info));
  ASSERT_GT(info.peer_pid, 0);
  ASSERT_OK(kill(info.peer_pid, SIGKILL));
  printf("receiver: the view's stream waits on the ready word; sender "
         "(pid %d) killed\n", info.peer_pid);
  ASSERT_OK(gpuipc__stream_sync(0, NULL));
  printf("receiver: the stream went on\n");
  ASSERT_RC(gpuipc_tensor_release(v, NULL), GPUIPC_E_PEER_GONE);
  ASSERT_RC(gpuipc_channel_recv(ch, &v, NULL, 1000), GPUIPC_E_PEER_GONE);
  ASSERT_OK(gpuipc_channel_close(ch));
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
