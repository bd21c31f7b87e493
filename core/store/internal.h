/*
 * internal.h: the store's insides, shared by the files of core/store/
 * (store.c: the rules; archive.c: segment files, §3.9; crypto.c: sealed
 * payloads and shredding, §3.10; tenant.c: tenant handles, §3.11). Not a
 * public header: bindings and the engine use store.h only.
 */
#ifndef ES_STORE_INTERNAL_H
#define ES_STORE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "store/backend.h"
#include "store/stats.h"

/* A caller of es_core_write queued for a group commit (store.c). */
typedef struct group_waiter group_waiter;

typedef struct presence_watch {
  uint64_t token;
  char *ns;
  es_presence_cb cb;
  void *ctx;
  struct presence_watch *next;
} presence_watch;

struct es_store {
  const es_backend_ops *ops;
  es_backend *bk;
  es_clock_fn clock;
  void *clock_ctx;
  es_id_fn ids;              /* NULL: UUIDv7 */
  void *ids_ctx;
  size_t max_payload;
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

  /* change notification (es_store_wait, subscriptions) */
  pthread_mutex_t vmu;
  pthread_cond_t vcond;      /* broadcast after every commit */
  atomic_uint_least64_t version;

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

  /* §3.11 tenants (tenant.c). A tenant handle is an es_store whose base is
   * the store it was made from: every es_store_* call on it maps names
   * (tenant_prefix + name) and calls the base. Only base, tenant_*, refs
   * and the t_closed flag are used in a tenant handle. */
  es_store *base;            /* retained; NULL: a store, not a tenant handle */
  char *tenant_prefix;       /* owned: tenant name + ES_TENANT_SEP */
  size_t tenant_len;         /* strlen(tenant_prefix) */
  atomic_int t_closed;       /* a tenant handle's own close() */

