/*
 * DLPack: the structs have DLPack's layout (offsets as dlpack.h gives them
 * on LP64), and a received view handed over as a DLManagedTensor (or
 * DLManagedTensorVersioned) describes the same bytes and is released by
 * the deleter, which the sender then sees. The deleter releases the view
 * on the stream it was handed over with (gpuipc_tensor_to_dlpack_stream:
 * the consumer's), NULL without one.
 */
#include "helpers/chan_common.h"

#include "channel/channel.h"

#include <stddef.h>
#include <unistd.h>

static const gpuipc_tensor_t *hook_view;
static void *hook_stream;
static int hook_calls;

static void on_release(const gpuipc_tensor_t *view, void *stream)
{
  hook_view = view;
  hook_stream = stream;
  hook_calls++;
}

/* Message @i: even ones versioned; 3 and 4 handed over with a stream. */
static void *stream_of_msg(uint64_t i)
{
  return i >= 3 ? (void *)(uintptr_t)(0x5000 + i) : NULL;
}

int main(void)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  /* dlpack.h's DLTensor, DLManagedTensor, DLManagedTensorVersioned. */
  ASSERT_EQ(offsetof(gpuipc_dl_tensor_t, device), 8);
  ASSERT_EQ(offsetof(gpuipc_dl_tensor_t, ndim), 16);
  ASSERT_EQ(offsetof(gpuipc_dl_tensor_t, dtype), 20);
  ASSERT_EQ(offsetof(gpuipc_dl_tensor_t, shape), 24);
  ASSERT_EQ(offsetof(gpuipc_dl_tensor_t, strides), 32);
  ASSERT_EQ(offsetof(gpuipc_dl_tensor_t, byte_offset), 40);
  ASSERT_EQ(sizeof(gpuipc_dl_managed_tensor_t), 64);
  ASSERT_EQ(offsetof(gpuipc_dl_managed_tensor_t, deleter), 56);
  ASSERT_EQ(offsetof(gpuipc_dl_managed_tensor_versioned_t, dl_tensor), 32);
  ASSERT_EQ(sizeof(gpuipc_dl_managed_tensor_versioned_t), 80);

  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("chan-dl", NULL, &dom));
  const char *args[] = {"echo", "chan-dl", "dl", "4", NULL};
  pid_t pid = test_spawn("chan_peer", args, NULL);
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, "dl", NULL, &ch));
  gpuipc_buf_t *buf;
  ASSERT_OK(gpuipc_buf_alloc(CHAN_SLOT * CHAN_SLOTS, GPUIPC_KIND_HOST, -1, 0,
                             &buf));
  gpuipc_channel_info_t info = {.size = sizeof(info)};
  gpuipc__test_hook_dlpack_release = on_release;
  for (uint64_t i = 1; i <= 4; i++) {
    struct chan_msg m;
    gpuipc_tensor_t t;
    chan_msg_make(i, 0, (uint8_t *)gpuipc_buf_ptr(buf) + i * CHAN_SLOT, buf,
                  &m, &t);
    uint64_t ticket;
    ASSERT_OK(gpuipc_channel_send(ch, &t, NULL, 0, &ticket));
    gpuipc_tensor_t *v;
    ASSERT_OK(gpuipc_channel_recv(ch, &v, NULL, 30000));
    const gpuipc_dl_tensor_t *dl;
    void *stream = stream_of_msg(i);
    /* A refused hand-over leaves the view the caller's. */
    ASSERT_RC(gpuipc_tensor_to_dlpack_stream(v, stream, NULL), -EINVAL);
    ASSERT_RC(gpuipc_tensor_to_dlpack_versioned_stream(v, stream, NULL),
              -EINVAL);
    int calls = hook_calls;
    if (i % 2) {
      gpuipc_dl_managed_tensor_t *mt;
      if (stream != NULL)
        ASSERT_OK(gpuipc_tensor_to_dlpack_stream(v, stream, &mt));
      else
        ASSERT_OK(gpuipc_tensor_to_dlpack(v, &mt));
      dl = &mt->dl_tensor;
      ASSERT_TRUE(mt->deleter != NULL);
      gpuipc_tensor_t back;
      ASSERT_OK(gpuipc_tensor_from_dlpack(dl, NULL, &back));
      const char *why = chan_msg_check(i, 0, &back);
      if (why != NULL)
        TFAIL("DLManagedTensor: %s", why);
      ASSERT_OK(gpuipc_channel_info(ch, &info));
      ASSERT_EQ(info.views, 1);
      mt->deleter(mt);
    } else {
      gpuipc_dl_managed_tensor_versioned_t *mv;
      if (stream != NULL)
        ASSERT_OK(gpuipc_tensor_to_dlpack_versioned_stream(v, stream, &mv));
      else
        ASSERT_OK(gpuipc_tensor_to_dlpack_versioned(v, &mv));
      ASSERT_EQ(mv->version.major, 1);
      ASSERT_EQ(mv->flags, 0);
      dl = &mv->dl_tensor;
      gpuipc_tensor_t back;
      ASSERT_OK(gpuipc_tensor_from_dlpack(dl, buf, &back));
      ASSERT_PTR_EQ(back.buf, buf);
      const char *why = chan_msg_check(i, 0, &back);
      if (why != NULL)
        TFAIL("DLManagedTensorVersioned: %s", why);
      mv->deleter(mv);
    }
    /* Released once, on the consumer's stream. */
    ASSERT_EQ(hook_calls, calls + 1);
    ASSERT_PTR_EQ(hook_view, v);
    ASSERT_PTR_EQ(hook_stream, stream);
    ASSERT_OK(gpuipc_channel_info(ch, &info));
    ASSERT_EQ(info.views, 0);
    /* The deleter gave the echo back: its sender's done waits end. */
    ASSERT_OK(gpuipc_channel_send_done(ch, ticket, 30000));
  }
  ASSERT_EQ(test_wait(pid, 60000), 0);
  gpuipc_dl_managed_tensor_t *mt;
  ASSERT_RC(gpuipc_tensor_to_dlpack(NULL, &mt), -EINVAL);
  ASSERT_RC(gpuipc_tensor_to_dlpack_stream(NULL, NULL, &mt), -EINVAL);
  gpuipc_dl_managed_tensor_versioned_t *mv;
  ASSERT_RC(gpuipc_tensor_to_dlpack_versioned_stream(NULL, NULL, &mv),
            -EINVAL);
  ASSERT_OK(gpuipc_channel_close(ch));
  gpuipc_buf_release(buf);
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
