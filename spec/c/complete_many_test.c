/*
 * complete_many_test.c: es_store_complete_many against its definition
 * (store.h): item by item, the answer (rc, outcome, error code and
 * message) and the store state that calling es_store_complete for each
 * item in order gives. A differential test: on each backend two stores
 * are prepared by the same calls, one runs a scenario's completions in one
 * complete_many, the other one by one, and their answers and every row
 * they hold afterwards (sessions' counters, every event's dispatch record
 * and every appended result) must be equal, and so must what a claim
 * finds ready afterwards (lanes).
 *
 * What is attacked: the postgres backend's read_ahead (the reads of up to
 * 64 completions in one round trip, answered from a cache that must follow
 * the transaction's own writes) and the rule that completions whose
 * results all carry ids and no key run without a savepoint of their own.
 * So: batches crossing the 64-item chunk, the same event completed twice
 * in one batch, two items returning the same id, ids stored before,
 * superseded attempts, missing events, sealed and fenced sessions among
 * good items, lanes, generated ids, keys, a second batch in the same
 * sessions, and items failing halfway (a shredded key, an id source
 * repeating a stored id) which must leave nothing.
 *
 * Fixed clock and a deterministic id source, so the two stores are
 * comparable field by field. memory: and sqlite: always; postgres: when
 * ES_PG_URL is set (make test), each store in a fresh schema.
 * TAP-style output; non-zero exit on failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "store/store.h"

#include "tap.h"

/* One clock for every store: the time only moves between scenarios, so
 * both stores of a pair see the same times. */
static int64_t clock_now = 1700000000000;

static int fixed_clock(void *ctx, int64_t *now, es_err *err) {
  (void)ctx;
  (void)err;
  *now = clock_now;
  return ES_OK;
}

/* A store's id source: "<prefix>-g<n>", except that call bad_call (when
 * not 0) returns bad_id (an id already stored, to make an item fail after
 * its first result went in). */
typedef struct {
  char prefix[32];
  int n;
  int bad_call;
  char bad_id[64];
} id_source;

static int next_id(void *ctx, char *out, size_t cap, es_err *err) {
  id_source *src = ctx;
  (void)err;
  src->n++;
  if (src->bad_call && src->n == src->bad_call) snprintf(out, cap, "%s", src->bad_id);
  else snprintf(out, cap, "%s-g%d", src->prefix, src->n);
  return ES_OK;
}

/* The two stores of one backend: a runs complete_many, b the sequential
 * completes. */
typedef struct {
  const char *label;
  es_store *a, *b;
  id_source ida, idb;
  int setup_ok; /* every preparing call succeeded on both */
} pair;

static int open_pair(pair *p, const char *label, const char *url_a, const char *url_b,
                     const char *keys_a, const char *keys_b) {
  memset(p, 0, sizeof *p);
  p->label = label;
  es_open_opts o;
  es_err err = {0};
  memset(&o, 0, sizeof o);
  o.clock = fixed_clock;
  o.ids = next_id;
  o.ids_ctx = &p->ida;
  o.keys_path = keys_a;
  if (es_store_open(url_a, &o, &p->a, &err)) {
    printf("# %s: open %s: %s\n", label, url_a, err.msg);
    return 0;
  }
  o.ids_ctx = &p->idb;
  o.keys_path = keys_b;
  if (es_store_open(url_b, &o, &p->b, &err)) {
    printf("# %s: open %s: %s\n", label, url_b, err.msg);
    es_store_release(p->a);
    return 0;
  }
  return 1;
}

static void close_pair(pair *p) {
  es_store_release(p->a);
  es_store_release(p->b);
}

/* A new scenario: ids of its own, time moved on. */
static void scenario(pair *p, const char *prefix) {
  clock_now += 1000;
  p->setup_ok = 1;
  id_source *srcs[2] = {&p->ida, &p->idb};
  for (int i = 0; i < 2; i++) {
    memset(srcs[i], 0, sizeof *srcs[i]);
    snprintf(srcs[i]->prefix, sizeof srcs[i]->prefix, "%s", prefix);
  }
}

static void setup_check(pair *p, int rc, const char *what, const es_err *err) {
  if (rc == ES_OK) return;
  p->setup_ok = 0;
  printf("# %s: setup %s: %d %s\n", p->label, what, rc, err->msg);
}

/* Appends count events (type "job", ids "<session>.<index>") to session
 * on both stores; lanes[i] (lanes may be NULL) the lane of the i-th. */
static void both_append(pair *p, const char *session, int count, const char *const *lanes) {
  es_store *st[2] = {p->a, p->b};
  for (int k = 0; k < 2; k++) {
    es_err err = {0};
    int64_t head = 0;
    setup_check(p, es_store_head(st[k], session, &head, &err), "head", &err);
    es_new_event ev[64];
    char ids[64][80], pay[64][32];
    for (int i = 0; i < count && i < 64; i++) {
      es_new_event_init(&ev[i]);
      snprintf(ids[i], sizeof ids[i], "%s.%lld", session, (long long)(head + 1 + i));
      snprintf(pay[i], sizeof pay[i], "{\"n\":%d}", i);
      ev[i].id = ids[i];
      ev[i].type = "job";
      ev[i].payload = pay[i];
      ev[i].payload_len = strlen(pay[i]);
      ev[i].lane = lanes ? lanes[i] : NULL;
    }
    int pending;
    setup_check(p, es_store_append(st[k], session, ev, (size_t)count, ES_NONE, ES_NONE, NULL,
                                   &pending, &err),
                "append", &err);
  }
}

