/*
 * gpuipc_segment_open and gpuipc_segment_unlink: the flags, the errors,
 * the import cache (one mapping per process, references counted by the
 * broker per process), unlink semantics, waiting, and many threads at once.
 */
#include "test.h"
#include "helpers/seg_peer.h"

#include "segment/segment.h"
#include "mem/mem.h"

#include <pthread.h>

static gpuipc_domain_t *dom;

static void stat_seg(const char *name, gpuipc_segment_info_t *s)
{
  memset(s, 0, sizeof(*s));
  s->size = sizeof(*s);
  ASSERT_OK(gpuipc_segment_stat(dom, name, s));
}

static void dom_info(gpuipc_domain_info_t *i)
{
  memset(i, 0, sizeof(*i));
  i->size = sizeof(*i);
  ASSERT_OK(gpuipc_domain_info(dom, i));
}

static void bad_arguments(void)
{
  gpuipc_buf_t *b = (gpuipc_buf_t *)0x1;
  ASSERT_RC(test_seg_open(NULL, "a", 1, -1, GPUIPC_CREATE, &b), -EINVAL);
  ASSERT_RC(test_seg_open(dom, "a", 1, -1, GPUIPC_CREATE, NULL),
            -EINVAL);
  ASSERT_RC(test_seg_open(dom, "a/b", 1, -1, GPUIPC_CREATE, &b),
            -EINVAL);
  ASSERT_ERR_MENTIONS("not allowed");
  ASSERT_RC(test_seg_open(dom, ".a", 1, -1, GPUIPC_CREATE, &b),
            -EINVAL);
  ASSERT_ERR_MENTIONS("starts with '.'");
  ASSERT_RC(test_seg_open(dom, "a", 1, -1, 0x80, &b), -EINVAL);
  ASSERT_ERR_MENTIONS("flags");
  ASSERT_RC(test_seg_open(dom, "a", 1, -1, TEST_SEG_KIND(9), &b),
            -EINVAL);
  ASSERT_RC(test_seg_open(dom, "a", 1, -1, GPUIPC_EXCL, &b), -EINVAL);
  ASSERT_ERR_MENTIONS("GPUIPC_EXCL needs GPUIPC_CREATE");
  ASSERT_RC(test_seg_open(dom, "a", 0, -1, GPUIPC_CREATE, &b), -EINVAL);
  ASSERT_ERR_MENTIONS("size");
  ASSERT_RC(test_seg_open(dom, "a", (size_t)1 << 50, -1, GPUIPC_CREATE,
                                &b),
            -EFBIG);
  ASSERT_RC(test_seg_open(dom, "absent", 0, -1, 0, &b), -ENOENT);
  ASSERT_ERR_MENTIONS("absent");
  ASSERT_RC(gpuipc_segment_unlink(dom, "absent"), -ENOENT);
  ASSERT_RC(gpuipc_segment_unlink(NULL, "absent"), -EINVAL);
  ASSERT_PTR_EQ(b, (gpuipc_buf_t *)0x1);
}

