/*
 * backend.h: the row-level interface a storage backend implements.
 *
 * A backend stores and finds rows; it knows no rule of the contract. The
 * core (core/store/) decides every value it writes (indexes, statuses, the
 * `queued`/`due_at` dispatch bookkeeping) and calls these functions inside
 * a transaction it opened. Where a backend keeps an answer derived from
 * rows (the counts, a copied event's dispatch record), the rule is the
 * core's, written once (store/counts.h, es_event_settle_copy, the SQL
 * fragments of store/backend_sql.h) and only applied here. Every op takes
 * its backend first (b), so a wrapper of a backend can pass its inner one
 * on; row ops then take the transaction they run in. Where a database can do something faster (an
 * index, a partial index) the backend may, as long as the answers are the
 * ones specified here.
 *
 * Locking: the core serialises write transactions itself (one at a time per
 * store handle). Read transactions may run concurrently with each other and
 * with a write transaction; a read transaction must see only committed data
 * (a backend may implement that by simply serialising reads with writes).
 *
 * All functions return ES_OK or an es code with err filled; ES_NOT_FOUND
 * means "no such row" and needs no message. Rows passed to callbacks are
 * borrowed for the duration of the callback; a callback returns nonzero to
 * stop the iteration early (not an error).
 */
#ifndef ES_BACKEND_H
#define ES_BACKEND_H

#include <stdlib.h>
#include <string.h>

#include "store/store.h"

typedef int (*es_event_cb)(void *ctx, const es_event *row);
typedef int (*es_session_cb)(void *ctx, const es_session_info *row);
typedef int (*es_snapshot_cb)(void *ctx, const es_snapshot *row);
typedef int (*es_presence_cb_row)(void *ctx, const es_presence_row *row);
/* One event type and how many of its events are pending. */
typedef int (*es_type_count_cb)(void *ctx, const char *type, int64_t pending);
typedef int (*es_ref_cb)(void *ctx, const es_ref *row);
typedef int (*es_segment_cb)(void *ctx, const es_segment *row);
/* §8: one projection row (key, value bytes), borrowed for the callback. */
typedef int (*es_proj_cb)(void *ctx, const char *key, const char *value, size_t len);
/* §3.10: one session holding events under a key, from first_index on. */
typedef int (*es_key_use_cb)(void *ctx, const char *session, int64_t first_index);

/* §3.10: a data key as stored. The row named "" is the master key's check
 * (crypto.c). Owned strings; es_key_row_destroy frees them. */
typedef struct es_key_row {
  char *name;
  unsigned char *wrapped;  /* the data key sealed by the master key; NULL: shredded */
  size_t wrapped_len;
  int64_t created_at;
  int64_t shredded_at;     /* ES_NONE: live */
} es_key_row;
void es_key_row_destroy(es_key_row *k);

/* The dispatch record of a copied event (fork: settled at processed_at,
 * status PROCESSED, returned -1, every other dispatch field empty, not
 * queued), written over e's; the one definition event_copy follows. e's
 * last_error and claim_holder become NULL, not freed: e is a row being
 * built (es_event_init) or borrowing its strings. */
void es_event_settle_copy(es_event *e, int64_t processed_at);

/* The dispatch record of an event completed by `attempt` at `now` with
 * `returned` results (§3.2 complete): status PROCESSED, processed_at,
 * processed_by_attempt and returned set; claim_holder, claim_expires_at,
 * retry_at and due_at empty, not queued; attempts, failures, last_error
 * and the claim and failure times kept. Written over e's; claim_holder
 * becomes NULL, not freed (as es_event_settle_copy). The core's
 * completion writes it; event_complete spells it in SQL (backend_sql.h
 * ES_SQL_COMPLETED), checked against this by spec/c/backend_test.c. */
void es_event_complete_record(es_event *e, int64_t now, int64_t attempt, int64_t returned);

