/*
 * The client-broker messages: every type round-trips field by field and
 * byte for byte; the encoder refuses invalid messages; the decoder refuses
 * each broken seed of fuzz/corpus/fuzz_proto (for the reason its name
 * gives) and accepts and re-encodes each valid one; name rules.
 */
#include "test.h"

#include "domain/proto.h"
#include "wire/wire.h"

#include <dirent.h>
#include <unistd.h>

static struct gpuipc__msg in, out;
static uint8_t buf[GPUIPC__MSG_BUF], again[GPUIPC__MSG_BUF];

/* Encode @m, decode it, encode that again: same bytes, same message. */
static void round_trip(struct gpuipc__msg *m)
{
  int n = gpuipc__msg_encode(m, buf, sizeof(buf));
  if (n < 0)
    TFAIL("encode %s: %s", gpuipc__msg_name(m->type), gpuipc_last_error());
  ASSERT_OK(gpuipc__msg_decode(buf, (size_t)n, gpuipc__msg_nfds(m), &out));
  ASSERT_EQ(out.type, m->type);
  ASSERT_EQ(out.req, m->req);
  ASSERT_EQ(out.version, GPUIPC_PROTO_VERSION);
  int n2 = gpuipc__msg_encode(&out, again, sizeof(again));
  ASSERT_EQ(n2, n);
  ASSERT_TRUE(memcmp(buf, again, (size_t)n) == 0);
  /* One descriptor fewer or more is refused. */
  int nfds = gpuipc__msg_nfds(m);
  ASSERT_RC(gpuipc__msg_decode(buf, (size_t)n, nfds + 1, &in), GPUIPC_E_PROTO);
  if (nfds > 0)
    ASSERT_RC(gpuipc__msg_decode(buf, (size_t)n, nfds - 1, &in),
              GPUIPC_E_PROTO);
  /* Every truncation is refused. */
  for (int cut = 0; cut < n; cut += 1 + cut / 8)
    ASSERT_RC(gpuipc__msg_decode(buf, (size_t)cut, nfds, &in),
              GPUIPC_E_PROTO);
}

static struct gpuipc__seg_wire host_seg(const char *name, uint8_t state)
{
  struct gpuipc__seg_wire w;
  memset(&w, 0, sizeof(w));
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_buf_alloc(5000, GPUIPC_KIND_HOST, -1, 0, &b));
  gpuipc_handle_t h;
  ASSERT_OK(gpuipc_buf_export(b, &h));
  close(h.fd);
  gpuipc_buf_release(b);
  snprintf(w.name, sizeof(w.name), "%s", name);
  w.id = 42;
  w.size = 5000;
  w.kind = GPUIPC_KIND_HOST;
  w.state = state;
  w.has_handle = true;
  w.htype = (uint8_t)h.type;
  ASSERT_EQ(gpuipc_handle_pack(&h, w.handle, sizeof(w.handle)),
            GPUIPC_HANDLE_PACKED_SIZE);
  return w;
}

