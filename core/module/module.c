/*
 * module/module.c: luaopen_eventstore_core, the module table: the store's face
 * (store_handle.c) and the engine's constructor (engine_handle.c). Kept
 * apart so neither handle includes the other.
 */
#include "module/module.h"

#include "module/engine_handle.h"
#include "module/store_handle.h"

int luaopen_eventstore_core(lua_State *L) {
  es_lua_open_store(L);
  es_lua_push_engine_constructor(L);
  lua_setfield(L, -2, "engine");
  return 1;
}
