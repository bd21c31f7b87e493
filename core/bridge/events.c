/*
 * bridge/events.c: converting between Lua values and the store's C structs,
 * shared by the module's handles (module/store_handle.c,
 * module/engine_handle.c) and the engine (engine/dispatch.c, fold.c, fold_runner.c):
 * names, free text and integers read from Lua, option-table fields, stored
 * events to Lua tables, Lua event arrays to es_new_event arrays.
 *
 * Where the NUL check lives, and why here: the store's C API (store.h)
 * takes NUL-terminated strings, so the bytes after a NUL never reach the
 * core: "tenant-a\0evil" would silently become "tenant-a", and ids
 * "order\0001" and "order\0002" the same id "order". Only this layer
 * holds a Lua string together with its length, so every name read from
 * Lua is read through es_lua_name / es_lua_check_name / es_lua_opt_name /
 * es_lua_opt_str_field / es_lua_req_str_field (and event_str for event
 * fields), which refuse a NUL with INVALID_ARGUMENT naming the argument;
 * the store core then applies the other name rules (non-empty, at most 255
 * bytes, UTF-8: es_check_name). Free text (a failure's error, a settle
 * reason) is not refused: es_lua_opt_text_field hands over the bytes with
 * their length and the callers store them through es_text_clean, which
 * keeps the text readable (a NUL becomes U+FFFD). Reading names only
 * through these helpers is what guarantees no path is missed: the binding
 * files call no luaL_checkstring / lua_tostring for a name.
 *
 * Integers: an option must be a Lua number with an integer value (3 or
 * 3.0; not "3", 3.5 or 2^63): anything else is an argument error. A
 * present option equal to math.mininteger is refused (INVALID_ARGUMENT):
 * that value is the C API's "absent" marker (ES_NONE), so passing it on
 * would silently turn `limit = math.mininteger` into "no limit". Ranges are
 * the core's rules (core/store/).
 */
#include <lauxlib.h>
#include <lua.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "codec/json.h"
#include "codec/json_doc.h"
#include "bridge/json_lua.h"
#include "bridge/common.h"
#include "bridge/events.h"

/* ---------------------------------------------------------------------- */
/* names, text, integers */

const char *es_lua_name(lua_State *L, int idx, const char *what) {
  size_t n;
  const char *s = lua_tolstring(L, idx, &n);
  if (s && memchr(s, '\0', n))
    es_lua_raisef(L, ES_INVALID_ARGUMENT, "%s must not contain a NUL byte", what);
  return s;
}

const char *es_lua_check_name(lua_State *L, int arg, const char *what) {
  luaL_checklstring(L, arg, NULL);
  return es_lua_name(L, arg, what);
}

const char *es_lua_opt_name(lua_State *L, int arg, const char *what) {
  if (lua_isnoneornil(L, arg)) return NULL;
  return es_lua_check_name(L, arg, what);
}

/* v at idx as an integer option: a number with an integer value, else an
 * argument error for argument arg (`what` names it). */
static int64_t to_int(lua_State *L, int idx, int arg, const char *what) {
  int ok = 0;
  lua_Integer v = 0;
  if (lua_type(L, idx) == LUA_TNUMBER) v = lua_tointegerx(L, idx, &ok);
  if (!ok) {
    const char *got = lua_type(L, idx) == LUA_TNUMBER ? "a number without an integer value"
                                                      : luaL_typename(L, idx);
    luaL_argerror(L, arg, lua_pushfstring(L, "%s must be an integer, got %s", what, got));
  }
  return (int64_t)v;
}

int64_t es_lua_check_int(lua_State *L, int arg, const char *what) {
  luaL_checkany(L, arg);
  return to_int(L, arg, arg, what);
}

int64_t es_lua_opt_int(lua_State *L, int arg, const char *what, int64_t def) {
  if (lua_isnoneornil(L, arg)) return def;
  int64_t v = to_int(L, arg, arg, what);
  if (v == ES_NONE)
    es_lua_raisef(L, ES_INVALID_ARGUMENT, "%s is out of range (math.mininteger)", what);
  return v;
}

int64_t es_lua_opt_int_field(lua_State *L, int arg, const char *field, int64_t def) {
  if (lua_isnoneornil(L, arg)) return def;
  lua_getfield(L, arg, field);
  int64_t v = def;
  if (!lua_isnil(L, -1)) {
    int at = lua_gettop(L);
    v = to_int(L, at, arg, lua_pushfstring(L, "field '%s'", field));
    lua_pop(L, 1);
    if (v == ES_NONE)
      es_lua_raisef(L, ES_INVALID_ARGUMENT, "%s is out of range (math.mininteger)", field);
  }
  lua_pop(L, 1);
  return v;
}

/* A string field; returns NULL when absent; len (when not NULL) gets its
 * length. The string is left on the stack (one slot per field), so it stays
 * valid for the whole call: the table does not anchor it, since a Lua clock
 * or id function that runs inside the core call may change the table and
 * collect garbage before the core reads the string. */
