/*
 * gpuipc — share GPU (and host) memory between processes on one machine.
 *
 * A map of this header, in the order a program meets its objects (the man
 * page named on the right describes them; gpuipc(7) is the overview):
 *
 * Domains: processes that meet by name                              gpuipc(7)
 *   gpuipc_domain_join      join a domain (hosting its broker if none runs)
 *   gpuipc_domain_info      ask the broker: members, segments, its pid
 *   gpuipc_domain_leave     leave it; the broker moves to another member
 *   gpuipc_domain_names     the domains of the runtime directory, live or not
 *   gpuipc_domain_name_check                    whether a name is valid
 * Named segments: a buffer found by name                    gpuipc_segment(3)
 *   gpuipc_segment_open     open one, or with GPUIPC_CREATE allocate it
 *   ... fill it: CPU writes, or kernels and copies queued on a stream
 *   gpuipc_segment_publish  let others open it, after the writes on a stream
 *   gpuipc_segment_unlink   free the name; the memory goes with its holders
 *   gpuipc_segment_stat / _list / _state_name   describe one / all of them
 *   gpuipc_share_copy       readers of published bytes share the copying
 *                           (gpuipc_segment_copy_shared: one segment's)
 * Buffers and handles: memory shared by hand                    gpuipc_buf(3)
 *   gpuipc_buf_alloc        allocate HOST, VMM, LEGACY or POOL memory
 *   gpuipc_buf_ptr / _size / _kind / _device    what a buffer is
 *   gpuipc_buf_export       a gpuipc_handle_t (and fd) for another process
 *   gpuipc_handle_pack / _unpack                that handle as 192 bytes
 *   gpuipc_buf_import       map a handle; gpuipc_buf_release unmaps
 *   gpuipc_buf_find / _retain                   the buffer holding an address
 *   gpuipc_buf_access / _alive                  peer access; LEGACY liveness
 *   gpuipc_buf_export_foreign                   memory gpuipc did not allocate
 *   gpuipc_handle_from_cuda_ipc / _from_cuda_fd other programs' CUDA IPC
 *   gpuipc_kind_name / _available, gpuipc_fabric_status
 * Channels: tensors between two processes                   gpuipc_channel(3)
 *   gpuipc_channel_open     pair with the other end by name
 *   gpuipc_channel_send     send a tensor (its buffer, or staged bytes)
 *   gpuipc_channel_recv     receive a zero-copy view ...
 *   gpuipc_tensor_release   ... and give it back to the sender
 *   gpuipc_channel_recv_into                    receive by copying instead
 *   gpuipc_channel_send_blocks / _recv_blocks   many blocks (a paged KV
 *                           cache) as one message, one batched copy
 *   gpuipc_channel_send_done / _send_wait / _on_release / _progress
 *                           learn when a sent buffer is free again
 *   gpuipc_channel_fd       a descriptor for epoll / select / asyncio
 *   gpuipc_channel_info / _close
 * Tensors and DLPack                                        gpuipc_channel(3)
 *   gpuipc_tensor_nbytes / _layout              size; where the bytes lie
 *   gpuipc_tensor_from_dlpack                   a DLTensor to send
 *   gpuipc_tensor_to_dlpack[_versioned][_stream]  a view for a framework
 * Interprocess events: GPU order across processes             gpuipc_event(3)
 *   gpuipc_event_create / _export / _import / _release
 *   gpuipc_event_record / _wait / _query / _sync / _device
 *   gpuipc_event_handle_pack / _unpack
 * Devices, copies and topology                                      gpuipc(7)
 *   gpuipc_driver_status, gpuipc_device_count / _info / _by_uuid
 *   gpuipc_memcpy_batch     many copies queued on a stream in one call
 *   gpuipc_memcpy           a copy that has completed on return (fill or
 *                           read GPU memory without the CUDA runtime);
 *                           queued copies, stream waits and the current
 *                           device are the CUDA runtime's or driver's
 *                           (cudaMemcpyAsync, cudaStreamSynchronize,
 *                           cudaGetDevice)
 *   gpuipc_topo_p2p / _nvml, gpuipc_link_name, gpuipc_peer_enable
 * Errors, logging, settings, version                                gpuipc(7)
 *   gpuipc_strerror / _err_name / _last_error   what went wrong
 *   gpuipc_log_set          where log lines go
 *   gpuipc_config_count / _get                  the GPUIPC_* settings
 *   gpuipc_runtime_dir / _prune                 where domains keep their
 *                                               files; what dead ones left
 *   gpuipc_version, GPUIPC_VERSION              which gpuipc this is
 *
 * One header, over 800 lines, on purpose (as liburing.h): a program
 * includes one file, the map above is its table of contents, and each
 * declaration carries the comment a caller needs (errors, thread safety),
 * so the man pages can stay short. Split, the map would span files and a
 * reader would hunt for the declarations it names.
 *
 * The declarations below come in the library's layers, lowest first: status
 * codes, settings, devices, buffers, handles, events, topology, domains,
 * segments, tensors, channels. Longer stories: docs/segment-lifetime.md
 * (how long a segment's memory lives) and docs/channels.md (how a channel
 * orders, bounds and gives back what it carries).
 *
 * Conventions for every function in this header:
 *  - Functions that can fail return int: 0 (or a count) on success, a negative
 *    code on failure. Operating-system failures are -errno (-EINVAL, -ENOMEM,
 *    ...); library failures are the GPUIPC_E_* codes below.
 *    gpuipc_strerror() and gpuipc_err_name() describe any code;
 *    gpuipc_last_error() returns a sentence with the detail of the last
 *    failure on the calling thread.
 *  - Output parameters are written only on success.
 *  - Arguments are checked before any side effect: a call rejected with -EINVAL
 *    changed nothing.
 *  - Every file descriptor gpuipc creates or receives is close-on-exec.
 *  - The library never prints (unless GPUIPC_LOG asks it to) and never exits.
 *  - Unless a function says otherwise it is thread-safe.
 */
#ifndef GPUIPC_H
#define GPUIPC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define GPUIPC_API __attribute__((visibility("default")))
#else
#define GPUIPC_API
#endif

/*
 * The version of this header; gpuipc_version() gives the library's as
 * "MAJOR.MINOR.PATCH". GPUIPC_VERSION is one number that orders releases
 * (10000 for 1.0.0), for #if GPUIPC_VERSION >= ... tests.
 */
#define GPUIPC_VERSION_MAJOR 1
#define GPUIPC_VERSION_MINOR 0
#define GPUIPC_VERSION_PATCH 0
#define GPUIPC_VERSION                                                         \
  (GPUIPC_VERSION_MAJOR * 10000 + GPUIPC_VERSION_MINOR * 100 +                 \
   GPUIPC_VERSION_PATCH)

/* ------------------------------------------------------------------------ */
/* Status codes                                                             */
/* ------------------------------------------------------------------------ */

/*
 * Library error codes. They lie below -1000 so that they never collide with
 * -errno values, which gpuipc also returns (and which gpuipc_strerror() and
 * gpuipc_err_name() describe as well).
 */
#define GPUIPC_ERRNO_MAP(XX)                                                   \
  XX(NODRIVER, -1001, "CUDA driver not available")                             \
  XX(NODEVICE, -1002, "no usable CUDA device")                                 \
  XX(CUDA, -1003, "CUDA driver call failed")                                   \
  XX(BADHANDLE, -1004, "malformed or foreign buffer handle")                   \
  XX(VERSION, -1005, "incompatible protocol version")                          \
  XX(UNSUPPORTED, -1006, "operation not supported here")                       \
  XX(PEER_GONE, -1007, "peer process has gone")                                \
  XX(DENIED, -1008, "access denied")                                           \
  XX(WHOLEBLOCK, -1009, "export would reveal memory outside the range")        \
  XX(PROTO, -1010, "malformed protocol message")                               \
  XX(MISMATCH, -1011, "segment exists with different properties")             \
  XX(LOST, -1012, "segment lost: no surviving process held it")                \
  XX(CLOSED, -1013, "object closed")

typedef enum gpuipc_status {
  GPUIPC_OK = 0,
#define GPUIPC__ERR_ENUM(name, code, msg) GPUIPC_E_##name = (code),
  GPUIPC_ERRNO_MAP(GPUIPC__ERR_ENUM)
#undef GPUIPC__ERR_ENUM
} gpuipc_status_t;

/*
 * gpuipc_strerror - a short description of a status code.
 * @code: 0, a GPUIPC_E_* code or a negative errno value.
 * Returns a static string; never NULL ("unknown error" for unknown codes).
 * Thread-safe.
 */
GPUIPC_API const char *gpuipc_strerror(int code);

/*
 * gpuipc_err_name - the symbolic name of a status code ("GPUIPC_E_DENIED",
 * "EINVAL", "OK"). Returns a static string; never NULL ("UNKNOWN").
 */
GPUIPC_API const char *gpuipc_err_name(int code);

/*
 * gpuipc_last_error - the detail of the most recent failure on this thread:
 * a sentence naming the call, the field, the CUDA error, the segment or the
 * peer. The string is thread-local and valid until the next gpuipc call on
 * this thread. Returns "" if nothing has failed on this thread yet.
 */
GPUIPC_API const char *gpuipc_last_error(void);

/* gpuipc_version - the library's version as "MAJOR.MINOR.PATCH". */
GPUIPC_API const char *gpuipc_version(void);

/* ------------------------------------------------------------------------ */
/* Logging and settings                                                     */
/* ------------------------------------------------------------------------ */

typedef enum gpuipc_log_level {
  GPUIPC_LOG_OFF = 0,
  GPUIPC_LOG_ERROR = 1,
  GPUIPC_LOG_WARN = 2,
  GPUIPC_LOG_INFO = 3,
  GPUIPC_LOG_DEBUG = 4,
  GPUIPC_LOG_TRACE = 5,
} gpuipc_log_level_t;

/*
 * A log sink. @msg is one line without a trailing newline; it is valid only
 * during the call. The callback may be called from any thread, including the
 * broker's, and must not call back into gpuipc.
 */
typedef void (*gpuipc_log_fn)(gpuipc_log_level_t level, const char *msg,
                              void *user);

/*
 * gpuipc_log_set - route log messages at or above severity @level (that is,
 * numerically <= @level) to @fn. @fn == NULL restores the default: messages
 * go to stderr only when the GPUIPC_LOG setting asks for them.
 * Returns 0, or -EINVAL for a level outside GPUIPC_LOG_OFF..GPUIPC_LOG_TRACE.
 * Thread-safe; messages already being delivered may still reach the old sink.
 */
GPUIPC_API int gpuipc_log_set(gpuipc_log_fn fn, gpuipc_log_level_t level,
                              void *user);

/*
 * Settings. Every setting is an environment variable whose name begins with
 * GPUIPC_; the environment is read once, at the first call into gpuipc.
 * gpuipc_config_count() gives the number of settings; gpuipc_config_get()
 * describes setting @index (0 <= index < count) in @out.
 * A value that does not parse (GPUIPC_TIMEOUT_MS=abc) is never used: the
 * default is in force instead (for GPUIPC_LOG: warn), `value` says so, a
 * warning is logged, and the calls that depend on the setting refuse to
 * work with it: gpuipc_domain_join fails with -EINVAL for a malformed
 * GPUIPC_TIMEOUT_MS, GPUIPC_ALLOW_UIDS, GPUIPC_ALLOW_GIDS,
 * GPUIPC_MAX_MEMBERS or GPUIPC_MAX_MEMBERS_PER_UID (whole numbers; the
 * joiner may host the broker, which lives by them), and
 * gpuipc_driver_status gives GPUIPC_E_NODRIVER for a GPUIPC_NO_CUDA other
 * than 0 or 1; gpuipc_last_error() names the variable and its value.
 * An empty value means the default. A GPUIPC_* variable that is no setting
 * (a misspelt name) is ignored with a logged warning. Logged warnings show
 * with GPUIPC_LOG=warn or through gpuipc_log_set; `gpuipc info --config`
 * shows rejected values and unknown names too.
 */
typedef struct gpuipc_config_item {
  const char *name;     /* "GPUIPC_LOG" */
  const char *value;    /* value in force (the default when unset) */
  const char *def;      /* default value */
  const char *help;     /* one sentence */
  int is_set;           /* 1 if the environment set it */
} gpuipc_config_item_t;

GPUIPC_API int gpuipc_config_count(void);

/*
 * gpuipc_config_get - describe setting @index.
 * Returns 0, or -EINVAL for a NULL @out, -ERANGE for an index out of range.
 * The strings are static and live as long as the process.
 */
GPUIPC_API int gpuipc_config_get(int index, gpuipc_config_item_t *out);

/*
 * gpuipc_config_rejected - whether the environment's value of setting
 * @index did not parse (the default is then in force, and the calls that
 * depend on it fail). @value, @why (out, may be NULL): that value and what
 * is wrong with it, static strings, set only when it was rejected.
 * Returns 1 when it was, 0 when not, -ERANGE for an index out of range.
 */
GPUIPC_API int gpuipc_config_rejected(int index, const char **value,
                                      const char **why);

/*
 * gpuipc_config_unknown - the @index-th GPUIPC_* variable of the
 * environment that names no setting (misspelt?), in @name (out: "NAME",
 * a static string). At most 16 are kept. Returns 0; -ERANGE past the
 * last; -EINVAL for a NULL @name.
 */
GPUIPC_API int gpuipc_config_unknown(int index, const char **name);

/* Flag of gpuipc_runtime_dir: create nothing (for tools that only look). */
#define GPUIPC_RUNDIR_FIND 0x1u

/*
 * gpuipc_runtime_dir - the directory where this user's domains keep their
 * sockets and files: $GPUIPC_DIR, else $XDG_RUNTIME_DIR/gpuipc, else
 * /tmp/gpuipc-$UID (to share it with a container, or to look inside),
 * spelt one way: "//" and "/./" become "/" and trailing slashes go, so
 * every process names the same files alike ("..", which means another
 * place after a symbolic link, stays).
 * It is created with mode 0700 when missing, unless @flags has
 * GPUIPC_RUNDIR_FIND. @out (in/out): a buffer of @cap bytes, given the
 * NUL-terminated path on success only.
 * Returns 0; -EINVAL for a NULL @out, unknown @flags or a relative
 * GPUIPC_DIR; -ENAMETOOLONG when @cap is too small; -ENOENT with
 * GPUIPC_RUNDIR_FIND when it does not exist; GPUIPC_E_DENIED when it (or
 * one of its ancestors) is unsafe: a symbolic link, not a directory,
 * another user's, or writable by others; gpuipc_last_error() says which,
 * and, where someone else made the directory first (anyone may make
 * /tmp/gpuipc-$UID), what to do: have it removed, or set GPUIPC_DIR (or
 * XDG_RUNTIME_DIR) to a directory of one's own.
 * Thread-safe.
 */
GPUIPC_API int gpuipc_runtime_dir(char *out, size_t cap, unsigned flags);

/* Flag of gpuipc_runtime_prune: find the stale files, remove none. */
#define GPUIPC_PRUNE_DRY_RUN 0x1u

/*
 * Told of each stale file of the runtime directory: @file, its name there;
 * @why, a phrase saying why it is stale; @rc, 0 when it was removed (or, in
 * a dry run, would be), negative when removing it failed (then
 * gpuipc_last_error() gives the sentence). @arg is the caller's.
 */
typedef void gpuipc_stale_fn(void *arg, const char *file, const char *why,
                             int rc);