/* Claims every ready event of session on both stores (holder "w"). */
static void both_claim(pair *p, const char *session) {
  es_store *st[2] = {p->a, p->b};
  size_t got[2] = {0, 0};
  for (int k = 0; k < 2; k++) {
    es_claim_opts o = {"w", 3600000, ES_NONE, NULL, 0, ES_NONE};
    es_err err = {0};
    int outcome = 0;
    es_events out;
    int64_t retry_at;
    memset(&out, 0, sizeof out);
    setup_check(p, es_store_claim(st[k], session, &o, &outcome, &out, &retry_at, &err), "claim",
                &err);
    got[k] = out.n;
    es_events_destroy(&out);
  }
  if (got[0] != got[1]) {
    p->setup_ok = 0;
    printf("# %s: setup claim of %s: %zu vs %zu events\n", p->label, session, got[0], got[1]);
  }
}

/* Fails attempt `attempt` of (session, index) on both stores, ready again
 * at once (so the next claim makes attempt + 1). */
static void both_fail(pair *p, const char *session, int64_t index, int64_t attempt) {
  es_store *st[2] = {p->a, p->b};
  for (int k = 0; k < 2; k++) {
    es_err err = {0};
    int outcome;
    int64_t nf;
    setup_check(p, es_store_fail(st[k], session, index, attempt, "boom", 10, 0, &outcome, &nf, &err),
                "fail", &err);
  }
}

static void both_seal(pair *p, const char *session) {
  es_err err = {0};
  setup_check(p, es_store_seal(p->a, session, "closed", &err), "seal", &err);
  setup_check(p, es_store_seal(p->b, session, "closed", &err), "seal", &err);
}

static void both_fence(pair *p, const char *session) {
  es_err err = {0};
  int64_t tok;
  setup_check(p, es_store_fence(p->a, session, ES_NONE, &tok, &err), "fence", &err);
  setup_check(p, es_store_fence(p->b, session, ES_NONE, &tok, &err), "fence", &err);
}

static void both_shred(pair *p, const char *key) {
  es_err err = {0};
  int live;
  setup_check(p, es_store_shred(p->a, key, &live, &err), "shred", &err);
  setup_check(p, es_store_shred(p->b, key, &live, &err), "shred", &err);
}

/* A batch of completions, with room for their results. */
#define MAX_ITEMS 200
#define MAX_RES 3

typedef struct {
  es_completion v[MAX_ITEMS];
  es_new_event ev[MAX_ITEMS][MAX_RES];
  char sess[MAX_ITEMS][48];
  char ids[MAX_ITEMS][MAX_RES][64];
  char pay[MAX_ITEMS][MAX_RES][64];
  size_t n;
} batch;

static batch bt;

static void batch_reset(void) { memset(&bt, 0, sizeof bt); }

/* Adds a completion; returns its item number. */
static size_t item(const char *session, int64_t index, int64_t attempt, int64_t fence) {
  size_t i = bt.n++;
  if (i >= MAX_ITEMS) abort();
  snprintf(bt.sess[i], sizeof bt.sess[i], "%s", session);
  es_completion *c = &bt.v[i];
  c->session = bt.sess[i];
  c->index = index;
  c->attempt = attempt;
  c->evs = bt.ev[i];
  c->n = 0;
  c->fence = fence;
  return i;
}

/* Adds a result to item i: id NULL (generated), payload NULL ({"r":N}). */
static void result(size_t i, const char *id, const char *payload, const char *lane,
                   const char *key) {
  size_t j = bt.v[i].n++;
  if (j >= MAX_RES) abort();
  es_new_event *e = &bt.ev[i][j];
  es_new_event_init(e);
  if (id) {
    snprintf(bt.ids[i][j], sizeof bt.ids[i][j], "%s", id);
    e->id = bt.ids[i][j];
  }
  if (payload) snprintf(bt.pay[i][j], sizeof bt.pay[i][j], "%s", payload);
  else snprintf(bt.pay[i][j], sizeof bt.pay[i][j], "{\"r\":%zu}", i);
  e->type = "res";
  e->payload = bt.pay[i][j];
  e->payload_len = strlen(bt.pay[i][j]);
  e->lane = lane;
  e->key = key;
}

static const char *code_name(int rc) {
  static const char *const names[] = {"OK", "PARTIAL_DUPLICATE_BATCH", "ID_CONFLICT",
                                      "SUPERSEDED_ATTEMPT", "NO_SUCH_EVENT", "WRONG_EXPECTED_HEAD",
                                      "STALE_FENCE", "SEALED", "TRUNCATED", "REF_CONFLICT",
                                      "NOT_FOUND", "INVALID_ARGUMENT", "TOO_LARGE", "STORAGE",
                                      "CLOSED"};
  return rc >= 0 && rc < (int)(sizeof names / sizeof *names) ? names[rc] : "?";
}

/* The answers of the last run_batch: many (a, complete_many), seq (b). */
static es_completion many[MAX_ITEMS], seq[MAX_ITEMS];

static int same_str(const char *x, const char *y) {
  return (!x && !y) || (x && y && strcmp(x, y) == 0);
}

/* Runs the batch both ways and checks the answers agree item by item. */
static void run_batch(pair *p, const char *what) {
  char name[256];
  memcpy(many, bt.v, bt.n * sizeof *many);
  memcpy(seq, bt.v, bt.n * sizeof *seq);
  es_err err = {0};
  int rc = es_store_complete_many(p->a, many, bt.n, &err);
  if (rc) printf("# %s: %s: complete_many returned %s: %s\n", p->label, what, code_name(rc), err.msg);
  for (size_t i = 0; i < bt.n; i++) {
    es_completion *c = &seq[i];
    es_events out;
    memset(&c->err, 0, sizeof c->err);
    c->outcome = 0;
    c->rc = es_store_complete(p->b, c->session, c->index, c->attempt, c->evs, c->n, c->fence,
                              &c->outcome, &out, &c->err);
    if (c->rc == ES_OK) es_events_destroy(&out);
  }
  int same = rc == ES_OK, same_msg = 1, shown = 0;
  for (size_t i = 0; i < bt.n; i++) {
    const es_completion *m = &many[i], *q = &seq[i];
    int eq = m->rc == q->rc && (m->rc != ES_OK || m->outcome == q->outcome) &&
             (m->rc == ES_OK || m->err.code == q->err.code);
    int eq_msg = m->rc == ES_OK || strcmp(m->err.msg, q->err.msg) == 0;
    if ((!eq || !eq_msg) && shown++ < 8)
      printf("# %s: %s: item %zu (%s #%lld attempt %lld, %zu results): complete_many %s/%d \"%s\","
             " sequential %s/%d \"%s\"\n",
             p->label, what, i, m->session, (long long)m->index, (long long)m->attempt, m->n,
             code_name(m->rc), m->outcome, m->rc ? m->err.msg : "", code_name(q->rc), q->outcome,
             q->rc ? q->err.msg : "");
    same &= eq;
    same_msg &= eq_msg;
  }
  snprintf(name, sizeof name, "%s: %s: every item's rc/outcome/error code as sequential complete",
           p->label, what);
  ok(same, name);
  snprintf(name, sizeof name, "%s: %s: every item's error message as sequential complete", p->label,
           what);
  ok(same_msg, name);
}

