/*
 * store_fuzz.c: a libFuzzer target for the store's Lua face: the
 * conversion of Lua values into events, claims and presence writes
 * (bridge/events.c, module/store_handle.c) and the store core's argument rules
 * behind it (store/store.c). Built and run by `make fuzz` (clang
 * -fsanitize=fuzzer,address,undefined); built with -DES_FUZZ_STANDALONE
 * it is also a plain program that feeds itself a fixed sequence of
 * pseudo-random inputs, which `make test` runs (build/ctest/store_fuzz_run;
 * see fuzz/README.md).
 *
 * Each input is read as a small program: a sequence of store calls
 * (append, claim, claim_next, presence_set, presence_read, read, fail,
 * complete, renew, sessions, fork, fence, lease, seal, put_ref, promote,
 * truncate, delete, archive, shred, read_at_rest, calls through a tenant
 * handle, advancing the clock) on one memory: store with a manual clock,
 * a master key file and an archive directory, whose arguments are Lua values made from the input
 * bytes: names that may hold NUL bytes, invalid UTF-8 or 256 bytes;
 * integers at the int64 edges; floats (3.5, 2^63, NaN, infinities);
 * strings where numbers belong; nested and cyclic tables; tables with
 * metatables (json.array, an __index table, an __index function that
 * makes fresh strings and may run the garbage collector); functions,
 * userdata and json.null where anything else belongs.
 *
 * What must hold, whatever the bytes:
 *   - a call either returns or raises a clean error: a standard argument
 *     error (a string with "bad argument") or an eventstore error object
 *     (its metatable, a known code other than STORAGE and CLOSED, a string
 *     message, tostring "CODE: message");
 *   - a call that raised changed nothing (the log, every dispatch record,
 *     every session row with its fence, lease, seal, lineage, first and
 *     archived index, the segment lists, which payloads are shredded, the
 *     refs, and the presence of the namespaces used are as before);
 *   - an append through a tenant handle stored its events in the session
 *     it was given, as the tenant names it (no prefix shows);
 *   - an append that returned stored every event in the session it was
 *     given, byte for byte (no name cut at a NUL), one per event;
 *   - a claim that returned claimed events holds them until a time after
 *     now, as the given holder (no claim born expired);
 *   - and, from the sanitizers: no memory error, no undefined behaviour
 *     (signed overflow included), no leak.
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

#include "module/module.h"
#include "module/store_handle.h"
#include "store/store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define T0 1000000
#define MAX_OPS 24
#define MAX_DEPTH 4

#define CHECK(cond, ...)                                  \
  do {                                                    \
    if (!(cond)) {                                        \
      fprintf(stderr, "store_fuzz: %s failed: ", #cond); \
      fprintf(stderr, __VA_ARGS__);                       \
      fprintf(stderr, "\n");                              \
      abort();                                            \
    }                                                     \
  } while (0)

/* ---------------------------------------------------------------------- */
/* reading the input */

typedef struct src {
  const uint8_t *p;
  size_t n;
} src;

/* The next byte (0 once the input is used up). */
static unsigned byte(src *s) {
  if (s->n == 0) return 0;
  s->n--;
  return *s->p++;
}

static unsigned pick(src *s, unsigned n) { return byte(s) % n; }

static uint64_t take64(src *s) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | byte(s);
  return v;
}

/* ---------------------------------------------------------------------- */
/* making Lua values */

/* Strings that name something, or try to. */
static const struct {
  const char *s;
  size_t n;
} names[] = {
    {"s", 1},         {"t", 1},          {"w", 1},           {"room", 4},     {"a", 1},
    {"b", 1},         {"type", 4},       {"lane", 4},        {"id-1", 4},     {"x", 1},
    {"", 0},          {"a\0b", 3},       {"s\0", 2},         {"\0", 1},       {"tenant-a\0evil", 13},
    {"bad\xff", 4},   {"\xc3", 1},       {"\xc3\x28", 2},    {"\xed\xa0\x80", 3},
    {"\xe2\x82", 2},  {"\xc3\xa9t\xc3\xa9", 6}, {"\xe2\x82\xac", 3}, {"\xf0\x9f\x98\x80", 4},
    {"123", 3},       {"-1", 2},         {"order\0001", 7},  {"order\0002", 7},
};
#define N_NAMES (sizeof names / sizeof *names)

