/*
 * module/store_subs.c: the store handle's in-process subscriptions
 * (store:subscribe, store:presence_subscribe) and their delivery at the
 * end of every call (es_lstore_done), store:wait, and presence (§3.5,
 * §3.6): presence_set delivers its own patch. The rules that keep C's
 * pointers valid while subscribers run are module/store_handle.c's top
 * comment.
 */
#include <lauxlib.h>
#include <lua.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bridge/json_lua.h"
#include "bridge/common.h"
#include "bridge/events.h"
#include "module/store_handle.h"
#include "module/store_internal.h"
#include "store/store.h"


/* ---------------------------------------------------------------------- */
/* subscriptions */

static void on_presence(void *ctx, const char *ns, const es_presence_rows *applied) {
  psub *p = ctx;
  (void)ns;
  patch *x = calloc(1, sizeof *x);
  if (!x) return;
  x->rows.v = calloc(applied->n ? applied->n : 1, sizeof *x->rows.v);
  if (!x->rows.v) {
    free(x);
    return;
  }
  for (size_t i = 0; i < applied->n; i++) {
    if (es_presence_row_copy(&x->rows.v[i], &applied->v[i]) != ES_OK) break;
    x->rows.n++;
  }
  x->rows.cap = applied->n;
  pthread_mutex_lock(&p->mu);
  if (p->tail) p->tail->next = x;
  else p->head = x;
  p->tail = x;
  pthread_mutex_unlock(&p->mu);
}

static void free_patches(patch *x) {
  while (x) {
    patch *next = x->next;
    es_presence_rows_destroy(&x->rows);
    free(x);
    x = next;
  }
}

/* Ends a subscription: the callback's registry ref goes at once (docs/architecture.md
 * convention 8), the struct stays until es_lstore_reap(). */
void es_lstore_sub_end(lua_State *L, sub *x) {
  if (!x->active) return;
  x->active = 0;
  luaL_unref(L, LUA_REGISTRYINDEX, x->fn_ref);
  x->fn_ref = LUA_NOREF;
}

/* As sub_end; also removes the core's watch, after which no thread calls
 * on_presence with p any more, and drops the patches not yet delivered. */
void es_lstore_psub_end(lua_State *L, lstore *h, psub *p) {
  if (!p->active) return;
  p->active = 0;
  if (h->s) es_store_presence_unwatch(h->s, p->token);
  luaL_unref(L, LUA_REGISTRYINDEX, p->fn_ref);
  p->fn_ref = LUA_NOREF;
  pthread_mutex_lock(&p->mu);
  patch *queued = p->head;
  p->head = p->tail = NULL;
  pthread_mutex_unlock(&p->mu);
  free_patches(queued);
}

/* Frees ended subscriptions, unless drain() is walking the lists (then it
 * calls reap itself when it is done). */
void es_lstore_reap(lstore *h) {
  if (h->draining) return;
  for (sub **p = &h->subs; *p;) {
    sub *x = *p;
    if (x->active) {
      p = &x->next;
      continue;
    }
    *p = x->next;
    free(x->session);
    free(x);
  }
  for (psub **p = &h->psubs; *p;) {
    psub *x = *p;
    if (x->active) {
      p = &x->next;
      continue;
    }
    *p = x->next;
    free_patches(x->head);
    pthread_mutex_destroy(&x->mu);
    free(x);
  }
}

static void push_patch(lua_State *L, const es_presence_rows *rows) {
  lua_createtable(L, 0, 4);
  if (rows->n > 0) {
    es_lua_set_str(L, "participant", rows->v[0].participant);
    es_lua_set_int(L, "seen", rows->v[0].seen);
    es_lua_set_int(L, "at", rows->v[0].at);
  }
  lua_createtable(L, 0, (int)rows->n);
  for (size_t i = 0; i < rows->n; i++) {
    const es_presence_row *r = &rows->v[i];
    if (r->value) {
      es_err err = {0};
      if (es_json_decode_lua(L, r->value, r->value_len, &err) != ES_OK) es_lua_raise(L, &err);
      if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        es_json_push_null(L);
      }
    } else {
      es_json_push_null(L);
    }
    lua_setfield(L, -2, r->field);
  }
  lua_setfield(L, -2, "values");
}

/* Calls fn(value) where value is on top. Runs inside drain's lua_pcall: an
 * error in fn ends the drain and is raised from the call that delivered it
 * (the event still counts as delivered). */
static void deliver(lua_State *L, int fn_ref) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, fn_ref);
  lua_insert(L, -2);
  lua_call(L, 1, 0);
}

