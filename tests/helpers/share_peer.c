/*
 * A reader of tests/helpers/share_peer.h's layout, for the tests of
 * gpuipc_share_copy (share_*.c). Arguments: CMD_FD REP_FD DOMAIN PREFIX
 * SEED ROUND HOOK GATE DST TIMEOUT_MS (share_peer.h's sreader_start says
 * what they mean). Exit status: 0 once the test closed its pipe.
 */
#include "helpers/share_peer.h"
#include "share/share.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

static int rep_fd, cmd_fd;
static int gate;
static enum gpuipc__share_step hook_step;
static long hook_at; /* the N-th time */
static long hook_seen;
static int hook_sig; /* SIGKILL or SIGSTOP; -1: say "at"; 0: no hook */

static void say(const char *line)
{
  size_t n = strlen(line);
  if (write(rep_fd, line, n) != (ssize_t)n)
    _exit(9);
}

/* The next command line (without newline) into @buf; false at EOF. */
static bool hear(char *buf, size_t cap)
{
  size_t n = 0;
  while (n + 1 < cap) {
    char c;
    ssize_t r = read(cmd_fd, &c, 1);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return false;
    if (c == '\n')
      break;
    buf[n++] = c;
  }
  buf[n] = '\0';
  return true;
}

static void hook(enum gpuipc__share_step step, long chunk, void *arg)
{
  (void)chunk;
  (void)arg;
  if (step == GPUIPC__SHARE_JOINED)
    say("joined\n");
  if (step == GPUIPC__SHARE_LEAVE) {
    say("leave\n");
    char line[64];
    if (gate && !(hear(line, sizeof(line)) && strcmp(line, "out") == 0))
      _exit(8);
  }
  if (hook_sig != 0 && step == hook_step && ++hook_seen == hook_at) {
    if (hook_sig < 0)
      say("at\n");
    else
      raise(hook_sig);
  }
}

static void hook_parse(const char *spec)
{
  static const char *steps[] = {"joined", "claimed", "midcopy", "done",
                                "leave",  "settled"};
  char name[16], action[16];
  long at;
  if (spec[0] == '\0')
    return;
  if (sscanf(spec, "%15[a-z]:%ld:%15[a-z]", name, &at, action) != 3)
    TFAIL("bad hook \"%s\"", spec);
  int found = -1;
  for (int i = 0; i < (int)(sizeof(steps) / sizeof(steps[0])); i++)
    if (strcmp(name, steps[i]) == 0)
      found = i;
  if (found < 0)
    TFAIL("bad hook step \"%s\"", name);
  hook_step = (enum gpuipc__share_step)found;
  hook_at = at;
  hook_sig = strcmp(action, "stop") == 0   ? SIGSTOP
             : strcmp(action, "tell") == 0 ? -1
                                           : SIGKILL;
}

static int device = -1; /* of the destinations ("legacy": 0) */

/* Write @n bytes of @c at @p of a destination (on the GPU: a copy). */
static void dst_fill(gpuipc_buf_t *b, int c, size_t n)
{
  if (device < 0) {
    memset(gpuipc_buf_ptr(b), c, n);
    return;
  }
  uint8_t *tmp = malloc(n);
  memset(tmp, c, n);
  ASSERT_OK(gpuipc_memcpy(gpuipc_buf_ptr(b), tmp, n, device, NULL));
  free(tmp);
}

/*
 * Destination @i: our own HOST buffer (lendable), our own LEGACY buffer
 * on GPU 0 ("legacy"), our own buffer of a kind on GPU N ("gpuN-legacy",
 * "gpuN-vmm"), or a segment of @dst (imported: not lendable).
 */
static gpuipc_buf_t *dst_get(gpuipc_domain_t *dom, const char *dst, int i)
{
  gpuipc_buf_t *b;
  int dev;
  char kind[16];
  if (sscanf(dst, "gpu%d-%15s", &dev, kind) == 2) {
    device = dev;
    ASSERT_OK(gpuipc_buf_alloc(share_dst_size[i],
                               strcmp(kind, "vmm") == 0 ? GPUIPC_KIND_VMM
                                                        : GPUIPC_KIND_LEGACY,
                               dev, 0, &b));
  } else if (strcmp(dst, "own") == 0) {
    ASSERT_OK(gpuipc_buf_alloc(share_dst_size[i], GPUIPC_KIND_HOST, -1, 0,
                               &b));
  } else if (strcmp(dst, "legacy") == 0) {
    device = 0;
    ASSERT_OK(gpuipc_buf_alloc(share_dst_size[i], GPUIPC_KIND_LEGACY, 0, 0,
                               &b));
  } else {
    char name[GPUIPC_NAME_MAX + 1];
    snprintf(name, sizeof(name), "%s.DST%d", dst, i);
    ASSERT_OK(gpuipc_segment_open(dom, name, NULL, &b));
  }
  dst_fill(b, SHARE_FILL, share_dst_size[i]);
  return b;
}