static void every_type(void)
{
  struct gpuipc__msg m;
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_HELLO;
  m.req = 9;
  m.u.hello = (typeof(m.u.hello)){1234, GPUIPC__HELLO_NO_BROKER, 77, 88, 99};
  round_trip(&m);
  ASSERT_EQ(out.u.hello.pid, 1234);
  ASSERT_EQ(out.u.hello.flags, GPUIPC__HELLO_NO_BROKER);
  ASSERT_EQ_U(out.u.hello.token, 77);
  ASSERT_EQ_U(out.u.hello.epoch, 88);
  ASSERT_EQ_U(out.u.hello.max_id, 99);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_OPEN;
  m.req = 0xffffffffu;
  snprintf(m.u.open.name, sizeof(m.u.open.name), "Az09._-");
  m.u.open.flags = GPUIPC_CREATE | GPUIPC_WAIT;
  m.u.open.kind = GPUIPC_KIND_POOL;
  m.u.open.size = GPUIPC_SIZE_MAX_ABSURD;
  m.u.open.timeout_ms = 12345;
  round_trip(&m);
  ASSERT_STREQ(out.u.open.name, "Az09._-");
  ASSERT_EQ(out.u.open.flags, GPUIPC_CREATE | GPUIPC_WAIT);
  ASSERT_EQ(out.u.open.kind, GPUIPC_KIND_POOL);
  ASSERT_EQ_U(out.u.open.size, GPUIPC_SIZE_MAX_ABSURD);
  ASSERT_EQ(out.u.open.timeout_ms, 12345);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_PUBLISH;
  m.u.publish.seg = host_seg("p", GPUIPC__SEG_PUBLISHED);
  round_trip(&m);
  ASSERT_EQ(gpuipc__msg_nfds(&out), 1);
  ASSERT_STREQ(out.u.publish.seg.name, "p");
  ASSERT_EQ_U(out.u.publish.seg.size, 5000);
  ASSERT_EQ(out.u.publish.seg.htype, GPUIPC_HT_POSIX_FD);
  ASSERT_TRUE(memcmp(out.u.publish.seg.handle, m.u.publish.seg.handle,
                     GPUIPC_HANDLE_PACKED_SIZE) == 0);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_REPUBLISH;
  m.u.republish.holds = 3;
  m.u.republish.seg = host_seg("r", GPUIPC__SEG_UNLINKED);
  round_trip(&m);
  ASSERT_EQ(out.u.republish.holds, 3);
  ASSERT_EQ(out.u.republish.seg.state, GPUIPC__SEG_UNLINKED);
  /* The creator keeping memory no descriptor keeps: no open of its own. */
  m.u.republish.holds = 0;
  m.u.republish.flags = GPUIPC__REPUB_KEEPER;
  m.u.republish.seg.flags = GPUIPC__SEGF_CREATOR_HELD;
  round_trip(&m);
  ASSERT_EQ(out.u.republish.holds, 0);
  ASSERT_EQ(out.u.republish.flags, GPUIPC__REPUB_KEEPER);
  ASSERT_EQ(out.u.republish.seg.flags, GPUIPC__SEGF_CREATOR_HELD);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_HANDLE;
  m.req = 5;
  m.u.handle.seg = host_seg("h", GPUIPC__SEG_PUBLISHED);
  round_trip(&m);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_HANDOFF_SEG;
  m.u.handoff_seg.seg = host_seg("lost", GPUIPC__SEG_LOST);
  m.u.handoff_seg.seg.has_handle = false;
  m.u.handoff_seg.seg.htype = 0;
  round_trip(&m);
  ASSERT_EQ(gpuipc__msg_nfds(&out), 0);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_HANDOFF_BEGIN;
  m.u.handoff_begin = (typeof(m.u.handoff_begin)){5, 6, 7, 8};
  round_trip(&m);
  ASSERT_EQ(gpuipc__msg_nfds(&out), 2);
  ASSERT_EQ(out.u.handoff_begin.count, 7);
  ASSERT_EQ(out.u.handoff_begin.members, 8);

  static const uint16_t id_types[] = {GPUIPC_MSG_OK, GPUIPC_MSG_CREATE_IT,
                                      GPUIPC_MSG_UNLINKED, GPUIPC_MSG_ABANDON,
                                      GPUIPC_MSG_DISOWN, GPUIPC_MSG_LET_GO};
  for (size_t i = 0; i < sizeof(id_types) / sizeof(id_types[0]); i++) {
    memset(&m, 0, sizeof(m));
    m.type = id_types[i];
    m.u.ok.id = 1000 + i;
    round_trip(&m);
    ASSERT_EQ_U(out.u.ok.id, 1000 + i);
  }

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_RELEASE;
  m.u.release.id = 8;
  m.u.release.count = 9;
  round_trip(&m);
  m.type = GPUIPC_MSG_UNLINK;
  snprintf(m.u.unlink.name, sizeof(m.u.unlink.name), "u");
  round_trip(&m);
  ASSERT_EQ_U(out.u.unlink.id, 0);
  m.u.unlink.id = 77; /* only while "u" names segment 77 */
  round_trip(&m);
  ASSERT_EQ_U(out.u.unlink.id, 77);
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_LIST;
  m.u.list.max = GPUIPC__LIST_RECS;
  round_trip(&m);
  ASSERT_STREQ(out.u.list.name, "");

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_WELCOME;
  m.u.welcome.pid = 3;
  m.u.welcome.epoch = 4;
  round_trip(&m);
  m.type = GPUIPC_MSG_DENIED;
  memset(&m.u, 0, sizeof(m.u));
  memset(m.u.denied.reason, 'x', GPUIPC__TEXT_MAX);
  round_trip(&m);
  ASSERT_EQ(strlen(out.u.denied.reason), GPUIPC__TEXT_MAX);
  m.type = GPUIPC_MSG_ERROR;
  memset(&m.u, 0, sizeof(m.u));
  m.u.error.code = GPUIPC_E_LOST;
  snprintf(m.u.error.text, sizeof(m.u.error.text), "gone");
  round_trip(&m);
  ASSERT_EQ(out.u.error.code, GPUIPC_E_LOST);

  /* A full LIST_REPLY is the longest message: it fits. */
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_LIST_REPLY;
  m.u.list_reply.count = GPUIPC__LIST_RECS;
  for (int i = 0; i < GPUIPC__LIST_RECS; i++) {
    struct gpuipc__list_rec *lr = &m.u.list_reply.recs[i];
    lr->seg = host_seg("x", GPUIPC__SEG_PUBLISHED);
    memset(lr->seg.name, 'n', GPUIPC__NAME_MAX);
    lr->seg.has_handle = false;
    lr->seg.htype = 0;
    lr->seg.flags = GPUIPC__SEGF_CREATOR_HELD;
    lr->keeper_pid = 4194304;
    lr->nholders = 1000;
    lr->nlisted = GPUIPC__LIST_HOLDERS;
    for (int k = 0; k < GPUIPC__LIST_HOLDERS; k++)
      lr->holders[k] = (struct gpuipc__holder_wire){(uint32_t)k + 1, 2};
  }
  round_trip(&m);
  ASSERT_EQ(out.u.list_reply.recs[15].holders[15].pid, 16);
  ASSERT_EQ(out.u.list_reply.recs[15].keeper_pid, 4194304);
  ASSERT_EQ(out.u.list_reply.recs[15].seg.flags, GPUIPC__SEGF_CREATOR_HELD);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_HANDOFF_END;
  m.u.handoff_end.count = 3;
  round_trip(&m);
}

