/*
 * bridge/state.c: the exact reducer-state codec of bridge/state.h (Lua value <->
 * canonical bytes) and its test-facing module table {encode, decode}.
 *
 * Format (docs/state-codec.md): a version byte, then one value. A value is
 * a tag byte and its payload; integers and floats are little-endian and
 * fixed-width, lengths and counts are LEB128 varints. A table is its
 * "array part" (the values at 1..n for the largest n with no hole) followed
 * by every other key/value pair, sorted by the bytes of the encoded key.
 *
 * Canonical on purpose: the encoder picks the one encoding of a value
 * (smallest integer width, minimal varints, maximal array part, sorted
 * keys) and the decoder refuses every other one. That makes snapshots of
 * equal states equal byte for byte, and makes the decoder's strictness
 * testable: decode(b) succeeds only if encode(decode(b)) == b.
 *
 * Neither direction raises a Lua error (callers hold C memory): the encoder
 * allocates nothing on the Lua side while it walks tables (only C memory,
 * released on every path) and the decoder, which must create Lua values,
 * runs under lua_pcall.
 */
#include <lauxlib.h>
#include <lua.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/json.h"
#include "bridge/json_lua.h"
#include "bridge/common.h"
#include "bridge/state.h"

/* The format stores 8-byte integers and IEEE-754 doubles: a Lua built with
 * other number types would need another format version. */
_Static_assert(sizeof(lua_Integer) == 8, "the state codec needs 64-bit lua_Integer");
_Static_assert(sizeof(lua_Number) == 8, "the state codec needs double lua_Number");

/* Tags. Their numeric order is also the first criterion of the key order,
 * so changing them is a format change (bump ES_STATE_FORMAT_VERSION). */
enum {
  T_NIL = 0x00,   /* only as the whole value: tables cannot hold nil */
  T_FALSE = 0x01,
  T_TRUE = 0x02,
  T_NULL = 0x03,  /* json.null */
  T_INT8 = 0x04,  /* then 1 byte, two's complement */
  T_INT16 = 0x05, /* then 2 bytes LE; only for values outside int8 */
  T_INT32 = 0x06, /* then 4 bytes LE; only for values outside int16 */
  T_INT64 = 0x07, /* then 8 bytes LE; only for values outside int32 */
  T_FLOAT = 0x08, /* then the 8 bytes LE of the IEEE-754 double, bit for bit */
  T_STRING = 0x09, /* then varint length, then the bytes */
  T_TABLE = 0x0a, /* then varint narr, varint nhash, narr values, nhash key/value pairs */
  T_ARRAY = 0x0b  /* the same, for a table carrying the json array mark */
};

/* A varint of a 64-bit value takes at most 10 bytes. */
#define VARINT_MAX 10

/* Pushes L's json array metatable (creating it if needed). json.h offers
 * no accessor (its registry key is private to bridge/json_lua.c), but every
 * decoded JSON array carries it, so decoding "[]" reaches it through the
 * public API. es_json_decode_lua runs protected: this never raises. Needs
 * two free stack slots. */
static int push_array_mt(lua_State *L, es_err *err) {
  es_err jerr;
  if (es_json_decode_lua(L, "[]", 2, &jerr) != ES_OK)
    return es_fail(err, ES_STORAGE, "cannot reach the json array metatable: %s", jerr.msg);
  if (!lua_getmetatable(L, -1)) {
    lua_pop(L, 1);
    return es_fail(err, ES_STORAGE, "json arrays carry no metatable");
  }
  lua_remove(L, -2);
  return ES_OK;
}

/* Byte writers (es_buf's out-of-memory flag is sticky: checked at the end
 * and at every table element, not after each append). */

static void put_u8(es_buf *b, unsigned v) { es_buf_addc(b, (char)(unsigned char)v); }

static void put_le(es_buf *b, uint64_t v, int n) {
  unsigned char s[8];
  int i;
  for (i = 0; i < n; i++) s[i] = (unsigned char)(v >> (8 * i));
  es_buf_add(b, s, (size_t)n);
}

static void put_varint(es_buf *b, uint64_t v) {
  unsigned char s[VARINT_MAX];
  int n = 0;
  do {
    s[n] = (unsigned char)(v & 0x7f);
    v >>= 7;
    if (v) s[n] |= 0x80;
    n++;
  } while (v);
  es_buf_add(b, s, (size_t)n);
}