  /* Sharding (shards.c). A sharded handle is an es_store whose `shards`
   * is set: every es_store_* call on it routes to the shard owning the
   * session, or merges the shards. Only shards, the clock, ids, limits,
   * refs and the UUID state are used in a sharded handle. */
  struct es_shards *shards;  /* owned; NULL: not a sharded handle */
  /* Every store opened on one of the known backends checks the markers a
   * shard move leaves (docs/sharding.md): s->ops points at own_ops, a copy
   * of real_ops whose session and event lookups answer ES_MOVED for a
   * session moved away or being moved in. The mover uses real_ops. */
  const es_backend_ops *real_ops;  /* the backend's own table */
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
/* Runs fn in a read transaction (a consistent view of committed data). */
int es_core_read(es_store *s, txn_fn fn, void *arg, es_err *err);
/* Runs fn with the write lock held and no transaction open (a group's
 * transaction is open only while its leader holds the lock): for backend
 * work that cannot run inside one, like
 * SQLite's WAL checkpoint after a shred (§3.10). */
int es_core_outside_txn(es_store *s, int (*fn)(es_store *s, void *arg, es_err *err), void *arg,
                        es_err *err);

/* §3.9 archive (archive.c) ------------------------------------------------ */

/* Files to remove once the transaction that stopped naming them has
 * committed (truncate, delete, compact_archive): removing them before
 * would lose data if the commit failed. */
typedef struct es_archive_files {
  char **v;  /* owned paths */
  size_t n, cap;
} es_archive_files;

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
/* After the transaction: committed (1) removes the files, then each
 * directory they emptied, else only forgets them; frees the list either
 * way. */
void es_archive_files_finish(es_store *s, es_archive_files *f, int committed);
/* §3.11 tenants. The scoped forms of the calls whose answer spans sessions
 * or generates names (store.c): scope is a tenant's prefix (name +
 * ES_TENANT_SEP), whose sessions alone are listed and behind which
 * generated event ids are put; NULL is the store's own call. es_store_X(s)
 * is es_core_X(s, NULL) for a store, es_tenant_X for a tenant handle. */
int es_core_append(es_store *s, const char *scope, const char *session, const es_new_event *evs,
                   size_t n, int64_t expected, int64_t fence, es_events *out, int *pending,
                   es_err *err);
int es_core_read_all(es_store *s, const char *scope, int64_t after, int64_t limit, es_events *out,
                     es_err *err);
int es_core_claim_next(es_store *s, const char *scope, const char *holder, int64_t ttl_ms,
                       int64_t limit, const char *const *types, size_t n_types,
                       const char *const *skip, size_t n_skip, es_events *out, int64_t *retry_at,
                       es_err *err);
int es_core_complete(es_store *s, const char *scope, const char *session, int64_t index,
                     int64_t attempt, const es_new_event *evs, size_t n, int64_t fence,
                     int *outcome, es_events *out, es_err *err);
int es_core_dead_letters(es_store *s, const char *scope, const char *session, int64_t after,
                         int64_t limit, es_events *out, es_err *err);
int es_core_pending_types(es_store *s, const char *scope, es_type_counts *out, es_err *err);
int es_core_wait(es_store *s, const char *scope, const char *session, int64_t after,
                 int64_t timeout_ms, int64_t limit, es_events *out, es_err *err);
int es_core_fork(es_store *s, const char *scope, const char *from, int64_t at, const char *to,
                 es_lineage *out, es_err *err);

/* §3.12 (stats.c): the counts of scope's sessions (NULL: every session). */
int es_core_counts(es_store *s, const char *scope, es_counts *out, es_err *err);

/* tenant.c: every es_store_* call on a tenant handle (s->base set) lands
 * in its es_tenant_* twin, with the same arguments. */
void es_tenant_close(es_store *s);
void es_tenant_free(es_store *s);  /* the last reference went */
int es_tenant_data_version(es_store *s, uint64_t *version, es_err *err);
int es_tenant_append(es_store *s, const char *session, const es_new_event *evs, size_t n,
                     int64_t expected, int64_t fence, es_events *out, int *pending, es_err *err);
int es_tenant_read(es_store *s, const char *session, int64_t after, int64_t through,
                   int64_t limit, es_events *out, es_err *err);
int es_tenant_events_page(es_store *s, const char *session, int64_t after, int64_t through,
                          int64_t limit, es_events *out, int64_t *through_out, es_err *err);
int es_tenant_head(es_store *s, const char *session, int64_t *head, es_err *err);
int es_tenant_read_all(es_store *s, int64_t after, int64_t limit, es_events *out, es_err *err);
int es_tenant_last_position(es_store *s, int64_t *position, es_err *err);
int es_tenant_get(es_store *s, const char *session, int64_t index, es_event *out, es_err *err);
int es_tenant_claim(es_store *s, const char *session, const es_claim_opts *o, int *outcome,
                    es_events *out, int64_t *retry_at, es_err *err);
int es_tenant_claim_next(es_store *s, const char *holder, int64_t ttl_ms, int64_t limit,
                         const char *const *types, size_t n_types, const char *const *skip,
                         size_t n_skip, es_events *out, int64_t *retry_at, es_err *err);
int es_tenant_renew(es_store *s, const char *session, const char *holder,
                    const es_claim_ref *claims, size_t n, int64_t ttl_ms, int64_t expires_at,
                    es_renew_result *out, es_err *err);
int es_tenant_release_claims(es_store *s, const char *session, const char *holder,
                             const es_claim_ref *claims, size_t n, es_renew_result *out,
                             es_err *err);
int es_tenant_complete(es_store *s, const char *session, int64_t index, int64_t attempt,
                       const es_new_event *evs, size_t n, int64_t fence, int *outcome,
                       es_events *out, es_err *err);
int es_tenant_fail(es_store *s, const char *session, int64_t index, int64_t attempt,
                   const char *error, int64_t max_failures, int64_t retry_after_ms, int *outcome,
                   int64_t *failures, es_err *err);
int es_tenant_revive(es_store *s, const char *session, int64_t index, es_err *err);
int es_tenant_settle(es_store *s, const char *session, int64_t index, const char *reason,
                     es_err *err);
int es_tenant_dead_letters(es_store *s, const char *session, int64_t after, int64_t limit,
                           es_events *out, es_err *err);
int es_tenant_read_state(es_store *s, const char *session, const char *reducer, int *found,
                         es_snapshot *snap, es_events *events, es_err *err);
int es_tenant_read_states(es_store *s, const char *const *sessions, size_t n, const char *reducer,
                          es_state_read *out, es_err *err);
int es_tenant_put_snapshot(es_store *s, const char *session, const char *reducer, int64_t index,
                           const char *state, size_t state_len, const char *version, int *stored,
                           es_err *err);
int es_tenant_snapshots(es_store *s, const char *session, es_snapshots *out, es_err *err);
int es_tenant_sessions(es_store *s, const char *prefix, const char *after, int64_t limit,
                       es_sessions *out, es_err *err);
int es_tenant_pending_types(es_store *s, es_type_counts *out, es_err *err);
int es_tenant_wait(es_store *s, const char *session, int64_t after, int64_t timeout_ms,
                   int64_t limit, es_events *out, es_err *err);
int es_tenant_presence_set(es_store *s, const char *ns, const char *participant,
                           const es_presence_field *fields, size_t n, int64_t ttl_ms, int64_t at,
                           int64_t seen, es_presence_rows *applied, es_err *err);
int es_tenant_presence_read(es_store *s, const char *ns, es_presence_rows *out, es_err *err);
uint64_t es_tenant_presence_watch(es_store *s, const char *ns, es_presence_cb cb, void *ctx);
void es_tenant_presence_unwatch(es_store *s, uint64_t token);
int es_tenant_fork(es_store *s, const char *from, int64_t at, const char *to, es_lineage *out,
                   es_err *err);
int es_tenant_lineage(es_store *s, const char *session, int *found, es_lineage *out, es_err *err);
int es_tenant_children(es_store *s, const char *session, const char *after, int64_t limit,
                       es_lineages *out, es_err *err);
int es_tenant_put_ref(es_store *s, const char *name, const char *session, es_ref *out,
                      es_err *err);
int es_tenant_get_ref(es_store *s, const char *name, int *found, es_ref *out, es_err *err);
int es_tenant_list_refs(es_store *s, const char *after, int64_t limit, es_refs *out, es_err *err);
int es_tenant_delete_ref(es_store *s, const char *name, int *deleted, es_err *err);
int es_tenant_promote(es_store *s, const char *from_ref, const char *to_ref, int has_expect,
                      const char *expect, es_ref *out, char **actual, es_err *err);
int es_tenant_fence(es_store *s, const char *session, int64_t if_token, int64_t *token,
                    es_err *err);
int es_tenant_lease(es_store *s, const char *session, const char *holder, int64_t ttl_ms,
                    es_lease *out, es_err *err);
int es_tenant_lease_release(es_store *s, const char *session, const char *holder, int64_t token,
                            int *released, es_err *err);
int es_tenant_seal(es_store *s, const char *session, const char *reason, es_err *err);
int es_tenant_truncate(es_store *s, const char *session, int64_t through, int64_t *first_index,
                       es_err *err);
int es_tenant_delete(es_store *s, const char *session, int *deleted, es_err *err);
int es_tenant_shred(es_store *s, const char *name, int *was_live, es_err *err);
int es_tenant_counts(es_store *s, es_counts *out, es_err *err); /* §3.12 */
int es_tenant_read_at_rest(es_store *s, const char *session, int64_t after, int64_t through,
                           int64_t limit, es_events *out, es_err *err);
int es_tenant_archive(es_store *s, const char *session, int64_t through, int *written,
                      es_segment *out, es_err *err);
int es_tenant_segments(es_store *s, const char *session, es_segments *out, es_err *err);
int es_tenant_compact_archive(es_store *s, const char *session, int64_t *before, int64_t *after,
                              es_err *err);
int es_tenant_verify_archive(es_store *s, const char *session, es_archive_report *out,
                             es_err *err);


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
/* At open: s->ops becomes the marker-checking copy of the backend's ops. */
void es_shards_wrap_ops(es_store *s);
/* store.c: es_store_open("shards:CATALOG") opens the catalog's plan. */
int es_shards_open_url(const char *url_rest, const es_open_opts *opts, es_store **out,
                       es_err *err);
uint64_t es_shards_version(es_store *s);
int es_shards_tenant(es_store *s, const char *name, es_store **out, es_err *err);
/* Every es_store_* call on a sharded handle (s->shards set) lands in its
 * es_shards_* twin, with the same arguments. */
void es_shards_close(es_store *s);
void es_shards_free(es_store *s);  /* the last reference went */
int es_shards_data_version(es_store *s, uint64_t *version, es_err *err);
int es_shards_append(es_store *s, const char *session, const es_new_event *evs, size_t n,
                     int64_t expected, int64_t fence, es_events *out, int *pending, es_err *err);
int es_shards_read(es_store *s, const char *session, int64_t after, int64_t through,
                   int64_t limit, es_events *out, es_err *err);
int es_shards_events_page(es_store *s, const char *session, int64_t after, int64_t through,
                          int64_t limit, es_events *out, int64_t *through_out, es_err *err);
int es_shards_head(es_store *s, const char *session, int64_t *head, es_err *err);
int es_shards_read_all(es_store *s, int64_t after, int64_t limit, es_events *out, es_err *err);
int es_shards_last_position(es_store *s, int64_t *position, es_err *err);
int es_shards_get(es_store *s, const char *session, int64_t index, es_event *out, es_err *err);
int es_shards_claim(es_store *s, const char *session, const es_claim_opts *o, int *outcome,
                    es_events *out, int64_t *retry_at, es_err *err);
int es_shards_claim_next(es_store *s, const char *holder, int64_t ttl_ms, int64_t limit,
                         const char *const *types, size_t n_types, const char *const *skip,
                         size_t n_skip, es_events *out, int64_t *retry_at, es_err *err);
int es_shards_renew(es_store *s, const char *session, const char *holder,
                    const es_claim_ref *claims, size_t n, int64_t ttl_ms, int64_t expires_at,
                    es_renew_result *out, es_err *err);
int es_shards_release_claims(es_store *s, const char *session, const char *holder,
                             const es_claim_ref *claims, size_t n, es_renew_result *out,
                             es_err *err);
int es_shards_complete(es_store *s, const char *session, int64_t index, int64_t attempt,
                       const es_new_event *evs, size_t n, int64_t fence, int *outcome,
                       es_events *out, es_err *err);
int es_shards_fail(es_store *s, const char *session, int64_t index, int64_t attempt,
                   const char *error, int64_t max_failures, int64_t retry_after_ms, int *outcome,
                   int64_t *failures, es_err *err);
int es_shards_revive(es_store *s, const char *session, int64_t index, es_err *err);
int es_shards_settle(es_store *s, const char *session, int64_t index, const char *reason,
                     es_err *err);
int es_shards_dead_letters(es_store *s, const char *session, int64_t after, int64_t limit,
                           es_events *out, es_err *err);
int es_shards_read_state(es_store *s, const char *session, const char *reducer, int *found,
                         es_snapshot *snap, es_events *events, es_err *err);
int es_shards_read_states(es_store *s, const char *const *sessions, size_t n, const char *reducer,
                          es_state_read *out, es_err *err);
int es_shards_put_snapshot(es_store *s, const char *session, const char *reducer, int64_t index,
                           const char *state, size_t state_len, const char *version, int *stored,
                           es_err *err);
int es_shards_snapshots(es_store *s, const char *session, es_snapshots *out, es_err *err);
int es_shards_sessions(es_store *s, const char *prefix, const char *after, int64_t limit,
                       es_sessions *out, es_err *err);
int es_shards_pending_types(es_store *s, es_type_counts *out, es_err *err);
int es_shards_wait(es_store *s, const char *session, int64_t after, int64_t timeout_ms,
                   int64_t limit, es_events *out, es_err *err);
int es_shards_presence_set(es_store *s, const char *ns, const char *participant,
                           const es_presence_field *fields, size_t n, int64_t ttl_ms, int64_t at,
                           int64_t seen, es_presence_rows *applied, es_err *err);
int es_shards_presence_read(es_store *s, const char *ns, es_presence_rows *out, es_err *err);
uint64_t es_shards_presence_watch(es_store *s, const char *ns, es_presence_cb cb, void *ctx);
void es_shards_presence_unwatch(es_store *s, uint64_t token);
int es_shards_fork(es_store *s, const char *from, int64_t at, const char *to, es_lineage *out,
                   es_err *err);
int es_shards_lineage(es_store *s, const char *session, int *found, es_lineage *out, es_err *err);
int es_shards_children(es_store *s, const char *session, const char *after, int64_t limit,
                       es_lineages *out, es_err *err);
int es_shards_put_ref(es_store *s, const char *name, const char *session, es_ref *out,
                      es_err *err);
int es_shards_get_ref(es_store *s, const char *name, int *found, es_ref *out, es_err *err);
int es_shards_list_refs(es_store *s, const char *after, int64_t limit, es_refs *out, es_err *err);
int es_shards_delete_ref(es_store *s, const char *name, int *deleted, es_err *err);
int es_shards_promote(es_store *s, const char *from_ref, const char *to_ref, int has_expect,
                      const char *expect, es_ref *out, char **actual, es_err *err);
int es_shards_fence(es_store *s, const char *session, int64_t if_token, int64_t *token,
                    es_err *err);
int es_shards_lease(es_store *s, const char *session, const char *holder, int64_t ttl_ms,
                    es_lease *out, es_err *err);
int es_shards_lease_release(es_store *s, const char *session, const char *holder, int64_t token,
                            int *released, es_err *err);
int es_shards_seal(es_store *s, const char *session, const char *reason, es_err *err);
int es_shards_truncate(es_store *s, const char *session, int64_t through, int64_t *first_index,
                       es_err *err);
int es_shards_delete(es_store *s, const char *session, int *deleted, es_err *err);
int es_shards_shred(es_store *s, const char *name, int *was_live, es_err *err);
int es_shards_read_at_rest(es_store *s, const char *session, int64_t after, int64_t through,
                           int64_t limit, es_events *out, es_err *err);
int es_shards_archive(es_store *s, const char *session, int64_t through, int *written,
                      es_segment *out, es_err *err);
int es_shards_segments(es_store *s, const char *session, es_segments *out, es_err *err);
int es_shards_compact_archive(es_store *s, const char *session, int64_t *before, int64_t *after,
                              es_err *err);
int es_shards_verify_archive(es_store *s, const char *session, es_archive_report *out,
                             es_err *err);


#endif
