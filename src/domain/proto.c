/* Client-broker messages: encoding and strict decoding. */
#include "domain/proto.h"
#include "wire/wire.h"

#include <stdio.h>
#include <string.h>

int gpuipc__name_check(const char *name, const char *what)
{
  if (name == NULL)
    return gpuipc__err(-EINVAL, "%s is NULL", what);
  size_t n = strnlen(name, GPUIPC__NAME_MAX + 1);
  if (n == 0)
    return gpuipc__err(-EINVAL, "%s is empty (1 to %d characters)", what,
                       GPUIPC__NAME_MAX);
  if (n > GPUIPC__NAME_MAX)
    return gpuipc__err(-EINVAL,
                       "%s \"%.16s...\" is longer than %d characters", what,
                       name, GPUIPC__NAME_MAX);
  if (name[0] == '.')
    return gpuipc__err(-EINVAL, "%s \"%s\" starts with '.'", what, name);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok)
      return gpuipc__err(-EINVAL,
                         "%s \"%s\": character 0x%02x at %zu is not allowed "
                         "(only A-Z a-z 0-9 . _ -)",
                         what, name, c, i);
  }
  return 0;
}

const char *gpuipc__msg_name(unsigned type)
{
  switch (type) {
  case GPUIPC_MSG_HELLO: return "HELLO";
  case GPUIPC_MSG_OPEN: return "OPEN";
  case GPUIPC_MSG_PUBLISH: return "PUBLISH";
  case GPUIPC_MSG_ABANDON: return "ABANDON";
  case GPUIPC_MSG_RELEASE: return "RELEASE";
  case GPUIPC_MSG_UNLINK: return "UNLINK";
  case GPUIPC_MSG_LIST: return "LIST";
  case GPUIPC_MSG_REPUBLISH: return "REPUBLISH";
  case GPUIPC_MSG_DISOWN: return "DISOWN";
  case GPUIPC_MSG_READY: return "READY";
  case GPUIPC_MSG_WELCOME: return "WELCOME";
  case GPUIPC_MSG_DENIED: return "DENIED";
  case GPUIPC_MSG_ERROR: return "ERROR";
  case GPUIPC_MSG_OK: return "OK";
  case GPUIPC_MSG_CREATE_IT: return "CREATE_IT";
  case GPUIPC_MSG_HANDLE: return "HANDLE";
  case GPUIPC_MSG_LIST_REPLY: return "LIST_REPLY";
  case GPUIPC_MSG_UNLINKED: return "UNLINKED";
  case GPUIPC_MSG_LET_GO: return "LET_GO";
  case GPUIPC_MSG_HANDOFF_BEGIN: return "HANDOFF_BEGIN";
  case GPUIPC_MSG_HANDOFF_SEG: return "HANDOFF_SEG";
  case GPUIPC_MSG_HANDOFF_END: return "HANDOFF_END";
  case GPUIPC_MSG_HANDOFF_ACK: return "HANDOFF_ACK";
  case GPUIPC_MSG_HANDOFF_OFFER: return "HANDOFF_OFFER";
  case GPUIPC_MSG_HANDOFF_ACCEPT: return "HANDOFF_ACCEPT";
  }
  return "?";
}

bool gpuipc__htype_has_fd(unsigned htype)
{
  return htype == GPUIPC_HT_POSIX_FD || htype == GPUIPC_HT_POOL;
}

/* The seg record of @m, or NULL for types without one. */
static const struct gpuipc__seg_wire *msg_seg(const struct gpuipc__msg *m)
{
  switch (m->type) {
  case GPUIPC_MSG_PUBLISH: return &m->u.publish.seg;
  case GPUIPC_MSG_REPUBLISH: return &m->u.republish.seg;
  case GPUIPC_MSG_HANDLE: return &m->u.handle.seg;
  case GPUIPC_MSG_HANDOFF_SEG: return &m->u.handoff_seg.seg;
  }
  return NULL;
}

