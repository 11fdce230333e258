/*
 * Where a member's chunks are read from: its destination buffers, lent as
 * segments "<round>.share.<slot>.<k>" (gpuipc_segment_open with opts.buf),
 * and recorded in the table with the broker's id of each, so that a peer
 * that opens the name checks it got the very segment this member lent
 * (and not one an earlier round under the same name left behind). Peers
 * open what they read from on first use in a call and let go at its end;
 * struct share_peers_open is the one place a cache across calls would go.
 */
#include "share/share.h"
#include "segment/segment.h"

#include <stdio.h>
#include <stdlib.h>

struct share_lent {
  char round[GPUIPC_NAME_MAX + 1];
  int slot;
  uint32_t n;
  gpuipc_buf_t **bufs; /* the lent handles, [n] */
};

/* Per server slot: its lent segments this call opened (or failed to). */
struct share_peers_open {
  uint32_t n[GPUIPC__SHARE_MEMBERS];
  gpuipc_buf_t **bufs[GPUIPC__SHARE_MEMBERS]; /* [n]: NULL not tried */
  uint8_t *bad[GPUIPC__SHARE_MEMBERS];        /* [n]: 1 could not open */
};

int gpuipc__share_lent_name(char *out, size_t cap, const char *round,
                            int slot, uint32_t k)
{
  int w = snprintf(out, cap, "%s.share.%d.%u", round, slot, k);
  return w < 0 || (size_t)w >= cap || w > GPUIPC_NAME_MAX ? -ENAMETOOLONG : 0;
}

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

static int lend_one(gpuipc_domain_t *dom, struct share_lent *lt,
                    gpuipc_buf_t *dst, uint32_t k, uint64_t *id)
{
  char name[GPUIPC_NAME_MAX + 1];
  int rc = gpuipc__share_lent_name(name, sizeof(name), lt->round, lt->slot,
                                   k);
  if (rc != 0)
    return gpuipc__err(rc, "gpuipc_share_copy: lent name too long");
  gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
  o.flags = GPUIPC_CREATE | GPUIPC_SCRATCH;
  o.buf = dst;
  rc = gpuipc_segment_open(dom, name, &o, &lt->bufs[k]);
  if (rc == -EEXIST) {
    /* Left by a member of an earlier round of this name that died: this
     * slot is ours in the table now. */
    (void)gpuipc_segment_unlink(dom, name);
    rc = gpuipc_segment_open(dom, name, &o, &lt->bufs[k]);
  }
  if (rc != 0)
    return rc;
  if (gpuipc__seg_id_of(lt->bufs[k], dom, id) != 0)
    return gpuipc__err(-ENOENT, "gpuipc_share_copy: lent segment %s has no "
                       "id", name);
  return 0;
}

int gpuipc__share_lend(gpuipc_domain_t *dom, const char *round,
                       struct share_table *t, int slot,
                       const struct share_layout *l, struct share_lent **out)
{
  struct share_lent *lt = calloc(1, sizeof(*lt));
  int *first = calloc((size_t)l->n, sizeof(*first));
  uint64_t *ids = calloc((size_t)l->n, sizeof(*ids));
  if (lt == NULL || first == NULL || ids == NULL ||
      (lt->bufs = calloc((size_t)l->n, sizeof(*lt->bufs))) == NULL) {
    free(lt);
    free(first);
    free(ids);
    return gpuipc__err(-ENOMEM, "gpuipc_share_copy: out of memory");
  }
  snprintf(lt->round, sizeof(lt->round), "%s", round);
  lt->slot = slot;
  int rc = 0;
  uint32_t nd = 0;
  for (int e = 0; e < l->n && rc == 0; e++) {
    uint32_t before = nd;
    uint32_t k = dst_index(l, e, first, &nd);
    first[e] = (int)k;
    if (nd != before) {
      lt->n = nd;
      rc = lend_one(dom, lt, l->ext[e].dst, k, &ids[k]);
    }
  }
  if (rc == 0) {
    for (int e = 0; e < l->n; e++) {
      struct share_ext *x = &t->exts[(size_t)slot * t->nextents + e];
      x->k = (uint32_t)first[e];
      x->off = l->ext[e].dst_off;
      x->seg_id = ids[first[e]];
    }
    t->members[slot].nlent = nd;
    *out = lt;
  } else {
    gpuipc__share_lend_end(dom, lt);
  }
  free(first);
  free(ids);
  return rc;
}

