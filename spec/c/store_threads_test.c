/*
 * store_threads_test.c: one store handle shared by many threads (the
 * engine's workers do this), on memory: and sqlite:. Writers append to a
 * shared session and to their own; workers claim_next and complete at the
 * same time. Afterwards: indexes dense, positions unique and increasing,
 * every event completed exactly once with exactly one result, nothing lost.
 *
 * And group commit (docs/store.md "Transactions, threads and group commit";
 * docs/contract.md §2 "A failed call changes nothing"): three writers share one
 * SQLite write transaction, the middle one fails after it has inserted a
 * row (its id source returns an id already stored for its second event);
 * the other two must be committed, with one commit for the group, and the
 * failed one must have left nothing. On memory: the same calls, one
 * transaction each. That store has an id source, so each member runs its
 * own work on its own thread (store.h promises the source is called on
 * the calling thread); without one (run_shared) the group's leader runs
 * every member's work: the same checks there, with a member that fails
 * after its first rows went in (sealing under a shredded key), the
 * group held together by a second handle holding the file's (or the
 * PostgreSQL store's) write lock until all three are queued.
 * And many writers with failing calls among them (run_mixed): every
 * acknowledged batch stored whole, every failed one absent.
 *
 * sqlite: always; postgres: when ES_PG_URL is set (make test), each run
 * in a fresh schema.
 * TAP-style output; non-zero exit on failure.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "store/internal.h" /* run_shared: how many callers are queued */
#include "store/store.h"

#include "new_events.h"
#include "tap.h"

#define WRITERS 6
#define WORKERS 4
#define PER_WRITER 300

typedef struct {
  es_store *s;
  int id;
  atomic_int *writers_left;
  atomic_long *completed;
  atomic_int *errors;
} ctx;

static void *writer(void *arg) {
  ctx *c = arg;
  char own[32];
  snprintf(own, sizeof own, "own-%d", c->id);
  for (int i = 0; i < PER_WRITER; i++) {
    es_new_event e;
    es_new_event_init(&e);
    e.type = "job";
    e.payload = "{\"n\":1}";
    e.payload_len = 7;
    int pending;
    es_err err = {0};
    /* Alternate: the shared session (contended) and this writer's own. */
    if (es_store_append(c->s, i % 2 ? "shared" : own, &e, 1, ES_NONE, ES_NONE, NULL, &pending, &err)) {
      printf("# writer %d: append: %s\n", c->id, err.msg);
      atomic_fetch_add(c->errors, 1);
    }
  }
  atomic_fetch_sub(c->writers_left, 1);
  return NULL;
}

static void *worker(void *arg) {
  ctx *c = arg;
  char holder[32];
  snprintf(holder, sizeof holder, "worker-%d", c->id);
  for (;;) {
    es_events got;
    int64_t retry;
    es_err err = {0};
    if (es_store_claim_next(c->s, holder, 60000, 2, NULL, 0, NULL, 0, &got, &retry, &err)) {
      printf("# %s: claim_next: %s\n", holder, err.msg);
      atomic_fetch_add(c->errors, 1);
      return NULL;
    }
    if (got.n == 0) {
      es_events_destroy(&got);
      if (atomic_load(c->writers_left) == 0) {
        /* Writers are done: one more look, then stop. */
        if (es_store_claim_next(c->s, holder, 60000, 1, NULL, 0, NULL, 0, &got, &retry, &err) == ES_OK && got.n == 0) {
          es_events_destroy(&got);
          return NULL;
        }
      } else {
        usleep(200);
        continue;
      }
    }
    for (size_t i = 0; i < got.n; i++) {
      es_new_event r;
      es_new_event_init(&r);
      r.type = "done";
      r.settled = 1;
      es_events out;
      int outcome = 0;
      if (es_store_complete(c->s, got.v[i].session, got.v[i].index, got.v[i].attempts, &r, 1, ES_NONE,
                            &outcome, &out, &err) ||
          outcome != ES_COMPLETED) {
        printf("# %s: complete %s #%lld: %s (outcome %d)\n", holder, got.v[i].session,
               (long long)got.v[i].index, err.msg, outcome);
        atomic_fetch_add(c->errors, 1);
      }
      else
        atomic_fetch_add(c->completed, 1);
      es_events_destroy(&out);
    }
    es_events_destroy(&got);
  }
}

static void check_session(es_store *s, const char *session, long *jobs, long *dones, int *dense) {
  es_events all;
  es_err err = {0};
  if (es_store_read(s, session, 0, ES_NONE, ES_NONE, &all, &err)) {
    *dense = 0;
    return;
  }
  for (size_t i = 0; i < all.n; i++) {
    if (all.v[i].index != (int64_t)i + 1) *dense = 0;
    if (strcmp(all.v[i].type, "job") == 0) {
      (*jobs)++;
      if (all.v[i].status != ES_STATUS_PROCESSED || all.v[i].returned != 1) *dense = 0;
    } else {
      (*dones)++;
    }
  }
  es_events_destroy(&all);
}

