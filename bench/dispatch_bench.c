/*
 * dispatch_bench.c: the engine's dispatch (claim, a trivial Lua handler,
 * complete) on memory: and durable sqlite:, beside raw loops doing the
 * same bookkeeping in the same run (bench/README.md "Dispatch").
 *
 *   dispatch_bench DIR [SCALE] [ROUNDS]   DIR: where the database files go
 *
 * Needs lua/eventstore/loader.lua on LUA_PATH (make bench sets it).
 *
 * Figures (events/s; each the median of ROUNDS rounds, the rounds
 * alternating between every figure so that a busy moment of this shared
 * machine hits all of them alike):
 *
 * - raw SQLite, one event per commit: a jobs table with a partial index
 *   on its ready rows; claim one row (an UPDATE ... RETURNING in its own
 *   synced commit), then mark it done (another synced commit). What a
 *   hand-written loop without batching does: two fsyncs per event.
 * - raw SQLite, batched: claim up to 64 rows in one commit with
 *   synchronous=NORMAL, then mark them done in one synced commit: the
 *   loop with the durability rule the engine uses (docs/sqlite.md "Claims
 *   and power loss"): the anchor of the sqlite: engine figures.
 * - C API, memory: claim_next (limit 64) + one complete per event: what
 *   the store itself costs, no Lua: the anchor of the memory: figures.
 * - the engine (es_engine_run, until idle) with 1..8 workers, the handler
 *   `return function(e) return nil end`.
 *
 * Environment: DISPATCH_ONLY=k runs figure k alone; DISPATCH_PAYLOAD_BYTES=N
 * gives every event a payload of N bytes (a JSON string) instead of the
 * ~85-byte object.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "raw_queue.h" /* the raw SQLite figures */
#include "engine/engine.h"
#include "module/module.h" /* open_core: the engine's states preload this library's module */
#include "store/store.h"

static const char PAYLOAD[] =
    "{\"customer\":\"c-000123\",\"items\":[{\"qty\":2,\"sku\":\"SKU-42\"}],\"note\":\"leave at the door\"}";

/* The payload every event carries: PAYLOAD, or with DISPATCH_PAYLOAD_BYTES=N
 * a JSON string of N bytes (long payloads: docs/sqlite.md "Long payloads
 * apart"). */
static const char *payload = PAYLOAD;
static size_t payload_len = sizeof PAYLOAD - 1;

#define RAW_BATCH 64
#define MAX_ROUNDS 9

static const char *dir;
static char scripts[1100];

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, const char *msg) {
  fprintf(stderr, "dispatch_bench: %s: %s\n", what, msg);
  exit(1);
}

static void db_path(char *out, size_t cap, const char *name) {
  snprintf(out, cap, "%s/%s", dir, name);
  static const char *const suffixes[] = {"", "-wal", "-shm"};
  for (int i = 0; i < 3; i++) {
    char p[1200];
    snprintf(p, sizeof p, "%s%s", out, suffixes[i]);
    unlink(p);
  }
}

/* --- raw SQLite (bench/raw_queue.h) ---------------------------------- */

/* batch 1: every claim and every completion its own synced commit.
 * batch > 1: claims committed with synchronous=NORMAL, completions of a
 * batch in one synced commit. */
static double raw_sqlite(long n, int batch) {
  char path[1100];
  db_path(path, sizeof path, "dispatch_raw.db");
  raw_queue q = {.path = path, .payload = payload, .payload_len = payload_len, .n = n, .sessions = 1, .batch = batch};
  double rate = raw_queue_run(&q);
  if (rate < 0) die("raw", q.err);
  db_path(path, sizeof path, "dispatch_raw.db");
  return rate;
}

/* --- the store -------------------------------------------------------- */

static es_store *filled_store(const char *url, long n) {
  es_store *s;
  es_err err = {0};
  if (es_store_open(url, NULL, &s, &err)) die("open", err.msg);
  es_new_event b[100];
  for (int k = 0; k < 100; k++) {
    es_new_event_init(&b[k]);
    b[k].type = "job";
    b[k].payload = payload;
    b[k].payload_len = payload_len;
  }
  for (long i = 0; i < n; i += 100) {
    int pending;
    size_t m = n - i < 100 ? (size_t)(n - i) : 100;
    if (es_store_append(s, "d", b, m, ES_NONE, ES_NONE, NULL, &pending, &err)) die("append", err.msg);
  }
  return s;
}

/* claim_next (limit 64) + complete per event, no Lua: the store's cost. */
static double c_api(const char *url, long n) {
  es_store *s = filled_store(url, n);
  es_err err = {0};
  long handled = 0;
  double t0 = now_s();
  for (;;) {
    es_events got, out;
    int64_t retry;
    int outcome;
    if (es_store_claim_next(s, "bench", 30000, RAW_BATCH, NULL, 0, NULL, 0, &got, &retry, &err))
      die("claim_next", err.msg);
    if (got.n == 0) break;
    for (size_t i = 0; i < got.n; i++) {
      if (es_store_complete(s, got.v[i].session, got.v[i].index, got.v[i].attempts, NULL, 0,
                            ES_NONE, &outcome, &out, &err))
        die("complete", err.msg);
      es_events_destroy(&out);
    }
    handled += (long)got.n;
    es_events_destroy(&got);
  }
  double rate = (double)handled / (now_s() - t0);
  if (handled != n) die("c api", "not every event was handled");
  es_store_release(s);
  return rate;
}

