/*
 * module/engine_handle.c: the "eventstore.Engine" handle, a thin Lua face of
 * the C engine (engine/engine.h), shaped like liolib's file handles: the
 * handle is created closed before the engine is acquired, one close
 * function sits behind close(), __gc and __close, closing twice is
 * harmless, and a closed handle raises CLOSED. lua/eventstore/engine.lua
 * wraps it (opening a store from a URL).
 *
 * No user code runs in the caller's Lua state: handlers and reducers run in
 * the engine's own states, and a folded state reaches the caller as a copy
 * through the reducer-state codec.
 */
#include <lauxlib.h>
#include <lua.h>
#include <string.h>

#include "bridge/state.h"
#include "engine/engine.h"
#include "engine/type_stats.h"
#include "bridge/common.h"
#include "module/engine_handle.h"
#include "module/module.h"
#include "bridge/events.h"
#include "module/store_handle.h"

#define ENGINE_MT "eventstore.Engine"

typedef struct lengine {
  es_engine *e;  /* NULL: closed */
  int running;   /* in run(): close waits for it to return */
} lengine;

static lengine *check_handle(lua_State *L) {
  lengine *h = luaL_checkudata(L, 1, ENGINE_MT);
  if (!h->e) es_lua_raisef(L, ES_CLOSED, "the engine is closed");
  return h;
}

static es_engine *check_engine(lua_State *L) { return check_handle(L)->e; }

es_engine *es_lua_check_engine(lua_State *L, int idx) {
  lengine *h = luaL_checkudata(L, idx, ENGINE_MT);
  if (!h->e) es_lua_raisef(L, ES_CLOSED, "the engine is closed");
  return h->e;
}

/* A string option without NUL bytes (a C string would silently cut it). */
static const char *opt_name(lua_State *L, int arg, const char *field) {
  lua_getfield(L, arg, field);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return NULL;
  }
  if (lua_type(L, -1) != LUA_TSTRING)
    luaL_argerror(L, arg, lua_pushfstring(L, "field '%s' must be a string", field));
  /* Left on the stack: a string an __index metamethod made has no other
   * anchor, and the engine copies it only later. */
  return es_lua_name(L, -1, field);
}

/* core.engine(store, opts) -> handle */
static int l_engine_new(lua_State *L) {
  int lua_clock = 0;
  es_store *s = es_lua_check_store(L, 1, &lua_clock);
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_settop(L, 2);
  if (lua_clock)
    luaL_argerror(L, 1, "the store's clock or id source is a Lua function, which worker threads "
                        "cannot call; use eventstore.manual_clock and eventstore.counter_ids");
  es_engine_opts o;
  es_engine_opts_init(&o);
  o.workers = es_lua_opt_int_field(L, 2, "workers", o.workers);
  o.fold_runners = es_lua_opt_int_field(L, 2, "fold_runners", o.fold_runners);
  o.ttl_ms = es_lua_opt_int_field(L, 2, "ttl_ms", o.ttl_ms);
  o.max_failures = es_lua_opt_int_field(L, 2, "max_failures", o.max_failures);
  o.backoff_ms = es_lua_opt_int_field(L, 2, "backoff_ms", o.backoff_ms);
  o.backoff_cap_ms = es_lua_opt_int_field(L, 2, "backoff_cap_ms", o.backoff_cap_ms);
  o.instruction_budget = es_lua_opt_int_field(L, 2, "instruction_budget", o.instruction_budget);
  o.memory_budget = es_lua_opt_int_field(L, 2, "memory_budget", o.memory_budget);
  o.deadline_ms = es_lua_opt_int_field(L, 2, "deadline_ms", o.deadline_ms);
  o.snapshot_every = es_lua_opt_int_field(L, 2, "snapshot_every", o.snapshot_every);
  o.outage_ms = es_lua_opt_int_field(L, 2, "outage_ms", o.outage_ms);
  if (lua_getfield(L, 2, "quiet") != LUA_TNIL) {
    if (!lua_isboolean(L, -1))
      luaL_error(L, "bad option 'quiet' (boolean expected, got %s)", luaL_typename(L, -1));
    o.quiet = lua_toboolean(L, -1);
  }
  lua_pop(L, 1);
  if (lua_getfield(L, 2, "inline_runs") != LUA_TNIL) {
    if (!lua_isboolean(L, -1))
      luaL_error(L, "bad option 'inline_runs' (boolean expected, got %s)", luaL_typename(L, -1));
    o.inline_runs = lua_toboolean(L, -1);
  }
  lua_pop(L, 1);
  const char *scripts = opt_name(L, 2, "scripts");
  if (scripts) o.scripts = scripts;
  o.holder = opt_name(L, 2, "holder");
  o.open_core = luaopen_eventstore_core;
  /* The engine's states find lua/eventstore/loader.lua (and handlers find
   * their modules) where this state finds its own. */
  lua_getglobal(L, "package");
  if (lua_istable(L, -1)) {
    lua_getfield(L, -1, "path");
    lua_getfield(L, -2, "cpath");
    o.lua_path = lua_tostring(L, -2);
    o.lua_cpath = lua_tostring(L, -1);
  }
  lengine *h = lua_newuserdatauv(L, sizeof *h, 0);
  h->e = NULL;
  h->running = 0;
  luaL_setmetatable(L, ENGINE_MT);
  es_err err = {0};
  if (es_engine_open(s, &o, &h->e, &err) != ES_OK) return es_lua_raise(L, &err);
  return 1;
}

