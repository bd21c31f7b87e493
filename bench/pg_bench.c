/*
 * pg_bench.c: the store on postgres:// beside raw libpq doing the same
 * work, in the same run (the machine is shared and noisy: only the ratios
 * of one run mean anything).
 *
 *   pg_bench [URL [BIN]]
 *
 * URL: a libpq URI of a database where this program may create schemas
 * (default: $ES_PG_URL, which spec/support/pg_cluster.sh sets); BIN: the
 * eventstore binary (default: ../bin/eventstore next to this program).
 * PG_BENCH_SCALE (default 1) multiplies every duration and size.
 * `make bench` (bench/run.sh) and `make bench-pg` run it on a throwaway
 * server; see bench/README.md, "PostgreSQL".
 *
 * 1. Appends: T threads (1, 4, 16) share one store handle, each appending
 *    batches of B (1, 100) events to its own session for a fixed time.
 *    The raw reference, measured just before each figure with the same
 *    thread count: B = 100: one `COPY ... FROM STDIN` of 100 rows per
 *    transaction; B = 1: one prepared single-row INSERT in autocommit (its
 *    own transaction: one round trip). Raw threads each have their own
 *    connection (a libpq connection serves one thread).
 * 2. Dispatch: N events pre-appended over 100 sessions, then E engines (1,
 *    3) each claim one event, run a trivial handler and complete it, with
 *    no result event or with one (pending, as an engine's handler result
 *    is), until nothing is ready. An engine is a process of its own:
 *      - "C API": a forked process with its own handle looping over
 *        es_store_claim_next + es_store_complete (the store's own cost);
 *      - "binary": `eventstore run --db URL --scripts DIR --workers 1
 *        --until-idle` (Lua handler, engine bookkeeping, process start);
 *    and the raw reference: forked processes, each its own connection,
 *    looping over an `UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP
 *    LOCKED LIMIT 1) RETURNING` claim and an `UPDATE ... SET state =
 *    'done'` (with a result: the INSERT of the result row and that UPDATE
 *    as one statement, a data-modifying WITH, so it stays atomic).
 *
 * Every figure is the median of 3 rounds, each measuring the raw
 * reference and the store one after the other (order alternating), with
 * each round's own ratio printed beside it so the noise shows. Per round:
 * PG_BENCH_SCALE x 0.6 s for an append figure; for a dispatch figure,
 * PG_BENCH_SCALE x 16,000 events for the raw loop and the binary, so that
 * the binary's process start (~80 ms per engine, three of them sharing 2
 * cores with the server) is a small part of what is measured: at 4,000
 * events, three engines' starts were a quarter of the run's wall time. The
 * C API figures, a per-call cost at ~1,200 events/s, keep 4,000 events
 * per round (about 3 minutes in all at scale 1 on 2 cores).
 * PG_BENCH_ONLY=appends or =dispatch runs one of the two.
 *
 * Every schema it makes is named pgb_<pid>_<n> (refused if it exists) and
 * dropped at the end of its round.
 */
#include <errno.h>
#include <libpq-fe.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "store/store.h"

static const char PAYLOAD[] =
    "{\"customer\":\"c-000123\",\"items\":[{\"qty\":2,\"sku\":\"SKU-42\"}],\"note\":\"leave at the door\"}";
#define PAYLOAD_LEN (sizeof PAYLOAD - 1)

#define MAX_THREADS 16
#define MAX_ENGINES 3
#define SESSIONS 100 /* the dispatch events are spread over this many sessions */
#define TTL_MS 30000

static const char *base_url; /* the database (libpq URI, without schema=) */
static double scale = 1.0;
static int schema_seq;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("pg_bench: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}

/* A fresh schema name for this run; the pid keeps two runs on one database
 * apart (and schema_must_be_free checks it). */
static void schema_name(char out[64]) { snprintf(out, 64, "pgb_%ld_%d", (long)getpid(), ++schema_seq); }

/* The store's URL: the database's, plus schema=NAME. */
static char *store_url(const char *schema) {
  size_t n = strlen(base_url) + strlen(schema) + 16;
  char *u = malloc(n);
  if (!u) die("out of memory");
  snprintf(u, n, "%s%cschema=%s", base_url, strchr(base_url, '?') ? '&' : '?', schema);
  return u;
}

/* ---- raw libpq ---------------------------------------------------------- */

static void quiet(void *arg, const char *msg) {
  (void)arg;
  (void)msg;
}

static PGconn *raw_connect(void) {
  PGconn *c = PQconnectdb(base_url);
  if (PQstatus(c) != CONNECTION_OK) die("cannot connect to %s: %s", base_url, PQerrorMessage(c));
  PQsetNoticeProcessor(c, quiet, NULL);
  return c;
}

static void raw_exec(PGconn *c, const char *sql) {
  PGresult *r = PQexec(c, sql);
  ExecStatusType st = PQresultStatus(r);
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) die("%s: %s", sql, PQerrorMessage(c));
  PQclear(r);
}