static void run(const char *url, const char *label) {
  es_store *s;
  es_err err = {0};
  if (es_store_open(url, NULL, &s, &err)) {
    printf("# open %s: %s\n", url, err.msg);
    ok(0, label);
    return;
  }
  atomic_int writers_left = WRITERS, errors = 0;
  atomic_long completed = 0;
  pthread_t t[WRITERS + WORKERS];
  ctx c[WRITERS + WORKERS];
  for (int i = 0; i < WRITERS + WORKERS; i++) {
    c[i] = (ctx){s, i, &writers_left, &completed, &errors};
    pthread_create(&t[i], NULL, i < WRITERS ? writer : worker, &c[i]);
  }
  for (int i = 0; i < WRITERS + WORKERS; i++) pthread_join(t[i], NULL);
  char name[160];
  snprintf(name, sizeof name, "%s: no call failed under contention", label);
  ok(atomic_load(&errors) == 0, name);
  snprintf(name, sizeof name, "%s: every appended event was completed exactly once", label);
  ok(atomic_load(&completed) == WRITERS * PER_WRITER, name);

  long jobs = 0, dones = 0;
  int dense = 1;
  check_session(s, "shared", &jobs, &dones, &dense);
  for (int i = 0; i < WRITERS; i++) {
    char own[32];
    snprintf(own, sizeof own, "own-%d", i);
    check_session(s, own, &jobs, &dones, &dense);
  }
  snprintf(name, sizeof name, "%s: indexes dense, each job processed with one result", label);
  ok(dense && jobs == WRITERS * PER_WRITER && dones == jobs, name);

  es_events all;
  int increasing = es_store_read_all(s, 0, ES_NONE, &all, &err) == ES_OK;
  for (size_t i = 1; increasing && i < all.n; i++)
    if (all.v[i].position <= all.v[i - 1].position) increasing = 0;
  snprintf(name, sizeof name, "%s: positions strictly increasing, none lost", label);
  ok(increasing && all.n == (size_t)(2 * WRITERS * PER_WRITER), name);
  es_events_destroy(&all);
  es_store_release(s);
}

/* ---------------------------------------------------------------------- */
/* Group commit: one failing member leaves the others committed. */

/* Callers queued for a group or taken into the running one. */
static int queued_callers(es_store *s) {
  pthread_mutex_lock(&s->qmu);
  int n = s->queued + s->taken;
  pthread_mutex_unlock(&s->qmu);
  return n;
}

/* Callers taken into the running group. */
static int taken_callers(es_store *s) {
  pthread_mutex_lock(&s->qmu);
  int n = s->taken;
  pthread_mutex_unlock(&s->qmu);
  return n;
}

#define GC_ROUNDS 8

static es_store *gc_store; /* the store of the rounds */
static int gc_grouped;     /* whether its backend commits in groups */

static _Thread_local int gc_hold;      /* A: hold inside the first id call */
static _Thread_local int gc_good_left; /* B: ids to give before repeating a stored one; -1: never */
static atomic_long gc_counter;
static atomic_int gc_a_inside, gc_started;

/* The store's id source: fresh "gc-N" ids, except that B's second id is
 * "seed-id" (stored before the rounds), and A's first call waits inside
 * the write transaction until B and C are on their way into it. */
static int gc_ids(void *unused, char *out, size_t cap, es_err *err) {
  (void)unused;
  (void)err;
  if (gc_hold) {
    gc_hold = 0;
    atomic_store(&gc_a_inside, 1);
    while (atomic_load(&gc_started) < 2) usleep(100);
    /* With group commit, A holds the transaction until B and C are queued
     * behind it (A is the caller taken into it), so that they join its
     * group: polled, not a pause assumed long enough. The deadline only
     * ends a hang; the test then fails on the group's commit count. A
     * backend without groups runs B and C after A, whatever the timing. */
    for (int waited = 0; gc_grouped && queued_callers(gc_store) < 3 && waited < 60000; waited++) usleep(1000);
  }
  if (gc_good_left == 0) {
    snprintf(out, cap, "seed-id");
    return ES_OK;
  }
  if (gc_good_left > 0) gc_good_left--;
  snprintf(out, cap, "gc-%ld", atomic_fetch_add(&gc_counter, 1) + 1);
  return ES_OK;
}

typedef struct {
  es_store *s;
  int role; /* 0: A (holds), 1: B (fails), 2: C */
  char session[48];
  int rc;
  int code;
  es_events out;
} gc_ctx;

static void *gc_writer(void *arg) {
  gc_ctx *c = arg;
  gc_good_left = -1;
  if (c->role == 0) {
    gc_hold = 1;
  } else {
    while (!atomic_load(&gc_a_inside)) usleep(100);
    if (c->role == 1) gc_good_left = 1;
    atomic_fetch_add(&gc_started, 1);
  }
  es_new_event e[2];
  new_events(e, 2, "job", NULL);
  int pending;
  es_err err = {0};
  c->rc = es_store_append(c->s, c->session, e, 2, ES_NONE, ES_NONE, &c->out, &pending, &err);
  c->code = err.code;
  return NULL;
}

/* Whether session holds exactly the events of list (by id, in order). */
static int holds_exactly(es_store *s, const char *session, const es_events *list) {
  es_events got;
  es_err err = {0};
  if (es_store_read(s, session, 0, ES_NONE, ES_NONE, &got, &err)) return 0;
  int same = got.n == list->n;
  for (size_t i = 0; same && i < got.n; i++) same = strcmp(got.v[i].id, list->v[i].id) == 0;
  es_events_destroy(&got);
  return same;
}