static void create_and_share(void)
{
  gpuipc_buf_t *a, *a2;
  ASSERT_OK(test_seg_open(dom, "s1", 10000, -1,
                                GPUIPC_CREATE | TEST_SEG_KIND(GPUIPC_KIND_HOST),
                                &a));
  ASSERT_EQ(gpuipc_buf_kind(a), GPUIPC_KIND_HOST);
  ASSERT_GE(gpuipc_buf_size(a), 10000);
  test_fill(gpuipc_buf_ptr(a), 10000, 11);

  /* Exclusive creation of an existing name fails. */
  ASSERT_RC(test_seg_open(dom, "s1", 10000, -1,
                                GPUIPC_CREATE | GPUIPC_EXCL, &a2),
            -EEXIST);
  /* Size and kind must match; the sentence gives both. */
  ASSERT_RC(test_seg_open(dom, "s1", 4096, -1, 0, &a2),
            GPUIPC_E_MISMATCH);
  ASSERT_ERR_MENTIONS("has 10000 bytes, the caller asked for 4096");
  ASSERT_RC(test_seg_open(dom, "s1", 0, -1,
                                TEST_SEG_KIND(GPUIPC_KIND_VMM), &a2),
            GPUIPC_E_MISMATCH);
  ASSERT_ERR_MENTIONS("host");

  /* A second open maps nothing new: the same buffer, one more reference. */
  struct gpuipc__cache_stats before, after;
  gpuipc__cache_stats(&before);
  ASSERT_OK(test_seg_open(dom, "s1", 0, -1, 0, &a2));
  gpuipc__cache_stats(&after);
  ASSERT_PTR_EQ(a2, a);
  ASSERT_EQ_U(after.hits, before.hits + 1);
  ASSERT_EQ_U(after.live, before.live);
  gpuipc_segment_info_t s;
  stat_seg("s1", &s);
  ASSERT_EQ(s.state, GPUIPC_SEG_PUBLISHED);
  ASSERT_EQ(s.nholders, 1);
  ASSERT_EQ(s.holder_pids[0], getpid());
  ASSERT_EQ(s.holder_refs[0], 2);
  ASSERT_EQ(s.broker_fd, 1);
  ASSERT_EQ_U(s.bytes, 10000);
  ASSERT_EQ(s.kind, GPUIPC_KIND_HOST);

  /* Another process reads what we wrote and writes back. */
  struct peer p;
  peer_start(&p);
  PEER_OK(&p, "join seg");
  const char *r = peer_cmd(&p, "open s1 0 -");
  int mine;
  size_t size;
  ASSERT_EQ(sscanf(r, "ok %d %zu", &mine, &size), 2);
  ASSERT_EQ(mine, 0);
  ASSERT_GE(size, 10000);
  PEER_OK(&p, "check s1 11");
  PEER_OK(&p, "fill s1 12");
  ASSERT_EQ(test_check(gpuipc_buf_ptr(a), size, 12), (size_t)-1);
  stat_seg("s1", &s);
  ASSERT_EQ(s.nholders, 2);

  /* Releasing one of two references keeps us a holder. */
  ASSERT_OK(gpuipc_buf_release(a2));
  stat_seg("s1", &s);
  ASSERT_EQ(s.nholders, 2);
  ASSERT_OK(gpuipc_buf_release(a));
  stat_seg("s1", &s);
  ASSERT_EQ(s.nholders, 1);
  ASSERT_EQ(s.holder_pids[0], p.pid);
  /* The broker's fd keeps it alive though its creator let go. */
  PEER_OK(&p, "release s1");
  stat_seg("s1", &s);
  ASSERT_EQ(s.nholders, 0);
  ASSERT_EQ(s.state, GPUIPC_SEG_PUBLISHED);
  r = peer_cmd(&p, "open s1 10000 -");
  ASSERT_TRUE(strncmp(r, "ok 0", 4) == 0);
  PEER_OK(&p, "check s1 12");

  /* Unlink: the name is free at once, the memory stays with its holder. */
  gpuipc_domain_info_t di;
  dom_info(&di);
  int fds_before = di.broker_fds;
  ASSERT_OK(gpuipc_segment_unlink(dom, "s1"));
  ASSERT_RC(test_seg_open(dom, "s1", 0, -1, 0, &a), -ENOENT);
  ASSERT_RC(gpuipc_segment_unlink(dom, "s1"), -ENOENT);
  ASSERT_OK(test_seg_open(dom, "s1", 10000, -1, GPUIPC_CREATE, &a));
  const uint8_t *z = gpuipc_buf_ptr(a);
  for (size_t i = 0; i < 10000; i++)
    ASSERT_EQ(z[i], 0); /* a new, zeroed segment */
  PEER_OK(&p, "check s1 12"); /* the peer still sees the old one */
  gpuipc_segment_info_t list[8];
  for (int i = 0; i < 8; i++)
    list[i].size = sizeof(list[i]);
  ASSERT_EQ(gpuipc_segment_list(dom, list, 8), 2);
  ASSERT_EQ(list[0].state, GPUIPC_SEG_UNLINKED);
  ASSERT_EQ(list[0].nholders, 1);
  ASSERT_EQ(list[0].holder_pids[0], p.pid);
  ASSERT_EQ(list[1].state, GPUIPC_SEG_PUBLISHED);
  ASSERT_TRUE(list[1].id > list[0].id);
  /* The last holder lets go: the broker closes the old segment's fd. */
  PEER_OK(&p, "release s1");
  dom_info(&di);
  ASSERT_EQ(di.segments, 1);
  ASSERT_EQ(di.broker_fds, fds_before); /* the new one's instead */
  ASSERT_OK(gpuipc_segment_unlink(dom, "s1"));
  ASSERT_OK(gpuipc_buf_release(a));
  dom_info(&di);
  ASSERT_EQ(di.segments, 0);
  ASSERT_EQ(di.broker_fds, fds_before - 1);
  PEER_OK(&p, "leave");
  peer_finish(&p);
}

/* WAIT: a timeout, and a wait that another process satisfies. */
struct waiter {
  gpuipc_domain_t *d;
  const char *name;
  int rc;
  gpuipc_buf_t *buf;
};

/*
 * The conditional unlink the channels use: it removes a name only while
 * the name still names the segment the caller holds, never a newer one
 * created under the same name after the first was unlinked.
 */
