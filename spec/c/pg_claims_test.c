/*
 * pg_claims_test.c: claim transactions and NOTIFY-woken waits on
 * PostgreSQL (docs/postgres.md "Concurrency", "Connections"), with threads,
 * which the Lua specs cannot run. Needs ES_PG_URL (make test exports it:
 * spec/support/pg_cluster.sh); skipped without it. Each case uses a fresh
 * schema.
 *
 * - Several handles (as several processes would), each with claiming and
 *   completing workers and a writer appending to the same few sessions:
 *   every event completed exactly once, every claim counted on its
 *   session row, and no call failed (a claim transaction never gets a
 *   writer's group commit aborted by the deadlock detector, and gives way
 *   itself when they collide).
 * - A wait blocked in the backend returns promptly when another thread
 *   closes the store.
 * - A wait is woken by a commit of another thread of the same process.
 * - A caller of a group commit whose event update changes no row (a
 *   trigger skips it, as if the row were gone) fails alone: the other
 *   callers of its group commit, appending meanwhile, all succeed, and
 *   nothing of the failed calls is committed (docs/postgres.md "Round
 *   trips"). Needs psql on PATH to create the trigger.
 * - A read with no free read connection borrows an idle claim connection,
 *   and a claim an idle read connection, instead of opening one more
 *   (docs/postgres.md "Connections"): a handle that appended, claimed and
 *   read holds two connections, counted in pg_stat_activity of a database
 *   of its own. Needs psql on PATH.
 * TAP-style output; non-zero exit on failure.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "store/internal.h"
#include "store/store.h"

#include "new_events.h"
#include "tap.h"

#define HANDLES 3
#define WORKERS_PER 2
#define SESSIONS 3
#define PER_WRITER 150

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static es_store *open_or_die(const char *url) {
  es_store *s = NULL;
  es_err err = {0};
  if (es_store_open(url, NULL, &s, &err)) {
    printf("# open %s: %s\n", url, err.msg);
    return NULL;
  }
  return s;
}

static const char *session_name(int i) {
  static const char *const names[SESSIONS] = {"s0", "s1", "s2"};
  return names[i % SESSIONS];
}

/* --- several handles claiming while writers write ------------------------ */

typedef struct {
  es_store *s;
  int id;
  atomic_int *writers_left;
  atomic_long *claimed;
  atomic_long *completed;
  atomic_int *errors;
} ctx;

static void report(atomic_int *errors, const char *what, const es_err *err) {
  if (atomic_fetch_add(errors, 1) < 5) printf("# %s: %s\n", what, err->msg);
}

static void *writer(void *arg) {
  ctx *c = arg;
  for (int i = 0; i < PER_WRITER; i++) {
    es_new_event e;
    es_new_event_init(&e);
    e.type = "job";
    int pending;
    es_err err = {0};
    if (es_store_append(c->s, session_name(i + c->id), &e, 1, ES_NONE, ES_NONE, NULL, &pending, &err))
      report(c->errors, "append", &err);
  }
  atomic_fetch_sub(c->writers_left, 1);
  return NULL;
}

static void *worker(void *arg) {
  ctx *c = arg;
  char holder[32];
  snprintf(holder, sizeof holder, "worker-%d", c->id);
  int idle_after_writers = 0;
  for (int round = 0;; round++) {
    es_events got;
    int64_t retry;
    es_err err = {0};
    if (es_store_claim_next(c->s, holder, 600000, 1 + round % 3, NULL, 0, NULL, 0, &got, &retry, &err)) {
      report(c->errors, "claim_next", &err);
      return NULL;
    }
    if (got.n == 0) {
      es_events_destroy(&got);
      /* other handles' claim transactions may hold the last rows for a
       * moment: look a few times once the writers are done */
      if (atomic_load(c->writers_left) == 0 && ++idle_after_writers > 20) return NULL;
      usleep(2000);
      continue;
    }
    idle_after_writers = 0;
    atomic_fetch_add(c->claimed, (long)got.n);
    for (size_t i = 0; i < got.n; i++) {
      es_new_event r;
      es_new_event_init(&r);
      r.type = "done";
      r.settled = 1;
      es_events out;
      int outcome;
      if (es_store_complete(c->s, got.v[i].session, got.v[i].index, got.v[i].attempts, &r, 1,
                            ES_NONE, &outcome, &out, &err))
        report(c->errors, "complete", &err);
      else if (outcome != ES_COMPLETED)
        report(c->errors, "complete: not completed", &err);
      else
        atomic_fetch_add(c->completed, 1);
      es_events_destroy(&out);
    }
    es_events_destroy(&got);
  }
}

