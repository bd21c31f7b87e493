/*
 * dispatch.c: the rules of §3.2-§3.3 dispatch: claim, claim_next,
 * renew and release, complete, complete_many, fail, revive, settle, dead
 * letters and pending types.
 * Moved out of store.c as they were (store.c's top comment says how a
 * call runs).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "codec/json.h"
#include "store/backend.h"
#include "store/crypto.h"
#include "store/internal.h"
#include "store/rules.h"
#include "store/store.h"

/* --- claims --- */

/* Claims a ready row: a new attempt, owned by holder until expires. */
static int claim_row(es_store *s, es_txn *t, es_event *row, const char *holder, int64_t now,
                     int64_t expires, es_err *err) {
  char *h = strdup(holder);
  if (!h) return nomem(err);
  free(row->claim_holder);
  row->claim_holder = h;
  row->attempts++;
  if (row->first_claimed_at == ES_NONE) row->first_claimed_at = now;
  row->last_claimed_at = now;
  row->claim_expires_at = expires;
  row->retry_at = ES_NONE;
  row->due_at = expires; /* a live claim is ready again only when it expires */
  return s->ops->event_update(s->bk, t, row, err);
}

/* retry_at for claim / claim_next. A due time of INT64_MAX (a not_before or
 * claim end of math.maxinteger) is "never" and reported as none, the same
 * on every backend (the memory backend's search cannot report it). */
static int next_due(es_store *s, es_txn *t, const char *session, const char *scope, int64_t now,
                    int64_t *due, es_err *err) {
  int rc = s->ops->queued_next_due(s->bk, t, session, scope, now, due, err);
  if (rc == ES_OK && *due == INT64_MAX) *due = ES_NONE;
  return rc;
}

static int cmp_event_index(const void *a, const void *b) {
  const es_event *x = a, *y = b;
  return (x->index > y->index) - (x->index < y->index);
}

typedef struct {
  const char *session;
  const es_claim_opts *o;
  int64_t now;
  int64_t expires;  /* the claim's end: expires_at, or now + ttl_ms */
  int64_t limit;    /* o->limit, capped (cap_limit) */
  int outcome;
  es_events *out;
  int64_t retry_at;
} claim_args;

static int excluded(const es_claim_opts *o, int64_t index) {
  for (size_t i = 0; i < o->n_exclude; i++)
    if (o->exclude[i] == index) return 1;
  return 0;
}

static int do_claim(es_store *s, es_txn *t, void *arg, es_err *err) {
  claim_args *a = arg;
  es_session_info si;
  int rc = s->ops->session_get(s->bk, t, a->session, &si, err);
  a->retry_at = ES_NONE;
  if (rc == ES_NOT_FOUND) {
    a->outcome = ES_SETTLED;
    return ES_OK;
  }
  if (rc) return rc;
  /* Excluded rows come back too and are dropped here, so ask for that many
   * more than the limit. */
  int64_t want = a->limit == ES_NONE ? ES_NONE : cap_limit(a->limit + (int64_t)a->o->n_exclude);
  collector c = {a->out, 0};
  rc = es_rule_collected(
      s->ops->queued_due(s->bk, t, a->session, NULL, a->now, want, es_rule_collect_event, &c, err), &c,
      err);
  if (rc == ES_OK) {
    /* Drop exclusions, then index order (backends already give it), then the limit. */
    size_t k = 0;
    for (size_t i = 0; i < a->out->n; i++) {
      if (excluded(a->o, a->out->v[i].index)) {
        es_event_destroy(&a->out->v[i]);
      } else {
        a->out->v[k++] = a->out->v[i];
      }
    }
    a->out->n = k;
    if (k > 1) qsort(a->out->v, k, sizeof *a->out->v, cmp_event_index);
    if (a->limit != ES_NONE && (int64_t)k > a->limit) {
      for (size_t i = (size_t)a->limit; i < k; i++) es_event_destroy(&a->out->v[i]);
      a->out->n = (size_t)a->limit;
    }
  }
  for (size_t i = 0; rc == ES_OK && i < a->out->n; i++)
    rc = claim_row(s, t, &a->out->v[i], a->o->holder, a->now, a->expires, err);
  rc = es_rule_revealed(s, t, rc, a->out, err);
  if (rc == ES_OK && a->out->n > 0) {
    a->outcome = ES_CLAIMED;
    si.attempts += (int64_t)a->out->n;
    si.updated_at = a->now;
    rc = s->ops->session_put(s->bk, t, &si, err);
  } else if (rc == ES_OK) {
    a->outcome = si.pending > 0 ? ES_BUSY : ES_SETTLED;
    if (si.pending > 0) rc = next_due(s, t, a->session, NULL, a->now, &a->retry_at, err);
  }
  es_session_info_destroy(&si);
  return rc;
}

static int check_claim_opts(const es_claim_opts *o, es_err *err) {
  int rc = es_check_name("holder", o->holder, err);
  if (rc) return rc;
  if (o->expires_at == ES_NONE && o->ttl_ms <= 0)
    return es_fail(err, ES_INVALID_ARGUMENT, "ttl_ms must be > 0 (or give expires_at)");
  if ((rc = check_nonneg("expires_at", o->expires_at, err))) return rc;
  if (o->limit != ES_NONE && o->limit < 1)
    return es_fail(err, ES_INVALID_ARGUMENT, "limit must be >= 1 (omit it for no limit)");
  return ES_OK;
}