static void raw_prepare(PGconn *c, const char *name, const char *sql) {
  PGresult *r = PQprepare(c, name, sql, 0, NULL);
  if (PQresultStatus(r) != PGRES_COMMAND_OK) die("prepare %s: %s", sql, PQerrorMessage(c));
  PQclear(r);
}

/* Refuses a name that exists: DROP SCHEMA ... CASCADE at the end must only
 * ever drop what this run made. */
static void schema_must_be_free(PGconn *c, const char *schema) {
  const char *v[1] = {schema};
  PGresult *r = PQexecParams(c, "SELECT 1 FROM pg_namespace WHERE nspname = $1", 1, NULL, v, NULL, NULL, 0);
  if (PQresultStatus(r) != PGRES_TUPLES_OK) die("pg_namespace: %s", PQerrorMessage(c));
  if (PQntuples(r) != 0) die("schema %s exists already; not touching it", schema);
  PQclear(r);
}

static void drop_schema(const char *schema) {
  PGconn *c = raw_connect();
  char sql[128];
  snprintf(sql, sizeof sql, "DROP SCHEMA \"%s\" CASCADE", schema);
  raw_exec(c, sql);
  PQfinish(c);
}

/* A UUID-shaped id (36 bytes, like the store's UUIDv7s), unique per (a, b). */
static void raw_id(char out[40], unsigned a, unsigned long b) {
  snprintf(out, 40, "0190f1c2-%04x-7000-8000-%012lx", a & 0xffff, b & 0xffffffffffffUL);
}

/* Microseconds per round trip: a prepared `SELECT 1`, the floor of any
 * statement. Printed to show how slow the socket is in this run (on a
 * shared machine it varies several-fold from run to run). */
static double round_trip_us(int n) {
  PGconn *c = raw_connect();
  raw_prepare(c, "one", "SELECT 1");
  double t0 = now_s();
  for (int i = 0; i < n; i++) {
    PGresult *r = PQexecPrepared(c, "one", 0, NULL, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) die("SELECT 1: %s", PQerrorMessage(c));
    PQclear(r);
  }
  double us = (now_s() - t0) * 1e6 / n;
  PQfinish(c);
  return us;
}

/* ---- appends ------------------------------------------------------------ */

typedef struct {
  int kind; /* APPEND_STORE, APPEND_COPY, APPEND_INSERT */
  es_store *s;
  const char *schema;
  int batch;
  int thread;
  double seconds;
  pthread_barrier_t *start;
  double *t0; /* written by thread 0 after the barrier */
  atomic_long *events;
} writer;

enum { APPEND_STORE, APPEND_COPY, APPEND_INSERT };

static void store_write_loop(writer *w, double until) {
  es_new_event evs[100];
  for (int i = 0; i < w->batch; i++) {
    es_new_event_init(&evs[i]);
    evs[i].type = "order.placed";
    evs[i].payload = PAYLOAD;
    evs[i].payload_len = PAYLOAD_LEN;
    evs[i].settled = 1;
  }
  char session[32];
  snprintf(session, sizeof session, "writer-%d", w->thread);
  while (now_s() < until) {
    int pending;
    es_err err = {0};
    if (es_store_append(w->s, session, evs, (size_t)w->batch, ES_NONE, ES_NONE, NULL, &pending, &err))
      die("append: %s: %s", es_strerror(err.code), err.msg);
    atomic_fetch_add(w->events, w->batch);
  }
}

/* COPY in text format: the payload holds no tab, newline nor backslash, so
 * it goes as is. */
static void copy_write_loop(writer *w, PGconn *c, double until) {
  char sql[200];
  snprintf(sql, sizeof sql, "COPY \"%s\".events(session, idx, id, type, payload, created_at) FROM STDIN",
           w->schema);
  char session[32];
  snprintf(session, sizeof session, "writer-%d", w->thread);
  char *buf = malloc((size_t)w->batch * 256);
  if (!buf) die("out of memory");
  long idx = 0;
  while (now_s() < until) {
    size_t len = 0;
    int64_t at = now_ms();
    for (int i = 0; i < w->batch; i++) {
      char id[40];
      idx++;
      raw_id(id, (unsigned)w->thread, (unsigned long)idx);
      len += (size_t)sprintf(buf + len, "%s\t%ld\t%s\torder.placed\t%s\t%lld\n", session, idx, id, PAYLOAD,
                             (long long)at);
    }
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_COPY_IN) die("%s: %s", sql, PQerrorMessage(c));
    PQclear(r);
    if (PQputCopyData(c, buf, (int)len) != 1 || PQputCopyEnd(c, NULL) != 1) die("COPY: %s", PQerrorMessage(c));
    while ((r = PQgetResult(c))) {
      if (PQresultStatus(r) != PGRES_COMMAND_OK) die("COPY: %s", PQerrorMessage(c));
      PQclear(r);
    }
    atomic_fetch_add(w->events, w->batch);
  }
  free(buf);
}

