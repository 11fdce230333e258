/*
 * Readers that share the copying, driven from a test: the layout every
 * reader copies (five extents of two published HOST segments into three
 * destination buffers, sizes no multiple of the chunk), the bytes the
 * publisher writes, and starting share_peer processes and talking to them
 * one line at a time.
 *
 * A share_peer joins the domain, opens the sources, allocates its
 * destinations and says "ready"; on "go" it calls gpuipc_share_copy. It
 * says "joined" when it took its slot and "leave" once every chunk is in;
 * with a gate it then waits for "out" before it leaves the round. Then it
 * checks every byte and says "rc=RC pub=N peer=N joined=J server=S
 * reclaimed=N passed=N slot=N sources=HEX bad=N lent=N opened=N ahead=N
 * recopied=N words=N on_stream=N msg=LAST_ERROR" (recopied: chunks it
 * copied again from the publisher because the member it had them from
 * died before they settled; those are in both pub and peer; words and
 * on_stream: on the fake driver, the stream words written during the
 * call, all and on the caller's stream, else -1). Before "go" and after
 * its result it takes "next ROUND"
 * (the next_round of its calls from then on). After its result, until
 * EOF (when it exits), it takes commands: "again ROUND" (its destinations
 * filled afresh, another call, in round ROUND, with the same gate),
 * "renew K" (destination K released and allocated anew; says "renewed")
 * and "kept" (says "kept lends=N opens=N ahead=N": what it keeps across
 * calls, and the tables opened ahead for it).
 */
#ifndef GPUIPC_TEST_SHARE_PEER_H
#define GPUIPC_TEST_SHARE_PEER_H

#include "test.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/wait.h>
#include <unistd.h>

#define SHARE_CHUNK ((size_t)64 << 10)
#define SHARE_NSRC 2
#define SHARE_NDST 3
#define SHARE_NEXT 5
#define SHARE_TIMEOUT_MS 500
#define SHARE_REPLY_MS 120000

static const size_t share_src_size[SHARE_NSRC] = {(3u << 20) + 4097,
                                                  (1u << 20) + 333};
static const size_t share_dst_size[SHARE_NDST] = {2u << 20, 2u << 20, 4096};

struct share_ext_spec {
  int src;
  size_t src_off;
  int dst;
  size_t dst_off;
  size_t bytes;
};

static const struct share_ext_spec share_exts[SHARE_NEXT] = {
    {0, 0, 0, 100, (1u << 20) + 12345},
    {1, 7, 1, 0, 300000},
    {0, (1u << 20) + 20000, 0, 100 + (1u << 20) + 12345 + 50,
     3 * (64u << 10) + 1},
    {1, 500000, 2, 3, 17},
    {0, 2u << 20, 1, 300000 + 4096, (1u << 20) - 5},
};

/* Chunks of the layout at SHARE_CHUNK. */
static inline uint64_t share_nchunks(void)
{
  uint64_t n = 0;
  for (int i = 0; i < SHARE_NEXT; i++)
    n += (share_exts[i].bytes + SHARE_CHUNK - 1) / SHARE_CHUNK;
  return n;
}

/* The byte the publisher of version @seed writes at @off of source @src. */
static inline uint8_t share_byte(unsigned seed, int src, size_t off)
{
  uint64_t x = ((uint64_t)seed * 1000003u + (uint64_t)src * 7919u) << 32;
  x ^= off * 0x9e3779b97f4a7c15ull;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 32;
  return (uint8_t)x;
}

/* Destination bytes outside every extent hold this. */
#define SHARE_FILL 0xEE

/* The name of source @i of version prefix @prefix. */
static inline void share_src_name(char *out, size_t cap, const char *prefix,
                                  int i)
{
  snprintf(out, cap, "%s.src%d", prefix, i);
}

/* ----- the test's side ----- */

struct sreader {
  pid_t pid;
  int in, out;
  struct test_lines lines;
  int status; /* exit status once reaped, else -1 */
};

