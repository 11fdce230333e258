/* gpuipc info: the library, the driver, the devices, the kinds, settings. */
#include "cli.h"
#include "core/core.h" /* GPUIPC__KIND_LAST */

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#if GPUIPC_HAVE_CUDA
#include <cuda.h>
#endif

static const char usage[] =
    "usage: gpuipc info [--json] [--config]\n"
    "\n"
    "Print what gpuipc finds here: the library's version; the CUDA driver\n"
    "(its version and file, or why it could not be used); every visible\n"
    "device with its UUID, name, PCI bus id, memory, compute capability and\n"
    "sharing capabilities; which buffer kinds can be allocated; the runtime\n"
    "directory; what the build included (the CUDA header, hence the GPU\n"
    "kinds; the MPI component; NVML, which needs nothing at build time and\n"
    "is looked for at run time); the settings set in the environment, and\n"
    "those rejected or unknown (--config lists them all). Exits 0 whether\n"
    "or not a driver is present.\n"
    "\n"
    "  --config  print the settings instead: every GPUIPC_* variable with\n"
    "            the value in force, its default, whether it is set, and\n"
    "            its help; a value that does not parse is shown as\n"
    "            rejected (its default is in force), and GPUIPC_* variables\n"
    "            that are no setting (typos) are listed\n"
    "  --json    print the same as one JSON object (with --config: the\n"
    "            settings alone; without: everything, settings included)\n";

/* The kinds a buffer can have: 1 (HOST) to the last of gpuipc.h's
 * GPUIPC_KIND_MAP (0, AUTO, is a request). */
#define NKINDS ((size_t)GPUIPC__KIND_LAST)
#define KIND(k) ((gpuipc_kind_t)((k) + 1))

/* Everything `info` reports, gathered before any of it is printed. */
struct report {
  int drv_rc, drv_version;
  char drv_error[512];
  const char *library;
  int ndev;
  gpuipc_device_info_t *dev;
  int kind_rc[NKINDS];
  char kind_error[NKINDS][512];
  int dir_rc;
  char dir[PATH_MAX];
  char dir_error[512];
  int nvml_rc;
  char nvml_error[512];
};

/*
 * What the build included. The tool carries the library compiled in
 * (tools/CMakeLists.txt), so these are the library's: the CUDA header
 * (without it only the HOST kind is built) and the MPI component
 * (libgpuipc_mpi, built beside it when MPI was found). NVML needs nothing
 * at build time: it is loaded at run time.
 */
static bool build_cuda(void)
{
  return GPUIPC_HAVE_CUDA != 0;
}

/* CUDA_VERSION of the header built against (12040 for 12.4), or 0. */
static int build_cuda_version(void)
{
#if GPUIPC_HAVE_CUDA
  return CUDA_VERSION;
#else
  return 0;
#endif
}

static const char *build_cuda_include(void)
{
  return build_cuda() ? GPUIPC_BUILD_CUDA_INCLUDE : NULL;
}

/* The MPI version (MPI_C_VERSION) libgpuipc_mpi was built with, or NULL. */
static const char *build_mpi(void)
{
  return GPUIPC_BUILD_MPI[0] != '\0' ? GPUIPC_BUILD_MPI : NULL;
}

static void gather(struct report *r)
{
  memset(r, 0, sizeof(*r));
  r->drv_rc = gpuipc_driver_status(&r->drv_version);
  if (r->drv_rc != 0)
    snprintf(r->drv_error, sizeof(r->drv_error), "%s", gpuipc_last_error());
  gpuipc_driver_library(&r->library);

  int n = gpuipc_device_count();
  r->dev = n > 0 ? calloc((size_t)n, sizeof(*r->dev)) : NULL;
  for (int i = 0; i < n && r->dev != NULL; i++) {
    gpuipc_device_info_t *d = &r->dev[r->ndev];
    d->size = sizeof(*d);
    if (gpuipc_device_info(i, d) == 0)
      r->ndev++;
  }

  for (size_t k = 0; k < NKINDS; k++) {
    r->kind_rc[k] = gpuipc_kind_available(KIND(k));
    if (r->kind_rc[k] != 0)
      snprintf(r->kind_error[k], sizeof(r->kind_error[k]), "%s",
               gpuipc_last_error());
  }

  r->dir_rc = gpuipc_runtime_dir(r->dir, sizeof(r->dir), 0);
  if (r->dir_rc != 0) {
    r->dir[0] = '\0';
    snprintf(r->dir_error, sizeof(r->dir_error), "%s", gpuipc_last_error());
  }

  r->nvml_rc = gpuipc_topo_nvml();
  if (r->nvml_rc != 0)
    snprintf(r->nvml_error, sizeof(r->nvml_error), "%s", gpuipc_last_error());
}

