/*
 * Channels between two ranks of a communicator: a gpuipc channel in a
 * domain of the pair's own when the two share a machine (shm.c), else MPI
 * point-to-point on a communicator of the pair (p2p.c, p2p_send.c,
 * p2p_recv.c). This file holds the public calls: it checks their
 * arguments, opens the pair and picks the path, whose ops table
 * (mpi_chan.h) does the rest.
 */
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/mpi_chan.h"


/* ---- opening -------------------------------------------------------------*/

/* A timeout under the public rule: -EINVAL below GPUIPC_TIMEOUT_DEFAULT. */
static int check_timeout(const char *who, const char *what, int ms)
{
  if (ms < GPUIPC_TIMEOUT_DEFAULT)
    return gpuipc__mpi_fail(-EINVAL, "%s: %s %d is not a count of ms, 0, "
                            "GPUIPC_TIMEOUT_FOREVER (-1) or "
                            "GPUIPC_TIMEOUT_DEFAULT (-2)", who, what, ms);
  return 0;
}

/*
 * What GPUIPC_TIMEOUT_DEFAULT means on the MPI path, which has no domain:
 * the GPUIPC_TIMEOUT_MS setting, as a domain joined with defaults takes
 * it (-1: forever).
 */
static int default_timeout(void)
{
  const char *s = gpuipc__mpi_setting("GPUIPC_TIMEOUT_MS");
  char *end;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end != '\0' || v < 0 || v > INT_MAX)
    return 10000;
  return (int)v;
}

/*
 * The caller's @opts (NULL, or a prefix of the struct: the fields beyond
 * take their defaults) as a whole struct in *@o, checked.
 */
static int read_opts(const gpuipc_channel_opts_t *opts,
                     gpuipc_channel_opts_t *o)
{
  static const char who[] = "gpuipc_mpi_channel_open";
  *o = (gpuipc_channel_opts_t)GPUIPC_CHANNEL_OPTS_INIT;
  if (opts == NULL)
    return 0;
  if (opts->size < sizeof(size_t))
    return gpuipc__mpi_fail(-EINVAL, "opts->size %zu is too small",
                            opts->size);
  memcpy(o, opts, opts->size < sizeof(*o) ? opts->size : sizeof(*o));
  o->size = sizeof(*o);
  int rc = check_timeout(who, "opts->timeout_ms", o->timeout_ms);
  if (rc == 0)
    rc = check_timeout(who, "opts->send_timeout_ms", o->send_timeout_ms);
  return rc;
}

static int check_opts(const gpuipc_channel_opts_t *o)
{
  if (o->flags != 0)
    return gpuipc__mpi_fail(-EINVAL, "opts->flags 0x%x: reserved, must be 0",
                            o->flags);
  if (o->depth != 0 && (o->depth > GPUIPC_CHANNEL_DEPTH_MAX ||
                        (o->depth & (o->depth - 1)) != 0))
    return gpuipc__mpi_fail(-EINVAL, "opts->depth %u is not a power of two "
                            "in 1..%d", o->depth, GPUIPC_CHANNEL_DEPTH_MAX);
  return 0;
}

/* The communicator of the two ranks, erroring by return codes. */
static int make_pair(MPI_Comm comm, int me, int peer, int tag, MPI_Comm *out)
{
  MPI_Group all, two;
  int ranks[2] = {me < peer ? me : peer, me < peer ? peer : me};
  int mrc = MPI_Comm_group(comm, &all);
  if (mrc != MPI_SUCCESS)
    return gpuipc__mpi_fail_mpi(mrc, "MPI_Comm_group");
  mrc = MPI_Group_incl(all, 2, ranks, &two);
  MPI_Group_free(&all);
  if (mrc != MPI_SUCCESS)
    return gpuipc__mpi_fail_mpi(mrc, "MPI_Group_incl");
  MPI_Comm pair;
  mrc = MPI_Comm_create_group(comm, two, tag, &pair);
  MPI_Group_free(&two);
  if (mrc != MPI_SUCCESS)
    return gpuipc__mpi_fail_mpi(mrc, "MPI_Comm_create_group");
  mrc = MPI_Comm_set_errhandler(pair, MPI_ERRORS_RETURN);
  if (mrc != MPI_SUCCESS) {
    MPI_Comm_free(&pair);
    return gpuipc__mpi_fail_mpi(mrc, "MPI_Comm_set_errhandler");
  }
  *out = pair;
  return 0;
}

