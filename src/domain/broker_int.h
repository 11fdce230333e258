/*
 * The broker's insides, shared by its files and by nobody else.
 *
 *   broker.c          life cycle: claim, start, the poll loop, its
 *                     timeouts, stop and shutdown
 *   broker_conn.c     connections: accept, caps, who may join, HELLO,
 *                     reading and handing requests on, dropping
 *   broker_send.c     sending without blocking: each connection's outbox
 *   broker_req.c      a member's requests: OPEN, UNLINK, PUBLISH, READY,
 *                     ABANDON, RELEASE, DISOWN, LIST, REPUBLISH
 *   broker_seg.c      the segments' state machine: reserve, unlink, lose,
 *                     free, keepers, holds of a connection that went, parked
 *                     requests and their dispatch, the recovery window
 *   broker_park.c     the index of parked requests (by name, by connection)
 *   broker_journal.c  the one place a segment changes state, and the
 *                     journal of names that each change is recorded in
 *   broker_check.c    what a member may publish: descriptors, exporters,
 *                     which memory a record names
 *   handoff.c         the hand-over of a domain, both halves
 *
 * Dependencies go one way: broker.c may call any of the others, and
 * none calls it; broker_conn.c calls broker_req.c, which calls broker_seg.c and
 * broker_check.c; broker_seg.c calls broker_park.c and broker_journal.c,
 * which asks broker_check.c what memory a record names; any of them may send (broker_send.c) and use the registry (registry.c).
 * A member starts a broker (client.c) and feeds the hand-over it receives
 * to handoff.c; nothing here calls back into the member, but for the
 * domain's paths and gpuipc__proto_send, both in client.c for now. The
 * broker's data belong to its thread alone: no locks.
 */
#ifndef GPUIPC_BROKER_INT_H
#define GPUIPC_BROKER_INT_H

#include "domain/domain.h"
#include "os/os.h"

#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* Uids and gids GPUIPC_ALLOW_UIDS / GPUIPC_ALLOW_GIDS may name. */
#define ALLOW_MAX 64
/* Buckets of the index of parked requests by name (a power of two). */
#define PARK_BUCKETS 256

struct out_msg {
  struct out_msg *next;
  size_t len;
  int nfds;
  int fds[2];
  uint8_t data[];
};

enum conn_state {
  CONN_NEW,     /* accepted, waiting for HELLO */
  CONN_READY,   /* a member */
  CONN_CLOSING, /* refused: answered; dropped once the member hangs up */
};

struct park;

/* A park's place in one list, and a list (broker_park.c). */
struct park_link {
  struct park *prev, *next;
};
struct park_list {
  struct park *head, *tail;
};

struct gpuipc__conn {
  struct gpuipc__conn *next;
  int fd;
  enum conn_state state;
  bool doomed; /* to be dropped at the end of this round */
  bool shut;   /* CONN_CLOSING: answer sent, our end shut for writing */
  bool counted; /* in its uid's count */
  struct gpuipc__cred cred;
  uint32_t hello_flags;
  uint64_t token;
  uint64_t seq; /* accept order */
  uint32_t nparks; /* its requests waiting */
  struct park_list parks; /* them (broker_park.c) */
  uint32_t nreserved; /* names it reserved, not published yet */
  uint64_t deadline;  /* CONN_NEW, CONN_CLOSING: dropped after this */
  struct out_msg *out_head, *out_tail;
  size_t out_msgs, out_bytes;
};

/* A request waiting for an event: a publication, a name, the clock. */
struct park {
  struct park_link all;     /* every park, in arrival order */
  struct park_link by_name; /* its name's bucket, in arrival order */
  struct park_link by_conn; /* its connection's */
  struct park *next;        /* in a list taken out (gpuipc__bk_parks_take) */
  struct gpuipc__conn *conn;
  uint16_t type; /* OPEN or UNLINK */
  uint32_t req;
  char name[GPUIPC__NAME_MAX + 1];
  uint32_t flags;
  uint8_t kind;
  uint64_t size;
  uint64_t id; /* UNLINK: only while the name names this segment (0: any) */
  uint64_t deadline;
  bool recovery; /* parked only until the recovery window ends */
};

/* Parked requests: in arrival order, and by name (broker_park.c). */
struct gpuipc__parks {
  struct park_list all;
  struct park_list by_name[PARK_BUCKETS];
};

/* A warning said at most once every WARN_EVERY_NS. */
struct warn_gate {
  uint64_t next;   /* not before */
  uint64_t missed; /* not said since the last one */
};

/* Connections of one uid. */
struct uid_count {
  uint32_t uid, n;
};