void gpuipc__share_lend_end(gpuipc_domain_t *dom, struct share_lent *lt)
{
  if (lt == NULL)
    return;
  for (uint32_t k = 0; k < lt->n; k++) {
    if (lt->bufs[k] == NULL)
      continue;
    char name[GPUIPC_NAME_MAX + 1];
    if (gpuipc__share_lent_name(name, sizeof(name), lt->round, lt->slot, k) ==
        0)
      (void)gpuipc__segment_unlink_held(dom, name, lt->bufs[k]);
    gpuipc_buf_release(lt->bufs[k]);
  }
  free(lt->bufs);
  free(lt);
}

/* Server @slot's lent buffer @k, opened on first use; NULL if it cannot. */
static gpuipc_buf_t *peer_buf(gpuipc_domain_t *dom, const char *round,
                              struct share_peers_open *po, int slot,
                              uint32_t nlent, uint32_t k, uint64_t want_id,
                              int device)
{
  if (po->bufs[slot] == NULL) {
    po->bufs[slot] = calloc(nlent, sizeof(gpuipc_buf_t *));
    po->bad[slot] = calloc(nlent, 1);
    if (po->bufs[slot] == NULL || po->bad[slot] == NULL) {
      free(po->bufs[slot]);
      free(po->bad[slot]);
      po->bufs[slot] = NULL;
      po->bad[slot] = NULL;
      return NULL;
    }
    po->n[slot] = nlent;
  }
  if (k >= po->n[slot] || po->bad[slot][k])
    return NULL;
  if (po->bufs[slot][k] != NULL)
    return po->bufs[slot][k];
  char name[GPUIPC_NAME_MAX + 1];
  gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
  o.device = device;
  gpuipc_buf_t *b = NULL;
  uint64_t id = 0;
  if (gpuipc__share_lent_name(name, sizeof(name), round, slot, k) != 0 ||
      gpuipc_segment_open(dom, name, &o, &b) != 0 ||
      gpuipc__seg_id_of(b, dom, &id) != 0 || id != want_id) {
    if (b != NULL)
      gpuipc_buf_release(b);
    po->bad[slot][k] = 1;
    return NULL;
  }
  po->bufs[slot][k] = b;
  return b;
}

const void *gpuipc__share_peer_src(gpuipc_domain_t *dom, const char *round,
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
  gpuipc_buf_t *b = peer_buf(dom, round, *pop, slot, nlent, x.k, x.seg_id,
                             device);
  if (b == NULL)
    return NULL;
  size_t size = gpuipc_buf_size(b);
  if (x.off > size || p->off > size - x.off || p->bytes > size - x.off - p->off)
    return NULL;
  return (const uint8_t *)gpuipc_buf_ptr(b) + x.off + p->off;
}

void gpuipc__share_peers_close(struct share_peers_open *po)
{
  if (po == NULL)
    return;
  for (int s = 0; s < GPUIPC__SHARE_MEMBERS; s++) {
    for (uint32_t k = 0; po->bufs[s] != NULL && k < po->n[s]; k++)
      if (po->bufs[s][k] != NULL)
        gpuipc_buf_release(po->bufs[s][k]);
    free(po->bufs[s]);
    free(po->bad[s]);
  }
  free(po);
}

void gpuipc__share_unlink_all(gpuipc_domain_t *dom, const char *round,
                              struct share_table *t)
{
  for (int s = 0; s < GPUIPC__SHARE_MEMBERS; s++) {
    if (atomic_load(&t->members[s].pid) == 0)
      continue;
    uint32_t n = t->members[s].nlent;
    for (uint32_t k = 0; k < n && k < t->nextents; k++) {
      char name[GPUIPC_NAME_MAX + 1];
      if (gpuipc__share_lent_name(name, sizeof(name), round, s, k) == 0)
        (void)gpuipc_segment_unlink(dom, name);
    }
  }
}
