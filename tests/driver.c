/*
 * The CUDA driver loader, the device table and `gpuipc info`.
 *
 * Settings are read once per process, so each variant runs in a process of
 * its own (tests/helpers/driver_probe, or the gpuipc tool) started with a
 * controlled environment. Without a GPU the device table is checked against
 * fake drivers built in the test tree (tests/fake_cuda); on a machine with
 * one it is checked against the real driver as well.
 */
#include "test.h"

#include "cuda/cuda.h"

#include "fake_cuda/fake_cuda.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* ------------------------------------------------------------------------ */
/* Running a program with a chosen environment                              */
/* ------------------------------------------------------------------------ */

struct run {
  int status; /* exit status, or 128 + signal */
  char out[1 << 16];
  char err[1 << 14];
};

static void read_back(int fd, char *buf, size_t cap)
{
  ssize_t n = pread(fd, buf, cap - 1, 0);
  if (n < 0)
    TFAIL("pread: %s", strerror(errno));
  buf[n] = '\0';
  close(fd);
}

/*
 * Run @path with @args (NULL-terminated, argv[0] excluded) in an
 * environment made of ours without any GPUIPC_ setting (but GPUIPC_DIR,
 * each test's runtime directory) or FAKE_CUDA_ knob, plus @vars
 * ("NAME=value", NULL-terminated). Its stdout and stderr land in @r.
 */
static void run_env(struct run *r, const char *path, const char *const *args,
                    const char *const *vars)
{
  const char *argv[32], *envp[256];
  int na = 0, ne = 0;
  argv[na++] = path;
  for (; args != NULL && *args != NULL && na < 31; args++)
    argv[na++] = *args;
  argv[na] = NULL;
  for (char **e = environ; *e != NULL && ne < 200; e++) {
    if (strncmp(*e, "GPUIPC_", 7) == 0 && strncmp(*e, "GPUIPC_DIR=", 11) != 0)
      continue;
    if (strncmp(*e, "FAKE_CUDA_", 10) == 0 ||
        strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21) == 0)
      continue;
    envp[ne++] = *e;
  }
  for (; vars != NULL && *vars != NULL && ne < 255; vars++)
    envp[ne++] = *vars;
  envp[ne] = NULL;

  int out = memfd_create("driver-test-out", MFD_CLOEXEC);
  int err = memfd_create("driver-test-err", MFD_CLOEXEC);
  if (out < 0 || err < 0)
    TFAIL("memfd_create: %s", strerror(errno));
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0)
    TFAIL("fork: %s", strerror(errno));
  if (pid == 0) {
    if (dup2(out, 1) < 0 || dup2(err, 2) < 0)
      _exit(126);
    execve(path, (char *const *)argv, (char *const *)envp);
    fprintf(stderr, "exec %s: %s\n", path, strerror(errno));
    _exit(127);
  }
  r->status = test_wait(pid, 60000);
  read_back(out, r->out, sizeof(r->out));
  read_back(err, r->err, sizeof(r->err));
}

static void show(const char *what, const struct run *r)
{
  fprintf(stderr, "--- %s: exit %d\n--- stdout:\n%s--- stderr:\n%s---\n", what,
          r->status, r->out, r->err);
}

#define ASSERT_EXIT(r, what, code)                                             \
  do {                                                                         \
    if ((r)->status != (code)) {                                               \
      show(what, r);                                                           \
      TFAIL("%s exited %d, expected %d", what, (r)->status, (code));           \
    }                                                                          \
  } while (0)

