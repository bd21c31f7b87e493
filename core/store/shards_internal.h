/*
 * shards_internal.h: what the files of the shard router share (shards.c:
 * the handle, routing, the calls, moves; shard_plan.c: plans, hashing and
 * the catalog; shard_marks.c: the move markers and the marker-checking
 * backend). Not a public header. Each function's comment is at its
 * definition.
 */
#ifndef ES_STORE_SHARDS_INTERNAL_H
#define ES_STORE_SHARDS_INTERNAL_H

#include "store/internal.h"
#include "store/shards.h"

static inline int nomem(es_err *err) { return es_fail(err, ES_STORAGE, "out of memory"); }

/* The catalog session holding the plans (one event per plan change). */
#define CATALOG_SESSION "eventstore.shard_plan"
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
void es_sh_record_destroy(plan_record *r);
int es_sh_record_get(const es_backend_ops *ops, es_backend *bk, es_txn *t, plan_record *r,
                     es_err *err);
int es_sh_moved(es_err *err, const char *session, const char *target, int64_t version);
int64_t es_sh_encode_frozen(const es_event *row);
void es_sh_decode_frozen(es_event *row);

#endif
