/*
 * shards_internal.h: what the files of the shard router share (shards.c:
 * the handle, routing, the calls about one session; shard_lists.c: the
 * calls that span sessions; shard_moves.c: plan changes and fork;
 * shard_plan.c: plans, hashing and the catalog; shard_marks.c: the move
 * markers and the marker-checking backend). Not a public header. Each function's comment is at its
 * definition.
 */
#ifndef ES_STORE_SHARDS_INTERNAL_H
#define ES_STORE_SHARDS_INTERNAL_H

#include "store/internal.h"
#include "store/shards.h"

#include <pthread.h>
#include <stdatomic.h>

static inline int nomem(es_err *err) { return es_fail(err, ES_STORAGE, "out of memory"); }

/* The catalog session holding the plans (one event per plan change). */
#define CATALOG_SESSION "eventstore.shard_plan"
/* The catalog session naming every key shredded through the router
 * (es_sh_catalog_shredded_put). */
#define SHREDDED_SESSION "eventstore.shredded_keys"
/* Markers in a shard's session rows (fence values no user can make:
 * es_store_fence only counts up from 0). */
#define FENCE_TOMBSTONE (-1)
#define FENCE_INCOMING (-2)
#define FENCE_FROZEN_BASE (-1000) /* frozen: FENCE_FROZEN_BASE - the real fence */
/* How long a call waits for a session being moved in, and how many
 * redirects it follows, before it gives up with STORAGE. */
#define MOVE_WAIT_MS 10000
#define MAX_REDIRECTS 64
/* Cross-session calls look at the catalog for a newer plan this often. */
#define PLAN_REFRESH_MS 500
/* Where ES_MOVED's target shard name sits in err->msg, after the text. */
#define MOVED_TAIL (ES_ERRMSG_MAX - ES_MAX_SHARD_NAME_BYTES - 3)

/* A shard's plan record: the session row named "" whose fence is the plan
 * version and whose seal_reason lists this shard's name, then every shard
 * name of the plan, one a line. Parsed into names[0] (this shard) and
 * names[1..n]. */
typedef struct {
  int64_t version;
  char *text;   /* owned; names point into it */
  char **names; /* owned array */
  size_t n;     /* names, this shard's included */
} plan_record;

/* The catalog's plans: the newest current one and a newer pending one
 * (version 0: none); *head: the catalog session's head, for the next
 * install's compare-and-set. */
typedef struct {
  es_shard_plan cur, pend;
  int64_t head;
} catalog_view;

const char *es_sh_owner_of_names(char *const *names, size_t n, const char *key);
int es_sh_plan_copy(es_shard_plan *dst, const es_shard_plan *src);
int es_sh_plan_same_shards(const es_shard_plan *a, const es_shard_plan *b);
const es_shard_def *es_sh_plan_find(const es_shard_plan *p, const char *name);
int es_sh_hex4(const char *p, unsigned *v);
void es_sh_view_destroy(catalog_view *v);
int es_sh_catalog_load(es_store *cat, catalog_view *v, es_err *err);
int es_sh_catalog_put(es_store *cat, const es_shard_plan *p, const char *state, int64_t head,
                      es_err *err);
int es_sh_catalog_shredded_put(es_store *cat, const char *name, es_err *err);
int es_sh_catalog_shredded_each(es_store *cat, int (*fn)(void *ctx, const char *name, es_err *err),
                                void *ctx, es_err *err);
void es_sh_record_destroy(plan_record *r);
int es_sh_record_get(const es_backend_ops *ops, es_backend *bk, es_txn *t, plan_record *r,
                     es_err *err);
int es_sh_moved(es_err *err, const char *session, const char *target, int64_t version);
int64_t es_sh_encode_frozen(const es_event *row);
void es_sh_decode_frozen(es_event *row);

/* One opened shard store, by name and url (kept until the handle goes:
 * calls in flight may hold it). */
typedef struct conn {
  char *name, *url;
  es_store *st;
  struct conn *next;
} conn;

/* Plans the handle routed by: kept until it goes (calls in flight read
 * them without a lock). */
typedef struct plan_node {
  es_shard_plan p;
  struct plan_node *next;
} plan_node;

/* A presence watch: the sharded token and the shard's. */
typedef struct swatch {
  uint64_t token, inner;
  es_store *st;
  struct swatch *next;
} swatch;

/* The router: an es_store (its impl is shards_ops) and its own state. Of
 * the es_store only impl, refs, the clock, the ids and their state, the
 * limits and the stats are used. */
struct es_shards {
  es_store h;                /* first: a router's es_store * is its struct es_shards * */
  pthread_mutex_t mu;        /* guards every field below but the atomics */
  es_store *catalog;         /* owned reference */
  es_open_opts opts;         /* the catalog's open (clock, limits, ids; borrowed ctxs) */
  char *keys_path;           /* owned, or NULL: §3.10 keys, given to every shard (not the catalog) */
  char *archive_root;        /* owned, or NULL: §3.9 archive; shard NAME's segments go in
                                archive_root/NAME (es_sh_archive_dir) */
  const es_shard_plan *cur;  /* the plan calls route by (a node of plans) */
  const es_shard_plan *pend; /* a pending plan (moves under way), or NULL */
  plan_node *plans;
  int64_t refreshed_ms;      /* when the catalog was last read */
  conn *conns;
  swatch *watches;
  uint64_t next_token;
  atomic_uint rr;            /* claim_next's first shard, rotating */
  atomic_int closed;
  atomic_llong crash_after;  /* test hook: steps left before a simulated crash; 0: off */
  atomic_llong pause_after;  /* test hook: steps left before a pause; 0: off */
  char *pause_path;          /* owned; the pause hook's gate file */
};