static int drain_events(lua_State *L, lstore *h, sub *x) {
  int base = lua_gettop(L);
  es_events *list = owned_push(L, sizeof *list, destroy_events);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = x->session ? es_store_read(s, x->session, x->last, ES_NONE, 1000, list, &err)
                      : es_store_read_all(s, x->last, 1000, list, &err);
  core_leave(L, h);
  if (rc) raise(L, &err);
  size_t n = list->n;
  if (n == 0) {
    lua_settop(L, base); /* the box frees the empty list */
    return 0;
  }
  /* Turn the batch into Lua values first: fn may raise, and nothing C-owned
   * may be held across that. */
  es_lua_push_events(L, list, 0);
  int t = lua_gettop(L);
  /* fn may end x or close the store: both are looked at after each call. */
  for (size_t i = 1; i <= n && x->active && h->s; i++) {
    lua_rawgeti(L, t, (lua_Integer)i);
    lua_getfield(L, -1, x->session ? "index" : "position");
    x->last = lua_tointeger(L, -1);
    lua_pop(L, 1);
    deliver(L, x->fn_ref);
  }
  lua_settop(L, base);
  return 1;
}

/* drain()'s body, under lua_pcall: h (a light userdata) is argument 1. */
static int drain_protected(lua_State *L) {
  lstore *h = lua_touserdata(L, 1);
  for (int more = 1; more && h->s;) {
    more = 0;
    /* Other processes' commits count too (subscribe(nil) on sqlite sees
     * them at this state's next call, e.g. while it waits). */
    uint64_t dv = 0;
    es_err err = {0};
    es_store *s = core_enter(L, h);
    uint64_t v = es_store_version(s);
    int rc = h->subs ? es_store_data_version(s, &dv, &err) : ES_OK;
    core_leave(L, h);
    if (rc != ES_OK) raise(L, &err);
    if (v != h->seen_version || dv != h->seen_data) {
      for (sub *x = h->subs; x && h->s; x = x->next)
        while (x->active && h->s && drain_events(L, h, x)) more = 1;
      h->seen_version = v;
      h->seen_data = dv;
    }
    for (psub *p = h->psubs; p && h->s; p = p->next) {
      while (p->active && h->s) {
        pthread_mutex_lock(&p->mu);
        patch *x = p->head;
        if (x) {
          p->head = x->next;
          if (!p->head) p->tail = NULL;
          x->next = NULL;
        }
        pthread_mutex_unlock(&p->mu);
        if (!x) break;
        more = 1;
        h->delivering = x; /* push_patch may raise: drain() frees it then */
        push_patch(L, &x->rows);
        h->delivering = NULL;
        free_patches(x);
        deliver(L, p->fn_ref);
      }
    }
  }
  return 0;
}

/* Delivers what subscribers have not seen yet. Subscribers may cancel
 * subscriptions, write, or close the store; a subscriber's error is raised
 * from here after the delivery state is reset. */
static void drain(lua_State *L, lstore *h) {
  if (h->draining || !h->s) return;
  h->draining = 1;
  lua_pushcfunction(L, drain_protected);
  lua_pushlightuserdata(L, h);
  int status = lua_pcall(L, 1, 0, 0);
  h->draining = 0;
  free_patches(h->delivering);
  h->delivering = NULL;
  es_lstore_reap(h);
  if (status != LUA_OK) lua_error(L);
}

/* Every method returns through here so subscribers run before it returns. */
int es_lstore_done(lua_State *L, lstore *h, int nret) {
  if (h->s && (h->subs || h->psubs)) {
    int top = lua_gettop(L);
    drain(L, h);
    lua_settop(L, top);
  }
  return nret;
}

/* The unsubscribe functions: upvalue 1 is the store (which keeps the
 * handle's memory alive), upvalue 2 the subscription's id. A subscription
 * that already ended (cancelled, or the store closed) is not in the list
 * any more, or is marked ended: nothing to do. */
static int unsubscribe(lua_State *L) {
  lstore *h = lua_touserdata(L, lua_upvalueindex(1));
  uint64_t id = (uint64_t)lua_tointeger(L, lua_upvalueindex(2));
  for (sub *x = h->subs; x; x = x->next) {
    if (x->id == id) {
      es_lstore_sub_end(L, x);
      break;
    }
  }
  es_lstore_reap(h);
  return 0;
}

static int punsubscribe(lua_State *L) {
  lstore *h = lua_touserdata(L, lua_upvalueindex(1));
  uint64_t id = (uint64_t)lua_tointeger(L, lua_upvalueindex(2));
  for (psub *x = h->psubs; x; x = x->next) {
    if (x->id == id) {
      es_lstore_psub_end(L, h, x);
      break;
    }
  }
  es_lstore_reap(h);
  return 0;
}

static void push_unsubscribe(lua_State *L, lua_CFunction fn, uint64_t id) {
  lua_pushvalue(L, 1);
  lua_pushinteger(L, (lua_Integer)id);
  lua_pushcclosure(L, fn, 2);
}

