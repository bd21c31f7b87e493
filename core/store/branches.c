/*
 * branches.c: the rules of §3.7 branches: fork, lineage, children,
 * refs and promote.
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

/* ---------------------------------------------------------------------- */
/* 3.7 branches: fork, lineage, refs, promote */

#define FORK_CHUNK 1024  /* rows read from the source per step of a fork */

static int no_session(es_err *err, const char *session) {
  return es_fail(err, ES_NOT_FOUND, "no session '%s'", session);
}

static int check_limit(int64_t limit, es_err *err) { return es_rule_check_limit(limit, err); }

static int check_after(const char *after, es_err *err) { return es_rule_check_after(after, err); }

static int lineage_of(const es_session_info *si, es_lineage *out) {
  memset(out, 0, sizeof *out);
  out->session = strdup(si->session);
  out->parent = strdup(si->parent);
  out->at = si->fork_at;
  out->created_at = si->forked_at;
  if (out->session && out->parent) return ES_OK;
  es_lineage_destroy(out);
  return ES_STORAGE;
}

typedef struct {
  const char *from, *to;
  int64_t at, now;
  es_lineage *out;
  const char *scope;  /* §3.11: the tenant prefix of the copies' ids, or NULL */
  es_keyring *ring;   /* §3.10: data keys of the copies sealed again (row by row) */
} fork_args;

typedef struct {
  es_store *s;
  int64_t now;
  const char *scope;
} fork_id_ctx;

/* The ids of a backend's bulk copy: UUIDv7 (behind a tenant's prefix),
 * unique by construction. */
static int fork_id(void *ctx, char *out, size_t cap, es_err *err) {
  fork_id_ctx *f = ctx;
  size_t p = f->scope ? strlen(f->scope) : 0;
  if (cap < p + 37) return es_fail(err, ES_STORAGE, "no room for an event id");
  memcpy(out, f->scope ? f->scope : "", p);
  return es_core_uuid7(f->s, f->now, out + p, err);
}

/* The backend copies the rows itself (event_copy): no row passes through
 * the core. Only with generated UUIDv7 ids: an injected id source's ids
 * are checked one by one (new_event_id), which the row-by-row copy does. */
static int fork_events_bulk(es_store *s, es_txn *t, fork_args *a, es_session_info *dst,
                            es_err *err) {
  es_events first = {0};
  collector c = {&first, 0};
  int rc = es_rule_collected(s->ops->event_range(s->bk, t, a->from, 0, a->at, 1, es_rule_collect_event, &c, err),
                     &c, err);
  if (rc == ES_OK && first.n) dst->first_at = first.v[0].created_at;
  es_events_destroy(&first);
  if (rc) return rc;
  fork_id_ctx ids = {s, a->now, a->scope};
  int64_t copied = 0;
  es_core_touch(s, dst->session);
  rc = s->ops->event_copy(s->bk, t, a->from, a->at, dst->session, a->now, fork_id, &ids, &copied,
                          err);
  if (rc == ES_OK && copied != a->at)
    rc = es_fail(err, ES_STORAGE, "session '%s' has %lld events through %lld, not %lld", a->from,
                 (long long)copied, (long long)a->at, (long long)a->at);
  if (rc == ES_OK) dst->head = dst->events = a->at;
  return rc;
}

/* Inserts the copy of one source event as a processed row of `to`. */
static int fork_copy_row(es_store *s, es_txn *t, fork_args *a, es_session_info *dst,
                         const es_event *src, es_err *err) {
  char id[ES_MAX_NAME_BYTES + 1];
  int rc;
  if ((rc = es_core_new_event_id(s, t, a->now, a->scope, id, err))) return rc;
  es_event row;
  es_event_init(&row);
  row.id = id;
  row.type = src->type;
  row.payload = src->payload;
  row.payload_len = src->payload_len;
  row.session = dst->session;
  row.lane = src->lane;
  row.index = src->index;
  row.created_at = src->created_at;
  row.cause_index = src->cause_index;
  row.cause_attempt = src->cause_attempt;
  row.not_before = src->not_before;
  row.revision = src->revision;
  row.meta = src->meta;
  es_event_settle_copy(&row, a->now); /* backend.h event_copy writes the same */
  row.origin_session = (char *)a->from;
  row.origin_index = src->index;
  row.key = src->key;
  char *sealed = NULL;
  if (src->key)
    rc = es_crypto_fork_payload(s, t, a->ring, src, &row, &sealed, &row.payload_len, err);
  if (sealed) row.payload = sealed;
  else row.payload_len = src->payload_len; /* no key, or shredded: copied as stored */
  if (rc == ES_OK) es_core_touch(s, row.session);
  if (rc == ES_OK) rc = s->ops->event_insert(s->bk, t, &row, err);
  free(sealed);
  if (rc) return rc;
  if (dst->first_at == ES_NONE) dst->first_at = src->created_at;
  dst->head = dst->events = src->index;
  return ES_OK;
}

