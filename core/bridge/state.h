/*
 * bridge/state.h: the exact reducer-state codec (docs/contract.md §4, docs/state-codec.md).
 *
 * A reducer builds its state as an arbitrary Lua value; snapshots cache it
 * as bytes and the engine restores it later, possibly into another
 * lua_State. This codec makes that round trip exact, which JSON cannot:
 * integer vs float subtype (math.type), NaN, infinities and -0.0 bit for
 * bit, strings with any bytes, tables with integer, float, string, boolean
 * (and json.null) keys, the json.null sentinel and the json array mark.
 *
 * The bytes are a compact, versioned binary format (first byte
 * ES_STATE_FORMAT_VERSION). The encoding is canonical: one value has exactly
 * one encoding (table keys sorted), and the decoder accepts only canonical
 * bytes, so decode followed by encode gives back the input byte for byte.
 *
 * Everything else (functions, userdata, threads, light userdata other than
 * json.null, tables with a metatable other than the array mark, table keys
 * that are tables, cycles, nesting deeper than ES_STATE_MAX_DEPTH) is
 * refused with ES_INVALID_ARGUMENT naming the path of the offending value,
 * e.g. "state.items[3].cb: cannot encode a function".
 *
 * A table reachable twice without a cycle (shared, not recursive) is
 * encoded twice and decodes as two distinct, equal tables: sharing is not
 * preserved.
 */
#ifndef ES_LUA_STATE_H
#define ES_LUA_STATE_H

#include <lua.h>

#include "util/buf.h"
#include "es.h"

/* The first byte of every encoding. A decoder refuses other versions. */
#define ES_STATE_FORMAT_VERSION 1

/* How many tables may be nested (the root table counts as one). Both
 * directions use the same limit, so whatever encodes also decodes. */
#define ES_STATE_MAX_DEPTH 200

/* Encodes the Lua value at stack index idx (borrowed, not modified) and
 * appends its bytes to out (the caller's buffer; on failure out is left as
 * it was). `what` names the root of the paths in error messages (e.g.
 * "state", or "state of reducer 'cart'"); NULL means "state".
 *
 * Returns ES_OK, ES_INVALID_ARGUMENT (a value that cannot be encoded; err
 * names its path and why) or ES_STORAGE (out of memory). Never raises a
 * Lua error and leaves the Lua stack as it found it; it may create the json
 * array metatable in L's registry if it does not exist yet. */
int es_state_encode(lua_State *L, int idx, const char *what, es_buf *out, es_err *err);

/* Decodes data[0..len) (borrowed) and pushes the value: exactly one slot
 * on success (nil when the encoded value is nil), nothing on failure.
 *
 * Returns ES_OK, ES_INVALID_ARGUMENT (bytes that are not one canonical
 * encoding of this version: truncated, bad tag, trailing bytes, too deep,
 * ...; err says what and at which byte) or ES_STORAGE (Lua ran out of
 * memory). Never raises a Lua error; safe on any bytes: it allocates in
 * proportion to len at most. */
int es_state_decode(lua_State *L, const char *data, size_t len, es_err *err);

/* Pushes the module table {encode = f, decode = f} (the lead exposes it as
 * require("eventstore").state):
 *   encode(value [, what]) -> bytes   (what defaults to "state")
 *   decode(bytes) -> value
 * Both raise an eventstore error object ({code = "INVALID_ARGUMENT" or
 * "STORAGE", message = ...}) on failure. May raise (memory) while pushing. */
void es_state_push_module(lua_State *L);

#endif
