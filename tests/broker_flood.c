/*
 * The hostile member: 2000 connections that say HELLO and then sit idle,
 * and more that keep knocking, while two honest members (processes of
 * their own) create, fill, read, release and unlink segments through the
 * broker. The broker runs in a seg_peer process with the common default
 * limit of 1024 descriptors. It must neither run out of descriptors nor
 * stop serving: every honest call succeeds, every byte read is the byte
 * written, and every knock is answered (welcomed, or refused with
 * -EUSERS). The honest calls' p50/p99 are printed, not asserted.
 */
#include "test.h"
#include "helpers/raw_proto.h"
#include "helpers/seg_peer.h"

#include <sys/resource.h>

#define IDLE 2000
#define BROKER_NOFILE 1024
#define ROUNDS 200
#define SIZE 65536
#define KNOCK_MS 3000

static int idle[IDLE];
static int nidle;

struct knocks {
  int welcomed, refused, unanswered;
};

/* One knock: a welcome is kept open (while there is room), a refusal
 * must be -EUSERS. */
static void knock(struct knocks *k)
{
  char why[GPUIPC__TEXT_MAX + 1] = "";
  int fd = -1;
  int rc = raw_knock("flood", KNOCK_MS, &fd, why, sizeof(why));
  if (rc == 1) {
    k->welcomed++;
    if (nidle < IDLE)
      idle[nidle++] = fd;
    else
      close(fd);
  } else if (rc == -EUSERS) {
    k->refused++;
  } else {
    if (k->unanswered++ == 0)
      printf("flood: a knock got %d (%s) %s\n", rc, gpuipc_err_name(rc), why);
  }
}

static void parse_ops(const char *who, const char *r)
{
  int n;
  unsigned p50, p99, max;
  if (sscanf(r, "ok %d %u %u %u", &n, &p50, &p99, &max) != 4)
    TFAIL("honest member %s: %s", who, r);
  printf("honest member %s: %d calls, p50 %u us, p99 %u us, max %u us\n", who,
         n, p50, p99, max);
}

int main(void)
{
  struct rlimit rl;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
  rlim_t need = IDLE + 256;
  if (rl.rlim_max < need)
    SKIP("%d connections need %llu descriptors; the hard RLIMIT_NOFILE is "
         "%llu", IDLE, (unsigned long long)need,
         (unsigned long long)rl.rlim_max);
  rl.rlim_cur = rl.rlim_max;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);

  struct peer host, a, b;
  peer_start(&host);
  PEER_OK(&host, "nofile %d", BROKER_NOFILE);
  PEER_OK(&host, "join flood");
  peer_start(&a);
  PEER_OK(&a, "join flood nobroker");
  peer_start(&b);
  PEER_OK(&b, "join flood nobroker");

  /* The flood: stop early if the broker stops answering. */
  struct knocks flood = {0};
  uint64_t t0 = gpuipc__now_ns();
  for (int i = 0; i < IDLE && flood.unanswered < 3; i++)
    knock(&flood);
  printf("flood: %d welcomed and left idle, %d refused, %d unanswered "
         "(%.0f ms)\n", flood.welcomed, flood.refused, flood.unanswered,
         (double)(gpuipc__now_ns() - t0) / 1e6);

  /* The honest work, while the idle connections stay and more knock. */
  peer_send(&a, "pingpong 0 %d %d", ROUNDS, SIZE);
  peer_send(&b, "pingpong 1 %d %d", ROUNDS, SIZE);
  struct knocks during = {0};
  char ra[1024] = "", rb[1024] = "";
  while (ra[0] == '\0' || rb[0] == '\0') {
    if (during.unanswered < 3)
      knock(&during);
    else
      usleep(10000);
    struct pollfd pf[2] = {{.fd = ra[0] ? -1 : a.out, .events = POLLIN},
                           {.fd = rb[0] ? -1 : b.out, .events = POLLIN}};
    if (poll(pf, 2, 0) <= 0)
      continue;
    if (pf[0].revents)
      snprintf(ra, sizeof(ra), "%s", peer_read(&a, PEER_REPLY_MS));
    if (pf[1].revents)
      snprintf(rb, sizeof(rb), "%s", peer_read(&b, PEER_REPLY_MS));
  }
  printf("during: %d welcomed, %d refused, %d unanswered\n", during.welcomed,
         during.refused, during.unanswered);
  parse_ops("a", ra);
  parse_ops("b", rb);

  ASSERT_EQ(flood.unanswered + during.unanswered, 0);
  ASSERT_GT(flood.refused, 0);
  ASSERT_LT(flood.welcomed + 3, BROKER_NOFILE);
  while (nidle > 0)
    close(idle[--nidle]);
  peer_finish(&a);
  peer_finish(&b);
  peer_finish(&host);
  printf("broker_flood: ok\n");
  return 0;
}