int es_core_claim(es_store *s, const char *session, const es_claim_opts *o, int *outcome,
                  es_events *out, int64_t *retry_at, es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  *retry_at = ES_NONE;
  if ((rc = es_check_name("session", session, err)) || (rc = check_claim_opts(o, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  claim_args a = {session, o, 0, o->expires_at, cap_limit(o->limit), 0, out, ES_NONE};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK && o->expires_at == ES_NONE && add_time(a.now, o->ttl_ms, &a.expires))
    rc = too_late(err, "ttl_ms");
  if (rc == ES_OK) rc = es_core_write(s, do_claim, &a, err);
  es_core_leave(s);
  if (rc) {
    es_events_destroy(out);
    return rc;
  }
  *outcome = a.outcome;
  *retry_at = a.retry_at;
  return ES_OK;
}

typedef struct {
  const char *holder;
  int64_t expires, limit, now;
  const char **types;  /* NULL: every type; else n_types distinct names */
  size_t n_types;
  const char *const *skip; /* sessions not to claim from (borrowed) */
  size_t n_skip;
  es_events *out;
  int64_t retry_at;
  const char *scope;  /* §3.11: a tenant's prefix, or NULL */
  int claim_txn;      /* running in a claim transaction (ops->claim_begin) */
  int64_t ttl_ms;     /* a retried claim transaction takes now and expires again */
} claim_next_args;

/* With sessions to skip, ready rows are read without a backend limit and
 * es_rule_collected until `want` rows of other sessions are in: the backends'
 * iterations are lazy, so the cost is the skipped rows plus the limit. */
typedef struct {
  collector c;
  const claim_next_args *a;
  int64_t want, got;
} skip_collector;

static int collect_unskipped(void *ctx, const es_event *row) {
  skip_collector *k = ctx;
  for (size_t i = 0; i < k->a->n_skip; i++)
    if (strcmp(k->a->skip[i], row->session) == 0) return 0;
  if (es_rule_collect_event(&k->c, row)) return 1;
  return ++k->got >= k->want;
}

/* Ready rows (of one type, or of every type when type is NULL), earliest
 * first, at most a->limit of sessions not skipped, appended to a->out. In
 * a claim transaction (a->claim_txn) the backend passes over the skipped
 * sessions itself and locks the rows it returns: asking without a limit
 * would lock every ready row. */
static int ready_rows(es_store *s, es_txn *t, claim_next_args *a, const char *type, es_err *err) {
  skip_collector k = {{a->out, 0}, a, a->limit, 0};
  int filter = a->n_skip && !a->claim_txn;
  int64_t limit = filter ? ES_NONE : a->limit;
  es_event_cb cb = filter ? collect_unskipped : es_rule_collect_event;
  void *ctx = filter ? (void *)&k : (void *)&k.c;
  int rc = type ? s->ops->queued_due_type(s->bk, t, a->scope, type, a->now, limit, cb, ctx, err)
                : s->ops->queued_due(s->bk, t, NULL, a->scope, a->now, limit, cb, ctx, err);
  return es_rule_collected(rc, &k.c, err);
}

/* The contract's claim order: the time it became ready, then position. */
static int cmp_event_ready(const void *x, const void *y) {
  const es_event *a = x, *b = y;
  if (a->due_at != b->due_at) return a->due_at < b->due_at ? -1 : 1;
  return (a->position > b->position) - (a->position < b->position);
}

/* The ready rows of the listed types, earliest first, at most a->limit:
 * each type's index gives its own earliest ones, the merge keeps the
 * earliest overall. Rows of types not listed are never looked at. */
static int ready_of_types(es_store *s, es_txn *t, claim_next_args *a, es_err *err) {
  int rc = ES_OK;
  for (size_t i = 0; rc == ES_OK && i < a->n_types; i++) rc = ready_rows(s, t, a, a->types[i], err);
  if (rc) return rc;
  if (a->out->n > 1) qsort(a->out->v, a->out->n, sizeof *a->out->v, cmp_event_ready);
  if (a->limit != ES_NONE && (int64_t)a->out->n > a->limit) {
    for (size_t i = (size_t)a->limit; i < a->out->n; i++) es_event_destroy(&a->out->v[i]);
    a->out->n = (size_t)a->limit;
  }
  return ES_OK;
}

/* retry_at limited to the listed types: the least of each type's next due
 * time. */
static int next_due_of_types(es_store *s, es_txn *t, const claim_next_args *a, int64_t *due,
                             es_err *err) {
  *due = ES_NONE;
  for (size_t i = 0; i < a->n_types; i++) {
    int64_t d;
    int rc = s->ops->queued_next_due_type(s->bk, t, a->scope, a->types[i], a->now, &d, err);
    if (rc) return rc;
    if (d != ES_NONE && (*due == ES_NONE || d < *due)) *due = d;
  }
  if (*due == INT64_MAX) *due = ES_NONE;  /* "never", as next_due says */
  return ES_OK;
}

static int cmp_event_ptr_session(const void *x, const void *y) {
  const es_event *const *a = x, *const *b = y;
  return strcmp((*a)->session, (*b)->session);
}

/* do_claim_next in a claim transaction (ops->claim_begin): the ready rows
 * come locked; their sessions are locked in byte order of the names, the
 * same order in every claim transaction, so two of them never wait for
 * each other in a cycle (docs/postgres.md "Concurrency"). Each session row
 * is read (locked) before its rows are claimed and written once. The rows
 * are handed out in claim order, as do_claim_next's. */
/* The ready rows and retry_at with ops->claim_ready: each type's rows and
 * next due time in one step. retry_at is then asked before the rows are
 * claimed, so the claims' end (the due time claim_row gives them) is
 * added to it here: the same answer as asking afterwards. */
static int claim_ready_rows(es_store *s, es_txn *t, claim_next_args *a, int64_t *next,
                            es_err *err) {
  int rc = ES_OK;
  *next = ES_NONE;
  for (size_t i = 0; rc == ES_OK && i < (a->types ? a->n_types : 1); i++) {
    collector c = {a->out, 0};
    int64_t d = ES_NONE;
    rc = es_rule_collected(s->ops->claim_ready(s->bk, t, a->scope, a->types ? a->types[i] : NULL, a->now,
                                       a->limit, es_rule_collect_event, &c, &d, err),
                   &c, err);
    if (rc == ES_OK && d != ES_NONE && (*next == ES_NONE || d < *next)) *next = d;
  }
  if (rc) return rc;
  if (a->types && a->out->n > 1) qsort(a->out->v, a->out->n, sizeof *a->out->v, cmp_event_ready);
  if (a->limit != ES_NONE && (int64_t)a->out->n > a->limit) {
    for (size_t i = (size_t)a->limit; i < a->out->n; i++) es_event_destroy(&a->out->v[i]);
    a->out->n = (size_t)a->limit;
  }
  if (a->out->n > 0 && (*next == ES_NONE || a->expires < *next)) *next = a->expires;
  if (*next == INT64_MAX) *next = ES_NONE;  /* "never", as next_due says */
  return ES_OK;
}

static int do_claim_next_locked(es_store *s, es_txn *t, claim_next_args *a, es_err *err) {
  int64_t early_next = ES_NONE;
  int early = s->ops->claim_ready != NULL;
  int rc = early     ? claim_ready_rows(s, t, a, &early_next, err)
           : a->types ? ready_of_types(s, t, a, err)
                      : ready_rows(s, t, a, NULL, err);
  size_t n = rc == ES_OK ? a->out->n : 0;
  es_event **by = n ? malloc(n * sizeof *by) : NULL; /* the rows of out, by session */
  if (n && !by) rc = nomem(err);
  if (rc == ES_OK && n) {
    for (size_t i = 0; i < n; i++) by[i] = &a->out->v[i];
    qsort(by, n, sizeof *by, cmp_event_ptr_session);
  }
  for (size_t i = 0; rc == ES_OK && i < n;) {
    size_t j = i;
    while (j < n && strcmp(by[j]->session, by[i]->session) == 0) j++;
    if (s->ops->session_claimed) {
      rc = s->ops->session_claimed(s->bk, t, by[i]->session, (int64_t)(j - i), a->now, err);
      for (size_t k = i; rc == ES_OK && k < j; k++)
        rc = claim_row(s, t, by[k], a->holder, a->now, a->expires, err);
      i = j;
      continue;
    }
    es_session_info si;
    rc = s->ops->session_get(s->bk, t, by[i]->session, &si, err);
    if (rc == ES_NOT_FOUND)
      rc = es_fail(err, ES_STORAGE, "claim_next: session '%s' has ready events but no row",
                   by[i]->session);
    if (rc) break;
    for (size_t k = i; rc == ES_OK && k < j; k++)
      rc = claim_row(s, t, by[k], a->holder, a->now, a->expires, err);
    if (rc == ES_OK) {
      si.attempts += (int64_t)(j - i);
      si.updated_at = a->now;
      rc = s->ops->session_put(s->bk, t, &si, err);
    }
    es_session_info_destroy(&si);
    i = j;
  }
  free(by);
  rc = es_rule_revealed(s, t, rc, a->out, err);
  if (rc == ES_OK && early) a->retry_at = early_next;
  else if (rc == ES_OK)
    rc = a->types ? next_due_of_types(s, t, a, &a->retry_at, err)
                  : next_due(s, t, NULL, a->scope, a->now, &a->retry_at, err);
  return rc;
}

/* claim_next in the write transaction: do_claim_next_locked serves both
 * kinds (without a claim transaction its ready rows come from
 * ready_rows's filtering path), so a batch of claims reads and writes each
 * session row once, not once per claimed event. */
static int do_claim_next(es_store *s, es_txn *t, void *arg, es_err *err) {
  return do_claim_next_locked(s, t, arg, err);
}

/* claim_next on a backend that can commit lazily (ops->lazy_begin: SQLite;
 * docs/sqlite.md "Claims and power loss"): a claim that finds no group
 * transaction open runs in one of its own whose commit is not synced, and
 * nobody joins it (the write lock is held throughout), so no other
 * caller's work is ever committed unsynced. The next synced commit (a
 * completion, a failure, any write) makes it durable with everything
 * before it. When a group is open the claim joins it as every write does:
 * that commit is synced anyway. */
static int claim_write(es_store *s, claim_next_args *a, es_err *err) {
  if (!s->ops->lazy_begin) return es_core_write(s, do_claim_next, a, err);
  pthread_mutex_lock(&s->wmu);
  if (s->wtxn) {
    pthread_mutex_unlock(&s->wmu);
    return es_core_write(s, do_claim_next, a, err);
  }
  /* A backend that cannot go lazy now commits durably, which is safe. */
  int lazy = s->ops->lazy_begin(s->bk) == ES_OK;
  es_txn *t = NULL;
  int rc = s->ops->write_begin(s->bk, &t, err);
  if (rc == ES_OK) {
    rc = do_claim_next(s, t, a, err);
    if (rc == ES_OK)
      rc = s->ops->write_commit(s->bk, t, err);
    else
      s->ops->write_rollback(s->bk, t);
  }
  if (lazy) s->ops->lazy_end(s->bk);
  pthread_mutex_unlock(&s->wmu);
  if (rc == ES_OK) es_core_notify_commit(s, 0); /* claims add and drop no event */
  return rc;
}

#define CLAIM_TRIES 20 /* claim transactions run before giving up on lock contention */

/* claim_next on a backend with claim transactions: one of its own,
 * committed before the call returns, outside the group commit. A claim
 * that lost on lock contention did nothing: it runs again after a short,
 * growing, jittered pause, up to CLAIM_TRIES times. */
static int claim_next_own_txn(es_store *s, claim_next_args *a, es_err *err) {
  int rc = ES_OK;
  a->claim_txn = 1;
  for (int attempt = 1; attempt <= CLAIM_TRIES; attempt++) {
    es_txn *t = NULL;
    if ((rc = s->ops->claim_begin(s->bk, a->skip, a->n_skip, &t, err))) return rc;
    rc = do_claim_next_locked(s, t, a, err);
    int again = 0;
    if (rc == ES_OK && !s->ops->claim_commit) return s->ops->write_commit(s->bk, t, err);
    if (rc == ES_OK) {
      /* the commit may be where a lost lock wait is learnt of */
      if ((rc = s->ops->claim_commit(s->bk, t, &again, err)) == ES_OK) return ES_OK;
    } else {
      again = s->ops->claim_retry && s->ops->claim_retry(s->bk, t);
      s->ops->write_rollback(s->bk, t);
    }
    es_events_destroy(a->out);
    memset(a->out, 0, sizeof *a->out);
    a->retry_at = ES_NONE;
    if (!again) return rc;
    /* 1..2^attempt ms (at most 128 ms), so the claims that collided do
     * not collide again in step */
    unsigned r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) r = (unsigned)attempt;
    int64_t ms = 1 + (int64_t)(r % (1u << (attempt < 7 ? attempt : 7)));
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    /* The claims of the next try start now: after many tries, the time of
     * the first would hand out claims already near their end. */
    if ((rc = es_store_now(s, &a->now, err))) return rc;
    if (add_time(a->now, a->ttl_ms, &a->expires)) return too_late(err, "ttl_ms");
  }
  char last[ES_ERRMSG_MAX];
  snprintf(last, sizeof last, "%s", err ? err->msg : "");
  return es_fail(err, ES_STORAGE, "claim_next: gave up after %d tries on lock contention: %s",
                 CLAIM_TRIES, last);
}

/* Checks claim_next's types and returns them sorted without duplicates in
 * *out (malloc'd, the strings borrowed; NULL when n is 0), so each type's
 * index is asked once. */
static int claim_types(const char *const *types, size_t n, const char ***out, size_t *n_out,
                       es_err *err) {
  *out = NULL;
  *n_out = 0;
  if (n > ES_MAX_CLAIM_TYPES)
    return es_fail(err, ES_INVALID_ARGUMENT, "types: %zu names, more than the %d allowed", n,
                   ES_MAX_CLAIM_TYPES);
  for (size_t i = 0; i < n; i++) {
    char what[32];
    snprintf(what, sizeof what, "types[%zu]", i + 1);
    int rc = es_check_name(what, types[i], err);
    if (rc) return rc;
  }
  if (n == 0) return ES_OK;
  const char **v = malloc(n * sizeof *v);
  if (!v) return nomem(err);
  memcpy(v, types, n * sizeof *v);
  qsort(v, n, sizeof *v, es_rule_cmp_str_ptr);
  size_t k = 1;
  for (size_t i = 1; i < n; i++)
    if (strcmp(v[i], v[k - 1]) != 0) v[k++] = v[i];
  *out = v;
  *n_out = k;
  return ES_OK;
}

int es_core_claim_next(es_store *s, const char *scope, const char *holder, int64_t ttl_ms,
                       int64_t limit, const char *const *types, size_t n_types,
                       const char *const *skip, size_t n_skip, es_events *out, int64_t *retry_at,
                       es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  *retry_at = ES_NONE;
  es_claim_opts o = {.holder = holder, .ttl_ms = ttl_ms, .expires_at = ES_NONE, .limit = limit};
  if ((rc = check_claim_opts(&o, err))) return rc;
  const char **tv = NULL;
  size_t tn = 0;
  if (types && (rc = claim_types(types, n_types, &tv, &tn, err))) return rc;
  if (limit == ES_NONE) limit = 1;
  if ((rc = es_core_enter(s, err))) {
    free(tv);
    return rc;
  }
  claim_next_args a = {holder, 0, cap_limit(limit), 0, tv, tn, skip, skip ? n_skip : 0, out,
                       ES_NONE, scope, 0, ttl_ms};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK && add_time(a.now, ttl_ms, &a.expires)) rc = too_late(err, "ttl_ms");
  /* An empty list of types (an engine without handlers) claims nothing and
   * waits for nothing. */
  if (rc == ES_OK && !(types && tn == 0))
    rc = s->ops->claim_begin ? claim_next_own_txn(s, &a, err) : claim_write(s, &a, err);
  es_core_leave(s);
  free(tv);
  if (rc) {
    es_events_destroy(out);
    return rc;
  }
  *retry_at = a.retry_at;
  return ES_OK;
}

