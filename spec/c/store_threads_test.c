/*
 * store_threads_test.c: one store handle shared by many threads (the
 * engine's workers do this), on memory: and sqlite:. Writers append to a
 * shared session and to their own; workers claim_next and complete at the
 * same time. Afterwards: indexes dense, positions unique and increasing,
 * every event completed exactly once with exactly one result, nothing lost.
 * TAP-style output; non-zero exit on failure.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/store.h"

#define WRITERS 6
#define WORKERS 4
#define PER_WRITER 300

static int test_no, failures;

static void ok(int cond, const char *name) {
  test_no++;
  if (!cond) failures++;
  printf("%sok %d - %s\n", cond ? "" : "not ", test_no, name);
}

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
    if (es_store_append(c->s, i % 2 ? "shared" : own, &e, 1, ES_NONE, ES_NONE, NULL, &pending, &err))
      atomic_fetch_add(c->errors, 1);
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
      int outcome;
      if (es_store_complete(c->s, got.v[i].session, got.v[i].index, got.v[i].attempts, &r, 1, ES_NONE,
                            &outcome, &out, &err) ||
          outcome != ES_COMPLETED)
        atomic_fetch_add(c->errors, 1);
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

int main(void) {
  printf("# store_threads_test: one handle, %d writers and %d workers\n", WRITERS, WORKERS);
  run("memory:", "memory");
  char dir[] = "/tmp/es-threads-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  char url[200], path[64];
  snprintf(path, sizeof path, "%s/t.db", dir);
  snprintf(url, sizeof url, "sqlite:%s?sync=normal", path);
  run(url, "sqlite");
  char p[200];
  static const char *const suffixes[] = {"", "-wal", "-shm"};
  for (int i = 0; i < 3; i++) {
    snprintf(p, sizeof p, "%s%s", path, suffixes[i]);
    unlink(p);
  }
  rmdir(dir);
  printf("# %d tests, %d failed\n", test_no, failures);
  return failures ? 1 : 0;
}