static void run_group(const char *url, const char *path, const char *label, int grouped) {
  es_open_opts o = {0};
  o.ids = gc_ids;
  es_store *s;
  es_err err = {0};
  char name[200];
  if (es_store_open(url, &o, &s, &err)) {
    printf("# open %s: %s\n", url, err.msg);
    snprintf(name, sizeof name, "%s: group commit: open", label);
    ok(0, name);
    return;
  }
  gc_store = s;
  gc_grouped = grouped;
  es_new_event seed;
  es_new_event_init(&seed);
  seed.id = "seed-id";
  seed.type = "seed";
  int pending;
  snprintf(name, sizeof name, "%s: group commit: the seed event", label);
  ok(es_store_append(s, "seed", &seed, 1, ES_NONE, ES_NONE, NULL, &pending, &err) == ES_OK, name);
  int outcomes = 1, others_kept = 1, failed_left_nothing = 1, one_commit = 1;
  es_events kept[GC_ROUNDS][2];
  char sessions[GC_ROUNDS][3][48];
  for (int r = 0; r < GC_ROUNDS; r++) {
    atomic_store(&gc_a_inside, 0);
    atomic_store(&gc_started, 0);
    gc_ctx c[3];
    pthread_t t[3];
    uint64_t before = es_store_version(s);
    for (int i = 0; i < 3; i++) {
      memset(&c[i], 0, sizeof c[i]);
      c[i].s = s;
      c[i].role = i;
      snprintf(c[i].session, sizeof c[i].session, "gc-%c-%d", "abc"[i], r);
      memcpy(sessions[r][i], c[i].session, sizeof c[i].session);
    }
    for (int i = 0; i < 3; i++) pthread_create(&t[i], NULL, gc_writer, &c[i]);
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    uint64_t commits = es_store_version(s) - before;
    if (c[0].rc != ES_OK || c[2].rc != ES_OK || c[1].rc != ES_INVALID_ARGUMENT) {
      printf("# round %d: rc A %d, B %d (code %d), C %d\n", r, c[0].rc, c[1].rc, c[1].code, c[2].rc);
      outcomes = 0;
    }
    if (!holds_exactly(s, c[0].session, &c[0].out) || !holds_exactly(s, c[2].session, &c[2].out) ||
        c[0].out.n != 2 || c[2].out.n != 2)
      others_kept = 0;
    int64_t head = -1;
    es_events none = {0};
    if (es_store_head(s, c[1].session, &head, &err) || head != 0 || !holds_exactly(s, c[1].session, &none))
      failed_left_nothing = 0;
    if (grouped && commits != 1) {
      printf("# round %d: %llu commits for the group (expected 1)\n", r, (unsigned long long)commits);
      one_commit = 0;
    }
    kept[r][0] = c[0].out;
    kept[r][1] = c[2].out;
    es_events_destroy(&c[1].out);
  }
  snprintf(name, sizeof name, "%s: group commit: A and C succeed, B is INVALID_ARGUMENT", label);
  ok(outcomes, name);
  snprintf(name, sizeof name, "%s: group commit: the members beside the failed one are committed", label);
  ok(others_kept, name);
  snprintf(name, sizeof name, "%s: group commit: the failed member left nothing (not its first event)", label);
  ok(failed_left_nothing, name);
  if (grouped) {
    snprintf(name, sizeof name, "%s: group commit: A, B and C shared one transaction (one commit)", label);
    ok(one_commit, name);
  }
  /* Nothing else in the log: the seed and 4 events per round. */
  es_events all;
  int total = es_store_read_all(s, 0, ES_NONE, &all, &err) == ES_OK && all.n == 1 + 4 * GC_ROUNDS;
  if (total) es_events_destroy(&all);
  snprintf(name, sizeof name, "%s: group commit: the log holds exactly the committed events", label);
  ok(total, name);
  es_store_release(s);

  if (path) {
    /* What a new handle on the file reads: committed for real. */
    int opened = es_store_open(url, NULL, &s, &err) == ES_OK;
    int durable = opened;
    for (int r = 0; durable && r < GC_ROUNDS; r++) {
      int64_t head = -1;
      durable = holds_exactly(s, sessions[r][0], &kept[r][0]) &&
                holds_exactly(s, sessions[r][2], &kept[r][1]) &&
                es_store_head(s, sessions[r][1], &head, &err) == ES_OK && head == 0;
    }
    if (opened) es_store_release(s);
    snprintf(name, sizeof name, "%s: group commit: a new handle on the file reads the same", label);
    ok(durable, name);
  }
  for (int r = 0; r < GC_ROUNDS; r++) {
    es_events_destroy(&kept[r][0]);
    es_events_destroy(&kept[r][1]);
  }
}

/* ---------------------------------------------------------------------- */
/* Group commit without an id source: the leader runs everyone's work. */

static atomic_int hold_inside, hold_release;

/* The second handle's id source: the first call blocks (inside that
 * handle's write transaction, holding the write lock) until released. */
static int hold_ids(void *unused, char *out, size_t cap, es_err *err) {
  (void)unused;
  (void)err;
  if (!atomic_exchange(&hold_inside, 1))
    while (!atomic_load(&hold_release)) usleep(1000);
  static atomic_long n;
  snprintf(out, cap, "hold-%ld", atomic_fetch_add(&n, 1) + 1);
  return ES_OK;
}

typedef struct {
  es_store *s;
  int role; /* 0: A, 1: B (fails after its first row is in), 2: C, 3: the holder */
  const char *session;
  int rc;
  es_events out;
} sh_ctx;

/* n events of type "job", payload {"n":1}. */
static void job_events(es_new_event *e, int n) { new_events(e, n, "job", "{\"n\":1}"); }

