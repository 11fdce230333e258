/* Settings: one table, read from the environment once. */
#include "core.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct setting {
  const char *name;
  const char *def;
  const char *help;
  const char *value; /* points into the environment copy or at def */
  int is_set;
};

static struct setting settings[GPUIPC_CFG__COUNT] = {
#define GPUIPC__CFG_ROW(id, n, d, h) [GPUIPC_CFG_##id] = {n, d, h, NULL, 0},
    GPUIPC_CONFIG_MAP(GPUIPC__CFG_ROW)
#undef GPUIPC__CFG_ROW
};

static pthread_once_t settings_once = PTHREAD_ONCE_INIT;

static void settings_read(void)
{
  for (size_t i = 0; i < GPUIPC__ARRAY_SIZE(settings); i++) {
    const char *v = getenv(settings[i].name);
    /* Copied: a later setenv() by the program must not change our view. */
    char *copy = v != NULL ? strdup(v) : NULL;
    settings[i].is_set = copy != NULL;
    settings[i].value = copy != NULL ? copy : settings[i].def;
  }
}

const char *gpuipc__cfg_str(gpuipc__cfg_t id)
{
  pthread_once(&settings_once, settings_read);
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
  pthread_once(&settings_once, settings_read);
  const struct setting *s = &settings[index];
  out->name = s->name;
  out->value = s->value;
  out->def = s->def;
  out->help = s->help;
  out->is_set = s->is_set;
  return 0;
}
