/*
 * sqlite_bench.c: durable appends on sqlite: with 1, 4 and 16 writer
 * threads sharing one handle (group commit), beside raw SQLite inserting
 * the same rows through its C API in one transaction per 1,000 rows, in
 * the same run; and claim-then-complete cycles.
 *
 *   sqlite_bench DIR [SECONDS]      DIR: where the database files go
 *
 *   sqlite_bench DIR SECONDS THREADS BATCH [?OPTIONS]
 *                                   one figure only, with events per commit
 *                                   and CPU per event (profiling; OPTIONS
 *                                   e.g. ?sync=normal)
 *
 * Both sides are durable: WAL with synchronous=FULL. Prints one line per
 * figure: "<what> <events/s> <raw rows/s> <ratio> <ratio per round>".
 */
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "store/store.h"

static const char PAYLOAD[] =
    "{\"customer\":\"c-000123\",\"items\":[{\"qty\":2,\"sku\":\"SKU-42\"}],\"note\":\"leave at the door\"}";

/* CPU seconds (user + system) of the whole process so far. */
static double cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
         (double)ru.ru_stime.tv_usec / 1e6;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void remove_db(const char *path) {
  static const char *const suffixes[] = {"", "-wal", "-shm"};
  for (int i = 0; i < 3; i++) {
    char p[1100];
    snprintf(p, sizeof p, "%s%s", path, suffixes[i]);
    unlink(p);
  }
}

static void die(const char *what, const char *msg) {
  fprintf(stderr, "sqlite_bench: %s: %s\n", what, msg);
  exit(1);
}

/* URL options of the store under test: "" (durable) except in the
 * one-figure mode, where a fifth argument may give e.g. "?sync=normal"
 * (profiling the CPU side without the fsync; raw SQLite then runs with
 * synchronous=NORMAL too). */
static const char *url_options = "";

/* --- raw SQLite: the reference a user would compare against --- */

/* Inserts the same payload into a fresh file for `seconds` (whole
 * transactions of 1,000 rows; the last may end after the time), returns
 * rows/s. The table is what a user writing events by hand would make:
 * a primary key and two unique indexes (id; session, idx), 7 columns. The
 * store's table has 30 columns (the dispatch record) and nine indexes, and
 * each append also reads and writes its session's row: see
 * bench/README.md. */
static double raw_sqlite(const char *path, double seconds) {
  sqlite3 *db;
  remove_db(path);
  if (sqlite3_open(path, &db) != SQLITE_OK) die("raw open", sqlite3_errmsg(db));
  sqlite3_exec(db, strstr(url_options, "sync=normal") ? "PRAGMA synchronous=NORMAL" : "PRAGMA synchronous=FULL",
               NULL, NULL, NULL);
  sqlite3_exec(db,
               "PRAGMA journal_mode=WAL;"
               "CREATE TABLE events(position INTEGER PRIMARY KEY, session TEXT NOT NULL,"
               " idx INTEGER NOT NULL, id TEXT NOT NULL UNIQUE, type TEXT NOT NULL,"
               " payload BLOB NOT NULL, created_at INTEGER NOT NULL, UNIQUE(session, idx));",
               NULL, NULL, NULL);
  sqlite3_stmt *st;
  sqlite3_prepare_v2(db, "INSERT INTO events(session, idx, id, type, payload, created_at) VALUES(?,?,?,?,?,?)",
                     -1, &st, NULL);
  double t0 = now_s(), t1;
  long i = 0;
  do {
    sqlite3_exec(db, "BEGIN", NULL, NULL, NULL);
    for (int k = 0; k < 1000; k++, i++) {
      char id[64];
      snprintf(id, sizeof id, "0190f1c2-0000-7000-8000-%012ld", i);
      sqlite3_bind_text(st, 1, "bench", -1, SQLITE_STATIC);
      sqlite3_bind_int64(st, 2, i + 1);
      sqlite3_bind_text(st, 3, id, -1, SQLITE_TRANSIENT);
      sqlite3_bind_text(st, 4, "order.placed", -1, SQLITE_STATIC);
      sqlite3_bind_blob(st, 5, PAYLOAD, sizeof PAYLOAD - 1, SQLITE_STATIC);
      sqlite3_bind_int64(st, 6, 1700000000000 + i);
      if (sqlite3_step(st) != SQLITE_DONE) die("raw insert", sqlite3_errmsg(db));
      sqlite3_reset(st);
    }
    if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) die("raw commit", sqlite3_errmsg(db));
    t1 = now_s();
  } while (t1 - t0 < seconds);
  double rate = (double)i / (t1 - t0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  remove_db(path);
  return rate;
}

