/*
 * src/channel: tensors between two processes.
 *
 *   (the descriptor, release and buffer records, their strict decoding
 *   and the dtype and layout checks are src/wire's: wire/desc.h)
 *   ring.c       waiting on a shared ring word: spin, yield, then futex,
 *                (the slot arithmetic: inline, "ring slots" below)
 *                checking that the peer is still there
 *   open.c       gpuipc_channel_open (options, segment), _close, _info
 *   rendezvous.c pairing the two openers of a name, the socket
 *   send.c       the sending side: send, flow control, staging slots,
 *                releases taken in
 *   known.c      the buffers the receiver holds, by key (LRU, forgets)
 *   stage.c      large stages: a buffer of its own for a staged tensor
 *                larger than a slot
 *   rxbufs.c     the buffers the receiver holds, by the sender's key
 *                (imported from the socket, forgotten)
 *   blocks.c     block batches: gpuipc_channel_send_blocks (its list in
 *                the record slot's part of the list area, or a host
 *                staging slot; sent through send.c's path) and
 *                gpuipc_channel_recv_blocks (one batched copy)
 *   blocks_rx.c  a batch's list, taken and checked with its descriptor
 *                (its encoding is src/wire's: wire/blocks.c)
 *   recv.c       the receiving side: descriptors taken, buffers imported,
 *                releases published, views
 *   events.c     CUDA event pools (ours) and tables (the peer's)
 *   settle.c     the events across a close: the peer's used only while
 *                they exist, ours complete before they are destroyed
 *   tensor.c     tensor utilities: place in a buffer, size, layout;
 *                tensor.h the checks the MPI channel shares
 *   dlpack.c     DLManagedTensor conversions
 *   poll.c       gpuipc_channel_fd: the eventfds that wake an event loop
 *   ready.c      ready words: the receiver's stream waits for the
 *                sender's GPU work on a word the sender's stream writes
 *   guard.c      a thread that lets go of the stream waits on a peer's
 *                ready words when the peer goes without writing them
 *   klist.c      the pinned lists of copies the block kernel reads, and
 *                the counters the copy kernels count their blocks in
 *
 *   ref.c        a channel's references (the user's, one per received
 *                view) and its final free
 *
 * Files depend one way: open -> rendezvous, send, recv; open, recv -> ref;
 * blocks -> send, recv, blocks_rx (their gpuipc__chan_tx_* and _rx_*
 * below); recv -> blocks_rx -> rxbufs; recv -> rxbufs; send, recv ->
 * events, tensor, ring, desc; the stream glue is src/cuda/stream.c, the batched copy
 * src/cuda/copy.c.
 *
 * Shared memory: one HOST segment "chan.NAME" of GPUIPC__CHAN_SEG_BYTES,
 * laid out at fixed offsets (never read from the segment):
 *
 *   0       struct gpuipc__chan_shm: rendezvous words, per-direction heads
 *   8 KiB   descriptor ring of direction 0 (A -> B), DEPTH_MAX slots of 512
 *   +512K   descriptor ring of direction 1 (B -> A)
 *   +1M     release ring of direction 0 (B -> A), DEPTH_MAX slots of 256
 *   +1.25M  release ring of direction 1 (A -> B)
 *   +1.5M   release words of direction 0 (B's GPU writes, A reads),
 *           DEPTH_MAX words of 8 bytes: word i is s once the receiver's
 *           work on message s, sent in record slot i, has completed (a
 *           release with GPUIPC__REL_WORD); the segment is registered
 *           with CUDA, so
 *           cuStreamWriteValue64 on the receiver's stream writes it
 *   +1.5M+8K release words of direction 1
 *   +1.5M+16K ready words of direction 0 (A's GPU writes, B's waits on),
 *           DEPTH_MAX words of 8 bytes: word i is s once the sender's
 *           work before message s, sent in record slot i, has completed
 *           (a descriptor with GPUIPC__DESC_WORD): cuStreamWriteValue64
 *           on the sender's stream writes it, cuStreamWaitValue64 on the
 *           receiver's waits for it (ready.c)
 *   +1.5M+24K ready words of direction 1
 *
 * A is the end that claimed the segment first (end 0); it sends on
 * direction 0. Every word the peer writes is treated as hostile: slots are
 * copied out before they are decoded and counters are checked against the
 * depth.
 */
#ifndef GPUIPC_CHANNEL_H
#define GPUIPC_CHANNEL_H

#include "core/core.h"
#include "os/os.h"
#include "wire/desc.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GPUIPC__CHAN_MAGIC 0x4e414843u /* "CHAN" */
/* What bumps it and its history: docs/versions.md.
 * 2: the hellos of the rendezvous carry each end's eventfd (poll.c).
 * 3: settled[] and ev_use[] in the header (settle.c).
 * 4: release words (GPUIPC__REL_WORD).
 * 5: descriptors and releases carry the message's record slot: records,
 *    events and release words are recycled out of order (send.c).
 * 6: ready words (GPUIPC__DESC_WORD): a message ordered after GPU work
 *    is a word the sender's stream writes and the receiver's waits on. */
#define GPUIPC__CHAN_VERSION 6
#define GPUIPC__CHAN_DEPTH_MAX GPUIPC_CHANNEL_DEPTH_MAX
#define GPUIPC__CHAN_DEPTH_DEFAULT 64
#define GPUIPC__CHAN_HDR_BYTES 8192
#define GPUIPC__CHAN_DESC_OFF(d)                                               \
  (GPUIPC__CHAN_HDR_BYTES +                                                    \
   (size_t)(d) * GPUIPC__CHAN_DEPTH_MAX * GPUIPC__CHAN_DESC_BYTES)
#define GPUIPC__CHAN_REL_OFF(d)                                                \
  (GPUIPC__CHAN_DESC_OFF(2) +                                                  \
   (size_t)(d) * GPUIPC__CHAN_DEPTH_MAX * GPUIPC__CHAN_REL_BYTES)
#define GPUIPC__CHAN_WORD_OFF(d)                                               \
  (GPUIPC__CHAN_REL_OFF(2) + (size_t)(d) * GPUIPC__CHAN_DEPTH_MAX * 8)
#define GPUIPC__CHAN_READY_OFF(d)                                              \
  (GPUIPC__CHAN_WORD_OFF(2) + (size_t)(d) * GPUIPC__CHAN_DEPTH_MAX * 8)
