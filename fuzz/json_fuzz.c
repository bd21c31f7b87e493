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

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* One Lua state for the whole run: creating one per input would dominate
 * the time. It is reset (stack emptied, garbage collected) between inputs. */
static lua_State *L;
static unsigned long runs;

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
  return 0;
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
  lua_settop(L, 0);
  if (++runs % 1024 == 0) lua_gc(L, LUA_GCCOLLECT, 0);
  es_buf_destroy(&out);
  return 0;
}