/* renew and release (claims taken and never started) share one walk over
 * the caller's claims: a claim the holder no longer owns is reported
 * superseded, one of another holder is left alone, and each of the
 * holder's own is renewed (release 0) or undone (release 1). */
typedef struct {
  const char *session, *holder;
  const es_claim_ref *claims;
  size_t n;
  int64_t expires, now;
  int release;
  es_renew_result *out;
} claims_args;

/* As if the claim had never been made: the attempt number goes back (the
 * next claim takes it again: the attempts of an event stay the ones that
 * ran or may have run), so it counts neither as a failure nor as an
 * attempt that never finished. */
static int release_row(es_store *s, es_txn *t, claims_args *a, es_event *row, es_err *err) {
  es_session_info si;
  int rc = es_rule_load_session(s, t, a->session, &si, err);
  if (rc) return rc;
  free(row->claim_holder);
  row->claim_holder = NULL;
  row->claim_expires_at = ES_NONE;
  row->attempts--;
  if (row->attempts == 0) row->first_claimed_at = ES_NONE;
  row->due_at = es_rule_due_of(row, a->now);
  rc = s->ops->event_update(s->bk, t, row, err);
  if (rc == ES_OK) {
    si.attempts--;
    si.updated_at = a->now;
    rc = s->ops->session_put(s->bk, t, &si, err);
  }
  es_session_info_destroy(&si);
  return rc;
}