static void insert_write_loop(writer *w, PGconn *c, double until) {
  char sql[200];
  snprintf(sql, sizeof sql,
           "INSERT INTO \"%s\".events(session, idx, id, type, payload, created_at) VALUES ($1, $2, $3, "
           "'order.placed', $4, $5)",
           w->schema);
  raw_prepare(c, "ins", sql);
  char session[32];
  snprintf(session, sizeof session, "writer-%d", w->thread);
  long idx = 0;
  while (now_s() < until) {
    char id[40], ix[24], at[24];
    idx++;
    raw_id(id, (unsigned)w->thread, (unsigned long)idx);
    snprintf(ix, sizeof ix, "%ld", idx);
    snprintf(at, sizeof at, "%lld", (long long)now_ms());
    const char *v[5] = {session, ix, id, PAYLOAD, at};
    PGresult *r = PQexecPrepared(c, "ins", 5, v, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) die("INSERT: %s", PQerrorMessage(c));
    PQclear(r);
    atomic_fetch_add(w->events, 1);
  }
}

static void *write_main(void *arg) {
  writer *w = arg;
  PGconn *c = w->kind == APPEND_STORE ? NULL : raw_connect();
  /* every thread is connected before the clock starts, as the store's
   * connection is opened before it */
  pthread_barrier_wait(w->start);
  if (w->thread == 0) *w->t0 = now_s();
  double until = now_s() + w->seconds;
  if (w->kind == APPEND_STORE) store_write_loop(w, until);
  else if (w->kind == APPEND_COPY) copy_write_loop(w, c, until);
  else insert_write_loop(w, c, until);
  if (c) PQfinish(c);
  return NULL;
}

/* events/s of `threads` writers for `seconds`, each in its own session. */
static double appends(int kind, int threads, int batch, double seconds) {
  char schema[64];
  schema_name(schema);
  PGconn *admin = raw_connect();
  schema_must_be_free(admin, schema);
  es_store *s = NULL;
  if (kind == APPEND_STORE) {
    char *url = store_url(schema);
    es_err err = {0};
    if (es_store_open(url, NULL, &s, &err)) die("open %s: %s: %s", url, es_strerror(err.code), err.msg);
    free(url);
  } else {
    /* the store's events table without its dispatch columns: the same
     * keys (position, id, session + index) */
    char sql[600];
    snprintf(sql, sizeof sql,
             "CREATE SCHEMA \"%s\"; CREATE TABLE \"%s\".events("
             " position BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
             " session TEXT COLLATE \"C\" NOT NULL, idx BIGINT NOT NULL,"
             " id TEXT COLLATE \"C\" NOT NULL UNIQUE, type TEXT COLLATE \"C\" NOT NULL,"
             " payload TEXT NOT NULL, created_at BIGINT NOT NULL, UNIQUE(session, idx))",
             schema, schema);
    raw_exec(admin, sql);
  }
  PQfinish(admin);
  atomic_long events = 0;
  pthread_t tid[MAX_THREADS];
  writer w[MAX_THREADS];
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, (unsigned)threads);
  double t0 = 0;
  for (int i = 0; i < threads; i++) {
    w[i] = (writer){kind, s, schema, batch, i, seconds, &start, &t0, &events};
    if (pthread_create(&tid[i], NULL, write_main, &w[i])) die("pthread_create failed");
  }
  for (int i = 0; i < threads; i++) pthread_join(tid[i], NULL);
  double rate = (double)atomic_load(&events) / (now_s() - t0);
  pthread_barrier_destroy(&start);
  if (s) es_store_release(s);
  drop_schema(schema);
  return rate;
}

/* ---- dispatch ----------------------------------------------------------- */

/* Forked workers: each writes one byte on `ready` once connected, waits
 * for one byte on `go`, works, and writes its count on `done`. */
typedef struct {
  int ready[2], go[2], done[2];
} pipes;

static void pipes_open(pipes *p) {
  if (pipe(p->ready) || pipe(p->go) || pipe(p->done)) die("pipe: %s", strerror(errno));
}

/* Each side closes the ends it does not use, so that an end of file tells
 * the other side that it is gone. */
static void pipes_child(pipes *p) {
  close(p->ready[0]);
  close(p->go[1]);
  close(p->done[0]);
}

static void pipes_parent(pipes *p) {
  close(p->ready[1]);
  close(p->go[0]);
  close(p->done[1]);
}

static void pipes_close(pipes *p) {
  close(p->ready[0]);
  close(p->go[1]);
  close(p->done[0]);
}

static void child_ready_then_wait(pipes *p) {
  char b = 1;
  if (write(p->ready[1], &b, 1) != 1 || read(p->go[0], &b, 1) != 1) _exit(3);
}

