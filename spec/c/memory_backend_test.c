/*
 * memory_backend_test.c: unit test of the "memory:" backend through its ops
 * table (backend.h), without the core: every op (events, sessions and their
 * children, snapshots, refs, presence), its ordering and limits, every field
 * of every row read back exactly, undo on savepoint_rollback and
 * write_rollback (the whole observable state, indexes included, must be
 * identical afterwards), out-of-memory at every allocation of every write
 * op, concurrent readers, its two containers (tree.h, hmap.h) against a
 * reference, and a scale check whose figures (inserts/s, bytes per event,
 * per-call costs) it prints. Retention (§3.9: event_delete_range,
 * session_delete, snapshot_delete_all, ref_delete_session) is in the undo
 * and out-of-memory steps, has tests of its own, a random run against a
 * model, and a cost check (removing a few rows of a big store costs what
 * they cost, not what the store holds).
 *
 * Prints TAP-style "ok N - name" / "not ok N - name" lines ("# ..." lines
 * are diagnostics and figures) and exits non-zero when a test failed.
 *
 *   memory_backend_test [N]   N: events of the scale check (default
 *   1000000; 20000 under valgrind, 200000 under AddressSanitizer; the
 *   MBT_SCALE_N environment variable also sets it)
 *
 * Out-of-memory tests replace malloc/calloc/realloc/free with wrappers that
 * fail on demand; under AddressSanitizer and valgrind, which own malloc, those
 * tests print a SKIP line (never ok).
 *
 * Cases every backend shares are written once in backend_test.c, which runs
 * them against memory, sqlite and postgres (snapshots, sessions,
 * session_children's listing, lanes, queues, types, dead letters and
 * presence moved there); the rows and the populated store both use are in
 * backend_rows.h.
 */
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store/backend.h"
#include "util/hmap.h"
#include "util/tree.h"

#if defined(__SANITIZE_ADDRESS__)
#define MBT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MBT_ASAN 1
#endif
#endif
#ifndef MBT_ASAN
#define MBT_ASAN 0
#endif

/* ---- allocation failure injection --------------------------------------- */

/* Counts down allocations while armed; the one that reaches zero fails.
 * Test-only state: the library itself has none. */
static long fail_countdown = -1;

#if !MBT_ASAN
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);

static int should_fail(void) {
  if (fail_countdown < 0) return 0;
  return fail_countdown-- == 0;
}
void *malloc(size_t n) { return should_fail() ? NULL : __libc_malloc(n); }
void *calloc(size_t n, size_t m) { return should_fail() ? NULL : __libc_calloc(n, m); }
void *realloc(void *p, size_t n) { return should_fail() ? NULL : __libc_realloc(p, n); }
void free(void *p) { __libc_free(p); }
#endif

/* 1: this run counts allocations (the wrappers above are ours, not
 * valgrind's or AddressSanitizer's, which put their own malloc in front). */
static int allocs_counted(void) {
  void *(*volatile alloc)(size_t) = malloc; /* a call the compiler cannot elide */
  fail_countdown = 0;
  void *probe = alloc(1);
  fail_countdown = -1;
  free(probe);
  return probe == NULL;
}

/* ---- TAP ---------------------------------------------------------------- */

static const es_backend_ops *OPS = &es_backend_memory;
#include "backend_check.h"

static int test_no, failed_tests;
static const char *cur_skip; /* set by skip_case: this run cannot test the case */

/* A case this run cannot test (a sanitizer or valgrind owns malloc): run()
 * prints TAP's "ok N - # SKIP why" (spec/c/tap.h's skip form), which
 * spec/run.sh counts apart from passes. */
static void skip_case(const char *why) { cur_skip = why; }

static void run(const char *name, void (*fn)(void)) {
  cur_failed = 0;
  cur_skip = NULL;
  fn();
  test_no++;
  if (cur_skip && !cur_failed) {
    printf("ok %d - # SKIP %s: %s\n", test_no, name, cur_skip);
    fflush(stdout);
    return;
  }
  printf("%sok %d - %s\n", cur_failed ? "not " : "", test_no, name);
  fflush(stdout);
  if (cur_failed) failed_tests++;
}

/* ---- helpers ------------------------------------------------------------ */


static es_backend *open_mem(void) {
  es_backend *b = NULL;
  es_err err;
  if (OPS->open("", NULL, &b, &err) != ES_OK) {
    printf("# open failed: %s\n", err.msg);
    exit(2);
  }
  return b;
}

static es_txn *wbegin(es_backend *b) {
  es_txn *t = NULL;
  es_err err;
  if (tx_write_begin(OPS, b, &t, &err) != ES_OK) {
    printf("# write_begin failed\n");
    exit(2);
  }
  return t;
}

static void commit(es_txn *t) {
  es_err err;
  CHECK_RC(OPS->write_commit(BK(t), t, &err), ES_OK);
}

static es_txn *rbegin(es_backend *b) {
  es_txn *t = NULL;
  es_err err;
  if (tx_read_begin(OPS, b, &t, &err) != ES_OK) {
    printf("# read_begin failed\n");
    exit(2);
  }
  return t;
}

#include "backend_rows.h"


/* ---- a text dump of the whole observable state --------------------------- */

typedef struct sbuf {
  char *p;
  size_t n, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) {
  va_list ap;
  for (;;) {
    va_start(ap, fmt);
    int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) abort();
    if (b->p && b->n + (size_t)k < b->cap) {
      b->n += (size_t)k;
      return;
    }
    size_t cap = (b->cap ? b->cap * 2 : 4096) + (size_t)k;
    char *q = realloc(b->p, cap);
    if (!q) abort();
    b->p = q;
    b->cap = cap;
  }
}

static void sb_bytes(sbuf *b, const char *p, size_t n) {
  if (!p) {
    sb_printf(b, "NULL");
    return;
  }
  sb_printf(b, "\"");
  for (size_t i = 0; i < n; i++) sb_printf(b, "%02x", (unsigned char)p[i]);
  sb_printf(b, "\"");
}

static void sb_str(sbuf *b, const char *s) { sb_bytes(b, s, s ? strlen(s) : 0); }

static void dump_event(sbuf *b, const es_event *e) {
  sb_printf(b, "ev ");
  sb_str(b, e->session);
  sb_printf(b, " #%lld pos=%lld id=", (long long)e->index, (long long)e->position);
  sb_str(b, e->id);
  sb_printf(b, " type=");
  sb_str(b, e->type);
  sb_printf(b, " payload=");
  sb_bytes(b, e->payload, e->payload_len);
  sb_printf(b, " lane=");
  sb_str(b, e->lane);
  sb_printf(b, " c=%lld cause=%lld/%lld nb=%lld st=%d att=%lld fail=%lld err=", (long long)e->created_at,
            (long long)e->cause_index, (long long)e->cause_attempt, (long long)e->not_before,
            e->status, (long long)e->attempts, (long long)e->failures);
  sb_str(b, e->last_error);
  sb_printf(b, " pat=%lld holder=", (long long)e->processed_at);
  sb_str(b, e->claim_holder);
  sb_printf(b, " exp=%lld retry=%lld q=%d due=%lld lfa=%lld ret=%lld", (long long)e->claim_expires_at,
            (long long)e->retry_at, e->queued, (long long)e->due_at, (long long)e->last_failed_attempt,
            (long long)e->returned);
  sb_printf(b, " fca=%lld lca=%lld fat=%lld pba=%lld origin=", (long long)e->first_claimed_at,
            (long long)e->last_claimed_at, (long long)e->failed_at, (long long)e->processed_by_attempt);
  sb_str(b, e->origin_session);
  sb_printf(b, "/%lld\n", (long long)e->origin_index);
}

static int dump_event_cb(void *ctx, const es_event *e) {
  dump_event(ctx, e);
  return 0;
}

static int dump_session_cb(void *ctx, const es_session_info *si) {
  sbuf *b = ctx;
  sb_printf(b, "session ");
  sb_str(b, si->session);
  sb_printf(b, " %lld %lld %lld %lld %lld %lld %lld %lld", (long long)si->head, (long long)si->events,
            (long long)si->pending, (long long)si->dead, (long long)si->attempts,
            (long long)si->failures, (long long)si->first_at, (long long)si->updated_at);
  sb_printf(b, " fence=%lld sealed=%lld reason=", (long long)si->fence, (long long)si->sealed_at);
  sb_str(b, si->seal_reason);
  sb_printf(b, " lease=");
  sb_str(b, si->lease_holder);
  sb_printf(b, "/%lld/%lld parent=", (long long)si->lease_token, (long long)si->lease_expires_at);
  sb_str(b, si->parent);
  sb_printf(b, "@%lld/%lld first=%lld\n", (long long)si->fork_at, (long long)si->forked_at,
            (long long)si->first_index);
  return 0;
}

static int dump_ref_cb(void *ctx, const es_ref *r) {
  sbuf *b = ctx;
  sb_printf(b, "ref ");
  sb_str(b, r->name);
  sb_printf(b, " -> ");
  sb_str(b, r->session);
  sb_printf(b, " head=%lld %lld %lld\n", (long long)r->head, (long long)r->created_at,
            (long long)r->updated_at);
  return 0;
}

static int dump_snap_cb(void *ctx, const es_snapshot *sn) {
  sbuf *b = ctx;
  sb_printf(b, "snap ");
  sb_str(b, sn->reducer);
  sb_printf(b, " %lld ", (long long)sn->index);
  sb_str(b, sn->version);
  sb_printf(b, " %lld state=%s\n", (long long)sn->updated_at, sn->state ? "SET" : "NULL");
  return 0;
}

static int dump_pres_cb(void *ctx, const es_presence_row *r) {
  sbuf *b = ctx;
  sb_printf(b, "pres ");
  sb_str(b, r->participant);
  sb_printf(b, " ");
  sb_str(b, r->field);
  sb_printf(b, " ");
  sb_bytes(b, r->value, r->value_len);
  sb_printf(b, " %lld %lld %lld\n", (long long)r->seen, (long long)r->at, (long long)r->expires_at);
  return 0;
}

/* What a state dump visits besides what event_all reveals. */
static const char *const U_SESSIONS[] = {"a",  "b",  "c",  "new",  "snaponly", "x/1",
                                         "x/2", "fa", "fb", "fc", "fnew", "ghost", NULL};
static const char *const U_REFS[] = {"main", "dev", "rel/1", "new", "none", NULL};
static const char *const U_LANES[] = {"l1", "l2", "newlane", NULL};
static const char *const U_REDUCERS[] = {"r1", "r2", "r3", NULL};
static const char *const U_NS[] = {"ns1", "ns2", "newns", NULL};
static const char *const U_TYPES[] = {"t", "u", "newtype", "none", NULL};
static const char *const U_PARTS[] = {"p1", "p2", "p3", NULL};
static const char *const U_FIELDS[] = {"f1", "f2", NULL};
static const int64_t U_NOWS[] = {INT64_MIN, 0, 1000, 1003, 1005, 1010, 5000, INT64_MAX};

/* Everything the ops can observe, as text; equal dumps = equal states. */
static char *dump_state(es_txn *t, const char *const *ids) {
  sbuf b = {0};
  es_err err;
  sb_printf(&b, "== all\n");
  OPS->event_all(BK(t), t, NULL, ES_NONE, ES_NONE, dump_event_cb, &b, &err);
  int64_t last = -1;
  OPS->last_position(BK(t), t, &last, &err);
  sb_printf(&b, "== last %lld\n", (long long)last);
  sb_printf(&b, "== sessions\n");
  OPS->session_list(BK(t), t, "", NULL, ES_NONE, dump_session_cb, &b, &err);
  for (size_t k = 0; k < sizeof U_NOWS / sizeof U_NOWS[0]; k++) {
    sb_printf(&b, "== due %lld\n", (long long)U_NOWS[k]);
    OPS->queued_due(BK(t), t, NULL, NULL, U_NOWS[k], ES_NONE, dump_event_cb, &b, &err);
    sb_printf(&b, "next %lld\n", (long long)next_due(t, NULL, U_NOWS[k]));
  }
  sb_printf(&b, "== dead\n");
  OPS->dead_list(BK(t), t, NULL, NULL, ES_NONE, ES_NONE, dump_event_cb, &b, &err);
  sb_printf(&b, "== refs\n");
  OPS->ref_list(BK(t), t, NULL, ES_NONE, dump_ref_cb, &b, &err);
  OPS->ref_list(BK(t), t, "dev", 1, dump_ref_cb, &b, &err);
  for (const char *const *r = U_REFS; *r; r++) {
    es_ref ref;
    es_ref_init(&ref);
    if (OPS->ref_get(BK(t), t, *r, &ref, &err) == ES_OK) dump_ref_cb(&b, &ref);
    es_ref_destroy(&ref);
  }
  for (const char *const *ty = U_TYPES; *ty; ty++)
    for (size_t k = 0; k < sizeof U_NOWS / sizeof U_NOWS[0]; k++) {
      ints c = due_type_pos(t, *ty, U_NOWS[k], ES_NONE);
      sb_printf(&b, "type %s due %lld:", *ty, (long long)U_NOWS[k]);
      for (size_t i = 0; i < c.n; i++) sb_printf(&b, " %lld", (long long)c.v[i]);
      sb_printf(&b, " next %lld\n", (long long)next_due_type(t, *ty, U_NOWS[k]));
    }
  type_text tt;
  sb_printf(&b, "== pending types %s\n", pending_text(t, &tt));
  for (const char *const *s = U_SESSIONS; *s; s++) {
    es_session_info si;
    es_session_info_init(&si);
    sb_printf(&b, "== session %s\n", *s);
    if (OPS->session_get(BK(t), t, *s, &si, &err) == ES_OK) dump_session_cb(&b, &si);
    es_session_info_destroy(&si);
    sb_printf(&b, "children:\n");
    OPS->session_children(BK(t), t, *s, NULL, ES_NONE, dump_session_cb, &b, &err);
    sb_printf(&b, "children after fa, 1:\n");
    OPS->session_children(BK(t), t, *s, "fa", 1, dump_session_cb, &b, &err);
    OPS->event_range(BK(t), t, *s, 0, ES_NONE, ES_NONE, dump_event_cb, &b, &err);
    for (size_t k = 0; k < sizeof U_NOWS / sizeof U_NOWS[0]; k++) {
      ints c = due_pos(t, *s, U_NOWS[k], ES_NONE);
      /* Per-session order is free: sort before printing. */
      for (size_t i = 1; i < c.n; i++)
        for (size_t j = i; j > 0 && c.v[j - 1] > c.v[j]; j--) {
          int64_t x = c.v[j];
          c.v[j] = c.v[j - 1];
          c.v[j - 1] = x;
        }
      sb_printf(&b, "due %lld:", (long long)U_NOWS[k]);
      for (size_t i = 0; i < c.n; i++) sb_printf(&b, " %lld", (long long)c.v[i]);
      sb_printf(&b, " next %lld\n", (long long)next_due(t, *s, U_NOWS[k]));
    }
    ints d = dead_pos(t, *s, 0, ES_NONE);
    sb_printf(&b, "dead:");
    for (size_t i = 0; i < d.n; i++) sb_printf(&b, " %lld", (long long)d.v[i]);
    sb_printf(&b, "\n");
    for (const char *const *l = U_LANES; *l; l++) {
      sb_printf(&b, "lane %s:", *l);
      for (int64_t after = 0; after < 40; after++)
        sb_printf(&b, " %lld", (long long)lane_next(t, *s, *l, after));
      sb_printf(&b, "\n");
    }
    OPS->snapshot_list(BK(t), t, *s, dump_snap_cb, &b, &err);
    for (const char *const *r = U_REDUCERS; *r; r++) {
      es_snapshot sn;
      es_snapshot_init(&sn);
      if (OPS->snapshot_get(BK(t), t, *s, *r, &sn, &err) == ES_OK) {
        sb_printf(&b, "snapget ");
        sb_bytes(&b, sn.state, sn.state_len);
        dump_snap_cb(&b, &sn);
      }
      es_snapshot_destroy(&sn);
    }
  }
  for (const char *const *ns = U_NS; *ns; ns++) {
    sb_printf(&b, "== ns %s\n", *ns);
    OPS->presence_list(BK(t), t, *ns, INT64_MIN, dump_pres_cb, &b, &err);
    for (const char *const *p = U_PARTS; *p; p++)
      for (const char *const *f = U_FIELDS; *f; f++) {
        es_presence_row r;
        es_presence_row_init(&r);
        if (OPS->presence_get(BK(t), t, *ns, *p, *f, &r, &err) == ES_OK) dump_pres_cb(&b, &r);
        es_presence_row_destroy(&r);
      }
  }
  for (size_t i = 0; ids && ids[i]; i++) {
    es_event e;
    es_event_init(&e);
    if (OPS->event_get_by_id(BK(t), t, ids[i], &e, &err) == ES_OK) {
      sb_printf(&b, "id %s -> %lld\n", ids[i], (long long)e.position);
    } else {
      sb_printf(&b, "id %s -> none\n", ids[i]);
    }
    es_event_destroy(&e);
  }
  return b.p;
}

static int same_dump(const char *x, const char *y) {
  if (strcmp(x, y) == 0) return 1;
  /* Show the first differing line. */
  const char *p = x, *q = y;
  while (*p && *p == *q) p++, q++;
  while (p > x && p[-1] != '\n') p--, q--;
  printf("#   state differs at:\n#   before: %.200s\n#   after:  %.200s\n", p, q);
  return 0;
}

/* ---- a populated store -------------------------------------------------- */

static const char *const BASE_IDS[] = {"a1", "a2", "a3",  "a4",  "a5", "a6",  "a7", "b1",
                                       "b2", "b3", "c1",  "n1",  "x1", "fa1", "fn1", NULL};


/* The write steps the rollback and out-of-memory tests replay: every write
 * op, moving rows in and out of every index. Each returns an es code. */
static int step_insert_lane(es_txn *t) { return ins(t, mkrow("a", 7, "a7", "l1")); }
static int step_insert_new_session(es_txn *t) {
  es_event e = mkrow("new", 1, "n1", "newlane");
  e.type = "newtype";  /* a type's first row: undo must drop the type too */
  e.status = ES_STATUS_DEAD;
  e.queued = 0;
  e.last_error = "dead on arrival";
  return ins(t, e);
}
static int step_insert_settled(es_txn *t) {
  es_event e = mkrow("b", 4, "x1", NULL);
  e.status = ES_STATUS_PROCESSED;
  e.processed_at = e.created_at;
  e.returned = -1;
  e.queued = 0;
  return ins(t, e);
}
static int step_process_a1(es_txn *t) { return set_state(t, "a", 1, ES_STATUS_PROCESSED, 0, ES_NONE); }
static int step_queue_a2(es_txn *t) { return set_state(t, "a", 2, ES_STATUS_PENDING, 1, 1002); }
static int step_revive_a4(es_txn *t) { return set_state(t, "a", 4, ES_STATUS_PENDING, 1, 1004); }
static int step_move_b1(es_txn *t) { return set_state(t, "b", 1, ES_STATUS_PENDING, 1, 1000); }
static int step_kill_a3(es_txn *t) { return set_state(t, "a", 3, ES_STATUS_DEAD, 0, ES_NONE); }
static int step_claim_b2(es_txn *t) {
  es_event e;
  es_err err;
  es_event_init(&e);
  int rc = OPS->event_get(BK(t), t, "b", 2, &e, &err);
  if (rc) return rc;
  free(e.claim_holder);
  e.claim_holder = strdup("worker-2");
  e.attempts++;
  e.claim_expires_at = 4000;
  e.due_at = 4000;
  rc = e.claim_holder ? upd(t, &e) : ES_STORAGE;
  es_event_destroy(&e);
  return rc;
}
static int step_clear_c1(es_txn *t) {
  es_event e;
  es_err err;
  es_event_init(&e);
  int rc = OPS->event_get(BK(t), t, "c", 1, &e, &err);
  if (rc) return rc;
  e.attempts = e.returned = 0;
  e.processed_at = e.created_at;  /* back to the compact "settled" form */
  free(e.claim_holder);
  e.claim_holder = NULL;
  e.claim_expires_at = ES_NONE;
  rc = upd(t, &e);
  es_event_destroy(&e);
  return rc;
}
/* A fork's copies: origin an existing session, then a name that is none. */
static int step_insert_forked(es_txn *t) {
  es_event e = mkrow("fa", 1, "fa1", "l1");
  e.status = ES_STATUS_PROCESSED;
  e.processed_at = e.created_at;
  e.returned = -1;
  e.queued = 0;
  e.due_at = ES_NONE;
  e.origin_session = "a";
  e.origin_index = 1;
  return ins(t, e);
}
static int step_insert_forked_ghost(es_txn *t) {
  es_event e = mkrow("fnew", 1, "fn1", NULL);
  e.status = ES_STATUS_PROCESSED;
  e.processed_at = 1;
  e.returned = -1;
  e.queued = 0;
  e.due_at = ES_NONE;
  e.origin_session = "ghost";
  e.origin_index = 4;
  return ins(t, e);
}
/* Completes a6 (attempt 2) and fails b1: every new dispatch field. */
static int step_complete_a6(es_txn *t) {
  es_event e;
  es_err err;
  es_event_init(&e);
  int rc = OPS->event_get(BK(t), t, "a", 6, &e, &err);
  if (rc) return rc;
  e.status = ES_STATUS_PROCESSED;
  e.queued = 0;
  e.due_at = ES_NONE;
  e.attempts = 2;
  e.first_claimed_at = 1011;
  e.last_claimed_at = 1020;
  e.processed_at = 1030;
  e.processed_by_attempt = 2;
  e.returned = 1;
  rc = upd(t, &e);
  es_event_destroy(&e);
  return rc;
}
static int step_fail_b1(es_txn *t) {
  es_event e;
  es_err err;
  es_event_init(&e);
  int rc = OPS->event_get(BK(t), t, "b", 1, &e, &err);
  if (rc) return rc;
  e.attempts = e.failures = 1;
  e.first_claimed_at = e.last_claimed_at = 1003;
  e.failed_at = 1004;
  e.last_failed_attempt = 1;
  e.retry_at = e.due_at = 1100;
  e.last_error = "nope";
  rc = upd(t, &e);
  e.last_error = NULL;
  es_event_destroy(&e);
  return rc;
}
/* b2, claimed above, completed by that attempt: the compact record
 * (RF_COMPACT) in place of its claim's block. Built whole rather than read
 * back, so that its only allocation is the undo log's (log_only). */
