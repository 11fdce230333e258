/*
 * The runtime directory: created 0700, refused when it is a link, not a
 * directory, someone else's or writable by others; and where it is when
 * GPUIPC_DIR or XDG_RUNTIME_DIR are unset. Its path is spelt one way
 * ("//", "/./" and trailing slashes go). Settings are read once per
 * process, so each environment is tried in a fresh process (os_rundir).
 */
#include "test.h"

#include "os/os.h"

#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#define TIMEOUT_MS 20000

static char base[PATH_MAX];

static int remove_entry(const char *path, const struct stat *sb, int flag,
                        struct FTW *ftw)
{
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

static void rm_rf(const char *path)
{
  if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 &&
      errno != ENOENT)
    TFAIL("removing %s: %s", path, strerror(errno));
}

static void set_env(const char *name, const char *value)
{
  if (value != NULL)
    ASSERT_EQ(setenv(name, value, 1), 0);
  else
    ASSERT_EQ(unsetenv(name), 0);
}

/* Run os_rundir with @args under GPUIPC_DIR=@dir, XDG_RUNTIME_DIR=@xdg
 * (NULL: unset). */
static void in_child(const char *dir, const char *xdg, const char *const *args)
{
  printf("GPUIPC_DIR=%s XDG_RUNTIME_DIR=%s: expect %s %s\n",
         dir ? dir : "(unset)", xdg ? xdg : "(unset)", args[0], args[1]);
  set_env("GPUIPC_DIR", dir);
  set_env("XDG_RUNTIME_DIR", xdg);
  pid_t pid = test_spawn("os_rundir", args, NULL);
  ASSERT_EQ(test_wait(pid, TIMEOUT_MS), 0);
}

static void expect_ok(const char *dir, const char *xdg, const char *path)
{
  const char *args[] = {"ok", path, NULL};
  in_child(dir, xdg, args);
}

static void expect_fail(const char *dir, const char *xdg, int code,
                        const char *needle)
{
  char c[16];
  snprintf(c, sizeof(c), "%d", code);
  const char *args[] = {"fail", c, needle, NULL};
  in_child(dir, xdg, args);
}

static unsigned mode_of(const char *path)
{
  struct stat st;
  ASSERT_EQ(lstat(path, &st), 0);
  return st.st_mode & 07777;
}

static void denied_mentioning(const char *needle)
{
  char out[PATH_MAX] = "untouched";
  ASSERT_RC(gpuipc__runtime_dir(out, sizeof(out)), GPUIPC_E_DENIED);
  ASSERT_ERR_MENTIONS(base);
  ASSERT_ERR_MENTIONS(needle);
  ASSERT_STREQ(out, "untouched");
}

