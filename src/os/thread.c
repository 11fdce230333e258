/* Threads of the library, and the jobs they run on demand (os.h). */
#include "os/os.h"

#include <signal.h>

int gpuipc__thread_start(pthread_t *th, bool detached, void *(*fn)(void *),
                         void *arg)
{
  pthread_attr_t at;
  int err = pthread_attr_init(&at);
  if (err != 0)
    return err;
  if (detached)
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  /* Every signal blocked while it is made: the thread inherits the mask
   * and takes none meant for the caller's threads. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t t;
  err = pthread_create(th != NULL ? th : &t, &at, fn, arg);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  pthread_attr_destroy(&at);
  return err;
}

/* The job's state moves by compare-and-swap alone (os.h). */
static bool job_cas(struct gpuipc__job *j, int *from, int to)
{
  return __atomic_compare_exchange_n(&j->state, from, to, false,
                                     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

static void *job_main(void *arg)
{
  struct gpuipc__job *j = arg;
  do {
    __atomic_store_n(&j->state, 1, __ATOMIC_SEQ_CST);
    j->run();
  } while (!job_cas(j, &(int){1}, 0));
  return NULL;
}

int gpuipc__job_ask(struct gpuipc__job *j)
{
  int s = __atomic_load_n(&j->state, __ATOMIC_ACQUIRE);
  for (;;) {
    if (s == 2 || (s == 1 && job_cas(j, &s, 2)))
      return 0;
    if (s == 0 && job_cas(j, &s, 1))
      break;
  }
  int err = gpuipc__thread_start(NULL, true, job_main, j);
  if (err != 0)
    __atomic_store_n(&j->state, 0, __ATOMIC_RELEASE);
  return err;
}

void gpuipc__job_forget(struct gpuipc__job *j)
{
  __atomic_store_n(&j->state, 0, __ATOMIC_RELEASE);
}

bool gpuipc__job_busy(struct gpuipc__job *j)
{
  return __atomic_load_n(&j->state, __ATOMIC_ACQUIRE) != 0;
}