typedef struct progress_ctx {
  lua_State *L;
  int fn;       /* stack index of the progress function; 0: none */
  int failed;   /* its error is on the stack (raised after the run) */
} progress_ctx;

static int on_progress(void *ud, const es_engine_stats *st) {
  progress_ctx *p = ud;
  lua_State *L = p->L;
  if (!p->fn || p->failed) return p->failed;
  lua_pushvalue(L, p->fn);
  lua_createtable(L, 0, 4);
  es_lua_set_int(L, "handled", st->handled);
  es_lua_set_int(L, "failed", st->failed);
  es_lua_set_int(L, "dead", st->dead);
  es_lua_set_int(L, "busy", st->busy);
  if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
    p->failed = 1;
    return 1;
  }
  return 0;
}

/* run{until_idle, progress, progress_ms} -> {handled, failed, dead, abandoned,
 * unhandled, unhandled_types} */
static int l_engine_run(lua_State *L) {
  lengine *h = check_handle(L);
  es_run_opts ro = {0};
  progress_ctx p = {L, 0, 0};
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_getfield(L, 2, "until_idle");
    ro.until_idle = lua_toboolean(L, -1);
    lua_pop(L, 1);
    ro.progress_ms = es_lua_opt_int_field(L, 2, "progress_ms", 500);
    if (ro.progress_ms < 1 || ro.progress_ms > 3600000)
      es_lua_raisef(L, ES_INVALID_ARGUMENT, "progress_ms must be from 1 to 3600000");
    lua_getfield(L, 2, "progress");
    if (lua_isfunction(L, -1)) p.fn = lua_gettop(L);
    else if (!lua_isnil(L, -1)) luaL_argerror(L, 2, "field 'progress' must be a function");
    else lua_pop(L, 1);
  }
  ro.progress = on_progress;
  ro.progress_ctx = &p;
  es_engine_stats st;
  es_err err = {0};
  /* A nested run from the progress function is refused by the engine;
   * its return must not clear the outer run's guard (close() would then
   * free the engine under the outer run's workers). */
  int outer = h->running;
  h->running = 1;
  int rc = es_engine_run(h->e, &ro, &st, &err);
  h->running = outer;
  if (p.failed) return lua_error(L); /* the progress function's error */
  if (rc) return es_lua_raise(L, &err);
  lua_createtable(L, 0, 4);
  es_lua_set_int(L, "handled", st.handled);
  es_lua_set_int(L, "failed", st.failed);
  es_lua_set_int(L, "dead", st.dead);
  es_lua_set_int(L, "abandoned", st.abandoned);
  es_lua_set_int(L, "unhandled", st.unhandled);
  if (st.unhandled) es_lua_set_str(L, "unhandled_types", st.unhandled_types);
  return 1;
}