/* In this process: GPUIPC_DIR is @base. */
static void create_and_check(void)
{
  rm_rf(base); /* prove that it is created */
  char out[PATH_MAX];
  ASSERT_OK(gpuipc__runtime_dir(out, sizeof(out)));
  ASSERT_STREQ(out, base);
  ASSERT_EQ(mode_of(base), 0700);
  struct stat st;
  ASSERT_EQ(lstat(base, &st), 0);
  ASSERT_EQ(st.st_uid, geteuid());
  ASSERT_OK(gpuipc__runtime_dir(out, sizeof(out))); /* exists: fine */

  ASSERT_EQ(chmod(base, 0770), 0);
  denied_mentioning("mode 0770");
  ASSERT_EQ(chmod(base, 0777), 0);
  denied_mentioning("mode 0777");
  ASSERT_EQ(chmod(base, 0702), 0);
  denied_mentioning("mode 0702");
  ASSERT_EQ(chmod(base, 0755), 0); /* readable by others is allowed */
  ASSERT_OK(gpuipc__runtime_dir(out, sizeof(out)));
  ASSERT_EQ(chmod(base, 0700), 0);

  if (geteuid() == 0) {
    ASSERT_EQ(chown(base, 65534, 65534), 0);
    denied_mentioning("owned by uid 65534");
    ASSERT_EQ(chown(base, 0, 0), 0);
    ASSERT_OK(gpuipc__runtime_dir(out, sizeof(out)));
  } else {
    printf("note: not root, so the test of a directory owned by another "
           "uid is left out\n");
  }

  char small[4] = "abc";
  ASSERT_RC(gpuipc__runtime_dir(small, sizeof(small)), -ENAMETOOLONG);
  ASSERT_STREQ(small, "abc");
  ASSERT_RC(gpuipc__runtime_dir(NULL, 10), -EINVAL);

  /* The public call: the same directory, the same checks. */
  ASSERT_OK(gpuipc_runtime_dir(out, sizeof(out), 0));
  ASSERT_STREQ(out, base);
  ASSERT_OK(gpuipc_runtime_dir(out, sizeof(out), GPUIPC_RUNDIR_FIND));
  ASSERT_STREQ(out, base);
  ASSERT_EQ(chmod(base, 0777), 0);
  ASSERT_RC(gpuipc_runtime_dir(out, sizeof(out), GPUIPC_RUNDIR_FIND),
            GPUIPC_E_DENIED);
  ASSERT_EQ(chmod(base, 0700), 0);
  ASSERT_RC(gpuipc_runtime_dir(small, sizeof(small), 0), -ENAMETOOLONG);
  ASSERT_STREQ(small, "abc");
  ASSERT_RC(gpuipc_runtime_dir(NULL, 10, 0), -EINVAL);
  ASSERT_RC(gpuipc_runtime_dir(out, sizeof(out), 0x2), -EINVAL);
  ASSERT_ERR_MENTIONS("unknown flags 0x2");
}

static void path_in(char *out, const char *dir, const char *name)
{
  int n = snprintf(out, PATH_MAX, "%s/%s", dir, name);
  ASSERT_TRUE(n > 0 && n < PATH_MAX);
}

/* In fresh processes with other environments. */
static void variants(void)
{
  char v[PATH_MAX], p[PATH_MAX], q[PATH_MAX + 8];
  path_in(v, base, "v");
  ASSERT_EQ(mkdir(v, 0700), 0);

  /* GPUIPC_DIR with missing parents. */
  path_in(p, v, "a/b/c");
  expect_ok(p, NULL, p);
  ASSERT_EQ(mode_of(p), 0700);
  struct stat st;
  path_in(q, v, "a/b");
  ASSERT_EQ(lstat(q, &st), 0);
  ASSERT_TRUE(S_ISDIR(st.st_mode));

  /* Trailing slashes are dropped from the name. */
  path_in(p, v, "t");
  snprintf(q, sizeof(q), "%s///", p);
  expect_ok(q, NULL, p);

  /* "//" and "/./" are spelt "/": one directory, one name. */
  path_in(q, v, "/.//t/./");
  expect_ok(q, NULL, p);

  /* A symbolic link to a good directory is refused, slash or not. */
  path_in(p, v, "real");
  ASSERT_EQ(mkdir(p, 0700), 0);
  path_in(q, v, "link");
  ASSERT_EQ(symlink(p, q), 0);
  expect_fail(q, NULL, GPUIPC_E_DENIED, "is a symbolic link");
  strcat(q, "/");
  expect_fail(q, NULL, GPUIPC_E_DENIED, "is a symbolic link");

  /* A regular file. */
  path_in(p, v, "file");
  int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  expect_fail(p, NULL, GPUIPC_E_DENIED, "is not a directory");

  /* A relative GPUIPC_DIR would name different places in different
   * processes. */
  expect_fail("relative/dir", NULL, -EINVAL, "not an absolute path");

  /* GPUIPC_DIR unset (or empty): $XDG_RUNTIME_DIR/gpuipc. */
  char xdg[PATH_MAX];
  path_in(xdg, v, "xdg");
  ASSERT_EQ(mkdir(xdg, 0700), 0);
  path_in(p, xdg, "gpuipc");
  expect_ok(NULL, xdg, p);
  ASSERT_EQ(mode_of(p), 0700);
  expect_ok("", xdg, p);
  snprintf(q, sizeof(q), "%s/", xdg); /* not ".../xdg//gpuipc" */
  expect_ok(NULL, q, p);

  /* Neither: /tmp/gpuipc-$UID. A relative XDG_RUNTIME_DIR is ignored. */
  snprintf(p, sizeof(p), "/tmp/gpuipc-%u", (unsigned)geteuid());
  expect_ok(NULL, NULL, p);
  expect_ok(NULL, "run/user", p);
  expect_ok(NULL, "", p);
}

