/*
 * src/share: readers that share the copying (docs/shared-copy.md).
 *
 *   table.c   the round table's layout in its HOST segment, the layout
 *             digest, the header's set-up and checks, member and claim
 *             words decoded with every field checked
 *   chain.c   the members' order (tickets taken as they join) and each
 *             member's parent, the member it copies from
 *   claims.c  claiming chunks, stale claims, members' liveness and FAILED
 *             marks
 *   lend.c    the members' destinations lent as segments, and the peers'
 *             lent segments a call reads from
 *   cache.c   what a member keeps across calls: its standing lends, the
 *             peers' segments it opened
 *   copy.c    the copy loop: chunks in order, each from the parent (or,
 *             at the head of the chain, claimed and copied from the
 *             publisher), stale claims and parents; HOST and GPU movers
 *   sweep.c   rounds whose members all died: closed and unlinked by the
 *             next member that creates a round's table
 *   share.c   gpuipc_share_copy, gpuipc_segment_copy_shared: arguments,
 *             joining and leaving the round
 *
 * It sits above src/segment (it opens, lends and unlinks segments) and
 * below nothing: no other layer calls it.
 */
#ifndef GPUIPC_SHARE_H
#define GPUIPC_SHARE_H

#include "core/core.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GPUIPC__SHARE_MAGIC 0x52485347u  /* "GSHR" */
#define GPUIPC__SHARE_BUSY 0x59535542u   /* "BUSY": its creator sets it up */
#define GPUIPC__SHARE_LAYOUT 3u
#define GPUIPC__SHARE_TABLE_SUFFIX ".share"
#define GPUIPC__SHARE_MEMBERS 64
#define GPUIPC__SHARE_EXT_MAX 4096       /* extents in one call */
#define GPUIPC__SHARE_CHUNKS_MAX (1u << 16) /* each turn scans them */
#define GPUIPC__SHARE_CHUNK_DEFAULT ((size_t)64 << 20)
#define GPUIPC__SHARE_CHUNK_ALIGN ((size_t)4096)
/*
 * GPU members queue copies ahead of what has landed: claims (with their
 * copies from the publisher) while fewer than GPUIPC__SHARE_AHEAD bytes
 * of them are in flight, copies from the parent likewise, and at most
 * GPUIPC__SHARE_RING copies of each. Enough queued work to outlast what
 * holds a member's host up meanwhile (an open of its parent's next lent
 * segment takes 0.5-0.9 ms; 1 GiB takes about 3 ms over NVLink), and
 * tensors of a few kilobytes, each a chunk of its own, queued by the
 * hundred rather than one host turn each; few enough that a member
 * leaves a parent that died or stalled with little queued from it.
 */
#define GPUIPC__SHARE_AHEAD ((uint64_t)1 << 30)
#define GPUIPC__SHARE_RING 512
/* How long a member waits on a parent that makes no progress, or on a
 * member before it in the chain that is still joining, before it copies
 * from the next one up the chain (or heads it). Far above a chunk's copy
 * (a 64 MiB chunk takes 0.2 ms over NVLink, 3 ms over PCIe 4) and a
 * member's start; far below a timeout. */
#define GPUIPC__SHARE_PATIENCE_MS 50
/* A member waiting (for a chunk, for its copies to land, for the members
 * that still copy from it) looks again every 20 us for this long, then
 * naps longer, up to 1 ms. */
#define GPUIPC__SHARE_EAGER_NS (100ull * 1000 * 1000)
#define GPUIPC__SHARE_NAP_US 20
#define GPUIPC__SHARE_NAP_MAX_US 1000

/* Member flags (struct share_member.flags). */
#define GPUIPC__SM_LIVE 0x1u    /* joined: its fields are written */
#define GPUIPC__SM_SERVER 0x2u  /* lent its destination: may be a parent, and
                                   claims chunks when it heads the chain */
