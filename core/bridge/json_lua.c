/*
 * bridge/json_lua.c: the Lua face (bridge/json_lua.h) of the exact payload
 * codec (codec/json.h): Lua value <-> canonical JSON text, and the
 * eventstore.json module table.
 *
 * The text rules (scanner, number and string writers, key order) live in
 * codec/json.c and are shared through codec/json_scan.h, so the Lua face
 * and the C face cannot drift apart.
 *
 * Neither es_json_encode_lua nor es_json_decode_lua raises: the store calls
 * them with C memory in flight. The encoder calls only Lua API functions
 * that cannot raise (no allocation on the Lua side at all); the decoder,
 * which must allocate Lua values, runs under lua_pcall.
 */
#include <lauxlib.h>
#include <lua.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "codec/json.h"
#include "bridge/json_lua.h"
#include "codec/json_scan.h"
#include "bridge/common.h"

/* Its address is json.null (a light userdata: no allocation, the same in
 * every lua_State of the process) ... */
static const char null_sentinel = 'n';
/* ... and this one's is the registry key of the array metatable. (Distinct
 * values, so that even -fmerge-all-constants cannot give both one address.) */
static const char array_mt_key = 'a';

#define ARRAY_MT_NAME "eventstore.json.array"

void es_json_push_null(lua_State *L) { lua_pushlightuserdata(L, (void *)&null_sentinel); }

int es_json_is_null(lua_State *L, int idx) {
  return lua_type(L, idx) == LUA_TLIGHTUSERDATA && lua_touserdata(L, idx) == (void *)&null_sentinel;
}

/* Pushes the array metatable, creating it on first use (may raise). */
static void push_array_mt(lua_State *L) {
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &array_mt_key) != LUA_TNIL) return;
  lua_pop(L, 1);
  lua_createtable(L, 0, 1);
  lua_pushliteral(L, ARRAY_MT_NAME);
  lua_setfield(L, -2, "__name");
  lua_pushvalue(L, -1);
  lua_rawsetp(L, LUA_REGISTRYINDEX, &array_mt_key);
}

/* Encoder ------------------------------------------------------------------ */

/* How the encoder got from one table to the value below it. */
typedef struct enc_step {
  const void *table; /* the enclosing table (for cycle detection) */
  const char *key;   /* borrowed Lua string (kept alive by the table), or NULL ... */
  size_t klen;
  lua_Integer index; /* ... then the array position, 1-based as in Lua */
} enc_step;

typedef struct enc {
  lua_State *L;
  es_buf *out;
  es_err *err;
  const char *what;
  size_t mark;    /* out->len when encoding began */
  int array_mt;   /* stack index of the array metatable; 0 when none exists */
  esj_members m;  /* owned: members of every open object */
  es_buf tmp;     /* owned: scratch for reordering members */
  enc_step path[ES_JSON_MAX_DEPTH];
} enc;

/* Appends to a fixed message buffer, truncating. */
typedef struct msgbuf {
  char s[ES_ERRMSG_MAX];
  size_t n;
} msgbuf;

static void msg_add(msgbuf *m, const char *p, size_t n) {
  size_t room = sizeof m->s - 1 - m->n;
  if (n > room) n = room;
  memcpy(m->s + m->n, p, n);
  m->n += n;
  m->s[m->n] = '\0';
}

static void msg_adds(msgbuf *m, const char *p) { msg_add(m, p, strlen(p)); }

static int is_ident(const char *k, size_t n) {
  size_t i;
  if (n == 0 || n > 64) return 0;
  for (i = 0; i < n; i++) {
    unsigned char c = (unsigned char)k[i];
    int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return 0;
  }
  return 1;
}

/* Renders "what.a.b[3][\"odd key\"]" for the value at the given depth.
 * Deep paths keep their root and their last steps. */