static void several_handles(const char *base) {
  char url[1024];
  pg_url(base, "par", url, sizeof url);
  es_store *h[HANDLES] = {0};
  for (int i = 0; i < HANDLES; i++)
    if (!(h[i] = open_or_die(url))) {
      ok(0, "several handles: open");
      for (int k = 0; k < i; k++) es_store_release(h[k]);
      return;
    }
  atomic_int writers_left = HANDLES, errors = 0;
  atomic_long claimed = 0, completed = 0;
  pthread_t t[HANDLES * (WORKERS_PER + 1)];
  ctx c[HANDLES * (WORKERS_PER + 1)];
  int n = 0;
  for (int i = 0; i < HANDLES; i++) {
    for (int w = 0; w <= WORKERS_PER; w++) {
      c[n] = (ctx){h[i], n, &writers_left, &claimed, &completed, &errors};
      pthread_create(&t[n], NULL, w == 0 ? writer : worker, &c[n]);
      n++;
    }
  }
  for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
  long total = (long)HANDLES * PER_WRITER;
  ok(atomic_load(&errors) == 0, "several handles: no call failed (no writer aborted, no claim gave up)");
  ok(atomic_load(&claimed) == total && atomic_load(&completed) == total,
     "several handles: every event claimed once and completed");
  /* each job processed, one result each; each session's attempts = its jobs */
  int fine = 1;
  for (int k = 0; k < SESSIONS; k++) {
    es_events all;
    es_err err = {0};
    if (es_store_read(h[0], session_name(k), 0, ES_NONE, ES_NONE, &all, &err)) {
      fine = 0;
      continue;
    }
    long jobs = 0, dones = 0;
    for (size_t i = 0; i < all.n; i++) {
      if (strcmp(all.v[i].type, "job") == 0) {
        jobs++;
        if (all.v[i].status != ES_STATUS_PROCESSED || all.v[i].attempts != 1) fine = 0;
      } else {
        dones++;
      }
    }
    es_events_destroy(&all);
    es_sessions ss;
    if (es_store_sessions(h[0], session_name(k), NULL, 1, &ss, &err) || ss.n != 1 ||
        ss.v[0].attempts != jobs || jobs != dones) {
      printf("# %s: %ld jobs, %ld results, attempts %lld\n", session_name(k), jobs, dones,
             ss.n ? (long long)ss.v[0].attempts : -1LL);
      fine = 0;
    }
    es_sessions_destroy(&ss);
  }
  ok(fine, "several handles: every job processed at attempt 1, one result each, attempts counted");
  for (int i = 0; i < HANDLES; i++) es_store_release(h[i]);
}

/* --- waits ---------------------------------------------------------------- */

typedef struct {
  es_store *s;
  const char *session;
  int rc;
  size_t got;
  double took;
} wait_ctx;

static void *waiter(void *arg) {
  wait_ctx *w = arg;
  es_events out;
  es_err err = {0};
  double t0 = now_s();
  w->rc = es_store_wait(w->s, w->session, 0, 60000, 10, &out, &err);
  w->took = now_s() - t0;
  w->got = w->rc == ES_OK ? out.n : 0;
  if (w->rc == ES_OK) es_events_destroy(&out);
  return NULL;
}

/* Waits until a call is inside the store: the handle's thread that blocks
 * in the backend for other processes' commits (es_core_enter before
 * wait_change), which the first wait starts before its first read (a
 * commit or a close from then on wakes the wait). Polled, not a pause
 * assumed long enough; the deadline only ends a hang. */
static int waiter_blocked(es_store *s) {
  for (int i = 0; i < 60000; i++) {
    pthread_mutex_lock(&s->lmu);
    int n = s->inflight;
    pthread_mutex_unlock(&s->lmu);
    if (n > 0) return 1;
    usleep(1000);
  }
  return 0;
}