static void *sh_writer(void *arg) {
  sh_ctx *c = arg;
  es_new_event e[3];
  job_events(e, 3);
  size_t n = c->role == 3 ? 1 : 2;
  if (c->role == 1) {
    /* e[0] is inserted before e[1] (a laned pending event: the rows
     * before it go in first, so that its lane lookup sees them); e[2]
     * fails: its key was shredded. */
    e[1].lane = "l";
    e[2].key = "burned";
    n = 3;
  }
  int pending;
  es_err err = {0};
  c->rc = es_store_append(c->s, c->session, e, n, ES_NONE, ES_NONE, &c->out, &pending, &err);
  return NULL;
}

/* Rows of session in the whole log (read_all), whatever its session row
 * says: a failed member's rows would be there without one. */
static long rows_of(es_store *s, const char *session) {
  es_events all;
  es_err err = {0};
  if (es_store_read_all(s, 0, ES_NONE, &all, &err)) return -1;
  long n = 0;
  for (size_t i = 0; i < all.n; i++) n += strcmp(all.v[i].session, session) == 0;
  es_events_destroy(&all);
  return n;
}

static void run_shared(const char *url, const char *keys, const char *label, int grouped) {
  char name[200];
  es_open_opts o = {0};
  o.keys_path = keys;
  es_store *s = NULL, *h2 = NULL;
  es_err err = {0};
  if (es_store_open(url, &o, &s, &err)) {
    printf("# open %s: %s\n", url, err.msg);
    snprintf(name, sizeof name, "%s: shared group: open", label);
    ok(0, name);
    return;
  }
  es_open_opts o2 = {0};
  o2.ids = hold_ids;
  o2.keys_path = keys;
  if (grouped && es_store_open(url, &o2, &h2, &err)) {
    printf("# open %s: %s\n", url, err.msg);
    h2 = NULL;
  }
  int was_live;
  snprintf(name, sizeof name, "%s: shared group: the key 'burned' is shredded", label);
  ok(es_store_shred(s, "burned", &was_live, &err) == ES_OK, name);
  int outcomes = 1, kept = 1, nothing = 1, one_commit = 1, seen = 1, held = 1;
  for (int r = 0; r < 4; r++) {
    char sess[4][48];
    sh_ctx c[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
      snprintf(sess[i], sizeof sess[i], "sh-%c-%d", "abch"[i], r);
      memset(&c[i], 0, sizeof c[i]);
      c[i].s = i == 3 ? h2 : s;
      c[i].role = i;
      c[i].session = sess[i];
    }
    atomic_store(&hold_inside, 0);
    atomic_store(&hold_release, 0);
    if (h2) {
      pthread_create(&t[3], NULL, sh_writer, &c[3]);
      while (!atomic_load(&hold_inside)) usleep(1000);
    }
    uint64_t before = es_store_version(s);
    for (int i = 0; i < 3; i++) pthread_create(&t[i], NULL, sh_writer, &c[i]);
    if (h2) {
      /* All three in the group: queued, or taken into the transaction
       * that waits for the write lock h2 holds (on SQLite in BEGIN
       * IMMEDIATE, before the leader takes anyone; on PostgreSQL the begin
       * and the lock travel with the first statement, so the leader may
       * have taken some and waits in their work). */
      int waited = 0;
      while (queued_callers(s) < 3 && waited++ < 30000) usleep(1000);
      held = held && queued_callers(s) == 3;
      atomic_store(&hold_release, 1);
      pthread_join(t[3], NULL);
      held = held && c[3].rc == ES_OK;
    }
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    uint64_t commits = es_store_version(s) - before;
    if (c[0].rc != ES_OK || c[2].rc != ES_OK || c[1].rc != ES_INVALID_ARGUMENT) {
      printf("# round %d: rc A %d, B %d, C %d\n", r, c[0].rc, c[1].rc, c[2].rc);
      outcomes = 0;
    }
    if (!holds_exactly(s, sess[0], &c[0].out) || !holds_exactly(s, sess[2], &c[2].out) || c[0].out.n != 2 ||
        c[2].out.n != 2)
      kept = 0;
    /* Acknowledged means committed: another handle reads them at once. */
    if (h2 && (!holds_exactly(h2, sess[0], &c[0].out) || !holds_exactly(h2, sess[2], &c[2].out))) seen = 0;
    int64_t head = -1;
    es_events none = {0};
    if (es_store_head(s, sess[1], &head, &err) || head != 0 || !holds_exactly(s, sess[1], &none) ||
        rows_of(s, sess[1]) != 0)
      nothing = 0;
    if (grouped && commits != 1) {
      printf("# round %d: %llu commits for the group (expected 1)\n", r, (unsigned long long)commits);
      one_commit = 0;
    }
    for (int i = 0; i < 4; i++) es_events_destroy(&c[i].out);
  }
  snprintf(name, sizeof name, "%s: shared group: A and C succeed, B is INVALID_ARGUMENT (shredded key)", label);
  ok(outcomes, name);
  snprintf(name, sizeof name, "%s: shared group: A's and C's events are stored", label);
  ok(kept, name);
  snprintf(name, sizeof name, "%s: shared group: B left nothing, not even the row inserted before its failure",
           label);
  ok(nothing, name);
  if (grouped) {
    snprintf(name, sizeof name, "%s: shared group: the three queued behind another handle's write lock", label);
    ok(held && h2, name);
    snprintf(name, sizeof name, "%s: shared group: A, B and C in one transaction (one commit)", label);
    ok(one_commit, name);
    snprintf(name, sizeof name, "%s: shared group: another handle reads A's and C's events when they return",
             label);
    ok(seen, name);
  }
  if (h2) es_store_release(h2);
  es_store_release(s);
}