/*
 * gpuipc_runtime_prune - find the files of the runtime directory that
 * processes which died left behind: the socket and lock file of a domain
 * whose broker is gone, a channel's socket nobody listens on; and remove
 * them, unless @flags has GPUIPC_PRUNE_DRY_RUN. A live domain's or
 * channel's files are never touched. Creates nothing.
 * @fn (may be NULL): called for each stale file, with @arg.
 * Returns how many stale files there were (a failed removal counts, and is
 * told to @fn); -EINVAL for unknown @flags; -ENOENT when the runtime
 * directory does not exist; GPUIPC_E_DENIED when it is unsafe (as
 * gpuipc_runtime_dir); -errno when it cannot be read.
 * Thread-safe.
 */
GPUIPC_API int gpuipc_runtime_prune(unsigned flags, gpuipc_stale_fn *fn,
                                    void *arg);

/* ------------------------------------------------------------------------ */
/* CUDA driver and devices                                                  */
/* ------------------------------------------------------------------------ */

/*
 * gpuipc_driver_status - load the CUDA driver (once per process) and report.
 * Returns 0 when the driver loaded and at least one device is visible,
 * GPUIPC_E_NODRIVER when libcuda.so.1 (or GPUIPC_CUDA_LIB) cannot be loaded,
 * lacks a required entry point or fails cuInit, GPUIPC_E_NODEVICE when the
 * driver works but no device is visible; gpuipc_last_error() says which and
 * why. The HOST kind works in every case.
 * @driver_version: optional out, the driver's CUDA version (13000 for 13.0),
 * 0 when no driver loaded. Thread-safe.
 */
GPUIPC_API int gpuipc_driver_status(int *driver_version);

/*
 * gpuipc_driver_library - which CUDA driver library gpuipc uses: loads
 * the driver as gpuipc_driver_status does, then sets @path (out, a static
 * string) to the file it was loaded from, as the dynamic linker found it,
 * or to the name it was looked for under (libcuda.so.1 or GPUIPC_CUDA_LIB)
 * when it did not load. Returns 0, or -EINVAL for a NULL @path.
 * Thread-safe.
 */
GPUIPC_API int gpuipc_driver_library(const char **path);

/*
 * gpuipc_device_count - the number of CUDA devices this process sees
 * (respecting CUDA_VISIBLE_DEVICES). Returns the count (0 without a driver).
 */
GPUIPC_API int gpuipc_device_count(void);

typedef struct gpuipc_device_info {
  size_t size;              /* set to sizeof(gpuipc_device_info_t) by caller */
  int ordinal;              /* this process's ordinal (not portable!) */
  uint8_t uuid[16];         /* portable identity of the GPU */
  char uuid_str[41];        /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
  char name[256];
  char pci_bus_id[32];      /* "0000:3b:00.0" */
  uint64_t total_mem;       /* bytes */
  int cc_major, cc_minor;   /* compute capability */
  int vmm;                  /* virtual memory management */
  int posix_fd;             /* POSIX-FD shareable handles for VMM */
  int fabric;               /* fabric handles: attribute says supported */
  int ipc_events;           /* interprocess events */
  int mem_pools;            /* stream-ordered memory pools */
  int pool_handle_types;    /* CUmemAllocationHandleType bits for pools */
  int unified_addressing;
  uint64_t granularity;     /* VMM allocation granularity, 0 if no VMM */
} gpuipc_device_info_t;

/*
 * gpuipc_device_info - describe device @ordinal.
 * @out->size must be set to sizeof(*out) (or an earlier, smaller size).
 * Returns 0; -EINVAL for NULL @out or a too-small size; GPUIPC_E_NODRIVER;
 * -ERANGE when @ordinal is not a visible device.
 */
GPUIPC_API int gpuipc_device_info(int ordinal, gpuipc_device_info_t *out);

/*
 * gpuipc_device_by_uuid - the local ordinal of the GPU with @uuid.
 * Returns the ordinal (>= 0), GPUIPC_E_NODRIVER, or GPUIPC_E_NODEVICE when
 * no visible device has that UUID.
 */
GPUIPC_API int gpuipc_device_by_uuid(const uint8_t uuid[16]);

/*
 * gpuipc_uuid_str - write @uuid (a device_uuid of gpuipc_segment_info_t,
 * gpuipc_event_info_t, ...) as gpuipc_device_info_t's uuid_str does:
 * "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", NUL-terminated, into @out.
 * Returns 0, or -EINVAL for a NULL argument. Thread-safe.
 */
GPUIPC_API int gpuipc_uuid_str(const uint8_t uuid[16], char out[41]);

/*
 * gpuipc_memcpy - copy @n bytes from @src to @dst on @stream of local
 * device @device (NULL: that device's legacy default stream), then wait
 * for the copy and the work queued before it on @stream. Either side may
 * be device memory, a mapping gpuipc made (any kind), or host memory the
 * driver can reach (unified addressing). With @device -1 both sides must
 * be host memory and the copy is a plain memcpy (no driver needed).
 * Returns 0; -EINVAL (NULL pointers with @n > 0, a device not visible);
 * GPUIPC_E_NODRIVER; GPUIPC_E_CUDA. Thread-safe.
 */
GPUIPC_API int gpuipc_memcpy(void *dst, const void *src, size_t n, int device,
                             void *stream);

/* gpuipc_memcpy_batch's flags. */
enum {
  /* Every pointer of the batch is device memory (or gpuipc's mapping of
   * it): the driver's device-to-device copy, which skips looking up what
   * each pointer is. */
  GPUIPC_MEMCPY_DEVICE = 0x1,
};

/*
 * gpuipc_memcpy_batch - queue @count copies on @stream of local device
 * @device (NULL: its legacy default stream): @n[i] bytes from @src[i] to
 * @dst[i], in that order, as @count calls of cuMemcpyAsync would, in one
 * call (one context switch, no Python or framework overhead a copy).
 * Returns once they are queued, not done: the stream's later work sees
 * them. Pointers as for gpuipc_memcpy; an @n[i] of 0 copies nothing (its
 * pointers may be NULL). @flags: 0 or GPUIPC_MEMCPY_DEVICE. With @device
 * -1 every side must be host memory: the copies are done on return.
 * Every argument is checked before anything is queued: -EINVAL (@dst,
 * @src or @n NULL with @count > 0, a NULL pointer with @n[i] > 0 -- the
 * message names i --, a device not visible, an unknown flag);
 * GPUIPC_E_NODRIVER; GPUIPC_E_CUDA (the copies before the one that failed
 * are queued; the message names it). Thread-safe.
 */
GPUIPC_API int gpuipc_memcpy_batch(void *const *dst, const void *const *src,
                                   const size_t *n, size_t count, int device,
                                   void *stream, unsigned flags);

/* ------------------------------------------------------------------------ */
/* Buffers                                                                  */
/* ------------------------------------------------------------------------ */

/*
 * The buffer kinds, one line each: XX(NAME, value, name, description) gives
 * GPUIPC_KIND_NAME = value, gpuipc_kind_name()'s answer and a line of
 * description. The values run 0, 1, 2, ... in the list's order; AUTO, the
 * first, is no buffer's kind but a request (gpuipc_buf_alloc). Everything
 * that names or checks a kind (gpuipc_kind_name, handles, segments, the
 * CLI, the Python package) follows this list; a program may walk it too.
 */
#define GPUIPC_KIND_MAP(XX)                                                    \
  XX(AUTO, 0, "auto", "VMM on a GPU when one is usable, else HOST")            \
  XX(HOST, 1, "host", "memfd, mapped in every holder")                         \
  XX(VMM, 2, "vmm", "cuMemCreate + POSIX-FD (or fabric) handles")              \
  XX(LEGACY, 3, "legacy", "cuMemAlloc + cuIpcGetMemHandle")                    \
  XX(POOL, 4, "pool", "stream-ordered pool, per-allocation export")

typedef enum gpuipc_kind {
#define GPUIPC__KIND_ENUM(name, value, str, desc) GPUIPC_KIND_##name = (value),
  GPUIPC_KIND_MAP(GPUIPC__KIND_ENUM)
#undef GPUIPC__KIND_ENUM
} gpuipc_kind_t;

/* gpuipc_kind_name - the kind's name in GPUIPC_KIND_MAP ("auto", "host",
 * ...), or "?" for a value that is no kind. */
GPUIPC_API const char *gpuipc_kind_name(gpuipc_kind_t kind);

/*
 * gpuipc_kind_available - whether buffers of @kind can be allocated in this
 * process. Returns 0 if so; otherwise the code an allocation would fail with
 * (GPUIPC_E_UNSUPPORTED, GPUIPC_E_NODRIVER, ...) with gpuipc_last_error()
 * saying why.
 */
GPUIPC_API int gpuipc_kind_available(gpuipc_kind_t kind);

/* Opaque: a buffer allocated or imported by this process. */
typedef struct gpuipc_buf gpuipc_buf_t;

/* Handle types carried in a gpuipc_handle_t. */
typedef enum gpuipc_handle_type {
  GPUIPC_HT_POSIX_FD = 1, /* an fd travels beside the record */
  GPUIPC_HT_FABRIC = 2,   /* 64 bytes of fabric handle, no fd */
  GPUIPC_HT_LEGACY = 3,   /* 64 bytes of cudaIpcMemHandle, no fd */
  GPUIPC_HT_POOL = 4,     /* pool fd + 64 bytes of pool pointer export data */
} gpuipc_handle_type_t;

#define GPUIPC_HANDLE_BYTES 64
/* Size of a packed handle record (gpuipc_handle_pack). */
#define GPUIPC_HANDLE_PACKED_SIZE 192
#define GPUIPC_HANDLE_VERSION 1

/*
 * The portable description of an exported buffer. Plain data: it can be
 * copied, packed to bytes (gpuipc_handle_pack) and unpacked in another
 * process (gpuipc_handle_unpack). For GPUIPC_HT_POSIX_FD and GPUIPC_HT_POOL
 * the memory travels as the file descriptor @fd, which the user sends beside
 * the packed bytes (SCM_RIGHTS); the packed form never contains it.
 */
typedef struct gpuipc_handle {
  uint32_t version;          /* GPUIPC_HANDLE_VERSION */
  gpuipc_kind_t kind;
  gpuipc_handle_type_t type;
  uint32_t flags;            /* reserved, 0 */
  uint64_t size;             /* bytes the importer may use */
  uint64_t offset;           /* where they start in the exported allocation */
  uint64_t alloc_size;       /* size of the exported allocation */
  uint8_t device_uuid[16];   /* all zero for HOST */
  uint64_t export_id;        /* never reused by the exporting process */
  uint8_t boot_id[16];       /* exporter's kernel boot id */
  uint32_t pid;              /* exporter's pid (in its pid namespace) */
  uint64_t pidns;            /* exporter's pid namespace inode */
  uint64_t nonce;            /* exporter's random per-process identity */
  uint8_t bytes[GPUIPC_HANDLE_BYTES]; /* legacy/fabric/pool data, else 0 */
  int fd;                    /* -1 when none; not part of the packed form */
} gpuipc_handle_t;

/*
 * gpuipc_buf_alloc - allocate a shareable buffer.
 * @size: bytes, > 0; rounded up to the kind's granularity (a page for HOST).
 * @kind: GPUIPC_KIND_AUTO picks VMM when a GPU is usable, else HOST; on a
 *        @device that lacks VMM with POSIX descriptors while another GPU
 *        has it, LEGACY.
 * @device: this process's CUDA ordinal for the GPU kinds; ignored for HOST
 *          (pass -1).
 * @flags: 0 or GPUIPC_BUF_UNPINNED (below).
 * @out: the new buffer, with one reference.
 * Returns 0; -EINVAL (NULL @out, zero size, unknown kind or flags);
 * -ENOMEM or -EFBIG for sizes the system cannot provide; GPUIPC_E_UNSUPPORTED
 * for a kind this build or machine lacks; GPUIPC_E_NODRIVER /
 * GPUIPC_E_NODEVICE / GPUIPC_E_CUDA for GPU kinds.
 * HOST memory is zero-filled and mapped read-write. Where a CUDA driver and
 * device are present it is registered with CUDA (pinned: portable,
 * device-mapped, so kernels reach it) without ever starting CUDA: at once
 * when this process has a CUDA context already (the calling thread's
 * current one, else a device's active primary context: the runtime's, as
 * PyTorch makes it), in the primary context of that context's device (so
 * a program on its second GPU makes none on the first); otherwise when
 * gpuipc first puts GPU work on it (a copy of gpuipc_channel_recv_into, a
 * channel's GPU message). So a process that only moves host memory never
 * loads the driver. A buffer your own kernels will read directly: start
 * CUDA first. The same holds for HOST buffers imported or opened as
 * segments.
 * Registering host memory and undoing it (at the last release) wait for
 * the work queued on the GPU to finish (on an H100, both took as long as
 * the 0.76 s kernel queued before them): host-only data that no GPU
 * reads -- metadata, a manifest -- is better mapped with
 * GPUIPC_BUF_UNPINNED, which leaves it unregistered until gpuipc itself
 * puts GPU work on it.
 */
#define GPUIPC_BUF_UNPINNED 0x1u /* HOST: not registered with CUDA at the
                                    mapping (ignored by the GPU kinds) */
GPUIPC_API int gpuipc_buf_alloc(size_t size, gpuipc_kind_t kind, int device,
                                unsigned flags, gpuipc_buf_t **out);

/* Accessors. Each returns 0 / NULL / -1 for a NULL buffer. */
GPUIPC_API void *gpuipc_buf_ptr(const gpuipc_buf_t *buf);
GPUIPC_API size_t gpuipc_buf_size(const gpuipc_buf_t *buf);
GPUIPC_API gpuipc_kind_t gpuipc_buf_kind(const gpuipc_buf_t *buf);
/*
 * gpuipc_buf_device - the local CUDA ordinal whose primary context should
 * touch the buffer (copies, kernels): for an allocated buffer, the GPU its
 * memory is on; for an imported one, the local GPU its mapping was made
 * for -- the @device given to the import (or segment open), which may be
 * another GPU than the owner's, or the owner's GPU when that was -1. A
 * later import of the same memory for another device returns the same
 * buffer, granted access from that device too, and this keeps naming the
 * first. -1 for HOST (and NULL).
 */
GPUIPC_API int gpuipc_buf_device(const gpuipc_buf_t *buf);

/*
 * gpuipc_buf_export - describe @buf for another process.
 * @out: filled on success. For fd-carrying types @out->fd is a new
 *       close-on-exec descriptor that the caller owns and must close (after
 *       sending it); otherwise -1.
 * Buffers imported from another process can be exported again: their fd is
 * passed on and the record keeps naming the original exporter.
 * Returns 0; -EINVAL (NULL argument); -EMFILE and other -errno from dup;
 * GPUIPC_E_CUDA.
 */
GPUIPC_API int gpuipc_buf_export(gpuipc_buf_t *buf, gpuipc_handle_t *out);

/*
 * gpuipc_buf_import - map a buffer exported by any process (this one too).
 * @h: a handle from gpuipc_buf_export or gpuipc_handle_unpack, with @h->fd
 *     set for fd-carrying types. Without GPUIPC_BUF_TAKE_FD the fd is not
 *     consumed: gpuipc duplicates what it keeps and the caller still
 *     closes its own.
 * @device: local CUDA ordinal that must reach the memory; -1 for the GPU the
 *     handle names (found by UUID) or for HOST.
 * @flags: 0, GPUIPC_BUF_UNPINNED (HOST: a new mapping is not registered
 *     with CUDA; see gpuipc_buf_alloc. A mapping this process has already
 *     is returned as it is), GPUIPC_BUF_TAKE_FD (below), or both.
 * @out: the buffer. Importing an export of this very process returns the
 *     original buffer with one more reference (same pointer). Importing the
 *     same export twice maps it once and counts references; when the later
 *     import names another @device, that device is granted access to the
 *     mapping (as gpuipc_buf_access does) before it is returned.
 * GPUIPC_BUF_TAKE_FD hands @h->fd to gpuipc when the import succeeds: a
 * new VMM mapping keeps that very descriptor (close-on-exec set) to export
 * the buffer again, where otherwise it makes a duplicate; every other case
 * closes it before returning. The caller must not close it then. On
 * failure it stays the caller's, open. A handle without an fd ignores the
 * flag. A receiver that would close the fd right after importing saves a
 * dup and a close this way (gpuipc's channels and segments do).
 * Returns 0; -EINVAL (NULL argument, flags); GPUIPC_E_BADHANDLE (fields
 * inconsistent, fd missing, of the wrong type or smaller than the handle
 * says); GPUIPC_E_UNSUPPORTED; GPUIPC_E_NODEVICE (the GPU is not visible
 * here); GPUIPC_E_PEER_GONE (a LEGACY exporter died); -errno from mmap
 * and fcntl.
 */
