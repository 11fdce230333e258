/* Status codes and the thread-local error sentence. */
#include "core.h"

#include <stdio.h>
#include <string.h>

#define LAST_ERROR_MAX 512

static __thread char last_error[LAST_ERROR_MAX];

const char *gpuipc_strerror(int code)
{
  switch (code) {
  case 0:
    return "success";
#define GPUIPC__ERR_STR(name, c, msg)                                          \
  case c:                                                                      \
    return msg;
    GPUIPC_ERRNO_MAP(GPUIPC__ERR_STR)
#undef GPUIPC__ERR_STR
  }
  if (code < 0 && code > -4096) {
    const char *s = strerrordesc_np(-code);
    if (s != NULL)
      return s;
  }
  return "unknown error";
}

const char *gpuipc_err_name(int code)
{
  switch (code) {
  case 0:
    return "OK";
#define GPUIPC__ERR_NAME(name, c, msg)                                         \
  case c:                                                                      \
    return "GPUIPC_E_" #name;
    GPUIPC_ERRNO_MAP(GPUIPC__ERR_NAME)
#undef GPUIPC__ERR_NAME
  }
  if (code < 0 && code > -4096) {
    const char *s = strerrorname_np(-code);
    if (s != NULL)
      return s;
  }
  return "UNKNOWN";
}

const char *gpuipc_last_error(void)
{
  return last_error;
}

/* The kinds' values are their places in GPUIPC_KIND_MAP, so that
 * gpuipc__kind_valid's range holds every kind and nothing else. */
enum {
#define GPUIPC__KIND_PLACE(name, value, str, desc) KIND_PLACE_##name,
  GPUIPC_KIND_MAP(GPUIPC__KIND_PLACE)
#undef GPUIPC__KIND_PLACE
};
#define GPUIPC__KIND_IN_PLACE(name, value, str, desc)                          \
  _Static_assert((value) == KIND_PLACE_##name,                                 \
                 "GPUIPC_KIND_MAP's values run 0, 1, 2, ... in its order");
GPUIPC_KIND_MAP(GPUIPC__KIND_IN_PLACE)
#undef GPUIPC__KIND_IN_PLACE

/* Kind names live here, below every layer that prints them. */
const char *gpuipc_kind_name(gpuipc_kind_t kind)
{
  switch (kind) {
#define GPUIPC__KIND_NAME(name, value, str, desc)                              \
  case GPUIPC_KIND_##name:                                                     \
    return str;
    GPUIPC_KIND_MAP(GPUIPC__KIND_NAME)
#undef GPUIPC__KIND_NAME
  }
  return "?";
}

/* CMake's project(VERSION), the one in the library's file name and soname;
 * tests/version.c checks that gpuipc.h's macros say the same. */
const char *gpuipc_version(void)
{
#ifdef GPUIPC__VERSION_STRING
  return GPUIPC__VERSION_STRING;
#else
#define GPUIPC__STR2(x) #x
#define GPUIPC__STR(x) GPUIPC__STR2(x)
  return GPUIPC__STR(GPUIPC_VERSION_MAJOR) "." GPUIPC__STR(
      GPUIPC_VERSION_MINOR) "." GPUIPC__STR(GPUIPC_VERSION_PATCH);
#endif
}

GPUIPC__PRINTF(1, 0)
static void set_error(const char *fmt, va_list ap, const char *suffix)
{
  int n = vsnprintf(last_error, sizeof(last_error), fmt, ap);
  if (suffix != NULL && n >= 0 && (size_t)n < sizeof(last_error))
    snprintf(last_error + n, sizeof(last_error) - (size_t)n, ": %s", suffix);
  GPUIPC_LOG_D("%s", last_error);
}

int gpuipc__err(int code, const char *fmt, ...)
{
  int saved = errno;
  va_list ap;
  va_start(ap, fmt);
  set_error(fmt, ap, NULL);
  va_end(ap);
  errno = saved;
  return code;
}

int gpuipc__err_errno(int err, const char *fmt, ...)
{
  if (err < 0)
    err = -err;
  va_list ap;
  va_start(ap, fmt);
  set_error(fmt, ap, strerrordesc_np(err) ? strerrordesc_np(err) : "?");
  va_end(ap);
  errno = err;
  return -err;
}