static void print_build_text(const struct report *r)
{
  int v = build_cuda_version();
  if (build_cuda())
    printf("build:       CUDA header %d.%d (%s): vmm, legacy, pool "
           "built\n", v / 1000, v % 1000 / 10, build_cuda_include());
  else
    printf("build:       no CUDA header: HOST kind only\n");
  if (build_mpi() != NULL)
    printf("             MPI component (libgpuipc_mpi) built, MPI %s\n",
           build_mpi());
  else
    printf("             no MPI component (no MPI found at build time)\n");
  printf("             NVML: no build dependency, loaded at run time: %s\n",
         r->nvml_rc == 0 ? "loaded" : r->nvml_error);
  printf("             %s, %s build\n", GPUIPC_BUILD_COMPILER,
         GPUIPC_BUILD_TYPE[0] != '\0' ? GPUIPC_BUILD_TYPE : "default");
}

static void print_build_json(const struct report *r, struct cli_json *j)
{
  cli_json_obj(j, "build");
  cli_json_bool(j, "cuda_header", build_cuda());
  if (build_cuda())
    cli_json_int(j, "cuda_header_version", build_cuda_version());
  else
    cli_json_null(j, "cuda_header_version");
  cli_json_str(j, "cuda_include_dir", build_cuda_include());
  cli_json_bool(j, "mpi", build_mpi() != NULL);
  cli_json_str(j, "mpi_version", build_mpi());
  cli_json_bool(j, "nvml_loaded", r->nvml_rc == 0);
  cli_json_str(j, "nvml_error", r->nvml_rc != 0 ? r->nvml_error : NULL);
  cli_json_str(j, "compiler", GPUIPC_BUILD_COMPILER);
  cli_json_str(j, "build_type", GPUIPC_BUILD_TYPE);
  cli_json_end(j);
}

/* The settings set in the environment, and those rejected or unknown;
 * --config lists them all. */
static void print_settings_text(void)
{
  int set = 0;
  printf("settings:\n");
  for (int i = 0; i < gpuipc_config_count(); i++) {
    gpuipc_config_item_t it;
    const char *bad = NULL, *why = NULL;
    if (gpuipc_config_get(i, &it) != 0)
      continue;
    gpuipc_config_rejected(i, &bad, &why);
    if (bad != NULL)
      printf("  %s=\"%s\"  REJECTED (%s): \"%s\" is in force\n", it.name,
             bad, why, it.value);
    else if (it.is_set)
      printf("  %s=\"%s\"\n", it.name, it.value);
    set += it.is_set;
  }
  const char *name;
  for (int i = 0; gpuipc_config_unknown(i, &name) == 0; i++)
    printf("  %s  UNKNOWN: no gpuipc setting has this name; ignored\n", name);
  printf("  (%s; `gpuipc info --config` lists all %d with their defaults)\n",
         set ? "the others have their defaults" : "none set: all defaults",
         gpuipc_config_count());
}

static const char *yes(int v)
{
  return v ? "yes" : "no";
}

/* "posix-fd fabric" for CUmemAllocationHandleType bits. */
static const char *handle_types(int bits, char *buf, size_t cap)
{
  static const struct {
    int bit;
    const char *name;
  } names[] = {
      {0x1, "posix-fd"}, {0x2, "win32"}, {0x4, "win32-kmt"}, {0x8, "fabric"}};
  size_t off = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    if ((bits & names[i].bit) && off < cap)
      off += (size_t)snprintf(buf + off, cap - off, "%s%s", off ? " " : "",
                              names[i].name);
  if (off == 0)
    snprintf(buf, cap, "none");
  return buf;
}

