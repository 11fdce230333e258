/*
 * gpuipc_share_copy across rounds: readers join and leave between
 * versions (each version its own round, two at once not mixed); a reader
 * that joins once every chunk is done copies everything from its peers
 * while they are there, and one that comes after they left starts a new
 * round and copies from the publisher; a reader whose destination cannot
 * be lent (imported memory) serves nobody but copies what others did,
 * and alone copies from the publisher; a member that has everything stays
 * while another still copies. After each round the broker lists none of
 * its segments.
 */
#include "test.h"
#include "helpers/share_peer.h"

#include <sys/wait.h>

static void start(struct sreader *r, const char *prefix, unsigned seed,
                  const char *round, const char *dst)
{
  sreader_start(r, "share", prefix, seed, round, "", 1, dst, 10000);
  sreader_expect(r, "ready");
}

static void go(struct sreader *r)
{
  sreader_send(r, "go\n");
  sreader_expect(r, "joined");
}

static void finish(struct sreader *r, struct sresult *s)
{
  sreader_expect(r, "leave");
  sreader_send(r, "out\n");
  sreader_result(r, s);
}

/* Versions 1 and 2 at once: readers {0,1,2} and {3,4}, apart. */
static void two_versions(gpuipc_domain_t *dom)
{
  gpuipc_buf_t *v1[SHARE_NSRC], *v2[SHARE_NSRC];
  share_publish(dom, "v1", 1, v1);
  share_publish(dom, "v2", 2, v2);
  struct sreader r[5];
  for (int i = 0; i < 5; i++)
    start(&r[i], i < 3 ? "v1" : "v2", i < 3 ? 1 : 2, i < 3 ? "x1" : "x2",
          "own");
  for (int i = 0; i < 5; i++)
    go(&r[i]);
  unsigned long long pub[2] = {0, 0};
  for (int i = 0; i < 5; i++) {
    struct sresult s;
    finish(&r[i], &s);
    sresult_check_ok(&s, i);
    pub[i >= 3] += s.pub;
  }
  ASSERT_EQ_U(pub[0], share_nchunks());
  ASSERT_EQ_U(pub[1], share_nchunks());
  for (int i = 0; i < 5; i++)
    ASSERT_EQ(sreader_end(&r[i]), 0);
  share_wait_none(dom, "x1");
  share_wait_none(dom, "x2");
  for (int i = 0; i < SHARE_NSRC; i++) {
    gpuipc_buf_release(v1[i]);
    gpuipc_buf_release(v2[i]);
  }
}

/* A reader that joins once every chunk is done, then one after all left. */
static void late_joiners(gpuipc_domain_t *dom)
{
  gpuipc_buf_t *v[SHARE_NSRC];
  share_publish(dom, "v3", 3, v);
  struct sreader r[3];
  struct sresult s[3];
  for (int i = 0; i < 2; i++)
    start(&r[i], "v3", 3, "x3", "own");
  for (int i = 0; i < 2; i++)
    go(&r[i]);
  for (int i = 0; i < 2; i++)
    sreader_expect(&r[i], "leave"); /* every chunk in, still there */
  start(&r[2], "v3", 3, "x3", "own");
  go(&r[2]);
  finish(&r[2], &s[2]);
  sresult_check_ok(&s[2], 2);
  ASSERT_EQ(s[2].joined, 1);
  ASSERT_EQ_U(s[2].pub, 0);
  ASSERT_EQ_U(s[2].peer, share_nchunks());
  for (int i = 0; i < 2; i++) {
    sreader_send(&r[i], "out\n");
    sreader_result(&r[i], &s[i]);
    sresult_check_ok(&s[i], i);
  }
  ASSERT_EQ_U(s[0].pub + s[1].pub, share_nchunks());
  for (int i = 0; i < 3; i++)
    ASSERT_EQ(sreader_end(&r[i]), 0);
  share_wait_none(dom, "x3");
  /* Everyone left: the name starts a new round, from the publisher. */
  start(&r[0], "v3", 3, "x3", "own");
  go(&r[0]);
  finish(&r[0], &s[0]);
  sresult_check_ok(&s[0], 0);
  ASSERT_EQ_U(s[0].pub, share_nchunks());
  ASSERT_EQ(sreader_end(&r[0]), 0);
  share_wait_none(dom, "x3");
  for (int i = 0; i < SHARE_NSRC; i++)
    gpuipc_buf_release(v[i]);
}

