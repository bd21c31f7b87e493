/*
 * fold.c: the reducer fold with snapshots (docs/contract.md §4, docs/engine.md)
 * and a handler's ctx. Both run in one of the engine's own Lua states,
 * inside a budgeted call; each reducer step is a budgeted call of its own.
 */
#include <lauxlib.h>
#include <lua.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bridge/state.h"
#include "engine/internal.h"
#include "bridge/common.h"
#include "bridge/events.h"

/* C-owned event lists held by a box (bridge/common.h), so a Lua error in
 * a reducer step never leaks them. */
typedef struct box {
  es_events events;
  es_snapshot snap;
} box;

static void box_release(void *p) {
  box *x = p;
  es_events_destroy(&x->events);
  es_snapshot_destroy(&x->snap);
}

static box *push_box(lua_State *L) {
  box *x = es_lua_push_box(L, sizeof *x, 0, box_release);
  es_snapshot_init(&x->snap);
  return x;
}

/* Store calls are the engine's own C code: the watchdog must not take the
 * time they take (a long read, a lock wait) for a stuck script. */
#define TRUSTED(r, call)                                                                          \
  do {                                                                                            \
    atomic_fetch_add(&(r)->b.trusted, 1);                                                         \
    rc = (call);                                                                                  \
    atomic_fetch_sub(&(r)->b.trusted, 1);                                                         \
  } while (0)

/* engine:truncate's state of a reducer at the cut, kept under a name of
 * its own ("<reducer>@truncated"): the reducer's one snapshot moves on
 * (and a newer one of another version may outrank it), but a fold below
 * it (ctx.state of a pending event past the cut, engine:state{at}) can
 * still start there instead of at the dropped events. 0 when the name
 * would not be a name (a reducer name over 245 bytes). */
static int floor_name(char *out, size_t cap, const char *reducer) {
  int n = snprintf(out, cap, "%s@truncated", reducer);
  return n > 0 && (size_t)n < cap && n <= ES_MAX_ID_BYTES;
}

/* Starts the fold from the truncation snapshot when it is of this version
 * and at or below `at`: x->events become the events after it. Returns
 * whether it did (the state is then on the stack). */
static int fold_from_floor(lua_State *L, runner *r, const char *session, const char *reducer,
                           const char *version, int64_t at, box *x, int64_t *from) {
  char name[ES_MAX_ID_BYTES + 16];
  if (!floor_name(name, sizeof name, reducer)) return 0;
  es_snapshot snap;
  es_events events = {0};
  es_err err = {0};
  int found = 0, rc, used = 0;
  /* Most sessions were never truncated: look for the floor in the list of
   * snapshots (names, indexes and versions only) before reading it, as
   * reading a snapshot that does not exist returns the whole history. */
  es_snapshots list = {0};
  TRUSTED(r, es_store_snapshots(r->e->s, session, &list, &err));
  for (size_t i = 0; rc == ES_OK && i < list.n; i++)
    if (list.v[i].reducer && strcmp(list.v[i].reducer, name) == 0 && list.v[i].index <= at &&
        strcmp(list.v[i].version ? list.v[i].version : "", version) == 0)
      found = 1;
  es_snapshots_destroy(&list);
  if (!found) return 0;
  TRUSTED(r, es_store_read_state(r->e->s, session, name, &found, &snap, &events, &err));
  if (rc == ES_OK && found && snap.index <= at &&
      strcmp(snap.version ? snap.version : "", version) == 0 &&
      es_state_decode(L, snap.state, snap.state_len, &err) == ES_OK) {
    es_events_destroy(&x->events);
    x->events = events;
    memset(&events, 0, sizeof events);
    *from = snap.index;
    used = 1;
  }
  es_snapshot_destroy(&snap);
  es_events_destroy(&events);
  return used;
}

/* A reducer step gets the stored event exactly as store:read returns it
 * (spec/48 compares the two): the fold builds its tables with the event
 * list builder (es_lua_pusher, bridge/events.h), one per event of a long
 * history in a row. */

