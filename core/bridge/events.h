/*
 * bridge/events.h: Lua <-> C conversions shared by the module's handles and
 * the engine (bridge/events.c). Functions that read Lua arguments raise standard
 * Lua argument errors for misuse, like luaL_check*.
 */
#ifndef ES_LUA_EVENTS_H
#define ES_LUA_EVENTS_H

#include <lua.h>

#include "store/store.h"
#include "util/buf.h"

/* Names (sessions, ids, types, lanes, holders, reducers, versions, presence
 * namespaces, participants and fields, cursors and prefixes, URLs). The
 * store's C API takes NUL-terminated strings, so a NUL inside a Lua string
 * would silently cut the name there: every name read from Lua goes through
 * these, which raise INVALID_ARGUMENT "<what> must not contain a NUL byte".
 * The other name rules (non-empty, <= 255 bytes, UTF-8) are the core's
 * (es_check_name). es_lua_name checks the string already at idx;
 * es_lua_check_name a required argument (a non-string raises the usual
 * argument error), es_lua_opt_name an optional one (nil/none: NULL).
 * Strings are borrowed from the stack. */
const char *es_lua_name(lua_State *L, int idx, const char *what);
const char *es_lua_check_name(lua_State *L, int arg, const char *what);
const char *es_lua_opt_name(lua_State *L, int arg, const char *what);

/* Integer arguments: a Lua number with an integer value (3 or 3.0, not "3",
 * 3.5 or 2^63), else an argument error naming `what`. es_lua_check_int
 * accepts every integer (indexes and attempts are lookup keys);
 * es_lua_opt_int (nil/none: def) refuses math.mininteger with
 * INVALID_ARGUMENT, because it is ES_NONE, the C API's "absent". */
int64_t es_lua_check_int(lua_State *L, int arg, const char *what);
int64_t es_lua_opt_int(lua_State *L, int arg, const char *what, int64_t def);

/* Fields of an optional options table at stack index arg (nil/none: the
 * default). A wrong type raises an argument error naming the field; an
 * integer field is read like es_lua_opt_int; a string field is a name
 * (NUL refused, as above). Strings are borrowed: valid while the table is
 * on the stack and unchanged (one made by an __index metamethod is left on
 * the stack to keep it alive). */
int64_t es_lua_opt_int_field(lua_State *L, int arg, const char *field, int64_t def);
const char *es_lua_opt_str_field(lua_State *L, int arg, const char *field);
const char *es_lua_req_str_field(lua_State *L, int arg, const char *field);
/* A free-text field (a failure's `error`): any bytes, NUL included, with
 * their length in *len; store it through es_text_clean (store.h). */
const char *es_lua_opt_text_field(lua_State *L, int arg, const char *field, size_t *len);

/* Pushes an empty es_buf in a userdata whose __gc destroys it: a buffer
 * that lives while Lua code may raise (it is freed with the stack). */
es_buf *es_lua_push_buf_box(lua_State *L);

/* The length of the sequence at idx, after checking that each of its
 * elements exists (lua_rawlen alone may report a border far beyond the
 * elements, e.g. for {[1]=x, [2]=x, [4]=x, ..., [2^62]=x}), so callers can
 * size arrays by it, and that the table holds nothing else: a key past a
 * hole ({1, [3] = 3}: `#` may say 1) would otherwise be skipped without a
 * word, an index a caller listed in `exclude` claimed all the same. A hole
 * or another key raises an argument error for arg (arg > 0) or a plain
 * error naming `what`. */
size_t es_lua_check_seq(lua_State *L, int idx, int arg, const char *what);

/* es_lua_check_seq of argument arg, which must also hold nothing but its
 * elements: one item passed without its enclosing list must not read as
 * an empty list. Otherwise an argument error saying `shape`. */
size_t es_lua_check_list(lua_State *L, int arg, const char *what, const char *shape);

/* t[k] = v on the table at the top; nothing when v is ES_NONE / NULL. */
void es_lua_set_int(lua_State *L, const char *k, int64_t v);
void es_lua_set_str(lua_State *L, const char *k, const char *v);

/* Pushes a stored event as a Lua table (payload decoded); `claimed` adds
 * `attempt`. */
void es_lua_push_event(lua_State *L, const es_event *e, int claimed);
/* Builds the tables of many events in a row, as es_lua_push_event does
 * (the same fields, values and subtypes), but cheaper per event: the field
 * names are pushed once and copied from the stack, a session, type, lane
 * or holder that repeats from the previous event reuses its Lua string,
 * and payloads are decoded by one decoder without a lua_pcall each (the
 * reducer fold and the projection runner, which build one table per event
 * of a long history). es_lua_pusher_begin pushes the pusher's slots (may
 * raise: out of memory) and makes room for a caller's few values above
 * them; es_lua_pusher_push pushes one event's table; es_lua_pusher_end
 * pops everything from the slots up. Event texts are borrowed: the events
 * must stay alive until the end. es_lua_pusher_push_text pushes a string
 * through a cache slot (ES_PUSHER_TYPE: look a step up by the event's type
 * before building its table). */
