/*
 * Interprocess events: cuEventCreate(DISABLE_TIMING | INTERPROCESS),
 * cuIpcGetEventHandle / cuIpcOpenEventHandle, and a per-process cache of
 * what was opened, keyed by the exporter's identity and its event id.
 */
#include "cuda/peer.h"
#include "os/os.h"
#include "wire/wire.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define EVENT_MAGIC 0x56455047u /* "GPEV" little-endian */
#define EVENT_BODY (GPUIPC_EVENT_HANDLE_PACKED_SIZE - 4) /* before the CRC */

static bool all_zero(const uint8_t *p, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (p[i] != 0)
      return false;
  return true;
}

static int event_validate(const gpuipc_event_handle_t *h, const char *who)
{
  if (h->version != GPUIPC_EVENT_HANDLE_VERSION)
    return gpuipc__err(h->version > GPUIPC_EVENT_HANDLE_VERSION
                           ? GPUIPC_E_VERSION
                           : GPUIPC_E_BADHANDLE,
                       "%s: event handle version %u (this library speaks %u)",
                       who, h->version, GPUIPC_EVENT_HANDLE_VERSION);
  if (h->flags != 0)
    return gpuipc__err(GPUIPC_E_BADHANDLE, "%s: event handle flags 0x%x "
                       "(must be 0)", who, h->flags);
  if (h->event_id == 0)
    return gpuipc__err(GPUIPC_E_BADHANDLE, "%s: event id 0", who);
  if (h->pid == 0 || h->nonce == 0)
    return gpuipc__err(GPUIPC_E_BADHANDLE, "%s: exporter %s is 0", who,
                       h->pid == 0 ? "pid" : "nonce");
  if (all_zero(h->device_uuid, sizeof(h->device_uuid)))
    return gpuipc__err(GPUIPC_E_BADHANDLE, "%s: device UUID is all zero",
                       who);
  if (all_zero(h->bytes, sizeof(h->bytes)))
    return gpuipc__err(GPUIPC_E_BADHANDLE, "%s: event bytes are all zero",
                       who);
  return 0;
}

int gpuipc_event_handle_pack(const gpuipc_event_handle_t *h, void *dst,
                             size_t cap)
{
  if (h == NULL || dst == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_event_handle_pack: NULL %s",
                       h == NULL ? "handle" : "destination");
  if (cap < GPUIPC_EVENT_HANDLE_PACKED_SIZE)
    return gpuipc__err(-ENOSPC, "gpuipc_event_handle_pack: %zu bytes of "
                       "room, %d needed", cap,
                       GPUIPC_EVENT_HANDLE_PACKED_SIZE);
  int rc = event_validate(h, "gpuipc_event_handle_pack");
  if (rc != 0)
    return rc;
  struct gpuipc__wbuf w;
  gpuipc__wbuf_init(&w, dst, cap);
  gpuipc__put_u32(&w, EVENT_MAGIC);
  gpuipc__put_u16(&w, (uint16_t)h->version);
  gpuipc__put_u16(&w, GPUIPC_EVENT_HANDLE_PACKED_SIZE);
  gpuipc__put_u32(&w, h->flags);
  gpuipc__put_bytes(&w, h->device_uuid, 16);
  gpuipc__put_u64(&w, h->event_id);
  gpuipc__put_bytes(&w, h->boot_id, 16);
  gpuipc__put_u32(&w, h->pid);
  gpuipc__put_u64(&w, h->pidns);
  gpuipc__put_u64(&w, h->nonce);
  gpuipc__put_bytes(&w, h->bytes, GPUIPC_HANDLE_BYTES);
  gpuipc__put_u32(&w, 0); /* reserved */
  gpuipc__put_u32(&w, gpuipc__crc32c(0, dst, EVENT_BODY));
  if (w.err != 0 || w.len != GPUIPC_EVENT_HANDLE_PACKED_SIZE)
    return gpuipc__err(-ENOSPC, "gpuipc_event_handle_pack: encoding failed");
  return GPUIPC_EVENT_HANDLE_PACKED_SIZE;
}