/* §8 proj_list's key range as bytes, for a backend whose index is ordered
 * by bytes (SQL): rows with lower <= key < upper (*ulen 0: no upper bound).
 * Keys hold no NUL, so `after` + NUL is the least key > after. lower and
 * upper: malloc'd (free both); ES_STORAGE when out of memory. Written once
 * here so that the SQL backends agree with the memory one's walk. */
static inline int es_proj_range(const char *prefix, const char *after, char **lower, size_t *llen,
                                char **upper, size_t *ulen) {
  size_t pl = prefix ? strlen(prefix) : 0, al = after ? strlen(after) : 0;
  *lower = malloc(pl + al + 2);
  *upper = malloc(pl + 1);
  if (!*lower || !*upper) {
    free(*lower);
    free(*upper);
    *lower = *upper = NULL;
    return ES_STORAGE;
  }
  if (after && (!prefix || strcmp(after, prefix) >= 0)) {
    memcpy(*lower, after, al + 1);
    *llen = al + 1; /* with its NUL: strictly after */
  } else {
    memcpy(*lower, prefix ? prefix : "", pl + 1);
    *llen = pl;
  }
  /* The least string above every string starting with prefix: prefix
   * with trailing 0xff bytes dropped and its last byte + 1. */
  size_t n = pl;
  while (n > 0 && (unsigned char)prefix[n - 1] == 0xff) n--;
  if (n) memcpy(*upper, prefix, n), (*upper)[n - 1] = (char)((unsigned char)prefix[n - 1] + 1);
  *ulen = n;
  return ES_OK;
}

typedef struct es_backend es_backend;  /* a backend's own state, opaque to the core */
/* A transaction (read or write) of a backend, opaque to the core. Row
 * functions take the transaction they run in; a read transaction and a
 * write transaction may be live at once on different threads. */
typedef struct es_txn es_txn;