#define GPUIPC__SM_LEAVING 0x4u /* done: nobody starts a copy from it */
#define GPUIPC__SM_LEFT 0x8u    /* gone from the round */
#define GPUIPC__SM_FAILED 0x10u /* marked by a peer: its call fails */
#define GPUIPC__SM_DONE 0x20u   /* has every chunk; still serves */
#define GPUIPC__SM_KNOWN 0x3fu

/*
 * The round table, a HOST segment every member maps. All words are
 * little-endian (the machine's: one machine) and written with atomics.
 * header at 0 (one page), then member[64], chunk[nchunks], then the
 * members' extent maps ext[64][nextents].
 */
struct share_hdr {
  _Atomic uint32_t magic; /* 0: new; BUSY: being set up; MAGIC */
  uint32_t layout;        /* GPUIPC__SHARE_LAYOUT */
  uint64_t digest;        /* of the extent layout (share_digest) */
  uint64_t chunk_bytes;
  uint32_t nchunks;
  uint32_t nextents;
  _Atomic uint32_t closed; /* 1: the last member left; joiners go alone */
  _Atomic uint32_t tickets; /* tickets taken so far (chain.c) */
  uint64_t created_ns;
};

struct share_member {
  _Atomic uint32_t pid;   /* 0: free; taken by compare-and-swap */
  _Atomic uint32_t flags; /* GPUIPC__SM_* */
  uint64_t start_time;    /* of its pid (/proc), against pid reuse */
  uint64_t joined_ns;
  uint32_t nlent;         /* destination buffers it lent */
  uint32_t pad;
  /* Reads from servers: rseq[s] is the number of this member's last copy
   * from server s, rdone the number of its last copy that has landed
   * (written after the copy: by the host, or by its stream). */
  _Atomic uint64_t rdone;
  _Atomic uint64_t rseq[GPUIPC__SHARE_MEMBERS];
  _Atomic uint64_t from_pub; /* chunks it copied from the publisher */
  _Atomic uint64_t from_peer;
  /* Counted up as the member works (each turn, each nap of its waits):
   * a claimer whose beat stands still through the timeout has stalled
   * (not a parent: one without progress is passed over, nobody fails). */
  _Atomic uint64_t beat;
  /* Its place in the chain: 1, 2, ... in the order members joined (0:
   * none yet), written before it is LIVE (chain.c). */
  _Atomic uint32_t ticket;
  uint32_t pad3;
  /* Chunks 0 .. prefix - 1 have landed in its destination (written after
   * each copy: by the host, or by its stream). */
  _Atomic uint64_t prefix;
  uint8_t pad2[24];
};

struct share_chunk {
  _Atomic uint64_t claim;      /* 0 free; else epoch << 8 | (slot + 1) */
  _Atomic uint64_t done;       /* the claim word whose copy has landed */
  _Atomic uint64_t claimed_ns; /* when it was claimed (diagnostics) */
  uint64_t pad;
};

/* Where a member's extent lies in what it lent. */
struct share_ext {
  uint32_t k;    /* its lent buffer (< nlent) */
  uint32_t name; /* that lend's name: GPUIPC__SHARE_STANDING "<pid>.<name>" */
  uint64_t off; /* offset of the extent in that buffer */
  uint64_t seg_id; /* the broker's id of lent segment k, to check it */
};

/* A mapped table and where its parts are. */
struct share_table {
  gpuipc_buf_t *buf;
  uint8_t *base;
  size_t size;
  struct share_hdr *hdr;
  struct share_member *members;
  struct share_chunk *chunks;
  struct share_ext *exts; /* [slot * nextents + e] */
  uint32_t nchunks;
  uint32_t nextents;
  bool created; /* this process set its header up (a new round) */
};

/* One chunk: a piece of one extent. */
struct share_piece {
  uint32_t ext;
  uint64_t off; /* in the extent */
  uint64_t bytes;
};

