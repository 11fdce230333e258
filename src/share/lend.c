/*
 * Where a member's chunks are read from: its destination buffers, lent as
 * segments (its standing lends, cache.c, under names of its process), and
 * recorded in the table with the number of each one's name and the
 * broker's id of each, so that a peer that opens the name checks it got
 * the very segment this member lent (and not one that an earlier process
 * with the same pid left behind). Peers open what they read from on first
 * use (or find it kept from an earlier call, cache.c) and put it back at
 * the call's end.
 */
#include "share/share.h"
#include "segment/segment.h"

#include <stdio.h>
#include <stdlib.h>

struct share_lent {
  uint32_t n;
  struct share_kept *kept; /* the standing lends this call used, [n] */
};

/* Per server slot: its lent segments this call used (or failed to open). */
struct share_peers_open {
  uint32_t n[GPUIPC__SHARE_MEMBERS];
  struct share_kept *kept[GPUIPC__SHARE_MEMBERS]; /* [n]: entry NULL not yet */
  uint8_t *bad[GPUIPC__SHARE_MEMBERS];           /* [n]: 1 could not open */
  int opened; /* peers' segments this call mapped */
};

/* The index of @l's extent @e's destination among the distinct ones (the
 * first extent with the same buffer). */
static uint32_t dst_index(const struct share_layout *l, int e,
                          const int *first, uint32_t *nd)
{
  for (int j = 0; j < e; j++)
    if (l->ext[j].dst == l->ext[e].dst)
      return (uint32_t)first[j];
  return (*nd)++;
}

int gpuipc__share_lend(gpuipc_domain_t *dom, struct share_table *t,
                       int slot, const struct share_layout *l,
                       struct share_lent **out, int *fresh)
{
  struct share_lent *lt = calloc(1, sizeof(*lt));
  int *first = calloc((size_t)l->n, sizeof(*first));
  if (lt == NULL || first == NULL ||
      (lt->kept = calloc((size_t)l->n, sizeof(*lt->kept))) == NULL) {
    free(lt);
    free(first);
    return gpuipc__err(-ENOMEM, "gpuipc_share_copy: out of memory");
  }
  int rc = 0;
  uint32_t nd = 0;
  *fresh = 0;
  for (int e = 0; e < l->n && rc == 0; e++) {
    uint32_t before = nd;
    uint32_t k = dst_index(l, e, first, &nd);
    first[e] = (int)k;
    if (nd != before) {
      lt->n = nd;
      rc = gpuipc__share_cache_lend(dom, l->ext[e].dst, &lt->kept[k]);
      *fresh += rc == 0 && lt->kept[k].fresh;
    }
  }
  if (rc == 0) {
    for (int e = 0; e < l->n; e++) {
      struct share_ext *x = &t->exts[(size_t)slot * t->nextents + e];
      x->k = (uint32_t)first[e];
      x->name = lt->kept[first[e]].n;
      x->off = l->ext[e].dst_off;
      x->seg_id = lt->kept[first[e]].id;
    }
    t->members[slot].nlent = nd;
    *out = lt;
  } else {
    gpuipc__share_lend_end(lt);
  }
  free(first);
  return rc;
}

void gpuipc__share_lend_end(struct share_lent *lt)
{
  if (lt == NULL)
    return;
  for (uint32_t k = 0; k < lt->n; k++)
    gpuipc__share_cache_put(&lt->kept[k], true);
  free(lt->kept);
  free(lt);
}

/* Server @slot's lent buffer @k, opened (or found kept) on first use;
 * NULL if it cannot be. */
static gpuipc_buf_t *peer_buf(gpuipc_domain_t *dom, struct share_table *t,
                              struct share_peers_open *po, int slot,
                              uint32_t nlent, const struct share_ext *x,
                              int device)
{
  if (po->kept[slot] == NULL) {
    po->kept[slot] = calloc(nlent, sizeof(struct share_kept));
    po->bad[slot] = calloc(nlent, 1);
    if (po->kept[slot] == NULL || po->bad[slot] == NULL) {
      free(po->kept[slot]);
      free(po->bad[slot]);
      po->kept[slot] = NULL;
      po->bad[slot] = NULL;
      return NULL;
    }
    po->n[slot] = nlent;
  }
  uint32_t k = x->k;
  if (k >= po->n[slot] || po->bad[slot][k])
    return NULL;
  struct share_kept *kp = &po->kept[slot][k];
  if (kp->entry != NULL) /* this call's: the same id, or a liar's change */
    return kp->id == x->seg_id ? gpuipc__share_kept_buf(kp) : NULL;
  const struct share_member *m = &t->members[slot];
  gpuipc_buf_t *b = gpuipc__share_cache_open(dom, atomic_load(&m->pid),
                                             m->start_time, x->name,
                                             x->seg_id, device, kp);
  if (b == NULL) {
    po->bad[slot][k] = 1;
    return NULL;
  }
  po->opened += kp->fresh;
  return b;
}

const void *gpuipc__share_peer_src(gpuipc_domain_t *dom,
                                   struct share_table *t,
                                   struct share_peers_open **pop, int slot,
                                   const struct share_layout *l, long i,
                                   int device)
{
  if (*pop == NULL && (*pop = calloc(1, sizeof(**pop))) == NULL)
    return NULL;
  const struct share_piece *p = &l->pieces[i];
  uint32_t nlent = t->members[slot].nlent;
  struct share_ext x = t->exts[(size_t)slot * t->nextents + p->ext];
  if (nlent == 0 || nlent > t->nextents || x.k >= nlent)
    return NULL;
  gpuipc_buf_t *b = peer_buf(dom, t, *pop, slot, nlent, &x, device);
  if (b == NULL)
    return NULL;
  size_t size = gpuipc_buf_size(b);
  if (x.off > size || p->off > size - x.off || p->bytes > size - x.off - p->off)
    return NULL;
  return (const uint8_t *)gpuipc_buf_ptr(b) + x.off + p->off;
}

void gpuipc__share_peers_close(struct share_peers_open *po, bool settled,
                               int *opened)
{
  *opened = 0;
  if (po == NULL)
    return;
  *opened = po->opened;
  for (int s = 0; s < GPUIPC__SHARE_MEMBERS; s++) {
    for (uint32_t k = 0; po->kept[s] != NULL && k < po->n[s]; k++)
      gpuipc__share_cache_put(&po->kept[s][k], settled);
    free(po->kept[s]);
    free(po->bad[s]);
  }
  free(po);
}