GPUIPC_MPI_API int gpuipc_mpi_channel_open(MPI_Comm comm, int peer, int tag,
                                           const gpuipc_channel_opts_t *opts,
                                           gpuipc_mpi_channel_t **out)
{
  gpuipc__mpi_call_begin();
  int rc = gpuipc__mpi_check_comm(comm);
  if (rc != 0)
    return rc;
  int me, size, *ub = NULL, flag = 0;
  int mrc = MPI_Comm_rank(comm, &me);
  if (mrc == MPI_SUCCESS)
    mrc = MPI_Comm_size(comm, &size);
  if (mrc == MPI_SUCCESS)
    mrc = MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  if (mrc != MPI_SUCCESS)
    return gpuipc__mpi_fail_mpi(mrc, "MPI_Comm_rank");
  if (peer < 0 || peer >= size || peer == me)
    return gpuipc__mpi_fail(-EINVAL, "peer %d is not another rank of the "
                            "%d-rank communicator (this is rank %d)", peer,
                            size, me);
  if (tag < 0 || (flag && ub && tag > *ub))
    return gpuipc__mpi_fail(-EINVAL, "tag %d is outside 0..MPI_TAG_UB", tag);
  /* Checks that one rank alone fails are agreed on after the pair exists:
   * both then return the same code. */
  gpuipc_channel_opts_t o;
  rc = out == NULL ? gpuipc__mpi_fail(-EINVAL, "out is NULL")
                   : read_opts(opts, &o);
  if (rc == 0)
    rc = check_opts(&o);
  struct gpuipc_mpi_channel *ch = calloc(1, sizeof(*ch));
  if (ch == NULL && rc == 0)
    rc = gpuipc__mpi_fail(-ENOMEM, "no memory for a channel");
  MPI_Comm pair;
  int prc = make_pair(comm, me, peer, tag, &pair);
  if (prc != 0) {
    free(ch);
    return prc;
  }
  rc = gpuipc__mpi_agree(pair, rc);
  if (rc != 0)
    goto free_pair;
  ch->pair = pair;
  ch->peer = me < peer ? 1 : 0;
  ch->refs = 1;
  ch->dflt_timeout_ms = default_timeout();
  pthread_mutex_init(&ch->tx_lock, NULL);
  pthread_mutex_init(&ch->rx_lock, NULL);
  pthread_mutex_init(&ch->ack_lock, NULL);

  MPI_Comm node;
  rc = gpuipc__mpi_scope_comm(pair, GPUIPC_MPI_SCOPE_NODE, &node);
  if (rc != 0)
    goto destroy;
  int nsize = 0;
  mrc = MPI_Comm_size(node, &nsize);
  MPI_Comm_free(&node);
  rc = mrc == MPI_SUCCESS ? 0 : gpuipc__mpi_fail_mpi(mrc, "MPI_Comm_size");
  rc = gpuipc__mpi_agree(pair, rc);
  if (rc != 0)
    goto destroy;
  ch->ops = nsize == 2 ? &gpuipc__mpi_shm_ops : &gpuipc__mpi_p2p_ops;
  rc = ch->ops->open(ch, &o);
  if (rc != 0)
    goto destroy;
  *out = ch;
  return 0;
destroy:
  pthread_mutex_destroy(&ch->tx_lock);
  pthread_mutex_destroy(&ch->rx_lock);
  pthread_mutex_destroy(&ch->ack_lock);
free_pair:
  MPI_Comm_free(&pair);
  free(ch);
  return rc;
}

GPUIPC_MPI_API gpuipc_channel_t *
gpuipc_mpi_channel_shm(gpuipc_mpi_channel_t *ch)
{
  return ch ? ch->shm : NULL;
}

/* ---- sending -------------------------------------------------------------*/

/*
 * A call's timeout, checked; on the MPI path GPUIPC_TIMEOUT_DEFAULT becomes
 * the channel's default (the shared-memory path's gpuipc channel takes its
 * domain's itself).
 */
static int call_timeout(const struct gpuipc_mpi_channel *ch, const char *who,
                        int *timeout_ms)
{
  int rc = check_timeout(who, "timeout_ms", *timeout_ms);
  if (rc == 0 && ch->shm == NULL && *timeout_ms == GPUIPC_TIMEOUT_DEFAULT)
    *timeout_ms = ch->dflt_timeout_ms;
  return rc;
}

GPUIPC_MPI_API int gpuipc_mpi_channel_send(gpuipc_mpi_channel_t *ch,
                                   const gpuipc_tensor_t *t, void *stream,
                                   unsigned flags, uint64_t *ticket)
{
  gpuipc__mpi_call_begin();
  if (ch == NULL || t == NULL)
    return gpuipc__mpi_fail(-EINVAL, "gpuipc_mpi_channel_send: NULL %s",
                            ch == NULL ? "channel" : "tensor");
  return ch->ops->send(ch, t, stream, flags, ticket);
}

