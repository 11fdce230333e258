/*
 * The packed handle record: gpuipc_handle_pack, gpuipc_handle_unpack and the
 * field rules every handle must obey (gpuipc__handle_validate).
 *
 * Layout, version 1: GPUIPC_HANDLE_PACKED_SIZE = 192 bytes, every integer
 * little-endian, no padding, no pointers, no file descriptor (fd-carrying
 * types send the fd beside the record with SCM_RIGHTS).
 *
 *   offset size  field        rule
 *        0    4  magic        0x48504947: the bytes 'G' 'I' 'P' 'H'
 *        4    2  version      1 (a newer version is refused, not guessed at)
 *        6    2  record len   192
 *        8    1  kind         1 host, 2 vmm, 3 legacy, 4 pool (never 0, auto)
 *        9    1  type         1 posix_fd, 2 fabric, 3 legacy, 4 pool; the
 *                             type must suit the kind: host posix_fd;
 *                             vmm posix_fd or fabric; legacy legacy;
 *                             pool pool
 *       10    2  flags        0 (reserved for later versions)
 *       12    4  reserved     0
 *       16    8  size         1 .. 2^48: bytes the importer may use
 *       24    8  offset       offset + size <= alloc_size
 *       32    8  alloc_size   size .. 2^48; host: a multiple of 4096
 *       40   16  device_uuid  host: all zero; GPU kinds: not all zero
 *       56    8  export_id    not 0; never reused by the exporting process
 *       64   16  boot_id      exporter's kernel boot id (any value)
 *       80    4  pid          1 .. 4194304 (the kernel's PID_MAX_LIMIT)
 *       84    4  reserved     0
 *       88    8  pidns        exporter's pid namespace inode (any value)
 *       96    8  nonce        not 0: exporter's random per-process identity
 *      104   64  bytes        posix_fd: all zero; fabric, legacy: not all
 *                             zero; pool: the pool pointer export data
 *      168   20  reserved     0
 *      188    4  crc          CRC-32C of bytes 0..187
 *
 * Unpacking checks, in this order, and names what failed: the length (short:
 * "truncated", long: "trailing bytes"), the magic, the version, the record
 * length, the reserved fields, the CRC, then the field rules above. One
 * exception to the order: when the magic matches and the version is newer
 * than 1, the version is reported whatever the length, since a newer record
 * may well have another length and "truncated" would mislead.
 */
#include "wire/wire.h"

#include <inttypes.h>

enum {
  OFF_MAGIC = 0,
  OFF_VERSION = 4,
  OFF_RECLEN = 6,
  OFF_KIND = 8,
  OFF_TYPE = 9,
  OFF_FLAGS = 10,
  OFF_RESERVED1 = 12,
  OFF_SIZE = 16,
  OFF_OFFSET = 24,
  OFF_ALLOC_SIZE = 32,
  OFF_DEVICE_UUID = 40,
  OFF_EXPORT_ID = 56,
  OFF_BOOT_ID = 64,
  OFF_PID = 80,
  OFF_RESERVED2 = 84,
  OFF_PIDNS = 88,
  OFF_NONCE = 96,
  OFF_BYTES = 104,
  OFF_RESERVED3 = 168,
  RESERVED3_LEN = 20,
  OFF_CRC = 188,
  REC_LEN = 192,
};

_Static_assert(REC_LEN == GPUIPC_HANDLE_PACKED_SIZE, "record size");
_Static_assert(OFF_CRC == GPUIPC__HANDLE_CRC_OFFSET, "CRC offset");
_Static_assert(OFF_BYTES + GPUIPC_HANDLE_BYTES == OFF_RESERVED3, "layout");
_Static_assert(OFF_RESERVED3 + RESERVED3_LEN == OFF_CRC, "layout");
_Static_assert(OFF_CRC + 4 == REC_LEN, "layout");

#define PID_MAX 4194304u /* PID_MAX_LIMIT on 64-bit Linux */
#define HOST_PAGE 4096u


static const char *type_name(int type)
{
  switch (type) {
  case GPUIPC_HT_POSIX_FD:
    return "posix_fd";
  case GPUIPC_HT_FABRIC:
    return "fabric";
  case GPUIPC_HT_LEGACY:
    return "legacy";
  case GPUIPC_HT_POOL:
    return "pool";
  }
  return "?";
}