static int step_complete_b2_once(es_txn *t) {
  es_event e = mkrow("b", 2, "b2", NULL);
  e.status = ES_STATUS_PROCESSED;
  e.queued = 0;
  e.due_at = ES_NONE;
  e.attempts = e.processed_by_attempt = 1;
  e.first_claimed_at = e.last_claimed_at = 1010;
  e.processed_at = 1020;
  e.returned = 2;
  return upd(t, &e);
}
/* b2 again: pending, queued, its second attempt failed; compact to block. */
static int step_retry_b2(es_txn *t) {
  es_event e = mkrow("b", 2, "b2", NULL);
  e.attempts = 2;
  e.failures = 1;
  e.first_claimed_at = 1010;
  e.last_claimed_at = 1030;
  e.failed_at = 1031;
  e.last_failed_attempt = 2;
  e.retry_at = e.due_at = 1200;
  e.last_error = "again";
  return upd(t, &e);
}
static int step_sess_fork(es_txn *t) { return sess_put_full(t, "fnew", 1, "a", NULL, NULL); }
static int step_sess_reparent(es_txn *t) { return sess_put_full(t, "fb", 4, "b", "closed", "w9"); }
static int step_sess_unparent(es_txn *t) { return sess_put_full(t, "fc", 5, NULL, "sealed", NULL); }
static int step_sess_seal(es_txn *t) { return sess_put_full(t, "fa", 6, "a", "done", "w7"); }
static int step_ref_add(es_txn *t) { return ref_put(t, "new", "fnew", 10, 10); }
static int step_ref_replace(es_txn *t) { return ref_put(t, "main", "b", 1, 11); }
static int step_ref_delete(es_txn *t) { return ref_del(t, "dev"); }
static int step_ref_readd(es_txn *t) { return ref_put(t, "dev", "fb", 12, 12); }
static int step_sess_replace(es_txn *t) { return sess_put(t, "a", 7); }
static int step_sess_first(es_txn *t) { return sess_put(t, "c", 1); }
static int step_sess_new(es_txn *t) { return sess_put(t, "x/2", 0); }
static int step_snap_replace(es_txn *t) { return snap_put(t, "a", "r1", 5, "S1b", "v2"); }
static int step_snap_add(es_txn *t) { return snap_put(t, "a", "r3", 1, "", "v"); }
static int step_snap_new_session(es_txn *t) { return snap_put(t, "x/1", "r2", 9, "S9", "v"); }
static int step_pres_replace(es_txn *t) { return pres_put(t, "ns1", "p1", "f1", "2", 20, 2500); }
static int step_pres_add(es_txn *t) { return pres_put(t, "ns1", "p3", "f2", NULL, 21, 2500); }
static int step_pres_new_ns(es_txn *t) { return pres_put(t, "newns", "p1", "f1", "{}", 22, 2500); }
static int step_pres_expire(es_txn *t) {
  es_err err;
  return OPS->presence_expire(BK(t), t, "ns1", 2000, &err);
}
/* Retention, after the steps above: rows leave every set (a1 processed,
 * a2 queued in l1; b's claimed, failed, laned, settled rows), refs by
 * session, sessions detached and their names and ids taken again in the
 * same transaction, a fork's origin deleted under its copies. */
static int step_trunc_a(es_txn *t) { return del_range(t, "a", 2); }
static int step_del_b_rows(es_txn *t) { return del_range(t, "b", INT64_MAX); }
static int step_del_b_refs(es_txn *t) { return refs_del(t, "b"); }
static int step_del_b(es_txn *t) { return sess_del(t, "b"); }
static int step_reuse_b2(es_txn *t) {
  es_event e = mkrow("b", 1, "b2", "l1");  /* a new b, with a removed row's id */
  e.type = "u";
  e.due_at = 999;
  return ins(t, e);
}
static int step_reuse_x1(es_txn *t) {
  es_event e = mkrow("b", 2, "x1", NULL);
  e.status = ES_STATUS_DEAD;
  e.queued = 0;
  e.due_at = ES_NONE;
  e.last_error = "again";
  return ins(t, e);
}
static int step_reuse_b_row(es_txn *t) { return sess_put(t, "b", 2); }
static int step_del_a_snaps(es_txn *t) { return snaps_del(t, "a"); }
static int step_del_a_rows(es_txn *t) { return del_range(t, "a", INT64_MAX); }
static int step_del_a(es_txn *t) { return sess_del(t, "a"); }
static int step_fork_gone(es_txn *t) {
  es_event e = mkrow("fa", 2, "a1", NULL);  /* copied from the deleted a, a1's id again */
  e.status = ES_STATUS_PROCESSED;
  e.processed_at = e.created_at;
  e.returned = -1;
  e.queued = 0;
  e.due_at = ES_NONE;
  e.origin_session = "a";
  e.origin_index = 1;
  return ins(t, e);
}
static int step_del_fb(es_txn *t) { return sess_del(t, "fb"); }
static int step_del_snaponly(es_txn *t) { return snaps_del(t, "snaponly"); }
static int step_trunc_c(es_txn *t) { return del_range(t, "c", 1); }
static int step_new_a(es_txn *t) { return sess_put_full(t, "a", 0, "c", NULL, NULL); }

typedef struct step {
  const char *name;
  int (*fn)(es_txn *);
} step;

static const step STEPS[] = {
    {"insert laned", step_insert_lane},       {"insert new session", step_insert_new_session},
    {"insert settled", step_insert_settled},  {"process a1", step_process_a1},
    {"queue a2", step_queue_a2},              {"revive a4", step_revive_a4},
    {"move b1", step_move_b1},                {"kill a3", step_kill_a3},
    {"claim b2", step_claim_b2},              {"clear c1", step_clear_c1},
    {"session replace", step_sess_replace},   {"session first put", step_sess_first},
    {"session new", step_sess_new},           {"snapshot replace", step_snap_replace},
    {"snapshot add", step_snap_add},          {"snapshot new session", step_snap_new_session},
    {"presence replace", step_pres_replace},  {"presence add", step_pres_add},
    {"presence new ns", step_pres_new_ns},    {"presence expire", step_pres_expire},
    {"insert forked", step_insert_forked},    {"insert forked from ghost", step_insert_forked_ghost},
    {"complete a6", step_complete_a6},        {"fail b1", step_fail_b1},
    {"complete b2 once", step_complete_b2_once}, {"retry b2", step_retry_b2},
    {"session fork", step_sess_fork},         {"session reparent", step_sess_reparent},
    {"session unparent", step_sess_unparent}, {"session seal", step_sess_seal},
    {"ref add", step_ref_add},                {"ref replace", step_ref_replace},
    {"ref delete", step_ref_delete},          {"ref re-add", step_ref_readd},
    {"truncate a", step_trunc_a},             {"delete b's rows", step_del_b_rows},
    {"delete refs of b", step_del_b_refs},    {"delete session b", step_del_b},
    {"new b, id b2 again", step_reuse_b2},    {"new b, id x1 again", step_reuse_x1},
    {"new b's row", step_reuse_b_row},        {"delete a's snapshots", step_del_a_snaps},
    {"delete a's rows", step_del_a_rows},     {"delete session a", step_del_a},
    {"copy from deleted a", step_fork_gone},  {"delete session fb", step_del_fb},
    {"delete snaponly's snapshots", step_del_snaponly}, {"truncate c", step_trunc_c},
    {"new a", step_new_a},
};
#define NSTEPS (sizeof STEPS / sizeof STEPS[0])

/* Steps whose only allocation is the undo log growing (every removal, and
 * a completion into the compact record):
 * the out-of-memory test reaches them by filling the log first. */
static int log_only(int (*fn)(es_txn *)) {
  return fn == step_pres_expire || fn == step_ref_delete || fn == step_trunc_a ||
         fn == step_del_b_rows || fn == step_del_b_refs || fn == step_del_b ||
         fn == step_del_a_snaps || fn == step_del_a_rows || fn == step_del_a ||
         fn == step_del_fb || fn == step_del_snaponly || fn == step_trunc_c ||
         fn == step_complete_b2_once;
}

static void run_steps(es_txn *t, size_t from, size_t to) {
  for (size_t i = from; i < to; i++) {
    int rc = STEPS[i].fn(t);
    if (rc != ES_OK) {
      printf("#   step %s: %s\n", STEPS[i].name, es_strerror(rc));
      cur_failed = 1;
    }
  }
}

/* ---- tests: each op ----------------------------------------------------- */

static void test_open(void) {
  es_backend *b = NULL;
  es_err err = {0};
  CHECK_RC(OPS->open("", NULL, &b, &err), ES_OK);
  OPS->close(b);
  b = NULL;
  CHECK_RC(OPS->open(NULL, NULL, &b, &err), ES_OK);
  OPS->close(b);
  b = (es_backend *)1;
  CHECK_RC(OPS->open("/tmp/x", NULL, &b, &err), ES_INVALID_ARGUMENT);
  CHECK(b == NULL);
  CHECK(strstr(err.msg, "memory:/tmp/x") != NULL);
  CHECK(strcmp(OPS->scheme, "memory") == 0);
  CHECK(OPS->group_commit == 0);
  OPS->close(NULL);
}

static int64_t last_pos(es_txn *t) {
  int64_t p = -1;
  es_err err;
  CHECK_RC(OPS->last_position(BK(t), t, &p, &err), ES_OK);
  return p;
}

/* event_insert, event_get, event_get_by_id, event_range, event_all,
 * event_update and last_position are cases of backend_test.c (run on every
 * backend). This one is memory's own: which error a write in a read
 * transaction gets and the rows memory refuses itself (a gap, a taken index,
 * an id of another row, an unknown status; the core never passes them), with
 * the state compared whole (dump_state). */
static void test_insert_rejects(void) {
  es_backend *b = open_mem();
  populate(b);
  es_txn *t = rbegin(b);
  char *before = dump_state(t, BASE_IDS);
  es_err err;
  es_event e = mkrow("a", 7, "q", NULL);
  CHECK_RC(OPS->event_insert(BK(t), t, &e, &err), ES_INVALID_ARGUMENT); /* read transaction */
  CHECK_RC(sess_put(t, "a", 1), ES_INVALID_ARGUMENT);
  OPS->read_end(BK(t), t);
  t = wbegin(b);
  CHECK_RC(ins(t, mkrow("a", 8, "q", NULL)), ES_INVALID_ARGUMENT);   /* gap */
  CHECK_RC(ins(t, mkrow("a", 6, "q", NULL)), ES_INVALID_ARGUMENT);   /* taken */
  CHECK_RC(ins(t, mkrow("zz", 2, "q", NULL)), ES_INVALID_ARGUMENT);  /* new session not at 1 */
  CHECK_RC(ins(t, mkrow("a", 7, "b1", NULL)), ES_INVALID_ARGUMENT);  /* id of another row */
  CHECK_RC(ins(t, mkrow("a", 7, "", NULL)), ES_INVALID_ARGUMENT);
  e = mkrow("a", 7, "q", NULL);
  e.status = 7;
  CHECK_RC(ins(t, e), ES_INVALID_ARGUMENT);
  e = mkrow("a", 1, "q", NULL);
  e.status = 9;
  CHECK_RC(upd(t, &e), ES_INVALID_ARGUMENT);
  e = mkrow("a", 9, "q", NULL);
  CHECK_RC(upd(t, &e), ES_NOT_FOUND);
  e = mkrow("zz", 1, "q", NULL);
  CHECK_RC(upd(t, &e), ES_NOT_FOUND);
  char *after = dump_state(t, BASE_IDS);
  CHECK(same_dump(before, after));
  commit(t);
  free(before);
  free(after);
  OPS->close(b);
}

/* lane_next, queued_due, the per-type queues and dead_list are cases of
 * backend_test.c, run on every backend. This one is memory's own: it
 * refuses a NULL lane, where sqlite and postgres answer as for no row (the
 * interface leaves it open: the core always passes a lane). */
static void test_lane_next_null(void) {
  es_backend *b = open_mem();
  populate(b);
  es_txn *t = wbegin(b);
  es_err err;
  int64_t i = 5;
  CHECK_RC(OPS->lane_next(BK(t), t, "a", NULL, 0, &i, &err), ES_INVALID_ARGUMENT);
  commit(t);
  OPS->close(b);
}

static char *dump_now(es_backend *b);

/* e read back through every read op that returns it equals want. */
static void check_reads(es_txn *t, const es_event *want) {
  es_err err;
  sbuf w = {0};
  dump_event(&w, want);
  es_event g;
  es_event_init(&g);
  CHECK_RC(OPS->event_get(BK(t), t, want->session, want->index, &g, &err), ES_OK);
  sbuf x = {0};
  dump_event(&x, &g);
  CHECK(same_dump(w.p, x.p));
  CHECK(g.packed == 1);
  es_event_destroy(&g);
  CHECK_RC(OPS->event_get_by_id(BK(t), t, want->id, &g, &err), ES_OK);
  sbuf y = {0};
  dump_event(&y, &g);
  CHECK(same_dump(w.p, y.p));
  es_event_destroy(&g);
  /* The borrowed views of the walks. */
  sbuf r = {0}, a = {0};
  CHECK_RC(OPS->event_range(BK(t), t, want->session, want->index - 1, want->index, ES_NONE,
                            dump_event_cb, &r, &err),
           ES_OK);
  CHECK(r.p && same_dump(w.p, r.p));
  CHECK_RC(OPS->event_all(BK(t), t, NULL, want->position - 1, 1, dump_event_cb, &a, &err), ES_OK);
  CHECK(a.p && same_dump(w.p, a.p));
  free(w.p);
  free(x.p);
  free(y.p);
  free(r.p);
  free(a.p);
}

static int64_t ins_row(es_txn *t, es_event *e) {
  es_err err;
  CHECK_RC(OPS->event_insert(BK(t), t, e, &err), ES_OK);
  return e->position;
}

/* The origins and dispatch fields through every read are a case of
 * backend_test.c (case_event_fields); this is memory's own: undone, rows
 * and the origin names they brought leave the whole state (dump_state) as
 * it was, and done again they take the same positions (backend.h promises
 * only positions above every committed one). */
static void test_event_fields(void) {
  es_backend *b = open_mem();
  es_txn *t = wbegin(b);
  es_event rows[8];
  int n = origin_rows(rows);
  for (int i = 0; i < n; i++) CHECK(ins_row(t, &rows[i]) == i + 1);
  commit(t);

  /* Undone, the rows and the origin names they brought go; done again,
   * they read back the same. */
  char *before = dump_now(b);
  t = wbegin(b);
  es_event x = mkrow("k", 1, "k1", NULL);
  x.origin_session = "ghost3";
  x.origin_index = 2;
  es_event y = mkrow("k", 2, "k2", NULL);
  y.origin_session = "ghost3";
  y.origin_index = 3;
  es_event z = mkrow("f", 6, "f6", NULL);
  z.origin_session = "ghost3";
  z.origin_index = 5;
  CHECK(ins_row(t, &x) == n + 1 && ins_row(t, &y) == n + 2 && ins_row(t, &z) == n + 3);
  check_reads(t, &y);
  OPS->write_rollback(BK(t), t);
  char *after = dump_now(b);
  CHECK(same_dump(before, after));
  t = wbegin(b);
  CHECK(ins_row(t, &x) == n + 1 && ins_row(t, &y) == n + 2 && ins_row(t, &z) == n + 3);
  commit(t);
  t = rbegin(b);
  check_reads(t, &x);
  check_reads(t, &z);
  OPS->read_end(BK(t), t);
  free(before);
  free(after);
  OPS->close(b);
}

/* The immutable fields dump_event leaves out read back as inserted. */
static void check_extras(es_txn *t, const char *session, int64_t index, int64_t revision,
                         const char *meta, const char *key) {
  es_err err;
  es_event g;
  es_event_init(&g);
  CHECK_RC(OPS->event_get(BK(t), t, session, index, &g, &err), ES_OK);
  CHECK(g.revision == revision);
  CHECK(meta ? g.meta && strcmp(g.meta, meta) == 0 : !g.meta);
  CHECK(key ? g.key && strcmp(g.key, key) == 0 : !g.key);
  es_event_destroy(&g);
}

/* An update undone gives back every flag of the row, not only the
 * dispatch ones: a row with a revision, meta and a key (flags beyond the
 * low nine bits) reads back whole after write_rollback and
 * savepoint_rollback of a claim. */
static void test_update_undo_flags(void) {
  es_backend *b = open_mem();
  es_txn *t = wbegin(b);
  es_event e = mkrow("s", 1, "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", NULL);
  e.revision = 3;
  e.meta = "{\"trace\":\"x\"}";
  e.key = "k1";
  ins_row(t, &e);
  commit(t);
  for (int sp = 0; sp < 2; sp++) {
    es_err err;
    t = wbegin(b);
    if (sp) CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
    es_event c = e;
    c.attempts = 1;
    c.claim_holder = "w";
    c.first_claimed_at = c.last_claimed_at = 1005;
    c.claim_expires_at = c.due_at = 2000;
    CHECK_RC(upd(t, &c), ES_OK);
    check_reads(t, &c);
    if (sp) OPS->savepoint_rollback(BK(t), t);
    else OPS->write_rollback(BK(t), t);
    if (sp) commit(t);
    t = rbegin(b);
    check_reads(t, &e);
    check_extras(t, "s", 1, 3, e.meta, "k1");
    OPS->read_end(BK(t), t);
  }
  OPS->close(b);
}

static void check_session(es_txn *t, const char *name, const char *want) {
  es_session_info si;
  es_err err;
  es_session_info_init(&si);
  CHECK_RC(OPS->session_get(BK(t), t, name, &si, &err), ES_OK);
  sbuf x = {0};
  dump_session_cb(&x, &si);
  CHECK(x.p && same_dump(want, x.p));
  free(x.p);
  es_session_info_destroy(&si);
}

static void test_session_fields(void) {
  es_backend *b = open_mem();
  es_txn *t = wbegin(b);
  es_err err;
  /* A seal reason as long as the store keeps. */
  char *reason = malloc(ES_MAX_TEXT_BYTES + 1);
  memset(reason, 'r', ES_MAX_TEXT_BYTES);
  reason[ES_MAX_TEXT_BYTES] = '\0';
  es_session_info si;
  es_session_info_init(&si);
  si.session = "s";
  si.head = 1;
  si.fence = 9;
  si.sealed_at = 10;
  si.seal_reason = reason;
  si.lease_holder = "holder";
  si.lease_token = 9;
  si.lease_expires_at = 11;
  si.parent = "p";
  si.fork_at = 12;
  si.forked_at = 13;
  si.first_index = 14;  /* stored like the others (§3.9) */
  CHECK_RC(OPS->session_put(BK(t), t, &si, &err), ES_OK);
  sbuf want = {0};
  dump_session_cb(&want, &si);
  /* The row was copied: the caller's strings are its own. */
  reason[0] = 'X';
  check_session(t, "s", want.p);
  es_session_info got;
  es_session_info_init(&got);
  CHECK_RC(OPS->session_get(BK(t), t, "s", &got, &err), ES_OK);
  CHECK(strlen(got.seal_reason) == ES_MAX_TEXT_BYTES && got.seal_reason[0] == 'r');
  got.lease_holder[0] = 'Z';  /* owned by the caller */
  es_session_info_destroy(&got);
  check_session(t, "s", want.p);
  /* Every field through session_list and session_children too. */
  sbuf l = {0}, c = {0};
  CHECK_RC(OPS->session_list(BK(t), t, "s", NULL, ES_NONE, dump_session_cb, &l, &err), ES_OK);
  CHECK(l.p && same_dump(want.p, l.p));
  CHECK_RC(OPS->session_children(BK(t), t, "p", NULL, ES_NONE, dump_session_cb, &c, &err), ES_OK);
  CHECK(c.p && same_dump(want.p, c.p));
  free(l.p);
  free(c.p);
  /* Replaced by a row with no strings, then empty ones. */
  es_session_info plain;
  es_session_info_init(&plain);
  plain.session = "s";
  plain.head = 2;
  CHECK_RC(OPS->session_put(BK(t), t, &plain, &err), ES_OK);
  sbuf want2 = {0};
  dump_session_cb(&want2, &plain);
  check_session(t, "s", want2.p);
  plain.seal_reason = plain.lease_holder = plain.parent = "";
  CHECK_RC(OPS->session_put(BK(t), t, &plain, &err), ES_OK);
  sbuf want3 = {0};
  dump_session_cb(&want3, &plain);
  check_session(t, "s", want3.p);
  commit(t);
  t = rbegin(b);
  check_session(t, "s", want3.p);
  OPS->read_end(BK(t), t);
  /* Rolled back to the long row and forth again. */
  t = wbegin(b);
  reason[0] = 'r';
  CHECK_RC(OPS->session_put(BK(t), t, &si, &err), ES_OK);
  check_session(t, "s", want.p);
  OPS->write_rollback(BK(t), t);
  t = rbegin(b);
  check_session(t, "s", want3.p);
  OPS->read_end(BK(t), t);
  free(want.p);
  free(want2.p);
  free(want3.p);
  free(reason);
  OPS->close(b);
}

/* session_children's listing is a case of backend_test.c (every backend).
 * These are memory's own: its NULL parent refused, a negative limit, undo
 * checked against
 * its whole-state dump, and walks past its chunk with a callback that
 * writes. */
