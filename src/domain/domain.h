/*
 * src/domain: domains and their broker (named segments, the member's side
 * of them, are src/segment's: segment/segment.h).
 *
 *   proto.c     the messages between members and the broker
 *   registry.c  the broker's segment table (names, ids, holders, fds)
 *   broker*.c   the broker: an event loop over its listener and members
 *               (broker_int.h lists its files)
 *   handoff.c   the hand-over of a domain: the leaving broker's half and
 *               the half of the member that takes it on
 *   client*.c   a member (member.h lists its files): one connection, a
 *               reader thread, election, reconnection; it feeds a hand-over
 *               it receives to handoff.c, and tells a registered listener
 *               (struct gpuipc__dom_listener) of reconnections, pushes and
 *               orphaned replies
 *   fork.c      gpuipc__dom_paths and the fork() handlers; objects whose
 *               locks fork() takes register with it (struct
 *               gpuipc__fork_hook): each domain, the segment table
 * src/os/paths.c finds a domain's socket and lock file. Nothing here calls
 * src/segment: it registers what it needs (a domain's listener, a fork
 * hook).
 *
 * Locks, always taken in this order: the process-wide segment table lock
 * (src/segment/seg_table.c), a domain's state lock, a domain's send lock.
 * The broker owns its data alone (one thread) and takes none of them.
 *
 * Files, in the runtime directory: NAME.sock, where the broker listens, and
 * NAME.lock, whose flock makes the broker (the kernel frees it when the
 * holder dies) and whose contents are the broker's journal of names.
 *
 * How the domain outlives its broker:
 *  - Clean leave (gpuipc_domain_leave of the hosting member, `serve`
 *    stopped): the broker offers the domain (HANDOFF_OFFER) to the oldest
 *    member of another process that may host and has the broker's uid
 *    (never to one that GPUIPC_ALLOW_UIDS / _GIDS let in: with none of
 *    its own uid left, the domain ends); one that does not answer
 *    HANDOFF_ACCEPT within a second (it does not read: stopped, stuck) is
 *    passed over for the next. To the one that accepts it sends
 *    HANDOFF_BEGIN with the lock and listener descriptors themselves (the
 *    lock never goes free, so no election races it), one HANDOFF_SEG per
 *    segment with its descriptor,
 *    and HANDOFF_END. The successor's reader thread starts a broker with
 *    that registry and answers HANDOFF_ACK; then the old broker closes
 *    every connection (had the successor gone instead, the next one is
 *    tried). Every member reconnects to the same socket and re-publishes
 *    what it holds, which rebuilds the holders. Nothing is lost: the
 *    broker's descriptors moved. A broker whose host leaves before any
 *    member came back to it (members leaving together pass the domain
 *    along) serves on until one may take it over, or its recovery window
 *    closes: only then does the domain end.
 *  - Crash: members see their connection end, connect, find nobody
 *    listening, and race for the lock; the winner starts a broker that
 *    reads the journal (every name the dead broker had becomes a LOST
 *    tombstone) and waits GPUIPC__RECOVERY_MS for members to re-publish
 *    (a re-published segment replaces its tombstone), parking meanwhile
 *    the requests that name what it does not have. Names nobody re-published
 *    stay lost until unlinked or created anew. If no member of the dead
 *    broker comes back, the domain starts afresh instead.
 *
 * Memory its creator holds (GPUIPC__SEGF_CREATOR_HELD: LEGACY, fabric, a
 * POOL allocation) has no descriptor that keeps it: the creator keeps it
 * after its own last release (seg_keep.c), and the broker remembers that
 * connection as the segment's keeper. Unlinked and held by nobody, the
 * broker pushes LET_GO to the keeper, which frees it. A keeper leaving
 * asks first (DISOWN: OK, nobody else holds it; -EBUSY, keep it until the
 * process exits); a keeper whose connection ends took the memory along: a
 * published segment reads as lost. Keepers re-publish with the KEEPER flag
 * after a broker change. A re-publication never changes a segment whose
 * memory the broker knows: it must name that memory, and only its exporter
 * may keep it (broker_req.c). See docs/segment-lifetime.md.
 */
#ifndef GPUIPC_DOMAIN_H
#define GPUIPC_DOMAIN_H

#include "core/core.h"
#include "domain/proto.h"
#include "os/os.h"

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/* ------------------------------------------------------------------------ */
/* Paths                                                                    */
/* ------------------------------------------------------------------------ */

/*
 * Check @name and fill @out from the runtime directory (src/os/paths.c),
 * then make sure a child made by fork() closes this directory's domain
 * descriptors (fork.c).
 */
