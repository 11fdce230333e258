/*
 * Settings: one table, read from the environment once.
 *
 * A setting with a syntax (below) whose value does not parse is never used:
 * its default is in force instead, the value is kept as rejected with a
 * sentence (gpuipc__cfg_check, `gpuipc info --config`), and a warning is
 * logged once. A GPUIPC_* variable that names no setting (a typo) is
 * warned about too.
 */
#include "core.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

struct setting {
  const char *name;
  const char *def;
  const char *help;
  const char *value;    /* in force: the environment copy or def */
  int is_set;
  char *rejected;       /* the environment's value when it did not parse */
  char why[96];         /* what is wrong with it */
};

static struct setting settings[GPUIPC_CFG__COUNT] = {
#define GPUIPC__CFG_ROW(id, n, d, h) [GPUIPC_CFG_##id] = {n, d, h, NULL, 0, NULL, ""},
    GPUIPC_CONFIG_MAP(GPUIPC__CFG_ROW)
#undef GPUIPC__CFG_ROW
};

/*
 * The syntax of each setting; unlisted ones are free text checked where
 * they are used (GPUIPC_DIR by the runtime directory, the MPI ones by the
 * MPI component). An empty value means the default for all of them.
 */
enum syntax { SYN_TEXT, SYN_UINT, SYN_BOOL, SYN_LOG, SYN_IDS };
static const enum syntax syntax[GPUIPC_CFG__COUNT] = {
    [GPUIPC_CFG_LOG] = SYN_LOG,
    [GPUIPC_CFG_NO_CUDA] = SYN_BOOL,
    [GPUIPC_CFG_ALLOW_UIDS] = SYN_IDS,
    [GPUIPC_CFG_ALLOW_GIDS] = SYN_IDS,
    [GPUIPC_CFG_TIMEOUT_MS] = SYN_UINT,
    [GPUIPC_CFG_MAX_MEMBERS] = SYN_UINT,
    [GPUIPC_CFG_MAX_MEMBERS_PER_UID] = SYN_UINT,
    [GPUIPC_CFG_CHAN_EVENT_POLL_US] = SYN_UINT,
    [GPUIPC_CFG_CHAN_READY_WORDS] = SYN_BOOL,
    [GPUIPC_CFG_CHAN_COPY_KERNEL_KB] = SYN_UINT,
    [GPUIPC_CFG_CHAN_SPIN_US] = SYN_UINT,
};

#define UNKNOWN_MAX 16
static char *unknown[UNKNOWN_MAX]; /* GPUIPC_* names that are no setting */
static int nunknown;

static pthread_once_t settings_once = PTHREAD_ONCE_INIT;
static atomic_bool warned;

/* Whether @s is decimal digits (at least one) worth at most @max. */
static bool is_uint(const char *s, size_t len, unsigned long long max)
{
  unsigned long long v = 0;
  if (len == 0)
    return false;
  for (size_t i = 0; i < len; i++) {
    if (s[i] < '0' || s[i] > '9')
      return false;
    v = v * 10 + (unsigned)(s[i] - '0');
    if (v > max)
      return false;
  }
  return true;
}

/* "1000, 1001": decimal ids separated by commas, spaces allowed. */
static bool is_id_list(const char *s)
{
  for (;;) {
    s += strspn(s, " ");
    size_t len = strcspn(s, ", ");
    if (!is_uint(s, len, UINT32_MAX))
      return false;
    s += len;
    s += strspn(s, " ");
    if (*s == '\0')
      return true;
    if (*s++ != ',')
      return false;
  }
}

/* NULL when @v (not empty) fits @syn, else what is wrong with it. */
static const char *misfit(enum syntax syn, const char *v)
{
  switch (syn) {
  case SYN_UINT:
    return is_uint(v, strlen(v), INT_MAX) ? NULL
           : "is not a whole number of at most 2147483647";
  case SYN_BOOL:
    return strcmp(v, "0") == 0 || strcmp(v, "1") == 0 ? NULL
           : "is neither 0 nor 1";
  case SYN_LOG:
    return gpuipc__log_level_parse(v) >= 0 ? NULL
           : "is no log level (off, error, warn, info, debug, trace, 0-5)";
  case SYN_IDS:
    return is_id_list(v) ? NULL : "is not a comma-separated list of ids";
  case SYN_TEXT:
    break;
  }
  return NULL;
}