#define GPUIPC__CHAN_SEG_BYTES ((size_t)2 << 20)
/* A block batch's list up to this size lies in its record slot's part of
 * the sender's list area (1024 blocks in 128 buffers fit); a larger one in
 * a host staging slot or large stage. */
#define GPUIPC__CHAN_LIST_BYTES ((size_t)32 << 10)
/* Buffers one direction's receiver keeps mapped (the sender forgets LRU). */
#define GPUIPC__CHAN_BUFS 256

/* Rendezvous states (gpuipc__chan_shm.state). */
#define GPUIPC__CHAN_FREE 0
#define GPUIPC__CHAN_A_INIT 1
#define GPUIPC__CHAN_A_READY 2
#define GPUIPC__CHAN_PAIRED 3

#define GPUIPC__CHAN_TOKEN_LEN 32 /* hex characters */

/* One direction's counters; each on a cache line of its own. */
struct gpuipc__chan_dir {
  _Alignas(64) _Atomic uint32_t head; /* descriptors published (sender) */
  uint32_t depth;                     /* sender's depth, set before pairing */
  _Alignas(64) _Atomic uint32_t recv_sleep; /* receiver sleeps on head */
  _Alignas(64) _Atomic uint32_t rel_head;   /* releases published (receiver) */
  _Alignas(64) _Atomic uint32_t send_sleep; /* sender sleeps on rel_head */
};

struct gpuipc__chan_shm {
  uint32_t magic;
  uint32_t version;
  _Atomic uint32_t state;  /* futex word: GPUIPC__CHAN_* */
  _Atomic uint32_t a_pid;  /* end 0's pid (claimed by CAS) */
  _Atomic uint32_t b_pid;  /* end 1's pid (claimed by CAS) */
  _Atomic uint32_t closed[2]; /* end i closed its side cleanly */
  /* End i, closing: GPUIPC__CHAN_SETTLED_* (settle.c). */
  _Atomic uint32_t settled[2];
  char token[GPUIPC__CHAN_TOKEN_LEN + 1]; /* end 0's socket: chan-TOKEN.sock */
  _Alignas(64) struct gpuipc__chan_dir dir[2];
  /*
   * Per end: 1 while it waits on its eventfd (poll.c). The end sets it;
   * its peer clears it, and then writes the end's eventfd, when it
   * publishes a descriptor or a release to it.
   */
  struct {
    _Alignas(64) _Atomic uint32_t armed;
  } poll[2];
  /* Per end: 1 while it uses its peer's events (settle.c). */
  struct {
    _Alignas(64) _Atomic uint32_t in_use;
  } ev_use[2];
};

/* shm->settled[i]: end i has not closed, or is settling now ... */
#define GPUIPC__CHAN_SETTLED_NOT 0
/* ... closed with every event it gave the peer complete ... */
#define GPUIPC__CHAN_SETTLED_DONE 1
/* ... closed with work behind some of them unfinished. */
#define GPUIPC__CHAN_SETTLED_UNFINISHED 2

_Static_assert(sizeof(struct gpuipc__chan_shm) <= GPUIPC__CHAN_HDR_BYTES,
               "channel header overflows its page");
_Static_assert(GPUIPC__CHAN_READY_OFF(2) <= GPUIPC__CHAN_SEG_BYTES,
               "channel rings overflow the segment");
_Static_assert(GPUIPC__CHAN_SLOT_MAX == GPUIPC__CHAN_DEPTH_MAX,
               "a record slot is below the deepest depth");

/* ----- waiting (ring.c) ----- */

struct gpuipc_channel;

/*
 * Wait until *@word differs from @seen: spin, then poll yielding the CPU
 * for gpuipc__chan_poll_ns(*@last_ns, ch->spin_ns), then sleep on the
 * futex (setting *@sleep so that the writer wakes us), checking the peer
 * between sleeps. A wait that ends (0 or -ETIMEDOUT) stores in *@last_ns,
 * the waiter's own, how long it polled and slept (0: the spin saw the word
 * move; the spin is not timed). Returns 0; -ETIMEDOUT at @deadline;
 * -EAGAIN when @deadline is 0 (poll only); GPUIPC_E_PEER_GONE.
 */
int gpuipc__chan_wait(struct gpuipc_channel *ch, _Atomic uint32_t *word,
                      uint32_t seen, _Atomic uint32_t *sleep,
                      uint64_t deadline, _Atomic uint64_t *last_ns);

/*
 * How long a waiter polls before it sleeps, in ns: twice its last wait
 * (@last_ns) where that was at most @cap_ns, so that a peer that sends or
 * releases at a steady pace finds it awake (a sleeper's wake costs both
 * sides 5 to 20 us); else, and at least, 200 us; never more than @cap_ns
 * (GPUIPC_CHAN_SPIN_US).
 */
uint64_t gpuipc__chan_poll_ns(uint64_t last_ns, uint64_t cap_ns);

/* Publish @val into *@word and wake a sleeper flagged in *@sleep. */
void gpuipc__chan_publish(_Atomic uint32_t *word, uint32_t val,
                          _Atomic uint32_t *sleep);

/*
 * Whether the peer is still there: its clean-close flag and what @look
 * asks for besides: GPUIPC__PEER_SOCK a hang-up on the socket,
 * GPUIPC__PEER_PID its exit (both in one poll() where the peer's pidfd is
 * open; else its pid, through /proc: four more system calls). Returns 0
 * or GPUIPC_E_PEER_GONE (sticky, with a sentence).
 */
#define GPUIPC__PEER_SOCK 0x1u
#define GPUIPC__PEER_PID 0x2u
int gpuipc__chan_peer_check(struct gpuipc_channel *ch, unsigned look);
/* Whether the peer process has not exited (its pidfd, else its pid). */
bool gpuipc__chan_peer_alive(const struct gpuipc_channel *ch);

/*
 * Mark @ch broken with @code unless it is already (the first code stays).
 * Returns @code, so that a failure can be returned through it.
 */
int gpuipc__chan_break(struct gpuipc_channel *ch, int code);

/*
 * 0 while @ch is not broken; else its code, with a sentence. @gone_too:
 * count GPUIPC_E_PEER_GONE (a receiver still takes what was sent before
 * the peer went, and a sender the releases it published).
 */
int gpuipc__chan_broken(struct gpuipc_channel *ch, bool gone_too);


/* ----- the channel object (channel.c) ----- */

#include <pthread.h>
#include <sys/types.h>

