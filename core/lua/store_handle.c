/*
 * lua/store_handle.c: the Lua face of the store: the module table
 * (es_lua_open_store; lua/module.c adds the engine), the "eventstore.Store" handle (shaped like liolib's file handles), the
 * manual clock, and in-process subscriptions.
 *
 * Argument misuse raises standard Lua argument errors; everything the core
 * rejects is raised as an eventstore error object (lua/common.h).
 *
 * Subscriptions are delivered on the subscribing Lua state only: at the end
 * of every call made through the handle (so a write from this state has
 * notified before it returns) and by wait(). Each subscription remembers
 * the last index (or position) it delivered and reads what follows, so an
 * event is never delivered twice nor skipped, whichever thread wrote it.
 *
 * Lua code runs in the middle of this file's calls: metamethods of argument
 * tables (while they are read), the store's Lua clock (inside the core's
 * call), subscribers (after the core's call, while the delivery loop walks
 * the subscription lists) and finalizers anywhere Lua allocates. Any of it
 * may cancel subscriptions, call the store again or close it. The rules
 * that keep C's pointers valid (docs/store.md, "Callbacks and closing"):
 *   - the es_store is fetched (core_enter) only after the arguments are
 *     read, so a metamethod that closed the handle gives CLOSED;
 *   - while the core runs a call (in_core) the only Lua code is the clock's:
 *     any other call of this handle is refused, and close() is deferred to
 *     the end of that call, which the clock then fails with CLOSED (closing
 *     there would wait for the very call that runs the clock);
 *   - while subscribers are delivered (draining), an ended subscription is
 *     only marked; its struct is freed once the loop is done (reap);
 *   - an unsubscribe function names its subscription by id, never by
 *     pointer, so calling it twice or after close() finds nothing to do.
 */
#include <lauxlib.h>
#include <limits.h>
#include <lua.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/ids.h"
#include "codec/json.h"
#include "lua/common.h"
#include "lua/events.h"
#include "codec/state.h"
#include "lua/store_handle.h"
#include "store/store.h"
#include "store/shards.h"

#define STORE_MT "eventstore.Store"
#define CLOCK_MT "eventstore.ManualClock"
#define IDS_MT "eventstore.CounterIds"
#define ES_LUA_VERSION "eventstore 0.1.0"

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
  sub *subs;             /* newest first; ended ones stay until reap() */
  psub *psubs;
  uint64_t next_id;      /* the id of the next subscription */
  uint64_t seen_version; /* store version at the last drain */
  uint64_t seen_data;    /* data version (other processes' commits) at the last drain */
  int draining;          /* drain() is walking subs/psubs: reap() must wait */
  int in_core;           /* a call into the core is running (only the clock may run Lua) */
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

static void store_close(lua_State *L, lstore *h);
static es_shard_plan *check_plan(lua_State *L, int idx, int arg);

/* ---------------------------------------------------------------------- */
/* helpers */

/* Whether the handle, or the store a tenant handle is made from, is
 * closed; e says which. */
static int closed(const lstore *h, es_err *e) {
  if (!h->s) *e = (es_err){ES_CLOSED, "the store is closed"};
  else if (h->parent && !h->parent->s) *e = (es_err){ES_CLOSED, "the store of this tenant handle is closed"};
  else return 0;
  return 1;
}

/* The handle of a call, checked before its arguments are read: a call on a
 * tenant handle whose store is closed is CLOSED here, before it allocates
 * anything (presence_subscribe would otherwise take a callback's registry
 * reference and then raise). */
static lstore *check_store(lua_State *L) {
  lstore *h = luaL_checkudata(L, 1, STORE_MT);
  if (h->in_core || (h->parent && h->parent->in_core))
    es_lua_raisef(L, ES_INVALID_ARGUMENT,
                  "the store cannot be called from inside its own clock function "
                  "(only close() is allowed there)");
  es_err e;
  if (closed(h, &e)) es_lua_raise(L, &e);
  return h;
}

/* The es_store for one call into the core, made after the call's arguments
 * were read: reading them may have run a metamethod that closed the
 * handle (CLOSED then). Every core_enter is followed by core_leave before
 * anything can raise. */
static es_store *core_enter(lua_State *L, lstore *h) {
  es_err e;
  if (closed(h, &e)) es_lua_raise(L, &e);
  h->L = L;
  h->in_core = 1;
  if (h->parent) {
    h->parent->L = L;
    h->parent->in_core = 1;
  }
  return h->s;
}

/* Ends a call into the core; a close() its clock asked for happens now. */
static void core_leave(lua_State *L, lstore *h) {
  h->in_core = 0;
  h->L = NULL;
  if (h->parent) core_leave(L, h->parent); /* a close the clock asked for */
  if (h->close_requested) {
    h->close_requested = 0;
    store_close(L, h);
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

static int owned_gc(lua_State *L) {
  owned *o = lua_touserdata(L, 1);
  o->destroy(o->value);
  return 0;
}

/* Pushes a box for a zeroed result of `size` bytes; returns the result
 * (valid while the box is on the stack). */
static void *owned_push(lua_State *L, size_t size, void (*destroy)(void *)) {
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
static void destroy_events(void *p) { es_events_destroy(p); }
static void destroy_event(void *p) { es_event_destroy(p); }
static void destroy_renew(void *p) { es_renew_result_destroy(p); }
static void destroy_snapshot(void *p) { es_snapshot_destroy(p); }
static void destroy_snapshots(void *p) { es_snapshots_destroy(p); }
static void destroy_sessions(void *p) { es_sessions_destroy(p); }
static void destroy_rows(void *p) { es_presence_rows_destroy(p); }
static void destroy_cstr(void *p) { free(*(char **)p); }
static void destroy_lineage(void *p) { es_lineage_destroy(p); }
static void destroy_lineages(void *p) { es_lineages_destroy(p); }
static void destroy_ref(void *p) { es_ref_destroy(p); }
static void destroy_refs(void *p) { es_refs_destroy(p); }
static void destroy_lease(void *p) { es_lease_destroy(p); }

static void check_opt_table(lua_State *L, int arg) {
  if (!lua_isnoneornil(L, arg)) luaL_checktype(L, arg, LUA_TTABLE);
}

/* Raises err after freeing what a failed call may hold (nothing: every
 * es_store_* call frees its outputs on failure). */
static int raise(lua_State *L, const es_err *err) { return es_lua_raise(L, err); }

/* ---------------------------------------------------------------------- */
/* subscriptions */

static void on_presence(void *ctx, const char *ns, const es_presence_rows *applied) {
  psub *p = ctx;
  (void)ns;
  patch *x = calloc(1, sizeof *x);
  if (!x) return;
  x->rows.v = calloc(applied->n ? applied->n : 1, sizeof *x->rows.v);
  if (!x->rows.v) {
    free(x);
    return;
  }
  for (size_t i = 0; i < applied->n; i++) {
    if (es_presence_row_copy(&x->rows.v[i], &applied->v[i]) != ES_OK) break;
    x->rows.n++;
  }
  x->rows.cap = applied->n;
  pthread_mutex_lock(&p->mu);
  if (p->tail) p->tail->next = x;
  else p->head = x;
  p->tail = x;
  pthread_mutex_unlock(&p->mu);
}

static void free_patches(patch *x) {
  while (x) {
    patch *next = x->next;
    es_presence_rows_destroy(&x->rows);
    free(x);
    x = next;
  }
}

/* Ends a subscription: the callback's registry ref goes at once (DESIGN.md
 * convention 8), the struct stays until reap(). */
static void sub_end(lua_State *L, sub *x) {
  if (!x->active) return;
  x->active = 0;
  luaL_unref(L, LUA_REGISTRYINDEX, x->fn_ref);
  x->fn_ref = LUA_NOREF;
}

/* As sub_end; also removes the core's watch, after which no thread calls
 * on_presence with p any more, and drops the patches not yet delivered. */
static void psub_end(lua_State *L, lstore *h, psub *p) {
  if (!p->active) return;
  p->active = 0;
  if (h->s) es_store_presence_unwatch(h->s, p->token);
  luaL_unref(L, LUA_REGISTRYINDEX, p->fn_ref);
  p->fn_ref = LUA_NOREF;
  pthread_mutex_lock(&p->mu);
  patch *queued = p->head;
  p->head = p->tail = NULL;
  pthread_mutex_unlock(&p->mu);
  free_patches(queued);
}

/* Frees ended subscriptions, unless drain() is walking the lists (then it
 * calls reap itself when it is done). */
static void reap(lstore *h) {
  if (h->draining) return;
  for (sub **p = &h->subs; *p;) {
    sub *x = *p;
    if (x->active) {
      p = &x->next;
      continue;
    }
    *p = x->next;
    free(x->session);
    free(x);
  }
  for (psub **p = &h->psubs; *p;) {
    psub *x = *p;
    if (x->active) {
      p = &x->next;
      continue;
    }
    *p = x->next;
    free_patches(x->head);
    pthread_mutex_destroy(&x->mu);
    free(x);
  }
}

static void push_patch(lua_State *L, const es_presence_rows *rows) {
  lua_createtable(L, 0, 4);
  if (rows->n > 0) {
    es_lua_set_str(L, "participant", rows->v[0].participant);
    es_lua_set_int(L, "seen", rows->v[0].seen);
    es_lua_set_int(L, "at", rows->v[0].at);
  }
  lua_createtable(L, 0, (int)rows->n);
  for (size_t i = 0; i < rows->n; i++) {
    const es_presence_row *r = &rows->v[i];
    if (r->value) {
      es_err err = {0};
      if (es_json_decode_lua(L, r->value, r->value_len, &err) != ES_OK) es_lua_raise(L, &err);
      if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        es_json_push_null(L);
      }
    } else {
      es_json_push_null(L);
    }
    lua_setfield(L, -2, r->field);
  }
  lua_setfield(L, -2, "values");
}

/* Calls fn(value) where value is on top. Runs inside drain's lua_pcall: an
 * error in fn ends the drain and is raised from the call that delivered it
 * (the event still counts as delivered). */
static void deliver(lua_State *L, int fn_ref) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, fn_ref);
  lua_insert(L, -2);
  lua_call(L, 1, 0);
}

static int drain_events(lua_State *L, lstore *h, sub *x) {
  int base = lua_gettop(L);
  es_events *list = owned_push(L, sizeof *list, destroy_events);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = x->session ? es_store_read(s, x->session, x->last, ES_NONE, 1000, list, &err)
                      : es_store_read_all(s, x->last, 1000, list, &err);
  core_leave(L, h);
  if (rc) raise(L, &err);
  size_t n = list->n;
  if (n == 0) {
    lua_settop(L, base); /* the box frees the empty list */
    return 0;
  }
  /* Turn the batch into Lua values first: fn may raise, and nothing C-owned
   * may be held across that. */
  es_lua_push_events(L, list, 0);
  int t = lua_gettop(L);
  /* fn may end x or close the store: both are looked at after each call. */
  for (size_t i = 1; i <= n && x->active && h->s; i++) {
    lua_rawgeti(L, t, (lua_Integer)i);
    lua_getfield(L, -1, x->session ? "index" : "position");
    x->last = lua_tointeger(L, -1);
    lua_pop(L, 1);
    deliver(L, x->fn_ref);
  }
  lua_settop(L, base);
  return 1;
}