static int do_claims(es_store *s, es_txn *t, void *arg, es_err *err) {
  claims_args *a = arg;
  int rc = ES_OK;
  a->out->n_renewed = a->out->n_superseded = 0;
  for (size_t i = 0; i < a->n && rc == ES_OK; i++) {
    es_event row;
    rc = s->ops->event_get(s->bk, t, a->session, a->claims[i].index, &row, err);
    if (rc == ES_NOT_FOUND) {
      rc = ES_OK;
      continue;
    }
    if (rc) break;
    if (!es_rule_owns(&row, a->claims[i].attempt)) {
      a->out->superseded[a->out->n_superseded++] = row.index;
    } else if (strcmp(row.claim_holder, a->holder) == 0) {
      if (a->release) {
        rc = release_row(s, t, a, &row, err);
      } else {
        row.claim_expires_at = row.due_at = a->expires;
        rc = s->ops->event_update(s->bk, t, &row, err);
      }
      if (rc == ES_OK) a->out->renewed[a->out->n_renewed++] = row.index;
    }
    es_event_destroy(&row);
  }
  return rc;
}

/* The checks and the transaction of renew and release_claims (a->out set,
 * the rest of a filled in by the caller except now and, for renew with
 * expires_at ES_NONE, expires). */
static int claims_call(es_store *s, claims_args *a, int64_t ttl_ms, es_err *err) {
  int rc;
  memset(a->out, 0, sizeof *a->out);
  if ((rc = es_check_name("session", a->session, err)) ||
      (rc = es_check_name("holder", a->holder, err)))
    return rc;
  if (!a->release) {
    if (a->expires == ES_NONE && ttl_ms <= 0)
      return es_fail(err, ES_INVALID_ARGUMENT, "ttl_ms must be > 0 (or give expires_at)");
    if ((rc = check_nonneg("expires_at", a->expires, err))) return rc;
  }
  size_t room = a->n ? a->n : 1;
  a->out->renewed = malloc(room * sizeof *a->out->renewed);
  a->out->superseded = malloc(room * sizeof *a->out->superseded);
  if (!a->out->renewed || !a->out->superseded) {
    es_renew_result_destroy(a->out);
    return nomem(err);
  }
  if ((rc = es_core_enter(s, err))) {
    es_renew_result_destroy(a->out);
    return rc;
  }
  rc = es_store_now(s, &a->now, err);
  if (rc == ES_OK && !a->release && a->expires == ES_NONE && add_time(a->now, ttl_ms, &a->expires))
    rc = too_late(err, "ttl_ms");
  if (rc == ES_OK) rc = es_core_write(s, do_claims, a, err);
  es_core_leave(s);
  if (rc) es_renew_result_destroy(a->out);
  return rc;
}

int es_core_renew(es_store *s, const char *session, const char *holder, const es_claim_ref *claims,
                  size_t n, int64_t ttl_ms, int64_t expires_at, es_renew_result *out, es_err *err) {
  claims_args a = {session, holder, claims, n, expires_at, 0, 0, out};
  return claims_call(s, &a, ttl_ms, err);
}

int es_core_release_claims(es_store *s, const char *session, const char *holder,
                           const es_claim_ref *claims, size_t n, es_renew_result *out,
                           es_err *err) {
  claims_args a = {session, holder, claims, n, ES_NONE, 0, 1, out};
  return claims_call(s, &a, 0, err);
}

/* --- complete --- */

typedef struct {
  const char *session;
  int64_t index, attempt;
  const es_new_event *evs;
  size_t n;
  int64_t fence;
  int64_t now;
  int outcome;
  es_events *out;
  const char *scope;  /* §3.11: the tenant prefix of generated ids, or NULL */
  es_cancel *cancel;  /* §3.2 complete{cancel}, answered in place */
  size_t n_cancel;
} complete_args;

/* §3.2 the completion's cancels, in its step: an index no longer
 * cancellable is answered not cancelled and fails nothing; only a
 * storage error fails the completion. */
static int complete_cancels(es_store *s, es_txn *t, complete_args *a, es_session_info *si,
                            es_err *err) {
  for (size_t i = 0; i < a->n_cancel; i++) {
    es_err why = {0};
    int rc = es_rule_cancel(s, t, si, a->cancel[i].index, a->cancel[i].reason, a->now, NULL, &why);
    a->cancel[i].cancelled = rc == ES_OK;
    if (rc == ES_STORAGE || rc == ES_CLOSED) {
      if (err) *err = why;
      return rc;
    }
  }
  return ES_OK;
}

/* A repeated complete() of the attempt that completed the event: the same
 * ids return the same events; anything else is PARTIAL_DUPLICATE_BATCH. */