/* Sender: a buffer the receiver holds, by the exporter's identity. */
struct gpuipc__known {
  uint64_t nonce, export_id;
  uint32_t pid;
  uint64_t key;
  uint64_t last_use;
};

/* Receiver: a buffer the sender introduced. */
struct gpuipc__rxbuf {
  uint64_t key;
  gpuipc_buf_t *buf;
};

/*
 * An event of the peer's, by the peer's key, as opened for local device
 * @dev (a stream can only use an interprocess event opened on its own
 * device); @h is kept to open it on another device later.
 */
struct gpuipc__event {
  uint32_t key;
  int dev;
  gpuipc_event_t *ev;
  gpuipc_event_handle_t h;
};

/*
 * Where each local device's streams reach one direction's release words:
 * state[i] 0 not looked up yet, 1 at addr[i], -1 they cannot.
 */
struct gpuipc__word_map {
  uint64_t addr[GPUIPC__CHAN_EV_DEVS];
  int8_t state[GPUIPC__CHAN_EV_DEVS];
};

/*
 * The counters gpuipc's copy kernel counts its blocks in, one side's: a
 * block of GPUIPC__COUNTERS on each local device (state[i] 0 not taken
 * yet, 1 at at[i], -1 none to be had), one counter a record slot
 * (klist.c).
 */
struct gpuipc__kcounters {
  uint64_t at[GPUIPC__CHAN_EV_DEVS];
  int8_t state[GPUIPC__CHAN_EV_DEVS];
};

/*
 * Sender: one message in flight, in a record slot of its own (sent in its
 * descriptor: the receiver indexes the message's release event and word
 * by it). A slot is taken from the free ones and given back as soon as
 * its message is free, in whatever order messages come free.
 */
struct gpuipc__tx_rec {
  uint64_t seq;       /* 0: free */
  uint32_t prev, next; /* the list in flight, oldest first (slots, or
                          GPUIPC__CHAN_NO_SLOT) */
  bool released;      /* the receiver gave it back */
  gpuipc_buf_t *buf;  /* a reference held while in flight */
  gpuipc_buf_t **more; /* a block batch's other buffers (references) */
  uint32_t nmore;
  int stage, slot;    /* staging area (device + 1) and slot, or -1 */
  int large;          /* or the area's large stage, or -1 */
  gpuipc_event_t *rel_ev; /* the receiver's release event (table's) */
  uint32_t rel_key;       /* its key */
  bool rel_word;          /* or its release word says when it is free */
  bool rel_away;          /* written by a GPU other than the buffer's */
};

/* The most large stages an area keeps (stage_slots says how many). */
#define GPUIPC__CHAN_LARGE_MAX 64

/* A large stage (stage.c): a buffer of its own for one staged tensor. */
struct gpuipc__large {
  gpuipc_buf_t *buf; /* NULL: an unused entry */
  bool busy;         /* a message in flight holds it */
};

struct gpuipc__stage {
  gpuipc_buf_t *buf;
  uint64_t busy; /* slots in use */
  struct gpuipc__large large[GPUIPC__CHAN_LARGE_MAX];
  size_t large_bytes; /* the sizes of large[].buf together */
};

#define GPUIPC__CHAN_NO_SLOT UINT32_MAX

struct gpuipc__tx {
  pthread_mutex_t lock;
  _Atomic uint64_t wait_ns; /* the last wait for a release (ring.c) */
  uint32_t depth;
  uint64_t next_seq; /* the next message's number */
  uint32_t head;     /* descriptors published */
  struct gpuipc__tx_rec *recs; /* [depth], by record slot */
  uint32_t *free_slots;        /* [depth]: nfree of them are free */
  uint32_t nfree;
  uint32_t first, last;        /* the list in flight (oldest first) */
  uint32_t unfree;   /* released, the receiver's work on it not known done */
  uint64_t freed;    /* messages freed (a waiter's "one came free") */
  uint32_t rel_tail;           /* releases taken in */
  struct gpuipc__known known[GPUIPC__CHAN_BUFS];
  int nknown, last_known;
  /*
   * Keys dropped from known[] whose buffers are gone (freed large stages),
   * oldest first: each descriptor that forgets nothing else carries one
   * (GPUIPC__DESC_FORGET). The receiver holds nknown + nforget buffers.
   */
  uint64_t forget[GPUIPC__CHAN_BUFS];
  int nforget;
  uint64_t next_key, clock, last_key;
  gpuipc_event_t **ev;  /* [ndev * depth], created on first use */
  uint8_t *ev_sent;     /* whether the receiver has each one */
  int ndev;
  struct gpuipc__event *rel_evs;
  int nrel_evs, caprel_evs;
  /* [nstage]: host, then devices; the device areas made at the first
   * device send (the host area alone loads no CUDA) */
  struct gpuipc__stage *stage;
  int nstage;
  /* Block lists (blocks.c): GPUIPC__CHAN_LIST_BYTES a record slot, host
   * memory made at the first block batch; NULL before. */
  gpuipc_buf_t *lists;
  gpuipc_release_fn cb;
  void *cb_user;
  uint64_t sent, bufs_sent;
  uint64_t unlocks; /* times a waiter let the lock go (tx_sleep) */
  struct gpuipc__word_map words; /* for send_wait's stream waits */
  /* Ready words (ready.c): where our streams write them, and [depth] the
   * last message each record slot's word was asked to reach. */
  struct gpuipc__word_map ready;
  uint64_t *ready_seq;
  struct gpuipc__kcounters kc; /* the staging copies' (ready_copy) */
  uint64_t peer_looked_ns; /* when a send last polled the socket */
};