int gpuipc__dom_paths(const char *name, struct gpuipc__dom_paths *out);

/*
 * Make sure a child made by fork() closes its copies of the domain
 * descriptors of runtime directory @dir (fork.c). Idempotent.
 */
void gpuipc__dom_fork_guard(const char *dir);

/*
 * How many fork()s made this process from the one that first used a
 * domain (0 in that one). A domain joined under another value is its
 * parent's: unusable here.
 */
uint64_t gpuipc__fork_gen(void);

/*
 * An object whose lock fork() must take (fork.c keeps the list): before
 * fork() @prepare runs for each registered object, in the order they were
 * registered (those registered with gpuipc__fork_register_first before
 * all others); after it @parent (in the parent) or @child (in the child)
 * runs for each. A member registers each domain it joins (client.c), the
 * segment table its lock (src/segment/seg_table.c, first: it comes first
 * in the lock order), so fork.c calls neither by name. Register and
 * unregister take the list's lock: never call them holding a lock that a
 * @prepare takes.
 */
struct gpuipc__fork_hook {
  struct gpuipc__fork_hook *next; /* fork.c's */
  void (*prepare)(struct gpuipc__fork_hook *h);
  void (*parent)(struct gpuipc__fork_hook *h);
  void (*child)(struct gpuipc__fork_hook *h);
};
void gpuipc__fork_register(struct gpuipc__fork_hook *h);
/* Register @h ahead of every hook registered with gpuipc__fork_register. */
void gpuipc__fork_register_first(struct gpuipc__fork_hook *h);
void gpuipc__fork_unregister(struct gpuipc__fork_hook *h);
/* Whether @d was joined before this process was made by fork(). */
bool gpuipc__dom_stale(const gpuipc_domain_t *d);

/* ------------------------------------------------------------------------ */
/* Registry (the broker's)                                                  */
/* ------------------------------------------------------------------------ */

struct gpuipc__conn; /* a broker's connection to one member (broker_int.h) */

struct gpuipc__holder {
  struct gpuipc__conn *conn;
  uint32_t pid;
  uint32_t refs;
};

struct gpuipc__seg {
  struct gpuipc__seg *name_next; /* name hash chain (while named) */
  struct gpuipc__seg *id_next;   /* id hash chain */
  struct gpuipc__seg *prev, *next; /* every segment, in id order */
  bool named;                    /* reachable by name */
  struct gpuipc__seg_wire w;     /* name, id, size, kind, state, handle */
  int fd;                        /* the broker's descriptor, or -1 */
  struct gpuipc__conn *creator;  /* CREATING, FILLING: who reserved it */
  uint32_t creator_pid;          /* who published it */
  /*
   * GPUIPC__SEGF_CREATOR_HELD segments: the creator's connection while it
   * keeps the memory (told LET_GO once the segment is unlinked and nobody
   * holds it), NULL once it let go or left.
   */
  struct gpuipc__conn *keeper;
  struct gpuipc__holder *holders;
  uint32_t nholders, capholders;
  /* A tombstone replayed from the journal: the memory the segment had
   * (the broker's gpuipc__bk_mem_id), 0 when the journal did not say. */
  uint64_t mem_id;
};

struct gpuipc__registry {
  struct gpuipc__seg **by_name;
  struct gpuipc__seg **by_id;
  size_t nbuckets;  /* of each table, a power of two */
  size_t count;     /* segments in every state */
  size_t named;     /* segments reachable by name */
  size_t fds;       /* descriptors held */
  struct gpuipc__seg *head, *tail;
};

int gpuipc__reg_init(struct gpuipc__registry *reg);
/* Close every descriptor and free every segment. */
void gpuipc__reg_destroy(struct gpuipc__registry *reg);
/*
 * A new segment with @name and @id (both checked by the caller), reachable
 * by name and id, fd -1, no holders. -ENOMEM.
 */
int gpuipc__reg_add(struct gpuipc__registry *reg, const char *name,
                    uint64_t id, struct gpuipc__seg **out);
struct gpuipc__seg *gpuipc__reg_by_name(struct gpuipc__registry *reg,
                                        const char *name);
struct gpuipc__seg *gpuipc__reg_by_id(struct gpuipc__registry *reg,
                                      uint64_t id);
/* Make @s unreachable by name (its name is free again). */
void gpuipc__reg_unname(struct gpuipc__registry *reg, struct gpuipc__seg *s);
/* Give @s its descriptor (taking ownership) or close the one it has. */
void gpuipc__reg_set_fd(struct gpuipc__registry *reg, struct gpuipc__seg *s,
                        int fd);
