/*
 * A domain member's state, shared by the files that make up the member
 * side (and by nobody else: the rest of the library sees gpuipc_domain_t
 * opaque, through domain.h):
 *   client.c          the domain's life: join, leave, info, fork()
 *   client_connect.c  connecting, and the election (becoming the broker)
 *   client_call.c     requests and their replies, fire-and-forget posts
 *   client_reader.c   the reader thread: replies, pushes, the hand-over's
 *                     messages, reconnection
 * d->mu guards the state, the generation and the reply table; d->send_mu
 * the connection's descriptor and sending on it (taken after d->mu).
 */
#ifndef GPUIPC_DOMAIN_MEMBER_H
#define GPUIPC_DOMAIN_MEMBER_H

#include "domain/domain.h"

#include <stdatomic.h>


/*
 * DOM_FAILED: a broker refused this member (DENIED, another protocol
 * version) on reconnecting; every request fails at once with that code.
 */
enum dom_state { DOM_DOWN, DOM_UP, DOM_FAILED, DOM_CLOSED };

/* A request whose caller gave up; its reply, if it comes, is undone. */
struct orphan {
  struct orphan *next;
  uint32_t req;
  uint16_t type;
};
/* Orphans remembered per connection; the oldest are forgotten beyond. */
#define ORPHANS_MAX 1024

struct pending {
  struct pending *next;
  uint32_t req;
  uint16_t type; /* of the request */
  int done; /* 0 waiting, 1 replied, < 0 failed with that code */
  struct gpuipc__reply *out;
};

struct gpuipc_domain {
  char name[GPUIPC__NAME_MAX + 1];
  struct gpuipc__dom_paths paths;
  unsigned flags;
  int timeout_ms;
  uint64_t token;

  pthread_mutex_t mu; /* state, gen, pending, broker, epoch */
  pthread_cond_t cv;
  enum dom_state state;
  int failed_code;                       /* DOM_FAILED: why */
  char failed_why[GPUIPC__TEXT_MAX + 1];
  uint64_t gen;
  uint32_t next_req;
  struct pending *pending;
  struct orphan *orphans; /* newest first */
  unsigned norphans;
  uint64_t epoch;
  uint32_t broker_pid;
  struct gpuipc__broker *broker; /* the broker this member hosts */
  _Atomic uint64_t max_id;
  atomic_bool leaving;
  /* Who keeps state per connection (segment.c), or NULL. */
  _Atomic(const struct gpuipc__dom_listener *) listener;

  pthread_mutex_t send_mu; /* fd, fd_gen, and sending on it */
  int fd;
  uint64_t fd_gen; /* the generation fd belongs to */

  pthread_t reader;
  bool reader_started;
  uint64_t fork_gen;                 /* gpuipc__fork_gen() when joined */
  struct gpuipc__fork_hook fork_hook; /* registered while joined */
  int wake[2];

  struct gpuipc__handoff_in ho; /* being received (reader thread only) */
  uint8_t rbuf[GPUIPC_MSG_MAX];
  struct gpuipc__msg rmsg;
  struct gpuipc__reply reply; /* scratch for replies nobody waits for */
};

/* The request table (client_call.c); d->mu held. */
void gpuipc__dom_pending_unlink(struct gpuipc_domain *d, struct pending *p);
/* The type of orphaned request @req, forgotten now; 0 if unknown. */
uint16_t gpuipc__dom_orphan_take(struct gpuipc_domain *d, uint32_t req);
void gpuipc__dom_orphans_forget(struct gpuipc_domain *d);

/*
 * Connect to the domain's broker, electing one if none listens, until
 * @deadline (client_connect.c); *out_fd is the connection, handshaken.
 */
int gpuipc__dom_connect(struct gpuipc_domain *d, uint64_t deadline,
                        bool rejoin, int *out_fd);

/* The reader thread's body (client_reader.c); @arg is the domain. */
void *gpuipc__dom_reader_main(void *arg);

/* GPUIPC_E_CLOSED, saying that @d is its parent's (after fork()). */
int gpuipc__dom_stale_err(const gpuipc_domain_t *d, const char *what);
/* Close the @n descriptors of @fds (each set to -1). */
void gpuipc__dom_fds_close(int *fds, int n);
void gpuipc__dom_sleep_ms(unsigned ms);

#endif
