/*
 * store_impl.h: the store interface, the table of operations every kind
 * of store handle implements (docs/store.md "One interface, three
 * implementations").
 *
 * The public front door (store.h, front.c) checks nothing an
 * implementation would check differently: it counts the call (§3.12,
 * ES_STATS_CALL) and forwards it to s->impl. Three implementations:
 *
 *   the core store    the rules over a row-level backend (store.c and the
 *                     files of the rules; es_core_ops)
 *   the tenant view   names behind a tenant's prefix over any store it
 *                     wraps (tenant.c; §3.11)
 *   the shard router  each session on the shard that owns it, cross-session
 *                     calls merged over the shards (shards.c; §5)
 *
 * A view or router holds the stores it wraps and calls only their ops (or
 * the public es_store_* calls), never their insides, so they compose: a
 * tenant view over a sharded store routes each of the tenant's sessions
 * to its shard.
 *
 * Scope. The ops whose answer spans sessions (read_all, last_position,
 * claim_next, dead_letters with no session, pending_types, wait with no
 * session, counts) and those where the store makes names (the generated
 * event ids of append, complete and fork) take `scope`: a session-name
 * prefix (a tenant's name + ES_TENANT_SEP), or NULL for every session.
 * With a scope, such an op sees only the sessions whose names start with
 * it, and puts every id it generates behind it (so a tenant's ids are
 * its own). The front door passes NULL; a tenant view passes its prefix
 * (behind any scope it is given); a router passes the scope on to each
 * shard. Every other op takes full (stored) names and needs no scope.
 *
 * Every op has the arguments and results of its es_store_* call (store.h
 * says what each means); an op's first argument is the handle whose table
 * it is. No op may be NULL except tenant_name.
 */
#ifndef ES_STORE_IMPL_H
#define ES_STORE_IMPL_H

#include "store/projections.h"
#include "store/store.h"