/* Forget @s: close its descriptor and free it. */
void gpuipc__reg_remove(struct gpuipc__registry *reg, struct gpuipc__seg *s);
/* Add @n references of @conn (pid @pid). -ENOMEM. */
int gpuipc__reg_hold(struct gpuipc__seg *s, struct gpuipc__conn *conn,
                     uint32_t pid, uint32_t n);
/*
 * Drop up to @n references of @conn (UINT32_MAX: all of them). Returns the
 * number dropped.
 */
uint32_t gpuipc__reg_drop(struct gpuipc__seg *s, struct gpuipc__conn *conn,
                          uint32_t n);
/* The references @conn holds on @s. */
uint32_t gpuipc__reg_refs(const struct gpuipc__seg *s,
                          const struct gpuipc__conn *conn);

/* ------------------------------------------------------------------------ */
/* Broker                                                                   */
/* ------------------------------------------------------------------------ */

enum gpuipc__recovery {
  GPUIPC__RECOVER_NONE = 0,    /* a new domain */
  GPUIPC__RECOVER_HANDOFF = 1, /* registry handed over by the last broker */
  GPUIPC__RECOVER_CRASH = 2,   /* the last broker died: members re-publish */
};

/* How long a new broker waits for members to re-publish after a failover. */
#define GPUIPC__RECOVERY_MS 300

struct gpuipc__broker_init {
  char name[GPUIPC__NAME_MAX + 1];
  int lock_fd;   /* the domain's flock, taken over */
  int listen_fd; /* listening socket at the domain's path, taken over */
  uint64_t epoch;   /* 0: a new random one */
  uint64_t next_id; /* 0: start from the clock */
  struct gpuipc__registry reg; /* taken over (may be empty) */
  bool have_reg;               /* reg was initialised */
  enum gpuipc__recovery recovery;
  uint64_t owner_token; /* the hosting member: never its successor */
  uint32_t members_back; /* RECOVER_HANDOFF: members reconnecting to it */
};

struct gpuipc__broker;

/*
 * Claim domain @name: take its lock (without waiting) and listen on its
 * socket, unlinking a stale one. @stale (optional) says whether a socket
 * was left behind -- by a broker that died, since a broker that shuts down
 * removes it -- so that the new broker waits for survivors to re-publish.
 * -EWOULDBLOCK when another process holds the lock (a broker runs or is
 * starting).
 */
int gpuipc__broker_claim(const char *name, int *lock_fd, int *listen_fd,
                         bool *stale);

/*
 * Start a broker thread with @init (whose descriptors and registry it takes
 * over, also on failure). Returns 0 or a code.
 */
int gpuipc__broker_start(struct gpuipc__broker_init *init,
                         struct gpuipc__broker **out);

/*
 * Stop the broker: hand the registry, lock and listener over to another
 * member if one can take them, else shut the domain down (unlink the
 * socket, close every descriptor). Joins the thread and frees @b.
 */
void gpuipc__broker_stop(struct gpuipc__broker *b);

/* The broker's epoch (for tests and `gpuipc ls`). */
uint64_t gpuipc__broker_epoch(const struct gpuipc__broker *b);

/*
 * Run a broker in the calling thread until @stop_fd becomes readable, then
 * stop as gpuipc__broker_stop does. For `gpuipc serve`.
 */
int gpuipc__broker_run(struct gpuipc__broker_init *init, int stop_fd);

/* ------------------------------------------------------------------------ */
/* Hand-over, the member's half (handoff.c), used by client.c               */
/* ------------------------------------------------------------------------ */

/* A hand-over a member is receiving (its reader thread's alone). */
struct gpuipc__handoff_in {
  bool active;
  uint32_t expect, got;
  struct gpuipc__broker_init init; /* its descriptors -1 while none */
};

/* Void the hand-over half received: its sender went, or the member leaves. */
void gpuipc__handoff_discard(struct gpuipc__handoff_in *h);
/*
 * HANDOFF_BEGIN @m to member @token of domain @name, with the lock and the
 * listener in @fds[0..1] (taken: set to -1).
 */
void gpuipc__handoff_begin(struct gpuipc__handoff_in *h, const char *name,
                           uint64_t token, const struct gpuipc__msg *m,
                           int *fds);
/* HANDOFF_SEG @m, with its descriptor if @nfds is 1 (taken: set to -1). */
void gpuipc__handoff_seg(struct gpuipc__handoff_in *h, const char *name,
                         const struct gpuipc__msg *m, int *fds, int nfds);
/*
 * HANDOFF_END @m: whether all that was announced arrived. If so, @out is
 * what to start a broker with (gpuipc__broker_start takes it over) and @h
 * is empty again; if not, the hand-over is void (said in the log).
 */
