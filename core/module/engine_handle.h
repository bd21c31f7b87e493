/*
 * module/engine_handle.h: the engine's Lua handle (engine_handle.c); the Lua
 * face around it is lua/eventstore/engine.lua.
 */
#ifndef ES_LUA_ENGINE_HANDLE_H
#define ES_LUA_ENGINE_HANDLE_H

#include <lua.h>

#include "engine/engine.h"

/* Pushes core.engine(store, opts) -> an eventstore.Engine handle with
 * run(opts), stop(), state(session, reducer, at), append(session, events,
 * opts), has_handler(type), close(); registers the handle's metatable. */
void es_lua_push_engine_constructor(lua_State *L);

/* The es_engine behind the eventstore.Engine handle at idx (borrowed:
 * valid while the handle is open; es_http keeps a reference to the handle
 * for that). Raises an argument error for anything else and CLOSED for a
 * closed handle. */
es_engine *es_lua_check_engine(lua_State *L, int idx);

#endif
