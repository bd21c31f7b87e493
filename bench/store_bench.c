/*
 * store_bench.c: per-call costs of the store from C, on a session of about
 * a thousand events and on one of about a million, so the two can be
 * compared (costs must not grow with history).
 *
 *   store_bench [URL] [BIG]     URL default "memory:", BIG default 1000000
 *
 * Prints one line per figure: "<what> <session size> <ops/s>". Events carry
 * ~100-byte payloads. Rounds on the small session start from a fresh store
 * each time so it stays near 1,000 events.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "store.h"

static const char PAYLOAD[] =
    "{\"customer\":\"c-000123\",\"items\":[{\"qty\":2,\"sku\":\"SKU-42\"}],\"note\":\"leave at the door\"}";

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, const es_err *err) {
  fprintf(stderr, "store_bench: %s: %s: %s\n", what, es_strerror(err->code), err->msg);
  exit(1);
}

static long rss_bytes(void) {
  long pages = 0, rss = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return 0;
  if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
  fclose(f);
  return rss * sysconf(_SC_PAGESIZE);
}

static char url_buf[512];
static const char *base_url;
static int store_seq;

static void remove_db(const char *path) {
  static const char *const suffixes[] = {"", "-wal", "-shm"};
  for (int i = 0; i < 3; i++) {
    char p[600];
    snprintf(p, sizeof p, "%s%s", path, suffixes[i]);
    unlink(p);
  }
}

/* A fresh store: for sqlite a new file next to the given path. */
static es_store *fresh(void) {
  es_store *s = NULL;
  es_err err = {0};
  const char *url = base_url;
  if (strncmp(base_url, "sqlite:", 7) == 0) {
    snprintf(url_buf, sizeof url_buf, "%s.%d", base_url, store_seq++);
    remove_db(url_buf + 7);
    url = url_buf;
  }
  if (es_store_open(url, NULL, &s, &err)) die("open", &err);
  return s;
}

static void drop(es_store *s) {
  es_store_release(s);
  if (strncmp(base_url, "sqlite:", 7) == 0) remove_db(url_buf + 7);
}

/* Appends n events to session in batches of `batch`; settled or pending. */
static void fill(es_store *s, const char *session, long n, int batch, int settled) {
  es_new_event *evs = calloc((size_t)batch, sizeof *evs);
  for (int i = 0; i < batch; i++) {
    es_new_event_init(&evs[i]);
    evs[i].type = "order.placed";
    evs[i].payload = PAYLOAD;
    evs[i].payload_len = sizeof PAYLOAD - 1;
    evs[i].settled = settled;
  }
  for (long done = 0; done < n;) {
    size_t k = (size_t)(n - done < batch ? n - done : batch);
    int pending;
    es_err err = {0};
    /* No out list: a writer that does not need the stored events back. */
    if (es_store_append(s, session, evs, k, ES_NONE, NULL, &pending, &err)) die("append", &err);
    done += (long)k;
  }
  free(evs);
}

typedef struct {
  double ops;     /* operations counted */
  double seconds; /* time spent in them */
} tally;

static void report(const char *what, long size, tally t) {
  printf("%-34s %8ld %12.0f\n", what, size, t.ops / t.seconds);
  fflush(stdout);
}

/* Measures `calls` appends of `batch` events on a session already at size. */
static tally bench_append(es_store *s, const char *session, int batch, long calls) {
  double t0 = now_s();
  fill(s, session, calls * batch, batch, 1);
  return (tally){(double)(calls * batch), now_s() - t0};
}

static tally bench_read(es_store *s, const char *session, long size, long calls) {
  double t0 = now_s();
  unsigned seed = 42;
  for (long i = 0; i < calls; i++) {
    int64_t after = (int64_t)(rand_r(&seed) % (unsigned)(size > 100 ? size - 100 : 1));
    es_events out;
    es_err err = {0};
    if (es_store_read(s, session, after, ES_NONE, 100, &out, &err)) die("read", &err);
    es_events_destroy(&out);
  }
  return (tally){(double)calls, now_s() - t0};
}

static tally bench_head(es_store *s, const char *session, long calls) {
  double t0 = now_s();
  for (long i = 0; i < calls; i++) {
    int64_t head;
    es_err err = {0};
    if (es_store_head(s, session, &head, &err)) die("head", &err);
  }
  return (tally){(double)calls, now_s() - t0};
}

/* claim (this session) then complete with one result event, `calls` times;
 * a pending event is appended before each cycle (not timed). */