static void put_int(es_buf *b, lua_Integer i) {
  uint64_t u = (uint64_t)i; /* two's complement bits, well defined */
  if (i >= INT8_MIN && i <= INT8_MAX) {
    put_u8(b, T_INT8);
    put_le(b, u, 1);
  } else if (i >= INT16_MIN && i <= INT16_MAX) {
    put_u8(b, T_INT16);
    put_le(b, u, 2);
  } else if (i >= INT32_MIN && i <= INT32_MAX) {
    put_u8(b, T_INT32);
    put_le(b, u, 4);
  } else {
    put_u8(b, T_INT64);
    put_le(b, u, 8);
  }
}

static void put_float(es_buf *b, lua_Number d) {
  uint64_t bits;
  memcpy(&bits, &d, sizeof bits); /* keeps NaN payloads and -0.0 */
  put_u8(b, T_FLOAT);
  put_le(b, bits, 8);
}

/* The key order: bytewise on the encodings. Encodings are prefix-free, so
 * two distinct keys never tie on their common length. */
static int keycmp(const unsigned char *a, size_t an, const unsigned char *b, size_t bn) {
  int c = memcmp(a, b, an < bn ? an : bn);
  if (c) return c;
  return an < bn ? -1 : an > bn;
}

/* Error messages ----------------------------------------------------------- */

/* A fixed message buffer that truncates at cap - 1 characters. */
typedef struct msgbuf {
  char s[ES_ERRMSG_MAX];
  size_t n, cap;
} msgbuf;

static void msg_init(msgbuf *m, size_t cap) {
  m->n = 0;
  m->cap = cap > sizeof m->s ? sizeof m->s : cap;
  m->s[0] = '\0';
}

static void msg_add(msgbuf *m, const char *p, size_t n) {
  size_t room = m->cap - 1 - m->n;
  if (n > room) n = room;
  memcpy(m->s + m->n, p, n);
  m->n += n;
  m->s[m->n] = '\0';
}

static void msg_adds(msgbuf *m, const char *p) { msg_add(m, p, strlen(p)); }

/* Encoder ------------------------------------------------------------------ */

enum { K_INDEX, K_STRING, K_FLOAT, K_TRUE, K_FALSE, K_NULL };

/* How the encoder went from the table at one depth to the value below it. */
typedef struct step {
  const void *table; /* that table, for cycle detection */
  int kind;          /* K_*: how the key renders in a path */
  const char *s;     /* K_STRING: borrowed Lua string, kept alive by the table */
  size_t n;
  lua_Integer i;     /* K_INDEX: an integer key (array part or not) */
  lua_Number f;      /* K_FLOAT */
} step;

/* One key/value pair of a table being written: key bytes [start, kend),
 * value bytes [kend, end) of the output buffer. */
typedef struct entry {
  size_t start, kend, end;
  uint64_t prefix; /* the key's first 8 bytes, big-endian, zero-padded: most
                      comparisons end here, without touching the buffer */
} entry;

typedef struct enc {
  lua_State *L;
  es_buf *out;
  es_err *err;
  const char *what;
  int array_mt;  /* stack index of the json array metatable; 0 when not fetched */
  entry *ents;   /* owned: the pairs of every table being written, innermost last */
  size_t nents, capents;
  entry *scratch; /* owned: merge sort scratch */
  size_t capscratch;
  es_buf tmp;    /* owned: scratch for putting pairs in key order */
  step path[ES_STATE_MAX_DEPTH];
} enc;

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

static void render_step(const step *s, msgbuf *m) {
  char num[48];
  switch (s->kind) {
    case K_INDEX:
      snprintf(num, sizeof num, "[%lld]", (long long)s->i);
      msg_adds(m, num);
      break;
    case K_FLOAT: {
      /* The shortest form that reads back exactly: [0.1], not [0.10000000000000001]. */
      int prec;
      for (prec = 15; prec < 17; prec++) {
        snprintf(num, sizeof num, "%.*g", prec, (double)s->f);
        if (strtod(num, NULL) == s->f) break;
      }
      snprintf(num, sizeof num, "[%.*g]", prec, (double)s->f);
      msg_adds(m, num);
      break;
    }
    case K_TRUE: msg_adds(m, "[true]"); break;
    case K_FALSE: msg_adds(m, "[false]"); break;
    case K_NULL: msg_adds(m, "[json.null]"); break;
    default:
      if (is_ident(s->s, s->n)) {
        msg_add(m, ".", 1);
        msg_add(m, s->s, s->n);
      } else {
        /* Quoted, shortened, control bytes and quotes escaped: the key may
         * be binary and the message must stay one readable line. */
        size_t j, n = s->n > 40 ? 40 : s->n;
        msg_add(m, "[\"", 2);
        for (j = 0; j < n; j++) {
          unsigned char c = (unsigned char)s->s[j];
          if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\') {
            snprintf(num, sizeof num, "\\x%02x", c);
            msg_adds(m, num);
          } else {
            msg_add(m, (const char *)&c, 1);
          }
        }
        if (n < s->n) msg_adds(m, "...");
        msg_add(m, "\"]", 2);
      }
  }
}