int gpuipc_event_handle_unpack(const void *src, size_t len,
                               gpuipc_event_handle_t *out)
{
  static const char who[] = "gpuipc_event_handle_unpack";
  if (src == NULL || out == NULL)
    return gpuipc__err(-EINVAL, "%s: NULL %s", who,
                       src == NULL ? "source" : "output");
  if (len != GPUIPC_EVENT_HANDLE_PACKED_SIZE)
    return gpuipc__err(GPUIPC_E_BADHANDLE, "%s: length %zu (an event handle "
                       "is %d bytes)", who, len,
                       GPUIPC_EVENT_HANDLE_PACKED_SIZE);
  struct gpuipc__rbuf r;
  gpuipc__rbuf_init(&r, src, len);
  gpuipc_event_handle_t h;
  memset(&h, 0, sizeof(h));
  uint32_t magic = gpuipc__get_u32(&r);
  h.version = gpuipc__get_u16(&r);
  uint16_t length = gpuipc__get_u16(&r);
  h.flags = gpuipc__get_u32(&r);
  gpuipc__get_bytes(&r, h.device_uuid, 16);
  h.event_id = gpuipc__get_u64(&r);
  gpuipc__get_bytes(&r, h.boot_id, 16);
  h.pid = gpuipc__get_u32(&r);
  h.pidns = gpuipc__get_u64(&r);
  h.nonce = gpuipc__get_u64(&r);
  gpuipc__get_bytes(&r, h.bytes, GPUIPC_HANDLE_BYTES);
  uint32_t reserved = gpuipc__get_u32(&r);
  uint32_t crc = gpuipc__get_u32(&r);
  if (r.err != 0)
    return gpuipc__err(GPUIPC_E_BADHANDLE, "%s: truncated", who);
  if (magic != EVENT_MAGIC)
    return gpuipc__err(GPUIPC_E_BADHANDLE, "%s: magic 0x%08x is not an "
                       "event handle's", who, magic);
  if (h.version > GPUIPC_EVENT_HANDLE_VERSION)
    return gpuipc__err(GPUIPC_E_VERSION, "%s: event handle version %u is "
                       "newer than this library's %u", who, h.version,
                       GPUIPC_EVENT_HANDLE_VERSION);
  if (length != GPUIPC_EVENT_HANDLE_PACKED_SIZE)
    return gpuipc__err(GPUIPC_E_BADHANDLE, "%s: record length %u", who,
                       length);
  uint32_t want = gpuipc__crc32c(0, src, EVENT_BODY);
  if (crc != want)
    return gpuipc__err(GPUIPC_E_BADHANDLE, "%s: checksum 0x%08x, the bytes "
                       "give 0x%08x", who, crc, want);
  if (reserved != 0)
    return gpuipc__err(GPUIPC_E_BADHANDLE, "%s: reserved bytes are not 0",
                       who);
  int rc = event_validate(&h, who);
  if (rc != 0)
    return rc;
  *out = h;
  return 0;
}

#if GPUIPC_HAVE_CUDA

struct gpuipc_event {
  struct gpuipc_event *next; /* in the process's list, under events_lock */
  long refs;
  CUevent ev;
  int device;
  bool imported;
  gpuipc_event_handle_t h; /* what an export says: identity, id, bytes */
};

static pthread_mutex_t events_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gpuipc_event *events;
static _Atomic uint64_t next_event_id = 1;

/*
 * The event @h names, as opened for @device (an event this process
 * created matches on any device). Caller holds events_lock.
 */
static struct gpuipc_event *event_find(const gpuipc_event_handle_t *h,
                                       int device)
{
  for (struct gpuipc_event *e = events; e != NULL; e = e->next)
    if (e->h.event_id == h->event_id && e->h.nonce == h->nonce &&
        e->h.pid == h->pid && e->h.pidns == h->pidns &&
        memcmp(e->h.boot_id, h->boot_id, 16) == 0 &&
        (!e->imported || e->device == device))
      return e;
  return NULL;
}

