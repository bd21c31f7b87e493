/*
 * lua/events.h: Lua <-> C conversions shared by the store handle and the
 * engine (lua/events.c). Functions that read Lua arguments raise standard
 * Lua argument errors for misuse, like luaL_check*.
 */
#ifndef ES_LUA_EVENTS_H
#define ES_LUA_EVENTS_H

#include <lua.h>

#include "store/store.h"

/* Fields of an optional options table at stack index arg (nil/none: the
 * default). A wrong type raises an argument error naming the field.
 * Strings are borrowed from the table (valid while it is on the stack). */
int64_t es_lua_opt_int_field(lua_State *L, int arg, const char *field, int64_t def);
const char *es_lua_opt_str_field(lua_State *L, int arg, const char *field);
const char *es_lua_req_str_field(lua_State *L, int arg, const char *field);

/* t[k] = v on the table at the top; nothing when v is ES_NONE / NULL. */
void es_lua_set_int(lua_State *L, const char *k, int64_t v);
void es_lua_set_str(lua_State *L, const char *k, const char *v);

/* Pushes a stored event as a Lua table (payload decoded); `claimed` adds
 * `attempt`. */
void es_lua_push_event(lua_State *L, const es_event *e, int claimed);
/* Pushes an array of events and destroys the list. */
void es_lua_push_events(lua_State *L, es_events *list, int claimed);

/* Reads the array of events at stack index idx into an es_new_event array
 * held by a userdata, encoding payloads into strings held by a table; both
 * are pushed (2 slots) and keep everything alive while they stay on the
 * stack, so an error anywhere leaks nothing. arg > 0: misuse raises an
 * argument error for argument arg; arg == 0 (events a handler returned):
 * a plain error "returned events[i]...". timer_now != ES_NONE also accepts
 * `delay_ms` (not_before = timer_now + delay_ms) and `at` (not_before = at).
 * Payloads that JSON cannot carry raise INVALID_ARGUMENT error objects; a
 * payload whose text would pass max_payload (0: no limit) raises TOO_LARGE
 * as soon as the encoder gets there. */
es_new_event *es_lua_check_events(lua_State *L, int idx, int arg, int64_t timer_now,
                                  size_t max_payload, size_t *n_out);

#endif
