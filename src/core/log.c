/* Levelled logging to a user callback, or to stderr when GPUIPC_LOG asks. */
#include "core.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static gpuipc_log_fn log_fn;
static void *log_user;
/* -1: not read from the environment yet. */
static atomic_int log_level = -1;

static const char *const level_names[] = {"off",  "error", "warn",
                                          "info", "debug", "trace"};

int gpuipc__log_level_parse(const char *s)
{
  if (s == NULL || *s == '\0')
    return GPUIPC_LOG_OFF;
  if (s[0] >= '0' && s[0] <= '5' && s[1] == '\0')
    return s[0] - '0';
  for (size_t i = 0; i < GPUIPC__ARRAY_SIZE(level_names); i++)
    if (strcasecmp(s, level_names[i]) == 0)
      return (int)i;
  return -1;
}

static int current_level(void)
{
  int lvl = atomic_load_explicit(&log_level, memory_order_relaxed);
  if (GPUIPC__LIKELY(lvl >= 0))
    return lvl;
  lvl = gpuipc__log_level_parse(gpuipc__cfg_str(GPUIPC_CFG_LOG));
  if (lvl < 0)
    lvl = GPUIPC_LOG_WARN; /* a misspelt level still shows problems */
  int expected = -1;
  atomic_compare_exchange_strong(&log_level, &expected, lvl);
  return atomic_load(&log_level);
}

bool gpuipc__log_enabled(gpuipc_log_level_t level)
{
  return level != GPUIPC_LOG_OFF && (int)level <= current_level();
}

int gpuipc_log_set(gpuipc_log_fn fn, gpuipc_log_level_t level, void *user)
{
  if ((int)level < GPUIPC_LOG_OFF || level > GPUIPC_LOG_TRACE)
    return gpuipc__err(-EINVAL, "gpuipc_log_set: level %d out of range",
                       (int)level);
  pthread_mutex_lock(&log_lock);
  log_fn = fn;
  log_user = user;
  pthread_mutex_unlock(&log_lock);
  if (fn != NULL) {
    atomic_store(&log_level, (int)level);
  } else {
    int lvl = gpuipc__log_level_parse(gpuipc__cfg_str(GPUIPC_CFG_LOG));
    atomic_store(&log_level, lvl < 0 ? GPUIPC_LOG_WARN : lvl);
  }
  return 0;
}

void gpuipc__log(gpuipc_log_level_t level, const char *file, int line,
                 const char *fmt, ...)
{
  char msg[1024];
  const char *base = strrchr(file, '/');
  base = base ? base + 1 : file;
  int n = snprintf(msg, sizeof(msg), "gpuipc[%d] %s %s:%d: ", (int)getpid(),
                   level_names[level], base, line);
  if (n < 0 || (size_t)n >= sizeof(msg))
    n = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
  va_end(ap);

  pthread_mutex_lock(&log_lock);
  gpuipc_log_fn fn = log_fn;
  void *user = log_user;
  pthread_mutex_unlock(&log_lock);
  if (fn != NULL) {
    fn(level, msg, user);
    return;
  }
  /* The default sink: stderr, only because GPUIPC_LOG asked for it. */
  fprintf(stderr, "%s\n", msg);
}
