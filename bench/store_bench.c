/*
 * store_bench.c: per-call costs of the store from C, on a session of about
 * a thousand events and on one of about a million, so the two can be
 * compared (costs must not grow with history).
 *
 *   store_bench [URL] [BIG] [fork]   URL default "memory:", BIG default 1000000;
 *                                    "fork": only the fork figures
 *
 * Prints one line per figure: "<what> <session size> <ops/s>". Events carry
 * ~100-byte payloads. Rounds on the small session start from a fresh store
 * each time so it stays near 1,000 events.
 *
 * Then, in fresh stores: es_store_fork of a FORK_EVENTS-event session
 * beside es_store_append of the same number of events in batches of 1,000
 * into a new session (the events already in hand: no read), in the same
 * rounds, with the ratio (append time / fork time: how many times faster
 * the fork is; the target is at least 3).
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
    if (es_store_append(s, session, evs, k, ES_NONE, ES_NONE, NULL, &pending, &err)) die("append", &err);
    done += (long)k;
  }
  free(evs);
}

typedef struct {
  double ops;     /* operations counted */
  double seconds; /* time spent in them */
} tally;


/* Each measurement rotates over a set of sessions of one size, so the
 * small sessions stay near their size while being appended to. */
typedef struct {
  char **names;
  int n;
  long size;
} group;

static const char *pick(const group *g, long i) { return g->names[i % g->n]; }

static tally bench_append(es_store *s, const group *g, int batch, long calls) {
  es_new_event *evs = calloc((size_t)batch, sizeof *evs);
  for (int i = 0; i < batch; i++) {
    es_new_event_init(&evs[i]);
    evs[i].type = "order.placed";
    evs[i].payload = PAYLOAD;
    evs[i].payload_len = sizeof PAYLOAD - 1;
    evs[i].settled = 1;
  }
  double t0 = now_s();
  for (long i = 0; i < calls; i++) {
    int pending;
    es_err err = {0};
    if (es_store_append(s, pick(g, i), evs, (size_t)batch, ES_NONE, ES_NONE, NULL, &pending, &err))
      die("append", &err);
  }
  tally t = {(double)(calls * batch), now_s() - t0};
  free(evs);
  return t;
}

static tally bench_read(es_store *s, const group *g, long calls) {
  unsigned seed = 42;
  double t0 = now_s();
  for (long i = 0; i < calls; i++) {
    int64_t after = (int64_t)(rand_r(&seed) % (unsigned)(g->size - 100));
    es_events out;
    es_err err = {0};
    if (es_store_read(s, pick(g, i), after, ES_NONE, 100, &out, &err)) die("read", &err);
    es_events_destroy(&out);
  }
  return (tally){(double)calls, now_s() - t0};
}

static tally bench_head(es_store *s, const group *g, long calls) {
  double t0 = now_s();
  for (long i = 0; i < calls; i++) {
    int64_t head;
    es_err err = {0};
    if (es_store_head(s, pick(g, i), &head, &err)) die("head", &err);
  }
  return (tally){(double)calls, now_s() - t0};
}

/* claim (of the session, or claim_next) then complete with one result
 * event; a pending event is appended before each cycle (not timed). */
static tally bench_cycle(es_store *s, const group *g, long calls, int use_next) {
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
    const char *session = pick(g, i);
    es_events out;
    int pending;
    es_err err = {0};
    if (es_store_append(s, session, &ev, 1, ES_NONE, ES_NONE, NULL, &pending, &err)) die("append", &err);
    double t0 = now_s();
    int64_t retry;
    if (use_next) {
      if (es_store_claim_next(s, "bench", 30000, 1, NULL, 0, NULL, 0, &out, &retry, &err)) die("claim_next", &err);
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
    if (es_store_complete(s, out.v[0].session, out.v[0].index, out.v[0].attempts, &result, 1, ES_NONE,
                          &outcome, &done, &err))
      die("complete", &err);
    spent += now_s() - t0;
    es_events_destroy(&out);
    es_events_destroy(&done);
  }
  return (tally){(double)calls, spent};
}

/* Fork vs append: each round opens a fresh store, fills "src" (not timed),
 * then times es_store_fork(src, FORK_EVENTS, "fork") and appending
 * FORK_EVENTS events in batches of 1,000 to "copy", in alternating order
 * from round to round so drift hits both alike. */
enum { FORK_EVENTS = 100000, FORK_BATCH = 1000, FORK_ROUNDS = 3 };

static double time_fork(es_store *s) {
  es_lineage l;
  es_err err = {0};
  double t0 = now_s();
  if (es_store_fork(s, "src", FORK_EVENTS, "fork", &l, &err)) die("fork", &err);
  double spent = now_s() - t0;
  es_lineage_destroy(&l);
  return spent;
}

static double time_append_copy(es_store *s) {
  double t0 = now_s();
  fill(s, "copy", FORK_EVENTS, FORK_BATCH, 1);
  return now_s() - t0;
}

