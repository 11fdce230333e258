/*
 * The CUDA driver, loaded at run time.
 *
 * libcuda.so.1 (or GPUIPC_CUDA_LIB) is dlopen()ed once, under pthread_once.
 * Only cuGetProcAddress comes from dlsym; every other entry point is asked
 * of it by base name at the CUDA version GPUIPC_CU_FUNCS gives (12.0 for
 * all of them today), never at the driver's own version: a newer driver
 * could hand back a newer variant (cuCtxSynchronize_v2 and
 * cuCtxGetDevice_v2 take a context) whose prototype is not the one cuda.h
 * gives the name. The outcome, good or bad, is kept for the life of the
 * process: every later call returns the same code and sets the same
 * sentence. The library stays open: dlclose() is never called.
 */
#include "cuda/cuda.h"
#include "os/os.h"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#define LOAD_MSG_MAX 512

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static _Atomic bool load_ran; /* load_once_fn has run */
static int load_code;
static char load_msg[LOAD_MSG_MAX];
static int drv_version;
static char lib_path[PATH_MAX];

void gpuipc__why(char *why, size_t cap, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, cap, fmt, ap);
  va_end(ap);
}

#if GPUIPC_HAVE_CUDA

struct gpuipc__cu_table gpuipc__cu;

/* cuGetProcAddress as CUDA 12.0 and later export it, and as 11.3 did. */
typedef CUresult (*gpa_v2_fn)(const char *symbol, void **pfn, int version,
                              cuuint64_t flags,
                              CUdriverProcAddressQueryResult *status);
typedef CUresult (*gpa_v1_fn)(const char *symbol, void **pfn, int version,
                              cuuint64_t flags);

struct gpa {
  gpa_v2_fn v2;
  gpa_v1_fn v1; /* used only when the library has no v2 */
};

/* One row per entry point, from GPUIPC_CU_FUNCS. */
struct cu_entry {
  const char *name; /* the base name, as cuGetProcAddress takes it */
  int required;
  int abi;
  size_t offset; /* of its field in gpuipc__cu */
};

