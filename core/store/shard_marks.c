/*
 * shard_marks.c: the markers a shard move leaves in a shard's rows, and the
 * marker-checking backend every store's own backend is wrapped in (shards.c
 * top comment: how a move runs). Moved out of shards.c as it was.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec/json.h"
#include "store/internal.h"
#include "store/shards.h"
#include "store/shards_internal.h"
#include "store/store.h"
#include "util/buf.h"

/* ---- the markers in a shard (every store's backend lookups) ------------- */


void es_sh_record_destroy(plan_record *r) {
  free(r->text);
  free(r->names);
  memset(r, 0, sizeof *r);
}

/* ES_OK with r->n == 0 when the shard has no record (a plain store). */
int es_sh_record_get(const es_backend_ops *ops, es_backend *bk, es_txn *t, plan_record *r,
                     es_err *err) {
  memset(r, 0, sizeof *r);
  es_session_info si;
  int rc = ops->session_get(bk, t, "", &si, err);
  if (rc == ES_NOT_FOUND) return ES_OK;
  if (rc) return rc;
  r->version = si.fence;
  r->text = si.seal_reason;
  si.seal_reason = NULL;
  es_session_info_destroy(&si);
  if (!r->text) return ES_OK;
  size_t lines = 1;
  for (char *p = r->text; *p; p++) lines += *p == '\n';
  r->names = malloc(lines * sizeof *r->names);
  if (!r->names) {
    es_sh_record_destroy(r);
    return nomem(err);
  }
  for (char *p = r->text, *q; p; p = q) {
    q = strchr(p, '\n');
    if (q) *q++ = '\0';
    r->names[r->n++] = p;
  }
  return ES_OK;
}

/* Fills err with ES_MOVED: the text for people, the target after it. */
int es_sh_moved(es_err *err, const char *session, const char *target, int64_t version) {
  if (!err) return ES_MOVED;
  if (target)
    es_fail(err, ES_MOVED,
            "session '%s' moved to shard '%s' (shard plan %lld): open the store through shards: "
            "to reach it",
            session, target, (long long)version);
  else
    es_fail(err, ES_MOVED, "session '%s' is being moved into this shard: retry shortly", session);
  if (strlen(err->msg) >= MOVED_TAIL - 1) {
    /* keep the text valid UTF-8 where it is cut */
    size_t cut = MOVED_TAIL - 5;
    while (cut > 0 && ((unsigned char)err->msg[cut] & 0xC0) == 0x80) cut--;
    memcpy(err->msg + cut, "...", 4);
  }
  memset(err->msg + MOVED_TAIL, 0, ES_ERRMSG_MAX - MOVED_TAIL);
  if (target) {
    err->msg[MOVED_TAIL] = '\x01';
    snprintf(err->msg + MOVED_TAIL + 1, ES_MAX_SHARD_NAME_BYTES + 1, "%s", target);
  }
  return ES_MOVED;
}

const char *es_shards_moved_target(const es_err *err) {
  if (!err || err->code != ES_MOVED || err->msg[MOVED_TAIL] != '\x01') return NULL;
  return err->msg + MOVED_TAIL + 1;
}

/* A session row with a marker: ES_MOVED (to the owner by the record). */
static int marked(const es_backend_ops *ops, es_backend *bk, es_txn *t, const char *session,
                  int64_t fence, es_err *err) {
  if (fence == FENCE_INCOMING) return es_sh_moved(err, session, NULL, 0);
  plan_record r;
  int rc = es_sh_record_get(ops, bk, t, &r, err);
  if (rc) return rc;
  const char *target = r.n > 1 ? es_sh_owner_of_names(r.names + 1, r.n - 1, session) : NULL;
  /* A tombstone on the shard the plan now gives the session to: the
   * session may still be on the shard it once moved to, waiting to move
   * back (the caller waits, as for an incoming row); the plan change
   * clears such tombstones once every session is home (clear_tombstones),
   * and then the session is simply absent here. */
  if (fence == FENCE_TOMBSTONE && target && strcmp(target, r.names[0]) == 0) target = NULL;
  rc = es_sh_moved(err, session, target, r.version);
  es_sh_record_destroy(&r);
  return rc;
}

