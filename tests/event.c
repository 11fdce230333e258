/*
 * Interprocess events: the handle record (packing and strict unpacking,
 * which needs no GPU), and on a GPU two processes ordering each other's
 * work with events alone, on one GPU and across two.
 */
#include "gpu_test.h"

#include "wire/wire.h"

#include <unistd.h>

static gpuipc_event_handle_t sample(void)
{
  gpuipc_event_handle_t h;
  memset(&h, 0, sizeof(h));
  h.version = GPUIPC_EVENT_HANDLE_VERSION;
  for (int i = 0; i < 16; i++) {
    h.device_uuid[i] = (uint8_t)(0xa0 + i);
    h.boot_id[i] = (uint8_t)(0x10 + i);
  }
  h.event_id = 42;
  h.pid = 1234;
  h.pidns = 4026531836ull;
  h.nonce = 0x0123456789abcdefull;
  for (int i = 0; i < GPUIPC_HANDLE_BYTES; i++)
    h.bytes[i] = (uint8_t)(i * 7 + 1);
  return h;
}

/* Re-seal a packed record after changing it, so only the change is seen. */
static void reseal(uint8_t *p)
{
  size_t body = GPUIPC_EVENT_HANDLE_PACKED_SIZE - 4;
  uint32_t crc = gpuipc__crc32c(0, p, body);
  for (int i = 0; i < 4; i++)
    p[body + (size_t)i] = (uint8_t)(crc >> (8 * i));
}

static void check_record(void)
{
  gpuipc_event_handle_t h = sample(), out;
  uint8_t buf[GPUIPC_EVENT_HANDLE_PACKED_SIZE + 8];
  ASSERT_RC(gpuipc_event_handle_pack(&h, buf, sizeof(buf)),
            GPUIPC_EVENT_HANDLE_PACKED_SIZE);
  ASSERT_OK(gpuipc_event_handle_unpack(buf, GPUIPC_EVENT_HANDLE_PACKED_SIZE,
                                       &out));
  ASSERT_TRUE(memcmp(&h, &out, sizeof(h)) == 0);

  /* Arguments. */
  ASSERT_RC(gpuipc_event_handle_pack(NULL, buf, sizeof(buf)), -EINVAL);
  ASSERT_RC(gpuipc_event_handle_pack(&h, NULL, sizeof(buf)), -EINVAL);
  ASSERT_RC(gpuipc_event_handle_pack(&h, buf, 10), -ENOSPC);
  ASSERT_RC(gpuipc_event_handle_unpack(NULL, 1, &out), -EINVAL);
  ASSERT_RC(gpuipc_event_handle_unpack(buf, sizeof(buf), NULL), -EINVAL);

  /* Invalid fields are refused when packing. */
  gpuipc_event_handle_t bad = h;
  bad.flags = 1;
  ASSERT_RC(gpuipc_event_handle_pack(&bad, buf, sizeof(buf)),
            GPUIPC_E_BADHANDLE);
  bad = h;
  bad.event_id = 0;
  ASSERT_RC(gpuipc_event_handle_pack(&bad, buf, sizeof(buf)),
            GPUIPC_E_BADHANDLE);
  bad = h;
  memset(bad.bytes, 0, sizeof(bad.bytes));
  ASSERT_RC(gpuipc_event_handle_pack(&bad, buf, sizeof(buf)),
            GPUIPC_E_BADHANDLE);

  /* Damaged records are refused when unpacking, naming what is wrong. */
  ASSERT_RC(gpuipc_event_handle_unpack(buf, GPUIPC_EVENT_HANDLE_PACKED_SIZE - 1,
                                       &out),
            GPUIPC_E_BADHANDLE);
  ASSERT_ERR_MENTIONS("length");
  uint8_t copy[GPUIPC_EVENT_HANDLE_PACKED_SIZE];
  ASSERT_RC(gpuipc_event_handle_pack(&h, copy, sizeof(copy)),
            GPUIPC_EVENT_HANDLE_PACKED_SIZE);
  copy[80] ^= 1; /* in the event bytes, checksum not updated */
  ASSERT_RC(gpuipc_event_handle_unpack(copy, sizeof(copy), &out),
            GPUIPC_E_BADHANDLE);
  ASSERT_ERR_MENTIONS("checksum");
  ASSERT_RC(gpuipc_event_handle_pack(&h, copy, sizeof(copy)),
            GPUIPC_EVENT_HANDLE_PACKED_SIZE);
  copy[0] ^= 0xff; /* magic */
  reseal(copy);
  ASSERT_RC(gpuipc_event_handle_unpack(copy, sizeof(copy), &out),
            GPUIPC_E_BADHANDLE);
  ASSERT_ERR_MENTIONS("magic");
  ASSERT_RC(gpuipc_event_handle_pack(&h, copy, sizeof(copy)),
            GPUIPC_EVENT_HANDLE_PACKED_SIZE);
  copy[4] = 9; /* version 9 */
  reseal(copy);
  ASSERT_RC(gpuipc_event_handle_unpack(copy, sizeof(copy), &out),
            GPUIPC_E_VERSION);
  ASSERT_RC(gpuipc_event_handle_pack(&h, copy, sizeof(copy)),
            GPUIPC_EVENT_HANDLE_PACKED_SIZE);
  copy[8] = 1; /* flags */
  reseal(copy);
  ASSERT_RC(gpuipc_event_handle_unpack(copy, sizeof(copy), &out),
            GPUIPC_E_BADHANDLE);
  ASSERT_ERR_MENTIONS("flags");
  ASSERT_RC(gpuipc_event_handle_pack(&h, copy, sizeof(copy)),
            GPUIPC_EVENT_HANDLE_PACKED_SIZE);
  copy[137] = 1; /* reserved */
  reseal(copy);
  ASSERT_RC(gpuipc_event_handle_unpack(copy, sizeof(copy), &out),
            GPUIPC_E_BADHANDLE);
  ASSERT_ERR_MENTIONS("reserved");

  /* Objects. */
  gpuipc_event_t *ev = NULL;
  ASSERT_RC(gpuipc_event_create(0, 0, NULL), -EINVAL);
  ASSERT_RC(gpuipc_event_create(0, 1, &ev), -EINVAL);
  ASSERT_RC(gpuipc_event_import(NULL, -1, &ev), -EINVAL);
  ASSERT_RC(gpuipc_event_import(&bad, -1, &ev), GPUIPC_E_BADHANDLE);
  ASSERT_RC(gpuipc_event_record(NULL, NULL), -EINVAL);
  ASSERT_RC(gpuipc_event_wait(NULL, NULL), -EINVAL);
  ASSERT_RC(gpuipc_event_release(NULL), -EINVAL);
  ASSERT_EQ(gpuipc_event_device(NULL), -1);
}

