/*
 * How a channel end sees its peer exit (src/channel/ring.c's peer check):
 * through the peer's pidfd, one poll() with the socket, where the kernel
 * has pidfds; through its pid and /proc otherwise. A real process
 * (/bin/sleep, fork+exec) is killed and left a zombie: both ways must say
 * GPUIPC_E_PEER_GONE, "exited", while a hang-up of the socket is named
 * first when there is one; and the pidfd keeps saying so after the zombie
 * is reaped.
 */
#include "channel/channel.h"
#include "os/os.h"
#include "test.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static pid_t sleeper(void)
{
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl("/bin/sleep", "sleep", "120", (char *)NULL);
    _exit(127);
  }
  return pid;
}

/* A channel end as far as the peer check reads it: no socket (or @sock),
 * peer @pid, its pidfd @pidfd (-1: none). */
static struct gpuipc_channel *end_of(pid_t pid, int pidfd, int sock)
{
  struct gpuipc_channel *ch = calloc(1, sizeof(*ch));
  ASSERT_TRUE(ch != NULL);
  ch->shm = calloc(1, sizeof(*ch->shm));
  ASSERT_TRUE(ch->shm != NULL);
  ch->sock = sock;
  ch->peer_pid = pid;
  ch->peer_pidfd = pidfd;
  snprintf(ch->name, sizeof(ch->name), "exit-test");
  return ch;
}

static void end_free(struct gpuipc_channel *ch)
{
  gpuipc__fd_close(&ch->peer_pidfd);
  free(ch->shm);
  free(ch);
}

static void expect_exited(struct gpuipc_channel *ch, unsigned look)
{
  ASSERT_TRUE(!gpuipc__chan_peer_alive(ch));
  ASSERT_RC(gpuipc__chan_peer_check(ch, look), GPUIPC_E_PEER_GONE);
  ASSERT_ERR_MENTIONS("exited");
  /* Sticky: the channel is broken for good. */
  ASSERT_RC(gpuipc__chan_peer_check(ch, 0), GPUIPC_E_PEER_GONE);
}

int main(void)
{
  pid_t pid = sleeper();
  int pidfd = gpuipc__pidfd_open(pid);
  if (pidfd == -ENOSYS)
    printf("no pidfd_open here: the pid path only\n");
  else
    ASSERT_GE(pidfd, 0);
  int sv[2], sv2[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv2), 0);

  struct gpuipc_channel *by_fd = end_of(pid, pidfd, sv[0]);
  struct gpuipc_channel *by_pid = end_of(pid, -1, -1);
  struct gpuipc_channel *hung = end_of(pid, gpuipc__pidfd_open(pid), sv2[0]);
  unsigned both = GPUIPC__PEER_SOCK | GPUIPC__PEER_PID;
  ASSERT_TRUE(gpuipc__chan_peer_alive(by_fd));
  ASSERT_TRUE(gpuipc__chan_peer_alive(by_pid));
  ASSERT_OK(gpuipc__chan_peer_check(by_fd, both));
  ASSERT_OK(gpuipc__chan_peer_check(by_pid, GPUIPC__PEER_PID));

  /* Killed, not reaped: a zombie, which /proc shows as such. */
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  uint64_t deadline = gpuipc__deadline(20000);
  while (gpuipc__pid_alive(pid)) {
    if (gpuipc__ms_left(deadline) == 0)
      TFAIL("pid %d never showed as exited", (int)pid);
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  /* The socket's other end is still open: the exit is what says it. */
  ASSERT_OK(gpuipc__chan_peer_check(by_fd, GPUIPC__PEER_SOCK));
  expect_exited(by_fd, both);
  expect_exited(by_pid, GPUIPC__PEER_PID);
  /* A hang-up is named before the exit. */
  close(sv2[1]);
  ASSERT_RC(gpuipc__chan_peer_check(hung, both), GPUIPC_E_PEER_GONE);
  ASSERT_ERR_MENTIONS("hung up its socket");

  /* Reaped: the pidfd still says exited (a later process may take the
   * pid; the pidfd is of this one). */
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  if (pidfd >= 0) {
    ASSERT_EQ(gpuipc__pidfd_open(pid), -ESRCH);
    struct gpuipc_channel *late = end_of(pid, by_fd->peer_pidfd, -1);
    by_fd->peer_pidfd = -1; /* opened while it lived: late's now */
    expect_exited(late, GPUIPC__PEER_PID);
    end_free(late);
  }
  end_free(by_fd);
  end_free(by_pid);
  end_free(hung);
  close(sv[0]);
  close(sv[1]);
  close(sv2[0]);
  printf("ok\n");
  return 0;
}