/* Renders "what.a.b[3]" for the value at the given depth, within m's
 * capacity. A path too long for it keeps its root, a few first steps and
 * as many last steps as fit (the end is where the offending value is). */
static void render_path(const enc *e, int depth, msgbuf *m) {
  size_t lens[ES_STATE_MAX_DEPTH], total = 0, tail_len = 0, limit = m->cap - 1;
  msgbuf one;
  int i, head = 0, tail = depth, cut;
  for (i = 0; i < depth; i++) {
    msg_init(&one, 200);
    render_step(&e->path[i], &one);
    lens[i] = one.n;
    total += one.n;
  }
  msg_adds(m, e->what);
  cut = m->n + total > limit;
  if (cut) {
    while (head < depth && head < 8 && m->n + lens[head] <= limit / 3) render_step(&e->path[head++], m);
    while (tail > head && m->n + 3 + tail_len + lens[tail - 1] <= limit) tail_len += lens[--tail];
    if (tail == depth && depth > head) tail--; /* at least the last step, even cut */
    if (tail > head) msg_adds(m, "...");
  }
  for (i = cut ? tail : 0; i < depth; i++) render_step(&e->path[i], m);
}

/* "path: reason" as INVALID_ARGUMENT. The reason is sized first so that a
 * long path is what gets truncated, never the reason. */
