/*
 * budget.c: instruction, memory and trip budgets of the engine's Lua
 * states (budget.h). The allocator and the count hook are the two places
 * where user code meets the budget; es_budget_pcall is where a call starts
 * and where a tripped call is known to have unwound.
 */
#include "engine/budget.h"

#include <lauxlib.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

es_budget *es_budget_of(lua_State *L) {
  void *ud = NULL;
  lua_getallocf(L, &ud);
  return ud;
}

/* The pool. A handler call allocates a few dozen small blocks (the event
 * and ctx tables, their hash parts, closures, the payload's tables and
 * strings) that the collector frees a little later, in bursts of its
 * sweep. Through malloc each block cost ~250 instructions to get and ~100
 * to give back (glibc's per-thread cache holds 7 blocks a size: a sweep's
 * burst overflows it), about a fifth of a trivial handler's dispatch. So
 * freed blocks of up to 512 bytes (an event table's 16-slot hash part is
 * 512) are kept on per-class free lists and handed out again; a block of
 * such a size is always made with its class's full size (16-byte steps),
 * so any freed block of the class fits any request of it. The lists hold at most ES_BUDGET_POOL_BYTES and are
 * freed with the state. Only the state's own thread allocates (a Lua state
 * is never used by two threads at once), so no lock. Under AddressSanitizer
 * the pool is off, so that a use after free of a Lua block still shows
 * (-DES_BUDGET_POOL_FORCE keeps it on: ASan then checks the pool's sizes). */
#define POOL_CLASSES 32
#define POOL_MAX (POOL_CLASSES * 16)
#define ES_BUDGET_POOL_BYTES (256 * 1024)
_Static_assert(POOL_CLASSES == sizeof ((es_budget *)0)->pool / sizeof(void *), "the pool's classes");

#if defined(ES_BUDGET_POOL_FORCE) /* testing the pool itself under a sanitizer */
#define POOL_ON 1
#elif defined(__SANITIZE_ADDRESS__)
#define POOL_ON 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define POOL_ON 0
#endif
#endif
#ifndef POOL_ON
#define POOL_ON 1
#endif

/* The size malloc is asked for a block of n bytes: its class's, for a
 * pooled size. */
static size_t block_size(size_t n) { return POOL_ON && n <= POOL_MAX ? (n + 15) & ~(size_t)15 : n; }

static void *block_get(es_budget *b, size_t n) {
  if (POOL_ON && n <= POOL_MAX) {
    size_t c = (n - 1) >> 4;
    void *p = b->pool[c];
    if (p) {
      memcpy(&b->pool[c], p, sizeof p);
      b->pooled -= (c + 1) << 4;
      return p;
    }
  }
  return malloc(block_size(n));
}

/* Gives back a block Lua held at size n. */
static void block_put(es_budget *b, void *p, size_t n) {
  if (POOL_ON && n <= POOL_MAX && n > 0 && b->pooled + POOL_MAX <= ES_BUDGET_POOL_BYTES) {
    size_t c = (n - 1) >> 4;
    memcpy(p, &b->pool[c], sizeof p);
    b->pool[c] = p;
    b->pooled += (c + 1) << 4;
    return;
  }
  free(p);
}

static void pool_drain(es_budget *b) {
  for (int c = 0; c < POOL_CLASSES; c++) {
    void *p = b->pool[c];
    while (p) {
      void *next;
      memcpy(&next, p, sizeof next);
      free(p);
      p = next;
    }
    b->pool[c] = NULL;
  }
  b->pooled = 0;
}

/* A block of nsize bytes for ptr (Lua's block of old bytes; NULL: none):
 * the same block when both sizes are of one class, else a new one with
 * the contents moved. NULL when out of memory (ptr is then untouched). */