/*
 * Every ancestor: whoever may replace one could swap the directory. A
 * parent writable by others is refused unless sticky; one owned by
 * another uid is refused; a symbolic link is followed to check where it
 * leads. Checked before anything is made below it.
 */
static void ancestors(void)
{
  char open_dir[PATH_MAX], p[PATH_MAX], q[PATH_MAX];
  path_in(open_dir, base, "open");
  ASSERT_EQ(mkdir(open_dir, 0700), 0);
  ASSERT_EQ(chmod(open_dir, 0777), 0);
  path_in(p, open_dir, "gpuipc");
  expect_fail(p, NULL, GPUIPC_E_DENIED, open_dir);
  expect_fail(p, NULL, GPUIPC_E_DENIED, "not sticky");
  path_in(q, open_dir, "gpuipc/deeper");
  expect_fail(q, NULL, GPUIPC_E_DENIED, open_dir);
  ASSERT_EQ(access(p, F_OK), -1); /* nothing made under it */
  ASSERT_EQ(chmod(open_dir, 01777), 0); /* sticky, like /tmp */
  expect_ok(p, NULL, p);
  ASSERT_EQ(chmod(open_dir, 0770), 0);
  expect_fail(p, NULL, GPUIPC_E_DENIED, "mode 0770");

  /* A link to a good path under a bad ancestor. */
  path_in(q, base, "link");
  ASSERT_EQ(symlink(open_dir, q), 0);
  path_in(q, base, "link/gpuipc");
  expect_fail(q, NULL, GPUIPC_E_DENIED, open_dir);
  ASSERT_EQ(chmod(open_dir, 0755), 0);
  expect_ok(q, NULL, q);

  if (geteuid() == 0) {
    ASSERT_EQ(chown(open_dir, 65534, 65534), 0);
    expect_fail(p, NULL, GPUIPC_E_DENIED, "owned by uid 65534");
    expect_fail(p, NULL, GPUIPC_E_DENIED, open_dir);
    ASSERT_EQ(chown(open_dir, 0, 0), 0);
    expect_ok(p, NULL, p);
  } else {
    printf("note: not root, so the test of a parent owned by another uid "
           "is left out\n");
  }

  /* Looking, not making: a missing directory is reported, not created. */
  path_in(p, base, "missing/gpuipc");
  const char *args[] = {"missing", p, NULL};
  in_child(p, NULL, args);
  path_in(p, base, "missing");
  ASSERT_EQ(access(p, F_OK), -1);
}

int main(void)
{
  const char *env = getenv("GPUIPC_DIR");
  bool own_base = env == NULL || env[0] != '/';
  if (!own_base)
    snprintf(base, sizeof(base), "%s", env);
  else
    snprintf(base, sizeof(base), "/tmp/gpuipc-rundir-test-%d", (int)getpid());
  /* Before the first gpuipc call, which reads the settings. */
  ASSERT_EQ(setenv("GPUIPC_DIR", base, 1), 0);
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  bool had_xdg = xdg != NULL;
  char xdg_saved[PATH_MAX] = "";
  if (had_xdg)
    snprintf(xdg_saved, sizeof(xdg_saved), "%s", xdg);

  create_and_check();
  variants();
  ancestors();

  set_env("GPUIPC_DIR", base);
  set_env("XDG_RUNTIME_DIR", had_xdg ? xdg_saved : NULL);
  if (own_base)
    rm_rf(base);
  printf("rundir: ok\n");
  return 0;
}
