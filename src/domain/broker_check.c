/*
 * What a member may publish or re-publish: a descriptor that can be the
 * memory its handle describes, and memory its creator keeps only from the
 * process that exported it. Checks of a record and a descriptor (no
 * registry state): broker_req.c asks them before a PUBLISH or REPUBLISH
 * changes the registry. See broker_int.h for the other broker files.
 */
#include "domain/broker_int.h"
#include "os/os.h"
#include "wire/wire.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

/*
 * The NVIDIA driver's device number: the descriptor a VMM or pool handle
 * travels with is one of /dev/nvidiactl (the driver imports from nothing
 * else). What it exports cannot be checked without CUDA; the broker never
 * touches CUDA.
 */
#define NV_MAJOR_DEVICE 195

/*
 * Whether descriptor @fd can be what @w's handle says: a HOST memfd sealed
 * as gpuipc seals its own, of the size its importers will insist on; for
 * VMM and POOL, a descriptor of the NVIDIA driver. Else GPUIPC_E_BADHANDLE
 * with a sentence: stored, it would only fail every opener.
 */
static int check_seg_fd(const struct gpuipc__seg_wire *w, int fd)
{
  if (fd < 0)
    return 0; /* decoding made sure the handle travels without one */
  gpuipc_handle_t h;
  int rc = gpuipc_handle_unpack(w->handle, sizeof(w->handle), &h);
  if (rc != 0)
    return rc;
  if (w->kind == GPUIPC_KIND_HOST) {
    size_t actual;
    rc = gpuipc__memfd_check(fd, h.alloc_size, &actual);
    if (rc != 0)
      return rc;
    int seals = fcntl(fd, F_GET_SEALS);
    if ((seals & GPUIPC__MEMFD_SEALS) != GPUIPC__MEMFD_SEALS)
      return gpuipc__err(GPUIPC_E_BADHANDLE, "its memfd has seals 0x%x, "
                         "not the 0x%x gpuipc seals its memory with", seals,
                         GPUIPC__MEMFD_SEALS);
    if (actual != h.alloc_size)
      return gpuipc__err(GPUIPC_E_BADHANDLE, "its memfd holds %zu bytes, "
                         "its handle says %llu", actual,
                         (unsigned long long)h.alloc_size);
    return 0;
  }
  struct stat st;
  if (fstat(fd, &st) != 0)
    return gpuipc__err_errno(errno, "fstat of its descriptor");
  if (!S_ISCHR(st.st_mode) || major(st.st_rdev) != NV_MAJOR_DEVICE)
    return gpuipc__err(GPUIPC_E_BADHANDLE, "a %s handle travels with a "
                       "descriptor of the NVIDIA driver (device major %d), "
                       "not this one (mode 0%o, device %u:%u)",
                       gpuipc_kind_name((gpuipc_kind_t)w->kind),
                       NV_MAJOR_DEVICE, (unsigned)(st.st_mode & S_IFMT),
                       major(st.st_rdev), minor(st.st_rdev));
  return 0;
}

/* Whether process @pid lives in pid namespace @ns, as pid @nspid there. */
static bool pid_in_ns(pid_t pid, uint64_t ns, uint32_t nspid)
{
  char path[64];
  struct stat st;
  snprintf(path, sizeof(path), "/proc/%d/ns/pid", (int)pid);
  if (stat(path, &st) != 0 || (uint64_t)st.st_ino != ns)
    return false;
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "re");
  if (f == NULL)
    return false;
  char line[256];
  long last = -1;
  while (fgets(line, sizeof(line), f) != NULL) {
    if (strncmp(line, "NSpid:", 6) != 0)
      continue;
    for (char *p = line + 6, *end; ; p = end) {
      long v = strtol(p, &end, 10);
      if (end == p)
        break;
      last = v; /* the innermost namespace's comes last */
    }
    break;
  }
  fclose(f);
  return last >= 0 && (uint32_t)last == nspid;
}

/*
 * Whether @c's process exported the handle in @w: the process whose memory
 * a creator-held segment is, the only one that may keep it.
 */
bool gpuipc__bk_is_exporter(const struct gpuipc__conn *c,
                            const struct gpuipc__seg_wire *w)
{
  gpuipc_handle_t h;
  if (!w->has_handle ||
      gpuipc_handle_unpack(w->handle, sizeof(w->handle), &h) != 0)
    return false;
  const struct gpuipc__proc_id *me = gpuipc__proc_self();
  if (memcmp(h.boot_id, me->boot_id, sizeof(h.boot_id)) != 0)
    return false;
  if (h.pidns == me->pidns)
    return h.pid == (uint32_t)c->cred.pid;
  return pid_in_ns(c->cred.pid, h.pidns, h.pid);
}

/* The exporter's pid as a handle record names it (for sentences). */
uint32_t gpuipc__bk_exporter_pid(const struct gpuipc__seg_wire *w)
{
  gpuipc_handle_t h;
  if (gpuipc_handle_unpack(w->handle, sizeof(w->handle), &h) != 0)
    return 0;
  return h.pid;
}