static const char *str_field(lua_State *L, int arg, const char *field, size_t *len) {
  if (len) *len = 0;
  if (lua_isnoneornil(L, arg)) return NULL;
  arg = lua_absindex(L, arg);
  lua_getfield(L, arg, field);
  const char *v = NULL;
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return NULL;
  }
  if (lua_type(L, -1) != LUA_TSTRING)
    luaL_argerror(L, arg, lua_pushfstring(L, "field '%s' must be a string", field));
  v = lua_tolstring(L, -1, len);
  return v;
}

const char *es_lua_opt_str_field(lua_State *L, int arg, const char *field) {
  size_t n;
  const char *v = str_field(L, arg, field, &n);
  if (v && memchr(v, '\0', n))
    es_lua_raisef(L, ES_INVALID_ARGUMENT, "%s must not contain a NUL byte", field);
  return v;
}

const char *es_lua_opt_text_field(lua_State *L, int arg, const char *field, size_t *len) {
  return str_field(L, arg, field, len);
}

const char *es_lua_req_str_field(lua_State *L, int arg, const char *field) {
  const char *v = es_lua_opt_str_field(L, arg, field);
  if (!v) luaL_argerror(L, arg, lua_pushfstring(L, "field '%s' is required", field));
  return v;
}

void es_lua_set_int(lua_State *L, const char *k, int64_t v) {
  if (v == ES_NONE) return;
  lua_pushinteger(L, (lua_Integer)v);
  lua_setfield(L, -2, k);
}

void es_lua_set_str(lua_State *L, const char *k, const char *v) {
  if (!v) return;
  lua_pushstring(L, v);
  lua_setfield(L, -2, k);
}

/* ---------------------------------------------------------------------- */
/* field names, interned once per lua_State
 *
 * Building an event table with lua_setfield(L, -2, "created_at") costs a
 * lookup of the C string in Lua's string cache (a strcmp) and, for a new
 * key, the slow path of a metamethod-aware set, for each of about 15
 * fields of every event; a read of 100 events does that 1,500 times. The
 * names below are made into Lua strings once per lua_State and kept in an
 * array in the registry, so a field is set with lua_rawgeti (the name) and
 * lua_rawset (no metamethods: the table is ours and new), and read from an
 * events argument with lua_rawgeti + lua_gettable (metamethods honoured, as
 * lua_getfield did). The status strings are values, kept the same way. */

enum {
  N_ID = 1, N_TYPE, N_PAYLOAD, N_KEY, N_SHREDDED, N_INDEX, N_SESSION, N_POSITION, N_CREATED_AT,
  N_CAUSE, N_LANE, N_NOT_BEFORE, N_STATUS, N_ATTEMPTS, N_FAILURES, N_LAST_ERROR, N_PROCESSED_AT,
  N_CLAIM_HOLDER, N_CLAIM_EXPIRES_AT, N_RETRY_AT, N_FIRST_CLAIMED_AT, N_LAST_CLAIMED_AT,
  N_FAILED_AT, N_PROCESSED_BY_ATTEMPT, N_ORIGIN, N_ATTEMPT, N_SETTLED, N_AT, N_DELAY_MS,
  N_PENDING, N_PROCESSED, N_DEAD, N_CANCELLED, N_REVISION, N_META, N_COUNT_PLUS_ONE
};

static const char *const names_text[N_COUNT_PLUS_ONE] = {
    NULL, "id", "type", "payload", "key", "shredded", "index", "session", "position", "created_at",
    "cause", "lane", "not_before", "status", "attempts", "failures", "last_error", "processed_at",
    "claim_holder", "claim_expires_at", "retry_at", "first_claimed_at", "last_claimed_at",
    "failed_at", "processed_by_attempt", "origin", "attempt", "settled", "at", "delay_ms",
    "pending", "processed", "dead", "cancelled", "revision", "meta"};

/* Its address is the registry key of the names array. */
static const char names_key = 'n';

/* Pushes the names array, making it on first use in this lua_State (may
 * raise: out of memory). */
static void push_names(lua_State *L) {
  es_lua_push_names(L, &names_key, names_text, N_COUNT_PLUS_ONE);
}

/* The cache slots of es_lua_pusher (bridge/events.h): strings that repeat
 * from one event to the next of a list (the session of a read, the type
 * and lane of a batch, a claim's holder): the Lua string made for the
 * previous event is reused when the text is the same, which costs a
 * strcmp instead of hashing and interning the text again. */
enum { C_SESSION = ES_PUSHER_SESSION, C_TYPE = ES_PUSHER_TYPE, C_LANE, C_HOLDER, C_COUNT };
_Static_assert((int)C_COUNT == (int)ES_PUSHER_SLOTS, "es_lua_pusher's slots");

typedef es_lua_pusher pusher;

/* Starts a pusher: the names array and, for a list (`cache`), the cache
 * slots, a copy of the names on the stack (lua_pushvalue is cheaper than
 * lua_rawgeti, 15 times per event) and the list's payload decoder; popped
 * by pusher_end. */
