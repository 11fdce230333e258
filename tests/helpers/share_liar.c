/*
 * A member of a share round that lies, for tests/share_liar.c. Arguments:
 * CMD_FD REP_FD DOMAIN ROUND. It maps ROUND's table and writes garbage:
 * members in free slots (two that live and "serve": one with an extent
 * map pointing at buffers it never lent, one at offsets past the end of
 * a 4 KiB segment it did lend, under its id; one whose name holds 4 MiB
 * of garbage that is not the segment its id names; one with the test's pid but
 * another start time, one with flags no member has), each with a place in
 * the chain after the honest members there (so that the next honest one
 * picks them first as its parent) and a prefix word that says it has
 * every chunk (or more than there are), and claim and done
 * words on the chunks: words naming no slot, free slots, its fake
 * members (done, so that others try to read there), and honest members'
 * slots (never with a matching done word: that lie no check can see).
 * It says "lied" after a first burst and goes on lying until "header",
 * when it spoils the header too and says "header"; it exits at EOF. With
 * a fifth argument forge:SLOT it only claims again, in member SLOT's
 * name, the chunks that member has done (zero:SLOT: makes them free
 * again), says "forged" and waits for EOF.
 */
#include "test.h"
#include "share/share.h"
#include "segment/segment.h"
#include "os/os.h"

#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

static struct share_table t;
static uint64_t rng = 0x2545F4914F6CDD1Dull;

static void say(int fd, const char *s)
{
  if (write(fd, s, strlen(s)) != (ssize_t)strlen(s))
    _exit(9);
}

/*
 * Lend a real segment of 4 KiB as fake member 41's buffer 0 (a standing
 * lend of this process, numbered 41), with its true id, so that readers
 * open it and must find the chunks past its end.
 */
static uint64_t fake_lend(gpuipc_domain_t *dom, int slot, size_t bytes,
                          gpuipc_buf_t **out)
{
  char name[GPUIPC_NAME_MAX + 1];
  ASSERT_OK(gpuipc__share_standing_name(name, sizeof(name),
                                        (uint32_t)getpid(), (uint32_t)slot));
  gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
  o.bytes = bytes;
  o.kind = GPUIPC_KIND_HOST;
  o.flags = GPUIPC_CREATE | GPUIPC_SCRATCH;
  ASSERT_OK(gpuipc_segment_open(dom, name, &o, out));
  memset(gpuipc_buf_ptr(*out), 0x5A, bytes);
  uint64_t id = 0;
  ASSERT_OK(gpuipc__seg_id_of(*out, dom, &id));
  return id;
}

static void fake_members(uint64_t lent_id)
{
  /* Tickets past the honest members': the next joiner's come after. */
  uint32_t tk = atomic_fetch_add(&t.hdr->tickets, 8);
  uint32_t me = (uint32_t)getpid();
  uint64_t st = 0;
  (void)gpuipc__pid_start_time(getpid(), &st);
  struct {
    int slot;
    uint32_t pid;
    uint64_t start;
    uint32_t flags, nlent;
  } f[] = {
      {40, me, st, GPUIPC__SM_LIVE | GPUIPC__SM_SERVER, 0xffffffffu},
      {41, me, st, GPUIPC__SM_LIVE | GPUIPC__SM_SERVER, 1},
      {42, (uint32_t)getppid(), st + 12345, GPUIPC__SM_LIVE | GPUIPC__SM_SERVER,
       1},
      {43, 0x7ffffff0u, 7, 0xffffffffu, 3},
      {44, me, st, GPUIPC__SM_LIVE, 1},
      {45, me, st, GPUIPC__SM_LIVE | GPUIPC__SM_SERVER, 1},
  };
  for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
    struct share_member *m = &t.members[f[i].slot];
    m->start_time = f[i].start;
    m->nlent = f[i].nlent;
    for (uint32_t e = 0; e < t.nextents; e++) {
      struct share_ext *x = &t.exts[(size_t)f[i].slot * t.nextents + e];
      x->k = (uint32_t)test_xorshift(&rng) % 3;
      x->off = test_xorshift(&rng);
      x->seg_id = test_xorshift(&rng);
      x->name = (uint32_t)test_xorshift(&rng);
      if (f[i].slot == 41 || f[i].slot == 45) /* its lend's name */
        x->name = (uint32_t)f[i].slot;
      if (f[i].slot == 41) { /* its real 4 KiB: every chunk lies past it */
        x->k = 0;
        x->off = e % 2 ? (1ull << 40) : 4000;
        x->seg_id = lent_id;
      }
      if (f[i].slot == 45) { /* in range, but not the segment it names */
        x->k = 0;
        x->off = 0;
      }
    }
    atomic_store(&m->ticket, f[i].slot == 43 ? 0xdeadbeefu : tk + 1 + (uint32_t)i);
    atomic_store(&m->prefix, f[i].slot == 40 ? ~0ull : t.nchunks);
    atomic_store(&m->pid, f[i].pid);
    atomic_store(&m->flags, f[i].flags);
  }
}

