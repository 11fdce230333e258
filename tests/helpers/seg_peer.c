/*
 * seg_peer IN_FD OUT_FD: a domain member that tests drive line by line.
 * Each command read from IN_FD gets one reply line on OUT_FD: "ok ..." or
 * "err CODE_NAME sentence". End of input exits 0.
 *
 *   setenv NAME VALUE        (before the first gpuipc call)
 *   unsetenv NAME            (likewise)
 *   setuid UID               drop to UID (and its gid 65534 group)
 *   join DOMAIN [nobroker] [cold]
 *                            -> ok PID; the first join starts CUDA (a
 *                            GPU machine's driver opens descriptors, which
 *                            tests count after the join) unless "cold":
 *                            a member that only shares HOST memory
 *   open NAME SIZE FLAGS     FLAGS: any of c x w s (or -) -> ok MINE SIZE
 *                            (MINE: 1 when this process allocated it)
 *   fopen NAME SIZE FLAGS [KIND DEV [OLD]]
 *                            gpuipc_segment_open itself: a CREATE is
 *                            filling until "publish"; OLD: an options
 *                            struct of the size before its stream field
 *                            -> ok MINE SIZE
 *   wcheck NAME SEED         open NAME with GPUIPC_WAIT and check it the
 *                            moment the open returns -> ok SIZE
 *   publish NAME             gpuipc_segment_publish, NULL stream
 *   slowfill NAME SEED MS    fill the first half, sleep MS ms, fill the
 *                            second (a creator that takes its time)
 *   fill NAME SEED / check NAME SEED
 *   release NAME             one reference of the latest open of NAME,
 *                            answered once the broker has read the release
 *   unlink NAME
 *   reserve NAME SIZE        OPEN with CREATE, no publish -> ok create_it ID
 *                            or ok handle ID (the test then kills us)
 *   info                     -> ok BROKER_PID HOSTS MEMBERS SEGMENTS FDS
 *   stat NAME                -> ok STATE NHOLDERS BROKER_FD CREATOR_HELD
 *                               KEEPER_PID
 *   keep                     publish what we create as held by its creator
 *                            (the test hook: as LEGACY and POOL memory is)
 *   live                     -> ok LIVE KEPT (this process's buffers, and
 *                               those of them kept without a reference)
 *   waitlive N MS            until LIVE is N (at most MS ms) -> ok LIVE
 *   gopen NAME SIZE FLAGS KIND DEV
 *                            open with kind KIND (host, vmm, legacy, pool)
 *                            on local GPU DEV (-1: the segment's own)
 *                            -> ok MINE SIZE DEVICE
 *   gfill NAME SEED / gcheck NAME SEED
 *                            through the driver, as a program would: the
 *                            primary context of gpuipc_buf_device current,
 *                            cuMemcpyHtoD / cuMemcpyDtoH
 *   alive NAME               -> ok, or err GPUIPC_E_PEER_GONE ...
 *   waitgone NAME MS         until gpuipc_buf_alive says PEER_GONE -> ok
 *   fds                      -> ok N (open descriptors of this process)
 *   leave                    leave the domain
 *   fork                     fork a child that sleeps 60 s without exec
 *                            -> ok CHILD_PID
 *   load I N COUNT SIZE      the load test's work for peer I of N
 *   churn NAME SEED MS       for MS ms: open NAME, check it, release it;
 *                            create, unlink, release a segment of our own
 *                            -> ok ROUNDS (any failure ends it: err)
 *   pingpong ME ROUNDS SIZE  with peer 1-ME, ROUNDS times: create and fill
 *                            a segment, read and unlink the peer's; every
 *                            call timed -> ok OPS P50_US P99_US MAX_US
 *   nofile N                 set the soft RLIMIT_NOFILE to N
 *   hog / unhog              open /dev/null until no descriptor is free
 *                            -> ok COUNT / close them again -> ok
 *   exit CODE
 */
