/*
 * module/store_history.c: the store handle's methods that shape a
 * session's history: branches and refs (§3.7), retention (truncate,
 * delete) and the archive (§3.9).
 */
#include <lauxlib.h>
#include <lua.h>
#include <string.h>

#include "bridge/common.h"
#include "bridge/events.h"
#include "module/store_internal.h"
#include "store/store.h"


/* ---------------------------------------------------------------------- */
/* 3.7 branches */

static void push_lineage(lua_State *L, const es_lineage *l) {
  lua_createtable(L, 0, 4);
  es_lua_set_str(L, "session", l->session);
  es_lua_set_str(L, "parent", l->parent);
  es_lua_set_int(L, "at", l->at);
  es_lua_set_int(L, "created_at", l->created_at);
}

static void push_ref(lua_State *L, const es_ref *r) {
  lua_createtable(L, 0, 7);
  es_lua_set_str(L, "name", r->name);
  es_lua_set_str(L, "session", r->session);
  es_lua_set_int(L, "head", r->head);
  es_lua_set_str(L, "parent", r->parent);
  es_lua_set_int(L, "at", r->parent ? r->at : ES_NONE);
  es_lua_set_int(L, "created_at", r->created_at);
  es_lua_set_int(L, "updated_at", r->updated_at);
}

/* A listing's {after, limit} (limit defaults to 100). */
static void listing_opts(lua_State *L, int arg, const char **after, int64_t *limit) {
  check_opt_table(L, arg);
  *after = es_lua_opt_str_field(L, arg, "after");
  *limit = es_lua_opt_int_field(L, arg, "limit", 100);
}

