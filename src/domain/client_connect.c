/*
 * A member connects to its domain's broker: the HELLO/WELCOME handshake,
 * and, when nothing listens, the election -- claiming the domain's lock
 * file and starting its broker in this process (broker.c). Joining
 * (client.c) and reconnecting (client_reader.c) both come through
 * gpuipc__dom_connect; the state they share is in member.h.
 */
#include "domain/member.h"
#include "os/os.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Bound on one handshake attempt (a broker on its way out may not answer). */
#define HANDSHAKE_MS 2000

void gpuipc__dom_fds_close(int *fds, int n)
{
  for (int i = 0; i < n; i++)
    gpuipc__fd_close(&fds[i]);
}

void gpuipc__dom_sleep_ms(unsigned ms)
{
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

static int handshake(struct gpuipc_domain *d, int fd, bool rejoin,
                     uint64_t deadline)
{
  struct gpuipc__msg *m = &d->rmsg;
  memset(&m->u.hello, 0, sizeof(m->u.hello));
  m->type = GPUIPC_MSG_HELLO;
  m->req = 1;
  m->u.hello.pid = (uint32_t)getpid();
  m->u.hello.flags = (rejoin ? GPUIPC__HELLO_REJOIN : 0) |
                     ((d->flags & GPUIPC_JOIN_NO_BROKER)
                          ? GPUIPC__HELLO_NO_BROKER : 0);
  m->u.hello.token = d->token;
  m->u.hello.epoch = d->epoch;
  m->u.hello.max_id = atomic_load(&d->max_id);
  /* A refused peer may find its connection closed already: read anyway,
   * the refusal waits in the socket. */
  (void)gpuipc__proto_send(fd, m, NULL, 0, HANDSHAKE_MS);
  int ms = gpuipc__ms_left(deadline);
  if (ms < 0 || ms > HANDSHAKE_MS)
    ms = HANDSHAKE_MS;
  int fds[GPUIPC_FDS_MAX];
  int nfds = GPUIPC_FDS_MAX;
  ssize_t len = gpuipc__sock_recv(fd, d->rbuf, sizeof(d->rbuf), fds, &nfds,
                                  ms);
  if (len == GPUIPC_E_PEER_GONE) {
    /*
     * A broker that closed its end with our HELLO unread (as brokers
     * before this version did when refusing) resets the connection: the
     * first read reports the reset (ECONNRESET), the next one the answer
     * queued before it -- or the end, at once, if there is none.
     */
    nfds = GPUIPC_FDS_MAX;
    len = gpuipc__sock_recv(fd, d->rbuf, sizeof(d->rbuf), fds, &nfds, 0);
  }
  if (len < 0)
    return (int)len;
  int rc = gpuipc__msg_decode(d->rbuf, (size_t)len, nfds, m);
  gpuipc__dom_fds_close(fds, nfds);
  if (rc == GPUIPC_E_VERSION)
    return gpuipc__err(GPUIPC_E_VERSION,
                       "domain %s: the broker speaks protocol version %u, "
                       "this library version %d",
                       d->name, m->version, GPUIPC_PROTO_VERSION);
  if (rc != 0)
    return rc;
  switch (m->type) {
  case GPUIPC_MSG_WELCOME:
    pthread_mutex_lock(&d->mu);
    d->epoch = m->u.welcome.epoch;
    d->broker_pid = m->u.welcome.pid;
    pthread_mutex_unlock(&d->mu);
    return 0;
  case GPUIPC_MSG_DENIED:
    return gpuipc__err(GPUIPC_E_DENIED, "domain %s: the broker refused "
                       "this process: %s", d->name, m->u.denied.reason);
  case GPUIPC_MSG_ERROR:
    return gpuipc__err(m->u.error.code, "domain %s: %s", d->name,
                       m->u.error.text);
  }
  return gpuipc__err(GPUIPC_E_PROTO, "domain %s: broker answered HELLO "
                     "with %s", d->name, gpuipc__msg_name(m->type));
}

/* Claim the domain and start its broker in this process. */
static int become_broker(struct gpuipc_domain *d, bool rejoin)
{
  struct gpuipc__broker_init init;
  memset(&init, 0, sizeof(init));
  init.lock_fd = init.listen_fd = -1;
  bool stale;
  int rc = gpuipc__broker_claim(d->name, &init.lock_fd, &init.listen_fd,
                                &stale);
  if (rc != 0)
    return rc;
  snprintf(init.name, sizeof(init.name), "%s", d->name);
  pthread_mutex_lock(&d->mu);
  init.epoch = d->epoch;
  pthread_mutex_unlock(&d->mu);
  init.next_id = atomic_load(&d->max_id) + 1;
  init.owner_token = d->token;
  /*
   * A socket file left behind means the last broker died: its members
   * (this one, maybe) are about to re-publish what they hold.
   */
  init.recovery = (rejoin || stale) ? GPUIPC__RECOVER_CRASH
                                          : GPUIPC__RECOVER_NONE;
  struct gpuipc__broker *b;
  rc = gpuipc__broker_start(&init, &b);
  if (rc != 0)
    return rc;
  pthread_mutex_lock(&d->mu);
  struct gpuipc__broker *old = d->broker;
  d->broker = b;
  pthread_mutex_unlock(&d->mu);
  if (old != NULL) /* cannot happen: one lock, one broker; be safe */
    gpuipc__broker_stop(old);
  GPUIPC_LOG_I("domain %s: this process (pid %d) hosts the broker now",
               d->name, (int)getpid());
  return 0;
}

/*
 * Connect to the domain's broker, electing one if none listens, until
 * @deadline. The retries are what make elections and hand-overs safe: only
 * the holder of the lock file listens, and the kernel frees the lock of a
 * process that dies.
 */
int gpuipc__dom_connect(struct gpuipc_domain *d, uint64_t deadline,
                        bool rejoin, int *out_fd)
{
  unsigned backoff = 1;
  for (;;) {
    if (atomic_load(&d->leaving))
      return gpuipc__err(GPUIPC_E_CLOSED, "domain %s: leaving", d->name);
    int fd = -1;
    int ms = gpuipc__ms_left(deadline);
    int rc = gpuipc__sock_connect(d->paths.sock,
                                  ms < 0 || ms > 1000 ? 1000 : ms, &fd);
    if (rc == 0) {
      rc = handshake(d, fd, rejoin, deadline);
      if (rc == 0) {
        *out_fd = fd;
        return 0;
      }
      gpuipc__fd_close(&fd);
      /* -EUSERS, -EMFILE: the broker is full; the caller (or the
       * reconnecting reader) decides whether to try again. */
      if (rc == GPUIPC_E_DENIED || rc == GPUIPC_E_VERSION ||
          rc == -EUSERS || rc == -EMFILE)
        return rc;
      /* Otherwise a broker on its way out: try again. */
    } else if (rc == -ENOENT || rc == -ECONNREFUSED) {
      if (!(d->flags & GPUIPC_JOIN_NO_BROKER)) {
        rc = become_broker(d, rejoin);
        if (rc == 0)
          continue; /* now connect to ourselves */
        /* The lock is held: someone else is becoming the broker. */
        if (rc != -EWOULDBLOCK)
          return rc;
      } else if (!rejoin) {
        return gpuipc__err(-ENOENT, "domain %s: no broker runs (nothing "
                           "listens at %s)", d->name, d->paths.sock);
      }
    } else if (rc != -EAGAIN && rc != -ETIMEDOUT && rc != -EINTR) {
      return rc;
    }
    if (gpuipc__now_ns() >= deadline)
      return gpuipc__err(-ETIMEDOUT, "domain %s: no broker answered in time",
                         d->name);
    uint32_t jitter;
    gpuipc__random(&jitter, sizeof(jitter));
    gpuipc__dom_sleep_ms(backoff + jitter % (backoff + 1));
    if (backoff < 16)
      backoff *= 2;
  }
}