static void render_path(const enc *e, int depth, msgbuf *m) {
  int i, skip_from = depth, skip_to = depth;
  char num[32];
  msg_adds(m, e->what);
  if (depth > 24) {
    skip_from = 8;
    skip_to = depth - 12;
  }
  for (i = 0; i < depth; i++) {
    const enc_step *s = &e->path[i];
    if (i == skip_from) {
      msg_adds(m, "...");
      i = skip_to - 1;
      continue;
    }
    if (!s->key) {
      snprintf(num, sizeof num, "[%lld]", (long long)s->index);
      msg_adds(m, num);
    } else if (is_ident(s->key, s->klen)) {
      msg_add(m, ".", 1);
      msg_add(m, s->key, s->klen);
    } else {
      size_t j, n = s->klen > 40 ? 40 : s->klen;
      msg_add(m, "[\"", 2);
      for (j = 0; j < n; j++) {
        unsigned char c = (unsigned char)s->key[j];
        if (c < 0x20 || c == 0x7f || c == '"' || c == '\\') {
          snprintf(num, sizeof num, "\\x%02x", c);
          msg_adds(m, num);
        } else {
          msg_add(m, (const char *)&c, 1);
        }
      }
      if (n < s->klen) msg_adds(m, "...");
      msg_add(m, "\"]", 2);
    }
  }
}