static void push_name(lua_State *L, src *s) {
  unsigned k = byte(s);
  if (k < 120) {
    lua_pushlstring(L, names[k % 10].s, names[k % 10].n); /* the valid ones first */
  } else if (k < 200) {
    lua_pushlstring(L, names[k % N_NAMES].s, names[k % N_NAMES].n);
  } else if (k < 230) {
    /* Raw bytes from the input. */
    size_t n = pick(s, 16);
    char buf[16];
    for (size_t i = 0; i < n; i++) buf[i] = (char)byte(s);
    lua_pushlstring(L, buf, n);
  } else if (k < 245) {
    /* Around the 255-byte limit, in 1- to 4-byte characters. */
    static const char *unit[] = {"s", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80"};
    static const size_t ulen[] = {1, 2, 3, 4};
    unsigned u = pick(s, 4);
    size_t want = 250 + pick(s, 10), n = 0;
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    while (n + ulen[u] <= want) {
      luaL_addlstring(&b, unit[u], ulen[u]);
      n += ulen[u];
    }
    if (pick(s, 2)) luaL_addlstring(&b, unit[u], 1); /* a cut character */
    luaL_pushresult(&b);
  } else {
    lua_pushinteger(L, (lua_Integer)pick(s, 10)); /* a number where a name belongs */
  }
}

/* A session: mostly "s", so that calls meet the events appended before. */
static void push_session(lua_State *L, src *s) {
  if (pick(s, 2)) lua_pushliteral(L, "s");
  else push_name(L, s);
}

static void push_int(lua_State *L, src *s) {
  static const int64_t special[] = {0,         1,         -1,         2,          3,
                                    5,         100,       T0,         T0 + 1000,  INT64_MAX,
                                    INT64_MIN, INT64_MAX - 1, INT64_MIN + 1, INT64_MAX - T0,
                                    (int64_t)1 << 62, -((int64_t)1 << 62), 10000, 10001};
  unsigned k = pick(s, 24);
  if (k < sizeof special / sizeof *special) lua_pushinteger(L, (lua_Integer)special[k]);
  else lua_pushinteger(L, (lua_Integer)take64(s));
}

static void push_float(lua_State *L, src *s) {
  static const double special[] = {3.5, 3.0, 0.5, -0.0, 9223372036854775808.0, -9223372036854775808.0,
                                   18446744073709551616.0, 1e300, -1e300, 2.0};
  unsigned k = pick(s, 14);
  if (k < sizeof special / sizeof *special) lua_pushnumber(L, special[k]);
  else if (k == 10) lua_pushnumber(L, NAN);
  else if (k == 11) lua_pushnumber(L, INFINITY);
  else if (k == 12) lua_pushnumber(L, -INFINITY);
  else {
    uint64_t bits = take64(s);
    double d;
    memcpy(&d, &bits, sizeof d);
    lua_pushnumber(L, d);
  }
}

/* An integer option's value: mostly integers, sometimes anything. */
static void push_number_ish(lua_State *L, src *s, int depth);

/* __index function: returns its upvalue (a value made from the input),
 * after running the collector when its second upvalue says so, so that a
 * string only the caller holds would be freed under it. Never raises. */
static int index_fn(lua_State *L) {
  if (lua_toboolean(L, lua_upvalueindex(2))) lua_gc(L, LUA_GCCOLLECT);
  lua_pushvalue(L, lua_upvalueindex(1));
  if (lua_type(L, -1) == LUA_TSTRING) {
    /* A fresh string each time, held by nothing but the stack. */
    lua_pushliteral(L, "-fresh-string-longer-than-forty-bytes-to-be-a-long-string");
    lua_concat(L, 2);
  }
  return 1;
}

static int noop_fn(lua_State *L) {
  (void)L;
  return 0;
}

static void push_value(lua_State *L, src *s, int depth);

/* Its address is the registry key of json.array in each run's Lua state. */
static const char json_array_key = 'j';

/* Gives the table at the top a metatable, maybe (json_array: whether the
 * json array mark is one of the choices: only for plain tables). */
static void maybe_metatable(lua_State *L, src *s, int depth, int json_array) {
  unsigned k = pick(s, 8);
  if (k == 0 && json_array) {
    lua_rawgetp(L, LUA_REGISTRYINDEX, &json_array_key);
    lua_pushvalue(L, -2);
    lua_call(L, 1, 0); /* json.array(t): a plain table, cannot raise */
  } else if (k == 1) {
    lua_createtable(L, 0, 1);
    lua_createtable(L, 0, 4); /* __index table: defaults for the fields calls read */
    push_name(L, s);
    lua_setfield(L, -2, "type");
    push_name(L, s);
    lua_setfield(L, -2, "holder");
    push_number_ish(L, s, depth + 1);
    lua_setfield(L, -2, "ttl_ms");
    push_value(L, s, depth + 1);
    lua_setfield(L, -2, "payload");
    lua_setfield(L, -2, "__index");
    lua_setmetatable(L, -2);
  } else if (k == 2) {
    lua_createtable(L, 0, 1);
    if (pick(s, 2)) push_name(L, s);
    else push_number_ish(L, s, depth + 1);
    lua_pushboolean(L, (int)pick(s, 2));
    lua_pushcclosure(L, index_fn, 2);
    lua_setfield(L, -2, "__index");
    lua_setmetatable(L, -2);
  } else if (k == 3) {
    lua_createtable(L, 0, 2);
    lua_pushcfunction(L, noop_fn);
    lua_setfield(L, -2, "__gc");
    lua_pushliteral(L, "locked");
    lua_setfield(L, -2, "__metatable");
    lua_setmetatable(L, -2);
  }
}

static void push_table(lua_State *L, src *s, int depth) {
  unsigned n = pick(s, 6);
  lua_createtable(L, 0, 0);
  for (unsigned i = 0; i < n; i++) {
    switch (pick(s, 8)) {
      case 0:
      case 1:
      case 2:
        lua_pushinteger(L, (lua_Integer)i + 1);
        break;
      case 3:
      case 4:
        push_name(L, s);
        break;
      case 5:
        push_int(L, s);
        break;
      case 6:
        push_float(L, s);
        if (lua_tonumber(L, -1) != lua_tonumber(L, -1)) { /* NaN cannot be a key */
          lua_pop(L, 1);
          lua_pushinteger(L, 7);
        }
        break;
      default:
        lua_pushboolean(L, 1);
        break;
    }
    if (pick(s, 16) == 0) lua_pushvalue(L, -2); /* a cycle */
    else push_value(L, s, depth + 1);
    lua_rawset(L, -3);
  }
  maybe_metatable(L, s, depth, 1);
}

static void push_value(lua_State *L, src *s, int depth) {
  luaL_checkstack(L, 8, "fuzz value");
  unsigned k = pick(s, depth >= MAX_DEPTH ? 7 : 12);
  switch (k) {
    case 0: lua_pushnil(L); break;
    case 1: lua_pushboolean(L, (int)pick(s, 2)); break;
    case 2: push_int(L, s); break;
    case 3: push_float(L, s); break;
    case 4: push_name(L, s); break;
    case 5: lua_pushlightuserdata(L, NULL); break; /* not json.null */
    case 6: {
      lua_getglobal(L, "__json_null");
      break;
    }
    case 7: lua_pushcfunction(L, noop_fn); break;
    case 8: lua_newuserdatauv(L, 8, 0); break;
    default: push_table(L, s, depth); break;
  }
}

/* An index or attempt: mostly one that may exist. */
static void push_index(lua_State *L, src *s) {
  if (pick(s, 4)) lua_pushinteger(L, (lua_Integer)pick(s, 4));
  else push_number_ish(L, s, 2);
}

static void push_number_ish(lua_State *L, src *s, int depth) {
  unsigned k = pick(s, 16);
  if (k < 11) push_int(L, s);
  else if (k < 14) push_float(L, s);
  else if (k == 14) lua_pushliteral(L, "123");
  else push_value(L, s, depth);
}

/* Sets t[field] (t at the top) to a value, maybe; kind: 'n' name, 'i'
 * integer-ish, 'v' any value. */
static void maybe_field(lua_State *L, src *s, const char *field, char kind, unsigned chance) {
  if (pick(s, 8) >= chance) return;
  if (kind == 'n') push_name(L, s);
  else if (kind == 'i') push_number_ish(L, s, 1);
  else push_value(L, s, 1);
  lua_setfield(L, -2, field);
}

/* An event table (or, rarely, something else). */
static void push_event(lua_State *L, src *s) {
  if (pick(s, 16) == 0) {
    push_value(L, s, 1);
    return;
  }
  lua_createtable(L, 0, 8);
  maybe_field(L, s, "type", 'n', 7);
  maybe_field(L, s, "id", 'n', 3);
  maybe_field(L, s, "lane", 'n', 2);
  maybe_field(L, s, "key", 'n', 1);
  maybe_field(L, s, "payload", 'v', 5);
  maybe_field(L, s, "not_before", 'i', 1);
  maybe_field(L, s, "settled", 'v', 1);
  if (pick(s, 8) == 0) {
    lua_createtable(L, 0, 2);
    maybe_field(L, s, "index", 'i', 7);
    maybe_field(L, s, "attempt", 'i', 7);
    lua_setfield(L, -2, "cause");
  }
  if (pick(s, 4) == 0) maybe_metatable(L, s, 1, 0);
}

static void push_events(lua_State *L, src *s) {
  if (pick(s, 32) == 0) {
    push_value(L, s, 0);
    return;
  }
  unsigned n = pick(s, 5);
  lua_createtable(L, (int)n, 0);
  for (unsigned i = 0; i < n; i++) {
    push_event(L, s);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  if (pick(s, 32) == 0) { /* a length that lies: a border far beyond the elements */
    for (int k = 2; k <= 62; k++) {
      lua_createtable(L, 0, 1);
      lua_pushliteral(L, "t");
      lua_setfield(L, -2, "type");
      lua_rawseti(L, -2, (lua_Integer)1 << k);
    }
  }
}

/* ---------------------------------------------------------------------- */
/* checking */

/* A digest of everything the store holds that a failed call must leave
 * alone: every event with its dispatch record, and the presence of the
 * namespaces "room" and "s". */
static uint64_t mix(uint64_t h, int64_t v) {
  h ^= (uint64_t)v + 0x9e3779b97f4a7c15u + (h << 6) + (h >> 2);
  return h;
}

static uint64_t mix_str(uint64_t h, const char *p) {
  for (; p && *p; p++) h = mix(h, (unsigned char)*p);
  return mix(h, p ? 1 : 0);
}

static uint64_t digest(es_store *st) {
  es_events all;
  es_err err = {0};
  CHECK(es_store_read_all(st, 0, ES_NONE, &all, &err) == ES_OK, "read_all: %s", err.msg);
  uint64_t h = all.n;
  for (size_t i = 0; i < all.n; i++) {
    const es_event *e = &all.v[i];
    h = mix(h, e->position);
    h = mix(h, e->index);
    h = mix(h, e->status);
    h = mix(h, e->attempts);
    h = mix(h, e->failures);
    h = mix(h, e->claim_expires_at);
    h = mix(h, e->retry_at);
    h = mix(h, e->not_before);
    h = mix_str(h, e->claim_holder);
    h = mix_str(h, e->last_error);
    h = mix_str(h, e->key);
    h = mix(h, e->shredded);
  }
  es_events_destroy(&all);
  es_sessions ss;
  CHECK(es_store_sessions(st, "", NULL, 1000, &ss, &err) == ES_OK, "sessions: %s", err.msg);
  for (size_t i = 0; i < ss.n; i++) {
    const es_session_info *si = &ss.v[i];
    h = mix_str(h, si->session);
    h = mix(h, si->head);
    h = mix(h, si->fence);
    h = mix(h, si->sealed_at);
    h = mix_str(h, si->seal_reason);
    h = mix_str(h, si->lease_holder);
    h = mix(h, si->lease_token);
    h = mix(h, si->lease_expires_at);
    h = mix_str(h, si->parent);
    h = mix(h, si->fork_at);
    h = mix(h, si->first_index);
    h = mix(h, si->archived_through);
    es_segments segs;
    CHECK(es_store_segments(st, si->session, &segs, &err) == ES_OK, "segments: %s", err.msg);
    for (size_t k = 0; k < segs.n; k++) {
      h = mix(h, segs.v[k].from);
      h = mix(h, segs.v[k].through);
      h = mix_str(h, segs.v[k].checksum);
    }
    es_segments_destroy(&segs);
  }
  es_sessions_destroy(&ss);
  es_refs refs;
  CHECK(es_store_list_refs(st, NULL, 1000, &refs, &err) == ES_OK, "list_refs: %s", err.msg);
  for (size_t i = 0; i < refs.n; i++) {
    h = mix_str(h, refs.v[i].name);
    h = mix_str(h, refs.v[i].session);
    h = mix(h, refs.v[i].updated_at);
  }
  es_refs_destroy(&refs);
  static const char *const spaces[] = {"room", "s"};
  for (size_t k = 0; k < 2; k++) {
    es_presence_rows rows;
    CHECK(es_store_presence_read(st, spaces[k], &rows, &err) == ES_OK, "presence_read: %s", err.msg);
    for (size_t i = 0; i < rows.n; i++) {
      h = mix_str(h, rows.v[i].participant);
      h = mix_str(h, rows.v[i].field);
      h = mix_str(h, rows.v[i].value);
      h = mix(h, rows.v[i].at);
      h = mix(h, rows.v[i].seen);
      h = mix(h, rows.v[i].expires_at);
    }
    es_presence_rows_destroy(&rows);
  }
  return h;
}

/* The error at the top of the stack (from a call that raised) is clean. */
static void check_error(lua_State *L, int status, const char *op, int error_mt) {
  CHECK(status == LUA_ERRRUN, "%s: status %d: %s", op, status, luaL_typename(L, -1));
  if (lua_type(L, -1) == LUA_TSTRING) {
    const char *msg = lua_tostring(L, -1);
    CHECK(strstr(msg, "bad argument") != NULL, "%s raised a string that is no argument error: %s", op,
          msg);
    return;
  }
  CHECK(lua_type(L, -1) == LUA_TTABLE, "%s raised a %s", op, luaL_typename(L, -1));
  CHECK(lua_getmetatable(L, -1), "%s: the error has no metatable", op);
  lua_rawgeti(L, LUA_REGISTRYINDEX, error_mt);
  CHECK(lua_rawequal(L, -1, -2), "%s: the error's metatable is not eventstore's", op);
  lua_pop(L, 2);
  lua_getfield(L, -1, "code");
  lua_getfield(L, -2, "message");
  CHECK(lua_type(L, -2) == LUA_TSTRING && lua_type(L, -1) == LUA_TSTRING, "%s: code/message", op);
  const char *code = lua_tostring(L, -2);
  static const char *const known[] = {"PARTIAL_DUPLICATE_BATCH", "ID_CONFLICT", "SUPERSEDED_ATTEMPT",
                                      "NO_SUCH_EVENT", "WRONG_EXPECTED_HEAD", "INVALID_ARGUMENT",
                                      "TOO_LARGE", "STALE_FENCE", "SEALED", "REF_CONFLICT", "TRUNCATED",
                                      "NOT_FOUND"};
  int found = 0;
  for (size_t i = 0; i < sizeof known / sizeof *known; i++) found |= strcmp(code, known[i]) == 0;
  CHECK(found, "%s: unexpected code %s: %s", op, code, lua_tostring(L, -1));
  lua_pop(L, 2);
  size_t n;
  const char *text = luaL_tolstring(L, -1, &n);
  CHECK(strncmp(text, code, strlen(code)) == 0 && text[strlen(code)] == ':', "%s: tostring %s", op,
        text);
  lua_pop(L, 1);
}

/* Whether the values at a and b are strings (or numbers, as Lua turns
 * them into names) of the same bytes. */
static int same_text(lua_State *L, int a, int b) {
  a = lua_absindex(L, a);
  b = lua_absindex(L, b);
  int ta = lua_type(L, a), tb = lua_type(L, b);
  if ((ta != LUA_TSTRING && ta != LUA_TNUMBER) || (tb != LUA_TSTRING && tb != LUA_TNUMBER)) return 0;
  lua_pushvalue(L, a);
  lua_pushvalue(L, b);
  size_t na, nb;
  const char *pa = lua_tolstring(L, -2, &na), *pb = lua_tolstring(L, -1, &nb);
  int same = na == nb && memcmp(pa, pb, na) == 0;
  lua_pop(L, 2);
  return same;
}

/* ---------------------------------------------------------------------- */
/* the calls */

enum { OP_APPEND, OP_CLAIM, OP_PRESENCE, OP_CLAIM_NEXT, OP_READ, OP_FAIL, OP_COMPLETE,
       OP_PRESENCE_READ, OP_RENEW, OP_SESSIONS, OP_FORK, OP_FENCE, OP_LEASE, OP_SEAL, OP_PUT_REF,
       OP_PROMOTE, OP_TRUNCATE, OP_DELETE, OP_ARCHIVE, OP_SHRED, OP_READ_AT_REST, OP_TENANT,
       OP_ADVANCE, N_OPS };

static const char *const op_names[N_OPS] = {"append", "claim", "presence_set", "claim_next", "read",
                                            "fail", "complete", "presence_read", "renew", "sessions",
                                            "fork", "fence", "lease", "seal", "put_ref", "promote",
                                            "truncate", "delete", "archive", "shred",
                                            "read_at_rest", "tenant", "advance"};

/* Pushes the arguments of one call after the store (at index store);
 * returns their number. */
static int push_args(lua_State *L, src *s, int op) {
  switch (op) {
    case OP_APPEND:
      push_session(L, s);
      push_events(L, s);
      if (pick(s, 4) == 0) {
        lua_createtable(L, 0, 2);
        maybe_field(L, s, "expected", 'i', 8);
        maybe_field(L, s, "fence", 'i', 4);
        return 3;
      }
      return 2;
    case OP_CLAIM:
    case OP_CLAIM_NEXT:
      if (op == OP_CLAIM) push_session(L, s);
      lua_createtable(L, 0, 5);
      maybe_field(L, s, "holder", 'n', 7);
      maybe_field(L, s, "ttl_ms", 'i', 6);
      maybe_field(L, s, "expires_at", 'i', 1);
      maybe_field(L, s, "limit", 'i', 2);
      if (op == OP_CLAIM && pick(s, 4) == 0) {
        unsigned n = pick(s, 4);
        lua_createtable(L, (int)n, 0);
        for (unsigned i = 0; i < n; i++) {
          push_number_ish(L, s, 2);
          lua_rawseti(L, -2, (lua_Integer)i + 1);
        }
        lua_setfield(L, -2, "exclude");
      }
      if (op == OP_CLAIM_NEXT && pick(s, 3) == 0) {
        /* types: names (NUL, invalid UTF-8, too long among them), or
         * sometimes a non-string element */
        unsigned n = pick(s, 5);
        lua_createtable(L, (int)n, 0);
        for (unsigned i = 0; i < n; i++) {
          if (pick(s, 8) == 0) push_number_ish(L, s, 2);
          else push_name(L, s);
          lua_rawseti(L, -2, (lua_Integer)i + 1);
        }
        lua_setfield(L, -2, "types");
      }
      if (pick(s, 8) == 0) maybe_metatable(L, s, 1, 0);
      return op == OP_CLAIM ? 2 : 1;
    case OP_PRESENCE: {
      push_name(L, s);
      push_name(L, s);
      unsigned n = pick(s, 4);
      lua_createtable(L, 0, (int)n);
      for (unsigned i = 0; i < n; i++) {
        push_name(L, s);
        if (pick(s, 4) == 0) lua_getglobal(L, "__json_null");
        else push_value(L, s, 1);
        lua_rawset(L, -3);
      }
      lua_createtable(L, 0, 3);
      maybe_field(L, s, "ttl_ms", 'i', 7);
      maybe_field(L, s, "at", 'i', 3);
      maybe_field(L, s, "seen", 'i', 2);
      return 4;
    }
    case OP_READ:
      push_session(L, s);
      lua_createtable(L, 0, 3);
      maybe_field(L, s, "after", 'i', 3);
      maybe_field(L, s, "through", 'i', 2);
      maybe_field(L, s, "limit", 'i', 3);
      return 2;
    case OP_FAIL:
    case OP_COMPLETE:
      push_session(L, s);
      push_index(L, s);
      push_index(L, s);
      if (op == OP_COMPLETE) {
        push_events(L, s);
        if (pick(s, 4) == 0) {
          lua_createtable(L, 0, 1);
          maybe_field(L, s, "fence", 'i', 4);
          return 5;
        }
        return 4;
      }
      lua_createtable(L, 0, 3);
      if (pick(s, 2)) {
        push_name(L, s); /* free text: any bytes */
        lua_setfield(L, -2, "error");
      } else {
        lua_pushliteral(L, "handler failed\n\ttraceback");
        lua_setfield(L, -2, "error");
      }
      maybe_field(L, s, "max_failures", 'i', 3);
      maybe_field(L, s, "retry_after_ms", 'i', 3);
      return 4;
    case OP_PRESENCE_READ:
      push_name(L, s);
      return 1;
    case OP_RENEW: {
      push_session(L, s);
      lua_createtable(L, 0, 3);
      maybe_field(L, s, "holder", 'n', 7);
      maybe_field(L, s, "ttl_ms", 'i', 7);
      unsigned n = pick(s, 3);
      lua_createtable(L, (int)n, 0);
      for (unsigned i = 0; i < n; i++) {
        lua_createtable(L, 2, 0);
        push_index(L, s);
        lua_rawseti(L, -2, 1);
        push_index(L, s);
        lua_rawseti(L, -2, 2);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
      }
      lua_setfield(L, -2, "claims");
      return 2;
    }
    case OP_FORK:
      push_session(L, s);
      push_index(L, s);
      push_session(L, s);
      return 3;
    case OP_FENCE:
    case OP_SEAL:
      push_session(L, s);
      lua_createtable(L, 0, 1);
      if (op == OP_FENCE) maybe_field(L, s, "if_token", 'i', 4);
      else maybe_field(L, s, "reason", 'n', 2);
      return 2;
    case OP_LEASE:
      push_session(L, s);
      lua_createtable(L, 0, 2);
      maybe_field(L, s, "holder", 'n', 7);
      maybe_field(L, s, "ttl_ms", 'i', 7);
      return 2;
    case OP_TRUNCATE:
      push_session(L, s);
      push_index(L, s);
      return 2;
    case OP_ARCHIVE:
      push_session(L, s);
      lua_createtable(L, 0, 1);
      maybe_field(L, s, "through", 'i', 7);
      return 2;
    case OP_SHRED:
    case OP_READ_AT_REST:
      push_session(L, s); /* a key name or a session: the same kinds of bytes */
      return 1;
    case OP_DELETE:
      if (pick(s, 4)) return 0; /* rarely: it empties the seeded session */
      push_session(L, s);
      return 1;
    case OP_PUT_REF:
      push_session(L, s); /* a ref name: the same kinds of bytes */
      push_session(L, s);
      return 2;
    case OP_PROMOTE:
      push_session(L, s);
      push_session(L, s);
      lua_createtable(L, 0, 1);
      if (pick(s, 3) == 0) {
        lua_pushboolean(L, 0);
        lua_setfield(L, -2, "expect");
      } else {
        maybe_field(L, s, "expect", 'n', 4);
      }
      return 3;
    case OP_SESSIONS:
      lua_createtable(L, 0, 3);
      maybe_field(L, s, "prefix", 'n', 2);
      maybe_field(L, s, "after", 'n', 2);
      maybe_field(L, s, "limit", 'i', 3);
      return 1;
    default:
      return 0;
  }
}

/* What a successful call must have done. base: the first argument's
 * index; results from `res` on. */
static void check_success(lua_State *L, es_store *st, int op, int base, int res) {
  if (op == OP_APPEND) {
    /* One stored event per event given, each in the session given. */
    CHECK(lua_type(L, res) == LUA_TTABLE, "append returned %s", luaL_typename(L, res));
    lua_Integer n = (lua_Integer)lua_rawlen(L, res);
    CHECK(n == (lua_Integer)lua_rawlen(L, base + 1), "append stored %lld of %lld events", (long long)n,
          (long long)lua_rawlen(L, base + 1));
    for (lua_Integer i = 1; i <= n; i++) {
      lua_rawgeti(L, res, i);
      lua_getfield(L, -1, "session");
      CHECK(same_text(L, -1, base), "append: event %lld is in another session than given",
            (long long)i);
      lua_pop(L, 2);
    }
  } else if (op == OP_CLAIM) {
    lua_getfield(L, res, "outcome");
    int claimed = lua_type(L, -1) == LUA_TSTRING && strcmp(lua_tostring(L, -1), "claimed") == 0;
    lua_pop(L, 1);
    if (!claimed) return;
    int64_t now;
    es_err err = {0};
    CHECK(es_store_now(st, &now, &err) == ES_OK, "now");
    lua_getfield(L, res, "events");
    int evs = lua_gettop(L);
    for (lua_Integer i = 1; i <= (lua_Integer)lua_rawlen(L, evs); i++) {
      lua_rawgeti(L, evs, i);
      lua_getfield(L, -1, "claim_expires_at");
      lua_getfield(L, base + 1, "expires_at");
      if (lua_isnil(L, -1)) {
        CHECK(lua_tointeger(L, -2) > now, "claim born expired: expires %lld, now %lld",
              (long long)lua_tointeger(L, -2), (long long)now);
      }
      lua_pop(L, 2);
      lua_getfield(L, -1, "claim_holder");
      lua_getfield(L, base + 1, "holder");
      CHECK(same_text(L, -1, -2), "claim: held by another holder than given");
      lua_pop(L, 3);
    }
    lua_pop(L, 1);
  }
}

/* Calls per operation that returned and that raised (the standalone run
 * prints them, to show the inputs reach past the argument checks). */
typedef struct stats {
  unsigned long ok[N_OPS + 1], raised[N_OPS + 1];
} stats;

/* What every run starts from, so that calls meet real rows: session "s"
 * with three events (the third in lane "l"), the first claimed by "w"
 * (attempt 1), and a ref "s" naming it (push_session's common name, so
 * promote meets a ref). */
static void seed(es_store *st) {
  es_new_event e[3];
  for (int i = 0; i < 3; i++) {
    es_new_event_init(&e[i]);
    e[i].type = i == 1 ? "b" : "a";
  }
  e[2].lane = "l";
  int pending, outcome;
  int64_t retry;
  es_events got;
  es_err err = {0};
  CHECK(es_store_append(st, "s", e, 3, ES_NONE, ES_NONE, NULL, &pending, &err) == ES_OK, "seed: %s", err.msg);
  es_claim_opts o = {.holder = "w", .ttl_ms = 1000, .expires_at = ES_NONE, .limit = 1};
  CHECK(es_store_claim(st, "s", &o, &outcome, &got, &retry, &err) == ES_OK, "seed: %s", err.msg);
  es_events_destroy(&got);
  es_ref ref;
  CHECK(es_store_put_ref(st, "s", "s", &ref, &err) == ES_OK, "seed: %s", err.msg);
  es_ref_destroy(&ref);
  /* processed events, some sealed: something to archive and to shred */
  es_new_event p[3];
  for (int i = 0; i < 3; i++) {
    es_new_event_init(&p[i]);
    p[i].type = "a";
    p[i].settled = 1;
    p[i].payload = "{\"x\":1}";
    p[i].payload_len = 7;
    if (i != 1) p[i].key = "k";
  }
  CHECK(es_store_append(st, "p", p, 3, ES_NONE, ES_NONE, NULL, &pending, &err) == ES_OK, "seed: %s", err.msg);
}

/* A directory for the whole run: the master key file and the archive. */
static char run_dir[64];

static const char *fuzz_dir(void) {
  if (!run_dir[0]) {
    snprintf(run_dir, sizeof run_dir, "/tmp/es-store-fuzz-XXXXXX");
    CHECK(mkdtemp(run_dir) != NULL, "mkdtemp");
  }
  return run_dir;
}

/* A call through a tenant handle: tenant(name), then an append of fuzzed
 * events there. Whatever the bytes, either call returns or raises cleanly,
 * a raise changes nothing, and stored events carry the session as the
 * tenant gave it. */
static void tenant_call(lua_State *L, es_store *st, int store, src *s, int error_mt, stats *st_out) {
  int top = lua_gettop(L);
  lua_getfield(L, store, "tenant");
  lua_pushvalue(L, store);
  push_session(L, s); /* a tenant name: the same kinds of bytes */
  int status = lua_pcall(L, 2, 1, 0);
  if (status != LUA_OK) {
    check_error(L, status, "tenant", error_mt);
    if (st_out) st_out->raised[OP_TENANT]++;
    lua_settop(L, top);
    return;
  }
  int handle = lua_gettop(L);
  lua_getfield(L, handle, "append");
  lua_pushvalue(L, handle);
  int base = lua_gettop(L) + 1;
  push_session(L, s);
  push_events(L, s);
  lua_pushvalue(L, base);
  lua_pushvalue(L, base + 1);
  lua_rotate(L, handle + 1, 2); /* copies of the arguments below the call */
  int copies = handle + 1;
  uint64_t before = digest(st);
  status = lua_pcall(L, 3, 1, 0);
  if (status != LUA_OK) {
    check_error(L, status, "tenant append", error_mt);
    CHECK(digest(st) == before, "an append through a tenant raised but changed the store");
  } else {
    check_success(L, st, OP_APPEND, copies, copies + 2);
  }
  if (st_out) (status == LUA_OK ? st_out->ok : st_out->raised)[OP_TENANT]++;
  lua_settop(L, top);
}

static void run_input(const uint8_t *data, size_t size, stats *st_out) {
  lua_State *L = luaL_newstate();
  CHECK(L != NULL, "luaL_newstate");
  luaL_openlibs(L);
  luaL_requiref(L, "eventstore.core", luaopen_eventstore_core, 0);
  int mod = lua_gettop(L);
  lua_getfield(L, mod, "json");
  lua_getfield(L, -1, "null");
  lua_setglobal(L, "__json_null");
  lua_getfield(L, -1, "array");
  lua_rawsetp(L, LUA_REGISTRYINDEX, &json_array_key);
  lua_pop(L, 1);
  lua_getfield(L, mod, "error_mt");
  int error_mt = luaL_ref(L, LUA_REGISTRYINDEX);

  /* A memory store on a manual clock at T0. */
  lua_getfield(L, mod, "manual_clock");
  lua_pushinteger(L, T0);
  lua_call(L, 1, 1);
  int clock = lua_gettop(L);
  lua_getfield(L, mod, "open");
  lua_pushliteral(L, "memory:");
  lua_createtable(L, 0, 3);
  lua_pushvalue(L, clock);
  lua_setfield(L, -2, "clock");
  lua_pushfstring(L, "%s/keys", fuzz_dir());
  lua_setfield(L, -2, "keys");
  lua_pushfstring(L, "%s/archive", fuzz_dir());
  lua_setfield(L, -2, "archive");
  lua_call(L, 2, 1);
  int store = lua_gettop(L);
  es_store *st = es_lua_check_store(L, store, NULL);
  seed(st);

  src s = {data, size};
  for (int ops = 0; ops < MAX_OPS && s.n > 0; ops++) {
    int op = (int)pick(&s, N_OPS);
    int top = lua_gettop(L);
    if (op == OP_TENANT) {
      tenant_call(L, st, store, &s, error_mt, st_out);
      continue;
    }
    if (op == OP_ADVANCE) {
      lua_getfield(L, clock, "advance");
      lua_pushvalue(L, clock);
      push_number_ish(L, &s, 1);
      int status = lua_pcall(L, 2, 0, 0);
      if (status != LUA_OK) check_error(L, status, "advance", error_mt);
      if (st_out) (status == LUA_OK ? st_out->ok : st_out->raised)[op]++;
      lua_settop(L, top);
      continue;
    }
    lua_getfield(L, store, op_names[op]);
    lua_pushvalue(L, store);
    int base = lua_gettop(L) + 1;
    int nargs = push_args(L, &s, op);
    /* Copies of the arguments, to check results against after the call. */
    for (int i = 0; i < nargs; i++) lua_pushvalue(L, base + i);
    lua_rotate(L, top + 1, nargs);
    int copies = top + 1;
    uint64_t before = digest(st);
    int status = lua_pcall(L, nargs + 1, LUA_MULTRET, 0);
    if (status != LUA_OK) {
      check_error(L, status, op_names[op], error_mt);
      CHECK(digest(st) == before, "%s raised but changed the store", op_names[op]);
    } else {
      check_success(L, st, op, copies, copies + nargs);
    }
    if (st_out) (status == LUA_OK ? st_out->ok : st_out->raised)[op]++;
    lua_settop(L, top);
  }
  luaL_unref(L, LUA_REGISTRYINDEX, error_mt);
  lua_close(L); /* closes the store (its __gc) */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  run_input(data, size, NULL);
  return 0;
}

#ifdef ES_FUZZ_STANDALONE
/* The deterministic run `make test` does: STORE_FUZZ_ITERS inputs (default
 * 2000) of 0..600 pseudo-random bytes from a fixed seed (STORE_FUZZ_SEED),
 * TAP output. */
int main(void) {
  const char *it = getenv("STORE_FUZZ_ITERS"), *sd = getenv("STORE_FUZZ_SEED");
  long iters = it ? atol(it) : 2000;
  uint64_t x = sd ? strtoull(sd, NULL, 10) : 0x5eed5eed5eedULL;
  if (x == 0) x = 1;
  uint8_t buf[600];
  stats counts;
  memset(&counts, 0, sizeof counts);
  for (long i = 0; i < iters; i++) {
    size_t n = 0;
    /* xorshift64* */
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    n = (size_t)((x * 0x2545F4914F6CDD1DULL) >> 33) % sizeof buf;
    for (size_t k = 0; k < n; k++) {
      x ^= x >> 12;
      x ^= x << 25;
      x ^= x >> 27;
      buf[k] = (uint8_t)((x * 0x2545F4914F6CDD1DULL) >> 56);
    }
    run_input(buf, n, &counts);
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_dir());
  if (system(cmd) != 0) fprintf(stderr, "store_fuzz: could not remove %s\n", fuzz_dir());
  printf("ok 1 - store_fuzz: %ld pseudo-random inputs through append, claim, presence, fork, "
         "fences, archive, shredding, tenants and more\n",
         iters);
  for (int op = 0; op < N_OPS; op++)
    printf("# %-13s %6lu returned, %6lu raised\n", op_names[op], counts.ok[op], counts.raised[op]);
  return 0;
}
#endif
