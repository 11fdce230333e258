/*
 * src/os: the Linux system-call layer. Everything here returns 0 (or a
 * count) on success and a negative code on failure, with gpuipc__err()
 * recording the detail. Every descriptor created or received is
 * close-on-exec. Every blocking call restarts after EINTR and honours its
 * timeout (milliseconds; < 0 waits forever, 0 polls).
 */
#ifndef GPUIPC_OS_H
#define GPUIPC_OS_H

#include "core/core.h"

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Largest message and descriptor count a gpuipc socket carries. */
#define GPUIPC_MSG_MAX 65536
#define GPUIPC_FDS_MAX 16

/* ----- time ----- */
uint64_t gpuipc__now_ns(void);      /* CLOCK_MONOTONIC */
/* Deadline from a timeout in ms (< 0: none -> UINT64_MAX). */
uint64_t gpuipc__deadline(int timeout_ms);
/* Milliseconds left until @deadline, rounded up (-1 for no deadline). */
int gpuipc__ms_left(uint64_t deadline);
/* Sleep about @us microseconds; a signal may end it early. */
void gpuipc__sleep_us(unsigned us);

/*
 * Start a thread of the library running @fn(@arg), in *@th unless
 * @detached (then @th may be NULL). It takes no signal meant for the
 * caller's threads: every signal is blocked in it. 0, or the error number
 * pthread_create (or pthread_attr_init) returned.
 */
int gpuipc__thread_start(pthread_t *th, bool detached, void *(*fn)(void *),
                         void *arg);
/*
 * A job for a thread of the library, asked for from any thread, no lock
 * taken: a detached thread started on the first ask runs @run and ends
 * when no ask came meanwhile; an ask while it runs has it run once more.
 * At most one thread runs a job. GPUIPC__JOB_INIT(fn) initialises one.
 * gpuipc__job_ask: 0, or pthread_create's error (no thread runs the job;
 *   the next ask tries again).
 * gpuipc__job_forget: in a child of fork(), which has no such thread.
 * gpuipc__job_busy: whether a thread runs it now (or is about to).
 */
struct gpuipc__job {
  int state; /* 0 idle; 1 running; 2 running, asked again (__atomic) */
  void (*run)(void);
};
#define GPUIPC__JOB_INIT(fn) {0, (fn)}
int gpuipc__job_ask(struct gpuipc__job *j);
void gpuipc__job_forget(struct gpuipc__job *j);
bool gpuipc__job_busy(struct gpuipc__job *j);
/*
 * Tests only: move gpuipc__now_ns on by @ms at once, as if this process had
 * been stopped that long, so that a test can let a timeout pass without
 * waiting for it (and without depending on how busy the machine is). Waits
 * on an absolute deadline of the real clock (futexes) last longer by as
 * much.
 */
void gpuipc__test_hook_clock_skip_ms(unsigned ms);

/* ----- Unix SOCK_SEQPACKET sockets passing messages and descriptors ----- */
/*
 * Connected sockets (pair, connect, accept) are blocking descriptors; send
 * and recv below never block past their timeout all the same
 * (MSG_DONTWAIT + poll), so callers may also poll them themselves.
 * A path of any length works: one longer than sun_path's 107 bytes is
 * reached through its directory ("/proc/self/fd/N/NAME", which is then
 * the socket's address as getsockname and getpeername see it); only a last
 * component too long even so gives -ENAMETOOLONG.
 */
int gpuipc__sock_pair(int out[2]);
/*
 * Bind and listen on @path (unlinks nothing: callers decide; -EADDRINUSE
 * when a file is there). The listening socket is non-blocking: accept
 * through gpuipc__sock_accept.
 */
int gpuipc__sock_listen(const char *path, int backlog, int *out_fd);
/*
 * Returns -ENOENT / -ECONNREFUSED when nobody listens at @path. A full
 * backlog is retried until the timeout, then -ETIMEDOUT.
 */
int gpuipc__sock_connect(const char *path, int timeout_ms, int *out_fd);
/* -ETIMEDOUT when no connection arrived in time. */
int gpuipc__sock_accept(int lfd, int timeout_ms, int *out_fd);
/*
 * Send one message (1..GPUIPC_MSG_MAX bytes) with @nfds (0..GPUIPC_FDS_MAX)
 * descriptors, which stay owned by the caller. Never raises SIGPIPE.
 * Returns 0; GPUIPC_E_PEER_GONE when the peer closed; -ETIMEDOUT; -errno.
 */
int gpuipc__sock_send(int fd, const void *buf, size_t len, const int *fds,
                      int nfds, int timeout_ms);
/*
 * Receive one message into @buf (capacity @cap) and up to @*nfds
 * descriptors into @fds; on return @*nfds is how many arrived (they are
 * close-on-exec and owned by the caller). Returns the message length (> 0);
 * GPUIPC_E_PEER_GONE on end of stream or reset; -ETIMEDOUT;
 * GPUIPC_E_PROTO when the message or its descriptors did not fit (every
 * descriptor that did arrive is closed, nothing is returned).
 * @nfds may be NULL: then any descriptor that arrives is closed and the
 * message is refused with GPUIPC_E_PROTO.
 */
