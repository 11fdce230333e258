/* Internal core: errors with detail, logging, settings. */
#ifndef GPUIPC_CORE_H
#define GPUIPC_CORE_H

#include "gpuipc.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <string.h>

#define GPUIPC__HIDDEN __attribute__((visibility("hidden")))
#define GPUIPC__PRINTF(a, b) __attribute__((format(printf, a, b)))
#define GPUIPC__ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define GPUIPC__LIKELY(x) __builtin_expect(!!(x), 1)
#define GPUIPC__UNLIKELY(x) __builtin_expect(!!(x), 0)

/*
 * gpuipc__err - record the detail sentence for @code on this thread and
 * return @code, so that failures read `return gpuipc__err(-EINVAL, "...")`.
 * The sentence is also logged at DEBUG level.
 */
GPUIPC__HIDDEN int gpuipc__err(int code, const char *fmt, ...)
    GPUIPC__PRINTF(2, 3);

/* gpuipc__err_errno - as gpuipc__err with -errno, appending strerror. */
GPUIPC__HIDDEN int gpuipc__err_errno(int err, const char *fmt, ...)
    GPUIPC__PRINTF(2, 3);

/* ----- extensible structs ----- */
/*
 * A public struct that may grow begins with `size_t size`. The library
 * reads (and, for what it returns, writes) only the caller's first @size
 * bytes and never refuses an older, smaller struct: the fields beyond keep
 * their defaults (or are not written). A size below the size field itself,
 * 0 included, is -EINVAL.
 */
static inline int gpuipc__size_check(size_t size, const char *what)
{
  if (size < sizeof(size_t))
    return gpuipc__err(-EINVAL, "%s: size %zu is below %zu", what, size,
                       sizeof(size_t));
  return 0;
}

/* Copy the common prefix of the caller's @src over @dst (at defaults). */
static inline void gpuipc__opts_read(void *dst, size_t dst_size,
                                     const void *src, size_t src_size)
{
  memcpy(dst, src, src_size < dst_size ? src_size : dst_size);
}

/*
 * Write @full (the library's struct, @full_size bytes) into the caller's
 * @out, whose size field says it has @out_size bytes: the common prefix
 * only, out's size field kept.
 */
static inline void gpuipc__out_write(void *out, size_t out_size,
                                     const void *full, size_t full_size)
{
  size_t n = out_size < full_size ? out_size : full_size;
  if (n > sizeof(size_t))
    memcpy((char *)out + sizeof(size_t), (const char *)full + sizeof(size_t),
           n - sizeof(size_t));
}

/* ----- buffer kinds ----- */
/*
 * gpuipc.h's GPUIPC_KIND_MAP is the one list of kinds; every range check
 * and name follows it. Its values run 0 (AUTO) to GPUIPC__KIND_LAST in the
 * list's order (status.c asserts it), so a kind is a value in that range.
 */
#define GPUIPC__KIND_ONE(name, value, str, desc) +1
#define GPUIPC__KIND_COUNT (0 GPUIPC_KIND_MAP(GPUIPC__KIND_ONE))
#define GPUIPC__KIND_LAST (GPUIPC__KIND_COUNT - 1)

/* Whether @kind is a kind, AUTO included: what a caller may ask for. */
static inline bool gpuipc__kind_valid(long long kind)
{
  return kind >= GPUIPC_KIND_AUTO && kind <= GPUIPC__KIND_LAST;
}

/* Whether @kind is a kind other than AUTO: what a buffer, a handle or a
 * segment has. */
static inline bool gpuipc__kind_concrete(long long kind)
{
  return kind > GPUIPC_KIND_AUTO && kind <= GPUIPC__KIND_LAST;
}

/* ----- timeouts ----- */
/*
 * The public rule for a timeout (include/gpuipc.h, "Timeouts"): @ms as
 * given, GPUIPC_TIMEOUT_FOREVER as -1, GPUIPC_TIMEOUT_DEFAULT as @dflt
 * (the domain's timeout: milliseconds or -1); any other negative value is
 * -EINVAL with a sentence naming @who and @what.
 */