static void test_children(void) {
  es_backend *b = open_mem();
  es_txn *t = wbegin(b);
  es_err err;
  ntext c = {.n = 0};
  const char *kids[] = {"p/b", "p/a", "p/\xff", "p/\xc3\xa9", "q", "p/a/1"};
  for (size_t i = 0; i < sizeof kids / sizeof kids[0]; i++)
    CHECK_RC(sess_put_full(t, kids[i], (int64_t)i, "p", NULL, NULL), ES_OK);
  CHECK_RC(sess_put_full(t, "p", 0, NULL, NULL, NULL), ES_OK);
  CHECK_RC(sess_put_full(t, "q/1", 0, "q", NULL, NULL), ES_OK);
  commit(t);
  t = rbegin(b);
  CHECK_RC(OPS->session_children(BK(t), t, NULL, NULL, ES_NONE, ntext_cb, &c, &err),
           ES_INVALID_ARGUMENT);
  /* A negative limit lists nothing here; sqlite and postgres list all (the
   * core refuses negative limits before any backend sees one). */
  CHECK(strcmp(children(t, "p", NULL, -3, &c), "") == 0);
  OPS->read_end(BK(t), t);

  /* A put that changes the parent moves the child; one that keeps it
   * keeps one entry; one without a parent removes it. Undone exactly. */
  char *before = dump_now(b);
  t = wbegin(b);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  CHECK_RC(sess_put_full(t, "p/b", 9, "q", NULL, NULL), ES_OK);
  CHECK_RC(sess_put_full(t, "p/a", 9, NULL, "sealed", NULL), ES_OK);
  CHECK_RC(sess_put_full(t, "q", 9, "p", "sealed", "h"), ES_OK);
  CHECK_RC(sess_put_full(t, "q", 10, "p", NULL, NULL), ES_OK);
  CHECK_RC(sess_put_full(t, "new", 0, "q", NULL, NULL), ES_OK);
  CHECK(strcmp(children(t, "p", NULL, ES_NONE, &c), "p/a/1 p/\xc3\xa9 p/\xff q ") == 0);
  CHECK(strcmp(children(t, "q", NULL, ES_NONE, &c), "new p/b q/1 ") == 0);
  sbuf one = {0};
  CHECK_RC(OPS->session_children(BK(t), t, "p", "p/\xff", ES_NONE, dump_session_cb, &one, &err),
           ES_OK);
  CHECK(one.p && strstr(one.p, " 10 10 ") != NULL);  /* the latest row of q */
  free(one.p);
  OPS->savepoint_rollback(BK(t), t);
  CHECK(strcmp(children(t, "p", NULL, ES_NONE, &c), "p/a p/a/1 p/b p/\xc3\xa9 p/\xff q ") == 0);
  CHECK(strcmp(children(t, "q", NULL, ES_NONE, &c), "q/1 ") == 0);
  CHECK_RC(sess_put_full(t, "p/b", 9, "q", NULL, NULL), ES_OK);
  CHECK_RC(sess_put_full(t, "new", 0, "p", NULL, NULL), ES_OK);
  OPS->write_rollback(BK(t), t);
  char *after = dump_now(b);
  CHECK(same_dump(before, after));
  free(before);
  free(after);
  t = rbegin(b);
  CHECK(strcmp(children(t, "p", NULL, ES_NONE, &c), "p/a p/a/1 p/b p/\xc3\xa9 p/\xff q ") == 0);
  OPS->read_end(BK(t), t);

  /* Beyond one walk chunk, with a callback that moves each child away and
   * adds new ones behind the walk: each child is seen once. */
  t = wbegin(b);
  for (int i = 0; i < 100; i++) {
    char name[16];
    snprintf(name, sizeof name, "c%03d", i);
    CHECK_RC(sess_put_full(t, name, i, "big", NULL, NULL), ES_OK);
  }
  CHECK_RC(sess_put_full(t, "bif/1", 0, "bif", NULL, NULL), ES_OK);
  CHECK_RC(sess_put_full(t, "bih/1", 0, "bih", NULL, NULL), ES_OK);
  children(t, "big", NULL, ES_NONE, &c);
  CHECK(c.calls == 100 && strncmp(c.s, "c000 c001 ", 10) == 0);
  children(t, "big", "c010", ES_NONE, &c);
  CHECK(c.calls == 89 && strncmp(c.s, "c011 ", 5) == 0);
  children(t, "big", "c010", 70, &c);
  CHECK(c.calls == 70 && strstr(c.s, "c080 ") != NULL && strstr(c.s, "c081") == NULL);
  c.t = t;
  c.mode = 1;
  children(t, "big", NULL, ES_NONE, &c);
  c.mode = 0;
  /* The 50 even ones (the odd ones left before their turn, in this chunk
   * and the next), then the 40 added behind them ("zz1".."zz40"), each
   * moved away in its turn. */
  CHECK(c.calls == 90);
  CHECK(strncmp(c.s, "c000 c002 c004 ", 15) == 0);
  CHECK(strstr(c.s, "c030 c032 c034 ") != NULL);
  CHECK(strstr(c.s, "c098 zz1 zz10 ") != NULL);
  children(t, "big", NULL, ES_NONE, &c);
  CHECK(c.calls == 0);
  children(t, "elsewhere", NULL, ES_NONE, &c);
  CHECK(c.calls == 140 && strncmp(c.s, "c000 ", 5) == 0);
  commit(t);
  OPS->close(b);
}

/* The ref cases every backend shares are in backend_test.c (case_refs);
 * what stays here is memory's own: which error a write in a read
 * transaction gets and NULL names and a negative limit (outside backend.h's
 * promises), the undo compared over the whole state (dump_state), walks
 * whose callback writes, and closing with ref writes open. */
static void test_refs(void) {
  es_backend *b = open_mem();
  es_err err;
  es_ref r;
  es_ref_init(&r);
  es_txn *t = rbegin(b);
  rtext c = {.n = 0};
  /* Writes need a write transaction (memory's error: ES_INVALID_ARGUMENT). */
  CHECK_RC(ref_put(t, "main", "s", 1, 1), ES_INVALID_ARGUMENT);
  CHECK_RC(ref_del(t, "main"), ES_INVALID_ARGUMENT);
  OPS->read_end(BK(t), t);
  t = wbegin(b);
  CHECK_RC(ref_put(t, "b", "s1", 1, 2), ES_OK);
  CHECK_RC(ref_put(t, "a", "s5", 3, 11), ES_OK);
  CHECK_RC(ref_put(t, "\xff", "s3", 5, 6), ES_OK);
  CHECK_RC(ref_put(t, "a/1", "s4", 7, 8), ES_OK);
  CHECK_RC(ref_put(t, NULL, "s", 1, 1), ES_INVALID_ARGUMENT);
  CHECK_RC(ref_put(t, "x", NULL, 1, 1), ES_INVALID_ARGUMENT);
  CHECK_RC(ref_del(t, NULL), ES_NOT_FOUND);
  commit(t);
  t = rbegin(b);
  CHECK_RC(OPS->ref_get(BK(t), t, NULL, &r, &err), ES_NOT_FOUND);
  CHECK(strcmp(refs(t, NULL, -1, &c), "") == 0);
  OPS->read_end(BK(t), t);

  /* Undo: every kind of ref write, nested, restores the exact state. */
  char *before = dump_now(b);
  t = wbegin(b);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  CHECK_RC(ref_put(t, "a", "s6", 3, 12), ES_OK);
  CHECK_RC(ref_del(t, "b"), ES_OK);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  CHECK_RC(ref_put(t, "b", "s7", 13, 13), ES_OK);
  CHECK_RC(ref_put(t, "b", "s8", 13, 14), ES_OK);
  CHECK_RC(ref_del(t, "a/1"), ES_OK);
  CHECK_RC(ref_put(t, "c", "s9", 15, 15), ES_OK);
  OPS->savepoint_rollback(BK(t), t);
  OPS->savepoint_rollback(BK(t), t);
  CHECK_RC(ref_del(t, "a"), ES_OK);
  CHECK_RC(ref_put(t, "a", "s10", 16, 16), ES_OK);
  OPS->write_rollback(BK(t), t);
  char *after = dump_now(b);
  CHECK(same_dump(before, after));
  free(before);
  free(after);

  /* Beyond one walk chunk, with a callback that replaces and deletes refs
   * of this chunk and the next ones: replaced refs are read as they are
   * now, deleted ones are skipped. */
  t = wbegin(b);
  CHECK_RC(ref_del(t, "\xff"), ES_OK);  /* the only name after "r" */
  for (int i = 0; i < 100; i++) {
    char name[16];
    snprintf(name, sizeof name, "r%03d", i);
    CHECK_RC(ref_put(t, name, "s", i, i), ES_OK);
  }
  c.t = t;
  c.mode = 1;
  refs(t, "r", ES_NONE, &c);
  c.mode = 0;
  CHECK(c.calls == 91);
  CHECK(strncmp(c.s, "r000=s r001=moved r002=s r003=moved ", 36) == 0);
  CHECK(strstr(c.s, "r009=moved r011=moved r012=s ") != NULL);
  CHECK(strstr(c.s, "r089=moved r091=moved ") != NULL);
  char *walked = strdup(c.s);
  refs(t, "r", ES_NONE, &c);
  CHECK(c.calls == 91 && strcmp(c.s, walked) == 0);
  free(walked);
  commit(t);
  /* Closing with ref writes open frees every block. */
  t = wbegin(b);
  CHECK_RC(ref_put(t, "r000", "x", 0, 0), ES_OK);
  CHECK_RC(ref_del(t, "r001"), ES_OK);
  CHECK_RC(ref_put(t, "zz", "x", 0, 0), ES_OK);
  OPS->close(b);
}

/* ---- tests: transactions ------------------------------------------------ */

static char *dump_now(es_backend *b) {
  es_txn *t = rbegin(b);
  char *d = dump_state(t, BASE_IDS);
  OPS->read_end(BK(t), t);
  return d;
}

static void test_savepoint_rollback(void) {
  es_backend *b = open_mem();
  populate(b);
  char *base = dump_now(b);
  es_txn *t = wbegin(b);
  es_err err;
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  run_steps(t, 0, NSTEPS);
  char *changed = dump_state(t, BASE_IDS);
  CHECK(strcmp(changed, base) != 0);
  OPS->savepoint_rollback(BK(t), t);
  char *d = dump_state(t, BASE_IDS);
  CHECK(same_dump(base, d));
  free(d);
  /* Again, then keep it: the same state as doing it once. */
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  run_steps(t, 0, NSTEPS);
  CHECK_RC(OPS->savepoint_release(BK(t), t, &err), ES_OK);
  d = dump_state(t, BASE_IDS);
  CHECK(same_dump(changed, d));
  free(d);
  commit(t);
  d = dump_now(b);
  CHECK(same_dump(changed, d));
  free(d);
  free(changed);
  free(base);
  OPS->close(b);
}

static void test_write_rollback(void) {
  es_backend *b = open_mem();
  populate(b);
  char *base = dump_now(b);
  es_txn *t = wbegin(b);
  run_steps(t, 0, NSTEPS);
  OPS->write_rollback(BK(t), t);
  char *d = dump_now(b);
  CHECK(same_dump(base, d));
  free(d);
  /* Positions of rolled-back rows are given again: none was committed. */
  t = wbegin(b);
  CHECK(ins_pos(t, mkrow("a", 7, "a7", NULL)) == 11);
  OPS->write_rollback(BK(t), t);
  /* Rolled back then redone equals done once, on another store. */
  t = wbegin(b);
  run_steps(t, 0, NSTEPS);
  commit(t);
  es_backend *b2 = open_mem();
  populate(b2);
  t = wbegin(b2);
  run_steps(t, 0, NSTEPS);
  commit(t);
  char *x = dump_now(b), *y = dump_now(b2);
  CHECK(same_dump(x, y));
  free(x);
  free(y);
  free(base);
  OPS->close(b);
  OPS->close(b2);
}

static void test_nested_savepoints(void) {
  es_backend *b = open_mem();
  populate(b);
  char *base = dump_now(b);
  es_txn *t = wbegin(b);
  es_err err;
  run_steps(t, 0, 6);
  char *d1 = dump_state(t, BASE_IDS);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  run_steps(t, 6, 13);
  char *d2 = dump_state(t, BASE_IDS);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  run_steps(t, 13, NSTEPS);
  OPS->savepoint_rollback(BK(t), t);
  OPS->savepoint_rollback(BK(t), t);
  char *d = dump_state(t, BASE_IDS);
  CHECK(same_dump(d2, d));
  free(d);
  OPS->savepoint_rollback(BK(t), t);
  d = dump_state(t, BASE_IDS);
  CHECK(same_dump(d1, d));
  free(d);
  OPS->savepoint_rollback(BK(t), t); /* none left: harmless */
  CHECK_RC(OPS->savepoint_release(BK(t), t, &err), ES_INVALID_ARGUMENT);
  /* The same row moved in and out of sets across savepoints. */
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  CHECK_RC(set_state(t, "a", 3, ES_STATUS_PENDING, 1, 7), ES_OK);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  CHECK_RC(set_state(t, "a", 3, ES_STATUS_DEAD, 0, 7), ES_OK);
  CHECK_RC(set_state(t, "a", 3, ES_STATUS_PROCESSED, 0, 7), ES_OK);
  OPS->savepoint_rollback(BK(t), t);
  CHECK(next_due(t, "a", 0) == 7);
  CHECK_RC(OPS->savepoint_release(BK(t), t, &err), ES_OK);
  OPS->write_rollback(BK(t), t);
  d = dump_now(b);
  CHECK(same_dump(base, d));
  free(d);
  free(d1);
  free(d2);
  free(base);
  OPS->close(b);
}

typedef struct cbctx {
  es_txn *t;
  int calls;
  int64_t seen[64];
} cbctx;

/* Dequeues each row it is given and queues a new one that is due earlier. */
static int dequeue_cb(void *ctx, const es_event *row) {
  cbctx *c = ctx;
  for (int i = 0; i < c->calls; i++)
    if (c->seen[i] == row->position) cur_failed = 1;  /* delivered twice */
  if (c->calls < 64) c->seen[c->calls] = row->position;
  c->calls++;
  CHECK_RC(set_state(c->t, row->session, row->index, ES_STATUS_PENDING, 0, ES_NONE), ES_OK);
  char id[16];
  snprintf(id, sizeof id, "cb%d", c->calls);
  es_event e = mkrow("cbs", c->calls, id, NULL);
  e.due_at = 0;
  CHECK_RC(ins(c->t, e), ES_OK);
  return 0;
}

static int put_session_cb(void *ctx, const es_session_info *si) {
  cbctx *c = ctx;
  c->calls++;
  char name[64];
  snprintf(name, sizeof name, "%s+", si->session);
  if (strlen(name) < 6) CHECK_RC(sess_put(c->t, name, 0), ES_OK);
  return 0;
}

static void test_callbacks_may_write(void) {
  es_backend *b = open_mem();
  populate(b);
  es_txn *t = wbegin(b);
  es_err err;
  /* More queued rows than a walk chunk. */
  for (int64_t i = 1; i <= 40; i++) {
    char id[32];
    snprintf(id, sizeof id, "w%lld", (long long)i);
    es_event e = mkrow("w", i, id, NULL);
    e.due_at = 1002;
    CHECK_RC(ins(t, e), ES_OK);
  }
  cbctx c = {.t = t};
  CHECK_RC(OPS->queued_due(BK(t), t, NULL, NULL, 1003, ES_NONE, dequeue_cb, &c, &err), ES_OK);
  /* a1, b2 at 1001, the 40 at 1002, b1 at 1003; rows queued meanwhile are earlier. */
  CHECK(c.calls == 43);
  ints left = due_pos(t, NULL, 1003, ES_NONE);
  CHECK(left.n == 43);  /* only the rows the callback added */
  c.calls = 0;
  CHECK_RC(OPS->session_list(BK(t), t, "", NULL, ES_NONE, put_session_cb, &c, &err), ES_OK);
  CHECK(c.calls >= 2);
  commit(t);
  OPS->close(b);
}

/* ---- tests: retention (§3.9) --------------------------------------------- */

/* Ids as text: "id1 id2 " for the rows a walk passes. */
typedef struct idtext {
  char s[1024];
  size_t n;
} idtext;

static int idtext_cb(void *ctx, const es_event *row) {
  idtext *c = ctx;
  int k = snprintf(c->s + c->n, sizeof c->s - c->n, "%s ", row->id);
  if (k > 0 && (size_t)k < sizeof c->s - c->n) c->n += (size_t)k;
  return 0;
}

static const char *all_ids(es_txn *t, idtext *c) {
  es_err err;
  c->n = 0;
  c->s[0] = '\0';
  CHECK_RC(OPS->event_all(BK(t), t, NULL, ES_NONE, ES_NONE, idtext_cb, c, &err), ES_OK);
  return c->s;
}

static int has_id(es_txn *t, const char *id, int64_t *position) {
  es_event e;
  es_err err;
  es_event_init(&e);
  int rc = OPS->event_get_by_id(BK(t), t, id, &e, &err);
  if (rc == ES_OK && position) *position = e.position;
  es_event_destroy(&e);
  return rc == ES_OK;
}

static int get_rc(es_txn *t, const char *session, int64_t index) {
  es_event e;
  es_err err;
  es_event_init(&e);
  int rc = OPS->event_get(BK(t), t, session, index, &e, &err);
  es_event_destroy(&e);
  return rc;
}

/* Session s: 1 settled, 2 dead in lane L, 3 pending waiting in L (type u),
 * 4 queued (u), 5 queued in lane M, 6 queued; o: 1 queued, 2 dead (u).
 * Positions: s1 1, s2 2, o1 3, s3 4, s4 5, o2 6, s5 7, s6 8. */
static void populate_retention(es_backend *b) {
  es_txn *t = wbegin(b);
  es_event e = mkrow("s", 1, "s1", NULL);
  e.status = ES_STATUS_PROCESSED;
  e.processed_at = e.created_at;
  e.returned = -1;
  e.queued = 0;
  e.due_at = ES_NONE;
  CHECK(ins_pos(t, e) == 1);
  e = mkrow("s", 2, "s2", "L");
  e.status = ES_STATUS_DEAD;
  e.queued = 0;
  e.due_at = ES_NONE;
  e.last_error = "x";
  CHECK(ins_pos(t, e) == 2);
  e = mkrow("o", 1, "o1", NULL);
  e.due_at = 1000;
  CHECK(ins_pos(t, e) == 3);
  e = mkrow("s", 3, "s3", "L");
  e.type = "u";
  e.queued = 0;
  e.due_at = ES_NONE;
  CHECK(ins_pos(t, e) == 4);
  e = mkrow("s", 4, "s4", NULL);
  e.type = "u";
  CHECK(ins_pos(t, e) == 5);
  e = mkrow("o", 2, "o2", NULL);
  e.type = "u";
  e.status = ES_STATUS_DEAD;
  e.queued = 0;
  e.due_at = ES_NONE;
  CHECK(ins_pos(t, e) == 6);
  CHECK(ins_pos(t, mkrow("s", 5, "s5", "M")) == 7);
  CHECK(ins_pos(t, mkrow("s", 6, "s6", NULL)) == 8);
  CHECK_RC(sess_put(t, "s", 6), ES_OK);
  CHECK_RC(sess_put(t, "o", 2), ES_OK);
  commit(t);
}

/* What s looks like once 1..4 are removed, from every op. */
static void check_truncated(es_txn *t) {
  type_text tt;
  idtext it;
  for (int64_t i = 1; i <= 4; i++) CHECK_RC(get_rc(t, "s", i), ES_NOT_FOUND);
  CHECK_RC(get_rc(t, "s", 5), ES_OK);
  ints c = range(t, "s", 0, ES_NONE, ES_NONE);
  WANT(c, 5, 6);
  c = range(t, "s", 2, 5, ES_NONE);
  WANT(c, 5);
  c = range(t, "s", 0, 4, ES_NONE);
  WANT_NONE(c);
  c = range(t, "s", 1, ES_NONE, 1);
  WANT(c, 5);
  c = all_pos(t, ES_NONE, ES_NONE);
  WANT(c, 3, 6, 7, 8);
  c = all_pos(t, 3, 1);
  WANT(c, 6);
  c = all_pos(t, 0, 1);
  WANT(c, 3);
  CHECK(strcmp(all_ids(t, &it), "o1 o2 s5 s6 ") == 0);
  CHECK(!has_id(t, "s1", NULL) && !has_id(t, "s3", NULL) && !has_id(t, "s4", NULL));
  CHECK(has_id(t, "o1", NULL) && has_id(t, "s5", NULL));
  CHECK(strcmp(pending_text(t, &tt), "t=3 ") == 0);  /* o1 s5 s6; u lost s3, s4 */
  c = due_pos(t, NULL, INT64_MAX, ES_NONE);
  WANT(c, 3, 7, 8);
  c = due_pos(t, "s", INT64_MAX, ES_NONE);
  WANT(c, 7, 8);
  CHECK(next_due(t, "s", 1004) == 1005);
  c = due_type_pos(t, "u", INT64_MAX, ES_NONE);
  WANT_NONE(c);
  CHECK(next_due_type(t, "u", 0) == ES_NONE);
  c = due_type_pos(t, "t", INT64_MAX, ES_NONE);
  WANT(c, 3, 7, 8);
  c = dead_pos(t, NULL, ES_NONE, ES_NONE);
  WANT(c, 6);
  c = dead_pos(t, "s", ES_NONE, ES_NONE);
  WANT_NONE(c);
  CHECK(lane_next(t, "s", "L", 0) == 0);
  CHECK(lane_next(t, "s", "M", 0) == 5);
  CHECK(last_pos(t) == 8);
  es_session_info si;
  es_err err;
  es_session_info_init(&si);
  CHECK_RC(OPS->session_get(BK(t), t, "s", &si, &err), ES_OK);
  es_session_info_destroy(&si);
}

