/*
 * gpuipc_mpi: scopes of an MPI communicator (machine, GPU) and a domain of
 * their own for each. Built on the public gpuipc API only, as libgpuipc_mpi.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "mpi/mpi_int.h"

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

/* ---- failure sentences ---------------------------------------------------*/

static __thread char g_err[512];
static __thread int g_err_own; /* 1: g_err; 0: gpuipc_last_error() */

int gpuipc__mpi_fail(int code, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_err, sizeof(g_err), fmt, ap);
  va_end(ap);
  g_err_own = 1;
  return code;
}

/* A failure gpuipc described: its sentence stands. */
int gpuipc__mpi_fail_gpuipc(int code)
{
  g_err_own = 0;
  return code;
}

int gpuipc__mpi_fail_mpi(int mrc, const char *call)
{
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(mrc, msg, &len) != MPI_SUCCESS)
    snprintf(msg, sizeof(msg), "MPI error %d", mrc);
  return gpuipc__mpi_fail(-EIO, "%s failed: %s", call, msg);
}

int gpuipc__mpi_err(int mrc, const char *call)
{
#if defined(MPIX_ERR_PROC_FAILED)
  int cls = 0;
  if (MPI_Error_class(mrc, &cls) == MPI_SUCCESS &&
      cls == MPIX_ERR_PROC_FAILED)
    return gpuipc__mpi_fail(GPUIPC_E_PEER_GONE,
                            "%s: the peer rank has failed", call);
#endif
  return gpuipc__mpi_fail_mpi(mrc, call);
}

void gpuipc__mpi_cancel(MPI_Request *r)
{
  if (*r == MPI_REQUEST_NULL)
    return;
  MPI_Cancel(r);
  MPI_Wait(r, MPI_STATUS_IGNORE);
}

GPUIPC_MPI_API const char *gpuipc_mpi_last_error(void)
{
  return g_err_own ? g_err : gpuipc_last_error();
}

/*
 * The rank of the communicator that a failure already agreed upon came
 * from, so that agreeing on it again (as callers up the stack do) keeps
 * naming that rank. -1: none; reset at the start of every public call.
 */
static __thread int g_agreed_who = -1;

void gpuipc__mpi_call_begin(void)
{
  g_agreed_who = -1;
}

/*
 * agree - every rank of @comm learns the outcome of all: 0 when every rank
 * passed 0, else the code of the lowest rank that failed. A rank that did
 * not fail itself, or failed with another code, gets a sentence naming the
 * rank that did.
 */
int gpuipc__mpi_agree(MPI_Comm comm, int rc)
{
  int rank;
  int mrc = MPI_Comm_rank(comm, &rank);
  if (mrc != MPI_SUCCESS)
    return gpuipc__mpi_fail_mpi(mrc, "MPI_Comm_rank");
  struct {
    int who;
    int code;
  } in = {rc ? (g_agreed_who >= 0 ? g_agreed_who : rank) : INT_MAX, rc}, out;
  mrc = MPI_Allreduce(&in, &out, 1, MPI_2INT, MPI_MINLOC, comm);
  if (mrc != MPI_SUCCESS)
    return gpuipc__mpi_fail_mpi(mrc, "MPI_Allreduce");
  if (out.who == INT_MAX)
    return 0;
  g_agreed_who = out.who;
  /* A rank that failed the same way keeps its own sentence. */
  if (out.who != rank && rc != out.code)
    return gpuipc__mpi_fail(out.code, "rank %d of the communicator failed: "
                            "%s (%s)", out.who, gpuipc_err_name(out.code),
                            gpuipc_strerror(out.code));
  return out.code;
}

/* ---- which machine, which GPU -------------------------------------------*/

const char *gpuipc__mpi_setting(const char *name)
{
  int n = gpuipc_config_count();
  for (int i = 0; i < n; i++) {
    gpuipc_config_item_t item;
    if (gpuipc_config_get(i, &item) == 0 && strcmp(item.name, name) == 0)
      return item.value != NULL ? item.value : "";
  }
  return "";
}

/* The GPUIPC_NODE_ID setting as a non-negative int (0 when unset). */
static int node_id(int *out)
{
  const char *s = gpuipc__mpi_setting("GPUIPC_NODE_ID");
  if (!*s) {
    *out = 0;
    return 0;
  }
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < 0 || v > INT_MAX)
    return gpuipc__mpi_fail(-EINVAL,
                "GPUIPC_NODE_ID=\"%s\": must be a non-negative integer", s);
  *out = (int)v;
  return 0;
}

/*
 * The local ordinal of the device of the CUDA context current on this
 * thread; 0 when none is current.
 */
static int current_ordinal(void)
{
  int ordinal = gpuipc__device_current();
  return ordinal >= 0 ? ordinal : 0;
}

/* This rank's GPU UUID for the DEVICE scope; all zero for the host. */
static void device_uuid(uint8_t uuid[16])
{
  memset(uuid, 0, 16);
  if (gpuipc_driver_status(NULL) != 0)
    return;
  gpuipc_device_info_t info;
  memset(&info, 0, sizeof(info));
  info.size = sizeof(info);
  if (gpuipc_device_info(current_ordinal(), &info) == 0)
    memcpy(uuid, info.uuid, 16);
}