/* HOST destinations a reader opens as segments: imported, not lendable. */
static void imported_dst(gpuipc_domain_t *dom, const char *prefix,
                         gpuipc_buf_t **d)
{
  for (int i = 0; i < SHARE_NDST; i++) {
    char name[GPUIPC_NAME_MAX + 1];
    snprintf(name, sizeof(name), "%s.DST%d", prefix, i);
    gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
    o.bytes = share_dst_size[i];
    o.kind = GPUIPC_KIND_HOST;
    o.flags = GPUIPC_CREATE | GPUIPC_SCRATCH;
    ASSERT_OK(gpuipc_segment_open(dom, name, &o, &d[i]));
  }
}

static void non_server(gpuipc_domain_t *dom)
{
  gpuipc_buf_t *v[SHARE_NSRC], *d1[SHARE_NDST], *d2[SHARE_NDST];
  share_publish(dom, "v4", 4, v);
  imported_dst(dom, "ns1", d1);
  imported_dst(dom, "ns2", d2);
  struct sreader a, n;
  struct sresult sa, sn;
  start(&a, "v4", 4, "x4", "own");
  start(&n, "v4", 4, "x4", "ns1");
  go(&a); /* a server is there before the non-server looks */
  go(&n);
  finish(&n, &sn);
  finish(&a, &sa);
  sresult_check_ok(&sn, 1);
  sresult_check_ok(&sa, 0);
  ASSERT_EQ(sn.joined, 1);
  ASSERT_EQ(sn.server, 0);
  ASSERT_EQ_U(sn.pub, 0);
  ASSERT_EQ_U(sa.pub, share_nchunks());
  ASSERT_EQ(sreader_end(&a), 0);
  ASSERT_EQ(sreader_end(&n), 0);
  share_wait_none(dom, "x4");
  /* Alone, a non-server copies everything from the publisher. */
  start(&n, "v4", 4, "x5", "ns2");
  go(&n);
  finish(&n, &sn);
  sresult_check_ok(&sn, 0);
  ASSERT_EQ(sn.server, 0);
  ASSERT_EQ_U(sn.pub, share_nchunks());
  ASSERT_EQ(sreader_end(&n), 0);
  share_wait_none(dom, "x5");
  for (int i = 0; i < SHARE_NDST; i++) {
    gpuipc_buf_release(d1[i]);
    gpuipc_buf_release(d2[i]);
  }
  for (int i = 0; i < SHARE_NSRC; i++)
    gpuipc_buf_release(v[i]);
}

/*
 * A member that has every chunk stays (serving) while another member of
 * its round still copies: the other, stopped since it joined, continues
 * after the first said it had everything, and copies it all from there.
 */
static void lingering(gpuipc_domain_t *dom)
{
  gpuipc_buf_t *v[SHARE_NSRC];
  share_publish(dom, "v6", 6, v);
  struct sreader a, b;
  struct sresult sa, sb;
  sreader_start(&b, "share", "v6", 6, "x6", "joined:1:stop", 0, "own",
                60000);
  sreader_expect(&b, "ready");
  sreader_start(&a, "share", "v6", 6, "x6", "", 0, "own", 60000);
  sreader_expect(&a, "ready");
  sreader_send(&b, "go\n");
  sreader_expect(&b, "joined");
  int status;
  ASSERT_EQ(waitpid(b.pid, &status, WUNTRACED), b.pid);
  ASSERT_TRUE(WIFSTOPPED(status));
  sreader_send(&a, "go\n");
  sreader_expect(&a, "joined");
  sreader_expect(&a, "leave");
  ASSERT_EQ(kill(b.pid, SIGCONT), 0);
  sreader_result(&b, &sb);
  sreader_result(&a, &sa);
  sresult_check_ok(&sa, 0);
  sresult_check_ok(&sb, 1);
  ASSERT_EQ_U(sa.pub, share_nchunks());
  ASSERT_EQ_U(sb.pub, 0);
  ASSERT_EQ(sreader_end(&a), 0);
  ASSERT_EQ(sreader_end(&b), 0);
  share_wait_none(dom, "x6");
  for (int i = 0; i < SHARE_NSRC; i++)
    gpuipc_buf_release(v[i]);
}

int main(void)
{
  signal(SIGPIPE, SIG_IGN);
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("share", NULL, &dom));
  two_versions(dom);
  late_joiners(dom);
  non_server(dom);
  lingering(dom);
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
