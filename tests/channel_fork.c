/*
 * A channel does not survive fork(): the child's copy is inert. A child
 * (of this process: fork() without exec is the point) that closes the
 * channel it inherited, releases a view it inherited, or tries to send or
 * receive on it, touches nothing the parent shares with its peer (the
 * closed and settled words, the descriptor and release rings), and the
 * close still frees the child's copy. The parent then
 * goes on exchanging messages with its peer, a real process (chan_peer
 * echo), which never sees GPUIPC_E_PEER_GONE nor a release it did not
 * earn; the bytes that cross are checked on both sides, and the words of
 * the shared header are checked to be as the parent left them.
 */
#include "channel/channel.h"
#include "helpers/chan_common.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#define MSGS 4

/* The sanitizer runtime's, where there is one (malloc's counts are not). */
extern size_t __sanitizer_get_current_allocated_bytes(void)
    __attribute__((weak));

/* Bytes of the heap in use (the child has one thread: nothing else
 * allocates meanwhile). */
static size_t heap_in_use(void)
{
  if (__sanitizer_get_current_allocated_bytes != NULL)
    return __sanitizer_get_current_allocated_bytes();
  return mallinfo2().uordblks;
}

static gpuipc_domain_t *dom;
static gpuipc_buf_t *buf;

/* Send message @i from its slot of buf; its ticket. */
static uint64_t send_msg(gpuipc_channel_t *ch, uint64_t i)
{
  struct chan_msg m;
  gpuipc_tensor_t t;
  uint8_t *p = (uint8_t *)gpuipc_buf_ptr(buf) + (i % CHAN_SLOTS) * CHAN_SLOT;
  chan_msg_make(i, 0, p, buf, &m, &t);
  uint64_t ticket;
  ASSERT_OK(gpuipc_channel_send(ch, &t, NULL, 0, &ticket));
  return ticket;
}

/* Receive the peer's echo of message @i and check every byte of it. */
static gpuipc_tensor_t *recv_echo(gpuipc_channel_t *ch, uint64_t i)
{
  gpuipc_tensor_t *v;
  ASSERT_OK(gpuipc_channel_recv(ch, &v, NULL, 30000));
  const char *why = chan_msg_check(i, 0, v);
  if (why != NULL)
    TFAIL("echo: %s", why);
  return v;
}

/* What the child does before it closes the channel. */
enum child_do { JUST_CLOSE, RELEASE_VIEW, TRY_CALLS };

/* Its calls that would talk to the peer fail, naming fork(): 0, or the
 * child's exit code. */
static int child_calls(gpuipc_channel_t *ch)
{
  uint8_t *p = gpuipc_buf_ptr(buf); /* slot 0: no message of the parent's */
  struct chan_msg m;
  gpuipc_tensor_t t;
  chan_msg_make(99, 0, p, buf, &m, &t);
  if (gpuipc_channel_send(ch, &t, NULL, 0, NULL) != GPUIPC_E_CLOSED)
    return 10;
  if (strstr(gpuipc_last_error(), "before fork()") == NULL)
    return 11;
  gpuipc_tensor_t *v = NULL;
  if (gpuipc_channel_recv(ch, &v, NULL, 0) != GPUIPC_E_CLOSED || v != NULL)
    return 12;
  if (gpuipc_channel_recv_into(ch, &t, NULL, 0) != GPUIPC_E_CLOSED)
    return 13;
  if (gpuipc_channel_progress(ch) != GPUIPC_E_CLOSED)
    return 14;
  if (gpuipc_channel_fd(ch) != GPUIPC_E_CLOSED)
    return 15;
  if (gpuipc_channel_send_done(ch, 1, 0) != GPUIPC_E_CLOSED)
    return 16;
  if (gpuipc_channel_send_wait(ch, 1, NULL, 0) != GPUIPC_E_CLOSED)
    return 20;
  if (gpuipc_channel_on_release(ch, NULL, NULL) != GPUIPC_E_CLOSED)
    return 21;
  gpuipc_channel_info_t info = {.size = sizeof(info)};
  if (gpuipc_channel_info(ch, &info) != GPUIPC_E_CLOSED)
    return 22;
  return 0;
}

/*
 * The child's side; returns its exit code. @view: a view it inherited
 * (RELEASE_VIEW). Release and close return 0 and free the child's memory:
 * the close gives back at least the channel and its sender's records.
 */
