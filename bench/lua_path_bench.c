/*
 * lua_path_bench.c: the Lua path's figures (issue 12, item 3) beside the C
 * API doing the same reads and appends, in one process and in alternating
 * rounds, so that "Lua read = X% of the C call" compares two figures taken
 * under the same load.
 *
 *   lua_path_bench [FILL] [ROUNDS] [CALLS] [WAY]
 *
 * It makes a Lua state with the eventstore module (package.preload for
 * eventstore.core, LUA_PATH for the Lua files, as make bench sets it),
 * puts the C side in the global `c_anchor`, and runs bench/store_bench.lua
 * in its "lua" mode, which times both sides and the plain-Lua anchors
 * (bench/README.md, "The Lua path"). `c_anchor` works on a store of its
 * own, filled the same way as the Lua side's:
 *   c_anchor.open(fill)          a memory: store, `fill` settled events in "big"
 *   c_anchor.read(calls, size)   es_store_read of 100 events at the same offsets as the Lua side
 *   c_anchor.append(calls)       es_store_append of 100 events, asking for the stored events
 *                                back as store:append does (then freeing them)
 */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "module/module.h"
#include "store/store.h"

/* The ~95-byte payload of the other benches, in canonical form (what the
 * Lua side's payload table encodes to). */
static const char PAYLOAD[] =
    "{\"customer\":\"c-000123\",\"items\":[{\"qty\":2,\"sku\":\"SKU-42\"}],\"note\":\"leave at the door\"}";

#define BATCH 100

typedef struct anchor {
  es_store *s;
  es_new_event evs[BATCH];
} anchor;

static int fail(lua_State *L, const char *what, const es_err *err) {
  return luaL_error(L, "lua_path_bench: %s: %s: %s", what, es_strerror(err->code), err->msg);
}

static anchor *check_anchor(lua_State *L) {
  anchor *a = lua_touserdata(L, lua_upvalueindex(1));
  if (!a->s) luaL_error(L, "c_anchor.open was not called");
  return a;
}

static int anchor_gc(lua_State *L) {
  anchor *a = lua_touserdata(L, 1);
  if (a->s) es_store_release(a->s);
  a->s = NULL;
  return 0;
}

static int c_open(lua_State *L) {
  anchor *a = lua_touserdata(L, lua_upvalueindex(1));
  lua_Integer fill = luaL_checkinteger(L, 1);
  es_err err = {0};
  if (a->s) es_store_release(a->s);
  a->s = NULL;
  if (es_store_open("memory:", NULL, &a->s, &err)) return fail(L, "open", &err);
  for (int i = 0; i < BATCH; i++) {
    es_new_event_init(&a->evs[i]);
    a->evs[i].type = "order.placed";
    a->evs[i].payload = PAYLOAD;
    a->evs[i].payload_len = sizeof PAYLOAD - 1;
    a->evs[i].settled = 1;
  }
  for (lua_Integer done = 0; done < fill; done += BATCH) {
    int pending;
    size_t k = (size_t)(fill - done < BATCH ? fill - done : BATCH);
    if (es_store_append(a->s, "big", a->evs, k, ES_NONE, ES_NONE, NULL, &pending, &err))
      return fail(L, "append", &err);
  }
  return 0;
}

static int c_read(lua_State *L) {
  anchor *a = check_anchor(L);
  lua_Integer calls = luaL_checkinteger(L, 1), size = luaL_checkinteger(L, 2);
  size_t got = 0;
  for (lua_Integer i = 1; i <= calls; i++) {
    es_events out = {0};
    es_err err = {0};
    if (es_store_read(a->s, "big", (i * 7919) % (size - BATCH), ES_NONE, BATCH, &out, &err))
      return fail(L, "read", &err);
    got += out.n;
    es_events_destroy(&out);
  }
  lua_pushinteger(L, (lua_Integer)got);
  return 1;
}

static int c_append(lua_State *L) {
  anchor *a = check_anchor(L);
  lua_Integer calls = luaL_checkinteger(L, 1);
  char session[8];
  for (lua_Integer i = 1; i <= calls; i++) {
    es_events out = {0};
    es_err err = {0};
    int pending;
    snprintf(session, sizeof session, "a%d", (int)(i % 10));
    if (es_store_append(a->s, session, a->evs, BATCH, ES_NONE, ES_NONE, &out, &pending, &err))
      return fail(L, "append", &err);
    es_events_destroy(&out);
  }
  return 0;
}

int main(int argc, char **argv) {
  lua_State *L = luaL_newstate();
  if (!L) return 1;
  luaL_openlibs(L);
  luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
  lua_pushcfunction(L, luaopen_eventstore_core);
  lua_setfield(L, -2, "eventstore.core");
  lua_pop(L, 1);

  static const luaL_Reg fns[] = {{"open", c_open}, {"read", c_read}, {"append", c_append}, {NULL, NULL}};
  lua_newtable(L);
  anchor *a = lua_newuserdatauv(L, sizeof *a, 0);
  memset(a, 0, sizeof *a);
  lua_newtable(L);
  lua_pushcfunction(L, anchor_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  luaL_setfuncs(L, fns, 1);
  lua_setglobal(L, "c_anchor");

  /* arg = {"memory:", FILL, "lua", ROUNDS, CALLS, WAY}, as store_bench.lua reads it */
  lua_createtable(L, 6, 1);
  lua_pushstring(L, "bench/store_bench.lua");
  lua_rawseti(L, -2, 0);
  lua_pushstring(L, "memory:");
  lua_rawseti(L, -2, 1);
  lua_pushstring(L, argc > 1 ? argv[1] : "100000");
  lua_rawseti(L, -2, 2);
  lua_pushstring(L, "lua");
  lua_rawseti(L, -2, 3);
  for (int i = 2; i < argc && i < 5; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i + 2);
  }
  lua_setglobal(L, "arg");

  int rc = 0;
  if (luaL_dofile(L, "bench/store_bench.lua") != LUA_OK) {
    fprintf(stderr, "lua_path_bench: %s\n", lua_tostring(L, -1));
    rc = 1;
  }
  lua_close(L);
  return rc;
}
