/*
 * rules.h: what the files of the core store's rules share (append.c,
 * dispatch.c, snapshots.c, presence.c, branches.c, fences.c,
 * retention.c, store.c). Not a public header. Each function's comment is
 * at its definition.
 */
#ifndef ES_STORE_RULES_H
#define ES_STORE_RULES_H

#include "store/internal.h"

#define WAIT_POLL_MS 50       /* how often es_store_wait looks for other processes' commits */

static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* now + d for a duration d >= 0; 1 when the sum would pass INT64_MAX (the
 * largest time there is: refused, never wrapped to a time in the past). */
static inline int add_time(int64_t now, int64_t d, int64_t *sum) {
  if (now > 0 && d > INT64_MAX - now) return 1;
  *sum = now + d;
  return 0;
}

static inline int too_late(es_err *err, const char *what) {
  return es_fail(err, ES_INVALID_ARGUMENT,
                 "%s is too large: now + %s is beyond the largest time (%lld)", what, what,
                 (long long)INT64_MAX);
}

/* Count limits: ES_NONE (none) stays; a negative one is refused by the
 * caller; anything above ES_MAX_LIMIT saturates (it could never be reached,
 * and backends add small windows to limits). */
static inline int64_t cap_limit(int64_t limit) {
  return limit != ES_NONE && limit > ES_MAX_LIMIT ? ES_MAX_LIMIT : limit;
}

/* Optional non-negative integers (positions, indexes, times): ES_NONE or
 * >= 0. */
static inline int check_nonneg(const char *what, int64_t v, es_err *err) {
  if (v != ES_NONE && v < 0) return es_fail(err, ES_INVALID_ARGUMENT, "%s must be >= 0", what);
  return ES_OK;
}

static inline int nomem(es_err *err) { return es_fail(err, ES_STORAGE, "out of memory"); }

/* Backend iterations copy rows into a list through a collector. A
 * callback's nonzero return only stops an iteration, so running out of
 * memory is remembered here and turned into an error by collected(). */
typedef struct {
  void *list;
  int oom;
} collector;

/* read_all's and dead_letters' arguments. */
typedef struct {
  int64_t after, limit;
  const char *session; /* dead_letters filter */
  es_events *out;
  const char *scope;   /* §3.11: a tenant's prefix, or NULL */
} all_args;

int es_rule_owns(const es_event *row, int64_t attempt);
int64_t es_rule_due_of(const es_event *row, int64_t now);
int es_rule_load_session(es_store *s, es_txn *t, const char *session, es_session_info *si,
                         es_err *err);
int es_rule_get_event(es_store *s, es_txn *t, const char *session, int64_t index, es_event *row,
                      es_err *err);
int es_rule_cmp_str_ptr(const void *a, const void *b);
int es_rule_check_batch(es_store *s, const es_new_event *evs, size_t n, es_err *err);
/* §3.1: events[i + 1].meta (len bytes) is a JSON object of at most
 * ES_MAX_META_BYTES: ES_OK, TOO_LARGE or INVALID_ARGUMENT naming the field. */
int es_rule_check_meta(const char *meta, size_t len, size_t i, es_err *err);
int es_rule_check_replay(es_store *s, es_txn *t, const char *session, const es_new_event *evs,
                         size_t n, int *replayed, es_events *out, es_err *err);
int es_rule_insert_events(es_store *s, es_txn *t, es_session_info *si, const es_new_event *evs,
                          size_t n, int64_t cause_index, int64_t cause_attempt, int64_t now,
                          const char *scope, es_events *out, es_err *err);
int es_rule_advance_lane(es_store *s, es_txn *t, const es_event *done, int64_t now, es_err *err);
int es_rule_check_writable(const es_session_info *si, int64_t fence, size_t n, es_err *err);
int es_rule_check_live(const es_session_info *si, int64_t after, int64_t through, es_err *err);
int es_rule_collected(int rc, const collector *c, es_err *err);
int es_rule_collect_event(void *ctx, const es_event *row);
int es_rule_revealed(es_store *s, es_txn *t, int rc, es_events *list, es_err *err);
int es_rule_collect_snapshot(void *ctx, const es_snapshot *row);

#endif
