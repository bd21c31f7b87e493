/*
 * store.c: the core store, one of the three implementations of the store
 * interface (store_impl.h): its handle's lifecycle and its table of
 * operations, es_core_ops. Every rule of §3 is written once for all
 * backends, in the files of the rules by area (rules.h lists them).
 *
 * A call validates its arguments, reads the clock once, and runs its work
 * as one function inside a backend transaction (es_core_write /
 * es_core_read, group.c).
 * Backends only store and find rows (backend.h); this file decides every
 * value they store, including the dispatch bookkeeping:
 *
 *   queued  the event is a dispatch candidate: pending, not dead, and (if
 *           laned) the oldest unprocessed event of its lane.
 *   due_at  for a queued event, the time it is (or becomes) ready: the end
 *           of its live claim, its not_before, or its backoff end. An event
 *           is ready exactly when queued and due_at <= now, so "claim" and
 *           "claim_next" are index lookups, never scans.
 *
 * Where each part lives: names and text are checked in names.c;
 * transactions and the group commit run in group.c; event ids are made
 * in ids.c; the rules are in append.c (§3.1 append and read, waiting),
 * dispatch.c (§3.2-§3.3), snapshots.c (§3.4-§3.5), presence.c (§3.6),
 * branches.c (§3.7), fences.c (§3.8), retention.c (§3.9), archive.c
 * (§3.9 segments), crypto.c (§3.10) and stats.c (§3.12).
 *
 * Group commit (backends with group_commit = 1; group.c): writers
 * queue their work, and one of them, the leader, runs every queued
 * caller's work in one transaction, each in its own savepoint, and commits
 * once (one sync) for all, who return only after that commit; a failed
 * commit fails them all.
 */
#include "store/store.h"

#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "store/backend.h"
#include "store/internal.h"
#include "store/rules.h"
#include "store/crypto.h"
#include "codec/json.h"

/* ---------------------------------------------------------------------- */
/* small helpers */

int es_timer_not_before(const char *what, int64_t now, int has_delay, int64_t delay_ms,
                        int has_at, int64_t at, int64_t *not_before, es_err *err) {
  if (!what) what = "event";
  *not_before = ES_NONE;
  if (has_delay && has_at)
    return es_fail(err, ES_INVALID_ARGUMENT, "%s has both delay_ms and at (give one)", what);
  if (has_at) {
    if (at < 0) return es_fail(err, ES_INVALID_ARGUMENT, "%s.at must be >= 0", what);
    *not_before = at;
  }
  if (has_delay) {
    if (delay_ms < 0) return es_fail(err, ES_INVALID_ARGUMENT, "%s.delay_ms must be >= 0", what);
    if (add_time(now, delay_ms, not_before)) {
      *not_before = ES_NONE;
      return es_fail(err, ES_INVALID_ARGUMENT,
                     "%s.delay_ms is too large: now + delay_ms is beyond the largest time (%lld)",
                     what, (long long)INT64_MAX);
    }
  }
  return ES_OK;
}


/* ---------------------------------------------------------------------- */
/* lifecycle */

/* The fields and locks every handle has (a store, a sharded store),
 * from the open options; es_core_handle_destroy undoes the locks. */
void es_core_handle_init(es_store *s, const es_open_opts *opts) {
  s->clock = opts->clock ? opts->clock : es_clock_system;
  s->clock_ctx = opts->clock_ctx;
  s->ids = opts->ids;
  s->ids_ctx = opts->ids_ctx;
  s->max_payload = opts->max_payload_bytes ? opts->max_payload_bytes : ES_DEFAULT_MAX_PAYLOAD;
  s->max_stored = SIZE_MAX;
  s->max_batch = opts->max_batch_events ? opts->max_batch_events : ES_DEFAULT_MAX_BATCH;
  pthread_mutex_init(&s->lmu, NULL);
  pthread_cond_init(&s->lcond, NULL);
  pthread_mutex_init(&s->wmu, NULL);
  pthread_mutex_init(&s->dmu, NULL);
  es_core_group_init(s);
  pthread_mutex_init(&s->vmu, NULL);
  pthread_mutex_init(&s->emu, NULL);
  pthread_mutex_init(&s->umu, NULL);
  pthread_mutex_init(&s->pmu, NULL);
  atomic_init(&s->refs, 1);
  atomic_init(&s->version, 0);
  s->next_token = 1;
  s->rand_used = sizeof s->rand_pool;
}

