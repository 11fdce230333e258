/*
 * src/segment: named segments, the member's side (the broker's registry of
 * them is src/domain's).
 *
 *   segment.c   gpuipc_segment_*: open, publish, unlink, list, stat;
 *               registers the segment table as each domain's listener
 *   seg_table.c the member's segment table (seg_table.h): holds by buffer
 *               and by (domain, id), release hooks, re-publishing; its
 *               lock registers with src/domain/fork.c's fork registry
 *   seg_keep.c  memory its creator keeps: LET_GO and DISOWN
 *
 * It sits above src/domain (DESIGN.md's layers): it calls a domain's
 * member (domain.h) and registers callbacks with it; src/domain never
 * calls it. This header is what other layers (src/channel) and tests use.
 */
#ifndef GPUIPC_SEGMENT_H
#define GPUIPC_SEGMENT_H

#include "domain/domain.h"

#include <stdbool.h>
#include <stddef.h>

/*
 * gpuipc_segment_unlink, but only while @name still names the segment that
 * this process holds as @buf (opened through @dom): a name unlinked
 * meanwhile and given to a newer segment is left alone. Returns 0; -ENOENT
 * when @name names another segment or none, or @buf is not held as @name;
 * what gpuipc_segment_unlink returns otherwise.
 */
int gpuipc__segment_unlink_held(gpuipc_domain_t *dom, const char *name,
                                const gpuipc_buf_t *buf);

/*
 * A layer above that keeps segments across its calls (src/share/cache.c)
 * registers here what must happen as a domain is left: called first by
 * gpuipc_domain_leave (no lock held, the connection still up, so it may
 * unlink and release what it kept for @d), also for a domain of the
 * parent left in a child made by fork(). One hook; NULL removes it.
 */
typedef void (*gpuipc__seg_leave_fn)(gpuipc_domain_t *d);
void gpuipc__seg_on_leave(gpuipc__seg_leave_fn fn);

/*
 * The broker's id of the segment that @buf holds through @dom (unlinked
 * or not): 0, or -ENOENT (no sentence) when it holds none.
 */
int gpuipc__seg_id_of(const gpuipc_buf_t *buf, const gpuipc_domain_t *dom,
                      uint64_t *id);

/*
 * For tests only: when @on, every segment this process creates from now on
 * is published as held by its creator (GPUIPC__SEGF_CREATOR_HELD), as
 * LEGACY and POOL ones are, whatever its kind -- so that the deferred
 * release of such memory runs, with real processes, on HOST segments.
 */
void gpuipc__seg_test_creator_held(bool on);

/*
 * A first step of gpuipc_segment_open, public to tests that must stop a
 * creator between reserving a name and publishing it: send OPEN and return
 * the reply: CREATE_IT (the name is reserved for this connection) or HANDLE
 * (with its fd in out->fds), or an error code.
 */
int gpuipc__seg_request(gpuipc_domain_t *d, const char *name, size_t size,
                        gpuipc_kind_t kind, unsigned flags, int timeout_ms,
                        struct gpuipc__reply *out);

#endif
