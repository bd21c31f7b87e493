/*
 * module/store_dispatch.c: the store handle's dispatch methods (§3.2:
 * claim, claim_next, renew, complete, complete_many, fail, revive,
 * settle, dead letters) and fences, leases and seals (§3.8).
 */
#include <lauxlib.h>
#include <lua.h>
#include <stdio.h>
#include <string.h>

#include "bridge/common.h"
#include "bridge/events.h"
#include "module/store_internal.h"
#include "store/store.h"


/* ---------------------------------------------------------------------- */
/* 3.2 dispatch */

static int m_claim(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  luaL_checktype(L, 3, LUA_TTABLE);
  es_claim_opts o = {0};
  o.holder = es_lua_req_str_field(L, 3, "holder");
  o.ttl_ms = es_lua_opt_int_field(L, 3, "ttl_ms", ES_NONE);
  o.expires_at = es_lua_opt_int_field(L, 3, "expires_at", ES_NONE);
  if (o.ttl_ms == ES_NONE && o.expires_at == ES_NONE)
    luaL_argerror(L, 3, "field 'ttl_ms' or 'expires_at' is required");
  o.limit = es_lua_opt_int_field(L, 3, "limit", ES_NONE);
  lua_getfield(L, 3, "exclude");
  if (!lua_isnil(L, -1)) {
    if (!lua_istable(L, -1)) luaL_argerror(L, 3, "field 'exclude' must be a table of indexes");
    size_t n = es_lua_check_seq(L, -1, 3, "field 'exclude'");
    int64_t *ex = lua_newuserdatauv(L, (n ? n : 1) * sizeof *ex, 0);
    for (size_t i = 0; i < n; i++) {
      int ok = 0;
      if (lua_rawgeti(L, -2, (lua_Integer)i + 1) == LUA_TNUMBER) ex[i] = lua_tointegerx(L, -1, &ok);
      if (!ok) luaL_argerror(L, 3, "field 'exclude' must hold integer indexes");
      lua_pop(L, 1);
    }
    o.exclude = ex;
    o.n_exclude = n;
  }
  int outcome = 0;
  int64_t retry_at;
  es_events *out = owned_push(L, sizeof *out, destroy_events);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_claim(s, session, &o, &outcome, out, &retry_at, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, 3);
  if (outcome == ES_CLAIMED) {
    es_lua_set_str(L, "outcome", "claimed");
    es_lua_push_events(L, out, 1);
    lua_setfield(L, -2, "events");
  } else {
    es_events_destroy(out);
    es_lua_set_str(L, "outcome", outcome == ES_BUSY ? "busy" : "settled");
    if (outcome == ES_BUSY) es_lua_set_int(L, "retry_at", retry_at);
  }
  return es_lstore_done(L, h, 1);
}

/* claim_next's `types` (the table at the top, popped): copied, pointers
 * and bytes, into one userdata left on the stack, so a clock function that
 * changes the table during the call cannot free a name the core reads.
 * *n gets the count; NUL inside a name is refused here, the rest of the
 * name rules (and the count limit) by the core. */
static const char *const *check_types(lua_State *L, size_t *n) {
  int t = lua_gettop(L);
  if (!lua_istable(L, t)) luaL_argerror(L, 2, "field 'types' must be a table of type names");
  *n = es_lua_check_seq(L, t, 2, "field 'types'");
  size_t bytes = 0;
  for (size_t i = 0; i < *n; i++) {
    size_t len;
    if (lua_rawgeti(L, t, (lua_Integer)i + 1) != LUA_TSTRING)
      luaL_argerror(L, 2, "field 'types' must hold strings (type names)");
    lua_tolstring(L, -1, &len);
    char what[32];
    snprintf(what, sizeof what, "types[%zu]", i + 1);
    es_lua_name(L, -1, what);
    lua_pop(L, 1);
    bytes += len + 1;
  }
  size_t head = (*n ? *n : 1) * sizeof(char *);
  char **v = lua_newuserdatauv(L, head + bytes, 0);
  char *p = (char *)v + head;
  for (size_t i = 0; i < *n; i++) {
    size_t len;
    lua_rawgeti(L, t, (lua_Integer)i + 1);
    const char *name = lua_tolstring(L, -1, &len);
    memcpy(p, name, len + 1);
    v[i] = p;
    p += len + 1;
    lua_pop(L, 1);
  }
  lua_remove(L, t);
  return (const char *const *)v;
}