/* Bytes of @d that are not what they should be. */
static long check(gpuipc_buf_t *const *d, unsigned seed)
{
  long bad = 0;
  uint8_t *want[SHARE_NDST];
  for (int i = 0; i < SHARE_NDST; i++) {
    want[i] = malloc(share_dst_size[i]);
    memset(want[i], SHARE_FILL, share_dst_size[i]);
  }
  for (int e = 0; e < SHARE_NEXT; e++) {
    const struct share_ext_spec *x = &share_exts[e];
    for (size_t b = 0; b < x->bytes; b++)
      want[x->dst][x->dst_off + b] = share_byte(seed, x->src, x->src_off + b);
  }
  for (int i = 0; i < SHARE_NDST; i++) {
    uint8_t *got = malloc(share_dst_size[i]);
    /* On the GPU: after the copies the call queued on the stream. */
    ASSERT_OK(gpuipc_memcpy(got, gpuipc_buf_ptr(d[i]), share_dst_size[i],
                            device, NULL));
    for (size_t b = 0; b < share_dst_size[i]; b++)
      bad += got[b] != want[i][b];
    free(got);
    free(want[i]);
  }
  return bad;
}

/* Words the fake driver's streams wrote so far: all of them, and those on
 * the legacy default stream, the one the calls here queue on; -1 without
 * the fake. */
static void fake_words(int *all, int *on_stream)
{
  const char *lib = getenv("GPUIPC_CUDA_LIB");
  void *fake = lib != NULL ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : NULL;
  int (*w)(void) = fake != NULL ? (int (*)(void))dlsym(fake,
                                                       "fake_cuda_word_writes")
                                : NULL;
  int (*on)(void *) = fake != NULL
                          ? (int (*)(void *))dlsym(fake,
                                                   "fake_cuda_word_writes_on")
                          : NULL;
  *all = w != NULL ? w() : -1;
  *on_stream = on != NULL ? on(NULL) : -1;
  if (fake != NULL)
    dlclose(fake);
}

/*
 * One gpuipc_share_copy of the layout into @dst, in round @round; says
 * its result line. 0, or 9: what the caller was told is not what the call
 * counted.
 */
/* The round the next calls name as their next (opts.next_round), if any. */
static char next_round[GPUIPC_NAME_MAX + 1];

static int one_call(gpuipc_domain_t *dom, const char *round,
                    gpuipc_buf_t *const *src, gpuipc_buf_t *const *dst,
                    unsigned seed, int timeout_ms)
{
  gpuipc_share_extent_t ext[SHARE_NEXT];
  for (int e = 0; e < SHARE_NEXT; e++)
    ext[e] = (gpuipc_share_extent_t){src[share_exts[e].src],
                                     share_exts[e].src_off,
                                     dst[share_exts[e].dst],
                                     share_exts[e].dst_off,
                                     share_exts[e].bytes};
  gpuipc_share_opts_t o = GPUIPC_SHARE_OPTS_INIT;
  o.chunk_bytes = SHARE_CHUNK;
  o.timeout_ms = timeout_ms;
  gpuipc_share_stats_t ps;
  memset(&ps, 0xff, sizeof(ps));
  o.stats = &ps;
  o.next_round = next_round[0] != '\0' ? next_round : NULL;
  int w0, on0, w1, on1;
  fake_words(&w0, &on0);
  int rc = gpuipc_share_copy(dom, round, ext, SHARE_NEXT, NULL, &o);
  fake_words(&w1, &on1);
  /* What the caller is told is what the call counted. */
  struct gpuipc__share_stats st;
  gpuipc__share_test_stats(&st);
  if (ps.joined != st.joined || ps.server != st.server ||
      ps.chunks != st.nchunks || ps.from_publisher != st.from_pub ||
      ps.from_peers != st.from_peer || ps.taken_over != st.reclaimed ||
      ps.passed_over != st.passed_over || ps.recopied != st.recopied ||
      ps.lent != st.lent || ps.opened != st.opened || ps.ahead != st.ahead)
    return 9;
  char msg[600], out[900];
  snprintf(msg, sizeof(msg), "%s", rc != 0 ? gpuipc_last_error() : "-");
  for (char *p = msg; *p; p++)
    if (*p == '\n')
      *p = ' ';
  snprintf(out, sizeof(out), "rc=%d pub=%llu peer=%llu joined=%d server=%d "
           "reclaimed=%llu passed=%llu slot=%d sources=%llx bad=%ld "
           "lent=%d opened=%d ahead=%d recopied=%llu words=%d on_stream=%d "
           "msg=%s\n", rc,
           (unsigned long long)st.from_pub, (unsigned long long)st.from_peer,
           st.joined, st.server, (unsigned long long)st.reclaimed,
           (unsigned long long)st.passed_over, st.slot,
           (unsigned long long)st.sources,
           rc == 0 ? check(dst, seed) : 0, st.lent, st.opened, st.ahead,
           (unsigned long long)st.recopied, w0 < 0 ? -1 : w1 - w0,
           on0 < 0 ? -1 : on1 - on0, msg);
  say(out);
  return 0;
}