/* ---- scopes --------------------------------------------------------------*/

int gpuipc__mpi_check_comm(MPI_Comm comm)
{
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (!inited || finalized)
    return gpuipc__mpi_fail(-EINVAL, "MPI is %s",
                            inited ? "finalized" : "not initialised");
  if (comm == MPI_COMM_NULL)
    return gpuipc__mpi_fail(-EINVAL, "comm is MPI_COMM_NULL");
  return 0;
}

/* Checks every rank can make alone, before any collective. */
static int check_call(MPI_Comm comm, gpuipc_mpi_scope_t scope)
{
  int rc = gpuipc__mpi_check_comm(comm);
  if (rc)
    return rc;
  if (scope != GPUIPC_MPI_SCOPE_NODE && scope != GPUIPC_MPI_SCOPE_DEVICE)
    return gpuipc__mpi_fail(-EINVAL, "scope %d is neither "
                            "GPUIPC_MPI_SCOPE_NODE nor GPUIPC_MPI_SCOPE_DEVICE",
                            (int)scope);
  return 0;
}

/* Split @comm by @color, keeping the ranks' order. */
static int split(MPI_Comm comm, int color, MPI_Comm *out)
{
  int rank;
  int mrc = MPI_Comm_rank(comm, &rank);
  if (mrc != MPI_SUCCESS)
    return gpuipc__mpi_fail_mpi(mrc, "MPI_Comm_rank");
  mrc = MPI_Comm_split(comm, color, rank, out);
  if (mrc != MPI_SUCCESS)
    return gpuipc__mpi_fail_mpi(mrc, "MPI_Comm_split");
  return 0;
}

/* The ranks of @node (one machine) that use the same GPU as this one. */
static int split_device(MPI_Comm node, MPI_Comm *out)
{
  int size, rank;
  int mrc = MPI_Comm_size(node, &size);
  if (mrc == MPI_SUCCESS)
    mrc = MPI_Comm_rank(node, &rank);
  if (mrc != MPI_SUCCESS)
    return gpuipc__mpi_fail_mpi(mrc, "MPI_Comm_size");
  uint8_t mine[16];
  device_uuid(mine);
  uint8_t *all = malloc((size_t)size * 16);
  if (!all)
    return gpuipc__mpi_fail(-ENOMEM, "no memory for %d GPU UUIDs", size);
  mrc = MPI_Allgather(mine, 16, MPI_BYTE, all, 16, MPI_BYTE, node);
  if (mrc != MPI_SUCCESS) {
    free(all);
    return gpuipc__mpi_fail_mpi(mrc, "MPI_Allgather");
  }
  /* The color is the lowest rank on the same GPU. */
  int color = rank;
  for (int i = 0; i < size; i++)
    if (memcmp(all + (size_t)i * 16, mine, 16) == 0) {
      color = i;
      break;
    }
  free(all);
  return split(node, color, out);
}

/* This rank's communicator of @scope (collective, not agreed). */
static int scope_comm(MPI_Comm comm, gpuipc_mpi_scope_t scope, MPI_Comm *out)
{
  int id = 0;
  int rc = gpuipc__mpi_agree(comm, node_id(&id));
  if (rc)
    return rc;
  int rank;
  int mrc = MPI_Comm_rank(comm, &rank);
  if (mrc != MPI_SUCCESS)
    return gpuipc__mpi_fail_mpi(mrc, "MPI_Comm_rank");
  MPI_Comm shared, node;
  mrc = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL,
                            &shared);
  if (mrc != MPI_SUCCESS)
    return gpuipc__mpi_fail_mpi(mrc,
                                "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
  rc = split(shared, id, &node);
  MPI_Comm_free(&shared);
  if (rc)
    return rc;
  if (scope == GPUIPC_MPI_SCOPE_NODE) {
    *out = node;
    return 0;
  }
  MPI_Comm dev;
  rc = split_device(node, &dev);
  MPI_Comm_free(&node);
  if (rc)
    return rc;
  *out = dev;
  return 0;
}

int gpuipc__mpi_scope_comm(MPI_Comm comm, gpuipc_mpi_scope_t scope,
                           MPI_Comm *out)
{
  MPI_Comm c;
  int mine = scope_comm(comm, scope, &c);
  int rc = gpuipc__mpi_agree(comm, mine);
  if (rc) {
    if (mine == 0)
      MPI_Comm_free(&c);
    return rc;
  }
  *out = c;
  return 0;
}

/*
 * The checks and the split both public entry points begin with, agreed by
 * every rank: on success @sc is this rank's scope communicator.
 */
static int scope_begin(MPI_Comm comm, gpuipc_mpi_scope_t scope,
                       const void *out, MPI_Comm *sc)
{
  g_agreed_who = -1;
  int rc = check_call(comm, scope);
  if (rc)
    return rc;
  rc = gpuipc__mpi_agree(comm,
                         out ? 0 : gpuipc__mpi_fail(-EINVAL, "out is NULL"));
  if (rc)
    return rc;
  return gpuipc__mpi_scope_comm(comm, scope, sc);
}

