/*
 * raw_queue.h: a work queue written by hand in plain SQLite, the reference
 * the benches put the engine's sqlite: dispatch beside (dispatch_bench's
 * "raw SQLite" figures, redis_bench's `rawqueue` bound). Header-only, for
 * the bench programs: each includes it once.
 *
 * The least a durable queue can be in SQLite: a jobs table with a partial
 * index on its ready rows; a claim is one UPDATE ... RETURNING of the
 * oldest ready rows (holder, expiry, attempts), a completion an UPDATE of
 * one row checked against its attempt. No session row, no lanes, no
 * per-type or per-session order, no counts, no JSON check.
 */
#ifndef ES_BENCH_RAW_QUEUE_H
#define ES_BENCH_RAW_QUEUE_H

#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define RAW_QUEUE_MAX_BATCH 1024

typedef struct raw_queue {
  const char *path;    /* the database file (made afresh by the caller) */
  const char *payload; /* every job's */
  size_t payload_len;
  long n;       /* jobs filled before the timed part */
  int sessions; /* jobs go to this many sessions in turn, 100 at a time */
  /* 1: every claim and every completion its own synced commit; more: claims
   * of up to `batch` rows committed with synchronous=NORMAL, their
   * completions in one synced commit (the durability rule the engine uses,
   * docs/sqlite.md "Claims and power loss") */
  int batch;
  size_t payload_bytes; /* out: read, so payloads are fetched as a handler's would be */
  char err[256];        /* out: what failed, when raw_queue_run returns < 0 */
} raw_queue;

static double raw_queue_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Runs sql; on failure says so in q->err and returns -1. */
static int raw_queue_sql(raw_queue *q, sqlite3 *db, const char *sql) {
  char *msg = NULL;
  if (sqlite3_exec(db, sql, NULL, NULL, &msg) == SQLITE_OK) return 0;
  snprintf(q->err, sizeof q->err, "%s: %s", sql, msg ? msg : "?");
  sqlite3_free(msg);
  return -1;
}

static int raw_queue_fail(raw_queue *q, sqlite3 *db, const char *what) {
  snprintf(q->err, sizeof q->err, "%s: %s", what, sqlite3_errmsg(db));
  return -1;
}

static int raw_queue_fill(raw_queue *q, sqlite3 *db) {
  if (raw_queue_sql(q, db,
                    "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
                    "CREATE TABLE jobs(id INTEGER PRIMARY KEY, session TEXT NOT NULL, idx INTEGER NOT NULL,"
                    " type TEXT NOT NULL, payload BLOB NOT NULL, state INTEGER NOT NULL DEFAULT 0,"
                    " holder TEXT, expires INTEGER, attempts INTEGER NOT NULL DEFAULT 0,"
                    " done_at INTEGER, UNIQUE(session, idx));"
                    "CREATE INDEX jobs_ready ON jobs(id) WHERE state = 0;"
                    "BEGIN"))
    return -1;
  sqlite3_stmt *st;
  if (sqlite3_prepare_v2(db, "INSERT INTO jobs(session, idx, type, payload) VALUES(?, ?, 'job', ?)", -1, &st,
                         NULL) != SQLITE_OK)
    return raw_queue_fail(q, db, "prepare");
  int sessions = q->sessions > 0 ? q->sessions : 1;
  for (long i = 0; i < q->n; i++) {
    char session[32];
    snprintf(session, sizeof session, "s-%02ld", (i / 100) % sessions);
    sqlite3_bind_text(st, 1, session, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 2, i + 1);
    sqlite3_bind_blob(st, 3, q->payload, (int)q->payload_len, SQLITE_STATIC);
    if (sqlite3_step(st) != SQLITE_DONE) {
      sqlite3_finalize(st);
      return raw_queue_fail(q, db, "fill");
    }
    sqlite3_reset(st);
  }
  sqlite3_finalize(st);
  return raw_queue_sql(q, db, "COMMIT");
}

/* Claims up to limit ready rows (the statement's own transaction) and
 * reads each one's payload; their ids and attempts into ids/att. Returns
 * how many, or -1. */
