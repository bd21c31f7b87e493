/*
 * snapshots.c: the rules of §3.4 snapshots (read_state, read_states,
 * put_snapshot, snapshots) and §3.5 inspection (sessions).
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

/* --- snapshots --- */

typedef struct {
  const char *session, *reducer;
  int *found;
  es_snapshot *snap;
  es_events *events;
} state_args;

static int do_read_state(es_store *s, es_txn *t, void *arg, es_err *err) {
  state_args *a = arg;
  int rc = s->ops->snapshot_get(s->bk, t, a->session, a->reducer, a->snap, err);
  *a->found = rc == ES_OK;
  if (rc == ES_NOT_FOUND) rc = ES_OK;
  if (rc) return rc;
  int64_t after = *a->found ? a->snap->index : 0;
  es_session_info si;
  rc = s->ops->session_get(s->bk, t, a->session, &si, err);
  if (rc == ES_OK) {
    rc = es_rule_check_live(&si, after, si.head, err); /* the fold from this snapshot needs them */
    int64_t limit = ES_NONE; /* §3.9: archived events after the snapshot come first */
    if (rc == ES_OK) rc = es_archive_read_part(s, t, &si, &after, si.head, &limit, a->events, err);
    es_session_info_destroy(&si);
  } else if (rc == ES_NOT_FOUND) {
    rc = ES_OK;
  }
  if (rc) {
    es_snapshot_destroy(a->snap);
    *a->found = 0;
    return rc;
  }
  collector c = {a->events, 0};
  rc = es_rule_collected(
      s->ops->event_range(s->bk, t, a->session, after, INT64_MAX, ES_NONE, es_rule_collect_event, &c, err),
      &c, err);
  return es_rule_revealed(s, t, rc, a->events, err);
}

int es_core_read_state(es_store *s, const char *session, const char *reducer, int *found,
                       es_snapshot *snap, es_events *events, es_err *err) {
  int rc;
  memset(events, 0, sizeof *events);
  es_snapshot_init(snap);
  *found = 0;
  if ((rc = es_check_name("session", session, err)) || (rc = es_check_name("reducer", reducer, err)))
    return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  state_args a = {session, reducer, found, snap, events};
  rc = es_core_read(s, do_read_state, &a, err);
  if (es_archive_retryable(rc, err)) { /* a segment went after the snapshot: once more */
    es_events_destroy(events);
    es_snapshot_destroy(snap);
    rc = es_core_read(s, do_read_state, &a, err);
  }
  es_core_leave(s);
  if (rc) {
    es_events_destroy(events);
    es_snapshot_destroy(snap);
    *found = 0;
  }
  return rc;
}

/* read_states: every session's answer inside one read transaction. */
typedef struct {
  const char *const *sessions;
  size_t n;
  const char *reducer;
  es_state_read *out;
} states_args;

static int do_read_states(es_store *s, es_txn *t, void *arg, es_err *err) {
  states_args *a = arg;
  for (size_t i = 0; i < a->n; i++) {
    state_args one = {a->sessions[i], a->reducer, &a->out[i].found, &a->out[i].snap,
                      &a->out[i].events};
    int rc = do_read_state(s, t, &one, err);
    if (rc) return rc;
  }
  return ES_OK;
}

void es_state_reads_destroy(es_state_read *v, size_t n) {
  for (size_t i = 0; v && i < n; i++) {
    es_snapshot_destroy(&v[i].snap);
    es_events_destroy(&v[i].events);
    v[i].found = 0;
  }
}

int es_core_read_states(es_store *s, const char *const *sessions, size_t n, const char *reducer,
                        es_state_read *out, es_err *err) {
  int rc;
  for (size_t i = 0; i < n; i++) {
    memset(&out[i], 0, sizeof out[i]);
    es_snapshot_init(&out[i].snap);
  }
  if ((rc = es_check_name("reducer", reducer, err))) return rc;
  if (n > ES_DEFAULT_MAX_BATCH)
    return es_fail(err, ES_TOO_LARGE, "%zu sessions, over the limit of %d", n, ES_DEFAULT_MAX_BATCH);
  for (size_t i = 0; i < n; i++) {
    char what[40];
    snprintf(what, sizeof what, "sessions[%zu]", i + 1);
    if ((rc = es_check_name(what, sessions[i], err))) return rc;
  }
  if ((rc = es_core_enter(s, err))) return rc;
  states_args a = {sessions, n, reducer, out};
  rc = es_core_read(s, do_read_states, &a, err);
  if (es_archive_retryable(rc, err)) { /* a segment went after the snapshot: once more */
    es_state_reads_destroy(out, n);
    rc = es_core_read(s, do_read_states, &a, err);
  }
  es_core_leave(s);
  if (rc) es_state_reads_destroy(out, n);
  return rc;
}

typedef struct {
  const char *session;
  es_snapshot row;
  int stored;
} put_snap_args;