typedef struct es_store_ops {
  /* Closes the handle (es_store_close): later calls are CLOSED; harmless twice. */
  void (*close)(es_store *s);
  /* The last reference went (es_store_release): close if needed and free the handle. */
  void (*free)(es_store *s);
  /* ES_OK while the handle is open, else ES_CLOSED (a view is made only over an open store). */
  int (*check_open)(es_store *s, es_err *err);
  /* A counter that changes with every commit the handle can see (es_store_version). */
  uint64_t (*version)(es_store *s);
  /* A number that changes when any process commits to the storage. */
  int (*data_version)(es_store *s, uint64_t *version, es_err *err);
  /* A new event id, as the implementation's appends would generate one. */
  int (*new_id)(es_store *s, char out[ES_MAX_ID_BYTES + 1], es_err *err);
  /* A tenant view over this handle (es_store_tenant), or an error saying why not. */
  int (*tenant)(es_store *s, const char *name, es_store **out, es_err *err);
  /* The tenant's name for a tenant view, NULL for any other handle; may be NULL. */
  const char *(*tenant_name)(const es_store *s);
  /* §3.1 append n events to a session. */
  int (*append)(es_store *s, const char *scope, const char *session, const es_new_event *evs,
      size_t n, int64_t expected, int64_t fence, es_events *out, int *pending, es_err *err);
  /* §3.1 several appends in one transaction; the front door has emptied
   * each batch's results. */
  int (*append_many)(es_store *s, const char *scope, es_append_batch *v, size_t n, es_err *err);
  /* §3.1 a session's events in (after, through]. */
  int (*read)(es_store *s, const char *session, int64_t after, int64_t through, int64_t limit,
      es_events *out, es_err *err);
  /* A page of a session's events and where the next page starts. */
  int (*events_page)(es_store *s, const char *session, int64_t after, int64_t through,
      int64_t limit, es_events *out, int64_t *through_out, es_err *err);
  /* §3.1 a session's head index. */
  int (*head)(es_store *s, const char *session, int64_t *head, es_err *err);
  /* §3.1 every session's events by position (spans sessions). */
  int (*read_all)(es_store *s, const char *scope, int64_t after, int64_t limit, es_events *out,
      es_err *err);
  /* §5 read_all resumed from a cursor (spans sessions): es_store_read_all_cursor. */
  int (*read_all_cursor)(es_store *s, const char *scope, const char *cursor, int64_t limit,
      es_events *out, char ***cursors, es_err *err);
  /* §3.1 the highest position stored (spans sessions). */
  int (*last_position)(es_store *s, const char *scope, int64_t *position, es_err *err);
  /* §3.1 one event by (session, index). */
  int (*get)(es_store *s, const char *session, int64_t index, es_event *out, es_err *err);
  /* §3.2 claim a session's next ready events. */
  int (*claim)(es_store *s, const char *session, const es_claim_opts *o, int *outcome,
      es_events *out, int64_t *retry_at, es_err *err);
  /* §3.2 claim ready events of any session (spans sessions). */
  int (*claim_next)(es_store *s, const char *scope, const char *holder, int64_t ttl_ms,
      int64_t limit, const char *const *types, size_t n_types, const char *const *skip,
      size_t n_skip, es_events *out, int64_t *retry_at, es_err *err);
  /* §3.2 extend a holder's claims. */
  int (*renew)(es_store *s, const char *session, const char *holder, const es_claim_ref *claims,
      size_t n, int64_t ttl_ms, int64_t expires_at, es_renew_result *out, es_err *err);
  /* §3.2 give a holder's claims back. */
  int (*release_claims)(es_store *s, const char *session, const char *holder,
      const es_claim_ref *claims, size_t n, es_renew_result *out, es_err *err);
  /* §3.2 complete a claimed event, appending its follow-ups. */
  int (*complete)(es_store *s, const char *scope, const char *session, int64_t index,
      int64_t attempt, const es_new_event *evs, size_t n, int64_t fence, int *outcome,
      es_events *out, es_err *err);
  /* §3.2 one completion with cancels of the same session, atomically. */
  int (*complete_cancel)(es_store *s, const char *scope, es_completion *c, es_events *out,
                         es_err *err);
  /* §3.2 several completions; the front door has reset each item's result. */
  int (*complete_many)(es_store *s, es_completion *v, size_t n, es_err *err);
  /* §3.2 fail a claimed event (backoff or dead letter). */
  int (*fail)(es_store *s, const char *session, int64_t index, int64_t attempt, const char *error,
      int64_t max_failures, int64_t retry_after_ms, int *outcome, int64_t *failures, es_err *err);
  /* §3.3 put a dead letter back in the queue. */
  int (*revive)(es_store *s, const char *session, int64_t index, es_err *err);
  /* §3.3 mark a dead letter handled. */
  int (*settle)(es_store *s, const char *session, int64_t index, const char *reason, es_err *err);
  /* §3.2 cancel a pending event that no live claim holds. */
  int (*cancel)(es_store *s, const char *session, int64_t index, const char *reason,
                es_event *out, es_err *err);
  /* §3.3 dead letters, of one session or (session NULL) of all. */
  int (*dead_letters)(es_store *s, const char *scope, const char *session, int64_t after,
      int64_t limit, es_events *out, es_err *err);
  /* §3.4 a reducer's snapshot and the events after it. */
  int (*read_state)(es_store *s, const char *session, const char *reducer, int *found,
      es_snapshot *snap, es_events *events, es_err *err);
  /* §3.4 read_state for several sessions. */
  int (*read_states)(es_store *s, const char *const *sessions, size_t n, const char *reducer,
      es_state_read *out, es_err *err);
  /* §3.4 store a reducer's snapshot. */
  int (*put_snapshot)(es_store *s, const char *session, const char *reducer, int64_t index,
      const char *state, size_t state_len, const char *version, int *stored, es_err *err);
  /* §3.4 a session's snapshots. */
  int (*snapshots)(es_store *s, const char *session, es_snapshots *out, es_err *err);
  /* §3.5 session names by prefix, after a cursor (spans sessions). */
  int (*sessions)(es_store *s, const char *prefix, const char *after, int64_t limit,
      es_sessions *out, es_err *err);
  /* §3.2 pending counts by event type (spans sessions). */
  int (*pending_types)(es_store *s, const char *scope, es_type_counts *out, es_err *err);
  /* §3.1 wait for events after an index (or, session NULL, a position). */
  int (*wait)(es_store *s, const char *scope, const char *session, int64_t after,
      int64_t timeout_ms, int64_t limit, es_events *out, es_err *err);
  /* §3.6 set a participant's presence fields. */
  int (*presence_set)(es_store *s, const char *ns, const char *participant,
      const es_presence_field *fields, size_t n, int64_t ttl_ms, int64_t at, int64_t seen,
      es_presence_rows *applied, es_err *err);
  /* §3.6 a namespace's live presence rows. */
  int (*presence_read)(es_store *s, const char *ns, es_presence_rows *out, es_err *err);
  /* §3.6 call cb on each change of a namespace; 0 on failure. */
  uint64_t (*presence_watch)(es_store *s, const char *ns, es_presence_cb cb, void *ctx);
  /* §3.6 stop a presence_watch. */
  void (*presence_unwatch)(es_store *s, uint64_t token);
  /* §3.7 a new session from another's prefix. */
  int (*fork)(es_store *s, const char *scope, const char *from, int64_t at, const char *to,
      es_lineage *out, es_err *err);
  /* §3.7 where a session was forked from. */
  int (*lineage)(es_store *s, const char *session, int *found, es_lineage *out, es_err *err);
  /* §3.7 the sessions forked from a session. */
  int (*children)(es_store *s, const char *session, const char *after, int64_t limit,
      es_lineages *out, es_err *err);
  /* §3.7 point a ref at a session. */
  int (*put_ref)(es_store *s, const char *name, const char *session, es_ref *out, es_err *err);
  /* §3.7 a ref's session and head. */
  int (*get_ref)(es_store *s, const char *name, int *found, es_ref *out, es_err *err);
  /* §3.7 refs by name after a cursor. */
  int (*list_refs)(es_store *s, const char *after, int64_t limit, es_refs *out, es_err *err);
  /* §3.7 remove a ref. */
  int (*delete_ref)(es_store *s, const char *name, int *deleted, es_err *err);
  /* §3.7 move a ref to another's session, compare-and-set. */
  int (*promote)(es_store *s, const char *from_ref, const char *to_ref, int has_expect,
      const char *expect, es_ref *out, char **actual, es_err *err);
  /* §3.8 a session's next fence token. */
  int (*fence)(es_store *s, const char *session, int64_t if_token, int64_t *token, es_err *err);
  /* §3.8 take or renew a session's lease. */
  int (*lease)(es_store *s, const char *session, const char *holder, int64_t ttl_ms, es_lease *out,
      es_err *err);
  /* §3.8 give a lease back. */
  int (*lease_release)(es_store *s, const char *session, const char *holder, int64_t token,
      int *released, es_err *err);
  /* §3.9 refuse further appends to a session. */
  int (*seal)(es_store *s, const char *session, const char *reason, es_err *err);
  /* §3.9 drop a session's events through an index. */
  int (*truncate)(es_store *s, const char *session, int64_t through, int64_t *first_index,
      es_err *err);
  /* §3.9 delete a session. */
  int (*delete)(es_store *s, const char *session, int *deleted, es_err *err);
  /* §3.9 move a session's old events to a segment file. */
  int (*archive)(es_store *s, const char *session, int64_t through, int *written, es_segment *out,
      es_err *err);
  /* §3.9 a session's segment files. */
  int (*segments)(es_store *s, const char *session, es_segments *out, es_err *err);
  /* §3.9 sessions with segments whose name starts with prefix ("" or a
   * tenant's), after a cursor. */
  int (*archived)(es_store *s, const char *prefix, const char *after, int64_t limit,
                  es_archived *out, es_err *err);
  /* §3.9 merge a session's segment files. */
  int (*compact_archive)(es_store *s, const char *session, int64_t *before, int64_t *after,
      es_err *err);
  /* §3.9 check a session's segment files. */
  int (*verify_archive)(es_store *s, const char *session, es_archive_report *out, es_err *err);
  /* §3.10 destroy a key, making its payloads unreadable. */
  int (*shred)(es_store *s, const char *name, int *was_live, es_err *err);
  /* §3.10 events as stored (sealed payloads left sealed). */
  int (*read_at_rest)(es_store *s, const char *session, int64_t after, int64_t through,
      int64_t limit, es_events *out, es_err *err);
  /* §3.12 the handle's counts (a tenant's: its own sessions). */
  int (*counts)(es_store *s, const char *scope, es_counts *out, es_err *err);
  /* §3.1 what the handle can do (a view: its base's, with its tenant). */
  int (*capabilities)(es_store *s, es_capabilities *out, es_err *err);
  /* §8 projections (projections.h). scope: the keys' tenant prefix (NULL:
   * the keys outside any tenant); commit and control refuse a scope. */
  int (*projection_read)(es_store *s, const char *scope, const char *name, const char *key,
                         int64_t gen, char **value, size_t *len, es_projection *info, es_err *err);
  int (*projection_keys)(es_store *s, const char *scope, const char *name, const char *prefix,
                         const char *after, int64_t limit, es_proj_keys *out, es_err *err);
  int (*projections)(es_store *s, const char *name, es_projections *out, es_err *err);
  int (*projection_commit)(es_store *s, const char *scope, const es_projection *next,
                           int64_t expect_seq, int64_t ttl_ms, int64_t gen,
                           const es_proj_state *states, size_t n, es_projection *out, es_err *err);
  int (*projection_control)(es_store *s, const char *scope, const char *name, const char *action,
                            es_projection *out, es_err *err);
} es_store_ops;

/* The core store's table (store.c). */
extern const es_store_ops es_core_ops;

/* A tenant view of `name` over base (tenant.c): checks the name (§3.11)
 * and retains base. Any implementation's tenant op that allows tenants
 * makes its view with this. */
int es_tenant_open(es_store *base, const char *name, es_store **out, es_err *err);

/* complete_many as completions one by one through s's own complete (a
 * view's or a router's complete_many: each item goes through the rules of
 * the store it lands in). front.c. */
int es_complete_many_each(es_store *s, es_completion *v, size_t n, es_err *err);

#endif
