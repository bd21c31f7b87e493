/*
 * bridge/common.h: helpers shared by every Lua-facing C file (the bridge
 * itself, the engine, the module's handles, the binary's eventstore.http):
 * the eventstore error object, and pushing a buffer safely.
 *
 * An error object is a table {code = "CODE", message = "..."} whose
 * metatable ("eventstore.Error" in the registry) gives
 * tostring(e) == "CODE: message" (CONTRACT.md §2).
 */
#ifndef ES_LUA_COMMON_H
#define ES_LUA_COMMON_H

#include <lua.h>

#include "util/buf.h"
#include "es.h"

#define ES_LUA_ERROR_MT "eventstore.Error"

/* Pushes b's bytes as a Lua string. Runs the push under lua_pcall, so a
 * memory error cannot leak b: on one, b is destroyed and the error
 * re-raised; otherwise b is left to the caller (to reuse or destroy). */
void es_lua_push_buf(lua_State *L, es_buf *b);

/* Pushes a new error object (creating the metatable on first use). */
void es_lua_push_error(lua_State *L, int code, const char *message);
/* Raises err as an error object. Never returns. */
int es_lua_raise(lua_State *L, const es_err *err);
/* Raises a new error object with a formatted message. Never returns. */
int es_lua_raisef(lua_State *L, int code, const char *fmt, ...);

#endif
