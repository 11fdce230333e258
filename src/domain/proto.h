/*
 * src/domain/proto: the messages between domain members and their broker.
 *
 * Every message is a 16-byte header (src/wire's msghdr) followed by a body,
 * both little-endian and written with the src/wire encoders:
 *
 *   u32 magic (GPUIPC_PROTO_MAGIC)  u16 version  u16 type
 *   u32 request id                  u32 body length
 *
 * A request carries a non-zero id that its reply repeats; messages the
 * broker pushes on its own (and fire-and-forget client messages) carry id 0.
 * Decoding is strict: the header, the body length, every field, every name
 * and every handle record is checked, the body must be consumed exactly, and
 * the number of descriptors that arrived with the message must be the number
 * its type carries. A peer whose message fails any check is disconnected.
 *
 * The header layout never changes; a peer speaking another version gets an
 * ERROR with GPUIPC_E_VERSION before it is disconnected.
 */
#ifndef GPUIPC_DOMAIN_PROTO_H
#define GPUIPC_DOMAIN_PROTO_H

#include "core/core.h"
#include "wire/wire.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GPUIPC_PROTO_MAGIC 0x43504947u /* "GIPC" */
/*
 * What bumps it and its history: docs/versions.md.
 * 2: segments are filled before they are published (the FILLING state,
 * READY, an event record in segment records).
 * 3: HANDOFF_BEGIN says how many members may come back to the successor.
 */
#define GPUIPC_PROTO_VERSION 3
#define GPUIPC_PROTO_HDR GPUIPC__MSGHDR_BYTES

/* Segment and domain names: 1..63 of [A-Za-z0-9._-], not starting with '.'. */
#define GPUIPC__NAME_MAX 63
/* Longest free-text field (error sentences, denial reasons). */
#define GPUIPC__TEXT_MAX 255
/* Segment records in one LIST_REPLY, holders listed per record. */
#define GPUIPC__LIST_RECS 16
#define GPUIPC__LIST_HOLDERS 16
/* Every encoded message fits in this many bytes. */
#define GPUIPC__MSG_BUF 8192
/*
 * Largest segment id: ids start from the clock in microseconds (about
 * 2^51 now) and grow by one; an id above this is refused on the wire, so
 * that no peer can push a broker's counter near its wrap.
 */
#define GPUIPC__ID_MAX (1ull << 62)
/* OPEN timeout meaning "wait forever". */
#define GPUIPC__WAIT_FOREVER 0xffffffffu

/*
 * Every message type, once: X(NAME, number, fields, fds). GPUIPC_MSG_<NAME>
 * is its number and gpuipc__msg_name() its name; proto.c describes its body
 * in the field list msg_<fields> (types that share a layout share one) and
 * walks that list to encode, decode and check it. @fds: descriptors that
 * travel with every message of the type (a segment record adds its own).
 * Numbers never change; a retired number is never reused.
 */
#define GPUIPC_MSG_TABLE(X)                                                    \
  /* member -> broker */                                                       \
  X(HELLO, 1, hello, 0)         /* first message on a connection */           \
  X(OPEN, 2, open, 0)           /* -> CREATE_IT, HANDLE or ERROR */           \
  X(PUBLISH, 3, publish, 0)     /* + fd for fd kinds; -> OK(id) or ERROR */   \
  X(ABANDON, 4, abandon, 0)     /* give a CREATE_IT reservation back */       \
  X(RELEASE, 5, release, 0)     /* fire-and-forget */                         \
  X(UNLINK, 6, unlink, 0)       /* -> OK or ERROR */                          \
  X(LIST, 7, list, 0)           /* -> LIST_REPLY */                           \
  X(REPUBLISH, 8, republish, 0) /* after a failover; + fd; fire-and-forget */ \
  /* (9 was spoken once and is retired) */                                     \
  X(DISOWN, 10, id, 0) /* the keeper lets go -> OK (free it) or ERROR */       \
  X(READY, 11, ready, 0) /* the creator filled it -> OK(id) or ERROR */        \
  /* broker -> member */                                                       \
  X(WELCOME, 32, welcome, 0)                                                   \
  X(DENIED, 33, denied, 0)                                                     \
  X(ERROR, 34, error, 0)                                                       \
  X(OK, 35, ok, 0)                                                             \
  X(CREATE_IT, 36, id, 0) /* the name is reserved for the requester */         \
  X(HANDLE, 37, handle, 0) /* + fd for fd kinds */                             \
  X(LIST_REPLY, 38, list_reply, 0)                                             \
  X(UNLINKED, 39, id, 0) /* push: a segment you hold was unlinked */           \
  X(LET_GO, 40, id, 0)   /* push: free the memory you keep for it */           \
  /* broker -> its successor, on a clean hand-over */                          \
  X(HANDOFF_BEGIN, 48, handoff_begin, 2) /* + the lock and listener fds */     \
  X(HANDOFF_SEG, 49, handoff_seg, 0)     /* + fd for fd kinds */               \
  X(HANDOFF_END, 50, count, 0)                                                 \
  X(HANDOFF_ACK, 51, count, 0) /* successor -> broker: it runs now */          \
  /* Before any of it: the broker asks, the member says it takes it. */        \
  X(HANDOFF_OFFER, 52, count, 0)  /* broker -> member: will you host? */       \
  X(HANDOFF_ACCEPT, 53, count, 0) /* member -> broker: yes, send it */

