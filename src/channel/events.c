/*
 * Channels: the CUDA events that order the two ends' GPU work.
 *
 *
 * Events. For GPU memory the sender records an event of its own (one per
 * device and record slot, exported once: NEW_EVENT carries the handle) on
 * its stream, and the receiver makes its stream wait for it. The receiver
 * records a release event the same way when it gives a GPU buffer back or
 * has copied out of one; the sender's record is free once that event has
 * completed. Both are by the message's record slot (the sender's): a
 * slot's event is recorded again only for a later message in that slot,
 * which cannot be sent before the slot's earlier message is free.
 *
 * This file holds the pools of our own events (one per device and slot,
 * created on first use) and the tables of the peer's events, by key; and
 * where a device's streams reach the release words (channel.h), which
 * stand in for release events where the device has stream memory
 * operations.
 */
#include "channel/channel.h"
#include "cuda/cuda.h"
#include "mem/mem.h"

#include <stdlib.h>
#include <string.h>

int gpuipc__chan_dev_count(void)
{
  int n = gpuipc_device_count();
  return n < 0 ? 0 : n > GPUIPC__CHAN_EV_DEVS ? GPUIPC__CHAN_EV_DEVS : n;
}

/* Our event for (@dev, @slot) in @pool, created on first use. */
int gpuipc__chan_event_get(gpuipc_event_t ***pool, uint8_t **sent, int *ndev,
                           uint32_t depth, int dev, uint32_t slot,
                           gpuipc_event_t **out, bool *is_new)
{
  if (*pool == NULL) {
    int n = gpuipc__chan_dev_count();
    if (n <= 0)
      return gpuipc__err(GPUIPC_E_NODEVICE, "channel: no CUDA device for an "
                         "event");
    *pool = calloc((size_t)n * depth, sizeof(**pool));
    *sent = calloc((size_t)n * depth, 1);
    if (*pool == NULL || *sent == NULL) {
      free(*pool);
      free(*sent);
      *pool = NULL;
      *sent = NULL;
      return gpuipc__err(-ENOMEM, "channel: out of memory for events");
    }
    *ndev = n;
  }
  if (dev < 0 || dev >= *ndev)
    return gpuipc__err(-ERANGE, "channel: device %d has no event slot", dev);
  size_t i = (size_t)dev * depth + slot;
  if ((*pool)[i] == NULL) {
    int rc = gpuipc_event_create(dev, 0, &(*pool)[i]);
    if (rc != 0)
      return rc;
  }
  *out = (*pool)[i];
  *is_new = !(*sent)[i];
  return 0;
}

int gpuipc__chan_event_record(gpuipc_event_t ***pool, uint8_t **sent,
                              int *ndev, uint32_t depth, int dev,
                              uint32_t slot, void *stream, uint32_t *key,
                              uint8_t handle[GPUIPC_EVENT_HANDLE_PACKED_SIZE],
                              uint8_t **sent_flag)
{
  gpuipc_event_t *ev = NULL;
  bool is_new = false;
  int rc = gpuipc__chan_event_get(pool, sent, ndev, depth, dev, slot, &ev,
                                  &is_new);
  if (rc == 0 && is_new)
    rc = gpuipc__chan_event_pack(ev, handle);
  if (rc == 0)
    rc = gpuipc_event_record(ev, stream);
  if (rc != 0)
    return rc;
  *key = (uint32_t)dev * GPUIPC__CHAN_DEPTH_MAX + slot;
  *sent_flag = is_new ? &(*sent)[(size_t)dev * depth + slot] : NULL;
  return 0;
}

void gpuipc__chan_event_pool_free(gpuipc_event_t **pool, uint8_t *sent,
                                  int ndev, uint32_t depth)
{
  if (pool != NULL)
    for (size_t i = 0; i < (size_t)ndev * depth; i++)
      if (pool[i] != NULL)
        gpuipc_event_release(pool[i]);
  free(pool);
  free(sent);
}

int gpuipc__chan_event_pack(gpuipc_event_t *ev,
                            uint8_t dst[GPUIPC_EVENT_HANDLE_PACKED_SIZE])
{
  gpuipc_event_handle_t h;
  int rc = gpuipc_event_export(ev, &h);
  if (rc != 0)
    return rc;
  rc = gpuipc_event_handle_pack(&h, dst, GPUIPC_EVENT_HANDLE_PACKED_SIZE);
  return rc < 0 ? rc : 0;
}

