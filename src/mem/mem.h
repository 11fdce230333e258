/*
 * src/mem: the buffer object and the interface each kind implements.
 * Kinds: host.c (memfd), and the CUDA kinds (vmm.c, legacy.c, pool.c),
 * which share gpu.c's helpers (gpu.h). buf.c holds the public buffer calls
 * and reaches a kind only through its gpuipc__kind_ops table; foreign.c
 * makes handles of memory gpuipc did not allocate, through the kinds'
 * export_foreign entries. Calls go one way: foreign.c -> buf.c -> kinds
 * -> gpu.c (foreign.c also takes vmm.c's granularity).
 */
#ifndef GPUIPC_MEM_H
#define GPUIPC_MEM_H

#include "core/core.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gpuipc_buf;

/*
 * Device memory gpuipc did not allocate, for a kind's export_foreign:
 * [ptr, ptr + size) inside the driver's allocation [base, base +
 * alloc_size), with gpuipc_buf_export_foreign's @flags.
 */
struct gpuipc__foreign_range {
  uint64_t ptr; /* CUdeviceptr values */
  size_t size;
  uint64_t base;
  size_t alloc_size;
  unsigned flags;
};

/*
 * A buffer's last-release hook. Returns false to let the kind free the
 * memory; true after calling gpuipc__buf_keep(@b) to keep it, in which
 * case the releasing thread touches @b no more.
 */
typedef bool (*gpuipc__release_hook_fn)(struct gpuipc_buf *b, void *arg);

/*
 * What a kind implements. Each function returns 0 or a negative code with
 * gpuipc__err() detail, and on failure leaves nothing allocated.
 */
struct gpuipc__kind_ops {
  gpuipc_kind_t kind;
  /* Whether this kind can be allocated here (0, or the reason's code). */
  int (*available)(void);
  /*
   * Allocate >= b->size bytes on local device b->device; set b->ptr,
   * b->alloc_size, b->fd (or -1) and b->priv.
   */
  int (*alloc)(struct gpuipc_buf *b);
  /*
   * Fill @h's type, bytes and fd (a new close-on-exec descriptor or -1).
   * Identity, sizes and UUID are filled by the caller.
   */
  int (*export)(struct gpuipc_buf *b, gpuipc_handle_t *h);
  /*
   * Map the memory @h describes for local device b->device (-1: HOST or the
   * handle's own GPU); set b->ptr (already advanced by h->offset),
   * b->alloc_size, b->fd (a descriptor of our own, or -1) and b->priv.
   */
  int (*import)(struct gpuipc_buf *b, const gpuipc_handle_t *h);
  /* Unmap and free whatever alloc/import set up. */
  int (*release)(struct gpuipc_buf *b);
  /*
   * Optional: whether descriptor @fd refers to the memory of @b, which the
   * import cache found by the identity a handle claims. 0 when it does,
   * GPUIPC_E_BADHANDLE when it does not. Without it (kinds whose
   * descriptors carry no stable identity) the claim is taken as is.
   */
  int (*same_memory)(const struct gpuipc_buf *b, int fd);
  /*
   * Optional: whether handle @h, which claims @b's identity, describes
   * the same memory and place in it (compared by what the handle carries).
   * 0, or GPUIPC_E_BADHANDLE with a sentence.
   */
  int (*same_export)(const struct gpuipc_buf *b, const gpuipc_handle_t *h);
  /*
   * Optional: grant local device @device read-write access to @b, whose
   * memory is on local device @owner (gpuipc_buf_access, which has checked
   * that @device is visible, is not b->device and reaches @owner by P2P).
   * Without it (HOST) every device reaches the memory already.
   */
  int (*access)(struct gpuipc_buf *b, int device, int owner);
  /*
   * Optional: whether @b's memory is still there (gpuipc_buf_alive): 0, or
   * GPUIPC_E_PEER_GONE with a sentence. Without it, memory lives as long
   * as a buffer maps it.
   */
  int (*alive)(const struct gpuipc_buf *b);
  /*
   * Optional: fill @h's kind, type, bytes and fd (a new close-on-exec
   * descriptor or -1) to share @r, memory of this kind that gpuipc did not
   * allocate (gpuipc_buf_export_foreign, which found the kind and is in
   * the context of the memory's device). Identity, sizes and UUID are
   * filled by the caller.
   */
  int (*export_foreign)(const struct gpuipc__foreign_range *r,
                        gpuipc_handle_t *h);
};

