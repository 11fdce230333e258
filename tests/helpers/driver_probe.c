/*
 * driver_probe: checks the CUDA loader in a process of its own, so that
 * each run reads the settings (GPUIPC_CUDA_LIB, GPUIPC_NO_CUDA) afresh.
 * Exits 0 when every check passed, 1 (with the reason on stderr) otherwise.
 *
 *   driver_probe expect CODE [--version=N] [NEEDLE...]
 *     gpuipc_driver_status returns CODE (a name: GPUIPC_E_NODRIVER) and its
 *     sentence mentions every NEEDLE; every later call agrees.
 *   driver_probe table [fake]
 *     the driver loads and every device's description is consistent; with
 *     "fake", it is exactly what tests/fake_cuda reports.
 */
#include "../test.h"

#include "cuda/cuda.h"
#include "os/os.h"

#include "../fake_cuda/fake_cuda.h"

#include <unistd.h>
#include <ctype.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>

#define INFO_MIN                                                               \
  (offsetof(gpuipc_device_info_t, uuid_str) +                                  \
   sizeof(((gpuipc_device_info_t *)0)->uuid_str))

static int code_by_name(const char *name)
{
  if (strcmp(name, "OK") == 0)
    return 0;
#define CODE_ROW(n, c, m)                                                      \
  if (strcmp(name, "GPUIPC_E_" #n) == 0)                                       \
    return (c);
  GPUIPC_ERRNO_MAP(CODE_ROW)
#undef CODE_ROW
  TFAIL("unknown code name %s", name);
}

static int probe_expect(int argc, char **argv)
{
  if (argc < 1)
    TFAIL("expect: CODE missing");
  int want = code_by_name(argv[0]);
  int want_version = -1;
  int first_needle = 1;
  if (argc > 1 && strncmp(argv[1], "--version=", 10) == 0) {
    want_version = atoi(argv[1] + 10);
    first_needle = 2;
  }

  int ver = -7;
  ASSERT_RC(gpuipc_driver_status(&ver), want);
  char sentence[512];
  snprintf(sentence, sizeof(sentence), "%s", gpuipc_last_error());
  fprintf(stderr, "driver_status: %s: %s (version %d)\n", gpuipc_err_name(want),
          sentence, ver);
  for (int i = first_needle; i < argc; i++)
    ASSERT_ERR_MENTIONS(argv[i]);
  if (want_version >= 0)
    ASSERT_EQ(ver, want_version);
  if (want == 0)
    return 0;
  ASSERT_TRUE(sentence[0] != '\0');

  /* Later calls: the same code, and the same sentence set again even after
   * another failure replaced it. */
  gpuipc_config_item_t item;
  ASSERT_RC(gpuipc_config_get(-1, &item), -ERANGE);
  ASSERT_TRUE(strcmp(gpuipc_last_error(), sentence) != 0);
  ASSERT_RC(gpuipc_driver_status(NULL), want);
  ASSERT_STREQ(gpuipc_last_error(), sentence);

  ASSERT_EQ(gpuipc_device_count(), 0);
  gpuipc_device_info_t info;
  memset(&info, 0x5a, sizeof(info));
  info.size = sizeof(info);
  /* With the driver but no device, ordinal 0 is simply out of range. */
  ASSERT_RC(gpuipc_device_info(0, &info),
            want == GPUIPC_E_NODEVICE ? -ERANGE : want);
  ASSERT_EQ(info.ordinal, 0x5a5a5a5a); /* untouched */
  uint8_t uuid[16] = FAKE_CUDA_UUID0;
  ASSERT_RC(gpuipc_device_by_uuid(uuid), want);
  struct gpuipc__ctx_saved saved = {(void *)&saved, 7};
  ASSERT_RC(gpuipc__ctx_enter(0, &saved), want);
  ASSERT_EQ(saved.changed, 7); /* untouched */
  ASSERT_TRUE(gpuipc__dev_get(0) == NULL);
  return 0;
}

#if GPUIPC_HAVE_CUDA
/* Checks that hold for any device, real or fake. */
static void check_device(int i, int n)
{
  gpuipc_device_info_t in;
  memset(&in, 0, sizeof(in));
  in.size = sizeof(in);
  ASSERT_OK(gpuipc_device_info(i, &in));
  ASSERT_EQ_U(in.size, sizeof(in));
  ASSERT_EQ(in.ordinal, i);

  static const uint8_t zero[16];
  ASSERT_TRUE(memcmp(in.uuid, zero, 16) != 0);
  char want[64];
  int off = snprintf(want, sizeof(want), "GPU-");
  for (int k = 0; k < 16; k++)
    off +=
        snprintf(want + off, sizeof(want) - (size_t)off, "%s%02x",
                 k == 4 || k == 6 || k == 8 || k == 10 ? "-" : "", in.uuid[k]);
  ASSERT_STREQ(in.uuid_str, want);
  ASSERT_EQ(strlen(in.uuid_str), 40);
  ASSERT_EQ(gpuipc_device_by_uuid(in.uuid), i);

  ASSERT_TRUE(in.name[0] != '\0');
  /* dddd:bb:dd.f (or a longer domain), lower case. */
  size_t plen = strlen(in.pci_bus_id);
  ASSERT_TRUE(plen >= 12);
  ASSERT_TRUE(in.pci_bus_id[plen - 2] == '.');
  for (const char *c = in.pci_bus_id; *c != '\0'; c++)
    ASSERT_TRUE(isdigit((unsigned char)*c) || (*c >= 'a' && *c <= 'f') ||
                *c == ':' || *c == '.');
  ASSERT_GT(in.total_mem, 0);
  ASSERT_GE(in.cc_major, 1);
  ASSERT_TRUE(in.vmm == 0 || in.vmm == 1);
  if (in.vmm) {
    ASSERT_GT(in.granularity, 0);
    ASSERT_EQ(in.granularity & (in.granularity - 1), 0);
  } else {
    ASSERT_EQ(in.granularity, 0);
  }
  if (!in.mem_pools)
    ASSERT_EQ(in.pool_handle_types, 0);

  /* An older caller's smaller struct: filled up to its size, not beyond. */
  unsigned char buf[sizeof(in) + 16];
  memset(buf, 0xa5, sizeof(buf));
  gpuipc_device_info_t *small = (gpuipc_device_info_t *)buf;
  small->size = INFO_MIN;
  ASSERT_OK(gpuipc_device_info(i, small));
  ASSERT_EQ_U(small->size, INFO_MIN);
  ASSERT_STREQ(small->uuid_str, in.uuid_str);
  ASSERT_TRUE(memcmp(small->uuid, in.uuid, 16) == 0);
  for (size_t k = INFO_MIN; k < sizeof(buf); k++)
    if (buf[k] != 0xa5)
      TFAIL("byte %zu past size %zu was written", k, (size_t)INFO_MIN);

  /* Too small, or 0: refused before anything is written. */
  memset(buf, 0xa5, sizeof(buf));
  small->size = INFO_MIN - 1;
  ASSERT_RC(gpuipc_device_info(i, small), -EINVAL);
  ASSERT_ERR_MENTIONS("size");
  for (size_t k = sizeof(small->size); k < sizeof(buf); k++)
    ASSERT_EQ(buf[k], 0xa5);
  small->size = 0;
  ASSERT_RC(gpuipc_device_info(i, small), -EINVAL);
  ASSERT_RC(gpuipc_device_info(i, NULL), -EINVAL);

  (void)n;
}

static void check_device_fake(int i)
{
  gpuipc_device_info_t in;
  in.size = sizeof(in);
  ASSERT_OK(gpuipc_device_info(i, &in));
  const uint8_t u0[16] = FAKE_CUDA_UUID0, u1[16] = FAKE_CUDA_UUID1;
  if (i == 0) {
    ASSERT_TRUE(memcmp(in.uuid, u0, 16) == 0);
    ASSERT_STREQ(in.uuid_str, FAKE_CUDA_UUID0_STR);
    ASSERT_STREQ(in.name, FAKE_CUDA_NAME0);
    ASSERT_STREQ(in.pci_bus_id, FAKE_CUDA_PCI0_LOWER);
    ASSERT_EQ_U(in.total_mem, FAKE_CUDA_MEM0);
    ASSERT_EQ(in.cc_major, FAKE_CUDA_CC0_MAJOR);
    ASSERT_EQ(in.cc_minor, FAKE_CUDA_CC0_MINOR);
    ASSERT_EQ(in.vmm, 1);
    ASSERT_EQ(in.posix_fd, 1);
    ASSERT_EQ(in.ipc_events, 1);
    ASSERT_EQ(in.mem_pools, 1);
    ASSERT_EQ(in.pool_handle_types, FAKE_CUDA_POOL_TYPES0);
    ASSERT_EQ(in.unified_addressing, 1);
    ASSERT_EQ_U(in.granularity, FAKE_CUDA_GRANULARITY);
    /* FAKE_CUDA_BAD_ATTR=128 (HANDLE_TYPE_FABRIC_SUPPORTED) makes the
     * driver refuse that one attribute: it reads as unsupported. */
    const char *bad = getenv("FAKE_CUDA_BAD_ATTR");
    ASSERT_EQ(in.fabric, bad != NULL && atoi(bad) == 128 ? 0 : 1);
  } else {
    ASSERT_TRUE(memcmp(in.uuid, u1, 16) == 0);
    ASSERT_STREQ(in.uuid_str, FAKE_CUDA_UUID1_STR);
    ASSERT_STREQ(in.name, FAKE_CUDA_NAME1);
    ASSERT_STREQ(in.pci_bus_id, FAKE_CUDA_PCI1_LOWER);
    ASSERT_EQ_U(in.total_mem, FAKE_CUDA_MEM1);
    ASSERT_EQ(in.cc_major, FAKE_CUDA_CC1_MAJOR);
    ASSERT_EQ(in.cc_minor, FAKE_CUDA_CC1_MINOR);
    ASSERT_EQ(in.vmm, 0);
    ASSERT_EQ(in.posix_fd, 0);
    ASSERT_EQ(in.fabric, 0);
    ASSERT_EQ(in.ipc_events, 0);
    ASSERT_EQ(in.mem_pools, 1);
    ASSERT_EQ(in.pool_handle_types, FAKE_CUDA_POOL_TYPES1);
    ASSERT_EQ(in.unified_addressing, 1);
    ASSERT_EQ_U(in.granularity, 0);
  }
}

static CUcontext current_ctx(void)
{
  CUcontext c = (CUcontext)1;
  ASSERT_OK(GPUIPC_CU(cuCtxGetCurrent, &c));
  return c;
}

static void *enter_leave(void *arg)
{
  struct gpuipc__ctx_saved s;
  int rc = gpuipc__ctx_enter(0, &s);
  if (rc == 0)
    gpuipc__ctx_leave(&s);
  return (void *)(intptr_t)rc;
}

/* Primary contexts: made current only when needed, restored on leave,
 * retained once per device however many threads come. */
static void check_contexts(int n, int (*retains)(int), int (*sets)(void))
{
  const struct gpuipc__dev *d0 = gpuipc__dev_get(0);
  ASSERT_TRUE(d0 != NULL);
  ASSERT_TRUE(current_ctx() == NULL);

  /* Many threads at once, before anyone retained: one retain. */
  pthread_t th[8];
  for (int t = 0; t < 8; t++)
    ASSERT_EQ(pthread_create(&th[t], NULL, enter_leave, NULL), 0);
  for (int t = 0; t < 8; t++) {
    void *res;
    ASSERT_EQ(pthread_join(th[t], &res), 0);
    ASSERT_EQ((intptr_t)res, 0);
  }
  if (retains != NULL)
    ASSERT_EQ(retains(0), 1);
  CUcontext p0 = __atomic_load_n(&d0->primary, __ATOMIC_ACQUIRE);
  ASSERT_TRUE(p0 != NULL);

  struct gpuipc__ctx_saved s, s2;
  ASSERT_OK(gpuipc__ctx_enter(0, &s));
  ASSERT_TRUE(current_ctx() == p0);
  ASSERT_EQ(s.changed, 1);
  ASSERT_TRUE(s.ctx == NULL);
  CUdevice dev = -1;
  ASSERT_OK(GPUIPC_CU(cuCtxGetDevice, &dev));
  ASSERT_EQ(dev, d0->cu_dev);
  /* Already current: nothing changes, and leaving changes nothing. */
  int sets_before = sets != NULL ? sets() : 0;
  ASSERT_OK(gpuipc__ctx_enter(0, &s2));
  ASSERT_EQ(s2.changed, 0);
  gpuipc__ctx_leave(&s2);
  ASSERT_TRUE(current_ctx() == p0);
  if (sets != NULL)
    ASSERT_EQ(sets(), sets_before);
  gpuipc__ctx_leave(&s);
  ASSERT_TRUE(current_ctx() == NULL);
  if (retains != NULL)
    ASSERT_EQ(retains(0), 1);

  if (n > 1) {
    /* Another device's context is current: restored on leave. */
    ASSERT_OK(gpuipc__ctx_enter(1, &s));
    CUcontext p1 = current_ctx();
    ASSERT_TRUE(p1 != NULL && p1 != p0);
    ASSERT_OK(gpuipc__ctx_enter(0, &s2));
    ASSERT_TRUE(current_ctx() == p0);
    ASSERT_TRUE(s2.ctx == (void *)p1);
    gpuipc__ctx_leave(&s2);
    ASSERT_TRUE(current_ctx() == p1);
    gpuipc__ctx_leave(&s);
    ASSERT_TRUE(current_ctx() == NULL);
    if (retains != NULL)
      ASSERT_EQ(retains(1), 1);
  }

  struct gpuipc__ctx_saved untouched = {(void *)&untouched, 7};
  ASSERT_RC(gpuipc__ctx_enter(n, &untouched), -ERANGE);
  ASSERT_RC(gpuipc__ctx_enter(-1, &untouched), -ERANGE);
  ASSERT_EQ(untouched.changed, 7);
  ASSERT_RC(gpuipc__ctx_enter(0, NULL), -EINVAL);
}

static int probe_table(int argc, char **argv)
{
  int fake = argc > 0 && strcmp(argv[0], "fake") == 0;
  int ver = 0;
  ASSERT_OK(gpuipc_driver_status(&ver));
  ASSERT_GE(ver, GPUIPC_CU_MIN_DRIVER);
  ASSERT_EQ(ver, gpuipc__cuda_driver_version());
  int n = gpuipc_device_count();
  ASSERT_GT(n, 0);
  ASSERT_EQ(gpuipc__dev_count(), n);

  for (int i = 0; i < n; i++)
    check_device(i, n);

  gpuipc_device_info_t in = {.size = sizeof(in)};
  ASSERT_RC(gpuipc_device_info(n, &in), -ERANGE);
  ASSERT_RC(gpuipc_device_info(-1, &in), -ERANGE);
  ASSERT_TRUE(gpuipc__dev_get(n) == NULL);
  uint8_t nobody[16];
  memset(nobody, 0xfe, sizeof(nobody));
  ASSERT_RC(gpuipc_device_by_uuid(nobody), GPUIPC_E_NODEVICE);
  ASSERT_ERR_MENTIONS("GPU-fefefefe-fefe-fefe-fefe-fefefefefefe");
  ASSERT_RC(gpuipc_device_by_uuid(NULL), -EINVAL);

  /* The CUresult wrapper names the call and the error. */
  ASSERT_RC(gpuipc__cu_check(CUDA_ERROR_INVALID_VALUE, "cuSomething"),
            GPUIPC_E_CUDA);
  ASSERT_ERR_MENTIONS("cuSomething: CUDA_ERROR_INVALID_VALUE (");
  ASSERT_OK(gpuipc__cu_check(CUDA_SUCCESS, "cuSomething"));

  int (*retains)(int) = NULL;
  int (*sets)(void) = NULL;
  if (fake) {
    const char *fv = getenv("FAKE_CUDA_VERSION");
    ASSERT_EQ(ver, fv != NULL ? atoi(fv) : 13000);
    ASSERT_EQ(n, 2);
    check_device_fake(0);
    check_device_fake(1);
    /* The library the loader found, by the name it was given. */
    const char *path = gpuipc__cuda_lib_path();
    ASSERT_STREQ(path, getenv("GPUIPC_CUDA_LIB"));
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    ASSERT_TRUE(h != NULL);
    retains = (int (*)(int))dlsym(h, "fake_cuda_retains");
    int (*early)(void) = (int (*)(void))dlsym(h, "fake_cuda_calls_before_init");
    sets = (int (*)(void))dlsym(h, "fake_cuda_set_current_calls");
    ASSERT_TRUE(retains != NULL && early != NULL && sets != NULL);
    ASSERT_EQ(early(), 0);
    ASSERT_EQ(retains(0), 0); /* nothing retained until first use */
    /* Optional entry points that the fake lacks are NULL, required ones
     * that it has are set; FAKE_CUDA_HIDE hides optional ones. */
    ASSERT_TRUE(gpuipc__cu.cuDeviceGetUuid != NULL);
    const char *hide = getenv("FAKE_CUDA_HIDE");
    if (hide != NULL && strcmp(hide, "cuMemCreate") == 0)
      ASSERT_TRUE(gpuipc__cu.cuMemCreate == NULL);
    else
      ASSERT_TRUE(gpuipc__cu.cuMemCreate != NULL);
  }
  check_contexts(n, retains, sets);
  if (fake) {
    void *h = dlopen(gpuipc__cuda_lib_path(), RTLD_NOW | RTLD_NOLOAD);
    int (*early)(void) = (int (*)(void))dlsym(h, "fake_cuda_calls_before_init");
    ASSERT_EQ(early(), 0);
  }
  printf("driver_probe: %d device(s), driver %d, all checks passed\n", n, ver);
  return 0;
}

#else
static int probe_table(int argc, char **argv)
{
  TFAIL("built without CUDA headers: there is no device table to check");
}
#endif /* GPUIPC_HAVE_CUDA */

/*
 * The driver loads here; a child made by fork() then sees none (CUDA is
 * unusable there), says why, and still has the HOST kind.
 */
static int probe_fork(void)
{
  ASSERT_OK(gpuipc_driver_status(NULL));
  ASSERT_GT(gpuipc_device_count(), 0);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT_TRUE(pid >= 0);
  if (pid == 0) {
    if (gpuipc_driver_status(NULL) != GPUIPC_E_NODRIVER ||
        strstr(gpuipc_last_error(), "fork()") == NULL ||
        gpuipc_device_count() != 0)
      _exit(1);
    gpuipc_buf_t *b;
    if (gpuipc_buf_alloc(4096, GPUIPC_KIND_HOST, -1, 0, &b) != 0)
      _exit(2);
    if (gpuipc_buf_alloc(4096, GPUIPC_KIND_AUTO, -1, 0, &b) != 0 ||
        gpuipc_buf_kind(b) != GPUIPC_KIND_HOST)
      _exit(3);
    _exit(0);
  }
  ASSERT_EQ(test_wait(pid, 10000), 0);
  ASSERT_OK(gpuipc_driver_status(NULL)); /* the parent keeps its driver */
  printf("fork: the child sees no driver and keeps the HOST kind\n");
  return 0;
}

/*
 * A creator whose allocation outlasts the domain's timeout (a HOST buffer
 * registered, in the context this process has started, by a driver that is
 * slow to do it) still publishes: the
 * wait for the broker's answer begins after the allocation. The
 * registration moves this process's clock on by more than the timeout
 * instead of sleeping through it: a timeout short enough to sleep through
 * would also be one that the domain's own calls (the join, the broker's
 * answers) miss on a busy machine.
 */
#define SLOW_TIMEOUT_MS 10000

static void registration_outlasts_timeout(void)
{
  gpuipc__test_hook_clock_skip_ms(SLOW_TIMEOUT_MS + 1000);
}

static int probe_slow_publish(void)
{
  char name[32];
  snprintf(name, sizeof(name), "slowpub%d", (int)getpid());
  gpuipc_domain_opts_t o = {.size = sizeof(o), .timeout_ms = SLOW_TIMEOUT_MS};
  gpuipc_domain_t *d;
  ASSERT_OK(gpuipc_domain_join(name, &o, &d));
  test_warm_driver(); /* a context: HOST buffers register as they map */
  void *h = dlopen(getenv("GPUIPC_CUDA_LIB"), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_TRUE(h != NULL);
  int (*registered)(void) = (int (*)(void))dlsym(h, "fake_cuda_registered");
  void (*on_register)(void (*)(void)) =
      (void (*)(void (*)(void)))dlsym(h, "fake_cuda_on_register");
  ASSERT_TRUE(registered != NULL && on_register != NULL);
  on_register(registration_outlasts_timeout);
  uint64_t t0 = gpuipc__now_ns();
  gpuipc_buf_t *b;
  ASSERT_OK(test_seg_open(d, "slow", 8192, -1,
                                GPUIPC_CREATE |
                                    TEST_SEG_KIND(GPUIPC_KIND_HOST),
                                &b));
  on_register(NULL);
  ASSERT_EQ(registered(), 1); /* the slow path was taken */
  /* The clock passed the open's own deadline during the allocation. */
  ASSERT_GT(gpuipc__now_ns() - t0, SLOW_TIMEOUT_MS * 1000000ull);
  memset(gpuipc_buf_ptr(b), 0x5c, 8192);
  gpuipc_segment_info_t st = {.size = sizeof(st)};
  ASSERT_OK(gpuipc_segment_stat(d, "slow", &st));
  ASSERT_EQ(st.state, GPUIPC_SEG_PUBLISHED);
  ASSERT_OK(gpuipc_buf_release(b));
  ASSERT_OK(gpuipc_domain_leave(d));
  ASSERT_EQ(registered(), 0);
  dlclose(h);
  printf("slow-publish: published after a registration that outlasted the "
         "%d ms timeout\n", SLOW_TIMEOUT_MS);
  return 0;
}

/*
 * GPUIPC_KIND_AUTO names a kind per device: VMM on the fake's device 0
 * (which claims VMM with POSIX descriptors), LEGACY on its device 1 (which
 * does not); the LEGACY buffer is usable (the fake's cuMemAlloc), and
 * gpuipc_kind_available(AUTO) still answers for VMM.
 */
static int probe_auto_kind(void)
{
  ASSERT_OK(gpuipc_driver_status(NULL));
  ASSERT_EQ(gpuipc_device_count(), 2);
  gpuipc_device_info_t i0 = {.size = sizeof(i0)};
  gpuipc_device_info_t i1 = {.size = sizeof(i1)};
  ASSERT_OK(gpuipc_device_info(0, &i0));
  ASSERT_OK(gpuipc_device_info(1, &i1));
  ASSERT_TRUE(i0.vmm && i0.posix_fd && !(i1.vmm && i1.posix_fd));
  gpuipc_buf_t *b;
  ASSERT_OK(gpuipc_buf_alloc(5000, GPUIPC_KIND_AUTO, 1, 0, &b));
  ASSERT_EQ(gpuipc_buf_kind(b), GPUIPC_KIND_LEGACY);
  ASSERT_EQ(gpuipc_buf_device(b), 1);
  memset(gpuipc_buf_ptr(b), 0x3c, 5000);
  ASSERT_OK(gpuipc_buf_release(b));
  /* Device 0: VMM, which this fake cannot make (no cuMemCreate). */
  ASSERT_RC(gpuipc_buf_alloc(5000, GPUIPC_KIND_AUTO, 0, 0, &b),
            GPUIPC_E_CUDA);
  ASSERT_ERR_MENTIONS("cuMem");
  ASSERT_OK(gpuipc_kind_available(GPUIPC_KIND_AUTO));
  printf("auto-kind: LEGACY on a GPU without VMM beside one with it\n");
  return 0;
}

int main(int argc, char **argv)
{
  if (argc < 2)
    TFAIL("usage: driver_probe expect CODE [NEEDLE...] | table [fake] | "
          "fork | slow-publish | auto-kind");
  if (strcmp(argv[1], "auto-kind") == 0)
    return probe_auto_kind();
  if (strcmp(argv[1], "fork") == 0)
    return probe_fork();
  if (strcmp(argv[1], "slow-publish") == 0)
    return probe_slow_publish();
  if (strcmp(argv[1], "expect") == 0)
    return probe_expect(argc - 2, argv + 2);
  if (strcmp(argv[1], "table") == 0)
    return probe_table(argc - 2, argv + 2);
  TFAIL("unknown mode %s", argv[1]);
}