static const struct cu_entry cu_entries[] = {
#define GPUIPC__CU_ROW(fn, req, ver)                                           \
  {#fn, (req), (ver), offsetof(struct gpuipc__cu_table, fn)},
    GPUIPC_CU_FUNCS(GPUIPC__CU_ROW)
#undef GPUIPC__CU_ROW
};

/* "CUDA_ERROR_X (description)", or the number before the names resolve. */
static void cu_describe(CUresult r, char *buf, size_t cap)
{
  const char *name = NULL, *desc = NULL;
  if (gpuipc__cu.cuGetErrorName != NULL &&
      gpuipc__cu.cuGetErrorName(r, &name) != CUDA_SUCCESS)
    name = NULL;
  if (gpuipc__cu.cuGetErrorString != NULL &&
      gpuipc__cu.cuGetErrorString(r, &desc) != CUDA_SUCCESS)
    desc = NULL;
  if (name != NULL && desc != NULL)
    snprintf(buf, cap, "%s (%s)", name, desc);
  else if (name != NULL)
    snprintf(buf, cap, "%s", name);
  else
    snprintf(buf, cap, "CUDA error %d", (int)r);
}

int gpuipc__cu_check(CUresult r, const char *what)
{
  if (GPUIPC__LIKELY(r == CUDA_SUCCESS))
    return 0;
  char desc[160];
  cu_describe(r, desc, sizeof(desc));
  return gpuipc__err(GPUIPC_E_CUDA, "%s: %s", what, desc);
}

/*
 * Ask the driver for @name's variant in force at CUDA @version.
 * Returns the entry point, or NULL with the reason in @why.
 */
static void *gpa_lookup(const struct gpa *g, const char *name, int version,
                        char *why, size_t cap)
{
  void *fn = NULL;
  CUresult r;
  if (g->v2 != NULL) {
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    r = g->v2(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &st);
    if (r == CUDA_SUCCESS && st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT) {
      gpuipc__why(why, cap, "no variant for CUDA %d", version);
      return NULL;
    }
    if (r == CUDA_SUCCESS && st != CU_GET_PROC_ADDRESS_SUCCESS)
      fn = NULL;
  } else {
    r = g->v1(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT);
  }
  if (r != CUDA_SUCCESS) {
    char desc[160];
    cu_describe(r, desc, sizeof(desc));
    gpuipc__why(why, cap, "%s", desc);
    return NULL;
  }
  if (fn == NULL)
    gpuipc__why(why, cap, "symbol not found");
  return fn;
}

/* Fill gpuipc__cu. Returns 0 or GPUIPC_E_NODRIVER with @why set. */
static int resolve_all(const struct gpa *g, char *why, size_t cap)
{
  for (size_t i = 0; i < GPUIPC__ARRAY_SIZE(cu_entries); i++) {
    const struct cu_entry *e = &cu_entries[i];
    char miss[200];
    void *fn = gpa_lookup(g, e->name, e->abi, miss, sizeof(miss));
    if (fn == NULL && e->required) {
      gpuipc__why(why, cap,
                  "%s lacks the required entry point %s: "
                  "cuGetProcAddress(\"%s\", %d): %s",
                  lib_path, e->name, e->name, e->abi, miss);
      memset(&gpuipc__cu, 0, sizeof(gpuipc__cu));
      return GPUIPC_E_NODRIVER;
    }
    if (fn == NULL)
      GPUIPC_LOG_D("optional CUDA entry point %s missing: %s", e->name, miss);
    /* Every field is a function pointer, the size of a void * here. */
    memcpy((char *)&gpuipc__cu + e->offset, &fn, sizeof(fn));
  }
  return 0;
}

static int load_driver(char *why, size_t cap)
{
  const char *lib = gpuipc__cfg_str(GPUIPC_CFG_CUDA_LIB);
  const char *off = gpuipc__cfg_str(GPUIPC_CFG_NO_CUDA);
  snprintf(lib_path, sizeof(lib_path), "%s", lib);

  if (gpuipc__cfg_check(GPUIPC_CFG_NO_CUDA) != 0) {
    gpuipc__why(why, cap, "CUDA not loaded: %s", gpuipc_last_error());
    return GPUIPC_E_NODRIVER;
  }
  if (off[0] != '\0' && strcmp(off, "0") != 0) {
    gpuipc__why(why, cap, "CUDA disabled by GPUIPC_NO_CUDA=%s", off);
    return GPUIPC_E_NODRIVER;
  }
  if (lib[0] == '\0') {
    gpuipc__why(why, cap, "GPUIPC_CUDA_LIB is empty: no CUDA driver to load");
    return GPUIPC_E_NODRIVER;
  }

  /* Kept open for the life of the process, whatever happens below: the
   * driver may have started threads by the time anything fails. */
  dlerror();
  void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    const char *e = dlerror();
    gpuipc__why(why, cap, "dlopen(\"%s\"): %s", lib, e != NULL ? e : "failed");
    return GPUIPC_E_NODRIVER;
  }
  struct link_map *lm = NULL;
  if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm != NULL &&
      lm->l_name != NULL && lm->l_name[0] != '\0')
    snprintf(lib_path, sizeof(lib_path), "%s", lm->l_name);

  struct gpa g = {0};
  g.v2 = (gpa_v2_fn)dlsym(h, "cuGetProcAddress_v2");
  if (g.v2 == NULL)
    g.v1 = (gpa_v1_fn)dlsym(h, "cuGetProcAddress");
  if (g.v2 == NULL && g.v1 == NULL) {
    gpuipc__why(why, cap,
                "%s exports neither cuGetProcAddress_v2 nor cuGetProcAddress: "
                "not a CUDA driver, or one older than 11.3",
                lib_path);
    return GPUIPC_E_NODRIVER;
  }

  /* The version first, asked for at the ABI it has had since CUDA 2.2: a
   * request above the driver's own version fails. */
  char miss[200];
  CUresult (*get_version)(int *) = (CUresult(*)(int *))gpa_lookup(
      &g, "cuDriverGetVersion", 2020, miss, sizeof(miss));
  if (get_version == NULL) {
    gpuipc__why(why, cap,
                "%s lacks the required entry point cuDriverGetVersion: "
                "cuGetProcAddress(\"cuDriverGetVersion\", 2020): %s",
                lib_path, miss);
    return GPUIPC_E_NODRIVER;
  }
  int v = 0;
  CUresult r = get_version(&v);
  if (r != CUDA_SUCCESS) {
    gpuipc__why(why, cap, "%s: cuDriverGetVersion: CUDA error %d", lib_path,
                (int)r);
    return GPUIPC_E_NODRIVER;
  }
  drv_version = v;
  if (v < GPUIPC_CU_MIN_DRIVER) {
    gpuipc__why(why, cap,
                "CUDA driver %d.%d (%d) in %s is too old: gpuipc needs %d.%d "
                "or newer",
                v / 1000, v % 1000 / 10, v, lib_path,
                GPUIPC_CU_MIN_DRIVER / 1000, GPUIPC_CU_MIN_DRIVER % 1000 / 10);
    return GPUIPC_E_NODRIVER;
  }

  int rc = resolve_all(&g, why, cap);
  if (rc != 0)
    return rc;

  r = gpuipc__cu.cuInit(0);
  if (r != CUDA_SUCCESS) {
    char desc[160];
    cu_describe(r, desc, sizeof(desc));
    gpuipc__why(why, cap, "cuInit: %s", desc);
    return r == CUDA_ERROR_NO_DEVICE ? GPUIPC_E_NODEVICE : GPUIPC_E_NODRIVER;
  }
  return gpuipc__dev_table_read(why, cap);
}