GPUIPC_MPI_API int gpuipc_mpi_scope_comm(MPI_Comm comm,
                                         gpuipc_mpi_scope_t scope,
                                         MPI_Comm *out)
{
  MPI_Comm c;
  int rc = scope_begin(comm, scope, out, &c);
  if (rc)
    return rc;
  *out = c;
  return 0;
}

/* ---- domains -------------------------------------------------------------*/

/* "mpi-" and 128 random bits in 22 characters, drawn by rank 0 of @scope
 * and broadcast. */
static int domain_name(MPI_Comm scope, char name[GPUIPC_NAME_MAX + 1])
{
  int rank;
  int mrc = MPI_Comm_rank(scope, &rank);
  if (mrc != MPI_SUCCESS)
    return gpuipc__mpi_fail_mpi(mrc, "MPI_Comm_rank");
  /* The drawing rank's status travels with the bytes. */
  struct {
    int32_t rc;
    uint8_t id[16];
  } msg;
  memset(&msg, 0, sizeof(msg));
  if (rank == 0) {
    size_t got = 0;
    while (got < sizeof(msg.id)) {
      ssize_t n = getrandom(msg.id + got, sizeof(msg.id) - got, 0);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0) {
        msg.rc = gpuipc__mpi_fail(-errno, "getrandom for the domain's name: %s",
                      strerror(errno));
        break;
      }
      got += (size_t)n;
    }
  }
  mrc = MPI_Bcast(&msg, (int)sizeof(msg), MPI_BYTE, 0, scope);
  if (mrc != MPI_SUCCESS)
    return gpuipc__mpi_fail_mpi(mrc, "MPI_Bcast of the domain's name");
  if (msg.rc)
    return rank == 0 ? msg.rc
                     : gpuipc__mpi_fail(msg.rc, "rank 0 of the scope could not "
                                        "draw the domain's name: %s",
                                        gpuipc_strerror(msg.rc));
  /* 6 bits a character: short names leave room in socket paths. */
  static const char digits[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-";
  char *p = name + snprintf(name, GPUIPC_NAME_MAX + 1, "mpi-");
  for (int bit = 0; bit < 128; bit += 6) {
    unsigned v = 0;
    for (int b = bit; b < bit + 6; b++)
      v = v << 1 | (b < 128 ? (msg.id[b / 8] >> (7 - b % 8)) & 1u : 0u);
    *p++ = digits[v];
  }
  *p = '\0';
  return 0;
}

/*
 * Rank 0 of @scope joins first, so that it hosts the broker; the others
 * join once it has (its status, broadcast, is the barrier).
 */
static int join_in_order(MPI_Comm scope, const char *name,
                         gpuipc_domain_t **out)
{
  int rank;
  int mrc = MPI_Comm_rank(scope, &rank);
  if (mrc != MPI_SUCCESS)
    return gpuipc__mpi_fail_mpi(mrc, "MPI_Comm_rank");
  gpuipc_domain_t *dom = NULL;
  int rc = 0;
  if (rank == 0) {
    rc = gpuipc_domain_join(name, NULL, &dom);
    if (rc)
      gpuipc__mpi_fail_gpuipc(rc);
  }
  int first = rc;
  mrc = MPI_Bcast(&first, 1, MPI_INT, 0, scope);
  if (mrc != MPI_SUCCESS) {
    rc = gpuipc__mpi_fail_mpi(mrc, "MPI_Bcast of the first join's status");
    goto leave;
  }
  if (first) {
    if (rank != 0)
      rc = gpuipc__mpi_fail(first, "rank 0 of the scope could not join "
                            "domain %s: %s", name, gpuipc_strerror(first));
    return rc;
  }
  if (rank != 0) {
    rc = gpuipc_domain_join(name, NULL, &dom);
    if (rc)
      return gpuipc__mpi_fail_gpuipc(rc);
  }
  *out = dom;
  return 0;
leave:
  if (dom)
    gpuipc_domain_leave(dom);
  return rc;
}

int gpuipc__mpi_join_new(MPI_Comm scope, gpuipc_domain_t **out)
{
  char name[GPUIPC_NAME_MAX + 1];
  int rc = domain_name(scope, name);
  return rc ? rc : join_in_order(scope, name, out);
}

GPUIPC_MPI_API int gpuipc_mpi_domain_join(MPI_Comm comm,
                                          gpuipc_mpi_scope_t scope,
                                          gpuipc_domain_t **out)
{
  MPI_Comm sc;
  int rc = scope_begin(comm, scope, out, &sc);
  if (rc)
    return rc;
  gpuipc_domain_t *dom = NULL;
  rc = gpuipc__mpi_join_new(sc, &dom);
  MPI_Comm_free(&sc);
  rc = gpuipc__mpi_agree(comm, rc);
  if (rc) {
    if (dom)
      gpuipc_domain_leave(dom);
    return rc;
  }
  *out = dom;
  return 0;
}
