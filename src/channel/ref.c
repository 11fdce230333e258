/*
 * A channel's references: the user's (from gpuipc_channel_open until
 * gpuipc_channel_close, open.c) and one per live received view (taken by
 * recv.c, dropped by gpuipc_tensor_release). The last one frees the
 * channel. Kept apart so that open.c and recv.c both depend on it and not
 * on each other.
 */
#include "channel/channel.h"
#include "mem/mem.h"
#include "os/os.h"

#include <stdlib.h>

void gpuipc__chan_ref(struct gpuipc_channel *ch)
{
  atomic_fetch_add(&ch->refs, 1);
}

void gpuipc__chan_unref(struct gpuipc_channel *ch)
{
  if (atomic_fetch_sub(&ch->refs, 1) != 1)
    return;
  gpuipc__fd_close(&ch->sock);
  gpuipc__fd_close(&ch->peer_pidfd);
  gpuipc__chan_poll_close(ch);
  free(ch->tx.recs);
  free(ch->tx.free_slots);
  if (ch->seg != NULL)
    gpuipc_buf_release(ch->seg);
  pthread_mutex_destroy(&ch->tx.lock);
  pthread_mutex_destroy(&ch->rx.lock);
  pthread_mutex_destroy(&ch->rx.rel_lock);
  pthread_mutex_destroy(&ch->rx.seen_lock);
  free(ch->rx.seen);
  free(ch);
}