void es_fold(lua_State *L, runner *r, const char *session, const char *reducer, int64_t at,
             es_buf *encoded, int64_t *through, int force) {
  es_engine *e = r->e;
  es_err err = {0};
  int rc;
  es_loader_call(L, "reducer", reducer);
  if (!lua_isnil(L, -2)) es_lua_raisef(L, ES_INVALID_ARGUMENT, "%s", lua_tostring(L, -2));
  if (lua_isnil(L, -3))
    es_lua_raisef(L, ES_NOT_FOUND, "no reducer '%s' in %s/reducers", reducer, e->scripts);
  const char *version = lua_tostring(L, -1);
  lua_pop(L, 2);
  int mod = lua_gettop(L);
  /* §7: the version covers the upcasters too, every file of them: a step
   * may rename a type into one the reducer handles, which only running it
   * tells. Without upcaster files it is the reducer's hash alone. */
  es_upcast_push_version(L, r);
  if (lua_rawlen(L, -1) > 0) lua_pushfstring(L, "%s+%s", version, lua_tostring(L, -1));
  else lua_pushstring(L, version);
  lua_remove(L, -2);
  version = lua_tostring(L, -1);
  int ver = lua_gettop(L);

  int64_t head;
  TRUSTED(r, es_store_head(e->s, session, &head, &err));
  if (rc) es_lua_raise(L, &err);
  if (at == ES_NONE) at = head;
  if (at < 0) es_lua_raisef(L, ES_INVALID_ARGUMENT, "at must be >= 0");
  if (through) *through = at;
  if (at > head)
    es_lua_raisef(L, ES_NO_SUCH_EVENT, "no event at index %lld in session '%s' (head %lld)",
                  (long long)at, session, (long long)head);

  box *x = push_box(L);
  int found = 0;
  TRUSTED(r, es_store_read_state(e->s, session, reducer, &found, &x->snap, &x->events, &err));
  if (rc) es_lua_raise(L, &err);
  int stale = found && strcmp(x->snap.version ? x->snap.version : "", version) != 0;
  int64_t from = 0;
  int have_state = 0;
  if (found && !stale && x->snap.index <= at) {
    /* A snapshot that does not decode is a bad cache entry: refold. */
    if (es_state_decode(L, x->snap.state, x->snap.state_len, &err) == ES_OK) {
      from = x->snap.index;
      have_state = 1;
    }
  }
  if (!have_state) have_state = fold_from_floor(L, r, session, reducer, version, at, x, &from);
  if (!have_state) {
    if (found) {
      es_events_destroy(&x->events);
      TRUSTED(r, es_store_read(e->s, session, 0, at, ES_NONE, &x->events, &err));
      if (rc) es_lua_raise(L, &err);
    }
    lua_getfield(L, mod, "init");
    if (lua_isfunction(L, -1)) {
      if (es_budget_pcall(L, 0, 1) != LUA_OK)
        es_lua_raisef(L, ES_INVALID_ARGUMENT, "reducer '%s' init: %s", reducer, lua_tostring(L, -1));
    } else {
      lua_pop(L, 1);
      lua_newtable(L);
    }
  }
  int st = lua_gettop(L);
  es_lua_pusher b;
  int have_b = 0; /* the builder is set up at the first event to fold: a call at the head needs none */
  int64_t folded = 0;
  for (size_t i = 0; i < x->events.n; i++) {
    const es_event *ev = &x->events.v[i];
    if (ev->index <= from) continue;
    if (ev->index > at) break;
    folded++;
    if (!have_b) {
      es_lua_pusher_begin(L, &b);
      have_b = 1;
    }
    if (es_upcast_has(r, ev->type)) { /* §7: the step of its upcast type, given the upcast event */
      es_lua_pusher_push(&b, ev);
      es_upcast_event(L, r, -1);
      lua_getfield(L, -1, "type");
      lua_gettable(L, mod);
      if (!lua_isfunction(L, -1)) {
        lua_pop(L, 2);
        continue;
      }
      lua_insert(L, -2);
      lua_pushvalue(L, st);
      lua_insert(L, -2);
    } else {
      es_lua_pusher_push_text(&b, ev->type, ES_PUSHER_TYPE);
      lua_gettable(L, mod);
      if (!lua_isfunction(L, -1)) {
        lua_pop(L, 1);
        continue;
      }
      lua_pushvalue(L, st);
      es_lua_pusher_push(&b, ev);
    }
    if (es_budget_pcall(L, 2, 1) != LUA_OK)
      es_lua_raisef(L, ES_INVALID_ARGUMENT, "reducer '%s' at %s #%lld (%s): %s", reducer, session,
                    (long long)ev->index, ev->type, lua_tostring(L, -1));
    if (lua_isnil(L, -1)) lua_pop(L, 1); /* changed in place */
    else lua_replace(L, st);
  }
  lua_settop(L, st); /* the builder's slots */
  es_box_release_now(x); /* the events are folded: free them now, not at the next collection */
  if (e->o.snapshot_every > 0 || force) {
    /* With snapshots on, an unserialisable state is an error even before
     * the first snapshot is due, so it shows up on the first fold. */
    es_buf own, *buf = encoded ? encoded : &own;
    es_buf_init(&own);
    size_t mark = buf->len;
    char what[300];
    snprintf(what, sizeof what, "state of reducer '%s'", reducer);
    rc = es_state_encode(L, st, what, buf, &err);
    int stored = 0;
    if (rc == ES_OK && (force || folded >= e->o.snapshot_every || stale) && at > 0)
      TRUSTED(r, es_store_put_snapshot(e->s, session, reducer, at, buf->data ? buf->data + mark : "",
                                       buf->len - mark, lua_tostring(L, ver), &stored, &err));
    char floor[ES_MAX_ID_BYTES + 16];
    if (rc == ES_OK && force && at > 0 && floor_name(floor, sizeof floor, reducer))
      TRUSTED(r, es_store_put_snapshot(e->s, session, floor, at, buf->data ? buf->data + mark : "",
                                       buf->len - mark, lua_tostring(L, ver), &stored, &err));
    es_buf_destroy(&own);
    if (rc) es_lua_raise(L, &err);
  }
  lua_replace(L, mod); /* the state where the module was */
  lua_settop(L, mod);
}