static int m_fork(lua_State *L) {
  lstore *h = check_store(L);
  const char *from = es_lua_check_name(L, 2, "from");
  int64_t at = es_lua_check_int(L, 3, "at");
  const char *to = es_lua_check_name(L, 4, "to");
  es_lineage *out = owned_push(L, sizeof *out, destroy_lineage);
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_fork(st, from, at, to, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  push_lineage(L, out);
  return es_lstore_done(L, h, 1);
}

static int m_lineage(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  es_lineage *out = owned_push(L, sizeof *out, destroy_lineage);
  int found = 0;
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_lineage(st, session, &found, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  if (found) push_lineage(L, out);
  else lua_pushnil(L);
  return es_lstore_done(L, h, 1);
}

static int m_children(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  const char *after;
  int64_t limit;
  listing_opts(L, 3, &after, &limit);
  es_lineages *out = owned_push(L, sizeof *out, destroy_lineages);
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_children(st, session, after, limit, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, (int)out->n, 0);
  for (size_t i = 0; i < out->n; i++) {
    push_lineage(L, &out->v[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  return es_lstore_done(L, h, 1);
}

static int m_put_ref(lua_State *L) {
  lstore *h = check_store(L);
  const char *name = es_lua_check_name(L, 2, "name");
  const char *session = es_lua_check_name(L, 3, "session");
  es_ref *out = owned_push(L, sizeof *out, destroy_ref);
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_put_ref(st, name, session, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  push_ref(L, out);
  return es_lstore_done(L, h, 1);
}

static int m_get_ref(lua_State *L) {
  lstore *h = check_store(L);
  const char *name = es_lua_check_name(L, 2, "name");
  es_ref *out = owned_push(L, sizeof *out, destroy_ref);
  int found = 0;
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_get_ref(st, name, &found, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  if (found) push_ref(L, out);
  else lua_pushnil(L);
  return es_lstore_done(L, h, 1);
}

static int m_list_refs(lua_State *L) {
  lstore *h = check_store(L);
  const char *after;
  int64_t limit;
  listing_opts(L, 2, &after, &limit);
  es_refs *out = owned_push(L, sizeof *out, destroy_refs);
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_list_refs(st, after, limit, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, (int)out->n, 0);
  for (size_t i = 0; i < out->n; i++) {
    push_ref(L, &out->v[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  return es_lstore_done(L, h, 1);
}

static int m_delete_ref(lua_State *L) {
  lstore *h = check_store(L);
  const char *name = es_lua_check_name(L, 2, "name");
  int deleted = 0;
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_delete_ref(st, name, &deleted, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_pushboolean(L, deleted);
  return es_lstore_done(L, h, 1);
}

static int m_promote(lua_State *L) {
  lstore *h = check_store(L);
  const char *from = es_lua_check_name(L, 2, "from_ref");
  const char *to = es_lua_check_name(L, 3, "to_ref");
  check_opt_table(L, 4);
  int has_expect = 0;
  const char *expect = NULL;
  if (!lua_isnoneornil(L, 4)) {
    lua_getfield(L, 4, "expect");
    if (lua_type(L, -1) == LUA_TSTRING) {
      has_expect = 1;
      expect = es_lua_name(L, -1, "expect");
    } else if (lua_type(L, -1) == LUA_TBOOLEAN && !lua_toboolean(L, -1)) {
      has_expect = 1;
    } else if (!lua_isnil(L, -1)) {
      luaL_argerror(L, 4, "field 'expect' must be a session name or false");
    }
    /* expect stays on the stack: the options table does not anchor it
     * against a clock function that changes the table (str_field's rule) */
  }
  es_ref *out = owned_push(L, sizeof *out, destroy_ref);
  char **actual = owned_push(L, sizeof *actual, destroy_cstr);
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_promote(st, from, to, has_expect, expect, out, actual, &err);
  core_leave(L, h);
  if (rc == ES_REF_CONFLICT) {
    /* The error carries what the caller expected and what it found
     * (false: no ref), so a loser can retry against `actual`. */
    es_lua_push_error(L, rc, err.msg);
    if (expect) lua_pushstring(L, expect);
    else lua_pushboolean(L, 0);
    lua_setfield(L, -2, "expected");
    if (*actual) lua_pushstring(L, *actual);
    else lua_pushboolean(L, 0);
    lua_setfield(L, -2, "actual");
    return lua_error(L);
  }
  if (rc) return raise(L, &err);
  push_ref(L, out);
  return es_lstore_done(L, h, 1);
}

/* ---------------------------------------------------------------------- */
/* 3.9 retention */

static int m_truncate(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  int64_t through = es_lua_check_int(L, 3, "through");
  int64_t first = 1;
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_truncate(st, session, through, &first, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_pushinteger(L, first);
  return es_lstore_done(L, h, 1);
}

static int m_delete(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  int deleted = 0;
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_delete(st, session, &deleted, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_pushboolean(L, deleted);
  return es_lstore_done(L, h, 1);
}

/* ---------------------------------------------------------------------- */
/* 3.9 archive */

static void destroy_segment(void *p) { es_segment_destroy(p); }
static void destroy_segments(void *p) { es_segments_destroy(p); }
static void destroy_report(void *p) { es_archive_report_destroy(p); }

static void push_segment(lua_State *L, const es_segment *g) {
  lua_createtable(L, 0, 7);
  es_lua_set_int(L, "from", g->from);
  es_lua_set_int(L, "through", g->through);
  es_lua_set_int(L, "count", g->count);
  es_lua_set_int(L, "bytes", g->bytes);
  es_lua_set_str(L, "checksum", g->checksum);
  es_lua_set_str(L, "file", g->file);
  es_lua_set_int(L, "created_at", g->created_at);
}

/* store:archive(session, {through = n}) -> the new segment, or nil when
 * everything through n was archived already. */
static int m_archive(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  luaL_checktype(L, 3, LUA_TTABLE);
  lua_getfield(L, 3, "through");
  if (lua_isnil(L, -1)) luaL_argerror(L, 3, "field 'through' is required");
  lua_pop(L, 1);
  int64_t through = es_lua_opt_int_field(L, 3, "through", 0);
  es_segment *g = owned_push(L, sizeof *g, destroy_segment);
  int written = 0;
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_archive(st, session, through, &written, g, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  if (written) push_segment(L, g);
  else lua_pushnil(L);
  es_segment_destroy(g);
  return es_lstore_done(L, h, 1);
}

static int m_segments(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  es_segments *list = owned_push(L, sizeof *list, destroy_segments);
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_segments(st, session, list, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, (int)list->n, 0);
  for (size_t i = 0; i < list->n; i++) {
    push_segment(L, &list->v[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  es_segments_destroy(list);
  return es_lstore_done(L, h, 1);
}

static int m_compact_archive(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_check_name(L, 2, "session");
  int64_t before = 0, after = 0;
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_compact_archive(st, session, &before, &after, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, 2);
  es_lua_set_int(L, "before", before);
  es_lua_set_int(L, "after", after);
  return es_lstore_done(L, h, 1);
}

/* store:archived{after, limit = 100} -> {sessions = {{session,
 * archived_through}}, cursor} (§3.9). */
static int m_archived(lua_State *L) {
  lstore *h = check_store(L);
  const char *after;
  int64_t limit;
  listing_opts(L, 2, &after, &limit);
  es_archived *out = owned_push(L, sizeof *out, destroy_archived);
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_archived(st, after, limit, out, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, 2);
  lua_createtable(L, (int)out->n, 0);
  for (size_t i = 0; i < out->n; i++) {
    lua_createtable(L, 0, 2);
    es_lua_set_str(L, "session", out->v[i].session);
    es_lua_set_int(L, "archived_through", out->v[i].archived_through);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  lua_setfield(L, -2, "sessions");
  es_lua_set_str(L, "cursor", out->cursor);
  es_archived_destroy(out);
  return es_lstore_done(L, h, 1);
}

static void push_problems(lua_State *L, const es_archive_problem *v, size_t n) {
  lua_createtable(L, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    lua_createtable(L, 0, 3);
    es_lua_set_str(L, "session", v[i].session);
    es_lua_set_str(L, "file", v[i].file);
    es_lua_set_str(L, "problem", v[i].problem);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
}

/* store:verify_archive([session]) -> {problems, orphans, checked} */
static int m_verify_archive(lua_State *L) {
  lstore *h = check_store(L);
  const char *session = es_lua_opt_name(L, 2, "session");
  es_archive_report *r = owned_push(L, sizeof *r, destroy_report);
  es_err err = {0};
  es_store *st = core_enter(L, h);
  int rc = es_store_verify_archive(st, session, r, &err);
  core_leave(L, h);
  if (rc) return raise(L, &err);
  lua_createtable(L, 0, 3);
  push_problems(L, r->problems, r->n_problems);
  lua_setfield(L, -2, "problems");
  push_problems(L, r->orphans, r->n_orphans);
  lua_setfield(L, -2, "orphans");
  es_lua_set_int(L, "checked", r->checked);
  es_archive_report_destroy(r);
  return es_lstore_done(L, h, 1);
}

const luaL_Reg es_lstore_history_methods[] = {
    {"fork", m_fork},
    {"lineage", m_lineage},
    {"children", m_children},
    {"put_ref", m_put_ref},
    {"get_ref", m_get_ref},
    {"list_refs", m_list_refs},
    {"delete_ref", m_delete_ref},
    {"promote", m_promote},
    {"truncate", m_truncate},
    {"delete", m_delete},
    {"archive", m_archive},
    {"segments", m_segments},
    {"archived", m_archived},
    {"compact_archive", m_compact_archive},
    {"verify_archive", m_verify_archive},
    {NULL, NULL},
};