static void *block_resize(es_budget *b, void *ptr, size_t old, size_t nsize) {
  if (!ptr) return block_get(b, nsize);
  if (!POOL_ON || (old > POOL_MAX && nsize > POOL_MAX)) return realloc(ptr, nsize);
  if (block_size(old) == block_size(nsize) && old <= POOL_MAX && nsize <= POOL_MAX) return ptr;
  void *p = block_get(b, nsize);
  if (!p) return NULL;
  memcpy(p, ptr, old < nsize ? old : nsize);
  block_put(b, ptr, old);
  return p;
}

/* The allocator. Growth is refused past the limit only inside a budgeted
 * call (the engine's own bookkeeping between calls must not fail halfway),
 * and refused altogether once a call tripped, until it unwinds. */
static void *budget_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  es_budget *b = ud;
  size_t old = ptr ? osize : 0; /* with ptr NULL, osize is a type tag */
  if (nsize == 0) {
    /* A box whose finalizer a refusal below dropped (bridge/common.h). */
    if (ptr && b->boxes.n) es_box_tracker_freeing(&b->boxes, ptr, old);
    if (ptr) block_put(b, ptr, old);
    b->used -= old;
    return NULL;
  }
  if (nsize > old && b->depth > 0) {
    if (atomic_load_explicit(&b->trip, memory_order_relaxed) != ES_TRIP_NONE) return NULL;
    if (b->limit && b->used + (nsize - old) > b->limit) {
      /* Lua answers a refusal with an emergency collection and asks once
       * more for the same block: only when that retry fails too is the
       * state really out of budget. A refusal the collection cured (say,
       * after collectgarbage("stop")) is no failure of anyone's. */
      if (b->refused && b->refused_ptr == ptr && b->refused_size == nsize) {
        b->refused = 0;
        es_budget_trip(b, ES_TRIP_MEMORY);
      } else {
        b->refused = 1;
        b->refused_ptr = ptr;
        b->refused_size = nsize;
      }
      return NULL;
    }
  }
  void *p = block_resize(b, ptr, old, nsize);
  if (!p) return NULL;
  b->used = b->used - old + nsize;
  if (nsize > old) b->refused = 0;
  return p;
}

void es_budget_recount(es_budget *b) { b->instr = 0; }

void es_budget_trip(es_budget *b, int reason) {
  int none = ES_TRIP_NONE;
  atomic_compare_exchange_strong(&b->trip, &none, reason);
}

const char *es_budget_message(const es_budget *b, int reason, char *buf, size_t len) {
  switch (reason) {
  case ES_TRIP_INSTRUCTIONS:
    snprintf(buf, len, "instruction budget exceeded (%lld instructions)", (long long)b->instr_limit);
    break;
  case ES_TRIP_MEMORY:
    snprintf(buf, len, "memory budget exceeded (%zu bytes)", b->limit);
    break;
  case ES_TRIP_DEADLINE:
    snprintf(buf, len, "deadline exceeded (%lld ms)", (long long)b->deadline_ms);
    break;
  case ES_TRIP_STOP:
    snprintf(buf, len, "interrupted: the engine is stopping");
    break;
  default:
    snprintf(buf, len, "no budget exceeded");
  }
  return buf;
}

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The count hook: counts instructions, and once the call has tripped,
 * raises at every instruction of whichever thread runs (a coroutine's
 * error surfaces in its resumer, which then raises in turn). */
static void count_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  es_budget *b = es_budget_of(L);
  atomic_fetch_add_explicit(&b->ticks, 1, memory_order_relaxed);
  if (b->depth == 0) return;
  int t = atomic_load_explicit(&b->trip, memory_order_relaxed);
  if (t == ES_TRIP_NONE) {
    int every = lua_gethookcount(L);
    if (every != ES_BUDGET_HOOK_EVERY) /* left at 1 by an earlier trip */
      lua_sethook(L, count_hook, LUA_MASKCOUNT, ES_BUDGET_HOOK_EVERY);
    b->instr += every;
    if (b->deadline_at && mono_ms() > b->deadline_at) {
      es_budget_trip(b, ES_TRIP_DEADLINE);
    } else {
      if (!b->instr_limit || b->instr <= b->instr_limit) return;
      es_budget_trip(b, ES_TRIP_INSTRUCTIONS);
    }
    t = atomic_load(&b->trip);
  }
  lua_sethook(L, count_hook, LUA_MASKCOUNT, 1);
  if (L != b->main) lua_sethook(b->main, count_hook, LUA_MASKCOUNT, 1);
  char msg[128];
  luaL_error(L, "%s", es_budget_message(b, t, msg, sizeof msg));
}