static void unlink_held(void)
{
  unsigned flags = GPUIPC_CREATE | TEST_SEG_KIND(GPUIPC_KIND_HOST);
  gpuipc_buf_t *old, *young;
  ASSERT_OK(test_seg_open(dom, "held", 4096, -1, flags, &old));
  ASSERT_OK(gpuipc_segment_unlink(dom, "held"));
  ASSERT_OK(test_seg_open(dom, "held", 4096, -1, flags, &young));
  ASSERT_TRUE(young != old);
  ASSERT_RC(gpuipc__segment_unlink_held(dom, "held", old), -ENOENT);
  ASSERT_ERR_MENTIONS("not");
  gpuipc_segment_info_t s;
  stat_seg("held", &s); /* the young one keeps its name */
  ASSERT_EQ(s.state, GPUIPC_SEG_PUBLISHED);
  ASSERT_RC(gpuipc__segment_unlink_held(dom, "other", young), -ENOENT);
  ASSERT_OK(gpuipc__segment_unlink_held(dom, "held", young));
  memset(&s, 0, sizeof(s));
  s.size = sizeof(s);
  ASSERT_RC(gpuipc_segment_stat(dom, "held", &s), -ENOENT);
  ASSERT_RC(gpuipc__segment_unlink_held(dom, "held", young), -ENOENT);
  gpuipc_buf_release(old);
  gpuipc_buf_release(young);
}

static void *wait_thread(void *arg)
{
  struct waiter *w = arg;
  w->rc = test_seg_open(w->d, w->name, 0, -1, GPUIPC_WAIT, &w->buf);
  return NULL;
}

static void waiting(void)
{
  gpuipc_domain_t *quick;
  gpuipc_domain_opts_t o = {sizeof(o), 0, 200};
  ASSERT_OK(gpuipc_domain_join("seg", &o, &quick));
  gpuipc_buf_t *b;
  ASSERT_RC(test_seg_open(quick, "later", 0, -1, GPUIPC_WAIT, &b),
            -ETIMEDOUT);
  ASSERT_ERR_MENTIONS("later");
  ASSERT_OK(gpuipc_domain_leave(quick));

  /* The creator starts (and, on a GPU machine, starts CUDA in its join)
   * before the waiter's clock does: the wait is for the publication, not
   * for another process's start, which took up to 17.9 s beside a busy
   * GPU suite. */
  struct peer p;
  peer_start(&p);
  PEER_OK(&p, "join seg");
  struct waiter w = {dom, "later", 1, NULL};
  pthread_t t;
  test_stamp("waiter starts");
  ASSERT_EQ(pthread_create(&t, NULL, wait_thread, &w), 0);
  usleep(50000); /* most often parked by now; either way it must open */
  PEER_OK(&p, "open later 5000 c");
  test_stamp("creator published");
  PEER_OK(&p, "fill later 77");
  /* Filled after publication: the bytes are shared, not copied. */
  pthread_join(t, NULL);
  ASSERT_OK(w.rc);
  ASSERT_EQ(test_check(gpuipc_buf_ptr(w.buf), 5000, 77), (size_t)-1);
  PEER_OK(&p, "unlink later");
  PEER_OK(&p, "release later");
  ASSERT_OK(gpuipc_buf_release(w.buf));
  PEER_OK(&p, "leave");
  peer_finish(&p);
}

/* Many threads open and release the same segments at once. */
#define THREADS 8
#define ROUNDS 300

static void *churn_thread(void *arg)
{
  intptr_t id = (intptr_t)arg;
  char name[32];
  snprintf(name, sizeof(name), "churn%d", (int)(id % 2));
  for (int i = 0; i < ROUNDS; i++) {
    gpuipc_buf_t *b;
    int rc = test_seg_open(dom, name, 8192, -1, GPUIPC_CREATE, &b);
    if (rc != 0)
      TFAIL("thread %d round %d: open: %s", (int)id, i, gpuipc_err_name(rc));
    volatile uint8_t *p = gpuipc_buf_ptr(b);
    p[id] = (uint8_t)i;
    if (gpuipc_buf_release(b) != 0)
      TFAIL("release");
  }
  return NULL;
}

static void threads(void)
{
  pthread_t t[THREADS];
  for (intptr_t i = 0; i < THREADS; i++)
    ASSERT_EQ(pthread_create(&t[i], NULL, churn_thread, (void *)i), 0);
  for (int i = 0; i < THREADS; i++)
    pthread_join(t[i], NULL);
  gpuipc_segment_info_t s;
  for (int k = 0; k < 2; k++) {
    char name[32];
    snprintf(name, sizeof(name), "churn%d", k);
    stat_seg(name, &s);
    ASSERT_EQ(s.nholders, 0); /* every open was released */
    ASSERT_OK(gpuipc_segment_unlink(dom, name));
  }
  gpuipc_domain_info_t di;
  dom_info(&di);
  ASSERT_EQ(di.segments, 0);
  ASSERT_EQ(di.broker_fds, 0);
}

int main(void)
{
  test_warm_driver(); /* count descriptors with the driver's included */
  ASSERT_OK(gpuipc_domain_join("seg", NULL, &dom));
  int fds = test_count_fds(0);
  bad_arguments();
  create_and_share();
  unlink_held();
  waiting();
  threads();
  ASSERT_EQ(test_count_fds(0), fds);
  ASSERT_OK(gpuipc_domain_leave(dom));
  printf("segment_open: ok\n");
  return 0;
}