/* "path: reason" as an INVALID_ARGUMENT. */
static int enc_fail(enc *e, int depth, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static int enc_fail(enc *e, int depth, const char *fmt, ...) {
  msgbuf m;
  char reason[256];
  va_list ap;
  m.n = 0;
  m.s[0] = '\0';
  va_start(ap, fmt);
  vsnprintf(reason, sizeof reason, fmt, ap);
  va_end(ap);
  render_path(e, depth, &m);
  msg_adds(&m, ": ");
  msg_adds(&m, reason);
  return es_fail(e->err, ES_INVALID_ARGUMENT, "%s", m.s);
}

static int enc_oom(enc *e) {
  if (e->out->over)
    return es_fail(e->err, ES_TOO_LARGE, "%s is over the limit of %zu bytes", e->what,
                   e->out->max - e->mark);
  return es_fail(e->err, ES_STORAGE, "out of memory while encoding JSON");
}

static int enc_value(enc *e, int idx, int depth);

/* Writes array elements 1..n of the table at idx. */
static int enc_elements(enc *e, int idx, int depth, lua_Integer n) {
  lua_State *L = e->L;
  lua_Integer i;
  int rc;
  esj_putc(e->out, '[');
  e->path[depth].key = NULL;
  for (i = 1; i <= n; i++) {
    if (i > 1) esj_putc(e->out, ',');
    e->path[depth].index = i;
    lua_rawgeti(L, idx, i);
    rc = enc_value(e, lua_gettop(L), depth + 1);
    lua_pop(L, 1);
    if (rc != ES_OK) return rc;
    /* Long arrays of small values: catch running out of memory early. */
    if (e->out->oom) return enc_oom(e);
  }
  esj_putc(e->out, ']');
  return ES_OK;
}

/* A key that can be neither an object key nor an array position (nor, in
 * a marked array, anything but a position). */
static int bad_key(enc *e, int depth, int kidx, int marked) {
  lua_State *L = e->L;
  const char *what = marked ? "array" : "table";
  if (lua_isinteger(L, kidx))
    return enc_fail(e, depth, "%s has integer key %lld (array positions start at 1)", what,
                    (long long)lua_tointeger(L, kidx));
  if (lua_type(L, kidx) == LUA_TNUMBER)
    return enc_fail(e, depth, "%s has float key %.17g", what, (double)lua_tonumber(L, kidx));
  if (marked)
    return enc_fail(e, depth, "array has a %s key (json.array tables take positions 1..n only)",
                    luaL_typename(L, kidx));
  return enc_fail(e, depth, "table has a %s key (keys must be strings, or 1..n for an array)",
                  luaL_typename(L, kidx));
}

static int enc_table(enc *e, int idx, int depth) {
  lua_State *L = e->L;
  es_buf *out = e->out;
  const void *self = lua_topointer(L, idx);
  size_t open_at = out->len, body, base = e->m.len;
  lua_Integer count = 0, max = 0;
  size_t nstr = 0;
  int i, marked = 0, sorted = 1, rc;

  for (i = 0; i < depth; i++)
    if (e->path[i].table == self) {
      msgbuf m;
      m.n = 0;
      m.s[0] = '\0';
      msg_adds(&m, "cycle at ");
      render_path(e, depth, &m);
      return es_fail(e->err, ES_INVALID_ARGUMENT, "%s", m.s);
    }
  if (depth >= ES_JSON_MAX_DEPTH) return enc_fail(e, depth, "nesting deeper than %d", ES_JSON_MAX_DEPTH);
  /* Each level holds at most key, value and a metatable. */
  if (!lua_checkstack(L, 4)) return enc_oom(e);
  e->path[depth].table = self;

  if (e->array_mt && lua_getmetatable(L, idx)) {
    marked = lua_rawequal(L, -1, e->array_mt);
    lua_pop(L, 1);
  }

  if (marked) {
    lua_pushnil(L);
    while (lua_next(L, idx)) {
      lua_Integer k;
      lua_pop(L, 1);
      if (!lua_isinteger(L, -1) || (k = lua_tointeger(L, -1)) < 1) {
        rc = bad_key(e, depth, lua_gettop(L), 1);
        lua_pop(L, 1);
        return rc;
      }
      count++;
      if (k > max) max = k;
    }
    /* Holes encode as null, but (as lua-cjson) an array mostly made of
     * holes is refused rather than blown up into millions of nulls. */
    if (max > 10 && max - count > count)
      return enc_fail(e, depth, "array is too sparse (%lld values, largest index %lld)", (long long)count,
                      (long long)max);
    return enc_elements(e, idx, depth, max);
  }

  /* Unmarked: one pass decides between object and array. Object members
   * are written as they come (in table order) and put in key order at the
   * end, which needs no Lua-side allocation. */
  esj_putc(out, '{');
  body = out->len;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    int kt = lua_type(L, -2);
    if (kt == LUA_TSTRING) {
      esj_member mem;
      size_t bad;
      if (count > 0) goto mixed;
      mem.key = lua_tolstring(L, -2, &mem.klen);
      mem.in_keys = 0;
      mem.koff = 0;
      mem.at = 0;
      e->path[depth].key = mem.key;
      e->path[depth].klen = mem.klen;
      if (nstr) esj_putc(out, ',');
      mem.start = out->len;
      if (esj_write_string(out, mem.key, mem.klen, &bad) != ES_OK) {
        lua_pop(L, 2);
        return enc_fail(e, depth, "a key is not valid UTF-8 (byte %zu)", bad);
      }
      esj_putc(out, ':');
      rc = enc_value(e, lua_gettop(L), depth + 1);
      if (rc != ES_OK) {
        lua_pop(L, 2);
        return rc;
      }
      mem.end = out->len;
      if (sorted && nstr) {
        const esj_member *prev = &e->m.v[e->m.len - 1];
        if (esj_keycmp(prev->key, prev->klen, mem.key, mem.klen) > 0) sorted = 0;
      }
      if (esj_members_push(&e->m, &mem) != ES_OK) {
        lua_pop(L, 2);
        return enc_oom(e);
      }
      nstr++;
    } else if (kt == LUA_TNUMBER && lua_isinteger(L, -2) && lua_tointeger(L, -2) >= 1) {
      lua_Integer k = lua_tointeger(L, -2);
      if (nstr > 0) goto mixed;
      count++;
      if (k > max) max = k;
    } else {
      rc = bad_key(e, depth, lua_gettop(L) - 1, 0);
      lua_pop(L, 2);
      return rc;
    }
    lua_pop(L, 1);
  }

  if (count > 0) {
    if (max != count)
      return enc_fail(e, depth, "table is not a sequence (keys are not exactly 1..n; %lld values, largest index %lld)",
                      (long long)count, (long long)max);
    out->len = open_at; /* take back the '{' */
    return enc_elements(e, idx, depth, max);
  }
  if (!sorted) {
    esj_member *v = e->m.v + base;
    esj_members_sort(v, nstr, NULL);
    if (esj_members_permute(v, nstr, out, body, &e->tmp) != ES_OK) return enc_oom(e);
  }
  e->m.len = base;
  esj_putc(out, '}');
  return ES_OK;

mixed:
  lua_pop(L, 2);
  return enc_fail(e, depth, "table mixes array and object keys");
}