static void encoder_refuses(void)
{
  struct gpuipc__msg m;
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_OPEN;
  snprintf(m.u.open.name, sizeof(m.u.open.name), "a b");
  ASSERT_RC(gpuipc__msg_encode(&m, buf, sizeof(buf)), GPUIPC_E_PROTO);
  m.type = 200;
  ASSERT_RC(gpuipc__msg_encode(&m, buf, sizeof(buf)), GPUIPC_E_PROTO);
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_PUBLISH;
  m.u.publish.seg = host_seg("p", GPUIPC__SEG_PUBLISHED);
  m.u.publish.seg.htype = GPUIPC_HT_FABRIC; /* disagrees with the record */
  ASSERT_RC(gpuipc__msg_encode(&m, buf, sizeof(buf)), GPUIPC_E_PROTO);
  m.u.publish.seg.htype = GPUIPC_HT_POSIX_FD;
  ASSERT_RC(gpuipc__msg_encode(&m, buf, 40), -ENOSPC);
  ASSERT_RC(gpuipc__msg_encode(NULL, buf, sizeof(buf)), -EINVAL);
}

static void names(void)
{
  ASSERT_OK(gpuipc__name_check("a", "n"));
  ASSERT_OK(gpuipc__name_check("A-z_0.9", "n"));
  ASSERT_RC(gpuipc__name_check(NULL, "n"), -EINVAL);
  ASSERT_RC(gpuipc__name_check("", "n"), -EINVAL);
  ASSERT_RC(gpuipc__name_check(".a", "n"), -EINVAL);
  ASSERT_RC(gpuipc__name_check("a\n", "n"), -EINVAL);
  char n63[64], n64[65];
  memset(n63, 'a', 63);
  n63[63] = 0;
  memset(n64, 'a', 64);
  n64[64] = 0;
  ASSERT_OK(gpuipc__name_check(n63, "n"));
  ASSERT_RC(gpuipc__name_check(n64, "n"), -EINVAL);
}

/* The fuzz seeds: valid ones decode and re-encode, broken ones do not. */
static void corpus(void)
{
  char dir[600];
  snprintf(dir, sizeof(dir), "%s/fuzz/corpus/fuzz_proto", GPUIPC_TEST_SRCDIR);
  DIR *d = opendir(dir);
  if (d == NULL)
    TFAIL("opendir %s: %s", dir, strerror(errno));
  int valid = 0, bad = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    char path[1200];
    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "rb");
    ASSERT_TRUE(f != NULL);
    static uint8_t data[GPUIPC__MSG_BUF + 16];
    size_t n = fread(data, 1, sizeof(data), f);
    fclose(f);
    ASSERT_GE(n, 1);
    int rc = gpuipc__msg_decode(data + 1, n - 1, data[0] & 3, &in);
    if (strncmp(e->d_name, "valid-", 6) == 0) {
      if (rc != 0)
        TFAIL("%s refused: %s", e->d_name, gpuipc_last_error());
      int n2 = gpuipc__msg_encode(&in, again, sizeof(again));
      ASSERT_EQ(n2, (int)n - 1);
      ASSERT_TRUE(memcmp(again, data + 1, n - 1) == 0);
      valid++;
    } else if (strncmp(e->d_name, "bad-", 4) == 0) {
      int want = strncmp(e->d_name, "bad-version", 11) == 0
                     ? GPUIPC_E_VERSION : GPUIPC_E_PROTO;
      if (rc != want)
        TFAIL("%s: decode returned %s", e->d_name, gpuipc_err_name(rc));
      bad++;
    } else {
      TFAIL("unexpected seed %s", e->d_name);
    }
  }
  closedir(d);
  printf("%d valid and %d broken seeds\n", valid, bad);
  ASSERT_GE(valid, 20); /* every type */
  ASSERT_GE(bad, 20);
}