/* A session with no row here: ES_MOVED when this shard's plan record says
 * another shard owns it, else ES_OK. */
static int owner_check(const es_backend_ops *ops, es_backend *bk, es_txn *t, const char *session,
                       es_err *err) {
  if (!session || !*session) return ES_OK;
  plan_record r;
  int rc = es_sh_record_get(ops, bk, t, &r, err);
  if (rc || r.n < 2) {
    es_sh_record_destroy(&r);
    return rc;
  }
  const char *owner = es_sh_owner_of_names(r.names + 1, r.n - 1, session);
  if (owner && strcmp(owner, r.names[0]) != 0) rc = es_sh_moved(err, session, owner, r.version);
  es_sh_record_destroy(&r);
  return rc;
}

/* Whether calls about `session` may run here: ES_OK, ES_MOVED or an error. */
static int session_here(const es_backend_ops *ops, es_backend *bk, es_txn *t, const char *session,
                        es_err *err) {
  es_session_info si;
  int rc = ops->session_get(bk, t, session, &si, err);
  if (rc == ES_NOT_FOUND) return owner_check(ops, bk, t, session, err);
  if (rc) return rc;
  int64_t fence = si.fence;
  es_session_info_destroy(&si);
  return fence < 0 ? marked(ops, bk, t, session, fence, err) : ES_OK;
}

static int w_session_get(const es_backend_ops *ops, es_backend *bk, es_txn *t, const char *session,
                         es_session_info *out, es_err *err) {
  int rc = ops->session_get(bk, t, session, out, err);
  if (rc == ES_NOT_FOUND) {
    int r2 = owner_check(ops, bk, t, session, err);
    return r2 ? r2 : ES_NOT_FOUND;
  }
  if (rc == ES_OK && out->fence < 0) {
    int64_t fence = out->fence;
    es_session_info_destroy(out);
    return marked(ops, bk, t, session, fence, err);
  }
  return rc;
}

/* A frozen event keeps its queue state in `returned` (<= -2). */
int64_t es_sh_encode_frozen(const es_event *row) {
  return -2 - (row->queued ? 1 : 0) - 2 * (row->returned + 1);
}

void es_sh_decode_frozen(es_event *row) {
  if (row->returned > -2) return;
  int64_t x = -2 - row->returned;
  row->queued = (int)(x & 1);
  row->returned = (x >> 1) - 1;
}

static int w_event_get(const es_backend_ops *ops, es_backend *bk, es_txn *t, const char *session,
                       int64_t index, es_event *out, es_err *err) {
  int rc = ops->event_get(bk, t, session, index, out, err);
  if (rc == ES_OK && out->returned > -2) return ES_OK;
  if (rc != ES_OK && rc != ES_NOT_FOUND) return rc;
  int r2 = session_here(ops, bk, t, session, err);
  if (r2 == ES_OK) return rc;
  if (rc == ES_OK) es_event_destroy(out);
  return r2;
}

typedef struct {
  es_session_cb cb;
  void *ctx;
  int64_t seen, passed;
  int stopped;
  char *last; /* owned: the last row's name */
} list_filter;

static int filter_row(void *ctx, const es_session_info *row) {
  list_filter *f = ctx;
  f->seen++;
  free(f->last);
  f->last = strdup(row->session);
  if (!f->last) {
    f->stopped = 1;
    return 1;
  }
  if (row->session[0] == '\0') return 0; /* a shard's plan record is not a session */
  es_session_info shown = *row;
  if (row->fence <= FENCE_FROZEN_BASE) {
    /* being copied away: still listed here (with its own fence) until the
     * copy is in; a merged listing keeps one of the two */
    shown.fence = FENCE_FROZEN_BASE - row->fence;
  } else if (row->fence < 0) {
    return 0; /* a tombstone, or a session being moved in */
  }
  f->passed++;
  if (f->cb(f->ctx, &shown)) {
    f->stopped = 1;
    return 1;
  }
  return 0;
}