static int m_subscribe(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_opt_name(L, 2, "session");
  luaL_checktype(L, 3, LUA_TFUNCTION);
  es_err err = {0};
  int64_t last = 0;
  uint64_t data = 0;
  es_store *s = core_enter(L, h);
  int rc = session ? es_store_head(s, session, &last, &err)
                   : es_store_last_position(s, &last, &err);
  uint64_t version = es_store_version(s);
  if (rc == ES_OK && !h->subs) rc = es_store_data_version(s, &data, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_pushvalue(L, 3);
  int fn_ref = luaL_ref(L, LUA_REGISTRYINDEX); /* before the allocations: it may raise */
  sub *x = calloc(1, sizeof *x);
  if (!x || (session && !(x->session = strdup(session)))) {
    free(x);
    luaL_unref(L, LUA_REGISTRYINDEX, fn_ref);
    return luaL_error(L, "out of memory");
  }
  x->id = ++h->next_id;
  x->last = last;
  x->fn_ref = fn_ref;
  x->active = 1;
  x->next = h->subs;
  h->subs = x;
  if (h->seen_version == 0) h->seen_version = version;
  if (!x->next) h->seen_data = data;
  push_unsubscribe(L, unsubscribe, x->id);
  return 1;
}

static int m_presence_subscribe(lua_State *L) {
  lstore *h = check_store(L);
  const char *ns = es_lua_check_name(L, 2, "namespace");
  luaL_checktype(L, 3, LUA_TFUNCTION);
  es_err nerr = {0};
  /* No store call sees this name, so check it here as every call would. */
  if (es_check_name("namespace", ns, &nerr)) return raise(L, &nerr);
  /* The registry ref first: once the core has the watch, nothing may
   * raise before x is linked (unlinked, nobody would remove the watch). */
  lua_pushvalue(L, 3);
  int fn_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  psub *x = calloc(1, sizeof *x);
  if (!x) {
    luaL_unref(L, LUA_REGISTRYINDEX, fn_ref);
    return luaL_error(L, "out of memory");
  }
  es_err cerr;
  if (closed(h, &cerr)) { /* a finalizer run by luaL_ref may have closed it */
    free(x);
    luaL_unref(L, LUA_REGISTRYINDEX, fn_ref);
    return raise(L, &cerr);
  }
  pthread_mutex_init(&x->mu, NULL);
  es_store *s = core_enter(L, h);
  x->token = es_store_presence_watch(s, ns, on_presence, x);
  core_leave(L, h);
  int gone = closed(h, &cerr);
  if (!x->token || gone) {
    /* No watch, or the clock function (which the watch may read) closed
     * the store: core_leave closed it just now, and the watch went with
     * it (a tenant handle whose store's clock closed that store still
     * has its own, as psub_end does). A subscription linked to a closed
     * handle would never end. */
    if (x->token && h->s) es_store_presence_unwatch(h->s, x->token);
    pthread_mutex_destroy(&x->mu);
    free(x);
    luaL_unref(L, LUA_REGISTRYINDEX, fn_ref);
    if (gone) {
      cerr.code = ES_CLOSED;
      snprintf(cerr.msg, sizeof cerr.msg, "the store was closed by its clock function");
      return raise(L, &cerr);
    }
    return luaL_error(L, "out of memory");
  }
  x->id = ++h->next_id;
  x->fn_ref = fn_ref;
  x->active = 1;
  x->next = h->psubs;
  h->psubs = x;
  push_unsubscribe(L, punsubscribe, x->id);
  return 1;
}

/* ---------------------------------------------------------------------- */
/* 3.5 waiting, 3.6 presence */

static int m_now(lua_State *L) {
  lstore *h = check_store(L);
  int64_t now;
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_now(s, &now, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_pushinteger(L, now);
  return es_lstore_done(L, h, 1);
}

es_store *es_lua_check_store(lua_State *L, int idx, int *lua_clock) {
  lstore *h = luaL_checkudata(L, idx, STORE_MT);
  if (h->in_core || (h->parent && h->parent->in_core))
    es_lua_raisef(L, ES_INVALID_ARGUMENT,
                  "the store cannot be used from inside its own clock function");
  if (!h->s || (h->parent && !h->parent->s)) {
    es_err e = {ES_CLOSED, "the store is closed"};
    es_lua_raise(L, &e);
  }
  lstore *clocked = h->parent ? h->parent : h; /* a tenant runs on its store's clock */
  if (lua_clock) *lua_clock = clocked->clock_ref != LUA_NOREF || clocked->ids_ref != LUA_NOREF;
  return h->s;
}

static int m_wait(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_opt_name(L, 2, "session");
  int64_t after = es_lua_opt_int(L, 3, "after", 0);
  int64_t timeout = es_lua_opt_int(L, 4, "timeout_ms", 0);
  int64_t limit = es_lua_opt_int(L, 5, "limit", 1000);
  es_events *out = owned_push(L, sizeof *out, destroy_events);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_wait(s, session, after, timeout, limit, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  es_lua_push_events(L, out, 0);
  return es_lstore_done(L, h, 1);
}

static int m_presence_set(lua_State *L) {
  lstore *h = check_store(L);
  const char *ns = es_lua_check_name(L, 2, "namespace");
  const char *participant = es_lua_check_name(L, 3, "participant");
  luaL_checktype(L, 4, LUA_TTABLE);
  luaL_checktype(L, 5, LUA_TTABLE);
  int64_t ttl = es_lua_opt_int_field(L, 5, "ttl_ms", ES_NONE);
  if (ttl == ES_NONE) luaL_argerror(L, 5, "field 'ttl_ms' is required");
  int64_t at = es_lua_opt_int_field(L, 5, "at", ES_NONE);
  int64_t seen = es_lua_opt_int_field(L, 5, "seen", 0);
  /* Fields in byte order, so the write is deterministic. */
  size_t n = 0;
  lua_pushnil(L);
  while (lua_next(L, 4)) {
    if (lua_type(L, -2) != LUA_TSTRING) luaL_argerror(L, 4, "presence field names must be strings");
    /* Names first (as the core would), so a value's error message quotes a
     * valid name of at most 255 bytes. */
    es_err nerr = {0};
    if (es_check_name("presence field", es_lua_name(L, -2, "presence field"), &nerr))
      return raise(L, &nerr);
    n++;
    lua_pop(L, 1);
  }
  es_presence_field *fields = lua_newuserdatauv(L, (n ? n : 1) * sizeof *fields, 0);
  lua_createtable(L, (int)n, 0); /* anchors the encoded values */
  int anchor = lua_gettop(L);
  es_buf *buf = es_lua_push_buf_box(L); /* freed with the stack if anything raises */
  size_t i = 0;
  lua_pushnil(L);
  /* i < n: memory safety even if a finalizer run by a collection in this
   * loop added keys to the table (next's order is then undefined anyway). */
  while (i < n && lua_next(L, 4)) {
    fields[i].field = es_lua_name(L, -2, "presence field");
    if (es_json_is_null(L, -1)) {
      fields[i].value = NULL;
      fields[i].value_len = 0;
    } else {
      es_err err = {0};
      char what[300];
      snprintf(what, sizeof what, "values.%s", fields[i].field);
      buf->len = 0;
      if (es_json_encode_lua(L, -1, what, buf, &err) != ES_OK) return raise(L, &err);
      es_lua_push_buf(L, buf);
      fields[i].value = lua_tolstring(L, -1, &fields[i].value_len);
      lua_rawseti(L, anchor, (lua_Integer)i + 1);
    }
    i++;
    lua_pop(L, 1);
  }
  n = i;
  es_buf_destroy(buf);
  es_presence_rows *applied = owned_push(L, sizeof *applied, destroy_rows);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_presence_set(s, ns, participant, fields, n, ttl, at, seen, applied, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  push_patch(L, applied);
  lua_getfield(L, -1, "values");
  lua_remove(L, -2);
  es_presence_rows_destroy(applied);
  return es_lstore_done(L, h, 1);
}

static int m_presence_read(lua_State *L) {
  lstore *h = check_store(L);
  const char *ns = es_lua_check_name(L, 2, "namespace");
  es_presence_rows *rows = owned_push(L, sizeof *rows, destroy_rows);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_presence_read(s, ns, rows, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, (int)rows->n, 0);
  for (size_t i = 0; i < rows->n; i++) {
    const es_presence_row *r = &rows->v[i];
    lua_createtable(L, 0, 6);
    es_lua_set_str(L, "participant", r->participant);
    es_lua_set_str(L, "field", r->field);
    if (es_json_decode_lua(L, r->value, r->value_len, &err) != ES_OK) return raise(L, &err);
    lua_setfield(L, -2, "value");
    es_lua_set_int(L, "seen", r->seen);
    es_lua_set_int(L, "at", r->at);
    es_lua_set_int(L, "expires_at", r->expires_at);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  es_presence_rows_destroy(rows);
  return es_lstore_done(L, h, 1);
}

const luaL_Reg es_lstore_subs_methods[] = {
    {"subscribe", m_subscribe},
    {"wait", m_wait},
    {"now", m_now},
    {"presence_set", m_presence_set},
    {"presence_read", m_presence_read},
    {"presence_subscribe", m_presence_subscribe},
    {NULL, NULL},
};
