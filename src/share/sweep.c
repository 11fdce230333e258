/*
 * Rounds whose members all died, and standing lends whose lender died.
 * The last member out of a round unlinks its table, and a member unlinks
 * its standing lends as it lets go of them (cache.c); a round that has no
 * last member (each one killed) leaves its table named, a killed member
 * its standing lends, and the broker keeps HOST and VMM memory while a
 * name does: the members' destinations, gigabytes of GPU memory maybe. So
 * the member that creates a round's table looks, at most once a second a
 * process, at the domain's segments that nobody holds: a round table
 * ("<round>.share", HOST) whose every member is gone (its process dead or
 * reused, or LEFT, or FAILED) it closes (a member that opened it
 * meanwhile finds it closed and copies alone) and unlinks; a standing lend
 * ("gpuipc-share.<pid>.<n>") it unlinks: its lender held it while it
 * lived, and its peers let go of it at their next call once its lender is
 * gone. A table that a member still lives in is left alone, as is any
 * segment whose header is not a round table's of this layout.
 */
#include "share/share.h"
#include "segment/segment.h"
#include "os/os.h"

#include <stdlib.h>
#include <string.h>

#define SWEEP_EVERY_NS 1000000000ull
/* Segments listed at once; more only when the domain has more. */
#define LIST_FIRST 256

static _Atomic uint64_t last_sweep;

static void sweep_one(gpuipc_domain_t *dom, const char *name)
{
  gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
  o.kind = GPUIPC_KIND_HOST;
  o.timeout_ms = 0;
  gpuipc_buf_t *b;
  if (gpuipc_segment_open(dom, name, &o, &b) != 0)
    return; /* gone meanwhile, or not ours to open */
  struct share_table t;
  struct share_peer peers[GPUIPC__SHARE_MEMBERS];
  memset(peers, 0, sizeof(peers));
  uint32_t open = 0;
  if (gpuipc__share_table_map_found(&t, b) == 0 &&
      !gpuipc__share_any_live(&t, -1, peers) &&
      atomic_compare_exchange_strong(&t.hdr->closed, &open, 1)) {
    (void)gpuipc__segment_unlink_held(dom, name, b);
  }
  gpuipc_buf_release(b);
}

void gpuipc__share_sweep(gpuipc_domain_t *dom, const char *mine)
{
  uint64_t now = gpuipc__now_ns(), last = atomic_load(&last_sweep);
  if ((last != 0 && now - last < SWEEP_EVERY_NS) ||
      !atomic_compare_exchange_strong(&last_sweep, &last, now))
    return;
  /* One request as a rule; a second, once, when the domain has more. */
  gpuipc_segment_info_t *info = NULL;
  int want = LIST_FIRST, got = 0;
  for (int tries = 0; tries < 2 && want > got; tries++) {
    gpuipc_segment_info_t *more = realloc(info, (size_t)want * sizeof(*info));
    if (more == NULL)
      break;
    info = more;
    for (int i = 0; i < want; i++)
      info[i].size = sizeof(info[i]);
    int n = gpuipc_segment_list(dom, info, want);
    if (n < 0)
      break;
    got = n < want ? n : want; /* filled */
    want = n;                  /* there are */
  }
  size_t sl = strlen(GPUIPC__SHARE_TABLE_SUFFIX);
  size_t pl = strlen(GPUIPC__SHARE_STANDING);
  for (int i = 0; info != NULL && i < got; i++) {
    const gpuipc_segment_info_t *x = &info[i];
    size_t len = strnlen(x->name, sizeof(x->name));
    if (x->state != GPUIPC_SEG_PUBLISHED || x->nholders != 0 ||
        len >= sizeof(x->name))
      continue;
    /* A standing lend that nobody holds: its lender is gone (a live one
     * holds it from its creation to its unlink), and so are its peers'
     * mappings of it. */
    if (strncmp(x->name, GPUIPC__SHARE_STANDING, pl) == 0)
      (void)gpuipc_segment_unlink(dom, x->name);
    else if (x->kind == GPUIPC_KIND_HOST && len > sl &&
             strcmp(x->name + len - sl, GPUIPC__SHARE_TABLE_SUFFIX) == 0 &&
             strcmp(x->name, mine) != 0)
      sweep_one(dom, x->name);
  }
  free(info);
}
