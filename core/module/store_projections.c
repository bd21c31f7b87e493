/*
 * module/store_projections.c: the Store handle's projection methods (§8):
 * projection, projection_keys, and the records the engine's Lua face,
 * the binary and the inspector show (projections, projection_control).
 * States are stored with the reducer-state codec (bridge/state.h), so
 * they round-trip as reducer states do.
 */
#include "bridge/events.h"
#include "bridge/state.h"
#include "module/store_internal.h"
#include "store/projections.h"

static void destroy_projection(void *p) { es_projection_destroy(p); }
static void destroy_projections(void *p) { es_projections_destroy(p); }
static void destroy_keys(void *p) { es_proj_keys_destroy(p); }

typedef struct value_box {
  char *v;
} value_box;
static void destroy_value(void *p) {
  value_box *b = p;
  free(b->v);
  b->v = NULL;
}

/* A projection's record as a Lua table: what a reader, the binary and the
 * inspector need (the lease and the building generation included). */
static void push_record(lua_State *L, const es_projection *p) {
  lua_createtable(L, 0, 24);
  es_lua_set_str(L, "name", p->name);
  es_lua_set_int(L, "generation", p->generation);
  es_lua_set_str(L, "version", p->version);
  es_lua_set_int(L, "position", p->position);
  es_lua_set_str(L, "cursor", p->cursor);
  if (p->building) {
    es_lua_set_int(L, "building", p->building);
    es_lua_set_str(L, "building_version", p->building_version);
    es_lua_set_int(L, "building_position", p->building_position);
    es_lua_set_str(L, "building_cursor", p->building_cursor);
  }
  es_lua_set_str(L, "status", p->failed ? "failed" : "running");
  if (p->failed) {
    es_lua_set_str(L, "error", p->error);
    es_lua_set_int(L, "error_position", p->error_position);
    es_lua_set_str(L, "error_id", p->error_id);
  }
  es_lua_set_int(L, "skipped", p->skipped);
  lua_pushboolean(L, p->rebuild);
  lua_setfield(L, -2, "rebuild");
  es_lua_set_str(L, "holder", p->holder);
  es_lua_set_int(L, "lease_expires_at", p->lease_expires_at);
  es_lua_set_int(L, "updated_at", p->updated_at);
}

/* store:projection(name, key) -> state | nil, {position, version, generation} */
static int m_projection(lua_State *L) {
  lstore *h = check_store(L);
  const char *name = es_lua_check_name(L, 2, "projection");
  const char *key = es_lua_check_name(L, 3, "key");
  value_box *vb = owned_push(L, sizeof *vb, destroy_value);
  es_projection *info = owned_push(L, sizeof *info, destroy_projection);
  size_t len = 0;
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_projection_read(s, name, key, &vb->v, &len, info, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  if (!vb->v) lua_pushnil(L);
  else if (es_state_decode(L, vb->v, len, &err)) return raise(L, &err);
  lua_createtable(L, 0, 3);
  es_lua_set_int(L, "position", info->generation ? info->position : 0);
  es_lua_set_str(L, "version", info->version);
  es_lua_set_int(L, "generation", info->generation);
  return es_lstore_done(L, h, 2);
}

/* store:projection_keys(name, {prefix, after, limit = 100}) -> {keys, cursor} */
static int m_projection_keys(lua_State *L) {
  lstore *h = check_store(L);
  const char *name = es_lua_check_name(L, 2, "projection");
  check_opt_table(L, 3);
  const char *prefix = es_lua_opt_str_field(L, 3, "prefix");
  const char *after = es_lua_opt_str_field(L, 3, "after");
  int64_t limit = es_lua_opt_int_field(L, 3, "limit", 100);
  es_proj_keys *k = owned_push(L, sizeof *k, destroy_keys);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_projection_keys(s, name, prefix, after, limit, k, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, 2);
  lua_createtable(L, (int)k->n, 0);
  for (size_t i = 0; i < k->n; i++) {
    lua_pushstring(L, k->keys[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  lua_setfield(L, -2, "keys");
  es_lua_set_str(L, "cursor", k->cursor);
  es_proj_keys_destroy(k);
  return es_lstore_done(L, h, 1);
}

/* store:projections([name]) -> {record, ...} by name, each with its
 * head, lag and lag_ms (es_store_projection_lag) */
static int m_projections(lua_State *L) {
  lstore *h = check_store(L);
  const char *name = lua_isnoneornil(L, 2) ? NULL : es_lua_check_name(L, 2, "projection");
  es_projections *list = owned_push(L, sizeof *list, destroy_projections);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_projections(s, name, list, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, (int)list->n, 0);
  for (size_t i = 0; i < list->n; i++) {
    int64_t head, lag, lag_ms;
    s = core_enter(L, h);
    rc = es_store_projection_lag(s, &list->v[i], &head, &lag, &lag_ms, &err);
    core_leave(L, h);
    if (rc) return raise(L, &err);
    push_record(L, &list->v[i]);
    es_lua_set_int(L, "head", head);
    es_lua_set_int(L, "lag", lag);
    es_lua_set_int(L, "lag_ms", lag_ms);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  es_projections_destroy(list);
  return es_lstore_done(L, h, 1);
}

/* store:projection_control(name, "rebuild" | "retry" | "skip") -> record */
static int m_projection_control(lua_State *L) {
  lstore *h = check_store(L);
  const char *name = es_lua_check_name(L, 2, "projection");
  const char *action = luaL_checkstring(L, 3);
  es_projection *p = owned_push(L, sizeof *p, destroy_projection);
  es_err err = {0};
  es_store *s = core_enter(L, h);
  int rc = es_store_projection_control(s, name, action, p, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  push_record(L, p);
  es_projection_destroy(p);
  return es_lstore_done(L, h, 1);
}

const luaL_Reg es_lstore_projection_methods[] = {
    {"projection", m_projection},
    {"projection_keys", m_projection_keys},
    {"projections", m_projections},
    {"projection_control", m_projection_control},
    {NULL, NULL},
};
