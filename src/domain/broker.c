/*
 * The broker's life cycle: claiming a domain, starting (a thread, or
 * `gpuipc serve`'s main thread), the poll loop over its listener, its
 * members and a wake-up pipe, the loop's timeouts, and stopping -- handing
 * the domain over (handoff.c) or shutting it down. The loop calls the
 * other broker files for what it finds: broker_conn.c for connections,
 * broker_seg.c for the recovery window and parked requests' deadlines.
 * See broker_int.h for the list of those files.
 */
#include "domain/broker_int.h"
#include "os/os.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Ids start from the wall clock in microseconds, so a broker that starts
 * after a crash (with what survivors remember) continues above old ids. */
static uint64_t clock_id(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u + 1;
}

/*
 * How long a broker handed the domain waits, when its host leaves at once,
 * for the members of the last broker to come back, unless all of them
 * have (or one that may take the domain over has) before.
 */
#define MEMBERS_BACK_MS 5000

/* ------------------------------------------------------------------------ */
/* The loop                                                                 */
/* ------------------------------------------------------------------------ */

/*
 * Whether members that the last broker handed over are still on their way
 * here (reconnecting takes a loaded machine a while): a broker that leaves
 * meanwhile waits for one that may take the domain over, since it holds
 * the only copy of the registry and of the segments' descriptors.
 */
static bool members_coming_back(const struct gpuipc__broker *b, uint64_t now)
{
  return b->came_back < b->members_back && now < b->back_end;
}

/* Whether a broker that leaves waits for a member to take the domain. */
static bool awaiting_successor(const struct gpuipc__broker *b)
{
  return gpuipc__bk_recovering(b) ||
         members_coming_back(b, gpuipc__now_ns());
}

/* Poll timeout in ms until the next deadline (-1: none). */
static int next_timeout(struct gpuipc__broker *b, uint64_t now)
{
  uint64_t next = UINT64_MAX;
  if (b->recovery_end != 0)
    next = b->recovery_end;
  if (members_coming_back(b, now) && b->back_end < next)
    next = b->back_end;
  if (b->accept_rest != 0 && b->accept_rest < next)
    next = b->accept_rest;
  for (struct gpuipc__conn *c = b->conns; c != NULL; c = c->next)
    if (c->state != CONN_READY && !c->doomed && c->deadline < next)
      next = c->deadline;
  for (struct park *p = b->parks.all.head; p != NULL; p = p->all.next)
    if (!p->recovery && p->deadline < next)
      next = p->deadline;
  if (next == UINT64_MAX)
    return -1;
  if (next <= now)
    return 0;
  uint64_t ms = (next - now + 999999) / 1000000;
  return ms > 60000 ? 60000 : (int)ms;
}

static int ensure_pfds(struct gpuipc__broker *b, size_t n)
{
  if (n <= b->pcap)
    return 0;
  size_t cap = b->pcap ? b->pcap : 16;
  while (cap < n)
    cap *= 2;
  struct pollfd *p = realloc(b->pfds, cap * sizeof(*p));
  if (p == NULL)
    return -ENOMEM;
  b->pfds = p;
  struct gpuipc__conn **c = realloc(b->pconns, cap * sizeof(*c));
  if (c == NULL)
    return -ENOMEM;
  b->pconns = c;
  b->pcap = cap;
  return 0;
}

/*
 * Serve until the stop descriptor is readable; or, @stopping (it is
 * already), until a member that may take the domain over is connected or
 * the recovery window has closed.
 */
static void loop(struct gpuipc__broker *b, bool stopping)
{
  for (;;) {
    if (stopping &&
        (!awaiting_successor(b) || gpuipc__bk_successor_ready(b)))
      return;
    if (ensure_pfds(b, b->nconns + 2) != 0) {
      usleep(1000);
      continue;
    }
    size_t n = 0;
    b->pfds[n++] = (struct pollfd){.fd = stopping ? -1 : b->stop_fd,
                                   .events = POLLIN};
    if (b->accept_rest != 0 && gpuipc__now_ns() >= b->accept_rest)
      b->accept_rest = 0;
    b->pfds[n++] = (struct pollfd){
        .fd = b->accept_rest != 0 ? -1 : b->listen_fd, .events = POLLIN};
    for (struct gpuipc__conn *c = b->conns; c != NULL; c = c->next) {
      short ev = POLLIN;
      if (c->out_head != NULL)
        ev |= POLLOUT;
      b->pconns[n] = c;
      b->pfds[n++] = (struct pollfd){.fd = c->fd, .events = ev};
    }
    int timeout = next_timeout(b, gpuipc__now_ns());
    int rc = poll(b->pfds, n, timeout);
    if (rc < 0 && errno != EINTR) {
      GPUIPC_LOG_E("broker %s: poll: %s", b->name, strerror(errno));
      usleep(1000);
    }
    if (rc > 0) {
      if (b->pfds[0].revents != 0)
        return;
      if (b->pfds[1].revents & POLLIN)
        gpuipc__bk_accept_all(b);
      for (size_t i = 2; i < n; i++) {
        struct gpuipc__conn *c = b->pconns[i];
        short re = b->pfds[i].revents;
        if (re == 0 || c->doomed)
          continue;
        if (re & POLLOUT)
          gpuipc__bk_flush(c);
        if (re & (POLLIN | POLLHUP | POLLERR))
          gpuipc__bk_conn_read(b, c);
      }
    }
    uint64_t now = gpuipc__now_ns();
    if (b->recovery_end != 0 && now >= b->recovery_end)
      gpuipc__bk_end_recovery(b);
    gpuipc__bk_expire_parks(b, now);
    gpuipc__bk_expire_conns(b, now);
    gpuipc__bk_shut_answered(b);
    gpuipc__bk_reap(b);
  }
}