enum gpuipc__msg_type {
#define GPUIPC__MSG_ENUM(name, num, fields, fds) GPUIPC_MSG_##name = num,
  GPUIPC_MSG_TABLE(GPUIPC__MSG_ENUM)
#undef GPUIPC__MSG_ENUM
};
/* Every type number is below this. */
#define GPUIPC__MSG_TYPES 64

/* HELLO flags. */
#define GPUIPC__HELLO_NO_BROKER 0x1u /* never make this member the broker */
#define GPUIPC__HELLO_REJOIN 0x2u    /* reconnecting after a broker change */
#define GPUIPC__HELLO_FLAGS 0x3u

/* OPEN flags: the public GPUIPC_CREATE / EXCL / WAIT bits (SCRATCH stays
 * with the member: it is the state its PUBLISH names). */
#define GPUIPC__OPEN_FLAGS 0x7u

/*
 * Segment flags (seg_wire.flags). CREATOR_HELD: the memory lives in its
 * creator's process and no descriptor keeps it (LEGACY and fabric memory,
 * a POOL allocation): the creator keeps it after its own last release for
 * as long as the segment is published or held, until the broker says
 * LET_GO; the segment dies with the creator.
 */
#define GPUIPC__SEGF_CREATOR_HELD 0x1u
#define GPUIPC__SEGF_ALL 0x1u

/* REPUBLISH flags. KEEPER: the sender created the segment and keeps its
 * memory (CREATOR_HELD); holds may then be 0. */
#define GPUIPC__REPUB_KEEPER 0x1u
#define GPUIPC__REPUB_FLAGS 0x1u

/* Segment states, as in gpuipc_segment_state_t. */
#define GPUIPC__SEG_CREATING 1
#define GPUIPC__SEG_PUBLISHED 2
#define GPUIPC__SEG_UNLINKED 3
#define GPUIPC__SEG_LOST 4
/* Its creator published the handle but has not filled it: invisible to
 * openers until READY; freed if the creator goes first. */
#define GPUIPC__SEG_FILLING 5

/* A segment as it travels. */
struct gpuipc__seg_wire {
  char name[GPUIPC__NAME_MAX + 1];
  uint64_t id;
  uint64_t size;   /* the size its creator asked for */
  uint8_t kind;    /* gpuipc_kind_t, never AUTO */
  uint8_t state;   /* GPUIPC__SEG_* */
  uint8_t uuid[16];
  bool has_handle; /* false only for LOST and CREATING records */
  uint8_t handle[GPUIPC_HANDLE_PACKED_SIZE];
  uint8_t flags;   /* GPUIPC__SEGF_* */
  /*
   * The creator's event recorded after its writes (GPU kinds), packed by
   * gpuipc_event_handle_pack: only in PUBLISHED and UNLINKED records
   * (last on the wire).
   */
  bool has_event;
  uint8_t event[GPUIPC_EVENT_HANDLE_PACKED_SIZE];
  /*
   * Not on the wire: the handle's gpuipc_handle_type_t (0 without one).
   * Decode sets it; encode checks it against the packed record.
   */
  uint8_t htype;
};

struct gpuipc__holder_wire {
  uint32_t pid;
  uint32_t refs;
};

struct gpuipc__list_rec {
  struct gpuipc__seg_wire seg; /* without handle */
  uint8_t broker_fd;           /* the broker holds the segment's fd */
  uint32_t keeper_pid;         /* the creator keeping its memory, or 0 */
  uint32_t nholders;           /* holders in total */
  uint32_t nlisted;            /* <= GPUIPC__LIST_HOLDERS */
  struct gpuipc__holder_wire holders[GPUIPC__LIST_HOLDERS];
};

