/*
 * internal.h: the store's insides, shared by the files of core/store/
 * (front.c: the front door; store.c and the rule files of rules.h: the
 * core store; archive.c: segment files, §3.9; crypto.c: sealed payloads
 * and shredding, §3.10; tenant.c: tenant views, §3.11; shards.c and
 * shard_*.c: the router; docs/store.md lists every file). Not a public
 * header: bindings and the engine use store.h only.
 */
#ifndef ES_STORE_INTERNAL_H
#define ES_STORE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "store/backend.h"
#include "store/stats.h"
#include "store/store_impl.h"

/* A caller of es_core_write queued for a group commit (store.c). */
typedef struct group_waiter group_waiter;
typedef struct wait_key wait_key;
enum { EXT_NONE, EXT_RUNNING, EXT_ENDED };

typedef struct presence_watch {
  uint64_t token;
  char *ns;
  es_presence_cb cb;
  void *ctx;
  struct presence_watch *next;
} presence_watch;

/* A store handle. Every implementation of the store interface
 * (store_impl.h) starts with one: impl, refs, the clock, the limits, the
 * stats, and (the core store and the router) the id state are used by all;
 * the rest is the core store's. A tenant view and the shard router embed
 * it as the first member of their own struct (tenant.c, shards.c). */
struct es_store {
  const es_store_ops *impl;  /* the implementation's table: every es_store_* call goes there */
  es_stats *stats_also;      /* a tenant view's: its store's stats, where its calls count too */
  const es_backend_ops *ops;
  es_backend *bk;
  es_clock_fn clock;
  void *clock_ctx;
  es_id_fn ids;              /* NULL: UUIDv7 */
  void *ids_ctx;
  size_t max_payload;
  size_t max_stored;         /* the backend's max_payload (SIZE_MAX: none): what a payload
                                takes stored, sealed (§3.10) or not */
  size_t max_batch;

  /* lifecycle */
  pthread_mutex_t lmu;       /* guards closed, inflight */
  pthread_cond_t lcond;      /* inflight reached 0 */
  int closed;
  int inflight;
  atomic_int refs;

  /* writes (store.c, "group commit") */
  pthread_mutex_t wmu;       /* one writer in the backend at a time: a group's leader
                                while it runs and commits the group */
  es_txn *wtxn;              /* the open group transaction (only while its leader holds wmu) */
  pthread_mutex_t qmu;       /* guards the fields below */
  pthread_cond_t qcond;      /* a leader waiting for the last group's callers to return */
  group_waiter *queue;       /* callers waiting for a group, in arrival order */
  group_waiter **queue_tail;
  int queued;                /* length of queue */
  int taken;                 /* callers taken into the running group */
  int leading;               /* a leader is running a group, or was handed the next one */
  int want;                  /* > 0: the leader waits until queued reaches this */
  int last_group;            /* callers in the last group */
  int64_t commit_ns;         /* how long the last group's commit took */

  /* change notification (es_store_wait, subscriptions; wakes.c) */
  pthread_mutex_t vmu;
  atomic_uint_least64_t version;
  wait_key *wkeys;           /* under vmu: the keys waits sleep on */
  pthread_mutex_t emu;       /* guards ext_state (taken before vmu) */
  pthread_t ext_thread;      /* wakes.c: turns other processes' commits into wakes */
  int ext_state;             /* EXT_NONE, EXT_RUNNING, EXT_ENDED (to be joined) */
  uint64_t ext_since;        /* ext_version when ext_thread started */
  /* under wmu: the sessions the open write transaction adds events to or
   * drops events from (es_core_touch), or touched_all */
  char (*touched)[ES_MAX_NAME_BYTES + 1];
  size_t ntouched;
  int touched_all;

  /* UUIDv7 generation: strictly increasing within this handle */
  pthread_mutex_t umu;
  int64_t uuid_ms;
  uint32_t uuid_seq;         /* 12-bit counter within one millisecond */
  unsigned char rand_pool[4000];
  size_t rand_used;          /* bytes of rand_pool already handed out */

  /* presence watchers */
  pthread_mutex_t pmu;
  presence_watch *watches;
  uint64_t next_token;
  /* presence_ext.c, under pmu: the watched namespaces' rows as last seen,
   * and the wait key that keeps the ext_watch thread running for them */
  struct presence_seen *pseen;
  wait_key *pkey;