#define ASSERT_HAS(r, what, stream, needle)                                    \
  do {                                                                         \
    if (strstr((r)->stream, (needle)) == NULL) {                               \
      show(what, r);                                                           \
      TFAIL("%s: %s lacks \"%s\"", what, #stream, (needle));                   \
    }                                                                          \
  } while (0)

static struct run R; /* large: not on the stack */

/* Append to @buf what snprintf can, cutting it short (a path in @vars may
 * be longer than @cap): @*off stays within the buffer. */
static void append(char *buf, size_t cap, size_t *off, const char *pre,
                   const char *s, const char *post)
{
  int n = snprintf(buf + *off, cap - *off, "%s%s%s", pre, s, post);
  if (n > 0)
    *off += (size_t)n < cap - *off ? (size_t)n : cap - *off - 1;
}

/* "PROG ARGS... [VARS]..." for messages, cut to @cap bytes. */
static void describe(char *buf, size_t cap, const char *prog,
                     const char *const *vars, const char *const *args)
{
  size_t off = 0;
  buf[0] = '\0';
  append(buf, cap, &off, "", prog, "");
  for (const char *const *a = args; a != NULL && *a != NULL; a++)
    append(buf, cap, &off, " ", *a, "");
  for (const char *const *v = vars; v != NULL && *v != NULL; v++)
    append(buf, cap, &off, " [", *v, "]");
}

/* Run driver_probe with @vars and the probe's own arguments. */
static void probe(const char *const *vars, const char *const *args)
{
  char what[256];
  describe(what, sizeof(what), "driver_probe", vars, args);
  run_env(&R, test_helper_path("driver_probe"), args, vars);
  ASSERT_EXIT(&R, what, 0);
  printf("ok: %s\n", what);
}

#define V(...) ((const char *const[]){__VA_ARGS__, NULL})
#define NOVARS ((const char *const *)NULL)

/* ------------------------------------------------------------------------ */
/* A small JSON reader: validates a document and lists its values by path   */
/* ("devices.0.uuid"); strings decoded, containers as "[n]" or "{n}".       */
/* ------------------------------------------------------------------------ */

struct jval {
  char path[128];
  char val[512];
};
static struct jval jv[1024];
static int njv;
static const char *jdoc;

#define JFAIL(p, ...)                                                          \
  do {                                                                         \
    fprintf(stderr, "JSON document:\n%s\n", jdoc);                             \
    fprintf(stderr, "at offset %td: ", (p)-jdoc);                              \
    TFAIL(__VA_ARGS__);                                                        \
  } while (0)

static void jws(const char **p)
{
  while (**p == ' ' || **p == '\n' || **p == '\t' || **p == '\r')
    (*p)++;
}

static void jadd(const char *path, const char *val)
{
  if (njv == (int)GPUIPC__ARRAY_SIZE(jv))
    TFAIL("JSON document has too many values");
  snprintf(jv[njv].path, sizeof(jv[njv].path), "%s", path);
  snprintf(jv[njv].val, sizeof(jv[njv].val), "%s", val);
  njv++;
}

static void jstring(const char **p, char *out, size_t cap)
{
  size_t n = 0;
  if (**p != '"')
    JFAIL(*p, "expected a string");
  (*p)++;
  for (;;) {
    unsigned char c = (unsigned char)**p;
    if (c == '\0')
      JFAIL(*p, "unterminated string");
    if (c < 0x20)
      JFAIL(*p, "raw control character 0x%02x in a string", c);
    (*p)++;
    if (c == '"')
      break;
    if (c == '\\') {
      char e = **p;
      (*p)++;
      switch (e) {
      case '"':
        c = '"';
        break;
      case '\\':
        c = '\\';
        break;
      case '/':
        c = '/';
        break;
      case 'b':
        c = '\b';
        break;
      case 'f':
        c = '\f';
        break;
      case 'n':
        c = '\n';
        break;
      case 'r':
        c = '\r';
        break;
      case 't':
        c = '\t';
        break;
      case 'u': {
        unsigned v = 0;
        for (int i = 0; i < 4; i++, (*p)++) {
          char h = **p;
          if (!((h >= '0' && h <= '9') || (h >= 'a' && h <= 'f') ||
                (h >= 'A' && h <= 'F')))
            JFAIL(*p, "bad \\u escape");
          v = v * 16 + (unsigned)(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
        }
        c = v < 0x80 ? (unsigned char)v : '?';
        break;
      }
      default:
        JFAIL(*p, "bad escape \\%c", e);
      }
    }
    if (n + 1 < cap)
      out[n++] = (char)c;
  }
  out[n] = '\0';
}

static void jvalue(const char **p, const char *path);

static void jchild_path(char *out, size_t cap, const char *path,
                        const char *key)
{
  int n = snprintf(out, cap, "%s%s%s", path, path[0] != '\0' ? "." : "", key);
  if (n < 0 || (size_t)n >= cap)
    TFAIL("JSON path %s.%s is too long", path, key);
}

static void jvalue(const char **p, const char *path)
{
  char buf[512], child[128];
  jws(p);
  const char *s = *p;
  if (*s == '{' || *s == '[') {
    char close = *s == '{' ? '}' : ']';
    int count = 0;
    (*p)++;
    jws(p);
    if (**p == close) {
      (*p)++;
    } else {
      for (;;) {
        if (close == '}') {
          jws(p);
          jstring(p, buf, sizeof(buf));
          jws(p);
          if (**p != ':')
            JFAIL(*p, "expected ':'");
          (*p)++;
          jchild_path(child, sizeof(child), path, buf);
        } else {
          snprintf(buf, sizeof(buf), "%d", count);
          jchild_path(child, sizeof(child), path, buf);
        }
        jvalue(p, child);
        count++;
        jws(p);
        if (**p == ',') {
          (*p)++;
          continue;
        }
        if (**p != close)
          JFAIL(*p, "expected ',' or '%c'", close);
        (*p)++;
        break;
      }
    }
    snprintf(buf, sizeof(buf), "%c%d%c", close == '}' ? '{' : '[', count,
             close);
    jadd(path, buf);
    return;
  }
  if (*s == '"') {
    jstring(p, buf, sizeof(buf));
    jadd(path, buf);
    return;
  }
  static const char *const words[] = {"true", "false", "null"};
  for (size_t i = 0; i < 3; i++)
    if (strncmp(s, words[i], strlen(words[i])) == 0) {
      *p += strlen(words[i]);
      jadd(path, words[i]);
      return;
    }
  /* -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
  const char *q = s;
  if (*q == '-')
    q++;
  if (*q == '0')
    q++;
  else if (*q >= '1' && *q <= '9')
    while (*q >= '0' && *q <= '9')
      q++;
  else
    JFAIL(q, "expected a value");
  if (*q == '.') {
    q++;
    if (!(*q >= '0' && *q <= '9'))
      JFAIL(q, "bad number");
    while (*q >= '0' && *q <= '9')
      q++;
  }
  if (*q == 'e' || *q == 'E') {
    q++;
    if (*q == '+' || *q == '-')
      q++;
    if (!(*q >= '0' && *q <= '9'))
      JFAIL(q, "bad number");
    while (*q >= '0' && *q <= '9')
      q++;
  }
  snprintf(buf, sizeof(buf), "%.*s", (int)(q - s), s);
  *p = q;
  jadd(path, buf);
}

static void json_parse(const char *doc)
{
  njv = 0;
  jdoc = doc;
  const char *p = doc;
  jws(&p);
  if (*p != '{')
    JFAIL(p, "the document is not an object");
  jvalue(&p, "");
  jws(&p);
  if (*p != '\0')
    JFAIL(p, "trailing text after the document");
}

static const char *json_get(const char *path)
{
  for (int i = 0; i < njv; i++)
    if (strcmp(jv[i].path, path) == 0)
      return jv[i].val;
  return NULL;
}

#define ASSERT_JSON(path, want)                                                \
  do {                                                                         \
    const char *got_ = json_get(path);                                         \
    if (got_ == NULL || strcmp(got_, (want)) != 0) {                           \
      fprintf(stderr, "JSON document:\n%s\n", jdoc);                           \
      TFAIL("JSON %s is \"%s\", expected \"%s\"", (path),                      \
            got_ != NULL ? got_ : "(absent)", (want));                         \
    }                                                                          \
  } while (0)

#define ASSERT_JSON_HAS(path, needle)                                          \
  do {                                                                         \
    const char *got_ = json_get(path);                                         \
    if (got_ == NULL || strstr(got_, (needle)) == NULL) {                      \
      fprintf(stderr, "JSON document:\n%s\n", jdoc);                           \
      TFAIL("JSON %s is \"%s\", which lacks \"%s\"", (path),                   \
            got_ != NULL ? got_ : "(absent)", (needle));                       \
    }                                                                          \
  } while (0)

/* The reader itself must refuse what is not JSON, or its passes mean
 * nothing: each of these must fail, in a child. */
static void check_json_reader(void)
{
  /* clang-format off */
  static const char *const bad[] = {
      "{\"a\": \"x\ty\"}", /* raw tab */
      "{\"a\": \"x\\qy\"}", /* bad escape */
      "{\"a\": 1,}",
      "{\"a\": 01}",
      "{\"a\" 1}",
      "{\"a\": [1 2]}",
      "{\"a\": tru}",
      "{\"a\": 1} x",
  };
  /* clang-format on */
  for (size_t i = 0; i < GPUIPC__ARRAY_SIZE(bad); i++) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
      int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
      dup2(devnull, 2);
      json_parse(bad[i]);
      _exit(0);
    }
    if (test_wait(pid, 10000) == 0)
      TFAIL("the JSON reader accepted %s", bad[i]);
  }
  json_parse("{\"a\": {\"b\": [1, -2.5e3, \"q\\\"\\\\\\t\\u0041\"]}, "
             "\"c\": [], \"d\": null}");
  ASSERT_JSON("a.b.0", "1");
  ASSERT_JSON("a.b.1", "-2.5e3");
  ASSERT_JSON("a.b.2", "q\"\\\tA");
  ASSERT_JSON("a.b", "[3]");
  ASSERT_JSON("a", "{1}");
  ASSERT_JSON("c", "[0]");
  ASSERT_JSON("d", "null");
}

/* ------------------------------------------------------------------------ */
/* This process: whatever driver the machine has                            */
/* ------------------------------------------------------------------------ */

#if GPUIPC_HAVE_CUDA
static int machine_has_driver;
#endif

static void check_this_process(void)
{
  int ver = -1;
  int rc = gpuipc_driver_status(&ver);
  printf("this machine: %s: %s (driver %d)\n", gpuipc_err_name(rc),
         rc != 0 ? gpuipc_last_error() : "ok", ver);
  if (getenv("GPUIPC_CUDA_LIB") != NULL || getenv("GPUIPC_NO_CUDA") != NULL) {
    printf("GPUIPC_CUDA_LIB or GPUIPC_NO_CUDA is set: not judging this "
           "machine's driver\n");
    return;
  }
#if !GPUIPC_HAVE_CUDA
  ASSERT_RC(rc, GPUIPC_E_NODRIVER);
  ASSERT_ERR_MENTIONS("without CUDA headers");
  ASSERT_EQ(ver, 0);
  ASSERT_EQ(gpuipc_device_count(), 0);
#else
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  machine_has_driver = h != NULL;
  if (h != NULL)
    dlclose(h);
  if (!machine_has_driver) {
    ASSERT_RC(rc, GPUIPC_E_NODRIVER);
    ASSERT_ERR_MENTIONS("libcuda.so.1");
    ASSERT_EQ(ver, 0);
    ASSERT_EQ(gpuipc_device_count(), 0);
    gpuipc_device_info_t in = {.size = sizeof(in)};
    ASSERT_RC(gpuipc_device_info(0, &in), GPUIPC_E_NODRIVER);
    ASSERT_ERR_MENTIONS("libcuda.so.1");
    return;
  }
  /* A driver is installed: it works, or it says why not. */
  if (rc != 0) {
    ASSERT_TRUE(rc == GPUIPC_E_NODRIVER || rc == GPUIPC_E_NODEVICE);
    ASSERT_TRUE(gpuipc_last_error()[0] != '\0');
    ASSERT_EQ(gpuipc_device_count(), 0);
    return;
  }
  ASSERT_GE(ver, GPUIPC_CU_MIN_DRIVER);
  int n = gpuipc_device_count();
  ASSERT_GT(n, 0);
  for (int i = 0; i < n; i++) {
    gpuipc_device_info_t in = {.size = sizeof(in)};
    ASSERT_OK(gpuipc_device_info(i, &in));
    static const uint8_t zero[16];
    ASSERT_TRUE(memcmp(in.uuid, zero, sizeof(zero)) != 0);
    ASSERT_EQ(gpuipc_device_by_uuid(in.uuid), i);
    printf("device %d: %s %s %s cc %d.%d vmm %d posix-fd %d fabric %d "
           "ipc-events %d pools %d (0x%x) granularity %llu\n",
           i, in.uuid_str, in.name, in.pci_bus_id, in.cc_major, in.cc_minor,
           in.vmm, in.posix_fd, in.fabric, in.ipc_events, in.mem_pools,
           (unsigned)in.pool_handle_types, (unsigned long long)in.granularity);
  }
  /* Everything else about the real devices, in a fresh process. */
  probe(NOVARS, V("table"));
#endif
}

/* ------------------------------------------------------------------------ */
/* Other processes: settings and fake drivers                               */
/* ------------------------------------------------------------------------ */

#define MISSING_LIB "/nonexistent-gpuipc-test/libcuda-missing.so.1"

/* gpuipc_uuid_str writes a UUID as the device table does. */
static void check_uuid_str(void)
{
  static const uint8_t uuid[16] = FAKE_CUDA_UUID0;
  char out[41];
  ASSERT_OK(gpuipc_uuid_str(uuid, out));
  ASSERT_STREQ(out, FAKE_CUDA_UUID0_STR);
  memset(out, 'x', sizeof(out));
  ASSERT_RC(gpuipc_uuid_str(NULL, out), -EINVAL);
  ASSERT_RC(gpuipc_uuid_str(uuid, NULL), -EINVAL);
  ASSERT_EQ(out[0], 'x');
}

/* Loaded or not, the driver library it tried has a name (the variants
 * check each name through `gpuipc info`, which asks this call). */
static void check_driver_library(void)
{
  const char *lib = NULL;
  ASSERT_OK(gpuipc_driver_library(&lib));
  ASSERT_TRUE(lib != NULL && lib[0] != '\0');
  printf("driver library: %s\n", lib);
  ASSERT_RC(gpuipc_driver_library(NULL), -EINVAL);
}

static void check_variants(void)
{
#if !GPUIPC_HAVE_CUDA
  probe(V("GPUIPC_NO_CUDA=1"),
        V("expect", "GPUIPC_E_NODRIVER", "--version=0", "without CUDA"));
  probe(V("GPUIPC_CUDA_LIB=" MISSING_LIB),
        V("expect", "GPUIPC_E_NODRIVER", "--version=0", "without CUDA"));
#else
  if (!machine_has_driver)
    probe(NOVARS, V("expect", "GPUIPC_E_NODRIVER", "--version=0", "dlopen",
                    "libcuda.so.1"));
  probe(V("GPUIPC_NO_CUDA=1"), V("expect", "GPUIPC_E_NODRIVER", "--version=0",
                                 "disabled by GPUIPC_NO_CUDA=1"));
  probe(V("GPUIPC_CUDA_LIB=" MISSING_LIB),
        V("expect", "GPUIPC_E_NODRIVER", "--version=0", MISSING_LIB));
#ifdef FAKE_CUDA_FULL
  const char *full = "GPUIPC_CUDA_LIB=" FAKE_CUDA_FULL;
  const char *v1 = "GPUIPC_CUDA_LIB=" FAKE_CUDA_V1;

  probe(V(full), V("fork"));
  probe(V(full), V("slow-publish"));
  probe(V(full), V("auto-kind"));
  /* GPUIPC_NO_CUDA wins over a library that would load. */
  probe(V(full, "GPUIPC_NO_CUDA=1"),
        V("expect", "GPUIPC_E_NODRIVER", "--version=0", "GPUIPC_NO_CUDA"));
  /* Not a CUDA driver at all. */
  probe(V("GPUIPC_CUDA_LIB=" FAKE_CUDA_NOGPA),
        V("expect", "GPUIPC_E_NODRIVER", "--version=0", "cuGetProcAddress",
          FAKE_CUDA_NOGPA));
  /* cuGetProcAddress that finds nothing: the first entry point asked. */
  probe(V(full, "FAKE_CUDA_HIDE=*"),
        V("expect", "GPUIPC_E_NODRIVER", "--version=0", "cuDriverGetVersion",
          "symbol not found"));
  /* One required entry point missing: named. */
  probe(V(full, "FAKE_CUDA_HIDE=cuDeviceGetUuid"),
        V("expect", "GPUIPC_E_NODRIVER", "--version=13000",
          "required entry point cuDeviceGetUuid", FAKE_CUDA_FULL));
  probe(V(full, "FAKE_CUDA_HIDE=cuMemAlloc"),
        V("expect", "GPUIPC_E_NODRIVER", "cuMemAlloc"));
  /* An optional one missing: loads, and the entry is NULL. */
  probe(V(full, "FAKE_CUDA_HIDE=cuMemCreate"), V("table", "fake"));
  /* Too old, with either cuGetProcAddress. */
  probe(V(full, "FAKE_CUDA_VERSION=11080"),
        V("expect", "GPUIPC_E_NODRIVER", "--version=11080", "too old", "11.8"));
  probe(V(v1, "FAKE_CUDA_VERSION=11040"),
        V("expect", "GPUIPC_E_NODRIVER", "--version=11040", "too old"));
  /* cuInit failures: no device is NODEVICE, anything else NODRIVER. */
  probe(V(full, "FAKE_CUDA_INIT=100"),
        V("expect", "GPUIPC_E_NODEVICE", "--version=13000",
          "cuInit: CUDA_ERROR_NO_DEVICE (no CUDA-capable device"));
  probe(V(full, "FAKE_CUDA_INIT=999"),
        V("expect", "GPUIPC_E_NODRIVER", "cuInit: CUDA_ERROR_UNKNOWN"));
  probe(V(full, "FAKE_CUDA_INIT=12345"),
        V("expect", "GPUIPC_E_NODRIVER", "cuInit: CUDA error 12345"));
  /* The driver works but sees nothing. */
  probe(V(full, "FAKE_CUDA_NDEV=0"),
        V("expect", "GPUIPC_E_NODEVICE", "--version=13000", "no device"));
  probe(V(full, "FAKE_CUDA_NDEV=0", "CUDA_VISIBLE_DEVICES=7"),
        V("expect", "GPUIPC_E_NODEVICE", "CUDA_VISIBLE_DEVICES=\"7\""));

  /* A device query the table needs fails: which device, which call. */
  probe(V(full, "FAKE_CUDA_BAD_ATTR=75"),
        V("expect", "GPUIPC_E_NODRIVER",
          "device 0: cuDeviceGetAttribute: CUDA_ERROR_INVALID_VALUE"));

  /* The whole table. */
  probe(V(full), V("table", "fake"));
  /* A 12.0 driver: every entry point is asked for at a version it has. */
  probe(V(full, "FAKE_CUDA_VERSION=12000"), V("table", "fake"));
  /* Only the CUDA 11 cuGetProcAddress exported, on a 13.0 driver. */
  probe(V(v1), V("table", "fake"));
  /* An attribute the driver cannot answer reads as unsupported. */
  probe(V(full, "FAKE_CUDA_BAD_ATTR=128"), V("table", "fake"));
#else
  printf("fake CUDA drivers not built: device table not checked here\n");
#endif
#endif
}

/* ------------------------------------------------------------------------ */
/* The gpuipc tool                                                          */
/* ------------------------------------------------------------------------ */

#ifdef GPUIPC_CLI
static void cli(const char *const *vars, const char *const *args, int want,
                const char *what)
{
  run_env(&R, GPUIPC_CLI, args, vars);
  ASSERT_EXIT(&R, what, want);
  printf("ok: %s\n", what);
}

static void check_cli(void)
{
  char want[64];
  snprintf(want, sizeof(want), "gpuipc %s", gpuipc_version());
  cli(NOVARS, V("--version"), 0, "gpuipc --version");
  ASSERT_HAS(&R, "gpuipc --version", out, want);

  cli(NOVARS, V("--help"), 0, "gpuipc --help");
  ASSERT_HAS(&R, "gpuipc --help", out, "usage");
  ASSERT_HAS(&R, "gpuipc --help", out, "info");
  cli(NOVARS, V("help", "info"), 0, "gpuipc help info");
  ASSERT_HAS(&R, "gpuipc help info", out, "--json");
  ASSERT_HAS(&R, "gpuipc help info", out, "--config");
  cli(NOVARS, V("info", "--help"), 0, "gpuipc info --help");
  ASSERT_HAS(&R, "gpuipc info --help", out, "--json");

  /* Usage errors: exit 2, the complaint and the usage on stderr only. */
  cli(NOVARS, (const char *const[]){NULL}, 2, "gpuipc");
  ASSERT_HAS(&R, "gpuipc", err, "usage");
  ASSERT_EQ(strlen(R.out), 0);
  cli(NOVARS, V("frobnicate"), 2, "gpuipc frobnicate");
  ASSERT_HAS(&R, "gpuipc frobnicate", err, "unknown command 'frobnicate'");
  ASSERT_HAS(&R, "gpuipc frobnicate", err, "usage");
  ASSERT_EQ(strlen(R.out), 0);
  cli(NOVARS, V("help", "frobnicate"), 2, "gpuipc help frobnicate");
  ASSERT_HAS(&R, "gpuipc help frobnicate", err, "frobnicate");
  cli(NOVARS, V("info", "--frobnicate"), 2, "gpuipc info --frobnicate");
  ASSERT_HAS(&R, "gpuipc info --frobnicate", err, "--frobnicate");
  ASSERT_EQ(strlen(R.out), 0);

  /* No driver: still exit 0, saying where loading failed. */
  const char *missing = "GPUIPC_CUDA_LIB=" MISSING_LIB;
  cli(V(missing), V("info"), 0, "gpuipc info (no driver)");
  ASSERT_HAS(&R, "gpuipc info (no driver)", out, want);
  ASSERT_HAS(&R, "gpuipc info (no driver)", out, "GPUIPC_E_NODRIVER");
  ASSERT_HAS(&R, "gpuipc info (no driver)", out, MISSING_LIB);
  ASSERT_HAS(&R, "gpuipc info (no driver)", out, "host");

  cli(V(missing), V("info", "--json"), 0, "gpuipc info --json (no driver)");
  json_parse(R.out);
  ASSERT_JSON("version", gpuipc_version());
  ASSERT_JSON("driver.ok", "false");
  ASSERT_JSON("driver.status", "GPUIPC_E_NODRIVER");
  ASSERT_JSON("driver.version", "0");
  ASSERT_JSON("driver.library", MISSING_LIB);
#if GPUIPC_HAVE_CUDA
  ASSERT_JSON_HAS("driver.error", MISSING_LIB);
#else
  ASSERT_JSON_HAS("driver.error", "without CUDA headers");
#endif
  ASSERT_JSON("devices", "[0]");
  ASSERT_JSON("kinds.host.available", "true");
  ASSERT_JSON("kinds.host.status", "OK");
  ASSERT_JSON("kinds.host.error", "null");
  ASSERT_JSON("kinds.vmm.available", "false");
  ASSERT_TRUE(json_get("kinds.vmm.error") != NULL &&
              strcmp(json_get("kinds.vmm.error"), "null") != 0);
  ASSERT_TRUE(json_get("runtime_dir.path") != NULL);
  ASSERT_TRUE(json_get("runtime_dir.error") != NULL);
  char count[16];
  snprintf(count, sizeof(count), "{%d}", gpuipc_config_count());
  ASSERT_JSON("config", count);
  ASSERT_JSON("config.GPUIPC_CUDA_LIB.value", MISSING_LIB);
  ASSERT_JSON("config.GPUIPC_CUDA_LIB.default", "libcuda.so.1");
  ASSERT_JSON("config.GPUIPC_CUDA_LIB.set", "true");
  ASSERT_JSON("config.GPUIPC_LOG.set", "false");

  /* --config: every setting, its value, default, whether set, and help. */
  const char *const timeout[] = {"GPUIPC_TIMEOUT_MS=1234", NULL};
  cli(timeout, V("info", "--config"), 0, "gpuipc info --config");
  for (int i = 0; i < gpuipc_config_count(); i++) {
    gpuipc_config_item_t it;
    ASSERT_OK(gpuipc_config_get(i, &it));
    ASSERT_HAS(&R, "gpuipc info --config", out, it.name);
    ASSERT_HAS(&R, "gpuipc info --config", out, it.help);
  }
  ASSERT_HAS(&R, "gpuipc info --config", out, "1234");
  ASSERT_HAS(&R, "gpuipc info --config", out, "10000");
  cli(timeout, V("info", "--config", "--json"), 0,
      "gpuipc info --config --json");
  json_parse(R.out);
  ASSERT_JSON("config", count);
  ASSERT_JSON("config.GPUIPC_TIMEOUT_MS.value", "1234");
  ASSERT_JSON("config.GPUIPC_TIMEOUT_MS.default", "10000");
  ASSERT_JSON("config.GPUIPC_TIMEOUT_MS.set", "true");
  ASSERT_JSON("config.GPUIPC_LOG.value", "off");
  ASSERT_JSON("config.GPUIPC_LOG.set", "false");
  gpuipc_config_item_t log_item;
  for (int i = 0;; i++) {
    ASSERT_OK(gpuipc_config_get(i, &log_item));
    if (strcmp(log_item.name, "GPUIPC_LOG") == 0)
      break;
  }
  ASSERT_JSON("config.GPUIPC_LOG.help", log_item.help);

#ifdef FAKE_CUDA_FULL
  const char *full = "GPUIPC_CUDA_LIB=" FAKE_CUDA_FULL;
  cli(V(full), V("info"), 0, "gpuipc info (fake driver)");
  ASSERT_HAS(&R, "gpuipc info (fake driver)", out, FAKE_CUDA_UUID0_STR);
  ASSERT_HAS(&R, "gpuipc info (fake driver)", out, FAKE_CUDA_UUID1_STR);
  ASSERT_HAS(&R, "gpuipc info (fake driver)", out, FAKE_CUDA_PCI0_LOWER);
  ASSERT_HAS(&R, "gpuipc info (fake driver)", out, FAKE_CUDA_FULL);
  ASSERT_HAS(&R, "gpuipc info (fake driver)", out, "13.0");

  cli(V(full), V("info", "--json"), 0, "gpuipc info --json (fake driver)");
  json_parse(R.out);
  ASSERT_JSON("driver.ok", "true");
  ASSERT_JSON("driver.status", "OK");
  ASSERT_JSON("driver.version", "13000");
  ASSERT_JSON("driver.library", FAKE_CUDA_FULL);
  ASSERT_JSON("driver.error", "null");
  ASSERT_JSON("devices", "[2]");
  ASSERT_JSON("devices.0.ordinal", "0");
  ASSERT_JSON("devices.0.uuid", FAKE_CUDA_UUID0_STR);
  ASSERT_JSON("devices.0.name", FAKE_CUDA_NAME0); /* decoded back */
  ASSERT_JSON("devices.0.pci_bus_id", FAKE_CUDA_PCI0_LOWER);
  ASSERT_JSON("devices.0.total_mem", "85899345920");
  ASSERT_JSON("devices.0.compute_capability", "9.0");
  ASSERT_JSON("devices.0.vmm", "true");
  ASSERT_JSON("devices.0.posix_fd", "true");
  ASSERT_JSON("devices.0.fabric", "true");
  ASSERT_JSON("devices.0.ipc_events", "true");
  ASSERT_JSON("devices.0.mem_pools", "true");
  ASSERT_JSON("devices.0.pool_handle_types", "9");
  ASSERT_JSON("devices.0.unified_addressing", "true");
  ASSERT_JSON("devices.0.granularity", "2097152");
  ASSERT_JSON("devices.1.ordinal", "1");
  ASSERT_JSON("devices.1.uuid", FAKE_CUDA_UUID1_STR);
  ASSERT_JSON("devices.1.name", FAKE_CUDA_NAME1);
  ASSERT_JSON("devices.1.compute_capability", "8.6");
  ASSERT_JSON("devices.1.vmm", "false");
  ASSERT_JSON("devices.1.fabric", "false");
  ASSERT_JSON("devices.1.pool_handle_types", "1");
  ASSERT_JSON("devices.1.granularity", "0");
  ASSERT_JSON("kinds.host.available", "true");
#endif
}
#endif /* GPUIPC_CLI */

int main(void)
{
  check_json_reader();
  check_uuid_str();
  check_this_process();
  check_variants();
  check_driver_library();
#ifdef GPUIPC_CLI
  check_cli();
#else
  printf("the gpuipc tool is not built: `gpuipc info` not checked\n");
#endif
  return 0;
}
