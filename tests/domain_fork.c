/*
 * A domain does not survive fork(), and a child made by fork() without
 * exec must not keep the domain alive in its parent's place:
 *  - a member forks, then dies: the broker sees it leave (its references
 *    go) although the child still runs;
 *  - the broker's host forks, then dies: the survivors elect a new broker
 *    although the child still runs (it must not hold the lock, the
 *    listener or the members' connections), however the runtime
 *    directory is spelt (GPUIPC_DIR with "/./", "//" or a symbolic link
 *    above it; XDG_RUNTIME_DIR with a trailing slash): the kernel names
 *    the lock file by its resolved path;
 *  - a member that names the directory through a symbolic link, the broker
 *    without one, forks and dies: the broker sees it leave;
 *  - a child (of this process: fork() without exec is the point) that
 *    joins anew and releases a segment buffer it inherited tells no
 *    broker: the parent's domain is not its own (its calls fail with
 *    GPUIPC_E_CLOSED), and its own holds stay as they are;
 *  - fork() while another thread opens and releases segments: the child
 *    never inherits a segment or buffer lock held by a thread it lacks;
 *  - the segment table's lock, which src/segment registers with fork.c's
 *    registry of fork hooks, is taken before the lock of any object
 *    registered there, even one registered before it (the lock order).
 */
#include "test.h"
#include "helpers/seg_peer.h"
#include "segment/seg_table.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/wait.h>

static pid_t peer_fork(struct peer *p)
{
  int child = 0;
  const char *r = peer_cmd(p, "fork");
  if (sscanf(r, "ok %d", &child) != 1)
    TFAIL("fork: %s", r);
  ASSERT_GT(child, 0);
  return child;
}

/* The child's side of case 3; returns its exit code. */
static int child_of_member(gpuipc_domain_t *old, gpuipc_buf_t *inherited)
{
  gpuipc_domain_t *d;
  if (gpuipc_domain_join("fk3", NULL, &d) != 0)
    return 10;
  gpuipc_buf_t *b;
  if (test_seg_open(d, "s", 0, -1, 0, &b) != 0)
    return 11;
  gpuipc_segment_info_t s = {.size = sizeof(s)};
  if (gpuipc_segment_stat(old, "s", &s) != GPUIPC_E_CLOSED)
    return 12; /* the parent's domain is not ours */
  gpuipc_buf_release(inherited); /* the parent's grant: nobody is told */
  for (int i = 0; i < 20; i++) { /* a RELEASE would have landed by now */
    if (gpuipc_segment_stat(d, "s", &s) != 0)
      return 13;
  }
  int mine = -1;
  for (int i = 0; i < s.nholders && i < GPUIPC_SEGMENT_HOLDERS; i++)
    if (s.holder_pids[i] == getpid())
      mine = s.holder_refs[i];
  if (mine != 1)
    return 14;
  if (gpuipc_domain_leave(old) != 0)
    return 15;
  gpuipc_buf_release(b);
  if (gpuipc_domain_leave(d) != 0)
    return 16;
  return 0;
}

static void member_child(void)
{
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("fk3", NULL, &dom));
  gpuipc_buf_t *a;
  ASSERT_OK(test_seg_open(dom, "s", 4096, -1, GPUIPC_CREATE, &a));
  fflush(NULL);
  pid_t pid = fork();
  ASSERT_TRUE(pid >= 0);
  if (pid == 0)
    _exit(child_of_member(dom, a));
  ASSERT_EQ(test_wait(pid, 60000), 0);
  gpuipc_segment_info_t s = {.size = sizeof(s)};
  ASSERT_OK(gpuipc_segment_stat(dom, "s", &s));
  ASSERT_EQ(s.nholders, 1); /* ours; the child's went with it */
  ASSERT_EQ(s.holder_pids[0], getpid());
  ASSERT_OK(gpuipc_buf_release(a));
  ASSERT_OK(gpuipc_domain_leave(dom));
}

static gpuipc_domain_t *busy_dom;
static atomic_bool busy_stop;

static void *busy(void *arg)
{
  (void)arg;
  while (!atomic_load(&busy_stop)) {
    gpuipc_buf_t *b;
    ASSERT_OK(test_seg_open(busy_dom, "busy", 4096, -1, GPUIPC_CREATE,
                                  &b));
    ASSERT_OK(gpuipc_buf_release(b));
  }
  return NULL;
}