static int enc_value(enc *e, int idx, int depth) {
  lua_State *L = e->L;
  /* Stop at once when the output hit its cap: a value of shared subtables
   * (a DAG) can be exponentially larger than the memory it takes. */
  if (e->out->oom) return enc_oom(e);
  switch (lua_type(L, idx)) {
    case LUA_TNIL:
      esj_put(e->out, "null", 4);
      return ES_OK;
    case LUA_TBOOLEAN:
      if (lua_toboolean(L, idx)) esj_put(e->out, "true", 4);
      else esj_put(e->out, "false", 5);
      return ES_OK;
    case LUA_TNUMBER:
      if (lua_isinteger(L, idx)) {
        esj_write_int(e->out, (int64_t)lua_tointeger(L, idx));
        return ES_OK;
      } else {
        es_err ignored;
        int rc = es_json_format_double((double)lua_tonumber(L, idx), e->out, &ignored);
        if (rc == ES_INVALID_ARGUMENT) return enc_fail(e, depth, "NaN and infinity cannot be encoded");
        return rc == ES_OK ? ES_OK : enc_oom(e);
      }
    case LUA_TSTRING: {
      size_t n, bad;
      const char *s = lua_tolstring(L, idx, &n);
      if (esj_write_string(e->out, s, n, &bad) != ES_OK)
        return enc_fail(e, depth, "string is not valid UTF-8 (byte %zu)", bad);
      return ES_OK;
    }
    case LUA_TTABLE:
      return enc_table(e, idx, depth);
    case LUA_TLIGHTUSERDATA:
      if (es_json_is_null(L, idx)) {
        esj_put(e->out, "null", 4);
        return ES_OK;
      }
      return enc_fail(e, depth, "cannot encode a light userdata (only json.null)");
    default:
      return enc_fail(e, depth, "cannot encode a %s", luaL_typename(L, idx));
  }
}

int es_json_encode_lua(lua_State *L, int idx, const char *what, es_buf *out, es_err *err) {
  enc box, *e = &box; /* ~16 KiB, mostly the path: fine on any thread's stack */
  size_t mark = out->len;
  int top = lua_gettop(L), rc;
  idx = lua_absindex(L, idx);
  e->L = L;
  e->out = out;
  e->mark = mark;
  e->err = err;
  e->what = what ? what : "value";
  esj_member local[ESJ_LOCAL_MEMBERS];
  esj_members_init(&e->m, local, ESJ_LOCAL_MEMBERS);
  es_buf_init(&e->tmp);
  if (!lua_checkstack(L, 6)) return es_fail(err, ES_STORAGE, "out of memory while encoding JSON");
  e->array_mt = 0;
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &array_mt_key) == LUA_TTABLE) e->array_mt = lua_gettop(L);
  rc = enc_value(e, idx, 0);
  if (out->oom) rc = enc_oom(e);
  if (rc != ES_OK) out->len = mark;
  if (out->over) out->oom = out->over = 0; /* a size limit, not a broken buffer */
  lua_settop(L, top);
  esj_members_destroy(&e->m);
  es_buf_destroy(&e->tmp);
  return rc;
}

/* Decoder ------------------------------------------------------------------ */

/* Straight from text to Lua values (no intermediate tree), recursive
 * descent. Tables are made once their size is known: the members (key,
 * value pairs) of an object or the elements of an array are pushed on the
 * Lua stack first, up to DEC_BATCH of them, and the table is then created
 * with room for all of them and filled. A table grown one key at a time is
 * rehashed at every power of two (1, 2, 4, ... slots): for a typical
 * payload of small objects that cost more than the parsing. Longer objects
 * and arrays go into their table every DEC_BATCH members (it then grows as
 * Lua tables do). Stack use per nesting level is bounded (DEC_SLOTS), so
 * ES_JSON_MAX_DEPTH levels stay far below Lua's stack limit. */
#define DEC_BATCH 16
#define DEC_SLOTS (2 * DEC_BATCH + 4)

