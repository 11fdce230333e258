/*
 * A segment's state, and the journal that records it. Every change of a
 * segment's state in the broker goes through gpuipc__bk_seg_set_state,
 * which checks that the state machine makes it (broker_seg.c and
 * broker_req.c decide when) and writes the journal record it needs; a
 * segment forgotten with a record has it dropped (gpuipc__bk_seg_forget).
 * Nothing else writes the journal but compaction. See broker_int.h for the
 * other broker files.
 */
#include "domain/broker_int.h"
#include "os/os.h"
#include "wire/wire.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Whether a segment in @state, reachable by @named or not, has a record. */
static bool journaled(bool named, uint8_t state)
{
  return named && (state == GPUIPC__SEG_PUBLISHED ||
                   state == GPUIPC__SEG_FILLING || state == GPUIPC__SEG_LOST);
}

/*
 * The broker keeps, in the domain's lock file, a journal of the names it
 * publishes and removes: "P id size kind name mem" (published), "L id size
 * kind name [mem]" (lost), "F id size kind name mem" (being filled: after a
 * crash the name is free unless its creator re-publishes it), "U id" (the
 * name went). mem, in hexadecimal, says which memory the segment had
 * (gpuipc__bk_mem_id): a survivor re-publishing it must bring that memory
 * back, no other (journals of earlier versions lack it: then any memory
 * of the name's kind and size is taken). Every broker holds that file (its
 * descriptor is the lock, and moves with a hand-over), so a broker elected
 * after a crash reads which names the dead one had: those that no survivor
 * re-publishes are reported lost. A domain that ends cleanly empties it.
 */
#define JOURNAL_MAX (64u << 20)

static void journal_write(struct gpuipc__broker *b, const char *rec, int len)
{
  if (len <= 0)
    return;
  ssize_t n = pwrite(b->lock_fd, rec, (size_t)len, (off_t)b->jlen);
  if (n == len) {
    b->jlen += (uint64_t)len;
    b->jrecs++;
    return;
  }
  if (!b->jfailed)
    GPUIPC_LOG_W("broker %s: cannot write the name journal in %s: %s; "
                 "after a crash, lost segments may read as absent",
                 b->name, b->paths.lock, n < 0 ? strerror(errno) : "short");
  b->jfailed = true;
}

static void journal_rec(struct gpuipc__broker *b, const struct gpuipc__seg *s)
{
  char rec[160];
  uint64_t mem = s->w.state == GPUIPC__SEG_LOST ? s->mem_id
                                                : gpuipc__bk_mem_id(&s->w);
  int len = snprintf(rec, sizeof(rec), "%c %llu %llu %u %s",
                     s->w.state == GPUIPC__SEG_LOST      ? 'L'
                     : s->w.state == GPUIPC__SEG_FILLING ? 'F'
                                                         : 'P',
                     (unsigned long long)s->w.id,
                     (unsigned long long)s->w.size, s->w.kind, s->w.name);
  if (len > 0 && (size_t)len < sizeof(rec))
    len += snprintf(rec + len, sizeof(rec) - (size_t)len,
                    mem != 0 ? " %llx\n" : "\n", (unsigned long long)mem);
  journal_write(b, rec, len);
}

/* Rewrite the journal from the registry. */
void gpuipc__bk_journal_compact(struct gpuipc__broker *b)
{
  if (ftruncate(b->lock_fd, 0) != 0 && !b->jfailed) {
    GPUIPC_LOG_W("broker %s: cannot truncate %s: %s", b->name, b->paths.lock,
                 strerror(errno));
    b->jfailed = true;
  }
  b->jlen = b->jrecs = 0;
  for (struct gpuipc__seg *s = b->reg.head; s != NULL; s = s->next)
    if (journaled(s->named, s->w.state))
      journal_rec(b, s);
}

static void journal_maybe_compact(struct gpuipc__broker *b)
{
  if (b->jrecs > 2 * b->reg.named + 1024)
    gpuipc__bk_journal_compact(b);
}

/* @s is published (or being filled, or lost) under its name. */
static void journal_put(struct gpuipc__broker *b, const struct gpuipc__seg *s)
{
  if (!s->named || b->jloading)
    return;
  journal_rec(b, s);
  journal_maybe_compact(b);
}

/* Segment @id no longer has a name. */
static void journal_drop(struct gpuipc__broker *b, uint64_t id)
{
  if (b->jloading)
    return;
  char rec[32];
  int len = snprintf(rec, sizeof(rec), "U %llu\n", (unsigned long long)id);
  journal_write(b, rec, len);
  journal_maybe_compact(b);
}