/* §3.9: archived events of the source are copied from its segments. */
typedef struct {
  es_store *s;
  es_txn *t;
  fork_args *a;
  es_session_info *dst;
  es_err *err;
  int rc;
} fork_archived_ctx;

static int fork_archived_row(void *ctx, const es_event *src) {
  fork_archived_ctx *c = ctx;
  c->rc = fork_copy_row(c->s, c->t, c->a, c->dst, src, c->err);
  return c->rc != ES_OK;
}

/* The source's archived events 1..at (first_index..archived_through of
 * it), copied row by row; *after: the last index copied. */
static int fork_archived(es_store *s, es_txn *t, fork_args *a, es_session_info *dst, int64_t *after,
                         es_err *err) {
  es_session_info src;
  int rc = s->ops->session_get(s->bk, t, a->from, &src, err);
  if (rc) return rc;
  if (src.archived_through > 0 && a->at > 0) {
    fork_archived_ctx c = {s, t, a, dst, err, ES_OK};
    rc = es_archive_each(s, t, &src, 0, a->at, fork_archived_row, &c, err);
    if (rc == ES_OK) rc = c.rc;
    if (rc == ES_OK) *after = src.archived_through < a->at ? src.archived_through : a->at;
  }
  es_session_info_destroy(&src);
  return rc;
}

/* Copies the source's events 1..at in chunks (a backend iteration must not
 * run while rows are inserted) as processed rows of `to`. */
static int fork_events(es_store *s, es_txn *t, fork_args *a, es_session_info *dst, es_err *err) {
  /* §3.10: sealed payloads are bound to their event's id, so a store that
   * has ever sealed one copies row by row (each copy sealed again). */
  int keyed = 0;
  int rc = es_crypto_in_use(s, t, &keyed, err);
  if (rc) return rc;
  int64_t after = 0;
  if (!keyed && s->ops->event_copy && !s->ids && a->at > 0) {
    /* the bulk copy serves a source without archived events */
    es_session_info src;
    if ((rc = s->ops->session_get(s->bk, t, a->from, &src, err))) return rc;
    int archived = src.archived_through > 0;
    es_session_info_destroy(&src);
    if (!archived) return fork_events_bulk(s, t, a, dst, err);
  }
  es_keyring ring;
  es_keyring_init(&ring);
  a->ring = &ring;
  rc = fork_archived(s, t, a, dst, &after, err);
  while (rc == ES_OK && after < a->at) {
    es_events chunk = {0};
    collector c = {&chunk, 0};
    rc = es_rule_collected(
        s->ops->event_range(s->bk, t, a->from, after, a->at, FORK_CHUNK, es_rule_collect_event, &c, err),
        &c, err);
    if (rc == ES_OK && chunk.n == 0)
      rc = es_fail(err, ES_STORAGE, "session '%s' has no event after %lld below its head", a->from,
                   (long long)after);
    for (size_t i = 0; rc == ES_OK && i < chunk.n; i++)
      rc = fork_copy_row(s, t, a, dst, &chunk.v[i], err);
    if (chunk.n) after = chunk.v[chunk.n - 1].index;
    es_events_destroy(&chunk);
  }
  es_keyring_destroy(&ring);
  return rc;
}

/* Carries over the source's snapshots at or below the fork point: the
 * fork's state is then as cheap to read as the source's was. */
static int fork_snapshots(es_store *s, es_txn *t, fork_args *a, es_err *err) {
  es_snapshots list = {0};
  collector c = {&list, 0};
  int rc = es_rule_collected(s->ops->snapshot_list(s->bk, t, a->from, es_rule_collect_snapshot, &c, err), &c, err);
  for (size_t i = 0; rc == ES_OK && i < list.n; i++) {
    if (list.v[i].index > a->at) continue;
    es_snapshot snap;
    es_snapshot_init(&snap);
    rc = s->ops->snapshot_get(s->bk, t, a->from, list.v[i].reducer, &snap, err);
    if (rc == ES_OK) rc = s->ops->snapshot_put(s->bk, t, a->to, &snap, err);
    es_snapshot_destroy(&snap);
  }
  es_snapshots_destroy(&list);
  return rc;
}

