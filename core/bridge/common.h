/*
 * bridge/common.h: helpers shared by every Lua-facing C file (the bridge
 * itself, the engine, the module's handles, the binary's eventstore.http):
 * the eventstore error object, and pushing a buffer safely.
 *
 * An error object is a table {code = "CODE", message = "..."} whose
 * metatable ("eventstore.Error" in the registry) gives
 * tostring(e) == "CODE: message" (docs/contract.md §2).
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

/* The two directions of a bridge codec (es_json_encode_lua and
 * es_json_decode_lua, es_state_encode and es_state_decode): neither
 * raises; both return ES_OK or a code with err set. */
typedef int (*es_lua_encoder)(lua_State *L, int idx, const char *what, es_buf *out, es_err *err);
typedef int (*es_lua_decoder)(lua_State *L, const char *data, size_t len, es_err *err);

/* The bodies of a codec module's encode and decode (json.encode,
 * state.encode, ...), so each codec's Lua functions behave alike.
 * es_lua_encode_arg encodes argument 1 with enc (what: the root of the
 * paths in its messages, borrowed) and pushes the text; es_lua_decode_arg
 * decodes argument 1, which must be a string (strict: a number is not
 * text, even though Lua could coerce it), and pushes the value. Both
 * return 1, or raise err as an error object (memory freed first). */
int es_lua_encode_arg(lua_State *L, es_lua_encoder enc, const char *what);
int es_lua_decode_arg(lua_State *L, es_lua_decoder dec);

#endif
