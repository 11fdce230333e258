/* gpuipc: the command-line tool. Dispatches to the subcommands in cli.h. */
#include "cli.h"

#include <stdarg.h>
#include <string.h>

static const struct gpuipc_cmd *const commands[] = {
#define GPUIPC__CLI_ROW(name) &gpuipc_cmd_##name,
    GPUIPC_CLI_COMMANDS(GPUIPC__CLI_ROW)
#undef GPUIPC__CLI_ROW
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *f)
{
  fprintf(f, "usage: gpuipc COMMAND [ARGS...]\n"
             "       gpuipc help COMMAND | --help | --version\n"
             "\n"
             "Share GPU and host memory between processes on one machine.\n"
             "\n"
             "commands:\n");
  for (size_t i = 0; i < NCOMMANDS; i++)
    fprintf(f, "  %-10s %s\n", commands[i]->name, commands[i]->summary);
  fprintf(f, "\nSettings come from GPUIPC_* environment variables: "
             "`gpuipc info --config` lists them.\n");
}

static const struct gpuipc_cmd *find(const char *name)
{
  for (size_t i = 0; i < NCOMMANDS; i++)
    if (strcmp(commands[i]->name, name) == 0)
      return commands[i];
  return NULL;
}

static int unknown(const char *name)
{
  fprintf(stderr, "gpuipc: unknown command '%s'\n\n", name);
  usage(stderr);
  return CLI_EXIT_USAGE;
}

static bool is_help(const char *arg)
{
  return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0;
}

bool cli_json_errors;

/* "gpuipc NAME: <sentence>" to stderr, and the JSON error object to
 * stdout under cli_json_errors. */
__attribute__((format(printf, 2, 0))) static void
complain(const struct gpuipc_cmd *cmd, const char *fmt, va_list ap)
{
  char msg[2048];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  fprintf(stderr, "gpuipc %s: %s\n", cmd->name, msg);
  if (cli_json_errors) {
    struct cli_json j;
    cli_json_init(&j, stdout);
    cli_json_obj(&j, NULL);
    cli_json_str(&j, "error", msg);
    cli_json_end(&j);
    cli_json_finish(&j);
  }
}

int cli_usage_error(const struct gpuipc_cmd *cmd, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  complain(cmd, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n%s", cmd->usage);
  return CLI_EXIT_USAGE;
}

int cli_fail(const struct gpuipc_cmd *cmd, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  complain(cmd, fmt, ap);
  va_end(ap);
  return CLI_EXIT_FAIL;
}

/* Whether @cmd takes --json and argv[2..] ask for it. */
static bool wants_json(const struct gpuipc_cmd *cmd, int argc, char **argv)
{
  if (strstr(cmd->usage, "--json") == NULL)
    return false;
  for (int i = 2; i < argc; i++)
    if (strcmp(argv[i], "--json") == 0)
      return true;
  return false;
}

int main(int argc, char **argv)
{
  if (argc < 2) {
    usage(stderr);
    return CLI_EXIT_USAGE;
  }
  const char *name = argv[1];
  if (is_help(name)) {
    usage(stdout);
    return CLI_EXIT_OK;
  }
  if (strcmp(name, "--version") == 0 || strcmp(name, "-V") == 0) {
    printf("gpuipc %s\n", gpuipc_version());
    return CLI_EXIT_OK;
  }
  if (strcmp(name, "help") == 0) {
    if (argc < 3) {
      usage(stdout);
      return CLI_EXIT_OK;
    }
    const struct gpuipc_cmd *cmd = find(argv[2]);
    if (cmd == NULL)
      return unknown(argv[2]);
    fputs(cmd->usage, stdout);
    return CLI_EXIT_OK;
  }
  const struct gpuipc_cmd *cmd = find(name);
  if (cmd == NULL)
    return unknown(name);
  for (int i = 2; i < argc; i++)
    if (is_help(argv[i])) {
      fputs(cmd->usage, stdout);
      return CLI_EXIT_OK;
    }
  cli_json_errors = wants_json(cmd, argc, argv);
  int rc = cmd->run(argc - 1, argv + 1);
  if (fflush(stdout) != 0 || ferror(stdout)) {
    perror("gpuipc: writing the output");
    return CLI_EXIT_FAIL;
  }
  return rc;
}