/* Encode @m with @id written over the u64 at body offset @off; decode. */
static int decode_with_u64(struct gpuipc__msg *m, size_t off, uint64_t id)
{
  int n = gpuipc__msg_encode(m, buf, sizeof(buf));
  if (n < 0)
    TFAIL("encode %s: %s", gpuipc__msg_name(m->type), gpuipc_last_error());
  for (int i = 0; i < 8; i++)
    buf[GPUIPC_PROTO_HDR + off + (size_t)i] = (uint8_t)(id >> (8 * i));
  return gpuipc__msg_decode(buf, (size_t)n, gpuipc__msg_nfds(m), &out);
}

/*
 * Ids above 2^62 are refused both ways, wherever a peer gives one: a
 * broker learning such an id would run its counter to the wrap.
 */
static void huge_ids(void)
{
  const uint64_t max = 1ull << 62;
  struct gpuipc__msg m;
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_HELLO;
  m.u.hello.token = 1;
  m.u.hello.max_id = max;
  round_trip(&m);
  ASSERT_OK(decode_with_u64(&m, 24, max));
  ASSERT_RC(decode_with_u64(&m, 24, max + 1), GPUIPC_E_PROTO);
  ASSERT_RC(decode_with_u64(&m, 24, UINT64_MAX - 1), GPUIPC_E_PROTO);
  ASSERT_RC(decode_with_u64(&m, 24, UINT64_MAX), GPUIPC_E_PROTO);
  m.u.hello.max_id = max + 1;
  ASSERT_RC(gpuipc__msg_encode(&m, buf, sizeof(buf)), GPUIPC_E_PROTO);

  static const uint16_t id_types[] = {GPUIPC_MSG_ABANDON, GPUIPC_MSG_RELEASE,
                                      GPUIPC_MSG_CREATE_IT,
                                      GPUIPC_MSG_UNLINKED, GPUIPC_MSG_OK,
                                      GPUIPC_MSG_DISOWN, GPUIPC_MSG_LET_GO};
  for (size_t i = 0; i < sizeof(id_types) / sizeof(id_types[0]); i++) {
    memset(&m, 0, sizeof(m));
    m.type = id_types[i];
    m.u.release.id = max; /* every one of them begins with the id */
    m.u.release.count = 1;
    if (m.type != GPUIPC_MSG_RELEASE)
      m.u.ok.id = max;
    ASSERT_OK(decode_with_u64(&m, 0, max));
    ASSERT_RC(decode_with_u64(&m, 0, max + 1), GPUIPC_E_PROTO);
    ASSERT_RC(decode_with_u64(&m, 0, UINT64_MAX), GPUIPC_E_PROTO);
  }

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_PUBLISH;
  m.u.publish.seg = host_seg("p", GPUIPC__SEG_PUBLISHED);
  m.u.publish.seg.id = max;
  round_trip(&m);
  m.u.publish.seg.id = max + 1;
  ASSERT_RC(gpuipc__msg_encode(&m, buf, sizeof(buf)), GPUIPC_E_PROTO);
  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_REPUBLISH;
  m.u.republish.holds = 1;
  m.u.republish.seg = host_seg("r", GPUIPC__SEG_PUBLISHED);
  /* holds and flags u32, then the record: name (u16 length + bytes),
   * then its id */
  ASSERT_OK(decode_with_u64(&m, 4 + 4 + 2 + 1, max));
  ASSERT_RC(decode_with_u64(&m, 4 + 4 + 2 + 1, max + 1), GPUIPC_E_PROTO);

  memset(&m, 0, sizeof(m));
  m.type = GPUIPC_MSG_HANDOFF_BEGIN;
  m.u.handoff_begin.epoch = 1;
  m.u.handoff_begin.next_id = max + 1;
  round_trip(&m);
  ASSERT_RC(decode_with_u64(&m, 8, UINT64_MAX), GPUIPC_E_PROTO);
}

int main(void)
{
  every_type();
  encoder_refuses();
  huge_ids();
  names();
  corpus();
  printf("broker_messages: ok\n");
  return 0;
}