static void close_wakes_waiter(const char *base) {
  char url[1024];
  pg_url(base, "close", url, sizeof url);
  es_store *s = open_or_die(url);
  if (!s) {
    ok(0, "close wakes a wait: open");
    return;
  }
  es_store_retain(s); /* the waiter's reference outlives close */
  wait_ctx w = {s, "nothing", -1, 0, 0};
  pthread_t t;
  pthread_create(&t, NULL, waiter, &w);
  int blocked = waiter_blocked(s);
  double t0 = now_s();
  es_store_close(s);
  double closing = now_s() - t0;
  pthread_join(t, NULL);
  printf("# close took %.3f s, the wait %.3f s (rc %d)\n", closing, w.took, w.rc);
  /* hang ceilings: without the wake the wait would end at its timeout */
  ok(blocked && closing < 30 && w.took < 30, "close() ends a wait blocked in the backend (60 s timeout) promptly");
  ok(w.rc == ES_CLOSED || (w.rc == ES_OK && w.got == 0), "the woken wait says CLOSED (or nothing)");
  es_store_release(s);
  es_store_release(s);
}

static void commit_wakes_waiter(const char *base) {
  char url[1024];
  pg_url(base, "inproc", url, sizeof url);
  es_store *s = open_or_die(url);
  if (!s) {
    ok(0, "an in-process commit wakes a wait: open");
    return;
  }
  wait_ctx w = {s, "later", -1, 0, 0};
  pthread_t t;
  pthread_create(&t, NULL, waiter, &w);
  int blocked = waiter_blocked(s);
  es_new_event e;
  es_new_event_init(&e);
  e.type = "ping";
  int pending;
  es_err err = {0};
  int rc = es_store_append(s, "later", &e, 1, ES_NONE, ES_NONE, NULL, &pending, &err);
  pthread_join(t, NULL);
  printf("# the wait took %.3f s\n", w.took);
  ok(blocked && rc == ES_OK && w.rc == ES_OK && w.got == 1 && w.took < 30,
     "a wait is woken by a commit of another thread (60 s timeout)");
  es_store_release(s);
}

/* --- an update that changes no row, in a group commit -------------------- */

#define GC_APPENDERS 5
#define GC_PER_APPENDER 300
#define GC_JOBS 50

typedef struct {
  es_store *s;
  long id;
  atomic_int *ok_n, *failed;
  char *first_error; /* 256 bytes, written by the first failure */
} gc_appender;

static void *gc_append(void *arg) {
  gc_appender *a = arg;
  char sess[32];
  snprintf(sess, sizeof sess, "a%ld", a->id);
  for (int i = 0; i < GC_PER_APPENDER; i++) {
    es_new_event e;
    es_new_event_init(&e);
    e.type = "ok";
    e.settled = 1;
    int pending;
    es_err err = {0};
    if (es_store_append(a->s, sess, &e, 1, ES_NONE, ES_NONE, NULL, &pending, &err) != ES_OK) {
      if (atomic_fetch_add(a->failed, 1) == 0) snprintf(a->first_error, 256, "%.200s", err.msg);
    } else {
      atomic_fetch_add(a->ok_n, 1);
    }
  }
  return NULL;
}

typedef struct {
  es_store *s;
  atomic_int *stop;
  int calls, refused, other;
} gc_failer;

/* Claims the jobs and fails each with "skipme", which the trigger makes
 * an update of no row: every such call must fail (STORAGE). */
static void *gc_fail(void *arg) {
  gc_failer *f = arg;
  while (!atomic_load(f->stop)) {
    es_events got;
    int64_t retry_at;
    es_err err = {0};
    if (es_store_claim_next(f->s, "h", 600000, 1, NULL, 0, NULL, 0, &got, &retry_at, &err) != ES_OK) {
      f->other++;
      break;
    }
    for (size_t i = 0; i < got.n; i++) {
      int outcome;
      int64_t failed;
      es_err e2 = {0};
      int rc = es_store_fail(f->s, got.v[i].session, got.v[i].index, got.v[i].attempts, "skipme",
                             100, 0, &outcome, &failed, &e2);
      f->calls++;
      if (rc == ES_STORAGE && strstr(e2.msg, "row to update is gone")) f->refused++;
      else f->other++;
    }
    es_events_destroy(&got);
    if (got.n == 0) usleep(1000);
  }
  return NULL;
}