typedef struct es_backend_ops {
  const char *scheme;  /* URL scheme without ':', e.g. "memory", "sqlite" */
  /* 1: a write transaction may stay open across several callers' work and
   * commit once for all (group commit; worth it when commit is an fsync).
   * 0: the core commits at the end of every call. */
  int group_commit;

  /* url_rest: the URL after "scheme:". Returns the backend in *out. */
  int (*open)(const char *url_rest, const es_open_opts *opts, es_backend **out, es_err *err);
  void (*close)(es_backend *b);

  /* Transactions. A write transaction contains savepoints: the core wraps
   * each caller's work in savepoint/release so that one caller's failure
   * rolls back only its own rows while the batch goes on. The core writes
   * nothing in a write transaction before its first savepoint, and a
   * backend may rely on that: PostgreSQL's first savepoint of a transaction
   * is virtual (rolling it back rolls back the transaction, which holds
   * nothing else then). */
  int (*write_begin)(es_backend *b, es_txn **t, es_err *err);
  int (*write_commit)(es_backend *b, es_txn *t,
                      es_err *err);                 /* durable when it returns ES_OK; ends t */
  void (*write_rollback)(es_backend *b, es_txn *t); /* ends t */
  int (*savepoint)(es_backend *b, es_txn *t, es_err *err);
  int (*savepoint_release)(es_backend *b, es_txn *t, es_err *err);
  void (*savepoint_rollback)(es_backend *b,
                             es_txn *t); /* undoes since savepoint, then releases it */
  int (*read_begin)(es_backend *b, es_txn **t, es_err *err);
  void (*read_end)(es_backend *b, es_txn *t);

  /* Sessions: one row per session with its counters (store.h
   * es_session_info), kept by the core. */
  int (*session_get)(es_backend *b, es_txn *t, const char *session, es_session_info *out,
                     es_err *err);
  int (*session_put)(es_backend *b, es_txn *t, const es_session_info *row,
                     es_err *err); /* insert or replace */
  /* Sessions with name starting with prefix and > after (NULL: no bound),
   * ascending byte order, at most limit. */
  int (*session_list)(es_backend *b, es_txn *t, const char *prefix, const char *after,
                      int64_t limit, es_session_cb cb, void *ctx, es_err *err);
  /* Sessions whose row has parent == parent (made by fork from it), name >
   * after (NULL: no bound), ascending byte order, at most limit. An index
   * by (parent, session) is expected: O(log n + rows returned). */
  int (*session_children)(es_backend *b, es_txn *t, const char *parent, const char *after,
                          int64_t limit, es_session_cb cb, void *ctx, es_err *err);

  /* Events. */
  int (*event_get)(es_backend *b, es_txn *t, const char *session, int64_t index, es_event *out,
                   es_err *err);
  /* Finds an event by id in any session (ES_NOT_FOUND when none). */
  int (*event_get_by_id)(es_backend *b, es_txn *t, const char *id, es_event *out, es_err *err);
  /* Inserts a new row; assigns row->position (greater than every position
   * committed before). The core guarantees (session,index) and id are new. */
  int (*event_insert)(es_backend *b, es_txn *t, es_event *row, es_err *err);
  /* Rewrites the mutable dispatch fields of the row at (session, index):
   * status, attempts, failures, last_error, processed_at, claim_holder,
   * claim_expires_at, retry_at, queued, due_at, last_failed_attempt,
   * returned, first_claimed_at, last_claimed_at, failed_at,
   * processed_by_attempt. (origin_session / origin_index are immutable,
   * written by event_insert.) */
  int (*event_update)(es_backend *b, es_txn *t, const es_event *row, es_err *err);
  /* Optional (NULL: the core reads the row, then event_update). A
   * completion's write in one step, for the common case: the row at
   * (session, index), if it has no lane, is pending, claimed
   * (claim_holder set), not frozen by a shard move (returned > -2) and
   * its attempts equal `attempt`, becomes what event_update would make of
   * it for a completion by that attempt that returned `returned` events
   * (es_event_complete_record): status PROCESSED, processed_at `now`,
   * processed_by_attempt `attempt`, returned `returned`, claim_holder,
   * claim_expires_at, retry_at and due_at empty, not queued; nothing else
   * changes (the core inserts the returned events). *done: 1 when it did,
   * 0 when no row matched and nothing was written (the core then takes
   * its general path, which reads the row, says why, and moves a lane
   * on). */
  int (*event_complete)(es_backend *b, es_txn *t, const char *session, int64_t index,
                        int64_t attempt, int64_t returned, int64_t now, int *done, es_err *err);
  /* Optional (NULL: the core copies row by row with event_range and
   * event_insert). For fork: for each row of session `from` with index <=
   * through, in index order, inserts a row of session `to` with the same
   * index, type, payload, lane, created_at, cause and not_before, an id
   * from new_id(id_ctx), origin (from, index), and the dispatch record of
   * an event settled at processed_at (status PROCESSED, returned -1, every
   * other dispatch field empty, not queued: es_event_settle_copy's, which
   * an SQL backend spells with backend_sql.h); positions increase in index
   * order. *copied: the rows inserted. Ids from new_id are new (the core
   * passes a generator of unique ids only). */
  int (*event_copy)(es_backend *b, es_txn *t, const char *from, int64_t through, const char *to,
                    int64_t processed_at, es_id_fn new_id, void *id_ctx, int64_t *copied,
                    es_err *err);
  /* after < index <= through, ascending, at most limit (ES_NONE: all). */
  int (*event_range)(es_backend *b, es_txn *t, const char *session, int64_t after, int64_t through,
                     int64_t limit, es_event_cb cb, void *ctx, es_err *err);
  /* position > after, ascending, at most limit (ES_NONE: all).
   * scope (here and in the other listings across sessions): NULL lists
   * every session's rows; otherwise only rows whose session starts with
   * scope (a tenant's prefix, §3.11, ending in ES_TENANT_SEP), so the
   * session lies in [scope, scope with its last byte + 1). The unscoped
   * form must cost exactly what it did without scopes. The scoped one
   * (here only) must cost what the scope's own rows cost, never a walk of
   * other scopes' rows: tenants' waits and live tails read it after every
   * commit that concerns them (sqlite and postgres: an index on (scope,
   * position); memory: a merge of the scope's sessions). */
  int (*event_all)(es_backend *b, es_txn *t, const char *scope, int64_t after, int64_t limit,
                   es_event_cb cb, void *ctx, es_err *err);
  /* The highest position stored (0 when the store is empty). */
  int (*last_position)(es_backend *b, es_txn *t, int64_t *position, es_err *err);
  /* The lowest index > after of an event in (session, lane) whose status is
   * not PROCESSED (dead letters count); *index = 0 when none. */
  int (*lane_next)(es_backend *b, es_txn *t, const char *session, const char *lane, int64_t after,
                   int64_t *index, es_err *err);
  /* Queued rows with due_at <= now, at most limit (ES_NONE: all).
   * session NULL: all sessions (scope's when scope is set; scope is NULL
   * whenever session is set), ordered by (due_at, position).
   * session set: that session's, ordered by index (claim() returns index
   * order and applies its limit; a row that is queued but not yet due is
   * skipped, so the cost is O(log n + queued-not-due + limit)). */
  int (*queued_due)(es_backend *b, es_txn *t, const char *session, const char *scope, int64_t now,
                    int64_t limit, es_event_cb cb, void *ctx, es_err *err);
  /* The smallest due_at > now among queued rows (of session, or all when
   * NULL, of scope's sessions when scope is set); ES_NONE when none. */
  int (*queued_next_due)(es_backend *b, es_txn *t, const char *session, const char *scope,
                         int64_t now, int64_t *due, es_err *err);
  /* Queued rows of one type with due_at <= now, ordered by (due_at,
   * position), at most limit (ES_NONE: all). An index by type is expected:
   * the cost is O(log n + rows returned), whatever the number of queued
   * rows of other types (claim_next with types asks once per type and
   * merges). scope: as event_all's. */
  int (*queued_due_type)(es_backend *b, es_txn *t, const char *scope, const char *type, int64_t now,
                         int64_t limit, es_event_cb cb, void *ctx, es_err *err);
  /* The smallest due_at > now among queued rows of one type; ES_NONE when
   * none. O(log n). */
  int (*queued_next_due_type)(es_backend *b, es_txn *t, const char *scope, const char *type,
                              int64_t now, int64_t *due, es_err *err);
  /* Every type with at least one row of status PENDING (claimed or not,
   * queued or waiting in its lane; not dead, not processed) and that count,
   * ascending byte order of type; with scope, counted over scope's
   * sessions only. */
  int (*pending_types)(es_backend *b, es_txn *t, const char *scope, es_type_count_cb cb, void *ctx,
                       es_err *err);
  /* Rows with status DEAD (of session, or all when NULL: of scope's
   * sessions when scope is set), position > after, ascending position, at
   * most limit. */
  int (*dead_list)(es_backend *b, es_txn *t, const char *session, const char *scope, int64_t after,
                   int64_t limit, es_event_cb cb, void *ctx, es_err *err);

  /* Snapshots, keyed (session, reducer). */
  int (*snapshot_get)(es_backend *b, es_txn *t, const char *session, const char *reducer,
                      es_snapshot *out, es_err *err);
  int (*snapshot_put)(es_backend *b, es_txn *t, const char *session, const es_snapshot *row,
                      es_err *err);
  /* Ascending reducer name; rows passed without state (state NULL). */
  int (*snapshot_list)(es_backend *b, es_txn *t, const char *session, es_snapshot_cb cb, void *ctx,
                       es_err *err);

  /* Refs (§3.7), keyed by name; row->head is neither stored nor returned
   * (the core fills it from the session row). */
  int (*ref_get)(es_backend *b, es_txn *t, const char *name, es_ref *out, es_err *err);
  int (*ref_put)(es_backend *b, es_txn *t, const es_ref *row, es_err *err); /* insert or replace */
  int (*ref_delete)(es_backend *b, es_txn *t, const char *name,
                    es_err *err); /* ES_NOT_FOUND when absent */
  /* Refs with name > after (NULL: no bound), ascending byte order, at most
   * limit. */
  int (*ref_list)(es_backend *b, es_txn *t, const char *after, int64_t limit, es_ref_cb cb,
                  void *ctx, es_err *err);

  /* Presence, keyed (ns, participant, field). value NULL: tombstone. */
  int (*presence_get)(es_backend *b, es_txn *t, const char *ns, const char *participant,
                      const char *field, es_presence_row *out, es_err *err);
  int (*presence_put)(es_backend *b, es_txn *t, const char *ns, const es_presence_row *row,
                      es_err *err);
  /* Drops rows of ns with expires_at <= now (may be a no-op). */
  int (*presence_expire)(es_backend *b, es_txn *t, const char *ns, int64_t now, es_err *err);
  /* Rows of ns with expires_at > now, tombstones included, ordered by
   * (participant, field). */
  int (*presence_list)(es_backend *b, es_txn *t, const char *ns, int64_t now, es_presence_cb_row cb,
                       void *ctx, es_err *err);

  /* Retention (§3.9). */
  /* Removes the session's rows with index <= through, whatever their
   * status (the core checked what it had to), keeping every index and
   * count of the backend consistent (dispatch sets, per-type pending
   * counts, lanes, ids: a removed id may be inserted again). O(rows
   * removed), not O(store). */
  int (*event_delete_range)(es_backend *b, es_txn *t, const char *session, int64_t through,
                            es_err *err);
  /* Removes the session's row (ES_NOT_FOUND when absent); its name may be
   * put again. */
  int (*session_delete)(es_backend *b, es_txn *t, const char *session, es_err *err);
  /* §3.8 fence floors: a token is greater than every earlier token of its
   * session, a deleted one's included, so the fence token of a session
   * that delete removed (retention.c) is kept by name, apart from the
   * session rows (no listing, count or export sees it), and a row made
   * again under that name starts from it (es_rule_load_session): a writer
   * fenced out before the delete stays STALE_FENCE. fence_floor_get sets
   * *token to the name's floor, 0 when it has none; fence_floor_put raises
   * it to token (never lowers it). Optional (NULL: no floors kept). */
  int (*fence_floor_get)(es_backend *b, es_txn *t, const char *session, int64_t *token,
                         es_err *err);
  int (*fence_floor_put)(es_backend *b, es_txn *t, const char *session, int64_t token,
                         es_err *err);
  /* Removes every snapshot of the session. */
  int (*snapshot_delete_all)(es_backend *b, es_txn *t, const char *session, es_err *err);
  /* Removes every ref whose session is `session`; O(log n + removed) (an
   * index by session). */
  int (*ref_delete_session)(es_backend *b, es_txn *t, const char *session, es_err *err);

  /* Archive (§3.9, archive.c): the segment list of a session. */
  /* Segment rows (es_segment) of the session, ascending `from`. */
  int (*segment_list)(es_backend *b, es_txn *t, const char *session, es_segment_cb cb, void *ctx,
                      es_err *err);
  /* Inserts or replaces the row keyed (session, row->from). */
  int (*segment_put)(es_backend *b, es_txn *t, const char *session, const es_segment *row,
                     es_err *err);
  /* Removes the row keyed (session, from); ES_NOT_FOUND when absent. */
  int (*segment_delete)(es_backend *b, es_txn *t, const char *session, int64_t from, es_err *err);
  /* §3.9 archived: each session with segment rows whose name starts with
   * prefix and is > after (NULL: no bound), ascending byte order, at most
   * limit: cb(ctx, session, the highest `through` of its rows); a nonzero
   * return stops. */
  int (*segment_sessions)(es_backend *b, es_txn *t, const char *prefix, const char *after,
                          int64_t limit, int (*cb)(void *ctx, const char *session, int64_t through),
                          void *ctx, es_err *err);

  /* Crypto-shredding (§3.10, crypto.c): wrapped data keys and where they
   * are used. Events store `key` (es_event.key) with the row: event_insert
   * writes it, every event read returns it, event_copy copies it. */
  /* The key row of that name (out owned by the caller), ES_NOT_FOUND. */
  int (*key_get)(es_backend *b, es_txn *t, const char *name, es_key_row *out, es_err *err);
  /* Insert or replace by name. Replacing must not leave the old wrapped
   * bytes readable where the backend can help it (sqlite: secure_delete). */
  int (*key_put)(es_backend *b, es_txn *t, const es_key_row *row, es_err *err);
  /* Records that session holds events under key from first_index on:
   * inserts the (key, session) row, or lowers its first_index. */
  int (*key_use_put)(es_backend *b, es_txn *t, const char *key, const char *session,
                     int64_t first_index, es_err *err);
  /* The (session, first_index) rows of key, ascending session. */
  int (*key_use_list)(es_backend *b, es_txn *t, const char *key, es_key_use_cb cb, void *ctx,
                      es_err *err);
  /* Removes every key_uses row of the session (delete). */
  int (*key_use_delete_session)(es_backend *b, es_txn *t, const char *session, es_err *err);
  /* Removes the session's snapshots whose index is >= index. */
  int (*snapshot_delete_from)(es_backend *b, es_txn *t, const char *session, int64_t index,
                              es_err *err);
  /* Optional (NULL: nothing to do): called outside any transaction, with
   * the core's write lock held, after a shred committed: make what was
   * deleted unreadable in the storage files (sqlite: checkpoint the WAL
   * into the main file and truncate it; secure_delete zeroed the pages). */
  int (*scrub)(es_backend *b, es_err *err);

  /* Optional (NULL): a number that changes whenever anyone, in any process,
   * commits to the same storage; es_store_wait polls it to see other
   * processes' writes. */
  int (*data_version)(es_backend *b, uint64_t *version, es_err *err);

  /* Optional (NULL: claim_next runs in the write transaction, as every
   * other write): claims in parallel across processes
   * (docs/postgres.md "Concurrency"). Begins a claim transaction: a write
   * transaction of its own, not part of the group commit and not holding
   * the store-wide write lock, ended by write_commit or write_rollback (no
   * savepoints). Several may run at once, beside the write transaction. In
   * it:
   * - queued_due (session NULL) and queued_due_type pass over the rows of
   *   the sessions in skip[0..n_skip) and lock the rows they return; rows
   *   another transaction holds are skipped, never waited for, so two
   *   claim transactions never return the same row;
   * - session_get locks the row (waiting for its holder, briefly);
   * - the core only rewrites the claim fields of the rows it got
   *   (event_update) and the attempts / updated_at of their sessions
   *   (session_put), locking sessions in byte order of their names; it
   *   inserts and deletes nothing.
   * The backend's write transactions must then lock (and re-read the
   * latest version of) the event and session rows they read before the
   * core rewrites them, so a claim committed meanwhile is never
   * overwritten. */
  int (*claim_begin)(es_backend *b, const char *const *skip, size_t n_skip, es_txn **t,
                     es_err *err);
  /* After a call in a claim transaction failed: 1 when it failed only on
   * lock contention (a lock wait timed out, a deadlock), so that running
   * the whole claim again may succeed; 0 otherwise. Before the rollback. */
  int (*claim_retry)(es_backend *b, es_txn *t);
  /* Optional (NULL: the core polls ext_version): blocks until
   * ext_version differs from since, timeout_ms passed, or wake() was
   * called, without a polling loop. Spurious returns are allowed. */
  int (*wait_change)(es_backend *b, uint64_t since, int64_t timeout_ms, es_err *err);
  /* Optional (NULL: nothing else can write, as memory:): a number that
   * changes when a commit not made through this backend's own write
   * connection is seen (another process, another handle; a reconnect of
   * a watch counts too, as commits may have been missed), in O(1). The
   * core wakes its own waits on its own commits (wakes.c) and on the
   * others' through this number: one thread per handle with waits blocks
   * in wait_change on it, or looks at it every 50 ms. */
  int (*ext_version)(es_backend *b, uint64_t *version, es_err *err);
  /* With wait_change: makes the wait_change calls in progress return now
   * (once; later calls block as usual). The core's thread that waits on
   * ext_version ends when no wait needs it any more: it must not linger
   * (it would reconnect a dropped watch connection nobody uses). */
  void (*kick)(es_backend *b);
  /* Optional, with wait_change: makes every wait_change in progress return
   * now and every later one return at once; close() calls it before it
   * waits for the calls in flight. */
  void (*wake)(es_backend *b);
  /* Optional (NULL: savepoint_release, then write_commit): releases the
   * savepoint of a write transaction's only caller and commits, in one
   * step (a backend whose statements are round trips sends both at once).
   * The core calls it only when the transaction holds no other caller's
   * work and nobody is queued to join it. Ends t, committed (ES_OK) or
   * rolled back. */
  int (*release_commit)(es_backend *b, es_txn *t, es_err *err);
  /* Optional, with claim_begin (NULL: queued_due / queued_due_type, then
   * queued_next_due / queued_next_due_type): in a claim transaction, the
   * ready rows queued_due (session NULL) or queued_due_type (type set)
   * returns there (locked, the skip list passed over), and in *next_due
   * what queued_next_due / queued_next_due_type answers before any of them
   * is claimed, in one step. */
  int (*claim_ready)(es_backend *b, es_txn *t, const char *scope, const char *type, int64_t now,
                     int64_t limit, es_event_cb cb, void *ctx, int64_t *next_due, es_err *err);
  /* Optional, with claim_begin (NULL: session_get, then session_put): in a
   * claim transaction, adds n to the attempts of the session's row and
   * sets its updated_at to now, locking the row as session_get does there;
   * a missing row is an error (STORAGE). The failure may be reported by a
   * later call of the transaction (its commit at the latest). */
  int (*session_claimed)(es_backend *b, es_txn *t, const char *session, int64_t n, int64_t now,
                         es_err *err);
  /* Optional, with claim_begin (NULL: write_commit): commits a claim
   * transaction as write_commit does, and on failure sets *retry as
   * claim_retry would have answered (a backend that reports the outcome
   * of some statements only with the commit, session_claimed's lock wait
   * among them, learns of a lost lock wait there). */
  int (*claim_commit)(es_backend *b, es_txn *t, int *retry, es_err *err);

  /* §3.12 stats: the sums over the counted session rows (count of rows,
   * and their events, pending and dead) of every session (scope NULL) or
   * of scope's sessions (a tenant's prefix, as event_all's). Kept up to
   * date as session rows are put and deleted, in the same transaction, so
   * the answer costs O(1) (O(log n) for a scope), never a walk. Which rows
   * count and a name's scope are the core's rule (store/counts.h): the
   * backend stores the sums and applies that rule (es_counts_move, or SQL
   * built from its ES_SQL_* fragments where the database must keep them
   * itself). */
  int (*counts)(es_backend *b, es_txn *t, const char *scope, es_counts *out, es_err *err);
  /* Optional (NULL: event_insert for each row): inserts rows[0..n) in
   * order, exactly as n event_insert calls would (positions, what each
   * row stores), in fewer statements. On failure some of the rows may be
   * in: the core rolls its savepoint back. */
  int (*event_insert_many)(es_backend *b, es_txn *t, es_event *rows, size_t n, es_err *err);
  /* Optional (NULL: none): a hint that the calls to come in this write
   * transaction will read the events at (sessions[i], indexes[i]) for i <
   * n (event_get; index 0: no event, the session's row only), their
   * sessions' rows (session_get) and look up the ids ids[0..n_ids)
   * (event_get_by_id), as complete_many does and as the appends of a
   * group commit do (group.c). A backend whose
   * reads are round trips reads them all now, in one step, locked as
   * event_get and session_get lock them, and answers those calls from what
   * it read. The answers must be exactly those the calls would give
   * without the hint: what was read ahead follows the transaction's own
   * writes (or is forgotten by them), and is forgotten at a savepoint's
   * rollback, at the end of the transaction and at the next read_ahead. */
  int (*read_ahead)(es_backend *b, es_txn *t, const char *const *sessions, const int64_t *indexes,
                    size_t n, const char *const *ids, size_t n_ids, es_err *err);
  /* Optional (NULL: none; both or neither): lazy_begin() before
   * write_begin and lazy_end() after write_commit / write_rollback bracket
   * one write transaction whose commit need not be durable when
   * write_commit returns: it must be visible and survive a crash of the
   * process, and become durable with the next commit that is (which every
   * other write transaction's is). The core uses it for a claim_next alone
   * in its transaction, never for a group (docs/sqlite.md "Claims and
   * power loss"). lazy_begin returns ES_OK when the next transaction is
   * lazy; otherwise it changed nothing (and lazy_end is not called).
   * lazy_end must leave later transactions durable: when it cannot, the
   * next write_begin restores durability or fails. */
  int (*lazy_begin)(es_backend *b);
  void (*lazy_end)(es_backend *b);
  /* Optional (NULL: the backend has no file to copy; docs/moving.md says
   * what to use instead): §10 eventstore backup. Copies the whole storage
   * into a new file at `to` (which must not exist) consistently while
   * writers go on (sqlite: the online backup API from a read connection of
   * its own), then checks the copy (sqlite: PRAGMA integrity_check), and
   * removes it when the check fails. Outside any transaction. */
  int (*backup)(es_backend *b, const char *to, es_err *err);
  /* Optional (NULL: no limit of its own): the largest payload, in bytes,
   * that event_insert stores (memory: a 32-bit length; SQLite: its
   * SQLITE_LIMIT_LENGTH for a whole row; PostgreSQL: the 1 GiB of a
   * protocol message or a field). The core caps max_payload_bytes with it
   * (es_store_max_payload), so a payload over it is refused with
   * TOO_LARGE by the append's checks before any write, never met as a
   * failure halfway through a transaction. */
  size_t (*max_payload)(es_backend *b);

  /* §8 projections (store/projections.c): rows keyed (ns, key) holding
   * opaque bytes, what a projection keeps (its record under ns "", its
   * states under one ns per generation). ns and key are NUL-free strings
   * (key may be empty); the value may hold any bytes. The core writes
   * them inside its write transactions, beside anything else, so a
   * projection's checkpoint and the states it changed commit together. */
  /* The row's value (owned by the caller, free it; NUL-terminated past
   * *len) or ES_NOT_FOUND. */
  int (*proj_get)(es_backend *b, es_txn *t, const char *ns, const char *key, char **value,
                  size_t *len, es_err *err);
  /* Inserts or replaces the row; value NULL removes it (absent: no-op). */
  int (*proj_put)(es_backend *b, es_txn *t, const char *ns, const char *key, const char *value,
                  size_t len, es_err *err);
  /* Rows of ns whose key starts with prefix and is > after (NULL: no
   * bound), ascending byte order of key, at most limit (ES_NONE: all);
   * O(log n + rows returned). The callback must not write. */
  int (*proj_list)(es_backend *b, es_txn *t, const char *ns, const char *prefix, const char *after,
                   int64_t limit, es_proj_cb cb, void *ctx, es_err *err);
  /* Removes every row of ns (a generation dropped after a swap). */
  int (*proj_drop)(es_backend *b, es_txn *t, const char *ns, es_err *err);
} es_backend_ops;

extern const es_backend_ops es_backend_memory;
extern const es_backend_ops es_backend_sqlite;
/* PostgreSQL (backends/postgres.c): the same backend under both URI schemes
 * libpq accepts, postgres:// and postgresql://. */
extern const es_backend_ops es_backend_postgres;
extern const es_backend_ops es_backend_postgresql;

#endif
