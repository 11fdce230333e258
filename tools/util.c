/* Output helpers shared by the subcommands: byte counts and JSON. */
#include "cli.h"

#include <inttypes.h>
#include <math.h>

const char *cli_bytes(uint64_t n, char *buf, size_t cap)
{
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  size_t u = 0;
  uint64_t whole = n;
  while (whole >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
    whole /= 1024;
    u++;
  }
  if (u == 0 || n % ((uint64_t)1 << (10 * u)) == 0)
    snprintf(buf, cap, "%" PRIu64 " %s", whole, units[u]);
  else
    snprintf(buf, cap, "%.1f %s", (double)n / (double)((uint64_t)1 << (10 * u)),
             units[u]);
  return buf;
}

void cli_json_quote(FILE *f, const char *s)
{
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
    switch (*p) {
    case '"':
      fputs("\\\"", f);
      break;
    case '\\':
      fputs("\\\\", f);
      break;
    case '\b':
      fputs("\\b", f);
      break;
    case '\f':
      fputs("\\f", f);
      break;
    case '\n':
      fputs("\\n", f);
      break;
    case '\r':
      fputs("\\r", f);
      break;
    case '\t':
      fputs("\\t", f);
      break;
    default:
      if (*p < 0x20 || *p == 0x7f)
        fprintf(f, "\\u%04x", *p);
      else
        fputc(*p, f);
    }
  }
  fputc('"', f);
}

void cli_json_init(struct cli_json *j, FILE *f)
{
  j->f = f;
  j->depth = 0;
  j->first[0] = true;
  j->close[0] = '\0';
}

/* The comma, the line break and the indentation before a value, and its
 * key when inside an object. */
static void lead(struct cli_json *j, const char *key)
{
  if (!j->first[j->depth])
    fputc(',', j->f);
  j->first[j->depth] = false;
  if (j->depth > 0) {
    fputc('\n', j->f);
    for (int i = 0; i < j->depth; i++)
      fputs("  ", j->f);
  }
  if (key != NULL) {
    cli_json_quote(j->f, key);
    fputs(": ", j->f);
  }
}

static void open_container(struct cli_json *j, const char *key, char open,
                           char close)
{
  lead(j, key);
  fputc(open, j->f);
  if (j->depth + 1 < CLI_JSON_MAX_DEPTH)
    j->depth++;
  j->first[j->depth] = true;
  j->close[j->depth] = close;
}

void cli_json_obj(struct cli_json *j, const char *key)
{
  open_container(j, key, '{', '}');
}

void cli_json_arr(struct cli_json *j, const char *key)
{
  open_container(j, key, '[', ']');
}

void cli_json_end(struct cli_json *j)
{
  if (j->depth == 0)
    return;
  bool empty = j->first[j->depth];
  char close = j->close[j->depth];
  j->depth--;
  if (!empty) {
    fputc('\n', j->f);
    for (int i = 0; i < j->depth; i++)
      fputs("  ", j->f);
  }
  fputc(close, j->f);
}

void cli_json_str(struct cli_json *j, const char *key, const char *val)
{
  lead(j, key);
  if (val == NULL)
    fputs("null", j->f);
  else
    cli_json_quote(j->f, val);
}

void cli_json_int(struct cli_json *j, const char *key, long long val)
{
  lead(j, key);
  fprintf(j->f, "%lld", val);
}

void cli_json_uint(struct cli_json *j, const char *key, uint64_t val)
{
  lead(j, key);
  fprintf(j->f, "%" PRIu64, val);
}

void cli_json_double(struct cli_json *j, const char *key, double val)
{
  lead(j, key);
  if (isfinite(val))
    fprintf(j->f, "%.3f", val);
  else
    fputs("null", j->f);
}

void cli_json_bool(struct cli_json *j, const char *key, bool val)
{
  lead(j, key);
  fputs(val ? "true" : "false", j->f);
}

void cli_json_null(struct cli_json *j, const char *key)
{
  lead(j, key);
  fputs("null", j->f);
}

void cli_json_finish(struct cli_json *j)
{
  while (j->depth > 0)
    cli_json_end(j);
  fputc('\n', j->f);
}
