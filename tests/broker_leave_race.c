/*
 * The broker's host and most members leave a domain at the same time,
 * with no barrier, while one member keeps working: the hand-over goes from
 * member to member as each leaves, connections drop and come back, and the
 * member that stays must see every call succeed and the segment's bytes
 * intact, and end up hosting the domain itself.
 *
 * The segment's name is longer than 8 bytes, with a letter as its 8th:
 * what a member learns from opening it must not spoil its reconnection.
 * Each round places the member that stays at another position in the line
 * of successors (the oldest member of another process is chosen first).
 *
 * Its 143 members share HOST memory only and join "cold": each CUDA start
 * took 1-2 s beside a busy GPU suite (this test: 257 s of ctest -j12's
 * 302 on the 4 x H100 machine), and none is what the test is about.
 *
 * Then a member that cannot run for a while (stopped here; a loaded machine
 * keeps a process off the CPU the same way) while the host hands the
 * domain over to a successor that leaves at once: the successor must wait
 * for it to come back and hand the domain on, not end it (and lose the
 * segment) once the recovery window of a failover has passed.
 */
#include "test.h"
#include "helpers/seg_peer.h"

#include <signal.h>
#include <stdbool.h>
#include <unistd.h>

#define MEMBERS 6
#define ROUNDS 20
#define SEG "leave_race_segment"
#define SEG_SIZE 65536
/* How long the remaining member churns; the others leave meanwhile. */
#define CHURN_MS 700

static void round_once(int round)
{
  char dom[32];
  snprintf(dom, sizeof(dom), "lrace%d", round);
  unsigned seed = 1000u + (unsigned)round;
  int stays = (round / 2) % MEMBERS;
  /* Odd rounds: everyone leaves at once (the successors chosen are leaving
   * already). Even rounds: the host first, so that its successor takes
   * the domain, then the others at once, the new host among them, while
   * the members are reconnecting to it. */
  bool host_first = round % 2 == 0;

  struct peer host, m[MEMBERS];
  peer_start(&host);
  PEER_OK(&host, "join %s cold", dom);
  PEER_OK(&host, "open %s %d c", SEG, SEG_SIZE);
  PEER_OK(&host, "fill %s %u", SEG, seed);
  for (int i = 0; i < MEMBERS; i++) {
    peer_start(&m[i]);
    PEER_OK(&m[i], "join %s cold", dom);
    PEER_OK(&m[i], "open %s 0 -", SEG);
    PEER_OK(&m[i], "check %s %u", SEG, seed);
  }
  /* Half the leaving members hold the segment as they go, half not; the
   * host lets go of it, so only the broker's descriptor keeps it for the
   * member that stays. */
  PEER_OK(&host, "release %s", SEG);
  PEER_OK(&m[stays], "release %s", SEG);
  for (int i = 0; i < MEMBERS; i++)
    if (i != stays && i % 2 == 0)
      PEER_OK(&m[i], "release %s", SEG);

  peer_send(&m[stays], "churn %s %u %d", SEG, seed, CHURN_MS);
  peer_send(&host, "leave");
  const char *r;
  if (host_first) {
    r = peer_read(&host, PEER_REPLY_MS);
    if (strcmp(r, "ok") != 0)
      TFAIL("round %d: the host's leave: %s", round, r);
  }
  for (int i = 0; i < MEMBERS; i++)
    if (i != stays)
      peer_send(&m[i], "leave");
  if (!host_first) {
    r = peer_read(&host, PEER_REPLY_MS);
    if (strcmp(r, "ok") != 0)
      TFAIL("round %d: the host's leave: %s", round, r);
  }
  peer_finish(&host);
  for (int i = 0; i < MEMBERS; i++) {
    if (i == stays)
      continue;
    r = peer_read(&m[i], PEER_REPLY_MS);
    if (strcmp(r, "ok") != 0)
      TFAIL("round %d: member %d's leave: %s", round, i, r);
    peer_finish(&m[i]);
  }

  int rounds = -1;
  r = peer_read(&m[stays], PEER_REPLY_MS);
  if (sscanf(r, "ok %d", &rounds) != 1)
    TFAIL("round %d: the member that stays (%d) failed: %s", round, stays,
          r);
  ASSERT_GT(rounds, 0);

  /* Everyone else is gone: the domain is the remaining member's. */
  int broker_pid = 0, hosts = 0, members = 0, segments = 0, fds = 0;
  /* The broker notices the others' connections end in its own time. */
  for (int tries = 0; tries < 3000 && members != 1; tries++) {
    if (tries > 0)
      usleep(10000);
    r = peer_cmd(&m[stays], "info");
    if (sscanf(r, "ok %d %d %d %d %d", &broker_pid, &hosts, &members,
               &segments, &fds) != 5)
      TFAIL("round %d: info: %s", round, r);
  }
  ASSERT_EQ(broker_pid, m[stays].pid);
  ASSERT_EQ(hosts, 1);
  ASSERT_EQ(members, 1);
  PEER_OK(&m[stays], "open %s 0 -", SEG);
  PEER_OK(&m[stays], "check %s %u", SEG, seed);
  PEER_OK(&m[stays], "release %s", SEG);
  PEER_OK(&m[stays], "leave");
  peer_finish(&m[stays]);
}

/* How long the member stays stopped: well past the recovery window
 * (GPUIPC__RECOVERY_MS), within which a successor used to wait. */
#define STOPPED_MS 1000

static void stopped_member(void)
{
  struct peer host, succ, m;
  peer_start(&host);
  PEER_OK(&host, "join lrace_stopped cold");
  PEER_OK(&host, "open %s %d c", SEG, SEG_SIZE);
  PEER_OK(&host, "fill %s 77", SEG);
  peer_start(&succ); /* the oldest member: the host's successor */
  PEER_OK(&succ, "join lrace_stopped cold");
  peer_start(&m);
  PEER_OK(&m, "join lrace_stopped cold");
  PEER_OK(&m, "open %s 0 -", SEG);
  PEER_OK(&m, "check %s 77", SEG);
  /* Only the broker's descriptor keeps the segment. */
  PEER_OK(&m, "release %s", SEG);
  PEER_OK(&host, "release %s", SEG);

  ASSERT_EQ(kill(m.pid, SIGSTOP), 0);
  PEER_OK(&host, "leave");
  peer_finish(&host);
  peer_send(&succ, "leave");
  usleep(STOPPED_MS * 1000);
  ASSERT_EQ(kill(m.pid, SIGCONT), 0);
  const char *r = peer_read(&succ, PEER_REPLY_MS);
  if (strcmp(r, "ok") != 0)
    TFAIL("stopped member: the successor's leave: %s", r);
  peer_finish(&succ);

  r = peer_cmd(&m, "open %s 0 -", SEG);
  if (strncmp(r, "ok", 2) != 0)
    TFAIL("stopped member: after the successor left, open %s: %s", SEG, r);
  PEER_OK(&m, "check %s 77", SEG);
  struct peer_info i;
  peer_info(&m, &i);
  ASSERT_EQ(i.broker_pid, m.pid);
  ASSERT_EQ(i.segments, 1);
  PEER_OK(&m, "release %s", SEG);
  PEER_OK(&m, "leave");
  peer_finish(&m);
}

int main(void)
{
  for (int round = 0; round < ROUNDS; round++)
    round_once(round);
  printf("broker_leave_race: ok (%d rounds)\n", ROUNDS);
  stopped_member();
  printf("broker_leave_race: a member stopped for %d ms across a hand-over "
         "got the domain\n", STOPPED_MS);
  return 0;
}