static int complete_replay(es_store *s, es_txn *t, complete_args *a, const es_event *parent,
                           es_err *err) {
  int replayed = 0;
  int rc = ES_OK;
  if ((int64_t)a->n == parent->returned) {
    if (a->n == 0) replayed = 1;
    else rc = es_rule_check_replay(s, t, a->session, a->evs, a->n, &replayed, a->out, err);
  }
  for (size_t i = 0; rc == ES_OK && replayed && i < a->out->n; i++) {
    if (a->out->v[i].cause_index != a->index || a->out->v[i].cause_attempt != a->attempt)
      replayed = 0;
  }
  if (rc == ES_ID_CONFLICT || rc == ES_STORAGE) return rc;
  if (rc != ES_OK || !replayed) {
    es_events_destroy(a->out);
    return es_fail(err, ES_PARTIAL_DUPLICATE_BATCH,
                   "attempt %lld already completed event %lld with a different batch",
                   (long long)a->attempt, (long long)a->index);
  }
  a->outcome = ES_COMPLETED;
  return ES_OK;
}

/* do_complete's common case in one step, where the backend has one
 * (event_complete): a completion without cancels or fence, by the attempt
 * that owns an event without a lane. What do_complete would check and
 * write, without reading the row first: the session is read first (a
 * shard move's marks are checked there, before anything is written), the
 * backend's update checks what es_rule_owns does, then the returned
 * events are inserted and the session's row is written as below.
 *
 * Returned events are taken only where do_complete would take them: a
 * session that is not sealed, and ids none of which is stored (checked
 * before the update). Otherwise do_complete answers, as it does, with
 * what comes first there (a superseded attempt's outcome before SEALED or
 * a duplicate id). *done = 0 when nothing was written and do_complete
 * goes on (no such row, superseded, a lost acknowledgement's replay, a
 * lane to move on, the cases above). */
static int complete_owned(es_store *s, es_txn *t, complete_args *a, int *done, es_err *err) {
  *done = 0;
  es_session_info si;
  int rc = es_rule_load_session(s, t, a->session, &si, err);
  if (rc) return rc; /* si holds nothing */
  if (a->n > 0) {
    int replayed = 0;
    if (si.sealed_at != ES_NONE ||
        es_rule_check_replay(s, t, a->session, a->evs, a->n, &replayed, a->out, err) != ES_OK ||
        replayed) {
      es_events_destroy(a->out);
      es_session_info_destroy(&si);
      return ES_OK;
    }
  }
  rc = s->ops->event_complete(s->bk, t, a->session, a->index, a->attempt, (int64_t)a->n, a->now,
                              done, err);
  if (rc == ES_OK && *done && a->n > 0)
    rc = es_rule_insert_events(s, t, &si, a->evs, a->n, a->index, a->attempt, a->now, a->scope,
                               a->out, err);
  if (rc == ES_OK && *done) {
    si.pending--;
    si.updated_at = a->now;
    rc = s->ops->session_put(s->bk, t, &si, err);
    if (rc == ES_OK) a->outcome = ES_COMPLETED;
  }
  es_session_info_destroy(&si);
  return rc;
}

static int do_complete(es_store *s, es_txn *t, void *arg, es_err *err) {
  complete_args *a = arg;
  if (s->ops->event_complete && a->n_cancel == 0 && a->fence == ES_NONE) {
    int done;
    int rc = complete_owned(s, t, a, &done, err);
    if (rc || done) return rc;
  }
  es_event parent;
  int rc = es_rule_get_event(s, t, a->session, a->index, &parent, err);
  if (rc) return rc;
  if (parent.status == ES_STATUS_PROCESSED && parent.returned >= 0 &&
      parent.attempts == a->attempt) {
    rc = complete_replay(s, t, a, &parent, err);
    es_event_destroy(&parent);
    return rc;
  }
  es_session_info si;
  if ((rc = es_rule_load_session(s, t, a->session, &si, err))) {
    es_event_destroy(&parent);
    return rc;
  }
  /* A fenced-out writer learns it even when its attempt was also
   * superseded: STALE_FENCE says stop, SUPERSEDED only "not this one". */
  if (a->fence != ES_NONE) rc = es_rule_check_writable(&si, a->fence, 0, err);
  if (rc == ES_OK && !es_rule_owns(&parent, a->attempt)) {
    a->outcome = ES_SUPERSEDED;
    es_session_info_destroy(&si);
    es_event_destroy(&parent);
    return ES_OK;
  }
  if (rc == ES_OK) rc = es_rule_check_writable(&si, ES_NONE, a->n, err);
  int replayed = 0;
  if (rc == ES_OK) rc = es_rule_check_replay(s, t, a->session, a->evs, a->n, &replayed, a->out, err);
  if (rc == ES_OK && replayed) {
    es_events_destroy(a->out);
    rc = es_fail(err, ES_PARTIAL_DUPLICATE_BATCH, "the returned events' ids are already stored");
  }
  if (rc == ES_OK)
    rc = es_rule_insert_events(s, t, &si, a->evs, a->n, a->index, a->attempt, a->now, a->scope, a->out,
                       err);
  if (rc == ES_OK) {
    free(parent.claim_holder);
    es_event_complete_record(&parent, a->now, a->attempt, (int64_t)a->n);
    rc = s->ops->event_update(s->bk, t, &parent, err);
  }
  if (rc == ES_OK) rc = es_rule_advance_lane(s, t, &parent, a->now, err);
  if (rc == ES_OK) si.pending--; /* before the cancels, which count their own */
  if (rc == ES_OK) rc = complete_cancels(s, t, a, &si, err);
  if (rc == ES_OK) {
    si.updated_at = a->now;
    rc = s->ops->session_put(s->bk, t, &si, err);
  }
  if (rc == ES_OK) a->outcome = ES_COMPLETED;
  es_session_info_destroy(&si);
  es_event_destroy(&parent);
  return rc;
}

int es_core_complete_cancel(es_store *s, const char *scope, es_completion *c, es_events *out,
                            es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = es_check_name("session", c->session, err)) ||
      (rc = es_rule_check_batch(s, c->evs, c->n, err)))
    return rc;
  if (c->fence != ES_NONE && c->fence < 1) return es_fail(err, ES_INVALID_ARGUMENT, "fence must be >= 1");
  if (c->n_cancel > s->max_batch)
    return es_fail(err, ES_TOO_LARGE, "%zu events to cancel, over the limit of %zu", c->n_cancel,
                   s->max_batch);
  if ((rc = es_core_enter(s, err))) return rc;
  complete_args a = {c->session, c->index, c->attempt, c->evs, c->n, c->fence, 0, 0, out, scope,
                     c->cancel, c->n_cancel};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK) rc = es_core_write(s, do_complete, &a, err);
  es_core_leave(s);
  if (rc || a.outcome != ES_COMPLETED) es_events_destroy(out);
  c->outcome = rc ? 0 : a.outcome;
  return rc;
}