static void child_report(pipes *p, long n) {
  if (write(p->done[1], &n, sizeof n) != (ssize_t)sizeof n) _exit(3);
}

/* One byte from an engine that is getting ready; an engine that died
 * before (it printed why) must not leave the bench waiting for ever. */
static void wait_ready(pipes *p) {
  struct pollfd pf = {.fd = p->ready[0], .events = POLLIN};
  char b;
  if (poll(&pf, 1, 60000) != 1 || read(p->ready[0], &b, 1) != 1) die("an engine did not get ready");
}

/* One engine of the C API: claim one, complete it (with `result` events
 * appended), until nothing is ready. */
static long store_engine(const char *url, int id, int result, pipes *p) {
  es_store *s;
  es_err err = {0};
  if (es_store_open(url, NULL, &s, &err)) {
    fprintf(stderr, "pg_bench: engine open: %s\n", err.msg);
    _exit(2);
  }
  char holder[32];
  snprintf(holder, sizeof holder, "engine-%d", id);
  static const char *const types[1] = {"job"}; /* as an engine names the types it has handlers for */
  es_new_event out;
  es_new_event_init(&out);
  out.type = "job.done";
  out.payload = PAYLOAD;
  out.payload_len = PAYLOAD_LEN;
  child_ready_then_wait(p);
  long n = 0;
  for (;;) {
    es_events got, done;
    int64_t retry;
    int outcome;
    if (es_store_claim_next(s, holder, TTL_MS, 1, types, 1, NULL, 0, &got, &retry, &err)) {
      fprintf(stderr, "pg_bench: claim_next: %s: %s\n", es_strerror(err.code), err.msg);
      _exit(2);
    }
    if (got.n == 0) {
      es_events_destroy(&got);
      break;
    }
    if (es_store_complete(s, got.v[0].session, got.v[0].index, got.v[0].attempts, &out, result ? 1 : 0,
                          ES_NONE, &outcome, &done, &err) ||
        outcome != ES_COMPLETED) {
      fprintf(stderr, "pg_bench: complete: %s: %s\n", es_strerror(err.code), err.msg);
      _exit(2);
    }
    es_events_destroy(&got);
    es_events_destroy(&done);
    n++;
  }
  es_store_release(s);
  return n;
}

/* One raw engine: the SKIP LOCKED loop on its own connection. */
static long raw_engine(const char *schema, int id, int result, pipes *p) {
  PGconn *c = raw_connect();
  char sql[600];
  snprintf(sql, sizeof sql,
           "UPDATE \"%s\".jobs SET state = 'claimed', holder = $1, expires = $2 WHERE id = ("
           "SELECT id FROM \"%s\".jobs WHERE state = 'ready' ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1)"
           " RETURNING id, session, idx, payload",
           schema, schema);
  raw_prepare(c, "claim", sql);
  snprintf(sql, sizeof sql, "UPDATE \"%s\".jobs SET state = 'done' WHERE id = $1", schema);
  raw_prepare(c, "done", sql);
  snprintf(sql, sizeof sql,
           "WITH r AS (INSERT INTO \"%s\".results(job, session, id, type, payload, created_at)"
           " VALUES ($1, $2, $3, 'job.done', $4, $5))"
           " UPDATE \"%s\".jobs SET state = 'done' WHERE id = $1",
           schema, schema);
  raw_prepare(c, "done_result", sql);
  char holder[32];
  snprintf(holder, sizeof holder, "engine-%d", id);
  child_ready_then_wait(p);
  long n = 0;
  for (;;) {
    char expires[24];
    snprintf(expires, sizeof expires, "%lld", (long long)(now_ms() + TTL_MS));
    const char *cv[2] = {holder, expires};
    PGresult *r = PQexecPrepared(c, "claim", 2, cv, NULL, NULL, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) die("claim: %s", PQerrorMessage(c));
    if (PQntuples(r) == 0) {
      PQclear(r);
      break;
    }
    char job[24];
    snprintf(job, sizeof job, "%s", PQgetvalue(r, 0, 0));
    PGresult *d;
    if (result) {
      char rid[40], at[24];
      raw_id(rid, (unsigned)id, (unsigned long)strtoll(job, NULL, 10));
      snprintf(at, sizeof at, "%lld", (long long)now_ms());
      const char *dv[5] = {job, PQgetvalue(r, 0, 1), rid, PAYLOAD, at};
      d = PQexecPrepared(c, "done_result", 5, dv, NULL, NULL, 0);
    } else {
      const char *dv[1] = {job};
      d = PQexecPrepared(c, "done", 1, dv, NULL, NULL, 0);
    }
    if (PQresultStatus(d) != PGRES_COMMAND_OK) die("done: %s", PQerrorMessage(c));
    PQclear(d);
    PQclear(r);
    n++;
  }
  PQfinish(c);
  return n;
}

