/*
 * module/store_events.c: the store handle's methods over a session's
 * events and states: append and read (§3.1), stats (§3.12), snapshots
 * and inspection (§3.3, §3.4), many states at once, and the sealed
 * reads and shredding of §3.10.
 */
#include <lauxlib.h>
#include <limits.h>
#include <lua.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bridge/common.h"
#include "bridge/events.h"
#include "bridge/state.h"
#include "module/store_handle.h"
#include "module/store_internal.h"
#include "store/store.h"


/* ---------------------------------------------------------------------- */
/* 3.1 append and read */

static int m_append(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  check_opt_table(L, 4);
  int64_t expected = es_lua_opt_int_field(L, 4, "expected", ES_NONE);
  int64_t fence = es_lua_opt_int_field(L, 4, "fence", ES_NONE);
  int ids = es_lua_opt_answer_ids(L, 4);
  size_t n;
  es_new_event *evs = es_lua_check_events(L, 3, 3, ES_NONE, es_store_max_payload(h->held), &n);
  es_events *out = owned_push(L, sizeof *out, destroy_events);
  int pending = 0;
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_append(s, session, evs, n, expected, fence, out, &pending, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  if (ids) es_lua_push_event_ids(L, out); /* no event table, no payload decoded */
  else es_lua_push_events(L, out, 0);
  lua_pushboolean(L, pending);
  return es_lstore_done(L, h, 2);
}

/* append_many's batches, with their results (owned: a Lua error frees
 * them). */
typedef struct {
  size_t n;
  es_append_batch v[];
} batch_list;

static void destroy_batches(void *p) {
  batch_list *b = p;
  for (size_t i = 0; i < b->n; i++) es_events_destroy(&b->v[i].out);
}

/* batches[i].opts[field]: an optional integer, ES_NONE when absent. */
static int64_t batch_opt_int(lua_State *L, int opts, size_t i, const char *field) {
  if (opts == 0) return ES_NONE;
  lua_getfield(L, opts, field);
  int64_t v = ES_NONE;
  if (!lua_isnil(L, -1)) {
    if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) == ES_NONE) {
      lua_pushfstring(L, "batches[%d].opts.%s must be an integer", (int)i + 1, field);
      luaL_argerror(L, 2, lua_tostring(L, -1));
    }
    v = lua_tointeger(L, -1);
  }
  lua_pop(L, 1);
  return v;
}

/* append_many's options (argument 3): nil, or a table whose only key is
 * `answer`. Anything else is refused, so that a second list of batches
 * passed by mistake (append_many(b1, b2)) is not taken for options and
 * silently dropped. Returns whether the answer is ids. */
static int append_many_opts(lua_State *L) {
  if (lua_isnoneornil(L, 3)) return 0;
  luaL_checktype(L, 3, LUA_TTABLE);
  lua_pushnil(L);
  while (lua_next(L, 3)) {
    lua_pop(L, 1);
    size_t len = 0; /* with its length: "answer\0x" is another key */
    const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
    if (!k || len != 6 || memcmp(k, "answer", 6) != 0)
      return luaL_argerror(L, 3, "append_many's options take only `answer`");
  }
  return es_lua_opt_answer_ids(L, 3);
}

/* store:append_many({{session, events, opts = {expected, fence}}, ...},
 * {answer}) -> {{events, pending}, ...} (§3.1): one transaction for all
 * batches; with answer = "ids", {{ids, pending}, ...}. */
