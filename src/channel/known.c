/*
 * Channels: the sender's table of the buffers the receiver holds. A buffer
 * travels by its handle once (NEW_BUF) and by a key after; the sender
 * remembers GPUIPC__CHAN_BUFS of them, evicts the least recently used one
 * when it needs room, and queues the keys of buffers it let go (a freed
 * large stage, stage.c) so that the next descriptors tell the receiver to
 * forget them (FORGET, one key a descriptor) and its mapping goes. The
 * receiver then holds nknown + nforget <= GPUIPC__CHAN_BUFS buffers. Used
 * by send.c and stage.c, under the send lock.
 */
#include "channel/channel.h"
#include "mem/mem.h"

#include <string.h>

/* The key the receiver knows @b by, or 0. */
uint64_t gpuipc__chan_known_find(struct gpuipc__tx *tx, const struct gpuipc_buf *b)
{
  int i = tx->last_known;
  if (i < tx->nknown && tx->known[i].export_id == b->export_id &&
      tx->known[i].nonce == b->nonce && tx->known[i].pid == b->pid) {
    tx->known[i].last_use = ++tx->clock;
    return tx->known[i].key;
  }
  for (i = 0; i < tx->nknown; i++) {
    struct gpuipc__known *k = &tx->known[i];
    if (k->export_id == b->export_id && k->nonce == b->nonce &&
        k->pid == b->pid) {
      k->last_use = ++tx->clock;
      tx->last_known = i;
      return k->key;
    }
  }
  return 0;
}

/*
 * Remember @b under a new key, evicting the least recently used entry
 * when full (its key in *@forget, else 0).
 */
uint64_t gpuipc__chan_known_add(struct gpuipc__tx *tx, const struct gpuipc_buf *b,
                          uint64_t *forget)
{
  int i = tx->nknown;
  *forget = 0;
  if (i == GPUIPC__CHAN_BUFS) {
    i = 0;
    for (int j = 1; j < tx->nknown; j++)
      if (tx->known[j].last_use < tx->known[i].last_use)
        i = j;
    *forget = tx->known[i].key;
  } else {
    tx->nknown++;
  }
  struct gpuipc__known *k = &tx->known[i];
  k->export_id = b->export_id;
  k->nonce = b->nonce;
  k->pid = b->pid;
  k->key = tx->next_key++;
  k->last_use = ++tx->clock;
  tx->last_known = i;
  return k->key;
}

/* Undo known_add when the message could not be sent. */
void gpuipc__chan_known_drop(struct gpuipc__tx *tx, uint64_t key)
{
  for (int i = 0; i < tx->nknown; i++)
    if (tx->known[i].key == key) {
      tx->known[i] = tx->known[--tx->nknown];
      tx->last_known = 0;
      return;
    }
}

void gpuipc__chan_known_forget(struct gpuipc__tx *tx, const gpuipc_buf_t *b)
{
  uint64_t key = gpuipc__chan_known_find(tx, b);
  if (key == 0)
    return; /* evicted already: the receiver was told */
  gpuipc__chan_known_drop(tx, key);
  /* The receiver holds nknown + nforget <= GPUIPC__CHAN_BUFS buffers. */
  tx->forget[tx->nforget++] = key;
}

/*
 * A key to forget for descriptor @d, unless it forgets one already: the
 * oldest queued. Returns whether it took one (dropped once @d is out).
 */
bool gpuipc__chan_forget_queued(struct gpuipc__tx *tx, struct gpuipc__desc *d)
{
  if ((d->flags & GPUIPC__DESC_FORGET) || tx->nforget == 0)
    return false;
  d->forget_key = tx->forget[0];
  d->flags |= GPUIPC__DESC_FORGET;
  return true;
}

void gpuipc__chan_forget_sent(struct gpuipc__tx *tx)
{
  tx->nforget--;
  memmove(tx->forget, tx->forget + 1, (size_t)tx->nforget * sizeof(uint64_t));
}
