/*
 * budget_test.c: boxes in the engine's budgeted Lua states
 * (bridge/common.h, engine/budget.h). A box holds C memory for a Lua
 * caller; its finalizer is a call, and a call at a depth the state has not
 * reached before needs memory (a CallInfo). A tripped budget refuses every
 * growth, so Lua drops the finalizer, silently, and frees the userdata: the
 * C memory was stranded for good (the API fuzzer's leak at exit, issue 31).
 * The tracker releases such a box when its memory is freed.
 */
#include <lauxlib.h>
#include <lua.h>
#include <stdio.h>

#include "bridge/common.h"
#include "engine/budget.h"

#include "tap.h"

static int released;

static void count_release(void *box) {
  (void)box;
  released++;
}

/* Drops a fresh box, trips the budget and collects, inside the call. */
static int tripped_collect(lua_State *L) {
  es_lua_push_box(L, 32, 0, count_release);
  lua_pop(L, 1);
  es_budget_trip(es_budget_of(L), ES_TRIP_STOP);
  lua_gc(L, LUA_GCCOLLECT);
  return 0;
}

/* Runs tripped_collect 60 Lua calls deep, a depth the state never reached:
 * the finalizer's call needs a new CallInfo. */
static int run_deep(lua_State *L) {
  lua_pushcfunction(L, tripped_collect);
  lua_setglobal(L, "tc");
  if (luaL_loadstring(L, "local function f(n) if n == 0 then tc() else f(n - 1) end end f(60)"))
    return -1;
  return es_budget_pcall(L, 0, 0);
}

int main(void) {
  es_budget b;
  char msg[256];
  lua_State *L = es_budget_newstate(&b, 0, 0, 1000, msg, sizeof msg);
  ok(L != NULL, "a budgeted state");
  if (!L) return tap_done();

  released = 0;
  int rc = run_deep(L);
  ok(rc != LUA_OK, "the tripped call fails");
  lua_gc(L, LUA_GCCOLLECT); /* the userdata whose finalizer was dropped is freed here */
  lua_gc(L, LUA_GCCOLLECT);
  ok(released == 1, "a box whose finalizer a tripped budget refused is released once its memory goes");
  ok(b.boxes.n == 0, "and the tracker forgets it");

  /* The ordinary ways: __gc, and release by the holder (then __gc does nothing). */
  released = 0;
  es_lua_push_box(L, 8, 0, count_release);
  lua_pop(L, 1);
  lua_gc(L, LUA_GCCOLLECT);
  lua_gc(L, LUA_GCCOLLECT);
  ok(released == 1 && b.boxes.n == 0, "an unreachable box is released by its __gc, once");
  released = 0;
  void *box = es_lua_push_box(L, 8, 0, count_release);
  es_box_release_now(box);
  es_box_release_now(box);
  ok(released == 1 && b.boxes.n == 0, "a box released by its holder: released once, untracked at once");
  lua_pop(L, 1);
  lua_gc(L, LUA_GCCOLLECT);
  lua_gc(L, LUA_GCCOLLECT);
  ok(released == 1, "its __gc does not release it again");

  /* Several alive: closing the state releases each once. */
  released = 0;
  for (int i = 0; i < 40; i++) es_lua_push_box(L, 16, 1, count_release);
  ok(b.boxes.n == 40, "forty boxes alive, forty tracked");
  es_budget_close(&b);
  ok(released == 40, "closing the state releases every box once");
  return tap_done();
}