/* ctx.now() */
static int ctx_now(lua_State *L) {
  runner *r = lua_touserdata(L, lua_upvalueindex(1));
  int64_t now;
  es_err err = {0};
  int rc;
  TRUSTED(r, es_store_now(r->e->s, &now, &err));
  if (rc) es_lua_raise(L, &err);
  lua_pushinteger(L, now);
  return 1;
}

/* ctx.state(reducer): the session's state before the handled event. */
static int ctx_state(lua_State *L) {
  runner *r = lua_touserdata(L, lua_upvalueindex(1));
  const char *reducer = es_lua_check_name(L, 1, "reducer");
  es_fold(L, r, lua_tostring(L, lua_upvalueindex(2)), reducer,
          lua_tointeger(L, lua_upvalueindex(3)) - 1, NULL, NULL, 0);
  return 1;
}

/* ctx.log(...): one line on stderr naming the event (session, index and
 * type are upvalues: the prefix is formatted only when something is
 * logged, not for every ctx). */
static int ctx_log(lua_State *L) {
  int n = lua_gettop(L);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  lua_pushfstring(L, "[%s #%I %s]", lua_tostring(L, lua_upvalueindex(1)),
                  (lua_Integer)lua_tointeger(L, lua_upvalueindex(2)),
                  lua_tostring(L, lua_upvalueindex(3)));
  luaL_addvalue(&b);
  for (int i = 1; i <= n; i++) {
    luaL_addchar(&b, i == 1 ? ' ' : '\t');
    luaL_tolstring(L, i, NULL);
    luaL_addvalue(&b);
  }
  luaL_pushresult(&b);
  fprintf(stderr, "%s\n", lua_tostring(L, -1));
  return 0;
}

/* ctx.log in a quiet engine (es_engine_opts.quiet). */
static int ctx_log_quiet(lua_State *L) {
  (void)L;
  return 0;
}

/* ctx.cancel(index, reason): §3.2 cancel of an event of this session,
 * applied with the completion (complete{cancel}); the upvalue is the list
 * of {index, reason} the engine reads after the handler returned, made by
 * the first cancel (nil until then: most handlers never cancel, and a
 * table per call was an allocation per event; a C closure's upvalue is
 * out of a script's reach, so nothing else can tell). */
static int ctx_cancel(lua_State *L) {
  lua_Integer index = luaL_checkinteger(L, 1);
  if (index < 1) luaL_argerror(L, 1, "an event index (>= 1)");
  const char *reason = luaL_optstring(L, 2, NULL);
  if (lua_type(L, lua_upvalueindex(1)) != LUA_TTABLE) {
    lua_newtable(L);
    lua_replace(L, lua_upvalueindex(1));
  }
  lua_Integer n = (lua_Integer)lua_rawlen(L, lua_upvalueindex(1));
  if (n >= 10000) return luaL_error(L, "ctx.cancel: at most 10000 cancels per handler call");
  lua_createtable(L, 2, 0);
  lua_pushinteger(L, index);
  lua_rawseti(L, -2, 1);
  if (reason) {
    lua_pushstring(L, reason);
    lua_rawseti(L, -2, 2);
  }
  lua_rawseti(L, lua_upvalueindex(1), n + 1);
  return 0;
}