struct gpuipc__rx {
  pthread_mutex_t lock;     /* receiving */
  _Atomic uint64_t wait_ns; /* the last wait for a message (ring.c) */
  /* The slots bitmap of recv_blocks' overlap check (blocks.c), kept for
   * the next call and all zero between calls; a second caller at once
   * takes one of its own. Freed with the channel. */
  pthread_mutex_t seen_lock;
  uint64_t *seen;
  size_t seen_words;
  pthread_mutex_t rel_lock; /* the release ring (producer) */
  uint32_t depth;           /* the sender's */
  uint32_t tail;            /* descriptors taken */
  uint64_t expect_seq;
  struct gpuipc__rxbuf bufs[GPUIPC__CHAN_BUFS];
  int nbufs, last_buf;
  struct gpuipc__event *evs; /* the sender's events */
  int nevs, capevs;
  gpuipc_event_t **rel_ev; /* [ndev * depth]: our release events */
  uint8_t *rel_ev_sent;
  int ndev;
  uint32_t rel_head;        /* releases published */
  /* Release words (rel_lock): where our streams write them; word_seq[i]
   * the last message released with a word in the sender's record slot i. */
  struct gpuipc__word_map words;
  uint64_t *word_seq;
  /* The copy kernel (rel_lock): its counters for our copies, and the
   * largest copy that is the kernel's rather than the engine's (a
   * receiver's copy within one GPU, and the sender's staging copies:
   * GPUIPC_CHAN_COPY_KERNEL_KB). */
  struct gpuipc__kcounters kc;
  uint64_t kernel_max;
  /* Ready words (ready.c, receive lock): where our streams wait on them,
   * and [depth] the message each slot's word was last waited for, which
   * the guard (guard.c) reads from its thread. */
  struct gpuipc__word_map ready;
  _Atomic uint64_t *ready_wait;
  bool guarded;             /* the guard watches this channel */
  bool queued;              /* rx_ready queued a stream wait (ready.c) */
  /* Block batches copied by gpuipc's block kernel (blocks.c): [depth]
   * pinned lists of copies, by the sender's record slot, and their
   * capacities in bytes. A slot's list is rewritten only for a later
   * message in that slot, which comes after this one's release, itself
   * after the kernel that read the list. Registered in the context of
   * device klist_dev (the first to copy), portable. */
  uint64_t **klist;
  size_t *klist_cap;
  int klist_dev;
  bool pending;             /* a descriptor taken but not consumed */
  struct gpuipc__desc pdesc;
  gpuipc_buf_t *pbuf;       /* its buffer (the table's reference) */
  struct gpuipc__rx_blocks *pblocks; /* a block batch's blocks (blocks.c) */
  uint64_t received, bufs_imported;
  _Atomic uint64_t views;
};

struct gpuipc_channel {
  _Atomic long refs; /* the user's, and one per live view */
  char name[GPUIPC_CHANNEL_NAME_MAX + 1];
  char who[96];      /* "channel NAME (peer pid P)", for sentences */
  int end;           /* 0 (A) or 1 (B) */
  gpuipc_buf_t *seg;
  struct gpuipc__chan_shm *shm;
  uint8_t *base;
  int sock;
  pid_t peer_pid;
  int peer_pidfd;    /* the peer's pidfd, -1: none (the pid is asked) */
  uint64_t fork_gen; /* gpuipc__fork_gen() at open: whose channel it is */
  int device;        /* receiving device, -1: each tensor's own */
  int send_timeout_ms; /* resolved: ms, or -1 for forever */
  int dom_timeout_ms;  /* the domain's, for GPUIPC_TIMEOUT_DEFAULT */
  uint64_t spin_ns;    /* GPUIPC_CHAN_SPIN_US: the longest poll of a wait */
  uint32_t stage_slots;
  size_t stage_slot_bytes;
  size_t stage_large_bytes;
  /*
   * 0, or why the channel is unusable, for good: GPUIPC_E_PEER_GONE,
   * GPUIPC_E_PROTO, or the failure that left the two ends out of step.
   * Set once, by gpuipc__chan_break. (shm->closed[] is only the signal
   * between the processes; closing is this end's own close.)
   */
  _Atomic int broken;
  _Atomic int closing;
  struct gpuipc__chan_dir *txd, *rxd;
  uint8_t *tx_ring, *rx_ring;   /* descriptor rings */
  uint8_t *tx_rel, *rx_rel;     /* release rings: we read tx_rel */
  _Atomic uint64_t *tx_words;   /* release words: we read these, */
  _Atomic uint64_t *rx_words;   /* our streams write these */
  _Atomic uint64_t *tx_ready;   /* ready words: our streams write these, */
  _Atomic uint64_t *rx_ready;   /* our streams wait on these */
  struct gpuipc__tx tx;
  struct gpuipc__rx rx;
  /* Waking an event loop (poll.c). */
  int efd;                 /* our eventfd, the peer writes it */
  int peer_efd;            /* the peer's, we write it */
  _Atomic int pollfd;      /* gpuipc_channel_fd's epoll fd, -1 before */
  _Atomic bool polled;     /* gpuipc_channel_fd was called: arm when idle */
  _Atomic uint32_t poll_rx_tail;  /* rx.tail, rel_tail as last taken, */
  _Atomic uint32_t poll_rel_tail; /* for the other side's arming */
  _Atomic uint64_t poll_kicks;    /* writes to the peer's eventfd */
};

#define GPUIPC__VIEW_MAGIC 0x57454956u /* "VIEW" */

/* A received view: the user sees .t. */
struct gpuipc__view {
  gpuipc_tensor_t t;
  uint32_t magic;
  int64_t shape[GPUIPC_TENSOR_MAX_DIMS];
  int64_t strides[GPUIPC_TENSOR_MAX_DIMS];
  struct gpuipc_channel *ch; /* a reference */
  uint64_t seq;
  uint32_t slot;             /* the sender's record slot */
  int device;                /* for the release event, -1 for HOST */
  void *recv_stream;         /* gpuipc_channel_recv made the data ready on it */
  bool waits;                /* with a stream wait queued there: its release
                                on that stream needs no idle query */
  void *dl_stream;           /* DLPack consumer's: the deleter releases on it */
  gpuipc_dl_managed_tensor_t managed;
  gpuipc_dl_managed_tensor_versioned_t versioned;
};

/* The view behind a user pointer, or NULL when it is not one. */
struct gpuipc__view *gpuipc__view_of(gpuipc_tensor_t *t);

/* ----- ring slots: where message and position numbers land ----- */

/* The descriptor slot of ring position @pos (ring of DEPTH_MAX slots). */
static inline uint8_t *gpuipc__chan_desc_slot(uint8_t *ring, uint32_t pos)
{
  return ring + (size_t)(pos % GPUIPC__CHAN_DEPTH_MAX) *
                    GPUIPC__CHAN_DESC_BYTES;
}

/* The release slot of ring position @pos. */
static inline uint8_t *gpuipc__chan_rel_slot(uint8_t *ring, uint32_t pos)
{
  return ring + (size_t)(pos % GPUIPC__CHAN_DEPTH_MAX) *
                    GPUIPC__CHAN_REL_BYTES;
}

/* ----- shared by the files of the channel ----- */