#define GPUIPC_BUF_TAKE_FD 0x2u /* import: on success @h->fd is gpuipc's */
GPUIPC_API int gpuipc_buf_import(const gpuipc_handle_t *h, int device,
                                 unsigned flags, gpuipc_buf_t **out);

/*
 * gpuipc_buf_release - drop one reference; the last one unmaps (and frees,
 * for the allocating process) the memory. Other processes that imported it
 * keep their mappings (HOST, VMM). The creator of a named segment whose
 * memory only it holds (LEGACY, POOL) keeps that memory after its last
 * release until the segment is unlinked and held by nobody (see
 * gpuipc_segment_open). Releasing NULL returns -EINVAL.
 * Returns 0 or GPUIPC_E_CUDA (the reference is dropped all the same).
 */
GPUIPC_API int gpuipc_buf_release(gpuipc_buf_t *buf);

/*
 * gpuipc_buf_retain - take one more reference to @buf, which the caller
 * holds one of; each is dropped by its own gpuipc_buf_release.
 * Returns 0; -EINVAL (@buf NULL, or released to no reference). Thread-safe.
 */
GPUIPC_API int gpuipc_buf_retain(gpuipc_buf_t *buf);

/*
 * gpuipc_buf_find - the buffer of this process whose memory holds all of
 * [@ptr, @ptr + @bytes): any buffer it allocated or imported, HOST or GPU,
 * not yet released (segments' too), so that memory lying in one can be
 * sent or shared without holding its gpuipc_buf_t. With @bytes 0, @ptr may
 * also be the buffer's end. Where two buffers hold the range (two
 * mappings of one memory), the one that starts last.
 * @out: the buffer, with a reference of the caller's own (release it with
 *     gpuipc_buf_release); @offset: where not NULL, @ptr - gpuipc_buf_ptr.
 * Returns 0; -EINVAL (@ptr or @out NULL; the range wraps around the
 * address space); -ENOENT (no buffer holds the whole range: one that holds
 * only its start is no answer). Thread-safe; a look-up takes the buffer
 * table's lock for a binary search.
 */
GPUIPC_API int gpuipc_buf_find(const void *ptr, size_t bytes,
                               gpuipc_buf_t **out, size_t *offset);

/* ------------------------------------------------------------------------ */
/* Handles on the wire                                                      */
/* ------------------------------------------------------------------------ */

/*
 * gpuipc_handle_pack - encode @h as GPUIPC_HANDLE_PACKED_SIZE bytes
 * (little-endian, versioned, checksummed) into @dst.
 * Returns the number of bytes written; -EINVAL (NULL argument),
 * -ENOSPC (@cap too small), GPUIPC_E_BADHANDLE (@h is not a valid handle).
 */
GPUIPC_API int gpuipc_handle_pack(const gpuipc_handle_t *h, void *dst,
                                  size_t cap);

/*
 * gpuipc_handle_unpack - decode and validate @len bytes into @out.
 * Every field is checked: magic, version (a newer version is refused), record
 * length, checksum, kind, handle type, flags, reserved bytes, size, offset,
 * allocation size, pid, export id, the handle bytes for the type.
 * @out->fd is set to -1: the caller fills it with the descriptor it received.
 * Returns 0; -EINVAL (NULL argument); GPUIPC_E_BADHANDLE with
 * gpuipc_last_error() naming the field.
 */
GPUIPC_API int gpuipc_handle_unpack(const void *src, size_t len,
                                    gpuipc_handle_t *out);

/* ------------------------------------------------------------------------ */
/* GPU buffers: access, liveness, foreign memory, fabric handles            */
/* ------------------------------------------------------------------------ */

/*
 * gpuipc_buf_access - let kernels on local device @device use @buf.
 * A buffer is usable from the device it was allocated or imported for; this
 * grants another device read-write access over peer-to-peer: cuMemSetAccess
 * for VMM, peer access for LEGACY, cuMemPoolSetAccess for POOL. HOST
 * buffers are reachable from every device already (returns 0).
 * Returns 0 (also when access was already granted); -EINVAL (NULL @buf);
 * -ERANGE (@device not visible); GPUIPC_E_UNSUPPORTED (the two GPUs cannot
 * reach each other: no P2P); GPUIPC_E_CUDA.
 * Thread-safe.
 */
GPUIPC_API int gpuipc_buf_access(gpuipc_buf_t *buf, int device);

/*
 * gpuipc_buf_alive - whether the memory behind @buf is still there.
 * LEGACY memory dies with the process that allocated it: an imported LEGACY
 * buffer whose exporter has exited answers GPUIPC_E_PEER_GONE, and the
 * pointer must not be used. Other kinds live as long as a holder keeps
 * them, so they answer 0. The exporter is checked by pid (same boot and pid
 * namespace only; elsewhere the answer is 0).
 * Returns 0; -EINVAL (NULL); GPUIPC_E_PEER_GONE. Thread-safe.
 */
GPUIPC_API int gpuipc_buf_alive(const gpuipc_buf_t *buf);

/* gpuipc_buf_export_foreign flags. */
#define GPUIPC_FOREIGN_ALLOW_WHOLEBLOCK 0x1u

/*
 * gpuipc_buf_export_foreign - export device memory that gpuipc did not
 * allocate (a framework's cudaMalloc, a cuMemCreate mapping).
 * @ptr, @size: the bytes to share, inside one allocation.
 * @flags: 0 or GPUIPC_FOREIGN_ALLOW_WHOLEBLOCK.
 * @out: a handle that gpuipc_buf_import maps in any process of this
 *       machine. cudaMalloc/cuMemAlloc memory travels as a LEGACY handle
 *       (no fd; it dies with this process); cuMemCreate memory created with
 *       POSIX-FD handles travels as a VMM handle with a new close-on-exec
 *       @out->fd that the caller owns.
 * An importer can read every byte of what the driver shares, which is
 * more than [ptr, ptr + size) unless the range is a whole allocation and,
 * for cudaMalloc memory, that allocation fills whole 2 MiB blocks of its
 * own (small cudaMallocs share blocks with their neighbours). Such exports
 * are refused with GPUIPC_E_WHOLEBLOCK unless @flags has
 * GPUIPC_FOREIGN_ALLOW_WHOLEBLOCK, by which the caller accepts that
 * disclosure.
 * Returns 0; -EINVAL (NULL or zero argument, unknown flags, @ptr not device
 * memory, the range runs past its allocation); GPUIPC_E_WHOLEBLOCK;
 * GPUIPC_E_UNSUPPORTED (memory the driver cannot share this way, e.g. from
 * a stream-ordered pool); GPUIPC_E_NODRIVER; GPUIPC_E_CUDA.
 * Thread-safe.
 */
GPUIPC_API int gpuipc_buf_export_foreign(void *ptr, size_t size,
                                         unsigned flags,
                                         gpuipc_handle_t *out);

/*
 * gpuipc_handle_from_cuda_ipc - a handle for memory another program shared
 * by legacy CUDA IPC: a cudaIpcMemHandle_t as CuPy's
 * cupy.cuda.runtime.ipcGetMemHandle gives it (64 bytes), or as PyTorch's
 * storage._share_cuda_() gives it (66 bytes: b'\x02c', then the 64).
 * gpuipc_buf_import(@out, ...) then maps it: the buffer's pointer is the
 * block's base + @offset, its size @size, checked against the size of the
 * block that the driver reports after opening it (GPUIPC_E_BADHANDLE from
 * the import when the range runs past it).
 * @bytes, @len: the handle (64 or 66 bytes; only PyTorch's b'\x02c' form
 *     is read: b'\x02e', an expandable segment, is refused whatever its
 *     length; gpuipc.torch.from_torch imports it with
 *     gpuipc_handle_from_cuda_fd).
 * @offset: where the bytes to use start in the block (PyTorch: the
 *     storage offset in bytes that _share_cuda_ returns beside the handle).
 * @size: bytes to use, > 0.
 * @device: the local ordinal of the GPU the memory is on, in this process
 *     (ordinals differ between processes with CUDA_VISIBLE_DEVICES: send
 *     the UUID and use gpuipc_device_by_uuid when in doubt).
 * @exporter_pid: the pid of the process that made the handle, as this
 *     process sees it; not this process (a process cannot open its own).
 *     Legacy memory dies with it: imports and gpuipc_buf_alive check it.
 * @out: filled on success; no fd (@out->fd is -1). Packed and unpacked
 *     like any handle.
 * The import cache knows such a handle by its exporter (pid and start
 * time) and its bytes, offset and size: the same tensor imported twice is
 * mapped once, tensors of one block share one driver opening, and handles
 * of different blocks are never taken for each other. The exporter must
 * keep the block allocated while any importer holds it (PyTorch's
 * torch.multiprocessing does so with its reference counter).
 * Returns 0; -EINVAL (NULL argument, @len neither 64 nor 66, zero @size,
 * @offset + @size past 2^48, @device < 0, @exporter_pid not a pid or this
 * process); -ERANGE (@device not visible); GPUIPC_E_BADHANDLE (66 bytes
 * not beginning b'\x02c', or an all-zero handle); GPUIPC_E_UNSUPPORTED
 * (b'\x02e' and any length but 64); GPUIPC_E_PEER_GONE (no process @exporter_pid); -errno
 * or -EPROTO when /proc/PID/stat cannot be read; GPUIPC_E_NODRIVER.
 * Thread-safe.
 *
 * The other way round: the 64 @bytes of a LEGACY handle from
 * gpuipc_buf_export (or gpuipc_buf_export_foreign) are a cudaIpcMemHandle_t
 * that cudaIpcOpenMemHandle, and CuPy's cupy.cuda.runtime.ipcOpenMemHandle,
 * open in another process; the bytes to use start @offset bytes after the
 * pointer it returns (0 for a gpuipc_buf_alloc buffer) and are @size long.
 */
GPUIPC_API int gpuipc_handle_from_cuda_ipc(const void *bytes, size_t len,
                                           size_t offset, size_t size,
                                           int device, int exporter_pid,
                                           gpuipc_handle_t *out);

/*
 * gpuipc_handle_from_cuda_fd - a handle for cuMemCreate memory exported
 * as a POSIX file descriptor (cuMemExportToShareableHandle with
 * CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, as PyTorch's expandable
 * segments and other VMM allocators share it). gpuipc_buf_import(@out,
 * ...) maps [@offset, @offset + @size) of the allocation, with the
 * granules that hold it, and keeps a duplicate of @fd (the caller closes
 * its own whenever it likes after the import); the import fails with
 * GPUIPC_E_BADHANDLE when @fd is not CUDA memory and with GPUIPC_E_CUDA
 * when the range runs past the allocation (the driver refuses the map).
 * @fd: the descriptor, borrowed: @out->fd is @fd itself, not a copy.
 * @offset, @size: the bytes to use, @size > 0.
 * @device: the local ordinal of the GPU the memory is on.
 * @out: a VMM handle of this process's own (a new export id, so each call
 *     maps anew; one handle imported twice maps once). It can be exported
 *     again, and packed and sent with @fd beside it.
 * Returns 0; -EINVAL (NULL @out, zero @size, @offset + @size past 2^48,
 * @device < 0); -EBADF (@fd not open); -ERANGE (@device not visible);
 * GPUIPC_E_NODRIVER; GPUIPC_E_UNSUPPORTED (built without CUDA);
 * GPUIPC_E_CUDA. Thread-safe.
 */
GPUIPC_API int gpuipc_handle_from_cuda_fd(int fd, size_t offset, size_t size,
                                          int device, gpuipc_handle_t *out);

/*
 * gpuipc_fabric_status - whether VMM buffers on local device @device are
 * created with fabric handles besides POSIX file descriptors.
 * The answer comes from a probe allocation made once per device and
 * cached. Returns 0 when fabric handles work; otherwise the reason's code
 * (GPUIPC_E_UNSUPPORTED, GPUIPC_E_DENIED when the driver said "not
 * permitted", e.g. without an IMEX channel) with gpuipc_last_error() giving
 * the one-line reason; -ERANGE for an ordinal that is not visible;
 * GPUIPC_E_NODRIVER. POSIX file descriptors are used in every case.
 */
GPUIPC_API int gpuipc_fabric_status(int device);

/* ------------------------------------------------------------------------ */
/* Interprocess events                                                      */
/* ------------------------------------------------------------------------ */

/*
 * An interprocess CUDA event: one process creates and exports it, others
 * import it; any of them records it on a stream and any of them makes a
 * stream wait for it, with no host synchronisation.
 */
typedef struct gpuipc_event gpuipc_event_t;

#define GPUIPC_EVENT_HANDLE_VERSION 1
/* Size of a packed event handle (gpuipc_event_handle_pack). */
#define GPUIPC_EVENT_HANDLE_PACKED_SIZE 144

/* The portable description of an exported event. Plain data, no fd. */
typedef struct gpuipc_event_handle {
  uint32_t version;          /* GPUIPC_EVENT_HANDLE_VERSION */
  uint32_t flags;            /* reserved, 0 */
  uint8_t device_uuid[16];   /* GPU the event was created on */
  uint64_t event_id;         /* never reused by the exporting process */
  uint8_t boot_id[16];       /* exporter's kernel boot id */
  uint32_t pid;              /* exporter's pid (in its pid namespace) */
  uint64_t pidns;            /* exporter's pid namespace inode */
  uint64_t nonce;            /* exporter's random per-process identity */
  uint8_t bytes[GPUIPC_HANDLE_BYTES]; /* the CUipcEventHandle */
} gpuipc_event_handle_t;

/*
 * gpuipc_event_create - a new interprocess event on local device @device
 * (CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS), with one reference.
 * @flags: 0 (reserved).
 * Returns 0; -EINVAL (NULL @out, flags); -ERANGE (@device not visible);
 * GPUIPC_E_NODRIVER; GPUIPC_E_UNSUPPORTED (no IPC events); GPUIPC_E_CUDA.
 */
GPUIPC_API int gpuipc_event_create(int device, unsigned flags,
                                   gpuipc_event_t **out);

/*
 * gpuipc_event_export - describe @ev for another process. Events imported
 * from another process can be exported again (the record keeps naming the
 * original exporter). Returns 0; -EINVAL.
 */
GPUIPC_API int gpuipc_event_export(const gpuipc_event_t *ev,
                                   gpuipc_event_handle_t *out);

/*
 * gpuipc_event_import - open the event @h describes.
 * @device: local ordinal whose primary context opens the event, which is
 *     the device whose streams will record or wait on it (possibly not the
 *     GPU the event was created on); -1 for the GPU the handle names (found
 *     by UUID).
 * Imports are cached per process and device: importing the same event for
 * the same device again returns the same object with one more reference,
 * without a driver call; importing an event this process exported returns
 * the original.
 * Returns 0; -EINVAL (NULL argument); GPUIPC_E_BADHANDLE (fields invalid);
 * GPUIPC_E_NODEVICE (the GPU is not visible here, UUID in the sentence);
 * GPUIPC_E_PEER_GONE (the exporter has exited); GPUIPC_E_CUDA.
 */