  /* §3.9 archive (archive.c): NULL when the store was opened without one */
  char *archive_dir;         /* owned, absolute or as given; created at open */
  pthread_mutex_t dmu;       /* a session's archive directory: held by an archive or a
                                compaction from making it until its file is in it, and by
                                es_archive_files_finish removing an emptied one, so that
                                within this process the directory is never removed
                                between the two (archive.c write_file: across processes) */
  /* Test hook (spec/c/segment_test.c): compact_archive calls it after it
   * built the merged files and before it installs them, so a test can
   * change the segment list in between (the compare-and-set must see it). */
  void (*archive_race)(es_store *s, void *ctx);
  void *archive_race_ctx;

  /* §3.10 crypto-shredding (crypto.c): NULL when opened without keys */
  struct es_crypto *crypto;  /* owned: the master key and its check */

  /* Every store opened on one of the known backends checks the markers a
   * shard move leaves (docs/sharding.md): s->bk is the marker-checking
   * backend wrapping real_bk, and s->ops (own_ops) its table, whose
   * session and event lookups answer ES_MOVED for a session moved away or
   * being moved in. The mover uses real_ops on real_bk. */
  const es_backend_ops *real_ops;  /* the backend's own table */
  es_backend *real_bk;             /* the backend itself (owned by the wrapper) */
  es_backend_ops own_ops;

  /* §3.12 (stats.h): this handle's calls. Zeroed at calloc, freed with
   * the handle (es_stats_destroy). */
  es_stats stats;
};


/* Every call is bracketed by enter/leave so close() can wait for it.
 * enter: ES_OK or ES_CLOSED. */
/* Sets the fields and locks every handle has from the open options (a
 * calloc'd s); es_core_handle_destroy destroys those locks. */
void es_core_handle_init(es_store *s, const es_open_opts *opts);
void es_core_handle_destroy(es_store *s);
int es_core_enter(es_store *s, es_err *err);
void es_core_leave(es_store *s);

/* A unit of work inside a backend transaction. */
typedef int (*txn_fn)(es_store *s, es_txn *t, void *arg, es_err *err);
/* Runs fn in a write transaction (a savepoint of the open group on
 * group-commit backends) and returns once it is committed (durable), or
 * failed with nothing written. fn runs with the write lock held: one write
 * at a time per store (and, on SQLite, per file across processes). On
 * group-commit backends fn may run on another writer's thread (the
 * group's leader, store.c "Group commit") while the caller sleeps: it must
 * not depend on the calling thread (thread-locals, a thread's Lua state);
 * in a store with an id source each fn runs on its caller's thread. */
int es_core_write(es_store *s, txn_fn fn, void *arg, es_err *err);
/* What a write tells its group ahead of running (group.c "Shared
 * savepoints and reads ahead"). */
typedef struct es_write_hint {
  const char *session;       /* fn reads this session's row first, or NULL */
  const es_new_event *evs;   /* fn looks up the ids of evs[0..n) that carry one */
  size_t n;
  /* 1: every error fn can return after its first write is ES_STORAGE
   * (an error of any other code leaves nothing written), so fn may share
   * one savepoint with the writes queued beside it */
  int shared;
} es_write_hint;
/* es_core_write with a hint (NULL: none): the same outcome, in fewer round
 * trips on a backend with read_ahead. */
int es_core_write_hinted(es_store *s, txn_fn fn, void *arg, const es_write_hint *hint, es_err *err);
/* Runs fn in a read transaction (a consistent view of committed data). */
int es_core_read(es_store *s, txn_fn fn, void *arg, es_err *err);
/* Runs fn with the write lock held and no transaction open (a group's
 * transaction is open only while its leader holds the lock): for backend
 * work that cannot run inside one, like
 * SQLite's WAL checkpoint after a shred (§3.10). */
int es_core_outside_txn(es_store *s, int (*fn)(es_store *s, void *arg, es_err *err), void *arg,
                        es_err *err);

/* projections.c (§8): the core store's projection ops (store_impl.h). */
int es_core_projection_read(es_store *s, const char *scope, const char *name, const char *key,
                            int64_t gen, char **value, size_t *len, es_projection *info, es_err *err);
int es_core_projection_keys(es_store *s, const char *scope, const char *name, const char *prefix,
                            const char *after, int64_t limit, es_proj_keys *out, es_err *err);