static int m_claim_next(lua_State *L) {
  lstore *h = check_store(L);
  luaL_checktype(L, 2, LUA_TTABLE);
  const char *holder = es_lua_req_str_field(L, 2, "holder");
  int64_t ttl = es_lua_opt_int_field(L, 2, "ttl_ms", ES_NONE);
  if (ttl == ES_NONE) luaL_argerror(L, 2, "field 'ttl_ms' is required");
  int64_t limit = es_lua_opt_int_field(L, 2, "limit", 1);
  const char *const *types = NULL;  /* absent: every type */
  size_t n_types = 0;
  lua_getfield(L, 2, "types");
  if (lua_isnil(L, -1)) lua_pop(L, 1);
  else types = check_types(L, &n_types);
  int64_t retry_at;
  es_events *out = owned_push(L, sizeof *out, destroy_events);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_claim_next(s, holder, ttl, limit, types, n_types, NULL, 0, out, &retry_at, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  es_lua_push_events(L, out, 1);
  if (retry_at == ES_NONE) lua_pushnil(L);
  else lua_pushinteger(L, retry_at);
  return es_lstore_done(L, h, 2);
}

static void push_int_array(lua_State *L, const int64_t *v, size_t n) {
  lua_createtable(L, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    lua_pushinteger(L, v[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
}

static int m_renew(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  luaL_checktype(L, 3, LUA_TTABLE);
  const char *holder = es_lua_req_str_field(L, 3, "holder");
  int64_t ttl = es_lua_opt_int_field(L, 3, "ttl_ms", ES_NONE);
  int64_t expires_at = es_lua_opt_int_field(L, 3, "expires_at", ES_NONE);
  if (ttl == ES_NONE && expires_at == ES_NONE)
    luaL_argerror(L, 3, "field 'ttl_ms' or 'expires_at' is required");
  lua_getfield(L, 3, "claims");
  if (!lua_istable(L, -1)) luaL_argerror(L, 3, "field 'claims' must be a table of {index, attempt}");
  size_t n = es_lua_check_seq(L, -1, 3, "field 'claims'");
  es_claim_ref *claims = lua_newuserdatauv(L, (n ? n : 1) * sizeof *claims, 0);
  for (size_t i = 0; i < n; i++) {
    int ok1 = 0, ok2 = 0;
    if (lua_rawgeti(L, -2, (lua_Integer)i + 1) != LUA_TTABLE)
      luaL_argerror(L, 3, "field 'claims' must hold {index, attempt} tables");
    lua_getfield(L, -1, "index");
    lua_getfield(L, -2, "attempt");
    if (lua_isnil(L, -2)) { /* positional {index, attempt} */
      lua_pop(L, 2);
      lua_rawgeti(L, -1, 1);
      lua_rawgeti(L, -2, 2);
    }
    if (lua_type(L, -2) == LUA_TNUMBER) claims[i].index = lua_tointegerx(L, -2, &ok1);
    if (lua_type(L, -1) == LUA_TNUMBER) claims[i].attempt = lua_tointegerx(L, -1, &ok2);
    if (!ok1 || !ok2)
      luaL_argerror(L, 3, "field 'claims' needs integer index and attempt in each claim");
    lua_pop(L, 3);
  }
  es_renew_result *r = owned_push(L, sizeof *r, destroy_renew);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_renew(s, session, holder, claims, n, ttl, expires_at, r, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, 2);
  push_int_array(L, r->renewed, r->n_renewed);
  lua_setfield(L, -2, "renewed");
  push_int_array(L, r->superseded, r->n_superseded);
  lua_setfield(L, -2, "superseded");
  es_renew_result_destroy(r);
  return es_lstore_done(L, h, 1);
}

/* opts.cancel of complete (§3.2): a list of indexes, or of {index,
 * reason}. NULL when not given; else an array of *n held by a userdata
 * left on the stack, which also anchors the reasons (its user value): a
 * Lua clock running inside the core call may change opts.cancel and
 * collect garbage before the core reads them. Errors name argument opts. */
static es_cancel *check_cancels(lua_State *L, int opts, size_t *n) {
  *n = 0;
  if (lua_getfield(L, opts, "cancel") == LUA_TNIL) {
    lua_pop(L, 1);
    return NULL;
  }
  if (!lua_istable(L, -1)) luaL_argerror(L, opts, "'cancel' must be a list of indexes");
  int list = lua_gettop(L);
  size_t k = es_lua_check_seq(L, list, opts, "cancel");
  es_cancel *v = lua_newuserdatauv(L, (k ? k : 1) * sizeof *v, 1);
  lua_createtable(L, 0, 0); /* the reasons */
  int reasons = lua_gettop(L);
  lua_Integer n_reasons = 0;
  for (size_t i = 0; i < k; i++) {
    lua_rawgeti(L, list, (lua_Integer)i + 1);
    v[i].reason = NULL;
    v[i].cancelled = 0;
    if (lua_istable(L, -1)) {
      lua_getfield(L, -1, "index");
      lua_getfield(L, -2, "reason");
      if (!lua_isnil(L, -1) && lua_type(L, -1) != LUA_TSTRING)
        luaL_argerror(L, opts, "cancel[i].reason must be a string");
      if (!lua_isnil(L, -1)) {
        v[i].reason = lua_tostring(L, -1);
        lua_rawseti(L, reasons, ++n_reasons);
      } else {
        lua_pop(L, 1);
      }
    } else {
      lua_pushvalue(L, -1);
    }
    if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1)
      luaL_argerror(L, opts, "cancel must list event indexes (integers >= 1) or {index, reason}");
    v[i].index = lua_tointeger(L, -1);
    lua_pop(L, 2);
  }
  lua_setiuservalue(L, reasons - 1, 1);
  lua_remove(L, list); /* the userdata stays on the stack */
  *n = k;
  return v;
}

/* What complete and complete_many read alike: the events at stack index ev
 * (nil or none: none; a misuse names argument arg), and `fence` and
 * `cancel` of the table at opts (nil or none: neither) into c. Leaves what
 * anchors them on the stack (3 slots at most). A fence below 1 is refused
 * here, with the store's own message, so that complete_many refuses it for
 * the whole call, before anything is written. */
static void check_completion(lua_State *L, size_t max_payload, int ev, int arg, int opts,
                             es_completion *c) {
  luaL_checkstack(L, 12, "complete");
  if (lua_isnoneornil(L, ev)) {
    lua_newtable(L);
    lua_replace(L, ev);
  }
  c->evs = es_lua_check_events(L, ev, arg, ES_NONE, max_payload, &c->n);
  check_opt_table(L, opts);
  c->fence = es_lua_opt_int_field(L, opts, "fence", ES_NONE);
  if (c->fence != ES_NONE && c->fence < 1) es_lua_raisef(L, ES_INVALID_ARGUMENT, "fence must be >= 1");
  c->cancel = lua_istable(L, opts) ? check_cancels(L, opts, &c->n_cancel) : NULL;
}

/* §3.2 the indexes of c's cancels that were no longer cancellable, as a
 * list set as field not_cancelled of the table at the top. */
static void set_not_cancelled(lua_State *L, const es_completion *c) {
  lua_newtable(L);
  lua_Integer k = 0;
  for (size_t i = 0; i < c->n_cancel; i++)
    if (!c->cancel[i].cancelled) {
      lua_pushinteger(L, c->cancel[i].index);
      lua_rawseti(L, -2, ++k);
    }
  lua_setfield(L, -2, "not_cancelled");
}

static int m_complete(lua_State *L) {
  lstore *h = check_store(L);
  es_completion c = {0};
  c.session = es_lua_check_name(L, 2, "session");
  c.index = es_lua_check_int(L, 3, "index");
  c.attempt = es_lua_check_int(L, 4, "attempt");
  lua_settop(L, 6); /* events and options at fixed slots, whatever was given */
  check_completion(L, es_store_max_payload(h->held), 5, 5, 6, &c);
  int outcome = 0;
  es_events *out = owned_push(L, sizeof *out, destroy_events);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc;
  if (c.cancel) {
    rc = es_store_complete_cancel(s, &c, out, &err);
    outcome = c.outcome;
  } else {
    rc = es_store_complete(s, c.session, c.index, c.attempt, c.evs, c.n, c.fence, &outcome, out,
                           &err);
  }
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, 3);
  if (outcome == ES_COMPLETED) {
    es_lua_set_str(L, "outcome", "completed");
    es_lua_push_events(L, out, 0);
    lua_setfield(L, -2, "events");
    if (c.cancel) set_not_cancelled(L, &c);
  } else {
    es_lua_set_str(L, "outcome", "superseded");
  }
  return es_lstore_done(L, h, 1);
}

/* The most completions one complete_many takes, and the most events they
 * append in all (as append_many's batches: one transaction). */
#define COMPLETE_MANY_MAX 1000
#define COMPLETE_MANY_MAX_EVENTS ES_DEFAULT_MAX_BATCH

/* complete_many's reading of one item, run protected (read_item) so that
 * its errors can be made to name the item: (item, anchors, completion,
 * max_payload). Every value the completion borrows is put into the
 * anchors table, which the caller keeps on its stack until the call is
 * answered. */
static int read_item_unprotected(lua_State *L) {
  es_completion *c = lua_touserdata(L, 3);
  size_t max_payload = (size_t)lua_tointeger(L, 4);
  lua_settop(L, 4);
  if (!lua_istable(L, 1))
    luaL_argerror(L, 1, "must be a table {session = s, index = i, attempt = a, events?, fence?, cancel?}");
  if (lua_getfield(L, 1, "session") != LUA_TSTRING) /* slot 5 */
    luaL_argerror(L, 1, lua_pushfstring(L, "field 'session' must be a string, got %s",
                                        luaL_typename(L, 5)));
  c->session = es_lua_name(L, 5, "session");
  es_err err = {0};
  if (es_check_name("session", c->session, &err)) es_lua_raise(L, &err);
  static const char *const ints[] = {"index", "attempt"};
  for (int k = 0; k < 2; k++) {
    int ok = 0;
    lua_Integer v = 0;
    int type = lua_getfield(L, 1, ints[k]);
    if (type == LUA_TNUMBER) v = lua_tointegerx(L, -1, &ok);
    if (!ok)
      luaL_argerror(L, 1, lua_pushfstring(L, "field '%s' must be an integer, got %s", ints[k],
                                          type == LUA_TNUMBER ? "a number without an integer value"
                                                              : luaL_typename(L, -1)));
    if (k == 0) c->index = v;
    else c->attempt = v;
    lua_pop(L, 1);
  }
  int et = lua_getfield(L, 1, "events"); /* slot 6 */
  if (et != LUA_TNIL && et != LUA_TTABLE)
    luaL_argerror(L, 1, lua_pushfstring(L, "field 'events' must be a list of events, got %s",
                                        luaL_typename(L, 6)));
  check_completion(L, max_payload, 6, 1, 1, c);
  for (int i = 5, top = lua_gettop(L); i <= top; i++) {
    lua_pushvalue(L, i);
    lua_rawseti(L, 2, (lua_Integer)lua_rawlen(L, 2) + 1);
  }
  return 0;
}

/* Reads list[i] (the value at the top, popped) into c, its anchors into
 * the table at anchors. An error names the item: "list[i]: " before a
 * misuse's text (then an argument error of argument 2) or an error
 * object's message; any other error (out of memory) goes on unchanged. */
static void read_item(lua_State *L, int anchors, size_t i, es_completion *c, size_t max_payload) {
  int item = lua_gettop(L);
  lua_pushcfunction(L, read_item_unprotected);
  lua_insert(L, item);
  lua_pushvalue(L, anchors);
  lua_pushlightuserdata(L, c);
  lua_pushinteger(L, (lua_Integer)max_payload);
  int rc = lua_pcall(L, 4, 0, 0);
  if (rc == LUA_OK) return;
  if (rc != LUA_ERRRUN) lua_error(L);
  static const char bad[] = "bad argument #1 to '?' (";
  size_t len;
  const char *msg = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
  if (msg && len > sizeof bad && memcmp(msg, bad, sizeof bad - 1) == 0 && msg[len - 1] == ')') {
    lua_pushfstring(L, "list[%d]: ", (int)i + 1);
    lua_pushlstring(L, msg + sizeof bad - 1, len - sizeof bad);
    lua_concat(L, 2);
    luaL_argerror(L, 2, lua_tostring(L, -1));
  }
  int err = lua_gettop(L);
  if (lua_istable(L, err) && lua_getmetatable(L, err)) {
    luaL_getmetatable(L, ES_LUA_ERROR_MT);
    int ours = lua_rawequal(L, -1, -2);
    lua_pop(L, 1); /* the error's metatable stays */
    if (ours) { /* a copy, its message naming the item */
      lua_createtable(L, 0, 2);
      lua_pushliteral(L, "code");
      lua_rawget(L, err);
      lua_setfield(L, -2, "code");
      lua_pushfstring(L, "list[%d]: ", (int)i + 1);
      lua_pushliteral(L, "message");
      lua_rawget(L, err);
      if (lua_type(L, -1) != LUA_TSTRING) {
        lua_pop(L, 1);
        lua_pushliteral(L, "");
      }
      lua_concat(L, 2);
      lua_setfield(L, -2, "message");
      lua_insert(L, -2);
      lua_setmetatable(L, -2);
      lua_error(L);
    }
    lua_pop(L, 1);
  }
  lua_error(L);
}

/* store:complete_many{{session, index, attempt, events?, fence?, cancel?},
 * ...} -> {{outcome = "completed", not_cancelled?} | {outcome =
 * "superseded"} | {error = e}, ...} (§3.2): the completions in one
 * transaction (es_store_complete_many), each answered as complete would
 * have; the appended events are not returned. The whole list is read
 * before the store is called: what reading refuses raises, naming the
 * item, and nothing is written. */
static int m_complete_many(lua_State *L) {
  lstore *h = check_store(L);
  luaL_checktype(L, 2, LUA_TTABLE);
  if (lua_gettop(L) > 2) return luaL_argerror(L, 3, "complete_many takes one list of completions");
  size_t n = es_lua_check_list(L, 2, "list",
                               "must be a list of {session, index, attempt, ...} (keys 1..n only)");
  if (n > COMPLETE_MANY_MAX)
    es_lua_raisef(L, ES_TOO_LARGE, "%zu completions, over the limit of %d", n, COMPLETE_MANY_MAX);
  size_t max_payload = es_store_max_payload(h->held);
  es_completion *v = lua_newuserdatauv(L, (n ? n : 1) * sizeof *v, 0);
  memset(v, 0, (n ? n : 1) * sizeof *v);
  lua_createtable(L, (int)(5 * n), 0);
  int anchors = lua_gettop(L);
  size_t n_events = 0;
  for (size_t i = 0; i < n; i++) {
    lua_rawgeti(L, 2, (lua_Integer)i + 1);
    read_item(L, anchors, i, &v[i], max_payload);
    n_events += v[i].n;
    if (n_events > COMPLETE_MANY_MAX_EVENTS)
      es_lua_raisef(L, ES_TOO_LARGE,
                    "list[%d]: the completions append %zu events so far, over the limit of %d in "
                    "one call",
                    (int)i + 1, n_events, COMPLETE_MANY_MAX_EVENTS);
  }
  es_err err = {0};
  int rc = ES_OK;
  if (n) {
    es_store *s = core_enter(L, h);
    rc = es_store_complete_many(s, v, n, &err);
    core_leave(L, h);
  }
  if (rc) return raise(L, &err);
  luaL_checkstack(L, 6, "complete_many");
  lua_createtable(L, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    es_completion *c = &v[i];
    lua_createtable(L, 0, 2);
    if (c->rc != ES_OK) {
      es_lua_push_error(L, c->rc, c->err.msg);
      lua_setfield(L, -2, "error");
    } else if (c->outcome == ES_COMPLETED) {
      es_lua_set_str(L, "outcome", "completed");
      if (c->cancel) set_not_cancelled(L, c);
    } else {
      es_lua_set_str(L, "outcome", "superseded");
    }
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  return es_lstore_done(L, h, 1);
}

static int m_fail(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  int64_t index = es_lua_check_int(L, 3, "index");
  int64_t attempt = es_lua_check_int(L, 4, "attempt");
  luaL_checktype(L, 5, LUA_TTABLE);
  size_t elen;
  const char *error = es_lua_opt_text_field(L, 5, "error", &elen);
  if (!error) luaL_argerror(L, 5, "field 'error' is required");
  int64_t max_failures = es_lua_opt_int_field(L, 5, "max_failures", 5);
  int64_t retry_after = es_lua_opt_int_field(L, 5, "retry_after_ms", 0);
  int outcome = 0;
  int64_t failures = 0;
  es_err err = {0};
  /* Free text keeps every byte it can: a NUL (which the C API cannot carry)
   * becomes U+FFFD here rather than cutting the message (es_text_clean).
   * Owned by a box, so nothing leaks if the store turns out closed. */
  char **text = owned_push(L, sizeof *text, destroy_cstr);
  if (es_text_clean(error, elen, ES_MAX_TEXT_BYTES, text, NULL))
    return luaL_error(L, "out of memory");
  es_store *s = core_enter(L, h);
  int rc = es_store_fail(s, session, index, attempt, *text, max_failures, retry_after,
                         &outcome, &failures, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, 2);
  es_lua_set_str(L, "outcome", outcome == ES_FAILED            ? "failed"
                        : outcome == ES_DEAD_LETTERED ? "dead_lettered"
                                                      : "superseded");
  es_lua_set_int(L, "failures", failures);
  return es_lstore_done(L, h, 1);
}

static int push_one(lua_State *L, lstore *h, const char *session, int64_t index) {
  es_event *e = owned_push(L, sizeof *e, destroy_event);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_get(s, session, index, e, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  es_lua_push_event(L, e, 0);
  es_event_destroy(e);
  return es_lstore_done(L, h, 1);
}

static int m_revive(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  int64_t index = es_lua_check_int(L, 3, "index");
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_revive(s, session, index, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  return push_one(L, h, session, index);
}

static int m_settle(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  int64_t index = es_lua_check_int(L, 3, "index");
  size_t rlen = 0;
  const char *reason = luaL_optlstring(L, 4, NULL, &rlen);
  es_err err = {0};
  char **text = owned_push(L, sizeof *text, destroy_cstr); /* free text, as fail's error */
  if (reason && es_text_clean(reason, rlen, ES_MAX_TEXT_BYTES, text, NULL))
    return luaL_error(L, "out of memory");
  es_store *s = core_enter(L, h);
  int rc = es_store_settle(s, session, index, *text, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  return push_one(L, h, session, index);
}

/* store:cancel(session, index, {reason}) -> the event (§3.2). */
static int m_cancel(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  int64_t index = es_lua_check_int(L, 3, "index");
  check_opt_table(L, 4);
  size_t rlen = 0;
  const char *reason = es_lua_opt_text_field(L, 4, "reason", &rlen);
  char **text = owned_push(L, sizeof *text, destroy_cstr); /* free text, as settle's reason */
  if (reason && es_text_clean(reason, rlen, ES_MAX_TEXT_BYTES, text, NULL))
    return luaL_error(L, "out of memory");
  es_event *out = owned_push(L, sizeof *out, destroy_event);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_cancel(s, session, index, *text, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  es_lua_push_event(L, out, 0);
  es_event_destroy(out);
  return es_lstore_done(L, h, 1);
}

static int m_dead_letters(lua_State *L) {
  lstore *h = check_store(L);
  check_opt_table(L, 2);
  const char *session = es_lua_opt_str_field(L, 2, "session");
  int64_t after = es_lua_opt_int_field(L, 2, "after", 0);
  int64_t limit = es_lua_opt_int_field(L, 2, "limit", 100);
  es_events *out = owned_push(L, sizeof *out, destroy_events);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_dead_letters(s, session, after, limit, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  es_lua_push_events(L, out, 0);
  return es_lstore_done(L, h, 1);
}

/* ---------------------------------------------------------------------- */
/* 3.8 fences, leases, seals */

static int m_fence(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  check_opt_table(L, 3);
  int64_t if_token = es_lua_opt_int_field(L, 3, "if_token", ES_NONE);
  int64_t token = 0;
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_fence(st, session, if_token, &token, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_pushinteger(L, token);
  return es_lstore_done(L, h, 1);
}

static int m_lease(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  luaL_checktype(L, 3, LUA_TTABLE);
  const char *holder = es_lua_req_str_field(L, 3, "holder");
  int64_t ttl = es_lua_opt_int_field(L, 3, "ttl_ms", ES_NONE);
  if (ttl == ES_NONE) luaL_argerror(L, 3, "field 'ttl_ms' is required");
  es_lease *out = owned_push(L, sizeof *out, destroy_lease);
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_lease(st, session, holder, ttl, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  es_lua_push_lease(L, out);
  return es_lstore_done(L, h, 1);
}

static int m_release(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  luaL_checktype(L, 3, LUA_TTABLE);
  const char *holder = es_lua_req_str_field(L, 3, "holder");
  int64_t token = es_lua_opt_int_field(L, 3, "token", ES_NONE);
  if (token == ES_NONE) luaL_argerror(L, 3, "field 'token' is required");
  int released = 0;
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_lease_release(st, session, holder, token, &released, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_pushboolean(L, released);
  return es_lstore_done(L, h, 1);
}

static int m_seal(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  check_opt_table(L, 3);
  size_t len = 0;
  const char *reason = lua_isnoneornil(L, 3) ? NULL : es_lua_opt_text_field(L, 3, "reason", &len);
  char **text = owned_push(L, sizeof *text, destroy_cstr);
  if (reason && es_text_clean(reason, len, ES_MAX_TEXT_BYTES, text, NULL))
    return luaL_error(L, "out of memory");
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_seal(st, session, *text, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  return es_lstore_done(L, h, 0);
}

const luaL_Reg es_lstore_dispatch_methods[] = {
    {"claim", m_claim},
    {"claim_next", m_claim_next},
    {"renew", m_renew},
    {"complete", m_complete},
    {"complete_many", m_complete_many},
    {"fail", m_fail},
    {"revive", m_revive},
    {"settle", m_settle},
    {"cancel", m_cancel},
    {"dead_letters", m_dead_letters},
    {"fence", m_fence},
    {"lease", m_lease},
    {"release", m_release},
    {"seal", m_seal},
    {NULL, NULL},
};