/* --- the store: writers sharing one handle --- */

typedef struct {
  es_store *s;
  int batch;
  int thread;
  double until;
  atomic_long *events;
} writer;

static void *write_loop(void *arg) {
  writer *w = arg;
  es_new_event *evs = calloc((size_t)w->batch, sizeof *evs);
  for (int i = 0; i < w->batch; i++) {
    es_new_event_init(&evs[i]);
    evs[i].type = "order.placed";
    evs[i].payload = PAYLOAD;
    evs[i].payload_len = sizeof PAYLOAD - 1;
    evs[i].settled = 1;
  }
  char session[32];
  snprintf(session, sizeof session, "writer-%d", w->thread);
  while (now_s() < w->until) {
    int pending;
    es_err err = {0};
    if (es_store_append(w->s, session, evs, (size_t)w->batch, ES_NONE, ES_NONE, NULL, &pending, &err))
      die("append", err.msg);
    atomic_fetch_add(w->events, w->batch);
  }
  free(evs);
  return NULL;
}

/* Of the last store_appends run: commits through the handle and events
 * appended (events per commit: how large the groups were). */
static uint64_t last_commits;
static long last_events;

static double store_appends(const char *path, int threads, int batch, double seconds) {
  char url[1200];
  snprintf(url, sizeof url, "sqlite:%s%s", path, url_options);
  remove_db(path);
  es_store *s;
  es_err err = {0};
  if (es_store_open(url, NULL, &s, &err)) die("open", err.msg);
  atomic_long events = 0;
  pthread_t tid[64];
  writer w[64];
  double t0 = now_s();
  for (int i = 0; i < threads; i++) {
    w[i] = (writer){s, batch, i, t0 + seconds, &events};
    pthread_create(&tid[i], NULL, write_loop, &w[i]);
  }
  for (int i = 0; i < threads; i++) pthread_join(tid[i], NULL);
  double rate = (double)atomic_load(&events) / (now_s() - t0);
  last_commits = es_store_version(s);
  last_events = atomic_load(&events);
  es_store_release(s);
  remove_db(path);
  return rate;
}