static void test_delete_range(void) {
  es_backend *b = open_mem();
  populate_retention(b);
  char *base = dump_now(b);
  es_err err;
  es_txn *t = wbegin(b);
  /* Undone by a savepoint rollback: every set and count as it was. */
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  CHECK_RC(del_range(t, "s", 4), ES_OK);
  check_truncated(t);
  CHECK_RC(set_state(t, "s", 3, ES_STATUS_PROCESSED, 0, ES_NONE), ES_NOT_FOUND);
  OPS->savepoint_rollback(BK(t), t);
  char *d = dump_state(t, BASE_IDS);
  CHECK(same_dump(base, d));
  free(d);
  /* In two steps, committed: the same answers from a reader. */
  CHECK_RC(del_range(t, "s", 2), ES_OK);
  CHECK_RC(del_range(t, "s", 1), ES_OK);  /* already gone: nothing to do */
  CHECK_RC(del_range(t, "s", 4), ES_OK);
  commit(t);
  t = rbegin(b);
  check_truncated(t);
  OPS->read_end(BK(t), t);
  /* Nothing to do: not a session, nothing at or below through. */
  char *trunc = dump_now(b);
  t = wbegin(b);
  CHECK_RC(del_range(t, "nobody", INT64_MAX), ES_OK);
  CHECK_RC(del_range(t, "s", 0), ES_OK);
  CHECK_RC(del_range(t, "s", -5), ES_OK);
  CHECK_RC(del_range(t, "s", 3), ES_OK);
  CHECK_RC(del_range(t, "s", INT64_MIN), ES_OK);
  d = dump_state(t, BASE_IDS);
  CHECK(same_dump(trunc, d));
  free(d);
  /* A removed id is free again, in this transaction and later; positions
   * go on from the highest ever handed out. */
  es_event e = mkrow("o", 3, "s1", NULL);
  CHECK(ins_pos(t, e) == 9);
  int64_t p = 0;
  CHECK(has_id(t, "s1", &p) && p == 9);
  CHECK_RC(del_range(t, "s", INT64_MAX), ES_OK);  /* s5 s6: s keeps its row */
  CHECK(ins_pos(t, mkrow("o", 4, "s6", NULL)) == 10);
  CHECK(has_id(t, "s6", &p) && p == 10);
  CHECK_RC(ins(t, mkrow("s", 1, "s1b", NULL)), ES_INVALID_ARGUMENT);  /* indexes never shift */
  CHECK(ins_pos(t, mkrow("s", 7, "s7", NULL)) == 11);
  OPS->write_rollback(BK(t), t);
  d = dump_now(b);
  CHECK(same_dump(trunc, d));
  free(d);
  t = wbegin(b);
  CHECK(has_id(t, "s6", &p) && p == 8);
  CHECK(!has_id(t, "s1", NULL));
  CHECK(ins_pos(t, mkrow("o", 3, "s1", NULL)) == 9);
  commit(t);
  t = rbegin(b);
  CHECK(has_id(t, "s1", &p) && p == 9);
  OPS->read_end(BK(t), t);
  /* The newest rows removed: last_position goes down (SQLite's
   * max(position) does too), the next row still gets a new position. */
  t = wbegin(b);
  CHECK_RC(del_range(t, "o", 3), ES_OK);  /* o1 o2 and o3, the newest */
  CHECK(last_pos(t) == 8);
  CHECK(ins_pos(t, mkrow("o", 4, "o4", NULL)) == 10);
  CHECK(last_pos(t) == 10);
  commit(t);
  t = wbegin(b);
  CHECK_RC(del_range(t, "o", INT64_MAX), ES_OK);
  CHECK(last_pos(t) == 8);
  commit(t);
  t = wbegin(b);
  CHECK(last_pos(t) == 8);
  CHECK(ins_pos(t, mkrow("o", 5, "o5", NULL)) == 11);
  ints c = all_pos(t, ES_NONE, ES_NONE);
  WANT(c, 7, 8, 11);
  c = all_pos(t, 8, ES_NONE);
  WANT(c, 11);
  CHECK_RC(del_range(t, "s", INT64_MAX), ES_OK);
  CHECK_RC(del_range(t, "o", INT64_MAX), ES_OK);
  CHECK(last_pos(t) == 0);  /* empty again */
  c = all_pos(t, ES_NONE, ES_NONE);
  WANT_NONE(c);
  commit(t);
  t = wbegin(b);
  CHECK(last_pos(t) == 0);
  CHECK(ins_pos(t, mkrow("s", 7, "s1", NULL)) == 12);
  CHECK(ins_pos(t, mkrow("o", 6, "o1", NULL)) == 13);
  c = all_pos(t, ES_NONE, ES_NONE);
  WANT(c, 12, 13);
  commit(t);
  free(trunc);
  free(base);
  OPS->close(b);
}

/* Removal while a walk is under way: the rows a callback removes are not
 * passed to it afterwards. */
typedef struct rmctx {
  es_txn *t;
  const char *session;
  int calls;
} rmctx;

static int remove_all_cb(void *ctx, const es_event *row) {
  rmctx *c = ctx;
  (void)row;
  if (c->calls++ == 0) CHECK_RC(del_range(c->t, c->session, INT64_MAX), ES_OK);
  return 0;
}

static void test_delete_in_callbacks(void) {
  es_backend *b = open_mem();
  es_txn *t = wbegin(b);
  es_err err;
  for (int64_t i = 1; i <= 80; i++) {
    char id[32];
    snprintf(id, sizeof id, "w%lld", (long long)i);
    es_event e = mkrow(i % 2 ? "w" : "v", (i + 1) / 2, id, NULL);
    if (i % 3 == 0) {
      e.status = ES_STATUS_DEAD;
      e.queued = 0;
      e.due_at = ES_NONE;
    }
    CHECK_RC(ins(t, e), ES_OK);
  }
  commit(t);
  t = wbegin(b);
  rmctx c = {t, "w", 0};
  CHECK_RC(OPS->event_range(BK(t), t, "w", 0, ES_NONE, ES_NONE, remove_all_cb, &c, &err), ES_OK);
  CHECK(c.calls == 1);
  CHECK_RC(del_range(t, "v", 0), ES_OK);
  c = (rmctx){t, "v", 0};
  CHECK_RC(OPS->queued_due(BK(t), t, NULL, NULL, INT64_MAX, ES_NONE, remove_all_cb, &c, &err),
           ES_OK);
  CHECK(c.calls == 1);  /* w is gone: v1 comes first and takes v with it */
  OPS->write_rollback(BK(t), t);
  t = wbegin(b);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  c = (rmctx){t, "v", 0};
  CHECK_RC(OPS->event_all(BK(t), t, NULL, ES_NONE, ES_NONE, remove_all_cb, &c, &err), ES_OK);
  CHECK(c.calls == 40);  /* w1, then w's 39 others; v's left with the first call */
  OPS->savepoint_rollback(BK(t), t);
  c = (rmctx){t, "w", 0};
  CHECK_RC(OPS->dead_list(BK(t), t, NULL, NULL, ES_NONE, ES_NONE, remove_all_cb, &c, &err), ES_OK);
  CHECK(c.calls == 14);  /* w3 (position 3), then v's 13 dead */
  c = (rmctx){t, "v", 0};
  CHECK_RC(OPS->queued_due(BK(t), t, "v", NULL, INT64_MAX, ES_NONE, remove_all_cb, &c, &err),
           ES_OK);
  CHECK(c.calls == 1);
  OPS->write_rollback(BK(t), t);
  OPS->close(b);
}

static const char *session_names(es_txn *t, ntext *c) {
  es_err err;
  c->n = 0;
  c->s[0] = '\0';
  c->calls = 0;
  CHECK_RC(OPS->session_list(BK(t), t, "", NULL, ES_NONE, ntext_cb, c, &err), ES_OK);
  return c->s;
}

static const char *origin_of(es_txn *t, const char *session, int64_t index, char *buf, size_t n) {
  es_event e;
  es_err err;
  es_event_init(&e);
  snprintf(buf, n, "?");
  if (OPS->event_get(BK(t), t, session, index, &e, &err) == ES_OK)
    snprintf(buf, n, "%s/%lld", e.origin_session ? e.origin_session : "NULL", (long long)e.origin_index);
  es_event_destroy(&e);
  return buf;
}

static int64_t first_index_of(es_txn *t, const char *session) {
  es_session_info si;
  es_err err;
  es_session_info_init(&si);
  int64_t v = -1;
  if (OPS->session_get(BK(t), t, session, &si, &err) == ES_OK) v = si.first_index;
  es_session_info_destroy(&si);
  return v;
}

static void test_session_delete(void) {
  es_backend *b = open_mem();
  es_txn *t = wbegin(b);
  es_err err;
  ntext nt = {.n = 0};
  char buf[64];
  CHECK_RC(sess_put_full(t, "p", 0, NULL, NULL, NULL), ES_OK);
  CHECK_RC(sess_put_full(t, "c1", 0, "p", NULL, "w1"), ES_OK);
  CHECK_RC(sess_put_full(t, "c2", 0, "p", "sealed", NULL), ES_OK);
  CHECK_RC(ins(t, mkrow("norow", 1, "n1", NULL)), ES_OK);
  /* first_index is stored like every other field. */
  es_session_info si;
  es_session_info_init(&si);
  si.session = "f";
  si.head = 9;
  si.first_index = 7;
  CHECK_RC(OPS->session_put(BK(t), t, &si, &err), ES_OK);
  commit(t);
  char *base = dump_now(b);
  t = rbegin(b);
  CHECK(first_index_of(t, "f") == 7);
  CHECK(first_index_of(t, "p") == 1);
  OPS->read_end(BK(t), t);

  t = wbegin(b);
  CHECK_RC(sess_del(t, "nobody"), ES_NOT_FOUND);
  CHECK_RC(sess_del(t, "norow"), ES_NOT_FOUND);  /* rows, but no session row */
  CHECK_RC(sess_del(t, NULL), ES_NOT_FOUND);
  /* A child: out of the listing and of its parent's children. */
  CHECK_RC(sess_del(t, "c1"), ES_OK);
  CHECK_RC(sess_del(t, "c1"), ES_NOT_FOUND);
  CHECK(strcmp(session_names(t, &nt), "c2 f p ") == 0);
  CHECK(strcmp(children(t, "p", NULL, ES_NONE, &nt), "c2 ") == 0);
  es_session_info_init(&si);
  CHECK_RC(OPS->session_get(BK(t), t, "c1", &si, &err), ES_NOT_FOUND);
  /* Its name again, in the same transaction, under another parent. */
  CHECK_RC(sess_put_full(t, "c1", 3, "q", NULL, NULL), ES_OK);
  CHECK(strcmp(children(t, "q", NULL, ES_NONE, &nt), "c1 ") == 0);
  CHECK(strcmp(children(t, "p", NULL, ES_NONE, &nt), "c2 ") == 0);
  CHECK_RC(sess_del(t, "c1"), ES_OK);
  CHECK_RC(sess_del(t, "c2"), ES_OK);
  CHECK(strcmp(children(t, "p", NULL, ES_NONE, &nt), "") == 0);
  CHECK(strcmp(children(t, "q", NULL, ES_NONE, &nt), "") == 0);
  CHECK_RC(sess_put_full(t, "c2", 1, "p", NULL, NULL), ES_OK);
  CHECK(strcmp(children(t, "p", NULL, ES_NONE, &nt), "c2 ") == 0);
  OPS->write_rollback(BK(t), t);
  char *d = dump_now(b);
  CHECK(same_dump(base, d));
  free(d);
  t = rbegin(b);
  CHECK(strcmp(children(t, "p", NULL, ES_NONE, &nt), "c1 c2 ") == 0);
  OPS->read_end(BK(t), t);

  /* A whole session: rows, snapshots, refs, row; then its name and ids
   * again from index 1, in the same transaction. */
  t = wbegin(b);
  CHECK_RC(ins(t, mkrow("s", 1, "s1", "L")), ES_OK);
  CHECK_RC(ins(t, mkrow("s", 2, "s2", "L")), ES_OK);
  CHECK_RC(sess_put(t, "s", 2), ES_OK);
  CHECK_RC(snap_put(t, "s", "r1", 2, "S", "v"), ES_OK);
  CHECK_RC(ref_put(t, "main", "s", 1, 1), ES_OK);
  commit(t);
  char *with_s = dump_now(b);
  t = wbegin(b);
  CHECK_RC(del_range(t, "s", INT64_MAX), ES_OK);
  CHECK_RC(snaps_del(t, "s"), ES_OK);
  CHECK_RC(refs_del(t, "s"), ES_OK);
  CHECK_RC(sess_del(t, "s"), ES_OK);
  CHECK(strcmp(session_names(t, &nt), "c1 c2 f p ") == 0);
  CHECK_RC(ins(t, mkrow("s", 3, "s3", NULL)), ES_INVALID_ARGUMENT);  /* a new s starts at 1 */
  CHECK_RC(ins(t, mkrow("s", 1, "s2", "L")), ES_OK);
  CHECK(lane_next(t, "s", "L", 0) == 1);
  CHECK_RC(sess_put(t, "s", 1), ES_OK);
  CHECK(strcmp(session_names(t, &nt), "c1 c2 f p s ") == 0);
  commit(t);
  t = rbegin(b);
  ints c = range(t, "s", 0, ES_NONE, ES_NONE);
  WANT(c, 1);
  int64_t p = 0;
  CHECK(has_id(t, "s2", &p) && p == 4 && !has_id(t, "s1", NULL));
  CHECK(lane_next(t, "s", "L", 1) == 0);
  OPS->read_end(BK(t), t);

  /* The core's order does not matter: the row first, rows left. The
   * session stays as it is (rows readable, indexes going on) until its
   * last part goes. */
  t = wbegin(b);
  CHECK_RC(sess_del(t, "s"), ES_OK);
  CHECK_RC(get_rc(t, "s", 1), ES_OK);
  CHECK_RC(ins(t, mkrow("s", 2, "s5", NULL)), ES_OK);
  CHECK_RC(snap_put(t, "s", "r1", 1, "S", "v"), ES_OK);
  CHECK_RC(del_range(t, "s", INT64_MAX), ES_OK);
  CHECK_RC(ins(t, mkrow("s", 3, "s6", NULL)), ES_OK);  /* snapshots left: still the same s */
  CHECK_RC(del_range(t, "s", INT64_MAX), ES_OK);
  CHECK_RC(snaps_del(t, "s"), ES_OK);  /* the last part */
  CHECK_RC(ins(t, mkrow("s", 1, "s1", NULL)), ES_OK);
  commit(t);

  /* A fork's origin deleted under its copies: the copies keep its name,
   * a new session of that name is another one. */
  t = wbegin(b);
  for (int64_t i = 1; i <= 3; i++) {
    char id[32];
    snprintf(id, sizeof id, "src%lld", (long long)i);
    CHECK_RC(ins(t, mkrow("src", i, id, NULL)), ES_OK);
    snprintf(id, sizeof id, "f%lld", (long long)i);
    es_event e = mkrow("fk", i, id, NULL);
    e.origin_session = "src";
    e.origin_index = i;
    CHECK_RC(ins(t, e), ES_OK);
  }
  CHECK_RC(sess_put(t, "src", 3), ES_OK);
  commit(t);
  t = wbegin(b);
  CHECK_RC(del_range(t, "src", INT64_MAX), ES_OK);
  CHECK_RC(sess_del(t, "src"), ES_OK);
  CHECK(strcmp(origin_of(t, "fk", 2, buf, sizeof buf), "src/2") == 0);
  commit(t);
  t = wbegin(b);
  CHECK(strcmp(origin_of(t, "fk", 3, buf, sizeof buf), "src/3") == 0);
  CHECK_RC(ins(t, mkrow("src", 1, "src1", NULL)), ES_OK);
  es_event e = mkrow("fk2", 1, "g1", NULL);
  e.origin_session = "src";
  e.origin_index = 1;
  CHECK_RC(ins(t, e), ES_OK);
  CHECK_RC(del_range(t, "fk", 2), ES_OK);  /* two of the three copies of the old src */
  commit(t);
  t = wbegin(b);
  CHECK(strcmp(origin_of(t, "fk", 3, buf, sizeof buf), "src/3") == 0);
  CHECK(strcmp(origin_of(t, "fk2", 1, buf, sizeof buf), "src/1") == 0);
  CHECK_RC(del_range(t, "fk", INT64_MAX), ES_OK);  /* the last copy: the old src goes */
  CHECK_RC(del_range(t, "src", INT64_MAX), ES_OK);
  commit(t);
  t = rbegin(b);
  CHECK(strcmp(origin_of(t, "fk2", 1, buf, sizeof buf), "src/1") == 0);
  OPS->read_end(BK(t), t);
  /* Closing with copies of a deleted origin left: nothing leaks (the
   * sanitizer and valgrind runs see it). */
  t = wbegin(b);
  CHECK_RC(sess_del(t, "nothing"), ES_NOT_FOUND);
  CHECK_RC(del_range(t, "src", INT64_MAX), ES_OK);
  commit(t);
  free(with_s);
  free(base);
  OPS->close(b);
}

static void test_snapshot_delete_all(void) {
  es_backend *b = open_mem();
  es_txn *t = wbegin(b);
  es_err err;
  CHECK_RC(snap_put(t, "s", "r2", 2, "S2", "v"), ES_OK);
  CHECK_RC(snap_put(t, "s", "r1", 1, NULL, NULL), ES_OK);
  CHECK_RC(snap_put(t, "s", "r3", 3, "S3", "v"), ES_OK);
  CHECK_RC(snap_put(t, "o", "r1", 4, "O1", "v"), ES_OK);
  CHECK_RC(sess_put(t, "s", 0), ES_OK);
  commit(t);
  char *base = dump_now(b);
  t = wbegin(b);
  CHECK_RC(snaps_del(t, "nobody"), ES_OK);
  CHECK_RC(snaps_del(t, NULL), ES_OK);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  CHECK_RC(snaps_del(t, "s"), ES_OK);
  snaps c = {0};
  CHECK_RC(OPS->snapshot_list(BK(t), t, "s", collect_snap, &c, &err), ES_OK);
  CHECK(c.n == 0);
  es_snapshot sn;
  es_snapshot_init(&sn);
  CHECK_RC(OPS->snapshot_get(BK(t), t, "s", "r1", &sn, &err), ES_NOT_FOUND);
  CHECK_RC(OPS->snapshot_get(BK(t), t, "o", "r1", &sn, &err), ES_OK);
  CHECK(sn.index == 4);
  es_snapshot_destroy(&sn);
  CHECK_RC(snaps_del(t, "s"), ES_OK);  /* none left: nothing to do */
  /* Put again after the removal, then all undone. */
  CHECK_RC(snap_put(t, "s", "r2", 9, "new", "v"), ES_OK);
  CHECK_RC(snap_put(t, "s", "r0", 9, "new", "v"), ES_OK);
  c = (snaps){0};
  CHECK_RC(OPS->snapshot_list(BK(t), t, "s", collect_snap, &c, &err), ES_OK);
  CHECK(c.n == 2 && strcmp(c.reducer[0], "r0") == 0 && c.index[1] == 9);
  OPS->savepoint_rollback(BK(t), t);
  char *d = dump_state(t, BASE_IDS);
  CHECK(same_dump(base, d));
  free(d);
  CHECK_RC(snaps_del(t, "s"), ES_OK);
  CHECK_RC(snap_put(t, "s", "r1", 5, "x", NULL), ES_OK);
  commit(t);
  t = rbegin(b);
  c = (snaps){0};
  CHECK_RC(OPS->snapshot_list(BK(t), t, "s", collect_snap, &c, &err), ES_OK);
  CHECK(c.n == 1 && strcmp(c.reducer[0], "r1") == 0 && c.index[0] == 5);
  OPS->read_end(BK(t), t);
  /* A session that was only snapshots is gone with them. */
  t = wbegin(b);
  CHECK_RC(snaps_del(t, "o"), ES_OK);
  CHECK_RC(snap_put(t, "o", "r9", 1, NULL, NULL), ES_OK);
  commit(t);
  t = rbegin(b);
  c = (snaps){0};
  CHECK_RC(OPS->snapshot_list(BK(t), t, "o", collect_snap, &c, &err), ES_OK);
  CHECK(c.n == 1 && strcmp(c.reducer[0], "r9") == 0);
  OPS->read_end(BK(t), t);
  free(base);
  OPS->close(b);
}

/* §3.10: key rows, key uses, snapshot_delete_from; each undone exactly. */
typedef struct {
  char session[16][16];
  int64_t first[16];
  int n;
} uses;

static int collect_use(void *ctx, const char *session, int64_t first_index) {
  uses *u = ctx;
  if (u->n < 16) {
    snprintf(u->session[u->n], 16, "%s", session);
    u->first[u->n++] = first_index;
  }
  return 0;
}

static uses list_uses(es_txn *t, const char *key) {
  uses u = {0};
  es_err err;
  CHECK_RC(OPS->key_use_list(BK(t), t, key, collect_use, &u, &err), ES_OK);
  return u;
}