/* A listing without the marker rows, still `limit` rows long when more
 * exist: pages past the hidden ones. */
static int w_list(const es_backend_ops *ops, es_backend *bk, int children, es_txn *t,
                  const char *key, const char *after, int64_t limit, es_session_cb cb, void *ctx,
                  es_err *err) {
  list_filter f = {cb, ctx, 0, 0, 0, NULL};
  char *bound = after ? strdup(after) : NULL;
  if (after && !bound) return nomem(err);
  int rc = ES_OK;
  for (;;) {
    int64_t want = limit == ES_NONE ? ES_NONE : limit - f.passed;
    if (want != ES_NONE && want <= 0) break;
    f.seen = 0;
    rc = children ? ops->session_children(bk, t, key, bound, want, filter_row, &f, err)
                  : ops->session_list(bk, t, key, bound, want, filter_row, &f, err);
    if (rc || f.stopped || want == ES_NONE || f.seen < want || !f.last) break;
    free(bound);
    bound = f.last;
    f.last = NULL;
  }
  if (rc == ES_OK && f.stopped && !f.last) rc = nomem(err);
  free(bound);
  free(f.last);
  return rc;
}

static int w_snapshot_list(const es_backend_ops *ops, es_backend *bk, es_txn *t,
                           const char *session, es_snapshot_cb cb, void *ctx, es_err *err) {
  int rc = session_here(ops, bk, t, session, err);
  return rc ? rc : ops->snapshot_list(bk, t, session, cb, ctx, err);
}

static int w_dead_list(const es_backend_ops *ops, es_backend *bk, es_txn *t, const char *session,
                       const char *scope, int64_t after, int64_t limit, es_event_cb cb, void *ctx,
                       es_err *err) {
  int rc = session ? session_here(ops, bk, t, session, err) : ES_OK;
  return rc ? rc : ops->dead_list(bk, t, session, scope, after, limit, cb, ctx, err);
}

static int w_segment_list(const es_backend_ops *ops, es_backend *bk, es_txn *t, const char *session,
                          es_segment_cb cb, void *ctx, es_err *err) {
  int rc = session_here(ops, bk, t, session, err);
  return rc ? rc : ops->segment_list(bk, t, session, cb, ctx, err);
}

/* One set of wrappers per backend: a backend function gets only its
 * transaction, so each wrapper names the table it wraps. */
/* The marker-checking backend (docs/sharding.md): one generic wrapper for
 * every backend. Its es_backend holds the wrapped backend and its ops; each
 * op forwards to them, and the session and event lookups and listings
 * check the move markers on the way (w_*). A new backend is wrapped like
 * the others; a new backend op needs its forwarder here (the static
 * assertion below fails until it has one). */
struct es_backend {
  const es_backend_ops *real; /* the wrapped backend's own table */
  es_backend *inner;          /* the wrapped backend (owned: m_close closes it) */
};

_Static_assert(sizeof(es_backend_ops) ==
                   offsetof(es_backend_ops, proj_drop) + sizeof(void (*)(void)),
               "es_backend_ops has an op after proj_drop: give it a forwarder in marked_ops");

static int m_session_get(es_backend *b, es_txn *t, const char *session, es_session_info *out,
                         es_err *err) {
  return w_session_get(b->real, b->inner, t, session, out, err);
}

static int m_event_get(es_backend *b, es_txn *t, const char *session, int64_t index, es_event *out,
                       es_err *err) {
  return w_event_get(b->real, b->inner, t, session, index, out, err);
}

static int m_session_list(es_backend *b, es_txn *t, const char *prefix, const char *after,
                          int64_t limit, es_session_cb cb, void *ctx, es_err *err) {
  return w_list(b->real, b->inner, 0, t, prefix, after, limit, cb, ctx, err);
}

static int m_session_children(es_backend *b, es_txn *t, const char *parent, const char *after,
                              int64_t limit, es_session_cb cb, void *ctx, es_err *err) {
  return w_list(b->real, b->inner, 1, t, parent, after, limit, cb, ctx, err);
}