/* ---------------------------------------------------------------------- */
/* One savepoint for appends queued together (group.c "Shared savepoints
 * and reads ahead"): appends without a key share one savepoint; a
 * member's own error leaves the others alone; a STORAGE error takes back
 * the savepoint's earlier members (STORAGE for them too, nothing stored)
 * and the members after it still commit. The backend's table is wrapped
 * to count savepoints and reads ahead and to fail the inserts of one
 * session with STORAGE. */

static const es_backend_ops *os_real;
static es_backend_ops os_ops;
static atomic_int os_savepoints, os_read_aheads, os_ahead_sessions;

static int os_boom(const es_event *rows, size_t n, es_err *err) {
  for (size_t i = 0; i < n; i++)
    if (strstr(rows[i].session, "boom"))
      return es_fail(err, ES_STORAGE, "test: the disk refused session '%s'", rows[i].session);
  return ES_OK;
}

static int os_insert(es_backend *b, es_txn *t, es_event *row, es_err *err) {
  int rc = os_boom(row, 1, err);
  return rc ? rc : os_real->event_insert(b, t, row, err);
}

static int os_insert_many(es_backend *b, es_txn *t, es_event *rows, size_t n, es_err *err) {
  int rc = os_boom(rows, n, err);
  return rc ? rc : os_real->event_insert_many(b, t, rows, n, err);
}

static int os_savepoint(es_backend *b, es_txn *t, es_err *err) {
  atomic_fetch_add(&os_savepoints, 1);
  return os_real->savepoint(b, t, err);
}

static int os_read_ahead(es_backend *b, es_txn *t, const char *const *sessions, const int64_t *indexes,
                         size_t n, const char *const *ids, size_t n_ids, es_err *err) {
  atomic_fetch_add(&os_read_aheads, 1);
  atomic_fetch_add(&os_ahead_sessions, (int)n);
  return os_real->read_ahead(b, t, sessions, indexes, n, ids, n_ids, err);
}

typedef struct {
  es_store *s;
  char session[48];
  int64_t expected;
  const char *id; /* set: one event with this id instead of two */
  int rc;
  char msg[ES_ERRMSG_MAX];
  es_events out;
} os_ctx;

static void *os_writer(void *arg) {
  os_ctx *c = arg;
  es_new_event e[2];
  job_events(e, 2);
  e[0].id = c->id;
  int pending;
  es_err err = {0};
  c->rc = es_store_append(c->s, c->session, e, c->id ? 1 : 2, c->expected, ES_NONE, &c->out, &pending, &err);
  snprintf(c->msg, sizeof c->msg, "%s", err.msg);
  return NULL;
}

/* Four appends queued behind h2's write lock, in this order (each queued
 * before the next starts), behind a fifth that leads their group (so that
 * on PostgreSQL, which begins lazily, the four are taken together while
 * the leader waits for the lock in its first statement); returns the
 * commits of s meanwhile, and the leader's answer in *lead_rc. */
static uint64_t os_round(es_store *s, es_store *h2, os_ctx *c, int *held, int *lead_rc) {
  pthread_t t[4], th, tl;
  sh_ctx hc = {h2, 3, "os-holder", 0, {0}};
  os_ctx lead;
  memset(&lead, 0, sizeof lead);
  lead.s = s;
  lead.expected = ES_NONE;
  snprintf(lead.session, sizeof lead.session, "os-lead");
  atomic_store(&hold_inside, 0);
  atomic_store(&hold_release, 0);
  pthread_create(&th, NULL, sh_writer, &hc);
  while (!atomic_load(&hold_inside)) usleep(1000);
  uint64_t before = es_store_version(s);
  /* the leader's taken before the four queue where it takes callers before
   * it waits for the lock (PostgreSQL: in its first statement; SQLite
   * waits in BEGIN IMMEDIATE, before it takes anyone) */
  int lazy = s->ops->read_ahead != NULL;
  for (int i = -1; i < 4; i++) {
    pthread_create(i < 0 ? &tl : &t[i], NULL, os_writer, i < 0 ? &lead : &c[i]);
    int waited = 0;
    while ((queued_callers(s) < i + 2 || (i < 0 && lazy && taken_callers(s) < 1)) && waited++ < 30000)
      usleep(1000);
    *held = *held && queued_callers(s) == i + 2;
  }
  atomic_store(&hold_release, 1);
  pthread_join(th, NULL);
  *held = *held && hc.rc == ES_OK;
  es_events_destroy(&hc.out);
  pthread_join(tl, NULL);
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  *lead_rc = lead.rc;
  es_events_destroy(&lead.out);
  return es_store_version(s) - before;
}

static void os_init(os_ctx *c, es_store *s, const char *fmt, int r) {
  for (int i = 0; i < 4; i++) {
    memset(&c[i], 0, sizeof c[i]);
    c[i].s = s;
    c[i].expected = ES_NONE;
    snprintf(c[i].session, sizeof c[i].session, fmt, "abcd"[i], r);
  }
}

