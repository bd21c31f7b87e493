/*
 * module/store_internal.h: what the files of the store handle share
 * (module/store_handle.c's top comment says which file holds what): the
 * handle's struct and its subscriptions, the helpers every method calls
 * (check_store, core_enter/core_leave, owned results, raise), and each
 * file's share of the handle's methods. The module's own: no other room
 * includes it.
 */
#ifndef ES_MODULE_STORE_INTERNAL_H
#define ES_MODULE_STORE_INTERNAL_H

#include <lauxlib.h>
#include <lua.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "bridge/common.h"
#include "store/store.h"
#include "util/clock.h"
#include "util/ids.h"

#define STORE_MT "eventstore.Store"
#define CLOCK_MT "eventstore.ManualClock"
#define IDS_MT "eventstore.CounterIds"

typedef struct sub {
  uint64_t id;    /* what its unsubscribe function names; never reused in a handle */
  int active;     /* 0 once ended: never delivered again, fn_ref released */
  int fn_ref;     /* registry ref of the subscriber, LUA_NOREF once ended */
  char *session;  /* NULL: every session (then `last` is a position) */
  int64_t last;   /* last index / position delivered */
  struct sub *next;
} sub;

typedef struct patch {
  es_presence_rows rows;
  struct patch *next;
} patch;

typedef struct psub {
  uint64_t id;          /* as sub.id */
  int active;           /* as sub.active; also: the core's watch is removed once 0 */
  int fn_ref;
  uint64_t token;       /* the core's watch (es_store_presence_watch) */
  pthread_mutex_t mu;   /* guards the queue: writers on any thread push */
  patch *head, *tail;
  struct psub *next;
} psub;

typedef struct lstore {
  es_store *s;           /* NULL once closed */
  es_store *held;        /* the handle's reference, released only at collection: the
                          * pointer es_lua_check_store lends stays valid (a closed store,
                          * CLOSED on every call) while the handle lives, even if Lua
                          * code closes the handle before the borrower retains it */
  lua_State *L;          /* the state making the current core call (a Lua clock runs there) */
  int clock_ref;         /* registry ref of a Lua clock function, or LUA_NOREF */
  es_manual_clock *mclock; /* a manual clock's reference, released at __gc (see store_close) */
  int ids_ref;           /* registry ref of a Lua id-source function, or LUA_NOREF */
  es_counter_ids *cids;  /* a counter id source's reference, released at __gc */
  sub *subs;             /* newest first; ended ones stay until es_lstore_reap() */
  psub *psubs;
  uint64_t next_id;      /* the id of the next subscription */
  uint64_t seen_version; /* store version at the last drain */
  uint64_t seen_data;    /* data version (other processes' commits) at the last drain */
  int draining;          /* drain() is walking subs/psubs: es_lstore_reap() must wait */
  int in_core;           /* a call into the core is running (only the clock may run Lua) */
  struct lstore *calling_prev; /* es_lstore_calling when this handle's call began */
  /* The time a Lua clock function last gave: what the core's other
   * threads (the presence watcher) read, where the function cannot run. */
  _Atomic int64_t clock_last;
  atomic_int clock_known;
  int close_requested;   /* close() came while in_core: done when that call returns */
  patch *delivering;     /* the patch drain() is converting (freed if that raises) */
  /* §3.11: a tenant handle's store handle (kept from collection by this
   * userdata's user value), NULL for a store. The store's Lua clock and id
   * source run inside the tenant's calls, so those calls enter and leave
   * the parent too (core_enter). */
  struct lstore *parent;
} lstore;

typedef struct lclock {
  es_manual_clock *c;
} lclock;

typedef struct lids {
  es_counter_ids *c;
} lids;

/* The one close function behind close(), __close and __gc (store_handle.c). */
void es_lstore_close(lua_State *L, lstore *h);

/* Subscriptions (store_subs.c): the end of every call through the handle
 * (delivers what subscribers are owed, returns nret), and ending them. */
int es_lstore_done(lua_State *L, lstore *h, int nret);
void es_lstore_sub_end(lua_State *L, sub *x);
void es_lstore_psub_end(lua_State *L, lstore *h, psub *p);
void es_lstore_reap(lstore *h);

/* Each file's methods of eventstore.Store (store_handle.c registers them). */
extern const luaL_Reg es_lstore_subs_methods[];
extern const luaL_Reg es_lstore_events_methods[];
extern const luaL_Reg es_lstore_dispatch_methods[];
extern const luaL_Reg es_lstore_history_methods[];
extern const luaL_Reg es_lstore_move_methods[];
extern const luaL_Reg es_lstore_projection_methods[]; /* store_projections.c (§8) */

/* ---------------------------------------------------------------------- */
/* helpers */

/* Whether the handle, or the store a tenant handle is made from, is
 * closed; e says which. */
static inline int closed(const lstore *h, es_err *e) {
  if (!h->s) *e = (es_err){ES_CLOSED, "the store is closed"};
  else if (h->parent && !h->parent->s) *e = (es_err){ES_CLOSED, "the store of this tenant handle is closed"};
  else return 0;
  return 1;
}

