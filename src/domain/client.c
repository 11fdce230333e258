/*
 * A domain member's life: joining (connect, or become the broker:
 * client_connect.c; then start the reader thread: client_reader.c),
 * leaving (which hands a hosted broker over), the public info call, and
 * what fork() does to a member (each joined domain registers its state
 * lock with fork.c). Requests and posts are client_call.c's; the state
 * these files share is in member.h. What a member holds (segments)
 * listens through struct gpuipc__dom_listener; the member side calls no
 * segment code.
 */
#include "domain/member.h"
#include "os/os.h"

#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DOM_OF_HOOK(h)                                                     \
  ((struct gpuipc_domain *)((char *)(h) -                                  \
                            offsetof(struct gpuipc_domain, fork_hook)))

/* fork() must not find a domain's state lock held by another thread. */
static void fork_lock(struct gpuipc__fork_hook *h)
{
  struct gpuipc_domain *d = DOM_OF_HOOK(h);
  pthread_mutex_lock(&d->mu);
}

static void fork_unlock(struct gpuipc__fork_hook *h)
{
  struct gpuipc_domain *d = DOM_OF_HOOK(h);
  pthread_mutex_unlock(&d->mu);
}

/* Remove the channel sockets that killed channel ends left behind. */
static void prune_channels(const struct gpuipc_domain *d)
{
  int n = gpuipc__rundir_prune(d->paths.dir, GPUIPC__PRUNE_CHANNELS, NULL,
                               NULL);
  if (n > 0)
    GPUIPC_LOG_I("domain %s: removed %d stale channel socket%s from %s",
                 d->name, n, n == 1 ? "" : "s", d->paths.dir);
}

static void dom_free(struct gpuipc_domain *d)
{
  gpuipc__dom_orphans_forget(d);
  gpuipc__fd_close(&d->wake[0]);
  gpuipc__fd_close(&d->wake[1]);
  gpuipc__fd_close(&d->fd);
  pthread_mutex_destroy(&d->mu);
  pthread_mutex_destroy(&d->send_mu);
  pthread_cond_destroy(&d->cv);
  free(d);
}