/* CPU seconds (user + system) a child used, from wait4. */
static double cpu_s(const struct rusage *ru) {
  return (double)(ru->ru_utime.tv_sec + ru->ru_stime.tv_sec) +
         (double)(ru->ru_utime.tv_usec + ru->ru_stime.tv_usec) / 1e6;
}

/* Runs `engines` forked engines over `n` events; events/s from the moment
 * all are ready to the last one's exit; *cpu: the CPU seconds the engines
 * used (the client side; the rest of the time is the server's and the
 * socket's). Every event must be handled once. */
static double fork_engines(int raw, const char *url_or_schema, int engines, int result, long n, double *cpu) {
  pipes p;
  pipes_open(&p);
  pid_t pid[MAX_ENGINES];
  fflush(NULL);
  for (int i = 0; i < engines; i++) {
    pid[i] = fork();
    if (pid[i] < 0) die("fork: %s", strerror(errno));
    if (pid[i] == 0) {
      pipes_child(&p);
      long got = raw ? raw_engine(url_or_schema, i, result, &p) : store_engine(url_or_schema, i, result, &p);
      child_report(&p, got);
      _exit(0);
    }
  }
  pipes_parent(&p);
  for (int i = 0; i < engines; i++) wait_ready(&p);
  char b = 1;
  double t0 = now_s();
  for (int i = 0; i < engines; i++)
    if (write(p.go[1], &b, 1) != 1) die("go: %s", strerror(errno));
  int failed = 0;
  *cpu = 0;
  for (int i = 0; i < engines; i++) {
    int st;
    struct rusage ru;
    if (wait4(pid[i], &st, 0, &ru) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) failed = 1;
    else *cpu += cpu_s(&ru);
  }
  double t = now_s() - t0;
  if (failed) die("an engine failed");
  long total = 0;
  for (int i = 0; i < engines; i++) {
    long k;
    if (read(p.done[0], &k, sizeof k) != (ssize_t)sizeof k) die("an engine did not report");
    total += k;
  }
  pipes_close(&p);
  if (total != n) die("%s engines handled %ld events of %ld", raw ? "raw" : "store", total, n);
  return (double)n / t;
}

/* The store's schema with n pending "job" events over SESSIONS sessions,
 * appended in batches of 100 (not timed). */
static char *store_fill(const char *schema, long n) {
  PGconn *admin = raw_connect();
  schema_must_be_free(admin, schema);
  PQfinish(admin);
  char *url = store_url(schema);
  es_store *s;
  es_err err = {0};
  if (es_store_open(url, NULL, &s, &err)) die("open %s: %s", url, err.msg);
  es_new_event evs[100];
  for (int i = 0; i < 100; i++) {
    es_new_event_init(&evs[i]);
    evs[i].type = "job";
    evs[i].payload = PAYLOAD;
    evs[i].payload_len = PAYLOAD_LEN;
  }
  for (long done = 0; done < n;) {
    long k = n - done < 100 ? n - done : 100;
    char session[32];
    snprintf(session, sizeof session, "s-%ld", (done / 100) % SESSIONS);
    int pending;
    if (es_store_append(s, session, evs, (size_t)k, ES_NONE, ES_NONE, NULL, &pending, &err))
      die("fill: %s", err.msg);
    done += k;
  }
  es_store_release(s);
  /* statistics, as for the raw table (the bench cluster runs without
   * autovacuum, which would take them on a real server) */
  PGconn *c = raw_connect();
  char sql[128];
  snprintf(sql, sizeof sql, "ANALYZE \"%s\".events", schema);
  raw_exec(c, sql);
  PQfinish(c);
  return url;
}

/* The raw side's jobs table with n ready rows (COPY, not timed). The
 * partial index is what a user of this loop adds (the store has its
 * own: events_queued); without it each claim walks past the done rows. */
