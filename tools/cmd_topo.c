/* gpuipc topo: the GPU-to-GPU matrix, in the manner of `nvidia-smi topo -m`. */
#include "cli.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Device @i's description; false when it cannot be had. */
static bool device_info(int i, gpuipc_device_info_t *d)
{
  memset(d, 0, sizeof(*d));
  d->size = sizeof(*d);
  return gpuipc_device_info(i, d) == 0;
}

static const char topo_usage[] =
    "usage: gpuipc topo [--json]\n"
    "\n"
    "Print how the visible GPUs reach each other: the link (NVLink with its\n"
    "count, or the PCIe path, from NVML when it is installed) and what the\n"
    "CUDA driver says about peer-to-peer access, native atomics and the\n"
    "performance rank. Ordinals are this process's (CUDA_VISIBLE_DEVICES);\n"
    "UUIDs are the same in every process.\n"
    "\n"
    "  --json   one JSON document instead of the tables\n";

/* "NV18", "PIX", "X", "?" */
static const char *link_label(const gpuipc_p2p_t *p, char *buf, size_t cap)
{
  if (p->link == GPUIPC_LINK_NVLINK)
    snprintf(buf, cap, "NV%d", p->nvlinks);
  else
    snprintf(buf, cap, "%s", gpuipc_link_name(p->link));
  return buf;
}

/* "OK A r0", "NS" */
static const char *p2p_label(const gpuipc_p2p_t *p, int self, char *buf,
                             size_t cap)
{
  if (self)
    snprintf(buf, cap, "X");
  else if (!p->access)
    snprintf(buf, cap, "NS");
  else
    snprintf(buf, cap, "OK%s r%d", p->native_atomics ? " A" : "",
             p->perf_rank);
  return buf;
}

static int topo_json(int n, const gpuipc_p2p_t *m, int nvml_rc,
                     const char *nvml_why)
{
  struct cli_json j;
  cli_json_init(&j, stdout);
  cli_json_obj(&j, NULL);
  cli_json_arr(&j, "devices");
  for (int i = 0; i < n; i++) {
    gpuipc_device_info_t d;
    if (!device_info(i, &d))
      continue;
    cli_json_obj(&j, NULL);
    cli_json_int(&j, "ordinal", i);
    cli_json_str(&j, "uuid", d.uuid_str);
    cli_json_str(&j, "name", d.name);
    cli_json_str(&j, "pci_bus_id", d.pci_bus_id);
    int frc = gpuipc_fabric_status(i);
    cli_json_bool(&j, "fabric", frc == 0);
    if (frc != 0)
      cli_json_str(&j, "fabric_reason", gpuipc_last_error());
    cli_json_end(&j);
  }
  cli_json_end(&j);
  cli_json_bool(&j, "nvml", nvml_rc == 0);
  if (nvml_rc != 0)
    cli_json_str(&j, "nvml_reason", nvml_why);
  cli_json_arr(&j, "links");
  for (int a = 0; a < n; a++)
    for (int b = 0; b < n; b++) {
      const gpuipc_p2p_t *p = &m[a * n + b];
      if (a == b)
        continue;
      cli_json_obj(&j, NULL);
      cli_json_int(&j, "src", a);
      cli_json_int(&j, "dst", b);
      cli_json_bool(&j, "access", p->access != 0);
      cli_json_int(&j, "perf_rank", p->perf_rank);
      cli_json_bool(&j, "native_atomics", p->native_atomics != 0);
      cli_json_bool(&j, "cuda_arrays", p->cuda_arrays != 0);
      cli_json_str(&j, "link", gpuipc_link_name(p->link));
      if (p->nvlinks >= 0)
        cli_json_int(&j, "nvlinks", p->nvlinks);
      else
        cli_json_null(&j, "nvlinks");
      cli_json_end(&j);
    }
  cli_json_end(&j);
  cli_json_end(&j);
  cli_json_finish(&j);
  return CLI_EXIT_OK;
}

