/*
 * The index of the broker's parked requests (src/domain/broker_park.c):
 * the requests parked on a name come back in arrival order and only they,
 * also when names share a hash bucket; the ones waiting for the recovery
 * window are taken apart from those waiting for a name; dropping a
 * connection frees its parks and leaves the others in order; every list
 * and each connection's count stay consistent throughout.
 */
#include "test.h"

#include "domain/broker_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NPARKS 600 /* more than PARK_BUCKETS: names share buckets */

static struct gpuipc__parks parks;
static struct gpuipc__conn conns[3];

static struct park *add(int i, bool recovery)
{
  struct park *p = calloc(1, sizeof(*p));
  ASSERT_PTR_NE(p, NULL);
  p->conn = &conns[i % 3];
  p->req = (uint32_t)i;
  p->recovery = recovery;
  snprintf(p->name, sizeof(p->name), "name%d", i % 7 == 0 ? 0 : i);
  gpuipc__bk_park_add(&parks, p);
  return p;
}

/* Every list agrees with the others: count them all. */
static void check_lists(size_t want)
{
  size_t n = 0, named = 0;
  uint32_t last = 0;
  for (struct park *p = parks.all.head; p != NULL; p = p->all.next, n++) {
    if (n != 0)
      ASSERT_GT(p->req, last); /* arrival order */
    last = p->req;
    ASSERT_PTR_EQ(p->all.next == NULL ? parks.all.tail : p->all.next->all.prev,
                  p);
  }
  ASSERT_EQ(n, want);
  for (size_t i = 0; i < PARK_BUCKETS; i++)
    for (struct park *p = parks.by_name[i].head; p != NULL;
         p = p->by_name.next) {
      ASSERT_PTR_EQ(p->by_name.next == NULL ? parks.by_name[i].tail
                                            : p->by_name.next->by_name.prev,
                    p);
      named++;
    }
  ASSERT_EQ(named, want);
  size_t counted = 0;
  for (int c = 0; c < 3; c++) {
    uint32_t k = 0;
    for (struct park *p = conns[c].parks.head; p != NULL;
         p = p->by_conn.next, k++)
      ASSERT_PTR_EQ(p->conn, &conns[c]);
    ASSERT_EQ(k, conns[c].nparks);
    counted += k;
  }
  ASSERT_EQ(counted, want);
}

static size_t free_list(struct park *l, const char *name, bool recovery)
{
  size_t n = 0;
  uint32_t last = 0;
  while (l != NULL) {
    struct park *p = l;
    l = p->next;
    if (name != NULL)
      ASSERT_STREQ(p->name, name);
    ASSERT_EQ(p->recovery, recovery);
    if (n++ != 0)
      ASSERT_GT(p->req, last);
    last = p->req;
    free(p);
  }
  return n;
}

int main(void)
{
  size_t n = 0, on0 = 0, recovery = 0;
  for (int i = 1; i <= NPARKS; i++, n++) {
    bool r = i % 5 == 0;
    add(i, r);
    recovery += r;
    if (i % 7 == 0)
      on0 += !r;
  }
  check_lists(n);

  /* A name taken: its parks that wait for it, in order, and no other. */
  ASSERT_EQ(free_list(gpuipc__bk_parks_take(&parks, "name0"), "name0", false),
            on0);
  n -= on0;
  check_lists(n);
  ASSERT_PTR_EQ(gpuipc__bk_parks_take(&parks, "name0"), NULL);
  ASSERT_PTR_EQ(gpuipc__bk_parks_take(&parks, "nobody"), NULL);
  ASSERT_EQ(free_list(gpuipc__bk_parks_take(&parks, "name1"), "name1", false),
            1);
  n--;
  check_lists(n);

  /* A connection dropped: its parks go, the others stay in order. */
  size_t of1 = conns[1].nparks;
  gpuipc__bk_parks_drop_conn(&parks, &conns[1]);
  ASSERT_EQ(conns[1].nparks, 0);
  ASSERT_PTR_EQ(conns[1].parks.head, NULL);
  n -= of1;
  check_lists(n);

  /* The recovery window closes: the parks that waited for it, only. */
  size_t left_recovery = 0;
  for (struct park *p = parks.all.head; p != NULL; p = p->all.next)
    left_recovery += p->recovery;
  ASSERT_GT(left_recovery, 0);
  ASSERT_LT(left_recovery, recovery);
  ASSERT_EQ(free_list(gpuipc__bk_parks_take(&parks, NULL), NULL, true),
            left_recovery);
  n -= left_recovery;
  check_lists(n);
  for (struct park *p = parks.all.head; p != NULL; p = p->all.next)
    ASSERT_TRUE(!p->recovery);

  /* One unlinked by hand (a deadline passed), then the rest at once. */
  struct park *mid = parks.all.head->all.next;
  gpuipc__bk_park_unlink(&parks, mid);
  free(mid);
  n--;
  check_lists(n);
  gpuipc__bk_parks_free_all(&parks);
  ASSERT_PTR_EQ(parks.all.head, NULL);
  ASSERT_PTR_EQ(parks.all.tail, NULL);
  printf("broker_parks: ok\n");
  return 0;
}