/* The debug library, cut down to what cannot reach past the Lua
 * language. The rest of it hands a script the C functions and raw
 * pointers the engine keeps out of reach: the registry, any metatable,
 * the C functions on the call stack (getinfo's `func`, which the engine's
 * own protected calls would then run on a file handle), C closures'
 * upvalues and C frames' stack slots (getlocal/setlocal). sethook would
 * lift the budgets, which are a hook. What is left: traceback, and
 * getinfo without `func`. The rest raises, naming itself. */
static const char SAFE_DEBUG[] =
    "local getinfo, traceback, type, error = debug.getinfo, debug.traceback, type, error\n"
    "local safe = { traceback = traceback }\n"
    "function safe.getinfo(a, b, c)\n"
    "  local t\n"
    "  if type(a) == 'thread' then t = getinfo(a, b, c)\n"
    "  elseif type(a) == 'number' then t = getinfo(a + 1, b)\n" /* this wrapper is a level */
    "  else t = getinfo(a, b) end\n"
    "  if t then t.func = nil end\n"
    "  return t\n"
    "end\n"
    "for name in pairs(debug) do\n"
    "  if not safe[name] then\n"
    "    local why = name == 'sethook' and 'the engine\\'s budgets use the hook'\n"
    "      or 'it reaches the engine\\'s C internals'\n"
    "    safe[name] = function()\n"
    "      error(('debug.%s is not available to engine scripts (%s)'):format(name, why), 2)\n"
    "    end\n"
    "  end\n"
    "end\n"
    "debug = safe\n"
    "package.loaded.debug = safe\n";

/* Text chunks only in engine scripts: Lua 5.4 has no bytecode verifier,
 * so a crafted binary chunk (load, loadfile, dofile, require of a .luac)
 * could corrupt the process that a budget is meant to protect. */
static const char TEXT_ONLY[] =
    "local load, loadfile, select, searchpath = load, loadfile, select, package.searchpath\n"
    "_G.load = function(chunk, name, _, ...)\n"
    "  if select('#', ...) > 0 then return load(chunk, name, 't', (...)) end\n"
    "  return load(chunk, name, 't')\n"
    "end\n"
    "_G.loadfile = function(file, _, ...)\n"
    "  if select('#', ...) > 0 then return loadfile(file, 't', (...)) end\n"
    "  return loadfile(file, 't')\n"
    "end\n"
    "_G.dofile = function(file)\n"
    "  local f, err = loadfile(file, 't')\n"
    "  if not f then error(err, 2) end\n"
    "  return f()\n"
    "end\n"
    "package.searchers[2] = function(name)\n"
    "  local path, err = searchpath(name, package.path)\n"
    "  if not path then return '\\n\\t' .. err end\n"
    "  local f, lerr = loadfile(path, 't')\n"
    "  if not f then\n"
    "    error(('error loading module %q from file %q:\\n\\t%s'):format(name, path, lerr), 0)\n"
    "  end\n"
    "  return f, path\n"
    "end\n";

static int open_state(lua_State *L) {
  es_budget *b = es_budget_of(L);
  es_lua_set_box_tracker(L, &b->boxes);
  luaL_openlibs(L);
  if (luaL_loadbufferx(L, SAFE_DEBUG, sizeof SAFE_DEBUG - 1, "=eventstore.debug", "t") != LUA_OK)
    return lua_error(L);
  lua_call(L, 0, 0);
  if (luaL_loadbufferx(L, TEXT_ONLY, sizeof TEXT_ONLY - 1, "=eventstore.textonly", "t") != LUA_OK)
    return lua_error(L);
  lua_call(L, 0, 0);
  return 0;
}

