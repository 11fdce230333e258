/*
 * Channels: a descriptor an event loop waits on (gpuipc_channel_fd).
 *
 * Each end has an eventfd, created at open, and hands it to the peer in
 * its rendezvous hello (rendezvous.c). An end arms itself in the shared
 * header (shm->poll[end].armed) only once the user has asked for its fd
 * and a call found nothing new: it drains its eventfd, sets the flag, then
 * looks at both rings once more. A publisher clears a set flag and writes
 * the eventfd (gpuipc__chan_poke), so that what is published after the
 * arming wakes the loop, and what was published before it is seen by the
 * second look (which then writes the eventfd itself). Nobody polling costs
 * the publisher one load.
 *
 * gpuipc_channel_fd returns an epoll fd holding the eventfd and the
 * channel's socket (for its hang-up only): a peer that dies writes no
 * eventfd, but the kernel hangs its socket up.
 */
#include "channel/channel.h"
#include "os/os.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

static _Thread_local int test_hello_fd = -1;
void (*gpuipc__test_hook_chan_arm)(struct gpuipc_channel *ch);

void gpuipc__chan_test_hello_fd(int fd)
{
  test_hello_fd = fd;
}

int gpuipc__chan_hello_fd(struct gpuipc_channel *ch)
{
  return test_hello_fd >= 0 ? test_hello_fd : ch->efd;
}

int gpuipc__chan_poll_init(struct gpuipc_channel *ch)
{
  ch->peer_efd = -1;
  atomic_init(&ch->pollfd, -1);
  ch->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (ch->efd < 0)
    return gpuipc__err_errno(errno, "gpuipc_channel_open: eventfd for "
                             "channel %s", ch->name);
  return 0;
}

void gpuipc__chan_poll_close(struct gpuipc_channel *ch)
{
  int fd = atomic_exchange(&ch->pollfd, -1);
  gpuipc__fd_close(&fd);
  gpuipc__fd_close(&ch->efd);
  gpuipc__fd_close(&ch->peer_efd);
}

int gpuipc__chan_efd_check(int fd, const char *name)
{
  static const char want[] = "anon_inode:[eventfd]";
  char path[64], link[64];
  snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, link, sizeof(link) - 1);
  if (n < 0)
    return gpuipc__err(GPUIPC_E_PROTO, "gpuipc_channel_open: channel %s: "
                       "cannot tell what the peer's descriptor is (readlink "
                       "%s: %s)", name, path, strerrorname_np(errno));
  link[n] = '\0';
  if (strcmp(link, want) != 0)
    return gpuipc__err(GPUIPC_E_PROTO, "gpuipc_channel_open: channel %s: "
                       "the peer sent \"%s\" where its eventfd belongs",
                       name, link);
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || !(fl & O_NONBLOCK))
    return gpuipc__err(GPUIPC_E_PROTO, "gpuipc_channel_open: channel %s: "
                       "the peer's eventfd blocks (no O_NONBLOCK)", name);
  return 0;
}

static void kick(int fd)
{
  uint64_t one = 1;
  /* EAGAIN: the counter is full, readable anyway; else the peer is gone. */
  ssize_t n = write(fd, &one, sizeof(one));
  (void)n;
}

void gpuipc__chan_poke_slow(struct gpuipc_channel *ch)
{
  if (ch->peer_efd < 0 ||
      atomic_exchange(&ch->shm->poll[1 - ch->end].armed, 0) == 0)
    return;
  kick(ch->peer_efd);
  atomic_fetch_add_explicit(&ch->poll_kicks, 1, memory_order_relaxed);
}

/* Whether anything waits to be taken: a descriptor, a release, a close. */
static bool poll_pending(struct gpuipc_channel *ch)
{
  uint32_t rx = atomic_load(&ch->rxd->head);
  uint32_t rel = atomic_load(&ch->txd->rel_head);
  return rx != atomic_load_explicit(&ch->poll_rx_tail, memory_order_relaxed) ||
         rel != atomic_load_explicit(&ch->poll_rel_tail,
                                     memory_order_relaxed) ||
         atomic_load(&ch->shm->closed[1 - ch->end]) != 0;
}

void gpuipc__chan_arm(struct gpuipc_channel *ch)
{
  if (!atomic_load_explicit(&ch->polled, memory_order_relaxed))
    return;
  uint64_t v;
  ssize_t n = read(ch->efd, &v, sizeof(v)); /* EAGAIN: it was not readable */
  (void)n;
  if (gpuipc__test_hook_chan_arm != NULL)
    gpuipc__test_hook_chan_arm(ch);
  atomic_store(&ch->shm->poll[ch->end].armed, 1);
  if (poll_pending(ch))
    kick(ch->efd);
}

static int ep_add(int ep, int fd, uint32_t events)
{
  struct epoll_event e = {.events = events, .data.fd = fd};
  return epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e) == 0 ? 0 : -errno;
}

/*
 * The epoll fd over our eventfd and the socket, for its hang-up (EPOLLHUP
 * and EPOLLERR are always reported; its messages are not asked for).
 */
static int poll_fd_make(struct gpuipc_channel *ch, int *out)
{
  static const char who[] = "gpuipc_channel_fd";
  int ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0)
    return gpuipc__err_errno(errno, "%s: epoll_create1 for channel %s", who,
                             ch->name);
  int rc = ep_add(ep, ch->efd, EPOLLIN);
  if (rc == 0)
    rc = ep_add(ep, ch->sock, 0);
  if (rc != 0)
    goto close_ep;
  *out = ep;
  return 0;

close_ep:
  close(ep);
  return gpuipc__err_errno(-rc, "%s: epoll_ctl for channel %s", who,
                           ch->name);
}

int gpuipc_channel_fd(gpuipc_channel_t *ch)
{
  if (ch == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_channel_fd: NULL channel");
  if (gpuipc__chan_stale(ch))
    return gpuipc__chan_stale_err(ch, "gpuipc_channel_fd");
  int fd = atomic_load(&ch->pollfd);
  if (fd >= 0)
    return fd;
  int ep = -1, rc = poll_fd_make(ch, &ep);
  if (rc != 0)
    return rc;
  int none = -1;
  if (!atomic_compare_exchange_strong(&ch->pollfd, &none, ep)) {
    close(ep); /* another thread's came first */
    return none;
  }
  atomic_store(&ch->polled, true);
  /* Readable at first: a loop that waits before it receives finds what
   * came before it asked. */
  kick(ch->efd);
  return ep;
}

uint64_t gpuipc__chan_poll_kicks(struct gpuipc_channel *ch)
{
  return atomic_load(&ch->poll_kicks);
}
