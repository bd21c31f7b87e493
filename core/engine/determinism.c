/*
 * determinism.c: deterministic scripts (docs/contract.md §4). Inside the
 * engine's Lua states the usual sources of nondeterminism answer from the
 * handled event instead of the machine, so that the same events give the
 * same results in two live runs and in a replay (§9, docs/replay.md):
 *
 * - math.random (and ctx.random, the same generator) is reseeded for
 *   each handler call from the event's id and attempt: a retry draws other
 *   numbers than the attempt that failed, as a real retry would. The seed
 *   is applied at the first draw after it was set (most handlers draw
 *   nothing, and a seeding is a Lua call): no script can see the
 *   generator but by drawing, so the draws are those of a seeding before
 *   the call. math.randomseed, called by a script, replaces a seed not yet
 *   applied.
 * - os.time() is ctx.now() // 1000 and os.clock() ctx.now() / 1000, both on
 *   the store's clock (a manual clock in a replay). os.time(table) keeps
 *   its meaning (a date table to seconds: no clock involved).
 *
 * The generator's functions are kept as the state was made (the upvalues
 * of ours that wrap them; ctx.random is ours from the registry), so a
 * script that replaces math.random or math.randomseed cannot make another
 * event's draws depend on it.
 */
#include <lauxlib.h>
#include <lua.h>
#include <stdint.h>
#include <string.h>

#include "engine/internal.h"

static const char random_key = 'r'; /* registry: the state's math.random (ours, below) */

/* The store's clock, as ctx.now() reads it (trusted: not charged to the
 * script's budget). */
static int64_t store_now(lua_State *L, runner *r) {
  int64_t now;
  es_err err = {0};
  atomic_fetch_add(&r->b.trusted, 1);
  int rc = es_store_now(r->e->s, &now, &err);
  atomic_fetch_sub(&r->b.trusted, 1);
  if (rc) es_lua_raise(L, &err);
  return now;
}

static int os_time(lua_State *L) {
  if (!lua_isnoneornil(L, 1)) { /* a date table: the library's own conversion */
    lua_pushvalue(L, lua_upvalueindex(2));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
  }
  int64_t now = store_now(L, lua_touserdata(L, lua_upvalueindex(1)));
  lua_pushinteger(L, now >= 0 ? now / 1000 : -((-now + 999) / 1000)); /* floor division */
  return 1;
}

static int os_clock(lua_State *L) {
  lua_pushnumber(L, (lua_Number)store_now(L, lua_touserdata(L, lua_upvalueindex(1))) / 1000.0);
  return 1;
}

/* Applies r's seed if one is due. Upvalue 2: the library's randomseed. */
static void seed_if_due(lua_State *L, runner *r) {
  if (!r->seed_due) return;
  r->seed_due = 0;
  lua_pushvalue(L, lua_upvalueindex(2));
  lua_pushinteger(L, r->seed_hash);
  lua_pushinteger(L, r->seed_attempt);
  lua_call(L, 2, 0);
}

/* math.random: the library's (upvalue 3), drawn after the seed due. */
static int lazy_random(lua_State *L) {
  seed_if_due(L, lua_touserdata(L, lua_upvalueindex(1)));
  lua_pushvalue(L, lua_upvalueindex(3));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}

/* math.randomseed: the script's seed replaces one not yet applied. */
static int lazy_randomseed(lua_State *L) {
  runner *r = lua_touserdata(L, lua_upvalueindex(1));
  r->seed_due = 0;
  lua_pushvalue(L, lua_upvalueindex(2));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}

void es_determinism_setup(lua_State *L, runner *r) {
  r->seed_due = 0;
  lua_getglobal(L, "math");
  int math = lua_gettop(L);
  for (int i = 0; i < 2; i++) { /* upvalues: r, randomseed, random */
    lua_pushlightuserdata(L, r);
    lua_getfield(L, math, "randomseed");
    lua_getfield(L, math, "random");
    lua_pushcclosure(L, i ? lazy_randomseed : lazy_random, 3);
  }
  lua_setfield(L, math, "randomseed");
  lua_pushvalue(L, -1);
  lua_setfield(L, math, "random");
  lua_rawsetp(L, LUA_REGISTRYINDEX, &random_key);
  lua_pop(L, 1);
  lua_getglobal(L, "os");
  lua_pushlightuserdata(L, r);
  lua_getfield(L, -2, "time");
  lua_pushcclosure(L, os_time, 2);
  lua_setfield(L, -2, "time");
  lua_pushlightuserdata(L, r);
  lua_pushcclosure(L, os_clock, 1);
  lua_setfield(L, -2, "clock");
  lua_pop(L, 1);
}

uint64_t es_fnv1a(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

void es_determinism_seed(runner *r, const es_event *ev) {
  /* The id's hash: ids are unique in a store and kept by a replay's
   * inputs (docs/replay.md), so the seed is the event's own. */
  r->seed_hash = (lua_Integer)es_fnv1a(ES_FNV_BASIS, ev->id, ev->id ? strlen(ev->id) : 0);
  r->seed_attempt = ev->attempts;
  r->seed_due = 1;
}

void es_determinism_push_random(lua_State *L) {
  lua_rawgetp(L, LUA_REGISTRYINDEX, &random_key);
}
