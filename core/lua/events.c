/*
 * lua/events.c: converting between Lua values and the store's C structs,
 * shared by the store handle (lua/store_handle.c) and the engine (lua/engine_handle.c):
 * option-table fields, stored events to Lua tables, Lua event arrays to
 * es_new_event arrays.
 */
#include <lauxlib.h>
#include <lua.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "codec/json.h"
#include "lua/common.h"
#include "lua/events.h"

int64_t es_lua_opt_int_field(lua_State *L, int arg, const char *field, int64_t def) {
  if (lua_isnoneornil(L, arg)) return def;
  lua_getfield(L, arg, field);
  int64_t v = def;
  if (!lua_isnil(L, -1)) {
    int ok;
    v = lua_tointegerx(L, -1, &ok);
    if (!ok) luaL_argerror(L, arg, lua_pushfstring(L, "field '%s' must be an integer", field));
  }
  lua_pop(L, 1);
  return v;
}

/* A string field; returns NULL when absent. The string stays valid while
 * the table at arg is on the stack and unchanged. */
const char *es_lua_opt_str_field(lua_State *L, int arg, const char *field) {
  if (lua_isnoneornil(L, arg)) return NULL;
  lua_getfield(L, arg, field);
  const char *v = NULL;
  if (!lua_isnil(L, -1)) {
    if (lua_type(L, -1) != LUA_TSTRING)
      luaL_argerror(L, arg, lua_pushfstring(L, "field '%s' must be a string", field));
    v = lua_tostring(L, -1);
  }
  lua_pop(L, 1);
  return v;
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
  lua_createtable(L, 0, 20);
  es_lua_set_str(L, "id", e->id);
  es_lua_set_str(L, "type", e->type);
  es_err err = {0};
  if (es_json_decode_lua(L, e->payload, e->payload_len, &err) != ES_OK) es_lua_raise(L, &err);
  lua_setfield(L, -2, "payload");
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
  if (claimed) es_lua_set_int(L, "attempt", e->attempts);
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

/* An optional integer field of the event table at t. */
static int64_t event_int(lua_State *L, int t, int arg, size_t i, const char *field) {
  int64_t v = ES_NONE;
  lua_getfield(L, t, field);
  if (!lua_isnil(L, -1)) {
    int ok;
    v = lua_tointegerx(L, -1, &ok);
    if (!ok) bad_event(L, arg, "events[%d].%s must be an integer", (int)i + 1, field);
  }
  lua_pop(L, 1);
  return v;
}

static const char *event_str(lua_State *L, int t, int arg, size_t i, const char *field) {
  const char *v = NULL;
  lua_getfield(L, t, field);
  if (!lua_isnil(L, -1)) {
    if (lua_type(L, -1) != LUA_TSTRING)
      bad_event(L, arg, "events[%d].%s must be a string", (int)i + 1, field);
    v = lua_tostring(L, -1); /* stays valid: the event table holds it */
  }
  lua_pop(L, 1);
  return v;
}

es_new_event *es_lua_check_events(lua_State *L, int idx, int arg, int64_t timer_now,
                                  size_t max_payload, size_t *n_out) {
  idx = lua_absindex(L, idx);
  if (!lua_istable(L, idx)) {
    if (arg > 0) luaL_checktype(L, arg, LUA_TTABLE);
    luaL_error(L, "returned %s instead of a table of events", luaL_typename(L, idx));
  }
  size_t n = (size_t)lua_rawlen(L, idx);
  es_new_event *evs = lua_newuserdatauv(L, (n ? n : 1) * sizeof *evs, 0);
  lua_createtable(L, (int)(n > 100000 ? 0 : n), 0); /* anchors the payload texts */
  int anchor = lua_gettop(L);
  es_buf buf;
  es_buf_init(&buf);
  for (size_t i = 0; i < n; i++) {
    es_new_event *e = &evs[i];
    es_new_event_init(e);
    if (lua_rawgeti(L, idx, (lua_Integer)i + 1) != LUA_TTABLE)
      bad_event(L, arg, "events[%d] must be a table", (int)i + 1);
    int t = lua_gettop(L);
    e->type = event_str(L, t, arg, i, "type");
    if (!e->type) bad_event(L, arg, "events[%d].type is required", (int)i + 1);
    e->id = event_str(L, t, arg, i, "id");
    e->lane = event_str(L, t, arg, i, "lane");
    lua_getfield(L, t, "settled");
    if (!lua_isnil(L, -1) && !lua_isboolean(L, -1))
      bad_event(L, arg, "events[%d].settled must be a boolean", (int)i + 1);
    e->settled = lua_toboolean(L, -1);
    lua_pop(L, 1);
    e->not_before = event_int(L, t, arg, i, "not_before");
    if (timer_now != ES_NONE) {
      /* Timers (engine): `at` is absolute, `delay_ms` counts from now. */
      int64_t at = event_int(L, t, arg, i, "at");
      int64_t delay = event_int(L, t, arg, i, "delay_ms");
      if (at != ES_NONE && delay != ES_NONE)
        bad_event(L, arg, "events[%d] has both at and delay_ms", (int)i + 1);
      if (delay != ES_NONE && delay < 0)
        bad_event(L, arg, "events[%d].delay_ms must be >= 0", (int)i + 1);
      if (at != ES_NONE) e->not_before = at;
      if (delay != ES_NONE) e->not_before = timer_now + delay;
    }
    lua_getfield(L, t, "cause");
    if (!lua_isnil(L, -1)) {
      if (!lua_istable(L, -1)) bad_event(L, arg, "events[%d].cause must be a table", (int)i + 1);
      int c = lua_gettop(L);
      e->cause_index = event_int(L, c, arg, i, "index");
      e->cause_attempt = event_int(L, c, arg, i, "attempt");
      if (e->cause_index == ES_NONE || e->cause_attempt == ES_NONE)
        bad_event(L, arg, "events[%d].cause needs integer index and attempt", (int)i + 1);
    }
    lua_pop(L, 1);
    lua_getfield(L, t, "payload");
    if (!lua_isnil(L, -1)) {
      char what[32];
      es_err err = {0};
      snprintf(what, sizeof what, "events[%d].payload", (int)i + 1);
      buf.len = 0;
      buf.max = max_payload;
      if (es_json_encode_lua(L, -1, what, &buf, &err) != ES_OK) {
        es_buf_destroy(&buf);
        es_lua_raise(L, &err);
      }
      es_lua_push_buf(L, &buf);
      e->payload = lua_tolstring(L, -1, &e->payload_len);
      lua_rawseti(L, anchor, (lua_Integer)i + 1);
    }
    lua_pop(L, 2); /* payload, event table */
  }
  es_buf_destroy(&buf);
  *n_out = n;
  return evs;
}
