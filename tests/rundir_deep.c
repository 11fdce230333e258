/*
 * A runtime directory deeper than a Unix socket address (107 bytes): a
 * domain's broker and members, and a channel between two processes, work
 * there all the same; and a child made by fork() still drops the domain's
 * sockets, whose addresses are then "/proc/self/fd/N/NAME.sock".
 */
#include "helpers/chan_common.h"

#include <dirent.h>
#include <limits.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define TIMEOUT_MS 60000

/* Whether unix socket address @a names a file in the runtime directory
 * (@dir), directly or through a directory descriptor. */
static bool ours(const struct sockaddr_un *a, socklen_t len, const char *dir)
{
  if (len <= offsetof(struct sockaddr_un, sun_path) || a->sun_family != AF_UNIX)
    return false;
  return strncmp(a->sun_path, dir, strlen(dir)) == 0 ||
         strncmp(a->sun_path, "/proc/self/fd/", 14) == 0;
}

/*
 * How many of this process's descriptors are sockets of the domain: bound
 * to, or connected to, a path in @dir. (Not every socket: a CUDA driver
 * may hold sockets of its own.)
 */
static int count_sockets(const char *dir)
{
  DIR *d = opendir("/proc/self/fd");
  if (d == NULL)
    return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    struct stat st;
    int fd = atoi(e->d_name);
    if (e->d_name[0] == '.' || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode))
      continue;
    struct sockaddr_un a;
    socklen_t len = sizeof(a);
    memset(&a, 0, sizeof(a));
    if (getsockname(fd, (struct sockaddr *)&a, &len) == 0 &&
        ours(&a, len, dir)) {
      n++;
      continue;
    }
    len = sizeof(a);
    memset(&a, 0, sizeof(a));
    if (getpeername(fd, (struct sockaddr *)&a, &len) == 0 &&
        ours(&a, len, dir))
      n++;
  }
  closedir(d);
  return n;
}

/* A forked child holds none of the domain's sockets. */
static void fork_drops_sockets(const char *dir)
{
  ASSERT_GT(count_sockets(dir), 0); /* the broker's listener, our connection */
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0)
    _exit(count_sockets(dir) == 0 ? 0 : 1);
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st));
  ASSERT_EQ(WEXITSTATUS(st), 0);
}

int main(void)
{
  const char *env = getenv("GPUIPC_DIR");
  char deep[PATH_MAX];
  int n = snprintf(deep, sizeof(deep), "%s",
                   env != NULL && env[0] == '/' ? env : "/tmp/gpuipc-deep");
  while (n < 160)
    n += snprintf(deep + n, sizeof(deep) - (size_t)n,
                  "/a-directory-name-of-some-length");
  /* Before the first gpuipc call, which reads the settings. */
  ASSERT_EQ(setenv("GPUIPC_DIR", deep, 1), 0);
  printf("GPUIPC_DIR is %d bytes long\n", n);

  char dir[PATH_MAX];
  ASSERT_OK(gpuipc_runtime_dir(dir, sizeof(dir), 0));
  ASSERT_STREQ(dir, deep);

  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("deep", NULL, &dom));
  gpuipc_domain_info_t di = {.size = sizeof(di)};
  ASSERT_OK(gpuipc_domain_info(dom, &di));
  ASSERT_EQ(di.broker_pid, getpid());

  /* Two processes meet on a channel, through the broker here. */
  const char *args[] = {"pair", "deep", "c", NULL};
  pid_t a = test_spawn("chan_peer", args, NULL);
  pid_t b = test_spawn("chan_peer", args, NULL);
  ASSERT_EQ(test_wait(a, TIMEOUT_MS), 0);
  ASSERT_EQ(test_wait(b, TIMEOUT_MS), 0);

  /* And one of them with this process. */
  pid_t c = test_spawn("chan_peer", args, NULL);
  gpuipc_channel_t *ch;
  gpuipc_channel_opts_t o = GPUIPC_CHANNEL_OPTS_INIT;
  o.timeout_ms = TIMEOUT_MS;
  ASSERT_OK(gpuipc_channel_open(dom, "c", &o, &ch));
  gpuipc_channel_info_t ci = {.size = sizeof(ci)};
  ASSERT_OK(gpuipc_channel_info(ch, &ci));
  ASSERT_EQ(ci.peer_pid, c);

  fork_drops_sockets(deep);
  ASSERT_OK(kill(c, SIGKILL)); /* its side of the pair is not played */
  ASSERT_EQ(test_wait(c, TIMEOUT_MS), 128 + SIGKILL);
  ASSERT_OK(gpuipc_channel_close(ch));
  ASSERT_OK(gpuipc_domain_leave(dom));
  printf("rundir_deep: ok\n");
  return 0;
}