/* The handle of a call, checked before its arguments are read: a call on a
 * tenant handle whose store is closed is CLOSED here, before it allocates
 * anything (presence_subscribe would otherwise take a callback's registry
 * reference and then raise). */
static inline lstore *check_store(lua_State *L) {
  lstore *h = luaL_checkudata(L, 1, STORE_MT);
  if (h->in_core || (h->parent && h->parent->in_core))
    es_lua_raisef(L, ES_INVALID_ARGUMENT,
                  "the store cannot be called from inside its own clock function "
                  "(only close() is allowed there)");
  es_err e;
  if (closed(h, &e)) es_lua_raise(L, &e);
  return h;
}

/* The handle whose call into the core this thread is making (NULL: none).
 * A Lua clock or id function runs only there: the core has threads of its
 * own (the presence watcher reads the clock), and a Lua state is never
 * entered from two threads. */
extern _Thread_local lstore *es_lstore_calling;

static inline void calling_begin(lstore *h) {
  h->calling_prev = es_lstore_calling;
  es_lstore_calling = h;
}

/* The es_store for one call into the core, made after the call's arguments
 * were read: reading them may have run a metamethod that closed the
 * handle (CLOSED then). Every core_enter is followed by core_leave before
 * anything can raise. */
static inline es_store *core_enter(lua_State *L, lstore *h) {
  es_err e;
  if (closed(h, &e)) es_lua_raise(L, &e);
  h->L = L;
  h->in_core = 1;
  calling_begin(h);
  if (h->parent) {
    h->parent->L = L;
    h->parent->in_core = 1;
  }
  return h->s;
}

/* Ends a call into the core; a close() its clock asked for happens now. */
static inline void core_leave(lua_State *L, lstore *h) {
  if (es_lstore_calling == h) es_lstore_calling = h->calling_prev;
  h->in_core = 0;
  h->L = NULL;
  if (h->parent) core_leave(L, h->parent); /* a close the clock asked for */
  if (h->close_requested) {
    h->close_requested = 0;
    es_lstore_close(L, h);
  }
}

/* A C result (es_events, es_presence_rows, ...) kept in a userdata from
 * before the core call that fills it until it is converted: a Lua error
 * while converting it (out of memory, a stored value that does not decode)
 * then frees it at collection instead of leaking it. Freeing it early is
 * fine: every destroy leaves an empty value behind. */
typedef struct owned {
  void (*destroy)(void *); /* frees what the value holds */
  /* The C result, zeroed. Its members need no more alignment than these,
   * which is what Lua guarantees for userdata memory (LUAI_MAXALIGN);
   * max_align_t would ask for more. */
  union {
    void *p;
    int64_t i;
    double d;
  } value[];
} owned;

static inline int owned_gc(lua_State *L) {
  owned *o = lua_touserdata(L, 1);
  o->destroy(o->value);
  return 0;
}

/* Pushes a box for a zeroed result of `size` bytes; returns the result
 * (valid while the box is on the stack). */
static inline void *owned_push(lua_State *L, size_t size, void (*destroy)(void *)) {
  owned *o = lua_newuserdatauv(L, sizeof *o + size, 0);
  memset(o, 0, sizeof *o + size);
  o->destroy = destroy;
  if (luaL_newmetatable(L, "eventstore.Owned")) {
    lua_pushcfunction(L, owned_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  return o->value;
}

/* destroy functions with the signature owned needs */
static inline void destroy_events(void *p) { es_events_destroy(p); }
static inline void destroy_event(void *p) { es_event_destroy(p); }
static inline void destroy_renew(void *p) { es_renew_result_destroy(p); }
static inline void destroy_snapshot(void *p) { es_snapshot_destroy(p); }
static inline void destroy_snapshots(void *p) { es_snapshots_destroy(p); }
static inline void destroy_sessions(void *p) { es_sessions_destroy(p); }
static inline void destroy_rows(void *p) { es_presence_rows_destroy(p); }
static inline void destroy_cstr(void *p) { free(*(char **)p); }
static inline void destroy_lineage(void *p) { es_lineage_destroy(p); }
static inline void destroy_lineages(void *p) { es_lineages_destroy(p); }
static inline void destroy_ref(void *p) { es_ref_destroy(p); }
static inline void destroy_refs(void *p) { es_refs_destroy(p); }
static inline void destroy_lease(void *p) { es_lease_destroy(p); }
static inline void destroy_archived(void *p) { es_archived_destroy(p); }

static inline void check_opt_table(lua_State *L, int arg) {
  if (!lua_isnoneornil(L, arg)) luaL_checktype(L, arg, LUA_TTABLE);
}

/* Raises err after freeing what a failed call may hold (nothing: every
 * es_store_* call frees its outputs on failure). */
static inline int raise(lua_State *L, const es_err *err) { return es_lua_raise(L, err); }

#endif
