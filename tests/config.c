/*
 * Settings: a value that does not parse is not used and makes the calls
 * that depend on it fail with a sentence naming it; an unknown GPUIPC_*
 * name is warned about through the log callback. The environment is read
 * once per process, so each case runs in a fresh copy of this program
 * (fork+exec) under its own environment.
 */
#include "test.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static char logged[8192];

static void capture(gpuipc_log_level_t level, const char *msg, void *user)
{
  size_t len = strlen(logged);
  snprintf(logged + len, sizeof(logged) - len, "%s\n", msg);
}

static gpuipc_config_item_t item(const char *name)
{
  gpuipc_config_item_t it;
  for (int i = 0; i < gpuipc_config_count(); i++) {
    ASSERT_OK(gpuipc_config_get(i, &it));
    if (strcmp(it.name, name) == 0)
      return it;
  }
  TFAIL("no setting %s", name);
}

/* gpuipc_config_rejected and gpuipc_config_unknown say what the log said:
 * @rejected (NAME or NULL) with value @bad, the one @unknown (or NULL). */
static void expect_problems(const char *rejected, const char *bad,
                            const char *unknown)
{
  for (int i = 0; i < gpuipc_config_count(); i++) {
    gpuipc_config_item_t it;
    ASSERT_OK(gpuipc_config_get(i, &it));
    const char *value = "untouched", *why = "untouched";
    bool is_bad = rejected != NULL && strcmp(it.name, rejected) == 0;
    ASSERT_RC(gpuipc_config_rejected(i, &value, &why), is_bad ? 1 : 0);
    ASSERT_STREQ(value, is_bad ? bad : "untouched");
    if (is_bad && strlen(why) == 0)
      TFAIL("%s rejected without a reason", it.name);
  }
  ASSERT_RC(gpuipc_config_rejected(-1, NULL, NULL), -ERANGE);
  ASSERT_RC(gpuipc_config_rejected(gpuipc_config_count(), NULL, NULL),
            -ERANGE);
  const char *name = "untouched";
  ASSERT_RC(gpuipc_config_unknown(0, &name), unknown != NULL ? 0 : -ERANGE);
  ASSERT_STREQ(name, unknown != NULL ? unknown : "untouched");
  ASSERT_RC(gpuipc_config_unknown(1, &name), -ERANGE);
  ASSERT_RC(gpuipc_config_unknown(-1, &name), -ERANGE);
  ASSERT_RC(gpuipc_config_unknown(0, NULL), -EINVAL);
}

#define ASSERT_LOGGED(needle)                                                  \
  do {                                                                         \
    if (strstr(logged, (needle)) == NULL)                                      \
      TFAIL("the log does not mention '%s'; it says:\n%s", (needle), logged);  \
  } while (0)

/* GPUIPC_TIMEOUT_MS=abc and a misspelt GPUIPC_TIMEOUT_MSS. */
static void case_timeout(void)
{
  gpuipc_config_item_t it = item("GPUIPC_TIMEOUT_MS");
  ASSERT_STREQ(it.value, "10000"); /* in force: the default, not "abc" */
  ASSERT_EQ(it.is_set, 1);
  ASSERT_LOGGED("GPUIPC_TIMEOUT_MS=\"abc\"");
  ASSERT_LOGGED("GPUIPC_TIMEOUT_MSS");
  expect_problems("GPUIPC_TIMEOUT_MS", "abc", "GPUIPC_TIMEOUT_MSS");

  gpuipc_domain_t *d = NULL;
  ASSERT_RC(gpuipc_domain_join("cfg", NULL, &d), -EINVAL);
  ASSERT_ERR_MENTIONS("GPUIPC_TIMEOUT_MS=\"abc\"");
  ASSERT_PTR_EQ(d, NULL);
}

/* A broker allow list with garbage in it: refused, never half-read. */
static void case_uids(void)
{
  ASSERT_STREQ(item("GPUIPC_ALLOW_UIDS").value, "");
  ASSERT_LOGGED("GPUIPC_ALLOW_UIDS=\"1000;x\"");
  expect_problems("GPUIPC_ALLOW_UIDS", "1000;x", NULL);
  gpuipc_domain_t *d = NULL;
  ASSERT_RC(gpuipc_domain_join("cfg", NULL, &d), -EINVAL);
  ASSERT_ERR_MENTIONS("GPUIPC_ALLOW_UIDS=\"1000;x\"");
}

/* Member limits that do not parse: not in force as "no limit" or as a
 * number read from the front of the text, and the join fails naming them
 * (a joiner may host the broker, which lives by them). */
static void case_members(void)
{
  ASSERT_STREQ(item("GPUIPC_MAX_MEMBERS").value, "0");
  ASSERT_STREQ(item("GPUIPC_MAX_MEMBERS_PER_UID").value, "0");
  ASSERT_LOGGED("GPUIPC_MAX_MEMBERS=\"lots\"");
  ASSERT_LOGGED("GPUIPC_MAX_MEMBERS_PER_UID=\"8x\"");
  const char *value = NULL, *why = NULL;
  for (int i = 0; i < gpuipc_config_count(); i++) {
    gpuipc_config_item_t it;
    ASSERT_OK(gpuipc_config_get(i, &it));
    if (strcmp(it.name, "GPUIPC_MAX_MEMBERS_PER_UID") == 0) {
      ASSERT_RC(gpuipc_config_rejected(i, &value, &why), 1);
      ASSERT_STREQ(value, "8x");
    }
  }
  gpuipc_domain_t *d = NULL;
  ASSERT_RC(gpuipc_domain_join("cfg", NULL, &d), -EINVAL);
  ASSERT_ERR_MENTIONS("GPUIPC_MAX_MEMBERS");
  ASSERT_PTR_EQ(d, NULL);
}

