/*
 * Extensible structs: the library reads and writes only the caller's
 * prefix (its size field says how long) and takes an older, smaller
 * struct -- the size before its last field -- with defaults beyond it
 * (options) or that field left unwritten (results). A size below the size
 * field itself is refused.
 */
#include "test.h"

#include "domain/domain.h"

#include <stddef.h>
#include <unistd.h>

#define UNTOUCHED 0x5a5a5a5a

static gpuipc_domain_t *host;

static void domain_opts(void)
{
  gpuipc_domain_t *d = (gpuipc_domain_t *)0x1;
  gpuipc_domain_opts_t o = {.size = 0};
  ASSERT_RC(gpuipc_domain_join("prefix", &o, &d), -EINVAL);
  ASSERT_ERR_MENTIONS("size");
  o.size = sizeof(o.size) - 1;
  ASSERT_RC(gpuipc_domain_join("prefix", &o, &d), -EINVAL);
  ASSERT_PTR_EQ(d, (gpuipc_domain_t *)0x1);
  /* Before timeout_ms: the 7 ms beyond the prefix is not read. */
  o = (gpuipc_domain_opts_t){offsetof(gpuipc_domain_opts_t, timeout_ms), 0,
                             7};
  ASSERT_OK(gpuipc_domain_join("prefix", &o, &d));
  ASSERT_EQ(gpuipc__dom_timeout(d), gpuipc__dom_timeout(host));
  ASSERT_OK(gpuipc_domain_leave(d));
}

static void domain_info(void)
{
  gpuipc_domain_info_t i;
  memset(&i, 0x5a, sizeof(i));
  i.size = 0;
  ASSERT_RC(gpuipc_domain_info(host, &i), -EINVAL);
  i.size = offsetof(gpuipc_domain_info_t, broker_fds);
  ASSERT_OK(gpuipc_domain_info(host, &i));
  ASSERT_EQ_U(i.size, offsetof(gpuipc_domain_info_t, broker_fds));
  ASSERT_STREQ(i.name, "prefix");
  ASSERT_EQ(i.broker_pid, getpid());
  ASSERT_EQ(i.hosts_broker, 1);
  ASSERT_EQ(i.segments, 2);
  ASSERT_EQ(i.broker_fds, UNTOUCHED);
}

static void segment_stat(void)
{
  gpuipc_segment_info_t s;
  memset(&s, 0x5a, sizeof(s));
  s.size = 0;
  ASSERT_RC(gpuipc_segment_stat(host, "a", &s), -EINVAL);
  s.size = offsetof(gpuipc_segment_info_t, keeper_pid);
  ASSERT_OK(gpuipc_segment_stat(host, "a", &s));
  ASSERT_EQ_U(s.size, offsetof(gpuipc_segment_info_t, keeper_pid));
  ASSERT_STREQ(s.name, "a");
  ASSERT_EQ_U(s.bytes, 4096);
  ASSERT_EQ(s.state, GPUIPC_SEG_PUBLISHED);
  ASSERT_EQ(s.keeper_pid, UNTOUCHED);
}

/*
 * An array of an older struct (before creator_held and keeper_pid: the
 * size before the last field alone is padded to the same sizeof): its
 * elements are out[0].size apart.
 */
static void segment_list(void)
{
  size_t stride = (offsetof(gpuipc_segment_info_t, creator_held) + 7) & ~7ul;
  ASSERT_LT(stride, sizeof(gpuipc_segment_info_t));
  unsigned char *buf = malloc(3 * stride);
  ASSERT_TRUE(buf != NULL);
  memset(buf, 0x5a, 3 * stride);
  for (int i = 0; i < 2; i++)
    ((gpuipc_segment_info_t *)(buf + i * stride))->size = stride;
  ASSERT_EQ(gpuipc_segment_list(host, (gpuipc_segment_info_t *)buf, 2), 2);
  gpuipc_segment_info_t *s0 = (gpuipc_segment_info_t *)buf;
  gpuipc_segment_info_t *s1 = (gpuipc_segment_info_t *)(buf + stride);
  ASSERT_STREQ(s0->name, "a");
  ASSERT_STREQ(s1->name, "b");
  ASSERT_EQ_U(s1->size, stride);
  ASSERT_EQ_U(s1->bytes, 8192);
  for (size_t k = 2 * stride; k < 3 * stride; k++)
    ASSERT_EQ(buf[k], 0x5a); /* nothing written past the caller's array */
  /* Elements of different sizes cannot be walked: refused. */
  s1->size = sizeof(*s1);
  ASSERT_RC(gpuipc_segment_list(host, s0, 2), -EINVAL);
  free(buf);
}

int main(void)
{
  ASSERT_OK(gpuipc_domain_join("prefix", NULL, &host));
  gpuipc_buf_t *a, *b;
  ASSERT_OK(test_seg_open(host, "a", 4096, -1,
                          GPUIPC_CREATE | GPUIPC_SCRATCH, &a));
  ASSERT_OK(test_seg_open(host, "b", 8192, -1,
                          GPUIPC_CREATE | GPUIPC_SCRATCH, &b));
  domain_opts();
  domain_info();
  segment_stat();
  segment_list();
  ASSERT_OK(gpuipc_buf_release(a));
  ASSERT_OK(gpuipc_buf_release(b));
  ASSERT_OK(gpuipc_domain_leave(host));
  printf("struct_prefix: ok\n");
  return 0;
}
