/*
 * The other process of tests/rundir.c: resolves the runtime directory in a
 * fresh process, whose settings come from the environment it was given.
 *   os_rundir ok PATH : gpuipc__runtime_dir succeeds with PATH, a directory
 *       owned by us and writable by nobody else.
 *   os_rundir fail CODE NEEDLE : it fails with CODE and a sentence that
 *       mentions NEEDLE.
 *   os_rundir missing PATH : gpuipc__runtime_dir_find and
 *       gpuipc_runtime_dir(GPUIPC_RUNDIR_FIND) say that PATH does not
 *       exist, and make nothing.
 *   os_rundir join UID CODE NEEDLE... : as UID (root starts it; gid
 *       65534), gpuipc_domain_join fails with CODE and gpuipc_last_error()
 *       mentions every NEEDLE (what a user of the library sees).
 * Exit status 0 on success; anything else names the failed step on stderr.
 */
#include "test.h"

#include "os/os.h"

#include <grp.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv)
{
  char out[PATH_MAX] = "untouched";
  if (argc == 3 && strcmp(argv[1], "ok") == 0) {
    ASSERT_OK(gpuipc__runtime_dir(out, sizeof(out)));
    ASSERT_STREQ(out, argv[2]);
    struct stat st;
    ASSERT_EQ(lstat(out, &st), 0);
    ASSERT_TRUE(S_ISDIR(st.st_mode));
    ASSERT_EQ(st.st_uid, geteuid());
    ASSERT_EQ(st.st_mode & 022, 0);
    return 0;
  }
  if (argc == 4 && strcmp(argv[1], "fail") == 0) {
    ASSERT_RC(gpuipc__runtime_dir(out, sizeof(out)), atoi(argv[2]));
    ASSERT_ERR_MENTIONS(argv[3]);
    ASSERT_STREQ(out, "untouched");
    return 0;
  }
  if (argc == 3 && strcmp(argv[1], "missing") == 0) {
    ASSERT_RC(gpuipc__runtime_dir_find(out, sizeof(out)), -ENOENT);
    ASSERT_ERR_MENTIONS(argv[2]);
    ASSERT_ERR_MENTIONS("does not exist");
    ASSERT_STREQ(out, "untouched");
    ASSERT_EQ(access(argv[2], F_OK), -1);
    ASSERT_RC(gpuipc_runtime_dir(out, sizeof(out), GPUIPC_RUNDIR_FIND),
              -ENOENT);
    ASSERT_ERR_MENTIONS("does not exist");
    ASSERT_STREQ(out, "untouched");
    ASSERT_EQ(access(argv[2], F_OK), -1);
    return 0;
  }
  if (argc >= 5 && strcmp(argv[1], "join") == 0) {
    ASSERT_EQ(setgroups(0, NULL), 0);
    ASSERT_EQ(setgid(65534), 0);
    ASSERT_EQ(setuid((uid_t)atoi(argv[2])), 0);
    gpuipc_domain_t *d = NULL;
    ASSERT_RC(gpuipc_domain_join("squatted", NULL, &d), atoi(argv[3]));
    for (int i = 4; i < argc; i++)
      ASSERT_ERR_MENTIONS(argv[i]);
    ASSERT_TRUE(d == NULL);
    return 0;
  }
  fprintf(stderr, "usage: os_rundir ok PATH | fail CODE NEEDLE | missing "
                  "PATH | join UID CODE NEEDLE...\n");
  return 2;
}