static void broker_shutdown(struct gpuipc__broker *b)
{
  bool handed = gpuipc__bk_try_handoff(b);
  /*
   * A broker that has just taken the domain over (a hand-over, or an
   * election after a crash) has no members yet when its host leaves at
   * once: they are reconnecting, and only it holds the segments'
   * descriptors. Ending the domain now would lose every segment nobody
   * maps; so serve until one of them may take the domain, or the window
   * in which they come back closes -- after a hand-over, which says how
   * many members come back, until every one of them has.
   */
  while (!handed && awaiting_successor(b)) {
    GPUIPC_LOG_D("broker %s: leaving before its members came back; "
                 "waiting for one to take the domain over", b->name);
    loop(b, true);
    handed = gpuipc__bk_try_handoff(b);
  }
  if (!handed) {
    /* The domain ends: its names with it. */
    if (ftruncate(b->lock_fd, 0) != 0)
      GPUIPC_LOG_W("broker %s: cannot empty %s: %s", b->name, b->paths.lock,
                   strerror(errno));
    /*
     * Unlink both while still holding the lock: a new broker binds anew,
     * and a clean end leaves no file that `gpuipc ls` would call stale.
     * Whoever opened the lock file before it went away sees so once it
     * takes the lock (gpuipc__flock_open) and opens it anew.
     */
    if (unlink(b->paths.sock) != 0 && errno != ENOENT)
      GPUIPC_LOG_W("broker %s: unlink %s: %s", b->name, b->paths.sock,
                   strerror(errno));
    if (unlink(b->paths.lock) != 0 && errno != ENOENT)
      GPUIPC_LOG_W("broker %s: unlink %s: %s", b->name, b->paths.lock,
                   strerror(errno));
    GPUIPC_LOG_I("broker %s: domain closed with %zu segments", b->name,
                 b->reg.count);
  }
  while (b->conns != NULL) {
    struct gpuipc__conn *c = b->conns;
    b->conns = c->next;
    gpuipc__bk_conn_free(c);
  }
  b->nconns = 0;
  gpuipc__bk_parks_free_all(&b->parks);
  gpuipc__fd_close(&b->listen_fd);
  gpuipc__fd_close(&b->lock_fd);
  gpuipc__reg_destroy(&b->reg);
}

/* ------------------------------------------------------------------------ */
/* Life cycle                                                               */
/* ------------------------------------------------------------------------ */

int gpuipc__broker_claim(const char *name, int *lock_fd, int *listen_fd,
                         bool *stale)
{
  struct gpuipc__dom_paths paths;
  int rc = gpuipc__dom_paths(name, &paths);
  if (rc != 0)
    return rc;
  int lfd = -1, sfd = -1;
  rc = gpuipc__flock_open(paths.lock, 0, &lfd);
  if (rc != 0)
    return rc;
  /* We hold the lock: any socket file is a dead broker's. */
  bool left = true;
  if (unlink(paths.sock) != 0) {
    if (errno != ENOENT) {
      rc = gpuipc__err_errno(errno, "unlink stale socket %s", paths.sock);
      goto close_lock;
    }
    left = false;
  }
  if (stale != NULL)
    *stale = left;
  rc = gpuipc__sock_listen(paths.sock, 128, &sfd);
  if (rc != 0)
    goto close_lock;
  *lock_fd = lfd;
  *listen_fd = sfd;
  return 0;
close_lock:
  gpuipc__fd_close(&lfd);
  return rc;
}