static int l_engine_stop(lua_State *L) {
  es_engine_stop(check_engine(L));
  return 0;
}

/* state(session, reducer, at) -> state: folded in the engine's fold state
 * and copied into this one. */
static int l_engine_state(lua_State *L) {
  es_engine *e = check_engine(L);
  const char *session = es_lua_check_name(L, 2, "session");
  const char *reducer = es_lua_check_name(L, 3, "reducer");
  int64_t at = es_lua_opt_int(L, 4, "at", ES_NONE); /* math.mininteger is ES_NONE: refused */
  es_buf buf;
  es_buf_init(&buf);
  es_err err = {0};
  if (es_engine_state(e, session, reducer, at, &buf, NULL, &err) != ES_OK) {
    es_buf_destroy(&buf);
    return es_lua_raise(L, &err);
  }
  /* The bytes move into a Lua string first, so decoding (which may raise
   * on memory) leaks nothing. */
  es_lua_push_buf(L, &buf);
  es_buf_destroy(&buf);
  size_t n;
  const char *data = lua_tolstring(L, -1, &n);
  if (es_state_decode(L, data, n, &err) != ES_OK) return es_lua_raise(L, &err);
  return 1;
}

/* upcast(events) -> events as handlers see them (§7): a copy of the list
 * crosses into an engine state through the reducer-state codec, is upcast
 * there (user code never runs in this state), and comes back. */
static int l_engine_upcast(lua_State *L) {
  es_engine *e = check_engine(L);
  luaL_checktype(L, 2, LUA_TTABLE);
  es_buf in, out;
  es_buf_init(&in);
  es_buf_init(&out);
  es_err err = {0};
  int rc = es_state_encode(L, 2, "events", &in, &err);
  if (rc == ES_OK) rc = es_engine_upcast(e, in.data ? in.data : "", in.len, &out, &err);
  es_buf_destroy(&in);
  if (rc != ES_OK) {
    es_buf_destroy(&out);
    return es_lua_raise(L, &err);
  }
  es_lua_push_buf(L, &out); /* into a Lua string first: decoding may raise */
  es_buf_destroy(&out);
  size_t n;
  const char *data = lua_tolstring(L, -1, &n);
  if (es_state_decode(L, data, n, &err) != ES_OK) return es_lua_raise(L, &err);
  return 1;
}

/* append(session, events, opts) -> stored, pending: store:append with the
 * engine's rules (timers; no handler: stored processed), opts.answer too. */
static int l_engine_append(lua_State *L) {
  es_engine *e = check_engine(L);
  es_store *s = es_engine_store(e);
  const char *session = es_lua_check_name(L, 2, "session");
  if (!lua_isnoneornil(L, 4)) luaL_checktype(L, 4, LUA_TTABLE);
  int64_t expected = es_lua_opt_int_field(L, 4, "expected", ES_NONE);
  int ids = es_lua_opt_answer_ids(L, 4);
  int64_t now;
  es_err err = {0};
  if (es_store_now(s, &now, &err)) return es_lua_raise(L, &err);
  size_t n;
  es_new_event *evs = es_lua_check_events(L, 3, 3, now, es_store_max_payload(s), &n);
  es_events out;
  int pending = 0;
  if (es_engine_append(e, session, evs, n, expected, &out, &pending, &err) != ES_OK)
    return es_lua_raise(L, &err);
  if (ids) es_lua_push_event_ids(L, &out);
  else es_lua_push_events(L, &out, 0);
  lua_pushboolean(L, pending);
  return 2;
}

