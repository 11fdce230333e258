/*
 * The runtime directory: created 0700, refused when it is a link, not a
 * directory, someone else's or writable by others; and where it is when
 * GPUIPC_DIR or XDG_RUNTIME_DIR are unset. Its path is spelt one way
 * ("//", "/./" and trailing slashes go). A /tmp/gpuipc-$UID that another
 * user made first is refused with a sentence that says what to do, from
 * the library and from the CLI. Settings are read once per process, so
 * each environment is tried in a fresh process (os_rundir).
 */
#include "test.h"

#include "os/os.h"

#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/wait.h>
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
    denied_mentioning("set GPUIPC_DIR to a directory of your own");
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

/* Run @argv as uid @uid (gid 65534); its output (both streams) into @out. */
static int run_as(uid_t uid, const char *const *argv, char *out, size_t cap)
{
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT_TRUE(pid >= 0);
  if (pid == 0) {
    if (dup2(p[1], 1) < 0 || dup2(p[1], 2) < 0 || setgroups(0, NULL) != 0 ||
        setgid(65534) != 0 || setuid(uid) != 0)
      _exit(126);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  close(p[1]);
  size_t len = 0;
  ssize_t n;
  while (len + 1 < cap && (n = read(p[0], out + len, cap - len - 1)) > 0)
    len += (size_t)n;
  out[len] = '\0';
  close(p[0]);
  return test_wait(pid, TIMEOUT_MS);
}

/*
 * Another user made /tmp/gpuipc-$UID first (anyone may: /tmp is open to
 * all). With GPUIPC_DIR and XDG_RUNTIME_DIR unset the victim is refused,
 * and told which directory, whose it is and what to do, by
 * gpuipc_domain_join and by `gpuipc ls`. Played by two uids that are not
 * ours, so that our own /tmp/gpuipc-$UID stays as it is.
 */
static void squatted(void)
{
  if (geteuid() != 0) {
    printf("note: not root, so the test of a /tmp/gpuipc-$UID made by "
           "another user is left out\n");
    return;
  }
  char p[PATH_MAX], owner[64];
  unsigned victim = 200000 + (unsigned)getpid() % 100000;
  struct stat st;
  for (;; victim++) {
    snprintf(p, sizeof(p), "/tmp/gpuipc-%u", victim);
    if (lstat(p, &st) != 0 && errno == ENOENT)
      break;
  }
  ASSERT_EQ(mkdir(p, 0700), 0);
  ASSERT_EQ(chown(p, 65534, 65534), 0); /* the squatter's */
  snprintf(owner, sizeof(owner), "owned by uid 65534, not by this "
                                 "process's uid %u", victim);
  set_env("GPUIPC_DIR", NULL);
  set_env("XDG_RUNTIME_DIR", NULL);
  char uid[16], code[16];
  snprintf(uid, sizeof(uid), "%u", victim);
  snprintf(code, sizeof(code), "%d", GPUIPC_E_DENIED);
  const char *remedy = "remove it (its owner or root can), or set "
                       "GPUIPC_DIR or XDG_RUNTIME_DIR to a directory of "
                       "your own";
  printf("/tmp/gpuipc-%u made by uid 65534: expect join to say so\n",
         victim);
  const char *args[] = {"join", uid, code, p, owner, remedy, NULL};
  ASSERT_EQ(test_wait(test_spawn("os_rundir", args, NULL), TIMEOUT_MS), 0);
#ifdef GPUIPC_CLI
  char out[4096];
  const char *ls[] = {GPUIPC_CLI, "ls", NULL};
  int rc = run_as(victim, ls, out, sizeof(out));
  printf("gpuipc ls as uid %u: exit %d: %s", victim, rc, out);
  if (rc == 127) /* the build tree is closed to other users */
    printf("note: uid %u may not run %s, so the CLI's sentence is left "
           "out\n", victim, GPUIPC_CLI);
  else
    ASSERT_TRUE(rc != 0);
  if (rc != 127) {
    ASSERT_TRUE(strstr(out, p) != NULL);
    ASSERT_TRUE(strstr(out, owner) != NULL);
    ASSERT_TRUE(strstr(out, remedy) != NULL);
  }
#endif
  ASSERT_EQ(lstat(p, &st), 0); /* untouched */
  ASSERT_EQ(st.st_uid, 65534);
  ASSERT_EQ(rmdir(p), 0);
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
  squatted();

  set_env("GPUIPC_DIR", base);
  set_env("XDG_RUNTIME_DIR", had_xdg ? xdg_saved : NULL);
  if (own_base)
    rm_rf(base);
  printf("rundir: ok\n");
  return 0;
}