struct gpuipc__broker {
  char name[GPUIPC__NAME_MAX + 1];
  struct gpuipc__dom_paths paths;
  int lock_fd, listen_fd;
  int wake[2];  /* written to stop the thread */
  int stop_fd;  /* the fd whose readability stops the loop */
  pthread_t thread;
  bool threaded;
  uint64_t epoch, next_id;
  uint64_t owner_token;
  uint64_t jlen, jrecs; /* the journal's length and record count */
  bool jfailed;         /* a journal write failed (said once) */
  bool jloading;        /* replaying the journal: nothing is written */
  struct gpuipc__registry reg;
  enum gpuipc__recovery recovery;
  uint64_t recovery_end; /* 0 once the window closed */
  bool rejoined;         /* a member of the last broker came back */
  /* After a hand-over: members of the last broker that may take the
   * domain over, how many of them came back, and until when a broker
   * that leaves waits for the others (0: it does not). */
  uint32_t members_back, came_back;
  uint64_t back_end;
  struct gpuipc__conn *conns;
  size_t nconns;
  uint64_t conn_seq;
  /* Connection limits (conn_limits_init) and what they count. */
  size_t conns_max, conns_max_uid;
  unsigned long long nofile; /* the soft open-file limit at start */
  int spare_fd;              /* given up to answer a connection at EMFILE */
  /* Descriptors the process held besides connections at the last count
   * (-1: none yet), when, and connections taken since (broker_conn.c). */
  long fds_other;
  uint64_t fds_at;
  unsigned fds_age;
  uint64_t accept_rest;      /* listener not polled before (0: polled) */
  struct uid_count *uids;
  size_t nuids, capuids;
  struct warn_gate warn_refused, warn_accept;
  struct gpuipc__parks parks;
  pid_t pid;
  uid_t uid;
  uint32_t allow_uids[ALLOW_MAX], allow_gids[ALLOW_MAX];
  int nallow_uids, nallow_gids;
  struct pollfd *pfds;
  struct gpuipc__conn **pconns;
  size_t pcap;
  uint8_t rbuf[GPUIPC_MSG_MAX];
  struct gpuipc__msg in, out;
};

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

static inline bool gpuipc__bk_would_block(int rc)
{
  return rc == -ETIMEDOUT || rc == -EAGAIN || rc == -EWOULDBLOCK;
}

/* Whether the window in which members re-publish is open. */
static inline bool gpuipc__bk_recovering(const struct gpuipc__broker *b)
{
  return b->recovery_end != 0;
}

static inline bool gpuipc__bk_creator_held(const struct gpuipc__seg *s)
{
  return (s->w.flags & GPUIPC__SEGF_CREATOR_HELD) != 0;
}

/* Ids go on above every id seen (from a journal, a member, a hand-over). */
static inline void gpuipc__bk_learn_id(struct gpuipc__broker *b, uint64_t id)
{
  if (id <= GPUIPC__ID_MAX && id >= b->next_id)
    b->next_id = id + 1;
}

/* A new segment id: never 0, never above GPUIPC__ID_MAX, never in use. */
static inline uint64_t gpuipc__bk_take_id(struct gpuipc__broker *b)
{
  for (;;) {
    if (b->next_id == 0 || b->next_id > GPUIPC__ID_MAX)
      b->next_id = 1;
    uint64_t id = b->next_id++;
    if (gpuipc__reg_by_id(&b->reg, id) == NULL)
      return id;
  }
}

/* ----- broker_send.c ----- */

/* Send @m to @c without blocking: directly, or through the outbox. */
void gpuipc__bk_send(struct gpuipc__conn *c, const struct gpuipc__msg *m,
                     const int *fds, int nfds);
/* Send what waits in @c's outbox; stop when the socket is full. */
void gpuipc__bk_flush(struct gpuipc__conn *c);
/* Drop what waits in @c's outbox. */
void gpuipc__bk_outbox_free(struct gpuipc__conn *c);
/* An ERROR reply (@code and the sentence) to request @req. */
void gpuipc__bk_send_error(struct gpuipc__broker *b, struct gpuipc__conn *c,
                           uint32_t req, int code, const char *fmt, ...)
    GPUIPC__PRINTF(5, 6);
/* A reply of @type that carries a segment id (OK, CREATE_IT, ...). */
void gpuipc__bk_send_id(struct gpuipc__broker *b, struct gpuipc__conn *c,
                        uint16_t type, uint32_t req, uint64_t id);

/* ----- broker_journal.c ----- */

/*
 * Move @s to @state, the only way a segment's state changes: records it in
 * the journal (a name published, filling or lost is put; one that stops
 * being any of these is dropped), takes its name away when it becomes
 * UNLINKED, and refuses (logs, and asserts in debug builds) a change the
 * state machine does not make.
 */
void gpuipc__bk_seg_set_state(struct gpuipc__broker *b, struct gpuipc__seg *s,
                              uint8_t state);
/* Forget @s (its journal record too, if it has one). */
void gpuipc__bk_seg_forget(struct gpuipc__broker *b, struct gpuipc__seg *s);
/* Rewrite the journal from the registry. */
void gpuipc__bk_journal_compact(struct gpuipc__broker *b);
/* After a crash: every name the dead broker had is lost until re-published. */
void gpuipc__bk_journal_load(struct gpuipc__broker *b);

/* ----- broker_check.c ----- */

/*
 * 0, or the code with which @c's PUBLISH of @w (with descriptor @fd) is
 * refused, and the reason in @why.
 */
int gpuipc__bk_publish_check(const struct gpuipc__conn *c,
                             const struct gpuipc__seg_wire *w, int fd,
                             char *why, size_t cap);
