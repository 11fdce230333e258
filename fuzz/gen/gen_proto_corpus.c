/*
 * Writes the seed corpus of fuzz/fuzz_proto into DIR: a valid message of
 * every type, some in several shapes (valid-*), and messages broken in one
 * way each (bad-*). Each file is the fuzz target's selector byte (the
 * descriptor count) and the message. tests/broker_messages.c checks that
 * every valid-* file decodes and encodes back to the same bytes, and that
 * every bad-* file is refused.
 *
 * Not part of the build (every .c file directly under fuzz/ is a libFuzzer
 * target). Build and run it from the repository root:
 *   cc -std=gnu11 -D_GNU_SOURCE -Iinclude -Isrc -o /tmp/gen_proto_corpus \
 *     -DGPUIPC_HAVE_CUDA=0 fuzz/gen/gen_proto_corpus.c src/domain/proto.c \
 *     src/wire/[a-z]*.c src/core/[a-z]*.c src/cuda/event.c src/os/proc.c \
 *     src/os/time.c src/os/sock.c src/os/random.c src/os/fd.c \
 *     -lpthread
 *   /tmp/gen_proto_corpus fuzz/corpus/fuzz_proto
 * The output is deterministic.
 */
#include "domain/proto.h"
#include "wire/wire.h"

#include <stdio.h>
#include <stdlib.h>

static const char *dir;

static void put_file(const char *name, int nfds, const uint8_t *p, size_t n)
{
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  uint8_t sel = (uint8_t)nfds;
  if (f == NULL || fwrite(&sel, 1, 1, f) != 1 ||
      (n > 0 && fwrite(p, 1, n, f) != n) || fclose(f) != 0) {
    perror(path);
    exit(1);
  }
}

static int enc(const struct gpuipc__msg *m, uint8_t *buf)
{
  int n = gpuipc__msg_encode(m, buf, GPUIPC__MSG_BUF);
  if (n < 0) {
    fprintf(stderr, "encode %s: %s\n", gpuipc__msg_name(m->type),
            gpuipc_last_error());
    exit(1);
  }
  return n;
}

/* A valid message of @m, as it is. */
static void valid(const char *name, const struct gpuipc__msg *m)
{
  uint8_t buf[GPUIPC__MSG_BUF];
  int n = enc(m, buf);
  char file[128];
  snprintf(file, sizeof(file), "valid-%s", name);
  put_file(file, gpuipc__msg_nfds(m), buf, (size_t)n);
}

/* A handle record of @kind/@type, packed into @w. */
static void handle(struct gpuipc__seg_wire *w, gpuipc_kind_t kind,
                   gpuipc_handle_type_t type, unsigned seed)
{
  gpuipc_handle_t h;
  memset(&h, 0, sizeof(h));
  h.version = GPUIPC_HANDLE_VERSION;
  h.kind = kind;
  h.type = type;
  h.alloc_size = 2u << 20;
  h.size = w->size;
  if (kind != GPUIPC_KIND_HOST)
    for (unsigned i = 0; i < 16; i++)
      h.device_uuid[i] = (uint8_t)(0x10 + i + seed);
  memcpy(w->uuid, h.device_uuid, 16);
  h.export_id = seed + 1;
  for (unsigned i = 0; i < 16; i++)
    h.boot_id[i] = (uint8_t)(i * 7 + seed);
  h.pid = 4000 + seed;
  h.pidns = 4026531836ull;
  h.nonce = 0x5eed000000000000ull | seed;
  if (type != GPUIPC_HT_POSIX_FD)
    for (unsigned i = 0; i < GPUIPC_HANDLE_BYTES; i++)
      h.bytes[i] = (uint8_t)(i + seed);
  h.fd = -1;
  if (gpuipc_handle_pack(&h, w->handle, sizeof(w->handle)) < 0) {
    fprintf(stderr, "pack: %s\n", gpuipc_last_error());
    exit(1);
  }
  w->has_handle = true;
  w->htype = (uint8_t)type;
}