/* drain()'s body, under lua_pcall: h (a light userdata) is argument 1. */
static int drain_protected(lua_State *L) {
  lstore *h = lua_touserdata(L, 1);
  for (int more = 1; more && h->s;) {
    more = 0;
    /* Other processes' commits count too (subscribe(nil) on sqlite sees
     * them at this state's next call, e.g. while it waits). */
    uint64_t dv = 0;
    es_err err = {0};
    es_store *s = core_enter(L, h);
    uint64_t v = es_store_version(s);
    int rc = h->subs ? es_store_data_version(s, &dv, &err) : ES_OK;
    core_leave(L, h);
    if (rc != ES_OK) raise(L, &err);
    if (v != h->seen_version || dv != h->seen_data) {
      for (sub *x = h->subs; x && h->s; x = x->next)
        while (x->active && h->s && drain_events(L, h, x)) more = 1;
      h->seen_version = v;
      h->seen_data = dv;
    }
    for (psub *p = h->psubs; p && h->s; p = p->next) {
      while (p->active && h->s) {
        pthread_mutex_lock(&p->mu);
        patch *x = p->head;
        if (x) {
          p->head = x->next;
          if (!p->head) p->tail = NULL;
          x->next = NULL;
        }
        pthread_mutex_unlock(&p->mu);
        if (!x) break;
        more = 1;
        h->delivering = x; /* push_patch may raise: drain() frees it then */
        push_patch(L, &x->rows);
        h->delivering = NULL;
        free_patches(x);
        deliver(L, p->fn_ref);
      }
    }
  }
  return 0;
}

/* Delivers what subscribers have not seen yet. Subscribers may cancel
 * subscriptions, write, or close the store; a subscriber's error is raised
 * from here after the delivery state is reset. */
static void drain(lua_State *L, lstore *h) {
  if (h->draining || !h->s) return;
  h->draining = 1;
  lua_pushcfunction(L, drain_protected);
  lua_pushlightuserdata(L, h);
  int status = lua_pcall(L, 1, 0, 0);
  h->draining = 0;
  free_patches(h->delivering);
  h->delivering = NULL;
  reap(h);
  if (status != LUA_OK) lua_error(L);
}

/* Every method returns through here so subscribers run before it returns. */
static int done(lua_State *L, lstore *h, int nret) {
  if (h->s && (h->subs || h->psubs)) {
    int top = lua_gettop(L);
    drain(L, h);
    lua_settop(L, top);
  }
  return nret;
}

/* The unsubscribe functions: upvalue 1 is the store (which keeps the
 * handle's memory alive), upvalue 2 the subscription's id. A subscription
 * that already ended (cancelled, or the store closed) is not in the list
 * any more, or is marked ended: nothing to do. */
static int unsubscribe(lua_State *L) {
  lstore *h = lua_touserdata(L, lua_upvalueindex(1));
  uint64_t id = (uint64_t)lua_tointeger(L, lua_upvalueindex(2));
  for (sub *x = h->subs; x; x = x->next) {
    if (x->id == id) {
      sub_end(L, x);
      break;
    }
  }
  reap(h);
  return 0;
}

static int punsubscribe(lua_State *L) {
  lstore *h = lua_touserdata(L, lua_upvalueindex(1));
  uint64_t id = (uint64_t)lua_tointeger(L, lua_upvalueindex(2));
  for (psub *x = h->psubs; x; x = x->next) {
    if (x->id == id) {
      psub_end(L, h, x);
      break;
    }
  }
  reap(h);
  return 0;
}

static void push_unsubscribe(lua_State *L, lua_CFunction fn, uint64_t id) {
  lua_pushvalue(L, 1);
  lua_pushinteger(L, (lua_Integer)id);
  lua_pushcclosure(L, fn, 2);
}

static int m_subscribe(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_opt_name(L, 2, "session");
  luaL_checktype(L, 3, LUA_TFUNCTION);
  es_err err = {0};
  int64_t last = 0;
  uint64_t data = 0;
  es_store *s = core_enter(L, h);
  int rc = session ? es_store_head(s, session, &last, &err)
                   : es_store_last_position(s, &last, &err);
  uint64_t version = es_store_version(s);
  if (rc == ES_OK && !h->subs) rc = es_store_data_version(s, &data, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_pushvalue(L, 3);
  int fn_ref = luaL_ref(L, LUA_REGISTRYINDEX); /* before the allocations: it may raise */
  sub *x = calloc(1, sizeof *x);
  if (!x || (session && !(x->session = strdup(session)))) {
    free(x);
    luaL_unref(L, LUA_REGISTRYINDEX, fn_ref);
    return luaL_error(L, "out of memory");
  }
  x->id = ++h->next_id;
  x->last = last;
  x->fn_ref = fn_ref;
  x->active = 1;
  x->next = h->subs;
  h->subs = x;
  if (h->seen_version == 0) h->seen_version = version;
  if (!x->next) h->seen_data = data;
  push_unsubscribe(L, unsubscribe, x->id);
  return 1;
}

static int m_presence_subscribe(lua_State *L) {
  lstore *h = check_store(L);
  const char *ns = es_lua_check_name(L, 2, "namespace");
  luaL_checktype(L, 3, LUA_TFUNCTION);
  es_err nerr = {0};
  /* No store call sees this name, so check it here as every call would. */
  if (es_check_name("namespace", ns, &nerr)) return raise(L, &nerr);
  /* The registry ref first: once the core has the watch, nothing may
   * raise before x is linked (unlinked, nobody would remove the watch). */
  lua_pushvalue(L, 3);
  int fn_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  psub *x = calloc(1, sizeof *x);
  if (!x) {
    luaL_unref(L, LUA_REGISTRYINDEX, fn_ref);
    return luaL_error(L, "out of memory");
  }
  es_err cerr;
  if (closed(h, &cerr)) { /* a finalizer run by luaL_ref may have closed it */
    free(x);
    luaL_unref(L, LUA_REGISTRYINDEX, fn_ref);
    return raise(L, &cerr);
  }
  pthread_mutex_init(&x->mu, NULL);
  es_store *s = core_enter(L, h);
  x->token = es_store_presence_watch(s, ns, on_presence, x);
  core_leave(L, h);
  if (!x->token) {
    pthread_mutex_destroy(&x->mu);
    free(x);
    luaL_unref(L, LUA_REGISTRYINDEX, fn_ref);
    return luaL_error(L, "out of memory");
  }
  x->id = ++h->next_id;
  x->fn_ref = fn_ref;
  x->active = 1;
  x->next = h->psubs;
  h->psubs = x;
  push_unsubscribe(L, punsubscribe, x->id);
  return 1;
}

/* ---------------------------------------------------------------------- */
/* open, close, clocks */

/* The error a failed clock function raised, as text for the core's error
 * (never calls __tostring: this runs inside a core call, where nothing may
 * raise). */
static const char *clock_error_text(lua_State *L) {
  if (lua_type(L, -1) == LUA_TSTRING) return lua_tostring(L, -1);
  if (lua_type(L, -1) == LUA_TTABLE) { /* an eventstore error object */
    lua_pushliteral(L, "message");
    lua_rawget(L, -2);
    const char *msg = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    lua_pop(L, 1); /* still anchored by the error table */
    if (msg) return msg;
  }
  return "(error object)";
}

/* The core's clock when `clock` is a Lua function. It runs only inside a
 * call of this handle (in_core; the engine refuses such stores, so no
 * other thread calls it), on the state making that call. */
static int lua_fn_clock(void *ctx, int64_t *now, es_err *err) {
  lstore *h = ctx;
  lua_State *L = h->L;
  if (!L || !h->in_core)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "the clock function runs only inside a call made through its store");
  if (!lua_checkstack(L, 3)) return es_fail(err, ES_STORAGE, "out of memory (Lua stack)");
  lua_rawgeti(L, LUA_REGISTRYINDEX, h->clock_ref);
  int status = lua_pcall(L, 0, 1, 0);
  if (h->close_requested) {
    /* The clock closed its store: fail the call before it writes; the
     * close itself happens when the call returns (core_leave). */
    lua_pop(L, 1);
    return es_fail(err, ES_CLOSED, "the store was closed by its clock function");
  }
  if (status != LUA_OK) {
    es_fail(err, ES_INVALID_ARGUMENT, "the clock function failed: %s", clock_error_text(L));
    lua_pop(L, 1);
    return ES_INVALID_ARGUMENT;
  }
  int ok;
  lua_Integer v = lua_tointegerx(L, -1, &ok);
  lua_pop(L, 1);
  if (!ok) return es_fail(err, ES_INVALID_ARGUMENT, "the clock function must return integer milliseconds");
  *now = v;
  return ES_OK;
}

/* The core's id source when `ids` is a Lua function: like a Lua clock, it
 * runs only inside a call of this handle, on the state making it. */
static int lua_fn_ids(void *ctx, char *out, size_t cap, es_err *err) {
  lstore *h = ctx;
  lua_State *L = h->L;
  if (!L || !h->in_core)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "the id function runs only inside a call made through its store");
  if (!lua_checkstack(L, 3)) return es_fail(err, ES_STORAGE, "out of memory (Lua stack)");
  lua_rawgeti(L, LUA_REGISTRYINDEX, h->ids_ref);
  int status = lua_pcall(L, 0, 1, 0);
  if (h->close_requested) {
    lua_pop(L, 1);
    return es_fail(err, ES_CLOSED, "the store was closed by its id function");
  }
  if (status != LUA_OK) {
    es_fail(err, ES_INVALID_ARGUMENT, "the id function failed: %s", clock_error_text(L));
    lua_pop(L, 1);
    return ES_INVALID_ARGUMENT;
  }
  size_t len = 0;
  const char *id = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
  int rc = ES_OK;
  if (!id) rc = es_fail(err, ES_INVALID_ARGUMENT, "the id function must return a string");
  else if (len >= cap || memchr(id, '\0', len))
    rc = es_fail(err, ES_INVALID_ARGUMENT,
                 "the id function returned %s", len >= cap ? "an id over 255 bytes" : "an id with a NUL byte");
  else memcpy(out, id, len + 1);
  lua_pop(L, 1);
  return rc;
}

/* The one close function behind close(), __close and __gc (DESIGN.md
 * convention 7). Harmless twice. Releases a Lua clock even for a handle
 * whose open failed (h->s never set). */