static inline int gpuipc__timeout_resolve(const char *who, const char *what,
                                          int ms, int dflt, int *out)
{
  if (ms < GPUIPC_TIMEOUT_DEFAULT)
    return gpuipc__err(-EINVAL, "%s: %s %d is not a count of ms, 0, "
                       "GPUIPC_TIMEOUT_FOREVER (-1) or GPUIPC_TIMEOUT_DEFAULT "
                       "(-2)", who, what, ms);
  *out = ms == GPUIPC_TIMEOUT_DEFAULT ? (dflt < 0 ? -1 : dflt)
                                      : ms < 0 ? -1 : ms;
  return 0;
}

/* ----- logging ----- */
GPUIPC__HIDDEN bool gpuipc__log_enabled(gpuipc_log_level_t level);
GPUIPC__HIDDEN void gpuipc__log(gpuipc_log_level_t level, const char *file,
                                int line, const char *fmt, ...)
    GPUIPC__PRINTF(4, 5);

#define GPUIPC__LOG(lvl, ...)                                                  \
  do {                                                                         \
    if (GPUIPC__UNLIKELY(gpuipc__log_enabled(lvl)))                            \
      gpuipc__log(lvl, __FILE__, __LINE__, __VA_ARGS__);                       \
  } while (0)
#define GPUIPC_LOG_E(...) GPUIPC__LOG(GPUIPC_LOG_ERROR, __VA_ARGS__)
#define GPUIPC_LOG_W(...) GPUIPC__LOG(GPUIPC_LOG_WARN, __VA_ARGS__)
#define GPUIPC_LOG_I(...) GPUIPC__LOG(GPUIPC_LOG_INFO, __VA_ARGS__)
#define GPUIPC_LOG_D(...) GPUIPC__LOG(GPUIPC_LOG_DEBUG, __VA_ARGS__)
#define GPUIPC_LOG_T(...) GPUIPC__LOG(GPUIPC_LOG_TRACE, __VA_ARGS__)

/* ----- settings ----- */
/*
 * One entry per setting; the table in config.c gives name, default and
 * help. Read from the environment once (pthread_once).
 */