static void test_crypto_ops(void) {
  es_backend *b = open_mem();
  es_txn *t = wbegin(b);
  es_err err;
  unsigned char w1[] = {1, 0, 2, 3}, w2[] = {9, 9};
  es_key_row k = {"k", w1, sizeof w1, 10, ES_NONE}, got;
  CHECK_RC(OPS->key_get(BK(t), t, "k", &got, &err), ES_NOT_FOUND);
  CHECK_RC(OPS->key_put(BK(t), t, &k, &err), ES_OK);
  CHECK_RC(OPS->key_use_put(BK(t), t, "k", "s", 3, &err), ES_OK);
  CHECK_RC(OPS->key_use_put(BK(t), t, "k", "s", 5, &err), ES_OK); /* keeps the lower */
  CHECK_RC(OPS->key_use_put(BK(t), t, "k", "a", 7, &err), ES_OK);
  CHECK_RC(OPS->key_use_put(BK(t), t, "k2", "s", 1, &err), ES_OK);
  CHECK_RC(snap_put(t, "s", "r1", 2, "S2", "v"), ES_OK);
  CHECK_RC(snap_put(t, "s", "r2", 3, "S3", "v"), ES_OK);
  CHECK_RC(snap_put(t, "s", "r3", 4, "S4", "v"), ES_OK);
  commit(t);

  t = wbegin(b);
  CHECK_RC(OPS->key_get(BK(t), t, "k", &got, &err), ES_OK);
  CHECK(got.wrapped_len == 4 && memcmp(got.wrapped, w1, 4) == 0 && got.created_at == 10 &&
        got.shredded_at == ES_NONE && strcmp(got.name, "k") == 0);
  es_key_row_destroy(&got);
  uses u = list_uses(t, "k");
  CHECK(u.n == 2 && strcmp(u.session[0], "a") == 0 && u.first[0] == 7 &&
        strcmp(u.session[1], "s") == 0 && u.first[1] == 3);
  /* replace, lower a use, delete from 3, drop a session's uses: all undone */
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  es_key_row tomb = {"k", NULL, 0, 10, 20};
  CHECK_RC(OPS->key_put(BK(t), t, &tomb, &err), ES_OK);
  CHECK_RC(OPS->key_get(BK(t), t, "k", &got, &err), ES_OK);
  CHECK(got.wrapped == NULL && got.shredded_at == 20);
  es_key_row_destroy(&got);
  CHECK_RC(OPS->key_use_put(BK(t), t, "k", "a", 2, &err), ES_OK);
  CHECK_RC(OPS->snapshot_delete_from(BK(t), t, "s", 3, &err), ES_OK);
  snaps c = {0};
  CHECK_RC(OPS->snapshot_list(BK(t), t, "s", collect_snap, &c, &err), ES_OK);
  CHECK(c.n == 1 && strcmp(c.reducer[0], "r1") == 0);
  CHECK_RC(snap_put(t, "s", "r9", 9, "S9", "v"), ES_OK);
  CHECK_RC(OPS->key_use_delete_session(BK(t), t, "s", &err), ES_OK);
  u = list_uses(t, "k");
  CHECK(u.n == 1 && strcmp(u.session[0], "a") == 0 && u.first[0] == 2);
  CHECK(list_uses(t, "k2").n == 0);
  OPS->savepoint_rollback(BK(t), t);
  CHECK_RC(OPS->key_get(BK(t), t, "k", &got, &err), ES_OK);
  CHECK(got.wrapped_len == 4 && memcmp(got.wrapped, w1, 4) == 0);
  es_key_row_destroy(&got);
  u = list_uses(t, "k");
  CHECK(u.n == 2 && u.first[0] == 7 && u.first[1] == 3);
  CHECK(list_uses(t, "k2").n == 1);
  c = (snaps){0};
  CHECK_RC(OPS->snapshot_list(BK(t), t, "s", collect_snap, &c, &err), ES_OK);
  CHECK(c.n == 3 && c.index[0] == 2 && c.index[1] == 3 && c.index[2] == 4);
  /* committed this time */
  k.wrapped = w2;
  k.wrapped_len = sizeof w2;
  CHECK_RC(OPS->key_put(BK(t), t, &k, &err), ES_OK);
  CHECK_RC(OPS->snapshot_delete_from(BK(t), t, "s", 4, &err), ES_OK);
  CHECK_RC(OPS->snapshot_delete_from(BK(t), t, "nobody", 1, &err), ES_OK);
  commit(t);
  t = rbegin(b);
  CHECK_RC(OPS->key_get(BK(t), t, "k", &got, &err), ES_OK);
  CHECK(got.wrapped_len == 2 && got.wrapped[0] == 9);
  es_key_row_destroy(&got);
  c = (snaps){0};
  CHECK_RC(OPS->snapshot_list(BK(t), t, "s", collect_snap, &c, &err), ES_OK);
  CHECK(c.n == 2 && c.index[1] == 3);
  OPS->read_end(BK(t), t);
  /* a session that was only snapshots goes with its last one */
  t = wbegin(b);
  CHECK_RC(snap_put(t, "only", "r", 5, "x", "v"), ES_OK);
  commit(t);
  t = wbegin(b);
  CHECK_RC(OPS->snapshot_delete_from(BK(t), t, "only", 1, &err), ES_OK);
  commit(t);
  t = rbegin(b);
  c = (snaps){0};
  CHECK_RC(OPS->snapshot_list(BK(t), t, "only", collect_snap, &c, &err), ES_OK);
  CHECK(c.n == 0);
  OPS->read_end(BK(t), t);
  OPS->close(b);
}

static void test_ref_delete_session(void) {
  es_backend *b = open_mem();
  es_txn *t = wbegin(b);
  es_err err;
  rtext rt = {.n = 0};
  CHECK_RC(ref_put(t, "x1", "s", 1, 1), ES_OK);
  CHECK_RC(ref_put(t, "x2", "sa", 1, 1), ES_OK);
  CHECK_RC(ref_put(t, "x3", "s", 1, 1), ES_OK);
  CHECK_RC(ref_put(t, "x4", "s2", 1, 1), ES_OK);
  CHECK_RC(ref_put(t, "x5", "r", 1, 1), ES_OK);
  CHECK_RC(ref_put(t, "z", "s", 1, 1), ES_OK);
  CHECK_RC(ref_put(t, "", "s", 1, 1), ES_OK);
  commit(t);
  t = wbegin(b);
  const char *all = "=s x1=s x2=sa x3=s x4=s2 x5=r z=s ";
  CHECK(strcmp(refs(t, NULL, ES_NONE, &rt), all) == 0);
  CHECK_RC(refs_del(t, "nobody"), ES_OK);
  CHECK_RC(refs_del(t, NULL), ES_INVALID_ARGUMENT);
  CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
  CHECK_RC(refs_del(t, "s"), ES_OK);
  CHECK(strcmp(refs(t, NULL, ES_NONE, &rt), "x2=sa x4=s2 x5=r ") == 0);
  es_ref r;
  es_ref_init(&r);
  CHECK_RC(OPS->ref_get(BK(t), t, "x1", &r, &err), ES_NOT_FOUND);
  CHECK_RC(ref_del(t, "z"), ES_NOT_FOUND);
  /* The index follows puts: a ref moved to s goes with it, one moved
   * away stays. */
  CHECK_RC(ref_put(t, "x1", "s", 2, 2), ES_OK);
  CHECK_RC(ref_put(t, "x2", "s", 2, 2), ES_OK);
  CHECK_RC(ref_put(t, "x1", "t", 2, 3), ES_OK);
  CHECK_RC(refs_del(t, "s"), ES_OK);
  CHECK(strcmp(refs(t, NULL, ES_NONE, &rt), "x1=t x4=s2 x5=r ") == 0);
  OPS->savepoint_rollback(BK(t), t);
  CHECK(strcmp(refs(t, NULL, ES_NONE, &rt), all) == 0);
  CHECK_RC(refs_del(t, "sa"), ES_OK);
  CHECK_RC(refs_del(t, "s2"), ES_OK);
  CHECK(strcmp(refs(t, NULL, ES_NONE, &rt), "=s x1=s x3=s x5=r z=s ") == 0);
  OPS->write_rollback(BK(t), t);
  t = wbegin(b);
  CHECK(strcmp(refs(t, NULL, ES_NONE, &rt), all) == 0);
  CHECK_RC(refs_del(t, "s"), ES_OK);
  commit(t);
  t = rbegin(b);
  CHECK(strcmp(refs(t, NULL, ES_NONE, &rt), "x2=sa x4=s2 x5=r ") == 0);
  OPS->read_end(BK(t), t);
  OPS->close(b);
}

/* ---- tests: out of memory ----------------------------------------------- */

/* Fails the k-th allocation of each step for every k until the step gets
 * through: the step must report STORAGE and leave the state as it was (but
 * presence_expire, which may stop half-way), and rolling back must restore
 * the committed state exactly. */
static void test_out_of_memory(void) {
  if (!allocs_counted()) {
    skip_case("allocation failures cannot be injected here (valgrind, ASan own malloc)");
    return;
  }
  es_backend *b = open_mem();
  populate(b);
  char *base = dump_now(b);
  long failures_seen = 0;
  for (size_t i = 0; i < NSTEPS; i++) {
    long step_failures = 0;
    for (long k = 0;; k++) {
      es_txn *t = wbegin(b);
      run_steps(t, 0, i);
      char *pre = dump_state(t, BASE_IDS);
      fail_countdown = k;
      int rc = STEPS[i].fn(t);
      long left = fail_countdown;
      fail_countdown = -1;
      if (rc != ES_OK) {
        failures_seen++;
        step_failures++;
        if (rc != ES_STORAGE) {
          printf("#   step %s, allocation %ld: %s\n", STEPS[i].name, k, es_strerror(rc));
          cur_failed = 1;
        }
        if (STEPS[i].fn != step_pres_expire) {
          char *d = dump_state(t, BASE_IDS);
          if (!same_dump(pre, d)) {
            printf("#   step %s, allocation %ld changed the state\n", STEPS[i].name, k);
            cur_failed = 1;
          }
          free(d);
        }
      }
      free(pre);
      OPS->write_rollback(BK(t), t);
      char *d = dump_now(b);
      if (!same_dump(base, d)) {
        printf("#   step %s, allocation %ld: rollback differs\n", STEPS[i].name, k);
        cur_failed = 1;
      }
      free(d);
      if (rc == ES_OK && left >= 0) break;
      if (k > 100) {
        printf("#   step %s never succeeds\n", STEPS[i].name);
        cur_failed = 1;
        break;
      }
    }
    /* presence_expire, ref_delete and the removals only allocate when the
     * undo log must grow: below. */
    if (step_failures == 0 && !log_only(STEPS[i].fn)) {
      printf("#   step %s allocates nothing: not tested\n", STEPS[i].name);
      cur_failed = 1;
    }
  }
  /* presence_expire running out of memory half-way: what it removed stays
   * consistent and undoable. */
  {
    es_backend *p = open_mem();
    es_txn *t = wbegin(p);
    for (int i = 0; i < 40; i++) {
      char f[16];
      snprintf(f, sizeof f, "f%02d", i);
      CHECK_RC(pres_put(t, "ns1", "p1", f, "1", i, 100 + i), ES_OK);
    }
    commit(t);
    char *before = dump_now(p);
    t = wbegin(p);
    for (int i = 0; i < 30; i++) {
      char f[16];
      snprintf(f, sizeof f, "g%02d", i);
      CHECK_RC(pres_put(t, "ns2", "p2", f, NULL, i, 100), ES_OK);
    }
    es_err e2;
    fail_countdown = 0;  /* the undo log has room for 64 steps: the 65th fails */
    int rc = OPS->presence_expire(BK(t), t, "ns1", 1000, &e2);
    fail_countdown = -1;
    CHECK_RC(rc, ES_STORAGE);
    prows half = list_pres(t, "ns1", INT64_MIN);
    CHECK(half.n > 0 && half.n < 40);
    OPS->write_rollback(BK(t), t);
    char *after = dump_now(p);
    CHECK(same_dump(before, after));
    free(before);
    free(after);
    OPS->close(p);
  }
  /* ref_delete running out of memory: the undo log full, the step that
   * would grow it fails and changes nothing. */
  {
    int hit = 0;
    es_err e2;
    for (int k = 0; k < 4096 && !hit; k++) {
      es_txn *t = wbegin(b);
      for (int i = 0; i < k; i++) CHECK_RC(ref_put(t, "main", "a", 1, i), ES_OK);
      fail_countdown = 0;
      int rc = OPS->ref_delete(BK(t), t, "dev", &e2);
      fail_countdown = -1;
      if (rc != ES_OK) {
        hit = 1;
        CHECK_RC(rc, ES_STORAGE);
        es_ref r;
        es_ref_init(&r);
        CHECK_RC(OPS->ref_get(BK(t), t, "dev", &r, &e2), ES_OK);
        CHECK(r.session && strcmp(r.session, "fa") == 0);
        es_ref_destroy(&r);
        /* and the next try, with memory, goes through */
        CHECK_RC(OPS->ref_delete(BK(t), t, "dev", &e2), ES_OK);
        failures_seen++;
      }
      OPS->write_rollback(BK(t), t);
    }
    CHECK(hit);
    char *d = dump_now(b);
    CHECK(same_dump(base, d));
    free(d);
  }
  CHECK(failures_seen >= (long)NSTEPS);
  printf("#   %ld injected allocation failures\n", failures_seen);

  /* Reads that copy out, savepoints and open. */
  es_err err;
  for (long k = 0; k < 8; k++) {
    es_txn *t = wbegin(b);
    es_event e;
    es_session_info si;
    es_snapshot sn;
    es_presence_row pr;
    es_ref rf;
    es_event_init(&e);
    es_session_info_init(&si);
    es_snapshot_init(&sn);
    es_presence_row_init(&pr);
    es_ref_init(&rf);
    int rc[9];
    fail_countdown = k;
    rc[0] = OPS->event_get(BK(t), t, "c", 1, &e, &err);
    es_event_destroy(&e);
    fail_countdown = k;
    rc[1] = OPS->event_get_by_id(BK(t), t, "a6", &e, &err);
    es_event_destroy(&e);
    fail_countdown = k;
    rc[2] = OPS->session_get(BK(t), t, "a", &si, &err);
    es_session_info_destroy(&si);
    fail_countdown = k;
    rc[3] = OPS->snapshot_get(BK(t), t, "a", "r2", &sn, &err);
    es_snapshot_destroy(&sn);
    fail_countdown = k;
    rc[4] = OPS->presence_get(BK(t), t, "ns1", "p1", "f1", &pr, &err);
    es_presence_row_destroy(&pr);
    fail_countdown = k;
    rc[5] = OPS->savepoint(BK(t), t, &err);
    fail_countdown = k;
    rc[6] = OPS->ref_get(BK(t), t, "main", &rf, &err);
    es_ref_destroy(&rf);
    fail_countdown = k;
    rc[7] = OPS->session_get(BK(t), t, "fb", &si, &err); /* a row with every string */
    es_session_info_destroy(&si);
    fail_countdown = k;
    rc[8] = OPS->event_get(BK(t), t, "a", 4, &e, &err); /* a dispatch block with an error */
    es_event_destroy(&e);
    fail_countdown = -1;
    for (int j = 0; j < 9; j++) CHECK(rc[j] == ES_OK || rc[j] == ES_STORAGE);
    OPS->write_rollback(BK(t), t);
  }
  for (long k = 0; k < 4; k++) {
    es_backend *x = NULL;
    fail_countdown = k;
    int rc = OPS->open("", NULL, &x, &err);
    fail_countdown = -1;
    CHECK(rc == ES_OK || (rc == ES_STORAGE && x == NULL));
    OPS->close(x);
  }
  char *d = dump_now(b);
  CHECK(same_dump(base, d));
  free(d);
  free(base);
  OPS->close(b);
}

/* ---- tests: retention against a model ------------------------------------ */

/* Random transactions of inserts, updates, removals of every kind, session
 * rows, snapshots and refs, in savepoints rolled back or kept, committed or
 * rolled back; after each commit (and now and then inside) every answer is
 * checked against a model, and every rollback against a dump taken before.
 * The position array's holes and the compaction of both arrays at commit
 * get exercised on the way (sessions are truncated and deleted over and
 * over). */
static uint64_t rnd(uint64_t *s);

#define RM_NS 5
#define RM_MAXR 12000
#define RM_NREFS 6
static const char *const RM_SESS[RM_NS] = {"a", "b", "c", "fa", "x/1"};  /* in U_SESSIONS, byte order */
static const char *const RM_TYPES[] = {"t", "u", "newtype"};
static const char *const RM_LANES[] = {NULL, "l1", "l2"};
static const char *const RM_REDUCERS[] = {"r1", "r2", "r3"};

typedef struct rm_row {
  int sess, type, lane, status, queued, live;
  int idn;     /* the id is "r<idn>" */
  int origin;  /* the session a fork copy names as its origin, or -1 */
  int64_t index, position, due;
  char id[16];
} rm_row;

typedef struct rm_model {
  rm_row rows[RM_MAXR];  /* every row inserted, in position order */
  int nrows;
  struct {
    int64_t n, gone;
    int info, snaps;  /* snaps: a bit per reducer */
  } s[RM_NS];
  int ref[RM_NREFS];  /* the session a ref names, or -1 */
  int64_t npos;
  int holder[RM_MAXR + 1];  /* by id number: the live row with that id, or -1 */
  int nids;                 /* id numbers used: 1..nids */
} rm_model;

/* A session with nothing left starts afresh (the backend detaches it). */
static void rm_kill(rm_model *m, int i) {
  m->rows[i].live = 0;
  m->holder[m->rows[i].idn] = -1;
}

static void rm_gc(rm_model *m, int k) {
  if (!m->s[k].info && m->s[k].gone == m->s[k].n && !m->s[k].snaps) m->s[k].n = m->s[k].gone = 0;
}


typedef struct rm_seen {
  int64_t pos[RM_MAXR], index[RM_MAXR];
  char id[RM_MAXR][16];
  char origin[RM_MAXR][8];
  int n;
} rm_seen;

static int rm_collect(void *ctx, const es_event *row) {
  rm_seen *c = ctx;
  if (c->n < RM_MAXR) {
    c->pos[c->n] = row->position;
    c->index[c->n] = row->index;
    snprintf(c->id[c->n], sizeof c->id[0], "%s", row->id);
    snprintf(c->origin[c->n], sizeof c->origin[0], "%s", row->origin_session ? row->origin_session : "-");
    c->n++;
  }
  return 0;
}

static int rm_cmp_due(const rm_row *x, const rm_row *y) {
  if (x->due != y->due) return x->due < y->due ? -1 : 1;
  return x->position < y->position ? -1 : x->position > y->position;
}

/* Every answer against the model. */
static void rm_verify(es_txn *t, const rm_model *m, rm_seen *c, int *bad) {
  es_err err;
  int fail = 0;
  /* event_all: the live rows in position order; last_position */
  c->n = 0;
  OPS->event_all(BK(t), t, NULL, ES_NONE, ES_NONE, rm_collect, c, &err);
  int k = 0;
  int64_t last = 0;
  for (int i = 0; i < m->nrows; i++) {
    const rm_row *r = &m->rows[i];
    if (!r->live) continue;
    if (k >= c->n || c->pos[k] != r->position || strcmp(c->id[k], r->id) != 0 ||
        strcmp(c->origin[k], r->origin < 0 ? "-" : RM_SESS[r->origin]) != 0)
      fail |= 1;
    k++;
    last = r->position;
  }
  if (k != c->n) fail |= 1;
  int64_t lp = -1;
  OPS->last_position(BK(t), t, &lp, &err);
  if (lp != last) fail |= 2;
  /* per session: range, head row, gets around the removed front */
  for (int s = 0; s < RM_NS; s++) {
    c->n = 0;
    OPS->event_range(BK(t), t, RM_SESS[s], 0, ES_NONE, ES_NONE, rm_collect, c, &err);
    k = 0;
    for (int i = 0; i < m->nrows; i++) {
      const rm_row *r = &m->rows[i];
      if (!r->live || r->sess != s) continue;
      if (k >= c->n || c->index[k] != r->index || c->pos[k] != r->position) fail |= 4;
      k++;
    }
    if (k != c->n) fail |= 4;
    if (k != m->s[s].n - m->s[s].gone) fail |= 4;
    if (m->s[s].gone && get_rc(t, RM_SESS[s], m->s[s].gone) != ES_NOT_FOUND) fail |= 8;
    if (m->s[s].gone < m->s[s].n && get_rc(t, RM_SESS[s], m->s[s].gone + 1) != ES_OK) fail |= 8;
    es_session_info si;
    es_session_info_init(&si);
    if ((OPS->session_get(BK(t), t, RM_SESS[s], &si, &err) == ES_OK) != m->s[s].info) fail |= 16;
    es_session_info_destroy(&si);
    snaps sn = {0};
    OPS->snapshot_list(BK(t), t, RM_SESS[s], collect_snap, &sn, &err);
    int want = 0;
    for (int r = 0; r < 3; r++) want += (m->s[s].snaps >> r) & 1;
    if ((int)sn.n != want) fail |= 32;
    for (int l = 1; l < 3; l++) {
      int64_t low = 0;
      for (int i = 0; i < m->nrows && !low; i++) {
        const rm_row *r = &m->rows[i];
        if (r->live && r->sess == s && r->lane == l && r->status != ES_STATUS_PROCESSED) low = r->index;
      }
      if (lane_next(t, RM_SESS[s], RM_LANES[l], 0) != low) fail |= 64;
    }
    /* dead rows of the session, by position */
    c->n = 0;
    OPS->dead_list(BK(t), t, RM_SESS[s], NULL, ES_NONE, ES_NONE, rm_collect, c, &err);
    k = 0;
    for (int i = 0; i < m->nrows; i++) {
      const rm_row *r = &m->rows[i];
      if (!r->live || r->sess != s || r->status != ES_STATUS_DEAD) continue;
      if (k >= c->n || c->pos[k] != r->position) fail |= 128;
      k++;
    }
    if (k != c->n) fail |= 128;
  }
  /* ids: a live row's id finds it, any other id nothing */
  for (int n = 1; n <= m->nids; n++) {
    char id[16];
    snprintf(id, sizeof id, "r%d", n);
    const rm_row *r = m->holder[n] >= 0 ? &m->rows[m->holder[n]] : NULL;
    int64_t p = 0;
    int found = has_id(t, id, &p);
    if (found != (r != NULL) || (r && (p != r->position || r->idn != n))) fail |= 256;
  }
  /* pending counts by type, the store's dead rows, queues store-wide and
   * per type */
  type_text tt;
  /* pending_text is in byte order: "newtype" < "t" < "u" */
  char sorted[256] = "";
  for (int pass = 0; pass < 3; pass++) {
    int ty = pass == 0 ? 2 : pass - 1;
    int64_t n = 0;
    for (int i = 0; i < m->nrows; i++)
      n += m->rows[i].live && m->rows[i].type == ty && m->rows[i].status == ES_STATUS_PENDING;
    if (n) snprintf(sorted + strlen(sorted), sizeof sorted - strlen(sorted), "%s=%lld ", RM_TYPES[ty], (long long)n);
  }
  if (strcmp(pending_text(t, &tt), sorted) != 0) fail |= 512;
  c->n = 0;
  OPS->dead_list(BK(t), t, NULL, NULL, ES_NONE, ES_NONE, rm_collect, c, &err);
  k = 0;
  for (int i = 0; i < m->nrows; i++)
    if (m->rows[i].live && m->rows[i].status == ES_STATUS_DEAD) {
      if (k >= c->n || c->pos[k] != m->rows[i].position) fail |= 1024;
      k++;
    }
  if (k != c->n) fail |= 1024;
  for (int ty = -1; ty < 3; ty++) {
    static const rm_row *q[RM_MAXR];
    int nq = 0;
    for (int i = 0; i < m->nrows; i++) {
      const rm_row *r = &m->rows[i];
      if (r->live && r->queued && (ty < 0 || r->type == ty)) {
        int j = nq++;
        while (j > 0 && rm_cmp_due(q[j - 1], r) > 0) {
          q[j] = q[j - 1];
          j--;
        }
        q[j] = r;
      }
    }
    c->n = 0;
    if (ty < 0)
      OPS->queued_due(BK(t), t, NULL, NULL, INT64_MAX, ES_NONE, rm_collect, c, &err);
    else
      OPS->queued_due_type(BK(t), t, NULL, RM_TYPES[ty], INT64_MAX, ES_NONE, rm_collect, c, &err);
    if (c->n != nq) fail |= 2048;
    for (int i = 0; i < nq && i < c->n; i++)
      if (c->pos[i] != q[i]->position) fail |= 2048;
  }
  /* session rows and refs */
  ntext nt = {.n = 0};
  char listed[128] = "";
  for (int s = 0; s < RM_NS; s++)  /* RM_SESS is in byte order */
    if (m->s[s].info) snprintf(listed + strlen(listed), sizeof listed - strlen(listed), "%s ", RM_SESS[s]);
  if (strcmp(session_names(t, &nt), listed) != 0) fail |= 4096;
  rtext rt = {.n = 0};
  char rw[256] = "";
  for (int i = 0; i < RM_NREFS; i++)
    if (m->ref[i] >= 0) snprintf(rw + strlen(rw), sizeof rw - strlen(rw), "ref%d=%s ", i, RM_SESS[m->ref[i]]);
  if (strcmp(refs(t, NULL, ES_NONE, &rt), rw) != 0) fail |= 8192;
  if (fail && !*bad) printf("#   model differs (mask %#x)\n", (unsigned)fail);
  *bad |= fail;
}