static int enc_fail(enc *e, int depth, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static int enc_fail(enc *e, int depth, const char *fmt, ...) {
  char reason[300];
  msgbuf m;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(reason, sizeof reason, fmt, ap);
  va_end(ap);
  msg_init(&m, ES_ERRMSG_MAX - strlen(reason) - 2);
  render_path(e, depth, &m);
  return es_fail(e->err, ES_INVALID_ARGUMENT, "%s: %s", m.s, reason);
}

static int enc_oom(enc *e) { return es_fail(e->err, ES_STORAGE, "out of memory while encoding state"); }

/* Records the key at stack index kidx as path step `depth`. The caller has
 * checked that it is a key the format can hold. */
static void set_step_key(enc *e, int depth, int kidx) {
  lua_State *L = e->L;
  step *s = &e->path[depth];
  switch (lua_type(L, kidx)) {
    case LUA_TSTRING:
      s->kind = K_STRING;
      s->s = lua_tolstring(L, kidx, &s->n); /* a string: no conversion, no allocation */
      break;
    case LUA_TNUMBER:
      if (lua_isinteger(L, kidx)) {
        s->kind = K_INDEX;
        s->i = lua_tointeger(L, kidx);
      } else {
        s->kind = K_FLOAT;
        s->f = lua_tonumber(L, kidx);
      }
      break;
    case LUA_TBOOLEAN: s->kind = lua_toboolean(L, kidx) ? K_TRUE : K_FALSE; break;
    default: s->kind = K_NULL; break;
  }
}

static int enc_value(enc *e, int idx, int depth);

static int push_entry(enc *e, const entry *en) {
  if (e->nents == e->capents) {
    size_t cap = e->capents ? e->capents * 2 : 64;
    entry *v = cap > SIZE_MAX / sizeof *v ? NULL : realloc(e->ents, cap * sizeof *v);
    if (!v) return ES_STORAGE;
    e->ents = v;
    e->capents = cap;
  }
  e->ents[e->nents++] = *en;
  return ES_OK;
}

/* Orders pairs by their key bytes; the prefix decides unless the first 8
 * bytes are equal. */
static int entry_cmp(const char *base, const entry *a, const entry *b) {
  if (a->prefix != b->prefix) return a->prefix < b->prefix ? -1 : 1;
  return keycmp((const unsigned char *)base + a->start, a->kend - a->start, (const unsigned char *)base + b->start,
                b->kend - b->start);
}

static uint64_t key_prefix(const es_buf *out, size_t start, size_t kend) {
  uint64_t p = 0;
  size_t i;
  for (i = 0; i < 8; i++) p = (p << 8) | (start + i < kend ? (unsigned char)out->data[start + i] : 0);
  return p;
}

/* Sorts v[0..n): insertion sort for the small tables that are the common
 * case, else a bottom-up merge sort (sequential access, n log n compares;
 * qsort has no context argument to reach the buffer). */
static int sort_entries(enc *e, entry *v, size_t n) {
  const char *base = e->out->data;
  size_t i, j, w;
  entry *a = v, *b;
  if (n <= 16) {
    for (i = 1; i < n; i++) {
      entry x = v[i];
      for (j = i; j > 0 && entry_cmp(base, &v[j - 1], &x) > 0; j--) v[j] = v[j - 1];
      v[j] = x;
    }
    return ES_OK;
  }
  if (e->capscratch < n) {
    entry *t = n > SIZE_MAX / sizeof *t ? NULL : realloc(e->scratch, n * sizeof *t);
    if (!t) return ES_STORAGE;
    e->scratch = t;
    e->capscratch = n;
  }
  b = e->scratch;
  for (w = 1; w < n; w *= 2) {
    for (i = 0; i < n; i += 2 * w) {
      size_t lo = i, mid = i + w < n ? i + w : n, hi = i + 2 * w < n ? i + 2 * w : n, l = lo, r = mid, k = lo;
      while (l < mid && r < hi) b[k++] = entry_cmp(base, &a[r], &a[l]) < 0 ? a[r++] : a[l++];
      while (l < mid) b[k++] = a[l++];
      while (r < hi) b[k++] = a[r++];
    }
    {
      entry *t = a;
      a = b;
      b = t;
    }
  }
  if (a != v) memcpy(v, a, n * sizeof *v);
  return ES_OK;
}

/* Rewrites the pairs (contiguous in the output, in the order they were
 * written) in key order. */
static int order_entries(enc *e, size_t base) {
  entry *v = e->ents + base;
  size_t n = e->nents - base, i, from = v[0].start, to = v[n - 1].end;
  if (sort_entries(e, v, n) != ES_OK) return ES_STORAGE;
  e->tmp.len = 0;
  for (i = 0; i < n; i++) es_buf_add(&e->tmp, e->out->data + v[i].start, v[i].end - v[i].start);
  if (e->tmp.oom) return ES_STORAGE;
  memcpy(e->out->data + from, e->tmp.data, to - from);
  return ES_OK;
}

/* Writes the table at idx (an absolute index). */
static int enc_table(enc *e, int idx, int depth) {
  lua_State *L = e->L;
  es_buf *out = e->out;
  const void *self = lua_topointer(L, idx);
  size_t total = 0, narr = 0, base = e->nents, i;
  int d, marked = 0, sorted = 1, rc;

  for (d = 0; d < depth; d++)
    if (e->path[d].table == self) {
      msgbuf anc;
      msg_init(&anc, 200);
      render_path(e, d, &anc);
      return enc_fail(e, depth, "cycle: this table is also its ancestor %s", anc.s);
    }
  if (depth >= ES_STATE_MAX_DEPTH) return enc_fail(e, depth, "tables nested deeper than %d", ES_STATE_MAX_DEPTH);
  /* Each level holds at most a key, a value and a metatable. */
  if (!lua_checkstack(L, 4)) return enc_oom(e);
  if (lua_getmetatable(L, idx)) {
    marked = e->array_mt && lua_rawequal(L, -1, e->array_mt);
    lua_pop(L, 1);
    if (!marked)
      return enc_fail(e, depth, "table has a metatable (only the json array mark can be kept; "
                                "a class or proxy would not survive the round trip)");
  }
  e->path[depth].table = self;

  /* The header gives both counts before the contents: count first. */
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    total++;
  }
  while (lua_rawgeti(L, idx, (lua_Integer)narr + 1) != LUA_TNIL) {
    lua_pop(L, 1);
    narr++;
  }
  lua_pop(L, 1);
  put_u8(out, marked ? T_ARRAY : T_TABLE);
  put_varint(out, narr);
  put_varint(out, total - narr);

  for (i = 1; i <= narr; i++) {
    e->path[depth].kind = K_INDEX;
    e->path[depth].i = (lua_Integer)i;
    lua_rawgeti(L, idx, (lua_Integer)i);
    rc = enc_value(e, lua_gettop(L), depth + 1);
    lua_pop(L, 1);
    if (rc != ES_OK) return rc;
    /* Long tables of small values: notice running out of memory early. */
    if (out->oom) return enc_oom(e);
  }

  lua_pushnil(L);
  while (lua_next(L, idx)) {
    int kt = lua_type(L, -2);
    entry en;
    if (kt == LUA_TNUMBER && lua_isinteger(L, -2)) {
      lua_Integer k = lua_tointeger(L, -2);
      if (k >= 1 && (uint64_t)k <= narr) { /* written in the array part */
        lua_pop(L, 1);
        continue;
      }
    }
    en.start = out->len;
    switch (kt) {
      case LUA_TNUMBER:
        if (lua_isinteger(L, -2)) put_int(out, lua_tointeger(L, -2));
        else put_float(out, lua_tonumber(L, -2)); /* never NaN nor integral: Lua normalises keys */
        break;
      case LUA_TSTRING: {
        size_t n;
        const char *s = lua_tolstring(L, -2, &n);
        put_u8(out, T_STRING);
        put_varint(out, n);
        es_buf_add(out, s, n);
        break;
      }
      case LUA_TBOOLEAN: put_u8(out, lua_toboolean(L, -2) ? T_TRUE : T_FALSE); break;
      case LUA_TLIGHTUSERDATA:
        if (es_json_is_null(L, -2)) {
          put_u8(out, T_NULL);
          break;
        }
        lua_pop(L, 2);
        return enc_fail(e, depth, "table has a light userdata key (only json.null can be a key)");
      default: {
        const char *tn = luaL_typename(L, -2);
        lua_pop(L, 2);
        return enc_fail(e, depth, "table has a %s key (keys must be numbers, strings, booleans or json.null)", tn);
      }
    }
    en.kend = out->len;
    set_step_key(e, depth, lua_gettop(L) - 1);
    rc = enc_value(e, lua_gettop(L), depth + 1);
    if (rc != ES_OK) {
      lua_pop(L, 2);
      return rc;
    }
    en.end = out->len;
    en.prefix = key_prefix(out, en.start, en.kend);
    lua_pop(L, 1);
    if (out->oom || push_entry(e, &en) != ES_OK) {
      lua_pop(L, 1);
      return enc_oom(e);
    }
    if (sorted && e->nents - base > 1 && entry_cmp(out->data, &e->ents[e->nents - 2], &e->ents[e->nents - 1]) > 0)
      sorted = 0;
  }
  rc = ES_OK;
  if (!sorted && order_entries(e, base) != ES_OK) rc = enc_oom(e);
  e->nents = base;
  return rc;
}

