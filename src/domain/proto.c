/*
 * Client-broker messages: every body is described once, as a list of field
 * descriptors per message type (the types themselves are GPUIPC_MSG_TABLE
 * in proto.h), and three walkers share those lists: put_fields encodes,
 * get_fields decodes (the shape: lengths, 0/1 flags, array bounds) and
 * check_fields judges the values (ranges, flags, names, the handle and
 * event records, and the rules between fields). Encode checks before it
 * writes, decode checks after it reads, so the two can never disagree.
 * The 16-byte header is src/wire's (wire/msghdr.c).
 */
#include "domain/proto.h"
#include "wire/wire.h"

#include <stddef.h>
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

bool gpuipc__htype_has_fd(unsigned htype)
{
  return htype == GPUIPC_HT_POSIX_FD || htype == GPUIPC_HT_POOL;
}

/* ------------------------------------------------------------------------ */
/* Field descriptors                                                        */
/* ------------------------------------------------------------------------ */

/* How a field travels. */
enum field_type {
  FT_INT,   /* an n-byte integer (1, 4 or 8), little-endian */
  FT_TAIL,  /* uint64_t, written only when non-zero, last in its body */
  FT_STR,   /* char[n]: u16 length + bytes */
  FT_BYTES, /* uint8_t[n] */
  FT_OPT,   /* bool at off as u8 0 or 1, then, when 1, uint8_t[n] at off2 */
  FT_SEG,   /* struct gpuipc__seg_wire (seg_fields, then check_seg) */
  FT_ARRAY, /* uint32_t count at off, then that many n-byte records at off2 */
};

/* What a field's value must be (checked on encode and after decode). */
enum field_check {
  CK_ANY,
  CK_MAX,   /* at most lim */
  CK_RANGE, /* 1 to lim */
  CK_NONZERO,
  CK_MASK,  /* no bit outside lim (lim 0: a reserved field, 0) */
  CK_NAME,  /* a name (gpuipc__name_check) */
  CK_NAME0, /* a name or "" */
  CK_ERRNO, /* an int32_t error code, -4096 to -1 */
  CK_EVENT, /* FT_OPT: a packed event handle */
};

struct record;

struct field {
  const char *name;
  uint8_t type;  /* enum field_type */
  uint8_t check; /* enum field_check */
  int8_t want;   /* FT_SEG: handle 1 required, 0 forbidden, -1 as the state */
  uint16_t off, off2; /* in the record */
  uint16_t n;         /* see enum field_type */
  uint64_t lim; /* CK_*; FT_SEG: the states allowed (bit 1 << state);
                   FT_ARRAY: most records */
  const struct record *sub; /* FT_ARRAY: each record's fields */
};

/* A record's fields in wire order, and the rules between them. */
struct record {
  const struct field *f;
  size_t n;
  int (*check)(void *rec, const char *msg);
};

#define FIELD(st, path, nm, T, ck, L)                                          \
  {.name = nm, .type = T, .check = ck, .off = offsetof(st, path),              \
   .n = sizeof(((st *)0)->path), .lim = L}
#define OPT(st, has, bytes, ck)                                                \
  {.name = #bytes, .type = FT_OPT, .check = ck, .off = offsetof(st, has),      \
   .off2 = offsetof(st, bytes), .n = sizeof(((st *)0)->bytes)}
#define ARRAY(st, count, recs, nm, L, rec)                                     \
  {.name = nm, .type = FT_ARRAY, .off = offsetof(st, count),                   \
   .off2 = offsetof(st, recs), .n = sizeof(((st *)0)->recs[0]), .lim = L,      \
   .sub = &rec}
#define SEG(st, path, w, states)                                               \
  {.name = "seg", .type = FT_SEG, .want = w, .off = offsetof(st, path),        \
   .lim = states}
#define RECORD(nm, chk, ...)                                                   \
  static const struct field nm##_f[] = {__VA_ARGS__};                          \
  static const struct record nm = {nm##_f, sizeof(nm##_f) / sizeof(nm##_f[0]), \
                                   chk}
#define ST(s) (1u << GPUIPC__SEG_##s)
_Static_assert(GPUIPC_KIND_HOST == 1 && GPUIPC__SEG_CREATING == 1,
               "seg_fields checks kind and state as 1 to the last one");

