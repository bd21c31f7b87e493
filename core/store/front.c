/*
 * front.c: the store's front door (store.h). Every es_store_* call is
 * counted (§3.12, ES_STATS_CALL) and forwarded to the handle's table of
 * operations (store_impl.h): the core store, a tenant view or the shard
 * router. Nothing here knows which: a new store call is one op in the
 * table, one forwarding function here, and one implementation in each of
 * the three.
 *
 * es_store_open maps a URL's scheme to how it opens (the one table of
 * schemes below).
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "store/internal.h"
#include "store/shards.h"
#include "store/store.h"
#include "store/store_impl.h"

/* ---- opening: the table of schemes ------------------------------------- */

/* A core store over backend b. Every store opened on a known backend
 * checks the markers a shard move leaves in it (shards.c
 * es_shards_wrap_ops), whether or not it is opened as a shard. */
static int open_backend(const es_backend_ops *b, const char *rest, const es_open_opts *opts,
                        es_store **out, es_err *err) {
  return es_core_open(b, es_shards_wrap_ops, rest, opts, out, err);
}

static int open_shards(const es_backend_ops *b, const char *rest, const es_open_opts *opts,
                       es_store **out, es_err *err) {
  (void)b;
  return es_shards_open_url(rest, opts, out, err);
}

/* A URL is "scheme:rest"; each scheme opens with its function (a core
 * store over the backend, or the shard router over the catalog at rest). */
static const struct scheme {
  const char *name;  /* without the ':' */
  int (*open)(const es_backend_ops *b, const char *rest, const es_open_opts *opts,
              es_store **out, es_err *err);
  const es_backend_ops *backend;  /* for open_backend; NULL for shards: */
} schemes[] = {
    {"memory", open_backend, &es_backend_memory},         /* memory: */
    {"sqlite", open_backend, &es_backend_sqlite},         /* sqlite:PATH */
    {"postgres", open_backend, &es_backend_postgres},     /* postgres://... (libpq) */
    {"postgresql", open_backend, &es_backend_postgresql}, /* postgresql://... */
    /* shards:CATALOG_URL: the sharded store whose plan that catalog holds
     * (shards.c; with a plan to install: es_shards_open). */
    {"shards", open_shards, NULL},
};

int es_store_open(const char *url, const es_open_opts *opts, es_store **out, es_err *err) {
  static const es_open_opts defaults = {0};
  *out = NULL;
  if (!opts) opts = &defaults;
  if (!url) url = "memory:";
  /* §3.9: an archive location given as a file: URL opens as its path, on
   * every backend and on each shard alike */
  char *archive = NULL;
  if (opts->archive_dir && es_archive_location(opts->archive_dir, &archive, err) != ES_OK) return err->code;
  es_open_opts with_path;
  if (archive) {
    with_path = *opts;
    with_path.archive_dir = archive;
    opts = &with_path;
  }
  const char *colon = strchr(url, ':');
  size_t n = colon ? (size_t)(colon - url) : 0;
  for (size_t i = 0; colon && i < sizeof schemes / sizeof *schemes; i++)
    if (strlen(schemes[i].name) == n && memcmp(schemes[i].name, url, n) == 0) {
      int rc = schemes[i].open(schemes[i].backend, colon + 1, opts, out, err);
      free(archive);
      return rc;
    }
  free(archive);
  return es_fail(err, ES_INVALID_ARGUMENT,
                 "unknown store url '%s' (expected memory:, sqlite:PATH, postgres://..., "
                 "shards:CATALOG_URL)", url);
}

/* ---- the handle --------------------------------------------------------- */

void es_store_close(es_store *s) { s->impl->close(s); }

void es_store_retain(es_store *s) { atomic_fetch_add(&s->refs, 1); }

void es_store_release(es_store *s) {
  if (!s || atomic_fetch_sub(&s->refs, 1) != 1) return;
  s->impl->free(s);
}

size_t es_store_max_payload(const es_store *s) { return s->max_payload; }

/* Every handle has a clock: a view's or a router's is the one of the
 * store it was made from or opened with. */
/* Every reading of a store's clock passes here, so the clock's range
 * (docs/limits.md "The clock") is one check: a time before the epoch is
 * refused, and with it math.mininteger, which is ES_NONE ("absent") to
 * the rest of the API (an event stamped with it would read back without
 * created_at). A tenant view shares its store's clock. */
int es_store_now(es_store *s, int64_t *now, es_err *err) {
  int rc = s->clock(s->clock_ctx, now, err);
  if (rc == ES_OK && *now < 0)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "the store's clock read %lld, outside its range 0..math.maxinteger (ms since the epoch)",
                   (long long)*now);
  return rc;
}