static int enc_value(enc *e, int idx, int depth) {
  lua_State *L = e->L;
  es_buf *out = e->out;
  switch (lua_type(L, idx)) {
    case LUA_TNIL: /* only ever the whole value: table values are never nil */
      put_u8(out, T_NIL);
      return ES_OK;
    case LUA_TBOOLEAN:
      put_u8(out, lua_toboolean(L, idx) ? T_TRUE : T_FALSE);
      return ES_OK;
    case LUA_TNUMBER:
      if (lua_isinteger(L, idx)) put_int(out, lua_tointeger(L, idx));
      else put_float(out, lua_tonumber(L, idx));
      return ES_OK;
    case LUA_TSTRING: {
      size_t n;
      const char *s = lua_tolstring(L, idx, &n);
      put_u8(out, T_STRING);
      put_varint(out, n);
      es_buf_add(out, s, n);
      return ES_OK;
    }
    case LUA_TTABLE:
      return enc_table(e, idx, depth);
    case LUA_TLIGHTUSERDATA:
      if (es_json_is_null(L, idx)) {
        put_u8(out, T_NULL);
        return ES_OK;
      }
      return enc_fail(e, depth, "cannot encode a light userdata (only json.null)");
    case LUA_TNONE:
      return enc_fail(e, depth, "no value at that stack index");
    default:
      return enc_fail(e, depth, "cannot encode a %s", luaL_typename(L, idx));
  }
}

