/*
 * What a failed assertion of tests/test.h prints: both sides, and
 * gpuipc_last_error() only when the assertion was about a gpuipc call
 * (ASSERT_OK, ASSERT_RC, ASSERT_ERR_MENTIONS, TFAIL_GPUIPC). After a
 * failed call has left a sentence behind, a failed ASSERT_EQ or
 * ASSERT_TRUE must not print it: it would blame that unrelated call.
 *
 * The test runs itself (/proc/self/exe CASE) once per case and reads what
 * the child wrote to stderr.
 */
#include "test.h"

#include <sys/wait.h>
#include <unistd.h>

/* A call that fails at once and leaves a sentence behind. */
static int failing_call(void)
{
  gpuipc_domain_t *dom;
  return gpuipc_domain_join(NULL, NULL, &dom);
}

static void run_case(const char *which)
{
  int bad = failing_call();
  if (strcmp(which, "eq") == 0)
    ASSERT_EQ(bad == 0 ? 1 : 2, 3);
  if (strcmp(which, "true") == 0)
    ASSERT_TRUE(bad == 0);
  if (strcmp(which, "ok") == 0)
    ASSERT_OK(failing_call());
  exit(0);
}

/* Run case @which; its exit status, and its stderr in @err. */
static int child(const char *which, char *err, size_t cap)
{
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(p[1], 2);
    execl("/proc/self/exe", "asserts", which, (char *)NULL);
    _exit(127);
  }
  close(p[1]);
  size_t n = 0;
  ssize_t k;
  while (n + 1 < cap && (k = read(p[0], err + n, cap - 1 - n)) > 0)
    n += (size_t)k;
  err[n] = '\0';
  close(p[0]);
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void expect(const char *which, const char *says, const char *sentence,
                   int with_sentence)
{
  char err[4096];
  ASSERT_EQ(child(which, err, sizeof(err)), 1);
  printf("--- %s:\n%s", which, err);
  if (strstr(err, says) == NULL)
    TFAIL("case %s does not print \"%s\"", which, says);
  if ((strstr(err, sentence) != NULL) != with_sentence)
    TFAIL("case %s %s the unrelated last error \"%s\"", which,
          with_sentence ? "does not print" : "prints", sentence);
}

int main(int argc, char **argv)
{
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc == 2)
    run_case(argv[1]);
  ASSERT_TRUE(failing_call() < 0);
  char sentence[512];
  snprintf(sentence, sizeof(sentence), "%s", gpuipc_last_error());
  ASSERT_GT(strlen(sentence), 0);
  expect("eq", "bad == 0 ? 1 : 2 == 3: 2 vs 3", sentence, 0);
  expect("true", "expected true: bad == 0", sentence, 0);
  expect("ok", "failing_call() returned", sentence, 1);
  return 0;
}
