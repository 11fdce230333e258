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

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static size_t bucket_of(const char *name)
{
  uint32_t h = 5381; /* djb2 */
  for (; *name != '\0'; name++)
    h = h * 33u + (uint8_t)*name;
  return h & (PARK_BUCKETS - 1);
}

#define ALL offsetof(struct park, all)
#define BY_NAME offsetof(struct park, by_name)
#define BY_CONN offsetof(struct park, by_conn)

/* @p's link at offset @off (ALL, BY_NAME or BY_CONN). */
static struct park_link *link_at(struct park *p, size_t off)
{
  return (struct park_link *)((char *)p + off);
}

static void list_add(struct park_list *l, struct park *p, size_t off)
{
  struct park_link *k = link_at(p, off);
  k->next = NULL;
  k->prev = l->tail;
  if (l->tail != NULL)
    link_at(l->tail, off)->next = p;
  else
    l->head = p;
  l->tail = p;
}

static void list_del(struct park_list *l, struct park *p, size_t off)
{
  struct park_link *k = link_at(p, off);
  if (k->prev != NULL)
    link_at(k->prev, off)->next = k->next;
  else
    l->head = k->next;
  if (k->next != NULL)
    link_at(k->next, off)->prev = k->prev;
  else
    l->tail = k->prev;
  k->prev = k->next = NULL;
}

void gpuipc__bk_park_add(struct gpuipc__parks *ps, struct park *p)
{
  list_add(&ps->all, p, ALL);
  list_add(&ps->by_name[bucket_of(p->name)], p, BY_NAME);
  list_add(&p->conn->parks, p, BY_CONN);
  p->conn->nparks++;
}

void gpuipc__bk_park_unlink(struct gpuipc__parks *ps, struct park *p)
{
  list_del(&ps->all, p, ALL);
  list_del(&ps->by_name[bucket_of(p->name)], p, BY_NAME);
  list_del(&p->conn->parks, p, BY_CONN);
  p->conn->nparks--;
}

struct park *gpuipc__bk_parks_take(struct gpuipc__parks *ps, const char *name)
{
  struct park *list = NULL, **tail = &list, *next;
  struct park *p = name != NULL ? ps->by_name[bucket_of(name)].head
                                : ps->all.head;
  for (; p != NULL; p = next) {
    next = name != NULL ? p->by_name.next : p->all.next;
    bool take = name != NULL ? !p->recovery && strcmp(p->name, name) == 0
                             : p->recovery;
    if (!take)
      continue;
    gpuipc__bk_park_unlink(ps, p);
    p->next = NULL;
    *tail = p;
    tail = &p->next;
  }
  return list;
}

void gpuipc__bk_parks_drop_conn(struct gpuipc__parks *ps,
                                struct gpuipc__conn *c)
{
  while (c->parks.head != NULL) {
    struct park *p = c->parks.head;
    gpuipc__bk_park_unlink(ps, p);
    free(p);
  }
}

void gpuipc__bk_parks_free_all(struct gpuipc__parks *ps)
{
  while (ps->all.head != NULL) { /* their members are gone: no accounts */
    struct park *p = ps->all.head;
    ps->all.head = p->all.next;
    free(p);
  }
  memset(ps, 0, sizeof(*ps));
}