static void raw_fill(const char *schema, long n) {
  PGconn *c = raw_connect();
  schema_must_be_free(c, schema);
  char sql[1000];
  snprintf(sql, sizeof sql,
           "CREATE SCHEMA \"%s\";"
           "CREATE TABLE \"%s\".jobs(id BIGINT PRIMARY KEY, session TEXT COLLATE \"C\" NOT NULL,"
           " idx BIGINT NOT NULL, type TEXT COLLATE \"C\" NOT NULL, payload TEXT NOT NULL,"
           " state TEXT NOT NULL, holder TEXT, expires BIGINT, UNIQUE(session, idx));"
           "CREATE INDEX jobs_ready ON \"%s\".jobs(id) WHERE state = 'ready';"
           "CREATE TABLE \"%s\".results(position BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
           " job BIGINT NOT NULL, session TEXT COLLATE \"C\" NOT NULL, id TEXT COLLATE \"C\" NOT NULL UNIQUE,"
           " type TEXT COLLATE \"C\" NOT NULL, payload TEXT NOT NULL, created_at BIGINT NOT NULL)",
           schema, schema, schema, schema);
  raw_exec(c, sql);
  snprintf(sql, sizeof sql, "COPY \"%s\".jobs(id, session, idx, type, payload, state) FROM STDIN", schema);
  PGresult *r = PQexec(c, sql);
  if (PQresultStatus(r) != PGRES_COPY_IN) die("%s: %s", sql, PQerrorMessage(c));
  PQclear(r);
  for (long i = 0; i < n; i++) {
    char line[300];
    /* the same session/index layout as store_fill */
    int len = snprintf(line, sizeof line, "%ld\ts-%ld\t%ld\tjob\t%s\tready\n", i + 1, (i / 100) % SESSIONS,
                       (i / (100 * SESSIONS)) * 100 + i % 100 + 1, PAYLOAD);
    if (PQputCopyData(c, line, len) != 1) die("COPY: %s", PQerrorMessage(c));
  }
  if (PQputCopyEnd(c, NULL) != 1) die("COPY: %s", PQerrorMessage(c));
  while ((r = PQgetResult(c))) {
    if (PQresultStatus(r) != PGRES_COMMAND_OK) die("COPY jobs: %s", PQerrorMessage(c));
    PQclear(r);
  }
  snprintf(sql, sizeof sql, "ANALYZE \"%s\".jobs", schema);
  raw_exec(c, sql);
  PQfinish(c);
}

/* ---- the real binary ---------------------------------------------------- */

static const char *bin_path;
static char scripts_none[256], scripts_one[256];

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f || fputs(text, f) < 0 || fclose(f)) die("cannot write %s", path);
}

