/*
 * The index of the broker's parked requests (struct park, broker_int.h):
 * every park is on three lists at once -- all of them in arrival order
 * (timeouts, the recovery window), its name's hash bucket in arrival order
 * (a name published or freed: broker_seg.c's redispatch), and its
 * connection's (a connection dropped) -- so that neither parking nor
 * serving a name nor dropping a connection walks the others' parks. No
 * policy here: broker_seg.c decides what parks and when it is served.
 */
#include "domain/broker_int.h"

#include <stdlib.h>
#include <string.h>

static size_t bucket_of(const char *name)
{
  uint32_t h = 5381; /* djb2 */
  for (; *name != '\0'; name++)
    h = h * 33u + (uint8_t)*name;
  return h & (PARK_BUCKETS - 1);
}

void gpuipc__bk_park_add(struct gpuipc__parks *ps, struct park *p)
{
  p->next = NULL;
  p->prev = ps->tail;
  if (ps->tail != NULL)
    ps->tail->next = p;
  else
    ps->head = p;
  ps->tail = p;

  size_t i = bucket_of(p->name);
  p->name_next = NULL;
  p->name_prev = ps->by_name[i].tail;
  if (ps->by_name[i].tail != NULL)
    ps->by_name[i].tail->name_next = p;
  else
    ps->by_name[i].head = p;
  ps->by_name[i].tail = p;

  struct gpuipc__conn *c = p->conn;
  p->conn_prev = NULL;
  p->conn_next = c->parks;
  if (c->parks != NULL)
    c->parks->conn_prev = p;
  c->parks = p;
  c->nparks++;
}

void gpuipc__bk_park_unlink(struct gpuipc__parks *ps, struct park *p)
{
  if (p->prev != NULL)
    p->prev->next = p->next;
  else
    ps->head = p->next;
  if (p->next != NULL)
    p->next->prev = p->prev;
  else
    ps->tail = p->prev;

  size_t i = bucket_of(p->name);
  if (p->name_prev != NULL)
    p->name_prev->name_next = p->name_next;
  else
    ps->by_name[i].head = p->name_next;
  if (p->name_next != NULL)
    p->name_next->name_prev = p->name_prev;
  else
    ps->by_name[i].tail = p->name_prev;

  struct gpuipc__conn *c = p->conn;
  if (p->conn_prev != NULL)
    p->conn_prev->conn_next = p->conn_next;
  else
    c->parks = p->conn_next;
  if (p->conn_next != NULL)
    p->conn_next->conn_prev = p->conn_prev;
  c->nparks--;
  p->prev = p->next = p->name_prev = p->name_next = NULL;
  p->conn_prev = p->conn_next = NULL;
}

struct park *gpuipc__bk_parks_take(struct gpuipc__parks *ps, const char *name)
{
  struct park *list = NULL, **tail = &list, *next;
  struct park *p = name != NULL ? ps->by_name[bucket_of(name)].head
                                : ps->head;
  for (; p != NULL; p = next) {
    next = name != NULL ? p->name_next : p->next;
    bool take = name != NULL ? !p->recovery && strcmp(p->name, name) == 0
                             : p->recovery;
    if (!take)
      continue;
    gpuipc__bk_park_unlink(ps, p);
    *tail = p;
    tail = &p->next;
  }
  return list;
}

void gpuipc__bk_parks_drop_conn(struct gpuipc__parks *ps,
                                struct gpuipc__conn *c)
{
  while (c->parks != NULL) {
    struct park *p = c->parks;
    gpuipc__bk_park_unlink(ps, p);
    free(p);
  }
}

void gpuipc__bk_parks_free_all(struct gpuipc__parks *ps)
{
  while (ps->head != NULL) { /* their members are gone: no accounts */
    struct park *p = ps->head;
    ps->head = p->next;
    free(p);
  }
  memset(ps, 0, sizeof(*ps));
}