static void event_pair(int pdev, int cdev)
{
  printf("--- event: producer on GPU %d, consumer on GPU %d\n", pdev, cdev);
  int sv[2];
  ASSERT_OK(gpuipc__sock_pair(sv));
  char d0[16], d1[16], s0[16], s1[16];
  const char *pargs[] = {"producer", gpu_fmt_int(d0, sizeof(d0), pdev),
                         gpu_fmt_int(s0, sizeof(s0), sv[0]), NULL};
  const char *cargs[] = {"consumer", gpu_fmt_int(d1, sizeof(d1), cdev),
                         gpu_fmt_int(s1, sizeof(s1), sv[1]), NULL};
  int k0[] = {sv[0], -1}, k1[] = {sv[1], -1};
  pid_t p = test_spawn("gpu_event", pargs, k0);
  pid_t c = test_spawn("gpu_event", cargs, k1);
  close(sv[0]);
  close(sv[1]);
  int ps = test_wait(p, GPU_PROC_TIMEOUT_MS);
  int cs = test_wait(c, GPU_PROC_TIMEOUT_MS);
  if (ps != 0 || cs != 0)
    printf("producer exit status %d, consumer exit status %d\n", ps, cs);
  ASSERT_EQ(ps, 0);
  ASSERT_EQ(cs, 0);
}

int main(void)
{
  check_record();
  test_require_gpus(1);
  gpu_require_helper("gpu_event");

  /* An event from a process that has gone cannot be opened. */
  gpuipc_event_handle_t h = sample();
  gpuipc_device_info_t di;
  memset(&di, 0, sizeof(di));
  di.size = sizeof(di);
  ASSERT_OK(gpuipc_device_info(0, &di));
  memcpy(h.device_uuid, di.uuid, 16);
  const struct gpuipc__proc_id *me = gpuipc__proc_self();
  memcpy(h.boot_id, me->boot_id, 16);
  h.pidns = me->pidns;
  pid_t dead = fork(); /* the child touches nothing and exits */
  if (dead == 0)
    _exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(test_wait(dead, GPU_PROC_TIMEOUT_MS), 0);
  h.pid = (uint32_t)dead;
  gpuipc_event_t *ev = NULL;
  ASSERT_RC(gpuipc_event_import(&h, -1, &ev), GPUIPC_E_PEER_GONE);

  event_pair(0, 0);
  if (gpuipc_device_count() < 2) {
    printf("NOTE: one GPU: the cross-GPU cases need two\n");
    return 0;
  }
  event_pair(0, 1);
  event_pair(1, 0);
  return 0;
}
