/*
 * Whether a channel belongs to this process or to the parent it was forked
 * from (gpuipc__chan_stale), and the error every call but a close and a
 * view's release gives on the parent's (gpuipc__chan_stale_err). Kept apart
 * so that open.c, send.c, recv.c and poll.c all depend on it and not on
 * each other.
 */
#include "channel/channel.h"
#include "domain/domain.h"

bool gpuipc__chan_stale(const struct gpuipc_channel *ch)
{
  return ch->fork_gen != gpuipc__fork_gen();
}

int gpuipc__chan_stale_err(const struct gpuipc_channel *ch, const char *who)
{
  return gpuipc__err(GPUIPC_E_CLOSED, "%s: channel %s was opened by the "
                     "parent of this process (before fork()); only "
                     "gpuipc_channel_close and gpuipc_tensor_release are "
                     "left to do on it", who, ch->name);
}