/* The string cache of the raising decoder. A list of events repeats the
 * same object keys ("customer", "items", "qty", ...) and often the same
 * short values in every payload; lua_pushlstring hashes each one and looks
 * it up in Lua's string table (about 200 instructions each, 8 per payload
 * of the benches). The cache has DEC_CACHE slots, a slot chosen by the
 * length and three bytes: the Lua strings sit in a table (the decoder's
 * user value), a copy of their bytes on the C side. A string whose bytes
 * equal its slot's copy is pushed from the table (lua_rawgeti); else it is
 * pushed as before and takes the slot. The bytes are compared with the C
 * copy, never read through a pointer into a Lua string, so no Lua code
 * (debug.setuservalue included) can make the decoder read freed memory.
 * Only short strings: Lua interns them (up to 40 bytes, LUAI_MAXSHORTLEN),
 * so a hit pushes the very value lua_pushlstring would. */
#define DEC_CACHE 64
#define DEC_CACHE_MAXLEN 40

typedef struct dec_slot {
  unsigned char len; /* 0: empty */
  char bytes[DEC_CACHE_MAXLEN];
} dec_slot;

typedef struct dec {
  esj_parser P;
  es_buf str;   /* owned: decoded strings that had escapes */
  int array_mt; /* stack index of the array metatable */
  int cache;    /* stack index of the string cache's table; 0: no cache */
  int rc;       /* the parse result, read after lua_pcall */
  dec_slot *slots; /* with a cache: DEC_CACHE slots (the raising decoder's) */
} dec;

static int dec_value(lua_State *L, dec *d, int depth);

static void dec_push_string(lua_State *L, dec *d, const char *s, size_t n) {
  if (d->cache && n > 0 && n <= DEC_CACHE_MAXLEN) {
    const unsigned char *u = (const unsigned char *)s;
    unsigned h = (unsigned)n;
    h = (h * 33u) ^ u[0];
    h = (h * 33u) ^ u[n / 2];
    h = (h * 33u) ^ u[n - 1];
    h = (h ^ (h >> 6)) & (DEC_CACHE - 1);
    dec_slot *slot = &d->slots[h];
    if (slot->len == n && memcmp(slot->bytes, s, n) == 0) {
      if (lua_rawgeti(L, d->cache, (lua_Integer)h + 1) == LUA_TSTRING) return;
      lua_pop(L, 1); /* the table was changed behind the decoder's back */
    }
    lua_pushlstring(L, s, n);
    lua_pushvalue(L, -1);
    lua_rawseti(L, d->cache, (lua_Integer)h + 1);
    memcpy(slot->bytes, s, n);
    slot->len = (unsigned char)n;
    return;
  }
  lua_pushlstring(L, s, n);
}

/* Duplicate keys. Canonical text (every stored payload) has its keys in
 * strictly increasing byte order, which proves them distinct, so each key
 * is only compared with the one before it. At the first key out of order
 * the members so far go into the table and every later key is looked up
 * there before it is set. Like the C face, a duplicate key is reported
 * when the object closes, at the first repeat in input order, so both
 * faces give the same message for the same text (an earlier syntax error
 * wins in both). */
