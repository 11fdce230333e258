/*
 * gpuipc serve: a domain's broker as a standalone process. The one command
 * on the library's internals (src/domain's broker), by design: running a
 * broker outside a member is no call a program should make, so it has no
 * public function. Besides it only bench reaches inside, for the CUDA
 * driver its baselines call directly; info, topo and ls use the public API.
 */
#include "cli.h"

#include "core/core.h"
#include "domain/domain.h"
#include "os/os.h"

#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <unistd.h>

static const char usage[] =
    "usage: gpuipc serve [--quiet] NAME\n"
    "\n"
    "Run the broker of domain NAME in the foreground, for a domain that must\n"
    "outlive every worker: members that join NAME find this broker instead\n"
    "of hosting one. Refuses to start when a broker of NAME already runs.\n"
    "SIGINT or SIGTERM stops it cleanly: the registry, its descriptors and\n"
    "the domain's socket go to a member that can host them, so no segment\n"
    "is lost; with no member left the domain ends.\n"
    "\n"
    "  --quiet  log only warnings and errors (default: also what the broker\n"
    "           does: members joining and leaving, hand-overs)\n";

static void log_stderr(gpuipc_log_level_t level, const char *msg, void *user)
{
  (void)level;
  (void)user;
  fprintf(stderr, "%s\n", msg);
}

/* One descriptor per published segment: allow as many as we may. */
static void raise_fd_limit(void)
{
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &rl);
  }
}

static int run(int argc, char **argv)
{
  const char *name = NULL;
  bool quiet = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quiet") == 0)
      quiet = true;
    else if (argv[i][0] == '-')
      return cli_usage_error(&gpuipc_cmd_serve, "unknown option %s", argv[i]);
    else if (name == NULL)
      name = argv[i];
    else
      return cli_usage_error(&gpuipc_cmd_serve, "one domain at a time");
  }
  if (name == NULL)
    return cli_usage_error(&gpuipc_cmd_serve, "which domain?");
  if (gpuipc__name_check(name, "domain name") != 0)
    return cli_usage_error(&gpuipc_cmd_serve, "%s", gpuipc_last_error());
  gpuipc_log_set(log_stderr, quiet ? GPUIPC_LOG_WARN : GPUIPC_LOG_INFO, NULL);
  /* Who may join, and how many: a value that does not parse is refused,
   * not ignored. */
  if (gpuipc__cfg_check(GPUIPC_CFG_ALLOW_UIDS) != 0 ||
      gpuipc__cfg_check(GPUIPC_CFG_ALLOW_GIDS) != 0 ||
      gpuipc__cfg_check(GPUIPC_CFG_MAX_MEMBERS) != 0 ||
      gpuipc__cfg_check(GPUIPC_CFG_MAX_MEMBERS_PER_UID) != 0) {
    fprintf(stderr, "gpuipc serve: %s\n", gpuipc_last_error());
    return CLI_EXIT_FAIL;
  }

  /* Signals arrive as a readable descriptor; the handlers do nothing. */
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  if (sigprocmask(SIG_BLOCK, &stop, NULL) != 0) {
    perror("gpuipc serve: sigprocmask");
    return CLI_EXIT_FAIL;
  }
  int sfd = signalfd(-1, &stop, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) {
    perror("gpuipc serve: signalfd");
    return CLI_EXIT_FAIL;
  }
  raise_fd_limit();

  struct gpuipc__dom_paths paths;
  gpuipc__dom_paths(name, &paths);
  struct gpuipc__broker_init init;
  memset(&init, 0, sizeof(init));
  snprintf(init.name, sizeof(init.name), "%s", name);
  bool stale = false;
  int rc = gpuipc__broker_claim(name, &init.lock_fd, &init.listen_fd, &stale);
  if (rc != 0) {
    if (rc == -EWOULDBLOCK)
      fprintf(stderr, "gpuipc serve: a broker of domain %s already runs (%s "
              "is locked)\n", name, paths.lock);
    else
      fprintf(stderr, "gpuipc serve: %s: %s\n", name, gpuipc_last_error());
    close(sfd);
    return CLI_EXIT_FAIL;
  }
  /* A socket left behind: members of a broker that died re-publish. */
  init.recovery = stale ? GPUIPC__RECOVER_CRASH : GPUIPC__RECOVER_NONE;
  printf("gpuipc serve: domain %s, broker pid %d, socket %s\n", name,
         (int)getpid(), paths.sock);
  fflush(stdout);
  rc = gpuipc__broker_run(&init, sfd);
  struct signalfd_siginfo si;
  int sig = read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)
                ? (int)si.ssi_signo : 0;
  close(sfd);
  if (rc != 0) {
    fprintf(stderr, "gpuipc serve: %s: %s\n", name, gpuipc_last_error());
    return CLI_EXIT_FAIL;
  }
  printf("gpuipc serve: domain %s: stopped%s%s\n", name,
         sig ? " on " : "", sig ? strsignal(sig) : "");
  return CLI_EXIT_OK;
}

const struct gpuipc_cmd gpuipc_cmd_serve = {
    .name = "serve",
    .summary = "run a domain's broker in the foreground",
    .usage = usage,
    .run = run,
};
