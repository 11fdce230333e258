/*
 * The gpuipc command-line tool: one file per subcommand (tools/cmd_NAME.c,
 * defining `const struct gpuipc_cmd gpuipc_cmd_NAME`) and one line for it
 * in GPUIPC_CLI_COMMANDS below. main.c dispatches, prints the usage and
 * answers `gpuipc help NAME` and `gpuipc NAME --help` from the table.
 */
#ifndef GPUIPC_CLI_H
#define GPUIPC_CLI_H

#include "gpuipc.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Exit statuses of every subcommand. */
#define CLI_EXIT_OK 0
#define CLI_EXIT_FAIL 1  /* the command ran and failed */
#define CLI_EXIT_USAGE 2 /* bad command line */

struct gpuipc_cmd {
  const char *name;
  const char *summary; /* one line for `gpuipc --help` */
  const char *usage;   /* the whole help: "usage: gpuipc NAME ...\n..." */
  /*
   * Run the command. argv[0] is the command's name, argv[1..argc-1] its
   * arguments (`--help` never reaches it). Returns an exit status:
   * CLI_EXIT_OK, CLI_EXIT_FAIL, or CLI_EXIT_USAGE after printing the
   * complaint and the usage (cli_usage_error) to stderr.
   */
  int (*run)(int argc, char **argv);
};

/* The subcommands, in the order `gpuipc --help` lists them. */
#define GPUIPC_CLI_COMMANDS(X) X(info) X(topo) X(ls) X(serve) X(bench)

#define GPUIPC__CLI_DECL(name) extern const struct gpuipc_cmd gpuipc_cmd_##name;
GPUIPC_CLI_COMMANDS(GPUIPC__CLI_DECL)
#undef GPUIPC__CLI_DECL

/*
 * Set by main when the command line asks --json of a command that has it:
 * its errors are then JSON too, so that whoever reads stdout always gets
 * one JSON object.
 */
extern bool cli_json_errors;

/* Print "gpuipc NAME: <complaint>" and @cmd's usage to stderr (and, under
 * cli_json_errors, {"schema": 1, "error": "<complaint>"} to stdout);
 * returns CLI_EXIT_USAGE. */
int cli_usage_error(const struct gpuipc_cmd *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* A command that ran and failed before it wrote anything to stdout: print
 * "gpuipc NAME: <sentence>" to stderr (and, under cli_json_errors,
 * {"schema": 1, "error": "<sentence>"} to stdout); returns CLI_EXIT_FAIL. */
int cli_fail(const struct gpuipc_cmd *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* "80.0 GiB", "2 MiB", "512 B": @n bytes for people, into @buf. */
const char *cli_bytes(uint64_t n, char *buf, size_t cap);

/*
 * The JSON writer of every command's --json: it keeps the commas and the
 * indentation: open containers with cli_json_obj/cli_json_arr and close
 * them with cli_json_end; every value call takes the member's key inside
 * an object and NULL inside an array (or for the top-level value). A NULL
 * string is written as null.
 * The top-level object's first member is "schema": CLI_JSON_SCHEMA, raised
 * when a member changes meaning or goes away (not when one is added).
 * Strings (keys too) are always valid UTF-8 JSON, whatever their bytes:
 * '"' and '\\' are escaped, control characters (below 0x20, and 0x7f) are
 * written as \u00XX, valid UTF-8 passes through, and each byte that is
 * not part of a valid UTF-8 sequence becomes \ufffd (U+FFFD).
 */
#define CLI_JSON_SCHEMA 1
#define CLI_JSON_MAX_DEPTH 16
struct cli_json {
  FILE *f;
  int depth;
  bool first[CLI_JSON_MAX_DEPTH]; /* nothing written yet at this depth */
  char close[CLI_JSON_MAX_DEPTH]; /* '}' or ']' */
};

void cli_json_init(struct cli_json *j, FILE *f);
void cli_json_obj(struct cli_json *j, const char *key);
void cli_json_arr(struct cli_json *j, const char *key);
void cli_json_end(struct cli_json *j); /* closes the innermost container */
void cli_json_str(struct cli_json *j, const char *key, const char *val);
void cli_json_int(struct cli_json *j, const char *key, long long val);
void cli_json_uint(struct cli_json *j, const char *key, uint64_t val);
/* Six significant digits (a small ratio is not rounded to 0); NaN and
 * infinities as null. */
void cli_json_double(struct cli_json *j, const char *key, double val);
void cli_json_bool(struct cli_json *j, const char *key, bool val);
void cli_json_null(struct cli_json *j, const char *key);
/* Ends the document with a newline. */
void cli_json_finish(struct cli_json *j);
/* @s as a JSON string literal, quotes included. */
void cli_json_quote(FILE *f, const char *s);

#endif
