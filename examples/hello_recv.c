/*
 * hello_recv: the receiving side of the quick start (README). Joins domain
 * "hello" (argv[1] names another), receives hello_send's tensor on channel
 * "greetings" as a view of the sender's memory, prints its sum and gives
 * the view back.
 */
#include <gpuipc.h>

#include <stdio.h>

static int fail(const char *what, int rc)
{
  fprintf(stderr, "hello_recv: %s: %s\n", what, gpuipc_last_error());
  return rc < 0 ? 1 : rc;
}

int main(int argc, char **argv)
{
  gpuipc_domain_t *dom;
  gpuipc_channel_t *ch;
  gpuipc_tensor_t *view;
  int rc = gpuipc_domain_join(argc > 1 ? argv[1] : "hello", NULL, &dom);
  if (rc != 0)
    return fail("join", rc);
  if ((rc = gpuipc_channel_open(dom, "greetings", NULL, &ch)) != 0)
    return fail("open", rc);
  if ((rc = gpuipc_channel_recv(ch, &view, NULL, 10000)) != 0)
    return fail("recv", rc);
  const float *x = view->dl.data; /* no copy: the sender's memory */
  int64_t n = view->dl.shape[0] * view->dl.shape[1];
  double sum = 0;
  for (int64_t i = 0; i < n; i++)
    sum += x[i];
  printf("hello_recv: %lldx%lld float32, sum %.0f\n",
         (long long)view->dl.shape[0], (long long)view->dl.shape[1], sum);
  gpuipc_tensor_release(view, NULL); /* the sender may reuse it now */
  gpuipc_channel_close(ch);
  gpuipc_domain_leave(dom);
  return 0;
}