void es_core_handle_destroy(es_store *s) {
  pthread_mutex_destroy(&s->lmu);
  pthread_cond_destroy(&s->lcond);
  pthread_mutex_destroy(&s->wmu);
  pthread_mutex_destroy(&s->dmu);
  pthread_mutex_destroy(&s->qmu);
  pthread_cond_destroy(&s->qcond);
  pthread_mutex_destroy(&s->vmu);
  pthread_mutex_destroy(&s->emu);
  free(s->touched);
  pthread_mutex_destroy(&s->umu);
  pthread_mutex_destroy(&s->pmu);
}

/* The core store over `ops` (front.c's table of schemes: memory:,
 * sqlite:, postgres://); rest is the URL after "scheme:". wrap, when
 * given, may wrap the backend once it is open, before anything uses it
 * (front.c: the shard router's move markers, docs/sharding.md). */
int es_core_open(const es_backend_ops *ops, int (*wrap)(es_store *s, es_err *err),
                 const char *rest, const es_open_opts *opts, es_store **out, es_err *err) {
  es_store *s = calloc(1, sizeof *s);
  if (!s) return nomem(err);
  s->impl = &es_core_ops;
  s->ops = ops;
  es_core_handle_init(s, opts);
  /* §3.10: a store with keys has the backend overwrite what it deletes, so
   * a shredded key or a dropped snapshot does not linger in free space. */
  es_open_opts bo = *opts;
  if (opts->keys_path) bo.secure_delete = 1;
  int rc = ops->open(rest, &bo, &s->bk, err);
  /* max_payload_bytes never promises more than the backend stores */
  if (rc == ES_OK && ops->max_payload) s->max_stored = ops->max_payload(s->bk);
  if (s->max_payload > s->max_stored) s->max_payload = s->max_stored;
  if (rc == ES_OK && wrap) rc = wrap(s, err);
  if (rc == ES_OK) rc = es_archive_setup(s, ops->scheme, rest, opts, err); /* §3.9 */
  if (rc == ES_OK && opts->keys_path) rc = es_crypto_open(s, opts->keys_path, err);
  if (rc != ES_OK) {
    if (s->bk) {
      s->ops->close(s->bk);
      s->bk = NULL;
    }
    s->closed = 1;
    es_core_free(s);
    return rc;
  }
  *out = s;
  return ES_OK;
}

void es_core_close(es_store *s) {
  pthread_mutex_lock(&s->lmu);
  if (s->closed) {
    pthread_mutex_unlock(&s->lmu);
    return;
  }
  s->closed = 1;
  if (s->ops->wake) s->ops->wake(s->bk); /* a wait blocked in the backend returns now */
  while (s->inflight > 0) pthread_cond_wait(&s->lcond, &s->lmu);
  pthread_mutex_unlock(&s->lmu);
  es_core_ext_stop(s); /* its next enter fails: it ends */
  /* No call is in flight, so no group transaction is open. */
  s->ops->close(s->bk);
  s->bk = NULL;
  es_core_notify_commit(s, -1); /* wake every wait so it sees CLOSED */
}

/* The last reference went (es_store_release). */
void es_core_free(es_store *s) {
  es_core_close(s);
  es_presence_ext_free(s);
  presence_watch *w = s->watches;
  while (w) {
    presence_watch *next = w->next;
    free(w->ns);
    free(w);
    w = next;
  }
  es_core_handle_destroy(s);
  es_stats_destroy(&s->stats); /* §3.12 */
  es_archive_teardown(s); /* §3.9 */
  es_crypto_free(s->crypto);
  free(s);
}

/* Every call is bracketed by enter/leave so close() can wait for it. */
int es_core_enter(es_store *s, es_err *err) {
  pthread_mutex_lock(&s->lmu);
  if (s->closed) {
    pthread_mutex_unlock(&s->lmu);
    return es_fail(err, ES_CLOSED, "the store is closed");
  }
  s->inflight++;
  pthread_mutex_unlock(&s->lmu);
  return ES_OK;
}