#define GPUIPC_CONFIG_MAP(XX)                                                  \
  XX(LOG, "GPUIPC_LOG", "off",                                                 \
     "Log to stderr at this level: off, error, warn, info, debug, trace.")     \
  XX(CUDA_LIB, "GPUIPC_CUDA_LIB", "libcuda.so.1",                              \
     "The CUDA driver library to load.")                                       \
  XX(NO_CUDA, "GPUIPC_NO_CUDA", "0",                                           \
     "1: never load the CUDA driver; only the HOST kind is available.")        \
  XX(DIR, "GPUIPC_DIR", "",                                                    \
     "Runtime directory for domain sockets and locks (default "                \
     "$XDG_RUNTIME_DIR/gpuipc, else /tmp/gpuipc-$UID).")                       \
  XX(ALLOW_UIDS, "GPUIPC_ALLOW_UIDS", "",                                      \
     "Comma-separated uids, besides the broker's own, allowed to join.")       \
  XX(ALLOW_GIDS, "GPUIPC_ALLOW_GIDS", "",                                      \
     "Comma-separated gids whose members may join.")                           \
  XX(TIMEOUT_MS, "GPUIPC_TIMEOUT_MS", "10000",                                 \
     "Default timeout in milliseconds for broker requests.")                   \
  XX(MAX_MEMBERS, "GPUIPC_MAX_MEMBERS", "0",                                   \
     "Connections a broker takes at once; more are refused (-EUSERS). 0: "    \
     "4096. Never more than half of what the broker process's open-file "     \
     "limit (RLIMIT_NOFILE) leaves beyond the descriptors the process holds " \
     "otherwise and 32, weighed at each new connection.")                     \
  XX(MAX_MEMBERS_PER_UID, "GPUIPC_MAX_MEMBERS_PER_UID", "0",                   \
     "Connections a broker takes at once from one uid; more are refused "     \
     "(-EUSERS). 0: as many as GPUIPC_MAX_MEMBERS.")                           \
  XX(NODE_ID, "GPUIPC_NODE_ID", "0",                                           \
     "Testing aid for the MPI component: ranks with different values "         \
     "behave as if on different machines.")                                  \
  XX(MPI_CHUNK_KB, "GPUIPC_MPI_CHUNK_KB", "0",                                 \
     "MPI component: KiB in each data chunk of every message on the MPI "      \
     "path, a power of two in 4..1048576 (0: 1 to 4 MiB pipelined for "       \
     "staged GPU memory, 1 GiB otherwise).")                                   \
  XX(MPI_CUDA_AWARE, "GPUIPC_MPI_CUDA_AWARE", "auto",                          \
     "MPI component: 1 hands device pointers of gpuipc buffers to MPI, 0 "    \
     "stages GPU memory through pinned host memory, auto asks the MPI "       \
     "library (MPIX_Query_cuda_support).")                                    \
  XX(CHAN_EVENT_POLL_US, "GPUIPC_CHAN_EVENT_POLL_US", "200",                   \
     "Microseconds a channel end polls a peer's pending event or word, "       \
     "written on the GPU of the stream that would wait, before making the "    \
     "stream wait (0: never poll; from another GPU it never polls).")          \
  XX(CHAN_READY_WORDS, "GPUIPC_CHAN_READY_WORDS", "1",                       \
     "1: a message sent after GPU work is ordered by a word the sender's "    \
     "stream writes and the receiver's stream waits on (cuStreamWriteValue64 "\
     "/ cuStreamWaitValue64), where the devices can; 0: by an interprocess " \
     "event.")                                                                 \
  XX(CHAN_COPY_KERNEL_KB, "GPUIPC_CHAN_COPY_KERNEL_KB", "16384",               \
     "KiB up to which a receive copy within one GPU (from another GPU's "     \
     "memory: 256 KiB at most) and a send's staging copy of device "         \
     "memory "                                                                 \
     "are gpuipc's copy kernel, which also writes the release or ready "      \
     "word (one launch); larger ones use the copy engine (0: every one "      \
     "does).")                                                                 \
  XX(CHAN_SPIN_US, "GPUIPC_CHAN_SPIN_US", "2000",                             \
     "Longest a channel end waiting for its peer's next message or release " \
     "polls, yielding the CPU, before it sleeps: twice its last such wait "  \
     "where that was at most this long, else 200 (or this, if lower; 0: "   \
     "it sleeps after a short spin).")

typedef enum gpuipc__cfg {
#define GPUIPC__CFG_ENUM(id, name, def, help) GPUIPC_CFG_##id,
  GPUIPC_CONFIG_MAP(GPUIPC__CFG_ENUM)
#undef GPUIPC__CFG_ENUM
  GPUIPC_CFG__COUNT
} gpuipc__cfg_t;

/* The value in force (never NULL; the default when unset). */
GPUIPC__HIDDEN const char *gpuipc__cfg_str(gpuipc__cfg_t id);
/* Parsed as a non-negative integer; @fallback when unparsable. */
GPUIPC__HIDDEN long gpuipc__cfg_long(gpuipc__cfg_t id, long fallback);
/*
 * 0, or -EINVAL with a sentence naming the setting and its value when the
 * environment's value did not parse (its default is then in force). Calls
 * that depend on a setting check it, so that a typo fails loudly.
 */
GPUIPC__HIDDEN int gpuipc__cfg_check(gpuipc__cfg_t id);
/* The environment's value of @id when it did not parse (and in @why what is
 * wrong with it), else NULL. */
GPUIPC__HIDDEN const char *gpuipc__cfg_rejected(gpuipc__cfg_t id,
                                                const char **why);
/* The @i-th GPUIPC_* variable of the environment that is no setting, NULL
 * past the last (at most 16 are kept). */
GPUIPC__HIDDEN const char *gpuipc__cfg_unknown(int i);

/* Parse "off|error|...|trace" or a digit; -1 when invalid. */
GPUIPC__HIDDEN int gpuipc__log_level_parse(const char *s);

#endif