static int m_snapshot_list(es_backend *b, es_txn *t, const char *session, es_snapshot_cb cb,
                           void *ctx, es_err *err) {
  return w_snapshot_list(b->real, b->inner, t, session, cb, ctx, err);
}

static int m_dead_list(es_backend *b, es_txn *t, const char *session, const char *scope,
                       int64_t after, int64_t limit, es_event_cb cb, void *ctx, es_err *err) {
  return w_dead_list(b->real, b->inner, t, session, scope, after, limit, cb, ctx, err);
}

static int m_segment_list(es_backend *b, es_txn *t, const char *session, es_segment_cb cb,
                          void *ctx, es_err *err) {
  return w_segment_list(b->real, b->inner, t, session, cb, ctx, err);
}

/* Listing only: a moved session's rows are the mover's to clean up. */
static int m_segment_sessions(es_backend *b, es_txn *t, const char *prefix, const char *after,
                              int64_t limit,
                              int (*cb)(void *ctx, const char *session, int64_t through),
                              void *ctx, es_err *err) {
  return b->real->segment_sessions(b->inner, t, prefix, after, limit, cb, ctx, err);
}

static void m_close(es_backend *b) {
  b->real->close(b->inner);
  free(b);
}

static int m_write_begin(es_backend *b, es_txn **t, es_err *err) {
  return b->real->write_begin(b->inner, t, err);
}

static int m_write_commit(es_backend *b, es_txn *t, es_err *err) {
  return b->real->write_commit(b->inner, t, err);
}

static void m_write_rollback(es_backend *b, es_txn *t) {
  b->real->write_rollback(b->inner, t);
}

static int m_savepoint(es_backend *b, es_txn *t, es_err *err) {
  return b->real->savepoint(b->inner, t, err);
}

static int m_savepoint_release(es_backend *b, es_txn *t, es_err *err) {
  return b->real->savepoint_release(b->inner, t, err);
}

static void m_savepoint_rollback(es_backend *b, es_txn *t) {
  b->real->savepoint_rollback(b->inner, t);
}

static int m_read_begin(es_backend *b, es_txn **t, es_err *err) {
  return b->real->read_begin(b->inner, t, err);
}

static void m_read_end(es_backend *b, es_txn *t) {
  b->real->read_end(b->inner, t);
}

static int m_session_put(es_backend *b, es_txn *t, const es_session_info *row, es_err *err) {
  return b->real->session_put(b->inner, t, row, err);
}

static int m_event_get_by_id(es_backend *b, es_txn *t, const char *id, es_event *out, es_err *err) {
  return b->real->event_get_by_id(b->inner, t, id, out, err);
}

static int m_event_insert(es_backend *b, es_txn *t, es_event *row, es_err *err) {
  return b->real->event_insert(b->inner, t, row, err);
}

static int m_event_update(es_backend *b, es_txn *t, const es_event *row, es_err *err) {
  return b->real->event_update(b->inner, t, row, err);
}

static int m_event_complete(es_backend *b, es_txn *t, const char *session, int64_t index,
                            int64_t attempt, int64_t returned, int64_t now, int *done, es_err *err) {
  return b->real->event_complete(b->inner, t, session, index, attempt, returned, now, done, err);
}

static int m_event_copy(es_backend *b, es_txn *t, const char *from, int64_t through, const char *to,
                        int64_t processed_at, es_id_fn new_id, void *id_ctx, int64_t *copied,
                        es_err *err) {
  return b->real->event_copy(b->inner, t, from, through, to, processed_at, new_id, id_ctx, copied,
      err);
}

static int m_event_range(es_backend *b, es_txn *t, const char *session, int64_t after,
                         int64_t through, int64_t limit, es_event_cb cb, void *ctx, es_err *err) {
  return b->real->event_range(b->inner, t, session, after, through, limit, cb, ctx, err);
}

static int m_event_all(es_backend *b, es_txn *t, const char *scope, int64_t after, int64_t limit,
                       es_event_cb cb, void *ctx, es_err *err) {
  return b->real->event_all(b->inner, t, scope, after, limit, cb, ctx, err);
}

