/*
 * The public calls that look at the runtime directory without joining:
 * gpuipc_domain_names lists its domains, live or not, sorted, and never a
 * channel's socket; gpuipc_runtime_prune finds (dry run) and removes what
 * a dead broker left, never a live domain's files; both create nothing
 * and refuse bad arguments before any side effect; gpuipc_domain_name_check
 * applies the name rule.
 */
#include "test.h"

#include "helpers/dead_domain.h"
#include "os/os.h"

#include <fcntl.h>
#include <stddef.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[PATH_MAX];

static bool exists(const char *name)
{
  char p[PATH_MAX + 64];
  snprintf(p, sizeof(p), "%s/%s", dir, name);
  return access(p, F_OK) == 0;
}

/* A channel's socket nobody listens on: stale, and no domain. */
static void dead_channel(void)
{
  char p[PATH_MAX + 64];
  snprintf(p, sizeof(p), "%s/chan-0123456789abcdef.sock", dir);
  int lfd;
  ASSERT_OK(gpuipc__sock_listen(p, 1, &lfd));
  close(lfd);
}

struct seen {
  int n, failed;
  bool gone_sock, gone_lock, chan;
};

static void on_stale(void *arg, const char *file, const char *why, int rc)
{
  struct seen *s = arg;
  printf("stale: %s (%s) rc %d\n", file, why, rc);
  s->n++;
  s->failed += rc < 0;
  s->gone_sock |= strcmp(file, "gone.sock") == 0;
  s->gone_lock |= strcmp(file, "gone.lock") == 0;
  s->chan |= strncmp(file, "chan-", 5) == 0;
}

static void names_listed(void)
{
  ASSERT_EQ(gpuipc_domain_names(NULL, 0), 3);
  gpuipc_domain_entry_t e[4];
  for (int i = 0; i < 4; i++)
    e[i].size = sizeof(e[i]);
  ASSERT_EQ(gpuipc_domain_names(e, 4), 3);
  ASSERT_STREQ(e[0].name, "alpha");
  ASSERT_EQ(e[0].live, 1);
  ASSERT_STREQ(e[1].name, "gone");
  ASSERT_EQ(e[1].live, 0);
  ASSERT_STREQ(e[2].name, "zeta");
  ASSERT_EQ(e[2].live, 1);
  /* Room for fewer: the first ones, and the count of all. */
  memset(&e[1], 0x5a, sizeof(e[1]));
  e[1].size = sizeof(e[1]);
  ASSERT_EQ(gpuipc_domain_names(e, 1), 3);
  ASSERT_STREQ(e[0].name, "alpha");
  ASSERT_EQ(e[1].name[0], 0x5a); /* beyond cap: untouched */
  /* An older struct without @live, 72 bytes apart: only those written. */
  enum { OLD = offsetof(gpuipc_domain_entry_t, live) };
  _Alignas(size_t) unsigned char old[3 * OLD];
  memset(old, 0x5a, sizeof(old));
  for (int i = 0; i < 3; i++) {
    size_t sz = OLD;
    memcpy(old + i * OLD, &sz, sizeof(sz));
  }
  ASSERT_EQ(gpuipc_domain_names((gpuipc_domain_entry_t *)old, 2), 3);
  ASSERT_STREQ((char *)old + sizeof(size_t), "alpha");
  ASSERT_STREQ((char *)old + OLD + sizeof(size_t), "gone");
  ASSERT_EQ(old[2 * OLD + sizeof(size_t)], 0x5a); /* beyond cap */
}

static void bad_arguments(void)
{
  gpuipc_domain_entry_t e[2] = {{.size = sizeof(e[0])}, {.size = 8}};
  ASSERT_RC(gpuipc_domain_names(NULL, 1), -EINVAL);
  ASSERT_RC(gpuipc_domain_names(e, -1), -EINVAL);
  ASSERT_RC(gpuipc_domain_names(e, 2), -EINVAL); /* sizes differ */
  e[0].size = e[1].size = 0;
  ASSERT_RC(gpuipc_domain_names(e, 2), -EINVAL);
  ASSERT_RC(gpuipc_runtime_prune(0x80, NULL, NULL), -EINVAL);
  ASSERT_TRUE(exists("gone.sock")); /* refused: nothing removed */
  ASSERT_OK(gpuipc_domain_name_check("a-b_c.9"));
  ASSERT_RC(gpuipc_domain_name_check(".hidden"), -EINVAL);
  ASSERT_RC(gpuipc_domain_name_check("a/b"), -EINVAL);
  ASSERT_RC(gpuipc_domain_name_check(""), -EINVAL);
  ASSERT_RC(gpuipc_domain_name_check(NULL), -EINVAL);
}