void es_ctx_cancels(lua_State *L, int idx, job *j) {
  idx = lua_absindex(L, idx);
  int top = lua_gettop(L);
  if (lua_getfield(L, idx, "cancel") != LUA_TFUNCTION || lua_tocfunction(L, -1) != ctx_cancel ||
      !lua_getupvalue(L, -1, 1) || lua_type(L, -1) != LUA_TTABLE) { /* nil: no cancel */
    lua_settop(L, top);
    return;
  }
  int list = lua_gettop(L);
  size_t k = (size_t)lua_rawlen(L, list), room = k * sizeof(es_cancel);
  for (size_t i = 0; i < k; i++) {
    lua_rawgeti(L, list, (lua_Integer)i + 1);
    lua_rawgeti(L, -1, 2);
    if (lua_type(L, -1) == LUA_TSTRING) room += lua_rawlen(L, -1) + 1;
    lua_pop(L, 2);
  }
  es_cancel *v = k ? malloc(room) : NULL;
  char *at = v ? (char *)(v + k) : NULL;
  for (size_t i = 0; v && i < k; i++) {
    lua_rawgeti(L, list, (lua_Integer)i + 1);
    lua_rawgeti(L, -1, 1);
    lua_rawgeti(L, -2, 2);
    v[i].index = lua_tointeger(L, -2);
    v[i].reason = NULL;
    v[i].cancelled = 0;
    if (lua_type(L, -1) == LUA_TSTRING) {
      size_t len;
      const char *r = lua_tolstring(L, -1, &len);
      memcpy(at, r, len + 1);
      v[i].reason = at;
      at += len + 1;
    }
    lua_pop(L, 3);
  }
  j->cancel = v;
  j->n_cancel = v ? k : 0;
  lua_settop(L, top);
}

static const char ctx_now_key = 'n'; /* registry: this state's ctx.now (its runner's) */
static const char ctx_keys_key = 'k'; /* registry: the ctx field names (K_*) */

/* The ctx field names, made into Lua strings once per state: a field is
 * then set with lua_rawset (the ctx is a new table of ours, with no
 * metatable: what lua_setfield did, without looking the C string up in
 * Lua's string cache and taking the metamethod-aware path each time). */
enum { K_SESSION = 1, K_ATTEMPT, K_INDEX, K_NOW, K_STATE, K_LOG, K_RANDOM, K_CANCEL, K_META, K_COUNT };
static const char *const ctx_keys[K_COUNT] = {NULL,  "session", "attempt", "index", "now",
                                              "state", "log",     "random", "cancel", "meta"};

/* ctx[k] = the value on top (popped); keys is the names array's index. */
static void ctx_set(lua_State *L, int ctx, int keys, int k) {
  lua_rawgeti(L, keys, k);
  lua_insert(L, -2);
  lua_rawset(L, ctx);
}

void es_push_ctx(lua_State *L, runner *r, const es_event *ev) {
  /* The 8 fields below. `meta` (run_job) makes it 16 slots when the event
   * has one; made with 16 from the start, the same keys would sit in
   * another order, which pairs(ctx) would show: kept as it always was. */
  lua_createtable(L, 0, K_COUNT - 2);
  int ctx = lua_gettop(L);
  es_lua_push_names(L, &ctx_keys_key, ctx_keys, K_COUNT);
  int keys = lua_gettop(L);
  lua_pushstring(L, ev->session); /* interned once, shared by the fields below */
  int session = lua_gettop(L);
  lua_pushvalue(L, session);
  ctx_set(L, ctx, keys, K_SESSION);
  lua_pushinteger(L, ev->attempts);
  ctx_set(L, ctx, keys, K_ATTEMPT);
  lua_pushinteger(L, ev->index);
  ctx_set(L, ctx, keys, K_INDEX);
  /* A state belongs to one runner: its now() is made once. */
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &ctx_now_key) != LUA_TFUNCTION) {
    lua_pop(L, 1);
    lua_pushlightuserdata(L, r);
    lua_pushcclosure(L, ctx_now, 1);
    lua_pushvalue(L, -1);
    lua_rawsetp(L, LUA_REGISTRYINDEX, &ctx_now_key);
  }
  ctx_set(L, ctx, keys, K_NOW);
  lua_pushlightuserdata(L, r);
  lua_pushvalue(L, session);
  lua_pushinteger(L, ev->index);
  lua_pushcclosure(L, ctx_state, 3);
  ctx_set(L, ctx, keys, K_STATE);
  if (r->e->o.quiet) {
    lua_pushcfunction(L, ctx_log_quiet); /* a replay's handlers log nothing */
  } else {
    lua_pushvalue(L, session);
    lua_pushinteger(L, ev->index);
    lua_pushstring(L, ev->type);
    lua_pushcclosure(L, ctx_log, 3);
  }
  ctx_set(L, ctx, keys, K_LOG);
  es_determinism_push_random(L);
  ctx_set(L, ctx, keys, K_RANDOM);
  lua_pushnil(L); /* the cancels this call asks for: made by the first */
  lua_pushcclosure(L, ctx_cancel, 1);
  ctx_set(L, ctx, keys, K_CANCEL);
  lua_settop(L, ctx); /* the names and the session string go */
}

void es_ctx_set_meta(lua_State *L, int ctx) {
  ctx = lua_absindex(L, ctx);
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &ctx_keys_key) != LUA_TTABLE) { /* es_push_ctx made it */
    lua_pop(L, 1);
    lua_setfield(L, ctx, "meta");
    return;
  }
  lua_rawgeti(L, -1, K_META);
  lua_replace(L, -2);
  lua_insert(L, -2);
  lua_rawset(L, ctx);
}