static int events_supported(const char *who)
{
  if (gpuipc__cu.cuIpcGetEventHandle == NULL ||
      gpuipc__cu.cuIpcOpenEventHandle == NULL)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED,
                       "%s: the driver lacks interprocess events", who);
  return 0;
}

int gpuipc_event_create(int device, unsigned flags, gpuipc_event_t **out)
{
  static const char who[] = "gpuipc_event_create";
  if (out == NULL || flags != 0)
    return gpuipc__err(-EINVAL, "%s: %s", who,
                       out == NULL ? "out is NULL" : "flags must be 0");
  int rc = gpuipc__dev_check(device, who);
  if (rc == 0)
    rc = events_supported(who);
  if (rc != 0)
    return rc;
  const struct gpuipc__dev *d = gpuipc__dev_get(device);
  if (!d->info.ipc_events)
    return gpuipc__err(GPUIPC_E_UNSUPPORTED, "%s: GPU %d (%s) does not "
                       "support interprocess events", who, device,
                       d->info.uuid_str);
  struct gpuipc_event *e = calloc(1, sizeof(*e));
  if (e == NULL)
    return gpuipc__err(-ENOMEM, "%s: out of memory", who);

  struct gpuipc__ctx_saved saved;
  rc = gpuipc__ctx_enter(device, &saved);
  if (rc != 0)
    goto free_event;
  CUipcEventHandle ipc;
  GPUIPC_CU_GOTO(rc, leave_ctx, cuEventCreate, &e->ev,
                 CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS);
  GPUIPC_CU_GOTO(rc, destroy_event, cuIpcGetEventHandle, &ipc, e->ev);
  gpuipc__ctx_leave(&saved);

  const struct gpuipc__proc_id *me = gpuipc__proc_self();
  e->refs = 1;
  e->device = device;
  e->h.version = GPUIPC_EVENT_HANDLE_VERSION;
  memcpy(e->h.device_uuid, d->info.uuid, 16);
  e->h.event_id = atomic_fetch_add(&next_event_id, 1);
  memcpy(e->h.boot_id, me->boot_id, 16);
  e->h.pid = me->pid;
  e->h.pidns = me->pidns;
  e->h.nonce = me->nonce;
  _Static_assert(sizeof(ipc.reserved) == GPUIPC_HANDLE_BYTES,
                 "CUipcEventHandle is 64 bytes");
  memcpy(e->h.bytes, ipc.reserved, GPUIPC_HANDLE_BYTES);

  pthread_mutex_lock(&events_lock);
  e->next = events;
  events = e;
  pthread_mutex_unlock(&events_lock);
  *out = e;
  return 0;

destroy_event:
  gpuipc__cu.cuEventDestroy(e->ev);
leave_ctx:
  gpuipc__ctx_leave(&saved);
free_event:
  free(e);
  return rc;
}

int gpuipc_event_export(const gpuipc_event_t *ev, gpuipc_event_handle_t *out)
{
  if (ev == NULL || out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_event_export: NULL %s",
                       ev == NULL ? "event" : "output");
  *out = ev->h;
  return 0;
}

static bool exporter_gone(const gpuipc_event_handle_t *h)
{
  const struct gpuipc__proc_id *me = gpuipc__proc_self();
  return memcmp(me->boot_id, h->boot_id, 16) == 0 && me->pidns == h->pidns &&
         !gpuipc__pid_alive((pid_t)h->pid);
}