/* fork() while another thread takes and lets go of segment locks. */
static void fork_while_busy(void)
{
  ASSERT_OK(gpuipc_domain_join("fk4", NULL, &busy_dom));
  gpuipc_buf_t *held;
  ASSERT_OK(test_seg_open(busy_dom, "held", 4096, -1, GPUIPC_CREATE,
                                &held));
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, NULL, busy, NULL), 0);
  for (int i = 0; i < 40; i++) {
    fflush(NULL);
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
      /* Takes the buffer registry's lock and the segment table's. */
      gpuipc_buf_release(held);
      gpuipc_buf_t *b;
      if (gpuipc_buf_alloc(4096, GPUIPC_KIND_HOST, -1, 0, &b) != 0)
        _exit(2);
      gpuipc_buf_release(b);
      _exit(0);
    }
    ASSERT_EQ(test_wait(pid, 30000), 0);
  }
  atomic_store(&busy_stop, true);
  pthread_join(t, NULL);
  ASSERT_OK(gpuipc_buf_release(held));
  ASSERT_OK(gpuipc_domain_leave(busy_dom));
}

/* What the probe's prepare found: 1 the table's lock held, 0 free. */
static int probe_saw_held = -1;

static void probe_prepare(struct gpuipc__fork_hook *h)
{
  (void)h;
  int rc = pthread_mutex_trylock(&gpuipc__seg_mu);
  if (rc == 0)
    pthread_mutex_unlock(&gpuipc__seg_mu);
  probe_saw_held = rc == EBUSY;
}

static void probe_after(struct gpuipc__fork_hook *h)
{
  (void)h;
}

/*
 * A fork hook registered before this process touched any segment: by the
 * time its prepare runs, fork() holds the segment table's lock.
 */
static void seg_lock_first(void)
{
  static struct gpuipc__fork_hook probe = {
      .prepare = probe_prepare, .parent = probe_after, .child = probe_after};
  gpuipc__fork_register(&probe);
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("fk0", NULL, &dom));
  gpuipc_buf_t *b;
  ASSERT_OK(test_seg_open(dom, "first", 4096, -1, GPUIPC_CREATE, &b));
  fflush(NULL);
  pid_t pid = fork();
  ASSERT_TRUE(pid >= 0);
  if (pid == 0)
    _exit(0);
  ASSERT_EQ(test_wait(pid, 30000), 0);
  ASSERT_EQ(probe_saw_held, 1);
  gpuipc__fork_unregister(&probe);
  ASSERT_OK(gpuipc_buf_release(b));
  ASSERT_OK(gpuipc_segment_unlink(dom, "first"));
  ASSERT_OK(gpuipc_domain_leave(dom));
}

/*
 * In a fresh peer: GPUIPC_DIR=@dir and XDG_RUNTIME_DIR=@xdg ("" unsets
 * it, NULL keeps ours).
 */
static void peer_env(struct peer *p, const char *dir, const char *xdg)
{
  if (dir != NULL && dir[0] != '\0')
    PEER_OK(p, "setenv GPUIPC_DIR %s", dir);
  else if (dir != NULL)
    PEER_OK(p, "unsetenv GPUIPC_DIR");
  if (xdg != NULL && xdg[0] != '\0')
    PEER_OK(p, "setenv XDG_RUNTIME_DIR %s", xdg);
  else if (xdg != NULL)
    PEER_OK(p, "unsetenv XDG_RUNTIME_DIR");
}

/*
 * The broker's host forks and is killed while its child lives: the
 * survivor becomes the broker and keeps its data (the child must not hold
 * the lock, the listener or the connections).
 */
static void host_forks_and_dies(const char *domain, const char *dir,
                                const char *xdg)
{
  printf("host forks and dies: GPUIPC_DIR=%s XDG_RUNTIME_DIR=%s\n",
         dir ? dir : "(ours)", xdg ? xdg : "(ours)");
  struct peer host, survivor;
  peer_start(&host);
  peer_start(&survivor);
  peer_env(&host, dir, xdg);
  peer_env(&survivor, dir, xdg);
  PEER_OK(&host, "join %s", domain);
  PEER_OK(&survivor, "join %s", domain);
  PEER_OK(&host, "open data 8192 c");
  PEER_OK(&host, "fill data 6");
  PEER_OK(&survivor, "open data 0 -");
  pid_t child = peer_fork(&host);
  peer_kill(&host);
  int bpid, hosts, members, segs, fds;
  const char *r = peer_cmd(&survivor, "info");
  if (sscanf(r, "ok %d %d %d %d %d", &bpid, &hosts, &members, &segs, &fds) !=
      5)
    TFAIL("info after the host died: %s", r);
  ASSERT_EQ(bpid, survivor.pid);
  ASSERT_EQ(kill(child, 0), 0); /* it did not stand in the way */
  PEER_OK(&survivor, "check data 6");
  PEER_OK(&survivor, "release data");
  PEER_OK(&survivor, "open data 0 -");
  PEER_OK(&survivor, "check data 6");
  kill(child, SIGKILL);
  PEER_OK(&survivor, "leave");
  peer_finish(&survivor);
}