static void store_close(lua_State *L, lstore *h) {
  if (h->in_core) {
    /* Only the clock runs Lua now; es_store_close would wait for the very
     * call that runs it. */
    if (h->s) h->close_requested = 1;
    return;
  }
  if (h->s) {
    for (sub *x = h->subs; x; x = x->next) sub_end(L, x);
    for (psub *p = h->psubs; p; p = p->next) psub_end(L, h, p);
    es_store_close(h->s);
    h->s = NULL; /* h->held keeps the struct until __gc */
  }
  /* A Lua clock runs only inside this handle's calls: it can go now. A
   * manual clock stays until __gc, as long as the es_store whose clock it
   * is (engine workers read that clock without entering a call). */
  if (h->clock_ref != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, h->clock_ref);
  h->clock_ref = LUA_NOREF;
  if (h->ids_ref != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, h->ids_ref);
  h->ids_ref = LUA_NOREF;
  reap(h);
}

static int m_close(lua_State *L) {
  lstore *h = luaL_checkudata(L, 1, STORE_MT);
  store_close(L, h);
  return 0;
}

static int m_gc(lua_State *L) {
  lstore *h = luaL_checkudata(L, 1, STORE_MT);
  store_close(L, h);
  /* Nothing can borrow from a collected handle: let the store go (the
   * engine may still hold its own reference). */
  if (h->held) {
    es_store_release(h->held);
    h->held = NULL;
  }
  if (h->mclock) es_manual_clock_release(h->mclock);
  h->mclock = NULL;
  if (h->cids) es_counter_ids_release(h->cids);
  h->cids = NULL;
  return 0;
}

static int m_tostring(lua_State *L) {
  lstore *h = luaL_checkudata(L, 1, STORE_MT);
  if (h->s) lua_pushfstring(L, "eventstore.Store (%p)", (void *)h);
  else lua_pushliteral(L, "eventstore.Store (closed)");
  return 1;
}

static int l_open(lua_State *L) {
  const char *url = es_lua_opt_name(L, 1, "url");
  check_opt_table(L, 2);
  es_open_opts o = {0};
  int64_t maxp = es_lua_opt_int_field(L, 2, "max_payload_bytes", 0);
  if (maxp < 0) es_lua_raisef(L, ES_INVALID_ARGUMENT, "max_payload_bytes must be >= 0");
  o.max_payload_bytes = (size_t)maxp;
  o.archive_dir = es_lua_opt_str_field(L, 2, "archive"); /* §3.9: a path (NUL refused) */
  /* §3.10: the master key file (its string stays on the stack) */
  o.keys_path = es_lua_opt_str_field(L, 2, "keys");
  /* CONTRACT §5: "shards:" with {catalog = url, plan = ...}, or
   * "shards:CATALOG_URL" (the catalog's plan) */
  int sharded = url && strncmp(url, "shards:", 7) == 0;
  const char *catalog = NULL;
  es_shard_plan *plan = NULL;
  if (sharded) {
    catalog = es_lua_opt_str_field(L, 2, "catalog");
    if (url[7] && catalog && strcmp(catalog, url + 7) != 0)
      es_lua_raisef(L, ES_INVALID_ARGUMENT, "two catalogs: in the url and in opts.catalog");
    if (!catalog) catalog = url[7] ? url + 7 : NULL;
    if (!catalog) es_lua_raisef(L, ES_INVALID_ARGUMENT, "shards: needs opts.catalog (a store url)");
    if (lua_istable(L, 2)) {
      lua_getfield(L, 2, "plan");
      if (!lua_isnil(L, -1)) plan = check_plan(L, -1, 2);
    }
    /* the plan's box stays on the stack (below the store) until open returns */
  }
  /* Created closed before anything is acquired (liolib's pattern). */
  lstore *h = lua_newuserdatauv(L, sizeof *h, 0);
  memset(h, 0, sizeof *h);
  h->clock_ref = h->ids_ref = LUA_NOREF;
  luaL_setmetatable(L, STORE_MT);
  if (!lua_isnoneornil(L, 2)) {
    lua_getfield(L, 2, "clock");
    if (lua_isfunction(L, -1)) {
      h->clock_ref = luaL_ref(L, LUA_REGISTRYINDEX);
      o.clock = lua_fn_clock;
      o.clock_ctx = h;
    } else if (!lua_isnil(L, -1)) {
      lclock *c = luaL_testudata(L, -1, CLOCK_MT);
      if (!c || !c->c)
        luaL_argerror(L, 2, "field 'clock' must be a function or an eventstore.manual_clock");
      h->mclock = c->c;
      es_manual_clock_retain(h->mclock);
      o.clock = es_manual_clock_now;
      o.clock_ctx = h->mclock;
      lua_pop(L, 1);
    } else {
      lua_pop(L, 1);
    }
    lua_getfield(L, 2, "ids");
    if (lua_isfunction(L, -1)) {
      h->ids_ref = luaL_ref(L, LUA_REGISTRYINDEX);
      o.ids = lua_fn_ids;
      o.ids_ctx = h;
    } else if (!lua_isnil(L, -1)) {
      lids *c = luaL_testudata(L, -1, IDS_MT);
      if (!c || !c->c)
        luaL_argerror(L, 2, "field 'ids' must be a function or an eventstore.counter_ids");
      h->cids = c->c;
      es_counter_ids_retain(h->cids);
      o.ids = es_counter_ids_next;
      o.ids_ctx = h->cids;
      lua_pop(L, 1);
    } else {
      lua_pop(L, 1);
    }
  }
  es_err err = {0};
  es_store *s = NULL;
  h->L = L;
  h->in_core = 1; /* as core_enter: should opening ever read the clock */
  int rc = sharded ? es_shards_open(catalog, plan, &o, &s, &err) : es_store_open(url, &o, &s, &err);
  h->s = h->held = s;
  core_leave(L, h);
  if (rc != ES_OK) {
    store_close(L, h); /* a Lua clock's ref now rather than at collection */
    return raise(L, &err);
  }
  return 1;
}

/* eventstore.counter_ids(prefix, start): a deterministic, thread-safe id
 * source for open's `ids` ("evt-000000000001", ...). */
static int l_counter_ids(lua_State *L) {
  size_t n = 0;
  const char *prefix = lua_isnoneornil(L, 1) ? "" : luaL_checklstring(L, 1, &n);
  if (memchr(prefix, '\0', n)) es_lua_raisef(L, ES_INVALID_ARGUMENT, "prefix must not hold a NUL byte");
  if (n > 200) es_lua_raisef(L, ES_INVALID_ARGUMENT, "prefix is longer than 200 bytes");
  int64_t start = lua_isnoneornil(L, 2) ? 1 : es_lua_check_int(L, 2, "start");
  if (start < 0) es_lua_raisef(L, ES_INVALID_ARGUMENT, "start must be >= 0");
  lids *c = lua_newuserdatauv(L, sizeof *c, 0);
  c->c = NULL;
  luaL_setmetatable(L, IDS_MT);
  if (!(c->c = es_counter_ids_new(prefix, start))) return luaL_error(L, "out of memory");
  return 1;
}

static int ids_gc(lua_State *L) {
  lids *c = luaL_checkudata(L, 1, IDS_MT);
  es_counter_ids_release(c->c);
  c->c = NULL;
  return 0;
}

/* ids(): the next id, as the store would take it (tests peek with it). */
static int ids_call(lua_State *L) {
  lids *c = luaL_checkudata(L, 1, IDS_MT);
  char out[ES_MAX_ID_BYTES + 1];
  es_err err = {0};
  if (es_counter_ids_next(c->c, out, sizeof out, &err)) return es_lua_raise(L, &err);
  lua_pushstring(L, out);
  return 1;
}

/* A manual clock's time must be in the store clock's range (es_store_now,
 * docs/limits.md "The clock"): refused when it is set, not later at every
 * call of every store that reads it. */
static int64_t check_clock_ms(lua_State *L, int64_t ms, const char *what) {
  if (ms < 0)
    es_lua_raisef(L, ES_INVALID_ARGUMENT,
                  "%s: %lld is outside the clock's range 0..math.maxinteger (ms since the epoch)", what,
                  (long long)ms);
  return ms;
}

static int l_manual_clock(lua_State *L) {
  int64_t ms = lua_isnoneornil(L, 1) ? 0 : check_clock_ms(L, es_lua_check_int(L, 1, "ms"), "manual_clock");
  lclock *c = lua_newuserdatauv(L, sizeof *c, 0);
  c->c = NULL;
  luaL_setmetatable(L, CLOCK_MT);
  c->c = es_manual_clock_new(ms);
  if (!c->c) return luaL_error(L, "out of memory");
  return 1;
}

static es_manual_clock *check_clock(lua_State *L) {
  lclock *c = luaL_checkudata(L, 1, CLOCK_MT);
  return c->c;
}

static int c_now(lua_State *L) {
  lua_pushinteger(L, es_manual_clock_get(check_clock(L)));
  return 1;
}

static int c_set(lua_State *L) {
  es_manual_clock *c = check_clock(L);
  es_manual_clock_set(c, check_clock_ms(L, es_lua_check_int(L, 2, "ms"), "set"));
  lua_pushinteger(L, es_manual_clock_get(c));
  return 1;
}

static int c_advance(lua_State *L) {
  es_manual_clock *c = check_clock(L);
  int64_t ms = es_lua_check_int(L, 2, "ms"), now = es_manual_clock_get(c);
  /* Moving the clock past the int64 range would wrap it into the past;
   * below 0 it leaves the clock's range. */
  if ((ms > 0 && now > INT64_MAX - ms) || (ms < 0 && now + ms < 0))
    return es_lua_raisef(L, ES_INVALID_ARGUMENT,
                         "advance(%lld) would move the clock (at %lld) out of its range 0..math.maxinteger",
                         (long long)ms, (long long)now);
  lua_pushinteger(L, es_manual_clock_advance(c, ms));
  return 1;
}

static int c_call(lua_State *L) {
  lua_pushinteger(L, es_manual_clock_get(check_clock(L)));
  return 1;
}

static int c_gc(lua_State *L) {
  lclock *c = luaL_checkudata(L, 1, CLOCK_MT);
  es_manual_clock_release(c->c);
  c->c = NULL;
  return 0;
}

/* ---------------------------------------------------------------------- */
/* 3.1 append and read */