int gpuipc__msg_nfds(const struct gpuipc__msg *m)
{
  if (m->type == GPUIPC_MSG_HANDOFF_BEGIN)
    return 2;
  const struct gpuipc__seg_wire *s = msg_seg(m);
  if (s != NULL && s->has_handle && gpuipc__htype_has_fd(s->htype))
    return 1;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Field checks shared by encode and decode                                 */
/* ------------------------------------------------------------------------ */

#define PROTO_ERR(m, ...) gpuipc__err(GPUIPC_E_PROTO, __VA_ARGS__)

static int check_name_field(const char *name, bool may_be_empty,
                            const char *msg, const char *field)
{
  if (may_be_empty && name[0] == '\0')
    return 0;
  char what[64];
  snprintf(what, sizeof(what), "%s.%s", msg, field);
  int rc = gpuipc__name_check(name, what);
  return rc == 0 ? 0 : GPUIPC_E_PROTO;
}

/* An event record, when there is one, must unpack. */
static int check_event(bool has, const uint8_t *ev, const char *msg)
{
  if (!has)
    return 0;
  gpuipc_event_handle_t h;
  if (gpuipc_event_handle_unpack(ev, GPUIPC_EVENT_HANDLE_PACKED_SIZE, &h) ==
      0)
    return 0;
  char why[256]; /* the sentence is rewritten below: copy it first */
  snprintf(why, sizeof(why), "%s", gpuipc_last_error());
  return PROTO_ERR(0, "%s: bad event record (%s)", msg, why);
}

/*
 * Check a seg record: @want_handle 1 requires a handle, 0 forbids one,
 * -1 allows either (as the state says).
 */
static int check_seg(struct gpuipc__seg_wire *s, int want_handle,
                     const char *msg, bool set_htype)
{
  int rc = check_name_field(s->name, false, msg, "name");
  if (rc != 0)
    return rc;
  if (s->id == 0 || s->id > GPUIPC__ID_MAX)
    return PROTO_ERR(0, "%s: segment id %llu out of range", msg,
                     (unsigned long long)s->id);
  if (s->kind < GPUIPC_KIND_HOST || s->kind > GPUIPC_KIND_POOL)
    return PROTO_ERR(0, "%s: kind %u is not a buffer kind", msg, s->kind);
  if (s->state < GPUIPC__SEG_CREATING || s->state > GPUIPC__SEG_FILLING)
    return PROTO_ERR(0, "%s: state %u is not a segment state", msg,
                     s->state);
  if (s->size == 0 || s->size > GPUIPC_SIZE_MAX_ABSURD)
    return PROTO_ERR(0, "%s: size %llu out of range", msg,
                     (unsigned long long)s->size);
  if (s->flags & ~GPUIPC__SEGF_ALL)
    return PROTO_ERR(0, "%s: unknown segment flags 0x%x", msg, s->flags);
  bool state_has = s->state == GPUIPC__SEG_PUBLISHED ||
                   s->state == GPUIPC__SEG_UNLINKED ||
                   s->state == GPUIPC__SEG_FILLING;
  rc = check_event(s->has_event, s->event, msg);
  if (rc != 0)
    return rc;
  if (s->has_event && (!s->has_handle || s->state == GPUIPC__SEG_FILLING))
    return PROTO_ERR(0, "%s: an event record in a %s record", msg,
                     s->has_handle ? "FILLING" : "handle-less");
  if (want_handle == 1 && !s->has_handle)
    return PROTO_ERR(0, "%s: handle record missing", msg);
  if (want_handle == 0 && s->has_handle)
    return PROTO_ERR(0, "%s: unexpected handle record", msg);
  if (want_handle == -1 && s->has_handle != state_has)
    return PROTO_ERR(0, "%s: state %u %s a handle record", msg, s->state,
                     state_has ? "needs" : "cannot have");
  if (!s->has_handle) {
    if (set_htype)
      s->htype = 0;
    else if (s->htype != 0)
      return PROTO_ERR(0, "%s: htype %u without a handle", msg, s->htype);
    return 0;
  }
  if (!state_has)
    return PROTO_ERR(0, "%s: state %u cannot carry a handle", msg, s->state);
  gpuipc_handle_t h;
  rc = gpuipc_handle_unpack(s->handle, sizeof(s->handle), &h);
  if (rc != 0) {
    char why[256]; /* the sentence is rewritten below: copy it first */
    snprintf(why, sizeof(why), "%s", gpuipc_last_error());
    return PROTO_ERR(0, "%s: bad handle record (%s)", msg, why);
  }
  if ((unsigned)h.kind != s->kind)
    return PROTO_ERR(0, "%s: handle kind %d differs from segment kind %u",
                     msg, (int)h.kind, s->kind);
  if (h.size < s->size)
    return PROTO_ERR(0, "%s: handle covers %llu bytes, segment has %llu", msg,
                     (unsigned long long)h.size,
                     (unsigned long long)s->size);
  if (memcmp(h.device_uuid, s->uuid, sizeof(s->uuid)) != 0)
    return PROTO_ERR(0, "%s: handle device differs from segment device",
                     msg);
  if (set_htype)
    s->htype = (uint8_t)h.type;
  else if (s->htype != (uint8_t)h.type)
    return PROTO_ERR(0, "%s: htype %u differs from the handle's type %d", msg,
                     s->htype, (int)h.type);
  return 0;
}

/*
 * Check everything in @m that encode and decode must agree on. Decoding
 * (@decoding) derives each record's htype; encoding checks it and writes
 * nothing.
 */
static int check_msg(struct gpuipc__msg *m, bool decoding)
{
  const char *nm = gpuipc__msg_name(m->type);
  int rc;
  switch (m->type) {
  case GPUIPC_MSG_HELLO:
    if (m->u.hello.flags & ~GPUIPC__HELLO_FLAGS)
      return PROTO_ERR(m, "HELLO: unknown flags 0x%x", m->u.hello.flags);
    if (m->u.hello.token == 0)
      return PROTO_ERR(m, "HELLO: member token is 0");
    if (m->u.hello.max_id > GPUIPC__ID_MAX)
      return PROTO_ERR(m, "HELLO: max id %llu above 2^62",
                       (unsigned long long)m->u.hello.max_id);
    return 0;
  case GPUIPC_MSG_OPEN:
    rc = check_name_field(m->u.open.name, false, nm, "name");
    if (rc != 0)
      return rc;
    if (m->u.open.flags & ~GPUIPC__OPEN_FLAGS)
      return PROTO_ERR(m, "OPEN: unknown flags 0x%x", m->u.open.flags);
    if (m->u.open.kind > GPUIPC_KIND_POOL)
      return PROTO_ERR(m, "OPEN: kind %u unknown", m->u.open.kind);
    if (m->u.open.size > GPUIPC_SIZE_MAX_ABSURD)
      return PROTO_ERR(m, "OPEN: size %llu out of range",
                       (unsigned long long)m->u.open.size);
    return 0;
  case GPUIPC_MSG_PUBLISH:
    if (m->u.publish.flags != 0)
      return PROTO_ERR(m, "PUBLISH: flags 0x%x reserved",
                       m->u.publish.flags);
    if (m->u.publish.seg.state != GPUIPC__SEG_PUBLISHED &&
        m->u.publish.seg.state != GPUIPC__SEG_FILLING)
      return PROTO_ERR(m, "PUBLISH: state %u is not PUBLISHED or FILLING",
                       m->u.publish.seg.state);
    return check_seg(&m->u.publish.seg, 1, nm, decoding);
  case GPUIPC_MSG_READY:
    if (m->u.ready.id == 0 || m->u.ready.id > GPUIPC__ID_MAX)
      return PROTO_ERR(m, "READY: id %llu out of range",
                       (unsigned long long)m->u.ready.id);
    return check_event(m->u.ready.has_event, m->u.ready.event, nm);
  case GPUIPC_MSG_ABANDON:
    if (m->u.abandon.id == 0 || m->u.abandon.id > GPUIPC__ID_MAX)
      return PROTO_ERR(m, "ABANDON: id %llu out of range",
                       (unsigned long long)m->u.abandon.id);
    return 0;
  case GPUIPC_MSG_RELEASE:
    if (m->u.release.id == 0 || m->u.release.id > GPUIPC__ID_MAX ||
        m->u.release.count == 0)
      return PROTO_ERR(m, "RELEASE: id %llu count %u",
                       (unsigned long long)m->u.release.id,
                       m->u.release.count);
    return 0;
  case GPUIPC_MSG_UNLINK:
    if (m->u.unlink.id > GPUIPC__ID_MAX)
      return PROTO_ERR(m, "UNLINK: id %llu out of range",
                       (unsigned long long)m->u.unlink.id);
    return check_name_field(m->u.unlink.name, false, nm, "name");
  case GPUIPC_MSG_LIST:
    rc = check_name_field(m->u.list.name, true, nm, "name");
    if (rc != 0)
      return rc;
    if (m->u.list.max > GPUIPC__LIST_RECS)
      return PROTO_ERR(m, "LIST: max %u above %d", m->u.list.max,
                       GPUIPC__LIST_RECS);
    return 0;
  case GPUIPC_MSG_REPUBLISH:
    if (m->u.republish.flags & ~GPUIPC__REPUB_FLAGS)
      return PROTO_ERR(m, "REPUBLISH: unknown flags 0x%x",
                       m->u.republish.flags);
    if ((m->u.republish.flags & GPUIPC__REPUB_KEEPER) &&
        (!(m->u.republish.seg.flags & GPUIPC__SEGF_CREATOR_HELD) ||
         m->u.republish.seg.state == GPUIPC__SEG_FILLING))
      return PROTO_ERR(m, "REPUBLISH: a keeper of a segment whose memory "
                       "its creator does not hold");
    if (m->u.republish.holds == 0 &&
        !(m->u.republish.flags & GPUIPC__REPUB_KEEPER))
      return PROTO_ERR(m, "REPUBLISH: holds is 0");
    if (m->u.republish.seg.state != GPUIPC__SEG_PUBLISHED &&
        m->u.republish.seg.state != GPUIPC__SEG_UNLINKED &&
        m->u.republish.seg.state != GPUIPC__SEG_FILLING)
      return PROTO_ERR(m, "REPUBLISH: state %u", m->u.republish.seg.state);
    return check_seg(&m->u.republish.seg, 1, nm, decoding);
  case GPUIPC_MSG_WELCOME:
    if (m->u.welcome.flags != 0)
      return PROTO_ERR(m, "WELCOME: flags 0x%x reserved", m->u.welcome.flags);
    if (m->u.welcome.epoch == 0 || m->u.welcome.pid == 0)
      return PROTO_ERR(m, "WELCOME: epoch or pid is 0");
    return 0;
  case GPUIPC_MSG_DENIED:
    return 0; /* free text: get_str already refused NUL and overlength */
  case GPUIPC_MSG_ERROR:
    if (m->u.error.code >= 0 || m->u.error.code < -4096)
      return PROTO_ERR(m, "ERROR: code %d is not an error code",
                       (int)m->u.error.code);
    return 0;
  case GPUIPC_MSG_OK:
    if (m->u.ok.id > GPUIPC__ID_MAX)
      return PROTO_ERR(m, "OK: id %llu above 2^62",
                       (unsigned long long)m->u.ok.id);
    return 0;
  case GPUIPC_MSG_CREATE_IT:
    if (m->u.create_it.id == 0 || m->u.create_it.id > GPUIPC__ID_MAX)
      return PROTO_ERR(m, "CREATE_IT: id %llu out of range",
                       (unsigned long long)m->u.create_it.id);
    return 0;
  case GPUIPC_MSG_UNLINKED:
  case GPUIPC_MSG_DISOWN:
  case GPUIPC_MSG_LET_GO:
    /* The same layout for the three. */
    if (m->u.unlinked.id == 0 || m->u.unlinked.id > GPUIPC__ID_MAX)
      return PROTO_ERR(m, "%s: id %llu out of range", nm,
                       (unsigned long long)m->u.unlinked.id);
    return 0;
  case GPUIPC_MSG_HANDLE:
    if (m->u.handle.seg.state != GPUIPC__SEG_PUBLISHED)
      return PROTO_ERR(m, "HANDLE: state %u", m->u.handle.seg.state);
    return check_seg(&m->u.handle.seg, 1, nm, decoding);
  case GPUIPC_MSG_LIST_REPLY:
    if (m->u.list_reply.count > GPUIPC__LIST_RECS)
      return PROTO_ERR(m, "LIST_REPLY: count %u above %d",
                       m->u.list_reply.count, GPUIPC__LIST_RECS);
    if (m->u.list_reply.more > 1)
      return PROTO_ERR(m, "LIST_REPLY: more is %u", m->u.list_reply.more);
    for (uint32_t i = 0; i < m->u.list_reply.count; i++) {
      struct gpuipc__list_rec *lr = &m->u.list_reply.recs[i];
      rc = check_seg(&lr->seg, 0, nm, decoding);
      if (rc != 0)
        return rc;
      if (lr->broker_fd > 1)
        return PROTO_ERR(m, "LIST_REPLY: broker_fd is %u", lr->broker_fd);
      if (lr->nlisted > GPUIPC__LIST_HOLDERS || lr->nlisted > lr->nholders)
        return PROTO_ERR(m, "LIST_REPLY: %u holders listed of %u",
                         lr->nlisted, lr->nholders);
    }
    return 0;
  case GPUIPC_MSG_HANDOFF_BEGIN:
    if (m->u.handoff_begin.epoch == 0 || m->u.handoff_begin.next_id == 0)
      return PROTO_ERR(m, "HANDOFF_BEGIN: epoch or next id is 0");
    if (m->u.handoff_begin.next_id > GPUIPC__ID_MAX + 1)
      return PROTO_ERR(m, "HANDOFF_BEGIN: next id %llu above 2^62",
                       (unsigned long long)m->u.handoff_begin.next_id);
    return 0;
  case GPUIPC_MSG_HANDOFF_SEG:
    if (m->u.handoff_seg.seg.state == GPUIPC__SEG_CREATING)
      return PROTO_ERR(m, "HANDOFF_SEG: a CREATING segment");
    return check_seg(&m->u.handoff_seg.seg, -1, nm, decoding);
  case GPUIPC_MSG_HANDOFF_END:
  case GPUIPC_MSG_HANDOFF_ACK:
  case GPUIPC_MSG_HANDOFF_OFFER:
  case GPUIPC_MSG_HANDOFF_ACCEPT:
    return 0;
  }
  return PROTO_ERR(m, "message type %u unknown", m->type);
}

/* ------------------------------------------------------------------------ */
/* Encoding                                                                 */
/* ------------------------------------------------------------------------ */

static void put_seg(struct gpuipc__wbuf *w, const struct gpuipc__seg_wire *s)
{
  gpuipc__put_str(w, s->name);
  gpuipc__put_u64(w, s->id);
  gpuipc__put_u64(w, s->size);
  gpuipc__put_u8(w, s->kind);
  gpuipc__put_u8(w, s->state);
  gpuipc__put_bytes(w, s->uuid, sizeof(s->uuid));
  gpuipc__put_u8(w, s->has_handle ? 1 : 0);
  if (s->has_handle)
    gpuipc__put_bytes(w, s->handle, sizeof(s->handle));
  gpuipc__put_u8(w, s->flags);
  gpuipc__put_u8(w, s->has_event ? 1 : 0);
  if (s->has_event)
    gpuipc__put_bytes(w, s->event, sizeof(s->event));
}

static void put_body(struct gpuipc__wbuf *w, const struct gpuipc__msg *m)
{
  switch (m->type) {
  case GPUIPC_MSG_HELLO:
    gpuipc__put_u32(w, m->u.hello.pid);
    gpuipc__put_u32(w, m->u.hello.flags);
    gpuipc__put_u64(w, m->u.hello.token);
    gpuipc__put_u64(w, m->u.hello.epoch);
    gpuipc__put_u64(w, m->u.hello.max_id);
    break;
  case GPUIPC_MSG_OPEN:
    gpuipc__put_str(w, m->u.open.name);
    gpuipc__put_u32(w, m->u.open.flags);
    gpuipc__put_u8(w, m->u.open.kind);
    gpuipc__put_u64(w, m->u.open.size);
    gpuipc__put_u32(w, m->u.open.timeout_ms);
    break;
  case GPUIPC_MSG_PUBLISH:
    gpuipc__put_u32(w, m->u.publish.flags);
    put_seg(w, &m->u.publish.seg);
    break;
  case GPUIPC_MSG_ABANDON:
    gpuipc__put_u64(w, m->u.abandon.id);
    break;
  case GPUIPC_MSG_READY:
    gpuipc__put_u64(w, m->u.ready.id);
    gpuipc__put_u8(w, m->u.ready.has_event ? 1 : 0);
    if (m->u.ready.has_event)
      gpuipc__put_bytes(w, m->u.ready.event, sizeof(m->u.ready.event));
    break;
  case GPUIPC_MSG_RELEASE:
    gpuipc__put_u64(w, m->u.release.id);
    gpuipc__put_u32(w, m->u.release.count);
    break;
  case GPUIPC_MSG_UNLINK:
    gpuipc__put_str(w, m->u.unlink.name);
    if (m->u.unlink.id != 0)
      gpuipc__put_u64(w, m->u.unlink.id);
    break;
  case GPUIPC_MSG_LIST:
    gpuipc__put_str(w, m->u.list.name);
    gpuipc__put_u64(w, m->u.list.after_id);
    gpuipc__put_u32(w, m->u.list.max);
    break;
  case GPUIPC_MSG_REPUBLISH:
    gpuipc__put_u32(w, m->u.republish.holds);
    gpuipc__put_u32(w, m->u.republish.flags);
    put_seg(w, &m->u.republish.seg);
    break;
  case GPUIPC_MSG_WELCOME:
    gpuipc__put_u32(w, m->u.welcome.pid);
    gpuipc__put_u32(w, m->u.welcome.flags);
    gpuipc__put_u64(w, m->u.welcome.epoch);
    break;
  case GPUIPC_MSG_DENIED:
    gpuipc__put_str(w, m->u.denied.reason);
    break;
  case GPUIPC_MSG_ERROR:
    gpuipc__put_u32(w, (uint32_t)m->u.error.code);
    gpuipc__put_str(w, m->u.error.text);
    break;
  case GPUIPC_MSG_OK:
    gpuipc__put_u64(w, m->u.ok.id);
    break;
  case GPUIPC_MSG_CREATE_IT:
    gpuipc__put_u64(w, m->u.create_it.id);
    break;
  case GPUIPC_MSG_UNLINKED:
    gpuipc__put_u64(w, m->u.unlinked.id);
    break;
  case GPUIPC_MSG_DISOWN:
    gpuipc__put_u64(w, m->u.disown.id);
    break;
  case GPUIPC_MSG_LET_GO:
    gpuipc__put_u64(w, m->u.let_go.id);
    break;
  case GPUIPC_MSG_HANDLE:
    put_seg(w, &m->u.handle.seg);
    break;
  case GPUIPC_MSG_LIST_REPLY:
    gpuipc__put_u32(w, m->u.list_reply.broker_pid);
    gpuipc__put_u64(w, m->u.list_reply.epoch);
    gpuipc__put_u32(w, m->u.list_reply.members);
    gpuipc__put_u32(w, m->u.list_reply.segments);
    gpuipc__put_u32(w, m->u.list_reply.fds);
    gpuipc__put_u8(w, m->u.list_reply.more);
    gpuipc__put_u32(w, m->u.list_reply.count);
    for (uint32_t i = 0; i < m->u.list_reply.count; i++) {
      const struct gpuipc__list_rec *lr = &m->u.list_reply.recs[i];
      put_seg(w, &lr->seg);
      gpuipc__put_u8(w, lr->broker_fd);
      gpuipc__put_u32(w, lr->keeper_pid);
      gpuipc__put_u32(w, lr->nholders);
      gpuipc__put_u32(w, lr->nlisted);
      for (uint32_t j = 0; j < lr->nlisted; j++) {
        gpuipc__put_u32(w, lr->holders[j].pid);
        gpuipc__put_u32(w, lr->holders[j].refs);
      }
    }
    break;
  case GPUIPC_MSG_HANDOFF_BEGIN:
    gpuipc__put_u64(w, m->u.handoff_begin.epoch);
    gpuipc__put_u64(w, m->u.handoff_begin.next_id);
    gpuipc__put_u32(w, m->u.handoff_begin.count);
    break;
  case GPUIPC_MSG_HANDOFF_SEG:
    put_seg(w, &m->u.handoff_seg.seg);
    break;
  case GPUIPC_MSG_HANDOFF_END:
  case GPUIPC_MSG_HANDOFF_ACK:
  case GPUIPC_MSG_HANDOFF_OFFER:
  case GPUIPC_MSG_HANDOFF_ACCEPT:
    gpuipc__put_u32(w, m->u.handoff_end.count);
    break;
  }
}

int gpuipc__msg_encode(const struct gpuipc__msg *m, void *buf, size_t cap)
{
  if (m == NULL || buf == NULL)
    return gpuipc__err(-EINVAL, "gpuipc__msg_encode: NULL argument");
  /* Not written to when encoding. */
  int rc = check_msg((struct gpuipc__msg *)m, false);
  if (rc != 0)
    return rc;
  struct gpuipc__wbuf w;
  gpuipc__wbuf_init(&w, buf, cap);
  gpuipc__put_u32(&w, GPUIPC_PROTO_MAGIC);
  gpuipc__put_u16(&w, GPUIPC_PROTO_VERSION);
  gpuipc__put_u16(&w, m->type);
  gpuipc__put_u32(&w, m->req);
  gpuipc__put_u32(&w, 0); /* body length, patched below */
  put_body(&w, m);
  if (w.err != 0)
    return gpuipc__err(-ENOSPC, "%s: message does not fit in %zu bytes",
                       gpuipc__msg_name(m->type), cap);
  uint32_t body = (uint32_t)(w.len - GPUIPC_PROTO_HDR);
  uint8_t *p = (uint8_t *)buf + 12;
  p[0] = (uint8_t)body;
  p[1] = (uint8_t)(body >> 8);
  p[2] = (uint8_t)(body >> 16);
  p[3] = (uint8_t)(body >> 24);
  return (int)w.len;
}

/* ------------------------------------------------------------------------ */
/* Decoding                                                                 */
/* ------------------------------------------------------------------------ */

static void get_seg(struct gpuipc__rbuf *r, struct gpuipc__seg_wire *s)
{
  gpuipc__get_str(r, s->name, sizeof(s->name));
  s->id = gpuipc__get_u64(r);
  s->size = gpuipc__get_u64(r);
  s->kind = gpuipc__get_u8(r);
  s->state = gpuipc__get_u8(r);
  gpuipc__get_bytes(r, s->uuid, sizeof(s->uuid));
  uint8_t hh = gpuipc__get_u8(r);
  if (hh > 1 && r->err == 0)
    r->err = GPUIPC_E_PROTO;
  s->has_handle = hh == 1;
  if (s->has_handle)
    gpuipc__get_bytes(r, s->handle, sizeof(s->handle));
  s->flags = gpuipc__get_u8(r);
  uint8_t he = gpuipc__get_u8(r);
  if (he > 1 && r->err == 0)
    r->err = GPUIPC_E_PROTO;
  s->has_event = he == 1;
  if (s->has_event)
    gpuipc__get_bytes(r, s->event, sizeof(s->event));
  s->htype = 0;
}

static void get_body(struct gpuipc__rbuf *r, struct gpuipc__msg *m)
{
  switch (m->type) {
  case GPUIPC_MSG_HELLO:
    m->u.hello.pid = gpuipc__get_u32(r);
    m->u.hello.flags = gpuipc__get_u32(r);
    m->u.hello.token = gpuipc__get_u64(r);
    m->u.hello.epoch = gpuipc__get_u64(r);
    m->u.hello.max_id = gpuipc__get_u64(r);
    break;
  case GPUIPC_MSG_OPEN:
    gpuipc__get_str(r, m->u.open.name, sizeof(m->u.open.name));
    m->u.open.flags = gpuipc__get_u32(r);
    m->u.open.kind = gpuipc__get_u8(r);
    m->u.open.size = gpuipc__get_u64(r);
    m->u.open.timeout_ms = gpuipc__get_u32(r);
    break;
  case GPUIPC_MSG_PUBLISH:
    m->u.publish.flags = gpuipc__get_u32(r);
    get_seg(r, &m->u.publish.seg);
    break;
  case GPUIPC_MSG_ABANDON:
    m->u.abandon.id = gpuipc__get_u64(r);
    break;
  case GPUIPC_MSG_READY: {
    m->u.ready.id = gpuipc__get_u64(r);
    uint8_t he = gpuipc__get_u8(r);
    if (he > 1 && r->err == 0)
      r->err = GPUIPC_E_PROTO;
    m->u.ready.has_event = he == 1;
    if (m->u.ready.has_event)
      gpuipc__get_bytes(r, m->u.ready.event, sizeof(m->u.ready.event));
    break;
  }
  case GPUIPC_MSG_RELEASE:
    m->u.release.id = gpuipc__get_u64(r);
    m->u.release.count = gpuipc__get_u32(r);
    break;
  case GPUIPC_MSG_UNLINK:
    gpuipc__get_str(r, m->u.unlink.name, sizeof(m->u.unlink.name));
    m->u.unlink.id = 0;
    if (r->err == 0 && r->pos < r->len) { /* the optional id */
      m->u.unlink.id = gpuipc__get_u64(r);
      if (m->u.unlink.id == 0 && r->err == 0)
        r->err = GPUIPC_E_PROTO; /* 0 is never written */
    }
    break;
  case GPUIPC_MSG_LIST:
    gpuipc__get_str(r, m->u.list.name, sizeof(m->u.list.name));
    m->u.list.after_id = gpuipc__get_u64(r);
    m->u.list.max = gpuipc__get_u32(r);
    break;
  case GPUIPC_MSG_REPUBLISH:
    m->u.republish.holds = gpuipc__get_u32(r);
    m->u.republish.flags = gpuipc__get_u32(r);
    get_seg(r, &m->u.republish.seg);
    break;
  case GPUIPC_MSG_WELCOME:
    m->u.welcome.pid = gpuipc__get_u32(r);
    m->u.welcome.flags = gpuipc__get_u32(r);
    m->u.welcome.epoch = gpuipc__get_u64(r);
    break;
  case GPUIPC_MSG_DENIED:
    gpuipc__get_str(r, m->u.denied.reason, sizeof(m->u.denied.reason));
    break;
  case GPUIPC_MSG_ERROR:
    m->u.error.code = (int32_t)gpuipc__get_u32(r);
    gpuipc__get_str(r, m->u.error.text, sizeof(m->u.error.text));
    break;
  case GPUIPC_MSG_OK:
    m->u.ok.id = gpuipc__get_u64(r);
    break;
  case GPUIPC_MSG_CREATE_IT:
    m->u.create_it.id = gpuipc__get_u64(r);
    break;
  case GPUIPC_MSG_UNLINKED:
    m->u.unlinked.id = gpuipc__get_u64(r);
    break;
  case GPUIPC_MSG_DISOWN:
    m->u.disown.id = gpuipc__get_u64(r);
    break;
  case GPUIPC_MSG_LET_GO:
    m->u.let_go.id = gpuipc__get_u64(r);
    break;
  case GPUIPC_MSG_HANDLE:
    get_seg(r, &m->u.handle.seg);
    break;
  case GPUIPC_MSG_LIST_REPLY:
    m->u.list_reply.broker_pid = gpuipc__get_u32(r);
    m->u.list_reply.epoch = gpuipc__get_u64(r);
    m->u.list_reply.members = gpuipc__get_u32(r);
    m->u.list_reply.segments = gpuipc__get_u32(r);
    m->u.list_reply.fds = gpuipc__get_u32(r);
    m->u.list_reply.more = gpuipc__get_u8(r);
    m->u.list_reply.count = gpuipc__get_u32(r);
    if (m->u.list_reply.count > GPUIPC__LIST_RECS) {
      if (r->err == 0)
        r->err = GPUIPC_E_PROTO;
      break;
    }
    for (uint32_t i = 0; i < m->u.list_reply.count; i++) {
      struct gpuipc__list_rec *lr = &m->u.list_reply.recs[i];
      get_seg(r, &lr->seg);
      lr->broker_fd = gpuipc__get_u8(r);
      lr->keeper_pid = gpuipc__get_u32(r);
      lr->nholders = gpuipc__get_u32(r);
      lr->nlisted = gpuipc__get_u32(r);
      if (lr->nlisted > GPUIPC__LIST_HOLDERS) {
        if (r->err == 0)
          r->err = GPUIPC_E_PROTO;
        break;
      }
      for (uint32_t j = 0; j < lr->nlisted; j++) {
        lr->holders[j].pid = gpuipc__get_u32(r);
        lr->holders[j].refs = gpuipc__get_u32(r);
      }
    }
    break;
  case GPUIPC_MSG_HANDOFF_BEGIN:
    m->u.handoff_begin.epoch = gpuipc__get_u64(r);
    m->u.handoff_begin.next_id = gpuipc__get_u64(r);
    m->u.handoff_begin.count = gpuipc__get_u32(r);
    break;
  case GPUIPC_MSG_HANDOFF_SEG:
    get_seg(r, &m->u.handoff_seg.seg);
    break;
  case GPUIPC_MSG_HANDOFF_END:
  case GPUIPC_MSG_HANDOFF_ACK:
  case GPUIPC_MSG_HANDOFF_OFFER:
  case GPUIPC_MSG_HANDOFF_ACCEPT:
    m->u.handoff_end.count = gpuipc__get_u32(r);
    break;
  default:
    if (r->err == 0)
      r->err = GPUIPC_E_PROTO;
  }
}

int gpuipc__msg_decode(const void *buf, size_t len, int nfds,
                       struct gpuipc__msg *out)
{
  if (buf == NULL || out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc__msg_decode: NULL argument");
  if (len < GPUIPC_PROTO_HDR)
    return gpuipc__err(GPUIPC_E_PROTO, "message of %zu bytes is shorter "
                       "than its %d-byte header", len, GPUIPC_PROTO_HDR);
  if (nfds < 0 || nfds > 16)
    return gpuipc__err(GPUIPC_E_PROTO, "%d descriptors with a message", nfds);
  struct gpuipc__rbuf r;
  gpuipc__rbuf_init(&r, buf, len);
  uint32_t magic = gpuipc__get_u32(&r);
  uint16_t version = gpuipc__get_u16(&r);
  uint16_t type = gpuipc__get_u16(&r);
  uint32_t req = gpuipc__get_u32(&r);
  uint32_t body = gpuipc__get_u32(&r);
  if (magic != GPUIPC_PROTO_MAGIC)
    return gpuipc__err(GPUIPC_E_PROTO, "message magic 0x%08x is not gpuipc's",
                       magic);
  out->type = type;
  out->version = version;
  out->req = req;
  if (version != GPUIPC_PROTO_VERSION)
    return gpuipc__err(GPUIPC_E_VERSION,
                       "peer speaks protocol version %u, this is version %u",
                       version, GPUIPC_PROTO_VERSION);
  if ((size_t)body != len - GPUIPC_PROTO_HDR)
    return gpuipc__err(GPUIPC_E_PROTO,
                       "%s: header says %u body bytes, %zu arrived",
                       gpuipc__msg_name(type), body, len - GPUIPC_PROTO_HDR);
  get_body(&r, out);
  if (r.err != 0)
    return gpuipc__err(GPUIPC_E_PROTO, "%s (type %u): body of %u bytes is "
                       "truncated or has a malformed field",
                       gpuipc__msg_name(type), type, body);
  if (r.pos != r.len)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: %zu bytes left over after the body",
                       gpuipc__msg_name(type), r.len - r.pos);
  int rc = check_msg(out, true);
  if (rc != 0)
    return rc;
  int want = gpuipc__msg_nfds(out);
  if (nfds != want)
    return gpuipc__err(GPUIPC_E_PROTO,
                       "%s: %d descriptors arrived, the message carries %d",
                       gpuipc__msg_name(type), nfds, want);
  return 0;
}