/*
 * May a handle of @kind carry handle type @type? A switch with a case for
 * every kind of GPUIPC_KIND_MAP and no default, so that the compiler
 * (-Wswitch) asks for the handle types of a kind added there.
 */
static bool type_suits_kind(gpuipc_kind_t kind, int type)
{
  switch (kind) {
  case GPUIPC_KIND_AUTO:
    return false; /* a request, never a handle's kind */
  case GPUIPC_KIND_HOST:
    return type == GPUIPC_HT_POSIX_FD;
  case GPUIPC_KIND_VMM:
    return type == GPUIPC_HT_POSIX_FD || type == GPUIPC_HT_FABRIC;
  case GPUIPC_KIND_LEGACY:
    return type == GPUIPC_HT_LEGACY;
  case GPUIPC_KIND_POOL:
    return type == GPUIPC_HT_POOL;
  }
  return false;
}

static bool all_zero(const uint8_t *p, size_t n)
{
  uint8_t acc = 0;
  for (size_t i = 0; i < n; i++)
    acc |= p[i];
  return acc == 0;
}

static int check_version(unsigned version, const char *who)
{
  if (version == 0)
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "%s: handle version 0 is invalid", who);
  if (version > GPUIPC_HANDLE_VERSION)
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "%s: handle version %u is newer than this library's %d",
                       who, version, GPUIPC_HANDLE_VERSION);
  return 0;
}

int gpuipc__handle_validate(const gpuipc_handle_t *h, const char *who)
{
  if (who == NULL)
    who = "gpuipc handle";
  if (h == NULL)
    return gpuipc__err(-EINVAL, "%s: handle is NULL", who);

  int rc = check_version(h->version, who);
  if (rc < 0)
    return rc;

  int kind = (int)h->kind, type = (int)h->type;
  if (!gpuipc__kind_concrete(kind))
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "%s: kind %d (%s) is not a handle kind (1 to %d)",
                       who, kind, gpuipc_kind_name((gpuipc_kind_t)kind),
                       GPUIPC__KIND_LAST);
  if (!type_suits_kind((gpuipc_kind_t)kind, type))
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "%s: handle type %d (%s) is not valid for kind %s", who,
                       type, type_name(type), gpuipc_kind_name((gpuipc_kind_t)kind));
  if (h->flags != 0)
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "%s: flags 0x%x are reserved and must be 0", who,
                       (unsigned)h->flags);

  if (h->size == 0 || h->size > GPUIPC_SIZE_MAX_ABSURD)
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "%s: size %" PRIu64 " is out of range (1 to 2^48)", who,
                       h->size);
  if (h->alloc_size < h->size)
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "%s: alloc_size %" PRIu64 " is smaller than size %" PRIu64,
                       who, h->alloc_size, h->size);
  if (h->alloc_size > GPUIPC_SIZE_MAX_ABSURD)
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "%s: alloc_size %" PRIu64 " is out of range (up to 2^48)",
                       who, h->alloc_size);
  /* alloc_size >= size here, so the subtraction cannot wrap. */
  if (h->offset > h->alloc_size - h->size)
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "%s: offset %" PRIu64 " plus size %" PRIu64
                       " runs past alloc_size %" PRIu64,
                       who, h->offset, h->size, h->alloc_size);

  bool uuid_zero = all_zero(h->device_uuid, sizeof(h->device_uuid));
  if (kind == GPUIPC_KIND_HOST) {
    if (h->alloc_size % HOST_PAGE != 0)
      return gpuipc__err(GPUIPC_E_BADHANDLE,
                         "%s: alloc_size %" PRIu64
                         " of a host buffer is not a multiple of %u",
                         who, h->alloc_size, HOST_PAGE);
    if (!uuid_zero)
      return gpuipc__err(GPUIPC_E_BADHANDLE,
                         "%s: device_uuid must be all zero for kind host",
                         who);
  } else if (uuid_zero) {
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "%s: device_uuid is all zero for kind %s", who,
                       gpuipc_kind_name((gpuipc_kind_t)kind));
  }

  /* Host handles are always posix_fd, so this also keeps their bytes 0. */
  bool bytes_zero = all_zero(h->bytes, sizeof(h->bytes));
  if (type == GPUIPC_HT_POSIX_FD && !bytes_zero)
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "%s: bytes must be all zero for handle type posix_fd",
                       who);
  if ((type == GPUIPC_HT_LEGACY || type == GPUIPC_HT_FABRIC) && bytes_zero)
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "%s: bytes are all zero for handle type %s", who,
                       type_name(type));

  if (h->pid == 0 || h->pid > PID_MAX)
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "%s: pid %" PRIu32 " is out of range (1 to %u)", who,
                       h->pid, PID_MAX);
  if (h->export_id == 0)
    return gpuipc__err(GPUIPC_E_BADHANDLE, "%s: export_id is 0", who);
  if (h->nonce == 0)
    return gpuipc__err(GPUIPC_E_BADHANDLE, "%s: nonce is 0", who);
  return 0;
}