ssize_t gpuipc__sock_recv(int fd, void *buf, size_t cap, int *fds, int *nfds,
                          int timeout_ms);

struct gpuipc__cred {
  pid_t pid;
  uid_t uid;
  gid_t gid;
};
/* SO_PEERCRED of a connected Unix socket (-ENOTCONN when it has none). */
int gpuipc__peer_cred(int fd, struct gpuipc__cred *out);

/* ----- memfd ----- */
/*
 * A sealed memfd of @size bytes (size must be > 0): it can neither shrink
 * nor grow, so importers can trust its size. -EINVAL for 0, -EFBIG beyond
 * the largest file size, -ENOMEM beyond this machine's memory and swap
 * (memfds are sparse: such a size would only fail when touched).
 */
int gpuipc__memfd_create(const char *name, size_t size, int *out_fd);
/* The seals gpuipc__memfd_create sets (F_SEAL_*: <fcntl.h>). */
#define GPUIPC__MEMFD_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
/*
 * Check that @fd is a sealed gpuipc memfd (shmem, F_SEAL_SHRINK set) of at
 * least @min_size bytes; report its size in @*size_out.
 * GPUIPC_E_BADHANDLE, with a sentence, for a regular file, a pipe, a socket,
 * an unsealed or too small memfd.
 */
int gpuipc__memfd_check(int fd, size_t min_size, size_t *size_out);

/* ----- descriptors ----- */
int gpuipc__fd_dup(int fd, int *out_fd); /* F_DUPFD_CLOEXEC */
/* A descriptor gpuipc keeps that was made without O_CLOEXEC (the CUDA
 * driver's exports, a caller's): FD_CLOEXEC set, shown to the table
 * (gpuipc__fd_table_ahead). -errno, in a sentence starting with @who. */
int gpuipc__fd_keep(int fd, const char *who);
void gpuipc__fd_close(int *fd);          /* closes if >= 0, sets -1 */
/*
 * The descriptor table (fdtable.c). Linux waits for an RCU grace period
 * each time the table of a process with threads grows (8-23 ms
 * measured), in the call that made the descriptor past its end.
 *
 * gpuipc__fd_table_ahead: @fd is a new descriptor of gpuipc's; once one
 * reaches a quarter of the table's known size, a thread of the library
 * grows it (to eight times @fd, at least 1024, at most the soft
 * RLIMIT_NOFILE), so that imports on the way of a transfer do not pay the
 * growth. One load and a compare on the way; best effort, says nothing.
 *
 * gpuipc__fd_table_early: the same for a process about to hold
 * buffers (a domain's join, CUDA loaded), before it has made any: the
 * first growth, where the table was never grown.
 */
void gpuipc__fd_table_ahead(int fd);
void gpuipc__fd_table_early(void);
/* For tests: how many growths the library's thread tried; *@busy, whether
 * it is at work now. */
unsigned gpuipc__fd_table_passes(bool *busy);

/* ----- locks ----- */
/*
 * Open (creating 0600, never following a symbolic link) @path and take an
 * exclusive flock on it.
 * @timeout_ms: 0 tries once (-EWOULDBLOCK when held), > 0 retries until
 * then (-ETIMEDOUT), < 0 waits forever.
 * The lock is released when *out_fd is closed or the process dies. A lock
 * file removed (or replaced) while we waited for it is opened anew, so its
 * holder may remove it (gpuipc__rundir_prune).
 */
int gpuipc__flock_open(const char *path, int timeout_ms, int *out_fd);

/* ----- the private runtime directory ----- */
/*
 * The runtime directory: $GPUIPC_DIR, else $XDG_RUNTIME_DIR/gpuipc, else
 * /tmp/gpuipc-$UID. Created with mode 0700 if missing (with the missing
 * parents of GPUIPC_DIR, 0755); refused with GPUIPC_E_DENIED and a
 * sentence when it is a symbolic link, not a directory, owned by another
 * uid, or group- or world-writable, or when one of its ancestors (or, where
 * a symbolic link leads elsewhere, of the resolved path) is owned by
 * neither root nor us, or writable by group or others without being
 * sticky. -EINVAL for a relative GPUIPC_DIR, -ENAMETOOLONG when @cap is too
 * small.
 */
int gpuipc__runtime_dir(char *out, size_t cap);
/*
 * The same checks, creating nothing: -ENOENT with a sentence when the
 * directory does not exist (for read-only tools).
 */
int gpuipc__runtime_dir_find(char *out, size_t cap);