int es_state_encode(lua_State *L, int idx, const char *what, es_buf *out, es_err *err) {
  enc box, *e = &box; /* ~12 KiB, mostly the path: fine on any thread's stack */
  size_t mark = out->len;
  int top = lua_gettop(L), rc;
  idx = lua_absindex(L, idx);
  e->L = L;
  e->out = out;
  e->err = err;
  e->what = what ? what : "state";
  e->array_mt = 0;
  e->ents = NULL;
  e->nents = e->capents = 0;
  e->scratch = NULL;
  e->capscratch = 0;
  es_buf_init(&e->tmp);
  if (!lua_checkstack(L, 4)) return es_fail(err, ES_STORAGE, "out of memory while encoding state");
  /* Fetched before the walk, not when the first metatable shows up: it may
   * allocate, and a collection (running finalizers) must not happen while
   * lua_next is iterating a table. */
  if (lua_type(L, idx) == LUA_TTABLE) {
    if ((rc = push_array_mt(L, err)) != ES_OK) return rc;
    e->array_mt = lua_gettop(L);
  }
  put_u8(out, ES_STATE_FORMAT_VERSION);
  rc = enc_value(e, idx, 0);
  if (rc == ES_OK && out->oom) rc = enc_oom(e);
  if (rc != ES_OK) out->len = mark;
  lua_settop(L, top);
  free(e->ents);
  free(e->scratch);
  es_buf_destroy(&e->tmp);
  return rc;
}

/* Decoder ------------------------------------------------------------------ */

typedef struct dec {
  const unsigned char *start, *p, *end;
  es_err *err;
  int have_mt; /* whether stack slot 1 holds the json array metatable yet */
  int rc;      /* the result, read after lua_pcall */
} dec;