int es_store_new_id(es_store *s, char out[ES_MAX_ID_BYTES + 1], es_err *err) {
  return s->impl->new_id(s, out, err);
}

uint64_t es_store_version(es_store *s) { return s->impl->version(s); }

int es_store_tenant(es_store *s, const char *name, es_store **out, es_err *err) {
  *out = NULL;
  return s->impl->tenant(s, name, out, err);
}

const char *es_store_tenant_name(const es_store *s) {
  return s->impl->tenant_name ? s->impl->tenant_name(s) : NULL;
}

/* ---- the calls ---------------------------------------------------------- */

int es_store_data_version(es_store *s, uint64_t *version, es_err *err) {
  return s->impl->data_version(s, version, err);
}

int es_store_append(es_store *s, const char *session, const es_new_event *evs, size_t n,
                    int64_t expected, int64_t fence, es_events *out, int *pending, es_err *err) {
  ES_STATS_CALL(s, ES_OP_APPEND,
                es_store_append(s, session, evs, n, expected, fence, out, pending, err));
  return s->impl->append(s, NULL, session, evs, n, expected, fence, out, pending, err);
}

int es_store_append_many(es_store *s, es_append_batch *v, size_t n, es_err *err) {
  ES_STATS_CALL(s, ES_OP_APPEND_MANY, es_store_append_many(s, v, n, err));
  for (size_t i = 0; i < n; i++) {
    memset(&v[i].out, 0, sizeof v[i].out);
    v[i].pending = 0;
  }
  return s->impl->append_many(s, NULL, v, n, err);
}

int es_store_read(es_store *s, const char *session, int64_t after, int64_t through, int64_t limit,
                  es_events *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_READ, es_store_read(s, session, after, through, limit, out, err));
  return s->impl->read(s, session, after, through, limit, out, err);
}

int es_store_events_page(es_store *s, const char *session, int64_t after, int64_t through,
                         int64_t limit, es_events *out, int64_t *through_out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_EVENTS_PAGE,
                es_store_events_page(s, session, after, through, limit, out, through_out, err));
  return s->impl->events_page(s, session, after, through, limit, out, through_out, err);
}

int es_store_head(es_store *s, const char *session, int64_t *head, es_err *err) {
  ES_STATS_CALL(s, ES_OP_HEAD, es_store_head(s, session, head, err));
  return s->impl->head(s, session, head, err);
}

int es_store_read_all_cursor(es_store *s, const char *cursor, int64_t limit, es_events *out,
                             char ***cursors, es_err *err) {
  ES_STATS_CALL(s, ES_OP_READ_ALL, es_store_read_all_cursor(s, cursor, limit, out, cursors, err));
  return s->impl->read_all_cursor(s, NULL, cursor, limit, out, cursors, err);
}

void es_store_cursors_free(char **cursors, size_t n) {
  for (size_t i = 0; cursors && i < n; i++) free(cursors[i]);
  free(cursors);
}

int es_store_read_all(es_store *s, int64_t after, int64_t limit, es_events *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_READ_ALL, es_store_read_all(s, after, limit, out, err));
  return s->impl->read_all(s, NULL, after, limit, out, err);
}

int es_store_last_position(es_store *s, int64_t *position, es_err *err) {
  ES_STATS_CALL(s, ES_OP_LAST_POSITION, es_store_last_position(s, position, err));
  return s->impl->last_position(s, NULL, position, err);
}

int es_store_get(es_store *s, const char *session, int64_t index, es_event *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_GET, es_store_get(s, session, index, out, err));
  return s->impl->get(s, session, index, out, err);
}

int es_store_claim(es_store *s, const char *session, const es_claim_opts *o, int *outcome,
                   es_events *out, int64_t *retry_at, es_err *err) {
  ES_STATS_CALL(s, ES_OP_CLAIM, es_store_claim(s, session, o, outcome, out, retry_at, err));
  return s->impl->claim(s, session, o, outcome, out, retry_at, err);
}

int es_store_claim_next(es_store *s, const char *holder, int64_t ttl_ms, int64_t limit,
                        const char *const *types, size_t n_types, const char *const *skip,
                        size_t n_skip, es_events *out, int64_t *retry_at, es_err *err) {
  ES_STATS_CALL(s, ES_OP_CLAIM_NEXT,
                es_store_claim_next(s, holder, ttl_ms, limit, types, n_types, skip, n_skip, out, retry_at, err));
  return s->impl->claim_next(s, NULL, holder, ttl_ms, limit, types, n_types, skip, n_skip, out,
                         retry_at, err);
}