bool gpuipc__handoff_end(struct gpuipc__handoff_in *h, const char *name,
                         const struct gpuipc__msg *m,
                         struct gpuipc__broker_init *out);
/* Turn HANDOFF_OFFER @m into its HANDOFF_ACCEPT, HANDOFF_END into its ACK. */
void gpuipc__handoff_answer(struct gpuipc__msg *m);

/* ------------------------------------------------------------------------ */
/* Members (client.c), used by src/segment                                  */
/* ------------------------------------------------------------------------ */

/* A reply as a caller receives it. */
struct gpuipc__reply {
  struct gpuipc__msg msg;
  int fds[2];
  int nfds;
  uint64_t gen; /* connection generation the reply came on */
  uint16_t req_type; /* an orphan's: the request it answers (0: unknown) */
};

/*
 * Send request @m (its req is assigned here) with @nfds descriptors (kept
 * by the caller) and wait up to @timeout_ms for its reply.
 * An ERROR reply becomes its code, with the broker's sentence prefixed by
 * @what. Returns 0 with @out filled (the caller closes out->fds);
 * GPUIPC_E_PEER_GONE when the connection dropped (the member reconnects:
 * retry); -ETIMEDOUT; GPUIPC_E_CLOSED when the domain is being left.
 */
int gpuipc__dom_call(gpuipc_domain_t *d, struct gpuipc__msg *m,
                     const int *fds, int nfds, int timeout_ms,
                     const char *what, struct gpuipc__reply *out);

/*
 * Send a message that has no reply (RELEASE, ABANDON) if the connection is
 * up; dropped otherwise (the broker forgets a dropped connection's state).
 * Returns 0 or the send's code.
 */
int gpuipc__dom_post(gpuipc_domain_t *d, struct gpuipc__msg *m,
                     const int *fds, int nfds);

/*
 * The generation of the connection up now, 0 when none is (the member is
 * reconnecting). With gpuipc__dom_post_on, a message decided on now goes
 * out later only on that same connection.
 */
uint64_t gpuipc__dom_conn_gen(gpuipc_domain_t *d);
/*
 * gpuipc__dom_post on connection generation @gen only: dropped (with
 * GPUIPC_E_PEER_GONE) when @gen is 0 or another connection is up now.
 */
int gpuipc__dom_post_on(gpuipc_domain_t *d, uint64_t gen,
                        struct gpuipc__msg *m, const int *fds, int nfds);

/* The domain's default timeout in ms (< 0: none). */
int gpuipc__dom_timeout(const gpuipc_domain_t *d);
/* The connection generation now (changes on every reconnection). */
uint64_t gpuipc__dom_gen(gpuipc_domain_t *d);
/* Note a segment id seen from the broker (the next broker continues above). */
void gpuipc__dom_saw_id(gpuipc_domain_t *d, uint64_t id);

/*
 * What a domain tells the module that keeps state per connection
 * (src/segment/segment.c, which registers with gpuipc__dom_listen before
 * its first request through a domain). Called on the reader thread unless
 * said otherwise; any member may be NULL.
 */
struct gpuipc__dom_listener {
  /*
   * After a reconnection: re-publish what this process holds through @d
   * on the new connection @fd, then make @fd the domain's connection
   * (gpuipc__dom_set_up). Without a listener the domain goes up at once.
   */
  void (*on_reconnect)(gpuipc_domain_t *d, int fd);
  /* The broker says segment @id was unlinked. */
  void (*on_unlinked)(gpuipc_domain_t *d, uint64_t id);
  /*
   * The broker says segment @id, whose memory this process created and
   * kept, is unlinked and held by nobody: free it.
   */
  void (*on_let_go)(gpuipc_domain_t *d, uint64_t id);
  /* A reply arrived for a request whose caller gave up: undo what it did. */
  void (*on_orphan)(gpuipc_domain_t *d, struct gpuipc__reply *r);
  /*
   * @d is being left (the leaving thread, before the connection closes):
   * settle what is kept for @d and forget what is held through it.
   */
  void (*on_leave)(gpuipc_domain_t *d);
};

/*
 * Make @l (static, never freed) @d's listener. Idempotent; -EBUSY when
 * another listener is registered.
 */
int gpuipc__dom_listen(gpuipc_domain_t *d,
                       const struct gpuipc__dom_listener *l);
/* Make @fd the connection and wake the callers waiting for one. */
void gpuipc__dom_set_up(gpuipc_domain_t *d, int fd);

/* Send a message on @fd in full (blocking, bounded). proto.c */
int gpuipc__proto_send(int fd, const struct gpuipc__msg *m, const int *fds,
                       int nfds, int timeout_ms);

#endif
