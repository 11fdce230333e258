/*
 * The other process of tests/socket.c.
 *   os_sock_peer recv3 FD : receive "memfd SIZE SEED" with exactly three
 *       descriptors (a memfd, a pipe's write end, an eventfd) on socket FD;
 *       check each is close-on-exec, check the memfd's bytes, write
 *       "sum <fnv1a hex>\n" into the pipe, add 7 to the eventfd, reply "done".
 *   os_sock_peer connect PATH PPID : connect to PATH, check the listener's
 *       credentials are PPID and our uid, send "hello PID", expect "bye".
 *   os_sock_peer exit FD : exit at once without reading socket FD.
 *   os_sock_peer late FD MS : sleep MS milliseconds, then send "late".
 * Exit status 0 on success; anything else names the failed step on stderr.
 */
#include "test.h"

#include "os/os.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define TIMEOUT_MS 20000

static uint64_t fnv1a(const uint8_t *p, size_t n)
{
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++)
    h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

static int recv3(int sock)
{
  char msg[64] = {0};
  int fds[GPUIPC_FDS_MAX];
  int nfds = GPUIPC_FDS_MAX;
  ssize_t n = gpuipc__sock_recv(sock, msg, sizeof(msg) - 1, fds, &nfds,
                                TIMEOUT_MS);
  ASSERT_GT(n, 0);
  ASSERT_EQ(nfds, 3);
  size_t size;
  unsigned long long seed;
  ASSERT_EQ(sscanf(msg, "memfd %zu %llu", &size, &seed), 2);
  for (int i = 0; i < 3; i++) {
    ASSERT_GE(fds[i], 3);
    ASSERT_EQ(fcntl(fds[i], F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  }

  size_t actual;
  ASSERT_OK(gpuipc__memfd_check(fds[0], size, &actual));
  ASSERT_EQ_U(actual, size);
  uint8_t *p = mmap(NULL, size, PROT_READ, MAP_SHARED, fds[0], 0);
  ASSERT_TRUE(p != MAP_FAILED);
  ASSERT_EQ_U(test_check(p, size, seed), (size_t)-1);
  uint64_t sum = fnv1a(p, size);
  munmap(p, size);

  char line[64];
  int len = snprintf(line, sizeof(line), "sum %016llx\n",
                     (unsigned long long)sum);
  ASSERT_EQ(write(fds[1], line, (size_t)len), len);
  uint64_t seven = 7;
  ASSERT_EQ(write(fds[2], &seven, sizeof(seven)), sizeof(seven));
  for (int i = 0; i < 3; i++)
    close(fds[i]);
  ASSERT_OK(gpuipc__sock_send(sock, "done", 5, NULL, 0, TIMEOUT_MS));
  return 0;
}

static int connect_to(const char *path, pid_t ppid)
{
  int sock;
  ASSERT_OK(gpuipc__sock_connect(path, TIMEOUT_MS, &sock));
  ASSERT_EQ(fcntl(sock, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  ASSERT_EQ(fcntl(sock, F_GETFL) & O_NONBLOCK, 0);
  struct gpuipc__cred cred;
  ASSERT_OK(gpuipc__peer_cred(sock, &cred));
  ASSERT_EQ(cred.pid, ppid);
  ASSERT_EQ(cred.uid, getuid());
  char hello[32];
  int len = snprintf(hello, sizeof(hello), "hello %d", (int)getpid());
  ASSERT_OK(gpuipc__sock_send(sock, hello, (size_t)len + 1, NULL, 0,
                              TIMEOUT_MS));
  char bye[8] = {0};
  ASSERT_EQ(gpuipc__sock_recv(sock, bye, sizeof(bye), NULL, NULL, TIMEOUT_MS),
            4);
  ASSERT_STREQ(bye, "bye");
  close(sock);
  return 0;
}

static int late(int sock, int ms)
{
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0)
    ;
  ASSERT_OK(gpuipc__sock_send(sock, "late", 5, NULL, 0, TIMEOUT_MS));
  return 0;
}

int main(int argc, char **argv)
{
  if (argc == 3 && strcmp(argv[1], "recv3") == 0)
    return recv3(atoi(argv[2]));
  if (argc == 4 && strcmp(argv[1], "connect") == 0)
    return connect_to(argv[2], (pid_t)atoi(argv[3]));
  if (argc == 3 && strcmp(argv[1], "exit") == 0)
    return 0;
  if (argc == 4 && strcmp(argv[1], "late") == 0)
    return late(atoi(argv[2]), atoi(argv[3]));
  fprintf(stderr, "usage: os_sock_peer recv3 FD | connect PATH PPID | exit FD "
                  "| late FD MS\n");
  return 2;
}
