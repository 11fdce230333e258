/*
 * Channels: the buffers the receiver holds for the sender's messages, by
 * the sender's key (the receiving side of known.c): imported from the
 * buffer message the sender queued on the socket before the descriptor
 * (or block list) that announces it, dropped when a message forgets it.
 * Used by recv.c and blocks_rx.c, under the receive lock.
 */
#include "channel/channel.h"
#include "mem/mem.h"
#include "os/os.h"

static gpuipc_buf_t *rxbuf_find(struct gpuipc__rx *rx, uint64_t key, int *at)
{
  int i = rx->last_buf;
  if (i < rx->nbufs && rx->bufs[i].key == key) {
    *at = i;
    return rx->bufs[i].buf;
  }
  for (i = 0; i < rx->nbufs; i++)
    if (rx->bufs[i].key == key) {
      rx->last_buf = i;
      *at = i;
      return rx->bufs[i].buf;
    }
  return NULL;
}

gpuipc_buf_t *gpuipc__chan_rx_buf(struct gpuipc_channel *ch, uint64_t key)
{
  int at;
  return rxbuf_find(&ch->rx, key, &at);
}

/*
 * Read the buffer message of key @want (announced by message @seq) from
 * the socket and import it. The sender queued it before publishing the
 * message, so it is read without waiting.
 */
int gpuipc__chan_rx_import(struct gpuipc_channel *ch, uint64_t seq,
                           uint64_t want, const char *who)
{
  struct gpuipc__rx *rx = &ch->rx;
  uint8_t msg[GPUIPC__BUFMSG_BYTES + 16];
  int fds[1] = {-1}, nfds = 1, at;
  ssize_t n = gpuipc__sock_recv(ch->sock, msg, sizeof(msg), fds, &nfds, 0);
  if (n == -ETIMEDOUT)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: message %llu announced buffer "
                       "key %llu, but its buffer message is not on the "
                       "socket (a sender queues it before the descriptor)",
                       who, (unsigned long long)seq, (unsigned long long)want);
  if (n < 0) {
    if (n == GPUIPC_E_PEER_GONE)
      gpuipc__chan_break(ch, (int)n);
    return gpuipc__err((int)n, "%s: message %llu announced a buffer that "
                       "did not arrive on the socket", who,
                       (unsigned long long)seq);
  }
  int fd = nfds > 0 ? fds[0] : -1;
  uint64_t key;
  gpuipc_handle_t h;
  int rc = gpuipc__bufmsg_decode(msg, (size_t)n, &key, &h, who);
  if (rc == 0 && key != want)
    rc = gpuipc__err(GPUIPC_E_PROTO, "%s: buffer message for key %llu where "
                     "message %llu announced key %llu", who,
                     (unsigned long long)key, (unsigned long long)seq,
                     (unsigned long long)want);
  if (rc == 0 && rxbuf_find(rx, key, &at) != NULL)
    rc = gpuipc__err(GPUIPC_E_PROTO, "%s: buffer key %llu sent twice", who,
                     (unsigned long long)key);
  bool want_fd = h.type == GPUIPC_HT_POSIX_FD || h.type == GPUIPC_HT_POOL;
  if (rc == 0 && want_fd != (fd >= 0))
    rc = gpuipc__err(GPUIPC_E_PROTO, "%s: buffer key %llu came %s a "
                     "descriptor", who, (unsigned long long)key,
                     fd >= 0 ? "with" : "without");
  if (rc == 0 && rx->nbufs == GPUIPC__CHAN_BUFS)
    rc = gpuipc__err(GPUIPC_E_PROTO, "%s: the peer sent more than %d "
                     "buffers without forgetting any", who,
                     GPUIPC__CHAN_BUFS);
  if (rc != 0) {
    gpuipc__fd_close(&fd);
    return rc;
  }
  h.fd = fd;
  gpuipc_buf_t *b;
  /* The fd is the import's when it succeeds: kept (VMM) or closed. It
   * came with MSG_CMSG_CLOEXEC (os/sock.c). */
  rc = gpuipc__buf_import(&h, h.kind == GPUIPC_KIND_HOST ? -1 : ch->device,
                          GPUIPC_BUF_TAKE_FD | GPUIPC__BUF_FD_CLOEXEC, &b);
  if (rc != 0) {
    gpuipc__fd_close(&fd);
    return rc;
  }
  rx->bufs[rx->nbufs].key = key;
  rx->bufs[rx->nbufs].buf = b;
  rx->last_buf = rx->nbufs++;
  rx->bufs_imported++;
  return 0;
}

int gpuipc__chan_rx_forget(struct gpuipc_channel *ch, uint64_t seq,
                           uint64_t key, const char *who)
{
  struct gpuipc__rx *rx = &ch->rx;
  int at;
  gpuipc_buf_t *old = rxbuf_find(rx, key, &at);
  if (old == NULL)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: message %llu forgets buffer key "
                       "%llu, which was never sent", who,
                       (unsigned long long)seq, (unsigned long long)key);
  gpuipc_buf_release(old); /* views hold references of their own */
  rx->bufs[at] = rx->bufs[--rx->nbufs];
  rx->last_buf = 0;
  return 0;
}