static void run_one_savepoint(const char *url, const char *label) {
  es_store *s = NULL, *h2 = NULL;
  es_err err = {0};
  es_open_opts o = {0}, o2 = {0};
  o2.ids = hold_ids;
  if (es_store_open(url, &o, &s, &err) || es_store_open(url, &o2, &h2, &err)) {
    printf("# open %s: %s\n", url, err.msg);
    okf(0, "%s: one savepoint: open", label);
    if (s) es_store_release(s);
    return;
  }
  os_real = s->ops;
  os_ops = *s->ops;
  os_ops.savepoint = os_savepoint;
  if (os_ops.event_insert) os_ops.event_insert = os_insert;
  if (os_ops.event_insert_many) os_ops.event_insert_many = os_insert_many;
  if (os_ops.read_ahead) os_ops.read_ahead = os_read_ahead;
  s->ops = &os_ops;
  int pg = os_real->read_ahead != NULL, held = 1;

  /* 1. four good appends, new sessions then the same ones again */
  int all_ok = 1, stored = 1, one_commit = 1, one_sp = 1, ahead = 1;
  for (int r = 0; r < 4; r++) {
    os_ctx c[4];
    os_init(c, s, "os-good-%c", 0); /* the same four sessions every round */
    atomic_store(&os_savepoints, 0);
    atomic_store(&os_read_aheads, 0);
    atomic_store(&os_ahead_sessions, 0);
    int lead_rc;
    if (os_round(s, h2, c, &held, &lead_rc) != 1) one_commit = 0;
    if (lead_rc != ES_OK) all_ok = 0;
    for (int i = 0; i < 4; i++) {
      int64_t head = -1;
      if (c[i].rc != ES_OK) {
        printf("# round %d: %s: %s\n", r, c[i].session, c[i].msg);
        all_ok = 0;
      }
      if (c[i].out.n != 2 || c[i].out.v[1].index != 2 * r + 2 ||
          es_store_head(s, c[i].session, &head, &err) || head != 2 * r + 2 ||
          rows_of(s, c[i].session) != 2 * r + 2)
        stored = 0;
      es_events_destroy(&c[i].out);
    }
    /* SQLite: the leader takes all five at once (it waits in BEGIN
     * IMMEDIATE first); PostgreSQL begins lazily, so the leader runs alone
     * (or with the first of the four) before the others come in one batch */
    int sp = atomic_load(&os_savepoints);
    if (pg ? sp > 2 : sp != 1) {
      printf("# round %d: %d savepoints for four appends\n", r, sp);
      one_sp = 0;
    }
    if (pg && atomic_load(&os_ahead_sessions) < 4) {
      printf("# round %d: %d reads ahead naming %d sessions\n", r, atomic_load(&os_read_aheads),
             atomic_load(&os_ahead_sessions));
      ahead = 0;
    }
  }
  okf(all_ok, "%s: one savepoint: four appends queued together (and their leader) all succeed", label);
  okf(stored, "%s: one savepoint: their events and session heads are stored, new sessions and old", label);
  okf(one_commit && held, "%s: one savepoint: the four share one commit", label);
  okf(one_sp, "%s: one savepoint: the five share %s", label,
      pg ? "at most two savepoints (the leader runs alone first)" : "one savepoint");
  if (pg) okf(ahead, "%s: one savepoint: the four sessions behind the leader are read ahead together", label);

  /* 2. A good, B refused (wrong expected head), C fails with STORAGE, D good */
  int b_own = 1, c_storage = 1, d_kept = 1, a_atomic = 1, a_taken_back = 1, none = 1;
  for (int r = 0; r < 3; r++) {
    os_ctx c[4];
    os_init(c, s, "os-%c-%d", r);
    snprintf(c[2].session, sizeof c[2].session, "os-boom-%d", r);
    c[1].expected = 5;
    int lead_rc;
    os_round(s, h2, c, &held, &lead_rc);
    if (c[1].rc != ES_WRONG_EXPECTED_HEAD) b_own = 0;
    if (c[2].rc != ES_STORAGE) c_storage = 0;
    if (c[3].rc != ES_OK || !holds_exactly(s, c[3].session, &c[3].out) || c[3].out.n != 2) {
      printf("# round %d: D: rc %d %s\n", r, c[3].rc, c[3].msg);
      d_kept = 0;
    }
    /* A ran in the savepoint C's failure rolled back (always on SQLite,
     * where the four are taken together), or in one of its own */
    if (c[0].rc == ES_OK) {
      if (!holds_exactly(s, c[0].session, &c[0].out) || c[0].out.n != 2) a_atomic = 0;
    } else if (c[0].rc != ES_STORAGE || rows_of(s, c[0].session) != 0 ||
               !strstr(c[0].msg, "shared a savepoint")) {
      printf("# round %d: A: rc %d %s\n", r, c[0].rc, c[0].msg);
      a_atomic = 0;
    }
    if (c[0].rc != ES_STORAGE) a_taken_back = 0;
    if (rows_of(s, c[1].session) != 0 || rows_of(s, c[2].session) != 0) none = 0;
    for (int i = 0; i < 4; i++) es_events_destroy(&c[i].out);
  }
  okf(b_own, "%s: one savepoint: a member refused on its own (wrong head) gets its error", label);
  okf(c_storage, "%s: one savepoint: the member whose insert fails gets STORAGE", label);
  okf(d_kept, "%s: one savepoint: the member queued after the failure commits", label);
  okf(a_atomic, "%s: one savepoint: the member before it is all or nothing, STORAGE when taken back",
      label);
  okf(a_taken_back, "%s: one savepoint: ... and was taken back with the failing member's savepoint", label);
  okf(none, "%s: one savepoint: the refused and the failed member left no row", label);

  /* 3. one id three times in a group: stored by the first, refused in
   * another session, replayed in the same one (the ids read ahead are
   * known absent only until a member inserts one) */
  int dup_ok = 1;
  for (int r = 0; r < 3; r++) {
    os_ctx c[4];
    char id[32];
    snprintf(id, sizeof id, "os-dup-%d", r);
    os_init(c, s, "os-dup-%c-%d", r);
    snprintf(c[2].session, sizeof c[2].session, "%s", c[0].session);
    for (int i = 0; i < 3; i++) c[i].id = id;
    int lead_rc;
    os_round(s, h2, c, &held, &lead_rc);
    int64_t head = -1;
    if (c[0].rc != ES_OK || c[1].rc != ES_PARTIAL_DUPLICATE_BATCH || c[2].rc != ES_OK || c[3].rc != ES_OK ||
        c[0].out.n != 1 || c[2].out.n != 1 || strcmp(c[2].out.v[0].id, id) != 0 ||
        c[2].out.v[0].position != c[0].out.v[0].position || rows_of(s, c[1].session) != 0 ||
        es_store_head(s, c[0].session, &head, &err) || head != 1) {
      printf("# round %d: rc %d %d %d %d (%s)\n", r, c[0].rc, c[1].rc, c[2].rc, c[3].rc, c[1].msg);
      dup_ok = 0;
    }
    for (int i = 0; i < 4; i++) es_events_destroy(&c[i].out);
  }
  okf(dup_ok, "%s: one savepoint: one id in a group: stored once, refused in another session, replayed in its own",
      label);
  s->ops = os_real;
  es_store_release(h2);
  es_store_release(s);
}