int es_core_projections(es_store *s, const char *name, es_projections *out, es_err *err);
int es_core_projection_commit(es_store *s, const char *scope, const es_projection *next,
                              int64_t expect_seq, int64_t ttl_ms, int64_t gen,
                              const es_proj_state *states, size_t n, es_projection *out,
                              es_err *err);
int es_core_projection_control(es_store *s, const char *scope, const char *name, const char *action,
                               es_projection *out, es_err *err);

/* names.c (§3.11): the length of the tenant prefix a stored name starts
 * with (through its ES_TENANT_SEP), 0 when it has none. */
size_t es_name_prefix_len(const char *v, size_t n);

/* A listing's limit: a positive integer, else INVALID_ARGUMENT. */
static inline int es_rule_check_limit(int64_t limit, es_err *err) {
  if (limit < 1) return es_fail(err, ES_INVALID_ARGUMENT, "limit must be a positive integer");
  return ES_OK;
}

/* `after` bounds of listings may be any string (they need not name a
 * session or ref that exists); only their length is bounded. */
static inline int es_rule_check_after(const char *after, es_err *err) {
  if (after && strlen(after) - es_name_prefix_len(after, strlen(after)) > ES_MAX_ID_BYTES)
    return es_fail(err, ES_INVALID_ARGUMENT, "after is longer than %d bytes", ES_MAX_ID_BYTES);
  return es_check_utf8("after", after, err);
}

/* group.c: sets up a handle's group-commit queue (es_core_handle_init). */
void es_core_group_init(es_store *s);
/* wakes.c: after every commit, bumps the handle's version and wakes the
 * waits the commit concerns. touched: 1 for a write transaction that
 * recorded (es_core_touch) the sessions whose events it added or dropped,
 * called with wmu still held (it then forgets them); 0 for a commit that
 * added or dropped none (wakes no wait); -1 wakes every wait (close). */
void es_core_notify_commit(es_store *s, int touched);
/* wakes.c: in a write transaction (wmu held), records that it adds events
 * to session or drops some (NULL: it cannot say which sessions: every
 * wait is woken at its commit). */
void es_core_touch(es_store *s, const char *session);
/* wakes.c: forgets what a transaction that did not commit touched (wmu
 * held). */
void es_core_touch_clear(es_store *s);
/* wakes.c: the key a wait sleeps on (its session, its scope, or "" for
 * every session), taken (NULL: out of memory) and given back; its
 * sequence (bumped by each commit that wakes it); sleeping until the
 * sequence moves from seen or `until` (CLOCK_MONOTONIC): 1 when it
 * moved. */
wait_key *es_core_wait_key_get(es_store *s, const char *key);
/* wakes.c: on a backend with ext_version, a wait holding its key starts
 * the thread that wakes every wait when another process commits, unless
 * it runs (it ends when no wait is left); es_core_ext_stop joins it
 * (close, after the backend's wake()). */
int es_core_ext_start(es_store *s, es_err *err);
void es_core_ext_stop(es_store *s);
void es_core_wait_key_put(es_store *s, wait_key *k);
uint64_t es_core_wait_key_seq(es_store *s, wait_key *k);
int es_core_wait_key_sleep(es_store *s, wait_key *k, uint64_t seen, const struct timespec *until);

/* ids.c: a UUIDv7 of the handle, strictly increasing within it. */
int es_core_uuid7(es_store *s, int64_t now, char out[37], es_err *err);
/* ids.c: a generated event id behind scope (NULL: none), from the store's
 * id source when it has one: an injected source's id must be a name and
 * new (not stored yet), or the call fails before writing a row with it. */
int es_core_new_event_id(es_store *s, es_txn *t, int64_t now, const char *scope,
                         char out[ES_MAX_NAME_BYTES + 1], es_err *err);

/* §3.9 archive (archive.c) ------------------------------------------------ */

/* Files to remove once the transaction that stopped naming them has
 * committed (truncate, delete, compact_archive): removing them before
 * would lose data if the commit failed. */
typedef struct es_archive_files {
  char **v;  /* owned paths */
  size_t n, cap;
} es_archive_files;

/* The directory a file: URL given as the archive location names (*out,
 * owned; NULL for a plain path); INVALID_ARGUMENT for another scheme. */
int es_archive_location(const char *given, char **out, es_err *err);
/* At open: the archive directory (opts->archive_dir, else for sqlite:PATH
 * the default PATH.archive, created at the first archive). */
