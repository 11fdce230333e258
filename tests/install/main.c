/* A program built against an installed gpuipc (find_package or pkg-config). */
#include <gpuipc.h>
#include <stdio.h>

int main(void)
{
  gpuipc_buf_t *b;
  int rc = gpuipc_buf_alloc(4096, GPUIPC_KIND_HOST, -1, 0, &b);
  printf("installed gpuipc %s: alloc %s\n", gpuipc_version(),
         gpuipc_err_name(rc));
  return rc != 0 ? 1 : gpuipc_buf_release(b);
}
