/*
 * Memory its creator keeps (GPUIPC__SEGF_CREATOR_HELD: LEGACY and fabric
 * memory, a POOL allocation: no descriptor keeps it alive elsewhere)
 * outlives the creator's own last release: the release hook (seg_table.c)
 * keeps the buffer (gpuipc__buf_keep) while the hold of the publishing
 * domain is marked "keeper", until that domain's broker says LET_GO (the
 * segment was unlinked and nobody holds it). Leaving the domain asks the
 * broker (DISOWN): with nobody else holding it the memory goes at once,
 * otherwise it stays until the process exits, so that no holder ever reads
 * freed memory while the creator lives. Uses the table; the table does not
 * use this file.
 */
#include "segment/seg_table.h"
#include "os/os.h"
#include "mem/mem.h"

#include <stdlib.h>
#include <string.h>


void gpuipc__seg_let_go(gpuipc_domain_t *d, uint64_t id)
{
  pthread_mutex_lock(&gpuipc__seg_mu);
  struct seg_entry *e;
  struct seg_hold *h = gpuipc__seg_find_keeper(d, id, &e);
  gpuipc_buf_t *b = h != NULL ? gpuipc__seg_hold_unkeep(e, h) : NULL;
  pthread_mutex_unlock(&gpuipc__seg_mu);
  if (b != NULL) {
    GPUIPC_LOG_D("segment id %llu: unlinked and held by nobody: freeing the "
                 "memory this process kept", (unsigned long long)id);
    gpuipc__buf_destroy(b);
  }
}

/* Leaving a domain: how long its DISOWNs may take in all. */
#define DISOWN_MS 2000

/*
 * Tell @d's broker that this process stops keeping segment @id's memory.
 * 0: nobody else holds it, free it; -EBUSY: others do; or the call's code.
 */
int gpuipc__seg_disown(gpuipc_domain_t *d, uint64_t id, int timeout_ms)
{
  struct gpuipc__reply *r = malloc(sizeof(*r));
  if (r == NULL)
    return gpuipc__err(-ENOMEM, "disowning segment id %llu: out of memory",
                       (unsigned long long)id);
  struct gpuipc__msg *m = &r->msg;
  memset(&m->u.disown, 0, sizeof(m->u.disown));
  m->type = GPUIPC_MSG_DISOWN;
  m->u.disown.id = id;
  int rc = gpuipc__dom_call(d, m, NULL, 0, timeout_ms, "disown", r);
  for (int i = 0; rc == 0 && i < r->nfds; i++)
    gpuipc__fd_close(&r->fds[i]);
  free(r);
  return rc;
}

/*
 * @d is being left: for each segment whose memory this process keeps for
 * @d, ask the broker (DISOWN, at most 2 s in all); free the memory when
 * nobody else holds it, else keep it until the process exits. Never waits
 * for holders.
 */
void gpuipc__seg_disown_domain(gpuipc_domain_t *d)
{
  /* The parent's domain (after fork): nothing of it is this process's to
   * tell, nor its memory to free. */
  if (gpuipc__dom_stale(d))
    return;
  /* The ids this process keeps memory for in @d. */
  uint64_t *ids = NULL;
  size_t n = 0, cap = 0;
  pthread_mutex_lock(&gpuipc__seg_mu);
  for (struct seg_hold *h = gpuipc__seg_holds_of(d); h != NULL;
       h = h->dom_next) {
    if (!h->keeper)
      continue;
    if (n == cap) {
      size_t nc = cap ? cap * 2 : 16;
      uint64_t *ni = realloc(ids, nc * sizeof(*ids));
      if (ni == NULL) {
        h->keeper = false; /* no memory to ask: keep it until exit */
        h->entry->forever = true;
        continue;
      }
      ids = ni;
      cap = nc;
    }
    ids[n++] = h->id;
  }
  pthread_mutex_unlock(&gpuipc__seg_mu);

  int ms = gpuipc__dom_timeout(d);
  uint64_t deadline = gpuipc__deadline(ms < 0 || ms > DISOWN_MS ? DISOWN_MS
                                                                : ms);
  for (size_t k = 0; k < n; k++) {
    /* 0: nobody else holds it. Anything else (held elsewhere, no broker,
     * no answer in time): keep the memory until this process exits. */
    int rc = gpuipc__seg_disown(d, ids[k], gpuipc__ms_left(deadline));
    pthread_mutex_lock(&gpuipc__seg_mu);
    struct seg_entry *e;
    struct seg_hold *h = gpuipc__seg_find_keeper(d, ids[k], &e);
    gpuipc_buf_t *b = NULL;
    if (h != NULL) {
      if (rc != 0) {
        e->forever = true;
        GPUIPC_LOG_D("segment %s (id %llu): keeping its memory until this "
                     "process exits: %s", h->name,
                     (unsigned long long)ids[k], gpuipc_last_error());
      }
      b = gpuipc__seg_hold_unkeep(e, h);
    }
    pthread_mutex_unlock(&gpuipc__seg_mu);
    if (b != NULL)
      gpuipc__buf_destroy(b);
  }
  free(ids);
}