struct gpuipc_buf {
  struct gpuipc_buf *next;       /* in the process-wide registry bucket */
  long refs;                     /* guarded by the registry lock */
  const struct gpuipc__kind_ops *ops;
  gpuipc_kind_t kind;
  void *ptr;                     /* user-visible start */
  size_t size;                   /* user-visible bytes */
  size_t alloc_size;             /* bytes of the underlying allocation */
  size_t offset;                 /* ptr - start of the allocation */
  int device;                    /* local ordinal, -1 for HOST */
  uint8_t uuid[16];              /* device UUID, 0 for HOST */
  int fd;                        /* descriptor kept for re-export, or -1 */
  bool imported;
  bool unpinned; /* HOST: not registered at the mapping (GPUIPC_BUF_UNPINNED) */
  bool take_fd;  /* import: the kind may keep h->fd itself as fd, no dup
                  * (GPUIPC_BUF_TAKE_FD); gpuipc_buf_import closes it when
                  * the kind did not */
  bool fd_cloexec; /* import: the taken fd is close-on-exec already
                    * (GPUIPC__BUF_FD_CLOEXEC) */
  /* Identity: ours for local buffers, the exporter's for imported ones. */
  uint8_t boot_id[16];
  uint32_t pid;
  uint64_t pidns;
  uint64_t nonce;
  uint64_t export_id;
  void *priv;                    /* the kind's own state */
  /*
   * Called each time the last reference goes, before the kind releases the
   * memory (a segment tells its broker here). Set through
   * gpuipc__buf_set_release_hook; see gpuipc__release_hook_fn.
   */
  gpuipc__release_hook_fn release_hook;
  void *release_arg;
  /*
   * No reference is left but the memory is kept (a segment whose creator
   * must keep it for other processes): still registered, so that an
   * import of its identity takes it back. Guarded by the registry lock.
   */
  bool kept;
  /*
   * Not NULL: this is a second handle on @base's memory (gpuipc__buf_alias),
   * with its own references and release hook; it holds one reference on
   * @base, is never registered, and reaches the kind only through @base.
   */
  struct gpuipc_buf *base;
  /* Devices gpuipc_buf_access granted (bit d: device d), so that a repeat
   * costs a load rather than a driver call. */
  _Atomic uint64_t granted;
  /* Holders that each keep one reference and want to hear when theirs
   * are all that is left (gpuipc__buf_watch_last). Guarded by the
   * registry lock. */
  int last_watchers;
};

/*
 * Make fork() take the buffer registry's lock first (pthread_atfork), so
 * that a child never inherits it held by a thread it does not have.
 * Idempotent; a caller registering fork handlers that take locks taken
 * before the registry's calls this first.
 */
void gpuipc__buf_fork_install(void);

/* Install (or clear, with @fn NULL) the last-release hook of @b. */
void gpuipc__buf_set_release_hook(struct gpuipc_buf *b,
                                  gpuipc__release_hook_fn fn, void *arg);

/*
 * From a release hook: keep @b's memory although its last reference went.
 * @b stays registered with no reference: an import of its identity (its
 * creator opening the segment again) takes it back with one reference, and
 * the hook runs again at the next last release. gpuipc__buf_unkeep ends
 * it. Thread-safe.
 */
void gpuipc__buf_keep(struct gpuipc_buf *b);

/*
 * End the keeping of @b: true when @b was kept (and nobody took it back):
 * it is unregistered and the caller must free it with gpuipc__buf_destroy;
 * false when it is in use again (its next last release decides anew).
 */
bool gpuipc__buf_unkeep(struct gpuipc_buf *b);

/*
 * Free the memory of an unregistered buffer and the buffer itself (for a
 * handle made by gpuipc__buf_alias: release its reference on the base).
 */
int gpuipc__buf_destroy(struct gpuipc_buf *b);

/* Take one more reference on @b (which the caller already holds). */
void gpuipc__buf_ref(struct gpuipc_buf *b);

