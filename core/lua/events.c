/*
 * lua/events.c: converting between Lua values and the store's C structs,
 * shared by the store handle (lua/store_handle.c) and the engine (lua/engine_handle.c):
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
 * the core's rules (store.c).
 */
#include <lauxlib.h>
#include <lua.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "codec/json.h"
#include "lua/common.h"
#include "lua/events.h"

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

static const char *status_name(int status) {
  switch (status) {
    case ES_STATUS_PROCESSED: return "processed";
    case ES_STATUS_DEAD: return "dead";
    default: return "pending";
  }
}

void es_lua_push_event(lua_State *L, const es_event *e, int claimed) {
  lua_createtable(L, 0, 26);
  es_lua_set_str(L, "id", e->id);
  es_lua_set_str(L, "type", e->type);
  es_err err = {0};
  if (!e->payload) {
    lua_pushnil(L); /* §3.10: a shredded payload */
  } else if (es_json_decode_lua(L, e->payload, e->payload_len, &err) != ES_OK) {
    es_lua_raise(L, &err);
  }
  lua_setfield(L, -2, "payload");
  es_lua_set_str(L, "key", e->key);
  if (e->shredded) {
    lua_pushboolean(L, 1);
    lua_setfield(L, -2, "shredded");
  }
  es_lua_set_int(L, "index", e->index);
  es_lua_set_str(L, "session", e->session);
  es_lua_set_int(L, "position", e->position);
  es_lua_set_int(L, "created_at", e->created_at);
  if (e->cause_index != ES_NONE) {
    lua_createtable(L, 0, 2);
    es_lua_set_int(L, "index", e->cause_index);
    es_lua_set_int(L, "attempt", e->cause_attempt);
    lua_setfield(L, -2, "cause");
  }
  es_lua_set_str(L, "lane", e->lane);
  es_lua_set_int(L, "not_before", e->not_before);
  es_lua_set_str(L, "status", status_name(e->status));
  es_lua_set_int(L, "attempts", e->attempts);
  es_lua_set_int(L, "failures", e->failures);
  es_lua_set_str(L, "last_error", e->last_error);
  es_lua_set_int(L, "processed_at", e->processed_at);
  es_lua_set_str(L, "claim_holder", e->claim_holder);
  es_lua_set_int(L, "claim_expires_at", e->claim_expires_at);
  es_lua_set_int(L, "retry_at", e->retry_at);
  es_lua_set_int(L, "first_claimed_at", e->first_claimed_at);
  es_lua_set_int(L, "last_claimed_at", e->last_claimed_at);
  es_lua_set_int(L, "failed_at", e->failed_at);
  es_lua_set_int(L, "processed_by_attempt", e->processed_by_attempt);
  if (e->origin_session) {
    lua_createtable(L, 0, 2);
    es_lua_set_str(L, "session", e->origin_session);
    es_lua_set_int(L, "index", e->origin_index);
    lua_setfield(L, -2, "origin");
  }
  if (claimed) es_lua_set_int(L, "attempt", e->attempts);
}