#include "test.h"

#include "cuda/cuda.h"
#include "domain/domain.h"
#include "segment/segment.h"
#include "mem/mem.h"
#include "os/os.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/resource.h>
#include <unistd.h>

#define MAX_BUFS 4096

static gpuipc_domain_t *dom;
static struct {
  char name[GPUIPC_NAME_MAX + 1];
  gpuipc_buf_t *buf;
} bufs[MAX_BUFS];
static int nbufs;
static FILE *out;

static void reply(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void reply(const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vfprintf(out, fmt, ap);
  va_end(ap);
  fputc('\n', out);
  fflush(out);
}

static void reply_err(int rc)
{
  char msg[600];
  snprintf(msg, sizeof(msg), "%s", gpuipc_last_error());
  for (char *p = msg; *p; p++)
    if (*p == '\n')
      *p = ' ';
  reply("err %s %s", gpuipc_err_name(rc), msg);
}

static unsigned parse_flags(const char *s)
{
  unsigned f = 0;
  for (; *s; s++) {
    if (*s == 'c')
      f |= GPUIPC_CREATE;
    else if (*s == 'x')
      f |= GPUIPC_EXCL;
    else if (*s == 'w')
      f |= GPUIPC_WAIT;
    else if (*s == 's')
      f |= GPUIPC_SCRATCH;
  }
  return f;
}

/* The latest open of @name, or -1. */
static int find_buf(const char *name)
{
  for (int i = nbufs - 1; i >= 0; i--)
    if (strcmp(bufs[i].name, name) == 0)
      return i;
  return -1;
}

static void drop_buf(int i)
{
  bufs[i] = bufs[--nbufs];
}

static bool mine(gpuipc_buf_t *b)
{
  gpuipc_handle_t h;
  if (gpuipc_buf_export(b, &h) != 0)
    return false;
  if (h.fd >= 0)
    close(h.fd);
  return h.pid == (uint32_t)getpid();
}

/*
 * The load test, for peer ME of N: create COUNT segments of our own, fill
 * them and say so (load.ready.ME); read the COUNT segments of peer NEXT once
 * it says they are ready; say we have read them (load.done.ME); once PREV
 * says it has read ours, unlink ours. Each marker is unlinked by the peer
 * that waited for it.
 */
static int marker(const char *what, int who, unsigned flags)
{
  char name[64];
  gpuipc_buf_t *b;
  snprintf(name, sizeof(name), "load.%s.%d", what, who);
  int rc = test_seg_open(dom, name, flags & GPUIPC_CREATE ? 64 : 0, -1,
                               flags, &b);
  if (rc != 0)
    return rc;
  gpuipc_buf_release(b);
  if (flags & GPUIPC_WAIT)
    rc = gpuipc_segment_unlink(dom, name);
  return rc;
}

static int load(int me, int n, int count, size_t size)
{
  char name[64];
  int next = (me + 1) % n, prev = (me + n - 1) % n;
  gpuipc_buf_t **own = calloc((size_t)count, sizeof(*own));
  gpuipc_buf_t *b, *b2;
  int rc;
  for (int k = 0; k < count; k++) {
    size_t sz = size + (size_t)(k % 3) * 1000;
    uint64_t seed = (uint64_t)me * 100000 + (uint64_t)k;
    snprintf(name, sizeof(name), "load.%d.%d", me, k);
    rc = test_seg_open(dom, name, sz, -1, GPUIPC_CREATE | GPUIPC_EXCL,
                             &own[k]);
    if (rc != 0)
      return rc;
    test_fill(gpuipc_buf_ptr(own[k]), sz, seed);
    /* A second open of our own segment maps nothing new. */
    rc = test_seg_open(dom, name, sz, -1, 0, &b2);
    if (rc != 0)
      return rc;
    if (b2 != own[k] || test_check(gpuipc_buf_ptr(b2), sz, seed) != (size_t)-1)
      return gpuipc__err(-EIO, "load: second open of %s differs", name);
    gpuipc_buf_release(b2);
  }
  if ((rc = marker("ready", me, GPUIPC_CREATE | GPUIPC_EXCL)) != 0 ||
      (rc = marker("ready", next, GPUIPC_WAIT)) != 0)
    return rc;
  for (int k = 0; k < count; k++) {
    size_t sz = size + (size_t)(k % 3) * 1000;
    snprintf(name, sizeof(name), "load.%d.%d", next, k);
    rc = test_seg_open(dom, name, sz, -1, 0, &b);
    if (rc != 0)
      return rc;
    size_t bad = test_check(gpuipc_buf_ptr(b), sz,
                            (uint64_t)next * 100000 + (uint64_t)k);
    gpuipc_buf_release(b);
    if (bad != (size_t)-1)
      return gpuipc__err(-EIO, "load: %s differs at byte %zu", name, bad);
  }
  if ((rc = marker("done", me, GPUIPC_CREATE | GPUIPC_EXCL)) != 0 ||
      (rc = marker("done", prev, GPUIPC_WAIT)) != 0)
    return rc;
  for (int k = 0; k < count; k++) {
    snprintf(name, sizeof(name), "load.%d.%d", me, k);
    rc = gpuipc_segment_unlink(dom, name);
    if (rc != 0)
      return rc;
    gpuipc_buf_release(own[k]);
  }
  free(own);
  return 0;
}

#if GPUIPC_HAVE_CUDA
/*
 * Copy between the host and GPU buffer @b the way a program does it: make
 * the primary context of gpuipc_buf_device(@b) current and call
 * cuMemcpyHtoD / cuMemcpyDtoH on the buffer's pointer.
 */
static int gpu_copy(gpuipc_buf_t *b, void *host, size_t n, bool to_device)
{
  static CUcontext prim[64];
  int dev = gpuipc_buf_device(b);
  const struct gpuipc__dev *d = gpuipc__dev_get(dev);
  if (d == NULL || dev >= 64)
    return gpuipc__err(-ERANGE, "gpuipc_buf_device says %d", dev);
  int rc = 0;
  if (prim[dev] == NULL)
    rc = GPUIPC_CU(cuDevicePrimaryCtxRetain, &prim[dev], d->cu_dev);
  if (rc == 0)
    rc = GPUIPC_CU(cuCtxSetCurrent, prim[dev]);
  CUdeviceptr p = (CUdeviceptr)(uintptr_t)gpuipc_buf_ptr(b);
  if (rc == 0)
    rc = to_device ? GPUIPC_CU(cuMemcpyHtoD, p, host, n)
                   : GPUIPC_CU(cuMemcpyDtoH, host, p, n);
  return rc;
}
#endif

/* Fill (@fill) or check @b's bytes against pattern @seed. */
static int pattern(gpuipc_buf_t *b, uint64_t seed, bool fill)
{
  size_t n = gpuipc_buf_size(b);
  if (gpuipc_buf_kind(b) == GPUIPC_KIND_HOST) {
    if (fill) {
      test_fill(gpuipc_buf_ptr(b), n, seed);
      return 0;
    }
    size_t bad = test_check(gpuipc_buf_ptr(b), n, seed);
    return bad == (size_t)-1 ? 0
                             : gpuipc__err(-EIO, "byte %zu differs", bad);
  }
#if GPUIPC_HAVE_CUDA
  uint8_t *tmp = malloc(n);
  if (tmp == NULL)
    return -ENOMEM;
  if (fill)
    test_fill(tmp, n, seed);
  int rc = gpu_copy(b, tmp, n, fill);
  if (rc == 0 && !fill) {
    size_t bad = test_check(tmp, n, seed);
    if (bad != (size_t)-1)
      rc = gpuipc__err(-EIO, "device byte %zu of %zu (GPU %d) is 0x%02x, "
                       "pattern %llu says 0x%02x", bad, n,
                       gpuipc_buf_device(b), tmp[bad],
                       (unsigned long long)seed, test_pattern(seed, bad));
  }
  free(tmp);
  return rc;
#else
  return gpuipc__err(GPUIPC_E_UNSUPPORTED, "built without CUDA");
#endif
}

static gpuipc_kind_t kind_of(const char *s)
{
  for (int k = GPUIPC_KIND_AUTO; k <= GPUIPC__KIND_LAST; k++)
    if (strcmp(s, gpuipc_kind_name((gpuipc_kind_t)k)) == 0)
      return (gpuipc_kind_t)k;
  return (gpuipc_kind_t)-1;
}

static int churn(const char *name, uint64_t seed, int ms)
{
  char own[64];
  snprintf(own, sizeof(own), "churn.%d", (int)getpid());
  uint64_t end = gpuipc__now_ns() + (uint64_t)ms * 1000000u;
  int rounds = 0;
  while (gpuipc__now_ns() < end) {
    gpuipc_buf_t *b;
    int rc = test_seg_open(dom, name, 0, -1, 0, &b);
    if (rc != 0)
      return rc;
    size_t bad = test_check(gpuipc_buf_ptr(b), gpuipc_buf_size(b), seed);
    gpuipc_buf_release(b);
    if (bad != (size_t)-1)
      return gpuipc__err(-EIO, "churn: %s differs at byte %zu", name, bad);
    rc = test_seg_open(dom, own, 4096, -1, GPUIPC_CREATE | GPUIPC_EXCL,
                             &b);
    if (rc != 0)
      return rc;
    rc = gpuipc_segment_unlink(dom, own);
    gpuipc_buf_release(b);
    if (rc != 0)
      return rc;
    rounds++;
  }
  return rounds;
}

/*
 * Ping-pong for peer ME (0 or 1): each round creates pp.ME.I (filled with
 * a pattern) and its marker pp.ME.I.r, then waits for the peer's marker,
 * opens and checks the peer's segment, releases and unlinks both of the
 * peer's names. Each gpuipc call is timed into @us.
 */
#define PP_TIME(us, n, call)                                                   \
  ({                                                                           \
    uint64_t t0_ = gpuipc__now_ns();                                           \
    int rc_ = (call);                                                          \
    (us)[(n)++] = (uint32_t)((gpuipc__now_ns() - t0_) / 1000);                 \
    rc_;                                                                       \
  })

static int pp_round(int me, int i, size_t size, uint32_t *us, int *n)
{
  char name[64], mark[64];
  gpuipc_buf_t *b, *m;
  int rc;
  snprintf(name, sizeof(name), "pp.%d.%d", me, i);
  snprintf(mark, sizeof(mark), "pp.%d.%d.r", me, i);
  if ((rc = PP_TIME(us, *n, test_seg_open(dom, name, size, -1,
                    GPUIPC_CREATE | GPUIPC_EXCL, &b))) != 0)
    return rc;
  test_fill(gpuipc_buf_ptr(b), size, (uint64_t)me * 1000000 + (uint64_t)i);
  if ((rc = PP_TIME(us, *n, test_seg_open(dom, mark, 64, -1,
                    GPUIPC_CREATE | GPUIPC_EXCL, &m))) != 0)
    return rc;
  PP_TIME(us, *n, gpuipc_buf_release(m));
  PP_TIME(us, *n, gpuipc_buf_release(b));
  int peer = 1 - me;
  snprintf(name, sizeof(name), "pp.%d.%d", peer, i);
  snprintf(mark, sizeof(mark), "pp.%d.%d.r", peer, i);
  if ((rc = PP_TIME(us, *n, test_seg_open(dom, mark, 0, -1,
                    GPUIPC_WAIT, &m))) != 0)
    return rc;
  PP_TIME(us, *n, gpuipc_buf_release(m));
  if ((rc = PP_TIME(us, *n, test_seg_open(dom, name, size, -1, 0,
                    &b))) != 0)
    return rc;
  size_t bad = test_check(gpuipc_buf_ptr(b), size,
                          (uint64_t)peer * 1000000 + (uint64_t)i);
  PP_TIME(us, *n, gpuipc_buf_release(b));
  if (bad != (size_t)-1)
    return gpuipc__err(-EIO, "pingpong: %s differs at byte %zu", name, bad);
  if ((rc = PP_TIME(us, *n, gpuipc_segment_unlink(dom, name))) != 0 ||
      (rc = PP_TIME(us, *n, gpuipc_segment_unlink(dom, mark))) != 0)
    return rc;
  return 0;
}

static int cmp_u32(const void *a, const void *b)
{
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

static void pingpong(int me, int rounds, size_t size)
{
  uint32_t *us = calloc((size_t)rounds * 10, sizeof(*us));
  int n = 0;
  for (int i = 0; i < rounds; i++) {
    int rc = pp_round(me, i, size, us, &n);
    if (rc != 0) {
      free(us);
      reply_err(rc);
      return;
    }
  }
  qsort(us, (size_t)n, sizeof(*us), cmp_u32);
  reply("ok %d %u %u %u", n, us[n / 2], us[(size_t)n * 99 / 100], us[n - 1]);
  free(us);
}

static int hog[65536];
static int nhog;

static void hog_fds(void)
{
  while (nhog < (int)GPUIPC__ARRAY_SIZE(hog)) {
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      break;
    hog[nhog++] = fd;
  }
  reply("ok %d", nhog);
}

static void command(char *line)
{
  char *argv[8] = {0};
  int argc = 0;
  for (char *tok = strtok(line, " \n"); tok != NULL && argc < 8;
       tok = strtok(NULL, " \n"))
    argv[argc++] = tok;
  if (argc == 0)
    return;
  const char *cmd = argv[0];
  int rc;
  gpuipc_buf_t *b;
  if (strcmp(cmd, "setenv") == 0 && argc == 3) {
    setenv(argv[1], argv[2], 1);
    reply("ok");
  } else if (strcmp(cmd, "unsetenv") == 0 && argc == 2) {
    unsetenv(argv[1]);
    reply("ok");
  } else if (strcmp(cmd, "setuid") == 0 && argc == 2) {
    uid_t uid = (uid_t)atoi(argv[1]);
    if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(uid) != 0)
      reply("err EPERM %s", strerror(errno));
    else
      reply("ok");
  } else if (strcmp(cmd, "join") == 0 && argc >= 2) {
    /* Not earlier: setenv and setuid must come before the first gpuipc
     * call. Descriptor counts are taken after the join. */
    static bool warm;
    bool cold = false;
    gpuipc_domain_opts_t o = {sizeof(o), 0, 0};
    for (int i = 2; i < argc; i++) {
      if (strcmp(argv[i], "nobroker") == 0)
        o.flags = GPUIPC_JOIN_NO_BROKER;
      else if (strcmp(argv[i], "cold") == 0)
        cold = true;
    }
    if (!warm && !cold)
      test_warm_driver();
    warm = true;
    rc = gpuipc_domain_join(argv[1], &o, &dom);
    if (rc != 0)
      reply_err(rc);
    else
      reply("ok %d", (int)getpid());
  } else if ((strcmp(cmd, "open") == 0 && argc == 4) ||
             (strcmp(cmd, "gopen") == 0 && argc == 6)) {
    if (nbufs == MAX_BUFS) {
      reply("err ENOSPC too many buffers");
      return;
    }
    unsigned flags = parse_flags(argv[3]);
    int dev = -1;
    if (cmd[0] == 'g') {
      gpuipc_kind_t k = kind_of(argv[4]);
      if ((int)k < 0) {
        reply("err EINVAL unknown kind %s", argv[4]);
        return;
      }
      flags |= TEST_SEG_KIND(k);
      dev = atoi(argv[5]);
    }
    rc = test_seg_open(dom, argv[1], strtoull(argv[2], NULL, 0), dev,
                             flags, &b);
    if (rc != 0) {
      reply_err(rc);
      return;
    }
    snprintf(bufs[nbufs].name, sizeof(bufs[nbufs].name), "%s", argv[1]);
    bufs[nbufs++].buf = b;
    if (cmd[0] == 'g')
      reply("ok %d %zu %d", mine(b) ? 1 : 0, gpuipc_buf_size(b),
            gpuipc_buf_device(b));
    else
      reply("ok %d %zu", mine(b) ? 1 : 0, gpuipc_buf_size(b));
  } else if (strcmp(cmd, "fopen") == 0 && (argc == 4 || argc >= 6)) {
    if (nbufs == MAX_BUFS) {
      reply("err ENOSPC too many buffers");
      return;
    }
    gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
    o.bytes = strtoull(argv[2], NULL, 0);
    o.flags = parse_flags(argv[3]);
    if (argc >= 6) {
      o.kind = kind_of(argv[4]);
      o.device = atoi(argv[5]);
    }
    if (argc >= 7 && strcmp(argv[6], "old") == 0)
      o.size = offsetof(gpuipc_segment_opts_t, stream);
    rc = gpuipc_segment_open(dom, argv[1], &o, &b);
    if (rc != 0) {
      reply_err(rc);
      return;
    }
    snprintf(bufs[nbufs].name, sizeof(bufs[nbufs].name), "%s", argv[1]);
    bufs[nbufs++].buf = b;
    reply("ok %d %zu", mine(b) ? 1 : 0, gpuipc_buf_size(b));
  } else if (strcmp(cmd, "wcheck") == 0 && argc == 3) {
    if (nbufs == MAX_BUFS) {
      reply("err ENOSPC too many buffers");
      return;
    }
    gpuipc_segment_opts_t o = GPUIPC_SEGMENT_OPTS_INIT;
    o.flags = GPUIPC_WAIT;
    rc = gpuipc_segment_open(dom, argv[1], &o, &b);
    if (rc != 0) {
      reply_err(rc);
      return;
    }
    size_t bad = test_check(gpuipc_buf_ptr(b), gpuipc_buf_size(b),
                            strtoull(argv[2], NULL, 0));
    snprintf(bufs[nbufs].name, sizeof(bufs[nbufs].name), "%s", argv[1]);
    bufs[nbufs++].buf = b;
    if (bad == (size_t)-1)
      reply("ok %zu", gpuipc_buf_size(b));
    else
      reply("err EIO byte %zu differs", bad);
  } else if ((strcmp(cmd, "publish") == 0 && argc == 2) ||
             (strcmp(cmd, "slowfill") == 0 && argc == 4)) {
    int i = find_buf(argv[1]);
    if (i < 0) {
      reply("err ENOENT not open");
      return;
    }
    b = bufs[i].buf;
    if (cmd[0] == 'p') {
      rc = gpuipc_segment_publish(b, NULL);
      if (rc != 0)
        reply_err(rc);
      else
        reply("ok");
      return;
    }
    size_t n = gpuipc_buf_size(b), half = n / 2;
    uint8_t *img = malloc(n);
    if (img == NULL) {
      reply("err ENOMEM");
      return;
    }
    test_fill(img, n, strtoull(argv[2], NULL, 0));
    memcpy(gpuipc_buf_ptr(b), img, half);
    usleep((useconds_t)atoi(argv[3]) * 1000u);
    memcpy((uint8_t *)gpuipc_buf_ptr(b) + half, img + half, n - half);
    free(img);
    reply("ok");
  } else if ((strcmp(cmd, "gfill") == 0 || strcmp(cmd, "gcheck") == 0) &&
             argc == 3) {
    int i = find_buf(argv[1]);
    if (i < 0) {
      reply("err ENOENT not open");
      return;
    }
    rc = pattern(bufs[i].buf, strtoull(argv[2], NULL, 0), cmd[1] == 'f');
    if (rc != 0)
      reply_err(rc);
    else
      reply("ok");
  } else if ((strcmp(cmd, "alive") == 0 && argc == 2) ||
             (strcmp(cmd, "waitgone") == 0 && argc == 3)) {
    int i = find_buf(argv[1]);
    if (i < 0) {
      reply("err ENOENT not open");
      return;
    }
    rc = gpuipc_buf_alive(bufs[i].buf);
    if (cmd[0] == 'w') {
      uint64_t end = gpuipc__now_ns() + strtoull(argv[2], NULL, 0) * 1000000u;
      while (rc == 0 && gpuipc__now_ns() < end) {
        usleep(5000);
        rc = gpuipc_buf_alive(bufs[i].buf);
      }
      if (rc == GPUIPC_E_PEER_GONE)
        reply("ok %s", gpuipc_last_error());
      else if (rc == 0)
        reply("err ETIMEDOUT still alive");
      else
        reply_err(rc);
    } else if (rc != 0) {
      reply_err(rc);
    } else {
      reply("ok");
    }
  } else if (strcmp(cmd, "keep") == 0 && argc == 1) {
    gpuipc__seg_test_creator_held(true);
    reply("ok");
  } else if ((strcmp(cmd, "live") == 0 && argc == 1) ||
             (strcmp(cmd, "waitlive") == 0 && argc == 3)) {
    struct gpuipc__cache_stats st;
    gpuipc__cache_stats(&st);
    if (cmd[0] == 'w') {
      uint64_t want = strtoull(argv[1], NULL, 0);
      uint64_t end = gpuipc__now_ns() + strtoull(argv[2], NULL, 0) * 1000000u;
      while (st.live != want && gpuipc__now_ns() < end) {
        usleep(2000);
        gpuipc__cache_stats(&st);
      }
    }
    reply("ok %llu %llu", (unsigned long long)st.live,
          (unsigned long long)st.kept);
  } else if ((strcmp(cmd, "fill") == 0 || strcmp(cmd, "check") == 0) &&
             argc == 3) {
    int i = find_buf(argv[1]);
    if (i < 0) {
      reply("err ENOENT not open");
      return;
    }
    b = bufs[i].buf;
    uint64_t seed = strtoull(argv[2], NULL, 0);
    if (cmd[0] == 'f') {
      test_fill(gpuipc_buf_ptr(b), gpuipc_buf_size(b), seed);
      reply("ok");
    } else {
      size_t bad = test_check(gpuipc_buf_ptr(b), gpuipc_buf_size(b), seed);
      if (bad == (size_t)-1)
        reply("ok");
      else
        reply("err EIO byte %zu differs", bad);
    }
  } else if (strcmp(cmd, "release") == 0 && argc == 2) {
    int i = find_buf(argv[1]);
    if (i < 0) {
      reply("err ENOENT not open");
      return;
    }
    rc = gpuipc_buf_release(bufs[i].buf);
    drop_buf(i);
    /* RELEASE is one-way: a round trip after it on the same connection
     * means the broker has read it when we answer. */
    gpuipc_domain_info_t di = {.size = sizeof(di)};
    if (rc == 0 && dom != NULL)
      rc = gpuipc_domain_info(dom, &di);
    if (rc != 0)
      reply_err(rc);
    else
      reply("ok");
  } else if (strcmp(cmd, "unlink") == 0 && argc == 2) {
    rc = gpuipc_segment_unlink(dom, argv[1]);
    if (rc != 0)
      reply_err(rc);
    else
      reply("ok");
  } else if (strcmp(cmd, "reserve") == 0 && argc == 3) {
    struct gpuipc__reply *r = malloc(sizeof(*r));
    rc = gpuipc__seg_request(dom, argv[1], strtoull(argv[2], NULL, 0),
                             GPUIPC_KIND_HOST, GPUIPC_CREATE, 10000, r);
    if (rc != 0)
      reply_err(rc);
    else if (r->msg.type == GPUIPC_MSG_CREATE_IT)
      reply("ok create_it %llu", (unsigned long long)r->msg.u.create_it.id);
    else
      reply("ok handle %llu", (unsigned long long)r->msg.u.handle.seg.id);
    free(r);
  } else if (strcmp(cmd, "info") == 0) {
    gpuipc_domain_info_t i = {.size = sizeof(i)};
    rc = gpuipc_domain_info(dom, &i);
    if (rc != 0)
      reply_err(rc);
    else
      reply("ok %d %d %d %d %d", i.broker_pid, i.hosts_broker, i.members,
            i.segments, i.broker_fds);
  } else if (strcmp(cmd, "stat") == 0 && argc == 2) {
    gpuipc_segment_info_t s = {.size = sizeof(s)};
    rc = gpuipc_segment_stat(dom, argv[1], &s);
    if (rc != 0)
      reply_err(rc);
    else
      reply("ok %s %d %d %d %d", gpuipc_segment_state_name(s.state),
            s.nholders, s.broker_fd, s.creator_held, s.keeper_pid);
  } else if (strcmp(cmd, "fds") == 0) {
    reply("ok %d", test_count_fds(0));
  } else if (strcmp(cmd, "leave") == 0) {
    rc = gpuipc_domain_leave(dom);
    dom = NULL;
    if (rc != 0)
      reply_err(rc);
    else
      reply("ok");
  } else if (strcmp(cmd, "fork") == 0) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
      sleep(60);
      _exit(0);
    }
    reply("ok %d", (int)pid);
  } else if (strcmp(cmd, "load") == 0 && argc == 5) {
    rc = load(atoi(argv[1]), atoi(argv[2]), atoi(argv[3]),
              strtoull(argv[4], NULL, 0));
    if (rc != 0)
      reply_err(rc);
    else
      reply("ok");
  } else if (strcmp(cmd, "churn") == 0 && argc == 4) {
    rc = churn(argv[1], strtoull(argv[2], NULL, 0), atoi(argv[3]));
    if (rc < 0)
      reply_err(rc);
    else
      reply("ok %d", rc);
  } else if (strcmp(cmd, "pingpong") == 0 && argc == 4) {
    pingpong(atoi(argv[1]), atoi(argv[2]), strtoull(argv[3], NULL, 0));
  } else if (strcmp(cmd, "nofile") == 0 && argc == 2) {
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = strtoull(argv[1], NULL, 0);
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
      reply("err %s %s", strerrorname_np(errno), strerror(errno));
    else
      reply("ok");
  } else if (strcmp(cmd, "hog") == 0 && argc == 1) {
    hog_fds();
  } else if (strcmp(cmd, "unhog") == 0 && argc == 1) {
    while (nhog > 0)
      close(hog[--nhog]);
    reply("ok");
  } else if (strcmp(cmd, "exit") == 0 && argc == 2) {
    reply("ok");
    exit(atoi(argv[1]));
  } else {
    reply("err EINVAL unknown command %s (%d arguments)", cmd, argc);
  }
}

int main(int argc, char **argv)
{
  if (argc != 3) {
    fprintf(stderr, "usage: seg_peer IN_FD OUT_FD\n");
    return 2;
  }
  FILE *in = fdopen(atoi(argv[1]), "r");
  out = fdopen(atoi(argv[2]), "w");
  if (in == NULL || out == NULL) {
    fprintf(stderr, "seg_peer: fdopen: %s\n", strerror(errno));
    return 2;
  }
  char line[512];
  while (fgets(line, sizeof(line), in) != NULL)
    command(line);
  return 0;
}
