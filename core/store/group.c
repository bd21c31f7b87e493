/*
 * group.c: the core store's transactions (internal.h es_core_write,
 * es_core_read, es_core_outside_txn) and the threaded group-commit
 * scheduler behind es_core_write. Moved out of store.c as it was.
 */
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "store/backend.h"
#include "store/internal.h"
#include "store/store.h"

#define GROUP_MAX 1024        /* callers per group commit at most */

/* Group commit (backends with group_commit = 1; docs/store.md
 * "Transactions, threads and group commit").
 *
 * A writer queues its work (fn, arg) and sleeps on its own semaphore. The
 * first writer to find nobody leading becomes the group's leader: it takes
 * wmu, begins the transaction and runs every queued caller's fn, each in
 * its own savepoint, in one pass on its own thread; then it takes the
 * callers who queued meanwhile, and so on until nobody is left; then it
 * commits once (one sync), hands the lead to the first caller queued
 * during the commit, and wakes each member with its own result.
 *
 * Why the leader runs the others' work: a group used to hand wmu from
 * caller to caller (a context switch per member to get the lock, another
 * to go back to sleep, and a broadcast that woke every member to fight for
 * wmu again); on a two-core machine those switches cost more than the
 * rows. Now a member sleeps once and is woken once, by the leader, after
 * the sync of the commit that holds its rows.
 *
 * Why the leader may wait: right after a commit the last group's members
 * are only waking up. The first to come back would lead a group of one
 * and commit it alone while the others queue behind it (groups of 1, 15,
 * 1, 15... with 16 writers: half the commits wasted). So when the queue
 * is empty before the group is as large as the last one, the leader waits
 * for the missing callers, at most one commit's time (what committing
 * without them would cost them anyway), and learns the new size from the
 * group it commits: writers that stopped writing cost one such wait.
 *
 * A store with an id source (es_open_opts.ids) promises to call it on the
 * calling thread (store.h), and the source is called inside fn: there the
 * leader hands the transaction to each member's thread in turn (the
 * member runs its fn and posts the leader back), which costs the context
 * switches again, for stores whose ids are made by the application.
 *
 * A member whose fn fails has its savepoint rolled back and gets its own
 * error; the others are not touched. A failed begin fails the callers
 * taken for that transaction (they ran nothing); a failed commit fails
 * every member whose fn succeeded.
 *
 * Shared savepoints and reads ahead (es_core_write_hinted). On
 * PostgreSQL every savepoint's release is a round trip (the member's
 * statements must all be answered before it counts as done), and so is
 * every member's first read, its session row: a group of 16 appends cost
 * 33 round trips under the store's lock. So a member may say what it
 * will read and that it may share a savepoint (es_write_hint):
 *   - before running the callers it took, the leader hands the backend
 *     their sessions and ids (read_ahead: one round trip for all);
 *   - consecutive members that may share run in one savepoint, released
 *     once. Sharing is safe because such a member writes nothing until
 *     every check that can refuse it has passed: an error other than
 *     STORAGE is its own answer and left nothing to undo. A STORAGE
 *     error ends the run: its savepoint is rolled back, the members run
 *     in it before get STORAGE (their work is gone, as with a failed
 *     commit: a retry is safe), and the members after it run in a new
 *     savepoint. */
/* A member's turn to run its own fn (a store with an id source). */
typedef struct group_turn {
  int alone;        /* group_run's argument */
  int *committed;
  sem_t back;       /* posted by the member when its fn ran */
} group_turn;

struct group_waiter {
  txn_fn fn;        /* the caller's work, run by the leader */
  void *arg;
  const es_write_hint *hint; /* or NULL */
  int rc;           /* set by the leader before it posts wake */
  es_err err;
  int lead;         /* woken to lead the next group, not done */
  group_turn *turn; /* woken to run fn on its own thread, not done */
  sem_t wake;
  struct group_waiter *next;
};

#define GROUP_WAIT_MAX_NS 10000000 /* a leader waits at most 10 ms for late members */

void es_core_group_init(es_store *s) {
  pthread_condattr_t ca;
  pthread_mutex_init(&s->qmu, NULL);
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->qcond, &ca);
  pthread_condattr_destroy(&ca);
  s->queue = NULL;
  s->queue_tail = &s->queue;
}

