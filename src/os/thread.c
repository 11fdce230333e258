/* Threads of the library. */
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
