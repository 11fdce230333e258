/*
 * Stress of the channel rendezvous under CPU load:
 *   stress_channel_rendezvous [ROUNDS [OPENERS [SPINNERS]]]
 * (defaults 100, 4, twice the CPUs). Each round starts OPENERS chan_peer
 * processes in "pair" mode on one channel name (the same name every
 * round) while SPINNERS forked children keep every CPU busy, and waits
 * for them all: every opener must pair with another one and exit 0. An
 * opener that maps the name's segment just before a pair unlinks it, and
 * looks at it after that pair has exited, is the race this hunts.
 * Prints the rounds, the failures and the time; exits 1 on any failure.
 * The spinners stop with the run, and after 10 minutes whatever happens.
 */
#include "test.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static pid_t spin_start(void)
{
  pid_t pid = fork();
  if (pid < 0)
    TFAIL("fork: %s", strerror(errno));
  if (pid == 0) {
    alarm(600); /* bounded, even if the parent dies without killing us */
    volatile uint64_t x = 0;
    for (;;)
      x++;
  }
  return pid;
}

static double now_s(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  int rounds = argc > 1 ? atoi(argv[1]) : 100;
  int openers = argc > 2 ? atoi(argv[2]) : 4;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int spinners = argc > 3 ? atoi(argv[3]) : (int)(2 * (ncpu > 0 ? ncpu : 1));
  if (rounds < 1 || openers < 2 || openers % 2 != 0 || openers > 64 ||
      spinners < 0 || spinners > 256)
    TFAIL("usage: stress_channel_rendezvous [ROUNDS [OPENERS (even) "
          "[SPINNERS]]]");
  gpuipc_domain_t *dom; /* hosts the broker for the whole run */
  ASSERT_OK(gpuipc_domain_join("chan-stress", NULL, &dom));
  pid_t spin[256];
  for (int i = 0; i < spinners; i++)
    spin[i] = spin_start();
  const char *args[] = {"pair", "chan-stress", "rv", NULL};
  int failed = 0, failed_rounds = 0;
  double t0 = now_s();
  for (int r = 0; r < rounds; r++) {
    pid_t p[64];
    for (int i = 0; i < openers; i++)
      p[i] = test_spawn("chan_peer", args, NULL);
    int bad = 0;
    for (int i = 0; i < openers; i++)
      if (test_wait(p[i], 120000) != 0)
        bad++;
    failed += bad;
    failed_rounds += bad > 0;
    if (bad > 0)
      printf("round %d: %d of %d openers failed\n", r + 1, bad, openers);
  }
  double dt = now_s() - t0;
  for (int i = 0; i < spinners; i++) {
    kill(spin[i], SIGKILL);
    waitpid(spin[i], NULL, 0);
  }
  ASSERT_OK(gpuipc_domain_leave(dom));
  printf("channel rendezvous: %d rounds x %d openers, %d spinners on %ld "
         "CPUs: %d openers failed in %d rounds, %.1f s (%.1f ms a round)\n",
         rounds, openers, spinners, ncpu, failed, failed_rounds, dt,
         1000 * dt / rounds);
  return failed == 0 ? 0 : 1;
}