/* lease(session, {ttl_ms}): as store:lease, for this engine's holder; while
 * it holds the lease its writes to the session carry the token. */
static int l_engine_lease(lua_State *L) {
  es_engine *e = check_engine(L);
  const char *session = es_lua_check_name(L, 2, "session");
  if (!lua_isnoneornil(L, 3)) luaL_checktype(L, 3, LUA_TTABLE);
  int64_t ttl = es_lua_opt_int_field(L, 3, "ttl_ms", 30000);
  es_lease out;
  es_err err = {0};
  if (es_engine_lease(e, session, ttl, &out, &err) != ES_OK) return es_lua_raise(L, &err);
  es_lua_push_lease(L, &out);
  return 1;
}

/* release(session) -> whether the engine's lease was ended. */
static int l_engine_release(lua_State *L) {
  es_engine *e = check_engine(L);
  const char *session = es_lua_check_name(L, 2, "session");
  int released = 0;
  es_err err = {0};
  if (es_engine_release(e, session, &released, &err) != ES_OK) return es_lua_raise(L, &err);
  lua_pushboolean(L, released);
  return 1;
}

/* truncate(session, through) -> first_index: snapshots every reducer at
 * through, then store truncate. */
static int l_engine_truncate(lua_State *L) {
  es_engine *e = check_engine(L);
  const char *session = es_lua_check_name(L, 2, "session");
  int64_t through = es_lua_check_int(L, 3, "through");
  int64_t first = 1;
  es_err err = {0};
  if (es_engine_truncate(e, session, through, &first, &err) != ES_OK) return es_lua_raise(L, &err);
  lua_pushinteger(L, first);
  return 1;
}

/* has_handler(type): whether scripts/handlers/<type>.lua exists. */
static int l_engine_has_handler(lua_State *L) {
  es_engine *e = check_engine(L);
  lua_pushboolean(L, es_engine_has_handler(e, es_lua_check_name(L, 2, "type")));
  return 1;
}

/* §3.12 stats() -> {types = {[type] = {handled, failed, dead, runs, p50_us,
 * p99_us, max_us}}, handled, failed, dead, reload_failures, store = store:stats()}: since
 * the engine opened, across runs (docs/stats.md). Takes no argument. */
typedef struct {
  lua_State *L;
  int64_t handled, failed, dead;
} type_push;

static void push_type(void *ctx, const es_type_stat *st) {
  type_push *p = ctx;
  lua_State *L = p->L;
  es_stats_summary sum;
  es_stats_hist_read((es_stats_hist *)&st->runs, &sum);
  int64_t handled = (int64_t)atomic_load(&st->handled), failed = (int64_t)atomic_load(&st->failed),
          dead = (int64_t)atomic_load(&st->dead);
  p->handled += handled;
  p->failed += failed;
  p->dead += dead;
  lua_createtable(L, 0, 7);
  es_lua_set_int(L, "handled", handled);
  es_lua_set_int(L, "failed", failed);
  es_lua_set_int(L, "dead", dead);
  es_lua_set_int(L, "runs", (int64_t)sum.count);
  lua_pushnumber(L, (lua_Number)sum.p50_ns / 1000.0);
  lua_setfield(L, -2, "p50_us");
  lua_pushnumber(L, (lua_Number)sum.p99_ns / 1000.0);
  lua_setfield(L, -2, "p99_us");
  lua_pushnumber(L, (lua_Number)sum.max_ns / 1000.0);
  lua_setfield(L, -2, "max_us");
  lua_setfield(L, -2, st->type);
}