GPUIPC_API int gpuipc_event_import(const gpuipc_event_handle_t *h,
                                   int device, gpuipc_event_t **out);

/*
 * gpuipc_event_record - record @ev on @stream (a CUstream / cudaStream_t;
 * NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD: that default stream of the
 * primary context of the event's device). Another stream must belong
 * to the primary context of the event's device (gpuipc_event_device: the
 * one it was created or imported on), else -EINVAL: the driver cannot use
 * an interprocess event on another device's stream.
 * Returns 0; -EINVAL; GPUIPC_E_CUDA.
 */
GPUIPC_API int gpuipc_event_record(gpuipc_event_t *ev, void *stream);

/*
 * gpuipc_event_wait - make @stream (a default stream, as for
 * gpuipc_event_record: that of the event's device) wait until the last
 * record of @ev has completed, in whichever process recorded it. Does not
 * block the host. As for gpuipc_event_record, another stream must be on
 * the event's device.
 * Returns 0; -EINVAL; GPUIPC_E_CUDA.
 */
GPUIPC_API int gpuipc_event_wait(gpuipc_event_t *ev, void *stream);

/*
 * gpuipc_event_query - 0 when the last record of @ev has completed (or
 * nothing was recorded), -EAGAIN while it is pending; -EINVAL;
 * GPUIPC_E_CUDA.
 */
GPUIPC_API int gpuipc_event_query(gpuipc_event_t *ev);

/* gpuipc_event_sync - block the host until @ev has completed.
 * Returns 0; -EINVAL (NULL); GPUIPC_E_CUDA. */
GPUIPC_API int gpuipc_event_sync(gpuipc_event_t *ev);

/* The local ordinal of @ev's device, -1 for NULL. */
GPUIPC_API int gpuipc_event_device(const gpuipc_event_t *ev);

/*
 * gpuipc_event_release - drop one reference; the last one destroys the
 * event in this process (other processes keep theirs).
 * Returns 0, -EINVAL (NULL) or GPUIPC_E_CUDA (the reference is dropped all
 * the same).
 */
GPUIPC_API int gpuipc_event_release(gpuipc_event_t *ev);

/*
 * gpuipc_event_handle_pack - encode @h as GPUIPC_EVENT_HANDLE_PACKED_SIZE
 * bytes (little-endian, versioned, checksummed). Returns the byte count;
 * -EINVAL; -ENOSPC; GPUIPC_E_BADHANDLE (@h invalid).
 * gpuipc_event_handle_unpack - decode and validate (magic, version, length,
 * checksum, flags, reserved bytes, ids); GPUIPC_E_BADHANDLE naming the
 * field.
 */
GPUIPC_API int gpuipc_event_handle_pack(const gpuipc_event_handle_t *h,
                                        void *dst, size_t cap);
GPUIPC_API int gpuipc_event_handle_unpack(const void *src, size_t len,
                                          gpuipc_event_handle_t *out);

/* ------------------------------------------------------------------------ */
/* Topology                                                                 */
/* ------------------------------------------------------------------------ */

/* How two GPUs are connected, in the terms of `nvidia-smi topo -m`. */
typedef enum gpuipc_link {
  GPUIPC_LINK_UNKNOWN = 0, /* NVML not available */
  GPUIPC_LINK_SELF = 1,    /* the same GPU ("X") */
  GPUIPC_LINK_NVLINK = 2,  /* NVLink ("NV#", the count in nvlinks) */
  GPUIPC_LINK_PIX = 3,     /* at most one PCIe bridge */
  GPUIPC_LINK_PXB = 4,     /* several PCIe bridges, no host bridge */
  GPUIPC_LINK_PHB = 5,     /* through a PCIe host bridge */
  GPUIPC_LINK_NODE = 6,    /* between host bridges of one NUMA node */
  GPUIPC_LINK_SYS = 7,     /* across NUMA nodes (SMP interconnect) */
} gpuipc_link_t;

/* gpuipc_link_name - "X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS" or "?". */
GPUIPC_API const char *gpuipc_link_name(gpuipc_link_t link);

typedef struct gpuipc_p2p {
  size_t size;           /* set to sizeof(gpuipc_p2p_t) by the caller */
  int access;            /* @src can map @dst's memory (1/0) */
  int perf_rank;         /* CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK */
  int native_atomics;    /* every atomic works over the link (1/0) */
  int cuda_arrays;       /* CUDA arrays can be accessed over the link */
  gpuipc_link_t link;    /* from NVML; GPUIPC_LINK_UNKNOWN without it */
  int nvlinks;           /* active NVLinks between them, -1 unknown */
} gpuipc_p2p_t;

/*
 * gpuipc_topo_p2p - how local device @src reaches local device @dst.
 * @out->size must be set. Driver attributes always; link type and NVLink
 * count when NVML (libnvidia-ml.so.1) can be loaded.
 * Returns 0; -EINVAL (NULL, size); -ERANGE (ordinal not visible);
 * GPUIPC_E_NODRIVER; GPUIPC_E_CUDA. Thread-safe.
 */
GPUIPC_API int gpuipc_topo_p2p(int src, int dst, gpuipc_p2p_t *out);

/*
 * gpuipc_topo_nvml - 0 when NVML is loaded and initialised (loading it
 * once), else GPUIPC_E_UNSUPPORTED with gpuipc_last_error() saying why.
 */
GPUIPC_API int gpuipc_topo_nvml(void);

/*
 * gpuipc_peer_enable - let kernels on local device @src access memory
 * allocated (cudaMalloc, cuMemAlloc, LEGACY buffers) on local device @dst,
 * in the primary contexts (what cudaDeviceEnablePeerAccess does).
 * Returns 0 (also when already enabled or @src == @dst); -ERANGE;
 * GPUIPC_E_UNSUPPORTED (no P2P between them); GPUIPC_E_NODRIVER;
 * GPUIPC_E_CUDA. Thread-safe.
 */
GPUIPC_API int gpuipc_peer_enable(int src, int dst);

/* ------------------------------------------------------------------------ */
/* Domains                                                                  */
/* ------------------------------------------------------------------------ */

/*
 * A domain is a named rendezvous of processes on one machine. Its broker
 * keeps the registry of named segments; it runs in a thread of the first
 * process to join (or in `gpuipc serve NAME`) and moves to another member
 * when that process leaves or dies. Its socket and lock live in the runtime
 * directory (GPUIPC_DIR: of any length; it and each of its ancestors must
 * be root's or ours and writable by nobody else, unless sticky like /tmp).
 * Only processes of the broker's uid may join, unless GPUIPC_ALLOW_UIDS /
 * GPUIPC_ALLOW_GIDS (read by the process hosting the broker) widen the
 * circle. A member let in that way never hosts the domain (a hand-over goes
 * only to a member of the broker's uid); it reaches the domain through a
 * link to its socket in its own runtime directory (README.md says how).
 *
 * Names of domains and segments: 1 to GPUIPC_NAME_MAX characters from
 * A-Z a-z 0-9 . _ -, not starting with '.'.
 */
typedef struct gpuipc_domain gpuipc_domain_t;

#define GPUIPC_NAME_MAX 63

/* gpuipc_domain_opts_t.flags: never host the broker; fail if none runs. */
#define GPUIPC_JOIN_NO_BROKER 0x1u

/*
 * Timeouts: one rule for every call and option that takes one
 * (gpuipc_domain_opts_t, gpuipc_segment_opts_t, gpuipc_share_opts_t,
 * gpuipc_channel_opts_t's
 * timeout_ms and send_timeout_ms, gpuipc_channel_recv, _recv_into,
 * _send_done, _send_wait, and their gpuipc_mpi_channel_* twins):
 * milliseconds, or one of these. 0 does not wait at all: the call returns
 * at once with the code it documents for "not there" (-EAGAIN or
 * -ETIMEDOUT). GPUIPC_TIMEOUT_DEFAULT takes the domain's timeout
 * (gpuipc_domain_opts_t.timeout_ms; the GPUIPC_TIMEOUT_MS setting where
 * there is no domain, as on the MPI path of gpuipc_mpi_channel_*). A
 * negative value other than these two is -EINVAL. The domain's own
 * timeout reads 0 as GPUIPC_TIMEOUT_DEFAULT (see there); every other
 * zero means "do not wait", so option structs whose zero would mislead
 * have an initializer (GPUIPC_SEGMENT_OPTS_INIT, GPUIPC_SHARE_OPTS_INIT,
 * GPUIPC_CHANNEL_OPTS_INIT) that sets GPUIPC_TIMEOUT_DEFAULT, and a struct
 * of an older, smaller size takes GPUIPC_TIMEOUT_DEFAULT for the timeouts
 * it lacks.
 */
#define GPUIPC_TIMEOUT_FOREVER (-1) /* wait as long as it takes */
#define GPUIPC_TIMEOUT_DEFAULT (-2) /* the domain's timeout (its opts) */

typedef struct gpuipc_domain_opts {
  /*
   * sizeof(gpuipc_domain_opts_t), or the size of an earlier version of
   * this struct: the library reads only the first @size bytes and takes
   * the default of every field beyond them (below sizeof(size_t): -EINVAL).
   */
  size_t size;
  unsigned flags; /* GPUIPC_JOIN_* */
  /*
   * The domain's timeout: how long to wait for the broker when joining and
   * for every request (gpuipc_segment_open's GPUIPC_WAIT included) that
   * says GPUIPC_TIMEOUT_DEFAULT. Milliseconds, GPUIPC_TIMEOUT_FOREVER, or
   * GPUIPC_TIMEOUT_DEFAULT: the GPUIPC_TIMEOUT_MS setting (default). 0 is
   * read as GPUIPC_TIMEOUT_DEFAULT here (a domain that never waits could
   * complete no request), so zeroed options keep the setting. Below
   * GPUIPC_TIMEOUT_DEFAULT: -EINVAL.
   */
  int timeout_ms;
} gpuipc_domain_opts_t;

/*
 * gpuipc_domain_join - join domain @name: connect to its broker, or become
 * it when none runs (leader election on the domain's lock file; a socket
 * left by a dead broker is removed).
 * @opts: optional (NULL: defaults).
 * @out: the domain, to be left with gpuipc_domain_leave.
 * Returns 0; -EINVAL (NULL @out, a bad name — the sentence gives the rule —
 * bad @opts, or a GPUIPC_TIMEOUT_MS, GPUIPC_ALLOW_UIDS, GPUIPC_ALLOW_GIDS,
 * GPUIPC_MAX_MEMBERS or GPUIPC_MAX_MEMBERS_PER_UID that does not parse);
 * GPUIPC_E_DENIED when the broker refused this process's uid, or the
 * runtime directory or one of its ancestors is unsafe (the sentence names
 * it, and what to do where another user made it first: see
 * gpuipc_runtime_dir); GPUIPC_E_VERSION when the broker speaks another
 * protocol version; -EUSERS when the broker has as many connections as it
 * takes, in all (GPUIPC_MAX_MEMBERS, never more than half of what its
 * process's open-file limit leaves beyond the descriptors the process holds
 * otherwise and 32) or from this uid
 * (GPUIPC_MAX_MEMBERS_PER_UID); -EMFILE when the broker's process has no
 * descriptor free (or this process has none) — both at once, not after the
 * timeout, the sentence naming the limit: try again once members have
 * left; -ENOENT with GPUIPC_JOIN_NO_BROKER when no broker runs;
 * -ETIMEDOUT; -errno from the socket calls.
 * Thread-safe. A process may join several domains, and the same domain more
 * than once (each join is a member of its own). A domain does not survive
 * fork(): a child joins anew, and closes at once the domain descriptors it
 * inherited (the broker's lock and sockets, known by device and inode,
 * however the runtime directory's path is spelt), so that its parent's
 * death is seen and another member can become the broker. A join has a
 * thread of the library grow the process's descriptor table to 1024
 * entries (or the soft RLIMIT_NOFILE), and does not wait for it (the
 * growth holds one descriptor for an instant, a copy of stdin closed at
 * once, which a count of /proc/self/fd can see): a member holds a descriptor for each buffer it imports, and a
 * table that grows while the process has threads costs a kernel grace
 * period (8-23 ms) that a first transfer would otherwise pay. Past that,
 * gpuipc grows the table the same way once its descriptors fill a quarter
 * of it, and again once the program raises a soft limit the table had
 * reached.
 */
GPUIPC_API int gpuipc_domain_join(const char *name,
                                  const gpuipc_domain_opts_t *opts,
                                  gpuipc_domain_t **out);

/*
 * gpuipc_domain_leave - leave the domain and free @dom. The broker drops the
 * references @dom held (segment buffers stay mapped until released). If
 * @dom hosts the broker, the broker first hands its registry, descriptors,
 * lock and socket to another member, so that nothing is lost; with no
 * member left the domain ends and its unlinked-or-not segments with it,
 * and its socket and lock file are removed (nothing is left for
 * gpuipc_runtime_prune). Returns 0, or -EINVAL for NULL. No other call on @dom may be running or
 * follow.
 */
GPUIPC_API int gpuipc_domain_leave(gpuipc_domain_t *dom);

/*
 * gpuipc_domain_name_check - whether @name is a valid domain (or segment)
 * name. Returns 0, or -EINVAL with a sentence giving the rule.
 */
GPUIPC_API int gpuipc_domain_name_check(const char *name);

/* One domain of the runtime directory (gpuipc_domain_names). */
typedef struct gpuipc_domain_entry {
  /*
   * Set by the caller to sizeof(*entry), or the size of an earlier
   * version: only the first @size bytes are written.
   */
  size_t size;
  char name[GPUIPC_NAME_MAX + 1];
  int live; /* 1: a broker answers; 0: a socket left by a broker that died */
} gpuipc_domain_entry_t;

/*
 * gpuipc_domain_names - the domains of the runtime directory, sorted by
 * name, in @out[0..cap), without joining any (a broker that answers sees a
 * connection open and close) and creating nothing. Each out[i].size must
 * be set by the caller, all to the same value (as gpuipc_segment_list);
 * @cap may be 0 and @out NULL to count.
 * Returns how many domains there are (which may exceed @cap: only the
 * first @cap are filled); -EINVAL for a negative @cap, a NULL @out with
 * @cap > 0 or sizes that differ or are too small; -ENOENT when the runtime
 * directory does not exist; GPUIPC_E_DENIED when it is unsafe (as
 * gpuipc_runtime_dir); -ENOMEM; -errno when it cannot be read.
 * Thread-safe.
 */
GPUIPC_API int gpuipc_domain_names(gpuipc_domain_entry_t *out, int cap);

typedef struct gpuipc_domain_info {
  /*
   * Set by the caller to sizeof(*info), or the size of an earlier version:
   * only the first @size bytes are written (below sizeof(size_t): -EINVAL).
   */
  size_t size;
  char name[GPUIPC_NAME_MAX + 1];
  int broker_pid;                  /* process hosting the broker */
  int hosts_broker;                /* 1 when this very member hosts it */
  uint64_t epoch;                  /* random identity kept across failovers */
  int members;                     /* connections to the broker */
  int segments;                    /* registry entries, every state */
  int broker_fds;                  /* segment descriptors the broker holds */
} gpuipc_domain_info_t;

/*
 * gpuipc_domain_info - ask the broker about the domain.
 * Returns 0; -EINVAL (NULL argument, @out->size below sizeof(size_t));
 * -ETIMEDOUT or GPUIPC_E_PEER_GONE when the broker did not answer.
 * Thread-safe.
 */
