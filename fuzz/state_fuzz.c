/*
 * state_fuzz.c: a libFuzzer target for the reducer-state codec
 * (bridge/state.h, docs/state-codec.md). Built and run by `make fuzz`
 * (clang -fsanitize=fuzzer,address,undefined); see fuzz/README.md.
 *
 * For every input it checks what must hold whatever the bytes are:
 *   - es_state_decode either pushes exactly one value and returns ES_OK, or
 *     pushes nothing and returns ES_INVALID_ARGUMENT with a message that
 *     names a byte offset inside the input (ES_STORAGE is not expected:
 *     the decoder allocates in proportion to the input);
 *   - the format is canonical: an accepted input re-encodes (es_state_encode)
 *     to exactly the input, and that re-encoding decodes and re-encodes to
 *     itself again (decode(encode(x)) == x, byte for byte);
 *   - a second decode into a fresh lua_State gives the same bytes too (the
 *     encoding does not depend on the state it was made in);
 *   - the encoder never refuses a decoded value, and never leaves anything
 *     on the Lua stack;
 *   - and, from the sanitizers: no memory error, no undefined behaviour, no
 *     leak.
 * A broken invariant aborts, which libFuzzer reports with the input.
 */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/json.h"
#include "bridge/json_lua.h"
#include "bridge/state.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Two Lua states for the whole run (creating them per input would dominate
 * the time), emptied and collected between inputs. */
static lua_State *L, *L2;
static unsigned long runs;

#define CHECK(cond, ...)                                  \
  do {                                                    \
    if (!(cond)) {                                        \
      fprintf(stderr, "state_fuzz: %s failed: ", #cond); \
      fprintf(stderr, __VA_ARGS__);                       \
      fprintf(stderr, "\n");                              \
      abort();                                            \
    }                                                     \
  } while (0)

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  L = luaL_newstate();
  L2 = luaL_newstate();
  if (!L || !L2) abort();
  /* As require("eventstore") would: registers the array metatable. */
  es_json_push_module(L);
  lua_pop(L, 1);
  return 0;
}

/* Encodes the value on top of S (left there) into out; must succeed. */
static void encode_top(lua_State *S, es_buf *out) {
  es_err err;
  int top = lua_gettop(S), rc;
  es_buf_init(out);
  rc = es_state_encode(S, -1, "state", out, &err);
  CHECK(rc == ES_OK, "re-encoding a decoded value failed: %s", err.msg);
  CHECK(lua_gettop(S) == top, "the encoder left %d slots", lua_gettop(S) - top);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  es_err err;
  es_buf e1, e2, e3;
  int rc, top = lua_gettop(L);
  const char *in = (const char *)data;

  rc = es_state_decode(L, in, size, &err);
  if (rc != ES_OK) {
    size_t at;
    CHECK(rc == ES_INVALID_ARGUMENT, "decode returned %d: %s", rc, err.msg);
    CHECK(lua_gettop(L) == top, "a failed decode left %d slots", lua_gettop(L) - top);
    CHECK(sscanf(err.msg, "invalid state encoding at byte %zu:", &at) == 1 && at <= size, "bad message: %s",
          err.msg);
    goto done;
  }
  CHECK(lua_gettop(L) == top + 1, "decode pushed %d slots", lua_gettop(L) - top);

  /* Canonical: the input is the encoding of what it decodes to. */
  encode_top(L, &e1);
  CHECK(e1.len == size && memcmp(e1.data, in, size) == 0, "re-encoding differs from the input (%zu vs %zu bytes)",
        e1.len, size);

  /* decode(encode(x)) re-encodes byte for byte, here and in another state. */
  rc = es_state_decode(L, e1.data, e1.len, &err);
  CHECK(rc == ES_OK, "the re-encoding does not decode: %s", err.msg);
  encode_top(L, &e2);
  CHECK(e2.len == e1.len && memcmp(e2.data, e1.data, e1.len) == 0, "second round trip differs");
  rc = es_state_decode(L2, e1.data, e1.len, &err);
  CHECK(rc == ES_OK, "another lua_State does not decode it: %s", err.msg);
  encode_top(L2, &e3);
  CHECK(e3.len == e1.len && memcmp(e3.data, e1.data, e1.len) == 0, "round trip through another state differs");
  lua_settop(L2, 0);
  es_buf_destroy(&e1);
  es_buf_destroy(&e2);
  es_buf_destroy(&e3);

done:
  lua_settop(L, top);
  /* Full collections are slow: every so often is enough to keep memory flat. */
  if (++runs % 256 == 0) {
    lua_gc(L, LUA_GCCOLLECT, 0);
    lua_gc(L2, LUA_GCCOLLECT, 0);
  }
  return 0;
}