static void make_scripts(char dir[256], const char *handler) {
  snprintf(dir, 256, "%s/pg_bench.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : P_tmpdir);
  if (!mkdtemp(dir)) die("mkdtemp: %s", strerror(errno));
  char p[300];
  snprintf(p, sizeof p, "%s/handlers", dir);
  if (mkdir(p, 0755)) die("mkdir %s: %s", p, strerror(errno));
  snprintf(p, sizeof p, "%s/handlers/job.lua", dir);
  write_file(p, handler);
}

static void remove_scripts(const char *dir) {
  char p[300];
  snprintf(p, sizeof p, "%s/handlers/job.lua", dir);
  unlink(p);
  snprintf(p, sizeof p, "%s/handlers", dir);
  rmdir(p);
  rmdir(dir);
}

/* Starts `engines` `eventstore run ... --until-idle` at once and waits for
 * them; returns the wall time and adds up the "handled N" of their
 * summaries into *handled. Their output goes to files, shown on failure. */
static double run_binary(const char *url, const char *scripts, int engines, long *handled, double *cpu) {
  pid_t pid[MAX_ENGINES];
  char out[MAX_ENGINES][300], errf[MAX_ENGINES][300];
  fflush(NULL);
  double t0 = now_s();
  for (int i = 0; i < engines; i++) {
    snprintf(out[i], sizeof out[i], "%s/out.%d", scripts, i);
    snprintf(errf[i], sizeof errf[i], "%s/err.%d", scripts, i);
    pid[i] = fork();
    if (pid[i] < 0) die("fork: %s", strerror(errno));
    if (pid[i] == 0) {
      if (!freopen(out[i], "w", stdout) || !freopen(errf[i], "w", stderr)) _exit(126);
      execl(bin_path, bin_path, "run", "--db", url, "--scripts", scripts, "--workers", "1", "--until-idle",
            (char *)NULL);
      fprintf(stderr, "exec %s: %s\n", bin_path, strerror(errno));
      _exit(127);
    }
  }
  int failed = 0;
  *cpu = 0;
  for (int i = 0; i < engines; i++) {
    int st;
    struct rusage ru;
    if (wait4(pid[i], &st, 0, &ru) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) failed = 1;
    else *cpu += cpu_s(&ru);
  }
  double t = now_s() - t0;
  *handled = 0;
  for (int i = 0; i < engines; i++) {
    char line[512] = "";
    FILE *f = fopen(out[i], "r");
    long h = -1;
    if (f) {
      while (fgets(line, sizeof line, f))
        if (sscanf(line, "handled %ld", &h) == 1) break;
      fclose(f);
    }
    if (failed || h < 0) {
      fprintf(stderr, "pg_bench: %s run (engine %d) failed; its stderr:\n", bin_path, i);
      if ((f = fopen(errf[i], "r"))) {
        while (fgets(line, sizeof line, f)) fputs(line, stderr);
        fclose(f);
      }
      exit(1);
    }
    *handled += h;
    unlink(out[i]);
    unlink(errf[i]);
  }
  return t;
}

/* ---- main --------------------------------------------------------------- */

#define ROUNDS 3 /* every figure is the median of this many rounds */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(const double *v, int n) {
  double t[16];
  memcpy(t, v, (size_t)n * sizeof *t);
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

static void section(const char *title) {
  printf("\n# %s\n%-56s %10s %7s  %s\n", title, "# what", "events/s", "vs raw", "per-round ratios");
  fflush(stdout);
}

/* A reference line (raw) or a store line: the medians of the rounds, their
 * ratio, and each round's own ratio (store / the raw figure of that round),
 * so that the noise shows. */
static void figure(const char *what, const double *v, const double *raw) {
  double m = median(v, ROUNDS);
  if (!raw) {
    printf("%-56s %10.0f %7s\n", what, m, "1.00");
  } else {
    printf("%-56s %10.0f %7.2f  ", what, m, m / median(raw, ROUNDS));
    for (int r = 0; r < ROUNDS; r++) printf("%s%.2f", r ? " " : "", v[r] / raw[r]);
    putchar('\n');
  }
  fflush(stdout);
}

static double dispatch_raw(int engines, int result, long n, double *cpu) {
  char schema[64];
  schema_name(schema);
  raw_fill(schema, n);
  double rate = fork_engines(1, schema, engines, result, n, cpu);
  drop_schema(schema);
  return rate;
}

static double dispatch_api(int engines, int result, long n, double *cpu) {
  char schema[64];
  schema_name(schema);
  char *url = store_fill(schema, n);
  double rate = fork_engines(0, url, engines, result, n, cpu);
  free(url);
  drop_schema(schema);
  return rate;
}

static double dispatch_bin(int engines, int result, long n, double *cpu) {
  char schema[64];
  schema_name(schema);
  char *url = store_fill(schema, n);
  long handled;
  double t = run_binary(url, result ? scripts_one : scripts_none, engines, &handled, cpu);
  free(url);
  drop_schema(schema);
  if (handled != n) die("eventstore run handled %ld events of %ld", handled, n);
  return (double)n / t;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN); /* an engine gone: a failed write, said as such */
  base_url = argc > 1 ? argv[1] : getenv("ES_PG_URL");
  if (!base_url || !*base_url)
    die("usage: pg_bench URL [BIN] (or ES_PG_URL set; `make bench-pg` starts a throwaway server)");
  static char bin[1024];
  if (argc > 2) {
    bin_path = argv[2];
  } else {
    const char *slash = strrchr(argv[0], '/');
    snprintf(bin, sizeof bin, "%.*s../bin/eventstore", slash ? (int)(slash - argv[0] + 1) : 0, argv[0]);
    bin_path = bin;
  }
  if (access(bin_path, X_OK)) die("%s: %s (give the eventstore binary as the second argument)", bin_path,
                                  strerror(errno));
  const char *sc = getenv("PG_BENCH_SCALE");
  if (sc && *sc) {
    char *end;
    scale = strtod(sc, &end);
    if (*end || !(scale > 0 && scale <= 100)) die("PG_BENCH_SCALE must be a number in (0, 100]: %s", sc);
  }
  double seconds = 0.6 * scale; /* per round of an append figure */
  /* events per round of a dispatch figure: the raw loop and the binary, the C API */
  long n = (long)(16000 * scale), n_api = (long)(4000 * scale);
  if (n < 100) n = 100;
  if (n_api < 100) n_api = 100;
  /* PG_BENCH_ONLY=appends|dispatch runs one part (to rerun one table) */
  const char *only = getenv("PG_BENCH_ONLY");
  if (only && *only && strcmp(only, "appends") && strcmp(only, "dispatch"))
    die("PG_BENCH_ONLY must be appends or dispatch: %s", only);
  int do_appends = !only || !*only || !strcmp(only, "appends");
  int do_dispatch = !only || !*only || !strcmp(only, "dispatch");

  PGconn *c = raw_connect();
  PGresult *r = PQexec(c, "SELECT current_setting('server_version'), current_setting('fsync'),"
                          " current_setting('synchronous_commit')");
  if (PQresultStatus(r) != PGRES_TUPLES_OK) die("server settings: %s", PQerrorMessage(c));
  printf("# pg_bench: PostgreSQL %s (fsync=%s, synchronous_commit=%s), PG_BENCH_SCALE=%g\n",
         PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1), PQgetvalue(r, 0, 2), scale);
  PQclear(r);
  PQfinish(c);
  double rts[ROUNDS];
  for (int k = 0; k < ROUNDS; k++) rts[k] = round_trip_us(500);
  double rt = median(rts, ROUNDS);
  printf("# one round trip (a prepared SELECT 1 on this connection): %.1f us\n", rt);
  printf("# Each figure is the median of %d rounds; each round measures the raw reference and the\n"
         "# store one after the other (the order alternates). Compare the ratios (store / raw),\n"
         "# not absolute figures across runs.\n",
         ROUNDS);

  char title[200], what[100];
  snprintf(title, sizeof title,
           "appends: T threads sharing one store handle, each to its own session, %.1f s per round", seconds);
  if (do_appends) section(title);
  static const int threads[] = {1, 4, 16};
  for (int b = 0; b < 2 && do_appends; b++) {
    int batch = b ? 100 : 1;
    for (int t = 0; t < 3; t++) {
      int th = threads[t];
      double raw[ROUNDS], st[ROUNDS];
      for (int k = 0; k < ROUNDS; k++) {
        int raw_kind = batch == 1 ? APPEND_INSERT : APPEND_COPY;
        if (k % 2 == 0) raw[k] = appends(raw_kind, th, batch, seconds);
        st[k] = appends(APPEND_STORE, th, batch, seconds);
        if (k % 2 == 1) raw[k] = appends(raw_kind, th, batch, seconds);
      }
      snprintf(what, sizeof what, "raw %s, %d thread%s (%s)", batch == 1 ? "INSERT" : "COPY", th,
               th > 1 ? "s" : "", batch == 1 ? "1 row, autocommit" : "100 rows per COPY");
      figure(what, raw, NULL);
      snprintf(what, sizeof what, "es_store_append, %d thread%s, batch of %d", th, th > 1 ? "s" : "", batch);
      figure(what, st, raw);
    }
  }

  if (!do_dispatch) return 0;
  printf("\n# dispatch: %ld pending events (over %d sessions) per round, %ld for the C API; each\n"
         "# engine claims one, runs a trivial handler and completes it (\"+1 result\": appending\n"
         "# one pending event, raw: inserting one row), until none is ready. Every event handled\n"
         "# exactly once.\n",
         n, SESSIONS, n_api);
  section("dispatch: E engines, each its own process and connection");
  make_scripts(scripts_none, "return function(e) return nil end\n");
  make_scripts(scripts_one, "return function(e) return {{type = \"job.done\", payload = e.payload}} end\n");
  /* an idle run (nothing pending): the process start, open and exit that
   * every binary figure includes */
  char schema[64];
  schema_name(schema);
  char *url = store_fill(schema, 0);
  long handled;
  double idle_cpu;
  double idle = run_binary(url, scripts_none, 1, &handled, &idle_cpu);
  free(url);
  drop_schema(schema);
  static const int engine_counts[] = {1, 3};
  /* one engine: time and client CPU per event, [result][raw, C API, binary] */
  double us[2][3], cpu_us[2][3];
  for (int result = 0; result < 2; result++) {
    for (int e = 0; e < 2; e++) {
      int engines = engine_counts[e];
      double rate[3][ROUNDS], cpu[3][ROUNDS];
      for (int k = 0; k < ROUNDS; k++) {
        for (int j = 0; j < 3; j++) { /* the order rotates from round to round */
          int w = (j + k) % 3;
          if (w == 0) rate[w][k] = dispatch_raw(engines, result, n, &cpu[w][k]);
          else if (w == 1) rate[w][k] = dispatch_api(engines, result, n_api, &cpu[w][k]);
          else rate[w][k] = dispatch_bin(engines, result, n, &cpu[w][k]);
          if (w == 2) cpu[w][k] -= idle_cpu; /* the process start, as measured idle */
        }
      }
      const char *res = result ? "+1 result" : "no result";
      const char *es = engines > 1 ? "s" : "";
      snprintf(what, sizeof what, "raw SKIP LOCKED loop, %d engine%s, %s", engines, es, res);
      figure(what, rate[0], NULL);
      snprintf(what, sizeof what, "C API claim_next+complete, %d engine%s, %s", engines, es, res);
      figure(what, rate[1], rate[0]);
      snprintf(what, sizeof what, "eventstore run, %d engine%s, %s", engines, es, res);
      figure(what, rate[2], rate[0]);
      if (engines == 1) {
        for (int w = 0; w < 3; w++) {
          us[result][w] = 1e6 / median(rate[w], ROUNDS);
          cpu_us[result][w] = median(cpu[w], ROUNDS) * 1e6 / (double)(w == 1 ? n_api : n);
        }
      }
    }
  }
  remove_scripts(scripts_none);
  remove_scripts(scripts_one);
  printf("# (\"eventstore run\" figures include starting the process: an idle run took %.0f ms)\n",
         idle * 1000);
  printf("\n# one engine: wall time per event, and the engine process's own CPU time per event\n"
         "# (user + system; the rest is the server's work and the waits for its answers):\n");
  for (int result = 0; result < 2; result++)
    printf("#   %s: raw loop %.0f us (CPU %.0f us), C API %.0f us (CPU %.0f us), eventstore run %.0f us"
           " (CPU %.0f us, without the idle run's)\n",
           result ? "+1 result" : "no result", us[result][0], cpu_us[result][0], us[result][1],
           cpu_us[result][1], us[result][2], cpu_us[result][2]);
  return 0;
}
