/*
 * `gpuipc serve NAME` and `gpuipc ls`: a standalone broker serves members,
 * refuses to start twice, and on SIGTERM hands the domain to a member
 * (nothing lost) or, with no member left, ends it (socket removed). `ls`
 * lists the domains (live or stale) and a domain's segments, in text and
 * JSON.
 */
#include "test.h"
#include "helpers/seg_peer.h"

#include "domain/domain.h"
#include "os/os.h"

#include <sys/socket.h>

static char cli[512];

/* Start the CLI with @args; its stdout and stderr come back through *out. */
static pid_t cli_start(const char *const *args, int *out)
{
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0)
    TFAIL("pipe2: %s", strerror(errno));
  const char *argv[16] = {"gpuipc"};
  int n = 1;
  for (; args[n - 1] != NULL && n < 15; n++)
    argv[n] = args[n - 1];
  argv[n] = NULL;
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0)
    TFAIL("fork: %s", strerror(errno));
  if (pid == 0) {
    dup2(p[1], 1);
    dup2(p[1], 2);
    execv(cli, (char *const *)argv);
    _exit(127);
  }
  close(p[1]);
  *out = p[0];
  return pid;
}

/* Read everything until EOF. */
static void read_all(int fd, char *buf, size_t cap)
{
  size_t len = 0;
  for (;;) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, 30000) <= 0)
      TFAIL("the command did not finish its output");
    ssize_t n = read(fd, buf + len, cap - 1 - len);
    if (n <= 0)
      break;
    len += (size_t)n;
  }
  buf[len] = '\0';
  close(fd);
}

/* Run the CLI to completion; returns its exit status, output in @buf. */
static int cli_run(const char *const *args, char *buf, size_t cap)
{
  int fd;
  pid_t pid = cli_start(args, &fd);
  read_all(fd, buf, cap);
  return test_wait(pid, 30000);
}

/* The first line a serve prints: its pid. */
static pid_t serve_start(const char *name, int *out)
{
  const char *args[] = {"serve", name, NULL};
  pid_t pid = cli_start(args, out);
  char line[512];
  size_t len = 0;
  while (len < sizeof(line) - 1) {
    struct pollfd pf = {.fd = *out, .events = POLLIN};
    if (poll(&pf, 1, 30000) <= 0)
      TFAIL("gpuipc serve said nothing");
    if (read(*out, line + len, 1) != 1)
      TFAIL("gpuipc serve exited early");
    if (line[len++] == '\n')
      break;
  }
  line[len] = '\0';
  int said;
  const char *p = strstr(line, "broker pid ");
  if (p == NULL || sscanf(p, "broker pid %d", &said) != 1)
    TFAIL("unexpected first line: %s", line);
  ASSERT_EQ(said, pid);
  return pid;
}

