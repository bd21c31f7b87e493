/*
 * shards.h: a sharded store (docs/contract.md §5, docs/sharding.md).
 *
 * A sharded handle is an es_store: every es_store_* call works on it and
 * routes each session to the shard its name hashes to (rendezvous hashing
 * over the plan's shard names), or, for calls that span sessions, merges
 * the shards. The plan lives in a catalog store, so every process opening
 * the same catalog routes alike.
 */
#ifndef ES_STORE_SHARDS_H
#define ES_STORE_SHARDS_H

#include "store/store.h"

/* At most this many shards in a plan, and this many bytes in a shard name
 * (a name as es_check_name, without control bytes). */
#define ES_MAX_SHARDS 256
#define ES_MAX_SHARD_NAME_BYTES 64

/* One shard of a plan. */
typedef struct es_shard_def {
  char *name;  /* owned */
  char *url;   /* owned */
} es_shard_def;

/* A plan: version (>= 1) and its shards, sorted by name (byte order). */
typedef struct es_shard_plan {
  int64_t version;
  es_shard_def *v;  /* owned array */
  size_t n;
} es_shard_plan;

void es_shard_plan_destroy(es_shard_plan *p);
/* Checks a plan (version >= 1, 1..ES_MAX_SHARDS shards, names as above
 * and distinct, urls non-empty and not themselves shards:) and sorts its
 * shards by name. ES_OK or ES_INVALID_ARGUMENT naming what is wrong. */
int es_shard_plan_check(es_shard_plan *p, es_err *err);

/* The shard (index into p->v) that owns `key` under plan p: the shard
 * name with the highest score es_shard_score(key, name); ties (never seen
 * in practice) go to the smaller name. */
size_t es_shard_owner(const es_shard_plan *p, const char *key);
/* The rendezvous score: FNV-1a 64 over key, one 0 byte, shard name,
 * followed by the splitmix64 finaliser. Fixed forever (docs/sharding.md):
 * changing it would move sessions without a plan change. */
uint64_t es_shard_score(const char *key, const char *shard);

/* Opens a sharded store. catalog: the catalog store's URL (required).
 * plan: NULL (use the catalog's plan: NOT_FOUND when it has none), or a
 * plan to install: installed when the catalog has none or an older
 * version (the sessions whose shard changed are moved first); an equal
 * version with other shards is INVALID_ARGUMENT; an older one is ignored
 * (the catalog's wins). opts: the clock, limits and id source, passed to
 * the catalog and every shard; keys_path and archive_dir to every shard,
 * not the catalog (shard NAME's segments in archive_dir/NAME,
 * docs/sharding.md "Keys and archive"), and with either every shard is
 * opened here. *out: es_store_release() it. */
int es_shards_open(const char *catalog, const es_shard_plan *plan, const es_open_opts *opts,
                   es_store **out, es_err *err);
/* 1 when s is a sharded handle. */
int es_store_is_sharded(const es_store *s);
/* The plan the handle routes by (reloaded from the catalog first): a
 * copy, es_shard_plan_destroy it. */
int es_shards_plan(es_store *s, es_shard_plan *out, es_err *err);
/* Installs a newer plan and moves the sessions whose shard changed
 * (online; docs/sharding.md). A pending plan left by an interrupted move
 * is finished first. *moved: the sessions moved by this call. */
int es_shards_set_plan(es_store *s, const es_shard_plan *plan, int64_t *moved, es_err *err);
/* read_all over every shard: events after `cursor` (NULL or "": from the
 * start), at most limit (ES_NONE: 1000). cursors[i] (owned array of owned
 * strings, n = out->n) is the cursor just after out->v[i]; free with
 * es_shards_cursors_free. A cursor that is not one of ours:
 * INVALID_ARGUMENT. */
int es_shards_read_all_cursor(es_store *s, const char *cursor, int64_t limit, es_events *out,
                              char ***cursors, es_err *err);
void es_shards_cursors_free(char **cursors, size_t n);

/* Test hook (spec/34): the number of plan-change steps a set_plan may run
 * before it stops as if its process had died (0: no limit). */
void es_shards_set_crash_after(es_store *s, int64_t steps);
/* Test hook (spec/34): before its `steps`th plan-change step the mover
 * creates the file GATE.paused and waits until GATE exists (a slow
 * process, paused between two transactions). */
void es_shards_set_pause_after(es_store *s, int64_t steps, const char *gate);

#endif