static int m_append_many(lua_State *L) {
  lstore *h = check_store(L);
  luaL_checktype(L, 2, LUA_TTABLE);
  if (lua_gettop(L) > 3)
    return luaL_argerror(L, 4, "append_many takes one list of batches and its options");
  int ids = append_many_opts(L);
  lua_settop(L, 2);
  size_t n =
      es_lua_check_list(L, 2, "batches", "batches must be a list of {session, events, opts}");
  if (n > (size_t)INT_MAX / 4) return luaL_argerror(L, 2, "too many batches");
  luaL_checkstack(L, (int)(4 * n + 8), "too many batches");
  size_t maxp = es_store_max_payload(h->held);
  batch_list *b = owned_push(L, sizeof *b + n * sizeof *b->v, destroy_batches);
  for (size_t i = 0; i < n; i++) {
    lua_rawgeti(L, 2, (lua_Integer)i + 1); /* stays: anchors the batch's strings */
    int t = lua_gettop(L);
    if (!lua_istable(L, t)) {
      lua_pushfstring(L, "batches[%d] must be a table {session, events, opts}", (int)i + 1);
      return luaL_argerror(L, 2, lua_tostring(L, -1));
    }
    lua_getfield(L, t, "session");
    if (lua_type(L, -1) != LUA_TSTRING) {
      lua_pushfstring(L, "batches[%d].session must be a string", (int)i + 1);
      return luaL_argerror(L, 2, lua_tostring(L, -1));
    }
    b->v[i].session = es_lua_name(L, -1, "session");
    lua_pop(L, 1); /* the batch table anchors it */
    lua_getfield(L, t, "opts");
    int opts = 0;
    if (!lua_isnil(L, -1)) {
      if (!lua_istable(L, -1)) {
        lua_pushfstring(L, "batches[%d].opts must be a table", (int)i + 1);
        return luaL_argerror(L, 2, lua_tostring(L, -1));
      }
      opts = lua_gettop(L);
    }
    b->v[i].expected = batch_opt_int(L, opts, i, "expected");
    b->v[i].fence = batch_opt_int(L, opts, i, "fence");
    lua_pop(L, 1);
    lua_getfield(L, t, "events"); /* stays under the two slots check_events pushes */
    if (!lua_istable(L, -1)) {
      lua_pushfstring(L, "batches[%d].events must be a list of events", (int)i + 1);
      return luaL_argerror(L, 2, lua_tostring(L, -1));
    }
    b->v[i].evs = es_lua_check_batch_events(L, -1, 2, maxp, i, &b->v[i].n);
    b->n = i + 1;
  }
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_append_many(s, b->v, n, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    lua_createtable(L, 0, 2);
    if (ids) es_lua_push_event_ids(L, &b->v[i].out);
    else es_lua_push_events(L, &b->v[i].out, 0);
    lua_setfield(L, -2, ids ? "ids" : "events");
    lua_pushboolean(L, b->v[i].pending);
    lua_setfield(L, -2, "pending");
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  return es_lstore_done(L, h, 1);
}

typedef int (*range_reader)(es_store *s, const char *session, int64_t after, int64_t through,
                            int64_t limit, es_events *out, es_err *err);

/* store:read and store:read_at_rest: (session, {after, through, limit}). */
static int read_with(lua_State *L, range_reader fn, int at_rest) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  check_opt_table(L, 3);
  int64_t after = es_lua_opt_int_field(L, 3, "after", 0);
  int64_t through = es_lua_opt_int_field(L, 3, "through", ES_NONE);
  int64_t limit = es_lua_opt_int_field(L, 3, "limit", ES_NONE);
  es_events *out = owned_push(L, sizeof *out, destroy_events);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = fn(s, session, after, through, limit, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  if (!at_rest) {
    es_lua_push_events(L, out, 0);
    return es_lstore_done(L, h, 1);
  }
  lua_createtable(L, (int)(out->n > 1000000 ? 0 : out->n), 0);
  for (size_t i = 0; i < out->n; i++) {
    es_lua_push_event_at_rest(L, &out->v[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  es_events_destroy(out); /* now rather than at collection */
  return es_lstore_done(L, h, 1);
}

static int m_read(lua_State *L) { return read_with(L, es_store_read, 0); }

static int m_head(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  int64_t head;
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_head(s, session, &head, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_pushinteger(L, head);
  return es_lstore_done(L, h, 1);
}

/* ---------------------------------------------------------------------- */
/* §3.12 stats (docs/stats.md) */

/* What stats() reports, read from the core (no Lua call in between). */
typedef struct {
  es_call_stats calls[ES_STATS_MAX_OPS];
  size_t n;
  es_counts c;
} stats_snap;

static int stats_read(es_store *s, stats_snap *o, es_err *err) {
  /* the calls before the counts: this stats call is in neither */
  es_store_call_stats(s, o->calls, ES_STATS_MAX_OPS, &o->n);
  return es_store_counts(s, &o->c, err);
}

static void stats_push(lua_State *L, const stats_snap *o) {
  lua_createtable(L, 0, 5);
  lua_createtable(L, 0, (int)o->n);
  for (size_t i = 0; i < o->n; i++) {
    const es_call_stats *c = &o->calls[i];
    lua_createtable(L, 0, 5);
    es_lua_set_int(L, "count", (int64_t)c->count);
    es_lua_set_int(L, "errors", (int64_t)c->errors);
    /* microseconds, the nanoseconds as a fraction: calls on memory: take
     * well under one */
    lua_pushnumber(L, (lua_Number)c->p50_ns / 1000.0);
    lua_setfield(L, -2, "p50_us");
    lua_pushnumber(L, (lua_Number)c->p99_ns / 1000.0);
    lua_setfield(L, -2, "p99_us");
    lua_pushnumber(L, (lua_Number)c->max_ns / 1000.0);
    lua_setfield(L, -2, "max_us");
    lua_setfield(L, -2, c->op);
  }
  lua_setfield(L, -2, "calls");
  es_lua_set_int(L, "sessions", o->c.sessions);
  es_lua_set_int(L, "events", o->c.events);
  es_lua_set_int(L, "pending", o->c.pending);
  es_lua_set_int(L, "dead", o->c.dead);
}

int es_lua_push_stats(lua_State *L, es_store *s, es_err *err) {
  stats_snap o;
  int rc = stats_read(s, &o, err);
  if (rc == ES_OK) stats_push(L, &o);
  return rc;
}

/* stats() -> {calls, sessions, events, pending, dead}; takes no argument. */
static int m_stats(lua_State *L) {
  lstore *h = check_store(L);
  if (lua_gettop(L) > 1) return luaL_argerror(L, 2, "stats takes no arguments");
  es_err err = {0};
  stats_snap o;
  es_store *s = core_enter(L, h);
  int rc = stats_read(s, &o, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  stats_push(L, &o);
  return es_lstore_done(L, h, 1);
}

/* _stats_enabled(on): bench only (bench/README.md "Stats cost"): stops or
 * restarts counting this handle's calls. */
static int m_stats_enabled(lua_State *L) {
  lstore *h = check_store(L);
  luaL_checktype(L, 2, LUA_TBOOLEAN);
  es_store_stats_enable(h->s, lua_toboolean(L, 2));
  return 0;
}

/* ---------------------------------------------------------------------- */
/* 3.3 snapshots, 3.4 inspection */

static int m_read_state(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  const char *reducer = es_lua_check_name(L, 3, "reducer");
  int found;
  es_snapshot *snap = owned_push(L, sizeof *snap, destroy_snapshot);
  es_events *events = owned_push(L, sizeof *events, destroy_events);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_read_state(s, session, reducer, &found, snap, events, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, 2);
  if (found) {
    lua_createtable(L, 0, 3);
    es_lua_set_int(L, "index", snap->index);
    lua_pushlstring(L, snap->state ? snap->state : "", snap->state_len);
    lua_setfield(L, -2, "state");
    es_lua_set_str(L, "version", snap->version);
    lua_setfield(L, -2, "snapshot");
  }
  es_snapshot_destroy(snap);
  es_lua_push_events(L, events, 0);
  lua_setfield(L, -2, "events");
  return es_lstore_done(L, h, 1);
}

static int m_put_snapshot(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  const char *reducer = es_lua_check_name(L, 3, "reducer");
  int64_t index = es_lua_check_int(L, 4, "index");
  size_t len;
  const char *state = luaL_checklstring(L, 5, &len); /* bytes: every one is kept */
  const char *version = lua_isnoneornil(L, 6) ? "" : es_lua_check_name(L, 6, "version");
  int stored = 0;
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_put_snapshot(s, session, reducer, index, state, len, version, &stored, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_pushboolean(L, stored);
  return es_lstore_done(L, h, 1);
}

static int m_snapshots(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  es_snapshots *list = owned_push(L, sizeof *list, destroy_snapshots);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_snapshots(s, session, list, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, (int)list->n, 0);
  for (size_t i = 0; i < list->n; i++) {
    lua_createtable(L, 0, 4);
    es_lua_set_str(L, "reducer", list->v[i].reducer);
    es_lua_set_int(L, "index", list->v[i].index);
    es_lua_set_str(L, "version", list->v[i].version);
    es_lua_set_int(L, "updated_at", list->v[i].updated_at);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  es_snapshots_destroy(list);
  return es_lstore_done(L, h, 1);
}

static void destroy_type_counts(void *p) { es_type_counts_destroy(p); }

static int m_pending_types(lua_State *L) {
  lstore *h = check_store(L);
  es_type_counts *list = owned_push(L, sizeof *list, destroy_type_counts);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_pending_types(s, list, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, list->n > INT_MAX ? INT_MAX : (int)list->n);
  for (size_t i = 0; i < list->n; i++) {
    lua_pushinteger(L, list->v[i].pending);
    lua_setfield(L, -2, list->v[i].type);
  }
  es_type_counts_destroy(list);
  return es_lstore_done(L, h, 1);
}

/* A session row's §3.7/§3.8 fields: `sealed` always, the rest when set. */
static void push_session_controls(lua_State *L, const es_session_info *si) {
  lua_pushboolean(L, si->sealed_at != ES_NONE);
  lua_setfield(L, -2, "sealed");
  es_lua_set_int(L, "sealed_at", si->sealed_at);
  es_lua_set_str(L, "seal_reason", si->seal_reason);
  if (si->fence > 0) es_lua_set_int(L, "fence", si->fence);
  if (si->lease_holder) {
    lua_createtable(L, 0, 3);
    es_lua_set_str(L, "holder", si->lease_holder);
    es_lua_set_int(L, "token", si->lease_token);
    es_lua_set_int(L, "expires_at", si->lease_expires_at);
    lua_setfield(L, -2, "lease");
  }
  es_lua_set_str(L, "parent", si->parent);
  es_lua_set_int(L, "first_index", si->first_index > 1 ? si->first_index : 1);
}

static int m_sessions(lua_State *L) {
  lstore *h = check_store(L);
  check_opt_table(L, 2);
  const char *prefix = es_lua_opt_str_field(L, 2, "prefix");
  const char *after = es_lua_opt_str_field(L, 2, "after");
  int64_t limit = es_lua_opt_int_field(L, 2, "limit", 100);
  es_sessions *list = owned_push(L, sizeof *list, destroy_sessions);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_sessions(s, prefix, after, limit, list, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, 2);
  lua_createtable(L, (int)list->n, 0);
  for (size_t i = 0; i < list->n; i++) {
    const es_session_info *si = &list->v[i];
    lua_createtable(L, 0, 14);
    es_lua_set_str(L, "session", si->session);
    es_lua_set_int(L, "events", si->events);
    es_lua_set_int(L, "pending", si->pending);
    es_lua_set_int(L, "dead", si->dead);
    es_lua_set_int(L, "attempts", si->attempts);
    es_lua_set_int(L, "failures", si->failures);
    es_lua_set_int(L, "first_at", si->first_at);
    es_lua_set_int(L, "updated_at", si->updated_at);
    push_session_controls(L, si);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  lua_setfield(L, -2, "sessions");
  es_lua_set_str(L, "cursor", list->cursor);
  es_sessions_destroy(list);
  return es_lstore_done(L, h, 1);
}

static int m_events_page(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  check_opt_table(L, 3);
  int64_t after = es_lua_opt_int_field(L, 3, "after", 0);
  int64_t through = es_lua_opt_int_field(L, 3, "through", ES_NONE);
  int64_t limit = es_lua_opt_int_field(L, 3, "limit", 100);
  int64_t through_out = 0;
  es_events *out = owned_push(L, sizeof *out, destroy_events);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_events_page(s, session, after, through, limit, out, &through_out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, 2);
  es_lua_push_events(L, out, 0);
  lua_setfield(L, -2, "events");
  es_lua_set_int(L, "through", through_out);
  return es_lstore_done(L, h, 1);
}

/* ---------------------------------------------------------------------- */
/* 3.3 many states at once */

typedef struct state_reads {
  es_state_read *v;  /* owned array of n */
  size_t n;
} state_reads;

static void destroy_state_reads(void *p) {
  state_reads *r = p;
  es_state_reads_destroy(r->v, r->n);
  free(r->v);
}

static int m_read_states(lua_State *L) {
  lstore *h = check_store(L);
  luaL_checktype(L, 2, LUA_TTABLE);
  const char *reducer = es_lua_check_name(L, 3, "reducer");
  size_t n = es_lua_check_seq(L, 2, 2, "sessions");
  if (n > ES_DEFAULT_MAX_BATCH) /* before copying or allocating anything for them */
    es_lua_raisef(L, ES_TOO_LARGE, "%zu sessions, over the limit of %d", n, ES_DEFAULT_MAX_BATCH);
  /* The names, copied into one userdata (like claim_next's types) so that
   * nothing Lua does during the call (a clock function) can free one. */
  size_t bytes = 0;
  for (size_t i = 0; i < n; i++) {
    char what[40];
    snprintf(what, sizeof what, "sessions[%zu]", i + 1);
    if (lua_rawgeti(L, 2, (lua_Integer)i + 1) != LUA_TSTRING)
      luaL_argerror(L, 2, "must be a list of session names");
    es_lua_name(L, -1, what);
    bytes += lua_rawlen(L, -1) + 1;
    lua_pop(L, 1);
  }
  size_t head = (n ? n : 1) * sizeof(char *);
  char **names = lua_newuserdatauv(L, head + bytes, 0);
  char *p = (char *)names + head;
  for (size_t i = 0; i < n; i++) {
    size_t len;
    lua_rawgeti(L, 2, (lua_Integer)i + 1);
    const char *name = lua_tolstring(L, -1, &len);
    memcpy(p, name, len + 1);
    names[i] = p;
    p += len + 1;
    lua_pop(L, 1);
  }
  state_reads *box = owned_push(L, sizeof *box, destroy_state_reads);
  es_state_read *out = n ? calloc(n, sizeof *out) : NULL;
  if (n && !out) return luaL_error(L, "out of memory");
  box->v = out;
  box->n = n;
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_read_states(st, (const char *const *)names, n, reducer, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, (int)(n > 100000 ? 0 : n));
  for (size_t i = 0; i < n; i++) {
    lua_createtable(L, 0, 2);
    if (out[i].found) {
      lua_createtable(L, 0, 3);
      es_lua_set_int(L, "index", out[i].snap.index);
      lua_pushlstring(L, out[i].snap.state ? out[i].snap.state : "", out[i].snap.state_len);
      lua_setfield(L, -2, "state");
      es_lua_set_str(L, "version", out[i].snap.version);
      lua_setfield(L, -2, "snapshot");
    }
    es_lua_push_events(L, &out[i].events, 0);
    lua_setfield(L, -2, "events");
    lua_setfield(L, -2, names[i]);
  }
  return es_lstore_done(L, h, 1);
}

/* ---------------------------------------------------------------------- */
/* 3.10 crypto-shredding */

/* store:shred(name) -> true when a live key was destroyed now. */
static int m_shred(lua_State *L) {
  lstore *h = check_store(L);
  const char *name = es_lua_check_name(L, 2, "name");
  int was_live = 0;
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_shred(st, name, &was_live, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_pushboolean(L, was_live);
  return es_lstore_done(L, h, 1);
}

/* store:read_at_rest(session, {after, through, limit}) -> events as
 * stored: keyed ones with `ciphertext` instead of `payload`. */
static int m_read_at_rest(lua_State *L) { return read_with(L, es_store_read_at_rest, 1); }

const luaL_Reg es_lstore_events_methods[] = {
    {"append", m_append},
    {"append_many", m_append_many},
    {"read", m_read},
    {"head", m_head},
    {"read_state", m_read_state},
    {"put_snapshot", m_put_snapshot},
    {"snapshots", m_snapshots},
    {"sessions", m_sessions},
    {"pending_types", m_pending_types},
    {"events_page", m_events_page},
    {"read_states", m_read_states},
    {"shred", m_shred},
    {"read_at_rest", m_read_at_rest},
    {"stats", m_stats},
    {"_stats_enabled", m_stats_enabled},
    {NULL, NULL},
};