static int dec_object(lua_State *L, dec *d, int depth) {
  esj_parser *P = &d->P;
  const unsigned char *dup_at = NULL;
  char dup_key[ESJ_KEY_DESC];
  const char *prev = NULL; /* the previous key (a Lua string on the stack or in the table) */
  size_t prevn = 0;
  int t, pending = 0, made = 0, probing = 0, rc, more;
  P->p++; /* '{' */
  lua_pushnil(L); /* the table's slot */
  t = lua_gettop(L);
  esj_skip_ws(P);
  if (P->p < P->end && *P->p == '}') {
    P->p++;
    lua_createtable(L, 0, 0);
    lua_replace(L, t);
    return ES_OK;
  }
  for (;;) {
    const char *k;
    size_t kn;
    int copied;
    const unsigned char *at = P->p;
    if (P->p >= P->end || *P->p != '"') return esj_fail_unexpected(P, "a string key");
    if ((rc = esj_parse_string(P, &d->str, &k, &kn, &copied)) != ES_OK) return rc;
    if (!probing && prev && esj_keycmp(prev, prevn, k, kn) >= 0) {
      if (!made) {
        lua_createtable(L, 0, pending + 1);
        lua_replace(L, t);
        made = 1;
      }
      for (; pending > 0; pending--) lua_rawset(L, t);
      probing = 1;
    }
    dec_push_string(L, d, k, kn);
    d->str.len = 0;
    if (!probing) {
      prev = lua_tolstring(L, -1, &prevn);
    } else if (!dup_at) {
      lua_pushvalue(L, -1);
      if (lua_rawget(L, t) != LUA_TNIL) {
        size_t dn;
        const char *dk = lua_tolstring(L, -2, &dn);
        dup_at = at;
        esj_describe_key(dup_key, sizeof dup_key, dk, dn);
      }
      lua_pop(L, 1);
    }
    esj_skip_ws(P);
    if (P->p >= P->end || *P->p != ':') return esj_fail_unexpected(P, "':'");
    P->p++;
    if ((rc = dec_value(L, d, depth)) != ES_OK) return rc;
    if (probing) {
      lua_rawset(L, t);
    } else if (++pending == DEC_BATCH) {
      if (!made) {
        lua_createtable(L, 0, DEC_BATCH);
        lua_replace(L, t);
        made = 1;
      }
      for (; pending > 0; pending--) lua_rawset(L, t);
    }
    if ((rc = esj_next_element(P, '}', &more)) != ES_OK) return rc;
    if (!more) break;
  }
  if (!made) {
    lua_createtable(L, 0, pending);
    lua_replace(L, t);
  }
  for (; pending > 0; pending--) lua_rawset(L, t);
  if (dup_at) return esj_fail(P, dup_at, "duplicate object key \"%s\"", dup_key);
  return ES_OK;
}

/* Moves the pending elements on top of the stack into the array at t
 * (made here, sized for them, when it does not exist yet), after the n
 * already there. */
static void dec_flush_elements(lua_State *L, dec *d, int t, int *made, lua_Integer *n, int pending) {
  if (!*made) {
    lua_createtable(L, pending, 0);
    lua_pushvalue(L, d->array_mt);
    lua_setmetatable(L, -2);
    lua_replace(L, t);
    *made = 1;
  }
  for (int i = pending; i > 0; i--) lua_rawseti(L, t, *n + i);
  *n += pending;
}

static int dec_array(lua_State *L, dec *d, int depth) {
  esj_parser *P = &d->P;
  lua_Integer n = 0;
  int t, pending = 0, made = 0, rc, more;
  P->p++; /* '[' */
  lua_pushnil(L); /* the table's slot */
  t = lua_gettop(L);
  esj_skip_ws(P);
  if (P->p < P->end && *P->p == ']') {
    P->p++;
    dec_flush_elements(L, d, t, &made, &n, 0);
    return ES_OK;
  }
  for (;;) {
    if ((rc = dec_value(L, d, depth)) != ES_OK) return rc;
    if (++pending == DEC_BATCH) {
      dec_flush_elements(L, d, t, &made, &n, pending);
      pending = 0;
    }
    if ((rc = esj_next_element(P, ']', &more)) != ES_OK) return rc;
    if (!more) break;
  }
  dec_flush_elements(L, d, t, &made, &n, pending);
  return ES_OK;
}

/* Pushes one value (exactly one slot on success; on failure the stack
 * holds whatever the caller discards). */
