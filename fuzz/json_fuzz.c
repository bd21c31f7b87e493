/*
 * json_fuzz.c: a libFuzzer target for the JSON codec (json.h). Built and
 * run by `make fuzz` (clang -fsanitize=fuzzer,address,undefined); see
 * fuzz/README.md.
 *
 * For every input it checks what must hold whatever the bytes are:
 *   - es_json_validate and es_json_canonicalize agree, with the same message;
 *   - a rejection is INVALID_ARGUMENT naming a byte offset inside the input;
 *   - canonical text is a fixed point and validates;
 *   - the Lua face agrees with the C face: es_json_decode_lua accepts
 *     exactly what canonicalize accepts (same message), and re-encoding the
 *     decoded value gives exactly the canonical text;
 *   - the raising decoder (es_json_decoder_decode, the engine fold's: no
 *     pcall, scratch reused from one input to the next) agrees with
 *     es_json_decode_lua: the same value (types, integer vs float subtype,
 *     float bits, string bytes, keys, array marks, json.null) or the same
 *     error message; with its string cache (the decoder at the stack index
 *     it was pushed at; the cache keeps strings from earlier inputs, so its
 *     slots are hit, missed and replaced) and without it (another index),
 *     alternately, and twice in a row (the second decode hits the strings
 *     the first one left);
 *   - the first 8 bytes, read as a double, format to text that reads back
 *     bit for bit (or are NaN/inf and are refused).
 * A broken invariant aborts, which libFuzzer reports with the input.
 */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/json.h"
#include "bridge/json_lua.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* One Lua state for the whole run: creating one per input would dominate
 * the time. It is reset (stack emptied, garbage collected) between inputs. */
static lua_State *L;
static unsigned long runs;
/* The raising decoder, one for the whole run (its userdata is anchored in
 * the registry), so that scratch reuse across inputs is exercised. */
static es_json_decoder *jd;
static const char jd_key = 'd';

#define CHECK(cond, ...)                                 \
  do {                                                   \
    if (!(cond)) {                                       \
      fprintf(stderr, "json_fuzz: %s failed: ", #cond); \
      fprintf(stderr, __VA_ARGS__);                      \
      fprintf(stderr, "\n");                             \
      abort();                                           \
    }                                                    \
  } while (0)

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  L = luaL_newstate();
  if (!L) abort();
  /* Registers the array metatable, as require("eventstore") would. */
  es_json_push_module(L);
  lua_pop(L, 1);
  jd = es_json_decoder_push(L);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &jd_key);
  return 0;
}

/* Whether the values at a and b are the same decoded JSON: same types,
 * integer vs float, float bits, string bytes, the same keys with the same
 * values, the same metatable (the array mark). */
static int same_value(int a, int b, int depth) {
  int t = lua_type(L, a);
  if (t != lua_type(L, b)) return 0;
  switch (t) {
    case LUA_TNIL: return 1;
    case LUA_TBOOLEAN: return lua_toboolean(L, a) == lua_toboolean(L, b);
    case LUA_TLIGHTUSERDATA: return lua_touserdata(L, a) == lua_touserdata(L, b);
    case LUA_TNUMBER: {
      if (lua_isinteger(L, a) != lua_isinteger(L, b)) return 0;
      if (lua_isinteger(L, a)) return lua_tointeger(L, a) == lua_tointeger(L, b);
      lua_Number x = lua_tonumber(L, a), y = lua_tonumber(L, b);
      return memcmp(&x, &y, sizeof x) == 0;
    }
    case LUA_TSTRING: {
      size_t n, m;
      const char *x = lua_tolstring(L, a, &n), *y = lua_tolstring(L, b, &m);
      return n == m && memcmp(x, y, n) == 0;
    }
    case LUA_TTABLE: {
      int ok = 1;
      size_t na = 0, nb = 0;
      if (depth > ES_JSON_MAX_DEPTH + 1 || !lua_checkstack(L, 6)) abort();
      int ma = lua_getmetatable(L, a), mb = lua_getmetatable(L, b);
      if (ma != mb || (ma && !lua_rawequal(L, -1, -2))) ok = 0;
      lua_pop(L, ma + mb);
      lua_pushnil(L);
      while (ok && lua_next(L, a)) {
        na++;
        lua_pushvalue(L, -2);
        lua_rawget(L, b);
        ok = same_value(lua_gettop(L) - 1, lua_gettop(L), depth + 1);
        lua_pop(L, 2);
      }
      if (!ok) {
        lua_pop(L, 1); /* the key left by the interrupted traversal */
        return 0;
      }
      lua_pushnil(L);
      while (lua_next(L, b)) {
        nb++;
        lua_pop(L, 1);
      }
      return na == nb;
    }
    default: return 0;
  }
}

/* lua_pcall'd: es_json_decoder_decode of (text, size) given as light
 * userdata and integer. The decoder was pushed at index 1: put at index 1
 * again, it decodes with its string cache; at index 2, without. */