/* One lie on chunk @i. */
static void lie(uint32_t i)
{
  struct share_chunk *ch = &t.chunks[i];
  uint64_t r = test_xorshift(&rng), w;
  switch (r % 6) {
  case 0: /* names nobody: slot bits 0 or past 64 */
    w = (r & ~0xffull) | ((r >> 8) % 2 ? 0 : 65 + (r >> 16) % 190);
    atomic_store(&ch->claim, w);
    atomic_store(&ch->done, test_xorshift(&rng));
    break;
  case 1: /* done by a fake member whose extent map points nowhere */
  case 2:
    w = (r & ~0xffull) | (r % 6 == 1 ? 41 : 42);
    atomic_store(&ch->claim, w);
    atomic_store(&ch->done, w);
    break;
  case 3: /* a claim in an honest member's name (or a free slot's) */
    w = (r & ~0xffull) | (1 + (r >> 8) % 4);
    atomic_store(&ch->claim, w);
    atomic_store(&ch->done, w ^ 0x100);
    break;
  case 4: /* done by the member with impossible flags, by the dead one,
           * by the one whose segment is not what it says */
    w = (r >> 8) % 3;
    w = (r & ~0xffull) | (w == 0 ? 44 : w == 1 ? 43 : 46);
    atomic_store(&ch->claim, w);
    atomic_store(&ch->done, w);
    break;
  default:
    break;
  }
}

/*
 * Forge claims in member @slot's name: every chunk it claimed and marked
 * done is claimed again in its name (the epoch raised), not done.
 */
static void forge(int slot, bool zero)
{
  for (uint32_t i = 0; i < t.nchunks; i++) {
    uint64_t c = atomic_load(&t.chunks[i].claim);
    if (gpuipc__share_claim_slot(c) == slot)
      atomic_store(&t.chunks[i].claim, zero ? 0 : c + 0x100);
  }
}

int main(int argc, char **argv)
{
  if (argc != 5 && argc != 6)
    TFAIL("usage: share_liar CMD_FD REP_FD DOMAIN ROUND "
          "[forge:SLOT|zero:SLOT]");
  /* A test that fails leaves no stopped helper behind to hold its
   * output open (SIGKILL ends a stopped process too). */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() == 1)
    return 9;
  int cmd = atoi(argv[1]), rep = atoi(argv[2]);
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join(argv[3], NULL, &dom));
  char name[GPUIPC_NAME_MAX + 1];
  snprintf(name, sizeof(name), "%s.share", argv[4]);
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_segment_open(dom, name, NULL, &b));
  /* Its own view of the layout, from the header, kept inside the map. */
  const struct share_hdr *h = gpuipc_buf_ptr(b);
  struct share_layout l = {.n = (int)h->nextents, .nchunks = h->nchunks};
  size_t need = gpuipc__share_table_bytes(&l);
  if (need > gpuipc_buf_size(b))
    TFAIL("the table is smaller than its header says");
  gpuipc__share_table_map(&t, b, &l);
  if (argc == 6) {
    bool zero = strncmp(argv[5], "zero:", 5) == 0;
    forge(atoi(argv[5] + 5 + !zero), zero);
    say(rep, "forged\n");
    char c;
    while (read(cmd, &c, 1) > 0)
      ;
    gpuipc_buf_release(b);
    ASSERT_OK(gpuipc_domain_leave(dom));
    return 0;
  }
  gpuipc_buf_t *lent, *other;
  fake_members(fake_lend(dom, 41, 4096, &lent));
  /* Member 45's buffer: 4 MiB of 0x5A under its name, its id unrecorded. */
  (void)fake_lend(dom, 45, 4u << 20, &other);
  for (uint32_t i = 0; i < t.nchunks; i++)
    lie(i);
  say(rep, "lied\n");
  for (;;) {
    struct pollfd p = {.fd = cmd, .events = POLLIN};
    if (poll(&p, 1, 0) > 0) {
      char line[32];
      ssize_t n = read(cmd, line, sizeof(line) - 1);
      if (n <= 0)
        break;
      if (strncmp(line, "header", 6) == 0) {
        atomic_store(&t.hdr->magic, 0xdeadbeefu);
        t.hdr->digest = test_xorshift(&rng);
        say(rep, "header\n");
      }
    }
    lie((uint32_t)(test_xorshift(&rng) % t.nchunks));
    usleep(100);
  }
  gpuipc_buf_t *fake[2] = {lent, other};
  for (int i = 0; i < 2; i++) {
    char lent_name[GPUIPC_NAME_MAX + 1];
    ASSERT_OK(gpuipc__share_standing_name(lent_name, sizeof(lent_name),
                                          (uint32_t)getpid(),
                                          i == 0 ? 41u : 45u));
    ASSERT_OK(gpuipc__segment_unlink_held(dom, lent_name, fake[i]));
    gpuipc_buf_release(fake[i]);
  }
  gpuipc_buf_release(b);
  ASSERT_OK(gpuipc_domain_leave(dom));
  return 0;
}