GPUIPC_API int gpuipc_domain_info(gpuipc_domain_t *dom,
                                  gpuipc_domain_info_t *out);

/* ------------------------------------------------------------------------ */
/* Named segments                                                           */
/* ------------------------------------------------------------------------ */

/* gpuipc_segment_opts_t.flags. */
#define GPUIPC_CREATE 0x1u  /* allocate if the name is free, else open it */
#define GPUIPC_EXCL 0x2u    /* with CREATE: fail with -EEXIST if it exists */
#define GPUIPC_WAIT 0x4u    /* wait until someone publishes the name */
#define GPUIPC_SCRATCH 0x8u /* with CREATE: published at once, contents
                               undefined (no gpuipc_segment_publish) */
#define GPUIPC_UNPINNED 0x10u /* HOST: mapped without registering it with
                                 CUDA (GPUIPC_BUF_UNPINNED) */

typedef struct gpuipc_segment_opts {
  /*
   * sizeof(gpuipc_segment_opts_t), or the size of an earlier version of
   * this struct: the library reads only the first @size bytes and takes
   * the default of every field beyond them.
   */
  size_t size;
  size_t bytes;        /* segment size; 0: whatever it has (default 0) */
  gpuipc_kind_t kind;  /* what a creator allocates (default AUTO) */
  int device;          /* local CUDA ordinal, -1: see below (default -1) */
  unsigned flags;      /* GPUIPC_CREATE, _EXCL, _WAIT, _SCRATCH, _UNPINNED
                          (default 0) */
  /*
   * How long to wait for a publication (GPUIPC_WAIT, or CREATE finding
   * the name being filled) and for the broker: milliseconds, 0 (do not
   * wait), GPUIPC_TIMEOUT_FOREVER or GPUIPC_TIMEOUT_DEFAULT (default).
   */
  int timeout_ms;
  /*
   * The opener's stream (CUstream / cudaStream_t; NULL: the legacy default
   * stream of the segment's device): work queued on it after the open
   * runs after the creator's writes that gpuipc_segment_publish ordered
   * (GPU kinds; default NULL).
   */
  void *stream;
  /*
   * With GPUIPC_CREATE: publish this buffer under the name instead of
   * allocating one (memory that is already written, e.g. tensors born in
   * gpuipc memory): see gpuipc_segment_open (default NULL).
   */
  gpuipc_buf_t *buf;
} gpuipc_segment_opts_t;

/* Every field at its default. */
#define GPUIPC_SEGMENT_OPTS_INIT                                               \
  {sizeof(gpuipc_segment_opts_t), 0, GPUIPC_KIND_AUTO, -1, 0,                  \
   GPUIPC_TIMEOUT_DEFAULT, NULL, NULL}

/*
 * gpuipc_segment_open - open the segment @name in @dom, as a buffer.
 * @opts: NULL opens an existing published segment with every default.
 *   bytes: 0 opens an existing segment at whatever size it has (not with
 *        CREATE). Otherwise an existing segment must have exactly this
 *        size (GPUIPC_E_MISMATCH, the sentence gives both).
 *   kind: the kind a creator allocates; an existing segment of another
 *        kind is GPUIPC_E_MISMATCH (AUTO matches any).
 *   device: local CUDA ordinal: the GPU a creator allocates on, and the one
 *        that maps an existing segment; -1 maps it on the segment's own GPU
 *        (found by UUID), and makes a creator of kind AUTO allocate HOST.
 *   flags: GPUIPC_CREATE: allocate if the name is free, else open it; if
 *        another process is creating (filling) it, wait until it publishes
 *        (and take over if it dies first). A segment this call allocates
 *        is *filling*: nobody else can open it until the caller has
 *        written it and called gpuipc_segment_publish. With
 *        GPUIPC_SCRATCH it is published at once instead, contents
 *        undefined. GPUIPC_CREATE | GPUIPC_EXCL: fail with -EEXIST if the
 *        name exists or is being filled. GPUIPC_WAIT: wait until the name
 *        is published. Neither: the segment must be published (-ENOENT).
 *        GPUIPC_UNPINNED, with any of them: a HOST segment mapped anew is
 *        not registered with CUDA in this process (GPUIPC_BUF_UNPINNED;
 *        for data no GPU reads: registering waits for the GPU's queued
 *        work, and so does undoing it at the last release).
 *   timeout_ms: see gpuipc_segment_opts_t (-ETIMEDOUT when it passes).
 *   stream: an opener that gets a published segment of a GPU kind makes
 *        this stream wait (without blocking the host) for the writes its
 *        creator ordered before gpuipc_segment_publish.
 *   buf: with GPUIPC_CREATE, the memory of the new segment: a buffer this
 *        process allocated (gpuipc_buf_alloc; not an imported one; it may
 *        be a segment under other names already, each name then keeps it).
 *        No copy is made: openers map these very bytes,
 *        and see what this process writes into them later. GPUIPC_EXCL is
 *        implied (-EEXIST: the name exists or is being filled; @buf is
 *        left as it was). bytes must be 0 or the buffer's size, kind AUTO
 *        or its kind, device -1 or its device. *@out is a handle of its
 *        own on @buf's memory (the same pointer, size, kind and device;
 *        it holds a reference on @buf): releasing it lets go of the
 *        segment at once -- the broker no longer counts this process, and
 *        an unlinked segment nobody else holds goes with its descriptor --
 *        while @buf stays the caller's, so one buffer may be lent again and
 *        again. Give gpuipc_segment_publish this handle, not @buf. Filling
 *        and publishing go as for memory the call allocates
 *        (GPUIPC_SCRATCH: published at once). Lifetime as for the kind:
 *        HOST and VMM memory then outlives every reference of this process
 *        while another process holds the segment; LEGACY and POOL memory
 *        is kept by the released handle (and @buf with it) as below.
 * @out: the buffer with one reference; release it with gpuipc_buf_release.
 *        Opening a segment this process already holds returns the same
 *        buffer (one mapping, one more reference); a segment this process
 *        lent (opts->buf) comes as a handle of its own on the lent memory,
 *        as the lend's does.
 * Lifetime (docs/segment-lifetime.md tells it all). HOST and VMM memory
 * outlives its creator until the segment is unlinked and released by all.
 * LEGACY, POOL and fabric memory lives in its creator, which keeps it after
 * its own last release until the segment is unlinked and held by nobody;
 * when the creator leaves or exits, new opens get GPUIPC_E_LOST. A creator
 * that goes before publishing frees the name for the next CREATE opener.
 * Returns 0; -EINVAL (NULL argument, bad name — the sentence gives the
 * rule —, opts->size below sizeof(size_t), unknown flags or kind, EXCL or
 * SCRATCH without CREATE, CREATE with bytes 0, a bad timeout; buf without
 * CREATE, imported, or of another size, kind or device than asked);
 * -EFBIG;
 * -ENOENT; -EEXIST; -ETIMEDOUT; GPUIPC_E_MISMATCH; GPUIPC_E_LOST (the
 * broker failed over and no surviving process held the segment);
 * GPUIPC_E_PEER_GONE / -ETIMEDOUT when no broker could be reached; what
 * gpuipc_buf_alloc, gpuipc_buf_import and (GPU kinds, the stream's wait)
 * gpuipc_event_import / gpuipc_event_wait return. The broker refuses a
 * publication whose descriptor cannot be the memory its handle describes
 * (GPUIPC_E_BADHANDLE; HOST: a memfd sealed as gpuipc seals its own, of
 * the handle's size; VMM, POOL: a descriptor of the NVIDIA driver), and
 * one of memory its creator holds (LEGACY, fabric, POOL) from another
 * process (GPUIPC_E_DENIED); the name is free again for whoever waits.
 * Thread-safe: many threads may open segments of one domain at once.
 */
GPUIPC_API int gpuipc_segment_open(gpuipc_domain_t *dom, const char *name,
                                   const gpuipc_segment_opts_t *opts,
                                   gpuipc_buf_t **out);

/*
 * gpuipc_segment_publish - make segment buffer @seg, which this process
 * opened with GPUIPC_CREATE (without GPUIPC_SCRATCH) and allocated or lent
 * (for a lent buffer: the handle gpuipc_segment_open gave), visible
 * to other openers, ordered after the writes queued on @stream so far
 * (CUstream / cudaStream_t; NULL: the legacy default stream). GPU kinds
 * (VMM, LEGACY, POOL): an interprocess event is recorded on @stream and
 * travels with the publication; an opener's stream waits for it, the host
 * of neither side blocks. A @stream with no work pending (its writes are
 * done) needs none, and none is made. HOST: @stream, if not NULL, is
 * synchronised first; with NULL, the caller's CPU writes are done when it
 * calls this.
 * Returns 0; -EINVAL (NULL @seg, or a buffer this process did not create
 * as a segment, such as the lent buffer itself); -EALREADY (published already: by an earlier call, or at
 * once by a GPUIPC_SCRATCH open); -ENOENT (the broker no longer has the reservation, e.g. after
 * a failover that gave the name to another creator); -ETIMEDOUT /
 * GPUIPC_E_PEER_GONE (no broker answered); what gpuipc_event_create /
 * gpuipc_event_record return; GPUIPC_E_CUDA. Thread-safe.
 */
GPUIPC_API int gpuipc_segment_publish(gpuipc_buf_t *seg, void *stream);

/*
 * gpuipc_segment_unlink - remove @name from the domain, like shm_unlink:
 * the name is free at once (a later CREATE makes a new segment); the memory
 * goes when its last holder releases it -- for memory its creator keeps
 * (LEGACY, POOL), the creator frees it then, told by the broker, even if it
 * released its own references long before (see gpuipc_segment_open).
 * If the broker dies during the call, the request goes to its successor;
 * when the first attempt may have reached the dead broker, a name found
 * gone by the retry counts as unlinked (0), not -ENOENT.
 * Returns 0; -EINVAL (bad argument); -ENOENT (no such segment, or one still
 * being created or filled); -ETIMEDOUT / GPUIPC_E_PEER_GONE. Thread-safe.
 */
GPUIPC_API int gpuipc_segment_unlink(gpuipc_domain_t *dom, const char *name);

typedef enum gpuipc_segment_state {
  GPUIPC_SEG_CREATING = 1,  /* reserved by a creator, not published yet */
  GPUIPC_SEG_PUBLISHED = 2,
  GPUIPC_SEG_UNLINKED = 3,  /* nameless, alive while holders hold it */
  GPUIPC_SEG_LOST = 4,      /* gone in a broker crash: only its name left */
  GPUIPC_SEG_FILLING = 5,   /* allocated, its creator has not published it */
} gpuipc_segment_state_t;

/* gpuipc_segment_state_name - "creating", "filling", "published", ... or
 * "?". */
GPUIPC_API const char *gpuipc_segment_state_name(gpuipc_segment_state_t st);

#define GPUIPC_SEGMENT_HOLDERS 16

typedef struct gpuipc_segment_info {
  /*
   * Set by the caller to sizeof(*info), or the size of an earlier version:
   * only the first @size bytes are written (below sizeof(size_t): -EINVAL).
   */
  size_t size;
  char name[GPUIPC_NAME_MAX + 1];
  uint64_t id;                     /* never reused in the domain */
  uint64_t bytes;                  /* the size its creator asked for */
  gpuipc_kind_t kind;
  uint8_t device_uuid[16];         /* all zero for HOST */
  gpuipc_segment_state_t state;
  int broker_fd;                   /* 1: the broker holds its descriptor */
  int nholders;                    /* processes holding it */
  int holder_pids[GPUIPC_SEGMENT_HOLDERS];  /* the first nholders of them */
  int holder_refs[GPUIPC_SEGMENT_HOLDERS];  /* opens each holder counts */
  int creator_held;  /* 1: its memory lives in its creator (LEGACY, POOL) */
  int keeper_pid;    /* the creator keeping that memory now, or 0 */
} gpuipc_segment_info_t;

/*
 * gpuipc_segment_list - describe the domain's segments (every state, in id
 * order) in @out[0..cap). Each out[i].size must be set by the caller, all
 * to the same value, which is also how far apart the elements lie (an
 * earlier, smaller version of the struct works; -EINVAL when they differ).
 * cap may be 0 and @out NULL to count.
 * Returns the number of segments in the registry (which may exceed @cap:
 * only the first @cap are filled); -EINVAL; -ETIMEDOUT /
 * GPUIPC_E_PEER_GONE. The listing is gathered in pages: segments that come
 * and go meanwhile may or may not appear. Thread-safe.
 */
GPUIPC_API int gpuipc_segment_list(gpuipc_domain_t *dom,
                                  gpuipc_segment_info_t *out, int cap);

/*
 * gpuipc_segment_stat - describe segment @name (reachable by name: creating,
 * filling, published or lost) in @out (out->size set by the caller).
 * Returns 0; -ENOENT; -EINVAL; -ETIMEDOUT / GPUIPC_E_PEER_GONE.
 */
GPUIPC_API int gpuipc_segment_stat(gpuipc_domain_t *dom, const char *name,
                                   gpuipc_segment_info_t *out);

/* ------------------------------------------------------------------------ */
/* Readers that share the copying                                           */
/* ------------------------------------------------------------------------ */

/*
 * Readers of one published set of bytes share the copying: each chunk
 * leaves the publisher's memory about once (copied by the member that
 * claimed it), and the others copy it from that member's destination.
 * docs/shared-copy.md tells the protocol and what is not built yet.
 */

/* One run of bytes to copy: @bytes from @src at @src_off (the publisher's
 * memory: a segment buffer this process opened) to @dst at @dst_off (where
 * this process wants them). */
typedef struct gpuipc_share_extent {
  gpuipc_buf_t *src;
  size_t src_off;
  gpuipc_buf_t *dst;
  size_t dst_off;
  size_t bytes;
} gpuipc_share_extent_t;

typedef struct gpuipc_share_opts {
  /*
   * sizeof(gpuipc_share_opts_t), or the size of an earlier version of this
   * struct: the library reads only the first @size bytes and takes the
   * default of every field beyond them.
   */
  size_t size;
  /* Bytes a chunk: a multiple of 4096; 0: 64 MiB (default 0). An extent
   * is cut into chunks of this size (its last one shorter); a chunk never
   * spans extents; a call has at most 65536 chunks (-EINVAL beyond). */
  size_t chunk_bytes;
  /*
   * How long a member waits for a chunk another member claimed before it
   * takes the claim over and copies the chunk from the publisher (and how
   * long a member that has every chunk stays for peers still copying,
   * and a leaving one waits for copies from its memory; a member waits
   * on the member before it in the chain 50 ms at most, or this when
   * shorter): milliseconds (0: no waiting for any peer),
   * GPUIPC_TIMEOUT_FOREVER, or GPUIPC_TIMEOUT_DEFAULT (the domain's
   * timeout; default).
   */
  int timeout_ms;
  unsigned flags; /* none yet: 0 */
  /* Where not NULL: what the call did, filled in before it returns
   * (whatever it returns, once its arguments were taken; default NULL). */
  struct gpuipc_share_stats *stats;
  /*
   * Where not NULL: the round the caller's next call will copy (a state
   * dict's next version), a name as @round takes. After the call, a
   * thread of the library lets go of this round's table and opens (or
   * creates) that round's for the same layout and device, so that the
   * next call under that name finds it mapped (opening one takes a
   * request to the broker and a registration with CUDA: about 1--2 ms).
   * One not taken within 8 calls of the process goes, as at
   * gpuipc_domain_leave. Default NULL.
   */
  const char *next_round;
  /*
   * sizeof(*stats) as the caller knows it (GPUIPC_SHARE_OPTS_INIT sets
   * it): the library fills only that many bytes of @stats. 0 (and an
   * @opts too old to have this field): the first version's size, up to
   * passed_over. Below that, or not a size of one of its versions:
   * -EINVAL.
   */
  size_t stats_size;
} gpuipc_share_opts_t;

