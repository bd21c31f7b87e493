/*
 * module/store_handle.h: what other Lua-facing C files need of the store handle.
 */
#ifndef ES_LUA_STORE_H
#define ES_LUA_STORE_H

#include <lua.h>

#include "store/store.h"

/* The es_store behind the eventstore.Store at idx (borrowed: valid while
 * the handle is alive, i.e. until it is collected, so while it stays on
 * the stack; if Lua code closes the handle meanwhile, e.g. a metamethod of
 * an options table read later, it is a closed store whose calls fail with
 * CLOSED; es_store_retain it to keep it). Raises an argument error for
 * anything else and CLOSED for a closed handle. *lua_clock (if not NULL)
 * tells whether the store's clock is a Lua function, which only the
 * opening thread may call. */
es_store *es_lua_check_store(lua_State *L, int idx, int *lua_clock);

/* Pushes the module table of the store's Lua face (open, manual_clock,
 * json, state, store_methods, error_mt, _VERSION); module/module.c's
 * luaopen_eventstore_core adds the engine. */
int es_lua_open_store(lua_State *L);

/* §3.12: pushes store:stats()'s table for s ({calls = {[op] = {count,
 * errors, p50_us, p99_us, max_us}}, sessions, events, pending, dead}), or
 * returns the error of reading the counts (nothing pushed). */
int es_lua_push_stats(lua_State *L, es_store *s, es_err *err);

#endif