static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Takes up to max callers off the queue (qmu held); returns them linked. */
static group_waiter *group_take(es_store *s, int max) {
  group_waiter *first = s->queue, *last = NULL;
  int n = 0;
  for (group_waiter *w = first; w && n < max; w = w->next) {
    last = w;
    n++;
  }
  if (!last) return NULL;
  s->queue = last->next;
  if (!s->queue) s->queue_tail = &s->queue;
  s->queued -= n;
  s->taken += n;
  last->next = NULL;
  return first;
}

/* With the queue empty and the group smaller than the last one: waits
 * (qmu held) until enough callers queued or *deadline (set at the first
 * wait of the group) passed. */
static void group_wait_late(es_store *s, int n, int64_t *deadline) {
  if (*deadline == 0) {
    int64_t budget = s->commit_ns < GROUP_WAIT_MAX_NS ? s->commit_ns : GROUP_WAIT_MAX_NS;
    *deadline = mono_ns() + budget;
  }
  struct timespec ts = {(time_t)(*deadline / 1000000000), (long)(*deadline % 1000000000)};
  s->want = s->last_group - n;
  while (s->queued < s->want) {
    if (pthread_cond_timedwait(&s->qcond, &s->qmu, &ts) != 0 && mono_ns() >= *deadline) break;
  }
  s->want = 0;
}

static int shares(const group_waiter *m) { return m->hint && m->hint->shared; }

/* Runs the members from first up to end (exclusive) in one savepoint of
 * the group transaction: a range of one, or of members that may share
 * (shares). Stops after a member whose error forbids going on in the
 * savepoint (STORAGE, or any error of a member that does not share);
 * *rest: the first member not run (end when all ran). Returns how many
 * succeeded and were kept. *committed is set when the range is the whole
 * transaction and took the backend's release_commit (release and commit
 * in one step): the transaction is then over. */
static int group_run(es_store *s, group_waiter *first, group_waiter *end, int alone,
                     int *committed, group_waiter **rest) {
  es_txn *t = s->wtxn;
  es_err err = {0};
  group_waiter *w = first, *broke = NULL;
  int ok = 0, rc = s->ops->savepoint(s->bk, t, &err);
  if (rc != ES_OK) {
    for (; w != end; w = w->next) w->rc = rc, w->err = err;
    *rest = end;
    return 0;
  }
  while (w != end && !broke) {
    group_waiter *m = w;
    w = w->next;
    m->rc = m->fn(s, t, m->arg, &m->err);
    if (m->rc == ES_OK) ok++;
    else if (m->rc == ES_STORAGE || !shares(m)) broke = m;
  }
  *rest = w;
  if (!broke && ok > 0) {
    if (alone && w == end && s->ops->release_commit) {
      pthread_mutex_lock(&s->qmu);
      alone = s->queued == 0;
      pthread_mutex_unlock(&s->qmu);
    } else {
      alone = 0;
    }
    if (alone) {
      /* Alone in the transaction, nobody queued to join: release and
       * commit in one step (one round trip on PostgreSQL). The
       * transaction holds this range's work only, so a failure is its
       * members' alone, as a failed release would be. */
      *committed = 1;
      s->wtxn = NULL;
      rc = s->ops->release_commit(s->bk, t, &err);
    } else {
      rc = s->ops->savepoint_release(s->bk, t, &err);
      if (rc != ES_OK) s->ops->savepoint_rollback(s->bk, t);
    }
    if (rc == ES_OK) return ok;
  } else {
    s->ops->savepoint_rollback(s->bk, t);
    if (broke) err = broke->err;
  }
  /* what succeeded in the savepoint is gone with it */
  for (group_waiter *m = first; m != w; m = m->next) {
    if (m->rc != ES_OK) continue;
    m->rc = ES_STORAGE;
    if (!broke) m->err = err; /* the release's (or release_commit's) error */
    else
      es_fail(&m->err, ES_STORAGE, "rolled back with a write it shared a savepoint with: %s",
              err.msg);
  }
  return 0;
}

/* Hands the backend what the members of batch will read (read_ahead):
 * their sessions' rows (index 0: no event) and the ids they look up;
 * nothing for a batch of one, whose own reads cost the same round trip. */