static int dec_value(lua_State *L, dec *d, int depth) {
  esj_parser *P = &d->P;
  int rc;
  esj_skip_ws(P);
  if (P->p >= P->end) return esj_fail_unexpected(P, "a JSON value");
  switch (*P->p) {
    case '{':
    case '[':
      if (depth >= ES_JSON_MAX_DEPTH) return esj_fail(P, P->p, "nesting deeper than %d", ES_JSON_MAX_DEPTH);
      /* the table's slot, the pending members, a key and a value, and a
       * spare for the duplicate-key probe or the string cache */
      luaL_checkstack(L, DEC_SLOTS, "JSON nesting");
      return *P->p == '{' ? dec_object(L, d, depth + 1) : dec_array(L, d, depth + 1);
    case '"': {
      const char *s;
      size_t n;
      int copied;
      if ((rc = esj_parse_string(P, &d->str, &s, &n, &copied)) != ES_OK) return rc;
      dec_push_string(L, d, s, n);
      d->str.len = 0;
      return ES_OK;
    }
    case 't':
      if ((rc = esj_parse_word(P, "true", 4)) == ES_OK) lua_pushboolean(L, 1);
      return rc;
    case 'f':
      if ((rc = esj_parse_word(P, "false", 5)) == ES_OK) lua_pushboolean(L, 0);
      return rc;
    case 'n':
      if ((rc = esj_parse_word(P, "null", 4)) != ES_OK) return rc;
      if (depth == 0) lua_pushnil(L);
      else es_json_push_null(L);
      return ES_OK;
    default: {
      esj_number num;
      if (*P->p != '-' && !(*P->p >= '0' && *P->p <= '9')) return esj_fail_unexpected(P, "a JSON value");
      if ((rc = esj_parse_number(P, &num)) != ES_OK) return rc;
      if (num.is_int) lua_pushinteger(L, (lua_Integer)num.i);
      else lua_pushnumber(L, (lua_Number)num.d);
      return ES_OK;
    }
  }
}

/* The whole text: one value, then nothing but white space. Pushes the
 * value above the array metatable, which the caller pushed at d->array_mt. */
static int dec_text(lua_State *L, dec *d) {
  int rc = dec_value(L, d, 0);
  if (rc == ES_OK) {
    esj_skip_ws(&d->P);
    if (d->P.p < d->P.end) rc = esj_fail(&d->P, d->P.p, "trailing characters after the JSON value");
  }
  return rc;
}

/* Runs under lua_pcall so that Lua's memory errors unwind to
 * es_json_decode_lua instead of past C code holding buffers. */
static int dec_protected(lua_State *L) {
  dec *d = lua_touserdata(L, 1);
  lua_settop(L, 0);
  push_array_mt(L);
  d->array_mt = 1;
  d->cache = 0;
  d->rc = dec_text(L, d);
  return d->rc == ES_OK ? 1 : 0;
}

int es_json_decode_lua(lua_State *L, const char *text, size_t len, es_err *err) {
  dec d;
  int status;
  if (!lua_checkstack(L, 3)) return es_fail(err, ES_STORAGE, "out of memory while decoding JSON");
  esj_parser_init(&d.P, text ? text : "", text ? len : 0, err);
  es_buf_init(&d.str);
  d.rc = ES_OK;
  lua_pushcfunction(L, dec_protected);
  lua_pushlightuserdata(L, &d);
  status = lua_pcall(L, 1, 1, 0);
  if (status != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    d.rc = es_fail(err, ES_STORAGE, "%s while decoding JSON",
                   status == LUA_ERRMEM ? "out of memory" : (msg ? msg : "Lua error"));
    lua_pop(L, 1);
  } else if (d.rc != ES_OK) {
    lua_pop(L, 1);
  }
  esj_parser_destroy(&d.P);
  es_buf_destroy(&d.str);
  return d.rc;
}

/* The raising decoder (json.h): the parser and its scratch buffers live in
 * a userdata, so that a Lua error anywhere in a decode (out of memory, a
 * budget) leaves them owned by something the collector frees. Its user
 * value is the string cache (DEC_CACHE slots, then the array metatable at
 * DEC_CACHE + 1, which saves a registry lookup per text). */
struct es_json_decoder {
  dec d;
  dec_slot slots[DEC_CACHE]; /* the string cache's bytes */
  lua_State *L; /* where it was pushed, and at which stack index: the */
  int idx;      /* cache is used while it is still found there */
  void *ud;     /* its userdata: the box's block, which starts before jd */
};

static void decoder_release(void *box) {
  es_json_decoder *jd = box;
  esj_parser_destroy(&jd->d.P);
  es_buf_destroy(&jd->d.str);
}