int gpuipc_event_import(const gpuipc_event_handle_t *h, int device,
                        gpuipc_event_t **out)
{
  static const char who[] = "gpuipc_event_import";
  if (h == NULL || out == NULL)
    return gpuipc__err(-EINVAL, "%s: NULL %s", who,
                       h == NULL ? "handle" : "output");
  int rc = event_validate(h, who);
  if (rc != 0)
    return rc;

  rc = gpuipc__cuda_load();
  if (rc != 0)
    return rc;
  rc = device < 0 ? gpuipc_device_by_uuid(h->device_uuid)
                  : gpuipc__dev_check(device, who);
  if (rc < 0)
    return rc;
  device = device < 0 ? rc : device;

  /* The cache first, per device: a hit makes no driver call. */
  pthread_mutex_lock(&events_lock);
  struct gpuipc_event *e = event_find(h, device);
  if (e != NULL) {
    e->refs++;
    pthread_mutex_unlock(&events_lock);
    *out = e;
    return 0;
  }
  pthread_mutex_unlock(&events_lock);

  rc = events_supported(who);
  if (rc != 0)
    return rc;
  if (exporter_gone(h))
    return gpuipc__err(GPUIPC_E_PEER_GONE, "%s: the exporting process %u "
                       "has exited", who, h->pid);

  e = calloc(1, sizeof(*e));
  if (e == NULL)
    return gpuipc__err(-ENOMEM, "%s: out of memory", who);
  e->refs = 1;
  e->device = device;
  e->imported = true;
  e->h = *h;
  CUipcEventHandle ipc;
  memcpy(ipc.reserved, h->bytes, GPUIPC_HANDLE_BYTES);

  /* Under the lock, so that two threads never open the same event twice. */
  pthread_mutex_lock(&events_lock);
  struct gpuipc_event *raced = event_find(h, device);
  if (raced != NULL) {
    raced->refs++;
    pthread_mutex_unlock(&events_lock);
    free(e);
    *out = raced;
    return 0;
  }
  struct gpuipc__ctx_saved saved;
  rc = gpuipc__ctx_enter(device, &saved);
  if (rc != 0)
    goto unlock;
  rc = GPUIPC_CU(cuIpcOpenEventHandle, &e->ev, ipc);
  gpuipc__ctx_leave(&saved);
  if (rc != 0) {
    if (exporter_gone(h))
      rc = gpuipc__err(GPUIPC_E_PEER_GONE, "%s: the exporting process %u "
                       "has exited", who, h->pid);
    goto unlock;
  }
  e->next = events;
  events = e;
  pthread_mutex_unlock(&events_lock);
  *out = e;
  return 0;

unlock:
  pthread_mutex_unlock(&events_lock);
  free(e);
  return rc;
}

/*
 * A stream used with @ev must belong to the primary context of the event's
 * device: the driver does not take an interprocess event opened in one
 * device's context on another device's stream (it crashed on 580.159).
 */
static int stream_check(const struct gpuipc_event *ev, CUstream s,
                        const char *who)
{
  if (gpuipc__cu.cuStreamGetCtx == NULL)
    return 0;
  CUcontext sc = NULL;
  int rc = GPUIPC_CU(cuStreamGetCtx, s, &sc);
  if (rc != 0)
    return rc;
  const struct gpuipc__dev *d = gpuipc__dev_get(ev->device);
  if (sc != __atomic_load_n(&d->primary, __ATOMIC_ACQUIRE))
    return gpuipc__err(-EINVAL, "%s: the stream is not on the event's "
                       "device %d (%s) in its primary context: import the "
                       "event on the device whose streams use it", who,
                       ev->device, d->info.uuid_str);
  return 0;
}