/* What one gpuipc_share_copy did. */
typedef struct gpuipc_share_stats {
  int joined;              /* 1: a member of the round; 0: it copied alone */
  int server;              /* 1: it lent its destinations: others could copy
                              from it */
  uint64_t chunks;         /* the chunks its extents were cut into */
  uint64_t from_publisher; /* chunks it copied from the publisher */
  uint64_t from_peers;     /* chunks it copied from other members */
  uint64_t taken_over;     /* stale claims of others it took over */
  uint64_t passed_over;    /* members it meant to copy from that fell behind
                              or could not serve a chunk: it went on from
                              the next one up the chain, or the publisher */
  /* The fields below are filled where opts->stats_size reaches them. */
  uint64_t recopied;       /* chunks it copied again from the publisher: the
                              member it had them from died before they had
                              landed (they count in from_peers too) */
  int lent;                /* destination buffers it lent anew (the others
                              were kept lent from an earlier call) */
  int opened;              /* peers' lent segments it mapped anew */
  int ahead;               /* 1: it found the round's table opened ahead
                              (opts->next_round of an earlier call) */
} gpuipc_share_stats_t;

/* Every field at its default. */
#define GPUIPC_SHARE_OPTS_INIT                                                 \
  {sizeof(gpuipc_share_opts_t), 0, GPUIPC_TIMEOUT_DEFAULT, 0, NULL, NULL,     \
   sizeof(gpuipc_share_stats_t)}

/* The longest round name gpuipc_share_copy takes (its table's name adds
 * ".share" to it). */
#define GPUIPC_SHARE_ROUND_MAX 48

/*
 * gpuipc_share_copy - copy the @n extents @ext into this process's
 * destinations, sharing the copying with every process that calls it with
 * the same @round name and the same layout (the extents' byte counts and
 * source offsets, and the chunk size) at the same time: the *members* of
 * the round.
 * @dom: the domain the round's segments live in.
 * @round: a segment name of at most GPUIPC_SHARE_ROUND_MAX characters that
 *        names the bytes copied (e.g. a state dict and its version): two
 *        calls with one name and one layout take each other's chunks as
 *        the same bytes. The round table is the HOST segment
 *        "<round>.share" (created by the first member with GPUIPC_CREATE |
 *        GPUIPC_SCRATCH); the last member out unlinks it, so the name can
 *        be used again once a round is over (a new round then begins).
 *        Each member lends its destination buffers as segments
 *        "gpuipc-share.<pid>.<n>" and keeps them lent across calls
 *        (standing lends), as it keeps mapped the peers' lent segments it
 *        opened: a lend goes once the caller released its buffer (a
 *        thread of the library unlinks it and frees the memory right
 *        after the caller's last gpuipc_buf_release; a call in progress
 *        that uses it lets go of it at its end), after 8 calls unused,
 *        and at gpuipc_domain_leave; a peer's segment once its lender is
 *        gone or it went unused for 8 calls, and at leave.
 * @ext, @n: 1 to 4096 extents; destinations must not overlap; every
 *        destination on one device (or all HOST), and every GPU source
 *        mapped for that device (gpuipc_segment_open with opts.device:
 *        its streams read them; else GPUIPC_E_CUDA from the copies). An
 *        extent of 0 bytes is allowed and copies nothing.
 * @stream: GPU kinds: the copies and the words the protocol writes are
 *        queued on this stream (CUstream; NULL: the legacy default
 *        stream): work queued on it later sees the bytes. Before the
 *        call returns, the host waits until the work it queued there has
 *        completed (it then lets go of the peers' memory it copied from
 *        and of the table the stream writes into; this first version
 *        blocks the host for as long as its copies take). HOST (every
 *        source and destination HOST): ignored; the CPU copies, and the
 *        bytes are in place when the call returns.
 * @opts: NULL for the defaults; see gpuipc_share_opts_t.
 * The members form a chain in the order they joined: each copies the
 * chunks in order from the member before it, once that one's prefix word
 * says they are there; the first (the head) claims each chunk
 * (compare-and-swap in the table), copies it from the publisher, then
 * marks it done. Each byte leaves the publisher once and enters each
 * member once. A member passes over the one before it when that one
 * makes no progress for 50 ms or cannot serve a chunk (it then copies
 * from the next one up the chain, or heads it). A member that has every
 * chunk stays, serving, until every other live member has its chunks too
 * (at most the timeout). A claim whose member died or left is taken over
 * at once; one that shows no done word within the timeout is taken over
 * then, and its member marked FAILED if it did no work meanwhile (its own
 * call then fails).
 * Who copies alone from the publisher, with no table: a process whose
 * layout differs from the table's, a 65th member, a GPU destination on the
 * publisher's own GPU, a call that finds the round over (the last member
 * left while it joined). A member whose destination cannot be lent (an
 * imported buffer, memory gpuipc did not allocate) claims nothing and
 * serves nobody: it copies from the last member of the chain that serves,
 * or from the publisher when none does. No member reads outside what it mapped, whatever a peer
 * writes into the table; a peer that writes into others' destinations
 * (same uid, same memory) is beyond any check.
 * Returns 0 once every byte is in; -EINVAL (NULL
 * @dom, @round or @ext, a bad or too long round name, @n out of range, an
 * extent past its source or destination buffer, overlapping
 * destinations, destinations on several devices, opts->size below
 * sizeof(size_t), a chunk_bytes that is not a multiple of 4096 or cuts
 * the extents into more than 65536 chunks, unknown
 * flags, a bad timeout, a bad or too long opts->next_round) before
 * anything is created; -ETIMEDOUT when a peer
 * marked this member FAILED (it stalled past the timeout holding claims,
 * or stalled while a leaving member waited for it; the sentence names the
 * chunks it held), or (GPU kinds) the work it queued on @stream did not
 * complete within the timeout; -ENOMEM; what the copies return
 * (GPUIPC_E_CUDA).
 * Failures to join (another layout, a full or closed table, a broker that
 * does not answer) are no error: the call then copies alone.
 * Thread-safe; one thread's calls are one member each.
 */
GPUIPC_API int gpuipc_share_copy(gpuipc_domain_t *dom, const char *round,
                                 const gpuipc_share_extent_t *ext, int n,
                                 void *stream,
                                 const gpuipc_share_opts_t *opts);

/*
 * gpuipc_segment_copy_shared - gpuipc_share_copy of one extent: @bytes of
 * segment @seg (opened through @dom) at @src_off into @dst at @dst_off. The
 * round is named after the segment's id in the domain (never reused, so a
 * segment published again is a new round) and @src_off.
 * Returns what gpuipc_share_copy returns; -EINVAL also when @seg is not a
 * segment this process holds through @dom.
 */
GPUIPC_API int gpuipc_segment_copy_shared(gpuipc_domain_t *dom,
                                          gpuipc_buf_t *seg, size_t src_off,
                                          gpuipc_buf_t *dst, size_t dst_off,
                                          size_t bytes, void *stream,
                                          const gpuipc_share_opts_t *opts);

/* ------------------------------------------------------------------------ */
/* Tensors (DLPack layout)                                                  */
/* ------------------------------------------------------------------------ */

/*
 * These structs are laid out exactly as DLPack's (dlpack.h, ABI of v0.8 and
 * v1.x, on LP64): gpuipc_dl_device_t is DLDevice, gpuipc_dl_dtype_t is
 * DLDataType, gpuipc_dl_tensor_t is DLTensor, gpuipc_dl_managed_tensor_t is
 * DLManagedTensor and gpuipc_dl_managed_tensor_versioned_t is
 * DLManagedTensorVersioned, so that a pointer to one can be handed to code
 * that expects the other (PyTorch, CuPy, JAX through their from_dlpack).
 */

/* DLDeviceType values gpuipc produces or accepts. */
#define GPUIPC_DL_CPU 1       /* kDLCPU */
#define GPUIPC_DL_CUDA 2      /* kDLCUDA */
#define GPUIPC_DL_CUDA_HOST 3 /* kDLCUDAHost: pinned host memory */

/* DLDataTypeCode values gpuipc accepts. */
#define GPUIPC_DL_INT 0
#define GPUIPC_DL_UINT 1
#define GPUIPC_DL_FLOAT 2
#define GPUIPC_DL_BFLOAT 4
#define GPUIPC_DL_COMPLEX 5
#define GPUIPC_DL_BOOL 6
/* The 8-bit float formats of DLPack 1.1, codes 7 (e3m4) to 14 (e8m0fnu). */
#define GPUIPC_DL_FLOAT8_FIRST 7
#define GPUIPC_DL_FLOAT8_LAST 14

typedef struct gpuipc_dl_device {
  int32_t device_type; /* GPUIPC_DL_* device type */
  int32_t device_id;   /* local CUDA ordinal for GPUIPC_DL_CUDA, else 0 */
} gpuipc_dl_device_t;

typedef struct gpuipc_dl_dtype {
  uint8_t code;   /* GPUIPC_DL_INT ... */
  uint8_t bits;   /* bits of one lane */
  uint16_t lanes; /* 1 for scalars */
} gpuipc_dl_dtype_t;

typedef struct gpuipc_dl_tensor {
  void *data;                /* base pointer */
  gpuipc_dl_device_t device;
  int32_t ndim;              /* 0 .. GPUIPC_TENSOR_MAX_DIMS for gpuipc */
  gpuipc_dl_dtype_t dtype;
  int64_t *shape;            /* ndim extents */
  int64_t *strides;          /* ndim strides in elements; NULL: row-major */
  uint64_t byte_offset;      /* first element at (char *)data + byte_offset */
} gpuipc_dl_tensor_t;

typedef struct gpuipc_dl_managed_tensor {
  gpuipc_dl_tensor_t dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct gpuipc_dl_managed_tensor *self);
} gpuipc_dl_managed_tensor_t;

typedef struct gpuipc_dl_version {
  uint32_t major; /* 1 */
  uint32_t minor;
} gpuipc_dl_version_t;

typedef struct gpuipc_dl_managed_tensor_versioned {
  gpuipc_dl_version_t version;
  void *manager_ctx;
  void (*deleter)(struct gpuipc_dl_managed_tensor_versioned *self);
  uint64_t flags; /* DLPACK_FLAG_BITMASK_*: 0 (writable, not a copy) */
  gpuipc_dl_tensor_t dl_tensor;
} gpuipc_dl_managed_tensor_versioned_t;

/* The most dimensions a tensor sent through a channel may have. */
#define GPUIPC_TENSOR_MAX_DIMS 8

/*
 * A tensor as gpuipc sends and receives it: DLPack's fields, and the buffer
 * that holds the data.
 * @buf: the gpuipc buffer the bytes lie in (dl.data + dl.byte_offset and
 *       every element reachable through shape and strides must lie inside
 *       it; gpuipc_buf_find finds it by address), sent without copying; or
 *       NULL for memory gpuipc did not allocate, which is copied ("staged")
 *       into slots of a buffer of the channel's own and never exported
 *       itself.
 * Received views have @buf set to the buffer as mapped in the receiver.
 */
typedef struct gpuipc_tensor {
  gpuipc_dl_tensor_t dl;
  gpuipc_buf_t *buf;
} gpuipc_tensor_t;

/*
 * gpuipc_tensor_nbytes - bytes of one element times the number of
 * elements of @t (0 for NULL or an invalid dtype).
 */
GPUIPC_API uint64_t gpuipc_tensor_nbytes(const gpuipc_tensor_t *t);

/* Where a tensor's bytes lie (gpuipc_tensor_layout). */
typedef struct gpuipc_tensor_layout {
  size_t size;      /* set by the caller to sizeof(gpuipc_tensor_layout_t) */
  /* Offset of the lowest byte an element reaches: from the buffer's start
   * when t->buf is set, else from t->dl.data. */
  uint64_t first;
  /* Bytes from @first to one past the highest byte reached (0 when a
   * dimension has extent 0); gaps between strided elements included. */
  uint64_t span;
  uint64_t nbytes;  /* gpuipc_tensor_nbytes */
  int contiguous;   /* 1: row-major without gaps (strides NULL or compact) */
} gpuipc_tensor_layout_t;

/*
 * gpuipc_tensor_layout - check @t as gpuipc_channel_send checks a tensor's layout
 * (dimensions, dtype, extents, strides, byte offset, and with t->buf the
 * data pointer and every element inside the buffer; without t->buf no
 * element before t->dl.data) and say where its bytes lie in @out, for
 * code that moves tensors by other means than a channel. It does not
 * require contiguity (gpuipc_channel_send does, for t->buf NULL: @out says).
 * Returns 0; -EINVAL with a sentence naming the field.
 */
GPUIPC_API int gpuipc_tensor_layout(const gpuipc_tensor_t *t,
                                    gpuipc_tensor_layout_t *out);

/* ------------------------------------------------------------------------ */
/* Channels                                                                 */
/* ------------------------------------------------------------------------ */

/*
 * A channel is an ordered, two-way pipe for tensors between two processes
 * of a domain: gpuipc_channel_send hands the receiver a view of the
 * sender's buffer (gpuipc_channel_recv, given back by
 * gpuipc_tensor_release), or gpuipc_channel_recv_into copies it. Messages
 * are ordered after the sender's stream work, never dropped or reordered;
 * each end has at most `depth` in flight; a peer that dies or closes its
 * end makes the calls that need it return GPUIPC_E_PEER_GONE once what it
 * sent has been received.
 *
 * Thread safety: the send side (gpuipc_channel_send, _send_done, _send_wait,
 * _progress) and the receive side (gpuipc_channel_recv, _recv_into) each
 * take a lock of their own, so one thread may send while another receives;
 * gpuipc_tensor_release may be called from any thread.
 *
 * docs/channels.md tells how a channel orders, bounds and gives back what
 * it carries. A send waiting for room (or a ticket waiting) does not
 * hold the send lock while it sleeps: another thread's NONBLOCK send or
 * gpuipc_channel_progress returns meanwhile.
 */
typedef struct gpuipc_channel gpuipc_channel_t;

/* Channel names: 1 to GPUIPC_CHANNEL_NAME_MAX characters of a domain name. */
#define GPUIPC_CHANNEL_NAME_MAX 58
/* The most messages one end may have in flight. */
#define GPUIPC_CHANNEL_DEPTH_MAX 1024
/* The most blocks one block batch holds (gpuipc_channel_send_blocks). */
#define GPUIPC_CHANNEL_BLOCKS_MAX 16384
/* The most distinct buffers the blocks of one batch lie in. */
#define GPUIPC_CHANNEL_BLOCK_BUFS_MAX 128