/* The chunk layout of one call (the same in every member of a round). */
struct share_layout {
  int n;
  const gpuipc_share_extent_t *ext;
  uint64_t chunk_bytes;
  uint32_t nchunks;
  struct share_piece *pieces; /* [nchunks] */
  uint64_t digest;
};

/* ----- table.c ----- */
/* Cut the extents into chunks (@out->pieces allocated); -EINVAL too many. */
int gpuipc__share_layout(const gpuipc_share_extent_t *ext, int n,
                         uint64_t chunk_bytes, struct share_layout *out);
void gpuipc__share_layout_free(struct share_layout *l);
/* The round table's name: "<round>.share" (GPUIPC__SHARE_TABLE_SUFFIX). */
void gpuipc__share_table_name(char *out, size_t cap, const char *round);
/* Bytes of the table of @l. */
size_t gpuipc__share_table_bytes(const struct share_layout *l);
/* Point @t's parts into @buf (of gpuipc__share_table_bytes). */
void gpuipc__share_table_map(struct share_table *t, gpuipc_buf_t *buf,
                             const struct share_layout *l);
/*
 * Point @t's parts into @buf, a table found by name whose layout is not
 * known: from its header, checked (magic, layout version, counts, its
 * size against @buf's). 0, or GPUIPC_E_MISMATCH (not a table of ours).
 */
int gpuipc__share_table_map_found(struct share_table *t, gpuipc_buf_t *buf);
/*
 * Set the header up if the table is new (t->created), else wait (up to
 * @timeout_ms) for its creator to; then check it describes @l. 0; GPUIPC_E_MISMATCH
 * (another layout, or a header that is not one) with a sentence;
 * -ETIMEDOUT (its creator never finished).
 */
int gpuipc__share_table_init(struct share_table *t,
                             const struct share_layout *l, int timeout_ms);

/*
 * Open (or create) round @round's table for layout @l, as a member does:
 * mapped, its header set up or checked (gpuipc__share_table_init), and
 * for GPU @device (>= 0) registered, with *@words its address for that
 * device's streams. 0, or the code (nothing then held).
 */
int gpuipc__share_table_open(gpuipc_domain_t *dom, const char *round,
                             const struct share_layout *l, int device,
                             int timeout_ms, struct share_table *t,
                             uint64_t *words);

/* A claim word's member slot, or -1 when it names none (0 included). */
static inline int gpuipc__share_claim_slot(uint64_t c)
{
  uint64_t s = c & 0xffu;
  return s >= 1 && s <= GPUIPC__SHARE_MEMBERS ? (int)s - 1 : -1;
}

static inline uint64_t gpuipc__share_claim_word(uint64_t epoch, int slot)
{
  return (epoch << 8) | (uint64_t)(slot + 1);
}

/* ----- claims.c ----- */
/* What this process knows of a peer during a call. */
struct share_peer {
  uint32_t pid;
  bool have_start;     /* start_time read once the member was LIVE */
  uint64_t start_time;
  uint64_t checked_ns; /* when its pid was last looked at */
  bool gone;           /* dead, or its pid is another process now */
};

/* Whether member @m (slot @slot) may serve now: LIVE, SERVER, not
 * LEAVING, LEFT or FAILED, and its pid alive (looked at now and then). */
bool gpuipc__share_serving(struct share_table *t, int slot,
                           struct share_peer *peers, uint64_t now);
/* Whether process @pid is gone: dead, or (@have_start) its pid another
 * process's now than the one that started at @start_time. */
bool gpuipc__share_pid_gone(uint32_t pid, bool have_start,
                            uint64_t start_time);
/* Whether member @slot is gone: its process dead or reused, or LEFT. */
bool gpuipc__share_gone(struct share_table *t, int slot,
                        struct share_peer *peers, uint64_t now);
/* Claim chunk @i for @me if it is free: true with its claim word in
 * *@word. */
bool gpuipc__share_claim_at(struct share_table *t, long i, int me,
                            uint64_t *word);
/* Take chunk @i from claim @old (stale) for @me, with the epoch raised.
 * true when it is ours now (*@word). */
