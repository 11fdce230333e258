/*
 * Channels: the pinned lists of copies that gpuipc's block kernel reads
 * (src/cuda/kernel.c), one a record slot of the sender's. A slot's list
 * is rewritten only for a later message in that slot, which the sender
 * sends once this one is free: released after the kernel that read the
 * list, and that kernel done. And the counters the copy kernels count
 * their blocks in, one a record slot, the receiver's and the sender's
 * own: a slot's launch is done before the slot is used again (its word,
 * written last, frees it).
 */
#include "channel/channel.h"
#include "cuda/cuda.h"

#include <stdlib.h>

uint64_t *gpuipc__chan_klist(struct gpuipc_channel *ch, uint32_t slot,
                             size_t bytes, int dev)
{
  struct gpuipc__rx *rx = &ch->rx;
  if (slot >= rx->depth)
    return NULL;
  if (rx->klist == NULL) {
    rx->klist = calloc(rx->depth, sizeof(*rx->klist));
    rx->klist_cap = calloc(rx->depth, sizeof(*rx->klist_cap));
    if (rx->klist == NULL || rx->klist_cap == NULL) {
      free(rx->klist); /* both or neither: the next call tries again */
      free(rx->klist_cap);
      rx->klist = NULL;
      rx->klist_cap = NULL;
      return NULL;
    }
    rx->klist_dev = dev; /* the lists are portable: one context for all */
  }
  if (rx->klist_cap[slot] < bytes) {
    size_t cap = 4096;
    while (cap < bytes)
      cap *= 2;
    uint64_t *l;
    if (gpuipc__pinned_alloc(rx->klist_dev, cap, &l) != 0)
      return NULL;
    /* The slot's last message is free: its kernel has run. */
    gpuipc__pinned_free(rx->klist_dev, rx->klist[slot]);
    rx->klist[slot] = l;
    rx->klist_cap[slot] = cap;
  }
  return rx->klist[slot];
}

void gpuipc__chan_klist_free(struct gpuipc_channel *ch)
{
  struct gpuipc__rx *rx = &ch->rx;
  if (rx->klist != NULL)
    for (uint32_t i = 0; i < rx->depth; i++)
      gpuipc__pinned_free(rx->klist_dev, rx->klist[i]);
  free(rx->klist);
  free(rx->klist_cap);
  rx->klist = NULL;
  rx->klist_cap = NULL;
}

uint64_t gpuipc__chan_kcount(struct gpuipc__kcounters *k, int dev,
                             uint32_t slot)
{
  if (dev < 0 || dev >= GPUIPC__CHAN_EV_DEVS)
    return 0;
  if (k->state[dev] == 0)
    k->state[dev] = gpuipc__counters_get(dev, &k->at[dev]) == 0 ? 1 : -1;
  return k->state[dev] > 0 ? k->at[dev] + (uint64_t)slot * 4 : 0;
}

void gpuipc__chan_kcounters_put(struct gpuipc__kcounters *k)
{
  for (int i = 0; i < GPUIPC__CHAN_EV_DEVS; i++)
    if (k->state[i] > 0) {
      gpuipc__counters_put(i, k->at[i]);
      k->state[i] = 0;
    }
}