/* 0, or the code refuse_publish gives (with the reason in @why). */
int gpuipc__bk_publish_check(const struct gpuipc__conn *c,
                             const struct gpuipc__seg_wire *w, int fd,
                             char *why, size_t cap)
{
  int rc = check_seg_fd(w, fd);
  if (rc != 0) {
    snprintf(why, cap, "%s", gpuipc_last_error());
    return rc;
  }
  if ((w->flags & GPUIPC__SEGF_CREATOR_HELD) && !gpuipc__bk_is_exporter(c, w)) {
    snprintf(why, cap,
             "its memory is held by the process that exported "
             "it (pid %u), not by pid %d",
             gpuipc__bk_exporter_pid(w), (int)c->cred.pid);
    return GPUIPC_E_DENIED;
  }
  return 0;
}

/*
 * Whether @w's memory lives in its creator's process alone: LEGACY and
 * fabric memory and POOL allocations are, whatever a sender's flags say.
 */
bool gpuipc__bk_held_by_creator(const struct gpuipc__seg_wire *w)
{
  if (w->flags & GPUIPC__SEGF_CREATOR_HELD)
    return true;
  return w->has_handle &&
         (!gpuipc__htype_has_fd(w->htype) || w->htype == GPUIPC_HT_POOL);
}

/*
 * A re-publication brings what its sender holds: a descriptor that can be
 * the memory, and the keeper's part only from the process whose memory it
 * is. 0, or the code it is refused with and the reason in @why.
 */
int gpuipc__bk_republish_check(const struct gpuipc__conn *c,
                               const struct gpuipc__seg_wire *w, int fd,
                               bool keeper, char *why, size_t cap)
{
  int rc = check_seg_fd(w, fd);
  if (rc != 0) {
    snprintf(why, cap, "%s", gpuipc_last_error());
    return rc;
  }
  if (keeper && !gpuipc__bk_is_exporter(c, w)) {
    snprintf(why, cap, "it claims to keep memory that pid %u exported",
             gpuipc__bk_exporter_pid(w));
    return GPUIPC_E_DENIED;
  }
  return 0;
}

/* Whether handles @a and @b name one export of one process. */
static bool same_export(const gpuipc_handle_t *a, const gpuipc_handle_t *b)
{
  return a->kind == b->kind && a->type == b->type &&
         a->export_id == b->export_id && a->pid == b->pid &&
         a->pidns == b->pidns && a->nonce == b->nonce &&
         memcmp(a->boot_id, b->boot_id, sizeof(a->boot_id)) == 0 &&
         a->size == b->size && a->offset == b->offset &&
         a->alloc_size == b->alloc_size &&
         memcmp(a->device_uuid, b->device_uuid, sizeof(a->device_uuid)) == 0;
}

static uint64_t fnv(uint64_t x, const void *p, size_t n)
{
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++)
    x = (x ^ b[i]) * 0x100000001b3ull;
  return x;
}

/*
 * What memory @w's handle names, as 64 bits that the journal keeps (never
 * 0; 0: @w has no handle): what same_export compares, and the bytes where
 * they are the memory (LEGACY, fabric).
 */
uint64_t gpuipc__bk_mem_id(const struct gpuipc__seg_wire *w)
{
  gpuipc_handle_t h;
  if (!w->has_handle ||
      gpuipc_handle_unpack(w->handle, sizeof(w->handle), &h) != 0)
    return 0;
  uint64_t v[] = {(uint64_t)h.kind, (uint64_t)h.type, h.export_id, h.pid,
                  h.pidns, h.nonce, h.size, h.offset, h.alloc_size};
  uint64_t x = fnv(0xcbf29ce484222325ull, v, sizeof(v));
  x = fnv(x, h.boot_id, sizeof(h.boot_id));
  x = fnv(x, h.device_uuid, sizeof(h.device_uuid));
  if (!gpuipc__htype_has_fd(h.type))
    x = fnv(x, h.bytes, sizeof(h.bytes));
  return x != 0 ? x : 1;
}

/*
 * Whether @w names the memory that record @rec (which has a handle) does:
 * the same export of the same process, with the same bytes where the
 * handle's bytes are the memory (LEGACY, fabric), and the same flags. If
 * not, what differs is in @why.
 */
bool gpuipc__bk_same_memory(const struct gpuipc__seg_wire *rec,
                            const struct gpuipc__seg_wire *w, char *why,
                            size_t cap)
{
  gpuipc_handle_t a, h;
  if (!w->has_handle ||
      gpuipc_handle_unpack(w->handle, sizeof(w->handle), &h) != 0) {
    snprintf(why, cap, "other memory: no handle");
    return false;
  }
  if (gpuipc_handle_unpack(rec->handle, sizeof(rec->handle), &a) != 0) {
    snprintf(why, cap, "other memory: the segment's own handle does not "
             "unpack (%s)", gpuipc_last_error());
    return false;
  }
  if (!same_export(&a, &h)) {
    snprintf(why, cap, "other memory: export %llu of pid %u, not the "
             "segment's export %llu of pid %u",
             (unsigned long long)h.export_id, h.pid,
             (unsigned long long)a.export_id, a.pid);
    return false;
  }
  if (!gpuipc__htype_has_fd(h.type) &&
      memcmp(a.bytes, h.bytes, sizeof(a.bytes)) != 0) {
    snprintf(why, cap, "other memory: export %llu of pid %u with other "
             "handle bytes", (unsigned long long)h.export_id, h.pid);
    return false;
  }
  if (rec->flags != w->flags) {
    snprintf(why, cap, "other memory: segment flags 0x%x, not 0x%x",
             w->flags, rec->flags);
    return false;
  }
  return true;
}