static void print_text(const struct report *r)
{
  char b1[64] = "", b2[64];
  printf("gpuipc %s\n\n", gpuipc_version());
  if (r->drv_version > 0)
    snprintf(b1, sizeof(b1), "CUDA %d.%d (%d)", r->drv_version / 1000,
             r->drv_version % 1000 / 10, r->drv_version);
  if (r->drv_rc == 0)
    printf("driver:      %s from %s\n", b1, r->library);
  else
    printf("driver:      not usable (%s): %s\n"
           "             library: %s%s%s\n",
           gpuipc_err_name(r->drv_rc), r->drv_error, r->library,
           r->drv_version > 0 ? ", " : "", r->drv_version > 0 ? b1 : "");

  printf("devices:     %d\n", r->ndev);
  for (int i = 0; i < r->ndev; i++) {
    const gpuipc_device_info_t *d = &r->dev[i];
    printf("  %d  %s  %s\n", d->ordinal, d->uuid_str, d->name);
    printf("     pci %s, %s, compute capability %d.%d\n", d->pci_bus_id,
           cli_bytes(d->total_mem, b1, sizeof(b1)), d->cc_major, d->cc_minor);
    printf("     vmm %s, posix-fd %s, fabric %s, ipc-events %s, "
           "unified-addressing %s\n",
           yes(d->vmm), yes(d->posix_fd), yes(d->fabric), yes(d->ipc_events),
           yes(d->unified_addressing));
    printf("     pools %s (handle types 0x%x: %s), granularity %s\n",
           yes(d->mem_pools), (unsigned)d->pool_handle_types,
           handle_types(d->pool_handle_types, b2, sizeof(b2)),
           d->granularity ? cli_bytes(d->granularity, b1, sizeof(b1))
                          : "none (no VMM)");
    int frc = gpuipc_fabric_status(i);
    printf("     fabric handles for VMM: %s\n",
           frc == 0 ? "used" : gpuipc_last_error());
  }

  printf("kinds:\n");
  for (size_t k = 0; k < NKINDS; k++) {
    if (r->kind_rc[k] == 0)
      printf("  %-7s available\n", gpuipc_kind_name(KIND(k)));
    else
      printf("  %-7s unavailable (%s): %s\n", gpuipc_kind_name(KIND(k)),
             gpuipc_err_name(r->kind_rc[k]), r->kind_error[k]);
  }
  if (r->dir_rc == 0)
    printf("runtime dir: %s\n", r->dir);
  else
    printf("runtime dir: unusable (%s): %s\n", gpuipc_err_name(r->dir_rc),
           r->dir_error);
  print_build_text(r);
  print_settings_text();
}

/* "config": every setting; "unknown_settings": GPUIPC_* names that are
 * none. A rejected value is the environment's, which did not parse. */
static void json_config(struct cli_json *j)
{
  cli_json_obj(j, "config");
  for (int i = 0; i < gpuipc_config_count(); i++) {
    gpuipc_config_item_t it;
    if (gpuipc_config_get(i, &it) != 0)
      continue;
    const char *bad = NULL, *why = NULL;
    gpuipc_config_rejected(i, &bad, &why);
    cli_json_obj(j, it.name);
    cli_json_str(j, "value", it.value);
    cli_json_str(j, "default", it.def);
    cli_json_bool(j, "set", it.is_set);
    cli_json_str(j, "rejected", bad);
    cli_json_str(j, "problem", bad != NULL ? why : NULL);
    cli_json_str(j, "help", it.help);
    cli_json_end(j);
  }
  cli_json_end(j);
  cli_json_arr(j, "unknown_settings");
  const char *name;
  for (int i = 0; gpuipc_config_unknown(i, &name) == 0; i++)
    cli_json_str(j, NULL, name);
  cli_json_end(j);
}

