/*
 * module/store_handle.c: the Lua face of the store: the module table
 * (es_lua_open_store; module/module.c adds the engine), the "eventstore.Store" handle (shaped like liolib's file handles), the
 * manual clock, and in-process subscriptions.
 *
 * The handle is five files by concern, sharing module/store_internal.h
 * (the handle's struct and the helpers every method uses): this one
 * (open, close, clocks, shard plans, tenant handles, the method tables),
 * store_subs.c (subscriptions, wait, presence), store_events.c (append,
 * read, stats, snapshots, states), store_dispatch.c (claims, fences,
 * leases, seals) and store_history.c (branches, retention, archive).
 *
 * Argument misuse raises standard Lua argument errors; everything the core
 * rejects is raised as an eventstore error object (bridge/common.h).
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
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/ids.h"
#include "bridge/json_lua.h"
#include "bridge/common.h"
#include "bridge/events.h"
#include "bridge/state.h"
#include "module/store_handle.h"
#include "module/store_internal.h"
#include "store/store.h"
#include "store/shards.h"


#define ES_LUA_VERSION "eventstore 0.1.0"

static es_shard_plan *check_plan(lua_State *L, int idx, int arg);

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

_Thread_local lstore *es_lstore_calling;

/* Whether this thread is making a call through h (or through a tenant
 * handle of h, whose calls run h's clock). */
static int calling_through(const lstore *h) {
  const lstore *c = es_lstore_calling;
  return c && (c == h || c->parent == h);
}

/* The core's clock when `clock` is a Lua function. It runs only inside a
 * call of this handle, on the thread and the state making that call (the
 * engine refuses such stores). Anywhere else (the core's presence
 * watcher, a thread of its own reading other processes' rows) the time it
 * last gave stands: a Lua state is never entered from two threads. */
static int lua_fn_clock(void *ctx, int64_t *now, es_err *err) {
  lstore *h = ctx;
  if (!calling_through(h) || !h->L || !h->in_core) {
    if (atomic_load(&h->clock_known)) {
      *now = atomic_load(&h->clock_last);
      return ES_OK;
    }
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "the clock function runs only inside a call made through its store");
  }
  lua_State *L = h->L;
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
  atomic_store(&h->clock_last, v);
  atomic_store(&h->clock_known, 1);
  return ES_OK;
}

/* The core's id source when `ids` is a Lua function: like a Lua clock, it
 * runs only inside a call of this handle, on the state making it. */
static int lua_fn_ids(void *ctx, char *out, size_t cap, es_err *err) {
  lstore *h = ctx;
  if (!calling_through(h) || !h->L || !h->in_core)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "the id function runs only inside a call made through its store");
  lua_State *L = h->L;
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

/* The one close function behind close(), __close and __gc (docs/architecture.md
 * convention 7). Harmless twice. Releases a Lua clock even for a handle
 * whose open failed (h->s never set). */
void es_lstore_close(lua_State *L, lstore *h) {
  if (h->in_core) {
    /* Only the clock runs Lua now; es_store_close would wait for the very
     * call that runs it. */
    if (h->s) h->close_requested = 1;
    return;
  }
  /* even when the store is already gone: nothing may stay subscribed to a
   * closed handle (psub_end leaves the core's watch to the closed store) */
  for (sub *x = h->subs; x; x = x->next) es_lstore_sub_end(L, x);
  for (psub *p = h->psubs; p; p = p->next) es_lstore_psub_end(L, h, p);
  if (h->s) {
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
  es_lstore_reap(h);
}

static int m_close(lua_State *L) {
  lstore *h = luaL_checkudata(L, 1, STORE_MT);
  es_lstore_close(L, h);
  return 0;
}

static int m_gc(lua_State *L) {
  lstore *h = luaL_checkudata(L, 1, STORE_MT);
  es_lstore_close(L, h);
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
  /* docs/contract.md §5: "shards:" with {catalog = url, plan = ...}, or
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
  calling_begin(h);
  int rc = sharded ? es_shards_open(catalog, plan, &o, &s, &err) : es_store_open(url, &o, &s, &err);
  h->s = h->held = s;
  core_leave(L, h);
  if (rc != ES_OK) {
    es_lstore_close(L, h); /* a Lua clock's ref now rather than at collection */
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
/* sharding (docs/contract.md §5, docs/sharding.md) */

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
  return es_lstore_done(L, h, 1);
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
  return es_lstore_done(L, h, 1);
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
  es_store_cursors_free(c->cursors, c->n_cursors);
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
  int rc = es_store_read_all_cursor(s, cursor, limit, &page->events, &page->cursors, &err);
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
  return es_lstore_done(L, h, 1);
}

/* Whether read_all goes by cursors: a shards: store, or a tenant handle
 * of one (the tenant's capabilities are its base's). */
static int reads_by_cursor(lstore *h) {
  es_capabilities c;
  es_err err = {0};
  return es_store_capabilities(h->s, &c, &err) == ES_OK && c.sharded;
}

static int m_read_all(lua_State *L) {
  lstore *h = check_store(L);
  check_opt_table(L, 2);
  if (reads_by_cursor(h)) {
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
  return es_lstore_done(L, h, 1);
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

/* store:capabilities() -> {backend, durable, processes, keys, archive,
 * tenant, sharded} (§3.1). */
static int m_capabilities(lua_State *L) {
  lstore *h = check_store(L);
  if (lua_gettop(L) > 1) return luaL_argerror(L, 2, "capabilities takes no arguments");
  es_capabilities c;
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_capabilities(s, &c, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, 7);
  es_lua_set_str(L, "backend", c.backend);
  es_lua_set_str(L, "tenant", c.tenant);
  const char *names[] = {"durable", "processes", "keys", "archive", "sharded"};
  const int flags[] = {c.durable, c.processes, c.keys, c.archive, c.sharded};
  for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
    lua_pushboolean(L, flags[i]);
    lua_setfield(L, -2, names[i]);
  }
  return es_lstore_done(L, h, 1);
}

static const luaL_Reg store_methods[] = {
    {"read_all", m_read_all},
    {"capabilities", m_capabilities},
    {"plan", m_plan},
    {"set_plan", m_set_plan},
    {"_crash_after", m_shards_crash_after},
    {"_pause_after", m_shards_pause_after},
    {"tenant", m_tenant},
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
  lua_newtable(L); /* the methods, each file its own share */
  luaL_setfuncs(L, store_methods, 0);
  luaL_setfuncs(L, es_lstore_subs_methods, 0);
  luaL_setfuncs(L, es_lstore_events_methods, 0);
  luaL_setfuncs(L, es_lstore_dispatch_methods, 0);
  luaL_setfuncs(L, es_lstore_history_methods, 0);
  luaL_setfuncs(L, es_lstore_move_methods, 0);
  luaL_setfuncs(L, es_lstore_projection_methods, 0);
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