/* complete is complete_cancel without cancels */
int es_core_complete(es_store *s, const char *scope, const char *session, int64_t index,
                     int64_t attempt, const es_new_event *evs, size_t n, int64_t fence,
                     int *outcome, es_events *out, es_err *err) {
  es_completion c = {.session = session, .index = index, .attempt = attempt, .evs = evs, .n = n,
                     .fence = fence};
  int rc = es_core_complete_cancel(s, scope, &c, out, err);
  if (rc == ES_OK) *outcome = c.outcome;
  return rc;
}

/* --- complete_many: several completions, one transaction --- */

typedef struct {
  es_completion *v;
  size_t n;
  int64_t now;
} complete_many_args;

/* Does completion c need a savepoint of its own in complete_many? Every
 * error do_complete can meet before its first write is an answer, and
 * after it only STORAGE, which fails the whole call (the transaction is
 * rolled back: every item is then STORAGE, to be tried again), as long as
 * its events are inserted without a step that can refuse one of them
 * halfway: an event with a key is sealed (the key may be refused), one
 * without an id may be given one by the store's id source (which may
 * fail). Only such items need a savepoint, so that one failing halfway
 * leaves nothing. */
static int completion_needs_savepoint(const es_completion *c) {
  if (c->n_cancel) return 1; /* a cancel may fail on storage after the completion's writes */
  for (size_t i = 0; i < c->n; i++)
    if (!c->evs[i].id || c->evs[i].key) return 1;
  return 0;
}

/* The most completions whose reads go ahead together (read_ahead). */
#define READ_AHEAD_MAX 64

/* Tells the backend what completions v[0..n) will read (read_ahead). */
static int complete_read_ahead(es_store *s, es_txn *t, const es_completion *v, size_t n,
                               es_err *err) {
  const char *sessions[READ_AHEAD_MAX];
  int64_t indexes[READ_AHEAD_MAX];
  size_t n_ids = 0;
  for (size_t i = 0; i < n; i++) {
    sessions[i] = v[i].session;
    indexes[i] = v[i].index;
    n_ids += v[i].n;
  }
  const char **ids = n_ids ? malloc(n_ids * sizeof *ids) : NULL;
  if (n_ids && !ids) return nomem(err);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < v[i].n; j++)
      if (v[i].evs[j].id) ids[k++] = v[i].evs[j].id;
  int rc = s->ops->read_ahead(s->bk, t, sessions, indexes, n, ids, k, err);
  free(ids);
  return rc;
}

/* Each completion as do_complete; an item's own error (NO_SUCH_EVENT,
 * STALE_FENCE, SEALED, PARTIAL_DUPLICATE_BATCH, ...) is its answer alone.
 * The reads of up to READ_AHEAD_MAX items go ahead together. */
static int do_complete_many(es_store *s, es_txn *t, void *arg, es_err *err) {
  complete_many_args *m = arg;
  for (size_t i = 0; i < m->n; i++) {
    es_completion *c = &m->v[i];
    if (s->ops->read_ahead && i % READ_AHEAD_MAX == 0) {
      size_t n = m->n - i < READ_AHEAD_MAX ? m->n - i : READ_AHEAD_MAX;
      int rc = complete_read_ahead(s, t, c, n, err);
      if (rc) {
        for (size_t j = i; j < m->n; j++) m->v[j].rc = rc, m->v[j].err = *err;
        return rc;
      }
    }
    es_events out;
    memset(&out, 0, sizeof out);
    complete_args a = {c->session, c->index, c->attempt, c->evs, c->n, c->fence, m->now, 0, &out,
                       NULL, c->cancel, c->n_cancel};
    memset(&c->err, 0, sizeof c->err);
    int own_sp = completion_needs_savepoint(c);
    int rc = own_sp ? s->ops->savepoint(s->bk, t, &c->err) : ES_OK;
    if (rc == ES_OK) {
      rc = do_complete(s, t, &a, &c->err);
      if (own_sp) {
        if (rc == ES_OK) rc = s->ops->savepoint_release(s->bk, t, &c->err);
        if (rc != ES_OK) s->ops->savepoint_rollback(s->bk, t);
      }
    }
    es_events_destroy(&out);
    c->rc = rc;
    c->outcome = rc == ES_OK ? a.outcome : 0;
    if (rc == ES_STORAGE) {
      *err = c->err;
      return rc;
    }
  }
  return ES_OK;
}

int es_core_complete_many(es_store *s, es_completion *v, size_t n, es_err *err) {
  int rc;
  for (size_t i = 0; i < n; i++) {
    es_completion *c = &v[i];
    if ((c->rc = es_check_name("session", c->session, &c->err)) ||
        (c->rc = es_rule_check_batch(s, c->evs, c->n, &c->err)))
      continue;
    if (c->fence != ES_NONE && c->fence < 1)
      c->rc = es_fail(&c->err, ES_INVALID_ARGUMENT, "fence must be >= 1");
    else if (c->n_cancel > s->max_batch) /* as es_core_complete_cancel */
      c->rc = es_fail(&c->err, ES_TOO_LARGE, "%zu events to cancel, over the limit of %zu",
                      c->n_cancel, s->max_batch);
  }
  /* the items that passed the checks, in order */
  es_completion *ok = n ? malloc(n * sizeof *ok) : NULL;
  size_t k = 0;
  if (n && !ok) return nomem(err);
  for (size_t i = 0; i < n; i++)
    if (v[i].rc == ES_OK) ok[k++] = v[i];
  if ((rc = es_core_enter(s, err))) {
    free(ok);
    return rc;
  }
  complete_many_args m = {ok, k, 0};
  rc = k ? es_store_now(s, &m.now, err) : ES_OK;
  if (rc == ES_OK && k) rc = es_core_write(s, do_complete_many, &m, err);
  es_core_leave(s);
  for (size_t i = 0, j = 0; i < n && j < k; i++) {
    if (v[i].rc != ES_OK) continue;
    v[i].rc = rc ? rc : ok[j].rc;
    v[i].outcome = rc ? 0 : ok[j].outcome;
    v[i].err = rc ? *err : ok[j].err;
    j++;
  }
  free(ok);
  return rc;
}

/* --- fail, revive, settle --- */

typedef struct {
  const char *session;
  int64_t index, attempt;
  const char *error;
  int64_t max_failures, retry_after_ms, now;
  int outcome;
  int64_t failures;
  int64_t retry_at;  /* now + retry_after_ms */
} fail_args;