/*
 * Start a reader of version @prefix/@seed in round @round of domain
 * @domain. @hook: "" or "STEP:N:ACTION" (STEP joined, claimed, midcopy,
 * done, leave, settled; ACTION kill or stop, or tell: say "at"; at the
 * N-th time). @gate: wait for "out" before leaving. @dst: "own" (its own HOST buffers, lent),
 * "legacy" (its own LEGACY buffers on GPU 0, lent) or the name of a HOST
 * segment prefix whose DST0..2 it opens (imported: not lendable).
 */
static inline void sreader_spawn(struct sreader *r, const char *prog,
                                 const char *const *more);

static inline void sreader_start(struct sreader *r, const char *domain,
                                 const char *prefix, unsigned seed,
                                 const char *round, const char *hook,
                                 int gate, const char *dst, int timeout_ms)
{
  char s[16], g[4], t[16];
  snprintf(s, sizeof(s), "%u", seed);
  snprintf(g, sizeof(g), "%d", gate);
  snprintf(t, sizeof(t), "%d", timeout_ms);
  const char *more[] = {domain, prefix, s, round, hook, g, dst, t, NULL};
  sreader_spawn(r, "share_peer", more);
}

/* Start helper @prog with CMD_FD REP_FD and then @more (NULL-ended, at
 * most 10) as its arguments: @r talks to it through the two pipes. */
static inline void sreader_spawn(struct sreader *r, const char *prog,
                                 const char *const *more)
{
  r->pid = test_spawn_piped(prog, more, &r->in, &r->out);
  r->lines.len = 0;
  r->status = -1;
}

/* The next line, or NULL at EOF (the reader died). */
static inline const char *sreader_read(struct sreader *r)
{
  return test_lines_next(&r->lines, r->out, r->pid, SHARE_REPLY_MS);
}

/* Read the next line, which must begin with @want; returns it. */
static inline const char *sreader_expect(struct sreader *r, const char *want)
{
  const char *l = sreader_read(r);
  if (l == NULL)
    TFAIL("reader %d: EOF where \"%s\" was due", (int)r->pid, want);
  if (strncmp(l, want, strlen(want)) != 0)
    TFAIL("reader %d said \"%s\" where \"%s\" was due", (int)r->pid, l, want);
  return l;
}

static inline void sreader_send(struct sreader *r, const char *line)
{
  size_t n = strlen(line);
  if (write(r->in, line, n) != (ssize_t)n)
    TFAIL("write to reader %d: %s", (int)r->pid, strerror(errno));
}

struct sresult {
  int rc, joined, server;
  unsigned long long pub, peer, reclaimed, passed;
  int slot;                   /* its member slot (-1: it copied alone) */
  unsigned long long sources; /* a bit for each slot it copied from */
  long bad;
  int lent, opened; /* buffers it lent, peers' segments it mapped, anew */
  int ahead;        /* 1: its table was opened ahead (opts.next_round) */
  unsigned long long recopied; /* copied again from the publisher */
  /* On the fake driver: the words its streams wrote during the call, and
   * those on the caller's stream; else -1. */
  int words, on_stream;
  char msg[600]; /* gpuipc_last_error() after a failure, else "-" */
};

/* Read the result line (after any "joined"/"leave" lines). */
static inline void sreader_result(struct sreader *r, struct sresult *out)
{
  for (;;) {
    const char *l = sreader_read(r);
    if (l == NULL)
      TFAIL("reader %d: EOF before its result", (int)r->pid);
    if (strncmp(l, "rc=", 3) != 0)
      continue;
    int at = -1;
    if (sscanf(l, "rc=%d pub=%llu peer=%llu joined=%d server=%d "
               "reclaimed=%llu passed=%llu slot=%d sources=%llx bad=%ld "
               "lent=%d opened=%d ahead=%d recopied=%llu words=%d "
               "on_stream=%d msg=%n", &out->rc,
               &out->pub, &out->peer, &out->joined, &out->server,
               &out->reclaimed, &out->passed, &out->slot, &out->sources,
               &out->bad, &out->lent, &out->opened, &out->ahead,
               &out->recopied, &out->words, &out->on_stream, &at) != 16 ||
        at < 0)
      TFAIL("reader %d: bad result line \"%s\"", (int)r->pid, l);
    snprintf(out->msg, sizeof(out->msg), "%s", l + at);
    return;
  }
}

