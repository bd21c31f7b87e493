/*
 * projections.h: what a store keeps for projections (docs/contract.md §8,
 * docs/projections.md): each projection's record (its live generation,
 * checkpoint, a generation being built beside it, failure, the runner's
 * lease) and its keyed states, per generation.
 *
 * The engine (engine/projections.c) folds and calls
 * es_store_projection_commit; readers call es_store_projection_read and
 * es_store_projection_keys; the binary's and HTTP's control commands call
 * es_store_projection_control. A commit writes the states a batch changed
 * and the record (with the checkpoint) in one write transaction: that is
 * the exactly-once rule of §8.
 *
 * Tenants (§3.11): a tenant view reads only the keys of its tenant (stored
 * behind its prefix) and cannot commit or control; the root handle reads
 * only the keys outside any tenant. Shards (§5): the router keeps every
 * projection in its catalog store (one transaction for all shards'
 * events), its checkpoint a read_all cursor.
 */
#ifndef ES_PROJECTIONS_H
#define ES_PROJECTIONS_H

#include "store/store.h"

/* A projection's record. Strings owned (es_projection_destroy); NULL when
 * absent. */
typedef struct es_projection {
  char *name;
  int64_t seq;               /* bumped by every commit and control: a commit names the one it
                              * read (compare-and-set), so no stale runner overwrites */
  int64_t generation;        /* the live generation, which reads answer from; 0: none yet */
  char *version;             /* its version (a hash of the projection's source) */
  int64_t position;          /* its checkpoint: the position of the last event folded */
  char *cursor;              /* the same as a read_all cursor (shards:), else NULL */
  int64_t building;          /* a generation being built beside the live one; 0: none */
  char *building_version;
  int64_t building_position;
  char *building_cursor;
  int failed;                /* the generation being folded stopped at an event */
  char *error;               /* why, naming the event */
  int64_t error_position;    /* the event it stopped at */
  char *error_id;
  char *error_cursor;        /* its cursor (shards:) */
  int64_t skipped;           /* events skipped by `projection skip` */
  int rebuild;               /* `projection rebuild` asked for a new generation */
  char *holder;              /* the engine running it (a lease) */
  int64_t lease_expires_at;  /* the lease's end (store clock) */
  int64_t updated_at;
} es_projection;

void es_projection_init(es_projection *p);
void es_projection_destroy(es_projection *p);
/* A deep copy into dst (initialised here); ES_STORAGE when out of memory. */
int es_projection_copy(es_projection *dst, const es_projection *src);

typedef struct es_projections {
  es_projection *v;
  size_t n, cap;
} es_projections;
void es_projections_destroy(es_projections *l);

/* One state a commit writes: value NULL removes the key. Borrowed. */
typedef struct es_proj_state {
  const char *key;
  const char *value;
  size_t len;
} es_proj_state;

typedef struct es_proj_keys {
  char **keys;   /* owned */
  size_t n;
  char *cursor;  /* owned: the last key when more follow, else NULL */
} es_proj_keys;
void es_proj_keys_destroy(es_proj_keys *k);

/* The live generation's state of key (NULL *value, ES_OK: none; a key
 * the projection never folded or no generation is live yet). *value is
 * the state codec's bytes (malloc'd); info (may be NULL) gets the record
 * (name only when the projection does not exist). */
int es_store_projection_read(es_store *s, const char *name, const char *key, char **value,
                             size_t *len, es_projection *info, es_err *err);
/* The engine's read while it folds: the state of key in generation gen
 * (the one it builds), the key behind scope (the tenant prefix of the
 * event's session, or NULL). */
int es_store_projection_read_gen(es_store *s, const char *scope, const char *name, const char *key,
                                 int64_t gen, char **value, size_t *len, es_err *err);
/* How far p (a record of s) is behind s's head: *head the newest
 * position (ES_NONE on shards:, which have none), *lag the positions
 * after the checkpoint of the generation being folded (on shards: the
 * events after its cursor, at most 1000 counted), *lag_ms how long ago
 * (store clock) the oldest event after it was written; 0 and 0 when it
 * is caught up. O(log n): a last position and one event read. On a
 * tenant handle, the tenant's events only. */
int es_store_projection_lag(es_store *s, const es_projection *p, int64_t *head, int64_t *lag,
                            int64_t *lag_ms, es_err *err);
/* Keys of the live generation starting with prefix, after `after` (NULL:
 * from the first), ascending byte order, at most limit (1..1000). */
int es_store_projection_keys(es_store *s, const char *name, const char *prefix, const char *after,
                             int64_t limit, es_proj_keys *out, es_err *err);
/* Every projection's record (name NULL) or one's (none: an empty list). */
int es_store_projections(es_store *s, const char *name, es_projections *out, es_err *err);
/* In one write transaction: checks that the stored record's seq is
 * expect_seq (0: no record yet) and that no other holder's lease is live
 * (else STALE_FENCE, nothing written); writes states[0..n) into
 * generation gen; removes the states of any generation the stored record
 * had (live or building) that next has not; writes next with seq + 1,
 * its holder's lease until now + ttl_ms. *out (may be NULL): the record
 * as written. Refused (INVALID_ARGUMENT) on a tenant handle. */
int es_store_projection_commit(es_store *s, const es_projection *next, int64_t expect_seq,
                               int64_t ttl_ms, int64_t gen, const es_proj_state *states, size_t n,
                               es_projection *out, es_err *err);
/* §8 control: "rebuild" (a new generation from the first position, built
 * while the live one answers), "retry" (a failed projection folds its
 * event again) or "skip" (a failed projection records that event as
 * skipped and goes on). NOT_FOUND for an unknown projection;
 * INVALID_ARGUMENT for retry or skip of one that has not failed. *out:
 * the record after. */
int es_store_projection_control(es_store *s, const char *name, const char *action,
                                es_projection *out, es_err *err);

#endif