static void setting_read(struct setting *s, enum syntax syn)
{
  const char *v = getenv(s->name);
  /* Copied: a later setenv() by the program must not change our view. */
  char *copy = v != NULL ? strdup(v) : NULL;
  s->is_set = copy != NULL;
  s->value = s->def;
  if (copy == NULL)
    return;
  const char *why = copy[0] != '\0' ? misfit(syn, copy) : NULL;
  if (why == NULL && (copy[0] != '\0' || syn == SYN_TEXT)) {
    s->value = copy;
    return;
  }
  if (why != NULL) {
    s->rejected = copy;
    snprintf(s->why, sizeof(s->why), "%s", why);
    /* A misspelt level still shows problems (this one first). */
    if (syn == SYN_LOG)
      s->value = "warn";
  } else {
    free(copy);
  }
}

static bool is_setting(const char *name, size_t len)
{
  for (size_t i = 0; i < GPUIPC__ARRAY_SIZE(settings); i++)
    if (strlen(settings[i].name) == len &&
        memcmp(settings[i].name, name, len) == 0)
      return true;
  return false;
}

static void settings_read(void)
{
  for (size_t i = 0; i < GPUIPC__ARRAY_SIZE(settings); i++)
    setting_read(&settings[i], syntax[i]);
  for (char **e = environ; e != NULL && *e != NULL; e++) {
    size_t len = strcspn(*e, "=");
    if (strncmp(*e, "GPUIPC_", 7) != 0 || is_setting(*e, len) ||
        nunknown == UNKNOWN_MAX)
      continue;
    char *name = strndup(*e, len);
    if (name != NULL)
      unknown[nunknown++] = name;
  }
}

/* The log warnings, once, after the table is read (logging reads it). */
static void settings_warn(void)
{
  for (size_t i = 0; i < GPUIPC__ARRAY_SIZE(settings); i++)
    if (settings[i].rejected != NULL)
      GPUIPC_LOG_W("setting %s=\"%s\" %s: ignored, \"%s\" is in force",
                   settings[i].name, settings[i].rejected, settings[i].why,
                   settings[i].value);
  for (int i = 0; i < nunknown; i++)
    GPUIPC_LOG_W("environment variable %s is no gpuipc setting (misspelt?): "
                 "ignored; `gpuipc info --config` lists them", unknown[i]);
}

static void settings_get(void)
{
  pthread_once(&settings_once, settings_read);
  if (!atomic_load_explicit(&warned, memory_order_relaxed) &&
      !atomic_exchange(&warned, true))
    settings_warn();
}

const char *gpuipc__cfg_str(gpuipc__cfg_t id)
{
  settings_get();
  return settings[id].value;
}

long gpuipc__cfg_long(gpuipc__cfg_t id, long fallback)
{
  const char *s = gpuipc__cfg_str(id);
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < 0)
    return fallback;
  return v;
}

int gpuipc__cfg_check(gpuipc__cfg_t id)
{
  settings_get();
  const struct setting *s = &settings[id];
  if (s->rejected == NULL)
    return 0;
  return gpuipc__err(-EINVAL, "setting %s=\"%s\" %s (unset it for the "
                     "default \"%s\")", s->name, s->rejected, s->why, s->def);
}

const char *gpuipc__cfg_rejected(gpuipc__cfg_t id, const char **why)
{
  settings_get();
  if (why != NULL)
    *why = settings[id].why;
  return settings[id].rejected;
}

const char *gpuipc__cfg_unknown(int i)
{
  settings_get();
  return i >= 0 && i < nunknown ? unknown[i] : NULL;
}

int gpuipc_config_count(void)
{
  return GPUIPC_CFG__COUNT;
}

int gpuipc_config_get(int index, gpuipc_config_item_t *out)
{
  if (out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_config_get: out is NULL");
  if (index < 0 || index >= GPUIPC_CFG__COUNT)
    return gpuipc__err(-ERANGE, "gpuipc_config_get: index %d not in [0, %d)",
                       index, GPUIPC_CFG__COUNT);
  settings_get();
  const struct setting *s = &settings[index];
  out->name = s->name;
  out->value = s->value;
  out->def = s->def;
  out->help = s->help;
  out->is_set = s->is_set;
  return 0;
}

int gpuipc_config_rejected(int index, const char **value, const char **why)
{
  if (index < 0 || index >= GPUIPC_CFG__COUNT)
    return gpuipc__err(-ERANGE, "gpuipc_config_rejected: index %d not in "
                       "[0, %d)", index, GPUIPC_CFG__COUNT);
  const char *w;
  const char *bad = gpuipc__cfg_rejected((gpuipc__cfg_t)index, &w);
  if (bad == NULL)
    return 0;
  if (value != NULL)
    *value = bad;
  if (why != NULL)
    *why = w;
  return 1;
}

int gpuipc_config_unknown(int index, const char **name)
{
  if (name == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_config_unknown: name is NULL");
  const char *n = gpuipc__cfg_unknown(index);
  if (n == NULL)
    return gpuipc__err(-ERANGE, "gpuipc_config_unknown: no unknown "
                       "setting %d", index);
  *name = n;
  return 0;
}
