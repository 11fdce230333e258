/*
 * The point-to-point path of MPI channels: MPI on a communicator of the
 * pair, in the records and tags of mpi/mpi_wire.h, for two ranks that do
 * not share a machine. This file opens and closes it and holds its ops
 * table: the sending side is in p2p_send.c, the receiving side in
 * p2p_recv.c; both stage GPU memory through stage.c.
 *
 * Each end keeps one receive posted on TAG_DESC and one on TAG_REL. A
 * message stays in flight from gpuipc_mpi_channel_send until its release
 * came back and its MPI sends completed: `depth` of them at most.
 *
 * GPU memory that MPI cannot read (not CUDA-aware, or memory gpuipc did not
 * allocate) is staged through pinned host memory in a pipeline: the sender
 * queues device->host copies of the chunks on the stream (NEV at most in
 * flight, an event after each) and posts each chunk's MPI_Isend once its
 * copy is done; the receiver keeps NEV chunk receives posted into a ring
 * of staging chunks and queues each chunk's host->device copy as it
 * arrives, reusing a staging chunk once the copy out of it is done. So the
 * copies on both ends overlap the transfer. Staged chunks are 1 to 4 MiB:
 * large enough that a chunk's fixed costs (a copy launch, an event, an MPI
 * message: tens of microseconds) stay a few per cent of its transfer,
 * small enough that filling and draining the pipeline (one chunk's copy
 * on each end) costs little; a message is cut into four at least when it
 * can be. Other messages go in 1 GiB chunks (MPI counts are ints).
 */
#include <errno.h>
#include <sched.h>
#include <string.h>

#include "mpi/mpi_chan.h"

/* ---- opening and closing -------------------------------------------------*/

/* This rank's end: its settings, its message slots and the two receives
 * it keeps posted (releases and descriptors). */
static int open_mpi(struct gpuipc_mpi_channel *ch,
                    const gpuipc_channel_opts_t *opts)
{
  ch->depth = opts && opts->depth ? opts->depth : 64;
  ch->send_timeout_ms = opts->send_timeout_ms == GPUIPC_TIMEOUT_DEFAULT
                            ? ch->dflt_timeout_ms
                            : opts->send_timeout_ms;
  ch->rx_device = -1;
  ch->tx_ev_dev = -1;
  ch->rx_ev_dev = -1;
  int rc = gpuipc__mpi_cuda_aware(&ch->aware);
  if (rc == 0)
    rc = gpuipc__mpi_chunk_setting(&ch->chunk_shift);
  if (rc != 0)
    return rc;
  if (gpuipc_driver_status(NULL) == 0 && gpuipc_device_count() > 0) {
    if (opts && opts->device >= 0 && (opts->device_set || opts->device > 0)) {
      ch->rx_device = opts->device;
    } else {
      int cur = gpuipc__device_current();
      ch->rx_device = cur >= 0 ? cur : 0;
    }
  }
  ch->next_seq = 1;
  ch->rx_seq = 1;
  ch->rel_req = MPI_REQUEST_NULL;
  ch->desc_req = MPI_REQUEST_NULL;
  ch->slots = calloc(ch->depth, sizeof(*ch->slots));
  if (ch->slots == NULL)
    return gpuipc__mpi_fail(-ENOMEM, "no memory for %u message slots",
                            ch->depth);
  int mrc = MPI_Irecv(&ch->rel_w, (int)sizeof(ch->rel_w), MPI_BYTE, ch->peer,
                      TAG_REL, ch->pair, &ch->rel_req);
  if (mrc == MPI_SUCCESS)
    mrc = MPI_Irecv(&ch->desc_w, (int)sizeof(ch->desc_w), MPI_BYTE, ch->peer,
                    TAG_DESC, ch->pair, &ch->desc_req);
  if (mrc != MPI_SUCCESS) {
    rc = gpuipc__mpi_fail_mpi(mrc, "MPI_Irecv");
    gpuipc__mpi_cancel(&ch->rel_req);
    free(ch->slots);
    ch->slots = NULL;
    return rc;
  }
  return 0;
}

/* Both ranks' outcome of open_mpi; where it failed on either, this one's
 * receives are undone. */