/* A deadline @timeout_ms (resolved: ms, or -1) from now; 0 for 0 (poll
 * only). */
static inline uint64_t gpuipc__chan_deadline_of(int timeout_ms)
{
  return timeout_ms == 0 ? 0 : gpuipc__deadline(timeout_ms);
}

/*
 * The deadline of a call's @timeout_ms under the public rule
 * (GPUIPC_TIMEOUT_DEFAULT: the domain's timeout), in *@deadline; -EINVAL
 * for a bad timeout, the sentence naming @who.
 */
static inline int gpuipc__chan_deadline(const struct gpuipc_channel *ch,
                                        const char *who, int timeout_ms,
                                        uint64_t *deadline)
{
  int ms = -1;
  int rc = gpuipc__timeout_resolve(who, "timeout_ms", timeout_ms,
                                   ch->dom_timeout_ms, &ms);
  if (rc == 0)
    *deadline = gpuipc__chan_deadline_of(ms);
  return rc;
}

/* Whether @deadline (UINT64_MAX: never) has passed. */
static inline bool gpuipc__chan_past(uint64_t deadline)
{
  return deadline != UINT64_MAX && gpuipc__now_ns() >= deadline;
}

/* Whether DLPack device type @t is memory the host reads. */
static inline bool gpuipc__chan_is_host_dev(int32_t t)
{
  return t == GPUIPC_DL_CPU || t == GPUIPC_DL_CUDA_HOST;
}

/* ----- open.c, rendezvous.c ----- */

/* gpuipc_channel_opts_t as read, with the defaults filled in. */
struct gpuipc__chan_cfg {
  int timeout_ms;      /* resolved: ms, or -1 for forever */
  uint32_t depth;
  int device;
  int send_timeout_ms; /* resolved: ms, or -1 for forever */
  int dom_timeout_ms;  /* the domain's */
  uint32_t stage_slots;
  size_t stage_slot_bytes;
  size_t stage_large_bytes;
};

/* gpuipc__chan_rendezvous: paired, or try the name afresh. */
enum { GPUIPC__CHAN_PAIR_DONE = 0, GPUIPC__CHAN_PAIR_RETRY = 1 };

/*
 * One attempt to pair on the segment in ch->seg (named @segname): fills
 * ch->end, ch->sock and ch->peer_pid. Returns GPUIPC__CHAN_PAIR_DONE,
 * GPUIPC__CHAN_PAIR_RETRY, or a negative code with a sentence.
 */
int gpuipc__chan_rendezvous(struct gpuipc_channel *ch, gpuipc_domain_t *dom,
                            const char *segname,
                            const struct gpuipc__chan_cfg *c,
                            uint64_t deadline);

/*
 * Whether @ch was opened before this process was made by fork() (without
 * exec): the parent's channel, counted as the domain counts its own
 * (gpuipc__fork_gen, src/domain/fork.c). The child's copy is inert: its
 * close frees the child's memory and descriptors only, a view's release
 * publishes nothing, and every other call fails (gpuipc__chan_stale_err),
 * so that nothing the parent shares with its peer (header words, rings,
 * eventfds, socket) is touched. Its socket was closed at fork() (fork.c).
 */
bool gpuipc__chan_stale(const struct gpuipc_channel *ch);
/* GPUIPC_E_CLOSED with a sentence naming @who: @ch is the parent's. */
int gpuipc__chan_stale_err(const struct gpuipc_channel *ch, const char *who);

/* Call the test hook (gpuipc__chan_test_hook), if any. */
void gpuipc__chan_hook(const char *name, int where);

/* Let go of what each side holds (gpuipc_channel_close). */
void gpuipc__chan_tx_close(struct gpuipc_channel *ch);
void gpuipc__chan_rx_close(struct gpuipc_channel *ch);

/* ----- ref.c ----- */

/* Take a reference (a received view's); drop one: the last frees it. */
void gpuipc__chan_ref(struct gpuipc_channel *ch);
void gpuipc__chan_unref(struct gpuipc_channel *ch);

/* ----- events.c ----- */

/* Visible devices, at most GPUIPC__CHAN_EV_DEVS. */
int gpuipc__chan_dev_count(void);

/*
 * Our event for (@dev, @slot) in @pool ([ndev * depth], with @sent: whether
 * the peer has its handle), both created on first use. @is_new: the peer
 * has not had its handle yet.
 */
int gpuipc__chan_event_get(gpuipc_event_t ***pool, uint8_t **sent,
                           int *ndev, uint32_t depth, int dev, uint32_t slot,
                           gpuipc_event_t **out, bool *is_new);
void gpuipc__chan_event_pool_free(gpuipc_event_t **pool, uint8_t *sent,
                                  int ndev, uint32_t depth);
/* Export @ev and pack its handle into @dst. */
int gpuipc__chan_event_pack(gpuipc_event_t *ev,
                            uint8_t dst[GPUIPC_EVENT_HANDLE_PACKED_SIZE]);
/*
 * The peer's event @key from table (@tab, @n, @cap), opened for local
 * device @dev (-1: the GPU the handle names); @packed: the handle sent
 * with the key's first use, or NULL. GPUIPC_E_PROTO naming @who.
 */
int gpuipc__chan_event_peer(struct gpuipc__event **tab, int *n, int *cap,
                            uint32_t key, const uint8_t *packed, int dev,
                            const char *who, gpuipc_event_t **out);
void gpuipc__chan_event_tab_free(struct gpuipc__event *tab, int n);
/*
 * Record our event for the message in record slot @slot (below @depth) of
 * device @dev of the pool (@pool, @sent, @ndev) on @stream. *@key: its key for the peer.
 * When the peer does not have it yet, its packed handle goes into @handle
 * and *@sent_flag points at the flag to set once the record that carries
 * it is published; else *@sent_flag is NULL.
 */
int gpuipc__chan_event_record(gpuipc_event_t ***pool, uint8_t **sent,
                              int *ndev, uint32_t depth, int dev,
                              uint32_t slot, void *stream, uint32_t *key,
                              uint8_t handle[GPUIPC_EVENT_HANDLE_PACKED_SIZE],
                              uint8_t **sent_flag);
/* How long to poll a pending event of the peer's before a stream wait. */
uint64_t gpuipc__chan_ev_poll_ns(void);
/*
 * Where device @dev's streams reach the release words at @words, in
 * @seg (the channel's segment, registered with CUDA here if it was mapped
 * before this process had a context; looked up once per device, kept in
 * @map): 0 and *@addr, or GPUIPC_E_UNSUPPORTED (the device cannot: events,
 * or a host wait).
 */