int es_archive_setup(es_store *s, const char *scheme, const char *url_rest,
                     const es_open_opts *opts, es_err *err);
void es_archive_teardown(es_store *s);
/* The archived part of a read of (*after, through] of si's session:
 * appends the events first_index..archived_through in that range to out
 * (at most *limit; ES_NONE: no limit), then moves *after past the
 * archived indexes and lowers *limit by what it appended, so the caller
 * reads the rest from live rows. Nothing archived there: nothing done. */
int es_archive_read_part(es_store *s, es_txn *t, const es_session_info *si, int64_t *after,
                         int64_t through, int64_t *limit, es_events *out, es_err *err);
/* Hands each archived event of si with after < index <= through to cb, in
 * index order (views, valid during the call); cb may write to t (no
 * backend iteration is running). cb returns nonzero to stop. */
int es_archive_each(es_store *s, es_txn *t, const es_session_info *si, int64_t after,
                    int64_t through, es_event_cb cb, void *ctx, es_err *err);
/* Whether a failed read should be retried once with a new transaction: a
 * segment file it listed was removed meanwhile (compaction, truncate or
 * delete committed and cleaned up after the read's snapshot). */
int es_archive_retryable(int rc, const es_err *err);
/* Removes the session's segment rows with through <= `through` (INT64_MAX:
 * all) and lists their files in `drop` for es_archive_files_finish. */
int es_archive_drop(es_store *s, es_txn *t, const char *session, int64_t through,
                    es_archive_files *drop, es_err *err);
/* A shard move: each segment file of segs (rows of `session` in from's
 * archive directory, checked as a read checks them) written into to's
 * under the same relative path, synced; a file already there is
 * replaced. INVALID_ARGUMENT when either store has no archive directory. */
int es_archive_copy_files(es_store *from, es_store *to, const char *session,
                          const es_segments *segs, es_err *err);
/* Moving a store (move.c, §10 "archived events inline"): each event of
 * each recorded segment of the session, whole (events below first_index
 * that a segment still holds included, so the segments move unchanged),
 * with its segment's row; every file checked as a read checks it. cb
 * returns nonzero to stop: then STORAGE (it ran out of memory). */
typedef int (*es_archive_seg_cb)(void *ctx, const es_segment *g, const es_event *e);
int es_archive_each_segment(es_store *s, es_txn *t, const char *session, es_archive_seg_cb cb,
                            void *ctx, es_err *err);
/* An import: writes a raw body (segment.h) of events from..through as a
 * new segment of the session with that created_at, and records it, in the
 * caller's write transaction (the file durable before the row; a crash
 * leaves an orphan the session's next segment write sweeps).
 * INVALID_ARGUMENT without an archive directory. */
int es_archive_import_segment(es_store *s, es_txn *t, const char *session, int64_t from,
                              int64_t through, const unsigned char *raw, size_t raw_len,
                              int64_t created_at, es_err *err);
/* After the transaction: committed (1) removes the files, then each
 * directory they emptied, else only forgets them; frees the list either
 * way. */
void es_archive_files_finish(es_store *s, es_archive_files *f, int committed);
/* The core store (store.c, archive.c, crypto.c, stats.c): its implementation
 * of each op of the store interface, collected in es_core_ops (store_impl.h
 * says what each takes; scope: NULL, or the prefix of the sessions the
 * call may see and of the ids it generates). */
int es_core_open(const es_backend_ops *ops, int (*wrap)(es_store *s, es_err *err),
                 const char *rest, const es_open_opts *opts, es_store **out, es_err *err);
void es_core_close(es_store *s);
void es_core_free(es_store *s);
int es_core_check_open(es_store *s, es_err *err);
uint64_t es_core_version(es_store *s);
int es_core_data_version(es_store *s, uint64_t *version, es_err *err);
int es_core_new_id(es_store *s, char out[ES_MAX_ID_BYTES + 1], es_err *err);
int es_core_append(es_store *s, const char *scope, const char *session, const es_new_event *evs,
                   size_t n, int64_t expected, int64_t fence, es_events *out, int *pending,
                   es_err *err);
int es_core_read_events(es_store *s, const char *session, int64_t after, int64_t through,
                        int64_t limit, es_events *out, es_err *err);
