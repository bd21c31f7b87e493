/*
 * main/lua_http.h: the Lua module `eventstore.http` (lua_http.c), which
 * core/main/main.c registers in package.preload; only the binary links it.
 */
#ifndef ES_HTTP_LUA_HTTP_H
#define ES_HTTP_LUA_HTTP_H

#include <lua.h>

/* Pushes the module table (start, hash_token, new_token, default_static). */
int luaopen_eventstore_http(lua_State *L);

#endif