int es_store_renew(es_store *s, const char *session, const char *holder,
                   const es_claim_ref *claims, size_t n, int64_t ttl_ms, int64_t expires_at,
                   es_renew_result *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_RENEW,
                es_store_renew(s, session, holder, claims, n, ttl_ms, expires_at, out, err));
  return s->impl->renew(s, session, holder, claims, n, ttl_ms, expires_at, out, err);
}

int es_store_release_claims(es_store *s, const char *session, const char *holder,
                            const es_claim_ref *claims, size_t n, es_renew_result *out,
                            es_err *err) {
  ES_STATS_CALL(s, ES_OP_RELEASE_CLAIMS,
                es_store_release_claims(s, session, holder, claims, n, out, err));
  return s->impl->release_claims(s, session, holder, claims, n, out, err);
}

int es_store_complete(es_store *s, const char *session, int64_t index, int64_t attempt,
                      const es_new_event *evs, size_t n, int64_t fence, int *outcome,
                      es_events *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_COMPLETE,
                es_store_complete(s, session, index, attempt, evs, n, fence, outcome, out, err));
  return s->impl->complete(s, NULL, session, index, attempt, evs, n, fence, outcome, out, err);
}

int es_store_complete_many(es_store *s, es_completion *v, size_t n, es_err *err) {
  ES_STATS_CALL(s, ES_OP_COMPLETE_MANY, es_store_complete_many(s, v, n, err));
  for (size_t i = 0; i < n; i++) {
    v[i].rc = ES_OK;
    v[i].outcome = 0;
    memset(&v[i].err, 0, sizeof v[i].err);
    for (size_t j = 0; j < v[i].n_cancel; j++) v[i].cancel[j].cancelled = 0;
  }
  return s->impl->complete_many(s, v, n, err);
}

int es_store_complete_cancel(es_store *s, es_completion *c, es_events *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_COMPLETE, es_store_complete_cancel(s, c, out, err));
  memset(out, 0, sizeof *out);
  c->outcome = 0;
  for (size_t i = 0; i < c->n_cancel; i++) c->cancel[i].cancelled = 0;
  c->rc = s->impl->complete_cancel(s, NULL, c, out, err);
  if (c->rc && err) c->err = *err;
  return c->rc;
}

int es_complete_many_each(es_store *s, es_completion *v, size_t n, es_err *err) {
  for (size_t i = 0; i < n; i++) {
    es_events out;
    if (v[i].n_cancel) /* through the op that keeps them in the completion's step */
      v[i].rc = es_store_complete_cancel(s, &v[i], &out, &v[i].err);
    else
      v[i].rc = es_store_complete(s, v[i].session, v[i].index, v[i].attempt, v[i].evs, v[i].n,
                                  v[i].fence, &v[i].outcome, &out, &v[i].err);
    if (v[i].rc == ES_OK) es_events_destroy(&out);
    if (v[i].rc == ES_CLOSED) return es_fail(err, ES_CLOSED, "%s", v[i].err.msg);
  }
  return ES_OK;
}

int es_store_fail(es_store *s, const char *session, int64_t index, int64_t attempt,
                  const char *error, int64_t max_failures, int64_t retry_after_ms, int *outcome,
                  int64_t *failures, es_err *err) {
  ES_STATS_CALL(s, ES_OP_FAIL,
                es_store_fail(s, session, index, attempt, error, max_failures, retry_after_ms, outcome, failures, err));
  return s->impl->fail(s, session, index, attempt, error, max_failures, retry_after_ms, outcome,
                         failures, err);
}

int es_store_revive(es_store *s, const char *session, int64_t index, es_err *err) {
  ES_STATS_CALL(s, ES_OP_REVIVE, es_store_revive(s, session, index, err));
  return s->impl->revive(s, session, index, err);
}

int es_store_settle(es_store *s, const char *session, int64_t index, const char *reason,
                    es_err *err) {
  ES_STATS_CALL(s, ES_OP_SETTLE, es_store_settle(s, session, index, reason, err));
  return s->impl->settle(s, session, index, reason, err);
}

int es_store_cancel(es_store *s, const char *session, int64_t index, const char *reason,
                    es_event *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_CANCEL, es_store_cancel(s, session, index, reason, out, err));
  if (out) es_event_init(out);
  return s->impl->cancel(s, session, index, reason, out, err);
}

int es_store_dead_letters(es_store *s, const char *session, int64_t after, int64_t limit,
                          es_events *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_DEAD_LETTERS, es_store_dead_letters(s, session, after, limit, out, err));
  return s->impl->dead_letters(s, NULL, session, after, limit, out, err);
}