typedef struct gpuipc_channel_opts {
  /* sizeof(gpuipc_channel_opts_t), or the size of an earlier version: only
   * the first @size bytes are read, the fields beyond take their defaults. */
  size_t size;
  unsigned flags;    /* reserved, 0 */
  /* How long gpuipc_channel_open waits for the other end, including while
   * it still creates the channel's segment ("Timeouts"):
   * milliseconds, 0 (pair only with an end already waiting),
   * GPUIPC_TIMEOUT_FOREVER or GPUIPC_TIMEOUT_DEFAULT (default). */
  int timeout_ms;
  /* Messages this end may have in flight: a power of two, 1 ..
   * GPUIPC_CHANNEL_DEPTH_MAX; 0: 64. */
  uint32_t depth;
  /* Local CUDA ordinal that reads received GPU tensors (they are mapped
   * for it, across NVLink when it is another GPU); -1 (or 0 with
   * device_set 0): each tensor's own GPU. */
  int device;
  int device_set;    /* 1: @device is meant (so that 0 can be chosen) */
  /* How long gpuipc_channel_send waits for room (flow control: a release
   * of a message in flight, or a free staging slot) before -ETIMEDOUT
   * ("Timeouts"): milliseconds, 0 (-EAGAIN at once, as
   * GPUIPC_SEND_NONBLOCK), GPUIPC_TIMEOUT_FOREVER or
   * GPUIPC_TIMEOUT_DEFAULT (default: the domain's timeout, as every other
   * wait; a sender that must wait for a slow receiver as long as it takes
   * says GPUIPC_TIMEOUT_FOREVER). */
  int send_timeout_ms;
  /* Staging of memory gpuipc did not allocate: slots (1..64; 0: 4) of
   * stage_slot_bytes (0: 4 MiB) each, per device, allocated on first use.
   * A larger tensor is staged in a buffer of its own (a large stage, its
   * size rounded up to 2 MiB), kept for later sends: at most stage_slots
   * of them per device. */
  uint32_t stage_slots;
  size_t stage_slot_bytes;
  /* Bytes of large stages kept per device (0: 1 GiB). A tensor larger
   * than that still goes: it gets a stage of its own size, freed again when
   * another large send needs the room. */
  size_t stage_large_bytes;
} gpuipc_channel_opts_t;

/* Every field at its default (a zeroed struct does not wait: see the
 * timeouts). */
#define GPUIPC_CHANNEL_OPTS_INIT                                               \
  {sizeof(gpuipc_channel_opts_t), 0, GPUIPC_TIMEOUT_DEFAULT, 0, -1, 0,         \
   GPUIPC_TIMEOUT_DEFAULT, 0, 0, 0}

/*
 * gpuipc_channel_open - meet the other end of channel @name in @dom.
 * The first two processes (or threads) that open a name are paired; the
 * name is free again as soon as they are, so a third and fourth opener
 * make a channel of their own. The call waits for the other end (see
 * opts->timeout_ms). An opener that died before its peer came is replaced.
 * @opts: optional (NULL: defaults; start from GPUIPC_CHANNEL_OPTS_INIT).
 * @out: the channel, to be closed with gpuipc_channel_close.
 * Returns 0; -EINVAL (NULL argument, bad name or options — opts->size
 * below sizeof(size_t), a timeout below GPUIPC_TIMEOUT_DEFAULT — with a
 * sentence); -ETIMEDOUT (nobody came in time; at once with timeout_ms 0
 * when no end was waiting); GPUIPC_E_PROTO (the peer wrote an impossible
 * ring layout, or its hello carried no non-blocking eventfd);
 * GPUIPC_E_VERSION (the other end is a gpuipc of another channel
 * protocol); GPUIPC_E_PEER_GONE / -errno from the domain or the socket
 * calls.
 */
GPUIPC_API int gpuipc_channel_open(gpuipc_domain_t *dom, const char *name,
                                   const gpuipc_channel_opts_t *opts,
                                   gpuipc_channel_t **out);

/*
 * gpuipc_channel_close - close this end: the peer's calls then return
 * GPUIPC_E_PEER_GONE once it has received what was sent. Views received
 * from @ch stay valid until released (releasing them after the close is
 * allowed). Messages sent and not yet released are abandoned. No other
 * call on @ch may be running or follow.
 * The GPU work behind the events this end handed to the peer (a send's
 * copy or writes before it; a release's reads) must be over before they
 * are destroyed (CUDA leaves a wait on a destroyed event undefined): the
 * call waits for it, up to the domain's timeout or 5 s, whichever is
 * less. The peer then receives what was sent without waiting on this
 * end's events; if the work was not over in time, its receive of such a
 * message (or wait for such a release) fails with GPUIPC_E_PEER_GONE
 * instead. A process that exits without closing gives no such promise.
 * A channel does not survive fork(): in a child made by fork() (without
 * exec), the channel it inherited is its parent's, and closing it frees
 * only the child's copy (its memory and descriptors) and tells the peer
 * nothing: the parent's end stays open and the peer sees no
 * GPUIPC_E_PEER_GONE. The same holds for releasing a view the child
 * inherited (gpuipc_tensor_release). Every other call on the inherited
 * channel returns GPUIPC_E_CLOSED.
 * Returns 0, or -EINVAL for NULL.
 */
GPUIPC_API int gpuipc_channel_close(gpuipc_channel_t *ch);

/* gpuipc_channel_send flags. */
#define GPUIPC_SEND_NONBLOCK 0x1u /* -EAGAIN instead of waiting for room */

/*
 * gpuipc_channel_send - send tensor @t to the other end.
 * @t: the tensor; t->buf NULL stages the bytes (they must be contiguous
 *     and row-major; any size) with one copy (on @stream for device
 *     memory) into the channel's own memory: a staging slot when they fit
 *     one (stage_slot_bytes), else a large stage, a buffer of their size
 *     rounded up to 2 MiB. Device memory of up to GPUIPC_CHAN_COPY_KERNEL_KB
 *     (16 MiB) at a 16-byte aligned address is staged by one launch of
 *     gpuipc's copy kernel, which also writes the message's ready word
 *     (below) once every byte it wrote is visible; the copy engine copies
 *     the rest. A channel keeps what it staged through until it
 *     is closed: stage_slots * stage_slot_bytes, plus up to
 *     stage_large_bytes of large stages (or the largest tensor sent, when
 *     more), per device and for host memory.
 * @stream: CUstream / cudaStream_t of the buffer's device, on which the
 *     sender queued its writes. NULL, CU_STREAM_LEGACY (cudaStreamLegacy)
 *     and CU_STREAM_PER_THREAD (cudaStreamPerThread, the calling thread's)
 *     mean that default stream of the device's primary context, whatever
 *     context is current; in every channel call. The message is ordered
 *     after the writes, unless the stream has nothing pending at that
 *     moment (then nothing needs waiting for): the stream writes the
 *     message's ready word in the channel's shared memory when its work
 *     is done (cuStreamWriteValue64), which the receiver's stream waits
 *     on (cuStreamWaitValue64: no host waits, across GPUs too); where the
 *     device has no 64-bit stream memory operations, or with
 *     GPUIPC_CHAN_READY_WORDS=0, an interprocess event is recorded there
 *     instead. A sender that dies before its stream wrote the word does
 *     not leave the receiver's stream waiting: a thread of the receiving
 *     process writes it when the sender's end hangs up.
 *     Ignored for HOST buffers and staged host memory.
 * @flags: 0 or GPUIPC_SEND_NONBLOCK.
 * @ticket: optional out: the message's number (1, 2, ... per end), for
 *     gpuipc_channel_send_done / gpuipc_channel_send_wait and the release callback.
 * Validation happens before anything is sent: -EINVAL, with a sentence
 * naming the field, for more than GPUIPC_TENSOR_MAX_DIMS dimensions, a
 * negative extent, an unknown or unsupported dtype, strides or byte offset
 * reaching outside the buffer, a data pointer outside it.
 * Flow control: a message is in flight from its send until it is free
 * (gpuipc_channel_send_done), and messages come free in any order: one
 * whose view a receiver keeps holds its own slot of @depth (and its own
 * staging slot or large stage, when staged) and nothing more; later
 * messages released meanwhile are free for new sends. A receiver that
 * holds k views leaves depth - k messages to the sender (fewer staging
 * slots or stages likewise); gpuipc_channel_info names the oldest message
 * in flight (oldest_in_flight), and the sentences of -EAGAIN and
 * -ETIMEDOUT name it too.
 * Returns 0; -EINVAL; -EAGAIN (NONBLOCK, or send_timeout_ms 0, and
 * `depth` messages in flight, or every staging slot, or every large stage
 * that the limits allow, in flight); -ETIMEDOUT (send_timeout_ms passed);
 * -ENOMEM (or the allocator's error) when no large stage of the tensor's
 * size can be allocated: the sentence names the size, nothing was sent
 * and the channel stays usable; GPUIPC_E_PEER_GONE (the peer closed its
 * end, or died: a death without a close is seen by the next wait, or by a
 * send a millisecond or more after the last send that looked; what is
 * sent to a dead peer before that is lost, as it would be just before
 * the death); GPUIPC_E_PROTO (the peer broke the protocol; the channel is
 * unusable); GPUIPC_E_CUDA; GPUIPC_E_CLOSED (the channel was opened before
 * this process was made by fork(): see gpuipc_channel_close).
 */
GPUIPC_API int gpuipc_channel_send(gpuipc_channel_t *ch, const gpuipc_tensor_t *t,
                           void *stream, unsigned flags, uint64_t *ticket);

/*
 * gpuipc_channel_send_done - whether message @ticket's buffer is free again: the
 * receiver released it and its work on it (its copy, or the work before
 * its release) has completed. Whatever became of earlier messages: a
 * later ticket is free while an earlier one is still held. Waits up to @timeout_ms ("Timeouts":
 * milliseconds, 0, GPUIPC_TIMEOUT_FOREVER or GPUIPC_TIMEOUT_DEFAULT, the
 * domain's timeout).
 * Returns 0 when free; -EAGAIN when @timeout_ms is 0 and it is not yet;
 * -ETIMEDOUT; -EINVAL (no such ticket yet, a timeout below
 * GPUIPC_TIMEOUT_DEFAULT); GPUIPC_E_PEER_GONE (the
 * receiver went away without releasing it); GPUIPC_E_PROTO; GPUIPC_E_CUDA;
 * GPUIPC_E_CLOSED (the parent's channel, after fork()).
 */
GPUIPC_API int gpuipc_channel_send_done(gpuipc_channel_t *ch, uint64_t ticket,
                                int timeout_ms);

/*
 * gpuipc_channel_send_wait - wait on the host only until the receiver has released
 * message @ticket, then make @stream (NULL: the legacy default stream of
 * the buffer's device) wait for the receiver's work on it, without
 * blocking the host for that work (one stream memory operation on the
 * release word; an event wait where the receiver's device has none; and
 * nothing when the work is over already). Work queued on @stream
 * afterwards may overwrite the buffer. Where @stream's device cannot wait
 * on a word, the host waits instead, as in gpuipc_channel_send_done.
 * A release word written on the GPU @stream belongs to (the receiver's
 * work runs there too) is polled for up to GPUIPC_CHAN_EVENT_POLL_US
 * first, as gpuipc_channel_recv does; one written from another GPU, with
 * @stream on the GPU the buffer lies on (a block batch's first block's
 * buffer), is waited on by @stream at once and the host returns.
 * Returns as gpuipc_channel_send_done.
 */
GPUIPC_API int gpuipc_channel_send_wait(gpuipc_channel_t *ch, uint64_t ticket,
                                void *stream, int timeout_ms);

/*
 * A release callback: message @ticket was released by the receiver (its
 * GPU work may still be running: gpuipc_channel_send_wait orders after it). Called
 * on the sending side's thread, inside gpuipc_channel_send, gpuipc_channel_send_done,
 * gpuipc_channel_send_wait or gpuipc_channel_progress, with the send lock held: it
 * must not call those functions on the same channel.
 */
typedef void (*gpuipc_release_fn)(gpuipc_channel_t *ch, uint64_t ticket,
                                  void *user);

/* gpuipc_channel_on_release - set (or clear, with NULL) the callback.
 * Returns 0, -EINVAL for a NULL @ch, or GPUIPC_E_CLOSED (the parent's
 * channel, after fork()). */
GPUIPC_API int gpuipc_channel_on_release(gpuipc_channel_t *ch,
                                         gpuipc_release_fn fn, void *user);

/*
 * gpuipc_channel_progress - take in the releases that have arrived and call
 * the callback for each, without waiting. Returns how many were taken in;
 * GPUIPC_E_PROTO; -EINVAL; GPUIPC_E_CLOSED (the parent's channel, after
 * fork()).
 */
GPUIPC_API int gpuipc_channel_progress(gpuipc_channel_t *ch);

/*
 * gpuipc_channel_fd - a descriptor that an event loop (epoll, poll,
 * select, asyncio) waits on, readable when a message or a release may have
 * come, so that one thread serves many channels without blocking calls.
 * The descriptor is the channel's (an epoll fd over this end's eventfd and
 * the channel's socket): the caller only waits on it for readability; it
 * must not read, write or close it. It stays the same for the channel's
 * life and is closed by gpuipc_channel_close (which also takes it out of
 * the caller's epoll sets).
 *
 * Readiness is level-triggered, and precise in one direction only:
 *  - it is readable when first returned;
 *  - once a call of this end found nothing new -- gpuipc_channel_recv or
 *    _recv_into returned -EAGAIN (@timeout_ms 0), gpuipc_channel_progress
 *    returned 0, gpuipc_channel_send_done / _send_wait returned -EAGAIN,
 *    a GPUIPC_SEND_NONBLOCK send returned -EAGAIN -- it becomes readable
 *    when the peer publishes a message or a release after that call (or
 *    published one that was not taken yet), and stays readable until the
 *    next such call finds nothing;
 *  - it is readable for good once the peer closed its end or died (the
 *    channel's calls then return GPUIPC_E_PEER_GONE: drop it from the loop);
 *  - it may be readable with nothing to take (a spurious wake-up), which is
 *    harmless: the calls then return -EAGAIN / 0 and re-arm it.
 * It does not tell when the GPU work of a released buffer completes (a
 * send_done that polls a pending release event keeps returning -EAGAIN).
 * The canonical loop, per channel that epoll_wait reports ready:
 *     while (gpuipc_channel_recv(ch, &v, stream, 0) == 0) use(v);
 *     gpuipc_channel_progress(ch);   (or send_done(ticket, 0))
 * then back to epoll_wait. Both calls must be made, each until it finds
 * nothing: the one descriptor serves both directions.
 * Until the first call an end costs its peer nothing; afterwards the peer
 * pays one atomic exchange and one write(2) per wake-up.
 * Returns the descriptor (>= 0); -EINVAL for NULL; -errno from epoll;
 * GPUIPC_E_CLOSED (the parent's channel, after fork()).
 */
GPUIPC_API int gpuipc_channel_fd(gpuipc_channel_t *ch);

/*
 * gpuipc_channel_recv - receive the next tensor as a view of the sender's buffer
 * (zero-copy). The buffer is imported the first time it arrives and cached
 * for the life of the channel (up to 256 buffers per direction).
 * @view: out: the tensor, valid until gpuipc_tensor_release. Until then
 *     it keeps one of the sender's depth messages in flight (and, when
 *     staged, its staging slot or large stage), and no more: the sender
 *     goes on with the others. view->dl.data
 *     is the buffer's base in this process and view->dl.byte_offset the
 *     tensor's offset in it; strides are always given; view->buf is the
 *     buffer. GPU tensors have device {GPUIPC_DL_CUDA, ordinal that maps
 *     them}, HOST ones {GPUIPC_DL_CPU, 0}.
 * @stream: the stream that will use the view: it is made to wait for the
 *     sender's work (no host wait): on the message's ready word, or its
 *     event (opened on the stream's device). Work that has completed
 *     needs no wait. On the sender's own GPU a pending word or event is
 *     polled for up to GPUIPC_CHAN_EVENT_POLL_US (200 us) first, because
 *     a stream waiting on another process's work on the same GPU waits
 *     for a switch between the two processes' contexts (~140 us on H200);
 *     on another GPU the stream waits at once.
 *     Ignored for HOST buffers.
 * @timeout_ms: "Timeouts": milliseconds, 0 (do not wait),
 *     GPUIPC_TIMEOUT_FOREVER or GPUIPC_TIMEOUT_DEFAULT (the domain's).
 *     A wait spins briefly, then polls yielding the CPU, then sleeps until
 *     the sender wakes it. It polls for twice as long as this end's last
 *     wait for a message took, where that was at most GPUIPC_CHAN_SPIN_US
 *     (2 ms), else for 200 us: a sender at a steady pace finds it awake,
 *     and neither side pays for a wake-up (5 to 20 us). A sender's wait
 *     for a release message (gpuipc_channel_send_done, a blocked send)
 *     follows the same rule; a release whose GPU work is still pending is
 *     polled, yielding, for 2 ms, then in naps of 20 us.
 * Returns 0; -EAGAIN (@timeout_ms 0, nothing there); -ETIMEDOUT; -EINVAL
 * (NULL argument, a timeout below GPUIPC_TIMEOUT_DEFAULT);
 * GPUIPC_E_PEER_GONE (the peer is gone and everything it sent has been
 * received); GPUIPC_E_PROTO (the peer sent a malformed descriptor, with a
 * sentence naming the field; the channel is unusable afterwards);
 * what gpuipc_buf_import returns; GPUIPC_E_CUDA; GPUIPC_E_CLOSED (the
 * parent's channel, after fork(): see gpuipc_channel_close).
 * A buffer new to this end comes over the channel's socket, queued there by
 * the sender before the descriptor that uses it: it is read without
 * waiting (@timeout_ms 0 never waits on the socket either). A
 * descriptor that announces a new buffer whose message is not on the
 * socket is a broken peer: GPUIPC_E_PROTO at once, and for good.
 * A block batch (gpuipc_channel_send_blocks) is refused with -EINVAL, and
 * stays first in line for gpuipc_channel_recv_blocks.
 */