static int m_last_position(es_backend *b, es_txn *t, int64_t *position, es_err *err) {
  return b->real->last_position(b->inner, t, position, err);
}

static int m_lane_next(es_backend *b, es_txn *t, const char *session, const char *lane,
                       int64_t after, int64_t *index, es_err *err) {
  return b->real->lane_next(b->inner, t, session, lane, after, index, err);
}

static int m_queued_due(es_backend *b, es_txn *t, const char *session, const char *scope,
                        int64_t now, int64_t limit, es_event_cb cb, void *ctx, es_err *err) {
  return b->real->queued_due(b->inner, t, session, scope, now, limit, cb, ctx, err);
}

static int m_queued_next_due(es_backend *b, es_txn *t, const char *session, const char *scope,
                             int64_t now, int64_t *due, es_err *err) {
  return b->real->queued_next_due(b->inner, t, session, scope, now, due, err);
}

static int m_queued_due_type(es_backend *b, es_txn *t, const char *scope, const char *type,
                             int64_t now, int64_t limit, es_event_cb cb, void *ctx, es_err *err) {
  return b->real->queued_due_type(b->inner, t, scope, type, now, limit, cb, ctx, err);
}

static int m_queued_next_due_type(es_backend *b, es_txn *t, const char *scope, const char *type,
                                  int64_t now, int64_t *due, es_err *err) {
  return b->real->queued_next_due_type(b->inner, t, scope, type, now, due, err);
}

static int m_pending_types(es_backend *b, es_txn *t, const char *scope, es_type_count_cb cb,
                           void *ctx, es_err *err) {
  return b->real->pending_types(b->inner, t, scope, cb, ctx, err);
}

static int m_snapshot_get(es_backend *b, es_txn *t, const char *session, const char *reducer,
                          es_snapshot *out, es_err *err) {
  return b->real->snapshot_get(b->inner, t, session, reducer, out, err);
}

static int m_snapshot_put(es_backend *b, es_txn *t, const char *session, const es_snapshot *row,
                          es_err *err) {
  return b->real->snapshot_put(b->inner, t, session, row, err);
}

static int m_ref_get(es_backend *b, es_txn *t, const char *name, es_ref *out, es_err *err) {
  return b->real->ref_get(b->inner, t, name, out, err);
}

static int m_ref_put(es_backend *b, es_txn *t, const es_ref *row, es_err *err) {
  return b->real->ref_put(b->inner, t, row, err);
}

static int m_ref_delete(es_backend *b, es_txn *t, const char *name, es_err *err) {
  return b->real->ref_delete(b->inner, t, name, err);
}

static int m_ref_list(es_backend *b, es_txn *t, const char *after, int64_t limit, es_ref_cb cb,
                      void *ctx, es_err *err) {
  return b->real->ref_list(b->inner, t, after, limit, cb, ctx, err);
}

static int m_presence_get(es_backend *b, es_txn *t, const char *ns, const char *participant,
                          const char *field, es_presence_row *out, es_err *err) {
  return b->real->presence_get(b->inner, t, ns, participant, field, out, err);
}

static int m_presence_put(es_backend *b, es_txn *t, const char *ns, const es_presence_row *row,
                          es_err *err) {
  return b->real->presence_put(b->inner, t, ns, row, err);
}

static int m_presence_expire(es_backend *b, es_txn *t, const char *ns, int64_t now, es_err *err) {
  return b->real->presence_expire(b->inner, t, ns, now, err);
}

static int m_presence_list(es_backend *b, es_txn *t, const char *ns, int64_t now,
                           es_presence_cb_row cb, void *ctx, es_err *err) {
  return b->real->presence_list(b->inner, t, ns, now, cb, ctx, err);
}

static int m_event_delete_range(es_backend *b, es_txn *t, const char *session, int64_t through,
                                es_err *err) {
  return b->real->event_delete_range(b->inner, t, session, through, err);
}

static int m_session_delete(es_backend *b, es_txn *t, const char *session, es_err *err) {
  return b->real->session_delete(b->inner, t, session, err);
}