/* Close its command pipe (it exits) and reap it: its exit status. */
static inline int sreader_end(struct sreader *r)
{
  if (r->in >= 0)
    close(r->in);
  r->in = -1;
  if (r->status < 0)
    r->status = test_wait(r->pid, SHARE_REPLY_MS);
  close(r->out);
  r->out = -1;
  return r->status;
}

static inline void sresult_check_ok(const struct sresult *s, int who);

/* Send @n readers "go" and wait until each has joined its round. */
static inline void sreaders_go(struct sreader *r, int n)
{
  for (int i = 0; i < n; i++)
    sreader_send(&r[i], "go\n");
  for (int i = 0; i < n; i++)
    sreader_expect(&r[i], "joined");
}

/*
 * Let @n readers that wait at their gate out: each says "leave", is sent
 * "out", and its result is read into @res[i] and checked
 * (sresult_check_ok).
 */
static inline void sreaders_out(struct sreader *r, int n, struct sresult *res)
{
  for (int i = 0; i < n; i++)
    sreader_expect(&r[i], "leave");
  for (int i = 0; i < n; i++)
    sreader_send(&r[i], "out\n");
  for (int i = 0; i < n; i++) {
    sreader_result(&r[i], &res[i]);
    sresult_check_ok(&res[i], i);
  }
}

/* Each of @n readers exits 0. */
static inline void sreaders_end_ok(struct sreader *r, int n)
{
  for (int i = 0; i < n; i++)
    ASSERT_EQ(sreader_end(&r[i]), 0);
}

/* A result every surviving reader must have: rc 0, every byte right, and
 * every chunk from the publisher or a peer (a chunk had from a member
 * that then died is counted from both: it was copied again from the
 * publisher). */
static inline void sresult_check_ok(const struct sresult *s, int who)
{
  if (s->rc != 0 || s->bad != 0)
    TFAIL("reader %d: rc %d, %ld wrong bytes (%s)", who, s->rc, s->bad,
          s->msg);
  if (s->recopied > s->peer || s->recopied > s->pub ||
      s->pub + s->peer - s->recopied != share_nchunks())
    TFAIL("reader %d: %llu chunks from the publisher + %llu from peers - "
          "%llu copied again, not %llu", who, s->pub, s->peer, s->recopied,
          (unsigned long long)share_nchunks());
}

static inline void share_publish(gpuipc_domain_t *dom, const char *prefix,
                                 unsigned seed, gpuipc_buf_t **src);

/* What most share tests begin with: SIGPIPE ignored (a reader that dies
 * closes its pipe), domain "share" joined, version 1 published under
 * "v1" into @v. */
static inline gpuipc_domain_t *share_begin(gpuipc_buf_t **v)
{
  signal(SIGPIPE, SIG_IGN);
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("share", NULL, &dom));
  share_publish(dom, "v1", 1, v);
  return dom;
}

/* What they end with: the published sources @v released, @dom left. */
static inline void share_end(gpuipc_domain_t *dom, gpuipc_buf_t **v)
{
  for (int i = 0; i < SHARE_NSRC; i++)
    gpuipc_buf_release(v[i]);
  ASSERT_OK(gpuipc_domain_leave(dom));
}

/*
 * Publish version @seed's sources under @prefix in @dom, segments of
 * @kind on @device (HOST: -1), returned in @src (release them to let go).
 */
