/*
 * The next round's table, opened ahead (gpuipc_share_opts_t.next_round).
 * Opening a round's table is a request to the broker, a mapping and its
 * registration with CUDA: 0.9--2.4 ms measured, on the path of every
 * sync, and letting go of it 0.25--0.5 ms more. A caller that knows the
 * name of its next round (a state dict's next version) names it; after
 * the call a thread of the library lets go of that call's table, then
 * opens (or creates) the next round's for the same layout and device, as
 * the call itself would have; before that it unlinks the call's table
 * when the call closed its round, and sweeps when the call created it
 * (sweep.c): each a request to the broker that the last member out made
 * before it returned, and that held up the sync (0.1--0.3 ms measured).
 * The next call under that name takes it,
 * waiting for the thread if it is still at work; a call under another
 * name leaves it, and it is let go once unused for GPUIPC__SHARE_KEEP_CALLS
 * calls of the process (cache.c's tick), and at gpuipc_domain_leave.
 *
 * What the thread opened is the table any member of that round opens (the
 * same name, checked the same way): nothing else of the protocol changes.
 * A table opened ahead for a round that then never comes stays named
 * while this process holds it; once let go, with no member in it, it is
 * swept (sweep.c).
 *
 * A child made by fork() has no such thread: it forgets the entries (the
 * parent's handles are the parent's).
 */
#include "share/share.h"
#include "os/os.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ahead {
  struct ahead *next;
  gpuipc_domain_t *dom;
  char round[GPUIPC_NAME_MAX + 1];
  struct share_layout l; /* its counts and digest only: no pieces */
  int device;
  int timeout_ms;
  gpuipc_buf_t *retire; /* the finished call's table: let go first */
  char done[GPUIPC_NAME_MAX + 1];   /* its round (gpuipc__share_round_end) */
  bool closed, sweep;
  pthread_t th;
  uint64_t born; /* the call count when started */
  /* What the thread made (read once it is joined). */
  int rc;
  struct share_table t;
  uint64_t words;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct ahead *list;

static void *ahead_main(void *arg)
{
  struct ahead *a = arg;
  if (a->retire != NULL)
    gpuipc__share_round_end(a->dom, a->done, a->retire, a->closed, false,
                            a->sweep);
  a->retire = NULL;
  a->rc = gpuipc__share_table_open(a->dom, a->round, &a->l, a->device,
                                   a->timeout_ms, &a->t, &a->words);
  return NULL;
}

/* Let go of what @a's thread (joined) opened; free @a. */
static void ahead_free(struct ahead *a)
{
  if (a->rc == 0)
    gpuipc_buf_release(a->t.buf);
  free(a);
}

/* Join the threads of the entries of list @a and free them. */
static void drop_list(struct ahead *a)
{
  for (struct ahead *n; a != NULL; a = n) {
    n = a->next;
    pthread_join(a->th, NULL);
    ahead_free(a);
  }
}

bool gpuipc__share_ahead_start(gpuipc_domain_t *dom, const char *next,
                               const struct share_layout *l, int device,
                               int timeout_ms, gpuipc_buf_t *retire,
                               const char *round, bool closed, bool sweep,
                               uint64_t now)
{
  struct ahead *a = calloc(1, sizeof(*a));
  if (a == NULL)
    return false;
  a->dom = dom;
  if (retire != NULL)
    snprintf(a->done, sizeof(a->done), "%s", round);
  a->closed = closed;
  a->sweep = sweep;
  snprintf(a->round, sizeof(a->round), "%s", next);
  a->l = (struct share_layout){.n = l->n, .chunk_bytes = l->chunk_bytes,
                               .nchunks = l->nchunks, .digest = l->digest};
  a->device = device;
  a->timeout_ms = timeout_ms;
  a->retire = retire;
  a->born = now;
  pthread_mutex_lock(&mu);
  bool dup = false;
  for (struct ahead *x = list; x != NULL && !dup; x = x->next)
    dup = x->dom == dom && strcmp(x->round, next) == 0;
  bool ok = !dup && gpuipc__thread_start(&a->th, false, ahead_main, a) == 0;
  if (ok) {
    a->next = list;
    list = a;
  }
  pthread_mutex_unlock(&mu);
  if (!ok)
    free(a); /* the caller lets go of @retire */
  return ok;
}

int gpuipc__share_ahead_take(gpuipc_domain_t *dom, const char *round,
                             const struct share_layout *l, int device,
                             struct share_table *t, uint64_t *words)
{
  struct ahead *a = NULL;
  pthread_mutex_lock(&mu);
  for (struct ahead **pp = &list; *pp != NULL; pp = &(*pp)->next)
    if ((*pp)->dom == dom && strcmp((*pp)->round, round) == 0) {
      a = *pp;
      *pp = a->next;
      break;
    }
  pthread_mutex_unlock(&mu);
  if (a == NULL)
    return -ENOENT;
  pthread_join(a->th, NULL);
  /* Opened for another layout or device than this call's: not its. */
  bool fits = a->rc == 0 && a->device == device && a->l.n == l->n &&
              a->l.chunk_bytes == l->chunk_bytes &&
              a->l.nchunks == l->nchunks && a->l.digest == l->digest;
  if (!fits) {
    ahead_free(a);
    return -ENOENT;
  }
  *t = a->t;
  *words = a->words;
  free(a);
  return 0;
}

/* Take off the list the entries of @dom: @all, or those not taken within
 * GPUIPC__SHARE_KEEP_CALLS calls of @now. */
static struct ahead *take_off(gpuipc_domain_t *dom, uint64_t now, bool all)
{
  struct ahead *out = NULL;
  pthread_mutex_lock(&mu);
  for (struct ahead **pp = &list; *pp != NULL;) {
    struct ahead *a = *pp;
    if (a->dom == dom && (all || now - a->born > GPUIPC__SHARE_KEEP_CALLS)) {
      *pp = a->next;
      a->next = out;
      out = a;
    } else {
      pp = &a->next;
    }
  }
  pthread_mutex_unlock(&mu);
  return out;
}

void gpuipc__share_ahead_tick(gpuipc_domain_t *dom, uint64_t now)
{
  drop_list(take_off(dom, now, false));
}

void gpuipc__share_ahead_leave(gpuipc_domain_t *dom)
{
  drop_list(take_off(dom, 0, true));
}

void gpuipc__share_ahead_fork(int phase)
{
  if (phase == 0) {
    pthread_mutex_lock(&mu);
    return;
  }
  if (phase == 2)
    list = NULL; /* the child: no thread, and the handles are the parent's */
  pthread_mutex_unlock(&mu);
}

int gpuipc__share_ahead_count(gpuipc_domain_t *dom)
{
  int n = 0;
  pthread_mutex_lock(&mu);
  for (struct ahead *a = list; a != NULL; a = a->next)
    n += a->dom == dom;
  pthread_mutex_unlock(&mu);
  return n;
}
