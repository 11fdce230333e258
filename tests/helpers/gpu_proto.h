/*
 * The little protocol GPU tests speak between an exporting and an importing
 * process over a SOCK_SEQPACKET pair: packed handles (with their fd beside
 * them) one way, words ("written with seed S", "done: ok") both ways.
 * Usable from C tests and from CUDA C helpers.
 */
#ifndef GPUIPC_TEST_GPU_PROTO_H
#define GPUIPC_TEST_GPU_PROTO_H

#ifdef __cplusplus
extern "C" {
#endif
#include "os/os.h"
#include "test.h"
#ifdef __cplusplus
}
#endif

#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define PROTO_TIMEOUT_MS 60000

enum proto_type { PROTO_HANDLE = 1, PROTO_WORD = 2, PROTO_EVENT = 3 };

/* Words. */
enum proto_tag {
  TAG_WRITTEN = 1, /* value: the seed the importer wrote with */
  TAG_DONE = 2,    /* value: 1 when the exporter saw the right bytes */
  TAG_GONE = 3,    /* value: 1 when the importer saw GPUIPC_E_PEER_GONE */
  TAG_READY = 4,   /* value: the pattern an event's record covers */
};

struct proto_msg {
  uint32_t type;
  uint32_t tag;
  uint64_t value; /* HANDLE: the seed of the bytes in the buffer */
  uint32_t left;  /* HANDLE: how many more handles follow */
  uint32_t len;   /* HANDLE: packed bytes */
  uint8_t packed[GPUIPC_HANDLE_PACKED_SIZE];
};

static inline void proto_send_handle(int sock, const gpuipc_handle_t *h,
                                     uint64_t seed, uint32_t left)
{
  struct proto_msg m;
  memset(&m, 0, sizeof(m));
  m.type = PROTO_HANDLE;
  m.value = seed;
  m.left = left;
  int n = gpuipc_handle_pack(h, m.packed, sizeof(m.packed));
  if (n < 0)
    TFAIL_GPUIPC("gpuipc_handle_pack: %s", gpuipc_err_name(n));
  m.len = (uint32_t)n;
  int nfds = h->fd >= 0 ? 1 : 0;
  int rc = gpuipc__sock_send(sock, &m, sizeof(m), &h->fd, nfds,
                             PROTO_TIMEOUT_MS);
  if (rc != 0)
    TFAIL("sending a handle: %s", gpuipc_err_name(rc));
}

/* Receives a handle; h->fd is the descriptor that came with it, or -1. */
static inline void proto_recv_handle(int sock, gpuipc_handle_t *h,
                                     uint64_t *seed, uint32_t *left)
{
  struct proto_msg m;
  int fds[1] = {-1};
  int nfds = 1;
  ssize_t n = gpuipc__sock_recv(sock, &m, sizeof(m), fds, &nfds,
                                PROTO_TIMEOUT_MS);
  if (n != (ssize_t)sizeof(m) || m.type != PROTO_HANDLE)
    TFAIL("expected a handle message, got %zd bytes (%s)", n,
          n < 0 ? gpuipc_err_name((int)n) : "short or wrong type");
  int rc = gpuipc_handle_unpack(m.packed, m.len, h);
  if (rc != 0)
    TFAIL_GPUIPC("gpuipc_handle_unpack: %s", gpuipc_err_name(rc));
  h->fd = nfds == 1 ? fds[0] : -1;
  *seed = m.value;
  if (left != NULL)
    *left = m.left;
}

static inline void proto_send_event(int sock, const gpuipc_event_handle_t *h)
{
  struct proto_msg m;
  memset(&m, 0, sizeof(m));
  m.type = PROTO_EVENT;
  int n = gpuipc_event_handle_pack(h, m.packed, sizeof(m.packed));
  if (n < 0)
    TFAIL_GPUIPC("gpuipc_event_handle_pack: %s", gpuipc_err_name(n));
  m.len = (uint32_t)n;
  int rc = gpuipc__sock_send(sock, &m, sizeof(m), NULL, 0, PROTO_TIMEOUT_MS);
  if (rc != 0)
    TFAIL("sending an event handle: %s", gpuipc_err_name(rc));
}

static inline void proto_recv_event(int sock, gpuipc_event_handle_t *h)
{
  struct proto_msg m;
  ssize_t n = gpuipc__sock_recv(sock, &m, sizeof(m), NULL, NULL,
                                PROTO_TIMEOUT_MS);
  if (n != (ssize_t)sizeof(m) || m.type != PROTO_EVENT)
    TFAIL("expected an event handle, got %zd bytes (%s)", n,
          n < 0 ? gpuipc_err_name((int)n) : "short or wrong type");
  int rc = gpuipc_event_handle_unpack(m.packed, m.len, h);
  if (rc != 0)
    TFAIL_GPUIPC("gpuipc_event_handle_unpack: %s", gpuipc_err_name(rc));
}

static inline void proto_send_word(int sock, enum proto_tag tag,
                                   uint64_t value)
{
  struct proto_msg m;
  memset(&m, 0, sizeof(m));
  m.type = PROTO_WORD;
  m.tag = tag;
  m.value = value;
  int rc = gpuipc__sock_send(sock, &m, sizeof(m), NULL, 0, PROTO_TIMEOUT_MS);
  if (rc != 0)
    TFAIL("sending word %d: %s", (int)tag, gpuipc_err_name(rc));
}

static inline uint64_t proto_recv_word(int sock, enum proto_tag tag)
{
  struct proto_msg m;
  ssize_t n = gpuipc__sock_recv(sock, &m, sizeof(m), NULL, NULL,
                                PROTO_TIMEOUT_MS);
  if (n != (ssize_t)sizeof(m) || m.type != PROTO_WORD || m.tag != tag)
    TFAIL("expected word %d, got %zd bytes (%s)", (int)tag, n,
          n < 0 ? gpuipc_err_name((int)n) : "short or another message");
  return m.value;
}

#endif