/*
 * Whether the memory of @b (which the caller holds) is held by its
 * watchers alone (gpuipc__buf_watch_last): its base's references (each
 * handle gpuipc__buf_alias made of it holds one) are no more than its
 * watchers, each of which keeps one. So a standing lend learns that its
 * caller let go, however many lends (in several domains, say) watch the
 * same buffer.
 */
bool gpuipc__buf_watched_alone(const struct gpuipc_buf *b);

/*
 * Count one more (@on) or one fewer holder of @b's base that keeps a
 * reference on it and wants to hear when the others are all gone: when a
 * release leaves the base with no more references than such holders, the
 * function set by gpuipc__buf_on_watched_last runs, on the releasing
 * thread, the registry's lock dropped; the releasing code may hold locks
 * of its own, so it must neither block nor take a lock (it hands the work
 * to a thread of its own). The shared copy's standing lends
 * (share/cache.c) let go of a destination its caller released this way.
 */
void gpuipc__buf_watch_last(const struct gpuipc_buf *b, bool on);
void gpuipc__buf_on_watched_last(void (*fn)(void));

/*
 * A new handle on the memory of @b (which the caller holds; a handle of
 * this kind stands for the buffer it was made of): the same pointer,
 * size, kind, device and identity (an export of it is one of @b), with one
 * reference and a release hook of its own, holding one reference on @b
 * until its last release. A buffer lent as a segment is one (segment.c):
 * releasing the segment then lets go of the segment alone. Not registered:
 * imports of its identity find @b. 0, or -ENOMEM.
 */
int gpuipc__buf_alias(struct gpuipc_buf *b, struct gpuipc_buf **out);

/*
 * The registered buffer with this identity (exporter + export id), with one
 * more reference, or NULL. This is the import cache's lookup; imports and
 * self-imports go through it.
 */
struct gpuipc_buf *gpuipc__buf_lookup(const gpuipc_handle_t *h);

/*
 * gpuipc_buf_import for gpuipc's own callers, whose @flags may also hold
 * GPUIPC__BUF_FD_CLOEXEC: with GPUIPC_BUF_TAKE_FD, the fd came over one of
 * gpuipc's sockets (MSG_CMSG_CLOEXEC) and is close-on-exec already, so a
 * VMM mapping keeps it without an fcntl (a system call on every first
 * import of a channel's or a segment's buffer). Unchecked flags: the
 * public call checks the caller's.
 */
#define GPUIPC__BUF_FD_CLOEXEC 0x80000000u
int gpuipc__buf_import(const gpuipc_handle_t *h, int device, unsigned flags,
                       gpuipc_buf_t **out);

/* The kinds this build has (gpuipc.h's GPUIPC_KIND_MAP lists them all);
 * NULL where the build lacks one, for AUTO and for a value no kind has. */
const struct gpuipc__kind_ops *gpuipc__kind_ops(gpuipc_kind_t kind);

extern const struct gpuipc__kind_ops gpuipc__host_ops;

/*
 * Register HOST buffer @b with CUDA, in device @dev's primary context, if
 * it is not registered yet: before gpuipc puts GPU work on it (a copy, a
 * stream's write or wait on a word in it) in a process that mapped it
 * before it had a CUDA context. Returns 0 at once for a registered buffer,
 * another kind, or @dev < 0; the codes of gpuipc__ctx_enter, GPUIPC_E_CUDA.
 */
int gpuipc__host_pin(gpuipc_buf_t *b, int dev);
#if GPUIPC_HAVE_CUDA
extern const struct gpuipc__kind_ops gpuipc__vmm_ops;
extern const struct gpuipc__kind_ops gpuipc__legacy_ops;
extern const struct gpuipc__kind_ops gpuipc__pool_ops;
#endif

/*
 * Import cache statistics for tests and benchmarks: lookups that found a
 * live mapping, and imports that had to map.
 */
struct gpuipc__cache_stats {
  uint64_t hits;
  uint64_t misses;
  uint64_t live; /* buffers in the registry now (kept ones included) */
  uint64_t kept; /* of which kept without a reference */
};
void gpuipc__cache_stats(struct gpuipc__cache_stats *out);

#endif