bool gpuipc__share_reclaim(struct share_table *t, long i, uint64_t old,
                           int me, uint64_t *word);
/*
 * Whether a member of @t other than slot @except is still in the round:
 * its process there (looked at now), not LEFT and not FAILED (a failed
 * member may stay stopped for ever: the round's names go without it, and
 * its mappings stay its own). The last member out's rule, and the sweep's.
 */
bool gpuipc__share_any_live(struct share_table *t, int except,
                            struct share_peer *peers);
/* Mark member @slot FAILED (a peer found it stalled or dead). */
void gpuipc__share_mark_failed(struct share_table *t, int slot);
/* This member is at work (its beat goes on). */
static inline void gpuipc__share_beat(struct share_table *t, int me)
{
  atomic_fetch_add_explicit(&t->members[me].beat, 1, memory_order_relaxed);
}

/* ----- cache.c ----- */
/* A member's standing lends are named GPUIPC__SHARE_STANDING "<pid>.<n>". */
#define GPUIPC__SHARE_STANDING "gpuipc-share."
/* What a call has not used for this many calls of its process goes. */
#define GPUIPC__SHARE_KEEP_CALLS 8

struct share_cache_entry;
/* One use of a kept segment, taken by a call and put back at its end. */
struct share_kept {
  struct share_cache_entry *entry; /* NULL: none taken */
  uint64_t id;                     /* the broker's id of the segment */
  uint32_t n;                      /* a standing lend's name number */
  bool fresh;                      /* lent or opened by this call */
};

int gpuipc__share_standing_name(char *out, size_t cap, uint32_t pid,
                                uint32_t n);
/*
 * The standing lend of @dst through @dom, lent now if it is not yet: 0
 * with one use of it in @out (its id and name number), or the lend's code.
 */
int gpuipc__share_cache_lend(gpuipc_domain_t *dom, gpuipc_buf_t *dst,
                             struct share_kept *out);
/*
 * Segment @id, lent by process @pid (started at @start_time) as its
 * standing lend @n, mapped for @device: found kept, or opened now (and
 * checked to be @id); one use of it in @out. NULL when it cannot be.
 */
gpuipc_buf_t *gpuipc__share_cache_open(gpuipc_domain_t *dom, uint32_t pid,
                                       uint64_t start_time, uint32_t n,
                                       uint64_t id, int device,
                                       struct share_kept *out);
gpuipc_buf_t *gpuipc__share_kept_buf(const struct share_kept *k);
/* Put a use back. @settled false: copies from it may still be queued, so
 * an opened segment is never let go. */
void gpuipc__share_cache_put(struct share_kept *k, bool settled);
/* At the end of a call through @dom: let go of what is no longer wanted
 * (see cache.c). Returns the call count now. */
uint64_t gpuipc__share_cache_tick(gpuipc_domain_t *dom);
/* Tests: what this process keeps for @dom. */
void gpuipc__share_cache_count(gpuipc_domain_t *dom, int *lends, int *opens);

/*
 * A finished round's end (sweep.c), for this member: unlink its table
 * @table when this member closed round @round (@closed), let go of
 * @table unless @keep (unsettled: its stream writes there), and sweep the
 * domain (gpuipc__share_sweep, skipping @round's table) when @sweep.
 */
void gpuipc__share_round_end(gpuipc_domain_t *dom, const char *round,
                             gpuipc_buf_t *table, bool closed, bool keep,
                             bool sweep);

/* ----- ahead.c ----- */
/*
 * After a call: on a thread of the library, end the call's round @round
 * with its table @retire (gpuipc__share_round_end with @closed and
 * @sweep; NULL: no round, nothing to end), then open the table of round
 * @next for layout @l on @device, as a member's call would, for the next
 * call (started at call count @now). What the call's last member out did
 * before returning (a request to the broker each) is then off the path
 * of the sync. false when it cannot start: the caller then ends the
 * round itself.
 */