int gpuipc_event_record(gpuipc_event_t *ev, void *stream)
{
  if (ev == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_event_record: NULL event");
  if (!gpuipc__stream_is_default(stream)) {
    int rc = stream_check(ev, (CUstream)stream, "gpuipc_event_record");
    return rc != 0 ? rc : GPUIPC_CU(cuEventRecord, ev->ev, (CUstream)stream);
  }
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(ev->device, &saved);
  if (rc != 0)
    return rc;
  rc = GPUIPC_CU(cuEventRecord, ev->ev, (CUstream)stream);
  gpuipc__ctx_leave(&saved);
  return rc;
}

int gpuipc_event_wait(gpuipc_event_t *ev, void *stream)
{
  if (ev == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_event_wait: NULL event");
  if (!gpuipc__stream_is_default(stream)) {
    int rc = stream_check(ev, (CUstream)stream, "gpuipc_event_wait");
    return rc != 0 ? rc
                   : GPUIPC_CU(cuStreamWaitEvent, (CUstream)stream, ev->ev, 0);
  }
  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(ev->device, &saved);
  if (rc != 0)
    return rc;
  rc = GPUIPC_CU(cuStreamWaitEvent, (CUstream)stream, ev->ev, 0);
  gpuipc__ctx_leave(&saved);
  return rc;
}

int gpuipc_event_query(gpuipc_event_t *ev)
{
  if (ev == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_event_query: NULL event");
  CUresult r = gpuipc__cu.cuEventQuery(ev->ev);
  if (r == CUDA_ERROR_NOT_READY)
    return -EAGAIN;
  return gpuipc__cu_check(r, "cuEventQuery");
}

int gpuipc_event_sync(gpuipc_event_t *ev)
{
  if (ev == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_event_sync: NULL event");
  return GPUIPC_CU(cuEventSynchronize, ev->ev);
}

int gpuipc_event_device(const gpuipc_event_t *ev)
{
  return ev != NULL ? ev->device : -1;
}

int gpuipc_event_release(gpuipc_event_t *ev)
{
  if (ev == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_event_release: NULL event");
  pthread_mutex_lock(&events_lock);
  if (--ev->refs > 0) {
    pthread_mutex_unlock(&events_lock);
    return 0;
  }
  for (struct gpuipc_event **pp = &events; *pp != NULL; pp = &(*pp)->next)
    if (*pp == ev) {
      *pp = ev->next;
      break;
    }
  pthread_mutex_unlock(&events_lock);

  struct gpuipc__ctx_saved saved;
  int rc = gpuipc__ctx_enter(ev->device, &saved);
  if (rc == 0) {
    rc = GPUIPC_CU(cuEventDestroy, ev->ev);
    gpuipc__ctx_leave(&saved);
  }
  free(ev);
  return rc;
}

#else /* !GPUIPC_HAVE_CUDA */

static int no_cuda(const char *who)
{
  return gpuipc__err(GPUIPC_E_UNSUPPORTED, "%s: built without CUDA", who);
}

int gpuipc_event_create(int device, unsigned flags, gpuipc_event_t **out)
{
  if (out == NULL || flags != 0)
    return gpuipc__err(-EINVAL, "gpuipc_event_create: bad argument");
  return no_cuda("gpuipc_event_create");
}

int gpuipc_event_export(const gpuipc_event_t *ev, gpuipc_event_handle_t *out)
{
  return gpuipc__err(-EINVAL, "gpuipc_event_export: no event can exist in "
                     "a build without CUDA");
}

int gpuipc_event_import(const gpuipc_event_handle_t *h, int device,
                        gpuipc_event_t **out)
{
  if (h == NULL || out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc_event_import: NULL argument");
  int rc = event_validate(h, "gpuipc_event_import");
  return rc != 0 ? rc : no_cuda("gpuipc_event_import");
}

int gpuipc_event_record(gpuipc_event_t *ev, void *stream)
{
  return gpuipc__err(-EINVAL, "gpuipc_event_record: no event");
}

int gpuipc_event_wait(gpuipc_event_t *ev, void *stream)
{
  return gpuipc__err(-EINVAL, "gpuipc_event_wait: no event");
}

int gpuipc_event_query(gpuipc_event_t *ev)
{
  return gpuipc__err(-EINVAL, "gpuipc_event_query: no event");
}

int gpuipc_event_sync(gpuipc_event_t *ev)
{
  return gpuipc__err(-EINVAL, "gpuipc_event_sync: no event");
}

int gpuipc_event_device(const gpuipc_event_t *ev)
{
  return -1;
}

int gpuipc_event_release(gpuipc_event_t *ev)
{
  return gpuipc__err(-EINVAL, "gpuipc_event_release: no event");
}

#endif