static void pusher_begin(lua_State *L, pusher *p, int cache) {
  /* its slots, and room for an event table being built (a nested table,
   * a key and a value) with a caller's few values above the slots */
  luaL_checkstack(L, 2 + C_COUNT + N_COUNT_PLUS_ONE + 24, "event tables");
  p->L = L;
  push_names(L);
  p->names = lua_gettop(L);
  p->slots = 0;
  p->keys = 0;
  p->jd = NULL;
  if (cache) {
    for (int i = 0; i < C_COUNT; i++) lua_pushnil(L);
    p->slots = p->names + 1;
    p->keys = lua_gettop(L);
    for (int k = 1; k < N_COUNT_PLUS_ONE; k++) lua_rawgeti(L, p->names, k);
    /* One per list, never one per lua_State: a decode allocates, an
     * allocation can run a finalizer, and a finalizer may read events
     * (and so decode) in the middle of this decode. The collector frees it
     * (and its scratch) whether the list is built or an error unwinds. */
    p->jd = es_json_decoder_push(L);
  }
  memset(p->text, 0, sizeof p->text);
}

/* Pushes the names entry k. */
static void push_name(pusher *p, int k) {
  if (p->keys) lua_pushvalue(p->L, p->keys + k);
  else lua_rawgeti(p->L, p->names, k);
}

static void pusher_end(pusher *p) { lua_settop(p->L, p->names - 1); }

/* Pushes the string v through the cache slot `slot` (-1: none). */
static void push_text(pusher *p, const char *v, int slot) {
  lua_State *L = p->L;
  if (slot < 0 || !p->slots) {
    lua_pushstring(L, v);
  } else if (p->text[slot] && strcmp(p->text[slot], v) == 0) {
    lua_pushvalue(L, p->slots + slot);
  } else {
    lua_pushstring(L, v);
    lua_pushvalue(L, -1);
    lua_replace(L, p->slots + slot);
    p->text[slot] = v;
  }
}

/* t[name] = v for a string v (nothing when NULL), through the cache slot
 * `slot` (-1: none). t is an absolute index. */
static void put_str(pusher *p, int t, int name, const char *v, int slot) {
  if (!v) return;
  push_name(p, name);
  push_text(p, v, slot);
  lua_rawset(p->L, t);
}

/* t[name] = v, nothing when v is ES_NONE. */
static void put_int(pusher *p, int t, int name, int64_t v) {
  if (v == ES_NONE) return;
  push_name(p, name);
  lua_pushinteger(p->L, (lua_Integer)v);
  lua_rawset(p->L, t);
}

/* t[name] = the names entry `value` (a constant string). */
static void put_name(pusher *p, int t, int name, int value) {
  push_name(p, name);
  push_name(p, value);
  lua_rawset(p->L, t);
}

/* How many fields push_one sets: the event table is made with exactly
 * that many hash slots, so it is never resized while it is filled (Lua
 * rounds the size up to a power of two; 26, the count of every possible
 * field, would allocate 32 slots for the ~14 a typical event has). */
static int field_count(const es_event *e, int claimed, int has_payload) {
  /* status, attempts; index, position, created_at, failures; revision */
  int n = 2 + has_payload + 5;
  n += e->meta != NULL;
  n += e->id != NULL;
  n += e->type != NULL;
  n += e->key != NULL;
  n += e->shredded != 0;
  n += e->session != NULL;
  n += e->cause_index != ES_NONE;
  n += e->lane != NULL;
  n += e->not_before != ES_NONE;
  n += e->last_error != NULL;
  n += e->processed_at != ES_NONE;
  n += e->claim_holder != NULL;
  n += e->claim_expires_at != ES_NONE;
  n += e->retry_at != ES_NONE;
  n += e->first_claimed_at != ES_NONE;
  n += e->last_claimed_at != ES_NONE;
  n += e->failed_at != ES_NONE;
  n += e->processed_by_attempt != ES_NONE;
  n += e->origin_session != NULL;
  n += claimed && e->attempts != ES_NONE;
  return n;
}

/* Pushes the JSON text[0..n) decoded, as push_one decodes a payload. */
static void push_json(pusher *p, const char *text, size_t n) {
  if (p->jd) {
    /* Raises the same INVALID_ARGUMENT error object for bad text; holds
     * no C memory of its own (the list is in its box), so unwinding
     * leaks nothing. */
    es_json_decoder_decode(p->L, p->jd, text, n);
  } else {
    es_err err = {0};
    if (es_json_decode_lua(p->L, text, n, &err) != ES_OK) es_lua_raise(p->L, &err);
  }
}

/* Pushes one event table (see es_lua_push_event); `extra` more hash slots
 * are reserved for fields the caller adds. */