static int l_engine_stats(lua_State *L) {
  es_engine *e = check_engine(L);
  if (lua_gettop(L) > 1) return luaL_argerror(L, 2, "stats takes no arguments");
  es_err err = {0};
  if (es_lua_push_stats(L, es_engine_store(e), &err) != ES_OK) return es_lua_raise(L, &err);
  int store = lua_gettop(L);
  lua_createtable(L, 0, 5);
  type_push p = {L, 0, 0, 0};
  lua_newtable(L);
  es_type_stats_each(es_engine_type_stats(e), push_type, &p);
  lua_setfield(L, -2, "types");
  es_lua_set_int(L, "handled", p.handled);
  es_lua_set_int(L, "failed", p.failed);
  es_lua_set_int(L, "dead", p.dead);
  es_lua_set_int(L, "reload_failures", es_engine_reload_failures(e));
  lua_createtable(L, 0, ES_RETAIN_KINDS);
  for (int k = 0; k < ES_RETAIN_KINDS; k++)
    es_lua_set_int(L, es_retain_kind_name(k), es_engine_retain_counted(e, k));
  lua_setfield(L, -2, "retention");
  lua_pushvalue(L, store);
  lua_setfield(L, -2, "store");
  return 1;
}

/* _stats_enabled(on): bench only (bench/README.md "Stats cost"): stops or
 * restarts counting, for the engine's types and its store's calls. */
static int l_engine_stats_enabled(lua_State *L) {
  es_engine *e = check_engine(L);
  luaL_checktype(L, 2, LUA_TBOOLEAN);
  es_type_stats_enable(es_engine_type_stats(e), lua_toboolean(L, 2));
  es_store_stats_enable(es_engine_store(e), lua_toboolean(L, 2));
  return 0;
}

/* _retain_count(kind): lua/eventstore/retention.lua counts one action
 * ("truncate", "archive", "delete", "failed") or sweep ("sweeps") of §3.9's
 * policies here, where stats() and /metrics read it. */
static int l_engine_retain_count(lua_State *L) {
  es_engine *e = check_engine(L);
  const char *kind = luaL_checkstring(L, 2);
  for (int k = 0; k < ES_RETAIN_KINDS; k++)
    if (strcmp(kind, es_retain_kind_name(k)) == 0) return es_engine_retain_count(e, k), 0;
  return luaL_argerror(L, 2, lua_pushfstring(L, "unknown retention count '%s'", kind));
}

static int l_engine_close(lua_State *L) {
  lengine *h = luaL_checkudata(L, 1, ENGINE_MT);
  if (h->running) /* from the progress function: the run ends first */
    return es_lua_raisef(L, ES_INVALID_ARGUMENT, "cannot close the engine while it runs (stop it first)");
  if (h->e) {
    es_engine_close(h->e);
    h->e = NULL;
  }
  return 0;
}

static int l_engine_gc(lua_State *L) {
  lengine *h = luaL_checkudata(L, 1, ENGINE_MT);
  if (h->e && !h->running) {
    es_engine_close(h->e);
    h->e = NULL;
  }
  return 0;
}

static const luaL_Reg engine_methods[] = {
    {"run", l_engine_run},
    {"stop", l_engine_stop},
    {"state", l_engine_state},
    {"append", l_engine_append},
    {"upcast", l_engine_upcast},
    {"has_handler", l_engine_has_handler},
    {"lease", l_engine_lease},
    {"truncate", l_engine_truncate},
    {"release", l_engine_release},
    {"stats", l_engine_stats},
    {"_stats_enabled", l_engine_stats_enabled},
    {"_retain_count", l_engine_retain_count},
    {"close", l_engine_close},
    {NULL, NULL},
};

void es_lua_push_engine_constructor(lua_State *L) {
  if (luaL_newmetatable(L, ENGINE_MT)) {
    lua_pushcfunction(L, l_engine_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, l_engine_close);
    lua_setfield(L, -2, "__close");
    luaL_newlib(L, engine_methods);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  lua_pushcfunction(L, l_engine_new);
}
