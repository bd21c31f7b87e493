/*
 * stats_bench.c: what the always-on stats (docs/contract.md §3.12, docs/stats.md)
 * cost, measured in one process: the same loop on the same store with the
 * counting on and off (es_store_stats_enable, a bench-only switch that
 * skips the whole ES_STATS_CALL span: the thread-local check, both clock
 * reads and the atomic adds), in alternating rounds, best round of each.
 *
 *   stats_bench [DIR] [ROUNDS]   DIR: where the SQLite files go (default
 *                                /tmp); ROUNDS default 5
 *   stats_bench count on|off append|dispatch N
 *                                one memory: loop of N calls, for counting
 *                                instructions (perf stat -e instructions:u),
 *                                which the noise of a shared machine does
 *                                not move: bench/run.sh prints both
 *
 * Loops: memory: append (batch 1), memory: claim_next + complete, and
 * sqlite: append (batch 1, durability normal: the per-call cost without
 * an fsync hiding it). Prints "<loop> on <ops/s> off <ops/s> cost <%>";
 * the target is a cost of at most 3%.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "store/store.h"

static const char PAYLOAD[] =
    "{\"customer\":\"c-000123\",\"items\":[{\"qty\":2,\"sku\":\"SKU-42\"}],\"note\":\"leave at the door\"}";

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, const es_err *err) {
  fprintf(stderr, "stats_bench: %s: %s: %s\n", what, es_strerror(err->code), err->msg);
  exit(1);
}

static void append_one(es_store *s, const char *session, int settled) {
  es_new_event e;
  es_new_event_init(&e);
  e.type = "t";
  e.payload = PAYLOAD;
  e.payload_len = sizeof PAYLOAD - 1;
  e.settled = settled;
  es_err err = {0};
  int pending;
  if (es_store_append(s, session, &e, 1, ES_NONE, ES_NONE, NULL, &pending, &err)) die("append", &err);
}

/* n appends of one event to 100 sessions in turn; seconds taken. */
static double loop_append(es_store *s, int n) {
  char name[32];
  double t0 = now_s();
  for (int i = 0; i < n; i++) {
    snprintf(name, sizeof name, "s%d", i % 100);
    append_one(s, name, 1);
  }
  return now_s() - t0;
}

/* n claim_next + complete cycles (the events appended first, not timed). */
static double loop_dispatch(es_store *s, int n) {
  char name[32];
  for (int i = 0; i < n; i++) {
    snprintf(name, sizeof name, "d%d", i % 100);
    append_one(s, name, 0);
  }
  es_err err = {0};
  double t0 = now_s();
  for (int i = 0; i < n; i++) {
    es_events got;
    int64_t retry_at;
    if (es_store_claim_next(s, "w", 60000, 1, NULL, 0, NULL, 0, &got, &retry_at, &err))
      die("claim_next", &err);
    if (got.n != 1) {
      fprintf(stderr, "stats_bench: claim_next returned %zu events\n", got.n);
      exit(1);
    }
    int outcome;
    es_events out;
    if (es_store_complete(s, got.v[0].session, got.v[0].index, got.v[0].attempts, NULL, 0, ES_NONE,
                          &outcome, &out, &err))
      die("complete", &err);
    es_events_destroy(&out);
    es_events_destroy(&got);
  }
  return now_s() - t0;
}

static void measure(const char *what, es_store *s, double (*loop)(es_store *, int), int n,
                    int rounds) {
  double best[2] = {1e30, 1e30};
  loop(s, n / 10); /* warm up */
  for (int r = 0; r < 2 * rounds; r++) {
    int on = (r + r / 2) % 2; /* on off off on on off ...: neither goes first every time */
    es_store_stats_enable(s, on);
    double t = loop(s, n);
    if (t < best[on]) best[on] = t;
  }
  es_store_stats_enable(s, 1);
  double on_ops = n / best[1], off_ops = n / best[0];
  printf("stats cost: %-32s on %10.0f ops/s  off %10.0f ops/s  cost %5.2f%%\n", what, on_ops, off_ops,
         (off_ops / on_ops - 1) * 100);
  fflush(stdout);
}

int main(int argc, char **argv) {
  if (argc == 5 && strcmp(argv[1], "count") == 0) {
    es_err err = {0};
    es_store *s;
    if (es_store_open("memory:", NULL, &s, &err)) die("open memory:", &err);
    es_store_stats_enable(s, strcmp(argv[2], "on") == 0);
    int n = atoi(argv[4]);
    if (strcmp(argv[3], "append") == 0) loop_append(s, n);
    else loop_dispatch(s, n);
    es_store_release(s);
    return 0;
  }
  const char *dir = argc > 1 ? argv[1] : "/tmp";
  int rounds = argc > 2 ? atoi(argv[2]) : 5;
  if (rounds < 1) rounds = 1;
  es_err err = {0};
  es_store *s;
  if (es_store_open("memory:", NULL, &s, &err)) die("open memory:", &err);
  measure("memory: append (batch 1)", s, loop_append, 200000, rounds);
  measure("memory: claim_next + complete", s, loop_dispatch, 100000, rounds);
  es_store_release(s);

  char url[600];
  snprintf(url, sizeof url, "sqlite:%s/stats_bench_%d.db", dir, (int)getpid());
  es_open_opts o = {0};
  o.durability = 1;
  if (es_store_open(url, &o, &s, &err)) die("open sqlite:", &err);
  measure("sqlite: append (batch 1, normal)", s, loop_append, 5000, rounds);
  measure("sqlite: claim_next + complete", s, loop_dispatch, 2000, rounds);
  es_store_release(s);
  char path[620];
  const char *suffixes[] = {"", "-wal", "-shm"};
  for (int i = 0; i < 3; i++) {
    snprintf(path, sizeof path, "%s/stats_bench_%d.db%s", dir, (int)getpid(), suffixes[i]);
    unlink(path);
  }
  return 0;
}
