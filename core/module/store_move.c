/*
 * module/store_move.c: the store handle's raw side of moving a store (§10,
 * store/move.h): _export, the lines of an export, and _import, which
 * writes a stream's lines. lua/eventstore/move.lua builds the Lua face
 * (store:export, eventstore.import, copy) on these two.
 */
#include <lauxlib.h>
#include <lua.h>
#include <string.h>

#include "bridge/common.h"
#include "bridge/events.h"
#include "module/store_internal.h"
#include "store/move.h"
#include "store/store.h"

/* Lines are gathered here, then pushed once the core call returned: a
 * Lua error while pushing cannot leave the core half-way. */
typedef struct gathered {
  char **v;
  size_t *len;
  size_t n, cap;
  int oom;
} gathered;

static void destroy_gathered(void *p) {
  gathered *g = p;
  for (size_t i = 0; i < g->n; i++) free(g->v[i]);
  free(g->v);
  free(g->len);
  memset(g, 0, sizeof *g);
}

static int gather(void *ctx, const char *line, size_t len) {
  gathered *g = ctx;
  if (g->n == g->cap) {
    size_t cap = g->cap ? g->cap * 2 : 64;
    char **v = realloc(g->v, cap * sizeof *v);
    if (v) g->v = v;
    size_t *l = v ? realloc(g->len, cap * sizeof *l) : NULL;
    if (l) g->len = l;
    if (!v || !l) return g->oom = 1;
    g->cap = cap;
  }
  char *c = malloc(len + 1);
  if (!c) return g->oom = 1;
  memcpy(c, line, len);
  c[len] = '\0';
  g->v[g->n] = c;
  g->len[g->n++] = len;
  return 0;
}

/* store:_export(prefix, after, rows_only, names) -> {line, ...} (move.h
 * es_store_export; names: a list of session names, or nil). */
static int m_export_lines(lua_State *L) {
  lstore *h = check_store(L);
  es_export_opts o = {0};
  o.prefix = luaL_optstring(L, 2, "");
  o.after = (int64_t)luaL_optinteger(L, 3, 0);
  o.rows_only = lua_toboolean(L, 4);
  const char **names = NULL;
  if (!lua_isnoneornil(L, 5)) {
    luaL_checktype(L, 5, LUA_TTABLE);
    o.n_names = (size_t)luaL_len(L, 5);
    /* a userdata, so a raise below frees it */
    names = lua_newuserdatauv(L, (o.n_names + 1) * sizeof *names, 0);
    for (size_t i = 0; i < o.n_names; i++) {
      lua_rawgeti(L, 5, (lua_Integer)i + 1);
      names[i] = lua_tostring(L, -1);
      if (!names[i]) return luaL_argerror(L, 5, "session names must be strings");
      lua_pop(L, 1); /* the string stays alive: argument 5 holds it */
    }
    o.names = names;
  }
  gathered *g = owned_push(L, sizeof *g, destroy_gathered);
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_export(st, &o, gather, g, &err);
  core_leave(L, h);
  if (rc == ES_OK && g->oom) rc = es_fail(&err, ES_STORAGE, "out of memory");
  if (rc) {
    destroy_gathered(g);
    return raise(L, &err);
  }
  lua_createtable(L, (int)g->n, 0);
  for (size_t i = 0; i < g->n; i++) {
    lua_pushlstring(L, g->v[i], g->len[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  destroy_gathered(g);
  return es_lstore_done(L, h, 1);
}

static void destroy_import(void *p) {
  es_import **im = p;
  es_import_free(*im);
  *im = NULL;
}

/* store:_import({line, ...}, mode) -> {already, sessions, events, position}:
 * mode "empty" (§10) or "upsert" (a follower's increment). */
static int m_import_lines(lua_State *L) {
  lstore *h = check_store(L);
  luaL_checktype(L, 2, LUA_TTABLE);
  static const char *const modes[] = {"empty", "upsert", NULL};
  int mode = luaL_checkoption(L, 3, "empty", modes) == 0 ? ES_IMPORT_EMPTY : ES_IMPORT_UPSERT;
  es_import **im = owned_push(L, sizeof *im, destroy_import);
  es_err err = {0};
  if (es_import_new(im, &err)) return raise(L, &err);
  lua_Integer n = luaL_len(L, 2);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, 2, i);
    size_t len;
    const char *line = lua_tolstring(L, -1, &len);
    if (!line) return luaL_argerror(L, 2, "lines must be strings");
    int rc = es_import_line(*im, line, len, &err);
    lua_pop(L, 1);
    if (rc) return raise(L, &err);
  }
  es_import_result res;
  es_store *st = core_enter(L, h);
  int rc = es_import_run(st, *im, mode, &res, &err);
  core_leave(L, h);
  destroy_import(im);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, 4);
  lua_pushboolean(L, res.already);
  lua_setfield(L, -2, "already");
  es_lua_set_int(L, "sessions", res.sessions);
  es_lua_set_int(L, "events", res.events);
  es_lua_set_int(L, "position", res.position);
  return es_lstore_done(L, h, 1);
}

/* store:backup(path) -> true (move.h es_store_backup). */
static int m_backup(lua_State *L) {
  lstore *h = check_store(L);
  const char *to = luaL_checkstring(L, 2);
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_backup(st, to, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_pushboolean(L, 1);
  return es_lstore_done(L, h, 1);
}

const luaL_Reg es_lstore_move_methods[] = {
    {"backup", m_backup},
    {"_export", m_export_lines},
    {"_import", m_import_lines},
    {NULL, NULL},
};