static int do_fail(es_store *s, es_txn *t, void *arg, es_err *err) {
  fail_args *a = arg;
  es_event row;
  int rc = es_rule_get_event(s, t, a->session, a->index, &row, err);
  if (rc) return rc;
  a->failures = row.failures;
  if (row.status != ES_STATUS_PROCESSED && row.attempts == a->attempt &&
      row.last_failed_attempt == a->attempt && !row.claim_holder && row.failures > 0) {
    /* The same fail again: same outcome, counted once. (No failures left:
     * a revive reset them since, and the attempt is superseded below.) */
    a->outcome = row.status == ES_STATUS_DEAD ? ES_DEAD_LETTERED : ES_FAILED;
    es_event_destroy(&row);
    return ES_OK;
  }
  if (!es_rule_owns(&row, a->attempt)) {
    a->outcome = ES_SUPERSEDED;
    es_event_destroy(&row);
    return ES_OK;
  }
  es_session_info si;
  if ((rc = es_rule_load_session(s, t, a->session, &si, err))) {
    es_event_destroy(&row);
    return rc;
  }
  /* Stored text is always valid UTF-8 and bounded (es_text_clean), so every
   * reader (Lua, JSON output, the CLI) can show it. */
  char *msg = NULL;
  if (es_text_clean(a->error, strlen(a->error), ES_MAX_TEXT_BYTES, &msg, NULL)) rc = nomem(err);
  if (rc == ES_OK) {
    free(row.last_error);
    row.last_error = msg;
    free(row.claim_holder);
    row.claim_holder = NULL;
    row.claim_expires_at = ES_NONE;
    row.failures++;
    row.last_failed_attempt = a->attempt;
    row.failed_at = a->now;
    si.failures++;
    if (row.failures >= a->max_failures) {
      row.status = ES_STATUS_DEAD;
      row.queued = 0;
      row.due_at = ES_NONE;
      row.retry_at = ES_NONE;
      si.pending--;
      si.dead++;
      a->outcome = ES_DEAD_LETTERED;
    } else {
      row.retry_at = a->retry_after_ms > 0 ? a->retry_at : ES_NONE;
      row.due_at = es_rule_due_of(&row, a->now);
      a->outcome = ES_FAILED;
    }
    a->failures = row.failures;
    si.updated_at = a->now;
    rc = s->ops->event_update(s->bk, t, &row, err);
  }
  if (rc == ES_OK) rc = s->ops->session_put(s->bk, t, &si, err);
  es_session_info_destroy(&si);
  es_event_destroy(&row);
  return rc;
}

int es_core_fail(es_store *s, const char *session, int64_t index, int64_t attempt,
                 const char *error, int64_t max_failures, int64_t retry_after_ms, int *outcome,
                 int64_t *failures, es_err *err) {
  int rc;
  if ((rc = es_check_name("session", session, err))) return rc;
  if (!error) return es_fail(err, ES_INVALID_ARGUMENT, "error is required");
  if (max_failures < 1) return es_fail(err, ES_INVALID_ARGUMENT, "max_failures must be >= 1");
  if (retry_after_ms < 0) return es_fail(err, ES_INVALID_ARGUMENT, "retry_after_ms must be >= 0");
  if ((rc = es_core_enter(s, err))) return rc;
  fail_args a = {session, index, attempt, error, max_failures, retry_after_ms, 0, 0, 0, ES_NONE};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK && add_time(a.now, retry_after_ms, &a.retry_at))
    rc = too_late(err, "retry_after_ms");
  if (rc == ES_OK) rc = es_core_write(s, do_fail, &a, err);
  es_core_leave(s);
  if (rc) return rc;
  *outcome = a.outcome;
  *failures = a.failures;
  return ES_OK;
}

typedef struct {
  const char *session;
  int64_t index;
  const char *reason; /* settle */
  int revive;
  int64_t now;
} dead_args;

/* A settled dead letter's last_error: its last error (cleaned too: a file
 * written by an older version may hold any bytes), a newline, "settled: "
 * and the reason; within ES_MAX_TEXT_BYTES, the reason keeping at least
 * half of it so a long error cannot push the reason out. NULL: out of memory. */
static char *settle_text(const char *last_error, const char *reason) {
  static const char sep[] = "settled: ";
  char *why = NULL, *old = NULL, *msg = NULL;
  size_t nwhy = 0, nold = 0;
  if (es_text_clean(reason, strlen(reason), ES_MAX_TEXT_BYTES / 2, &why, &nwhy)) return NULL;
  size_t room = ES_MAX_TEXT_BYTES - nwhy - (sizeof sep - 1) - 1; /* - 1: the newline */
  if (last_error && es_text_clean(last_error, strlen(last_error), room, &old, &nold)) {
    free(why);
    return NULL;
  }
  size_t n = nold + (old ? 1 : 0) + (sizeof sep - 1) + nwhy + 1;
  msg = malloc(n);
  if (msg) snprintf(msg, n, "%s%s%s%s", old ? old : "", old ? "\n" : "", sep, why);
  free(why);
  free(old);
  return msg;
}

static int do_dead_change(es_store *s, es_txn *t, void *arg, es_err *err) {
  dead_args *a = arg;
  es_event row;
  int rc = es_rule_get_event(s, t, a->session, a->index, &row, err);
  if (rc) return rc;
  if (row.status != ES_STATUS_DEAD) {
    es_event_destroy(&row);
    return es_fail(err, ES_INVALID_ARGUMENT, "event %lld in session '%s' is not a dead letter",
                   (long long)a->index, a->session);
  }
  es_session_info si;
  if ((rc = es_rule_load_session(s, t, a->session, &si, err))) {
    es_event_destroy(&row);
    return rc;
  }
  si.dead--;
  si.updated_at = a->now;
  if (a->revive) {
    row.status = ES_STATUS_PENDING;
    row.failures = 0;
    /* Attempts up to now ended (the last one dead-lettered it): an engine
     * counting attempts that never ended (docs/engine.md) starts afresh. */
    row.last_failed_attempt = row.attempts;
    row.retry_at = ES_NONE;
    row.queued = 1; /* a dead letter was the head of its lane */
    row.due_at = es_rule_due_of(&row, a->now);
    si.pending++;
  } else {
    row.status = ES_STATUS_PROCESSED;
    row.processed_at = a->now;
    row.returned = -1;
    if (a->reason && *a->reason) {
      char *msg = settle_text(row.last_error, a->reason);
      if (!msg) rc = nomem(err);
      else {
        free(row.last_error);
        row.last_error = msg;
      }
    }
  }
  if (rc == ES_OK) rc = s->ops->event_update(s->bk, t, &row, err);
  if (rc == ES_OK && !a->revive) rc = es_rule_advance_lane(s, t, &row, a->now, err);
  if (rc == ES_OK) rc = s->ops->session_put(s->bk, t, &si, err);
  es_session_info_destroy(&si);
  es_event_destroy(&row);
  return rc;
}

