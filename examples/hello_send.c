/*
 * hello_send: the sending side of the quick start (README). Joins domain
 * "hello" (argv[1] names another), sends a 4x4 float32 tensor on channel
 * "greetings" without copying it, and waits until the receiver
 * (hello_recv) gives the memory back. Start the two in any order.
 */
#include <gpuipc.h>

#include <stdio.h>

static int fail(const char *what, int rc)
{
  fprintf(stderr, "hello_send: %s: %s\n", what, gpuipc_last_error());
  return rc < 0 ? 1 : rc;
}

int main(int argc, char **argv)
{
  gpuipc_domain_t *dom;
  gpuipc_channel_t *ch;
  gpuipc_buf_t *buf;
  int rc = gpuipc_domain_join(argc > 1 ? argv[1] : "hello", NULL, &dom);
  if (rc != 0)
    return fail("join", rc);
  /* Memory others can map: HOST here; a GPU kind and device for VRAM. */
  rc = gpuipc_buf_alloc(16 * sizeof(float), GPUIPC_KIND_HOST, -1, 0, &buf);
  if (rc != 0)
    return fail("alloc", rc);
  float *x = gpuipc_buf_ptr(buf);
  for (int i = 0; i < 16; i++)
    x[i] = (float)i;
  int64_t shape[2] = {4, 4};
  gpuipc_tensor_t t = {.dl = {.data = x,
                              .device = {GPUIPC_DL_CPU, 0},
                              .ndim = 2,
                              .dtype = {GPUIPC_DL_FLOAT, 32, 1},
                              .shape = shape},
                       .buf = buf};
  uint64_t ticket;
  if ((rc = gpuipc_channel_open(dom, "greetings", NULL, &ch)) != 0)
    return fail("open", rc);
  if ((rc = gpuipc_channel_send(ch, &t, NULL, 0, &ticket)) != 0)
    return fail("send", rc);
  if ((rc = gpuipc_channel_send_done(ch, ticket, 10000)) != 0)
    return fail("wait for the receiver", rc);
  printf("hello_send: sent 4x4 float32, the receiver gave it back\n");
  gpuipc_channel_close(ch);
  gpuipc_buf_release(buf);
  gpuipc_domain_leave(dom);
  return 0;
}