int es_core_events_page(es_store *s, const char *session, int64_t after, int64_t through,
                        int64_t limit, es_events *out, int64_t *through_out, es_err *err);
int es_core_head(es_store *s, const char *session, int64_t *head, es_err *err);
/* read_all_cursor of the core store: the cursor is a position in decimal. */
int es_core_read_all_cursor(es_store *s, const char *scope, const char *cursor, int64_t limit,
                            es_events *out, char ***cursors, es_err *err);
int es_core_read_all(es_store *s, const char *scope, int64_t after, int64_t limit, es_events *out,
                     es_err *err);
int es_core_last_position(es_store *s, const char *scope, int64_t *position, es_err *err);
int es_core_get(es_store *s, const char *session, int64_t index, es_event *out, es_err *err);
int es_core_claim(es_store *s, const char *session, const es_claim_opts *o, int *outcome,
                  es_events *out, int64_t *retry_at, es_err *err);
int es_core_claim_next(es_store *s, const char *scope, const char *holder, int64_t ttl_ms,
                       int64_t limit, const char *const *types, size_t n_types,
                       const char *const *skip, size_t n_skip, es_events *out, int64_t *retry_at,
                       es_err *err);
int es_core_renew(es_store *s, const char *session, const char *holder, const es_claim_ref *claims,
                  size_t n, int64_t ttl_ms, int64_t expires_at, es_renew_result *out, es_err *err);
int es_core_release_claims(es_store *s, const char *session, const char *holder,
                           const es_claim_ref *claims, size_t n, es_renew_result *out,
                           es_err *err);
int es_core_complete(es_store *s, const char *scope, const char *session, int64_t index,
                     int64_t attempt, const es_new_event *evs, size_t n, int64_t fence,
                     int *outcome, es_events *out, es_err *err);
int es_core_complete_many(es_store *s, es_completion *v, size_t n, es_err *err);
int es_core_complete_cancel(es_store *s, const char *scope, es_completion *c, es_events *out,
                            es_err *err);
int es_core_archived(es_store *s, const char *prefix, const char *after, int64_t limit,
                     es_archived *out, es_err *err);
int es_core_cancel(es_store *s, const char *session, int64_t index, const char *reason,
                   es_event *out, es_err *err);
int es_rule_cancel(es_store *s, es_txn *t, es_session_info *si, int64_t index, const char *reason,
                   int64_t now, es_event *out, es_err *err);
int es_core_append_many(es_store *s, const char *scope, es_append_batch *v, size_t n, es_err *err);
int es_core_fail(es_store *s, const char *session, int64_t index, int64_t attempt,
                 const char *error, int64_t max_failures, int64_t retry_after_ms, int *outcome,
                 int64_t *failures, es_err *err);
int es_core_revive(es_store *s, const char *session, int64_t index, es_err *err);
int es_core_settle(es_store *s, const char *session, int64_t index, const char *reason,
                   es_err *err);
int es_core_dead_letters(es_store *s, const char *scope, const char *session, int64_t after,
                         int64_t limit, es_events *out, es_err *err);
int es_core_read_state(es_store *s, const char *session, const char *reducer, int *found,
                       es_snapshot *snap, es_events *events, es_err *err);
int es_core_read_states(es_store *s, const char *const *sessions, size_t n, const char *reducer,
                        es_state_read *out, es_err *err);
int es_core_put_snapshot(es_store *s, const char *session, const char *reducer, int64_t index,
                         const char *state, size_t state_len, const char *version, int *stored,
                         es_err *err);
int es_core_snapshots(es_store *s, const char *session, es_snapshots *out, es_err *err);
int es_core_sessions(es_store *s, const char *prefix, const char *after, int64_t limit,
                     es_sessions *out, es_err *err);
int es_core_pending_types(es_store *s, const char *scope, es_type_counts *out, es_err *err);
int es_core_wait(es_store *s, const char *scope, const char *session, int64_t after,
                 int64_t timeout_ms, int64_t limit, es_events *out, es_err *err);
int es_core_presence_set(es_store *s, const char *ns, const char *participant,
                         const es_presence_field *fields, size_t n, int64_t ttl_ms, int64_t at,
                         int64_t seen, es_presence_rows *applied, es_err *err);