int gpuipc__chan_word_addr(struct gpuipc__word_map *map, gpuipc_buf_t *seg,
                           _Atomic uint64_t *words, int dev, uint64_t *addr);

/* ----- ready.c, guard.c ----- */

/*
 * Order the message in record slot @slot (number @seq) after @stream's
 * work on device @dev with a ready word: the stream writes @seq into the
 * slot's word when its work so far is done. 0; GPUIPC_E_UNSUPPORTED when
 * the word cannot be used (the setting, the device): use an event; or
 * the CUDA error. Send lock held.
 */
int gpuipc__chan_ready_write(struct gpuipc_channel *ch, int dev, void *stream,
                             uint32_t slot, uint64_t seq);
/*
 * Stage @n bytes of @src into @dst (a staging slot or stage on device
 * @dev) with one launch of gpuipc's copy kernel on @stream, which then
 * writes @seq into record slot @slot's ready word, at system scope: the
 * copy and gpuipc__chan_ready_write's word in one. 0: both are queued;
 * GPUIPC_E_UNSUPPORTED when the kernel does not take it (ready words
 * off, more than the copy kernel's bytes, unaligned, a stream of another
 * device, no kernel): nothing was queued, copy with the engine; or the
 * CUDA error. Send lock held.
 */
int gpuipc__chan_ready_copy(struct gpuipc_channel *ch, int dev, void *stream,
                            uint32_t slot, uint64_t seq, void *dst,
                            const void *src, size_t n);
/* The local GPU the memory of @b lies on (not the one it is mapped for),
 * or -1 (HOST memory, or a GPU this process does not see). */
int gpuipc__chan_home_gpu(const gpuipc_buf_t *b);
/*
 * Make @stream (of local device @dev) wait for the ready word of the
 * pending message, which lies in buffer @b: nothing when the word has
 * reached it; on the sender's own GPU, a host poll first (as for events);
 * else a stream wait on the word, or, where @dev cannot wait on one, the
 * host waits (the domain's timeout). Receive lock held.
 */
int gpuipc__chan_ready_wait(struct gpuipc_channel *ch, int dev, void *stream,
                            gpuipc_buf_t *b);
/* Whether each ready word our streams were asked to write is written (the
 * send lock held); wait for them until @deadline. */
bool gpuipc__chan_ready_settle(struct gpuipc_channel *ch, uint64_t deadline);
/* At close: wait (bounded by @deadline) for the ready words our streams
 * wait on, then let go of the rest. */
void gpuipc__chan_ready_close(struct gpuipc_channel *ch, uint64_t deadline);

/* Watch @ch's peer (guard.c) while our streams wait on its ready words:
 * when it hangs up, the guard breaks @ch and lets go of the waits. */
int gpuipc__chan_guard_add(struct gpuipc_channel *ch);
/* Stop watching @ch (at close, before it is freed). */
void gpuipc__chan_guard_remove(struct gpuipc_channel *ch);
/* Let go of every stream wait on the peer's ready words: write into each
 * word what our streams wait for (the peer is gone, or we close). */
void gpuipc__chan_ready_unblock(struct gpuipc_channel *ch);

/* ----- settle.c ----- */

/*
 * Before any use of the peer's events (opening, query, stream wait), which
 * is undefined once the peer destroyed them: 0 when they may be used, until
 * gpuipc__chan_peer_ev_leave; 1 when the peer closed with all of them
 * complete (treat each as complete, use none); GPUIPC_E_PEER_GONE (a
 * sentence naming @who) when it closed with work unfinished, or is gone.
 */
int gpuipc__chan_peer_ev_enter(struct gpuipc_channel *ch, const char *who);
void gpuipc__chan_peer_ev_leave(struct gpuipc_channel *ch);
/*
 * At close, before our events are destroyed: wait (bounded) for those the
 * peer has handles of to complete, say so in the header, and wait for the
 * peer to finish a use of them under way.
 */
void gpuipc__chan_settle(struct gpuipc_channel *ch);
/* Whether every release word our streams were asked to write has been
 * written (rel_lock held). */
bool gpuipc__chan_words_written(const struct gpuipc_channel *ch);

/* ----- send.c, for stage.c ----- */

/*
 * Wait, with the send lock held (let go while it sleeps), until a message
 * in flight (any one: a message held long holds up none of the others)
 * comes free, and recycle it. Returns 0; -EAGAIN for GPUIPC_SEND_NONBLOCK
 * in @flags; -ETIMEDOUT at @deadline; the channel's failure. The sentences
 * of -EAGAIN and -ETIMEDOUT name @what, the thing that is all in flight
 * ("staging slot", "large stage"), and the oldest message in flight.
 */
int gpuipc__chan_tx_wait_any(struct gpuipc_channel *ch, unsigned flags,
                             uint64_t deadline, const char *what);

/* Retire every released message whose buffer is free again (send lock
 * held): 0, or the failure of a query. */
int gpuipc__chan_tx_recycle(struct gpuipc_channel *ch);

/* The oldest message in flight (0: none). Send lock held. */
uint64_t gpuipc__chan_tx_oldest(const struct gpuipc__tx *tx);

/* ----- send.c, for blocks.c ----- */

/*
 * Room for one more message, and with @area >= 0 (0: host, d + 1: device
 * d) a staging slot (*@slot) or, for @span above a slot, a large stage
 * (*@large) there (else -1 each). Send lock held (let go while it waits).
 * Errors as gpuipc_channel_send's flow control.
 */
int gpuipc__chan_tx_reserve(struct gpuipc_channel *ch, int area,
                            uint64_t span, unsigned flags, int *slot,
                            int *large);
/* The record slot the next message takes (room reserved). Send lock held. */
uint32_t gpuipc__chan_tx_next_slot(const struct gpuipc_channel *ch);
/* The buffer and the byte offset (*@offset) of what tx_reserve found. */
gpuipc_buf_t *gpuipc__chan_stage_at(struct gpuipc_channel *ch, int area,
                                    int slot, int large, uint64_t *offset);
/*
 * The key the receiver knows @buf by, in *@key: when it does not yet, its
 * buffer message goes out now (*@is_new), and *@forget is the key evicted
 * for it (else 0). Send lock held. The send's error (the channel broken
 * when an evicted entry was lost).
 */