bool gpuipc__share_ahead_start(gpuipc_domain_t *dom, const char *next,
                               const struct share_layout *l, int device,
                               int timeout_ms, gpuipc_buf_t *retire,
                               const char *round, bool closed, bool sweep,
                               uint64_t now);
/*
 * The table opened ahead for round @round, waiting for its thread: 0 with
 * @t mapped (and *@words its address for @device's streams); -ENOENT when
 * none was, or it is of another layout or device (let go).
 */
int gpuipc__share_ahead_take(gpuipc_domain_t *dom, const char *round,
                             const struct share_layout *l, int device,
                             struct share_table *t, uint64_t *words);
/* Let go of the tables of @dom opened ahead and not taken for
 * GPUIPC__SHARE_KEEP_CALLS calls (cache.c's tick, at call count @now). */
void gpuipc__share_ahead_tick(gpuipc_domain_t *dom, uint64_t now);
/* @dom is left: every table opened ahead for it goes. */
void gpuipc__share_ahead_leave(gpuipc_domain_t *dom);
/* fork(): 0 before it, 1 after in the parent, 2 after in the child. */
void gpuipc__share_ahead_fork(int phase);
/* Tests: the tables opened ahead for @dom, taken or not. */
int gpuipc__share_ahead_count(gpuipc_domain_t *dom);

/* ----- lend.c ----- */
struct share_lent; /* what this member lent */
struct share_peers_open; /* the peers' segments this call reads from */

/*
 * Lend the distinct destination buffers of @l (standing lends, kept
 * across calls) as member @slot's, record them and the extent map in @t.
 * 0 with *@fresh the lends made now (not kept from an earlier call), or
 * the code of the first lend that failed (nothing then lent: the member
 * serves nobody).
 */
int gpuipc__share_lend(gpuipc_domain_t *dom, struct share_table *t,
                       int slot, const struct share_layout *l,
                       struct share_lent **out, int *fresh);
/* Put back what was lent (it stays lent: cache.c). */
void gpuipc__share_lend_end(struct share_lent *lent);
/*
 * The address of chunk @i (of @l) in server @slot's lent memory, opened
 * (and checked against the segment id the server recorded) on first use
 * for local @device; NULL when it cannot be read from there.
 */
const void *gpuipc__share_peer_src(gpuipc_domain_t *dom,
                                   struct share_table *t,
                                   struct share_peers_open **po, int slot,
                                   const struct share_layout *l, long i,
                                   int device);
/* Put back what the call read from; *@opened: how many it mapped anew. */
void gpuipc__share_peers_close(struct share_peers_open *po, bool settled,
                               int *opened);

/* ----- copy.c ----- */
/* Counts of one call, for tests (gpuipc__share_test_stats). */
struct gpuipc__share_stats {
  int joined;      /* 1: member of a round; 0: copied alone */
  int server;      /* 1: claimed and served */
  int slot;
  uint64_t nchunks;
  uint64_t from_pub;
  uint64_t from_peer;
  uint64_t reclaimed; /* stale claims taken over */
  uint64_t passed_over; /* parents passed over */
  uint64_t recopied; /* chunks copied again from the publisher: the member
                        they came from died before they settled */
  uint64_t sources;     /* a bit for each member slot it copied from */
  int ahead;  /* 1: its table was opened ahead (ahead.c) */
  int lent;   /* destination buffers it lent anew (not kept from before) */
  int opened; /* peers' lent segments it mapped anew */
};