static int dead_change(es_store *s, dead_args *a, es_err *err) {
  int rc;
  if ((rc = es_check_name("session", a->session, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  rc = es_store_now(s, &a->now, err);
  if (rc == ES_OK) rc = es_core_write(s, do_dead_change, a, err);
  es_core_leave(s);
  return rc;
}

int es_core_revive(es_store *s, const char *session, int64_t index, es_err *err) {
  dead_args a = {session, index, NULL, 1, 0};
  return dead_change(s, &a, err);
}

int es_core_settle(es_store *s, const char *session, int64_t index, const char *reason,
                   es_err *err) {
  dead_args a = {session, index, reason, 0, 0};
  return dead_change(s, &a, err);
}

/* --- cancel --- */

/* §3.2 cancels event `index` of si's session (si loaded by the caller,
 * counted here; the caller puts it): processed by no attempt
 * (processed_by_attempt 0, es_event_cancelled), the reason in last_error
 * (replacing an earlier failure's text: the record shows one of them).
 * Refuses, before writing anything, what is not cancellable; a cancelled
 * event is left as it is. *out (may be NULL) the event after. */
int es_rule_cancel(es_store *s, es_txn *t, es_session_info *si, int64_t index, const char *reason,
                   int64_t now, es_event *out, es_err *err) {
  es_event row;
  int rc = es_rule_get_event(s, t, si->session, index, &row, err);
  if (rc) return rc;
  const char *state = NULL;
  if (row.status == ES_STATUS_DEAD)
    state = "a dead letter (settle it instead)";
  else if (row.status == ES_STATUS_PROCESSED && !es_event_cancelled(&row))
    state = "processed";
  else if (row.status == ES_STATUS_PENDING && row.claim_holder && now < row.claim_expires_at)
    state = "claimed";
  if (state) {
    if (strcmp(state, "claimed") == 0)
      rc = es_fail(err, ES_INVALID_ARGUMENT,
                   "event %lld in session '%s' is claimed by '%s' until %lld: it cannot be "
                   "cancelled while its handler may run",
                   (long long)index, si->session, row.claim_holder, (long long)row.claim_expires_at);
    else
      rc = es_fail(err, ES_INVALID_ARGUMENT, "event %lld in session '%s' is %s: only a pending "
                   "event can be cancelled", (long long)index, si->session, state);
  } else if (row.status == ES_STATUS_PENDING) {
    char *why = NULL;
    size_t nwhy = 0;
    const char *r = reason && *reason ? reason : "cancelled";
    if (es_text_clean(r, strlen(r), ES_MAX_TEXT_BYTES, &why, &nwhy)) {
      rc = nomem(err);
    } else {
      int was_head = row.queued; /* a laned event behind its lane's head is not queued */
      free(row.last_error);
      row.last_error = why;
      row.status = ES_STATUS_PROCESSED;
      row.processed_at = now;
      row.processed_by_attempt = 0;
      row.returned = -1;
      row.retry_at = ES_NONE;
      row.queued = 0;
      si->pending--;
      si->updated_at = now;
      rc = s->ops->event_update(s->bk, t, &row, err);
      if (rc == ES_OK && was_head) rc = es_rule_advance_lane(s, t, &row, now, err);
    }
  }
  if (rc == ES_OK && out && es_event_copy(out, &row)) rc = nomem(err);
  es_event_destroy(&row);
  return rc;
}

typedef struct {
  const char *session;
  int64_t index;
  const char *reason;
  int64_t now;
  es_event *out;
} cancel_args;

static int do_cancel(es_store *s, es_txn *t, void *arg, es_err *err) {
  cancel_args *a = arg;
  es_session_info si;
  int rc = es_rule_load_session(s, t, a->session, &si, err);
  if (rc) return rc;
  int64_t pending = si.pending;
  rc = es_rule_cancel(s, t, &si, a->index, a->reason, a->now, a->out, err);
  if (rc == ES_OK && si.pending != pending) rc = s->ops->session_put(s->bk, t, &si, err);
  if (rc == ES_OK) rc = es_crypto_reveal(s, t, NULL, a->out, 1, err); /* §3.10 as every read */
  es_session_info_destroy(&si);
  return rc;
}

int es_core_cancel(es_store *s, const char *session, int64_t index, const char *reason,
                   es_event *out, es_err *err) {
  int rc;
  es_event unused;
  es_event_init(&unused);
  if ((rc = es_check_name("session", session, err))) return rc;
  if (index < 1) return es_fail(err, ES_INVALID_ARGUMENT, "index must be >= 1");
  if ((rc = es_core_enter(s, err))) return rc;
  cancel_args a = {session, index, reason, 0, out ? out : &unused};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK) rc = es_core_write(s, do_cancel, &a, err);
  es_core_leave(s);
  es_event_destroy(&unused);
  if (rc && out) es_event_destroy(out);
  return rc;
}

static int do_dead_list(es_store *s, es_txn *t, void *arg, es_err *err) {
  all_args *a = arg;
  collector c = {a->out, 0};
  int rc = es_rule_collected(
      s->ops->dead_list(s->bk, t, a->session, a->scope, a->after, a->limit, es_rule_collect_event, &c, err),
      &c, err);
  return es_rule_revealed(s, t, rc, a->out, err);
}

int es_core_dead_letters(es_store *s, const char *scope, const char *session, int64_t after,
                         int64_t limit, es_events *out, es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  if (session && (rc = es_check_name("session", session, err))) return rc;
  if ((rc = check_nonneg("after", after, err)) || (rc = check_nonneg("limit", limit, err))) return rc;
  if (limit == 0) return ES_OK;
  if ((rc = es_core_enter(s, err))) return rc;
  all_args a = {after == ES_NONE ? 0 : after, cap_limit(limit), session, out,
                session ? NULL : scope};
  rc = es_core_read(s, do_dead_list, &a, err);
  es_core_leave(s);
  if (rc) es_events_destroy(out);
  return rc;
}

/* --- pending events by type --- */

typedef struct {
  es_type_counts *out;
  size_t cap;
  int oom;
  const char *scope;  /* §3.11: a tenant's prefix, or NULL */
} type_counts_args;

static int collect_type_count(void *ctx, const char *type, int64_t pending) {
  type_counts_args *a = ctx;
  char *copy = strdup(type);
  if (!copy || es_grow((void **)&a->out->v, &a->cap, a->out->n + 1, sizeof *a->out->v) != ES_OK) {
    free(copy);
    a->oom = 1;
    return 1;
  }
  a->out->v[a->out->n].type = copy;
  a->out->v[a->out->n++].pending = pending;
  return 0;
}

static int do_pending_types(es_store *s, es_txn *t, void *arg, es_err *err) {
  type_counts_args *a = arg;
  int rc = s->ops->pending_types(s->bk, t, a->scope, collect_type_count, a, err);
  return rc == ES_OK && a->oom ? nomem(err) : rc;
}

void es_type_counts_destroy(es_type_counts *list) {
  if (!list) return;
  for (size_t i = 0; i < list->n; i++) free(list->v[i].type);
  free(list->v);
  list->v = NULL;
  list->n = 0;
}

int es_core_pending_types(es_store *s, const char *scope, es_type_counts *out, es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = es_core_enter(s, err))) return rc;
  type_counts_args a = {out, 0, 0, scope};
  rc = es_core_read(s, do_pending_types, &a, err);
  es_core_leave(s);
  if (rc) es_type_counts_destroy(out);
  return rc;
}