int gpuipc__chan_tx_key(struct gpuipc_channel *ch, gpuipc_buf_t *buf,
                        uint64_t *key, uint64_t *forget, bool *is_new);
/* Before a send (send lock held): GPUIPC_E_PEER_GONE when the peer closed
 * its end, or hung up its socket (looked at once a millisecond). */
int gpuipc__chan_tx_peer_check(struct gpuipc_channel *ch);

/* gpuipc__chan_tx_key for descriptor @d's buffer: its key, NEW_BUF, FORGET. */
int gpuipc__chan_tx_intro(struct gpuipc_channel *ch, gpuipc_buf_t *buf,
                          struct gpuipc__desc *d);

/* What a message holds while in flight, and what it is ordered after. */
struct gpuipc__tx_post {
  gpuipc_buf_t *const *hold; /* buffers referenced until it is free; the
                                first names the device of its release */
  uint32_t nhold;
  int area, slot, large;     /* its staging (tx_reserve's), or -1 */
  int ev_dev;                /* device of @stream's work, -1: none */
  void *stream;
  bool on_socket;            /* buffer messages went out for it */
  bool busy;                 /* work was just queued on @stream */
  bool ready;                /* that work writes the ready word (staging
                                copy by the kernel: ready_copy) */
};

/*
 * Publish descriptor @d (seq, buffer, layout and type filled; room
 * reserved) as gpuipc_channel_send does: its record slot, an event when
 * @p->stream is busy, the record, the ring. Send lock held. 0 and
 * *@ticket; a failure after buffer messages went out breaks the channel.
 */
int gpuipc__chan_tx_post(struct gpuipc_channel *ch,
                         const struct gpuipc__desc *d,
                         const struct gpuipc__tx_post *p, uint64_t *ticket);

/* ----- recv.c and rxbufs.c, for blocks.c and blocks_rx.c ----- */

/*
 * The next message, pending (rx.pdesc, rx.pbuf), within @timeout_ms: 0
 * with the receive lock held; else its code, the lock not held.
 */
int gpuipc__chan_rx_take(struct gpuipc_channel *ch, const char *who,
                         int timeout_ms);
/* Make @stream (of device @dev) wait for the sender's work on it. */
int gpuipc__chan_rx_ready(struct gpuipc_channel *ch, int dev, void *stream);
/*
 * The pending message is consumed: release it, ordered after @stream (of
 * device @dev, -1: none; @busy: work was just queued on it; @carried: a
 * kernel queued there writes its release word; @mem: the message's
 * memory -- a block batch's first buffer, which the sender's record holds
 * -- or NULL: where the word comes from another GPU, the release says so).
 * Receive lock held.
 */
int gpuipc__chan_rx_done(struct gpuipc_channel *ch, int dev,
                         const gpuipc_buf_t *mem, void *stream, bool busy,
                         bool carried);
/*
 * Where @dev's streams write the release word of record slot @slot, and
 * the counter gpuipc's kernels take for it (@kernel; 0: none); 0, or
 * GPUIPC_E_UNSUPPORTED when the release cannot be a word (closing,
 * broken, no stream memory operations). rel_lock held.
 */
int gpuipc__chan_rx_word_for(struct gpuipc_channel *ch, uint32_t slot,
                             int dev, bool kernel, uint64_t *word,
                             uint64_t *count);
/* Import the buffer message of key @key (message @seq) from the socket. */
int gpuipc__chan_rx_import(struct gpuipc_channel *ch, uint64_t seq,
                           uint64_t key, const char *who);
/* Drop buffer @key (message @seq forgets it); GPUIPC_E_PROTO if unknown. */
int gpuipc__chan_rx_forget(struct gpuipc_channel *ch, uint64_t seq,
                           uint64_t key, const char *who);
/* The buffer the sender calls @key, or NULL. */
gpuipc_buf_t *gpuipc__chan_rx_buf(struct gpuipc_channel *ch, uint64_t key);

/* ----- blocks_rx.c, for recv.c and blocks.c ----- */

/* A block batch taken from the ring and checked, waiting to be copied. */
struct gpuipc__rx_blocks {
  uint32_t n;
  bool host; /* the blocks lie in HOST buffers */
  int dev;   /* else the device they are mapped for */
  /* The blocks: a list of the slots form keeps its slots (block i at
   * slot_base + slots[i] * slot_bytes), a full one is spelt out; the
   * arrays of the other are made when a copy wants them
   * (gpuipc__chan_blocks_spell). */
  uint32_t *slots;
  uint64_t slot_bytes;
  const uint8_t *slot_base;
  const void **src;
  size_t *bytes;
  gpuipc_buf_t *bufs[GPUIPC_CHANNEL_BLOCK_BUFS_MAX]; /* the table's */
  uint32_t nbufs;
};

/* The pending batch's src[] and bytes[], made from its slots if need be.
 * 0 or -ENOMEM. */
int gpuipc__chan_blocks_spell(struct gpuipc_channel *ch, const char *who);

/*
 * Block batch descriptor rx.pdesc was taken, its list's buffer @lb mapped:
 * copy the list out, check it, import and forget what it says, and keep
 * the blocks (rx.pblocks). GPUIPC_E_PROTO with a sentence; -ENOMEM.
 */
int gpuipc__chan_blocks_fetch(struct gpuipc_channel *ch, gpuipc_buf_t *lb);
/* -EINVAL naming @who: the pending message is a block batch. */
int gpuipc__chan_blocks_refuse(struct gpuipc_channel *ch, const char *who);
/* klist.c: the pinned list of record slot @slot for the block kernel
 * on device @dev, of @bytes at least (NULL: none to be had); all of them
 * freed (at close, once their launches ran). */
uint64_t *gpuipc__chan_klist(struct gpuipc_channel *ch, uint32_t slot,
                             size_t bytes, int dev);
void gpuipc__chan_klist_free(struct gpuipc_channel *ch);
/* klist.c: record slot @slot's counter of @k on device @dev, its block
 * taken at the first call (0: none to be had); every block given back
 * (once no launch that uses one can still run). */
uint64_t gpuipc__chan_kcount(struct gpuipc__kcounters *k, int dev,
                             uint32_t slot);
void gpuipc__chan_kcounters_put(struct gpuipc__kcounters *k);
/* Free rx.pblocks (consumed, or the channel closes). */
void gpuipc__chan_blocks_drop(struct gpuipc_channel *ch);