static tally bench_cycle(es_store *s, const char *session, long calls, int use_next) {
  double spent = 0;
  es_new_event ev;
  es_new_event_init(&ev);
  ev.type = "order.paid";
  ev.payload = PAYLOAD;
  ev.payload_len = sizeof PAYLOAD - 1;
  es_new_event result = ev;
  result.type = "order.shipped";
  result.settled = 1;
  for (long i = 0; i < calls; i++) {
    es_events out;
    int pending;
    es_err err = {0};
    if (es_store_append(s, session, &ev, 1, ES_NONE, &out, &pending, &err)) die("append", &err);
    es_events_destroy(&out);
    double t0 = now_s();
    int64_t retry;
    if (use_next) {
      if (es_store_claim_next(s, "bench", 30000, 1, &out, &retry, &err)) die("claim_next", &err);
    } else {
      es_claim_opts o = {.holder = "bench", .ttl_ms = 30000, .expires_at = ES_NONE, .limit = 1};
      int outcome;
      if (es_store_claim(s, session, &o, &outcome, &out, &retry, &err)) die("claim", &err);
    }
    if (out.n != 1) {
      fprintf(stderr, "store_bench: expected one claimed event, got %zu\n", out.n);
      exit(1);
    }
    es_events done;
    int outcome;
    if (es_store_complete(s, session, out.v[0].index, out.v[0].attempts, &result, 1, &outcome,
                          &done, &err))
      die("complete", &err);
    spent += now_s() - t0;
    es_events_destroy(&out);
    es_events_destroy(&done);
  }
  return (tally){(double)calls, spent};
}

static tally add(tally a, tally b) { return (tally){a.ops + b.ops, a.seconds + b.seconds}; }

int main(int argc, char **argv) {
  base_url = argc > 1 ? argv[1] : "memory:";
  long big = argc > 2 ? atol(argv[2]) : 1000000;
  int durable = strncmp(base_url, "sqlite:", 7) == 0;
  long small = 1000;
  printf("# store_bench %s (ops/s; append counts events)\n", base_url);
  printf("%-34s %8s %12s\n", "# what", "session", "ops/s");

  /* Small sessions: 10 rounds, each on a fresh store filled to 1,000. */
  tally a1 = {0}, a100 = {0}, rd = {0}, hd = {0}, cy = {0}, cn = {0};
  for (int round = 0; round < 10; round++) {
    es_store *s = fresh();
    fill(s, "s", small, 100, 1);
    a1 = add(a1, bench_append(s, "s", 1, durable ? 20 : 100));
    a100 = add(a100, bench_append(s, "s", 100, durable ? 2 : 10));
    rd = add(rd, bench_read(s, "s", small, 1000));
    hd = add(hd, bench_head(s, "s", 10000));
    cy = add(cy, bench_cycle(s, "s", durable ? 20 : 100, 0));
    cn = add(cn, bench_cycle(s, "s", durable ? 20 : 100, 1));
    drop(s);
  }
  report("append (batch 1)", small, a1);
  report("append (batch 100)", small, a100);
  report("read (100 events)", small, rd);
  report("head", small, hd);
  report("claim+complete cycle", small, cy);
  report("claim_next+complete cycle", small, cn);

  /* The big session, plus 10,000 idle sessions claim_next must not scan. */
  es_store *s = fresh();
  long rss0 = rss_bytes();
  double t0 = now_s();
  fill(s, "s", big, 100, 1);
  double fill_s = now_s() - t0;
  long rss1 = rss_bytes();
  for (int i = 0; i < 10000; i++) {
    char name[32];
    snprintf(name, sizeof name, "idle-%05d", i);
    fill(s, name, 1, 1, 1);
  }
  report("append (batch 100, filling)", big, (tally){(double)big, fill_s});
  report("append (batch 1)", big, bench_append(s, "s", 1, durable ? 200 : 1000));
  report("append (batch 100)", big, bench_append(s, "s", 100, durable ? 20 : 100));
  report("read (100 events)", big, bench_read(s, "s", big, 10000));
  report("head", big, bench_head(s, "s", 100000));
  report("claim+complete cycle", big, bench_cycle(s, "s", durable ? 200 : 1000, 0));
  report("claim_next+complete cycle", big, bench_cycle(s, "s", durable ? 200 : 1000, 1));
  if (!durable) printf("%-34s %8ld %12.0f\n", "resident bytes per event", big, (double)(rss1 - rss0) / (double)big);
  drop(s);
  return 0;
}
