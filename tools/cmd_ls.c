/* gpuipc ls: the domains in the runtime directory, or one domain's segments. */
#include "cli.h"
#include "share/share.h" /* gpuipc__share_sweep_now */

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: gpuipc ls [--json] [--prune] [DOMAIN]\n"
    "\n"
    "Without DOMAIN: the domains in the runtime directory, each live (a\n"
    "broker answers) or stale (a socket left by a broker that died), and\n"
    "the stale files there: sockets and lock files of domains without a\n"
    "broker, channel sockets nobody listens on. Makes nothing: a runtime\n"
    "directory that does not exist is reported as such.\n"
    "With DOMAIN: its broker (pid, epoch, members, descriptors held) and its\n"
    "segments: name, id, size, kind, device, state (creating, filling,\n"
    "published, unlinked, lost) and holders (pid:opens). Never starts a\n"
    "broker.\n"
    "\n"
    "  --json   print one JSON object instead\n"
    "  --prune  remove the stale files (only those; never a live domain's\n"
    "           or channel's); with DOMAIN, what shared copies left behind\n"
    "           in it: the tables of rounds whose members are all gone and\n"
    "           the standing lends of processes that are gone (only those\n"
    "           nobody holds), as a round's next creator would\n";

static const char *device_str(const uint8_t uuid[16], char out[41])
{
  static const uint8_t zero[16];
  if (memcmp(uuid, zero, 16) == 0)
    return "-";
  gpuipc_uuid_str(uuid, out);
  return out;
}

/* ----- the domains in the runtime directory ----- */

/*
 * The domains of the runtime directory, live or not (sorted); their count,
 * or a negative code. The count may grow between two calls: ask until it
 * fits.
 */
static int domain_names(gpuipc_domain_entry_t **out)
{
  gpuipc_domain_entry_t *e = NULL;
  int n = gpuipc_domain_names(NULL, 0);
  for (int cap = n + 16; n >= 0; cap = n + 16) {
    free(e);
    e = calloc((size_t)cap, sizeof(*e));
    if (e == NULL)
      return -ENOMEM;
    for (int i = 0; i < cap; i++)
      e[i].size = sizeof(e[i]);
    n = gpuipc_domain_names(e, cap);
    if (n <= cap)
      break;
  }
  if (n < 0)
    free(e);
  else
    *out = e;
  return n;
}

struct stale_out {
  bool json, prune;
  struct cli_json *j;
  int failed;
};

static void on_stale(void *arg, const char *name, const char *why, int rc)
{
  struct stale_out *o = arg;
  if (rc < 0)
    o->failed++;
  if (o->json) {
    cli_json_obj(o->j, NULL);
    cli_json_str(o->j, "file", name);
    cli_json_str(o->j, "why", why);
    cli_json_bool(o->j, "removed", o->prune && rc == 0);
    cli_json_end(o->j);
  } else if (rc < 0) {
    printf("  %s (%s): not removed: %s\n", name, why, gpuipc_last_error());
  } else {
    printf("  %s%s (%s)\n", o->prune ? "removed " : "", name, why);
  }
}

/* Report, or with @prune remove, the stale files of the runtime directory. */
static int stale_files(bool json, bool prune,
                       struct cli_json *j)
{
  struct stale_out o = {json, prune, j, 0};
  if (json)
    cli_json_arr(j, "stale");
  else
    printf("stale files:\n");
  int n = gpuipc_runtime_prune(prune ? 0 : GPUIPC_PRUNE_DRY_RUN, on_stale, &o);
  if (json)
    cli_json_end(j);
  else if (n == 0)
    printf("  none\n");
  else if (n > 0 && !prune)
    printf("(gpuipc ls --prune removes them)\n");
  if (n >= 0 && o.failed == 0)
    return CLI_EXIT_OK;
  /* The document is under way: the error is one of its members. */
  char why[1024];
  if (n < 0)
    snprintf(why, sizeof(why), "%s", gpuipc_last_error());
  else
    snprintf(why, sizeof(why), "%d stale file(s) could not be removed",
             o.failed);
  fprintf(stderr, "gpuipc ls: %s\n", why);
  if (json)
    cli_json_str(j, "error", why);
  return CLI_EXIT_FAIL;
}

/* No runtime directory: nothing ran here, and nothing is made. */
static int no_dir(bool json)
{
  char dir[PATH_MAX];
  snprintf(dir, sizeof(dir), "%s", gpuipc_last_error());
  if (json) {
    struct cli_json j;
    cli_json_init(&j, stdout);
    cli_json_obj(&j, NULL);
    cli_json_str(&j, "runtime_dir_missing", dir);
    cli_json_arr(&j, "domains");
    cli_json_end(&j);
    cli_json_end(&j);
    cli_json_finish(&j);
  } else {
    printf("%s: no domains\n", dir);
  }
  return CLI_EXIT_OK;
}