static void push_one(pusher *p, const es_event *e, int claimed, int extra) {
  lua_State *L = p->L;
  /* index, position, created_at, attempts and failures are always set in a
   * stored row; they are still skipped when ES_NONE, as before, and counted
   * as present (one slot too many at worst). */
  lua_createtable(L, 0, field_count(e, claimed, e->payload != NULL) + extra);
  int t = lua_gettop(L);
  put_str(p, t, N_ID, e->id, -1);
  put_str(p, t, N_TYPE, e->type, C_TYPE);
  if (e->payload) { /* NULL: a shredded payload (§3.10), absent */
    push_name(p, N_PAYLOAD);
    push_json(p, e->payload, e->payload_len);
    lua_rawset(L, t);
  }
  put_int(p, t, N_REVISION, e->revision);
  if (e->meta) { /* §3.1: decoded as a payload is */
    push_name(p, N_META);
    push_json(p, e->meta, strlen(e->meta));
    lua_rawset(L, t);
  }
  put_str(p, t, N_KEY, e->key, -1);
  if (e->shredded) {
    push_name(p, N_SHREDDED);
    lua_pushboolean(L, 1);
    lua_rawset(L, t);
  }
  put_int(p, t, N_INDEX, e->index);
  put_str(p, t, N_SESSION, e->session, C_SESSION);
  put_int(p, t, N_POSITION, e->position);
  put_int(p, t, N_CREATED_AT, e->created_at);
  if (e->cause_index != ES_NONE) {
    push_name(p, N_CAUSE);
    lua_createtable(L, 0, 2);
    put_int(p, t + 2, N_INDEX, e->cause_index);
    put_int(p, t + 2, N_ATTEMPT, e->cause_attempt);
    lua_rawset(L, t);
  }
  put_str(p, t, N_LANE, e->lane, C_LANE);
  put_int(p, t, N_NOT_BEFORE, e->not_before);
  put_name(p, t, N_STATUS,
           e->status == ES_STATUS_PROCESSED ? N_PROCESSED
           : e->status == ES_STATUS_DEAD    ? N_DEAD
                                            : N_PENDING);
  put_int(p, t, N_ATTEMPTS, e->attempts);
  put_int(p, t, N_FAILURES, e->failures);
  /* §3.2: a cancelled event's record shows its reason as `cancelled`
   * (stored as last_error, processed by no attempt: es_event_cancelled) */
  const char *cancelled = es_event_cancelled(e);
  put_str(p, t, N_LAST_ERROR, cancelled ? NULL : e->last_error, -1);
  put_str(p, t, N_CANCELLED, cancelled, -1);
  put_int(p, t, N_PROCESSED_AT, e->processed_at);
  put_str(p, t, N_CLAIM_HOLDER, e->claim_holder, C_HOLDER);
  put_int(p, t, N_CLAIM_EXPIRES_AT, e->claim_expires_at);
  put_int(p, t, N_RETRY_AT, e->retry_at);
  put_int(p, t, N_FIRST_CLAIMED_AT, e->first_claimed_at);
  put_int(p, t, N_LAST_CLAIMED_AT, e->last_claimed_at);
  put_int(p, t, N_FAILED_AT, e->failed_at);
  put_int(p, t, N_PROCESSED_BY_ATTEMPT, cancelled ? ES_NONE : e->processed_by_attempt);
  if (e->origin_session) {
    push_name(p, N_ORIGIN);
    lua_createtable(L, 0, 2);
    put_str(p, t + 2, N_SESSION, e->origin_session, -1);
    put_int(p, t + 2, N_INDEX, e->origin_index);
    lua_rawset(L, t);
  }
  if (claimed) put_int(p, t, N_ATTEMPT, e->attempts);
}

void es_lua_pusher_begin(lua_State *L, es_lua_pusher *p) { pusher_begin(L, p, 1); }

void es_lua_pusher_push(es_lua_pusher *p, const es_event *e) { push_one(p, e, 0, 0); }

void es_lua_pusher_push_text(es_lua_pusher *p, const char *text, int slot) { push_text(p, text, slot); }

void es_lua_pusher_end(es_lua_pusher *p) { pusher_end(p); }

void es_lua_push_event(lua_State *L, const es_event *e, int claimed) {
  pusher p;
  pusher_begin(L, &p, 0);
  push_one(&p, e, claimed, 0);
  lua_replace(L, p.names); /* the event takes the names array's slot */
}

void es_lua_push_event_at_rest(lua_State *L, const es_event *e) {
  if (!e->key) {
    es_lua_push_event(L, e, 0);
    return;
  }
  es_event v = *e; /* borrowed fields: the sealed text is not JSON */
  v.payload = NULL;
  v.payload_len = 0;
  pusher p;
  pusher_begin(L, &p, 0);
  push_one(&p, &v, 0, e->payload != NULL);
  lua_replace(L, p.names);
  if (e->payload) {
    lua_pushlstring(L, e->payload, e->payload_len);
    lua_setfield(L, -2, "ciphertext");
  }
}

void es_lua_push_lease(lua_State *L, es_lease *l) {
  char holder[ES_MAX_ID_BYTES + 1];
  snprintf(holder, sizeof holder, "%s", l->holder ? l->holder : "");
  int acquired = l->acquired;
  int64_t token = l->token, expires_at = l->expires_at;
  es_lease_destroy(l);
  lua_createtable(L, 0, 4);
  es_lua_set_str(L, "outcome", acquired ? "acquired" : "held");
  es_lua_set_str(L, "holder", holder);
  if (acquired) es_lua_set_int(L, "token", token);
  es_lua_set_int(L, "expires_at", expires_at);
}

static void events_release(void *box) { es_events_destroy(box); }

