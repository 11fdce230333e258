/*
 * Stale files of the runtime directory. A channel end killed while it
 * listens leaves its chan-HEX.sock behind: the next channel opened, the
 * next domain joined, or `gpuipc ls --prune` removes it, and `gpuipc ls`
 * shows it. A live channel's socket (even one being paired) and a live
 * domain's files are never removed; a dead domain's are, by --prune only.
 * `gpuipc ls` makes no runtime directory.
 */
#include "helpers/chan_common.h"

#include "helpers/dead_domain.h"
#include "os/os.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define TIMEOUT_MS 60000

static char dir[PATH_MAX];
static gpuipc_domain_t *dom;

static bool exists(const char *name)
{
  char p[PATH_MAX + 64];
  snprintf(p, sizeof(p), "%s/%s", dir, name);
  return access(p, F_OK) == 0;
}

/* A chan-*.sock of the runtime directory not in @known (NULL: any); into
 * @out. */
static bool find_chan_sock(const char *known, char *out, size_t cap)
{
  DIR *d = opendir(dir);
  ASSERT_TRUE(d != NULL);
  bool found = false;
  struct dirent *e;
  while (!found && (e = readdir(d)) != NULL) {
    size_t n = strlen(e->d_name);
    if (strncmp(e->d_name, "chan-", 5) != 0 || n < 10 ||
        strcmp(e->d_name + n - 5, ".sock") != 0 ||
        (known != NULL && strcmp(known, e->d_name) == 0))
      continue;
    snprintf(out, cap, "%s", e->d_name);
    found = true;
  }
  closedir(d);
  return found;
}

/* Wait until a channel socket other than @known appears; its name in @out. */
static void wait_chan_sock(const char *known, char *out, size_t cap)
{
  for (int i = 0; i < 6000; i++) {
    if (find_chan_sock(known, out, cap))
      return;
    usleep(10000); /* polling a directory: nothing to wait on */
  }
  TFAIL("no channel socket appeared in %s", dir);
}

#ifdef GPUIPC_CLI
/* Run `gpuipc ls ARGS` under GPUIPC_DIR=@rd; its exit status, its output. */
static int run_ls(const char *rd, const char *args, char *out, size_t cap)
{
  char cmd[PATH_MAX + 256];
  snprintf(cmd, sizeof(cmd), "GPUIPC_DIR='%s' %s ls %s 2>&1", rd, GPUIPC_CLI,
           args);
  int st = test_popen(cmd, out, cap);
  printf("$ gpuipc ls %s\n%s", args, out);
  return st;
}
#endif

static char out[65536];

/* A channel end that listens is killed: its socket stays behind. */
static void kill_listener(const char *channel, char *sock, size_t cap)
{
  char before[NAME_MAX + 1] = "";
  find_chan_sock(NULL, before, sizeof(before));
  const char *args[] = {"open-wait", "prune", channel, NULL};
  pid_t w = test_spawn("chan_peer", args, NULL);
  wait_chan_sock(before[0] ? before : NULL, sock, cap);
  ASSERT_OK(kill(w, SIGKILL));
  ASSERT_EQ(test_wait(w, TIMEOUT_MS), 128 + SIGKILL);
  ASSERT_TRUE(exists(sock));
  printf("%s left behind by its killed channel end\n", sock);
}

static void pair(const char *channel)
{
  const char *args[] = {"pair", "prune", channel, NULL};
  pid_t a = test_spawn("chan_peer", args, NULL);
  pid_t b = test_spawn("chan_peer", args, NULL);
  ASSERT_EQ(test_wait(a, TIMEOUT_MS), 0);
  ASSERT_EQ(test_wait(b, TIMEOUT_MS), 0);
}

/* The next channel opened removes it. */
static void removed_by_open(void)
{
  char sock[NAME_MAX + 1];
  kill_listener("dead1", sock, sizeof(sock));
  pair("next");
  ASSERT_TRUE(!exists(sock));
}

/* So does the next domain joined. */
static void removed_by_join(void)
{
  char sock[NAME_MAX + 1];
  kill_listener("dead2", sock, sizeof(sock));
  gpuipc_domain_t *other;
  ASSERT_OK(gpuipc_domain_join("other", NULL, &other));
  ASSERT_TRUE(!exists(sock));
  ASSERT_OK(gpuipc_domain_leave(other));
}

/* A channel end waiting for its peer keeps its socket through prunes and
 * still pairs. */