/* A packed event record (an event its creator's writes were recorded on). */
static void event(uint8_t *out, unsigned seed)
{
  gpuipc_event_handle_t h;
  memset(&h, 0, sizeof(h));
  h.version = GPUIPC_EVENT_HANDLE_VERSION;
  for (unsigned i = 0; i < 16; i++) {
    h.device_uuid[i] = (uint8_t)(0x30 + i + seed);
    h.boot_id[i] = (uint8_t)(i * 5 + seed);
  }
  h.event_id = seed + 1;
  h.pid = 5000 + seed;
  h.pidns = 4026531836ull;
  h.nonce = 0xe7e7000000000000ull | seed;
  for (unsigned i = 0; i < GPUIPC_HANDLE_BYTES; i++)
    h.bytes[i] = (uint8_t)(i + 1 + seed);
  if (gpuipc_event_handle_pack(&h, out, GPUIPC_EVENT_HANDLE_PACKED_SIZE) <
      0) {
    fprintf(stderr, "event pack: %s\n", gpuipc_last_error());
    exit(1);
  }
}

static struct gpuipc__seg_wire seg(const char *name, uint8_t state,
                                   gpuipc_kind_t kind,
                                   gpuipc_handle_type_t type)
{
  struct gpuipc__seg_wire w;
  memset(&w, 0, sizeof(w));
  snprintf(w.name, sizeof(w.name), "%s", name);
  w.id = 1795300000000000ull + (uint64_t)strlen(name);
  w.size = 1u << 20;
  w.kind = (uint8_t)kind;
  w.state = state;
  if (type != 0)
    handle(&w, kind, type, (unsigned)strlen(name));
  else if (kind != GPUIPC_KIND_HOST)
    for (unsigned i = 0; i < 16; i++)
      w.uuid[i] = (uint8_t)(0x20 + i);
  return w;
}

/* Write @m broken by @edit(buf, len) as bad-@name with @nfds. */
static void bad(const char *name, const struct gpuipc__msg *m, int nfds,
                size_t (*edit)(uint8_t *, size_t))
{
  uint8_t buf[GPUIPC__MSG_BUF + 16];
  size_t n = (size_t)enc(m, buf);
  if (edit != NULL)
    n = edit(buf, n);
  char file[128];
  snprintf(file, sizeof(file), "bad-%s", name);
  put_file(file, nfds, buf, n);
}

/*
 * Write valid @m with the @width-byte little-endian field at body offset
 * @off replaced by @v, as bad-@name (the encoder refuses to write invalid
 * fields itself).
 */
static void bad_field(const char *name, const struct gpuipc__msg *m, int nfds,
                      size_t off, uint64_t v, int width)
{
  uint8_t buf[GPUIPC__MSG_BUF];
  size_t n = (size_t)enc(m, buf);
  for (int i = 0; i < width; i++)
    buf[GPUIPC_PROTO_HDR + off + (size_t)i] = (uint8_t)(v >> (8 * i));
  char file[128];
  snprintf(file, sizeof(file), "bad-%s", name);
  put_file(file, nfds, buf, n);
}

/* Body offset of the field after a seg record's name, at @skip past it. */
static size_t after_name(const char *name, size_t skip)
{
  return 2 + strlen(name) + skip;
}

static size_t cut_one(uint8_t *b, size_t n)
{
  b[12]--; /* header and body agree, the body is one byte short */
  return n - 1;
}
static size_t add_one(uint8_t *b, size_t n)
{
  b[n] = 0;
  return n + 1;
}
static size_t short_header(uint8_t *b, size_t n)
{
  (void)b;
  return n < 15 ? n : 15;
}
static size_t bad_magic(uint8_t *b, size_t n)
{
  b[0] ^= 0x20;
  return n;
}
static size_t version_next(uint8_t *b, size_t n)
{
  b[4] = GPUIPC_PROTO_VERSION + 1;
  return n;
}
static size_t type99(uint8_t *b, size_t n)
{
  b[6] = 99;
  return n;
}
static size_t type9(uint8_t *b, size_t n)
{
  b[6] = 9; /* a type that is no longer spoken */
  return n;
}
static size_t slash_in_name(uint8_t *b, size_t n)
{
  b[GPUIPC_PROTO_HDR + 2 + 1] = '/';
  return n;
}
static size_t nul_in_name(uint8_t *b, size_t n)
{
  b[GPUIPC_PROTO_HDR + 2 + 1] = 0;
  return n;
}
static size_t dot_first(uint8_t *b, size_t n)
{
  b[GPUIPC_PROTO_HDR + 2] = '.';
  return n;
}
/* The first body byte of a seg record's has_handle in a HANDLE: 2. */
static size_t has_handle_2(uint8_t *b, size_t n)
{
  size_t name = (size_t)b[GPUIPC_PROTO_HDR];
  b[GPUIPC_PROTO_HDR + 2 + name + 8 + 8 + 1 + 1 + 16] = 2;
  return n;
}
/* A seg record ending a message (without an event) with an unknown flag. */
static size_t seg_flags_0x80(uint8_t *b, size_t n)
{
  b[n - 2] = 0x80;
  return n;
}
/* A seg record ending a message with has_event 2. */
static size_t has_event_2(uint8_t *b, size_t n)
{
  b[n - 1] = 2;
  return n;
}
/* An event record ending a message with a broken CRC. */
static size_t event_crc(uint8_t *b, size_t n)
{
  b[n - 30] ^= 1;
  return n;
}
/* A handle record with a broken CRC (first handle byte flipped). */
static size_t handle_crc(uint8_t *b, size_t n)
{
  size_t name = (size_t)b[GPUIPC_PROTO_HDR];
  b[GPUIPC_PROTO_HDR + 2 + name + 8 + 8 + 1 + 1 + 16 + 1 + 20] ^= 1;
  return n;
}