static void print_json(const struct report *r)
{
  struct cli_json j;
  char cc[32];
  cli_json_init(&j, stdout);
  cli_json_obj(&j, NULL);
  cli_json_str(&j, "version", gpuipc_version());

  cli_json_obj(&j, "driver");
  cli_json_bool(&j, "ok", r->drv_rc == 0);
  cli_json_str(&j, "status", gpuipc_err_name(r->drv_rc));
  cli_json_int(&j, "version", r->drv_version);
  cli_json_str(&j, "library", r->library);
  cli_json_str(&j, "error", r->drv_rc != 0 ? r->drv_error : NULL);
  cli_json_end(&j);

  cli_json_arr(&j, "devices");
  for (int i = 0; i < r->ndev; i++) {
    const gpuipc_device_info_t *d = &r->dev[i];
    cli_json_obj(&j, NULL);
    cli_json_int(&j, "ordinal", d->ordinal);
    cli_json_str(&j, "uuid", d->uuid_str);
    cli_json_str(&j, "name", d->name);
    cli_json_str(&j, "pci_bus_id", d->pci_bus_id);
    cli_json_uint(&j, "total_mem", d->total_mem);
    snprintf(cc, sizeof(cc), "%d.%d", d->cc_major, d->cc_minor);
    cli_json_str(&j, "compute_capability", cc);
    cli_json_bool(&j, "vmm", d->vmm);
    cli_json_bool(&j, "posix_fd", d->posix_fd);
    cli_json_bool(&j, "fabric", d->fabric);
    cli_json_bool(&j, "ipc_events", d->ipc_events);
    cli_json_bool(&j, "mem_pools", d->mem_pools);
    cli_json_int(&j, "pool_handle_types", d->pool_handle_types);
    cli_json_bool(&j, "unified_addressing", d->unified_addressing);
    cli_json_uint(&j, "granularity", d->granularity);
    int frc = gpuipc_fabric_status(i);
    cli_json_bool(&j, "fabric_usable", frc == 0);
    cli_json_str(&j, "fabric_reason", frc == 0 ? NULL : gpuipc_last_error());
    cli_json_end(&j);
  }
  cli_json_end(&j);

  cli_json_obj(&j, "kinds");
  for (size_t k = 0; k < NKINDS; k++) {
    cli_json_obj(&j, gpuipc_kind_name(KIND(k)));
    cli_json_bool(&j, "available", r->kind_rc[k] == 0);
    cli_json_str(&j, "status", gpuipc_err_name(r->kind_rc[k]));
    cli_json_str(&j, "error", r->kind_rc[k] != 0 ? r->kind_error[k] : NULL);
    cli_json_end(&j);
  }
  cli_json_end(&j);

  cli_json_obj(&j, "runtime_dir");
  cli_json_str(&j, "path", r->dir_rc == 0 ? r->dir : NULL);
  cli_json_str(&j, "error", r->dir_rc != 0 ? r->dir_error : NULL);
  cli_json_end(&j);

  print_build_json(r, &j);
  json_config(&j);
  cli_json_finish(&j);
}

static void print_config_text(void)
{
  for (int i = 0; i < gpuipc_config_count(); i++) {
    gpuipc_config_item_t it;
    if (gpuipc_config_get(i, &it) != 0)
      continue;
    const char *bad = NULL, *why = NULL;
    gpuipc_config_rejected(i, &bad, &why);
    if (bad != NULL)
      printf("%s=\"%s\"  (REJECTED: set to \"%s\", which %s; default "
             "\"%s\")\n    %s\n", it.name, it.value, bad, why, it.def,
             it.help);
    else
      printf("%s=\"%s\"  (%s; default \"%s\")\n    %s\n", it.name,
             it.value, it.is_set ? "set" : "not set", it.def, it.help);
  }
  const char *name;
  for (int i = 0; gpuipc_config_unknown(i, &name) == 0; i++)
    printf("%s  UNKNOWN: no gpuipc setting has this name (misspelt?); "
           "ignored\n", name);
}

static int info_run(int argc, char **argv)
{
  bool json = false, config = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0)
      json = true;
    else if (strcmp(argv[i], "--config") == 0)
      config = true;
    else
      return cli_usage_error(&gpuipc_cmd_info, "unknown argument '%s'",
                             argv[i]);
  }

  if (config) {
    if (json) {
      struct cli_json j;
      cli_json_init(&j, stdout);
      cli_json_obj(&j, NULL);
      json_config(&j);
      cli_json_finish(&j);
    } else {
      print_config_text();
    }
    return CLI_EXIT_OK;
  }

  struct report *r = malloc(sizeof(*r));
  if (r == NULL)
    return cli_fail(&gpuipc_cmd_info, "out of memory");
  gather(r);
  if (json)
    print_json(r);
  else
    print_text(r);
  free(r->dev);
  free(r);
  return CLI_EXIT_OK;
}

const struct gpuipc_cmd gpuipc_cmd_info = {
    .name = "info",
    .summary = "show the library, its build, the CUDA driver, devices, "
               "kinds, settings",
    .usage = usage,
    .run = info_run,
};