#else /* !GPUIPC_HAVE_CUDA */

static int load_driver(char *why, size_t cap)
{
  snprintf(lib_path, sizeof(lib_path), "%s",
           gpuipc__cfg_str(GPUIPC_CFG_CUDA_LIB));
  gpuipc__why(why, cap,
              "gpuipc was built without CUDA headers (cuda.h): only the HOST "
              "kind is available");
  return GPUIPC_E_NODRIVER;
}

#endif /* GPUIPC_HAVE_CUDA */

/* Set in a child made by fork() (without exec) of a process that loaded
 * the driver or looked for it. */
static _Atomic bool in_fork_child;
static pthread_once_t child_once = PTHREAD_ONCE_INIT;

/*
 * CUDA cannot be used in a child made by fork() once the parent has
 * initialised it. Such a child sees no driver: the HOST kind keeps working
 * (unregistered), and the GPU kinds say why they are not there. And no
 * child asks the dynamic loader whether the driver is there
 * (gpuipc__cuda_in_process): a thread of the parent may have held its lock.
 */
static void forked_child(void)
{
  atomic_store(&in_fork_child, true);
  if (!atomic_load(&load_ran) || load_code != 0)
    return;
  load_code = GPUIPC_E_NODRIVER;
  gpuipc__why(load_msg, sizeof(load_msg),
              "CUDA cannot be used in a process made by fork() after its "
              "parent initialised CUDA: exec a program to use the GPU");
}

static void child_install(void)
{
  pthread_atfork(NULL, NULL, forked_child);
}

static void load_once_fn(void)
{
  pthread_once(&child_once, child_install);
  load_code = load_driver(load_msg, sizeof(load_msg));
  atomic_store(&load_ran, true);
  if (load_code == 0) {
    GPUIPC_LOG_I("CUDA driver %d.%d from %s", drv_version / 1000,
                 drv_version % 1000 / 10, lib_path);
    gpuipc__fd_table_early(); /* buffers come: each a descriptor (os.h) */
  } else {
    GPUIPC_LOG_I("no CUDA (%s): %s", gpuipc_err_name(load_code), load_msg);
  }
}

int gpuipc__cuda_load(void)
{
  pthread_once(&load_once, load_once_fn);
  if (GPUIPC__LIKELY(load_code == 0))
    return 0;
  return gpuipc__err(load_code, "%s", load_msg);
}

bool gpuipc__cuda_in_process(void)
{
  if (!atomic_load(&load_ran)) {
#if GPUIPC_HAVE_CUDA
    /* A child of fork() (without exec) asks nothing (forked_child): it
     * cannot use its parent's CUDA anyway, and memory it maps is
     * registered when gpuipc first puts GPU work on it. */
    pthread_once(&child_once, child_install);
    if (atomic_load(&in_fork_child))
      return false;
    const char *lib = gpuipc__cfg_str(GPUIPC_CFG_CUDA_LIB);
    /* RTLD_NOLOAD: a handle only if the library is mapped already (5-25
     * us when it is not). It is not closed, as the loader's own handle
     * never is. */
    if (lib[0] == '\0' || dlopen(lib, RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD) ==
                               NULL)
      return false;
#else
    return false;
#endif
  }
  pthread_once(&load_once, load_once_fn);
  return load_code == 0;
}

int gpuipc__cuda_driver_version(void)
{
  pthread_once(&load_once, load_once_fn);
  return drv_version;
}

const char *gpuipc__cuda_lib_path(void)
{
  pthread_once(&load_once, load_once_fn);
  return lib_path;
}

int gpuipc_driver_library(const char **path)
{
  if (path == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_driver_library: path is NULL");
  *path = gpuipc__cuda_lib_path();
  return 0;
}

int gpuipc_driver_status(int *driver_version)
{
  int rc = gpuipc__cuda_load();
  if (driver_version != NULL)
    *driver_version = drv_version;
  return rc;
}