static int m_fence_floor_get(es_backend *b, es_txn *t, const char *session, int64_t *token,
                             es_err *err) {
  return b->real->fence_floor_get(b->inner, t, session, token, err);
}

static int m_fence_floor_put(es_backend *b, es_txn *t, const char *session, int64_t token,
                             es_err *err) {
  return b->real->fence_floor_put(b->inner, t, session, token, err);
}

static int m_snapshot_delete_all(es_backend *b, es_txn *t, const char *session, es_err *err) {
  return b->real->snapshot_delete_all(b->inner, t, session, err);
}

static int m_ref_delete_session(es_backend *b, es_txn *t, const char *session, es_err *err) {
  return b->real->ref_delete_session(b->inner, t, session, err);
}

static int m_segment_put(es_backend *b, es_txn *t, const char *session, const es_segment *row,
                         es_err *err) {
  return b->real->segment_put(b->inner, t, session, row, err);
}

static int m_segment_delete(es_backend *b, es_txn *t, const char *session, int64_t from,
                            es_err *err) {
  return b->real->segment_delete(b->inner, t, session, from, err);
}

static int m_key_get(es_backend *b, es_txn *t, const char *name, es_key_row *out, es_err *err) {
  return b->real->key_get(b->inner, t, name, out, err);
}

static int m_key_put(es_backend *b, es_txn *t, const es_key_row *row, es_err *err) {
  return b->real->key_put(b->inner, t, row, err);
}

static int m_key_use_put(es_backend *b, es_txn *t, const char *key, const char *session,
                         int64_t first_index, es_err *err) {
  return b->real->key_use_put(b->inner, t, key, session, first_index, err);
}

static int m_key_use_list(es_backend *b, es_txn *t, const char *key, es_key_use_cb cb, void *ctx,
                          es_err *err) {
  return b->real->key_use_list(b->inner, t, key, cb, ctx, err);
}

static int m_key_use_delete_session(es_backend *b, es_txn *t, const char *session, es_err *err) {
  return b->real->key_use_delete_session(b->inner, t, session, err);
}

static int m_snapshot_delete_from(es_backend *b, es_txn *t, const char *session, int64_t index,
                                  es_err *err) {
  return b->real->snapshot_delete_from(b->inner, t, session, index, err);
}

static int m_scrub(es_backend *b, es_err *err) {
  return b->real->scrub(b->inner, err);
}

static int m_data_version(es_backend *b, uint64_t *version, es_err *err) {
  return b->real->data_version(b->inner, version, err);
}

static int m_claim_begin(es_backend *b, const char *const *skip, size_t n_skip, es_txn **t,
                         es_err *err) {
  return b->real->claim_begin(b->inner, skip, n_skip, t, err);
}

static size_t m_max_payload(es_backend *b) { return b->real->max_payload(b->inner); }

static int m_claim_retry(es_backend *b, es_txn *t) {
  return b->real->claim_retry(b->inner, t);
}

static int m_wait_change(es_backend *b, uint64_t since, int64_t timeout_ms, es_err *err) {
  return b->real->wait_change(b->inner, since, timeout_ms, err);
}

static int m_ext_version(es_backend *b, uint64_t *version, es_err *err) {
  return b->real->ext_version(b->inner, version, err);
}

static void m_kick(es_backend *b) { b->real->kick(b->inner); }

static void m_wake(es_backend *b) {
  b->real->wake(b->inner);
}

static int m_release_commit(es_backend *b, es_txn *t, es_err *err) {
  return b->real->release_commit(b->inner, t, err);
}

static int m_claim_ready(es_backend *b, es_txn *t, const char *scope, const char *type, int64_t now,
                         int64_t limit, es_event_cb cb, void *ctx, int64_t *next_due, es_err *err) {
  return b->real->claim_ready(b->inner, t, scope, type, now, limit, cb, ctx, next_due, err);
}

static int m_session_claimed(es_backend *b, es_txn *t, const char *session, int64_t n, int64_t now,
                             es_err *err) {
  return b->real->session_claimed(b->inner, t, session, n, now, err);
}