enum { ES_PUSHER_SESSION, ES_PUSHER_TYPE, ES_PUSHER_SLOTS = 4 };
typedef struct es_lua_pusher {
  lua_State *L;
  int names; /* stack index of the names array */
  int slots; /* stack index of the first of the cache slots; 0: no cache */
  int keys;  /* with a cache: the names are also on the stack, name k at keys + k */
  /* With a cache: the payload decoder of the list (its userdata is on the
   * stack, above the names), which decodes without a lua_pcall per payload
   * and keeps its scratch buffers from one payload to the next; NULL: each
   * payload is decoded by es_json_decode_lua. */
  struct es_json_decoder *jd;
  /* the text each slot holds, borrowed from the event list being pushed;
   * NULL: the slot is empty */
  const char *text[ES_PUSHER_SLOTS];
} es_lua_pusher;
void es_lua_pusher_begin(lua_State *L, es_lua_pusher *p);
void es_lua_pusher_push(es_lua_pusher *p, const es_event *e);
void es_lua_pusher_push_text(es_lua_pusher *p, const char *text, int slot);
void es_lua_pusher_end(es_lua_pusher *p);

/* §3.10 read_at_rest: a keyed event with its stored (sealed) text as
 * `ciphertext` and no payload; others as es_lua_push_event. */
void es_lua_push_event_at_rest(lua_State *L, const es_event *e);
/* Pushes an array of events and destroys the list. */
void es_lua_push_events(lua_State *L, es_events *list, int claimed);
/* Pushes the array of the events' ids, in order, and destroys the list:
 * an append's answer under opts.answer = "ids". */
void es_lua_push_event_ids(lua_State *L, es_events *list);
/* opts.answer of an append (opts at stack index arg, a table or nil): 1
 * for "ids", 0 for "events" or none. A value that is no string is an
 * argument error, another string INVALID_ARGUMENT. */
int es_lua_opt_answer_ids(lua_State *L, int arg);
/* Pushes a lease answer {outcome = "acquired"|"held", holder, token?,
 * expires_at} and frees l first (so a Lua error cannot leak it). */
void es_lua_push_lease(lua_State *L, es_lease *l);

/* Reads the array of events at stack index idx into an es_new_event array
 * held by a userdata, encoding payloads into strings held by a table (which
 * also anchors the names); both are pushed (2 slots) and keep everything
 * alive while they stay on the stack, so an error anywhere leaks nothing.
 * arg > 0: misuse (a wrong type) raises an argument error for argument
 * arg; arg == 0 (events a handler returned): a plain error "returned
 * events[i]...". timer_now != ES_NONE also accepts `delay_ms` and `at`, by
 * the store's one timer rule (es_timer_not_before; not with not_before).
 * Names with a NUL, payloads that JSON cannot carry and timer values out of
 * range raise INVALID_ARGUMENT error objects; a payload whose text would
 * pass max_payload (0: no limit) raises TOO_LARGE as soon as the encoder
 * gets there. §3.1: `revision` must be an integer 1..2^31-1 (another
 * number: INVALID_ARGUMENT; another type: misuse) and `meta` a table that
 * encodes as a JSON object (TOO_LARGE past 8 KiB), encoded beside the
 * payloads. */
es_new_event *es_lua_check_events(lua_State *L, int idx, int arg, int64_t timer_now,
                                  size_t max_payload, size_t *n_out);

/* es_lua_check_events of append_many's batch `batch` (0-based): every
 * message about its events starts "batches[batch + 1]: ", as the store's
 * own errors about a batch do. */
es_new_event *es_lua_check_batch_events(lua_State *L, int idx, int arg, size_t max_payload, size_t batch,
                                        size_t *n_out);

/* Members added to every event's meta where it lacks them (§4: a handler's
 * results get correlation and causation): keys[k] = vals[k], vals[k]
 * NULL: none. Borrowed. */
typedef struct es_meta_defaults {
  const char *keys[4];
  const char *vals[4];
  size_t n;
} es_meta_defaults;

/* es_lua_check_events, each event's meta given the members of defaults
 * (NULL: none) that it lacks; an event without meta gets them alone. */
es_new_event *es_lua_check_events_meta(lua_State *L, int idx, int arg, int64_t timer_now,
                                       size_t max_payload, const es_meta_defaults *defaults,
                                       size_t *n_out);

#endif