static void group_commit_unchanged_row(const char *base) {
  char url[1024], schema[96], cmd[4096];
  snprintf(schema, sizeof schema, "c_gc_%ld_%ld", (long)getpid(), (long)time(NULL));
  snprintf(url, sizeof url, "%s%sschema=%s", base, strchr(base, '?') ? "&" : "?", schema);
  if (strchr(base, '\'') || strlen(base) > 1024) {
    skip("ES_PG_URL holds a quote: the psql command line cannot carry it");
    return;
  }
  es_store *s = open_or_die(url);
  if (!s) {
    ok(0, "group commit with an update of no row: open");
    return;
  }
  for (int i = 0; i < GC_JOBS; i++) {
    es_new_event e;
    es_new_event_init(&e);
    e.type = "job";
    int pending;
    es_err err = {0};
    if (es_store_append(s, "jobs", &e, 1, ES_NONE, ES_NONE, NULL, &pending, &err) != ES_OK) {
      printf("# append: %s\n", err.msg);
      ok(0, "group commit with an update of no row: setup");
      es_store_release(s);
      return;
    }
  }
  snprintf(cmd, sizeof cmd,
           "psql '%s' -v ON_ERROR_STOP=1 -Xqc \"CREATE FUNCTION %s.skip() RETURNS trigger AS \\$\\$"
           " BEGIN IF NEW.last_error = 'skipme' THEN RETURN NULL; END IF; RETURN NEW; END"
           " \\$\\$ LANGUAGE plpgsql; CREATE TRIGGER skip BEFORE UPDATE ON %s.events FOR EACH ROW"
           " EXECUTE FUNCTION %s.skip()\"",
           base, schema, schema, schema);
  if (system(cmd) != 0) {
    ok(0, "group commit with an update of no row: psql created the trigger");
    es_store_release(s);
    return;
  }
  atomic_int ok_n = 0, failed = 0, stop = 0;
  char first_error[256] = "";
  gc_appender apps[GC_APPENDERS];
  gc_failer f = {s, &stop, 0, 0, 0};
  pthread_t th[GC_APPENDERS], ft;
  for (long i = 0; i < GC_APPENDERS; i++) {
    apps[i] = (gc_appender){s, i, &ok_n, &failed, first_error};
    pthread_create(&th[i], NULL, gc_append, &apps[i]);
  }
  pthread_create(&ft, NULL, gc_fail, &f);
  for (int i = 0; i < GC_APPENDERS; i++) pthread_join(th[i], NULL);
  atomic_store(&stop, 1);
  pthread_join(ft, NULL);
  printf("# appends: %d ok, %d failed (%s); fail calls: %d refused, %d otherwise\n",
         atomic_load(&ok_n), atomic_load(&failed), first_error, f.refused, f.calls - f.refused);
  ok(atomic_load(&failed) == 0 && atomic_load(&ok_n) == GC_APPENDERS * GC_PER_APPENDER,
     "a caller whose update changes no row does not fail the others of its group commit");
  ok(f.calls > 0 && f.refused == f.calls && f.other == 0,
     "every fail() whose event update changed no row failed (STORAGE)");
  int64_t head = 0, total = 0;
  for (long i = 0; i < GC_APPENDERS; i++) {
    char sess[32];
    es_err err = {0};
    snprintf(sess, sizeof sess, "a%ld", i);
    if (es_store_head(s, sess, &head, &err) == ES_OK) total += head;
  }
  /* the refused fail()s wrote their session row first: none was kept */
  es_sessions list;
  es_err err = {0};
  int64_t jobs_failures = -1;
  if (es_store_sessions(s, "jobs", NULL, 10, &list, &err) == ES_OK) {
    for (size_t i = 0; i < list.n; i++)
      if (!strcmp(list.v[i].session, "jobs")) jobs_failures = list.v[i].failures;
    es_sessions_destroy(&list);
  }
  ok(total == GC_APPENDERS * GC_PER_APPENDER && jobs_failures == 0,
     "every append is kept, and nothing of the refused fail() calls");
  es_store_release(s);
}

/* The number psql prints for `sql` run against `url` (0 when it prints
 * nothing; -1: it failed). */
static long psql_number(const char *url, const char *sql) {
  char cmd[4096], line[64] = "";
  snprintf(cmd, sizeof cmd, "psql '%s' -XAtqc \"%s\"", url, sql);
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  char *got = fgets(line, sizeof line, p);
  int rc = pclose(p);
  return rc != 0 ? -1 : got ? strtol(line, NULL, 10) : 0;
}