static int m_claim_commit(es_backend *b, es_txn *t, int *retry, es_err *err) {
  return b->real->claim_commit(b->inner, t, retry, err);
}

static int m_counts(es_backend *b, es_txn *t, const char *scope, es_counts *out, es_err *err) {
  return b->real->counts(b->inner, t, scope, out, err);
}

static int m_event_insert_many(es_backend *b, es_txn *t, es_event *rows, size_t n, es_err *err) {
  return b->real->event_insert_many(b->inner, t, rows, n, err);
}

static int m_read_ahead(es_backend *b, es_txn *t, const char *const *sessions,
                        const int64_t *indexes, size_t n, const char *const *ids, size_t n_ids,
                        es_err *err) {
  return b->real->read_ahead(b->inner, t, sessions, indexes, n, ids, n_ids, err);
}

static int m_lazy_begin(es_backend *b) {
  return b->real->lazy_begin(b->inner);
}

static void m_lazy_end(es_backend *b) {
  b->real->lazy_end(b->inner);
}

static int m_backup(es_backend *b, const char *to, es_err *err) {
  return b->real->backup(b->inner, to, err);
}

/* §8: projection rows are not a session's: nothing to check on the way. */
static int m_proj_get(es_backend *b, es_txn *t, const char *ns, const char *key, char **value,
                      size_t *len, es_err *err) {
  return b->real->proj_get(b->inner, t, ns, key, value, len, err);
}

static int m_proj_put(es_backend *b, es_txn *t, const char *ns, const char *key, const char *value,
                      size_t len, es_err *err) {
  return b->real->proj_put(b->inner, t, ns, key, value, len, err);
}

static int m_proj_list(es_backend *b, es_txn *t, const char *ns, const char *prefix,
                       const char *after, int64_t limit, es_proj_cb cb, void *ctx, es_err *err) {
  return b->real->proj_list(b->inner, t, ns, prefix, after, limit, cb, ctx, err);
}

static int m_proj_drop(es_backend *b, es_txn *t, const char *ns, es_err *err) {
  return b->real->proj_drop(b->inner, t, ns, err);
}

/* Fills o (a copy of the wrapped backend's table: its scheme, flags and
 * the ops it lacks stay) with the forwarders. */