/* ---------------------------------------------------------------------- */
/* Many writers, some calls failing: each acknowledged batch whole, each
 * failed one absent. */

#define MX_WRITERS 16
#define MX_CALLS 60

typedef struct {
  es_store *s;
  int id;
  long acked[2];  /* events acknowledged: own session, shared session */
  int bad;        /* a call answered other than expected */
} mx_ctx;

static void *mx_writer(void *arg) {
  mx_ctx *c = arg;
  char own[32];
  snprintf(own, sizeof own, "mx-%d", c->id);
  int64_t head = 0; /* of own: only this thread writes it */
  for (int i = 0; i < MX_CALLS; i++) {
    es_new_event e[3];
    size_t n = (size_t)(i % 3) + 1;
    for (size_t k = 0; k < n; k++) {
      es_new_event_init(&e[k]);
      e[k].type = "t";
      e[k].payload = "{\"k\":1}";
      e[k].payload_len = 7;
      e[k].settled = (i + (int)k) % 2;
    }
    int shared = i % 4 == 3, fail = i % 5 == 4;
    int pending;
    es_err err = {0};
    /* A failing call: a wrong expected head (checked inside the group's
     * transaction, after other members' work). */
    int64_t expected = shared ? ES_NONE : fail ? head + 7 : head;
    int rc = es_store_append(c->s, shared ? "mx-shared" : own, e, n, expected, ES_NONE, NULL, &pending, &err);
    if (rc == ES_OK && !(fail && !shared)) {
      c->acked[shared] += (long)n;
      if (!shared) head += (int64_t)n;
    } else if (!(rc == ES_WRONG_EXPECTED_HEAD && fail && !shared)) {
      printf("# writer %d call %d: rc %d %s\n", c->id, i, rc, err.msg);
      c->bad = 1;
    }
  }
  return NULL;
}

static void run_mixed(const char *url, const char *label) {
  char name[200];
  es_store *s;
  es_err err = {0};
  if (es_store_open(url, NULL, &s, &err)) {
    printf("# open %s: %s\n", url, err.msg);
    snprintf(name, sizeof name, "%s: mixed writers: open", label);
    ok(0, name);
    return;
  }
  mx_ctx c[MX_WRITERS];
  pthread_t t[MX_WRITERS];
  for (int i = 0; i < MX_WRITERS; i++) {
    memset(&c[i], 0, sizeof c[i]);
    c[i].s = s;
    c[i].id = i;
    pthread_create(&t[i], NULL, mx_writer, &c[i]);
  }
  int bad = 0;
  long shared = 0;
  for (int i = 0; i < MX_WRITERS; i++) {
    pthread_join(t[i], NULL);
    bad |= c[i].bad;
    shared += c[i].acked[1];
  }
  snprintf(name, sizeof name, "%s: mixed writers: each call answered as expected", label);
  ok(!bad, name);
  int whole = 1;
  for (int i = 0; i <= MX_WRITERS && whole; i++) {
    char sess[32];
    long want = i < MX_WRITERS ? c[i].acked[0] : shared;
    if (i < MX_WRITERS) snprintf(sess, sizeof sess, "mx-%d", i);
    else snprintf(sess, sizeof sess, "mx-shared");
    es_events all;
    if (es_store_read(s, sess, 0, ES_NONE, ES_NONE, &all, &err)) {
      whole = 0;
      break;
    }
    whole = (long)all.n == want;
    for (size_t k = 0; whole && k < all.n; k++) whole = all.v[k].index == (int64_t)k + 1;
    if (!whole) printf("# %s: %zu events, %ld acknowledged\n", sess, all.n, want);
    es_events_destroy(&all);
  }
  snprintf(name, sizeof name, "%s: mixed writers: sessions hold exactly the acknowledged events, dense", label);
  ok(whole, name);
  es_events all;
  int increasing = es_store_read_all(s, 0, ES_NONE, &all, &err) == ES_OK;
  for (size_t i = 1; increasing && i < all.n; i++)
    if (all.v[i].position <= all.v[i - 1].position) increasing = 0;
  if (increasing) es_events_destroy(&all);
  snprintf(name, sizeof name, "%s: mixed writers: positions strictly increasing", label);
  ok(increasing, name);
  es_store_release(s);
}