/* `to` may be a session without events that already has forks of its own
 * (made at 0): forking one of its descendants into it would make the
 * lineage a loop. Walks from's ancestors (a chain of forks, each step one
 * row lookup). */
static int check_not_ancestor(es_store *s, es_txn *t, const char *from, const char *to,
                              es_err *err) {
  char *cur = strdup(from);
  int rc = cur ? ES_OK : nomem(err);
  while (rc == ES_OK && cur) {
    es_session_info si;
    rc = s->ops->session_get(s->bk, t, cur, &si, err);
    free(cur);
    cur = NULL;
    if (rc == ES_NOT_FOUND) {
      rc = ES_OK;
      break;
    }
    if (rc) break;
    if (si.parent && strcmp(si.parent, to) == 0)
      rc = es_fail(err, ES_INVALID_ARGUMENT,
                   "cannot fork '%s' into '%s': '%s' is its ancestor (lineage must not loop)", from,
                   to, to);
    cur = si.parent; /* moves to the next step */
    si.parent = NULL;
    es_session_info_destroy(&si);
  }
  free(cur);
  return rc;
}

static int do_fork(es_store *s, es_txn *t, void *arg, es_err *err) {
  fork_args *a = arg;
  es_session_info src, dst;
  int rc = s->ops->session_get(s->bk, t, a->from, &src, err);
  if (rc == ES_NOT_FOUND) return no_session(err, a->from);
  if (rc) return rc;
  int64_t head = src.head;
  rc = a->at <= head ? es_rule_check_live(&src, 0, a->at, err) : ES_OK; /* the copy needs 1..at */
  es_session_info_destroy(&src);
  if (rc) return rc;
  if (a->at > head)
    return es_fail(err, ES_NO_SUCH_EVENT, "cannot fork session '%s' at %lld: its head is %lld",
                   a->from, (long long)a->at, (long long)head);
  if ((rc = es_rule_load_session(s, t, a->to, &dst, err))) return rc;
  if (dst.head > 0) {
    rc = es_fail(err, ES_INVALID_ARGUMENT, "cannot fork into session '%s': it already has events",
                 a->to);
  } else if (dst.parent) {
    rc = es_fail(err, ES_INVALID_ARGUMENT,
                 "cannot fork into session '%s': it is already a fork of '%s'", a->to, dst.parent);
  } else if ((rc = check_not_ancestor(s, t, a->from, a->to, err)) != ES_OK) {
    /* refused: lineage must stay a tree */
  } else {
    rc = es_rule_check_writable(&dst, ES_NONE, (size_t)a->at, err);
  }
  if (rc == ES_OK) rc = fork_events(s, t, a, &dst, err);
  if (rc == ES_OK) rc = fork_snapshots(s, t, a, err);
  if (rc == ES_OK) {
    dst.parent = strdup(a->from);
    dst.fork_at = a->at;
    dst.forked_at = dst.updated_at = a->now;
    rc = dst.parent ? s->ops->session_put(s->bk, t, &dst, err) : nomem(err);
  }
  if (rc == ES_OK && lineage_of(&dst, a->out)) rc = nomem(err);
  es_session_info_destroy(&dst);
  return rc;
}

int es_core_fork(es_store *s, const char *scope, const char *from, int64_t at, const char *to,
                 es_lineage *out, es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = es_check_name("from", from, err)) || (rc = es_check_name("to", to, err))) return rc;
  if (at < 0) return es_fail(err, ES_INVALID_ARGUMENT, "at must be >= 0");
  if (strcmp(from, to) == 0)
    return es_fail(err, ES_INVALID_ARGUMENT, "cannot fork session '%s' into itself", from);
  if ((rc = es_core_enter(s, err))) return rc;
  fork_args a = {from, to, at, 0, out, scope, NULL};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK) rc = es_core_write(s, do_fork, &a, err);
  es_core_leave(s);
  if (rc) es_lineage_destroy(out);
  return rc;
}

typedef struct {
  const char *session;
  int *found;
  es_lineage *out;
} lineage_args;

static int do_lineage(es_store *s, es_txn *t, void *arg, es_err *err) {
  lineage_args *a = arg;
  es_session_info si;
  int rc = s->ops->session_get(s->bk, t, a->session, &si, err);
  if (rc == ES_NOT_FOUND) return ES_OK;
  if (rc) return rc;
  if (si.parent) {
    if (lineage_of(&si, a->out)) rc = nomem(err);
    else *a->found = 1;
  }
  es_session_info_destroy(&si);
  return rc;
}