/* One decoded (or to-be-encoded) message. */
struct gpuipc__msg {
  uint16_t type;
  uint16_t version; /* set by decode; encode always writes ours */
  uint32_t req;
  union {
    struct {
      uint32_t pid;
      uint32_t flags; /* GPUIPC__HELLO_* */
      uint64_t token; /* the member's random identity */
      uint64_t epoch; /* the domain epoch it knew, 0 if none */
      uint64_t max_id;
    } hello;
    struct {
      char name[GPUIPC__NAME_MAX + 1];
      uint32_t flags;
      uint8_t kind; /* AUTO allowed */
      uint64_t size;
      uint32_t timeout_ms; /* GPUIPC__WAIT_FOREVER */
    } open;
    struct {
      uint32_t flags; /* reserved, 0 */
      struct gpuipc__seg_wire seg;
    } publish;
    struct {
      uint64_t id; /* of the reservation (CREATE_IT) */
    } abandon;
    struct {
      uint64_t id;    /* of the FILLING segment */
      bool has_event; /* GPU kinds: the event recorded after the writes */
      uint8_t event[GPUIPC_EVENT_HANDLE_PACKED_SIZE];
    } ready;
    struct {
      uint64_t id;
      uint32_t count;
    } release;
    struct {
      char name[GPUIPC__NAME_MAX + 1];
      /* 0: whatever @name names. Else only while @name names segment @id
       * (ENOENT otherwise). On the wire only when non-zero, so a plain
       * UNLINK keeps its old body. */
      uint64_t id;
    } unlink;
    struct {
      char name[GPUIPC__NAME_MAX + 1]; /* "" for every segment */
      uint64_t after_id;               /* resume after this id */
      uint32_t max;                    /* <= GPUIPC__LIST_RECS */
    } list;
    struct {
      uint32_t holds;              /* 0 only with GPUIPC__REPUB_KEEPER */
      uint32_t flags;              /* GPUIPC__REPUB_* */
      struct gpuipc__seg_wire seg; /* PUBLISHED, UNLINKED or FILLING,
                                      with handle */
    } republish;
    struct {
      uint32_t pid;
      uint32_t flags; /* reserved, 0 */
      uint64_t epoch;
    } welcome;
    struct {
      char reason[GPUIPC__TEXT_MAX + 1];
    } denied;
    struct {
      int32_t code; /* negative */
      char text[GPUIPC__TEXT_MAX + 1];
    } error;
    struct {
      uint64_t id;
    } ok, create_it, unlinked, disown, let_go;
    struct {
      struct gpuipc__seg_wire seg; /* with handle */
    } handle;
    struct {
      uint32_t broker_pid;
      uint64_t epoch;
      uint32_t members;
      uint32_t segments; /* in the registry, every state */
      uint32_t fds;      /* segment descriptors the broker holds */
      uint8_t more;      /* more records after the last one */
      uint32_t count;
      struct gpuipc__list_rec recs[GPUIPC__LIST_RECS];
    } list_reply;
    struct {
      uint64_t epoch;
      uint64_t next_id;
      uint32_t count; /* HANDOFF_SEG messages that follow */
      /* Members of the last broker, besides the successor and the host,
       * that may take the domain over: they are reconnecting. */
      uint32_t members;
    } handoff_begin;
    struct {
      struct gpuipc__seg_wire seg;
    } handoff_seg;
    struct {
      uint32_t count; /* OFFER, ACCEPT: segments the hand-over will carry */
    } handoff_end, handoff_ack, handoff_offer, handoff_accept;
  } u;
};

/*
 * Check a domain or segment name. @what names it in the sentence ("segment
 * name"). Returns 0 or -EINVAL with a sentence giving the rule broken.
 */
int gpuipc__name_check(const char *name, const char *what);

/* A short name for a message type ("OPEN"), "?" for unknown ones. */
const char *gpuipc__msg_name(unsigned type);

/*
 * The number of descriptors message @m carries: 2 for HANDOFF_BEGIN, 1 for
 * records whose handle type travels with an fd, else 0.
 */
int gpuipc__msg_nfds(const struct gpuipc__msg *m);

/*
 * Encode @m into @buf (capacity @cap, GPUIPC__MSG_BUF is always enough).
 * Returns the message length, or -EINVAL / -ENOSPC / GPUIPC_E_PROTO with a
 * sentence when @m itself is not a valid message.
 */
int gpuipc__msg_encode(const struct gpuipc__msg *m, void *buf, size_t cap);

/*
 * Decode @len bytes that arrived with @nfds descriptors into @out.
 * Returns 0; GPUIPC_E_VERSION when the header is sound but speaks another
 * version (@out->type, version and req are then set); GPUIPC_E_PROTO with a
 * sentence naming the field for anything else. @out is scratch on failure.
 */
int gpuipc__msg_decode(const void *buf, size_t len, int nfds,
                       struct gpuipc__msg *out);

/* Whether a handle of type @htype travels with an fd. */
bool gpuipc__htype_has_fd(unsigned htype);

#endif