static int child_side(gpuipc_channel_t *ch, enum child_do what,
                      gpuipc_tensor_t *view)
{
  /* Closed at fork() with the domain's descriptors (src/domain/fork.c):
   * the close must leave the number alone. */
  if (fcntl(ch->sock, F_GETFD) != -1 || errno != EBADF)
    return 23;
  int rc = what == TRY_CALLS ? child_calls(ch) : 0;
  if (rc != 0)
    return rc;
  if (what == RELEASE_VIEW && gpuipc_tensor_release(view, NULL) != 0)
    return 17;
  size_t own = sizeof(*ch) + ch->tx.depth * sizeof(*ch->tx.recs);
  size_t before = heap_in_use();
  if (gpuipc_channel_close(ch) != 0)
    return 18;
  size_t after = heap_in_use();
  if (after > before || before - after < own) {
    fprintf(stderr, "child: the close freed %zd bytes of the heap, not the "
            "%zu of the channel\n", (ssize_t)(before - after), own);
    return 19;
  }
  return 0;
}

/*
 * What the parent shares with its peer is as the parent left it: no close
 * flag or settled word of the child's, no descriptor or release it
 * published (the peer might not have looked yet).
 */
static void shared_untouched(const struct gpuipc_channel *ch)
{
  uint32_t closed = atomic_load(&ch->shm->closed[ch->end]);
  uint32_t settled = atomic_load(&ch->shm->settled[ch->end]);
  uint32_t head = atomic_load(&ch->txd->head);
  uint32_t rel_head = atomic_load(&ch->rxd->rel_head);
  ASSERT_EQ(closed, 0);
  ASSERT_EQ(settled, GPUIPC__CHAN_SETTLED_NOT);
  ASSERT_EQ(head, ch->tx.head);
  ASSERT_EQ(rel_head, ch->rx.rel_head);
}

/*
 * Open channel @name with an echo peer, exchange message 1, fork; the
 * child does @what (for RELEASE_VIEW the echo of message 1 is still held:
 * the peer waits for its release), closes and exits. Then the parent
 * exchanges the other messages with the peer, which exits 0 only if it
 * saw every message whole and its end never broke.
 */
static void fork_case(const char *name, enum child_do what)
{
  bool hold_view = what == RELEASE_VIEW;
  char n[8];
  snprintf(n, sizeof(n), "%d", MSGS);
  const char *args[] = {"echo", "chan-fork", name, n, NULL};
  pid_t peer = test_spawn("chan_peer", args, NULL);
  gpuipc_channel_t *ch;
  ASSERT_OK(gpuipc_channel_open(dom, name, NULL, &ch));
  uint64_t ticket = send_msg(ch, 1);
  gpuipc_tensor_t *v = recv_echo(ch, 1);
  if (!hold_view) {
    ASSERT_OK(gpuipc_tensor_release(v, NULL));
    ASSERT_OK(gpuipc_channel_send_done(ch, ticket, 30000));
    v = NULL;
  }
  fflush(NULL);
  pid_t pid = fork();
  ASSERT_TRUE(pid >= 0);
  if (pid == 0)
    _exit(child_side(ch, what, v));
  ASSERT_EQ(test_wait(pid, 60000), 0);
  shared_untouched(ch);

  gpuipc_channel_info_t info = {.size = sizeof(info)};
  ASSERT_OK(gpuipc_channel_info(ch, &info));
  ASSERT_EQ(info.peer_gone, 0);
  ASSERT_EQ(info.sent, 1);
  ASSERT_EQ(info.received, 1);
  if (v != NULL) {
    /* Still ours to release: the child's release told the peer nothing. */
    ASSERT_EQ(info.views, 1);
    ASSERT_OK(gpuipc_tensor_release(v, NULL));
    ASSERT_OK(gpuipc_channel_send_done(ch, ticket, 30000));
  }
  for (uint64_t i = 2; i <= MSGS; i++) {
    ticket = send_msg(ch, i);
    v = recv_echo(ch, i);
    ASSERT_OK(gpuipc_tensor_release(v, NULL));
    ASSERT_OK(gpuipc_channel_send_done(ch, ticket, 30000));
  }
  ASSERT_OK(gpuipc_channel_info(ch, &info));
  ASSERT_EQ(info.peer_gone, 0);
  ASSERT_EQ(info.sent, MSGS);
  ASSERT_EQ(info.received, MSGS);
  ASSERT_EQ(info.views, 0);
  ASSERT_OK(gpuipc_channel_close(ch));
  ASSERT_EQ(test_wait(peer, 30000), 0);
}

int main(void)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  ASSERT_OK(gpuipc_domain_join("chan-fork", NULL, &dom));
  ASSERT_OK(gpuipc_buf_alloc(CHAN_SLOT * CHAN_SLOTS, GPUIPC_KIND_HOST, -1, 0,
                             &buf));
  fork_case("close", JUST_CLOSE);
  fork_case("view", RELEASE_VIEW);
  fork_case("calls", TRY_CALLS);
  gpuipc_buf_release(buf);
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