int es_core_lineage(es_store *s, const char *session, int *found, es_lineage *out, es_err *err) {
  int rc;
  *found = 0;
  memset(out, 0, sizeof *out);
  if ((rc = es_check_name("session", session, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  lineage_args a = {session, found, out};
  rc = es_core_read(s, do_lineage, &a, err);
  es_core_leave(s);
  return rc;
}

static int collect_child(void *ctx, const es_session_info *row) {
  collector *c = ctx;
  es_lineages *out = c->list;
  if (es_grow((void **)&out->v, &out->cap, out->n + 1, sizeof *out->v) ||
      lineage_of(row, &out->v[out->n])) {
    c->oom = 1;
    return 1;
  }
  out->n++;
  return 0;
}

typedef struct {
  const char *session, *after;
  int64_t limit;
  es_lineages *out;
} children_args;

static int do_children(es_store *s, es_txn *t, void *arg, es_err *err) {
  children_args *a = arg;
  collector c = {a->out, 0};
  return es_rule_collected(
      s->ops->session_children(s->bk, t, a->session, a->after, a->limit, collect_child, &c, err),
      &c, err);
}

int es_core_children(es_store *s, const char *session, const char *after, int64_t limit,
                     es_lineages *out, es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = es_check_name("session", session, err)) || (rc = check_after(after, err)) ||
      (rc = check_limit(limit, err)))
    return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  children_args a = {session, after, cap_limit(limit), out};
  rc = es_core_read(s, do_children, &a, err);
  es_core_leave(s);
  if (rc) es_lineages_destroy(out);
  return rc;
}

/* A ref as shown: with the head its session has now and (§3.7) the
 * session's lineage, read in the same transaction. */
static int ref_with_head(es_store *s, es_txn *t, es_ref *ref, es_err *err) {
  es_session_info si;
  int rc = s->ops->session_get(s->bk, t, ref->session, &si, err);
  ref->head = 0;
  free(ref->parent);
  ref->parent = NULL;
  ref->at = ES_NONE;
  if (rc == ES_NOT_FOUND) return ES_OK;
  if (rc) return rc;
  ref->head = si.head;
  if (si.parent) {
    ref->parent = si.parent; /* taken over from si */
    si.parent = NULL;
    ref->at = si.fork_at;
  }
  es_session_info_destroy(&si);
  return ES_OK;
}

/* Points `name` at `session` (keeping created_at of an existing ref). */
static int ref_point(es_store *s, es_txn *t, const char *name, const char *session, int64_t now,
                     es_ref *out, es_err *err) {
  es_ref old;
  es_ref_init(&old);
  int rc = s->ops->ref_get(s->bk, t, name, &old, err);
  if (rc != ES_OK && rc != ES_NOT_FOUND) return rc;
  es_ref row = {(char *)name, (char *)session, ES_NONE, rc == ES_OK ? old.created_at : now, now,
                NULL, ES_NONE};
  es_ref_destroy(&old);
  if ((rc = s->ops->ref_put(s->bk, t, &row, err))) return rc;
  if (es_ref_copy(out, &row)) return nomem(err);
  return ref_with_head(s, t, out, err);
}

typedef struct {
  const char *name, *session, *expect;
  int has_expect;
  int64_t now;
  es_ref *out;
  char *actual;  /* promote's REF_CONFLICT: what to_ref names (owned) */
  int found;
} ref_args;

static int do_put_ref(es_store *s, es_txn *t, void *arg, es_err *err) {
  ref_args *a = arg;
  return ref_point(s, t, a->name, a->session, a->now, a->out, err);
}

int es_core_put_ref(es_store *s, const char *name, const char *session, es_ref *out, es_err *err) {
  int rc;
  es_ref_init(out);
  if ((rc = es_check_name("name", name, err)) || (rc = es_check_name("session", session, err)))
    return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  ref_args a = {.name = name, .session = session, .out = out};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK) rc = es_core_write(s, do_put_ref, &a, err);
  es_core_leave(s);
  if (rc) es_ref_destroy(out);
  return rc;
}

static int do_get_ref(es_store *s, es_txn *t, void *arg, es_err *err) {
  ref_args *a = arg;
  int rc = s->ops->ref_get(s->bk, t, a->name, a->out, err);
  if (rc == ES_NOT_FOUND) return ES_OK;
  if (rc == ES_OK) {
    a->found = 1;
    rc = ref_with_head(s, t, a->out, err);
  }
  return rc;
}

