/* A program built against an installed libgpuipc_mpi (find_package or
 * pkg-config): before MPI_Init every call refuses with -EINVAL. */
#include <gpuipc_mpi.h>

#include <errno.h>
#include <stdio.h>

int main(void)
{
  MPI_Comm c;
  int rc = gpuipc_mpi_scope_comm(MPI_COMM_WORLD, GPUIPC_MPI_SCOPE_NODE, &c);
  printf("installed gpuipc_mpi with gpuipc %s: scope_comm before MPI_Init "
         "%s: %s\n", gpuipc_version(), gpuipc_err_name(rc),
         gpuipc_last_error());
  return rc == -EINVAL ? 0 : 1;
}