static double engine(const char *url, long n, int workers) {
  es_store *s = filled_store(url, n);
  es_engine_opts o;
  es_engine_opts_init(&o);
  o.scripts = scripts;
  o.open_core = luaopen_eventstore_core;
  o.workers = workers;
  es_engine *e;
  es_err err = {0};
  if (es_engine_open(s, &o, &e, &err)) die("engine", err.msg);
  es_run_opts ro = {0};
  ro.until_idle = 1;
  es_engine_stats st;
  double t0 = now_s();
  if (es_engine_run(e, &ro, &st, &err)) die("run", err.msg);
  double rate = (double)n / (now_s() - t0);
  if (st.handled != n) {
    char msg[128];
    snprintf(msg, sizeof msg, "handled %lld of %ld", (long long)st.handled, n);
    die("engine", msg);
  }
  es_engine_close(e);
  es_store_release(s);
  return rate;
}

/* --- rounds ----------------------------------------------------------- */

enum { RAW1, RAWB, SQ1, SQ2, SQ4, SQ8, CAPI, MEM1, MEM2, NFIG };

static const char *const what[NFIG] = {
    "raw SQLite, claim + done, 2 synced commits each",
    "raw SQLite, claim 64 (NORMAL) + done 64 (synced)",
    "engine, sqlite:, 1 worker",
    "engine, sqlite:, 2 workers",
    "engine, sqlite:, 4 workers",
    "engine, sqlite:, 8 workers",
    "C API claim_next(64) + complete, memory:",
    "engine, memory:, 1 worker",
    "engine, memory:, 2 workers",
};
static const int anchor_of[NFIG] = {-1, -1, RAWB, RAWB, RAWB, RAWB, -1, CAPI, CAPI};

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  dir = argc > 1 ? argv[1] : ".";
  double scale = argc > 2 ? atof(argv[2]) : 1.0;
  int rounds = argc > 3 ? atoi(argv[3]) : 3;
  if (scale <= 0) scale = 1;
  if (rounds < 1) rounds = 1;
  if (rounds > MAX_ROUNDS) rounds = MAX_ROUNDS;
  long n_raw1 = (long)(1000 * scale), n_sq = (long)(20000 * scale), n_mem = (long)(200000 * scale);
  const char *bytes = getenv("DISPATCH_PAYLOAD_BYTES");
  if (bytes && atol(bytes) >= 2) {
    payload_len = (size_t)atol(bytes);
    char *p = malloc(payload_len + 1);
    if (!p) die("payload", "out of memory");
    memset(p, 'x', payload_len);
    p[0] = p[payload_len - 1] = '"';
    p[payload_len] = '\0';
    payload = p; /* the process's life */
  }

  snprintf(scripts, sizeof scripts, "%s/dispatch_scripts", dir);
  char sub[1200];
  snprintf(sub, sizeof sub, "%s/handlers", scripts);
  mkdir(scripts, 0755);
  mkdir(sub, 0755);
  snprintf(sub, sizeof sub, "%s/handlers/job.lua", scripts);
  FILE *f = fopen(sub, "w");
  if (!f) die("scripts", sub);
  fputs("return function(e) return nil end\n", f);
  fclose(f);

  char url[1200], path[1100];
  /* DISPATCH_ONLY=k runs figure k alone (profiling) */
  const char *only = getenv("DISPATCH_ONLY");
  double fig[NFIG][MAX_ROUNDS] = {{0}};
  for (int r = 0; r < rounds; r++) {
    for (int k = 0; k < NFIG; k++) {
      int i = (k + r) % NFIG; /* a different order each round */
      if (only && *only && atoi(only) != i) continue;
      switch (i) {
        case RAW1: fig[i][r] = raw_sqlite(n_raw1, 1); break;
        case RAWB: fig[i][r] = raw_sqlite(n_sq, RAW_BATCH); break;
        case CAPI: fig[i][r] = c_api("memory:", n_mem); break;
        case MEM1: fig[i][r] = engine("memory:", n_mem, 1); break;
        case MEM2: fig[i][r] = engine("memory:", n_mem, 2); break;
        default: {
          int workers = i == SQ1 ? 1 : i == SQ2 ? 2 : i == SQ4 ? 4 : 8;
          db_path(path, sizeof path, "dispatch_store.db");
          snprintf(url, sizeof url, "sqlite:%s", path);
          fig[i][r] = engine(url, n_sq, workers);
          db_path(path, sizeof path, "dispatch_store.db");
        }
      }
    }
  }
  printf("# dispatch_bench (sqlite: durable, WAL + synchronous=FULL; median of %d rounds)\n", rounds);
  printf("%-52s %10s %8s   %s\n", "# what", "events/s", "vs", "per round (events/s)");
  double med[NFIG];
  for (int i = 0; i < NFIG; i++) {
    double v[MAX_ROUNDS];
    memcpy(v, fig[i], sizeof(double) * (size_t)rounds);
    qsort(v, (size_t)rounds, sizeof *v, cmp_double);
    med[i] = v[rounds / 2];
  }
  for (int i = 0; i < NFIG; i++) {
    char ratio[32] = "";
    if (anchor_of[i] >= 0) snprintf(ratio, sizeof ratio, "%.2f", med[i] / med[anchor_of[i]]);
    printf("%-52s %10.0f %8s  ", what[i], med[i], ratio);
    for (int r = 0; r < rounds; r++) printf(" %.0f", fig[i][r]);
    printf("\n");
  }
  snprintf(sub, sizeof sub, "%s/handlers/job.lua", scripts);
  unlink(sub);
  snprintf(sub, sizeof sub, "%s/handlers", scripts);
  rmdir(sub);
  rmdir(scripts);
  return 0;
}