void es_core_leave(es_store *s) {
  pthread_mutex_lock(&s->lmu);
  if (--s->inflight == 0) pthread_cond_broadcast(&s->lcond);
  pthread_mutex_unlock(&s->lmu);
}

int es_core_check_open(es_store *s, es_err *err) {
  int rc = es_core_enter(s, err);
  if (rc == ES_OK) es_core_leave(s);
  return rc;
}

uint64_t es_core_version(es_store *s) { return atomic_load(&s->version); }

int es_core_data_version(es_store *s, uint64_t *version, es_err *err) {
  *version = 0;
  if (!s->ops->data_version) return ES_OK;
  int rc = es_core_enter(s, err);
  if (rc) return rc;
  rc = s->ops->data_version(s->bk, version, err);
  es_core_leave(s);
  return rc;
}

/* §3.1 capabilities: what the backend and the open options give. A
 * memory: store lives and dies with its process; sqlite: and postgres:
 * are durable and shared by processes (docs/store.md). */
static int es_core_capabilities(es_store *s, es_capabilities *out, es_err *err) {
  int rc = es_core_check_open(s, err);
  if (rc) return rc;
  const es_backend_ops *b = s->real_ops ? s->real_ops : s->ops;
  out->backend = b == &es_backend_postgresql ? es_backend_postgres.scheme : b->scheme;
  out->durable = out->processes = b != &es_backend_memory;
  out->keys = s->crypto != NULL;
  out->archive = s->archive_dir != NULL;
  return ES_OK;
}

/* ---------------------------------------------------------------------- */
/* transactions */

/* ---------------------------------------------------------------------- */
/* the core store's table of operations (store_impl.h) */

const es_store_ops es_core_ops = {
    .close = es_core_close,
    .free = es_core_free,
    .check_open = es_core_check_open,
    .version = es_core_version,
    .data_version = es_core_data_version,
    .new_id = es_core_new_id,
    .tenant = es_tenant_open,
    .tenant_name = NULL,
    .append = es_core_append,
    .append_many = es_core_append_many,
    .read = es_core_read_events,
    .events_page = es_core_events_page,
    .head = es_core_head,
    .read_all = es_core_read_all,
    .read_all_cursor = es_core_read_all_cursor,
    .last_position = es_core_last_position,
    .get = es_core_get,
    .claim = es_core_claim,
    .claim_next = es_core_claim_next,
    .renew = es_core_renew,
    .release_claims = es_core_release_claims,
    .complete = es_core_complete,
    .complete_many = es_core_complete_many,
    .complete_cancel = es_core_complete_cancel,
    .fail = es_core_fail,
    .revive = es_core_revive,
    .settle = es_core_settle,
    .cancel = es_core_cancel,
    .dead_letters = es_core_dead_letters,
    .read_state = es_core_read_state,
    .read_states = es_core_read_states,
    .put_snapshot = es_core_put_snapshot,
    .snapshots = es_core_snapshots,
    .sessions = es_core_sessions,
    .pending_types = es_core_pending_types,
    .wait = es_core_wait,
    .presence_set = es_core_presence_set,
    .presence_read = es_core_presence_read,
    .presence_watch = es_core_presence_watch,
    .presence_unwatch = es_core_presence_unwatch,
    .fork = es_core_fork,
    .lineage = es_core_lineage,
    .children = es_core_children,
    .put_ref = es_core_put_ref,
    .get_ref = es_core_get_ref,
    .list_refs = es_core_list_refs,
    .delete_ref = es_core_delete_ref,
    .promote = es_core_promote,
    .fence = es_core_fence,
    .lease = es_core_lease,
    .lease_release = es_core_lease_release,
    .seal = es_core_seal,
    .truncate = es_core_truncate,
    .delete = es_core_delete,
    .archive = es_core_archive,
    .segments = es_core_segments,
    .archived = es_core_archived,
    .compact_archive = es_core_compact_archive,
    .verify_archive = es_core_verify_archive,
    .shred = es_core_shred,
    .read_at_rest = es_core_read_at_rest,
    .counts = es_core_counts,
    .capabilities = es_core_capabilities,
    .projection_read = es_core_projection_read,
    .projection_keys = es_core_projection_keys,
    .projections = es_core_projections,
    .projection_commit = es_core_projection_commit,
    .projection_control = es_core_projection_control,
};