int gpuipc_handle_pack(const gpuipc_handle_t *h, void *dst, size_t cap)
{
  static const char who[] = "gpuipc_handle_pack";
  if (h == NULL)
    return gpuipc__err(-EINVAL, "%s: handle is NULL", who);
  if (dst == NULL)
    return gpuipc__err(-EINVAL, "%s: dst is NULL", who);
  if (cap < REC_LEN)
    return gpuipc__err(-ENOSPC, "%s: cap %zu is smaller than a handle (%d)",
                       who, cap, REC_LEN);
  int rc = gpuipc__handle_validate(h, who);
  if (rc < 0)
    return rc;

  /* Encode aside and copy once complete: @dst changes only on success. */
  uint8_t rec[REC_LEN];
  static const uint8_t zeros[RESERVED3_LEN];
  struct gpuipc__wbuf w;
  gpuipc__wbuf_init(&w, rec, sizeof(rec));
  gpuipc__put_u32(&w, GPUIPC__HANDLE_MAGIC);
  gpuipc__put_u16(&w, (uint16_t)h->version);
  gpuipc__put_u16(&w, REC_LEN);
  gpuipc__put_u8(&w, (uint8_t)h->kind);
  gpuipc__put_u8(&w, (uint8_t)h->type);
  gpuipc__put_u16(&w, 0); /* flags, checked 0 */
  gpuipc__put_u32(&w, 0);
  gpuipc__put_u64(&w, h->size);
  gpuipc__put_u64(&w, h->offset);
  gpuipc__put_u64(&w, h->alloc_size);
  gpuipc__put_bytes(&w, h->device_uuid, sizeof(h->device_uuid));
  gpuipc__put_u64(&w, h->export_id);
  gpuipc__put_bytes(&w, h->boot_id, sizeof(h->boot_id));
  gpuipc__put_u32(&w, h->pid);
  gpuipc__put_u32(&w, 0);
  gpuipc__put_u64(&w, h->pidns);
  gpuipc__put_u64(&w, h->nonce);
  gpuipc__put_bytes(&w, h->bytes, sizeof(h->bytes));
  gpuipc__put_bytes(&w, zeros, sizeof(zeros));
  gpuipc__put_u32(&w, gpuipc__crc32c(0, rec, OFF_CRC));
  if (w.err != 0 || w.len != REC_LEN) /* the layout above is wrong */
    return gpuipc__err(-EFAULT, "%s: encoded %zu bytes, not %d", who, w.len,
                       REC_LEN);
  memcpy(dst, rec, REC_LEN);
  return REC_LEN;
}