static int list_domains(bool json, bool prune)
{
  char dir[PATH_MAX];
  int rc = gpuipc_runtime_dir(dir, sizeof(dir), GPUIPC_RUNDIR_FIND);
  if (rc == -ENOENT)
    return no_dir(json);
  if (rc != 0)
    return cli_fail(&gpuipc_cmd_ls, "%s", gpuipc_last_error());
  gpuipc_domain_entry_t *names;
  int n = domain_names(&names);
  if (n < 0)
    return cli_fail(&gpuipc_cmd_ls, "%s: %s", dir, gpuipc_last_error());

  struct cli_json j;
  if (json) {
    cli_json_init(&j, stdout);
    cli_json_obj(&j, NULL);
    cli_json_str(&j, "runtime_dir", dir);
    cli_json_arr(&j, "domains");
  } else {
    printf("runtime directory %s\n", dir);
    if (n == 0)
      printf("no domains\n");
  }
  for (int i = 0; i < n; i++) {
    const char *state = names[i].live ? "live" : "stale";
    if (json) {
      cli_json_obj(&j, NULL);
      cli_json_str(&j, "name", names[i].name);
      cli_json_str(&j, "state", state);
      cli_json_end(&j);
    } else {
      printf("%-32s %s\n", names[i].name, state);
    }
  }
  free(names);
  if (json)
    cli_json_end(&j);
  rc = stale_files(json, prune, &j);
  if (json) {
    cli_json_end(&j);
    cli_json_finish(&j);
  }
  return rc;
}

/* ----- one domain ----- */

static void holders_str(const gpuipc_segment_info_t *s, char *out, size_t cap)
{
  size_t len = 0;
  out[0] = '\0';
  int shown = s->nholders < GPUIPC_SEGMENT_HOLDERS ? s->nholders
                                                    : GPUIPC_SEGMENT_HOLDERS;
  for (int i = 0; i < shown && len < cap; i++)
    len += (size_t)snprintf(out + len, cap - len, "%s%d:%d", i ? "," : "",
                            s->holder_pids[i], s->holder_refs[i]);
  if (s->nholders > shown && len < cap)
    len += (size_t)snprintf(out + len, cap - len, " +%d more",
                            s->nholders - shown);
  if (s->nholders == 0)
    len = (size_t)snprintf(out, cap, "-");
  /* Memory only its creator holds: who keeps it after its own release. */
  if (s->keeper_pid != 0 && len < cap)
    snprintf(out + len, cap - len, " (memory kept by creator pid %d)",
             s->keeper_pid);
}

/* What --prune removed from a domain. */
struct pruned {
  int n, cap;
  struct pruned_name {
    char name[GPUIPC_NAME_MAX + 1];
    bool table;
  } *v;
};

static void on_pruned(const char *name, bool table, void *arg)
{
  struct pruned *p = arg;
  if (p->n == p->cap) {
    int cap = p->cap > 0 ? 2 * p->cap : 16;
    struct pruned_name *v = realloc(p->v, (size_t)cap * sizeof(*v));
    if (v == NULL)
      return; /* removed all the same; not listed */
    p->v = v;
    p->cap = cap;
  }
  snprintf(p->v[p->n].name, sizeof(p->v[p->n].name), "%s", name);
  p->v[p->n++].table = table;
}

static const char *pruned_what(const struct pruned_name *x)
{
  return x->table ? "round table, every member gone"
                  : "standing lend, its process gone";
}

