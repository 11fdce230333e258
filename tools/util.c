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

/*
 * The length of the valid UTF-8 sequence at @p (1 to 4), or 0 when @p
 * starts none: a stray continuation byte, an overlong form, a surrogate,
 * a code point past U+10FFFF or a sequence cut short.
 */
static int utf8_len(const unsigned char *p)
{
  unsigned char lo = 0x80, hi = 0xbf;
  int n;
  if (p[0] < 0x80)
    return 1;
  if (p[0] >= 0xc2 && p[0] <= 0xdf)
    n = 2;
  else if (p[0] >= 0xe0 && p[0] <= 0xef)
    n = 3;
  else if (p[0] >= 0xf0 && p[0] <= 0xf4)
    n = 4;
  else
    return 0;
  if (p[0] == 0xe0)
    lo = 0xa0; /* overlong */
  else if (p[0] == 0xed)
    hi = 0x9f; /* surrogates */
  else if (p[0] == 0xf0)
    lo = 0x90; /* overlong */
  else if (p[0] == 0xf4)
    hi = 0x8f; /* past U+10FFFF */
  if (p[1] < lo || p[1] > hi)
    return 0;
  for (int i = 2; i < n; i++)
    if (p[i] < 0x80 || p[i] > 0xbf)
      return 0;
  return n;
}

void cli_json_quote(FILE *f, const char *s)
{
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p != '\0';) {
    int n = utf8_len(p);
    if (n == 0) {
      fputs("\\ufffd", f); /* one replacement per byte that fits nothing */
      p++;
      continue;
    }
    if (n > 1) {
      fwrite(p, 1, (size_t)n, f);
      p += n;
      continue;
    }
    switch (*p) {
    case '"':
      fputs("\\\"", f);
      break;
    case '\\':
      fputs("\\\\", f);
      break;
    default:
      if (*p < 0x20 || *p == 0x7f)
        fprintf(f, "\\u%04x", *p);
      else
        fputc(*p, f);
    }
    p++;
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
  bool top = j->depth == 0 && j->first[0];
  lead(j, key);
  fputc(open, j->f);
  if (j->depth + 1 < CLI_JSON_MAX_DEPTH)
    j->depth++;
  j->first[j->depth] = true;
  j->close[j->depth] = close;
  if (top && open == '{')
    cli_json_int(j, "schema", CLI_JSON_SCHEMA);
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
    fprintf(j->f, "%.6g", val);
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