int main(void)
{
  snprintf(cli, sizeof(cli), "%s/../tools/gpuipc", GPUIPC_TEST_BINDIR);
  if (access(cli, X_OK) != 0)
    SKIP("the gpuipc tool is not built (%s)", cli);
  char out[16384];

  int serve_out;
  pid_t serve = serve_start("srv", &serve_out);

  /* A second broker for the same domain refuses to start. */
  const char *again[] = {"serve", "srv", NULL};
  ASSERT_EQ(cli_run(again, out, sizeof(out)), 1);
  if (strstr(out, "already runs") == NULL)
    TFAIL("second serve said: %s", out);
  const char *bad[] = {"serve", "no/slash", NULL};
  ASSERT_EQ(cli_run(bad, out, sizeof(out)), 2);

  /* Members find it instead of hosting a broker. */
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("srv", NULL, &dom));
  gpuipc_domain_info_t di = {.size = sizeof(di)};
  ASSERT_OK(gpuipc_domain_info(dom, &di));
  ASSERT_EQ(di.broker_pid, serve);
  ASSERT_EQ(di.hosts_broker, 0);

  /* A member limit that does not parse is refused before anything starts
   * (this process read its settings at the join above). */
  setenv("GPUIPC_MAX_MEMBERS", "lots", 1);
  const char *lots[] = {"serve", "lots", NULL};
  ASSERT_EQ(cli_run(lots, out, sizeof(out)), 1);
  unsetenv("GPUIPC_MAX_MEMBERS");
  if (strstr(out, "GPUIPC_MAX_MEMBERS=\"lots\"") == NULL)
    TFAIL("serve with GPUIPC_MAX_MEMBERS=lots said: %s", out);

  gpuipc_buf_t *a;
  ASSERT_OK(test_seg_open(dom, "alpha", 3 << 20, -1, GPUIPC_CREATE, &a));
  test_fill(gpuipc_buf_ptr(a), 3 << 20, 8);
  struct peer p;
  peer_start(&p);
  PEER_OK(&p, "join srv");
  PEER_OK(&p, "open alpha 0 -");
  PEER_OK(&p, "open alpha 0 -");
  PEER_OK(&p, "open beta 100 c");
  PEER_OK(&p, "release beta");

  /* ls: the domains, then this one. */
  const char *ls_all[] = {"ls", NULL};
  ASSERT_EQ(cli_run(ls_all, out, sizeof(out)), 0);
  if (strstr(out, "srv") == NULL || strstr(out, "live") == NULL)
    TFAIL("ls: %s", out);
  const char *ls[] = {"ls", "srv", NULL};
  ASSERT_EQ(cli_run(ls, out, sizeof(out)), 0);
  char want[128];
  snprintf(want, sizeof(want), "%d:1", (int)getpid());
  if (strstr(out, "alpha") == NULL || strstr(out, "3 MiB") == NULL ||
      strstr(out, "published") == NULL || strstr(out, want) == NULL ||
      strstr(out, "2 members") == NULL)
    TFAIL("ls srv: %s", out);
  snprintf(want, sizeof(want), "%d:2", (int)p.pid);
  if (strstr(out, want) == NULL)
    TFAIL("ls srv does not show the peer's two opens: %s", out);
  const char *lsj[] = {"ls", "--json", "srv", NULL};
  ASSERT_EQ(cli_run(lsj, out, sizeof(out)), 0);
  snprintf(want, sizeof(want), "\"broker_pid\": %d", (int)serve);
  if (strstr(out, want) == NULL || strstr(out, "\"name\": \"alpha\"") == NULL ||
      strstr(out, "\"size\": 3145728") == NULL ||
      strstr(out, "\"kind\": \"host\"") == NULL ||
      strstr(out, "\"device\": null") == NULL ||
      strstr(out, "\"name\": \"beta\"") == NULL ||
      strstr(out, "\"nholders\": 0") == NULL)
    TFAIL("ls --json srv: %s", out);
  const char *ls_none[] = {"ls", "nosuch", NULL};
  ASSERT_EQ(cli_run(ls_none, out, sizeof(out)), 1);
  if (strstr(out, "no broker") == NULL)
    TFAIL("ls nosuch: %s", out);

  /* SIGTERM: the domain moves to a member; nothing is lost. */
  kill(serve, SIGTERM);
  read_all(serve_out, out, sizeof(out));
  ASSERT_EQ(test_wait(serve, 30000), 0);
  if (strstr(out, "stopped on") == NULL)
    TFAIL("serve said: %s", out);
  ASSERT_OK(gpuipc_domain_info(dom, &di));
  ASSERT_TRUE(di.broker_pid == getpid() || di.broker_pid == p.pid);
  PEER_OK(&p, "open beta 100 -"); /* held by nobody: kept all the same */
  PEER_OK(&p, "check alpha 8");
  gpuipc_buf_t *a2;
  ASSERT_OK(test_seg_open(dom, "alpha", 0, -1, 0, &a2));
  ASSERT_PTR_EQ(a2, a);
  gpuipc_buf_release(a2);
  gpuipc_buf_release(a);
  PEER_OK(&p, "leave");
  peer_finish(&p);
  ASSERT_OK(gpuipc_domain_leave(dom));

  /* A broker with nobody to hand over to ends the domain on SIGINT. */
  serve = serve_start("srv2", &serve_out);
  kill(serve, SIGINT);
  read_all(serve_out, out, sizeof(out));
  ASSERT_EQ(test_wait(serve, 30000), 0);
  struct gpuipc__dom_paths paths;
  ASSERT_OK(gpuipc__dom_paths("srv2", &paths));
  ASSERT_EQ(access(paths.sock, F_OK), -1);

  /* A socket nobody listens on is listed as stale. */
  ASSERT_OK(gpuipc__dom_paths("dead", &paths));
  int s; /* any runtime directory, however deep */
  ASSERT_OK(gpuipc__sock_listen(paths.sock, 1, &s));
  close(s); /* the file stays, nobody listens */
  const char *lsj_all[] = {"ls", "--json", NULL};
  ASSERT_EQ(cli_run(lsj_all, out, sizeof(out)), 0);
  if (strstr(out, "\"name\": \"dead\",\n      \"state\": \"stale\"") == NULL)
    TFAIL("ls --json: %s", out);
  unlink(paths.sock);
  printf("domain_serve: ok\n");
  return 0;
}