static int check_republish(void *rec, const char *msg);
static int check_list_rec(void *rec, const char *msg);

/* ----- records inside messages ----- */

#define S(path, T, ck, L) FIELD(struct gpuipc__seg_wire, path, #path, T, ck, L)
RECORD(seg_fields, NULL,
       S(name, FT_STR, CK_NAME, 0),
       S(id, FT_INT, CK_RANGE, GPUIPC__ID_MAX),
       S(size, FT_INT, CK_RANGE, GPUIPC_SIZE_MAX_ABSURD),
       S(kind, FT_INT, CK_RANGE, GPUIPC__KIND_LAST),
       S(state, FT_INT, CK_RANGE, GPUIPC__SEG_FILLING),
       S(uuid, FT_BYTES, CK_ANY, 0),
       OPT(struct gpuipc__seg_wire, has_handle, handle, CK_ANY),
       S(flags, FT_INT, CK_MASK, GPUIPC__SEGF_ALL),
       OPT(struct gpuipc__seg_wire, has_event, event, CK_EVENT));
#undef S

#define H(path, T, ck, L)                                                      \
  FIELD(struct gpuipc__holder_wire, path, #path, T, ck, L)
RECORD(holder_fields, NULL, H(pid, FT_INT, CK_ANY, 0),
       H(refs, FT_INT, CK_ANY, 0));
#undef H

#define L(path, T, ck, L_)                                                     \
  FIELD(struct gpuipc__list_rec, path, #path, T, ck, L_)
RECORD(list_rec_fields, check_list_rec,
       SEG(struct gpuipc__list_rec, seg, 0, ~0u),
       L(broker_fd, FT_INT, CK_MAX, 1),
       L(keeper_pid, FT_INT, CK_ANY, 0),
       L(nholders, FT_INT, CK_ANY, 0),
       ARRAY(struct gpuipc__list_rec, nlisted, holders, "holders listed",
             GPUIPC__LIST_HOLDERS, holder_fields));
#undef L

/* ----- message bodies: msg_<fields> of GPUIPC_MSG_TABLE ----- */

#define M(path, T, ck, L) FIELD(struct gpuipc__msg, u.path, #path, T, ck, L)
#define M_OPT(has, bytes, ck) OPT(struct gpuipc__msg, u.has, u.bytes, ck)
#define M_SEG(path, w, states) SEG(struct gpuipc__msg, u.path, w, states)
RECORD(msg_hello, NULL,
       M(hello.pid, FT_INT, CK_ANY, 0),
       M(hello.flags, FT_INT, CK_MASK, GPUIPC__HELLO_FLAGS),
       M(hello.token, FT_INT, CK_NONZERO, 0), /* the member's identity */
       M(hello.epoch, FT_INT, CK_ANY, 0),
       M(hello.max_id, FT_INT, CK_MAX, GPUIPC__ID_MAX));
RECORD(msg_open, NULL,
       M(open.name, FT_STR, CK_NAME, 0),
       M(open.flags, FT_INT, CK_MASK, GPUIPC__OPEN_FLAGS),
       M(open.kind, FT_INT, CK_MAX, GPUIPC__KIND_LAST), /* AUTO allowed */
       M(open.size, FT_INT, CK_MAX, GPUIPC_SIZE_MAX_ABSURD),
       M(open.timeout_ms, FT_INT, CK_ANY, 0));
RECORD(msg_publish, NULL,
       M(publish.flags, FT_INT, CK_MASK, 0),
       M_SEG(publish.seg, 1, ST(PUBLISHED) | ST(FILLING)));
RECORD(msg_abandon, NULL,
       M(abandon.id, FT_INT, CK_RANGE, GPUIPC__ID_MAX));
RECORD(msg_release, NULL,
       M(release.id, FT_INT, CK_RANGE, GPUIPC__ID_MAX),
       M(release.count, FT_INT, CK_NONZERO, 0));
RECORD(msg_unlink, NULL,
       M(unlink.name, FT_STR, CK_NAME, 0),
       M(unlink.id, FT_TAIL, CK_MAX, GPUIPC__ID_MAX));
RECORD(msg_list, NULL,
       M(list.name, FT_STR, CK_NAME0, 0),
       M(list.after_id, FT_INT, CK_ANY, 0),
       M(list.max, FT_INT, CK_MAX, GPUIPC__LIST_RECS));
RECORD(msg_republish, check_republish,
       M(republish.holds, FT_INT, CK_ANY, 0),
       M(republish.flags, FT_INT, CK_MASK, GPUIPC__REPUB_FLAGS),
       M_SEG(republish.seg, 1, ST(PUBLISHED) | ST(UNLINKED) | ST(FILLING)));
RECORD(msg_ready, NULL,
       M(ready.id, FT_INT, CK_RANGE, GPUIPC__ID_MAX),
       M_OPT(ready.has_event, ready.event, CK_EVENT));
RECORD(msg_welcome, NULL,
       M(welcome.pid, FT_INT, CK_NONZERO, 0),
       M(welcome.flags, FT_INT, CK_MASK, 0),
       M(welcome.epoch, FT_INT, CK_NONZERO, 0));
RECORD(msg_denied, NULL, /* free text: get_str refuses NUL and overlength */
       M(denied.reason, FT_STR, CK_ANY, 0));
RECORD(msg_error, NULL,
       M(error.code, FT_INT, CK_ERRNO, 0),
       M(error.text, FT_STR, CK_ANY, 0));
RECORD(msg_ok, NULL, M(ok.id, FT_INT, CK_MAX, GPUIPC__ID_MAX));
/* CREATE_IT, UNLINKED, DISOWN and LET_GO share ok's layout. */
RECORD(msg_id, NULL, M(unlinked.id, FT_INT, CK_RANGE, GPUIPC__ID_MAX));
RECORD(msg_handle, NULL, M_SEG(handle.seg, 1, ST(PUBLISHED)));
RECORD(msg_list_reply, NULL,
       M(list_reply.broker_pid, FT_INT, CK_ANY, 0),
       M(list_reply.epoch, FT_INT, CK_ANY, 0),
       M(list_reply.members, FT_INT, CK_ANY, 0),
       M(list_reply.segments, FT_INT, CK_ANY, 0),
       M(list_reply.fds, FT_INT, CK_ANY, 0),
       M(list_reply.more, FT_INT, CK_MAX, 1),
       ARRAY(struct gpuipc__msg, u.list_reply.count, u.list_reply.recs,
             "records", GPUIPC__LIST_RECS, list_rec_fields));
RECORD(msg_handoff_begin, NULL,
       M(handoff_begin.epoch, FT_INT, CK_NONZERO, 0),
       M(handoff_begin.next_id, FT_INT, CK_RANGE, GPUIPC__ID_MAX + 1),
       M(handoff_begin.count, FT_INT, CK_ANY, 0),
       M(handoff_begin.members, FT_INT, CK_ANY, 0));
RECORD(msg_handoff_seg, NULL,
       M_SEG(handoff_seg.seg, -1,
             ST(PUBLISHED) | ST(UNLINKED) | ST(LOST) | ST(FILLING)));
/* HANDOFF_END, ACK, OFFER and ACCEPT share one layout. */
RECORD(msg_count, NULL, M(handoff_end.count, FT_INT, CK_ANY, 0));
#undef M
#undef M_OPT
#undef M_SEG

struct msg_type {
  const char *name;
  const struct record *body;
  int fds;
};

static const struct msg_type msg_types[GPUIPC__MSG_TYPES] = {
#define MSG_TYPE(nm, num, fields, fds) [num] = {#nm, &msg_##fields, fds},
    GPUIPC_MSG_TABLE(MSG_TYPE)
#undef MSG_TYPE
};

/* The description of message type @type, or NULL for unknown ones. */
static const struct msg_type *msg_type(unsigned type)
{
  if (type >= GPUIPC__MSG_TYPES || msg_types[type].name == NULL)
    return NULL;
  return &msg_types[type];
}

const char *gpuipc__msg_name(unsigned type)
{
  const struct msg_type *t = msg_type(type);
  return t != NULL ? t->name : "?";
}

/* The segment record of @m, or NULL for types without one. */
static const struct gpuipc__seg_wire *msg_seg(const struct gpuipc__msg *m)
{
  const struct msg_type *t = msg_type(m->type);
  for (size_t i = 0; t != NULL && i < t->body->n; i++)
    if (t->body->f[i].type == FT_SEG)
      return (const void *)((const char *)m + t->body->f[i].off);
  return NULL;
}

int gpuipc__msg_nfds(const struct gpuipc__msg *m)
{
  const struct msg_type *t = msg_type(m->type);
  int n = t != NULL ? t->fds : 0;
  const struct gpuipc__seg_wire *s = msg_seg(m);
  if (s != NULL && s->has_handle && gpuipc__htype_has_fd(s->htype))
    n++;
  return n;
}

/* Where field @f of the record at @rec lies. */
static void *at(const void *rec, size_t off)
{
  return (char *)rec + off;
}

static uint64_t int_get(const void *rec, const struct field *f)
{
  const void *p = at(rec, f->off);
  switch (f->n) {
  case 1: return *(const uint8_t *)p;
  case 4: return *(const uint32_t *)p;
  default: return *(const uint64_t *)p;
  }
}

static void int_set(void *rec, const struct field *f, uint64_t v)
{
  void *p = at(rec, f->off);
  switch (f->n) {
  case 1:
    *(uint8_t *)p = (uint8_t)v;
    break;
  case 4:
    *(uint32_t *)p = (uint32_t)v;
    break;
  default:
    *(uint64_t *)p = v;
  }
}

static void put_int(struct gpuipc__wbuf *w, unsigned n, uint64_t v)
{
  switch (n) {
  case 1:
    gpuipc__put_u8(w, (uint8_t)v);
    break;
  case 4:
    gpuipc__put_u32(w, (uint32_t)v);
    break;
  default:
    gpuipc__put_u64(w, v);
  }
}

static uint64_t get_int(struct gpuipc__rbuf *r, unsigned n)
{
  switch (n) {
  case 1: return gpuipc__get_u8(r);
  case 4: return gpuipc__get_u32(r);
  default: return gpuipc__get_u64(r);
  }
}

/* ------------------------------------------------------------------------ */
/* Checks shared by encode and decode                                       */
/* ------------------------------------------------------------------------ */

#define PROTO_ERR(...) gpuipc__err(GPUIPC_E_PROTO, __VA_ARGS__)

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
  return PROTO_ERR("%s: bad event record (%s)", msg, why);
}

static int check_int(const struct field *f, uint64_t v, const char *msg)
{
  unsigned long long u = (unsigned long long)v;
  unsigned long long lim = (unsigned long long)f->lim;
  switch (f->check) {
  case CK_MAX:
    if (v > f->lim)
      return PROTO_ERR("%s: %s %llu above %llu", msg, f->name, u, lim);
    break;
  case CK_RANGE:
    if (v == 0 || v > f->lim)
      return PROTO_ERR("%s: %s %llu out of range (1 to %llu)", msg, f->name,
                       u, lim);
    break;
  case CK_NONZERO:
    if (v == 0)
      return PROTO_ERR("%s: %s is 0", msg, f->name);
    break;
  case CK_MASK:
    if (v & ~f->lim)
      return PROTO_ERR("%s: %s 0x%llx has %s bits", msg, f->name, u,
                       f->lim == 0 ? "reserved" : "unknown");
    break;
  case CK_ERRNO:
    if ((int32_t)v >= 0 || (int32_t)v < -4096)
      return PROTO_ERR("%s: code %d is not an error code", msg, (int32_t)v);
    break;
  }
  return 0;
}

/* The packed handle of @s against the rest of its record. */
static int check_seg_handle(struct gpuipc__seg_wire *s, const char *msg,
                            bool set_htype)
{
  gpuipc_handle_t h;
  int rc = gpuipc_handle_unpack(s->handle, sizeof(s->handle), &h);
  if (rc != 0) {
    char why[256]; /* the sentence is rewritten below: copy it first */
    snprintf(why, sizeof(why), "%s", gpuipc_last_error());
    return PROTO_ERR("%s: bad handle record (%s)", msg, why);
  }
  if ((unsigned)h.kind != s->kind)
    return PROTO_ERR("%s: handle kind %d differs from segment kind %u", msg,
                     (int)h.kind, s->kind);
  if (h.size < s->size)
    return PROTO_ERR("%s: handle covers %llu bytes, segment has %llu", msg,
                     (unsigned long long)h.size,
                     (unsigned long long)s->size);
  if (memcmp(h.device_uuid, s->uuid, sizeof(s->uuid)) != 0)
    return PROTO_ERR("%s: handle device differs from segment device", msg);
  if (set_htype)
    s->htype = (uint8_t)h.type;
  else if (s->htype != (uint8_t)h.type)
    return PROTO_ERR("%s: htype %u differs from the handle's type %d", msg,
                     s->htype, (int)h.type);
  return 0;
}

/*
 * The rules between a segment record's fields (each field itself is
 * checked already): @f says which states the message allows and whether a
 * handle must (1), must not (0) or may, as the state says (-1), be there.
 * Decoding (@set_htype) derives the record's htype; encoding checks it.
 */
static int check_seg(struct gpuipc__seg_wire *s, const struct field *f,
                     const char *msg, bool set_htype)
{
  if (!((1u << s->state) & f->lim))
    return PROTO_ERR("%s: a segment in state %u", msg, s->state);
  bool state_has = s->state == GPUIPC__SEG_PUBLISHED ||
                   s->state == GPUIPC__SEG_UNLINKED ||
                   s->state == GPUIPC__SEG_FILLING;
  if (s->has_event && (!s->has_handle || s->state == GPUIPC__SEG_FILLING))
    return PROTO_ERR("%s: an event record in a %s record", msg,
                     s->has_handle ? "FILLING" : "handle-less");
  if (f->want == 1 && !s->has_handle)
    return PROTO_ERR("%s: handle record missing", msg);
  if (f->want == 0 && s->has_handle)
    return PROTO_ERR("%s: unexpected handle record", msg);
  if (f->want == -1 && s->has_handle != state_has)
    return PROTO_ERR("%s: state %u %s a handle record", msg, s->state,
                     state_has ? "needs" : "cannot have");
  if (s->has_handle && !state_has)
    return PROTO_ERR("%s: state %u cannot carry a handle", msg, s->state);
  if (s->has_handle)
    return check_seg_handle(s, msg, set_htype);
  if (set_htype)
    s->htype = 0;
  else if (s->htype != 0)
    return PROTO_ERR("%s: htype %u without a handle", msg, s->htype);
  return 0;
}

static int check_fields(const struct record *r, void *rec, const char *msg,
                        bool decoding);

static int check_array(const struct field *f, void *rec, const char *msg,
                       bool decoding)
{
  uint32_t count = *(const uint32_t *)at(rec, f->off);
  if (count > f->lim)
    return PROTO_ERR("%s: %u %s, at most %llu", msg, count, f->name,
                     (unsigned long long)f->lim);
  for (uint32_t i = 0; i < count; i++) {
    int rc = check_fields(f->sub, at(rec, f->off2 + (size_t)i * f->n), msg,
                          decoding);
    if (rc != 0)
      return rc;
  }
  return 0;
}

static int check_field(const struct field *f, void *rec, const char *msg,
                       bool decoding)
{
  switch (f->type) {
  case FT_STR:
    if (f->check != CK_NAME && f->check != CK_NAME0)
      return 0;
    return check_name_field(at(rec, f->off), f->check == CK_NAME0, msg,
                            f->name);
  case FT_BYTES:
    return 0;
  case FT_OPT:
    if (f->check != CK_EVENT)
      return 0;
    return check_event(*(const bool *)at(rec, f->off), at(rec, f->off2),
                       msg);
  case FT_SEG: {
    struct gpuipc__seg_wire *s = at(rec, f->off);
    int rc = check_fields(&seg_fields, s, msg, decoding);
    return rc != 0 ? rc : check_seg(s, f, msg, decoding);
  }
  case FT_ARRAY:
    return check_array(f, rec, msg, decoding);
  }
  return check_int(f, int_get(rec, f), msg); /* FT_INT, FT_TAIL */
}

/*
 * Check every field of the record at @rec, then the rules between them.
 * Decoding (@decoding) derives each segment record's htype; encoding checks
 * it and writes nothing.
 */
static int check_fields(const struct record *r, void *rec, const char *msg,
                        bool decoding)
{
  for (size_t i = 0; i < r->n; i++) {
    int rc = check_field(&r->f[i], rec, msg, decoding);
    if (rc != 0)
      return rc;
  }
  return r->check != NULL ? r->check(rec, msg) : 0;
}

static int check_republish(void *rec, const char *msg)
{
  const struct gpuipc__msg *m = rec;
  bool keeper = m->u.republish.flags & GPUIPC__REPUB_KEEPER;
  if (keeper && (!(m->u.republish.seg.flags & GPUIPC__SEGF_CREATOR_HELD) ||
                 m->u.republish.seg.state == GPUIPC__SEG_FILLING))
    return PROTO_ERR("%s: a keeper of a segment whose memory its creator "
                     "does not hold", msg);
  if (m->u.republish.holds == 0 && !keeper)
    return PROTO_ERR("%s: holds is 0", msg);
  return 0;
}

static int check_list_rec(void *rec, const char *msg)
{
  const struct gpuipc__list_rec *lr = rec;
  if (lr->nlisted > lr->nholders)
    return PROTO_ERR("%s: %u holders listed of %u", msg, lr->nlisted,
                     lr->nholders);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Encoding                                                                 */
/* ------------------------------------------------------------------------ */

static void put_fields(struct gpuipc__wbuf *w, const struct record *r,
                       const void *rec);

static void put_field(struct gpuipc__wbuf *w, const struct field *f,
                      const void *rec)
{
  switch (f->type) {
  case FT_INT:
    put_int(w, f->n, int_get(rec, f));
    break;
  case FT_TAIL:
    if (int_get(rec, f) != 0)
      put_int(w, f->n, int_get(rec, f));
    break;
  case FT_STR:
    gpuipc__put_str(w, at(rec, f->off));
    break;
  case FT_BYTES:
    gpuipc__put_bytes(w, at(rec, f->off), f->n);
    break;
  case FT_OPT: {
    bool has = *(const bool *)at(rec, f->off);
    gpuipc__put_u8(w, has ? 1 : 0);
    if (has)
      gpuipc__put_bytes(w, at(rec, f->off2), f->n);
    break;
  }
  case FT_SEG:
    put_fields(w, &seg_fields, at(rec, f->off));
    break;
  case FT_ARRAY: {
    uint32_t count = *(const uint32_t *)at(rec, f->off);
    gpuipc__put_u32(w, count);
    for (uint32_t i = 0; i < count && i < f->lim; i++)
      put_fields(w, f->sub, at(rec, f->off2 + (size_t)i * f->n));
    break;
  }
  }
}

static void put_fields(struct gpuipc__wbuf *w, const struct record *r,
                       const void *rec)
{
  for (size_t i = 0; i < r->n; i++)
    put_field(w, &r->f[i], rec);
}

int gpuipc__msg_encode(const struct gpuipc__msg *m, void *buf, size_t cap)
{
  if (m == NULL || buf == NULL)
    return gpuipc__err(-EINVAL, "gpuipc__msg_encode: NULL argument");
  const struct msg_type *t = msg_type(m->type);
  if (t == NULL)
    return PROTO_ERR("message type %u unknown", m->type);
  /* Not written to when encoding. */
  int rc = check_fields(t->body, (struct gpuipc__msg *)m, t->name, false);
  if (rc != 0)
    return rc;
  struct gpuipc__wbuf w;
  gpuipc__wbuf_init(&w, buf, cap);
  struct gpuipc__msghdr h = {GPUIPC_PROTO_MAGIC, GPUIPC_PROTO_VERSION, m->type,
                             m->req, 0};
  gpuipc__msghdr_put(&w, &h);
  put_fields(&w, t->body, m);
  gpuipc__msghdr_end(&w);
  if (w.err != 0)
    return gpuipc__err(-ENOSPC, "%s: message does not fit in %zu bytes",
                       t->name, cap);
  return (int)w.len;
}

/* ------------------------------------------------------------------------ */
/* Decoding                                                                 */
/* ------------------------------------------------------------------------ */

static void get_fields(struct gpuipc__rbuf *r, const struct record *rc,
                       void *rec);

/* A malformed field: the reader's first error wins. */
static void get_fail(struct gpuipc__rbuf *r)
{
  if (r->err == 0)
    r->err = GPUIPC_E_PROTO;
}

static void get_field(struct gpuipc__rbuf *r, const struct field *f,
                      void *rec)
{
  switch (f->type) {
  case FT_INT:
    int_set(rec, f, get_int(r, f->n));
    break;
  case FT_TAIL: /* there when bytes are left, and then never 0 */
    int_set(rec, f, 0);
    if (r->err == 0 && r->pos < r->len) {
      int_set(rec, f, get_int(r, f->n));
      if (int_get(rec, f) == 0)
        get_fail(r);
    }
    break;
  case FT_STR:
    gpuipc__get_str(r, at(rec, f->off), f->n);
    break;
  case FT_BYTES:
    gpuipc__get_bytes(r, at(rec, f->off), f->n);
    break;
  case FT_OPT: {
    uint8_t has = gpuipc__get_u8(r);
    if (has > 1)
      get_fail(r);
    *(bool *)at(rec, f->off) = has == 1;
    if (has == 1)
      gpuipc__get_bytes(r, at(rec, f->off2), f->n);
    break;
  }
  case FT_SEG: {
    struct gpuipc__seg_wire *s = at(rec, f->off);
    get_fields(r, &seg_fields, s);
    s->htype = 0;
    break;
  }
  case FT_ARRAY: {
    uint32_t count = gpuipc__get_u32(r);
    *(uint32_t *)at(rec, f->off) = count;
    if (count > f->lim) {
      get_fail(r);
      break;
    }
    for (uint32_t i = 0; i < count; i++)
      get_fields(r, f->sub, at(rec, f->off2 + (size_t)i * f->n));
    break;
  }
  }
}

static void get_fields(struct gpuipc__rbuf *r, const struct record *rc,
                       void *rec)
{
  for (size_t i = 0; i < rc->n; i++)
    get_field(r, &rc->f[i], rec);
}

int gpuipc__msg_decode(const void *buf, size_t len, int nfds,
                       struct gpuipc__msg *out)
{
  if (buf == NULL || out == NULL)
    return gpuipc__err(-EINVAL, "gpuipc__msg_decode: NULL argument");
  if (nfds < 0 || nfds > 16)
    return gpuipc__err(GPUIPC_E_PROTO, "%d descriptors with a message", nfds);
  struct gpuipc__msghdr h;
  int rc = gpuipc__msghdr_decode(buf, len, GPUIPC_PROTO_MAGIC,
                                 GPUIPC_PROTO_VERSION, gpuipc__msg_name, &h);
  if (rc == 0 || rc == GPUIPC_E_VERSION) {
    out->type = h.type;
    out->version = h.version;
    out->req = h.req;
  }
  if (rc != 0)
    return rc;
  unsigned type = h.type;
  uint32_t body = h.body;
  struct gpuipc__rbuf r;
  gpuipc__rbuf_init(&r, (const uint8_t *)buf + GPUIPC_PROTO_HDR, body);
  const struct msg_type *t = msg_type(type);
  if (t == NULL)
    return gpuipc__err(GPUIPC_E_PROTO, "message type %u unknown", type);
  get_fields(&r, t->body, out);
  if (r.err != 0)
    return gpuipc__err(GPUIPC_E_PROTO, "%s (type %u): body of %u bytes is "
                       "truncated or has a malformed field",
                       t->name, type, body);
  if (r.pos != r.len)
    return gpuipc__err(GPUIPC_E_PROTO, "%s: %zu bytes left over after the body",
                       t->name, r.len - r.pos);
  rc = check_fields(t->body, out, t->name, true);
  if (rc != 0)
    return rc;
  int want = gpuipc__msg_nfds(out);
  if (nfds != want)
    return gpuipc__err(GPUIPC_E_PROTO,
                       "%s: %d descriptors arrived, the message carries %d",
                       t->name, nfds, want);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Sending (members and the broker alike)                                   */
/* ------------------------------------------------------------------------ */
/*
 * Kept apart from the codec above, with its own includes: encoding is this
 * file's, the socket is src/os's.
 */
#include "domain/domain.h"
#include "os/os.h"

int gpuipc__proto_send(int fd, const struct gpuipc__msg *m, const int *fds,
                       int nfds, int timeout_ms)
{
  uint8_t buf[GPUIPC__MSG_BUF];
  int len = gpuipc__msg_encode(m, buf, sizeof(buf));
  if (len < 0)
    return len;
  if (fd < 0)
    return gpuipc__err(GPUIPC_E_PEER_GONE, "no connection to the broker");
  return gpuipc__sock_send(fd, buf, (size_t)len, fds, nfds, timeout_ms);
}