static int p2p_open(struct gpuipc_mpi_channel *ch,
                    const gpuipc_channel_opts_t *opts)
{
  int rc = gpuipc__mpi_agree(ch->pair, open_mpi(ch, opts));
  if (rc != 0 && ch->slots != NULL) {
    /* The other rank failed: undo this one's posted receives. */
    gpuipc__mpi_cancel(&ch->rel_req);
    gpuipc__mpi_cancel(&ch->desc_req);
    free(ch->slots);
  }
  return rc;
}

/* Tell the peer, let MPI finish with the bytes in flight, free it all. */
static void p2p_close(struct gpuipc_mpi_channel *ch)
{
  pthread_mutex_lock(&ch->tx_lock);
  pthread_mutex_lock(&ch->rx_lock);
  pthread_mutex_lock(&ch->ack_lock);
  ch->on_release = NULL; /* as gpuipc_channel_close: no calls from here */
  /* Tell both of the peer's sides, after everything sent. */
  struct wire bye[2];
  MPI_Request breq[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  for (int i = 0; i < 2; i++) {
    memset(&bye[i], 0, sizeof(bye[i]));
    bye[i].magic = WIRE_MAGIC;
    bye[i].type = MSG_CLOSE;
    MPI_Isend(&bye[i], (int)sizeof(bye[i]), MPI_BYTE, ch->peer,
              i == 0 ? TAG_DESC : TAG_REL, ch->pair, &breq[i]);
  }
  /* Until the peer has the bytes of every message in flight, or closes:
   * MPI still reads them (the user's buffer, or a staging copy). */
  for (;;) {
    if (gpuipc__mpi_tx_poll(ch) < 0 || ch->tx_gone)
      break;
    bool busy = false;
    for (uint32_t i = 0; i < ch->depth; i++)
      busy |= ch->slots[i].seq != 0 && ch->slots[i].nreq > 0;
    if (!busy)
      break;
    sched_yield();
  }
  for (uint32_t i = 0; i < ch->depth; i++) {
    struct slot *s = &ch->slots[i];
    bool pending = false;
    for (int k = 0; k < s->nreq; k++) {
      int flag = 0;
      MPI_Test(&s->req[k], &flag, MPI_STATUS_IGNORE);
      if (!flag) {
        /* The peer left without taking them: MPI frees the request when
         * it can, and the staging copy must outlive it. */
        MPI_Request_free(&s->req[k]);
        pending = true;
      }
    }
    if (s->stage != NULL && !pending)
      gpuipc_buf_release(s->stage);
    free(s->req);
  }
  free(ch->slots);
  gpuipc__mpi_cancel(&ch->rel_req);
  gpuipc__mpi_cancel(&ch->desc_req);
  MPI_Waitall(2, breq, MPI_STATUSES_IGNORE);
  while (ch->acks != NULL) {
    struct ack *a = ch->acks;
    ch->acks = a->next;
    MPI_Wait(&a->req, MPI_STATUS_IGNORE);
    free(a);
  }
  for (int i = 0; i < ch->ncache; i++)
    gpuipc_buf_release(ch->cache[i]);
  ch->ncache = 0;
  if (ch->rx_stage != NULL)
    gpuipc_buf_release(ch->rx_stage);
  gpuipc__mpi_ev_free(ch->tx_ev, &ch->tx_ev_dev);
  gpuipc__mpi_ev_free(ch->rx_ev, &ch->rx_ev_dev);
  MPI_Comm_free(&ch->pair);
  ch->closed = true;
  pthread_mutex_unlock(&ch->ack_lock);
  pthread_mutex_unlock(&ch->rx_lock);
  pthread_mutex_unlock(&ch->tx_lock);
}

static int p2p_on_release(struct gpuipc_mpi_channel *ch,
                          gpuipc_mpi_release_fn fn, void *user)
{
  release_fn_set(ch, fn, user);
  return 0;
}

const struct gpuipc__mpi_chan_ops gpuipc__mpi_p2p_ops = {
    .open = p2p_open,
    .send = gpuipc__mpi_p2p_send,
    .send_done = gpuipc__mpi_p2p_send_done,
    .send_wait = gpuipc__mpi_p2p_send_wait,
    .on_release = p2p_on_release,
    .progress = gpuipc__mpi_p2p_progress,
    .recv = gpuipc__mpi_p2p_recv,
    .recv_into = gpuipc__mpi_p2p_recv_into,
    .close = p2p_close,
};