static int raising_decode(lua_State *S) {
  const char *text = lua_touserdata(S, 1);
  size_t size = (size_t)lua_tointeger(S, 2);
  lua_settop(S, 0);
  if (runs & 1) lua_pushnil(S);
  lua_rawgetp(S, LUA_REGISTRYINDEX, &jd_key);
  es_json_decoder_decode(S, jd, text, size);
  return 1;
}

static void check_double(const uint8_t *data, size_t size) {
  double d, back;
  es_buf b, c;
  es_err err;
  int rc;
  char *end;
  if (size < 8) return;
  memcpy(&d, data, sizeof d);
  es_buf_init(&b);
  rc = es_json_format_double(d, &b, &err);
  if (isnan(d) || isinf(d)) {
    CHECK(rc == ES_INVALID_ARGUMENT && b.len == 0, "%a", d);
  } else {
    CHECK(rc == ES_OK, "%a: %s", d, err.msg);
    es_buf_cstr(&b);
    back = strtod(b.data, &end);
    CHECK(*end == '\0' && memcmp(&back, &d, sizeof d) == 0, "%a -> %s", d, b.data);
    CHECK(strpbrk(b.data, ".e") != NULL, "%a -> %s does not read as a float", d, b.data);
    es_buf_init(&c);
    CHECK(es_json_canonicalize(b.data, b.len, &c, &err) == ES_OK && c.len == b.len &&
              memcmp(c.data, b.data, b.len) == 0,
          "%s is not canonical", b.data);
    es_buf_destroy(&c);
  }
  es_buf_destroy(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *text = (const char *)data;
  es_buf out, again, enc;
  es_err verr, cerr, derr, err;
  int vrc, crc, drc;

  check_double(data, size);

  es_buf_init(&out);
  vrc = es_json_validate(text, size, &verr);
  crc = es_json_canonicalize(text, size, &out, &cerr);
  CHECK(vrc == crc, "validate %d, canonicalize %d", vrc, crc);
  if (crc != ES_OK) {
    unsigned long long at;
    CHECK(crc == ES_INVALID_ARGUMENT, "code %d: %s", crc, cerr.msg);
    CHECK(strcmp(verr.msg, cerr.msg) == 0, "'%s' vs '%s'", verr.msg, cerr.msg);
    CHECK(sscanf(cerr.msg, "invalid JSON at byte %llu:", &at) == 1 && at <= size, "%s", cerr.msg);
    CHECK(out.len == 0, "output left behind on failure");
  } else {
    es_buf_init(&again);
    CHECK(es_json_validate(out.data, out.len, &err) == ES_OK, "%s", err.msg);
    CHECK(es_json_canonicalize(out.data, out.len, &again, &err) == ES_OK, "%s", err.msg);
    CHECK(again.len == out.len && memcmp(again.data, out.data, out.len) == 0, "not a fixed point");
    es_buf_destroy(&again);
  }

  /* The Lua face against the C face. */
  drc = es_json_decode_lua(L, text, size, &derr);
  if (crc == ES_OK) {
    CHECK(drc == ES_OK, "decode_lua refused what canonicalize took: %s", derr.msg);
    es_buf_init(&enc);
    CHECK(es_json_encode_lua(L, -1, "value", &enc, &err) == ES_OK, "%s", err.msg);
    CHECK(enc.len == out.len && memcmp(enc.data, out.data, out.len) == 0, "Lua round trip differs from canonical");
    es_buf_destroy(&enc);
  } else {
    CHECK(drc == crc && strcmp(derr.msg, cerr.msg) == 0, "decode_lua %d '%s' vs canonicalize '%s'", drc, derr.msg,
          cerr.msg);
  }
  /* The raising decoder against es_json_decode_lua (whose value, if
   * any, is still at -1). */
  for (int twice = 0; twice < 2; twice++) {
    int base = lua_gettop(L), status;
    lua_pushcfunction(L, raising_decode);
    lua_pushlightuserdata(L, (void *)text);
    lua_pushinteger(L, (lua_Integer)size);
    status = lua_pcall(L, 2, 1, 0);
    if (drc == ES_OK) {
      CHECK(status == LUA_OK, "the raising decoder refused what decode_lua took: %s", lua_tostring(L, -1));
      CHECK(same_value(base, base + 1, 0), "the raising decoder's value differs from decode_lua's");
    } else {
      const char *code = NULL, *msg = NULL;
      CHECK(status == LUA_ERRRUN && lua_type(L, -1) == LUA_TTABLE, "the raising decoder took what decode_lua refused");
      lua_getfield(L, -1, "code");
      code = lua_tostring(L, -1);
      lua_getfield(L, -2, "message");
      msg = lua_tostring(L, -1);
      CHECK(code && strcmp(code, "INVALID_ARGUMENT") == 0 && msg && strcmp(msg, derr.msg) == 0,
            "raising decoder '%s: %s' vs decode_lua '%s'", code ? code : "?", msg ? msg : "?", derr.msg);
    }
    lua_settop(L, base);
  }
  lua_settop(L, 0);
  if (++runs % 1024 == 0) lua_gc(L, LUA_GCCOLLECT, 0);
  es_buf_destroy(&out);
  return 0;
}