/* One limit that does not parse is enough to refuse the join. */
static void case_members_one(void)
{
  expect_problems("GPUIPC_MAX_MEMBERS", "lots", NULL);
  gpuipc_domain_t *d = NULL;
  ASSERT_RC(gpuipc_domain_join("cfg", NULL, &d), -EINVAL);
  ASSERT_ERR_MENTIONS("GPUIPC_MAX_MEMBERS=\"lots\"");
}

/* GPUIPC_NO_CUDA=yes: no driver is loaded, and the reason names it. */
static void case_nocuda(void)
{
  ASSERT_RC(gpuipc_driver_status(NULL), GPUIPC_E_NODRIVER);
  ASSERT_ERR_MENTIONS("GPUIPC_NO_CUDA=\"yes\"");
  ASSERT_EQ(gpuipc_kind_available(GPUIPC_KIND_HOST), 0);
}

/* A misspelt log level is in force as warn (so that problems show). */
static void case_log(void)
{
  ASSERT_STREQ(item("GPUIPC_LOG").value, "warn");
  ASSERT_LOGGED("GPUIPC_LOG=\"verbose\"");
}

/* Well-formed values are used as they are, and nothing is warned about. */
static void case_good(void)
{
  ASSERT_STREQ(item("GPUIPC_TIMEOUT_MS").value, "1234");
  ASSERT_STREQ(item("GPUIPC_ALLOW_UIDS").value, "1000, 1001");
  ASSERT_STREQ(item("GPUIPC_CHAN_EVENT_POLL_US").value, "200"); /* empty */
  ASSERT_STREQ(item("GPUIPC_CHAN_SPIN_US").value, "2000"); /* unset */
  ASSERT_STREQ(item("GPUIPC_NO_CUDA").value, "1");
  if (logged[0] != '\0')
    TFAIL("warned about good settings:\n%s", logged);
  expect_problems(NULL, NULL, NULL);
  gpuipc_domain_t *d;
  ASSERT_OK(gpuipc_domain_join("cfg", NULL, &d));
  ASSERT_OK(gpuipc_domain_leave(d));
}

/* Well-formed limits are in force as they are. */
static void case_good_members(void)
{
  ASSERT_STREQ(item("GPUIPC_MAX_MEMBERS").value, "64");
  ASSERT_STREQ(item("GPUIPC_MAX_MEMBERS_PER_UID").value, "8");
  if (logged[0] != '\0')
    TFAIL("warned about good settings:\n%s", logged);
  gpuipc_domain_t *d;
  ASSERT_OK(gpuipc_domain_join("cfg", NULL, &d));
  ASSERT_OK(gpuipc_domain_leave(d));
}

static const struct {
  const char *name;
  void (*run)(void);
  const char *env[4];
} cases[] = {
    {"timeout", case_timeout, {"GPUIPC_TIMEOUT_MS=abc", "GPUIPC_TIMEOUT_MSS=5"}},
    {"uids", case_uids, {"GPUIPC_ALLOW_UIDS=1000;x"}},
    {"nocuda", case_nocuda, {"GPUIPC_NO_CUDA=yes"}},
    {"log", case_log, {"GPUIPC_LOG=verbose"}},
    {"members", case_members, {"GPUIPC_MAX_MEMBERS=lots",
                               "GPUIPC_MAX_MEMBERS_PER_UID=8x"}},
    {"members_one", case_members_one, {"GPUIPC_MAX_MEMBERS=lots"}},
    {"good", case_good, {"GPUIPC_TIMEOUT_MS=1234",
                         "GPUIPC_ALLOW_UIDS=1000, 1001",
                         "GPUIPC_CHAN_EVENT_POLL_US=", "GPUIPC_NO_CUDA=1"}},
    {"good_members", case_good_members, {"GPUIPC_MAX_MEMBERS=64",
                                         "GPUIPC_MAX_MEMBERS_PER_UID=8"}},
};
#define NCASES (sizeof(cases) / sizeof(cases[0]))

/* Run case @i in a fresh process: our environment without GPUIPC_* (but
 * GPUIPC_DIR), plus the case's. */
static void run_case(size_t i)
{
  const char *envp[256];
  int ne = 0;
  for (char **e = environ; *e != NULL && ne < 240; e++)
    if (strncmp(*e, "GPUIPC_", 7) != 0 || strncmp(*e, "GPUIPC_DIR=", 11) == 0)
      envp[ne++] = *e;
  for (int k = 0; k < 4 && cases[i].env[k] != NULL; k++)
    envp[ne++] = cases[i].env[k];
  envp[ne] = NULL;
  printf("case %s\n", cases[i].name);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT_TRUE(pid >= 0);
  if (pid == 0) {
    execve("/proc/self/exe",
           (char *const[]){"test_config", (char *)cases[i].name, NULL},
           (char *const *)envp);
    _exit(127);
  }
  ASSERT_EQ(test_wait(pid, 60000), 0);
}

int main(int argc, char **argv)
{
  if (argc == 2) {
    /* Before anything reads the settings, so their warnings land here. */
    ASSERT_OK(gpuipc_log_set(capture, GPUIPC_LOG_WARN, NULL));
    for (size_t i = 0; i < NCASES; i++)
      if (strcmp(argv[1], cases[i].name) == 0) {
        cases[i].run();
        return 0;
      }
    TFAIL("no case %s", argv[1]);
  }
  for (size_t i = 0; i < NCASES; i++)
    run_case(i);
  printf("settings: all cases passed\n");
  return 0;
}