static void live_kept(void)
{
  char sock[NAME_MAX + 1];
  ASSERT_TRUE(!find_chan_sock(NULL, sock, sizeof(sock))); /* pruned so far */
  const char *args[] = {"pair", "prune", "live", NULL};
  pid_t a = test_spawn("chan_peer", args, NULL);
  test_stamp("live_kept: end a (pid %d) started", (int)a);
  wait_chan_sock(NULL, sock, sizeof(sock));
  test_stamp("live_kept: %s seen; pruning", sock);
  ASSERT_EQ(gpuipc__rundir_prune(dir, GPUIPC__PRUNE_CHANNELS, NULL, NULL),
            0);
  ASSERT_TRUE(exists(sock));
#ifdef GPUIPC_CLI
  test_stamp("live_kept: pruned; gpuipc ls --prune");
  ASSERT_EQ(run_ls(dir, "--prune", out, sizeof(out)), 0);
  ASSERT_TRUE(exists(sock));
  ASSERT_TRUE(strstr(out, sock) == NULL);
#endif
  pid_t b = test_spawn("chan_peer", args, NULL);
  test_stamp("live_kept: end b (pid %d) started", (int)b);
  ASSERT_EQ(test_wait(a, TIMEOUT_MS), 0);
  ASSERT_EQ(test_wait(b, TIMEOUT_MS), 0);
  ASSERT_TRUE(!exists(sock)); /* paired: removed by its owner */
}

/*
 * A channel end knows its peer by pid: the pruner must not connect to a
 * live one (it could be taken for the peer when it is that process). This
 * one listens here, and nothing connects.
 */
static void live_not_touched(void)
{
  char p[PATH_MAX + 64];
  snprintf(p, sizeof(p), "%s/chan-0123456789abcdef.sock", dir);
  int lfd, fd;
  ASSERT_OK(gpuipc__sock_listen(p, 4, &lfd));
  ASSERT_EQ(gpuipc__rundir_prune(dir, GPUIPC__PRUNE_CHANNELS, NULL, NULL),
            0);
  ASSERT_EQ(access(p, F_OK), 0);
  ASSERT_RC(gpuipc__sock_accept(lfd, 0, &fd), -ETIMEDOUT);
  close(lfd);
  ASSERT_EQ(gpuipc__rundir_prune(dir, GPUIPC__PRUNE_CHANNELS, NULL, NULL),
            1);
  ASSERT_EQ(access(p, F_OK), -1);
}

#ifdef GPUIPC_CLI
/* `gpuipc ls` shows stale files; --prune removes them and nothing else. */
static void ls_prune(void)
{
  char sock[NAME_MAX + 1];
  kill_listener("dead3", sock, sizeof(sock));
  dead_domain(dir, "gone");
  ASSERT_EQ(run_ls(dir, "", out, sizeof(out)), 0);
  ASSERT_TRUE(strstr(out, sock) != NULL);
  ASSERT_TRUE(strstr(out, "gone.lock") != NULL);
  ASSERT_TRUE(strstr(out, "--prune removes them") != NULL);
  ASSERT_TRUE(strstr(out, "chan-") == strstr(out, sock)); /* not a domain */
  ASSERT_TRUE(exists(sock) && exists("gone.sock") && exists("gone.lock"));
  ASSERT_EQ(run_ls(dir, "--prune", out, sizeof(out)), 0);
  ASSERT_TRUE(strstr(out, "removed chan-") != NULL);
  ASSERT_TRUE(!exists(sock) && !exists("gone.sock") && !exists("gone.lock"));
  ASSERT_TRUE(exists("prune.sock") && exists("prune.lock")); /* live */
  ASSERT_EQ(run_ls(dir, "--json", out, sizeof(out)), 0);
  ASSERT_TRUE(strstr(out, "\"stale\": []") != NULL);

  /* Looking at a runtime directory that is not there makes none. */
  char none[PATH_MAX + 16];
  snprintf(none, sizeof(none), "%s/none", dir);
  char rd[PATH_MAX + 32];
  snprintf(rd, sizeof(rd), "%s/gpuipc", none);
  ASSERT_EQ(run_ls(rd, "", out, sizeof(out)), 0);
  ASSERT_TRUE(strstr(out, "does not exist") != NULL);
  ASSERT_EQ(access(none, F_OK), -1);
  ASSERT_EQ(run_ls(rd, "somedomain", out, sizeof(out)), 1);
  ASSERT_TRUE(strstr(out, "does not exist") != NULL);
  ASSERT_EQ(access(none, F_OK), -1);
}
#endif

int main(void)
{
  ASSERT_OK(gpuipc__runtime_dir(dir, sizeof(dir)));
  ASSERT_OK(gpuipc_domain_join("prune", NULL, &dom));
  removed_by_open();
  removed_by_join();
  live_kept();
  live_not_touched();
#ifdef GPUIPC_CLI
  ls_prune();
#else
  printf("note: the gpuipc tool is not built: gpuipc ls not checked\n");
#endif
  ASSERT_OK(gpuipc_domain_leave(dom));
  printf("rundir_prune: ok\n");
  return 0;
}