/* ----- known.c: the buffers the receiver holds, by key ----- */

/* The key the receiver knows @b by, or 0. */
uint64_t gpuipc__chan_known_find(struct gpuipc__tx *tx,
                                 const struct gpuipc_buf *b);
/*
 * Remember @b under a new key, evicting the least recently used entry
 * when full (its key in *@forget, else 0).
 */
uint64_t gpuipc__chan_known_add(struct gpuipc__tx *tx,
                                const struct gpuipc_buf *b, uint64_t *forget);
/* Undo gpuipc__chan_known_add when the message could not be sent. */
void gpuipc__chan_known_drop(struct gpuipc__tx *tx, uint64_t key);
/*
 * @b's buffer is gone: drop it from the table and queue its key to be
 * forgotten (tx->forget).
 */
void gpuipc__chan_known_forget(struct gpuipc__tx *tx, const gpuipc_buf_t *b);
/*
 * A queued key to forget for descriptor @d, unless it forgets one already:
 * the oldest. Returns whether it took one; gpuipc__chan_forget_sent drops
 * it once @d is out.
 */
bool gpuipc__chan_forget_queued(struct gpuipc__tx *tx, struct gpuipc__desc *d);
void gpuipc__chan_forget_sent(struct gpuipc__tx *tx);

/* ----- stage.c ----- */

/*
 * A free large stage of area @area (0: host, d + 1: device d; the areas
 * exist) that holds @span bytes, in *@idx: a kept one, or one allocated
 * for it, waiting for a message in flight to be free when the limits
 * (stage_slots stages, stage_large_bytes bytes) leave no room until
 * @deadline. Returns 0; -EAGAIN (NONBLOCK); -ETIMEDOUT; -ENOMEM (or the
 * allocation's error) naming the size; the channel's failure.
 */
int gpuipc__chan_stage_large(struct gpuipc_channel *ch, int area,
                             uint64_t span, unsigned flags, uint64_t deadline,
                             int *idx);

/* Free an area's large stages (none may be busy: the channel closes). */
void gpuipc__chan_stage_large_free(struct gpuipc__stage *s);

/* ----- poll.c ----- */

/* Create ch->efd (and set the poll fields to none); at open. */
int gpuipc__chan_poll_init(struct gpuipc_channel *ch);

/* Close the descriptors of poll.c (idempotent). */
void gpuipc__chan_poll_close(struct gpuipc_channel *ch);

/* The descriptor our hello carries: ch->efd, unless a test replaced it. */
int gpuipc__chan_hello_fd(struct gpuipc_channel *ch);

/*
 * Check that @fd, received from the peer in its hello, is a non-blocking
 * eventfd. GPUIPC_E_PROTO with a sentence naming channel @name if not.
 */
int gpuipc__chan_efd_check(int fd, const char *name);

/*
 * A call of this end found nothing new: when the user polls (called
 * gpuipc_channel_fd), drain our eventfd, arm, and look once more, so that
 * a descriptor or release published meanwhile leaves the fd readable.
 */
void gpuipc__chan_arm(struct gpuipc_channel *ch);

void gpuipc__chan_poke_slow(struct gpuipc_channel *ch);

/*
 * After publishing a descriptor or a release (or closing): wake the peer
 * if it armed. One sequentially consistent load when nobody polls (it
 * pairs with the store of the head just published, and the arming end's
 * store of its flag with its load of the head: one of the two sees the
 * other).
 */
static inline void gpuipc__chan_poke(struct gpuipc_channel *ch)
{
  if (atomic_load(&ch->shm->poll[1 - ch->end].armed) != 0)
    gpuipc__chan_poke_slow(ch);
}

/* ----- tensor.c ----- */

/*
 * The byte offset of @t's first element in its buffer @t->buf, whose
 * memory the data pointer must point into. -EINVAL naming @who.
 */
int gpuipc__tensor_buf_offset(const char *who, const gpuipc_tensor_t *t,
                              uint64_t *offset);

/* ----- for tests ----- */

/*
 * When set, the DLPack deleters call it with the view and the stream they
 * are about to release it on.
 */
extern void (*gpuipc__test_hook_dlpack_release)(const gpuipc_tensor_t *view,
                                                void *stream);

/*
 * Publish @len raw bytes as the next descriptor on @ch's sending ring,
 * bypassing every check, with an optional buffer message (@bufmsg,
 * @bufmsg_len, @fd or -1) sent first on the socket.
 */
int gpuipc__chan_inject(struct gpuipc_channel *ch, const void *bytes,
                        size_t len, const void *bufmsg, size_t bufmsg_len,
                        int fd);

/*
 * Publish @len raw bytes as the next release record on @ch's release ring
 * (the one its peer's sender reads), bypassing every check.
 */
int gpuipc__chan_inject_release(struct gpuipc_channel *ch, const void *bytes,
                                size_t len);

/* The key the last send used for its buffer (0 before any). */
uint64_t gpuipc__chan_last_key(struct gpuipc_channel *ch);
/* The next sequence number this end will send. */
uint64_t gpuipc__chan_next_seq(struct gpuipc_channel *ch);

/*
 * Tests only, to stop an opener at a point of the rendezvous: @fn (NULL:
 * none) is called with the channel's name at
 *   GPUIPC__CHAN_HOOK_MAPPED  an opener has mapped the segment of the name
 *                             and not looked at it yet;
 *   GPUIPC__CHAN_HOOK_PAIRED  end A has marked the segment PAIRED and not
 *                             unlinked its name yet.
 */
enum { GPUIPC__CHAN_HOOK_MAPPED = 1, GPUIPC__CHAN_HOOK_PAIRED = 2 };
typedef void gpuipc__chan_hook_fn(const char *name, int where);
void gpuipc__chan_test_hook(gpuipc__chan_hook_fn *fn);

/* Writes this end made to the peer's eventfd. */
uint64_t gpuipc__chan_poll_kicks(struct gpuipc_channel *ch);
/*
 * Tests only: the rendezvous hellos of channels the calling thread opens
 * carry @fd (-1: their own eventfd again) instead of their eventfd.
 */
void gpuipc__chan_test_hello_fd(int fd);
/*
 * When set, gpuipc__chan_arm calls it with the channel after draining its
 * eventfd and before arming: what it publishes lands in that window.
 */
extern void (*gpuipc__test_hook_chan_arm)(struct gpuipc_channel *ch);

#endif