static int list_domain(const char *name, bool json, bool prune)
{
  char dir[PATH_MAX];
  /* Makes nothing. */
  if (gpuipc_runtime_dir(dir, sizeof(dir), GPUIPC_RUNDIR_FIND) != 0)
    return cli_fail(&gpuipc_cmd_ls, "%s", gpuipc_last_error());
  gpuipc_domain_t *dom;
  gpuipc_domain_opts_t o = {sizeof(o), GPUIPC_JOIN_NO_BROKER, 2000};
  int rc = gpuipc_domain_join(name, &o, &dom);
  if (rc != 0)
    return cli_fail(&gpuipc_cmd_ls, "%s", gpuipc_last_error());
  struct pruned pr = {0, 0, NULL};
  if (prune) {
    rc = gpuipc__share_sweep_now(dom, NULL, on_pruned, &pr);
    if (rc < 0) {
      rc = cli_fail(&gpuipc_cmd_ls, "%s: --prune: %s", name,
                    gpuipc_last_error());
      free(pr.v);
      gpuipc_domain_leave(dom);
      return rc;
    }
  }
  gpuipc_domain_info_t di = {.size = sizeof(di)};
  gpuipc_segment_info_t *segs = NULL;
  int n = 0;
  rc = gpuipc_domain_info(dom, &di);
  /* The count may grow between two calls: ask until it fits. */
  for (int cap = di.segments + 16; rc == 0; cap = n + 16) {
    free(segs);
    segs = calloc((size_t)cap, sizeof(*segs));
    if (segs == NULL) {
      rc = -ENOMEM;
      break;
    }
    for (int i = 0; i < cap; i++)
      segs[i].size = sizeof(segs[i]);
    n = gpuipc_segment_list(dom, segs, cap);
    if (n < 0)
      rc = n;
    if (n <= cap)
      break;
  }
  if (rc != 0) {
    rc = cli_fail(&gpuipc_cmd_ls, "%s: %s", name, gpuipc_last_error());
    free(segs);
    free(pr.v);
    gpuipc_domain_leave(dom);
    return rc;
  }
  char dev[41], hold[512], sz[32];
  if (json) {
    struct cli_json j;
    cli_json_init(&j, stdout);
    cli_json_obj(&j, NULL);
    cli_json_str(&j, "domain", name);
    cli_json_int(&j, "broker_pid", di.broker_pid);
    char epoch[20];
    snprintf(epoch, sizeof(epoch), "%016llx", (unsigned long long)di.epoch);
    cli_json_str(&j, "epoch", epoch);
    cli_json_int(&j, "members", di.members - 1); /* not counting ls */
    cli_json_int(&j, "broker_fds", di.broker_fds);
    if (prune) {
      cli_json_arr(&j, "pruned");
      for (int i = 0; i < pr.n; i++) {
        cli_json_obj(&j, NULL);
        cli_json_str(&j, "name", pr.v[i].name);
        cli_json_str(&j, "what", pr.v[i].table ? "round" : "standing_lend");
        cli_json_end(&j);
      }
      cli_json_end(&j);
    }
    cli_json_arr(&j, "segments");
    for (int i = 0; i < n; i++) {
      const gpuipc_segment_info_t *s = &segs[i];
      cli_json_obj(&j, NULL);
      cli_json_str(&j, "name", s->name);
      cli_json_uint(&j, "id", s->id);
      cli_json_uint(&j, "size", s->bytes);
      cli_json_str(&j, "kind", gpuipc_kind_name(s->kind));
      const char *d = device_str(s->device_uuid, dev);
      if (strcmp(d, "-") == 0)
        cli_json_null(&j, "device");
      else
        cli_json_str(&j, "device", d);
      cli_json_str(&j, "state", gpuipc_segment_state_name(s->state));
      cli_json_bool(&j, "broker_fd", s->broker_fd != 0);
      cli_json_bool(&j, "creator_held", s->creator_held != 0);
      if (s->keeper_pid != 0)
        cli_json_int(&j, "keeper_pid", s->keeper_pid);
      else
        cli_json_null(&j, "keeper_pid");
      cli_json_int(&j, "nholders", s->nholders);
      cli_json_arr(&j, "holders");
      for (int k = 0; k < s->nholders && k < GPUIPC_SEGMENT_HOLDERS; k++) {
        cli_json_obj(&j, NULL);
        cli_json_int(&j, "pid", s->holder_pids[k]);
        cli_json_int(&j, "opens", s->holder_refs[k]);
        cli_json_end(&j);
      }
      cli_json_end(&j);
      cli_json_end(&j);
    }
    cli_json_end(&j);
    cli_json_end(&j);
    cli_json_finish(&j);
  } else {
    for (int i = 0; i < pr.n; i++)
      printf("removed %s (%s)\n", pr.v[i].name, pruned_what(&pr.v[i]));
    if (prune && pr.n == 0)
      printf("nothing to prune\n");
    printf("domain %s: broker pid %d, epoch %016llx, %d members, %d "
           "segments, %d descriptors held by the broker\n",
           name, di.broker_pid, (unsigned long long)di.epoch, di.members - 1,
           n, di.broker_fds);
    if (n > 0)
      printf("%-24s %16s %10s %-6s %-40s %-9s %s\n", "NAME", "ID", "SIZE",
             "KIND", "DEVICE", "STATE", "HOLDERS (pid:opens)");
    for (int i = 0; i < n; i++) {
      const gpuipc_segment_info_t *s = &segs[i];
      holders_str(s, hold, sizeof(hold));
      printf("%-24s %16llu %10s %-6s %-40s %-9s %s\n", s->name,
             (unsigned long long)s->id, cli_bytes(s->bytes, sz, sizeof(sz)),
             gpuipc_kind_name(s->kind), device_str(s->device_uuid, dev),
             gpuipc_segment_state_name(s->state), hold);
    }
  }
  free(segs);
  free(pr.v);
  gpuipc_domain_leave(dom);
  return CLI_EXIT_OK;
}

static int run(int argc, char **argv)
{
  bool json = false, prune = false;
  const char *name = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0)
      json = true;
    else if (strcmp(argv[i], "--prune") == 0)
      prune = true;
    else if (argv[i][0] == '-')
      return cli_usage_error(&gpuipc_cmd_ls, "unknown option %s", argv[i]);
    else if (name == NULL)
      name = argv[i];
    else
      return cli_usage_error(&gpuipc_cmd_ls, "one domain at a time");
  }
  if (name == NULL)
    return list_domains(json, prune);
  if (gpuipc_domain_name_check(name) != 0)
    return cli_usage_error(&gpuipc_cmd_ls, "%s", gpuipc_last_error());
  return list_domain(name, json, prune);
}

const struct gpuipc_cmd gpuipc_cmd_ls = {
    .name = "ls",
    .summary = "list domains, or a domain's segments and their holders",
    .usage = usage,
    .run = run,
};