static inline void share_publish_on(gpuipc_domain_t *dom, const char *prefix,
                                    unsigned seed, gpuipc_buf_t **src,
                                    gpuipc_kind_t kind, int device)
{
  for (int i = 0; i < SHARE_NSRC; i++) {
    char name[GPUIPC_NAME_MAX + 1];
    share_src_name(name, sizeof(name), prefix, i);
    gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
    o.bytes = share_src_size[i];
    o.kind = kind;
    o.device = device;
    o.flags = GPUIPC_CREATE | GPUIPC_EXCL;
    ASSERT_OK(gpuipc_segment_open(dom, name, &o, &src[i]));
    uint8_t *p = malloc(share_src_size[i]);
    for (size_t off = 0; off < share_src_size[i]; off++)
      p[off] = share_byte(seed, i, off);
    ASSERT_OK(gpuipc_memcpy(gpuipc_buf_ptr(src[i]), p, share_src_size[i],
                            device, NULL));
    free(p);
    ASSERT_OK(gpuipc_segment_publish(src[i], NULL));
  }
}

/* The same, HOST segments. */
static inline void share_publish(gpuipc_domain_t *dom, const char *prefix,
                                 unsigned seed, gpuipc_buf_t **src)
{
  share_publish_on(dom, prefix, seed, src, GPUIPC_KIND_HOST, -1);
}

/*
 * How many segments of @dom have names beginning with @prefix; with
 * @named_only, those still reachable by name (not unlinked ones that
 * holders keep); of those, how many nobody holds in *@unheld (if not
 * NULL).
 */
static inline int share_segments_where(gpuipc_domain_t *dom,
                                       const char *prefix, bool named_only,
                                       int *unheld)
{
  gpuipc_segment_info_t info[256];
  for (int i = 0; i < 256; i++)
    info[i].size = sizeof(info[i]);
  int n = gpuipc_segment_list(dom, info, 256);
  if (n < 0)
    TFAIL_GPUIPC("gpuipc_segment_list returned %d", n);
  int count = 0, nobody = 0;
  for (int i = 0; i < n && i < 256; i++)
    if (strncmp(info[i].name, prefix, strlen(prefix)) == 0 &&
        !(named_only && info[i].state == GPUIPC_SEG_UNLINKED)) {
      count++;
      nobody += info[i].nholders == 0;
    }
  if (unheld != NULL)
    *unheld = nobody;
  return count;
}

static inline int share_segments_in(gpuipc_domain_t *dom, const char *prefix,
                                    bool named_only)
{
  return share_segments_where(dom, prefix, named_only, NULL);
}

static inline int share_segments_named(gpuipc_domain_t *dom,
                                       const char *prefix)
{
  return share_segments_in(dom, prefix, false);
}

/* The standing lends of process @pid that the broker lists (named), and
 * of those how many nobody holds (in *@unheld). */
static inline int share_standing_of(gpuipc_domain_t *dom, pid_t pid,
                                    int *unheld)
{
  char prefix[64];
  snprintf(prefix, sizeof(prefix), "gpuipc-share.%d.", (int)pid);
  return share_segments_where(dom, prefix, true, unheld);
}

/* The holders of segment @name as the broker lists it; -1 when it is not
 * listed (or unlinked). */
static inline int share_holders(gpuipc_domain_t *dom, const char *name)
{
  gpuipc_segment_info_t x = {.size = sizeof(x)};
  if (gpuipc_segment_stat(dom, name, &x) != 0 ||
      x.state == GPUIPC_SEG_UNLINKED)
    return -1;
  return x.nholders;
}

/* Wait (a minute at most) until segment @name has @want holders. */
static inline void share_wait_holders(gpuipc_domain_t *dom, const char *name,
                                      int want)
{
  for (int i = 0; i < 60000 && share_holders(dom, name) != want; i++)
    usleep(1000);
  if (share_holders(dom, name) != want)
    TFAIL("%s has %d holders a minute on, not %d", name,
          share_holders(dom, name), want);
}