int es_store_read_state(es_store *s, const char *session, const char *reducer, int *found,
                        es_snapshot *snap, es_events *events, es_err *err) {
  ES_STATS_CALL(s, ES_OP_READ_STATE,
                es_store_read_state(s, session, reducer, found, snap, events, err));
  return s->impl->read_state(s, session, reducer, found, snap, events, err);
}

int es_store_read_states(es_store *s, const char *const *sessions, size_t n, const char *reducer,
                         es_state_read *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_READ_STATES, es_store_read_states(s, sessions, n, reducer, out, err));
  return s->impl->read_states(s, sessions, n, reducer, out, err);
}

int es_store_put_snapshot(es_store *s, const char *session, const char *reducer, int64_t index,
                          const char *state, size_t state_len, const char *version, int *stored,
                          es_err *err) {
  ES_STATS_CALL(s, ES_OP_PUT_SNAPSHOT,
                es_store_put_snapshot(s, session, reducer, index, state, state_len, version, stored, err));
  return s->impl->put_snapshot(s, session, reducer, index, state, state_len, version, stored, err);
}

int es_store_snapshots(es_store *s, const char *session, es_snapshots *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_SNAPSHOTS, es_store_snapshots(s, session, out, err));
  return s->impl->snapshots(s, session, out, err);
}

int es_store_sessions(es_store *s, const char *prefix, const char *after, int64_t limit,
                      es_sessions *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_SESSIONS, es_store_sessions(s, prefix, after, limit, out, err));
  return s->impl->sessions(s, prefix, after, limit, out, err);
}

int es_store_pending_types(es_store *s, es_type_counts *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_PENDING_TYPES, es_store_pending_types(s, out, err));
  return s->impl->pending_types(s, NULL, out, err);
}

int es_store_wait(es_store *s, const char *session, int64_t after, int64_t timeout_ms,
                  int64_t limit, es_events *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_WAIT, es_store_wait(s, session, after, timeout_ms, limit, out, err));
  return s->impl->wait(s, NULL, session, after, timeout_ms, limit, out, err);
}

int es_store_presence_set(es_store *s, const char *ns, const char *participant,
                          const es_presence_field *fields, size_t n, int64_t ttl_ms, int64_t at,
                          int64_t seen, es_presence_rows *applied, es_err *err) {
  ES_STATS_CALL(s, ES_OP_PRESENCE_SET,
                es_store_presence_set(s, ns, participant, fields, n, ttl_ms, at, seen, applied, err));
  return s->impl->presence_set(s, ns, participant, fields, n, ttl_ms, at, seen, applied, err);
}

int es_store_presence_read(es_store *s, const char *ns, es_presence_rows *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_PRESENCE_READ, es_store_presence_read(s, ns, out, err));
  return s->impl->presence_read(s, ns, out, err);
}

uint64_t es_store_presence_watch(es_store *s, const char *ns, es_presence_cb cb, void *ctx) {
  return s->impl->presence_watch(s, ns, cb, ctx);
}

void es_store_presence_unwatch(es_store *s, uint64_t token) { s->impl->presence_unwatch(s, token); }

int es_store_fork(es_store *s, const char *from, int64_t at, const char *to, es_lineage *out,
                  es_err *err) {
  ES_STATS_CALL(s, ES_OP_FORK, es_store_fork(s, from, at, to, out, err));
  return s->impl->fork(s, NULL, from, at, to, out, err);
}

int es_store_lineage(es_store *s, const char *session, int *found, es_lineage *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_LINEAGE, es_store_lineage(s, session, found, out, err));
  return s->impl->lineage(s, session, found, out, err);
}

int es_store_children(es_store *s, const char *session, const char *after, int64_t limit,
                      es_lineages *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_CHILDREN, es_store_children(s, session, after, limit, out, err));
  return s->impl->children(s, session, after, limit, out, err);
}

int es_store_put_ref(es_store *s, const char *name, const char *session, es_ref *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_PUT_REF, es_store_put_ref(s, name, session, out, err));
  return s->impl->put_ref(s, name, session, out, err);
}

int es_store_get_ref(es_store *s, const char *name, int *found, es_ref *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_GET_REF, es_store_get_ref(s, name, found, out, err));
  return s->impl->get_ref(s, name, found, out, err);
}

int es_store_list_refs(es_store *s, const char *after, int64_t limit, es_refs *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_LIST_REFS, es_store_list_refs(s, after, limit, out, err));
  return s->impl->list_refs(s, after, limit, out, err);
}

