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
 * `gpuipc ls --prune DOMAIN` sweeps at once (gpuipc__share_sweep_now).
 * A member's own round ends here too (gpuipc__share_round_end): its
 * table unlinked by the last member out, and the creator's sweep.
 */
#include "share/share.h"
#include "segment/segment.h"
#include "os/os.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define SWEEP_EVERY_NS 1000000000ull
/* Segments listed at once; more only when the domain has more. */
#define LIST_FIRST 256

static _Atomic uint64_t last_sweep;

/* Whether round table @name was closed and unlinked here. */
static bool sweep_one(gpuipc_domain_t *dom, const char *name)
{
  gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
  o.kind = GPUIPC_KIND_HOST;
  o.timeout_ms = 0;
  /* Its header is all that is read: no registration with CUDA (which
   * would wait for this process's GPU work). */
  o.flags = GPUIPC_UNPINNED;
  gpuipc_buf_t *b;
  if (gpuipc_segment_open(dom, name, &o, &b) != 0)
    return false; /* gone meanwhile, or not ours to open */
  struct share_table t;
  struct share_peer peers[GPUIPC__SHARE_MEMBERS];
  memset(peers, 0, sizeof(peers));
  uint32_t open = 0;
  bool done = false;
  if (gpuipc__share_table_map_found(&t, b) == 0 &&
      !gpuipc__share_any_live(&t, -1, peers) &&
      atomic_compare_exchange_strong(&t.hdr->closed, &open, 1))
    done = gpuipc__segment_unlink_held(dom, name, b) == 0;
  gpuipc_buf_release(b);
  return done;
}

void gpuipc__share_sweep(gpuipc_domain_t *dom, const char *mine)
{
  uint64_t now = gpuipc__now_ns(), last = atomic_load(&last_sweep);
  if ((last != 0 && now - last < SWEEP_EVERY_NS) ||
      !atomic_compare_exchange_strong(&last_sweep, &last, now))
    return;
  (void)gpuipc__share_sweep_now(dom, mine, NULL, NULL);
}

int gpuipc__share_sweep_now(gpuipc_domain_t *dom, const char *mine,
                            void (*on_unlinked)(const char *name, bool table,
                                                void *arg),
                            void *arg)
{
  int count = 0, rc = 0;
  /* One request as a rule; a second, once, when the domain has more. */
  gpuipc_segment_info_t *info = NULL;
  int want = LIST_FIRST, got = 0;
  for (int tries = 0; tries < 2 && want > got; tries++) {
    gpuipc_segment_info_t *more = realloc(info, (size_t)want * sizeof(*info));
    if (more == NULL) {
      rc = gpuipc__err(-ENOMEM, "share sweep: no memory for %d segments",
                       want);
      break;
    }
    info = more;
    for (int i = 0; i < want; i++)
      info[i].size = sizeof(info[i]);
    int n = gpuipc_segment_list(dom, info, want);
    if (n < 0) {
      rc = n;
      break;
    }
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
    bool table = false, gone = false;
    if (strncmp(x->name, GPUIPC__SHARE_STANDING, pl) == 0)
      gone = gpuipc_segment_unlink(dom, x->name) == 0;
    else if (x->kind == GPUIPC_KIND_HOST && len > sl &&
             strcmp(x->name + len - sl, GPUIPC__SHARE_TABLE_SUFFIX) == 0 &&
             (mine == NULL || strcmp(x->name, mine) != 0))
      gone = table = sweep_one(dom, x->name);
    if (gone) {
      count++;
      if (on_unlinked != NULL)
        on_unlinked(x->name, table, arg);
    }
  }
  free(info);
  return rc != 0 ? rc : count;
}

void gpuipc__share_round_end(gpuipc_domain_t *dom, const char *round,
                             gpuipc_buf_t *table, bool closed, bool keep,
                             bool sweep)
{
  char name[GPUIPC_NAME_MAX + 1];
  gpuipc__share_table_name(name, sizeof(name), round);
  if (closed)
    (void)gpuipc__segment_unlink_held(dom, name, table);
  if (!keep)
    gpuipc_buf_release(table);
  if (sweep)
    gpuipc__share_sweep(dom, name);
}