/*
 * 0, or the code with which @c's REPUBLISH of @w (with descriptor @fd, as
 * its creator's keeper if @keeper) is refused, and the reason in @why.
 */
int gpuipc__bk_republish_check(const struct gpuipc__conn *c,
                               const struct gpuipc__seg_wire *w, int fd,
                               bool keeper, char *why, size_t cap);
/*
 * Whether @w names the memory that record @rec (which has a handle) does;
 * if not, what differs is in @why.
 */
bool gpuipc__bk_same_memory(const struct gpuipc__seg_wire *rec,
                            const struct gpuipc__seg_wire *w, char *why,
                            size_t cap);
/*
 * What memory @w's handle names, as 64 bits that the journal keeps for a
 * broker elected after a crash (never 0; 0: @w has no handle).
 */
uint64_t gpuipc__bk_mem_id(const struct gpuipc__seg_wire *w);
/* Whether @w's memory lives in its creator's process alone (LEGACY, fabric,
 * POOL; or as its flags say). */
bool gpuipc__bk_held_by_creator(const struct gpuipc__seg_wire *w);
/* Whether @c's process exported the handle in @w. */
bool gpuipc__bk_is_exporter(const struct gpuipc__conn *c,
                            const struct gpuipc__seg_wire *w);
/* The exporter's pid as a handle record names it (for sentences). */
uint32_t gpuipc__bk_exporter_pid(const struct gpuipc__seg_wire *w);

/* ----- broker_park.c ----- */

/* Park @p (its conn set): last in arrival order, on its name, on its conn. */
void gpuipc__bk_park_add(struct gpuipc__parks *ps, struct park *p);
/* Take @p out of every list (not freed; its connection's count drops). */
void gpuipc__bk_park_unlink(struct gpuipc__parks *ps, struct park *p);
/*
 * Take out, in arrival order, as a list through ->next: the parks on
 * @name that wait for it (not for the recovery window); or, @name NULL,
 * every park that waits for the recovery window.
 */
struct park *gpuipc__bk_parks_take(struct gpuipc__parks *ps,
                                   const char *name);
/* Free @c's parks. */
void gpuipc__bk_parks_drop_conn(struct gpuipc__parks *ps,
                                struct gpuipc__conn *c);
/* Free every park, without accounts (their connections are gone). */
void gpuipc__bk_parks_free_all(struct gpuipc__parks *ps);

/* ----- broker_seg.c ----- */

/* Serve OPEN or UNLINK @p from @c now, or park it. */
void gpuipc__bk_dispatch_open(struct gpuipc__broker *b, struct gpuipc__conn *c,
                              const struct park *p);
void gpuipc__bk_dispatch_unlink(struct gpuipc__broker *b,
                                struct gpuipc__conn *c, const struct park *p);
/* Re-run every request parked on @name, in arrival order. */
void gpuipc__bk_redispatch(struct gpuipc__broker *b, const char *name);
/* Free @s, lose it or free its name, if nothing keeps it any more. */
void gpuipc__bk_maybe_free(struct gpuipc__broker *b, struct gpuipc__seg *s);
/* The creator that kept @s's memory let go of it or left. May free @s. */
void gpuipc__bk_keeper_gone(struct gpuipc__broker *b, struct gpuipc__seg *s);
/* Forget everything @c held, reserved or waited for. */
void gpuipc__bk_conn_drop_state(struct gpuipc__broker *b,
                                struct gpuipc__conn *c);
/* The recovery window closed. */
void gpuipc__bk_end_recovery(struct gpuipc__broker *b);
/* Answer the parked requests whose time is up. */
void gpuipc__bk_expire_parks(struct gpuipc__broker *b, uint64_t now);

/* ----- broker_req.c ----- */

/*
 * Serve request @m of member @c. A descriptor of @fds it keeps is set to
 * -1; the caller closes the others.
 */
void gpuipc__bk_request(struct gpuipc__broker *b, struct gpuipc__conn *c,
                        const struct gpuipc__msg *m, int *fds, int nfds);

/* ----- broker_conn.c ----- */

/* Read the allow lists and the connection limits. */
void gpuipc__bk_conns_init(struct gpuipc__broker *b);
void gpuipc__bk_accept_all(struct gpuipc__broker *b);
/* Read and handle what @c sent (a burst at most). */
void gpuipc__bk_conn_read(struct gpuipc__broker *b, struct gpuipc__conn *c);
void gpuipc__bk_expire_conns(struct gpuipc__broker *b, uint64_t now);
void gpuipc__bk_shut_answered(struct gpuipc__broker *b);
/* Drop every doomed connection and what it held. */
void gpuipc__bk_reap(struct gpuipc__broker *b);
void gpuipc__bk_conn_free(struct gpuipc__conn *c);

/* ----- handoff.c ----- */

/* Whether a member that may take the domain over is connected. */
bool gpuipc__bk_successor_ready(const struct gpuipc__broker *b);
/* Hand the domain over to a member: true when one took it. */
bool gpuipc__bk_try_handoff(struct gpuipc__broker *b);

#endif
