/*
 * bridge/json_lua.h: the Lua face of the exact payload codec (codec/json.h,
 * docs/contract.md §1): Lua values <-> the canonical text of the C face, and the
 * eventstore.json module table. The text rules are the codec's
 * (codec/json_scan.h); this face only maps Lua values onto them.
 */
#ifndef ES_BRIDGE_JSON_LUA_H
#define ES_BRIDGE_JSON_LUA_H

#include <lua.h>

#include "codec/json.h"
#include "util/buf.h"
#include "es.h"

/* Encodes the Lua value at stack index idx into canonical text appended to
 * out. nil and json.null encode as null; a table marked with the array
 * metatable (json.array, or any decoded array) or whose keys are exactly
 * 1..n (n >= 1) is an array; a table with only string keys (or empty and
 * unmarked) is an object. Functions, userdata (but null), threads, cycles,
 * NaN/inf, mixed or sparse keys and invalid UTF-8 are ES_INVALID_ARGUMENT
 * with a message naming the path, e.g. "payload.items[3]: ..." (1-based
 * Lua positions). `what` names the root of that path (e.g. "payload";
 * NULL: "value"). Marked arrays encode 1..n, n the largest key, holes as
 * null (refused when mostly holes); nesting deeper than ES_JSON_MAX_DEPTH
 * is ES_INVALID_ARGUMENT; ES_STORAGE when out runs out of memory;
 * ES_TOO_LARGE as soon as the text would take out past out->max (when
 * set: the limit is checked while writing, never after). On
 * failure out->len is as it was. Tables are read raw (no metamethods).
 * Never raises a Lua error (uses no allocating Lua call; a few stack slots
 * per nesting level, checked with lua_checkstack) and leaves the stack as
 * it found it. */
int es_json_encode_lua(lua_State *L, int idx, const char *what, es_buf *out, es_err *err);

/* Decodes text[0..len) and pushes the value (one slot). A top-level null
 * pushes nil; null inside arrays/objects is json.null; arrays get the array
 * metatable; objects are plain tables. On failure pushes nothing and
 * returns ES_INVALID_ARGUMENT (messages as es_json_validate) or ES_STORAGE
 * (Lua ran out of memory). Never raises: the work runs under lua_pcall. */
int es_json_decode_lua(lua_State *L, const char *text, size_t len, es_err *err);

/* The same decoder for callers that already run inside a protected call
 * and decode many texts in a row (the engine's fold): no lua_pcall per
 * text, and scratch buffers reused from one text to the next.
 * es_json_decoder_push pushes a userdata (one slot) that owns the scratch
 * space; the collector frees it, so an error in the middle of a decode
 * leaks nothing. Keep it on the stack while decoding with it.
 * es_json_decoder_decode pushes the value of text[0..len) exactly as
 * es_json_decode_lua would (same values, subtypes and array marks) or
 * raises: an eventstore error object (INVALID_ARGUMENT, the same message)
 * for bad text; Lua's own memory error when out of memory. While the
 * decoder is still at the stack index where it was pushed (in the same
 * lua_State), it also reuses the Lua strings of recent short keys and
 * values (a cache held by the userdata): the same values, without hashing
 * and interning each one again; elsewhere on the stack it decodes the
 * same, without the cache. It checks the stack room it needs (raising
 * Lua's stack error when there is none). */
typedef struct es_json_decoder es_json_decoder;
es_json_decoder *es_json_decoder_push(lua_State *L);
void es_json_decoder_decode(lua_State *L, es_json_decoder *jd, const char *text, size_t len);

/* Pushes the json.null sentinel (a light userdata, the same in every
 * lua_State of the process). */
void es_json_push_null(lua_State *L);
/* Whether the value at idx is json.null. */
int es_json_is_null(lua_State *L, int idx);

/* Pushes the module table {encode, decode, null, array, is_array}:
 * encode(v) -> text, decode(text) -> v raise an eventstore error object
 * ({code = "INVALID_ARGUMENT", message = ...}, built by es_lua_push_error)
 * on bad input; decode of a non-string and encode() without an argument
 * are standard argument errors. array(t) marks t (or a new table) and
 * returns it; is_array(v) says whether v carries the mark. Also creates
 * the array metatable in this lua_State, which es_json_encode_lua needs in
 * order to recognise marked tables. See docs/json.md. */
void es_json_push_module(lua_State *L);
#endif