int es_core_presence_read(es_store *s, const char *ns, es_presence_rows *out, es_err *err);
uint64_t es_core_presence_watch(es_store *s, const char *ns, es_presence_cb cb, void *ctx);
void es_core_presence_unwatch(es_store *s, uint64_t token);
/* Appends a copy of row to rows (presence.c); ES_STORAGE when out of memory. */
int es_presence_push(es_presence_rows *rows, const es_presence_row *row);
/* presence_ext.c: other processes' presence writes reach the watches.
 * watched / unwatched: a watch of ns was added / removed (not under pmu);
 * own: this handle's write applied these rows (under pmu, before its
 * watches are told): *give is what the watches must still be told (applied
 * itself, or *fresh: those of its rows the ext_watch thread has not handed
 * over already; fresh borrows them, its v is freed by the caller);
 * change: another process committed (the ext_watch thread); free: the
 * handle is going (after close). */
void es_presence_ext_watched(es_store *s, const char *ns);
void es_presence_ext_unwatched(es_store *s, const char *ns);
void es_presence_ext_own(es_store *s, const char *ns, const es_presence_rows *applied,
                         es_presence_rows *fresh, const es_presence_rows **give);
void es_presence_ext_change(es_store *s);
void es_presence_ext_free(es_store *s);
int es_core_fork(es_store *s, const char *scope, const char *from, int64_t at, const char *to,
                 es_lineage *out, es_err *err);
int es_core_lineage(es_store *s, const char *session, int *found, es_lineage *out, es_err *err);
int es_core_children(es_store *s, const char *session, const char *after, int64_t limit,
                     es_lineages *out, es_err *err);
int es_core_put_ref(es_store *s, const char *name, const char *session, es_ref *out, es_err *err);
int es_core_get_ref(es_store *s, const char *name, int *found, es_ref *out, es_err *err);
int es_core_list_refs(es_store *s, const char *after, int64_t limit, es_refs *out, es_err *err);
int es_core_delete_ref(es_store *s, const char *name, int *deleted, es_err *err);
int es_core_promote(es_store *s, const char *from_ref, const char *to_ref, int has_expect,
                    const char *expect, es_ref *out, char **actual, es_err *err);
int es_core_fence(es_store *s, const char *session, int64_t if_token, int64_t *token, es_err *err);
int es_core_lease(es_store *s, const char *session, const char *holder, int64_t ttl_ms,
                  es_lease *out, es_err *err);
int es_core_lease_release(es_store *s, const char *session, const char *holder, int64_t token,
                          int *released, es_err *err);
int es_core_seal(es_store *s, const char *session, const char *reason, es_err *err);
int es_core_truncate(es_store *s, const char *session, int64_t through, int64_t *first_index,
                     es_err *err);
int es_core_delete(es_store *s, const char *session, int *deleted, es_err *err);
int es_core_archive(es_store *s, const char *session, int64_t through, int *written,
                    es_segment *out, es_err *err);
int es_core_segments(es_store *s, const char *session, es_segments *out, es_err *err);
int es_core_compact_archive(es_store *s, const char *session, int64_t *before, int64_t *after,
                            es_err *err);
int es_core_verify_archive(es_store *s, const char *session, es_archive_report *out, es_err *err);
int es_core_shred(es_store *s, const char *name, int *was_live, es_err *err);
int es_core_read_at_rest(es_store *s, const char *session, int64_t after, int64_t through,
                         int64_t limit, es_events *out, es_err *err);
int es_core_counts(es_store *s, const char *scope, es_counts *out, es_err *err);

/* Sharding (shards.c) ------------------------------------------------------ */

/* An internal result code, never returned by a sharded handle: a shard
 * answers it for a session that moved to another shard (or is being moved
 * in). err->msg says so for people; es_shards_moved_target reads the
 * target shard's name the marker check put after the message. A store
 * opened directly passes it on (es_strerror names it STORAGE). */
#define ES_MOVED (ES_NCODES + 1)
/* The target shard's name carried by an ES_MOVED error, or NULL when the
 * session is being moved in (wait and retry). */
const char *es_shards_moved_target(const es_err *err);
/* At open, once the backend is open: s->bk becomes the marker-checking
 * backend wrapping it, and s->ops its table. ES_STORAGE: nothing changed. */
int es_shards_wrap_ops(es_store *s, es_err *err);
/* front.c's table of schemes: "shards:CATALOG" opens the catalog's plan. */
int es_shards_open_url(const char *url_rest, const es_open_opts *opts, es_store **out,
                       es_err *err);

#endif
