/*
 * A broker takes no more connections than its descriptors allow:
 *  - by default at most half of what its soft RLIMIT_NOFILE leaves beyond
 *    the descriptors its process holds otherwise (a CUDA driver holds
 *    dozens on a machine with GPUs) and a margin; the excess is refused
 *    with -EUSERS and a sentence naming GPUIPC_MAX_MEMBERS, and members
 *    already in carry on;
 *  - GPUIPC_MAX_MEMBERS_PER_UID bounds the connections of one uid
 *    (gpuipc_domain_join says -EUSERS at once, not after its timeout);
 *  - a broker whose process has no descriptor free at all answers each
 *    new connection with -EMFILE and closes it, instead of leaving it
 *    unanswered, and takes members again once descriptors are free.
 * Each broker runs in a seg_peer process whose limit the test sets.
 */
#include "test.h"
#include "helpers/raw_proto.h"
#include "helpers/seg_peer.h"

#include <sys/resource.h>

/* The limit of the brokers below beyond what their processes hold
 * otherwise, and more knocks than it allows. */
#define NOFILE 64
#define TRIES 200
#define KNOCK_MS 3000

static int conns[TRIES];
static int nconns;
static char why[GPUIPC__TEXT_MAX + 1];

/* Knock until refused: the refusal's code. */
static int fill(const char *domain)
{
  for (;;) {
    ASSERT_LT(nconns, TRIES);
    int rc = raw_knock(domain, KNOCK_MS, &conns[nconns], why, sizeof(why));
    if (rc != 1)
      return rc;
    nconns++;
  }
}

static void close_conns(void)
{
  while (nconns > 0)
    close(conns[--nconns]);
}

/* Knock until welcomed (members leave in the broker's own time). */
static void knock_in(const char *domain)
{
  int fd = -1, rc = 0;
  for (int tries = 0; tries < 500; tries++) {
    rc = raw_knock(domain, KNOCK_MS, &fd, why, sizeof(why));
    if (rc == 1) {
      close(fd);
      return;
    }
    usleep(10000);
  }
  TFAIL("%s: still refused: %d (%s)", domain, rc, why);
}

/* Bytes from one honest member to another, through the broker. */
static void honest(struct peer *a, struct peer *b, const char *seg)
{
  PEER_OK(a, "open %s 65536 cx", seg);
  PEER_OK(a, "fill %s 11", seg);
  PEER_OK(b, "open %s 65536 -", seg);
  PEER_OK(b, "check %s 11", seg);
  PEER_OK(b, "release %s", seg);
  PEER_OK(a, "release %s", seg);
  PEER_OK(a, "unlink %s", seg);
}

/* A broker's process whose soft limit is NOFILE more than it holds once
 * its broker runs; the limit. */
static int host_start(struct peer *h, const char *domain)
{
  peer_start(h);
  PEER_OK(h, "join %s", domain);
  int limit = test_count_fds(h->pid) + NOFILE;
  PEER_OK(h, "nofile %d", limit);
  return limit;
}

static void member_start(struct peer *p, const char *domain)
{
  peer_start(p);
  PEER_OK(p, "join %s nobroker", domain);
}

static void derived_cap(void)
{
  struct peer host, a, b;
  int limit = host_start(&host, "conns.fd");
  member_start(&a, "conns.fd");
  member_start(&b, "conns.fd");
  int rc = fill("conns.fd");
  printf("derived: %d idle members taken (limit %d, %d beyond what the "
         "process held), then: %d %s\n", nconns, limit, NOFILE, rc, why);
  ASSERT_EQ(rc, -EUSERS);
  if (strstr(why, "GPUIPC_MAX_MEMBERS") == NULL)
    TFAIL("the refusal does not name GPUIPC_MAX_MEMBERS: %s", why);
  ASSERT_LT(nconns + 3, NOFILE / 2);
  ASSERT_GE(nconns + 3, 8); /* the cap leaves room to work */
  /* The refusal lasts, and costs the broker no descriptor. */
  for (int i = 0; i < 20; i++)
    ASSERT_EQ(raw_knock("conns.fd", KNOCK_MS, &(int){-1}, why, sizeof(why)),
              -EUSERS);
  honest(&a, &b, "fd.s1");
  close_conns();
  knock_in("conns.fd");
  honest(&b, &a, "fd.s2");
  peer_finish(&a);
  peer_finish(&b);
  peer_finish(&host);
}

static void per_uid_cap(void)
{
  struct peer host;
  peer_start(&host);
  PEER_OK(&host, "setenv GPUIPC_MAX_MEMBERS_PER_UID 3");
  PEER_OK(&host, "join conns.uid");
  int rc = fill("conns.uid");
  printf("per uid: %d idle members taken, then: %d %s\n", nconns, rc, why);
  ASSERT_EQ(rc, -EUSERS);
  ASSERT_EQ(nconns, 2); /* the host's own member is the third */
  if (strstr(why, "GPUIPC_MAX_MEMBERS_PER_UID") == NULL)
    TFAIL("the refusal does not name GPUIPC_MAX_MEMBERS_PER_UID: %s", why);
  /* What a program sees: a sentence at once, not a timeout. */
  gpuipc_domain_t *d;
  gpuipc_domain_opts_t o = {sizeof(o), GPUIPC_JOIN_NO_BROKER, 30000};
  uint64_t t0 = gpuipc__now_ns();
  ASSERT_RC(gpuipc_domain_join("conns.uid", &o, &d), -EUSERS);
  ASSERT_ERR_MENTIONS("GPUIPC_MAX_MEMBERS_PER_UID");
  printf("per uid: gpuipc_domain_join: %s (%.1f ms)\n", gpuipc_last_error(),
         (double)(gpuipc__now_ns() - t0) / 1e6);
  close_conns();
  knock_in("conns.uid");
  peer_finish(&host);
}

static void no_descriptor(void)
{
  struct peer host, a, b;
  host_start(&host, "conns.hog");
  member_start(&a, "conns.hog");
  member_start(&b, "conns.hog");
  const char *r = peer_cmd(&host, "hog");
  ASSERT_EQ(strncmp(r, "ok", 2), 0);
  for (int i = 0; i < 20; i++) {
    int fd = -1;
    int rc = raw_knock("conns.hog", KNOCK_MS, &fd, why, sizeof(why));
    if (i == 0)
      printf("no descriptor: %d %s\n", rc, why);
    ASSERT_EQ(rc, -EMFILE);
  }
  if (strstr(why, "descriptor") == NULL)
    TFAIL("the refusal does not speak of descriptors: %s", why);
  PEER_OK(&host, "unhog");
  knock_in("conns.hog");
  honest(&a, &b, "hog.s");
  peer_finish(&a);
  peer_finish(&b);
  peer_finish(&host);
}

int main(void)
{
  struct rlimit rl;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_max < 2 * TRIES)
    SKIP("RLIMIT_NOFILE hard limit %llu", (unsigned long long)rl.rlim_max);
  if (rl.rlim_cur < 2 * TRIES) {
    rl.rlim_cur = 2 * TRIES;
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
  }
  derived_cap();
  per_uid_cap();
  no_descriptor();
  printf("broker_conns: ok\n");
  return 0;
}
