/*
 * budget.h: the budgets of a Lua state the engine runs user code in
 * (handlers, reducers, the scripts' top level): instructions per call,
 * bytes per state, and a trip that external parties (the watchdog, a
 * stop) can set. See docs/engine.md, "Budgets".
 *
 * A budget is the allocator's user data of its state (lua_newstate), so
 * Lua code can never reach it or detach it, and every coroutine of the
 * state finds the same one. Once a call trips a budget it cannot go on:
 * the count hook raises at every instruction of every thread of the state
 * until the call has unwound to es_budget_pcall, whatever pcall, xpcall,
 * coroutines or __close handlers try; growth allocations are refused too.
 * Code that never reaches a hook (a C function such as a pathological
 * string.find, or a __gc finalizer, which Lua runs with hooks off) is the
 * watchdog's: it sees `ticks` stand still while the thread burns CPU.
 */
#ifndef ES_BUDGET_H
#define ES_BUDGET_H

#include <lua.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "bridge/common.h"

/* Why a call was stopped; 0: it was not. */
enum {
  ES_TRIP_NONE = 0,
  ES_TRIP_INSTRUCTIONS, /* the call ran past instruction_limit */
  ES_TRIP_MEMORY,       /* the state could not grow within limit */
  ES_TRIP_DEADLINE,     /* the call ran past its wall-clock deadline (watchdog) */
  ES_TRIP_STOP,         /* the engine is stopping (engine:stop, a signal) */
};

#define ES_BUDGET_HOOK_EVERY 1000 /* instructions between count-hook calls */

typedef struct es_budget {
  size_t used;             /* bytes the state holds */
  size_t limit;            /* memory budget; 0: none */
  int64_t instr;           /* instructions counted in the current call */
  int64_t instr_limit;     /* per call; 0: none */
  int64_t deadline_ms;     /* per call, for the trip message */
  int64_t deadline_at;     /* monotonic ms past which the hook trips the call
                            * (ES_TRIP_DEADLINE); 0: none. Set by an engine
                            * whose calls no watchdog thread watches (an
                            * inline run, engine.h inline_runs). */
  int depth;               /* budgeted calls in progress (nesting) */
  atomic_int trip;         /* ES_TRIP_*: sticky until the tripped call unwinds */
  atomic_uint ticks;       /* hook calls so far: the watchdog's sign of life */
  atomic_int trusted;      /* > 0 while the engine's own C code runs (store I/O) */
  lua_State *main;         /* the state's main thread */
  /* The last refused allocation: Lua retries a refused one once after an
   * emergency collection; only a refused retry is a real shortfall. */
  const void *refused_ptr;
  size_t refused_size;
  int refused;
  /* The boxes of the state not released yet (bridge/common.h): one whose
   * finalizer a refused allocation dropped is released when its memory is
   * freed. */
  es_box_tracker boxes;
  /* Freed small blocks kept for the next allocation of their size class
   * (budget.c, "The pool"): free lists of 32 classes of 16 bytes (up to
   * 512), at most 256 KiB in all. Not counted in `used` (which is what
   * Lua holds, as before). */
  void *pool[32];
  size_t pooled;
} es_budget;

/* Creates a state whose allocator is b's (b must outlive it), with the
 * count hook installed on its main thread (so every coroutine inherits
 * it) and the debug library cut to traceback and getinfo without `func`
 * (the rest refuses: see SAFE_DEBUG in budget.c). Standard
 * libraries are opened. NULL when out of memory or the budget is too small
 * for the libraries (err then says so). */
lua_State *es_budget_newstate(es_budget *b, size_t limit, int64_t instr_limit,
                              int64_t deadline_ms, char *err, size_t errlen);
/* Closes b's state (its finalizers run, every box is released) and frees
 * what b holds. b->main NULL: only the latter. */
void es_budget_close(es_budget *b);

/* Like lua_pcall with a traceback handler, as one budgeted call: the
 * instruction count starts at 0 (the caller's is restored after, so a
 * nested call has its own), and a trip during the call fails it even if
 * the code caught the error and returned. On failure leaves one string:
 * the error with its traceback, led by the budget's message when a budget
 * stopped the call. Returns LUA_OK or an error status. The state must be
 * one made by es_budget_newstate. */
int es_budget_pcall(lua_State *L, int nargs, int nresults);

/* Inside a budgeted call, starts its instruction count again at 0: a
 * C function that runs two pieces of user code in one es_budget_pcall
 * (the projection runner's key() and step) gives the second the budget a
 * call of its own would have. */
void es_budget_recount(es_budget *b);

/* Stops the call in progress with reason (ES_TRIP_*); callable from any
 * thread. The first reason stands. */
void es_budget_trip(es_budget *b, int reason);

/* The budget of a state made by es_budget_newstate. */
es_budget *es_budget_of(lua_State *L);

/* The message for a trip reason ("instruction budget exceeded (N
 * instructions)", ...), written into buf. */
const char *es_budget_message(const es_budget *b, int reason, char *buf, size_t len);

#endif