int main(int argc, char **argv)
{
  if (argc != 11)
    TFAIL("usage: share_peer CMD_FD REP_FD DOMAIN PREFIX SEED ROUND HOOK "
          "GATE DST TIMEOUT_MS");
  /* A test that fails leaves no stopped helper behind to hold its
   * output open (SIGKILL ends a stopped process too). */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() == 1)
    return 9;
  cmd_fd = atoi(argv[1]);
  rep_fd = atoi(argv[2]);
  unsigned seed = (unsigned)atoi(argv[5]);
  gate = atoi(argv[8]);
  hook_parse(argv[7]);
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join(argv[3], NULL, &dom));
  gpuipc_buf_t *src[SHARE_NSRC], *dst[SHARE_NDST];
  /* The sources mapped for the GPU of the destinations ("gpuN-..."),
   * whose streams copy from them; else where they lie. */
  int src_dev = -1;
  if (sscanf(argv[9], "gpu%d-", &src_dev) != 1)
    src_dev = -1;
  for (int i = 0; i < SHARE_NSRC; i++) {
    char name[GPUIPC_NAME_MAX + 1];
    share_src_name(name, sizeof(name), argv[4], i);
    gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
    o.device = src_dev;
    ASSERT_OK(gpuipc_segment_open(dom, name, &o, &src[i]));
  }
  for (int i = 0; i < SHARE_NDST; i++)
    dst[i] = dst_get(dom, argv[9], i);
  gpuipc__share_test_hook(hook, NULL);
  say("ready\n");
  char line[64];
  bool heard;
  while ((heard = hear(line, sizeof(line))) && strncmp(line, "next ", 5) == 0)
    snprintf(next_round, sizeof(next_round), "%s", line + 5);
  if (!heard || strcmp(line, "go") != 0)
    return 7;
  int timeout_ms = atoi(argv[10]);
  if (one_call(dom, argv[6], src, dst, seed, timeout_ms) != 0)
    return 9;
  while (hear(line, sizeof(line))) {
    if (strncmp(line, "again ", 6) == 0) {
      for (int i = 0; i < SHARE_NDST; i++)
        dst_fill(dst[i], SHARE_FILL, share_dst_size[i]);
      if (one_call(dom, line + 6, src, dst, seed, timeout_ms) != 0)
        return 9;
    } else if (strncmp(line, "renew ", 6) == 0) {
      int k = atoi(line + 6);
      if (k < 0 || k >= SHARE_NDST)
        return 7;
      gpuipc_buf_release(dst[k]);
      dst[k] = dst_get(dom, argv[9], k);
      say("renewed\n");
    } else if (strcmp(line, "kept") == 0) {
      int lends, opens;
      char out[80];
      gpuipc__share_cache_count(dom, &lends, &opens);
      snprintf(out, sizeof(out), "kept lends=%d opens=%d ahead=%d\n", lends,
               opens, gpuipc__share_ahead_count(dom));
      say(out);
    } else if (strncmp(line, "next ", 5) == 0) {
      snprintf(next_round, sizeof(next_round), "%s", line + 5);
    }
  }
  for (int i = 0; i < SHARE_NDST; i++)
    gpuipc_buf_release(dst[i]);
  for (int i = 0; i < SHARE_NSRC; i++)
    gpuipc_buf_release(src[i]);
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