static double cycles(const char *path, double seconds) {
  char url[1100];
  snprintf(url, sizeof url, "sqlite:%s", path);
  remove_db(path);
  es_store *s;
  es_err err = {0};
  if (es_store_open(url, NULL, &s, &err)) die("open", err.msg);
  es_new_event ev;
  es_new_event_init(&ev);
  ev.type = "order.paid";
  ev.payload = PAYLOAD;
  ev.payload_len = sizeof PAYLOAD - 1;
  /* Enough pending events that the loop never runs dry. */
  for (int i = 0; i < 1000; i++) {
    es_new_event b[100];
    for (int k = 0; k < 100; k++) b[k] = ev;
    int pending;
    if (es_store_append(s, "cycle", b, 100, ES_NONE, ES_NONE, NULL, &pending, &err)) die("append", err.msg);
  }
  es_new_event result = ev;
  result.type = "order.shipped";
  result.settled = 1;
  long n = 0;
  double t0 = now_s();
  while (now_s() - t0 < seconds) {
    es_events got, done;
    int64_t retry;
    int outcome;
    if (es_store_claim_next(s, "bench", 30000, 1, NULL, 0, NULL, 0, &got, &retry, &err)) die("claim_next", err.msg);
    if (got.n != 1) die("claim_next", "ran dry");
    if (es_store_complete(s, "cycle", got.v[0].index, got.v[0].attempts, &result, 1, ES_NONE, &outcome, &done,
                          &err))
      die("complete", err.msg);
    es_events_destroy(&got);
    es_events_destroy(&done);
    n++;
  }
  double rate = (double)n / (now_s() - t0);
  es_store_release(s);
  remove_db(path);
  return rate;
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : ".";
  double seconds = argc > 2 ? atof(argv[2]) : 3.0;
  char path[1024];
  snprintf(path, sizeof path, "%s/sqlite_bench.db", dir);
  if (argc > 4) {
    /* One figure only (profiling): sqlite_bench DIR SECONDS THREADS BATCH [?OPTIONS] */
    if (argc > 5) url_options = argv[5];
    int nt = atoi(argv[3]), nb = atoi(argv[4]);
    if (nt < 1 || nt > 64 || nb < 1) die("usage", "sqlite_bench DIR SECONDS THREADS(1..64) BATCH");
    char raw_path[1100];
    snprintf(raw_path, sizeof raw_path, "%s/sqlite_bench_raw.db", dir);
    double c0 = cpu_s();
    double raw = raw_sqlite(raw_path, seconds);
    double c1 = cpu_s();
    double r = store_appends(path, nt, nb, seconds);
    double cpu = cpu_s() - c1;
    printf("append, %d threads, batch of %d: %.0f events/s (raw %.0f: %.2f), %.1f events per commit, "
           "%.2f us CPU per event (raw %.2f)\n",
           nt, nb, r, raw, r / raw, last_commits ? (double)last_events / (double)last_commits : 0.0,
           last_events ? cpu / (double)last_events * 1e6 : 0.0, (c1 - c0) / (raw * seconds) * 1e6);
    return 0;
  }
  /* Each figure in ROUNDS rounds of seconds / ROUNDS, each round timing
   * raw SQLite and the store back to back (which goes first alternates),
   * each in a fresh file: a figure and its anchor share the machine's
   * state (other load, the disk's fsync time), so their ratio is what
   * compares across runs. */
  enum { ROUNDS = 3 };
  char raw_path[1100];
  snprintf(raw_path, sizeof raw_path, "%s/sqlite_bench_raw.db", dir);
  double slice = seconds / ROUNDS;
  printf("# sqlite_bench (durable: WAL, synchronous=FULL; %d rounds of %.1f s per figure, each\n"
         "# beside raw SQLite inserting the same payload, 1 txn per 1,000 rows, in the same round)\n",
         ROUNDS, slice);
  printf("%-36s %10s %10s %7s  %s\n", "# what", "events/s", "raw/s", "ratio", "per round");
  static const int threads[] = {1, 4, 16};
  static const int batches[] = {1, 100};
  for (int b = 0; b < 2; b++) {
    for (int t = 0; t < 3; t++) {
      double sum_store = 0, sum_raw = 0, ratio[ROUNDS];
      for (int r = 0; r < ROUNDS; r++) {
        double st, rw;
        if (r % 2 == 0) {
          rw = raw_sqlite(raw_path, slice);
          st = store_appends(path, threads[t], batches[b], slice);
        } else {
          st = store_appends(path, threads[t], batches[b], slice);
          rw = raw_sqlite(raw_path, slice);
        }
        sum_store += st;
        sum_raw += rw;
        ratio[r] = st / rw;
      }
      char what[80], rounds[64];
      snprintf(what, sizeof what, "append, %d thread%s, batch of %d", threads[t],
               threads[t] > 1 ? "s" : "", batches[b]);
      snprintf(rounds, sizeof rounds, "%.2f %.2f %.2f", ratio[0], ratio[1], ratio[2]);
      printf("%-36s %10.0f %10.0f %7.2f  %s\n", what, sum_store / ROUNDS, sum_raw / ROUNDS,
             sum_store / sum_raw, rounds);
      fflush(stdout);
    }
  }
  printf("%-36s %10.0f\n", "claim_next + complete (1 thread)", cycles(path, seconds));
  return 0;
}