int gpuipc_domain_join(const char *name, const gpuipc_domain_opts_t *opts,
                       gpuipc_domain_t **out)
{
  if (out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_domain_join: out is NULL");
  int rc = gpuipc__name_check(name, "gpuipc_domain_join: domain name");
  if (rc != 0)
    return rc;
  /* The settings a member (and, after a failover, its broker) lives by. */
  static const gpuipc__cfg_t used[] = {
      GPUIPC_CFG_TIMEOUT_MS, GPUIPC_CFG_ALLOW_UIDS, GPUIPC_CFG_ALLOW_GIDS,
      GPUIPC_CFG_MAX_MEMBERS, GPUIPC_CFG_MAX_MEMBERS_PER_UID};
  for (size_t i = 0; i < GPUIPC__ARRAY_SIZE(used); i++)
    if ((rc = gpuipc__cfg_check(used[i])) != 0)
      return rc;
  unsigned flags = 0;
  int timeout = (int)gpuipc__cfg_long(GPUIPC_CFG_TIMEOUT_MS, 10000);
  if (opts != NULL) {
    gpuipc_domain_opts_t o = {.size = sizeof(o)};
    if ((rc = gpuipc__size_check(opts->size, "gpuipc_domain_join: opts")))
      return rc;
    gpuipc__opts_read(&o, sizeof(o), opts, opts->size);
    if (o.flags & ~GPUIPC_JOIN_NO_BROKER)
      return gpuipc__err(-EINVAL, "gpuipc_domain_join: unknown flags 0x%x",
                         o.flags & ~GPUIPC_JOIN_NO_BROKER);
    if (o.timeout_ms < GPUIPC_TIMEOUT_DEFAULT)
      return gpuipc__err(-EINVAL, "gpuipc_domain_join: timeout_ms %d (a "
                         "count of ms, GPUIPC_TIMEOUT_FOREVER or "
                         "GPUIPC_TIMEOUT_DEFAULT)", o.timeout_ms);
    flags = o.flags;
    /* 0 as GPUIPC_TIMEOUT_DEFAULT: a domain that never waits could
     * answer no request, and zeroed options must keep working. */
    if (o.timeout_ms != GPUIPC_TIMEOUT_DEFAULT && o.timeout_ms != 0)
      timeout = o.timeout_ms;
  }
  struct gpuipc_domain *d = calloc(1, sizeof(*d));
  if (d == NULL)
    return gpuipc__err(-ENOMEM, "gpuipc_domain_join: out of memory");
  d->fd = d->wake[0] = d->wake[1] = -1;
  d->ho.init.lock_fd = d->ho.init.listen_fd = -1;
  pthread_mutex_init(&d->mu, NULL);
  pthread_mutex_init(&d->send_mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&d->cv, &ca);
  pthread_condattr_destroy(&ca);
  snprintf(d->name, sizeof(d->name), "%s", name);
  d->flags = flags;
  d->timeout_ms = timeout;
  d->token = gpuipc__random_u64();
  d->gen = 1;

  rc = gpuipc__dom_paths(name, &d->paths); /* installs the fork handlers */
  if (rc != 0)
    goto free_d;
  if (!(flags & GPUIPC_JOIN_NO_BROKER)) /* a look (gpuipc ls) removes none */
    prune_channels(d);
  d->fork_gen = gpuipc__fork_gen();
  if (pipe2(d->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    rc = gpuipc__err_errno(errno, "gpuipc_domain_join: pipe2");
    goto free_d;
  }
  /* A member holds a descriptor for each buffer it imports: the table
   * grows now, on a thread of the library, not in a first transfer
   * (os.h). */
  gpuipc__fd_table_early();
  int fd = -1;
  rc = gpuipc__dom_connect(d, gpuipc__deadline(timeout), false, &fd);
  if (rc != 0)
    goto stop_broker;
  d->fd = fd;
  d->fd_gen = d->gen;
  d->state = DOM_UP;

  rc = gpuipc__thread_start(&d->reader, false, gpuipc__dom_reader_main, d);
  if (rc != 0) {
    rc = gpuipc__err_errno(rc, "gpuipc_domain_join: pthread_create");
    goto stop_broker;
  }
  d->reader_started = true;
  d->fork_hook.prepare = fork_lock;
  d->fork_hook.parent = d->fork_hook.child = fork_unlock;
  gpuipc__fork_register(&d->fork_hook);
  GPUIPC_LOG_D("domain %s: joined (broker pid %u)", d->name, d->broker_pid);
  *out = d;
  return 0;

stop_broker:
  if (d->broker != NULL) {
    gpuipc__fd_close(&d->fd);
    gpuipc__broker_stop(d->broker);
  }
free_d:
  dom_free(d);
  return rc;
}

int gpuipc_domain_leave(gpuipc_domain_t *d)
{
  if (d == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_domain_leave: dom is NULL");
  const struct gpuipc__dom_listener *l = atomic_load(&d->listener);
  if (l != NULL && l->on_leave != NULL)
    l->on_leave(d);
  gpuipc__fork_unregister(&d->fork_hook);
  if (gpuipc__dom_stale(d)) {
    /*
     * The parent's: its threads are not here, and its connection and
     * broker descriptors were closed at fork() (their numbers may be
     * reused since). Free what is ours only.
     */
    gpuipc__fd_close(&d->wake[0]);
    gpuipc__fd_close(&d->wake[1]);
    gpuipc__dom_orphans_forget(d);
    free(d);
    return 0;
  }
  atomic_store(&d->leaving, true);
  pthread_mutex_lock(&d->mu);
  d->state = DOM_CLOSED;
  for (struct pending *p = d->pending; p != NULL; p = p->next)
    p->done = GPUIPC_E_CLOSED;
  d->pending = NULL;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
  char c = 1;
  while (write(d->wake[1], &c, 1) < 0 && errno == EINTR)
    ;
  if (d->reader_started)
    pthread_join(d->reader, NULL);
  pthread_mutex_lock(&d->send_mu);
  gpuipc__fd_close(&d->fd);
  pthread_mutex_unlock(&d->send_mu);
  gpuipc__handoff_discard(&d->ho);
  if (d->broker != NULL)
    gpuipc__broker_stop(d->broker); /* hands the domain over */
  dom_free(d);
  return 0;
}

int gpuipc_domain_info(gpuipc_domain_t *d, gpuipc_domain_info_t *out)
{
  if (d == NULL || out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_domain_info: NULL argument");
  int rc = gpuipc__size_check(out->size, "gpuipc_domain_info: out");
  if (rc != 0)
    return rc;
  struct gpuipc__reply *r = malloc(sizeof(*r));
  if (r == NULL)
    return gpuipc__err(-ENOMEM, "gpuipc_domain_info: out of memory");
  struct gpuipc__msg *m = malloc(sizeof(*m));
  if (m == NULL) {
    free(r);
    return gpuipc__err(-ENOMEM, "gpuipc_domain_info: out of memory");
  }
  uint64_t deadline = gpuipc__deadline(d->timeout_ms);
  do { /* a broker that changed meanwhile: ask the next one */
    memset(&m->u.list, 0, sizeof(m->u.list));
    m->type = GPUIPC_MSG_LIST;
    m->u.list.max = 0;
    rc = gpuipc__dom_call(d, m, NULL, 0, gpuipc__ms_left(deadline),
                          "gpuipc_domain_info", r);
  } while (rc == GPUIPC_E_PEER_GONE && gpuipc__now_ns() < deadline);
  if (rc == 0 && r->msg.type != GPUIPC_MSG_LIST_REPLY)
    rc = gpuipc__err(GPUIPC_E_PROTO, "gpuipc_domain_info: broker answered "
                     "with %s", gpuipc__msg_name(r->msg.type));
  if (rc == 0) {
    gpuipc_domain_info_t i = {.size = sizeof(i)};
    snprintf(i.name, sizeof(i.name), "%s", d->name);
    i.broker_pid = (int)r->msg.u.list_reply.broker_pid;
    i.epoch = r->msg.u.list_reply.epoch;
    i.members = (int)r->msg.u.list_reply.members;
    i.segments = (int)r->msg.u.list_reply.segments;
    i.broker_fds = (int)r->msg.u.list_reply.fds;
    pthread_mutex_lock(&d->mu);
    i.hosts_broker = d->broker != NULL;
    pthread_mutex_unlock(&d->mu);
    gpuipc__out_write(out, out->size, &i, sizeof(i));
  }
  gpuipc__dom_fds_close(r->fds, r->nfds);
  free(m);
  free(r);
  return rc;
}