static int dec_fail(dec *d, const unsigned char *at, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static int dec_fail(dec *d, const unsigned char *at, const char *fmt, ...) {
  char reason[300];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(reason, sizeof reason, fmt, ap);
  va_end(ap);
  return es_fail(d->err, ES_INVALID_ARGUMENT, "invalid state encoding at byte %zu: %s", (size_t)(at - d->start),
                 reason);
}

static size_t left(const dec *d) { return (size_t)(d->end - d->p); }

static int need(dec *d, const unsigned char *at, size_t n, const char *what) {
  if (left(d) < n) return dec_fail(d, at, "truncated %s (%zu bytes needed, %zu left)", what, n, left(d));
  return ES_OK;
}

static uint64_t get_le(const unsigned char *p, int n) {
  uint64_t v = 0;
  int i;
  for (i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* Reads a canonical varint: at most 64 bits, no redundant trailing zero
 * groups (so each count has one encoding). */
static int get_varint(dec *d, uint64_t *out, const char *what) {
  const unsigned char *at = d->p;
  uint64_t v = 0;
  int shift = 0;
  for (;;) {
    unsigned b;
    if (d->p >= d->end) return dec_fail(d, at, "truncated %s", what);
    b = *d->p++;
    if (shift == 63 && b > 1) return dec_fail(d, at, "%s overflows 64 bits", what);
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      if (b == 0 && shift > 0) return dec_fail(d, at, "%s is not minimally encoded", what);
      *out = v;
      return ES_OK;
    }
    shift += 7;
  }
}

/* Sign-extends the low `bytes` bytes of u, without implementation-defined
 * unsigned-to-signed conversions. */
static lua_Integer to_signed(uint64_t u, int bytes) {
  if (bytes < 8) {
    uint64_t sign = (uint64_t)1 << (8 * bytes - 1);
    u &= (sign << 1) - 1;
    u = (u ^ sign) - sign; /* modulo 2^64: the 64-bit two's complement */
  }
  if (u <= (uint64_t)INT64_MAX) return (lua_Integer)u;
  return -(lua_Integer)(~u) - 1;
}

static int dec_value(lua_State *L, dec *d, int depth, int in_table);

/* Pushes the json array metatable onto stack slot 1 the first time it is
 * needed, so decoding scalars and plain tables allocates nothing extra. */
static int ensure_array_mt(lua_State *L, dec *d) {
  int rc;
  if (d->have_mt) return ES_OK;
  if (!lua_checkstack(L, 2)) return es_fail(d->err, ES_STORAGE, "out of memory while decoding state");
  if ((rc = push_array_mt(L, d->err)) != ES_OK) return rc;
  lua_replace(L, 1);
  d->have_mt = 1;
  return ES_OK;
}

/* Reads and pushes one table key, which must be canonical for a table whose
 * array part is narr long. */
static int dec_key(lua_State *L, dec *d, int depth, uint64_t narr) {
  const unsigned char *at = d->p;
  int rc;
  if (d->p >= d->end) return dec_fail(d, at, "truncated key");
  switch (*d->p) {
    case T_NIL: return dec_fail(d, at, "nil table key");
    case T_TABLE:
    case T_ARRAY: return dec_fail(d, at, "table as a table key");
    default: break;
  }
  if ((rc = dec_value(L, d, depth, 1)) != ES_OK) return rc;
  if (lua_isinteger(L, -1)) {
    lua_Integer k = lua_tointeger(L, -1);
    /* The array part is maximal: keys 1..narr+1 are never in the rest. */
    if (k >= 1 && (uint64_t)k - 1 <= narr)
      return dec_fail(d, at, "integer key %lld belongs to the array part (of %llu values)", (long long)k,
                      (unsigned long long)narr);
  } else if (lua_type(L, -1) == LUA_TNUMBER) {
    lua_Number f = lua_tonumber(L, -1);
    if (f != f) return dec_fail(d, at, "NaN table key");
    /* Lua turns such a key into an integer: encoded as a float it is not
     * canonical (and could collide with the integer key). */
    if (f == floor(f) && f >= -9223372036854775808.0 && f < 9223372036854775808.0)
      return dec_fail(d, at, "float key %.17g has an integer value", (double)f);
  }
  return ES_OK;
}

static int dec_table(lua_State *L, dec *d, int depth, int marked) {
  const unsigned char *at = d->p - 1; /* the tag */
  const unsigned char *prev = NULL;
  size_t prevn = 0;
  uint64_t narr, nhash, i;
  size_t room;
  int rc;
  if (depth >= ES_STATE_MAX_DEPTH) return dec_fail(d, at, "tables nested deeper than %d", ES_STATE_MAX_DEPTH);
  /* The table, a key, a value, a metatable. */
  if (!lua_checkstack(L, 4)) return es_fail(d->err, ES_STORAGE, "out of memory while decoding state");
  if ((rc = get_varint(d, &narr, "array count")) != ES_OK) return rc;
  if ((rc = get_varint(d, &nhash, "pair count")) != ES_OK) return rc;
  /* Every value takes at least one byte and every pair two: counts that
   * cannot fit in what is left are refused before anything is allocated. */
  room = left(d);
  if (narr > room || nhash > (room - narr) / 2)
    return dec_fail(d, at, "table of %llu values and %llu pairs cannot fit in the %zu bytes left",
                    (unsigned long long)narr, (unsigned long long)nhash, room);
  lua_createtable(L, narr <= INT_MAX ? (int)narr : 0, nhash <= INT_MAX ? (int)nhash : 0);
  if (marked) {
    if ((rc = ensure_array_mt(L, d)) != ES_OK) return rc;
    lua_pushvalue(L, 1);
    lua_setmetatable(L, -2);
  }
  for (i = 1; i <= narr; i++) {
    if ((rc = dec_value(L, d, depth + 1, 1)) != ES_OK) return rc;
    lua_rawseti(L, -2, (lua_Integer)i);
  }
  for (i = 0; i < nhash; i++) {
    const unsigned char *kat = d->p;
    if ((rc = dec_key(L, d, depth + 1, narr)) != ES_OK) return rc;
    /* Strictly increasing keys: canonical order, and no repeated key. */
    if (prev && keycmp(prev, prevn, kat, (size_t)(d->p - kat)) >= 0)
      return dec_fail(d, kat, "table keys out of order or repeated");
    prev = kat;
    prevn = (size_t)(d->p - kat);
    if ((rc = dec_value(L, d, depth + 1, 1)) != ES_OK) return rc;
    lua_rawset(L, -3);
  }
  return ES_OK;
}

/* Pushes one value (exactly one slot on success). depth counts the
 * enclosing tables; in_table forbids nil. */
static int dec_value(lua_State *L, dec *d, int depth, int in_table) {
  const unsigned char *at = d->p;
  unsigned tag;
  int rc;
  if (d->p >= d->end) return dec_fail(d, at, "truncated: a value was expected");
  tag = *d->p++;
  switch (tag) {
    case T_NIL:
      if (in_table) return dec_fail(d, at, "nil inside a table");
      lua_pushnil(L);
      return ES_OK;
    case T_FALSE:
    case T_TRUE:
      lua_pushboolean(L, tag == T_TRUE);
      return ES_OK;
    case T_NULL:
      es_json_push_null(L);
      return ES_OK;
    case T_INT8:
    case T_INT16:
    case T_INT32:
    case T_INT64: {
      int n = 1 << (tag - T_INT8);
      lua_Integer v, lo, hi;
      if ((rc = need(d, at, (size_t)n, "integer")) != ES_OK) return rc;
      v = to_signed(get_le(d->p, n), n);
      d->p += n;
      if (n > 1) {
        /* Canonical: the smallest width that holds the value. */
        hi = ((lua_Integer)1 << (4 * n - 1)) - 1;
        lo = -hi - 1;
        if (v >= lo && v <= hi) return dec_fail(d, at, "integer %lld is not in its smallest width", (long long)v);
      }
      lua_pushinteger(L, v);
      return ES_OK;
    }
    case T_FLOAT: {
      uint64_t bits;
      lua_Number f;
      if ((rc = need(d, at, 8, "float")) != ES_OK) return rc;
      bits = get_le(d->p, 8);
      d->p += 8;
      memcpy(&f, &bits, sizeof f);
      lua_pushnumber(L, f);
      return ES_OK;
    }
    case T_STRING: {
      uint64_t n;
      if ((rc = get_varint(d, &n, "string length")) != ES_OK) return rc;
      if (n > left(d))
        return dec_fail(d, at, "string of %llu bytes but only %zu left", (unsigned long long)n, left(d));
      lua_pushlstring(L, (const char *)d->p, (size_t)n);
      d->p += n;
      return ES_OK;
    }
    case T_TABLE:
    case T_ARRAY:
      return dec_table(L, d, depth, tag == T_ARRAY);
    default:
      return dec_fail(d, at, "unknown tag 0x%02x", tag);
  }
}

/* Runs under lua_pcall so that Lua's memory errors unwind to
 * es_state_decode instead of past its caller's C code. Slot 1 is reserved
 * for the json array metatable. */
static int dec_protected(lua_State *L) {
  dec *d = lua_touserdata(L, 1);
  lua_settop(L, 0);
  lua_pushnil(L);
  d->rc = dec_value(L, d, 0, 0);
  if (d->rc == ES_OK && d->p < d->end)
    d->rc = dec_fail(d, d->p, "%zu trailing bytes after the value", left(d));
  return d->rc == ES_OK ? 1 : 0;
}

int es_state_decode(lua_State *L, const char *data, size_t len, es_err *err) {
  dec d;
  int status;
  d.start = d.p = (const unsigned char *)(data ? data : "");
  d.end = d.start + (data ? len : 0);
  d.err = err;
  d.have_mt = 0;
  d.rc = ES_OK;
  if (d.p == d.end) return dec_fail(&d, d.p, "empty (no format version byte)");
  if (*d.p != ES_STATE_FORMAT_VERSION)
    return dec_fail(&d, d.p, "format version %u, this build reads version %d", *d.p, ES_STATE_FORMAT_VERSION);
  d.p++;
  if (!lua_checkstack(L, 3)) return es_fail(err, ES_STORAGE, "out of memory while decoding state");
  lua_pushcfunction(L, dec_protected);
  lua_pushlightuserdata(L, &d);
  status = lua_pcall(L, 1, 1, 0);
  if (status != LUA_OK) {
    const char *msg = lua_tostring(L, -1);
    d.rc = es_fail(err, ES_STORAGE, "%s while decoding state",
                   status == LUA_ERRMEM ? "out of memory" : (msg ? msg : "Lua error"));
    lua_pop(L, 1);
  } else if (d.rc != ES_OK) {
    lua_pop(L, 1);
  }
  return d.rc;
}

/* The module -------------------------------------------------------------- */

static int l_encode(lua_State *L) {
  luaL_checkany(L, 1);
  const char *what = luaL_optstring(L, 2, "state");
  lua_settop(L, 2); /* keeps `what` alive (slot 2) while it is used */
  return es_lua_encode_arg(L, es_state_encode, what);
}

static int l_decode(lua_State *L) { return es_lua_decode_arg(L, es_state_decode); }

void es_state_push_module(lua_State *L) {
  static const luaL_Reg funcs[] = {
      {"encode", l_encode},
      {"decode", l_decode},
      {NULL, NULL},
  };
  luaL_newlib(L, funcs);
  lua_pushinteger(L, ES_STATE_FORMAT_VERSION);
  lua_setfield(L, -2, "format_version");
  lua_pushinteger(L, ES_STATE_MAX_DEPTH);
  lua_setfield(L, -2, "max_depth");
}