/* Presence patches of a handle's own write reach its watches once
 * (presence_ext.c): the handle's ext_watch thread can read the write
 * between its commit and es_presence_ext_own (the backend learns that a
 * commit was its own only after it) and hand it over; the write then
 * tells only the rows not handed over. Here the handover is made by hand,
 * then the write's own telling is asked for what is left. */
typedef struct {
  atomic_int patches;
} presence_count;

static void count_patch(void *counter, const char *ns, const es_presence_rows *applied) {
  (void)ns;
  (void)applied;
  atomic_fetch_add(&((presence_count *)counter)->patches, 1);
}

static void run_presence_once(const char *url) {
  es_store *a = NULL, *b = NULL;
  es_err err = {0};
  if (es_store_open(url, NULL, &a, &err) || es_store_open(url, NULL, &b, &err)) {
    printf("# open %s: %s\n", url, err.msg);
    ok(0, "presence once: open two handles");
    if (a) es_store_release(a);
    return;
  }
  presence_count c = {0};
  uint64_t token = es_store_presence_watch(a, "room", count_patch, &c);
  es_presence_field f = {"typing", "true", 4};
  es_presence_rows by_b;
  int wrote = es_store_presence_set(b, "room", "bob", &f, 1, 60000, ES_NONE, 0, &by_b, &err) == ES_OK;
  /* what a's ext_watch thread does when it sees b's commit (whether it
   * already did or not, the patch is told once: under pmu) */
  es_presence_ext_change(a);
  ok(wrote && atomic_load(&c.patches) == 1, "presence once: another handle's write is told once");
  /* the same rows as if a had written them: all of them told already */
  es_presence_rows fresh = {0};
  const es_presence_rows *give = NULL;
  pthread_mutex_lock(&a->pmu);
  es_presence_ext_own(a, "room", &by_b, &fresh, &give);
  pthread_mutex_unlock(&a->pmu);
  ok(wrote && give && give->n == 0, "presence once: an own write's rows handed over already are not told again");
  free(fresh.v);
  /* a write of a's own that nothing handed over: told, once */
  es_presence_field g = {"cursor", "7", 1};
  es_presence_rows by_a;
  int wrote_a = es_store_presence_set(a, "room", "ann", &g, 1, 60000, ES_NONE, 0, &by_a, &err) == ES_OK;
  es_presence_ext_change(a);
  ok(wrote_a && atomic_load(&c.patches) == 2, "presence once: an own write is told once");
  if (wrote) es_presence_rows_destroy(&by_b);
  if (wrote_a) es_presence_rows_destroy(&by_a);
  es_store_presence_unwatch(a, token);
  es_store_release(b);
  es_store_release(a);
}

int main(void) {
  printf("# store_threads_test: one handle, %d writers and %d workers\n", WRITERS, WORKERS);
  run("memory:", "memory");
  char dir[] = "/tmp/es-threads-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  char url[200], path[64];
  snprintf(path, sizeof path, "%s/t.db", dir);
  snprintf(url, sizeof url, "sqlite:%s?sync=normal", path);
  run(url, "sqlite");
  run_group("memory:", NULL, "memory", 0);
  char gpath[64], gurl[200];
  snprintf(gpath, sizeof gpath, "%s/g.db", dir);
  snprintf(gurl, sizeof gurl, "sqlite:%s", gpath);
  run_group(gurl, gpath, "sqlite", 1);
  char keys[200], spath[64], surl[200];
  snprintf(keys, sizeof keys, "%s/master.key", dir);
  snprintf(spath, sizeof spath, "%s/s.db", dir);
  snprintf(surl, sizeof surl, "sqlite:%s", spath);
  run_shared("memory:", keys, "memory", 0);
  run_shared(surl, keys, "sqlite", 1);
  char opath[64], ourl[200];
  snprintf(opath, sizeof opath, "%s/o.db", dir);
  snprintf(ourl, sizeof ourl, "sqlite:%s", opath);
  run_one_savepoint(ourl, "sqlite");
  char mpath[64], murl[200];
  snprintf(mpath, sizeof mpath, "%s/m.db", dir);
  snprintf(murl, sizeof murl, "sqlite:%s", mpath);
  run_mixed(murl, "sqlite");
  char ppath[64], purl[200];
  snprintf(ppath, sizeof ppath, "%s/p.db", dir);
  snprintf(purl, sizeof purl, "sqlite:%s", ppath);
  run_presence_once(purl);
  const char *pg = getenv("ES_PG_URL");
  if (pg && *pg) {
    char u[1024];
    pg_url(pg, "thr_run", u, sizeof u);
    run(u, "postgres");
    pg_url(pg, "thr_group", u, sizeof u);
    run_group(u, NULL, "postgres", 1);
    pg_url(pg, "thr_shared", u, sizeof u);
    run_shared(u, keys, "postgres", 1);
    pg_url(pg, "thr_one_sp", u, sizeof u);
    run_one_savepoint(u, "postgres");
    pg_url(pg, "thr_mixed", u, sizeof u);
    run_mixed(u, "postgres");
  } else {
    skip("postgres: ES_PG_URL is not set (make test sets it)");
  }
  unlink_sqlite(path);
  unlink_sqlite(gpath);
  unlink_sqlite(spath);
  unlink_sqlite(opath);
  unlink_sqlite(mpath);
  unlink_sqlite(ppath);
  unlink(keys);
  rmdir(dir);
  return tap_done();
}
