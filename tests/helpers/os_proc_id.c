/*
 * The other process of tests/proc.c.
 *   os_proc_id id FD : write this process's identity to FD as
 *       "BOOTHEX PIDNS NONCE PID\n".
 *   os_proc_id pause : wait until killed.
 * Exit status 0 on success; anything else names the failed step on stderr.
 */
#include "test.h"

#include "os/os.h"

#include <unistd.h>

int main(int argc, char **argv)
{
  if (argc == 3 && strcmp(argv[1], "id") == 0) {
    const struct gpuipc__proc_id *me = gpuipc__proc_self();
    char line[128];
    int n = 0;
    for (int i = 0; i < 16; i++)
      n += snprintf(line + n, sizeof(line) - (size_t)n, "%02x", me->boot_id[i]);
    n += snprintf(line + n, sizeof(line) - (size_t)n, " %llu %llu %u\n",
                  (unsigned long long)me->pidns, (unsigned long long)me->nonce,
                  me->pid);
    ASSERT_EQ(write(atoi(argv[2]), line, (size_t)n), n);
    return 0;
  }
  if (argc == 2 && strcmp(argv[1], "pause") == 0) {
    for (;;)
      pause();
  }
  fprintf(stderr, "usage: os_proc_id id FD | pause\n");
  return 2;
}
