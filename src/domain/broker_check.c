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
 * A re-publication brings what its sender holds: a descriptor that can be
 * the memory, and the keeper's part only from the process whose memory it
 * is. Anything else disconnects the sender (REPUBLISH has no reply).
 */
bool gpuipc__bk_republish_allowed(struct gpuipc__broker *b,
                                  struct gpuipc__conn *c,
                                  const struct gpuipc__seg_wire *w, int fd,
                                  bool keeper)
{
  char why[GPUIPC__TEXT_MAX + 1];
  if (check_seg_fd(w, fd) != 0)
    snprintf(why, sizeof(why), "%s", gpuipc_last_error());
  else if (keeper && !gpuipc__bk_is_exporter(c, w))
    snprintf(why, sizeof(why), "it claims to keep memory that pid %u "
             "exported", gpuipc__bk_exporter_pid(w));
  else
    return true;
  GPUIPC_LOG_W("broker %s: pid %d re-published segment %s (id %llu): %s; "
               "disconnecting it", b->name, (int)c->cred.pid, w->name,
               (unsigned long long)w->id, why);
  c->doomed = true;
  return false;
}
