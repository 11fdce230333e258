/*
 * Private to the member side of segments: the segment table (seg_table.c)
 * as segment.c (gpuipc_segment_*) and seg_keep.c (memory its creator
 * keeps) use it. Every function here wants gpuipc__seg_mu held unless it
 * says otherwise. Dependencies run one way: segment.c and seg_keep.c use
 * seg_table.c, which uses neither.
 */
#ifndef GPUIPC_SEG_TABLE_H
#define GPUIPC_SEG_TABLE_H

#include "segment/segment.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/* One domain's grant of a buffer. */
struct seg_hold {
  struct seg_hold *next;           /* the entry's holds */
  struct seg_hold *id_next;        /* by_id chain */
  struct seg_hold *dom_prev, *dom_next; /* its seg_dom's holds */
  struct seg_entry *entry;         /* the buffer it is a hold of */
  gpuipc_domain_t *dom;
  uint64_t id;
  uint32_t grants; /* opens the broker counted for this process */
  bool unlinked;
  bool keeper;     /* we created it and keep its memory for the domain */
  bool creator;    /* we allocated it for the domain */
  bool filling;    /* ... and have not published it yet */
  char name[GPUIPC__NAME_MAX + 1];
  uint64_t size;
  uint8_t kind;
  uint8_t flags;   /* GPUIPC__SEGF_* */
  uint8_t uuid[16];
  /* The event its creator's writes were recorded on, as published. */
  bool has_event;
  uint8_t event[GPUIPC_EVENT_HANDLE_PACKED_SIZE];
  gpuipc_event_t *ev; /* creator: that event, alive while we hold it */
};

struct seg_entry {
  struct seg_entry *next;
  gpuipc_buf_t *buf;
  struct seg_hold *holds;
  /* Keep the memory until the process exits: its domain went, others
   * still held it. */
  bool forever;
};

/* The process-wide segment table lock (first in domain.h's lock order). */
extern pthread_mutex_t gpuipc__seg_mu;
/*
 * Register gpuipc__seg_mu with fork.c's registry (once; no lock held):
 * every way into this folder that takes the lock calls it first, so fork()
 * never leaves a child the lock held by a thread it does not have.
 */
void gpuipc__seg_fork_install(void);

/* @buf's entry, or NULL. */
struct seg_entry *gpuipc__seg_entry_find(const gpuipc_buf_t *buf);
/* Whether @buf's own entry has a hold of segment @id of @d (takes the
 * lock). */
bool gpuipc__seg_held_through(const gpuipc_buf_t *buf,
                              const gpuipc_domain_t *d, uint64_t id);
/* The holds through @d, linked by dom_next (NULL: none). */
struct seg_hold *gpuipc__seg_holds_of(const gpuipc_domain_t *d);
/* The keeper hold of segment @id in @d, with its entry, or NULL. */
struct seg_hold *gpuipc__seg_find_keeper(gpuipc_domain_t *d, uint64_t id,
                                         struct seg_entry **entry);
/*
 * @h of @e no longer keeps the memory. Returns the buffer to destroy (the
 * caller does, without the lock) when nothing keeps it and nobody uses it
 * any more, else NULL.
 */
gpuipc_buf_t *gpuipc__seg_hold_unkeep(struct seg_entry *e,
                                      struct seg_hold *h);
/*
 * Count one grant of segment @w by @d on @buf (takes the lock). @gen: the
 * connection the grant came on. @creator: this process allocated it.
 */
int gpuipc__seg_record(gpuipc_domain_t *d, gpuipc_buf_t *buf,
                       const struct gpuipc__seg_wire *w, uint64_t gen,
                       bool creator);
/* RELEASE @count grants of @id, ABANDON @id, now (no lock needed). */
void gpuipc__seg_post_release(gpuipc_domain_t *d, uint64_t id,
                              uint32_t count);
void gpuipc__seg_post_abandon(gpuipc_domain_t *d, uint64_t id);

/* A domain's events (struct gpuipc__dom_listener; they take the lock). */
void gpuipc__seg_republish(gpuipc_domain_t *d, int fd);
void gpuipc__seg_unlinked(gpuipc_domain_t *d, uint64_t id);
void gpuipc__seg_orphan(gpuipc_domain_t *d, struct gpuipc__reply *r);
void gpuipc__seg_forget_domain(gpuipc_domain_t *d);
/* seg_keep.c */
/*
 * Tell @d's broker that this process stops keeping segment @id's memory.
 * 0: nobody else holds it, free it; -EBUSY: others do; or the call's code.
 */
int gpuipc__seg_disown(gpuipc_domain_t *d, uint64_t id, int timeout_ms);
void gpuipc__seg_let_go(gpuipc_domain_t *d, uint64_t id);
void gpuipc__seg_disown_domain(gpuipc_domain_t *d);

#endif