void es_lua_push_event_at_rest(lua_State *L, const es_event *e) {
  if (!e->key) {
    es_lua_push_event(L, e, 0);
    return;
  }
  es_event v = *e; /* borrowed fields: the sealed text is not JSON */
  v.payload = NULL;
  v.payload_len = 0;
  es_lua_push_event(L, &v, 0);
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

static int events_box_gc(lua_State *L) {
  es_events_destroy(lua_touserdata(L, 1));
  return 0;
}

/* Pushes an array of events and frees the list. The list moves into a
 * userdata first, so a Lua error while building the tables (out of memory,
 * a stored payload that does not decode) cannot leak it. */
void es_lua_push_events(lua_State *L, es_events *list, int claimed) {
  es_events *box = lua_newuserdatauv(L, sizeof *box, 0);
  *box = *list; /* the caller's list is ours now, even if the next lines raise */
  memset(list, 0, sizeof *list);
  if (luaL_newmetatable(L, "eventstore.EventsBox")) {
    lua_pushcfunction(L, events_box_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  lua_createtable(L, (int)(box->n > 1000000 ? 0 : box->n), 0);
  for (size_t i = 0; i < box->n; i++) {
    es_lua_push_event(L, &box->v[i], claimed);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  es_events_destroy(box);
  lua_remove(L, -2);
}

/* A bad event: an argument error when the events came as argument `arg`,
 * else a plain error (events a handler returned). Never returns. */
static int bad_event(lua_State *L, int arg, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const char *msg = lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  if (arg > 0) return luaL_argerror(L, arg, msg);
  return luaL_error(L, "returned %s", msg);
}

/* An optional integer field of the event table at t (`sub`: "" or "cause."
 * for messages); *has (may be NULL) tells whether it was given.
 * math.mininteger is refused: it is ES_NONE. */
static int64_t event_int(lua_State *L, int t, int arg, size_t i, const char *sub, const char *field,
                         int *has) {
  int64_t v = ES_NONE;
  lua_getfield(L, t, field);
  if (has) *has = !lua_isnil(L, -1);
  if (!lua_isnil(L, -1)) {
    int ok = 0;
    if (lua_type(L, -1) == LUA_TNUMBER) v = lua_tointegerx(L, -1, &ok);
    if (!ok) bad_event(L, arg, "events[%d].%s%s must be an integer", (int)i + 1, sub, field);
    if (v == ES_NONE)
      es_lua_raisef(L, ES_INVALID_ARGUMENT, "events[%d].%s%s is out of range (math.mininteger)",
                    (int)i + 1, sub, field);
  }
  lua_pop(L, 1);
  return v;
}

/* Keeps the value at the top alive as long as the anchor table at anchor
 * (the conversion's second result) and pops it. */
static void anchor_top(lua_State *L, int anchor) {
  lua_rawseti(L, anchor, (lua_Integer)lua_rawlen(L, anchor) + 1);
}

/* An optional name field of the event table at t (NUL refused). The string
 * is anchored: an __index metamethod may have made it, or may replace the
 * field of an event read before. */
static const char *event_str(lua_State *L, int t, int anchor, int arg, size_t i,
                             const char *field) {
  const char *v = NULL;
  lua_getfield(L, t, field);
  if (!lua_isnil(L, -1)) {
    size_t n;
    if (lua_type(L, -1) != LUA_TSTRING)
      bad_event(L, arg, "events[%d].%s must be a string", (int)i + 1, field);
    v = lua_tolstring(L, -1, &n);
    if (memchr(v, '\0', n))
      es_lua_raisef(L, ES_INVALID_ARGUMENT, "events[%d].%s must not contain a NUL byte", (int)i + 1,
                    field);
    anchor_top(L, anchor);
    return v;
  }
  lua_pop(L, 1);
  return v;
}

static int buf_box_gc(lua_State *L) {
  es_buf_destroy(lua_touserdata(L, 1));
  return 0;
}

es_buf *es_lua_push_buf_box(lua_State *L) {
  es_buf *b = lua_newuserdatauv(L, sizeof *b, 0);
  es_buf_init(b); /* empty before anything can raise: a box without its __gc leaks nothing */
  if (luaL_newmetatable(L, "eventstore.BufBox")) {
    lua_pushcfunction(L, buf_box_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  return b;
}

size_t es_lua_check_seq(lua_State *L, int idx, int arg, const char *what) {
  idx = lua_absindex(L, idx);
  size_t n = (size_t)lua_rawlen(L, idx);
  for (size_t i = 0; i < n; i++) {
    int t = lua_rawgeti(L, idx, (lua_Integer)i + 1);
    lua_pop(L, 1);
    if (t == LUA_TNIL) {
      const char *msg = lua_pushfstring(L, "%s is not a sequence (no [%d])", what, (int)i + 1);
      if (arg > 0) luaL_argerror(L, arg, msg);
      lua_error(L);
    }
  }
  return n;
}

es_new_event *es_lua_check_events(lua_State *L, int idx, int arg, int64_t timer_now,
                                  size_t max_payload, size_t *n_out) {
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
  es_new_event *evs = lua_newuserdatauv(L, (n ? n : 1) * sizeof *evs, 0);
  lua_createtable(L, (int)(n > 25000 ? 0 : 4 * n), 0); /* anchors payload texts and names */
  int anchor = lua_gettop(L);
  /* The encoder's buffer lives in a box collected with the stack: an error
   * raised half-way through the batch (the third event lacks `type`) must
   * not leak what the payloads before it grew. */
  es_buf *buf = es_lua_push_buf_box(L);
  for (size_t i = 0; i < n; i++) {
    es_new_event *e = &evs[i];
    es_new_event_init(e);
    lua_rawgeti(L, idx, (lua_Integer)i + 1);
    int t = lua_gettop(L);
    e->type = event_str(L, t, anchor, arg, i, "type");
    if (!e->type) bad_event(L, arg, "events[%d].type is required", (int)i + 1);
    e->id = event_str(L, t, anchor, arg, i, "id");
    e->lane = event_str(L, t, anchor, arg, i, "lane");
    e->key = event_str(L, t, anchor, arg, i, "key"); /* §3.10: seal the payload under it */
    lua_getfield(L, t, "settled");
    if (!lua_isnil(L, -1) && !lua_isboolean(L, -1))
      bad_event(L, arg, "events[%d].settled must be a boolean", (int)i + 1);
    e->settled = lua_toboolean(L, -1);
    lua_pop(L, 1);
    e->not_before = event_int(L, t, arg, i, "", "not_before", NULL);
    if (timer_now != ES_NONE) {
      /* Timers (engine): the rule is the store's (es_timer_not_before). */
      int has_at, has_delay;
      int64_t at = event_int(L, t, arg, i, "", "at", &has_at);
      int64_t delay = event_int(L, t, arg, i, "", "delay_ms", &has_delay);
      if ((has_at || has_delay) && e->not_before != ES_NONE)
        es_lua_raisef(L, ES_INVALID_ARGUMENT, "events[%d] has both not_before and %s", (int)i + 1,
                      has_at ? "at" : "delay_ms");
      char what[32];
      int64_t nb;
      es_err err = {0};
      snprintf(what, sizeof what, "events[%d]", (int)i + 1);
      if (es_timer_not_before(what, timer_now, has_delay, delay, has_at, at, &nb, &err) != ES_OK)
        es_lua_raise(L, &err);
      if (has_at || has_delay) e->not_before = nb;
    }
    lua_getfield(L, t, "cause");
    if (!lua_isnil(L, -1)) {
      if (!lua_istable(L, -1)) bad_event(L, arg, "events[%d].cause must be a table", (int)i + 1);
      int c = lua_gettop(L);
      e->cause_index = event_int(L, c, arg, i, "cause.", "index", NULL);
      e->cause_attempt = event_int(L, c, arg, i, "cause.", "attempt", NULL);
      if (e->cause_index == ES_NONE || e->cause_attempt == ES_NONE)
        bad_event(L, arg, "events[%d].cause needs integer index and attempt", (int)i + 1);
    }
    lua_pop(L, 1);
    lua_getfield(L, t, "payload");
    if (!lua_isnil(L, -1)) {
      char what[32];
      es_err err = {0};
      snprintf(what, sizeof what, "events[%d].payload", (int)i + 1);
      buf->len = 0;
      buf->max = max_payload;
      if (es_json_encode_lua(L, -1, what, buf, &err) != ES_OK) es_lua_raise(L, &err);
      es_lua_push_buf(L, buf);
      e->payload = lua_tolstring(L, -1, &e->payload_len);
      anchor_top(L, anchor);
    }
    lua_pop(L, 2); /* payload, event table */
  }
  es_buf_destroy(buf); /* now rather than at collection */
  lua_pop(L, 1);       /* the box: callers get exactly the two slots documented */
  *n_out = n;
  return evs;
}
