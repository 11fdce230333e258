/*
 * The shared-memory path of MPI channels: for two ranks on one machine, a
 * gpuipc channel ("c") in a domain of the pair's own. Each call is the
 * gpuipc channel's, its failure recorded for gpuipc_mpi_last_error().
 */
#include "mpi/mpi_chan.h"

/* A gpuipc call's outcome, as the MPI channel's. */
static int shm_rc(int rc)
{
  return rc < 0 ? gpuipc__mpi_fail_gpuipc(rc) : rc;
}

/* Shared memory: a domain of the pair's own, and channel "c" in it. */
static int open_shm(struct gpuipc_mpi_channel *ch,
                    const gpuipc_channel_opts_t *opts)
{
  int rc = gpuipc__mpi_join_new(ch->pair, &ch->dom);
  rc = gpuipc__mpi_agree(ch->pair, rc);
  if (rc != 0)
    goto leave;
  rc = gpuipc_channel_open(ch->dom, "c", opts, &ch->shm);
  if (rc != 0)
    gpuipc__mpi_fail_gpuipc(rc);
  rc = gpuipc__mpi_agree(ch->pair, rc);
  if (rc == 0) {
    /* The pair's communicator is no longer needed. */
    MPI_Comm_free(&ch->pair);
    ch->pair = MPI_COMM_NULL;
    return 0;
  }
  if (ch->shm)
    gpuipc_channel_close(ch->shm);
  ch->shm = NULL;
leave:
  if (ch->dom)
    gpuipc_domain_leave(ch->dom);
  ch->dom = NULL;
  return rc;
}

static int shm_send(struct gpuipc_mpi_channel *ch, const gpuipc_tensor_t *t,
                    void *stream, unsigned flags, uint64_t *ticket)
{
  return shm_rc(gpuipc_channel_send(ch->shm, t, stream, flags, ticket));
}

static int shm_send_done(struct gpuipc_mpi_channel *ch, uint64_t ticket,
                         int timeout_ms)
{
  return shm_rc(gpuipc_channel_send_done(ch->shm, ticket, timeout_ms));
}

static int shm_send_wait(struct gpuipc_mpi_channel *ch, uint64_t ticket,
                         void *stream, int timeout_ms)
{
  return shm_rc(gpuipc_channel_send_wait(ch->shm, ticket, stream,
                                         timeout_ms));
}

/* The shared-memory path's callback, handed on with the MPI channel. */
static void shm_released(gpuipc_channel_t *shm, uint64_t ticket, void *user)
{
  struct gpuipc_mpi_channel *ch = user;
  (void)shm;
  ch->on_release(ch, ticket, ch->on_release_user);
}

static int shm_on_release(struct gpuipc_mpi_channel *ch,
                          gpuipc_mpi_release_fn fn, void *user)
{
  /* The callback runs under the gpuipc channel's send lock, which
   * gpuipc_channel_on_release takes: clearing it there first means no call
   * reads the fields while they change. */
  int rc = gpuipc_channel_on_release(ch->shm, NULL, NULL);
  release_fn_set(ch, fn, user);
  if (rc == 0 && fn != NULL)
    rc = gpuipc_channel_on_release(ch->shm, shm_released, ch);
  return shm_rc(rc);
}

static int shm_progress(struct gpuipc_mpi_channel *ch)
{
  return shm_rc(gpuipc_channel_progress(ch->shm));
}

static int shm_recv(struct gpuipc_mpi_channel *ch, gpuipc_tensor_t **view,
                    void *stream, int timeout_ms)
{
  return shm_rc(gpuipc_channel_recv(ch->shm, view, stream, timeout_ms));
}

static int shm_recv_into(struct gpuipc_mpi_channel *ch,
                         const gpuipc_tensor_t *dst, void *stream,
                         int timeout_ms)
{
  return shm_rc(gpuipc_channel_recv_into(ch->shm, dst, stream, timeout_ms));
}

static void shm_close(struct gpuipc_mpi_channel *ch)
{
  gpuipc_channel_close(ch->shm);
  gpuipc_domain_leave(ch->dom);
}

const struct gpuipc__mpi_chan_ops gpuipc__mpi_shm_ops = {
    .open = open_shm,
    .send = shm_send,
    .send_done = shm_send_done,
    .send_wait = shm_send_wait,
    .on_release = shm_on_release,
    .progress = shm_progress,
    .recv = shm_recv,
    .recv_into = shm_recv_into,
    .close = shm_close,
};