static void path_in(char *out, const char *dir, const char *name)
{
  int n = snprintf(out, PATH_MAX, "%s/%s", dir, name);
  ASSERT_TRUE(n > 0 && n < PATH_MAX);
}

static void make_dir(const char *path, mode_t mode)
{
  if (mkdir(path, mode) != 0 && errno != EEXIST)
    TFAIL("mkdir %s: %s", path, strerror(errno));
}

static void make_link(const char *target, const char *path)
{
  if (symlink(target, path) != 0 && errno != EEXIST)
    TFAIL("symlink %s: %s", path, strerror(errno));
}

/* Where this test's directories go: under our runtime directory. */
static void test_base(char *base)
{
  const char *env = getenv("GPUIPC_DIR");
  if (env != NULL && env[0] == '/')
    snprintf(base, PATH_MAX, "%s", env);
  else
    snprintf(base, PATH_MAX, "/tmp/gpuipc-fork-test-%d", (int)getpid());
  make_dir(base, 0700);
}

/* Case 2 with the runtime directory spelt in other ways. */
static void spellings(void)
{
  char base[PATH_MAX], p[PATH_MAX], q[PATH_MAX];
  test_base(base);
  path_in(p, base, "./dot");
  host_forks_and_dies("fk5", p, NULL);
  path_in(p, base, "/double");
  host_forks_and_dies("fk6", p, NULL);
  path_in(p, base, "real");
  make_dir(p, 0755);
  path_in(q, base, "link");
  make_link(p, q);
  path_in(p, base, "link/linked");
  host_forks_and_dies("fk7", p, NULL);
  path_in(p, base, "xdg");
  make_dir(p, 0700);
  strcat(p, "/");
  host_forks_and_dies("fk8", "", p);
}

/*
 * A member and its broker name one directory in two ways (through a
 * symbolic link and not): the member forks and dies, and the broker sees
 * it leave (the child closed its connection although the broker's socket
 * is not under the member's spelling).
 */
static void member_other_spelling(void)
{
  char base[PATH_MAX], real[PATH_MAX], linked[PATH_MAX], p[PATH_MAX];
  test_base(base);
  path_in(p, base, "real2");
  make_dir(p, 0755);
  path_in(real, p, "d");
  path_in(p, base, "link2");
  make_link("real2", p);
  path_in(linked, p, "d");
  struct peer broker, m;
  peer_start(&broker);
  peer_start(&m);
  peer_env(&broker, real, NULL);
  peer_env(&m, linked, NULL);
  PEER_OK(&broker, "join fk9");
  PEER_OK(&broker, "open held 4096 c");
  PEER_OK(&m, "join fk9");
  PEER_OK(&m, "open held 0 -");
  pid_t child = peer_fork(&m);
  peer_kill(&m);
  struct peer_info i = {0};
  for (int tries = 0; tries < 3000; tries++) {
    peer_info(&broker, &i);
    if (i.members == 1)
      break;
    usleep(10000);
  }
  ASSERT_EQ(i.members, 1);
  ASSERT_EQ(kill(child, 0), 0); /* the child lives on */
  int nholders;
  const char *r = peer_cmd(&broker, "stat held");
  if (sscanf(r, "ok %*s %d", &nholders) != 1)
    TFAIL("stat held: %s", r);
  ASSERT_EQ(nholders, 1); /* the broker's own; the member's went */
  kill(child, SIGKILL);
  PEER_OK(&broker, "leave");
  peer_finish(&broker);
}

int main(void)
{
  /* 0. The segment table's lock comes first at fork(). */
  seg_lock_first();
  /* 1. A member forks and dies. */
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join("fk", NULL, &dom));
  struct peer m;
  peer_start(&m);
  PEER_OK(&m, "join fk");
  PEER_OK(&m, "open held 4096 c");
  pid_t child = peer_fork(&m);
  peer_kill(&m);
  domain_wait_members(dom, 1);
  ASSERT_EQ(kill(child, 0), 0); /* the child lives on */
  gpuipc_segment_info_t s = {.size = sizeof(s)};
  ASSERT_OK(gpuipc_segment_stat(dom, "held", &s));
  ASSERT_EQ(s.nholders, 0);
  kill(child, SIGKILL);
  ASSERT_OK(gpuipc_segment_unlink(dom, "held"));
  ASSERT_OK(gpuipc_domain_leave(dom));

  /* 2. The broker's host forks and dies. */
  host_forks_and_dies("fk2", NULL, NULL);
  spellings();
  member_other_spelling();

  /* 3. A member's child joins anew and lets an inherited buffer go. */
  member_child();
  /* 4. fork() while another thread is busy with segments. */
  fork_while_busy();
  printf("domain_fork: ok\n");
  return 0;
}