/* The ids the dump reports: every one the run used. */
static const char **rm_ids(const rm_model *m) {
  static char text[RM_MAXR + 1][16];
  static const char *ids[RM_MAXR + 1];
  for (int n = 1; n <= m->nids; n++) {
    snprintf(text[n], sizeof text[n], "r%d", n);
    ids[n - 1] = text[n];
  }
  ids[m->nids] = NULL;
  return ids;
}

/* One random write; the model follows. */
static void rm_step(es_txn *t, rm_model *m, uint64_t *seed, int *bad) {
  int s = (int)(rnd(seed) % RM_NS);
  const char *name = RM_SESS[s];
  unsigned op = (unsigned)(rnd(seed) % 100);
  int rc = ES_OK, want = ES_OK;
  if (op < 40 && m->nrows < RM_MAXR) {  /* insert */
    rm_row *r = &m->rows[m->nrows];
    memset(r, 0, sizeof *r);
    r->sess = s;
    r->index = m->s[s].n + 1;
    r->position = m->npos + 1;
    r->type = (int)(rnd(seed) % 3);
    r->lane = (int)(rnd(seed) % 3);
    unsigned st = (unsigned)(rnd(seed) % 20);
    r->status = st < 12 ? ES_STATUS_PENDING : st < 17 ? ES_STATUS_PROCESSED : ES_STATUS_DEAD;
    r->queued = r->status == ES_STATUS_PENDING && rnd(seed) % 3 != 0;
    r->due = r->queued ? (int64_t)(rnd(seed) % 50) : ES_NONE;
    r->live = 1;
    /* A fork's copy now and then, naming any session (deleted ones too:
     * its name must outlive it). */
    r->origin = rnd(seed) % 4 == 0 ? (int)(rnd(seed) % RM_NS) : -1;
    /* An id used before by a row no longer stored, now and then. */
    r->idn = 0;
    if (rnd(seed) % 5 == 0 && m->nids) {
      int n = 1 + (int)(rnd(seed) % (uint64_t)m->nids);
      if (m->holder[n] < 0) r->idn = n;
    }
    if (!r->idn) {
      r->idn = ++m->nids;
      m->holder[r->idn] = -1;
    }
    snprintf(r->id, sizeof r->id, "r%d", r->idn);
    es_event e = mkrow(name, r->index, r->id, RM_LANES[r->lane]);
    e.type = (char *)RM_TYPES[r->type];
    e.status = r->status;
    e.queued = r->queued;
    e.due_at = r->due;
    if (r->status == ES_STATUS_DEAD) e.last_error = "dead";
    if (r->origin >= 0) {
      e.origin_session = (char *)RM_SESS[r->origin];
      e.origin_index = 1;
    }
    int64_t p = ins_pos(t, e);
    if (p != r->position) {
      if (!*bad) printf("#   insert %s#%lld at %lld, wanted %lld\n", name, (long long)r->index, (long long)p,
                        (long long)r->position);
      *bad |= 1 << 16;
      return;
    }
    m->holder[r->idn] = m->nrows++;
    m->s[s].n++;
    m->npos++;
    return;
  }
  if (op < 55) {  /* update a live row of s */
    int cand[64], nc = 0;
    for (int i = m->nrows - 1; i >= 0 && nc < 64; i--)
      if (m->rows[i].live && m->rows[i].sess == s) cand[nc++] = i;
    if (!nc) return;
    rm_row *r = &m->rows[cand[rnd(seed) % (uint64_t)nc]];
    unsigned st = (unsigned)(rnd(seed) % 3);
    r->status = st == 0 ? ES_STATUS_PENDING : st == 1 ? ES_STATUS_PROCESSED : ES_STATUS_DEAD;
    r->queued = r->status == ES_STATUS_PENDING && rnd(seed) % 2;
    r->due = r->queued ? (int64_t)(rnd(seed) % 50) : ES_NONE;
    rc = set_state(t, name, r->index, r->status, r->queued, r->due);
  } else if (op < 67) {  /* truncate */
    int64_t n = m->s[s].n, through;
    unsigned how = (unsigned)(rnd(seed) % 4);
    through = how == 0 ? INT64_MAX : how == 1 ? (int64_t)(rnd(seed) % (uint64_t)(n + 3)) - 1
                                               : m->s[s].gone + (int64_t)(rnd(seed) % 4);
    rc = del_range(t, name, through);
    int64_t to = through < n ? through : n;
    if (to > m->s[s].gone) {
      for (int i = 0; i < m->nrows; i++)
        if (m->rows[i].live && m->rows[i].sess == s && m->rows[i].index <= to) rm_kill(m, i);
      m->s[s].gone = to;
      rm_gc(m, s);
    }
  } else if (op < 75) {  /* session row */
    rc = sess_put(t, name, m->s[s].n);
    m->s[s].info = 1;
  } else if (op < 80) {  /* session row removed */
    want = m->s[s].info ? ES_OK : ES_NOT_FOUND;
    rc = sess_del(t, name);
    if (m->s[s].info) {
      m->s[s].info = 0;
      rm_gc(m, s);
    }
  } else if (op < 86) {  /* snapshot */
    int red = (int)(rnd(seed) % 3);
    rc = snap_put(t, name, RM_REDUCERS[red], 1, "S", "v");
    m->s[s].snaps |= 1 << red;
  } else if (op < 89) {  /* snapshots removed */
    rc = snaps_del(t, name);
    if (m->s[s].snaps) {
      m->s[s].snaps = 0;
      rm_gc(m, s);
    }
  } else if (op < 95) {  /* ref */
    int ref = (int)(rnd(seed) % RM_NREFS);
    char rn[16];
    snprintf(rn, sizeof rn, "ref%d", ref);
    rc = ref_put(t, rn, name, 1, 1);
    m->ref[ref] = s;
  } else {  /* refs naming s removed */
    rc = refs_del(t, name);
    for (int i = 0; i < RM_NREFS; i++)
      if (m->ref[i] == s) m->ref[i] = -1;
  }
  if (rc != want) {
    if (!*bad) printf("#   op %u on %s: %s, wanted %s\n", op, name, es_strerror(rc), es_strerror(want));
    *bad |= 1 << 17;
  }
}

/* Transactions of the random run: fewer under valgrind (main). */
static int random_txns = 400;

static void test_retention_random(void) {
  static rm_model m, saved_txn, saved_sp[4];
  static rm_seen seen;
  memset(&m, 0, sizeof m);
  for (int i = 0; i < RM_NREFS; i++) m.ref[i] = -1;
  es_backend *b = open_mem();
  uint64_t seed = 0x2545F4914F6CDD1Dull;
  int bad = 0, commits = 0, rollbacks = 0, sp_rollbacks = 0;
  es_err err;
  for (int txn = 0; txn < random_txns && !bad; txn++) {
    es_txn *t = wbegin(b);
    saved_txn = m;
    char *before = dump_state(t, rm_ids(&m));
    char *sp_dump[4] = {0};
    int depth = 0;
    int nops = 1 + (int)(rnd(&seed) % 40);
    for (int k = 0; k < nops && !bad; k++) {
      unsigned what = (unsigned)(rnd(&seed) % 100);
      if (what < 6 && depth < 4) {
        CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
        saved_sp[depth] = m;
        sp_dump[depth++] = dump_state(t, rm_ids(&m));
      } else if (what < 10 && depth) {
        depth--;
        if (rnd(&seed) % 2) {
          OPS->savepoint_rollback(BK(t), t);
          m = saved_sp[depth];
          char *d = dump_state(t, rm_ids(&m));
          if (!same_dump(sp_dump[depth], d)) bad |= 1 << 18;
          free(d);
          sp_rollbacks++;
        } else {
          CHECK_RC(OPS->savepoint_release(BK(t), t, &err), ES_OK);
        }
        free(sp_dump[depth]);
        sp_dump[depth] = NULL;
      } else if (what < 12) {
        rm_verify(t, &m, &seen, &bad);  /* the writer sees its own changes */
      } else {
        rm_step(t, &m, &seed, &bad);
      }
    }
    while (depth) free(sp_dump[--depth]);
    if (rnd(&seed) % 4 == 0) {
      OPS->write_rollback(BK(t), t);
      m = saved_txn;
      es_txn *r = rbegin(b);
      char *d = dump_state(r, rm_ids(&m));
      OPS->read_end(BK(r), r);
      if (!same_dump(before, d)) bad |= 1 << 19;
      free(d);
      rollbacks++;
    } else {
      commit(t);
      commits++;
    }
    free(before);
    es_txn *r = rbegin(b);
    rm_verify(r, &m, &seen, &bad);
    OPS->read_end(BK(r), r);
  }
  int live = 0;
  for (int i = 0; i < m.nrows; i++) live += m.rows[i].live;
  printf("#   %d commits, %d rollbacks, %d savepoint rollbacks; %d rows inserted, %d live, "
         "position %lld\n", commits, rollbacks, sp_rollbacks, m.nrows, live, (long long)m.npos);
  CHECK(!bad);
  OPS->close(b);
}

/* ---- tests: retention out of memory --------------------------------------- */

/* The removals allocate nothing but room in the undo log: with the log
 * filled to each length in turn, each of them meets the growth once. It
 * must then fail with STORAGE having changed nothing, succeed when tried
 * again, and the transaction roll back to the committed state. */
static void test_out_of_memory_removal(void) {
  void *(*volatile alloc)(size_t) = malloc;
  fail_countdown = 0;
  void *probe = alloc(1);
  fail_countdown = -1;
  if (probe) {
    free(probe);
    skip_case("allocation failures cannot be injected here (valgrind, ASan own malloc)");
    return;
  }
  int tested = 0;
  for (size_t i = 0; i < NSTEPS; i++) {
    if (!log_only(STEPS[i].fn) || STEPS[i].fn == step_pres_expire || STEPS[i].fn == step_ref_delete)
      continue;  /* the last two: test_out_of_memory */
    /* A new store each time: the log keeps its capacity across
     * transactions, and each step should meet the first growth. */
    es_backend *b = open_mem();
    populate(b);
    char *base = dump_now(b);
    int hit = 0;
    for (int k = 0; k < 600 && !hit; k++) {
      es_txn *t = wbegin(b);
      run_steps(t, 0, i);
      for (int j = 0; j < k; j++) CHECK_RC(pres_put(t, "ns2", "p1", "f1", "1", j, 9000), ES_OK);
      char *pre = dump_state(t, BASE_IDS);
      fail_countdown = 0;
      int rc = STEPS[i].fn(t);
      fail_countdown = -1;
      if (rc != ES_OK) {
        hit = 1;
        if (rc != ES_STORAGE) {
          printf("#   step %s: %s\n", STEPS[i].name, es_strerror(rc));
          cur_failed = 1;
        }
        char *d = dump_state(t, BASE_IDS);
        if (!same_dump(pre, d)) {
          printf("#   step %s out of memory changed the state\n", STEPS[i].name);
          cur_failed = 1;
        }
        free(d);
        CHECK_RC(STEPS[i].fn(t), ES_OK);
        run_steps(t, i + 1, NSTEPS);  /* and what follows still works */
      }
      free(pre);
      OPS->write_rollback(BK(t), t);
      char *d = dump_now(b);
      if (!same_dump(base, d)) {
        printf("#   step %s: rollback differs\n", STEPS[i].name);
        cur_failed = 1;
      }
      free(d);
    }
    if (!hit) {
      printf("#   step %s never met the log growing\n", STEPS[i].name);
      cur_failed = 1;
    }
    tested++;
    free(base);
    OPS->close(b);
  }
  printf("#   %d removal steps failed once each\n", tested);
  CHECK(tested >= 10);
}

/* ---- tests: threads ------------------------------------------------------ */

typedef struct reader_ctx {
  es_backend *b;
  volatile int *stop;
  long reads, bad;
} reader_ctx;

static int count_cb(void *ctx, const es_event *row) {
  (void)row;
  (*(long *)ctx)++;
  return 0;
}

static void *reader(void *arg) {
  reader_ctx *r = arg;
  while (!__atomic_load_n(r->stop, __ATOMIC_ACQUIRE)) {
    es_txn *t = NULL;
    es_err err;
    if (tx_read_begin(OPS, r->b, &t, &err) != ES_OK) {
      r->bad++;
      break;
    }
    long n = 0;
    OPS->event_all(BK(t), t, NULL, 0, ES_NONE, count_cb, &n, &err);
    if (n % 10) r->bad++;  /* a half-written or rolled-back batch */
    OPS->read_end(BK(t), t);
    __atomic_add_fetch(&r->reads, 1, __ATOMIC_RELAXED);
  }
  return NULL;
}

static long total_reads(reader_ctx *rc, int n) {
  long sum = 0;
  for (int i = 0; i < n; i++) sum += __atomic_load_n(&rc[i].reads, __ATOMIC_RELAXED);
  return sum;
}

static void test_concurrent_readers(void) {
  es_backend *b = open_mem();
  volatile int stop = 0;
  reader_ctx rc[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    rc[i] = (reader_ctx){.b = b, .stop = &stop};
    pthread_create(&th[i], NULL, reader, &rc[i]);
  }
  int64_t head = 0;
  /* At least 300 transactions, and on until the readers got a fair share. */
  int batch;
  for (batch = 0; batch < 300 || (total_reads(rc, 4) < 400 && batch < 1000000); batch++) {
    if (batch % 16 == 0) sched_yield();
    es_txn *t = wbegin(b);
    int keep = batch % 3 != 2;
    for (int i = 0; i < 10; i++) {
      char id[32];
      snprintf(id, sizeof id, "t%d-%d", batch, i);
      CHECK_RC(ins(t, mkrow("s", head + 1 + i, id, NULL)), ES_OK);
    }
    if (keep) {
      commit(t);
      head += 10;
    } else {
      OPS->write_rollback(BK(t), t);
    }
  }
  __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
  long reads = 0, bad = 0;
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    reads += rc[i].reads;
    bad += rc[i].bad;
  }
  CHECK(bad == 0);
  es_txn *t = rbegin(b);
  ints c = range(t, "s", head - 1, ES_NONE, ES_NONE);
  CHECK(c.n == 1 && c.v[0] == head);
  OPS->read_end(BK(t), t);
  CHECK(reads >= 400);
  printf("#   %ld consistent reads during %d write transactions\n", reads, batch);
  OPS->close(b);
}

/* ---- tests: the containers ------------------------------------------------ */

typedef struct inode {
  es_tree_node node;  /* first: a node is its inode */
  int64_t key;
  int64_t val, minval;  /* minval: least val of the subtree (augmented trees) */
  long count;           /* nodes in the subtree (augmented trees) */
  int linked;
  char name[16];
} inode;

static int inode_update(es_tree_node *n) {
  inode *x = (inode *)n, *l = (inode *)es_tree_left(n), *r = (inode *)n->right;
  int64_t m = x->val;
  long c = 1;
  if (l) m = l->minval < m ? l->minval : m, c += l->count;
  if (r) m = r->minval < m ? r->minval : m, c += r->count;
  int changed = m != x->minval || c != x->count;
  x->minval = m;
  x->count = c;
  return changed;
}

/* Recomputes every summary; returns the subtree's count, -1 when a stored
 * summary is wrong. */
static long inode_verify(const es_tree_node *n, int64_t *minval) {
  *minval = INT64_MAX;
  if (!n) return 0;
  const inode *x = (const inode *)n;
  int64_t ml, mr;
  long cl = inode_verify(es_tree_left(n), &ml), cr = inode_verify(n->right, &mr);
  if (cl < 0 || cr < 0) return -1;
  int64_t m = x->val < ml ? x->val : ml;
  m = m < mr ? m : mr;
  if (m != x->minval || 1 + cl + cr != x->count) return -1;
  *minval = m;
  return 1 + cl + cr;
}

static int inode_cmp(const es_tree_node *a, const es_tree_node *b) {
  int64_t x = ((const inode *)a)->key, y = ((const inode *)b)->key;
  return x < y ? -1 : x > y;
}
static int inode_probe(const void *key, const es_tree_node *n) {
  int64_t x = *(const int64_t *)key, y = ((const inode *)n)->key;
  return x < y ? -1 : x > y;
}
static const char *inode_name(const void *item) { return ((const inode *)item)->name; }

/* A deterministic generator, so a failure replays. */
static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static void test_containers(void) {
  enum { N = 2000 };
  static inode nodes[N];
  es_tree t;
  es_hmap m;
  es_tree_init_augmented(&t, inode_cmp, inode_update);
  es_hmap_init(&m, inode_name);
  uint64_t seed = 88172645463325252ull;
  for (int i = 0; i < N; i++) {
    nodes[i].key = (int64_t)(i * 7919 % N) - N / 2;  /* distinct */
    nodes[i].val = (int64_t)(rnd(&seed) % 1000);
    nodes[i].linked = 0;
    snprintf(nodes[i].name, sizeof nodes[i].name, "k%d", i);
  }
  long linked = 0;
  int bad_tree = 0, bad_map = 0, bad_seek = 0;
  for (int round = 0; round < 20000; round++) {
    inode *x = &nodes[rnd(&seed) % N];
    if (x->linked && rnd(&seed) % 4 == 0) {
      /* A summarised value changes: unlink, change, relink. */
      es_tree_remove(&t, &x->node);
      x->val = (int64_t)(rnd(&seed) % 1000);
      if (es_tree_insert(&t, &x->node) != NULL) bad_tree = 1;
    } else if (x->linked) {
      es_tree_remove(&t, &x->node);
      if (es_hmap_remove(&m, x->name) != x) bad_map = 1;
      x->linked = 0;
      linked--;
    } else {
      if (es_tree_insert(&t, &x->node) != NULL) bad_tree = 1;
      if (es_hmap_get(&m, x->name) || es_hmap_put(&m, x) != 0) bad_map = 1;
      x->linked = 1;
      linked++;
    }
    if (round % 97 == 0 || round < 200) {
      int64_t mv;
      if (es_tree_check(&t) != linked) bad_tree = 1;
      if (inode_verify(t.root, &mv) != linked) bad_tree = 1;
      if (m.count != (size_t)linked) bad_map = 1;
      for (int i = 0; i < N; i += 37)
        if ((es_hmap_get(&m, nodes[i].name) == &nodes[i]) != nodes[i].linked) bad_map = 1;
      /* seek and iteration against a scan of the reference */
      int64_t k = (int64_t)(rnd(&seed) % (N + 2)) - N / 2 - 1;
      for (int strict = 0; strict < 2; strict++) {
        const inode *want = NULL;
        for (int i = 0; i < N; i++)
          if (nodes[i].linked && (strict ? nodes[i].key > k : nodes[i].key >= k) &&
              (!want || nodes[i].key < want->key))
            want = &nodes[i];
        if ((const inode *)es_tree_seek(&t, inode_probe, &k, strict) != want) bad_seek = 1;
        es_tree_iter it;
        int64_t prev = INT64_MIN;
        long seen = 0;
        for (es_tree_node *n = es_tree_iter_seek(&it, &t, inode_probe, &k, strict); n;
             n = es_tree_iter_next(&it)) {
          if (((inode *)n)->key <= prev) bad_seek = 1;
          prev = ((inode *)n)->key;
          seen++;
        }
        long expect = 0;
        for (int i = 0; i < N; i++)
          if (nodes[i].linked && (strict ? nodes[i].key > k : nodes[i].key >= k)) expect++;
        if (seen != expect) bad_seek = 1;
      }
    }
  }
  /* Ascending and descending runs: the append path and its mirror, with
   * summaries that stop changing early (rising val) and late (falling). */
  int64_t mv;
  es_tree_clear(&t, NULL);
  for (int i = 0; i < N; i++) {
    nodes[i].key = i;
    nodes[i].val = i;
    es_tree_insert(&t, &nodes[i].node);
  }
  if (es_tree_check(&t) != N || ((inode *)es_tree_first(&t))->key != 0) bad_tree = 1;
  if (inode_verify(t.root, &mv) != N || mv != 0) bad_tree = 1;
  es_tree_clear(&t, NULL);
  for (int i = 0; i < N; i++) {
    nodes[i].key = -i;
    nodes[i].val = -i;
    es_tree_insert(&t, &nodes[i].node);
  }
  if (es_tree_check(&t) != N || ((inode *)es_tree_first(&t))->key != 1 - N) bad_tree = 1;
  if (inode_verify(t.root, &mv) != N || mv != 1 - N) bad_tree = 1;
  es_tree_clear(&t, NULL);
  CHECK(!bad_tree);
  CHECK(!bad_map);
  CHECK(!bad_seek);
  es_hmap_destroy(&m);

  /* es_hmap_replace swaps an item for another with the same key, never
   * allocating; es_hmap_shrink gives a mostly empty table back. */
  static inode twins[N];
  es_hmap_init(&m, inode_name);
  for (int i = 0; i < N; i++) {
    snprintf(twins[i].name, sizeof twins[i].name, "k%d", i);
    CHECK(es_hmap_put(&m, &nodes[i]) == 0);
  }
  CHECK(es_hmap_replace(&m, &twins[7]) == &nodes[7]);
  CHECK(es_hmap_get(&m, "k7") == &twins[7] && m.count == N);
  CHECK(es_hmap_replace(&m, &nodes[7]) == &twins[7]);
  CHECK(es_hmap_get(&m, "k7") == &nodes[7]);
  inode stranger;
  snprintf(stranger.name, sizeof stranger.name, "nope");
  CHECK(es_hmap_replace(&m, &stranger) == NULL && !es_hmap_get(&m, "nope") && m.count == N);
  size_t big_cap = m.cap;
  CHECK(es_hmap_shrink(&m) == 0 && m.cap == big_cap);  /* full: nothing to do */
  for (int i = 0; i < N; i++)
    if (i % 50) CHECK(es_hmap_remove(&m, nodes[i].name) == &nodes[i]);
  CHECK(es_hmap_shrink(&m) == 0 && m.cap < big_cap / 8 && m.count == N / 50 && m.removed == 0);
  for (int i = 0; i < N; i++)
    CHECK((es_hmap_get(&m, nodes[i].name) == &nodes[i]) == (i % 50 == 0));
  es_hmap_destroy(&m);
}