int es_core_get_ref(es_store *s, const char *name, int *found, es_ref *out, es_err *err) {
  int rc;
  *found = 0;
  es_ref_init(out);
  if ((rc = es_check_name("name", name, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  ref_args a = {.name = name, .out = out};
  rc = es_core_read(s, do_get_ref, &a, err);
  es_core_leave(s);
  if (rc) es_ref_destroy(out);
  else *found = a.found;
  return rc;
}

static int collect_ref(void *ctx, const es_ref *row) {
  collector *c = ctx;
  es_refs *out = c->list;
  if (es_grow((void **)&out->v, &out->cap, out->n + 1, sizeof *out->v) ||
      es_ref_copy(&out->v[out->n], row)) {
    c->oom = 1;
    return 1;
  }
  out->n++;
  return 0;
}

typedef struct {
  const char *after;
  int64_t limit;
  es_refs *out;
} list_refs_args;

static int do_list_refs(es_store *s, es_txn *t, void *arg, es_err *err) {
  list_refs_args *a = arg;
  collector c = {a->out, 0};
  int rc = es_rule_collected(s->ops->ref_list(s->bk, t, a->after, a->limit, collect_ref, &c, err), &c, err);
  for (size_t i = 0; rc == ES_OK && i < a->out->n; i++) rc = ref_with_head(s, t, &a->out->v[i], err);
  return rc;
}

int es_core_list_refs(es_store *s, const char *after, int64_t limit, es_refs *out, es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = check_after(after, err)) || (rc = check_limit(limit, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  list_refs_args a = {after, cap_limit(limit), out};
  rc = es_core_read(s, do_list_refs, &a, err);
  es_core_leave(s);
  if (rc) es_refs_destroy(out);
  return rc;
}

static int do_delete_ref(es_store *s, es_txn *t, void *arg, es_err *err) {
  ref_args *a = arg;
  int rc = s->ops->ref_delete(s->bk, t, a->name, err);
  a->found = rc == ES_OK;
  return rc == ES_NOT_FOUND ? ES_OK : rc;
}

int es_core_delete_ref(es_store *s, const char *name, int *deleted, es_err *err) {
  int rc;
  *deleted = 0;
  if ((rc = es_check_name("name", name, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  ref_args a = {.name = name};
  rc = es_core_write(s, do_delete_ref, &a, err);
  es_core_leave(s);
  if (rc == ES_OK) *deleted = a.found;
  return rc;
}

/* The compare-and-set runs inside the write transaction, which is
 * serialised within this process (wmu) and across processes by the
 * backend's write lock, so of two promotes with the same `expect` exactly
 * one sees it hold. */
static int do_promote(es_store *s, es_txn *t, void *arg, es_err *err) {
  ref_args *a = arg; /* name: from_ref, session: to_ref */
  es_ref from, to;
  es_ref_init(&from);
  es_ref_init(&to);
  int rc = s->ops->ref_get(s->bk, t, a->name, &from, err);
  if (rc == ES_NOT_FOUND) return es_fail(err, ES_NOT_FOUND, "no ref '%s'", a->name);
  if (rc) return rc;
  rc = s->ops->ref_get(s->bk, t, a->session, &to, err);
  int exists = rc == ES_OK;
  if (rc == ES_NOT_FOUND) rc = ES_OK;
  if (rc == ES_OK && a->has_expect &&
      (a->expect ? !exists || strcmp(to.session, a->expect) != 0 : exists)) {
    if (exists && !(a->actual = strdup(to.session))) {
      rc = nomem(err);
    } else {
      rc = es_fail(err, ES_REF_CONFLICT, "promote onto ref '%s' refused: expected %s%s%s, found %s%s%s",
                   a->session, a->expect ? "'" : "", a->expect ? a->expect : "no ref",
                   a->expect ? "'" : "", exists ? "'" : "", exists ? to.session : "no ref",
                   exists ? "'" : "");
    }
  }
  if (rc == ES_OK) rc = ref_point(s, t, a->session, from.session, a->now, a->out, err);
  es_ref_destroy(&from);
  es_ref_destroy(&to);
  return rc;
}

int es_core_promote(es_store *s, const char *from_ref, const char *to_ref, int has_expect,
                    const char *expect, es_ref *out, char **actual, es_err *err) {
  int rc;
  es_ref_init(out);
  *actual = NULL;
  if ((rc = es_check_name("from_ref", from_ref, err)) || (rc = es_check_name("to_ref", to_ref, err)))
    return rc;
  if (has_expect && expect && (rc = es_check_name("expect", expect, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  ref_args a = {from_ref, to_ref, has_expect ? expect : NULL, has_expect, 0, out, NULL, 0};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK) rc = es_core_write(s, do_promote, &a, err);
  es_core_leave(s);
  if (rc) es_ref_destroy(out);
  if (rc == ES_REF_CONFLICT) *actual = a.actual;
  else free(a.actual);
  return rc;
}