static int do_put_snapshot(es_store *s, es_txn *t, void *arg, es_err *err) {
  put_snap_args *a = arg;
  es_session_info si;
  int64_t head = 0;
  int rc = s->ops->session_get(s->bk, t, a->session, &si, err);
  if (rc == ES_OK) {
    head = si.head;
    es_session_info_destroy(&si);
  } else if (rc != ES_NOT_FOUND) {
    return rc;
  }
  if (a->row.index > head)
    return es_fail(err, ES_NO_SUCH_EVENT, "snapshot index %lld is beyond the head %lld of '%s'",
                   (long long)a->row.index, (long long)head, a->session);
  es_snapshot old;
  rc = s->ops->snapshot_get(s->bk, t, a->session, a->row.reducer, &old, err);
  if (rc == ES_OK) {
    int newer = old.index > a->row.index;
    es_snapshot_destroy(&old);
    /* Never replace a further-along snapshot: a slow writer must not
     * clobber a fast one. Equal index replaces (a new reducer version). */
    if (newer) return ES_OK;
  } else if (rc != ES_NOT_FOUND) {
    return rc;
  }
  rc = s->ops->snapshot_put(s->bk, t, a->session, &a->row, err);
  if (rc == ES_OK) a->stored = 1;
  return rc;
}

int es_core_put_snapshot(es_store *s, const char *session, const char *reducer, int64_t index,
                         const char *state, size_t state_len, const char *version, int *stored,
                         es_err *err) {
  int rc;
  *stored = 0;
  if ((rc = es_check_name("session", session, err)) || (rc = es_check_name("reducer", reducer, err)))
    return rc;
  if (index < 0) return es_fail(err, ES_INVALID_ARGUMENT, "snapshot index must be >= 0");
  if (!state) return es_fail(err, ES_INVALID_ARGUMENT, "snapshot state is required");
  if (!version) version = "";
  if ((rc = es_check_utf8("snapshot version", version, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  put_snap_args a = {session, {0}, 0};
  a.row.reducer = (char *)reducer;
  a.row.index = index;
  a.row.state = (char *)state;
  a.row.state_len = state_len;
  a.row.version = (char *)version;
  rc = es_store_now(s, &a.row.updated_at, err);
  if (rc == ES_OK) rc = es_core_write(s, do_put_snapshot, &a, err);
  es_core_leave(s);
  if (rc == ES_OK) *stored = a.stored;
  return rc;
}

int es_rule_collect_snapshot(void *ctx, const es_snapshot *row) {
  collector *c = ctx;
  es_snapshots *out = c->list;
  if (es_grow((void **)&out->v, &out->cap, out->n + 1, sizeof *out->v) ||
      es_snapshot_copy(&out->v[out->n], row)) {
    c->oom = 1;
    return 1;
  }
  out->n++;
  return 0;
}

typedef struct {
  const char *session;
  es_snapshots *out;
} snaps_args;

static int do_snapshots(es_store *s, es_txn *t, void *arg, es_err *err) {
  snaps_args *a = arg;
  collector c = {a->out, 0};
  return es_rule_collected(s->ops->snapshot_list(s->bk, t, a->session, es_rule_collect_snapshot, &c, err), &c, err);
}

int es_core_snapshots(es_store *s, const char *session, es_snapshots *out, es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = es_check_name("session", session, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  snaps_args a = {session, out};
  rc = es_core_read(s, do_snapshots, &a, err);
  es_core_leave(s);
  if (rc) es_snapshots_destroy(out);
  return rc;
}

/* --- inspection --- */

static int collect_session(void *ctx, const es_session_info *row) {
  collector *c = ctx;
  es_sessions *out = c->list;
  if (es_grow((void **)&out->v, &out->cap, out->n + 1, sizeof *out->v) ||
      es_session_info_copy(&out->v[out->n], row)) {
    c->oom = 1;
    return 1;
  }
  out->n++;
  return 0;
}

typedef struct {
  const char *prefix, *after;
  int64_t limit;
  es_sessions *out;
} sessions_args;

static int do_sessions(es_store *s, es_txn *t, void *arg, es_err *err) {
  sessions_args *a = arg;
  /* One more than asked tells whether another page follows. */
  collector c = {a->out, 0};
  int rc = es_rule_collected(
      s->ops->session_list(s->bk, t, a->prefix, a->after, a->limit + 1, collect_session, &c, err),
      &c, err);
  if (rc) return rc;
  if ((int64_t)a->out->n > a->limit) {
    es_session_info_destroy(&a->out->v[--a->out->n]);
    a->out->cursor = strdup(a->out->v[a->out->n - 1].session);
    if (!a->out->cursor) return nomem(err);
  }
  return ES_OK;
}

int es_core_sessions(es_store *s, const char *prefix, const char *after, int64_t limit,
                     es_sessions *out, es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  if (limit <= 0) return es_fail(err, ES_INVALID_ARGUMENT, "limit must be > 0");
  if ((rc = es_check_utf8("prefix", prefix, err)) || (rc = es_check_utf8("after", after, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  sessions_args a = {prefix ? prefix : "", after, cap_limit(limit), out};
  rc = es_core_read(s, do_sessions, &a, err);
  es_core_leave(s);
  if (rc) es_sessions_destroy(out);
  return rc;
}