/* ---- tests: scale -------------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);  /* CPU time: steadier on a busy machine */
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A UUIDv7-shaped id (36 bytes) for event n, written without printf. */
static void make_id(char *out, uint64_t n) {
  static const char hex[] = "0123456789abcdef";
  memcpy(out, "0190f3a4-5b6c-7d8e-9f01-000000000000", 37);
  for (int i = 35; i >= 24; i--, n >>= 4) out[i] = hex[n & 15];
}

/* Heap chunks plus mmapped blocks (big arrays are mmapped or not depending
 * on glibc's dynamic threshold), plus the hash tables' own mappings. */
static size_t heap_used(void) {
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd + es_hmap_mapped_bytes();
}

static long rss_bytes(void) {
  long pages = 0, rss = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f) return 0;
  if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
  fclose(f);
  return rss * 4096;
}

typedef struct scale_run {
  double insert_s;
  double bytes_per_event;
  double rss_per_event;
  double ns[8];  /* per-call costs, see COST_NAMES */
} scale_run;

static const char *const COST_NAMES[] = {"event_get", "event_get_by_id", "event_range(10)",
                                         "lane_next", "queued_due(all, 10)",
                                         "queued_due(session)", "queued_next_due",
                                         "dead_list(1)"};

static int nop_cb(void *ctx, const es_event *row) {
  (void)row;
  (*(long *)ctx)++;
  return 0;
}

/* Appends n events to one session as the core would (batches of 100, a
 * savepoint each): pending and queued at created_at, a quarter of them on
 * one of 100 lanes (queued only at the head of their lane), one in 1000
 * dead. Then times each read op at the far end of history and checks the
 * answers. */
static scale_run scale(int64_t n, int settled, int rounds) {
  scale_run out = {0};
  es_backend *b = open_mem();
  es_err err;
  char id[40], lane[16];
  size_t heap0 = heap_used();
  long rss0 = rss_bytes();
  double t0 = now_s();
  for (int64_t i = 1; i <= n;) {
    es_txn *t = wbegin(b);
    CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
    for (int k = 0; k < 100 && i <= n; k++, i++) {
      es_event e;
      es_event_init(&e);
      make_id(id, (uint64_t)i);
      e.id = id;
      e.type = "order.placed";
      e.payload = "{\"qty\":2,\"sku\":\"A1\"}";
      e.payload_len = 21;
      e.session = "big";
      e.index = i;
      e.created_at = 1000 + i;
      if (i % 4 == 0) {
        snprintf(lane, sizeof lane, "lane%lld", (long long)(i / 4 % 100));
        e.lane = lane;
      }
      if (settled) {
        e.status = ES_STATUS_PROCESSED;
        e.processed_at = e.created_at;
        e.returned = -1;
      } else if (i % 1000 == 0) {
        e.status = ES_STATUS_DEAD;
        e.failures = 5;
        e.last_error = "boom";
      } else {
        e.queued = !e.lane || i <= 400;  /* one head per lane */
        e.due_at = e.queued ? e.created_at : ES_NONE;
      }
      if (OPS->event_insert(BK(t), t, &e, &err) != ES_OK || e.position != i) {
        cur_failed = 1;
        printf("#   insert %lld failed\n", (long long)i);
        i = n + 1;
        break;
      }
    }
    CHECK_RC(OPS->savepoint_release(BK(t), t, &err), ES_OK);
    es_session_info si;
    es_session_info_init(&si);
    OPS->session_get(BK(t), t, "big", &si, &err);
    es_session_info_destroy(&si);
    si.session = "big";
    si.head = si.events = i - 1;
    CHECK_RC(OPS->session_put(BK(t), t, &si, &err), ES_OK);
    commit(t);
  }
  out.insert_s = now_s() - t0;
  out.bytes_per_event = (double)(heap_used() - heap0) / (double)n;
  out.rss_per_event = (double)(rss_bytes() - rss0) / (double)n;

  /* Answers at the far end. */
  es_txn *t = rbegin(b);
  es_event e;
  es_event_init(&e);
  CHECK_RC(OPS->event_get(BK(t), t, "big", n, &e, &err), ES_OK);
  CHECK(e.position == n && e.created_at == 1000 + n);
  es_event_destroy(&e);
  make_id(id, (uint64_t)(n / 2));
  CHECK_RC(OPS->event_get_by_id(BK(t), t, id, &e, &err), ES_OK);
  CHECK(e.index == n / 2);
  es_event_destroy(&e);
  ints c = range(t, "big", n - 10, ES_NONE, 5);
  WANT(c, n - 9, n - 8, n - 7, n - 6, n - 5);
  c = all_pos(t, n - 3, ES_NONE);
  WANT(c, n - 2, n - 1, n);
  if (!settled) {
    c = due_pos(t, NULL, 1003, ES_NONE);
    WANT(c, 1, 2, 3);
    c = due_pos(t, NULL, INT64_MAX, 3);
    WANT(c, 1, 2, 3);
    c = due_pos(t, "big", 1005, ES_NONE);
    CHECK(c.n == 5);
    CHECK(next_due(t, NULL, 1000 + n - 2) == 1000 + n - 1 || next_due(t, NULL, 1000 + n - 2) == 1000 + n);
    CHECK(lane_next(t, "big", "lane5", 0) == 20);
    CHECK(lane_next(t, "big", "lane5", 20) == 420);
    c = dead_pos(t, NULL, 0, 2);
    if (n >= 2000) WANT(c, 1000, 2000);
    c = dead_pos(t, "big", n - 1000, ES_NONE);
    CHECK(c.n == 1);
  } else {
    CHECK(next_due(t, NULL, 0) == ES_NONE);
    CHECK(lane_next(t, "big", "lane5", 0) == 0);
  }

  /* Per-call costs, each op repeated over the newest part of history. */
  long sink = 0;
  for (int op = 0; op < 8; op++) {
    double s = now_s();
    for (int r = 0; r < rounds; r++) {
      int64_t idx = n - (r * 7919) % (n < 1000 ? n : 1000);
      switch (op) {
        case 0:
          OPS->event_get(BK(t), t, "big", idx, &e, &err);
          es_event_destroy(&e);
          break;
        case 1:
          make_id(id, (uint64_t)idx);
          OPS->event_get_by_id(BK(t), t, id, &e, &err);
          es_event_destroy(&e);
          break;
        case 2:
          OPS->event_range(BK(t), t, "big", idx - 10, idx, 10, nop_cb, &sink, &err);
          break;
        case 3: {
          int64_t x;
          OPS->lane_next(BK(t), t, "big", "lane7", idx, &x, &err);
          sink += x > 0;
          break;
        }
        case 4:
          OPS->queued_due(BK(t), t, NULL, NULL, INT64_MAX, 10, nop_cb, &sink, &err);
          break;
        case 5:
          OPS->queued_due(BK(t), t, "big", NULL, 1010, ES_NONE, nop_cb, &sink, &err);
          break;
        case 6: {
          int64_t x;
          OPS->queued_next_due(BK(t), t, NULL, NULL, 1000 + idx, &x, &err);
          sink += x != ES_NONE;
          break;
        }
        default:
          OPS->dead_list(BK(t), t, NULL, NULL, idx - 5000, 1, nop_cb, &sink, &err);
          break;
      }
    }
    out.ns[op] = (now_s() - s) * 1e9 / rounds;
  }
  OPS->read_end(BK(t), t);
  OPS->close(b);
  return out;
}

static int64_t scale_n = 1000000;
static int timing_rounds = 20000;

/* ---- tests: retention cost ------------------------------------------------ */

typedef struct rm_cost {
  double trunc_ns;     /* a transaction removing 10 rows from the front of the big session (median) */
  double delete_ns;    /* a transaction deleting a 10-row session, rows and row (median) */
  double whole_per_s;  /* rows/s removing the big session whole, commit included */
  double heap_full;    /* bytes in use with everything stored */
  double heap_left;    /* bytes still in use once everything is removed */
} rm_cost;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of v[0..n) (sorted in place). One transaction's time, not the
 * mean: the allocator now and then pauses a single free for a long while
 * (AddressSanitizer recycling its quarantine: 11 ms once in 100 rounds),
 * which is not the store's cost; an O(store) step shows in every round. */
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* n events in session "big" (like scale(): a quarter laned, one in 1000
 * dead, the rest queued), then `rounds` (at most 100) sessions of 10 at
 * the newest positions; then times removals that touch few rows, and the
 * whole. */
static rm_cost retention_cost(int64_t n, int rounds) {
  double took[100];
  rm_cost out = {0};
  es_backend *b = open_mem();
  char id[40], lane[16], name[32];
  size_t heap0 = heap_used();
  for (int64_t i = 1; i <= n;) {
    es_txn *t = wbegin(b);
    for (int k = 0; k < 1000 && i <= n; k++, i++) {
      make_id(id, (uint64_t)i);
      es_event e = mkrow("big", i, id, NULL);
      e.type = "order.placed";
      if (i % 4 == 0) {
        snprintf(lane, sizeof lane, "lane%lld", (long long)(i / 4 % 100));
        e.lane = lane;
        e.queued = i <= 400;
        e.due_at = e.queued ? e.created_at : ES_NONE;
      }
      if (i % 1000 == 0) {
        e.status = ES_STATUS_DEAD;
        e.queued = 0;
        e.due_at = ES_NONE;
      }
      CHECK_RC(ins(t, e), ES_OK);
    }
    commit(t);
  }
  es_txn *t = wbegin(b);
  for (int s = 0; s < rounds; s++) {
    snprintf(name, sizeof name, "tiny/%03d", s);
    for (int64_t i = 1; i <= 10; i++) {
      make_id(id, (uint64_t)(n + 1 + s * 10 + i));
      CHECK_RC(ins(t, mkrow(name, i, id, "l")), ES_OK);
    }
    CHECK_RC(sess_put(t, name, 10), ES_OK);
  }
  commit(t);
  out.heap_full = (double)(heap_used() - heap0);

  for (int r = 1; r <= rounds; r++) {
    double t0 = now_s();
    t = wbegin(b);
    CHECK_RC(del_range(t, "big", 10 * r), ES_OK);
    commit(t);
    took[r - 1] = (now_s() - t0) * 1e9;
  }
  out.trunc_ns = median(took, rounds);
  t = rbegin(b);
  CHECK_RC(get_rc(t, "big", 10 * rounds), ES_NOT_FOUND);
  CHECK_RC(get_rc(t, "big", 10 * rounds + 1), ES_OK);
  ints c = all_pos(t, ES_NONE, 2);
  WANT(c, 10 * rounds + 1, 10 * rounds + 2);
  c = due_pos(t, "big", INT64_MAX, 1);
  WANT(c, 10 * rounds + 1);
  CHECK(last_pos(t) == n + 10 * rounds);
  OPS->read_end(BK(t), t);

  for (int s = rounds - 1; s >= 0; s--) {  /* newest first: last_position goes down */
    snprintf(name, sizeof name, "tiny/%03d", s);
    double t0 = now_s();
    t = wbegin(b);
    CHECK_RC(del_range(t, name, INT64_MAX), ES_OK);
    CHECK_RC(sess_del(t, name), ES_OK);
    commit(t);
    took[s] = (now_s() - t0) * 1e9;
  }
  out.delete_ns = median(took, rounds);
  t = wbegin(b);
  CHECK(last_pos(t) == n);
  make_id(id, 1);
  CHECK(ins_pos(t, mkrow("big", n + 1, id, NULL)) == n + 10 * rounds + 1);  /* never reused */
  OPS->write_rollback(BK(t), t);

  double t0 = now_s();
  t = wbegin(b);
  CHECK_RC(del_range(t, "big", INT64_MAX), ES_OK);
  commit(t);
  out.whole_per_s = (double)(n - 10 * rounds) / (now_s() - t0);
  t = rbegin(b);
  CHECK(last_pos(t) == 0);
  c = all_pos(t, ES_NONE, ES_NONE);
  WANT_NONE(c);
  OPS->read_end(BK(t), t);
  out.heap_left = (double)(heap_used() - heap0);
  OPS->close(b);
  return out;
}

static void test_retention_scale(void) {
  rm_cost small = retention_cost(2000, 100);
  rm_cost big = retention_cost(scale_n, 100);
  printf("#   removing 10 rows (median transaction): %.1f us with %lld rows stored, %.1f us with %lld\n",
         small.trunc_ns / 1e3, 2000LL, big.trunc_ns / 1e3, (long long)scale_n);
  printf("#   deleting a 10-row session (median transaction): %.1f us -> %.1f us\n", small.delete_ns / 1e3,
         big.delete_ns / 1e3);
  printf("#   removing %lld rows at once: %.0f rows/s; heap in use %.0f MB before, %.0f kB after\n",
         (long long)scale_n, big.whole_per_s, big.heap_full / 1e6, big.heap_left / 1e3);
  /* O(removed), not O(store): the store 500x bigger, the same cost within
   * noise and cache misses (about 2x, printed above); an O(n) step at 1M
   * rows would be 500x. CPU time (now_s), so another process's load does
   * not count, and the median round, so one long pause of the allocator
   * does not either (retention_cost); the bound is 10x any figure seen here (a generous ceiling
   * that catches O(n), not a latency target: those are in bench/). */
  if (scale_n >= 200000) {
    CHECK(big.trunc_ns < 50 * small.trunc_ns + 50000);
    CHECK(big.delete_ns < 50 * small.delete_ns + 50000);
  }
  /* Removed rows give their memory back: rows, ids, both arrays. (Under
   * AddressSanitizer mallinfo2 sees nothing: no figure to check.) */
  if (big.heap_full > 0) {
    CHECK(big.heap_left < 1e6);
    /* What stays does not grow with the rows removed: the small store
     * leaves as much (the undo log's array, ~100 kB, is kept for reuse),
     * which is a fiftieth of a big store, not of a 20,000-row one. */
    CHECK(big.heap_left < small.heap_left + 64 * 1024);
    if (scale_n >= 200000) CHECK(big.heap_left < big.heap_full / 50);
  }
}

/* ---- the compact dispatch record (RF_COMPACT) ---------------------------- */

/* Every event in the store, dumped in position order. */
static char *dump_events(es_txn *t) {
  sbuf d = {0};
  es_err err;
  CHECK_RC(OPS->event_all(BK(t), t, NULL, 0, ES_NONE, dump_event_cb, &d, &err), ES_OK);
  if (!d.p) sb_printf(&d, "none");
  return d.p;
}

/* mkrow's row as the core leaves it once a handler claimed it `claimed` ms
 * after it was created and that attempt completed `ran` ms later returning
 * ret events; with a revision and meta, so that the tail of the row is in
 * play too. */
static es_event done_once(const char *session, int64_t index, const char *id, int64_t claimed,
                          int64_t ran, int64_t ret) {
  es_event e = mkrow(session, index, id, NULL);
  e.revision = 2;
  e.meta = "{\"m\":1}";
  e.status = ES_STATUS_PROCESSED;
  e.queued = 0;
  e.due_at = ES_NONE;
  e.attempts = e.processed_by_attempt = 1;
  e.first_claimed_at = e.last_claimed_at = e.created_at + claimed;
  e.processed_at = e.first_claimed_at + ran;
  e.returned = ret;
  return e;
}

/* The same row claimed (before its completion): holder, expiry, still queued. */
static es_event claimed_once(const es_event *done) {
  es_event e = *done;
  e.status = ES_STATUS_PENDING;
  e.processed_at = ES_NONE;
  e.returned = 0;
  e.processed_by_attempt = ES_NONE;
  e.claim_holder = "w1";
  e.claim_expires_at = e.due_at = e.first_claimed_at + 30000;
  e.queued = 1;
  return e;
}

static void tw_two_attempts(es_event *e) {
  e->attempts = e->processed_by_attempt = 2;
  e->last_claimed_at += 40;
  e->processed_at += 40;
}
static void tw_failed_first(es_event *e) {
  e->attempts = e->processed_by_attempt = 2;
  e->failures = 1;
  e->failed_at = e->first_claimed_at + 5;
  e->last_failed_attempt = 1;
  e->last_claimed_at += 100;
  e->processed_at += 100;
}
static void tw_other_attempt(es_event *e) { e->processed_by_attempt = 2; }
static void tw_holder(es_event *e) { e->claim_holder = "w1"; }
static void tw_error(es_event *e) { e->last_error = "earlier"; }
static void tw_expiry(es_event *e) { e->claim_expires_at = e->processed_at + 1; }
static void tw_retry(es_event *e) { e->retry_at = e->processed_at + 1; }
static void tw_due(es_event *e) { e->due_at = 5000; }
static void tw_last_claim(es_event *e) { e->last_claimed_at++; }
static void tw_dead(es_event *e) { e->status = ES_STATUS_DEAD; }
static void tw_claim_before_epoch(es_event *e) { e->first_claimed_at = e->last_claimed_at = INT64_MIN + 1; }
static void tw_claim_none(es_event *e) { e->first_claimed_at = e->last_claimed_at = ES_NONE; }
static void tw_done_at_max(es_event *e) { e->processed_at = INT64_MAX; }
static void tw_created_none(es_event *e) { e->created_at = ES_NONE; }

typedef struct dcase {
  const char *what;
  int64_t claimed, ran, ret;
  void (*tweak)(es_event *e);
  int block;  /* 1: not the compact record (a block holds it) */
} dcase;

static const dcase DCASES[] = {
    {"returned 0", 3, 7, 0, NULL, 0},
    {"returned 5", 3, 7, 5, NULL, 0},
    {"no delay at all (processed_at == created_at)", 0, 0, 0, NULL, 0},
    {"claimed 49 days later", 4294967295LL, 1, 1, NULL, 0},
    {"ran 17 minutes", 1, (1 << 20) - 1, 1, NULL, 0},
    {"returned 4095", 1, 1, 4095, NULL, 0},
    {"claimed one ms too late", 4294967296LL, 1, 1, NULL, 1},
    {"ran one ms too long", 1, 1 << 20, 1, NULL, 1},
    {"returned 4096", 1, 1, 4096, NULL, 1},
    {"returned huge", 1, 1, INT64_MAX, NULL, 1},
    {"returned -1", 1, 1, -1, NULL, 1},
    {"claimed before created", -1, 1, 1, NULL, 1},
    {"processed before claimed", 5, -1, 1, NULL, 1},
    {"two attempts", 3, 7, 1, tw_two_attempts, 1},
    {"a failure, then success", 3, 7, 1, tw_failed_first, 1},
    {"processed by another attempt", 3, 7, 1, tw_other_attempt, 1},
    {"holder kept", 3, 7, 1, tw_holder, 1},
    {"error kept", 3, 7, 1, tw_error, 1},
    {"expiry kept", 3, 7, 1, tw_expiry, 1},
    {"retry_at kept", 3, 7, 1, tw_retry, 1},
    {"due_at kept", 3, 7, 1, tw_due, 1},
    {"last claim not the first", 3, 7, 1, tw_last_claim, 1},
    {"dead", 3, 7, 1, tw_dead, 1},
    {"claimed at INT64_MIN + 1", 3, 7, 1, tw_claim_before_epoch, 1},
    {"claim times ES_NONE", 3, 7, 1, tw_claim_none, 1},
    {"processed at INT64_MAX", 3, 7, 1, tw_done_at_max, 1},
    {"created_at ES_NONE", 3, 7, 1, tw_created_none, 1},
};
#define NDCASES (sizeof DCASES / sizeof DCASES[0])

static es_event dcase_row(size_t i, const char *session, char id[16]) {
  snprintf(id, 16, "d%zu", i);
  es_event e = done_once(session, (int64_t)i + 1, id, DCASES[i].claimed, DCASES[i].ran, DCASES[i].ret);
  if (DCASES[i].tweak) DCASES[i].tweak(&e);
  return e;
}