static int m_append(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  check_opt_table(L, 4);
  int64_t expected = es_lua_opt_int_field(L, 4, "expected", ES_NONE);
  int64_t fence = es_lua_opt_int_field(L, 4, "fence", ES_NONE);
  size_t n;
  es_new_event *evs = es_lua_check_events(L, 3, 3, ES_NONE, es_store_max_payload(h->held), &n);
  es_events *out = owned_push(L, sizeof *out, destroy_events);
  int pending = 0;
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_append(s, session, evs, n, expected, fence, out, &pending, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  es_lua_push_events(L, out, 0);
  lua_pushboolean(L, pending);
  return done(L, h, 2);
}

typedef int (*range_reader)(es_store *s, const char *session, int64_t after, int64_t through,
                            int64_t limit, es_events *out, es_err *err);

/* store:read and store:read_at_rest: (session, {after, through, limit}). */
static int read_with(lua_State *L, range_reader fn, int at_rest) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  check_opt_table(L, 3);
  int64_t after = es_lua_opt_int_field(L, 3, "after", 0);
  int64_t through = es_lua_opt_int_field(L, 3, "through", ES_NONE);
  int64_t limit = es_lua_opt_int_field(L, 3, "limit", ES_NONE);
  es_events *out = owned_push(L, sizeof *out, destroy_events);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = fn(s, session, after, through, limit, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  if (!at_rest) {
    es_lua_push_events(L, out, 0);
    return done(L, h, 1);
  }
  lua_createtable(L, (int)(out->n > 1000000 ? 0 : out->n), 0);
  for (size_t i = 0; i < out->n; i++) {
    es_lua_push_event_at_rest(L, &out->v[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  es_events_destroy(out); /* now rather than at collection */
  return done(L, h, 1);
}

static int m_read(lua_State *L) { return read_with(L, es_store_read, 0); }

static int m_head(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  int64_t head;
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_head(s, session, &head, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_pushinteger(L, head);
  return done(L, h, 1);
}

/* ---------------------------------------------------------------------- */
/* §3.12 stats (docs/stats.md) */

/* What stats() reports, read from the core (no Lua call in between). */
typedef struct {
  es_call_stats calls[ES_STATS_MAX_OPS];
  size_t n;
  es_counts c;
} stats_snap;

static int stats_read(es_store *s, stats_snap *o, es_err *err) {
  /* the calls before the counts: this stats call is in neither */
  es_store_call_stats(s, o->calls, ES_STATS_MAX_OPS, &o->n);
  return es_store_counts(s, &o->c, err);
}

static void stats_push(lua_State *L, const stats_snap *o) {
  lua_createtable(L, 0, 5);
  lua_createtable(L, 0, (int)o->n);
  for (size_t i = 0; i < o->n; i++) {
    const es_call_stats *c = &o->calls[i];
    lua_createtable(L, 0, 5);
    es_lua_set_int(L, "count", (int64_t)c->count);
    es_lua_set_int(L, "errors", (int64_t)c->errors);
    /* microseconds, the nanoseconds as a fraction: calls on memory: take
     * well under one */
    lua_pushnumber(L, (lua_Number)c->p50_ns / 1000.0);
    lua_setfield(L, -2, "p50_us");
    lua_pushnumber(L, (lua_Number)c->p99_ns / 1000.0);
    lua_setfield(L, -2, "p99_us");
    lua_pushnumber(L, (lua_Number)c->max_ns / 1000.0);
    lua_setfield(L, -2, "max_us");
    lua_setfield(L, -2, c->op);
  }
  lua_setfield(L, -2, "calls");
  es_lua_set_int(L, "sessions", o->c.sessions);
  es_lua_set_int(L, "events", o->c.events);
  es_lua_set_int(L, "pending", o->c.pending);
  es_lua_set_int(L, "dead", o->c.dead);
}

int es_lua_push_stats(lua_State *L, es_store *s, es_err *err) {
  stats_snap o;
  int rc = stats_read(s, &o, err);
  if (rc == ES_OK) stats_push(L, &o);
  return rc;
}

/* stats() -> {calls, sessions, events, pending, dead}; takes no argument. */
static int m_stats(lua_State *L) {
  lstore *h = check_store(L);
  if (lua_gettop(L) > 1) return luaL_argerror(L, 2, "stats takes no arguments");
  es_err err = {0};
  stats_snap o;
  es_store *s = core_enter(L, h);
  int rc = stats_read(s, &o, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  stats_push(L, &o);
  return done(L, h, 1);
}

/* _stats_enabled(on): bench only (bench/README.md "Stats cost"): stops or
 * restarts counting this handle's calls. */
static int m_stats_enabled(lua_State *L) {
  lstore *h = check_store(L);
  luaL_checktype(L, 2, LUA_TBOOLEAN);
  es_store_stats_enable(h->s, lua_toboolean(L, 2));
  return 0;
}

/* ---------------------------------------------------------------------- */
/* sharding (CONTRACT §5, docs/sharding.md) */

static void destroy_plan(void *p) { es_shard_plan_destroy(p); }

/* A Lua string that must hold no NUL byte (a shard name or url). */
static char *plan_string(lua_State *L, int idx, const char *what) {
  size_t n;
  const char *v = lua_tolstring(L, idx, &n);
  if (strlen(v) != n) es_lua_raisef(L, ES_INVALID_ARGUMENT, "plan: %s holds a NUL byte", what);
  char *copy = strdup(v);
  if (!copy) es_lua_raisef(L, ES_STORAGE, "out of memory");
  return copy;
}

/* {version = n, shards = {[name] = url}} at idx into a plan kept in an
 * owned box pushed on the stack (freed at collection if anything raises). */
static es_shard_plan *check_plan(lua_State *L, int idx, int arg) {
  idx = lua_absindex(L, idx);
  if (!lua_istable(L, idx)) luaL_argerror(L, arg, "plan must be a table {version, shards}");
  es_shard_plan *p = owned_push(L, sizeof *p, destroy_plan);
  lua_getfield(L, idx, "version");
  if (!lua_isinteger(L, -1))
    es_lua_raisef(L, ES_INVALID_ARGUMENT, "plan.version must be an integer");
  p->version = lua_tointeger(L, -1);
  lua_pop(L, 1);
  lua_getfield(L, idx, "shards");
  if (!lua_istable(L, -1))
    es_lua_raisef(L, ES_INVALID_ARGUMENT, "plan.shards must be a table {[name] = url}");
  size_t cap = 0;
  lua_pushnil(L);
  while (lua_next(L, -2)) {
    if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING)
      es_lua_raisef(L, ES_INVALID_ARGUMENT, "plan.shards maps shard names (strings) to urls (strings)");
    if (p->n >= ES_MAX_SHARDS)
      es_lua_raisef(L, ES_INVALID_ARGUMENT, "a plan has at most %d shards", ES_MAX_SHARDS);
    if (es_grow((void **)&p->v, &cap, p->n + 1, sizeof *p->v))
      es_lua_raisef(L, ES_STORAGE, "out of memory");
    p->v[p->n].name = NULL;
    p->v[p->n].url = NULL;
    p->n++;
    p->v[p->n - 1].name = plan_string(L, -2, "a shard name");
    p->v[p->n - 1].url = plan_string(L, -1, "a shard url");
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return p;
}

static void push_plan(lua_State *L, const es_shard_plan *p) {
  lua_createtable(L, 0, 2);
  lua_pushinteger(L, p->version);
  lua_setfield(L, -2, "version");
  lua_createtable(L, 0, (int)p->n);
  for (size_t i = 0; i < p->n; i++) {
    lua_pushstring(L, p->v[i].url);
    lua_setfield(L, -2, p->v[i].name);
  }
  lua_setfield(L, -2, "shards");
}

static es_store *sharded_store(lua_State *L, lstore *h, const char *what) {
  if (!es_store_is_sharded(h->s))
    es_lua_raisef(L, ES_INVALID_ARGUMENT, "%s() needs a sharded store (shards:)", what);
  return h->s;
}

/* store:plan() -> {version, shards = {[name] = url}} */
static int m_plan(lua_State *L) {
  lstore *h = check_store(L);
  sharded_store(L, h, "plan");
  es_shard_plan *p = owned_push(L, sizeof *p, destroy_plan);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_shards_plan(s, p, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  push_plan(L, p);
  return done(L, h, 1);
}

/* store:set_plan(plan) -> {moved = n} */
static int m_set_plan(lua_State *L) {
  lstore *h = check_store(L);
  sharded_store(L, h, "set_plan");
  es_shard_plan *p = check_plan(L, 2, 2);
  int64_t moved = 0;
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_shards_set_plan(s, p, &moved, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, 1);
  lua_pushinteger(L, moved);
  lua_setfield(L, -2, "moved");
  return done(L, h, 1);
}

/* A test hook (spec/34): the plan change stops, as if its process died,
 * at its n-th step (0: off). */
static int m_shards_crash_after(lua_State *L) {
  lstore *h = check_store(L);
  sharded_store(L, h, "_crash_after");
  es_shards_set_crash_after(h->s, luaL_checkinteger(L, 2));
  return 0;
}

/* store:_pause_after(n, gate): test hook (spec/34), a mover that pauses
 * before its nth step until the file `gate` exists. */
static int m_shards_pause_after(lua_State *L) {
  lstore *h = check_store(L);
  sharded_store(L, h, "_pause_after");
  lua_Integer n = luaL_checkinteger(L, 2);
  size_t len;
  const char *gate = luaL_checklstring(L, 3, &len);
  if (strlen(gate) != len) luaL_argerror(L, 3, "a path holds no NUL byte");
  es_shards_set_pause_after(h->s, n, gate);
  return 0;
}

typedef struct {
  es_events events;
  char **cursors;
  size_t n_cursors; /* pushing the events empties `events`: the count is kept here */
} cursor_page;

static void destroy_cursor_page(void *p) {
  cursor_page *c = p;
  es_shards_cursors_free(c->cursors, c->n_cursors);
  c->cursors = NULL;
  c->n_cursors = 0;
  es_events_destroy(&c->events);
}

/* read_all on a sharded store: `after` is a cursor (or 0/nil) and every
 * event carries the cursor just after it. */
static int read_all_sharded(lua_State *L, lstore *h) {
  const char *cursor = NULL;
  lua_getfield(L, 2, "after");
  if (lua_type(L, -1) == LUA_TSTRING) {
    size_t n;
    cursor = lua_tolstring(L, -1, &n);
    if (strlen(cursor) != n) es_lua_raisef(L, ES_INVALID_ARGUMENT, "after holds a NUL byte");
  } else if (!lua_isnil(L, -1) && !(lua_isinteger(L, -1) && lua_tointeger(L, -1) == 0)) {
    es_lua_raisef(L, ES_INVALID_ARGUMENT,
                  "after on a sharded store is a read_all cursor (a string) or 0");
  }
  int64_t limit = es_lua_opt_int_field(L, 2, "limit", ES_NONE);
  cursor_page *page = owned_push(L, sizeof *page, destroy_cursor_page);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_shards_read_all_cursor(s, cursor, limit, &page->events, &page->cursors, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  page->n_cursors = page->events.n;
  /* the cursors first: pushing the events empties the list */
  lua_createtable(L, (int)page->events.n, 0);
  for (size_t i = 0; i < page->events.n; i++) {
    lua_pushstring(L, page->cursors[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  int cursors = lua_gettop(L);
  size_t n = page->events.n;
  es_lua_push_events(L, &page->events, 0);
  for (size_t i = 1; i <= n; i++) {
    lua_rawgeti(L, -1, (lua_Integer)i);
    lua_rawgeti(L, cursors, (lua_Integer)i);
    lua_setfield(L, -2, "cursor");
    lua_pop(L, 1);
  }
  return done(L, h, 1);
}

static int m_read_all(lua_State *L) {
  lstore *h = check_store(L);
  check_opt_table(L, 2);
  if (es_store_is_sharded(h->s)) {
    if (lua_isnoneornil(L, 2)) {
      lua_settop(L, 1);
      lua_newtable(L);
    }
    return read_all_sharded(L, h);
  }
  int64_t after = es_lua_opt_int_field(L, 2, "after", 0);
  int64_t limit = es_lua_opt_int_field(L, 2, "limit", ES_NONE);
  es_events *out = owned_push(L, sizeof *out, destroy_events);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_read_all(s, after, limit, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  es_lua_push_events(L, out, 0);
  return done(L, h, 1);
}

/* ---------------------------------------------------------------------- */
/* 3.2 dispatch */

static int m_claim(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  luaL_checktype(L, 3, LUA_TTABLE);
  es_claim_opts o = {0};
  o.holder = es_lua_req_str_field(L, 3, "holder");
  o.ttl_ms = es_lua_opt_int_field(L, 3, "ttl_ms", ES_NONE);
  o.expires_at = es_lua_opt_int_field(L, 3, "expires_at", ES_NONE);
  if (o.ttl_ms == ES_NONE && o.expires_at == ES_NONE)
    luaL_argerror(L, 3, "field 'ttl_ms' or 'expires_at' is required");
  o.limit = es_lua_opt_int_field(L, 3, "limit", ES_NONE);
  lua_getfield(L, 3, "exclude");
  if (!lua_isnil(L, -1)) {
    if (!lua_istable(L, -1)) luaL_argerror(L, 3, "field 'exclude' must be a table of indexes");
    size_t n = es_lua_check_seq(L, -1, 3, "field 'exclude'");
    int64_t *ex = lua_newuserdatauv(L, (n ? n : 1) * sizeof *ex, 0);
    for (size_t i = 0; i < n; i++) {
      int ok = 0;
      if (lua_rawgeti(L, -2, (lua_Integer)i + 1) == LUA_TNUMBER) ex[i] = lua_tointegerx(L, -1, &ok);
      if (!ok) luaL_argerror(L, 3, "field 'exclude' must hold integer indexes");
      lua_pop(L, 1);
    }
    o.exclude = ex;
    o.n_exclude = n;
  }
  int outcome = 0;
  int64_t retry_at;
  es_events *out = owned_push(L, sizeof *out, destroy_events);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_claim(s, session, &o, &outcome, out, &retry_at, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, 3);
  if (outcome == ES_CLAIMED) {
    es_lua_set_str(L, "outcome", "claimed");
    es_lua_push_events(L, out, 1);
    lua_setfield(L, -2, "events");
  } else {
    es_events_destroy(out);
    es_lua_set_str(L, "outcome", outcome == ES_BUSY ? "busy" : "settled");
    if (outcome == ES_BUSY) es_lua_set_int(L, "retry_at", retry_at);
  }
  return done(L, h, 1);
}

/* claim_next's `types` (the table at the top, popped): copied, pointers
 * and bytes, into one userdata left on the stack, so a clock function that
 * changes the table during the call cannot free a name the core reads.
 * *n gets the count; NUL inside a name is refused here, the rest of the
 * name rules (and the count limit) by the core. */
static const char *const *check_types(lua_State *L, size_t *n) {
  int t = lua_gettop(L);
  if (!lua_istable(L, t)) luaL_argerror(L, 2, "field 'types' must be a table of type names");
  *n = es_lua_check_seq(L, t, 2, "field 'types'");
  size_t bytes = 0;
  for (size_t i = 0; i < *n; i++) {
    size_t len;
    if (lua_rawgeti(L, t, (lua_Integer)i + 1) != LUA_TSTRING)
      luaL_argerror(L, 2, "field 'types' must hold strings (type names)");
    lua_tolstring(L, -1, &len);
    char what[32];
    snprintf(what, sizeof what, "types[%zu]", i + 1);
    es_lua_name(L, -1, what);
    lua_pop(L, 1);
    bytes += len + 1;
  }
  size_t head = (*n ? *n : 1) * sizeof(char *);
  char **v = lua_newuserdatauv(L, head + bytes, 0);
  char *p = (char *)v + head;
  for (size_t i = 0; i < *n; i++) {
    size_t len;
    lua_rawgeti(L, t, (lua_Integer)i + 1);
    const char *name = lua_tolstring(L, -1, &len);
    memcpy(p, name, len + 1);
    v[i] = p;
    p += len + 1;
    lua_pop(L, 1);
  }
  lua_remove(L, t);
  return (const char *const *)v;
}

static int m_claim_next(lua_State *L) {
  lstore *h = check_store(L);
  luaL_checktype(L, 2, LUA_TTABLE);
  const char *holder = es_lua_req_str_field(L, 2, "holder");
  int64_t ttl = es_lua_opt_int_field(L, 2, "ttl_ms", ES_NONE);
  if (ttl == ES_NONE) luaL_argerror(L, 2, "field 'ttl_ms' is required");
  int64_t limit = es_lua_opt_int_field(L, 2, "limit", 1);
  const char *const *types = NULL;  /* absent: every type */
  size_t n_types = 0;
  lua_getfield(L, 2, "types");
  if (lua_isnil(L, -1)) lua_pop(L, 1);
  else types = check_types(L, &n_types);
  int64_t retry_at;
  es_events *out = owned_push(L, sizeof *out, destroy_events);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_claim_next(s, holder, ttl, limit, types, n_types, NULL, 0, out, &retry_at, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  es_lua_push_events(L, out, 1);
  if (retry_at == ES_NONE) lua_pushnil(L);
  else lua_pushinteger(L, retry_at);
  return done(L, h, 2);
}

static void push_int_array(lua_State *L, const int64_t *v, size_t n) {
  lua_createtable(L, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    lua_pushinteger(L, v[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
}

static int m_renew(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  luaL_checktype(L, 3, LUA_TTABLE);
  const char *holder = es_lua_req_str_field(L, 3, "holder");
  int64_t ttl = es_lua_opt_int_field(L, 3, "ttl_ms", ES_NONE);
  int64_t expires_at = es_lua_opt_int_field(L, 3, "expires_at", ES_NONE);
  if (ttl == ES_NONE && expires_at == ES_NONE)
    luaL_argerror(L, 3, "field 'ttl_ms' or 'expires_at' is required");
  lua_getfield(L, 3, "claims");
  if (!lua_istable(L, -1)) luaL_argerror(L, 3, "field 'claims' must be a table of {index, attempt}");
  size_t n = es_lua_check_seq(L, -1, 3, "field 'claims'");
  es_claim_ref *claims = lua_newuserdatauv(L, (n ? n : 1) * sizeof *claims, 0);
  for (size_t i = 0; i < n; i++) {
    int ok1 = 0, ok2 = 0;
    if (lua_rawgeti(L, -2, (lua_Integer)i + 1) != LUA_TTABLE)
      luaL_argerror(L, 3, "field 'claims' must hold {index, attempt} tables");
    lua_getfield(L, -1, "index");
    lua_getfield(L, -2, "attempt");
    if (lua_isnil(L, -2)) { /* positional {index, attempt} */
      lua_pop(L, 2);
      lua_rawgeti(L, -1, 1);
      lua_rawgeti(L, -2, 2);
    }
    if (lua_type(L, -2) == LUA_TNUMBER) claims[i].index = lua_tointegerx(L, -2, &ok1);
    if (lua_type(L, -1) == LUA_TNUMBER) claims[i].attempt = lua_tointegerx(L, -1, &ok2);
    if (!ok1 || !ok2)
      luaL_argerror(L, 3, "field 'claims' needs integer index and attempt in each claim");
    lua_pop(L, 3);
  }
  es_renew_result *r = owned_push(L, sizeof *r, destroy_renew);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_renew(s, session, holder, claims, n, ttl, expires_at, r, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, 2);
  push_int_array(L, r->renewed, r->n_renewed);
  lua_setfield(L, -2, "renewed");
  push_int_array(L, r->superseded, r->n_superseded);
  lua_setfield(L, -2, "superseded");
  es_renew_result_destroy(r);
  return done(L, h, 1);
}

static int m_complete(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  int64_t index = es_lua_check_int(L, 3, "index");
  int64_t attempt = es_lua_check_int(L, 4, "attempt");
  size_t n = 0;
  es_new_event *evs = NULL;
  lua_settop(L, 6); /* events and options at fixed slots, whatever was given */
  if (lua_isnoneornil(L, 5)) {
    lua_newtable(L);
    lua_replace(L, 5);
  }
  evs = es_lua_check_events(L, 5, 5, ES_NONE, es_store_max_payload(h->held), &n);
  check_opt_table(L, 6);
  int64_t fence = es_lua_opt_int_field(L, 6, "fence", ES_NONE);
  int outcome = 0;
  es_events *out = owned_push(L, sizeof *out, destroy_events);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_complete(s, session, index, attempt, evs, n, fence, &outcome, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, 2);
  if (outcome == ES_COMPLETED) {
    es_lua_set_str(L, "outcome", "completed");
    es_lua_push_events(L, out, 0);
    lua_setfield(L, -2, "events");
  } else {
    es_lua_set_str(L, "outcome", "superseded");
  }
  return done(L, h, 1);
}

static int m_fail(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  int64_t index = es_lua_check_int(L, 3, "index");
  int64_t attempt = es_lua_check_int(L, 4, "attempt");
  luaL_checktype(L, 5, LUA_TTABLE);
  size_t elen;
  const char *error = es_lua_opt_text_field(L, 5, "error", &elen);
  if (!error) luaL_argerror(L, 5, "field 'error' is required");
  int64_t max_failures = es_lua_opt_int_field(L, 5, "max_failures", 5);
  int64_t retry_after = es_lua_opt_int_field(L, 5, "retry_after_ms", 0);
  int outcome = 0;
  int64_t failures = 0;
  es_err err = {0};
  /* Free text keeps every byte it can: a NUL (which the C API cannot carry)
   * becomes U+FFFD here rather than cutting the message (es_text_clean).
   * Owned by a box, so nothing leaks if the store turns out closed. */
  char **text = owned_push(L, sizeof *text, destroy_cstr);
  if (es_text_clean(error, elen, ES_MAX_TEXT_BYTES, text, NULL))
    return luaL_error(L, "out of memory");
  es_store *s = core_enter(L, h);
  int rc = es_store_fail(s, session, index, attempt, *text, max_failures, retry_after,
                         &outcome, &failures, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, 2);
  es_lua_set_str(L, "outcome", outcome == ES_FAILED            ? "failed"
                        : outcome == ES_DEAD_LETTERED ? "dead_lettered"
                                                      : "superseded");
  es_lua_set_int(L, "failures", failures);
  return done(L, h, 1);
}

static int push_one(lua_State *L, lstore *h, const char *session, int64_t index) {
  es_event *e = owned_push(L, sizeof *e, destroy_event);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_get(s, session, index, e, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  es_lua_push_event(L, e, 0);
  es_event_destroy(e);
  return done(L, h, 1);
}

static int m_revive(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  int64_t index = es_lua_check_int(L, 3, "index");
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_revive(s, session, index, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  return push_one(L, h, session, index);
}

static int m_settle(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  int64_t index = es_lua_check_int(L, 3, "index");
  size_t rlen = 0;
  const char *reason = luaL_optlstring(L, 4, NULL, &rlen);
  es_err err = {0};
  char **text = owned_push(L, sizeof *text, destroy_cstr); /* free text, as fail's error */
  if (reason && es_text_clean(reason, rlen, ES_MAX_TEXT_BYTES, text, NULL))
    return luaL_error(L, "out of memory");
  es_store *s = core_enter(L, h);
  int rc = es_store_settle(s, session, index, *text, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  return push_one(L, h, session, index);
}

static int m_dead_letters(lua_State *L) {
  lstore *h = check_store(L);
  check_opt_table(L, 2);
  const char *session = es_lua_opt_str_field(L, 2, "session");
  int64_t after = es_lua_opt_int_field(L, 2, "after", 0);
  int64_t limit = es_lua_opt_int_field(L, 2, "limit", 100);
  es_events *out = owned_push(L, sizeof *out, destroy_events);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_dead_letters(s, session, after, limit, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  es_lua_push_events(L, out, 0);
  return done(L, h, 1);
}

/* ---------------------------------------------------------------------- */
/* 3.3 snapshots, 3.4 inspection */

static int m_read_state(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  const char *reducer = es_lua_check_name(L, 3, "reducer");
  int found;
  es_snapshot *snap = owned_push(L, sizeof *snap, destroy_snapshot);
  es_events *events = owned_push(L, sizeof *events, destroy_events);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_read_state(s, session, reducer, &found, snap, events, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, 2);
  if (found) {
    lua_createtable(L, 0, 3);
    es_lua_set_int(L, "index", snap->index);
    lua_pushlstring(L, snap->state ? snap->state : "", snap->state_len);
    lua_setfield(L, -2, "state");
    es_lua_set_str(L, "version", snap->version);
    lua_setfield(L, -2, "snapshot");
  }
  es_snapshot_destroy(snap);
  es_lua_push_events(L, events, 0);
  lua_setfield(L, -2, "events");
  return done(L, h, 1);
}

static int m_put_snapshot(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  const char *reducer = es_lua_check_name(L, 3, "reducer");
  int64_t index = es_lua_check_int(L, 4, "index");
  size_t len;
  const char *state = luaL_checklstring(L, 5, &len); /* bytes: every one is kept */
  const char *version = lua_isnoneornil(L, 6) ? "" : es_lua_check_name(L, 6, "version");
  int stored = 0;
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_put_snapshot(s, session, reducer, index, state, len, version, &stored, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_pushboolean(L, stored);
  return done(L, h, 1);
}

static int m_snapshots(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  es_snapshots *list = owned_push(L, sizeof *list, destroy_snapshots);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_snapshots(s, session, list, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, (int)list->n, 0);
  for (size_t i = 0; i < list->n; i++) {
    lua_createtable(L, 0, 4);
    es_lua_set_str(L, "reducer", list->v[i].reducer);
    es_lua_set_int(L, "index", list->v[i].index);
    es_lua_set_str(L, "version", list->v[i].version);
    es_lua_set_int(L, "updated_at", list->v[i].updated_at);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  es_snapshots_destroy(list);
  return done(L, h, 1);
}

static void destroy_type_counts(void *p) { es_type_counts_destroy(p); }

static int m_pending_types(lua_State *L) {
  lstore *h = check_store(L);
  es_type_counts *list = owned_push(L, sizeof *list, destroy_type_counts);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_pending_types(s, list, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, list->n > INT_MAX ? INT_MAX : (int)list->n);
  for (size_t i = 0; i < list->n; i++) {
    lua_pushinteger(L, list->v[i].pending);
    lua_setfield(L, -2, list->v[i].type);
  }
  es_type_counts_destroy(list);
  return done(L, h, 1);
}

/* A session row's §3.7/§3.8 fields: `sealed` always, the rest when set. */
static void push_session_controls(lua_State *L, const es_session_info *si) {
  lua_pushboolean(L, si->sealed_at != ES_NONE);
  lua_setfield(L, -2, "sealed");
  es_lua_set_int(L, "sealed_at", si->sealed_at);
  es_lua_set_str(L, "seal_reason", si->seal_reason);
  if (si->fence > 0) es_lua_set_int(L, "fence", si->fence);
  if (si->lease_holder) {
    lua_createtable(L, 0, 3);
    es_lua_set_str(L, "holder", si->lease_holder);
    es_lua_set_int(L, "token", si->lease_token);
    es_lua_set_int(L, "expires_at", si->lease_expires_at);
    lua_setfield(L, -2, "lease");
  }
  es_lua_set_str(L, "parent", si->parent);
  es_lua_set_int(L, "first_index", si->first_index > 1 ? si->first_index : 1);
}

static int m_sessions(lua_State *L) {
  lstore *h = check_store(L);
  check_opt_table(L, 2);
  const char *prefix = es_lua_opt_str_field(L, 2, "prefix");
  const char *after = es_lua_opt_str_field(L, 2, "after");
  int64_t limit = es_lua_opt_int_field(L, 2, "limit", 100);
  es_sessions *list = owned_push(L, sizeof *list, destroy_sessions);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_sessions(s, prefix, after, limit, list, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, 2);
  lua_createtable(L, (int)list->n, 0);
  for (size_t i = 0; i < list->n; i++) {
    const es_session_info *si = &list->v[i];
    lua_createtable(L, 0, 14);
    es_lua_set_str(L, "session", si->session);
    es_lua_set_int(L, "events", si->events);
    es_lua_set_int(L, "pending", si->pending);
    es_lua_set_int(L, "dead", si->dead);
    es_lua_set_int(L, "attempts", si->attempts);
    es_lua_set_int(L, "failures", si->failures);
    es_lua_set_int(L, "first_at", si->first_at);
    es_lua_set_int(L, "updated_at", si->updated_at);
    push_session_controls(L, si);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  lua_setfield(L, -2, "sessions");
  es_lua_set_str(L, "cursor", list->cursor);
  es_sessions_destroy(list);
  return done(L, h, 1);
}

static int m_events_page(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  check_opt_table(L, 3);
  int64_t after = es_lua_opt_int_field(L, 3, "after", 0);
  int64_t through = es_lua_opt_int_field(L, 3, "through", ES_NONE);
  int64_t limit = es_lua_opt_int_field(L, 3, "limit", 100);
  int64_t through_out = 0;
  es_events *out = owned_push(L, sizeof *out, destroy_events);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_events_page(s, session, after, through, limit, out, &through_out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, 2);
  es_lua_push_events(L, out, 0);
  lua_setfield(L, -2, "events");
  es_lua_set_int(L, "through", through_out);
  return done(L, h, 1);
}

/* ---------------------------------------------------------------------- */
/* 3.5 waiting, 3.6 presence */

static int m_now(lua_State *L) {
  lstore *h = check_store(L);
  int64_t now;
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_now(s, &now, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_pushinteger(L, now);
  return done(L, h, 1);
}

es_store *es_lua_check_store(lua_State *L, int idx, int *lua_clock) {
  lstore *h = luaL_checkudata(L, idx, STORE_MT);
  if (h->in_core || (h->parent && h->parent->in_core))
    es_lua_raisef(L, ES_INVALID_ARGUMENT,
                  "the store cannot be used from inside its own clock function");
  if (!h->s || (h->parent && !h->parent->s)) {
    es_err e = {ES_CLOSED, "the store is closed"};
    es_lua_raise(L, &e);
  }
  lstore *clocked = h->parent ? h->parent : h; /* a tenant runs on its store's clock */
  if (lua_clock) *lua_clock = clocked->clock_ref != LUA_NOREF || clocked->ids_ref != LUA_NOREF;
  return h->s;
}

static int m_wait(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_opt_name(L, 2, "session");
  int64_t after = es_lua_opt_int(L, 3, "after", 0);
  int64_t timeout = es_lua_opt_int(L, 4, "timeout_ms", 0);
  int64_t limit = es_lua_opt_int(L, 5, "limit", 1000);
  es_events *out = owned_push(L, sizeof *out, destroy_events);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_wait(s, session, after, timeout, limit, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  es_lua_push_events(L, out, 0);
  return done(L, h, 1);
}

static int m_presence_set(lua_State *L) {
  lstore *h = check_store(L);
  const char *ns = es_lua_check_name(L, 2, "namespace");
  const char *participant = es_lua_check_name(L, 3, "participant");
  luaL_checktype(L, 4, LUA_TTABLE);
  luaL_checktype(L, 5, LUA_TTABLE);
  int64_t ttl = es_lua_opt_int_field(L, 5, "ttl_ms", ES_NONE);
  if (ttl == ES_NONE) luaL_argerror(L, 5, "field 'ttl_ms' is required");
  int64_t at = es_lua_opt_int_field(L, 5, "at", ES_NONE);
  int64_t seen = es_lua_opt_int_field(L, 5, "seen", 0);
  /* Fields in byte order, so the write is deterministic. */
  size_t n = 0;
  lua_pushnil(L);
  while (lua_next(L, 4)) {
    if (lua_type(L, -2) != LUA_TSTRING) luaL_argerror(L, 4, "presence field names must be strings");
    /* Names first (as the core would), so a value's error message quotes a
     * valid name of at most 255 bytes. */
    es_err nerr = {0};
    if (es_check_name("presence field", es_lua_name(L, -2, "presence field"), &nerr))
      return raise(L, &nerr);
    n++;
    lua_pop(L, 1);
  }
  es_presence_field *fields = lua_newuserdatauv(L, (n ? n : 1) * sizeof *fields, 0);
  lua_createtable(L, (int)n, 0); /* anchors the encoded values */
  int anchor = lua_gettop(L);
  es_buf *buf = es_lua_push_buf_box(L); /* freed with the stack if anything raises */
  size_t i = 0;
  lua_pushnil(L);
  /* i < n: memory safety even if a finalizer run by a collection in this
   * loop added keys to the table (next's order is then undefined anyway). */
  while (i < n && lua_next(L, 4)) {
    fields[i].field = es_lua_name(L, -2, "presence field");
    if (es_json_is_null(L, -1)) {
      fields[i].value = NULL;
      fields[i].value_len = 0;
    } else {
      es_err err = {0};
      char what[300];
      snprintf(what, sizeof what, "values.%s", fields[i].field);
      buf->len = 0;
      if (es_json_encode_lua(L, -1, what, buf, &err) != ES_OK) return raise(L, &err);
      es_lua_push_buf(L, buf);
      fields[i].value = lua_tolstring(L, -1, &fields[i].value_len);
      lua_rawseti(L, anchor, (lua_Integer)i + 1);
    }
    i++;
    lua_pop(L, 1);
  }
  n = i;
  es_buf_destroy(buf);
  es_presence_rows *applied = owned_push(L, sizeof *applied, destroy_rows);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_presence_set(s, ns, participant, fields, n, ttl, at, seen, applied, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  push_patch(L, applied);
  lua_getfield(L, -1, "values");
  lua_remove(L, -2);
  es_presence_rows_destroy(applied);
  return done(L, h, 1);
}

static int m_presence_read(lua_State *L) {
  lstore *h = check_store(L);
  const char *ns = es_lua_check_name(L, 2, "namespace");
  es_presence_rows *rows = owned_push(L, sizeof *rows, destroy_rows);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_presence_read(s, ns, rows, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, (int)rows->n, 0);
  for (size_t i = 0; i < rows->n; i++) {
    const es_presence_row *r = &rows->v[i];
    lua_createtable(L, 0, 6);
    es_lua_set_str(L, "participant", r->participant);
    es_lua_set_str(L, "field", r->field);
    if (es_json_decode_lua(L, r->value, r->value_len, &err) != ES_OK) return raise(L, &err);
    lua_setfield(L, -2, "value");
    es_lua_set_int(L, "seen", r->seen);
    es_lua_set_int(L, "at", r->at);
    es_lua_set_int(L, "expires_at", r->expires_at);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  es_presence_rows_destroy(rows);
  return done(L, h, 1);
}

/* ---------------------------------------------------------------------- */


/* ---------------------------------------------------------------------- */
/* 3.3 many states at once */

typedef struct state_reads {
  es_state_read *v;  /* owned array of n */
  size_t n;
} state_reads;

static void destroy_state_reads(void *p) {
  state_reads *r = p;
  es_state_reads_destroy(r->v, r->n);
  free(r->v);
}

static int m_read_states(lua_State *L) {
  lstore *h = check_store(L);
  luaL_checktype(L, 2, LUA_TTABLE);
  const char *reducer = es_lua_check_name(L, 3, "reducer");
  size_t n = es_lua_check_seq(L, 2, 2, "sessions");
  if (n > ES_DEFAULT_MAX_BATCH) /* before copying or allocating anything for them */
    es_lua_raisef(L, ES_TOO_LARGE, "%zu sessions, over the limit of %d", n, ES_DEFAULT_MAX_BATCH);
  /* The names, copied into one userdata (like claim_next's types) so that
   * nothing Lua does during the call (a clock function) can free one. */
  size_t bytes = 0;
  for (size_t i = 0; i < n; i++) {
    char what[40];
    snprintf(what, sizeof what, "sessions[%zu]", i + 1);
    if (lua_rawgeti(L, 2, (lua_Integer)i + 1) != LUA_TSTRING)
      luaL_argerror(L, 2, "must be a list of session names");
    es_lua_name(L, -1, what);
    bytes += lua_rawlen(L, -1) + 1;
    lua_pop(L, 1);
  }
  size_t head = (n ? n : 1) * sizeof(char *);
  char **names = lua_newuserdatauv(L, head + bytes, 0);
  char *p = (char *)names + head;
  for (size_t i = 0; i < n; i++) {
    size_t len;
    lua_rawgeti(L, 2, (lua_Integer)i + 1);
    const char *name = lua_tolstring(L, -1, &len);
    memcpy(p, name, len + 1);
    names[i] = p;
    p += len + 1;
    lua_pop(L, 1);
  }
  state_reads *box = owned_push(L, sizeof *box, destroy_state_reads);
  es_state_read *out = n ? calloc(n, sizeof *out) : NULL;
  if (n && !out) return luaL_error(L, "out of memory");
  box->v = out;
  box->n = n;
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_read_states(st, (const char *const *)names, n, reducer, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, (int)(n > 100000 ? 0 : n));
  for (size_t i = 0; i < n; i++) {
    lua_createtable(L, 0, 2);
    if (out[i].found) {
      lua_createtable(L, 0, 3);
      es_lua_set_int(L, "index", out[i].snap.index);
      lua_pushlstring(L, out[i].snap.state ? out[i].snap.state : "", out[i].snap.state_len);
      lua_setfield(L, -2, "state");
      es_lua_set_str(L, "version", out[i].snap.version);
      lua_setfield(L, -2, "snapshot");
    }
    es_lua_push_events(L, &out[i].events, 0);
    lua_setfield(L, -2, "events");
    lua_setfield(L, -2, names[i]);
  }
  return done(L, h, 1);
}

/* ---------------------------------------------------------------------- */
/* 3.7 branches */

static void push_lineage(lua_State *L, const es_lineage *l) {
  lua_createtable(L, 0, 4);
  es_lua_set_str(L, "session", l->session);
  es_lua_set_str(L, "parent", l->parent);
  es_lua_set_int(L, "at", l->at);
  es_lua_set_int(L, "created_at", l->created_at);
}

static void push_ref(lua_State *L, const es_ref *r) {
  lua_createtable(L, 0, 5);
  es_lua_set_str(L, "name", r->name);
  es_lua_set_str(L, "session", r->session);
  es_lua_set_int(L, "head", r->head);
  es_lua_set_int(L, "created_at", r->created_at);
  es_lua_set_int(L, "updated_at", r->updated_at);
}

/* A listing's {after, limit} (limit defaults to 100). */
static void listing_opts(lua_State *L, int arg, const char **after, int64_t *limit) {
  check_opt_table(L, arg);
  *after = es_lua_opt_str_field(L, arg, "after");
  *limit = es_lua_opt_int_field(L, arg, "limit", 100);
}

static int m_fork(lua_State *L) {
  lstore *h = check_store(L);
  const char *from = es_lua_check_name(L, 2, "from");
  int64_t at = es_lua_check_int(L, 3, "at");
  const char *to = es_lua_check_name(L, 4, "to");
  es_lineage *out = owned_push(L, sizeof *out, destroy_lineage);
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_fork(st, from, at, to, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  push_lineage(L, out);
  return done(L, h, 1);
}

static int m_lineage(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  es_lineage *out = owned_push(L, sizeof *out, destroy_lineage);
  int found = 0;
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_lineage(st, session, &found, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  if (found) push_lineage(L, out);
  else lua_pushnil(L);
  return done(L, h, 1);
}

static int m_children(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  const char *after;
  int64_t limit;
  listing_opts(L, 3, &after, &limit);
  es_lineages *out = owned_push(L, sizeof *out, destroy_lineages);
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_children(st, session, after, limit, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, (int)out->n, 0);
  for (size_t i = 0; i < out->n; i++) {
    push_lineage(L, &out->v[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  return done(L, h, 1);
}

static int m_put_ref(lua_State *L) {
  lstore *h = check_store(L);
  const char *name = es_lua_check_name(L, 2, "name");
  const char *session = es_lua_check_name(L, 3, "session");
  es_ref *out = owned_push(L, sizeof *out, destroy_ref);
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_put_ref(st, name, session, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  push_ref(L, out);
  return done(L, h, 1);
}

static int m_get_ref(lua_State *L) {
  lstore *h = check_store(L);
  const char *name = es_lua_check_name(L, 2, "name");
  es_ref *out = owned_push(L, sizeof *out, destroy_ref);
  int found = 0;
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_get_ref(st, name, &found, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  if (found) push_ref(L, out);
  else lua_pushnil(L);
  return done(L, h, 1);
}

static int m_list_refs(lua_State *L) {
  lstore *h = check_store(L);
  const char *after;
  int64_t limit;
  listing_opts(L, 2, &after, &limit);
  es_refs *out = owned_push(L, sizeof *out, destroy_refs);
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_list_refs(st, after, limit, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, (int)out->n, 0);
  for (size_t i = 0; i < out->n; i++) {
    push_ref(L, &out->v[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  return done(L, h, 1);
}

static int m_delete_ref(lua_State *L) {
  lstore *h = check_store(L);
  const char *name = es_lua_check_name(L, 2, "name");
  int deleted = 0;
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_delete_ref(st, name, &deleted, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_pushboolean(L, deleted);
  return done(L, h, 1);
}

static int m_promote(lua_State *L) {
  lstore *h = check_store(L);
  const char *from = es_lua_check_name(L, 2, "from_ref");
  const char *to = es_lua_check_name(L, 3, "to_ref");
  check_opt_table(L, 4);
  int has_expect = 0;
  const char *expect = NULL;
  if (!lua_isnoneornil(L, 4)) {
    lua_getfield(L, 4, "expect");
    if (lua_type(L, -1) == LUA_TSTRING) {
      has_expect = 1;
      expect = es_lua_name(L, -1, "expect");
    } else if (lua_type(L, -1) == LUA_TBOOLEAN && !lua_toboolean(L, -1)) {
      has_expect = 1;
    } else if (!lua_isnil(L, -1)) {
      luaL_argerror(L, 4, "field 'expect' must be a session name or false");
    }
    /* expect stays on the stack: the options table does not anchor it
     * against a clock function that changes the table (str_field's rule) */
  }
  es_ref *out = owned_push(L, sizeof *out, destroy_ref);
  char **actual = owned_push(L, sizeof *actual, destroy_cstr);
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_promote(st, from, to, has_expect, expect, out, actual, &err);
  core_leave(L, h);
  if (rc == ES_REF_CONFLICT) {
    /* The error carries what the caller expected and what it found
     * (false: no ref), so a loser can retry against `actual`. */
    es_lua_push_error(L, rc, err.msg);
    if (expect) lua_pushstring(L, expect);
    else lua_pushboolean(L, 0);
    lua_setfield(L, -2, "expected");
    if (*actual) lua_pushstring(L, *actual);
    else lua_pushboolean(L, 0);
    lua_setfield(L, -2, "actual");
    return lua_error(L);
  }
  if (rc) return raise(L, &err);
  push_ref(L, out);
  return done(L, h, 1);
}

/* ---------------------------------------------------------------------- */
/* 3.8 fences, leases, seals */

static int m_fence(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  check_opt_table(L, 3);
  int64_t if_token = es_lua_opt_int_field(L, 3, "if_token", ES_NONE);
  int64_t token = 0;
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_fence(st, session, if_token, &token, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_pushinteger(L, token);
  return done(L, h, 1);
}

static int m_lease(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  luaL_checktype(L, 3, LUA_TTABLE);
  const char *holder = es_lua_req_str_field(L, 3, "holder");
  int64_t ttl = es_lua_opt_int_field(L, 3, "ttl_ms", ES_NONE);
  if (ttl == ES_NONE) luaL_argerror(L, 3, "field 'ttl_ms' is required");
  es_lease *out = owned_push(L, sizeof *out, destroy_lease);
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_lease(st, session, holder, ttl, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  es_lua_push_lease(L, out);
  return done(L, h, 1);
}

static int m_release(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  luaL_checktype(L, 3, LUA_TTABLE);
  const char *holder = es_lua_req_str_field(L, 3, "holder");
  int64_t token = es_lua_opt_int_field(L, 3, "token", ES_NONE);
  if (token == ES_NONE) luaL_argerror(L, 3, "field 'token' is required");
  int released = 0;
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_lease_release(st, session, holder, token, &released, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_pushboolean(L, released);
  return done(L, h, 1);
}

static int m_seal(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  check_opt_table(L, 3);
  size_t len = 0;
  const char *reason = lua_isnoneornil(L, 3) ? NULL : es_lua_opt_text_field(L, 3, "reason", &len);
  char **text = owned_push(L, sizeof *text, destroy_cstr);
  if (reason && es_text_clean(reason, len, ES_MAX_TEXT_BYTES, text, NULL))
    return luaL_error(L, "out of memory");
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_seal(st, session, *text, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  return done(L, h, 0);
}

/* ---------------------------------------------------------------------- */
/* 3.9 retention */

static int m_truncate(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  int64_t through = es_lua_check_int(L, 3, "through");
  int64_t first = 1;
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_truncate(st, session, through, &first, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_pushinteger(L, first);
  return done(L, h, 1);
}

static int m_delete(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  int deleted = 0;
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_delete(st, session, &deleted, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_pushboolean(L, deleted);
  return done(L, h, 1);
}

/* ---------------------------------------------------------------------- */
/* 3.9 archive */

static void destroy_segment(void *p) { es_segment_destroy(p); }
static void destroy_segments(void *p) { es_segments_destroy(p); }
static void destroy_report(void *p) { es_archive_report_destroy(p); }

static void push_segment(lua_State *L, const es_segment *g) {
  lua_createtable(L, 0, 7);
  es_lua_set_int(L, "from", g->from);
  es_lua_set_int(L, "through", g->through);
  es_lua_set_int(L, "count", g->count);
  es_lua_set_int(L, "bytes", g->bytes);
  es_lua_set_str(L, "checksum", g->checksum);
  es_lua_set_str(L, "file", g->file);
  es_lua_set_int(L, "created_at", g->created_at);
}

/* store:archive(session, {through = n}) -> the new segment, or nil when
 * everything through n was archived already. */
static int m_archive(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  luaL_checktype(L, 3, LUA_TTABLE);
  lua_getfield(L, 3, "through");
  if (lua_isnil(L, -1)) luaL_argerror(L, 3, "field 'through' is required");
  lua_pop(L, 1);
  int64_t through = es_lua_opt_int_field(L, 3, "through", 0);
  es_segment *g = owned_push(L, sizeof *g, destroy_segment);
  int written = 0;
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_archive(st, session, through, &written, g, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  if (written) push_segment(L, g);
  else lua_pushnil(L);
  es_segment_destroy(g);
  return done(L, h, 1);
}

static int m_segments(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  es_segments *list = owned_push(L, sizeof *list, destroy_segments);
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_segments(st, session, list, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, (int)list->n, 0);
  for (size_t i = 0; i < list->n; i++) {
    push_segment(L, &list->v[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  es_segments_destroy(list);
  return done(L, h, 1);
}

static int m_compact_archive(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  int64_t before = 0, after = 0;
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_compact_archive(st, session, &before, &after, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, 2);
  es_lua_set_int(L, "before", before);
  es_lua_set_int(L, "after", after);
  return done(L, h, 1);
}

static void push_problems(lua_State *L, const es_archive_problem *v, size_t n) {
  lua_createtable(L, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    lua_createtable(L, 0, 3);
    es_lua_set_str(L, "session", v[i].session);
    es_lua_set_str(L, "file", v[i].file);
    es_lua_set_str(L, "problem", v[i].problem);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
}

/* store:verify_archive([session]) -> {problems, orphans, checked} */
static int m_verify_archive(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_opt_name(L, 2, "session");
  es_archive_report *r = owned_push(L, sizeof *r, destroy_report);
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_verify_archive(st, session, r, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, 3);
  push_problems(L, r->problems, r->n_problems);
  lua_setfield(L, -2, "problems");
  push_problems(L, r->orphans, r->n_orphans);
  lua_setfield(L, -2, "orphans");
  es_lua_set_int(L, "checked", r->checked);
  es_archive_report_destroy(r);
  return done(L, h, 1);
}

/* ---------------------------------------------------------------------- */
/* 3.11 tenants */

/* store:tenant(name) -> a store handle scoped to the tenant: the same
 * methods, the tenant's names in and out. Its user value keeps this
 * handle (and so the store and its clock) from collection while it
 * lives; closing it closes only it. */
static int m_tenant(lua_State *L) {
  lstore *h = check_store(L);
  size_t n = 0;
  if (lua_type(L, 2) != LUA_TSTRING) luaL_typeerror(L, 2, "string");
  const char *name = lua_tolstring(L, 2, &n);
  if (memchr(name, '\0', n))
    es_lua_raisef(L, ES_INVALID_ARGUMENT, "tenant name must not hold a NUL byte");
  if (h->parent)
    es_lua_raisef(L, ES_INVALID_ARGUMENT,
                  "tenant() of a tenant handle: tenants do not nest (make it from the store)");
  lstore *t = lua_newuserdatauv(L, sizeof *t, 1);
  memset(t, 0, sizeof *t);
  t->clock_ref = t->ids_ref = LUA_NOREF;
  luaL_setmetatable(L, STORE_MT);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  es_err err = {0};
  es_store *ts = NULL;
  es_store *s = core_enter(L, h);
  int rc = es_store_tenant(s, name, &ts, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  t->s = t->held = ts;
  t->parent = h;
  return 1;
}

/* ---------------------------------------------------------------------- */
/* 3.10 crypto-shredding */

/* store:shred(name) -> true when a live key was destroyed now. */
static int m_shred(lua_State *L) {
  lstore *h = check_store(L);
  const char *name = es_lua_check_name(L, 2, "name");
  int was_live = 0;
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_shred(st, name, &was_live, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_pushboolean(L, was_live);
  return done(L, h, 1);
}

/* store:read_at_rest(session, {after, through, limit}) -> events as
 * stored: keyed ones with `ciphertext` instead of `payload`. */
static int m_read_at_rest(lua_State *L) { return read_with(L, es_store_read_at_rest, 1); }

static const luaL_Reg store_methods[] = {
    {"append", m_append},
    {"read", m_read},
    {"head", m_head},
    {"read_all", m_read_all},
    {"plan", m_plan},
    {"set_plan", m_set_plan},
    {"_crash_after", m_shards_crash_after},
    {"_pause_after", m_shards_pause_after},
    {"claim", m_claim},
    {"claim_next", m_claim_next},
    {"renew", m_renew},
    {"complete", m_complete},
    {"fail", m_fail},
    {"revive", m_revive},
    {"settle", m_settle},
    {"dead_letters", m_dead_letters},
    {"read_state", m_read_state},
    {"put_snapshot", m_put_snapshot},
    {"snapshots", m_snapshots},
    {"sessions", m_sessions},
    {"pending_types", m_pending_types},
    {"events_page", m_events_page},
    {"subscribe", m_subscribe},
    {"wait", m_wait},
    {"now", m_now},
    {"presence_set", m_presence_set},
    {"presence_read", m_presence_read},
    {"presence_subscribe", m_presence_subscribe},
    {"read_states", m_read_states},
    {"fork", m_fork},
    {"lineage", m_lineage},
    {"children", m_children},
    {"put_ref", m_put_ref},
    {"get_ref", m_get_ref},
    {"list_refs", m_list_refs},
    {"delete_ref", m_delete_ref},
    {"promote", m_promote},
    {"fence", m_fence},
    {"lease", m_lease},
    {"release", m_release},
    {"seal", m_seal},
    {"truncate", m_truncate},
    {"delete", m_delete},
    {"archive", m_archive},
    {"segments", m_segments},
    {"compact_archive", m_compact_archive},
    {"verify_archive", m_verify_archive},
    {"tenant", m_tenant},
    {"shred", m_shred},
    {"read_at_rest", m_read_at_rest},
    {"stats", m_stats},
    {"_stats_enabled", m_stats_enabled},
    {"close", m_close},
    {NULL, NULL},
};

static const luaL_Reg store_meta[] = {
    {"__gc", m_gc},
    {"__close", m_close},
    {"__tostring", m_tostring},
    {NULL, NULL},
};

static const luaL_Reg clock_methods[] = {
    {"now", c_now},
    {"set", c_set},
    {"advance", c_advance},
    {NULL, NULL},
};

static const luaL_Reg clock_meta[] = {
    {"__gc", c_gc},
    {"__call", c_call},
    {NULL, NULL},
};

static const luaL_Reg ids_meta[] = {
    {"__gc", ids_gc},
    {"__call", ids_call},
    {NULL, NULL},
};

static const luaL_Reg module_fns[] = {
    {"open", l_open},
    {"manual_clock", l_manual_clock},
    {"counter_ids", l_counter_ids},
    {NULL, NULL},
};


int es_lua_open_store(lua_State *L) {
  luaL_newmetatable(L, STORE_MT);
  luaL_setfuncs(L, store_meta, 0);
  luaL_newlib(L, store_methods);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  luaL_newmetatable(L, CLOCK_MT);
  luaL_setfuncs(L, clock_meta, 0);
  luaL_newlib(L, clock_methods);
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  luaL_newmetatable(L, IDS_MT);
  luaL_setfuncs(L, ids_meta, 0);
  lua_pop(L, 1);

  luaL_newlib(L, module_fns);
  es_json_push_module(L);
  lua_setfield(L, -2, "json");
  es_state_push_module(L);
  lua_setfield(L, -2, "state");
  luaL_getmetatable(L, STORE_MT);
  lua_getfield(L, -1, "__index");
  lua_setfield(L, -3, "store_methods"); /* init.lua adds Lua-written methods (stream) */
  lua_pop(L, 1);
  es_lua_push_error(L, ES_OK, ""); /* creates the error metatable */
  lua_getmetatable(L, -1);
  lua_setfield(L, -3, "error_mt");
  lua_pop(L, 1);
  lua_pushliteral(L, ES_LUA_VERSION);
  lua_setfield(L, -2, "_VERSION");
  return 1;
}