int es_store_delete_ref(es_store *s, const char *name, int *deleted, es_err *err) {
  ES_STATS_CALL(s, ES_OP_DELETE_REF, es_store_delete_ref(s, name, deleted, err));
  return s->impl->delete_ref(s, name, deleted, err);
}

int es_store_promote(es_store *s, const char *from_ref, const char *to_ref, int has_expect,
                     const char *expect, es_ref *out, char **actual, es_err *err) {
  ES_STATS_CALL(s, ES_OP_PROMOTE,
                es_store_promote(s, from_ref, to_ref, has_expect, expect, out, actual, err));
  return s->impl->promote(s, from_ref, to_ref, has_expect, expect, out, actual, err);
}

int es_store_fence(es_store *s, const char *session, int64_t if_token, int64_t *token,
                   es_err *err) {
  ES_STATS_CALL(s, ES_OP_FENCE, es_store_fence(s, session, if_token, token, err));
  return s->impl->fence(s, session, if_token, token, err);
}

int es_store_lease(es_store *s, const char *session, const char *holder, int64_t ttl_ms,
                   es_lease *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_LEASE, es_store_lease(s, session, holder, ttl_ms, out, err));
  return s->impl->lease(s, session, holder, ttl_ms, out, err);
}

int es_store_lease_release(es_store *s, const char *session, const char *holder, int64_t token,
                           int *released, es_err *err) {
  ES_STATS_CALL(s, ES_OP_RELEASE, es_store_lease_release(s, session, holder, token, released, err));
  return s->impl->lease_release(s, session, holder, token, released, err);
}

int es_store_seal(es_store *s, const char *session, const char *reason, es_err *err) {
  ES_STATS_CALL(s, ES_OP_SEAL, es_store_seal(s, session, reason, err));
  return s->impl->seal(s, session, reason, err);
}

int es_store_truncate(es_store *s, const char *session, int64_t through, int64_t *first_index,
                      es_err *err) {
  ES_STATS_CALL(s, ES_OP_TRUNCATE, es_store_truncate(s, session, through, first_index, err));
  return s->impl->truncate(s, session, through, first_index, err);
}

int es_store_delete(es_store *s, const char *session, int *deleted, es_err *err) {
  ES_STATS_CALL(s, ES_OP_DELETE, es_store_delete(s, session, deleted, err));
  return s->impl->delete(s, session, deleted, err);
}

int es_store_archive(es_store *s, const char *session, int64_t through, int *written,
                     es_segment *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_ARCHIVE, es_store_archive(s, session, through, written, out, err));
  return s->impl->archive(s, session, through, written, out, err);
}

int es_store_segments(es_store *s, const char *session, es_segments *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_SEGMENTS, es_store_segments(s, session, out, err));
  return s->impl->segments(s, session, out, err);
}

int es_store_archived(es_store *s, const char *after, int64_t limit, es_archived *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_ARCHIVED, es_store_archived(s, after, limit, out, err));
  memset(out, 0, sizeof *out);
  return s->impl->archived(s, "", after, limit, out, err);
}

int es_store_compact_archive(es_store *s, const char *session, int64_t *before, int64_t *after,
                             es_err *err) {
  ES_STATS_CALL(s, ES_OP_COMPACT_ARCHIVE, es_store_compact_archive(s, session, before, after, err));
  return s->impl->compact_archive(s, session, before, after, err);
}

int es_store_verify_archive(es_store *s, const char *session, es_archive_report *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_VERIFY_ARCHIVE, es_store_verify_archive(s, session, out, err));
  return s->impl->verify_archive(s, session, out, err);
}

int es_store_shred(es_store *s, const char *name, int *was_live, es_err *err) {
  ES_STATS_CALL(s, ES_OP_SHRED, es_store_shred(s, name, was_live, err));
  return s->impl->shred(s, name, was_live, err);
}

int es_store_read_at_rest(es_store *s, const char *session, int64_t after, int64_t through,
                          int64_t limit, es_events *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_READ_AT_REST,
                es_store_read_at_rest(s, session, after, through, limit, out, err));
  return s->impl->read_at_rest(s, session, after, through, limit, out, err);
}

int es_store_counts(es_store *s, es_counts *out, es_err *err) {
  ES_STATS_CALL(s, ES_OP_COUNTS, es_store_counts(s, out, err));
  return s->impl->counts(s, NULL, out, err);
}

/* Not counted in stats: it reads fields of the handle, no storage. */
int es_store_capabilities(es_store *s, es_capabilities *out, es_err *err) {
  memset(out, 0, sizeof *out);
  return s->impl->capabilities(s, out, err);
}