static bool same_event(const gpuipc_event_handle_t *a,
                       const gpuipc_event_handle_t *b)
{
  return a->event_id == b->event_id && a->pid == b->pid &&
         a->pidns == b->pidns && a->nonce == b->nonce &&
         memcmp(a->boot_id, b->boot_id, sizeof(a->boot_id)) == 0 &&
         memcmp(a->bytes, b->bytes, sizeof(a->bytes)) == 0;
}

/*
 * The peer's event @key from table (@tab, @n, @cap), opened for local
 * device @dev (-1: the GPU the handle names). @packed, when not NULL, is
 * the handle the peer sends with the key's first use; a key keeps its
 * event for the life of the channel (a second, different handle for it is
 * a protocol error). The event is opened on each device that asks for it,
 * once (an open costs about 200 us).
 */
int gpuipc__chan_event_peer(struct gpuipc__event **tab, int *n, int *cap,
                            uint32_t key, const uint8_t *packed, int dev,
                            const char *who, gpuipc_event_t **out)
{
  gpuipc_event_handle_t h;
  int rc, any = -1;
  if (packed != NULL) {
    rc = gpuipc_event_handle_unpack(packed, GPUIPC_EVENT_HANDLE_PACKED_SIZE,
                                    &h);
    if (rc != 0)
      return gpuipc__err(GPUIPC_E_PROTO, "%s: malformed event handle for "
                         "key %u", who, key);
  }
  for (int i = 0; i < *n; i++) {
    struct gpuipc__event *e = &(*tab)[i];
    if (e->key != key)
      continue;
    if (packed != NULL && !same_event(&e->h, &h))
      return gpuipc__err(GPUIPC_E_PROTO, "%s: event key %u was sent again "
                         "for another event", who, key);
    if (e->dev == dev || dev < 0) {
      *out = e->ev;
      return 0;
    }
    any = i;
  }
  if (packed == NULL) {
    if (any < 0)
      return gpuipc__err(GPUIPC_E_PROTO, "%s: event key %u was never sent",
                         who, key);
    h = (*tab)[any].h;
  }
  if (*n == *cap) {
    int ncap = *cap ? *cap * 2 : 16;
    if (ncap > 4 * GPUIPC__CHAN_EV_DEVS * GPUIPC__CHAN_DEPTH_MAX)
      return gpuipc__err(GPUIPC_E_PROTO, "%s: too many events", who);
    struct gpuipc__event *t = realloc(*tab, (size_t)ncap * sizeof(*t));
    if (t == NULL)
      return gpuipc__err(-ENOMEM, "%s: out of memory", who);
    *tab = t;
    *cap = ncap;
  }
  gpuipc_event_t *ev;
  rc = gpuipc_event_import(&h, dev, &ev);
  if (rc != 0)
    return rc;
  struct gpuipc__event *e = &(*tab)[(*n)++];
  e->key = key;
  e->dev = gpuipc_event_device(ev);
  e->ev = ev;
  e->h = h;
  *out = ev;
  return 0;
}

void gpuipc__chan_event_tab_free(struct gpuipc__event *tab, int n)
{
  for (int i = 0; i < n; i++)
    gpuipc_event_release(tab[i].ev);
  free(tab);
}


/*
 * How long to poll a peer's pending event before making a stream wait for
 * it (GPUIPC_CHAN_EVENT_POLL_US). A stream waiting on another process's
 * event on the same GPU waits for the GPU to switch between the two
 * processes' contexts (about 140 us on H200 and H100); an event that
 * completes sooner costs less to poll for. And a context whose stream
 * waits so keeps the GPU from the other process's work, which is why a
 * round trip of messages that carry events stays in that mode once in
 * it: on an H100, with a 30 us poll 4 of 28 such runs of 10,000 round
 * trips had medians of 192-281 us, with 200 us or more 0 of 24.
 */
uint64_t gpuipc__chan_ev_poll_ns(void)
{
  long us = gpuipc__cfg_long(GPUIPC_CFG_CHAN_EVENT_POLL_US, 200);
  return (uint64_t)(us > 1000000 ? 1000000 : us) * 1000;
}


int gpuipc__chan_word_addr(struct gpuipc__word_map *map, gpuipc_buf_t *seg,
                           _Atomic uint64_t *words, int dev, uint64_t *addr)
{
  if (dev < 0 || dev >= GPUIPC__CHAN_EV_DEVS)
    return GPUIPC_E_UNSUPPORTED;
  if (map->state[dev] == 0)
    map->state[dev] =
        gpuipc__host_pin(seg, dev) == 0 &&
                gpuipc__word_dev(dev, (void *)words, &map->addr[dev]) == 0
            ? 1
            : -1;
  if (map->state[dev] < 0)
    return GPUIPC_E_UNSUPPORTED;
  *addr = map->addr[dev];
  return 0;
}
