/*
 * bridge/common.h: helpers shared by every Lua-facing C file (the bridge
 * itself, the engine, the module's handles, the binary's eventstore.http):
 * the eventstore error object, pushing a buffer safely, and boxes.
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
/* Pushes the array {names[1], ..., names[n - 1]} of Lua strings, made
 * once per lua_State and kept in the registry under key (its address):
 * a field set or read with a name from it (lua_rawgeti, then
 * lua_rawset/lua_rawget) skips interning the C string each time. May
 * raise (out of memory). */
void es_lua_push_names(lua_State *L, const void *key, const char *const *names, int n);

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

/* A box: C-owned memory (an event list, a buffer) held by a userdata, so
 * that a Lua error raised while the C code holds it cannot strand it.
 * release(box) runs once: from es_box_release_now (the holder is done with
 * it), from the userdata's __gc, or, in a state with a box tracker, when
 * the userdata's memory is freed although its finalizer never ran. That
 * last way matters in the engine's budgeted states: a finalizer is a call,
 * a call may need memory (a CallInfo, stack room), a tripped or exhausted
 * budget refuses it, and Lua then drops the finalizer without a word and
 * frees the userdata anyway. The box starts zeroed; nuv: its user values. */
typedef void (*es_box_release)(void *box);
void *es_lua_push_box(lua_State *L, size_t size, int nuv, es_box_release release);
/* Runs a box's release now if it has not run yet (idempotent). */
void es_box_release_now(void *box);

/* The boxes of one state not released yet. A state whose allocator can
 * refuse a finalizer's call (engine/budget.c) sets one up with
 * es_lua_set_box_tracker; its allocator calls es_box_tracker_freeing for
 * every block it frees, and es_box_tracker_destroy after lua_close. */
typedef struct es_box_tracker {
  void **boxes;
  size_t n, cap;
} es_box_tracker;
void es_lua_set_box_tracker(lua_State *L, es_box_tracker *t);
/* Releases the boxes inside the block [block, block + len). */
void es_box_tracker_freeing(es_box_tracker *t, const void *block, size_t len);
void es_box_tracker_destroy(es_box_tracker *t);

#endif
