/*
 * module/module.h: the eventstore.core module's one export (module.c). Lua
 * finds it by name in core.so; the binary, and the engine's own Lua states
 * (through es_engine_opts.open_core, set by the engine handle), which link
 * the library statically, put it in package.preload.
 */
#ifndef ES_LUA_MODULE_H
#define ES_LUA_MODULE_H

#include <lua.h>

/* require "eventstore.core": the store's Lua face and the engine's. */
int luaopen_eventstore_core(lua_State *L);

#endif