/* Whether two events agree on every field a user (or the rules) sees. */
static int event_diff(const es_event *x, const es_event *y, char *why, size_t cap) {
#define INT_FIELD(f)                                                                          \
  if (x->f != y->f) {                                                                         \
    snprintf(why, cap, #f " %lld vs %lld", (long long)x->f, (long long)y->f);                 \
    return 1;                                                                                 \
  }
#define STR_FIELD(f)                                                                          \
  if (!same_str(x->f, y->f)) {                                                                \
    snprintf(why, cap, #f " %s vs %s", x->f ? x->f : "(null)", y->f ? y->f : "(null)");       \
    return 1;                                                                                 \
  }
  STR_FIELD(id)
  STR_FIELD(type)
  STR_FIELD(session)
  STR_FIELD(lane)
  STR_FIELD(key)
  INT_FIELD(index)
  /* a shredded event's payload is NULL */
  if ((x->payload || y->payload) &&
      (x->payload_len != y->payload_len || !x->payload || !y->payload ||
       memcmp(x->payload, y->payload, x->payload_len) != 0)) {
    snprintf(why, cap, "payload %.*s vs %.*s", (int)x->payload_len, x->payload ? x->payload : "",
             (int)y->payload_len, y->payload ? y->payload : "");
    return 1;
  }
  INT_FIELD(created_at)
  INT_FIELD(cause_index)
  INT_FIELD(cause_attempt)
  INT_FIELD(not_before)
  INT_FIELD(status)
  INT_FIELD(attempts)
  INT_FIELD(failures)
  STR_FIELD(last_error)
  INT_FIELD(processed_at)
  STR_FIELD(claim_holder)
  INT_FIELD(claim_expires_at)
  INT_FIELD(retry_at)
  INT_FIELD(first_claimed_at)
  INT_FIELD(last_claimed_at)
  INT_FIELD(failed_at)
  INT_FIELD(processed_by_attempt)
  INT_FIELD(returned)
  INT_FIELD(queued)
  INT_FIELD(due_at)
  INT_FIELD(shredded)
  return 0;
#undef INT_FIELD
#undef STR_FIELD
}

static int session_diff(const es_session_info *x, const es_session_info *y, char *why, size_t cap) {
#define INT_FIELD(f)                                                                          \
  if (x->f != y->f) {                                                                         \
    snprintf(why, cap, #f " %lld vs %lld", (long long)x->f, (long long)y->f);                 \
    return 1;                                                                                 \
  }
  if (!same_str(x->session, y->session)) {
    snprintf(why, cap, "name %s vs %s", x->session, y->session);
    return 1;
  }
  INT_FIELD(head)
  INT_FIELD(events)
  INT_FIELD(pending)
  INT_FIELD(dead)
  INT_FIELD(attempts)
  INT_FIELD(failures)
  INT_FIELD(first_at)
  INT_FIELD(updated_at)
  INT_FIELD(fence)
  INT_FIELD(sealed_at)
  INT_FIELD(first_index)
  return 0;
#undef INT_FIELD
}

/* Compares every session named prefix... and every event in them on both
 * stores; with claim, then claims what is ready in each (holder "z") on
 * both and compares what was claimed (which lane heads are queued). */
static void compare_state(pair *p, const char *prefix, const char *what, int claim) {
  char name[256], why[512];
  es_sessions sa, sb;
  es_err err = {0};
  int same = 1, shown = 0;
  memset(&sa, 0, sizeof sa);
  memset(&sb, 0, sizeof sb);
  if (es_store_sessions(p->a, prefix, NULL, 1000, &sa, &err) ||
      es_store_sessions(p->b, prefix, NULL, 1000, &sb, &err)) {
    printf("# %s: sessions: %s\n", p->label, err.msg);
    same = 0;
  }
  if (same && sa.n != sb.n) {
    printf("# %s: %s: %zu vs %zu sessions\n", p->label, what, sa.n, sb.n);
    same = 0;
  }
  for (size_t i = 0; same && i < sa.n; i++) {
    if (session_diff(&sa.v[i], &sb.v[i], why, sizeof why)) {
      if (shown++ < 8) printf("# %s: %s: session %s: %s\n", p->label, what, sa.v[i].session, why);
      same = 0;
      if (!same_str(sa.v[i].session, sb.v[i].session)) break;
    }
    es_events ea, eb;
    memset(&ea, 0, sizeof ea);
    memset(&eb, 0, sizeof eb);
    if (es_store_read(p->a, sa.v[i].session, 0, ES_NONE, ES_NONE, &ea, &err) ||
        es_store_read(p->b, sa.v[i].session, 0, ES_NONE, ES_NONE, &eb, &err)) {
      printf("# %s: read %s: %s\n", p->label, sa.v[i].session, err.msg);
      same = 0;
      es_events_destroy(&ea);
      continue;
    }
    if (ea.n != eb.n) {
      if (shown++ < 8)
        printf("# %s: %s: session %s: %zu vs %zu events\n", p->label, what, sa.v[i].session, ea.n,
               eb.n);
      same = 0;
    }
    for (size_t k = 0; k < ea.n && k < eb.n; k++) {
      if (event_diff(&ea.v[k], &eb.v[k], why, sizeof why)) {
        if (shown++ < 8)
          printf("# %s: %s: event %s #%lld: complete_many %s, sequential\n", p->label, what,
                 sa.v[i].session, (long long)ea.v[k].index, why);
        same = 0;
      }
    }
    es_events_destroy(&ea);
    es_events_destroy(&eb);
  }
  snprintf(name, sizeof name, "%s: %s: every session's counters and every event as sequential",
           p->label, what);
  ok(same, name);
  if (claim && same) {
    int same_ready = 1;
    clock_now += 10; /* a claim at the same time as the completions */
    for (size_t i = 0; i < sa.n; i++) {
      es_events ca, cb;
      int oa = 0, ob = 0;
      int64_t ra, rb;
      es_claim_opts o = {"z", 3600000, ES_NONE, NULL, 0, ES_NONE};
      memset(&ca, 0, sizeof ca);
      memset(&cb, 0, sizeof cb);
      int rca = es_store_claim(p->a, sa.v[i].session, &o, &oa, &ca, &ra, &err);
      int rcb = es_store_claim(p->b, sa.v[i].session, &o, &ob, &cb, &rb, &err);
      int eq = rca == rcb && oa == ob && ca.n == cb.n;
      for (size_t k = 0; eq && k < ca.n; k++) eq = ca.v[k].index == cb.v[k].index;
      if (!eq) {
        printf("# %s: %s: claim in %s: %zu vs %zu events ready\n", p->label, what, sa.v[i].session,
               ca.n, cb.n);
        same_ready = 0;
      }
      es_events_destroy(&ca);
      es_events_destroy(&cb);
    }
    snprintf(name, sizeof name, "%s: %s: the same events are ready afterwards (lanes, queued)",
             p->label, what);
    ok(same_ready, name);
  }
  es_sessions_destroy(&sa);
  es_sessions_destroy(&sb);
}

static void setup_done(pair *p, const char *what) {
  char name[256];
  snprintf(name, sizeof name, "%s: %s: both stores prepared alike", p->label, what);
  ok(p->setup_ok, name);
}

/* The items' answers (complete_many's) match these codes (ES_OK for
 * COMPLETED). */
static void expect(pair *p, const char *what, const int *codes, size_t n) {
  char name[256];
  int good = 1;
  for (size_t i = 0; i < n && i < bt.n; i++) {
    int want = codes[i];
    int got = many[i].rc;
    int pass = want == ES_SUPERSEDED + 100 ? got == ES_OK && many[i].outcome == ES_SUPERSEDED
               : want == ES_OK               ? got == ES_OK && many[i].outcome == ES_COMPLETED
                                             : got == want;
    if (!pass) {
      printf("# %s: %s: item %zu: got %s/%d \"%s\"\n", p->label, what, i, code_name(got),
             many[i].outcome, got ? many[i].err.msg : "");
      good = 0;
    }
  }
  snprintf(name, sizeof name, "%s: %s: the answers the contract gives", p->label, what);
  ok(good, name);
}
#define SUPERSEDED_OK (ES_SUPERSEDED + 100)

/* Whether session holds an event with that id on store s. */
static int has_id(es_store *s, const char *session, const char *id) {
  es_events ev;
  es_err err = {0};
  int found = 0;
  if (es_store_read(s, session, 0, ES_NONE, ES_NONE, &ev, &err)) return -1;
  for (size_t i = 0; i < ev.n; i++) found |= strcmp(ev.v[i].id, id) == 0;
  es_events_destroy(&ev);
  return found;
}

/* Status and attempts of (session, index) on s. */
static int status_of(es_store *s, const char *session, int64_t index, int64_t *attempts) {
  es_event e;
  es_err err = {0};
  if (es_store_get(s, session, index, &e, &err)) return -1;
  int st = e.status;
  *attempts = e.attempts;
  es_event_destroy(&e);
  return st;
}

/* --- scenarios --- */

/* 150 completions over 10 sessions, round robin (so the 64-item chunks of
 * read_ahead hold several items of every session, and the third chunk
 * starts mid-way): none, two with ids, or one with an id and one
 * generated (a savepoint) in turn. */
static void sc_many(pair *p) {
  const char *what = "150 items over 10 sessions";
  scenario(p, "s1");
  char s[10][16];
  for (int k = 0; k < 10; k++) {
    snprintf(s[k], sizeof s[k], "s1-%d", k);
    both_append(p, s[k], 15, NULL);
    both_claim(p, s[k]);
  }
  setup_done(p, what);
  batch_reset();
  int codes[150];
  for (int i = 0; i < 150; i++) {
    size_t it = item(s[i % 10], i / 10 + 1, 1, ES_NONE);
    char id[64];
    if (i % 3 == 1) {
      snprintf(id, sizeof id, "s1-r%d-a", i);
      result(it, id, NULL, NULL, NULL);
      snprintf(id, sizeof id, "s1-r%d-b", i);
      result(it, id, NULL, NULL, NULL);
    } else if (i % 3 == 2) {
      snprintf(id, sizeof id, "s1-r%d-a", i);
      result(it, id, NULL, NULL, NULL);
      result(it, NULL, NULL, NULL, NULL);
    }
    codes[i] = ES_OK;
  }
  run_batch(p, what);
  expect(p, what, codes, 150);
  compare_state(p, "s1-", what, 1);
}

/* The same event completed twice in one batch: the same ids (a replay,
 * also across the 64-item chunk), other ids, no results, generated ids. */
static void sc_twice(pair *p) {
  const char *what = "the same event twice in one batch";
  scenario(p, "s2");
  both_append(p, "s2-a", 6, NULL);
  both_claim(p, "s2-a");
  both_append(p, "s2-b", 64, NULL);
  both_claim(p, "s2-b");
  setup_done(p, what);
  batch_reset();
  size_t i;
  i = item("s2-a", 1, 1, ES_NONE), result(i, "s2-x1", NULL, NULL, NULL);
  i = item("s2-a", 1, 1, ES_NONE), result(i, "s2-x1", "{\"r\":0}", NULL, NULL); /* replay */
  i = item("s2-a", 2, 1, ES_NONE), result(i, "s2-x2", NULL, NULL, NULL);
  i = item("s2-a", 2, 1, ES_NONE), result(i, "s2-x2b", NULL, NULL, NULL); /* other ids */
  item("s2-a", 3, 1, ES_NONE);
  item("s2-a", 3, 1, ES_NONE); /* replay without results */
  i = item("s2-a", 4, 1, ES_NONE), result(i, NULL, NULL, NULL, NULL);
  i = item("s2-a", 4, 1, ES_NONE), result(i, NULL, "{\"r\":6}", NULL, NULL); /* generated */
  i = item("s2-a", 5, 1, ES_NONE), result(i, "s2-x5a", NULL, NULL, NULL),
  result(i, "s2-x5b", NULL, NULL, NULL);
  i = item("s2-a", 5, 1, ES_NONE), result(i, "s2-x5a", "{\"r\":8}", NULL, NULL); /* fewer */
  /* fill the first chunk */
  for (int k = 1; bt.n < 64; k++) {
    char id[32];
    snprintf(id, sizeof id, "s2-f%d", k);
    i = item("s2-b", k, 1, ES_NONE), result(i, id, NULL, NULL, NULL);
  }
  /* the next chunk: replays of the first chunk's completions */
  i = item("s2-a", 1, 1, ES_NONE), result(i, "s2-x1", "{\"r\":0}", NULL, NULL);
  i = item("s2-a", 2, 1, ES_NONE), result(i, "s2-x2", "{\"r\":2}", NULL, NULL);
  i = item("s2-a", 6, 1, ES_NONE), result(i, "s2-x6", NULL, NULL, NULL);
  i = item("s2-a", 6, 1, ES_NONE), result(i, "s2-x6", "{\"r\":66}", NULL, NULL);
  i = item("s2-b", 1, 1, ES_NONE), result(i, "s2-f1", "{\"r\":10}", NULL, NULL);
  int codes[] = {ES_OK, ES_OK, ES_OK, ES_PARTIAL_DUPLICATE_BATCH, ES_OK, ES_OK, ES_OK,
                 ES_PARTIAL_DUPLICATE_BATCH, ES_OK, ES_PARTIAL_DUPLICATE_BATCH};
  run_batch(p, what);
  expect(p, what, codes, sizeof codes / sizeof *codes);
  int tail[] = {ES_OK, ES_OK, ES_OK, ES_OK, ES_OK};
  int good = 1;
  for (size_t k = 0; k < 5; k++) good &= many[64 + k].rc == tail[k] && many[64 + k].outcome == ES_COMPLETED;
  char name[256];
  snprintf(name, sizeof name, "%s: %s: replays in the next chunk answer COMPLETED", p->label, what);
  ok(good, name);
  compare_state(p, "s2-", what, 1);
}

/* Two items whose results carry the same id: the second must see the
 * first's insert. */
static void sc_same_id(pair *p) {
  const char *what = "two items returning the same id";
  scenario(p, "s3");
  both_append(p, "s3-a", 10, NULL);
  both_claim(p, "s3-a");
  both_append(p, "s3-b", 4, NULL);
  both_claim(p, "s3-b");
  setup_done(p, what);
  batch_reset();
  size_t i;
  i = item("s3-a", 1, 1, ES_NONE), result(i, "s3-d1", "{\"same\":1}", NULL, NULL);
  i = item("s3-a", 2, 1, ES_NONE), result(i, "s3-d1", "{\"same\":1}", NULL, NULL);
  i = item("s3-a", 3, 1, ES_NONE), result(i, "s3-d2", "{\"p\":1}", NULL, NULL);
  i = item("s3-a", 4, 1, ES_NONE), result(i, "s3-d2", "{\"p\":2}", NULL, NULL);
  i = item("s3-a", 5, 1, ES_NONE), result(i, "s3-d3", "{\"same\":3}", NULL, NULL);
  i = item("s3-b", 1, 1, ES_NONE), result(i, "s3-d3", "{\"same\":3}", NULL, NULL);
  i = item("s3-a", 6, 1, ES_NONE), result(i, "s3-d4", "{\"same\":4}", NULL, NULL);
  i = item("s3-a", 7, 1, ES_NONE), result(i, "s3-d4", "{\"same\":4}", NULL, NULL),
  result(i, "s3-n7", NULL, NULL, NULL);
  /* good items after, and one returning an id the batch tried but never stored */
  i = item("s3-b", 2, 1, ES_NONE), result(i, "s3-n8", NULL, NULL, NULL);
  i = item("s3-a", 8, 1, ES_NONE), result(i, "s3-n7", NULL, NULL, NULL);
  i = item("s3-b", 3, 1, ES_NONE), result(i, "s3-d1", "{\"same\":1}", NULL, NULL);
  int codes[] = {ES_OK, ES_PARTIAL_DUPLICATE_BATCH, ES_OK, ES_ID_CONFLICT, ES_OK,
                 ES_PARTIAL_DUPLICATE_BATCH, ES_OK, ES_PARTIAL_DUPLICATE_BATCH, ES_OK, ES_OK,
                 ES_PARTIAL_DUPLICATE_BATCH};
  run_batch(p, what);
  expect(p, what, codes, sizeof codes / sizeof *codes);
  int64_t att = 0;
  int st2 = status_of(p->a, "s3-a", 2, &att), st4 = status_of(p->a, "s3-a", 4, &att);
  char name[256];
  snprintf(name, sizeof name, "%s: %s: the refused items' events stay pending", p->label, what);
  ok(st2 == ES_STATUS_PENDING && st4 == ES_STATUS_PENDING, name);
  compare_state(p, "s3-", what, 1);
}

/* Result ids stored before the batch: replays of earlier completions and
 * conflicts with appended events. */
static void sc_stored_ids(pair *p) {
  const char *what = "result ids stored before";
  scenario(p, "s4");
  both_append(p, "s4-a", 8, NULL); /* ids s4-a.1 .. s4-a.8 */
  both_claim(p, "s4-a");
  both_append(p, "s4-b", 1, NULL); /* s4-b.1 */
  /* event 1 completed before the batch with result s4-res1 */
  es_new_event r;
  es_new_event_init(&r);
  r.id = "s4-res1";
  r.type = "res";
  r.payload = "{\"v\":1}";
  r.payload_len = 7;
  es_store *st[2] = {p->a, p->b};
  for (int k = 0; k < 2; k++) {
    es_events out;
    es_err err = {0};
    int outcome;
    int rc = es_store_complete(st[k], "s4-a", 1, 1, &r, 1, ES_NONE, &outcome, &out, &err);
    setup_check(p, rc, "complete", &err);
    if (rc == ES_OK) es_events_destroy(&out);
  }
  setup_done(p, what);
  batch_reset();
  size_t i;
  i = item("s4-a", 1, 1, ES_NONE), result(i, "s4-res1", "{\"v\":1}", NULL, NULL); /* replay */
  i = item("s4-a", 1, 1, ES_NONE), result(i, "s4-res1", "{\"v\":2}", NULL, NULL); /* conflict */
  i = item("s4-a", 1, 1, ES_NONE), result(i, "s4-other", NULL, NULL, NULL);
  i = item("s4-a", 2, 1, ES_NONE), result(i, "s4-a.5", "{\"n\":4}", NULL, NULL);
  i = item("s4-a", 3, 1, ES_NONE), result(i, "s4-a.5", "{\"n\":9}", NULL, NULL);
  i = item("s4-a", 4, 1, ES_NONE), result(i, "s4-b.1", "{\"n\":0}", NULL, NULL);
  i = item("s4-a", 5, 1, ES_NONE), result(i, "s4-res1", "{\"v\":1}", NULL, NULL),
  result(i, "s4-new5", NULL, NULL, NULL);
  i = item("s4-a", 6, 1, ES_NONE), result(i, "s4-new6", NULL, NULL, NULL);
  i = item("s4-a", 7, 1, ES_NONE), result(i, "s4-res1", "{\"v\":1}", NULL, NULL);
  run_batch(p, what);
  /* the first answer is a replay; the rest are what the rules say */
  int codes[] = {ES_OK, ES_ID_CONFLICT, ES_PARTIAL_DUPLICATE_BATCH};
  expect(p, what, codes, sizeof codes / sizeof *codes);
  compare_state(p, "s4-", what, 1);
}

/* Superseded attempts, missing events, a sealed session and fences, mixed
 * among good items. */
static void sc_mixed(pair *p) {
  const char *what = "superseded, missing, sealed, fenced among good items";
  scenario(p, "s5");
  both_append(p, "s5-a", 6, NULL);
  both_claim(p, "s5-a");
  both_fail(p, "s5-a", 2, 1);
  both_claim(p, "s5-a"); /* event 2: attempt 2 */
  both_append(p, "s5-sealed", 3, NULL);
  both_claim(p, "s5-sealed");
  both_seal(p, "s5-sealed");
  both_append(p, "s5-fenced", 4, NULL);
  both_claim(p, "s5-fenced");
  both_fence(p, "s5-fenced");
  both_fence(p, "s5-fenced"); /* current token: 2 */
  setup_done(p, what);
  batch_reset();
  size_t i;
  i = item("s5-a", 1, 1, ES_NONE), result(i, "s5-r1", NULL, NULL, NULL);
  i = item("s5-a", 2, 1, ES_NONE), result(i, "s5-r2", NULL, NULL, NULL); /* superseded */
  i = item("s5-sealed", 1, 1, ES_NONE), result(i, "s5-r3", NULL, NULL, NULL);
  i = item("s5-a", 99, 1, ES_NONE), result(i, "s5-r4", NULL, NULL, NULL);
  i = item("s5-fenced", 1, 1, 1), result(i, "s5-r5", NULL, NULL, NULL); /* stale */
  i = item("s5-a", 2, 2, ES_NONE), result(i, "s5-r6", NULL, NULL, NULL);
  i = item("s5-sealed", 2, 1, ES_NONE);                                 /* no events: works */
  i = item("s5-fenced", 2, 1, 2), result(i, "s5-r8", NULL, NULL, NULL);
  i = item("s5-fenced", 3, 1, 3), result(i, "s5-r9", NULL, NULL, NULL); /* never issued */
  i = item("s5-nobody", 1, 1, ES_NONE), result(i, "s5-r10", NULL, NULL, NULL);
  i = item("s5-a", 3, 2, ES_NONE), result(i, "s5-r11", NULL, NULL, NULL); /* superseded */
  i = item("s5-fenced", 4, 1, 1);                                        /* stale, no events */
  i = item("s5-a", 3, 1, ES_NONE), result(i, "s5-r13", NULL, NULL, NULL);
  i = item("s5-sealed", 3, 1, ES_NONE), result(i, NULL, NULL, NULL, NULL); /* sealed, savepoint */
  i = item("s5-a", 4, 1, 5), result(i, "s5-r15", NULL, NULL, NULL);       /* never fenced */
  i = item("s5-a", 4, 1, ES_NONE), result(i, "s5-r15", NULL, NULL, NULL);
  i = item("s5-a", 0, 1, ES_NONE);
  i = item("s5-a", 5, 1, ES_NONE), result(i, "s5-r5", NULL, NULL, NULL); /* id the stale one named */
  int codes[] = {ES_OK, SUPERSEDED_OK, ES_SEALED, ES_NO_SUCH_EVENT, ES_STALE_FENCE, ES_OK, ES_OK,
                 ES_OK, ES_STALE_FENCE, ES_NO_SUCH_EVENT, SUPERSEDED_OK, ES_STALE_FENCE, ES_OK,
                 ES_SEALED, ES_STALE_FENCE, ES_OK, ES_NO_SUCH_EVENT, ES_OK};
  run_batch(p, what);
  expect(p, what, codes, sizeof codes / sizeof *codes);
  compare_state(p, "s5-", what, 1);
}

/* Lanes: results in a busy lane wait, in a free one are queued; a lane's
 * next event becomes ready when its head completes. */
static void sc_lanes(pair *p) {
  const char *what = "lanes";
  scenario(p, "s6");
  static const char *const lanes[] = {"A", "A", "B", NULL, "A", "C"};
  both_append(p, "s6-a", 6, lanes);
  both_claim(p, "s6-a"); /* 1 (A), 3 (B), 4, 6 (C) */
  static const char *const lanes2[] = {"X", "X", "X"};
  both_append(p, "s6-b", 3, lanes2);
  both_claim(p, "s6-b"); /* 1 */
  setup_done(p, what);
  batch_reset();
  size_t i;
  i = item("s6-a", 1, 1, ES_NONE), result(i, "s6-r1", NULL, "A", NULL),
  result(i, "s6-r2", NULL, "D", NULL);
  i = item("s6-a", 2, 1, ES_NONE); /* not claimed: superseded */
  i = item("s6-a", 3, 1, ES_NONE), result(i, "s6-r3", NULL, "B", NULL);
  i = item("s6-a", 4, 1, ES_NONE), result(i, "s6-r4", NULL, "A", NULL),
  result(i, "s6-r5", NULL, "D", NULL), result(i, NULL, NULL, "E", NULL);
  i = item("s6-b", 1, 1, ES_NONE), result(i, "s6-r6", NULL, "X", NULL);
  i = item("s6-b", 2, 1, ES_NONE); /* became queued in this batch, but unclaimed */
  i = item("s6-a", 6, 1, ES_NONE), result(i, "s6-r7", NULL, "C", NULL);
  int codes[] = {ES_OK, SUPERSEDED_OK, ES_OK, ES_OK, ES_OK, SUPERSEDED_OK, ES_OK};
  run_batch(p, what);
  expect(p, what, codes, sizeof codes / sizeof *codes);
  compare_state(p, "s6-", what, 1);
}

/* Generated ids, keys, and items failing after their first result went
 * in (a shredded key; the id source repeating a stored id): nothing of
 * theirs stays, their events stay pending, the others complete. */
static void sc_partial(pair *p) {
  const char *what = "generated ids, keys, items failing halfway";
  scenario(p, "s7");
  both_append(p, "s7-a", 8, NULL);
  both_claim(p, "s7-a");
  both_append(p, "s7-b", 3, NULL);
  both_claim(p, "s7-b");
  /* key k-gone: used once, then shredded */
  es_new_event e;
  es_new_event_init(&e);
  e.id = "s7-keyed";
  e.type = "job";
  e.payload = "{}";
  e.payload_len = 2;
  e.key = "k-gone";
  e.settled = 1;
  es_store *st[2] = {p->a, p->b};
  for (int k = 0; k < 2; k++) {
    es_err err = {0};
    int pending;
    setup_check(p, es_store_append(st[k], "s7-c", &e, 1, ES_NONE, ES_NONE, NULL, &pending, &err),
                "append keyed", &err);
  }
  both_shred(p, "k-gone");
  setup_done(p, what);
  batch_reset();
  size_t i;
  i = item("s7-a", 1, 1, ES_NONE), result(i, NULL, NULL, NULL, NULL),
  result(i, NULL, NULL, NULL, NULL); /* ids 1, 2 of the source */
  i = item("s7-a", 2, 1, ES_NONE), result(i, "s7-k2", NULL, NULL, "k-live");
  i = item("s7-a", 3, 1, ES_NONE), result(i, "s7-x3a", NULL, NULL, NULL),
  result(i, "s7-x3b", NULL, NULL, "k-gone"); /* fails at its second result */
  i = item("s7-a", 4, 1, ES_NONE), result(i, "s7-x3a", NULL, NULL, NULL); /* the id is free */
  i = item("s7-b", 1, 1, ES_NONE), result(i, NULL, NULL, NULL, NULL),
  result(i, NULL, NULL, NULL, NULL); /* ids 3, 4: 4 repeats a stored id */
  i = item("s7-a", 5, 1, ES_NONE), result(i, NULL, NULL, NULL, NULL); /* id 5 */
  i = item("s7-b", 1, 1, ES_NONE), result(i, "s7-x7", NULL, NULL, NULL); /* now it completes */
  i = item("s7-a", 6, 1, ES_NONE), result(i, "s7-x8", NULL, NULL, NULL),
  result(i, "s7-x8b", "{\"k\":1}", NULL, "k-live");
  p->ida.bad_call = p->idb.bad_call = 4;
  snprintf(p->ida.bad_id, sizeof p->ida.bad_id, "s7-a.1");
  snprintf(p->idb.bad_id, sizeof p->idb.bad_id, "s7-a.1");
  int codes[] = {ES_OK, ES_OK, ES_INVALID_ARGUMENT, ES_OK, ES_INVALID_ARGUMENT, ES_OK, ES_OK, ES_OK};
  run_batch(p, what);
  p->ida.bad_call = p->idb.bad_call = 0;
  expect(p, what, codes, sizeof codes / sizeof *codes);
  int64_t att3 = 0, attb = 0;
  int st3 = status_of(p->a, "s7-a", 3, &att3);
  int stb = status_of(p->a, "s7-b", 1, &attb);
  char name[256];
  snprintf(name, sizeof name, "%s: %s: nothing partial: no result of the failed items is stored",
           p->label, what);
  ok(has_id(p->a, "s7-a", "s7-x3b") == 0 && has_id(p->a, "s7-a", "s7-g3") == 0 &&
         has_id(p->a, "s7-b", "s7-g3") == 0 && has_id(p->a, "s7-a", "s7-x3a") == 1,
     name);
  snprintf(name, sizeof name, "%s: %s: the failed completion left its event pending (s7-b's "
           "completed by a later item)", p->label, what);
  ok(st3 == ES_STATUS_PENDING && att3 == 1 && stb == ES_STATUS_PROCESSED, name);
  compare_state(p, "s7-", what, 1);
}

/* A second complete_many in the sessions of the first: nothing read ahead
 * in the first may answer in the second. */
static void sc_second(pair *p) {
  const char *what = "a second batch in the same sessions";
  scenario(p, "s8");
  both_append(p, "s8-a", 12, NULL);
  both_claim(p, "s8-a");
  both_append(p, "s8-b", 4, NULL);
  both_claim(p, "s8-b");
  setup_done(p, what);
  batch_reset();
  for (int k = 1; k <= 5; k++) {
    char id[32];
    snprintf(id, sizeof id, "s8-r%d", k);
    size_t i = item("s8-a", k, 1, ES_NONE);
    result(i, id, NULL, NULL, NULL);
  }
  size_t i = item("s8-b", 1, 1, ES_NONE);
  result(i, "s8-rb1", NULL, NULL, NULL);
  run_batch(p, "s8 first batch");
  compare_state(p, "s8-", "s8 first batch", 0);
  batch_reset();
  i = item("s8-a", 1, 1, ES_NONE), result(i, "s8-r1", "{\"r\":0}", NULL, NULL); /* replay */
  i = item("s8-a", 3, 1, ES_NONE), result(i, "s8-other", NULL, NULL, NULL);
  i = item("s8-a", 6, 1, ES_NONE), result(i, "s8-r6", NULL, NULL, NULL);
  i = item("s8-a", 7, 1, ES_NONE), result(i, "s8-r2", "{\"r\":1}", NULL, NULL); /* stored id */
  i = item("s8-b", 2, 1, ES_NONE), result(i, "s8-r4", "{\"r\":3}", NULL, NULL); /* other session */
  i = item("s8-b", 1, 1, ES_NONE), result(i, "s8-rb1", "{\"r\":5}", NULL, NULL); /* replay */
  i = item("s8-a", 8, 1, ES_NONE);
  i = item("s8-a", 14, 1, ES_NONE); /* a result of the first batch: never claimed */
  i = item("s8-a", 9, 1, ES_NONE), result(i, "s8-r9", NULL, NULL, NULL);
  int codes[] = {ES_OK, ES_PARTIAL_DUPLICATE_BATCH, ES_OK, ES_PARTIAL_DUPLICATE_BATCH,
                 ES_PARTIAL_DUPLICATE_BATCH, ES_OK, ES_OK, SUPERSEDED_OK, ES_OK};
  run_batch(p, what);
  expect(p, what, codes, sizeof codes / sizeof *codes);
  compare_state(p, "s8-", what, 1);
}

/* The store-wide counts agree at the end. */
static void compare_counts(pair *p) {
  es_counts ca, cb;
  es_err err = {0};
  char name[256];
  int good = es_store_counts(p->a, &ca, &err) == ES_OK && es_store_counts(p->b, &cb, &err) == ES_OK;
  good = good && ca.sessions == cb.sessions && ca.events == cb.events && ca.pending == cb.pending &&
         ca.dead == cb.dead;
  if (!good)
    printf("# %s: counts %lld/%lld/%lld/%lld vs %lld/%lld/%lld/%lld\n", p->label,
           (long long)ca.sessions, (long long)ca.events, (long long)ca.pending, (long long)ca.dead,
           (long long)cb.sessions, (long long)cb.events, (long long)cb.pending, (long long)cb.dead);
  snprintf(name, sizeof name, "%s: store-wide counts as sequential", p->label);
  ok(good, name);
}

static void run(const char *label, const char *url_a, const char *url_b, const char *keys_a,
                const char *keys_b) {
  pair p;
  char name[128];
  int opened = open_pair(&p, label, url_a, url_b, keys_a, keys_b);
  snprintf(name, sizeof name, "%s: two stores open", label);
  ok(opened, name);
  if (!opened) return;
  sc_many(&p);
  sc_twice(&p);
  sc_same_id(&p);
  sc_stored_ids(&p);
  sc_mixed(&p);
  sc_lanes(&p);
  sc_partial(&p);
  sc_second(&p);
  compare_counts(&p);
  close_pair(&p);
}

int main(void) {
  printf("# complete_many_test: complete_many against sequential complete\n");
  char dir[] = "/tmp/es-cm-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  char ka[128], kb[128], pa[128], pb[128], ua[200], ub[200];
  snprintf(ka, sizeof ka, "%s/a.key", dir);
  snprintf(kb, sizeof kb, "%s/b.key", dir);
  run("memory", "memory:", "memory:", ka, kb);
  snprintf(pa, sizeof pa, "%s/a.db", dir);
  snprintf(pb, sizeof pb, "%s/b.db", dir);
  snprintf(ua, sizeof ua, "sqlite:%s", pa);
  snprintf(ub, sizeof ub, "sqlite:%s", pb);
  run("sqlite", ua, ub, ka, kb);
  const char *pg = getenv("ES_PG_URL");
  if (pg && *pg) {
    char u1[1024], u2[1024];
    pg_url(pg, "cm_a", u1, sizeof u1);
    pg_url(pg, "cm_b", u2, sizeof u2);
    run("postgres", u1, u2, ka, kb);
  } else {
    skip("postgres: ES_PG_URL is not set (make test sets it)");
  }
  unlink_sqlite(pa);
  unlink_sqlite(pb);
  unlink(ka);
  unlink(kb);
  rmdir(dir);
  return tap_done();
}