/* A completed-once event reads back exactly, every field, from every read
 * op, inside the transaction and after it; so does each record next to it
 * that the compact one cannot hold (those keep a block). Completed by an
 * update (after a claim, as the core does) and inserted so. Where
 * allocations can be counted, the update allocates exactly when the
 * record takes a block: the compact one costs nothing. */
static void test_compact_roundtrip(void) {
  es_backend *b = open_mem();
  int counted = allocs_counted();
  char id[16];
  for (size_t i = 0; i < NDCASES; i++) {
    es_event done = dcase_row(i, "s", id);
    es_event claim = claimed_once(&done);
    es_event fresh = mkrow("s", done.index, id, NULL);
    fresh.revision = done.revision;
    fresh.meta = done.meta;
    fresh.created_at = done.created_at;
    fresh.due_at = done.created_at;
    es_txn *t = wbegin(b);
    done.position = claim.position = ins_pos(t, fresh);
    CHECK(done.position > 0);
    commit(t);
    t = wbegin(b);
    CHECK_RC(upd(t, &claim), ES_OK);
    commit(t);
    t = wbegin(b);
    const long armed = 1L << 40;
    fail_countdown = armed;
    CHECK_RC(upd(t, &done), ES_OK);
    long allocs = armed - fail_countdown;
    fail_countdown = -1;
    int before = cur_failed;
    cur_failed = 0;
    check_reads(t, &done);
    commit(t);
    t = rbegin(b);
    check_reads(t, &done);
    check_extras(t, "s", done.index, 2, done.meta, NULL);
    OPS->read_end(BK(t), t);
    if (counted) CHECK((allocs > 0) == DCASES[i].block);
    if (cur_failed) printf("#   case: %s (completed by an update)\n", DCASES[i].what);
    cur_failed |= before;
  }
  /* The same records inserted whole (an import, a move), then undone. */
  es_txn *t = wbegin(b);
  char *none = dump_events(t);
  OPS->write_rollback(BK(t), t);
  t = wbegin(b);
  for (size_t i = 0; i < NDCASES; i++) {
    es_event done = dcase_row(i, "ins", id);
    snprintf(id, 16, "i%zu", i);
    done.id = id;
    int before = cur_failed;
    cur_failed = 0;
    CHECK(ins_row(t, &done) > 0);
    check_reads(t, &done);
    if (cur_failed) printf("#   case: %s (inserted)\n", DCASES[i].what);
    cur_failed |= before;
  }
  OPS->write_rollback(BK(t), t);
  t = rbegin(b);
  char *after = dump_events(t);
  OPS->read_end(BK(t), t);
  CHECK(same_dump(none, after));
  free(none);
  free(after);
  OPS->close(b);
}

/* Undo across the forms: a row whose committed record is compact, one
 * whose record is a block, and one with none, each moved through every
 * other form (compact to block, to another compact word, to none, block
 * to compact, none to compact) under a savepoint and a whole transaction:
 * rolled back, the store reads exactly as committed; kept, exactly as
 * written. Then the compact rows removed (retention), undone, and removed
 * for good (commit frees rows whose disp slot holds no pointer). */
static void test_compact_undo(void) {
  es_backend *b = open_mem();
  es_event x = done_once("u", 1, "x", 3, 7, 2);         /* compact */
  x.position = 1;
  es_event y = claimed_once(&x);                         /* a block (the claim) */
  y.index = y.position = 2;
  y.id = "y";
  y.created_at = 1002;
  es_event z = mkrow("u", 3, "z", NULL);                 /* none: a settled event */
  z.status = ES_STATUS_PROCESSED;
  z.queued = 0;
  z.due_at = ES_NONE;
  z.processed_at = z.created_at;
  z.returned = -1;
  z.position = 3;
  es_txn *t = wbegin(b);
  CHECK_RC(ins(t, mkrow("u", 1, "x", NULL)), ES_OK);
  CHECK_RC(ins(t, mkrow("u", 2, "y", NULL)), ES_OK);
  CHECK_RC(ins(t, z), ES_OK);
  commit(t);
  t = wbegin(b);
  CHECK_RC(upd(t, &x), ES_OK);
  CHECK_RC(upd(t, &y), ES_OK);
  commit(t);
  t = rbegin(b);
  char *base = dump_events(t);
  check_reads(t, &x);
  check_reads(t, &y);
  check_reads(t, &z);
  OPS->read_end(BK(t), t);

  es_event x2 = x, x3 = x, x4 = x;
  tw_failed_first(&x2);                        /* compact -> block */
  x3.returned = 9;                             /* block -> another compact word */
  x3.processed_at += 11;
  x4.attempts = x4.returned = 0;               /* compact -> none (settled) */
  x4.processed_at = x4.created_at;
  x4.returned = -1;
  x4.first_claimed_at = x4.last_claimed_at = x4.processed_by_attempt = ES_NONE;
  es_event y2 = done_once("u", 2, "y", 1, 2, 3); /* block -> compact */
  y2.created_at = 1002;
  y2.position = 2;
  y2.first_claimed_at = y2.last_claimed_at = 1003;
  y2.processed_at = 1005;
  es_event z2 = done_once("u", 3, "z", 0, 0, 0); /* none -> compact */
  z2.revision = 1;
  z2.meta = NULL;
  z2.position = 3;
  es_event x5 = x;                             /* none -> the original word */
  for (int round = 0; round < 3; round++) {
    es_err err;
    t = wbegin(b);
    if (round == 0) CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
    const es_event *seq[] = {&x2, &x3, &x4, &x5, &x3, &y2, &z2};
    for (size_t k = 0; k < sizeof seq / sizeof seq[0]; k++) {
      CHECK_RC(upd(t, seq[k]), ES_OK);
      check_reads(t, seq[k]);
    }
    /* A savepoint inside: compact -> block -> compact again, undone. */
    CHECK_RC(OPS->savepoint(BK(t), t, &err), ES_OK);
    CHECK_RC(upd(t, &x2), ES_OK);
    CHECK_RC(upd(t, &x), ES_OK);
    CHECK_RC(upd(t, &y), ES_OK);
    OPS->savepoint_rollback(BK(t), t);
    check_reads(t, &x3);
    check_reads(t, &y2);
    check_reads(t, &z2);
    if (round == 0) {
      OPS->savepoint_rollback(BK(t), t);
      char *d = dump_events(t);
      CHECK(same_dump(base, d));
      free(d);
      commit(t);
    } else if (round == 1) {
      OPS->write_rollback(BK(t), t);
    } else {
      commit(t);
    }
    t = rbegin(b);
    char *d = dump_events(t);
    if (round < 2) {
      CHECK(same_dump(base, d));
      check_reads(t, &x);
      check_reads(t, &y);
      check_reads(t, &z);
    } else {
      check_reads(t, &x3);
      check_reads(t, &y2);
      check_reads(t, &z2);
    }
    free(d);
    OPS->read_end(BK(t), t);
  }
  /* Removal of compact rows: undone, then for good. */
  t = rbegin(b);
  char *kept = dump_events(t);
  OPS->read_end(BK(t), t);
  t = wbegin(b);
  CHECK_RC(del_range(t, "u", 2), ES_OK);
  OPS->write_rollback(BK(t), t);
  t = rbegin(b);
  char *d = dump_events(t);
  CHECK(same_dump(kept, d));
  free(d);
  OPS->read_end(BK(t), t);
  t = wbegin(b);
  CHECK_RC(upd(t, &x), ES_OK);  /* updated and removed in one transaction */
  CHECK_RC(del_range(t, "u", 3), ES_OK);
  commit(t);
  CHECK(get_rc(t = rbegin(b), "u", 3) == ES_NOT_FOUND);
  OPS->read_end(BK(t), t);
  free(kept);
  free(base);
  OPS->close(b);
}

/* Bytes a row of n costs: inserted pending and queued, claimed, completed
 * by that attempt (processed = 1), each step in its own transactions of
 * 1000 as the core would; or written settled (processed = 0). */
static double bytes_per_row(int64_t n, int processed) {
  es_backend *b = open_mem();
  char id[40];
  size_t heap0 = heap_used();
  for (int64_t from = 1; from <= n; from += 1000) {
    int64_t to = from + 999 < n ? from + 999 : n;
    es_txn *t = wbegin(b);
    for (int64_t i = from; i <= to; i++) {
      make_id(id, (uint64_t)i);
      es_event e = mkrow("big", i, id, NULL);
      e.type = "order.placed";
      e.payload = "{\"qty\":2,\"sku\":\"A1\"}";
      e.payload_len = 21;
      if (!processed) {
        e.status = ES_STATUS_PROCESSED;
        e.queued = 0;
        e.due_at = ES_NONE;
        e.processed_at = e.created_at;
        e.returned = -1;
      }
      CHECK_RC(ins(t, e), ES_OK);
    }
    commit(t);
    if (!processed) continue;
    for (int done_step = 0; done_step < 2; done_step++) {
      t = wbegin(b);
      for (int64_t i = from; i <= to; i++) {
        make_id(id, (uint64_t)i);
        es_event done = done_once("big", i, id, 20, 3, 1);
        done.revision = 1;
        done.meta = NULL;
        es_event claim = claimed_once(&done);
        CHECK_RC(upd(t, done_step ? &done : &claim), ES_OK);
      }
      commit(t);
    }
  }
  double per = (double)(heap_used() - heap0) / (double)n;
  es_txn *t = rbegin(b);
  es_event e;
  es_err err;
  es_event_init(&e);
  CHECK_RC(OPS->event_get(BK(t), t, "big", n, &e, &err), ES_OK);
  CHECK(e.status == ES_STATUS_PROCESSED);
  CHECK(!processed || (e.attempts == 1 && e.returned == 1 && e.processed_at == e.created_at + 23));
  es_event_destroy(&e);
  OPS->read_end(BK(t), t);
  OPS->close(b);
  return per;
}

/* An event a handler claimed once and completed costs what a settled one
 * does: the compact record lives in the row's header, where a dispatch
 * block cost 64 bytes more. (Under AddressSanitizer and valgrind mallinfo2
 * sees nothing: no figure to check.) */
static void test_compact_bytes(void) {
  int64_t n = 20000;
  double settled = bytes_per_row(n, 0), processed = bytes_per_row(n, 1);
  printf("#   %lld events: settled %.0f heap bytes/event, claimed once and completed %.0f\n",
         (long long)n, settled, processed);
  if (settled <= 0) {
    skip_case("mallinfo2 sees no heap here (valgrind, ASan)");
    return;
  }
  CHECK(processed < settled + 16);
}

static void test_scale(void) {
  scale_run small = scale(1000, 0, timing_rounds);
  scale_run big = scale(scale_n, 0, timing_rounds);
  printf("#   %lld pending events in one session: %.0f inserts/s (batches of 100), "
         "%.0f heap bytes/event, %.0f RSS bytes/event\n",
         (long long)scale_n, (double)scale_n / big.insert_s, big.bytes_per_event, big.rss_per_event);
  printf("#   per call, ns (1000 events -> %lld events):\n", (long long)scale_n);
  for (int op = 0; op < 8; op++)
    printf("#     %-22s %7.0f -> %7.0f  (x%.2f)\n", COST_NAMES[op], small.ns[op], big.ns[op],
           big.ns[op] / (small.ns[op] > 0 ? small.ns[op] : 1));
  scale_run settled = scale(scale_n, 1, 1000);
  printf("#   %lld settled events: %.0f inserts/s, %.0f heap bytes/event, %.0f RSS bytes/event\n",
         (long long)scale_n, (double)scale_n / settled.insert_s, settled.bytes_per_event,
         settled.rss_per_event);
}

/* ---- ids stored as 16 bytes; due_at outside the row -------------------- */

static int collect_id(void *ctx, const es_event *row) {
  char (*ids)[48] = ctx;
  snprintf(ids[row->index - 1], 48, "%s", row->id);
  return 0;
}

/* A canonical UUID id is stored as its 16 bytes and must read back as the
 * same text from every op; any other text (upper case, a digit off, one
 * character more or less) is another id, stored as text; the two forms
 * never collide in the index; a removed UUID id is free again and undo
 * gives it back. A row's due_at reads back exactly, queued or not. */
static void test_uuid_ids(void) {
  static const char *const ids[] = {
      "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",  /* canonical: binary */
      "0190A1B2-C3D4-7E5F-8A9B-0C1D2E3F4A5B",  /* upper case: text, another id */
      "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5",   /* 35 characters */
      "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b0", /* 37 characters */
      "0190a1b2c3d4-7e5f-8a9b-0c1d2e3f4a5b-",  /* a dash moved */
      "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5g",  /* not hex */
      "00000000-0000-0000-0000-000000000000",  /* canonical, all zero bytes */
      "ffffffff-ffff-ffff-ffff-ffffffffffff",
  };
  enum { N = sizeof ids / sizeof ids[0] };
  es_backend *b = open_mem();
  es_err err;
  es_txn *t = wbegin(b);
  for (int i = 0; i < N; i++) {
    es_event e = mkrow("u", i + 1, ids[i], NULL);
    if (i % 2) {  /* not queued: due_at is kept outside the queued sets */
      e.queued = 0;
      e.due_at = i == 1 ? ES_NONE : 4242 + i;
    }
    CHECK_RC(ins(t, e), ES_OK);
  }
  CHECK_RC(ins(t, mkrow("u", N + 1, ids[0], NULL)), ES_INVALID_ARGUMENT);  /* taken */
  commit(t);

  t = rbegin(b);
  for (int i = 0; i < N; i++) {
    es_event e;
    es_event_init(&e);
    CHECK_RC(OPS->event_get_by_id(BK(t), t, ids[i], &e, &err), ES_OK);
    CHECK(e.index == i + 1 && strcmp(e.id, ids[i]) == 0);
    CHECK(e.payload_len == 2 && memcmp(e.payload, "{}", 3) == 0);
    int64_t want_due = i % 2 == 0 ? 1000 + i + 1 : i == 1 ? ES_NONE : 4242 + i;
    CHECK(e.due_at == want_due && e.queued == (i % 2 == 0));
    es_event_destroy(&e);
    CHECK_RC(OPS->event_get(BK(t), t, "u", i + 1, &e, &err), ES_OK);
    CHECK(strcmp(e.id, ids[i]) == 0 && e.due_at == want_due);
    es_event_destroy(&e);
  }
  char got[N][48];
  memset(got, 0, sizeof got);
  CHECK_RC(OPS->event_range(BK(t), t, "u", 0, ES_NONE, ES_NONE, collect_id, got, &err), ES_OK);
  for (int i = 0; i < N; i++) CHECK(strcmp(got[i], ids[i]) == 0);
  memset(got, 0, sizeof got);
  CHECK_RC(OPS->event_all(BK(t), t, NULL, 0, ES_NONE, collect_id, got, &err), ES_OK);
  for (int i = 0; i < N; i++) CHECK(strcmp(got[i], ids[i]) == 0);
  memset(got, 0, sizeof got);
  CHECK_RC(OPS->queued_due(BK(t), t, NULL, NULL, INT64_MAX, ES_NONE, collect_id, got, &err), ES_OK);
  for (int i = 0; i < N; i += 2) CHECK(strcmp(got[i], ids[i]) == 0);
  es_event e;
  es_event_init(&e);
  CHECK_RC(OPS->event_get_by_id(BK(t), t, "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5c", &e, &err),
           ES_NOT_FOUND);
  CHECK_RC(OPS->event_get_by_id(BK(t), t, "0190a1b2-C3d4-7e5f-8a9b-0c1d2e3f4a5b", &e, &err),
           ES_NOT_FOUND);
  OPS->read_end(BK(t), t);

  /* Unqueue a queued row with some due_at, queue a row that was not: each
   * reads back what was written, and rollback restores both. */
  t = wbegin(b);
  CHECK_RC(set_state(t, "u", 1, ES_STATUS_PENDING, 0, 777), ES_OK);
  CHECK_RC(set_state(t, "u", 2, ES_STATUS_PENDING, 1, 888), ES_OK);
  CHECK_RC(OPS->event_get(BK(t), t, "u", 1, &e, &err), ES_OK);
  CHECK(e.queued == 0 && e.due_at == 777);
  es_event_destroy(&e);
  CHECK_RC(OPS->event_get(BK(t), t, "u", 2, &e, &err), ES_OK);
  CHECK(e.queued == 1 && e.due_at == 888);
  es_event_destroy(&e);
  int64_t due = 0;
  CHECK_RC(OPS->queued_next_due(BK(t), t, NULL, NULL, 887, &due, &err), ES_OK);
  CHECK(due == 888);
  OPS->write_rollback(BK(t), t);
  t = rbegin(b);
  CHECK_RC(OPS->event_get(BK(t), t, "u", 1, &e, &err), ES_OK);
  CHECK(e.queued == 1 && e.due_at == 1001);
  es_event_destroy(&e);
  CHECK_RC(OPS->event_get(BK(t), t, "u", 2, &e, &err), ES_OK);
  CHECK(e.queued == 0 && e.due_at == ES_NONE);
  es_event_destroy(&e);
  OPS->read_end(BK(t), t);

  /* Removed, the ids are free in the same transaction; undo gives them
   * back to the old rows. */
  t = wbegin(b);
  CHECK_RC(OPS->event_delete_range(BK(t), t, "u", N, &err), ES_OK);
  CHECK_RC(OPS->event_get_by_id(BK(t), t, ids[0], &e, &err), ES_NOT_FOUND);
  CHECK_RC(ins(t, mkrow("v", 1, ids[0], NULL)), ES_OK);
  CHECK_RC(ins(t, mkrow("v", 2, ids[1], NULL)), ES_OK);
  CHECK_RC(OPS->event_get_by_id(BK(t), t, ids[0], &e, &err), ES_OK);
  CHECK(strcmp(e.session, "v") == 0 && e.index == 1);
  es_event_destroy(&e);
  OPS->write_rollback(BK(t), t);
  t = rbegin(b);
  CHECK_RC(OPS->event_get_by_id(BK(t), t, ids[0], &e, &err), ES_OK);
  CHECK(strcmp(e.session, "u") == 0 && e.index == 1 && strcmp(e.id, ids[0]) == 0);
  es_event_destroy(&e);
  OPS->read_end(BK(t), t);
  /* Committed: the new rows keep them. */
  t = wbegin(b);
  CHECK_RC(OPS->event_delete_range(BK(t), t, "u", N, &err), ES_OK);
  CHECK_RC(ins(t, mkrow("v", 1, ids[0], NULL)), ES_OK);
  commit(t);
  t = rbegin(b);
  CHECK_RC(OPS->event_get_by_id(BK(t), t, ids[0], &e, &err), ES_OK);
  CHECK(strcmp(e.session, "v") == 0 && strcmp(e.id, ids[0]) == 0);
  es_event_destroy(&e);
  CHECK_RC(OPS->event_get_by_id(BK(t), t, ids[1], &e, &err), ES_NOT_FOUND);
  OPS->read_end(BK(t), t);
  OPS->close(b);
}

/* ---- main ----------------------------------------------------------------- */

int main(int argc, char **argv) {
  const char *pre = getenv("LD_PRELOAD");
  int valgrind = pre && strstr(pre, "vgpreload");
  if (valgrind) {
    scale_n = 20000;
    timing_rounds = 2000;
    random_txns = 60;
  } else if (MBT_ASAN) {
    scale_n = 200000;
    timing_rounds = 20000;
  }
  const char *env = getenv("MBT_SCALE_N");
  if (env) scale_n = atoll(env);
  if (argc > 1) scale_n = atoll(argv[1]);
  if (scale_n < 1000) scale_n = 1000;

  run("open: only \"memory:\"", test_open);
  run("event_insert / event_update reject bad rows and change nothing", test_insert_rejects);
  run("lane_next: a NULL lane is refused (memory only)", test_lane_next_null);
  run("event fields: origin (immutable, only on forked rows) and the dispatch record round-trip",
      test_event_fields);
  run("event_update undone: every row flag back (revision, meta, key)", test_update_undo_flags);
  run("session rows: every field and string round-trips, copied, replaced, undone",
      test_session_fields);
  run("session_children: byte order, after, limit, moves with the parent, undo, callbacks",
      test_children);
  run("refs: read-transaction writes, NULL names, negative limit, whole-state undo, walks that write",
      test_refs);
  run("savepoint_rollback restores the exact state, indexes included", test_savepoint_rollback);
  run("write_rollback restores the exact state and reuses positions", test_write_rollback);
  run("nested savepoints", test_nested_savepoints);
  run("callbacks may write while a walk is under way", test_callbacks_may_write);
  run("out of memory at every allocation leaves a consistent, undoable state", test_out_of_memory);
  run("readers see only committed transactions", test_concurrent_readers);
  run("event_delete_range: rows leave every set, count and walk; ids free; positions never reused",
      test_delete_range);
  run("event_delete_range inside callbacks of every walk", test_delete_in_callbacks);
  run("session_delete: listing, children, names again, any order, origins of copies",
      test_session_delete);
  run("snapshot_delete_all: that session's only, put again, undo", test_snapshot_delete_all);
  run("ref_delete_session: exactly the refs naming it, following puts, undo",
      test_ref_delete_session);
  run("crypto-shredding: key rows, key uses, snapshot_delete_from, each undone exactly",
      test_crypto_ops);
  run("retention: random transactions against a model, rollbacks against dumps",
      test_retention_random);
  run("retention: out of memory in each removal changes nothing", test_out_of_memory_removal);
  run("tree.h and hmap.h agree with a reference under random operations", test_containers);
  run("ids: canonical UUIDs stored as 16 bytes read back as text; other ids as text; due_at",
      test_uuid_ids);
  run("compact dispatch record: completed once reads back exactly; what does not fit keeps a block",
      test_compact_roundtrip);
  run("compact dispatch record: undo between every form, removal", test_compact_undo);
  run("compact dispatch record: a processed event costs what a settled one does", test_compact_bytes);
  run("scale: ops stay correct and cheap over a long history", test_scale);
  run("retention at scale: cost O(rows removed), memory given back", test_retention_scale);
  printf("1..%d\n", test_no);
  return failed_tests ? 1 : 0;
}