/* How many connections database db has (the store handle's: nothing else uses it). */
static long connections(const char *base, const char *db) {
  char sql[256];
  snprintf(sql, sizeof sql, "SELECT count(*) FROM pg_stat_activity WHERE datname = '%s'", db);
  return psql_number(base, sql);
}

static void connection_lending(const char *base) {
  char db[64], url[1200], sql[256];
  if (strchr(base, '\'') || strlen(base) > 1024) {
    skip("ES_PG_URL holds a quote: the psql command line cannot carry it");
    return;
  }
  snprintf(db, sizeof db, "es_lend_%ld", (long)getpid());
  snprintf(sql, sizeof sql, "CREATE DATABASE %s", db);
  if (psql_number(base, sql) != 0) {
    ok(0, "connection lending: psql created a database");
    return;
  }
  int lent_to_read = 0, lent_to_claim = 0, after_both = 0;
  for (int order = 0; order < 2; order++) {
    /* libpq takes dbname from the query string over the URI's path */
    snprintf(url, sizeof url, "%s%sdbname=%s&schema=lend%d", base, strchr(base, '?') ? "&" : "?", db, order);
    es_store *s = open_or_die(url);
    if (!s) break;
    es_new_event e[3];
    new_events(e, 3, "job", NULL);
    int pending;
    es_err err = {0};
    es_events got, claimed;
    int64_t retry;
    int rc = es_store_append(s, order ? "o1" : "o0", e, 3, ES_NONE, ES_NONE, NULL, &pending, &err);
    /* order 0: a claim, then a read; order 1: a read, then a claim */
    for (int step = 0; rc == ES_OK && step < 2; step++) {
      if ((step == 0) == (order == 0)) {
        rc = es_store_claim_next(s, "w", 60000, 1, NULL, 0, NULL, 0, &claimed, &retry, &err);
        if (rc == ES_OK && claimed.n != 1) rc = ES_INVALID_ARGUMENT;
        if (rc == ES_OK) es_events_destroy(&claimed);
      } else {
        rc = es_store_read(s, order ? "o1" : "o0", 0, ES_NONE, ES_NONE, &got, &err);
        if (rc == ES_OK && got.n != 3) rc = ES_INVALID_ARGUMENT;
        if (rc == ES_OK) es_events_destroy(&got);
      }
    }
    long n = rc == ES_OK ? connections(base, db) : -1;
    if (rc != ES_OK) printf("# order %d: %s\n", order, err.msg);
    else printf("# order %d: %ld connections\n", order, n);
    if (order == 0) lent_to_read = n == 2;
    else lent_to_claim = n == 2;
    /* and each pool still serves its own kind after lending */
    rc = es_store_claim_next(s, "w", 60000, 1, NULL, 0, NULL, 0, &claimed, &retry, &err);
    if (rc == ES_OK) {
      after_both += claimed.n == 1;
      es_events_destroy(&claimed);
    }
    if (es_store_read(s, order ? "o1" : "o0", 0, ES_NONE, ES_NONE, &got, &err) == ES_OK) {
      after_both += got.n == 3 && got.v[1].status == ES_STATUS_PENDING && got.v[1].claim_holder;
      es_events_destroy(&got);
    }
    es_store_release(s);
  }
  ok(lent_to_read, "a read after a claim takes the idle claim connection: two connections, not three");
  ok(lent_to_claim, "a claim after a read takes the idle read connection: two connections, not three");
  ok(after_both == 4, "claims and reads go on after their connections were lent");
  snprintf(sql, sizeof sql, "DROP DATABASE %s WITH (FORCE)", db);
  if (psql_number(base, sql) != 0) printf("# could not drop database %s\n", db);
}

int main(void) {
  const char *base = getenv("ES_PG_URL");
  printf("# pg_claims_test: claim transactions and waits on PostgreSQL\n");
  if (!base || !*base) {
    skip("postgres: ES_PG_URL is not set (make test sets it: spec/support/pg_cluster.sh)");
    return tap_done();
  }
  several_handles(base);
  close_wakes_waiter(base);
  commit_wakes_waiter(base);
  group_commit_unchanged_row(base);
  connection_lending(base);
  return tap_done();
}