/* One call's state as the copy loop sees it. */
struct share_call {
  gpuipc_domain_t *dom;
  const char *round;
  const struct share_layout *l;
  struct share_table *t; /* NULL: alone */
  int me;
  bool server;
  int device;   /* local ordinal of the copies (-1: HOST: the CPU copies) */
  void *stream; /* every copy and word of a GPU member, in chunk order */
  uint32_t ticket; /* its place in the chain (chain.c) */
  long next;       /* the first chunk it has not had */
  uint64_t prefix; /* the last prefix word it wrote */
  /* Own claims whose copy may not have landed yet, oldest first (a ring),
   * and their bytes: a member claims again only while they are below
   * GPUIPC__SHARE_AHEAD, so that claims follow what its copies from the
   * publisher achieve. */
  long inflight[GPUIPC__SHARE_RING];
  int nin, in0;
  uint64_t in_bytes;
  uint64_t words; /* the table's address for @device's streams */
  /* A GPU member's words of the chunk at hand (done, rdone, prefix),
   * written together once its copy has landed (words_flush in copy.c). */
  uint64_t pend_addr[4], pend_val[4];
  int npend;
  int timeout_ms;
  const char *next_round; /* the caller's next round (ahead.c), or NULL */
  struct share_peer peers[GPUIPC__SHARE_MEMBERS];
  struct share_peers_open *po;
  uint64_t rseq; /* the number of this member's last copy from a peer */
  /* Bytes of copies from peers queued so far, and as of copy number s
   * (at [s % GPUIPC__SHARE_RING]): those of copies whose rdone has not
   * come are in flight. */
  uint64_t peer_bytes;
  uint64_t peer_cum[GPUIPC__SHARE_RING];
  uint8_t *have; /* [nchunks] */
  uint64_t missing; /* chunks not had yet */
  uint64_t *own;  /* [nchunks]: the claim word this member took, or 0 */
  int8_t *from;   /* [nchunks]: the server slot it came from, -1 publisher */
  /* [nchunks]: a claim as first seen, when, and its claimer's beat then */
  uint64_t *seen_claim, *seen_ns, *seen_beat;
  /* Parents this call passed over (no progress within the patience, or
   * unable to serve a chunk), and the parent waited on: its prefix as
   * first seen, and when; joiners waited on, since when. */
  uint8_t skip[GPUIPC__SHARE_MEMBERS];
  int pwait_slot;
  uint64_t pwait_prefix, pwait_ns;
  uint64_t jwait_ns[GPUIPC__SHARE_MEMBERS];
  struct gpuipc__share_stats st;
};

/* ----- sweep.c ----- */
/*
 * Close the rounds of @dom whose members are all gone (dead, LEFT or
 * FAILED) and that nobody holds: unlink their tables, as their last member
 * out would have; unlink the standing lends nobody holds (their lenders
 * died). Called by a member
 * that created a round's table (@mine, skipped); at most once a second
 * a process.
 */
void gpuipc__share_sweep(gpuipc_domain_t *dom, const char *mine);
/*
 * The same now, whenever it last ran (`gpuipc ls --prune DOMAIN`), @mine
 * NULL or skipped; @on_unlinked (if not NULL) is told each name it
 * unlinked, and whether it was a round's table (else a standing lend).
 * How many it unlinked, or the code of listing the domain's segments.
 */
int gpuipc__share_sweep_now(gpuipc_domain_t *dom, const char *mine,
                            void (*on_unlinked)(const char *name, bool table,
                                                void *arg),
                            void *arg);

/* ----- chain.c ----- */
/* Take this member's ticket (before it is LIVE); the ticket. */
uint32_t gpuipc__share_ticket_take(struct share_table *t, int me);
/*
 * The member @c copies its next chunk from: for a server the serving
 * member with the highest ticket below its own, for a non-server the
 * serving server with the highest ticket; -1 when there is none (a server
 * then heads the chain); -2 when a member with a lower ticket is still
 * joining (wait for it: at most the timeout, while its process lives).
 */
int gpuipc__share_parent(struct share_call *c, uint64_t now);
/*
 * Whether to pass over parent @p, whose prefix @prefix does not reach the
 * chunk @c waits for: no progress within the patience (or the timeout,
 * when shorter) of when @c first saw that prefix. Nobody is marked FAILED
 * for it: a member that fell behind holds up nobody once passed over, and
 * its own bytes are right.
 */
