/*
 * lua/engine_handle.h: the engine's constructor for the module table
 * (lua/engine_handle.c; the Lua face is lua/eventstore/engine.lua).
 */
#ifndef ES_LUA_ENGINE_H
#define ES_LUA_ENGINE_H

#include <lua.h>

/* Pushes core.engine(store, opts) -> an eventstore.Engine handle with
 * run(opts), stop(), fold(session, reducer, at), has_handler(type), close(). */
void es_engine_push_constructor(lua_State *L);

#endif