/* Apply one journal line to the registry (of tombstones). */
static void journal_apply(struct gpuipc__broker *b, char *line)
{
  char op;
  unsigned long long id, size = 0;
  unsigned long long mem = 0;
  unsigned kind = 0;
  char name[GPUIPC__NAME_MAX + 2];
  struct gpuipc__seg *s;
  if (sscanf(line, "%c %llu", &op, &id) != 2 || id == 0)
    return;
  if (op == 'U') {
    s = gpuipc__reg_by_id(&b->reg, id);
    if (s != NULL)
      gpuipc__reg_remove(&b->reg, s);
    return;
  }
  if (id > GPUIPC__ID_MAX || (op != 'P' && op != 'L' && op != 'F') ||
      sscanf(line, "%c %llu %llu %u %64s %llx", &op, &id, &size, &kind, name,
             &mem) < 5 ||
      size == 0 || size > GPUIPC_SIZE_MAX_ABSURD ||
      !gpuipc__kind_concrete(kind) ||
      gpuipc__name_check(name, "journal name") != 0)
    return;
  if ((s = gpuipc__reg_by_id(&b->reg, id)) != NULL)
    gpuipc__reg_remove(&b->reg, s);
  if ((s = gpuipc__reg_by_name(&b->reg, name)) != NULL)
    gpuipc__reg_remove(&b->reg, s);
  gpuipc__bk_learn_id(b, id);
  if (op == 'F')
    return; /* never published: nothing of it is lost */
  if (gpuipc__reg_add(&b->reg, name, id, &s) != 0)
    return;
  s->w.size = size;
  s->w.kind = (uint8_t)kind;
  s->mem_id = mem;
  gpuipc__bk_seg_set_state(b, s, GPUIPC__SEG_LOST);
}

/* After a crash: every name the dead broker had is lost until re-published. */
void gpuipc__bk_journal_load(struct gpuipc__broker *b)
{
  struct stat st;
  if (fstat(b->lock_fd, &st) != 0 || st.st_size <= 0)
    return;
  size_t len = (size_t)st.st_size < JOURNAL_MAX ? (size_t)st.st_size
                                                : JOURNAL_MAX;
  char *buf = malloc(len + 1);
  if (buf == NULL)
    return;
  ssize_t n = pread(b->lock_fd, buf, len, 0);
  if (n > 0) {
    buf[n] = '\0';
    char *line = buf;
    b->jloading = true; /* the records replayed are in the file already */
    for (char *nl; (nl = strchr(line, '\n')) != NULL; line = nl + 1) {
      *nl = '\0'; /* a torn last line (no newline) is ignored */
      journal_apply(b, line);
    }
    b->jloading = false;
  }
  free(buf);
  GPUIPC_LOG_I("broker %s: the journal names %zu segments of the last broker",
               b->name, b->reg.count);
}

/*
 * The changes the state machine makes. 0 is a segment just added to the
 * registry: reserved (CREATING), published, re-published or handed in
 * (any state a record may carry), or replayed from the journal (LOST).
 */
static bool legal(uint8_t from, uint8_t to)
{
  switch (from) {
  case 0:
    return to != 0;
  case GPUIPC__SEG_CREATING: /* published, or filled */
    return to == GPUIPC__SEG_PUBLISHED || to == GPUIPC__SEG_FILLING;
  case GPUIPC__SEG_FILLING: /* READY */
    return to == GPUIPC__SEG_PUBLISHED;
  case GPUIPC__SEG_PUBLISHED: /* unlinked, lost, or re-published */
    return to == GPUIPC__SEG_UNLINKED || to == GPUIPC__SEG_LOST ||
           to == GPUIPC__SEG_PUBLISHED;
  case GPUIPC__SEG_LOST: /* brought back by a holder */
    return to == GPUIPC__SEG_PUBLISHED || to == GPUIPC__SEG_UNLINKED;
  case GPUIPC__SEG_UNLINKED: /* re-published as it is */
    return to == GPUIPC__SEG_UNLINKED;
  default:
    return false;
  }
}

void gpuipc__bk_seg_set_state(struct gpuipc__broker *b, struct gpuipc__seg *s,
                              uint8_t state)
{
  uint8_t from = s->w.state;
  if (!legal(from, state)) {
    GPUIPC_LOG_E("broker %s: segment %s (id %llu) may not go from state %u "
                 "to %u (a bug in the broker)", b->name, s->w.name,
                 (unsigned long long)s->w.id, from, state);
    assert(!"illegal segment state change");
  }
  bool had = journaled(s->named, from);
  if (state == GPUIPC__SEG_UNLINKED && s->named)
    gpuipc__reg_unname(&b->reg, s);
  s->w.state = state;
  if (journaled(s->named, state))
    journal_put(b, s);
  else if (had)
    journal_drop(b, s->w.id);
}

void gpuipc__bk_seg_forget(struct gpuipc__broker *b, struct gpuipc__seg *s)
{
  if (journaled(s->named, s->w.state))
    journal_drop(b, s->w.id);
  gpuipc__reg_remove(&b->reg, s);
}