GPUIPC_API int gpuipc_channel_recv(gpuipc_channel_t *ch, gpuipc_tensor_t **view,
                           void *stream, int timeout_ms);

/*
 * gpuipc_channel_recv_into - receive the next tensor by copying it into @dst, on
 * @stream after the sender's work (its ready word or event, as in
 * gpuipc_channel_recv); @stream's GPU, which copies, is granted access to
 * the sender's memory first when the channel mapped it for another GPU
 * (gpuipc_buf_access; GPUIPC_E_UNSUPPORTED when the two GPUs cannot reach
 * each other); the sender's buffer is released when
 * the copy has read it, without host waits (see gpuipc_channel_send_wait).
 * Both tensors must be contiguous (row-major) with the same dtype and
 * shape: otherwise -EINVAL, and the message stays first in line for the
 * next receive. dst->buf may be NULL (any memory: dst->dl.device says
 * where). Copies between two host memories are done at once with memcpy.
 * A copy between GPU memories of up to GPUIPC_CHAN_COPY_KERNEL_KB (16 MiB)
 * within one GPU, or up to 256 KiB from another GPU's memory, whose ends are
 * 16-byte aligned is one launch of gpuipc's copy kernel on @stream, which
 * also releases the buffer (it uses a few of the GPU's
 * multiprocessors while it runs; the driver compiles it on the first such
 * copy of the process, and where it cannot, the copy engine is used);
 * other copies are the copy engine's (cuMemcpyDtoDAsync or cuMemcpyAsync
 * on @stream), the larger ones released by a stream of gpuipc's own that
 * waits for @stream's copy.
 * Returns as gpuipc_channel_recv, and -EINVAL for @dst (a block batch:
 * -EINVAL, and it stays first in line).
 */
GPUIPC_API int gpuipc_channel_recv_into(gpuipc_channel_t *ch,
                                const gpuipc_tensor_t *dst, void *stream,
                                int timeout_ms);

/*
 * A block of a gpuipc buffer: @bytes bytes from byte @offset of @buf.
 */
typedef struct gpuipc_block {
  gpuipc_buf_t *buf; /* a gpuipc buffer: HOST, or a GPU kind */
  uint64_t offset;   /* byte offset in it */
  uint64_t bytes;    /* length: not 0 */
} gpuipc_block_t;

/*
 * gpuipc_channel_send_blocks - send @n blocks as one message (a block
 * batch): one descriptor, one record slot of @depth, one ticket, one
 * release, whatever @n. The blocks are what a paged KV cache moves:
 * hundreds to thousands of blocks scattered in a few large buffers (one
 * per layer, say).
 * @blocks: the blocks, in the order the receiver gets them; each lies in
 *     a gpuipc buffer (memory gpuipc did not allocate is not staged here:
 *     find its buffer with gpuipc_buf_find, or send it with
 *     gpuipc_channel_send). The blocks may lie in up to
 *     GPUIPC_CHANNEL_BLOCK_BUFS_MAX (128) distinct buffers, all HOST or
 *     all of one GPU's memory (one device). Blocks may overlap on this
 *     side.
 * @n: 1 .. GPUIPC_CHANNEL_BLOCKS_MAX (16384).
 * @stream, @flags, @ticket: as gpuipc_channel_send's: the message is
 *     ordered after @stream's work (an event recorded there, unless the
 *     stream has nothing pending); @stream is ignored for HOST blocks.
 * The list of blocks (24 bytes a block, 32 a buffer) travels in host
 * memory of the channel's: up to 32 KiB (1024 blocks in 128 buffers, or
 * about 1300 in one) in a part that belongs to the message's slot of
 * @depth, made at the first batch (depth x 32 KiB); a larger list in a
 * staging slot of the host area (a large stage when it outgrows
 * stage_slot_bytes), shared with staged host sends, which the message
 * holds until it is free: such a send may also wait (or -EAGAIN) for a
 * staging slot. Each
 * buffer new to the receiver is introduced once, as for
 * gpuipc_channel_send. The message holds a reference to every buffer until
 * it is free: gpuipc_channel_send_done, gpuipc_channel_send_wait, the
 * release callback and gpuipc_channel_info treat it as any message.
 * Validation happens before anything is sent or waited for: -EINVAL, with
 * a sentence naming the block, for NULL @ch or @blocks, @n 0 or above
 * GPUIPC_CHANNEL_BLOCKS_MAX, a block with a NULL buffer, of 0 bytes, or
 * reaching outside its buffer (offset + bytes beyond its size, or
 * overflowing), blocks in HOST and GPU memory or on two devices, blocks in
 * more than GPUIPC_CHANNEL_BLOCK_BUFS_MAX buffers, unknown @flags.
 * Returns 0; -EINVAL; -ENOMEM; and what gpuipc_channel_send returns for
 * flow control and failures (-EAGAIN, -ETIMEDOUT, GPUIPC_E_PEER_GONE,
 * GPUIPC_E_PROTO, GPUIPC_E_CUDA, GPUIPC_E_CLOSED; a buffer that cannot
 * be exported: gpuipc_buf_export's error, nothing sent).
 * Thread safety: as gpuipc_channel_send (one sender lock a channel).
 */
GPUIPC_API int gpuipc_channel_send_blocks(gpuipc_channel_t *ch,
                                          const gpuipc_block_t *blocks,
                                          size_t n, void *stream,
                                          unsigned flags, uint64_t *ticket);

/*
 * gpuipc_channel_recv_blocks - receive the next message, a block batch,
 * by copying its block i into @dst[i], on @stream after the sender's work;
 * the message is released once the copies have read it, without host
 * waits (as gpuipc_channel_recv_into).
 * @dst: @n destination blocks in gpuipc buffers (HOST, or one device's
 *     memory: the copies run on that device, @stream one of its streams),
 *     no two sharing a byte; dst[i].bytes must equal the sent block i's.
 * The copies are batched. Between GPU memories: one launch of gpuipc's
 * block kernel on @stream (a thread block a copy, its list of copies in
 * pinned host memory of the channel's; it uses the GPU's multiprocessors
 * while it runs). Where a side is host memory, or no kernel can be
 * launched: one cuMemcpyBatchAsync (CUDA 12.8 and later drivers) on
 * @stream; on the legacy default stream (NULL or
 * CU_STREAM_LEGACY, which that call refuses) on a stream of gpuipc's own
 * that waits for @stream's work and that @stream waits for in turn (two
 * events). Where the driver lacks it: one cuMemcpyAsync a block. Between
 * two host memories the copies are made at once with memcpy.
 * The sender's list is checked strictly when the message is taken: a
 * block outside its buffer as mapped here, a buffer key never sent, a
 * malformed list is GPUIPC_E_PROTO with a sentence, and the channel is
 * unusable afterwards.
 * Returns 0; -EINVAL, with a sentence naming the block, before anything
 * is taken, for NULL @ch or @dst, @n 0 or above GPUIPC_CHANNEL_BLOCKS_MAX,
 * a destination block with a NULL buffer, of 0 bytes, outside its buffer
 * (or overflowing), two that overlap, blocks in HOST and GPU memory or on
 * two devices, a bad @timeout_ms; -EINVAL, the message staying first in
 * line for the next receive, when the next message is not a block batch
 * (receive it with gpuipc_channel_recv or _recv_into; those answer a
 * block batch likewise with -EINVAL, and it stays), when it holds another
 * number of blocks than @n, or when a block's size differs from its
 * destination's; the other returns of gpuipc_channel_recv (-EAGAIN,
 * -ETIMEDOUT, GPUIPC_E_PEER_GONE, GPUIPC_E_PROTO, GPUIPC_E_CUDA,
 * GPUIPC_E_CLOSED); -ENOMEM.
 * Thread safety: as gpuipc_channel_recv (one receiver lock a channel).
 */
GPUIPC_API int gpuipc_channel_recv_blocks(gpuipc_channel_t *ch,
                                          const gpuipc_block_t *dst,
                                          size_t n, void *stream,
                                          int timeout_ms);

/*
 * gpuipc_tensor_release - give a received view back to its sender.
 * @stream: for GPU buffers, the stream whose work so far is the last use of
 *     the view; a stream of the view's device (NULL: the legacy default
 *     stream). Unless it has nothing pending, an event is recorded on it
 *     and a stream of gpuipc's own writes the release word for the sender
 *     once that work is done (@stream itself does not wait for the write;
 *     a device without stream memory operations gets an interprocess event
 *     instead). Ignored for HOST.
 * Views may be released in any order: each release frees that message's
 * slot at the sender (once the work before it is done), whatever views
 * of earlier messages are still held.
 * The view is freed in every case. Returns 0; -EINVAL (NULL or not a
 * view); GPUIPC_E_PEER_GONE (the sender is gone: nothing to tell);
 * GPUIPC_E_CUDA. A view inherited through fork() is the parent's to give
 * back: releasing it in the child frees the child's copy and tells the
 * sender nothing (returns 0).
 */
GPUIPC_API int gpuipc_tensor_release(gpuipc_tensor_t *view, void *stream);

/* DLPack's stream numbers 1 and 2 as CUDA streams (CU_STREAM_LEGACY and
 * CU_STREAM_PER_THREAD have these values): pass them as they come. */
#define GPUIPC_STREAM_LEGACY ((void *)0x1)
#define GPUIPC_STREAM_PER_THREAD ((void *)0x2)

/*
 * gpuipc_tensor_to_dlpack_stream - hand a received view over to a
 * consumer that uses it on @stream, as DLPack's __dlpack__(stream=S) asks,
 * as a DLManagedTensor (gpuipc_tensor_to_dlpack_versioned_stream:
 * DLManagedTensorVersioned, version 1.0). The result owns the view; @view
 * must not be used or released after this.
 * @stream: a stream of the view's device: NULL or GPUIPC_STREAM_LEGACY
 *     (DLPack's None and 1) for its legacy default stream,
 *     GPUIPC_STREAM_PER_THREAD (DLPack's 2; it names the per-thread stream
 *     of whichever thread runs the deleter, so pass a created stream when
 *     that may be another thread), or a CUstream / cudaStream_t. Ignored
 *     for HOST views.
 * The rule, for GPU views:
 *  - hand-over: work queued on @stream after this call sees the data.
 *    When @stream is not the stream the view was received on, it is made
 *    to wait (on the GPU, not the host) for that stream's work so far.
 *  - release: the deleter releases the view on @stream, which orders the
 *    sender's reuse of the buffer after every piece of work queued on
 *    @stream before the deleter ran. The consumer must therefore queue
 *    all its uses of the data on @stream (or make @stream wait for the
 *    other streams that use it) before the deleter runs, and nothing that
 *    touches the data may be queued after it. (PyTorch runs the deleter
 *    when the tensor's last reference goes; a tensor used on another
 *    stream than the one handed over must be kept until that stream's
 *    work is ordered before @stream.)
 * Returns 0; -EINVAL (NULL, or not a received view); GPUIPC_E_CUDA (the
 * wait could not be queued; the view is still the caller's).
 */
GPUIPC_API int gpuipc_tensor_to_dlpack_stream(
    gpuipc_tensor_t *view, void *stream, gpuipc_dl_managed_tensor_t **out);
GPUIPC_API int gpuipc_tensor_to_dlpack_versioned_stream(
    gpuipc_tensor_t *view, void *stream,
    gpuipc_dl_managed_tensor_versioned_t **out);

/*
 * gpuipc_tensor_to_dlpack, gpuipc_tensor_to_dlpack_versioned - the same
 * with @stream NULL: the consumer uses the data on the legacy default
 * stream of the view's device, and the deleter releases it there. A
 * consumer on a non-blocking stream must use the _stream variants, or its
 * reads race with the sender's next writes. Returns as they do.
 */
GPUIPC_API int gpuipc_tensor_to_dlpack(gpuipc_tensor_t *view,
                                       gpuipc_dl_managed_tensor_t **out);
GPUIPC_API int gpuipc_tensor_to_dlpack_versioned(
    gpuipc_tensor_t *view, gpuipc_dl_managed_tensor_versioned_t **out);

/*
 * gpuipc_tensor_from_dlpack - describe DLPack tensor @dl (a DLTensor *) as
 * a gpuipc tensor held by @buf (NULL: memory gpuipc did not allocate, to be
 * staged). @out borrows @dl's shape and strides arrays. Returns 0; -EINVAL.
 */
GPUIPC_API int gpuipc_tensor_from_dlpack(const gpuipc_dl_tensor_t *dl,
                                         gpuipc_buf_t *buf,
                                         gpuipc_tensor_t *out);

typedef struct gpuipc_channel_info {
  /* Set by the caller to sizeof(*info), or the size of an earlier version
   * of this struct: only the first @size bytes are written. */
  size_t size;
  char name[GPUIPC_CHANNEL_NAME_MAX + 1];
  int end;           /* 0: the first opener, 1: the second */
  int peer_pid;
  uint32_t depth;    /* this end's */
  uint32_t peer_depth;
  uint64_t sent;     /* messages sent */
  uint64_t in_flight;   /* sent and not yet free */
  uint64_t received;    /* messages received */
  uint64_t views;       /* received views not yet released */
  uint64_t buffers_sent;     /* buffer handles sent (first sends) */
  uint64_t buffers_imported; /* buffer handles received */
  int peer_gone;
  /* Buffers received and still mapped here for the sender's messages (at
   * most 256: the sender tells this end to forget the ones it no longer
   * uses, its freed large stages among them). */
  uint64_t buffers_mapped;
  /* The ticket of the oldest message this end sent that is not free yet
   * (0: none in flight): when sends wait, the one a receiver may be
   * holding. Messages come free in any order, so in_flight counts the
   * ones not free, which need not be the tickets from this one on. */
  uint64_t oldest_in_flight;
} gpuipc_channel_info_t;

/* gpuipc_channel_info - counters of @ch. Returns 0, -EINVAL, or
 * GPUIPC_E_CLOSED (the parent's channel, after fork()). */
GPUIPC_API int gpuipc_channel_info(gpuipc_channel_t *ch,
                                   gpuipc_channel_info_t *out);

#ifdef __cplusplus
}
#endif

#endif /* GPUIPC_H */