bool gpuipc__share_parent_stalled(struct share_call *c, int p,
                                  uint64_t prefix, uint64_t now);

/*
 * A wait's naps: gpuipc__share_nap sleeps @w->us, then sets the next nap:
 * GPUIPC__SHARE_NAP_US while @busy (copies it queued are in flight) or
 * until the wait is GPUIPC__SHARE_EAGER_NS old, then doubling up to
 * GPUIPC__SHARE_NAP_MAX_US. What a wait waits for lands within a
 * chunk's copy, a few hundred microseconds, most of the time: a nap of a
 * millisecond there is a millisecond added to the sync.
 */
struct share_nap {
  unsigned us;
  uint64_t since; /* ns; 0 before the first nap */
};
#define GPUIPC__SHARE_NAP_INIT {GPUIPC__SHARE_NAP_US, 0}
void gpuipc__share_nap(struct share_nap *w, bool busy);
/* The nap after one of @us, @waited_ns into the wait. */
unsigned gpuipc__share_nap_next(unsigned us, uint64_t waited_ns, bool busy);
/* Restart @w's schedule (the wait made progress). */
void gpuipc__share_nap_reset(struct share_nap *w);

/* Copy everything of @c->l; with a table, sharing. 0, or the code. */
int gpuipc__share_run(struct share_call *c);
/* Copy every chunk @c still misses from the publisher. */
int gpuipc__share_alone(struct share_call *c);
/*
 * Mark this member DONE, then stay in the round (serving) until every
 * other live member is DONE too, or the timeout passes: members that
 * still copy find their chunks here rather than at the publisher.
 */
void gpuipc__share_linger(struct share_call *c);
/* Wait (bounded) until no peer copies from this member any more. */
void gpuipc__share_drain(struct share_call *c);
/*
 * GPU kinds: wait until everything this member queued on its stream has
 * completed (a last word its stream writes), so that the peers' memory it
 * copied from and the table its stream writes into may be let go, and a
 * FAILED mark a server left on it before letting go of its own memory is
 * seen. 0 at once for HOST; -ETIMEDOUT after the timeout (the caller then
 * keeps those mappings: never unmapped under a queued copy).
 */
int gpuipc__share_settle(struct share_call *c);
/*
 * GPU kinds, once gpuipc__share_settle saw every copy land: chunks copied
 * from a server whose process is gone now may have been read from memory
 * that went with it (LEGACY and POOL memory dies with its process): copy
 * them again from the publisher, and settle. 0, or the code.
 */
int gpuipc__share_recheck(struct share_call *c);
/* This member's failure, when a peer marked it FAILED: -ETIMEDOUT with the
 * chunks it held that others took over. */
int gpuipc__share_failed(struct share_call *c);

/* ----- tests ----- */
enum gpuipc__share_step {
  GPUIPC__SHARE_JOINED,  /* slot taken, LIVE */
  GPUIPC__SHARE_CLAIMED, /* chunk claimed, its copy not started */
  GPUIPC__SHARE_MIDCOPY, /* half of the chunk copied (HOST) */
  GPUIPC__SHARE_DONE,    /* done word written */
  GPUIPC__SHARE_LEAVE,   /* every chunk in, DONE, before lingering */
  GPUIPC__SHARE_SETTLED, /* its stream's copies landed, before it looks
                            whether the members it copied from live */
};
typedef void (*gpuipc__share_hook_fn)(enum gpuipc__share_step step, long chunk,
                                      void *arg);
/* Tests: call @fn at each step of this process's calls (NULL: none). */
void gpuipc__share_test_hook(gpuipc__share_hook_fn fn, void *arg);
void gpuipc__share_step(enum gpuipc__share_step step, long chunk);
/* Tests: the counts of this thread's last call. */
void gpuipc__share_test_stats(struct gpuipc__share_stats *out);
void gpuipc__share_stats_set(const struct gpuipc__share_stats *st);

#endif
