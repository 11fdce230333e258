/* The broker's segment table: by name, by id, and in id order. */
#include "domain/domain.h"
#include "os/os.h"

#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#define REG_MIN_BUCKETS 64

static uint64_t hash_name(const char *s)
{
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
  for (; *s != '\0'; s++) {
    h ^= (uint8_t)*s;
    h *= 0x100000001b3ull;
  }
  return h;
}

static uint64_t hash_id(uint64_t id)
{
  id ^= id >> 33;
  id *= 0xff51afd7ed558ccdull;
  id ^= id >> 33;
  return id;
}

int gpuipc__reg_init(struct gpuipc__registry *reg)
{
  memset(reg, 0, sizeof(*reg));
  reg->nbuckets = REG_MIN_BUCKETS;
  reg->by_name = calloc(reg->nbuckets, sizeof(*reg->by_name));
  reg->by_id = calloc(reg->nbuckets, sizeof(*reg->by_id));
  if (reg->by_name == NULL || reg->by_id == NULL) {
    free(reg->by_name);
    free(reg->by_id);
    return gpuipc__err(-ENOMEM, "segment registry: out of memory");
  }
  return 0;
}

static void seg_free(struct gpuipc__seg *s)
{
  gpuipc__fd_close(&s->fd);
  free(s->holders);
  free(s);
}

void gpuipc__reg_destroy(struct gpuipc__registry *reg)
{
  struct gpuipc__seg *s = reg->head;
  while (s != NULL) {
    struct gpuipc__seg *next = s->next;
    seg_free(s);
    s = next;
  }
  free(reg->by_name);
  free(reg->by_id);
  memset(reg, 0, sizeof(*reg));
}

/* Double both tables once there are more segments than buckets. */
static void maybe_grow(struct gpuipc__registry *reg)
{
  if (reg->count < reg->nbuckets)
    return;
  size_t n = reg->nbuckets * 2;
  struct gpuipc__seg **bn = calloc(n, sizeof(*bn));
  struct gpuipc__seg **bi = calloc(n, sizeof(*bi));
  if (bn == NULL || bi == NULL) { /* keep the old tables: slower, correct */
    free(bn);
    free(bi);
    return;
  }
  for (struct gpuipc__seg *s = reg->head; s != NULL; s = s->next) {
    size_t i = hash_id(s->w.id) & (n - 1);
    s->id_next = bi[i];
    bi[i] = s;
    if (s->named) {
      size_t j = hash_name(s->w.name) & (n - 1);
      s->name_next = bn[j];
      bn[j] = s;
    }
  }
  free(reg->by_name);
  free(reg->by_id);
  reg->by_name = bn;
  reg->by_id = bi;
  reg->nbuckets = n;
}

int gpuipc__reg_add(struct gpuipc__registry *reg, const char *name,
                    uint64_t id, struct gpuipc__seg **out)
{
  struct gpuipc__seg *s = calloc(1, sizeof(*s));
  if (s == NULL)
    return gpuipc__err(-ENOMEM, "segment registry: out of memory");
  snprintf(s->w.name, sizeof(s->w.name), "%s", name);
  s->w.id = id;
  s->fd = -1;
  maybe_grow(reg);
  size_t mask = reg->nbuckets - 1;
  size_t i = hash_id(id) & mask;
  s->id_next = reg->by_id[i];
  reg->by_id[i] = s;
  size_t j = hash_name(name) & mask;
  s->name_next = reg->by_name[j];
  reg->by_name[j] = s;
  s->named = true;
  /* Keep the list in id order; new ids almost always go last. */
  struct gpuipc__seg *after = reg->tail;
  while (after != NULL && after->w.id > id)
    after = after->prev;
  s->prev = after;
  s->next = after != NULL ? after->next : reg->head;
  if (s->next != NULL)
    s->next->prev = s;
  else
    reg->tail = s;
  if (after != NULL)
    after->next = s;
  else
    reg->head = s;
  reg->count++;
  reg->named++;
  *out = s;
  return 0;
}