/* ----- a domain's files in the runtime directory (paths.c) ----- */
struct gpuipc__dom_paths {
  char dir[PATH_MAX];
  char sock[PATH_MAX]; /* DIR/NAME.sock */
  char lock[PATH_MAX]; /* DIR/NAME.lock */
};
/*
 * Fill @out for domain @name (checked by the caller) from the runtime
 * directory. -ENAMETOOLONG, or what gpuipc__runtime_dir returns.
 */
int gpuipc__rundir_paths(const char *name, struct gpuipc__dom_paths *out);

/* ----- stale files of the runtime directory (prune.c) ----- */
/*
 * gpuipc__sock_listen for a socket of the runtime directory that
 * gpuipc__rundir_prune tests by connecting (a channel's chan-HEX.sock): it
 * holds DIR/.prune.lock shared from bind to listen, so that a socket bound
 * and not yet listening never reads as stale. It first removes the stale
 * channel sockets of that directory.
 */
int gpuipc__rundir_listen(const char *path, int backlog, int *out_fd);

#define GPUIPC__PRUNE_CHANNELS 0x1u /* chan-HEX.sock nobody listens on */
#define GPUIPC__PRUNE_DOMAINS 0x2u  /* NAME.sock, NAME.lock of no broker */
#define GPUIPC__PRUNE_DRY_RUN 0x4u  /* find them, remove nothing */
/*
 * Told of each stale file @name of the runtime directory, @why it is stale
 * (a phrase), and @rc: 0 removed (or, in a dry run, would be), < 0 the
 * removal failed (with a sentence).
 */
typedef void gpuipc__stale_fn(void *arg, const char *name, const char *why,
                              int rc);
/*
 * Find and remove the stale files of runtime directory @dir that @flags
 * name (a live channel's socket, a domain whose lock is held, are never
 * touched). @fn may be NULL. Returns how many were found, or -errno when
 * @dir cannot be read.
 */
int gpuipc__rundir_prune(const char *dir, unsigned flags,
                         gpuipc__stale_fn *fn, void *arg);
/* Whether entry @name of directory @dfd is a channel's socket, chan-HEX.sock
 * (and not the socket of a domain of that name). */
bool gpuipc__rundir_chan_sock(int dfd, const char *name);

/*
 * Fill @buf with @n random bytes (random.c). Returns 0 when the kernel gave
 * them (getrandom); -errno when it could not, and @buf then holds bytes
 * mixed from clocks, the pid and a counter: distinct, not secret.
 */
int gpuipc__random(void *buf, size_t n);
/* A random 64-bit value that is never 0 (0 stands for "none" in ids and
 * tokens), from gpuipc__random. */
uint64_t gpuipc__random_u64(void);

/* ----- who this process is ----- */
struct gpuipc__proc_id {
  uint8_t boot_id[16];
  uint32_t pid;
  uint64_t pidns;
  uint64_t nonce; /* random, never 0, new in every process (and after fork) */
};
/* Cached; recomputed in a forked child. */
const struct gpuipc__proc_id *gpuipc__proc_self(void);
/* Descriptors process @pid (0: this one) has open now (/proc/PID/fd),
 * -1 unknown. */
long gpuipc__fds_open(pid_t pid);
/* Entries of directory @path but "." and "..", counted up to @most; -1
 * when it cannot be read. */
long gpuipc__dir_entries(const char *path, long most);
/*
 * Whether @pid (in our pid namespace) still exists (kill(pid, 0)); a zombie
 * (dead, not yet reaped) counts as gone, a process whose main thread
 * exited while others run as alive.
 */
bool gpuipc__pid_alive(pid_t pid);
/*
 * A pidfd of process @pid (pidfd_open; close-on-exec, as every pidfd):
 * readable once the process has exited, and of that very process whatever
 * pid a later one takes. -errno: -ENOSYS before Linux 5.3, -ESRCH.
 */
int gpuipc__pidfd_open(pid_t pid);
/*
 * When process @pid (in our pid namespace) started, in clock ticks after
 * boot (/proc/PID/stat, field 22): with the boot id, a name for the
 * process that a later one with the same pid does not share. Returns 0;
 * -ESRCH when there is no such process (or only its zombie); -EINVAL for
 * pid <= 0; -errno from reading /proc; -EPROTO for an unreadable line.
 */
int gpuipc__pid_start_time(pid_t pid, uint64_t *out);

/* ----- futex (for shared-memory rings) ----- */
/*
 * Wait while *@addr == @val, up to @timeout_ms. 0 (woken, maybe
 * spuriously: re-check), -ETIMEDOUT, -EAGAIN (*@addr != @val). The expected
 * -ETIMEDOUT and -EAGAIN record no sentence. Shared (not PRIVATE) futexes:
 * waiters and wakers may be in different processes.
 */
int gpuipc__futex_wait(uint32_t *addr, uint32_t val, int timeout_ms);
/* Wake up to @n (> 0) waiters on @addr; returns how many woke. */
int gpuipc__futex_wake(uint32_t *addr, int n);

#endif