static void marked_ops(es_backend_ops *o) {
  o->open = NULL; /* the wrapper is made around an opened backend */
  if (o->close) o->close = m_close;
  if (o->write_begin) o->write_begin = m_write_begin;
  if (o->write_commit) o->write_commit = m_write_commit;
  if (o->write_rollback) o->write_rollback = m_write_rollback;
  if (o->savepoint) o->savepoint = m_savepoint;
  if (o->savepoint_release) o->savepoint_release = m_savepoint_release;
  if (o->savepoint_rollback) o->savepoint_rollback = m_savepoint_rollback;
  if (o->read_begin) o->read_begin = m_read_begin;
  if (o->read_end) o->read_end = m_read_end;
  if (o->session_get) o->session_get = m_session_get;
  if (o->session_put) o->session_put = m_session_put;
  if (o->session_list) o->session_list = m_session_list;
  if (o->session_children) o->session_children = m_session_children;
  if (o->event_get) o->event_get = m_event_get;
  if (o->event_get_by_id) o->event_get_by_id = m_event_get_by_id;
  if (o->event_insert) o->event_insert = m_event_insert;
  if (o->event_update) o->event_update = m_event_update;
  if (o->event_complete) o->event_complete = m_event_complete;
  if (o->event_copy) o->event_copy = m_event_copy;
  if (o->event_range) o->event_range = m_event_range;
  if (o->event_all) o->event_all = m_event_all;
  if (o->last_position) o->last_position = m_last_position;
  if (o->lane_next) o->lane_next = m_lane_next;
  if (o->queued_due) o->queued_due = m_queued_due;
  if (o->queued_next_due) o->queued_next_due = m_queued_next_due;
  if (o->queued_due_type) o->queued_due_type = m_queued_due_type;
  if (o->queued_next_due_type) o->queued_next_due_type = m_queued_next_due_type;
  if (o->pending_types) o->pending_types = m_pending_types;
  if (o->dead_list) o->dead_list = m_dead_list;
  if (o->snapshot_get) o->snapshot_get = m_snapshot_get;
  if (o->snapshot_put) o->snapshot_put = m_snapshot_put;
  if (o->snapshot_list) o->snapshot_list = m_snapshot_list;
  if (o->ref_get) o->ref_get = m_ref_get;
  if (o->ref_put) o->ref_put = m_ref_put;
  if (o->ref_delete) o->ref_delete = m_ref_delete;
  if (o->ref_list) o->ref_list = m_ref_list;
  if (o->presence_get) o->presence_get = m_presence_get;
  if (o->presence_put) o->presence_put = m_presence_put;
  if (o->presence_expire) o->presence_expire = m_presence_expire;
  if (o->presence_list) o->presence_list = m_presence_list;
  if (o->event_delete_range) o->event_delete_range = m_event_delete_range;
  if (o->session_delete) o->session_delete = m_session_delete;
  if (o->fence_floor_get) o->fence_floor_get = m_fence_floor_get;
  if (o->fence_floor_put) o->fence_floor_put = m_fence_floor_put;
  if (o->snapshot_delete_all) o->snapshot_delete_all = m_snapshot_delete_all;
  if (o->ref_delete_session) o->ref_delete_session = m_ref_delete_session;
  if (o->segment_list) o->segment_list = m_segment_list;
  if (o->segment_put) o->segment_put = m_segment_put;
  if (o->segment_delete) o->segment_delete = m_segment_delete;
  if (o->segment_sessions) o->segment_sessions = m_segment_sessions;
  if (o->key_get) o->key_get = m_key_get;
  if (o->key_put) o->key_put = m_key_put;
  if (o->key_use_put) o->key_use_put = m_key_use_put;
  if (o->key_use_list) o->key_use_list = m_key_use_list;
  if (o->key_use_delete_session) o->key_use_delete_session = m_key_use_delete_session;
  if (o->snapshot_delete_from) o->snapshot_delete_from = m_snapshot_delete_from;
  if (o->scrub) o->scrub = m_scrub;
  if (o->data_version) o->data_version = m_data_version;
  if (o->claim_begin) o->claim_begin = m_claim_begin;
  if (o->claim_retry) o->claim_retry = m_claim_retry;
  if (o->wait_change) o->wait_change = m_wait_change;
  if (o->ext_version) o->ext_version = m_ext_version;
  if (o->kick) o->kick = m_kick;
  if (o->wake) o->wake = m_wake;
  if (o->release_commit) o->release_commit = m_release_commit;
  if (o->claim_ready) o->claim_ready = m_claim_ready;
  if (o->session_claimed) o->session_claimed = m_session_claimed;
  if (o->claim_commit) o->claim_commit = m_claim_commit;
  if (o->counts) o->counts = m_counts;
  if (o->event_insert_many) o->event_insert_many = m_event_insert_many;
  if (o->read_ahead) o->read_ahead = m_read_ahead;
  if (o->lazy_begin) o->lazy_begin = m_lazy_begin;
  if (o->lazy_end) o->lazy_end = m_lazy_end;
  if (o->backup) o->backup = m_backup;
  if (o->max_payload) o->max_payload = m_max_payload;
  if (o->proj_get) o->proj_get = m_proj_get;
  if (o->proj_put) o->proj_put = m_proj_put;
  if (o->proj_list) o->proj_list = m_proj_list;
  if (o->proj_drop) o->proj_drop = m_proj_drop;
}

int es_shards_wrap_ops(es_store *s, es_err *err) {
  es_backend *m = malloc(sizeof *m);
  if (!m) return nomem(err);
  m->real = s->ops;
  m->inner = s->bk;
  s->real_ops = s->ops;
  s->real_bk = s->bk;
  s->own_ops = *s->ops;
  marked_ops(&s->own_ops);
  s->ops = &s->own_ops;
  s->bk = m;
  return ES_OK;
}