static void pruned(void)
{
  struct seen s = {0};
  ASSERT_EQ(gpuipc_runtime_prune(GPUIPC_PRUNE_DRY_RUN, on_stale, &s), 3);
  ASSERT_EQ(s.n, 3);
  ASSERT_TRUE(s.gone_sock && s.gone_lock && s.chan);
  ASSERT_TRUE(exists("gone.sock") && exists("gone.lock")); /* dry run */
  memset(&s, 0, sizeof(s));
  ASSERT_EQ(gpuipc_runtime_prune(0, on_stale, &s), 3);
  ASSERT_EQ(s.failed, 0);
  ASSERT_TRUE(!exists("gone.sock") && !exists("gone.lock"));
  ASSERT_TRUE(!exists("chan-0123456789abcdef.sock"));
  ASSERT_TRUE(exists("alpha.sock") && exists("alpha.lock")); /* live */
  ASSERT_EQ(gpuipc_runtime_prune(0, NULL, NULL), 0);
  ASSERT_EQ(gpuipc_domain_names(NULL, 0), 2);
}

/*
 * A runtime directory that is not there: -ENOENT, and none is made. The
 * setting is read once per process: checked in a child started with it.
 */
static void no_directory_child(void)
{
  ASSERT_RC(gpuipc_domain_names(NULL, 0), -ENOENT);
  ASSERT_RC(gpuipc_runtime_prune(GPUIPC_PRUNE_DRY_RUN, NULL, NULL), -ENOENT);
  exit(0);
}

static void no_directory(void)
{
  char none[PATH_MAX + 16];
  snprintf(none, sizeof(none), "%s/none", dir);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("GPUIPC_DIR", none, 1);
    execl("/proc/self/exe", "domain_names", "none", (char *)NULL);
    _exit(127);
  }
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st));
  ASSERT_EQ(WEXITSTATUS(st), 0);
  ASSERT_EQ(access(none, F_OK), -1);
}

int main(int argc, char **argv)
{
  if (argc > 1 && strcmp(argv[1], "none") == 0)
    no_directory_child();
  ASSERT_OK(gpuipc__runtime_dir(dir, sizeof(dir)));
  const char *left[] = {"gone.sock", "gone.lock", /* by an earlier run */
                        "chan-0123456789abcdef.sock"};
  for (size_t i = 0; i < sizeof(left) / sizeof(left[0]); i++) {
    char p[PATH_MAX + 64];
    snprintf(p, sizeof(p), "%s/%s", dir, left[i]);
    unlink(p);
  }
  gpuipc_domain_t *a, *z;
  ASSERT_OK(gpuipc_domain_join("zeta", NULL, &z));
  ASSERT_OK(gpuipc_domain_join("alpha", NULL, &a));
  dead_domain(dir, "gone");
  dead_channel();
  names_listed();
  bad_arguments();
  pruned();
  ASSERT_OK(gpuipc_domain_leave(a));
  ASSERT_OK(gpuipc_domain_leave(z));
  /* A domain that ended cleanly leaves no file behind: nothing stale. */
  ASSERT_TRUE(!exists("alpha.sock") && !exists("zeta.sock"));
  ASSERT_TRUE(!exists("alpha.lock"));
  ASSERT_TRUE(!exists("zeta.lock"));
  struct seen s = {0};
  ASSERT_EQ(gpuipc_runtime_prune(GPUIPC_PRUNE_DRY_RUN, on_stale, &s), 0);
  ASSERT_EQ(gpuipc_domain_names(NULL, 0), 0);
  no_directory();
  printf("domain_names: ok\n");
  return 0;
}