void es_lua_push_event_ids(lua_State *L, es_events *list) {
  es_events *box = es_lua_push_box(L, sizeof *box, 0, events_release);
  *box = *list; /* ours now, even if the next lines raise */
  memset(list, 0, sizeof *list);
  lua_createtable(L, (int)(box->n > 1000000 ? 0 : box->n), 0);
  for (size_t i = 0; i < box->n; i++) {
    lua_pushstring(L, box->v[i].id);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  es_box_release_now(box);
  lua_remove(L, -2);
}

int es_lua_opt_answer_ids(lua_State *L, int arg) {
  const char *a = es_lua_opt_str_field(L, arg, "answer");
  if (!a || strcmp(a, "events") == 0) return 0;
  if (strcmp(a, "ids") == 0) return 1;
  return es_lua_raisef(L, ES_INVALID_ARGUMENT, "opts.answer must be \"events\" or \"ids\"");
}

/* Pushes an array of events and frees the list. The list moves into a
 * userdata first, so a Lua error while building the tables (out of memory,
 * a stored payload that does not decode) cannot leak it. */
void es_lua_push_events(lua_State *L, es_events *list, int claimed) {
  es_events *box = es_lua_push_box(L, sizeof *box, 0, events_release);
  *box = *list; /* the caller's list is ours now, even if the next lines raise */
  memset(list, 0, sizeof *list);
  lua_createtable(L, (int)(box->n > 1000000 ? 0 : box->n), 0);
  int arr = lua_gettop(L);
  pusher p;
  pusher_begin(L, &p, 1);
  for (size_t i = 0; i < box->n; i++) {
    push_one(&p, &box->v[i], claimed, 0);
    lua_rawseti(L, arr, (lua_Integer)i + 1);
  }
  pusher_end(&p);
  es_box_release_now(box);
  lua_remove(L, -2);
}

/* What the messages about an events argument start with: "" for an
 * append's, "batches[i]: " while append_many reads its batch i
 * (es_lua_check_batch_events), so a refused batch's error names it as the
 * store's own errors for it do. Per thread: the engine's workers convert
 * their handlers' results at the same time. Every conversion sets it
 * first, so one that raised leaves nothing behind for the next. */
static _Thread_local char batch_prefix[48];

/* A bad event: an argument error when the events came as argument `arg`,
 * else a plain error (events a handler returned). Never returns. */
static int bad_event(lua_State *L, int arg, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const char *msg = lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  size_t pl = strlen(batch_prefix);
  if (pl && strncmp(msg, batch_prefix, pl) != 0) msg = lua_pushfstring(L, "%s%s", batch_prefix, msg);
  if (arg > 0) return luaL_argerror(L, arg, msg);
  return luaL_error(L, "returned %s", msg);
}

/* Reading an events argument: the stack slots the conversion uses, and the
 * strings it has anchored so far. */
typedef struct conv {
  lua_State *L;
  int arg;         /* as es_lua_check_events' arg */
  int names;       /* stack index of the names array */
  int anchor;      /* stack index of the anchor table (the second result) */
  lua_Integer anchored; /* how many values the anchor table holds */
  /* The last string anchored for each name field: a batch of events of one
   * type holds the same Lua string in every event, anchored once. */
  const char *last[4];
} conv;

/* Pushes t[name] (metamethods honoured, as lua_getfield) and returns its
 * type. */
static int get_field(conv *c, int t, int name) {
  lua_rawgeti(c->L, c->names, name);
  return lua_gettable(c->L, t);
}

/* "[batches[b]: ]events[i + 1]<suffix>" into out (at least 96 bytes), for the codec's and
 * the timer rule's messages: built by hand, since snprintf for every event
 * of a batch was a visible share of an append. */
static const char *event_what(char *out, size_t i, const char *suffix) {
  char digits[24];
  int n = 0;
  size_t v = i + 1;
  do {
    digits[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  char *p = out;
  size_t pl = strlen(batch_prefix);
  memcpy(p, batch_prefix, pl);
  p += pl;
  memcpy(p, "events[", 7);
  p += 7;
  while (n) *p++ = digits[--n];
  *p++ = ']';
  size_t sl = strlen(suffix);
  memcpy(p, suffix, sl + 1);
  return out;
}

/* An optional integer field of the event table at t (`sub`: "" or "cause."
 * for messages); *has (may be NULL) tells whether it was given.
 * math.mininteger is refused: it is ES_NONE. */
static int64_t event_int(conv *c, int t, size_t i, const char *sub, int name, int *has) {
  lua_State *L = c->L;
  int64_t v = ES_NONE;
  int type = get_field(c, t, name);
  if (has) *has = type != LUA_TNIL;
  if (type != LUA_TNIL) {
    int ok = 0;
    const char *field = names_text[name];
    if (type == LUA_TNUMBER) v = lua_tointegerx(L, -1, &ok);
    if (!ok) bad_event(L, c->arg, "events[%d].%s%s must be an integer", (int)i + 1, sub, field);
    if (v == ES_NONE)
      es_lua_raisef(L, ES_INVALID_ARGUMENT, "%sevents[%d].%s%s is out of range (math.mininteger)",
                    batch_prefix, (int)i + 1, sub, field);
  }
  lua_pop(L, 1);
  return v;
}

/* Keeps the value at the top alive as long as the anchor table (the
 * conversion's second result) and pops it. */
static void anchor_top(conv *c) { lua_rawseti(c->L, c->anchor, ++c->anchored); }

/* An optional name field of the event table at t (NUL refused). The string
 * is anchored: an __index metamethod may have made it, or may replace the
 * field of an event read before; and a Lua clock or id function that runs
 * inside the core call may change the events' tables. `last` (0..3) is the
 * field's slot in c->last. */
static const char *event_str(conv *c, int t, size_t i, int name, int last) {
  lua_State *L = c->L;
  const char *v = NULL;
  int type = get_field(c, t, name);
  if (type != LUA_TNIL) {
    size_t n;
    if (type != LUA_TSTRING)
      bad_event(L, c->arg, "events[%d].%s must be a string", (int)i + 1, names_text[name]);
    v = lua_tolstring(L, -1, &n);
    if (memchr(v, '\0', n))
      es_lua_raisef(L, ES_INVALID_ARGUMENT, "%sevents[%d].%s must not contain a NUL byte", batch_prefix,
                    (int)i + 1, names_text[name]);
    /* The same address as the string anchored last for this field is the
     * same Lua string (that one is alive, so no other string can have its
     * address): already anchored. */
    if (v == c->last[last]) {
      lua_pop(L, 1);
    } else {
      anchor_top(c);
      c->last[last] = v;
    }
    return v;
  }
  lua_pop(L, 1);
  return v;
}

static void buf_release(void *box) { es_buf_destroy(box); }

es_buf *es_lua_push_buf_box(lua_State *L) {
  es_buf *b = es_lua_push_box(L, sizeof *b, 0, buf_release);
  es_buf_init(b);
  return b;
}

/* Raises msg as an argument error for arg (arg > 0) or a plain error. */
static void seq_error(lua_State *L, int arg, const char *msg) {
  if (arg > 0) luaL_argerror(L, arg, msg);
  lua_error(L);
}

/* The length of the table at idx (absolute) once each of its elements
 * 1..n is checked to exist (es_lua_check_seq), and in *keys how many keys
 * it holds in all. */
static size_t seq_elements(lua_State *L, int idx, int arg, const char *what, size_t *keys) {
  size_t n = (size_t)lua_rawlen(L, idx);
  for (size_t i = 0; i < n; i++) {
    int t = lua_rawgeti(L, idx, (lua_Integer)i + 1);
    lua_pop(L, 1);
    if (t == LUA_TNIL)
      seq_error(L, arg, lua_pushfstring(L, "%s is not a sequence (no [%d])", what, (int)i + 1));
  }
  *keys = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    ++*keys;
  }
  return n;
}

size_t es_lua_check_list(lua_State *L, int arg, const char *what, const char *shape) {
  size_t keys, n = seq_elements(L, lua_absindex(L, arg), arg, what, &keys);
  if (keys != n) luaL_argerror(L, arg, shape);
  return n;
}

size_t es_lua_check_seq(lua_State *L, int idx, int arg, const char *what) {
  size_t keys, n = seq_elements(L, lua_absindex(L, idx), arg, what, &keys);
  if (keys != n)
    seq_error(L, arg,
              lua_pushfstring(L, "%s is not a sequence (it has keys other than 1..%d)", what, (int)n));
  return n;
}

es_new_event *es_lua_check_events(lua_State *L, int idx, int arg, int64_t timer_now,
                                  size_t max_payload, size_t *n_out) {
  return es_lua_check_events_meta(L, idx, arg, timer_now, max_payload, NULL, n_out);
}

/* events[i].revision (ES_NONE: absent). A number that is no integer in
 * range is INVALID_ARGUMENT naming the field, a value of another type a
 * bad argument; the range itself is the store's rule (append.c), checked
 * here too so that 2^40 is refused rather than stored cut. */
static int64_t event_revision(conv *c, int t, size_t i) {
  lua_State *L = c->L;
  int64_t v = ES_NONE;
  int type = get_field(c, t, N_REVISION);
  if (type != LUA_TNIL) {
    int ok = 0;
    if (type != LUA_TNUMBER) bad_event(L, c->arg, "events[%d].revision must be an integer", (int)i + 1);
    v = lua_tointegerx(L, -1, &ok);
    if (!ok || v < 1 || v > ES_MAX_REVISION)
      es_lua_raisef(L, ES_INVALID_ARGUMENT, "%sevents[%d].revision must be an integer 1..%d", batch_prefix,
                    (int)i + 1, ES_MAX_REVISION);
  }
  lua_pop(L, 1);
  return v;
}

/* Encodes events[i].meta (the table at the top, or nil) into buf at its
 * end, with the defaults' members added (§4); returns whether a meta was
 * written. scratch: an empty buffer for the merge. Pops the value. */
static int event_meta(conv *c, size_t i, es_buf *buf, es_buf *scratch,
                      const es_meta_defaults *defaults) {
  lua_State *L = c->L;
  int type = lua_type(L, -1);
  size_t mark = buf->len;
  char what[96];
  es_err err = {0};
  event_what(what, i, ".meta");
  if (type != LUA_TNIL && type != LUA_TTABLE)
    bad_event(L, c->arg, "%s must be a table (a JSON object)", what);
  if (type == LUA_TTABLE) {
    buf->max = mark + ES_MAX_META_BYTES;
    int rc = es_json_encode_lua(L, -1, what, buf, &err);
    buf->max = 0;
    if (rc != ES_OK) es_lua_raise(L, &err);
    if (buf->data[mark] != '{') es_lua_raisef(L, ES_INVALID_ARGUMENT, "%s must be a JSON object", what);
  }
  lua_pop(L, 1);
  if (defaults && defaults->n) {
    scratch->len = 0;
    if (es_json_object_defaults(type == LUA_TTABLE ? buf->data + mark : NULL, buf->len - mark,
                                defaults->keys, defaults->vals, defaults->n, scratch, &err) != ES_OK)
      es_lua_raise(L, &err);
    buf->len = mark;
    if (es_buf_add(buf, scratch->data, scratch->len) != ES_OK)
      es_lua_raisef(L, ES_STORAGE, "out of memory while encoding JSON");
    return 1;
  }
  return type == LUA_TTABLE;
}

static es_new_event *check_events(lua_State *L, int idx, int arg, int64_t timer_now, size_t max_payload,
                                  const es_meta_defaults *defaults, size_t *n_out);

es_new_event *es_lua_check_events_meta(lua_State *L, int idx, int arg, int64_t timer_now,
                                       size_t max_payload, const es_meta_defaults *defaults,
                                       size_t *n_out) {
  batch_prefix[0] = '\0';
  return check_events(L, idx, arg, timer_now, max_payload, defaults, n_out);
}

es_new_event *es_lua_check_batch_events(lua_State *L, int idx, int arg, size_t max_payload, size_t batch,
                                        size_t *n_out) {
  snprintf(batch_prefix, sizeof batch_prefix, "batches[%zu]: ", batch + 1);
  es_new_event *v = check_events(L, idx, arg, ES_NONE, max_payload, NULL, n_out);
  batch_prefix[0] = '\0';
  return v;
}

static es_new_event *check_events(lua_State *L, int idx, int arg, int64_t timer_now, size_t max_payload,
                                  const es_meta_defaults *defaults, size_t *n_out) {
  idx = lua_absindex(L, idx);
  if (!lua_istable(L, idx)) {
    if (arg > 0) luaL_checktype(L, arg, LUA_TTABLE);
    luaL_error(L, "returned %s instead of a table of events", luaL_typename(L, idx));
  }
  /* Every element is checked to be a table before the array is sized:
   * lua_rawlen may report a border far beyond the elements that exist
   * ({[1] = e, [2] = e, [4] = e, ..., [2^62] = e} has length 2^62). */
  size_t n = (size_t)lua_rawlen(L, idx);
  /* A list and nothing else: one event passed without its enclosing list
   * ({type = "x"} has length 0) must not read as an empty batch. */
  size_t keys = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    keys++;
    if (!lua_isinteger(L, -1)) {
      lua_pop(L, 1);
      lua_getfield(L, idx, "type");
      int one = !lua_isnil(L, -1);
      lua_pop(L, 1);
      if (one) bad_event(L, arg, "events must be a list of events, not one event (wrap it: {event})");
      bad_event(L, arg, "events must be a list of events (keys 1..n only)");
    }
  }
  /* Not a sequence: some index in 1..keys + 1 is missing (keys integer
   * keys cannot fill keys + 1 slots), so this finds it in O(keys) even
   * when the length reported is a border far beyond the elements. */
  if (keys != n)
    for (size_t i = 1; i <= keys + 1; i++) {
      int missing = lua_rawgeti(L, idx, (lua_Integer)i) == LUA_TNIL;
      lua_pop(L, 1);
      if (missing) bad_event(L, arg, "events[%d] must be a table (events must be a list 1..n)", (int)i);
    }
  for (size_t i = 0; i < n; i++) {
    int type = lua_rawgeti(L, idx, (lua_Integer)i + 1);
    lua_pop(L, 1);
    if (type != LUA_TTABLE) bad_event(L, arg, "events[%d] must be a table", (int)i + 1);
  }
  /* The events, then where each payload and each meta starts in the
   * shared buffer (SIZE_MAX: none): the texts are placed only when the
   * buffer has stopped growing. */
  es_new_event *evs = lua_newuserdatauv(L, (n ? n : 1) * (sizeof *evs + 2 * sizeof(size_t)), 0);
  size_t *payload_at = (size_t *)(void *)(evs + (n ? n : 1));
  size_t *meta_at = payload_at + (n ? n : 1);
  lua_createtable(L, (int)(n > 25000 ? 0 : 2 * n + 1), 0); /* anchors names and the buffer */
  conv c = {L, arg, 0, lua_gettop(L), 0, {NULL, NULL, NULL, NULL}};
  /* Every payload is encoded into one buffer held by a box in the anchor
   * table: no Lua string and no allocation per payload, and an error raised
   * half-way through the batch (the third event lacks `type`) leaks nothing
   * (the box is freed with the anchor table). */
  es_buf *buf = es_lua_push_buf_box(L);
  anchor_top(&c);
  es_buf *scratch = NULL; /* the meta merge's (§4), only with defaults */
  if (defaults && defaults->n) {
    scratch = es_lua_push_buf_box(L);
    anchor_top(&c);
  }
  push_names(L);
  c.names = lua_gettop(L);
  for (size_t i = 0; i < n; i++) {
    es_new_event *e = &evs[i];
    es_new_event_init(e);
    payload_at[i] = meta_at[i] = SIZE_MAX;
    /* Checked again: an __index metamethod or a finalizer that ran while
     * an earlier event was read may have replaced this one. */
    if (lua_rawgeti(L, idx, (lua_Integer)i + 1) != LUA_TTABLE)
      bad_event(L, arg, "events[%d] must be a table (it was replaced while the events were read)",
                (int)i + 1);
    int t = lua_gettop(L);
    e->type = event_str(&c, t, i, N_TYPE, 0);
    if (!e->type) bad_event(L, arg, "events[%d].type is required", (int)i + 1);
    e->id = event_str(&c, t, i, N_ID, 1);
    e->lane = event_str(&c, t, i, N_LANE, 2);
    e->key = event_str(&c, t, i, N_KEY, 3); /* §3.10: seal the payload under it */
    int st = get_field(&c, t, N_SETTLED);
    if (st != LUA_TNIL && st != LUA_TBOOLEAN)
      bad_event(L, arg, "events[%d].settled must be a boolean", (int)i + 1);
    e->settled = lua_toboolean(L, -1);
    lua_pop(L, 1);
    e->not_before = event_int(&c, t, i, "", N_NOT_BEFORE, NULL);
    if (timer_now != ES_NONE) {
      /* Timers (engine): the rule is the store's (es_timer_not_before). */
      int has_at, has_delay;
      int64_t at = event_int(&c, t, i, "", N_AT, &has_at);
      int64_t delay = event_int(&c, t, i, "", N_DELAY_MS, &has_delay);
      if (has_at || has_delay) {
        if (e->not_before != ES_NONE)
          es_lua_raisef(L, ES_INVALID_ARGUMENT, "events[%d] has both not_before and %s", (int)i + 1,
                        has_at ? "at" : "delay_ms");
        char what[96];
        int64_t nb;
        es_err err = {0};
        event_what(what, i, "");
        if (es_timer_not_before(what, timer_now, has_delay, delay, has_at, at, &nb, &err) != ES_OK)
          es_lua_raise(L, &err);
        e->not_before = nb;
      }
    }
    int ct = get_field(&c, t, N_CAUSE);
    if (ct != LUA_TNIL) {
      if (ct != LUA_TTABLE) bad_event(L, arg, "events[%d].cause must be a table", (int)i + 1);
      int ci = lua_gettop(L);
      e->cause_index = event_int(&c, ci, i, "cause.", N_INDEX, NULL);
      e->cause_attempt = event_int(&c, ci, i, "cause.", N_ATTEMPT, NULL);
      if (e->cause_index == ES_NONE || e->cause_attempt == ES_NONE)
        bad_event(L, arg, "events[%d].cause needs integer index and attempt", (int)i + 1);
    }
    lua_pop(L, 1);
    if (get_field(&c, t, N_PAYLOAD) != LUA_TNIL) {
      char what[96];
      es_err err = {0};
      size_t mark = buf->len;
      event_what(what, i, ".payload");
      buf->max = max_payload && max_payload < SIZE_MAX - mark ? mark + max_payload : 0;
      if (es_json_encode_lua(L, -1, what, buf, &err) != ES_OK) es_lua_raise(L, &err);
      buf->max = 0;
      /* The encoder checks the limit where it grows the buffer; a buffer
       * shared by the batch may already have the room, so the limit is
       * checked here too, with the encoder's message. */
      if (max_payload && buf->len - mark > max_payload)
        es_lua_raisef(L, ES_TOO_LARGE, "%s is over the limit of %zu bytes", what, max_payload);
      e->payload_len = buf->len - mark;
      e->payload_encoded = 1; /* valid JSON by construction: not parsed again */
      payload_at[i] = mark;
      /* NUL-terminated, as a Lua string was: C readers may rely on it. */
      if (es_buf_addc(buf, '\0') != ES_OK)
        es_lua_raisef(L, ES_STORAGE, "out of memory while encoding JSON");
    }
    lua_pop(L, 1); /* payload */
    e->revision = event_revision(&c, t, i);
    size_t mark = buf->len;
    get_field(&c, t, N_META);
    if (event_meta(&c, i, buf, scratch, defaults)) {
      e->meta_len = buf->len - mark;
      meta_at[i] = mark;
      if (es_buf_addc(buf, '\0') != ES_OK) es_lua_raisef(L, ES_STORAGE, "out of memory while encoding JSON");
    }
    lua_pop(L, 1); /* event table */
  }
  for (size_t i = 0; i < n; i++) {
    if (payload_at[i] != SIZE_MAX) evs[i].payload = buf->data + payload_at[i];
    if (meta_at[i] != SIZE_MAX) evs[i].meta = buf->data + meta_at[i];
  }
  lua_settop(L, c.anchor); /* the names: callers get exactly the two slots documented */
  *n_out = n;
  return evs;
}