static void bench_fork(void) {
  double fork_s = 0, append_s = 0;
  for (int round = 0; round < FORK_ROUNDS; round++) {
    es_store *s = fresh();
    fill(s, "src", FORK_EVENTS, FORK_BATCH, 1);
    if (round % 2 == 0) {
      fork_s += time_fork(s);
      append_s += time_append_copy(s);
    } else {
      append_s += time_append_copy(s);
      fork_s += time_fork(s);
    }
    int64_t head = 0;
    es_err err = {0};
    if (es_store_head(s, "fork", &head, &err)) die("head", &err);
    if (head != FORK_EVENTS) {
      fprintf(stderr, "store_bench: the fork has %lld events, not %d\n", (long long)head, FORK_EVENTS);
      exit(1);
    }
    drop(s);
  }
  printf("# store_bench %s fork: copying a %d-event session, %d rounds, a fresh store each\n", base_url,
         FORK_EVENTS, FORK_ROUNDS);
  printf("# (fork x: this row's time / the fork's time, i.e. how many times faster the fork is)\n");
  printf("%-28s %12s %12s %8s\n", "# what", "events/s", "ms per copy", "fork x");
  double n = (double)FORK_EVENTS * FORK_ROUNDS;
  printf("%-28s %12.0f %12.1f %8.2f\n", "append (batch 1000)", n / append_s, append_s * 1000 / FORK_ROUNDS,
         append_s / fork_s);
  printf("%-28s %12.0f %12.1f\n", "fork", n / fork_s, fork_s * 1000 / FORK_ROUNDS);
  fflush(stdout);
}

static tally add(tally a, tally b) { return (tally){a.ops + b.ops, a.seconds + b.seconds}; }

static void row(const char *what, tally small, tally big) {
  double a = small.ops / small.seconds, b = big.ops / big.seconds;
  printf("%-28s %12.0f %12.0f %8.2f\n", what, a, b, a / b);
  fflush(stdout);
}

int main(int argc, char **argv) {
  base_url = argc > 1 ? argv[1] : "memory:";
  long big = argc > 2 ? atol(argv[2]) : 1000000;
  int durable = strncmp(base_url, "sqlite:", 7) == 0;
  int scale = durable ? 10 : 1; /* durable calls wait on fsync: fewer of them */
  if (argc > 3 && strcmp(argv[3], "fork") == 0) {
    bench_fork();
    return 0;
  }
  es_store *s = fresh();

  /* One store holds everything, so both sizes are measured against the
   * same store-wide indexes (ids, positions, the ready queue) and the
   * only difference is the session's length. */
  char *big_name = "big";
  group G = {&big_name, 1, big};
  long rss0 = rss_bytes();
  double t0 = now_s();
  fill(s, "big", big, 100, 1);
  double fill_s = now_s() - t0;
  long rss1 = rss_bytes();
  enum { SMALL = 100 };
  char *names[SMALL];
  for (int i = 0; i < SMALL; i++) {
    names[i] = malloc(32);
    snprintf(names[i], 32, "small-%03d", i);
    fill(s, names[i], 1000, 100, 1);
  }
  group g = {names, SMALL, 1000};
  /* Idle sessions, which claim_next must never scan. */
  for (int i = 0; i < 10000; i++) {
    char name[32];
    snprintf(name, sizeof name, "idle-%05d", i);
    fill(s, name, 1, 1, 1);
  }

  printf("# store_bench %s ops/s on sessions of 1,000 and of %ld events in one store\n",
         base_url, big);
  printf("# (append counts events; 10,000 idle sessions present)\n");
  printf("%-28s %12s %12s %8s\n", "# what", "1k session", "1M session", "ratio");
  tally a1[2] = {{0}}, a100[2] = {{0}}, rd[2] = {{0}}, hd[2] = {{0}}, cy[2] = {{0}}, cn[2] = {{0}};
  /* Alternate the two sizes in rounds so drift hits both alike. */
  for (int round = 0; round < 5; round++) {
    const group *gs[2] = {&g, &G};
    for (int k = 0; k < 2; k++) {
      a1[k] = add(a1[k], bench_append(s, gs[k], 1, 20000 / scale / (durable ? 10 : 1)));
      a100[k] = add(a100[k], bench_append(s, gs[k], 100, 1000 / scale));
      rd[k] = add(rd[k], bench_read(s, gs[k], 20000 / scale));
      hd[k] = add(hd[k], bench_head(s, gs[k], 200000 / scale));
      cy[k] = add(cy[k], bench_cycle(s, gs[k], 20000 / scale / (durable ? 10 : 1), 0));
      cn[k] = add(cn[k], bench_cycle(s, gs[k], 20000 / scale / (durable ? 10 : 1), 1));
    }
  }
  row("append (batch 1)", a1[0], a1[1]);
  row("append (batch 100)", a100[0], a100[1]);
  row("read (100 events)", rd[0], rd[1]);
  row("head", hd[0], hd[1]);
  row("claim+complete cycle", cy[0], cy[1]);
  row("claim_next+complete cycle", cn[0], cn[1]);
  printf("%-28s %12s %12.0f\n", "append filling (batch 100)", "", (double)big / fill_s);
  if (!durable) {
    printf("%-28s %12s %12.0f\n", "resident bytes per event", "", (double)(rss1 - rss0) / (double)big);
    /* Its anchor: the event's own bytes (issue 12's target is at most 160
     * for such events; bench/README.md, "Memory per event"). */
    printf("# (each event: a %zu-byte payload, a 36-character UUID id, a 12-byte type)\n",
           sizeof PAYLOAD - 1);
  }
  for (int i = 0; i < SMALL; i++) free(names[i]);
  drop(s);
  bench_fork();
  return 0;
}