lua_State *es_budget_newstate(es_budget *b, size_t limit, int64_t instr_limit,
                              int64_t deadline_ms, char *err, size_t errlen) {
  memset(b, 0, sizeof *b);
  b->limit = limit;
  b->instr_limit = instr_limit;
  b->deadline_ms = deadline_ms;
  lua_State *L = lua_newstate(budget_alloc, b);
  if (!L) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  b->main = L;
  lua_pushcfunction(L, open_state);
  if (lua_pcall(L, 0, 0, 0) != LUA_OK) {
    snprintf(err, errlen, "cannot open the standard libraries: %s", lua_tostring(L, -1));
    es_budget_close(b);
    return NULL;
  }
  if (limit && b->used > limit / 2) {
    snprintf(err, errlen,
             "memory_budget %zu is too small: the standard libraries alone take %zu bytes", limit,
             b->used);
    es_budget_close(b);
    return NULL;
  }
  lua_sethook(L, count_hook, LUA_MASKCOUNT, ES_BUDGET_HOOK_EVERY);
  return L;
}

void es_budget_close(es_budget *b) {
  if (b->main) lua_close(b->main); /* frees every block: every box is released */
  b->main = NULL;
  pool_drain(b); /* what the close gave back */
  es_box_tracker_destroy(&b->boxes);
}

/* The message handler: the error with a traceback. It runs inside the
 * budgeted call, so an error object's __tostring is under the budget too,
 * and nothing after the call needs to run user code to read the error. */
static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (!msg) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) {
      msg = lua_tostring(L, -1);
    } else {
      msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

int es_budget_pcall(lua_State *L, int nargs, int nresults) {
  es_budget *b = es_budget_of(L);
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, traceback);
  lua_insert(L, base);
  int64_t saved = b->instr;
  b->instr = 0;
  b->depth++;
  int rc = lua_pcall(L, nargs, nresults, base);
  b->depth--;
  b->instr = saved;
  lua_remove(L, base);
  int t = atomic_load(&b->trip);
  /* Instructions and memory are this call's; a deadline or a stop ends
   * the whole attempt, so it stays set for the calls around this one. */
  if (t != ES_TRIP_NONE && (b->depth == 0 || t == ES_TRIP_INSTRUCTIONS || t == ES_TRIP_MEMORY)) {
    atomic_store(&b->trip, ES_TRIP_NONE);
    lua_sethook(b->main, count_hook, LUA_MASKCOUNT, ES_BUDGET_HOOK_EVERY);
  }
  if (t == ES_TRIP_NONE && rc == LUA_ERRMEM && b->limit) t = ES_TRIP_MEMORY;
  if (t == ES_TRIP_NONE) {
    if (rc != LUA_OK && !lua_isstring(L, -1)) {
      lua_pop(L, 1);
      lua_pushliteral(L, "(error object is not a string)");
    }
    return rc;
  }
  /* A budget stopped the call: that is its cause, whatever the code made
   * of the error on the way out (caught it, returned, raised its own). */
  char msg[128];
  es_budget_message(b, t, msg, sizeof msg);
  if (rc == LUA_OK) { /* it returned: drop the results, keep one slot */
    lua_settop(L, base - 1);
    lua_pushnil(L);
  }
  const char *got = lua_tostring(L, -1);
  if (got && strstr(got, msg)) return rc;
  if (got) lua_pushfstring(L, "%s\n(the code went on and raised: %s)", msg, got);
  else lua_pushstring(L, msg);
  lua_remove(L, -2);
  return rc != LUA_OK ? rc : LUA_ERRRUN;
}