es_json_decoder *es_json_decoder_push(lua_State *L) {
  luaL_checkstack(L, 3, "JSON decoder");
  es_json_decoder *jd = es_lua_push_box(L, sizeof *jd, 1, decoder_release);
  esj_parser_init(&jd->d.P, "", 0, NULL);
  es_buf_init(&jd->d.str);
  lua_createtable(L, DEC_CACHE + 1, 0);
  push_array_mt(L);
  lua_rawseti(L, -2, DEC_CACHE + 1);
  lua_setiuservalue(L, -2, 1);
  jd->d.slots = jd->slots;
  jd->L = L;
  jd->idx = lua_gettop(L);
  jd->ud = lua_touserdata(L, -1);
  return jd;
}

void es_json_decoder_decode(lua_State *L, es_json_decoder *jd, const char *text, size_t len) {
  dec *d = &jd->d;
  es_err err;
  int rc;
  /* The scratch buffers are kept between calls; a sticky out-of-memory
   * mark of an earlier call must not fail this one. */
  if (d->str.oom) es_buf_destroy(&d->str);
  if (d->P.num.oom) es_buf_destroy(&d->P.num);
  d->str.len = 0;
  d->P.start = d->P.p = (const unsigned char *)(text ? text : "");
  d->P.end = d->P.start + (text ? len : 0);
  d->P.err = &err;
  luaL_checkstack(L, 4, "JSON decode");
  /* The cache only while the decoder is where it was pushed (json.h asks
   * callers to keep it on the stack, not at one index): a check costs a
   * few instructions, a lookup for it would cost more than it saves. */
  if (L == jd->L && jd->idx <= lua_gettop(L) && lua_touserdata(L, jd->idx) == jd->ud)
    lua_getiuservalue(L, jd->idx, 1);
  else
    lua_pushnil(L);
  d->cache = 0;
  if (lua_type(L, -1) == LUA_TTABLE) {
    d->cache = lua_gettop(L);
    if (lua_rawgeti(L, d->cache, DEC_CACHE + 1) != LUA_TTABLE) {
      lua_pop(L, 1);
      push_array_mt(L);
    }
  } else {
    push_array_mt(L);
  }
  d->array_mt = lua_gettop(L); /* the cache (or nil) just below it */
  rc = dec_text(L, d);
  d->P.err = NULL;
  if (rc != ES_OK) {
    lua_settop(L, d->array_mt - 2);
    es_lua_raise(L, &err);
  }
  lua_copy(L, -1, d->array_mt - 1); /* the value where the cache was */
  lua_settop(L, d->array_mt - 1);
}

/* The module -------------------------------------------------------------- */

static int l_encode(lua_State *L) {
  luaL_checkany(L, 1);
  lua_settop(L, 1);
  return es_lua_encode_arg(L, es_json_encode_lua, "value");
}

static int l_decode(lua_State *L) { return es_lua_decode_arg(L, es_json_decode_lua); }

static int l_array(lua_State *L) {
  if (lua_isnoneornil(L, 1)) {
    lua_settop(L, 0);
    lua_createtable(L, 0, 0);
  } else {
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_settop(L, 1);
  }
  push_array_mt(L);
  if (lua_getmetatable(L, 1)) {
    /* Replacing another metatable would silently strip the table's class. */
    if (!lua_rawequal(L, -1, -2)) return luaL_argerror(L, 1, "table already has a metatable");
    lua_pop(L, 1);
  }
  lua_setmetatable(L, 1);
  return 1;
}

static int l_is_array(lua_State *L) {
  int yes = 0;
  if (lua_type(L, 1) == LUA_TTABLE && lua_getmetatable(L, 1)) {
    push_array_mt(L);
    yes = lua_rawequal(L, -1, -2);
  }
  lua_pushboolean(L, yes);
  return 1;
}

void es_json_push_module(lua_State *L) {
  static const luaL_Reg funcs[] = {
      {"encode", l_encode},
      {"decode", l_decode},
      {"array", l_array},
      {"is_array", l_is_array},
      {NULL, NULL},
  };
  luaL_newlib(L, funcs);
  es_json_push_null(L);
  lua_setfield(L, -2, "null");
  /* Create the metatable now, so that arrays marked by json.array are
   * recognised by encoders that only look it up. */
  push_array_mt(L);
  lua_pop(L, 1);
}