GPUIPC_MPI_API int gpuipc_mpi_channel_send_done(gpuipc_mpi_channel_t *ch,
                                        uint64_t ticket, int timeout_ms)
{
  gpuipc__mpi_call_begin();
  if (ch == NULL)
    return gpuipc__mpi_fail(-EINVAL,
                            "gpuipc_mpi_channel_send_done: NULL channel");
  int rc = call_timeout(ch, "gpuipc_mpi_channel_send_done", &timeout_ms);
  return rc != 0 ? rc : ch->ops->send_done(ch, ticket, timeout_ms);
}

GPUIPC_MPI_API int gpuipc_mpi_channel_send_wait(gpuipc_mpi_channel_t *ch,
                                        uint64_t ticket, void *stream,
                                        int timeout_ms)
{
  gpuipc__mpi_call_begin();
  if (ch == NULL)
    return gpuipc__mpi_fail(-EINVAL,
                            "gpuipc_mpi_channel_send_wait: NULL channel");
  int rc = call_timeout(ch, "gpuipc_mpi_channel_send_wait", &timeout_ms);
  return rc != 0 ? rc : ch->ops->send_wait(ch, ticket, stream, timeout_ms);
}

GPUIPC_MPI_API int gpuipc_mpi_channel_on_release(gpuipc_mpi_channel_t *ch,
                                                 gpuipc_mpi_release_fn fn,
                                                 void *user)
{
  gpuipc__mpi_call_begin();
  if (ch == NULL)
    return gpuipc__mpi_fail(-EINVAL,
                            "gpuipc_mpi_channel_on_release: NULL channel");
  return ch->ops->on_release(ch, fn, user);
}

GPUIPC_MPI_API int gpuipc_mpi_channel_progress(gpuipc_mpi_channel_t *ch)
{
  gpuipc__mpi_call_begin();
  if (ch == NULL)
    return gpuipc__mpi_fail(-EINVAL,
                            "gpuipc_mpi_channel_progress: NULL channel");
  return ch->ops->progress(ch);
}

/* ---- receiving -----------------------------------------------------------*/

GPUIPC_MPI_API int gpuipc_mpi_channel_recv(gpuipc_mpi_channel_t *ch,
                                   gpuipc_tensor_t **view, void *stream,
                                   int timeout_ms)
{
  gpuipc__mpi_call_begin();
  if (ch == NULL || view == NULL)
    return gpuipc__mpi_fail(-EINVAL, "gpuipc_mpi_channel_recv: NULL %s",
                            ch == NULL ? "channel" : "view");
  int rc = call_timeout(ch, "gpuipc_mpi_channel_recv", &timeout_ms);
  return rc != 0 ? rc : ch->ops->recv(ch, view, stream, timeout_ms);
}

GPUIPC_MPI_API int gpuipc_mpi_channel_recv_into(gpuipc_mpi_channel_t *ch,
                                        const gpuipc_tensor_t *dst,
                                        void *stream, int timeout_ms)
{
  gpuipc__mpi_call_begin();
  if (ch == NULL || dst == NULL)
    return gpuipc__mpi_fail(-EINVAL, "gpuipc_mpi_channel_recv_into: NULL %s",
                            ch == NULL ? "channel" : "destination");
  int rc = call_timeout(ch, "gpuipc_mpi_channel_recv_into", &timeout_ms);
  return rc != 0 ? rc : ch->ops->recv_into(ch, dst, stream, timeout_ms);
}

GPUIPC_MPI_API int gpuipc_mpi_tensor_release(gpuipc_tensor_t *view,
                                             void *stream)
{
  gpuipc__mpi_call_begin();
  if (view == NULL)
    return gpuipc__mpi_fail(-EINVAL, "gpuipc_mpi_tensor_release: NULL view");
  if (gpuipc__mpi_is_view(view))
    return gpuipc__mpi_view_release(view, stream);
  int rc = gpuipc_tensor_release(view, stream);
  return rc ? gpuipc__mpi_fail_gpuipc(rc) : 0;
}

/* ---- closing -------------------------------------------------------------*/

GPUIPC_MPI_API int gpuipc_mpi_channel_close(gpuipc_mpi_channel_t *ch)
{
  gpuipc__mpi_call_begin();
  if (ch == NULL)
    return gpuipc__mpi_fail(-EINVAL, "gpuipc_mpi_channel_close: NULL channel");
  ch->ops->close(ch);
  ch_unref(ch);
  return 0;
}