static void init_release(struct gpuipc__broker_init *init)
{
  gpuipc__fd_close(&init->lock_fd);
  gpuipc__fd_close(&init->listen_fd);
  if (init->have_reg)
    gpuipc__reg_destroy(&init->reg);
  init->have_reg = false;
}

static int broker_new(struct gpuipc__broker_init *init,
                      struct gpuipc__broker **out)
{
  struct gpuipc__broker *b = calloc(1, sizeof(*b));
  if (b == NULL) {
    init_release(init);
    return gpuipc__err(-ENOMEM, "broker: out of memory");
  }
  int rc = gpuipc__dom_paths(init->name, &b->paths);
  if (rc != 0)
    goto free_b;
  if (!init->have_reg) {
    rc = gpuipc__reg_init(&init->reg);
    if (rc != 0)
      goto free_b;
    init->have_reg = true;
  }
  if (pipe2(b->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    rc = gpuipc__err_errno(errno, "broker: pipe2");
    goto free_b;
  }
  snprintf(b->name, sizeof(b->name), "%s", init->name);
  b->lock_fd = init->lock_fd;
  b->listen_fd = init->listen_fd;
  init->lock_fd = init->listen_fd = -1;
  b->reg = init->reg;
  init->have_reg = false;
  b->epoch = init->epoch ? init->epoch : gpuipc__random_u64();
  b->next_id = clock_id();
  if (init->next_id > b->next_id)
    b->next_id = init->next_id;
  for (struct gpuipc__seg *s = b->reg.head; s != NULL; s = s->next)
    gpuipc__bk_learn_id(b, s->w.id);
  b->owner_token = init->owner_token;
  b->recovery = init->recovery;
  if (b->recovery == GPUIPC__RECOVER_CRASH)
    gpuipc__bk_journal_load(b);
  gpuipc__bk_journal_compact(b); /* empty for a new domain */
  if (b->recovery != GPUIPC__RECOVER_NONE)
    b->recovery_end = gpuipc__now_ns() + GPUIPC__RECOVERY_MS * 1000000ull;
  if (b->recovery == GPUIPC__RECOVER_HANDOFF) {
    b->members_back = init->members_back;
    b->back_end = gpuipc__deadline(MEMBERS_BACK_MS);
  }
  b->pid = getpid();
  b->uid = geteuid();
  b->stop_fd = b->wake[0];
  gpuipc__bk_conns_init(b);
  GPUIPC_LOG_I("broker %s: started in pid %d (epoch %016llx, %zu segments%s)",
               b->name, (int)b->pid, (unsigned long long)b->epoch,
               b->reg.count,
               b->recovery == GPUIPC__RECOVER_CRASH     ? ", after a crash"
               : b->recovery == GPUIPC__RECOVER_HANDOFF ? ", handed over"
                                                        : "");
  *out = b;
  return 0;
free_b:
  free(b);
  init_release(init);
  return rc;
}

static void broker_free(struct gpuipc__broker *b)
{
  gpuipc__fd_close(&b->wake[0]);
  gpuipc__fd_close(&b->wake[1]);
  gpuipc__fd_close(&b->spare_fd);
  free(b->uids);
  free(b->pfds);
  free(b->pconns);
  free(b);
}

static void *broker_thread(void *arg)
{
  struct gpuipc__broker *b = arg;
  loop(b, false);
  broker_shutdown(b);
  return NULL;
}

int gpuipc__broker_start(struct gpuipc__broker_init *init,
                         struct gpuipc__broker **out)
{
  struct gpuipc__broker *b;
  int rc = broker_new(init, &b);
  if (rc != 0)
    return rc;
  /* The broker thread must not take signals meant for the program. */
  rc = gpuipc__thread_start(&b->thread, false, broker_thread, b);
  if (rc != 0) {
    rc = gpuipc__err_errno(rc, "broker: pthread_create");
    broker_shutdown(b);
    broker_free(b);
    return rc;
  }
  b->threaded = true;
  *out = b;
  return 0;
}

void gpuipc__broker_stop(struct gpuipc__broker *b)
{
  if (b == NULL)
    return;
  char c = 1;
  while (write(b->wake[1], &c, 1) < 0 && errno == EINTR)
    ;
  if (b->threaded)
    pthread_join(b->thread, NULL);
  broker_free(b);
}

uint64_t gpuipc__broker_epoch(const struct gpuipc__broker *b)
{
  return b->epoch;
}

int gpuipc__broker_run(struct gpuipc__broker_init *init, int stop_fd)
{
  struct gpuipc__broker *b;
  int rc = broker_new(init, &b);
  if (rc != 0)
    return rc;
  b->stop_fd = stop_fd;
  loop(b, false);
  broker_shutdown(b);
  broker_free(b);
  return 0;
}