static int raw_queue_claim(raw_queue *q, sqlite3 *db, sqlite3_stmt *claim, int limit, int64_t *ids, int64_t *att) {
  int n = 0, rc;
  sqlite3_bind_int64(claim, 1, (int64_t)(raw_queue_now() * 1000) + 30000);
  sqlite3_bind_int(claim, 2, limit);
  while ((rc = sqlite3_step(claim)) == SQLITE_ROW) {
    ids[n] = sqlite3_column_int64(claim, 0);
    att[n] = sqlite3_column_int64(claim, 1);
    q->payload_bytes += (size_t)sqlite3_column_bytes(claim, 2);
    n++;
  }
  sqlite3_reset(claim);
  return rc == SQLITE_DONE ? n : raw_queue_fail(q, db, "claim");
}

static int raw_queue_done(raw_queue *q, sqlite3 *db, sqlite3_stmt *done, int64_t id, int64_t attempt) {
  sqlite3_bind_int64(done, 1, (int64_t)(raw_queue_now() * 1000));
  sqlite3_bind_int64(done, 2, id);
  sqlite3_bind_int64(done, 3, attempt);
  int rc = sqlite3_step(done);
  sqlite3_reset(done);
  return rc == SQLITE_DONE && sqlite3_changes(db) == 1 ? 0 : raw_queue_fail(q, db, "done");
}

/* Fills q->n jobs (not timed), then claims and completes them all. Returns
 * jobs per second, or -1 with q->err. */
static double raw_queue_run(raw_queue *q) {
  sqlite3 *db = NULL;
  sqlite3_stmt *claim = NULL, *done = NULL;
  int64_t *ids = malloc(RAW_QUEUE_MAX_BATCH * sizeof *ids), *att = malloc(RAW_QUEUE_MAX_BATCH * sizeof *att);
  int batch = q->batch < 1 ? 1 : q->batch > RAW_QUEUE_MAX_BATCH ? RAW_QUEUE_MAX_BATCH : q->batch;
  double rate = -1;
  long handled = 0;
  q->err[0] = '\0';
  if (!ids || !att) {
    snprintf(q->err, sizeof q->err, "out of memory");
    goto out;
  }
  if (sqlite3_open(q->path, &db) != SQLITE_OK) {
    raw_queue_fail(q, db, "open");
    goto out;
  }
  if (raw_queue_fill(q, db)) goto out;
  if (sqlite3_prepare_v2(db,
                         "UPDATE jobs SET state = 1, holder = 'bench', expires = ?1,"
                         " attempts = attempts + 1 WHERE id IN (SELECT id FROM jobs WHERE state = 0"
                         " ORDER BY id LIMIT ?2) RETURNING id, attempts, payload",
                         -1, &claim, NULL) != SQLITE_OK ||
      sqlite3_prepare_v2(db,
                         "UPDATE jobs SET state = 2, holder = NULL, done_at = ?1"
                         " WHERE id = ?2 AND attempts = ?3 AND state = 1",
                         -1, &done, NULL) != SQLITE_OK) {
    raw_queue_fail(q, db, "prepare");
    goto out;
  }
  double t0 = raw_queue_now();
  for (;;) {
    int got;
    if (batch == 1) {
      if ((got = raw_queue_claim(q, db, claim, 1, ids, att)) < 0) goto out;
      if (got && raw_queue_done(q, db, done, ids[0], att[0])) goto out;
    } else {
      /* synchronous can change only between transactions */
      if (raw_queue_sql(q, db, "PRAGMA synchronous=NORMAL")) goto out;
      got = raw_queue_claim(q, db, claim, batch, ids, att);
      if (got < 0 || raw_queue_sql(q, db, "PRAGMA synchronous=FULL")) goto out;
      if (got) {
        if (raw_queue_sql(q, db, "BEGIN IMMEDIATE")) goto out;
        for (int i = 0; i < got; i++)
          if (raw_queue_done(q, db, done, ids[i], att[i])) goto out;
        if (raw_queue_sql(q, db, "COMMIT")) goto out;
      }
    }
    if (!got) break;
    handled += got;
  }
  rate = (double)handled / (raw_queue_now() - t0);
  if (handled != q->n) {
    snprintf(q->err, sizeof q->err, "%ld of %ld jobs done", handled, q->n);
    rate = -1;
  }
out:
  sqlite3_finalize(claim);
  sqlite3_finalize(done);
  sqlite3_close(db);
  free(ids);
  free(att);
  return rate;
}

#endif