static int group_read_ahead(es_store *s, group_waiter *batch, es_err *err) {
  if (!s->ops->read_ahead) return ES_OK;
  size_t n = 0, n_ids = 0;
  for (group_waiter *m = batch; m; m = m->next) {
    if (!m->hint || !m->hint->session) continue;
    n++;
    for (size_t i = 0; i < m->hint->n; i++) n_ids += m->hint->evs[i].id != NULL;
  }
  if (n < 2) return ES_OK; /* one member reads as fast itself */
  const char **sessions = malloc(n * sizeof *sessions);
  const char **ids = n_ids ? malloc(n_ids * sizeof *ids) : NULL;
  int64_t *indexes = calloc(n, sizeof *indexes);
  int rc = ES_OK;
  if (sessions && indexes && (ids || !n_ids)) { /* else no hint: each reads for itself */
    size_t k = 0, j = 0;
    for (group_waiter *m = batch; m; m = m->next) {
      if (!m->hint || !m->hint->session) continue;
      sessions[k++] = m->hint->session;
      for (size_t i = 0; i < m->hint->n; i++)
        if (m->hint->evs[i].id) ids[j++] = m->hint->evs[i].id;
    }
    rc = s->ops->read_ahead(s->bk, s->wtxn, sessions, indexes, n, ids, n_ids, err);
  }
  free(sessions);
  free(ids);
  free(indexes);
  return rc;
}

/* The leader's part: runs and commits one group, then passes the lead on
 * and wakes the members (me, the leader's own entry, is not posted). */
static void group_lead(es_store *s, group_waiter *me) {
  group_waiter *group = NULL, **tail = &group;
  int n = 0, n_ok = 0, committed = 0;
  int64_t deadline = 0;
  es_err berr = {0};
  pthread_mutex_lock(&s->wmu);
  int brc = s->ops->write_begin(s->bk, &s->wtxn, &berr);
  for (;;) {
    pthread_mutex_lock(&s->qmu);
    if (!s->queue && brc == ES_OK && !committed && n_ok > 0 && n < s->last_group)
      group_wait_late(s, n, &deadline);
    group_waiter *batch = group_take(s, GROUP_MAX - n);
    pthread_mutex_unlock(&s->qmu);
    if (!batch) break;
    es_err aerr = {0};
    int arc = brc == ES_OK && !committed ? group_read_ahead(s, batch, &aerr) : ES_OK;
    for (group_waiter *m = batch, *rest; m; m = rest) {
      rest = m->next;
      if (brc != ES_OK || arc != ES_OK) {
        n++;
        m->rc = brc != ES_OK ? brc : arc;
        m->err = brc != ES_OK ? berr : aerr;
        continue;
      }
      if (committed) {
        /* cannot happen: release_commit is taken with nobody queued, and
         * only this leader takes callers off the queue */
        n++;
        m->rc = es_fail(&m->err, ES_STORAGE, "group commit: transaction already committed");
        continue;
      }
      /* one savepoint for m, and the members right after it if all share */
      group_waiter *end = m->next;
      int k = 1;
      if (!s->ids && shares(m))
        for (; end && shares(end); end = end->next) k++;
      int alone = n == 0 && !end && k >= s->last_group;
      if (m == me || !s->ids) {
        n_ok += group_run(s, m, end, alone, &committed, &rest);
      } else {
        group_turn turn = {alone, &committed, {{0}}};
        sem_init(&turn.back, 0, 0);
        m->turn = &turn;
        sem_post(&m->wake);
        while (sem_wait(&turn.back) != 0) {
        }
        sem_destroy(&turn.back);
        n_ok += m->rc == ES_OK;
      }
      for (group_waiter *r = m; r != rest; r = r->next) n++;
    }
    *tail = batch;
    while (*tail) tail = &(*tail)->next;
    if (brc != ES_OK || arc != ES_OK || committed || n >= GROUP_MAX) break;
  }
  int64_t commit_ns = 0;
  if (brc == ES_OK && !committed) {
    es_err cerr = {0};
    int crc = ES_OK;
    if (n_ok > 0) {
      int64_t t0 = mono_ns();
      crc = s->ops->write_commit(s->bk, s->wtxn, &cerr);
      commit_ns = mono_ns() - t0;
    } else {
      s->ops->write_rollback(s->bk, s->wtxn);
    }
    s->wtxn = NULL;
    for (group_waiter *m = group; m; m = m->next) {
      if (m->rc == ES_OK && crc != ES_OK) {
        m->rc = crc;
        m->err = cerr;
      }
    }
    committed = n_ok > 0 && crc == ES_OK;
  } else if (committed) {
    committed = n_ok > 0; /* release_commit: its range held the whole group */
  }
  /* still under wmu: what this transaction touched is its own */
  if (committed) es_core_notify_commit(s, 1);
  else es_core_touch_clear(s);
  pthread_mutex_unlock(&s->wmu);
  pthread_mutex_lock(&s->qmu);
  s->taken = 0;
  if (brc == ES_OK) {
    s->last_group = n;
    if (commit_ns > 0) s->commit_ns = commit_ns;
  }
  if (s->queue) {
    s->queue->lead = 1;
    sem_post(&s->queue->wake);
  } else {
    s->leading = 0;
  }
  pthread_mutex_unlock(&s->qmu);
  /* A member returns as soon as it is posted (its entry is on its stack):
   * read next first, touch nothing after. */
  for (group_waiter *m = group, *next; m; m = next) {
    next = m->next;
    if (m != me) sem_post(&m->wake);
  }
}