static void print_matrix(int n, const gpuipc_p2p_t *m, bool links)
{
  char cell[32];
  printf("%-8s", "");
  for (int b = 0; b < n; b++) {
    snprintf(cell, sizeof(cell), "GPU%d", b);
    printf("%-10s", cell);
  }
  printf("\n");
  for (int a = 0; a < n; a++) {
    snprintf(cell, sizeof(cell), "GPU%d", a);
    printf("%-8s", cell);
    for (int b = 0; b < n; b++) {
      const gpuipc_p2p_t *p = &m[a * n + b];
      printf("%-10s", links ? link_label(p, cell, sizeof(cell))
                            : p2p_label(p, a == b, cell, sizeof(cell)));
    }
    printf("\n");
  }
}

static int topo_text(int n, const gpuipc_p2p_t *m, int nvml_rc,
                     const char *nvml_why)
{
  for (int i = 0; i < n; i++) {
    gpuipc_device_info_t d;
    if (!device_info(i, &d))
      continue;
    int frc = gpuipc_fabric_status(i);
    printf("GPU%d  %s  %s  %s\n      fabric handles: %s\n", i, d.uuid_str,
           d.name, d.pci_bus_id, frc == 0 ? "yes" : gpuipc_last_error());
  }
  printf("\nLinks\n");
  print_matrix(n, m, true);
  printf("\nPeer-to-peer (CUDA driver)\n");
  print_matrix(n, m, false);
  printf("\nLegend:\n"
         "  X    = Self\n"
         "  SYS  = Traverses PCIe and the SMP interconnect between NUMA "
         "nodes\n"
         "  NODE = Traverses PCIe and the interconnect between host bridges "
         "of a NUMA node\n"
         "  PHB  = Traverses PCIe and a PCIe host bridge\n"
         "  PXB  = Traverses several PCIe bridges, no host bridge\n"
         "  PIX  = Traverses at most one PCIe bridge\n"
         "  NV#  = Connected by # active NVLinks (directly or through "
         "NVSwitches)\n"
         "  ?    = Unknown: %s\n"
         "  OK   = Peer access supported; A = native atomics; r# = "
         "performance rank\n"
         "  NS   = Peer access not supported\n",
         nvml_rc == 0 ? "NVML did not say" : nvml_why);
  return CLI_EXIT_OK;
}

static int topo_run(int argc, char **argv)
{
  bool json = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0)
      json = true;
    else
      return cli_usage_error(&gpuipc_cmd_topo, "unknown argument '%s'",
                             argv[i]);
  }
  int rc = gpuipc_driver_status(NULL);
  if (rc != 0) {
    const char *why = gpuipc_last_error();
    if (json) {
      struct cli_json j;
      cli_json_init(&j, stdout);
      cli_json_obj(&j, NULL);
      cli_json_arr(&j, "devices");
      cli_json_end(&j);
      cli_json_str(&j, "error", why);
      cli_json_end(&j);
      cli_json_finish(&j);
    } else {
      fprintf(stderr, "gpuipc topo: no GPU: %s\n", why);
    }
    return CLI_EXIT_FAIL;
  }
  int n = gpuipc_device_count();
  gpuipc_p2p_t *m = calloc((size_t)n * (size_t)n, sizeof(*m));
  if (m == NULL)
    return cli_fail(&gpuipc_cmd_topo, "out of memory");
  for (int a = 0; a < n; a++)
    for (int b = 0; b < n; b++) {
      gpuipc_p2p_t *p = &m[a * n + b];
      p->size = sizeof(*p);
      rc = gpuipc_topo_p2p(a, b, p);
      if (rc != 0) {
        rc = cli_fail(&gpuipc_cmd_topo, "GPU%d -> GPU%d: %s", a, b,
                      gpuipc_last_error());
        free(m);
        return rc;
      }
    }
  char nvml_why[256] = "";
  int nvml_rc = gpuipc_topo_nvml();
  if (nvml_rc != 0)
    snprintf(nvml_why, sizeof(nvml_why), "%s", gpuipc_last_error());
  rc = json ? topo_json(n, m, nvml_rc, nvml_why)
            : topo_text(n, m, nvml_rc, nvml_why);
  free(m);
  return rc;
}

const struct gpuipc_cmd gpuipc_cmd_topo = {
    .name = "topo",
    .summary = "GPU-to-GPU links and peer-to-peer matrix (--json)",
    .usage = topo_usage,
    .run = topo_run,
};