struct gpuipc__seg *gpuipc__reg_by_name(struct gpuipc__registry *reg,
                                        const char *name)
{
  size_t j = hash_name(name) & (reg->nbuckets - 1);
  for (struct gpuipc__seg *s = reg->by_name[j]; s != NULL; s = s->name_next)
    if (strcmp(s->w.name, name) == 0)
      return s;
  return NULL;
}

struct gpuipc__seg *gpuipc__reg_by_id(struct gpuipc__registry *reg,
                                      uint64_t id)
{
  size_t i = hash_id(id) & (reg->nbuckets - 1);
  for (struct gpuipc__seg *s = reg->by_id[i]; s != NULL; s = s->id_next)
    if (s->w.id == id)
      return s;
  return NULL;
}

void gpuipc__reg_unname(struct gpuipc__registry *reg, struct gpuipc__seg *s)
{
  if (!s->named)
    return;
  size_t j = hash_name(s->w.name) & (reg->nbuckets - 1);
  struct gpuipc__seg **pp = &reg->by_name[j];
  while (*pp != NULL && *pp != s)
    pp = &(*pp)->name_next;
  if (*pp == s)
    *pp = s->name_next;
  s->name_next = NULL;
  s->named = false;
  reg->named--;
}

void gpuipc__reg_set_fd(struct gpuipc__registry *reg, struct gpuipc__seg *s,
                        int fd)
{
  if (s->fd >= 0) {
    gpuipc__fd_close(&s->fd);
    reg->fds--;
  }
  if (fd >= 0) {
    s->fd = fd;
    reg->fds++;
  }
}

void gpuipc__reg_remove(struct gpuipc__registry *reg, struct gpuipc__seg *s)
{
  gpuipc__reg_unname(reg, s);
  size_t i = hash_id(s->w.id) & (reg->nbuckets - 1);
  struct gpuipc__seg **pp = &reg->by_id[i];
  while (*pp != NULL && *pp != s)
    pp = &(*pp)->id_next;
  if (*pp == s)
    *pp = s->id_next;
  if (s->prev != NULL)
    s->prev->next = s->next;
  else
    reg->head = s->next;
  if (s->next != NULL)
    s->next->prev = s->prev;
  else
    reg->tail = s->prev;
  gpuipc__reg_set_fd(reg, s, -1);
  reg->count--;
  seg_free(s);
}

int gpuipc__reg_hold(struct gpuipc__seg *s, struct gpuipc__conn *conn,
                     uint32_t pid, uint32_t n)
{
  for (uint32_t i = 0; i < s->nholders; i++) {
    if (s->holders[i].conn == conn) {
      uint64_t sum = (uint64_t)s->holders[i].refs + n;
      s->holders[i].refs = sum > UINT32_MAX ? UINT32_MAX : (uint32_t)sum;
      return 0;
    }
  }
  if (s->nholders == s->capholders) {
    uint32_t cap = s->capholders ? s->capholders * 2 : 4;
    struct gpuipc__holder *h = realloc(s->holders, cap * sizeof(*h));
    if (h == NULL)
      return gpuipc__err(-ENOMEM, "segment %s: out of memory for holders",
                         s->w.name);
    s->holders = h;
    s->capholders = cap;
  }
  s->holders[s->nholders++] = (struct gpuipc__holder){conn, pid, n};
  return 0;
}

uint32_t gpuipc__reg_drop(struct gpuipc__seg *s, struct gpuipc__conn *conn,
                          uint32_t n)
{
  for (uint32_t i = 0; i < s->nholders; i++) {
    if (s->holders[i].conn != conn)
      continue;
    uint32_t have = s->holders[i].refs;
    uint32_t drop = n < have ? n : have;
    s->holders[i].refs -= drop;
    if (s->holders[i].refs == 0)
      s->holders[i] = s->holders[--s->nholders];
    return drop;
  }
  return 0;
}

uint32_t gpuipc__reg_refs(const struct gpuipc__seg *s,
                          const struct gpuipc__conn *conn)
{
  for (uint32_t i = 0; i < s->nholders; i++)
    if (s->holders[i].conn == conn)
      return s->holders[i].refs;
  return 0;
}