static inline struct es_shards *SH(const es_store *s) { return (struct es_shards *)s; }

static inline int sh_enter(es_store *s, es_err *err) {
  if (atomic_load(&SH(s)->closed)) return es_fail(err, ES_CLOSED, "the store is closed");
  return ES_OK;
}

/* Every shard a cross-session call must look at: the current plan's and
 * a pending plan's (sessions already moved to a new shard live there). */
typedef struct {
  es_store *st[2 * ES_MAX_SHARDS];
  const char *name[2 * ES_MAX_SHARDS];
  size_t n;
} shard_set;

typedef struct {
  int redirects;
  int64_t started;  /* mono_ms of the first wait, 0: none yet */
  char target[ES_MAX_SHARD_NAME_BYTES + 1];
  int has_target;
} route;

/* Work on the shard owning a key (es_sh_routed). */
typedef int (*routed_fn)(es_store *st, void *arg, es_err *err);

/* A call about one session (or namespace): `call` uses st. */
#define ROUTED(what, key, call)                                    \
  do {                                                             \
    route r_;                                                      \
    memset(&r_, 0, sizeof r_);                                     \
    int rc_;                                                       \
    for (;;) {                                                     \
      es_store *st;                                                \
      if ((rc_ = es_sh_route_store(s, what, key, &r_, &st, err))) break; \
      rc_ = (call);                                                \
      if (!es_sh_route_again(s, &r_, &rc_, err)) break;                  \
    }                                                              \
    return rc_;                                                    \
  } while (0)

int es_sh_step(es_store *s, es_err *err);
int es_sh_crashed(es_store *s, es_err *err);
int es_sh_shard_store(es_store *s, const char *name, const char *url, es_store **out,
                      es_err *err);
char *es_sh_archive_dir(const char *root, const char *name);
int es_sh_segment_path(es_store *s, es_store *st, char **file, es_err *err);
int es_sh_adopt(es_store *s, catalog_view *v, es_err *err);
int es_sh_reload(es_store *s, es_err *err);
int es_sh_all_shards(es_store *s, shard_set *set, es_err *err);
int es_sh_route_store(es_store *s, const char *what, const char *key, route *r, es_store **st,
                      es_err *err);
int es_sh_route_again(es_store *s, route *r, int *rc, es_err *err);
int es_sh_merged_again(int64_t *started, int *rc, es_err *err);
int es_sh_head(es_store *s, const char *session, int64_t *head, es_err *err);
int es_sh_read_state(es_store *s, const char *session, const char *reducer, int *found,
                     es_snapshot *snap, es_events *events, es_err *err);
int es_sh_lineage(es_store *s, const char *session, int *found, es_lineage *out,
                  es_err *err);
int es_sh_routed(es_store *s, const char *what, const char *key, routed_fn fn, void *arg,
                 es_err *err);
int es_sh_sessions(es_store *s, const char *prefix, const char *after, int64_t limit,
                   es_sessions *out, es_err *err);
int es_sh_read_all(es_store *s, const char *scope, int64_t after, int64_t limit, es_events *out, es_err *err);
int es_sh_last_position(es_store *s, const char *scope, int64_t *position, es_err *err);
int es_sh_claim_next(es_store *s, const char *scope, const char *holder, int64_t ttl_ms, int64_t limit,
                     const char *const *types, size_t n_types, const char *const *skip,
                     size_t n_skip, es_events *out, int64_t *retry_at, es_err *err);
int es_sh_dead_letters(es_store *s, const char *scope, const char *session, int64_t after, int64_t limit,
                       es_events *out, es_err *err);
int es_sh_pending_types(es_store *s, const char *scope, es_type_counts *out, es_err *err);
int es_sh_counts(es_store *s, const char *scope, es_counts *out, es_err *err);
int es_sh_read_states(es_store *s, const char *const *sessions, size_t n, const char *reducer,
                      es_state_read *out, es_err *err);
int es_sh_children(es_store *s, const char *session, const char *after, int64_t limit,
                   es_lineages *out, es_err *err);
int es_sh_get_ref(es_store *s, const char *name, int *found, es_ref *out, es_err *err);
int es_sh_put_ref(es_store *s, const char *name, const char *session, es_ref *out,
                  es_err *err);
int es_sh_list_refs(es_store *s, const char *after, int64_t limit, es_refs *out,
                    es_err *err);
int es_sh_delete_ref(es_store *s, const char *name, int *deleted, es_err *err);
int es_sh_promote(es_store *s, const char *from_ref, const char *to_ref, int has_expect,
                  const char *expect, es_ref *out, char **actual, es_err *err);
int es_sh_delete_refs_of(es_store *s, const char *session, es_err *err);
int es_sh_shred(es_store *s, const char *name, int *was_live, es_err *err);
int es_sh_verify_archive(es_store *s, const char *session, es_archive_report *out,
                         es_err *err);
int es_sh_read_all_cursor(es_store *s, const char *scope, const char *cursor, int64_t limit,
                          es_events *out, char ***cursors, es_err *err);
int es_sh_check_identities(es_store *s, const es_shard_plan *p, es_err *err);
int es_sh_set_plan_locked(es_store *s, const es_shard_plan *plan, int64_t *moved_n, es_err *err);
int es_sh_fork(es_store *s, const char *scope, const char *from, int64_t at, const char *to, es_lineage *out,
               es_err *err);

#endif