/*
 * Two members of round @round (own destinations) killed at their first
 * claim, the second taking the first's over; then waited for (a minute at
 * most) until the round's table and their standing lends are held by
 * nobody: the broker saw them go. Their standing lends as the broker
 * lists them, and of those how many nobody holds in *@unheld.
 */
static inline int share_kill_two_at_claim(gpuipc_domain_t *dom,
                                          const char *round,
                                          struct sreader k[2], int *unheld)
{
  for (int i = 0; i < 2; i++) {
    sreader_start(&k[i], "share", "v1", 1, round, "claimed:1:kill", 0, "own",
                  SHARE_TIMEOUT_MS);
    sreader_expect(&k[i], "ready");
    sreader_send(&k[i], "go\n");
    ASSERT_EQ(sreader_end(&k[i]), 128 + SIGKILL);
  }
  char table[GPUIPC_NAME_MAX + 1];
  snprintf(table, sizeof(table), "%s.share", round);
  share_wait_holders(dom, table, 0);
  int lent = 0;
  *unheld = 0;
  for (int i = 0; i < 2; i++) {
    int u = 0;
    for (int tries = 0;
         tries < 60000 && (share_standing_of(dom, k[i].pid, &u) != u ||
                           u != SHARE_NDST);
         tries++)
      usleep(1000);
    lent += share_standing_of(dom, k[i].pid, &u);
    *unheld += u;
  }
  return lent;
}

/*
 * @r go in turn into round @round ("go" for their first call, else "again
 * ROUND"), each joining after the one before it, so that the chain is
 * r[0], r[1], ...; each names @next first (NULL: as before). Then they are
 * let out, their results in @res (sreaders_out).
 */
static inline void sreaders_in_order(struct sreader *r, int n,
                                     const char *round, const char *next,
                                     bool first, struct sresult *res)
{
  char line[64];
  for (int i = 0; i < n; i++) {
    if (next != NULL) {
      snprintf(line, sizeof(line), "next %s\n", next);
      sreader_send(&r[i], line);
    }
    snprintf(line, sizeof(line), first ? "go\n" : "again %s\n", round);
    sreader_send(&r[i], line);
    sreader_expect(&r[i], "joined");
  }
  sreaders_out(r, n, res);
}

/* What @r keeps across calls ("kept"): its standing lends, the peers'
 * segments it mapped, the tables opened ahead for it. */
static inline void sreader_kept(struct sreader *r, int *lends, int *opens,
                                int *ahead)
{
  sreader_send(r, "kept\n");
  const char *l = sreader_expect(r, "kept ");
  if (sscanf(l, "kept lends=%d opens=%d ahead=%d", lends, opens, ahead) != 3)
    TFAIL("reader %d: bad line \"%s\"", (int)r->pid, l);
}

/*
 * Wait until the broker lists no segment whose name begins with @prefix
 * (it drops a dead process's holds once it sees its connection close);
 * fails the test, naming what is left, after a minute.
 */
static inline void share_wait_none(gpuipc_domain_t *dom, const char *prefix)
{
  for (int i = 0; i < 60000; i++) {
    if (share_segments_named(dom, prefix) == 0)
      return;
    usleep(1000);
  }
  gpuipc_segment_info_t info[256];
  for (int i = 0; i < 256; i++)
    info[i].size = sizeof(info[i]);
  int n = gpuipc_segment_list(dom, info, 256);
  for (int i = 0; i < n && i < 256; i++)
    if (strncmp(info[i].name, prefix, strlen(prefix)) == 0)
      fprintf(stderr, "left: %s (%s, %d holders)\n", info[i].name,
              gpuipc_segment_state_name(info[i].state), info[i].nholders);
  TFAIL("segments of %s are still listed a minute after every reader left",
        prefix);
}

#endif