static uint32_t le32_at(const uint8_t *p)
{
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

static unsigned le16_at(const uint8_t *p)
{
  return (unsigned)p[0] | (unsigned)p[1] << 8;
}

int gpuipc_handle_unpack(const void *src, size_t len, gpuipc_handle_t *out)
{
  static const char who[] = "gpuipc_handle_unpack";
  if (src == NULL)
    return gpuipc__err(-EINVAL, "%s: src is NULL", who);
  if (out == NULL)
    return gpuipc__err(-EINVAL, "%s: out is NULL", who);
  const uint8_t *b = src;

  /* A newer record may have another length: name the version first. */
  if (len >= OFF_RECLEN && le32_at(b + OFF_MAGIC) == GPUIPC__HANDLE_MAGIC &&
      le16_at(b + OFF_VERSION) > GPUIPC_HANDLE_VERSION)
    return check_version(le16_at(b + OFF_VERSION), who);

  if (len < REC_LEN)
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "%s: truncated: %zu bytes, a handle is %d", who, len,
                       REC_LEN);
  if (len > REC_LEN)
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "%s: %zu trailing bytes after the %d-byte handle", who,
                       len - REC_LEN, REC_LEN);

  uint32_t magic = le32_at(b + OFF_MAGIC);
  if (magic != GPUIPC__HANDLE_MAGIC)
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "%s: magic 0x%08" PRIx32 " is not a gpuipc handle's "
                       "(0x%08x, \"GIPH\")",
                       who, magic, GPUIPC__HANDLE_MAGIC);
  int rc = check_version(le16_at(b + OFF_VERSION), who);
  if (rc < 0)
    return rc;
  unsigned reclen = le16_at(b + OFF_RECLEN);
  if (reclen != REC_LEN)
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "%s: record length %u is not %d for version %d", who,
                       reclen, REC_LEN, GPUIPC_HANDLE_VERSION);
  static const struct {
    unsigned off, len;
  } reserved[] = {
      {OFF_RESERVED1, 4},
      {OFF_RESERVED2, 4},
      {OFF_RESERVED3, RESERVED3_LEN},
  };
  for (size_t i = 0; i < GPUIPC__ARRAY_SIZE(reserved); i++)
    if (!all_zero(b + reserved[i].off, reserved[i].len))
      return gpuipc__err(GPUIPC_E_BADHANDLE,
                         "%s: reserved bytes %u..%u are not zero", who,
                         reserved[i].off,
                         reserved[i].off + reserved[i].len - 1);
  uint32_t stored = le32_at(b + OFF_CRC);
  uint32_t computed = gpuipc__crc32c(0, b, OFF_CRC);
  if (stored != computed)
    return gpuipc__err(GPUIPC_E_BADHANDLE,
                       "%s: CRC-32C mismatch: the record says 0x%08" PRIx32
                       ", its bytes give 0x%08" PRIx32 " (corrupted)",
                       who, stored, computed);

  gpuipc_handle_t h;
  memset(&h, 0, sizeof(h));
  struct gpuipc__rbuf r;
  gpuipc__rbuf_init(&r, b, OFF_CRC);
  (void)gpuipc__get_u32(&r); /* magic */
  h.version = gpuipc__get_u16(&r);
  (void)gpuipc__get_u16(&r); /* record length */
  h.kind = (gpuipc_kind_t)gpuipc__get_u8(&r);
  h.type = (gpuipc_handle_type_t)gpuipc__get_u8(&r);
  h.flags = gpuipc__get_u16(&r);
  (void)gpuipc__get_u32(&r); /* reserved */
  h.size = gpuipc__get_u64(&r);
  h.offset = gpuipc__get_u64(&r);
  h.alloc_size = gpuipc__get_u64(&r);
  gpuipc__get_bytes(&r, h.device_uuid, sizeof(h.device_uuid));
  h.export_id = gpuipc__get_u64(&r);
  gpuipc__get_bytes(&r, h.boot_id, sizeof(h.boot_id));
  h.pid = gpuipc__get_u32(&r);
  (void)gpuipc__get_u32(&r); /* reserved */
  h.pidns = gpuipc__get_u64(&r);
  h.nonce = gpuipc__get_u64(&r);
  gpuipc__get_bytes(&r, h.bytes, sizeof(h.bytes));
  uint8_t reserved3[RESERVED3_LEN]; /* checked zero above */
  gpuipc__get_bytes(&r, reserved3, sizeof(reserved3));
  rc = gpuipc__rbuf_finish(&r, who);
  if (rc < 0) /* the layout above is wrong */
    return rc;
  h.fd = -1;

  rc = gpuipc__handle_validate(&h, who);
  if (rc < 0)
    return rc;
  *out = h;
  return 0;
}