static int run_write_group(es_store *s, txn_fn fn, void *arg, const es_write_hint *hint,
                           es_err *err) {
  group_waiter me;
  memset(&me, 0, sizeof me);
  me.fn = fn;
  me.arg = arg;
  me.hint = hint;
  sem_init(&me.wake, 0, 0);
  pthread_mutex_lock(&s->qmu);
  *s->queue_tail = &me;
  s->queue_tail = &me.next;
  s->queued++;
  int lead = !s->leading;
  if (lead) s->leading = 1;
  if (s->want > 0 && s->queued >= s->want) pthread_cond_signal(&s->qcond);
  pthread_mutex_unlock(&s->qmu);
  for (;;) {
    if (lead) {
      /* me is run by this group (it is queued, and nobody else takes
       * callers off the queue while this thread leads) */
      group_lead(s, &me);
      break;
    }
    while (sem_wait(&me.wake) != 0) {
    }
    if (me.turn) {
      group_turn *turn = me.turn;
      me.turn = NULL;
      group_waiter *rest;
      group_run(s, &me, me.next, turn->alone, turn->committed, &rest); /* sets me.rc */
      sem_post(&turn->back); /* the leader reads me.rc; turn is on its stack */
      continue;
    }
    if (!me.lead) break;
    me.lead = 0;
    lead = 1;
  }
  sem_destroy(&me.wake);
  if (me.rc != ES_OK && err) *err = me.err;
  return me.rc;
}

int es_core_write(es_store *s, txn_fn fn, void *arg, es_err *err) {
  return es_core_write_hinted(s, fn, arg, NULL, err);
}

int es_core_write_hinted(es_store *s, txn_fn fn, void *arg, const es_write_hint *hint, es_err *err) {
  if (s->ops->group_commit) return run_write_group(s, fn, arg, hint, err);
  es_txn *t = NULL;
  pthread_mutex_lock(&s->wmu);
  int rc = s->ops->write_begin(s->bk, &t, err);
  if (rc == ES_OK) {
    rc = fn(s, t, arg, err);
    if (rc == ES_OK) {
      rc = s->ops->write_commit(s->bk, t, err);
    } else {
      s->ops->write_rollback(s->bk, t);
    }
  }
  /* still under wmu: what this transaction touched is its own */
  if (rc == ES_OK) es_core_notify_commit(s, 1);
  else es_core_touch_clear(s);
  pthread_mutex_unlock(&s->wmu);
  return rc;
}

int es_core_read(es_store *s, txn_fn fn, void *arg, es_err *err) {
  es_txn *t = NULL;
  int rc = s->ops->read_begin(s->bk, &t, err);
  if (rc != ES_OK) return rc;
  rc = fn(s, t, arg, err);
  s->ops->read_end(s->bk, t);
  return rc;
}

int es_core_outside_txn(es_store *s, int (*fn)(es_store *s, void *arg, es_err *err), void *arg,
                        es_err *err) {
  /* A group transaction is open only while its leader holds wmu. */
  pthread_mutex_lock(&s->wmu);
  int rc = fn(s, arg, err);
  pthread_mutex_unlock(&s->wmu);
  return rc;
}