int main(int argc, char **argv)
{
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  dir = argv[1];
  struct gpuipc__msg m;

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_HELLO;
  m.req = 1;
  m.u.hello.pid = 4242;
  m.u.hello.flags = GPUIPC__HELLO_REJOIN;
  m.u.hello.token = 0x1234567890abcdefull;
  m.u.hello.epoch = 0xfeedull;
  m.u.hello.max_id = 1795300000000099ull;
  valid("hello", &m);
  struct gpuipc__msg hello = m;
  bad_field("hello-token-0", &m, 0, 8, 0, 8);
  bad_field("hello-flags", &m, 0, 4, 0x80, 4);
  bad("version-next", &hello, 0, version_next);
  bad("magic", &hello, 0, bad_magic);
  bad("type-99", &hello, 0, type99);
  bad("short-header", &hello, 0, short_header);
  bad("hello-with-fd", &hello, 1, NULL);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_OPEN;
  m.req = 2;
  snprintf(m.u.open.name, sizeof(m.u.open.name), "weights.0");
  m.u.open.flags = GPUIPC__OPEN_FLAGS;
  m.u.open.kind = GPUIPC_KIND_AUTO;
  m.u.open.size = 1u << 30;
  m.u.open.timeout_ms = GPUIPC__WAIT_FOREVER;
  valid("open", &m);
  bad("open-slash", &m, 0, slash_in_name);
  bad("open-nul", &m, 0, nul_in_name);
  bad("open-dot", &m, 0, dot_first);
  bad("open-truncated", &m, 0, cut_one);
  bad("open-trailing", &m, 0, add_one);
  bad("type-9", &m, 0, type9);
  bad_field("open-flags", &m, 0, after_name("weights.0", 0), 0x8, 4);
  bad_field("open-kind", &m, 0, after_name("weights.0", 4), 5, 1);
  bad_field("open-size", &m, 0, after_name("weights.0", 5),
            GPUIPC_SIZE_MAX_ABSURD + 1, 8);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_PUBLISH;
  m.req = 3;
  m.u.publish.seg = seg("grads", GPUIPC__SEG_PUBLISHED, GPUIPC_KIND_HOST,
                        GPUIPC_HT_POSIX_FD);
  valid("publish-host", &m);
  bad("publish-no-fd", &m, 0, NULL);
  bad("publish-two-fds", &m, 2, NULL);
  bad("publish-crc", &m, 1, handle_crc);
  /* More bytes than the handle covers; an UNLINKED state. */
  bad_field("publish-size", &m, 1, 4 + after_name("grads", 8),
            (2u << 20) + 1, 8);
  bad_field("publish-state", &m, 1, 4 + after_name("grads", 17),
            GPUIPC__SEG_UNLINKED, 1);
  bad_field("publish-kind-auto", &m, 1, 4 + after_name("grads", 16), 0, 1);
  m.u.publish.seg = seg("grads.vmm", GPUIPC__SEG_PUBLISHED, GPUIPC_KIND_VMM,
                        GPUIPC_HT_FABRIC);
  valid("publish-vmm-fabric", &m);
  m.u.publish.seg = seg("grads.legacy", GPUIPC__SEG_PUBLISHED,
                        GPUIPC_KIND_LEGACY, GPUIPC_HT_LEGACY);
  m.u.publish.seg.flags = GPUIPC__SEGF_CREATOR_HELD;
  valid("publish-legacy", &m);
  /* A creator's first publication: filling until READY. */
  m.u.publish.seg = seg("grads.filling", GPUIPC__SEG_FILLING,
                        GPUIPC_KIND_HOST, GPUIPC_HT_POSIX_FD);
  valid("publish-filling", &m);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_READY;
  m.req = 10;
  m.u.ready.id = 1795300000000013ull;
  valid("ready", &m);
  bad_field("ready-id-0", &m, 0, 0, 0, 8);
  bad_field("ready-has-event-2", &m, 0, 8, 2, 1);
  m.u.ready.has_event = true;
  event(m.u.ready.event, 2);
  valid("ready-event", &m);
  bad("ready-event-crc", &m, 0, event_crc);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_ABANDON;
  m.req = 4;
  m.u.abandon.id = 77;
  valid("abandon", &m);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_RELEASE;
  m.u.release.id = 77;
  m.u.release.count = 3;
  valid("release", &m);
  bad_field("release-count-0", &m, 0, 8, 0, 4);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_UNLINK;
  m.req = 5;
  snprintf(m.u.unlink.name, sizeof(m.u.unlink.name), "a");
  valid("unlink", &m);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_LIST;
  m.req = 6;
  m.u.list.max = GPUIPC__LIST_RECS;
  valid("list-all", &m);
  snprintf(m.u.list.name, sizeof(m.u.list.name), "some-name_1");
  m.u.list.after_id = 5;
  m.u.list.max = 1;
  valid("list-name", &m);
  bad_field("list-max", &m, 0, after_name("some-name_1", 8),
            GPUIPC__LIST_RECS + 1, 4);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_REPUBLISH;
  m.u.republish.holds = 2;
  m.u.republish.seg = seg("held", GPUIPC__SEG_UNLINKED, GPUIPC_KIND_HOST,
                          GPUIPC_HT_POSIX_FD);
  valid("republish-unlinked", &m);
  bad_field("republish-holds-0", &m, 1, 0, 0, 4);
  /* A keeper of memory the record says no creator holds. */
  bad_field("republish-keeper", &m, 1, 4, GPUIPC__REPUB_KEEPER, 4);
  m.u.republish.seg = seg("held.pool", GPUIPC__SEG_PUBLISHED,
                          GPUIPC_KIND_POOL, GPUIPC_HT_POOL);
  valid("republish-pool", &m);
  /* The creator keeping the memory, with no open of its own left. */
  m.u.republish.holds = 0;
  m.u.republish.flags = GPUIPC__REPUB_KEEPER;
  m.u.republish.seg = seg("kept.legacy", GPUIPC__SEG_UNLINKED,
                          GPUIPC_KIND_LEGACY, GPUIPC_HT_LEGACY);
  m.u.republish.seg.flags = GPUIPC__SEGF_CREATOR_HELD;
  valid("republish-keeper", &m);
  /* A creator still filling it when the broker changed. */
  m.u.republish.holds = 1;
  m.u.republish.flags = 0;
  m.u.republish.seg = seg("filling.vmm", GPUIPC__SEG_FILLING,
                          GPUIPC_KIND_VMM, GPUIPC_HT_POSIX_FD);
  valid("republish-filling", &m);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_DISOWN;
  m.req = 9;
  m.u.disown.id = 1795300000000011ull;
  valid("disown", &m);
  bad_field("disown-id-0", &m, 0, 0, 0, 8);
  m.type = GPUIPC_MSG_LET_GO;
  m.req = 0;
  valid("let_go", &m);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_WELCOME;
  m.req = 1;
  m.u.welcome.pid = 99;
  m.u.welcome.epoch = 0xfeed;
  valid("welcome", &m);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_DENIED;
  snprintf(m.u.denied.reason, sizeof(m.u.denied.reason),
           "domain x refuses uid 65534");
  valid("denied", &m);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_ERROR;
  m.req = 2;
  m.u.error.code = GPUIPC_E_MISMATCH;
  snprintf(m.u.error.text, sizeof(m.u.error.text),
           "segment a has 4096 bytes, the caller asked for 8192");
  valid("error", &m);
  bad_field("error-positive", &m, 0, 0, 5, 4);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_OK;
  m.req = 3;
  m.u.ok.id = 12;
  valid("ok", &m);
  m.type = GPUIPC_MSG_CREATE_IT;
  valid("create_it", &m);
  m.type = GPUIPC_MSG_UNLINKED;
  m.req = 0;
  valid("unlinked", &m);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_HANDLE;
  m.req = 7;
  m.u.handle.seg = seg("w", GPUIPC__SEG_PUBLISHED, GPUIPC_KIND_HOST,
                       GPUIPC_HT_POSIX_FD);
  valid("handle", &m);
  bad("handle-has-handle-2", &m, 1, has_handle_2);
  bad("handle-seg-flags", &m, 1, seg_flags_0x80);
  bad("handle-has-event-2", &m, 1, has_event_2);
  /* Published by a creator whose writes an event orders. */
  m.u.handle.seg.has_event = true;
  event(m.u.handle.seg.event, 1);
  valid("handle-event", &m);
  bad("handle-event-crc", &m, 1, event_crc);
  /* Filling segments are not handed to openers. */
  bad_field("handle-filling", &m, 1, after_name("w", 17), GPUIPC__SEG_FILLING,
            1);
  m.u.handle.seg = seg("w", GPUIPC__SEG_PUBLISHED, GPUIPC_KIND_VMM,
                       GPUIPC_HT_FABRIC);
  valid("handle-vmm-fabric", &m);
  /* The segment's device differs from its handle's. */
  bad_field("handle-uuid", &m, 0, after_name("w", 18), 0xff, 1);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_LIST_REPLY;
  m.req = 8;
  m.u.list_reply.broker_pid = 99;
  m.u.list_reply.epoch = 0xfeed;
  m.u.list_reply.members = 3;
  m.u.list_reply.segments = 40;
  m.u.list_reply.fds = 38;
  m.u.list_reply.more = 1;
  m.u.list_reply.count = 3;
  const char *names[] = {"a", "b.lost", "c.creating"};
  const uint8_t states[] = {GPUIPC__SEG_PUBLISHED, GPUIPC__SEG_LOST,
                            GPUIPC__SEG_CREATING};
  for (int i = 0; i < 3; i++) {
    struct gpuipc__list_rec *lr = &m.u.list_reply.recs[i];
    lr->seg = seg(names[i], states[i], GPUIPC_KIND_HOST, 0);
    lr->broker_fd = i == 0;
    if (i == 0) { /* published, its memory kept by its creator */
      lr->seg.flags = GPUIPC__SEGF_CREATOR_HELD;
      lr->keeper_pid = 4321;
    }
    lr->nholders = (uint32_t)(20 * (i == 0));
    lr->nlisted = i == 0 ? GPUIPC__LIST_HOLDERS : 0;
    for (uint32_t k = 0; k < lr->nlisted; k++)
      lr->holders[k] = (struct gpuipc__holder_wire){100 + k, k + 1};
  }
  valid("list_reply", &m);
  /* Fewer holders in total than listed; more = 2. */
  bad_field("list_reply-holders", &m, 0, 29 + after_name("a", 41), 2, 4);
  bad_field("list_reply-more", &m, 0, 24, 2, 1);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_HANDOFF_BEGIN;
  m.u.handoff_begin.epoch = 0xfeed;
  m.u.handoff_begin.next_id = 1795300000000100ull;
  m.u.handoff_begin.count = 2;
  m.u.handoff_begin.members = 3;
  valid("handoff_begin", &m);
  bad("handoff_begin-one-fd", &m, 1, NULL);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_HANDOFF_SEG;
  m.u.handoff_seg.seg = seg("kept", GPUIPC__SEG_PUBLISHED, GPUIPC_KIND_HOST,
                            GPUIPC_HT_POSIX_FD);
  valid("handoff_seg", &m);
  m.u.handoff_seg.seg = seg("gone", GPUIPC__SEG_LOST, GPUIPC_KIND_VMM, 0);
  valid("handoff_seg-lost", &m);
  struct gpuipc__msg lost = m;
  m.u.handoff_seg.seg = seg("filling", GPUIPC__SEG_FILLING, GPUIPC_KIND_HOST,
                            GPUIPC_HT_POSIX_FD);
  valid("handoff_seg-filling", &m);
  m = lost;
  bad_field("handoff_seg-creating", &m, 0, after_name("gone", 17),
            GPUIPC__SEG_CREATING, 1);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_HANDOFF_END;
  m.u.handoff_end.count = 2;
  valid("handoff_end", &m);
  m.type = GPUIPC_MSG_HANDOFF_ACK;
  valid("handoff_ack", &m);

  put_file("bad-empty", 0, NULL, 0);
  return 0;
}
